/* fp8_ref.c — CPU fp8 (e4m3/e5m2) codec and scale rule: the reference for cuda/quant.cu.
 *
 * encode: fp32 -> fp8 with one round-to-nearest-even on the exact value (integer arithmetic on the
 * fp32 bits), subnormals included; decode is exact. e4m3: bias 7, 3 mantissa bits, no Inf, NaN =
 * S.1111.111, max 448. e5m2: bias 15, 2 mantissa bits, Inf = S.11111.00, max 57344. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "qt_quant.h"

typedef struct {
    int mbits, bias, maxcode, infcode; /* infcode < 0: no Inf */
} fp8_fmt;

static fp8_fmt fmt_of(qt_dtype dt) {
    if (dt == QT_DT_E5M2) return (fp8_fmt){2, 15, 0x7b, 0x7c};
    return (fp8_fmt){3, 7, 0x7e, -1};
}

uint8_t qt_fp8_encode(qt_dtype dt, float x, int saturate) {
    fp8_fmt f = fmt_of(dt);
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    int over = saturate ? f.maxcode : f.infcode >= 0 ? f.infcode : 0x7f;
    if (a == 0x7f800000u) return (uint8_t)(sign | over);
    if (a == 0) return sign;
    /* a = M * 2^(E-23) with M < 2^24 exactly; fp32 subnormals have E = -126 and no hidden bit. */
    int ef = (int)(a >> 23);
    uint32_t M = (a & 0x7fffffu) | (ef ? 0x800000u : 0);
    int E = ef ? ef - 127 : -126;
    int emin = 1 - f.bias;
    /* The fp8 quantum at this magnitude: 2^q. Subnormal fp8 values share the quantum of emin. */
    int q = (E >= emin ? E : emin) - f.mbits;
    int shift = q - (E - 23); /* >= 23 - mbits > 0 */
    uint32_t m;
    if (shift >= 25) m = 0; /* M / 2^shift < 1/2: rounds to zero */
    else {
        m = M >> shift;
        uint32_t rem = M & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1))) m++;
    }
    /* Normal: code = (E+bias) << mbits + (m - 2^mbits); a carry of m to 2^(mbits+1) lands on the next
     * exponent by itself. Subnormal: code = m (m == 2^mbits is the smallest normal, also by itself). */
    long code = E >= emin ? ((long)(E + f.bias) << f.mbits) + (long)m - (1L << f.mbits) : (long)m;
    if (code > f.maxcode) code = over;
    return (uint8_t)(sign | (uint8_t)code);
}

float qt_fp8_decode(qt_dtype dt, uint8_t code) {
    fp8_fmt f = fmt_of(dt);
    int s = code >> 7, e = (code & 0x7f) >> f.mbits, m = code & ((1 << f.mbits) - 1);
    int emax_field = (1 << (7 - f.mbits)) - 1;
    float v;
    if (f.infcode < 0 && (code & 0x7f) == 0x7f) return NAN;
    if (f.infcode >= 0 && e == emax_field) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, 1 - f.bias - f.mbits);
    else v = ldexpf((float)(m + (1 << f.mbits)), e - f.bias - f.mbits);
    if (isnan(v)) return v;
    return s ? -v : v;
}

void qt_fp8_scale_ref(qt_dtype dt, float amax, float *scale, float *descale) {
    float sc;
    if (!(amax <= FLT_MAX)) sc = NAN; /* NaN or Inf */
    else if (amax == 0.0f) sc = 1.0f;
    else {
        volatile float q = qt_fp8_max(dt) / amax; /* one fp32 division, as on the GPU */
        sc = q > FLT_MAX ? FLT_MAX : q;
    }
    *scale = sc;
    *descale = 1.0f / sc;
}
