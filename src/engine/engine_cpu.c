/* engine_cpu.c — the CPU fp32 reference engine: qt_cpu_model + AdamW on host arrays.
 *
 * objective: dpo takes the reference's row log-probs from the trainer (set_dpo_ref: the stored reference of the
 * initial weights, qt_train_dpo_ref.h, which this engine's row_logps computed in a first pass): a micro-step is the
 * policy forward, the DPO loss against them and the backward (qt_dpo_cpu_step_stored); no second copy of the
 * weights is kept. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_cpu_model.h"
#include "qt_dpo.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_optim.h"
#include "qt_step_loss.h"

typedef struct {
    qt_engine base;
    qt_plan plan;         /* run and optimizer only (qt_plan_resolve for the CPU) */
    qt_cpu_model *model;
    float *w, *g, *m, *v; /* owned, L->numel each */
    qt_step_loss sl;      /* the micro-steps' losses since the last opt_step */
    long t;               /* the last opt_step's step */
    double *ref;          /* objective: dpo: [B] the reference log-probs of the next micro-batch's rows (set_dpo_ref) */
    int have_ref;         /* ref holds them */
    qt_dpo_log dpo;       /* the pairs' sums for the log */
} cpu_engine;

/* objective: dpo: the reference log-probs set_dpo_ref gave, else a failure naming what is missing. */
static const double *dpo_ref(const cpu_engine *c) {
    QT_CHECK(c->have_ref, "objective: dpo with full fine-tuning: no reference log-probs were given for this micro-batch "
             "(the trainer reads them from the pair shards' stored reference, <shard>.dporef; batches given by the caller "
             "have none)");
    return c->ref;
}

static void cpu_micro_step(qt_engine *e, const int32_t *in, const int32_t *tgt, float grad_scale) {
    cpu_engine *c = (cpu_engine *)e;
    if (c->ref) { /* grad_scale: the weight of one pair */
        qt_dpo_stats st = {0};
        double l = qt_dpo_cpu_step_stored(c->model, c->w, dpo_ref(c), in, tgt, c->plan.run.B, c->plan.run.T,
                                          &c->plan.dpo_cfg, 1, c->g, grad_scale, &st);
        qt_step_loss_add(&c->sl, (float)l, st.pairs);
        qt_dpo_stats_add(&c->dpo.acc, &st);
        return;
    }
    float l = qt_cpu_model_forward(c->model, c->w, in, tgt);
    qt_step_loss_add(&c->sl, l, qt_cpu_model_targets(c->model));
    qt_cpu_model_backward(c->model, c->w, c->g, grad_scale);
}

/* AdamW tensor by tensor so each gets its own weight decay; padding between groups has zero grads
 * and zero weights, so skipping it leaves it zero. */
static void cpu_opt_step(qt_engine *e, float lr, long t, float *loss, float *gnorm) {
    cpu_engine *c = (cpu_engine *)e;
    const qt_plan_optimizer *oc = &c->plan.optimizer;
    double norm = qt_grad_norm_cpu(c->g, e->L->numel);
    float scale = qt_clip_scale(norm, oc->grad_clip);
    qt_adamw_hp hp = {lr, oc->beta1, oc->beta2, oc->eps, oc->weight_decay};
    c->t = t;
    for (int i = 0; i < e->L->n_tensors; i++) {
        const qt_tensor *tt = &e->L->tensors[i];
        int decay = tt->is_matrix || (oc->decay_embeddings && (tt->kind == QT_T_EMBED || tt->kind == QT_T_LM_HEAD));
        size_t o = tt->offset;
        qt_adamw_cpu(c->w + o, c->g + o, c->m + o, c->v + o, tt->numel, &hp, decay ? oc->weight_decay : 0.0f,
                     t, scale);
    }
    memset(c->g, 0, e->L->numel * sizeof(float));
    *loss = qt_step_loss_take(&c->sl);
    *gnorm = (float)norm;
    qt_dpo_log_step(&c->dpo);
}

static float cpu_eval_loss(qt_engine *e, const int32_t *in, const int32_t *tgt) {
    cpu_engine *c = (cpu_engine *)e;
    if (c->ref)
        return (float)qt_dpo_cpu_step_stored(c->model, c->w, dpo_ref(c), in, tgt, c->plan.run.B, c->plan.run.T,
                                             &c->plan.dpo_cfg, 0, NULL, 0.0f, &c->dpo.eval);
    return qt_cpu_model_forward(c->model, c->w, in, tgt);
}

static void cpu_dpo_stats(qt_engine *e, int eval, qt_dpo_stats *s) { qt_dpo_log_take(&((cpu_engine *)e)->dpo, eval, s); }

static void cpu_row_logps(qt_engine *e, const int32_t *in, const int32_t *tgt, double *logp) {
    cpu_engine *c = (cpu_engine *)e;
    qt_dpo_cpu_row_logps(c->model, c->w, in, tgt, c->plan.run.B, c->plan.run.T, logp);
}

static void cpu_set_dpo_ref(qt_engine *e, const double *ref) {
    cpu_engine *c = (cpu_engine *)e;
    QT_CHECK(c->ref, "set_dpo_ref: the run's objective is not dpo");
    c->have_ref = ref != NULL;
    if (ref) memcpy(c->ref, ref, (size_t)c->plan.run.B * sizeof *c->ref);
}

static void cpu_get_weights(qt_engine *e, float *w) {
    memcpy(w, ((cpu_engine *)e)->w, e->L->numel * sizeof(float));
}

static void cpu_get_grads(qt_engine *e, float *g) {
    memcpy(g, ((cpu_engine *)e)->g, e->L->numel * sizeof(float));
}

static void cpu_forward_logits(qt_engine *e, const int32_t *in, float *logits) {
    cpu_engine *c = (cpu_engine *)e;
    qt_cpu_model_forward(c->model, c->w, in, NULL);
    memcpy(logits, qt_cpu_model_logits(c->model),
           (size_t)e->plan->run.B * e->plan->run.T * e->L->cfg.vocab_size * sizeof(float));
}

static int cpu_state_items(qt_engine *e, qt_ckpt_item *items, int cap) {
    cpu_engine *c = (cpu_engine *)e;
    size_t bytes = e->L->numel * sizeof(float);
    QT_CHECK(cap >= 3, "need room for 3 checkpoint items, got %d", cap);
    items[0] = (qt_ckpt_item){"weights", QT_DT_F32, c->w, bytes, 0};
    items[1] = (qt_ckpt_item){"adam_m", QT_DT_F32, c->m, bytes, 0};
    items[2] = (qt_ckpt_item){"adam_v", QT_DT_F32, c->v, bytes, 0};
    return 3;
}

static int cpu_load_state(qt_engine *e, const qt_ckpt *ck, char *err, size_t errlen) {
    cpu_engine *c = (cpu_engine *)e;
    const char *names[3] = {"weights", "adam_m", "adam_v"};
    float *dst[3] = {c->w, c->m, c->v};
    size_t want = e->L->numel * sizeof(float);
    for (int i = 0; i < 3; i++) {
        size_t bytes;
        int dt;
        const void *p = qt_ckpt_get(ck, names[i], &bytes, &dt);
        if (!p || bytes != want || dt != QT_DT_F32) {
            snprintf(err, errlen, "checkpoint blob %s: expected %zu bytes of fp32 (the CPU engine's state), got %s",
                     names[i], want, p ? "a different size or dtype" : "none");
            return -1;
        }
        memcpy(dst[i], p, want);
    }
    return 0;
}

static long cpu_nonfinite_weight(qt_engine *e, int settle, long *step) {
    (void)settle; /* checked at once: the update ran on this thread */
    const float *w = ((cpu_engine *)e)->w;
    *step = ((cpu_engine *)e)->t;
    for (size_t i = 0; i < e->L->numel; i++)
        if (!isfinite(w[i])) return (long)i;
    return -1;
}

static void cpu_free(qt_engine *e) {
    cpu_engine *c = (cpu_engine *)e;
    qt_cpu_model_free(c->model);
    free(c->w);
    free(c->g);
    free(c->m);
    free(c->v);
    free(c->ref);
    free(c);
}

static void cpu_set_docs(qt_engine *e, const qt_docs *d) {
    char err[256];
    QT_CHECK(qt_cpu_model_set_docs(((cpu_engine *)e)->model, d, err, sizeof err) == 0, "%s", err);
}

static const qt_engine_ops cpu_ops = {
    .name = "cpu-fp32",
    .micro_step = cpu_micro_step,
    .opt_step = cpu_opt_step,
    .eval_loss = cpu_eval_loss,
    .get_weights = cpu_get_weights,
    .get_grads = cpu_get_grads,
    .forward_logits = cpu_forward_logits,
    .state_items = cpu_state_items,
    .load_state = cpu_load_state,
    .nonfinite_weight = cpu_nonfinite_weight,
    .print_memory = NULL,
    .free = cpu_free,
    .set_docs = cpu_set_docs,
    .dpo_stats = cpu_dpo_stats,
    .row_logps = cpu_row_logps,
    .set_dpo_ref = cpu_set_dpo_ref,
};

qt_engine *qt_engine_cpu_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, char *err,
                                    size_t errlen) {
    cpu_engine *c = calloc(1, sizeof *c);
    QT_CHECK(c, "out of host memory");
    c->plan = *plan;
    c->base = (qt_engine){&cpu_ops, L, &c->plan, 1, NULL};
    size_t bytes = L->numel * sizeof(float);
    c->w = malloc(bytes);
    c->g = calloc(L->numel, sizeof(float));
    c->m = calloc(L->numel, sizeof(float));
    c->v = calloc(L->numel, sizeof(float));
    QT_CHECK(c->w && c->g && c->m && c->v, "out of host memory for %zu parameters", L->numel);
    if (qt_weight_src_fill(src, 0, L->numel, c->w, err, errlen)) { /* its own fp32 weights, straight from the source */
        free(c->w), free(c->g), free(c->m), free(c->v), free(c);
        return NULL;
    }
    c->model = qt_cpu_model_create(L, plan->run.B, plan->run.T);
    if (plan->dpo) QT_CHECK(c->ref = malloc((size_t)plan->run.B * sizeof *c->ref), "out of host memory");
    return &c->base;
}
