/* qt_gpu_dpo.h — one objective: dpo micro-batch on the GPU LoRA model (qt_dpo.h's sigmoid DPO).
 *
 * The reference is the frozen base with the adapters switched off: a forward and the LM head's losses, nothing kept
 * (its activations are overwritten by the policy's forward, which follows). The policy forward keeps its activations;
 * the row log-probs of both come to the host (two [N] fp32 copies), where qt_dpo_batch gives the loss, the stats
 * and each row's gradient weight; the backward then runs the LM head again with those weights
 * (qt_gpu_model_backward_rows). No device memory beyond the model's. */
#ifndef QT_GPU_DPO_H
#define QT_GPU_DPO_H

#include <stdint.h>

#include "qt_dpo.h"
#include "qt_gpu_model.h"

typedef struct qt_gpu_dpo qt_gpu_dpo;

/* The host buffers of the DPO micro-steps of model g (LoRA: g->lora set; B even). Free with qt_gpu_dpo_free. */
qt_gpu_dpo *qt_gpu_dpo_create(const qt_gpu_model *g);
void qt_gpu_dpo_free(qt_gpu_dpo *d);
/* One micro-batch of the tokens already in g->tok / g->tgt (tgt: the same targets on the host, [B*T]), B/2 pairs
 * (rows 2p chosen, 2p+1 rejected): the reference forward, the policy forward (the adapters' dropout as
 * qt_gpu_lora_set_batch named it) and, with backward, the adapters' gradients += pair_weight * d(sum of the pairs'
 * losses). Returns the mean loss of the pairs; adds them to st (may be NULL). Synchronises g->stream twice. */
double qt_gpu_dpo_step(qt_gpu_dpo *d, qt_gpu_model *g, const int32_t *tgt, const qt_dpo_cfg *c, int backward,
                       float pair_weight, qt_dpo_stats *st);

#endif
