/* lora.cu — one LoRA module beside its base matmul (qt_lora_kernels.h): the two thin products of the forward,
 * the adapter gradients and the input gradient's adapter term.
 *
 * fwd: u[N,r] = xd[N,in] A[r,in]^T  (fp32, =);  y[n, row0+o] += scale * sum_k u[n,k] B[o,k]  (bf16, +=)
 * bwd: g[N,r] = scale * dy_m B, dB += scale * dy_m^T u, dA += g^T xd  (fp32);  dx += mask * (g A)  (bf16, +=)
 * xd = x * mask: the dropout mask hashed from (mseed, n*in + i) exactly as qt_lora_mask on the CPU.
 * Every sum is fp32 in a fixed order (a warp tree over a row, or one thread's loop over the tokens), so the
 * results are the same bits launch after launch; bf16 outputs take one RNE of (old + fp32 term). Rank r is
 * small (8..64): these are memory-bound passes, LORA_ROWS token rows per block for the row products; the token sums
 * (dB, dA) in QT_LORA_CHUNKS chunks of the tokens, then the chunks' partial sums added in order. */
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

/* The row products run LORA_ROWS token rows per block or thread, so that each element of A or B read from the
 * cache serves that many rows; every output element keeps its own sum order (one row's). */
#define LORA_ROWS 8

/* One block per LORA_ROWS token rows, one warp per rank index k (strided): u[n,k] = sum_i xd[n,i] A[k,i], each
 * row's sum lane-strided over i, then a warp tree. */
__global__ void lora_down_fwd_kernel(float *u, const bf16 *x, const float *A, long N, int in, int r, float p,
                                     float ks, uint64_t mseed) {
    long n0 = (long)blockIdx.x * LORA_ROWS;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5, rows = N - n0 < LORA_ROWS ? (int)(N - n0) : LORA_ROWS;
    for (int k = wid; k < r; k += nw) {
        const float *Ak = A + (size_t)k * in;
        float acc[LORA_ROWS] = {0};
        for (int i = lane; i < in; i += 32) {
            float a = Ak[i];
#pragma unroll
            for (int j = 0; j < LORA_ROWS; j++) {
                if (j >= rows) break;
                uint64_t e = (uint64_t)(n0 + j) * in + i;
                acc[j] += __bfloat162float(x[e]) * lora_mask(mseed, e, p, ks) * a;
            }
        }
#pragma unroll
        for (int j = 0; j < LORA_ROWS; j++) {
            if (j >= rows) break;
            float v = warp_sum(acc[j]);
            if (lane == 0) u[(size_t)(n0 + j) * r + k] = v;
        }
    }
}

/* One thread per (o, LORA_ROWS rows): y[n, row0+o] += scale * sum_k u[n,k] B[o,k]. */
__global__ void lora_up_fwd_kernel(bf16 *y, const float *u, const float *B, long N, int out, int r, int row0, int ld,
                                   float scale) {
    long groups = (N + LORA_ROWS - 1) / LORA_ROWS;
    long long total = (long long)groups * out;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long n0 = (long)(t / out) * LORA_ROWS;
        int o = (int)(t % out), rows = N - n0 < LORA_ROWS ? (int)(N - n0) : LORA_ROWS;
        const float *Bo = B + (size_t)o * r;
        float acc[LORA_ROWS] = {0};
        for (int k = 0; k < r; k++) {
            float b = Bo[k];
#pragma unroll
            for (int j = 0; j < LORA_ROWS; j++)
                if (j < rows) acc[j] += u[(size_t)(n0 + j) * r + k] * b;
        }
#pragma unroll
        for (int j = 0; j < LORA_ROWS; j++) {
            if (j >= rows) break;
            bf16 *yp = y + (size_t)(n0 + j) * ld + row0 + o;
            *yp = __float2bfloat16_rn(__bfloat162float(*yp) + scale * acc[j]);
        }
    }
}

/* One block per LORA_ROWS token rows, one warp per k: g[n,k] = scale * sum_o dy[n, row0+o] B[o,k]. */
__global__ void lora_g_kernel(float *g, const bf16 *dy, const float *B, long N, int out, int r, int row0, int ld,
                              float scale) {
    long n0 = (long)blockIdx.x * LORA_ROWS;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5, rows = N - n0 < LORA_ROWS ? (int)(N - n0) : LORA_ROWS;
    for (int k = wid; k < r; k += nw) {
        float acc[LORA_ROWS] = {0};
        for (int o = lane; o < out; o += 32) {
            float b = B[(size_t)o * r + k];
#pragma unroll
            for (int j = 0; j < LORA_ROWS; j++)
                if (j < rows) acc[j] += __bfloat162float(dy[(size_t)(n0 + j) * ld + row0 + o]) * b;
        }
#pragma unroll
        for (int j = 0; j < LORA_ROWS; j++) {
            if (j >= rows) break;
            float v = warp_sum(acc[j]);
            if (lane == 0) g[(size_t)(n0 + j) * r + k] = scale * v;
        }
    }
}

/* The token sums dB and dA, in two passes so that no thread walks all N tokens: pass 1, one thread per (chunk c,
 * k, a), a fastest (P's row reads coalesce): part[c][k][a] = sum over the chunk's tokens n in order of
 * P[n * ld + a] * mask * Q[n, k], P bf16 (dy's module rows, or x), Q fp32 [N, r] (u, or g), the mask x's dropout
 * (p 0: none); pass 2, one thread per (k, a): the QT_LORA_CHUNKS partial sums added in chunk order. */
__global__ void lora_tsum_part_kernel(float *part, const bf16 *P, const float *Q, long N, int dim, int ld, int r,
                                      long chunk, float p, float ks, uint64_t mseed) {
    long long total = (long long)dim * r;
    int c = blockIdx.y;
    long n0 = c * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t / dim), a = (int)(t - (long long)k * dim);
        float acc = 0.0f;
        for (long n = n0; n < n1; n++) {
            uint64_t j = (uint64_t)n * ld + a;
            acc += __bfloat162float(P[j]) * lora_mask(mseed, j, p, ks) * Q[(size_t)n * r + k];
        }
        part[(size_t)c * total + t] = acc;
    }
}

/* dst[k, a] (k_major) or dst[a, k] += scale * sum_c part[c][k][a]. */
__global__ void lora_tsum_add_kernel(float *dst, const float *part, int dim, int r, int k_major, float scale) {
    long long total = (long long)dim * r;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t / dim), a = (int)(t - (long long)k * dim);
        float acc = 0.0f;
        for (int c = 0; c < QT_LORA_CHUNKS; c++) acc += part[(size_t)c * total + t];
        dst[k_major ? t : (size_t)a * r + k] += scale * acc;
    }
}

static void token_sum(float *dst, int k_major, float scale, float *part, const bf16 *P, const float *Q, long N, int dim,
                      int ld, int r, float p, float ks, uint64_t mseed, cudaStream_t s) {
    long long total = (long long)dim * r;
    dim3 grid(qt_grid_for(total, 128), QT_LORA_CHUNKS);
    lora_tsum_part_kernel<<<grid, 128, 0, s>>>(part, P, Q, N, dim, ld, r, (N + QT_LORA_CHUNKS - 1) / QT_LORA_CHUNKS, p,
                                               ks, mseed);
    QT_CUDA(cudaGetLastError());
    lora_tsum_add_kernel<<<qt_grid_for(total, 256), 256, 0, s>>>(dst, part, dim, r, k_major, scale);
    QT_CUDA(cudaGetLastError());
}

/* One thread per (i, LORA_ROWS rows): dx[n,i] += mask * sum_k g[n,k] A[k,i]. */
__global__ void lora_dx_kernel(bf16 *dx, const float *g, const float *A, long N, int in, int r, float p, float ks,
                               uint64_t mseed) {
    long groups = (N + LORA_ROWS - 1) / LORA_ROWS;
    long long total = (long long)groups * in;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long n0 = (long)(t / in) * LORA_ROWS;
        int i = (int)(t % in), rows = N - n0 < LORA_ROWS ? (int)(N - n0) : LORA_ROWS;
        float acc[LORA_ROWS] = {0};
        for (int k = 0; k < r; k++) {
            float a = A[(size_t)k * in + i];
#pragma unroll
            for (int j = 0; j < LORA_ROWS; j++)
                if (j < rows) acc[j] += g[(size_t)(n0 + j) * r + k] * a;
        }
#pragma unroll
        for (int j = 0; j < LORA_ROWS; j++) {
            if (j >= rows) break;
            size_t e = (size_t)(n0 + j) * in + i;
            dx[e] = __float2bfloat16_rn(__bfloat162float(dx[e]) + lora_mask(mseed, e, p, ks) * acc[j]);
        }
    }
}

static float keep_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

extern "C" void qt_lora_down_fwd(float *u, const void *x, const float *A, long N, int in, int r, float p,
                                 uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    lora_down_fwd_kernel<<<(unsigned)((N + LORA_ROWS - 1) / LORA_ROWS), 256, 0, s>>>(u, (const bf16 *)x, A, N, in, r, p, keep_scale(p), mseed);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_lora_up_fwd(void *y, const float *u, const float *B, long N, int out, int r, int row0, int ld,
                               float scale, cudaStream_t s) {
    if (N <= 0) return;
    lora_up_fwd_kernel<<<qt_grid_for((N + LORA_ROWS - 1) / LORA_ROWS * (long long)out, 256), 256, 0, s>>>((bf16 *)y, u, B, N, out, r, row0, ld, scale);
    QT_CUDA(cudaGetLastError());
}

extern "C" size_t qt_lora_part_bytes(int dim, int r) { return (size_t)QT_LORA_CHUNKS * dim * r * sizeof(float); }

extern "C" void qt_lora_bwd_w(float *g, float *dA, float *dB, float *part, const void *dy, const float *u, const void *x,
                              const float *B, long N, int in, int out, int r, int row0, int ld, float scale, float p,
                              uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    lora_g_kernel<<<(unsigned)((N + LORA_ROWS - 1) / LORA_ROWS), 256, 0, s>>>(g, (const bf16 *)dy, B, N, out, r, row0, ld, scale);
    QT_CUDA(cudaGetLastError());
    token_sum(dB, 0, scale, part, (const bf16 *)dy + row0, u, N, out, ld, r, 0.0f, 1.0f, 0, s);
    if (x) qt_lora_bwd_a(dA, part, g, x, N, in, r, p, mseed, s);
}

extern "C" void qt_lora_bwd_a(float *dA, float *part, const float *g, const void *x, long N, int in, int r, float p,
                              uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    token_sum(dA, 1, 1.0f, part, (const bf16 *)x, g, N, in, in, r, p, keep_scale(p), mseed, s);
}

extern "C" void qt_lora_bwd_x(void *dx, const float *g, const float *A, long N, int in, int r, float p, uint64_t mseed,
                              cudaStream_t s) {
    if (N <= 0) return;
    lora_dx_kernel<<<qt_grid_for((N + LORA_ROWS - 1) / LORA_ROWS * (long long)in, 256), 256, 0, s>>>((bf16 *)dx, g, A, N, in, r, p, keep_scale(p), mseed);
    QT_CUDA(cudaGetLastError());
}
