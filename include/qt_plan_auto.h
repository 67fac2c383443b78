/* qt_plan_auto.h — memory.plan: auto: enumerate the memory plans that fit, predict each one's speed,
 * take the fastest.
 *
 * The candidates are the product of a table of axes, one row per config key the planner may choose (a new
 * memory feature is a new row); a key the config gives is a constraint. bf16 master weights or gradients
 * are kept only when no plan with fp32 ones fits; at equal predicted speed the plainer plan wins. Each
 * candidate's plan is made with qt_plan_run (no GPU, nothing allocated) and kept when it fits. A step's
 * predicted time (qt_plan_cost) is max(compute, pcie_micro) + QT_PLAN_OVERLAP_ALPHA x min(compute,
 * pcie_micro) + once; what each part charges and why the constants below have their values:
 * docs/memory.md ("memory.plan: auto"). A LoRA run (lora.rank > 0) keeps only the axes the GPU LoRA engine runs and
 * is charged its own step (qt_plan_auto_lora_cost_parts). */
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
    size_t gpu_bytes;    /* the GPU's memory (the budget when no free memory was measured) */
    size_t gpu_free;     /* free on the run's GPUs as it starts (qt_cuda_mem_free; 0: not measured: no GPU
                          * visible, or --plan --gpu-mem); set by the caller, never cached */
} qt_probe;

/* e4m3 over bf16 matmul rate: gemm_bench's 8192^3 on the H100 (1519.9 / 805.9 TFLOP/s, bench/RESULTS.md). */
#define QT_PROBE_FP8_RATIO 1.9
/* The documented defaults (an H100 SXM as measured by bench/; PCIe Gen5): planning without a GPU. */
qt_probe qt_probe_default(void);
/* The probe of GPU 0: read from <cache_dir>/probe-<name>.txt (the CLI passes ~/.cache/qtrain), else
 * (may_measure) measured — a 4096^3 bf16 GEMM, a 256 MiB pinned copy each way, a 256 MiB device copy;
 * fp8 = QT_PROBE_FP8_RATIO x bf16 — and written there (the directory and its parent are made); else, and without a
 * GPU or a cache_dir (NULL), the defaults. gpu_free is 0: qt_probe_free_memory sets it. */
qt_probe qt_probe_get(const char *cache_dir, int may_measure);

#define QT_PLAN_AUTO_MAX 131072 /* the candidates that fit: at most 7 x 4 x 2 x 5 x 3 x 2^3 x 14 (zero x
                                 * grad_accum_dtype x offload items: 2 with zero 1, 2 x 2 with zero 2 (none,
                                 * gradients), 2 x 4 with zero 3) = 94,080 with several ranks; one GPU:
                                 * 7 x 4 x 2 x 5 x 3 x 2^4 x 4 offload items, less those refused (perf.cuda_graphs
                                 * adds none: a plan that allows graphs is a candidate with them only) */

typedef struct {
    int micro_batch, grad_accum, recompute, offload_optimizer, lmhead_chunks, attn_bwd_chunks;
    int offload_residual, fp8_weight_cache, master_dtype, grad_accum_dtype, zero;
    int offload_bits;    /* memory.offload's weights and gradients items (qt_offload_item bits; one GPU) */
    int lossy;  /* bf16 master weights and/or gradients (1 or 2): taken only where no fp32 plan fits */
    int order;  /* enumeration order: at equal speed the plainer plan (the axes' earlier values) first */
    size_t gpu_bytes, host_bytes;
    double step_s, tokens_per_s; /* predicted */
    int cuda_graphs;     /* perf.cuda_graphs: on wherever the plan allows it (not with offloaded weights, ZeRO-3) */
} qt_plan_choice;

/* The search's axes (src/plan/plan_axes.c): one row per config key memory.plan: auto may choose, each with its
 * candidate values in order of preference (a key the config gives keeps its value), and the combination the
 * search is at (an odometer over the rows). */
#define QT_PLAN_AXES 12
typedef struct {
    int n[QT_PLAN_AXES], v[QT_PLAN_AXES][8]; /* each row's candidate values */
    int idx[QT_PLAN_AXES];                   /* the combination: each row's value index */
    int seqs;                                /* sequences per optimizer step per rank, kept by every candidate */
    int several;                             /* several ranks */
} qt_plan_axes;
/* The axes of cfg's search over `ranks` ranks (qt_plan_run's count), at the first combination. */
void qt_plan_axes_init(qt_plan_axes *ax, const qt_config *cfg, int ranks);
/* *c = cfg with the combination's values set; 1 when that candidate is a repeat of another or a plan refused
 * (by the cross-mode rules, or one that allows CUDA graphs without them). */
int qt_plan_axes_config(const qt_plan_axes *ax, const qt_config *cfg, qt_config *c);
/* Steps to the next combination: 0 after the last. */
int qt_plan_axes_next(qt_plan_axes *ax);
/* The choice of candidate c: its keys' values and lossy (order, bytes and speed are the caller's). */
qt_plan_choice qt_plan_choice_of(const qt_config *c);

/* A predicted step's parts, seconds (see the top of this header), and the PCIe bytes behind them. */
typedef struct {
    double compute, pcie_micro, once;
    double pcie_micro_bytes, pcie_once_bytes; /* per optimizer step and GPU, charged at the PCIe rate (both ways summed) */
} qt_plan_cost;
#define QT_PLAN_OVERLAP_ALPHA 0.2
/* The LM head's dgrad and wgrad run per chunk of r = micro_batch x seq / lmhead_chunks rows at
 * r / (r + QT_PLAN_LM_ROWS) of the bf16 rate: each chunk's wgrad reads and writes the whole [V, C] fp32
 * gradient for a K of only r. Fitted on 7B fp8 on an H200 (train_bench --breakdown-steps; bench/RESULTS.md, where a
 * step goes): 2.85 ms per 512-row chunk (391 rows fit), 52.7 ms per 16,384-row chunk (297), against the
 * 1.62 / 51.7 ms of their FLOPs at 690 TFLOP/s. */
#define QT_PLAN_LM_ROWS 384.0
/* Fitted on the H100 rows at LLM.Q's setting (0.5B-14B, bf16 and fp8): with these passes every
 * prediction lands within 9.2% of the measured; the matmuls alone over-predict 0.5B fp8 by 68% and
 * 1.5B fp8 by 34%. */
#define QT_PLAN_ELEM_PASSES 12
#define QT_PLAN_ELEM_PASSES_FP8 10
/* The passes run at no more than an H100's copy rate on a faster GPU: 1.5B fp8 on an H200 (4.1 TB/s
 * copies) trains at an H100's tokens/s (74.8k vs 73.8k), so their time is not the copy rate's (small
 * reductions, launches): at the probe's 4.1 TB/s the model over-predicts the 1.5B grid by 15-19%, at 2.6
 * it is within 3% (tests/test_plan cost_grid). */
#define QT_PLAN_ELEM_BPS 2.6e12
/* AdamW's offloaded-state stream moves each chunk up and down on two copy engines: the directions
 * overlap, not fully (the chunk's update sits between them). Serial (1.0) under-predicts the 7B grid
 * runs with the optimizer offloaded by 22%, fully overlapped (0.0) over-predicts the everything-offloaded
 * 14B run at 24 GiB by 21%; 0.5 holds all 24 measured rows within 15%. */
#define QT_PLAN_DUPLEX 0.5

/* Sets pr->gpu_free: the least free memory over the GPUs cfg's ranks run on (qt_plan_rank_devices,
 * qt_cuda_mem_free); 0 on a CPU run, without a visible GPU or with ranks that cannot be placed (the run
 * says why later). */
void qt_probe_free_memory(qt_probe *pr, const qt_config *cfg);
/* 1 when memory.plan: auto plans this run: memory.plan auto (the default) and a GPU run (device: cuda, or
 * auto with a CUDA device visible); a CPU run takes its keys as given. */
int qt_plan_auto_wanted(const qt_config *cfg);
/* Held back from the GPU's free memory: the library handles and modules loaded after the query (cuDNN,
 * cuBLASLt: about 0.5 GiB) and the small allocations the plan does not count. */
#define QT_PLAN_GPU_MARGIN ((size_t)1 << 30)
/* The GPU budget per GPU that memory.plan: auto plans for: pr->gpu_free less QT_PLAN_GPU_MARGIN, capped by
 * memory.gpu_limit_gib; without a measured free memory the limit, else pr->gpu_bytes less the margin. *what
 * names where it came from ("memory.gpu_limit_gib = 24", "free on the GPU now (cudaMemGetInfo: 23.48 GiB)
 * less a 1 GiB margin", ...). */
size_t qt_plan_gpu_budget(const qt_config *cfg, const qt_probe *pr, char *what, size_t cap);

/* Every candidate that fits, fastest first, in out[cap] (their count in *n); *lossy_out (may be NULL): the
 * fastest plan left out for its numerics (bf16 master weights or gradients where a plan with fewer of them
 * fits; tokens_per_s 0 when there is none). 0, or -1 with err when none fits (*n 0; err names the smallest
 * candidate's total and the budget) or a plan cannot be made (*n -1). The GPU budget: qt_plan_gpu_budget;
 * the host's: qt_plan_host_limit. */
int qt_plan_auto_enumerate(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *out, int cap,
                           int *n, qt_plan_choice *lossy_out, char *err, size_t errlen);
/* qt_plan_auto prints a NOTE naming the plan left out for its numerics when it predicts more than
 * QT_PLAN_LOSSY_HINT x the chosen plan's tokens/s (7B at 16 GiB: 2.4 x measured, bench/RESULTS.md):
 * 1 when lossy is such a plan. */
#define QT_PLAN_LOSSY_HINT 1.2
int qt_plan_auto_lossy_worth(const qt_plan_choice *chosen, const qt_plan_choice *lossy);
/* The predicted seconds per optimizer step of cfg (its memory keys as set) on pr, and its parts. */
double qt_plan_auto_cost(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
qt_plan_cost qt_plan_auto_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
/* The step of full fine-tuning (src/plan/plan_cost.c). */
qt_plan_cost qt_plan_auto_full_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
/* The block matmul weights (Wqkv, Wo, the three FFN matrices of every layer): what
 * memory.fp8_weight_cache none quantizes again per pass. */
double qt_plan_auto_block_params(const qt_model_cfg *c);
/* The elementwise passes' bytes per token of cfg (norms, SwiGLU, RoPE, residual adds, fp8 quantizes, what the
 * recompute re-reads), and the rate they run at: min(pr->hbm_bps, QT_PLAN_ELEM_BPS). */
double qt_plan_auto_elem_bytes(const qt_layout *L, const qt_config *cfg);
double qt_plan_auto_elem_bps(const qt_probe *pr);
/* NF4 dequantize (lora.base_dtype nf4): bytes per block weight (0.5 code + 1/64 scale code read, 2 bf16 written) and
 * its rate as a fraction of the probed copy rate: nf4_bench on the H200 dequantizes at 2.75-3.39 TB/s, 80-86% of its
 * copy ceiling, where the probe measures 4.1 TB/s (bench/RESULTS.md, the NF4 table). */
#define QT_PLAN_NF4_BYTES (2.5 + 1.0 / 64)
#define QT_PLAN_NF4_HBM_FRAC 0.75
/* A streamed NF4 base's bytes over PCIe per block weight: the code (1/2), the block scale's 8-bit code (1/64) and
 * the fp32 second-level scale per 256 blocks (4/16384). */
#define QT_PLAN_NF4_STREAM_BYTES (0.5 + 1.0 / 64 + 4.0 / 16384)
/* The LoRA adapter products (cuda/lora.cu: thin cuBLASLt GEMMs, memory-bound at rank 8-64) move their bytes at this
 * fraction of the elementwise rate. Fitted on the H200's 7B bf16-base row (18,400 tokens/s, bench/RESULTS.md's LoRA
 * speed table); the NF4 base's row at 24 GiB, held out, lands within tests/test_plan_lora's bound. */
#define QT_PLAN_LORA_ADAPTER_EFF 0.81
/* The step of a LoRA run (cfg->lora.rank > 0; qt_plan_auto_cost_parts hands it on): the frozen base's forward and
 * data-gradient backward, no weight gradient or optimizer over it, the adapters' passes, an NF4 base's dequantizes,
 * AdamW over the adapters and, with ranks, their gradient sum through host memory (src/plan/plan_lora.c). */
qt_plan_cost qt_plan_auto_lora_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr);
/* "micro_batch 16 x grad_accum 4, recompute [...], weights and gradients offloaded" (a static buffer). */
const char *qt_plan_auto_describe(const qt_plan_choice *c);
/* One line of auto's report: tag ("chosen", "next"), every key of c, its GiB and predicted tokens/s, and a NOTE
 * where auto changed the numerics (bf16 master weights or gradients the config did not ask for). */
void qt_plan_auto_print_choice(const char *tag, const qt_plan_choice *c, const qt_config *cfg);
/* When no plan fits cfg (qt_plan_auto_enumerate's -1 with *n 0): appends to err the constraints that block
 * it, each with the plan the search finds when it alone is dropped — a planner key the config gives, dropped
 * as `--set KEY=auto` does (the value kept, the key no longer given) — with its GPU and host GiB and
 * predicted tokens/s; where no single one frees
 * a plan, the fewest of them that together do (dropped all at once, then each kept again while a plan
 * still fits), else that none of them does; with LoRA over a bf16 base also the plan with lora.base_dtype nf4 (the
 * keys kept, bf16 matmuls). Every line is a real search (src/engine/plan_choose.c);
 * buf[QT_PLAN_AUTO_MAX] is scratch. */
void qt_plan_auto_hints(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *buf, char *err,
                        size_t errlen);
/* Writes choice c into cfg's keys. */
void qt_plan_auto_apply(qt_config *cfg, const qt_plan_choice *c);
/* memory.plan: auto: enumerate, print the choice with its prediction and the next two, apply it to cfg.
 * Nothing when memory.plan is manual. 0, or -1 with err. */
int qt_plan_auto(qt_config *cfg, const qt_probe *pr, char *err, size_t errlen);

#endif
