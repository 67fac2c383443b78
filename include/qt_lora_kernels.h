/* qt_lora_kernels.h — the LoRA adapter kernels (cuda/lora.cu): one adapted module beside its base matmul, on the GPU.
 *
 * One module of qt_lora.h: A [r, in] and B [out, r] as bf16 copies of the fp32 adapters (unscaled), the input
 * x [N, in] bf16, its output columns [row0, row0 + out) of the fused y [N, ld] bf16. The dropout mask is
 * qt_lora_mask(mseed, n*in + i, p, 1/(1-p)) (the CPU engine's bits), all ones when p == 0. Every product is a
 * cuBLASLt GEMM through mm (qt_matmul.h: bf16 operands, fp32 accumulation, one RNE of the output), its algorithm
 * the context's recorded pick for the shape, so a launch gives the same bits every time. u and g are bf16 (they
 * are GEMM operands); the CPU reference (qt_lora_fwd_cpu / qt_lora_bwd_cpu, src/ref/lora_ref.c) keeps them in fp32.
 * ws: qt_lora_ws_bytes(N, in, p) bytes of device scratch (none when p == 0) holding the masked x, or the masked
 * dx term; its contents do not outlive a call. */
#ifndef QT_LORA_KERNELS_H
#define QT_LORA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "qt_cuda_types.h"
#include "qt_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of ws a module of input width in needs: N * in bf16 when p > 0, else 0. */
size_t qt_lora_ws_bytes(long N, int in, float p);
/* u[N, r] (bf16, =) = xd A^T, xd = x * mask. */
void qt_lora_down_fwd(qt_matmul_ctx *mm, void *u, void *ws, const void *x, const void *A, long N, int in, int r,
                      float p, uint64_t mseed, cudaStream_t s);
/* y[n, row0 + o] (bf16, +=: one RNE of y + the fp32 term) += scale * sum_k u[n,k] B[o,k]; y's other columns
 * untouched. */
void qt_lora_up_fwd(qt_matmul_ctx *mm, void *y, const void *u, const void *B, long N, int out, int r, int row0, int ld,
                    float scale, cudaStream_t s);
/* The backward's first half, before the base's dgrad may write over x (the down projection's dx is x's
 * buffer): g[N, r] (bf16, =) = scale * dy_m B, dB[out, r] (fp32, +=) += scale * dy_m^T u, dA[r, in] (fp32, +=)
 * += g^T xd; dy_m = dy's columns [row0, row0 + out) of its row stride ld. x NULL: dA is left to qt_lora_bwd_a. */
void qt_lora_bwd_w(qt_matmul_ctx *mm, void *g, float *dA, float *dB, void *ws, const void *dy, const void *u,
                   const void *x, const void *B, long N, int in, int out, int r, int row0, int ld, float scale, float p,
                   uint64_t mseed, cudaStream_t s);
/* dA[r, in] (fp32, +=) += g^T xd: qt_lora_bwd_w's last part, for an x that exists only later (a recomputed
 * SwiGLU output, rebuilt over its gradient's buffer). */
void qt_lora_bwd_a(qt_matmul_ctx *mm, float *dA, void *ws, const void *g, const void *x, long N, int in, int r,
                   float p, uint64_t mseed, cudaStream_t s);
/* The second half, once the base's dgrad wrote dx: dx[N, in] (bf16, +=) += mask * (g A). p == 0: one RNE of dx + the
 * fp32 term; p > 0: the term is rounded to bf16 in ws first (1/(1-p) applied), then added where the mask keeps
 * (a second RNE). */
void qt_lora_bwd_x(qt_matmul_ctx *mm, void *dx, void *ws, const void *g, const void *A, long N, int in, int r, float p,
                   uint64_t mseed, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
