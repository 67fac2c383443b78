/* adamw.cu — AdamW over the whole flat parameter array in one launch (multi-tensor via a block table).
 *
 * Per element i of tensor k (wd_k from the plan's table), with gs = *grad_scale (g fp32 or bf16, read
 * exactly as fp32):
 *   g = g_i * gs;  m = b1 m + (1-b1) g;  v = b2 v + ((1-b2) g) g
 *   w -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd_k w),   bc = 1 - b^t (double, rounded to fp32)
 * exactly the fp32 operations of qt_adamw_cpu, in the same order, with explicit _rn intrinsics so the
 * compiler cannot contract them into FMAs: the fp32 master path matches the CPU bit for bit.
 * m, v: fp32 or bf16 (RNE). Weight: fp32 master (optional) and/or bf16 copy (RNE, or stochastic:
 * add 16 random bits from hash(seed, t, i) under the bf16 mantissa, then truncate: rounds up with
 * probability (distance to the lower neighbour) / ulp, so the rounding is unbiased). Without a master
 * (precision.master_dtype bf16) the bf16 weight is read, updated in fp32 and rounded back the same way.
 * absmax[k] = max |new weight| over tensor k: block max, then atomicMax on the fp32 bit pattern, which
 * orders like the value for non-negative floats, so the result does not depend on block order.
 * *nonfinite += the new weights whose |value| bits reach the all-ones exponent (NaN/Inf): a block sum, then
 * one atomicAdd (integers: exact in any order); this is the engine's per-step finiteness check, made
 * while the weights pass through here instead of a second read of them (host memory when offloaded).
 * Grid: every tensor is cut into ADAM_CH-element chunks, one block each; a block finds its tensor by
 * binary search over the table's first-block column. Within a chunk, threads take groups of 4
 * elements at flat indices that are multiples of 4 (float4 loads/stores of the fp32 arrays, 8-byte
 * ones of the bf16 arrays), with the chunk's unaligned head and tail done element by element; the
 * arithmetic per element is the same function either way.
 * Sharded state (ZeRO-1): master, m and v may hold only a rank's pieces of the array (the plan then
 * covers only those), each table entry saying where its elements sit (index i - shift); w_bf16 and g
 * stay whole arrays and the stochastic-rounding hash keeps the flat index, so a shard updates exactly
 * as the whole would; each entry's sr_shift moves that index to the compact layout's (qt_model.h), so a padded
 * layout rounds as the compact one. With qt_adamw_args.g_at_state (ZeRO-2) g too holds only the pieces, indexed like
 * m and v; with w_at_state (ZeRO-3) w_bf16 too (the hash keeps the flat index). */
#include <math.h>
#include <stdlib.h>

#include "kcommon.cuh"
#include "qt_kernels.h"

#define ADAM_THREADS 256
#define ADAM_CH 4096

/* The stochastic-rounding hash takes the element's flat index i, never its state index j (relative to
 * a ZeRO-1 rank's pieces or an offload slot): that is what makes the bits independent of the cut.
 * QT_MUTANT_SR_STATE_INDEX (a test build only: tools/gpu-check.sh bf16master) hashes j instead, which
 * test_kernels' cut test must catch. */
#ifdef QT_MUTANT_SR_STATE_INDEX
#define SR_INDEX(i, j) (j)
#else
#define SR_INDEX(i, j) (i)
#endif

typedef struct {
    unsigned long long offset, numel, block0;
    unsigned long long shift; /* flat index - state index of this entry's elements */
    unsigned long long sr_shift; /* flat index - the stochastic rounding's hash index */
    float wd;
} adam_entry;

struct qt_adamw_plan {
    adam_entry *table; /* device */
    int n;
    unsigned long long blocks;
    int shift4;        /* every shift is a multiple of 4 (the vector path keeps its alignment) */
};

typedef struct {
    float lr, b1, b2, omb1, omb2, eps, bc1, bc2;
    long t;
    unsigned long long seed;
    int sr, m_bf16, v_bf16, g_bf16;
    int g_state;       /* g is indexed like m and v (a ZeRO-2 rank's gradient shard), else by flat index */
    int w_state;       /* w_bf16 too (a ZeRO-3 rank's weight shard) */
} adam_params;

static __device__ __forceinline__ unsigned int adam_hash(unsigned long long seed, long t,
                                                         unsigned long long i) {
    unsigned long long z = seed + 0x9E3779B97F4A7C15ull * (unsigned long long)(t + 1);
    z ^= i * 0xD6E8FEB86659FD93ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned int)(z ^ (z >> 31));
}

static __device__ __forceinline__ bf16 round_sr(float w, unsigned int r) {
    unsigned int u = __float_as_uint(w);
    if ((u & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(w); /* inf / NaN */
    u += r & 0xffffu;
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}

/* The update of one element: m, v, w in, m, v, w out. Explicit _rn intrinsics: no FMA contraction. */
static __device__ __forceinline__ void adam_elem(float gr, float *m, float *v, float *w, float gs, float wd,
                                                 const adam_params *p) {
    float gi = __fmul_rn(gr, gs);
    float mi = __fadd_rn(__fmul_rn(p->b1, *m), __fmul_rn(p->omb1, gi));
    float vi = __fadd_rn(__fmul_rn(p->b2, *v), __fmul_rn(__fmul_rn(p->omb2, gi), gi));
    float upd = __fdiv_rn(__fdiv_rn(mi, p->bc1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, p->bc2)), p->eps));
    *m = mi;
    *v = vi;
    *w = __fsub_rn(*w, __fmul_rn(p->lr, __fadd_rn(upd, __fmul_rn(wd, *w))));
}

/* bf16 rounding of the new weight at flat index i (RNE or stochastic). */
static __device__ __forceinline__ bf16 adam_round(float w, unsigned long long i, const adam_params *p) {
    return p->sr ? round_sr(w, adam_hash(p->seed, p->t, i)) : __float2bfloat16_rn(w);
}

/* 4 consecutive fp32 or bf16 values at element i (i % 4 == 0; 16- or 8-byte aligned). */
static __device__ __forceinline__ void ld4(float *f, const void *p, int is_bf16, unsigned long long i) {
    if (is_bf16) {
        uint2 u = *(const uint2 *)((const bf16 *)p + i);
        __nv_bfloat162 a = *(__nv_bfloat162 *)&u.x, b = *(__nv_bfloat162 *)&u.y;
        f[0] = __low2float(a); f[1] = __high2float(a); f[2] = __low2float(b); f[3] = __high2float(b);
    } else {
        float4 a = *(const float4 *)((const float *)p + i);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    }
}
static __device__ __forceinline__ void st4(void *p, int is_bf16, unsigned long long i, const float *f) {
    if (is_bf16) {
        __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]), b = __floats2bfloat162_rn(f[2], f[3]);
        uint2 u;
        u.x = *(unsigned int *)&a;
        u.y = *(unsigned int *)&b;
        *(uint2 *)((bf16 *)p + i) = u;
    } else {
        *(float4 *)((float *)p + i) = make_float4(f[0], f[1], f[2], f[3]);
    }
}
static __device__ __forceinline__ float ld_mv(const void *p, int is_bf16, unsigned long long i) {
    return is_bf16 ? __bfloat162float(((const bf16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void st_mv(void *p, int is_bf16, unsigned long long i, float x) {
    if (is_bf16) ((bf16 *)p)[i] = __float2bfloat16_rn(x);
    else ((float *)p)[i] = x;
}

/* One scalar element (chunk head/tail, or every element when the arrays are not aligned). */
static __device__ __forceinline__ unsigned int adam_one(unsigned long long i, unsigned long long j,
                                                        unsigned long long sr_shift, bf16 *wb,
                                                        float *master, const void *g, void *m, void *v, float gs,
                                                        float wd, const adam_params *p) {
    float mi = ld_mv(m, p->m_bf16, j), vi = ld_mv(v, p->v_bf16, j);
    unsigned long long wi = p->w_state ? j : i;
    float w = master ? master[j] : __bfloat162float(wb[wi]);
    adam_elem(ld_mv(g, p->g_bf16, p->g_state ? j : i), &mi, &vi, &w, gs, wd, p);
    st_mv(m, p->m_bf16, j, mi);
    st_mv(v, p->v_bf16, j, vi);
    float wa = w;
    if (master) master[j] = w;
    if (wb) {
        bf16 h = adam_round(w, SR_INDEX(i - sr_shift, j), p);
        wb[wi] = h;
        wa = __bfloat162float(h);
    }
    return __float_as_uint(fabsf(wa));
}

/* A new weight's |value| bits u into the thread's abs-max and its NaN/Inf count (the all-ones exponent). */
static __device__ __forceinline__ void tally(unsigned int u, unsigned int *amax, unsigned int *nbad) {
    *amax = max(*amax, u);
    *nbad += u >= 0x7f800000u;
}

__global__ void __launch_bounds__(ADAM_THREADS)
adamw_fwd_kernel(const adam_entry *tab, int ntab, bf16 *wb, float *master, const void *g, void *m, void *v,
                 const float *grad_scale, float *absmax, unsigned *nonfinite, adam_params p, int vec) {
    __shared__ unsigned int sh[32], shn[ADAM_THREADS / 32];
    unsigned long long b = blockIdx.x;
    int lo = 0, hi = ntab - 1; /* last entry with block0 <= b */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[mid].block0 <= b) lo = mid;
        else hi = mid - 1;
    }
    adam_entry e = tab[lo];
    unsigned long long c0 = (b - e.block0) * ADAM_CH;
    unsigned long long c1 = c0 + ADAM_CH < e.numel ? c0 + ADAM_CH : e.numel;
    float gs = grad_scale ? *grad_scale : 1.0f, wd = e.wd;
    unsigned int amax = 0; /* bit pattern of max |w|: NaN (0x7fc00000) sorts above inf, so it survives */
    unsigned int nbad = 0; /* new weights with |w| bits >= 0x7f800000: Inf or NaN */
    /* absolute range [a0, a1): scalar head up to a multiple of 4, groups of 4, scalar tail */
    unsigned long long a0 = e.offset + c0, a1 = e.offset + c1, h = a0, t = a0;
    if (vec) {
        h = (a0 + 3) & ~3ull;
        if (h > a1) h = a1;
        t = h + ((a1 - h) & ~3ull);
        for (unsigned long long q = h / 4 + threadIdx.x; q < t / 4; q += ADAM_THREADS) {
            unsigned long long i = q * 4, j = i - e.shift;
            float gr[4], mi[4], vi[4], w[4];
            ld4(gr, g, p.g_bf16, p.g_state ? j : i);
            ld4(mi, m, p.m_bf16, j);
            ld4(vi, v, p.v_bf16, j);
            unsigned long long wi = p.w_state ? j : i;
            if (master) ld4(w, master, 0, j);
            else ld4(w, wb, 1, wi);
#pragma unroll
            for (int k = 0; k < 4; k++) adam_elem(gr[k], &mi[k], &vi[k], &w[k], gs, wd, &p);
            st4(m, p.m_bf16, j, mi);
            st4(v, p.v_bf16, j, vi);
            if (master) st4(master, 0, j, w);
            if (wb) {
                bf16 hb[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    hb[k] = adam_round(w[k], SR_INDEX(i + k - e.sr_shift, j + k), &p);
                    w[k] = __bfloat162float(hb[k]);
                }
                uint2 u;
                u.x = (unsigned int)__bfloat16_as_ushort(hb[0]) | ((unsigned int)__bfloat16_as_ushort(hb[1]) << 16);
                u.y = (unsigned int)__bfloat16_as_ushort(hb[2]) | ((unsigned int)__bfloat16_as_ushort(hb[3]) << 16);
                *(uint2 *)(wb + wi) = u;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) tally(__float_as_uint(fabsf(w[k])), &amax, &nbad);
        }
    }
    for (unsigned long long i = a0 + threadIdx.x; i < h; i += ADAM_THREADS)
        tally(adam_one(i, i - e.shift, e.sr_shift, wb, master, g, m, v, gs, wd, &p), &amax, &nbad);
    for (unsigned long long i = t + threadIdx.x; i < a1; i += ADAM_THREADS)
        tally(adam_one(i, i - e.shift, e.sr_shift, wb, master, g, m, v, gs, wd, &p), &amax, &nbad);
    if (absmax) {
        unsigned int u = amax;
        for (int o = 16; o > 0; o >>= 1) u = max(u, __shfl_xor_sync(0xffffffffu, u, o));
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = u;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < ADAM_THREADS / 32; k++) u = max(u, sh[k]);
            atomicMax((unsigned int *)&absmax[lo], u);
        }
    }
    if (nonfinite) { /* a kernel argument: every thread of the block takes this branch or none */
        for (int o = 16; o > 0; o >>= 1) nbad += __shfl_xor_sync(0xffffffffu, nbad, o);
        if ((threadIdx.x & 31) == 0) shn[threadIdx.x >> 5] = nbad;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < ADAM_THREADS / 32; k++) nbad += shn[k];
            unsigned old = nbad ? atomicAdd(nonfinite, nbad) : 0;
            if (old + nbad < old) atomicMax(nonfinite, 0xffffffffu); /* saturates: a block whose add wraps writes the maximum */
        }
    }
}

extern "C" qt_adamw_plan *qt_adamw_plan_create(const qt_adamw_tensor *t, int n_tensors) {
    QT_CHECK(n_tensors > 0, "adamw plan: %d tensors", n_tensors);
    adam_entry *h = (adam_entry *)malloc(sizeof(adam_entry) * (size_t)n_tensors);
    qt_adamw_plan *p = (qt_adamw_plan *)calloc(1, sizeof *p);
    QT_CHECK(h && p, "out of host memory");
    unsigned long long blocks = 0;
    p->shift4 = 1;
    for (int k = 0; k < n_tensors; k++) {
        QT_CHECK(t[k].state <= t[k].offset, "adamw plan: tensor %d at %zu has its state at %zu (expected <= offset)", k,
                 t[k].offset, t[k].state);
        h[k].shift = t[k].offset - t[k].state;
        p->shift4 &= h[k].shift % 4 == 0;
        QT_CHECK(t[k].sr_shift <= t[k].offset, "adamw plan: tensor %d at %zu has a rounding shift of %zu", k,
                 t[k].offset, t[k].sr_shift);
        h[k].sr_shift = t[k].sr_shift;
        h[k].offset = t[k].offset;
        h[k].numel = t[k].numel;
        h[k].wd = t[k].wd;
        h[k].block0 = blocks;
        blocks += (t[k].numel + ADAM_CH - 1) / ADAM_CH;
    }
    /* An empty tensor would share its block0 with the next one; the binary search picks the last. */
    QT_CHECK(blocks < 0x7fffffffull, "adamw plan: %llu blocks exceed the grid limit", blocks);
    QT_CUDA(cudaMalloc((void **)&p->table, sizeof(adam_entry) * (size_t)n_tensors));
    QT_CUDA(cudaMemcpy(p->table, h, sizeof(adam_entry) * (size_t)n_tensors, cudaMemcpyHostToDevice));
    QT_CUDA(cudaDeviceSynchronize()); /* the DMA from pageable memory landed before any stream's AdamW reads it */
    free(h);
    p->n = n_tensors;
    p->blocks = blocks;
    return p;
}

extern "C" void qt_adamw_plan_free(qt_adamw_plan *p) {
    if (!p) return;
    QT_CUDA(cudaFree(p->table));
    free(p);
}

extern "C" void qt_adamw_step(const qt_adamw_plan *p, void *w_bf16, float *master, const void *g, qt_dtype g_dt,
                              void *m, qt_dtype m_dt, void *v, qt_dtype v_dt, const float *grad_scale, float *absmax,
                              const qt_adamw_args *a, cudaStream_t s) {
    QT_CHECK(g_dt == QT_DT_F32 || g_dt == QT_DT_BF16, "adamw: gradient dtype %s: expected fp32 or bf16", qt_dtype_name(g_dt));
    QT_CHECK(w_bf16 || master, "adamw: neither bf16 weights nor fp32 master weights given");
    QT_CHECK((m_dt == QT_DT_F32 || m_dt == QT_DT_BF16) && (v_dt == QT_DT_F32 || v_dt == QT_DT_BF16),
             "adamw: m dtype %s, v dtype %s: expected fp32 or bf16", qt_dtype_name(m_dt), qt_dtype_name(v_dt));
    QT_CHECK(a->t >= 1, "adamw: step t=%ld: expected >= 1 (1-based)", a->t);
    adam_params q;
    q.lr = a->lr;
    q.b1 = a->beta1;
    q.b2 = a->beta2;
    q.omb1 = 1.0f - a->beta1;
    q.omb2 = 1.0f - a->beta2;
    q.eps = a->eps;
    q.bc1 = (float)(1.0 - pow((double)a->beta1, (double)a->t));
    q.bc2 = (float)(1.0 - pow((double)a->beta2, (double)a->t));
    q.t = a->t;
    q.seed = a->seed;
    q.sr = a->stochastic && w_bf16;
    q.m_bf16 = m_dt == QT_DT_BF16;
    q.v_bf16 = v_dt == QT_DT_BF16;
    q.g_bf16 = g_dt == QT_DT_BF16;
    q.g_state = a->g_at_state;
    q.w_state = a->w_at_state;
    if (absmax) QT_CUDA(cudaMemsetAsync(absmax, 0, sizeof(float) * (size_t)p->n, s));
    if (p->blocks == 0) return;
    /* groups of 4 when every array's base is aligned for its 4-element load (16 B fp32, 8 B bf16) */
    int vec = ((uintptr_t)g & (q.g_bf16 ? 7 : 15)) == 0 && qt_aligned16(master) && ((uintptr_t)w_bf16 & 7) == 0 &&
              ((uintptr_t)m & (q.m_bf16 ? 7 : 15)) == 0 && ((uintptr_t)v & (q.v_bf16 ? 7 : 15)) == 0 &&
              p->shift4;
    adamw_fwd_kernel<<<(unsigned)p->blocks, ADAM_THREADS, 0, s>>>(p->table, p->n, (bf16 *)w_bf16, master, g, m,
                                                                  v, grad_scale, absmax, a->nonfinite, q, vec);
    QT_CUDA(cudaGetLastError());
}
