/* qt_gpu_fp8.h — fp8 (e4m3 forward, e4m3/e5m2 gradients) linear layers of the GPU model's transformer
 * blocks: persistent weight quants, saved fp8 activations, per-tensor current scaling, cuBLASLt TN GEMMs.
 *
 * The four block matmuls per layer (QKV, O, gate|up, down) are Y[N,O] = X[N,I] . W[O,I]^T (+ bias).
 * Device memory comes from the model's arena in two regions the model carves (sizes below):
 *   "fp8 weights (persistent)": Wq[O,I] and Wq^T[I,O] (e4m3) of every block matrix + the scale
 *     records + the nonfinite flag; rebuilt by qt_fp8_quantize_weights once per optimizer step (or per
 *     micro-step: precision.persistent_quants). With memory.fp8_weight_cache: none the row is
 *     "fp8 weights (layer slots)": the scale records and QT_FP8_WSLOTS layers' Wq, Wq^T; layer l uses
 *     slot l % QT_FP8_WSLOTS, filled by qt_fp8_use_weights right before the layer's forward and again
 *     before its backward, from the abs-max qt_fp8_quantize_weights left in the layer's records: the
 *     cached path's scale and bytes. Two slots, not one: everything runs on one stream today, so one
 *     would do; the second lets a prefetch fill layer l+-1 while layer l computes;
 *   "fp8 activations": Xq^T[I,N] of every block matmul input, saved by the forward for the wgrad, and
 *     the scratch Xq[N,I], dYq[N,O], dYq^T[O,N] shared by all layers (stream-ordered reuse). */
#ifndef QT_GPU_FP8_H
#define QT_GPU_FP8_H

#include "qt_cuda_types.h"
#include <stddef.h>
#include <stdint.h>

#include "qt_modes.h"
#include "qt_dtype.h"
#include "qt_matmul.h"
#include "qt_model.h"
#include "qt_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { QT_FP8_QKV = 0, QT_FP8_O = 1, QT_FP8_GU = 2, QT_FP8_DOWN = 3, QT_FP8_NMM = 4 } qt_fp8_mm;

#define QT_FP8_WSLOTS 2 /* layer slots of the weight quants with memory.fp8_weight_cache: none */

/* Host-side state; the device pointers point into the model's arena (borrowed). */
typedef struct {
    int n_layers;
    long N;                     /* tokens per micro-batch */
    int in[QT_FP8_NMM], out[QT_FP8_NMM]; /* I and O of each block matmul */
    qt_dtype grad_dt;           /* e4m3 / e5m2, or bf16: the backward stays bf16 */
    qt_fp8_wcache wcache;       /* memory.fp8_weight_cache: all (a buffer per layer) or none (slots) */
#ifdef QT_MUTANTS
    int wamax_taken;            /* qt_fp8_quantize_weights ran once (QT_MUT_FP8_WCACHE_STALE_SCALE) */
#endif
    uint8_t **wq, **wqT;        /* [n_layers * 4]; with wcache none layer l's point into slot l % QT_FP8_WSLOTS */
    uint8_t **xqT;              /* [n_layers * 4]; a matmul in xq_shared has one buffer for all layers */
    unsigned xq_shared;         /* bit k: matmul k's Xq^T is shared by the layers (its input is quantized
                                 * again, qt_fp8_requant_input, before each layer's wgrad reads it) */
    uint8_t *xq, *dyq, *dyqT;   /* scratch; dyqT NULL without a weight gradient (qt_fp8_create's wgrad 0) */
    qt_fp8_scale *sc;           /* [n_layers * 4 * 3]: the weights', then (input, output gradient) pairs */
    int *nonfinite;             /* device int: 0, or the tag of the first tensor whose scale went NaN/Inf */
    int fuse_amax;              /* 1: producers may fold abs-maxes (test hook fp8_unfused_amax turns it off) */
    unsigned char *amax_ready;  /* host [n_layers * 4 * 2]: slot handed to a producer since the reset */
} qt_gpu_fp8;

/* Bytes of the two regions for model c, weight cache wc, N tokens per micro-batch, gradient dtype
 * grad_dt, the Xq^T of the matmuls in xq_shared (bits 1 << qt_fp8_mm) once instead of once per layer;
 * wgrad 0: the backward runs the dgrad only (a frozen base, LoRA), which reads no dYq^T. */
size_t qt_fp8_weight_bytes(const qt_model_cfg *c, qt_fp8_wcache wc);
size_t qt_fp8_act_bytes(const qt_model_cfg *c, long N, qt_dtype grad_dt, unsigned xq_shared, int wgrad);
/* 0 when fp8 can run model c with N tokens per micro-batch on a device of compute capability cc
 * (major*10+minor); else -1 with err naming the config file (path), the field and what fp8 needs. */
int qt_fp8_check(const qt_model_cfg *c, const char *path, long N, int cc, char *err, size_t errlen);
/* Lays the state out in the two regions (sizes as above, 256-byte aligned) and zeroes the flag.
 * Caller frees the returned host struct with qt_fp8_free; the regions stay the caller's. */
qt_gpu_fp8 *qt_fp8_create(const qt_model_cfg *c, qt_dtype grad_dt, qt_fp8_wcache wc, long N, unsigned xq_shared,
                          int wgrad, void *wregion, void *aregion, cudaStream_t s);
void qt_fp8_free(qt_gpu_fp8 *f);

/* Re-quantizes the block matrices of layers [l0, l1) from the bf16 weights w (the flat array of L):
 * abs-max, then Wq and Wq^T in one quantize-transpose pass with the scale derived on the device. With
 * wcache none only the abs-max (into the weight's scale record): the quants come at use. Call after
 * every change of the weights, before the forward reads them. */
void qt_fp8_quantize_weights(qt_gpu_fp8 *f, const qt_layout *L, const void *w_bf16, int l0, int l1, cudaStream_t s);
/* wcache none, ZeRO-3 (parallel.zero: 3, whose rank never holds all of the bf16 weights): the abs-max of
 * layer's four block matrices w[k] (bf16, where the model reads them: its weight slot) into their
 * records, as qt_fp8_quantize_weights takes it with wcache none. Before the layer's first
 * qt_fp8_use_weights after the weights changed (each forward: the same values until AdamW). */
void qt_fp8_weight_amax(qt_gpu_fp8 *f, int layer, const void *const w[QT_FP8_NMM], cudaStream_t s);
/* wcache none: quantizes layer's block matrices w[k] (bf16, qt_fp8_mm order) into its slot, Wq (of the
 * matrices in the bit set wq, 1 << qt_fp8_mm: the forward's and a recompute's operand) and/or Wq^T
 * (want_wqT: the fp8 dgrad's), with the scale from the abs-max of the last qt_fp8_quantize_weights (or
 * qt_fp8_weight_amax) and no abs-max pass: the bytes the cached copies would hold. Before the layer's
 * forward and again before its backward (the slot is shared with layer +-2), after
 * qt_param_acquire_weights; a no-op with wcache all. */
void qt_fp8_use_weights(qt_gpu_fp8 *f, int layer, const void *const w[QT_FP8_NMM], unsigned wq, int want_wqT,
                        cudaStream_t s);
/* parallel.gather_dtype e4m3 (ZeRO-3, weight cache none): layer's block matrices arrive gathered as e4m3
 * codes w8[k] (row-major [O, I], quantized by their owners with the record's scale: the bytes
 * qt_fp8_use_weights would write), so Wq (matrices in the bit set wq) is a device copy and Wq^T
 * (want_wqT) a byte transpose (qt_transpose_u8); no abs-max, no quantize pass. */
void qt_fp8_use_weights_e4m3(qt_gpu_fp8 *f, int layer, const void *const w8[QT_FP8_NMM], unsigned wq, int want_wqT,
                             cudaStream_t s);
/* Block matrix k of layer's weight scale record (its amax is the whole tensor's: e4m3 gathers set it from
 * the ranks' pieces) and the tag its nonfinite check reports. */
qt_fp8_scale *qt_fp8_weight_scale(qt_gpu_fp8 *f, int layer, qt_fp8_mm k);
int qt_fp8_weight_tag(int layer, qt_fp8_mm k);
/* Zeroes the abs-max records of every block input and output gradient (one memset, fine inside a
 * captured CUDA graph) and forgets earlier qt_fp8_producer_amax hand-outs. Once per micro-step,
 * before the forward. */
void qt_fp8_reset_amax(qt_gpu_fp8 *f, cudaStream_t s);
/* The device fp32 abs-max slot that the kernel producing matmul k's input (grad = 0) or output
 * gradient (grad = 1) folds into (an `amax` argument of qt_kernels.h), enqueued on the stream after
 * qt_fp8_reset_amax and before the matching qt_fp8_quant_input / qt_fp8_quant_grad, which then skips
 * its own abs-max pass. NULL (the separate pass stays) when that tensor is not quantized (grad with
 * grad_dtype bf16) or fusion is off (test hook fp8_unfused_amax: the old separate passes, bitwise equal). */
float *qt_fp8_producer_amax(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, int grad);
/* Quantizes the block input x (bf16 [N,I]) with current scaling into Xq (scratch, for the next
 * qt_fp8_fwd) and Xq^T (saved for qt_fp8_wgrad of the same layer/matmul; not written when matmul k is in
 * xq_shared: the backward makes it again, or nothing reads it). */
void qt_fp8_quant_input(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *x, cudaStream_t s);
/* The same quantization again for a recompute in the backward (memory.recompute), from the same x:
 * the scale comes from the abs-max the forward left in the record (no abs-max pass, no producer slot
 * consumed), so Xq, Xq^T, scale and descale are the forward's bytes. Valid until the next micro-step's
 * qt_fp8_reset_amax. */
void qt_fp8_requant_input(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *x, cudaStream_t s);
/* The SwiGLU backward (dgu [N, 2F] from dh [N, F] and gu, dgu may be gu, its abs-max folded into amax unless
 * NULL) and, in the same pass over gu, the down projection's Xq^T of the layer again: the bytes
 * qt_swiglu_bwd and qt_swiglu_fwd + qt_fp8_requant_input give (the swiglu recompute with an fp8 backward,
 * which reads nothing else of the SwiGLU output; down's wgrad then runs after its dgrad). Xq is not written. */
void qt_fp8_swiglu_bwd_requant(qt_gpu_fp8 *f, int layer, void *dgu, const void *dh, const void *gu, float *amax,
                               cudaStream_t s);
/* The same with GeGLU (Gemma): qt_geglu_bwd and qt_geglu_fwd + qt_fp8_requant_input's bytes. */
void qt_fp8_geglu_bwd_requant(qt_gpu_fp8 *f, int layer, void *dgu, const void *dh, const void *gu, float *amax,
                              cudaStream_t s);
/* y[N,O] (bf16) = Xq . Wq^T (+ bias, bf16), Xq from qt_fp8_quant_input. */
void qt_fp8_fwd(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *y, const void *bias,
                cudaStream_t s);
/* Quantizes dy (bf16 [N,O]) in grad_dt into dYq and dYq^T (dYq only, by the plain quantize, when created
 * without a weight gradient: the same dYq bytes); call before qt_fp8_dgrad/qt_fp8_wgrad. */
void qt_fp8_quant_grad(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *dy, cudaStream_t s);
/* dx[N,I] (bf16, =) = dYq . Wq from the last qt_fp8_quant_grad. */
void qt_fp8_dgrad(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *dx, cudaStream_t s);
/* dw[O,I] (dw_dt: fp32, or bf16 rounded once per call; +=) = dYq^T . Xq from the last qt_fp8_quant_grad and the forward's saved Xq^T. */
void qt_fp8_wgrad(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *dw, qt_dtype dw_dt, cudaStream_t s);
/* Names the tensor behind a nonfinite tag ("layer 3 down weight"); writes into buf. */
const char *qt_fp8_tag_name(int tag, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
