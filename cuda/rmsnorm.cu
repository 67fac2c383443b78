/* rmsnorm.cu — RMSNorm forward/backward fused with the residual add.
 *
 * fwd: res[n,c] = bf16(res + x) (when x is given), then y[n,c] = res * rstd * w[c] (the 1p entries, Gemma3RMSNorm:
 *      res * rstd * (1 + w[c]), the scale formed in fp32, everywhere w appears below),
 *      rstd[n] = 1/sqrt(mean(res^2) + eps) over the rounded res (the value the backward sees).
 * bwd: dx[n,c] += rstd * (dy*w - res * rstd^2 * mean(dy*w*res))   (dx fp32 or bf16: one rounding),
 *      optionally also written as bf16 (RNE of the new dx) for the next matmuls
 *      dw[c]   += sum_n dy * res * rstd, in the same pass (dy and res read once): each block sums its
 *      row chunk per warp in shared memory, then per block in warp order into ws; a second kernel adds
 *      the block partials in a fixed tree, then that fp32 sum to dw (fp32, or bf16: one RNE of the sum). Deterministic: the partition depends on (n, c) only. When
 *      one row of accumulators does not fit in shared memory, the colreduce.cuh two-pass instead.
 * bf16 storage, fp32 math, fp32 row sums over one warp's lanes in a fixed shuffle tree. One warp per
 * row; 16-byte vectors when c % 8 == 0 and the pointers are 16-byte aligned, scalar otherwise.
 * bwd with vectors and c <= 1536 holds the whole row (dy, res, dx) in registers: every load of a row is
 * issued before its dot-product shuffle, one memory round trip per row instead of two plus L1/L2
 * re-reads of dy and res. Same per-lane operation order as the looped path: bitwise the same results.
 * Optional fused fp8 abs-max of the bf16 y (fwd) / bf16 dx copy (bwd): one atomicMax per block. */
#include "colreduce.cuh"
#include "qt_kernels.h"

#define RN_WARPS 8

/* The scale of column j: w[j], or with wp (Gemma3RMSNorm) 1 + w[j] formed in fp32; the 8 of columns [j, j+8). */
static __device__ __forceinline__ float wscale(const bf16 *w, int j, int wp) {
    float g = __bfloat162float(w[j]);
    return wp ? 1.0f + g : g;
}
static __device__ __forceinline__ void ldw8(float *g, const bf16 *w, int wp) {
    ld8(g, w);
    if (wp)
#pragma unroll
        for (int i = 0; i < 8; i++) g[i] = 1.0f + g[i];
}

/* Row r by one warp; returns the abs-max bits of the y it wrote when fold (else 0). */
static __device__ __forceinline__ unsigned rmsnorm_fwd_row(bf16 *y, float *rstd, bf16 *res, const bf16 *x,
                                                           const bf16 *w, int wp, long r, int c, float eps,
                                                           int vec, int fold) {
    int lane = threadIdx.x & 31;
    unsigned m = 0;
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
            ldw8(g, w + j, wp);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = a[i] * rs * g[i];
            m = st8_fold(yr + j, a, m, fold);
        }
    } else {
        for (int j = lane; j < c; j += 32)
            m = st1_fold(yr + j, __bfloat162float(rr[j]) * rs * wscale(w, j, wp), m, fold);
    }
    return m;
}

/* RN_WARPS rows per block; amax != NULL: max |y| folded in, one atomic per block (no early return:
 * the block reduce needs every thread). */
__global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, bf16 *res, const bf16 *x, const bf16 *w, int wp, long n,
                                   int c, float eps, int vec, float *amax) {
    long r = (long)blockIdx.x * RN_WARPS + (threadIdx.x >> 5);
    unsigned m = r < n ? rmsnorm_fwd_row(y, rstd, res, x, w, wp, r, c, eps, vec, amax != NULL) : 0u;
    if (amax) qt_amax_block_commit(amax, m);
}

/* Rows of the backward are cut into at most QT_RMSNORM_BWD_PARTS contiguous chunks, one block each (a fixed
 * partition for a given n, so dw's summation order depends on the shape only). */
/* Per-warp dw accumulators live in shared memory: at most this many bytes per block (no opt-in). */
#define RN_SMEM (48 * 1024)

/* Columns [j, j+8) of a backward row, given dy (d), res (a), w (g) and the old dx (o): dx = o + rs*(d*g - a*k)
 * stored in dx's dtype, the bf16 copy (+ abs-max fold) when dxb, and dy*(res*rs) added to the warp's
 * dw row my when not NULL. Shared by both bwd paths so their results are the same bits. */
static __device__ __forceinline__ unsigned rmsnorm_bwd_vec8(void *dx, int dx_bf16, bf16 *dxb, int fold, float *my,
                                                            long long base, int j, float rs, float k,
                                                            const float *d, const float *a, const float *g,
                                                            float *o, unsigned m) {
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] += rs * (d[i] * g[i] - a[i] * k);
    if (dx_bf16) st8((bf16 *)dx + base + j, o);
    else {
        float4 *p = (float4 *)((float *)dx + base + j);
        p[0] = make_float4(o[0], o[1], o[2], o[3]);
        p[1] = make_float4(o[4], o[5], o[6], o[7]);
    }
    if (dxb) m = st8_fold(dxb + base + j, o, m, fold);
    if (my) {
        float4 *q = (float4 *)(my + j);
        float4 q0 = q[0], q1 = q[1];
        q0.x += d[0] * (a[0] * rs); q0.y += d[1] * (a[1] * rs);
        q0.z += d[2] * (a[2] * rs); q0.w += d[3] * (a[3] * rs);
        q1.x += d[4] * (a[4] * rs); q1.y += d[5] * (a[5] * rs);
        q1.z += d[6] * (a[6] * rs); q1.w += d[7] * (a[7] * rs);
        q[0] = q0;
        q[1] = q1;
    }
    return m;
}

/* Row r of the backward for c <= NV * 256 (vectors): lane l owns columns l*8 + 256*t, t < NV. Loads
 * are clamped in bounds (c >= 8) so they are unconditional and all issue before the shuffle; the
 * math is exactly the looped path's (same expressions, same per-lane order). Returns the folded amax. */
template <int NV>
static __device__ __forceinline__ unsigned rmsnorm_bwd_row_regs(void *dx, int dx_bf16, bf16 *dxb, int fold,
                                                                float *my, const bf16 *dy, const bf16 *res,
                                                                const bf16 *w, int wp, float rs, long long base,
                                                                int c, unsigned m) {
    int lane = threadIdx.x & 31;
    uint4 dv[NV], av[NV], ov[NV][2]; /* raw bits: converting here would stall on each load in turn */
#pragma unroll
    for (int t = 0; t < NV; t++) {
        int j = min(lane * 8 + 256 * t, c - 8);
        dv[t] = *(const uint4 *)(dy + base + j);
        av[t] = *(const uint4 *)(res + base + j);
        if (dx_bf16) ov[t][0] = *(const uint4 *)((const bf16 *)dx + base + j);
        else {
            const uint4 *p = (const uint4 *)((const float *)dx + base + j);
            ov[t][0] = p[0];
            ov[t][1] = p[1];
        }
    }
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < NV; t++) {
        int j = lane * 8 + 256 * t;
        if (j < c) {
            float d[8], a[8], g[8];
            ld8(d, (const bf16 *)&dv[t]);
            ld8(a, (const bf16 *)&av[t]);
            ldw8(g, w + j, wp);
#pragma unroll
            for (int i = 0; i < 8; i++) dot += d[i] * g[i] * a[i];
        }
    }
    dot = warp_sum(dot);
    float k = rs * rs * dot / (float)c;
#pragma unroll
    for (int t = 0; t < NV; t++) {
        int j = lane * 8 + 256 * t;
        if (j < c) {
            float d[8], a[8], g[8], o[8];
            ld8(d, (const bf16 *)&dv[t]);
            ld8(a, (const bf16 *)&av[t]);
            ldw8(g, w + j, wp);
            if (dx_bf16) ld8(o, (const bf16 *)&ov[t][0]);
            else {
                const float *f = (const float *)&ov[t][0];
#pragma unroll
                for (int i = 0; i < 8; i++) o[i] = f[i];
            }
            m = rmsnorm_bwd_vec8(dx, dx_bf16, dxb, fold, my, base, j, rs, k, d, a, g, o, m);
        }
    }
    return m;
}

/* One block per row chunk [b*chunk, min(n, (b+1)*chunk)); warp w takes rows r0+w, r0+w+nw, ...
 * dx as before; with part != NULL each warp also sums dy*(res*rstd) over its rows into its own
 * shared-memory row acc[w][c] (each lane owns its columns: no conflicts), and the block writes
 * part[b][j] = sum over warps in warp order. dxb != NULL receives bf16(new dx); amax != NULL (needs
 * dxb) gets max |dxb| folded in, one atomic per block, reduced through the start of the dynamic shared
 * memory once the partials are out (C = 1536 fills all 48 KiB: no room for a static array).
 * NV > 0: vectors with c <= NV * 256, row held in registers, capped at 128 registers so two blocks fit
 * per SM (NV = 6 spills 32 bytes to L1, cheaper than half the warps); NV == 0: the looped path, any c
 * (uncapped: forcing three blocks per SM there spills in the row loop). */
template <int NV, int WP>
__global__ void __launch_bounds__(RN_WARPS * 32, NV > 0 ? 2 : 1)
rmsnorm_bwd_kernel(void *dx, int dx_bf16, bf16 *dxb, float *amax, float *part, const bf16 *dy, const bf16 *res,
                   const bf16 *w, const float *rstd, long n, int c, long chunk, int vec) {
    const int wp = WP; /* a constant: plain RMSNorm's kernel carries no (1 + w) code */
    extern __shared__ float4 rn_sh4[];
    float *acc = (float *)rn_sh4;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    long r0 = (long)blockIdx.x * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float *my = part ? acc + (long long)wid * c : NULL;
    unsigned m = 0;
    int fold = amax != NULL;
    if (part) {
        if (vec)
            for (int j = lane * 8; j < c; j += 256) {
                ((float4 *)(my + j))[0] = make_float4(0.f, 0.f, 0.f, 0.f);
                ((float4 *)(my + j))[1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        else
            for (int j = lane; j < c; j += 32) my[j] = 0.0f;
    }
    for (long r = r0 + wid; r < r1; r += nw) {
        long long base = (long long)r * c;
        if (NV > 0) {
            m = rmsnorm_bwd_row_regs<NV ? NV : 1>(dx, dx_bf16, dxb, fold, my, dy, res, w, wp, rstd[r], base, c, m);
            continue;
        }
        const bf16 *dyr = dy + base, *xr = res + base;
        float dot = 0.0f;
        if (vec) {
            for (int j = lane * 8; j < c; j += 256) {
                float d[8], a[8], g[8];
                ld8(d, dyr + j);
                ld8(a, xr + j);
                ldw8(g, w + j, wp);
#pragma unroll
                for (int i = 0; i < 8; i++) dot += d[i] * g[i] * a[i];
            }
        } else {
            for (int j = lane; j < c; j += 32)
                dot += __bfloat162float(dyr[j]) * wscale(w, j, wp) * __bfloat162float(xr[j]);
        }
        dot = warp_sum(dot);
        float rs = rstd[r], k = rs * rs * dot / (float)c;
        if (vec) {
            for (int j = lane * 8; j < c; j += 256) {
                float d[8], a[8], g[8], o[8];
                ld8(d, dyr + j);
                ld8(a, xr + j);
                ldw8(g, w + j, wp);
                if (dx_bf16) ld8(o, (const bf16 *)dx + base + j);
                else {
                    const float4 *p = (const float4 *)((const float *)dx + base + j);
                    float4 p0 = p[0], p1 = p[1];
                    o[0] = p0.x; o[1] = p0.y; o[2] = p0.z; o[3] = p0.w;
                    o[4] = p1.x; o[5] = p1.y; o[6] = p1.z; o[7] = p1.w;
                }
                m = rmsnorm_bwd_vec8(dx, dx_bf16, dxb, fold, my, base, j, rs, k, d, a, g, o, m);
            }
        } else {
            for (int j = lane; j < c; j += 32) {
                float d = __bfloat162float(dyr[j]), a = __bfloat162float(xr[j]);
                float g = rs * (d * wscale(w, j, wp) - a * k);
                float o;
                if (dx_bf16) {
                    bf16 *p = (bf16 *)dx + base + j;
                    bf16 h = __float2bfloat16_rn(__bfloat162float(*p) + g);
                    *p = h;
                    o = __bfloat162float(h);
                } else {
                    o = ((float *)dx)[base + j] + g;
                    ((float *)dx)[base + j] = o;
                }
                if (dxb) m = st1_fold(dxb + base + j, o, m, fold);
                if (part) my[j] += d * (a * rs);
            }
        }
    }
    if (part) {
        __syncthreads();
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float s = acc[j];
            for (int q = 1; q < nw; q++) s += acc[(long long)q * c + j];
            part[(long long)blockIdx.x * c + j] = s;
        }
    }
    if (amax) qt_amax_block_commit_sh(amax, m, (unsigned *)acc);
}

/* Second level: dw[j] += sum of part[0..parts)[j] (fp32, or bf16 rounded once). Block (RS_X columns, RS_Y lanes): lane y sums the
 * partials y, y+RS_Y, ... in order, then the RS_Y lane sums are added in lane order. */
#define RS_X 8
#define RS_Y 32
__global__ void rmsnorm_dw_sum_bwd_kernel(void *dw, int dw_bf16, const float *part, int parts, int c) {
    __shared__ float sh[RS_Y][RS_X];
    int j = blockIdx.x * RS_X + threadIdx.x;
    float s = 0.0f;
    if (j < c)
        for (int k = threadIdx.y; k < parts; k += RS_Y) s += part[(long long)k * c + j];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float t = sh[0][threadIdx.x];
        for (int l = 1; l < RS_Y; l++) t += sh[l][threadIdx.x];
        acc_store(dw, dw_bf16, j, t); /* fp32, or bf16: one RNE of dw + t */
    }
}

static void fwd_launch(void *y, float *rstd, void *res, const void *x, const void *w, int wp, long n, int c, float eps,
                       float *amax, cudaStream_t s) {
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(y) && qt_aligned16(res) && qt_aligned16(w) && (!x || qt_aligned16(x));
    unsigned grid = (unsigned)((n + RN_WARPS - 1) / RN_WARPS);
    rmsnorm_fwd_kernel<<<grid, RN_WARPS * 32, 0, s>>>((bf16 *)y, rstd, (bf16 *)res, (const bf16 *)x,
                                                      (const bf16 *)w, wp, n, c, eps, vec, amax);
    QT_CUDA(cudaGetLastError());
}

typedef void (*rn_bwd_fn)(void *, int, bf16 *, float *, float *, const bf16 *, const bf16 *, const bf16 *,
                          const float *, long, int, long, int);

static void bwd_launch(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt, const void *dy,
                       const void *res, const void *w, int wp, const float *rstd, long n, int c, void *ws, cudaStream_t s) {
    QT_CHECK(!dw || dw_dt == QT_DT_F32 || dw_dt == QT_DT_BF16, "rmsnorm bwd: dw dtype %s: expected fp32 or bf16",
             qt_dtype_name(dw_dt));
    QT_CHECK(dx_dt == QT_DT_F32 || dx_dt == QT_DT_BF16, "dx dtype %s: expected fp32 or bf16",
             qt_dtype_name(dx_dt));
    QT_CHECK(!amax || dx_bf16, "qt_rmsnorm_bwd: amax is the abs-max of dx_bf16, which is NULL");
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(dx) && qt_aligned16(dy) && qt_aligned16(res) && qt_aligned16(w) &&
              qt_aligned16(dx_bf16);
    int nw = RN_WARPS;
    while (nw > 1 && (size_t)nw * c * sizeof(float) > RN_SMEM) nw /= 2;
    /* dw fused unless even one warp's accumulator row does not fit: then the separate column pass */
    int fused = dw && (size_t)c * sizeof(float) <= RN_SMEM;
    if (!fused) nw = RN_WARPS;
    long chunk = nw, parts;
    if (fused) {
        parts = n < QT_RMSNORM_BWD_PARTS ? n : QT_RMSNORM_BWD_PARTS;
        chunk = (n + parts - 1) / parts;
    }
    parts = (n + chunk - 1) / chunk;
    /* the abs-max reduce needs nw words of it (the dw rows are at least that) */
    size_t smem = fused ? (size_t)nw * c * sizeof(float) : amax ? nw * sizeof(unsigned) : 0;
    /* registers per row: ceil(c / 256) vectors per lane, rounded up to an even count to bound the
     * number of instantiations (the extra ones are masked); past 1536 columns the row no longer fits
     * in 128 registers without heavy spills, so the looped path */
    int rv = vec && c <= 1536 ? ((c + 511) / 512) * 2 : 0;
    rn_bwd_fn k = wp ? (rv == 2 ? rmsnorm_bwd_kernel<2, 1> : rv == 4 ? rmsnorm_bwd_kernel<4, 1>
                        : rv == 6 ? rmsnorm_bwd_kernel<6, 1> : rmsnorm_bwd_kernel<0, 1>)
                     : (rv == 2 ? rmsnorm_bwd_kernel<2, 0> : rv == 4 ? rmsnorm_bwd_kernel<4, 0>
                        : rv == 6 ? rmsnorm_bwd_kernel<6, 0> : rmsnorm_bwd_kernel<0, 0>);
    k<<<(unsigned)parts, nw * 32, smem, s>>>(dx, dx_dt == QT_DT_BF16, (bf16 *)dx_bf16, amax,
                                            fused ? (float *)ws : NULL, (const bf16 *)dy, (const bf16 *)res,
                                            (const bf16 *)w, rstd, n, c, chunk, vec);
    QT_CUDA(cudaGetLastError());
    if (fused) {
        rmsnorm_dw_sum_bwd_kernel<<<(unsigned)((c + RS_X - 1) / RS_X), dim3(RS_X, RS_Y), 0, s>>>(
            dw, dw_dt == QT_DT_BF16, (const float *)ws, (int)parts, c);
        QT_CUDA(cudaGetLastError());
    } else if (dw) {
        qt_colreduce(dw, dw_dt == QT_DT_BF16, (const bf16 *)dy, (const bf16 *)res, rstd, n, c, ws, s);
    }
}

extern "C" void qt_rmsnorm_fwd(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c,
                               float eps, float *amax, cudaStream_t s) {
    fwd_launch(y, rstd, res, x, w, 0, n, c, eps, amax, s);
}

extern "C" void qt_rmsnorm_bwd(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt,
                               const void *dy, const void *res, const void *w, const float *rstd, long n, int c,
                               void *ws, cudaStream_t s) {
    bwd_launch(dx, dx_dt, dx_bf16, amax, dw, dw_dt, dy, res, w, 0, rstd, n, c, ws, s);
}

extern "C" void qt_rmsnorm1p_fwd(void *y, float *rstd, void *res, const void *x, const void *w, long n, int c,
                                 float eps, float *amax, cudaStream_t s) {
    fwd_launch(y, rstd, res, x, w, 1, n, c, eps, amax, s);
}

extern "C" void qt_rmsnorm1p_bwd(void *dx, qt_dtype dx_dt, void *dx_bf16, float *amax, void *dw, qt_dtype dw_dt,
                                 const void *dy, const void *res, const void *w, const float *rstd, long n, int c,
                                 void *ws, cudaStream_t s) {
    bwd_launch(dx, dx_dt, dx_bf16, amax, dw, dw_dt, dy, res, w, 1, rstd, n, c, ws, s);
}
