/* qt_kernels.h — launchers of the bf16 training kernels in cuda/ (embedding, RMSNorm, q/k norm, RoPE,
 * SwiGLU, GeGLU, bias, LM-head loss, AdamW, gradient norm, casts). Matmul (qt_matmul.h), attention and fp8 quantize
 * live elsewhere.
 *
 * Conventions: "bf16" buffers are passed as void* and hold __nv_bfloat16; math is fp32 and each output
 * is rounded once (RNE) unless a comment says otherwise. Row-major; n rows (tokens) of c columns.
 * "=" writes the output, "+=" accumulates into it. Every launch is asynchronous on stream s and never
 * reads device memory back to the host. Semantics match the CPU reference ops of qt_ref.h/qt_optim.h.
 * Reductions are deterministic: fixed grids and fixed-order trees, no float atomics, so the same
 * inputs give bitwise-identical outputs. Workspaces are caller-owned device memory.
 * Fused fp8 abs-max: an `amax` argument (device fp32, NULL = not computed) receives
 * max(*amax, max |v|) over the bf16 values v the kernel writes to the named output — exactly what a
 * later qt_quant_amax over that output would give (max on the bits of |v|: order-free, NaN wins), so
 * *amax must be zeroed earlier on the stream. One atomicMax per block. */
#ifndef QT_KERNELS_H
#define QT_KERNELS_H

#include "qt_cuda_types.h"
#include <stddef.h>
#include <stdint.h>

#include "qt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- casts (cast.cu) ---- */
/* dst[i] = bf16_rne(src[i])   (=) */
void qt_cast_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s);
/* dst[i] = (float)src[i]   (=) */
void qt_cast_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s);
/* dst[i] = v for a QT_DT_F32 or QT_DT_BF16 buffer   (=) */
void qt_fill(void *dst, qt_dtype dt, float v, size_t n, cudaStream_t s);
/* Zeroes `bytes` bytes (cudaMemsetAsync). */
void qt_zero(void *dst, size_t bytes, cudaStream_t s);
/* dst[i] = std * N(0,1) of flat element first + i under seed: qt_layout_init_range's hashed normals drawn on the GPU
 * (init.cu: the host's values up to the last bit of CUDA's fp64 log / cos)   (=) */
void qt_init_normal(float *dst, size_t n, uint64_t seed, uint64_t first, float std, cudaStream_t s);
/* y[i] += x[i]; y is fp32 or bf16, x is fp32 or bf16   (+=) */
void qt_add_inplace(void *y, qt_dtype ydt, const void *x, qt_dtype xdt, size_t n, cudaStream_t s);

/* ---- embedding (embedding.cu) ---- */
/* out[n,c] (bf16) = wte[tok[n]] (bf16)   (=); tokens outside [0, v) give a zero row. */
void qt_embedding_fwd(void *out, const int32_t *tok, const void *wte, long n, int c, int v, cudaStream_t s);
/* Bytes of workspace qt_embedding_bwd needs for n tokens and vocabulary v. */
size_t qt_embedding_bwd_ws_bytes(long n, int v);
/* dwte[v,c] (dw_dt: fp32, or bf16 = one RNE of the fp32 sum) += sum over rows with tok==v of dout
 * (fp32 or bf16, dout_dt), summed in row order in fp32 starting from dwte's value (deterministic: tokens
 * are bucketed by id, each bucket sorted by row, one block per touched id). Tokens outside [0, v) are
 * skipped. ws: qt_embedding_bwd_ws_bytes(n, v) bytes, 16-byte aligned. */
void qt_embedding_bwd(void *dwte, qt_dtype dw_dt, const void *dout, qt_dtype dout_dt, const int32_t *tok, long n,
                      int c, int v, void *ws, cudaStream_t s);
/* The same, adding only to the table elements dwte[lo..hi) (flat indices into [v, c]): one
 * data-parallel rank's piece of the embedding gradient. round_bf16 with an fp32 dwte: each updated
 * element is stored rounded to bf16 (RNE), the value a bf16 dwte would hold (ZeRO-2/3's fp32 gradient
 * shard under precision.grad_accum_dtype bf16). */
void qt_embedding_bwd_range(void *dwte, qt_dtype dw_dt, int round_bf16, size_t lo, size_t hi, const void *dout,
                            qt_dtype dout_dt, const int32_t *tok, long n, int c, int v, void *ws, cudaStream_t s);
/* Gemma 3's scaled embedding (Gemma3TextScaledWordEmbedding): out = bf16(wte[tok[n]] * scale)   (=), the fp32
 * product rounded once (exact for a bf16 scale: transformers' `embed_scale.to(weight.dtype)`, from
 * qt_ref_embed_scale(c, 1)). The backward adds dout * scale (fp32 products) in the same order as the plain
 * one; scale 1 gives the plain entries' bits. CPU reference: qt_ref_embedding_scaled_fwd / _bwd. */
void qt_embedding_scaled_fwd(void *out, const int32_t *tok, const void *wte, long n, int c, int v, float scale,
                             cudaStream_t s);
void qt_embedding_scaled_bwd(void *dwte, qt_dtype dw_dt, const void *dout, qt_dtype dout_dt, const int32_t *tok,
                             long n, int c, int v, float scale, void *ws, cudaStream_t s);
void qt_embedding_scaled_bwd_range(void *dwte, qt_dtype dw_dt, int round_bf16, size_t lo, size_t hi, const void *dout,
                                   qt_dtype dout_dt, const int32_t *tok, long n, int c, int v, float scale, void *ws,
                                   cudaStream_t s);

/* ---- column reductions (bias.cu; RMSNorm dw uses the same machinery) ---- */
/* Bytes of workspace qt_bias_bwd / qt_rmsnorm_bwd need for c columns. */
size_t qt_colreduce_ws_bytes(int c);
/* y[n,o] (bf16) += b[o] (bf16)   (+=, in place) */
void qt_bias_add(void *y, const void *b, long n, int o, cudaStream_t s);
/* db[o] (db_dt: fp32, or bf16 = one RNE of db + the fp32 column sum) += sum over n rows of dy[n,o]
 * (bf16); fixed-order two-pass reduction. ws: qt_colreduce_ws_bytes(o) bytes. */
void qt_bias_bwd(void *db, qt_dtype db_dt, const void *dy, long n, int o, void *ws, cudaStream_t s);

/* ---- RMSNorm fused with the residual add (rmsnorm.cu) ---- */
/* When x != NULL: res = bf16(res + x) first (res updated in place). Then
 * y = res * rstd * w, rstd[n] = 1/sqrt(mean(res^2) + eps) (fp32). All of y, res, x, w bf16   (=).
 * x == NULL is the plain (final) norm. y may not alias res or x. amax: of y (may be NULL). */
void qt_rmsnorm_fwd(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c,
                    float eps, float *amax, cudaStream_t s);
/* dx[n,c] += d(y)/d(res) . dy, dx fp32 or bf16 (dx_dt) — the residual-stream gradient   (+=)
 * dx_bf16[n,c] (bf16, =) = the updated dx rounded RNE, in the same pass; NULL = none.
 * amax: of dx_bf16 (may be NULL; needs dx_bf16).
 * dw[c] (dw_dt: fp32, or bf16 = one RNE of dw + the fp32 sum) += sum_n dy * res * rstd, deterministic
 * two-pass (ws: qt_colreduce_ws_bytes(c) bytes) (+=). dw may be NULL (skipped). res is the saved
 * normalised input (bf16), rstd from the forward. */
void qt_rmsnorm_bwd(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt, const void *dy,
                    const void *res, const void *w, const float *rstd, long n, int c, void *ws, cudaStream_t s);
/* Gemma3RMSNorm's variant: the same two entries with the scale (1 + w[c]) formed in fp32 in place of w[c]
 * (y = res * rstd * (1 + w); dx through (1 + w)); dw is plain RMSNorm's (d(1 + w)/dw = 1), reduced the same
 * deterministic way. CPU reference: qt_ref_rmsnorm1p_fwd / qt_ref_rmsnorm1p_bwd. */
void qt_rmsnorm1p_fwd(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c,
                      float eps, float *amax, cudaStream_t s);
void qt_rmsnorm1p_bwd(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt, const void *dy,
                      const void *res, const void *w, const float *rstd, long n, int c, void *ws, cudaStream_t s);

/* ---- rotary embedding (rope.cu) ---- */
#define QT_ROPE_MAX_HALF 256 /* the most rotary pairs per head: head_dim <= 512 */
/* cs[t, i] = (attn cos a, attn sin a) with a = inv_freq[i] * t, for t < T, i < d/2: T*d floats (fp32 pairs),
 * computed in double, rounded once (=). inv_freq: d/2 values in host memory (qt_rope_inv_freq), read
 * before the call returns; d/2 <= QT_ROPE_MAX_HALF. Fill once per (T, d, frequencies). */
void qt_rope_table(float *cs, int T, int d, const double *inv_freq, double attn, cudaStream_t s);
/* In place on the q and k heads of qkv[B,T,(H+2*Hkv)*D] (bf16), HF rotate-half; v heads untouched.
 * Token t of each sequence has position t; cs from qt_rope_table(T, D). D even. */
void qt_rope_fwd(void *qkv, const float *cs, int B, int T, int H, int Hkv, int D, cudaStream_t s);
/* The inverse rotation (the transpose), in place on dqkv's q and k heads. amax: of the whole dqkv
 * afterwards, v heads included (read for it; may be NULL). */
void qt_rope_bwd(void *dqkv, const float *cs, int B, int T, int H, int Hkv, int D, float *amax, cudaStream_t s);
/* qt_rope_fwd / qt_rope_bwd with token row = b*T + t at position pos[row] in [0, T) (device int32 [B*T]:
 * RoPE positions restarting at each packed document, qt_docs.h); pos NULL: t. */
void qt_rope_pos_fwd(void *qkv, const float *cs, const int32_t *pos, int B, int T, int H, int Hkv, int D,
                     cudaStream_t s);
void qt_rope_pos_bwd(void *dqkv, const float *cs, const int32_t *pos, int B, int T, int H, int Hkv, int D,
                     float *amax, cudaStream_t s);

/* ---- per-head q/k RMSNorm (qknorm.cu; Qwen3's q_norm / k_norm, between the qkv matmul and RoPE) ---- */
/* In place on the q and k heads of qkv[n,(H+2*Hkv)*D] (bf16; v heads untouched): each head's D values x become
 * x * rstd * w, with w[0:D] for q heads and w[D:2D] for k heads (bf16), rstd[n,H+Hkv] = 1/sqrt(mean(x^2)+eps)
 * (fp32) (=). save[n,(H+Hkv)*D] (bf16, =): the pre-norm q|k heads, bit-exact, for the backward (may be NULL). */
void qt_qknorm_fwd(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D, float eps,
                   cudaStream_t s);
/* Bytes of workspace qt_qknorm_bwd needs for head dim D. */
size_t qt_qknorm_ws_bytes(int D);
/* In place on dqkv's q and k heads (bf16, v heads untouched): the norm's input gradient from the saved pre-norm
 * heads save, w and rstd (=). dw[2D] (dw_dt: fp32, or bf16 = one RNE of dw + the fp32 sum) += sum over rows and
 * heads of dy * x * rstd, deterministic two-pass (ws: qt_qknorm_ws_bytes(D)); dw may be NULL (skipped).
 * amax: of the whole dqkv afterwards, v heads included (may be NULL). D <= 512. */
void qt_qknorm_bwd(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd, long n,
                   int H, int Hkv, int D, float *amax, void *ws, cudaStream_t s);
/* Gemma 3's q_norm / k_norm: the same two with the scale 1 + w (formed in fp32) in place of w; dw as above. */
void qt_qknorm1p_fwd(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D, float eps,
                     cudaStream_t s);
void qt_qknorm1p_bwd(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd, long n,
                     int H, int Hkv, int D, float *amax, void *ws, cudaStream_t s);

/* ---- SwiGLU (swiglu.cu) ---- */
/* out[n,f] = silu(gu[n, 0:f]) * gu[n, f:2f]   (=), bf16. amax: of out (may be NULL). */
void qt_swiglu_fwd(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s);
/* dgu[n,2f] (bf16) from dout[n,f] and gu   (=). dgu may alias gu (each element is read before its
 * own write by the same thread). amax: of dgu (may be NULL). */
void qt_swiglu_bwd(void *dgu, const void *dout, const void *gu, long n, int f, float *amax, cudaStream_t s);
/* qt_swiglu_bwd, and in the same pass h = the SwiGLU output (qt_swiglu_fwd's bits) written over the
 * gradient dh_h [n, f] it reads (=): down's weight gradient then reads h, which a bf16 backward with the SwiGLU
 * recomputed needs, without a pass of its own over gu. */
void qt_swiglu_bwd_h(void *dgu, void *dh_h, const void *gu, long n, int f, float *amax, cudaStream_t s);

/* ---- GeGLU with the tanh GELU (swiglu.cu): Gemma's MLP, hidden_activation gelu_pytorch_tanh ---- */
/* The three SwiGLU entries with silu replaced by gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
 * (torch gelu(approximate="tanh"), fp32, tanhf): the same [n, 2f] gate|up layout, one RNE rounding per output,
 * aliasing rules and fused abs-max. CPU reference: qt_ref_geglu_fwd / qt_ref_geglu_bwd. */
void qt_geglu_fwd(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s);
void qt_geglu_bwd(void *dgu, const void *dout, const void *gu, long n, int f, float *amax, cudaStream_t s);
void qt_geglu_bwd_h(void *dgu, void *dh_h, const void *gu, long n, int f, float *amax, cudaStream_t s);

/* ---- fused LM-head loss (lmhead_loss.cu) ---- */
/* For a chunk of n rows of logits[n,v] (bf16): loss[r] = lse - logits[r, tgt[r]] (fp32, =) and, in
 * place, logits[r] = bf16(scale * (softmax(logits[r]) - onehot(tgt[r]))). Rows with tgt < 0 are
 * ignored (loss 0, dlogits 0); tgt >= v gives loss NaN (a data bug made visible) and dlogits 0.
 * lse[r] (fp32, =) may be NULL; 0 on ignored rows. One block per row reads the row twice (the second
 * read mostly from L2), the fastest of the three kernels on an H200 (bench/RESULTS.md, memory-bound kernels). */
void qt_lmhead_loss(void *logits, float *loss, float *lse, const int32_t *tgt, long n, int v, float scale,
                    cudaStream_t s);
/* The implementations, for tests and benchmarks: CLUSTER one cluster per row, holding it in registers;
 * CLUSTER_PIPE persistent clusters with the next row's loads in flight (shared memory). */
typedef enum { QT_LMHEAD_AUTO, QT_LMHEAD_TWO_PASS, QT_LMHEAD_CLUSTER, QT_LMHEAD_CLUSTER_PIPE } qt_lmhead_impl;
/* qt_lmhead_loss with the implementation chosen: AUTO is what qt_lmhead_loss runs (TWO_PASS), CLUSTER and
 * CLUSTER_PIPE fall back to TWO_PASS where they cannot run. Returns the one launched. */
qt_lmhead_impl qt_lmhead_loss_with(qt_lmhead_impl impl, void *logits, float *loss, float *lse, const int32_t *tgt,
                                   long n, int v, float scale, cudaStream_t s);
/* qt_lmhead_loss_with under Gemma's final-logit soft-cap (final_logit_softcapping): the loss reads
 * z = cap * tanh(x / cap) (fp32) in place of each logit x, lse[r] is over z, and the dlogits written are
 * w.r.t. x: bf16(scale * (softmax(z) - onehot) * (1 - tanh^2(x / cap))). cap 0: no cap (qt_lmhead_loss_with).
 * CPU reference: qt_ref_cross_entropy_capped_fwd / _bwd. */
qt_lmhead_impl qt_lmhead_loss_softcap(qt_lmhead_impl impl, void *logits, float *loss, float *lse, const int32_t *tgt,
                                      long n, int v, float scale, float cap, cudaStream_t s);
/* *sum (fp64 device scalar) += sum of x[0..n) (fp32), in a fixed order (one block)   (+=) */
void qt_sum_f32(double *sum, const float *x, long n, cudaStream_t s);

/* ---- AdamW over the flat parameter array (adamw.cu) ---- */
/* One tensor of the flat array: elements [offset, offset+numel) take weight decay wd; their master
 * weights and moments sit at master/m/v[state ..] (state = offset for whole arrays; a ZeRO-1 rank keeps
 * only its pieces, back to back). offset - state must be a multiple of 4 for the vector path. Elements
 * that no entry covers (alignment padding) are left untouched. The stochastic rounding hashes element
 * i as i - sr_shift (a padded layout's tensor offset minus its compact offset: qt_model.h; 0 = i). */
typedef struct {
    size_t offset, numel;
    float wd;
    size_t state;
    size_t sr_shift;
} qt_adamw_tensor;
typedef struct qt_adamw_plan qt_adamw_plan;
/* Uploads the tensor table to the current device. Caller frees with qt_adamw_plan_free. */
qt_adamw_plan *qt_adamw_plan_create(const qt_adamw_tensor *t, int n_tensors);
void qt_adamw_plan_free(qt_adamw_plan *p);

typedef struct {
    float lr, beta1, beta2, eps;
    long t;            /* 1-based step, for the bias corrections */
    uint64_t seed;     /* stochastic rounding: hash of (seed, t, index) */
    int stochastic;    /* 1: bf16 weights rounded stochastically; 0: RNE */
    int g_at_state;    /* 1: g holds only the state's pieces, at the state index like m and v (ZeRO-2) */
    int w_at_state;    /* 1: so does w_bf16 (ZeRO-3); the stochastic rounding still hashes the flat index
                        * (less the entry's sr_shift) */
    unsigned *nonfinite; /* device uint32 += the number of new weights that are NaN/Inf (the bf16 value when
                          * w_bf16 is given, else the master), saturating at 2^32 - 1; NULL: not counted */
} qt_adamw_args;
/* One AdamW step, the arithmetic of qt_adamw_cpu (same fp32 operations in the same order):
 *   g' = g * (*grad_scale) (g fp32 or bf16 per g_dt; grad_scale: device pointer, NULL = 1); m, v updated (fp32 or bf16, m_dt /
 *   v_dt); the weight is master[i] (fp32) when master != NULL, else w_bf16[i]; the updated weight is
 *   written back to master and/or w_bf16 (bf16, RNE or stochastic). Either may be NULL, not both.
 *   absmax[k] (fp32, =) = max |new weight| of tensor k (the bf16 value when w_bf16 is given), for fp8
 *   weight scaling; may be NULL. One launch for the whole array. */
void qt_adamw_step(const qt_adamw_plan *p, void *w_bf16, float *master, const void *g, qt_dtype g_dt, void *m,
                   qt_dtype m_dt, void *v, qt_dtype v_dt, const float *grad_scale, float *absmax,
                   const qt_adamw_args *a, cudaStream_t s);

/* ---- global gradient norm and clip scale (norm.cu) ---- */
/* Bytes of workspace qt_grad_norm needs (fixed: the grid does not depend on n). */
size_t qt_grad_norm_ws_bytes(void);
/* norm = sqrt(sum g^2) over the buffer g[0..n) (fp32 or bf16, g_dt), squares accumulated in fp64 by a fixed grid then
 * summed in fixed order; writes *norm (fp32, may be NULL) and *scale (fp32, may be NULL), the formula
 * of qt_clip_scale: max_norm/norm when max_norm > 0 and norm > max_norm, else 1 (NaN norm: 1; the
 * caller sees the NaN norm). Both device pointers   (=). */
void qt_grad_norm(float *norm, float *scale, const void *g, qt_dtype g_dt, size_t n, float max_norm, void *ws,
                  cudaStream_t s);
/* The same split for gradients sharded over ranks: *sumsq (fp64, device) = sum g^2 over g[0..n) (the
 * fixed-grid sum of qt_grad_norm); then norm and scale from the ranks' sumsq[0..nparts) added in
 * ascending order (every rank gets the same bits). With one part this is qt_grad_norm, bit for bit. */
void qt_grad_sumsq(double *sumsq, const void *g, qt_dtype g_dt, size_t n, void *ws, cudaStream_t s);
void qt_clip_from_sumsq(float *norm, float *scale, const double *sumsq, int nparts, float max_norm,
                        cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
