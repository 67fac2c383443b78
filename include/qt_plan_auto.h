/* qt_plan_auto.h — memory.plan: auto: enumerate the memory plans that fit, predict each one's speed,
 * take the fastest.
 *
 * The candidates are the product of a table of axes (one row per config key: data.micro_batch, keeping
 * micro_batch x grad_accum; memory.recompute; memory.offload_optimizer; memory.lmhead_chunks;
 * memory.attn_bwd_chunks; memory.offload_residual; memory.fp8_weight_cache (fp8 matmuls);
 * precision.master_dtype and precision.grad_accum_dtype (fp32, bf16); parallel.zero 1, 2, 3 (several
 * ranks; 3 not with CUDA graphs, and with fp8 only with the weight cache none); memory.offload's
 * weights and gradients items (one GPU, or the ranks' shards: weights with zero 3, gradients with zero 2
 * and 3)): a new memory feature is a new row. A key the config gives is a constraint (its axis keeps the
 * given value). bf16 master weights or gradients change the numerics: a plan with them is kept only when
 * no plan with fp32 ones fits, and the chosen plan then says so. Offloaded weights or gradients (the same
 * bits) cost PCIe bytes every micro-step, which the cost model charges as an upper bound: a plan with them
 * wins where it is predicted faster. At equal predicted speed the plainer plan wins (each axis lists its
 * plainest value first, and the offload axis varies last). Each candidate's plan is made with qt_plan_run (no GPU, nothing
 * allocated) and kept when it fits the GPU (memory.gpu_limit_gib, else the probe's GPU memory) and the
 * host limit. Cost per optimizer step, in three parts (qt_plan_cost):
 * compute:
 *   matmul FLOPs (6 x params x tokens, attention, plus the recomputed forward parts) / (rate x eff(B x T))
 *   + elementwise bytes: QT_PLAN_ELEM_PASSES bf16 passes over [tokens, hidden + ffn] per layer (plus
 *     QT_PLAN_ELEM_PASSES_FP8 with fp8 matmuls: the quantize and abs-max passes) and what the recompute
 *     re-reads / the elementwise rate (the HBM copy rate, at most QT_PLAN_ELEM_BPS)
 *   + fp8_weight_cache none: grad_accum x 2 passes x block params x 3 B (read bf16, write e4m3) / that rate
 * pcie_micro, the copies that run on copy streams beside each micro-step's compute:
 *   offloaded residuals: grad_accum x 2 ways x (layers - 2) x B x T x hidden x 2 B / PCIe bandwidth
 *   + offloaded weights (one GPU): grad_accum x 2 (forward, backward) x the layers' bf16 bytes / PCIe
 *   + offloaded gradients (one GPU): (2 x grad_accum - 1) x 4 B/param (2 in bf16; each micro-step's
 *     stores, all but the first's loads) / PCIe
 * once, serial with the rest:
 *   offloaded optimizer state (fp32 master unless bf16, m, v) up and down once, the two directions
 *     overlapping by half (QT_PLAN_DUPLEX: (1 + QT_PLAN_DUPLEX) x its bytes one way) / PCIe bandwidth
 *   + offloaded weights' once-per-step bytes: the embedding and LM-head buckets, AdamW's bf16 writes and
 *     the finiteness count's reads (2 B/param each; a bf16 master's reads 2 more)
 *   + offloaded gradients' norm and AdamW reads and the zeroing: 3 x 4 B/param (2 in bf16)
 *   + parallel.zero 3: grad_accum x 2 (forward, backward) x the layers' bf16 bytes (2 B/param; 1 with
 *     parallel.gather_dtype e4m3) / PCIe
 *     bandwidth (as if every byte crossed and nothing overlapped: an upper bound); a rank's offloaded
 *     gradient shard with ZeRO-2/3: 8 B per element per micro-step + 12 per step
 *   + gradient sums through host memory (parallel.comm host/host_wc): (n-1)/n x 4 B/param (2 with
 *     reduce_dtype or grad_accum_dtype bf16) once per step, every micro-step with ZeRO-2/3 / PCIe bandwidth
 *   + launches of the extra lm-head and attention chunks x 10 us
 *   (bf16 master / gradients are charged nothing: the same matmuls; peer transports neither),
 * where eff(n) = n / (n + 512) models the smaller matmuls of small micro-batches. The step then takes
 * max(compute, pcie_micro) + QT_PLAN_OVERLAP_ALPHA x min(compute, pcie_micro) + once: the slower of the
 * compute and its side copies sets the pace and the faster still costs a fifth of itself (copies and
 * kernels share HBM and the host's memory; fitted on session 17's H200 runs held to 24/16/12 GiB, where
 * the sum of all three over-charged 7B at 24 GiB by 31%; bench/RESULTS.md section 7). */
#ifndef QT_PLAN_AUTO_H
#define QT_PLAN_AUTO_H

#include <stddef.h>

#include "qt_config.h"
#include "qt_model.h"

/* What the cost model is measured against: one GPU's rates. */
typedef struct {
    char gpu[64];        /* the GPU's name ("default" when not probed) */
    double bf16_flops;   /* dense bf16 matmul rate, FLOP/s (large GEMM) */
    double fp8_flops;    /* e4m3 rate */
    double hbm_bps;      /* device memory bandwidth, bytes/s */
    double pcie_bps;     /* pinned host <-> device copy bandwidth, bytes/s (the slower direction) */
    size_t gpu_bytes;    /* the GPU's memory (the cap when memory.gpu_limit_gib is 0) */
} qt_probe;

/* e4m3 over bf16 matmul rate: gemm_bench's 8192^3 on the H100 (1519.9 / 805.9 TFLOP/s, RESULTS section 2). */
#define QT_PROBE_FP8_RATIO 1.9
/* The documented defaults (an H100 SXM as measured by bench/; PCIe Gen5): planning without a GPU. */
qt_probe qt_probe_default(void);
/* The probe of GPU 0: read from <cache_dir>/probe-<name>.txt (the CLI passes ~/.cache/qtrain), else
 * (may_measure) measured — a 4096^3 bf16 GEMM, a 256 MiB pinned copy each way, a 256 MiB device copy;
 * fp8 = QT_PROBE_FP8_RATIO x bf16 — and written there (the directory and its parent are made); else, and without a
 * GPU, the defaults. */
qt_probe qt_probe_get(const char *cache_dir, int may_measure);

#define QT_PLAN_AUTO_MAX 131072 /* the candidates that fit: at most 7 x 4 x 2 x 5 x 3 x 2^3 x 14 (zero x
                                 * grad_accum_dtype x offload items: 2 with zero 1, 2 x 2 with zero 2 (none,
                                 * gradients), 2 x 4 with zero 3) = 94,080 with several ranks; one GPU:
                                 * 7 x 4 x 2 x 5 x 3 x 2^4 x 4 offload items, less those refused */

typedef struct {
    int micro_batch, grad_accum, recompute, offload_optimizer, lmhead_chunks, attn_bwd_chunks;
    int offload_residual, fp8_weight_cache, master_dtype, grad_accum_dtype, zero;
    int offload_bits;    /* memory.offload's weights and gradients items (qt_offload_item bits; one GPU) */
    int lossy;  /* bf16 master weights and/or gradients (1 or 2): taken only where no fp32 plan fits */
    int order;  /* enumeration order: at equal speed the plainer plan (the axes' earlier values) first */
    size_t gpu_bytes, host_bytes;
    double step_s, tokens_per_s; /* predicted */
} qt_plan_choice;

/* A predicted step's parts, seconds (see the top of this header), and the PCIe bytes behind them. */
typedef struct {
    double compute, pcie_micro, once;
    double pcie_micro_bytes, pcie_once_bytes; /* per optimizer step and GPU, charged at the PCIe rate (both ways summed) */
} qt_plan_cost;
#define QT_PLAN_OVERLAP_ALPHA 0.2
/* Fitted on the H100 rows of bench/RESULTS.md 1.0, 1.2 and 1.5 (0.5B-14B, bf16 and fp8 at LLM.Q's
 * setting): with these every prediction lands within 9.2% of the measured (section 7); before, the
 * matmuls alone over-predicted 0.5B fp8 by 68% and 1.5B fp8 by 34%. */
#define QT_PLAN_ELEM_PASSES 12
#define QT_PLAN_ELEM_PASSES_FP8 10
/* The passes run at no more than an H100's copy rate on a faster GPU: 1.5B fp8 on an H200 (4.1 TB/s
 * copies) trained at an H100's tokens/s (74.8k vs 73.8k), so their time is not the copy rate's (small
 * reductions, launches): at the probe's 4.1 TB/s the model over-predicted that grid by 15-19%, at 2.6
 * within 3% (session 18's grid, tests/test_plan cost_holdout). */
#define QT_PLAN_ELEM_BPS 2.6e12
/* AdamW's offloaded-state stream moves each chunk up and down on two copy engines: the directions
 * overlap, not fully (the chunk's update sits between them). Serial (1.0) under-predicted session 18's
 * 7B grid with the optimizer offloaded by 22%, fully overlapped (0.0) over-predicted session 17's
 * everything-offloaded 14B by 21%; 0.5 holds all 24 measured rows within 15%. */
#define QT_PLAN_DUPLEX 0.5

/* Every candidate that fits, fastest first, in out[cap] (their count in *n); *lossy_out (may be NULL): the
 * fastest plan left out for its numerics (bf16 master weights or gradients where a plan with fewer of them
 * fits; tokens_per_s 0 when there is none). 0, or -1 with err when none fits (naming the smallest
 * candidate's total and the limit) or a plan cannot be made. */
int qt_plan_auto_enumerate(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *out, int cap,
                           int *n, qt_plan_choice *lossy_out, char *err, size_t errlen);
/* qt_plan_auto prints a NOTE naming the plan left out for its numerics when it predicts more than
 * QT_PLAN_LOSSY_HINT x the chosen plan's tokens/s (7B at 16 GiB: 2.4 x measured, bench/RESULTS.md
 * section 9): 1 when lossy is such a plan. */
#define QT_PLAN_LOSSY_HINT 1.2
int qt_plan_auto_lossy_worth(const qt_plan_choice *chosen, const qt_plan_choice *lossy);
/* The predicted seconds per optimizer step of cfg (its memory keys as set) on pr, and its parts. */
double qt_plan_auto_cost(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
qt_plan_cost qt_plan_auto_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
/* The block matmul weights (Wqkv, Wo, the three FFN matrices of every layer): what
 * memory.fp8_weight_cache none quantizes again per pass. */
double qt_plan_auto_block_params(const qt_model_cfg *c);
/* Writes choice c into cfg's keys. */
void qt_plan_auto_apply(qt_config *cfg, const qt_plan_choice *c);
/* memory.plan: auto: enumerate, print the choice with its prediction and the next two, apply it to cfg.
 * Nothing when memory.plan is manual. 0, or -1 with err. */
int qt_plan_auto(qt_config *cfg, const qt_probe *pr, char *err, size_t errlen);

#endif
