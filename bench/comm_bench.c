/* comm_bench.c — every comm strategy x op x size on this machine's GPUs, NCCL as a reference row
 * (dlopen, never linked), and an overlap run (a bf16 cuBLASLt GEMM loop beside each strategy).
 * Bandwidth ops (all-gather, reduce-scatter, all-reduce, broadcast from rank 0) sweep 4 KiB..1 GiB;
 * the scalar all-reduce (8 fp32) and the barrier are timed once each, as latencies.
 *
 * Per point: after warm-up, each timed iteration is a barrier then the op between two events on every
 * rank's stream; the iteration's time is the slowest rank's; we report the median (p10, p90) of
 * --iters (>= 20). algbw = S / t with S the full tensor (gathered, unreduced); busbw = algbw * (n-1)/n
 * for all-gather and reduce-scatter, 2(n-1)/n for all-reduce, 1 for broadcast (nccl-tests). busbw is
 * the bytes one GPU moves in ONE direction per second, so % = busbw over the one-direction rate of the
 * link it uses: peer paths, the slowest peer pair one way; host paths, the per-GPU rate with all GPUs
 * at once of the direction that bounds the op: H2D for all-gather, all-reduce and broadcast (each GPU
 * receives (n-1)/n S, 2(n-1)/n S, S host->device), min(H2D, D2H) for reduce-scatter (each GPU sends and receives
 * (n-1)/n S). (Half of the H2D+D2H-together rate, used before, undercounted: the copies overlap
 * better in a collective than in the probe, giving > 100%.) Prints a table, and appends TSV rows and
 * a markdown section when --tsv / --md are given. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_comm.h"
#include "qt_error.h"

#define MAXIT 200
/* Bandwidth ops are swept over sizes; the latency ops run once (8 fp32 scalars; a barrier). */
enum { OP_AG, OP_RS, OP_AR, OP_BC, NOPS, OP_SCAL = NOPS, OP_BAR, NALLOPS };
static const char *op_names[NALLOPS] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                        "all_reduce_scalars", "barrier"};
#define NSCAL 8
enum { S_PEER, S_RING, S_LOAD, S_HOST, S_HOST_WC, S_NCCL, NSTRAT };
/* peer_load: the peer kind with QT_COMM_RS_LOAD (its all-gather is peer's; reduce-scatter and
 * all-reduce differ); peer and peer_ring use QT_COMM_RS_COPY. */
static const char *strat_names[NSTRAT] = {"peer", "peer_ring", "peer_load", "host", "host_wc", "nccl"};

/* ---- NCCL through dlopen ---- */
typedef int (*nccl_init_all_t)(void **comms, int n, const int *devs);
typedef int (*nccl_ag_t)(const void *, void *, size_t, int, void *, cudaStream_t);
typedef int (*nccl_red_t)(const void *, void *, size_t, int, int, void *, cudaStream_t);
typedef int (*nccl_bc_t)(const void *, void *, size_t, int, int root, void *, cudaStream_t);
typedef int (*nccl_destroy_t)(void *);
typedef int (*nccl_ver_t)(int *);
static struct {
    nccl_init_all_t init_all;
    nccl_ag_t ag;
    nccl_red_t rs, ar;
    nccl_bc_t bc;
    nccl_destroy_t destroy;
    int version;
    void *comms[QT_COMM_MAX_RANKS];
} g_nccl;
enum { NCCL_F32 = 7, NCCL_BF16 = 9, NCCL_SUM = 0 };

static int nccl_load(char *why, size_t n) {
    const char *paths[] = {"libnccl.so.2", "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"};
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++) h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) { snprintf(why, n, "dlopen(libnccl.so.2) failed: %s", dlerror()); return -1; }
    g_nccl.init_all = (nccl_init_all_t)dlsym(h, "ncclCommInitAll");
    g_nccl.ag = (nccl_ag_t)dlsym(h, "ncclAllGather");
    g_nccl.rs = (nccl_red_t)dlsym(h, "ncclReduceScatter");
    g_nccl.ar = (nccl_red_t)dlsym(h, "ncclAllReduce");
    g_nccl.bc = (nccl_bc_t)dlsym(h, "ncclBroadcast");
    g_nccl.destroy = (nccl_destroy_t)dlsym(h, "ncclCommDestroy");
    nccl_ver_t ver = (nccl_ver_t)dlsym(h, "ncclGetVersion");
    if (!g_nccl.init_all || !g_nccl.ag || !g_nccl.rs || !g_nccl.ar || !g_nccl.bc || !g_nccl.destroy || !ver) {
        snprintf(why, n, "libnccl.so.2 lacks a symbol");
        return -1;
    }
    ver(&g_nccl.version);
    return 0;
}

/* ---- the run state ---- */
static struct {
    int n, devices[QT_COMM_MAX_RANKS], iters, warmup, shared_dev;
    unsigned ops; /* bit per op (--ops) */
    size_t max_bytes;
    cudaStream_t s[QT_COMM_MAX_RANKS], gs[QT_COMM_MAX_RANKS];
    cudaEvent_t e0[QT_COMM_MAX_RANKS][MAXIT], e1[QT_COMM_MAX_RANKS][MAXIT];
    char *a[QT_COMM_MAX_RANKS], *b[QT_COMM_MAX_RANKS];
    float *one[QT_COMM_MAX_RANKS]; /* NSCAL floats: the barrier's and the scalar all-reduce's operand */
    qt_comm_probe_result probe;
    FILE *tsv, *md;
    const char *label, *nccl_tag;
    char cmd[1024];
    double enqueue_us[QT_COMM_MAX_RANKS]; /* last point: median host time to enqueue one op */
} G;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

typedef struct {
    int strat, op, r;
    qt_comm *c;
    size_t bytes;
    int reps;         /* ops per timed iteration (overlap runs use several) */
    float ms[MAXIT];  /* per iteration */
} job;

static int do_op(job *j, cudaStream_t s) {
    int r = j->r, n = G.n;
    size_t count = j->bytes / 2, off, len;
    qt_comm_shard(count, n, r, &off, &len);
    if (j->strat == S_NCCL) {
        void *nc = g_nccl.comms[r];
        int rc = j->op == OP_AG   ? g_nccl.ag(G.b[r], G.a[r], count / n, NCCL_BF16, nc, s)
                 : j->op == OP_RS ? g_nccl.rs(G.a[r], G.b[r], count / n, NCCL_BF16, NCCL_SUM, nc, s)
                 : j->op == OP_AR ? g_nccl.ar(G.a[r], G.b[r], count, NCCL_BF16, NCCL_SUM, nc, s)
                 : j->op == OP_BC ? g_nccl.bc(G.a[r], G.a[r], count, NCCL_BF16, 0, nc, s)
                                  : g_nccl.ar(G.one[r], G.one[r], NSCAL, NCCL_F32, NCCL_SUM, nc, s);
        QT_CHECK(rc == 0, "NCCL %s returned %d", op_names[j->op], rc);
        return 0;
    }
    switch (j->op) {
    case OP_AG: return qt_comm_all_gather(j->c, r, G.a[r], G.b[r], count, QT_DT_BF16, s);
    case OP_RS: return qt_comm_reduce_scatter(j->c, r, G.b[r], G.a[r], count, QT_DT_BF16, s);
    case OP_AR: return qt_comm_all_reduce(j->c, r, G.b[r], G.a[r], count, QT_DT_BF16, s);
    case OP_BC: return qt_comm_broadcast(j->c, r, 0, G.a[r], count, QT_DT_BF16, s);
    case OP_SCAL: return qt_comm_all_reduce_scalars(j->c, r, G.one[r], NSCAL, QT_COMM_SUM, s);
    default: return qt_comm_barrier(j->c, r, s);
    }
}

static void do_barrier(job *j, cudaStream_t s) {
    if (j->strat == S_NCCL) QT_CHECK(g_nccl.ar(G.one[j->r], G.one[j->r], 1, NCCL_F32, NCCL_SUM, g_nccl.comms[j->r], s) == 0, "nccl");
    else QT_CHECK(qt_comm_barrier(j->c, j->r, s) == 0, "barrier");
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void *rank_main(void *p) {
    job *j = p;
    int r = j->r;
    qt_error_set_rank(r);
    QT_CUDA(cudaSetDevice(G.devices[r]));
    cudaStream_t s = G.s[r];
    int total = G.warmup + G.iters;
    float host[MAXIT];
    for (int it = 0; it < total; it++) {
        do_barrier(j, s);
        if (it >= G.warmup) QT_CUDA(cudaEventRecord(G.e0[r][it - G.warmup], s));
        double t0 = now_us();
        for (int k = 0; k < j->reps; k++) QT_CHECK(do_op(j, s) == 0, "collective aborted");
        if (it >= G.warmup) host[it - G.warmup] = (float)(now_us() - t0);
        if (it >= G.warmup) QT_CUDA(cudaEventRecord(G.e1[r][it - G.warmup], s));
    }
    qsort(host, (size_t)G.iters, sizeof host[0], cmpf);
    G.enqueue_us[r] = host[G.iters / 2];
    QT_CUDA(cudaStreamSynchronize(s));
    for (int it = 0; it < G.iters; it++) QT_CUDA(cudaEventElapsedTime(&j->ms[it], G.e0[r][it], G.e1[r][it]));
    return NULL;
}


/* Runs one point on every rank; returns median seconds per op and fills p10/p90. */
static double run_point(int strat, qt_comm *c, int op, size_t bytes, double *p10, double *p90) {
    job jobs[QT_COMM_MAX_RANKS];
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < G.n; r++) {
        jobs[r] = (job){strat, op, r, c, bytes, 1, {0}};
        pthread_create(&t[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < G.n; r++) pthread_join(t[r], NULL);
    float worst[MAXIT];
    for (int it = 0; it < G.iters; it++) {
        worst[it] = 0;
        for (int r = 0; r < G.n; r++) worst[it] = jobs[r].ms[it] > worst[it] ? jobs[r].ms[it] : worst[it];
    }
    qsort(worst, (size_t)G.iters, sizeof(float), cmpf);
    *p10 = worst[G.iters / 10] * 1e-3;
    *p90 = worst[G.iters * 9 / 10] * 1e-3;
    return worst[G.iters / 2] * 1e-3;
}

/* nccl-tests: busbw = algbw x this. */
static double bus_factor(int op) {
    return op == OP_AR ? 2.0 * (G.n - 1) / G.n : op == OP_BC ? 1.0 : (double)(G.n - 1) / G.n;
}

static double ceiling_of(int strat, int op) {
    const qt_comm_probe_result *p = &G.probe;
    int host = strat == S_HOST || strat == S_HOST_WC || (strat == S_NCCL && getenv("NCCL_P2P_DISABLE"));
    if (!host) return p->peer_min;
    if (op == OP_RS) return p->h2d_all < p->d2h_all ? p->h2d_all : p->d2h_all;
    return p->h2d_all;
}

static const char *row_name(int strat) {
    static char buf[64];
    if (strat != S_NCCL) return strat_names[strat];
    snprintf(buf, sizeof buf, "nccl%s", G.nccl_tag);
    return buf;
}

static void emit(int strat, int op, size_t bytes, double t, double p10, double p90, double gslow, double cslow) {
    int lat = op >= NOPS;
    double alg = lat ? 0 : bytes / t / 1e9, bus = alg * bus_factor(op), ceil = lat ? 0 : ceiling_of(strat, op);
    double pct = ceil > 0 ? 100 * bus / ceil : 0;
    if (lat)
        printf("%-16s %-19s %6zu B %9.1f us (p10 %.1f, p90 %.1f; host enqueue %.1f us)\n", row_name(strat),
               op_names[op], bytes, t * 1e6, p10 * 1e6, p90 * 1e6, G.enqueue_us[0]);
    else if (gslow > -1e8)
        printf("%-16s %-15s %9.1f MiB  comm %8.1f us (alone) -> slowdown %+6.1f%%, GEMM slowdown %+6.1f%%\n",
               row_name(strat), op_names[op], bytes / 1048576.0, t * 1e6, cslow, gslow);
    else
        printf("%-16s %-15s %10zu  %10.1f us  algbw %7.1f  busbw %7.1f GB/s  %5.0f%% of %.0f\n", row_name(strat),
               op_names[op], bytes, t * 1e6, alg, bus, pct, ceil);
    if (G.tsv)
        fprintf(G.tsv, "%s\t%d\t%s\t%s\t%s\t%zu\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\n", G.label, G.n,
                G.shared_dev ? "shared" : "own", row_name(strat), gslow > -1e8 ? (op == OP_AG ? "ag+gemm" : "rs+gemm") : op_names[op],
                bytes, t * 1e6, p10 * 1e6, p90 * 1e6, alg, bus, ceil, pct, gslow > -1e8 ? gslow : 0,
                gslow > -1e8 ? cslow : 0);
    fflush(stdout);
}

/* ---- overlap: a bf16 GEMM loop on a second stream per rank, beside a loop of comm ops ---- */
typedef struct {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l;
    cublasLtMatmulAlgo_t algo;
    void *A, *B, *C, *ws;
    size_t wsb;
} gemm;
static gemm g_gemm[QT_COMM_MAX_RANKS];
#define GM 8192

static void gemm_init(int r) {
    gemm *g = &g_gemm[r];
    QT_CUDA(cudaSetDevice(G.devices[r]));
    QT_CUBLAS(cublasLtCreate(&g->lt));
    size_t mb = (size_t)GM * GM * 2;
    g->wsb = 32 << 20;
    QT_CUDA(cudaMalloc(&g->A, mb));
    QT_CUDA(cudaMalloc(&g->B, mb));
    QT_CUDA(cudaMalloc(&g->C, mb));
    QT_CUDA(cudaMalloc(&g->ws, g->wsb));
    QT_CUDA(cudaMemset(g->A, 0x3c, mb));
    QT_CUDA(cudaMemset(g->B, 0x3b, mb));
    QT_CUBLAS(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    QT_CUBLAS(cublasLtMatrixLayoutCreate(&g->l, CUDA_R_16BF, GM, GM, GM));
    cublasLtMatmulPreference_t pref;
    QT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->wsb, sizeof g->wsb));
    cublasLtMatmulHeuristicResult_t res;
    int got = 0;
    QT_CUBLAS(cublasLtMatmulAlgoGetHeuristic(g->lt, g->op, g->l, g->l, g->l, g->l, pref, 1, &res, &got));
    QT_CHECK(got > 0, "no cuBLASLt algorithm for a bf16 %d^3 GEMM", GM);
    g->algo = res.algo;
    QT_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
}

static void gemm_run(int r, cudaStream_t s) {
    gemm *g = &g_gemm[r];
    float one = 1, zero = 0;
    QT_CUBLAS(cublasLtMatmul(g->lt, g->op, &one, g->A, g->l, g->B, g->l, &zero, g->C, g->l, g->C, g->l, &g->algo,
                             g->ws, g->wsb, s));
}

static void gemm_free(int r) {
    gemm *g = &g_gemm[r];
    QT_CUDA(cudaSetDevice(G.devices[r]));
    cublasLtMatrixLayoutDestroy(g->l);
    cublasLtMatmulDescDestroy(g->op);
    cublasLtDestroy(g->lt);
    cudaFree(g->A); cudaFree(g->B); cudaFree(g->C); cudaFree(g->ws);
}

typedef struct {
    job j;
    int ngemm, mode; /* mode 0: GEMMs alone, 1: GEMMs + comm */
    float gemm_ms, comm_ms;
    pthread_barrier_t *bar;
} ojob;

static void *overlap_rank(void *p) {
    ojob *o = p;
    int r = o->j.r;
    QT_CUDA(cudaSetDevice(G.devices[r]));
    cudaStream_t s = G.s[r], gs = G.gs[r];
    cudaEvent_t a0 = G.e0[r][0], a1 = G.e1[r][0], b0 = G.e0[r][1], b1 = G.e1[r][1];
    do_barrier(&o->j, s); /* all comm streams aligned */
    QT_CUDA(cudaEventRecord(a0, s));
    QT_CUDA(cudaStreamWaitEvent(gs, a0, 0));
    QT_CUDA(cudaEventRecord(b0, gs));
    for (int k = 0; k < o->ngemm; k++) gemm_run(r, gs);
    QT_CUDA(cudaEventRecord(b1, gs));
    for (int k = 0; o->mode && k < o->j.reps; k++) QT_CHECK(do_op(&o->j, s) == 0, "collective aborted");
    QT_CUDA(cudaEventRecord(a1, s));
    QT_CUDA(cudaStreamSynchronize(gs));
    QT_CUDA(cudaStreamSynchronize(s));
    QT_CUDA(cudaEventElapsedTime(&o->gemm_ms, b0, b1));
    QT_CUDA(cudaEventElapsedTime(&o->comm_ms, a0, a1));
    return NULL;
}

static void run_overlap_pair(int strat, qt_comm *c, int op, size_t bytes, int ngemm, int reps, int mode,
                             double *gemm_s, double *comm_s) {
    ojob o[QT_COMM_MAX_RANKS];
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < G.n; r++) {
        memset(&o[r], 0, sizeof o[r]);
        o[r].j = (job){strat, op, r, c, bytes, reps, {0}};
        o[r].ngemm = ngemm;
        o[r].mode = mode;
        pthread_create(&t[r], NULL, overlap_rank, &o[r]);
    }
    *gemm_s = *comm_s = 0;
    for (int r = 0; r < G.n; r++) {
        pthread_join(t[r], NULL);
        if (o[r].gemm_ms * 1e-3 > *gemm_s) *gemm_s = o[r].gemm_ms * 1e-3;
        if (o[r].comm_ms * 1e-3 > *comm_s) *comm_s = o[r].comm_ms * 1e-3;
    }
}

/* GEMM slowdown and comm slowdown of one strategy and op at `bytes`. */
static void overlap(int strat, qt_comm *c, int op, size_t bytes) {
    double p10, p90, tc = run_point(strat, c, op, bytes, &p10, &p90), tg, dummy;
    const int ngemm = 30;
    run_overlap_pair(strat, c, op, bytes, ngemm, 0, 0, &tg, &dummy);
    int reps = (int)(tg / tc + 0.5);
    if (reps < 3) reps = 3;
    if (reps > 400) reps = 400;
    double tg2, tc2;
    run_overlap_pair(strat, c, op, bytes, ngemm, reps, 1, &tg2, &tc2);
    /* comm time with GEMMs: the comm stream ends after the GEMMs are queued; use its own span. */
    emit(strat, op, bytes, tc, p10, p90, 100 * (tg2 / tg - 1), 100 * (tc2 / (reps * tc) - 1));
}

/* ---- the sweep ---- */
static double g_res[NSTRAT][NOPS][16];
static double g_lat[NSTRAT][NALLOPS]; /* median us of the latency ops and of the smallest size; 0 = not run */
static size_t g_sizes[16];
static int g_nsizes;

static void sweep(int strat, qt_comm *c, int do_overlap) {
    for (int op = 0; op < NOPS; op++)
        for (int si = 0; (G.ops >> op & 1) && si < g_nsizes; si++) {
            double p10, p90, t = run_point(strat, c, op, g_sizes[si], &p10, &p90);
            g_res[strat][op][si] = g_sizes[si] / t / 1e9 * bus_factor(op);
            if (si == 0) g_lat[strat][op] = t * 1e6;
            emit(strat, op, g_sizes[si], t, p10, p90, -1e9, 0);
        }
    for (int op = NOPS; op < NALLOPS; op++) {
        if (!(G.ops >> op & 1) || (strat == S_NCCL && op == OP_BAR)) continue; /* NCCL has no barrier */
        double p10, p90, t = run_point(strat, c, op, op == OP_SCAL ? NSCAL * 4 : 0, &p10, &p90);
        g_lat[strat][op] = t * 1e6;
        emit(strat, op, op == OP_SCAL ? NSCAL * 4 : 0, t, p10, p90, -1e9, 0);
    }
    if (do_overlap) {
        size_t ob = G.max_bytes < ((size_t)256 << 20) ? G.max_bytes : (size_t)256 << 20;
        if (G.ops >> OP_AG & 1) overlap(strat, c, OP_AG, ob);
        if (G.ops >> OP_RS & 1) overlap(strat, c, OP_RS, ob);
    }
}

static void md_table(const int *strats, int ns) {
    if (!G.md) return;
    for (int op = 0; op < NOPS; op++) {
        if (!(G.ops >> op & 1)) continue;
        fprintf(G.md, "\n**%s**, bf16, busbw GB/s (%% of ceiling)\n\n| size |", op_names[op]);
        for (int k = 0; k < ns; k++) fprintf(G.md, " %s |", row_name(strats[k]));
        fprintf(G.md, "\n| --- |");
        for (int k = 0; k < ns; k++) fprintf(G.md, " --- |");
        fprintf(G.md, "\n");
        for (int si = 0; si < g_nsizes; si++) {
            size_t b = g_sizes[si];
            if (b >= (1u << 20)) fprintf(G.md, "| %zu MiB |", b >> 20);
            else fprintf(G.md, "| %zu KiB |", b >> 10);
            for (int k = 0; k < ns; k++) {
                double bus = g_res[strats[k]][op][si], ce = ceiling_of(strats[k], op);
                if (ce > 0) fprintf(G.md, " %.1f (%.0f%%) |", bus, 100 * bus / ce);
                else fprintf(G.md, " %.1f |", bus);
            }
            fprintf(G.md, "\n");
        }
    }
    /* Latency: the smallest size of each bandwidth op and the two latency ops, one row per strategy. */
    int cols[NALLOPS], nc = 0;
    for (int op = 0; op < NALLOPS; op++)
        if (G.ops >> op & 1) cols[nc++] = op;
    fprintf(G.md, "\n**latency**, median us per op (%zu KiB for the bandwidth ops, %d fp32 for the scalars)\n\n"
                  "| strategy |", g_sizes[0] >> 10, NSCAL);
    for (int k = 0; k < nc; k++) fprintf(G.md, " %s |", op_names[cols[k]]);
    fprintf(G.md, "\n| --- |");
    for (int k = 0; k < nc; k++) fprintf(G.md, " --- |");
    for (int k = 0; k < ns; k++) {
        fprintf(G.md, "\n| %s |", row_name(strats[k]));
        for (int q = 0; q < nc; q++) {
            double us = g_lat[strats[k]][cols[q]];
            if (us > 0) fprintf(G.md, " %.1f |", us);
            else fprintf(G.md, " - |");
        }
    }
    fprintf(G.md, "\n");
}

/* ---- host traffic bound: the floor an all-gather through host cannot beat on this machine ----
 * Each GPU's link carries its own shard up while the others' come down, so the host's bidirectional
 * rate, not the pipeline, limits the host all-gather. These are exactly its copies with no cross-rank
 * dependencies (H2D copies read regions while their owners write them: bytes matter, not values). */

/* Rank r's copies: D2H of its shard into its region of h on G.s[r], H2D of every other region into
 * its dst on G.gs[r]; ch = 0: one copy each, else ch-byte copies. */
static void bound_copies(int r, char *h, size_t count, size_t ch) {
    for (int step = 0; step < G.n; step++) {
        int j = (r + step) % G.n;
        size_t off, len;
        qt_comm_shard(count, G.n, j, &off, &len);
        size_t o = off * 2, b = len * 2, cb = ch ? ch : b;
        for (size_t k = 0; k < b; k += cb) {
            size_t l = b - k < cb ? b - k : cb;
            if (step == 0) QT_CUDA(cudaMemcpyAsync(h + o + k, G.b[r] + k, l, cudaMemcpyDeviceToHost, G.s[r]));
            else QT_CUDA(cudaMemcpyAsync(G.a[r] + o + k, h + o + k, l, cudaMemcpyHostToDevice, G.gs[r]));
        }
    }
}

/* Holds rank 0's stream until every rank's copies are queued, so the enqueue's skew is not timed. */
static void bound_gate(void *p) {
    while (!atomic_load((atomic_int *)p)) {}
}

/* One run on every rank at once; ms from rank 0's start event to the last stream's end. */
static float bound_run(char *h, size_t count, size_t ch) {
    atomic_int go = 0;
    cudaEvent_t t0 = G.e0[0][0], t1 = G.e1[0][0];
    QT_CUDA(cudaSetDevice(G.devices[0]));
    QT_CUDA(cudaLaunchHostFunc(G.s[0], bound_gate, &go));
    QT_CUDA(cudaEventRecord(t0, G.s[0]));
    for (int r = 0; r < G.n; r++) {
        QT_CUDA(cudaSetDevice(G.devices[r]));
        if (r) QT_CUDA(cudaStreamWaitEvent(G.s[r], t0, 0));
        QT_CUDA(cudaStreamWaitEvent(G.gs[r], t0, 0));
        bound_copies(r, h, count, ch);
        QT_CUDA(cudaEventRecord(G.e0[r][1], G.s[r]));
        QT_CUDA(cudaEventRecord(G.e0[r][2], G.gs[r]));
    }
    QT_CUDA(cudaSetDevice(G.devices[0]));
    for (int r = 0; r < G.n; r++) {
        QT_CUDA(cudaStreamWaitEvent(G.s[0], G.e0[r][1], 0));
        QT_CUDA(cudaStreamWaitEvent(G.s[0], G.e0[r][2], 0));
    }
    QT_CUDA(cudaEventRecord(t1, G.s[0]));
    atomic_store(&go, 1);
    for (int r = 0; r < G.n; r++) {
        QT_CUDA(cudaSetDevice(G.devices[r]));
        QT_CUDA(cudaDeviceSynchronize());
    }
    float ms;
    QT_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    return ms;
}

/* Prints single-copy and chunked bounds for the sweep's sizes (16 MiB..cap, x4); the chunk is the
 * comm's auto choice (chunk_elems in comm/comm.c) for this size and rank count. */
static void host_bound(size_t cap) {
    if (cap < (16u << 20)) return;
    char *h;
    QT_CUDA(cudaHostAlloc((void **)&h, cap, cudaHostAllocPortable));
    for (size_t b = 16u << 20; b <= cap; b *= 4) {
        size_t piece = (b / 2 + G.n - 1) / G.n * 2;
        size_t ch = (size_t)sqrt((double)piece * 300e3) / 65536 * 65536;
        ch = ch < (256u << 10) ? 256u << 10 : ch > (4u << 20) ? 4u << 20 : ch;
        for (int k = 0; k < 2; k++) {
            float ms[MAXIT];
            for (int it = 0; it < G.warmup + G.iters; it++) {
                float t = bound_run(h, b / 2, k ? ch : 0);
                if (it >= G.warmup) ms[it - G.warmup] = t;
            }
            qsort(ms, (size_t)G.iters, sizeof ms[0], cmpf);
            double t = ms[G.iters / 2] * 1e-3, bus = b / t / 1e9 * (G.n - 1) / G.n;
            char lab[32];
            if (k) snprintf(lab, sizeof lab, "chunked %zu KiB:", ch >> 10);
            else snprintf(lab, sizeof lab, "single copies:");
            printf("host-bound %3zu MiB  %-17s %8.1f us busbw %5.1f GB/s (%.0f%% of H2D)\n", b >> 20, lab, t * 1e6,
                   bus, 100 * bus / G.probe.h2d_all);
            fflush(stdout);
        }
    }
    QT_CUDA(cudaFreeHost(h));
}

int main(int argc, char **argv) {
    struct timespec ts0;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    int ndev = 0, nccl_only = 0, no_nccl = 0, no_overlap = 0, want_n = 0, host_sweep = 0, oneshot_sweep = 0;
    const char *tsv = NULL, *md = NULL;
    G.iters = 20;
    G.warmup = 3;
    G.ops = (1u << NALLOPS) - 1;
    G.max_bytes = (size_t)1 << 30;
    G.label = "";
    G.nccl_tag = "";
    size_t used = 0;
    for (int i = 0; i < argc; i++) used += (size_t)snprintf(G.cmd + used, used < sizeof G.cmd ? sizeof G.cmd - used : 0, "%s%s", i ? " " : "", argv[i]);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tsv") && v) tsv = argv[++i];
        else if (!strcmp(a, "--md") && v) md = argv[++i];
        else if (!strcmp(a, "--ranks") && v) want_n = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && v) G.iters = atoi(argv[++i]);
        else if (!strcmp(a, "--max-mib") && v) G.max_bytes = (size_t)atol(argv[++i]) << 20;
        else if (!strcmp(a, "--label") && v) G.label = argv[++i];
        else if (!strcmp(a, "--ops") && v) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            G.ops = 0;
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                int op = 0;
                while (op < NALLOPS && strcmp(t, op_names[op])) op++;
                QT_CHECK(op < NALLOPS, "--ops: unknown op '%s', expected all_gather, reduce_scatter, all_reduce, "
                                       "broadcast, all_reduce_scalars or barrier", t);
                G.ops |= 1u << op;
            }
        }
        else if (!strcmp(a, "--nccl-only")) nccl_only = 1;
        else if (!strcmp(a, "--no-nccl")) no_nccl = 1;
        else if (!strcmp(a, "--no-overlap")) no_overlap = 1;
        else if (!strcmp(a, "--host-sweep")) host_sweep = 1;
        else if (!strcmp(a, "--oneshot-sweep")) oneshot_sweep = 1;
        else if (!strcmp(a, "--nccl-p2p-disable")) { setenv("NCCL_P2P_DISABLE", "1", 1); G.nccl_tag = "_p2p_off"; }
        else {
            fprintf(stderr, "usage: %s [--ranks N] [--iters K>=20] [--max-mib M] [--label L] [--tsv F] [--md F]\n"
                            "          [--ops a,b,..] [--nccl-only] [--no-nccl] [--no-overlap] [--nccl-p2p-disable]\n"
                            "          [--host-sweep] [--oneshot-sweep]\n", argv[0]);
            return 2;
        }
    }
    if (G.iters < 20) G.iters = 20;
    if (G.iters > MAXIT) G.iters = MAXIT;
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* never NVLink multicast */
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("comm_bench: no CUDA device, nothing to measure\n");
        return 0;
    }
    G.n = want_n ? want_n : ndev < 2 ? 2 : ndev > QT_COMM_MAX_RANKS ? QT_COMM_MAX_RANKS : ndev;
    G.shared_dev = G.n > ndev;
    for (int r = 0; r < G.n; r++) G.devices[r] = G.shared_dev ? r % ndev : r;
    if (tsv) {
        FILE *chk = fopen(tsv, "r");
        int fresh = chk == NULL;
        if (chk) fclose(chk);
        G.tsv = fopen(tsv, "a");
        QT_CHECK(G.tsv != NULL, "cannot open %s", tsv);
        if (fresh)
            fprintf(G.tsv, "label\tranks\tdevices\tstrategy\top\tbytes\tus_median\tus_p10\tus_p90\talgbw_GBs\t"
                           "busbw_GBs\tceiling_GBs\tpct_ceiling\tgemm_slowdown_pct\tcomm_slowdown_pct\n");
    }
    if (md) {
        G.md = fopen(md, "a");
        QT_CHECK(G.md != NULL, "cannot open %s", md);
    }
    int nu = ndev < G.n ? ndev : G.n, udev[QT_COMM_MAX_RANKS];
    for (int i = 0; i < nu; i++) udev[i] = i;
    QT_CHECK(qt_comm_probe(nu, udev, &G.probe) == 0, "probe failed");
    qt_comm_probe_print(&G.probe, stdout, 0);
    printf("comm_bench: %d ranks on %d GPU(s)%s, sizes 4 KiB..%zu MiB, bf16, median of %d after %d warm-up\n", G.n,
           nu, G.shared_dev ? " (several ranks per GPU)" : "", G.max_bytes >> 20, G.iters, G.warmup);

    for (size_t b = 4096; b <= G.max_bytes && g_nsizes < 16; b *= 4) g_sizes[g_nsizes++] = b;
    size_t maxb = g_sizes[g_nsizes - 1];
    for (int r = 0; r < G.n; r++) {
        QT_CUDA(cudaSetDevice(G.devices[r]));
        QT_CUDA(cudaStreamCreateWithFlags(&G.s[r], cudaStreamNonBlocking));
        QT_CUDA(cudaStreamCreateWithFlags(&G.gs[r], cudaStreamNonBlocking));
        for (int it = 0; it < MAXIT; it++) {
            QT_CUDA(cudaEventCreate(&G.e0[r][it]));
            QT_CUDA(cudaEventCreate(&G.e1[r][it]));
        }
        QT_CUDA(cudaMalloc((void **)&G.a[r], maxb));
        QT_CUDA(cudaMalloc((void **)&G.b[r], maxb));
        QT_CUDA(cudaMalloc((void **)&G.one[r], NSCAL * sizeof(float)));
        QT_CUDA(cudaMemset(G.a[r], 0x3c, maxb));
        QT_CUDA(cudaMemset(G.b[r], 0x3c, maxb));
        QT_CUDA(cudaMemset(G.one[r], 0, NSCAL * sizeof(float)));
        if (!no_overlap) gemm_init(r);
    }
    for (int r = 0; r < G.n; r++) {
        QT_CUDA(cudaSetDevice(G.devices[r]));
        QT_CUDA(cudaDeviceSynchronize());
    }
    if (G.md) {
        fprintf(G.md, "\n### comm: %d ranks on %d x %s%s\n\n`%s` (NCCL_NVLS_ENABLE=0%s)\n\n", G.n, nu, G.probe.name,
                G.shared_dev ? " (several ranks per GPU)" : "", G.cmd,
                getenv("NCCL_P2P_DISABLE") ? ", NCCL_P2P_DISABLE=1" : "");
        if (G.label[0]) fprintf(G.md, "Label: %s\n\n", G.label);
        if (!nccl_only) qt_comm_probe_print(&G.probe, G.md, 1);
        fprintf(G.md, "busbw = bytes one GPU moves one way per second (nccl-tests). %% of ceiling = busbw over the "
                      "one-way rate of the link used: peer rows, the slowest pair one way; host rows (and NCCL with "
                      "P2P off), per-GPU H2D with all GPUs at once for all_gather, all_reduce and broadcast, min(H2D, D2H) "
                      "for reduce_scatter. peer_load = peer with the reduce-scatter reading peers' shards through "
                      "peer pointers, and the all-reduce in one kernel that also stores each reduced shard into every rank's "
                      "dst (its all_gather and broadcast are peer's).\n");
    }
    if (host_sweep) { /* the host chunk size: what chunk_elems' cost model is fitted to (--ops: which ops) */
        const size_t chunks[] = {0, 512u << 10, 1u << 20, 2u << 20, 3u << 20, 4u << 20, 6u << 20, 8u << 20};
        for (int ci = 0; ci < 8; ci++) {
            qt_comm_opts o = {0};
            o.chunk_bytes = chunks[ci];
            o.timeout_s = 300;
            qt_comm *c = qt_comm_create(G.n, G.devices, QT_COMM_HOST, (size_t)G.n * (256u << 20), &o);
            for (int op = OP_AG; op <= OP_RS; op++) {
                if (!(G.ops >> op & 1)) continue;
                double ceil = ceiling_of(S_HOST, op);
                for (size_t b = 16u << 20; b <= G.max_bytes && b <= (256u << 20); b *= 4) {
                    double p10, p90, t = run_point(S_HOST, c, op, b, &p10, &p90);
                    double bus = b / t / 1e9 * (G.n - 1) / G.n;
                    printf("host-sweep %s chunk %4zu KiB (0 = auto) %4zu MiB: %8.1f us (host enqueue %6.1f us) busbw "
                           "%5.1f GB/s = %.0f%% of %.1f\n", op_names[op], chunks[ci] >> 10, b >> 20, t * 1e6,
                           G.enqueue_us[0], bus, 100 * bus / ceil, ceil);
                    fflush(stdout);
                }
            }
            qt_comm_free(c);
        }
        host_bound(G.max_bytes < (256u << 20) ? G.max_bytes : 256u << 20);
        return 0;
    }
    if (oneshot_sweep) { /* where one kernel per rank beats the copy-engine schedules (QT_COMM_ONESHOT_*_MAX) */
        for (int st = S_LOAD; st <= S_HOST; st += S_HOST - S_LOAD) {
            qt_comm *c[2];
            for (int v = 0; v < 2; v++) {
                qt_comm_opts o = {0};
                o.peer_rs = QT_COMM_RS_LOAD;
                o.timeout_s = 300;
                o.no_oneshot = !v;
                o.oneshot_max = (size_t)1 << 40;
                c[v] = qt_comm_create(G.n, G.devices, st == S_HOST ? QT_COMM_HOST : QT_COMM_PEER, (size_t)G.n * (256u << 20), &o);
            }
            for (int op = 0; op < NALLOPS; op++) {
                if (!(G.ops >> op & 1)) continue;
                for (int si = 0; si < g_nsizes; si++) {
                    size_t b = g_sizes[si];
                    if (op >= NOPS && si) break;
                    double p10, p90, t[2];
                    for (int v = 0; v < 2; v++) t[v] = run_point(st, c[v], op, op >= NOPS ? 0 : b, &p10, &p90);
                    printf("oneshot-sweep %-9s %-18s %9zu B: copy engines %8.1f us, one kernel %8.1f us (%.2fx)\n",
                           strat_names[st], op_names[op], op >= NOPS ? (size_t)0 : b, t[0] * 1e6, t[1] * 1e6, t[0] / t[1]);
                    fflush(stdout);
                }
            }
            for (int v = 0; v < 2; v++) qt_comm_free(c[v]);
        }
        return 0;
    }
    int shown[NSTRAT], ns = 0;
    if (!nccl_only) {
        for (int st = S_PEER; st <= S_HOST_WC; st++) {
            qt_comm_opts o = {0};
            o.ring = st == S_RING;
            o.peer_rs = st == S_LOAD ? QT_COMM_RS_LOAD : QT_COMM_RS_COPY;
            o.timeout_s = 300;
            qt_comm_kind k = st <= S_LOAD ? QT_COMM_PEER : st == S_HOST ? QT_COMM_HOST : QT_COMM_HOST_WC;
            qt_comm *c = qt_comm_create(G.n, G.devices, k, (size_t)G.n * (256u << 20), &o);
            sweep(st, c, !no_overlap);
            qt_comm_free(c);
            shown[ns++] = st;
        }
    }
    if (!no_nccl) {
        char why[256] = "";
        if (G.shared_dev) snprintf(why, sizeof why, "NCCL needs one GPU per rank");
        else if (!nccl_load(why, sizeof why)) {
            int rc = g_nccl.init_all(g_nccl.comms, G.n, G.devices);
            if (rc) snprintf(why, sizeof why, "ncclCommInitAll returned %d", rc);
        }
        if (why[0]) {
            printf("NCCL reference skipped: %s\n", why);
            if (G.md) fprintf(G.md, "\nNCCL reference skipped: %s\n", why);
        } else {
            printf("NCCL %d loaded (NCCL_NVLS_ENABLE=0%s)\n", g_nccl.version, getenv("NCCL_P2P_DISABLE") ? ", NCCL_P2P_DISABLE=1" : "");
            if (G.md) fprintf(G.md, "\nNCCL %d via dlopen.\n", g_nccl.version);
            sweep(S_NCCL, NULL, !no_overlap);
            shown[ns++] = S_NCCL;
            for (int r = 0; r < G.n; r++) g_nccl.destroy(g_nccl.comms[r]);
        }
    }
    md_table(shown, ns);
    struct timespec ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    double secs = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (ts1.tv_nsec - ts0.tv_nsec);
    if (G.md) fprintf(G.md, "\nTotal bench time %.1f s.\n", secs);
    printf("comm_bench: total %.1f s\n", secs);
    for (int r = 0; r < G.n; r++) {
        if (!no_overlap) gemm_free(r);
        QT_CUDA(cudaSetDevice(G.devices[r]));
        QT_CUDA(cudaFree(G.a[r]));
        QT_CUDA(cudaFree(G.b[r]));
    }
    if (G.tsv) fclose(G.tsv);
    if (G.md) fclose(G.md);
    return 0;
}
