/* norm.cu — global gradient L2 norm and the clip scale, computed on the GPU (no host round trip).
 *
 * g[n] fp32 or bf16 (read exactly) -> *norm = sqrt(sum g^2) (fp32), *scale = max_norm / norm when max_norm > 0 and
 * norm > max_norm, else 1 (the formula of qt_clip_scale, in double, rounded once).
 * Deterministic two passes: a FIXED grid of NORM_BLOCKS x NORM_THREADS threads (independent of n and
 * of the GPU) each sums squares in fp64 over a grid-stride walk (float4 loads when g is 16-byte
 * aligned), blocks reduce in a fixed tree into ws[NORM_BLOCKS] (fp64); one block then adds the
 * partials in a fixed tree (the sum of squares); one thread adds the ranks' sums in rank order (one
 * sum on a single GPU) and writes norm and scale. */
#include "kcommon.cuh"
#include "qt_kernels.h"

#define NORM_BLOCKS 512
#define NORM_THREADS 256

__global__ void __launch_bounds__(NORM_THREADS) grad_norm_fwd_kernel(double *part, const void *gv, int g_bf16,
                                                                    size_t n, int vec) {
    __shared__ double sh[32];
    size_t tid = (size_t)blockIdx.x * NORM_THREADS + threadIdx.x, stride = (size_t)NORM_BLOCKS * NORM_THREADS;
    size_t n4 = vec ? n / 4 : 0;
    const float *g = (const float *)gv;
    const bf16 *h = (const bf16 *)gv;
    double acc = 0.0;
    for (size_t i = tid; i < n4; i += stride) {
        float4 a;
        if (g_bf16) {
            uint2 u = ((const uint2 *)h)[i];
            __nv_bfloat162 p = *(__nv_bfloat162 *)&u.x, q = *(__nv_bfloat162 *)&u.y;
            a = make_float4(__low2float(p), __high2float(p), __low2float(q), __high2float(q));
        } else {
            a = ((const float4 *)g)[i];
        }
        acc += (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w;
    }
    for (size_t i = n4 * 4 + tid; i < n; i += stride) {
        double x = g_bf16 ? (double)__bfloat162float(h[i]) : (double)g[i];
        acc += x * x;
    }
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

/* Adds the fixed grid's partials in a fixed tree. */
__global__ void grad_sumsq_fwd_kernel(double *out, const double *part) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < NORM_BLOCKS; i += blockDim.x) acc += part[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out = acc;
}

__global__ void clip_scale_fwd_kernel(float *norm, float *scale, const double *sumsq, int nparts, float max_norm) {
    double acc = 0.0;
    for (int k = 0; k < nparts; k++) acc += sumsq[k];
    double nr = sqrt(acc);
    if (norm) *norm = (float)nr;
    if (scale) *scale = (!(max_norm > 0) || !(nr > max_norm)) ? 1.0f : (float)((double)max_norm / nr);
}

/* ws: the grid's partials, then the total */
extern "C" size_t qt_grad_norm_ws_bytes(void) { return (NORM_BLOCKS + 1) * sizeof(double); }

extern "C" void qt_grad_sumsq(double *sumsq, const void *g, qt_dtype g_dt, size_t n, void *ws, cudaStream_t s) {
    QT_CHECK(g_dt == QT_DT_F32 || g_dt == QT_DT_BF16, "grad norm: dtype %s: expected fp32 or bf16", qt_dtype_name(g_dt));
    int h = g_dt == QT_DT_BF16, vec = ((uintptr_t)g & (h ? 7 : 15)) == 0;
    grad_norm_fwd_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, s>>>((double *)ws, g, h, n, vec);
    QT_CUDA(cudaGetLastError());
    grad_sumsq_fwd_kernel<<<1, NORM_THREADS, 0, s>>>(sumsq, (const double *)ws);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_clip_from_sumsq(float *norm, float *scale, const double *sumsq, int nparts, float max_norm,
                                   cudaStream_t s) {
    clip_scale_fwd_kernel<<<1, 1, 0, s>>>(norm, scale, sumsq, nparts, max_norm);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_grad_norm(float *norm, float *scale, const void *g, qt_dtype g_dt, size_t n, float max_norm,
                             void *ws, cudaStream_t s) {
    double *total = (double *)ws + NORM_BLOCKS;
    qt_grad_sumsq(total, g, g_dt, n, ws, s);
    qt_clip_from_sumsq(norm, scale, total, 1, max_norm, s);
}
