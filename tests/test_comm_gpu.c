/* test_comm_gpu.c — comm on GPUs: every op and kind with as many ranks as devices, with 3 ranks on one
 * device, with 1 rank and with 8 (round-robin over the devices); odd sizes, chunk and ring-slot edges,
 * random delays, 10,000 back-to-back collectives, abort, an injected failure and one hardware queue per
 * device (child processes), all-reduce on both sides of the fused kernel's limit, the broadcast chain
 * behind a late root, the host rings behind a late reader, host all-gathers on a second stream beside
 * staged reduce-scatters, and collectives above 4 GiB.
 * Skips cleanly without a CUDA device. */
#include <cuda_runtime.h>

#include "test_comm_common.h"

static int g_dev[QT_COMM_MAX_RANKS];
static int g_ndev;

static void *d_alloc(int r, size_t b) {
    void *p = NULL;
    QT_CUDA(cudaSetDevice(g_dev[r]));
    QT_CUDA(cudaMalloc(&p, b ? b : 16));
    return p;
}
static void d_release(int r, void *p) {
    QT_CUDA(cudaSetDevice(g_dev[r]));
    QT_CUDA(cudaFree(p));
}
static void d_put(int r, cudaStream_t s, void *d, const void *h, size_t b) {
    (void)r;
    if (!b) return;
    QT_CUDA(cudaMemcpyAsync(d, h, b, cudaMemcpyDefault, s));
    QT_CUDA(cudaStreamSynchronize(s));
}
static void d_get(int r, cudaStream_t s, void *h, const void *d, size_t b) {
    (void)r;
    if (b) QT_CUDA(cudaMemcpyAsync(h, d, b, cudaMemcpyDefault, s));
    QT_CUDA(cudaStreamSynchronize(s));
}
static cudaStream_t d_stream(int r) {
    cudaStream_t s;
    QT_CUDA(cudaSetDevice(g_dev[r]));
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}
static void d_stream_free(int r, cudaStream_t s) {
    (void)r;
    QT_CUDA(cudaStreamSynchronize(s));
    QT_CUDA(cudaStreamDestroy(s));
}
static void *d_halloc(size_t b) {
    void *p = NULL;
    QT_CUDA(cudaHostAlloc(&p, b ? b : 16, cudaHostAllocPortable));
    return p;
}
static void d_hrelease(void *p) { QT_CUDA(cudaFreeHost(p)); }
static const ct_mem g_dmem = {d_alloc, d_release, d_put, d_get, d_stream, d_stream_free, d_halloc, d_hrelease};

static int have_gpu(void) {
    static int n = -1;
    if (n < 0) {
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            (void)cudaGetLastError();
            n = 0;
        }
    }
    g_ndev = n;
    return n > 0;
}

/* Layouts: 0 = one rank per device (needs >= 2), 1 = three ranks on device 0, 2 = one rank. */
static int layout(int which) {
    int n = which == 0 ? (g_ndev > QT_COMM_MAX_RANKS ? QT_COMM_MAX_RANKS : g_ndev) : which == 1 ? 3 : 1;
    for (int r = 0; r < n; r++) g_dev[r] = which == 0 ? r : 0;
    return which == 0 && g_ndev < 2 ? 0 : n;
}

static int g_peer_rs; /* QT_COMM_RS_* for make() */
/* for make(): -1 = never one kernel per rank (the tests named after a schedule run it at every size),
 * 0 = the default one-shot limits, 1 = one kernel at every size that fits */
static int g_oneshot = -1;

static qt_comm *make(int n, qt_comm_kind kind, int ring, size_t chunk, size_t arena) {
    qt_comm_opts o = {0};
    o.ring = ring;
    o.peer_rs = g_peer_rs;
    o.no_oneshot = g_oneshot < 0;
    o.oneshot_max = g_oneshot > 0 ? (size_t)1 << 40 : 0;
    o.chunk_bytes = chunk;
    o.timeout_s = 120;
    return qt_comm_create(n, g_dev, kind, arena, &o);
}

/* 1500007 fp32 (6 MB) is above the peer broadcast's direct-pull limit: a chain on 3+ ranks. */
static const size_t g_sizes[] = {0, 1, 2, 7, 13, 257, 1009, 16383, 16384, 16385, 100003, 1000003, 1500007};

static void run_kind(qt_comm_kind kind, int ring, int delay) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    ct_job j;
    for (int lay = 0; lay < 3; lay++) {
        int n = layout(lay);
        if (!n) continue;
        /* 64 KiB chunks (16384 fp32) and a 1 MiB arena: chunk edges and reused ring slots (with one-shot
         * forced, 32 MiB: every size runs as one kernel). */
        qt_comm *c = make(n, kind, ring, 64 << 10, g_oneshot > 0 ? 32 << 20 : 1 << 20);
        for (size_t si = 0; si < sizeof g_sizes / sizeof g_sizes[0]; si++) {
            if (delay && g_sizes[si] > 100003) continue;
            const char *e = ct_script(c, &g_dmem, g_sizes[si], delay, 31 * n + si, &j);
            QT_EXPECT(e == NULL, "%s, %d ranks (layout %d): %s", qt_comm_name(c), n, lay, e);
            if (e) break;
        }
        qt_comm_free(c);
    }
}

static void test_peer_direct(void) { run_kind(QT_COMM_PEER, 0, 0); }
static void test_peer_ring(void) { run_kind(QT_COMM_PEER, 1, 0); }
/* Reduce-scatter through peer-pointer loads, plain and with random delays (which would expose a
 * missing READY wait or an early DONE: a peer overwriting src while it is read). */
static void test_peer_load(void) {
    g_peer_rs = QT_COMM_RS_LOAD;
    run_kind(QT_COMM_PEER, 0, 0);
    run_kind(QT_COMM_PEER, 0, 1);
    g_peer_rs = QT_COMM_RS_AUTO;
}
/* Host kinds with the default (per-collective) chunk size, up to 1000003 elements (several chunks). */
static void test_host_auto_chunk(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    ct_job j;
    for (int lay = 0; lay < 3; lay++) {
        int n = layout(lay);
        if (!n) continue;
        qt_comm *c = make(n, QT_COMM_HOST, 0, 0, 0);
        for (size_t si = 0; si < sizeof g_sizes / sizeof g_sizes[0]; si++) {
            const char *e = ct_script(c, &g_dmem, g_sizes[si], 0, 57 * n + si, &j);
            QT_EXPECT(e == NULL, "%s auto chunk, %d ranks (layout %d): %s", qt_comm_name(c), n, lay, e);
            if (e) break;
        }
        qt_comm_free(c);
    }
}
static void test_host(void) { run_kind(QT_COMM_HOST, 0, 0); }
static void test_host_wc(void) { run_kind(QT_COMM_HOST_WC, 0, 0); }
/* qt_comm_all_gather_host on a second stream beside staged (host ring) reduce-scatters on the first, as
 * ZeRO-3's gather stream runs beside the gradient sums (src/engine/dp_sync.c): the same calls in the same
 * order on every rank, random host-function sleeps on either stream, 20 of each with their own outputs;
 * every value is a small integer in fp32, so each result is exact. One rank per GPU, then 3 on one GPU. */
typedef struct {
    qt_comm *c;
    int r, n;
    size_t count;
    float **piece; /* [n] each rank's pinned host piece of the all-gather (shard of count) */
    char err[320];
} beside_arg;
#define BESIDE_ITERS 20

static void CUDART_CB beside_sleep(void *us) { usleep((useconds_t)(uintptr_t)us); }

static float beside_rs_in(int r, size_t i) { return (float)((r + 1) * (int)(i % 97)); }
static float beside_piece(int j, size_t i) { return (float)(j * 131 + (int)(i % 89)); }

static void *beside_worker(void *p) {
    beside_arg *a = p;
    int r = a->r, n = a->n;
    size_t N = a->count, off, len;
    qt_error_set_rank(r);
    qt_comm_shard(N, n, r, &off, &len);
    cudaStream_t sa = d_stream(r), sb = d_stream(r);
    float *h = malloc(N * 4 * BESIDE_ITERS);
    QT_CHECK(h, "out of host memory");
    for (size_t i = 0; i < N; i++) h[i] = beside_rs_in(r, i);
    float *src = d_alloc(r, N * 4), *rs = d_alloc(r, BESIDE_ITERS * len * 4), *ag = d_alloc(r, BESIDE_ITERS * N * 4);
    d_put(r, sa, src, h, N * 4);
    qt_rng g;
    qt_rng_seed(&g, 17 + (uint64_t)r);
    for (int it = 0; it < BESIDE_ITERS && !a->err[0]; it++) {
        if (qt_rng_below(&g, 2)) QT_CUDA(cudaLaunchHostFunc(sa, beside_sleep, (void *)(uintptr_t)qt_rng_below(&g, 3000)));
        if (qt_comm_reduce_scatter(a->c, r, rs + it * len, src, N, QT_DT_F32, sa))
            snprintf(a->err, sizeof a->err, "rank %d: reduce-scatter %d aborted", r, it);
        if (qt_rng_below(&g, 2)) QT_CUDA(cudaLaunchHostFunc(sb, beside_sleep, (void *)(uintptr_t)qt_rng_below(&g, 3000)));
        if (!a->err[0] && qt_comm_all_gather_host(a->c, r, ag + it * N, a->piece[r], N, QT_DT_F32, sb))
            snprintf(a->err, sizeof a->err, "rank %d: host all-gather %d aborted", r, it);
    }
    d_get(r, sb, h, ag, BESIDE_ITERS * N * 4);
    for (int it = 0; it < BESIDE_ITERS && !a->err[0]; it++)
        for (int j = 0; j < n && !a->err[0]; j++) {
            size_t oj, lj;
            qt_comm_shard(N, n, j, &oj, &lj);
            for (size_t i = 0; i < lj; i++)
                if (h[it * N + oj + i] != beside_piece(j, i)) {
                    snprintf(a->err, sizeof a->err, "rank %d: all-gather %d, element %zu: %g, expected %g", r, it, oj + i,
                             h[it * N + oj + i], beside_piece(j, i));
                    break;
                }
        }
    d_get(r, sa, h, rs, BESIDE_ITERS * len * 4);
    for (int it = 0; it < BESIDE_ITERS && !a->err[0]; it++)
        for (size_t i = 0; i < len; i++) {
            float want = 0;
            for (int j = 0; j < n; j++) want += beside_rs_in(j, off + i);
            if (h[it * len + i] != want) {
                snprintf(a->err, sizeof a->err, "rank %d: reduce-scatter %d, element %zu: %g, expected %g", r, it, off + i,
                         h[it * len + i], want);
                break;
            }
        }
    d_release(r, src);
    d_release(r, rs);
    d_release(r, ag);
    d_stream_free(r, sa);
    d_stream_free(r, sb);
    free(h);
    return NULL;
}

static void test_host_pulls_beside_staged(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    for (int which = 0; which < 2; which++) {
        int n = layout(which);
        if (n < 2) continue;
        size_t N = 1000003;
        qt_comm *c = make(n, QT_COMM_HOST, 0, 64 << 10, 0);
        float *piece[QT_COMM_MAX_RANKS];
        beside_arg a[QT_COMM_MAX_RANKS];
        pthread_t t[QT_COMM_MAX_RANKS];
        for (int j = 0; j < n; j++) {
            size_t oj, lj;
            qt_comm_shard(N, n, j, &oj, &lj);
            piece[j] = d_halloc(lj * 4);
            for (size_t i = 0; i < lj; i++) piece[j][i] = beside_piece(j, i);
        }
        for (int r = 0; r < n; r++) {
            a[r] = (beside_arg){c, r, n, N, piece, {0}};
            pthread_create(&t[r], NULL, beside_worker, &a[r]);
        }
        for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
        for (int r = 0; r < n; r++) QT_EXPECT(!a[r].err[0], "%d ranks on %s: %s", n, which ? "one GPU" : "their GPUs", a[r].err);
        printf("  %d ranks (%s): %d host all-gathers beside %d staged reduce-scatters, every value exact\n", n,
               which ? "one GPU" : "a GPU each", BESIDE_ITERS, BESIDE_ITERS);
        qt_comm_free(c);
        for (int j = 0; j < n; j++) d_hrelease(piece[j]);
    }
}

static void test_random_delays(void) {
    run_kind(QT_COMM_PEER, 1, 1);
    run_kind(QT_COMM_HOST, 0, 1);
}

/* Every size as one kernel per rank, plain and with random delays (a missing flag wait lets a rank read
 * a peer's input before it is there or overwrite its own while a peer reads it), then the default
 * limits (one kernel for the small sizes, the schedules above them). One rank per GPU only: ranks that
 * share a GPU never run the kernel (test_one_hardware_queue). */
static void test_oneshot_forced_and_default(void) {
    for (g_oneshot = 1; g_oneshot >= 0; g_oneshot--)
        for (int delay = 0; delay <= g_oneshot; delay++) {
            run_kind(QT_COMM_PEER, 0, delay);
            run_kind(QT_COMM_HOST, 0, delay);
        }
    g_oneshot = -1;
}

static void test_auto_default_chunks(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    int n = layout(g_ndev >= 2 ? 0 : 1);
    qt_comm *c = qt_comm_create(n, g_dev, QT_COMM_AUTO, 0, NULL);
    ct_job j;
    const char *e = ct_script(c, &g_dmem, 3000017, 0, 99, &j);
    QT_EXPECT(e == NULL, "auto -> %s: %s", qt_comm_name(c), e);
    qt_comm_free(c);
}

/* Variant v in 0..5: peer, peer_load and host with the copy-engine schedules (v < 3), then the same at the
 * default one-shot limits (sets g_oneshot and g_peer_rs; the caller resets them). */
static qt_comm *make_variant(int v, int n, size_t arena) {
    g_oneshot = v < 3 ? -1 : 0;
    g_peer_rs = v % 3 == 1 ? QT_COMM_RS_LOAD : QT_COMM_RS_COPY;
    return make(n, v % 3 == 2 ? QT_COMM_HOST : QT_COMM_PEER, 0, 64 << 10, arena);
}

/* The most ranks a comm takes, round-robin over the GPUs (two per GPU on four, all on one): each kind with
 * the copy-engine schedules and at the default one-shot limits, sizes across chunk edges and the chain's
 * limit, then 2,000 back-to-back collectives. */
static void test_eight_ranks(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    int n = QT_COMM_MAX_RANKS;
    static const size_t sizes[] = {1, 13, 16385, 100003, 1500007};
    ct_job j;
    for (int v = 0; v < 6; v++) {
        for (int r = 0; r < n; r++) g_dev[r] = r % g_ndev;
        qt_comm *c = make_variant(v, n, 0);
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const char *e = ct_script(c, &g_dmem, sizes[si], si == 2, 71 + si, &j);
            QT_EXPECT(e == NULL, "%s, %d ranks on %d GPU(s)%s: %s", qt_comm_name(c), n, g_ndev,
                      g_oneshot ? "" : " (one-shot limits)", e);
            if (e) break;
        }
        ct_stress st;
        const char *e = ct_stress_run(c, &g_dmem, 2000, 1000, 0, &st);
        QT_EXPECT(e == NULL, "%s, %d ranks, stress: %s", qt_comm_name(c), n, e);
        qt_comm_free(c);
    }
    g_oneshot = -1;
    g_peer_rs = QT_COMM_RS_AUTO;
}

/* Both with the copy-engine schedules and with the default one-shot limits. */
static void test_stress_10000(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    for (g_oneshot = -1; g_oneshot <= 0; g_oneshot++)
        for (int v = 0; v < 2; v++) {
            int n = layout(g_ndev >= 2 ? 0 : 1);
            qt_comm *c = make(n, v ? QT_COMM_HOST : QT_COMM_PEER, 0, 0, 0);
            ct_stress st;
            const char *e = ct_stress_run(c, &g_dmem, 10000, 1000, 0, &st);
            QT_EXPECT(e == NULL, "%s%s: %s", qt_comm_name(c), g_oneshot ? "" : " (one-shot limits)", e);
            qt_comm_free(c);
        }
    g_oneshot = -1;
}

static void test_abort(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    for (g_oneshot = -1; g_oneshot <= 0; g_oneshot++) {
        int n = layout(g_ndev >= 2 ? 0 : 1);
        qt_comm *c = make(n, QT_COMM_HOST, 0, 0, 0);
        char msg[256];
        QT_EXPECT(ct_abort_run(c, &g_dmem, msg, sizeof msg) == 0, "%s", msg);
        qt_comm_free(c);
    }
    g_oneshot = -1;
}

/* ---- above 4 GiB: memset shards plus random patches, checked at sampled windows ---- */

/* One rank's call: op 0 all-gather (e4m3 bytes), 1 reduce-scatter (bf16), 2 all-reduce (bf16; out ==
 * buf is in place), 3 broadcast of buf from rank 0 (bf16) after stalling rank 0's stream 20 ms, 4
 * all-gather, 5 reduce-scatter and 6 all-reduce (bf16) after stalling the last rank's stream 20 ms. */
typedef struct {
    qt_comm *c;
    int r, op, rc;
    size_t count;
    char *buf, *out;
} big_arg;

static uint8_t big_byte(int r) { return (uint8_t)(r * 37 + 11); }

static void CUDART_CB stall_20ms(void *p) {
    (void)p;
    usleep(20000);
}

static void *big_worker(void *p) {
    big_arg *a = p;
    cudaStream_t s = d_stream(a->r);
    if ((a->op == 3 && a->r == 0) || (a->op >= 4 && a->r == qt_comm_size(a->c) - 1))
        QT_CUDA(cudaLaunchHostFunc(s, stall_20ms, NULL));
    a->rc = a->op == 0   ? qt_comm_all_gather(a->c, a->r, a->out, a->buf, a->count, QT_DT_E4M3, s)
            : a->op == 4 ? qt_comm_all_gather(a->c, a->r, a->out, a->buf, a->count, QT_DT_BF16, s)
            : a->op == 1 || a->op == 5 ? qt_comm_reduce_scatter(a->c, a->r, a->out, a->buf, a->count, QT_DT_BF16, s)
            : a->op == 2 || a->op == 6 ? qt_comm_all_reduce(a->c, a->r, a->out, a->buf, a->count, QT_DT_BF16, s)
                         : qt_comm_broadcast(a->c, a->r, 0, a->buf, a->count, QT_DT_BF16, s);
    d_stream_free(a->r, s);
    return NULL;
}

/* Index of the first bf16 element of rank r's device buffer d that differs from want (count when none). */
static size_t d_first_diff(int r, const void *d, const uint16_t *want, uint16_t *got, size_t count) {
    QT_CUDA(cudaSetDevice(g_dev[r]));
    QT_CUDA(cudaMemcpy(got, d, count * 2, cudaMemcpyDeviceToHost));
    size_t i = 0;
    while (i < count && got[i] == want[i]) i++;
    return i;
}

/* Runs big_worker for ranks 0..n-1, one thread each, and waits for all. */
static void big_run(big_arg *a, int n) {
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) pthread_create(&t[r], NULL, big_worker, &a[r]);
    for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
}

static void big_case(int n, qt_comm_kind kind, int op) {
    size_t count = op == 0 ? ((size_t)9 << 29) + 12345 : ((size_t)9 << 28) + 777; /* 4.5 GiB of bytes / of bf16 */
    size_t es = op == 0 ? 1 : 2;
    qt_comm *c = make(n, kind, 0, 0, 0);
    big_arg a[QT_COMM_MAX_RANKS];
    enum { PATCH = 4096 };
    static uint8_t patch[PATCH], got[PATCH], want[PATCH];
    qt_rng g;
    qt_rng_seed(&g, 4);
    for (int i = 0; i < PATCH; i++) patch[i] = (uint8_t)qt_rng_u64(&g);
    size_t poff = ((size_t)1 << 32) - 1000; /* a patch across the 4 GiB mark (element offset, all-gather) */
    for (int r = 0; r < n; r++) {
        size_t off, len;
        qt_comm_shard(count, n, r, &off, &len);
        a[r] = (big_arg){c, r, op, 0, count, NULL, NULL};
        size_t in = op == 0 ? len : count, outb = op == 0 ? count : len;
        a[r].buf = d_alloc(r, in * es);
        a[r].out = d_alloc(r, outb * es);
        QT_CUDA(cudaMemset(a[r].buf, big_byte(r), in * es));
        QT_CUDA(cudaMemset(a[r].out, 0xff, outb * es));
        if (op == 0 && poff >= off && poff + PATCH <= off + len)
            QT_CUDA(cudaMemcpy(a[r].buf + (poff - off), patch, PATCH, cudaMemcpyHostToDevice));
        QT_CUDA(cudaDeviceSynchronize());
    }
    big_run(a, n);
    for (int r = 0; r < n && !qt_t_failed; r++) {
        QT_EXPECT(a[r].rc == 0, "rank %d rc %d", r, a[r].rc);
        QT_CUDA(cudaSetDevice(g_dev[r]));
        size_t off, len;
        qt_comm_shard(count, n, r, &off, &len);
        size_t outn = op == 0 ? count : len;
        /* Sample: both ends, every shard boundary, the patch, and 32 random spots. */
        size_t spots[64], ns = 0;
        spots[ns++] = 0;
        spots[ns++] = outn > PATCH ? outn - PATCH : 0;
        for (int q = 1; q < n && op == 0; q++) {
            size_t o2, l2;
            qt_comm_shard(count, n, q, &o2, &l2);
            spots[ns++] = o2 - PATCH / 2;
        }
        if (op == 0) spots[ns++] = poff;
        for (int q = 0; q < 32; q++) spots[ns++] = qt_rng_below(&g, outn - PATCH / es);
        for (size_t q = 0; q < ns; q++) {
            size_t e0 = spots[q], ne = PATCH / es;
            if (e0 + ne > outn) ne = outn - e0;
            QT_CUDA(cudaMemcpy(got, a[r].out + e0 * es, ne * es, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < ne; i++) {
                size_t ge = e0 + i;
                if (op == 0) {
                    int owner = 0;
                    for (int q2 = 0; q2 < n; q2++) {
                        size_t o2, l2;
                        qt_comm_shard(count, n, q2, &o2, &l2);
                        if (ge >= o2 && ge < o2 + l2) owner = q2;
                    }
                    want[i] = ge >= poff && ge < poff + PATCH ? patch[ge - poff] : big_byte(owner);
                    if (got[i] != want[i]) {
                        QT_EXPECT(0, "%s all_gather %zu B, rank %d: byte %zu = %u, expected %u", qt_comm_name(c), count, r,
                                  ge, got[i], want[i]);
                        break;
                    }
                } else {
                    float acc = 0;
                    for (int q2 = 0; q2 < n; q2++) {
                        uint16_t b = (uint16_t)(big_byte(q2) * 0x101u);
                        acc = q2 ? acc + qt_bf16_to_f32(b) : qt_bf16_to_f32(b);
                    }
                    uint16_t w = qt_f32_to_bf16(acc), gv;
                    memcpy(&gv, got + i * 2, 2);
                    if (gv != w) {
                        QT_EXPECT(0, "%s reduce_scatter %zu bf16, rank %d: element %zu = %04x, expected %04x",
                                  qt_comm_name(c), count, r, off + ge, gv, w);
                        break;
                    }
                }
            }
            if (qt_t_failed) break;
        }
    }
    for (int r = 0; r < n; r++) {
        d_release(r, a[r].buf);
        d_release(r, a[r].out);
    }
    qt_comm_free(c);
}

static void test_above_4gib(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    int n = layout(g_ndev >= 2 ? 0 : 1);
    if (n > 4) n = 4;
    size_t fr = 0, tot = 0;
    QT_CUDA(cudaSetDevice(0));
    QT_CUDA(cudaMemGetInfo(&fr, &tot));
    size_t need = (g_ndev >= 2 ? 1 : (size_t)n) * ((size_t)7 << 30);
    if (fr < need) QT_SKIP("needs %zu GiB free on device 0, has %zu", need >> 30, fr >> 30);
    big_case(n, QT_COMM_PEER, 0);
    big_case(n, QT_COMM_HOST, 0);
    big_case(n, QT_COMM_PEER, 1);
    big_case(n, QT_COMM_HOST, 1);
}

/* ---- all-reduce on both sides of the peer_load fused-kernel limit (64 MiB), random bf16 data ---- */

static void ar_case(int n, size_t count, int in_place) {
    qt_comm *c = make(n, QT_COMM_PEER, 0, 0, 0);
    uint16_t *h = malloc(count * 2), *got = malloc(count * 2);
    float *acc = malloc(count * 4);
    QT_CHECK(h && got && acc, "out of memory");
    qt_rng g;
    qt_rng_seed(&g, count + (size_t)n);
    big_arg a[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) {
            h[i] = qt_f32_to_bf16(qt_rng_uniform(&g) * 4 - 2);
            float v = qt_bf16_to_f32(h[i]);
            acc[i] = r ? acc[i] + v : v;
        }
        a[r] = (big_arg){c, r, 2, 0, count, d_alloc(r, count * 2), NULL};
        a[r].out = in_place ? a[r].buf : d_alloc(r, count * 2);
        QT_CUDA(cudaMemcpy(a[r].buf, h, count * 2, cudaMemcpyHostToDevice));
        if (!in_place) QT_CUDA(cudaMemset(a[r].out, 0xff, count * 2)); /* poisoned: NaN */
    }
    for (size_t i = 0; i < count; i++) h[i] = qt_f32_to_bf16(acc[i]);
    big_run(a, n);
    for (int r = 0; r < n; r++) {
        QT_EXPECT(a[r].rc == 0, "rank %d rc %d", r, a[r].rc);
        size_t bad = d_first_diff(r, a[r].out, h, got, count);
        QT_EXPECT(bad == count, "%s all_reduce bf16 count %zu%s, %d ranks, rank %d: element %zu = %04x, expected %04x",
                  qt_comm_name(c), count, in_place ? " in place" : "", n, r, bad, bad < count ? got[bad] : 0,
                  bad < count ? h[bad] : 0);
        d_release(r, a[r].buf);
        if (!in_place) d_release(r, a[r].out);
    }
    free(h);
    free(got);
    free(acc);
    qt_comm_free(c);
}

static void test_all_reduce_fused_and_split(void) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    g_peer_rs = QT_COMM_RS_LOAD;
    for (int lay = 0; lay < 2; lay++) {
        int n = layout(lay);
        if (!n) continue;
        ar_case(n, ((size_t)8 << 20) + 5, 0);  /* 16 MiB: one fused kernel */
        ar_case(n, ((size_t)40 << 20) + 3, 0); /* 80 MiB: reduce-scatter then all-gather */
        ar_case(n, ((size_t)40 << 20) + 3, 1);
    }
    g_peer_rs = QT_COMM_RS_AUTO;
}

/* ---- a late rank: every other rank's stream is idle, so a rank that copied from its predecessor (the
 * broadcast chain) or overwrote an arena slot (the host rings) without waiting for that rank's events
 * would copy poison or lose a chunk ---- */

/* Rank q's reduce-scatter input: small integers, exact in bf16, that differ between chunks. */
static uint16_t late_rs_val(size_t i, int q) { return qt_f32_to_bf16((float)((i * 31 + (size_t)q * 7) % 251) - 125.0f); }

/* small: 65539 bf16 (128 KiB), one kernel per rank on both kinds (one rank per GPU; the copy-engine
 * schedules where ranks share one), where the early ranks' kernels must wait on the late rank's flags. */
static void late_case(int op, int small) {
    if (!have_gpu()) QT_SKIP("no CUDA device");
    size_t count = small ? 65539 : ((size_t)3 << 20) + 1; /* 6 MiB of bf16: above the direct-pull limit */
    uint16_t *want = malloc(count * 2), *got = malloc(count * 2);
    QT_REQUIRE(want && got, "out of memory");
    for (int lay = 0; lay < 2 * (1 + small); lay++) {
        int n = layout(lay % 2);
        qt_comm_kind kind = lay < 2 ? QT_COMM_HOST : QT_COMM_PEER;
        if (n < (op == 3 ? 3 : 2)) continue;
        for (size_t i = 0; i < count; i++) {
            want[i] = (uint16_t)((i * 2654435761u) >> 9);
            if (op >= 5) { /* the sum over ranks in ascending order, rounded once */
                float acc = 0;
                for (int q = 0; q < n; q++) acc += qt_bf16_to_f32(late_rs_val(i, q));
                want[i] = qt_f32_to_bf16(acc);
            }
        }
        /* chain: 64 chunks; rings: 64 KiB chunks in a 1 MiB arena, 1 to 8 slots per region */
        qt_comm *c = small     ? make(n, kind, 0, 0, 0)
                     : op == 3 ? make(n, QT_COMM_PEER, 0, 64 << 10, 0)
                               : make(n, QT_COMM_HOST, 0, 64 << 10, 1 << 20);
        big_arg a[QT_COMM_MAX_RANKS];
        for (int r = 0; r < n; r++) {
            size_t off, len;
            qt_comm_shard(count, n, r, &off, &len);
            a[r] = (big_arg){c, r, op, 0, count, d_alloc(r, count * 2), NULL};
            if (op == 3) {
                if (r == 0) QT_CUDA(cudaMemcpy(a[r].buf, want, count * 2, cudaMemcpyHostToDevice));
                else QT_CUDA(cudaMemset(a[r].buf, 0xff, count * 2));
            } else if (op >= 5) {
                size_t outn = op == 5 ? len : count;
                for (size_t i = 0; i < count; i++) got[i] = late_rs_val(i, r);
                QT_CUDA(cudaMemcpy(a[r].buf, got, count * 2, cudaMemcpyHostToDevice));
                a[r].out = d_alloc(r, outn * 2);
                QT_CUDA(cudaMemset(a[r].out, 0xff, outn * 2));
            } else {
                a[r].out = d_alloc(r, count * 2);
                QT_CUDA(cudaMemcpy(a[r].buf, want + off, len * 2, cudaMemcpyHostToDevice));
                QT_CUDA(cudaMemset(a[r].out, 0xff, count * 2));
            }
        }
        big_run(a, n);
        for (int r = 0; r < n; r++) {
            size_t off = 0, len = count;
            if (op == 5) qt_comm_shard(count, n, r, &off, &len);
            QT_EXPECT(a[r].rc == 0, "rank %d: rc %d", r, a[r].rc);
            size_t i = d_first_diff(r, op == 3 ? a[r].buf : a[r].out, want + off, got, len);
            QT_EXPECT(i == len, "%s op %d, %d ranks (layout %d), rank %d: first difference at element %zu",
                      qt_comm_name(c), op, n, lay % 2, r, off + i);
            d_release(r, a[r].buf);
            if (a[r].out) d_release(r, a[r].out);
        }
        qt_comm_free(c);
    }
    free(want);
    free(got);
}
static void test_broadcast_chain_late_root(void) { late_case(3, 0); }
static void test_host_ring_late_reader(void) {
    late_case(4, 0);
    late_case(5, 0);
}
static void test_oneshot_late_rank(void) {
    g_oneshot = 0;
    for (int op = 3; op <= 6; op++) late_case(op, 1);
    g_oneshot = -1;
}

/* ---- an injected failure in a child process: all ranks stop, exit status 1, a message ---- */

typedef struct {
    qt_comm *c;
    int r;
} kid_arg;

static void *kid_worker(void *p) {
    kid_arg *a = p;
    qt_error_set_rank(a->r);
    cudaStream_t s = d_stream(a->r);
    float *buf = d_alloc(a->r, 1024 * 4);
    for (int it = 0; it < 100000; it++) {
        if (a->r == 1 && it == 40) QT_CHECK(0, "injected failure at iteration %d", it);
        if (qt_comm_all_gather(a->c, a->r, buf, buf, 1024, QT_DT_F32, s)) break;
    }
    return NULL;
}

static void kid_main(void *p) {
    (void)p;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) _exit(77);
    g_ndev = n;
    g_oneshot = 0; /* on 2+ GPUs its 1024-float all-gathers run as one kernel: the abort word must stop them */
    int k = layout(n >= 2 ? 0 : 1);
    qt_comm *c = make(k, QT_COMM_HOST, 0, 0, 0);
    kid_arg a[QT_COMM_MAX_RANKS];
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < k; r++) {
        a[r] = (kid_arg){c, r};
        pthread_create(&t[r], NULL, kid_worker, &a[r]);
    }
    for (int r = 0; r < k; r++) pthread_join(t[r], NULL);
    fprintf(stderr, "child finished without failing\n");
    _exit(0);
}

static int g_fork_status;
static char g_fork_out[4096];

/* A child with CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of a device feeds one hardware queue, so a GPU
 * wait (a cross-rank event wait, a kernel spinning on a flag) that precedes, in that queue, the work it
 * waits for never ends. Three ranks on GPU 0 (where one-shot kernels once hung), then one rank per GPU,
 * each kind, with and without one-shot kernels; exits 0 when every script passed. */
static void kid_one_queue(void *p) {
    (void)p;
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
    int nd = 0;
    if (cudaGetDeviceCount(&nd) != cudaSuccess || nd == 0) _exit(77);
    g_ndev = nd;
    static const size_t sizes[] = {13, 16385, 1000003, 1500007};
    ct_job j;
    for (int lay = 1; lay >= 0; lay--) {
        int n = layout(lay);
        for (int v = 0; v < 6 && n; v++) {
            qt_comm *c = make_variant(v, n, 1 << 20);
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                fprintf(stderr, "%d ranks (layout %d), %s%s, %zu elements\n", n, lay, qt_comm_name(c),
                        g_oneshot ? "" : " (one-shot limits)", sizes[si]);
                const char *e = ct_script(c, &g_dmem, sizes[si], 0, 5 + si, &j);
                if (e) {
                    fprintf(stderr, "%s\n", e);
                    _exit(1);
                }
            }
            qt_comm_free(c);
        }
    }
    _exit(0);
}
static int g_queue_status;
static char g_queue_out[4096];

static void test_one_hardware_queue(void) {
    if (g_queue_status == 77) QT_SKIP("no CUDA device");
    QT_EXPECT(g_queue_status == 0, "child exit status %d (-2 = hung 60 s), expected 0; its log: %.2000s", g_queue_status,
              g_queue_out);
}

static void test_injected_failure_stops_all(void) {
    if (g_fork_status == 77) QT_SKIP("no CUDA device");
    QT_EXPECT(g_fork_status == 1, "child exit status %d (-2 = hung), expected 1; stderr: %.600s", g_fork_status, g_fork_out);
    QT_EXPECT(strstr(g_fork_out, "[rank 1]") && strstr(g_fork_out, "injected failure"), "stderr: %.600s", g_fork_out);
}

int main(void) {
    /* Fork before this process touches CUDA: a child of a CUDA process cannot use CUDA. */
    g_fork_status = ct_fork(kid_main, NULL, 60, g_fork_out, sizeof g_fork_out);
    g_queue_status = ct_fork(kid_one_queue, NULL, 60, g_queue_out, sizeof g_queue_out);
    QT_RUN(test_injected_failure_stops_all);
    QT_RUN(test_peer_direct);
    QT_RUN(test_peer_ring);
    QT_RUN(test_peer_load);
    QT_RUN(test_host_auto_chunk);
    QT_RUN(test_host);
    QT_RUN(test_host_wc);
    QT_RUN(test_host_pulls_beside_staged);
    QT_RUN(test_random_delays);
    QT_RUN(test_oneshot_forced_and_default);
    QT_RUN(test_oneshot_late_rank);
    QT_RUN(test_auto_default_chunks);
    QT_RUN(test_one_hardware_queue);
    QT_RUN(test_eight_ranks);
    QT_RUN(test_stress_10000);
    QT_RUN(test_abort);
    QT_RUN(test_all_reduce_fused_and_split);
    QT_RUN(test_broadcast_chain_late_root);
    QT_RUN(test_host_ring_late_reader);
    QT_RUN(test_above_4gib);
    return qt_test_end();
}
