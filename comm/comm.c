/* comm.c — the collective schedules, written once for both backends (GPU streams or CPU memcpy).
 *
 * peer kinds pull every foreign shard straight from its owner's buffer (direct: one stream per peer,
 * all at once; ring: one peer per step on one stream, step s reads rank r-s). host kinds stage
 * through one shared pinned arena: for an all-gather each owner copies its piece device->host once in
 * chunks through a small ring of arena slots and records one event per chunk, every reader copies
 * host->device chunk by chunk as those events complete (so D2H of chunk k+1 overlaps H2D of chunk k),
 * and an owner reuses a slot once every reader's copy out of it completed; a host reduce-scatter runs
 * the same ring with one region per (owner, reader) pair. Reduce-scatter fetches chunk k+1 into a
 * double-buffered staging area while chunk k is reduced on the caller's stream (ascending rank order,
 * fp32); the peer "load" variant instead runs one reduction kernel that reads every rank's src in
 * place. A rank's copy of its own shard is enqueued after the cross-rank copies have forked off its
 * stream, so it overlaps them (host kinds: on the device->host lane after its last chunk). The peer
 * kinds' broadcast on 3+ ranks above QT_COMM_BC_DIRECT_MAX is a chunked chain from the root; the peer
 * "load" all-reduce of up to QT_COMM_AR_FUSED_MAX bytes is one kernel that reduces a shard and stores
 * it to every rank. Below the one-shot limits (GPU comms) every collective is instead one kernel per rank
 * that meets its peers through flags (oneshot.h): no events, no copy engines. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "qt_error.h"

/* ---- backend dispatch: on the CPU every step runs synchronously in the calling thread ---- */

static void b_copy(qt_comm *c, int r, int lane, cudaStream_t s, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    if (c->gpu) qt_commg_copy(c, r, lane, s, dst, src, bytes);
    else memmove(dst, src, bytes);
}
static void b_dep(qt_comm *c, int r, int from, int to, cudaStream_t s) {
    if (c->gpu) qt_commg_dep(c, r, from, to, s);
}
static void b_mark(qt_comm *c, int r, int lane, cudaStream_t s, int which, int slot, int chunk) {
    if (c->gpu) qt_commg_mark(c, r, lane, s, which, slot, chunk);
}
static void b_wait_peer(qt_comm *c, int r, int lane, cudaStream_t s, int j, int which, int slot, int chunk) {
    if (c->gpu) qt_commg_wait_peer(c, r, lane, s, j, which, slot, chunk);
}
static void b_rec_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf) {
    if (c->gpu) qt_commg_record_pulled(c, r, lane, s, buf);
}
static void b_wait_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf) {
    if (c->gpu) qt_commg_wait_pulled(c, r, lane, s, buf);
}

static inline float red_max(float acc, float v) { return (v > acc || v != v) ? v : acc; }

static void cpu_reduce(qt_dtype dt, void *const *dsts, int ndst, const void *const *srcs, int nsrc, size_t n,
                       qt_comm_op op) {
    for (size_t i = 0; i < n; i++) {
        float acc = 0;
        for (int k = 0; k < nsrc; k++) {
            float v = dt == QT_DT_F32 ? ((const float *)srcs[k])[i] : qt_bf16_to_f32(((const uint16_t *)srcs[k])[i]);
            acc = k == 0 ? v : op == QT_COMM_SUM ? acc + v : red_max(acc, v);
        }
        for (int d = 0; d < ndst; d++) {
            if (dt == QT_DT_F32) ((float *)dsts[d])[i] = acc;
            else ((uint16_t *)dsts[d])[i] = qt_f32_to_bf16(acc);
        }
    }
}

/* dsts[0..ndst) = the reduction of srcs (see qt_comm_reduce_launch). */
static void b_reduce_to(qt_comm *c, cudaStream_t s, qt_dtype dt, void *const *dsts, int ndst,
                        const void *const *srcs, int nsrc, int remote, size_t n, qt_comm_op op) {
    if (!n) return;
    if (c->gpu) qt_comm_reduce_launch(dt, dsts, ndst, srcs, nsrc, remote, n, op, s);
    else cpu_reduce(dt, dsts, ndst, srcs, nsrc, n, op);
}
static void b_reduce(qt_comm *c, cudaStream_t s, qt_dtype dt, void *dst, const void *const *srcs, int nsrc,
                     int remote, size_t n, qt_comm_op op) {
    b_reduce_to(c, s, dt, &dst, 1, srcs, nsrc, remote, n, op);
}

/* ---- the per-collective protocol (see comm_internal.h) ---- */

typedef struct {
    int64_t seq;
    int slot;
} qt_coll;

static const char *op_name(int op) {
    switch (op) {
    case QT_OP_AG: return "all_gather";
    case QT_OP_AG_HOST: return "all_gather_host";
    case QT_OP_RS: return "reduce_scatter";
    case QT_OP_AR: return "all_reduce";
    case QT_OP_BC: return "broadcast";
    case QT_OP_SCAL: return "all_reduce_scalars";
    case QT_OP_BARRIER: return "barrier";
    default: return "?";
    }
}

static int coll_begin(qt_comm *c, int r, const qt_comm_desc *d, const void *src, qt_coll *k) {
    if (atomic_load(&c->aborted)) return -1;
    k->seq = ++c->seq[r];
    k->slot = (int)(k->seq % QT_COMM_SLOTS);
    /* The slot's pointers and events were last used QT_COMM_SLOTS collectives ago: reuse them only
     * after every rank enqueued all its waits on them (posted C). */
    if (k->seq > QT_COMM_SLOTS && qt_comm_wait_all(c, QT_PH_C, r, k->seq - QT_COMM_SLOTS)) return -1;
    c->slot[k->slot].src[r] = src;
    c->slot[k->slot].desc[r] = *d;
    return 0;
}

/* Rank j (which posted A for this collective) called the same one as rank r. */
static void check_same(qt_comm *c, int r, const qt_coll *k, int j) {
    const qt_comm_desc *me = &c->slot[k->slot].desc[r], *o = &c->slot[k->slot].desc[j];
    QT_CHECK(o->op == me->op && o->dt == me->dt && o->count == me->count && o->root == me->root &&
                 o->red == me->red,
             "collective #%lld: rank %d called %s(count=%zu, %s, root=%d, op=%d) but rank %d called "
             "%s(count=%zu, %s, root=%d, op=%d): every rank must call the same collectives in order",
             (long long)k->seq, r, op_name(me->op), me->count, qt_dtype_name((qt_dtype)me->dt), me->root,
             me->red, j, op_name(o->op), o->count, qt_dtype_name((qt_dtype)o->dt), o->root, o->red);
}

/* Waits until every rank posted A, then checks they all called the same collective. */
static int coll_sync_a(qt_comm *c, int r, const qt_coll *k) {
    if (qt_comm_wait_all(c, QT_PH_A, r, k->seq)) return -1;
    for (int j = 0; j < c->n; j++) check_same(c, r, k, j);
    return 0;
}

static int coll_phase_a(qt_comm *c, int r, const qt_coll *k, cudaStream_t s) {
    b_mark(c, r, 0, s, QT_EV_READY, k->slot, 0);
    qt_comm_post(c, QT_PH_A, r, k->seq);
    return coll_sync_a(c, r, k);
}

static int coll_end(qt_comm *c, int r, const qt_coll *k, cudaStream_t s) {
    b_mark(c, r, 0, s, QT_EV_DONE, k->slot, 0);
    qt_comm_post(c, QT_PH_B, r, k->seq);
    if (qt_comm_wait_all(c, QT_PH_B, r, k->seq)) return -1;
    /* No rank's stream passes this collective before every rank finished reading its buffers. */
    for (int j = 0; j < c->n; j++)
        if (j != r) b_wait_peer(c, r, 0, s, j, QT_EV_DONE, k->slot, 0);
    qt_comm_post(c, QT_PH_C, r, k->seq);
    return 0;
}

static int enter(qt_comm *c, int r) {
    QT_CHECK(r >= 0 && r < c->n, "rank %d out of range [0, %d)", r, c->n);
    if (atomic_load(&c->aborted)) return -1;
    if (c->gpu) qt_commg_enter(c, r);
    return 0;
}

void qt_comm_shard(size_t count, int n, int r, size_t *off, size_t *len) {
    size_t q = count / (size_t)n, m = count % (size_t)n, ur = (size_t)r;
    *off = ur * q + (ur < m ? ur : m);
    *len = q + (ur < m ? 1 : 0);
}

int qt_comm_size(const qt_comm *c) { return c->n; }
qt_comm_kind qt_comm_kind_of(const qt_comm *c) { return c->kind; }
const char *qt_comm_name(const qt_comm *c) { return c->name; }

static int is_host_kind(const qt_comm *c) { return c->kind == QT_COMM_HOST || c->kind == QT_COMM_HOST_WC; }

/* Elements per chunk for a collective whose largest per-rank piece is maxlen elements. A staged
 * collective costs about S/R + c/R + (S/c)*o for a piece of S bytes in chunks of c: the last chunk's
 * copy runs after everything else (fill/drain), and each chunk costs o beyond its bytes. On 2 x H200
 * (bench --host-sweep: R ~ 50 GB/s per direction with both busy, o ~ 6 us) that is smallest at
 * c = sqrt(S * o * R) = sqrt(S * 300 KB): 1.5 MiB at 16 MiB, 3 MiB at 64 MiB (76% of H2D at 64 MiB,
 * against 69% for a fixed 1/32 of the piece). Chunks above 4 MiB gain nothing in the sweeps and are
 * erratic (8 MiB at 256 MiB: 72% in one run, 81% in another), hence the 4 MiB cap. Two ring slots of
 * every arena region must also fit QT_COMM_RING_BYTES (ring_slots): with 4 ranks a reduce-scatter
 * has 12 regions, and 1 MiB chunks ran at 34-35 GB/s where the sqrt rule's 2-4 MiB (a footprint of
 * 48-96 MiB) ran at 25-29. Host kinds with the default chunk use that, in [256 KiB, chunk_bytes]. The
 * size depends only on (count, n, nregions), so every rank computes the same one. */
static size_t chunk_elems(const qt_comm *c, size_t es, size_t maxlen, size_t nregions) {
    size_t b = c->chunk_bytes;
    if (c->chunk_auto) {
        size_t want = (size_t)sqrt((double)maxlen * es * 300e3), fit = QT_COMM_RING_BYTES / (2 * nregions);
        if (want > fit) want = fit;
        want = want / 65536 * 65536;
        if (want < ((size_t)256 << 10)) want = (size_t)256 << 10;
        if (want < b) b = want;
    }
    return b / es;
}
/* Arena slots per region for the host rings (all-gather, broadcast, reduce-scatter): as many as fit
 * QT_COMM_RING_BYTES (at least two, so an owner copies chunk i+1 up while chunk i is read), at most what
 * the arena holds, QT_COMM_MAX_CHUNKS (one event pair each) and the number of chunks. */
static size_t ring_slots(const qt_comm *c, size_t es, size_t ch, size_t nregions, size_t nch) {
    QT_CHECK(nch < ((size_t)1 << QT_COMM_STEP_BITS), "host collective in %zu chunks of %zu B: too many chunks",
             nch, ch * es);
    size_t per = nregions * ch * es, fit = c->arena_bytes / per, k = QT_COMM_RING_BYTES / per;
    QT_CHECK(fit >= 1, "comm arena %zu B too small for %zu regions of %zu B", c->arena_bytes, nregions, ch * es);
    if (k < 2) k = 2;
    if (k > fit) k = fit;
    if (k > QT_COMM_MAX_CHUNKS) k = QT_COMM_MAX_CHUNKS;
    return k < nch ? k : nch;
}
static size_t cdiv(size_t a, size_t b) { return (a + b - 1) / b; }

/* The rings' lockstep (gather_staged, rs_staged); step0 = collective seq << QT_COMM_STEP_BITS. Before an
 * owner writes chunk i: every reader enqueued its copies of chunk i - nslot (same slot). */
static int ring_slot_free(qt_comm *c, int r, int64_t step0, size_t i, size_t nslot) {
    return i >= nslot && qt_comm_wait_all(c, QT_PH_R, r, step0 + (int64_t)(i - nslot) + 1);
}
/* After my write of chunk i is enqueued: wait until every owner's is, before enqueueing my reads. */
static int ring_written(qt_comm *c, int r, int64_t step0, size_t i) {
    qt_comm_post(c, QT_PH_W, r, step0 + (int64_t)i + 1);
    return qt_comm_wait_all(c, QT_PH_W, r, step0 + (int64_t)i + 1);
}

/* ---- all-gather and broadcast: every foreign segment is copied into dst ---- */

/* Segment of owner j in dst (broadcast: only root owns, all of it). */
static void seg(int op, size_t count, int n, int root, int j, size_t *off, size_t *len) {
    if (op == QT_OP_BC) { *off = 0; *len = j == root ? count : 0; }
    else qt_comm_shard(count, n, j, off, len);
}

/* ---- small collectives: one kernel per rank that meets its peers through flags (oneshot.h) ---- */

/* Arena bytes per rank for a host-kind one-shot collective whose ranks publish up to pub bytes. */
static size_t os_region(size_t pub) { return (pub + 255) / 256 * 256; }

/* Whether a collective of `bytes` (the whole tensor) whose ranks publish up to pub bytes runs as one kernel. */
static int os_fits(const qt_comm *c, size_t bytes, size_t pub) {
    if (!c->gpu || !c->oneshot_on || bytes > c->oneshot_max) return 0;
    return is_host_kind(c) ? (size_t)c->n * os_region(pub) <= c->arena_bytes : c->all_peer;
}

/* d->op on rank r: all-gather and broadcast copy every foreign piece into dst; reduce-scatter reduces my
 * shard of every rank's src; all-reduce (and the scalars) reduce everything: host kinds, each rank all of
 * it out of the arena; peer kinds, each rank its shard, stored into every rank's dst (in place is safe:
 * only rank r touches range r anywhere). Peer kinds read peers' buffers in place; host kinds read what
 * each rank published into its arena region (my own input straight from src). */
static int oneshot(qt_comm *c, int r, const qt_comm_desc *d, const void *src, void *dst, cudaStream_t s) {
    qt_coll k;
    if (coll_begin(c, r, d, src, &k)) return -1;
    c->slot[k.slot].dst[r] = dst;
    qt_comm_post(c, QT_PH_A, r, k.seq);
    if (coll_sync_a(c, r, &k)) return -1;
    const qt_comm_slot *sl = &c->slot[k.slot];
    int n = c->n, host = is_host_kind(c), op = d->op;
    size_t es = op == QT_OP_BARRIER ? 1 : qt_dtype_size((qt_dtype)d->dt), count = d->count, off, len, o, l;
    qt_comm_shard(count, n, r, &off, &len);
    size_t pub = op == QT_OP_AG ? cdiv(count, (size_t)n) * es : count * es; /* the most any rank publishes */
    const char *in[QT_COMM_MAX_RANKS];
    for (int j = 0; j < n; j++)
        in[j] = !host ? sl->src[j] : j == r ? (const char *)src : (const char *)c->arena + (size_t)j * os_region(pub);
    qt_oneshot a = {0};
    a.n = n;
    a.r = r;
    a.seq = (unsigned long long)k.seq;
    a.dt = d->dt;
    a.red = d->red;
    if (host && op != QT_OP_BARRIER && (op != QT_OP_BC || r == d->root)) {
        a.pub_src = src;
        a.pub_dst = c->arena + (size_t)r * os_region(pub);
        a.pub_bytes = op == QT_OP_AG ? len * es : count * es;
    }
    if (op == QT_OP_AG || (op == QT_OP_BC && r != d->root)) {
        for (int j = 0; j < n; j++) {
            seg(op, count, n, d->root, j, &o, &l);
            if (!l || (char *)dst + o * es == in[j]) continue;
            a.src[a.npiece] = in[j];
            a.dst[a.npiece] = (char *)dst + o * es;
            a.bytes[a.npiece++] = l * es;
        }
    } else if (op == QT_OP_RS || ((op == QT_OP_AR || op == QT_OP_SCAL) && !host)) {
        a.reduce = 1;
        a.nsrc = n;
        a.ndst = op == QT_OP_RS ? 1 : n;
        a.nelem = len;
        for (int j = 0; j < n; j++) {
            a.src[j] = in[j] + off * es;
            if (op != QT_OP_RS) a.dst[j] = (char *)sl->dst[j] + off * es;
        }
        if (op == QT_OP_RS) a.dst[0] = dst;
    } else if (op == QT_OP_AR || op == QT_OP_SCAL) {
        a.reduce = 1;
        a.nsrc = n;
        a.ndst = 1;
        a.nelem = count;
        for (int j = 0; j < n; j++) a.src[j] = in[j];
        a.dst[0] = dst;
    }
    qt_commg_oneshot(c, r, &a, s);
    qt_comm_post(c, QT_PH_B, r, k.seq);
    qt_comm_post(c, QT_PH_C, r, k.seq);
    return 0;
}

static int gather_pull(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, int op,
                       int root, cudaStream_t s) {
    size_t es = qt_dtype_size(dt), o, l;
    qt_comm_desc d = {op, dt, root, 0, count};
    qt_coll k;
    if (coll_begin(c, r, &d, src, &k)) return -1;
    /* READY is recorded before my own-shard copy, and the pull lanes fork from the caller's stream
     * before it too: peers' pulls of my src and my pulls of theirs overlap that local copy instead
     * of queueing behind it (the copy is ~20% of a 256 MiB all-gather). */
    if (coll_phase_a(c, r, &k, s)) return -1;
    size_t myo, myl;
    seg(op, count, c->n, root, r, &myo, &myl);
    int used[QT_COMM_ALL_LANES + 1] = {0};
    for (int step = 1; step < c->n; step++) {
        int j = (r - step + c->n) % c->n, lane = (c->ring ? 1 : step) + (op == QT_OP_AG_HOST ? QT_COMM_LANES : 0);
        seg(op, count, c->n, root, j, &o, &l);
        if (!l) continue;
        if (!used[lane]) b_dep(c, r, 0, lane, s);
        used[lane] = 1;
        b_wait_peer(c, r, lane, s, j, QT_EV_READY, k.slot, 0);
        b_copy(c, r, lane, s, dst + o * es, c->slot[k.slot].src[j], l * es);
    }
    if (op == QT_OP_AG || op == QT_OP_AG_HOST) b_copy(c, r, 0, s, dst + myo * es, src, myl * es);
    for (int lane = 1; lane <= QT_COMM_ALL_LANES; lane++)
        if (used[lane]) b_dep(c, r, lane, 0, s);
    return coll_end(c, r, &k, s);
}

/* Host all-gather / broadcast through a ring of arena slots: owner j copies chunk i of its piece
 * device->host into slot i % nslot of its region and every reader copies it host->device, so the
 * arena needs nslot chunks per owner whatever the size. The ranks' threads enqueue in lockstep, one
 * chunk step at a time (host counters W and R, no GPU waits): a reader enqueues its wait on chunk i's
 * event after the owner posted W for step i (the event is recorded), and the owner overwrites slot
 * i % nslot (re-recording its events) only after every reader posted R for step i - nslot, having
 * enqueued its copy out of it and recorded the PULL event the owner's device->host lane waits on. */
static int gather_staged(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, int op,
                         int root, cudaStream_t s) {
    size_t es = qt_dtype_size(dt), o, l;
    size_t maxlen = op == QT_OP_BC ? count : cdiv(count, (size_t)c->n), nreg = op == QT_OP_BC ? 1 : (size_t)c->n;
    size_t ch = chunk_elems(c, es, maxlen, nreg), nch = cdiv(maxlen, ch), nslot = ring_slots(c, es, ch, nreg, nch);
    seg(op, count, c->n, root, r, &o, &l);
    qt_comm_desc d = {op, dt, root, 0, count};
    qt_coll k;
    if (coll_begin(c, r, &d, NULL, &k) || coll_phase_a(c, r, &k, s)) return -1;
    int64_t step0 = k.seq << QT_COMM_STEP_BITS;
    char *arena = (char *)c->arena;
    int wrote = 0, read = 0;
    for (size_t i = 0; i < nch; i++) {
        int ev = (int)(i % nslot);
        size_t off = ev * ch;
        if (i * ch < l) {
            if (ring_slot_free(c, r, step0, i, nslot)) return -1;
            if (i >= nslot) /* every reader's copy of chunk i - nslot, which used this slot, completed */
                for (int j = 0; j < c->n; j++)
                    if (j != r) b_wait_peer(c, r, 1, s, j, QT_EV_PULL, k.slot, ev);
            if (!wrote) b_dep(c, r, 0, 1, s);
            wrote = 1;
            size_t cl = l - i * ch < ch ? l - i * ch : ch;
            char *mine = arena + ((op == QT_OP_BC ? 0 : (size_t)r) * nslot * ch + off) * es;
            b_copy(c, r, 1, s, mine, src + i * ch * es, cl * es);
            b_mark(c, r, 1, s, QT_EV_CHUNK, k.slot, ev);
            /* My own shard right after my last chunk went up: it runs while the H2D lane still copies
             * the last chunk down, instead of beside the first chunks, where a device->device copy
             * slowed the link copies (2 x H200, 64 MiB: 43.0 vs 42.2 GB/s). */
            if (op != QT_OP_BC && (i + 1) * ch >= l) b_copy(c, r, 1, s, dst + o * es, src, l * es);
        }
        if (ring_written(c, r, step0, i)) return -1;
        int any = 0;
        for (int st = 1; st < c->n; st++) {
            int j = (r + st) % c->n;
            size_t oj, lj;
            seg(op, count, c->n, root, j, &oj, &lj);
            if (i * ch >= lj) continue;
            size_t cl = lj - i * ch < ch ? lj - i * ch : ch;
            if (!read) b_dep(c, r, 0, 2, s);
            read = any = 1;
            const char *theirs = arena + ((op == QT_OP_BC ? 0 : (size_t)j) * nslot * ch + off) * es;
            b_wait_peer(c, r, 2, s, j, QT_EV_CHUNK, k.slot, ev);
            b_copy(c, r, 2, s, dst + (oj + i * ch) * es, theirs, cl * es);
        }
        if (any) b_mark(c, r, 2, s, QT_EV_PULL, k.slot, ev);
        qt_comm_post(c, QT_PH_R, r, step0 + (int64_t)i + 1);
    }
    if (wrote) b_dep(c, r, 1, 0, s);
    if (read) b_dep(c, r, 2, 0, s);
    return coll_end(c, r, &k, s);
}

/* Elements per chunk of the broadcast chain. With h = n-1 hops the last rank finishes h-1 chunks after
 * the root's link sent everything, and each chunk costs o beyond its bytes (a cross-device event wait
 * and a copy launch, partly hidden by the lanes): T = (S + (h-1)c)/B + (S/c)o, smallest at
 * c = sqrt(S o B / (h-1)). o B ~ 2 MB fits the 4 x H200 sweep (fixed 4/8/16/32 MiB chunks: best 8 MiB
 * at 64 MiB, 16 at 256 MiB, 32 at 1 GiB). At most QT_COMM_MAX_CHUNKS chunks (one event each). */
static size_t chain_chunk(const qt_comm *c, size_t es, size_t count) {
    size_t b = c->chunk_bytes, lo = cdiv(count * es, QT_COMM_MAX_CHUNKS);
    if (!c->chunk_given) b = ((size_t)sqrt((double)count * es * 2e6 / (c->n - 2)) + 65535) / 65536 * 65536;
    return cdiv(b > lo ? b : lo, es);
}

/* Broadcast as a chain root -> root+1 -> ... (peer kinds, 3+ ranks, above QT_COMM_BC_DIRECT_MAX): each
 * rank pulls chunk i from its predecessor once the predecessor's copy of chunk i completed, so every
 * link carries the buffer once and the hops overlap. Consecutive chunks go to different lanes so one
 * chunk's wait overlaps another's copy (one lane: 242 GB/s at 256 MiB on 4 x H200, three: 273). A rank
 * enqueues its waits on its predecessor's chunk events only after the predecessor posted A, which it
 * does after recording them. */
static int bc_chain(qt_comm *c, int r, char *buf, size_t count, qt_dtype dt, int root, cudaStream_t s) {
    size_t es = qt_dtype_size(dt), ch = chain_chunk(c, es, count);
    int pred = (r - 1 + c->n) % c->n, last = (r + 1) % c->n == root, nl = c->n - 1 > 2 ? c->n - 1 : 2;
    qt_comm_desc d = {QT_OP_BC, dt, root, 0, count};
    qt_coll k;
    if (coll_begin(c, r, &d, buf, &k)) return -1;
    if (r == root) b_mark(c, r, 0, s, QT_EV_READY, k.slot, 0);
    else {
        if (qt_comm_wait_one(c, QT_PH_A, r, pred, k.seq)) return -1;
        check_same(c, r, &k, pred);
        const char *from = c->slot[k.slot].src[pred];
        for (size_t i = 0; i * ch < count; i++) {
            size_t cl = count - i * ch < ch ? count - i * ch : ch;
            int lane = 1 + (int)(i % (size_t)nl);
            if (i < (size_t)nl) b_dep(c, r, 0, lane, s);
            if (pred != root) b_wait_peer(c, r, lane, s, pred, QT_EV_CHUNK, k.slot, (int)i);
            else if (i < (size_t)nl) b_wait_peer(c, r, lane, s, pred, QT_EV_READY, k.slot, 0);
            b_copy(c, r, lane, s, buf + i * ch * es, from + i * ch * es, cl * es);
            if (!last) b_mark(c, r, lane, s, QT_EV_CHUNK, k.slot, (int)i);
        }
        for (int lane = 1; lane <= nl && (size_t)(lane - 1) * ch < count; lane++) b_dep(c, r, lane, 0, s);
    }
    qt_comm_post(c, QT_PH_A, r, k.seq);
    if (coll_sync_a(c, r, &k)) return -1;
    return coll_end(c, r, &k, s);
}

static int gather_any(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt, int op,
                      int root, cudaStream_t s) {
    if (enter(c, r)) return -1;
    if (!count) return 0;
    size_t es = qt_dtype_size(dt);
    if (c->n == 1) {
        if (op != QT_OP_BC) b_copy(c, r, 0, s, dst, src, count * es);
        return 0;
    }
    if (op != QT_OP_AG_HOST && os_fits(c, count * es, op == QT_OP_BC ? count * es : cdiv(count, (size_t)c->n) * es)) {
        qt_comm_desc d = {op, dt, root, 0, count};
        return oneshot(c, r, &d, src, dst, s);
    }
    if (op == QT_OP_BC && !is_host_kind(c) && c->n >= 3 && count * es > QT_COMM_BC_DIRECT_MAX)
        return bc_chain(c, r, dst, count, dt, root, s);
    if (op == QT_OP_AG_HOST || !is_host_kind(c)) return gather_pull(c, r, dst, src, count, dt, op, root, s);
    return gather_staged(c, r, dst, src, count, dt, op, root, s);
}

int qt_comm_all_gather(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt, cudaStream_t s) {
    return gather_any(c, r, dst, src, count, dt, QT_OP_AG, 0, s);
}
int qt_comm_all_gather_host(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                            cudaStream_t s) {
    return gather_any(c, r, dst, src, count, dt, QT_OP_AG_HOST, 0, s);
}
int qt_comm_broadcast(qt_comm *c, int r, int root, void *buf, size_t count, qt_dtype dt, cudaStream_t s) {
    QT_CHECK(root >= 0 && root < c->n, "broadcast root %d out of range [0, %d)", root, c->n);
    return gather_any(c, r, buf, buf, count, dt, QT_OP_BC, root, s);
}

/* ---- reduce-scatter ---- */

typedef struct {
    qt_comm *c;
    int r, staged, slot;
    cudaStream_t s;
    qt_dtype dt;
    size_t es, ch, nslot; /* staged: chunks per arena region (ring slots) */
    const char *own;      /* my src at my shard */
    char *dst;
    size_t myoff;         /* pull: my shard's offset in every rank's src */
    size_t len;           /* elements of my shard */
    int used[QT_COMM_LANES + 1];
} qt_rs;

static char *rs_stage(qt_rs *x, int buf, int q) {
    return (char *)x->c->stage[x->r] + ((size_t)buf * (x->c->n - 1) + (size_t)q) * x->ch * x->es;
}
/* Arena region that owner j fills for rank i's shard (j != i). */
static size_t rs_region(int n, int j, int i) { return (size_t)j * (n - 1) + (size_t)(i < j ? i : i - 1); }

/* Copies chunk i of my shard from every peer into staging buffer i % 2 (host kinds: out of ring slot
 * i % nslot of the peer's region for me, once the peer's copy into it completed). */
static void rs_fetch(qt_rs *x, size_t i) {
    qt_comm *c = x->c;
    int n = c->n, r = x->r, buf = (int)(i % 2);
    size_t cl = x->len - i * x->ch < x->ch ? x->len - i * x->ch : x->ch;
    for (int step = 1; step < n; step++) {
        int j = (r - step + n) % n, lane = x->staged ? 2 : c->ring ? 1 : step;
        if (!x->used[lane]) b_dep(c, r, 0, lane, x->s);
        x->used[lane] = 1;
        const char *from;
        if (x->staged) {
            int ev = (int)(i % x->nslot);
            b_wait_peer(c, r, lane, x->s, j, QT_EV_CHUNK, x->slot, ev);
            from = (const char *)c->arena + (rs_region(n, j, r) * x->nslot + (size_t)ev) * x->ch * x->es;
        } else {
            if (i == 0) b_wait_peer(c, r, lane, x->s, j, QT_EV_READY, x->slot, 0);
            from = (const char *)c->slot[x->slot].src[j] + (x->myoff + i * x->ch) * x->es;
        }
        b_copy(c, r, lane, x->s, rs_stage(x, buf, step - 1), from, cl * x->es);
    }
    for (int lane = 1; lane <= QT_COMM_LANES; lane++)
        if (x->used[lane]) b_rec_pulled(c, r, lane, x->s, buf);
}

/* Makes the fetch lanes wait for my stream's current point: the reduction that last read the
 * staging buffer the next fetch fills. */
static void rs_lanes_after_me(qt_rs *x) {
    for (int lane = 1; lane <= QT_COMM_LANES; lane++)
        if (x->used[lane]) b_dep(x->c, x->r, 0, lane, x->s);
}

/* Reduces chunk i (my src + the fetched pieces, ascending rank order) into dst on my stream. */
static void rs_reduce(qt_rs *x, size_t i) {
    qt_comm *c = x->c;
    int n = c->n, r = x->r;
    for (int lane = 1; lane <= QT_COMM_LANES; lane++)
        if (x->used[lane]) b_wait_pulled(c, r, lane, x->s, (int)(i % 2));
    const void *srcs[QT_COMM_MAX_RANKS];
    for (int j = 0; j < n; j++)
        srcs[j] = j == r ? (const void *)(x->own + i * x->ch * x->es)
                         : (const void *)rs_stage(x, (int)(i % 2), (r - j + n) % n - 1);
    size_t cl = x->len - i * x->ch < x->ch ? x->len - i * x->ch : x->ch;
    b_reduce(c, x->s, x->dt, x->dst + i * x->ch * x->es, srcs, n, 0, cl, QT_COMM_SUM);
}

static void rs_join(qt_rs *x) {
    for (int lane = 1; lane <= QT_COMM_LANES; lane++)
        if (x->used[lane]) b_dep(x->c, x->r, lane, 0, x->s);
}

static int rs_pull(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, cudaStream_t s) {
    qt_comm_desc d = {QT_OP_RS, dt, 0, QT_COMM_SUM, count};
    qt_coll k;
    if (coll_begin(c, r, &d, src, &k)) return -1;
    if (coll_phase_a(c, r, &k, s)) return -1;
    qt_rs x = {0};
    x.c = c; x.r = r; x.slot = k.slot; x.s = s; x.dt = dt;
    x.es = qt_dtype_size(dt); x.ch = chunk_elems(c, x.es, cdiv(count, (size_t)c->n), 1);
    qt_comm_shard(count, c->n, r, &x.myoff, &x.len);
    x.own = src + x.myoff * x.es;
    x.dst = dst;
    /* fetch(i+1) is enqueued before reduce(i), so it waits only for reduce(i-1), the last reader of
     * its buffer */
    size_t nch = cdiv(x.len, x.ch);
    if (nch) rs_fetch(&x, 0);
    for (size_t i = 0; i < nch; i++) {
        if (i + 1 < nch) {
            rs_lanes_after_me(&x);
            rs_fetch(&x, i + 1);
        }
        rs_reduce(&x, i);
    }
    rs_join(&x);
    return coll_end(c, r, &k, s);
}

/* Reduce-scatter with P2P loads: one kernel on my stream reads my shard's range of every rank's src
 * in place (through peer pointers on GPUs), in ascending rank order; no staging, no chunks. */
static int rs_load(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, cudaStream_t s) {
    qt_comm_desc d = {QT_OP_RS, dt, 0, QT_COMM_SUM, count};
    qt_coll k;
    if (coll_begin(c, r, &d, src, &k)) return -1;
    if (coll_phase_a(c, r, &k, s)) return -1;
    size_t es = qt_dtype_size(dt), off, len;
    qt_comm_shard(count, c->n, r, &off, &len);
    const void *srcs[QT_COMM_MAX_RANKS];
    for (int j = 0; j < c->n; j++) {
        if (j != r) b_wait_peer(c, r, 0, s, j, QT_EV_READY, k.slot, 0);
        srcs[j] = (const char *)c->slot[k.slot].src[j] + off * es;
    }
    b_reduce(c, s, dt, dst, srcs, c->n, c->n - 1, len, QT_COMM_SUM);
    return coll_end(c, r, &k, s);
}

/* Host reduce-scatter through a ring of arena slots, in the all-gather's lockstep (gather_staged): at
 * step i every owner copies chunk i of each other rank's shard device->host into slot i % nslot of
 * its region for that rank (once that rank's copy out of the slot, nslot steps ago, completed), then
 * every rank fetches chunk i of its shard from all owners' regions and reduces chunk i-1 meanwhile. */
static int rs_staged(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, cudaStream_t s) {
    int n = c->n;
    size_t es = qt_dtype_size(dt), maxlen = cdiv(count, (size_t)n), nreg = (size_t)n * (n - 1);
    size_t ch = chunk_elems(c, es, maxlen, nreg), nch = cdiv(maxlen, ch), nslot = ring_slots(c, es, ch, nreg, nch);
    size_t myoff, mylen;
    qt_comm_shard(count, n, r, &myoff, &mylen);
    qt_comm_desc d = {QT_OP_RS, dt, 0, QT_COMM_SUM, count};
    qt_coll k;
    if (coll_begin(c, r, &d, NULL, &k) || coll_phase_a(c, r, &k, s)) return -1;
    int64_t step0 = k.seq << QT_COMM_STEP_BITS;
    qt_rs x = {0};
    x.c = c; x.r = r; x.staged = 1; x.slot = k.slot; x.s = s; x.dt = dt;
    x.es = es; x.ch = ch; x.nslot = nslot;
    x.len = mylen;
    x.own = src + myoff * es;
    x.dst = dst;
    int wrote = 0;
    for (size_t i = 0; i < nch; i++) {
        int ev = (int)(i % nslot), any = 0;
        if (ring_slot_free(c, r, step0, i, nslot)) return -1;
        for (int step = 1; step < n; step++) {
            int dest = (r + step) % n;
            size_t od, ld;
            qt_comm_shard(count, n, dest, &od, &ld);
            if (i * ch >= ld) continue;
            if (i >= nslot) b_wait_peer(c, r, 1, s, dest, QT_EV_PULL, k.slot, ev);
            if (!wrote) b_dep(c, r, 0, 1, s);
            wrote = any = 1;
            size_t cl = ld - i * ch < ch ? ld - i * ch : ch;
            char *to = (char *)c->arena + (rs_region(n, r, dest) * nslot + (size_t)ev) * ch * es;
            b_copy(c, r, 1, s, to, src + (od + i * ch) * es, cl * es);
        }
        if (any) b_mark(c, r, 1, s, QT_EV_CHUNK, k.slot, ev);
        if (ring_written(c, r, step0, i)) return -1;
        if (i * ch < mylen) {
            if (i) rs_lanes_after_me(&x);
            rs_fetch(&x, i);
            b_mark(c, r, 2, s, QT_EV_PULL, k.slot, ev);
        }
        qt_comm_post(c, QT_PH_R, r, step0 + (int64_t)i + 1);
        if (i && (i - 1) * ch < mylen) rs_reduce(&x, i - 1);
    }
    if (nch && (nch - 1) * ch < mylen) rs_reduce(&x, nch - 1);
    rs_join(&x);
    if (wrote) b_dep(c, r, 1, 0, s);
    return coll_end(c, r, &k, s);
}

int qt_comm_reduce_scatter(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                           cudaStream_t s) {
    QT_CHECK(dt == QT_DT_F32 || dt == QT_DT_BF16, "reduce_scatter: dtype %s, expected fp32 or bf16",
             qt_dtype_name(dt));
    if (enter(c, r)) return -1;
    if (!count) return 0;
    if (c->n == 1) {
        b_copy(c, r, 0, s, dst, src, count * qt_dtype_size(dt));
        return 0;
    }
    if (os_fits(c, count * qt_dtype_size(dt), count * qt_dtype_size(dt))) {
        qt_comm_desc d = {QT_OP_RS, dt, 0, QT_COMM_SUM, count};
        return oneshot(c, r, &d, src, dst, s);
    }
    if (is_host_kind(c)) return rs_staged(c, r, dst, src, count, dt, s);
    return c->rs_load ? rs_load(c, r, dst, src, count, dt, s) : rs_pull(c, r, dst, src, count, dt, s);
}

/* All-reduce with peer loads and stores (peer kind with rs_load): one kernel per rank reads its shard's
 * range of every rank's src, reduces it in rank order and stores the result into that range of every
 * rank's dst — reduce-scatter and all-gather in one pass with one handshake. Peers' stores into my
 * dst have landed once my stream passed coll_end's waits on their DONE events, and their READY
 * events say their dst is free. In place is safe: only rank r reads or writes range r anywhere. */
static int ar_load(qt_comm *c, int r, char *dst, const char *src, size_t count, qt_dtype dt, cudaStream_t s) {
    qt_comm_desc d = {QT_OP_AR, dt, 0, QT_COMM_SUM, count};
    qt_coll k;
    if (coll_begin(c, r, &d, src, &k)) return -1;
    c->slot[k.slot].dst[r] = dst;
    if (coll_phase_a(c, r, &k, s)) return -1;
    size_t es = qt_dtype_size(dt), off, len;
    qt_comm_shard(count, c->n, r, &off, &len);
    const void *srcs[QT_COMM_MAX_RANKS];
    void *dsts[QT_COMM_MAX_RANKS];
    for (int j = 0; j < c->n; j++) {
        if (j != r) b_wait_peer(c, r, 0, s, j, QT_EV_READY, k.slot, 0);
        srcs[j] = (const char *)c->slot[k.slot].src[j] + off * es;
        dsts[j] = (char *)c->slot[k.slot].dst[j] + off * es;
    }
    b_reduce_to(c, s, dt, dsts, c->n, srcs, c->n, c->n - 1, len, QT_COMM_SUM);
    return coll_end(c, r, &k, s);
}

int qt_comm_all_reduce(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt, cudaStream_t s) {
    QT_CHECK(dt == QT_DT_F32 || dt == QT_DT_BF16, "all_reduce: dtype %s, expected fp32 or bf16",
             qt_dtype_name(dt));
    if (enter(c, r)) return -1;
    if (!count) return 0;
    size_t es = qt_dtype_size(dt), off, len;
    if (c->n == 1) {
        b_copy(c, r, 0, s, dst, src, count * es);
        return 0;
    }
    if (os_fits(c, count * es, count * es)) {
        qt_comm_desc d = {QT_OP_AR, dt, 0, QT_COMM_SUM, count};
        return oneshot(c, r, &d, src, dst, s);
    }
    /* The fused kernel moves what reduce-scatter + all-gather move, with one handshake instead of two,
     * but SM loads and stores together run below what the loads and then the copy engines reach one
     * after the other. Fused / split, busbw GB/s: 4 x H200 4 KiB 29 / 83 us, 16 MiB 233 / 170, 64
     * MiB 294 / 250-277, 256 MiB 314 / 331; 2 x H200 4 KiB 15 / 26 us, 16 MiB 256 / 220, 64 MiB 316
     * / 308 (bench/archive/RESULTS-history.md). */
    if (c->rs_load && !is_host_kind(c) && count * es <= QT_COMM_AR_FUSED_MAX)
        return ar_load(c, r, dst, src, count, dt, s);
    qt_comm_shard(count, c->n, r, &off, &len);
    char *mine = (char *)dst + off * es;
    if (qt_comm_reduce_scatter(c, r, mine, src, count, dt, s)) return -1;
    return qt_comm_all_gather(c, r, dst, mine, count, dt, s);
}

/* ---- small ones: scalars through the pinned arena, barrier ---- */

int qt_comm_all_reduce_scalars(qt_comm *c, int r, float *vals, int nv, qt_comm_op op, cudaStream_t s) {
    QT_CHECK(nv >= 0 && nv <= QT_COMM_MAX_SCALARS, "all_reduce_scalars: n=%d, expected 0..%d", nv,
             QT_COMM_MAX_SCALARS);
    if (enter(c, r)) return -1;
    if (!nv || c->n == 1) return 0;
    qt_comm_desc d = {QT_OP_SCAL, QT_DT_F32, 0, op, (size_t)nv};
    if (os_fits(c, 0, (size_t)nv * 4)) return oneshot(c, r, &d, vals, vals, s);
    qt_coll k;
    if (coll_begin(c, r, &d, NULL, &k)) return -1;
    b_copy(c, r, 0, s, c->scal + (size_t)r * QT_COMM_MAX_SCALARS, vals, (size_t)nv * 4);
    if (coll_phase_a(c, r, &k, s)) return -1;
    for (int j = 0; j < c->n; j++)
        if (j != r) b_wait_peer(c, r, 0, s, j, QT_EV_READY, k.slot, 0);
    b_copy(c, r, 0, s, c->scal_stage[r], c->scal, (size_t)c->n * QT_COMM_MAX_SCALARS * 4);
    const void *srcs[QT_COMM_MAX_RANKS];
    for (int j = 0; j < c->n; j++) srcs[j] = c->scal_stage[r] + (size_t)j * QT_COMM_MAX_SCALARS;
    b_reduce(c, s, QT_DT_F32, vals, srcs, c->n, 0, (size_t)nv, op);
    return coll_end(c, r, &k, s);
}

int qt_comm_barrier(qt_comm *c, int r, cudaStream_t s) {
    if (enter(c, r)) return -1;
    if (c->n == 1) return 0;
    qt_comm_desc d = {QT_OP_BARRIER, 0, 0, 0, 0};
    if (os_fits(c, 0, 0)) return oneshot(c, r, &d, NULL, NULL, s);
    qt_coll k;
    if (coll_begin(c, r, &d, NULL, &k)) return -1;
    if (coll_phase_a(c, r, &k, s)) return -1;
    for (int j = 0; j < c->n; j++)
        if (j != r) b_wait_peer(c, r, 0, s, j, QT_EV_READY, k.slot, 0);
    return coll_end(c, r, &k, s);
}

/* ---- creation (the GPU part is in comm_gpu.c) ---- */

static const char *kind_name(qt_comm_kind k, int ring, int load) {
    switch (k) {
    case QT_COMM_PEER: return load ? (ring ? "peer_ring_load" : "peer_load") : ring ? "peer_ring" : "peer";
    case QT_COMM_HOST: return "host";
    case QT_COMM_HOST_WC: return "host_wc";
    default: return "auto";
    }
}

/* Common part of both constructors; kind must already be resolved. */
qt_comm *qt_comm_alloc(int n, qt_comm_kind kind, size_t arena_bytes, const qt_comm_opts *opts, int gpu) {
    QT_CHECK(n >= 1 && n <= QT_COMM_MAX_RANKS, "comm: %d ranks, expected 1..%d", n, QT_COMM_MAX_RANKS);
    qt_comm *c = calloc(1, sizeof *c);
    QT_CHECK(c != NULL, "out of memory");
    c->n = n;
    c->gpu = gpu;
    c->kind = kind;
    c->ring = opts ? opts->ring : 0;
    c->timeout_s = opts ? opts->timeout_s : 0;
    int host = kind == QT_COMM_HOST || kind == QT_COMM_HOST_WC;
    size_t chunk = opts && opts->chunk_bytes ? opts->chunk_bytes : host ? (4u << 20) : (16u << 20);
    c->chunk_given = opts && opts->chunk_bytes;
    c->chunk_auto = host && !c->chunk_given;
    c->chunk_bytes = chunk < 64 ? 64 : chunk / 16 * 16;
    c->oneshot_on = !(opts && opts->no_oneshot);
    c->oneshot_max = opts && opts->oneshot_max ? opts->oneshot_max : host ? QT_COMM_ONESHOT_HOST_MAX : QT_COMM_ONESHOT_PEER_MAX;
    if (!host) arena_bytes = 0;
    else {
        if (!arena_bytes) arena_bytes = 2 * QT_COMM_RING_BYTES; /* the rings use ~QT_COMM_RING_BYTES */
        size_t need = (size_t)n * (n > 1 ? n - 1 : 1) * c->chunk_bytes;
        if (arena_bytes < need) arena_bytes = need; /* one chunk per reduce-scatter region at least */
    }
    c->arena_bytes = arena_bytes / 16 * 16;
    c->stage_bytes = n > 1 ? 2 * (size_t)(n - 1) * c->chunk_bytes : 0;
    qt_comm_set_rs(c, opts, opts ? opts->probe : NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    for (int p = 0; p < QT_PH_N; p++)
        for (int j = 0; j < QT_COMM_MAX_RANKS; j++) atomic_init(&c->posted[p][j], 0);
    atomic_init(&c->aborted, 0);
    return c;
}

void qt_comm_set_rs(qt_comm *c, const qt_comm_opts *opts, const qt_comm_probe_result *probe) {
    int want = opts ? opts->peer_rs : QT_COMM_RS_AUTO;
    if (want == QT_COMM_RS_AUTO) want = probe && probe->pick_rs == QT_COMM_RS_LOAD ? QT_COMM_RS_LOAD : QT_COMM_RS_COPY;
    c->rs_load = c->kind == QT_COMM_PEER && want == QT_COMM_RS_LOAD;
    snprintf(c->name, sizeof c->name, "%s", kind_name(c->kind, c->ring, c->rs_load));
}

void qt_comm_plan_bytes(int n, qt_comm_kind kind, size_t *dev_per_rank, size_t *pinned) {
    *dev_per_rank = *pinned = 0;
    for (int host = 0; host < 2; host++) { /* AUTO: whichever of the two kinds needs more */
        if ((kind == QT_COMM_PEER && host) || ((kind == QT_COMM_HOST || kind == QT_COMM_HOST_WC) && !host)) continue;
        qt_comm *c = qt_comm_alloc(n, host ? QT_COMM_HOST : QT_COMM_PEER, 0, NULL, 0);
        size_t scal = (size_t)n * QT_COMM_MAX_SCALARS * sizeof(float), flags = QT_COMM_MAX_RANKS * 8;
        size_t dev = c->stage_bytes + scal + flags + 4096; /* 4 KiB: the one-shot locals */
        size_t pin = scal + c->arena_bytes + 64 + (size_t)n * QT_COMM_MAX_RANKS * 8;
        if (dev > *dev_per_rank) *dev_per_rank = dev;
        if (pin > *pinned) *pinned = pin;
        qt_comm_free(c);
    }
}

qt_comm *qt_comm_create_cpu(int n, qt_comm_kind kind, size_t arena_bytes, const qt_comm_opts *opts) {
    if (kind == QT_COMM_AUTO) kind = QT_COMM_PEER;
    qt_comm *c = qt_comm_alloc(n, kind, arena_bytes, opts, 0);
    size_t scal = (size_t)n * QT_COMM_MAX_SCALARS * sizeof(float);
    c->arena = malloc(scal + c->arena_bytes);
    QT_CHECK(c->arena != NULL, "out of memory for a %zu B comm arena", scal + c->arena_bytes);
    c->scal = (float *)c->arena;
    c->arena += scal;
    for (int r = 0; r < n; r++) {
        c->stage[r] = malloc(c->stage_bytes ? c->stage_bytes : 16);
        c->scal_stage[r] = malloc(scal);
        QT_CHECK(c->stage[r] && c->scal_stage[r], "out of memory for comm staging");
    }
    qt_comm_register(c);
    return c;
}

void qt_comm_free(qt_comm *c) {
    if (!c) return;
    qt_comm_unregister(c);
    if (c->gpu) qt_commg_free(c);
    else {
        for (int r = 0; r < c->n; r++) {
            free(c->stage[r]);
            free(c->scal_stage[r]);
        }
        free(c->scal);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
