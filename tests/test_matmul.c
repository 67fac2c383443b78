/* test_matmul.c — cuBLASLt GEMMs (cuda/matmul.c) against the CPU reference on bf16/fp8-rounded inputs.
 *
 * bf16: fwd (bias, bf16/fp32 out, accumulate), dgrad, wgrad (+= into fp32, fused bias gradient) vs
 * qt_ref_matmul_fwd/bwd at odd shapes; fp8 TN e4m3 x e4m3 / e4m3 x e5m2 (scales, bias, fast accum)
 * vs an fp64 dot product of the decoded fp8 values; the plan cache. Skips without a CUDA device. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_dtype.h"
#include "qt_matmul.h"
#include "qt_ref.h"
#include "qt_rng.h"
#include "qt_test.h"

static int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return n;
}

/* n floats ~ N(0, sd), rounded to bf16; *dev gets the bf16 copy. Caller frees both. */
static float *rand_bf16(qt_rng *r, long n, float sd, void **dev) {
    float *f = malloc((size_t)n * sizeof *f);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    for (long i = 0; i < n; i++) {
        h[i] = qt_f32_to_bf16(qt_rng_normal(r) * sd);
        f[i] = qt_bf16_to_f32(h[i]);
    }
    cudaMalloc(dev, (size_t)n * 2);
    cudaMemcpy(*dev, h, (size_t)n * 2, cudaMemcpyHostToDevice);
    free(h);
    return f;
}

/* A device output of n elements of dtype t, poisoned with NaN (0xff bytes are NaN in bf16 and fp32). */
static void *poisoned(long n, qt_dtype t) {
    void *d = NULL;
    cudaMalloc(&d, (size_t)n * qt_dtype_size(t));
    cudaMemset(d, 0xff, (size_t)n * qt_dtype_size(t));
    return d;
}

/* Device values of dtype t (bf16 or fp32) as floats. Caller frees. */
static float *download(const void *d, long n, qt_dtype t) {
    float *f = malloc((size_t)n * sizeof *f);
    if (t == QT_DT_F32) {
        cudaMemcpy(f, d, (size_t)n * 4, cudaMemcpyDeviceToHost);
    } else {
        uint16_t *h = malloc((size_t)n * 2);
        cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost);
        for (long i = 0; i < n; i++) f[i] = qt_bf16_to_f32(h[i]);
        free(h);
    }
    return f;
}

static void upload_as(void *d, const float *f, long n, qt_dtype t) {
    if (t == QT_DT_F32) { cudaMemcpy(d, f, (size_t)n * 4, cudaMemcpyHostToDevice); return; }
    uint16_t *h = malloc((size_t)n * 2);
    for (long i = 0; i < n; i++) h[i] = qt_f32_to_bf16(f[i]);
    cudaMemcpy(d, h, (size_t)n * 2, cudaMemcpyHostToDevice);
    free(h);
}

static double max_rel(const float *got, const float *ref, long n) {
    double m = 0, mx = 1e-30;
    for (long i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)got[i] - ref[i]) / mx);
    return m;
}

/* Tolerances: bf16 output rounds once (2^-9 relative); fp32 output differs only in summation order. */
static double tol_of(qt_dtype t) { return t == QT_DT_BF16 ? 1e-2 : 2e-5; }

typedef struct { long N; int I, O; } shape;
static const shape SHAPES[] = {{1, 24, 40}, {7, 896, 1152}, {33, 24, 1152}, {33, 896, 40}, {7, 24, 40}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

/* One forward at one shape: out dtype t, with/without bias, overwrite or accumulate. */
static int check_fwd(qt_matmul_ctx *c, qt_rng *r, shape s, qt_dtype t, int with_bias, int acc) {
    long ny = s.N * s.O;
    void *dx, *dw, *db = NULL;
    float *x = rand_bf16(r, s.N * s.I, 1.0f, &dx), *w = rand_bf16(r, (long)s.O * s.I, 1.0f / sqrtf(s.I), &dw);
    float *b = NULL;
    if (with_bias) {
        b = malloc((size_t)s.O * sizeof *b);
        for (int o = 0; o < s.O; o++) b[o] = qt_bf16_to_f32(qt_f32_to_bf16(qt_rng_normal(r)));
        cudaMalloc(&db, (size_t)s.O * qt_dtype_size(t));
        upload_as(db, b, s.O, t);
    }
    float *ref = malloc((size_t)ny * sizeof *ref), *y0 = calloc((size_t)ny, sizeof *y0);
    void *dy = poisoned(ny, t);
    if (acc) { /* a starting value representable in t, so the reference adds the same thing */
        for (long i = 0; i < ny; i++) y0[i] = t == QT_DT_BF16 ? qt_bf16_to_f32(qt_f32_to_bf16(qt_rng_normal(r))) : qt_rng_normal(r);
        upload_as(dy, y0, ny, t);
    }
    qt_ref_matmul_fwd(ref, x, w, b, s.N, s.I, s.O);
    for (long i = 0; i < ny; i++) ref[i] += y0[i];
    qt_matmul_fwd(c, dy, t, dx, dw, db, s.N, s.I, s.O, acc, 0);
    cudaError_t e = cudaDeviceSynchronize();
    float *got = download(dy, ny, t);
    char what[128];
    snprintf(what, sizeof what, "fwd N=%ld I=%d O=%d %s bias=%d acc=%d", s.N, s.I, s.O, qt_dtype_name(t), with_bias, acc);
    int ok = e == cudaSuccess && qt_t_close(what, got, ref, ny, tol_of(t), tol_of(t));
    printf("  %s: max rel err %.3g\n", what, max_rel(got, ref, ny));
    free(x), free(w), free(b), free(ref), free(y0), free(got);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dy);
    return ok;
}

static void test_matmul_fwd(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_matmul_ctx *c = qt_matmul_create(0);
    qt_rng r;
    qt_rng_seed(&r, 11);
    for (int i = 0; i < NSHAPES; i++) {
        QT_EXPECT(check_fwd(c, &r, SHAPES[i], QT_DT_BF16, 1, 0), "fwd bf16+bias shape %d", i);
        QT_EXPECT(check_fwd(c, &r, SHAPES[i], QT_DT_F32, 0, 0), "fwd fp32 shape %d", i);
        QT_EXPECT(check_fwd(c, &r, SHAPES[i], QT_DT_F32, 1, 1), "fwd fp32+bias accumulate shape %d", i);
        QT_EXPECT(check_fwd(c, &r, SHAPES[i], QT_DT_BF16, 0, 1), "fwd bf16 accumulate shape %d", i);
    }
    qt_matmul_set_autotune(c, 0); /* heuristic #0 must be just as right */
    QT_EXPECT(check_fwd(c, &r, (shape){5, 896, 1152}, QT_DT_BF16, 1, 0), "fwd with autotune off");
    qt_matmul_free(c);
}

/* dgrad (=, bf16 or fp32 out) and wgrad (+= into fp32, fused dbias when offered) at one shape. */
static int check_bwd(qt_matmul_ctx *c, qt_rng *r, shape s, qt_dtype dxt) {
    long nx = s.N * s.I, nw = (long)s.O * s.I;
    void *ddy, *dx_in, *dw_in;
    float *dy = rand_bf16(r, s.N * s.O, 1.0f, &ddy), *x = rand_bf16(r, nx, 1.0f, &dx_in),
          *w = rand_bf16(r, nw, 1.0f / sqrtf(s.O), &dw_in);
    float *rdx = malloc((size_t)nx * 4), *rdw = malloc((size_t)nw * 4), *rdb = calloc((size_t)s.O, 4);
    for (long i = 0; i < nw; i++) rdw[i] = qt_rng_normal(r); /* the accumulated gradient so far */
    void *gdx = poisoned(nx, dxt), *gdw = poisoned(nw, QT_DT_F32), *gdb = poisoned(s.O, QT_DT_F32);
    upload_as(gdw, rdw, nw, QT_DT_F32);
    qt_ref_matmul_bwd(rdx, rdw, rdb, dy, x, w, s.N, s.I, s.O);

    qt_matmul_dgrad(c, gdx, dxt, ddy, dw_in, s.N, s.I, s.O, 0, 0);
    int fused = qt_matmul_wgrad(c, gdw, QT_DT_F32, gdb, ddy, dx_in, s.N, s.I, s.O, 1, 0);
    cudaError_t e = cudaDeviceSynchronize();
    float *gx = download(gdx, nx, dxt), *gw = download(gdw, nw, QT_DT_F32), *gb = download(gdb, s.O, QT_DT_F32);
    char what[128];
    int ok = e == cudaSuccess;
    snprintf(what, sizeof what, "dgrad N=%ld I=%d O=%d %s", s.N, s.I, s.O, qt_dtype_name(dxt));
    ok &= qt_t_close(what, gx, rdx, nx, tol_of(dxt), tol_of(dxt));
    printf("  %s: max rel err %.3g\n", what, max_rel(gx, rdx, nx));
    snprintf(what, sizeof what, "wgrad+= N=%ld I=%d O=%d", s.N, s.I, s.O);
    ok &= qt_t_close(what, gw, rdw, nw, 1e-4, 1e-5);
    printf("  %s: max rel err %.3g; bias grad fused: %s\n", what, max_rel(gw, rdw, nw), fused ? "yes" : "no");
    if (fused) {
        ok &= qt_t_close("dbias", gb, rdb, s.O, 1e-4, 1e-5);
    } else { /* untouched: still the NaN poison */
        for (int o = 0; o < s.O; o++) ok &= isnan(gb[o]);
    }
    free(dy), free(x), free(w), free(rdx), free(rdw), free(rdb), free(gx), free(gw), free(gb);
    cudaFree(ddy), cudaFree(dx_in), cudaFree(dw_in), cudaFree(gdx), cudaFree(gdw), cudaFree(gdb);
    return ok;
}

static void test_matmul_bwd(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_matmul_ctx *c = qt_matmul_create(0);
    qt_rng r;
    qt_rng_seed(&r, 12);
    for (int i = 0; i < NSHAPES; i++) {
        QT_EXPECT(check_bwd(c, &r, SHAPES[i], QT_DT_BF16), "bwd (bf16 dx) shape %d", i);
        QT_EXPECT(check_bwd(c, &r, SHAPES[i], QT_DT_F32), "bwd (fp32 dx) shape %d", i);
    }
    qt_matmul_free(c);
}

static void test_matmul_plan_cache(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_matmul_ctx *c = qt_matmul_create(0);
    qt_rng r;
    qt_rng_seed(&r, 13);
    shape s = {33, 896, 1152};
    QT_REQUIRE(qt_matmul_plan_count(c) == 0, "fresh context has %ld plans", qt_matmul_plan_count(c));
    void *dx, *dw, *dy = poisoned(s.N * s.O, QT_DT_BF16);
    float *x = rand_bf16(&r, s.N * s.I, 1, &dx), *w = rand_bf16(&r, (long)s.O * s.I, 1, &dw);
    qt_matmul_fwd(c, dy, QT_DT_BF16, dx, dw, NULL, s.N, s.I, s.O, 0, 0);
    long after1 = qt_matmul_plan_count(c);
    for (int i = 0; i < 3; i++) qt_matmul_fwd(c, dy, QT_DT_BF16, dx, dw, NULL, s.N, s.I, s.O, 0, 0);
    long after4 = qt_matmul_plan_count(c);
    qt_matmul_fwd(c, dy, QT_DT_BF16, dx, dw, NULL, s.N - 1, s.I, s.O, 0, 0); /* a new shape */
    long after5 = qt_matmul_plan_count(c);
    QT_EXPECT(cudaDeviceSynchronize() == cudaSuccess, "CUDA error");
    QT_EXPECT(after1 == 1 && after4 == 1 && after5 == 2, "plans built: %ld after 1 call, %ld after 4, %ld after a new shape",
              after1, after4, after5);
    free(x), free(w);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    qt_matmul_free(c);
}

/* ---- fp8: a CPU codec with __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) semantics (RNE, saturating) ---- */

static float fp8_decode(uint8_t v, int e5m2) {
    int mb = e5m2 ? 2 : 3, eb = e5m2 ? 15 : 7, e = (v & 0x7f) >> mb, m = v & ((1 << mb) - 1);
    float f;
    if (e5m2 && e == 31) f = m ? NAN : INFINITY;
    else if (!e5m2 && e == 15 && m == 7) f = NAN;
    else f = e == 0 ? ldexpf((float)m, 1 - eb - mb) : ldexpf((float)((1 << mb) + m), e - eb - mb);
    return (v & 0x80) ? -f : f;
}

static uint8_t fp8_encode(float x, int e5m2) {
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    int maxc = e5m2 ? 0x7b : 0x7e; /* 57344 and 448: the largest finite values */
    if (a >= fp8_decode((uint8_t)maxc, e5m2)) return sign | (uint8_t)maxc;
    int lo = 0, hi = maxc; /* the positive codes are ordered like their values: find the last <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (fp8_decode((uint8_t)mid, e5m2) <= a) lo = mid;
        else hi = mid - 1;
    }
    float d0 = a - fp8_decode((uint8_t)lo, e5m2), d1 = fp8_decode((uint8_t)(lo + 1), e5m2) - a;
    int c = (d1 < d0 || (d1 == d0 && (lo & 1))) ? lo + 1 : lo;
    return sign | (uint8_t)c;
}

static void test_fp8_codec(void) { /* the CPU codec itself, on values with known encodings */
    QT_EXPECT(fp8_encode(1.0f, 0) == 0x38 && fp8_encode(1.0f, 1) == 0x3c, "1.0 -> %02x / %02x", fp8_encode(1.0f, 0),
              fp8_encode(1.0f, 1));
    QT_EXPECT(fp8_encode(1e6f, 0) == 0x7e && fp8_encode(-1e9f, 1) == 0xfb, "saturation");
    QT_EXPECT(fp8_encode(1.0625f, 0) == 0x38, "e4m3 tie 1+1/16 -> %02x (even: 1.0)", fp8_encode(1.0625f, 0));
    QT_EXPECT(fp8_encode(1.1875f, 0) == 0x3a, "e4m3 tie 1+3/16 -> %02x (even: 1.25)", fp8_encode(1.1875f, 0));
    QT_EXPECT(fp8_decode(0x01, 0) == 0x1p-9f && fp8_decode(0x01, 1) == 0x1p-16f, "subnormals");
    for (int v = 0; v < 256; v++) {
        float f = fp8_decode((uint8_t)v, 0);
        if (!isnan(f)) QT_EXPECT(fp8_encode(f, 0) == v, "e4m3 %02x -> %g -> %02x", v, f, fp8_encode(f, 0));
        f = fp8_decode((uint8_t)v, 1);
        if (!isnan(f) && !isinf(f)) QT_EXPECT(fp8_encode(f, 1) == v, "e5m2 %02x -> %g -> %02x", v, f, fp8_encode(f, 1));
    }
}

static uint8_t *rand_fp8(qt_rng *r, long n, float sd, int e5m2, float **dec) {
    uint8_t *h = malloc((size_t)n);
    *dec = malloc((size_t)n * sizeof **dec);
    for (long i = 0; i < n; i++) {
        h[i] = fp8_encode(qt_rng_normal(r) * sd, e5m2);
        (*dec)[i] = fp8_decode(h[i], e5m2);
    }
    return h;
}

static int check_fp8(qt_matmul_ctx *c, qt_rng *r, long M, int N, int K, int b_e5m2, qt_dtype dt, int bias, int fast) {
    float *a, *b, sa = 0.5f, sb = 2.0f, scales[8] = {sa, 0, 0, 0, sb}; /* cuBLASLt wants 16-byte aligned scale pointers */
    uint8_t *ha = rand_fp8(r, M * K, 1.0f, 0, &a), *hb = rand_fp8(r, (long)N * K, 1.0f / sqrtf(K), b_e5m2, &b);
    float *bv = calloc((size_t)N, sizeof *bv), *ref = malloc((size_t)(M * N) * sizeof *ref);
    for (int n = 0; n < N && bias; n++) bv[n] = qt_bf16_to_f32(qt_f32_to_bf16(qt_rng_normal(r)));
    for (long m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)a[m * K + k] * b[(long)n * K + k];
            ref[m * N + n] = (float)(sa * sb * acc + bv[n]);
        }
    void *da, *db, *dbias = NULL, *dd = poisoned(M * N, dt);
    float *dscales;
    cudaMalloc(&da, (size_t)(M * K));
    cudaMalloc(&db, (size_t)N * K);
    cudaMalloc((void **)&dscales, sizeof scales);
    cudaMemcpy(da, ha, (size_t)(M * K), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, (size_t)N * K, cudaMemcpyHostToDevice);
    cudaMemcpy(dscales, scales, sizeof scales, cudaMemcpyHostToDevice);
    if (bias) {
        cudaMalloc(&dbias, (size_t)N * 2);
        upload_as(dbias, bv, N, QT_DT_BF16);
    }
    qt_matmul_fp8(c, dd, dt, da, QT_DT_E4M3, dscales, db, b_e5m2 ? QT_DT_E5M2 : QT_DT_E4M3, dscales + 4, dbias, M, N, K,
                  fast, 0, 0);
    cudaError_t e = cudaDeviceSynchronize();
    float *got = download(dd, M * N, dt);
    char what[160];
    snprintf(what, sizeof what, "fp8 e4m3 x %s M=%ld N=%d K=%d -> %s bias=%d fast_accum=%d", b_e5m2 ? "e5m2" : "e4m3", M,
             N, K, qt_dtype_name(dt), bias, fast);
    /* fast accumulation keeps ~13 mantissa bits in the running sums: a few 1e-3 over K ~ 1000 */
    /* Hopper's fp8 MMA accumulates with ~13-14 mantissa bits between fp32 promotions even without fast
     * accumulation (seen on H200: 5e-4 relative at K=64), so fp32 output is not fp32-exact. */
    double tol = dt == QT_DT_BF16 ? (fast ? 1.5e-2 : 1e-2) : (fast ? 1e-2 : 2e-3);
    int ok = e == cudaSuccess && qt_t_close(what, got, ref, M * N, tol, tol);
    printf("  %s: max rel err %.3g\n", what, max_rel(got, ref, M * N));
    free(a), free(b), free(ha), free(hb), free(bv), free(ref), free(got);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dd), cudaFree(dscales);
    return ok;
}

static void test_matmul_fp8(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_matmul_ctx *c = qt_matmul_create(0);
    int cc = qt_matmul_cc(c);
    if (cc < 89) {
        qt_matmul_free(c);
        QT_SKIP("device has no fp8 tensor cores (cc %d)", cc);
    }
    qt_rng r;
    qt_rng_seed(&r, 14);
    for (int be5 = 0; be5 < 2; be5++)
        for (int fast = 0; fast < 2; fast++) {
            /* every dimension a multiple of 16: cuBLASLt's fp8 kernels refuse others (M=1, 7, 33 gave
             * CUBLAS_STATUS_NOT_SUPPORTED at launch; qt_matmul_fp8 now rejects them up front) */
            QT_EXPECT(check_fp8(c, &r, 32, 48, 64, be5, QT_DT_F32, 0, fast), "fp8 small fp32");
            QT_EXPECT(check_fp8(c, &r, 16, 1152, 896, be5, QT_DT_BF16, 1, fast), "fp8 bf16+bias");
            QT_EXPECT(check_fp8(c, &r, 48, 896, 1152, be5, QT_DT_F32, 1, fast), "fp8 fp32+bias");
            /* the model's three layouts at a small layer: fwd (N,O,I), dgrad (N,I,O), wgrad (O,I,N) */
            QT_EXPECT(check_fp8(c, &r, 64, 192, 128, be5, QT_DT_BF16, 0, fast), "fp8 fwd/dgrad shape");
            QT_EXPECT(check_fp8(c, &r, 192, 128, 64, be5, QT_DT_F32, 0, 0), "fp8 wgrad shape");
        }
    qt_matmul_free(c);
}

int main(void) {
    QT_RUN(test_fp8_codec);
    QT_RUN(test_matmul_fwd);
    QT_RUN(test_matmul_bwd);
    QT_RUN(test_matmul_plan_cache);
    QT_RUN(test_matmul_fp8);
    return qt_test_end();
}
