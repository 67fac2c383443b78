/* test_nf4.c — the CPU NF4 codec (src/ref/nf4_ref.c, include/qt_nf4.h) on its own: the QLoRA codebook and the
 * dynamic map against their published definitions, the decision thresholds, a block whose packed bytes are
 * known, round-trip bounds (every code the nearest, the double-quantized scales within the 8-bit map's half
 * gap), odd sizes (a short last block, the padding nibble), a block of zeros, and the refusals of bad input.
 * Bit-exactness against bitsandbytes itself: tests/test_nf4_bnb.py; the kernels: test_ops_gpu's nf4 rows.
 * In the mutant build, the planted bugs of nf4_ref.c (nibbles swapped, the offset left out) must each fail
 * the check that guards against them. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_nf4.h"
#include "qt_rng.h"
#include "qt_test.h"

/* The NF4 values as the QLoRA paper's appendix and bitsandbytes' get_4bit_type('nf4') print them. */
static const double PAPER_NF4[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                     0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                     0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                     0.7229568362236023, 1.0};

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* Random N(0, 1) values scaled per block of 64 by 10^u, u in [-3, 2]: the block maxima spread as a real
 * weight's do, so the double quantization has work to do. */
static float *random_values(long n, uint64_t seed) {
    qt_rng r;
    qt_rng_seed(&r, seed);
    float *x = xmalloc((size_t)n * sizeof *x), scale = 1.0f;
    for (long i = 0; i < n; i++) {
        if (i % QT_NF4_BLOCK == 0) scale = (float)pow(10.0, -3.0 + 5.0 * qt_rng_uniform(&r));
        x[i] = scale * qt_rng_normal(&r);
    }
    return x;
}

static void test_codebook(void) {
    for (int c = 0; c < 16; c++)
        QT_EXPECT(qt_nf4_value(c) == (float)PAPER_NF4[c], "code %d: %.9g, the paper's %.17g", c, qt_nf4_value(c),
                  PAPER_NF4[c]);
    for (int c = 0; c < 16; c++)
        QT_EXPECT(qt_nf4_encode(qt_nf4_value(c)) == c, "value of code %d encodes to %d", c, qt_nf4_encode(qt_nf4_value(c)));
    for (int c = 0; c < 15; c++) { /* the fp32 midpoint goes down, the next float up */
        float t = (qt_nf4_value(c) + qt_nf4_value(c + 1)) / 2;
        QT_EXPECT(qt_nf4_encode(t) == c && qt_nf4_encode(nextafterf(t, 2.0f)) == c + 1,
                  "threshold %d (%.9g): %d at it, %d above", c, t, qt_nf4_encode(t), qt_nf4_encode(nextafterf(t, 2.0f)));
    }
    QT_EXPECT(qt_nf4_encode(NAN) == 0 && qt_nf4_encode(-2.0f) == 0 && qt_nf4_encode(2.0f) == 15,
              "NaN -> %d, -2 -> %d, 2 -> %d", qt_nf4_encode(NAN), qt_nf4_encode(-2.0f), qt_nf4_encode(2.0f));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* create_dynamic_map(signed=True, 7, 8) in fp64: for i = 0..6, the 2^i midpoints of linspace(0.1, 1, 2^i + 1)
 * times +-10^(i-6); then 0 and 1. The table holds torch's fp32 arithmetic of the same: within 1e-6. */
static void test_dynamic_map(void) {
    double want[256];
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1;
        for (int j = 0; j + 1 < items; j++) {
            double b0 = 0.1 + 0.9 * j / (items - 1), b1 = 0.1 + 0.9 * (j + 1) / (items - 1);
            want[k++] = pow(10.0, i - 6) * (b0 + b1) / 2;
            want[k++] = -pow(10.0, i - 6) * (b0 + b1) / 2;
        }
    }
    want[k++] = 0.0, want[k++] = 1.0;
    QT_REQUIRE(k == 256, "%d values", k);
    qsort(want, 256, sizeof *want, cmp_double);
    for (int c = 0; c < 256; c++) {
        double got = qt_nf4_dyn_value(c);
        QT_EXPECT(fabs(got - want[c]) <= 1e-6 * fabs(want[c]), "dynamic code %d: %.9g, definition %.9g", c, got, want[c]);
        QT_EXPECT(c == 0 || got > qt_nf4_dyn_value(c - 1), "dynamic map not ascending at %d", c);
        QT_EXPECT(qt_nf4_dyn_encode((float)got) == c, "dynamic value %d encodes to %d", c, qt_nf4_dyn_encode((float)got));
    }
}

/* Quantizes one block holding 3 * the NF4 value of code (7 i + 3) % 16 at i, and returns how many packed
 * bytes or dequantized values differ from what the layout says (value 2k in byte k's high nibble). */
static int known_block_mismatches(void) {
    float x[64], y[64], absmax;
    uint8_t codes[32];
    char err[256];
    int c[64], bad = 0;
    for (int i = 0; i < 64; i++) c[i] = (7 * i + 3) % 16, x[i] = 3.0f * qt_nf4_value(c[i]);
    if (qt_nf4_quantize_ref(QT_DT_F32, x, 64, codes, &absmax, "known", err, sizeof err)) return 64;
    qt_nf4_dequant_ref(QT_DT_F32, y, codes, &absmax, 64);
    for (int k = 0; k < 32; k++) bad += codes[k] != (uint8_t)(c[2 * k] << 4 | c[2 * k + 1]);
    for (int i = 0; i < 64; i++) bad += y[i] != x[i];
    return bad + (absmax != 3.0f);
}

static void test_known_block(void) {
    QT_EXPECT(known_block_mismatches() == 0, "%d bytes or values differ from the layout", known_block_mismatches());
}

/* The largest distance from a value in [-1, 1] to the nearest dynamic code. */
static double dyn_half_gap(void) {
    double g = 0;
    for (int c = 0; c < 255; c++) g = fmax(g, (qt_nf4_dyn_value(c + 1) - qt_nf4_dyn_value(c)) / 2);
    return g;
}

/* Double quantization of absmax[nb] and back: returns the worst |absmax' - absmax| / (absmax2 * half gap + ulps)
 * (<= 1 when the scales come back within the 8-bit map's resolution) and checks offset and absmax2. */
static double double_quant_error(const float *absmax, long nb) {
    uint8_t *q = xmalloc((size_t)nb);
    float *a2 = xmalloc((size_t)(nb / QT_NF4_BLOCK2 + 1) * sizeof *a2), *back = xmalloc((size_t)nb * sizeof *back), off;
    qt_nf4_double_quant_ref(absmax, nb, q, a2, &off);
    qt_nf4_absmax_ref(back, q, a2, off, nb);
    double sum = 0, worst = 0, gap = dyn_half_gap();
    for (long b = 0; b < nb; b++) sum += absmax[b];
    QT_EXPECT(fabs(off - sum / nb) <= 1e-6 * sum / nb, "offset %.9g, mean %.9g", off, sum / nb);
    for (long b = 0; b < nb; b++) {
        double m = 0;
        for (long i = b / QT_NF4_BLOCK2 * QT_NF4_BLOCK2; i < nb && i / QT_NF4_BLOCK2 == b / QT_NF4_BLOCK2; i++)
            m = fmax(m, fabsf(absmax[i] - off));
        QT_EXPECT(a2[b / QT_NF4_BLOCK2] == (float)m, "absmax2[%ld] %.9g, max |absmax - offset| %.9g", b / QT_NF4_BLOCK2,
                  a2[b / QT_NF4_BLOCK2], m);
        /* the map's half gap (and a product's rounding), the roundings of absmax - offset and of the sum back */
        double tol = a2[b / QT_NF4_BLOCK2] * gap * (1 + 1e-6) + 4 * FLT_EPSILON * (fabs(absmax[b]) + fabs(off)) + FLT_MIN;
        worst = fmax(worst, fabs(back[b] - absmax[b]) / tol);
    }
    free(q), free(a2), free(back);
    return worst;
}

/* Round trip of n values (dt bf16 or fp32): every code the nearest NF4 value to x / absmax, the padding nibble
 * of odd n the code of 0.0, the scales back within the 8-bit resolution, y within half the codebook's gap. */
static void round_trip(long n, qt_dtype dt, uint64_t seed) {
    float *x = random_values(n, seed), *absmax = xmalloc((size_t)qt_nf4_blocks(n) * sizeof *absmax);
    float *y = xmalloc((size_t)n * sizeof *y);
    uint16_t *xb = xmalloc((size_t)n * 2);
    uint8_t *codes = xmalloc((size_t)qt_nf4_code_bytes(n));
    for (long i = 0; i < n; i++) xb[i] = qt_f32_to_bf16(x[i]), x[i] = dt == QT_DT_BF16 ? qt_bf16_to_f32(xb[i]) : x[i];
    char err[256];
    int rc = qt_nf4_quantize_ref(dt, dt == QT_DT_BF16 ? (void *)xb : (void *)x, n, codes, absmax, "x", err, sizeof err);
    QT_REQUIRE(rc == 0, "n %ld: %s", n, err);
    qt_nf4_dequant_ref(QT_DT_F32, y, codes, absmax, n);
    double half = 0; /* half the widest gap of the codebook (between -1 and -0.696) */
    for (int k = 0; k < 15; k++) half = fmax(half, (qt_nf4_value(k + 1) - qt_nf4_value(k)) / 2);
    long far = -1;
    for (long i = 0; i < n && far < 0; i++) {
        int c = i & 1 ? codes[i / 2] & 15 : codes[i / 2] >> 4;
        double s = x[i] / (double)absmax[i / QT_NF4_BLOCK], d = fabs(s - qt_nf4_value(c));
        for (int k = 0; k < 16; k++)
            if (fabs(s - qt_nf4_value(k)) < d - 1e-6) far = i;
        if (fabs(y[i] - x[i]) > half * absmax[i / QT_NF4_BLOCK] * (1 + 1e-6)) far = i;
    }
    long w = far < 0 ? 0 : far;
    QT_EXPECT(far < 0, "n %ld %s: value %ld (%.9g, block absmax %.9g) has a code other than its nearest or comes back "
              "farther than half the widest gap: %.9g", n, qt_dtype_name(dt), w, x[w], absmax[w / QT_NF4_BLOCK], y[w]);
    if (n & 1) QT_EXPECT((codes[n / 2] & 15) == 7, "n %ld: padding nibble %d, expected 7 (0.0)", n, codes[n / 2] & 15);
    double e = double_quant_error(absmax, qt_nf4_blocks(n));
    QT_EXPECT(e <= 1, "n %ld: a double-quantized scale is %.3g x the 8-bit resolution away", n, e);
    free(x), free(absmax), free(y), free(xb), free(codes);
}

static void test_round_trip(void) {
    static const long sizes[] = {1, 7, 63, 64, 65, 127, 1000, 64 * 256, 64 * 256 + 1, 64 * 777 + 33, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        round_trip(sizes[k], QT_DT_F32, 10 + k);
        round_trip(sizes[k], QT_DT_BF16, 100 + k);
    }
}

/* One block: absmax - offset is 0, so absmax2 is 0 and the scale comes back as the offset, exactly. */
static void test_single_block(void) {
    float x[40], absmax, a2, off, back;
    uint8_t codes[20], q;
    char err[256];
    for (int i = 0; i < 40; i++) x[i] = (float)(i - 17) / 8;
    QT_REQUIRE(!qt_nf4_quantize_ref(QT_DT_F32, x, 40, codes, &absmax, "x", err, sizeof err), "%s", err);
    qt_nf4_double_quant_ref(&absmax, 1, &q, &a2, &off);
    qt_nf4_absmax_ref(&back, &q, &a2, off, 1);
    QT_EXPECT(absmax == 22.0f / 8 && off == absmax && a2 == 0 && q == 0 && back == absmax,
              "absmax %g offset %g absmax2 %g q %d back %g", absmax, off, a2, q, back);
}

/* A block of zeros: absmax 0, codes 0x00 (0 * 1/0 is NaN: code 0, as bitsandbytes' CUDA kernel), values 0. */
static void test_zero_block(void) {
    float x[150], y[150], absmax[3];
    uint8_t codes[75];
    char err[256];
    for (int i = 0; i < 150; i++) x[i] = i >= 64 && i < 128 ? 0.0f : (float)sin(i);
    QT_REQUIRE(!qt_nf4_quantize_ref(QT_DT_F32, x, 150, codes, absmax, "x", err, sizeof err), "%s", err);
    qt_nf4_dequant_ref(QT_DT_F32, y, codes, absmax, 150);
    int bad = absmax[1] != 0;
    for (int k = 32; k < 64; k++) bad += codes[k] != 0;
    for (int i = 64; i < 128; i++) bad += y[i] != 0;
    QT_EXPECT(!bad, "%d of the zero block's absmax, codes and values are off", bad);
}

static void expect_refusal(qt_dtype dt, const void *x, long n, const char *want) {
    uint8_t codes[8];
    float absmax[1];
    char err[256] = "";
    int rc = qt_nf4_quantize_ref(dt, x, n, codes, absmax, "layers.0.mlp.up", err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, "layers.0.mlp.up: ") && strstr(err, want), "rc %d, message \"%s\", expected \"%s\"",
              rc, err, want);
}

static void test_refusals(void) {
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    expect_refusal(QT_DT_F32, x, 0, "at least one value, got n = 0");
    expect_refusal(QT_DT_F32, x, -5, "got n = -5");
    expect_refusal(QT_DT_E4M3, x, 9, "bf16 or fp32, got e4m3");
    expect_refusal((qt_dtype)42, x, 9, "bf16 or fp32, got an unknown dtype");
    x[5] = NAN;
    expect_refusal(QT_DT_F32, x, 9, "value 5 is nan: NF4 quantizes finite values only");
    x[5] = 1, x[8] = -INFINITY;
    expect_refusal(QT_DT_F32, x, 9, "value 8 is -inf");
    uint16_t b[3] = {0x3f80, 0x7f80, 0};
    expect_refusal(QT_DT_BF16, b, 3, "value 1 is inf");
}

/* The planted bugs of nf4_ref.c (mutant build): each fails the check written against it. */
static void test_mutants_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    qt_t_hooks(NULL, QT_MUT_NF4_NIBBLE_SWAP);
    int swapped = known_block_mismatches();
    qt_t_hooks(NULL, QT_MUT_NF4_NO_OFFSET);
    float *x = random_values(64 * 300, 7), absmax[300];
    uint8_t codes[32 * 300];
    char err[256];
    QT_REQUIRE(!qt_nf4_quantize_ref(QT_DT_F32, x, 64 * 300, codes, absmax, "x", err, sizeof err), "%s", err);
    double e = double_quant_error(absmax, 300);
    qt_t_hooks(NULL, QT_MUT_NONE);
    free(x);
    QT_EXPECT(swapped > 0, "swapped nibbles pass the known block");
    QT_EXPECT(e > 1, "scales without the offset come back within the 8-bit resolution (%.3g)", e);
}

int main(void) {
    QT_RUN(test_codebook);
    QT_RUN(test_dynamic_map);
    QT_RUN(test_known_block);
    QT_RUN(test_round_trip);
    QT_RUN(test_single_block);
    QT_RUN(test_zero_block);
    QT_RUN(test_refusals);
    QT_RUN(test_mutants_caught);
    return qt_test_end();
}
