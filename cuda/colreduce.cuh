/* colreduce.cuh — the deterministic column reduction behind qt_bias_bwd and RMSNorm's dw (bias.cu).
 * Private to cuda/. */
#ifndef QT_COLREDUCE_CUH
#define QT_COLREDUCE_CUH

#include "kcommon.cuh"

/* Row chunks of the first pass: fixed for a given n, so the summation order depends on the shape only. */
#define QT_COLREDUCE_CHUNKS 64
/* Row chunks of RMSNorm's fused dw partials (rmsnorm.cu); qt_colreduce_ws_bytes covers both. */
#define QT_RMSNORM_BWD_PARTS 512

/* out[j] (fp32) += sum over rows i of dy[i,j] * (x ? x[i,j] * rstd[i] : 1), dy and x bf16 [n,c].
 * Pass 1: QT_COLREDUCE_CHUNKS row chunks, each summed in fp32 in a fixed order into ws; pass 2 adds
 * the chunk sums in chunk order. ws: qt_colreduce_ws_bytes(c) bytes. */
void qt_colreduce(float *out, const bf16 *dy, const bf16 *x, const float *rstd, long n, int c, void *ws,
                  cudaStream_t s);

#endif
