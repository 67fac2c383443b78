/* quant.cu — fp8 (e4m3/e5m2) per-tensor quantization kernels: abs-max, scale, quantize,
 * quantize+transpose, dequantize. Contract and scaling rule: include/qt_quant.h.
 *
 * x: bf16 or fp32, [n] or [rows, cols] row-major. y: fp8 [n] / [rows, cols], yT: fp8 [cols, rows]. The
 * SwiGLU variants read gate|up [rows, 2 cols] and quantize its SwiGLU output (the fp8 recompute); one of
 * them is the SwiGLU backward as well (its dgu, in the same pass). The GeGLU variants (Gemma) are the same
 * kernels with gelu_tanh for silu (glu / act 2).
 * Math in fp32: v = fp32(x) * scale (one RNE multiply, never contracted), then one RNE conversion to
 * fp8 with __NV_SATFINITE (cvt.rn.satfinite on sm_89+, cuda_fp8.h's software path on sm_80).
 * abs-max: unsigned max on the bits of |x|, so the result is order-free and NaN-propagating.
 * Vector paths: 8 elements per step (16-byte bf16 / 2x16-byte fp32 loads, 8-byte fp8 stores), 16-byte
 * yT stores; scalar code covers unaligned pointers and ragged edges. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "kcommon.cuh"
#include "qt_error.h"
#include "qt_kernels.h"
#include "qt_quant.h"

#define QUANT_THREADS 256
#define QUANT_MAX_BLOCKS 8192L
#define TILE 64 /* quantize-transpose tile: TILE x TILE elements, QUANT_THREADS threads */

/* ---- device helpers ---- */

static __device__ __forceinline__ float bf16_bits_to_f32(unsigned h) { return __uint_as_float(h << 16); }

static __device__ __forceinline__ float load1(const void *x, int xbf16, long i) {
    if (xbf16) return bf16_bits_to_f32(((const unsigned short *)x)[i]);
    return ((const float *)x)[i];
}

/* 8 bf16 (16 bytes, element 0 lowest) -> fp32 (exact). */
static __device__ __forceinline__ void unpack8(uint4 r, float v[8]) {
    unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}

/* Elements [8u, 8u+8) of a 16-byte aligned x. */
static __device__ __forceinline__ void load8(const void *x, int xbf16, long u, float v[8]) {
    if (xbf16) {
        unpack8(((const uint4 *)x)[u], v);
    } else {
        float4 a = ((const float4 *)x)[2 * u], b = ((const float4 *)x)[2 * u + 1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
}

/* Two values -> two fp8 codes (a in the low byte). */
static __device__ __forceinline__ unsigned cvt2(float a, float b, int e5m2) {
    float2 f = make_float2(a, b);
    return e5m2 ? (unsigned)__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E5M2)
                : (unsigned)__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
}

/* Eight values times scale -> eight fp8 codes, element 0 in the lowest byte. */
static __device__ __forceinline__ uint2 quant8(const float v[8], float s, int e5m2) {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = cvt2(__fmul_rn(v[2 * k], s), __fmul_rn(v[2 * k + 1], s), e5m2);
    return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

static __device__ __forceinline__ uint8_t quant1(float v, float s, int e5m2) {
    return (uint8_t)(cvt2(__fmul_rn(v, s), 0.0f, e5m2) & 0xffu);
}

/* The scale rule of qt_fp8_scale_ref, in the same IEEE operations. */
static __device__ __forceinline__ float scale_of(float amax, float fmax) {
    if (!(amax <= FLT_MAX)) return __uint_as_float(0x7fffffffu);
    if (amax == 0.0f) return 1.0f;
    return fminf(__fdiv_rn(fmax, amax), FLT_MAX);
}

/* Scale for this kernel: *scale, or derived from sc->amax (block 0 publishes it and the flag). */
static __device__ __forceinline__ float kernel_scale(const float *scale, qt_fp8_scale *sc, float fmax,
                                                     int *flag, int tag) {
    if (!sc) return *scale;
    float s = scale_of(sc->amax, fmax);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sc->scale = s;
        sc->descale = __frcp_rn(s);
        if (flag && isnan(s)) atomicCAS(flag, 0, tag);
    }
    return s;
}

/* ---- kernels ---- */

/* amax[0] = max(amax[0], max |x|); vec: x is 16-byte aligned. */
__global__ void amax_fwd_kernel(float *amax, const void *x, long n, int xbf16, int vec) {
    long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, nth = (long)gridDim.x * blockDim.x;
    long nv = vec ? n / 8 : 0;
    unsigned m = 0;
    long u = tid;
    for (; u + 3 * nth < nv; u += 4 * nth) { /* four units' loads in flight before the first fold */
        float v[4][8];
#pragma unroll
        for (int j = 0; j < 4; j++) load8(x, xbf16, u + j * nth, v[j]);
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 8; k++) m = qt_amax_fold(m, v[j][k]);
    }
    for (; u < nv; u += nth) {
        float v[8];
        load8(x, xbf16, u, v);
#pragma unroll
        for (int k = 0; k < 8; k++) m = qt_amax_fold(m, v[k]);
    }
    for (long i = nv * 8 + tid; i < n; i += nth) m = qt_amax_fold(m, load1(x, xbf16, i));
    qt_amax_block_commit(amax, m);
}

__global__ void scale_fwd_kernel(qt_fp8_scale *sc, float fmax, int *flag, int tag) {
    float s = scale_of(sc->amax, fmax);
    sc->scale = s;
    sc->descale = __frcp_rn(s);
    if (flag && isnan(s)) atomicCAS(flag, 0, tag);
}

/* y[n] = fp8(x * scale); vec: x 16-byte and y 8-byte aligned. */
__global__ void quant_fwd_kernel(uint8_t *__restrict__ y, const void *__restrict__ x, long n, int xbf16, int e5m2, float fmax,
                                 const float *scale, qt_fp8_scale *sc, int *flag, int tag, int vec) {
    float s = kernel_scale(scale, sc, fmax, flag, tag);
    long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, nth = (long)gridDim.x * blockDim.x;
    long nv = vec ? n / 8 : 0;
    for (long u = tid; u < nv; u += nth) {
        float v[8];
        load8(x, xbf16, u, v);
        ((uint2 *)y)[u] = quant8(v, s, e5m2);
    }
    for (long i = nv * 8 + tid; i < n; i += nth) y[i] = quant1(load1(x, xbf16, i), s, e5m2);
}

/* Phase 2 of a quantize-transpose tile (after the block's __syncthreads): the tile's columns, from the
 * shared tile t (tr rows of TILE bytes, tr 64 or 128; 8-byte chunks XOR-swizzled by row / 16:
 * quant_transpose_body), as 16-byte pieces of rows of yT[C, R]; vt: yT 16-byte aligned and R % 16 == 0.
 * A warp reads 32 / (tr / 16) columns x tr / 16 row groups: 8 distinct chunks, no bank conflict. */
static __device__ __forceinline__ void tile_store_t(const uint8_t *t, uint8_t *__restrict__ yT, long r0, long c0,
                                                    long R, long C, int vt, int tr) {
    const int groups = tr / 16; /* a constant after inlining: the / and % below are shifts and masks */
    for (int p = threadIdx.x; p < TILE * tr / 16; p += QUANT_THREADS) {
        int lc = p / groups, j = p % groups; /* yT row c0+lc, columns r0+16j .. r0+16j+15 */
        long gc = c0 + lc, gr = r0 + 16 * j;
        if (gc >= C || gr >= R) continue;
        const uint8_t *col = t + 8 * ((lc >> 3) ^ j) + (lc & 7);
        unsigned w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            w[q] = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) w[q] |= (unsigned)col[(16 * j + 4 * q + k) * TILE] << (8 * k);
        }
        uint8_t *dst = yT + gc * R + gr;
        if (vt && gr + 16 <= R) *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
        else {
#pragma unroll
            for (int k = 0; k < 16; k++)
                if (gr + k < R) dst[k] = (uint8_t)(w[k >> 2] >> (8 * (k & 3)));
        }
    }
}

/* One TILE x TILE tile per block: quantize rows into y and a shared tile, then write the tile's
 * columns as rows of yT. The shared tile stores 8-byte chunks XOR-swizzled by (row / 16) so that
 * the column reads of phase 2 (8 columns x 4 row groups per warp) hit 8 distinct banks.
 * vin: x 16-byte aligned and cols % 8 == 0; vy: y 8-byte aligned and cols % 8 == 0;
 * vt: yT 16-byte aligned and rows % 16 == 0. */
/* glu (a constant per kernel below): x is gu[R, 2C] (bf16, gate | up halves) and element (r, c) is the
 * SwiGLU output bf16(qt_swiglu1(g, u)) (glu 1) or the GeGLU output bf16(qt_geglu1(g, u)) (glu 2), rounded as
 * qt_swiglu_fwd / qt_geglu_fwd store it, so the codes equal those of quantizing that kernel's output; vin then
 * means gu 16-byte aligned and C % 8 == 0. Used by qt_swiglu_bwd_quant_transpose_cur's general case
 * (unaligned or C % 8 != 0), before qt_swiglu_bwd, and GeGLU's. */
static __device__ __forceinline__ float glu_src1(int glu, float g, float u) {
    return glu == 2 ? qt_geglu1(g, u) : qt_swiglu1(g, u);
}
static __device__ __forceinline__ void load8_src(const void *x, int xbf16, int glu, long gr, long gc, long C, float v[8]) {
    if (!glu) {
        load8(x, xbf16, (gr * C + gc) / 8, v);
        return;
    }
    float u[8];
    load8(x, 1, (gr * 2 * C + gc) / 8, v);
    load8(x, 1, (gr * 2 * C + C + gc) / 8, u);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __bfloat162float(__float2bfloat16_rn(glu_src1(glu, v[k], u[k])));
}
static __device__ __forceinline__ float load1_src(const void *x, int xbf16, int glu, long gr, long gc, long C) {
    if (!glu) return load1(x, xbf16, gr * C + gc);
    float g = load1(x, 1, gr * 2 * C + gc), u = load1(x, 1, gr * 2 * C + C + gc);
    return __bfloat162float(__float2bfloat16_rn(glu_src1(glu, g, u)));
}

static __device__ __forceinline__ void quant_transpose_body(uint8_t *__restrict__ y, uint8_t *__restrict__ yT,
                                                            const void *__restrict__ x, long R, long C, long ntc,
                                                            int xbf16, int glu, int e5m2, float fmax,
                                                            const float *scale, qt_fp8_scale *sc, int *flag, int tag,
                                                            int vin, int vy, int vt) {
    __shared__ __align__(16) uint8_t t[TILE * TILE];
    float s = kernel_scale(scale, sc, fmax, flag, tag);
    long r0 = (blockIdx.x / ntc) * TILE, c0 = (blockIdx.x % ntc) * TILE;
    /* Fixed stride (launched with QUANT_THREADS) so both units' loads are issued before any store. */
#pragma unroll
    for (int u = threadIdx.x; u < TILE * TILE / 8; u += QUANT_THREADS) {
        int lr = u >> 3, cc = u & 7;
        long gr = r0 + lr, gc = c0 + cc * 8;
        uint2 q = make_uint2(0u, 0u);
        if (gr < R && gc < C) {
            long off = gr * C + gc;
            int full = gc + 8 <= C;
            float v[8];
            if (vin && full) load8_src(x, xbf16, glu, gr, gc, C, v);
            else {
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = gc + k < C ? load1_src(x, xbf16, glu, gr, gc + k, C) : 0.0f;
            }
            q = quant8(v, s, e5m2);
            if (y) {
                if (vy && full) *(uint2 *)(y + off) = q;
                else {
#pragma unroll
                    for (int k = 0; k < 8; k++) /* unrolled: constant k keeps q in registers */
                        if (gc + k < C) y[off + k] = (uint8_t)((k < 4 ? q.x : q.y) >> (8 * (k & 3)));
                }
            }
        }
        *(uint2 *)(t + lr * TILE + 8 * (cc ^ (lr >> 4))) = q;
    }
    __syncthreads();
    tile_store_t(t, yT, r0, c0, R, C, vt, TILE);
}

#define QT_QT_ARGS                                                                                          \
    uint8_t *__restrict__ y, uint8_t *__restrict__ yT, const void *__restrict__ x, long R, long C, long ntc,     \
        int xbf16, int e5m2, float fmax, const float *scale, qt_fp8_scale *sc, int *flag, int tag, int vin,     \
        int vy, int vt
__global__ void quant_transpose_fwd_kernel(QT_QT_ARGS) {
    quant_transpose_body(y, yT, x, R, C, ntc, xbf16, 0, e5m2, fmax, scale, sc, flag, tag, vin, vy, vt);
}
__global__ void quant_transpose_swiglu_kernel(QT_QT_ARGS) {
    quant_transpose_body(y, yT, x, R, C, ntc, 1, 1, e5m2, fmax, scale, sc, flag, tag, vin, vy, vt);
}
__global__ void quant_transpose_geglu_kernel(QT_QT_ARGS) {
    quant_transpose_body(y, yT, x, R, C, ntc, 1, 2, e5m2, fmax, scale, sc, flag, tag, vin, vy, vt);
}
#undef QT_QT_ARGS

/* The quantize-transpose of a bf16 x[R, C] with C % 8 == 0 and x 16-byte aligned (every gradient and
 * activation of the fp8 matmuls): one TILE_R x TILE tile (128 rows x 64 columns) per block, four units of
 * 8 elements a thread, all four 16-byte loads issued before the scale, the math and any store: a block keeps
 * 16 KiB in flight, where a 64-row tile's 8 KiB is too little to cover the H200's HBM latency (quant_bench
 * measures both). The codes are quant_transpose_body's: fp32(x) * scale, one RNE conversion.
 * vy: y 8-byte aligned; vt: yT 16-byte aligned and R % 16 == 0. */
#define TILE_R 128
__global__ void quant_transpose_bf16_kernel(uint8_t *__restrict__ y, uint8_t *__restrict__ yT,
                                            const bf16 *__restrict__ x, long R, long C, long ntc, int e5m2,
                                            float fmax, const float *scale, qt_fp8_scale *sc, int *flag, int tag,
                                            int vy, int vt) {
    __shared__ __align__(16) uint8_t t[TILE_R * TILE];
    enum { NU = TILE_R * TILE / 8 / QUANT_THREADS };
    long r0 = (blockIdx.x / ntc) * TILE_R, c0 = (blockIdx.x % ntc) * TILE;
    uint4 xv[NU];
#pragma unroll
    for (int i = 0; i < NU; i++) {
        int u = threadIdx.x + i * QUANT_THREADS, lr = u >> 3, cc = u & 7;
        long gr = r0 + lr, gc = c0 + cc * 8;
        xv[i] = gr < R && gc < C ? *(const uint4 *)(x + gr * C + gc) : make_uint4(0u, 0u, 0u, 0u); /* C % 8 == 0 */
    }
    float s = kernel_scale(scale, sc, fmax, flag, tag);
#pragma unroll
    for (int i = 0; i < NU; i++) {
        int u = threadIdx.x + i * QUANT_THREADS, lr = u >> 3, cc = u & 7;
        long gr = r0 + lr, gc = c0 + cc * 8;
        float v[8];
        unpack8(xv[i], v);
        uint2 q = quant8(v, s, e5m2);
        if (y && gr < R && gc < C) {
            long off = gr * C + gc;
            if (vy) *(uint2 *)(y + off) = q;
            else {
#pragma unroll
                for (int k = 0; k < 8; k++) y[off + k] = (uint8_t)((k < 4 ? q.x : q.y) >> (8 * (k & 3)));
            }
        }
        *(uint2 *)(t + lr * TILE + 8 * (cc ^ (lr >> 4))) = q;
    }
    __syncthreads();
    tile_store_t(t, yT, r0, c0, R, C, vt, TILE_R);
}

/* The SwiGLU backward and down's Xq^T in one pass over gu (qt_swiglu_bwd_quant_transpose_cur), the aligned
 * case: gu, dh, dgu 16-byte aligned, C % 8 == 0. One TILE x TILE tile of (rows, features) per block, two
 * units of 8 features per thread (rows lr and lr + 32). Both units' gate, up and dh (6 x 16 bytes) are loaded
 * before anything is stored, so that a thread keeps that much in flight: the kernel is bound by HBM (10
 * bytes moved per element plus the code) and by the latency of those loads. dgu may be gu: each element is
 * read before its unit is stored and the units are disjoint. Per element: one sigmoid (qt_sigmoid) shared
 * by the output and the gradients; dg, du rounded to bf16 once (=, what qt_swiglu_bwd
 * stores), h = bf16(g * sg * u) (what qt_swiglu_fwd stores) times the scale rounded to fp8 once (=).
 * fold: dgu's abs-max into *amax. act 2 (GeGLU, qt_geglu_bwd_quant_transpose_cur): one tanh shared the same
 * way, the gradients and h of qt_geglu_bwd / qt_geglu_fwd. */
static __device__ __forceinline__ void swiglu_bwd_qt_body(bf16 *dgu, const bf16 *dh, const bf16 *gu,
                                                          uint8_t *__restrict__ yT, long R, long C, long ntc, int e5m2,
                                                          float fmax, qt_fp8_scale *sc, int *flag, int tag, float *amax,
                                                          int vt, int fold, int act) {
    __shared__ __align__(16) uint8_t t[TILE * TILE];
    enum { NU = TILE * TILE / 8 / QUANT_THREADS };
    long r0 = (blockIdx.x / ntc) * TILE, c0 = (blockIdx.x % ntc) * TILE;
    uint4 gv[NU], uv[NU], dv[NU];
#pragma unroll
    for (int i = 0; i < NU; i++) {
        int p = threadIdx.x + i * QUANT_THREADS, lr = p >> 3, cc = p & 7;
        long gr = r0 + lr, gc = c0 + cc * 8;
        if (gr < R && gc < C) { /* C % 8 == 0: the unit is whole */
            const bf16 *row = gu + gr * 2 * C;
            gv[i] = *(const uint4 *)(row + gc);
            uv[i] = *(const uint4 *)(row + C + gc);
            dv[i] = *(const uint4 *)(dh + gr * C + gc);
        }
    }
    float s = kernel_scale(NULL, sc, fmax, flag, tag);
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < NU; i++) {
        int p = threadIdx.x + i * QUANT_THREADS, lr = p >> 3, cc = p & 7;
        long gr = r0 + lr, gc = c0 + cc * 8;
        uint2 q = make_uint2(0u, 0u);
        if (gr < R && gc < C) {
            float g[8], u[8], d[8], dg[8], du[8], h[8];
            unpack8(gv[i], g);
            unpack8(uv[i], u);
            unpack8(dv[i], d);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (act == 2) {
                    float tk = qt_gelu_tanh_t(g[k]);
                    qt_geglu_bwd1(g[k], u[k], d[k], tk, &dg[k], &du[k]);
                    h[k] = __bfloat162float(__float2bfloat16_rn(qt_geglu1(g[k], u[k])));
                    continue;
                }
                float sg = qt_sigmoid(g[k]);
                qt_swiglu_bwd1(g[k], u[k], d[k], sg, &dg[k], &du[k]);
#ifndef QT_MUTANT_SWIGLU_QT_NO_ROUND
                h[k] = __bfloat162float(__float2bfloat16_rn(qt_swiglu1s(g[k], sg, u[k])));
#else /* a test build (tools/gpu-check.sh fused22): codes of the fp32 product, which test_kernels must catch */
                h[k] = qt_swiglu1s(g[k], sg, u[k]);
#endif
            }
            bf16 *drow = dgu + gr * 2 * C;
            m = st8_fold(drow + gc, dg, m, fold);
            m = st8_fold(drow + C + gc, du, m, fold);
            q = quant8(h, s, e5m2);
        }
        *(uint2 *)(t + lr * TILE + 8 * (cc ^ (lr >> 4))) = q;
    }
    __syncthreads();
    tile_store_t(t, yT, r0, c0, R, C, vt, TILE);
    if (fold) qt_amax_block_commit(amax, m); /* every thread: it synchronizes the block */
}
/* fold a constant per kernel: tested at run time inside the loop it cost a third of the bandwidth (H200) */
#define QT_SGQ_ARGS                                                                                              \
    bf16 *dgu, const bf16 *dh, const bf16 *gu, uint8_t *__restrict__ yT, long R, long C, long ntc, int e5m2,       \
        float fmax, qt_fp8_scale *sc, int *flag, int tag, float *amax, int vt
__global__ void swiglu_bwd_qt_kernel(QT_SGQ_ARGS) {
    swiglu_bwd_qt_body(dgu, dh, gu, yT, R, C, ntc, e5m2, fmax, sc, flag, tag, amax, vt, 1, 1);
}
__global__ void swiglu_bwd_qt_nofold_kernel(QT_SGQ_ARGS) {
    swiglu_bwd_qt_body(dgu, dh, gu, yT, R, C, ntc, e5m2, fmax, sc, flag, tag, amax, vt, 0, 1);
}
__global__ void geglu_bwd_qt_kernel(QT_SGQ_ARGS) {
    swiglu_bwd_qt_body(dgu, dh, gu, yT, R, C, ntc, e5m2, fmax, sc, flag, tag, amax, vt, 1, 2);
}
__global__ void geglu_bwd_qt_nofold_kernel(QT_SGQ_ARGS) {
    swiglu_bwd_qt_body(dgu, dh, gu, yT, R, C, ntc, e5m2, fmax, sc, flag, tag, amax, vt, 0, 2);
}
#undef QT_SGQ_ARGS

/* yT[c][r] = x[r][c], bytes: one 32 x 32 tile per block (32 x 8 threads, 4 rows each), the tile padded to
 * 33 columns so the column reads hit distinct banks. */
#define UT 32
__global__ void transpose_u8_kernel(uint8_t *__restrict__ yT, const uint8_t *__restrict__ x, long R, long C, long ntc) {
    __shared__ uint8_t t[UT][UT + 1];
    long r0 = (blockIdx.x / ntc) * UT, c0 = (blockIdx.x % ntc) * UT;
    for (int i = threadIdx.y; i < UT; i += 8) {
        long r = r0 + i, c = c0 + threadIdx.x;
        if (r < R && c < C) t[i][threadIdx.x] = x[r * C + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < UT; i += 8) {
        long c = c0 + i, r = r0 + threadIdx.x;
        if (c < C && r < R) yT[c * R + r] = t[threadIdx.x][i];
    }
}

extern "C" void qt_transpose_u8(void *yT, const void *x, long rows, long cols, cudaStream_t s) {
    QT_CHECK(rows >= 0 && cols >= 0, "qt_transpose_u8: %ld x %ld", rows, cols);
    if (!rows || !cols) return;
    long ntr = (rows + UT - 1) / UT, ntc = (cols + UT - 1) / UT;
    QT_CHECK(ntr * ntc <= 0x7fffffffL, "qt_transpose_u8: %ld x %ld tiles", ntr, ntc);
    transpose_u8_kernel<<<(unsigned)(ntr * ntc), dim3(UT, 8), 0, s>>>((uint8_t *)yT, (const uint8_t *)x, rows, cols, ntc);
    QT_CUDA(cudaGetLastError());
}

/* y[n] = decode(x) * descale (descale may be NULL: 1). */
__global__ void dequant_fwd_kernel(void *y, int ybf16, const uint8_t *x, long n, int e5m2,
                                   const float *descale) {
    float d = descale ? *descale : 1.0f;
    long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, nth = (long)gridDim.x * blockDim.x;
    for (long i = tid; i < n; i += nth) {
        __half_raw h = e5m2 ? __nv_cvt_fp8_to_halfraw(x[i], __NV_E5M2) : __nv_cvt_fp8_to_halfraw(x[i], __NV_E4M3);
        float v = __half2float(__half(h));
        if (descale) v = __fmul_rn(v, d);
        if (ybf16) ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(v);
        else ((float *)y)[i] = v;
    }
}

/* ---- launchers ---- */

static int aligned(const void *p, int a) { return ((uintptr_t)p & (uintptr_t)(a - 1)) == 0; }

static int grid_for(long work) {
    long b = (work + QUANT_THREADS - 1) / QUANT_THREADS;
    return (int)(b < 1 ? 1 : b > QUANT_MAX_BLOCKS ? QUANT_MAX_BLOCKS : b);
}

static void check_x(qt_dtype xdt) {
    QT_CHECK(xdt == QT_DT_BF16 || xdt == QT_DT_F32, "quant input must be bf16 or fp32, got %s",
             qt_dtype_name(xdt));
}

static void check_fp8(qt_dtype dt) {
    QT_CHECK(dt == QT_DT_E4M3 || dt == QT_DT_E5M2, "fp8 dtype must be e4m3 or e5m2, got %s",
             qt_dtype_name(dt));
}

extern "C" void qt_quant_amax(qt_dtype xdt, const void *x, long n, float *amax, int accumulate,
                              cudaStream_t s) {
    check_x(xdt);
    QT_CHECK(n >= 0, "qt_quant_amax: n = %ld", n);
    if (!accumulate) QT_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (n == 0) return;
    int vec = aligned(x, 16);
    amax_fwd_kernel<<<grid_for(vec ? n / 32 + 1 : n), QUANT_THREADS, 0, s>>>(amax, x, n, xdt == QT_DT_BF16, vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_quant_scale_reset(qt_fp8_scale *sc, int n, cudaStream_t s) {
    QT_CUDA(cudaMemsetAsync(sc, 0, (size_t)n * sizeof(qt_fp8_scale), s));
}

extern "C" void qt_quant_scale(qt_dtype ydt, qt_fp8_scale *sc, int *nonfinite, int tag, cudaStream_t s) {
    check_fp8(ydt);
    QT_CHECK(tag != 0, "qt_quant_scale: tag must be nonzero");
    scale_fwd_kernel<<<1, 1, 0, s>>>(sc, qt_fp8_max(ydt), nonfinite, tag);
    QT_CUDA(cudaGetLastError());
}

static void quant_launch(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, const float *scale,
                         qt_fp8_scale *sc, int *flag, int tag, cudaStream_t s) {
    check_fp8(ydt);
    check_x(xdt);
    QT_CHECK(n >= 0, "qt_quant_fp8: n = %ld", n);
    QT_CHECK(!sc || tag != 0, "qt_quant_fp8_cur: tag must be nonzero");
    if (n == 0 && !sc) return;
    int vec = aligned(x, 16) && aligned(y, 8);
    quant_fwd_kernel<<<grid_for(vec ? n / 8 + 1 : n), QUANT_THREADS, 0, s>>>(
        (uint8_t *)y, x, n, xdt == QT_DT_BF16, ydt == QT_DT_E5M2, qt_fp8_max(ydt), scale, sc, flag, tag,
        vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_quant_fp8(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, const float *scale,
                             cudaStream_t s) {
    quant_launch(ydt, y, xdt, x, n, scale, NULL, NULL, 0, s);
}

extern "C" void qt_quant_fp8_cur(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, qt_fp8_scale *sc,
                                 int *nonfinite, int tag, cudaStream_t s) {
    quant_launch(ydt, y, xdt, x, n, NULL, sc, nonfinite, tag, s);
}

static void transpose_launch(qt_dtype ydt, void *y, void *yT, qt_dtype xdt, const void *x, int glu, long R, long C,
                             const float *scale, qt_fp8_scale *sc, int *flag, int tag, cudaStream_t s) {
    check_fp8(ydt);
    check_x(xdt);
    QT_CHECK(R >= 0 && C >= 0, "qt_quant_fp8_transpose: rows = %ld, cols = %ld", R, C);
    QT_CHECK(!sc || tag != 0, "qt_quant_fp8_transpose_cur: tag must be nonzero");
    long ntr = (R + TILE - 1) / TILE, ntc = (C + TILE - 1) / TILE, nt = ntr * ntc;
    if (nt == 0) {
        if (sc) quant_launch(ydt, NULL, xdt, x, 0, NULL, sc, flag, tag, s); /* still publish the scale */
        return;
    }
    QT_CHECK(nt <= 0x7fffffffL, "qt_quant_fp8_transpose: %ld x %ld needs too many tiles", R, C);
    int vin = aligned(x, 16) && C % 8 == 0, vy = y && aligned(y, 8) && C % 8 == 0;
    int vt = aligned(yT, 16) && R % 16 == 0;
    long ntr128 = (R + TILE_R - 1) / TILE_R;
    if (!glu && vin && xdt == QT_DT_BF16 && ntr128 * ntc <= 0x7fffffffL) {
        quant_transpose_bf16_kernel<<<(unsigned)(ntr128 * ntc), QUANT_THREADS, 0, s>>>(
            (uint8_t *)y, (uint8_t *)yT, (const bf16 *)x, R, C, ntc, ydt == QT_DT_E5M2, qt_fp8_max(ydt), scale, sc,
            flag, tag, vy, vt);
        QT_CUDA(cudaGetLastError());
        return;
    }
    (glu == 2 ? quant_transpose_geglu_kernel : glu ? quant_transpose_swiglu_kernel : quant_transpose_fwd_kernel)<<<
        (unsigned)nt, QUANT_THREADS, 0, s>>>(
        (uint8_t *)y, (uint8_t *)yT, x, R, C, ntc, xdt == QT_DT_BF16, ydt == QT_DT_E5M2, qt_fp8_max(ydt),
        scale, sc, flag, tag, vin, vy, vt);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_quant_fp8_transpose(qt_dtype ydt, void *y, void *yT, qt_dtype xdt, const void *x, long rows,
                                       long cols, const float *scale, cudaStream_t s) {
    transpose_launch(ydt, y, yT, xdt, x, 0, rows, cols, scale, NULL, NULL, 0, s);
}

extern "C" void qt_quant_fp8_transpose_cur(qt_dtype ydt, void *y, void *yT, qt_dtype xdt, const void *x,
                                           long rows, long cols, qt_fp8_scale *sc, int *nonfinite, int tag,
                                           cudaStream_t s) {
    transpose_launch(ydt, y, yT, xdt, x, 0, rows, cols, NULL, sc, nonfinite, tag, s);
}

/* qt_swiglu_bwd_quant_transpose_cur (act 1) and qt_geglu_bwd_quant_transpose_cur (act 2). */
static void glu_bwd_qt_launch(int act, void *dgu, const void *dh, const void *gu, long rows, long cols, float *amax,
                              qt_dtype ydt, void *yT, qt_fp8_scale *sc, int *nonfinite, int tag, cudaStream_t s) {
    const char *fn = act == 2 ? "qt_geglu_bwd_quant_transpose_cur" : "qt_swiglu_bwd_quant_transpose_cur";
    check_fp8(ydt);
    QT_CHECK(rows >= 0 && cols >= 0 && cols <= 0x7fffffffL, "%s: %ld x %ld", fn, rows, cols);
    QT_CHECK(tag != 0, "%s: tag must be nonzero", fn);
    long ntr = (rows + TILE - 1) / TILE, ntc = (cols + TILE - 1) / TILE;
    if (!(cols % 8 == 0 && aligned(gu, 16) && aligned(dh, 16) && aligned(dgu, 16)) || ntr * ntc == 0 ||
        ntr * ntc > 0x7fffffffL) {
        /* the general case: the two passes the fused kernel stands for, codes first (dgu may be gu) */
        transpose_launch(ydt, NULL, yT, QT_DT_BF16, gu, act, rows, cols, NULL, sc, nonfinite, tag, s);
        if (act == 2) qt_geglu_bwd(dgu, dh, gu, rows, (int)cols, amax, s);
        else qt_swiglu_bwd(dgu, dh, gu, rows, (int)cols, amax, s);
        return;
    }
    void (*k)(bf16 *, const bf16 *, const bf16 *, uint8_t *, long, long, long, int, float, qt_fp8_scale *, int *, int,
              float *, int) = act == 2 ? (amax ? geglu_bwd_qt_kernel : geglu_bwd_qt_nofold_kernel)
                                       : (amax ? swiglu_bwd_qt_kernel : swiglu_bwd_qt_nofold_kernel);
    k<<<(unsigned)(ntr * ntc), QUANT_THREADS, 0, s>>>(
        (bf16 *)dgu, (const bf16 *)dh, (const bf16 *)gu, (uint8_t *)yT, rows, cols, ntc, ydt == QT_DT_E5M2,
        qt_fp8_max(ydt), sc, nonfinite, tag, amax, aligned(yT, 16) && rows % 16 == 0);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_swiglu_bwd_quant_transpose_cur(void *dgu, const void *dh, const void *gu, long rows, long cols,
                                                  float *amax, qt_dtype ydt, void *yT, qt_fp8_scale *sc, int *nonfinite,
                                                  int tag, cudaStream_t s) {
    glu_bwd_qt_launch(1, dgu, dh, gu, rows, cols, amax, ydt, yT, sc, nonfinite, tag, s);
}

extern "C" void qt_geglu_bwd_quant_transpose_cur(void *dgu, const void *dh, const void *gu, long rows, long cols,
                                                 float *amax, qt_dtype ydt, void *yT, qt_fp8_scale *sc, int *nonfinite,
                                                 int tag, cudaStream_t s) {
    glu_bwd_qt_launch(2, dgu, dh, gu, rows, cols, amax, ydt, yT, sc, nonfinite, tag, s);
}

extern "C" void qt_quant_dequant(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, const float *descale,
                                 cudaStream_t s) {
    check_fp8(xdt);
    QT_CHECK(ydt == QT_DT_BF16 || ydt == QT_DT_F32, "dequant output must be bf16 or fp32, got %s",
             qt_dtype_name(ydt));
    QT_CHECK(n >= 0, "qt_quant_dequant: n = %ld", n);
    if (n == 0) return;
    dequant_fwd_kernel<<<grid_for(n), QUANT_THREADS, 0, s>>>(y, ydt == QT_DT_BF16, (const uint8_t *)x, n,
                                                              xdt == QT_DT_E5M2, descale);
    QT_CUDA(cudaGetLastError());
}
