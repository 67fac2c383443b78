/* qt_cpu_model.h — the Llama/Qwen2/Gemma 3 forward and backward on the CPU in fp32, built from qt_ref ops.
 *
 * Per block: x -> RMSNorm -> QKV (+bias) -> (qk_norm: RMSNorm per q and k head) -> RoPE -> causal GQA attention
 *              (per packed document with qt_cpu_model_set_docs)
 *              -> O -> +residual
 *              -> RMSNorm -> gate|up -> SiLU(gate)*up -> down -> +residual;
 * then final RMSNorm, LM head (tied or not), mean cross-entropy over the non-ignored targets.
 * Gemma 3 (arch gemma3, docs/models-gemma3.md): embeddings times sqrt(C), every norm scales by 1 + w, a norm on
 * the attention and the MLP output before each residual add, GeGLU-tanh, per-layer window and RoPE base, the
 * attention scale query_pre_attn_scalar^-0.5, and the logits soft-capped before the loss when set. */
#ifndef QT_CPU_MODEL_H
#define QT_CPU_MODEL_H

#include <stddef.h>

#include "qt_docs.h"
#include "qt_model.h"

typedef struct qt_cpu_model qt_cpu_model;

/* Allocates the activations for B sequences of T tokens (T <= max_seq_len). The layout is borrowed
 * and must outlive the model. Free with qt_cpu_model_free. */
qt_cpu_model *qt_cpu_model_create(const qt_layout *L, int B, int T);
/* Host bytes qt_cpu_model_create allocates for its activations and gradients (the planner's row). */
size_t qt_cpu_model_bytes(const qt_layout *L, int B, int T);
void qt_cpu_model_free(qt_cpu_model *m);

/* Forward over tokens[B*T]; returns the mean loss over targets >= 0 (targets may be NULL: logits
 * only, returns 0). Keeps what backward needs. */
float qt_cpu_model_forward(qt_cpu_model *m, const float *w, const int32_t *tokens, const int32_t *targets);
/* Backward of the last forward: grad[numel] += grad_scale * d(sum of the losses of the targets >= 0)/dw
 * (+=). grad_scale is the weight of one target: 1/qt_cpu_model_targets(m) gives the gradient of the
 * mean loss; the trainer passes qt_loss_scale() so a step averages over all its targets. */
void qt_cpu_model_backward(qt_cpu_model *m, const float *w, float *grad, float grad_scale);
/* The number of targets >= 0 in the last forward. */
/* The documents of the following forwards (qt_docs.h; NULL: causal attention over each row, positions t):
 * expanded into per-token key bounds and positions held by m. Returns 0, or -1 with err (malformed starts:
 * the forwards then run without documents). */
int qt_cpu_model_set_docs(qt_cpu_model *m, const qt_docs *d, char *err, size_t errlen);
long qt_cpu_model_targets(const qt_cpu_model *m);
/* The last forward's logits [B*T, V] (overwritten by backward). */
const float *qt_cpu_model_logits(const qt_cpu_model *m);

#endif
