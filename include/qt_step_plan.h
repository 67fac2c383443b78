/* qt_step_plan.h — how one GPU engine runs a training step, decided once when the engine is created
 * and stored as a value: every mode question in engine_gpu.c and dp_sync.c reads it.
 *
 * A step is grad_accum micro-steps (forward + backward; the last one of a data-parallel step may hand
 * its gradients over bucket by bucket while the backward runs), then the optimizer step: gradients
 * summed over the ranks (data parallel), norm and clip, AdamW per group of buckets, the bf16 weights of
 * the other ranks' pieces gathered (sharded) and the fp8 weight quants rebuilt (persistent quants). */
#ifndef QT_STEP_PLAN_H
#define QT_STEP_PLAN_H

#include "qt_config.h"
#include "qt_model.h"

typedef enum {
    QT_DP_ONE,        /* one GPU, no other rank */
    QT_DP_REPLICATED, /* data-parallel rank with all of the optimizer state: gradients all-reduced */
    QT_DP_SHARDED,    /* ZeRO-1/2/3 rank: gradients reduce-scattered, AdamW of its pieces, weights all-gathered
                       * (ZeRO-3: bucket by bucket into weight slots as the model reads them) */
} qt_dp_mode;

typedef struct {
    qt_dp_mode dp;
    int n_ranks, rank;
    int zero;          /* ZeRO level of a sharded rank (1, 2 or 3), else 0 */
    int grads_sharded; /* ZeRO-2: the rank keeps its shard of the fp32 gradients; every micro-step
                        * reduce-scatters each bucket into it as the backward releases the bucket */
    int offload_opt;   /* optimizer state in pinned host memory (memory.offload_optimizer), streamed by AdamW */
    int opt_mask;      /* which of it: QT_OFF_MASTER | QT_OFF_M | QT_OFF_V bits (qt_config_opt_offload_mask) */
    int zero_copy;     /* memory.zero_copy with offload_opt: AdamW works on the host state in place (no slots) */
    int host_wc;       /* memory.host_alloc write_combined: the offloaded items' pinned memory */
    int weights_host;  /* memory.offload: [weights], one GPU: the bf16 weights in pinned host memory, each bucket
                        * copied up into a weight slot as the model reads it (qt_weight_slots.h) */
    int wslots;        /* the model reads the weights from weight slots: ZeRO-3 (gathered) or weights_host (copied up) */
    int gather_e4m3;   /* the layer buckets' block matrices reach the weight slots as e4m3 codes: ZeRO-3's gathers
                        * (parallel.gather_dtype e4m3, or memory.offload [weights, quants]: the rank's host pieces'
                        * codes) or one GPU's offloaded weights copied up (memory.offload [weights, quants]); fp8 */
    int grads_host;    /* memory.offload: [gradients], one GPU: the fp32 gradients in pinned host memory; the backward
                        * writes each bucket into a device slot (ZeRO-2's), loaded from host before and stored back
                        * after, on the side stream (qt_param_grad_load / _store) */
    int weights_shard_host; /* memory.offload: [weights] with ZeRO-3: the rank's bf16 pieces in pinned mapped host
                        * memory; each weight slot is all-gathered from every rank's host pieces
                        * (qt_comm_all_gather_host), AdamW updates the pieces as they stream through the
                        * offloaded optimizer's slots (through the mapping without them) */
    int grads_shard_host; /* memory.offload: [gradients] with ZeRO-2/3: the rank's fp32 gradient shard in pinned mapped
                        * host memory; each bucket's reduce-scattered piece is added into it there by the same
                        * kernel as on the GPU (chunks copied up and back), the norm reads it there, AdamW
                        * as it streams with the offloaded state (there without it) */
    int overlap;       /* data parallel: the last micro-step's bucket sums overlap its backward */
    int opt_ahead;     /* one GPU offloaded: AdamW bucket by bucket on the side stream, ahead of the next forward */
    int weights_ahead; /* the next forward waits for each bucket's weights (updated or gathered on the side
                        * stream): sharded with overlap, or opt_ahead */
    int side_stream;   /* a second stream for sums, gathers, weight copies or AdamW: data parallel, opt_ahead or
                        * weights_host */
    int lookups;       /* sharded: the last micro-step leaves its embedding lookups out (fewer bytes than
                        * the table's gradient), added to the sums afterwards */
    int reduce_bf16;   /* the gradients cross between ranks in bf16 */
    int graphs;        /* micro-steps replayed from CUDA graphs (cut into segments at the sync points) */
    int fp8;           /* fp8 block matmuls */
    int persistent_quants; /* fp8 weight quants rebuilt once per optimizer step, not per micro-step */
} qt_step_plan;

/* The plan for a rank `rank` of n_ranks (n_ranks 0: one GPU, no data parallelism), sharded or not. */
void qt_step_plan_make(qt_step_plan *p, const qt_layout *L, const qt_config *cfg, int n_ranks, int rank, int sharded);

#endif
