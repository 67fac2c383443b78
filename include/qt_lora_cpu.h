/* qt_lora_cpu.h — the CPU fp32 forward/backward of LoRA modules (qt_lora.h) and the adapters as
 * qt_cpu_model's adapter. */
#ifndef QT_LORA_CPU_H
#define QT_LORA_CPU_H

#include <stdint.h>

#include "qt_cpu_model.h"
#include "qt_lora.h"

/* CPU fp32 forward of one module: u[N, r] = xd A^T (kept for the backward), y[n, out_row0 + o] +=
 * scale * (u B^T)[n, o] with y's rows out_ld wide; xd = x masked by mseed's mask when p > 0 (x [N, in]). (+=) */
void qt_lora_fwd_cpu(const qt_lora_layout *A, const qt_lora_module *md, const float *a, const float *x, float *u,
                     float *y, long N, float p, uint64_t mseed);
/* Its backward given dy (the fused output's gradient, rows out_ld wide) and the kept u: dB += scale dy^T u,
 * dA += (scale dy B)^T xd, dx[N, in] += mask * ((scale dy B) A). ga is the adapter gradient array. (+=) */
void qt_lora_bwd_cpu(const qt_lora_layout *A, const qt_lora_module *md, const float *a, float *ga, const float *x,
                     const float *u, const float *dy, float *dx, long N, float p, uint64_t mseed);

/* The adapters as qt_cpu_model's adapter (qt_cpu_model_set_adapter), for micro-batches of N tokens: the
 * weights a and gradients ga [A->numel] are borrowed (ga +=). seed: the run's, for the dropout masks. */
typedef struct qt_lora_cpu qt_lora_cpu;
qt_lora_cpu *qt_lora_cpu_create(const qt_lora_layout *A, const float *a, float *ga, long N, uint64_t seed);
qt_cpu_adapter *qt_lora_cpu_adapter(qt_lora_cpu *c);
/* The optimizer step (1-based, the one the gradients are for) and micro-batch index the next forward and
 * backward draw their dropout masks for; step < 0: no dropout (evaluation, logits). */
void qt_lora_cpu_set_batch(qt_lora_cpu *c, long step, long micro);
void qt_lora_cpu_free(qt_lora_cpu *c);
/* The qt_cpu_model_set_grads kinds of the lora.trainable bits (qt_lora_extra). */
unsigned qt_lora_cpu_grads(int trainable);

#endif
