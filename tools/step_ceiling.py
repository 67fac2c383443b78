#!/usr/bin/env python3
"""step_ceiling.py — what stops a training step short of the tensor cores, from train_bench logs with a
per-op breakdown (`train_bench CONFIG --breakdown-steps 1 ...`): `tools/step_ceiling.py LOG...`.

Per log (one row): the model TFLOP/s of the timed steps; the matmuls' share of the breakdown step and the
rate they run at inside it (6 x matmul parameters x tokens over the matmul ops' time, the LM head
included); the step's ceiling were every other op free (matmul and attention FLOPs over their time); and
the three largest other ops. The model's dimensions come from the config the log names (hidden, heads,
layers, vocab, MLP; head_dim hidden/heads unless given), the tokens per step from the plan line.
"""
import re
import sys

import yaml


def model_flops(m, seq):
    """(matmul, attention) FLOPs per token, as qt_model_flops_per_token counts them (no sliding windows)."""
    C, H, Hkv, F, V, L = (m[k] for k in ("hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                                         "vocab_size", "num_layers"))
    D = m.get("head_dim") or C // H
    matmul = L * (C * (H + 2 * Hkv) * D + H * D * C + 3 * C * F) + V * C
    return 6.0 * matmul, 12.0 * H * D * L * seq / 2.0


def row(path):
    text = open(path).read()
    res = re.search(r"^(\S+) on 1 x .*?\((\w+) matmuls\): (\d+) tokens/s, ([\d.]+) ms/step, ([\d.]+) model TFLOP/s", text, re.M)
    plan = re.search(r"chosen micro_batch\s+(\d+) x grad_accum\s+(\d+)", text)
    ops = dict((k.strip(), float(v)) for k, v in re.findall(r"^  (\S.*?)\s+([\d.]+) ms(?:\s+[\d.]+%)?$", text, re.M))
    if not (res and plan and ops):
        return f"{path}: no result, plan or breakdown"
    cfg = yaml.safe_load(open(res.group(1)))
    seq = cfg["data"]["seq_len"]
    mm_tok, att_tok = model_flops(cfg["model"], seq)
    tokens = int(plan.group(1)) * int(plan.group(2)) * seq
    total = ops.pop("total")
    mm = sum(v for k, v in ops.items() if k.startswith("matmul") or k in ("lm head: matmul fwd", "lm head: dgrad + wgrad"))
    att = ops.get("attention fwd", 0) + ops.get("attention bwd", 0)
    rate = mm_tok * tokens / (mm * 1e-3) * 1e-12
    ceil = (mm_tok + att_tok) * tokens / ((mm + att) * 1e-3) * 1e-12
    others = sorted(((v, k) for k, v in ops.items() if not k.startswith("matmul") and not k.startswith("lm head: matmul")
                     and k != "lm head: dgrad + wgrad" and not k.startswith("attention")), reverse=True)[:3]
    top = ", ".join(f"{k} {100 * v / total:.1f}%" for v, k in others)
    return (f"{res.group(1)} ({res.group(2)}): {float(res.group(5)):.1f} model TFLOP/s; matmuls {100 * mm / total:.1f}% of "
            f"the step at {rate:.0f} TFLOP/s, attention {100 * att / total:.1f}%; ceiling with every other op free "
            f"{ceil:.0f} TFLOP/s; largest others: {top}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        print(row(p))
