/* tool_lora_dump_gpu.c — tool_lora_dump's run on the GPU: one micro-batch of an HF model with PEFT adapters through
 * the GPU model over its frozen bf16 base (qt_gpu_model with qt_gpu_lora), the same arguments and outputs:
 *   tool_lora_dump_gpu HF_DIR ADAPTER TOKENS.i32 B T OUT_DIR R ALPHA RSLORA TARGETS DROPOUT SEED 0
 * OUT_DIR/logits.f32 [B*T, V] (the forward with the masks of step 1, micro-batch 0 under SEED), OUT_DIR/loss.txt and
 * OUT_DIR/adapter_model.safetensors holding the adapters' gradients of the mean loss under their PEFT names (the
 * masks are tool_lora_dump's: its masks.f32 serves both), and with TRAINABLE the trained base tensors' gradients under
 * PEFT's modules_to_save names (their weights taken from ADAPTER into the base the GPU reads). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_engine.h"
#include "qt_gpu_lora.h"
#include "qt_gpu_model.h"
#include "lora_dump.h"

static int die(const char *what, const char *err) {
    fprintf(stderr, "tool_lora_dump_gpu: %s: %s\n", what, err);
    return 1;
}

int main(int argc, char **argv) {
    static qt_config cfg;
    char err[2048];
    uint64_t seed;
    if (lora_dump_args(argc, argv, "tool_lora_dump_gpu", &cfg, &seed)) return 2;
    int B = cfg.data.micro_batch, T = cfg.data.seq_len;
    long N = (long)B * T;
    cfg.device = QT_DEVICE_CUDA;
    cfg.seed = seed; /* the plan's optimizer.seed: the masks' */
    qt_layout L;
    qt_weight_src src;
    qt_plan plan;
    if (qt_model_layout(&cfg, &L, &src, err, sizeof err)) return die(argv[1], err);
    if (qt_plan_resolve(&cfg, &L, 0, &plan, err, sizeof err)) return die("plan", err);
    qt_gpu_model *g = qt_gpu_model_create(&L, &plan, &src, NULL, err, sizeof err);
    if (!g) return die("GPU model", err);
    qt_gpu_lora *gl = g->lora;
    size_t n = gl->n; /* the adapters, then the trained base tensors packed (qt_gpu_lora.h) */
    float *a = malloc(n * sizeof *a), *ga = malloc(n * sizeof *ga), *w = calloc(L.numel, sizeof *w);
    float *logits = malloc((size_t)N * L.cfg.vocab_size * sizeof *logits);
    int32_t *in = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    if (qt_lora_import(argv[2], &gl->A, a, &L, w, err, sizeof err)) return die(argv[2], err);
    for (int i = 0; i < gl->nxt; i++) { /* the file's trained base tensors in place of the base's */
        const qt_tensor *t = &L.tensors[gl->xt[i]];
        memcpy(a + gl->xat[i], w + t->offset, t->numel * sizeof *a);
    }
    if (lora_dump_tokens(argv[3], B, T, in, tgt)) return die(argv[3], "short");
    cudaMemcpy(gl->a, a, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(g->tok, in, N * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(g->tgt, tgt, N * 4, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); /* the model's stream is non-blocking: the legacy stream's copies order nothing on it */
    qt_gpu_lora_refresh(gl, g->stream); /* the imported adapters into the kernels' bf16 copy, the base tensors into the base */
    qt_gpu_lora_set_batch(gl, 1, 0);
    qt_gpu_step_args sa = {qt_loss_scale(1, 1, N), 1, 0, NULL};
    qt_gpu_model_step(g, &sa);
    cudaStreamSynchronize(g->stream); /* the backward's last kernels (layer 0's) before ga is read */
    double sum;
    cudaMemcpy(&sum, g->head.loss_sum, 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(ga, gl->ga, n * 4, cudaMemcpyDeviceToHost);
    qt_gpu_model_logits(g, NULL, logits); /* the masks of step 1, micro-batch 0 still */
    if (cudaGetLastError() != cudaSuccess) return die("GPU", "a CUDA call failed");
    lora_dump_write(argv[6], logits, (size_t)N * L.cfg.vocab_size, sum / N);
    if (qt_lora_export_packed(argv[6], &gl->A, ga, &L, ga + gl->A.numel, "", err, sizeof err)) return die(argv[6], err);
    qt_gpu_model_free(g);
    qt_layout_free(&L);
    free(a), free(ga), free(w), free(logits), free(in), free(tgt);
    return 0;
}
