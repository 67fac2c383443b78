/* reduce.cu — the reduction of comm: dst[i] = src_0[i] (+ or max) src_1[i] ... src_{k-1}[i], stored
 * to one or several destinations (the fused all-reduce stores each result into every rank's dst).
 *
 * Shapes: nsrc and ndst (<= QT_COMM_MAX_RANKS) flat arrays of n elements (64-bit n), fp32 or bf16.
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

__global__ void reduce_fwd_kernel(qt_reduce_args a, size_t n, int dt, int op, int vec) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
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

extern "C" void qt_comm_reduce_launch(qt_dtype dt, void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                                      int remote, size_t n, qt_comm_op op, cudaStream_t s) {
    QT_CHECK(dt == QT_DT_F32 || dt == QT_DT_BF16, "comm reduce: dtype %s, expected fp32 or bf16", qt_dtype_name(dt));
    QT_CHECK(nsrc >= 1 && nsrc <= QT_COMM_MAX_RANKS && ndst >= 1 && ndst <= QT_COMM_MAX_RANKS,
             "comm reduce: %d sources, %d destinations", nsrc, ndst);
    if (!n) return;
    qt_reduce_args a = {{0}};
    int vec = 1;
    a.nsrc = nsrc;
    a.ndst = ndst;
    for (int k = 0; k < nsrc; k++) {
        a.src[k] = srcs[k];
        vec &= ((uintptr_t)srcs[k] & 15) == 0;
    }
    for (int k = 0; k < ndst; k++) {
        a.dst[k] = dsts[k];
        vec &= ((uintptr_t)dsts[k] & 15) == 0;
    }
    size_t per = dt == QT_DT_F32 ? 4 : 8, work = vec ? n / per + n % per : n;
    /* Enough resident threads to keep ~MBs of loads in flight (NVLink latency), capped so big calls
     * grid-stride instead of paying block scheduling. With several peers loaded at once, fewer
     * loaders do better: every GPU also serves its peers' loads. 4 x H200, 256 MiB bf16 reduce-scatter
     * by loads: 288 GB/s with 4096 blocks, 310 with one block per SM (264 blocks of 128 threads: the
     * same); 2 x H200 (one peer) does best with the full grid (321 vs 311). In between (two peers,
     * not measured) 8 / remote^2 blocks per SM interpolates: 2 per SM. */
    size_t blocks = (work + 255) / 256, cap = 4096;
    if (remote >= 2) {
        int dev = 0, sms = 0;
        QT_CUDA(cudaGetDevice(&dev));
        QT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        cap = (size_t)sms * 8 / ((size_t)remote * remote);
        if (cap < (size_t)sms) cap = (size_t)sms;
    }
    if (blocks > cap) blocks = cap;
    reduce_fwd_kernel<<<(unsigned)blocks, 256, 0, s>>>(a, n, (int)dt, (int)op, vec);
    QT_CUDA(cudaGetLastError());
}
