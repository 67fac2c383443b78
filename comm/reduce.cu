/* reduce.cu — the reduction of comm: dst[i] = src_0[i] (+ or max) src_1[i] ... src_{k-1}[i].
 *
 * Shapes: nsrc (<= QT_COMM_MAX_RANKS) flat arrays of n elements (64-bit n), fp32 or bf16.
 * Accumulates in fp32 in ascending source order (acc = x_0, then acc = acc op x_k), rounds once to the
 * output dtype (RNE), so the result is bitwise the CPU's (comm.c cpu_reduce) and the same on all ranks.
 * Max propagates NaN. When every pointer is 16-byte aligned each thread moves 16 bytes per source;
 * the tail (and unaligned calls) go element by element. Grid-stride, memory-bound. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_comm.h"
#include "qt_error.h"

typedef struct {
    const void *src[QT_COMM_MAX_RANKS];
} qt_reduce_srcs;

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
        for (int k = 0; k < 4; k++) v[k] = __uint_as_float(w[k]);
    } else {
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
}

__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

__global__ void reduce_fwd_kernel(qt_reduce_srcs a, void *dst, int nsrc, size_t n, int dt, int op, int vec) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t per = dt == QT_DT_F32 ? 4 : 8, nv = vec ? n / per : 0;
    for (size_t i = tid; i < nv; i += stride) {
        float acc[8], v[8];
        unpack(((const uint4 *)a.src[0])[i], dt, acc);
        for (int k = 1; k < nsrc; k++) {
            unpack(((const uint4 *)a.src[k])[i], dt, v);
            for (int e = 0; e < (int)per; e++) acc[e] = red_op(acc[e], v[e], op);
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
        ((uint4 *)dst)[i] = o;
    }
    for (size_t i = nv * per + tid; i < n; i += stride) {
        float acc = ld_one(a.src[0], i, dt);
        for (int k = 1; k < nsrc; k++) acc = red_op(acc, ld_one(a.src[k], i, dt), op);
        if (dt == QT_DT_F32) ((float *)dst)[i] = acc;
        else ((uint16_t *)dst)[i] = to_bf16(acc);
    }
}

extern "C" void qt_comm_reduce_launch(qt_dtype dt, void *dst, const void *const *srcs, int nsrc, size_t n,
                                      qt_comm_op op, cudaStream_t s) {
    QT_CHECK(dt == QT_DT_F32 || dt == QT_DT_BF16, "comm reduce: dtype %s, expected fp32 or bf16", qt_dtype_name(dt));
    QT_CHECK(nsrc >= 1 && nsrc <= QT_COMM_MAX_RANKS, "comm reduce: %d sources", nsrc);
    if (!n) return;
    qt_reduce_srcs a;
    int vec = ((uintptr_t)dst & 15) == 0;
    for (int k = 0; k < QT_COMM_MAX_RANKS; k++) a.src[k] = k < nsrc ? srcs[k] : NULL;
    for (int k = 0; k < nsrc; k++) vec &= ((uintptr_t)srcs[k] & 15) == 0;
    size_t per = dt == QT_DT_F32 ? 4 : 8, work = vec ? n / per + n % per : n;
    size_t blocks = (work + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    reduce_fwd_kernel<<<(unsigned)blocks, 256, 0, s>>>(a, dst, nsrc, n, (int)dt, (int)op, vec);
    QT_CUDA(cudaGetLastError());
}
