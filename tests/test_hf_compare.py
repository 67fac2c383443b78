#!/usr/bin/env python3
"""test_hf_compare.py — qtrain's model against transformers: logits, loss and every gradient.

Builds random tiny Qwen2, Llama, Qwen3, Mistral and Gemma 3 models (GQA; tied and untied; Qwen3 with head_dim !=
hidden/heads; Mistral with a sliding window shorter than the sequence and without one; Qwen2 with
use_sliding_window on its upper layers; Gemma 3 with local and global layers, a window shorter than the
sequence, query_pre_attn_scalar != head_dim, and once linear RoPE scaling on its global layers and the
final-logit soft-cap) with transformers (no hub), saves
them as safetensors, runs one micro-batch through build/tests/tool_hf_dump (our engine: cpu, and
cuda when QT_DEVICES includes it) and through torch in fp32, and prints the relative L2 error of
each tensor; the same with RoPE scaling (llama3, yarn, linear) on a sequence past the scaled bands.
Then checks qtrain's RoPE frequencies (build/tests/tool_rope_freq) against transformers'
ROPE_INIT_FUNCTIONS on real models' rope settings. Skips (exit 0) when torch or transformers is missing.
    python3 tests/test_hf_compare.py            # cpu
    QT_DEVICES=cpu,cuda python3 tests/test_hf_compare.py
    QT_DEVICES=cuda QT_HF_KINDS=gemma3,gemma3_cap python3 tests/test_hf_compare.py   # those families only
"""
import json, os, subprocess, sys, tempfile

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_hf_dump")
QTRAIN = os.path.join(BUILD, "qtrain")
# fp32 CPU engine: agreement to float rounding. bf16 GPU engine: bf16 activations and weights.
TOL = {"cpu": {"logits": 1e-4, "loss": 1e-5, "grad": 1e-3}, "cuda": {"logits": 3e-2, "loss": 1e-2, "grad": 3e-2}}

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
except Exception as exc:  # noqa: BLE001
    print(f"SKIP hf_compare: torch/transformers/safetensors not importable ({exc.__class__.__name__}: {exc})")
    sys.exit(0)


# cuDNN's fused attention wants head_dim 64/128: the GPU models are wider (head_dim 64, still GQA).
DIMS = {"cpu": dict(hidden_size=48, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2),
        "cuda": dict(hidden_size=256, intermediate_size=200, num_attention_heads=4, num_key_value_heads=2)}


# Qwen3: q/k norms per head, and a head_dim that is not hidden / heads (cuDNN: 128 on the GPU).
QWEN3_HEAD_DIM = {"cpu": 16, "cuda": 128}


# fp32 is checked in a sharp regime (large weights); bf16 at a realistic init, where bf16 rounding
# is not amplified by saturated softmaxes (torch's own bf16 is off by 20% there).
INIT_STD = {"cpu": 0.2, "cuda": 0.02}


# Sliding window shorter than the test's sequence (T = 11): the band mask changes the result.
WINDOW = 4

TOOL_FREQ = os.path.join(BUILD, "tests", "tool_rope_freq")

# RoPE scaling on the small models: head_dim 8 (cpu) has wavelengths 2 pi 10000^(i/4) = 6.3, 63, 628, 6283
# (head_dim 64 on cuda: more pairs over the same range); with original_max_position_embeddings 64 llama3
# keeps pair 0 (< 64 / 4), smooths pair 1 and divides the rest by 8; yarn's ramp sits at pairs 0..1 and
# its attention factor is 1 + 0.1 ln 4 (original 32 = 128 / 4). The rope models run T = 24 > 64 / 8 positions.
ROPE = {"llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64),
        "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
        "linear": dict(rope_type="linear", factor=4.0)}


# q/k biases of 0.3 make the attention sharp; in a window of 4 keys (qwen2_swa's layer 1) bf16 P and the
# flash-style dS = P * (dP - rowsum(dO * O)) then cost the GPU path 3-4x torch-bf16's error on that layer's
# q/k gradients (H200, 7a4d2de; 1.0x with biases at the realistic init below): the bf16 check uses the latter.
BIAS_STD = {"cpu": 0.3, "cuda": 0.02}


# Gemma 3: layers sliding, full, sliding (every 2nd layer global: window_pattern 2), an attention scalar that is
# not head_dim; gemma3_cap also scales its global layers' RoPE (linear, factor 8: positions 0..10 move) and caps
# the logits at 3 (|logits| reach ~5 at this init: the tanh bends them).
GEMMA_SCALAR = {"cpu": 24, "cuda": 96}


def gemma_config(kind, common, device):
    kw = dict(common, head_dim=QWEN3_HEAD_DIM[device], num_hidden_layers=3, sliding_window=WINDOW,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              query_pre_attn_scalar=GEMMA_SCALAR[device], rope_theta=1000000.0, rope_local_base_freq=10000.0)
    if kind == "gemma3_cap":
        kw.update(final_logit_softcapping=3.0, rope_scaling=dict(rope_type="linear", factor=8.0))
    return transformers.Gemma3TextConfig(**kw)


def build_model(kind, tied, device, path, rope=None):
    common = dict(vocab_size=96, num_hidden_layers=2, **DIMS[device], max_position_embeddings=128 if rope else 64,
                  rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tied, initializer_range=INIT_STD[device],
                  attn_implementation="eager", torch_dtype=torch.float32)
    if rope:
        common["rope_scaling"] = dict(ROPE[rope])
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=QWEN3_HEAD_DIM[device], attention_bias=False,
                                       use_sliding_window=False)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif kind.startswith("gemma3"):
        model = transformers.Gemma3ForCausalLM(gemma_config(kind, common, device))
    elif kind == "qwen2_swa":  # layer 0 full, layer 1 windowed (max_window_layers)
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind in ("mistral", "mistral_nowin"):  # head_dim set, twice hidden / heads
        head_dim = 2 * DIMS[device]["hidden_size"] // DIMS[device]["num_attention_heads"]
        cfg = transformers.MistralConfig(**common, head_dim=head_dim,
                                         sliding_window=WINDOW if kind == "mistral" else None)
        model = transformers.MistralForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        model = transformers.LlamaForCausalLM(cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # non-trivial norms and biases, so their gradients are checked too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD[device] * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return model.float().eval()


def rel(a, b):
    a = np.asarray(a, dtype=np.float64); b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(kind, tied, device, tmp, rope=None):
    name = f"{kind}_{'tied' if tied else 'untied'}_{device}" + (f"_rope_{rope}" if rope else "")
    mdir = os.path.join(tmp, f"{kind}_{tied}_{device}_{rope}")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        build_model(kind, tied, device, mdir, rope)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        mdir, torch_dtype=torch.float32, attn_implementation="eager").float()
    if rope:  # the model transformers runs is the scaled one (a silently dropped rope_scaling would pass)
        assert model.model.rotary_emb.rope_type == ROPE[rope]["rope_type"], model.model.rotary_emb.rope_type
    B, T = 2, 24 if rope else 11
    rng = np.random.default_rng(7)
    # Gemma's embedding has padding_idx 0 (pad_token_id): transformers never updates row 0, qtrain trains every
    # row (docs/models-gemma3.md), so Gemma's inputs avoid token 0.
    win = rng.integers(1 if kind.startswith("gemma3") else 0, 96, size=(B, T + 1)).astype(np.int32)
    tok = os.path.join(tmp, "tokens.i32"); win.tofile(tok)
    out = os.path.join(tmp, f"out_{name}")
    r = subprocess.run([TOOL, mdir, device, tok, str(B), str(T), out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL hf_compare_{name}: tool_hf_dump exited {r.returncode}: {r.stderr.strip()}")
        return False
    ids = torch.tensor(win[:, :T], dtype=torch.long); tgt = torch.tensor(win[:, 1:], dtype=torch.long)
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    loss.backward()
    ref16 = {}
    if device == "cuda":  # what bf16 costs torch itself on this model: printed beside ours
        m16 = type(model).from_pretrained(mdir, torch_dtype=torch.bfloat16, attn_implementation="eager")
        lg16 = m16(input_ids=ids).logits.float()
        l16 = torch.nn.functional.cross_entropy(lg16.reshape(-1, lg16.shape[-1]), tgt.reshape(-1))
        l16.backward()
        ref16 = {n: rel(p.grad.float().numpy(), dict(model.named_parameters())[n].grad.numpy()) for n, p in m16.named_parameters()}
        ref16["logits"] = rel(lg16.detach().reshape(B * T, -1).numpy(), logits.detach().reshape(B * T, -1).numpy())
    tol = TOL[device]; ok = True; rows = []
    ours_loss = float(open(os.path.join(out, "loss.txt")).read())
    e = abs(ours_loss - loss.item()) / abs(loss.item()); rows.append(("loss", e, tol["loss"]))
    lp = os.path.join(out, "logits.f32")
    if os.path.exists(lp):
        ours = np.fromfile(lp, dtype=np.float32).reshape(B * T, -1)
        rows.append(("logits", rel(ours, logits.detach().reshape(B * T, -1).numpy()), tol["logits"]))
    grads = load_file(os.path.join(out, "model.safetensors"))
    for pname, p in model.named_parameters():
        if pname not in grads:
            if tied and pname == "lm_head.weight":
                continue
            print(f"FAIL hf_compare_{name}: no gradient for {pname}"); return False
        rows.append((pname, rel(grads[pname], p.grad.numpy()), tol["grad"]))
    worst = max(rows, key=lambda x: x[1] / x[2])
    for n, err, t in rows:
        if n in ref16:  # bf16: within 4x of the error torch's own bf16 makes on the same tensor
            t = max(t, 4 * ref16[n])
        flag = "" if err <= t else "   <-- over bound"
        extra = f"  torch-bf16 {ref16[n]:.2e}" if n in ref16 else ""
        print(f"  {name}: {n:55s} rel err {err:.2e} (bound {t:.0e}){extra}{flag}")
        ok &= err <= t
    print(f"{'PASS' if ok else 'FAIL'} hf_compare_{name}: loss {ours_loss:.6f} vs torch {loss.item():.6f}, worst {worst[0]} {worst[1]:.2e}")
    return ok


# Real models' rope settings (config.json as the hub has them): Llama-3.1-8B, Llama-3.2-1B, Qwen3-8B's
# long-context yarn, DeepSeek-style yarn with mscale, yarn with every option given, linear, dynamic NTK
# (at max_position_embeddings and past it, where transformers' forward recomputes the frequencies).
FREQ_CASES = [
    ("llama3_8b", dict(head_dim=128, rope_theta=500000.0, max_position_embeddings=131072,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192)), [8192]),
    ("llama3_1b", dict(head_dim=64, rope_theta=500000.0, max_position_embeddings=131072,
                       rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192)), [8192]),
    ("yarn_qwen3", dict(head_dim=128, rope_theta=1000000.0, max_position_embeddings=131072,
                        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)), [4096]),
    ("yarn_mscale", dict(head_dim=64, rope_theta=10000.0, max_position_embeddings=163840,
                         rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=1.0,
                                           mscale_all_dim=0.707, beta_fast=32, beta_slow=1)), [4096]),
    ("yarn_options", dict(head_dim=96, rope_theta=50000.0, max_position_embeddings=65536,
                          rope_scaling=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=8192,
                                            beta_fast=16.0, beta_slow=2.0, attention_factor=1.25, truncate=False)), [2048]),
    ("linear", dict(head_dim=64, rope_theta=10000.0, max_position_embeddings=16384,
                    rope_scaling=dict(rope_type="linear", factor=4.0)), [4096]),
    ("dynamic", dict(head_dim=64, rope_theta=10000.0, max_position_embeddings=4096,
                     rope_scaling=dict(rope_type="dynamic", factor=2.0)), [4096, 10000]),
    ("default", dict(head_dim=128, rope_theta=1000000.0, max_position_embeddings=32768), [4096]),
]


def check_freqs(tmp):
    """qtrain's inverse frequencies and attention factor against transformers' ROPE_INIT_FUNCTIONS."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if not os.path.exists(TOOL_FREQ):
        print(f"FAIL hf_compare_rope_freq: {TOOL_FREQ} is missing (run make first)"); return False
    ok = True
    for name, kw, seq_lens in FREQ_CASES:
        path = os.path.join(tmp, f"freq_{name}.json")
        with open(path, "w") as f:
            json.dump(dict(model_type="llama", hidden_size=kw["head_dim"] * 4, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, vocab_size=32, **kw), f)
        cfg = transformers.LlamaConfig.from_pretrained(path)
        rtype = cfg.rope_parameters["rope_type"]
        for S in seq_lens:
            if rtype == "default":
                inv, attn = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
            else:
                inv, attn = ROPE_INIT_FUNCTIONS[rtype](cfg, "cpu", seq_len=S)
            exp = os.path.join(tmp, f"freq_{name}_export.json")
            r = subprocess.run([TOOL_FREQ, path, str(S), exp], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL hf_compare_rope_freq_{name}: tool_rope_freq exited {r.returncode}: {r.stderr.strip()}")
                ok = False; continue
            vals = [float(x) for x in r.stdout.split()]
            ours_attn, ours = vals[0], np.array(vals[1:])
            want = inv.double().numpy()
            e = float(np.max(np.abs(ours - want) / np.abs(want))) if len(ours) == len(want) else float("inf")
            ea = abs(ours_attn - float(attn)) / abs(float(attn))
            # qtrain's export of the config, loaded by transformers, means the same RoPE (a derived
            # attention factor is written as the float qtrain keeps)
            ecfg = transformers.LlamaConfig.from_pretrained(exp)
            if rtype == "default":
                einv, eattn = inv, attn
            else:
                einv, eattn = ROPE_INIT_FUNCTIONS[ecfg.rope_parameters["rope_type"]](ecfg, "cpu", seq_len=S)
            same = ecfg.rope_parameters["rope_type"] == rtype and torch.equal(einv, inv) and abs(eattn - attn) <= 1e-7 * attn
            # transformers computes in fp32: agreement to a few fp32 ulps
            good = e <= 1e-6 and ea <= 1e-6 and same
            print(f"{'PASS' if good else 'FAIL'} hf_compare_rope_freq_{name}_T{S}: {rtype}, {len(want)} pairs, "
                  f"max rel err {e:.2e}, attention factor {ours_attn:.7g} vs {float(attn):.7g}, "
                  f"export {'reads back the same' if same else 'DIFFERS: ' + str(ecfg.rope_parameters)}")
            ok &= good
    return ok


def layer_windows(c):
    """Each layer's window as transformers applies it: Qwen2 per layer_types, Mistral on every layer."""
    types = getattr(c, "layer_types", None) or ["sliding_attention"] * c.num_hidden_layers
    return [c.sliding_window if t == "sliding_attention" else None for t in types]


def check_export(kind, tmp):
    """qtrain imports the model and exports it (--export): transformers reads back the same window rule
    (every layer's sliding_window) and gives the same logits."""
    name = f"export_{kind}"
    mdir = os.path.join(tmp, f"{kind}_False_cpu_None")
    rdir = os.path.join(tmp, name)
    cfg = os.path.join(tmp, f"{name}.yaml")
    with open(cfg, "w") as f:
        f.write(f"device: cpu\nrun:\n  dir: {rdir}\ninit:\n  from: {mdir}\ndata:\n  seq_len: 16\n  micro_batch: 1\n")
    r = subprocess.run([QTRAIN, cfg, "--export"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL hf_compare_{name}: qtrain --export exited {r.returncode}: {r.stderr.strip()}")
        return False
    a = transformers.AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager")
    b = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(rdir, "ckpt", "export"), dtype=torch.float32,
                                                          attn_implementation="eager")
    wa, wb = layer_windows(a.config), layer_windows(b.config)
    ids = torch.tensor(np.random.default_rng(3).integers(1, 96, size=(1, 11)), dtype=torch.long)
    with torch.no_grad():
        err = rel(b(input_ids=ids).logits.numpy(), a(input_ids=ids).logits.numpy())
    ok = type(a) is type(b) and wa == wb and err <= 1e-6
    print(f"{'PASS' if ok else 'FAIL'} hf_compare_{name}: {type(b).__name__}, layer windows {wb} (original {wa}), "
          f"logits rel err {err:.2e}")
    return ok


def check_gemma_multimodal(tmp):
    """A Gemma3ForConditionalGeneration checkpoint (model_type gemma3, the text model under text_config, tensors
    language_model.model.*, a vision tower and projector beside them) trains as its text model: the same loss and
    gradients as the gemma3_text model it wraps."""
    from safetensors.numpy import save_file
    src = os.path.join(tmp, "gemma3_True_cpu_None")
    mm = os.path.join(tmp, "gemma3_multimodal")
    os.makedirs(mm, exist_ok=True)
    text = json.load(open(os.path.join(src, "config.json")))
    with open(os.path.join(mm, "config.json"), "w") as f:
        json.dump(dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], text_config=text,
                       vision_config=dict(model_type="siglip_vision_model", hidden_size=8)), f)
    w = {"language_model." + k: v for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    w["vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, dtype=np.float32)
    w["multi_modal_projector.mm_input_projection_weight"] = np.zeros((8, 48), dtype=np.float32)
    save_file(w, os.path.join(mm, "model.safetensors"))
    tok = os.path.join(tmp, "tokens_mm.i32")
    np.random.default_rng(7).integers(1, 96, size=(2, 12)).astype(np.int32).tofile(tok)
    outs = []
    for d in (src, mm):
        out = os.path.join(tmp, "out_mm_" + os.path.basename(d))
        r = subprocess.run([TOOL, d, "cpu", tok, "2", "11", out], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL hf_compare_gemma3_multimodal: tool_hf_dump exited {r.returncode}: {r.stderr.strip()}")
            return False
        outs.append((open(os.path.join(out, "loss.txt")).read(), load_file(os.path.join(out, "model.safetensors"))))
    (la, ga), (lb, gb) = outs
    ok = la == lb and sorted(ga) == sorted(gb) and all(np.array_equal(ga[k], gb[k]) for k in ga)
    print(f"{'PASS' if ok else 'FAIL'} hf_compare_gemma3_multimodal: loss {lb.strip()} (text model {la.strip()}), "
          f"{len(gb)} gradients {'equal' if ok else 'DIFFER'}")
    return ok


# Each family and the ties it is checked with.
KINDS = (("qwen2", (True, False)), ("llama", (True, False)), ("mistral", (False, True)), ("mistral_nowin", (False,)),
         ("qwen2_swa", (False,)), ("qwen3", (True, False)), ("gemma3", (True, False)), ("gemma3_cap", (True,)))


def main():
    if not os.path.exists(TOOL):
        print(f"FAIL hf_compare: {TOOL} is missing (run make first)"); return 1
    devices = os.environ.get("QT_DEVICES", "cpu").split(",")
    only = os.environ.get("QT_HF_KINDS")  # a comma list of KINDS: those families' comparisons alone
    kinds = [(k, t) for k, t in KINDS if not only or k in only.split(",")]
    if only and not kinds:
        print(f"FAIL hf_compare: QT_HF_KINDS={only} names none of {[k for k, _ in KINDS]}"); return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for kind, ties in kinds:
            for tied in ties:
                for dev in devices:
                    ok &= check(kind, tied, dev, tmp)
        if only:
            return 0 if ok else 1
        for kind, tied, rope in (("llama", False, "llama3"), ("qwen2", True, "yarn"), ("llama", True, "linear")):
            for dev in devices:
                ok &= check(kind, tied, dev, tmp, rope)
        ok &= check_freqs(tmp)
        if "cpu" in devices:  # the export of the windowed families (their untied cpu models, built above)
            for kind in ("mistral", "mistral_nowin", "qwen2_swa", "gemma3"):
                ok &= check_export(kind, tmp)
            ok &= check_gemma_multimodal(tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
