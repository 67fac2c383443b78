/* qt_nf4.h — 4-bit NormalFloat (QLoRA's NF4) in bitsandbytes' layout: the CPU reference (src/ref/nf4_ref.c)
 * and the GPU kernels (cuda/nf4.cu), bit for bit the same.
 *
 * A tensor of n values (a [rows, cols] matrix flattened row-major: blocks run across row ends) is held as
 *   codes   uint8 [(n + 1) / 2]   two 4-bit codes per byte: value 2k in the high nibble, value 2k+1 in the
 *                                 low one; for odd n the last low nibble is the code of 0.0 (padding)
 *   absmax  fp32  [nb]            nb = ceil(n / 64): max |x| of each block of 64 values (the last block
 *                                 may be short)
 * and, double-quantized (bitsandbytes' quantize_4bit(..., compress_statistics=True)), absmax replaced by
 *   offset  fp32                  the mean of absmax[]
 *   qabsmax uint8 [nb]            8-bit codes of absmax[b] - offset in the dynamic map (qt_nf4_tables.h),
 *                                 in blocks of 256 scales
 *   absmax2 fp32  [nb2]           nb2 = ceil(nb / 256): max |absmax[b] - offset| of each block of 256
 *
 * Arithmetic (bitsandbytes' CUDA kernels kQuantizeBlockwise / kDequantizeBlockwise; every step one fp32
 * IEEE operation, never contracted to an FMA):
 *   quantize    inv = 1 / absmax[b];  s = x * inv;  code = #thresholds below s (NF4), or the dynamic map's
 *               binary search with fp32 midpoints (8-bit, dQuantize<0>).
 *               A block of zeros has absmax 0 and s = 0 * inf = NaN: code 0 (as on the GPU).
 *   mean        sum in fp64 in a fixed order (256 strided partial sums, then a tree), / nb, rounded to fp32:
 *               the correctly rounded mean in practice; torch's mean (bitsandbytes' offset) sums in fp32
 *               in an order of its own (not the same in its CPU and CUDA builds): a few ulps away at times.
 *   dequantize  a = dyn[qabsmax[b]] * absmax2[b / 256] + offset  (a product, then a sum: two roundings);
 *               y = nf4[code] * a, rounded once to the output dtype (bf16: RNE).
 * Where bitsandbytes' CPU backend differs from its CUDA kernels (tests/test_nf4_bnb.py shows each): it
 * codes a block of zeros as 0x77 (0.0), divides (not multiplies by the reciprocal) in the last short block,
 * and picks 8-bit codes through a 65536-entry table (not always the nearest code). Dequantization is the
 * same in both. */
#ifndef QT_NF4_H
#define QT_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "qt_cuda_types.h"
#include "qt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QT_NF4_BLOCK 64   /* values per absmax */
#define QT_NF4_BLOCK2 256 /* absmax values per second-level scale (double quantization) */

static inline long qt_nf4_code_bytes(long n) { return (n + 1) / 2; }
static inline long qt_nf4_blocks(long n) { return (n + QT_NF4_BLOCK - 1) / QT_NF4_BLOCK; }
static inline long qt_nf4_blocks2(long n) { return (qt_nf4_blocks(n) + QT_NF4_BLOCK2 - 1) / QT_NF4_BLOCK2; }

/* ---- CPU reference (src/ref/nf4_ref.c) ---- */

/* The NF4 value of code c (0..15) and the dynamic map's value of code c (0..255). */
float qt_nf4_value(int c);
float qt_nf4_dyn_value(int c);
/* The NF4 code of a scaled value s (bitsandbytes' dQuantizeNF4; NaN gives 0). */
int qt_nf4_encode(float s);
/* The dynamic map's code of a scaled value s (bitsandbytes' dQuantize<0>; NaN gives 0). */
int qt_nf4_dyn_encode(float s);

/* Quantizes x[n] (xdt QT_DT_BF16 or QT_DT_F32) into codes[(n + 1) / 2] and absmax[nb]. Returns 0, or -1
 * with a message in err naming `what` (the tensor) and the problem: n < 1, another dtype, a value that is
 * not finite (its index). */
int qt_nf4_quantize_ref(qt_dtype xdt, const void *x, long n, uint8_t *codes, float *absmax, const char *what,
                        char *err, size_t errlen);
/* Double quantization of absmax[nb]: writes *offset, qabsmax[nb] and absmax2[ceil(nb / 256)]. nb >= 1. */
void qt_nf4_double_quant_ref(const float *absmax, long nb, uint8_t *qabsmax, float *absmax2, float *offset);
/* absmax[nb] from the double-quantized state (the first step of the dequantization). */
void qt_nf4_absmax_ref(float *absmax, const uint8_t *qabsmax, const float *absmax2, float offset, long nb);
/* y[n] (ydt QT_DT_BF16 or QT_DT_F32) = the values of codes with the block scales absmax[nb]. */
void qt_nf4_dequant_ref(qt_dtype ydt, void *y, const uint8_t *codes, const float *absmax, long n);
/* w[n] (fp32) replaced by what QLoRA computes with: its bf16 rounding quantized on its own (codes, block scales
 * double-quantized), then dequantized to fp32. Returns 0, or -1 (err, naming `what`) as qt_nf4_quantize_ref. */
int qt_nf4_roundtrip_ref(float *w, long n, const char *what, char *err, size_t errlen);

/* ---- GPU (cuda/nf4.cu): all pointers are device pointers, work is queued on s ---- */

/* Quantizes x[rows * cols] (xdt bf16 or fp32, finite) into codes and absmax[nb] (fp32, the first-level
 * scales). With qabsmax set, also double-quantizes them into qabsmax[nb], absmax2[nb2] and offset[1]
 * (absmax then holds the scales the double quantization started from). Used once, at load. */
void qt_nf4_quantize(qt_dtype xdt, const void *x, long rows, long cols, uint8_t *codes, float *absmax,
                     uint8_t *qabsmax, float *absmax2, float *offset, cudaStream_t s);
/* y[rows, cols] (ydt bf16 or fp32) = the dequantized matrix. Scales: qabsmax[nb], absmax2[nb2] and
 * offset[1] (double-quantized) when qabsmax is set, else absmax[nb] (fp32). Writes (=) every element of y.
 * One pass, memory-bound: vector loads and stores when codes are 4-byte and y 16-byte aligned. */
void qt_nf4_dequant(qt_dtype ydt, void *y, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                    const float *absmax2, const float *offset, long rows, long cols, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
