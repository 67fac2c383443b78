/* comm_gpu.c — the GPU backend of comm: per-rank streams ("lanes"), the cross-rank events of each slot,
 * the shared pinned arena, device staging, peer access, and qt_comm_create.
 *
 * Every cross-rank event is waited on only after its owner posted the phase in which it recorded it
 * (comm_internal.h), and is re-recorded only after every waiter enqueued its wait, so
 * cudaStreamWaitEvent always captures the intended record. Local events (dep, pulled) are recorded and
 * waited by the same thread in program order. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "qt_error.h"

struct qt_comm_gpu {
    int dev, nlanes;
    cudaStream_t lane[QT_COMM_ALL_LANES]; /* [0, nlanes) and [QT_COMM_LANES, QT_COMM_LANES + nlanes) */
    cudaEvent_t ready[QT_COMM_SLOTS], done[QT_COMM_SLOTS];
    cudaEvent_t chunk[QT_COMM_SLOTS][QT_COMM_MAX_CHUNKS], pull[QT_COMM_SLOTS][QT_COMM_MAX_CHUNKS];
    cudaEvent_t dep[QT_COMM_ALL_LANES + 1];
    cudaEvent_t pulled[QT_COMM_ALL_LANES + 1][2];
    unsigned long long *flags; /* one-shot flag cells (QT_COMM_MAX_RANKS), device memory */
    qt_oneshot_local *local;   /* one-shot kernel words, device memory */
    int max_blocks;            /* one-shot grid cap: this device's SMs (every block resident at once) */
};

/* Whether lane l (1.. 2 x QT_COMM_LANES) has a stream: the first nlanes of each half. */
static int lane_made(const qt_comm_gpu *g, int l) {
    return l >= 1 && l <= QT_COMM_ALL_LANES && (l - 1) % QT_COMM_LANES < g->nlanes;
}

static cudaStream_t lane_stream(qt_comm *c, int r, int lane, cudaStream_t s) {
    if (lane == 0) return s;
    QT_CHECK(lane_made(c->g[r], lane), "comm lane %d (%d per half)", lane, c->g[r]->nlanes);
    return c->g[r]->lane[lane - 1];
}

void qt_commg_enter(qt_comm *c, int r) { QT_CUDA(cudaSetDevice(c->g[r]->dev)); }

void qt_commg_copy(qt_comm *c, int r, int lane, cudaStream_t s, void *dst, const void *src, size_t bytes) {
    QT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane_stream(c, r, lane, s)));
}

void qt_commg_dep(qt_comm *c, int r, int from, int to, cudaStream_t s) {
    cudaEvent_t e = c->g[r]->dep[from];
    QT_CUDA(cudaEventRecord(e, lane_stream(c, r, from, s)));
    QT_CUDA(cudaStreamWaitEvent(lane_stream(c, r, to, s), e, 0));
}

static cudaEvent_t slot_event(qt_comm *c, int r, int which, int slot, int chunk) {
    qt_comm_gpu *g = c->g[r];
    if (which == QT_EV_READY) return g->ready[slot];
    if (which == QT_EV_DONE) return g->done[slot];
    QT_CHECK(chunk >= 0 && chunk < QT_COMM_MAX_CHUNKS, "comm chunk event %d", chunk);
    return which == QT_EV_PULL ? g->pull[slot][chunk] : g->chunk[slot][chunk];
}

void qt_commg_mark(qt_comm *c, int r, int lane, cudaStream_t s, int which, int slot, int chunk) {
    QT_CUDA(cudaEventRecord(slot_event(c, r, which, slot, chunk), lane_stream(c, r, lane, s)));
}

void qt_commg_wait_peer(qt_comm *c, int r, int lane, cudaStream_t s, int j, int which, int slot, int chunk) {
    QT_CUDA(cudaStreamWaitEvent(lane_stream(c, r, lane, s), slot_event(c, j, which, slot, chunk), 0));
}

void qt_commg_record_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf) {
    QT_CUDA(cudaEventRecord(c->g[r]->pulled[lane][buf], lane_stream(c, r, lane, s)));
}

void qt_commg_wait_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf) {
    QT_CUDA(cudaStreamWaitEvent(s, c->g[r]->pulled[lane][buf], 0));
}

void qt_commg_oneshot(qt_comm *c, int r, qt_oneshot *a, cudaStream_t s) {
    for (int j = 0; j < c->n; j++)
        a->flags[j] = c->all_peer ? c->g[j]->flags : c->hflags + (size_t)j * QT_COMM_MAX_RANKS;
    a->abort = c->abort_word;
    a->local = c->g[r]->local;
    a->max_blocks = c->g[r]->max_blocks;
    qt_comm_oneshot_launch(a, s);
}

static void enable_peers(qt_comm *c) {
    c->all_peer = 1;
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++) {
            int da = c->devices[a], db = c->devices[b], ok = 0;
            if (da == db) continue;
            QT_CUDA(cudaDeviceCanAccessPeer(&ok, da, db));
            if (!ok) {
                c->all_peer = 0;
                continue;
            }
            QT_CUDA(cudaSetDevice(da));
            cudaError_t e = cudaDeviceEnablePeerAccess(db, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
            else QT_CUDA(e);
        }
}

void qt_commg_init(qt_comm *c, size_t arena_total, int wc) {
    unsigned flags = cudaHostAllocPortable | (wc ? cudaHostAllocWriteCombined : 0);
    void *arena = NULL;
    QT_CUDA(cudaSetDevice(c->devices[0]));
    QT_CUDA(cudaHostAlloc(&arena, arena_total, flags));
    c->scal = arena;
    c->arena = (unsigned char *)arena + (size_t)c->n * QT_COMM_MAX_SCALARS * sizeof(float);
    /* The abort word (first 64 bytes) and the host kinds' one-shot flags; owned by c (qt_commg_free). */
    size_t sync_bytes = 64 + (size_t)c->n * QT_COMM_MAX_RANKS * sizeof(unsigned long long);
    QT_CUDA(cudaHostAlloc((void **)&c->abort_word, sync_bytes, cudaHostAllocPortable | cudaHostAllocMapped));
    memset(c->abort_word, 0, sync_bytes);
    c->hflags = (unsigned long long *)((char *)c->abort_word + 64);
    for (int r = 0; r < c->n; r++) {
        qt_comm_gpu *g = calloc(1, sizeof *g);
        QT_CHECK(g != NULL, "out of memory");
        c->g[r] = g;
        g->dev = c->devices[r];
        g->nlanes = c->n - 1 > 2 ? c->n - 1 : 2;
        QT_CUDA(cudaSetDevice(g->dev));
        for (int l = 1; l <= QT_COMM_ALL_LANES; l++)
            if (lane_made(g, l)) QT_CUDA(cudaStreamCreateWithFlags(&g->lane[l - 1], cudaStreamNonBlocking));
        unsigned ef = cudaEventDisableTiming;
        for (int k = 0; k < QT_COMM_SLOTS; k++) {
            QT_CUDA(cudaEventCreateWithFlags(&g->ready[k], ef));
            QT_CUDA(cudaEventCreateWithFlags(&g->done[k], ef));
            for (int i = 0; i < QT_COMM_MAX_CHUNKS; i++) {
                QT_CUDA(cudaEventCreateWithFlags(&g->chunk[k][i], ef));
                QT_CUDA(cudaEventCreateWithFlags(&g->pull[k][i], ef));
            }
        }
        for (int l = 0; l <= QT_COMM_ALL_LANES; l++) {
            if (l && !lane_made(g, l)) continue;
            QT_CUDA(cudaEventCreateWithFlags(&g->dep[l], ef));
            QT_CUDA(cudaEventCreateWithFlags(&g->pulled[l][0], ef));
            QT_CUDA(cudaEventCreateWithFlags(&g->pulled[l][1], ef));
        }
        if (c->stage_bytes) QT_CUDA(cudaMalloc(&c->stage[r], c->stage_bytes));
        QT_CUDA(cudaMalloc((void **)&c->scal_stage[r], (size_t)c->n * QT_COMM_MAX_SCALARS * sizeof(float)));
        QT_CUDA(cudaMalloc((void **)&g->flags, QT_COMM_MAX_RANKS * sizeof(unsigned long long)));
        QT_CUDA(cudaMalloc((void **)&g->local, sizeof(qt_oneshot_local)));
        QT_CUDA(cudaMemset(g->flags, 0, QT_COMM_MAX_RANKS * sizeof(unsigned long long)));
        QT_CUDA(cudaMemset(g->local, 0, sizeof(qt_oneshot_local)));
        QT_CUDA(cudaDeviceGetAttribute(&g->max_blocks, cudaDevAttrMultiProcessorCount, g->dev));
        /* Ranks that share a device never run one-shot kernels: a kernel spinning for a peer on the same
         * GPU blocks that peer's work queued behind it wherever their streams share a hardware queue (3
         * ranks on one H100 with CUDA_DEVICE_MAX_CONNECTIONS=1 hung; test_one_hardware_queue). */
        for (int j = 0; j < c->n; j++)
            if (j != r && c->devices[j] == g->dev) c->oneshot_on = 0;
        QT_CUDA(cudaDeviceSynchronize()); /* the memsets ran on the legacy stream; our streams do not wait for it */
    }
    if (c->kind == QT_COMM_PEER) enable_peers(c);
}

void qt_commg_free(qt_comm *c) {
    for (int r = 0; r < c->n; r++) {
        qt_comm_gpu *g = c->g[r];
        if (!g) continue;
        QT_CUDA(cudaSetDevice(g->dev));
        for (int l = 1; l <= QT_COMM_ALL_LANES; l++) {
            if (!lane_made(g, l)) continue;
            QT_CUDA(cudaStreamSynchronize(g->lane[l - 1]));
            QT_CUDA(cudaStreamDestroy(g->lane[l - 1]));
        }
        for (int k = 0; k < QT_COMM_SLOTS; k++) {
            QT_CUDA(cudaEventDestroy(g->ready[k]));
            QT_CUDA(cudaEventDestroy(g->done[k]));
            for (int i = 0; i < QT_COMM_MAX_CHUNKS; i++) {
                QT_CUDA(cudaEventDestroy(g->chunk[k][i]));
                QT_CUDA(cudaEventDestroy(g->pull[k][i]));
            }
        }
        for (int l = 0; l <= QT_COMM_ALL_LANES; l++) {
            if (l && !lane_made(g, l)) continue;
            QT_CUDA(cudaEventDestroy(g->dep[l]));
            QT_CUDA(cudaEventDestroy(g->pulled[l][0]));
            QT_CUDA(cudaEventDestroy(g->pulled[l][1]));
        }
        if (c->stage[r]) QT_CUDA(cudaFree(c->stage[r]));
        QT_CUDA(cudaFree(c->scal_stage[r]));
        QT_CUDA(cudaFree(g->flags));
        QT_CUDA(cudaFree(g->local));
        free(g);
    }
    if (c->scal) QT_CUDA(cudaFreeHost(c->scal));
    if (c->abort_word) QT_CUDA(cudaFreeHost(c->abort_word));
}

qt_comm *qt_comm_create(int n, const int *devices, qt_comm_kind kind, size_t host_arena_bytes,
                        const qt_comm_opts *opts) {
    int ndev = 0;
    QT_CUDA(cudaGetDeviceCount(&ndev));
    QT_CHECK(n >= 1 && n <= QT_COMM_MAX_RANKS, "comm: %d ranks, expected 1..%d", n, QT_COMM_MAX_RANKS);
    for (int r = 0; r < n; r++)
        QT_CHECK(devices[r] >= 0 && devices[r] < ndev, "comm: rank %d on device %d, but %d devices exist", r,
                 devices[r], ndev);
    qt_comm_probe_result p;
    const qt_comm_probe_result *pp = opts ? opts->probe : NULL;
    if (kind == QT_COMM_AUTO) {
        if (!pp) {
            /* Probe each distinct device once. */
            int uniq[QT_COMM_MAX_RANKS], nu = 0;
            for (int r = 0; r < n; r++) {
                int seen = 0;
                for (int u = 0; u < nu; u++) seen |= uniq[u] == devices[r];
                if (!seen) uniq[nu++] = devices[r];
            }
            QT_CHECK(qt_comm_probe(nu, uniq, &p) == 0, "comm: the link probe failed");
            if (opts && opts->probe_log) qt_comm_probe_print(&p, opts->probe_log, 0);
            pp = &p;
        }
        kind = pp->pick;
    }
    qt_comm *c = qt_comm_alloc(n, kind, host_arena_bytes, opts, 1);
    memcpy(c->devices, devices, (size_t)n * sizeof(int));
    qt_commg_init(c, (size_t)n * QT_COMM_MAX_SCALARS * sizeof(float) + c->arena_bytes, kind == QT_COMM_HOST_WC);
    qt_comm_set_rs(c, opts, pp);
    if (c->rs_load && !c->all_peer) { /* a kernel cannot load through a pair without peer access */
        qt_comm_opts o = opts ? *opts : (qt_comm_opts){0};
        o.peer_rs = QT_COMM_RS_COPY;
        qt_comm_set_rs(c, &o, NULL);
    }
    qt_comm_register(c);
    return c;
}
