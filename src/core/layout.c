/* layout.c — model config checks, the flat parameter layout (HF tensor order, fused groups aligned
 * to QT_LAYOUT_ALIGN elements, shard units to the unit alignment), weight initialisation and the
 * FLOPs-per-token count. */
#include "qt_model.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_rng.h"
#include "qt_rope.h"


void qt_model_cfg_finish(qt_model_cfg *cfg) {
    if (cfg->num_kv_heads == 0) cfg->num_kv_heads = cfg->num_heads;
    /* Only an exact quotient: a truncated one (64 / 6 = 10) would silently train another model, so
     * head_dim stays 0 and qt_model_cfg_validate reports it. */
    if (cfg->head_dim == 0 && cfg->num_heads > 0 && cfg->hidden_size % cfg->num_heads == 0)
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    /* the transformers defaults of each family */
    int qwen = cfg->arch == QT_ARCH_QWEN2 || cfg->arch == QT_ARCH_QWEN3 || cfg->arch == QT_ARCH_GEMMA3;
    if (cfg->rope_theta == 0) cfg->rope_theta = qwen ? 1000000.0f : 10000.0f;
    if (cfg->rms_norm_eps == 0) cfg->rms_norm_eps = cfg->arch == QT_ARCH_LLAMA ? 1e-5f : 1e-6f;
    /* every Qwen3 and Gemma 3 attention norms its q and k heads */
    if (cfg->arch == QT_ARCH_QWEN3 || cfg->arch == QT_ARCH_GEMMA3) cfg->qk_norm = 1;
    qt_rope_finish(cfg);
}

int qt_model_layer_local(const qt_model_cfg *cfg, int l) {
    if (l < cfg->window_layers_from) return 0;
    return !(cfg->window_pattern > 0 && (l + 1) % cfg->window_pattern == 0);
}

int qt_model_layer_window(const qt_model_cfg *cfg, int l) {
    return cfg->sliding_window > 0 && qt_model_layer_local(cfg, l) ? cfg->sliding_window : 0;
}

qt_model_cfg qt_model_layer_rope(const qt_model_cfg *cfg, int l) {
    qt_model_cfg c = *cfg;
    if (cfg->rope_local_theta > 0 && qt_model_layer_local(cfg, l)) {
        c.rope_theta = cfg->rope_local_theta;
        memset(&c.rope, 0, sizeof c.rope);
    }
    return c;
}

double qt_model_attn_scale(const qt_model_cfg *cfg) {
    return 1.0 / sqrt(cfg->attn_scalar > 0 ? (double)cfg->attn_scalar : (double)cfg->head_dim);
}

int qt_model_gpu_check(const qt_model_cfg *c, char *err, size_t errlen) {
    return c->arch >= QT_ARCH_QWEN2 && c->arch <= QT_ARCH_GEMMA3 ? 0 : qt_errf(err, errlen,
           "model.arch: %d is no family the GPU model knows (qwen2, llama, qwen3, mistral, gemma3)", (int)c->arch);
}

/* The sliding-window fields: each family's HF config holds only its own rule (Mistral windows every
 * layer, Qwen2 the layers from max_window_layers on, Llama none), so a config no family can say is
 * refused rather than exported as another model. */
static int validate_window(const qt_model_cfg *c, char *err, size_t errlen) {
    if (c->sliding_window < 0)
        return qt_errf(err, errlen, "model.sliding_window: expected an integer >= 0 (0 = none), got %d", c->sliding_window);
    if (c->window_layers_from < 0)
        return qt_errf(err, errlen, "model.window_layers_from: expected an integer >= 0, got %d", c->window_layers_from);
    if (c->sliding_window > 0 && c->arch == QT_ARCH_LLAMA)
        return qt_errf(err, errlen,
                       "model.sliding_window: expected 0 for llama (transformers' Llama has no sliding window), got %d; "
                       "use arch mistral or qwen2",
                       c->sliding_window);
    if (c->window_pattern < 0)
        return qt_errf(err, errlen, "model.window_pattern: expected an integer >= 0 (0 = none), got %d", c->window_pattern);
    if (c->window_pattern > 0 && c->arch != QT_ARCH_GEMMA3)
        return qt_errf(err, errlen, "model.window_pattern: expected 0 for %s (only gemma3 interleaves global layers), got %d",
                       c->arch == QT_ARCH_QWEN2 ? "qwen2" : c->arch == QT_ARCH_QWEN3 ? "qwen3" : "mistral",
                       c->window_pattern);
    if (c->arch == QT_ARCH_GEMMA3 && c->window_layers_from != 0)
        return qt_errf(err, errlen, "model.window_layers_from: expected 0 for gemma3 (window_pattern sets the layer types), got %d",
                       c->window_layers_from);
    if (c->sliding_window > 0 && c->arch == QT_ARCH_MISTRAL && c->window_layers_from != 0)
        return qt_errf(err, errlen,
                       "model.window_layers_from: expected 0 for mistral (every layer has the window), got %d; use arch qwen2",
                       c->window_layers_from);
    return 0;
}

/* Gemma 3's fields: finite and >= 0 (0 = unset); the (1 + w) maths has no HF form in another family, so
 * its local RoPE base, attention scalar and logit cap are gemma3's alone. */
static int validate_gemma(const qt_model_cfg *c, char *err, size_t errlen) {
    const char *key[] = {"model.rope_local_theta", "model.query_pre_attn_scalar", "model.final_logit_softcapping"};
    float v[] = {c->rope_local_theta, c->attn_scalar, c->logit_softcap};
    for (int i = 0; i < 3; i++) {
        if (!(v[i] >= 0) || !isfinite(v[i]))
            return qt_errf(err, errlen, "%s: expected a finite number >= 0 (0 = unset), got %g", key[i], v[i]);
        if (v[i] > 0 && c->arch != QT_ARCH_GEMMA3)
            return qt_errf(err, errlen, "%s: expected 0 outside arch gemma3, got %g", key[i], v[i]);
    }
    return 0;
}

/* a * b and a + b in uint64, saturating at UINT64_MAX: the size checks below compare the result
 * with limits far below it, so saturation reads as "too big", never as a wrapped small number. */
static uint64_t mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static uint64_t add_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t qt_model_cfg_numel(const qt_model_cfg *c) {
    uint64_t V = (uint64_t)c->vocab_size, C = (uint64_t)c->hidden_size, F = (uint64_t)c->intermediate_size;
    uint64_t D = (uint64_t)(c->head_dim ? c->head_dim : c->num_heads > 0 ? c->hidden_size / c->num_heads : 0);
    uint64_t Hq = mul_sat((uint64_t)c->num_heads, D), Hk = mul_sat((uint64_t)c->num_kv_heads, D);
    uint64_t qkv = add_sat(Hq, mul_sat(2, Hk));
    uint64_t layer = add_sat(mul_sat(qkv, C), mul_sat(Hq, C));              /* q, k, v, o */
    layer = add_sat(layer, mul_sat(mul_sat(3, F), C));                       /* gate, up, down */
    layer = add_sat(layer, add_sat(mul_sat(2, C), c->qkv_bias ? qkv : 0));  /* norms, biases */
    layer = add_sat(layer, c->qk_norm ? add_sat(mul_sat(2, D), QT_LAYOUT_ALIGN) : 0); /* q/k norms, padding */
    if (c->arch == QT_ARCH_GEMMA3) layer = add_sat(layer, mul_sat(2, add_sat(C, QT_LAYOUT_ALIGN))); /* post norms */
    layer = add_sat(layer, 7 * QT_LAYOUT_ALIGN);                             /* padding of 7 groups */
    uint64_t n = mul_sat(layer, (uint64_t)c->num_layers);
    n = add_sat(n, mul_sat(mul_sat(V, C), c->tie_embeddings ? 1 : 2));       /* embedding, lm_head */
    return add_sat(n, add_sat(C, 3 * QT_LAYOUT_ALIGN));                      /* final norm, padding */
}

int qt_model_cfg_validate(const qt_model_cfg *c, char *err, size_t errlen) {
    static const char *pos = "expected an integer > 0, got";
    if (c->arch != QT_ARCH_QWEN2 && c->arch != QT_ARCH_LLAMA && c->arch != QT_ARCH_QWEN3 && c->arch != QT_ARCH_MISTRAL &&
        c->arch != QT_ARCH_GEMMA3)
        return qt_errf(err, errlen, "model.arch: expected qwen2, llama, qwen3, mistral or gemma3, got %d", (int)c->arch);
    if (c->vocab_size <= 0) return qt_errf(err, errlen, "model.vocab_size: %s %d", pos, c->vocab_size);
    if (c->hidden_size <= 0) return qt_errf(err, errlen, "model.hidden_size: %s %d", pos, c->hidden_size);
    if (c->num_layers <= 0) return qt_errf(err, errlen, "model.num_layers: %s %d", pos, c->num_layers);
    if (c->num_layers > QT_MODEL_MAX_LAYERS) /* the tensor table has ~12 rows per layer */
        return qt_errf(err, errlen, "model.num_layers: expected at most %d, got %d", QT_MODEL_MAX_LAYERS, c->num_layers);
    if (c->num_heads <= 0) return qt_errf(err, errlen, "model.num_heads: %s %d", pos, c->num_heads);
    if (c->num_kv_heads <= 0) return qt_errf(err, errlen, "model.num_kv_heads: %s %d", pos, c->num_kv_heads);
    if (c->num_heads % c->num_kv_heads)
        return qt_errf(err, errlen, "model.num_kv_heads: expected a divisor of num_heads (%d), got %d",
                    c->num_heads, c->num_kv_heads);
    if (c->head_dim < 0) return qt_errf(err, errlen, "model.head_dim: expected an integer >= 0, got %d", c->head_dim);
    if (c->head_dim == 0 && c->hidden_size % c->num_heads)
        return qt_errf(err, errlen,
                       "model.head_dim: unset, and hidden_size (%d) is not a multiple of num_heads (%d); "
                       "set head_dim or change num_heads",
                       c->hidden_size, c->num_heads);
    int D = c->head_dim ? c->head_dim : c->hidden_size / c->num_heads;
    if (D % 2) return qt_errf(err, errlen, "model.head_dim: expected an even number (rotary pairs), got %d", D);
    if (c->intermediate_size <= 0)
        return qt_errf(err, errlen, "model.intermediate_size: %s %d", pos, c->intermediate_size);
    if (c->max_seq_len <= 0) return qt_errf(err, errlen, "model.max_seq_len: %s %d", pos, c->max_seq_len);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return qt_errf(err, errlen, "model.rope_theta: expected a finite number > 0, got %g", c->rope_theta);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return qt_errf(err, errlen, "model.rms_norm_eps: expected a finite number > 0, got %g", c->rms_norm_eps);
    if (qt_rope_validate(c, err, errlen)) return -1;
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
        return qt_errf(err, errlen, "model.tie_embeddings: expected 0 or 1, got %d", c->tie_embeddings);
    if (c->qkv_bias != 0 && c->qkv_bias != 1)
        return qt_errf(err, errlen, "model.qkv_bias: expected 0 or 1, got %d", c->qkv_bias);
    if (c->qk_norm != 0 && c->qk_norm != 1)
        return qt_errf(err, errlen, "model.qk_norm: expected 0 or 1, got %d", c->qk_norm);
    if (validate_window(c, err, errlen)) return -1;
    if (validate_gemma(c, err, errlen)) return -1;
    /* Sizes: the trainers index rows of the fused q|k|v and gate|up matrices and the attention
     * heads with int, and the whole model must be a plausible allocation. */
    uint64_t qkv_rows = mul_sat((uint64_t)c->num_heads + 2 * (uint64_t)c->num_kv_heads, (uint64_t)D);
    if (qkv_rows > INT_MAX)
        return qt_errf(err, errlen,
                       "model.head_dim: (num_heads + 2 * num_kv_heads) * head_dim = (%d + 2 * %d) * %d, "
                       "expected at most 2^31 - 1 rows of the fused q|k|v matrix",
                       c->num_heads, c->num_kv_heads, D);
    if (2 * (uint64_t)c->intermediate_size > INT_MAX)
        return qt_errf(err, errlen, "model.intermediate_size: expected at most 2^30 - 1 (gate|up rows fused), got %d",
                       c->intermediate_size);
    uint64_t n = qt_model_cfg_numel(c);
    if (n > QT_MODEL_MAX_NUMEL)
        return qt_errf(err, errlen,
                       "model: hidden_size %d, num_layers %d, intermediate_size %d, vocab_size %d, %d + 2 x %d "
                       "heads of %d give %s%.4g parameters, expected at most 2^40",
                       c->hidden_size, c->num_layers, c->intermediate_size, c->vocab_size, c->num_heads,
                       c->num_kv_heads, D, n == UINT64_MAX ? "over " : "", (double)n);
    return 0;
}

static size_t round_to(size_t x, size_t q) { return (x + q - 1) / q * q; }

/* Where the next tensor goes: in the layout being built and in the compact one. */
typedef struct {
    size_t at, compact;
} cursor;

/* Aligns both for the first tensor of a group. */
static void group(cursor *c) {
    c->at = round_to(c->at, QT_LAYOUT_ALIGN);
    c->compact = round_to(c->compact, QT_LAYOUT_ALIGN);
}

/* Aligns for the first tensor of a unit and records the unit's start. */
static void unit(qt_layout *L, cursor *c) {
    group(c);
    c->at = round_to(c->at, L->unit_align);
    L->unit_at[L->n_units] = c->at;
    L->unit_compact[L->n_units++] = c->compact;
}

/* Appends one tensor at *cur (which the caller aligned for the first tensor of a group). */
static size_t add(qt_layout *L, cursor *cur, qt_tensor_kind kind, int layer, const char *name, int64_t rows,
                  int64_t cols) {
    qt_tensor *t = &L->tensors[L->n_tensors++];
    memset(t, 0, sizeof *t);
    if (layer >= 0) snprintf(t->name, sizeof t->name, "model.layers.%d.%s", layer, name);
    else snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->layer = layer;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->offset = cur->at;
    t->compact = cur->compact;
    t->is_matrix = kind == QT_T_Q || kind == QT_T_K || kind == QT_T_V || kind == QT_T_O || kind == QT_T_GATE ||
                   kind == QT_T_UP || kind == QT_T_DOWN;
    cur->at += t->numel;
    cur->compact += t->numel;
    L->n_params += t->numel;
    return t->offset;
}

int qt_layout_init(qt_layout *L, const qt_model_cfg *cfg_in, char *err, size_t errlen) {
    return qt_layout_init_units(L, cfg_in, QT_LAYOUT_ALIGN, err, errlen);
}

int qt_layout_init_units(qt_layout *L, const qt_model_cfg *cfg_in, size_t unit_align, char *err, size_t errlen) {
    memset(L, 0, sizeof *L);
    if (unit_align < QT_LAYOUT_ALIGN || unit_align % QT_LAYOUT_ALIGN || unit_align > ((size_t)1 << 24))
        return qt_errf(err, errlen, "layout: unit alignment %zu: expected a multiple of %d up to 2^24", unit_align,
                       QT_LAYOUT_ALIGN);
    qt_model_cfg c = *cfg_in;
    qt_model_cfg_finish(&c);
    if (qt_model_cfg_validate(&c, err, errlen)) return -1;
    L->cfg = c;
    L->unit_align = unit_align;
    int64_t V = c.vocab_size, C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
    int64_t Hq = (int64_t)c.num_heads * D, Hk = (int64_t)c.num_kv_heads * D;
    int gemma = c.arch == QT_ARCH_GEMMA3;
    int per_layer = 9 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0) + (gemma ? 2 : 0);
    L->tensors = calloc((size_t)c.num_layers * per_layer + 3, sizeof *L->tensors);
    L->layers = calloc((size_t)c.num_layers, sizeof *L->layers);
    L->unit_at = calloc((size_t)c.num_layers + 3, sizeof *L->unit_at);
    L->unit_compact = calloc((size_t)c.num_layers + 3, sizeof *L->unit_compact);
    if (!L->tensors || !L->layers || !L->unit_at || !L->unit_compact) {
        qt_layout_free(L);
        return qt_errf(err, errlen, "model.num_layers: out of memory for the tensor table of %d layers", c.num_layers);
    }
    cursor cur = {0, 0};
    unit(L, &cur);
    L->embed = add(L, &cur, QT_T_EMBED, -1, "model.embed_tokens.weight", V, C);
    for (int i = 0; i < c.num_layers; i++) {
        qt_layer_offsets *o = &L->layers[i];
        unit(L, &cur);
        o->ln1 = add(L, &cur, QT_T_NORM, i, "input_layernorm.weight", C, 0);
        group(&cur);
        o->wqkv = add(L, &cur, QT_T_Q, i, "self_attn.q_proj.weight", Hq, C);
        add(L, &cur, QT_T_K, i, "self_attn.k_proj.weight", Hk, C);
        add(L, &cur, QT_T_V, i, "self_attn.v_proj.weight", Hk, C);
        o->bqkv = SIZE_MAX;
        if (c.qkv_bias) {
            group(&cur);
            o->bqkv = add(L, &cur, QT_T_QB, i, "self_attn.q_proj.bias", Hq, 0);
            add(L, &cur, QT_T_KB, i, "self_attn.k_proj.bias", Hk, 0);
            add(L, &cur, QT_T_VB, i, "self_attn.v_proj.bias", Hk, 0);
        }
        group(&cur);
        o->wo = add(L, &cur, QT_T_O, i, "self_attn.o_proj.weight", C, Hq);
        group(&cur);
        /* the pre-MLP norm: Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm */
        o->ln2 = add(L, &cur, QT_T_NORM, i, gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight",
                     C, 0);
        group(&cur);
        o->wgu = add(L, &cur, QT_T_GATE, i, "mlp.gate_proj.weight", F, C);
        add(L, &cur, QT_T_UP, i, "mlp.up_proj.weight", F, C);
        group(&cur);
        o->wdown = add(L, &cur, QT_T_DOWN, i, "mlp.down_proj.weight", C, F);
        o->qknorm = SIZE_MAX;
        if (c.qk_norm) { /* last in the layer: the other groups' offsets are those of a model without */
            group(&cur);
            o->qknorm = add(L, &cur, QT_T_QNORM, i, "self_attn.q_norm.weight", D, 0);
            add(L, &cur, QT_T_KNORM, i, "self_attn.k_norm.weight", D, 0);
        }
        o->post_attn = o->post_ffn = SIZE_MAX;
        if (gemma) {
            group(&cur);
            o->post_attn = add(L, &cur, QT_T_NORM, i, "post_attention_layernorm.weight", C, 0);
            group(&cur);
            o->post_ffn = add(L, &cur, QT_T_NORM, i, "post_feedforward_layernorm.weight", C, 0);
        }
    }
    unit(L, &cur);
    L->final_norm = add(L, &cur, QT_T_FINAL_NORM, -1, "model.norm.weight", C, 0);
    if (c.tie_embeddings) {
        L->lm_head = L->embed;
    } else {
        group(&cur);
        L->lm_head = add(L, &cur, QT_T_LM_HEAD, -1, "lm_head.weight", V, C);
    }
    group(&cur);
    L->numel = round_to(cur.at, unit_align);
    L->compact_numel = cur.compact;
    L->unit_at[L->n_units] = L->numel;
    L->unit_compact[L->n_units] = L->compact_numel;
    return 0;
}

void qt_layout_free(qt_layout *L) {
    free(L->tensors);
    free(L->layers);
    free(L->unit_at);
    free(L->unit_compact);
    L->tensors = NULL;
    L->layers = NULL;
    L->unit_at = L->unit_compact = NULL;
    L->n_tensors = L->n_units = 0;
}

/* The last unit whose start in pos (unit_at or unit_compact) is <= x. */
static int unit_of(const qt_layout *L, const size_t *pos, size_t x) {
    int lo = 0, hi = L->n_units - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pos[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

size_t qt_layout_compact(const qt_layout *L, size_t i) {
    int u = unit_of(L, L->unit_at, i);
    size_t c = L->unit_compact[u] + (i - L->unit_at[u]);
    return c < L->unit_compact[u + 1] ? c : L->unit_compact[u + 1];
}

size_t qt_layout_flat(const qt_layout *L, size_t c) {
    int u = unit_of(L, L->unit_compact, c);
    return L->unit_at[u] + (c - L->unit_compact[u]);
}

const qt_tensor *qt_layout_find(const qt_layout *L, const char *name) {
    for (int i = 0; i < L->n_tensors; i++)
        if (!strcmp(L->tensors[i].name, name)) return &L->tensors[i];
    return NULL;
}

/* N(0,1) for compact index i: Box-Muller on two hashed uniforms, so any thread can draw any element. */
static float hashed_normal(uint64_t seed, uint64_t i) {
    double u1 = ((qt_hash64(seed, 2 * i) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double u2 = (qt_hash64(seed, 2 * i + 1) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* Ranges below this many elements fill on the calling thread: a parallel region per small range (the
 * planner's tests fill element by element) cost minutes on a busy 64-core host, each fork waiting for
 * threads the other processes had. */
#define INIT_PAR_MIN ((long)1 << 16)

int qt_layout_init_kind(const qt_layout *L, const qt_tensor *t, float *v) {
    *v = 0.0f;
    if (t->kind == QT_T_NORM || t->kind == QT_T_FINAL_NORM || t->kind == QT_T_QNORM || t->kind == QT_T_KNORM) {
        *v = L->cfg.arch == QT_ARCH_GEMMA3 ? 0.0f : 1.0f; /* Gemma's norms scale by 1 + w */
        return QT_INIT_CONST;
    }
    return t->ndim == 2 ? QT_INIT_NORMAL : QT_INIT_ZERO;
}

void qt_layout_init_range(const qt_layout *L, size_t lo, size_t n, float *dst, uint64_t seed, float std) {
    size_t hi = lo + n;
#pragma omp parallel for schedule(static) if ((long)n >= INIT_PAR_MIN)
    for (long i = 0; i < (long)n; i++) dst[i] = 0;
    for (int k = 0; k < L->n_tensors; k++) {
        const qt_tensor *t = &L->tensors[k];
        size_t a = t->offset > lo ? t->offset : lo, e = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= e) continue;
        float *p = dst + (a - lo), one;
        long m = (long)(e - a);
        int kind = qt_layout_init_kind(L, t, &one);
        if (kind == QT_INIT_CONST) {
            for (long i = 0; i < m; i++) p[i] = one;
        } else if (kind == QT_INIT_NORMAL) {
#pragma omp parallel for schedule(static) if (m >= INIT_PAR_MIN)
            for (long i = 0; i < m; i++) p[i] = std * hashed_normal(seed, t->compact + (a - t->offset) + (uint64_t)i);
        } /* biases stay 0 */
    }
}

void qt_layout_init_weights(const qt_layout *L, float *w, uint64_t seed, float std) {
    qt_layout_init_range(L, 0, L->numel, w, seed, std);
}

double qt_model_flops_per_token(const qt_model_cfg *c, int T) {
    double C = c->hidden_size, D = c->head_dim ? c->head_dim : (double)c->hidden_size / c->num_heads;
    double H = c->num_heads, Hkv = c->num_kv_heads, F = c->intermediate_size, V = c->vocab_size;
    double per_layer = C * (H + 2 * Hkv) * D + H * D * C + 3 * C * F;
    double matmul = c->num_layers * per_layer + V * C; /* LM head counted even when tied */
    double keys = 0; /* keys per query summed over the layers: T/2 causal, W - W^2/(2T) in a window W < T */
    for (int l = 0; l < c->num_layers; l++) {
        double W = qt_model_layer_window(c, l);
        keys += W > 0 && W < T ? W - W * W / (2.0 * T) : T / 2.0;
    }
    return 6 * matmul + 12.0 * H * D * keys;
}
