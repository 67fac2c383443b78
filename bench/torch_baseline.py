#!/usr/bin/env python3
"""torch_baseline.py — the PyTorch reference for the training benchmark: a transformers model built
from the same config as ours (random init, no hub), pure bf16, fused AdamW, sdpa attention, the same
tokens per step. Prints tokens/s (median step time of the timed steps, CUDA events).

    python3 bench/torch_baseline.py --model qwen2.5-0.5b --micro-batch 16 --seq 1024 [--compile]
"""
import argparse, json, statistics, sys

SHAPES = {  # hidden, layers, heads, kv heads, ffn, vocab, tied
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936, True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=SHAPES)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    import torch, transformers
    if not torch.cuda.is_available():
        print("SKIP torch_baseline: no CUDA device"); return 0
    h, L, nh, kv, f, v, tied = SHAPES[a.model]
    cfg = transformers.Qwen2Config(hidden_size=h, num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=kv,
                                   intermediate_size=f, vocab_size=v, tie_word_embeddings=tied, rope_theta=1e6,
                                   max_position_embeddings=max(2048, a.seq), use_cache=False,
                                   attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.compile else model
    ids = torch.randint(0, v, (a.micro_batch, a.seq), device="cuda")
    times = []
    for i in range(a.warmup + a.steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        e.record()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(s.elapsed_time(e) / 1e3)
    t = statistics.median(times)
    tok = a.micro_batch * a.seq / t
    res = dict(model=a.model, compile=a.compile, micro_batch=a.micro_batch, seq=a.seq, step_ms=t * 1e3,
               tokens_per_s=tok, peak_gib=torch.cuda.max_memory_allocated() / 2**30, last_loss=loss.item(),
               device=torch.cuda.get_device_name())
    print("RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
