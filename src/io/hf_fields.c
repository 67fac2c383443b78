/* hf_fields.c — config.json's typed members and the sizes every family has (qt_hf_fields.h), read with
 * errors that name the file and the key. */
#include "qt_hf_fields.h"

#include <float.h>
#include <math.h>

#include "qt_error.h"

const char *qt_hf_type_name(const qt_json_node *x) {
    static const char *n[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return x ? n[x->type] : "nothing";
}

int qt_hf_get_int(const char *path, const qt_json_node *o, const char *key, int def, int lo, int hi, int *out,
                  char *err, size_t errlen) {
    const qt_json_node *x = qt_json_get(o, key);
    if (!x || x->type == QT_JSON_NULL) {
        if (def < lo) return qt_errf(err, errlen, "%s: %s: missing (expected an integer >= %d)", path, key, lo);
        *out = def;
        return 0;
    }
    if (x->type != QT_JSON_NUM)
        return qt_errf(err, errlen, "%s: %s: expected an integer in [%d, %d], got %s", path, key, lo, hi, qt_hf_type_name(x));
    if (x->num != floor(x->num) || x->num < lo || x->num > hi)
        return qt_errf(err, errlen, "%s: %s: expected an integer in [%d, %d], got %.17g", path, key, lo, hi, x->num);
    *out = (int)x->num;
    return 0;
}

int qt_hf_get_num(const char *path, const qt_json_node *o, const char *key, float def, float *out, char *err,
                  size_t errlen) {
    const qt_json_node *x = qt_json_get(o, key);
    if (!x || x->type == QT_JSON_NULL) { *out = def; return 0; }
    /* A float field: the value must survive the conversion (1e300 would become inf, 1e-50 zero). */
    if (x->type != QT_JSON_NUM)
        return qt_errf(err, errlen, "%s: %s: expected a number > 0, got %s", path, key, qt_hf_type_name(x));
    if (!(x->num > 0) || x->num > FLT_MAX || (float)x->num == 0)
        return qt_errf(err, errlen, "%s: %s: expected a number > 0 within the 32-bit float range (1.4e-45 .. 3.4e38), got %.17g",
                       path, key, x->num);
    *out = (float)x->num;
    return 0;
}

int qt_hf_get_bool(const char *path, const qt_json_node *o, const char *key, int def, int *out, char *err,
                   size_t errlen) {
    const qt_json_node *x = qt_json_get(o, key);
    if (!x || x->type == QT_JSON_NULL) { *out = def; return 0; }
    if (x->type != QT_JSON_BOOL) return qt_errf(err, errlen, "%s: %s: expected true or false, got %s", path, key, qt_hf_type_name(x));
    *out = x->num != 0;
    return 0;
}

int qt_hf_read_sizes(const char *path, const qt_json_node *r, qt_model_cfg *c, char *err, size_t errlen) {
    const int big = 1 << 30;
    if (qt_hf_get_int(path, r, "hidden_size", -1, 1, big, &c->hidden_size, err, errlen) ||
        qt_hf_get_int(path, r, "num_hidden_layers", -1, 1, big, &c->num_layers, err, errlen) ||
        qt_hf_get_int(path, r, "num_attention_heads", -1, 1, big, &c->num_heads, err, errlen) ||
        qt_hf_get_int(path, r, "num_key_value_heads", c->num_heads, 1, big, &c->num_kv_heads, err, errlen) ||
        qt_hf_get_int(path, r, "intermediate_size", -1, 1, big, &c->intermediate_size, err, errlen) ||
        qt_hf_get_int(path, r, "vocab_size", -1, 1, big, &c->vocab_size, err, errlen) ||
        qt_hf_get_int(path, r, "head_dim", 0, 0, big, &c->head_dim, err, errlen) ||
        qt_hf_get_int(path, r, "max_position_embeddings", 2048, 1, big, &c->max_seq_len, err, errlen) ||
        qt_hf_get_num(path, r, "rms_norm_eps", 1e-6f, &c->rms_norm_eps, err, errlen) ||
        qt_hf_get_bool(path, r, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen))
        return -1;
    /* rope_theta at the top level, in rope_parameters (newer transformers) or both: then they must agree */
    const qt_json_node *rp = qt_json_get(r, "rope_parameters");
    float top = 10000.0f, inner = 10000.0f;
    int has_top = qt_json_get(r, "rope_theta") != NULL, has_inner = rp && rp->type == QT_JSON_OBJ && qt_json_get(rp, "rope_theta");
    if ((has_top && qt_hf_get_num(path, r, "rope_theta", 10000.0f, &top, err, errlen)) ||
        (has_inner && qt_hf_get_num(path, rp, "rope_theta", 10000.0f, &inner, err, errlen)))
        return -1;
    if (has_top && has_inner && top != inner)
        return qt_errf(err, errlen, "%s: rope_theta %g and rope_parameters.rope_theta %g disagree: expected one value", path,
                       top, inner);
    c->rope_theta = has_top ? top : inner;
    return 0;
}
