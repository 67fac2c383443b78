#!/usr/bin/env python3
"""fp8_emulate.py — what per-tensor e4m3 costs a model's gradients, emulated on the CPU with torch.

The block matmuls of a transformers model (the test_fp8_model shapes: a Qwen3-like and a Gemma-3-like model,
random init std 0.02) run with their inputs and weights quantized to e4m3 per tensor (scale 448 / abs-max,
round to nearest even, saturating), and with --grad e4m3 their output gradients too, as qtrain's fp8 recipe
does; the LM head, norms and attention stay fp32. Printed per seed: the final hidden state's relative L2
against fp32 and the per-tensor gradient cosines (worst and median) — the figures the GPU test
(tests/test_fp8_model.c) bounds, so its bounds come from the recipe, not from the GPU under test.

    python3 tools/fp8_emulate.py gemma3 qwen3 --seeds 1 2 3 4 5
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

E4M3_MAX = 448.0


def fq(x):
    """x quantized to e4m3 with one per-tensor scale, back in fp32."""
    a = x.abs().max()
    if a == 0:
        return x
    s = E4M3_MAX / a
    return (x * s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32) / s


class FP8Linear(torch.autograd.Function):
    """y = q(x) q(W)^T; dX = q(dY) q(W), dW = q(dY)^T q(x) (q(dY) only with e4m3 gradients)."""

    @staticmethod
    def forward(ctx, x, w, grad_q):
        xq, wq = fq(x), fq(w)
        ctx.save_for_backward(xq, wq)
        ctx.grad_q = grad_q
        return xq @ wq.t()

    @staticmethod
    def backward(ctx, gy):
        xq, wq = ctx.saved_tensors
        g = fq(gy) if ctx.grad_q else gy
        dw = g.reshape(-1, g.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
        return g @ wq, dw, None


MODE = {"fp8": False, "grad_q": True}


def linear_forward(self, x):
    y = FP8Linear.apply(x, self.weight, MODE["grad_q"]) if MODE["fp8"] else x @ self.weight.t()
    return y if self.bias is None else y + self.bias


def build(family, tie):
    """The test_fp8_model.c shapes (QWEN3 and GEMMA3 there)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3Config, Qwen3ForCausalLM

    if family == "gemma3":
        cfg = Gemma3TextConfig(
            vocab_size=256, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=384, max_position_embeddings=128, sliding_window=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_theta=1e6,
            rope_local_base_freq=1e4, query_pre_attn_scalar=48, final_logit_softcapping=15.0,
            attn_logit_softcapping=None, tie_word_embeddings=tie, initializer_range=0.02)
        model = Gemma3ForCausalLM(cfg)
    else:
        cfg = Qwen3Config(
            vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=384, max_position_embeddings=128, tie_word_embeddings=tie,
            initializer_range=0.02)
        model = Qwen3ForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    emb = model.model.embed_tokens
    if emb.padding_idx is not None:  # a zero pad row makes a zero residual row: qtrain's init draws every row
        with torch.no_grad():
            emb.weight[emb.padding_idx].normal_(0, 0.02)
        emb.padding_idx = None
    for block in model.model.layers:
        for mod in block.modules():
            if isinstance(mod, nn.Linear):
                mod.forward = linear_forward.__get__(mod)
    return model.float()


def grads(model, fp8, grad_q, inp, tgt):
    MODE["fp8"], MODE["grad_q"] = fp8, grad_q
    model.zero_grad()
    out = model(input_ids=inp, output_hidden_states=True)
    F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tgt.reshape(-1), ignore_index=-1).backward()
    return out.hidden_states[-1].detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("families", nargs="+", choices=["qwen3", "gemma3"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[7])
    ap.add_argument("--grad", choices=["e4m3", "fp32"], default="e4m3")
    a = ap.parse_args()
    for fam in a.families:
        for seed in a.seeds:
            for tie in (False, True):
                torch.manual_seed(seed)
                model = build(fam, tie)
                inp, tgt = torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64))
                tgt[0, 5] = -1  # an ignored target, as in the test
                h0, g0 = grads(model, False, False, inp, tgt)
                h1, g1 = grads(model, True, a.grad == "e4m3", inp, tgt)
                cos = sorted((F.cosine_similarity(g0[n].flatten(), g1[n].flatten(), dim=0).item(), n) for n in g0)
                print(f"{fam} seed {seed} tie={str(tie).lower()} grad {a.grad}: final hidden rel L2 "
                      f"{((h1 - h0).norm() / h0.norm()).item():.4f}, gradient cosine worst {cos[0][0]:.4f} "
                      f"({cos[0][1]}), median {cos[len(cos) // 2][0]:.4f}")


if __name__ == "__main__":
    main()
