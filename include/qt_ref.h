/* qt_ref.h — CPU fp32 reference ops: the CPU trainer's building blocks and the oracle every GPU
 * kernel is tested against, one function per op.
 *
 * Row-major; N = B*T tokens; C hidden, I/O matmul in/out features, F intermediate, V vocab,
 * H heads, Hkv kv heads, D head dim. "=" writes the output, "+=" accumulates into it.
 * fp32 storage; sums of more than a few terms accumulate in double where it is cheap (norms, softmax,
 * attention, biases); matmuls accumulate in fp32 in k order, one rounding per multiply and per add.
 * Deterministic: every output element is reduced by one thread in a fixed order, so results do not
 * depend on the thread count (bit-exact resume relies on this). OpenMP-parallel over rows. */
#ifndef QT_REF_H
#define QT_REF_H

#include <stdint.h>

/* out[N,C] = wte[tok[n]]   (=) */
void qt_ref_embedding_fwd(float *out, const int32_t *tok, const float *wte, long N, int C);
/* dwte[V,C] += sum over n with tok[n]==v of dout[n]   (+=) */
void qt_ref_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, long N, int C, int V);
/* Gemma 3's scaled embedding (Gemma3TextScaledWordEmbedding): out[N,C] = wte[tok[n]] * scale   (=), fp32
 * products; scale from qt_ref_embed_scale. */
void qt_ref_embedding_scaled_fwd(float *out, const int32_t *tok, const float *wte, long N, int C, float scale);
/* dwte[V,C] += sum over n with tok[n]==v of dout[n] * scale, in row order, each term added with one rounding
 * (fmaf: the GPU kernel's bits; scale 1 is qt_ref_embedding_bwd)   (+=) */
void qt_ref_embedding_scaled_bwd(float *dwte, const float *dout, const int32_t *tok, long N, int C, int V,
                                 float scale);
/* The embedding scale transformers applies: hidden ** 0.5 as an fp32 tensor, cast to the weights' dtype
 * (`self.embed_scale.to(self.weight.dtype)`): round_bf16 = 1 for bf16 weights (RNE of the fp32 value),
 * 0 for fp32. Hidden 2560: 50.596443 (fp32), 50.5 (bf16). */
float qt_ref_embed_scale(int hidden, int round_bf16);

/* y[N,C] = x / sqrt(mean(x^2) + eps) * w;  rstd[N] = 1/sqrt(mean(x^2)+eps)   (=) */
void qt_ref_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
/* dx[N,C] += d/dx (the residual stream accumulates);  dw[C] += ...   (+=, both; dw NULL: none) */
void qt_ref_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, long N, int C);
/* Gemma3RMSNorm: y = x / sqrt(mean(x^2) + eps) * (1 + w), the scale 1 + w formed in fp32; rstd as above (=) */
void qt_ref_rmsnorm1p_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
/* Its backward: dx through (1 + w) (+=); dw[C] += sum_n dy * x * rstd, plain RMSNorm's dw (+=) */
void qt_ref_rmsnorm1p_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, long N, int C);

/* y[N,O] = x[N,I] . w[O,I]^T + b[O] (b may be NULL)   (=) */
void qt_ref_matmul_fwd(float *y, const float *x, const float *w, const float *b, long N, int I, int O);
/* dx[N,I] = dy . w (=, skipped when dx is NULL);  dw[O,I] += dy^T . x;  db[O] += sum_n dy (when db) */
void qt_ref_matmul_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                       long N, int I, int O);

/* Rotary embedding, in place, on the q and k heads of qkv[B,T,(H+2*Hkv)*D] (v untouched); token t
 * has position t. HF rotate-half: for i < D/2, with a = inv_freq[i] * t, c = attn cos a, s = attn sin a
 * (computed in double, rounded to fp32 once; inv_freq and attn from qt_rope_inv_freq):
 *   x'[i] = x[i] c - x[i+D/2] s;   x'[i+D/2] = x[i+D/2] c + x[i] s. */
void qt_ref_rope_fwd(float *qkv, int B, int T, int H, int Hkv, int D, const double *inv_freq, double attn);
/* The transpose, in place on dqkv's q and k heads (c, -s). */
void qt_ref_rope_bwd(float *dqkv, int B, int T, int H, int Hkv, int D, const double *inv_freq, double attn);
/* The same with token n = b*T + t at position pos[n] in [0, T) instead of t (RoPE positions that
 * restart at each packed document, qt_docs.h); pos NULL: t. */
void qt_ref_rope_pos_fwd(float *qkv, int B, int T, int H, int Hkv, int D, const int32_t *pos, const double *inv_freq,
                         double attn);
void qt_ref_rope_pos_bwd(float *dqkv, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                         const double *inv_freq, double attn);

/* Per-head RMSNorm of the q and k heads of x[N,(H+2*Hkv)*D] (Qwen3's q_norm / k_norm, before RoPE):
 * q head: y = x / sqrt(mean(x^2) + eps) * w[0:D];  k head: the same with w[D:2D];  v heads copied.
 * y[N,(H+2*Hkv)*D] (=, may be x);  rstd[N,H+Hkv] (=) */
void qt_ref_qknorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                       float eps);
/* dx[N,(H+2*Hkv)*D] (=: q/k heads the norm's backward, v heads dy's; may be dy) from the forward's input
 * x and rstd;  dw[2D] += (q part, then k part; dw NULL: none) */
void qt_ref_qknorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                       long N, int H, int Hkv, int D);
/* Gemma 3's form of both (Gemma3RMSNorm as q_norm / k_norm): the scale is 1 + w (formed in fp32); dw as above. */
void qt_ref_qknorm1p_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                         float eps);
void qt_ref_qknorm1p_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                         long N, int H, int Hkv, int D);

/* Causal grouped-query attention on qkv[B,T,(H+2*Hkv)*D] (q heads, then k heads, then v heads).
 * Query head h uses kv head h / (H/Hkv); scale 1/sqrt(D). W > 0: sliding window, query t sees keys
 * t - W < j <= t (transformers' convention); W = 0: all keys j <= t.
 * out[B,T,H*D] (=);  lse[B,H,T] = log sum_j exp(scale q.k_j) (natural log)   (=) */
void qt_ref_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W);
/* dqkv[B,T,(H+2*Hkv)*D] (=) from dout, the saved out and lse. */
void qt_ref_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int H, int Hkv, int D, int W);
/* The same with query n = b*T + t seeing no key before kv_lo[n] (the first token of its packed document,
 * qt_docs.h; kv_lo[n] <= t): keys j with max(kv_lo[n], lo(t)) <= j <= t. kv_lo NULL: causal over T. */
void qt_ref_attention_docs_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W,
                               const int32_t *kv_lo);
void qt_ref_attention_docs_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int Hkv, int D, int W, const int32_t *kv_lo);
/* The docs forms with the softmax scale given (Gemma's query_pre_attn_scalar^-0.5) in place of 1/sqrt(D). */
void qt_ref_attention_scaled_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W,
                                 const int32_t *kv_lo, double scale);
void qt_ref_attention_scaled_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                                 const float *lse, int B, int T, int H, int Hkv, int D, int W, const int32_t *kv_lo,
                                 double scale);

/* out[N,F] = silu(gu[n, 0:F]) * gu[n, F:2F]   (=) */
void qt_ref_swiglu_fwd(float *out, const float *gu, long N, int F);
/* dgu[N,2F] (=) */
void qt_ref_swiglu_bwd(float *dgu, const float *dout, const float *gu, long N, int F);

/* GeGLU with the tanh-approximate GELU (hidden_activation "gelu_pytorch_tanh", Gemma3MLP), on the same
 * fused [N, 2F] gate|up layout: out[N,F] = gelu(gu[n, 0:F]) * gu[n, F:2F]   (=), where
 * gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in torch's fp32 operation order. */
void qt_ref_geglu_fwd(float *out, const float *gu, long N, int F);
/* dgu[N,2F] (=): d gate = dout * up * gelu'(gate), d up = dout * gelu(gate) */
void qt_ref_geglu_bwd(float *dgu, const float *dout, const float *gu, long N, int F);

/* loss[n] = logsumexp(logits[n]) - logits[n, tgt[n]]; rows with tgt[n] < 0 get 0 (ignored)  (=) */
void qt_ref_cross_entropy_fwd(float *loss, const float *logits, const int32_t *tgt, long N, int V);
/* dlogits[n] = scale * (softmax(logits[n]) - onehot(tgt[n])), 0 on ignored rows (=).
 * dlogits may be logits (in place). */
void qt_ref_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *tgt, long N, int V,
                              float scale);

/* The same with Gemma 3's final-logit soft-cap (final_logit_softcapping): the loss reads
 * z = cap * tanh(logits / cap) (fp32) in place of the logits, and the gradient is w.r.t. the raw logits:
 * dlogits = scale * (softmax(z) - onehot) * (1 - (z / cap)^2). cap 0: no cap, the functions above bit for
 * bit. In place allowed as above. */
void qt_ref_cross_entropy_capped_fwd(float *loss, const float *logits, const int32_t *tgt, long N, int V, float cap);
void qt_ref_cross_entropy_capped_bwd(float *dlogits, const float *logits, const int32_t *tgt, long N, int V,
                                     float scale, float cap);

/* y[n] += x[n]   (+=) */
void qt_ref_add_inplace(float *y, const float *x, long n);

#endif
