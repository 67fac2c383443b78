/* lora.cu — one LoRA module beside its base matmul (qt_lora_kernels.h): the two thin products of the forward, the
 * adapter gradients and the input gradient's adapter term, as cuBLASLt GEMMs (qt_matmul.h: bf16 operands, fp32
 * accumulation, one RNE of each output), and the dropout mask's two elementwise passes.
 *
 * A [r, in] and B [out, r] are the bf16 copies of the fp32 adapters; ks = 1/(1-p) (1 when p == 0); m the 0/1 keep
 * mask hashed from (mseed, n*in + i) exactly as qt_lora_mask on the CPU; xm = x * m (exact in bf16), x itself
 * when p == 0.
 *   fwd  u[N,r] (bf16, =)  = ks * xm A^T                  y[n, row0+o] (bf16, +=) += scale * (u B^T)[n,o]
 *   bwd  g[N,r] (bf16, =)  = scale * dy_m B               dB[out,r] (fp32, +=) += scale * dy_m^T u
 *        dA[r,in] (fp32, +=) += ks * g^T xm               dx[N,in] (bf16, +=) += ks * m * (g A)
 * dy_m: dy's columns [row0, row0 + out) of its row stride ld. The scales ride on the GEMMs' alpha (fp32, before the
 * one rounding of the output). Each GEMM's algorithm is the matmul context's pick for its shape (fixed per process,
 * recorded), so launches give the same bits; no atomics. */
#include "kcommon.cuh"
#include "qt_lora_kernels.h"
#include "qt_matmul.h"

/* qt_hash64 (src/core/rng.c): splitmix64 of seed ^ i * 0xd1342543de82ef95. */
static __device__ __forceinline__ uint64_t lora_hash64(uint64_t seed, uint64_t i) {
    uint64_t z = (seed ^ (i * 0xd1342543de82ef95ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* qt_lora_mask's keep test: 1 when element j is kept at rate p (p > 0), else 0. */
static __device__ __forceinline__ bool lora_keep(uint64_t mseed, uint64_t j, float p) {
    return (double)(lora_hash64(mseed, j) >> 11) * 0x1.0p-53 >= (double)p;
}

/* xm[e] = m[e] ? x[e] : 0 over the n elements of x [N, in] (=, exact). */
__global__ void lora_mask_kernel(bf16 *xm, const bf16 *x, long long n, float p, uint64_t mseed) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        xm[e] = lora_keep(mseed, (uint64_t)e, p) ? x[e] : __float2bfloat16_rn(0.0f);
}

/* dx[e] = RNE(dx[e] + t[e]) where m[e], else dx[e] untouched (t holds ks * (g A), bf16). */
__global__ void lora_mask_add_kernel(bf16 *dx, const bf16 *t, long long n, float p, uint64_t mseed) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        if (lora_keep(mseed, (uint64_t)e, p)) dx[e] = __float2bfloat16_rn(__bfloat162float(dx[e]) + __bfloat162float(t[e]));
}

static float keep_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

/* The GEMMs' input xm: x itself when p == 0, else x masked into ws. */
static const void *masked(void *ws, const void *x, long N, int in, float p, uint64_t mseed, cudaStream_t s) {
    if (p <= 0.0f) return x;
    long long n = (long long)N * in;
    lora_mask_kernel<<<qt_grid_for(n, 256), 256, 0, s>>>((bf16 *)ws, (const bf16 *)x, n, p, mseed);
    QT_CUDA(cudaGetLastError());
    return ws;
}

extern "C" size_t qt_lora_ws_bytes(long N, int in, float p) { return p > 0.0f ? (size_t)N * in * sizeof(bf16) : 0; }

extern "C" void qt_lora_down_fwd(qt_matmul_ctx *mm, void *u, void *ws, const void *x, const void *A, long N, int in,
                                 int r, float p, uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    const void *xm = masked(ws, x, N, in, p, mseed, s);
    qt_matmul_fwd_ld(mm, u, QT_DT_BF16, r, xm, in, A, N, in, r, keep_scale(p), 0, s);
}

extern "C" void qt_lora_up_fwd(qt_matmul_ctx *mm, void *y, const void *u, const void *B, long N, int out, int r,
                               int row0, int ld, float scale, cudaStream_t s) {
    if (N <= 0) return;
    qt_matmul_fwd_ld(mm, (bf16 *)y + row0, QT_DT_BF16, ld, u, r, B, N, r, out, scale, 1, s);
}

extern "C" void qt_lora_bwd_w(qt_matmul_ctx *mm, void *g, float *dA, float *dB, void *ws, const void *dy, const void *u,
                              const void *x, const void *B, long N, int in, int out, int r, int row0, int ld,
                              float scale, float p, uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    const bf16 *dym = (const bf16 *)dy + row0;
    qt_matmul_dgrad_ld(mm, g, QT_DT_BF16, r, dym, ld, B, N, r, out, scale, 0, s);
    qt_matmul_wgrad_ld(mm, dB, QT_DT_F32, dym, ld, u, r, N, r, out, scale, 1, s);
    if (x) qt_lora_bwd_a(mm, dA, ws, g, x, N, in, r, p, mseed, s);
}

extern "C" void qt_lora_bwd_a(qt_matmul_ctx *mm, float *dA, void *ws, const void *g, const void *x, long N, int in,
                              int r, float p, uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    const void *xm = masked(ws, x, N, in, p, mseed, s);
    qt_matmul_wgrad_ld(mm, dA, QT_DT_F32, g, r, xm, in, N, in, r, keep_scale(p), 1, s);
}

extern "C" void qt_lora_bwd_x(qt_matmul_ctx *mm, void *dx, void *ws, const void *g, const void *A, long N, int in,
                              int r, float p, uint64_t mseed, cudaStream_t s) {
    if (N <= 0) return;
    if (p <= 0.0f) { /* every input kept: the GEMM adds into dx itself */
        qt_matmul_dgrad_ld(mm, dx, QT_DT_BF16, in, g, r, A, N, in, r, 1.0f, 1, s);
        return;
    }
    long long n = (long long)N * in;
    qt_matmul_dgrad_ld(mm, ws, QT_DT_BF16, in, g, r, A, N, in, r, keep_scale(p), 0, s);
    lora_mask_add_kernel<<<qt_grid_for(n, 256), 256, 0, s>>>((bf16 *)dx, (const bf16 *)ws, n, p, mseed);
    QT_CUDA(cudaGetLastError());
}
