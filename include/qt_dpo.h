/* qt_dpo.h — sigmoid DPO (Rafailov et al. 2023) with label smoothing (conservative DPO), over summed response
 * log-probs.
 *
 * A micro-batch of objective: dpo holds pairs: rows 2p and 2p+1 are pair p's chosen and rejected sequences
 * (prompt + response, the loss mask keeping the response's tokens only; tools/tokenize --pairs). With
 * pi_c, pi_r the policy's summed log-probs of the chosen and rejected responses and ref_c, ref_r the
 * reference model's (LoRA: the frozen base, the adapters off), h = (pi_c - pi_r) - (ref_c - ref_r) and
 *   loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)     (TRL 0.x's loss_type "sigmoid")
 * rewards: beta (pi_c - ref_c) and beta (pi_r - ref_r); margin: their difference; accuracy: margin > 0.
 * Everything here is double; the log-probs are sums of the fp32 token losses. */
#ifndef QT_DPO_H
#define QT_DPO_H

#include <stdint.h>

typedef struct {
    float beta;            /* dpo.beta: the inverse temperature of the implicit reward, > 0 */
    float label_smoothing; /* dpo.label_smoothing: eps in [0, 0.5), the assumed rate of flipped labels */
} qt_dpo_cfg;

/* Sums of the per-pair values of some pairs (qt_dpo_stats_add); the means are sum / pairs. */
typedef struct {
    double loss, reward_chosen, reward_rejected, margin, accuracy;
    long pairs;
} qt_dpo_stats;

/* One pair's loss; *dl_dpc = d loss / d pi_c (= -d loss / d pi_r). Adds the pair to st when st != NULL. */
double qt_dpo_pair(const qt_dpo_cfg *c, double pc, double pr, double rc, double rr, double *dl_dpc, qt_dpo_stats *st);

/* The summed log-probs of rows [B] of T tokens from the token losses (-log p of the target; rows whose
 * targets are < 0 add nothing): logp[b] = -sum_t loss[b*T + t] over tgt >= 0. */
void qt_dpo_row_logps(double *logp, const float *loss, const int32_t *tgt, int B, int T);

/* The DPO loss of B/2 pairs (rows 2p chosen, 2p+1 rejected) from the policy's and the reference's row
 * log-probs: the mean loss; row_scale[b] (may be NULL) = pair_weight * d(loss of the pair)/d(token loss of
 * row b) = -pair_weight * d loss / d pi (the weight cross-entropy's backward gives each of row b's targets).
 * Adds the pairs to st when st != NULL. */
double qt_dpo_batch(const qt_dpo_cfg *c, const double *pi, const double *ref, int B, float pair_weight,
                    float *row_scale, qt_dpo_stats *st);

struct qt_cpu_model;
struct qt_cpu_adapter;
/* One DPO micro-batch of B rows (B/2 pairs) of T tokens on the CPU model m: the reference forward over weights
 * w_ref with no adapter (LoRA: w_ref = w, the frozen base; full fine-tuning: the initial weights), then the
 * policy forward over w with `policy` beside it (NULL: none); backward 1: the backward too, grad += pair_weight
 * * d(sum of the pairs' losses)/dw (the adapter takes its own gradients; grad NULL: the adapter's only). Returns
 * the mean loss of the pairs; adds them to st (may be NULL). */
double qt_dpo_cpu_step(struct qt_cpu_model *m, const float *w, struct qt_cpu_adapter *policy, const float *w_ref,
                       const int32_t *in, const int32_t *tgt, int B, int T, const qt_dpo_cfg *c, int backward,
                       float *grad, float pair_weight, qt_dpo_stats *st);

/* The summed log-probs logp[B] of rows [B] of T tokens (qt_dpo_row_logps) of a forward of m over w, no adapter. */
void qt_dpo_cpu_row_logps(struct qt_cpu_model *m, const float *w, const int32_t *in, const int32_t *tgt, int B, int T,
                          double *logp);
/* qt_dpo_cpu_step of full fine-tuning with the reference's row log-probs given (ref[B]: the stored reference of these
 * rows, qt_train_dpo_ref.h) instead of a reference forward: the policy forward over w, the loss, and with backward
 * grad += pair_weight * d(sum of the pairs' losses)/dw. The same bits as qt_dpo_cpu_step whose reference forward gave
 * ref. */
double qt_dpo_cpu_step_stored(struct qt_cpu_model *m, const float *w, const double *ref, const int32_t *in,
                              const int32_t *tgt, int B, int T, const qt_dpo_cfg *c, int backward, float *grad,
                              float pair_weight, qt_dpo_stats *st);

/* What a CPU engine keeps for the log: the pairs of the micro-steps since the last optimizer step, of the
 * last step, of the evaluations since the last look (qt_engine_ops.dpo_stats). */
typedef struct {
    qt_dpo_stats acc, last, eval;
} qt_dpo_log;
/* At an optimizer step: acc becomes last. */
void qt_dpo_log_step(qt_dpo_log *l);
/* last (eval 0), or eval (eval 1, then cleared), into s. */
void qt_dpo_log_take(qt_dpo_log *l, int eval, qt_dpo_stats *s);

/* Adds b into a. */
void qt_dpo_stats_add(qt_dpo_stats *a, const qt_dpo_stats *b);

#endif
