/* embedding.cu — token embedding gather (fwd) and its deterministic gradient (bwd).
 *
 * fwd: out[n,c] (bf16) = wte[tok[n], :] (bf16), a copy: no rounding. 16-byte vectors when c % 8 == 0.
 *   Scaled (Gemma): out = bf16(wte[tok[n], :] * scale), the fp32 product (exact for a bf16 scale) rounded once.
 * bwd: dwte[v,c] (fp32 or bf16) += dout[n,c] * scale (fp32 or bf16; scale 1 unless scaled) over the rows n with
 *   tok[n] == v, in ascending n, accumulated in fp32 from dwte's value, one fmaf per term (fmaf(x, 1, a) is
 *   a + x: the unscaled sum is the plain one, bit for bit); a bf16 dwte is rounded once at the end (RNE).
 *   No float atomics: tokens are counted per id (integer atomics), an exclusive scan gives each id a
 *   bucket, rows are scattered into their buckets, and one block per touched id sorts its bucket by
 *   row (bitonic sort, so the order does not depend on atomic scheduling) and sums the rows in that
 *   order, starting from dwte's value, in fp32. Same inputs -> bitwise-identical dwte.
 *   The scan is spread over blocks of SCAN_TILE ids (tile sums first, then each tile scanned from the
 *   sums before it) with coalesced accesses: one block striding over all v ids took most of the time. */
#include <limits.h>

#include "kcommon.cuh"
#include "qt_kernels.h"

#define SCAN_THREADS 256
#define SCAN_PER 4 /* consecutive ids per scan thread */
#define SCAN_TILE (SCAN_THREADS * SCAN_PER)
#define BUCKET_SHARED 2048 /* buckets up to this many rows are sorted in shared memory */

__global__ void embedding_fwd_kernel(bf16 *out, const int32_t *tok, const bf16 *wte, long n, int c, int v,
                                     int vec, float scale) {
    int scaled = scale != 1.0f;
    long long per_row = vec ? c / 8 : c, total = (long long)n * per_row;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        long long r = k / per_row, j = k - r * per_row;
        int t = tok[r];
        int ok = t >= 0 && t < v;
        if (vec) {
            bf16x8 x;
            if (ok) x = *(const bf16x8 *)(wte + (long long)t * c + j * 8);
            else
                for (int i = 0; i < 8; i++) x.h[i] = __float2bfloat16_rn(0.0f);
            if (scaled) {
                float f[8];
                ld8(f, x.h);
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] *= scale;
                st8(out + r * c + j * 8, f);
            } else {
                *(bf16x8 *)(out + r * c + j * 8) = x;
            }
        } else {
            bf16 x = ok ? wte[(long long)t * c + j] : __float2bfloat16_rn(0.0f);
            out[r * c + j] = scaled ? __float2bfloat16_rn(__bfloat162float(x) * scale) : x;
        }
    }
}

__global__ void embedding_hist_bwd_kernel(int *cnt, const int32_t *tok, long n, int v) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        int t = tok[i];
        if (t >= 0 && t < v) atomicAdd(&cnt[t], 1);
    }
}

/* Exclusive scan of x over the block (blockDim.x <= 1024, a multiple of 32); returns this thread's
 * prefix and the block total in *total. */
static __device__ int block_excl_scan(int x, int *total) {
    __shared__ int warp_tot[32];
    __shared__ int tot;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int inc = x;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads(); /* a previous call may still be reading warp_tot */
    if (lane == 31) warp_tot[wid] = inc;
    __syncthreads();
    if (wid == 0) {
        int w = lane < nw ? warp_tot[lane] : 0, wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < nw) warp_tot[lane] = wi - w;
        if (lane == 31) tot = wi;
    }
    __syncthreads();
    *total = tot;
    return warp_tot[wid] + inc - x;
}

/* sums[2b], sums[2b+1] = the tokens and the touched ids in tile b of cnt (SCAN_TILE ids). */
__global__ void embedding_tile_bwd_kernel(const int *cnt, int *sums, int v) {
    int lo = blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_PER, hi = min(lo + SCAN_PER, v);
    int s = 0, u = 0, stot, utot;
    for (int i = lo; i < hi; i++) {
        s += cnt[i];
        u += cnt[i] > 0;
    }
    block_excl_scan(s, &stot);
    block_excl_scan(u, &utot);
    if (threadIdx.x == 0) {
        sums[2 * blockIdx.x] = stot;
        sums[2 * blockIdx.x + 1] = utot;
    }
}

/* One block per tile of ids: off[id] = exclusive scan of cnt, cursor = off, touched[] = the ids with
 * cnt > 0 in ascending order; the tile starts from the sums of the tiles before it. The last tile
 * writes off[v] = number of valid tokens and meta[0] = number of touched ids. */
__global__ void embedding_scan_bwd_kernel(const int *cnt, const int *sums, int *off, int *cursor, int *touched,
                                          int *meta, int v) {
    int s = 0, u = 0, sp, up, stot, utot;
    for (int b = threadIdx.x; b < (int)blockIdx.x; b += blockDim.x) {
        s += sums[2 * b];
        u += sums[2 * b + 1];
    }
    block_excl_scan(s, &sp);
    block_excl_scan(u, &up);
    int lo = blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_PER, hi = min(lo + SCAN_PER, v);
    s = u = 0;
    for (int i = lo; i < hi; i++) {
        s += cnt[i];
        u += cnt[i] > 0;
    }
    sp += block_excl_scan(s, &stot);
    up += block_excl_scan(u, &utot);
    for (int i = lo; i < hi; i++) {
        off[i] = sp;
        cursor[i] = sp;
        sp += cnt[i];
        if (cnt[i] > 0) touched[up++] = i;
    }
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == blockDim.x - 1) {
        off[v] = sp; /* the last thread's running sums end at the totals */
        meta[0] = up;
    }
}

__global__ void embedding_scatter_bwd_kernel(int *rows, int *cursor, const int32_t *tok, long n, int v) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        int t = tok[i];
        if (t >= 0 && t < v) rows[atomicAdd(&cursor[t], 1)] = (int)i;
    }
}

/* Ascending sort of a[0..m) by the block: bitonic network in its "flip" form, which sorts any m when
 * the virtual entries past m count as +inf (a compare-exchange whose upper index is >= m never swaps,
 * so it is skipped). */
static __device__ void block_bitonic_sort(int *a, int m) {
    int p = 1;
    while (p < m) p <<= 1;
    for (int k = 2; k <= p; k <<= 1) {
        for (int j = k; j >= 2; j >>= 1) {
            for (int t = threadIdx.x; t < p / 2; t += blockDim.x) {
                int half = j / 2, blk = t / half, o = t - blk * half;
                int lo = blk * j + o, hi = (j == k) ? blk * j + j - 1 - o : lo + half;
                if (hi < m && a[lo] > a[hi]) {
                    int x = a[lo];
                    a[lo] = a[hi];
                    a[hi] = x;
                }
            }
            __syncthreads();
        }
    }
}

/* One block per touched id: sort its bucket, then dwte[id] += its rows in ascending order, for the
 * table elements in [lo, hi) (vec: multiples of 8). dw_bf16: 1 = a bf16 dwte, 2 = an fp32 dwte whose
 * sums are stored rounded to bf16 (RNE: the bf16 table's values). */
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__global__ void embedding_bwd_kernel(void *dwte, int dw_bf16, long long lo_el, long long hi_el, const void *dout,
                                     int dout_bf16, int *rows, const int *off, const int *touched, const int *meta, int c,
                                     int vec, float scale) {
    __shared__ int sh[BUCKET_SHARED];
    if ((int)blockIdx.x >= meta[0]) return;
    int id = touched[blockIdx.x], lo = off[id], m = off[id + 1] - lo;
    long long row0 = (long long)id * c;
    int c0 = (int)max(0LL, lo_el - row0), c1 = (int)min((long long)c, hi_el - row0);
    if (c0 >= c1) return; /* the whole block: the row is outside the range */
    int *r = rows + lo;
    if (m > 1 && m <= BUCKET_SHARED) {
        for (int i = threadIdx.x; i < m; i += blockDim.x) sh[i] = r[i];
        __syncthreads();
        r = sh;
    }
    if (m > 1) block_bitonic_sort(r, m);
    float *dst = dw_bf16 == 1 ? NULL : (float *)dwte + row0;
    bf16 *dsth = dw_bf16 == 1 ? (bf16 *)dwte + row0 : NULL;
    int g0 = vec ? c0 / 8 : c0, g1 = vec ? c1 / 8 : c1;
    for (int g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
        if (vec) {
            float acc[8], x[8];
            if (dw_bf16 == 1) {
                ld8(acc, dsth + g * 8);
            } else {
                float4 a0 = ((float4 *)(dst + g * 8))[0], a1 = ((float4 *)(dst + g * 8))[1];
                acc[0] = a0.x; acc[1] = a0.y; acc[2] = a0.z; acc[3] = a0.w;
                acc[4] = a1.x; acc[5] = a1.y; acc[6] = a1.z; acc[7] = a1.w;
            }
            for (int k = 0; k < m; k++) {
                long long base = (long long)r[k] * c + g * 8;
                if (dout_bf16) ld8(x, (const bf16 *)dout + base);
                else {
                    float4 b0 = ((const float4 *)((const float *)dout + base))[0];
                    float4 b1 = ((const float4 *)((const float *)dout + base))[1];
                    x[0] = b0.x; x[1] = b0.y; x[2] = b0.z; x[3] = b0.w;
                    x[4] = b1.x; x[5] = b1.y; x[6] = b1.z; x[7] = b1.w;
                }
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] = fmaf(x[i], scale, acc[i]);
            }
            if (dw_bf16 == 1) {
                st8(dsth + g * 8, acc);
            } else {
                if (dw_bf16 == 2)
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[i] = bf16_round(acc[i]);
                ((float4 *)(dst + g * 8))[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
                ((float4 *)(dst + g * 8))[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            }
        } else {
            float acc = dw_bf16 == 1 ? __bfloat162float(dsth[g]) : dst[g];
            for (int k = 0; k < m; k++) {
                long long i = (long long)r[k] * c + g;
                acc = fmaf(dout_bf16 ? __bfloat162float(((const bf16 *)dout)[i]) : ((const float *)dout)[i], scale, acc);
            }
            if (dw_bf16 == 1) dsth[g] = __float2bfloat16_rn(acc);
            else dst[g] = dw_bf16 == 2 ? bf16_round(acc) : acc;
        }
    }
}

extern "C" void qt_embedding_fwd(void *out, const int32_t *tok, const void *wte, long n, int c, int v,
                                 cudaStream_t s) {
    qt_embedding_scaled_fwd(out, tok, wte, n, c, v, 1.0f, s);
}

extern "C" void qt_embedding_scaled_fwd(void *out, const int32_t *tok, const void *wte, long n, int c, int v,
                                        float scale, cudaStream_t s) {
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(out) && qt_aligned16(wte);
    long long work = (long long)n * (vec ? c / 8 : c);
    embedding_fwd_kernel<<<qt_grid_for(work, 256), 256, 0, s>>>((bf16 *)out, tok, (const bf16 *)wte, n, c,
                                                                 v, vec, scale);
    QT_CUDA(cudaGetLastError());
}

static int scan_tiles(int v) { return (v + SCAN_TILE - 1) / SCAN_TILE; }

/* Workspace, in ints: cnt[v] | off[v+1] | cursor[v] | rows[n] | touched[n] | meta[1] | sums[2*tiles]. */
extern "C" size_t qt_embedding_bwd_ws_bytes(long n, int v) {
    return ((size_t)3 * v + 1 + 2 * (size_t)n + 1 + 2 * (size_t)scan_tiles(v)) * sizeof(int);
}

extern "C" void qt_embedding_bwd(void *dwte, qt_dtype dw_dt, const void *dout, qt_dtype dout_dt, const int32_t *tok,
                                 long n, int c, int v, void *ws, cudaStream_t s) {
    qt_embedding_bwd_range(dwte, dw_dt, 0, 0, (size_t)v * c, dout, dout_dt, tok, n, c, v, ws, s);
}

extern "C" void qt_embedding_bwd_range(void *dwte, qt_dtype dw_dt, int round_bf16, size_t lo, size_t hi, const void *dout,
                                       qt_dtype dout_dt, const int32_t *tok, long n, int c, int v, void *ws,
                                       cudaStream_t s) {
    qt_embedding_scaled_bwd_range(dwte, dw_dt, round_bf16, lo, hi, dout, dout_dt, tok, n, c, v, 1.0f, ws, s);
}

extern "C" void qt_embedding_scaled_bwd(void *dwte, qt_dtype dw_dt, const void *dout, qt_dtype dout_dt,
                                        const int32_t *tok, long n, int c, int v, float scale, void *ws,
                                        cudaStream_t s) {
    qt_embedding_scaled_bwd_range(dwte, dw_dt, 0, 0, (size_t)v * c, dout, dout_dt, tok, n, c, v, scale, ws, s);
}

extern "C" void qt_embedding_scaled_bwd_range(void *dwte, qt_dtype dw_dt, int round_bf16, size_t lo, size_t hi,
                                              const void *dout, qt_dtype dout_dt, const int32_t *tok, long n, int c,
                                              int v, float scale, void *ws, cudaStream_t s) {
    QT_CHECK((dout_dt == QT_DT_F32 || dout_dt == QT_DT_BF16) && (dw_dt == QT_DT_F32 || dw_dt == QT_DT_BF16),
             "embedding bwd: dout dtype %s, dwte dtype %s: expected fp32 or bf16", qt_dtype_name(dout_dt),
             qt_dtype_name(dw_dt));
    QT_CHECK(n < INT_MAX && v > 0, "embedding bwd: n=%ld tokens (max %d), v=%d", n, INT_MAX - 1, v);
    QT_CHECK(lo <= hi, "embedding bwd: range [%zu, %zu)", lo, hi);
    if (n <= 0 || c <= 0) return;
    int *cnt = (int *)ws, *off = cnt + v, *cursor = off + v + 1, *rows = cursor + v, *touched = rows + n;
    int *meta = touched + n, *sums = meta + 1, tiles = scan_tiles(v);
    QT_CUDA(cudaMemsetAsync(cnt, 0, (size_t)v * sizeof(int), s));
    unsigned g = qt_grid_for(n, 256);
    embedding_hist_bwd_kernel<<<g, 256, 0, s>>>(cnt, tok, n, v);
    QT_CUDA(cudaGetLastError());
    embedding_tile_bwd_kernel<<<tiles, SCAN_THREADS, 0, s>>>(cnt, sums, v);
    QT_CUDA(cudaGetLastError());
    embedding_scan_bwd_kernel<<<tiles, SCAN_THREADS, 0, s>>>(cnt, sums, off, cursor, touched, meta, v);
    QT_CUDA(cudaGetLastError());
    embedding_scatter_bwd_kernel<<<g, 256, 0, s>>>(rows, cursor, tok, n, v);
    QT_CUDA(cudaGetLastError());
    int es = qt_dtype_size(dout_dt);
    int vec = c % 8 == 0 && lo % 8 == 0 && hi % 8 == 0 && qt_aligned16(dwte) && qt_aligned16(dout) &&
              ((size_t)c * es) % 16 == 0;
    long nblk = n < v ? n : v;
    int mode = dw_dt == QT_DT_BF16 ? 1 : round_bf16 ? 2 : 0;
    embedding_bwd_kernel<<<(unsigned)nblk, 128, 0, s>>>(dwte, mode, (long long)lo, (long long)hi, dout,
                                                        dout_dt == QT_DT_BF16,
                                                        rows, off, touched, meta, c, vec, scale);
    QT_CUDA(cudaGetLastError());
}
