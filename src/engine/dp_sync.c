/* dp_sync.c — bucket sums, embedding lookups, weight gathers and graph segments of one GPU rank
 * (qt_dp_sync.h, docs/memory.md). */
#include "qt_dp_sync.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "qt_dp_nodes.h"
#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_quant.h"
#include "qt_small_params.h"
#include "qt_test_hooks.h"

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
    /* grads_ready: the buckets [b, sent) became final (lookups: and the lookups are due; from: grads_ready's) */
    void (*ready)(struct qt_dp_sync *d, int b, int lookups, size_t from);
    void (*before)(struct qt_dp_sync *d); /* before each micro-step (NULL: nothing) */
    void (*reduce)(struct qt_dp_sync *d); /* qt_dp_sync_reduce, before the norm: the sums not made yet */
    void (*wait)(struct qt_dp_sync *d);   /* the model's stream waits for the last micro-step's sums (stores) */
    void (*init)(struct qt_dp_sync *d);   /* its events and streams (NULL: none) */
    void (*fini)(struct qt_dp_sync *d);
    int every_micro; /* every micro-step sums (stores) its buckets as the backward releases them */
    int margins;     /* the slots' margin and table-tail adds come before their sums */
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
    qt_internode *nodes;    /* borrowed; NULL on one machine: after the node's sum each piece is summed over the nodes */
    double *world_sumsq;    /* plan.parallel.world_pieces: [nodes x n_ranks][n_buckets] (owned; qt_dp_nodes_norm) */
    cudaStream_t side;      /* plan.perf.side_stream: sums, gathers or AdamW beside the model's stream (owned) */
    cudaEvent_t side_ev;
    int sent;               /* lowest bucket handed to the side stream this step (n_buckets: none) */
    int early;              /* buckets [0, early) handed over right after the LM head (embeddings only) */
    int lookups_due;        /* the last micro-step left its lookups out: add_lookups before the norm */
    int tail_done;          /* ZeRO-2: this micro-step's embedding table tail is in bucket 1's slot */
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
    qt_param_hooks wait_hooks;
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

static void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

#ifdef QT_MUTANTS
/* QT_MUT_ZERO2_DESC_RANK_SUM: piece += every rank's copy of this rank's piece of the bucket, in descending
 * rank order; a test must see other bits than the comm's ascending order with 3 ranks. */
static void mutant_sum(qt_dp_sync *d, int b, const void *g, void *piece, cudaStream_t s) {
    const qt_shard *sh = &d->ps->shard;
    size_t lo = sh->bucket[b], count = sh->bucket[b + 1] - lo, n = (size_t)sh->n_ranks, off, len, st;
    qt_shard_piece(sh, b, &off, &len, &st);
    if (!d->mut.sum_buf) QT_CUDA(cudaMalloc((void **)&d->mut.sum_buf, sh->total * n * 4));
    QT_CHECK(qt_comm_all_gather(d->comm, d->plan.parallel.rank, d->mut.sum_buf, g, n * count, QT_DT_F32, s) == 0, "mutant gather");
    for (size_t j = n; j-- > 0;) qt_add_inplace(piece, QT_DT_F32, d->mut.sum_buf + j * count + (off - lo), QT_DT_F32, len, s);
}

/* QT_MUT_Z3_STALE_FILL (ZeRO-3 with the pieces offloaded): bucket b's slot filled from the device copy of
 * its first gather (AdamW's later writes to the host pieces never read again): 1 when it did so. Every
 * rank takes the same mutant, so every rank skips the same collectives. */
static int stale_fill(qt_dp_sync *d, int b, void *dst, cudaStream_t s) {
    const qt_shard *sh = &d->ps->shard;
    if (!d->mut.first_w) {
        QT_CUDA(cudaMalloc((void **)&d->mut.first_w, sh->total * 2));
        d->mut.first_have = calloc((size_t)sh->n_buckets, 1);
        QT_CHECK(d->mut.first_have, "out of host memory");
    }
    if (!d->mut.first_have[b]) return 0;
    QT_CUDA(cudaMemcpyAsync(dst, d->mut.first_w + sh->bucket[b], (sh->bucket[b + 1] - sh->bucket[b]) * 2,
                            cudaMemcpyDefault, s));
    return 1;
}

/* QT_MUT_Z3_STALE_FILL: keeps bucket b's first gather (dst, n elements) for stale_fill. */
static void stale_keep(qt_dp_sync *d, int b, const void *dst, size_t n, cudaStream_t s) {
    QT_CUDA(cudaMemcpyAsync(d->mut.first_w + d->ps->shard.bucket[b], dst, n * 2, cudaMemcpyDefault, s));
    d->mut.first_have[b] = 1;
}

static void mutants_free(qt_dp_sync *d) {
    if (d->mut.sum_buf) QT_CUDA(cudaFree(d->mut.sum_buf));
    if (d->mut.first_w) QT_CUDA(cudaFree(d->mut.first_w));
    free(d->mut.first_have);
}
#endif

/* Sums bucket b over the ranks on stream s: all of it (replicated optimizer state) or this rank's piece
 * (sharded). With parallel.reduce_dtype bf16 the sum travels in the store's bf16 comm buffer; bf16
 * gradients (precision.grad_accum_dtype) are summed in place in bf16. The comm adds in fp32 in rank
 * order and rounds once to the dtype (RNE). ZeRO-2: from the bucket's slot (fp32, or bf16 summed in bf16),
 * the rank's piece of the sum added to its fp32 gradient shard (+=: every micro-step; 0 + x = x, so one
 * micro-step gives ZeRO-1's bits, bf16 gradients too), then the slot zeroed for its next bucket and, when
 * shared, its event recorded. */
static void reduce_bucket(qt_dp_sync *d, int b, cudaStream_t s) {
    qt_param_store *ps = d->ps;
    const qt_shard *sh = &ps->shard;
    int g16 = ps->acc_dt == QT_DT_BF16, half = d->plan.grads.reduce_bf16 && !g16, rank = d->plan.parallel.rank;
    int z2 = d->plan.grads.sharded;
    qt_dtype dt = half || g16 ? QT_DT_BF16 : QT_DT_F32;
    size_t es = qt_dtype_size(dt), lo = sh->bucket[b], count = sh->bucket[b + 1] - lo, off = lo, len = count, st;
    void *g = z2 ? (void *)qt_param_grad_slot(ps, b) : qt_param_g(ps, lo); /* the bucket's gradients, whole */
    char *buf = half ? (char *)ps->comm_buf : (char *)g;
    if (z2 && d->test.sum_delay_ms && s == d->side) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.sum_delay_ms));
    if (half) qt_cast_f32_to_bf16(buf, g, count, s);
#ifdef QT_MUTANTS
    int desc = z2 && !half && !g16 && qt_mutant_on(QT_MUT_ZERO2_DESC_RANK_SUM); /* its gather and adds are fp32 */
    if (desc) {
        qt_param_grad_piece_fresh(ps, b, s);
        mutant_sum(d, b, g, qt_param_grad_piece(ps, b), s);
    } else
#endif
    if (sh->n_ranks == 1) {
        QT_CHECK(qt_comm_all_reduce(d->comm, rank, buf, buf, count, dt, s) == 0,
                 "rank %d: gradient all-reduce aborted (another rank failed)", rank);
    } else {
        qt_shard_piece(sh, b, &off, &len, &st);
        QT_CHECK(qt_comm_reduce_scatter(d->comm, rank, buf + (off - lo) * es, buf, count, dt, s) == 0,
                 "rank %d: gradient reduce-scatter aborted (another rank failed)", rank);
    }
    if (d->nodes) qt_dp_nodes_sum(d->nodes, rank, buf + (off - lo) * es, len, dt, s); /* the node's sum, over the nodes */
    if (z2) {
#ifdef QT_MUTANTS
        if (qt_mutant_on(QT_MUT_HOST_SHARD_ASSIGN) && d->plan.grads.host_shard && dt == QT_DT_F32) { /* = instead of += */
            qt_param_grad_piece_fresh(ps, b, s);
            QT_CUDA(cudaMemcpyAsync(qt_param_grad_piece(ps, b), buf + (off - lo) * es, len * 4, cudaMemcpyDefault, s));
        } else if (!desc)
#endif
        qt_param_grad_piece_add(ps, b, buf + (off - lo) * es, dt, len, s);
        qt_param_grad_slot_zero(ps, b, s);
        int k = qt_param_grad_slot_shared(ps, b);
        if (k >= 0) QT_CUDA(cudaEventRecord(d->slot_ev[k], s));
    } else if (half) {
        qt_cast_bf16_to_f32(qt_param_g(ps, off), buf + (off - lo) * es, len, s);
    }
}

/* Stream `waiter` continues after what stream `on` has enqueued so far (ev: recorded, waited at once). */
static void follow(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev) {
    QT_CUDA(cudaEventRecord(ev, on));
    QT_CUDA(cudaStreamWaitEvent(waiter, ev, 0));
}

/* The side stream continues after what the model's stream has enqueued so far. */
static void side_follows(qt_dp_sync *d) { follow(d->side, d->g->stream, d->side_ev); }

/* Stream s continues after every gather on the gather stream so far (also a prefetch no one acquired,
 * e.g. after an evaluation's forward). */
static void gathers_join(qt_dp_sync *d, cudaStream_t s) {
    if (d->wslots.gside && s != d->wslots.gside) follow(s, d->wslots.gside, d->wslots.gside_ev);
}

/* The stream the bucket sums of the backward go to: the side stream, after what the model's stream has
 * enqueued so far (overlap, offloaded gradients' stores), else the model's (ZeRO-2 without overlap: in
 * the backward's order). */
static cudaStream_t sums_stream(qt_dp_sync *d) {
    if (!d->plan.parallel.overlap && !d->gsync->aside) return d->g->stream;
    side_follows(d);
    return d->side;
}

/* embed_ready (sharded, last micro-step): the buckets of embeddings only are final but for this
 * micro-batch's lookups, which add_lookups adds later, so they are summed now, while the whole
 * backward still runs: that bucket is the largest (27% of Qwen2.5-0.5B with its tied LM head). */
static void send_embedding(void *ctx) {
    qt_dp_sync *d = ctx;
    const qt_shard *sh = &d->ps->shard;
    int k = 0;
    while (k < sh->n_buckets && sh->bucket[k + 1] <= d->L->layers[0].ln1) k++;
    if (!k) return;
    d->early = k;
    if (d->ps->plan.grads.embed_apart) return; /* ZeRO-2: no gradient there but the lookups (+= 0 changes no bit) */
    if (d->gsync->margins && !d->tail_done) d->tail_done = qt_param_grad_tail(d->ps, d->g->stream);
    cudaStream_t cs = sums_stream(d);
    for (int b = 0; b < k; b++) reduce_bucket(d, b, cs);
}

/* Adds this micro-step's embedding lookups of every rank, in rank order, to this rank's pieces of the
 * embedding gradient (already summed without them): the tokens and the residual gradient at the
 * embeddings (N x C, a fraction of the table) are all-gathered instead of the table's gradient. With bf16
 * gradients and ZeRO-2/3's fp32 shard each rank's add is rounded to bf16 as ZeRO-1's bf16 array rounds it. */
static void add_lookups(qt_dp_sync *d, cudaStream_t cs) {
    qt_gpu_model *g = d->g;
    const qt_shard *sh = &d->ps->shard;
    const qt_model_cfg *c = &d->L->cfg;
    size_t n = (size_t)sh->n_ranks, N = (size_t)g->N, C = (size_t)c->hidden_size, end = d->L->layers[0].ln1;
    int32_t *tok;
    float *dres;
    void *ws;
    int rank = d->plan.parallel.rank;
    qt_gpu_model_lookups(g, g->head.lookups, &tok, &dres, &ws);
    QT_CHECK(qt_comm_all_gather(d->comm, rank, tok, g->tok, n * N, QT_DT_F32, cs) == 0 &&
                 qt_comm_all_gather(d->comm, rank, dres, g->as->dres, n * N * C, QT_DT_F32, cs) == 0,
             "rank %d: embedding lookups all-gather aborted (another rank failed)", rank);
    for (size_t j = 0; j < n; j++)
        for (int b = 0; b < sh->n_buckets && sh->bucket[b] < end; b++) {
            size_t off, len, st;
            qt_shard_piece(sh, b, &off, &len, &st);
            size_t hi = off + len < end ? off + len : end; /* the embeddings sit at flat index 0 */
            /* the table's base as the kernel indexes it: element off at the rank's piece */
            if (off < hi) qt_param_grad_piece_fresh(d->ps, b, cs); /* ZeRO-2 embed_apart: no sum wrote it this step */
            if (off < hi)
                qt_embedding_scaled_bwd_range((char *)qt_param_grad_piece(d->ps, b) - off * qt_dtype_size(d->ps->grad_dt),
                                              d->ps->grad_dt, d->ps->acc_dt != d->ps->grad_dt, off, hi, dres + j * N * C,
                                              QT_DT_F32, tok + j * N, (long)N, (int)C, c->vocab_size, g->fam.embed_scale,
                                              ws, cs);
        }
}

/* ZeRO-2, on the model's stream, for the buckets [b, sent) that became final: each one's slot below
 * (the backward writes it next, and the head margin goes there) waits until its shared slot's last
 * user is reduced and zeroed; the margin is added; the embedding table's tail moves to bucket 1 before
 * bucket 1 (or 0) is summed. Then the sums may read the slots (qt_param_store.h). */
static void slots_ready(qt_dp_sync *d, int b) {
    qt_param_store *ps = d->ps;
    for (int k = d->sent - 1; k >= b; k--) {
        int j = k > 0 ? qt_param_grad_slot_shared(ps, k - 1) : -1;
#ifdef QT_MUTANTS
        if (qt_mutant_on(QT_MUT_GRAD_SLOT_NO_WAIT)) j = -1; /* no wait */
#endif
        if (j >= 0) QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->slot_ev[j], 0));
        if (k > 0) qt_param_grad_margin(ps, k, d->g->stream);
        if (k <= 1 && !d->tail_done) d->tail_done = qt_param_grad_tail(ps, d->g->stream);
    }
}

/* Offloaded gradients, for the buckets [b, sent) that became final: each one's slot below (the backward
 * writes it next) waits until its shared slot's last user is stored, zeroed and loaded again; then, on
 * the side stream, each final bucket's slot is stored to host; a shared slot is zeroed and the next
 * bucket of this backward to use it (three below) loaded into it
 * (not in the first micro-step of a step: nothing to load) on the load stream once the store is done,
 * so one slot's load (H2D) runs beside the next slot's store (D2H); the slot's event is recorded after
 * its load (or store); at the end the side stream waits for the loads. A slot of its own keeps what it
 * stored, which is what the next micro-step would load (zeroed at the step's end, qt_dp_sync_reduce).
 * The slots need no margin or tail adds: each element has one home (qt_param_grad_home). */
static void host_grads_ready(qt_dp_sync *d, int b) {
    qt_param_store *ps = d->ps;
    for (int k = d->sent - 1; k >= b; k--) {
        int j = k > 0 ? qt_param_grad_slot_shared(ps, k - 1) : -1;
#ifdef QT_MUTANTS
        if (qt_mutant_on(QT_MUT_GRAD_SLOT_NO_WAIT)) j = -1; /* no wait */
#endif
        if (j >= 0) QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->slot_ev[j], 0));
    }
    cudaStream_t cs = sums_stream(d);
    while (d->sent > b) {
        int k = --d->sent, j = qt_param_grad_slot_shared(ps, k);
        if (d->test.sum_delay_ms) QT_CUDA(cudaLaunchHostFunc(cs, sleep_ms, &d->test.sum_delay_ms));
        int zero = j >= 0; /* a shared slot is zeroed after its store */
#ifdef QT_MUTANTS
        zero = zero && !qt_mutant_on(QT_MUT_GRAD_SLOT_NOT_ZEROED);
#endif
        qt_param_grad_store(ps, k, zero, cs);
        if (j < 0) continue;
        if (d->host_grads.grad_micro > 1 && k >= QT_GRAD_SLOTS && qt_param_grad_slot_shared(ps, k - QT_GRAD_SLOTS) == j) {
            QT_CUDA(cudaEventRecord(d->host_grads.stored_ev[j], cs));
            int no_wait = 0;
#ifdef QT_MUTANTS
            no_wait = qt_mutant_on(QT_MUT_GRAD_LOAD_NO_STORE_WAIT);
#endif
            if (!no_wait) QT_CUDA(cudaStreamWaitEvent(d->host_grads.gup, d->host_grads.stored_ev[j], 0));
            qt_param_grad_load(ps, k - QT_GRAD_SLOTS, d->host_grads.gup);
            QT_CUDA(cudaEventRecord(d->slot_ev[j], d->host_grads.gup));
            d->host_grads.gup_used = 1;
        } else {
            QT_CUDA(cudaEventRecord(d->slot_ev[j], cs));
        }
    }
    if (b == 0) {
        d->sent = ps->shard.n_buckets;
        if (d->host_grads.gup_used) { /* a graph's capture: gup joins only where it was forked (used) */
            QT_CUDA(cudaEventRecord(d->host_grads.gup_ev, d->host_grads.gup));
            QT_CUDA(cudaStreamWaitEvent(cs, d->host_grads.gup_ev, 0));
            d->host_grads.gup_used = 0;
        }
        QT_CUDA(cudaEventRecord(d->sums_ev, cs));
    }
}

/* Offloaded gradients, before a micro-step (after the last one's stores, sums_wait): on the model's
 * stream, each shared slot's first bucket of the backward (the top one using it) is loaded from host,
 * unless this is the step's first micro-step (the own slots hold their host gradients already). */
static void host_grads_load(qt_dp_sync *d) {
    const qt_param_store *ps = d->ps;
    int seen[QT_GRAD_SLOTS] = {0};
    if (++d->host_grads.grad_micro == 1) return;
    for (int b = ps->shard.n_buckets - 1; b >= 0; b--) {
        int j = qt_param_grad_slot_shared(ps, b);
        if (j >= 0 && !seen[j]++) qt_param_grad_load(ps, b, d->g->stream);
    }
}

/* grads_ready: every gradient from flat index `from` up is final on the model's stream, so the buckets
 * that became final go to the sums stream (in descending order, the same on every rank); at the end
 * (from 0) of a micro-step that left its lookups out, they follow. ZeRO-2 does this every micro-step
 * and owes nothing afterwards (sent back to n_buckets); the shard is whole once sums_ev is reached. */
static void grads_ready(void *ctx, size_t from) {
    qt_dp_sync *d = ctx;
    int b = qt_shard_final_from(&d->ps->shard, from), lookups = from == 0 && d->lookups_due;
    if (b < d->early) b = d->early;
    if (b >= d->sent && !lookups) return;
    d->gsync->ready(d, b, lookups, from);
}

/* The whole array's sums: the buckets [b, sent) summed on the sums stream (descending), then the lookups when
 * due; the step's end (from 0) owes nothing more. Returns the sums stream. */
static cudaStream_t whole_ready_on(qt_dp_sync *d, int b, int lookups, size_t from) {
    cudaStream_t cs = sums_stream(d);
    while (d->sent > b) reduce_bucket(d, --d->sent, cs);
    if (lookups) add_lookups(d, cs);
    if (from == 0) d->sent = d->early = d->lookups_due = d->tail_done = 0;
    return cs;
}

static void whole_ready(qt_dp_sync *d, int b, int lookups, size_t from) { whole_ready_on(d, b, lookups, from); }

/* ZeRO-2/3: the slots made ready, summed into the shard; every micro-step owes nothing afterwards (sent back to
 * n_buckets), the shard whole once sums_ev is reached (overlapped). */
static void shard_ready(qt_dp_sync *d, int b, int lookups, size_t from) {
    slots_ready(d, b);
    cudaStream_t cs = whole_ready_on(d, b, lookups, from);
    if (from == 0) {
        d->sent = d->ps->shard.n_buckets;
        if (d->plan.parallel.overlap) QT_CUDA(cudaEventRecord(d->sums_ev, cs));
    }
}

static void host_ready(qt_dp_sync *d, int b, int lookups, size_t from) {
    (void)lookups, (void)from;
    host_grads_ready(d, b);
}

static void no_wait(qt_dp_sync *d) { (void)d; }

/* ZeRO-2 overlapped: the model's stream waits for the last micro-step's sums (its slots and shard). */
static void shard_wait(qt_dp_sync *d) {
    if (d->plan.parallel.overlap) QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->sums_ev, 0));
}

/* Offloaded gradients: the model's stream waits for the last micro-step's stores (its slots and the host
 * gradients). */
static void host_wait(qt_dp_sync *d) { QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->sums_ev, 0)); }

static void sums_wait(qt_dp_sync *d) { d->gsync->wait(d); }

static const grad_sync host_sync;

/* sums_wait before the norm and AdamW (a planted bug skips it with offloaded gradients). */
static void adamw_wait(qt_dp_sync *d) {
#ifdef QT_MUTANTS
    if (d->gsync == &host_sync && qt_mutant_on(QT_MUT_ADAMW_NO_STORE_WAIT)) return;
#endif
    sums_wait(d);
}

/* weights_needed: the model's stream waits for the gather of every bucket below flat index upto (one
 * event: the buckets are gathered in order on one stream). */
static void weights_wait(void *ctx, size_t upto) {
    qt_dp_sync *d = ctx;
    int k = qt_shard_needed(&d->ps->shard, upto);
    if (k <= d->gathered) return;
    QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->ag_ev[k - 1], 0));
    d->gathered = k;
}

/* Layer bucket b's small params (qt_small_params.h: norms and biases, bf16) as gathered over the ranks,
 * [n_ranks][small.packed[b]] (rank r's segments packed), in ps->e4m3.small_recv. */
static uint16_t *small_of(const qt_dp_sync *d, int b) {
    return (uint16_t *)d->ps->e4m3.small_recv + (size_t)b * d->ps->shard.n_ranks * d->ps->e4m3.small.max_packed;
}

/* ZeRO-3 e4m3 gathers: layer bucket b's small params all-gathered on s into small_of(b), once the pieces
 * changed (refresh_codes): this rank's segments packed from its piece w (device: the pieces, or the
 * copy refresh_codes made of offloaded ones; element off at w[0]). Every gather of the bucket then copies
 * them from there: no collective beside the gather's own (on the gather stream only a host-resident
 * all-gather may run, which uses no staging arena or one-shot kernel; comm.c). */
static void small_gather(qt_dp_sync *d, int b, const uint16_t *w, size_t off, cudaStream_t s) {
    qt_param_store *ps = d->ps;
    const qt_small_params *m = &ps->e4m3.small;
    int rank = d->plan.parallel.rank, n = ps->shard.n_ranks;
    size_t at = 0;
    for (int i = 0; i < m->n_seg[b * n + rank]; i++) {
        qt_flat_range g = m->seg[b * n + rank][i];
        QT_CUDA(cudaMemcpyAsync((uint16_t *)ps->e4m3.small_send + at, w + (g.off - off), g.len * 2, cudaMemcpyDeviceToDevice, s));
        at += g.len;
    }
    QT_CHECK(qt_comm_all_gather(d->comm, rank, small_of(d, b), ps->e4m3.small_send, (size_t)n * m->packed[b], QT_DT_BF16,
                                s) == 0,
             "rank %d: the small weights' all-gather of bucket %d aborted (another rank failed)", rank, b);
}

/* ZeRO-3: the pieces from the ranks' GPUs. */
static int gather_device(qt_dp_sync *d, void *dst, const void *mine, size_t n, cudaStream_t s) {
    return qt_comm_all_gather(d->comm, d->plan.parallel.rank, dst, mine, n, QT_DT_BF16, s);
}

/* ZeRO-3 with the pieces offloaded: every rank's copy engines pull them from the ranks' pinned host memory
 * (qt_comm_all_gather_host, the same for every transport: no peer kernel or host staging reads them). */
static int gather_host(qt_dp_sync *d, void *dst, const void *mine, size_t n, cudaStream_t s) {
    return qt_comm_all_gather_host(d->comm, d->plan.parallel.rank, dst, mine, n, QT_DT_BF16, s);
}

static const slot_fill fill_copy_up = {NULL, 1, 1}, fill_zero3 = {gather_device, 0, 0}, fill_zero3_host = {gather_host, 1, 2};

/* e4m3 weight codes (parallel.gather_dtype e4m3, memory.offload quants), a layer bucket b into a shared slot on
 * s. ZeRO-3: the block matrices' e4m3 codes into
 * dst8 (every rank's piece of the bucket's codes, two per bf16 element: pieces are multiples of 64), the
 * rest (qt_small_params.h) into dst in bf16: every rank's segments copied to their flat places from
 * small_of(b). The bf16 slot's matrix elements are left stale: nothing reads
 * them (the model takes the layer's Wq and Wq^T from dst8, qt_fp8_use_weights_e4m3). One GPU: the bucket's
 * codes and its small params' segments copied up from the host arrays (1 byte per matrix element instead of 2). */
static void fill_bucket8(qt_dp_sync *d, int b, void *dst, void *dst8, cudaStream_t s) {
    qt_param_store *ps = d->ps;
    const qt_shard *sh = &ps->shard;
    const qt_small_params *m = &ps->e4m3.small;
    size_t off, len, st, lo = sh->bucket[b], nb = sh->bucket[b + 1] - lo, P = m->packed[b];
    int rank = d->plan.parallel.rank, n = sh->n_ranks;
    qt_shard_piece(sh, b, &off, &len, &st);
    if (!d->wfill->gather) { /* one GPU (memory.offload quants): the codes, then the small params, copied up */
        QT_CUDA(cudaMemcpyAsync(dst8, ps->e4m3.w8 + st, nb, cudaMemcpyHostToDevice, s));
        for (int i = 0; i < m->n_seg[b]; i++) {
            qt_flat_range g = m->seg[b][i];
            QT_CUDA(cudaMemcpyAsync((uint16_t *)dst + (g.off - lo), (uint16_t *)ps->w + st + (g.off - off), g.len * 2,
                                    cudaMemcpyHostToDevice, s));
        }
        return;
    }
    const void *mine8 = ps->e4m3.w8 + st;
    int rc = d->wfill->gather(d, dst8, mine8, nb / 2, s);
    QT_CHECK(rc == 0, "rank %d: e4m3 weight all-gather of bucket %d aborted (another rank failed)", rank, b);
    const uint16_t *got = small_of(d, b);
    for (int r = 0; r < n; r++) {
        size_t at = 0;
        for (int i = 0; i < m->n_seg[b * n + r]; i++) {
            qt_flat_range g = m->seg[b * n + r][i];
            QT_CUDA(cudaMemcpyAsync((uint16_t *)dst + (g.off - lo), got + r * P + at, g.len * 2, cudaMemcpyDeviceToDevice, s));
            at += g.len;
        }
    }
}

/* parallel.gather_dtype e4m3: cnt block matrices (layer ml[j], matrix mk[j]) of layer bucket b, whose
 * piece this rank holds at flat [off, off + len), read from w[len] (bf16, device) and coded into w8[len]:
 * the rank's abs-maxes, their max over the ranks (the whole tensor's, exactly) into each weight scale
 * record, then the rank's codes of them (qt_quant_fp8_cur with that record: the scale and bytes the bf16
 * path's quantize of the whole matrix gives). Every rank makes the same calls (the same matrices: the
 * layout's). */
static void codes_of(qt_dp_sync *d, const int *ml, const int *mk, int cnt, size_t off, size_t len, const uint16_t *w,
                     uint8_t *w8, cudaStream_t s) {
    qt_param_store *ps = d->ps;
    qt_gpu_fp8 *f = d->g->fp8;
    size_t a[QT_FP8_NMM], z[QT_FP8_NMM], p0[64], p1[64];
    qt_zero(ps->e4m3.amax8, (size_t)cnt * 4, s);
    for (int j = 0; j < cnt; j++) {
        qt_small_matrices(d->L, ml[j], a, z);
        p0[j] = a[mk[j]] > off ? a[mk[j]] : off, p1[j] = z[mk[j]] < off + len ? z[mk[j]] : off + len;
        if (p0[j] < p1[j])
            qt_quant_amax(QT_DT_BF16, w + (p0[j] - off), (long)(p1[j] - p0[j]), ps->e4m3.amax8 + j, 1, s);
    }
    int local = 0; /* 1: each rank's own abs-max (a planted bug) */
#ifdef QT_MUTANTS
    local = qt_mutant_on(QT_MUT_E4M3_LOCAL_AMAX);
#endif
    if (!local && d->ps->shard.n_ranks > 1)
        QT_CHECK(qt_comm_all_reduce_scalars(d->comm, d->plan.parallel.rank, ps->e4m3.amax8, cnt, QT_COMM_MAX, s) == 0,
                 "rank %d: the weights' abs-max all-reduce aborted (another rank failed)", d->plan.parallel.rank);
    for (int j = 0; j < cnt; j++) {
        qt_fp8_scale *sc = qt_fp8_weight_scale(f, ml[j], (qt_fp8_mm)mk[j]);
        int tag = qt_fp8_weight_tag(ml[j], (qt_fp8_mm)mk[j]);
        QT_CUDA(cudaMemcpyAsync(&sc->amax, ps->e4m3.amax8 + j, 4, cudaMemcpyDeviceToDevice, s));
        if (p0[j] < p1[j])
            qt_quant_fp8_cur(QT_DT_E4M3, w8 + (p0[j] - off), QT_DT_BF16, w + (p0[j] - off), (long)(p1[j] - p0[j]), sc,
                             f->nonfinite, tag, s);
        else qt_quant_scale(QT_DT_E4M3, sc, f->nonfinite, tag, s);
    }
}

/* The codes of layer bucket b's matrices (those of the layers that start their matrices in b: a layer
 * bucket holds them whole), in chunks of at most 64 (qt_comm_all_reduce_scalars), after the rank's pieces
 * changed (AdamW, a load). Pieces in pinned host memory (offloaded weights) are copied up into shared slot
 * 0 (invalidated, and s follows its last readers and gathers: gathers_join), coded there and the codes
 * copied down: copy engines at the PCIe rate, where kernels reading and writing through the mapping run
 * at ~3 GB/s with four GPUs (3.3 s of a 14B box step). The same kernels on the same values: the same
 * codes. */
static void refresh_codes(qt_dp_sync *d, int b, cudaStream_t s) {
    const qt_layout *L = d->L;
    qt_param_store *ps = d->ps;
    size_t off, len, st, lo = ps->shard.bucket[b], hi = ps->shard.bucket[b + 1];
    int ml[64], mk[64], cnt = 0, staged = d->wfill->staged;
    qt_shard_piece(&ps->shard, b, &off, &len, &st);
    const uint16_t *w = (const uint16_t *)ps->w + st;
    uint8_t *w8 = ps->e4m3.w8 + st;
    if (staged && len) {
        size_t room, room8;
        void *c8;
        uint16_t *up = qt_wslots_scratch(ps->wslots, &room, &c8, &room8);
        QT_CHECK(len * 2 <= room && len <= room8, "rank %d: bucket %d's piece of %zu elements does not fit the weight slot's "
                 "%zu / %zu bytes", d->plan.parallel.rank, b, len, room, room8);
        int not_up = 0;
#ifdef QT_MUTANTS
        not_up = qt_mutant_on(QT_MUT_E4M3_PIECE_NOT_UP);
#endif
        if (!not_up) QT_CUDA(cudaMemcpyAsync(up, w, len * 2, cudaMemcpyHostToDevice, s));
        QT_CUDA(cudaMemcpyAsync(c8, w8, len, cudaMemcpyHostToDevice, s)); /* what no matrix covers stays as it was */
        w = up, w8 = c8;
    }
    for (int l = 0; l < L->cfg.num_layers; l++) {
        if (L->layers[l].wqkv < lo || L->layers[l].wqkv >= hi) continue;
        for (int k = 0; k < QT_FP8_NMM; k++) ml[cnt] = l, mk[cnt++] = k;
        if (cnt + QT_FP8_NMM > 64) codes_of(d, ml, mk, cnt, off, len, w, w8, s), cnt = 0;
    }
    if (cnt) codes_of(d, ml, mk, cnt, off, len, w, w8, s);
    if (staged && len) QT_CUDA(cudaMemcpyAsync(ps->e4m3.w8 + st, w8, len, cudaMemcpyDeviceToHost, s));
    if (d->wfill->gather) small_gather(d, b, w, off, s); /* ZeRO-3 */
}

/* Bucket b's whole bf16 weights into dst on s: ZeRO-3 all-gathers every rank's piece of it (offloaded
 * pieces, weights_shard_host: every rank's copy engines pull them from the ranks' pinned host memory,
 * qt_comm_all_gather_host, the same for every transport: no peer kernel or host staging reads them);
 * offloaded weights (one GPU) are one H2D copy of the bucket from the pinned host array. */
static void fill_bucket(qt_dp_sync *d, int b, void *dst, void *dst8, cudaStream_t s) {
    const qt_shard *sh = &d->ps->shard;
    if (dst8 && d->ps->e4m3.small.layer_bucket[b]) {
        fill_bucket8(d, b, dst, dst8, s);
        return;
    }
    size_t off, len, st, n = sh->bucket[b + 1] - sh->bucket[b];
    int rank = d->plan.parallel.rank;
    qt_shard_piece(sh, b, &off, &len, &st);
    if (!d->wfill->gather) {
        QT_CUDA(cudaMemcpyAsync(dst, (uint16_t *)d->ps->w + st, n * 2, cudaMemcpyHostToDevice, s));
        return;
    }
#ifdef QT_MUTANTS
    int stale = qt_mutant_on(QT_MUT_Z3_STALE_FILL) && d->wfill->staged;
    if (stale && stale_fill(d, b, dst, s)) return;
#endif
    const void *mine = (uint16_t *)d->ps->w + st;
    int rc = d->wfill->gather(d, dst, mine, n, s);
    QT_CHECK(rc == 0,
             "rank %d: weight all-gather of bucket %d aborted (another rank failed)", rank, b);
#ifdef QT_MUTANTS
    if (stale) stale_keep(d, b, dst, n, s);
#endif
}

/* ZeRO-3 / offloaded weights: a shared weight slot's fill (wslots.io.gather), delayed on the side stream by
 * the test hook dp_ag_delay_ms. */
static void z3_gather(void *ctx, int b, void *dst, void *dst8, cudaStream_t s) {
    qt_dp_sync *d = ctx;
    QT_CHECK(!(d->plan.parallel.rank == d->test.fail_rank && ++d->test.gathers == d->test.fail_gather),
             "injected failure (test hook dp_fail_gather) instead of weight gather %ld (bucket %d)", d->test.fail_gather, b);
    if (d->test.ag_delay_ms && s == d->wslots.io.side && s != d->wslots.io.model) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
    fill_bucket(d, b, dst, dst8, s);
}

/* ZeRO-3 hooks: the forward reads the weights below upto (the unit ending there: its home bucket), the
 * backward the unit starting at from; the weight slots gather, wait and prefetch (qt_wslots_acquire). */
static void z3_gather_own(qt_dp_sync *d, int k0, int k1, cudaStream_t s);
static void z3_forward(void *ctx, size_t upto) {
    qt_dp_sync *d = ctx;
    if (d->wslots.own_due) z3_gather_own(d, 0, d->ps->shard.n_buckets, d->g->stream);
    qt_wslots_acquire(d->ps->wslots, &d->wslots.io, qt_wslots_home(d->ps->wslots, upto ? upto - 1 : 0), +1);
}
static void z3_backward(void *ctx, size_t from) {
    qt_dp_sync *d = ctx;
    qt_wslots_acquire(d->ps->wslots, &d->wslots.io, qt_wslots_home(d->ps->wslots, from), -1);
}

/* ZeRO-3 / offloaded weights: the buckets [k0, k1) with slots of their own gathered (copied up) on s
 * (the others are filled when the model acquires them); from bucket 0 on, no shared slot holds valid
 * weights any more. The gather stream then follows s: its next gathers read the codes made here and may
 * fill the shared slot the codes were made in. */
static void z3_gather_own(qt_dp_sync *d, int k0, int k1, cudaStream_t s) {
    qt_weight_slots *ws = d->ps->wslots;
    const qt_shard *sh = &d->ps->shard;
    if (k0 == 0) {
        gathers_join(d, s);
        qt_wslots_invalidate(ws);
    }
    if (k1 == sh->n_buckets) d->wslots.own_due = 0;
    /* e4m3 gathers: the layer buckets' codes from the changed pieces */
    int kept = 0; /* 1: the codes made once are kept (a planted bug) */
#ifdef QT_MUTANTS
    kept = qt_mutant_on(QT_MUT_E4M3_CODES_ONCE) && d->mut.codes_made;
    if (k1 == sh->n_buckets) d->mut.codes_made = 1;
#endif
    for (int k = k0; d->plan.weights.e4m3 && k < k1 && !kept; k++)
        if (d->ps->e4m3.small.layer_bucket[k]) refresh_codes(d, k, s);
    for (int k = k0; k < k1; k++) {
        if (!qt_wslots_own(ws, k)) continue;
        fill_bucket(d, k, qt_wslots_own_data(ws, k), NULL, s);
        qt_wslots_filled(ws, k, s);
    }
    if (d->wslots.gside) follow(d->wslots.gside, s, d->wslots.gside_ev);
}

void qt_dp_sync_reload(qt_dp_sync *d) {
    if (!d->plan.weights.slots) return;
    qt_wslots_invalidate(d->ps->wslots);
    d->wslots.own_due = 1;
}

void qt_dp_sync_inputs(qt_dp_sync *d) { sums_wait(d); }

void qt_dp_sync_join(qt_dp_sync *d) {
    if (d->plan.weights.slots && d->wslots.io.side != d->wslots.io.model) { /* the own slots' gathers and the codes on the side stream,
                                                          * the shared slots' on the gather stream */
        follow(d->g->stream, d->side, d->side_ev);
        gathers_join(d, d->g->stream);
    } else if (d->plan.weights.ahead) {
        weights_wait(d, SIZE_MAX);
    }
    adamw_wait(d);
}

const qt_param_hooks *qt_dp_sync_wait_hooks(qt_dp_sync *d) { return &d->wait_hooks; }

int qt_dp_sync_idle(const qt_dp_sync *d) { return d->sent == d->ps->shard.n_buckets && !d->lookups_due; }

/* Adds a captured graph as the next segment; an empty one only moves the previous segment's cut down
 * (a pending wait stays with the next segment). */
static void add_segment(graph_set *gs, cudaGraph_t graph, size_t from) {
    size_t nodes = 0;
    QT_CUDA(cudaGraphGetNodes(graph, NULL, &nodes));
    if (nodes) {
        QT_CHECK(gs->n < gs->cap, "a micro-step cut into more than %d graph segments", gs->cap);
        QT_CUDA(cudaGraphInstantiate(&gs->seg[gs->n].exec, graph, 0));
        gs->seg[gs->n].wait = gs->wait;
        gs->seg[gs->n++].from = from;
        gs->wait = 0;
    } else if (from != NO_CUT && gs->n) {
        gs->seg[gs->n - 1].from = from;
    }
    QT_CUDA(cudaGraphDestroy(graph));
}

/* Ends the segment being captured (and starts the next): after it, gradients from `from` up are final. */
static void cut(qt_dp_sync *d, size_t from) {
    cudaGraph_t graph;
    QT_CUDA(cudaStreamEndCapture(d->g->stream, &graph));
    add_segment(d->capture, graph, from);
    QT_CUDA(cudaStreamBeginCapture(d->g->stream, cudaStreamCaptureModeThreadLocal));
}

/* The hooks while capturing: cut there. */
static void cut_grads(void *ctx, size_t from) { cut(ctx, from); }
static void cut_embed(void *ctx) { cut(ctx, EMBED_CUT); }
static void cut_weights(void *ctx, size_t upto) {
    qt_dp_sync *d = ctx;
    cut(d, NO_CUT);
    if (upto > d->capture->wait) d->capture->wait = upto;
}

/* Captures kind's graph set at loss scale `scale` (a new loss scale, or a new packed-document mode, means new
 * graphs; the documents' bounds and positions are device arrays the graphs read, refilled between replays). */
static void capture(qt_dp_sync *d, graph_set *gs, const qt_gpu_step_args *a, int kind) {
    qt_gpu_model *g = d->g;
    int early = (kind & (MS_SUMS | MS_LOOKUPS)) == (MS_SUMS | MS_LOOKUPS);
    for (int k = 0; k < gs->n; k++) QT_CUDA(cudaGraphExecDestroy(gs->seg[k].exec));
    gs->n = 0;
    gs->wait = 0;
    d->capture = gs;
    qt_param_hooks h = {.weights_needed = kind & MS_WAITS ? cut_weights : NULL, .grads_ready = kind & MS_SUMS ? cut_grads : NULL,
                        .embed_ready = early ? cut_embed : NULL, .ctx = d};
    qt_gpu_step_args ca = *a;
    ca.hooks = &h;
    cudaGraph_t graph;
    QT_CUDA(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    qt_gpu_model_step(g, &ca);
    QT_CUDA(cudaStreamEndCapture(g->stream, &graph));
    add_segment(gs, graph, NO_CUT);
    gs->scale = a->loss_scale;
    gs->docs = qt_gpu_model_docs_mode(g);
}

void qt_dp_sync_micro_step(qt_dp_sync *d, float scale, int last, int eager) {
    const qt_plan *p = &d->plan;
    if (d->gsync->every_micro) last = 1;
    if (d->gsync->before) d->gsync->before(d);
    int kind = (last && (p->parallel.overlap || d->gsync->every_micro) ? MS_SUMS : 0) | (last && p->parallel.lookups ? MS_LOOKUPS : 0) |
               (d->gathered < d->ps->shard.n_buckets ? MS_WAITS : 0);
    int early = (kind & (MS_SUMS | MS_LOOKUPS)) == (MS_SUMS | MS_LOOKUPS); /* the embeddings' bucket summed early */
    qt_gpu_step_args a = {scale, 1, (kind & MS_LOOKUPS) != 0, NULL};
    d->lookups_due = a.skip_lookups;
    QT_CHECK(eager || !p->weights.slots, "ZeRO-3 and offloaded-weight micro-steps run eagerly (perf.cuda_graphs is refused with "
             "parallel.zero: 3 and memory.offload: [weights])");
    if (eager) {
        qt_param_hooks h = {.weights_needed = p->weights.slots ? z3_forward : p->weights.ahead ? weights_wait : NULL,
                            .grads_ready = kind & MS_SUMS ? grads_ready : NULL, .embed_ready = early ? send_embedding : NULL,
                            .ctx = d, .weights_back = p->weights.slots ? z3_backward : NULL};
        a.hooks = &h;
        qt_gpu_model_step(d->g, &a);
        return;
    }
    graph_set *gs = &d->graphs[kind];
    if (!gs->n || gs->scale != scale || gs->docs != qt_gpu_model_docs_mode(d->g)) capture(d, gs, &a, kind);
    for (int k = 0; k < gs->n; k++) {
        if (gs->seg[k].wait) weights_wait(d, gs->seg[k].wait);
        QT_CUDA(cudaGraphLaunch(gs->seg[k].exec, d->g->stream));
        if (gs->seg[k].from == EMBED_CUT) send_embedding(d);
        else if (gs->seg[k].from != NO_CUT) grads_ready(d, gs->seg[k].from);
    }
}

void qt_dp_sync_forward_rows(qt_dp_sync *d) {
    const char *no = qt_plan_rows_refusal(&d->plan);
    QT_CHECK(!no, "objective: dpo with full fine-tuning on the GPU: %s is not yet supported", no);
    qt_gpu_step_args a = {0.0f, 0, 0, &d->wait_hooks};
    qt_gpu_model_step(d->g, &a);
}

/* As qt_dp_sync_micro_step's eager branch, after the forward: the same hooks, the backward only. */
void qt_dp_sync_backward_rows(qt_dp_sync *d, const float *row_scale, int last) {
    const qt_plan *p = &d->plan;
    int kind = (last && p->parallel.overlap ? MS_SUMS : 0) | (last && p->parallel.lookups ? MS_LOOKUPS : 0);
    int early = (kind & (MS_SUMS | MS_LOOKUPS)) == (MS_SUMS | MS_LOOKUPS);
    qt_param_hooks h = {.weights_needed = p->weights.ahead ? weights_wait : NULL, .grads_ready = kind & MS_SUMS ? grads_ready : NULL,
                        .embed_ready = early ? send_embedding : NULL, .ctx = d};
    qt_gpu_step_args a = {0.0f, 1, (kind & MS_LOOKUPS) != 0, &h};
    d->lookups_due = a.skip_lookups;
    qt_gpu_model_backward_rows_with(d->g, row_scale, &a);
}

/* Offloaded gradients: stored to host during the micro-steps; the own slots zeroed for the next step. */
static void host_reduce(qt_dp_sync *d) {
    qt_param_store *ps = d->ps;
    adamw_wait(d);
    for (int b = 0; b < ps->shard.n_buckets; b++)
        if (qt_param_grad_slot_shared(ps, b) < 0) qt_param_grad_slot_zero(ps, b, d->g->stream);
    d->host_grads.grad_micro = 0;
}

/* ZeRO-2/3: summed into the shard during the micro-steps. */
static void shard_reduce(qt_dp_sync *d) { sums_wait(d); }

/* Ranks with the whole array: the sums handed to the side stream by the last backward, or all of them now. */
static void whole_reduce(qt_dp_sync *d) {
    const qt_shard *sh = &d->ps->shard;
    cudaStream_t s = d->g->stream;
    if (d->sent < sh->n_buckets) {
        QT_CHECK(d->sent == 0, "rank %d: the backward handed over buckets %d.. of %d only", d->plan.parallel.rank, d->sent,
                 sh->n_buckets);
        QT_CUDA(cudaEventRecord(d->side_ev, d->side));
        QT_CUDA(cudaStreamWaitEvent(s, d->side_ev, 0));
    } else {
        qt_gpu_model_mark(d->g, "optimizer: gradient sum");
        for (int b = sh->n_buckets - 1; b >= 0; b--) reduce_bucket(d, b, s);
        if (d->lookups_due) add_lookups(d, s); /* as the overlapped sums do: the same bits */
        d->lookups_due = 0;
    }
    d->sent = sh->n_buckets;
}

/* One GPU: nothing to sum. */
static void one_reduce(qt_dp_sync *d) { (void)d; }

static void slot_events_init(qt_dp_sync *d) {
    for (int k = 0; k < QT_GRAD_SLOTS; k++) QT_CUDA(cudaEventCreateWithFlags(&d->slot_ev[k], cudaEventDisableTiming));
    QT_CUDA(cudaEventCreateWithFlags(&d->sums_ev, cudaEventDisableTiming));
}

static void slot_events_fini(qt_dp_sync *d) {
    for (int k = 0; k < QT_GRAD_SLOTS; k++) QT_CUDA(cudaEventDestroy(d->slot_ev[k]));
    QT_CUDA(cudaEventDestroy(d->sums_ev));
}

static void host_init(qt_dp_sync *d) {
    slot_events_init(d);
    QT_CUDA(cudaStreamCreateWithFlags(&d->host_grads.gup, cudaStreamNonBlocking));
    for (int k = 0; k < QT_GRAD_SLOTS; k++) QT_CUDA(cudaEventCreateWithFlags(&d->host_grads.stored_ev[k], cudaEventDisableTiming));
    QT_CUDA(cudaEventCreateWithFlags(&d->host_grads.gup_ev, cudaEventDisableTiming));
}

static void host_fini(qt_dp_sync *d) {
    slot_events_fini(d);
    QT_CUDA(cudaStreamSynchronize(d->host_grads.gup));
    QT_CUDA(cudaStreamDestroy(d->host_grads.gup));
    for (int k = 0; k < QT_GRAD_SLOTS; k++) QT_CUDA(cudaEventDestroy(d->host_grads.stored_ev[k]));
    QT_CUDA(cudaEventDestroy(d->host_grads.gup_ev));
}

static const grad_sync one_sync = {whole_ready, NULL, one_reduce, no_wait, NULL, NULL, 0, 0, 0};
static const grad_sync whole_sync = {whole_ready, NULL, whole_reduce, no_wait, NULL, NULL, 0, 0, 0};
static const grad_sync shard_sync = {shard_ready, NULL, shard_reduce, shard_wait, slot_events_init, slot_events_fini, 1, 1, 0};
static const grad_sync host_sync = {host_ready, host_grads_load, host_reduce, host_wait, host_init, host_fini, 1, 0, 1};

/* Gradients summed over the ranks (data parallel; already on the side stream when the last micro-step
 * handed the buckets over), then the norm and clip scale. Sharded (ZeRO-1): each rank has the sums of
 * its pieces only; the norm adds every rank's pieces' sums of squares in order. */
void qt_dp_sync_reduce(qt_dp_sync *d) {
    qt_gpu_model *g = d->g;
    qt_param_store *ps = d->ps;
    const qt_shard *sh = &ps->shard;
    cudaStream_t s = g->stream;
    int rank = d->plan.parallel.rank;
    d->gsync->reduce(d);
    for (int b = 0; b < sh->n_buckets; b++) qt_param_grad_piece_fresh(ps, b, s); /* a piece no sum wrote: zeros */
    qt_gpu_model_mark(g, "optimizer: gradient norm");
    if (d->world_sumsq) {
        qt_dp_nodes_norm(ps, d->comm, rank, d->plan.parallel.nodes, d->world_sumsq, d->grad_clip, g->ws, s);
        return;
    }
    if (sh->n_ranks == 1) {
        qt_grad_norm(ps->norm, ps->clip, ps->grad, ps->grad_dt, sh->total, d->grad_clip, g->ws, s);
        return;
    }
    int nb = sh->n_buckets;
    double *mine = ps->sumsq + (size_t)sh->rank * nb;
    for (int b = 0; b < nb; b++) {
        size_t off, len, st;
        qt_shard_piece(sh, b, &off, &len, &st);
        qt_grad_sumsq(mine + b, qt_param_grad_piece(ps, b), ps->grad_dt, len, g->ws, s);
    }
    /* every rank's fp64 sums (two fp32 words each), gathered in place */
    QT_CHECK(qt_comm_all_gather(d->comm, rank, ps->sumsq, mine, 2 * (size_t)nb * sh->n_ranks, QT_DT_F32, s) == 0,
             "rank %d: gradient norm all-gather aborted (another rank failed)", rank);
    qt_clip_from_sumsq(ps->norm, ps->clip, ps->sumsq, sh->n_ranks * nb, d->grad_clip, s);
}

cudaStream_t qt_dp_sync_opt_stream(qt_dp_sync *d) {
    if (!d->plan.optimizer.ahead) return d->g->stream;
    side_follows(d);
    return d->side;
}

/* The bf16 weights after AdamW of buckets [k0, k1): a sharded rank all-gathers every rank's pieces
 * bucket by bucket, then the fp8 quants of the layers each bucket completes follow. With
 * plan.weights.ahead this runs on the side stream, each bucket's event recorded for the next forward
 * (weights_wait); else on the model's. One GPU (no gather): only with opt_ahead, for the quants and
 * the events. */
void qt_dp_sync_release(qt_dp_sync *d, int k0, int k1) {
    qt_gpu_model *g = d->g;
    const qt_shard *sh = &d->ps->shard;
    const qt_layout *L = d->L;
    int ahead = d->plan.weights.ahead, nl = L->cfg.num_layers, ql = 0, rank = d->plan.parallel.rank;
    if (sh->n_ranks == 1 && !d->plan.optimizer.ahead && !d->plan.weights.slots) return;
    cudaStream_t s = ahead ? d->side : g->stream;
    if (d->plan.weights.slots) { /* no whole weights to gather into (or none on the GPU): the own slots only */
        if (sh->n_ranks > 1) qt_gpu_model_mark(g, "optimizer: weight all-gather"); /* and the codes */
        if (ahead) side_follows(d);
        if (ahead && k0 == 0 && d->test.ag_delay_ms) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
        z3_gather_own(d, k0, k1, s);
        return;
    }
    while (ql < nl && qt_layer_end(L, ql) <= sh->bucket[k0]) ql++; /* quantized with an earlier bucket */
    if (sh->n_ranks > 1) qt_gpu_model_mark(g, "optimizer: weight all-gather"); /* and the codes */
    if (ahead) {
        side_follows(d);
        if (k0 == 0 && d->test.ag_delay_ms) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
        if (k0 == 0) d->gathered = 0;
    }
    for (int k = k0; k < k1; k++) {
        size_t lo = sh->bucket[k], hi = sh->bucket[k + 1], off, len, st;
        qt_shard_piece(sh, k, &off, &len, &st);
        QT_CHECK(sh->n_ranks == 1 || qt_comm_all_gather(d->comm, rank, (uint16_t *)d->ps->w + lo,
                                                        (uint16_t *)d->ps->w + off, hi - lo, QT_DT_BF16, s) == 0,
                 "rank %d: weight all-gather aborted (another rank failed)", rank);
        int l1 = ql; /* the layers now whole */
        while (l1 < nl && qt_layer_end(L, l1) <= hi) l1++;
        if (d->plan.precision.fp8 && l1 > ql) qt_fp8_quantize_weights(g->fp8, L, d->ps->w, ql, l1, s);
        ql = l1;
        if (ahead) QT_CUDA(cudaEventRecord(d->ag_ev[k], s));
    }
}

qt_dp_sync *qt_dp_sync_create(qt_gpu_model *g, const qt_plan *p, qt_comm *comm, qt_internode *nodes,
                              const qt_test_hooks *th) {
    qt_dp_sync *d = calloc(1, sizeof *d);
    QT_CHECK(d, "out of host memory");
    const qt_shard *sh = &g->ps->shard;
    int nl = g->L->cfg.num_layers;
    *d = (qt_dp_sync){.g = g, .ps = g->ps, .L = g->L, .plan = *p, .grad_clip = p->optimizer.grad_clip, .comm = comm, .nodes = nodes,
                      .sent = sh->n_buckets, .gathered = sh->n_buckets, .test.ag_delay_ms = th->dp_ag_delay_ms,
                      .test.sum_delay_ms = th->dp_sum_delay_ms,
                      .test.read_delay_ms = th->zero3_read_delay_ms, .test.fail_rank = th->dp_fail_gather > 0 ? th->dp_fail_rank : -1,
                      .test.fail_gather = th->dp_fail_gather};
    d->gsync = p->grads.host_one ? &host_sync : p->grads.sharded ? &shard_sync : p->parallel.dp != QT_DP_ONE ? &whole_sync : &one_sync;
    d->wfill = !p->weights.slots ? NULL : p->weights.host_one ? &fill_copy_up : p->weights.host_shard ? &fill_zero3_host : &fill_zero3;
    d->wait_hooks = (qt_param_hooks){.weights_needed = p->weights.slots ? z3_forward : p->weights.ahead ? weights_wait : NULL,
                                     .ctx = d};
    /* The side stream has default priority: with a high one the bucket sums' kernels take SMs ahead of
     * the backward's, and steps on 2 x H200 are slower. */
    if (p->parallel.world_pieces)
        QT_CUDA(cudaMalloc((void **)&d->world_sumsq, (size_t)p->parallel.nodes * sh->n_ranks * sh->n_buckets * sizeof(double)));
    if (p->perf.side_stream) {
        QT_CUDA(cudaStreamCreateWithFlags(&d->side, cudaStreamNonBlocking));
        QT_CUDA(cudaEventCreateWithFlags(&d->side_ev, cudaEventDisableTiming));
    }
    if (d->gsync->init) d->gsync->init(d);
    if (p->weights.ahead) {
        d->ag_ev = calloc((size_t)sh->n_buckets, sizeof *d->ag_ev);
        QT_CHECK(d->ag_ev, "out of host memory");
        for (int k = 0; k < sh->n_buckets; k++) QT_CUDA(cudaEventCreateWithFlags(&d->ag_ev[k], cudaEventDisableTiming));
    }
    if (p->weights.slots) { /* the own slots are filled from the initial pieces at the first forward; offloaded
                      * weights always prefetch (copy up) on the gather stream */
        /* a stream of their own only where a gather is copies from pinned host memory (offloaded pieces:
         * qt_comm_all_gather_host; one GPU: H2D copies): a staged or one-shot collective must not run beside
         * another on a second stream (comm.c orders them by the caller's stream). Ranks prefetch only with
         * parallel.overlap_comm. */
        if (d->wfill->gside == 1 || (d->wfill->gside == 2 && p->parallel.overlap)) {
            QT_CUDA(cudaStreamCreateWithFlags(&d->wslots.gside, cudaStreamNonBlocking));
            QT_CUDA(cudaEventCreateWithFlags(&d->wslots.gside_ev, cudaEventDisableTiming));
        }
        d->wslots.io = (qt_wslots_io){z3_gather, d, g->stream, d->wslots.gside ? d->wslots.gside : p->parallel.overlap ? d->side : g->stream,
                               &d->test.read_delay_ms};
        d->wslots.own_due = 1;
    }
    for (int i = 0; i < MS_KINDS; i++) { /* MS_WAITS cuts before the embeddings, each layer and the final
                                          * norm; MS_SUMS after the LM head, final norm, each layer and the embeddings */
        d->graphs[i].cap = 1 + (i & MS_WAITS ? nl + 2 : 0) + (i & MS_SUMS ? nl + 3 : 0);
        d->graphs[i].seg = calloc((size_t)d->graphs[i].cap, sizeof *d->graphs[i].seg);
        QT_CHECK(d->graphs[i].seg, "out of host memory");
    }
    return d;
}

void qt_dp_sync_free(qt_dp_sync *d) {
    if (!d) return;
    if (d->plan.perf.side_stream) {
        QT_CUDA(cudaStreamSynchronize(d->side));
        QT_CUDA(cudaStreamDestroy(d->side));
        QT_CUDA(cudaEventDestroy(d->side_ev));
    }
    if (d->wslots.gside) {
        QT_CUDA(cudaStreamSynchronize(d->wslots.gside));
        QT_CUDA(cudaStreamDestroy(d->wslots.gside));
        QT_CUDA(cudaEventDestroy(d->wslots.gside_ev));
    }
    for (int k = 0; d->plan.weights.ahead && k < d->ps->shard.n_buckets; k++) QT_CUDA(cudaEventDestroy(d->ag_ev[k]));
    if (d->gsync->fini) d->gsync->fini(d);
    free(d->ag_ev);
    if (d->world_sumsq) QT_CUDA(cudaFree(d->world_sumsq));
#ifdef QT_MUTANTS
    mutants_free(d);
#endif
    for (int i = 0; i < MS_KINDS; i++) {
        for (int k = 0; k < d->graphs[i].n; k++) QT_CUDA(cudaGraphExecDestroy(d->graphs[i].seg[k].exec));
        free(d->graphs[i].seg);
    }
    free(d);
}
