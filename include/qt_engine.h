/* qt_engine.h — what the training loop needs from a compute path (CPU fp32 reference, one GPU, or N
 * GPU threads), so the loop in src/train/train.c is the same for all of them.
 *
 * A step is: micro_step x grad_accum (gradients accumulate), then opt_step (global norm, clipping,
 * AdamW, gradients zeroed). opt_step is the only call that waits for the device: it returns the mean
 * loss of the micro-steps and the gradient norm. */
#ifndef QT_ENGINE_H
#define QT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_docs.h"
#include "qt_dpo.h"
#include "qt_model.h"
#include "qt_plan.h"
#include "qt_weight_src.h"

typedef struct qt_engine qt_engine;

/* The gradient weight of one target (micro_step's grad_scale) for a step of grad_accum micro-steps
 * on each of `ranks` data-parallel ranks holding `valid` targets >= 0 in all: 1/valid, so the step's
 * gradient is that of the mean loss over all its targets, whatever the split into micro-steps and
 * ranks (with loss masks the micro-batches hold different target counts, and averaging each one's
 * mean would weight a target by 1/count of its own micro-batch). It is computed as
 * (1/grad_accum)/ranks / (valid/(grad_accum*ranks)) so that when every micro-batch holds the same
 * count n (no mask) it is bit for bit the (1/grad_accum)/ranks/n that the engines computed before
 * masks existed: valid/(grad_accum*ranks) is then exactly n. Otherwise it is 1/valid within 4 float
 * roundings. 0 when valid is 0 (nothing to learn from). */
static inline float qt_loss_scale(int grad_accum, int ranks, long valid) {
    if (valid <= 0) return 0.0f;
    float s = 1.0f / grad_accum / ranks;
    return s / (float)((double)valid / ((double)grad_accum * ranks));
}

typedef struct {
    const char *name;
    /* Forward + backward of one micro-batch [B*T] (ranks x [B*T] for data parallel);
     * grads += grad_scale * d(sum of the losses of the targets >= 0)/dw: grad_scale is the weight of
     * one target, qt_loss_scale() of the whole step's target count. */
    void (*micro_step)(qt_engine *e, const int32_t *inputs, const int32_t *targets, float grad_scale);
    /* Global norm, clip to cfg grad_clip, AdamW at lr with 1-based step t, zero grads.
     * *loss = mean loss over the targets >= 0 of the micro-steps since the last opt_step (all ranks);
     * *gnorm = pre-clip norm. */
    void (*opt_step)(qt_engine *e, float lr, long t, float *loss, float *gnorm);
    /* Mean loss of a micro-batch, no gradients: one per rank ([ranks x B*T]), summed over the ranks
     * in rank order; a micro-batch whose targets are all < 0 adds 0. */
    float (*eval_loss)(qt_engine *e, const int32_t *inputs, const int32_t *targets);
    /* Host fp32 copies of the weights [L->numel] / the accumulated gradients (before opt_step; data
     * parallel with parallel.overlap_comm, not after a step's last micro-step, which sums them). Across
     * nodes with ZeRO every node calls get_weights at the same point (its pieces cross to the others);
     * w NULL on a node that takes part only. */
    void (*get_weights)(qt_engine *e, float *w);
    void (*get_grads)(qt_engine *e, float *g);
    /* The accumulated fp32 gradients [L->numel] in device memory, once the device has written them
     * (the engine's stream synchronized), and their CUDA device; valid until the next micro_step or
     * opt_step. NULL op where there is no such array (the CPU engine, data parallel: a rank's are partial). */
    float *(*grads_device)(qt_engine *e, int *device);
    /* Logits [B*T, V] of a forward without loss (may be NULL when the engine cannot); a GPU engine given
     * logits NULL runs the forward only (a ZeRO-3 rank taking part in rank 0's weight gathers). */
    void (*forward_logits)(qt_engine *e, const int32_t *inputs, float *logits);
    /* The full optimizer state as checkpoint blobs (weights, master copy, m, v in their own dtypes).
     * The blobs point into engine-owned host buffers valid until the next call (one may view another's:
     * a bf16 master's fp32 "weights" is its bf16 blob widened as written, QT_CKPT_WIDEN_BF16). Returns
     * the count. */
    int (*state_items)(qt_engine *e, qt_ckpt_item *items, int cap);
    /* The host bytes of the snapshot buffers state_items has made so far (a GPU engine's pinned copies,
     * the memory plan's "checkpoint snapshot" rows). NULL: the engine makes none (its blobs alias its
     * own arrays). */
    size_t (*snapshot_bytes)(const qt_engine *e);
    /* Which of state_items' blobs alias the engine's own host state instead of a copy (an offloaded
     * optimizer state: master, m, v in pinned host memory), which the next opt_step changes chunk by
     * chunk from element 0 upwards: fills live (indices, elements, the optimizer's chunk as the piece)
     * and returns live->n (0: none). May be NULL (none). */
    int (*state_live)(qt_engine *e, qt_ckpt_live *live);
    /* With state_live: before an opt_step changes live state below element hi it calls wait(ctx, hi),
     * which returns once it may (the checkpoint writer's progress mark). wait NULL: no wait. */
    void (*set_state_guard)(qt_engine *e, void (*wait)(void *ctx, size_t hi), void *ctx);
    /* With state_live, called once before training (qt_trainer_ckpt_init): copy 1 makes state_items copy
     * those blobs into snapshot buffers of its own too (+ their bytes of pinned host memory; state_live
     * then returns 0 and no wait is needed); 0 (the default) leaves them written in place. May be NULL. */
    void (*set_state_copy)(qt_engine *e, int copy);
    /* 1 when state_items' blobs are host copies that only the next state_items call overwrites (the
     * trainer then writes them in the background as they are); 0 when they alias live state (the
     * trainer copies them first). */
    int state_is_snapshot;
    /* After opt_step: the flat index of the first weight that is NaN or Inf by the finiteness checks
     * complete so far, -1 when none; *step: the optimizer step whose update made it. settle 0: checks
     * already complete (a GPU engine whose AdamW runs ahead of the next forward learns step t's result
     * at the end of step t + 1, without an extra sync); 1: the last opt_step's too (may wait for the
     * device: before a checkpoint). May be NULL (the checkpoint writer still refuses non-finite state). */
    long (*nonfinite_weight)(qt_engine *e, int settle, long *step);
    /* Restores what state_items saved; -1 with err naming the blob when one is missing or its size or
     * dtype differs. */
    int (*load_state)(qt_engine *e, const qt_ckpt *ck, char *err, size_t errlen);
    /* The kernel choices made by timing (the autotuned matmul algorithms) as bytes: written to buf when
     * cap is enough, returns the bytes needed; and loaded back from such bytes (0, or -1 with err: made
     * on another GPU model or library version). A checkpoint and the tuning cache keep them, so a
     * resumed or repeated run multiplies with the same algorithms. NULL: the engine times nothing. */
    size_t (*tuning_save)(qt_engine *e, void *buf, size_t cap);
    int (*tuning_load)(qt_engine *e, const void *buf, size_t n, char *err, size_t errlen);
    /* Prints the memory plan (the GPU allocator table); may be NULL. */
    void (*print_memory)(qt_engine *e);
    /* Per-op timing of the following steps (GPU engines; NULL elsewhere), printed as ms per step. */
    void (*profile)(qt_engine *e, int on);
    void (*profile_print)(qt_engine *e, int steps);
    void (*free)(qt_engine *e);
    /* The documents of the following micro_step, eval_loss and forward_logits calls (qt_docs.h: its
     * windows are the ranks x B rows of their inputs; copied): attention per document and RoPE positions
     * restarting at each, as d asks. NULL d: causal over each row, positions t (the default). NULL op:
     * the engine has only the default (qt_engine_set_docs refuses a d that asks for more). A failed call
     * (malformed starts, a graph the GPU library refuses) leaves the engine usable, without documents. */
    void (*set_docs)(qt_engine *e, const qt_docs *d);
    /* Writes the engine's own export to dir instead of the HF model (LoRA: PEFT's adapter files); NULL:
     * the HF export of get_weights is the export. */
    int (*export_adapter)(qt_engine *e, const char *dir, char *err, size_t errlen);
    /* objective: dpo (plan->dpo): the pairs' sums (qt_dpo.h) of the last opt_step's micro-steps (eval 0), or of the
     * eval_loss calls since the last call with eval 1 (then cleared). NULL: the engine has no DPO objective. */
    void (*dpo_stats)(qt_engine *e, int eval, qt_dpo_stats *s);
    /* objective: dpo with full fine-tuning (the stored reference, qt_train_dpo_ref.h): logp[ranks x B] = the summed
     * log-probs (qt_dpo_row_logps) of each row of a forward of the current weights over the ranks x [B*T] tokens, no
     * gradients, nothing logged: the reference's first pass. NULL: the engine cannot (LoRA's reference is its base). */
    void (*row_logps)(qt_engine *e, const int32_t *inputs, const int32_t *targets, double *logp);
    /* objective: dpo with full fine-tuning: the reference log-probs of the ranks x B rows of the following micro_step
     * and eval_loss calls (copied), until the next call; NULL: none (those calls then fail, naming it). */
    void (*set_dpo_ref)(qt_engine *e, const double *ref);
    /* parallel.nodes > 1: how many nodes pass mine != 0 (every node calls it at the same point: an agreement
     * and a barrier). NULL: one machine. */
    int (*nodes_count)(qt_engine *e, int mine);
} qt_engine_ops;

#define QT_ENGINE_MAX_ITEMS 16 /* state_items' blobs at most */

struct qt_engine {
    const qt_engine_ops *ops;
    const qt_layout *L;  /* borrowed */
    const qt_plan *plan;  /* the engine's own (qt_plan.h): the micro-batch, AdamW's settings, every mode */
    int ranks;            /* micro-batches per micro_step: inputs/targets hold ranks x [B*T], one per GPU (across
                           * nodes, every node's GPUs: each node's engine takes its own ones) */
    struct qt_engine_compact *compact; /* qt_engine_state_items' compact views of a padded layout's arrays (owned;
                                        * NULL: none made) */
};

/* Resolves the model (model.hf_config, else init.from's config.json when no inline model keys were
 * given, else the inline keys), validates it, builds L and the initial weights: init.from's
 * safetensors or N(0, init.std) from init.seed. *w is malloc'ed (caller frees); L is freed with
 * qt_layout_free. Returns 0 or -1 with err. */
int qt_model_setup(const qt_config *cfg, qt_layout *L, float **w, char *err, size_t errlen);
/* The same without the weights: L and the source they are read from (src->L = L; init.from's files
 * are opened and their headers checked now, so a missing tensor fails before anything is allocated). */
int qt_model_layout(const qt_config *cfg, qt_layout *L, qt_weight_src *src, char *err, size_t errlen);
/* The unit alignment of the layout cfg's engine runs on (qt_engine_create's rank count, qt_plan_unit_align): 64 x the
 * ranks of every node when they shard, else QT_LAYOUT_ALIGN. qt_model_layout builds the layout with it. */
size_t qt_engine_unit_align(const qt_config *cfg);
/* The engine device.auto|cpu|cuda picks (prints a one-line notice when auto falls back to the CPU),
 * its weights read from src (borrowed until it returns; qt_weight_src_array for a host array), after the
 * run's memory plan (qt_planner.h) was checked against the host's and GPU's limits: refused with the
 * plan's message before anything is allocated when it does not fit. NULL with err when cuda is asked
 * for and cannot be served. */
qt_engine *qt_engine_create(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, char *err,
                                size_t errlen);
/* The same for one node of a multi-node run (parallel.nodes > 1): nodes is where it stands and node 0's
 * NCCL ids (qt_dp_nodes.h; borrowed until it returns). NULL nodes: qt_engine_create. */
struct qt_nodes;
qt_engine *qt_engine_create_nodes(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src,
                                  const struct qt_nodes *nodes, char *err, size_t errlen);
/* ops->nodes_count in a catch point: *count = the nodes passing mine != 0 (one machine: mine != 0). 0 or -1. */
int qt_engine_nodes_count(qt_engine *e, int mine, int *count, char *err, size_t errlen);

/* CPU fp32 reference engine, the weights read from src into its own array; NULL with err when they
 * cannot be read. */
qt_engine *qt_engine_cpu_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, char *err,
                                    size_t errlen);
/* CPU fp32 engine training the LoRA adapters of plan->lora over a frozen base read from src (qt_lora.h);
 * NULL with err when the weights cannot be read or the lora settings are invalid. */
qt_engine *qt_engine_cpu_lora_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, char *err,
                                     size_t errlen);
/* One GPU's engine training the LoRA adapters of plan->lora over a frozen bf16 base read from src, on CUDA device
 * `device` (qt_gpu_base.h, qt_gpu_lora.h); NULL with err when CUDA, the memory plan or the weights cannot be
 * served. The plan is one GPU's (qt_engine_gpu_refusal lists what LoRA on the GPU does not run). */
qt_engine *qt_engine_gpu_lora_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                     char *err, size_t errlen);
/* LoRA on n GPU ranks (devices[0..n), a device may repeat), each such an engine with plan (one GPU's) and the
 * adapters replicated: their gradients summed over the ranks in rank order before each rank's same AdamW, the
 * dropout masks those of the step's global micro-batch index. NULL with err. */
#define QT_LORA_DP_MAX 16
qt_engine *qt_engine_gpu_lora_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                        const int *devices, char *err, size_t errlen);
/* A data-parallel rank's place: its comm (borrowed), its rank and its slice of the buckets (ZeRO-1 when
 * shard->n_ranks > 1; qt_partition.h). */
struct qt_comm;
struct qt_shard_s;
typedef struct {
    struct qt_comm *comm;
    int rank;
    const struct qt_shard_s *shard;
    struct qt_internode *nodes; /* the communicators with the other nodes (borrowed); NULL on one machine */
} qt_gpu_rank;
/* One GPU's engine on CUDA device `device` (NULL with err when CUDA or the config cannot be served).
 * rank NULL: one GPU; else a data-parallel rank whose opt_step first sums the gradients over the comm
 * (every rank calls opt_step, each from its own thread). plan: one GPU's (qt_plan_resolve with 0 ranks), or the
 * data-parallel engine's (the rank index comes from rank); copied. */
/* The weights are read from src a chunk at a time (qt_param_store_init). */
qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                    const qt_gpu_rank *rank, char *err, size_t errlen);
/* Makes `device` the thread's CUDA device and, for an fp8 plan, checks that it has fp8 tensor cores and the
 * model's shapes suit the fp8 matmuls (qt_fp8_check). 0, or -1 with err. */
int qt_engine_gpu_select(const qt_layout *L, const qt_plan *plan, int device, char *err, size_t errlen);
/* Across nodes with ZeRO over the world (plan.parallel.world_pieces; a rank engine's thread, every node's same
 * GPU at the same point): node_widen gathers the rank's world pieces of a checkpoint item (es bytes each, its
 * shard's state order) into out, the rank's local pieces for every node, back to back (NULL: take part only;
 * qt_dp_sync_node_widen); weights_nodes writes the master values of the rank's local pieces into w[numel]
 * (flat; NULL: take part only). */
void qt_engine_gpu_node_widen(qt_engine *e, const void *pieces, size_t es, void *out);
void qt_engine_gpu_weights_nodes(qt_engine *e, float *w);
/* The last opt_step's summed token losses and target count (the ranks' mean is sum/sum). */
void qt_engine_gpu_last_loss(const qt_engine *e, double *sum, long *valid);
/* ops->tuning_save / tuning_load of the GPU engines (the process-wide matmul picks, qt_matmul.h). */
size_t qt_engine_gpu_tuning_save(qt_engine *e, void *buf, size_t cap);
int qt_engine_gpu_tuning_load(qt_engine *e, const void *buf, size_t n, char *err, size_t errlen);

/* Data-parallel engine: one thread per rank on devices[0..n) (a device may repeat), each with the
 * whole model; gradients are summed in a fixed rank order over the plan's comm, so the ranks' weights stay
 * bitwise identical; with plan->parallel.zero >= 1 each rank keeps the optimizer state of 1/n of the
 * parameters, with 2 also the gradients, with 3 the bf16 weights. plan: qt_plan_resolve with n ranks (copied).
 * NULL with err on failure. */
/* Every rank reads its weights from src (borrowed until it returns). */
qt_engine *qt_engine_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                   const int *devices, char *err, size_t errlen);
/* The same for one node of plan->parallel.nodes (> 1: nodes says which, and holds node 0's NCCL ids): its
 * n GPUs' ranks also sum with the other nodes' (qt_dp_nodes.h); ranks counts every node's GPUs. */
qt_engine *qt_engine_dp_nodes_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                     const int *devices, const struct qt_nodes *nodes, char *err, size_t errlen);

/* The engine calls as the training loop and bindings make them (src/engine/engine.c): each runs the op in a
 * catch point and returns 0, or -1 with the failure's message in err (a failed CUDA call, a rank that
 * failed: "[rank 1] file:line: call: message"); after a failed call the engine may only be freed.
 * qt_engine_state_items returns the item count or -1. qt_engine_free takes NULL. */
int qt_engine_micro_step(qt_engine *e, const int32_t *in, const int32_t *tgt, float grad_scale, char *err,
                         size_t errlen);
int qt_engine_opt_step(qt_engine *e, float lr, long t, float *loss, float *gnorm, char *err, size_t errlen);
int qt_engine_eval_loss(qt_engine *e, const int32_t *in, const int32_t *tgt, float *loss, char *err,
                        size_t errlen);
int qt_engine_get_weights(qt_engine *e, float *w, char *err, size_t errlen);
int qt_engine_get_grads(qt_engine *e, float *g, char *err, size_t errlen);
/* ops->grads_device; -1 with err when the engine has none. */
int qt_engine_grads_device(qt_engine *e, float **g, int *device, char *err, size_t errlen);
int qt_engine_forward_logits(qt_engine *e, const int32_t *in, float *logits, char *err, size_t errlen);
/* A padded layout's flat arrays (weights, m, v: L->numel elements) come back as views of their compact layout
 * (qt_model.h), which the checkpoint files hold at every unit alignment; valid until the next call. */
int qt_engine_state_items(qt_engine *e, qt_ckpt_item *items, int cap, char *err, size_t errlen);
/* ops->nonfinite_weight: *index the first NaN/Inf weight found (-1: none, or the engine has no check),
 * *step the step that made it. */
int qt_engine_nonfinite_weight(qt_engine *e, int settle, long *index, long *step, char *err, size_t errlen);
/* Puts a padded layout's compact arrays in ck into that layout first (qt_ckpt_pad_units). */
int qt_engine_load_state(qt_engine *e, qt_ckpt *ck, char *err, size_t errlen);
/* The unit maps of e's layout for qt_ckpt_units_view and qt_ckpt_pad_units. */
qt_ckpt_units qt_engine_units(const qt_engine *e);
/* ops->export_adapter; -1 with err when the engine has none. */
int qt_engine_export_adapter(qt_engine *e, const char *dir, char *err, size_t errlen);
void qt_engine_free(qt_engine *e);
/* ops->set_docs; -1 with err when d asks for attention or positions per document and the engine has no
 * set_docs, or its starts are malformed. */
int qt_engine_set_docs(qt_engine *e, const qt_docs *d, char *err, size_t errlen);

/* ops->row_logps / ops->set_dpo_ref; -1 with err when the engine has none. */
int qt_engine_row_logps(qt_engine *e, const int32_t *in, const int32_t *tgt, double *logp, char *err, size_t errlen);
int qt_engine_set_dpo_ref(qt_engine *e, const double *ref, char *err, size_t errlen);

/* Per-op timing where the engine supports it (no-op elsewhere). */
void qt_engine_profile(qt_engine *e, int on);
void qt_engine_profile_print(qt_engine *e, int steps);

#endif
