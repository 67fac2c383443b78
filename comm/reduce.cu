/* reduce.cu — the reduction of comm: dst[i] = src_0[i] (+ or max) src_1[i] ... src_{k-1}[i], stored
 * to one or several destinations (the fused all-reduce stores each result into every rank's dst).
 *
 * Shapes: nsrc and ndst (<= QT_COMM_MAX_RANKS) flat arrays of n elements (64-bit n), fp32 or bf16.
 * Accumulates in fp32 in ascending source order (acc = x_0, then acc = acc op x_k), rounds once to the
 * output dtype (RNE), so the result is bitwise the CPU's (comm.c cpu_reduce) and the same on all ranks.
 * Max propagates NaN. When every pointer is 16-byte aligned each thread moves 16 bytes per source;
 * the tail (and unaligned calls) go element by element. Grid-stride, memory-bound. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_comm.h"
#include "qt_error.h"
#include "reduce.cuh"

__global__ void reduce_fwd_kernel(qt_reduce_args a, size_t n, int dt, int op, int vec) {
    reduce_range(a, n, dt, op, vec, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
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
