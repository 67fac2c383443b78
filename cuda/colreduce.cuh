/* colreduce.cuh — the deterministic column reduction behind qt_bias_bwd and RMSNorm's dw (bias.cu).
 * Private to cuda/. */
#ifndef QT_COLREDUCE_CUH
#define QT_COLREDUCE_CUH

#include "kcommon.cuh"

/* Row chunks of the first pass: fixed for a given n, so the summation order depends on the shape only. */
#define QT_COLREDUCE_CHUNKS 64
/* Row chunks of RMSNorm's fused dw partials (rmsnorm.cu); qt_colreduce_ws_bytes covers both. */
#define QT_RMSNORM_BWD_PARTS 512

/* out[j] (fp32, or bf16 when out_bf16) += sum over rows i of dy[i,j] * (x ? x[i,j] * rstd[i] : 1), dy
 * and x bf16 [n,c]. Pass 1: QT_COLREDUCE_CHUNKS row chunks, each summed in fp32 in a fixed order into
 * ws; pass 2 adds the chunk sums in chunk order, then adds that to out in fp32 (bf16 out: one RNE).
 * ws: qt_colreduce_ws_bytes(c) bytes. */
void qt_colreduce(void *out, int out_bf16, const bf16 *dy, const bf16 *x, const float *rstd, long n, int c, void *ws,
                  cudaStream_t s);

/* out[j] += s: fp32, or bf16 rounded once (RNE) from the fp32 sum — the "+=" of every gradient accumulator. */
static __device__ __forceinline__ void acc_store(void *out, int out_bf16, long long j, float s) {
    if (out_bf16) ((bf16 *)out)[j] = __float2bfloat16_rn(__bfloat162float(((bf16 *)out)[j]) + s);
    else ((float *)out)[j] += s;
}

#endif
