/* qt_gpu_lora.h — LoRA adapters on one GPU (qt_lora.h's layout): their fp32 weights, gradients and AdamW
 * moments, their bf16 copy (the GEMMs' operands), the kept u = xd A^T of every module, and the calls the model makes
 * beside its block matmuls.
 *
 * The model (qt_gpu_model) runs each block matmul on the frozen base, then: forward qt_gpu_lora_fwd (y += the
 * site's adapter terms), backward qt_gpu_lora_bwd_w before the base's dgrad (the adapter gradients, which read
 * the matmul's input: the down projection's dgrad writes over it) and qt_gpu_lora_bwd_x after it (dx += the
 * adapter term). The dropout masks are the CPU engine's (qt_lora_mask_seed of the step and micro-batch that
 * qt_gpu_lora_set_batch names). Whoever writes the fp32 adapters (init, AdamW, a loaded checkpoint, an imported
 * adapter) calls qt_gpu_lora_refresh before the next forward. Its device rows: "LoRA adapters (fp32)", "LoRA
 * adapters (bf16 copy)", "LoRA gradients (fp32)", "LoRA adam m, v (fp32)", "LoRA activations (bf16)".
 * lora.trainable's base tensors (embeddings, LM head, norms: qt_lora_trains) train beside the adapters: their fp32
 * master, gradient and moments follow the adapters' in the same arrays ([A.numel, n) of a, ga, m, v, packed in layout
 * order: the CPU engine's lora_extras blobs), the model's backward accumulates their gradients there (xgrad), and
 * refresh writes their bf16 rounding into the frozen base where the model reads them. */
#ifndef QT_GPU_LORA_H
#define QT_GPU_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "qt_cuda_types.h"
#include "qt_lora.h"
#include "qt_matmul.h"
#include "qt_mem_plan.h"
#include "qt_plan.h"
#include "qt_weight_src.h"

struct qt_gpu_base;

typedef struct qt_gpu_lora {
    qt_lora_layout A;   /* owned */
    long N;             /* tokens per micro-batch */
    float *a, *ga, *m, *v; /* device [n] each: adapters, their gradients (+=), AdamW moments; the trained base
                            * tensors' from A.numel on */
    size_t n;           /* A.numel + xn */
    const qt_layout *L; /* borrowed */
    int nxt;            /* trained base tensors (lora.trainable) */
    int *xt;            /* [nxt] their indices into L->tensors, in layout order (owned) */
    size_t xn;          /* their elements */
    size_t *xat;        /* [nxt] each one's place in a, ga, m, v (A.numel + the ones before; owned) */
    void **x16;         /* [nxt] each one's bf16 weights in the frozen base (set by init; owned array) */
    void *ab;           /* device bf16 [A.numel]: RNE of a (qt_gpu_lora_refresh), what the kernels multiply */
    void *u;            /* device bf16 [modules][N][r]: xd A^T of the last forward (the backward's input) */
    void *g;            /* device bf16 [3][N][r]: scale * dy B of each module of the site in the backward (q, k, v at
                         * most) */
    void *xs;           /* device: the kernels' dropout scratch (qt_lora_ws_bytes of the widest input); NULL when
                         * lora.dropout is 0 */
    qt_matmul_ctx *mm;  /* the model's matmul context (not owned): every adapter GEMM goes through it */
    float *norm, *clip; /* device scalars: the adapters' gradient norm and clip scale */
    void *ws;           /* device: qt_grad_norm's workspace */
    struct qt_adamw_plan *opt; /* one entry per adapter tensor, all decayed, and per trained base tensor */
    uint64_t seed;      /* the run's (optimizer.seed): init and dropout masks */
    long step, micro;   /* the masks' step (< 0: no dropout) and micro-batch */
    int off;            /* 1: the forward runs the frozen base alone (the DPO reference model); no backward then */
} qt_gpu_lora;

/* The adapters of plan pl over layout L for micro-batches of N tokens, sized (nothing allocated); NULL when
 * pl->lora.rank is 0, or with err (invalid lora settings; embeddings or LM head trained in a tied model). */
qt_gpu_lora *qt_gpu_lora_create(const qt_layout *L, const qt_plan *pl, long N, char *err, size_t errlen);
/* Adds its rows to p (sizing pass) or takes its buffers (second pass). */
void qt_gpu_lora_carve(qt_gpu_lora *gl, qt_mem_plan *p);
/* Once the arena exists and the base is loaded: PEFT's init (qt_lora_init of seed) and its bf16 copy, the trained
 * base tensors' fp32 master from src (their bf16 at x16[i] = base's w()), gradients and moments zeroed; on s,
 * synchronised. mm: the matmul context the kernels use from then on (the caller's, outliving gl). 0, or -1 with err
 * (src cannot be read). */
int qt_gpu_lora_init(qt_gpu_lora *gl, qt_matmul_ctx *mm, const struct qt_gpu_base *base, const qt_weight_src *src,
                     cudaStream_t s, char *err, size_t errlen);
/* The gradient of the trained base tensor holding flat base index off (fp32, device, +=), or NULL (frozen). */
float *qt_gpu_lora_xgrad(const qt_gpu_lora *gl, size_t off);
/* The bf16 copy ab = RNE(a) and the trained base tensors' bf16 in the base, on s: after every write of a. */
void qt_gpu_lora_refresh(qt_gpu_lora *gl, cudaStream_t s);
void qt_gpu_lora_free(qt_gpu_lora *gl);
/* The 1-based optimizer step and micro-batch index the next forward and backward draw their masks for; step < 0:
 * no dropout (evaluation, logits). */
void qt_gpu_lora_set_batch(qt_gpu_lora *gl, long step, long micro);

/* The adapters on (1) or switched off (0: qt_gpu_lora_fwd adds nothing, the model is the frozen base). */
void qt_gpu_lora_set_on(qt_gpu_lora *gl, int on);

/* Layer l's adapters of site (qt_lora_site) on input x [N, in] (bf16) into the site's fused output y (bf16, +=). */
void qt_gpu_lora_fwd(qt_gpu_lora *gl, int l, int site, const void *x, void *y, cudaStream_t s);
/* Their gradients (ga +=) from the site's output gradient dy (bf16, the fused rows) and x; keeps g per module
 * for bwd_x (and bwd_a), so those of the same site follow before the next site's bwd_w. x NULL: the A gradients
 * wait for bwd_a. */
void qt_gpu_lora_bwd_w(qt_gpu_lora *gl, int l, int site, const void *x, const void *dy, cudaStream_t s);
/* The A gradients (ga +=) of a bwd_w given no x, from x [N, in] (bf16) once it exists. */
void qt_gpu_lora_bwd_a(qt_gpu_lora *gl, int l, int site, const void *x, cudaStream_t s);
/* dx [N, in] (bf16, +=) += the site's adapter terms. */
void qt_gpu_lora_bwd_x(qt_gpu_lora *gl, int l, int site, void *dx, cudaStream_t s);

/* The norm of the adapter (and trained base tensor) gradients, clipped to grad_clip, AdamW at step t (weight decay
 * on every adapter, as torch over PEFT's parameters; on the trained embeddings and LM head with
 * optim.decay_embeddings, none on norms: the CPU LoRA engine's), the bf16 copies refreshed, gradients zeroed; on s.
 * The norm stays in gl->norm. */
void qt_gpu_lora_opt_step(qt_gpu_lora *gl, const qt_plan_optimizer *o, float lr, long t, cudaStream_t s);

#endif
