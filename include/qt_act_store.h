/* qt_act_store.h — the activations one micro-batch keeps from the forward for the backward, per
 * layer, and the backward's activation-gradient scratch.
 *
 * Policy (chosen at creation, one for all layers): a tensor of a recomputed part (memory.recompute,
 * policy.redo: the parts with the implied ones) has ONE buffer shared by all layers instead of one per layer:
 * the forward of layer l overwrites it, and before layer l's backward the model rebuilds it from what
 * the layer kept (its input residual always; rstd1/rstd2 always) with the same kernels on the same
 * inputs, so the backward reads the same bits (gpu_model.c: block_run). Everything else stays
 * per layer from the forward to the backward. The forward takes layer l's buffers with
 * qt_act_forward(l); the backward with qt_act_backward(l), whose shared tensors the caller must rebuild
 * before reading them (policy.redo says which), and gives them back with qt_act_release(l) once
 * that layer's backward is enqueued.
 *
 * Residual offload (policy.offload_residual, memory.offload_residual): layer l's input residual res
 * lives in device slot l % 2 (two slots instead of L). Layers 0..L-3 go to pinned host memory: the
 * forward calls qt_act_residual_final(l) once res is complete (after layer l's first norm has added the
 * branch into it), which copies it out on the store's copy stream; qt_act_forward(l + 1) makes the
 * compute stream wait for that copy, since layer l + 1's down projection writes res of layer l + 2 into
 * the same slot. The last two layers' residuals are still in their slots when the backward starts.
 * qt_act_backward(l) starts fetching layer l - 1's residual into its slot (free: layer l + 1's backward
 * is done with it) while layer l's backward computes; qt_act_release(l) makes the compute stream wait
 * for it. Every copy is joined before the call that started it returns control to the next layer, so a
 * step captured as CUDA graph segments (cut at the layer boundaries) has no unjoined work. */
#ifndef QT_ACT_STORE_H
#define QT_ACT_STORE_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_plan.h"

/* The plan's activations part (qt_plan.h). fp8_bwd: full fine-tuning's fp8 backward, whose wgrads read the e4m3
 * Xq^T of the matmul inputs, never ln1, ln2, h: those share one buffer over the layers, whatever is recomputed (a
 * recomputed qkv / gate|up rebuilds its norm input first). */
typedef qt_plan_acts qt_act_policy;

/* One layer's saved activations (bf16 unless noted), N = B*T tokens. */
typedef struct {
    void *res;      /* [N,C] residual stream entering the layer (input of ln1) */
    void *ln1;      /* [N,C] */
    float *rstd1;   /* [N] */
    void *qkv;      /* [N,(H+2Hkv)D] after RoPE */
    void *att;      /* [N,H*D] attention output */
    float *lse;     /* [B,H,T] attention softmax statistics */
    void *res_mid;  /* [N,C] o_proj output, then (after the fused add) the residual after attention */
    void *ln2;      /* [N,C] */
    float *rstd2;   /* [N] */
    void *gu;       /* [N,2F] gate|up */
    void *h;        /* [N,F] SwiGLU output */
    void *qk;       /* qk_norm: [N,(H+Hkv)D] the q and k heads before their norm (the qkv matmul's output) */
    float *qk_rstd; /* qk_norm: [N,H+Hkv]; both NULL without qk_norm, rebuilt with qkv when that is recomputed */
    /* Gemma's sandwich norms (docs/models-gemma3.md); all NULL for the other families: */
    void *po;        /* [N,C] o_proj output, the post-attention norm's input (rebuilt with block); res_mid then
                      * holds the norm's output, and after the fused add the residual after attention */
    void *pm;        /* [N,C] down_proj output, the post-feedforward norm's input (the next layer's res holds its
                      * output, then the sum) */
    float *rstd_pa, *rstd_pf; /* [N] their rstd */
} qt_gpu_layer;

typedef struct {
    const qt_model_cfg *c; /* borrowed */
    long N;
    qt_act_policy policy;
    qt_gpu_layer *layers;  /* [num_layers] (owned host array); a recomputed tensor's pointer (and with
                            * policy.fp8_bwd, ln1 / ln2 / h's) is the same (shared) buffer in every layer */
    void *res_final;       /* [N,C] down output of the last layer, then the final residual */
    void *lnf;             /* [N,C] */
    float *rstdf;          /* [N] */
    /* backward scratch, shared by all layers */
    float *dres;           /* [N,C] fp32 residual-stream gradient */
    void *dres_bf;         /* [N,C] its bf16 copy for the matmuls */
    void *dln;             /* [N,C] */
    void *datt;            /* [N,H*D] */
    void *dqkv;            /* [N,(H+2Hkv)D] */
    void *dlnf;            /* [N,C] */
    size_t host_bytes;     /* offload_residual: (L-2) x [N,C] bf16 of pinned host memory (0 otherwise) */
    struct qt_res_offload *off; /* offload_residual: host buffer, copy stream, events (qt_act_store_start) */
} qt_act_store;

/* A store for N tokens of model c; host side only (no CUDA call). */
qt_act_store *qt_act_store_create(const qt_model_cfg *c, long N, qt_act_policy policy, char *err, size_t errlen);
/* Frees what create and start made (the pinned host buffer, the copy stream and events included). */
void qt_act_store_free(qt_act_store *as);
/* Adds the store's rows to p (sizing pass) or takes its buffers (second pass); with offload_residual
 * also the host row "offloaded residuals". */
void qt_act_store_carve(qt_act_store *as, qt_mem_plan *p);
/* After the carve with real addresses, on the current device: with offload_residual, allocates the
 * pinned host buffer (owned), a copy stream and events; s is the compute stream (borrowed). -1 with err
 * when the host memory cannot be pinned. Nothing to do without offload_residual. */
int qt_act_store_start(qt_act_store *as, cudaStream_t s, const char *cfg_path, char *err, size_t errlen);

/* Layer l's buffers for its forward to write / its backward to read (see the top of this file); with
 * offload_residual they also order the copies (compute stream waits, copy-stream work started). */
qt_gpu_layer *qt_act_forward(qt_act_store *as, int l);
qt_gpu_layer *qt_act_backward(qt_act_store *as, int l);
void qt_act_release(qt_act_store *as, int l);
/* Layer l's res is complete for the forward (enqueued on the compute stream): offload_residual copies
 * it to host memory (layers 0..L-3). */
void qt_act_residual_final(qt_act_store *as, int l);

#endif
