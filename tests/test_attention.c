/* test_attention.c — cuDNN SDPA graphs (cuda/attention.c) against qt_ref_attention_fwd/bwd.
 *
 * Causal GQA on a fused bf16 qkv buffer: B=2, T = 1, 7, 64, 100; (H, Hkv) = (6, 2) and (4, 4);
 * D = 64 and 128. Checks out, lse (cuDNN's Stats must be the natural-log logsumexp of the scaled
 * scores) and dq/dk/dv separately, printing the max relative errors; a shape whose graph cuDNN
 * rejects is reported with cuDNN's message and the remaining shapes still run. Skips without a GPU. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_attention.h"
#include "qt_dtype.h"
#include "qt_ref.h"
#include "qt_rng.h"
#include "qt_test.h"

static int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return n;
}

/* n floats ~ N(0,1) rounded to bf16, and the bf16 copy on the device. Caller frees both. */
static float *rand_bf16(qt_rng *r, long n, void **dev) {
    float *f = malloc((size_t)n * sizeof *f);
    uint16_t *h = malloc((size_t)n * 2);
    for (long i = 0; i < n; i++) {
        h[i] = qt_f32_to_bf16(qt_rng_normal(r));
        f[i] = qt_bf16_to_f32(h[i]);
    }
    cudaMalloc(dev, (size_t)n * 2);
    cudaMemcpy(*dev, h, (size_t)n * 2, cudaMemcpyHostToDevice);
    free(h);
    return f;
}

static void *poisoned(size_t bytes) { /* 0xff bytes: NaN in bf16 and fp32 */
    void *d = NULL;
    cudaMalloc(&d, bytes);
    cudaMemset(d, 0xff, bytes);
    return d;
}

static float *download_bf16(const void *d, long n) {
    uint16_t *h = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * sizeof *f);
    cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost);
    for (long i = 0; i < n; i++) f[i] = qt_bf16_to_f32(h[i]);
    free(h);
    return f;
}

static double max_rel(const float *got, const float *ref, long n) {
    double m = 0, mx = 1e-30;
    for (long i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)got[i] - ref[i]) / mx);
    return isnan(m) ? INFINITY : m;
}

/* Compares the heads [h0, h0+nh) of every token row (row length W) of got and ref. */
static int check_heads(const char *what, const float *got, const float *ref, long rows, int W, int h0, int nh, int D,
                       double tol) {
    long n = rows * nh * D;
    float *g = malloc((size_t)n * sizeof *g), *r = malloc((size_t)n * sizeof *r);
    for (long t = 0; t < rows; t++) {
        memcpy(g + t * nh * D, got + t * W + (long)h0 * D, (size_t)nh * D * sizeof *g);
        memcpy(r + t * nh * D, ref + t * W + (long)h0 * D, (size_t)nh * D * sizeof *r);
    }
    int ok = qt_t_close(what, g, r, n, tol, tol);
    printf("    %-4s max rel err %.3g%s\n", what, max_rel(g, r, n), ok ? "" : "  <-- out of bounds");
    free(g), free(r);
    return ok;
}

/* One shape: prepare, fwd vs reference, bwd vs reference. Returns 1 when everything is in bounds. */
static int check_shape(qt_attention_ctx *c, qt_rng *r, int B, int T, int H, int Hkv, int D) {
    int W = (H + 2 * Hkv) * D;
    long rows = (long)B * T, nqkv = rows * W, nout = rows * H * D, nlse = (long)B * H * T;
    char err[1024];
    printf("  B=%d T=%d H=%d Hkv=%d D=%d\n", B, T, H, Hkv, D);
    if (qt_attention_prepare(c, B, T, H, Hkv, D, err, sizeof err)) {
        printf("    cuDNN rejected the graph: %s\n", err);
        return 0;
    }
    void *dqkv_in, *ddout;
    float *qkv = rand_bf16(r, nqkv, &dqkv_in), *dout = rand_bf16(r, nout, &ddout);
    float *rout = malloc((size_t)nout * 4), *rlse = malloc((size_t)nlse * 4), *rdqkv = malloc((size_t)nqkv * 4);
    qt_ref_attention_fwd(rout, rlse, qkv, B, T, H, Hkv, D);
    qt_ref_attention_bwd(rdqkv, dout, qkv, rout, rlse, B, T, H, Hkv, D);

    void *gout = poisoned((size_t)nout * 2), *gdqkv = poisoned((size_t)nqkv * 2);
    float *glse = poisoned((size_t)nlse * 4);
    qt_attention_fwd(c, gout, glse, dqkv_in, B, T, H, Hkv, D, 0);
    qt_attention_bwd(c, gdqkv, ddout, dqkv_in, gout, glse, B, T, H, Hkv, D, 0);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) printf("    CUDA error %s\n", cudaGetErrorString(e));
    float *out = download_bf16(gout, nout), *dqkv = download_bf16(gdqkv, nqkv), *lse = malloc((size_t)nlse * 4);
    cudaMemcpy(lse, glse, (size_t)nlse * 4, cudaMemcpyDeviceToHost);

    int ok = e == cudaSuccess;
    ok &= check_heads("out", out, rout, rows, H * D, 0, H, D, 1e-2);
    ok &= qt_t_close("lse", lse, rlse, nlse, 1e-3, 1e-3);
    printf("    %-4s max rel err %.3g\n", "lse", max_rel(lse, rlse, nlse));
    ok &= check_heads("dq", dqkv, rdqkv, rows, W, 0, H, D, 2e-2);
    ok &= check_heads("dk", dqkv, rdqkv, rows, W, H, Hkv, D, 2e-2);
    ok &= check_heads("dv", dqkv, rdqkv, rows, W, H + Hkv, Hkv, D, 2e-2);

    free(qkv), free(dout), free(rout), free(rlse), free(rdqkv), free(out), free(dqkv), free(lse);
    cudaFree(dqkv_in), cudaFree(ddout), cudaFree(gout), cudaFree(gdqkv), cudaFree(glse);
    return ok;
}

static void test_attention_shapes(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_attention_ctx *c = qt_attention_create();
    qt_rng r;
    qt_rng_seed(&r, 21);
    static const int Ts[] = {1, 7, 64, 100}, heads[][2] = {{6, 2}, {4, 4}}, Ds[] = {64, 128};
    int bad = 0, total = 0;
    char first[128] = "";
    for (int di = 0; di < 2; di++)
        for (int hi = 0; hi < 2; hi++)
            for (int ti = 0; ti < 4; ti++) {
                total++;
                if (!check_shape(c, &r, 2, Ts[ti], heads[hi][0], heads[hi][1], Ds[di])) {
                    if (!bad++)
                        snprintf(first, sizeof first, "B=2 T=%d H=%d Hkv=%d D=%d", Ts[ti], heads[hi][0], heads[hi][1],
                                 Ds[di]);
                }
            }
    QT_EXPECT(bad == 0, "%d of %d shapes failed (first: %s; details above)", bad, total, first);
    qt_attention_free(c);
}

static void test_attention_plan_cache(void) {
    if (!gpu_count()) QT_SKIP("no CUDA device");
    qt_attention_ctx *c = qt_attention_create();
    char err[600];
    QT_REQUIRE(qt_attention_plan_count(c) == 0, "fresh context has %ld plans", qt_attention_plan_count(c));
    int rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, err, sizeof err);
    QT_REQUIRE(rc == 0, "%.600s", err);
    long n1 = qt_attention_plan_count(c);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 64, err, sizeof err);
    long n2 = qt_attention_plan_count(c);
    QT_EXPECT(rc == 0 && n1 == 2 && n2 == 2, "plans: %ld after the first prepare (fwd+bwd), %ld after the second", n1, n2);
    rc = qt_attention_prepare(c, 1, 32, 4, 2, 60, err, sizeof err); /* D % 8 != 0: a clean error */
    QT_EXPECT(rc == -1 && strstr(err, "D=60"), "bad head dim: rc %d, message \"%s\"", rc, err);
    qt_attention_free(c);
}

int main(void) {
    QT_RUN(test_attention_shapes);
    QT_RUN(test_attention_plan_cache);
    return qt_test_end();
}
