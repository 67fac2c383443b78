/* swiglu.cu — SwiGLU and GeGLU on the fused gate/up matmul output.
 *
 * fwd: out[n,f] = act(g) * u,  g = gu[n, j], u = gu[n, f+j]
 *   SwiGLU: act = silu(g) = g * sigmoid(g)
 *   GeGLU:  act = gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma's gelu_pytorch_tanh)
 * bwd: dgu[n, j] = dout * u * act'(g),  dgu[n, f+j] = dout * act(g)
 *   silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)));  gelu_tanh' as in kcommon.cuh (qt_gelu_tanh_grad)
 * bf16 storage, fp32 math (qt_sigmoid's ex2 / reciprocal, tanhf: kcommon.cuh), one RNE rounding per output
 * ("=" both). One kernel per direction, the activation a template parameter (GLU_SILU, GLU_GELU).
 * Units of 8 columns per thread with 16-byte loads when f % 8 == 0 and the pointers are 16-byte aligned; of
 * one column otherwise. A grid of at most GLU_BLOCKS blocks strides over the units; each thread divides
 * its first unit and the stride into (row, unit) once and steps by adds (a 64-bit division per unit costs
 * as much as the unit's math).
 * amax != NULL: max |output| (the bf16 values written) folded into *amax, one atomicMax per block.
 * bwd_h: the backward that also writes h (the forward's output) over dout, for a bf16 backward whose GLU
 * is recomputed: 12 bytes per element moved instead of the 6 + 10 of the forward again and the backward. */
#include "kcommon.cuh"
#include "qt_kernels.h"

enum { GLU_SILU = 0, GLU_GELU = 1 };

/* act(g) * u in fp32: qt_swiglu1, or the tanh GELU's product (the same expression the backward's h uses). */
template <int ACT>
static __device__ __forceinline__ float glu1(float g, float u) {
    return ACT == GLU_GELU ? qt_geglu1(g, u) : qt_swiglu1(g, u);
}

/* One element of the backward: dg, du from dout d, and h = the forward's product (its bits). */
template <int ACT>
static __device__ __forceinline__ void glu_bwd1(float g, float u, float d, float *dg, float *du, float *h) {
    if (ACT == GLU_GELU) {
        *h = qt_geglu1(g, u);
        qt_geglu_bwd1(g, u, d, qt_gelu_tanh_t(g), dg, du);
        return;
    }
    float sg = qt_sigmoid(g);
#ifndef QT_MUTANT_SWIGLU_H_ORDER
    *h = qt_swiglu1s(g, sg, u);
#else /* a test build (tools/gpu-check.sh pending22): the product in another order, which test_kernels must catch */
    *h = g * u * sg;
#endif
    qt_swiglu_bwd1(g, u, d, sg, dg, du);
}

enum { GLU_THREADS = 256, GLU_BLOCKS = 4096 };

/* The grid-stride walk over n rows of `per_row` units: (r, j) of this thread's first unit, then
 * glu_step's adds of the stride's (rows, units). */
struct glu_walk {
    long long r, j, sr, sj, per_row;
};
static __device__ __forceinline__ glu_walk glu_walk_start(long long per_row) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x, st = (long long)gridDim.x * blockDim.x;
    glu_walk w;
    w.per_row = per_row;
    w.r = k / per_row;
    w.j = k - w.r * per_row;
    w.sr = st / per_row;
    w.sj = st - w.sr * per_row;
    return w;
}
static __device__ __forceinline__ void glu_step(glu_walk *w) {
    w->j += w->sj;
    w->r += w->sr;
    if (w->j >= w->per_row) {
        w->j -= w->per_row;
        w->r++;
    }
}

template <int ACT>
__global__ void glu_fwd_kernel(bf16 *out, const bf16 *gu, long n, int f, int vec, float *amax) {
    unsigned m = 0;
    int fold = amax != NULL;
    for (glu_walk w = glu_walk_start(vec ? f / 8 : f); w.r < n; glu_step(&w)) {
        const bf16 *gr = gu + w.r * 2 * f;
        if (vec) {
            float g[8], u[8];
            ld8(g, gr + w.j * 8);
            ld8(u, gr + f + w.j * 8);
#pragma unroll
            for (int i = 0; i < 8; i++) g[i] = glu1<ACT>(g[i], u[i]);
            m = st8_fold(out + w.r * f + w.j * 8, g, m, fold);
        } else {
            float g = __bfloat162float(gr[w.j]), u = __bfloat162float(gr[f + w.j]);
            m = st1_fold(out + w.r * f + w.j, glu1<ACT>(g, u), m, fold);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

/* write_h (a constant per kernel): dout is dh on entry and takes h, the GLU output (the forward's bits:
 * the same activation, product and rounding), element for element where it was read (each thread reads its
 * dout unit before storing h there). */
template <int ACT>
static __device__ __forceinline__ void glu_bwd_body(bf16 *dgu, bf16 *dout, const bf16 *gu, long n, int f, int vec,
                                                    float *amax, int write_h) {
    unsigned m = 0;
    int fold = amax != NULL;
    for (glu_walk w = glu_walk_start(vec ? f / 8 : f); w.r < n; glu_step(&w)) {
        long long r = w.r, j = w.j;
        const bf16 *gr = gu + r * 2 * f;
        bf16 *dr = dgu + r * 2 * f;
        if (vec) {
            float g[8], u[8], d[8], h[8];
            ld8(g, gr + j * 8);
            ld8(u, gr + f + j * 8);
            ld8(d, dout + r * f + j * 8);
#pragma unroll
            for (int i = 0; i < 8; i++) glu_bwd1<ACT>(g[i], u[i], d[i], &g[i], &u[i], &h[i]);
            m = st8_fold(dr + j * 8, g, m, fold);
            m = st8_fold(dr + f + j * 8, u, m, fold);
            if (write_h) st8(dout + r * f + j * 8, h);
        } else {
            float g = __bfloat162float(gr[j]), u = __bfloat162float(gr[f + j]);
            float d = __bfloat162float(dout[r * f + j]), dg, du, h;
            glu_bwd1<ACT>(g, u, d, &dg, &du, &h);
            m = st1_fold(dr + j, dg, m, fold);
            m = st1_fold(dr + f + j, du, m, fold);
            if (write_h) dout[r * f + j] = __float2bfloat16_rn(h);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}
template <int ACT>
__global__ void glu_bwd_kernel(bf16 *dgu, bf16 *dout, const bf16 *gu, long n, int f, int vec, float *amax) {
    glu_bwd_body<ACT>(dgu, dout, gu, n, f, vec, amax, 0);
}
template <int ACT>
__global__ void glu_bwd_h_kernel(bf16 *dgu, bf16 *dout, const bf16 *gu, long n, int f, int vec, float *amax) {
    glu_bwd_body<ACT>(dgu, dout, gu, n, f, vec, amax, 1);
}

static unsigned glu_grid(long long units) {
    unsigned b = qt_grid_for(units, GLU_THREADS);
    return b < GLU_BLOCKS ? b : GLU_BLOCKS;
}

static void fwd_launch(int act, void *out, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    if (n <= 0 || f <= 0) return;
    int vec = f % 8 == 0 && qt_aligned16(out) && qt_aligned16(gu);
    long long work = (long long)n * (vec ? f / 8 : f);
    (act == GLU_GELU ? glu_fwd_kernel<GLU_GELU> : glu_fwd_kernel<GLU_SILU>)<<<glu_grid(work), GLU_THREADS, 0, s>>>(
        (bf16 *)out, (const bf16 *)gu, n, f, vec, amax);
    QT_CUDA(cudaGetLastError());
}

static void bwd_launch(int act, void *dgu, void *dout, const void *gu, long n, int f, float *amax, int write_h,
                       cudaStream_t s) {
    if (n <= 0 || f <= 0) return;
    int vec = f % 8 == 0 && qt_aligned16(dgu) && qt_aligned16(dout) && qt_aligned16(gu);
    long long work = (long long)n * (vec ? f / 8 : f);
    void (*k)(bf16 *, bf16 *, const bf16 *, long, int, int, float *) =
        act == GLU_GELU ? (write_h ? glu_bwd_h_kernel<GLU_GELU> : glu_bwd_kernel<GLU_GELU>)
                        : (write_h ? glu_bwd_h_kernel<GLU_SILU> : glu_bwd_kernel<GLU_SILU>);
    k<<<glu_grid(work), GLU_THREADS, 0, s>>>((bf16 *)dgu, (bf16 *)dout, (const bf16 *)gu, n, f, vec, amax);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_swiglu_fwd(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    fwd_launch(GLU_SILU, out, gu, n, f, amax, s);
}

extern "C" void qt_swiglu_bwd(void *dgu, const void *dout, const void *gu, long n, int f, float *amax,
                              cudaStream_t s) {
    bwd_launch(GLU_SILU, dgu, (void *)dout, gu, n, f, amax, 0, s); /* write_h 0: dout only read */
}

extern "C" void qt_swiglu_bwd_h(void *dgu, void *dh_h, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    bwd_launch(GLU_SILU, dgu, dh_h, gu, n, f, amax, 1, s);
}

extern "C" void qt_geglu_fwd(void *out, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    fwd_launch(GLU_GELU, out, gu, n, f, amax, s);
}

extern "C" void qt_geglu_bwd(void *dgu, const void *dout, const void *gu, long n, int f, float *amax,
                             cudaStream_t s) {
    bwd_launch(GLU_GELU, dgu, (void *)dout, gu, n, f, amax, 0, s);
}

extern "C" void qt_geglu_bwd_h(void *dgu, void *dh_h, const void *gu, long n, int f, float *amax, cudaStream_t s) {
    bwd_launch(GLU_GELU, dgu, dh_h, gu, n, f, amax, 1, s);
}
