/* nf4_ref.c — CPU NF4 codec in bitsandbytes' layout (include/qt_nf4.h): blockwise quantization, double
 * quantization of the block scales, dequantization. The reference for cuda/nf4.cu and for a CPU base
 * placement. Every fp32 step is one IEEE operation (ISO C: no FMA contraction), as in the kernels. */
#include <math.h>
#include <stdlib.h>

#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_nf4.h"
#include "qt_nf4_tables.h"

static const float NF4[16] = QT_NF4_CODEBOOK_INIT;
static const float NF4_T[15] = QT_NF4_THRESHOLDS_INIT;
static const float DYN[256] = QT_NF4_DYNAMIC_MAP_INIT;

float qt_nf4_value(int c) { return NF4[c & 15]; }
float qt_nf4_dyn_value(int c) { return DYN[c & 255]; }

int qt_nf4_encode(float s) { return qt_nf4_search(NF4_T, s); }
int qt_nf4_dyn_encode(float x) { return qt_nf4_dyn_search(DYN, x); }

static float load(qt_dtype dt, const void *x, long i) {
    return dt == QT_DT_BF16 ? qt_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

int qt_nf4_quantize_ref(qt_dtype xdt, const void *x, long n, uint8_t *codes, float *absmax, const char *what,
                        char *err, size_t errlen) {
    if (n < 1) return qt_errf(err, errlen, "%s: NF4 needs at least one value, got n = %ld", what, n);
    if (xdt != QT_DT_BF16 && xdt != QT_DT_F32)
        return qt_errf(err, errlen, "%s: NF4 quantizes bf16 or fp32, got %s", what,
                       (unsigned)xdt <= QT_DT_F16 ? qt_dtype_name(xdt) : "an unknown dtype");
    for (long i = 0; i < n; i++)
        if (!isfinite(load(xdt, x, i)))
            return qt_errf(err, errlen, "%s: value %ld is %g: NF4 quantizes finite values only", what, i,
                           (double)load(xdt, x, i));
    for (long b = 0; b * QT_NF4_BLOCK < n; b++) {
        long i0 = b * QT_NF4_BLOCK, i1 = i0 + QT_NF4_BLOCK < n ? i0 + QT_NF4_BLOCK : n;
        float m = 0.0f;
        for (long i = i0; i < i1; i++) m = fmaxf(m, fabsf(load(xdt, x, i)));
        absmax[b] = m;
        float inv = 1.0f / m;
        for (long i = i0; i < i1 + (i1 & 1); i += 2) { /* odd n: the last low nibble codes 0.0 */
            int hi = qt_nf4_encode(load(xdt, x, i) * inv);
            int lo = qt_nf4_encode((i + 1 < n ? load(xdt, x, i + 1) : 0.0f) * inv);
#ifdef QT_MUTANTS
            if (qt_mutant_on(QT_MUT_NF4_NIBBLE_SWAP)) hi ^= lo, lo ^= hi, hi ^= lo;
#endif
            codes[i / 2] = (uint8_t)(hi << 4 | lo);
        }
    }
    return 0;
}

/* The mean of a[n] in the order cuda/nf4.cu's one-CTA kernel sums: 256 strided partial sums in fp64, then a
 * tree (s = 128, 64, ..., 1: p[j] += p[j + s]); one division, one rounding to fp32. */
static float mean_fixed_order(const float *a, long n) {
    double p[QT_NF4_BLOCK2];
    for (int j = 0; j < QT_NF4_BLOCK2; j++) {
        p[j] = 0.0;
        for (long i = j; i < n; i += QT_NF4_BLOCK2) p[j] += (double)a[i];
    }
    for (int s = QT_NF4_BLOCK2 / 2; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) p[j] += p[j + s];
    return (float)(p[0] / (double)n);
}

void qt_nf4_double_quant_ref(const float *absmax, long nb, uint8_t *qabsmax, float *absmax2, float *offset) {
    float off = mean_fixed_order(absmax, nb);
    *offset = off;
    for (long b = 0; b * QT_NF4_BLOCK2 < nb; b++) {
        long i0 = b * QT_NF4_BLOCK2, i1 = i0 + QT_NF4_BLOCK2 < nb ? i0 + QT_NF4_BLOCK2 : nb;
        float m = 0.0f;
        for (long i = i0; i < i1; i++) m = fmaxf(m, fabsf(absmax[i] - off));
        absmax2[b] = m;
        float inv = 1.0f / m;
        for (long i = i0; i < i1; i++) qabsmax[i] = (uint8_t)qt_nf4_dyn_encode((absmax[i] - off) * inv);
    }
}

void qt_nf4_absmax_ref(float *absmax, const uint8_t *qabsmax, const float *absmax2, float offset, long nb) {
#ifdef QT_MUTANTS
    if (qt_mutant_on(QT_MUT_NF4_NO_OFFSET)) offset = 0.0f;
#endif
    for (long b = 0; b < nb; b++) {
        float a = DYN[qabsmax[b]] * absmax2[b / QT_NF4_BLOCK2];
        absmax[b] = a + offset;
    }
}

int qt_nf4_roundtrip_ref(float *w, long n, const char *what, char *err, size_t errlen) {
    long nb = n > 0 ? qt_nf4_blocks(n) : 1, nb2 = n > 0 ? qt_nf4_blocks2(n) : 1;
    uint16_t *x = malloc((n > 0 ? (size_t)n : 1) * sizeof *x);
    uint8_t *codes = malloc((size_t)qt_nf4_code_bytes(n > 0 ? n : 1)), *qabs = malloc((size_t)nb);
    float *absmax = malloc((size_t)nb * sizeof *absmax), *absmax2 = malloc((size_t)nb2 * sizeof *absmax2), offset;
    QT_CHECK(x && codes && qabs && absmax && absmax2, "out of host memory for the NF4 state of %s", what);
    for (long i = 0; i < n; i++) x[i] = qt_f32_to_bf16(w[i]);
    int rc = qt_nf4_quantize_ref(QT_DT_BF16, x, n, codes, absmax, what, err, errlen);
    if (!rc) {
        qt_nf4_double_quant_ref(absmax, nb, qabs, absmax2, &offset);
        qt_nf4_absmax_ref(absmax, qabs, absmax2, offset, nb);
        qt_nf4_dequant_ref(QT_DT_F32, w, codes, absmax, n);
    }
    free(x), free(codes), free(qabs), free(absmax), free(absmax2);
    return rc;
}

void qt_nf4_dequant_ref(qt_dtype ydt, void *y, const uint8_t *codes, const float *absmax, long n) {
    for (long i = 0; i < n; i++) {
        int c = i & 1 ? codes[i / 2] & 15 : codes[i / 2] >> 4;
        float v = NF4[c] * absmax[i / QT_NF4_BLOCK];
        if (ydt == QT_DT_BF16) ((uint16_t *)y)[i] = qt_f32_to_bf16(v);
        else ((float *)y)[i] = v;
    }
}
