/* test_ops_gpu.c — every GPU kernel against its CPU reference, from one table (ggml's test-backend-ops).
 *
 * A row names an op (op_defs_kernels.h, op_defs_lib.h: tensors, bounds, reference, launch), a shape, dtypes,
 * options and a misalignment; op_harness.h runs it: fresh seeded inputs, poisoned outputs and guards, two
 * passes (two poisons, bitwise equal), elementwise and relative-L2 bounds, kept regions, inputs unchanged.
 * A new kernel is checked by one op_def and a few rows. Odd shapes throughout: T=1, N=1 and 7, C=24 and
 * 13 (C % 8 != 0: scalar paths), one-off pointers.
 *
 *   build/tests/test_ops_gpu                 every row on the GPU (one PASS/FAIL line each) + the self-check
 *   build/tests/test_ops_gpu --list          the rows
 *   build/tests/test_ops_gpu --seed N        other inputs (each row's seed is printed on failure)
 *   QT_TEST_ONLY=rmsnorm_bwd build/tests/... the GPU rows whose label contains the text
 *
 * Without a GPU the rows skip ("no CUDA device") and the CPU self-check still runs: every row's reference
 * rounded to the output dtype must pass, and planted bugs must be caught (op_harness.h). Kept beside the
 * table, as special tests: the matmul and attention plan caches (a count of plans, not a value; the window is
 * part of an attention plan's key), and, on the CPU, that each sliding-window row fails an attention without
 * the band (the mutant a graph that dropped the mask would be). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_defs_docs.h"
#include "op_defs_gemma.h"
#include "op_defs_lib.h"
#include "op_defs_lora.h"
#include "op_defs_nf4.h"

#define F32 QT_DT_F32
#define BF16 QT_DT_BF16
#define E4M3 QT_DT_E4M3
#define E5M2 QT_DT_E5M2
/* One row per lmhead implementation (two-pass, cluster, pipelined cluster). */
#define LM(n, v, std, off, opt)                                                                                    \
    {&OP_LMHEAD, {n, v, QT_LMHEAD_TWO_PASS}, 0, 0, opt, std, off},                                                 \
        {&OP_LMHEAD, {n, v, QT_LMHEAD_CLUSTER}, 0, 0, opt, std, off},                                              \
        {&OP_LMHEAD, {n, v, QT_LMHEAD_CLUSTER_PIPE}, 0, 0, opt, std, off}
/* The same under Gemma's final-logit soft-cap (s[3] = cap; std / cap ~ 1: tanh well inside its bend). */
#define LMC(n, v, std, off, opt, cap)                                                                              \
    {&OP_LMHEAD, {n, v, QT_LMHEAD_TWO_PASS, cap}, 0, 0, opt, std, off},                                            \
        {&OP_LMHEAD, {n, v, QT_LMHEAD_CLUSTER, cap}, 0, 0, opt, std, off},                                         \
        {&OP_LMHEAD, {n, v, QT_LMHEAD_CLUSTER_PIPE, cap}, 0, 0, opt, std, off}
/* The four forward GEMM variants of one shape. */
#define MMF(N, I, O)                                                                                               \
    {&OP_MM_FWD, {N, I, O}, BF16, 0, O_BIAS, 0, 0}, {&OP_MM_FWD, {N, I, O}, F32, 0, 0, 0, 0},                      \
        {&OP_MM_FWD, {N, I, O}, F32, 0, O_BIAS | O_ACC, 0, 0}, {&OP_MM_FWD, {N, I, O}, BF16, 0, O_ACC, 0, 0},      \
        {&OP_MM_DGRAD, {N, I, O}, BF16, 0, 0, 0, 0}, {&OP_MM_DGRAD, {N, I, O}, F32, 0, 0, 0, 0},                   \
        {&OP_MM_WGRAD, {N, I, O}, F32, 0, O_ACC | O_BIAS, 0, 0}
/* fp8 GEMM shapes (M, N, K all % 16), b e4m3 or e5m2, plain or fast accumulation. */
#define MM8(be, fast)                                                                                              \
    {&OP_MM_FP8, {32, 48, 64}, F32, be, fast, 0, 0}, {&OP_MM_FP8, {16, 1152, 896}, BF16, be, O_BIAS | fast, 0, 0}, \
        {&OP_MM_FP8, {48, 896, 1152}, F32, be, O_BIAS | fast, 0, 0},                                               \
        {&OP_MM_FP8, {64, 192, 128}, BF16, be, fast, 0, 0}, {&OP_MM_FP8, {192, 128, 64}, F32, be, 0, 0, 0}
/* Attention forward and backward at one shape, B = 2. */
#define ATT(T, H, Hkv, D) {&OP_ATT_FWD, {2, T, H, Hkv, D}, 0, 0, 0, 0, 0}, {&OP_ATT_BWD, {2, T, H, Hkv, D}, 0, 0, 0, 0, 0}
/* The same with a sliding window W (op_case.f): query t sees keys t - W < j <= t. */
#define ATTW(T, H, Hkv, D, W) {&OP_ATT_FWD, {2, T, H, Hkv, D}, 0, 0, 0, W, 0}, {&OP_ATT_BWD, {2, T, H, Hkv, D}, 0, 0, 0, W, 0}
/* The same with Gemma's query_pre_attn_scalar scale (op_defs_lib.h's att_scale), window W (0: causal). */
#define ATTS(T, H, Hkv, D, W) {&OP_ATTS_FWD, {2, T, H, Hkv, D}, 0, 0, 0, W, 0}, {&OP_ATTS_BWD, {2, T, H, Hkv, D}, 0, 0, 0, W, 0}
#define ATTD(T, H, Hkv, D, W)                                                                                 \
    {&OP_ATT_DOCS_FWD, {3, T, H, Hkv, D}, 0, 0, 0, W, 0}, {&OP_ATT_DOCS_BWD, {3, T, H, Hkv, D}, 0, 0, 0, W, 0}

static const op_case CASES[] = {
    /* casts, fill, zero, add (cast.cu): exact; off=1 takes the scalar path */
    {&OP_CAST, {1000003}, BF16, 0, 0, 0, 0}, {&OP_CAST, {1000003}, BF16, 0, 0, 0, 1}, {&OP_CAST, {1}, BF16, 0, 0, 0, 0},
    {&OP_CAST, {1000003}, F32, 0, 0, 0, 0}, {&OP_CAST, {7}, F32, 0, 0, 0, 1},
    {&OP_FILL, {1000003}, BF16, 0, 0, -2.5f, 0}, {&OP_FILL, {1000003}, F32, 0, 0, 0.125f, 1}, {&OP_FILL, {13}, BF16, 0, 0, 3.0f, 1},
    {&OP_ZERO, {1000003}, F32, 0, 0, 0, 0}, {&OP_ZERO, {7}, BF16, 0, 0, 0, 1},
    {&OP_ADD, {1000003}, F32, BF16, 0, 0, 0}, {&OP_ADD, {1000003}, F32, BF16, 0, 0, 1}, {&OP_ADD, {1003}, BF16, F32, 0, 0, 0},
    {&OP_ADD, {77}, BF16, BF16, 0, 0, 1}, {&OP_ADD, {1}, F32, F32, 0, 0, 0},
    /* embedding (embedding.cu): n c v hot */
    {&OP_EMB_FWD, {1, 24, 50, 0}, 0, 0, 0, 0, 0}, {&OP_EMB_FWD, {7, 896, 1000, 30}, 0, 0, 0, 0, 0},
    {&OP_EMB_FWD, {777, 20, 300, 10}, 0, 0, O_BAD, 0, 0}, {&OP_EMB_FWD, {2048, 64, 151936, 5}, 0, 0, 0, 0, 0},
    {&OP_EMB_BWD, {1, 24, 50, 0}, BF16, 0, 0, 0, 0}, {&OP_EMB_BWD, {7, 896, 1000, 30}, BF16, 0, O_RANGE, 0, 0},
    {&OP_EMB_BWD, {5000, 24, 1000, 60}, BF16, 0, 0, 0, 0}, /* bucket of ~3000 rows: sorted in global memory */
    {&OP_EMB_BWD, {5000, 24, 1000, 60}, BF16, 0, O_RANGE, 0, 0},
    {&OP_EMB_BWD, {777, 20, 300, 10}, F32, 0, O_BAD, 0, 0}, /* c % 8 != 0: scalar path */
    {&OP_EMB_BWD, {2048, 64, 151936, 5}, F32, 0, O_RANGE, 0, 0},
    {&OP_EMB_BWD, {7, 896, 1000, 30}, F32, 0, O_RANGE | O_G16, 0, 0}, /* an fp32 table holding bf16 sums (ZeRO-2 g16) */
    {&OP_EMB_BWD, {777, 20, 300, 10}, F32, 0, O_RANGE | O_G16, 0, 0}, /* the same, scalar path */
    {&OP_EMB_BWD, {3000, 16, 2049, 0}, BF16, 0, 0, 0, 0}, /* the id scan's last tile holds one id */
    /* precision.grad_accum_dtype bf16: the table's gradient in bf16 (fp32 sum, one rounding) */
    {&OP_EMB_BWD, {7, 896, 1000, 30}, BF16, BF16, O_RANGE, 0, 0}, {&OP_EMB_BWD, {5000, 24, 1000, 60}, F32, BF16, 0, 0, 0},
    {&OP_EMB_BWD, {777, 20, 300, 10}, BF16, BF16, O_BAD, 0, 0},
    /* bias (bias.cu): n o */
    {&OP_BIAS_ADD, {1, 24}, 0, 0, 0, 0, 0}, {&OP_BIAS_ADD, {7, 896}, 0, 0, 0, 0, 0}, {&OP_BIAS_ADD, {1000, 1152}, 0, 0, 0, 0, 0},
    {&OP_BIAS_ADD, {129, 13}, 0, 0, 0, 0, 0},
    {&OP_BIAS_BWD, {1, 24}, 0, 0, 0, 0, 0}, {&OP_BIAS_BWD, {7, 896}, 0, 0, 0, 0, 0}, {&OP_BIAS_BWD, {1000, 1152}, 0, 0, 0, 0, 0},
    {&OP_BIAS_BWD, {129, 13}, 0, 0, 0, 0, 0},
    {&OP_BIAS_BWD, {1, 24}, BF16, 0, 0, 0, 0}, {&OP_BIAS_BWD, {1000, 1152}, BF16, 0, 0, 0, 0}, /* bf16 db */
    {&OP_BIAS_BWD, {129, 13}, BF16, 0, 0, 0, 1},
    /* RMSNorm (rmsnorm.cu): n c */
    {&OP_RMS_FWD, {1, 896}, 0, 0, O_RES | O_AMAX, 0, 0}, {&OP_RMS_FWD, {7, 24}, 0, 0, O_RES | O_AMAX, 0, 0},
    {&OP_RMS_FWD, {300, 896}, 0, 0, O_AMAX, 0, 0}, {&OP_RMS_FWD, {33, 100}, 0, 0, O_RES | O_AMAX, 0, 0},
    {&OP_RMS_FWD, {5, 100}, 0, 0, O_RES, 0, 0}, {&OP_RMS_FWD, {1, 24}, 0, 0, 0, 0, 0},
    {&OP_RMS_BWD, {1, 896}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS_BWD, {7, 24}, BF16, 0, O_AMAX, 0, 0},
    {&OP_RMS_BWD, {1000, 896}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS_BWD, {65, 100}, F32, 0, O_AMAX, 0, 0}, /* scalar path */
    {&OP_RMS_BWD, {129, 896}, BF16, 0, O_AMAX, 0, 0},
    {&OP_RMS_BWD, {1537, 200}, F32, 0, O_AMAX, 0, 0},  /* several rows per dw partial, uneven last chunk */
    {&OP_RMS_BWD, {3, 12296}, F32, 0, O_AMAX, 0, 0},   /* dw row too big for shared memory: separate pass */
    {&OP_RMS_BWD, {300, 1536}, F32, 0, O_AMAX, 0, 0},  /* widest row held in registers (6 vectors per lane) */
    {&OP_RMS_BWD, {40, 1544}, BF16, 0, O_AMAX, 0, 0},  /* just past it: the looped vector path */
    {&OP_RMS_BWD, {7, 24}, F32, 0, O_NODW, 0, 0}, {&OP_RMS_BWD, {33, 896}, BF16, 0, 0, 0, 0},
    /* bf16 dw (precision.grad_accum_dtype): fused partials, the scalar path, the separate column pass */
    {&OP_RMS_BWD, {1000, 896}, F32, BF16, O_AMAX, 0, 0}, {&OP_RMS_BWD, {65, 100}, BF16, BF16, 0, 0, 0},
    {&OP_RMS_BWD, {3, 12296}, F32, BF16, 0, 0, 0},
    /* RoPE (rope.cu): T d / B T H Hkv D */
    {&OP_ROPE_TABLE, {1, 64}, 0, 0, 0, 1e6f, 0}, {&OP_ROPE_TABLE, {37, 24}, 0, 0, 0, 1e6f, 0},
    {&OP_ROPE_TABLE, {100, 128}, 0, 0, 0, 1e4f, 0},
    {&OP_ROPE_FWD, {1, 1, 2, 1, 64}, 0, 0, 0, 1e6f, 0}, {&OP_ROPE_FWD, {2, 7, 14, 2, 64}, 0, 0, 0, 1e6f, 0},
    {&OP_ROPE_FWD, {1, 37, 4, 2, 24}, 0, 0, 0, 1e6f, 0}, /* D/2 % 8 != 0: scalar path */
    {&OP_ROPE_FWD, {3, 5, 2, 2, 128}, 0, 0, 0, 1e6f, 0},
    {&OP_ROPE_BWD, {1, 1, 2, 1, 64}, 0, 0, O_AMAX, 1e6f, 0}, {&OP_ROPE_BWD, {2, 7, 14, 2, 64}, 0, 0, O_AMAX, 1e6f, 0},
    {&OP_ROPE_BWD, {1, 37, 4, 2, 24}, 0, 0, O_AMAX, 1e6f, 0}, {&OP_ROPE_BWD, {3, 5, 2, 2, 128}, 0, 0, 0, 1e6f, 0},
    /* RoPE scaling types (opt >> 16: the rope_type; T past original_max_position_embeddings 32 and max_seq_len 16) */
    {&OP_ROPE_TABLE, {100, 128}, 0, 0, ROPE_TYPE(QT_ROPE_LINEAR), 5e5f, 0},
    {&OP_ROPE_TABLE, {100, 128}, 0, 0, ROPE_TYPE(QT_ROPE_DYNAMIC), 5e5f, 0},
    {&OP_ROPE_TABLE, {100, 128}, 0, 0, ROPE_TYPE(QT_ROPE_YARN), 1e6f, 0},
    {&OP_ROPE_TABLE, {100, 128}, 0, 0, ROPE_TYPE(QT_ROPE_LLAMA3), 5e5f, 0},
    {&OP_ROPE_TABLE, {37, 24}, 0, 0, ROPE_TYPE(QT_ROPE_LLAMA3), 1e4f, 0},
    {&OP_ROPE_FWD, {2, 70, 4, 2, 64}, 0, 0, ROPE_TYPE(QT_ROPE_LLAMA3), 5e5f, 0},
    {&OP_ROPE_FWD, {2, 70, 4, 2, 64}, 0, 0, ROPE_TYPE(QT_ROPE_YARN), 1e6f, 0},
    {&OP_ROPE_FWD, {1, 37, 4, 2, 24}, 0, 0, ROPE_TYPE(QT_ROPE_YARN), 1e4f, 0},
    {&OP_ROPE_BWD, {2, 70, 4, 2, 64}, 0, 0, O_AMAX | ROPE_TYPE(QT_ROPE_YARN), 1e6f, 0},
    {&OP_ROPE_BWD, {2, 70, 4, 2, 64}, 0, 0, O_AMAX | ROPE_TYPE(QT_ROPE_LLAMA3), 5e5f, 0},
    /* q/k norm (qknorm.cu): n H Hkv D */
    {&OP_QKN_FWD, {1, 2, 1, 64}, 0, 0, 0, 0, 0}, {&OP_QKN_FWD, {37, 8, 2, 128}, 0, 0, 0, 0, 0},
    {&OP_QKN_FWD, {7, 6, 2, 24}, 0, 0, 0, 0, 1}, /* D not a multiple of 32, one-off pointers */
    {&OP_QKN_BWD, {1, 2, 1, 64}, F32, 0, O_AMAX, 0, 0}, {&OP_QKN_BWD, {37, 8, 2, 128}, F32, 0, O_AMAX, 0, 0},
    {&OP_QKN_BWD, {1000, 4, 2, 128}, F32, 0, O_AMAX, 0, 0},
    {&OP_QKN_BWD, {7, 6, 2, 24}, BF16, 0, 0, 0, 1}, {&OP_QKN_BWD, {33, 4, 4, 64}, F32, 0, O_NODW, 0, 0},
    {&OP_QKN_BWD, {129, 16, 4, 128}, BF16, 0, O_AMAX, 0, 0},
    /* several rows per dw part, an uneven last part: the vector layout, and one-off pointers (the strided one) */
    {&OP_QKN_BWD, {5000, 4, 2, 64}, F32, 0, O_AMAX, 0, 0}, {&OP_QKN_BWD, {5000, 4, 2, 64}, BF16, 0, O_AMAX, 0, 1},
    {&OP_QKN_BWD, {37, 8, 2, 128}, BF16, 0, O_AMAX, 0, 1}, {&OP_QKN_FWD, {37, 8, 2, 128}, 0, 0, 0, 0, 1},
    {&OP_QKN_FWD, {3000, 8, 2, 128}, 0, 0, 0, 0, 0},
    /* the (1 + w) form (Gemma 3): its head_dim 256 and 128 (27B), GQA */
    {&OP_QKN1P_FWD, {37, 4, 1, 256}, 0, 0, 0, 0, 0}, {&OP_QKN1P_FWD, {7, 6, 2, 24}, 0, 0, 0, 0, 1},
    {&OP_QKN1P_BWD, {37, 8, 4, 256}, F32, 0, O_AMAX, 0, 0}, {&OP_QKN1P_BWD, {129, 16, 8, 128}, BF16, 0, O_AMAX, 0, 0},
    {&OP_QKN1P_BWD, {7, 6, 2, 24}, BF16, 0, 0, 0, 1},
    /* SwiGLU (swiglu.cu): n f */
    {&OP_SWIGLU_FWD, {1, 4864}, 0, 0, O_AMAX, 0, 0}, {&OP_SWIGLU_FWD, {7, 24}, 0, 0, O_AMAX, 0, 0},
    {&OP_SWIGLU_FWD, {33, 13}, 0, 0, O_AMAX, 0, 0}, {&OP_SWIGLU_FWD, {64, 4864}, 0, 0, O_AMAX, 0, 0},
    {&OP_SWIGLU_FWD, {5, 13}, 0, 0, 0, 0, 0},
    {&OP_SWIGLU_BWD, {1, 4864}, 0, 0, O_AMAX, 0, 0}, {&OP_SWIGLU_BWD, {7, 24}, 0, 0, O_AMAX, 0, 0},
    {&OP_SWIGLU_BWD, {33, 13}, 0, 0, O_AMAX, 0, 0}, {&OP_SWIGLU_BWD, {64, 4864}, 0, 0, O_AMAX | O_INPLACE, 0, 0},
    {&OP_SWIGLU_BWD, {33, 13}, 0, 0, O_INPLACE, 0, 0},
    {&OP_SWIGLU_BWD_H, {64, 4864}, 0, 0, O_AMAX | O_INPLACE, 0, 0}, {&OP_SWIGLU_BWD_H, {7, 24}, 0, 0, O_AMAX, 0, 0},
    {&OP_SWIGLU_BWD_H, {33, 13}, 0, 0, O_INPLACE, 0, 0},
    /* LM-head loss (lmhead_loss.cu): n v impl, f = std of the logits */
    LM(3, 151936, 2.0f, 0, 0),      /* Qwen's vocabulary: 8 CTAs per row */
    LM(13, 151936, 2.0f, 3, O_BAD), /* rows start off a 16-byte boundary; a bad target */
    LM(11, 50257, 3.0f, 0, O_BAD),  /* odd v: each row's head and tail differ; 4 CTAs */
    LM(300, 32000, 2.0f, 0, 0),     /* many clusters of 2 */
    LM(70, 151936, 2.0f, 3, O_BAD), /* more rows than resident clusters: the pipelined kernel loops */
    LM(400, 50257, 3.0f, 1, O_BAD), LM(9, 1009, 4.0f, 1, 0), /* a prime v, clusters of 1 */
    LM(7, 1000, 4.0f, 0, 0), LM(5, 1003, 1.0f, 0, O_BAD),  /* v % 8 != 0: the two-pass scalar path */
    LM(2, 8, 0.5f, 0, 0),                                  /* the ignored row plus one */
    LM(5, 3, 1.0f, 5, 0),                                  /* rows shorter than the scalar head */
    LM(2, 300007, 1.0f, 0, 0),                             /* past the cluster's registers: falls back */
    {&OP_LMHEAD, {13, 151936, QT_LMHEAD_AUTO}, 0, 0, O_BAD, 2.0f, 0},
    {&OP_SUM, {1}, 0, 0, 0, 0, 0}, {&OP_SUM, {13}, 0, 0, 0, 0, 0}, {&OP_SUM, {100003}, 0, 0, 0, 0, 0},
    /* LoRA modules (op_defs_lora.h): n in out r row0; f = dropout p. T = 1, odd widths, a module inside a fused
     * output (row0 > 0), rank 64, misaligned pointers, Qwen2.5-0.5B's k (896 -> 128 of 1152) */
    {&OP_LORA_FWD, {64, 128, 64, 8, 0}, 0, 0, 0, 0, 0}, {&OP_LORA_FWD, {33, 200, 48, 4, 16}, 0, 0, 0, 0.1f, 0},
    {&OP_LORA_FWD, {1, 64, 40, 16, 64}, 0, 0, 0, 0.25f, 1}, {&OP_LORA_FWD, {257, 896, 128, 64, 896}, 0, 0, 0, 0.05f, 0},
    {&OP_LORA_BWD, {64, 128, 64, 8, 0}, 0, 0, 0, 0, 0}, {&OP_LORA_BWD, {33, 200, 48, 4, 16}, 0, 0, 0, 0.1f, 0},
    {&OP_LORA_BWD, {1, 64, 40, 16, 64}, 0, 0, 0, 0.25f, 1}, {&OP_LORA_BWD, {257, 896, 128, 64, 896}, 0, 0, 0, 0.05f, 0},
    {&OP_LORA_BWD, {1024, 4864, 896, 16, 0}, 0, 0, 0, 0.1f, 0}, {&OP_LORA_BWD, {33, 200, 48, 4, 16}, 0, 0, O_CUR, 0.1f, 1},
    /* Gemma 3 (op_defs_gemma.h). GeGLU: n f (6912: Gemma 3 1B's intermediate size) */
    {&OP_GEGLU_FWD, {1, 4864}, 0, 0, O_AMAX, 0, 0}, {&OP_GEGLU_FWD, {7, 24}, 0, 0, O_AMAX, 0, 1},
    {&OP_GEGLU_FWD, {33, 13}, 0, 0, O_AMAX, 0, 0}, {&OP_GEGLU_FWD, {64, 6912}, 0, 0, O_AMAX, 0, 0},
    {&OP_GEGLU_FWD, {5, 13}, 0, 0, 0, 0, 0},
    {&OP_GEGLU_BWD, {1, 4864}, 0, 0, O_AMAX, 0, 0}, {&OP_GEGLU_BWD, {7, 24}, 0, 0, O_AMAX, 0, 1},
    {&OP_GEGLU_BWD, {33, 13}, 0, 0, O_AMAX, 0, 0}, {&OP_GEGLU_BWD, {64, 6912}, 0, 0, O_AMAX | O_INPLACE, 0, 0},
    {&OP_GEGLU_BWD, {33, 13}, 0, 0, O_INPLACE, 0, 0},
    {&OP_GEGLU_BWD_H, {64, 6912}, 0, 0, O_AMAX | O_INPLACE, 0, 0}, {&OP_GEGLU_BWD_H, {7, 24}, 0, 0, O_AMAX, 0, 0},
    {&OP_GEGLU_BWD_H, {33, 13}, 0, 0, O_INPLACE, 0, 0},
    /* RMSNorm with (1 + w): n c (1152 / 2560: Gemma 3 1B / 4B hidden; 256: its q/k-norm head_dim) */
    {&OP_RMS1P_FWD, {1, 1152}, 0, 0, O_RES | O_AMAX, 0, 0}, {&OP_RMS1P_FWD, {7, 24}, 0, 0, O_RES | O_AMAX, 0, 0},
    {&OP_RMS1P_FWD, {300, 2560}, 0, 0, O_AMAX, 0, 0}, {&OP_RMS1P_FWD, {33, 100}, 0, 0, O_RES | O_AMAX, 0, 0},
    {&OP_RMS1P_FWD, {1, 24}, 0, 0, 0, 0, 0}, {&OP_RMS1P_FWD, {512, 256}, 0, 0, 0, 0, 0},
    {&OP_RMS1P_BWD, {1, 1152}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS1P_BWD, {7, 24}, BF16, 0, O_AMAX, 0, 0},
    {&OP_RMS1P_BWD, {1000, 896}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS1P_BWD, {65, 100}, F32, 0, O_AMAX, 0, 0},
    {&OP_RMS1P_BWD, {300, 1536}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS1P_BWD, {40, 1544}, BF16, 0, O_AMAX, 0, 0},
    {&OP_RMS1P_BWD, {3, 12296}, F32, 0, O_AMAX, 0, 0}, {&OP_RMS1P_BWD, {129, 2560}, BF16, 0, O_AMAX, 0, 0},
    {&OP_RMS1P_BWD, {512, 256}, F32, 0, 0, 0, 0}, {&OP_RMS1P_BWD, {7, 24}, F32, 0, O_NODW, 0, 0},
    {&OP_RMS1P_BWD, {1000, 896}, F32, BF16, O_AMAX, 0, 0}, {&OP_RMS1P_BWD, {3, 12296}, F32, BF16, 0, 0, 0},
    /* scaled embedding: n c v hot (262208: Gemma 3's vocabulary) */
    {&OP_EMB_SCALED_FWD, {1, 24, 50, 0}, 0, 0, 0, 0, 0}, {&OP_EMB_SCALED_FWD, {7, 896, 1000, 30}, 0, 0, 0, 0, 0},
    {&OP_EMB_SCALED_FWD, {777, 20, 300, 10}, 0, 0, O_BAD, 0, 0}, {&OP_EMB_SCALED_FWD, {64, 1152, 262208, 5}, 0, 0, 0, 0, 0},
    {&OP_EMB_SCALED_BWD, {1, 24, 50, 0}, BF16, 0, 0, 0, 0}, {&OP_EMB_SCALED_BWD, {7, 896, 1000, 30}, BF16, 0, O_RANGE, 0, 0},
    {&OP_EMB_SCALED_BWD, {5000, 24, 1000, 60}, BF16, 0, 0, 0, 0}, {&OP_EMB_SCALED_BWD, {777, 20, 300, 10}, F32, 0, O_BAD, 0, 0},
    {&OP_EMB_SCALED_BWD, {2048, 64, 262208, 5}, F32, 0, O_RANGE, 0, 0},
    {&OP_EMB_SCALED_BWD, {7, 896, 1000, 30}, F32, 0, O_RANGE | O_G16, 0, 0},
    {&OP_EMB_SCALED_BWD, {7, 896, 1000, 30}, BF16, BF16, O_RANGE, 0, 0},
    /* LM-head loss under the soft-cap: n v impl cap */
    LMC(3, 151936, 15.0f, 0, 0, 15), LMC(13, 262208, 15.0f, 3, O_BAD, 15), /* Gemma's v: past the clusters */
    LMC(11, 50257, 15.0f, 0, O_BAD, 15), LMC(300, 32000, 30.0f, 0, 0, 30), LMC(70, 151936, 15.0f, 3, O_BAD, 15),
    LMC(7, 1000, 15.0f, 0, 0, 15), LMC(5, 1003, 15.0f, 0, O_BAD, 15), LMC(5, 3, 15.0f, 5, 0, 15),
    {&OP_LMHEAD, {13, 151936, QT_LMHEAD_AUTO, 15}, 0, 0, O_BAD, 15.0f, 0},
    /* AdamW (adamw.cu): steps sr; dt = m/v, dt2 = weights (fp32: master + bf16 copy); f = grad scale */
    {&OP_ADAMW, {3, 0}, F32, F32, 0, 0.5f, 0}, {&OP_ADAMW, {1, 0}, BF16, F32, 0, 0, 0},
    {&OP_ADAMW, {1, 1}, BF16, BF16, 0, 0, 0}, {&OP_ADAMW, {1, 0}, F32, BF16, 0, 1.0f, 0},
    {&OP_ADAMW, {1, 1}, F32, BF16, 0, 0.5f, 0}, /* precision.master_dtype bf16: SR, fp32 moments, clip scale */
    {&OP_ADAMW, {3, 0}, F32, F32, O_G16, 0.5f, 0}, {&OP_ADAMW, {1, 1}, BF16, BF16, O_G16, 0, 0}, /* bf16 gradients */
    /* gradient norm (norm.cu): n parts, f = max_norm / norm */
    {&OP_GRAD_NORM, {3000001, 0}, 0, 0, 0, 0, 0}, {&OP_GRAD_NORM, {3000001, 0}, 0, 0, 0, 0.5f, 0},
    {&OP_GRAD_NORM, {3000001, 0}, 0, 0, 0, 2.0f, 1}, {&OP_GRAD_NORM, {3000001, 0}, 0, 0, 0, 0.5f, 1},
    {&OP_GRAD_NORM, {1, 0}, 0, 0, 0, 0, 0}, {&OP_GRAD_NORM, {3000001, 2}, 0, 0, 0, 0.5f, 0},
    {&OP_GRAD_NORM, {3000001, 1}, 0, 0, 0, 2.0f, 0}, {&OP_GRAD_NORM, {1000, 2}, 0, 0, 0, 0.5f, 1},
    {&OP_GRAD_NORM, {3000001, 0}, BF16, 0, 0, 0.5f, 0}, {&OP_GRAD_NORM, {3000001, 2}, BF16, 0, 0, 0.5f, 0}, /* bf16 g */
    {&OP_GRAD_NORM, {1001, 1}, BF16, 0, 0, 2.0f, 1},
    /* fp8 abs-max (quant.cu): n special(1 Inf, 2 NaN); dt = x; +acc with prev = f * max|x| */
    {&OP_AMAX, {1, 0}, F32, 0, 0, 0, 0}, {&OP_AMAX, {7, 2}, BF16, 0, 0, 0, 1}, {&OP_AMAX, {8, 1}, F32, 0, 0, 0, 1},
    {&OP_AMAX, {1000, 0}, BF16, 0, 0, 0, 0}, {&OP_AMAX, {33000, 2}, F32, 0, 0, 0, 0}, {&OP_AMAX, {33000, 1}, BF16, 0, 0, 0, 1},
    {&OP_AMAX, {(1 << 20) + 3, 0}, F32, 0, 0, 0, 1}, {&OP_AMAX, {(1 << 20) + 3, 2}, BF16, 0, 0, 0, 0},
    {&OP_AMAX, {1000, 0}, F32, 0, O_ACC, 2.0f, 0}, {&OP_AMAX, {33000, 0}, BF16, 0, O_ACC, 0.5f, 1},
    {&OP_AMAX, {7, 0}, BF16, 0, O_ACC, 0.5f, 0}, {&OP_AMAX, {0, 0}, F32, 0, O_ACC, 1.0f, 0},
    {&OP_SCALE_RESET, {3}, 0, 0, 0, 0, 0},
    /* qt_quant_scale: special prior (amax finite / NaN / Inf / 0; flag already set) */
    {&OP_SCALE, {0, 0}, E4M3, 0, 0, 0, 0}, {&OP_SCALE, {0, 0}, E5M2, 0, 0, 0, 0}, {&OP_SCALE, {1, 0}, E4M3, 0, 0, 0, 0},
    {&OP_SCALE, {2, 0}, E5M2, 0, 0, 0, 0}, {&OP_SCALE, {1, 41}, E5M2, 0, 0, 0, 0}, {&OP_SCALE, {3, 0}, E4M3, 0, 0, 0, 0},
    /* quantize: n gen (0 random + ties, 1 all codes, 2 past the range); dt <- dt2; f = scale (0 random) */
    {&OP_QUANT, {1, 0}, E4M3, F32, 0, 0, 0}, {&OP_QUANT, {7, 0}, E5M2, BF16, 0, 0.25f, 1},
    {&OP_QUANT, {91, 0}, E4M3, BF16, O_CUR, 0, 0}, {&OP_QUANT, {33000, 0}, E5M2, F32, 0, 0, 1},
    {&OP_QUANT, {33000, 0}, E4M3, F32, 0, 4.0f, 0}, {&OP_QUANT, {33000, 0}, E5M2, BF16, O_CUR, 0, 0},
    {&OP_QUANT, {896L * 4864 + 5, 0}, E4M3, BF16, 0, 0, 1}, {&OP_QUANT, {896L * 4864 + 5, 0}, E5M2, F32, 0, 0.5f, 0},
    {&OP_QUANT, {896L * 4864 + 5, 0}, E4M3, F32, O_CUR, 0, 0}, {&OP_QUANT, {7, 0}, E4M3, F32, O_CUR, 0, 0},
    {&OP_QUANT, {256, 1}, E4M3, F32, 0, 1.0f, 0}, {&OP_QUANT, {256, 1}, E5M2, F32, 0, 1.0f, 0},
    {&OP_QUANT, {256, 1}, E4M3, BF16, 0, 1.0f, 0}, {&OP_QUANT, {256, 1}, E5M2, BF16, 0, 1.0f, 0},
    {&OP_QUANT, {20, 2}, E4M3, F32, 0, 1.0f, 0}, {&OP_QUANT, {20, 2}, E5M2, F32, 0, 1.0f, 0},
    {&OP_QUANT, {300, 4}, E4M3, F32, O_CUR, 0, 0}, {&OP_QUANT, {300, 4}, E5M2, BF16, O_CUR, 0, 0},
    /* quantize + transpose: rows cols */
    {&OP_QUANT_T, {1, 1}, E4M3, F32, 0, 0, 0}, {&OP_QUANT_T, {7, 13}, E5M2, BF16, O_CUR, 0, 0},
    {&OP_QUANT_T, {896, 4864}, E4M3, F32, 0, 0, 0}, {&OP_QUANT_T, {896, 4864}, E5M2, BF16, O_CUR, 0, 0},
    {&OP_QUANT_T, {4864, 896}, E4M3, BF16, O_CUR, 0, 0}, {&OP_QUANT_T, {33, 1000}, E5M2, F32, 0, 0, 0},
    {&OP_QUANT_T, {64, 64}, E4M3, F32, O_CUR, 0, 0}, {&OP_QUANT_T, {130, 72}, E5M2, BF16, 0, 0, 1},
    {&OP_QUANT_T, {16, 9}, E4M3, BF16, 0, 0, 0}, {&OP_QUANT_T, {130, 72}, E4M3, F32, O_CUR, 0, 0},
    /* bf16, C % 8 == 0, aligned: the 128-row tiles; a part tile (208), R % 16 != 0 (1000: scalar yT stores), C = 8 */
    {&OP_QUANT_T, {208, 136}, E4M3, BF16, O_CUR, 0, 0}, {&OP_QUANT_T, {1000, 64}, E5M2, BF16, 0, 0, 0},
    {&OP_QUANT_T, {257, 8}, E4M3, BF16, O_CUR, 0, 0},
    /* SwiGLU backward + quantize-transpose: rows cols (cols % 8 != 0: the two passes it stands for; rows % 16 != 0:
     * scalar yT stores) */
    {&OP_SWIGLU_QT, {1024, 4864}, E4M3, 0, O_AMAX | O_INPLACE, 0, 0}, {&OP_SWIGLU_QT, {130, 72}, E4M3, 0, O_AMAX, 0, 1},
    {&OP_SWIGLU_QT, {33, 13}, E5M2, 0, O_INPLACE, 0, 0}, {&OP_SWIGLU_QT, {1, 1}, E4M3, 0, O_AMAX, 0, 0},
    {&OP_SWIGLU_QT, {256, 1024}, E4M3, 0, O_INPLACE, 0, 0}, /* the fused kernel without the abs-max fold */
    /* the same for GeGLU (Gemma) */
    {&OP_GEGLU_QT, {1024, 4864}, E4M3, 0, O_AMAX | O_INPLACE, 0, 0}, {&OP_GEGLU_QT, {130, 72}, E4M3, 0, O_AMAX, 0, 1},
    {&OP_GEGLU_QT, {33, 13}, E5M2, 0, O_INPLACE, 0, 0}, {&OP_GEGLU_QT, {256, 1024}, E4M3, 0, O_INPLACE, 0, 0},
    /* dequantize: n gen (0 random finite codes, 1 all codes); dt <- dt2; f = descale (0: NULL) */
    {&OP_DEQUANT, {10007, 0}, F32, E4M3, 0, 0.0123f, 0}, {&OP_DEQUANT, {10007, 0}, BF16, E4M3, 0, 0.0123f, 0},
    {&OP_DEQUANT, {10007, 0}, F32, E5M2, 0, 0.0123f, 1}, {&OP_DEQUANT, {10007, 0}, BF16, E5M2, 0, 0.0123f, 0},
    {&OP_DEQUANT, {256, 1}, F32, E4M3, 0, 0, 0}, {&OP_DEQUANT, {256, 1}, F32, E5M2, 0, 0, 0},
    /* the e4m3 weights gathered by ZeRO-3 transposed for the dgrad: tiles, partial tiles, one row / column */
    {&OP_U8T, {896, 4864}, E4M3, 0, 0, 0, 0}, {&OP_U8T, {130, 72}, E4M3, 0, 0, 0, 0},
    {&OP_U8T, {1, 1000}, E4M3, 0, 0, 0, 0}, {&OP_U8T, {1000, 1}, E5M2, 0, 0, 0, 0},
    /* GEMMs (matmul.c): N I O */
    MMF(1, 24, 40), MMF(7, 896, 1152), MMF(33, 24, 1152), MMF(33, 896, 40), MMF(7, 24, 40),
    {&OP_MM_FWD, {5, 896, 1152}, BF16, 0, O_BIAS | O_NOTUNE, 0, 0}, /* a shape of its own: heuristic #0 */
    {&OP_MM_WGRAD, {33, 896, 40}, BF16, 0, O_BIAS, 0, 0}, {&OP_MM_WGRAD, {7, 24, 40}, F32, 0, 0, 0, 0},
    {&OP_MM_DGRAD, {33, 896, 40}, F32, 0, O_ACC, 0, 0},
    {&OP_MM_WGRAD, {33, 896, 40}, BF16, 0, O_ACC, 0, 0}, {&OP_MM_WGRAD, {7, 24, 40}, BF16, 0, O_ACC, 0, 0}, /* bf16 dW += */
    /* fp8 GEMMs: M N K; dt <- a e4m3 x b dt2; the layouts of the model's fwd/dgrad (N,O,I) and wgrad */
    MM8(E4M3, 0), MM8(E4M3, O_FAST), MM8(E5M2, 0), MM8(E5M2, O_FAST),
    {&OP_MM_FP8, {64, 192, 128}, F32, E5M2, O_ACC, 0, 0}, /* the fp8 wgrad's "+=" */
    {&OP_MM_FP8, {64, 192, 128}, BF16, E5M2, O_ACC, 0, 0}, {&OP_MM_FP8, {48, 896, 1152}, BF16, E4M3, O_ACC, 0, 0}, /* into bf16 */
    /* attention (attention.c, cuDNN): B T H Hkv D */
    ATT(1, 6, 2, 64), ATT(7, 6, 2, 64), ATT(64, 6, 2, 64), ATT(100, 6, 2, 64),
    ATT(1, 4, 4, 64), ATT(7, 4, 4, 64), ATT(64, 4, 4, 64), ATT(100, 4, 4, 64),
    ATT(1, 6, 2, 128), ATT(7, 6, 2, 128), ATT(64, 6, 2, 128), ATT(100, 6, 2, 128),
    ATT(1, 4, 4, 128), ATT(7, 4, 4, 128), ATT(64, 4, 4, 128), ATT(100, 4, 4, 128),
    /* sliding window: W = 1 (each query only itself), W < T at odd and tile-sized T, W = T - 1, and W >= T
     * (the causal plan) */
    ATTW(7, 6, 2, 64, 1), ATTW(7, 6, 2, 64, 3), ATTW(100, 6, 2, 64, 17), ATTW(100, 4, 4, 128, 64),
    ATTW(200, 8, 2, 128, 199), ATTW(256, 8, 2, 128, 64), ATTW(64, 6, 2, 64, 64), ATTW(100, 6, 2, 128, 4096),
    /* Gemma's scale query_pre_attn_scalar^-0.5 != D^-0.5: causal and in a window, D 128 (27B) and 64 */
    ATTS(7, 6, 2, 64, 0), ATTS(100, 8, 4, 128, 0), ATTS(100, 8, 4, 128, 17), ATTS(256, 16, 8, 128, 64),
    /* packed documents (op_defs_docs.h): attention with a per-document key bound, alone and with a window;
     * RoPE at the documents' positions (vector and scalar paths, a scaled rope type) */
    ATTD(7, 6, 2, 64, 0), ATTD(100, 6, 2, 64, 0), ATTD(256, 8, 2, 128, 0), ATTD(100, 4, 4, 128, 0),
    ATTD(300, 6, 2, 64, 0), ATTD(100, 6, 2, 64, 17), ATTD(256, 8, 2, 128, 64),
    {&OP_ROPE_POS_FWD, {3, 70, 4, 2, 64}, 0, 0, 0, 1e6f, 0}, {&OP_ROPE_POS_FWD, {2, 37, 4, 2, 24}, 0, 0, 0, 1e6f, 0},
    {&OP_ROPE_POS_BWD, {3, 70, 4, 2, 64}, 0, 0, O_AMAX, 1e6f, 0}, {&OP_ROPE_POS_BWD, {2, 37, 4, 2, 24}, 0, 0, O_AMAX, 1e6f, 0},
    {&OP_ROPE_POS_FWD, {2, 70, 4, 2, 64}, 0, 0, ROPE_TYPE(QT_ROPE_LLAMA3), 5e5f, 0},
    /* NF4 (op_defs_nf4.h): rows cols dq. One value; odd n (a padding nibble, a short block); n % 8 != 0 (the
     * vector path's scalar tail); one-off pointers (the scalar path); 256+1 blocks (a second-level block of one);
     * 2.1M values (130 second-level blocks); fp32 scales (dq 0) */
    {&OP_NF4_DEQUANT, {1, 1, 1}, BF16, 0, 0, 0, 0}, {&OP_NF4_DEQUANT, {7, 13, 1}, BF16, 0, 0, 0, 0},
    {&OP_NF4_DEQUANT, {64, 64, 1}, BF16, 0, 0, 0, 0}, {&OP_NF4_DEQUANT, {33, 1000, 1}, F32, 0, 0, 0, 0},
    {&OP_NF4_DEQUANT, {130, 72, 1}, BF16, 0, 0, 0, 1}, {&OP_NF4_DEQUANT, {130, 72, 0}, BF16, 0, 0, 0, 0},
    {&OP_NF4_DEQUANT, {3, 4097, 0}, F32, 0, 0, 0, 1}, {&OP_NF4_DEQUANT, {1, 64 * 256 + 1, 1}, BF16, 0, 0, 0, 0},
    {&OP_NF4_DEQUANT, {4096, 520, 1}, BF16, 0, 0, 0, 0}, {&OP_NF4_DEQUANT, {1, 1000003, 1}, F32, 0, 0, 0, 1},
    {&OP_NF4_QUANT, {1, 1, 1}, F32, 0, 0, 0, 0}, {&OP_NF4_QUANT, {7, 13, 1}, BF16, 0, 0, 0, 0},
    {&OP_NF4_QUANT, {64, 64, 0}, F32, 0, 0, 0, 0}, {&OP_NF4_QUANT, {33, 1000, 1}, BF16, 0, 0, 0, 0},
    {&OP_NF4_QUANT, {130, 72, 1}, F32, 0, 0, 0, 1}, {&OP_NF4_QUANT, {1, 64 * 256 + 1, 1}, F32, 0, 0, 0, 0},
    {&OP_NF4_QUANT, {3, 4097, 1}, BF16, 0, 0, 0, 1}, {&OP_NF4_QUANT, {4096, 520, 1}, BF16, 0, 0, 0, 0},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static uint64_t g_seed = 20261125;

static int have_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
}
static int device_cc(void) {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major * 10 + minor;
}
static uint64_t row_seed(int i) { return qt_hash64(g_seed, (uint64_t)i); }

static int selected_rows(void) {
    char label[256];
    int n = 0;
    for (int i = 0; i < NCASES; i++) {
        op_label(&CASES[i], label, sizeof label);
        n += qt_t_selected(label);
    }
    return n;
}

/* Every selected row on the GPU: one PASS / FAIL / SKIP line each, counted like QT_RUN's. */
static void run_gpu_rows(void) {
    char label[256];
    int cc = device_cc();
    for (int i = 0; i < NCASES; i++) {
        op_label(&CASES[i], label, sizeof label);
        if (!qt_t_selected(label)) continue;
        if (cc < CASES[i].op->min_cc) {
            printf("SKIP %s: needs sm_%d, device is sm_%d\n", label, CASES[i].op->min_cc, cc);
            qt_t_nskip++;
            continue;
        }
        op_run *r = calloc(1, sizeof *r);
        QT_CHECK(r, "out of host memory");
        op_start(r, &CASES[i], row_seed(i));
        if (op_gpu_pass(r, 0)) op_gpu_pass(r, 1);
        if (r->nfail) {
            printf("FAIL %s (row %d, seed %#llx):%s\n", label, i, (unsigned long long)r->seed, r->log);
            qt_t_nfail++;
        } else {
            printf("PASS %s\n", label);
            qt_t_npass++;
        }
        fflush(stdout);
        op_finish(r);
        free(r);
    }
}

/* The CPU self-check of every row (see op_harness.h); of rows that differ only in what the launch reads
 * (the lmhead implementation), the first. */
static void test_selfcheck(void) {
    char label[256];
    int rows = 0, planted = 0;
    for (int i = 0; i < NCASES; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = op_same_cpu_side(&CASES[i], &CASES[j]);
        if (seen) continue;
        op_label(&CASES[i], label, sizeof label);
        op_run *r = calloc(1, sizeof *r);
        QT_CHECK(r, "out of host memory");
        op_start(r, &CASES[i], row_seed(i));
        int missed = op_selfcheck_row(r, &planted);
        QT_EXPECT(!missed, "%s (row %d): %s", label, i, r->log[0] ? r->log : "planted bugs went unnoticed (above)");
        rows++;
        op_finish(r);
        free(r);
    }
    printf("  self-check: %d rows, %d planted bugs\n", rows, planted);
}

/* Each sliding-window forward row catches a graph that leaves out the band: the causal attention (what
 * such a graph computes), put where the device's result goes, fails the row's check. Runs on the CPU. */
static void test_window_rows_catch_no_band(void) {
    char label[256];
    int rows = 0;
    for (int i = 0; i < NCASES; i++) {
        const op_case *c = &CASES[i];
        if (c->op != &OP_ATT_FWD || c->f <= 0 || c->f >= c->s[1]) continue;
        op_label(c, label, sizeof label);
        op_run *r = calloc(1, sizeof *r);
        QT_CHECK(r, "out of host memory");
        op_start(r, c, row_seed(i));
        op_emulate(r, 0);
        float *out = GOT(r, "out", 0), *lse = GOT(r, "lse", 0);
        qt_ref_attention_fwd(out, lse, H(r, "qkv"), (int)c->s[0], (int)c->s[1], (int)c->s[2], (int)c->s[3], (int)c->s[4], 0);
        for (long j = 0; j < T(r, "out")->n; j++) out[j] = op_round(QT_DT_BF16, out[j]);
        r->nfail = 0;
        op_verify(r, 0, NULL);
        QT_EXPECT(r->nfail > 0, "%s (row %d): the causal attention passes the windowed row", label, i);
        rows++;
        op_finish(r);
        free(r);
    }
    printf("  %d windowed attention rows, each failing the causal attention\n", rows);
    QT_EXPECT(rows > 0, "no windowed attention row in the table");
}

/* Each packed-document row catches a kernel that ignores the documents: the attention over the whole window
 * (causal, with the row's window) or RoPE at positions t, put where the device's result goes, fails the
 * row's check. Runs on the CPU. */
static void test_docs_rows_catch_no_docs(void) {
    char label[256];
    int rows = 0;
    for (int i = 0; i < NCASES; i++) {
        const op_case *c = &CASES[i];
        if (c->op != &OP_ATT_DOCS_FWD && c->op != &OP_ROPE_POS_FWD) continue;
        op_label(c, label, sizeof label);
        op_run *r = calloc(1, sizeof *r);
        QT_CHECK(r, "out of host memory");
        op_start(r, c, row_seed(i));
        op_emulate(r, 0);
        int B = (int)c->s[0], Tn = (int)c->s[1], Hq = (int)c->s[2], Hkv = (int)c->s[3], Dh = (int)c->s[4];
        if (c->op == &OP_ATT_DOCS_FWD) {
            float *out = GOT(r, "out", 0), *lse = GOT(r, "lse", 0);
            qt_ref_attention_fwd(out, lse, H(r, "qkv"), B, Tn, Hq, Hkv, Dh, (int)c->f);
            for (long j = 0; j < T(r, "out")->n; j++) out[j] = op_round(QT_DT_BF16, out[j]);
        } else {
            double inv[QT_ROPE_MAX_HALF], attn;
            float *q = GOT(r, "qkv", 0);
            rope_freqs(r, Tn, Dh, inv, &attn);
            memcpy(q, H(r, "qkv"), (size_t)T(r, "qkv")->n * sizeof *q);
            qt_ref_rope_fwd(q, B, Tn, Hq, Hkv, Dh, inv, attn);
            for (long j = 0; j < T(r, "qkv")->n; j++) q[j] = op_round(QT_DT_BF16, q[j]);
        }
        r->nfail = 0;
        op_verify(r, 0, NULL);
        QT_EXPECT(r->nfail > 0, "%s (row %d): the computation without documents passes the row", label, i);
        rows++;
        op_finish(r);
        free(r);
    }
    printf("  %d packed-document rows, each failing the computation without documents\n", rows);
    QT_EXPECT(rows > 0, "no packed-document row in the table");
}

/* Each scaled attention row catches an attention that ignores the scale it is given (1/sqrt(D), what the plain
 * launcher computes), put where the device's result goes, forward and backward. Runs on the CPU. */
static void test_scaled_rows_catch_default_scale(void) {
    char label[256];
    int rows = 0;
    for (int i = 0; i < NCASES; i++) {
        const op_case *c = &CASES[i];
        int bwd = c->op == &OP_ATTS_BWD;
        if (c->op != &OP_ATTS_FWD && !bwd) continue;
        op_label(c, label, sizeof label);
        op_run *r = calloc(1, sizeof *r);
        QT_CHECK(r, "out of host memory");
        op_start(r, c, row_seed(i));
        op_emulate(r, 0);
        int B = (int)c->s[0], Tn = (int)c->s[1], Hh = (int)c->s[2], Hk = (int)c->s[3], Dd = (int)c->s[4], W = (int)c->f;
        const char *name = bwd ? "dqkv" : "out";
        float *got = GOT(r, name, 0);
        if (bwd)
            qt_ref_attention_bwd(got, H(r, "dout"), H(r, "qkv"), H(r, "out"), H(r, "lse"), B, Tn, Hh, Hk, Dd, W);
        else
            qt_ref_attention_fwd(got, GOT(r, "lse", 0), H(r, "qkv"), B, Tn, Hh, Hk, Dd, W);
        for (long j = 0; j < T(r, name)->n; j++) got[j] = op_round(QT_DT_BF16, got[j]);
        r->nfail = 0;
        op_verify(r, 0, NULL);
        QT_EXPECT(r->nfail > 0, "%s (row %d): the attention at 1/sqrt(D) passes the scaled row", label, i);
        rows++;
        op_finish(r);
        free(r);
    }
    printf("  %d scaled attention rows, each failing the attention at 1/sqrt(D)\n", rows);
    QT_EXPECT(rows > 0, "no scaled attention row in the table");
}

/* The guard check on its own: a byte written before or after a buffer is found, the poison is not. */
static void test_selfcheck_guards(void) {
    uint8_t raw[64];
    memset(raw, 0x7f, sizeof raw);
    QT_EXPECT(op_guard_hit(raw, 16, 32, 64, 0x7f) < 0, "clean guards reported");
    raw[20] = 0; /* inside the tensor: not a guard */
    QT_EXPECT(op_guard_hit(raw, 16, 32, 64, 0x7f) < 0, "a write inside the tensor reported");
    raw[15] = 0;
    QT_EXPECT(op_guard_hit(raw, 16, 32, 64, 0x7f) == 15, "a write before the tensor missed");
    raw[15] = 0x7f, raw[48] = 1;
    QT_EXPECT(op_guard_hit(raw, 16, 32, 64, 0x7f) == 48, "a write past the end missed");
}

/* ---- special tests: the plan caches (a count, not a value) ---- */

static void test_matmul_plan_cache(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    qt_matmul_ctx *c = qt_matmul_create(0);
    long N = 33, I = 896, O = 1152;
    void *x, *w, *y;
    QT_REQUIRE(cudaMalloc(&x, (size_t)N * I * 2) == cudaSuccess && cudaMalloc(&w, (size_t)O * I * 2) == cudaSuccess &&
                   cudaMalloc(&y, (size_t)N * O * 2) == cudaSuccess, "cudaMalloc");
    cudaMemset(x, 0, (size_t)N * I * 2);
    cudaMemset(w, 0, (size_t)O * I * 2);
    QT_REQUIRE(qt_matmul_plan_count(c) == 0, "fresh context has %ld plans", qt_matmul_plan_count(c));
    qt_matmul_fwd(c, y, QT_DT_BF16, x, w, NULL, N, (int)I, (int)O, 0, 0);
    long after1 = qt_matmul_plan_count(c);
    for (int i = 0; i < 3; i++) qt_matmul_fwd(c, y, QT_DT_BF16, x, w, NULL, N, (int)I, (int)O, 0, 0);
    long after4 = qt_matmul_plan_count(c);
    qt_matmul_fwd(c, y, QT_DT_BF16, x, w, NULL, N - 1, (int)I, (int)O, 0, 0); /* a new shape */
    long after5 = qt_matmul_plan_count(c);
    QT_EXPECT(cudaDeviceSynchronize() == cudaSuccess, "CUDA error");
    QT_EXPECT(after1 == 1 && after4 == 1 && after5 == 2, "plans built: %ld after 1 call, %ld after 4, %ld after a new shape",
              after1, after4, after5);
    cudaFree(x), cudaFree(w), cudaFree(y);
    qt_matmul_free(c);
}

static void test_attention_plan_cache(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    qt_attention_ctx *c = qt_attention_create();
    char err[600];
    QT_REQUIRE(qt_attention_plan_count(c) == 0, "fresh context has %ld plans", qt_attention_plan_count(c));
    int rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, 0, err, sizeof err);
    QT_REQUIRE(rc == 0, "%.600s", err);
    long n1 = qt_attention_plan_count(c);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, 0, err, sizeof err);
    long n2 = qt_attention_plan_count(c);
    QT_EXPECT(rc == 0 && n1 == 2 && n2 == 2, "plans: %ld after the first prepare (fwd+bwd), %ld after the second", n1, n2);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 60, 0, err, sizeof err); /* D % 8 != 0: a clean error */
    QT_EXPECT(rc == -1 && strstr(err, "D=60"), "bad head dim: rc %d, message \"%s\"", rc, err);
    qt_attention_free(c);
}

/* The window is part of a plan's key: W < T builds its own fwd and bwd plans, W >= T shares the causal
 * ones (the band would mask nothing), and a negative window is a clean error. */
static void test_attention_window_plans(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    qt_attention_ctx *c = qt_attention_create();
    char err[600];
    int rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, 0, err, sizeof err);
    QT_REQUIRE(rc == 0, "%.600s", err);
    long causal = qt_attention_plan_count(c);
    int covers = !qt_attention_prepare(c, 1, 32, 4, 2, 64, 32, err, sizeof err) &&
                 !qt_attention_prepare(c, 1, 32, 4, 2, 64, 4096, err, sizeof err);
    long shared = qt_attention_plan_count(c);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, 8, err, sizeof err);
    QT_REQUIRE(rc == 0, "window 8: %.600s", err);
    long banded = qt_attention_plan_count(c);
    QT_EXPECT(covers && causal == 2 && shared == 2 && banded == 4,
              "plans: %ld causal, %ld after windows 32 and 4096 (T = 32), %ld after window 8", causal, shared, banded);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, -1, err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, "W=-1") && strstr(err, "window 0 <= W < 2^24"), "window -1: rc %d, message \"%s\"", rc, err);
    qt_attention_free(c);
}

/* Documents are part of a plan's key: prepare_docs with docs 1 builds its own fwd and bwd plans (cuDNN takes the
 * graph with the key bound), with docs 0 it shares the causal ones. */
static void test_attention_docs_plans(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    qt_attention_ctx *c = qt_attention_create();
    char err[600];
    int rc = qt_attention_prepare(c, 2, 64, 4, 2, 64, 0, err, sizeof err);
    QT_REQUIRE(rc == 0, "%.600s", err);
    long causal = qt_attention_plan_count(c);
    rc = qt_attention_prepare_docs(c, 2, 64, 4, 2, 64, 0, 0, err, sizeof err);
    long shared = qt_attention_plan_count(c);
    QT_REQUIRE(rc == 0, "%.600s", err);
    rc = qt_attention_prepare_docs(c, 2, 64, 4, 2, 64, 0, 1, err, sizeof err);
    QT_REQUIRE(rc == 0, "cuDNN refuses the document-masked graph: %.600s", err);
    long docs = qt_attention_plan_count(c);
    QT_EXPECT(causal == 2 && shared == 2 && docs == 4, "plans: %ld causal, %ld after docs 0, %ld after docs 1", causal,
              shared, docs);
    qt_attention_free(c);
}

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        char label[256];
        if (!strcmp(argv[a], "--list")) {
            for (int i = 0; i < NCASES; i++) {
                op_label(&CASES[i], label, sizeof label);
                printf("%3d %s\n", i, label);
            }
            return 0;
        } else if (!strcmp(argv[a], "--seed") && a + 1 < argc) {
            g_seed = strtoull(argv[++a], NULL, 0);
        } else {
            fprintf(stderr, "usage: %s [--list] [--seed N]   (QT_TEST_ONLY=text selects rows)\n", argv[0]);
            return 2;
        }
    }
    printf("  seed %#llx, %d rows\n", (unsigned long long)g_seed, NCASES);
    QT_RUN(test_selfcheck_guards);
    QT_RUN(test_selfcheck);
    QT_RUN(test_gemma_planted);
    QT_RUN(test_lora_planted);
    QT_RUN(test_nf4_planted);
    QT_RUN(test_window_rows_catch_no_band);
    QT_RUN(test_scaled_rows_catch_default_scale);
    QT_RUN(test_docs_rows_catch_no_docs);
    if (have_gpu()) run_gpu_rows();
    else if (selected_rows()) {
        printf("SKIP test_ops_gpu: no CUDA device (%d rows selected; test_selfcheck runs every row on the CPU)\n", selected_rows());
        qt_t_nskip++;
    }
    QT_RUN(test_matmul_plan_cache);
    QT_RUN(test_attention_plan_cache);
    QT_RUN(test_attention_window_plans);
    QT_RUN(test_attention_docs_plans);
    if (g_mm) qt_matmul_free(g_mm);
    if (g_att) qt_attention_free(g_att);
    return qt_test_end();
}
