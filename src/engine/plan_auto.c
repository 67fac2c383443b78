/* plan_auto.c — memory.plan: auto: the fastest memory plan that fits (qt_plan_auto.h, docs/memory.md). */
#include "qt_plan_auto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime.h>

#include "qt_comm.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_matmul.h"
#include "qt_planner.h"

/* ---- the probe ---- */

qt_probe qt_probe_default(void) {
    /* H100 SXM: large-GEMM rates as gemm_bench measures them (bf16 ~ 660 TFLOP/s, e4m3 QT_PROBE_FP8_RATIO x), HBM3
     * copy bandwidth, a PCIe Gen5 x16 pinned copy; 80 GB. */
    return (qt_probe){"default (H100 SXM figures)", 660e12, QT_PROBE_FP8_RATIO * 660e12, 2.6e12, 50e9, (size_t)80 << 30, 0};
}

static void cache_path(const char *cache_dir, const char *gpu, char *out, size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "%s", gpu);
    for (char *p = name; *p; p++)
        if (*p == ' ' || *p == '/') *p = '_';
    snprintf(out, cap, "%s/probe2-%s.txt", cache_dir, name); /* 2: matmuls on random data (1: zeros) */
}

/* Seconds of one n^3 bf16 GEMM on s, timed with events (the median of 5 after one warm-up). */
static double bench_bf16(qt_matmul_ctx *mm, void *y, void *x, void *w, int n, cudaStream_t s) {
    cudaEvent_t a, b;
    QT_CUDA(cudaEventCreate(&a));
    QT_CUDA(cudaEventCreate(&b));
    float ms[6];
    for (int i = 0; i < 6; i++) {
        QT_CUDA(cudaEventRecord(a, s));
        qt_matmul_fwd(mm, y, QT_DT_BF16, x, w, NULL, n, n, n, 0, s);
        QT_CUDA(cudaEventRecord(b, s));
        QT_CUDA(cudaEventSynchronize(b));
        QT_CUDA(cudaEventElapsedTime(&ms[i], a, b));
    }
    for (int i = 1; i < 6; i++) /* sort the 5 after warm-up */
        for (int j = i + 1; j < 6; j++)
            if (ms[j] < ms[i]) { float t = ms[i]; ms[i] = ms[j]; ms[j] = t; }
    QT_CUDA(cudaEventDestroy(a));
    QT_CUDA(cudaEventDestroy(b));
    return ms[3] * 1e-3;
}

static double copy_s(void *dst, const void *src, size_t bytes, cudaStream_t s) {
    cudaEvent_t a, b;
    float ms;
    QT_CUDA(cudaEventCreate(&a));
    QT_CUDA(cudaEventCreate(&b));
    QT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)); /* warm-up */
    QT_CUDA(cudaEventRecord(a, s));
    QT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    QT_CUDA(cudaEventRecord(b, s));
    QT_CUDA(cudaEventSynchronize(b));
    QT_CUDA(cudaEventElapsedTime(&ms, a, b));
    QT_CUDA(cudaEventDestroy(a));
    QT_CUDA(cudaEventDestroy(b));
    return ms * 1e-3;
}

/* The rates of the current GPU (allocates and frees ~0.6 GiB of device and 256 MiB of pinned memory). */
static qt_probe measure(const char *name) {
    qt_probe p = qt_probe_default();
    snprintf(p.gpu, sizeof p.gpu, "%s", name);
    size_t f, big = (size_t)256 << 20, sq = (size_t)4096 * 4096 * 2;
    QT_CUDA(cudaMemGetInfo(&f, &p.gpu_bytes));
    cudaStream_t s;
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *x, *w, *y, *h, *d1, *d2;
    QT_CUDA(cudaMalloc(&x, sq));
    QT_CUDA(cudaMalloc(&w, sq));
    QT_CUDA(cudaMalloc(&y, sq));
    QT_CUDA(cudaMalloc(&d1, big));
    QT_CUDA(cudaMalloc(&d2, big));
    QT_CUDA(cudaHostAlloc(&h, big, cudaHostAllocDefault));
    /* the matmul's operands random bf16 of magnitude [1, 2): zeros (as this probe had) let the tensor cores draw
     * less power and clock higher: an H200 probed 800 TFLOP/s on zeros where the training shapes reach
     * 660-720 (train_bench's ceilings, random data) */
    uint16_t *hb = h;
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sq / 2; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        hb[i] = (uint16_t)(0x3F80 | (r & 0x7F)) ^ (uint16_t)((r >> 8 & 1) << 15); /* +-[1, 2) */
    }
    QT_CUDA(cudaMemcpyAsync(x, h, sq, cudaMemcpyHostToDevice, s));
    QT_CUDA(cudaMemcpyAsync(w, h, sq, cudaMemcpyHostToDevice, s));
    QT_CUDA(cudaStreamSynchronize(s));
    QT_CUDA(cudaMemsetAsync(d1, 0, big, s));
    qt_matmul_ctx *mm = qt_matmul_create(0);
    qt_matmul_set_autotune(mm, 0);
    p.bf16_flops = 2.0 * 4096 * 4096 * 4096.0 / bench_bf16(mm, y, x, w, 4096, s);
    p.fp8_flops = QT_PROBE_FP8_RATIO * p.bf16_flops; /* not probed */
    qt_matmul_free(mm);
    double up = copy_s(d1, h, big, s), down = copy_s(h, d1, big, s);
    p.pcie_bps = big / (up > down ? up : down);      /* the slower direction */
    p.hbm_bps = 2.0 * big / copy_s(d2, d1, big, s);  /* a device copy reads and writes each byte */
    QT_CUDA(cudaFreeHost(h));
    cudaFree(d1), cudaFree(d2), cudaFree(x), cudaFree(w), cudaFree(y);
    QT_CUDA(cudaStreamDestroy(s));
    return p;
}

qt_probe qt_probe_get(const char *cache_dir, int may_measure) {
    if (qt_cuda_device_count() == 0 || !cache_dir) return qt_probe_default();
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDeviceProperties(&prop, 0));
    char path[4200];
    cache_path(cache_dir, prop.name, path, sizeof path);
    qt_probe p = qt_probe_default();
    snprintf(p.gpu, sizeof p.gpu, "%s", prop.name);
    FILE *f = fopen(path, "r");
    if (f) {
        int ok = fscanf(f, "%lf %lf %lf %lf %zu", &p.bf16_flops, &p.fp8_flops, &p.hbm_bps, &p.pcie_bps, &p.gpu_bytes) == 5;
        fclose(f);
        if (ok) return p;
    }
    if (!may_measure) return qt_probe_default();
    QT_CUDA(cudaSetDevice(0));
    p = measure(prop.name);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dir);
    *strrchr(parent, '/') = 0;
    mkdir(parent, 0755);
    mkdir(dir, 0755);
    if ((f = fopen(path, "w"))) { /* a cache that cannot be written only costs the next run a probe */
        fprintf(f, "%.6g %.6g %.6g %.6g %zu\n", p.bf16_flops, p.fp8_flops, p.hbm_bps, p.pcie_bps, p.gpu_bytes);
        fclose(f);
    }
    printf("qtrain: probed %s: bf16 %.0f TFLOP/s, PCIe %.1f GB/s, HBM %.0f GB/s (cached in %s)\n", p.gpu,
           p.bf16_flops * 1e-12, p.pcie_bps * 1e-9, p.hbm_bps * 1e-9, path);
    return p;
}

void qt_probe_free_memory(qt_probe *pr, const qt_config *cfg) {
    int ngpu = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count(), devs[QT_COMM_MAX_RANKS];
    char e[512];
    int n = ngpu > 0 ? qt_plan_rank_devices(cfg, ngpu, devs, e, sizeof e) : 0;
    pr->gpu_free = n > 0 ? qt_cuda_mem_free(devs, n) : 0;
}

size_t qt_plan_gpu_budget(const qt_config *cfg, const qt_probe *pr, char *what, size_t cap) {
    size_t lim = cfg->memory.gpu_limit_gib > 0 ? qt_mem_gib(cfg->memory.gpu_limit_gib) : 0, G = (size_t)1 << 30;
    size_t have = pr->gpu_free ? pr->gpu_free : pr->gpu_bytes, left = have > QT_PLAN_GPU_MARGIN ? have - QT_PLAN_GPU_MARGIN : 0;
    char src[128];
    if (pr->gpu_free)
        snprintf(src, sizeof src, "free on the GPU now (cudaMemGetInfo: %.2f GiB) less a %.0f GiB margin", (double)have / G,
                 (double)QT_PLAN_GPU_MARGIN / G);
    else
        snprintf(src, sizeof src, "the GPU's %.1f GiB (%s; no free memory measured) less a %.0f GiB margin", (double)have / G,
                 pr->gpu, (double)QT_PLAN_GPU_MARGIN / G);
    if (lim && (!pr->gpu_free || lim <= left)) {
        snprintf(what, cap, "memory.gpu_limit_gib = %g", cfg->memory.gpu_limit_gib);
        return lim;
    }
    snprintf(what, cap, "%s%s", src, lim ? ", below memory.gpu_limit_gib" : "");
    return left;
}

/* ---- the predicted step ---- */

qt_plan_cost qt_plan_auto_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    /* a LoRA run's frozen base: its own step */
    return cfg->lora.rank > 0 ? qt_plan_auto_lora_cost_parts(L, cfg, pr) : qt_plan_auto_full_cost_parts(L, cfg, pr);
}

double qt_plan_auto_cost(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    qt_plan_cost k = qt_plan_auto_cost_parts(L, cfg, pr);
    double hi = k.compute > k.pcie_micro ? k.compute : k.pcie_micro, lo = k.compute + k.pcie_micro - hi;
    return hi + QT_PLAN_OVERLAP_ALPHA * lo + k.once;
}

static int by_speed(const void *a, const void *b) {
    double x = ((const qt_plan_choice *)a)->tokens_per_s, y = ((const qt_plan_choice *)b)->tokens_per_s;
    if (x != y) return x < y ? 1 : -1;
    int i = ((const qt_plan_choice *)a)->order, j = ((const qt_plan_choice *)b)->order;
    return (i > j) - (i < j); /* a tie keeps the enumeration order: the plainer plan first */
}

int qt_plan_auto_enumerate(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *out, int cap,
                           int *n, qt_plan_choice *lossy_out, char *err, size_t errlen) {
    static qt_run_plan rp;
    *n = -1; /* until the candidates are made: a plan that cannot be made */
    if (qt_plan_run(L, cfg, -1, 1, &rp, err, errlen)) return -1;
    qt_plan_axes ax;
    qt_plan_axes_init(&ax, cfg, rp.ranks);
    char gwhat[160];
    size_t gpu_cap = qt_plan_gpu_budget(cfg, pr, gwhat, sizeof gwhat);
    char what[96];
    size_t host_cap = qt_plan_host_limit(cfg, what, sizeof what);
    static qt_config c;
    size_t smallest = (size_t)-1, smallest_host = (size_t)-1; /* the least host memory of a plan the GPU fits */
    int count = 0;
    do {
        if (qt_plan_axes_config(&ax, cfg, &c)) continue; /* a repeat, or a plan refused */
        if (qt_plan_run(L, &c, -1, 1, &rp, err, errlen)) return -1;
        *n = 0;
        if (rp.gpu_bytes < smallest) smallest = rp.gpu_bytes;
        if (rp.gpu_bytes <= gpu_cap && rp.host_bytes < smallest_host) smallest_host = rp.host_bytes;
        if (rp.gpu_bytes > gpu_cap || (host_cap && rp.host_bytes > host_cap)) continue;
        QT_CHECK(count < cap, "memory.plan: auto: more than %d plans fit (QT_PLAN_AUTO_MAX: the axes grew)", cap);
        if (!c.parallel.gpus && !c.parallel.devices.n) c.parallel.gpus = rp.ranks; /* the cost's rank count */
        double s = qt_plan_auto_cost(L, &c, pr);
        qt_plan_choice *o = &out[count];
        *o = qt_plan_choice_of(&c);
        o->order = count++;
        o->gpu_bytes = rp.gpu_bytes, o->host_bytes = rp.host_bytes, o->step_s = s;
        o->tokens_per_s = (double)c.data.micro_batch * c.data.seq_len * c.data.grad_accum * (rp.ranks ? rp.ranks : 1) / s;
    } while (qt_plan_axes_next(&ax));
    if (!count && smallest_host != (size_t)-1)
        return qt_errf(err, errlen, "%s: memory.plan: auto: no plan fits: the GPU fits plans from %.2f GiB per GPU, but the "
                       "smallest of them needs %.1f GiB of host memory and %s allows %.1f GiB; give fewer keys as constraints, "
                       "or see qtrain --plan", cfg->path, smallest / 1073741824.0, smallest_host / 1073741824.0, what,
                       host_cap / 1073741824.0);
    if (!count)
        return qt_errf(err, errlen, "%s: memory.plan: auto: no plan fits: the smallest needs %.2f GiB per GPU but %s allows "
                       "%.2f GiB (the host: %s); give fewer keys as constraints, or see qtrain --plan", cfg->path,
                       smallest / 1073741824.0, strncmp(gwhat, "memory.", 7) ? gwhat : "memory.gpu_limit_gib",
                       gpu_cap / 1073741824.0, what);
    /* bf16 master / gradients only where no plan with fp32 ones fits (the numerics first: offloading keeps
     * the bits); among those, the fastest, offloaded weights / gradients included: the cost model charges
     * their PCIe bytes as an upper bound, so a plan with them predicted faster is (on one GPU they win only
     * where nothing else fits: tools/fits_table.py's cells; on four 24 GiB cards with a host transport,
     * where ZeRO-3's gathers cross PCIe wherever the pieces are, 7B at micro-batch 32); at equal speed the
     * plainer plan (by_speed keeps the enumeration order, memory.offload's axis last) */
    int least = 2, kept = 0;
    for (int i = 0; i < count; i++) least = out[i].lossy < least ? out[i].lossy : least;
    if (lossy_out) { /* the fastest plan left out for its numerics */
        memset(lossy_out, 0, sizeof *lossy_out);
        for (int i = 0; i < count; i++)
            if (out[i].lossy > least && out[i].tokens_per_s > lossy_out->tokens_per_s) *lossy_out = out[i];
    }
    for (int i = 0; i < count; i++)
        if (out[i].lossy == least) out[kept++] = out[i];
    count = kept;
    qsort(out, (size_t)count, sizeof *out, by_speed);
    *n = count;
    return 0;
}
