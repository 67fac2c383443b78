/* rmsnorm.cu — RMSNorm forward/backward fused with the residual add.
 *
 * fwd: res[n,c] = bf16(res + x) (when x is given), then y[n,c] = res * rstd * w[c],
 *      rstd[n] = 1/sqrt(mean(res^2) + eps) over the rounded res (the value the backward sees).
 * bwd: dx[n,c] += rstd * (dy*w - res * rstd^2 * mean(dy*w*res))   (dx fp32 or bf16: one rounding)
 *      dw[c]   += sum_n dy * res * rstd   (deterministic two-pass column reduction, colreduce.cuh)
 * bf16 storage, fp32 math, fp32 row sums over one warp's lanes in a fixed shuffle tree. One warp per
 * row; 16-byte vectors when c % 8 == 0 and the pointers are 16-byte aligned, scalar otherwise. */
#include "colreduce.cuh"
#include "qt_kernels.h"

#define RN_WARPS 8

__global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, bf16 *res, const bf16 *x, const bf16 *w, long n,
                                   int c, float eps, int vec) {
    long r = (long)blockIdx.x * RN_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= n) return;
    bf16 *rr = res + (long long)r * c, *yr = y + (long long)r * c;
    const bf16 *xr = x ? x + (long long)r * c : NULL;
    float ss = 0.0f;
    if (vec) {
        for (int j = lane * 8; j < c; j += 256) {
            float a[8], b[8];
            ld8(a, rr + j);
            if (xr) {
                ld8(b, xr + j);
#pragma unroll
                for (int i = 0; i < 8; i++) a[i] = __bfloat162float(__float2bfloat16_rn(a[i] + b[i]));
                st8(rr + j, a);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) ss += a[i] * a[i];
        }
    } else {
        for (int j = lane; j < c; j += 32) {
            float a = __bfloat162float(rr[j]);
            if (xr) {
                bf16 h = __float2bfloat16_rn(a + __bfloat162float(xr[j]));
                rr[j] = h;
                a = __bfloat162float(h);
            }
            ss += a * a;
        }
    }
    ss = warp_sum(ss);
    float rs = 1.0f / sqrtf(ss / (float)c + eps);
    if (lane == 0) rstd[r] = rs;
    /* Each lane re-reads only the res elements it wrote itself, so no fence is needed. */
    if (vec) {
        for (int j = lane * 8; j < c; j += 256) {
            float a[8], g[8];
            ld8(a, rr + j);
            ld8(g, w + j);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = a[i] * rs * g[i];
            st8(yr + j, a);
        }
    } else {
        for (int j = lane; j < c; j += 32)
            yr[j] = __float2bfloat16_rn(__bfloat162float(rr[j]) * rs * __bfloat162float(w[j]));
    }
}

__global__ void rmsnorm_bwd_kernel(void *dx, int dx_bf16, const bf16 *dy, const bf16 *res, const bf16 *w,
                                   const float *rstd, long n, int c, int vec) {
    long r = (long)blockIdx.x * RN_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= n) return;
    long long base = (long long)r * c;
    const bf16 *dyr = dy + base, *xr = res + base;
    float dot = 0.0f;
    if (vec) {
        for (int j = lane * 8; j < c; j += 256) {
            float d[8], a[8], g[8];
            ld8(d, dyr + j);
            ld8(a, xr + j);
            ld8(g, w + j);
#pragma unroll
            for (int i = 0; i < 8; i++) dot += d[i] * g[i] * a[i];
        }
    } else {
        for (int j = lane; j < c; j += 32)
            dot += __bfloat162float(dyr[j]) * __bfloat162float(w[j]) * __bfloat162float(xr[j]);
    }
    dot = warp_sum(dot);
    float rs = rstd[r], k = rs * rs * dot / (float)c;
    if (vec) {
        for (int j = lane * 8; j < c; j += 256) {
            float d[8], a[8], g[8], o[8];
            ld8(d, dyr + j);
            ld8(a, xr + j);
            ld8(g, w + j);
            if (dx_bf16) ld8(o, (const bf16 *)dx + base + j);
            else {
                const float4 *p = (const float4 *)((const float *)dx + base + j);
                float4 p0 = p[0], p1 = p[1];
                o[0] = p0.x; o[1] = p0.y; o[2] = p0.z; o[3] = p0.w;
                o[4] = p1.x; o[5] = p1.y; o[6] = p1.z; o[7] = p1.w;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] += rs * (d[i] * g[i] - a[i] * k);
            if (dx_bf16) st8((bf16 *)dx + base + j, o);
            else {
                float4 *p = (float4 *)((float *)dx + base + j);
                p[0] = make_float4(o[0], o[1], o[2], o[3]);
                p[1] = make_float4(o[4], o[5], o[6], o[7]);
            }
        }
    } else {
        for (int j = lane; j < c; j += 32) {
            float g = rs * (__bfloat162float(dyr[j]) * __bfloat162float(w[j]) - __bfloat162float(xr[j]) * k);
            if (dx_bf16) {
                bf16 *p = (bf16 *)dx + base + j;
                *p = __float2bfloat16_rn(__bfloat162float(*p) + g);
            } else ((float *)dx)[base + j] += g;
        }
    }
}

extern "C" void qt_rmsnorm_fwd(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c,
                               float eps, cudaStream_t s) {
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(y) && qt_aligned16(res) && qt_aligned16(w) && (!x || qt_aligned16(x));
    unsigned grid = (unsigned)((n + RN_WARPS - 1) / RN_WARPS);
    rmsnorm_fwd_kernel<<<grid, RN_WARPS * 32, 0, s>>>((bf16 *)y, rstd, (bf16 *)res, (const bf16 *)x,
                                                      (const bf16 *)w, n, c, eps, vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_rmsnorm_bwd(void *dx, qt_dtype dx_dt, float *dw, const void *dy, const void *res,
                               const void *w, const float *rstd, long n, int c, void *ws, cudaStream_t s) {
    QT_CHECK(dx_dt == QT_DT_F32 || dx_dt == QT_DT_BF16, "dx dtype %s: expected fp32 or bf16",
             qt_dtype_name(dx_dt));
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(dx) && qt_aligned16(dy) && qt_aligned16(res) && qt_aligned16(w);
    unsigned grid = (unsigned)((n + RN_WARPS - 1) / RN_WARPS);
    rmsnorm_bwd_kernel<<<grid, RN_WARPS * 32, 0, s>>>(dx, dx_dt == QT_DT_BF16, (const bf16 *)dy,
                                                      (const bf16 *)res, (const bf16 *)w, rstd, n, c, vec);
    QT_CUDA(cudaGetLastError());
    if (dw) qt_colreduce(dw, (const bf16 *)dy, (const bf16 *)res, rstd, n, c, ws, s);
}
