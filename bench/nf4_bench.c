/* nf4_bench.c — GB/s of the NF4 dequantize (cuda/nf4.cu) at the weight shapes of an 8B model: 4096 x 4096
 * (q/o_proj) and 14336 x 4096 (gate/up/down_proj), to bf16 with double-quantized scales (the QLoRA base) and
 * with fp32 scales; beside a device-to-device copy of the bf16 output's size (the ceiling a one-pass kernel
 * can reach: it moves 2.5 bytes per value, the copy 4) and the quantize (once per weight, at load).
 * Bytes per run: what the kernel must move at least (codes, scales, output). Median of 20 runs timed with
 * CUDA events after 3 warm-ups. Prints "SKIP" and exits 0 without a GPU.
 * Usage: nf4_bench [--md FILE]   (appends the markdown table to FILE) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_nf4.h"

#define RUNS 20

typedef struct {
    long rows, cols;
    void *x, *y, *y2;
    uint8_t *codes, *q;
    float *absmax, *absmax2, *offset;
} bench_ctx;

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static void *dalloc(size_t bytes) {
    void *p;
    QT_CUDA(cudaMalloc(&p, bytes));
    QT_CUDA(cudaMemset(p, 0, bytes));
    return p;
}

static void op_dequant_dq(bench_ctx *b) {
    qt_nf4_dequant(QT_DT_BF16, b->y, b->codes, NULL, b->q, b->absmax2, b->offset, b->rows, b->cols, 0);
}
static void op_dequant_f32(bench_ctx *b) {
    qt_nf4_dequant(QT_DT_BF16, b->y, b->codes, b->absmax, NULL, NULL, NULL, b->rows, b->cols, 0);
}
static void op_copy(bench_ctx *b) {
    QT_CUDA(cudaMemcpyAsync(b->y2, b->y, (size_t)(b->rows * b->cols) * 2, cudaMemcpyDeviceToDevice, 0));
}
static void op_quant(bench_ctx *b) {
    qt_nf4_quantize(QT_DT_BF16, b->x, b->rows, b->cols, b->codes, b->absmax, b->q, b->absmax2, b->offset, 0);
}

/* Median milliseconds of fn over RUNS timed runs. */
static double time_ms(void (*fn)(bench_ctx *), bench_ctx *b) {
    cudaEvent_t e0[RUNS], e1[RUNS];
    float ms[RUNS];
    for (int i = 0; i < 3; i++) fn(b);
    for (int i = 0; i < RUNS; i++) {
        QT_CUDA(cudaEventCreate(&e0[i]));
        QT_CUDA(cudaEventCreate(&e1[i]));
        QT_CUDA(cudaEventRecord(e0[i], 0));
        fn(b);
        QT_CUDA(cudaEventRecord(e1[i], 0));
    }
    QT_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < RUNS; i++) {
        QT_CUDA(cudaEventElapsedTime(&ms[i], e0[i], e1[i]));
        QT_CUDA(cudaEventDestroy(e0[i]));
        QT_CUDA(cudaEventDestroy(e1[i]));
    }
    qsort(ms, RUNS, sizeof ms[0], cmpf);
    return 0.5 * (ms[RUNS / 2 - 1] + ms[RUNS / 2]);
}

/* Random bf16 weights ~ N(0, 0.02) (a sum of uniforms: the codec does not care about the exact law). */
static void fill_weights(void *dx, long n) {
    uint16_t *h = malloc((size_t)n * 2);
    QT_CHECK(h, "out of host memory");
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < n; i++) {
        float v = -2.0f;
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            v += (float)(s >> 40) / (float)(1 << 24);
        }
        h[i] = qt_f32_to_bf16(0.02f * 1.7320508f * v);
    }
    QT_CUDA(cudaMemcpy(dx, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
}

static void shape(long rows, long cols, FILE *md) {
    long n = rows * cols, nb = qt_nf4_blocks(n), nb2 = qt_nf4_blocks2(n);
    bench_ctx b = {rows, cols, dalloc((size_t)n * 2), dalloc((size_t)n * 2), dalloc((size_t)n * 2),
                   dalloc((size_t)qt_nf4_code_bytes(n)), dalloc((size_t)nb), dalloc((size_t)nb * 4),
                   dalloc((size_t)nb2 * 4), dalloc(4)};
    fill_weights(b.x, n);
    op_quant(&b);
    QT_CUDA(cudaDeviceSynchronize());
    struct {
        const char *name;
        void (*fn)(bench_ctx *);
        double bytes;
    } ops[] = {
        {"copy bf16 (device to device)", op_copy, n * 4.0},
        {"dequant bf16 (double-quantized scales)", op_dequant_dq, n / 2.0 + nb + nb2 * 4.0 + n * 2.0},
        {"dequant bf16 (fp32 scales)", op_dequant_f32, n / 2.0 + nb * 4.0 + n * 2.0},
        {"quantize bf16 (+ double quantization)", op_quant, n * 2.0 + n / 2.0 + nb * 9.0 + nb2 * 4.0},
    };
    double copy_gbs = 0;
    for (int k = 0; k < 4; k++) {
        double ms = time_ms(ops[k].fn, &b), gbs = ops[k].bytes / (ms * 1e-3) / 1e9;
        if (k == 0) copy_gbs = gbs;
        printf("%5ld x %-5ld  %-40s %9.1f us %9.1f MB %8.1f GB/s %6.1f%% of copy\n", rows, cols, ops[k].name,
               ms * 1e3, ops[k].bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
        if (md)
            fprintf(md, "| %ld x %ld | %s | %.1f | %.1f | %.0f | %.0f%% |\n", rows, cols, ops[k].name, ms * 1e3,
                    ops[k].bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
    }
    cudaFree(b.x), cudaFree(b.y), cudaFree(b.y2), cudaFree(b.codes), cudaFree(b.q);
    cudaFree(b.absmax), cudaFree(b.absmax2), cudaFree(b.offset);
}

int main(int argc, char **argv) {
    FILE *md = NULL;
    if (argc == 3 && !strcmp(argv[1], "--md")) {
        md = fopen(argv[2], "a");
        if (!md) {
            fprintf(stderr, "nf4_bench: %s: cannot open for appending\n", argv[2]);
            return 1;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: nf4_bench [--md FILE]\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP nf4_bench: no CUDA device\n");
        return 0;
    }
    struct cudaDeviceProp p;
    QT_CUDA(cudaGetDeviceProperties(&p, 0));
    printf("nf4_bench on %s: median of %d runs\n", p.name, RUNS);
    if (md)
        fprintf(md, "\n### NF4 (cuda/nf4.cu) on %s\n\n| shape | kernel | us | MB moved | GB/s | of copy GB/s |\n"
                    "|---|---|---|---|---|---|\n", p.name);
    shape(4096, 4096, md);
    shape(14336, 4096, md);
    if (md) fclose(md);
    return 0;
}
