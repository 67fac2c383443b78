/* kernels_bench.c — micro-benchmark of the qt_kernels.h kernels at the Qwen2.5-0.5B shapes.
 *
 * N=16384 tokens, C=896, F=4864, V=151936 (loss over chunks of 1024 rows and of N rows, a micro-step's
 * logits as the LM head makes them in one chunk), H=14, Hkv=2, D=64,
 * 494M parameters for AdamW / norm / casts. Each kernel: 3 warm-up runs, then 20 runs timed one by one
 * with CUDA events; prints the median time, the bytes each run must move at least (the HBM traffic the
 * kernel cannot avoid), GB/s and the fraction of the 3.0 TB/s HBM copy ceiling measured on the H100
 * (shared/notes/anchors-measured.md). Prints "SKIP" and exits 0 without a GPU.
 * Usage: kernels_bench [filter]   (runs the kernels whose name contains filter) */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_kernels.h"

#define N 16384L
#define C 896
#define F 4864
#define V 151936
#define CHUNK 1024L
#define H 14
#define HKV 2
#define D 64
#define NPARAM 494032768L
#define RUNS 20
#define CEIL_GBS 3000.0

typedef struct {
    void *res, *x, *y, *w, *dy, *dx, *gu, *dgu, *fout, *qkv, *logits, *wte, *wb, *m, *v;
    float *rstd, *dwte, *db, *cs, *loss, *master, *g, *scal, *absmax;
    int32_t *tok, *tgt;
    void *ws_emb, *ws_col, *ws_norm;
    qt_adamw_plan *plan;
    int n_tensors;
    long loss_rows; /* the lmhead loss's chunk */
} bufs;

static void *dalloc(size_t bytes) {
    void *p;
    QT_CUDA(cudaMalloc(&p, bytes));
    QT_CUDA(cudaMemset(p, 0, bytes));
    return p;
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef void (*bench_fn)(bufs *b);

static void run(const char *filter, const char *name, const char *shape, double bytes, bench_fn fn, bufs *b) {
    if (filter && !strstr(name, filter)) return;
    cudaEvent_t e0[RUNS], e1[RUNS];
    for (int i = 0; i < 3; i++) fn(b);
    for (int i = 0; i < RUNS; i++) {
        QT_CUDA(cudaEventCreate(&e0[i]));
        QT_CUDA(cudaEventCreate(&e1[i]));
        QT_CUDA(cudaEventRecord(e0[i], 0));
        fn(b);
        QT_CUDA(cudaEventRecord(e1[i], 0));
    }
    QT_CUDA(cudaDeviceSynchronize());
    float ms[RUNS];
    for (int i = 0; i < RUNS; i++) {
        QT_CUDA(cudaEventElapsedTime(&ms[i], e0[i], e1[i]));
        QT_CUDA(cudaEventDestroy(e0[i]));
        QT_CUDA(cudaEventDestroy(e1[i]));
    }
    qsort(ms, RUNS, sizeof ms[0], cmpf);
    double med = 0.5 * (ms[RUNS / 2 - 1] + ms[RUNS / 2]), gbs = bytes / (med * 1e-3) / 1e9;
    printf("%-20s %-28s %10.1f %10.1f %9.1f %6.1f%%\n", name, shape, med * 1e3, bytes / 1e6, gbs,
           100.0 * gbs / CEIL_GBS);
}

static void k_emb_fwd(bufs *b) { qt_embedding_fwd(b->y, b->tok, b->wte, N, C, V, 0); }
static void k_emb_bwd(bufs *b) { qt_embedding_bwd(b->dwte, QT_DT_F32, b->dy, QT_DT_BF16, b->tok, N, C, V, b->ws_emb, 0); }
static void k_rms_fwd(bufs *b) { qt_rmsnorm_fwd(b->y, b->rstd, b->res, b->x, b->w, N, C, 1e-6f, NULL, 0); }
static void k_rms_bwd(bufs *b) {
    qt_rmsnorm_bwd(b->dx, QT_DT_BF16, NULL, NULL, b->db, QT_DT_F32, b->dy, b->res, b->w, b->rstd, N, C, b->ws_col, 0);
}
static void k_rope_fwd(bufs *b) { qt_rope_fwd(b->qkv, b->cs, (int)(N / 1024), 1024, H, HKV, D, 0); }
static void k_swiglu_fwd(bufs *b) { qt_swiglu_fwd(b->fout, b->gu, N, F, NULL, 0); }
static void k_swiglu_bwd(bufs *b) { qt_swiglu_bwd(b->dgu, b->fout, b->gu, N, F, NULL, 0); }
/* the fp8 path's variants: fused abs-max (into absmax[0]; it only grows, which is all the kernels need) */
static void k_rms_fwd_amax(bufs *b) { qt_rmsnorm_fwd(b->y, b->rstd, b->res, b->x, b->w, N, C, 1e-6f, b->absmax, 0); }
static void k_rms_bwd_amax(bufs *b) { /* as the model: fp32 dx (in dgu, large enough), bf16 copy + abs-max */
    qt_rmsnorm_bwd(b->dgu, QT_DT_F32, b->dx, b->absmax, b->db, QT_DT_F32, b->dy, b->res, b->w, b->rstd, N, C, b->ws_col, 0);
}
static void k_rope_bwd_amax(bufs *b) { qt_rope_bwd(b->qkv, b->cs, (int)(N / 1024), 1024, H, HKV, D, b->absmax, 0); }
static void k_swiglu_fwd_amax(bufs *b) { qt_swiglu_fwd(b->fout, b->gu, N, F, b->absmax, 0); }
static void k_swiglu_bwd_amax(bufs *b) { qt_swiglu_bwd(b->dgu, b->fout, b->gu, N, F, b->absmax, 0); }
static void k_bias_bwd(bufs *b) { qt_bias_bwd(b->db, QT_DT_F32, b->qkv, N, (H + 2 * HKV) * D, b->ws_col, 0); }
static void loss_with(bufs *b, qt_lmhead_impl impl) {
    qt_lmhead_impl ran = qt_lmhead_loss_with(impl, b->logits, b->loss, NULL, b->tgt, b->loss_rows, V, 1.0f / N, 0);
    QT_CHECK(ran == impl, "lmhead loss: implementation %d is not available on this GPU", impl);
}
static void k_loss_2pass(bufs *b) { loss_with(b, QT_LMHEAD_TWO_PASS); }
static void k_loss_cluster(bufs *b) { loss_with(b, QT_LMHEAD_CLUSTER); }
static void k_loss_pipe(bufs *b) { loss_with(b, QT_LMHEAD_CLUSTER_PIPE); }
static void k_adamw(bufs *b) {
    qt_adamw_args a = {1e-4f, 0.9f, 0.95f, 1e-8f, 10, 1, 0, 0, 0, NULL};
    qt_adamw_step(b->plan, b->wb, b->master, b->g, QT_DT_F32, b->m, QT_DT_F32, b->v, QT_DT_F32, b->scal, b->absmax, &a, 0);
}
static void k_norm(bufs *b) { qt_grad_norm(b->scal + 1, b->scal, b->g, QT_DT_F32, NPARAM, 1.0f, b->ws_norm, 0); }
static void k_cast(bufs *b) { qt_cast_f32_to_bf16(b->wb, b->master, NPARAM, 0); }
/* the per-step finiteness check of the updated weights (engine_gpu.c), beside the AdamW it follows */

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP kernels_bench: no CUDA device\n");
        return 0;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("kernels_bench on %s; median of %d runs; GB/s vs the %.1f TB/s HBM copy ceiling\n", prop.name, RUNS,
           CEIL_GBS / 1e3);
    printf("%-20s %-28s %10s %10s %9s %7s\n", "kernel", "shape", "us", "MB moved", "GB/s", "of ceil");
    bufs b;
    memset(&b, 0, sizeof b);
    size_t nc = (size_t)N * C, nf = (size_t)N * F, nq = (size_t)N * (H + 2 * HKV) * D;
    b.res = dalloc(nc * 2); b.x = dalloc(nc * 2); b.y = dalloc(nc * 2); b.dy = dalloc(nc * 2);
    b.dx = dalloc(nc * 2); b.w = dalloc(C * 2); b.rstd = dalloc(N * 4); b.db = dalloc(4096 * 4);
    b.gu = dalloc(nf * 4); b.dgu = dalloc(nf * 4); b.fout = dalloc(nf * 2); b.qkv = dalloc(nq * 2);
    b.cs = dalloc((size_t)1024 * D * 4); b.wte = dalloc((size_t)V * C * 2); b.dwte = dalloc((size_t)V * C * 4);
    b.logits = dalloc((size_t)N * V * 2); b.loss = dalloc(N * 4);
    b.ws_emb = dalloc(qt_embedding_bwd_ws_bytes(N, V)); b.ws_col = dalloc(qt_colreduce_ws_bytes(4096));
    b.ws_norm = dalloc(qt_grad_norm_ws_bytes());
    qt_fill(b.x, QT_DT_BF16, 0.01f, nc, 0);
    qt_fill(b.w, QT_DT_BF16, 1.0f, C, 0);
    qt_fill(b.res, QT_DT_BF16, 0.5f, nc, 0);
    qt_fill(b.logits, QT_DT_BF16, 0.1f, (size_t)N * V, 0);
    double inv_freq[QT_ROPE_MAX_HALF];
    for (int i = 0; i < D / 2; i++) inv_freq[i] = pow(1e6, -2.0 * i / D);
    qt_rope_table(b.cs, 1024, D, inv_freq, 1.0, 0);
    int32_t *tok = malloc(N * 4);
    uint64_t s = 88172645463325252ull;
    for (long i = 0; i < N; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        tok[i] = (int32_t)(s % V);
    }
    b.tok = dalloc(N * 4);
    b.tgt = dalloc(N * 4);
    QT_CUDA(cudaMemcpy(b.tok, tok, N * 4, cudaMemcpyHostToDevice));
    QT_CUDA(cudaMemcpy(b.tgt, tok, N * 4, cudaMemcpyHostToDevice));
    free(tok);
    /* optimizer state for the whole model: 4 fp32 arrays + bf16 weights (~8.9 GB) */
    b.master = dalloc(NPARAM * 4); b.g = dalloc(NPARAM * 4); b.m = dalloc(NPARAM * 4); b.v = dalloc(NPARAM * 4);
    b.wb = dalloc(NPARAM * 2); b.scal = dalloc(16); b.absmax = dalloc(512 * 4);
    qt_fill(b.scal, QT_DT_F32, 1.0f, 1, 0);
    b.n_tensors = 290;
    qt_adamw_tensor *t = malloc(sizeof *t * (size_t)b.n_tensors);
    for (int k = 0; k < b.n_tensors; k++) {
        size_t per = NPARAM / b.n_tensors;
        t[k].offset = (size_t)k * per;
        t[k].numel = k == b.n_tensors - 1 ? NPARAM - t[k].offset : per;
        t[k].wd = k % 2 ? 0.1f : 0.0f;
        t[k].state = t[k].offset;
        t[k].sr_shift = 0;
    }
    b.plan = qt_adamw_plan_create(t, b.n_tensors);
    free(t);
    QT_CUDA(cudaDeviceSynchronize());

    char shp[64];
    snprintf(shp, sizeof shp, "N=%ld C=%d", N, C);
    run(filter, "embedding_fwd", shp, 2.0 * nc * 2, k_emb_fwd, &b);
    run(filter, "embedding_bwd", shp, nc * 2 + (double)N * C * 8, k_emb_bwd, &b);
    run(filter, "rmsnorm_fwd+res", shp, 4.0 * nc * 2, k_rms_fwd, &b);
    run(filter, "rmsnorm_bwd", shp, 4.0 * nc * 2, k_rms_bwd, &b);
    run(filter, "rmsnorm_fwd+res+amax", shp, 4.0 * nc * 2, k_rms_fwd_amax, &b);
    run(filter, "rmsnorm_bwd_f32+bf16+amax", shp, 3.0 * nc * 2 + 2.0 * nc * 4, k_rms_bwd_amax, &b);
    snprintf(shp, sizeof shp, "N=%ld H=%d Hkv=%d D=%d", N, H, HKV, D);
    run(filter, "rope_fwd", shp, 2.0 * N * (H + HKV) * D * 2, k_rope_fwd, &b);
    run(filter, "rope_bwd+amax", shp, (2.0 * (H + HKV) + HKV) * N * D * 2, k_rope_bwd_amax, &b);
    snprintf(shp, sizeof shp, "N=%ld F=%d", N, F);
    run(filter, "swiglu_fwd", shp, 3.0 * nf * 2, k_swiglu_fwd, &b);
    run(filter, "swiglu_bwd", shp, 5.0 * nf * 2, k_swiglu_bwd, &b);
    run(filter, "swiglu_fwd+amax", shp, 3.0 * nf * 2, k_swiglu_fwd_amax, &b);
    run(filter, "swiglu_bwd+amax", shp, 5.0 * nf * 2, k_swiglu_bwd_amax, &b);
    snprintf(shp, sizeof shp, "N=%ld O=%d", N, (H + 2 * HKV) * D);
    run(filter, "bias_bwd", shp, (double)nq * 2, k_bias_bwd, &b);
    for (b.loss_rows = CHUNK; b.loss_rows <= N; b.loss_rows *= N / CHUNK) {
        double bytes = 2.0 * b.loss_rows * V * 2;
        snprintf(shp, sizeof shp, "n=%ld V=%d", b.loss_rows, V);
        run(filter, "lmhead_loss_2pass", shp, bytes, k_loss_2pass, &b);
        if (prop.major >= 9) run(filter, "lmhead_loss_cluster", shp, bytes, k_loss_cluster, &b);
        if (prop.major >= 9) run(filter, "lmhead_loss_pipe", shp, bytes, k_loss_pipe, &b);
    }
    snprintf(shp, sizeof shp, "%ld params", NPARAM);
    run(filter, "adamw_fp32_mv", shp, 30.0 * NPARAM, k_adamw, &b);
    run(filter, "grad_norm", shp, 4.0 * NPARAM, k_norm, &b);
    run(filter, "cast_f32_bf16", shp, 6.0 * NPARAM, k_cast, &b);
    printf("lmhead_loss counts one read and one write of the chunk (2pass reads it twice, the second\n"
           "  time partly from L2; cluster and pipe, sm_90+, read it once);\n"
           "rmsnorm_bwd counts dy, res, dx read + dx write (dw is summed in the same pass).\n");
    qt_adamw_plan_free(b.plan);
    return 0;
}
