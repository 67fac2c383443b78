/* dp_grads.c — how one rank's gradients are summed, chosen once from the plan (grad_sync, dp_sync_int.h): one GPU,
 * nothing; ranks' whole arrays all-reduced or reduce-scattered bucket by bucket; ZeRO-2/3's gradient slots summed into
 * the rank's shard every micro-step; one GPU's offloaded slots stored to host every micro-step (docs/memory.md). */
#include "dp_sync_int.h"

#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

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
    int z2 = d->gsync->into_shard;
    qt_dtype dt = half || g16 ? QT_DT_BF16 : QT_DT_F32;
    size_t es = qt_dtype_size(dt), lo = sh->bucket[b], count = sh->bucket[b + 1] - lo, off = lo, len = count, st;
    size_t loff = lo, llen = count; /* the node's sum: the whole bucket, or this rank's local piece */
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
        qt_shard_local_piece(sh, b, &loff, &llen);
        if (qt_shard_local_ranks(sh) > 1)
            QT_CHECK(qt_comm_reduce_scatter(d->comm, rank, buf + (loff - lo) * es, buf, count, dt, s) == 0,
                     "rank %d: gradient reduce-scatter aborted (another rank failed)", rank);
    }
    /* over the nodes: the whole bucket all-reduced (state replicated per node), or the local piece
     * reduce-scattered into this rank's world piece (in place: it sits at node x len in the local piece) */
    if (d->nodes) qt_dp_nodes_sum(d->nodes, rank, buf + (loff - lo) * es, buf + (off - lo) * es, llen, len, dt, s);
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
void qt_dp_grads_send_embedding(void *ctx) {
    qt_dp_sync *d = ctx;
    const qt_shard *sh = &d->ps->shard;
    int k = 0;
    while (k < sh->n_buckets && sh->bucket[k + 1] <= d->L->layers[0].ln1) k++;
    if (!k) return;
    d->early = k;
    if (d->ps->plan.grads.embed_apart) return; /* ZeRO-2: no gradient there but the lookups (+= 0 changes no bit) */
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

/* The model's stream waits until the shared gradient slot of bucket k - 1 (the backward writes it next) is free:
 * its last user reduced (stored) and zeroed. */
static void slot_below_wait(qt_dp_sync *d, int k) {
    int j = k > 0 ? qt_param_grad_slot_shared(d->ps, k - 1) : -1;
#ifdef QT_MUTANTS
    if (qt_mutant_on(QT_MUT_GRAD_SLOT_NO_WAIT)) j = -1; /* no wait */
#endif
    if (j >= 0) QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->slot_ev[j], 0));
}

/* ZeRO-2, on the model's stream, for the buckets [b, sent) that became final: each one's slot below
 * (the backward writes it next) waits until its shared slot's last user is reduced and zeroed. Then the
 * sums may read the slots (qt_param_store.h). */
static void slots_ready(qt_dp_sync *d, int b) {
    for (int k = d->sent - 1; k >= b; k--) slot_below_wait(d, k);
}

/* Offloaded gradients, for the buckets [b, sent) that became final: each one's slot below (the backward
 * writes it next) waits until its shared slot's last user is stored, zeroed and loaded again; then, on
 * the side stream, each final bucket's slot is stored to host; a shared slot is zeroed and the next
 * bucket of this backward to use it (three below) loaded into it
 * (not in the first micro-step of a step: nothing to load) on the load stream once the store is done,
 * so one slot's load (H2D) runs beside the next slot's store (D2H); the slot's event is recorded after
 * its load (or store); at the end the side stream waits for the loads. A slot of its own keeps what it
 * stored, which is what the next micro-step would load (zeroed at the step's end, qt_dp_sync_reduce).
 * A slot holds its bucket exactly: no tensor crosses a bucket's bounds (qt_partition.h). */
static void host_grads_ready(qt_dp_sync *d, int b) {
    qt_param_store *ps = d->ps;
    for (int k = d->sent - 1; k >= b; k--) slot_below_wait(d, k);
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

/* Offloaded gradients, before a micro-step (after the last one's stores, qt_dp_grads_wait): on the model's
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

/* qt_dp_grads_ready: every gradient from flat index `from` up is final on the model's stream, so the buckets
 * that became final go to the sums stream (in descending order, the same on every rank); at the end
 * (from 0) of a micro-step that left its lookups out, they follow. ZeRO-2 does this every micro-step
 * and owes nothing afterwards (sent back to n_buckets); the shard is whole once sums_ev is reached. */
void qt_dp_grads_ready(void *ctx, size_t from) {
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
    if (from == 0) d->sent = d->early = d->lookups_due = 0;
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

void qt_dp_grads_wait(qt_dp_sync *d) { d->gsync->wait(d); }

static const grad_sync host_sync;

/* qt_dp_grads_wait before the norm and AdamW (a planted bug skips it with offloaded gradients). */
void qt_dp_grads_adamw_wait(qt_dp_sync *d) {
#ifdef QT_MUTANTS
    if (d->gsync == &host_sync && qt_mutant_on(QT_MUT_ADAMW_NO_STORE_WAIT)) return;
#endif
    qt_dp_grads_wait(d);
}

/* Offloaded gradients: stored to host during the micro-steps; the own slots zeroed for the next step. */
static void host_reduce(qt_dp_sync *d) {
    qt_param_store *ps = d->ps;
    qt_dp_grads_adamw_wait(d);
    for (int b = 0; b < ps->shard.n_buckets; b++)
        if (qt_param_grad_slot_shared(ps, b) < 0) qt_param_grad_slot_zero(ps, b, d->g->stream);
    d->host_grads.grad_micro = 0;
}

/* ZeRO-2/3: summed into the shard during the micro-steps. */
static void shard_reduce(qt_dp_sync *d) { qt_dp_grads_wait(d); }

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

const grad_sync *qt_dp_grads_of(const qt_plan *p) {
    return p->grads.host_one ? &host_sync : p->grads.sharded ? &shard_sync : p->parallel.dp != QT_DP_ONE ? &whole_sync : &one_sync;
}
