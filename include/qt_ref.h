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

/* y[N,C] = x / sqrt(mean(x^2) + eps) * w;  rstd[N] = 1/sqrt(mean(x^2)+eps)   (=) */
void qt_ref_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
/* dx[N,C] += d/dx (the residual stream accumulates);  dw[C] += ...   (+=, both) */
void qt_ref_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, long N, int C);

/* y[N,O] = x[N,I] . w[O,I]^T + b[O] (b may be NULL)   (=) */
void qt_ref_matmul_fwd(float *y, const float *x, const float *w, const float *b, long N, int I, int O);
/* dx[N,I] = dy . w (=, skipped when dx is NULL);  dw[O,I] += dy^T . x;  db[O] += sum_n dy (when db) */
void qt_ref_matmul_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                       long N, int I, int O);

/* Rotary embedding, in place, on the q and k heads of qkv[B,T,(H+2*Hkv)*D] (v untouched); token t
 * has position t. HF rotate-half: for i < D/2, with a = theta^(-2i/D) * t:
 *   x'[i] = x[i] cos a - x[i+D/2] sin a;   x'[i+D/2] = x[i+D/2] cos a + x[i] sin a. */
void qt_ref_rope_fwd(float *qkv, int B, int T, int H, int Hkv, int D, float theta);
/* The transpose (inverse rotation), in place on dqkv's q and k heads. */
void qt_ref_rope_bwd(float *dqkv, int B, int T, int H, int Hkv, int D, float theta);

/* Per-head RMSNorm of the q and k heads of x[N,(H+2*Hkv)*D] (Qwen3's q_norm / k_norm, before RoPE):
 * q head: y = x / sqrt(mean(x^2) + eps) * w[0:D];  k head: the same with w[D:2D];  v heads copied.
 * y[N,(H+2*Hkv)*D] (=, may be x);  rstd[N,H+Hkv] (=) */
void qt_ref_qknorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                       float eps);
/* dx[N,(H+2*Hkv)*D] (=: q/k heads the norm's backward, v heads dy's; may be dy) from the forward's input
 * x and rstd;  dw[2D] += (q part, then k part) */
void qt_ref_qknorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                       long N, int H, int Hkv, int D);

/* Causal grouped-query attention on qkv[B,T,(H+2*Hkv)*D] (q heads, then k heads, then v heads).
 * Query head h uses kv head h / (H/Hkv); scale 1/sqrt(D).
 * out[B,T,H*D] (=);  lse[B,H,T] = log sum_j exp(scale q.k_j) (natural log)   (=) */
void qt_ref_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D);
/* dqkv[B,T,(H+2*Hkv)*D] (=) from dout, the saved out and lse. */
void qt_ref_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int H, int Hkv, int D);

/* out[N,F] = silu(gu[n, 0:F]) * gu[n, F:2F]   (=) */
void qt_ref_swiglu_fwd(float *out, const float *gu, long N, int F);
/* dgu[N,2F] (=) */
void qt_ref_swiglu_bwd(float *dgu, const float *dout, const float *gu, long N, int F);

/* loss[n] = logsumexp(logits[n]) - logits[n, tgt[n]]; rows with tgt[n] < 0 get 0 (ignored)  (=) */
void qt_ref_cross_entropy_fwd(float *loss, const float *logits, const int32_t *tgt, long N, int V);
/* dlogits[n] = scale * (softmax(logits[n]) - onehot(tgt[n])), 0 on ignored rows (=).
 * dlogits may be logits (in place). */
void qt_ref_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *tgt, long N, int V,
                              float scale);

/* y[n] += x[n]   (+=) */
void qt_ref_add_inplace(float *y, const float *x, long n);

#endif
