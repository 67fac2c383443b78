/* test_lora_fp8.c — LoRA over an fp8 base with the base's data gradient in e4m3 (precision.grad_dtype e4m3) on the
 * GPU model itself: one micro-batch through the same base, adapters (random A and B, both nonzero, so every site's
 * data gradient carries the adapters' part) and tokens with grad_dtype e4m3 and bf16: the loss is the same bits (the
 * forward is the same e4m3 one), every adapter tensor's gradient within e4m3's rounding of the bf16 backward's; in the
 * mutant build the adapters' data gradient left out after the e4m3 dgrad is caught. Skips without a GPU of compute
 * capability 8.9+. Training, resume and recompute with the e4m3 dgrad: tests/test_lora.c. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_config.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_lora.h"
#include "qt_gpu_model.h"
#include "qt_planner.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_train.h"

/* head_dim 64 (cuDNN), every block matmul's features and the 128 tokens multiples of 16 (cuBLASLt's fp8 GEMMs). */
static const char *YAML =
    "model: {vocab_size: 96, hidden_size: 128, num_layers: 3, num_heads: 2, num_kv_heads: 1, intermediate_size: 256,\n"
    "        max_seq_len: 64, qkv_bias: true, tie_embeddings: false}\n"
    "init: {seed: 5, std: 0.1}\n"
    "data: {train: 'none_*.bin', seq_len: 32, micro_batch: 4}\n"
    "lora: {rank: 4, alpha: 8, dropout: 0.1, targets: [q, k, v, o, gate, up, down]}\n"
    "precision: {matmul_dtype: e4m3, grad_dtype: %s}\n"
    "memory: {recompute: [%s]}\n"
    "perf: {matmul_autotune: false}\n" /* the heuristic's algorithms: the same in both models, so the same forward */
    "device: cuda\n";

static int fp8_gpu(void) {
    struct cudaDeviceProp p;
    return qt_cuda_device_count() > 0 && cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major * 10 + p.minor >= 89;
}

/* One micro-batch (fixed tokens, step 1's dropout masks) of the GPU model with grad_dtype grad and the given
 * recompute parts, its adapters set to U(-0.25, 0.25) (seed 9: the same in every call; the adapters' part of each
 * dx is then of the base's size: scale 2 x rank 4 x 0.144^2 against the weights' std 0.1); the adapters' gradients
 * into ga (malloc'd, *n elements, the layout into *A when A is not NULL), the summed loss returned. */
static double one_step(const char *grad, const char *recompute, float **ga, size_t *n, qt_lora_layout *A) {
    static qt_config c;
    char yaml[2048], err[2048];
    snprintf(yaml, sizeof yaml, YAML, grad, recompute);
    QT_CHECK(qt_config_load_string(&c, yaml, "test_lora_fp8.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    qt_layout L;
    qt_weight_src src;
    qt_plan plan;
    QT_CHECK(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    QT_CHECK(qt_plan_resolve(&c, &L, 0, &plan, err, sizeof err) == 0, "%s", err);
    QT_CHECK(qt_engine_gpu_select(&L, &plan, 0, err, sizeof err) == 0, "%s", err); /* device 0, its fp8 checks */
    qt_gpu_model *g = qt_gpu_model_create(&L, &plan, &src, NULL, err, sizeof err);
    QT_CHECK(g, "GPU model (grad_dtype %s): %s", grad, err);
    qt_gpu_lora *gl = g->lora;
    long N = g->N;
    *n = gl->A.numel;
    float *a = malloc(*n * sizeof *a);
    int32_t *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    *ga = malloc(*n * sizeof **ga);
    QT_CHECK(a && in && tg && *ga, "out of host memory");
    qt_rng r;
    qt_rng_seed(&r, 9);
    for (size_t i = 0; i < *n; i++) a[i] = (float)(qt_rng_u64(&r) >> 11) * 0x1p-53f * 0.5f - 0.25f;
    for (long i = 0; i < N; i++) in[i] = (int32_t)qt_rng_below(&r, 96), tg[i] = (int32_t)qt_rng_below(&r, 96);
    QT_CUDA(cudaMemcpy(gl->a, a, *n * 4, cudaMemcpyHostToDevice));
    QT_CUDA(cudaMemcpy(g->tok, in, N * 4, cudaMemcpyHostToDevice));
    QT_CUDA(cudaMemcpy(g->tgt, tg, N * 4, cudaMemcpyHostToDevice));
    QT_CUDA(cudaDeviceSynchronize()); /* the model's stream is non-blocking: order the copies before its work */
    qt_gpu_lora_refresh(gl, g->stream);
    qt_gpu_lora_set_batch(gl, 1, 0);
    qt_gpu_step_args sa = {qt_loss_scale(1, 1, N), 1, 0, NULL};
    qt_gpu_model_step(g, &sa);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    double sum;
    QT_CUDA(cudaMemcpy(&sum, g->head.loss_sum, 8, cudaMemcpyDeviceToHost));
    QT_CUDA(cudaMemcpy(*ga, gl->ga, *n * 4, cudaMemcpyDeviceToHost));
    if (A) QT_CHECK(qt_lora_layout_init(A, &c.lora, &L.cfg, err, sizeof err) == 0, "%s", err);
    qt_gpu_model_free(g);
    qt_layout_free(&L);
    free(a), free(in), free(tg);
    return sum;
}

/* grad_dtype e4m3 against bf16 (recompute parts rc for both): the loss bitwise (the same e4m3 forward) and, per
 * adapter tensor, the gradient's cosine >= 0.98 and its norm within 5% of the bf16 backward's. The e4m3 dgrad rounds
 * dY and Wq^T to 3 mantissa bits (unit roundoff 2^-4, an RNE error of rms 2^-4 / sqrt(3) = 3.6% per element, zero
 * mean): each dx is about 5% off in relative L2 and the adapters' gradients, three blocks down, about as much, which
 * is a cosine of 0.998 and a norm within 0.2%; 0.98 and 5% leave room four-fold, and a wiring bug (a dx without the
 * adapters' part, a wrong scale) moves a tensor far more. Returns 1 when every bound holds; prints the worst. */
static int e4m3_tracks_bf16(const char *rc, int expect) {
    float *gb, *ge;
    size_t nb, ne;
    qt_lora_layout A;
    double lb = one_step("bf16", rc, &gb, &nb, &A), le = one_step("e4m3", rc, &ge, &ne, NULL);
    QT_CHECK(nb == ne && nb == A.numel, "adapter counts %zu, %zu", nb, ne);
    int ok = !memcmp(&lb, &le, sizeof lb);
    printf("  recompute [%s]: loss bf16 dgrad %.9g, e4m3 dgrad %.9g\n", rc, lb, le);
    if (expect) QT_EXPECT(ok, "the loss differs: %.9g with the bf16 dgrad, %.9g with the e4m3 one (the forward is the same)",
                          lb, le);
    double worst_cos = 2, worst_ratio = 1;
    const char *wc = "", *wr = "";
    for (int i = 0; i < A.n_tensors; i++) {
        const qt_lora_tensor *t = &A.tensors[i];
        double ab = 0, aa = 0, bb = 0;
        for (size_t j = t->offset; j < t->offset + t->numel; j++)
            ab += (double)gb[j] * ge[j], aa += (double)gb[j] * gb[j], bb += (double)ge[j] * ge[j];
        double cs = ab / (sqrt(aa * bb) + 1e-300), ratio = sqrt(bb / (aa + 1e-300));
        int good = aa > 0 && cs >= 0.98 && fabs(ratio - 1) <= 0.05;
        if (expect) QT_EXPECT(good, "%s: gradient cosine %.5f, norm ratio %.4f (bounds 0.98, 1 +- 0.05)", t->name, cs, ratio);
        ok &= good;
        if (cs < worst_cos) worst_cos = cs, wc = t->name;
        if (fabs(ratio - 1) > fabs(worst_ratio - 1)) worst_ratio = ratio, wr = t->name;
    }
    printf("  worst cosine %.5f (%s), worst norm ratio %.4f (%s)\n", worst_cos, wc, worst_ratio, wr);
    qt_lora_layout_free(&A);
    free(gb), free(ge);
    return ok;
}

static void test_gpu_e4m3_dgrad_grads(void) {
    if (!fp8_gpu()) QT_SKIP("no CUDA device with fp8 tensor cores (cc 8.9+)");
    e4m3_tracks_bf16("", 1);
}

/* The same with every part recomputed: the SwiGLU rebuilt after down's e4m3 dgrad, the adapters' inputs again. */
static void test_gpu_e4m3_dgrad_grads_recompute(void) {
    if (!fp8_gpu()) QT_SKIP("no CUDA device with fp8 tensor cores (cc 8.9+)");
    e4m3_tracks_bf16("block", 1);
}

/* The mutant build: the adapters' data gradient is left out of dx after the base's e4m3 dgrad; the comparison must
 * see it (with and without the SwiGLU recompute, whose down projection takes its own branch). */
static void test_gpu_mutant_no_bwd_x(void) {
    if (!fp8_gpu()) QT_SKIP("no CUDA device with fp8 tensor cores (cc 8.9+)");
    if (!QT_T_MUTANTS) QT_SKIP(QT_T_MUTANTS_ONLY);
    qt_t_hooks(NULL, QT_MUT_LORA_FP8_NO_BWD_X);
    int same = e4m3_tracks_bf16("", 0), same_rc = e4m3_tracks_bf16("swiglu", 0);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(!same && !same_rc, "the adapters' dx left out passes the comparison (caught: recompute none %d, swiglu "
              "%d): it cannot fail", !same, !same_rc);
}

int main(void) {
    QT_RUN(test_gpu_e4m3_dgrad_grads);
    QT_RUN(test_gpu_e4m3_dgrad_grads_recompute);
    QT_RUN(test_gpu_mutant_no_bwd_x);
    return qt_test_end();
}
