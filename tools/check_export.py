#!/usr/bin/env python3
"""check_export.py — load a qtrain HF export with transformers and score a token shard with it.

    tools/check_export.py runs/quickstart/ckpt/export runs/quickstart/data/eval_000000.bin [--tokens 4096]

Prints the model class, its parameter count and the mean next-token loss on the first --tokens tokens
of the shard: it should match the eval loss qtrain logged. Exits 2 (with a message) when torch or
transformers is missing.
"""
import argparse, struct, sys


def read_shard(path, limit):
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:8] != b"QTTOKENS":
            sys.exit(f"check_export: {path}: not a qtrain shard (bad magic)")
        _, width, n = struct.unpack_from("<IIQ", head, 8)
        data = f.read(min(n, limit) * width)
    fmt = "<%d%s" % (len(data) // width, "H" if width == 2 else "I")
    return list(struct.unpack(fmt, data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("shard", help="an uncompressed .bin shard")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"check_export: needs torch and transformers ({e})")
        return 2
    model = transformers.AutoModelForCausalLM.from_pretrained(a.export_dir, torch_dtype=torch.float32).eval()
    n = sum(p.numel() for p in model.parameters())
    toks = read_shard(a.shard, a.tokens + 1)
    windows = [(toks[i:i + a.seq], toks[i + 1:i + a.seq + 1]) for i in range(0, len(toks) - a.seq - 1, a.seq)]
    x = torch.tensor([w[0] for w in windows]); y = torch.tensor([w[1] for w in windows])
    with torch.no_grad():
        logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    print(f"check_export: transformers {transformers.__version__} loaded {type(model).__name__} "
          f"({n:,} parameters) from {a.export_dir}; loss on {x.numel()} tokens of {a.shard}: {loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
