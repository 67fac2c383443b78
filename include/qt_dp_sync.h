/* qt_dp_sync.h — the synchronisation of one GPU rank's model stream with its side stream and the other
 * ranks: the gradient sums of the buckets (qt_partition.h), the embedding lookups of a sharded step,
 * the weight gathers after AdamW and the waits of the next forward for them, ZeRO-3's slot gathers, and
 * the CUDA graphs of a micro-step, cut into segments at those points. It gives the model its hooks for
 * one micro-step (qt_param_hooks); with one plain GPU they are empty. Every mode comes from the plan
 * (qt_plan.h). What runs on which stream under each plan: docs/memory.md ("The data-parallel sync"). */
#ifndef QT_DP_SYNC_H
#define QT_DP_SYNC_H

#include "qt_cuda_types.h"

#include "qt_comm.h"
#include "qt_gpu_model.h"
#include "qt_plan.h"
#include "qt_test_hooks.h"

typedef struct qt_dp_sync qt_dp_sync;

/* For model g (borrowed) of a rank on comm (NULL with one GPU) as plan p says; makes the side stream and
 * events on the current device. nodes: the communicators with the other nodes (borrowed; NULL on one
 * machine): each bucket's piece, summed in the node, is then summed over the nodes (qt_dp_nodes.h). th:
 * the test hooks in force (dp_ag_delay_ms, dp_sum_delay_ms, the ZeRO-3 ones; all zero in a real run). */
struct qt_internode;
qt_dp_sync *qt_dp_sync_create(qt_gpu_model *g, const qt_plan *p, qt_comm *comm, struct qt_internode *nodes,
                              const qt_test_hooks *th);
void qt_dp_sync_free(qt_dp_sync *d);

/* Before the model's stream overwrites a micro-step's inputs (tokens) or activations: with ZeRO-2
 * overlapped, the last micro-step's sums still read its tokens and residual gradient (the embedding
 * lookups) and its gradient slots, so the stream waits for them. */
void qt_dp_sync_inputs(qt_dp_sync *d);
/* One micro-step's forward + backward at loss scale `scale`; last: the last of a step. eager: not
 * from a CUDA graph (the first micro-step autotunes and builds plans; profiling). */
void qt_dp_sync_micro_step(qt_dp_sync *d, float scale, int last, int eager);
/* objective: dpo with full fine-tuning: a micro-step in two halves, eagerly (the host computes the rows' loss weights
 * between them, qt_dpo.h): the forward (losses only, its activations kept; the weight waits of a forward outside a
 * micro-step), then the backward with row_scale[B] on the host and the micro-step's hooks (last: the last of a
 * step). What the plan must not have for it: qt_plan_rows_refusal names it (NULL: none). */
void qt_dp_sync_forward_rows(qt_dp_sync *d);
void qt_dp_sync_backward_rows(qt_dp_sync *d, const float *row_scale, int last);
/* 1 when no bucket of this step is still owed to the sums (a micro-step or get_grads may come). */
int qt_dp_sync_idle(const qt_dp_sync *d);
/* The hooks of a forward outside a micro-step (eval, logits): waits for pending weight gathers. */
const qt_param_hooks *qt_dp_sync_wait_hooks(qt_dp_sync *d);
/* The model's stream waits for every pending weight update or gather (before anything but a forward
 * touches the weights, the master copy or the gradients). */
void qt_dp_sync_join(qt_dp_sync *d);
/* ZeRO-3: the rank's pieces of the bf16 weights changed outside AdamW (a load): the weight slots
 * forget what they hold and the embedding / LM-head slots are gathered again before the next forward
 * (no collective here: a rank whose load fails must not leave the others waiting): 1. Nothing otherwise: 0. */
int qt_dp_sync_reload(qt_dp_sync *d);

/* Optimizer step, in order: reduce (the gradients summed over the ranks where they were not during the
 * backward; then norm and clip scale into the store's scalars), then per AdamW group its stream
 * (opt_stream: the model's, or with plan.opt_ahead the side stream, which then follows what the model's
 * stream has enqueued so far), then release (gathers of buckets [k0, k1) and their fp8 quants). On the model's stream
 * but for what the plan puts on the side stream. */
void qt_dp_sync_reduce(qt_dp_sync *d);
cudaStream_t qt_dp_sync_opt_stream(qt_dp_sync *d);
void qt_dp_sync_release(qt_dp_sync *d, int k0, int k1);
/* Across nodes with ZeRO over the world (plan.parallel.world_pieces): this rank's world pieces (the store's
 * state order, es bytes each, host or device) gathered over the nodes into out[shard.len x nodes] (host: the
 * rank's local pieces, back to back; NULL: take part only), through the store's staging buffer on the model's
 * stream (qt_dp_nodes_widen; synchronous). The same GPU of every node calls it at the same point. */
void qt_dp_sync_node_widen(qt_dp_sync *d, const void *pieces, size_t es, void *out);

#endif
