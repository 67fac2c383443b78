/* reduce.cuh — the element loop of comm's reductions, shared by the reduction kernel (reduce.cu) and the
 * one-kernel collectives (oneshot.cu). Device code only; see qt_comm_reduce_launch for the contract. */
#ifndef QT_COMM_REDUCE_CUH
#define QT_COMM_REDUCE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "qt_comm.h"

typedef struct {
    const void *src[QT_COMM_MAX_RANKS];
    void *dst[QT_COMM_MAX_RANKS];
    int nsrc, ndst;
} qt_reduce_args;

__device__ __forceinline__ float red_op(float acc, float v, int op) {
    return op == QT_COMM_SUM ? acc + v : ((v > acc || v != v) ? v : acc);
}

__device__ __forceinline__ float ld_one(const void *p, size_t i, int dt) {
    if (dt == QT_DT_F32) return ((const float *)p)[i];
    return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
}

__device__ __forceinline__ void unpack(uint4 u, int dt, float *v) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if (dt == QT_DT_F32) {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = __uint_as_float(w[k]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
}

__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/* One 16-byte vector of every source. dt is a literal at each call site, so after inlining every loop
 * has constant bounds and the arrays stay in registers (a runtime element count spilled them to local
 * memory). All sources are loaded before any is used, so a thread has nsrc loads in flight: remote
 * (NVLink) loads take microseconds and need that parallelism. */
__device__ __forceinline__ void vec_step(qt_reduce_args a, size_t i, const int dt, int op) {
    const int per = dt == QT_DT_F32 ? 4 : 8;
    uint4 u[QT_COMM_MAX_RANKS];
#pragma unroll
    for (int k = 0; k < QT_COMM_MAX_RANKS; k++)
        if (k < a.nsrc) u[k] = __ldcs(((const uint4 *)a.src[k]) + i);
    float acc[8], v[8];
    unpack(u[0], dt, acc);
#pragma unroll
    for (int k = 1; k < QT_COMM_MAX_RANKS; k++) {
        if (k >= a.nsrc) break;
        unpack(u[k], dt, v);
#pragma unroll
        for (int e = 0; e < per; e++) acc[e] = red_op(acc[e], v[e], op);
    }
    uint4 o;
    if (dt == QT_DT_F32) {
        o.x = __float_as_uint(acc[0]); o.y = __float_as_uint(acc[1]);
        o.z = __float_as_uint(acc[2]); o.w = __float_as_uint(acc[3]);
    } else {
        o.x = to_bf16(acc[0]) | ((uint32_t)to_bf16(acc[1]) << 16);
        o.y = to_bf16(acc[2]) | ((uint32_t)to_bf16(acc[3]) << 16);
        o.z = to_bf16(acc[4]) | ((uint32_t)to_bf16(acc[5]) << 16);
        o.w = to_bf16(acc[6]) | ((uint32_t)to_bf16(acc[7]) << 16);
    }
#pragma unroll
    for (int k = 0; k < QT_COMM_MAX_RANKS; k++)
        if (k < a.ndst) ((uint4 *)a.dst[k])[i] = o;
}

/* dsts[k][i] = reduction of srcs[.][i] for the i this thread owns (grid-stride from tid by stride); vec:
 * every pointer is 16-byte aligned. */
__device__ __forceinline__ void reduce_range(qt_reduce_args a, size_t n, int dt, int op, int vec, size_t tid,
                                             size_t stride) {
    size_t per = dt == QT_DT_F32 ? 4 : 8, nv = vec ? n / per : 0;
    if (dt == QT_DT_F32)
        for (size_t i = tid; i < nv; i += stride) vec_step(a, i, QT_DT_F32, op);
    else
        for (size_t i = tid; i < nv; i += stride) vec_step(a, i, QT_DT_BF16, op);
    for (size_t i = nv * per + tid; i < n; i += stride) {
        float acc = ld_one(a.src[0], i, dt);
#pragma unroll
        for (int k = 1; k < QT_COMM_MAX_RANKS; k++) /* constant indices: the pointers stay in registers */
            if (k < a.nsrc) acc = red_op(acc, ld_one(a.src[k], i, dt), op);
#pragma unroll
        for (int k = 0; k < QT_COMM_MAX_RANKS; k++) {
            if (k >= a.ndst) break;
            if (dt == QT_DT_F32) ((float *)a.dst[k])[i] = acc;
            else ((uint16_t *)a.dst[k])[i] = to_bf16(acc);
        }
    }
}

#endif
