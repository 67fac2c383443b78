/* dpo.c — the sigmoid DPO loss, its derivative and the logged rewards (qt_dpo.h), in double. */
#include "qt_dpo.h"

#include <math.h>
#include <stdlib.h>

#include "qt_cpu_model.h"
#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

/* log sigmoid(x), stable for large |x|. */
static double log_sigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }

static double sigmoid(double x) { return x < 0 ? exp(x) / (1 + exp(x)) : 1 / (1 + exp(-x)); }

double qt_dpo_pair(const qt_dpo_cfg *c, double pc, double pr, double rc, double rr, double *dl_dpc, qt_dpo_stats *st) {
    double beta = c->beta, eps = c->label_smoothing;
    double z = beta * ((pc - pr) - (rc - rr));
    double loss = -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
    *dl_dpc = beta * (-(1 - eps) * sigmoid(-z) + eps * sigmoid(z));
    if (st) {
        double rwc = beta * (pc - rc), rwr = beta * (pr - rr);
        st->loss += loss;
        st->reward_chosen += rwc;
        st->reward_rejected += rwr;
        st->margin += rwc - rwr;
        st->accuracy += rwc > rwr;
        st->pairs++;
    }
    return loss;
}

void qt_dpo_row_logps(double *logp, const float *loss, const int32_t *tgt, int B, int T) {
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (long t = (long)b * T; t < (long)(b + 1) * T; t++)
            if (tgt[t] >= 0) s -= loss[t];
        logp[b] = s;
    }
}

double qt_dpo_batch(const qt_dpo_cfg *c, const double *pi, const double *ref, int B, float pair_weight,
                    float *row_scale, qt_dpo_stats *st) {
    double sum = 0;
    int swap = 0; /* 1: chosen and rejected read the other way round (a planted bug) */
#ifdef QT_MUTANTS
    swap = qt_mutant_on(QT_MUT_DPO_SWAPPED);
#endif
    for (int p = 0; p < B / 2; p++) {
        int ic = 2 * p + swap, ir = 2 * p + 1 - swap;
        double d;
        sum += qt_dpo_pair(c, pi[ic], pi[ir], ref[ic], ref[ir], &d, st);
        if (row_scale) {
            row_scale[ic] = (float)(-pair_weight * d);
            row_scale[ir] = (float)(pair_weight * d);
        }
    }
    return B >= 2 ? sum / (B / 2) : 0.0;
}

void qt_dpo_stats_add(qt_dpo_stats *a, const qt_dpo_stats *b) {
    a->loss += b->loss;
    a->reward_chosen += b->reward_chosen;
    a->reward_rejected += b->reward_rejected;
    a->margin += b->margin;
    a->accuracy += b->accuracy;
    a->pairs += b->pairs;
}

double qt_dpo_cpu_step(qt_cpu_model *m, const float *w, qt_cpu_adapter *policy, const float *w_ref, const int32_t *in,
                       const int32_t *tgt, int B, int T, const qt_dpo_cfg *c, int backward, float *grad, float pair_weight,
                       qt_dpo_stats *st) {
    QT_CHECK(B >= 2 && B % 2 == 0, "objective: dpo: a micro-batch of %d rows (expected pairs: an even count)", B);
    double *lp = malloc(2 * (size_t)B * sizeof *lp);
    float *scale = malloc((size_t)B * sizeof *scale);
    QT_CHECK(lp && scale, "out of host memory");
    int planted = 0; /* 1: the reference forward is the policy's (a planted bug) */
#ifdef QT_MUTANTS
    planted = qt_mutant_on(QT_MUT_DPO_REF_ADAPTED);
#endif
    qt_cpu_model_set_adapter(m, planted ? policy : NULL);
    qt_cpu_model_forward(m, planted ? w : w_ref, in, tgt);
    qt_dpo_row_logps(lp + B, qt_cpu_model_token_losses(m), tgt, B, T);
    qt_cpu_model_set_adapter(m, policy);
    qt_cpu_model_forward(m, w, in, tgt);
    qt_dpo_row_logps(lp, qt_cpu_model_token_losses(m), tgt, B, T);
    double loss = qt_dpo_batch(c, lp, lp + B, B, pair_weight, scale, st);
    if (backward) qt_cpu_model_backward_rows(m, w, grad, scale);
    free(lp);
    free(scale);
    return loss;
}

void qt_dpo_cpu_row_logps(qt_cpu_model *m, const float *w, const int32_t *in, const int32_t *tgt, int B, int T,
                          double *logp) {
    qt_cpu_model_set_adapter(m, NULL);
    qt_cpu_model_forward(m, w, in, tgt);
    qt_dpo_row_logps(logp, qt_cpu_model_token_losses(m), tgt, B, T);
}

double qt_dpo_cpu_step_stored(qt_cpu_model *m, const float *w, const double *ref, const int32_t *in, const int32_t *tgt,
                              int B, int T, const qt_dpo_cfg *c, int backward, float *grad, float pair_weight,
                              qt_dpo_stats *st) {
    QT_CHECK(B >= 2 && B % 2 == 0, "objective: dpo: a micro-batch of %d rows (expected pairs: an even count)", B);
    double *lp = malloc((size_t)B * sizeof *lp);
    float *scale = malloc((size_t)B * sizeof *scale);
    QT_CHECK(lp && scale, "out of host memory");
    qt_dpo_cpu_row_logps(m, w, in, tgt, B, T, lp);
    double loss = qt_dpo_batch(c, lp, ref, B, pair_weight, scale, st);
    if (backward) qt_cpu_model_backward_rows(m, w, grad, scale);
    free(lp);
    free(scale);
    return loss;
}

void qt_dpo_log_step(qt_dpo_log *l) {
    l->last = l->acc;
    l->acc = (qt_dpo_stats){0};
}

void qt_dpo_log_take(qt_dpo_log *l, int eval, qt_dpo_stats *s) {
    *s = eval ? l->eval : l->last;
    if (eval) l->eval = (qt_dpo_stats){0};
}
