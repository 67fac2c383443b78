/* probe.c — measures the links comm can use (pinned H2D/D2H per GPU alone and all at once, both
 * directions at once, peer access and pair bandwidth by copy engines and by SM loads) in about a
 * second, and picks the AUTO kind and the peer reduce-scatter variant.
 *
 * Timing is wall clock around copies on every GPU followed by a sync of all of them (the only clock
 * that spans devices); sizes are large enough (64 MiB host, 256 MiB peer) that launch cost is < 2%.
 * Each figure is the best of 3 after one warm-up. GB/s = 1e9 B/s of payload. */
#include <cuda_runtime.h>
#include <string.h>
#include <time.h>

#include "qt_comm.h"
#include "qt_error.h"

#define HOST_B ((size_t)64 << 20)
#define PEER_B ((size_t)256 << 20)
#define QT_PROBE_LOAD_VS_COPY 0.85 /* see pick_rs below */

typedef struct {
    int n;
    const int *dev;
    cudaStream_t up[QT_COMM_MAX_RANKS], down[QT_COMM_MAX_RANKS];
    char *hbuf;                     /* 2 * HOST_B per device: [h2d source][d2h target] */
    char *d[QT_COMM_MAX_RANKS];     /* PEER_B * 2 per device */
} qt_probe_ctx;

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void sync_all(qt_probe_ctx *x) {
    for (int i = 0; i < x->n; i++) {
        QT_CUDA(cudaStreamSynchronize(x->up[i]));
        QT_CUDA(cudaStreamSynchronize(x->down[i]));
    }
}

/* i <-> j both at once with SM loads: a kernel on each GPU copies the other's buffer through its peer
 * pointer (the reduction kernel with one source, the access pattern of the LOAD reduce-scatter). */
static double time_peer_load(qt_probe_ctx *x, int i, int j) {
    double best = 1e30;
    size_t n = PEER_B / 2; /* bf16 elements */
    for (int rep = 0; rep < 4; rep++) {
        double t0 = wall();
        const void *si = x->d[j] + PEER_B, *sj = x->d[i] + PEER_B;
        void *di = x->d[i], *dj = x->d[j];
        QT_CUDA(cudaSetDevice(x->dev[i]));
        qt_comm_reduce_launch(QT_DT_BF16, &di, 1, &si, 1, 1, n, QT_COMM_SUM, x->up[i]);
        QT_CUDA(cudaSetDevice(x->dev[j]));
        qt_comm_reduce_launch(QT_DT_BF16, &dj, 1, &sj, 1, 1, n, QT_COMM_SUM, x->up[j]);
        sync_all(x);
        double t = wall() - t0;
        if (rep > 0 && t < best) best = t;
    }
    return best;
}

/* mask bit i: device i takes part; dirs bit 0 = H2D, bit 1 = D2H. Returns the best seconds of 3. */
static double time_host(qt_probe_ctx *x, unsigned mask, int dirs) {
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = wall();
        for (int i = 0; i < x->n; i++) {
            if (!(mask >> i & 1)) continue;
            char *h = x->hbuf + (size_t)i * 2 * HOST_B;
            if (dirs & 1) QT_CUDA(cudaMemcpyAsync(x->d[i], h, HOST_B, cudaMemcpyHostToDevice, x->up[i]));
            if (dirs & 2) QT_CUDA(cudaMemcpyAsync(h + HOST_B, x->d[i] + PEER_B, HOST_B, cudaMemcpyDeviceToHost, x->down[i]));
        }
        sync_all(x);
        double t = wall() - t0;
        if (rep > 0 && t < best) best = t;
    }
    return best;
}

/* i -> j, and j -> i as well when both; streams on the source GPU (push). */
static double time_peer(qt_probe_ctx *x, int i, int j, int both) {
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = wall();
        QT_CUDA(cudaMemcpyPeerAsync(x->d[j], x->dev[j], x->d[i] + PEER_B, x->dev[i], PEER_B, x->up[i]));
        if (both) QT_CUDA(cudaMemcpyPeerAsync(x->d[i], x->dev[i], x->d[j] + PEER_B, x->dev[j], PEER_B, x->up[j]));
        sync_all(x);
        double t = wall() - t0;
        if (rep > 0 && t < best) best = t;
    }
    return best;
}

static void enable_peer(int a, int b) {
    QT_CUDA(cudaSetDevice(a));
    cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else QT_CUDA(e);
}

int qt_comm_probe(int n, const int *devices, qt_comm_probe_result *out) {
    memset(out, 0, sizeof *out);
    QT_CHECK(n >= 1 && n <= QT_COMM_MAX_RANKS, "probe: %d devices", n);
    double t0 = wall();
    out->n = n;
    memcpy(out->devices, devices, (size_t)n * sizeof(int));
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDeviceProperties(&prop, devices[0]));
    snprintf(out->name, sizeof out->name, "%.120s", prop.name);
    QT_CUDA(cudaDriverGetVersion(&out->driver));
    QT_CUDA(cudaRuntimeGetVersion(&out->runtime));

    qt_probe_ctx x = {0};
    x.n = n;
    x.dev = devices;
    QT_CUDA(cudaSetDevice(devices[0]));
    QT_CUDA(cudaHostAlloc((void **)&x.hbuf, (size_t)n * 2 * HOST_B, cudaHostAllocPortable));
    memset(x.hbuf, 1, (size_t)n * 2 * HOST_B);
    for (int i = 0; i < n; i++) {
        QT_CUDA(cudaSetDevice(devices[i]));
        QT_CUDA(cudaStreamCreateWithFlags(&x.up[i], cudaStreamNonBlocking));
        QT_CUDA(cudaStreamCreateWithFlags(&x.down[i], cudaStreamNonBlocking));
        QT_CUDA(cudaMalloc((void **)&x.d[i], 2 * PEER_B));
        QT_CUDA(cudaMemset(x.d[i], 0, 2 * PEER_B));
        QT_CUDA(cudaDeviceSynchronize());
    }
    unsigned all = (1u << n) - 1;
    for (int i = 0; i < n; i++) {
        out->h2d[i] = HOST_B / time_host(&x, 1u << i, 1) / 1e9;
        out->d2h[i] = HOST_B / time_host(&x, 1u << i, 2) / 1e9;
        out->bidir[i] = 2.0 * HOST_B / time_host(&x, 1u << i, 3) / 1e9;
    }
    out->h2d_all = HOST_B / time_host(&x, all, 1) / 1e9;
    out->d2h_all = HOST_B / time_host(&x, all, 2) / 1e9;
    out->bidir_all = 2.0 * HOST_B / time_host(&x, all, 3) / 1e9;

    int all_peer = n > 1;
    out->peer_min = out->peer_bidir_min = out->peer_load_bidir_min = n > 1 ? 1e30 : 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || devices[i] == devices[j]) continue;
            QT_CUDA(cudaDeviceCanAccessPeer(&out->can_access[i][j], devices[i], devices[j]));
            if (!out->can_access[i][j]) { all_peer = 0; continue; }
            enable_peer(devices[i], devices[j]);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || devices[i] == devices[j] || !out->can_access[i][j] || !out->can_access[j][i]) continue;
            out->peer[i][j] = PEER_B / time_peer(&x, i, j, 0) / 1e9;
            if (out->peer[i][j] < out->peer_min) out->peer_min = out->peer[i][j];
            if (i < j) {
                double b = 2.0 * PEER_B / time_peer(&x, i, j, 1) / 1e9;
                if (b < out->peer_bidir_min) out->peer_bidir_min = b;
                b = 2.0 * PEER_B / time_peer_load(&x, i, j) / 1e9;
                if (b < out->peer_load_bidir_min) out->peer_load_bidir_min = b;
            }
        }
    if (out->peer_min > 1e29) out->peer_min = 0;
    if (out->peer_bidir_min > 1e29) out->peer_bidir_min = 0;
    if (out->peer_load_bidir_min > 1e29) out->peer_load_bidir_min = 0;
    /* Peer wins where every pair has access and the slowest pair beats a GPU's host link. */
    out->pick = n == 1 || (all_peer && out->peer_min > out->h2d_all) ? QT_COMM_PEER : QT_COMM_HOST;
    /* LOAD moves each byte over the link once with no staging pass and no per-chunk handshakes, which
     * cost the COPY reduce-scatter ~15% against a raw copy: LOAD wins unless SM loads are clearly
     * slower than the copy engines on the same pairs. */
    out->pick_rs = all_peer && out->peer_load_bidir_min >= QT_PROBE_LOAD_VS_COPY * out->peer_bidir_min
                       ? QT_COMM_RS_LOAD : QT_COMM_RS_COPY;

    for (int i = 0; i < n; i++) {
        QT_CUDA(cudaSetDevice(devices[i]));
        QT_CUDA(cudaStreamDestroy(x.up[i]));
        QT_CUDA(cudaStreamDestroy(x.down[i]));
        QT_CUDA(cudaFree(x.d[i]));
    }
    QT_CUDA(cudaFreeHost(x.hbuf));
    QT_CUDA(cudaSetDevice(devices[0]));
    out->seconds = wall() - t0;
    return 0;
}

void qt_comm_probe_print(const qt_comm_probe_result *p, FILE *fp, int md) {
    const char *pick = p->pick == QT_COMM_PEER ? "peer" : "host";
    if (!md) {
        fprintf(fp, "probe: %d x %s, driver %d, runtime %d, %.2f s -> auto = %s\n", p->n, p->name, p->driver,
                p->runtime, p->seconds, pick);
        for (int i = 0; i < p->n; i++)
            fprintf(fp, "  gpu %d (dev %d): H2D %.1f GB/s, D2H %.1f GB/s, H2D+D2H %.1f GB/s alone\n", i, p->devices[i],
                    p->h2d[i], p->d2h[i], p->bidir[i]);
        fprintf(fp, "  all GPUs at once, per GPU: H2D %.1f, D2H %.1f, H2D+D2H %.1f GB/s\n", p->h2d_all, p->d2h_all,
                p->bidir_all);
        fprintf(fp, "  peer access / one-way GB/s (row = source):\n");
        for (int i = 0; i < p->n; i++) {
            fprintf(fp, "   ");
            for (int j = 0; j < p->n; j++)
                if (i == j) fprintf(fp, "      -");
                else fprintf(fp, " %d:%5.0f", p->can_access[i][j], p->peer[i][j]);
            fprintf(fp, "\n");
        }
        fprintf(fp, "  slowest pair: %.1f GB/s one way, %.1f GB/s both ways at once (SM loads both ways: %.1f)"
                    " -> peer reduce-scatter by %s\n", p->peer_min, p->peer_bidir_min, p->peer_load_bidir_min,
                p->pick_rs == QT_COMM_RS_LOAD ? "loads" : "copies");
        return;
    }
    fprintf(fp, "Probe (%.2f s): %d x %s, driver %d, runtime %d; `auto` picks **%s**.\n\n", p->seconds, p->n, p->name,
            p->driver, p->runtime, pick);
    fprintf(fp, "| GPU | H2D alone | D2H alone | H2D+D2H alone | peer access to (one-way GB/s) |\n"
                "| --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < p->n; i++) {
        fprintf(fp, "| %d | %.1f | %.1f | %.1f |", p->devices[i], p->h2d[i], p->d2h[i], p->bidir[i]);
        for (int j = 0; j < p->n; j++)
            if (j != i) fprintf(fp, " %d: %s %.0f;", p->devices[j], p->can_access[i][j] ? "yes" : "no", p->peer[i][j]);
        fprintf(fp, " |\n");
    }
    fprintf(fp, "\nAll GPUs at once, per GPU: H2D %.1f GB/s, D2H %.1f GB/s, H2D+D2H together %.1f GB/s. "
                "Slowest pair: %.1f GB/s one way, %.1f GB/s both ways (copy engines), %.1f GB/s both ways with SM "
                "loads through peer pointers; `auto` peer reduce-scatter uses **%s**.\n\n",
            p->h2d_all, p->d2h_all, p->bidir_all, p->peer_min, p->peer_bidir_min, p->peer_load_bidir_min,
            p->pick_rs == QT_COMM_RS_LOAD ? "loads" : "copies");
}
