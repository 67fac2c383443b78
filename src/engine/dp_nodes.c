/* dp_nodes.c — the legs between nodes of a data-parallel step: the communicators and their watchdog,
 * the gradient pieces summed over the nodes, the world-shaped gradient norm, the host values gathered
 * (qt_dp_nodes.h, docs/multi-node.md). */
#include "qt_dp_nodes.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_error.h"
#include "qt_kernels.h"

#define GATHER_MAX 64 /* doubles a node hands qt_dp_nodes_gather at once */

/* The state of a node's communicators: running, a peer lost (msg says which), or this node's own abort. */
enum { RUNNING, PEER_LOST, OWN_ABORT };

struct qt_dp_nodes {
    qt_internode *x;       /* owned */
    qt_comm *comm;         /* the node's (borrowed): aborted with x when a node fails */
    int node, nodes, dev0;
    cudaStream_t s;        /* on devices[0]: the host values' gathers */
    double *buf;           /* device [nodes][GATHER_MAX] */
    pthread_t watch;
    int watching;          /* the watchdog thread runs */
    atomic_int stop;       /* the watchdog's end (qt_dp_nodes_free) */
    pthread_mutex_t mu;    /* state and msg */
    int state;             /* RUNNING, PEER_LOST, OWN_ABORT */
    char msg[1024];        /* PEER_LOST: the message every call of the engine then fails with */
};

/* The live ones, for the abort hook (qt_fail in any thread: a failed rank must not leave its node's other
 * threads or the other nodes waiting in NCCL). */
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static qt_dp_nodes *g_live[4];

int qt_dp_nodes_ids(unsigned char *ids, int gpus, char *err, size_t errlen) {
    return qt_internode_make_ids(ids, QT_NODES_IDS, gpus, err, errlen);
}

/* Leaves RUNNING once: an NCCL error on a communicator (a node gone, the network) makes it PEER_LOST with
 * the lost node named, else (own) OWN_ABORT; either way the communicators and the node's comm are aborted,
 * so every thread waiting in them comes back. */
static void leave(qt_dp_nodes *x, int own) {
    char e[768];
    pthread_mutex_lock(&x->mu);
    if (x->state != RUNNING) {
        pthread_mutex_unlock(&x->mu);
        return;
    }
    if (qt_internode_check(x->x, e, sizeof e)) {
        char who[64];
        if (x->nodes == 2) snprintf(who, sizeof who, "node %d", 1 - x->node);
        else snprintf(who, sizeof who, "another of the %d nodes", x->nodes);
        snprintf(x->msg, sizeof x->msg, "node %d of %d: %s failed or was lost (NCCL between the nodes: %s); every node "
                 "stops", x->node, x->nodes, who, e);
        x->state = PEER_LOST;
        fprintf(stderr, "qtrain: %s\n", x->msg);
    } else if (own) {
        x->state = OWN_ABORT;
    }
    int gone = x->state != RUNNING;
    pthread_mutex_unlock(&x->mu);
    if (!gone) return;
    qt_internode_abort(x->x);
    qt_comm_abort(x->comm);
}

/* qt_fail's abort hook: every live node's communicators left (a peer's error named when NCCL saw one). */
static void abort_hook(void) {
    pthread_mutex_lock(&g_live_mu);
    for (int i = 0; i < 4; i++)
        if (g_live[i]) leave(g_live[i], 1);
    pthread_mutex_unlock(&g_live_mu);
}

static void add_hook(void) { qt_error_add_abort_hook(abort_hook); }

/* Polls the communicators every 100 ms until stopped or left. */
static void *watchdog(void *arg) {
    qt_dp_nodes *x = arg;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        int running = x->state == RUNNING;
        pthread_mutex_unlock(&x->mu);
        if (atomic_load(&x->stop) || !running) break;
        leave(x, 0);
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    return NULL;
}

qt_dp_nodes *qt_dp_nodes_create(const qt_nodes *n, int gpus, const int *devices, qt_comm *comm, double timeout_s,
                                char *err, size_t errlen) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, add_hook);
    qt_dp_nodes *x = calloc(1, sizeof *x);
    if (!x) {
        qt_errf(err, errlen, "out of host memory");
        return NULL;
    }
    x->comm = comm, x->node = n->node, x->nodes = n->nodes, x->dev0 = devices[0];
    pthread_mutex_init(&x->mu, NULL);
    if (qt_internode_create(&x->x, n->ids, n->node, n->nodes, gpus, devices, timeout_s, err, errlen)) {
        pthread_mutex_destroy(&x->mu);
        free(x);
        return NULL;
    }
    int dev = 0;
    QT_CUDA(cudaGetDevice(&dev));
    QT_CUDA(cudaSetDevice(devices[0]));
    QT_CUDA(cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking));
    QT_CUDA(cudaMalloc((void **)&x->buf, (size_t)n->nodes * GATHER_MAX * sizeof(double)));
    QT_CUDA(cudaSetDevice(dev));
    pthread_mutex_lock(&g_live_mu);
    int slot = 0;
    while (slot < 4 && g_live[slot]) slot++;
    if (slot < 4) g_live[slot] = x;
    pthread_mutex_unlock(&g_live_mu);
    x->watching = pthread_create(&x->watch, NULL, watchdog, x) == 0;
    if (slot == 4 || !x->watching) {
        qt_errf(err, errlen, "node %d: %s", n->node, slot == 4 ? "more than 4 engines across nodes in one process"
                                                               : "cannot start the watchdog thread");
        qt_dp_nodes_free(x, 1);
        return NULL;
    }
    return x;
}

void qt_dp_nodes_free(qt_dp_nodes *x, int abort) {
    if (!x) return;
    atomic_store(&x->stop, 1);
    if (x->watching) pthread_join(x->watch, NULL);
    pthread_mutex_lock(&g_live_mu);
    for (int i = 0; i < 4; i++)
        if (g_live[i] == x) g_live[i] = NULL;
    pthread_mutex_unlock(&g_live_mu);
    if (abort) leave(x, 1);
    int dev = 0;
    cudaGetDevice(&dev);
    cudaSetDevice(x->dev0);
    if (x->s) cudaStreamDestroy(x->s); /* after an abort the stream may hold failed work: no checks */
    cudaFree(x->buf);
    cudaSetDevice(dev);
    qt_internode_free(x->x); /* finalized, or what is left after the abort freed */
    pthread_mutex_destroy(&x->mu);
    free(x);
}

qt_internode *qt_dp_nodes_link(qt_dp_nodes *x) { return x->x; }

int qt_dp_nodes_failed(qt_dp_nodes *x, char *msg, size_t cap) {
    pthread_mutex_lock(&x->mu);
    int lost = x->state == PEER_LOST;
    if (lost) snprintf(msg, cap, "%s", x->msg);
    pthread_mutex_unlock(&x->mu);
    return lost;
}

void qt_dp_nodes_gather(qt_dp_nodes *x, const double *mine, int per, double *all) {
    QT_CHECK(per >= 1 && per <= GATHER_MAX, "node gather of %d values (1..%d)", per, GATHER_MAX);
    int dev = 0;
    QT_CUDA(cudaGetDevice(&dev));
    QT_CUDA(cudaSetDevice(x->dev0));
    double *at = x->buf + (size_t)x->node * per;
    QT_CUDA(cudaMemcpyAsync(at, mine, (size_t)per * sizeof(double), cudaMemcpyHostToDevice, x->s));
    int rc = qt_internode_all_gather(x->x, 0, QT_DT_F32, at, x->buf, 2 * (size_t)per, x->s);
    if (rc == 0) QT_CUDA(cudaMemcpyAsync(all, x->buf, (size_t)x->nodes * per * sizeof(double), cudaMemcpyDeviceToHost, x->s));
    cudaError_t e = rc == 0 ? cudaStreamSynchronize(x->s) : cudaSuccess;
    QT_CUDA(cudaSetDevice(dev));
    char why[1024];
    if (qt_dp_nodes_failed(x, why, sizeof why)) qt_fail(__FILE__, __LINE__, "qt_dp_nodes_gather", "%s", why);
    QT_CHECK(rc == 0, "node %d: a gather between the nodes aborted (a node failed)", x->node);
    QT_CUDA(e);
}

void qt_dp_nodes_sum(qt_internode *x, int g, void *local, void *mine, size_t n_local, size_t n_mine, qt_dtype dt,
                     cudaStream_t s) {
    int rc = n_mine == n_local ? qt_internode_all_reduce(x, g, dt, local, local, n_local, s)
                               : qt_internode_reduce_scatter(x, g, dt, local, mine, n_mine, s);
    QT_CHECK(rc == 0, "GPU %d: the gradient sum between the nodes aborted (a node failed)", g);
}

void qt_dp_nodes_all_gather(qt_internode *x, int g, void *local, const void *mine, size_t per, qt_dtype dt,
                            cudaStream_t s) {
    QT_CHECK(qt_internode_all_gather(x, g, dt, mine, local, per, s) == 0,
             "GPU %d: an all-gather between the nodes aborted (a node failed)", g);
}

void qt_dp_nodes_max(qt_internode *x, int g, float *vals, int n, cudaStream_t s) {
    QT_CHECK(qt_internode_all_reduce_max(x, g, vals, (size_t)n, s) == 0,
             "GPU %d: the abs-max between the nodes aborted (a node failed)", g);
}

/* Every bucket's world piece goes in chunks of at most c elements: a chunk of each node's piece lands in
 * stage[node][c] (NCCL's all-gather of bytes as bf16 pairs: es is 2 or 4), then node k's chunk goes to
 * out at the local piece's state index + k x the piece's length. */
void qt_dp_nodes_widen(qt_internode *x, int g, const qt_shard *sh, const void *pieces, size_t es, void *out, void *stage,
                       size_t stage_bytes, cudaStream_t s) {
    size_t nodes = (size_t)sh->nodes, node = (size_t)(sh->rank % sh->nodes), c = stage_bytes / nodes / es / 64 * 64;
    QT_CHECK(c > 0 && es % 2 == 0, "node exchange: %zu bytes of staging for %zu nodes of %zu-byte elements", stage_bytes,
             nodes, es);
    char *st8 = stage;
    for (int b = 0; b < sh->n_buckets; b++) {
        size_t off, len, st, lst = sh->bucket[b] / (size_t)qt_shard_local_ranks(sh);
        qt_shard_piece(sh, b, &off, &len, &st);
        for (size_t i = 0; i < len; i += c) {
            size_t k = len - i < c ? len - i : c;
            QT_CUDA(cudaMemcpyAsync(st8 + node * k * es, (const char *)pieces + (st + i) * es, k * es, cudaMemcpyDefault, s));
            qt_dp_nodes_all_gather(x, g, st8, st8 + node * k * es, k * es / 2, QT_DT_BF16, s);
            for (size_t j = 0; out && j < nodes; j++)
                QT_CUDA(cudaMemcpyAsync((char *)out + (lst + j * len + i) * es, st8 + j * k * es, k * es, cudaMemcpyDeviceToHost, s));
            QT_CUDA(cudaStreamSynchronize(s)); /* the stage is refilled next */
        }
    }
}
