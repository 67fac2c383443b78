#!/usr/bin/env python3
"""test_lora_peft.py — qtrain's LoRA on the CPU fp32 engine against transformers + PEFT.

1. Forward/backward: random tiny Qwen2 (qkv bias, tied), Llama (untied) and Qwen3 (q/k norms) bases with PEFT
   adapters of random A and B (B non-zero, so every gradient is exercised) over several target sets, rsLoRA
   and not; build/tests/tool_lora_dump runs one micro-batch through qtrain's CPU model with the adapters
   (read from PEFT's own adapter_model.safetensors) and dumps the logits and every lora_A / lora_B gradient
   of the mean loss, compared with torch's (relative L2 <= 1e-5); also with embeddings, LM head and norms
   trained beside them (PEFT's modules_to_save, their gradients compared too). With dropout, qtrain's masks
   (dumped by the tool) replace PEFT's nn.Dropout modules, so both run the same mask.
2. Export: qtrain trains the adapters a few steps (device: cpu, lora: with dropout; once with trained
   embeddings, LM head and norms) and exports them;
   peft.PeftModel.from_pretrained loads them over the transformers base and reproduces qtrain's logits of
   the exported adapters (<= 1e-5); `qtrain --export merged` writes a model transformers loads to the same
   logits.
3. QLoRA (lora.base_dtype: nf4) on the CPU engine: its merged export's logits against PEFT over bitsandbytes' 4-bit
   base (nf4, double quantization, fp32 compute) with qtrain's adapters (<= 5e-3, and 20x closer than the same
   adapters over the unquantized base); skipped without bitsandbytes.
4. cuda (when QT_DEVICES includes it): part 1 on the GPU model over its frozen bf16 base (tool_lora_dump_gpu, the
   bases with head_dim 64 for cuDNN's attention), with and without dropout (the CPU tool's masks) and with trained base
   tensors (modules_to_save), logits and
   gradients within test_hf_compare.py's cuda rule (3e-2, or 4x what bf16 costs PEFT itself); and part 2 with qtrain training on the GPU (its export
   loaded by PEFT reproduces the CPU model's logits of those adapters, <= 1e-5), also with embeddings, LM head and
   norms trained.
Skips (exit 0) when torch, transformers or peft is missing.
    python3 tests/test_lora_peft.py
    QT_DEVICES=cpu,cuda python3 tests/test_lora_peft.py     (QT_DEVICES=cuda: the cuda cases only)
"""
import copy, json, os, struct, subprocess, sys, tempfile, zlib

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_lora_dump")
TOOL_GPU = os.path.join(BUILD, "tests", "tool_lora_dump_gpu")
QTRAIN = os.path.join(BUILD, "qtrain")
TOL = 1e-5
TOL_CUDA = {"logits": 3e-2, "loss": 1e-2, "grad": 3e-2}  # test_hf_compare.py's bf16 bounds
DEVICES = os.environ.get("QT_DEVICES", "cpu").split(",")

try:
    import numpy as np
    import torch
    import transformers
    import peft
    from safetensors.numpy import load_file
except Exception as exc:  # noqa: BLE001
    print(f"SKIP lora_peft: torch/transformers/peft not importable ({exc.__class__.__name__}: {exc})")
    sys.exit(0)

EXTRA_BITS = {"embeddings": 1, "lm_head": 2, "norms": 4}
TARGET_BITS = {"q_proj": 1, "k_proj": 2, "v_proj": 4, "o_proj": 8, "gate_proj": 16, "up_proj": 32, "down_proj": 64}
ALL = list(TARGET_BITS)
V = 96


def build_base(kind, path):
    torch.manual_seed(0)
    gpu = kind.endswith("_gpu")  # cuDNN's attention: head_dim 64 (Qwen3: 128)
    kind = kind[:-4] if gpu else kind
    dims = dict(hidden_size=128, intermediate_size=160, num_attention_heads=2) if gpu else \
        dict(hidden_size=48, intermediate_size=80, num_attention_heads=6)
    common = dict(vocab_size=V, num_hidden_layers=2, **dims, num_key_value_heads=1 if gpu else 2,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                  initializer_range=0.02 if gpu else 0.1, attn_implementation="eager", torch_dtype=torch.float32)
    if kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True))
    elif kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=128 if gpu else 16,
                                                                       attention_bias=False,
                                                                       tie_word_embeddings=False))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=False))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):  # test_hf_compare.py's BIAS_STD
                p.copy_((0.02 if gpu else 0.3) * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)


def load_base(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").float()


def rel(a, b):
    a = np.asarray(a, dtype=np.float64); b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class FixedMask(torch.nn.Module):
    """Stands in for PEFT's lora_dropout: multiplies by a given mask (0 or 1/(1-p))."""
    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, x):
        return x * self.mask.reshape(x.shape).to(x.dtype)


def lora_modules(pm, targets):
    """PEFT's LoRA layers in qtrain's layout order: layer by layer, targets in q..down order."""
    mods = dict(pm.named_modules())
    out = []
    for l in range(pm.base_model.model.config.num_hidden_layers):
        for t in ALL:
            if t in targets:
                parent = "self_attn" if t in ALL[:4] else "mlp"
                out.append(mods[f"base_model.model.model.layers.{l}.{parent}.{t}"])
    return out


def modules_to_save(kind, extras):
    """PEFT's modules_to_save for qtrain's lora.trainable names."""
    out = (["embed_tokens"] if "embeddings" in extras else []) + (["lm_head"] if "lm_head" in extras else [])
    if "norms" in extras:
        out += ["input_layernorm", "post_attention_layernorm", "norm"] + (["q_norm", "k_norm"] if kind == "qwen3" else [])
    return out or None


def peft_name(n):
    """The saved name of a PEFT parameter: no adapter name, no modules_to_save wrapper."""
    return n.replace(".modules_to_save.default", "").replace(".default", "")


def bf16_errors(pm, ids, tgt, logits, ref):
    """What bf16 costs PEFT itself on this model (test_hf_compare.py's rule: the GPU within 4x of it): each
    tensor's relative L2 error of the same model run in bf16 against the fp32 run (logits, loss, gradients)."""
    m16 = copy.deepcopy(pm).to(torch.bfloat16)
    m16.zero_grad()
    lg16 = m16(input_ids=ids).logits.float()
    l16 = torch.nn.functional.cross_entropy(lg16.reshape(-1, V), tgt.reshape(-1))
    l16.backward()
    lf = logits.detach()
    e = {"logits": rel(lg16.detach().reshape(lf.shape).numpy(), lf.numpy()), "loss": 0.0}
    e.update({peft_name(n): rel(p.grad.float().numpy(), ref[peft_name(n)]) for n, p in m16.named_parameters()
              if p.requires_grad})
    return e


def check_fwd_bwd(kind, targets, r, alpha, rslora, dropout, tmp, extras=(), dev="cpu"):
    """dev cuda: the base is kind's GPU shape; tool_lora_dump gives the masks, tool_lora_dump_gpu the rest."""
    name = f"{kind}_r{r}_{'rs' if rslora else 'a'}{alpha}_{len(targets)}t_p{dropout}" + "".join(f"_{x}" for x in extras)
    if dev == "cuda":
        kind, name = kind + "_gpu", name + "_cuda"
    mdir = os.path.join(tmp, f"base_{kind}")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        build_base(kind, mdir)
    pm = peft.get_peft_model(load_base(mdir), peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                               use_rslora=rslora, lora_dropout=dropout,
                                                               modules_to_save=modules_to_save(kind, extras)))
    torch.manual_seed(5)
    amp = 0.05 if dev == "cuda" else 0.2  # on the GPU's base (std 0.02) adapters of its size, not ten times it
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(amp * torch.randn_like(p))
            elif "modules_to_save" in n:  # trained copies of base tensors: moved off the base's values
                p.add_(0.1 * torch.randn_like(p))
    adir = os.path.join(tmp, f"adapter_{name}")
    pm.save_pretrained(adir)
    B, T = 2, 11
    win = np.random.default_rng(7).integers(0, V, size=(B, T + 1)).astype(np.int32)
    tok = os.path.join(tmp, "tokens.i32"); win.tofile(tok)
    out = os.path.join(tmp, f"out_{name}")
    bits = sum(TARGET_BITS[t] for t in targets)
    xbits = sum(EXTRA_BITS[x] for x in extras)
    args = [TOOL, mdir, adir, tok, str(B), str(T), out, str(r), str(alpha), str(int(rslora)), str(bits), str(dropout), "42",
            str(xbits)]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"FAIL lora_peft_{name}: tool_lora_dump exited {res.returncode}: {res.stderr.strip()}")
        return False
    if dev == "cuda":  # the masks stay the CPU tool's (the GPU draws the same); the rest is the GPU's
        res = subprocess.run([TOOL_GPU] + args[1:], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"FAIL lora_peft_{name}: tool_lora_dump_gpu exited {res.returncode}: {res.stderr.strip()[-2000:]}")
            return False
    if dropout > 0:  # qtrain's masks in place of PEFT's dropout
        masks = np.fromfile(os.path.join(out, "masks.f32"), dtype=np.float32)
        at = 0
        for m in lora_modules(pm, targets):
            n = B * T * m.in_features
            m.lora_dropout["default"] = FixedMask(torch.tensor(masks[at:at + n]))
            at += n
        assert at == masks.size, (at, masks.size)
        keep = float(np.mean(masks > 0))
        if abs(keep - (1 - dropout)) > 0.03:
            print(f"FAIL lora_peft_{name}: masks keep {keep:.3f} of the inputs, expected {1 - dropout:.3f}")
            return False
    pm.train()
    ids = torch.tensor(win[:, :T], dtype=torch.long); tgt = torch.tensor(win[:, 1:], dtype=torch.long)
    logits = pm(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    loss.backward()
    ours = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32).reshape(B * T, V)
    errs = {"logits": rel(ours, logits.detach().reshape(B * T, V).numpy()),
            "loss": abs(float(open(os.path.join(out, "loss.txt")).read()) - loss.item()) / abs(loss.item())}
    grads = load_file(os.path.join(out, "adapter_model.safetensors"))
    ref = {peft_name(n): p.grad.numpy() for n, p in pm.named_parameters() if p.requires_grad}
    if set(grads) != set(ref):
        print(f"FAIL lora_peft_{name}: tensor names differ: ours-only {sorted(set(grads) - set(ref))[:3]}, "
              f"PEFT-only {sorted(set(ref) - set(grads))[:3]}")
        return False
    for n in ref:
        errs[n] = rel(grads[n], ref[n])
    tol = {n: TOL for n in errs} if dev == "cpu" else \
        {n: max(TOL_CUDA["logits" if n == "logits" else "loss" if n == "loss" else "grad"], 4 * e16)
         for n, e16 in bf16_errors(pm, ids, tgt, logits, ref).items()}
    worst = max(errs, key=lambda n: errs[n] / tol[n])
    ok = errs[worst] <= tol[worst]
    print(f"{'PASS' if ok else 'FAIL'} lora_peft_{name}: {len(ref)} gradients, logits {errs['logits']:.1e}, "
          f"loss {errs['loss']:.1e}, worst {worst} {errs[worst]:.1e}")
    for n in ref if not ok else ():  # every tensor over its bound, with both norms
        if errs[n] > tol[n]:
            print(f"    {n}: {errs[n]:.1e} (|ours| {np.linalg.norm(grads[n]):.3e}, |PEFT| {np.linalg.norm(ref[n]):.3e})")
    return ok


def write_shard(path, tokens, vocab):
    """A version 2 token shard (tools/qt_tokenize/shard.py's format), u16 tokens."""
    payload = struct.pack(f"<{len(tokens)}H", *tokens)
    head = b"QTTOKENS" + struct.pack("<IIQIIQ", 2, 2, len(tokens), vocab, 0, zlib.crc32(payload))
    with open(path, "wb") as f:
        f.write(head + bytes(64 - len(head)) + payload)


def train_and_merge(name, rdir, mdir, seed, lines):
    """qtrain trains adapters over the base in mdir (the config's other lines given) and writes PEFT's adapter files
    (rdir/ckpt/export) and, resumed, the merged model (rdir/merged). Returns True, or prints the failure."""
    os.makedirs(rdir)
    shard = os.path.join(rdir, "train_0.bin")
    write_shard(shard, list(np.random.default_rng(seed).integers(0, V, size=4000)), V)
    cfg = os.path.join(rdir, "run.yaml")
    with open(cfg, "w") as f:
        f.write(f"run:\n  dir: {rdir}\ninit:\n  from: {mdir}\n"
                f"data:\n  train: '{shard}'\n  seq_len: 16\n  micro_batch: 2\n  grad_accum: 2\neval: {{every: 0}}\n{lines}")
    for what, args in (("qtrain", [QTRAIN, cfg]),
                       ("qtrain --export merged", [QTRAIN, "--resume", rdir, "--export", "merged", "--set",
                                                   f"export.dir={rdir}/merged"])):
        res = subprocess.run(args, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"FAIL lora_peft_{name}: {what} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
            return False
    return True


def check_export(kind, tmp, extras=(), dev="cpu"):
    """qtrain trains adapters, exports them; PEFT over the base gives qtrain's logits; the merged export too."""
    name = f"export_{kind}" + "".join(f"_{x}" for x in extras) + ("_cuda" if dev == "cuda" else "")
    if dev == "cuda":
        kind = kind + "_gpu"
    mdir = os.path.join(tmp, f"base_{kind}")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        build_base(kind, mdir)
    rdir = os.path.join(tmp, name)
    if not train_and_merge(name, rdir, mdir, 11, f"device: {dev}\n"
                           "optim: {lr: 0.01, warmup: 0, steps: 4, weight_decay: 0.1}\n"
                           "lora: {rank: 4, alpha: 8, dropout: 0.1, targets: [q, v, o, up, down], "
                           f"trainable: [{', '.join(extras)}]}}\n"):
        return False
    edir = os.path.join(rdir, "ckpt", "export")
    acfg = json.load(open(os.path.join(edir, "adapter_config.json")))
    B, T = 2, 11
    win = np.random.default_rng(3).integers(0, V, size=(B, T + 1)).astype(np.int32)
    tok = os.path.join(tmp, "tokens_export.i32"); win.tofile(tok)
    out = os.path.join(tmp, f"out_{name}")
    bits = sum(TARGET_BITS[t] for t in acfg["target_modules"])
    xbits = sum(EXTRA_BITS[x] for x in extras)
    res = subprocess.run([TOOL, mdir, edir, tok, str(B), str(T), out, str(acfg["r"]), str(acfg["lora_alpha"]), "0",
                          str(bits), "0", "0", str(xbits)], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"FAIL lora_peft_{name}: tool_lora_dump exited {res.returncode}: {res.stderr.strip()}")
        return False
    ours = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32).reshape(B, T, V)
    pm = peft.PeftModel.from_pretrained(load_base(mdir), edir).eval()
    merged = load_base(os.path.join(rdir, "merged"))
    ids = torch.tensor(win[:, :T], dtype=torch.long)
    with torch.no_grad():
        lp = pm(input_ids=ids).logits.numpy()
        lm = merged(input_ids=ids).logits.numpy()
        lb = load_base(mdir)(input_ids=ids).logits.numpy()
    trained = rel(lp, lb)  # the adapters moved the model: B is no longer zero
    e_peft, e_merged = rel(ours, lp), rel(lm, lp)
    # on the GPU the merged model is its bf16 base + scale B A: within the bf16 bound of PEFT over the fp32 base
    ok = e_peft <= TOL and e_merged <= (TOL if dev == "cpu" else TOL_CUDA["logits"]) and trained > 1e-4 and \
        acfg["lora_dropout"] == 0.1
    print(f"{'PASS' if ok else 'FAIL'} lora_peft_{name}: PEFT over the base vs qtrain logits {e_peft:.1e}, merged export "
          f"vs PEFT {e_merged:.1e}, adapters vs base {trained:.1e}")
    return ok


def check_qlora(kind, tmp):
    """QLoRA on the CPU engine (lora.base_dtype: nf4) against PEFT over bitsandbytes' 4-bit base (nf4, double
    quantization, fp32 compute, its CPU backend): qtrain trains adapters over a bf16-stored base and writes them and
    the merged model; PEFT loads the adapters over the base quantized by bitsandbytes at load. The two codecs agree
    but for bitsandbytes' CPU backend's known differences (tests/test_nf4_bnb.py: a farther 8-bit scale code now
    and then, its fp32 mean as the offset), so the logits agree far closer than either does with the bf16 base's."""
    try:
        from transformers import BitsAndBytesConfig
        import bitsandbytes  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"SKIP lora_peft_qlora_{kind}: bitsandbytes not importable ({exc.__class__.__name__})")
        return True
    name = f"qlora_{kind}"
    mdir = os.path.join(tmp, f"base16_{kind}")
    if not os.path.exists(os.path.join(mdir, "config.json")):  # stored in bf16: both codecs quantize those values
        build_base(kind, mdir)
        load_base(mdir).to(torch.bfloat16).save_pretrained(mdir, safe_serialization=True)
    rdir = os.path.join(tmp, name)
    if not train_and_merge(name, rdir, mdir, 12, "device: cpu\noptim: {lr: 0.01, warmup: 0, steps: 4}\n"
                           "export: {dtype: fp32}\nlora: {rank: 4, alpha: 8, base_dtype: nf4}\n"):
        return False
    q = transformers.AutoModelForCausalLM.from_pretrained(
        mdir, dtype=torch.float32, attn_implementation="eager", device_map="cpu",
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32))
    edir = os.path.join(rdir, "ckpt", "export")
    pm = peft.PeftModel.from_pretrained(q, edir).eval()
    base = peft.PeftModel.from_pretrained(load_base(mdir), edir).eval()  # the same adapters over the bf16 base
    ids = torch.tensor(np.random.default_rng(4).integers(0, V, size=(2, 11)), dtype=torch.long)
    with torch.no_grad():
        lq = pm(input_ids=ids).logits.numpy()
        lb = base(input_ids=ids).logits.numpy()
        ours = load_base(os.path.join(rdir, "merged"))(input_ids=ids).logits.numpy()
    e_q, e_b = rel(ours, lq), rel(lb, lq)
    ok = e_q <= 5e-3 and e_q * 20 <= e_b  # measured 5e-7 (qwen2) and 1.1e-3 (llama: a scale code apart)
    print(f"{'PASS' if ok else 'FAIL'} lora_peft_{name}: qtrain's QLoRA (merged) vs PEFT over bitsandbytes' NF4 base "
          f"{e_q:.1e}; the same adapters over the bf16 base vs that {e_b:.1e}")
    return ok


def main():
    if not os.path.exists(TOOL) or not os.path.exists(QTRAIN):
        print(f"FAIL lora_peft: {TOOL} or {QTRAIN} is missing (run make first)"); return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for kind, targets, r, alpha, rslora, dropout in () if "cpu" not in DEVICES else (
                ("qwen2", ALL, 4, 8, False, 0.0),
                ("llama", ALL, 3, 5, True, 0.0),
                ("qwen3", ALL, 2, 16, False, 0.0),
                ("qwen2", ["k_proj", "o_proj", "up_proj"], 5, 7, False, 0.0),
                ("llama", ["q_proj", "v_proj", "gate_proj", "down_proj"], 4, 8, False, 0.25),
                ("qwen3", ALL, 4, 8, True, 0.1)):
            ok &= check_fwd_bwd(kind, targets, r, alpha, rslora, dropout, tmp)
        if "cpu" in DEVICES:
            # trained base tensors beside the adapters (PEFT's modules_to_save)
            ok &= check_fwd_bwd("llama", ALL, 4, 8, False, 0.0, tmp, ("embeddings", "lm_head", "norms"))
            ok &= check_fwd_bwd("qwen3", ["q_proj", "down_proj"], 3, 6, False, 0.1, tmp, ("norms",))
            ok &= check_fwd_bwd("qwen2", ALL, 2, 4, False, 0.0, tmp, ("norms",))
            for kind in ("qwen2", "llama"):
                ok &= check_export(kind, tmp)
            ok &= check_export("llama", tmp, ("embeddings", "lm_head", "norms"))
            for kind in ("qwen2", "llama"):
                ok &= check_qlora(kind, tmp)
        if "cuda" in DEVICES:
            if not os.path.exists(TOOL_GPU):
                print(f"FAIL lora_peft_cuda: {TOOL_GPU} is missing (a CUDA build makes it)"); return 1
            for kind, targets, r, alpha, rslora, dropout in (
                    ("qwen2", ALL, 4, 8, False, 0.0),
                    ("llama", ["q_proj", "v_proj", "gate_proj", "down_proj"], 4, 8, False, 0.25),
                    ("qwen3", ALL, 4, 8, True, 0.1)):
                ok &= check_fwd_bwd(kind, targets, r, alpha, rslora, dropout, tmp, dev="cuda")
            # trained base tensors beside the adapters on the GPU (PEFT's modules_to_save)
            ok &= check_fwd_bwd("llama", ALL, 4, 8, False, 0.0, tmp, ("embeddings", "lm_head", "norms"), dev="cuda")
            ok &= check_fwd_bwd("qwen3", ["q_proj", "down_proj"], 3, 6, False, 0.1, tmp, ("norms",), dev="cuda")
            ok &= check_export("qwen2", tmp, dev="cuda")
            ok &= check_export("llama", tmp, ("embeddings", "lm_head", "norms"), dev="cuda")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
