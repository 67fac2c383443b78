/* lora.cu — one LoRA module beside its base matmul (qt_lora_kernels.h): the two thin products of the forward,
 * the adapter gradients and the input gradient's adapter term.
 *
 * fwd: u[N,r] = xd[N,in] A[r,in]^T  (fp32, =);  y[n, row0+o] += scale * sum_k u[n,k] B[o,k]  (bf16, +=)
 * bwd: g[N,r] = scale * dy_m B, dB += scale * dy_m^T u, dA += g^T xd  (fp32);  dx += mask * (g A)  (bf16, +=)
 * xd = x * mask: the dropout mask hashed from (mseed, n*in + i) exactly as qt_lora_mask on the CPU.
 * Every sum is fp32 in a fixed order (a warp tree over a row, or one thread's loop over the tokens), so the
 * results are the same bits launch after launch; bf16 outputs take one RNE of (old + fp32 term). Rank r is
 * small (8..64): these are memory-bound passes, one block per token row for the row products and one
 * thread per output element for the token sums. */
#include "kcommon.cuh"
#include "qt_lora_kernels.h"

/* qt_hash64 (src/core/rng.c): splitmix64 of seed ^ i * 0xd1342543de82ef95. */
static __device__ __forceinline__ uint64_t lora_hash64(uint64_t seed, uint64_t i) {
    uint64_t z = (seed ^ (i * 0xd1342543de82ef95ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* qt_lora_mask: 0 with probability p, else ks; 1 when p == 0. */
static __device__ __forceinline__ float lora_mask(uint64_t mseed, uint64_t j, float p, float ks) {
    if (p <= 0.0f) return 1.0f;
    return (double)(lora_hash64(mseed, j) >> 11) * 0x1.0p-53 >= (double)p ? ks : 0.0f;
}

/* One block per token row n, one warp per rank index k (strided): u[n,k] = sum_i xd[n,i] A[k,i]. */
__global__ void lora_down_fwd_kernel(float *u, const bf16 *x, const float *A, long N, int in, int r, float p,
                                     float ks, uint64_t mseed) {
    long n = blockIdx.x;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const bf16 *xr = x + (size_t)n * in;
    for (int k = wid; k < r; k += nw) {
        const float *Ak = A + (size_t)k * in;
        float acc = 0.0f;
        for (int i = lane; i < in; i += 32)
            acc += __bfloat162float(xr[i]) * lora_mask(mseed, (uint64_t)n * in + i, p, ks) * Ak[i];
        acc = warp_sum(acc);
        if (lane == 0) u[(size_t)n * r + k] = acc;
    }
}

/* One thread per (n, o). */
__global__ void lora_up_fwd_kernel(bf16 *y, const float *u, const float *B, long N, int out, int r, int row0, int ld,
                                   float scale) {
    long long total = (long long)N * out;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long long n = t / out;
        int o = (int)(t - n * out);
        const float *un = u + n * r, *Bo = B + (size_t)o * r;
        float acc = 0.0f;
        for (int k = 0; k < r; k++) acc += un[k] * Bo[k];
        bf16 *yp = y + n * ld + row0 + o;
        *yp = __float2bfloat16_rn(__bfloat162float(*yp) + scale * acc);
    }
}

/* One block per token row n, one warp per k: g[n,k] = scale * sum_o dy[n, row0+o] B[o,k]. */
__global__ void lora_g_kernel(float *g, const bf16 *dy, const float *B, long N, int out, int r, int row0, int ld,
                              float scale) {
    long n = blockIdx.x;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const bf16 *dr = dy + (size_t)n * ld + row0;
    for (int k = wid; k < r; k += nw) {
        float acc = 0.0f;
        for (int o = lane; o < out; o += 32) acc += __bfloat162float(dr[o]) * B[(size_t)o * r + k];
        acc = warp_sum(acc);
        if (lane == 0) g[(size_t)n * r + k] = scale * acc;
    }
}

/* One thread per (o, k), o fastest (dy's row reads coalesce): dB[o,k] += scale * sum_n dy[n, row0+o] u[n,k]. */
__global__ void lora_db_kernel(float *dB, const bf16 *dy, const float *u, long N, int out, int r, int row0, int ld,
                               float scale) {
    long long total = (long long)out * r;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t / out), o = (int)(t - (long long)k * out);
        float acc = 0.0f;
        for (long n = 0; n < N; n++) acc += __bfloat162float(dy[(size_t)n * ld + row0 + o]) * u[(size_t)n * r + k];
        dB[(size_t)o * r + k] += scale * acc;
    }
}

/* One thread per (k, i), i fastest: dA[k,i] += sum_n g[n,k] xd[n,i]. */
__global__ void lora_da_kernel(float *dA, const float *g, const bf16 *x, long N, int in, int r, float p, float ks,
                               uint64_t mseed) {
    long long total = (long long)r * in;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t / in), i = (int)(t - (long long)k * in);
        float acc = 0.0f;
        for (long n = 0; n < N; n++) {
            uint64_t j = (uint64_t)n * in + i;
            acc += g[(size_t)n * r + k] * (__bfloat162float(x[j]) * lora_mask(mseed, j, p, ks));
        }
        dA[(size_t)k * in + i] += acc;
    }
}

/* One thread per (n, i): dx[n,i] += mask * sum_k g[n,k] A[k,i]. */
__global__ void lora_dx_kernel(bf16 *dx, const float *g, const float *A, long N, int in, int r, float p, float ks,
                               uint64_t mseed) {
    long long total = (long long)N * in;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long long n = t / in;
        int i = (int)(t - n * in);
        float acc = 0.0f;
        for (int k = 0; k < r; k++) acc += g[n * r + k] * A[(size_t)k * in + i];
        dx[t] = __float2bfloat16_rn(__bfloat162float(dx[t]) + lora_mask(mseed, (uint64_t)t, p, ks) * acc);
    }
}

static float keep_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

extern "C" void qt_lora_down_fwd(float *u, const void *x, const float *A, long N, int in, int r, float p,
                                 uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    lora_down_fwd_kernel<<<(unsigned)N, 256, 0, s>>>(u, (const bf16 *)x, A, N, in, r, p, keep_scale(p), mseed);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_lora_up_fwd(void *y, const float *u, const float *B, long N, int out, int r, int row0, int ld,
                               float scale, cudaStream_t s) {
    if (N <= 0) return;
    lora_up_fwd_kernel<<<qt_grid_for((long long)N * out, 256), 256, 0, s>>>((bf16 *)y, u, B, N, out, r, row0, ld, scale);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_lora_bwd_w(float *g, float *dA, float *dB, const void *dy, const float *u, const void *x,
                              const float *B, long N, int in, int out, int r, int row0, int ld, float scale, float p,
                              uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    lora_g_kernel<<<(unsigned)N, 256, 0, s>>>(g, (const bf16 *)dy, B, N, out, r, row0, ld, scale);
    QT_CUDA(cudaGetLastError());
    lora_db_kernel<<<qt_grid_for((long long)out * r, 128), 128, 0, s>>>(dB, (const bf16 *)dy, u, N, out, r, row0, ld, scale);
    QT_CUDA(cudaGetLastError());
    if (x) qt_lora_bwd_a(dA, g, x, N, in, r, p, mseed, s);
}

extern "C" void qt_lora_bwd_a(float *dA, const float *g, const void *x, long N, int in, int r, float p, uint64_t mseed,
                              cudaStream_t s) {
    if (N <= 0) return;
    lora_da_kernel<<<qt_grid_for((long long)r * in, 128), 128, 0, s>>>(dA, g, (const bf16 *)x, N, in, r, p,
                                                                         keep_scale(p), mseed);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_lora_bwd_x(void *dx, const float *g, const float *A, long N, int in, int r, float p, uint64_t mseed,
                              cudaStream_t s) {
    if (N <= 0) return;
    lora_dx_kernel<<<qt_grid_for((long long)N * in, 256), 256, 0, s>>>((bf16 *)dx, g, A, N, in, r, p, keep_scale(p), mseed);
    QT_CUDA(cudaGetLastError());
}
