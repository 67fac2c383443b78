/* qt_param_store.h — the parameters of one GPU rank and everything kept per parameter: the bf16
 * weights, the gradients (fp32 or bf16: grad_dt), the optimizer state (fp32 master weights unless bf16,
 * AdamW m and v), this rank's shard of that state (qt_shard), the slots and pinned host memory of an
 * offloaded item, and the gradient norm / clip scalars.
 *
 * Where each item lives is chosen once, at creation (the plan's weights, grads and optimizer parts:
 * qt_plan.h); the store adds its own rows to the memory plan. Access is per bucket (qt_partition.h) through the acquire/release calls below, which
 * the forward, the backward and the optimizer make as they enqueue work and which forward to the step's
 * hooks (qt_param_hooks). Each placement, ZeRO-2's gradient slots and the offloaded
 * items are drawn and explained in docs/memory.md. */
#ifndef QT_PARAM_STORE_H
#define QT_PARAM_STORE_H

#include "qt_cuda_types.h"
#include <stddef.h>
#include <stdint.h>

#include "qt_dtype.h"
#include "qt_gpu_optim.h"
#include "qt_host_shard.h"
#include "qt_kernels.h"
#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_partition.h"
#include "qt_plan.h"
#include "qt_small_params.h"
#include "qt_weight_slots.h"
#include "qt_weight_src.h"

/* The engine's hooks for one micro-step (NULL members: nothing to do there). */
typedef struct {
    void (*weights_needed)(void *ctx, size_t upto);
    void (*grads_ready)(void *ctx, size_t from);
    void (*embed_ready)(void *ctx);
    void *ctx;
    void (*weights_back)(void *ctx, size_t from); /* ZeRO-3's backward (qt_param_acquire_weights_back) */
} qt_param_hooks;

typedef struct {
    const qt_layout *L;   /* borrowed */
    const struct qt_weights_place *weights_place; /* where the weights live (qt_place.h), from the plan */
    const struct qt_grads_place *grads_place;     /* where the gradients live */
    const struct qt_opt_place *opt_place;         /* where the optimizer state lives */
    qt_plan plan;         /* where each item lives (weights, grads, optimizer), the dtypes, AdamW's settings */
    qt_shard shard;
    /* w [shard.total] (L->numel, padded for the ranks' equal pieces), ZeRO-3 [shard.len]; master, m, v
     * [shard.len], this rank's pieces of the buckets back to back (all of the array when not sharded) */
    void *w;              /* bf16, device; w_host: pinned host (owned, mapped: kernels write it directly; ZeRO-3: the
                           * rank's pieces [shard.len] there) */
    qt_weight_slots *wslots; /* ZeRO-3, w_host: where the model reads the whole weights of a bucket (owned) */
    void *grad;           /* grad_dt (acc_dt, or fp32 for ZeRO-2/3), device: [shard.total], or
                           * ZeRO-2 fp32 [shard.len] (this rank's summed pieces); g_host: grad_dt [shard.total] (ZeRO-2/3:
                           * fp32 [shard.len]) in pinned host memory (owned, mapped: the norm and AdamW read it directly) */
    void **grad_slot;     /* ZeRO-2, g_host: [n_buckets] the device slot holding bucket b's whole gradient (acc_dt)
                           * while the backward writes it (owned array; the slots are in the arena) */
    float *master;        /* device, or host_state; NULL when w_master_dt is bf16 (AdamW updates w in place) */
    void *m, *v;
    qt_dtype m_dt, v_dt;
    qt_dtype w_master_dt; /* precision.master_dtype: fp32 (the master array) or bf16 (w itself) */
    qt_dtype acc_dt;      /* precision.grad_accum_dtype: the dtype every weight-gradient writer accumulates in (the
                           * whole array, or ZeRO-2/3's and g_host's gradient slots) */
    qt_dtype grad_dt;     /* grad's: acc_dt, but fp32 for ZeRO-2/3's summed shard (each micro-step's sum is added
                           * there in fp32: a bf16 shard would round every micro-step) */
    double *sumsq;        /* [ranks][buckets] every rank's pieces' gradient sums of squares (sharded norm) */
    float *norm, *clip;   /* device scalars */
    void *comm_buf;       /* reduce_bf16: [largest bucket] bf16, the gradients' sums travel in it */
    float *staging;       /* [stage_n] fp32: host weights come up through it to be cast to bf16; across nodes the
                           * node exchange (qt_dp_nodes_widen) goes through it */
    size_t stage_n;
    struct {              /* ZeRO-2/3 + g_host: the host gradient shard's adds and their device staging */
        float *shard_stage; /* the device slots (chunks of shard_stage_n fp32) where qt_param_grad_piece_add adds
                             * chunks of the host shard (arena; NULL otherwise) */
        size_t shard_stage_n;
        qt_host_shard *gshard; /* owned, with shard_stage: the host shard's adds and clearing */
    } host_grad;
    struct {              /* QT_OPT_STATE_HOST: the optimizer state in pinned host memory */
        char *host_state; /* those of master, m and v in opt_host, back to back (owned, pinned) */
        int opt_host;     /* QT_OFF_MASTER | QT_OFF_M | QT_OFF_V: which are in host_state (the rest on the device);
                           * no master bit with a bf16 master (there is no master array) */
        size_t host_state_bytes;
        void *opt_slots;  /* the device slots the state streams through */
    } host_opt;
    qt_gpu_optim *opt;    /* AdamW of this rank's pieces, in groups (qt_param_opt_groups) */
    /* plan.weights.e4m3: the e4m3 codes of the rank's pieces [shard.len] (device arena, or pinned host with w_host; one GPU:
     * [shard.total], pinned host; only the block matrices' elements of layer buckets are meaningful), the small
     * params' map (owned), ZeRO-3's packed send buffer [small.max_packed] and every layer bucket's all-gather
     * result [n_buckets][n_ranks * small.max_packed] (bf16, made when the pieces change; NULL on one GPU), and
     * 64 fp32 abs-maxes */
    struct {
        uint8_t *w8;
        qt_small_params small;
        void *small_send, *small_recv;
        float *amax8;
    } e4m3;
} qt_param_store;

/* A store for layout L placed and typed as plan pl says, shard sh (this rank's buckets and pieces).
 * Sizes (allocates nothing: the plan can be made without a GPU); NULL with err. */
qt_param_store *qt_param_store_create(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, char *err, size_t errlen);
/* Allocates the pinned host memory of an offloaded placement (zeroed; nothing otherwise): the optimizer
 * state, the bf16 weights (w_host). 0, or -1 with err when qt_pinned_alloc fails. */
int qt_param_store_alloc_host(qt_param_store *ps, char *err, size_t errlen);
/* Adds the store's rows to p (sizing pass) or takes its buffers (second pass). */
void qt_param_store_carve(qt_param_store *ps, qt_mem_plan *p);
/* Once the arena exists: fills the bf16 weights and this rank's master pieces from src, a chunk at a
 * time through one pageable buffer of qt_weight_src_chunk(L) floats (no whole-model copy), zeroes the
 * gradients and moments, and builds the AdamW groups (decay per the plan). On s; returns synchronised. 0, or
 * -1 with err when the source cannot be read. */
int qt_param_store_init(qt_param_store *ps, const qt_weight_src *src, cudaStream_t s, char *err, size_t errlen);
void qt_param_store_free(qt_param_store *ps);

/* bf16 weights [0, n) = RNE(host[0, n)), through the staging buffer, on s (host pageable fp32). */
void qt_param_upload_bf16(qt_param_store *ps, const float *host, size_t n, cudaStream_t s);

/* Shared gradient slots of ZeRO-2 (bucket b: slot b % QT_GRAD_SLOTS; docs/memory.md). */
#define QT_GRAD_SLOTS 3

/* The bf16 weight the model reads at flat index off: in w, or ZeRO-3 / w_host in the slot its bucket was
 * gathered or copied into (acquired first). */
void *qt_param_w(const qt_param_store *ps, size_t off);
/* This rank's own bf16 weight at flat index off (in one of its pieces when sharded: AdamW writes it): in
 * w at off, or ZeRO-3 at its state index. */
void *qt_param_w_mine(const qt_param_store *ps, size_t off);
/* Where the backward adds the gradient of flat element off (acc_dt; a tensor never crosses a bucket). */
void *qt_param_g(const qt_param_store *ps, size_t off);
/* ZeRO-2: bucket b's slot [bucket[b+1] - bucket[b]] and its shared slot number (-1: a slot of its own). */
void *qt_param_grad_slot(const qt_param_store *ps, int b);
int qt_param_grad_slot_shared(const qt_param_store *ps, int b);
/* Offloaded gradients (g_host): slot b holds bucket b, which the backward writes whole (no tensor crosses a
 * bucket's bounds), so each gradient element has one place in one slot. load: the slot = the host gradients of
 * its bucket (H2D, before the backward writes the slot: its writers then add exactly what they would add to a
 * whole array); store: the host gradients there = the slot (D2H), then (zero) the slot is zeroed. Both on s. */
void qt_param_grad_load(const qt_param_store *ps, int b, cudaStream_t s);
void qt_param_grad_store(const qt_param_store *ps, int b, int zero, cudaStream_t s);
/* ZeRO-2: zeroes bucket b's slot, on s. */
void qt_param_grad_slot_zero(const qt_param_store *ps, int b, cudaStream_t s);
/* This rank's summed gradients of bucket b (its piece, qt_shard_piece; grad_dt): in the whole array, or
 * ZeRO-2 in the shard. */
void *qt_param_grad_piece(const qt_param_store *ps, int b);
/* ZeRO-2/3: this rank's piece of bucket b (fp32) += src[len] (device, dt: a micro-step's summed piece), on s
 * with qt_add_inplace. A shard in pinned host memory is added in chunks through shard_stage's slots
 * (qt_host_shard_add: the copy engines, not the mapping); the same kernel on the same values, so the same
 * bits. s goes on once the piece is back in host memory. */
void qt_param_grad_piece_add(const qt_param_store *ps, int b, const void *src, qt_dtype dt, size_t len, cudaStream_t s);
/* Before any other write into bucket b's piece, or a read of it, on s: a host shard's piece that is still
 * marked cleared (qt_param_zero_grads marks it) zeroed there; nothing otherwise. */
void qt_param_grad_piece_fresh(const qt_param_store *ps, int b, cudaStream_t s);
/* g[0, numel) (host) = the gradients: all of them, or ZeRO-2 this rank's summed pieces only (synchronous;
 * the caller has joined the streams). */
void qt_param_get_grads(const qt_param_store *ps, float *g);

/* The acquire/release calls of the forward and backward, each forwarded to h (may be NULL).
 * acquire_weights: the next op reads the weights below flat index upto (the forward);
 * acquire_weights_back: the backward's next ops read the layer (or final norm) starting at from;
 * release_grads: every gradient at flat index >= from is final;
 * release_embed: the LM head's backward is done (the embedding table's gradient is final but for this
 * micro-batch's lookups). */
void qt_param_acquire_weights(const qt_param_store *ps, const qt_param_hooks *h, size_t upto);
void qt_param_acquire_weights_back(const qt_param_store *ps, const qt_param_hooks *h, size_t from);
void qt_param_release_grads(const qt_param_store *ps, const qt_param_hooks *h, size_t from);
void qt_param_release_embed(const qt_param_store *ps, const qt_param_hooks *h);

/* The optimizer's groups: group i covers buckets [*k0, *k1) and is updated by qt_param_opt_step (AdamW
 * of this rank's pieces there: master, m, v and the bf16 weights, gradients scaled by ps->clip). */
int qt_param_opt_groups(const qt_param_store *ps);
void qt_param_opt_buckets(const qt_param_store *ps, int i, int *k0, int *k1);
void qt_param_opt_step(qt_param_store *ps, int i, const qt_adamw_args *a, cudaStream_t s);
/* Zeroes the gradients of buckets [k0, k1) on s (a host shard's pieces: marked cleared, qt_host_shard.h). */
void qt_param_zero_grads(qt_param_store *ps, int k0, int k1, cudaStream_t s);

/* w[0, numel) (host) = this rank's master pieces (synchronous; the caller has joined the streams); with
 * a bf16 master, the exact fp32 values of the bf16 weights there. */
void qt_param_get_master(const qt_param_store *ps, float *w);
/* The same values back to back in state order, w[0, shard.len) (padding 0): the checkpoint's layout. */
void qt_param_get_master_pieces(const qt_param_store *ps, float *w);
/* Bytes per element and base of the state item i: 0 master, 1 bf16 weights (ZeRO-3: the rank's pieces,
 * like the others; w_host: in host memory), 2 m, 3 v. */
void *qt_param_item(const qt_param_store *ps, int i, qt_dtype *dt);

#endif
