/* qt_matmul.h — the trainer's GEMMs through cuBLASLt: bf16 forward/dgrad/wgrad and fp8 (e4m3/e5m2) TN.
 *
 * Callers think row-major; every matrix is dense with its row length as leading dimension:
 *   fwd    Y[N,O]  (=|+=) X[N,I] . W[O,I]^T (+ bias[O])
 *   dgrad  dX[N,I] (=|+=) dY[N,O] . W[O,I]
 *   wgrad  dW[O,I] (=|+=) dY[N,O]^T . X[N,I]        (+ dbias[O] = sum_n dY[n,:] when fused)
 *   fp8    D[M,N]  (=|+=) (sa*A[M,K]) . (sb*B[N,K])^T (+ bias[N])   A and B both K-major ("TN")
 * Inputs bf16 (fp8 for qt_matmul_fp8), fp32 accumulation (CUBLAS_COMPUTE_32F), output bf16 or fp32
 * rounded once (RNE). "+=" is beta = 1: C is the output buffer itself.
 *
 * A context holds one cuBLASLt handle, ONE workspace and a cache of per-shape plans (descriptors +
 * the chosen algorithm). It is used by one thread on one stream at a time (the workspace is shared by
 * every call). On the first call of a shape it asks the heuristic for up to 8 algorithms and times
 * them (2 warm-ups + 5 timed runs each) on the caller's buffers, or on a scratch output when the call
 * accumulates, and keeps the fastest. qt_matmul_set_autotune(c, 0) (the trainer's
 * perf.matmul_autotune: false) keeps the heuristic's first choice instead. Tuning synchronises the
 * stream, so warm every shape up before capturing a CUDA graph (under capture it is skipped).
 *
 * Picks made by timing vary run to run, and another algorithm gives other bits. So each pick is
 * recorded process-wide per (GPU model, shape): every autotuning context takes a recorded pick instead
 * of timing again (all ranks and engines of a process multiply alike), and the records can be saved and
 * loaded (a checkpoint, a cache file) so that a resumed or repeated run uses the same algorithms. */
#ifndef QT_MATMUL_H
#define QT_MATMUL_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qt_matmul_ctx qt_matmul_ctx;

/* Creates a context on the current device with a workspace of ws_bytes (0: 64 MiB). Caller frees it
 * with qt_matmul_free. */
qt_matmul_ctx *qt_matmul_create(size_t ws_bytes);
#define QT_MATMUL_WS_DEFAULT ((size_t)64 << 20) /* qt_matmul_create(0)'s workspace */
/* Device bytes the autotuner allocates for a while (freed after tuning) to tune an accumulating GEMM
 * whose output has out_bytes: out_bytes, or 0 when it is too big to tune that way. */
size_t qt_matmul_tune_scratch_bytes(size_t out_bytes);
void qt_matmul_free(qt_matmul_ctx *c);
/* 1: time the heuristic's candidates on a shape's first use (the default);
 * 0: take the heuristic's first. Affects plans built afterwards. */
void qt_matmul_set_autotune(qt_matmul_ctx *c, int on);
/* The recorded autotune picks of this process (see above) as bytes: written to buf when cap is enough;
 * returns the bytes needed. */
size_t qt_matmul_choices_save(void *buf, size_t cap);
/* Merges records saved by qt_matmul_choices_save (a loaded record replaces this process's own for the
 * same GPU model and shape); affects plans built afterwards. 0, or -1 with err when the bytes are not
 * such records or were timed with another cuBLASLt version (nothing loaded). */
int qt_matmul_choices_load(const void *buf, size_t n, char *err, size_t errlen);
/* Number of plans built so far (cache misses); a repeated shape adds none. */
long qt_matmul_plan_count(const qt_matmul_ctx *c);
/* Device compute capability as major*10+minor (fp8 needs >= 89). */
int qt_matmul_cc(const qt_matmul_ctx *c);

/* Y[N,O] = X . W^T (+ bias) (+ Y when accumulate). x, w bf16; y of ydt (bf16 or fp32); bias (may be
 * NULL) has ydt's type. */
void qt_matmul_fwd(qt_matmul_ctx *c, void *y, qt_dtype ydt, const void *x, const void *w, const void *bias,
                   long N, int I, int O, int accumulate, cudaStream_t s);
/* dX[N,I] = dY . W (+ dX when accumulate). dy, w bf16; dx of dxdt (bf16 or fp32). */
void qt_matmul_dgrad(qt_matmul_ctx *c, void *dx, qt_dtype dxdt, const void *dy, const void *w, long N, int I,
                     int O, int accumulate, cudaStream_t s);
/* dW[O,I] = dY^T . X (+ dW when accumulate). dy, x bf16; dw of dwdt (fp32 or bf16). When dbias is not
 * NULL, tries the fused bias-gradient epilogue (BGRADB): on success dbias[O] (dwdt's type) is WRITTEN
 * (=, not accumulated) with sum_n dY[n,:] and 1 is returned; 0 means this cuBLASLt has no such kernel
 * for the shape, dbias is untouched and the caller reduces dY itself. Returns 0 when dbias is NULL. */
int qt_matmul_wgrad(qt_matmul_ctx *c, void *dw, qt_dtype dwdt, void *dbias, const void *dy, const void *x,
                    long N, int I, int O, int accumulate, cudaStream_t s);
/* The same three products on strided operands, the product scaled by alpha (fp32, before the accumulate):
 *   fwd_ld    Y[N,O]  (=|+=) alpha * X[N,I] . W[O,I]^T
 *   dgrad_ld  dX[N,I] (=|+=) alpha * dY[N,O] . W[O,I]
 *   wgrad_ld  dW[O,I] (=|+=) alpha * dY[N,O]^T . X[N,I]
 * Row n of a strided operand starts ld elements after row n-1 (ld >= its row length), so a column block of a wider
 * buffer (rows [row0, row0 + O) of a fused output [N, ld]) is its first element and the buffer's width; the
 * other columns are neither read nor written. W and dW are dense. Each stride is part of the plan's key (the
 * pick record's too). Types, rounding and autotuning as the dense forms. */
void qt_matmul_fwd_ld(qt_matmul_ctx *c, void *y, qt_dtype ydt, long ldy, const void *x, long ldx, const void *w, long N,
                      int I, int O, float alpha, int accumulate, cudaStream_t s);
void qt_matmul_dgrad_ld(qt_matmul_ctx *c, void *dx, qt_dtype dxdt, long lddx, const void *dy, long lddy, const void *w,
                        long N, int I, int O, float alpha, int accumulate, cudaStream_t s);
void qt_matmul_wgrad_ld(qt_matmul_ctx *c, void *dw, qt_dtype dwdt, const void *dy, long lddy, const void *x, long ldx,
                        long N, int I, int O, float alpha, int accumulate, cudaStream_t s);
/* D[M,N] = (sa*A[M,K]) . (sb*B[N,K])^T (+ bias[N], bf16) (+ D when accumulate). a, b e4m3 or e5m2
 * (not both e5m2); a_scale, b_scale: DEVICE pointers to one fp32 each (NULL: 1). d of ddt (bf16 or
 * fp32). fast_accum: Hopper's fp8 fast accumulation (no periodic fp32 promotion). M, N and K % 16 == 0
 * and 16-byte aligned pointers (cuBLASLt's fp8 kernels; others fail with a message, e.g. M=1 is
 * refused). Fails naming the device and its cc below sm_89. */
void qt_matmul_fp8(qt_matmul_ctx *c, void *d, qt_dtype ddt, const void *a, qt_dtype adt, const float *a_scale,
                   const void *b, qt_dtype bdt, const float *b_scale, const void *bias, long M, int N, int K,
                   int fast_accum, int accumulate, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
