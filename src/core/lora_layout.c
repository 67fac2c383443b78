/* lora_layout.c — the LoRA adapter array: which modules are adapted, where A and B live, their PEFT names,
 * PEFT's default init and the merge into the base's fused matrices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_lora.h"

static const char *const target_names[QT_LORA_N_TARGETS] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                            "gate_proj", "up_proj", "down_proj"};

const char *qt_lora_target_name(int t) { return t >= 0 && t < QT_LORA_N_TARGETS ? target_names[t] : "?"; }

int qt_lora_cfg_validate(const qt_lora_cfg *c, char *err, size_t errlen) {
    if (c->rank < 1) return qt_errf(err, errlen, "lora.rank: expected an integer >= 1, got %d", c->rank);
    if (!(isfinite(c->alpha) && c->alpha > 0))
        return qt_errf(err, errlen, "lora.alpha: expected a finite number > 0, got %g", c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return qt_errf(err, errlen, "lora.dropout: expected a number in [0, 1), got %g", c->dropout);
    if (!(c->targets & QT_LORA_ALL) || (c->targets & ~QT_LORA_ALL))
        return qt_errf(err, errlen, "lora.targets: expected a non-empty list of q, k, v, o, gate, up, down");
    return 0;
}

/* Fills md's site and widths for target t of model c. */
static void module_dims(qt_lora_module *md, int t, const qt_model_cfg *c) {
    int C = c->hidden_size, HD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
    int F = c->intermediate_size, QKV = HD + 2 * KD;
    static const qt_lora_site site[QT_LORA_N_TARGETS] = {QT_LORA_SITE_QKV, QT_LORA_SITE_QKV, QT_LORA_SITE_QKV,
                                                         QT_LORA_SITE_O,   QT_LORA_SITE_GU,  QT_LORA_SITE_GU,
                                                         QT_LORA_SITE_DOWN};
    int in[QT_LORA_N_TARGETS] = {C, C, C, HD, C, C, F}, out[QT_LORA_N_TARGETS] = {HD, KD, KD, C, F, F, C};
    int row0[QT_LORA_N_TARGETS] = {0, HD, HD + KD, 0, 0, F, 0}, ld[QT_LORA_N_TARGETS] = {QKV, QKV, QKV, C, 2 * F, 2 * F, C};
    md->target = t;
    md->site = site[t];
    md->in = in[t];
    md->out = out[t];
    md->out_row0 = row0[t];
    md->out_ld = ld[t];
}

int qt_lora_layout_init(qt_lora_layout *A, const qt_lora_cfg *cfg, const qt_model_cfg *mc, char *err, size_t errlen) {
    memset(A, 0, sizeof *A);
    if (qt_lora_cfg_validate(cfg, err, errlen)) return -1;
    A->cfg = *cfg;
    A->scale = cfg->rslora ? cfg->alpha / sqrtf((float)cfg->rank) : cfg->alpha / (float)cfg->rank;
    A->n_layers = mc->num_layers;
    for (int t = 0; t < QT_LORA_N_TARGETS; t++) A->per_layer += (cfg->targets >> t) & 1;
    int nm = A->n_layers * A->per_layer;
    A->mods = calloc((size_t)nm, sizeof *A->mods);
    A->tensors = calloc((size_t)nm * 2, sizeof *A->tensors);
    QT_CHECK(A->mods && A->tensors, "out of memory for the LoRA layout");
    size_t off = 0;
    int r = cfg->rank;
    for (int l = 0, i = 0; l < A->n_layers; l++)
        for (int t = 0; t < QT_LORA_N_TARGETS; t++) {
            if (!((cfg->targets >> t) & 1)) continue;
            qt_lora_module *md = &A->mods[i++];
            module_dims(md, t, mc);
            for (int b = 0; b < 2; b++) {
                qt_lora_tensor *tt = &A->tensors[A->n_tensors++];
                snprintf(tt->name, sizeof tt->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         t < 4 ? "self_attn" : "mlp", target_names[t], b ? 'B' : 'A');
                tt->layer = l;
                tt->target = t;
                tt->is_b = b;
                tt->rows = b ? md->out : r;
                tt->cols = b ? r : md->in;
                tt->offset = off;
                tt->numel = (size_t)tt->rows * tt->cols;
                *(b ? &md->b : &md->a) = off;
                off += tt->numel;
            }
        }
    A->numel = off;
    return 0;
}

void qt_lora_layout_free(qt_lora_layout *A) {
    free(A->mods);
    free(A->tensors);
    memset(A, 0, sizeof *A);
}

const qt_lora_tensor *qt_lora_find(const qt_lora_layout *A, const char *name) {
    for (int i = 0; i < A->n_tensors; i++)
        if (!strcmp(A->tensors[i].name, name)) return &A->tensors[i];
    return NULL;
}

void qt_lora_init(const qt_lora_layout *A, float *a, uint64_t seed) {
    for (int i = 0; i < A->n_tensors; i++) {
        const qt_lora_tensor *t = &A->tensors[i];
        float bound = 1.0f / sqrtf((float)t->cols);
        for (size_t j = 0; j < t->numel; j++) {
            size_t k = t->offset + j;
            double u = (double)(qt_hash64(seed, k) >> 11) * 0x1.0p-53; /* [0, 1) */
            a[k] = t->is_b ? 0.0f : (float)((2 * u - 1) * bound);
        }
    }
}

uint64_t qt_lora_mask_seed(uint64_t seed, long step, long micro, int layer, int target) {
    uint64_t h = qt_hash64(seed ^ 0x4c6f5241ull, (uint64_t)step);
    h = qt_hash64(h, (uint64_t)micro);
    return qt_hash64(h, (uint64_t)layer * QT_LORA_N_TARGETS + (uint64_t)target);
}

int qt_lora_trains(const qt_tensor *t, int trainable) {
    switch (t->kind) {
    case QT_T_NORM: case QT_T_FINAL_NORM: case QT_T_QNORM: case QT_T_KNORM: return (trainable & QT_LORA_X_NORMS) != 0;
    case QT_T_EMBED: return (trainable & QT_LORA_X_EMBED) != 0;
    case QT_T_LM_HEAD: return (trainable & QT_LORA_X_LM_HEAD) != 0;
    default: return 0;
    }
}

int qt_lora_nf4_holds(const qt_tensor *t) {
    return t->layer >= 0 && (t->kind == QT_T_Q || t->kind == QT_T_K || t->kind == QT_T_V || t->kind == QT_T_O ||
                             t->kind == QT_T_GATE || t->kind == QT_T_UP || t->kind == QT_T_DOWN);
}

/* The base offset of the fused matrix module md adds into, in layer l. */
static size_t site_matrix(const qt_layout *L, int l, qt_lora_site s) {
    const qt_layer_offsets *o = &L->layers[l];
    return s == QT_LORA_SITE_QKV ? o->wqkv : s == QT_LORA_SITE_O ? o->wo : s == QT_LORA_SITE_GU ? o->wgu : o->wdown;
}

size_t qt_lora_base_offset(const qt_lora_layout *A, const qt_layout *L, int m) {
    const qt_lora_module *md = &A->mods[m];
    return site_matrix(L, m / A->per_layer, md->site) + (size_t)md->out_row0 * md->in;
}

void qt_lora_merge(const qt_lora_layout *A, const qt_layout *L, const float *a, float *base) {
    int r = A->cfg.rank;
    for (int m = 0; m < A->n_layers * A->per_layer; m++) {
        const qt_lora_module *md = &A->mods[m];
        float *W = base + qt_lora_base_offset(A, L, m);
        const float *Am = a + md->a, *Bm = a + md->b;
        for (int o = 0; o < md->out; o++)
            for (int i = 0; i < md->in; i++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += (double)Bm[(size_t)o * r + k] * Am[(size_t)k * md->in + i];
                W[(size_t)o * md->in + i] += A->scale * (float)acc;
            }
    }
}
