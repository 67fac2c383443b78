/* qknorm.cu — per-head RMSNorm of the q and k heads of the fused qkv rows (Qwen3's q_norm / k_norm),
 * forward and backward.
 *
 * qkv[n, (H + 2*Hkv)*D] bf16: H q heads, Hkv k heads, Hkv v heads. w[2D] bf16: wq = w[0:D], wk = w[D:2D].
 * fwd (in place on the q and k heads; v untouched): x = the head's D values,
 *      y = x * rstd * s,  s = w (qt_qknorm_*) or 1 + w formed in fp32 (qt_qknorm1p_*, Gemma 3),  rstd = 1/sqrt(mean(x^2) + eps)  -> rstd[n, H+Hkv] (fp32); the pre-norm q|k heads
 *      are copied (bit-exact) to save[n, (H+Hkv)*D] for the backward.
 * bwd (in place on dqkv's q and k heads; v untouched):
 *      dx = rstd * (dy*s - x * rstd^2 * mean(dy*s*x)),  dw[i] += sum over rows and heads of dy * x * rstd.
 * fp32 math, one RNE rounding per bf16 output. One warp per (row, head); the row sums over the lanes in a
 * fixed shuffle tree. No float atomics; dw is deterministic: fixed row chunks give ws[chunk, 2D] partial
 * column sums, then a second kernel adds the chunks per column in a fixed block tree and that fp32 sum to dw
 * (fp32, or bf16: one RNE). Optional fused fp8 abs-max of the whole dqkv after the backward, v heads included
 * (read for it): one atomicMax per block.
 * Two layouts of the work, chosen per launch:
 *  - vector (D = 32 V, V = 2, 4 or 8, the heads' rows 2V-byte aligned: every model's head_dim 64 / 128 / 256):
 *    lane l holds the V adjacent elements [lV, lV + V) of its head in registers, read and written in one
 *    4-16 byte access; the backward is one kernel that reads dy and x once, writes dx and keeps the dw
 *    partials of its block's row chunk in registers (per warp, heads in order), summed over the warps in
 *    order through shared memory into ws.
 *  - strided (any D <= 512, any alignment): lane l holds elements l, l + 32, ...; the dw partials come
 *    from a kernel of their own (one thread per column, rows then heads in order) before dx overwrites dy.
 * The two sum a row's squares in different orders, so their last bits may differ; a launch's choice
 * depends only on D and the pointers, so a run is deterministic. */
#include "colreduce.cuh"
#include "qt_kernels.h"

#define QKN_PARTS 2048 /* row chunks of the dw partials (fewer when n is smaller) */
#define QKN_THREADS 256
#define QKN_MAX_D 512  /* 2D threads per block in the dw passes */

/* One warp per (row, head) of the H + Hkv normed heads. */
/* The scale of weight element wj: w, or 1 + w (one_plus). */
__device__ __forceinline__ float qkn_scale(bf16 wj, int one_plus) {
    return one_plus ? 1.0f + __bfloat162float(wj) : __bfloat162float(wj);
}

__global__ void qknorm_fwd_kernel(bf16 *qkv, bf16 *save, float *rstd, const bf16 *w, long long rows, int H, int Hkv,
                                  int D, float eps, int one_plus) {
    int lane = threadIdx.x & 31, NH = H + Hkv, stride = (H + 2 * Hkv) * D;
    long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long k = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); k < rows * NH; k += warps) {
        long long row = k / NH;
        int h = (int)(k - row * NH);
        bf16 *x = qkv + row * stride + (long long)h * D;
        const bf16 *wh = w + (h < H ? 0 : D);
        float ss = 0.0f;
        for (int j = lane; j < D; j += 32) {
            float a = __bfloat162float(x[j]);
            ss += a * a;
            if (save) save[row * NH * D + (long long)h * D + j] = x[j];
        }
        ss = warp_sum(ss);
        float rs = 1.0f / sqrtf(ss / (float)D + eps);
        if (lane == 0) rstd[k] = rs;
        /* each lane rewrites only the elements it read itself */
        for (int j = lane; j < D; j += 32)
            x[j] = __float2bfloat16_rn(__bfloat162float(x[j]) * rs * qkn_scale(wh[j], one_plus));
    }
}

/* dw pass 1: block b sums rows [b*chunk, (b+1)*chunk) of column t (t < D: q heads, else k heads) into ws[b, t]. */
__global__ void qknorm_dw_part_kernel(float *ws, const bf16 *dqkv, const bf16 *save, const float *rstd, long long rows,
                                      int H, int Hkv, int D, long long chunk) {
    int t = threadIdx.x;
    if (t >= 2 * D) return;
    int NH = H + Hkv, stride = (H + 2 * Hkv) * D, i = t < D ? t : t - D, h0 = t < D ? 0 : H, h1 = t < D ? H : NH;
    long long r0 = blockIdx.x * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float acc = 0.0f;
    for (long long r = r0; r < r1; r++)
        for (int h = h0; h < h1; h++)
            acc += __bfloat162float(dqkv[r * stride + (long long)h * D + i]) *
                   __bfloat162float(save[r * NH * D + (long long)h * D + i]) * rstd[r * NH + h];
    ws[blockIdx.x * 2LL * D + t] = acc;
}

/* dw pass 2: block t adds the parts of column t (each thread a fixed strided subset, then a block tree). */
__global__ void qknorm_dw_sum_kernel(void *dw, int dw_bf16, const float *ws, int parts, int D) {
    __shared__ float sh[32];
    int t = blockIdx.x;
    float s = 0.0f;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) s += ws[(long long)p * 2 * D + t];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) acc_store(dw, dw_bf16, t, s);
}

/* dx in place over dy, one warp per (row, head); with amax the v heads are visited for the abs-max too. */
__global__ void qknorm_bwd_kernel(bf16 *dqkv, const bf16 *save, const bf16 *w, const float *rstd, long long rows, int H,
                                  int Hkv, int D, float *amax, int one_plus) {
    int lane = threadIdx.x & 31, NH = H + Hkv, nh = NH + (amax ? Hkv : 0), stride = (H + 2 * Hkv) * D;
    int fold = amax != NULL;
    unsigned m = 0;
    long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long k = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); k < rows * nh; k += warps) {
        long long row = k / nh;
        int h = (int)(k - row * nh);
        bf16 *g = dqkv + row * stride + (long long)h * D;
        if (h >= NH) { /* a v head: read for the abs-max only */
            for (int j = lane; j < D; j += 32) m = qt_amax_fold(m, __bfloat162float(g[j]));
            continue;
        }
        const bf16 *x = save + row * NH * D + (long long)h * D, *wh = w + (h < H ? 0 : D);
        float dot = 0.0f;
        for (int j = lane; j < D; j += 32)
            dot += __bfloat162float(g[j]) * qkn_scale(wh[j], one_plus) * __bfloat162float(x[j]);
        dot = warp_sum(dot);
        float r = rstd[row * NH + h], kk = dot * r * r * r / (float)D;
        for (int j = lane; j < D; j += 32) {
            float d = __bfloat162float(g[j]) * qkn_scale(wh[j], one_plus) * r - __bfloat162float(x[j]) * kk;
            m = st1_fold(g + j, d, m, fold);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

/* V adjacent bf16 of one lane, moved in one access. */
template <int V> struct __align__(2 * V) qkn_vec { bf16 h[V]; };

/* The scales of the lane's V elements for q heads (sq) and k heads (sk). */
template <int V>
__device__ __forceinline__ void qkn_lane_scales(float *sq, float *sk, const bf16 *w, int lane, int one_plus) {
    const int D = 32 * V;
    qkn_vec<V> a = *(const qkn_vec<V> *)(w + lane * V), b = *(const qkn_vec<V> *)(w + D + lane * V);
#pragma unroll
    for (int e = 0; e < V; e++) sq[e] = qkn_scale(a.h[e], one_plus), sk[e] = qkn_scale(b.h[e], one_plus);
}

/* Forward, vector layout: one warp per (row, head), lane l the elements [lV, lV + V). */
template <int V>
__global__ void qknorm_fwd_vec_kernel(bf16 *qkv, bf16 *save, float *rstd, const bf16 *w, long long rows, int H,
                                      int Hkv, float eps, int one_plus) {
    const int D = 32 * V;
    int lane = threadIdx.x & 31, NH = H + Hkv;
    long long stride = (long long)(H + 2 * Hkv) * D, warps = (long long)gridDim.x * (blockDim.x >> 5);
    float sq[V], sk[V];
    qkn_lane_scales<V>(sq, sk, w, lane, one_plus);
    for (long long k = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); k < rows * NH; k += warps) {
        long long row = k / NH;
        int h = (int)(k - row * NH);
        qkn_vec<V> *x = (qkn_vec<V> *)(qkv + row * stride + (long long)h * D + lane * V), v = *x;
        if (save) *(qkn_vec<V> *)(save + k * D + lane * V) = v;
        float a[V], ss = 0.0f;
#pragma unroll
        for (int e = 0; e < V; e++) a[e] = __bfloat162float(v.h[e]), ss += a[e] * a[e];
        ss = warp_sum(ss);
        float rs = 1.0f / sqrtf(ss / (float)D + eps);
        if (lane == 0) rstd[k] = rs;
#pragma unroll
        for (int e = 0; e < V; e++) v.h[e] = __float2bfloat16_rn(a[e] * rs * (h < H ? sq[e] : sk[e]));
        *x = v;
    }
}

/* Backward, vector layout: block b owns rows [b chunk, (b + 1) chunk); its warps take the block's (row, q|k
 * head) items in turn (warp w: items w, w + warps, ...), then, with amax, its (row, v head) items, read for
 * the abs-max (so the dw partials do not depend on amax). dx in place over dy; ws (may be NULL: no dw)
 * [gridDim.x, 2D]: the block's column sums of dy * x * rstd, q columns then k columns, each the sum over
 * the warps in order of the warp's running sum. Dynamic shared memory: (blockDim.x / 32) x 2D floats. */
template <int V>
__global__ void qknorm_bwd_vec_kernel(bf16 *dqkv, float *ws, const bf16 *save, const bf16 *w, const float *rstd,
                                      long long rows, int H, int Hkv, long long chunk, float *amax, int one_plus) {
    extern __shared__ float qkn_part[];
    const int D = 32 * V;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5, NH = H + Hkv;
    int fold = amax != NULL;
    long long stride = (long long)(H + 2 * Hkv) * D, r0 = blockIdx.x * chunk;
    long long r1 = r0 + chunk < rows ? r0 + chunk : rows, nrow = r1 > r0 ? r1 - r0 : 0;
    float sq[V], sk[V], pq[V], pk[V];
    qkn_lane_scales<V>(sq, sk, w, lane, one_plus);
#pragma unroll
    for (int e = 0; e < V; e++) pq[e] = 0.0f, pk[e] = 0.0f;
    unsigned m = 0;
    for (long long it = wid; it < nrow * NH; it += nw) {
        long long row = r0 + it / NH;
        int h = (int)(it - (row - r0) * NH);
        qkn_vec<V> *gp = (qkn_vec<V> *)(dqkv + row * stride + (long long)h * D + lane * V), g = *gp;
        qkn_vec<V> x = *(const qkn_vec<V> *)(save + (row * NH + h) * D + lane * V);
        float gf[V], xf[V], dot = 0.0f;
#pragma unroll
        for (int e = 0; e < V; e++) {
            gf[e] = __bfloat162float(g.h[e]), xf[e] = __bfloat162float(x.h[e]);
            dot += gf[e] * (h < H ? sq[e] : sk[e]) * xf[e];
        }
        dot = warp_sum(dot);
        float r = rstd[row * NH + h], kk = dot * r * r * r / (float)D;
#pragma unroll
        for (int e = 0; e < V; e++) {
            float c = gf[e] * xf[e] * r;
            if (h < H) pq[e] += c;
            else pk[e] += c;
            g.h[e] = __float2bfloat16_rn(gf[e] * (h < H ? sq[e] : sk[e]) * r - xf[e] * kk);
            if (fold) m = qt_amax_fold(m, __bfloat162float(g.h[e]));
        }
        *gp = g;
    }
    for (long long it = wid; fold && it < nrow * Hkv; it += nw) {
        long long row = r0 + it / Hkv;
        int h = NH + (int)(it - (row - r0) * Hkv);
        qkn_vec<V> g = *(const qkn_vec<V> *)(dqkv + row * stride + (long long)h * D + lane * V);
#pragma unroll
        for (int e = 0; e < V; e++) m = qt_amax_fold(m, __bfloat162float(g.h[e]));
    }
    if (ws) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            qkn_part[wid * 2 * D + lane * V + e] = pq[e];
            qkn_part[wid * 2 * D + D + lane * V + e] = pk[e];
        }
        __syncthreads();
        for (int t = threadIdx.x; t < 2 * D; t += blockDim.x) {
            float s = 0.0f;
            for (int j = 0; j < nw; j++) s += qkn_part[j * 2 * D + t];
            ws[blockIdx.x * 2LL * D + t] = s;
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

/* The vector layout's V for head dim D and these rows, or 0 (the strided layout). */
static int qkn_vec_width(int D, const void *a, const void *b, const void *c) {
    int V = D % 32 ? 0 : D / 32;
    if (V != 2 && V != 4 && V != 8) return 0;
    uintptr_t al = (uintptr_t)(2 * V) - 1;
    return ((uintptr_t)a & al) || ((uintptr_t)b & al) || ((uintptr_t)c & al) ? 0 : V;
}

static unsigned qkn_blocks(long long warps) {
    long long b = (warps + QKN_THREADS / 32 - 1) / (QKN_THREADS / 32);
    return (unsigned)(b < 1 ? 1 : b > 65535LL * 16 ? 65535LL * 16 : b);
}

extern "C" size_t qt_qknorm_ws_bytes(int D) { return (size_t)QKN_PARTS * 2 * (size_t)D * sizeof(float); }

static void qknorm_fwd(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D, float eps,
                       int one_plus, cudaStream_t s) {
    QT_CHECK(D > 0 && H > 0 && Hkv > 0, "qk norm: H %d, Hkv %d, D %d: expected positive sizes", H, Hkv, D);
    if (n <= 0) return;
    unsigned blocks = qkn_blocks((long long)n * (H + Hkv));
    bf16 *x = (bf16 *)qkv, *sv = (bf16 *)save;
    const bf16 *wb = (const bf16 *)w;
    switch (qkn_vec_width(D, qkv, save, w)) {
    case 2: qknorm_fwd_vec_kernel<2><<<blocks, QKN_THREADS, 0, s>>>(x, sv, rstd, wb, n, H, Hkv, eps, one_plus); break;
    case 4: qknorm_fwd_vec_kernel<4><<<blocks, QKN_THREADS, 0, s>>>(x, sv, rstd, wb, n, H, Hkv, eps, one_plus); break;
    case 8: qknorm_fwd_vec_kernel<8><<<blocks, QKN_THREADS, 0, s>>>(x, sv, rstd, wb, n, H, Hkv, eps, one_plus); break;
    default: qknorm_fwd_kernel<<<blocks, QKN_THREADS, 0, s>>>(x, sv, rstd, wb, n, H, Hkv, D, eps, one_plus);
    }
    QT_CUDA(cudaGetLastError());
}

static void qknorm_bwd(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd, long n,
                       int H, int Hkv, int D, float *amax, void *ws, int one_plus, cudaStream_t s) {
    QT_CHECK(D > 0 && D <= QKN_MAX_D && H > 0 && Hkv > 0, "qk norm bwd: H %d, Hkv %d, D %d: expected positive sizes, "
             "D <= %d", H, Hkv, D, QKN_MAX_D);
    QT_CHECK(!dw || dw_dt == QT_DT_F32 || dw_dt == QT_DT_BF16, "qk norm bwd: dw dtype %s: expected fp32 or bf16",
             qt_dtype_name(dw_dt));
    if (n <= 0) return;
    long long parts = n < QKN_PARTS ? n : QKN_PARTS, chunk = (n + parts - 1) / parts;
    parts = (n + chunk - 1) / chunk;
    int V = qkn_vec_width(D, dqkv, save, w);
    float *part = dw ? (float *)ws : NULL;
    size_t shm = (size_t)(QKN_THREADS / 32) * 2 * (size_t)D * sizeof(float);
    bf16 *g = (bf16 *)dqkv;
    const bf16 *x = (const bf16 *)save, *wb = (const bf16 *)w;
    unsigned grid = (unsigned)parts;
    long long k = chunk;
    if (V == 2) qknorm_bwd_vec_kernel<2><<<grid, QKN_THREADS, shm, s>>>(g, part, x, wb, rstd, n, H, Hkv, k, amax, one_plus);
    if (V == 4) qknorm_bwd_vec_kernel<4><<<grid, QKN_THREADS, shm, s>>>(g, part, x, wb, rstd, n, H, Hkv, k, amax, one_plus);
    if (V == 8) qknorm_bwd_vec_kernel<8><<<grid, QKN_THREADS, shm, s>>>(g, part, x, wb, rstd, n, H, Hkv, k, amax, one_plus);
    if (!V && dw) /* first: dx overwrites dy */
        qknorm_dw_part_kernel<<<(unsigned)parts, (2 * D + 31) / 32 * 32, 0, s>>>(part, g, x, rstd, n, H, Hkv, D, chunk);
    QT_CUDA(cudaGetLastError());
    if (dw) {
        qknorm_dw_sum_kernel<<<(unsigned)(2 * D), QKN_THREADS, 0, s>>>(dw, dw_dt == QT_DT_BF16, part, (int)parts, D);
        QT_CUDA(cudaGetLastError());
    }
    if (!V) {
        qknorm_bwd_kernel<<<qkn_blocks((long long)n * (H + Hkv + (amax ? Hkv : 0))), QKN_THREADS, 0, s>>>(
            g, x, wb, rstd, n, H, Hkv, D, amax, one_plus);
        QT_CUDA(cudaGetLastError());
    }
}

extern "C" void qt_qknorm_fwd(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D,
                              float eps, cudaStream_t s) {
    qknorm_fwd(qkv, save, rstd, w, n, H, Hkv, D, eps, 0, s);
}

extern "C" void qt_qknorm1p_fwd(void *qkv, void *save, float *rstd, const void *w, long n, int H, int Hkv, int D,
                                float eps, cudaStream_t s) {
    qknorm_fwd(qkv, save, rstd, w, n, H, Hkv, D, eps, 1, s);
}

extern "C" void qt_qknorm_bwd(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd,
                              long n, int H, int Hkv, int D, float *amax, void *ws, cudaStream_t s) {
    qknorm_bwd(dqkv, dw, dw_dt, save, w, rstd, n, H, Hkv, D, amax, ws, 0, s);
}

extern "C" void qt_qknorm1p_bwd(void *dqkv, void *dw, qt_dtype dw_dt, const void *save, const void *w, const float *rstd,
                                long n, int H, int Hkv, int D, float *amax, void *ws, cudaStream_t s) {
    qknorm_bwd(dqkv, dw, dw_dt, save, w, rstd, n, H, Hkv, D, amax, ws, 1, s);
}
