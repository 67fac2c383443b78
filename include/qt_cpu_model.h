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

/* The block matmuls an adapter sits beside: input -> fused output. */
typedef enum { QT_CPU_SITE_QKV = 0, QT_CPU_SITE_O = 1, QT_CPU_SITE_GU = 2, QT_CPU_SITE_DOWN = 3 } qt_cpu_site;

/* Something beside the block matmuls (LoRA adapters, qt_lora.h): fwd adds into the site's fused output
 * y[N, out] right after the base matmul wrote it (x its input [N, in]); bwd gets that output's gradient dy
 * and adds into the input's gradient dx right after the base wrote it, accumulating its own parameters'
 * gradients where it keeps them. */
typedef struct qt_cpu_adapter qt_cpu_adapter;
struct qt_cpu_adapter {
    void (*fwd)(qt_cpu_adapter *ad, int layer, qt_cpu_site site, const float *x, float *y, long N);
    void (*bwd)(qt_cpu_adapter *ad, int layer, qt_cpu_site site, const float *x, const float *dy, float *dx, long N);
};

/* Allocates the activations for B sequences of T tokens (T <= max_seq_len). The layout is borrowed
 * and must outlive the model. Free with qt_cpu_model_free. */
qt_cpu_model *qt_cpu_model_create(const qt_layout *L, int B, int T);
/* Host bytes qt_cpu_model_create allocates for its activations and gradients (the planner's row). */
size_t qt_cpu_model_bytes(const qt_layout *L, int B, int T);
void qt_cpu_model_free(qt_cpu_model *m);

/* Forward over tokens[B*T]; returns the mean loss over targets >= 0 (targets may be NULL: logits
 * only, returns 0). Keeps what backward needs. */
float qt_cpu_model_forward(qt_cpu_model *m, const float *w, const int32_t *tokens, const int32_t *targets);
/* Sets the adapter the following forwards and backwards run (borrowed; NULL: none). */
void qt_cpu_model_set_adapter(qt_cpu_model *m, qt_cpu_adapter *ad);
/* Which base tensors the following backwards give gradients (the others stay frozen: their part of grad is
 * not touched). QT_CPU_GRAD_ALL from qt_cpu_model_create. A tied LM head's gradient is the embedding's:
 * it lands there when QT_CPU_GRAD_LM_HEAD is set. */
enum { QT_CPU_GRAD_LINEAR = 1, QT_CPU_GRAD_NORMS = 2, QT_CPU_GRAD_EMBED = 4, QT_CPU_GRAD_LM_HEAD = 8, QT_CPU_GRAD_ALL = 15 };
void qt_cpu_model_set_grads(qt_cpu_model *m, unsigned kinds);
/* Backward of the last forward: grad[numel] += grad_scale * d(sum of the losses of the targets >= 0)/dw
 * (+=). grad_scale is the weight of one target: 1/qt_cpu_model_targets(m) gives the gradient of the
 * mean loss; the trainer passes qt_loss_scale() so a step averages over all its targets. grad NULL: no
 * base gradient at all (a frozen base: only the data gradient flows, to the adapter). */
void qt_cpu_model_backward(qt_cpu_model *m, const float *w, float *grad, float grad_scale);
/* qt_cpu_model_backward with a weight per row (sequence) b of the batch: grad += d(sum over b of row_scale[b] *
 * (the sum of row b's target losses))/dw. The DPO objective (qt_dpo.h) gives each sequence its own weight. */
void qt_cpu_model_backward_rows(qt_cpu_model *m, const float *w, float *grad, const float *row_scale);
/* The documents of the following forwards (qt_docs.h; NULL: causal attention over each row, positions t):
 * expanded into per-token key bounds and positions held by m. Returns 0, or -1 with err (malformed starts:
 * the forwards then run without documents). */
int qt_cpu_model_set_docs(qt_cpu_model *m, const qt_docs *d, char *err, size_t errlen);
/* The number of targets >= 0 in the last forward. */
long qt_cpu_model_targets(const qt_cpu_model *m);
/* The last forward's token losses [B*T] (-log p of each target; meaningful where the target is >= 0). */
const float *qt_cpu_model_token_losses(const qt_cpu_model *m);
/* The last forward's logits [B*T, V] (overwritten by backward). */
const float *qt_cpu_model_logits(const qt_cpu_model *m);

#endif
