/* internode.c — NCCL communicators between the nodes, one per local GPU index (qt_internode.h).
 *
 * Non-blocking communicators (ncclConfig_t.blocking = 0): a call may return ncclInProgress, and the
 * communicator is then polled (ncclCommGetAsyncError) until it settles, for at most the timeout given at
 * creation, so a node that is gone fails the wait instead of hanging it. qt_internode_abort sets a flag
 * every wait reads and aborts the communicators. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_error.h"
#include "qt_internode.h"

_Static_assert(sizeof(ncclUniqueId) == QT_INTERNODE_ID_BYTES, "QT_INTERNODE_ID_BYTES is sizeof(ncclUniqueId)");

struct qt_internode {
    int node_rank, nodes, gpus;
    double timeout_s;
    atomic_int aborted;
    ncclComm_t comm[QT_INTERNODE_MAX_GPUS];
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Polls comm until its pending operation settles: its status (ncclInProgress when the timeout passed). */
static ncclResult_t settle(qt_internode *c, ncclComm_t comm, ncclResult_t r) {
    double end = now_s() + c->timeout_s;
    while (r == ncclInProgress && !atomic_load(&c->aborted) && now_s() < end) {
        ncclResult_t a;
        if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclSystemError;
        if ((r = a) == ncclInProgress) nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
    }
    return r;
}

int qt_internode_make_ids(unsigned char *blob, size_t cap, int gpus, char *err, size_t errlen) {
    if (gpus < 1 || gpus > QT_INTERNODE_MAX_GPUS || (size_t)gpus * QT_INTERNODE_ID_BYTES > cap)
        return qt_errf(err, errlen, "internode: %d GPUs: expected 1..%d whose ids fit %zu bytes", gpus,
                       QT_INTERNODE_MAX_GPUS, cap);
    for (int g = 0; g < gpus; g++) {
        ncclUniqueId id;
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return qt_errf(err, errlen, "internode: ncclGetUniqueId: %s", ncclGetErrorString(r));
        memcpy(blob + (size_t)g * QT_INTERNODE_ID_BYTES, &id, sizeof id);
    }
    return 0;
}

int qt_internode_create(qt_internode **out, const unsigned char *blob, int node_rank, int nodes, int gpus,
                        const int *devices, double timeout_s, char *err, size_t errlen) {
    *out = NULL;
    if (gpus < 1 || gpus > QT_INTERNODE_MAX_GPUS || nodes < 1 || node_rank < 0 || node_rank >= nodes || !(timeout_s > 0))
        return qt_errf(err, errlen, "internode: node %d of %d, %d GPUs, timeout %g s: expected 0 <= node < nodes, "
                       "1..%d GPUs and a timeout > 0", node_rank, nodes, gpus, timeout_s, QT_INTERNODE_MAX_GPUS);
    qt_internode *c = calloc(1, sizeof *c);
    if (!c) return qt_errf(err, errlen, "internode: out of host memory");
    *c = (qt_internode){.node_rank = node_rank, .nodes = nodes, .gpus = gpus, .timeout_s = timeout_s};
    int dev0 = 0;
    cudaGetDevice(&dev0);
    ncclResult_t r = ncclGroupStart();
    for (int g = 0; g < gpus && (r == ncclSuccess || r == ncclInProgress); g++) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclUniqueId id;
        memcpy(&id, blob + (size_t)g * QT_INTERNODE_ID_BYTES, sizeof id);
        if (cudaSetDevice(devices[g]) != cudaSuccess) r = ncclInvalidArgument;
        else r = ncclCommInitRankConfig(&c->comm[g], nodes, id, node_rank, &cfg);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
    for (int g = 0; g < gpus && (r == ncclSuccess || r == ncclInProgress); g++)
        if (c->comm[g]) r = settle(c, c->comm[g], ncclInProgress);
    cudaSetDevice(dev0);
    if (r == ncclSuccess) {
        *out = c;
        return 0;
    }
    qt_errf(err, errlen, "internode: node %d of %d: NCCL communicators for %d GPUs: %s", node_rank, nodes, gpus,
            r == ncclInProgress ? "not every node joined within the timeout" : ncclGetErrorString(r));
    qt_internode_abort(c);
    qt_internode_free(c);
    return -1;
}

void qt_internode_abort(qt_internode *c) {
    if (!c || atomic_exchange(&c->aborted, 1)) return;
    for (int g = 0; g < c->gpus; g++)
        if (c->comm[g]) ncclCommAbort(c->comm[g]);
}

void qt_internode_free(qt_internode *c) {
    if (!c) return;
    for (int g = 0; g < c->gpus && !atomic_load(&c->aborted); g++) { /* finalize (may be in progress), destroy */
        if (!c->comm[g]) continue;
        if (settle(c, c->comm[g], ncclCommFinalize(c->comm[g])) == ncclSuccess) ncclCommDestroy(c->comm[g]);
        else ncclCommAbort(c->comm[g]);
    }
    free(c);
}

int qt_internode_check(qt_internode *c, char *err, size_t errlen) {
    for (int g = 0; g < c->gpus; g++) {
        ncclResult_t a = ncclSuccess;
        if (atomic_load(&c->aborted)) return qt_errf(err, errlen, "internode: aborted");
        ncclCommGetAsyncError(c->comm[g], &a);
        if (a != ncclSuccess && a != ncclInProgress)
            return qt_errf(err, errlen, "internode: node %d, GPU %d: %s (%s)", c->node_rank, g, ncclGetErrorString(a),
                           ncclGetLastError(c->comm[g]));
    }
    return 0;
}

/* The collective's status, settled: 0, -1 once aborted; an NCCL error or the timeout fails (qt_fail). */
static int done(qt_internode *c, int g, ncclResult_t r, const char *call) {
    r = settle(c, c->comm[g], r);
    if (atomic_load(&c->aborted)) return -1;
    if (r != ncclSuccess)
        qt_fail_as(QT_ERR_DEVICE, __FILE__, __LINE__, call, "node %d of %d, GPU %d: %s (%s)", c->node_rank, c->nodes,
                   g, r == ncclInProgress ? "not settled within the timeout" : ncclGetErrorString(r),
                   ncclGetLastError(c->comm[g]));
    return 0;
}

static ncclDataType_t nccl_type(qt_dtype dt) {
    QT_CHECK(dt == QT_DT_F32 || dt == QT_DT_BF16, "internode collectives move fp32 or bf16, got dtype %d", (int)dt);
    return dt == QT_DT_F32 ? ncclFloat32 : ncclBfloat16;
}

int qt_internode_all_reduce(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t count,
                            cudaStream_t s) {
    if (atomic_load(&c->aborted)) return -1;
    return done(c, g, ncclAllReduce(src, dst, count, nccl_type(dt), ncclSum, c->comm[g], s), "ncclAllReduce");
}

int qt_internode_reduce_scatter(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t per_node,
                                cudaStream_t s) {
    if (atomic_load(&c->aborted)) return -1;
    return done(c, g, ncclReduceScatter(src, dst, per_node, nccl_type(dt), ncclSum, c->comm[g], s), "ncclReduceScatter");
}

int qt_internode_all_gather(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t per_node,
                            cudaStream_t s) {
    if (atomic_load(&c->aborted)) return -1;
    return done(c, g, ncclAllGather(src, dst, per_node, nccl_type(dt), c->comm[g], s), "ncclAllGather");
}

int qt_internode_all_reduce_max(qt_internode *c, int g, float *vals, size_t count, cudaStream_t s) {
    if (atomic_load(&c->aborted)) return -1;
    return done(c, g, ncclAllReduce(vals, vals, count, ncclFloat32, ncclMax, c->comm[g], s), "ncclAllReduce (max)");
}
