/* nonfinite.cu — counts the NaN/Inf values of a bf16 buffer: the per-step finiteness check of the
 * weights an optimizer step wrote (the engine reads the count back with the step's loss and norm).
 *
 * count (uint32, device) += #{i in [0, n): x[i] is NaN or +-Inf}, i.e. bf16 bits with an all-ones
 * exponent ((bits & 0x7f80) == 0x7f80). Integer counts: exact and order-free, so deterministic. A sum
 * that passes 2^32 - 1 saturates there (a block whose add wraps writes the maximum after it). One read
 * of 2 bytes per element: 16-byte loads when x is 16-byte aligned (the last n % 8 elements, or all of
 * them when misaligned, one by one); each block sums its threads' counts and adds once. */
#include "kcommon.cuh"
#include "qt_kernels.h"

static __device__ __forceinline__ unsigned bad_bf16(uint16_t b) { return (b & 0x7f80u) == 0x7f80u; }

__global__ void count_nonfinite_fwd_kernel(unsigned *count, const uint16_t *x, size_t n, int vec) {
    __shared__ unsigned block_total;
    if (threadIdx.x == 0) block_total = 0;
    __syncthreads();
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    unsigned c = 0;
    for (size_t k = tid; k < nv; k += stride) {
        uint4 v = ((const uint4 *)x)[k];
        unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) c += bad_bf16((uint16_t)w[j]) + bad_bf16((uint16_t)(w[j] >> 16));
    }
    for (size_t i = nv * 8 + tid; i < n; i += stride) c += bad_bf16(x[i]);
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o); /* integer: any order is exact */
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(&block_total, c);
    __syncthreads();
    unsigned total = block_total;
    if (threadIdx.x == 0 && total) {
        unsigned old = atomicAdd(count, total);
        if (old + total < old) atomicMax(count, 0xffffffffu);
    }
}

extern "C" void qt_count_nonfinite(unsigned *count, const void *x, size_t n, cudaStream_t s) {
    if (n == 0) return;
    const int threads = 256;
    int vec = qt_aligned16(x);
    unsigned blocks = qt_grid_for((long long)((vec ? n / 8 : n) + 1), threads);
    if (blocks > 1024) blocks = 1024; /* enough to stream at memory speed */
    count_nonfinite_fwd_kernel<<<blocks, threads, 0, s>>>(count, (const uint16_t *)x, n, vec);
    QT_CUDA(cudaGetLastError());
}
