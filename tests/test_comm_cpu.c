/* test_comm_cpu.c — comm's schedules, slots and ordering on the CPU backend (host buffers, threads):
 * every op and kind for N = 1..5 and odd sizes (tiny chunks and arenas force many chunks and reused ring
 * slots), the chained broadcast,
 * random per-thread delays, 10,000 back-to-back collectives, abort, an injected failure, mismatched
 * calls and the wait timeout. */
#include "test_comm_common.h"

static void *h_alloc(int r, size_t b) { (void)r; return malloc(b ? b : 1); }
static void h_release(int r, void *p) { (void)r; free(p); }
static void h_put(int r, cudaStream_t s, void *d, const void *h, size_t b) { (void)r; (void)s; memcpy(d, h, b); }
static void h_get(int r, cudaStream_t s, void *h, const void *d, size_t b) { (void)r; (void)s; memcpy(h, d, b); }
static cudaStream_t h_stream(int r) { (void)r; return NULL; }
static void h_stream_free(int r, cudaStream_t s) { (void)r; (void)s; }
static void *h_halloc(size_t b) { return malloc(b ? b : 1); }
static void h_hrelease(void *p) { free(p); }
static const ct_mem g_host = {h_alloc, h_release, h_put, h_get, h_stream, h_stream_free, h_halloc, h_hrelease};

static void test_shard(void) {
    for (int n = 1; n <= QT_COMM_MAX_RANKS; n++)
        for (size_t count = 0; count < 40; count++) {
            size_t next = 0;
            for (int r = 0; r < n; r++) {
                size_t off, len, l0, o0;
                qt_comm_shard(count, n, r, &off, &len);
                qt_comm_shard(count, n, 0, &o0, &l0);
                QT_REQUIRE(off == next, "n=%d count=%zu rank %d: off %zu, expected %zu", n, count, r, off, next);
                QT_REQUIRE(len == l0 || len + 1 == l0, "n=%d count=%zu rank %d: len %zu vs rank 0 %zu", n, count, r, len, l0);
                next += len;
            }
            QT_REQUIRE(next == count, "n=%d count=%zu: shards cover %zu", n, count, next);
        }
    size_t off, len; /* 64-bit: 5 GiB elements over 3 ranks */
    qt_comm_shard((size_t)5 << 30, 3, 2, &off, &len);
    QT_EXPECT(off + len == (size_t)5 << 30 && len == ((size_t)5 << 30) / 3, "big shard off %zu len %zu", off, len);
}

static const size_t g_sizes[] = {0, 1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 257, 1009, 4099, 10007};

static void run_kind_rs(qt_comm_kind kind, int ring, size_t chunk, size_t arena, int delay, int peer_rs) {
    qt_comm_opts o = {0};
    o.ring = ring;
    o.peer_rs = peer_rs;
    o.chunk_bytes = chunk;
    o.timeout_s = 60;
    ct_job j;
    for (int n = 1; n <= QT_COMM_MAX_RANKS; n += n < 5 ? 1 : QT_COMM_MAX_RANKS - 5) { /* 1..5 and the most */
        qt_comm *c = qt_comm_create_cpu(n, kind, arena, &o);
        for (size_t si = 0; si < sizeof g_sizes / sizeof g_sizes[0]; si++) {
            const char *e = ct_script(c, &g_host, g_sizes[si], delay, 17 * n + si, &j);
            QT_EXPECT(e == NULL, "%s n=%d chunk=%zu arena=%zu: %s", qt_comm_name(c), n, chunk, arena, e);
            if (e) break;
        }
        qt_comm_free(c);
    }
}

static void run_kind(qt_comm_kind kind, int ring, size_t chunk, size_t arena, int delay) {
    run_kind_rs(kind, ring, chunk, arena, delay, QT_COMM_RS_AUTO);
}

static void test_peer_direct(void) { run_kind(QT_COMM_PEER, 0, 64, 0, 0); }
static void test_peer_ring(void) { run_kind(QT_COMM_PEER, 1, 128, 0, 0); }
/* Reduce-scatter reading every rank's src in place (one reduction over the whole shard). */
static void test_peer_load(void) {
    qt_comm *c = qt_comm_create_cpu(2, QT_COMM_PEER, 0, &(qt_comm_opts){.peer_rs = QT_COMM_RS_LOAD});
    QT_EXPECT(!strcmp(qt_comm_name(c), "peer_load"), "name %s, expected peer_load", qt_comm_name(c));
    qt_comm_free(c);
    run_kind_rs(QT_COMM_PEER, 0, 64, 0, 0, QT_COMM_RS_LOAD);
    run_kind_rs(QT_COMM_PEER, 1, 64, 0, 1, QT_COMM_RS_LOAD);
}
/* Broadcasts above the direct-pull limit (4 MiB) run as a chain through the ranks (peer kinds, N >= 3):
 * given chunks (the 64-chunk cap binds), sized ones, random delays; every root (ct_script moves it). */
static void test_peer_broadcast_chain(void) {
    ct_job j;
    for (int n = 3; n <= 5; n++)
        for (int v = 0; v < 3; v++) {
            qt_comm_opts o = {.chunk_bytes = v == 0 ? 4096 : 0, .timeout_s = 60};
            qt_comm *c = qt_comm_create_cpu(n, QT_COMM_PEER, 0, &o);
            size_t count = v == 2 ? 1500007 : (size_t)1100003 + (size_t)n;
            const char *e = ct_script(c, &g_host, count, v == 1, 7 * n + v, &j);
            QT_EXPECT(e == NULL, "n=%d count=%zu chunk=%zu: %s", n, count, o.chunk_bytes, e);
            qt_comm_free(c);
        }
}
/* Default host chunks (sized per collective from count and N): the path every rank must agree on. */
static void test_host_auto_chunk(void) { run_kind(QT_COMM_HOST, 0, 0, 0, 0); }
/* 64 B chunks and a 4 KiB arena: ring slots reused dozens of times per call at 10007 elements. */
static void test_host_small_arena(void) { run_kind(QT_COMM_HOST, 0, 64, 4096, 0); }
/* Big enough that the 64-slot cap of the rings binds. */
static void test_host_chunk_cap(void) { run_kind(QT_COMM_HOST_WC, 0, 16, 1 << 20, 0); }
static void test_random_delays(void) {
    run_kind(QT_COMM_HOST, 0, 64, 8192, 1);
    run_kind(QT_COMM_HOST, 0, 64, 128, 1); /* N = 2: one arena slot per owner, reused every chunk */
    run_kind(QT_COMM_PEER, 1, 64, 0, 1);
}

typedef struct {
    qt_comm *c;
    const float *src;
    float *dst;
    size_t count;
    int r, rc;
} ar_arg;

static void *ar_worker(void *p) {
    ar_arg *a = p;
    a->rc = qt_comm_all_reduce(a->c, a->r, a->dst, a->src, a->count, QT_DT_F32, NULL);
    return NULL;
}

static void test_deterministic_across_chunkings(void) {
    /* The reduce order is fixed by rank, so neither chunk size nor kind may change a bit. */
    enum { N = 3, COUNT = 5003 };
    float *x[N], *out[4];
    qt_rng g;
    qt_rng_seed(&g, 5);
    for (int r = 0; r < N; r++) {
        x[r] = malloc(COUNT * 4);
        for (int i = 0; i < COUNT; i++) x[r][i] = qt_rng_normal(&g) * (r == 1 ? 1e4f : 1e-3f);
    }
    for (int v = 0; v < 4; v++) {
        qt_comm_opts o = {0};
        o.chunk_bytes = v == 0 ? 48 : v == 1 ? 4096 : 160;
        o.peer_rs = v == 3 ? QT_COMM_RS_LOAD : QT_COMM_RS_COPY;
        qt_comm *c = qt_comm_create_cpu(N, v == 1 || v == 3 ? QT_COMM_PEER : QT_COMM_HOST, 4096, &o);
        out[v] = malloc((size_t)N * COUNT * 4);
        ar_arg a[N];
        pthread_t t[N];
        for (int r = 0; r < N; r++) {
            a[r] = (ar_arg){c, x[r], out[v] + (size_t)r * COUNT, COUNT, r, 0};
            pthread_create(&t[r], NULL, ar_worker, &a[r]);
        }
        for (int r = 0; r < N; r++) pthread_join(t[r], NULL);
        for (int r = 0; r < N; r++) QT_EXPECT(a[r].rc == 0, "rank %d rc %d", r, a[r].rc);
        for (int r = 1; r < N; r++)
            QT_EXPECT(!memcmp(out[v], out[v] + (size_t)r * COUNT, COUNT * 4), "variant %d: rank %d differs from rank 0", v, r);
        qt_comm_free(c);
    }
    QT_EXPECT(!memcmp(out[0], out[1], COUNT * 4) && !memcmp(out[0], out[2], COUNT * 4), "results depend on chunking");
    QT_EXPECT(!memcmp(out[0], out[3], COUNT * 4), "peer_load differs from the copy variants");
    for (int r = 0; r < N; r++) free(x[r]);
    for (int v = 0; v < 4; v++) free(out[v]);
}

static void test_stress_10000(void) {
    for (int v = 0; v < 2; v++) {
        qt_comm_opts o = {0};
        o.timeout_s = 60;
        o.chunk_bytes = 64;
        qt_comm *c = qt_comm_create_cpu(4, v ? QT_COMM_HOST : QT_COMM_PEER, 4096, &o);
        ct_stress st;
        const char *e = ct_stress_run(c, &g_host, 10000, 1, 500, &st);
        QT_EXPECT(e == NULL, "%s: %s", qt_comm_name(c), e);
        qt_comm_free(c);
    }
}

static void test_abort(void) {
    for (int v = 0; v < 2; v++) {
        qt_comm *c = qt_comm_create_cpu(4, v ? QT_COMM_HOST : QT_COMM_PEER, 0, NULL);
        char msg[256];
        QT_EXPECT(ct_abort_run(c, &g_host, msg, sizeof msg) == 0, "%s", msg);
        float x = 1;
        QT_EXPECT(qt_comm_barrier(c, 0, NULL) == -1 && qt_comm_all_reduce_scalars(c, 2, &x, 1, QT_COMM_SUM, NULL) == -1,
                  "calls after abort must return -1");
        qt_comm_free(c);
    }
}

/* ---- child-process scenarios ---- */

typedef struct {
    qt_comm *c;
    int r, mode;
} kid_arg;

static void *kid_worker(void *p) {
    kid_arg *a = p;
    qt_error_set_rank(a->r);
    float buf[64] = {0};
    for (int it = 0; it < 200; it++) {
        if (a->mode == 0 && a->r == 1 && it == 40) QT_CHECK(0, "injected failure at iteration %d", it);
        if (a->mode == 2 && a->r == 2 && it == 10) return NULL; /* rank 2 silently stops calling */
        int rc;
        if (a->mode == 1 && a->r == 0 && it == 7) rc = qt_comm_reduce_scatter(a->c, a->r, buf, buf, 64, QT_DT_F32, NULL);
        else rc = qt_comm_all_gather(a->c, a->r, buf, buf, 64, QT_DT_F32, NULL);
        if (rc) return NULL;
    }
    return NULL;
}

static void kid_main(void *p) {
    int mode = *(int *)p;
    qt_comm_opts o = {0};
    o.timeout_s = mode == 2 ? 1 : 0;
    qt_comm *c = qt_comm_create_cpu(4, QT_COMM_HOST, 0, &o);
    kid_arg a[4];
    pthread_t t[4];
    for (int r = 0; r < 4; r++) {
        a[r] = (kid_arg){c, r, mode};
        pthread_create(&t[r], NULL, kid_worker, &a[r]);
    }
    for (int r = 0; r < 4; r++) pthread_join(t[r], NULL);
    fprintf(stderr, "child finished without failing\n");
    _exit(0);
}

static void expect_child_fails(int mode, const char *needle1, const char *needle2) {
    char out[4096];
    int st = ct_fork(kid_main, &mode, 20, out, sizeof out);
    QT_EXPECT(st == 1, "mode %d: child exit status %d (-2 = hung), expected 1; stderr: %.600s", mode, st, out);
    QT_EXPECT(strstr(out, needle1) && strstr(out, needle2), "mode %d: stderr lacks \"%s\"/\"%s\": %.600s", mode, needle1,
              needle2, out);
}

static void test_injected_failure_stops_all(void) { expect_child_fails(0, "[rank 1]", "injected failure"); }
static void test_mismatched_calls_fail(void) { expect_child_fails(1, "reduce_scatter", "all_gather"); }
static void test_timeout_names_the_laggard(void) { expect_child_fails(2, "for rank 2", "waited"); }

int main(void) {
    QT_RUN(test_shard);
    QT_RUN(test_peer_direct);
    QT_RUN(test_peer_ring);
    QT_RUN(test_peer_load);
    QT_RUN(test_peer_broadcast_chain);
    QT_RUN(test_host_auto_chunk);
    QT_RUN(test_host_small_arena);
    QT_RUN(test_host_chunk_cap);
    QT_RUN(test_random_delays);
    QT_RUN(test_deterministic_across_chunkings);
    QT_RUN(test_stress_10000);
    QT_RUN(test_abort);
    QT_RUN(test_injected_failure_stops_all);
    QT_RUN(test_mismatched_calls_fail);
    QT_RUN(test_timeout_names_the_laggard);
    return qt_test_end();
}
