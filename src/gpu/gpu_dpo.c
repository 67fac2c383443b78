/* gpu_dpo.c — objective: dpo micro-batches on the GPU LoRA model (qt_gpu_dpo.h): two forwards, the DPO arithmetic
 * on the host in double (qt_dpo.h, the CPU engines' code), the backward with per-row loss weights. */
#include "qt_gpu_dpo.h"

#include <cuda_runtime.h>
#include <stdlib.h>

#include "qt_error.h"
#include "qt_gpu_lora.h"

struct qt_gpu_dpo {
    float *losses;  /* [N]: a forward's token losses */
    double *lp;     /* [2B]: the policy's row log-probs, then the reference's */
    float *scale;   /* [B]: each row's loss weight in the backward */
};

qt_gpu_dpo *qt_gpu_dpo_create(const qt_gpu_model *g) {
    QT_CHECK(g->lora, "objective: dpo on the GPU: LoRA only (the frozen base is the reference)");
    QT_CHECK(g->B >= 2 && g->B % 2 == 0, "objective: dpo: a micro-batch of %d rows (expected pairs: an even count)", g->B);
    qt_gpu_dpo *d = calloc(1, sizeof *d);
    QT_CHECK(d, "out of host memory");
    d->losses = malloc(g->N * sizeof *d->losses);
    d->lp = malloc(2 * (size_t)g->B * sizeof *d->lp);
    d->scale = malloc((size_t)g->B * sizeof *d->scale);
    QT_CHECK(d->losses && d->lp && d->scale, "out of host memory");
    return d;
}

void qt_gpu_dpo_free(qt_gpu_dpo *d) {
    if (!d) return;
    free(d->losses), free(d->lp), free(d->scale);
    free(d);
}

/* A forward (loss only) of the tokens in g with the adapters on or off; its row log-probs into logp [B]. */
static void row_logps(qt_gpu_dpo *d, qt_gpu_model *g, int adapters, const int32_t *tgt, double *logp) {
    qt_gpu_lora_set_on(g->lora, adapters);
    qt_gpu_step_args a = {0.0f, 0, 0, NULL};
    qt_gpu_model_step(g, &a);
    QT_CUDA(cudaMemcpyAsync(d->losses, g->head.losses, g->N * sizeof *d->losses, cudaMemcpyDeviceToHost, g->stream));
    QT_CUDA(cudaStreamSynchronize(g->stream));
    qt_dpo_row_logps(logp, d->losses, tgt, g->B, g->T);
}

double qt_gpu_dpo_step(qt_gpu_dpo *d, qt_gpu_model *g, const int32_t *tgt, const qt_dpo_cfg *c, int backward,
                       float pair_weight, qt_dpo_stats *st) {
    int B = g->B;
    row_logps(d, g, 0, tgt, d->lp + B); /* the reference: the frozen base */
    row_logps(d, g, 1, tgt, d->lp);     /* the policy, last: its activations stay for the backward */
    qt_zero(g->head.loss_sum, 8, g->stream); /* the token losses' sum means nothing here: the loss is the pairs' */
    double loss = qt_dpo_batch(c, d->lp, d->lp + B, B, pair_weight, d->scale, st);
    if (backward) qt_gpu_model_backward_rows(g, d->scale);
    return loss;
}
