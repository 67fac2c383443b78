/* test_basics.c — the RNG and the CPU dtype casts. */
#include "qt_dtype.h"
#include "qt_rng.h"
#include "qt_test.h"

static void test_rng_reproducible(void) {
    qt_rng a, b;
    qt_rng_seed(&a, 42);
    qt_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) QT_REQUIRE(qt_rng_u64(&a) == qt_rng_u64(&b), "draw %d differs", i);
    qt_rng_seed(&b, 43);
    QT_EXPECT(qt_rng_u64(&a) != qt_rng_u64(&b), "seeds 42 and 43 agree");
}

static void test_rng_normal_moments(void) {
    qt_rng r;
    qt_rng_seed(&r, 7);
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = qt_rng_normal(&r);
        s += x;
        s2 += x * x;
    }
    QT_EXPECT(fabs(s / n) < 0.01, "mean %g", s / n);
    QT_EXPECT(fabs(s2 / n - 1) < 0.01, "var %g", s2 / n);
    uint64_t c[5] = {0};
    for (int i = 0; i < 50000; i++) c[qt_rng_below(&r, 5)]++;
    for (int i = 0; i < 5; i++) QT_EXPECT(c[i] > 9500 && c[i] < 10500, "bucket %d: %lu", i, (unsigned long)c[i]);
}

static void test_bf16_rounding(void) {
    QT_EXPECT(qt_f32_to_bf16(1.0f) == 0x3f80, "1.0 -> %04x", qt_f32_to_bf16(1.0f));
    /* 1 + 2^-8 is exactly half-way between bf16 1.0 and 1.0078125: ties go to even (1.0). */
    QT_EXPECT(qt_f32_to_bf16(1.00390625f) == 0x3f80, "tie -> %04x", qt_f32_to_bf16(1.00390625f));
    QT_EXPECT(qt_f32_to_bf16(1.01171875f) == 0x3f82, "tie up -> %04x", qt_f32_to_bf16(1.01171875f));
    QT_EXPECT(isnan(qt_bf16_to_f32(qt_f32_to_bf16(NAN))), "NaN lost");
    QT_EXPECT(qt_f16_to_f32(0x3c00) == 1.0f && qt_f16_to_f32(0xc000) == -2.0f, "f16 decode");
    QT_EXPECT(qt_f16_to_f32(0x0001) == 0x1p-24f, "f16 subnormal %g", qt_f16_to_f32(0x0001));
}

int main(void) {
    QT_RUN(test_rng_reproducible);
    QT_RUN(test_rng_normal_moments);
    QT_RUN(test_bf16_rounding);
    return qt_test_end();
}
