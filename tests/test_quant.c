/* test_quant.c — the CPU fp8 codec (runs everywhere) and the fp8 quantize kernels against it (GPU). */
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

/* ---------------- GPU ---------------- */

static int have_gpu(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define NEED_GPU()                                                                                  \
    do {                                                                                            \
        if (!have_gpu()) QT_SKIP("no CUDA device");                                                 \
    } while (0)
#define CU(call) QT_REQUIRE((call) == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

/* Host x (fp32 values, bf16-exact when xdt is bf16) -> a device buffer of xdt at element offset off. */
static void *to_dev(qt_dtype xdt, const float *x, long n, long off, void **base) {
    size_t es = (size_t)qt_dtype_size(xdt);
    char *h = malloc((size_t)(n + off + 1) * es);
    for (long i = 0; i < n; i++) {
        if (xdt == QT_DT_BF16) { uint16_t b = qt_f32_to_bf16(x[i]); memcpy(h + (i + off) * es, &b, 2); }
        else memcpy(h + (i + off) * es, &x[i], 4);
    }
    void *d = NULL;
    if (cudaMalloc(&d, (size_t)(n + off + 1) * es) != cudaSuccess) { free(h); return NULL; }
    cudaMemcpy(d, h, (size_t)(n + off + 1) * es, cudaMemcpyHostToDevice);
    free(h);
    *base = d;
    return (char *)d + off * es;
}

/* Rounds x to what the device sees (bf16) so the CPU reference uses the same inputs. */
static void round_to(qt_dtype xdt, float *x, long n) {
    if (xdt == QT_DT_BF16)
        for (long i = 0; i < n; i++) x[i] = qt_bf16_to_f32(qt_f32_to_bf16(x[i]));
}

/* Codes equal, with +0/-0 treated as equal and any NaN code accepted for a NaN reference. */
static long first_code_mismatch(qt_dtype dt, const uint8_t *got, const uint8_t *want, long n) {
    for (long i = 0; i < n; i++) {
        if (got[i] == want[i]) continue;
        if (!(got[i] & 0x7f) && !(want[i] & 0x7f)) continue;
        if (is_nan_code(dt, want[i]) && is_nan_code(dt, got[i])) continue;
        return i;
    }
    return -1;
}

static float *dev_scalar(float v) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, sizeof(float)) != cudaSuccess) return NULL;
    cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice);
    return d;
}

/* All 256 codes: dequantize (exact) then quantize with scale 1 gives back the code, except NaN (any
 * NaN) and e5m2 +-Inf, which saturate to +-max under SATFINITE. */
static void test_gpu_roundtrip_codes(void) {
    NEED_GPU();
    uint8_t codes[256], q[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    uint8_t *dc = NULL, *dq = NULL;
    float *dx = NULL, *one = dev_scalar(1.0f), hx[256];
    CU(cudaMalloc((void **)&dc, 256));
    CU(cudaMalloc((void **)&dq, 256));
    CU(cudaMalloc((void **)&dx, 256 * sizeof(float)));
    CU(cudaMemcpy(dc, codes, 256, cudaMemcpyHostToDevice));
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        CU(cudaMemset(dx, 0xff, 256 * sizeof(float)));
        qt_quant_dequant(QT_DT_F32, dx, dt, dc, 256, NULL, 0);
        CU(cudaMemcpy(hx, dx, sizeof hx, cudaMemcpyDeviceToHost));
        for (int c = 0; c < 256; c++) {
            float want = qt_fp8_decode(dt, (uint8_t)c);
            QT_REQUIRE(isnan(want) ? isnan(hx[c]) : f2u(hx[c]) == f2u(want), "%s dequant %02x: %g want %g",
                       qt_dtype_name(dt), c, hx[c], want);
        }
        for (int xb = 0; xb < 2; xb++) {
            qt_dtype xdt = xb ? QT_DT_BF16 : QT_DT_F32;
            void *base = NULL, *x = to_dev(xdt, hx, 256, 0, &base);
            QT_REQUIRE(x, "cudaMalloc");
            CU(cudaMemset(dq, 0x5a, 256));
            qt_quant_fp8(dt, dq, xdt, x, 256, one, 0);
            CU(cudaMemcpy(q, dq, 256, cudaMemcpyDeviceToHost));
            cudaFree(base);
            for (int c = 0; c < 256; c++) {
                float v = qt_fp8_decode(dt, (uint8_t)c);
                int want = isinf(v) ? (max_code(dt) | (c & 0x80)) : c;
                QT_REQUIRE(isnan(v) ? is_nan_code(dt, q[c]) : q[c] == want, "%s from %s: %02x -> %02x want %02x",
                           qt_dtype_name(dt), qt_dtype_name(xdt), c, q[c], want);
            }
        }
    }
    cudaFree(dc); cudaFree(dq); cudaFree(dx); cudaFree(one);
}

static void test_gpu_saturation(void) {
    NEED_GPU();
    const float big[] = {449.0f, 464.0f, 465.0f, 480.0f, 57344.0f, 61440.0f, 70000.0f, 1e6f, FLT_MAX, INFINITY};
    const int nb = (int)(sizeof big / sizeof big[0]);
    float hx[2 * 10];
    for (int i = 0; i < nb; i++) { hx[2 * i] = big[i]; hx[2 * i + 1] = -big[i]; }
    uint8_t q[20], *dq = NULL;
    float *one = dev_scalar(1.0f), *dx = NULL;
    CU(cudaMalloc((void **)&dq, 20));
    CU(cudaMalloc((void **)&dx, sizeof hx));
    CU(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        CU(cudaMemset(dq, 0x7f, 20));
        qt_quant_fp8(dt, dq, QT_DT_F32, dx, 2 * nb, one, 0);
        CU(cudaMemcpy(q, dq, 20, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 2 * nb; i++) {
            int want = qt_fp8_encode(dt, hx[i], 1);
            QT_EXPECT(q[i] == want, "%s: %g -> %02x want %02x", qt_dtype_name(dt), hx[i], q[i], want);
            if (fabsf(hx[i]) > qt_fp8_max(dt))
                QT_EXPECT(q[i] == (max_code(dt) | (i & 1 ? 0x80 : 0)), "%s: %g not clamped (%02x)",
                          qt_dtype_name(dt), hx[i], q[i]);
        }
    }
    cudaFree(dq); cudaFree(dx); cudaFree(one);
}

/* CPU abs-max on the bits of |x| (the documented, order-free rule). */
static float cpu_amax(const float *x, long n) {
    uint32_t m = 0;
    for (long i = 0; i < n; i++) { uint32_t b = f2u(x[i]) & 0x7fffffffu; if (b > m) m = b; }
    return u2f(m);
}

static void test_gpu_amax(void) {
    NEED_GPU();
    const long sizes[] = {1, 7, 8, 1000, 33 * 1000, (1L << 20) + 3};
    qt_rng r;
    qt_rng_seed(&r, 5);
    float *damax = NULL, got;
    CU(cudaMalloc((void **)&damax, sizeof(float)));
    for (int si = 0; si < 6; si++)
        for (int xb = 0; xb < 2; xb++)
            for (int off = 0; off < 2; off++)
                for (int special = 0; special < 3; special++) {
                    long n = sizes[si];
                    qt_dtype xdt = xb ? QT_DT_BF16 : QT_DT_F32;
                    float *hx = malloc((size_t)n * sizeof(float));
                    for (long i = 0; i < n; i++) hx[i] = rand_wide(&r, -20, 10);
                    long at = (long)qt_rng_below(&r, (uint64_t)n);
                    if (special == 1) hx[at] = INFINITY;
                    if (special == 2) hx[at] = -NAN;
                    round_to(xdt, hx, n);
                    void *base = NULL, *x = to_dev(xdt, hx, n, off, &base);
                    QT_REQUIRE(x, "cudaMalloc");
                    float poison = NAN;
                    CU(cudaMemcpy(damax, &poison, 4, cudaMemcpyHostToDevice));
                    qt_quant_amax(xdt, x, n, damax, 0, 0);
                    CU(cudaMemcpy(&got, damax, 4, cudaMemcpyDeviceToHost));
                    float want = cpu_amax(hx, n);
                    QT_EXPECT(special == 2 ? isnan(got) : f2u(got) == f2u(want),
                              "%s n=%ld off=%d special=%d: amax %a want %a", qt_dtype_name(xdt), n, off, special,
                              got, want);
                    /* accumulate keeps a larger previous value and raises a smaller one */
                    if (special == 0) {
                        float prev = want * 2;
                        CU(cudaMemcpy(damax, &prev, 4, cudaMemcpyHostToDevice));
                        qt_quant_amax(xdt, x, n, damax, 1, 0);
                        CU(cudaMemcpy(&got, damax, 4, cudaMemcpyDeviceToHost));
                        QT_EXPECT(got == prev, "accumulate lost the previous max: %g", got);
                        prev = want / 2;
                        CU(cudaMemcpy(damax, &prev, 4, cudaMemcpyHostToDevice));
                        qt_quant_amax(xdt, x, n, damax, 1, 0);
                        CU(cudaMemcpy(&got, damax, 4, cudaMemcpyDeviceToHost));
                        QT_EXPECT(f2u(got) == f2u(want), "accumulate: %a want %a", got, want);
                    }
                    cudaFree(base);
                    free(hx);
                    if (qt_t_failed) { cudaFree(damax); return; }
                }
    cudaFree(damax);
}

/* Random data, random scales: quantize (explicit scale) and current scaling (scale from amax)
 * against the CPU encoder, bit-exact. Element offsets 0/1 exercise vector and scalar paths. */
static void test_gpu_quant_random(void) {
    NEED_GPU();
    const long sizes[] = {1, 7, 7 * 13, 33 * 1000, 896L * 4864 + 5};
    qt_rng r;
    qt_rng_seed(&r, 9);
    qt_fp8_scale *sc = NULL, hs;
    int *flag = NULL, hflag;
    float *dscale = NULL;
    CU(cudaMalloc((void **)&sc, sizeof *sc));
    CU(cudaMalloc((void **)&flag, sizeof(int)));
    CU(cudaMalloc((void **)&dscale, sizeof(float)));
    for (int si = 0; si < 5; si++)
        for (int d = 0; d < 2; d++)
            for (int xb = 0; xb < 2; xb++) {
                long n = sizes[si], off = (si + d + xb) & 1;
                qt_dtype dt = FP8[d], xdt = xb ? QT_DT_BF16 : QT_DT_F32;
                float *hx = malloc((size_t)n * sizeof(float)), scale = ldexpf(1.0f + (float)qt_rng_uniform(&r),
                                                                                (int)qt_rng_below(&r, 21) - 10);
                for (long i = 0; i < n; i++) hx[i] = rand_wide(&r, -25, 12);
                /* exact fp8 ties after scaling by a power of two */
                float p2 = ldexpf(1.0f, (int)qt_rng_below(&r, 9) - 4);
                for (long i = 0; i < n; i += 3) {
                    int c = (int)qt_rng_below(&r, (uint64_t)max_code(dt));
                    hx[i] = (qt_fp8_decode(dt, (uint8_t)c) + qt_fp8_decode(dt, (uint8_t)(c + 1))) / 2 / p2;
                }
                round_to(xdt, hx, n);
                uint8_t *want = malloc((size_t)n), *got = malloc((size_t)n), *dy = NULL;
                void *base = NULL, *x = to_dev(xdt, hx, n, off, &base);
                QT_REQUIRE(x && cudaMalloc((void **)&dy, (size_t)n + 1) == cudaSuccess, "cudaMalloc");
                for (int mode = 0; mode < 3; mode++) { /* 0 random scale, 1 power-of-2 scale, 2 current */
                    float s = mode == 0 ? scale : p2, ds;
                    if (mode == 2) qt_fp8_scale_ref(dt, cpu_amax(hx, n), &s, &ds);
                    for (long i = 0; i < n; i++) want[i] = qt_fp8_encode(dt, hx[i] * s, 1);
                    CU(cudaMemset(dy, 0x7f, (size_t)n + 1));
                    if (mode < 2) {
                        CU(cudaMemcpy(dscale, &s, 4, cudaMemcpyHostToDevice));
                        qt_quant_fp8(dt, dy + off, xdt, x, n, dscale, 0);
                    } else {
                        CU(cudaMemset(sc, 0xff, sizeof *sc));
                        CU(cudaMemset(flag, 0, sizeof(int)));
                        qt_quant_amax(xdt, x, n, &sc->amax, 0, 0);
                        qt_quant_fp8_cur(dt, dy + off, xdt, x, n, sc, flag, 7, 0);
                        CU(cudaMemcpy(&hs, sc, sizeof hs, cudaMemcpyDeviceToHost));
                        CU(cudaMemcpy(&hflag, flag, sizeof hflag, cudaMemcpyDeviceToHost));
                        QT_EXPECT(f2u(hs.scale) == f2u(s) && f2u(hs.descale) == f2u(ds) && hflag == 0,
                                  "scale %a/%a want %a/%a, flag %d", hs.scale, hs.descale, s, ds, hflag);
                    }
                    CU(cudaMemcpy(got, dy + off, (size_t)n, cudaMemcpyDeviceToHost));
                    long bad = first_code_mismatch(dt, got, want, n);
                    QT_EXPECT(bad < 0, "%s<-%s n=%ld off=%ld mode=%d: [%ld] x=%a scale=%a got %02x want %02x",
                              qt_dtype_name(dt), qt_dtype_name(xdt), n, off, mode, bad, bad < 0 ? 0 : hx[bad], s,
                              bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
                }
                cudaFree(base); cudaFree(dy);
                free(hx); free(want); free(got);
                if (qt_t_failed) break;
            }
    cudaFree(sc); cudaFree(flag); cudaFree(dscale);
}

/* Quantize-transpose equals quantize + CPU transpose, for odd shapes and both layouts of dtype. */
static void test_gpu_quant_transpose(void) {
    NEED_GPU();
    const long shapes[][2] = {{1, 1}, {7, 13}, {896, 4864}, {4864, 896}, {33, 1000}, {64, 64}, {130, 72}, {16, 9}};
    qt_rng r;
    qt_rng_seed(&r, 13);
    float *dscale = NULL;
    qt_fp8_scale *sc = NULL, hs;
    int *flag = NULL;
    CU(cudaMalloc((void **)&dscale, sizeof(float)));
    CU(cudaMalloc((void **)&sc, sizeof *sc));
    CU(cudaMalloc((void **)&flag, sizeof(int)));
    for (int si = 0; si < 8; si++)
        for (int v = 0; v < 4; v++) { /* variant bits: 1 = bf16 input / e5m2 output, 2 = current scaling */
            long R = shapes[si][0], C = shapes[si][1], n = R * C;
            qt_dtype dt = FP8[v & 1], xdt = (v & 1) ? QT_DT_BF16 : QT_DT_F32;
            int cur = v >> 1, no_y = si == 5 && cur; /* one case without y */
            float *hx = malloc((size_t)n * sizeof(float)), s, ds;
            for (long i = 0; i < n; i++) hx[i] = qt_rng_normal(&r) * 3.0f;
            round_to(xdt, hx, n);
            if (cur) qt_fp8_scale_ref(dt, cpu_amax(hx, n), &s, &ds);
            else s = ldexpf(1.0f + (float)qt_rng_uniform(&r), (int)qt_rng_below(&r, 9) - 2);
            uint8_t *want = malloc((size_t)n), *wantT = malloc((size_t)n), *got = malloc((size_t)n);
            for (long i = 0; i < R; i++)
                for (long j = 0; j < C; j++) {
                    uint8_t q = qt_fp8_encode(dt, hx[i * C + j] * s, 1);
                    want[i * C + j] = q;
                    wantT[j * R + i] = q;
                }
            uint8_t *dy = NULL, *dyT = NULL;
            void *base = NULL, *x = to_dev(xdt, hx, n, 0, &base);
            QT_REQUIRE(x && cudaMalloc((void **)&dy, (size_t)n) == cudaSuccess &&
                           cudaMalloc((void **)&dyT, (size_t)n + 16) == cudaSuccess, "cudaMalloc");
            uint8_t *yT = dyT + (si == 6 ? 1 : 0); /* one misaligned yT */
            CU(cudaMemset(dy, 0x7f, (size_t)n));
            CU(cudaMemset(dyT, 0x7f, (size_t)n + 16));
            if (cur) {
                CU(cudaMemset(flag, 0, sizeof(int)));
                qt_quant_amax(xdt, x, n, &sc->amax, 0, 0);
                qt_quant_fp8_transpose_cur(dt, no_y ? NULL : dy, yT, xdt, x, R, C, sc, flag, 3, 0);
                CU(cudaMemcpy(&hs, sc, sizeof hs, cudaMemcpyDeviceToHost));
                QT_EXPECT(f2u(hs.scale) == f2u(s) && f2u(hs.descale) == f2u(ds), "scale %a want %a", hs.scale, s);
            } else {
                CU(cudaMemcpy(dscale, &s, 4, cudaMemcpyHostToDevice));
                qt_quant_fp8_transpose(dt, dy, yT, xdt, x, R, C, dscale, 0);
            }
            CU(cudaDeviceSynchronize());
            CU(cudaMemcpy(got, dy, (size_t)n, cudaMemcpyDeviceToHost));
            long bad = no_y ? -1 : first_code_mismatch(dt, got, want, n);
            QT_EXPECT(bad < 0, "%ldx%ld %s<-%s cur=%d y[%ld,%ld] got %02x want %02x", R, C, qt_dtype_name(dt),
                      qt_dtype_name(xdt), cur, bad / (C ? C : 1), bad % (C ? C : 1), bad < 0 ? 0 : got[bad],
                      bad < 0 ? 0 : want[bad]);
            if (no_y)
                for (long i = 0; i < n && !qt_t_failed; i++) QT_EXPECT(got[i] == 0x7f, "y written although NULL");
            CU(cudaMemcpy(got, yT, (size_t)n, cudaMemcpyDeviceToHost));
            bad = first_code_mismatch(dt, got, wantT, n);
            QT_EXPECT(bad < 0, "%ldx%ld %s<-%s cur=%d yT[%ld,%ld] got %02x want %02x", R, C, qt_dtype_name(dt),
                      qt_dtype_name(xdt), cur, bad / (R ? R : 1), bad % (R ? R : 1), bad < 0 ? 0 : got[bad],
                      bad < 0 ? 0 : wantT[bad]);
            cudaFree(base); cudaFree(dy); cudaFree(dyT);
            free(hx); free(want); free(wantT); free(got);
            if (qt_t_failed) break;
        }
    cudaFree(dscale); cudaFree(sc); cudaFree(flag);
}

/* A NaN in the tensor: amax NaN, scale/descale NaN, the flag names the first bad tensor's tag. */
static void test_gpu_nonfinite_flag(void) {
    NEED_GPU();
    float hx[300];
    for (int i = 0; i < 300; i++) hx[i] = (float)(i - 150) / 7;
    hx[123] = NAN;
    float *dx = NULL;
    uint8_t *dy = NULL, q[300];
    qt_fp8_scale *sc = NULL, hs[2];
    int *flag = NULL, hflag;
    CU(cudaMalloc((void **)&dx, sizeof hx));
    CU(cudaMalloc((void **)&dy, 300));
    CU(cudaMalloc((void **)&sc, 2 * sizeof *sc));
    CU(cudaMalloc((void **)&flag, sizeof(int)));
    CU(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CU(cudaMemset(flag, 0, sizeof(int)));
    qt_quant_scale_reset(sc, 2, 0);
    qt_quant_amax(QT_DT_F32, dx, 300, &sc[0].amax, 1, 0);
    qt_quant_fp8_cur(QT_DT_E4M3, dy, QT_DT_F32, dx, 300, &sc[0], flag, 41, 0);
    qt_quant_amax(QT_DT_F32, dx, 300, &sc[1].amax, 0, 0);
    qt_quant_scale(QT_DT_E5M2, &sc[1], flag, 42, 0);
    CU(cudaMemcpy(hs, sc, sizeof hs, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&hflag, flag, sizeof hflag, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(q, dy, 300, cudaMemcpyDeviceToHost));
    QT_EXPECT(isnan(hs[0].amax) && isnan(hs[0].scale) && isnan(hs[0].descale), "sc0 %g %g %g", hs[0].amax,
              hs[0].scale, hs[0].descale);
    QT_EXPECT(isnan(hs[1].scale) && isnan(hs[1].descale), "sc1 %g %g", hs[1].scale, hs[1].descale);
    QT_EXPECT(hflag == 41, "flag %d, want the first tag 41", hflag);
    QT_EXPECT(is_nan_code(QT_DT_E4M3, q[123]), "NaN input -> %02x", q[123]);
    /* A finite tensor through qt_quant_scale: finite scale, flag untouched. */
    hx[123] = 0;
    CU(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CU(cudaMemset(flag, 0, sizeof(int)));
    qt_quant_amax(QT_DT_F32, dx, 300, &sc[1].amax, 0, 0);
    qt_quant_scale(QT_DT_E5M2, &sc[1], flag, 42, 0);
    CU(cudaMemcpy(hs, sc, sizeof hs, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&hflag, flag, sizeof hflag, cudaMemcpyDeviceToHost));
    float s, ds;
    qt_fp8_scale_ref(QT_DT_E5M2, cpu_amax(hx, 300), &s, &ds);
    QT_EXPECT(hflag == 0 && f2u(hs[1].scale) == f2u(s) && f2u(hs[1].descale) == f2u(ds),
              "finite: flag %d scale %a want %a", hflag, hs[1].scale, s);
    cudaFree(dx); cudaFree(dy); cudaFree(sc); cudaFree(flag);
}

/* Dequantize with a descale, to fp32 and bf16, against the CPU decoder (one RNE rounding). */
static void test_gpu_dequant_scaled(void) {
    NEED_GPU();
    const long n = 10007;
    qt_rng r;
    qt_rng_seed(&r, 17);
    uint8_t *hq = malloc(n), *dq = NULL;
    float *hy = malloc(n * sizeof(float)), *dy = NULL, descale = 0.0123f, *dd = dev_scalar(descale);
    uint16_t *hb = malloc(n * 2);
    CU(cudaMalloc((void **)&dq, n));
    CU(cudaMalloc((void **)&dy, n * sizeof(float)));
    for (int d = 0; d < 2; d++) {
        qt_dtype dt = FP8[d];
        for (long i = 0; i < n; i++) {
            do hq[i] = (uint8_t)qt_rng_below(&r, 256);
            while (!isfinite(qt_fp8_decode(dt, hq[i])));
        }
        CU(cudaMemcpy(dq, hq, n, cudaMemcpyHostToDevice));
        CU(cudaMemset(dy, 0xff, n * sizeof(float)));
        qt_quant_dequant(QT_DT_F32, dy, dt, dq, n, dd, 0);
        CU(cudaMemcpy(hy, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (long i = 0; i < n; i++) {
            float want = qt_fp8_decode(dt, hq[i]) * descale;
            QT_REQUIRE(f2u(hy[i]) == f2u(want), "%s fp32 [%ld] %a want %a", qt_dtype_name(dt), i, hy[i], want);
        }
        CU(cudaMemset(dy, 0xff, n * 2));
        qt_quant_dequant(QT_DT_BF16, dy, dt, dq, n, dd, 0);
        CU(cudaMemcpy(hb, dy, n * 2, cudaMemcpyDeviceToHost));
        for (long i = 0; i < n; i++) {
            uint16_t want = qt_f32_to_bf16(qt_fp8_decode(dt, hq[i]) * descale);
            QT_REQUIRE(hb[i] == want, "%s bf16 [%ld] %04x want %04x", qt_dtype_name(dt), i, hb[i], want);
        }
    }
    cudaFree(dq); cudaFree(dy); cudaFree(dd);
    free(hq); free(hy); free(hb);
}

int main(void) {
    QT_RUN(test_fp8_decode_table);
    QT_RUN(test_fp8_encode_roundtrip);
    QT_RUN(test_fp8_encode_rne);
    QT_RUN(test_fp8_encode_vs_bruteforce);
    QT_RUN(test_fp8_scale_ref);
    QT_RUN(test_fp8_encode_vs_cuda_host);
    QT_RUN(test_gpu_roundtrip_codes);
    QT_RUN(test_gpu_saturation);
    QT_RUN(test_gpu_amax);
    QT_RUN(test_gpu_quant_random);
    QT_RUN(test_gpu_quant_transpose);
    QT_RUN(test_gpu_nonfinite_flag);
    QT_RUN(test_gpu_dequant_scaled);
    return qt_test_end();
}
