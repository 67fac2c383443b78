/* qt_gpu_family.h — the kernels and constants by which a model family's maths differs on the GPU.
 *
 * The GPU model (gpu_model.c) runs one block structure for every family; what differs is the norm's scale
 * (w, or Gemma's 1 + w), the GLU activation (SwiGLU, or Gemma's GeGLU with the tanh GELU), the embedding
 * scale, the attention scale and the final-logit soft-cap. One value of this struct, picked once from the
 * model config, carries them: the block code calls through it and holds no family test. Gemma's sandwich
 * norms (a norm on each branch output) follow the layout's post_attn / post_ffn offsets instead
 * (docs/models-gemma3.md). The function pointers share their signatures with the plain kernels (qt_kernels.h). */
#ifndef QT_GPU_FAMILY_H
#define QT_GPU_FAMILY_H

#include "qt_gpu_fp8.h"
#include "qt_kernels.h"
#include "qt_model.h"

typedef struct {
    /* RMSNorm fused with the residual add, forward and backward: qt_rmsnorm_* or qt_rmsnorm1p_* */
    void (*norm_fwd)(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c, float eps,
                     float *amax, cudaStream_t s);
    void (*norm_bwd)(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt, const void *dy,
                     const void *res, const void *w, const float *rstd, long n, int c, void *ws, cudaStream_t s);
    /* per-head q/k norm (used when the config sets qk_norm): qt_qknorm_* or qt_qknorm1p_* */
    void (*qknorm_fwd)(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D, float eps,
                       cudaStream_t s);
    void (*qknorm_bwd)(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd,
                       long n, int H, int Hkv, int D, float *amax, void *ws, cudaStream_t s);
    /* the gated MLP's activation: qt_swiglu_* or qt_geglu_* */
    void (*glu_fwd)(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s);
    void (*glu_bwd)(void *dgu, const void *dout, const void *gu, long n, int f, float *amax, cudaStream_t s);
    void (*glu_bwd_h)(void *dgu, void *dh_h, const void *gu, long n, int f, float *amax, cudaStream_t s);
    /* its backward fused with the quantized down-projection input (fp8 backward, recomputed GLU) */
    void (*fp8_glu_bwd_requant)(qt_gpu_fp8 *f, int layer, void *dgu, const void *dh, const void *gu, float *amax,
                                cudaStream_t s);
    float embed_scale; /* the embedding rows' factor: 1, or Gemma's sqrt(C) rounded to bf16 (transformers' bf16 model) */
    float attn_scale;  /* the softmax scale: 0 = 1/sqrt(head_dim) (cuDNN's own), else query_pre_attn_scalar^-0.5 */
    float logit_cap;   /* final_logit_softcapping; 0 = none */
} qt_gpu_family;

/* The family of c: Gemma 3's (qt_model_is_gemma) or the Llama/Qwen/Mistral one. */
qt_gpu_family qt_gpu_family_of(const qt_model_cfg *c);

#endif
