/* hf_rope.c — rope_scaling / rope_parameters of an HF config.json to and from qt_rope_cfg (qt_hf_rope.h).
 * The keys and defaults are transformers' (modeling_rope_utils.py): factor is required by every scaled
 * type, llama3 also needs low_freq_factor and high_freq_factor, original_max_position_embeddings defaults
 * to max_position_embeddings (qt_rope_finish), yarn's beta_fast / beta_slow default to 32 / 1. */
#include "qt_hf_rope.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_rope.h"

static const char *type_name(const qt_json_node *x) {
    static const char *n[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return x ? n[x->type] : "nothing";
}

/* dict.key as a number > 0 that a float holds (an integer <= 2^30 when integer); absent or null: *out
 * unchanged, an error when required_by names the rope_type that needs it. */
static int get_param(const char *path, const char *dict, const qt_json_node *o, const char *key,
                     const char *required_by, int integer, double *out, char *err, size_t errlen) {
    const qt_json_node *x = qt_json_get(o, key);
    const char *want = integer ? "an integer in [1, 2^30]" : "a number > 0 within the 32-bit float range";
    if (!x || x->type == QT_JSON_NULL) {
        if (required_by)
            return qt_errf(err, errlen, "%s: %s.%s: missing (rope_type %s needs %s)", path, dict, key, required_by, want);
        return 0;
    }
    if (x->type != QT_JSON_NUM) return qt_errf(err, errlen, "%s: %s.%s: expected %s, got %s", path, dict, key, want, type_name(x));
    int bad = integer ? x->num != floor(x->num) || x->num < 1 || x->num > (1 << 30)
                      : !(x->num > 0) || x->num > FLT_MAX || (float)x->num == 0;
    if (bad) return qt_errf(err, errlen, "%s: %s.%s: expected %s, got %.17g", path, dict, key, want, x->num);
    *out = x->num;
    return 0;
}

/* transformers' yarn get_mscale */
static double mscale_of(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static int read_yarn(const char *path, const char *dict, const qt_json_node *x, qt_rope_cfg *o, char *err, size_t errlen) {
    double bf = 0, bs = 0, af = 0, ms = 0, msa = 0;
    const qt_json_node *t = qt_json_get(x, "truncate");
    if (t && t->type != QT_JSON_NULL && t->type != QT_JSON_BOOL)
        return qt_errf(err, errlen, "%s: %s.truncate: expected true or false, got %s", path, dict, type_name(t));
    o->truncate = !t || t->type == QT_JSON_NULL || t->num != 0;
    if (get_param(path, dict, x, "beta_fast", NULL, 0, &bf, err, errlen) ||
        get_param(path, dict, x, "beta_slow", NULL, 0, &bs, err, errlen) ||
        get_param(path, dict, x, "attention_factor", NULL, 0, &af, err, errlen) ||
        get_param(path, dict, x, "mscale", NULL, 0, &ms, err, errlen) ||
        get_param(path, dict, x, "mscale_all_dim", NULL, 0, &msa, err, errlen))
        return -1;
    if (!af && ms && msa) af = mscale_of(o->factor, ms) / mscale_of(o->factor, msa);
    o->beta_fast = (float)bf;
    o->beta_slow = (float)bs;
    o->attention_factor = (float)af;
    return 0;
}

/* One rope dict; absent or null: the default. */
static int read_dict(const char *path, const char *dict, const qt_json_node *x, qt_rope_cfg *o, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (!x || x->type == QT_JSON_NULL) return 0;
    if (x->type != QT_JSON_OBJ) return qt_errf(err, errlen, "%s: %s: expected an object or null, got %s", path, dict, type_name(x));
    const char *tk = "rope_type";
    const qt_json_node *t = qt_json_get(x, tk);
    if (!t) t = qt_json_get(x, tk = "type");
    if (t && t->type != QT_JSON_STR)
        return qt_errf(err, errlen, "%s: %s.%s: expected a string, got %s", path, dict, tk, type_name(t));
    int ty = t ? qt_rope_type_parse(t->str) : QT_ROPE_DEFAULT;
    if (ty < 0)
        return qt_errf(err, errlen, "%s: %s.%s: expected \"default\", \"linear\", \"dynamic\", \"yarn\" or \"llama3\", got \"%s\"",
                       path, dict, tk, t->str);
    double prf = 1;
    if (get_param(path, dict, x, "partial_rotary_factor", NULL, 0, &prf, err, errlen)) return -1;
    if (prf != 1) return qt_errf(err, errlen, "%s: %s.partial_rotary_factor: only 1 (RoPE over the whole head) is supported, got %g",
                                 path, dict, prf);
    o->type = (qt_rope_type)ty;
    if (ty == QT_ROPE_DEFAULT) return 0;
    double f = 0, omp = 0, lo = 0, hi = 0;
    int l3 = ty == QT_ROPE_LLAMA3;
    const char *tn = qt_rope_type_names[ty], *l3n = l3 ? tn : NULL;
    if (get_param(path, dict, x, "factor", tn, 0, &f, err, errlen) ||
        get_param(path, dict, x, "original_max_position_embeddings", NULL, 1, &omp, err, errlen) ||
        get_param(path, dict, x, "low_freq_factor", l3n, 0, &lo, err, errlen) ||
        get_param(path, dict, x, "high_freq_factor", l3n, 0, &hi, err, errlen))
        return -1;
    o->factor = (float)f;
    if (ty == QT_ROPE_YARN || l3) o->original_max_pos = (int)omp;
    if (l3) {
        o->low_freq_factor = (float)lo;
        o->high_freq_factor = (float)hi;
    }
    return ty == QT_ROPE_YARN ? read_yarn(path, dict, x, o, err, errlen) : 0;
}

int qt_hf_read_rope_dict(const char *path, const char *dict, const qt_json_node *x, qt_rope_cfg *out, char *err,
                         size_t errlen) {
    return read_dict(path, dict, x, out, err, errlen);
}

int qt_hf_read_rope(const char *path, const qt_json_node *root, qt_rope_cfg *out, char *err, size_t errlen) {
    const qt_json_node *s = qt_json_get(root, "rope_scaling"), *p = qt_json_get(root, "rope_parameters");
    qt_rope_cfg a, b;
    if (read_dict(path, "rope_scaling", s, &a, err, errlen) || read_dict(path, "rope_parameters", p, &b, err, errlen))
        return -1;
    int has_s = s && s->type != QT_JSON_NULL, has_p = p && p->type != QT_JSON_NULL;
    if (has_s && has_p && memcmp(&a, &b, sizeof a))
        return qt_errf(err, errlen, "%s: rope_scaling (rope_type %s) and rope_parameters (rope_type %s) disagree: expected one setting",
                       path, qt_rope_type_names[a.type], qt_rope_type_names[b.type]);
    *out = has_s ? a : b;
    return 0;
}

/* %g text of x that reads back to the same float, with ".0" when it reads as an integer (transformers
 * warns about an int where it expects a float). */
static void fmt_param(char *out, size_t cap, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".eEn")) strncat(out, ".0", cap - strlen(out) - 1);
}

int qt_hf_rope_json(char *buf, size_t cap, const qt_rope_cfg *r) {
    char v[5][32];
    size_t k = (size_t)snprintf(buf, cap, "\"rope_type\": \"%s\"", qt_rope_type_names[r->type]);
    const float p[5] = {r->factor, r->low_freq_factor, r->high_freq_factor, r->beta_fast, r->beta_slow};
    for (int i = 0; i < 5; i++) fmt_param(v[i], sizeof v[i], p[i]);
    if (k < cap && r->type != QT_ROPE_DEFAULT) k += (size_t)snprintf(buf + k, cap - k, ", \"factor\": %s", v[0]);
    if (k < cap && (r->type == QT_ROPE_YARN || r->type == QT_ROPE_LLAMA3))
        k += (size_t)snprintf(buf + k, cap - k, ", \"original_max_position_embeddings\": %d", r->original_max_pos);
    if (k < cap && r->type == QT_ROPE_LLAMA3)
        k += (size_t)snprintf(buf + k, cap - k, ", \"low_freq_factor\": %s, \"high_freq_factor\": %s", v[1], v[2]);
    if (k < cap && r->type == QT_ROPE_YARN) {
        if (r->beta_fast) k += (size_t)snprintf(buf + k, cap - k, ", \"beta_fast\": %s", v[3]);
        if (k < cap && r->beta_slow) k += (size_t)snprintf(buf + k, cap - k, ", \"beta_slow\": %s", v[4]);
        if (k < cap && r->attention_factor) {
            fmt_param(v[0], sizeof v[0], r->attention_factor);
            k += (size_t)snprintf(buf + k, cap - k, ", \"attention_factor\": %s", v[0]);
        }
        if (k < cap && !r->truncate) k += (size_t)snprintf(buf + k, cap - k, ", \"truncate\": false");
    }
    return k < cap ? (int)k : -1;
}
