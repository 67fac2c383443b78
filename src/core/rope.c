/* rope.c — RoPE inverse frequencies per rope_type (qt_rope.h), after transformers' modeling_rope_utils.py:
 *   default  inv[i] = theta^(-2i/D)
 *   linear   inv[i] / factor
 *   dynamic  theta' = theta * (factor * L / M - (factor - 1))^(D / (D-2)), L = max(seq_len, M), M = max_seq_len
 *   llama3   wavelength w = 2 pi / inv: w > orig / low_freq_factor: inv / factor; w < orig / high_freq_factor:
 *            inv; between: (1 - s) inv / factor + s inv, s = (orig / w - low) / (high - low)
 *   yarn     a linear ramp over the pairs between the correction dims of beta_fast and beta_slow blends
 *            inv (below the ramp) into inv / factor (above it); cos/sin times attention_factor
 * Each expression keeps transformers' operation order, in double (transformers: fp32 tensors). */
#include "qt_rope.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qt_error.h"

const char *const qt_rope_type_names[QT_ROPE_LLAMA3 + 1] = {"default", "linear", "dynamic", "yarn", "llama3"};

int qt_rope_type_parse(const char *s) {
    for (int i = 0; i <= QT_ROPE_LLAMA3; i++)
        if (!strcmp(s, qt_rope_type_names[i])) return i;
    return -1;
}

void qt_rope_finish(qt_model_cfg *c) {
    qt_rope_cfg *r = &c->rope;
    if ((r->type == QT_ROPE_YARN || r->type == QT_ROPE_LLAMA3) && r->original_max_pos == 0)
        r->original_max_pos = c->max_seq_len;
    if (r->type != QT_ROPE_YARN) r->truncate = 0; /* yarn's alone: equal settings compare equal */
}

static int finite_pos(float x) { return x > 0 && isfinite(x); }

int qt_rope_validate(const qt_model_cfg *c, char *err, size_t errlen) {
    const qt_rope_cfg *r = &c->rope;
    if ((unsigned)r->type > QT_ROPE_LLAMA3)
        return qt_errf(err, errlen, "model.rope_type: expected default, linear, dynamic, yarn or llama3, got %d", (int)r->type);
    if (r->type == QT_ROPE_DEFAULT) return 0;
    const char *t = qt_rope_type_names[r->type];
    int D = c->head_dim ? c->head_dim : c->hidden_size / c->num_heads;
    if (!finite_pos(r->factor))
        return qt_errf(err, errlen, "model.rope_factor: expected a finite number > 0 for rope_type %s, got %g", t, r->factor);
    if (r->type == QT_ROPE_DYNAMIC && D <= 2)
        return qt_errf(err, errlen, "model.head_dim: rope_type dynamic needs head_dim > 2 (its exponent is D / (D - 2)), got %d", D);
    if ((r->type == QT_ROPE_YARN || r->type == QT_ROPE_LLAMA3) && r->original_max_pos <= 0)
        return qt_errf(err, errlen, "model.rope_original_max_position_embeddings: expected an integer > 0 for rope_type %s, got %d",
                       t, r->original_max_pos);
    if (r->type == QT_ROPE_LLAMA3) {
        if (!finite_pos(r->low_freq_factor))
            return qt_errf(err, errlen, "model.rope_low_freq_factor: expected a finite number > 0 for rope_type llama3, got %g",
                           r->low_freq_factor);
        if (!(r->high_freq_factor > r->low_freq_factor) || !isfinite(r->high_freq_factor))
            return qt_errf(err, errlen, "model.rope_high_freq_factor: expected a finite number > rope_low_freq_factor (%g), got %g",
                           r->low_freq_factor, r->high_freq_factor);
    }
    if (r->type == QT_ROPE_YARN) {
        const float v[3] = {r->beta_fast, r->beta_slow, r->attention_factor};
        const char *k[3] = {"model.rope_beta_fast", "model.rope_beta_slow", "model.rope_attention_factor"};
        for (int i = 0; i < 3; i++)
            if (!(v[i] >= 0) || !isfinite(v[i]))
                return qt_errf(err, errlen, "%s: expected a finite number >= 0 (0: transformers' default), got %g", k[i], v[i]);
        if (r->truncate != 0 && r->truncate != 1)
            return qt_errf(err, errlen, "model.rope_truncate: expected 0 or 1, got %d", r->truncate);
    }
    return 0;
}

static void llama3(const qt_rope_cfg *r, int h, double *inv) {
    double f = r->factor, lo = r->low_freq_factor, hi = r->high_freq_factor, orig = r->original_max_pos;
    double lo_wl = orig / lo, hi_wl = orig / hi;
    for (int i = 0; i < h; i++) {
        double wl = 2 * M_PI / inv[i];
        if (wl > lo_wl) {
            inv[i] = inv[i] / f;
        } else if (!(wl < hi_wl)) {
            double s = (orig / wl - lo) / (hi - lo);
            inv[i] = (1 - s) * inv[i] / f + s * inv[i];
        }
    }
}

/* The pair index at which a wavelength makes rot turns over orig positions (transformers' find_correction_dim). */
static double yarn_dim(double rot, int D, double base, double orig) {
    return (D * log(orig / (rot * 2 * M_PI))) / (2 * log(base));
}

static double yarn(const qt_rope_cfg *r, int D, double base, double *inv) {
    double f = r->factor, orig = r->original_max_pos;
    double bf = r->beta_fast ? r->beta_fast : 32, bs = r->beta_slow ? r->beta_slow : 1;
    double lo = yarn_dim(bf, D, base, orig), hi = yarn_dim(bs, D, base, orig);
    if (r->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > D - 1) hi = D - 1;
    if (lo == hi) hi += 0.001; /* transformers' guard against a zero-width ramp */
    for (int i = 0; i < D / 2; i++) {
        double pos = pow(base, 2.0 * i / D), ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra = 1 - ramp; /* weight of the unscaled frequency */
        inv[i] = 1.0 / (f * pos) * (1 - extra) + 1.0 / pos * extra;
    }
    if (r->attention_factor > 0) return r->attention_factor;
    return f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;
}

void qt_rope_inv_freq(const qt_model_cfg *c, int seq_len, double *inv, double *attn) {
    const qt_rope_cfg *r = &c->rope;
    int D = c->head_dim, h = D / 2;
    double base = c->rope_theta, f = r->factor;
    *attn = 1.0;
    if (r->type == QT_ROPE_YARN) {
        *attn = yarn(r, D, base, inv);
        return;
    }
    if (r->type == QT_ROPE_DYNAMIC) {
        double L = seq_len > c->max_seq_len ? seq_len : c->max_seq_len;
        base = base * pow(f * L / c->max_seq_len - (f - 1), (double)D / (D - 2));
    }
    for (int i = 0; i < h; i++) inv[i] = pow(base, -2.0 * i / D);
    if (r->type == QT_ROPE_LINEAR)
        for (int i = 0; i < h; i++) inv[i] = inv[i] / f;
    if (r->type == QT_ROPE_LLAMA3) llama3(r, h, inv);
}
