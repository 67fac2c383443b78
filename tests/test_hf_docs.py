#!/usr/bin/env python3
"""test_hf_docs.py — packed documents against transformers: one micro-batch of packed windows through
qtrain with attention and RoPE positions per document (build/tests/tool_hf_dump with DOCS) against
transformers running each document as a sequence of its own (positions from 0), the token losses summed
and averaged over all targets as the packed batch does; and against transformers on the packed rows with
position_ids restarting at each document and a block-diagonal causal mask. Loss, logits and every
gradient, as tests/test_hf_compare.py (whose models and bounds it uses). Skips without torch/transformers.
    python3 tests/test_hf_docs.py                # cpu
    QT_DEVICES=cpu,cuda python3 tests/test_hf_docs.py
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hf_compare import TOL, TOOL, build_model, np, rel, torch, transformers  # noqa: E402 (skips without torch)

B, T = 2, 16
# Row 0: documents [0,5) [5,11) [11,16); row 1 opens inside a document ([0,3), position 0 at its token 0).
STARTS = [[0, 5, 11], [0, 3, 9]]
SPEC = "0,5,11;3,9"


def segments(b):
    s = STARTS[b] + [T]
    return [(s[i], s[i + 1]) for i in range(len(s) - 1)]


def separate(model, win):
    """Each document alone: the summed CE of its targets, over the batch's target count."""
    total = 0
    for b in range(B):
        for s, e in segments(b):
            ids = torch.tensor(win[b:b + 1, s:e], dtype=torch.long)
            tgt = torch.tensor(win[b, s + 1:e + 1], dtype=torch.long)
            lg = model(input_ids=ids).logits[0]
            total = total + torch.nn.functional.cross_entropy(lg, tgt, reduction="sum")
    return total / (B * T)


def packed(model, win):
    """The packed rows with position_ids restarting and a block-diagonal causal mask (0 / -inf)."""
    pos = torch.zeros(B, T, dtype=torch.long)
    mask = torch.full((B, 1, T, T), float("-inf"))
    for b in range(B):
        for s, e in segments(b):
            pos[b, s:e] = torch.arange(e - s)
            mask[b, 0, s:e, s:e] = torch.triu(torch.full((e - s, e - s), float("-inf")), 1)
    ids = torch.tensor(win[:, :T], dtype=torch.long)
    tgt = torch.tensor(win[:, 1:], dtype=torch.long)
    lg = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)), lg


def grads(model, loss_fn):
    model.zero_grad()
    loss = loss_fn()
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone().numpy() for n, p in model.named_parameters()}


def check(kind, tied, device, tmp):
    name = f"docs_{kind}_{'tied' if tied else 'untied'}_{device}"
    torch.manual_seed(11)
    mdir = os.path.join(tmp, name)
    build_model(kind, tied, device, mdir)
    model = transformers.AutoModelForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32,
                                                              attn_implementation="eager").float()
    win = np.random.default_rng(3).integers(0, 96, size=(B, T + 1)).astype(np.int32)
    tok = os.path.join(tmp, "tokens.i32"); win.tofile(tok)
    out = os.path.join(tmp, f"out_{name}")
    r = subprocess.run([TOOL, mdir, device, tok, str(B), str(T), out, SPEC], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL hf_{name}: tool_hf_dump exited {r.returncode}: {r.stderr.strip()}")
        return False
    ref_loss, ref = grads(model, lambda: separate(model, win))
    pk_loss, pk = grads(model, lambda: packed(model, win)[0])
    with torch.no_grad():
        logits = packed(model, win)[1].reshape(B * T, -1).numpy()
    tol = TOL[device]
    ours_loss = float(open(os.path.join(out, "loss.txt")).read())
    rows = [("loss", abs(ours_loss - ref_loss) / abs(ref_loss), tol["loss"]),
            ("torch packed vs separate loss", abs(pk_loss - ref_loss) / abs(ref_loss), 1e-5)]
    lp = os.path.join(out, "logits.f32")
    if os.path.exists(lp):
        rows.append(("logits", rel(np.fromfile(lp, dtype=np.float32).reshape(B * T, -1), logits), tol["logits"]))
    from safetensors.numpy import load_file
    ours = load_file(os.path.join(out, "model.safetensors"))
    for pname in ref:
        if pname not in ours:
            if tied and pname == "lm_head.weight":
                continue
            print(f"FAIL hf_{name}: no gradient for {pname}"); return False
        rows.append((pname, rel(ours[pname], ref[pname]), tol["grad"]))
        rows.append((pname + " (torch packed)", rel(pk[pname], ref[pname]), 1e-4))
    ok = True
    for n, err, t in rows:
        print(f"  {name}: {n:60s} rel err {err:.2e} (bound {t:.0e}){'' if err <= t else '   <-- over bound'}")
        ok &= err <= t
    print(f"{'PASS' if ok else 'FAIL'} hf_{name}: loss {ours_loss:.6f} vs torch per document {ref_loss:.6f}")
    return ok


def main():
    if not os.path.exists(TOOL):
        print(f"FAIL hf_docs: {TOOL} is missing (run make first)"); return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for dev in os.environ.get("QT_DEVICES", "cpu").split(","):
            for kind, tied in (("qwen2", True), ("llama", False), ("qwen3", False)):
                ok &= check(kind, tied, dev, tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
