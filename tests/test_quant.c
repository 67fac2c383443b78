/* test_quant.c — the CPU fp8 codec (src/ref/fp8_ref.c): decode table, round trip, RNE ties, a brute-force
 * encoder, the scale rule, and agreement with cuda_fp8.h's host conversions. It is the reference the fp8
 * kernels (quantize, transpose, dequantize, abs-max, scales) are checked against in test_ops_gpu.c. */
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <float.h>
#include <stdint.h>

#include "qt_dtype.h"
#include "qt_quant.h"
#include "qt_rng.h"
#include "qt_test.h"

static const qt_dtype FP8[2] = {QT_DT_E4M3, QT_DT_E5M2};

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static int is_nan_code(qt_dtype dt, uint8_t c) { return isnan(qt_fp8_decode(dt, c)); }
/* The largest positive finite code. */
static int max_code(qt_dtype dt) { return dt == QT_DT_E4M3 ? 0x7e : 0x7b; }

/* A float with random sign, exponent in [emin, emax] and random mantissa. */
static float rand_wide(qt_rng *r, int emin, int emax) {
    int e = emin + (int)qt_rng_below(r, (uint64_t)(emax - emin + 1));
    float m = 1.0f + (float)qt_rng_uniform(r);
    float v = ldexpf(m, e);
    return qt_rng_below(r, 2) ? -v : v;
}

/* ---------------- CPU codec ---------------- */

static void test_fp8_decode_table(void) {
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x00) == 0 && !signbit(qt_fp8_decode(QT_DT_E4M3, 0x00)), "+0");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x80) == 0 && signbit(qt_fp8_decode(QT_DT_E4M3, 0x80)), "-0");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x01) == 0x1p-9f, "e4m3 min subnormal %g", qt_fp8_decode(QT_DT_E4M3, 1));
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x07) == 7 * 0x1p-9f, "e4m3 max subnormal");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x08) == 0x1p-6f, "e4m3 min normal");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x38) == 1.0f, "e4m3 1.0");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0x7e) == 448.0f, "e4m3 max %g", qt_fp8_decode(QT_DT_E4M3, 0x7e));
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0xfe) == -448.0f, "e4m3 -max");
    QT_EXPECT(qt_fp8_decode(QT_DT_E4M3, 0xc1) == -2.25f, "e4m3 0xc1 %g", qt_fp8_decode(QT_DT_E4M3, 0xc1));
    QT_EXPECT(qt_fp8_decode(QT_DT_E5M2, 0x01) == 0x1p-16f, "e5m2 min subnormal");
    QT_EXPECT(qt_fp8_decode(QT_DT_E5M2, 0x04) == 0x1p-14f, "e5m2 min normal");
    QT_EXPECT(qt_fp8_decode(QT_DT_E5M2, 0x3c) == 1.0f, "e5m2 1.0");
    QT_EXPECT(qt_fp8_decode(QT_DT_E5M2, 0x7b) == 57344.0f, "e5m2 max");
    QT_EXPECT(isinf(qt_fp8_decode(QT_DT_E5M2, 0x7c)) && qt_fp8_decode(QT_DT_E5M2, 0x7c) > 0, "e5m2 +inf");
    QT_EXPECT(isinf(qt_fp8_decode(QT_DT_E5M2, 0xfc)) && qt_fp8_decode(QT_DT_E5M2, 0xfc) < 0, "e5m2 -inf");
    QT_EXPECT(qt_fp8_max(QT_DT_E4M3) == 448.0f && qt_fp8_max(QT_DT_E5M2) == 57344.0f, "fp8_max");
    for (int d = 0; d < 2; d++) {
        int nans = 0;
        for (int c = 0; c < 256; c++) nans += is_nan_code(FP8[d], (uint8_t)c);
        QT_EXPECT(nans == (d ? 6 : 2), "%s has %d NaN codes", qt_dtype_name(FP8[d]), nans);
        /* Positive codes decode in increasing order; negative codes mirror them. */
        for (int c = 1; c < 128; c++) {
            float a = qt_fp8_decode(FP8[d], (uint8_t)(c - 1)), b = qt_fp8_decode(FP8[d], (uint8_t)c);
            if (isnan(b)) break;
            QT_EXPECT(b > a, "%s: code %02x (%g) not above %02x (%g)", qt_dtype_name(FP8[d]), c, b, c - 1, a);
            QT_EXPECT(qt_fp8_decode(FP8[d], (uint8_t)(c | 0x80)) == -b, "%s: code %02x not -%02x",
                      qt_dtype_name(FP8[d]), c | 0x80, c);
        }
    }
}

static void test_fp8_encode_roundtrip(void) {
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 256; c++) {
            qt_dtype dt = FP8[d];
            float v = qt_fp8_decode(dt, (uint8_t)c);
            if (isnan(v)) {
                QT_EXPECT(is_nan_code(dt, qt_fp8_encode(dt, v, 1)), "%s NaN lost", qt_dtype_name(dt));
                continue;
            }
            QT_EXPECT(qt_fp8_encode(dt, v, 0) == c, "%s: %02x -> %g -> %02x", qt_dtype_name(dt), c, v,
                      qt_fp8_encode(dt, v, 0));
            int sat = isinf(v) ? (max_code(dt) | (c & 0x80)) : c;
            QT_EXPECT(qt_fp8_encode(dt, v, 1) == sat, "%s sat: %02x -> %02x", qt_dtype_name(dt), c,
                      qt_fp8_encode(dt, v, 1));
        }
}

/* Midpoints between neighbouring codes go to the even code; one fp32 ulp either side decides. */
static void test_fp8_encode_rne(void) {
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        for (int c = 0; c < max_code(dt); c++)
            for (int neg = 0; neg < 2; neg++) {
                float a = qt_fp8_decode(dt, (uint8_t)c), b = qt_fp8_decode(dt, (uint8_t)(c + 1));
                float mid = (a + b) / 2, sg = neg ? -1.0f : 1.0f;
                int s = neg ? 0x80 : 0, even = (c & 1) ? c + 1 : c;
                QT_EXPECT(qt_fp8_encode(dt, sg * mid, 1) == (even | s), "%s tie %g -> %02x want %02x",
                          qt_dtype_name(dt), sg * mid, qt_fp8_encode(dt, sg * mid, 1), even | s);
                QT_EXPECT(qt_fp8_encode(dt, sg * nextafterf(mid, 0), 1) == (c | s), "%s below tie %g",
                          qt_dtype_name(dt), mid);
                QT_EXPECT(qt_fp8_encode(dt, sg * nextafterf(mid, INFINITY), 1) == ((c + 1) | s),
                          "%s above tie %g", qt_dtype_name(dt), mid);
            }
        /* Overflow: just past max + half an ulp is Inf (e5m2) / NaN (e4m3) without saturation. */
        float over = dt == QT_DT_E4M3 ? 464.0f : 61440.0f;
        int ov = dt == QT_DT_E4M3 ? 0x7f : 0x7c;
        QT_EXPECT(qt_fp8_encode(dt, nextafterf(over, 0), 0) == max_code(dt), "%s below overflow", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, nextafterf(over, INFINITY), 0) == ov, "%s overflow", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, -INFINITY, 0) == (ov | 0x80) || (dt == QT_DT_E4M3 && is_nan_code(dt, qt_fp8_encode(dt, -INFINITY, 0))),
                  "%s -inf", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, 1e30f, 1) == max_code(dt), "%s saturate", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, -INFINITY, 1) == (max_code(dt) | 0x80), "%s saturate -inf", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, -1e-30f, 1) == 0x80, "%s tiny negative -> -0", qt_dtype_name(dt));
        QT_EXPECT(qt_fp8_encode(dt, NAN, 1) == 0x7f, "%s NaN -> %02x", qt_dtype_name(dt), qt_fp8_encode(dt, NAN, 1));
    }
}

/* The nearest finite code by exhaustive search (ties: even code), independent of the encoder. */
static int brute_encode(qt_dtype dt, float x, int saturate) {
    double a = fabs((double)x);
    int s = signbit(x) ? 0x80 : 0, best = 0;
    if (!saturate && a >= (dt == QT_DT_E4M3 ? 464.0 : 61440.0) && !(dt == QT_DT_E4M3 && a == 464.0))
        return s | (dt == QT_DT_E4M3 ? 0x7f : 0x7c);
    double bd = INFINITY;
    for (int c = 0; c <= max_code(dt); c++) {
        double dd = fabs(a - qt_fp8_decode(dt, (uint8_t)c));
        if (dd < bd || (dd == bd && !(c & 1))) { bd = dd; best = c; }
    }
    return s | best;
}

static void test_fp8_encode_vs_bruteforce(void) {
    qt_rng r;
    qt_rng_seed(&r, 11);
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        int e0 = dt == QT_DT_E4M3 ? -14 : -22, e1 = dt == QT_DT_E4M3 ? 10 : 17;
        for (int i = 0; i < 40000; i++) {
            float x = rand_wide(&r, e0, e1);
            if (i % 7 == 0) x = u2f(f2u(x) & 0xffff0000u); /* bf16-valued inputs too */
            for (int sat = 0; sat < 2; sat++) {
                int got = qt_fp8_encode(dt, x, sat), want = brute_encode(dt, x, sat);
                QT_REQUIRE(got == want, "%s sat=%d x=%a: %02x want %02x", qt_dtype_name(dt), sat, x, got, want);
            }
        }
    }
}

static void test_fp8_scale_ref(void) {
    float s, ds;
    qt_fp8_scale_ref(QT_DT_E4M3, 0.0f, &s, &ds);
    QT_EXPECT(s == 1.0f && ds == 1.0f, "amax 0: %g %g", s, ds);
    qt_fp8_scale_ref(QT_DT_E4M3, 448.0f, &s, &ds);
    QT_EXPECT(s == 1.0f && ds == 1.0f, "amax 448: %g %g", s, ds);
    qt_fp8_scale_ref(QT_DT_E5M2, 2.0f, &s, &ds);
    QT_EXPECT(s == 28672.0f && ds == 1.0f / 28672.0f, "e5m2 amax 2: %g %g", s, ds);
    qt_fp8_scale_ref(QT_DT_E4M3, 1e-45f, &s, &ds);
    QT_EXPECT(s == FLT_MAX && ds > 0 && isfinite(ds), "amax denormal: %g %g", s, ds);
    qt_fp8_scale_ref(QT_DT_E4M3, NAN, &s, &ds);
    QT_EXPECT(isnan(s) && isnan(ds), "amax NaN: %g %g", s, ds);
    qt_fp8_scale_ref(QT_DT_E4M3, INFINITY, &s, &ds);
    QT_EXPECT(isnan(s) && isnan(ds), "amax Inf: %g %g", s, ds);
    /* amax itself lands on the format's max (or just below it after the fp32 rounding of scale). */
    qt_rng r;
    qt_rng_seed(&r, 3);
    for (int i = 0; i < 10000; i++) {
        float amax = fabsf(rand_wide(&r, -30, 30));
        qt_fp8_scale_ref(QT_DT_E4M3, amax, &s, &ds);
        QT_REQUIRE(qt_fp8_encode(QT_DT_E4M3, amax * s, 1) == 0x7e, "amax %a scale %a -> %02x", amax, s,
                   qt_fp8_encode(QT_DT_E4M3, amax * s, 1));
    }
}

/* cuda_fp8.h's host conversions are the software path the kernels take on sm_80 (and match the
 * sm_89+ cvt.rn.satfinite instructions): the CPU codec must agree with them on every bf16 bit pattern
 * (exhaustive) and on a stride through all fp32 bit patterns, NaN codes included. */
static void test_fp8_encode_vs_cuda_host(void) {
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        __nv_fp8_interpretation_t it = d ? __NV_E5M2 : __NV_E4M3;
        for (int c = 0; c < 256; c++) {
            float nv = qt_f16_to_f32(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, it).x);
            float ours = qt_fp8_decode(dt, (uint8_t)c);
            QT_REQUIRE(isnan(ours) ? isnan(nv) : f2u(nv) == f2u(ours), "%s decode %02x: %g want %g",
                       qt_dtype_name(dt), c, ours, nv);
        }
        for (uint64_t k = 0; k < 65536 + 65536; k++) {
            uint32_t u = k < 65536 ? (uint32_t)k << 16 : (uint32_t)((k - 65536) * 65521u + 12345u);
            float x = u2f(u);
            for (int sat = 0; sat < 2; sat++) {
                unsigned nv = __nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, it);
                unsigned ours = qt_fp8_encode(dt, x, sat);
                QT_REQUIRE(nv == ours, "%s sat=%d x=%a (bits %08x): %02x, cuda_fp8.h %02x", qt_dtype_name(dt), sat,
                           x, u, ours, nv);
            }
        }
    }
}

int main(void) {
    QT_RUN(test_fp8_decode_table);
    QT_RUN(test_fp8_encode_roundtrip);
    QT_RUN(test_fp8_encode_rne);
    QT_RUN(test_fp8_encode_vs_bruteforce);
    QT_RUN(test_fp8_scale_ref);
    QT_RUN(test_fp8_encode_vs_cuda_host);
    return qt_test_end();
}
