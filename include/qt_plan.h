/* qt_plan.h — the plan of a run: every precision / memory / parallel / perf mode, resolved once from the
 * config and the model dimensions by qt_plan_resolve (src/plan/plan.c), the only reader of those keys and the
 * only place their cross-rules are checked. Engines, stores and the model receive the plan, never the config.
 *
 * A step is grad_accum micro-steps (forward + backward; the last one of a data-parallel step may hand its
 * gradients over bucket by bucket while the backward runs), then the optimizer step: gradients summed over the
 * ranks (data parallel), norm and clip, AdamW per group of buckets, the bf16 weights of the other ranks' pieces
 * gathered (sharded) and the fp8 weight quants rebuilt (persistent quants). */
#ifndef QT_PLAN_H
#define QT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "qt_dtype.h"
#include "qt_dpo.h"
#include "qt_lora.h"
#include "qt_model.h"
#include "qt_modes.h"

struct qt_config;

/* Offloaded optimizer state elements per slot: 48 MiB with fp32 moments, about 1 ms each way over PCIe 5. */
#define QT_GPU_OPTIM_CHUNK ((size_t)1 << 22)

typedef enum {
    QT_DP_ONE,        /* one GPU, no other rank */
    QT_DP_REPLICATED, /* data-parallel rank with all of the optimizer state: gradients all-reduced */
    QT_DP_SHARDED,    /* ZeRO-1/2/3 rank: gradients reduce-scattered, AdamW of its pieces, weights all-gathered
                       * (ZeRO-3: bucket by bucket into weight slots as the model reads them) */
} qt_dp_mode;

typedef struct {           /* the micro-batch and what messages name */
    int B, T, grad_accum;  /* data.micro_batch, data.seq_len, data.grad_accum */
    const char *path;      /* the config file (borrowed), for messages */
} qt_plan_batch;

typedef struct {           /* precision.* */
    int fp8;               /* fp8 block matmuls (matmul_dtype e4m3) */
    int fp8_bwd;           /* fp8 with an fp8 backward (grad_dtype e4m3 or e5m2) */
    qt_dtype grad_dt;      /* precision.grad_dtype: the fp8 backward's gradient codes */
    qt_dtype m_dt, v_dt;   /* AdamW moments: bf16 or fp32 */
    qt_dtype master_dt;    /* fp32: a master array; bf16: AdamW updates the bf16 weights (SR) */
    qt_dtype acc_dt;       /* the dtype every weight-gradient writer accumulates in (fp32 or bf16) */
    int persistent_quants; /* fp8 weight quants rebuilt once per optimizer step, not per micro-step */
    int fp8_cache;         /* memory.fp8_weight_cache: qt_fp8_wcache */
    int stochastic_rounding;
} qt_plan_precision;

typedef struct {           /* the bf16 weights */
    int host;              /* in pinned host memory (memory.offload: [weights]): one GPU the whole array, ZeRO-3
                            * the rank's pieces; AdamW streams them with the offloaded state, or works through the
                            * mapping */
    int host_one;          /* host, one GPU: each bucket copied up into a weight slot as the model reads it */
    int host_shard;        /* host, ZeRO-3: every weight slot all-gathered from the ranks' host pieces */
    int slots;             /* the model reads them from weight slots: ZeRO-3 (gathered) or host_one (copied up) */
    int e4m3;              /* the layer buckets' block matrices reach the slots as e4m3 codes: ZeRO-3 gathers
                            * (parallel.gather_dtype e4m3, or [weights, quants]) or host_one with quants */
    int ahead;             /* the next forward waits for each bucket's weights (updated or gathered on the side
                            * stream): sharded with overlap, or optimizer.ahead */
} qt_plan_weights;

typedef struct {           /* the weight gradients */
    int sharded;           /* ZeRO-2/3: the rank keeps its fp32 shard, each bucket reduce-scattered into it */
    int host;              /* in pinned host memory (memory.offload: [gradients]): one GPU the whole array, ZeRO-2/3
                            * the rank's summed shard */
    int host_one;          /* host, one GPU: the backward writes device slots, loaded and stored per bucket */
    int host_shard;        /* host, ZeRO-2/3: each bucket's reduce-scattered piece added into it there */
    int reduce_bf16;       /* they cross between ranks in bf16 (a comm buffer of the largest bucket) */
    qt_dtype reduce_dt;    /* parallel.reduce_dtype, as given */
    int embed_apart;       /* ZeRO-2/3, untied, lookups gathered: the embeddings' buckets get no gradient slot */
} qt_plan_grads;

typedef struct {           /* AdamW and its state */
    int host;              /* the state in pinned host memory, streamed through device slots */
    int mask;              /* which of it: QT_OFF_MASTER | QT_OFF_M | QT_OFF_V bits (0 with host 0) */
    int zero_copy;         /* host: AdamW works on the host state in place (no slots) */
    int ahead;             /* one GPU with host: AdamW bucket by bucket on the side stream, ahead of the next
                            * forward (one AdamW group per bucket) */
    size_t chunk;          /* host: state elements per streamed chunk */
    float beta1, beta2, eps, weight_decay, grad_clip;
    int decay_embeddings;  /* weight decay on the embedding / LM head too */
    uint64_t seed;         /* the stochastic rounding's */
} qt_plan_optimizer;

/* The activations' placement decided once from memory.recompute (qt_act_redo_of): the tensor groups the backward
 * rebuilds (the implied parts included), each with one buffer for all layers (qt_act_store.h, gpu_model.c's
 * block_run). */
typedef struct {
    int norm, qkv, att, block, ffn, swiglu;
    int any;               /* one of them: the backward rebuilds before each layer */
} qt_act_redo;

typedef struct {           /* the activations (qt_act_store.h) */
    int recompute;         /* qt_recompute_part bits as given (qt_act_recompute_resolve adds the implied ones) */
    qt_act_redo redo;      /* what the store and the model read: the parts rebuilt, the implied ones included */
    int offload_residual;  /* input residuals in pinned host memory, two device slots */
    int host_wc;           /* that host memory write-combined (memory.host_alloc) */
    int fp8_bwd;           /* an fp8 backward with weight gradients (full fine-tuning): ln1, ln2, h share one
                            * buffer over the layers */
    int lm_chunks;         /* the LM head over this many chunks of tokens (1..N) */
    int attn_chunks;       /* the attention backward over this many slices of the micro-batch (1..B) */
} qt_plan_acts;

typedef struct {           /* what a data-parallel rank holds in pieces (its shard) rather than whole: the ZeRO level */
    int state;             /* the optimizer state and an fp32 master (ZeRO >= 1) */
    int grads;             /* the summed gradients (ZeRO >= 2) */
    int weights;           /* the bf16 weights (ZeRO-3) */
} qt_plan_split;

typedef struct {           /* parallel.* */
    qt_dp_mode dp;
    int n_ranks, rank;     /* n_ranks 1 with one GPU; rank: set by each rank's engine */
    int zero;              /* ZeRO level of a sharded rank (1, 2 or 3), else 0 */
    qt_plan_split split;   /* the items that level splits */
    int overlap;           /* the last micro-step's bucket sums overlap its backward */
    int lookups;           /* sharded: the last micro-step leaves its embedding lookups out (fewer bytes than the
                            * table's gradient), added to the sums afterwards */
    int buckets;           /* the parameters cut into per-layer buckets (qt_shard_init): sharded, overlapped or
                            * anything offloaded */
    int comm;              /* qt_comm_kind */
    int nodes, node;       /* machines of the run (parallel.nodes; 1: this one) and this one's index (set by the
                            * data-parallel engine); n_ranks counts this node's GPUs */
    int world_pieces;      /* nodes > 1 with parallel.zero >= 1: ZeRO over the world, the shard cut for nodes x
                            * n_ranks ranks as one process with every GPU cuts it (qt_shard_init_nodes) */
} qt_plan_parallel;

typedef struct {           /* perf.* and the streams */
    int graphs;            /* micro-steps replayed from CUDA graphs (cut into segments at the sync points) */
    int autotune;          /* perf.matmul_autotune */
    int side_stream;       /* a second stream for sums, gathers, weight copies or AdamW */
    int deterministic;     /* perf.deterministic: cuDNN's deterministic attention backward */
} qt_plan_perf;

typedef struct {           /* memory.* limits and the host allocations */
    int host_wc;           /* the offloaded items' pinned memory write-combined (memory.host_alloc) */
    float gpu_limit_gib;   /* 0: no cap */
    float host_limit_gib;  /* 0: MemAvailable */
    int ckpt_offloaded;    /* checkpoint.offloaded: qt_ckpt_offload */
} qt_plan_memory;

typedef struct {
    qt_plan_batch run;
    qt_plan_precision precision;
    qt_plan_weights weights;
    qt_plan_grads grads;
    qt_plan_optimizer optimizer;
    qt_plan_acts acts;
    qt_plan_parallel parallel;
    qt_plan_perf perf;
    qt_plan_memory memory;
    qt_lora_cfg lora;          /* lora.*: rank 0 trains the whole model; else adapters over a frozen base */
    int dpo;                   /* objective: dpo: a micro-batch is pairs of rows, the loss sigmoid DPO (qt_dpo.h) */
    qt_dpo_cfg dpo_cfg;        /* its beta and label smoothing */
} qt_plan;

/* The plan of cfg for layout L on n_ranks GPU ranks (0: one GPU, no data parallelism). Checks every cross-mode
 * rule: 0, or -1 with err ("<path>: <key>: expected ..."). n_ranks < 0 (the CPU engine, or a store on a shard
 * cut by hand): no rule is checked and the parallel part and the placements (weights, grads, the optimizer
 * state's place) stay zero: everything on one device. The plan borrows cfg->path. */
int qt_plan_resolve(const struct qt_config *cfg, const qt_layout *L, int n_ranks, qt_plan *p, char *err, size_t errlen);
/* The same plan without the rules: what cfg would run as, for the memory planner (`qtrain --plan` prints the
 * rows of a config the engine then refuses, with the rule's message). */
void qt_plan_make(const struct qt_config *cfg, const qt_layout *L, int n_ranks, qt_plan *p);
/* The unit alignment (qt_layout_init_units) p's shards cut at: 64 x the world's ranks (every node's GPUs) when the
 * optimizer state is sharded or the buckets are cut for the nodes' pieces, else QT_LAYOUT_ALIGN (one GPU, the CPU,
 * replicated ranks: the compact layout). */
size_t qt_plan_unit_align(const qt_plan *p);
/* The same for the plan of cfg on n_ranks GPU ranks (qt_plan_make's n_ranks), before any layout exists. */
size_t qt_plan_unit_align_for(const struct qt_config *cfg, int n_ranks);

/* The cross-mode rules of the memory / parallel / precision keys that need no rank count: NULL when cfg
 * passes, else why (the text after "<key>: ") with *key the key to blame. The config loader reports it at
 * the key's place in the file; qt_plan_resolve again, for a config changed after loading (memory.plan: auto). */
const char *qt_plan_refusal(const struct qt_config *cfg, const char **key);
/* memory.fp8_weight_cache's default where the weights live in slots (parallel.zero: 3, memory.offload: [weights])
 * under fp8 matmuls: none, unless the config gives the key. The config loader applies it before qt_plan_refusal. */
void qt_plan_fp8_cache_default(struct qt_config *cfg);
/* What the GPU engines cannot run in cfg, as a message naming the key ("lora: not yet on the GPU ..."), or NULL. */
const char *qt_engine_gpu_refusal(const struct qt_config *cfg);
/* The checkpoint items an offloaded run's writer reads where they live (pinned host memory) instead of a copy:
 * one GPU or ZeRO ranks (a replicated rank's are copied: the data-parallel engine hands rank 0's on), the optimizer
 * arrays memory.offload names and the bf16 weights in host memory; all 0 without offloaded optimizer state.
 * checkpoint.offloaded: copy (or the trainer's choice) copies them still. */
typedef struct {
    int master, weights, m, v;
} qt_plan_ckpt_live;
qt_plan_ckpt_live qt_plan_ckpt_in_place(const qt_plan *p);
/* What a micro-step split around the host's rows (objective: dpo with full fine-tuning) cannot run with in p: the
 * weight slots, sharded or offloaded gradients, as a phrase naming the keys; NULL: none. */
const char *qt_plan_rows_refusal(const qt_plan *p);

/* The GPU of each data-parallel rank (parallel.devices, else parallel.gpus, else every visible GPU up
 * to QT_COMM_MAX_RANKS) into devs[QT_COMM_MAX_RANKS]: the rank count, or -1 with err naming the key.
 * ngpu <= 0 (a plan made without a GPU): device ids are not checked against what is visible. */
int qt_plan_rank_devices(const struct qt_config *cfg, int ngpu, int *devs, char *err, size_t errlen);
/* MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read. */
size_t qt_host_mem_available(void);
/* The host limit: memory.host_limit_gib when given, else MemAvailable; *what names it for messages. */
size_t qt_plan_host_limit(const struct qt_config *cfg, char *what, size_t cap);
/* 1 when n_ranks ranks' embedding lookups of `tokens` each (tokens and fp32 residual gradients, n N (C+1)
 * elements) are fewer than the embedding table's gradient (V C): a sharded step then sums those instead. */
int qt_plan_lookups_pay(const qt_layout *L, long tokens, int n_ranks);

/* parallel.zero: 3's limits and memory.offload: [weights]'s (qt_plan_refusal): 0, or -1 with err
 * ("<path>: <key>: expected ..., got ..."). */
int qt_config_zero3_check(const struct qt_config *c, char *err, size_t errlen);

/* The parts memory.recompute implies: block => att, ffn, norm; att => qkv; ffn => swiglu. */
int qt_act_recompute_resolve(int parts);
/* "swiglu, norm" (or "none"): the parts in bits, in the key's order. */
const char *qt_act_recompute_names(int parts, char *buf, size_t cap);

qt_act_redo qt_act_redo_of(int parts);
/* Prints what the activations' plan keeps elsewhere: the recomputed parts, the offloaded residuals. */
void qt_plan_acts_print(const qt_plan_acts *a);

#endif
