/* qt_dtype.h — element types shared by kernels, checkpoints and safetensors, and CPU bf16/fp8 casts. */
#ifndef QT_DTYPE_H
#define QT_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum { QT_DT_F32 = 0, QT_DT_BF16 = 1, QT_DT_E4M3 = 2, QT_DT_E5M2 = 3, QT_DT_F16 = 4 } qt_dtype;

static inline int qt_dtype_size(qt_dtype t) { return t == QT_DT_F32 ? 4 : (t == QT_DT_BF16 || t == QT_DT_F16) ? 2 : 1; }
static inline const char *qt_dtype_name(qt_dtype t) {
    static const char *n[] = {"fp32", "bf16", "e4m3", "e5m2", "fp16"};
    return n[t];
}

/* fp32 -> bf16 with round-to-nearest-even (NaN stays NaN), as the GPU's __float2bfloat16 does. */
static inline uint16_t qt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float qt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* IEEE half -> fp32 (safetensors F16 import). */
static inline float qt_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal: normalise */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 127 - 15) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
