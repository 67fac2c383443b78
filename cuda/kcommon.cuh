/* kcommon.cuh — device helpers shared by the kernels in cuda/: bf16x8 vector loads/stores (optionally
 * folding an fp8 abs-max), fixed-order warp/block reductions, launch sizing. Private to cuda/ (never
 * included by C code).
 *
 * Reductions are trees in a fixed shape (warp shuffles, then warp 0 over the per-warp values), so a
 * kernel that uses them gives bitwise-identical results run after run. */
#ifndef QT_KCOMMON_CUH
#define QT_KCOMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_error.h"
#include "qt_quant.h"

typedef __nv_bfloat16 bf16;

/* 8 bf16 = 16 bytes: the unit of every vectorised load and store. */
typedef struct __align__(16) { bf16 h[8]; } bf16x8;

/* f[0..8) rounded to bf16 (RNE) two at a time: one pack instruction per pair. */
static __device__ __forceinline__ bf16x8 pack8(const float *f) {
    bf16x8 v;
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        __nv_bfloat162 t = __floats2bfloat162_rn(f[i], f[i + 1]);
        v.h[i] = t.x;
        v.h[i + 1] = t.y;
    }
    return v;
}

static __device__ __forceinline__ void ld8(float *f, const bf16 *p) {
    bf16x8 v = *(const bf16x8 *)p;
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = __bfloat162float(v.h[i]);
}
static __device__ __forceinline__ void st8(bf16 *p, const float *f) { *(bf16x8 *)p = pack8(f); }

/* st8 / one bf16 store that, when fold is set, also fold the stored (bf16-rounded) values into the
 * abs-max bits m (qt_amax_fold): the fused abs-max of a producer must see exactly what it wrote.
 * fold is uniform per launch (amax != NULL): without it these cost what a plain store costs. */
static __device__ __forceinline__ unsigned st8_fold(bf16 *p, const float *f, unsigned m, int fold) {
    bf16x8 v = pack8(f);
    *(bf16x8 *)p = v;
    if (fold) {
#pragma unroll
        for (int i = 0; i < 8; i++) m = qt_amax_fold(m, __bfloat162float(v.h[i]));
    }
    return m;
}
static __device__ __forceinline__ unsigned st1_fold(bf16 *p, float f, unsigned m, int fold) {
    bf16 h = __float2bfloat16_rn(f);
    *p = h;
    return fold ? qt_amax_fold(m, __bfloat162float(h)) : m;
}

/* SwiGLU of one gate/up pair in fp32: silu(g) * u = g * sigmoid(g) * u, sigmoid = 1 / (1 + e^-g) with the
 * hardware's ex2 and reciprocal (ex2.approx: relative error ~2^-22 + |g| ulps; __fdividef: ~1 ulp), a few
 * ulps of fp32 under the one bf16 rounding of the product (2^-9 relative). The IEEE expf and division cost
 * ~30 instructions an element, which caps the GLU kernels below the H200's HBM rate. One definition for
 * the forward (swiglu.cu) and the fp8 recompute's fused quantize (quant.cu): both round the product to bf16
 * once, so they agree bitwise. g < -87: e^-g is inf and sigmoid 0; g > 17: 1 + e^-g rounds to 1. */
static __device__ __forceinline__ float qt_sigmoid(float g) {
    float e; /* e^-g = 2^(-g log2 e), flushed to 0 below 2^-126 (where 1 + e is 1) */
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504088896341f));
    return __fdividef(1.0f, 1.0f + e);
}
/* sg = qt_sigmoid(g) given: a kernel that needs the output and the gradients computes it once. */
static __device__ __forceinline__ float qt_swiglu1s(float g, float sg, float u) { return g * sg * u; }
static __device__ __forceinline__ float qt_swiglu1(float g, float u) { return qt_swiglu1s(g, qt_sigmoid(g), u); }
/* Its gradients for dout d: dg = d * u * sg * (1 + g * (1 - sg)), du = d * g * sg; one definition for
 * swiglu.cu's backward and quant.cu's fused one (same operations, same bits). */
static __device__ __forceinline__ void qt_swiglu_bwd1(float g, float u, float d, float sg, float *dg, float *du) {
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

/* GELU with the tanh approximation, torch's gelu(approximate="tanh") (transformers' gelu_pytorch_tanh, Gemma's
 * MLP activation) in aten's fp32 operation order: t = tanhf(b * (x + k * x^3)), gelu = 0.5 x (1 + t),
 * gelu' = 0.5 (1 + t) + 0.5 x (1 - t^2) b (1 + 3 k x^2), b = sqrt(2/pi), k = 0.044715. IEEE tanhf (no fast
 * math). QT_MUTANT_GEGLU_ERF (a test build only) computes the erf GELU instead, which the GeGLU rows of
 * test_ops_gpu must catch. */
#define QT_GELU_BETA 0.7978845608028654f
#define QT_GELU_KAPPA 0.044715f
static __device__ __forceinline__ float qt_gelu_tanh_t(float x) {
    return tanhf(QT_GELU_BETA * (x + QT_GELU_KAPPA * (x * x * x)));
}
static __device__ __forceinline__ float qt_gelu_tanh1t(float x, float t) {
#ifndef QT_MUTANT_GEGLU_ERF
    return 0.5f * x * (1.0f + t);
#else
    (void)t;
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
#endif
}
static __device__ __forceinline__ float qt_gelu_tanh_grad(float x, float t) {
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * (QT_GELU_BETA * (1.0f + 3.0f * QT_GELU_KAPPA * (x * x)));
}
/* GeGLU of one gate/up pair, gelu_tanh(g) * u: one definition for swiglu.cu's GeGLU kernels and quant.cu's
 * fused fp8 variants (the same bits). */
static __device__ __forceinline__ float qt_geglu1(float g, float u) { return qt_gelu_tanh1t(g, qt_gelu_tanh_t(g)) * u; }
/* Its gradients for dout d, t = qt_gelu_tanh_t(g) given: dg = d * u * gelu'(g), du = d * gelu(g). */
static __device__ __forceinline__ void qt_geglu_bwd1(float g, float u, float d, float t, float *dg, float *du) {
    *du = d * qt_gelu_tanh1t(g, t);
    *dg = d * u * qt_gelu_tanh_grad(g, t);
}

static __host__ __device__ __forceinline__ int qt_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

static __device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
static __device__ __forceinline__ double warp_sum_d(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
static __device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Block-wide sum, result valid in every thread. blockDim.x % 32 == 0, <= 1024. sh: 32 floats. */
static __device__ __forceinline__ float block_sum(float x, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[wid] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(x);
}
static __device__ __forceinline__ double block_sum_d(double x, double *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum_d(x);
    __syncthreads();
    if (lane == 0) sh[wid] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(x);
}
static __device__ __forceinline__ float block_max(float x, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) sh[wid] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(x);
}

/* Blocks for a grid-stride loop over n work items: enough to fill the GPU, capped so the grid fits. */
static inline unsigned qt_grid_for(long long n, int threads) {
    long long b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)b;
}

#endif
