/* hf_gemma.c — Gemma 3's config.json (Gemma3TextConfig, model_type "gemma3_text"; the text_config of a
 * "gemma3" Gemma3ForConditionalGeneration file) to and from qt_model_cfg, and the multimodal checkpoints'
 * tensor names. Keys, defaults and rules are transformers' (configuration_gemma3.py); the wiring is in
 * docs/models-gemma3.md. */
#include "qt_hf_gemma.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_hf_fields.h"
#include "qt_hf_rope.h"
#include "qt_rope.h"

static const char *type_name(const qt_json_node *x) {
    static const char *n[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return x ? n[x->type] : "nothing";
}

/* key, when present and not null, must be the string want. */
static int expect_str(const char *path, const qt_json_node *r, const char *key, const char *want, char *err,
                      size_t errlen) {
    const qt_json_node *x = qt_json_get(r, key);
    if (!x || x->type == QT_JSON_NULL || (x->type == QT_JSON_STR && !strcmp(x->str, want))) return 0;
    return qt_errf(err, errlen, "%s: %s: expected \"%s\", got %s%s%s", path, key, want, x->type == QT_JSON_STR ? "\"" : "",
                   x->type == QT_JSON_STR ? x->str : type_name(x), x->type == QT_JSON_STR ? "\"" : "");
}

/* A number >= 0 or null (-> 0), absent -> def. */
static int get_opt(const char *path, const qt_json_node *r, const char *key, float def, float *out, char *err,
                   size_t errlen) {
    const qt_json_node *x = qt_json_get(r, key);
    if (!x) { *out = def; return 0; }
    if (x->type == QT_JSON_NULL) { *out = 0; return 0; }
    if (x->type != QT_JSON_NUM || !(x->num >= 0) || !isfinite((float)x->num))
        return qt_errf(err, errlen, "%s: %s: expected a finite number >= 0 or null, got %s", path, key, type_name(x));
    *out = (float)x->num;
    return 0;
}

/* layer_types as a window_pattern: layer i "full_attention" iff (i + 1) % pattern == 0 (pattern 0: none is). */
static int read_layer_types(const char *path, const qt_json_node *lt, qt_model_cfg *c, char *err, size_t errlen) {
    if (lt->type != QT_JSON_ARR) return qt_errf(err, errlen, "%s: layer_types: expected an array, got %s", path, type_name(lt));
    int n = 0, first_full = -1;
    for (const qt_json_node *x = lt->child; x; x = x->next, n++) {
        int full = x->type == QT_JSON_STR && !strcmp(x->str, "full_attention");
        if (!full && !(x->type == QT_JSON_STR && !strcmp(x->str, "sliding_attention")))
            return qt_errf(err, errlen, "%s: layer_types[%d]: expected \"full_attention\" or \"sliding_attention\", got %s",
                           path, n, x->type == QT_JSON_STR ? x->str : type_name(x));
        if (full && first_full < 0) first_full = n;
    }
    if (n != c->num_layers)
        return qt_errf(err, errlen, "%s: layer_types: expected %d entries (num_hidden_layers), got %d", path, c->num_layers, n);
    c->window_pattern = first_full + 1;
    n = 0;
    for (const qt_json_node *x = lt->child; x; x = x->next, n++) {
        int full = !strcmp(x->str, "full_attention");
        if (full != !qt_model_layer_local(c, n))
            return qt_errf(err, errlen,
                           "%s: layer_types[%d]: expected \"%s\" (full_attention on every layer i with (i + 1) %% %d == 0, "
                           "as the first one gives), got \"%s\"; other layer orders are not supported",
                           path, n, full ? "sliding_attention" : "full_attention", c->window_pattern, x->str);
    }
    return 0;
}

/* RoPE: the older top-level keys (rope_theta, rope_local_base_freq, rope_scaling) or rope_parameters with one
 * dict per layer type; the sliding layers' must be the default RoPE. */
static int read_rope(const char *path, const qt_json_node *r, qt_model_cfg *c, char *err, size_t errlen) {
    const qt_json_node *rp = qt_json_get(r, "rope_parameters");
    const qt_json_node *full = rp ? qt_json_get(rp, "full_attention") : NULL;
    const qt_json_node *slide = rp ? qt_json_get(rp, "sliding_attention") : NULL;
    if (get_opt(path, r, "rope_local_base_freq", 10000.0f, &c->rope_local_theta, err, errlen)) return -1;
    if (!full && !slide) {
        if (qt_hf_read_rope(path, r, &c->rope, err, errlen)) return -1;
        if (!qt_json_get(r, "rope_theta") && !(rp && qt_json_get(rp, "rope_theta"))) c->rope_theta = 1e6f;
        return 0;
    }
    qt_rope_cfg local;
    float t;
    if (qt_hf_read_rope_dict(path, "rope_parameters.full_attention", full, &c->rope, err, errlen) ||
        qt_hf_read_rope_dict(path, "rope_parameters.sliding_attention", slide, &local, err, errlen))
        return -1;
    if (local.type != QT_ROPE_DEFAULT)
        return qt_errf(err, errlen, "%s: rope_parameters.sliding_attention.rope_type: expected \"default\" (scaling on "
                       "the local layers is not supported), got \"%s\"", path, qt_rope_type_names[local.type]);
    if (full && get_opt(path, full, "rope_theta", 1e6f, &t, err, errlen)) return -1;
    c->rope_theta = full ? t : 1e6f;
    if (slide && get_opt(path, slide, "rope_theta", 10000.0f, &c->rope_local_theta, err, errlen)) return -1;
    return 0;
}

int qt_hf_gemma_read_config(const char *path, const qt_json_node *root, qt_model_cfg *c, char *err, size_t errlen) {
    const qt_json_node *mt = qt_json_get(root, "model_type"), *r = root;
    if (!strcmp(mt->str, "gemma3")) { /* Gemma3ForConditionalGeneration: its text model only */
        r = qt_json_get(root, "text_config");
        if (!r || r->type != QT_JSON_OBJ)
            return qt_errf(err, errlen, "%s: text_config: expected an object (model_type gemma3), got %s", path, type_name(r));
    }
    int flag = 0;
    memset(c, 0, sizeof *c);
    c->arch = QT_ARCH_GEMMA3;
    if (expect_str(path, r, "hidden_activation", "gelu_pytorch_tanh", err, errlen) ||
        expect_str(path, r, "hidden_act", "gelu_pytorch_tanh", err, errlen) || qt_hf_read_sizes(path, r, c, err, errlen) ||
        qt_hf_get_bool(path, r, "tie_word_embeddings", 1, &c->tie_embeddings, err, errlen) ||
        qt_hf_get_int(path, r, "head_dim", 256, 1, 1 << 30, &c->head_dim, err, errlen) ||
        qt_hf_get_int(path, r, "max_position_embeddings", 131072, 1, 1 << 30, &c->max_seq_len, err, errlen) ||
        get_opt(path, r, "query_pre_attn_scalar", 256.0f, &c->attn_scalar, err, errlen) ||
        get_opt(path, r, "final_logit_softcapping", 0.0f, &c->logit_softcap, err, errlen) ||
        read_rope(path, r, c, err, errlen))
        return -1;
    if (qt_hf_get_bool(path, r, "attention_bias", 0, &flag, err, errlen)) return -1;
    if (flag) return qt_errf(err, errlen, "%s: attention_bias: true is not supported for gemma3 (it adds an o_proj bias)", path);
    if (qt_hf_get_bool(path, r, "use_bidirectional_attention", 0, &flag, err, errlen)) return -1;
    if (flag)
        return qt_errf(err, errlen, "%s: use_bidirectional_attention: true (EmbeddingGemma) is not supported; expected false", path);
    const qt_json_node *sw = qt_json_get(r, "sliding_window"), *lt = qt_json_get(r, "layer_types");
    if (sw && sw->type == QT_JSON_NULL) c->sliding_window = 0;
    else if (qt_hf_get_int(path, r, "sliding_window", 4096, 1, 1 << 30, &c->sliding_window, err, errlen)) return -1;
    if (lt && lt->type != QT_JSON_NULL) return read_layer_types(path, lt, c, err, errlen);
    const char *pk = qt_json_get(r, "sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
    return qt_hf_get_int(path, r, pk, 6, 0, 1 << 30, &c->window_pattern, err, errlen);
}

/* Shortest %g text that reads back to the same float, with ".0" on integers (transformers reads floats). */
static void fmt(char *out, size_t cap, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".eEn")) strncat(out, ".0", cap - strlen(out) - 1);
}

int qt_hf_gemma_config_json(char *buf, size_t cap, const qt_model_cfg *c, int bf16) {
    char eps[32], theta[32], local[32], scalar[32], capv[32], rope[512], scaling[600] = "";
    if (qt_hf_rope_json(rope, sizeof rope, &c->rope) < 0) return -1;
    if (c->rope.type != QT_ROPE_DEFAULT) snprintf(scaling, sizeof scaling, "  \"rope_scaling\": {%s},\n", rope);
    fmt(eps, sizeof eps, c->rms_norm_eps);
    fmt(theta, sizeof theta, c->rope_theta);
    fmt(local, sizeof local, c->rope_local_theta > 0 ? c->rope_local_theta : c->rope_theta);
    float qs = c->attn_scalar > 0 ? c->attn_scalar : (float)c->head_dim; /* an int in Gemma3TextConfig */
    if (qs == floorf(qs) && qs < 1e9f) snprintf(scalar, sizeof scalar, "%d", (int)qs);
    else fmt(scalar, sizeof scalar, qs);
    if (c->logit_softcap > 0) fmt(capv, sizeof capv, c->logit_softcap);
    else snprintf(capv, sizeof capv, "null");
    char window[32] = "null", types[16 * 4096 + 4];
    if (c->sliding_window > 0) snprintf(window, sizeof window, "%d", c->sliding_window);
    if ((size_t)c->num_layers * 22 + 4 > sizeof types) return -1;
    size_t t = 0;
    for (int l = 0; l < c->num_layers; l++)
        t += (size_t)snprintf(types + t, sizeof types - t, "%s\"%s\"", l ? ", " : "",
                              qt_model_layer_local(c, l) ? "sliding_attention" : "full_attention");
    const char *dt = bf16 ? "bfloat16" : "float32";
    int k = snprintf(buf, cap,
        "{\n  \"architectures\": [\"Gemma3ForCausalLM\"],\n  \"model_type\": \"gemma3_text\",\n  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n"
        "  \"rope_local_base_freq\": %s,\n%s"
        "  \"rope_parameters\": {\"full_attention\": {\"rope_theta\": %s, %s}, "
        "\"sliding_attention\": {\"rope_theta\": %s, \"rope_type\": \"default\"}},\n"
        "  \"query_pre_attn_scalar\": %s,\n  \"final_logit_softcapping\": %s,\n  \"attn_logit_softcapping\": null,\n"
        "  \"sliding_window\": %s,\n  \"sliding_window_pattern\": %d,\n  \"layer_types\": [%s],\n"
        "  \"tie_word_embeddings\": %s,\n  \"hidden_activation\": \"gelu_pytorch_tanh\",\n  \"attention_bias\": false,\n"
        "  \"use_bidirectional_attention\": false,\n  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n"
        "  \"pad_token_id\": 0,\n  \"use_cache\": true,\n  \"torch_dtype\": \"%s\",\n  \"dtype\": \"%s\"\n}\n",
        c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim, c->vocab_size,
        c->max_seq_len, eps, theta, local, scaling, theta, rope, local, scalar, capv, window, c->window_pattern, types,
        c->tie_embeddings ? "true" : "false", dt, dt);
    return k < 0 || (size_t)k >= cap ? -1 : k;
}

void qt_hf_gemma_text_name(char *out, size_t cap, const char *name, int *skip) {
    static const char *const vision[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                         "model.multi_modal_projector."};
    *skip = 0;
    for (size_t i = 0; i < sizeof vision / sizeof *vision; i++)
        if (!strncmp(name, vision[i], strlen(vision[i]))) *skip = 1;
    if (!strncmp(name, "language_model.", 15)) name += 15; /* language_model.model.* -> model.* */
    else if (!strncmp(name, "model.language_model.", 21)) { /* transformers 5's own naming -> model.* */
        snprintf(out, cap, "model.%s", name + 21);
        return;
    }
    snprintf(out, cap, "%s", name);
}
