/* qt_act_store.h — the activations one micro-batch keeps from the forward for the backward, per
 * layer, and the backward's activation-gradient scratch.
 *
 * Policy (chosen at creation, one for all layers today): QT_ACT_SAVE keeps every layer's tensors on
 * the GPU from its forward to its backward. QT_ACT_RECOMPUTE (recompute parts in the backward from
 * the saved input residual, through the model's block_forward) and QT_ACT_OFFLOAD (residuals in pinned
 * host memory, back before the layer's backward) are declared for the memory work (issue 23) and
 * refused until then. The forward takes layer l's buffers with qt_act_forward(l); the backward with
 * qt_act_backward(l), which is where a recompute or offload policy rebuilds or fetches them, and gives
 * them back with qt_act_release(l) once that layer's backward is enqueued. */
#ifndef QT_ACT_STORE_H
#define QT_ACT_STORE_H

#include <stddef.h>

#include "qt_mem_plan.h"
#include "qt_model.h"

typedef enum { QT_ACT_SAVE, QT_ACT_RECOMPUTE, QT_ACT_OFFLOAD } qt_act_policy;

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
} qt_gpu_layer;

typedef struct {
    const qt_model_cfg *c; /* borrowed */
    long N;
    qt_act_policy policy;
    qt_gpu_layer *layers;  /* [num_layers] (owned host array) */
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
} qt_act_store;

/* A store for N tokens of model c; NULL with err for a policy not implemented yet. */
qt_act_store *qt_act_store_create(const qt_model_cfg *c, long N, qt_act_policy policy, char *err, size_t errlen);
void qt_act_store_free(qt_act_store *as);
/* Adds the store's rows to p (sizing pass) or takes its buffers (second pass). */
void qt_act_store_carve(qt_act_store *as, qt_mem_plan *p);

/* Layer l's buffers for its forward to write / its backward to read (see the top of this file). */
qt_gpu_layer *qt_act_forward(qt_act_store *as, int l);
qt_gpu_layer *qt_act_backward(qt_act_store *as, int l);
void qt_act_release(qt_act_store *as, int l);

#endif
