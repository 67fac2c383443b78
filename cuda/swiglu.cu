/* swiglu.cu — SwiGLU on the fused gate/up matmul output.
 *
 * fwd: out[n,f] = silu(g) * u,  g = gu[n, j], u = gu[n, f+j],  silu(g) = g * sigmoid(g)
 * bwd: dgu[n, j] = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  dgu[n, f+j] = dout * silu(g)
 * bf16 storage, fp32 math (expf: qt_swiglu1 in kcommon.cuh), one RNE rounding per output ("=" both).
 * 8 columns per thread with 16-byte loads when f % 8 == 0 and the pointers are 16-byte aligned; one
 * column otherwise.
 * amax != NULL: max |output| (the bf16 values written) folded into *amax, one atomicMax per block. */
#include "kcommon.cuh"
#include "qt_kernels.h"

__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gu, long n, int f, int vec, float *amax) {
    long long per_row = vec ? f / 8 : f, total = (long long)n * per_row;
    unsigned m = 0;
    int fold = amax != NULL;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        long long r = k / per_row, j = k - r * per_row;
        const bf16 *gr = gu + r * 2 * f;
        if (vec) {
            float g[8], u[8];
            ld8(g, gr + j * 8);
            ld8(u, gr + f + j * 8);
#pragma unroll
            for (int i = 0; i < 8; i++) g[i] = qt_swiglu1(g[i], u[i]);
            m = st8_fold(out + r * f + j * 8, g, m, fold);
        } else {
            float g = __bfloat162float(gr[j]), u = __bfloat162float(gr[f + j]);
            m = st1_fold(out + r * f + j, qt_swiglu1(g, u), m, fold);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

__global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dout, const bf16 *gu, long n, int f, int vec,
                                  float *amax) {
    long long per_row = vec ? f / 8 : f, total = (long long)n * per_row;
    unsigned m = 0;
    int fold = amax != NULL;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        long long r = k / per_row, j = k - r * per_row;
        const bf16 *gr = gu + r * 2 * f;
        bf16 *dr = dgu + r * 2 * f;
        if (vec) {
            float g[8], u[8], d[8];
            ld8(g, gr + j * 8);
            ld8(u, gr + f + j * 8);
            ld8(d, dout + r * f + j * 8);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float gi = g[i], ui = u[i];
                qt_swiglu_bwd1(gi, ui, d[i], qt_sigmoid(gi), &g[i], &u[i]);
            }
            m = st8_fold(dr + j * 8, g, m, fold);
            m = st8_fold(dr + f + j * 8, u, m, fold);
        } else {
            float g = __bfloat162float(gr[j]), u = __bfloat162float(gr[f + j]);
            float dg, du;
            qt_swiglu_bwd1(g, u, __bfloat162float(dout[r * f + j]), qt_sigmoid(g), &dg, &du);
            m = st1_fold(dr + j, dg, m, fold);
            m = st1_fold(dr + f + j, du, m, fold);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

extern "C" void qt_swiglu_fwd(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    if (n <= 0 || f <= 0) return;
    int vec = f % 8 == 0 && qt_aligned16(out) && qt_aligned16(gu);
    long long work = (long long)n * (vec ? f / 8 : f);
    swiglu_fwd_kernel<<<qt_grid_for(work, 256), 256, 0, s>>>((bf16 *)out, (const bf16 *)gu, n, f, vec, amax);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_swiglu_bwd(void *dgu, const void *dout, const void *gu, long n, int f, float *amax,
                              cudaStream_t s) {
    if (n <= 0 || f <= 0) return;
    int vec = f % 8 == 0 && qt_aligned16(dgu) && qt_aligned16(dout) && qt_aligned16(gu);
    long long work = (long long)n * (vec ? f / 8 : f);
    swiglu_bwd_kernel<<<qt_grid_for(work, 256), 256, 0, s>>>((bf16 *)dgu, (const bf16 *)dout,
                                                             (const bf16 *)gu, n, f, vec, amax);
    QT_CUDA(cudaGetLastError());
}
