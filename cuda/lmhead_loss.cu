/* lmhead_loss.cu — fused softmax cross-entropy over a chunk of LM-head logits, writing dlogits in place.
 *
 * logits[n,v] bf16, tgt[n] int32 -> loss[n] fp32 (=), lse[n] fp32 (=, optional) and, over the logits,
 * dlogits[n,v] = bf16(scale * (softmax - onehot(tgt)))  (one RNE rounding).
 * One block per row, two passes over the row: (1) an online max / sum-of-exponentials per thread,
 * combined over the block in a fixed tree (fp32), lse = max + log(sum); (2) p = exp(x - lse) and the
 * in-place write. fp32 math throughout; exponentials via exp2f on prescaled arguments. 16-byte vectors
 * when v % 8 == 0 and logits is 16-byte aligned. Rows with tgt < 0 are ignored (loss 0, lse 0, dlogits
 * 0); tgt >= v gives loss NaN and dlogits 0 so that the bad target cannot go unnoticed.
 * qt_sum_f32: one block, fp64 accumulation in a fixed order. */
#include "kcommon.cuh"
#include "qt_kernels.h"

#define LM_THREADS 512
#define L2E 1.4426950408889634f

/* Merges (m2, s2) into (m, s): both are max and sum of exp(x - max) over disjoint sets. */
static __device__ __forceinline__ void ms_merge(float *m, float *s, float m2, float s2) {
    float M = fmaxf(*m, m2);
    if (M == -INFINITY) return; /* both empty */
    *s = *s * exp2f((*m - M) * L2E) + s2 * exp2f((m2 - M) * L2E);
    *m = M;
}

__global__ void lmhead_loss_fwd_kernel(bf16 *logits, float *loss, float *lse_out, const int32_t *tgt, int v,
                                       float scale, int vec) {
    __shared__ float shm[32], shs[32];
    __shared__ float sh_lse;
    long long row = blockIdx.x;
    bf16 *x = logits + row * v;
    int t = tgt[row];
    if (t < 0 || t >= v) { /* ignored row (or a bad target): zero gradient */
        for (int j = threadIdx.x; j < v; j += blockDim.x) x[j] = __float2bfloat16_rn(0.0f);
        if (threadIdx.x == 0) {
            loss[row] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
            if (lse_out) lse_out[row] = 0.0f;
        }
        return;
    }
    float xt = __bfloat162float(x[t]); /* read before pass 2 overwrites it */
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float a[8];
            ld8(a, x + j);
            float mx = a[0];
#pragma unroll
            for (int i = 1; i < 8; i++) mx = fmaxf(mx, a[i]);
            if (mx > m) {
                s = m == -INFINITY ? 0.0f : s * exp2f((m - mx) * L2E);
                m = mx;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) s += exp2f((a[i] - m) * L2E);
        }
    } else {
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float a = __bfloat162float(x[j]);
            if (a > m) {
                s = m == -INFINITY ? 0.0f : s * exp2f((m - a) * L2E);
                m = a;
            }
            s += exp2f((a - m) * L2E);
        }
    }
    /* Fixed-shape tree: warp shuffles, then warp 0 over the per-warp pairs. */
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(&m, &s, m2, s2);
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { shm[wid] = m; shs[wid] = s; }
    __syncthreads();
    if (wid == 0) {
        m = lane < nw ? shm[lane] : -INFINITY;
        s = lane < nw ? shs[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(&m, &s, m2, s2);
        }
        if (lane == 0) {
            float l = m + logf(s);
            sh_lse = l;
            loss[row] = l - xt;
            if (lse_out) lse_out[row] = l;
        }
    }
    __syncthreads();
    float l = sh_lse;
    if (vec) {
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float a[8];
            ld8(a, x + j);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = scale * (exp2f((a[i] - l) * L2E) - (j + i == t ? 1.0f : 0.0f));
            st8(x + j, a);
        }
    } else {
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float p = exp2f((__bfloat162float(x[j]) - l) * L2E);
            x[j] = __float2bfloat16_rn(scale * (p - (j == t ? 1.0f : 0.0f)));
        }
    }
}

__global__ void sum_fwd_kernel(double *sum, const float *x, long n) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) acc += (double)x[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *sum += acc;
}

extern "C" void qt_lmhead_loss(void *logits, float *loss, float *lse, const int32_t *tgt, long n, int v,
                               float scale, cudaStream_t s) {
    QT_CHECK(n < 2147483647L, "lmhead loss: chunk of %ld rows: expected fewer than 2^31", n);
    if (n <= 0 || v <= 0) return;
    int vec = v % 8 == 0 && qt_aligned16(logits);
    lmhead_loss_fwd_kernel<<<(unsigned)n, LM_THREADS, 0, s>>>((bf16 *)logits, loss, lse, tgt, v, scale, vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_sum_f32(double *sum, const float *x, long n, cudaStream_t s) {
    if (n <= 0) return;
    sum_fwd_kernel<<<1, 1024, 0, s>>>(sum, x, n);
    QT_CUDA(cudaGetLastError());
}
