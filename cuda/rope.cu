/* rope.cu — rotary position embedding (HF rotate-half), in place on the fused qkv buffer.
 *
 * qkv[B,T,(H+2*Hkv)*D] bf16: the first H+Hkv heads of each token (q, then k) are rotated; v is left
 * alone. For i < D/2 and position t (the token's index in its sequence, or pos[row] with packed documents:
 * the index in its document), with (c, s) = cs[t, i]:
 *   fwd: x[i] = x[i] c - x[i+D/2] s;   x[i+D/2] = x[i+D/2] c + x[i] s
 *   bwd: the transpose (s -> -s).
 * The table cs[T, D/2] of (cos, sin) fp32 pairs, times the attention factor, is computed in double from the
 * host's inverse frequencies (qt_rope_inv_freq: every RoPE type) and rounded once.
 * fp32 math, one RNE rounding per element. 8 pairs per thread with 16-byte loads when D/2 % 8 == 0 and
 * qkv is 16-byte aligned; one pair per thread otherwise.
 * amax != NULL (bwd): max |dqkv| over the whole buffer after the rotation, v heads included (they are
 * read for it, not written), folded into *amax with one atomicMax per block. */
#include <string.h>

#include "kcommon.cuh"
#include "qt_kernels.h"

/* The inverse frequencies travel by value in the launch's parameters (2 KiB): no device buffer to own. */
struct rope_freqs {
    double f[QT_ROPE_MAX_HALF];
};

__global__ void rope_table_fwd_kernel(float *cs, int T, int d, rope_freqs inv, double attn) {
    int half = d / 2;
    long long total = (long long)T * half;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        int t = (int)(k / half), i = (int)(k - (long long)t * half);
        double a = inv.f[i] * t;
        cs[2 * k] = (float)(cos(a) * attn);
        cs[2 * k + 1] = (float)(sin(a) * attn);
    }
}

/* sg = +1 forward, -1 backward. Heads h < H+Hkv are rotated; with amax the v heads are visited too. */
__global__ void rope_fwd_kernel(bf16 *qkv, const float *cs, const int *pos, long long rows, int T, int H, int Hkv,
                                int D, float sg, int vec, float *amax) {
    int half = D / 2, nrot = H + Hkv, nh = nrot + (amax ? Hkv : 0), per_head = vec ? half / 8 : half;
    unsigned m = 0;
    int fold = amax != NULL;
    long long total = rows * nh * per_head;
    int stride_row = (H + 2 * Hkv) * D;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        long long row = k / ((long long)nh * per_head);
        int rem = (int)(k - row * nh * per_head), h = rem / per_head, p = rem - h * per_head;
        int t = pos ? pos[row] : (int)(row % T);
        bf16 *x = qkv + row * stride_row + (long long)h * D;
        const float *tab = cs + 2 * ((long long)t * half);
        if (vec) {
            int i0 = p * 8;
            float a[8], b[8];
            ld8(a, x + i0);
            ld8(b, x + half + i0);
            if (h >= nrot) { /* a v head: read for the abs-max only */
#pragma unroll
                for (int i = 0; i < 8; i++) m = qt_amax_fold(qt_amax_fold(m, a[i]), b[i]);
                continue;
            }
            const float4 *q = (const float4 *)(tab + 2 * i0);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float4 f = q[j]; /* (cos, sin) of pairs 2j and 2j+1 */
                float c0 = f.x, s0 = sg * f.y, c1 = f.z, s1 = sg * f.w;
                float a0 = a[2 * j], b0 = b[2 * j], a1 = a[2 * j + 1], b1 = b[2 * j + 1];
                a[2 * j] = a0 * c0 - b0 * s0;
                b[2 * j] = b0 * c0 + a0 * s0;
                a[2 * j + 1] = a1 * c1 - b1 * s1;
                b[2 * j + 1] = b1 * c1 + a1 * s1;
            }
            m = st8_fold(x + i0, a, m, fold);
            m = st8_fold(x + half + i0, b, m, fold);
        } else {
            float a = __bfloat162float(x[p]), b = __bfloat162float(x[p + half]);
            if (h >= nrot) {
                m = qt_amax_fold(qt_amax_fold(m, a), b);
                continue;
            }
            float c = tab[2 * p], s = sg * tab[2 * p + 1];
            m = st1_fold(x + p, a * c - b * s, m, fold);
            m = st1_fold(x + p + half, b * c + a * s, m, fold);
        }
    }
    if (amax) qt_amax_block_commit(amax, m);
}

extern "C" void qt_rope_table(float *cs, int T, int d, const double *inv_freq, double attn, cudaStream_t s) {
    QT_CHECK(d > 0 && d % 2 == 0 && d / 2 <= QT_ROPE_MAX_HALF,
             "rope: head dim %d: expected a positive even number <= %d", d, 2 * QT_ROPE_MAX_HALF);
    if (T <= 0) return;
    rope_freqs inv;
    memset(&inv, 0, sizeof inv);
    memcpy(inv.f, inv_freq, (size_t)(d / 2) * sizeof *inv_freq);
    rope_table_fwd_kernel<<<qt_grid_for((long long)T * d / 2, 256), 256, 0, s>>>(cs, T, d, inv, attn);
    QT_CUDA(cudaGetLastError());
}

static void rope(void *qkv, const float *cs, const int32_t *pos, int B, int T, int H, int Hkv, int D, float sg,
                 float *amax, cudaStream_t s) {
    QT_CHECK(D > 0 && D % 2 == 0, "rope: head dim %d: expected a positive even number", D);
    if (B <= 0 || T <= 0 || H + Hkv <= 0) return;
    int vec = (D / 2) % 8 == 0 && qt_aligned16(qkv) && qt_aligned16(cs);
    long long rows = (long long)B * T, work = rows * (H + Hkv + (amax ? Hkv : 0)) * (vec ? D / 16 : D / 2);
    rope_fwd_kernel<<<qt_grid_for(work, 256), 256, 0, s>>>((bf16 *)qkv, cs, (const int *)pos, rows, T, H, Hkv, D, sg,
                                                                       vec, amax);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_rope_fwd(void *qkv, const float *cs, int B, int T, int H, int Hkv, int D, cudaStream_t s) {
    rope(qkv, cs, NULL, B, T, H, Hkv, D, 1.0f, NULL, s);
}

extern "C" void qt_rope_pos_fwd(void *qkv, const float *cs, const int32_t *pos, int B, int T, int H, int Hkv, int D,
                                cudaStream_t s) {
    rope(qkv, cs, pos, B, T, H, Hkv, D, 1.0f, NULL, s);
}

extern "C" void qt_rope_pos_bwd(void *dqkv, const float *cs, const int32_t *pos, int B, int T, int H, int Hkv, int D,
                                float *amax, cudaStream_t s) {
    rope(dqkv, cs, pos, B, T, H, Hkv, D, -1.0f, amax, s);
}

extern "C" void qt_rope_bwd(void *dqkv, const float *cs, int B, int T, int H, int Hkv, int D, float *amax,
                            cudaStream_t s) {
    rope(dqkv, cs, NULL, B, T, H, Hkv, D, -1.0f, amax, s);
}
