/* lmhead_loss.cu — fused softmax cross-entropy over a chunk of LM-head logits, writing dlogits in place.
 *
 * logits[n,v] bf16, tgt[n] int32 -> loss[n] fp32 (=), lse[n] fp32 (=, optional) and, over the logits,
 * dlogits[n,v] = bf16(scale * (softmax - onehot(tgt)))  (one RNE rounding).
 * Three kernels, the same arithmetic (fp32; exponentials via exp2f on prescaled arguments; per-thread
 * partials merged as (max, sum of exp(x - max)) pairs in fixed trees, so each is deterministic):
 *  - two-pass (any GPU, any v; what qt_lmhead_loss runs): one block per row; (1) an online max / sum per
 *    thread, (2) p = exp(x - lse) and the in-place write; the second read of the row mostly hits L2.
 *    16-byte vectors when v % 8 == 0 and logits is 16-byte aligned.
 *  - cluster (sm_90+, v <= LMC_MAX_V): a thread-block cluster of up to 8 CTAs per row. Each CTA loads
 *    its slice of the row into registers once, the CTAs swap their (max, sum) partials through
 *    distributed shared memory, and each writes dlogits from the values it holds: one read and one
 *    write of the row. 16-byte vectors on any alignment: a scalar head up to the first 16-byte boundary
 *    of the row and a scalar tail, held by the last CTA.
 *  - pipelined (sm_90+, the same v): the cluster kernel's arithmetic in persistent clusters that stage
 *    two rows in shared memory (cp.async), so that the next row's loads are in flight while a CTA
 *    reduces, waits at the cluster barrier and writes back. Still one read and one write.
 * Rows with tgt < 0 are ignored (loss 0, lse 0, dlogits 0); tgt >= v gives loss NaN and dlogits 0 so
 * that the bad target cannot go unnoticed.
 * Soft-cap (Gemma's final_logit_softcapping, cap > 0; a template parameter, so the uncapped kernels are
 * unchanged): every kernel reads z = cap * tanhf(x / cap) (fp32) in place of the logit x, lse and the loss are
 * over z, and dlogits are w.r.t. x: scale * (softmax(z) - onehot) * (1 - tanh^2). z is increasing in x, so
 * the cluster kernels take the row maximum on the raw bf16 values and cap it.
 * qt_sum_f32: one block, fp64 accumulation in a fixed order. */
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "kcommon.cuh"
#include "qt_kernels.h"

#define LM_THREADS 512
#define LMC_VECS 8    /* bf16x8 vectors each thread of the cluster kernel holds in registers */
#define LMC_TARGET 4  /* vectors per thread below which a row takes a smaller cluster */
#define LMC_MAX_CLUSTER 8 /* the portable cluster size */
#define LMC_MAX_V (LMC_MAX_CLUSTER * LM_THREADS * LMC_VECS * 8)
#define L2E 1.4426950408889634f

/* Merges (m2, s2) into (m, s): both are max and sum of exp(x - max) over disjoint sets. */
static __device__ __forceinline__ void ms_merge(float *m, float *s, float m2, float s2) {
    float M = fmaxf(*m, m2);
    if (M == -INFINITY) return; /* both empty */
    *s = *s * exp2f((*m - M) * L2E) + s2 * exp2f((m2 - M) * L2E);
    *m = M;
}

/* Merges every thread's (m, s) over the block in a fixed-shape tree (warp shuffles, then warp 0 over
 * the per-warp pairs); the result is valid in thread 0. Its shared slots are not guarded: a second
 * call must come after a __syncthreads that follows the first call's reads (warp 0's). */
static __device__ void block_ms(float *m, float *s) {
    __shared__ float shm[32], shs[32];
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, *m, o), s2 = __shfl_xor_sync(0xffffffffu, *s, o);
        ms_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { shm[wid] = *m; shs[wid] = *s; }
    __syncthreads();
    if (wid == 0) {
        *m = lane < nw ? shm[lane] : -INFINITY;
        *s = lane < nw ? shs[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, *m, o), s2 = __shfl_xor_sync(0xffffffffu, *s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

/* The logit the loss reads: x, or (CAP) cap * tanh(x / cap). */
template <int CAP>
static __device__ __forceinline__ float softcap(float x, float cap) {
    return CAP ? cap * tanhf(x / cap) : x;
}

/* dlogit of one element x at column j, from the row's lse; the target's thread also writes the loss. With CAP
 * the loss reads z = softcap(x) and the gradient takes the factor dz/dx = 1 - tanh^2. */
template <int CAP>
static __device__ __forceinline__ float dlogit(float x, int j, int t, float l, float scale, float cap, float *loss) {
    float th = CAP ? tanhf(x / cap) : 0.0f, z = CAP ? cap * th : x;
    float p = exp2f((z - l) * L2E);
    if (j == t) {
        *loss = l - z;
        p -= 1.0f;
    }
#ifndef QT_MUTANT_SOFTCAP_NO_DERIV
    return CAP ? scale * p * (1.0f - th * th) : scale * p;
#else /* a test build: the tanh derivative left out, which the capped lmhead_loss rows of test_ops_gpu must catch */
    return scale * p;
#endif
}

template <int CAP>
__global__ void lmhead_loss_fwd_kernel(bf16 *logits, float *loss, float *lse_out, const int32_t *tgt, int v,
                                       float scale, float cap, int vec) {
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
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float a[8];
            ld8(a, x + j);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = softcap<CAP>(a[i], cap);
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
            float a = softcap<CAP>(__bfloat162float(x[j]), cap);
            if (a > m) {
                s = m == -INFINITY ? 0.0f : s * exp2f((m - a) * L2E);
                m = a;
            }
            s += exp2f((a - m) * L2E);
        }
    }
    block_ms(&m, &s);
    if (threadIdx.x == 0) {
        float l = m + logf(s);
        sh_lse = l;
        if (lse_out) lse_out[row] = l;
    }
    __syncthreads();
    float l = sh_lse;
    if (vec) {
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float a[8];
            ld8(a, x + j);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = dlogit<CAP>(a[i], j + i, t, l, scale, cap, &loss[row]);
            st8(x + j, a);
        }
    } else {
        for (int j = threadIdx.x; j < v; j += blockDim.x)
            x[j] = __float2bfloat16_rn(dlogit<CAP>(__bfloat162float(x[j]), j, t, l, scale, cap, &loss[row]));
    }
}

#if __CUDA_ARCH__ >= 900 /* the cluster kernels' helpers (their bodies are sm_90+ only) */
/* Where one row lies for CTA cr of a cluster of cn: h scalars up to the row's first 16-byte boundary, nv
 * bf16x8 vectors, then a scalar tail. CTA cr takes vectors [v0, v1); its thread tid holds the cnt vectors
 * v0 + tid + k*LM_THREADS, and thread tid of the last CTA scalar column sj (-1: none). */
typedef struct { int h, nv, v0, v1, cnt, sj; } lmc_geom;
static __device__ __forceinline__ lmc_geom lmc_slice(const bf16 *x, int v, int cn, int cr) {
    lmc_geom q;
    int tid = threadIdx.x;
    q.h = min((int)(((16 - ((uintptr_t)x & 15)) & 15) >> 1), v);
    q.nv = (v - q.h) >> 3;
    int ns = v - 8 * q.nv, per = (q.nv + cn - 1) / cn;
    q.v0 = cr * per;
    q.v1 = min(q.v0 + per, q.nv);
    q.cnt = q.v1 - q.v0 - tid > 0 ? (q.v1 - q.v0 - tid + LM_THREADS - 1) / LM_THREADS : 0;
    q.sj = cr == cn - 1 && tid < ns ? tid + (tid < q.h ? 0 : 8 * q.nv) : -1;
    return q;
}

/* This thread's (max, sum of exp(x - max)) over its vectors d[k*stride], k < cnt, and (has_s) xs; x the
 * soft-capped logits with CAP (the max capped after it is taken on the raw values). */
template <int CAP>
static __device__ __forceinline__ void lmc_ms(const bf16x8 *d, int stride, int cnt, float xs, int has_s, float cap,
                                              float *m, float *s) {
    /* The max in packed bf16 (exact): unpacking to fp32 here would keep 64 floats live. */
    __nv_bfloat162 m2 = __float2bfloat162_rn(-INFINITY);
#pragma unroll
    for (int k = 0; k < LMC_VECS; k++)
        if (k < cnt)
#pragma unroll
            for (int i = 0; i < 4; i++) m2 = __hmax2(m2, ((const __nv_bfloat162 *)&d[k * stride])[i]);
    *m = fmaxf(xs, fmaxf(__low2float(m2), __high2float(m2)));
    if (CAP && *m > -INFINITY) *m = softcap<CAP>(*m, cap);
    *s = has_s ? exp2f((softcap<CAP>(xs, cap) - *m) * L2E) : 0.0f;
#pragma unroll
    for (int k = 0; k < LMC_VECS; k++)
        if (k < cnt)
#pragma unroll
            for (int i = 0; i < 8; i++) *s += exp2f((softcap<CAP>(__bfloat162float(d[k * stride].h[i]), cap) - *m) * L2E);
}

/* Writes the dlogits of the staged vectors d[k*stride], k < cnt, to p[k*LM_THREADS] (zeros unless ok).
 * tc: the target's column relative to this thread's first vector. */
template <int CAP>
static __device__ __forceinline__ void lmc_store(bf16x8 *p, const bf16x8 *d, int stride, int cnt, int tc, float l,
                                                 float scale, float cap, float *loss, int ok) {
#pragma unroll
    for (int k = 0; k < LMC_VECS; k++)
        if (k < cnt) {
            float a[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                a[i] = ok ? dlogit<CAP>(__bfloat162float(d[k * stride].h[i]), 8 * k * LM_THREADS + i, tc, l, scale,
                                        cap, loss)
                          : 0.0f;
            st8((bf16 *)(p + k * LM_THREADS), a);
        }
}

/* The row's lse from every thread's (m, s) over the cluster, in every thread; one cluster barrier. part: 2
 * floats of this CTA's shared memory that the other CTAs read after the barrier, so the caller keeps
 * them (and this CTA) until a later cluster barrier. Every CTA merges the partials in the same tree:
 * the same lse. */
static __device__ __forceinline__ float cluster_lse(float *part, float m, float s) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float sh_lse;
    int cn = (int)cl.num_blocks();
    block_ms(&m, &s);
    if (threadIdx.x == 0) { part[0] = m; part[1] = s; }
    cl.sync(); /* every CTA's partial is visible cluster-wide (and every CTA has started) */
    if (threadIdx.x < 32) {
        float pm = -INFINITY, ps = 0.0f;
        if ((int)threadIdx.x < cn) {
            const float *q = cl.map_shared_rank(part, threadIdx.x);
            pm = q[0];
            ps = q[1];
        }
        for (int o = LMC_MAX_CLUSTER / 2; o > 0; o >>= 1) {
            float qm = __shfl_xor_sync(0xffffffffu, pm, o), qs = __shfl_xor_sync(0xffffffffu, ps, o);
            ms_merge(&pm, &ps, qm, qs);
        }
        if (threadIdx.x == 0) sh_lse = pm + logf(ps);
    }
    __syncthreads();
    return sh_lse;
}

/* Starts copying this thread's vectors of row `row` (none past the last row) into sb[k*LM_THREADS +
 * tid], as one cp.async group (committed even when empty, so that groups and rows stay in step). .cg:
 * the row is streamed, L1 would only evict. */
static __device__ __forceinline__ void lmp_fetch(bf16x8 *sb, bf16 *logits, long long row, long long n, int v,
                                                 int cn, int cr) {
    if (row < n) {
        bf16 *x = logits + row * v;
        lmc_geom q = lmc_slice(x, v, cn, cr);
        const bf16x8 *src = (const bf16x8 *)(x + q.h) + q.v0 + threadIdx.x;
#pragma unroll
        for (int k = 0; k < LMC_VECS; k++)
            if (k < q.cnt) {
                unsigned dst = (unsigned)__cvta_generic_to_shared(sb + k * LM_THREADS + threadIdx.x);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + k * LM_THREADS)
                             : "memory");
            }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
#endif

/* One cluster of cn CTAs per row (grid = n * cn), the slice (lmc_slice) in registers. The launcher
 * guarantees per <= LM_THREADS * LMC_VECS. */
template <int CAP>
__global__ void __launch_bounds__(LM_THREADS, 2)
lmhead_loss_cluster_fwd_kernel(bf16 *logits, float *loss, float *lse_out, const int32_t *tgt, int v,
                               float scale, float cap) {
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float part[2];
    int cn = (int)cl.num_blocks(), cr = (int)cl.block_rank(), tid = threadIdx.x;
    long long row = blockIdx.x / cn;
    bf16 *x = logits + row * v;
    int t = tgt[row];
    lmc_geom q = lmc_slice(x, v, cn, cr);
    bf16x8 *xv = (bf16x8 *)(x + q.h), *p = xv + q.v0 + tid;
    if (t < 0 || t >= v) { /* the same row for the whole cluster: all CTAs leave here together */
        float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = q.v0 + tid; j < q.v1; j += LM_THREADS) st8((bf16 *)(xv + j), z);
        if (q.sj >= 0) x[q.sj] = __float2bfloat16_rn(0.0f);
        if (cr == 0 && tid == 0) {
            loss[row] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
            if (lse_out) lse_out[row] = 0.0f;
        }
        return;
    }
    /* Every load is issued before any is used, so the whole slice is in flight at once. */
    bf16x8 d[LMC_VECS];
#pragma unroll
    for (int k = 0; k < LMC_VECS; k++)
        if (k < q.cnt) d[k] = p[k * LM_THREADS];
    float xs = q.sj >= 0 ? __bfloat162float(x[q.sj]) : -INFINITY, m, s;
    lmc_ms<CAP>(d, 1, q.cnt, xs, q.sj >= 0, cap, &m, &s);
    float l = cluster_lse(part, m, s);
    cl.barrier_arrive(); /* done reading the other CTAs' shared memory; they may exit after the wait */
    if (cr == 0 && tid == 0 && lse_out) lse_out[row] = l;
    lmc_store<CAP>(p, d, 1, q.cnt, t - q.h - 8 * (q.v0 + tid), l, scale, cap, &loss[row], 1);
    if (q.sj >= 0) x[q.sj] = __float2bfloat16_rn(dlogit<CAP>(xs, q.sj, t, l, scale, cap, &loss[row]));
    cl.barrier_wait();
#elif defined(__CUDA_ARCH__)
    __trap(); /* the launcher picks this kernel on sm_90+ only */
#endif
}

/* Persistent clusters (grid = g * cn, g <= n clusters, all resident): cluster c takes rows c, c+g, ...
 * Each CTA stages its slices (lmc_slice) in shared memory, two rows deep: row i+1 is in flight (cp.async)
 * while row i is reduced, waits at the cluster barrier and is written back, so the SM keeps loads
 * outstanding through the barrier and the compute, which the one-row-per-cluster kernel cannot (its
 * loads stop from its first exponential to its exit). Dynamic shared memory: 2 * cap * LM_THREADS
 * bf16x8, cap >= every row's cnt. */
template <int CAP>
__global__ void __launch_bounds__(LM_THREADS, 2)
lmhead_loss_pipe_fwd_kernel(bf16 *logits, float *loss, float *lse_out, const int32_t *tgt, long long n, int v,
                            float scale, float softcap_v, int cap) {
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    extern __shared__ __align__(16) unsigned char lmp_smem[];
    __shared__ float part[2][2]; /* by barrier parity: a slot is rewritten two barriers after its reads */
    cg::cluster_group cl = cg::this_cluster();
    int cn = (int)cl.num_blocks(), cr = (int)cl.block_rank(), tid = threadIdx.x, nb = 0;
    long long g = gridDim.x / cn, row = blockIdx.x / cn;
    bf16x8 *sb0 = (bf16x8 *)lmp_smem, *sb1 = sb0 + cap * LM_THREADS;
    lmp_fetch(sb0, logits, row, n, v, cn, cr);
    lmp_fetch(sb1, logits, row + g, n, v, cn, cr);
    for (long long i = 0; row < n; row += g, i++) {
        bf16x8 *sb = i & 1 ? sb1 : sb0;
        bf16 *x = logits + row * v;
        lmc_geom q = lmc_slice(x, v, cn, cr);
        int t = tgt[row], ok = t >= 0 && t < v; /* the same row for the whole cluster: barriers stay paired */
        float xs = q.sj >= 0 ? __bfloat162float(x[q.sj]) : -INFINITY, l = 0.0f;
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); /* this row's group; the next stays in flight */
        if (ok) {
            float m, s;
            lmc_ms<CAP>(sb + tid, LM_THREADS, q.cnt, xs, q.sj >= 0, softcap_v, &m, &s);
            l = cluster_lse(part[nb++ & 1], m, s);
        }
        lmc_store<CAP>((bf16x8 *)(x + q.h) + q.v0 + tid, sb + tid, LM_THREADS, q.cnt, t - q.h - 8 * (q.v0 + tid), l,
                       scale, softcap_v, &loss[row], ok);
        if (q.sj >= 0)
            x[q.sj] = __float2bfloat16_rn(ok ? dlogit<CAP>(xs, q.sj, t, l, scale, softcap_v, &loss[row]) : 0.0f);
        if (cr == 0 && tid == 0) {
            if (!ok) loss[row] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
            if (lse_out) lse_out[row] = l;
        }
        /* cp.async writes are not ordered after this thread's own earlier reads of the stage */
        __syncthreads();
        lmp_fetch(sb, logits, row + 2 * g, n, v, cn, cr);
    }
    cl.sync(); /* no CTA exits while another may still read its part[] */
#elif defined(__CUDA_ARCH__)
    __trap(); /* the launcher picks this kernel on sm_90+ only */
#endif
}

__global__ void sum_fwd_kernel(double *sum, const float *x, long n) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) acc += (double)x[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *sum += acc;
}

/* CTAs per row for the cluster kernel: the fewest (1, 2, 4, 8) that leave each thread at most
 * LMC_TARGET vectors, else 8; 0 when the row does not fit LMC_MAX_CLUSTER CTAs' registers. */
static int lmc_cluster_size(int v) {
    long nv = v / 8; /* at least the kernel's nv */
    if (nv > (long)LMC_MAX_CLUSTER * LM_THREADS * LMC_VECS) return 0;
    int cn = 1;
    while (cn < LMC_MAX_CLUSTER && nv > (long)cn * LM_THREADS * LMC_TARGET) cn *= 2;
    return cn;
}

/* Launches the cluster (one row per cluster) or the pipelined (persistent clusters) kernel with clusters of
 * cn CTAs; returns 0, launching nothing, where the pipelined one cannot be resident. */
template <int CAP>
static int lmc_launch(qt_lmhead_impl impl, bf16 *logits, float *loss, float *lse, const int32_t *tgt, long n,
                      int v, float scale, float softcap_v, int cn, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cn;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(LM_THREADS);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (impl != QT_LMHEAD_CLUSTER_PIPE) {
        cfg.gridDim = dim3((unsigned)(n * cn));
        QT_CUDA(cudaLaunchKernelEx(&cfg, lmhead_loss_cluster_fwd_kernel<CAP>, logits, loss, lse, tgt, v, scale,
                                   softcap_v));
        return 1;
    }
    /* cap: vectors per thread of the widest slice (h = 0); <= LMC_VECS by lmc_cluster_size */
    int cap = ((v / 8 + cn - 1) / cn + LM_THREADS - 1) / LM_THREADS, g = 0;
    cfg.dynamicSmemBytes = (size_t)2 * cap * LM_THREADS * sizeof(bf16x8);
    /* the largest stage pair any v may ask for: the same value from every thread, so no race */
    QT_CUDA(cudaFuncSetAttribute(lmhead_loss_pipe_fwd_kernel<CAP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(2 * LMC_VECS * LM_THREADS * sizeof(bf16x8))));
    cfg.gridDim = dim3((unsigned)cn);
    QT_CUDA(cudaOccupancyMaxActiveClusters(&g, lmhead_loss_pipe_fwd_kernel<CAP>, &cfg));
    if (g < 1) return 0;
    if (g > n) g = (int)n;
    cfg.gridDim = dim3((unsigned)(g * cn));
    QT_CUDA(cudaLaunchKernelEx(&cfg, lmhead_loss_pipe_fwd_kernel<CAP>, logits, loss, lse, tgt, (long long)n, v, scale,
                               softcap_v, cap));
    return 1;
}

extern "C" qt_lmhead_impl qt_lmhead_loss_softcap(qt_lmhead_impl impl, void *logits, float *loss, float *lse,
                                                 const int32_t *tgt, long n, int v, float scale, float softcap_v,
                                                 cudaStream_t s) {
    QT_CHECK(n < 2147483647L, "lmhead loss: chunk of %ld rows: expected fewer than 2^31", n);
    QT_CHECK(softcap_v >= 0.0f && softcap_v < INFINITY, "lmhead loss: soft-cap %g: expected 0 (none) or a finite value > 0",
             softcap_v);
    if (n <= 0 || v <= 0) return QT_LMHEAD_TWO_PASS;
    int dev, major, cn = lmc_cluster_size(v);
    QT_CUDA(cudaGetDevice(&dev));
    QT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    /* AUTO is the two-pass kernel: on an H200 (kernels_bench lmhead, V = 151936) it runs 2,777 GB/s at 16,384
     * rows (the chunk a micro-step makes) and 2,512 at 1,024, against the cluster kernel's 2,232 / 2,171 and
     * the pipelined one's 1,850 / 1,800: its second read of a row mostly hits L2. kernels_bench and
     * test_kernels call the cluster kernels by name. */
    if (impl == QT_LMHEAD_AUTO) impl = QT_LMHEAD_TWO_PASS;
    if (impl != QT_LMHEAD_TWO_PASS && major >= 9 && cn > 0 && n * cn < 2147483647L &&
        (softcap_v > 0.0f ? lmc_launch<1> : lmc_launch<0>)(impl, (bf16 *)logits, loss, lse, tgt, n, v, scale, softcap_v,
                                                           cn, s))
        return impl;
    int vec = v % 8 == 0 && qt_aligned16(logits);
    (softcap_v > 0.0f ? lmhead_loss_fwd_kernel<1> : lmhead_loss_fwd_kernel<0>)<<<(unsigned)n, LM_THREADS, 0, s>>>(
        (bf16 *)logits, loss, lse, tgt, v, scale, softcap_v, vec);
    QT_CUDA(cudaGetLastError());
    return QT_LMHEAD_TWO_PASS;
}

extern "C" qt_lmhead_impl qt_lmhead_loss_with(qt_lmhead_impl impl, void *logits, float *loss, float *lse,
                                              const int32_t *tgt, long n, int v, float scale, cudaStream_t s) {
    return qt_lmhead_loss_softcap(impl, logits, loss, lse, tgt, n, v, scale, 0.0f, s);
}

extern "C" void qt_lmhead_loss(void *logits, float *loss, float *lse, const int32_t *tgt, long n, int v,
                               float scale, cudaStream_t s) {
    qt_lmhead_loss_with(QT_LMHEAD_AUTO, logits, loss, lse, tgt, n, v, scale, s);
}

extern "C" void qt_sum_f32(double *sum, const float *x, long n, cudaStream_t s) {
    if (n <= 0) return;
    sum_fwd_kernel<<<1, 1024, 0, s>>>(sum, x, n);
    QT_CUDA(cudaGetLastError());
}
