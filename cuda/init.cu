/* init.cu — the seeded init's normals drawn on the GPU (QT_WSRC_INIT_GPU: a frozen base's start-up in the benches).
 *
 * dst[i] = std * N(0,1)(seed, first + i), N the hashed Box-Muller of qt_layout_init_range (src/core/layout.c): two
 * uniforms from qt_hash64(seed, 2j) and qt_hash64(seed, 2j + 1) (splitmix64 of seed ^ j * 0xd1342543de82ef95),
 * u1 in (0, 1], u2 in [0, 1), sqrt(-2 log u1) cos(2 pi u2) in fp64, rounded once to fp32 (RNE), times std in fp32.
 * The integer part, sqrt and the products are exact IEEE operations as on the host; CUDA's log and cos may differ
 * from the host's libm in the last bit of the double, which changes the fp32 result about once in 10^9 values: the
 * draw is the host's up to that, not bit for bit. One thread per element, grid-stride; flat [n], 64-bit sizes. */
#include "kcommon.cuh"
#include "qt_kernels.h"

static __device__ __forceinline__ uint64_t hash64(uint64_t seed, uint64_t i) {
    uint64_t z = (seed ^ (i * 0xd1342543de82ef95ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void init_normal_fwd_kernel(float *dst, size_t n, uint64_t seed, uint64_t first, float std) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        uint64_t i = first + k;
        double u1 = __dmul_rn((double)((hash64(seed, 2 * i) >> 11) + 1), 0x1.0p-53);
        double u2 = __dmul_rn((double)(hash64(seed, 2 * i + 1) >> 11), 0x1.0p-53);
        double r = __dsqrt_rn(__dmul_rn(-2.0, log(u1)));
        dst[k] = __fmul_rn(std, (float)__dmul_rn(r, cos(__dmul_rn(2.0 * 3.14159265358979323846, u2))));
    }
}

extern "C" void qt_init_normal(float *dst, size_t n, uint64_t seed, uint64_t first, float std, cudaStream_t s) {
    if (n == 0) return;
    init_normal_fwd_kernel<<<qt_grid_for((long long)n, 256), 256, 0, s>>>(dst, n, seed, first, std);
    QT_CUDA(cudaGetLastError());
}
