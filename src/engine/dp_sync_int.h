/* dp_sync_int.h — what dp_sync.c shares with its two strategies' files (dp_grads.c: how the gradients are summed;
 * dp_fill.c: how the weight slots are filled): the sync's state, the micro-step kinds, the stream helpers. Internal
 * to src/engine; the interface is qt_dp_sync.h. */
#ifndef QT_DP_SYNC_INT_H
#define QT_DP_SYNC_INT_H

#include <cuda_runtime.h>
#include <time.h>

#include "qt_dp_nodes.h"
#include "qt_dp_sync.h"
#include "qt_error.h"

/* A micro-step replayed as CUDA graph segments: segment k reads the weights below flat index
 * seg[k].wait (0: no wait), so it waits for their all-gather first; after it, every gradient from flat
 * index seg[k].from up is final (NO_CUT: nothing to hand over), so the bucket sums are enqueued. An
 * ordinary micro-step is one segment. */
#define NO_CUT SIZE_MAX
#define EMBED_CUT (SIZE_MAX - 1) /* from: the embeddings' bucket is final but for this micro-batch's lookups */
typedef struct {
    struct { cudaGraphExec_t exec; size_t wait, from; } *seg; /* owned, cap entries */
    int n, cap;
    size_t wait;            /* while capturing: what the next segment waits for */
    float scale;            /* the loss scale captured in the graphs */
    int docs;               /* the packed-document mode captured (qt_gpu_model_docs_mode) */
} graph_set;

/* Micro-step kinds, the graph_set index: the last of a step, whose bucket sums overlap the backward;
 * the first after an overlapped weight all-gather, whose forward waits for it bucket by bucket; the
 * last of a sharded step, which leaves its embedding lookups out (add_lookups adds every rank's). */
enum { MS_SUMS = 1, MS_WAITS = 2, MS_LOOKUPS = 4, MS_KINDS = 8 };

/* How the gradients' sums are made, chosen once from the gradients' placement: the whole array (one GPU: no sum;
 * ranks: all-reduced or reduce-scattered at the step's end or overlapped with the last backward), ZeRO-2/3's slots
 * summed into the rank's shard every micro-step, or one GPU's offloaded slots stored to host every micro-step. */
typedef struct grad_sync {
    /* the buckets [b, sent) became final (lookups: and the lookups are due; from: qt_dp_grads_ready's flat index) */
    void (*ready)(struct qt_dp_sync *d, int b, int lookups, size_t from);
    void (*before)(struct qt_dp_sync *d); /* before each micro-step (NULL: nothing) */
    void (*reduce)(struct qt_dp_sync *d); /* qt_dp_sync_reduce, before the norm: the sums not made yet */
    void (*wait)(struct qt_dp_sync *d);   /* the model's stream waits for the last micro-step's sums (stores) */
    void (*init)(struct qt_dp_sync *d);   /* its events and streams (NULL: none) */
    void (*fini)(struct qt_dp_sync *d);
    int every_micro; /* every micro-step sums (stores) its buckets as the backward releases them */
    int into_shard;  /* the sums read the gradient slots and are added into the rank's shard (ZeRO-2/3) */
    int aside;       /* the sums (stores) always run on the side stream */
} grad_sync;

/* How the weight slots are filled, chosen once from the weights' placement (plan.weights.slots; NULL otherwise):
 * one GPU copies a bucket up from the pinned host array; ZeRO-3 all-gathers the ranks' pieces from their GPUs, or
 * (offloaded pieces) from their pinned host memory. */
typedef struct slot_fill {
    /* every rank's n bf16 elements at mine gathered into dst on s: 0, or nonzero when the collective aborted;
     * NULL: one GPU, the bucket is copied up */
    int (*gather)(struct qt_dp_sync *d, void *dst, const void *mine, size_t n, cudaStream_t s);
    int staged; /* the pieces live in host memory: their e4m3 codes are made in a slot on the GPU */
    int gside;  /* the shared slots' fills on a stream of their own: 1 always, 2 with parallel.overlap_comm */
} slot_fill;

struct qt_dp_sync {
    qt_gpu_model *g;        /* borrowed */
    qt_param_store *ps;     /* g's */
    const qt_layout *L;
    qt_plan plan;
    const grad_sync *gsync; /* how the gradients are summed (from the plan) */
    const slot_fill *wfill; /* how the weight slots are filled (from the plan; NULL: no weight slots) */
    float grad_clip;
    qt_comm *comm;          /* borrowed; NULL with one GPU */
    qt_internode *nodes;    /* borrowed; NULL on one machine: the legs between the nodes (qt_dp_nodes.h) */
    cudaStream_t side;      /* plan.perf.side_stream: sums, gathers or AdamW beside the model's stream (owned) */
    cudaEvent_t side_ev;
    int sent;               /* lowest bucket handed to the side stream this step (n_buckets: none) */
    int early;              /* buckets [0, early) handed over right after the LM head (embeddings only) */
    int lookups_due;        /* the last micro-step left its lookups out: add_lookups before the norm */
    cudaEvent_t *ag_ev;     /* plan.weights.ahead: [n_buckets] bucket k's weights ready on the side stream */
    cudaEvent_t slot_ev[QT_GRAD_SLOTS]; /* ZeRO-2: shared gradient slot k reduced and zeroed (its last user) */
    cudaEvent_t sums_ev;    /* ZeRO-2 overlapped: a micro-step's last sums done (slots free, shard whole) */
    int gathered;           /* buckets whose gather the model's stream waits for (n_buckets: none pending) */
#ifdef QT_MUTANTS
    struct {
        float *sum_buf;     /* QT_MUT_ZERO2_DESC_RANK_SUM: every rank's copy of a bucket (owned) */
        uint16_t *first_w;  /* QT_MUT_Z3_STALE_FILL: each bucket's first gather, [shard.total] (owned) */
        char *first_have;   /* QT_MUT_Z3_STALE_FILL: [n_buckets] bucket b is in first_w (owned) */
        int codes_made;     /* QT_MUT_E4M3_CODES_ONCE: the codes were made once */
    } mut;
#endif
    graph_set graphs[MS_KINDS]; /* by micro-step kind (MS_*) */
    graph_set *capture;     /* the set being captured */
    qt_param_hooks wait_hooks; /* weights_needed: every forward's, chosen once (the weight slots' fill, the wait for
                                * the weights updated ahead, or none) */
    struct {                /* ZeRO-3, offloaded weights (plan.weights.slots): the weight slots' gathers */
        qt_wslots_io io;    /* gathers on gside with the overlap (prefetch), else the model's */
        cudaStream_t gside; /* the shared weight slots' gathers (prefetch) on a stream of their own, so the
                             * backward's next gather does not queue behind this layer's gradient sums on the
                             * side stream (a 14B box step would wait 7 of its 24.5 s there; owned;
                             * NULL without prefetch) */
        cudaEvent_t gside_ev;
        int own_due;        /* the own slots wait for their gather at the next forward (after creation or a
                             * load: collectives only where every rank is sure to come) */
    } wslots;
    struct {                /* test hooks (qt_test_hooks.h) */
        long ag_delay_ms;   /* the side stream sleeps before each weight gather */
        long sum_delay_ms;  /* the side stream sleeps before each ZeRO-2 bucket sum */
        long read_delay_ms; /* zero3_read_delay_ms */
        long gathers;       /* shared-slot gathers issued so far (dp_fail_gather) */
        int fail_rank;      /* this rank fails at its fail_gather-th gather (-1: none) */
        long fail_gather;
    } test;
    struct {                /* offloaded gradients (plan.grads.host_one) */
        int grad_micro;     /* micro-steps of this step so far, the running one included (the first loads
                             * nothing: the host gradients and the slots are zero) */
        cudaStream_t gup;   /* the slots' loads (H2D), beside the stores (D2H) on the side stream (owned) */
        cudaEvent_t stored_ev[QT_GRAD_SLOTS], gup_ev; /* shared slot k stored and zeroed; the loads' end */
        int gup_used;       /* this micro-step issued loads on gup (joined back before sums_ev) */
    } host_grads;
};

static inline void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

/* Stream `waiter` continues after what stream `on` has enqueued so far (ev: recorded, waited at once). */
static inline void follow(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev) {
    QT_CUDA(cudaEventRecord(ev, on));
    QT_CUDA(cudaStreamWaitEvent(waiter, ev, 0));
}

/* The side stream continues after what the model's stream has enqueued so far. */
static inline void side_follows(qt_dp_sync *d) { follow(d->side, d->g->stream, d->side_ev); }

/* Stream s continues after every gather on the gather stream so far (also a prefetch no one acquired,
 * e.g. after an evaluation's forward). */
static inline void gathers_join(qt_dp_sync *d, cudaStream_t s) {
    if (d->wslots.gside && s != d->wslots.gside) follow(s, d->wslots.gside, d->wslots.gside_ev);
}

/* dst[n_ranks x per] (dt) = every world rank's per elements in world-rank order (rank x nodes + node,
 * qt_partition.h), this rank's at mine: across nodes first over the nodes into this GPU's slot of the node
 * (NCCL; in place when mine sits there), then over the node's GPUs in place (comm/); each leg only where there
 * is more than one. nodes_leg 0 leaves the first leg out (a planted bug). 0, or nonzero when the comm aborted.
 * dp_fill.c. */
int qt_dp_world_gather(qt_dp_sync *d, void *dst, const void *mine, size_t per, qt_dtype dt, int nodes_leg, cudaStream_t s);

/* The gradients' sums of plan p (dp_grads.c). */
const grad_sync *qt_dp_grads_of(const qt_plan *p);
/* The hooks and waits of the gradients' sums: grads_ready, embed_ready (qt_param_hooks); the model's stream waits for
 * the last micro-step's sums (adamw_wait: before the norm and AdamW, where a planted bug may skip it). */
void qt_dp_grads_ready(void *ctx, size_t from);
void qt_dp_grads_send_embedding(void *ctx);
void qt_dp_grads_wait(qt_dp_sync *d);
void qt_dp_grads_adamw_wait(qt_dp_sync *d);

/* The weight slots' fills of plan p (dp_fill.c), NULL without weight slots. */
const slot_fill *qt_dp_fill_of(const qt_plan *p);
/* weights_needed with the weights updated ahead (one event per bucket); the weight slots' hooks (forward,
 * backward), a shared slot's fill (qt_wslots_io's gather) and the own slots' fills of buckets [k0, k1) on s. */
void qt_dp_fill_wait(void *ctx, size_t upto);
void qt_dp_fill_forward(void *ctx, size_t upto);
void qt_dp_fill_backward(void *ctx, size_t from);
void qt_dp_fill_gather(void *ctx, int b, void *dst, void *dst8, cudaStream_t s);
void qt_dp_fill_own(qt_dp_sync *d, int k0, int k1, cudaStream_t s);

#endif
