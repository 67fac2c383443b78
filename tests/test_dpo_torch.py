#!/usr/bin/env python3
"""test_dpo_torch.py — objective: dpo on the CPU LoRA engine against a written torch DPO and TRL.

Random tiny Qwen2 and Llama bases (tests/test_lora_peft.py's) with PEFT adapters of random A and B (B non-zero, so
the policy differs from the reference); random pairs of random tokens with a response mask per row. build/tests/
tool_dpo_dump runs one DPO micro-batch (qt_dpo_cpu_step, as the engine does) and dumps the loss, the row log-probs
(policy and reference), the per-row weights and every adapter gradient. Checked:
1. the DPO math on qtrain's own log-probs: the loss and d loss / d log-prob written in torch (float64, autograd)
   agree to 1e-9 (both are double); TRL's DPOTrainer loss code on the same log-probs gives the same loss;
2. the row log-probs equal torch's (policy: adapters on; reference: PEFT's disable_adapter()) within 1e-6 relative;
3. the loss and the adapter gradients of the whole model equal torch autograd of the written DPO loss through the
   PEFT model in float64: relative L2 <= 1e-6 for the loss and for all the gradients together, <= 5e-6 for each
   tensor (qtrain runs in fp32: the worst tensor, a lora_A, is about 1.5e-6 off; it is printed);
for beta 0.1 and 0.5, label smoothing 0 and 0.2; and the same for full fine-tuning (the policy a noisy copy of the
base, the reference the base: every weight's gradient, 2. and 3.'s bounds). Skips (exit 0) when torch, transformers or peft is missing.
    BUILD=build python3 tests/test_dpo_torch.py"""
import os, subprocess, sys, tempfile, types

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_dpo_dump")

try:
    import numpy as np
    import torch
    import peft
    from safetensors.numpy import load_file
    from test_lora_peft import ALL, TARGET_BITS, V, build_base, load_base, peft_name, rel
except Exception as exc:  # noqa: BLE001
    print(f"SKIP dpo_torch: torch/transformers/peft not importable ({exc.__class__.__name__}: {exc})")
    sys.exit(0)

torch.set_num_threads(2)
P, T = 3, 13


def dpo_torch(pc, pr, rc, rr, beta, eps):
    """The sigmoid DPO loss (DPO paper, eq. 7) with label smoothing eps (cDPO, TRL's sigmoid loss before 1.0), mean
    over the pairs."""
    z = beta * ((pc - pr) - (rc - rr))
    return (-(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)).mean()


def trl_loss(pc, pr, rc, rr, beta):
    """TRL's DPOTrainer._compute_loss (loss_type sigmoid, precomputed reference log-probs) on these log-probs: a
    stand-in model returns them as the per-token log-probs of one completion token per row. None: TRL not here."""
    try:
        from trl import DPOTrainer
    except Exception:  # noqa: BLE001
        return None
    B = 2 * len(pc)
    lp = torch.cat([pc, pr]).reshape(B, 1)
    class Out:  # the model outputs TRL reads: the log-probs, and zeros for its other metrics' inputs
        log_probs = lp

        def __getattr__(self, name):
            return torch.zeros(B, 1, dtype=torch.bool if name.startswith("is_") else torch.float64)
    out = Out()
    model = lambda **kw: out  # noqa: E731
    model.training = True
    acc = types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    metrics = {"train": __import__("collections").defaultdict(list)}
    me = types.SimpleNamespace(model=model, accelerator=acc, aux_loss_enabled=False, ld_alpha=None,
                               precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"],
                               loss_weights=[1.0], beta=beta, use_weighting=False, _metrics=metrics,
                               _total_train_tokens=0, _tp_size=1, label_smoothing=0.0)
    inputs = {"input_ids": torch.zeros(B, 2, dtype=torch.long), "attention_mask": torch.ones(B, 2, dtype=torch.long),
              "completion_mask": torch.ones(B, 2, dtype=torch.long), "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    try:
        loss = DPOTrainer._compute_loss(me, model, inputs, return_outputs=False)
    except Exception as e:  # noqa: BLE001 — a TRL whose internals moved: say so
        raise AssertionError(f"TRL's DPOTrainer._compute_loss could not run on given log-probs: {type(e).__name__}: {e}")
    return float(loss[0] if isinstance(loss, tuple) else loss)


def pairs(rng):
    """Windows [2P, T+1] of random tokens and target masks [2P, T]: a prompt (mask 0), a response (1), padding (0)."""
    win = rng.integers(0, V, size=(2 * P, T + 1)).astype(np.int32)
    mask = np.zeros((2 * P, T), dtype=np.uint8)
    for b in range(2 * P):
        a = int(rng.integers(1, 5))
        mask[b, a:a + int(rng.integers(2, T - a))] = 1
    return win, mask


def check_full(kind, beta, eps, tmp):
    """Full fine-tuning: the policy is the base moved by noise, the reference the base; every weight's gradient."""
    name = f"full_{kind}_beta{beta}_eps{eps}"
    mdir, pdir = os.path.join(tmp, f"base_{kind}"), os.path.join(tmp, f"policy_{kind}")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        build_base(kind, mdir)
    pol_m = load_base(mdir)
    torch.manual_seed(6)
    with torch.no_grad():
        for p in pol_m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    pol_m.save_pretrained(pdir, safe_serialization=True)
    win, mask = pairs(np.random.default_rng(19))
    tok, msk, out = os.path.join(tmp, "tokens.i32"), os.path.join(tmp, "mask.u8"), os.path.join(tmp, f"out_{name}")
    win.tofile(tok)
    mask.tofile(msk)
    beta, eps = float(np.float32(beta)), float(np.float32(eps))
    res = subprocess.run([TOOL, pdir, mdir, tok, msk, str(2 * P), str(T), out, "0", "0", "0", str(beta), str(eps)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        print(f"FAIL dpo_torch_{name}: tool_dpo_dump exited {res.returncode}: {res.stderr.strip()}")
        return False
    ours_loss = float(open(os.path.join(out, "loss.txt")).read())
    lp = np.fromfile(os.path.join(out, "logps.f64"), dtype=np.float64)
    pol_m, ref_m = load_base(pdir).double().train(), load_base(mdir).double()
    ids, tgt = torch.tensor(win[:, :T], dtype=torch.long), torch.tensor(win[:, 1:], dtype=torch.long)
    m = torch.tensor(mask, dtype=torch.float64)

    def row_logps(logits):
        return (torch.log_softmax(logits, -1).gather(-1, tgt[..., None])[..., 0] * m).sum(-1)
    with torch.no_grad():
        ref_t = row_logps(ref_m(input_ids=ids).logits)
    pol_t = row_logps(pol_m(input_ids=ids).logits)
    loss = dpo_torch(pol_t[0::2], pol_t[1::2], ref_t[0::2], ref_t[1::2], beta, eps)
    loss.backward()
    grads = load_file(os.path.join(out, "model.safetensors"))
    gref = {n: p.grad.numpy() for n, p in pol_m.named_parameters()}
    common = sorted(set(grads) & set(gref))
    errs = {"logps_policy": rel(lp[:2 * P], pol_t.detach().numpy()), "logps_ref": rel(lp[2 * P:], ref_t.numpy()),
            "loss": abs(loss.item() - ours_loss) / abs(loss.item()),
            "grads": rel(np.concatenate([grads[n].ravel() for n in common]), np.concatenate([gref[n].ravel() for n in common]))}
    gerr = {n: rel(grads[n], gref[n]) for n in common}
    gworst = max(gerr, key=gerr.get)
    bad = [k for k in errs if errs[k] > 1e-6] + ([gworst] if gerr[gworst] > 5e-6 else [])
    if len(common) != len(gref):
        bad.append(f"tensors missing from qtrain's gradients: {sorted(set(gref) - set(grads))[:3]}")
    print(f"{'FAIL' if bad else 'PASS'} dpo_torch_{name}: loss {ours_loss:.6f}, " +
          ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + f", {len(common)} gradients worst {gworst} {gerr[gworst]:.1e}" +
          (f"; over the bound: {bad}" if bad else ""))
    return not bad


def check(kind, beta, eps, tmp):
    name = f"{kind}_beta{beta}_eps{eps}"
    mdir = os.path.join(tmp, f"base_{kind}")
    if not os.path.exists(os.path.join(mdir, "config.json")):
        build_base(kind, mdir)
    targets, r, alpha = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], 4, 8
    pm = peft.get_peft_model(load_base(mdir), peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                               lora_dropout=0.0))
    torch.manual_seed(5)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(0.15 * torch.randn_like(p))
    adir = os.path.join(tmp, f"adapter_{name}")
    pm.save_pretrained(adir)
    win, mask = pairs(np.random.default_rng(17))
    tok, msk, out = os.path.join(tmp, "tokens.i32"), os.path.join(tmp, "mask.u8"), os.path.join(tmp, f"out_{name}")
    win.tofile(tok)
    mask.tofile(msk)
    beta, eps = float(np.float32(beta)), float(np.float32(eps))  # the values qtrain's fp32 config holds
    res = subprocess.run([TOOL, mdir, adir, tok, msk, str(2 * P), str(T), out, str(r), str(alpha),
                          str(sum(TARGET_BITS[t] for t in targets)), str(beta), str(eps)], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"FAIL dpo_torch_{name}: tool_dpo_dump exited {res.returncode}: {res.stderr.strip()}")
        return False
    ours_loss = float(open(os.path.join(out, "loss.txt")).read())
    lp = np.fromfile(os.path.join(out, "logps.f64"), dtype=np.float64)
    scale = np.fromfile(os.path.join(out, "scale.f32"), dtype=np.float32)
    errs = {}
    # 1. the math on our log-probs (float64 both sides), and TRL on the same
    q = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    pol, ref = q[:2 * P], q[2 * P:]
    l64 = dpo_torch(pol[0::2], pol[1::2], ref[0::2], ref[1::2], beta, eps)
    l64.backward()
    errs["math_loss"] = abs(l64.item() - ours_loss) / abs(l64.item())
    errs["math_dlogp"] = rel(-scale, q.grad[:2 * P].numpy())  # our row weight = -d loss / d log-prob
    trl = trl_loss(pol[0::2].detach(), pol[1::2].detach(), ref[0::2].detach(), ref[1::2].detach(), beta) if eps == 0 else None
    if trl is not None:
        errs["trl_loss"] = abs(trl - ours_loss) / abs(ours_loss)
    # 2. and 3. the whole model in torch
    pm.double().train()
    ids = torch.tensor(win[:, :T], dtype=torch.long)
    tgt = torch.tensor(win[:, 1:], dtype=torch.long)
    m = torch.tensor(mask, dtype=torch.float64)

    def row_logps(logits):
        return (torch.log_softmax(logits, -1).gather(-1, tgt[..., None])[..., 0] * m).sum(-1)
    with torch.no_grad(), pm.disable_adapter():
        ref_t = row_logps(pm(input_ids=ids).logits)
    pol_t = row_logps(pm(input_ids=ids).logits)
    loss = dpo_torch(pol_t[0::2], pol_t[1::2], ref_t[0::2], ref_t[1::2], beta, eps)
    loss.backward()
    errs["logps_policy"] = rel(lp[:2 * P], pol_t.detach().numpy())
    errs["logps_ref"] = rel(lp[2 * P:], ref_t.numpy())
    errs["loss"] = abs(loss.item() - ours_loss) / abs(loss.item())
    grads = load_file(os.path.join(out, "adapter_model.safetensors"))
    gref = {peft_name(n): p.grad.numpy() for n, p in pm.named_parameters() if p.requires_grad}
    if set(grads) != set(gref):
        print(f"FAIL dpo_torch_{name}: tensor names differ: {sorted(set(grads) ^ set(gref))[:4]}")
        return False
    gerr = {n: rel(grads[n], gref[n]) for n in gref}
    gworst = max(gerr, key=gerr.get)
    errs["grads"] = rel(np.concatenate([grads[n].ravel() for n in gref]), np.concatenate([gref[n].ravel() for n in gref]))
    bounds = {"math_loss": 1e-9, "math_dlogp": 1e-6, "trl_loss": 1e-9, "logps_policy": 1e-6, "logps_ref": 1e-6,
              "loss": 1e-6, "grads": 1e-6}
    bad = [k for k in errs if errs[k] > bounds[k]] + ([gworst] if gerr[gworst] > 5e-6 else [])
    ok = not bad
    print(f"{'PASS' if ok else 'FAIL'} dpo_torch_{name}: loss {ours_loss:.6f}, " +
          ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) +
          f", {len(gref)} gradients worst {gworst} {gerr[gworst]:.1e}" +
          ("" if trl is not None or eps else " (TRL not installed: its loss not compared)") +
          (f"; over the bound: {bad}" if bad else ""))
    return ok


def main():
    if not os.path.exists(TOOL):
        print(f"FAIL dpo_torch: {TOOL} not built (make {TOOL})")
        return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for kind, beta, eps in (("qwen2", 0.1, 0.0), ("qwen2", 0.5, 0.2), ("llama", 0.5, 0.0), ("llama", 0.1, 0.2)):
            ok &= check(kind, beta, eps, tmp)
        for kind, beta, eps in (("qwen2", 0.5, 0.1), ("llama", 0.1, 0.0)):
            ok &= check_full(kind, beta, eps, tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
