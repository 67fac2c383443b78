/* dp_sync.c — one GPU rank's micro-steps, graph segments, optimizer-step order and streams (qt_dp_sync.h,
 * docs/memory.md); the gradients' sums are dp_grads.c's, the weight slots' fills dp_fill.c's. */
#include "qt_dp_sync.h"

#include <stdio.h>
#include <stdlib.h>

#include "dp_sync_int.h"
#include "qt_test_hooks.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

#ifdef QT_MUTANTS
static void mutants_free(qt_dp_sync *d) {
    if (d->mut.sum_buf) QT_CUDA(cudaFree(d->mut.sum_buf));
    if (d->mut.first_w) QT_CUDA(cudaFree(d->mut.first_w));
    free(d->mut.first_have);
}
#endif

int qt_dp_sync_reload(qt_dp_sync *d) {
    if (!d->wfill) return 0;
    qt_wslots_invalidate(d->ps->wslots);
    d->wslots.own_due = 1;
    return 1;
}

void qt_dp_sync_inputs(qt_dp_sync *d) { qt_dp_grads_wait(d); }

void qt_dp_sync_join(qt_dp_sync *d) {
    if (d->wfill && d->wslots.io.side != d->wslots.io.model) { /* the own slots' gathers and the codes on the side stream,
                                                          * the shared slots' on the gather stream */
        follow(d->g->stream, d->side, d->side_ev);
        gathers_join(d, d->g->stream);
    } else if (d->plan.weights.ahead) {
        qt_dp_fill_wait(d, SIZE_MAX);
    }
    qt_dp_grads_adamw_wait(d);
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
    QT_CHECK(eager || !d->wfill, "ZeRO-3 and offloaded-weight micro-steps run eagerly (perf.cuda_graphs is refused with "
             "parallel.zero: 3 and memory.offload: [weights])");
    if (eager) {
        qt_param_hooks h = {.weights_needed = d->wait_hooks.weights_needed,
                            .grads_ready = kind & MS_SUMS ? qt_dp_grads_ready : NULL,
                            .embed_ready = early ? qt_dp_grads_send_embedding : NULL, .ctx = d,
                            .weights_back = d->wfill ? qt_dp_fill_backward : NULL};
        a.hooks = &h;
        qt_gpu_model_step(d->g, &a);
        return;
    }
    graph_set *gs = &d->graphs[kind];
    if (!gs->n || gs->scale != scale || gs->docs != qt_gpu_model_docs_mode(d->g)) capture(d, gs, &a, kind);
    for (int k = 0; k < gs->n; k++) {
        if (gs->seg[k].wait) qt_dp_fill_wait(d, gs->seg[k].wait);
        QT_CUDA(cudaGraphLaunch(gs->seg[k].exec, d->g->stream));
        if (gs->seg[k].from == EMBED_CUT) qt_dp_grads_send_embedding(d);
        else if (gs->seg[k].from != NO_CUT) qt_dp_grads_ready(d, gs->seg[k].from);
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
    qt_param_hooks h = {.weights_needed = d->wait_hooks.weights_needed,
                        .grads_ready = kind & MS_SUMS ? qt_dp_grads_ready : NULL,
                        .embed_ready = early ? qt_dp_grads_send_embedding : NULL, .ctx = d};
    qt_gpu_step_args a = {0.0f, 1, (kind & MS_LOOKUPS) != 0, &h};
    d->lookups_due = a.skip_lookups;
    qt_gpu_model_backward_rows_with(d->g, row_scale, &a);
}

/* Gradients summed over the ranks (data parallel; already on the side stream when the last micro-step
 * handed the buckets over), then the norm and clip scale. Sharded (ZeRO-1): each rank has the sums of
 * its pieces only; the norm adds every rank's pieces' sums of squares in piece order, so over the world
 * (across nodes) too it has the bits of one process with every GPU. */
void qt_dp_sync_reduce(qt_dp_sync *d) {
    qt_gpu_model *g = d->g;
    qt_param_store *ps = d->ps;
    const qt_shard *sh = &ps->shard;
    cudaStream_t s = g->stream;
    int rank = d->plan.parallel.rank;
    d->gsync->reduce(d);
    for (int b = 0; b < sh->n_buckets; b++) qt_param_grad_piece_fresh(ps, b, s); /* a piece no sum wrote: zeros */
    qt_gpu_model_mark(g, "optimizer: gradient norm");
    if (sh->n_ranks == 1) {
        qt_grad_norm(ps->norm, ps->clip, ps->grad, ps->grad_dt, sh->total, d->grad_clip, g->ws, s);
        return;
    }
    size_t nb = (size_t)sh->n_buckets;
    double *mine = ps->sumsq + (size_t)sh->rank * nb;
    for (int b = 0; b < sh->n_buckets; b++) {
        size_t off, len, st;
        qt_shard_piece(sh, b, &off, &len, &st);
        qt_grad_sumsq(mine + b, qt_param_grad_piece(ps, b), ps->grad_dt, len, g->ws, s);
    }
    /* every world piece's fp64 sums (two fp32 words each), gathered in place in world-piece order */
    int mine_only = 0; /* 1: the other nodes' sums left zero, not gathered (a planted bug) */
#ifdef QT_MUTANTS
    size_t nodes = (size_t)sh->nodes;
    mine_only = nodes > 1 && qt_mutant_on(QT_MUT_NODES_NORM_MINE);
    double *local = ps->sumsq + (size_t)rank * nodes * nb; /* this GPU's world ranks */
    for (size_t j = 0; mine_only && j < nodes; j++)
        if (local + j * nb != mine) qt_zero(local + j * nb, nb * sizeof *local, s);
#endif
    QT_CHECK(qt_dp_world_gather(d, ps->sumsq, mine, 2 * nb, QT_DT_F32, !mine_only, s) == 0,
             "rank %d: gradient norm all-gather aborted (another rank failed)", rank);
    qt_clip_from_sumsq(ps->norm, ps->clip, ps->sumsq, sh->n_ranks * (int)nb, d->grad_clip, s);
}

cudaStream_t qt_dp_sync_opt_stream(qt_dp_sync *d) {
    if (!d->plan.optimizer.ahead) return d->g->stream;
    side_follows(d);
    return d->side;
}

/* The bf16 weights after AdamW of buckets [k0, k1): a sharded rank all-gathers every rank's pieces
 * bucket by bucket, then the fp8 quants of the layers each bucket completes follow. With
 * plan.weights.ahead this runs on the side stream, each bucket's event recorded for the next forward
 * (qt_dp_fill_wait); else on the model's. One GPU (no gather): only with opt_ahead, for the quants and
 * the events. */
void qt_dp_sync_release(qt_dp_sync *d, int k0, int k1) {
    qt_gpu_model *g = d->g;
    const qt_shard *sh = &d->ps->shard;
    const qt_layout *L = d->L;
    int ahead = d->plan.weights.ahead, nl = L->cfg.num_layers, ql = 0, rank = d->plan.parallel.rank;
    if (sh->n_ranks == 1 && !d->plan.optimizer.ahead && !d->wfill) return;
    cudaStream_t s = ahead ? d->side : g->stream;
    if (d->wfill) { /* no whole weights to gather into (or none on the GPU): the own slots only */
        if (sh->n_ranks > 1) qt_gpu_model_mark(g, "optimizer: weight all-gather"); /* and the codes */
        if (ahead) side_follows(d);
        if (ahead && k0 == 0 && d->test.ag_delay_ms) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
        qt_dp_fill_own(d, k0, k1, s);
        return;
    }
    while (ql < nl && qt_layer_end(L, ql) <= sh->bucket[k0]) ql++; /* quantized with an earlier bucket */
    if (sh->n_ranks > 1) qt_gpu_model_mark(g, "optimizer: weight all-gather"); /* and the codes */
    if (ahead) {
        side_follows(d);
        if (k0 == 0 && d->test.ag_delay_ms) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
        if (k0 == 0) d->gathered = 0;
    }
    uint16_t *w = d->ps->w;
    for (int k = k0; k < k1; k++) {
        size_t lo = sh->bucket[k], hi = sh->bucket[k + 1], off, len, st;
        qt_shard_piece(sh, k, &off, &len, &st);
        int stale = 0; /* 1: the other nodes' pieces left as they were (a planted bug) */
#ifdef QT_MUTANTS
        stale = qt_mutant_on(QT_MUT_NODES_WEIGHTS_NOT_GATHERED);
#endif
        QT_CHECK(sh->n_ranks == 1 || qt_dp_world_gather(d, w + lo, w + off, len, QT_DT_BF16, !stale, s) == 0,
                 "rank %d: weight all-gather aborted (another rank failed)", rank);
        int l1 = ql; /* the layers now whole */
        while (l1 < nl && qt_layer_end(L, l1) <= hi) l1++;
        if (d->plan.precision.fp8 && l1 > ql) qt_fp8_quantize_weights(g->fp8, L, d->ps->w, ql, l1, s);
        ql = l1;
        if (ahead) QT_CUDA(cudaEventRecord(d->ag_ev[k], s));
    }
}

void qt_dp_sync_node_widen(qt_dp_sync *d, const void *pieces, size_t es, void *out) {
    QT_CHECK(d->nodes && d->ps->shard.nodes > 1, "rank %d: a node exchange without ZeRO over the nodes", d->plan.parallel.rank);
    qt_dp_nodes_widen(d->nodes, d->plan.parallel.rank, &d->ps->shard, pieces, es, out, d->ps->staging, d->ps->stage_n * 4,
                      d->g->stream);
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
    d->gsync = qt_dp_grads_of(p);
    d->wfill = qt_dp_fill_of(p);
    d->wait_hooks = (qt_param_hooks){.weights_needed = d->wfill            ? qt_dp_fill_forward
                                                       : p->weights.ahead ? qt_dp_fill_wait : NULL,
                                     .ctx = d};
    /* The side stream has default priority: with a high one the bucket sums' kernels take SMs ahead of
     * the backward's, and steps on 2 x H200 are slower. */
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
    if (d->wfill) { /* the own slots are filled from the initial pieces at the first forward; offloaded
                      * weights always prefetch (copy up) on the gather stream */
        /* a stream of their own only where a gather is copies from pinned host memory (offloaded pieces:
         * qt_comm_all_gather_host; one GPU: H2D copies): a staged or one-shot collective must not run beside
         * another on a second stream (comm.c orders them by the caller's stream). Ranks prefetch only with
         * parallel.overlap_comm. */
        if (d->wfill->gside == 1 || (d->wfill->gside == 2 && p->parallel.overlap)) {
            QT_CUDA(cudaStreamCreateWithFlags(&d->wslots.gside, cudaStreamNonBlocking));
            QT_CUDA(cudaEventCreateWithFlags(&d->wslots.gside_ev, cudaEventDisableTiming));
        }
        d->wslots.io = (qt_wslots_io){qt_dp_fill_gather, d, g->stream, d->wslots.gside ? d->wslots.gside : p->parallel.overlap ? d->side : g->stream,
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
#ifdef QT_MUTANTS
    mutants_free(d);
#endif
    for (int i = 0; i < MS_KINDS; i++) {
        for (int k = 0; k < d->graphs[i].n; k++) QT_CUDA(cudaGraphExecDestroy(d->graphs[i].seg[k].exec));
        free(d->graphs[i].seg);
    }
    free(d);
}
