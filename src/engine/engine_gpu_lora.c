/* engine_gpu_lora.c — LoRA adapters trained on one GPU over a frozen base (qt_gpu_model with a qt_gpu_base
 * placement and qt_gpu_lora adapters).
 *
 * The base has no gradient and no optimizer state; the adapters, their gradients and AdamW moments are fp32 on
 * the device. A micro-step uploads the tokens, names the dropout masks' step and micro-batch (the CPU LoRA
 * engine's rule, so the two engines draw the same masks) and runs the forward and backward eagerly (no CUDA
 * graphs); with precision.matmul_dtype e4m3 the block matmuls' forward runs in fp8 from the base quantized once, at
 * creation (it never changes), and the base's data gradient in bf16 or, with precision.grad_dtype e4m3 / e5m2, in
 * fp8 (the adapters' gradients in bf16 either way). opt_step: the adapters' gradient norm, clip, AdamW,
 * gradients zeroed, one host read of loss and norm.
 * lora.trainable's base tensors (embeddings, LM head, norms) train beside the adapters, fp32 in the same arrays
 * (qt_gpu_lora.h), their bf16 rounding written into the base the model reads.
 * Checkpoints hold the CPU LoRA engine's blobs (qt_lora_ckpt.h, lora_extras), copied to the host; the export is
 * PEFT's adapter files with the trained base tensors as modules_to_save (qt_lora_export_packed); get_weights gives
 * the merged model (the bf16 base widened, the trained tensors' fp32, + scale B A).
 * With objective: dpo a micro-step is qt_gpu_dpo_step: the reference log-probs come from the same base with the
 * adapters switched off (one more forward, no memory), the loss and the rows' gradient weights from the host. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_gpu_dpo.h"
#include "qt_gpu_lora.h"
#include "qt_gpu_model.h"
#include "qt_lora_ckpt.h"
#include "qt_matmul.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

typedef struct {
    qt_engine base;
    qt_plan plan;
    qt_gpu_model *g;
    qt_gpu_lora *gl;          /* g->lora */
    float *ha, *hm, *hv;      /* host copies of the adapters and moments, the trained base tensors' after them [gl->n]
                               * (checkpoints, export) */
    int32_t *none;            /* [N] of -1: the targets of a forward without loss */
    char from[QT_PATH_MAX];   /* the base's source path ("" for the seeded init) */
    char id[QT_PATH_MAX + 200]; /* the base's identity (qt_gpu_base.id) + " from <source>" */
    size_t id_key;            /* the part a resume must match */
    int64_t step_blob;
    long t;                   /* the last opt_step's step */
    long micro;               /* micro-steps since the last opt_step */
    long valid_total;         /* targets >= 0 since the last opt_step */
    int bad;                  /* a step's gradient norm was not finite: the adapters are checked */
    int device;               /* its CUDA device: every op makes it current first */
    int rank, nranks;         /* its place among data-parallel ranks (0, 1 alone): the masks' micro-batch index is
                               * micro * nranks + rank, the step's global one */
    double last_sum;          /* the last opt_step's token losses and targets (the ranks' mean is sum / sum) */
    long last_valid;
    qt_gpu_dpo *dpo;          /* objective: dpo: the micro-steps' host buffers (owned), else NULL */
    qt_dpo_log dlog;          /* objective: dpo: the pairs' sums for the log */
    double dpo_sum;           /* objective: dpo: the pairs' losses since the last opt_step (valid_total counts the
                               * pairs; last_sum and last_valid then hold pair losses and pairs) */
} glora_engine;

/* The engine of b with its device made current. */
static glora_engine *on(qt_engine *b) {
    glora_engine *e = (glora_engine *)b;
    QT_CUDA(cudaSetDevice(e->device));
    return e;
}

/* The tokens up (tgt NULL: all ignored); returns the targets >= 0. */
static long upload(glora_engine *e, const int32_t *in, const int32_t *tgt) {
    qt_gpu_model *g = e->g;
    long valid = 0;
    for (long i = 0; tgt && i < g->N; i++) valid += tgt[i] >= 0;
    QT_CUDA(cudaMemcpyAsync(g->tok, in, g->N * 4, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaMemcpyAsync(g->tgt, tgt ? tgt : e->none, g->N * 4, cudaMemcpyHostToDevice, g->stream));
    return valid;
}

/* objective: dpo: one micro-batch of pairs (backward 1: grad_scale is the weight of one pair) into stats st; the
 * pairs' mean loss. */
static double dpo_step(glora_engine *e, const int32_t *tgt, int backward, float grad_scale, qt_dpo_stats *st) {
    return qt_gpu_dpo_step(e->dpo, e->g, tgt, &e->plan.dpo_cfg, backward, grad_scale, st);
}

static void glora_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    glora_engine *e = on(b);
    long valid = upload(e, in, tgt);
    qt_gpu_lora_set_batch(e->gl, e->t + 1, e->micro++ * e->nranks + e->rank);
    if (e->dpo) { /* the step's loss: the mean over its pairs */
        qt_dpo_stats st = {0};
        e->dpo_sum += dpo_step(e, tgt, 1, grad_scale, &st) * st.pairs;
        e->valid_total += st.pairs;
        qt_dpo_stats_add(&e->dlog.acc, &st);
        return;
    }
    e->valid_total += valid;
    qt_gpu_step_args a = {grad_scale, 1, 0, NULL};
    qt_gpu_model_step(e->g, &a);
}

static void glora_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    glora_engine *e = on(b);
    qt_gpu_model *g = e->g;
    cudaStream_t s = g->stream;
    double sum;
    qt_gpu_lora_opt_step(e->gl, &e->plan.optimizer, lr, t, s);
    QT_CUDA(cudaMemcpyAsync(&sum, g->head.loss_sum, 8, cudaMemcpyDeviceToHost, s));
    QT_CUDA(cudaMemcpyAsync(gnorm, e->gl->norm, 4, cudaMemcpyDeviceToHost, s));
    qt_zero(g->head.loss_sum, 8, s);
    QT_CUDA(cudaStreamSynchronize(s));
    qt_gpu_model_profile_collect(g);
    if (e->dpo) { /* the pairs' losses, summed by the micro-steps */
        sum = e->dpo_sum;
        e->dpo_sum = 0;
        qt_dpo_log_step(&e->dlog);
    }
    *loss = e->valid_total ? (float)(sum / e->valid_total) : 0.0f;
    e->last_sum = sum;
    e->last_valid = e->valid_total;
    e->bad |= !isfinite(*gnorm);
    e->t = t;
    e->micro = 0;
    e->valid_total = 0;
}

static float glora_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    glora_engine *e = on(b);
    qt_gpu_model *g = e->g;
    double sum;
    long valid = upload(e, in, tgt);
    qt_gpu_lora_set_batch(e->gl, -1, 0);
    if (e->dpo) return (float)dpo_step(e, tgt, 0, 0.0f, &e->dlog.eval);
    qt_gpu_step_args a = {0.0f, 0, 0, NULL};
    qt_gpu_model_step(g, &a);
    QT_CUDA(cudaMemcpyAsync(&sum, g->head.loss_sum, 8, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->head.loss_sum, 8, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return valid ? (float)(sum / valid) : 0.0f;
}

/* The adapters (and with moments 1 m and v) into the host copies. */
static void download(glora_engine *e, int moments) {
    size_t bytes = e->gl->n * sizeof(float);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    QT_CUDA(cudaMemcpy(e->ha, e->gl->a, bytes, cudaMemcpyDeviceToHost));
    if (!moments) return;
    QT_CUDA(cudaMemcpy(e->hm, e->gl->m, bytes, cudaMemcpyDeviceToHost));
    QT_CUDA(cudaMemcpy(e->hv, e->gl->v, bytes, cudaMemcpyDeviceToHost));
}

/* The merged model: the base as the GPU holds it (the trained base tensors' fp32 master) + scale B A on the adapted
 * rows. */
static void glora_get_weights(qt_engine *b, float *w) {
    glora_engine *e = on(b);
    const qt_gpu_lora *gl = e->gl;
    download(e, 0);
    e->g->base->ops->get(e->g->base, w);
    for (int i = 0; i < gl->nxt; i++) {
        const qt_tensor *t = &b->L->tensors[gl->xt[i]];
        memcpy(w + t->offset, e->ha + gl->xat[i], t->numel * sizeof *w);
    }
    qt_lora_merge(&gl->A, b->L, e->ha, w);
}

static void glora_dpo_stats(qt_engine *b, int eval, qt_dpo_stats *s) { qt_dpo_log_take(&((glora_engine *)b)->dlog, eval, s); }

static void glora_get_grads(qt_engine *b, float *g) { memset(g, 0, b->L->numel * sizeof *g); } /* the base has none */

static void glora_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    glora_engine *e = on(b);
    upload(e, in, NULL);
    qt_gpu_lora_set_batch(e->gl, -1, 0);
    qt_gpu_model_logits(e->g, NULL, logits);
}

/* The trained base tensors' blobs (the CPU LoRA engine's: their weights, m and v packed in layout order). */
static const char *const extra_items[3] = {"lora_extras", "lora_extras_m", "lora_extras_v"};

static int glora_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    glora_engine *e = on(b);
    const qt_gpu_lora *gl = e->gl;
    QT_CHECK(cap >= 8, "need room for 8 checkpoint items, got %d", cap);
    download(e, 1);
    e->step_blob = e->t;
    int n = qt_lora_ckpt_items(items, e->ha, e->hm, e->hv, gl->A.numel, e->id, &e->step_blob);
    float *x[3] = {e->ha, e->hm, e->hv};
    for (int k = 0; k < 3 && gl->nxt; k++)
        items[n++] = (qt_ckpt_item){extra_items[k], QT_DT_F32, x[k] + gl->A.numel, gl->xn * sizeof(float), 0};
    return n;
}

static int glora_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    glora_engine *e = on(b);
    const qt_lora_layout *A = &e->gl->A;
    size_t bytes = e->gl->n * sizeof(float), xb = e->gl->xn * sizeof(float), got;
    long t;
    int dt;
    if (qt_lora_ckpt_load(ck, e->ha, e->hm, e->hv, A->numel, A->cfg.rank, e->id, e->id_key, &t, err, errlen)) return -1;
    float *x[3] = {e->ha, e->hm, e->hv};
    for (int k = 0; k < 3 && e->gl->nxt; k++) {
        const void *p = qt_ckpt_get(ck, extra_items[k], &got, &dt);
        if (!p || got != xb || dt != QT_DT_F32)
            return qt_errf(err, errlen, "checkpoint blob %s: expected %zu bytes of fp32 (the base tensors lora.trainable "
                           "names), got %s", extra_items[k], xb, p ? "a different size or dtype" : "none");
        memcpy(x[k] + A->numel, p, xb);
#ifdef QT_MUTANTS
        if (k && qt_mutant_on(QT_MUT_LORA_X_RESUME_MOMENTS)) memset(x[k] + A->numel, 0, xb);
#endif
    }
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    /* on the model's stream: a synchronous copy from pageable memory may return before its DMA lands, and the
     * (non-blocking) stream's next kernels would not wait for it */
    QT_CUDA(cudaMemcpyAsync(e->gl->a, e->ha, bytes, cudaMemcpyHostToDevice, e->g->stream));
    QT_CUDA(cudaMemcpyAsync(e->gl->m, e->hm, bytes, cudaMemcpyHostToDevice, e->g->stream));
    QT_CUDA(cudaMemcpyAsync(e->gl->v, e->hv, bytes, cudaMemcpyHostToDevice, e->g->stream));
    qt_gpu_lora_refresh(e->gl, e->g->stream);
    e->t = t;
    return 0;
}

/* A NaN/Inf adapter: the first weight of the base rows it adapts. Checked once a step's norm was not finite (a
 * finite norm clips to finite updates of finite adapters), and before a checkpoint (settle). */
static long glora_nonfinite_weight(qt_engine *b, int settle, long *step) {
    glora_engine *e = on(b);
    const qt_lora_layout *A = &e->gl->A;
    *step = e->t;
    if (!e->bad && !settle) return -1;
    download(e, 0);
    for (int i = 0; i < A->n_tensors; i++)
        for (size_t j = 0; j < A->tensors[i].numel; j++)
            if (!isfinite(e->ha[A->tensors[i].offset + j])) return (long)qt_lora_base_offset(A, b->L, i / 2);
    for (int i = 0; i < e->gl->nxt; i++) { /* a trained base tensor: its own index */
        const qt_tensor *t = &b->L->tensors[e->gl->xt[i]];
        for (size_t j = 0; j < t->numel; j++)
            if (!isfinite(e->ha[e->gl->xat[i] + j])) return (long)(t->offset + j);
    }
    return -1;
}

static int glora_export_adapter(qt_engine *b, const char *dir, char *err, size_t errlen) {
    glora_engine *e = on(b);
    download(e, 0);
    return qt_lora_export_packed(dir, &e->gl->A, e->ha, b->L, e->ha + e->gl->A.numel, e->from, err, errlen);
}

static void glora_print_memory(qt_engine *b) { qt_gpu_model_print_plan(on(b)->g); }

static void glora_free(qt_engine *b) {
    glora_engine *e = on(b);
    qt_gpu_dpo_free(e->dpo);
    qt_gpu_model_free(e->g);
    free(e->ha), free(e->hm), free(e->hv), free(e->none);
    free(e);
}

static void glora_set_docs(qt_engine *b, const qt_docs *d) {
    char err[512];
    QT_CHECK(qt_gpu_model_set_docs(on(b)->g, d, err, sizeof err) == 0, "%s", err);
}

static void glora_profile(qt_engine *b, int yes) { qt_gpu_model_profile(on(b)->g, yes); }
static void glora_profile_print(qt_engine *b, int steps) { qt_gpu_model_profile_print(on(b)->g, steps); }

/* The same ops under the name the run's log shows. */
#define GLORA_OPS(nm)                                                                                              \
    {.name = nm, .micro_step = glora_micro_step, .opt_step = glora_opt_step, .eval_loss = glora_eval_loss,         \
     .get_weights = glora_get_weights, .get_grads = glora_get_grads, .forward_logits = glora_forward_logits,       \
     .state_items = glora_state_items, .load_state = glora_load_state, .nonfinite_weight = glora_nonfinite_weight, \
     .tuning_save = qt_engine_gpu_tuning_save, .tuning_load = qt_engine_gpu_tuning_load,                           \
     .print_memory = glora_print_memory, .profile = glora_profile, .profile_print = glora_profile_print,           \
     .free = glora_free, .set_docs = glora_set_docs, .export_adapter = glora_export_adapter, \
     .dpo_stats = glora_dpo_stats}
static const qt_engine_ops glora_ops = GLORA_OPS("cuda-bf16-lora"),
                           glora_fp8_ops = GLORA_OPS("cuda-fp8-lora (e4m3 block matmuls, bf16 backward)"),
                           glora_fp8_bwd_ops = GLORA_OPS("cuda-fp8-lora (e4m3 block matmuls, fp8 data gradient)");

qt_engine *qt_engine_gpu_lora_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                     char *err, size_t errlen) {
    if (qt_engine_gpu_select(L, plan, device, err, errlen)) return NULL;
    glora_engine *e = calloc(1, sizeof *e);
    QT_CHECK(e, "out of host memory");
    e->plan = *plan;
    e->base = (qt_engine){plan->precision.fp8_bwd ? &glora_fp8_bwd_ops : plan->precision.fp8 ? &glora_fp8_ops : &glora_ops, L,
                          &e->plan, 1, NULL};
    e->device = device;
    e->nranks = 1;
    e->g = qt_gpu_model_create(L, &e->plan, src, NULL, err, errlen); /* no shard: the frozen base has no store */
    if (!e->g) {
        free(e);
        return NULL;
    }
    e->gl = e->g->lora;
    size_t n = e->gl->n;
    e->ha = malloc(n * sizeof *e->ha);
    e->hm = malloc(n * sizeof *e->hm);
    e->hv = malloc(n * sizeof *e->hv);
    e->none = malloc(e->g->N * sizeof *e->none);
    QT_CHECK(e->ha && e->hm && e->hv && e->none, "out of host memory for %zu adapter parameters", n);
    memset(e->none, 0xff, e->g->N * sizeof *e->none);
    if (plan->dpo) e->dpo = qt_gpu_dpo_create(e->g);
    qt_mem_plan_add(&e->g->plan, QT_MEM_PAGEABLE, "checkpoint snapshot", 3 * n * sizeof(float));
    snprintf(e->from, sizeof e->from, "%s", src->kind == QT_WSRC_HF ? src->path : "");
    e->id_key = (size_t)snprintf(e->id, sizeof e->id, "%s", e->g->base->id);
    snprintf(e->id + e->id_key, sizeof e->id - e->id_key, " from %s", src->kind == QT_WSRC_HF ? src->path : "init");
    const qt_lora_layout *A = &e->gl->A;
    printf("qtrain: LoRA rank %d, alpha %g%s (scale %g), dropout %g: %zu adapter parameters in %d modules over a "
           "frozen %s base of %zu on the GPU\n", A->cfg.rank, (double)A->cfg.alpha, A->cfg.rslora ? ", rsLoRA" : "",
           (double)A->scale, (double)A->cfg.dropout, A->numel, A->n_layers * A->per_layer, e->g->base->ops->name, L->n_params);
    if (e->gl->nxt)
        printf("qtrain: LoRA trains %zu base parameters in %d tensors beside the adapters\n", e->gl->xn, e->gl->nxt);
    return &e->base;
}

/* ---- data parallel: one such engine per rank, the adapters replicated ----
 * The ranks' micro-steps are enqueued from this thread, each on its own device and stream. opt_step sums the
 * adapter gradients over the ranks in rank order (through host memory: fp32 adds, the same bits as one GPU
 * accumulating the ranks' micro-batches one after another), gives every rank the sum, and each runs the same
 * AdamW on the same bits; rank 0's state is the checkpoint's and the export's. A streamed base (memory.offload:
 * [weights]) is pinned once, by rank 0; every other rank borrows that copy (qt_weight_src.base_host) and streams its
 * layers into its own GPU's slots. */
typedef struct {
    qt_engine base;
    qt_plan plan;
    int n;
    glora_engine *rk[QT_LORA_DP_MAX];
    float *sum, *part;        /* host [gl->n]: the gradients' sum and one rank's */
} glora_dp;

static long dp_tokens(const glora_dp *d) { return d->rk[0]->g->N; }

static void dp_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    glora_dp *d = (glora_dp *)b;
    long N = dp_tokens(d);
    for (int r = 0; r < d->n; r++) glora_micro_step(&d->rk[r]->base, in + r * N, tgt + r * N, grad_scale);
}

static void dp_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    glora_dp *d = (glora_dp *)b;
    size_t n = d->rk[0]->gl->n;
    for (int r = 0; r < d->n; r++) {
        glora_engine *e = on(&d->rk[r]->base);
        QT_CUDA(cudaStreamSynchronize(e->g->stream));
        QT_CUDA(cudaMemcpy(r ? d->part : d->sum, e->gl->ga, n * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; r && i < n; i++) d->sum[i] += d->part[i];
    }
    double sum = 0;
    long valid = 0;
    float g0 = 0;
    for (int r = 0; r < d->n; r++) {
        glora_engine *e = on(&d->rk[r]->base);
        /* ordered before the optimizer's kernels on the rank's non-blocking stream (a synchronous copy from pageable
         * memory may return before its DMA lands) */
        QT_CUDA(cudaMemcpyAsync(e->gl->ga, d->sum, n * 4, cudaMemcpyHostToDevice, e->g->stream));
        float l, g;
        glora_opt_step(&e->base, lr, t, &l, &g);
        QT_CHECK(r == 0 || !memcmp(&g, &g0, 4), "step %ld: rank %d's gradient norm %.9g differs from rank 0's %.9g: the "
                 "replicas diverged", t, r, g, g0);
        g0 = r ? g0 : g;
        sum += e->last_sum;
        valid += e->last_valid;
    }
    *loss = valid ? (float)(sum / valid) : 0.0f;
    *gnorm = g0;
}

/* The ranks' mean losses, summed in rank order. */
static float dp_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    glora_dp *d = (glora_dp *)b;
    long N = dp_tokens(d);
    float sum = 0;
    for (int r = 0; r < d->n; r++) sum += glora_eval_loss(&d->rk[r]->base, in + r * N, tgt + r * N);
    return sum;
}

/* objective: dpo: the ranks' pairs together. */
static void dp_dpo_stats(qt_engine *b, int eval, qt_dpo_stats *s) {
    glora_dp *d = (glora_dp *)b;
    *s = (qt_dpo_stats){0};
    for (int r = 0; r < d->n; r++) {
        qt_dpo_stats one;
        glora_dpo_stats(&d->rk[r]->base, eval, &one);
        qt_dpo_stats_add(s, &one);
    }
}

static void dp_get_weights(qt_engine *b, float *w) { glora_get_weights(&((glora_dp *)b)->rk[0]->base, w); }
static void dp_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    glora_forward_logits(&((glora_dp *)b)->rk[0]->base, in, logits);
}
static int dp_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    return glora_state_items(&((glora_dp *)b)->rk[0]->base, items, cap);
}

static int dp_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    glora_dp *d = (glora_dp *)b;
    for (int r = 0; r < d->n; r++)
        if (glora_load_state(&d->rk[r]->base, ck, err, errlen)) return -1;
    return 0;
}

static long dp_nonfinite_weight(qt_engine *b, int settle, long *step) {
    return glora_nonfinite_weight(&((glora_dp *)b)->rk[0]->base, settle, step);
}
static int dp_export_adapter(qt_engine *b, const char *dir, char *err, size_t errlen) {
    return glora_export_adapter(&((glora_dp *)b)->rk[0]->base, dir, err, errlen);
}
static void dp_print_memory(qt_engine *b) {
    glora_dp *d = (glora_dp *)b;
    printf("qtrain: %d data-parallel LoRA ranks, each with the plan of rank 0:\n", d->n);
    glora_print_memory(&d->rk[0]->base);
}

static void dp_free(qt_engine *b) {
    glora_dp *d = (glora_dp *)b;
    for (int r = d->n - 1; r >= 0; r--) /* rank 0 last: a streamed base's pinned copy is its, read by the others */
        if (d->rk[r]) glora_free(&d->rk[r]->base);
    free(d->sum), free(d->part);
    free(d);
}

static const qt_engine_ops glora_dp_ops = {
    .name = "cuda-lora x ranks (data parallel, adapters replicated)",
    .micro_step = dp_micro_step, .opt_step = dp_opt_step, .eval_loss = dp_eval_loss, .get_weights = dp_get_weights,
    .get_grads = glora_get_grads, .forward_logits = dp_forward_logits, .state_items = dp_state_items,
    .load_state = dp_load_state, .nonfinite_weight = dp_nonfinite_weight, .tuning_save = qt_engine_gpu_tuning_save,
    .tuning_load = qt_engine_gpu_tuning_load, .print_memory = dp_print_memory, .free = dp_free,
    .export_adapter = dp_export_adapter, .dpo_stats = dp_dpo_stats};

qt_engine *qt_engine_gpu_lora_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                        const int *devices, char *err, size_t errlen) {
    QT_CHECK(n >= 1 && n <= QT_LORA_DP_MAX, "LoRA data parallel: %d ranks, expected 1..%d", n, QT_LORA_DP_MAX);
    glora_dp *d = calloc(1, sizeof *d);
    QT_CHECK(d, "out of host memory");
    d->plan = *plan;
    d->n = n;
    d->base = (qt_engine){&glora_dp_ops, L, &d->plan, n, NULL};
    qt_weight_src from = *src; /* after rank 0: its streamed base's pinned copy, which the others borrow */
    for (int r = 0; r < n; r++) {
        qt_engine *e = qt_engine_gpu_lora_create(L, plan, &from, devices[r], err, errlen);
        if (!e) {
            dp_free(&d->base);
            return NULL;
        }
        d->rk[r] = (glora_engine *)e;
        d->rk[r]->rank = r;
        d->rk[r]->nranks = n;
        const qt_gpu_base *base = d->rk[r]->g->base;
        if (!r && base->ops->host) from.base_host = base->ops->host(base);
        QT_CHECK(!strcmp(base->id, d->rk[0]->g->base->id), "LoRA data parallel: rank %d read the base as \"%s\", rank 0 "
                 "as \"%s\"", r, base->id, d->rk[0]->g->base->id);
    }
    size_t numel = d->rk[0]->gl->n;
    d->sum = malloc(numel * sizeof *d->sum);
    d->part = malloc(numel * sizeof *d->part);
    QT_CHECK(d->sum && d->part, "out of host memory for the adapters' gradient sum (%zu floats)", numel);
    return &d->base;
}
