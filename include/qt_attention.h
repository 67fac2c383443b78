/* qt_attention.h — causal grouped-query attention (SDPA) through cuDNN's fused flash-attention graphs.
 *
 * Layouts (row-major, bf16 unless said): qkv[B,T,(H+2*Hkv)*D] holds per token the H query heads, then
 * the Hkv key heads, then the Hkv value heads; q, k and v are read in place through strides. Query head
 * h uses kv head h / (H/Hkv). out[B,T,H*D]; lse[B,H,T] fp32 = log sum_j exp(scale * q.k_j), natural
 * log, scale = 1/sqrt(D) — the softmax statistics cuDNN saves for the backward ("Stats" [B,H,T,1]),
 * the same quantity as qt_ref_attention_fwd's lse. dqkv has qkv's layout; dK and dV come back with
 * Hkv heads (cuDNN sums the query-head group). Softmax in fp32; P and dS are rounded to bf16 before
 * the second matmuls (cuDNN's flash kernels), outputs rounded once to bf16.
 *
 * window: 0 = causal (query t sees keys j <= t); W > 0 = sliding window, query t sees keys
 * t - W < j <= t (transformers' sliding_window_overlay: kv_idx > q_idx - W), W keys with its own. A
 * window >= T is the causal attention (same plan); W < T adds cuDNN's diagonal-band mask to both graphs.
 * kv_lo (the _docs calls; packed documents, qt_docs.h): int32 [B,T] on the device, the first key query t
 * of row b may see (its document's start, <= t): keys max(kv_lo, window bound) <= j <= t.
 *
 * A context holds a cuDNN handle, the plans (execution plan per (B,T,H,Hkv,D,window) and direction, built on
 * first use and cached) and a workspace that grows to the largest plan's need. One thread, one stream
 * at a time. Needs D % 8 == 0, D <= 128 (256 on Hopper), H % Hkv == 0. */
#ifndef QT_ATTENTION_H
#define QT_ATTENTION_H

#include "qt_cuda_types.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qt_attention_ctx qt_attention_ctx;

/* Creates the context on the current device. Caller frees it with qt_attention_free. */
qt_attention_ctx *qt_attention_create(void);
void qt_attention_free(qt_attention_ctx *c);
/* Builds (and caches) the forward and backward plans of this shape. Returns 0, or -1 with a message in
 * err naming the shape, the failing step, cuDNN's version and its error string. The fwd/bwd calls
 * below fail hard with that message instead. */
int qt_attention_prepare(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, char *err,
                         size_t errlen);
/* out (=) and lse (=) from qkv. */
void qt_attention_fwd(qt_attention_ctx *c, void *out, float *lse, const void *qkv, int B, int T, int H, int Hkv,
                      int D, int window, cudaStream_t s);
/* dqkv (=, every element) from dout[B,T,H*D], qkv and the forward's out and lse (same window). */
void qt_attention_bwd(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                      const float *lse, int B, int T, int H, int Hkv, int D, int window, cudaStream_t s);
/* The same with packed documents: kv_lo [B,T] int32 on the device (NULL: as above). The graphs gain a
 * GEN_INDEX / CMP_GE / select against kv_lo broadcast over heads and keys; plans per (shape, docs).
 * prepare_docs with docs 1 also grows the workspace to the plans' needs (outside the memory plan, which
 * counts the causal plans: cuDNN's need for the document graphs is not known without a GPU). */
int qt_attention_prepare_docs(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int docs,
                              char *err, size_t errlen);
void qt_attention_docs_fwd(qt_attention_ctx *c, void *out, float *lse, const void *qkv, const int32_t *kv_lo, int B,
                           int T, int H, int Hkv, int D, int window, cudaStream_t s);
void qt_attention_docs_bwd(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                           const float *lse, const int32_t *kv_lo, int B, int T, int H, int Hkv, int D, int window,
                           cudaStream_t s);
/* The docs forms with the softmax scale given (Gemma's query_pre_attn_scalar^-0.5; 0 = 1/sqrt(D)); lse then
 * holds log sum_j exp(scale * q.k_j). The scale is a by-value scalar of the same plan: no plan per scale. */
void qt_attention_fwd_scaled(qt_attention_ctx *c, void *out, float *lse, const void *qkv, const int32_t *kv_lo, int B,
                             int T, int H, int Hkv, int D, int window, float scale, cudaStream_t s);
void qt_attention_bwd_scaled(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                             const float *lse, const int32_t *kv_lo, int B, int T, int H, int Hkv, int D, int window,
                             float scale, cudaStream_t s);
/* Workspace bytes of this shape's plan (built and cached; bwd 0 forward, 1 backward): cuDNN's own
 * plan workspace, then for the backward the fp32 softmax sums and dQ accumulator. 0 when the plan
 * cannot be built (the fwd/bwd call then fails with the message). */
size_t qt_attention_ws_bytes(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int bwd);
/* The backward's fp32 parts alone (sums [B,H,T], dQ [B,H,T,D], 256-aligned), without a GPU. */
size_t qt_attention_bwd_fixed_ws(int B, int T, int H, int D);
/* The backward's whole workspace without a GPU (the planner's figure before cuDNN is asked): the fp32
 * parts plus cuDNN's plan workspace, taken as one more fp32 [B,H,T] + [B,H,T,D] (cuDNN 9.19 on sm_90
 * asked for 438-449 MiB at B 32, T 1024, H 28, D 128, where that is 451.5); det (the deterministic
 * graph, which forms dQ from one matmul over dS) adds dS itself, bf16 [B,H,T,T]. test_plan checks both
 * on the GPU: never below the measured, at most 2x it. */
size_t qt_attention_bwd_est_ws(int B, int T, int H, int D, int det);
/* Allocates the workspace at bytes now (when larger than the current one), so that no plan within it
 * allocates during training. */
void qt_attention_reserve(qt_attention_ctx *c, size_t bytes);
/* on = 1: backward plans are built deterministic (the same bits on every call with the same inputs):
 * dQ is one matmul's output instead of an fp32 accumulator that thread blocks add into in any order,
 * and engines cuDNN notes as nondeterministic are passed over. Plans of both kinds are cached. */
void qt_attention_set_deterministic(qt_attention_ctx *c, int on);
/* This shape's plan (built and cached, in the context's current mode): *engine = cuDNN's global engine
 * index (-1 when no plan); returns 1 when cuDNN notes that engine nondeterministic, 0 when not, -1 when
 * the plan cannot be built. */
int qt_attention_engine(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int bwd, long *engine);
/* Number of plans built so far (a shape's fwd and bwd count one each). */
long qt_attention_plan_count(const qt_attention_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
