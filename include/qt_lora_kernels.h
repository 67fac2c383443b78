/* qt_lora_kernels.h — the LoRA adapter kernels (cuda/lora.cu): one adapted module beside its base matmul, on the GPU.
 *
 * One module of qt_lora.h: A [r, in] and B [out, r] fp32, the input x [N, in] bf16, its output rows
 * [row0, row0 + out) of the fused y [N, ld] bf16. xd = x * mask, the dropout mask of qt_lora_mask(mseed, n*in + i,
 * p, 1/(1-p)) (the CPU engine's bits), all ones when p == 0. Sums in fp32 in a fixed order (every launch gives
 * the same bits); the CPU reference is qt_lora_fwd_cpu / qt_lora_bwd_cpu (src/ref/lora_ref.c). */
#ifndef QT_LORA_KERNELS_H
#define QT_LORA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "qt_cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* u[N, r] (fp32, =) = xd A^T. */
void qt_lora_down_fwd(float *u, const void *x, const float *A, long N, int in, int r, float p, uint64_t mseed,
                      cudaStream_t s);
/* y[n, row0 + o] (bf16, +=: one RNE of y + the fp32 term) += scale * sum_k u[n,k] B[o,k]; y's other columns
 * untouched. */
void qt_lora_up_fwd(void *y, const float *u, const float *B, long N, int out, int r, int row0, int ld, float scale,
                    cudaStream_t s);
/* The token sums of dB and dA run in QT_LORA_CHUNKS chunks of the N tokens, each chunk's partial sums into part
 * (qt_lora_part_bytes(max(in, out), r) bytes of scratch), then added in chunk order: every thread walks N /
 * QT_LORA_CHUNKS tokens, not N. */
#define QT_LORA_CHUNKS 32
size_t qt_lora_part_bytes(int dim, int r);
/* The backward's first half, before the base's dgrad may write over x (the down projection's dx is x's
 * buffer): g[N, r] (fp32, =) = scale * dy_m B, dB[out, r] (fp32, +=) += scale * dy_m^T u, dA[r, in] (fp32, +=)
 * += g^T xd; dy_m = dy's rows [row0, row0 + out) of ld. x NULL: dA is left to qt_lora_bwd_a. */
void qt_lora_bwd_w(float *g, float *dA, float *dB, float *part, const void *dy, const float *u, const void *x,
                   const float *B, long N, int in, int out, int r, int row0, int ld, float scale, float p, uint64_t mseed,
                   cudaStream_t s);
/* dA[r, in] (fp32, +=) += g^T xd: qt_lora_bwd_w's last part, for an x that exists only later (a recomputed
 * SwiGLU output, rebuilt over its gradient's buffer). */
void qt_lora_bwd_a(float *dA, float *part, const float *g, const void *x, long N, int in, int r, float p,
                   uint64_t mseed, cudaStream_t s);
/* The second half, once the base's dgrad wrote dx: dx[N, in] (bf16, +=: one RNE of dx + the fp32 term) += mask *
 * (g A). */
void qt_lora_bwd_x(void *dx, const float *g, const float *A, long N, int in, int r, float p, uint64_t mseed,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
