/* qt_quant.h — fp8 (e4m3/e5m2) per-tensor quantization: abs-max, scales, quantize (+transpose),
 * dequantize on the GPU (cuda/quant.cu), and the CPU fp8 codec they are tested against (src/ref/fp8_ref.c).
 *
 * Per-tensor current scaling, with no host round trip:
 *   amax    = max |x|                          (device fp32; NaN/Inf in x make it NaN/Inf)
 *   scale   = fp8_max / amax  (1 when amax == 0, clamped to FLT_MAX; NaN when amax is not finite)
 *   descale = 1 / scale       (what cuBLASLt's A/B_SCALE_POINTER wants: multiplies fp8 values back)
 *   y       = sat(rne(fp32(x) * scale))        (__NV_SATFINITE: |y| <= fp8_max; NaN stays NaN)
 * Every fp32 operation above is one IEEE-rounded op, so the CPU codec reproduces the GPU bit for bit.
 *
 * The usual flow for one tensor (all on one stream):
 *   1. cudaMemsetAsync(&sc->amax, 0, 4) (or qt_quant_scale_reset), then the producer kernel folds
 *      |x| into sc->amax with qt_amax_block_commit (below) — or qt_quant_amax as a separate pass;
 *   2. qt_quant_fp8_cur / qt_quant_fp8_transpose_cur: scale from sc->amax, quantize, write
 *      sc->scale and sc->descale, raise *nonfinite = tag when amax is NaN/Inf — one launch;
 *   3. the fp8 GEMM reads &sc->descale as its scale pointer.
 * Alignment: any pointers/sizes work (scalar tails); the fast paths want 16-byte aligned pointers,
 * cols % 8 == 0 (quantize, y) and rows % 16 == 0 (yT). cuBLASLt fp8 itself wants leading dims % 16. */
#ifndef QT_QUANT_H
#define QT_QUANT_H

#include <stdint.h>

#include "qt_cuda_types.h"

#include "qt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QT_E4M3_MAX 448.0f
#define QT_E5M2_MAX 57344.0f

/* Device-resident scaling state of one quantized tensor (16 bytes; amax first so &sc->amax is the
 * float* producers fold into). Owned by the caller (e.g. one array per model, cudaMalloc'ed). */
typedef struct __attribute__((aligned(16))) {
    float descale; /* first: cuBLASLt's scale pointers must be 16-byte aligned (seen on H100/H200) */
    float amax, scale;
    int pad;
} qt_fp8_scale;

/* Largest finite value of an fp8 dtype (448 or 57344); 0 for non-fp8 dtypes. Inline here, so that the
 * kernels (cuda/quant.cu) and the CPU codec share it without an arrow from cuda/ into src/. */
static inline float qt_fp8_max(qt_dtype dt) {
    return dt == QT_DT_E4M3 ? QT_E4M3_MAX : dt == QT_DT_E5M2 ? QT_E5M2_MAX : 0.0f;
}

/* ---- CPU codec (src/ref/fp8_ref.c): the reference for the kernels and for the CPU trainer. ---- */

/* fp32 -> fp8 code, round to nearest even. saturate=1 clamps out-of-range values and +-Inf to
 * +-max (__NV_SATFINITE); saturate=0 gives Inf (e5m2) or NaN (e4m3, which has no Inf). NaN -> 0x7f.
 * Values below half the smallest subnormal become a signed zero. */
uint8_t qt_fp8_encode(qt_dtype dt, float x, int saturate);
/* fp8 code -> fp32 (exact). e4m3: 0x7f/0xff are NaN, max 448; e5m2: 0x7c/0xfc are +-Inf. */
float qt_fp8_decode(qt_dtype dt, uint8_t code);
/* The scale/descale a kernel derives from amax (see the top of this file), bit-exact with the GPU. */
void qt_fp8_scale_ref(qt_dtype dt, float amax, float *scale, float *descale);

/* ---- GPU launchers (cuda/quant.cu). xdt is QT_DT_BF16 or QT_DT_F32; ydt is QT_DT_E4M3 or
 * QT_DT_E5M2. Sizes are 64-bit; every launcher is asynchronous on stream s. ---- */

/* *amax = max |x[0..n)| (accumulate=0), or max(*amax, max |x|) (accumulate=1). Deterministic (max on
 * the bits of |x|); any NaN in x makes *amax NaN, else any Inf makes it Inf. n may be 0. */
void qt_quant_amax(qt_dtype xdt, const void *x, long n, float *amax, int accumulate, cudaStream_t s);
/* Zeroes n scale records (amax included) before producers fold into them. */
void qt_quant_scale_reset(qt_fp8_scale *sc, int n, cudaStream_t s);
/* sc->scale, sc->descale from sc->amax for fp8 dtype ydt. When amax is NaN/Inf both become NaN and,
 * if nonfinite != NULL, *nonfinite is set to tag unless it already holds a nonzero tag (first bad
 * tensor wins; tag != 0). */
void qt_quant_scale(qt_dtype ydt, qt_fp8_scale *sc, int *nonfinite, int tag, cudaStream_t s);

/* y[n] = sat(rne(x[n] * *scale)) in fp8 (=); scale is a device pointer (e.g. &sc->scale). */
void qt_quant_fp8(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, const float *scale,
                  cudaStream_t s);
/* Current scaling in one launch: like qt_quant_fp8 with scale derived from sc->amax (already reduced
 * by the producer earlier on s); also writes sc->scale, sc->descale and the nonfinite flag as
 * qt_quant_scale does. */
void qt_quant_fp8_cur(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, qt_fp8_scale *sc,
                      int *nonfinite, int tag, cudaStream_t s);

/* From x[rows, cols] (row-major) writes y[rows, cols] (skipped when y == NULL) and yT[cols, rows],
 * both fp8 = sat(rne(x * *scale)), in one pass through 64x64 shared-memory tiles (=). */
void qt_quant_fp8_transpose(qt_dtype ydt, void *y, void *yT, qt_dtype xdt, const void *x, long rows,
                            long cols, const float *scale, cudaStream_t s);
/* qt_quant_fp8_transpose with current scaling from sc->amax (see qt_quant_fp8_cur). */
void qt_quant_fp8_transpose_cur(qt_dtype ydt, void *y, void *yT, qt_dtype xdt, const void *x,
                                long rows, long cols, qt_fp8_scale *sc, int *nonfinite, int tag,
                                cudaStream_t s);

/* In one pass over gu[rows, 2 * cols] (bf16, gate | up halves): qt_swiglu_bwd (dgu[rows, 2 * cols] from
 * dh[rows, cols], dgu may be gu; its abs-max folded into *amax unless NULL) and yT[cols, rows], the SwiGLU
 * output (each element rounded to bf16 as qt_swiglu_fwd stores it) quantized with sc's current scale:
 * the bytes of those kernels and qt_quant_fp8_transpose_cur (=). The fp8 backward of a layer whose SwiGLU
 * is recomputed: its down projection's Xq^T made where gu is read anyway (its wgrad runs after). */
void qt_swiglu_bwd_quant_transpose_cur(void *dgu, const void *dh, const void *gu, long rows, long cols, float *amax,
                                       qt_dtype ydt, void *yT, qt_fp8_scale *sc, int *nonfinite, int tag, cudaStream_t s);
/* The same for GeGLU (Gemma): qt_geglu_bwd's dgu and qt_geglu_fwd's output quantized, the bytes of those kernels
 * and qt_quant_fp8_transpose_cur (=). */
void qt_geglu_bwd_quant_transpose_cur(void *dgu, const void *dh, const void *gu, long rows, long cols, float *amax,
                                      qt_dtype ydt, void *yT, qt_fp8_scale *sc, int *nonfinite, int tag, cudaStream_t s);

/* yT[cols, rows] = x[rows, cols] transposed, one byte per element (fp8 codes moved, not re-encoded: the
 * e4m3 weights a ZeRO-3 rank gathered become the dgrad's Wq^T) (=). Through 32 x 32 shared-memory tiles. */
void qt_transpose_u8(void *yT, const void *x, long rows, long cols, cudaStream_t s);

/* y[n] = fp8 x[n] * (descale ? *descale : 1) in ydt = QT_DT_BF16 or QT_DT_F32 (=), for tests and
 * debugging: exact for fp32 with descale NULL; one RNE rounding otherwise. */
void qt_quant_dequant(qt_dtype ydt, void *y, qt_dtype xdt, const void *x, long n, const float *descale,
                      cudaStream_t s);

#ifdef __cplusplus
}
#endif

/* ---- Device helpers for producer kernels that fuse the abs-max into their epilogue. ----
 * Usage in a kernel with blockDim.x a multiple of 32 (<= 1024), every thread calling it:
 *     unsigned m = 0;  for (each output v) m = qt_amax_fold(m, v);
 *     qt_amax_block_commit(amax, m);     // amax: a float* zeroed earlier on the stream
 * The max is taken on the bits of |v| as unsigned ints: order-free, hence deterministic, and a NaN
 * (bits above those of Inf) wins over everything, so NaNs reach amax instead of being dropped. */
#ifdef __CUDACC__
static __device__ __forceinline__ unsigned qt_amax_fold(unsigned m, float v) {
    unsigned b = __float_as_uint(v) & 0x7fffffffu;
    return b > m ? b : m;
}
/* Block-wide max of m (bits of |v|) through sh, blockDim.x/32 words of shared memory that the caller
 * may use for something else before and after; the result is valid in thread 0. Contains
 * __syncthreads (one first: earlier reads of sh finish before it is overwritten). */
static __device__ __forceinline__ unsigned qt_amax_block_reduce_sh(unsigned m, unsigned *sh) {
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarp ? sh[lane] : 0u;
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    return m;
}
/* Block reduce, then one atomicMax into *amax (valid because every candidate is >= +0). The _sh form
 * reuses the caller's shared memory (a kernel at the 48 KiB limit has no room for another array). */
static __device__ __forceinline__ void qt_amax_block_commit_sh(float *amax, unsigned m, unsigned *sh) {
    m = qt_amax_block_reduce_sh(m, sh);
    if (threadIdx.x == 0 && m) atomicMax((unsigned *)amax, m);
}
static __device__ __forceinline__ void qt_amax_block_commit(float *amax, unsigned m) {
    __shared__ unsigned qt_amax_sm_[32];
    qt_amax_block_commit_sh(amax, m, qt_amax_sm_);
}
#endif

#endif
