/* engine_cpu_lora.c — the CPU fp32 engine training LoRA adapters (qt_lora.h) over a frozen base.
 *
 * The base lives in one fp32 array with no gradient and no optimizer state; qt_cpu_model runs it with the
 * adapters beside its block matmuls (qt_lora_cpu) and a NULL base gradient. AdamW updates the adapter array
 * only; with lora.trainable also the base tensors it names (the model then writes their gradients, and only
 * theirs, into base-sized gradient and moment arrays whose other pages are never touched). Checkpoints hold the adapters, the trained base tensors, their m and v, the step
 * the dropout masks continue from and the base's identity (its source and a CRC-32C of its fp32 bytes as
 * loaded): a resume over another base is refused. With lora.base_dtype nf4 the block matrices are replaced at load
 * by their NF4 round trip (nf4_base): the values a QLoRA base computes with, bitsandbytes' layout.
 * get_weights gives the merged model (base + scale B A), which the HF export writes; the engine's own
 * export is PEFT's adapter files. With objective: dpo a micro-step is qt_dpo_cpu_step: the reference log-probs
 * come from the same base with the adapters switched off, so the reference model costs one forward and no
 * memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_cpu_model.h"
#include "qt_crc32c.h"
#include "qt_dpo.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_lora_ckpt.h"
#include "qt_lora_cpu.h"
#include "qt_nf4.h"
#include "qt_optim.h"
#include "qt_step_loss.h"

typedef struct {
    qt_engine base;
    qt_plan plan;
    qt_cpu_model *model;
    float *w;               /* the base [L->numel], frozen but for lora.trainable's tensors */
    qt_lora_layout A;
    float *a, *g, *m, *v;   /* adapters, their gradients and AdamW moments [A.numel] */
    float *xg, *xm, *xv;    /* the trained base tensors' gradients and moments [L->numel] (NULL: none train) */
    int *xt, nxt;           /* their indices in L->tensors */
    size_t xn;              /* their elements */
    float *xpack[3];        /* [xn] each: weights, m, v packed for a checkpoint */
    qt_lora_cpu *lc;
    char from[QT_PATH_MAX]; /* the base's source (init.from, or "init") */
    char id[QT_PATH_MAX + 64]; /* "crc32c <hex> numel <n> from <source>": the checkpoint's lora_base */
    size_t id_key;          /* the part of id a resume must match (up to " from ": the base may move) */
    int64_t step_blob;      /* the last opt_step's step, as the checkpoint's lora_step */
    qt_step_loss sl;        /* the micro-steps' losses since the last opt_step */
    long t;                 /* the last opt_step's step */
    qt_dpo_log dpo;         /* objective: dpo: the pairs' sums for the log */
} lora_engine;

static void lora_micro_step(qt_engine *e, const int32_t *in, const int32_t *tgt, float grad_scale) {
    lora_engine *c = (lora_engine *)e;
    qt_lora_cpu_set_batch(c->lc, c->t + 1, c->sl.n_micro);
    if (c->plan.dpo) { /* grad_scale: the weight of one pair */
        qt_dpo_stats st = {0};
        double l = qt_dpo_cpu_step(c->model, c->w, qt_lora_cpu_adapter(c->lc), c->w, in, tgt, c->plan.run.B,
                                   c->plan.run.T, &c->plan.dpo_cfg, 1, c->xg, grad_scale, &st);
        qt_step_loss_add(&c->sl, (float)l, st.pairs);
        qt_dpo_stats_add(&c->dpo.acc, &st);
        return;
    }
    float l = qt_cpu_model_forward(c->model, c->w, in, tgt);
    qt_step_loss_add(&c->sl, l, qt_cpu_model_targets(c->model));
    qt_cpu_model_backward(c->model, c->w, c->xg, grad_scale);
}

/* AdamW over the adapter matrices (all decayed, as a torch optimizer over PEFT's parameters decays them) and the
 * trained base tensors (decayed as the full fine-tuning engine decays them); the norm is over both. */
static void lora_opt_step(qt_engine *e, float lr, long t, float *loss, float *gnorm) {
    lora_engine *c = (lora_engine *)e;
    const qt_plan_optimizer *oc = &c->plan.optimizer;
    double norm = qt_grad_norm_cpu(c->g, c->A.numel), n2 = norm * norm;
    for (int i = 0; i < c->nxt; i++) {
        const qt_tensor *tt = &e->L->tensors[c->xt[i]];
        double n = qt_grad_norm_cpu(c->xg + tt->offset, tt->numel);
        n2 += n * n;
    }
    norm = c->nxt ? sqrt(n2) : norm;
    float scale = qt_clip_scale(norm, oc->grad_clip);
    qt_adamw_hp hp = {lr, oc->beta1, oc->beta2, oc->eps, oc->weight_decay};
    c->t = t;
    for (int i = 0; i < c->A.n_tensors; i++) {
        size_t o = c->A.tensors[i].offset;
        qt_adamw_cpu(c->a + o, c->g + o, c->m + o, c->v + o, c->A.tensors[i].numel, &hp, oc->weight_decay, t, scale);
    }
    memset(c->g, 0, c->A.numel * sizeof *c->g);
    for (int i = 0; i < c->nxt; i++) {
        const qt_tensor *tt = &e->L->tensors[c->xt[i]];
        int decay = oc->decay_embeddings && (tt->kind == QT_T_EMBED || tt->kind == QT_T_LM_HEAD);
        size_t o = tt->offset;
        qt_adamw_cpu(c->w + o, c->xg + o, c->xm + o, c->xv + o, tt->numel, &hp, decay ? oc->weight_decay : 0.0f, t, scale);
        memset(c->xg + o, 0, tt->numel * sizeof *c->xg);
    }
    *loss = qt_step_loss_take(&c->sl);
    *gnorm = (float)norm;
    qt_dpo_log_step(&c->dpo);
}

static void lora_dpo_stats(qt_engine *e, int eval, qt_dpo_stats *s) { qt_dpo_log_take(&((lora_engine *)e)->dpo, eval, s); }

static float lora_eval_loss(qt_engine *e, const int32_t *in, const int32_t *tgt) {
    lora_engine *c = (lora_engine *)e;
    qt_lora_cpu_set_batch(c->lc, -1, 0);
    if (c->plan.dpo)
        return (float)qt_dpo_cpu_step(c->model, c->w, qt_lora_cpu_adapter(c->lc), c->w, in, tgt, c->plan.run.B,
                                      c->plan.run.T, &c->plan.dpo_cfg, 0, NULL, 0.0f, &c->dpo.eval);
    return qt_cpu_model_forward(c->model, c->w, in, tgt);
}

/* The merged model: base + scale B A on the adapted rows. */
static void lora_get_weights(qt_engine *e, float *w) {
    lora_engine *c = (lora_engine *)e;
    memcpy(w, c->w, e->L->numel * sizeof *w);
    qt_lora_merge(&c->A, e->L, c->a, w);
}

/* The base has no gradient: zeros. */
static void lora_get_grads(qt_engine *e, float *g) { memset(g, 0, e->L->numel * sizeof *g); }

static void lora_forward_logits(qt_engine *e, const int32_t *in, float *logits) {
    lora_engine *c = (lora_engine *)e;
    qt_lora_cpu_set_batch(c->lc, -1, 0);
    qt_cpu_model_forward(c->model, c->w, in, NULL);
    memcpy(logits, qt_cpu_model_logits(c->model),
           (size_t)e->plan->run.B * e->plan->run.T * e->L->cfg.vocab_size * sizeof(float));
}

/* The trained base tensors' weights, m and v to (pack 1) or from (pack 0) the packed arrays. */
static void extras_pack(lora_engine *c, int pack) {
    float *src[3] = {c->w, c->xm, c->xv};
    size_t at = 0;
    for (int i = 0; i < c->nxt; i++) {
        const qt_tensor *tt = &c->base.L->tensors[c->xt[i]];
        for (int k = 0; k < 3; k++) {
            float *full = src[k] + tt->offset, *packed = c->xpack[k] + at;
            memcpy(pack ? packed : full, pack ? full : packed, tt->numel * sizeof(float));
        }
        at += tt->numel;
    }
}

static const char *const extra_items[3] = {"lora_extras", "lora_extras_m", "lora_extras_v"};

static int lora_state_items(qt_engine *e, qt_ckpt_item *items, int cap) {
    lora_engine *c = (lora_engine *)e;
    QT_CHECK(cap >= 8, "need room for 8 checkpoint items, got %d", cap);
    c->step_blob = c->t;
    qt_lora_ckpt_items(items, c->a, c->m, c->v, c->A.numel, c->id, &c->step_blob);
    if (!c->nxt) return 5;
    extras_pack(c, 1);
    for (int k = 0; k < 3; k++) items[5 + k] = (qt_ckpt_item){extra_items[k], QT_DT_F32, c->xpack[k], c->xn * sizeof(float), 0};
    return 8;
}

static int lora_load_state(qt_engine *e, const qt_ckpt *ck, char *err, size_t errlen) {
    lora_engine *c = (lora_engine *)e;
    size_t bytes;
    int dt;
    long t;
    if (qt_lora_ckpt_load(ck, c->a, c->m, c->v, c->A.numel, c->A.cfg.rank, c->id, c->id_key, &t, err, errlen)) return -1;
    for (int k = 0; k < 3 && c->nxt; k++) {
        const void *p = qt_ckpt_get(ck, extra_items[k], &bytes, &dt);
        if (!p || bytes != c->xn * sizeof(float) || dt != QT_DT_F32)
            return qt_errf(err, errlen, "checkpoint blob %s: expected %zu bytes of fp32 (the base tensors lora.trainable "
                           "names), got %s", extra_items[k], c->xn * sizeof(float), p ? "a different size or dtype" : "none");
        memcpy(c->xpack[k], p, bytes);
    }
    if (c->nxt) extras_pack(c, 0);
    c->t = t;
    return 0;
}

static long lora_nonfinite_weight(qt_engine *e, int settle, long *step) {
    (void)settle;
    lora_engine *c = (lora_engine *)e;
    *step = c->t;
    for (int i = 0; i < c->A.n_tensors; i++) /* an adapter: the first weight of the base rows it adapts */
        for (size_t j = 0; j < c->A.tensors[i].numel; j++)
            if (!isfinite(c->a[c->A.tensors[i].offset + j])) return (long)qt_lora_base_offset(&c->A, e->L, i / 2);
    for (int i = 0; i < c->nxt; i++) {
        const qt_tensor *tt = &e->L->tensors[c->xt[i]];
        for (size_t j = 0; j < tt->numel; j++)
            if (!isfinite(c->w[tt->offset + j])) return (long)(tt->offset + j);
    }
    return -1;
}

static int lora_export_adapter(qt_engine *e, const char *dir, char *err, size_t errlen) {
    lora_engine *c = (lora_engine *)e;
    return qt_lora_export(dir, &c->A, c->a, e->L, c->w, c->from, err, errlen);
}

static void lora_free(qt_engine *e) {
    lora_engine *c = (lora_engine *)e;
    qt_cpu_model_free(c->model);
    qt_lora_cpu_free(c->lc);
    qt_lora_layout_free(&c->A);
    free(c->w), free(c->a), free(c->g), free(c->m), free(c->v);
    free(c->xg), free(c->xm), free(c->xv), free(c->xt);
    for (int k = 0; k < 3; k++) free(c->xpack[k]);
    free(c);
}

static void lora_set_docs(qt_engine *e, const qt_docs *d) { /* the base model's attention and positions */
    char err[256];
    QT_CHECK(qt_cpu_model_set_docs(((lora_engine *)e)->model, d, err, sizeof err) == 0, "%s", err);
}

static const qt_engine_ops lora_ops = {
    .name = "cpu-fp32-lora",
    .micro_step = lora_micro_step,
    .opt_step = lora_opt_step,
    .eval_loss = lora_eval_loss,
    .get_weights = lora_get_weights,
    .get_grads = lora_get_grads,
    .forward_logits = lora_forward_logits,
    .state_items = lora_state_items,
    .load_state = lora_load_state,
    .nonfinite_weight = lora_nonfinite_weight,
    .free = lora_free,
    .export_adapter = lora_export_adapter,
    .set_docs = lora_set_docs,
    .dpo_stats = lora_dpo_stats,
};

/* lora.base_dtype nf4: each block matrix of the base replaced by its NF4 round trip (qt_nf4_roundtrip_ref), the
 * weights QLoRA computes with; the base stays an fp32 array (the CPU engine is the reference, not a memory saver). */
static int nf4_base(lora_engine *c, char *err, size_t errlen) {
    const qt_layout *L = c->base.L;
    int n = 0;
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (!qt_lora_nf4_holds(t)) continue;
        if (qt_nf4_roundtrip_ref(c->w + t->offset, (long)t->numel, t->name, err, errlen)) return -1;
        n++;
    }
    printf("qtrain: lora.base_dtype nf4: the base's %d block matrices quantized to NF4 (double-quantized scales) and "
           "held dequantized in fp32\n", n);
    return 0;
}

/* The base tensors lora.trainable names, and their gradient and moment arrays. */
static int extras_init(lora_engine *c, char *err, size_t errlen) {
    const qt_layout *L = c->base.L;
    int tr = c->A.cfg.trainable;
    if (!tr) return 0;
    if (L->cfg.tie_embeddings && (tr & (QT_LORA_X_EMBED | QT_LORA_X_LM_HEAD)))
        return qt_errf(err, errlen, "lora.trainable: embeddings and lm_head of a model with tied embeddings are not "
                       "supported (PEFT's modules_to_save unties them); train norms only, or untie the model");
    c->xt = malloc((size_t)L->n_tensors * sizeof *c->xt);
    c->xg = calloc(L->numel, sizeof *c->xg);
    c->xm = calloc(L->numel, sizeof *c->xm);
    c->xv = calloc(L->numel, sizeof *c->xv);
    QT_CHECK(c->xt && c->xg && c->xm && c->xv, "out of host memory for the trained base tensors");
    for (int i = 0; i < L->n_tensors; i++)
        if (qt_lora_trains(&L->tensors[i], tr)) {
            c->xt[c->nxt++] = i;
            c->xn += L->tensors[i].numel;
        }
    for (int k = 0; k < 3; k++) {
        c->xpack[k] = malloc((c->xn ? c->xn : 1) * sizeof(float));
        QT_CHECK(c->xpack[k], "out of host memory");
    }
    return 0;
}

qt_engine *qt_engine_cpu_lora_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, char *err,
                                     size_t errlen) {
    lora_engine *c = calloc(1, sizeof *c);
    QT_CHECK(c, "out of host memory");
    c->plan = *plan;
    c->base = (qt_engine){&lora_ops, L, &c->plan, 1, NULL};
    if (qt_lora_layout_init(&c->A, &plan->lora, &L->cfg, err, errlen)) {
        free(c);
        return NULL;
    }
    c->w = malloc(L->numel * sizeof *c->w);
    c->a = malloc(c->A.numel * sizeof *c->a);
    c->g = calloc(c->A.numel, sizeof *c->g);
    c->m = calloc(c->A.numel, sizeof *c->m);
    c->v = calloc(c->A.numel, sizeof *c->v);
    QT_CHECK(c->w && c->a && c->g && c->m && c->v, "out of host memory for %zu base and %zu adapter parameters",
             L->numel, c->A.numel);
    if (qt_weight_src_fill(src, 0, L->numel, c->w, err, errlen)) {
        lora_free(&c->base);
        return NULL;
    }
    snprintf(c->from, sizeof c->from, "%s", src->kind == QT_WSRC_HF ? src->path : "");
    c->id_key = (size_t)snprintf(c->id, sizeof c->id, "crc32c %08x numel %zu",
                                 qt_crc32c(0, c->w, L->numel * sizeof *c->w), L->numel);
    snprintf(c->id + c->id_key, sizeof c->id - c->id_key, " from %s", src->kind == QT_WSRC_HF ? src->path : "init");
    qt_lora_init(&c->A, c->a, plan->optimizer.seed);
    if ((plan->lora.base_nf4 && nf4_base(c, err, errlen)) || extras_init(c, err, errlen)) {
        lora_free(&c->base);
        return NULL;
    }
    c->model = qt_cpu_model_create(L, plan->run.B, plan->run.T);
    qt_cpu_model_set_grads(c->model, qt_lora_cpu_grads(plan->lora.trainable));
    c->lc = qt_lora_cpu_create(&c->A, c->a, c->g, (long)plan->run.B * plan->run.T, plan->optimizer.seed);
    qt_cpu_model_set_adapter(c->model, qt_lora_cpu_adapter(c->lc));
    printf("qtrain: LoRA rank %d, alpha %g%s (scale %g), dropout %g: %zu adapter parameters in %d modules over a "
           "frozen base of %zu\n", c->A.cfg.rank, (double)c->A.cfg.alpha, c->A.cfg.rslora ? ", rsLoRA" : "",
           (double)c->A.scale, (double)c->A.cfg.dropout, c->A.numel, c->A.n_layers * c->A.per_layer, L->n_params);
    if (c->nxt) printf("qtrain: LoRA trains %zu base parameters in %d tensors beside the adapters\n", c->xn, c->nxt);
    return &c->base;
}
