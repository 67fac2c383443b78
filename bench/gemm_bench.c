/* gemm_bench.c — the bf16 and fp8 GEMM ceilings that SOL is computed against.
 *
 * For 8192^3, the Qwen2 0.5B / 1.5B matmuls at T = 16384 tokens and the Qwen2.5 7B / 14B ones at 8192 /
 * 4096 (fwd qkv/o/gate-up/down/lm-head, their dgrad and wgrad in bf16 -> bf16/fp32; the forward shapes
 * again in fp8 e4m3 x e4m3 -> bf16 with fast accumulation on and off) prints TFLOP/s = 2*M*N*K / median
 * time of 30 runs after 5 warm-ups, with the inputs rotated over more than 512 MiB of copies so no run
 * reads operands from L2. Each shape runs twice through qt_matmul: with the heuristic's first algorithm
 * ("heur0") and with the autotuned best of up to 8 ("best").
 *
 *   build/bench/gemm_bench [substring]         # only the cases whose name contains the substring
 *   build/bench/gemm_bench [substring] real    # fp8 operands with training's value distributions */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_matmul.h"
#include "qt_quant.h"
#include "qt_rng.h"

enum { FWD, DGRAD, WGRAD, FP8, FP8_FAST };
static const char *OPN[] = {"fwd", "dgrad", "wgrad", "fp8", "fp8-fast"};

typedef struct { const char *name; int op; long N; int I, O; } bench_case;

#define ROTATE_BYTES ((size_t)512 << 20)
#define WARMUP 5
#define RUNS 30

/* e4m3 codes of n values from gen, scaled as the trainer's current scaling does (amax -> 448). */
static void encode_scaled(uint8_t *q, size_t n, float (*gen)(qt_rng *), qt_rng *r) {
    float *v = malloc(n * sizeof *v), amax = 0, scale, descale;
    QT_CHECK(v != NULL, "out of host memory");
    for (size_t i = 0; i < n; i++) v[i] = gen(r), amax = fmaxf(amax, fabsf(v[i]));
    qt_fp8_scale_ref(QT_DT_E4M3, amax, &scale, &descale);
    for (size_t i = 0; i < n; i++) q[i] = qt_fp8_encode(QT_DT_E4M3, v[i] * scale, 1);
    free(v);
}
static float gen_normal(qt_rng *r) { return qt_rng_normal(r); }
static float gen_swiglu(qt_rng *r) { /* SwiGLU of N(0,1) gate and up: the down projection's input */
    float g = qt_rng_normal(r), u = qt_rng_normal(r);
    return g / (1 + expf(-g)) * u;
}

/* Copies a 64 MiB pattern (made once per kind) over d: finite N(0,1)-ish bf16; or e4m3 codes 0x20..0x47
 * with random signs (2^-3 .. 2^1, never NaN); or with `real` (gemm_bench's second argument) the codes
 * training makes: N(0,1) weights (B) and SwiGLU outputs (A), amax-scaled. */
static int real_data;
static void fill(void *d, size_t bytes, int fp8, int operand_a, qt_rng *r) {
    static uint8_t *pat[4];
    const size_t chunk = (size_t)64 << 20;
    int kind = fp8 && real_data ? 2 + operand_a : fp8;
    if (!pat[kind]) {
        pat[kind] = malloc(chunk);
        QT_CHECK(pat[kind] != NULL, "out of host memory");
        if (kind >= 2) encode_scaled(pat[kind], chunk, kind == 3 ? gen_swiglu : gen_normal, r);
        for (size_t i = 0; kind < 2 && i < chunk; i += 2) {
            if (fp8) {
                pat[1][i] = (uint8_t)(0x20 + qt_rng_below(r, 40)) | (qt_rng_below(r, 2) ? 0x80 : 0);
                pat[1][i + 1] = (uint8_t)(0x20 + qt_rng_below(r, 40));
            } else {
                uint16_t v = qt_f32_to_bf16(qt_rng_normal(r));
                memcpy(pat[0] + i, &v, 2);
            }
        }
    }
    for (size_t off = 0; off < bytes; off += chunk)
        QT_CUDA(cudaMemcpy((char *)d + off, pat[kind], bytes - off < chunk ? bytes - off : chunk, cudaMemcpyHostToDevice));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Operand A (the activation side) and B (the weight side) sizes in bytes, output elements. */
static void sizes(const bench_case *k, size_t *ba, size_t *bb, size_t *nd) {
    size_t es = (k->op >= FP8) ? 1 : 2;
    switch (k->op) {
    case FWD: case FP8: case FP8_FAST: *ba = k->N * k->I * es, *bb = (size_t)k->O * k->I * es, *nd = k->N * k->O; break;
    case DGRAD: *ba = k->N * k->O * es, *bb = (size_t)k->O * k->I * es, *nd = k->N * k->I; break;
    default: *ba = k->N * k->O * es, *bb = k->N * k->I * es, *nd = (size_t)k->O * k->I; break; /* WGRAD: dY, X */
    }
}

static void launch(qt_matmul_ctx *c, const bench_case *k, void *a, void *b, void *d, const float *one) {
    switch (k->op) {
    case FWD: qt_matmul_fwd(c, d, QT_DT_BF16, a, b, NULL, k->N, k->I, k->O, 0, 0); break;
    case DGRAD: qt_matmul_dgrad(c, d, QT_DT_BF16, a, b, k->N, k->I, k->O, 0, 0); break;
    case WGRAD: qt_matmul_wgrad(c, d, QT_DT_F32, NULL, a, b, k->N, k->I, k->O, 1, 0); break;
    default:
        qt_matmul_fp8(c, d, QT_DT_BF16, a, QT_DT_E4M3, one, b, QT_DT_E4M3, one, NULL, k->N, k->O, k->I,
                      k->op == FP8_FAST, 0, 0);
    }
}

/* Median TFLOP/s of RUNS launches through each of the two contexts, interleaved (heur0, best, heur0, ...)
 * so that clock drift over the case (the GPU warming towards its power limit) affects both alike: run one
 * after the other, the second (autotuned) came out 8-17% slower on the 7B/14B shapes while in training the
 * autotuned picks were the faster (bench/RESULTS.md 11). Operands rotate over ncopy copies. */
static void measure(qt_matmul_ctx *c[2], const bench_case *k, void **a, void **b, int ncopy, void *d, const float *one,
                    double tflops[2]) {
    cudaEvent_t ev[2 * RUNS + 1];
    for (int i = 0; i <= 2 * RUNS; i++) QT_CUDA(cudaEventCreate(&ev[i]));
    for (int i = 0; i < WARMUP; i++)
        for (int j = 0; j < 2; j++) launch(c[j], k, a[i % ncopy], b[i % ncopy], d, one);
    QT_CUDA(cudaEventRecord(ev[0], 0));
    for (int i = 0; i < 2 * RUNS; i++) {
        launch(c[i & 1], k, a[(i / 2) % ncopy], b[(i / 2) % ncopy], d, one);
        QT_CUDA(cudaEventRecord(ev[i + 1], 0));
    }
    QT_CUDA(cudaEventSynchronize(ev[2 * RUNS]));
    for (int j = 0; j < 2; j++) {
        float ms[RUNS];
        for (int i = 0; i < RUNS; i++) QT_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i + j], ev[2 * i + j + 1]));
        qsort(ms, RUNS, sizeof ms[0], cmp_float);
        double med = 0.5 * (ms[RUNS / 2 - 1] + ms[RUNS / 2]);
        tflops[j] = 2.0 * (double)k->N * k->I * k->O / (med * 1e-3) / 1e12;
    }
    for (int i = 0; i <= 2 * RUNS; i++) QT_CUDA(cudaEventDestroy(ev[i]));
}

static void run_case(qt_matmul_ctx *heur0, qt_matmul_ctx *best, const bench_case *k, const float *one, qt_rng *r) {
    size_t ba, bb, nd;
    sizes(k, &ba, &bb, &nd);
    int ncopy = (int)(ROTATE_BYTES / (ba + bb)) + 2;
    if (ncopy > 16) ncopy = 16;
    void *a[16], *b[16], *d;
    for (int i = 0; i < ncopy; i++) {
        QT_CUDA(cudaMalloc(&a[i], ba));
        QT_CUDA(cudaMalloc(&b[i], bb));
        fill(a[i], ba, k->op >= FP8, 1, r);
        fill(b[i], bb, k->op >= FP8, 0, r);
    }
    size_t dbytes = nd * (k->op == WGRAD ? 4 : 2);
    QT_CUDA(cudaMalloc(&d, dbytes));
    QT_CUDA(cudaMemset(d, 0, dbytes));
    qt_matmul_ctx *c[2] = {heur0, best};
    double t[2];
    measure(c, k, a, b, ncopy, d, one, t);
    printf("%-22s %-8s %6ld %6d %6d  %8.1f  %8.1f  %+6.1f%%\n", k->name, OPN[k->op], k->N, k->I, k->O, t[0], t[1],
           100.0 * (t[1] / t[0] - 1));
    fflush(stdout);
    for (int i = 0; i < ncopy; i++) cudaFree(a[i]), cudaFree(b[i]);
    cudaFree(d);
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("gemm_bench: no CUDA device, nothing measured\n");
        return 0;
    }
    const char *filter = argc > 1 ? argv[1] : "";
    real_data = argc > 2 && !strcmp(argv[2], "real");
    const long T = 16384;
    /* Qwen2-0.5B: C 896, H 14, Hkv 2, D 64, F 4864;  Qwen2-1.5B: C 1536, H 12, Hkv 2, D 128, F 8960; V 151936 */
    /* 7B and 14B at the tokens per micro-step of their H100 plans (8 x 1024, 4 x 1024: bench/RESULTS.md 10) */
    struct { const char *tag; int C, qkv, F, V; long T; } models[] = {{"q0.5b", 896, 1152, 4864, 151936, T},
                                                                     {"q1.5b", 1536, 2048, 8960, 151936, T},
                                                                     {"q7b", 3584, 4608, 18944, 152064, 8192},
                                                                     {"q14b", 5120, 7168, 13824, 152064, 4096}};
    enum { NMODELS = sizeof models / sizeof models[0], NCASES = 5 + NMODELS * 5 * 5 };
    bench_case cases[NCASES];
    int nc = 0;
    static char names[NCASES][32];
    for (int op = FWD; op <= FP8_FAST; op++) cases[nc++] = (bench_case){"square-8192", op, 8192, 8192, 8192};
    for (int m = 0; m < NMODELS; m++) {
        struct { const char *what; int I, O; } layers[] = {{"qkv", models[m].C, models[m].qkv},
                                                          {"o", models[m].C, models[m].C},
                                                          {"gate-up", models[m].C, 2 * models[m].F},
                                                          {"down", models[m].F, models[m].C},
                                                          {"lm-head", models[m].C, models[m].V}};
        for (int l = 0; l < 5; l++)
            for (int op = FWD; op <= FP8_FAST; op++) {
                snprintf(names[nc], sizeof names[nc], "%s-%s", models[m].tag, layers[l].what);
                cases[nc] = (bench_case){names[nc], op, models[m].T, layers[l].I, layers[l].O};
                nc++;
            }
    }
    qt_matmul_ctx *heur0 = qt_matmul_create(0), *best = qt_matmul_create(0);
    qt_matmul_set_autotune(heur0, 0);
    qt_matmul_set_autotune(best, 1);
    int fp8 = qt_matmul_cc(best) >= 89;
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("gemm_bench on %s (cc %d.%d), cuBLASLt %zu; TFLOP/s = 2MNK / median of %d runs\n", prop.name, prop.major,
           prop.minor, cublasLtGetVersion(), RUNS);
    printf("%-22s %-8s %6s %6s %6s  %8s  %8s  %7s\n", "case", "op", "N", "I", "O", "heur0", "best", "gain");
    float *one;
    QT_CUDA(cudaMalloc((void **)&one, sizeof *one));
    float h1 = 1.0f;
    QT_CUDA(cudaMemcpy(one, &h1, sizeof h1, cudaMemcpyHostToDevice));
    qt_rng r;
    qt_rng_seed(&r, 1);
    for (int i = 0; i < nc; i++) {
        if (!strstr(cases[i].name, filter) && !strstr(OPN[cases[i].op], filter)) continue;
        if (cases[i].op >= FP8 && !fp8) continue;
        run_case(heur0, best, &cases[i], one, &r);
    }
    cudaFree(one);
    qt_matmul_free(heur0);
    qt_matmul_free(best);
    return 0;
}
