/* dp_fill.c — how one rank's weight slots are filled, chosen once from the plan (slot_fill, dp_sync_int.h): one GPU
 * copies a bucket up from the pinned host array; ZeRO-3 all-gathers the ranks' pieces from their GPUs or their pinned
 * host memory; with e4m3 gathers the pieces' codes are made after each change (docs/memory.md). */
#include "dp_sync_int.h"

#include <stdlib.h>

#include "qt_quant.h"
#include "qt_small_params.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

#ifdef QT_MUTANTS
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
#endif

/* weights_needed: the model's stream waits for the gather of every bucket below flat index upto (one
 * event: the buckets are gathered in order on one stream). */
void qt_dp_fill_wait(void *ctx, size_t upto) {
    qt_dp_sync *d = ctx;
    int k = qt_shard_needed(&d->ps->shard, upto);
    if (k <= d->gathered) return;
    QT_CUDA(cudaStreamWaitEvent(d->g->stream, d->ag_ev[k - 1], 0));
    d->gathered = k;
}

int qt_dp_world_gather(qt_dp_sync *d, void *dst, const void *mine, size_t per, qt_dtype dt, int nodes_leg, cudaStream_t s) {
    const qt_shard *sh = &d->ps->shard;
    int rank = d->plan.parallel.rank, nodes = sh->nodes;
    size_t es = qt_dtype_size(dt);
    char *local = (char *)dst + (size_t)rank * nodes * per * es; /* this GPU's slot of the node: its world ranks */
    if (nodes > 1 && nodes_leg) qt_dp_nodes_all_gather(d->nodes, rank, local, mine, per, dt, s);
    if (qt_shard_local_ranks(sh) == 1) return 0;
    return qt_comm_all_gather(d->comm, rank, dst, nodes > 1 ? local : mine, (size_t)sh->n_ranks * per, dt, s);
}

/* Layer bucket b's small params (qt_small_params.h: norms and biases, bf16) as gathered over the ranks,
 * [n_ranks][small.packed[b]] (rank r's segments packed; across nodes the world's ranks), in ps->e4m3.small_recv. */
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
    const qt_shard *sh = &ps->shard;
    const qt_small_params *m = &ps->e4m3.small;
    int rank = d->plan.parallel.rank, n = sh->n_ranks, me = sh->rank;
    size_t at = 0, P = m->packed[b];
    for (int i = 0; i < m->n_seg[b * n + me]; i++) {
        qt_flat_range g = m->seg[b * n + me][i];
        QT_CUDA(cudaMemcpyAsync((uint16_t *)ps->e4m3.small_send + at, w + (g.off - off), g.len * 2, cudaMemcpyDeviceToDevice, s));
        at += g.len;
    }
    QT_CHECK(qt_dp_world_gather(d, small_of(d, b), ps->e4m3.small_send, P, QT_DT_BF16, 1, s) == 0,
             "rank %d: the small weights' all-gather of bucket %d aborted (another rank failed)", rank, b);
}

/* ZeRO-3: the pieces from the ranks' GPUs (across nodes, over the nodes first: qt_dp_world_gather). */
static int gather_device(qt_dp_sync *d, void *dst, const void *mine, size_t n, cudaStream_t s) {
    return qt_dp_world_gather(d, dst, mine, n / (size_t)d->ps->shard.n_ranks, QT_DT_BF16, 1, s);
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
 * record (across nodes the max over the node's GPUs, then over the nodes), then the rank's codes of them
 * (qt_quant_fp8_cur with that record: the scale and bytes the bf16 path's quantize of the whole matrix gives).
 * Every rank makes the same calls (the same matrices: the layout's). */
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
    if (!local && qt_shard_local_ranks(&ps->shard) > 1)
        QT_CHECK(qt_comm_all_reduce_scalars(d->comm, d->plan.parallel.rank, ps->e4m3.amax8, cnt, QT_COMM_MAX, s) == 0,
                 "rank %d: the weights' abs-max all-reduce aborted (another rank failed)", d->plan.parallel.rank);
    if (!local && ps->shard.nodes > 1) qt_dp_nodes_max(d->nodes, d->plan.parallel.rank, ps->e4m3.amax8, cnt, s);
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
void qt_dp_fill_gather(void *ctx, int b, void *dst, void *dst8, cudaStream_t s) {
    qt_dp_sync *d = ctx;
    QT_CHECK(!(d->plan.parallel.rank == d->test.fail_rank && ++d->test.gathers == d->test.fail_gather),
             "injected failure (test hook dp_fail_gather) instead of weight gather %ld (bucket %d)", d->test.fail_gather, b);
    if (d->test.ag_delay_ms && s == d->wslots.io.side && s != d->wslots.io.model) QT_CUDA(cudaLaunchHostFunc(s, sleep_ms, &d->test.ag_delay_ms));
    fill_bucket(d, b, dst, dst8, s);
}

/* ZeRO-3 hooks: the forward reads the weights below upto (the unit ending there: its home bucket), the
 * backward the unit starting at from; the weight slots gather, wait and prefetch (qt_wslots_acquire). */
void qt_dp_fill_own(qt_dp_sync *d, int k0, int k1, cudaStream_t s);
void qt_dp_fill_forward(void *ctx, size_t upto) {
    qt_dp_sync *d = ctx;
    if (d->wslots.own_due) qt_dp_fill_own(d, 0, d->ps->shard.n_buckets, d->g->stream);
    qt_wslots_acquire(d->ps->wslots, &d->wslots.io, qt_wslots_home(d->ps->wslots, upto ? upto - 1 : 0), +1);
}
void qt_dp_fill_backward(void *ctx, size_t from) {
    qt_dp_sync *d = ctx;
    qt_wslots_acquire(d->ps->wslots, &d->wslots.io, qt_wslots_home(d->ps->wslots, from), -1);
}

/* ZeRO-3 / offloaded weights: the buckets [k0, k1) with slots of their own gathered (copied up) on s
 * (the others are filled when the model acquires them); from bucket 0 on, no shared slot holds valid
 * weights any more. The gather stream then follows s: its next gathers read the codes made here and may
 * fill the shared slot the codes were made in. */
void qt_dp_fill_own(qt_dp_sync *d, int k0, int k1, cudaStream_t s) {
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

const slot_fill *qt_dp_fill_of(const qt_plan *p) {
    return !p->weights.slots ? NULL : p->weights.host_one ? &fill_copy_up : p->weights.host_shard ? &fill_zero3_host : &fill_zero3;
}
