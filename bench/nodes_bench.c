/* nodes_bench.c — the legs between nodes (docs/multi-node.md): our hierarchical collectives against NCCL
 * alone over every GPU, on one host emulating 2 nodes.
 *
 * The parent splits the host's GPUs (an even count >= 2) into two nodes of G GPUs and starts itself once per
 * node with disjoint CUDA_VISIBLE_DEVICES, NCCL forced onto its socket transport over the loopback
 * (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo, the path real nodes take over Ethernet); the
 * nodes meet (qt_rendezvous.h), node 0 handing over G NCCL ids for the per-GPU communicators
 * (qt_internode.h) and one for a communicator of all W = 2 x G GPUs. Per size S (the whole tensor, 4 MiB to
 * 1 GiB), each GPU one thread:
 *   hier all-gather (bf16, the weights' path): NCCL all-gather of the GPU's world piece [S / W] with its GPU
 *     of the other node into its local piece [S / G], then comm/ all-gathers the node's local pieces [S];
 *   hier reduce-scatter (fp32, the gradients' path): comm/ reduce-scatters [S] into the local piece, then NCCL
 *     reduce-scatters it with the other node into the world piece;
 *   nccl all-gather / reduce-scatter: one call over the communicator of all W GPUs (NCCL's own ring or tree).
 * Per point: 3 warm-up iterations, then --iters timed ones (a barrier of the node's threads, the op between two
 * events on each GPU's stream; the iteration's time is the node's slowest GPU); node 0 reports the median.
 * busbw = S / t x (W - 1) / W (nccl-tests' convention): the bytes one GPU moves one way per second, which over
 * the loopback's sockets is bounded by the socket transport, measured by the NCCL rows.
 * Usage: nodes_bench [--iters N] [--md FILE] (child: nodes_bench --node K PORT G ITERS [FILE]). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qt_comm.h"
#include "qt_device.h"
#include "qt_error.h"
#include "qt_internode.h"
#include "qt_rendezvous.h"

#define NSIZES 9 /* 4 MiB x 4^k, k < 9 gives 4 MiB .. 1 GiB in steps of 2x below */
#define MAXIT 100
enum { HIER_AG, NCCL_AG, HIER_RS, NCCL_RS, NROWS };
static const char *row_names[NROWS] = {"hier all-gather", "nccl all-gather", "hier reduce-scatter", "nccl reduce-scatter"};

typedef struct {
    int node, gpus, iters;
    qt_comm *comm;        /* the node's GPUs (NULL with one) */
    qt_internode *x;      /* GPU g with GPU g of the other node */
    ncclComm_t flat[QT_INTERNODE_MAX_GPUS]; /* every GPU of both nodes */
    pthread_barrier_t bar;
    float ms[QT_INTERNODE_MAX_GPUS][MAXIT];
} bench;

typedef struct {
    bench *b;
    int g, row;
    size_t bytes;
    int rc;
} job;

#define NCK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(r_)); return -1; } } while (0)

/* One GPU's iterations of one row at one size; its times in b->ms[g]. */
static int run_row(bench *b, int g, int row, size_t bytes) {
    int G = b->gpus, W = 2 * G, node = b->node, ag = row == HIER_AG || row == NCCL_AG;
    qt_dtype dt = ag ? QT_DT_BF16 : QT_DT_F32;
    size_t es = ag ? 2 : 4, n = bytes / es, per = n / (size_t)W, loc = n / (size_t)G;
    char *buf, *piece;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    QT_CUDA(cudaSetDevice(g));
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    QT_CUDA(cudaEventCreate(&e0));
    QT_CUDA(cudaEventCreate(&e1));
    QT_CUDA(cudaMalloc((void **)&buf, bytes));
    QT_CUDA(cudaMalloc((void **)&piece, per * es));
    QT_CUDA(cudaMemset(buf, 0, bytes));
    QT_CUDA(cudaMemset(piece, 0, per * es));
    char *local = buf + (size_t)g * loc * es, *world = local + (size_t)node * per * es;
    for (int it = -3; it < b->iters; it++) {
        pthread_barrier_wait(&b->bar);
        QT_CUDA(cudaEventRecord(e0, s));
        int rc = 0;
        if (row == HIER_AG) {
            rc = qt_internode_all_gather(b->x, g, dt, piece, local, per, s);
            if (!rc && G > 1) rc = qt_comm_all_gather(b->comm, g, buf, local, n, dt, s);
        } else if (row == HIER_RS) {
            if (G > 1) rc = qt_comm_reduce_scatter(b->comm, g, local, buf, n, dt, s);
            if (!rc) rc = qt_internode_reduce_scatter(b->x, g, dt, local, world, per, s);
        } else if (row == NCCL_AG) {
            NCK(ncclAllGather(piece, buf, per, ncclBfloat16, b->flat[g], s));
        } else {
            NCK(ncclReduceScatter(buf, piece, per, ncclFloat32, ncclSum, b->flat[g], s));
        }
        if (rc) return -1;
        QT_CUDA(cudaEventRecord(e1, s));
        QT_CUDA(cudaEventSynchronize(e1));
        if (it >= 0) QT_CUDA(cudaEventElapsedTime(&b->ms[g][it], e0, e1));
    }
    QT_CUDA(cudaFree(buf));
    QT_CUDA(cudaFree(piece));
    QT_CUDA(cudaEventDestroy(e0));
    QT_CUDA(cudaEventDestroy(e1));
    QT_CUDA(cudaStreamDestroy(s));
    return 0;
}

static void *thread_main(void *arg) {
    job *j = arg;
    j->rc = run_row(j->b, j->g, j->row, j->bytes);
    return NULL;
}

static int by_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median over iterations of the node's slowest GPU, ms. */
static float median_ms(const bench *b) {
    float t[MAXIT];
    for (int it = 0; it < b->iters; it++) {
        t[it] = 0;
        for (int g = 0; g < b->gpus; g++) t[it] = b->ms[g][it] > t[it] ? b->ms[g][it] : t[it];
    }
    qsort(t, (size_t)b->iters, sizeof *t, by_float);
    return t[b->iters / 2];
}

/* Node `node` of 2: meets the other, makes the communicators, runs every row at every size; node 0 prints the
 * table (and appends it to md). Returns the process's exit status. */
static int run_node(int node, int port, int G, int iters, const char *md) {
    static bench b;
    unsigned char blob[QT_RDZV_BLOB] = {0};
    char err[1024];
    b = (bench){.node = node, .gpus = G, .iters = iters};
    if (!node && qt_internode_make_ids(blob, sizeof blob, G, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    if (!node && ncclGetUniqueId((ncclUniqueId *)(blob + (size_t)G * QT_INTERNODE_ID_BYTES)) != ncclSuccess)
        return fprintf(stderr, "ncclGetUniqueId failed\n"), 1;
    qt_rdzv_opts o = {"127.0.0.1", port, node, 2, G, 0xbe7c, 120.0};
    if (qt_rdzv_run(&o, blob, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    int devices[QT_INTERNODE_MAX_GPUS];
    for (int g = 0; g < G; g++) devices[g] = g;
    if (qt_internode_create(&b.x, blob, node, 2, G, devices, 120.0, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    ncclUniqueId flat_id;
    memcpy(&flat_id, blob + (size_t)G * QT_INTERNODE_ID_BYTES, sizeof flat_id);
    if (ncclGroupStart() != ncclSuccess) return 1;
    for (int g = 0; g < G; g++) {
        QT_CUDA(cudaSetDevice(g));
        if (ncclCommInitRank(&b.flat[g], 2 * G, flat_id, node * G + g) != ncclSuccess) return fprintf(stderr, "flat init\n"), 1;
    }
    if (ncclGroupEnd() != ncclSuccess) return fprintf(stderr, "flat communicator: ncclGroupEnd failed\n"), 1;
    qt_comm_opts co = {0};
    if (G > 1 && !(b.comm = qt_comm_create(G, devices, QT_COMM_AUTO, 0, &co))) return fprintf(stderr, "comm\n"), 1;
    pthread_barrier_init(&b.bar, NULL, (unsigned)G);
    FILE *f = !node && md ? fopen(md, "a") : NULL;
    if (!node) {
        printf("nodes_bench: 2 emulated nodes x %d GPUs (NCCL sockets over lo between them, comm %s inside), busbw GB/s, "
               "median of %d\n%10s", G, G > 1 ? qt_comm_name(b.comm) : "-", iters, "size");
        for (int r = 0; r < NROWS; r++) printf(" %20s", row_names[r]);
        printf("\n");
    }
    if (f) {
        fprintf(f, "\n#### Between nodes: 2 emulated nodes x %d GPUs, busbw GB/s (median of %d)\n\n| size |", G, iters);
        for (int r = 0; r < NROWS; r++) fprintf(f, " %s |", row_names[r]);
        fprintf(f, " hier / nccl (all-gather, reduce-scatter) |\n|---|---|---|---|---|---|\n");
    }
    for (int k = 0; k < NSIZES; k++) {
        size_t bytes = ((size_t)4 << 20) << k;
        double bw[NROWS];
        for (int r = 0; r < NROWS; r++) {
            pthread_t th[QT_INTERNODE_MAX_GPUS];
            job j[QT_INTERNODE_MAX_GPUS];
            for (int g = 0; g < G; g++) {
                j[g] = (job){&b, g, r, bytes, 0};
                pthread_create(&th[g], NULL, thread_main, &j[g]);
            }
            for (int g = 0; g < G; g++) pthread_join(th[g], NULL);
            for (int g = 0; g < G; g++)
                if (j[g].rc) return fprintf(stderr, "node %d: %s at %zu bytes failed\n", node, row_names[r], bytes), 1;
            bw[r] = bytes / (median_ms(&b) * 1e-3) * (2.0 * G - 1) / (2.0 * G) / 1e9;
        }
        if (!node) {
            printf("%7zu MiB", bytes >> 20);
            for (int r = 0; r < NROWS; r++) printf(" %20.1f", bw[r]);
            printf("\n");
            fflush(stdout);
        }
        if (f) fprintf(f, "| %zu MiB | %.1f | %.1f | %.1f | %.1f | %.2fx, %.2fx |\n", bytes >> 20, bw[0], bw[1], bw[2], bw[3],
                       bw[HIER_AG] / bw[NCCL_AG], bw[HIER_RS] / bw[NCCL_RS]);
    }
    if (f) fclose(f);
    for (int g = 0; g < G; g++) ncclCommDestroy(b.flat[g]);
    qt_internode_free(b.x);
    qt_comm_free(b.comm);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 6 && !strcmp(argv[1], "--node"))
        return run_node(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), argc > 6 ? argv[6] : NULL);
    int iters = 20;
    const char *md = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--md") && i + 1 < argc) md = argv[++i];
        else return fprintf(stderr, "usage: nodes_bench [--iters N] [--md FILE]\n"), 2;
    }
    if (iters < 5 || iters > MAXIT) return fprintf(stderr, "nodes_bench: --iters %d: expected 5..%d\n", iters, MAXIT), 2;
    int n = qt_cuda_device_count();
    if (n < 2) return printf("nodes_bench: needs 2 or more GPUs (2 emulated nodes), %d here: skipped\n", n), 0;
    int G = n / 2 > QT_INTERNODE_MAX_GPUS - 1 ? QT_INTERNODE_MAX_GPUS - 1 : n / 2; /* + the flat id: 8 ids in the blob */
    int port = 20000 + (int)(getpid() % 20000);
    pid_t pid[2];
    char its[16], gs[16], ps[16];
    snprintf(its, sizeof its, "%d", iters), snprintf(gs, sizeof gs, "%d", G), snprintf(ps, sizeof ps, "%d", port);
    fflush(stdout);
    for (int k = 0; k < 2; k++) {
        char devs[64] = "", ks[8];
        for (int g = 0, o = 0; g < G; g++) o += snprintf(devs + o, sizeof devs - o, g ? ",%d" : "%d", k * G + g);
        snprintf(ks, sizeof ks, "%d", k);
        if ((pid[k] = fork()) == 0) {
            setenv("CUDA_VISIBLE_DEVICES", devs, 1);
            setenv("NCCL_P2P_DISABLE", "1", 1), setenv("NCCL_SHM_DISABLE", "1", 1), setenv("NCCL_SOCKET_IFNAME", "lo", 1);
            setenv("NCCL_NVLS_ENABLE", "0", 1);
            execl(argv[0], argv[0], "--node", ks, ps, gs, its, md ? md : (char *)NULL, (char *)NULL);
            _exit(127);
        }
    }
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        int st = 0;
        waitpid(pid[k], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = fprintf(stderr, "nodes_bench: node %d failed (status %d)\n", k, st);
    }
    return bad ? 1 : 0;
}
