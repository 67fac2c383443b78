/* nf4.cu — NF4 (bitsandbytes' 4-bit NormalFloat) quantize and dequantize; layout, arithmetic and the CPU
 * reference: include/qt_nf4.h.
 *
 * x / y: bf16 or fp32 [rows, cols] row-major, seen as n = rows * cols values in blocks of 64. codes: uint8
 * [(n + 1) / 2], value 2k in the high nibble of byte k. absmax: fp32 [nb]; double-quantized: qabsmax uint8
 * [nb], absmax2 fp32 [ceil(nb / 256)], offset fp32 [1].
 * fp32 arithmetic, each step one IEEE operation (__fmul_rn / __fadd_rn / __fdiv_rn: never an FMA), so the
 * results equal nf4_ref.c bit for bit; y is rounded once (bf16: RNE) and written (=).
 *
 * quantize (once, at load): one warp per block of 64 (two values per lane, warp max); the mean of the
 *   scales in one CTA (fp64, fixed order); the 8-bit codes of the scales, one CTA per 256 of them.
 * dequant (per use; memory-bound: 0.5 byte read and 2 or 4 bytes written per value): a unit is 8 values =
 *   4 code bytes, loaded as one 32-bit word and stored as 16 bytes of bf16 (two float4 for fp32); a warp's
 *   loads and stores are contiguous; 4 units per thread in flight. The NF4 values (and the dynamic map)
 *   sit in shared memory: lanes index them by code. Unaligned pointers and the last n % 8 values take a
 *   one-value-per-thread path. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "qt_error.h"
#include "qt_nf4.h"
#include "qt_nf4_tables.h"

#define NF4_THREADS 256
#define NF4_UNITS 4 /* units of 8 values per thread in the dequant */

static __constant__ float NF4_T[15] = QT_NF4_THRESHOLDS_INIT;
static __constant__ float NF4_V[16] = QT_NF4_CODEBOOK_INIT;
static __constant__ float DYN_V[256] = QT_NF4_DYNAMIC_MAP_INIT;

/* ---- device helpers ---- */

template <typename T> static __device__ __forceinline__ float ld1(const T *x, long i);
template <> __device__ __forceinline__ float ld1<float>(const float *x, long i) { return x[i]; }
template <> __device__ __forceinline__ float ld1<__nv_bfloat16>(const __nv_bfloat16 *x, long i) {
    return __bfloat162float(x[i]);
}

/* Two values rounded to bf16 (RNE), a in the low half (the lower address). */
static __device__ __forceinline__ unsigned bf16x2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    unsigned u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static __device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* The scale of block b: absmax[b], or dyn[qabsmax[b]] * absmax2[b / 256] + offset (two roundings). */
template <int DQ>
static __device__ __forceinline__ float block_scale(long b, const float *absmax, const uint8_t *qabsmax,
                                                    const float *absmax2, float off, const float *dyn) {
    if (!DQ) return absmax[b];
    return __fadd_rn(__fmul_rn(dyn[qabsmax[b]], absmax2[b / QT_NF4_BLOCK2]), off);
}

/* ---- quantize ---- */

/* One warp per block of 64 (grid-stride): lane l codes values 2l and 2l+1 into one byte. */
template <typename T> __global__ void nf4_quant_kernel(const T *x, long n, uint8_t *codes, float *absmax) {
    __shared__ float thr[15];
    if (threadIdx.x < 15) thr[threadIdx.x] = NF4_T[threadIdx.x];
    __syncthreads();
    int lane = threadIdx.x & 31;
    long nb = (n + QT_NF4_BLOCK - 1) / QT_NF4_BLOCK, nw = (long)gridDim.x * blockDim.x / 32;
    for (long b = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32; b < nb; b += nw) {
        long i = b * QT_NF4_BLOCK + 2 * lane;
        float v0 = i < n ? ld1(x, i) : 0.0f, v1 = i + 1 < n ? ld1(x, i + 1) : 0.0f;
        float m = warp_max(fmaxf(fabsf(v0), fabsf(v1)));
        if (lane == 0) absmax[b] = m;
        float inv = __fdiv_rn(1.0f, m);
        int hi = qt_nf4_search(thr, __fmul_rn(v0, inv)), lo = qt_nf4_search(thr, __fmul_rn(v1, inv));
        if (i < n) codes[i / 2] = (uint8_t)(hi << 4 | lo);
    }
}

/* offset = mean(absmax[nb]) in one CTA of 256 threads: strided fp64 partial sums, then a tree. */
__global__ void nf4_mean_kernel(const float *absmax, long nb, float *offset) {
    __shared__ double p[QT_NF4_BLOCK2];
    int t = threadIdx.x;
    double s = 0.0;
    for (long i = t; i < nb; i += QT_NF4_BLOCK2) s = __dadd_rn(s, (double)absmax[i]);
    p[t] = s;
    __syncthreads();
    for (int h = QT_NF4_BLOCK2 / 2; h > 0; h >>= 1) {
        if (t < h) p[t] = __dadd_rn(p[t], p[t + h]);
        __syncthreads();
    }
    if (t == 0) *offset = (float)__ddiv_rn(p[0], (double)nb);
}

/* One CTA (256 threads) per 256 scales: absmax2 = max |absmax - offset|, then their 8-bit codes. */
__global__ void nf4_dq_kernel(const float *absmax, long nb, const float *offset, uint8_t *qabsmax, float *absmax2) {
    __shared__ float dyn[256], wm[NF4_THREADS / 32];
    int t = threadIdx.x;
    dyn[t] = DYN_V[t];
    long i = (long)blockIdx.x * QT_NF4_BLOCK2 + t;
    float v = i < nb ? __fsub_rn(absmax[i], *offset) : 0.0f;
    float m = warp_max(fabsf(v));
    if ((t & 31) == 0) wm[t / 32] = m;
    __syncthreads();
    m = wm[0];
    for (int w = 1; w < NF4_THREADS / 32; w++) m = fmaxf(m, wm[w]);
    if (t == 0) absmax2[blockIdx.x] = m;
    if (i < nb) qabsmax[i] = (uint8_t)qt_nf4_dyn_search(dyn, __fmul_rn(v, __fdiv_rn(1.0f, m)));
}

/* ---- dequantize ---- */

/* Loads the tables a CTA reads by code into shared memory (the dynamic map only when double-quantized). */
template <int DQ> static __device__ __forceinline__ void load_tables(float *lut, float *dyn) {
    if (threadIdx.x < 16) lut[threadIdx.x] = NF4_V[threadIdx.x];
    if (DQ)
        for (int k = threadIdx.x; k < 256; k += blockDim.x) dyn[k] = DYN_V[k];
    __syncthreads();
}

/* Units of 8 values: unit u is code word u (bytes 4u..4u+3) and y[8u, 8u+8). Needs 4-byte aligned codes and
 * 16-byte aligned y. */
template <typename Y, int DQ>
__global__ void nf4_dequant_vec_kernel(Y *y, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                                       const float *absmax2, const float *offset, long nunits) {
    __shared__ float lut[16], dyn[DQ ? 256 : 1];
    load_tables<DQ>(lut, dyn);
    float off = DQ ? *offset : 0.0f;
    long u0 = (long)blockIdx.x * blockDim.x * NF4_UNITS + threadIdx.x;
    uint32_t w[NF4_UNITS];
#pragma unroll
    for (int k = 0; k < NF4_UNITS; k++) {
        long u = u0 + (long)k * blockDim.x;
        w[k] = u < nunits ? __ldg((const uint32_t *)codes + u) : 0u;
    }
#pragma unroll
    for (int k = 0; k < NF4_UNITS; k++) {
        long u = u0 + (long)k * blockDim.x;
        if (u >= nunits) break;
        float a = block_scale<DQ>(u * 8 / QT_NF4_BLOCK, absmax, qabsmax, absmax2, off, dyn), v[8];
#pragma unroll
        for (int j = 0; j < 4; j++) { /* byte j (lowest address first): value 2j high nibble, 2j+1 low */
            unsigned byte = w[k] >> (8 * j) & 0xffu;
            v[2 * j] = __fmul_rn(lut[byte >> 4], a);
            v[2 * j + 1] = __fmul_rn(lut[byte & 15u], a);
        }
        if (sizeof(Y) == 2) {
            ((uint4 *)y)[u] = make_uint4(bf16x2(v[0], v[1]), bf16x2(v[2], v[3]), bf16x2(v[4], v[5]), bf16x2(v[6], v[7]));
        } else {
            float4 *p = (float4 *)y + 2 * u;
            p[0] = make_float4(v[0], v[1], v[2], v[3]);
            p[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
}

/* One value per thread, values [i0, n): unaligned pointers and the tail of the vector path. */
template <typename Y, int DQ>
__global__ void nf4_dequant_scalar_kernel(Y *y, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                                          const float *absmax2, const float *offset, long i0, long n) {
    __shared__ float lut[16], dyn[DQ ? 256 : 1];
    load_tables<DQ>(lut, dyn);
    long i = i0 + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned byte = codes[i / 2], c = i & 1 ? byte & 15u : byte >> 4;
    float a = block_scale<DQ>(i / QT_NF4_BLOCK, absmax, qabsmax, absmax2, DQ ? *offset : 0.0f, dyn);
    float v = __fmul_rn(lut[c], a);
    if (sizeof(Y) == 2) ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(v);
    else ((float *)y)[i] = v;
}

template <typename Y, int DQ>
static void dequant_launch(void *y, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                           const float *absmax2, const float *offset, long n, cudaStream_t s) {
    int aligned = ((uintptr_t)y % 16 == 0) && ((uintptr_t)codes % 4 == 0);
    long nunits = aligned ? n / 8 : 0, per = (long)NF4_THREADS * NF4_UNITS;
    if (nunits > 0)
        nf4_dequant_vec_kernel<Y, DQ><<<(unsigned)((nunits + per - 1) / per), NF4_THREADS, 0, s>>>(
            (Y *)y, codes, absmax, qabsmax, absmax2, offset, nunits);
    long i0 = nunits * 8;
    if (i0 < n)
        nf4_dequant_scalar_kernel<Y, DQ><<<(unsigned)((n - i0 + NF4_THREADS - 1) / NF4_THREADS), NF4_THREADS, 0, s>>>(
            (Y *)y, codes, absmax, qabsmax, absmax2, offset, i0, n);
    QT_CUDA(cudaGetLastError());
}

/* ---- launchers ---- */

static long nf4_count(long rows, long cols, const char *who) {
    QT_CHECK(rows >= 1 && cols >= 1 && rows <= (1L << 40) / cols,
             "%s: rows %ld x cols %ld: need rows, cols >= 1 and rows * cols <= 2^40", who, rows, cols);
    return rows * cols;
}

extern "C" void qt_nf4_quantize(qt_dtype xdt, const void *x, long rows, long cols, uint8_t *codes, float *absmax,
                                uint8_t *qabsmax, float *absmax2, float *offset, cudaStream_t s) {
    long n = nf4_count(rows, cols, "qt_nf4_quantize"), nb = qt_nf4_blocks(n);
    QT_CHECK(xdt == QT_DT_BF16 || xdt == QT_DT_F32, "qt_nf4_quantize: x is dtype %d, expected bf16 or fp32", (int)xdt);
    long warps_per_cta = NF4_THREADS / 32, grid = (nb + warps_per_cta - 1) / warps_per_cta;
    unsigned g = (unsigned)(grid < 65536 ? grid : 65536);
    if (xdt == QT_DT_BF16) nf4_quant_kernel<<<g, NF4_THREADS, 0, s>>>((const __nv_bfloat16 *)x, n, codes, absmax);
    else nf4_quant_kernel<<<g, NF4_THREADS, 0, s>>>((const float *)x, n, codes, absmax);
    if (qabsmax) {
        nf4_mean_kernel<<<1, QT_NF4_BLOCK2, 0, s>>>(absmax, nb, offset);
        nf4_dq_kernel<<<(unsigned)qt_nf4_blocks2(n), NF4_THREADS, 0, s>>>(absmax, nb, offset, qabsmax, absmax2);
    }
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_nf4_dequant(qt_dtype ydt, void *y, const uint8_t *codes, const float *absmax,
                               const uint8_t *qabsmax, const float *absmax2, const float *offset, long rows, long cols,
                               cudaStream_t s) {
    long n = nf4_count(rows, cols, "qt_nf4_dequant");
    QT_CHECK(ydt == QT_DT_BF16 || ydt == QT_DT_F32, "qt_nf4_dequant: y is dtype %d, expected bf16 or fp32", (int)ydt);
    QT_CHECK(qabsmax ? absmax2 && offset : absmax != NULL,
             "qt_nf4_dequant: scales missing (double-quantized: qabsmax, absmax2, offset; else absmax)");
    int bf = ydt == QT_DT_BF16;
    if (qabsmax) {
        if (bf) dequant_launch<__nv_bfloat16, 1>(y, codes, absmax, qabsmax, absmax2, offset, n, s);
        else dequant_launch<float, 1>(y, codes, absmax, qabsmax, absmax2, offset, n, s);
    } else {
        if (bf) dequant_launch<__nv_bfloat16, 0>(y, codes, absmax, qabsmax, absmax2, offset, n, s);
        else dequant_launch<float, 0>(y, codes, absmax, qabsmax, absmax2, offset, n, s);
    }
}
