/* quant_bench.c — GB/s of the fp8 quantize kernels (amax, quantize, quantize+transpose) at the
 * model's shapes against the 3.0 TB/s H100 copy ceiling and a measured device-to-device copy.
 * Median of 20 timed runs (CUDA events) after 3 warm-ups. Usage: quant_bench [bf16|fp32|swiglu]
 * swiglu: the SwiGLU backward alone and fused with down's e4m3 Xq^T (the fp8 swiglu recompute) at the
 * 1.5B and 7B micro-steps' shapes, beside a copy of gate|up. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_kernels.h"
#include "qt_quant.h"

#define REPS 20
#define CEIL_GBS 3000.0

typedef struct {
    qt_dtype xdt;
    void *x, *x2;
    uint8_t *y, *yT;
    float *scale;
    qt_fp8_scale *sc;
    int *flag;
    long R, C;
    void *gu, *dh, *dgu; /* swiglu mode: gu, dgu [R, 2C], dh [R, C] bf16; yT [C, R] */
} bench_ctx;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void op_copy(bench_ctx *b) {
    QT_CUDA(cudaMemcpyAsync(b->x2, b->x, (size_t)(b->R * b->C) * qt_dtype_size(b->xdt), cudaMemcpyDeviceToDevice, 0));
}
static void op_amax(bench_ctx *b) { qt_quant_amax(b->xdt, b->x, b->R * b->C, &b->sc->amax, 0, 0); }
static void op_quant(bench_ctx *b) { qt_quant_fp8(QT_DT_E4M3, b->y, b->xdt, b->x, b->R * b->C, b->scale, 0); }
static void op_quant_cur(bench_ctx *b) {
    qt_quant_fp8_cur(QT_DT_E4M3, b->y, b->xdt, b->x, b->R * b->C, b->sc, b->flag, 1, 0);
}
static void op_qt(bench_ctx *b) { qt_quant_fp8_transpose(QT_DT_E4M3, b->y, b->yT, b->xdt, b->x, b->R, b->C, b->scale, 0); }
static void op_qt_only_t(bench_ctx *b) {
    qt_quant_fp8_transpose(QT_DT_E4M3, NULL, b->yT, b->xdt, b->x, b->R, b->C, b->scale, 0);
}
static void op_qt_cur(bench_ctx *b) {
    qt_quant_fp8_transpose_cur(QT_DT_E5M2, b->y, b->yT, b->xdt, b->x, b->R, b->C, b->sc, b->flag, 1, 0);
}

static void op_gu_copy(bench_ctx *b) {
    QT_CUDA(cudaMemcpyAsync(b->dgu, b->gu, (size_t)(b->R * b->C) * 4, cudaMemcpyDeviceToDevice, 0));
}
static void op_swiglu_fwd(bench_ctx *b) { qt_swiglu_fwd(b->dh, b->gu, b->R, (int)b->C, &b->sc[1].amax, 0); }
static void op_swiglu_bwd(bench_ctx *b) { qt_swiglu_bwd(b->dgu, b->dh, b->gu, b->R, (int)b->C, &b->sc[1].amax, 0); }
static void op_swiglu_bwd_qt(bench_ctx *b) {
    qt_swiglu_bwd_quant_transpose_cur(b->dgu, b->dh, b->gu, b->R, b->C, &b->sc[1].amax, QT_DT_E4M3, b->yT, b->sc,
                                      b->flag, 1, 0);
}

/* Median milliseconds of one call of op. */
static float time_op(void (*op)(bench_ctx *), bench_ctx *b) {
    cudaEvent_t e0, e1;
    float ms[REPS];
    QT_CUDA(cudaEventCreate(&e0));
    QT_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) op(b);
    for (int i = 0; i < REPS; i++) {
        QT_CUDA(cudaEventRecord(e0, 0));
        op(b);
        QT_CUDA(cudaEventRecord(e1, 0));
        QT_CUDA(cudaEventSynchronize(e1));
        QT_CUDA(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    QT_CUDA(cudaEventDestroy(e0));
    QT_CUDA(cudaEventDestroy(e1));
    qsort(ms, REPS, sizeof ms[0], cmp_float);
    return (ms[REPS / 2 - 1] + ms[REPS / 2]) / 2;
}

static void report(const char *shape, const char *name, float ms, double bytes) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("%-14s %-34s %10.1f %9.0f %6.0f%%\n", shape, name, ms * 1e3, gbs, 100 * gbs / CEIL_GBS);
}

/* The SwiGLU backward kernels at [R, 2C] gate|up: bytes are what each must move (bf16 in and out, the
 * e4m3 codes), gu filled with bf16 1.17 (finite; the kernels' cost does not depend on the values). */
static void bench_swiglu(void) {
    const long shapes[][2] = {{16384, 8960}, {8192, 18944}};
    for (int si = 0; si < 2; si++) {
        bench_ctx b = {.xdt = QT_DT_BF16, .R = shapes[si][0], .C = shapes[si][1]};
        size_t n = (size_t)(b.R * b.C);
        QT_CUDA(cudaMalloc(&b.gu, 4 * n));
        QT_CUDA(cudaMalloc(&b.dgu, 4 * n));
        QT_CUDA(cudaMalloc(&b.dh, 2 * n));
        QT_CUDA(cudaMalloc((void **)&b.yT, n));
        QT_CUDA(cudaMalloc((void **)&b.sc, 2 * sizeof(qt_fp8_scale)));
        QT_CUDA(cudaMalloc((void **)&b.flag, sizeof(int)));
        QT_CUDA(cudaMemset(b.gu, 0x3f, 4 * n));
        QT_CUDA(cudaMemset(b.dh, 0x3c, 2 * n));
        QT_CUDA(cudaMemset(b.sc, 0, 2 * sizeof(qt_fp8_scale)));
        QT_CUDA(cudaMemset(b.flag, 0, sizeof(int)));
        op_swiglu_fwd(&b); /* sc[0].amax stays 0 (scale 1): the codes' cost does not depend on it */
        char shape[32];
        snprintf(shape, sizeof shape, "%ldx%ld", b.R, b.C);
        report(shape, "copy of gate|up (D2D)", time_op(op_gu_copy, &b), 8.0 * n);
        report(shape, "swiglu fwd + amax", time_op(op_swiglu_fwd, &b), 6.0 * n);
        report(shape, "swiglu bwd + amax", time_op(op_swiglu_bwd, &b), 10.0 * n);
        report(shape, "swiglu bwd + amax + Xq^T e4m3", time_op(op_swiglu_bwd_qt, &b), 11.0 * n);
        QT_CUDA(cudaDeviceSynchronize());
        cudaFree(b.gu); cudaFree(b.dgu); cudaFree(b.dh); cudaFree(b.yT); cudaFree(b.sc); cudaFree(b.flag);
    }
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("quant_bench: no CUDA device, skipped\n");
        return 0;
    }
    qt_dtype xdt = argc > 1 && !strcmp(argv[1], "fp32") ? QT_DT_F32 : QT_DT_BF16;
    const long shapes[][2] = {{16384, 896}, {16384, 4864}, {896, 4864}};
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("quant_bench on %s, input %s, median of %d; %% is of the %.1f TB/s copy ceiling\n", prop.name,
           qt_dtype_name(xdt), REPS, CEIL_GBS / 1000);
    printf("%-14s %-34s %10s %9s %7s\n", "shape", "kernel", "us", "GB/s", "%ceil");
    if (argc > 1 && !strcmp(argv[1], "swiglu")) {
        bench_swiglu();
        return 0;
    }
    for (int si = 0; si < 3; si++) {
        bench_ctx b = {.xdt = xdt, .R = shapes[si][0], .C = shapes[si][1]};
        long n = b.R * b.C;
        size_t xs = (size_t)n * qt_dtype_size(xdt);
        QT_CUDA(cudaMalloc(&b.x, xs));
        QT_CUDA(cudaMalloc(&b.x2, xs));
        QT_CUDA(cudaMalloc((void **)&b.y, (size_t)n));
        QT_CUDA(cudaMalloc((void **)&b.yT, (size_t)n));
        QT_CUDA(cudaMalloc((void **)&b.scale, sizeof(float)));
        QT_CUDA(cudaMalloc((void **)&b.sc, sizeof(qt_fp8_scale)));
        QT_CUDA(cudaMalloc((void **)&b.flag, sizeof(int)));
        QT_CUDA(cudaMemset(b.x, 0x3c, xs)); /* finite values: 0x3c3c (bf16) / 0x3c3c3c3c (fp32) */
        QT_CUDA(cudaMemset(b.flag, 0, sizeof(int)));
        float one = 1.0f;
        QT_CUDA(cudaMemcpy(b.scale, &one, sizeof one, cudaMemcpyHostToDevice));
        qt_quant_amax(xdt, b.x, n, &b.sc->amax, 0, 0);
        struct {
            const char *name;
            void (*op)(bench_ctx *);
            double bytes;
        } ops[] = {
            {"copy (cudaMemcpy D2D)", op_copy, 2.0 * xs},
            {"amax", op_amax, (double)xs},
            {"quantize e4m3", op_quant, (double)xs + n},
            {"quantize e4m3, scale from amax", op_quant_cur, (double)xs + n},
            {"quant+transpose e4m3 (y, yT)", op_qt, (double)xs + 2.0 * n},
            {"quant+transpose e4m3 (yT only)", op_qt_only_t, (double)xs + n},
            {"quant+transpose e5m2 from amax", op_qt_cur, (double)xs + 2.0 * n},
        };
        char shape[32];
        snprintf(shape, sizeof shape, "%ldx%ld", b.R, b.C);
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            report(shape, ops[k].name, time_op(ops[k].op, &b), ops[k].bytes);
        }
        QT_CUDA(cudaDeviceSynchronize());
        cudaFree(b.x); cudaFree(b.x2); cudaFree(b.y); cudaFree(b.yT);
        cudaFree(b.scale); cudaFree(b.sc); cudaFree(b.flag);
    }
    return 0;
}
