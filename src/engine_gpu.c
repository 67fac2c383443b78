/* engine_gpu.c — one GPU's engine: token upload, micro-steps (optionally replayed from a CUDA graph),
 * the optimizer step with the one host read per step, and checkpoint state. As a rank of the
 * data-parallel engine (engine_dp.c) it sums the gradients over the ranks before the optimizer, bucket
 * by bucket (qt_partition.h). With parallel.overlap_comm the last micro-step of a step hands each
 * bucket to a comm stream as soon as the backward has finished it, and a sharded rank's weight
 * all-gather after AdamW runs on that stream while the next micro-step's forward waits for each bucket
 * just before its layers (the micro-step's CUDA graph is cut into segments at those points, the sums
 * enqueued and the waits made between their launches). A sharded step's last micro-step leaves its
 * embedding lookups out of the backward where they are fewer bytes than the table (g->lookups): the
 * embeddings' bucket is summed right after the LM head, and every rank's lookups are added to the sums
 * afterwards (add_lookups), overlapped or not, so the bits are the same either way. One GPU with its
 * optimizer state offloaded (memory.offload_optimizer) runs AdamW itself on the comm stream, bucket by
 * bucket, with the same per-bucket waits in the next forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_comm.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"

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
} graph_set;

/* Micro-step kinds, the graph_set index: the last of a step, whose bucket sums overlap the backward;
 * the first after an overlapped weight all-gather, whose forward waits for it bucket by bucket; the
 * last of a sharded step, which leaves its embedding lookups out (add_lookups adds every rank's). */
enum { MS_SUMS = 1, MS_WAITS = 2, MS_LOOKUPS = 4, MS_KINDS = 8 };

typedef struct {
    qt_engine base;
    qt_gpu_model *g;
    int32_t *pin[2];        /* pinned token staging [2][tok | tgt], alternated */
    cudaEvent_t pin_free[2]; /* recorded after the upload that read pin[k] */
    int k;
    long valid_total;       /* targets >= 0 since the last opt_step */
    struct { double loss; float norm; int nonfinite; } *out; /* pinned: the one read per optimizer step */
    void *host_state[4];    /* state_items' host copies (owned) */
    graph_set graphs[MS_KINDS]; /* by micro-step kind (MS_*) */
    graph_set *capture;     /* the set being captured */
    int micro_done;
    qt_comm *comm;          /* data-parallel rank: gradients are summed over comm before the norm */
    int rank;
    cudaStream_t comm_stream; /* the buckets summed while the backward runs (owned, with comm_ev) */
    cudaEvent_t comm_ev;
    int sent;               /* lowest bucket handed to comm_stream this step (n_buckets: none) */
    int early;              /* buckets [0, early) handed over right after the LM head (embeddings only) */
    int lookups_due;        /* the last micro-step left its lookups out: add_lookups before the norm */
    cudaEvent_t *ag_ev;     /* [n_buckets] bucket k's weights all-gathered on comm_stream (owned; overlap, sharded) */
    int gathered;           /* buckets whose all-gather the model's stream waits for (n_buckets: none pending) */
    long ag_delay_ms;       /* test hook QT_DP_AG_DELAY_MS: the comm stream sleeps before each weight all-gather */
    int micro_in_step;      /* micro-steps since the last opt_step */
    double last_loss_sum;   /* the last opt_step's loss sum and target count, for the ranks' mean */
    long last_valid;
} gpu_engine;

/* Host -> pinned -> device without racing an upload still in flight from the same pinned buffer. */
static long upload(gpu_engine *e, const int32_t *in, const int32_t *tgt) {
    qt_gpu_model *g = e->g;
    int k = e->k ^= 1;
    QT_CUDA(cudaEventSynchronize(e->pin_free[k]));
    int32_t *p = e->pin[k];
    long n = g->N, valid = 0;
    memcpy(p, in, n * 4);
    if (tgt) {
        memcpy(p + n, tgt, n * 4);
        for (long i = 0; i < n; i++) valid += tgt[i] >= 0;
    } else {
        memset(p + n, 0xff, n * 4); /* all ignored */
    }
    QT_CUDA(cudaMemcpyAsync(g->tok, p, n * 4, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaMemcpyAsync(g->tgt, p + n, n * 4, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaEventRecord(e->pin_free[k], g->stream));
    return valid;
}

/* Sums bucket b over the ranks on stream s: all of it (replicated optimizer state) or this rank's piece
 * (sharded). With parallel.reduce_dtype bf16 the sum travels in the bf16 weight buffer: nothing reads a
 * finished bucket's weights before AdamW, which rewrites every parameter of the rank's pieces (the
 * all-gather the rest), and its gaps and tail stay zero because the gradient's are. */
static void reduce_bucket(gpu_engine *e, int b, cudaStream_t s) {
    qt_gpu_model *g = e->g;
    const qt_shard *sh = &g->shard;
    int half = e->base.cfg->reduce_dtype == QT_DT_BF16;
    qt_dtype dt = half ? QT_DT_BF16 : QT_DT_F32;
    size_t es = qt_dtype_size(dt), lo = sh->bucket[b], count = sh->bucket[b + 1] - lo, off = lo, len = count, st;
    char *buf = half ? (char *)g->w : (char *)g->grad;
    if (half) qt_cast_f32_to_bf16((uint16_t *)g->w + lo, g->grad + lo, count, s);
    if (sh->n_ranks == 1) {
        QT_CHECK(qt_comm_all_reduce(e->comm, e->rank, buf + lo * es, buf + lo * es, count, dt, s) == 0,
                 "rank %d: gradient all-reduce aborted (another rank failed)", e->rank);
    } else {
        qt_shard_piece(sh, b, &off, &len, &st);
        QT_CHECK(qt_comm_reduce_scatter(e->comm, e->rank, buf + off * es, buf + lo * es, count, dt, s) == 0,
                 "rank %d: gradient reduce-scatter aborted (another rank failed)", e->rank);
    }
    if (half) qt_cast_bf16_to_f32(g->grad + off, (uint16_t *)g->w + off, len, s);
}

/* The comm stream continues after what the model's stream has enqueued so far. */
static void comm_follows(gpu_engine *e) {
    QT_CUDA(cudaEventRecord(e->comm_ev, e->g->stream));
    QT_CUDA(cudaStreamWaitEvent(e->comm_stream, e->comm_ev, 0));
}

/* The model's embed_ready hook (sharded, last micro-step): the buckets of embeddings only are final
 * but for this micro-batch's lookups, which add_lookups adds later, so they are summed now, while the
 * whole backward still runs: that bucket is the largest (27% of Qwen2.5-0.5B with its tied LM head). */
static void send_embedding(void *ctx) {
    gpu_engine *e = ctx;
    const qt_shard *sh = &e->g->shard;
    int k = 0;
    while (k < sh->n_buckets && sh->bucket[k + 1] <= e->base.L->layers[0].ln1) k++;
    if (!k) return;
    comm_follows(e);
    for (int b = 0; b < k; b++) reduce_bucket(e, b, e->comm_stream);
    e->early = k;
}

/* Adds this micro-step's embedding lookups of every rank, in rank order, to this rank's pieces of the
 * embedding gradient (already summed without them): the tokens and the residual gradient at the
 * embeddings (N x C, a fraction of the table) are all-gathered instead of the table's gradient. */
static void add_lookups(gpu_engine *e, cudaStream_t cs) {
    qt_gpu_model *g = e->g;
    const qt_shard *sh = &g->shard;
    const qt_model_cfg *c = &e->base.L->cfg;
    size_t n = (size_t)sh->n_ranks, N = (size_t)g->N, C = (size_t)c->hidden_size, end = e->base.L->layers[0].ln1;
    int32_t *tok;
    float *dres;
    void *ws;
    qt_gpu_model_lookups(g, g->lookups, &tok, &dres, &ws);
    QT_CHECK(qt_comm_all_gather(e->comm, e->rank, tok, g->tok, n * N, QT_DT_F32, cs) == 0 &&
                 qt_comm_all_gather(e->comm, e->rank, dres, g->dres, n * N * C, QT_DT_F32, cs) == 0,
             "rank %d: embedding lookups all-gather aborted (another rank failed)", e->rank);
    for (size_t j = 0; j < n; j++)
        for (int b = 0; b < sh->n_buckets && sh->bucket[b] < end; b++) {
            size_t off, len, st;
            qt_shard_piece(sh, b, &off, &len, &st);
            size_t hi = off + len < end ? off + len : end; /* the embeddings sit at flat index 0 */
            if (off < hi)
                qt_embedding_bwd_range(g->grad, off, hi, dres + j * N * C, QT_DT_F32, tok + j * N, (long)N,
                                       (int)C, c->vocab_size, ws, cs);
        }
}

/* The model's grads_ready hook: every gradient from flat index `from` up is final on the model's
 * stream, so the buckets that became final go to the comm stream (in descending order, the same on
 * every rank); at the end (from 0) of a micro-step that left its lookups out, they follow. */
static void grads_ready(void *ctx, size_t from) {
    gpu_engine *e = ctx;
    int b = qt_shard_final_from(&e->g->shard, from), lookups = from == 0 && e->lookups_due;
    if (b < e->early) b = e->early;
    if (b >= e->sent && !lookups) return;
    comm_follows(e);
    while (e->sent > b) reduce_bucket(e, --e->sent, e->comm_stream);
    if (lookups) add_lookups(e, e->comm_stream);
    if (from == 0) e->sent = e->early = e->lookups_due = 0;
}

/* The model's weights_needed hook: the model's stream waits for the all-gather of every bucket below
 * flat index upto (one event: the buckets are gathered in order on one stream). */
static void weights_wait(void *ctx, size_t upto) {
    gpu_engine *e = ctx;
    int k = qt_shard_needed(&e->g->shard, upto);
    if (k <= e->gathered) return;
    QT_CUDA(cudaStreamWaitEvent(e->g->stream, e->ag_ev[k - 1], 0));
    e->gathered = k;
}

/* Before anything but a micro-step's forward touches the bf16 weights. */
static void join_weights(gpu_engine *e) { weights_wait(e, SIZE_MAX); }

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
static void cut(gpu_engine *e, size_t from) {
    cudaGraph_t graph;
    QT_CUDA(cudaStreamEndCapture(e->g->stream, &graph));
    add_segment(e->capture, graph, from);
    QT_CUDA(cudaStreamBeginCapture(e->g->stream, cudaStreamCaptureModeThreadLocal));
}

/* The hooks while capturing: cut there. */
static void cut_grads(void *ctx, size_t from) { cut(ctx, from); }
static void cut_embed(void *ctx) { cut(ctx, EMBED_CUT); }
static void cut_weights(void *ctx, size_t upto) {
    gpu_engine *e = ctx;
    cut(e, NO_CUT);
    if (upto > e->capture->wait) e->capture->wait = upto;
}

/* One micro-step's forward + backward, of kind MS_* (outside a capture the model's weights_needed
 * hook is weights_wait whenever an all-gather can be pending). */
static void run_step(gpu_engine *e, float scale, int kind) {
    qt_gpu_model *g = e->g;
    int early = (kind & (MS_SUMS | MS_LOOKUPS)) == (MS_SUMS | MS_LOOKUPS); /* the embeddings' bucket summed early */
    e->lookups_due = g->skip_lookups = (kind & MS_LOOKUPS) != 0;
    /* The first micro-step runs eagerly: it autotunes the matmuls and builds the cuDNN plans, which
     * cannot happen under capture. A new loss scale means new graphs. */
    if (!e->base.cfg->cuda_graphs || e->micro_done == 0 || g->prof) {
        g->grads_ready = kind & MS_SUMS ? grads_ready : NULL;
        g->embed_ready = early ? send_embedding : NULL;
        qt_gpu_model_step(g, scale, 1);
        g->grads_ready = NULL;
        g->embed_ready = NULL;
        g->skip_lookups = 0;
        return;
    }
    graph_set *gs = &e->graphs[kind];
    if (!gs->n || gs->scale != scale) {
        for (int k = 0; k < gs->n; k++) QT_CUDA(cudaGraphExecDestroy(gs->seg[k].exec));
        gs->n = 0;
        gs->wait = 0;
        e->capture = gs;
        void (*wn)(void *, size_t) = g->weights_needed;
        cudaGraph_t graph;
        QT_CUDA(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
        g->grads_ready = kind & MS_SUMS ? cut_grads : NULL;
        g->weights_needed = kind & MS_WAITS ? cut_weights : NULL;
        g->embed_ready = early ? cut_embed : NULL;
        qt_gpu_model_step(g, scale, 1);
        g->grads_ready = NULL;
        g->embed_ready = NULL;
        g->weights_needed = wn;
        QT_CUDA(cudaStreamEndCapture(g->stream, &graph));
        add_segment(gs, graph, NO_CUT);
        gs->scale = scale;
    }
    for (int k = 0; k < gs->n; k++) {
        if (gs->seg[k].wait) weights_wait(e, gs->seg[k].wait);
        QT_CUDA(cudaGraphLaunch(gs->seg[k].exec, g->stream));
        if (gs->seg[k].from == EMBED_CUT) send_embedding(e);
        else if (gs->seg[k].from != NO_CUT) grads_ready(e, gs->seg[k].from);
    }
    g->skip_lookups = 0;
}

static void gpu_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    QT_CHECK(e->sent == g->shard.n_buckets && !e->lookups_due,
             "rank %d: a micro-step after the last of this step (a step is data.grad_accum = %d micro-steps)", e->rank,
             b->cfg->grad_accum);
    long valid = upload(e, in, tgt);
    e->valid_total += valid;
    int last = e->comm && ++e->micro_in_step == b->cfg->grad_accum;
    int kind = (last && b->cfg->overlap_comm ? MS_SUMS : 0) | (last && g->lookups ? MS_LOOKUPS : 0) |
               (e->gathered < g->shard.n_buckets ? MS_WAITS : 0);
    run_step(e, valid ? grad_scale / valid : 0.0f, kind);
    e->micro_done++;
}

/* Gradients summed over the ranks (when a data-parallel rank; already on the comm stream when the
 * last micro-step handed the buckets over), then the norm and clip scale. Sharded (ZeRO-1): each rank
 * has the sums of its pieces only; the norm adds every rank's pieces' sums of squares in order. */
static void reduce_grads(gpu_engine *e, cudaStream_t s) {
    qt_gpu_model *g = e->g;
    const qt_shard *sh = &g->shard;
    float clip = e->base.cfg->grad_clip;
    if (e->comm) {
        if (e->sent < sh->n_buckets) {
            QT_CHECK(e->sent == 0, "rank %d: the backward handed over buckets %d.. of %d only", e->rank, e->sent,
                     sh->n_buckets);
            QT_CUDA(cudaEventRecord(e->comm_ev, e->comm_stream));
            QT_CUDA(cudaStreamWaitEvent(s, e->comm_ev, 0));
        } else {
            qt_gpu_model_mark(g, "optimizer: gradient sum");
            for (int b = sh->n_buckets - 1; b >= 0; b--) reduce_bucket(e, b, s);
            if (e->lookups_due) add_lookups(e, s); /* as the overlapped sums do: the same bits */
            e->lookups_due = 0;
        }
        e->sent = sh->n_buckets;
        e->micro_in_step = 0;
    }
    qt_gpu_model_mark(g, "optimizer: norm + adamw");
    if (sh->n_ranks == 1) {
        qt_grad_norm(g->norm, g->clip, g->grad, sh->total, clip, g->ws, s);
        return;
    }
    int nb = sh->n_buckets;
    double *mine = g->sumsq + (size_t)sh->rank * nb;
    for (int b = 0; b < nb; b++) {
        size_t off, len, st;
        qt_shard_piece(sh, b, &off, &len, &st);
        qt_grad_sumsq(mine + b, g->grad + off, len, g->ws, s);
    }
    /* every rank's fp64 sums (two fp32 words each), gathered in place */
    QT_CHECK(qt_comm_all_gather(e->comm, e->rank, g->sumsq, mine, 2 * (size_t)nb * sh->n_ranks, QT_DT_F32, s) == 0,
             "rank %d: gradient norm all-gather aborted (another rank failed)", e->rank);
    qt_clip_from_sumsq(g->norm, g->clip, g->sumsq, sh->n_ranks * nb, clip, s);
}

static void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

/* The bf16 weights after AdamW of buckets [k0, k1): a sharded rank all-gathers every rank's pieces
 * bucket by bucket, then the fp8 quants of the layers each bucket completes follow. With ag_ev
 * (parallel.overlap_comm sharded, or one GPU offloaded, where AdamW itself ran on the comm stream)
 * this runs on the comm stream, each bucket's event recorded for the next forward (weights_wait); else
 * on the model's. */
static void gather_weights(gpu_engine *e, int k0, int k1) {
    qt_gpu_model *g = e->g;
    const qt_shard *sh = &g->shard;
    const qt_layout *L = e->base.L;
    int overlap = e->ag_ev != NULL, nl = L->cfg.num_layers, ql = 0;
    cudaStream_t s = overlap ? e->comm_stream : g->stream;
    while (ql < nl && qt_layer_end(L, ql) <= sh->bucket[k0]) ql++; /* quantized with an earlier bucket */
    if (k0 == 0 && sh->n_ranks > 1) qt_gpu_model_mark(g, "optimizer: weight all-gather");
    if (overlap) {
        comm_follows(e);
        if (k0 == 0 && e->ag_delay_ms) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &e->ag_delay_ms));
        if (k0 == 0) e->gathered = 0;
    }
    for (int k = k0; k < k1; k++) {
        size_t lo = sh->bucket[k], hi = sh->bucket[k + 1], off, len, st;
        qt_shard_piece(sh, k, &off, &len, &st);
        QT_CHECK(sh->n_ranks == 1 || qt_comm_all_gather(e->comm, e->rank, (uint16_t *)g->w + lo,
                                                        (uint16_t *)g->w + off, hi - lo, QT_DT_BF16, s) == 0,
                 "rank %d: weight all-gather aborted (another rank failed)", e->rank);
        int l1 = ql; /* the layers now whole */
        while (l1 < nl && qt_layer_end(L, l1) <= hi) l1++;
        if (g->fp8 && l1 > ql) qt_fp8_quantize_weights(g->fp8, L, g->w, ql, l1, s);
        ql = l1;
        if (overlap) QT_CUDA(cudaEventRecord(e->ag_ev[k], s));
    }
}

static void gpu_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    const qt_config *c = b->cfg;
    const qt_shard *sh = &g->shard;
    cudaStream_t s = g->stream;
    join_weights(e);
    reduce_grads(e, s);
    qt_adamw_args a = {lr, c->beta1, c->beta2, c->eps, t, c->seed, c->stochastic_rounding};
    /* Group i: bucket 0 first, its all-gather (the embeddings, read first by the next forward) beside
     * AdamW of the rest; one GPU offloaded: AdamW bucket by bucket on the comm stream (`ahead`), the
     * gradients zeroed behind it, while the next forward waits for each bucket before its layers. */
    int groups = qt_gpu_optim_groups(g->opt), nb = sh->n_buckets, ahead = e->ag_ev && sh->n_ranks == 1;
    cudaStream_t os = ahead ? e->comm_stream : s;
    if (ahead) comm_follows(e);
    for (int i = 0; i < groups; i++) {
        int k0 = i == 0 ? 0 : groups == nb ? i : 1, k1 = i == groups - 1 ? nb : k0 + 1;
        qt_gpu_optim_step(g->opt, i, g->w, g->grad, g->clip, &a, os);
        if (ahead) qt_zero(g->grad + sh->bucket[k0], (sh->bucket[k1] - sh->bucket[k0]) * 4, os);
        if (sh->n_ranks > 1 || ahead) gather_weights(e, k0, k1);
    }
    if (!ahead) {
        if (sh->n_ranks == 1 && g->fp8) { /* once per step: the persistent quants */
            qt_gpu_model_mark(g, "fp8 quantize: weights");
            qt_fp8_quantize_weights(g->fp8, b->L, g->w, 0, b->L->cfg.num_layers, s);
        }
        qt_zero(g->grad, sh->total * 4, s);
    }
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, s));
    QT_CUDA(cudaMemcpyAsync(&e->out->norm, g->norm, 4, cudaMemcpyDeviceToHost, s));
    if (g->fp8) QT_CUDA(cudaMemcpyAsync(&e->out->nonfinite, g->fp8->nonfinite, 4, cudaMemcpyDeviceToHost, s));
    qt_zero(g->loss_sum, 8, s);
    QT_CUDA(cudaStreamSynchronize(s));
    if (g->fp8 && e->out->nonfinite) {
        char name[96];
        QT_CHECK(0, "step %ld: fp8 scale of %s is NaN/Inf (its abs-max was not finite): the run diverged", t,
                 qt_fp8_tag_name(e->out->nonfinite, name, sizeof name));
    }
    qt_gpu_model_profile_collect(g);
    *loss = e->valid_total ? (float)(e->out->loss / e->valid_total) : 0.0f;
    *gnorm = e->out->norm;
    e->last_loss_sum = e->out->loss;
    e->last_valid = e->valid_total;
    e->valid_total = 0;
}

static float gpu_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    long valid = upload(e, in, tgt);
    qt_gpu_model_step(g, 0.0f, 0);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->loss_sum, 8, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return valid ? (float)(e->out->loss / valid) : 0.0f;
}

/* Sharded: only this rank's pieces of w are written (the data-parallel engine fills the rest from the
 * other ranks). */
static void gpu_get_weights(qt_engine *b, float *w) {
    qt_gpu_model *g = ((gpu_engine *)b)->g;
    join_weights((gpu_engine *)b); /* the master weights too, where AdamW runs ahead */
    QT_CUDA(cudaStreamSynchronize(g->stream));
    for (int k = 0; k < g->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&g->shard, k, &off, &len, &st);
        QT_CUDA(cudaMemcpy(w + off, g->master + st, qt_shard_params(off, len, b->L->numel) * 4, cudaMemcpyDefault));
    }
}

static void gpu_get_grads(qt_engine *b, float *gr) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    QT_CHECK(e->sent == g->shard.n_buckets && !e->lookups_due,
             "rank %d: get_grads after the last micro-step of a step: its gradients are summed over the GPUs (or "
             "wait for the other ranks' embedding lookups); read them before that micro-step", e->rank);
    join_weights(e); /* AdamW running ahead zeroes them */
    QT_CUDA(cudaStreamSynchronize(g->stream));
    QT_CUDA(cudaMemcpy(gr, g->grad, b->L->numel * 4, cudaMemcpyDeviceToHost));
}

static void gpu_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    gpu_engine *e = (gpu_engine *)b;
    upload(e, in, NULL);
    qt_gpu_model_logits(e->g, logits);
}

/* Blobs: the fp32 master as "weights" (the CPU engine's name, so checkpoints move between paths),
 * the bf16 working copy (it differs from RNE(master) under stochastic rounding) and m, v. Sharded:
 * weights, adam_m and adam_v hold this rank's pieces only, back to back with their padding (the model's
 * shard says where each goes). */
static int gpu_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    size_t n = b->L->numel, ns = g->shard.len;
    const char *names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    const void *src[4] = {g->master, g->w, g->m, g->v};
    int dts[4] = {QT_DT_F32, QT_DT_BF16, g->m_dt, g->v_dt};
    QT_CHECK(cap >= 4, "need room for 4 checkpoint items, got %d", cap);
    join_weights(e);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < 4; i++) {
        size_t bytes = (i == 1 ? n : ns) * qt_dtype_size(dts[i]);
        if (!e->host_state[i]) QT_CUDA(cudaMallocHost(&e->host_state[i], bytes ? bytes : 1));
        QT_CUDA(cudaMemcpy(e->host_state[i], src[i], bytes, cudaMemcpyDefault)); /* master, m, v: maybe host */
        items[i] = (qt_ckpt_item){names[i], dts[i], e->host_state[i], bytes};
    }
    return 4;
}

/* Checkpoints hold whole arrays; a sharded rank takes its pieces. */
static int gpu_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    size_t n = b->L->numel;
    const char *names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    void *dst[4] = {g->master, g->w, g->m, g->v};
    int dts[4] = {QT_DT_F32, QT_DT_BF16, g->m_dt, g->v_dt};
    join_weights(e);
    for (int i = 0; i < 4; i++) {
        size_t bytes, want = n * qt_dtype_size(dts[i]);
        int dt;
        const void *p = qt_ckpt_get(ck, names[i], &bytes, &dt);
        if (!p && i == 1) { /* a CPU checkpoint: the bf16 copy from all of "weights", via the gradients */
            QT_CUDA(cudaMemcpyAsync(g->grad, qt_ckpt_get(ck, names[0], NULL, NULL), n * 4, cudaMemcpyHostToDevice, g->stream));
            qt_cast_f32_to_bf16(g->w, g->grad, n, g->stream);
            qt_zero(g->grad, g->shard.total * 4, g->stream);
            continue;
        }
        if (!p || bytes != want || dt != dts[i]) {
            snprintf(err, errlen, "checkpoint blob %s: expected %zu bytes of %s (precision.opt_*_dtype must match the run that wrote it), got %s",
                     names[i], want, qt_dtype_name(dts[i]), p ? "another size or dtype" : "none");
            return -1;
        }
        size_t es = qt_dtype_size(dts[i]);
        if (i == 1) {
            QT_CUDA(cudaMemcpyAsync(dst[i], p, want, cudaMemcpyHostToDevice, g->stream));
            continue;
        }
        for (int k = 0; k < g->shard.n_buckets; k++) {
            size_t off, len, st, np;
            qt_shard_piece(&g->shard, k, &off, &len, &st);
            if ((np = qt_shard_params(off, len, n)))
                QT_CUDA(cudaMemcpyAsync((char *)dst[i] + st * es, (const char *)p + off * es, np * es,
                                        cudaMemcpyDefault, g->stream));
        }
    }
    if (g->fp8) qt_fp8_quantize_weights(g->fp8, b->L, g->w, 0, b->L->cfg.num_layers, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return 0;
}

static void gpu_print_memory(qt_engine *b) { qt_gpu_model_print_plan(((gpu_engine *)b)->g); }

static void gpu_free(qt_engine *b) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    if (e->comm_stream) {
        QT_CUDA(cudaStreamSynchronize(e->comm_stream));
        QT_CUDA(cudaStreamDestroy(e->comm_stream));
        QT_CUDA(cudaEventDestroy(e->comm_ev));
    }
    for (int k = 0; e->ag_ev && k < e->g->shard.n_buckets; k++) QT_CUDA(cudaEventDestroy(e->ag_ev[k]));
    free(e->ag_ev);
    for (int i = 0; i < MS_KINDS; i++) {
        for (int k = 0; k < e->graphs[i].n; k++) QT_CUDA(cudaGraphExecDestroy(e->graphs[i].seg[k].exec));
        free(e->graphs[i].seg);
    }
    for (int i = 0; i < 2; i++) {
        QT_CUDA(cudaFreeHost(e->pin[i]));
        QT_CUDA(cudaEventDestroy(e->pin_free[i]));
    }
    for (int i = 0; i < 4; i++)
        if (e->host_state[i]) QT_CUDA(cudaFreeHost(e->host_state[i]));
    QT_CUDA(cudaFreeHost(e->out));
    qt_gpu_model_free(e->g);
    free(e);
}

static void gpu_profile(qt_engine *b, int on) { qt_gpu_model_profile(((gpu_engine *)b)->g, on); }
static void gpu_profile_print(qt_engine *b, int steps) { qt_gpu_model_profile_print(((gpu_engine *)b)->g, steps); }

/* The same ops under the name the run's log shows. */
#define GPU_OPS(nm)                                                                                   \
    {.name = nm, .micro_step = gpu_micro_step, .opt_step = gpu_opt_step, .eval_loss = gpu_eval_loss,    \
     .get_weights = gpu_get_weights, .get_grads = gpu_get_grads, .forward_logits = gpu_forward_logits, \
     .state_items = gpu_state_items, .load_state = gpu_load_state, .print_memory = gpu_print_memory,   \
     .profile = gpu_profile, .profile_print = gpu_profile_print, .free = gpu_free, .state_is_snapshot = 1}
static const qt_engine_ops gpu_ops = GPU_OPS("cuda-bf16"), fp8_ops = GPU_OPS("cuda-fp8 (e4m3 blocks)");

/* The comm stream (default priority: with a high one the bucket sums' kernels took SMs ahead of the
 * backward's, slower steps on 2 x H200, bench/RESULTS.md section 5) and, with weights_ahead, the
 * per-bucket events the next forward waits for. */
static void comm_streams(gpu_engine *e, int weights_ahead) {
    QT_CUDA(cudaStreamCreateWithFlags(&e->comm_stream, cudaStreamNonBlocking));
    QT_CUDA(cudaEventCreateWithFlags(&e->comm_ev, cudaEventDisableTiming));
    const qt_shard *sh = &e->g->shard;
    if (weights_ahead) {
        e->ag_ev = calloc((size_t)sh->n_buckets, sizeof *e->ag_ev);
        QT_CHECK(e->ag_ev, "out of host memory");
        for (int k = 0; k < sh->n_buckets; k++) QT_CUDA(cudaEventCreateWithFlags(&e->ag_ev[k], cudaEventDisableTiming));
        e->g->weights_needed = weights_wait;
        /* a forward that did not wait for its bucket would then read last step's weights (test_train) */
        const char *d = getenv("QT_DP_AG_DELAY_MS");
        e->ag_delay_ms = d ? atol(d) : 0;
    }
}

void qt_engine_gpu_attach(qt_engine *b, qt_comm *comm, int rank) {
    gpu_engine *e = (gpu_engine *)b;
    e->comm = comm;
    e->rank = rank;
    comm_streams(e, e->g->shard.n_ranks > 1 && b->cfg->overlap_comm);
}

void qt_engine_gpu_last_loss(const qt_engine *b, double *sum, long *valid) {
    const gpu_engine *e = (const gpu_engine *)b;
    *sum = e->last_loss_sum;
    *valid = e->last_valid;
}

qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_config *cfg, const float *w0, int device,
                                const qt_shard *sh, char *err, size_t errlen) {
    if (cfg->matmul_dtype != QT_DT_BF16 && cfg->matmul_dtype != QT_DT_E4M3) {
        snprintf(err, errlen, "%s: precision.matmul_dtype: %s: expected bf16 or e4m3", cfg->path,
                 qt_dtype_name(cfg->matmul_dtype));
        return NULL;
    }
    QT_CUDA(cudaSetDevice(device));
    if (cfg->matmul_dtype == QT_DT_E4M3) {
        struct cudaDeviceProp p;
        QT_CUDA(cudaGetDeviceProperties(&p, device));
        if (qt_fp8_check(&L->cfg, cfg, (long)cfg->micro_batch * cfg->seq_len, p.major * 10 + p.minor, err, errlen))
            return NULL;
    }
    gpu_engine *e = calloc(1, sizeof *e);
    QT_CHECK(e, "out of host memory");
    e->base = (qt_engine){cfg->matmul_dtype == QT_DT_E4M3 ? &fp8_ops : &gpu_ops, L, cfg, 1};
    e->g = qt_gpu_model_create(L, cfg, w0, sh, err, errlen);
    if (!e->g) {
        free(e);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        QT_CUDA(cudaMallocHost((void **)&e->pin[i], 2 * e->g->N * sizeof(int32_t)));
        QT_CUDA(cudaEventCreateWithFlags(&e->pin_free[i], cudaEventDisableTiming));
        QT_CUDA(cudaEventRecord(e->pin_free[i], e->g->stream));
    }
    QT_CUDA(cudaMallocHost((void **)&e->out, sizeof *e->out));
    e->sent = e->gathered = e->g->shard.n_buckets;
    if (!sh && cfg->offload_optimizer) comm_streams(e, 1); /* one GPU offloaded: AdamW runs ahead */
    e->g->hook_ctx = e;
    for (int i = 0; i < MS_KINDS; i++) { /* MS_WAITS cuts before the embeddings, each layer and the final
                                          * norm; MS_SUMS after the LM head, final norm, each layer and the embeddings */
        e->graphs[i].cap = 1 + (i & MS_WAITS ? L->cfg.num_layers + 2 : 0) + (i & MS_SUMS ? L->cfg.num_layers + 3 : 0);
        e->graphs[i].seg = calloc((size_t)e->graphs[i].cap, sizeof *e->graphs[i].seg);
        QT_CHECK(e->graphs[i].seg, "out of host memory");
    }
    return &e->base;
}
