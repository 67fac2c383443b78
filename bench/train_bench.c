/* train_bench.c — training throughput of one config on one GPU, and its speed of light.
 *
 *   build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml [--steps 10] [--warmup 3] [--set k=v ...]
 *
 * With parallel.nodes > 1 it is one node of a run across nodes, started as qtrain is (the launcher's variables,
 * docs/multi-node.md): the nodes meet, every node trains the same global micro-batches, and each prints the
 * run's tokens/s (all nodes' GPUs); model TFLOP/s and SOL are per GPU of the whole run.
 *
 * Trains on random tokens (the data's content does not change the speed), times each optimizer step
 * (host wall clock between the per-step syncs), and measures the bf16 cuBLASLt GEMM rate at 8192^3 in
 * the same process, and the fp8 e4m3 rate (TN, bf16 output, qt_matmul_fp8) at 8192^3. Prints tokens/s
 * (median step), model TFLOP/s with the FLOP count of qt_model_flops_per_token, SOL = model FLOP/s /
 * measured GEMM FLOP/s — against the fp8 ceiling for precision.matmul_dtype: e4m3 configs, the bf16
 * one otherwise (both are printed) — and peak device memory.
 * --docs MEDIAN packs documents into each window (lengths log-normal around MEDIAN tokens, sigma 0.8, clipped
 * to [50, 2000], a window opening inside a document) and trains with attention and RoPE positions per
 * document (qt_engine_set_docs before each micro-step, as the training loop does); every target is trained.
 * Ends with a "RESULT {json}" line for bench/run.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_device.h"
#include "qt_dp_nodes.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_kernels.h"
#include "qt_matmul.h"
#include "qt_plan_auto.h"
#include "qt_rng.h"
#include "qt_train.h"
#include "qt_train_nodes.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* GEMM rate (TFLOP/s) at m=n=k=8192 through our wrapper with its tuned algorithm, median of 20 after 5
 * warm-ups. bf16: U(-1,1) operands (constant data draws less power and runs ~10% faster than real
 * data). fp8: e4m3 x e4m3 -> bf16, random finite codes, scale pointers, fast accumulation (the model's
 * forward setting). */
static double gemm_ceiling(int fp8) {
    const int n = 8192;
    size_t elems = (size_t)n * n, bytes = elems * (fp8 ? 1 : 2);
    unsigned char *h = malloc(bytes);
    QT_CHECK(h, "out of host memory");
    void *a, *b, *c;
    float *sc, scale = 1.0f / 64;
    QT_CUDA(cudaMalloc(&a, bytes));
    QT_CUDA(cudaMalloc(&b, bytes));
    QT_CUDA(cudaMalloc(&c, elems * 2));
    QT_CUDA(cudaMalloc((void **)&sc, 16));
    QT_CUDA(cudaMemcpy(sc, &scale, sizeof scale, cudaMemcpyHostToDevice));
    qt_rng r;
    qt_rng_seed(&r, 7);
    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < elems; i++) {
            if (fp8) {
                unsigned char v = (unsigned char)qt_rng_u64(&r);
                h[i] = (v & 0x7f) == 0x7f ? 0x38 : v; /* e4m3 NaN codes -> 1.0 */
            } else {
                ((uint16_t *)h)[i] = qt_f32_to_bf16((float)(2 * qt_rng_uniform(&r) - 1));
            }
        }
        QT_CUDA(cudaMemcpy(m ? b : a, h, bytes, cudaMemcpyHostToDevice));
    }
    free(h);
    qt_matmul_ctx *mm = qt_matmul_create(0);
    cudaEvent_t e0, e1;
    QT_CUDA(cudaEventCreate(&e0));
    QT_CUDA(cudaEventCreate(&e1));
    double t[20];
    for (int i = 0; i < 25; i++) {
        QT_CUDA(cudaEventRecord(e0, 0));
        if (fp8) qt_matmul_fp8(mm, c, QT_DT_BF16, a, QT_DT_E4M3, sc, b, QT_DT_E4M3, sc, NULL, n, n, n, 1, 0, 0);
        else qt_matmul_fwd(mm, c, QT_DT_BF16, a, b, NULL, n, n, n, 0, 0);
        QT_CUDA(cudaEventRecord(e1, 0));
        QT_CUDA(cudaEventSynchronize(e1));
        float ms;
        QT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 5) t[i - 5] = ms;
    }
    qsort(t, 20, sizeof t[0], cmp_d);
    QT_CUDA(cudaEventDestroy(e0));
    QT_CUDA(cudaEventDestroy(e1));
    qt_matmul_free(mm);
    QT_CUDA(cudaFree(a));
    QT_CUDA(cudaFree(b));
    QT_CUDA(cudaFree(c));
    QT_CUDA(cudaFree(sc));
    return 2.0 * n * n * (double)n / (t[10] * 1e-3) * 1e-12;
}

/* Draws the documents of n windows of T tokens (lengths log-normal around median, sigma 0.8, clipped to
 * [50, 2000]; the first window opens inside a document) and sets them, attention and positions per
 * document; adds the documents begun to *count. 0, or -1 with err. */
static int set_docs(qt_engine *e, qt_rng *r, int median, long n, int T, long *count, char *err, size_t errlen) {
    static int32_t *starts, *n_starts;
    static long cap;
    static double left; /* tokens left of the current document */
    if (cap < n) {
        free(starts), free(n_starts);
        starts = malloc(n * T * sizeof *starts), n_starts = malloc(n * sizeof *n_starts), cap = n;
        if (!starts || !n_starts) return snprintf(err, errlen, "out of host memory"), -1;
    }
    for (long b = 0; b < n; b++) {
        n_starts[b] = 0;
        for (int t = 0; t < T;) {
            if (left <= 0) {
                double u1 = (qt_rng_below(r, 1u << 30) + 1.0) / (1u << 30), u2 = qt_rng_below(r, 1u << 30) / (double)(1u << 30);
                double len = median * exp(0.8 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
                left = len < 50 ? 50 : len > 2000 ? 2000 : (int)len;
                if (t > 0) starts[b * T + n_starts[b]++] = t, (*count)++;
            }
            int take = left < T - t ? (int)left : T - t;
            t += take, left -= take;
        }
    }
    qt_docs d = {starts, n_starts, 1, 1};
    return qt_engine_set_docs(e, &d, err, errlen);
}

/* The launcher's variables (qt_launch.h): the environment is the program's to read. */
static const char *env_get(void *ctx, const char *name) {
    (void)ctx;
    return getenv(name);
}

int main(int argc, char **argv) {
    const char *path = NULL, *sets[64];
    int nsets = 0, steps = 10, warmup = 3, breakdown = 0, bd_steps = 3, doc_median = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--breakdown")) breakdown = 1;
        else if (!strcmp(argv[i], "--docs") && i + 1 < argc) doc_median = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--breakdown-steps") && i + 1 < argc) breakdown = 1, bd_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < 64) sets[nsets++] = argv[++i];
        else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: train_bench config.yaml [--steps N] [--warmup N] [--breakdown] [--breakdown-steps N (3)] [--docs MEDIAN] "
                        "[--set k=v ...]\n");
        return 2;
    }
    if (qt_cuda_device_count() == 0) {
        printf("SKIP train_bench: no CUDA device\n");
        return 0;
    }
    static qt_config cfg;
    char err[2048];
    if (qt_config_load(&cfg, path, sets, nsets, err, sizeof err)) {
        fprintf(stderr, "train_bench: %s\n", err);
        return 1;
    }
    cfg.init.from[0] = 0; /* from scratch: the bench needs no files */
    cfg.device = QT_DEVICE_CUDA;
    if (cfg.memory.plan) { /* memory.plan: auto chooses the keys the config leaves open, as the qtrain program does */
        qt_probe probe = qt_probe_get("build/probe-cache", 1);
        qt_probe_free_memory(&probe, &cfg); /* the budget: the GPU's free memory as the bench starts */
        if (qt_plan_auto(&cfg, &probe, err, sizeof err)) {
            fprintf(stderr, "train_bench: %s\n", err);
            return 1;
        }
    }
    qt_layout L;
    qt_weight_src src; /* read range by range into the engine: no fp32 copy of the model (59 GB at 14B) */
    if (qt_model_layout(&cfg, &L, &src, err, sizeof err)) {
        fprintf(stderr, "train_bench: %s\n", err);
        return 1;
    }
    src.kind = QT_WSRC_INIT_GPU; /* a frozen LoRA base is drawn on the GPU (seconds at 70B); the rest as INIT */
    QT_CUDA(cudaSetDevice(0));
    double t_start = now_s();
    double ceiling_bf16 = gemm_ceiling(0), ceiling_fp8 = 0;
    struct cudaDeviceProp p;
    QT_CUDA(cudaGetDeviceProperties(&p, 0));
    if (p.major * 10 + p.minor >= 89) ceiling_fp8 = gemm_ceiling(1);
    int fp8 = cfg.precision.matmul_dtype == QT_DT_E4M3;
    /* fp8 configs run the block matmuls in fp8 (the LM head and attention stay bf16): the fp8 ceiling
     * is the bar their SOL is held to, as in LLM.Q's figures */
    double ceiling = fp8 ? ceiling_fp8 : ceiling_bf16;
    size_t free0, total;
    QT_CUDA(cudaMemGetInfo(&free0, &total));
    double t_create = now_s();
    static qt_nodes nodes; /* parallel.nodes > 1: where this node stands, from the launcher's variables */
    if (cfg.parallel.nodes > 1 && qt_train_meet_nodes(&cfg, env_get, NULL, &nodes, err, sizeof err)) {
        fprintf(stderr, "train_bench: %s\n", err);
        return 1;
    }
    qt_engine *e = qt_engine_create_nodes(&L, &cfg, &src, cfg.parallel.nodes > 1 ? &nodes : NULL, err, sizeof err);
    if (!e) {
        fprintf(stderr, "train_bench: %s\n", err);
        return 1;
    }
    printf("train_bench: engine ready in %.1f s (%.1f s since the config, with the GEMM ceilings)\n", now_s() - t_create,
           now_s() - t_start);
    e->ops->print_memory(e);
    long N = (long)cfg.data.micro_batch * cfg.data.seq_len * e->ranks; /* tokens per micro-step, all ranks */
    int32_t *in = malloc(N * 4), *tgt = malloc(N * 4);
    qt_rng r;
    qt_rng_seed(&r, 1);
    double *t = calloc(steps, sizeof *t);
    float loss = 0, gn = 0, first = 0;
    long n_docs = 0;
    float scale = qt_loss_scale(cfg.data.grad_accum, e->ranks, N * cfg.data.grad_accum); /* every target valid */
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = now_s();
        for (int a = 0; a < cfg.data.grad_accum; a++) {
            for (long i = 0; i < N; i++) in[i] = (int32_t)qt_rng_below(&r, L.cfg.vocab_size);
            for (long i = 0; i < N; i++) tgt[i] = i + 1 < N ? in[i + 1] : in[0];
            if (doc_median && set_docs(e, &r, doc_median, N / cfg.data.seq_len, cfg.data.seq_len, &n_docs, err, sizeof err)) {
                fprintf(stderr, "train_bench: %s\n", err);
                return 1;
            }
            e->ops->micro_step(e, in, tgt, scale);
        }
        e->ops->opt_step(e, 1e-4f, s + 1, &loss, &gn);
        if (s == 0) first = loss;
        if (s >= warmup) t[s - warmup] = now_s() - t0;
        printf("step %d: loss %.4f gnorm %.3f %.1f ms\n", s + 1, loss, gn, (now_s() - t0) * 1e3);
    }
    if (breakdown) { /* extra steps with an event around every op (they slow the step a little) */
        qt_engine_profile(e, 1);
        for (int s = 0; s < bd_steps; s++) {
            for (int a = 0; a < cfg.data.grad_accum; a++) e->ops->micro_step(e, in, tgt, scale);
            e->ops->opt_step(e, 1e-4f, warmup + steps + s + 1, &loss, &gn);
        }
        qt_engine_profile_print(e, bd_steps);
        qt_engine_profile(e, 0);
    }
    size_t free1;
    QT_CUDA(cudaMemGetInfo(&free1, &total));
    qsort(t, steps, sizeof *t, cmp_d);
    double step_s = t[steps / 2], tok = (double)N * cfg.data.grad_accum / step_s;
    /* SOL per GPU: all ranks' FLOP/s over all ranks' ceilings */
    double flops = qt_model_flops_per_token(&L.cfg, cfg.data.seq_len), tflops = tok * flops * 1e-12 / e->ranks;
    printf("%s on %d x %s (%s matmuls): %.0f tokens/s, %.1f ms/step, %.1f model TFLOP/s per GPU (%.3f GFLOP/token), "
           "GEMM ceilings bf16 %.1f / fp8 %.1f TFLOP/s, SOL %.1f%% (vs %s), device memory used %.2f GiB\n",
           path, e->ranks, p.name, fp8 ? "e4m3" : "bf16", tok, step_s * 1e3, tflops, flops * 1e-9, ceiling_bf16, ceiling_fp8,
           100 * tflops / ceiling, fp8 ? "fp8" : "bf16", (total - free1) / 1073741824.0);
    if (doc_median)
        printf("documents: %.1f starts per window of %d tokens on average (median length %d), attention and positions per "
               "document, every target trained\n", (double)n_docs / ((double)(warmup + steps) * cfg.data.grad_accum *
               (N / cfg.data.seq_len)), cfg.data.seq_len, doc_median);
    printf("RESULT {\"config\":\"%s\",\"gpus\":%d,\"device\":\"%s\",\"matmul_dtype\":\"%s\",\"tokens_per_s\":%.0f,"
           "\"step_ms\":%.2f,\"model_tflops\":%.1f,\"gflop_per_token\":%.4f,\"gemm_ceiling_tflops\":%.1f,"
           "\"gemm_ceiling_bf16_tflops\":%.1f,\"gemm_ceiling_fp8_tflops\":%.1f,\"sol\":%.4f,\"mem_used_gib\":%.2f,"
           "\"first_loss\":%.4f,\"last_loss\":%.4f}\n",
           path, e->ranks, p.name, fp8 ? "e4m3" : "bf16", tok, step_s * 1e3, tflops, flops * 1e-9, ceiling, ceiling_bf16,
           ceiling_fp8, tflops / ceiling, (total - free1) / 1073741824.0, first, loss);
    e->ops->free(e);
    free(t);
    free(in);
    free(tgt);
    qt_layout_free(&L);
    return isfinite(loss) ? 0 : 1;
}
