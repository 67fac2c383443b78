/* bias.cu — bias add (y[n,o] += b[o]) and the bias gradient (db[o] += sum_n dy[n,o]), plus the column
 * reduction that the bias gradient and RMSNorm's dw share.
 *
 * bias add: bf16 in/out, fp32 add, one RNE rounding; 16-byte vectors when o % 8 == 0.
 * column reduction: bf16 inputs, fp32 accumulation, deterministic two passes: a fixed grid of
 * (column tiles x QT_COLREDUCE_CHUNKS row chunks); in a block, 8 row lanes each sum every 8th row of
 * the chunk, the 8 lane sums are added in lane order; then a second kernel adds the chunk sums in
 * chunk order onto the output (fp32 "+=", or bf16: old value + the fp32 sum rounded once, RNE). No
 * atomics, so the result is bitwise reproducible. */
#include "colreduce.cuh"
#include "qt_kernels.h"

#define CR_X 32 /* column threads per block */
#define CR_Y 8  /* row lanes per block */

__global__ void bias_add_fwd_kernel(bf16 *y, const bf16 *b, long n, int o, int vec) {
    long long per_row = vec ? o / 8 : o, total = (long long)n * per_row;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        long long r = k / per_row, j = k - r * per_row;
        if (vec) {
            float a[8], bb[8];
            ld8(a, y + r * o + j * 8);
            ld8(bb, b + j * 8);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] += bb[i];
            st8(y + r * o + j * 8, a);
        } else {
            y[r * o + j] = __float2bfloat16_rn(__bfloat162float(y[r * o + j]) + __bfloat162float(b[j]));
        }
    }
}

/* Pass 1. Block (CR_X, CR_Y); grid (column tiles, chunks). Each thread owns cpt (8 or 1) columns. */
__global__ void colreduce_bwd_kernel(float *part, const bf16 *dy, const bf16 *x, const float *rstd, long n,
                                     int c, int vec) {
    __shared__ float sh[CR_Y][CR_X][8];
    int cpt = vec ? 8 : 1;
    long long col0 = ((long long)blockIdx.x * CR_X + threadIdx.x) * cpt;
    long chunk = (n + gridDim.y - 1) / gridDim.y;
    long r0 = (long)blockIdx.y * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (col0 < c) {
        for (long r = r0 + threadIdx.y; r < r1; r += CR_Y) {
            long long base = (long long)r * c + col0;
            float rs = x ? rstd[r] : 1.0f;
            if (vec) {
                float d[8], xv[8];
                ld8(d, dy + base);
                if (x) {
                    ld8(xv, x + base);
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[i] += d[i] * (xv[i] * rs);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[i] += d[i];
                }
            } else {
                float d = __bfloat162float(dy[base]);
                acc[0] += x ? d * (__bfloat162float(x[base]) * rs) : d;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) sh[threadIdx.y][threadIdx.x][i] = acc[i];
    __syncthreads();
    if (threadIdx.y == 0 && col0 < c) {
        for (int i = 0; i < cpt; i++) {
            float s = sh[0][threadIdx.x][i];
            for (int l = 1; l < CR_Y; l++) s += sh[l][threadIdx.x][i];
            part[(long long)blockIdx.y * c + col0 + i] = s;
        }
    }
}

/* Pass 2: out[j] += sum over chunks, in chunk order (acc_store: fp32, or one RNE to bf16). */
__global__ void colreduce_sum_bwd_kernel(void *out, int out_bf16, const float *part, int chunks, int c) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += part[(long long)k * c + j];
    acc_store(out, out_bf16, j, s);
}

void qt_colreduce(void *out, int out_bf16, const bf16 *dy, const bf16 *x, const float *rstd, long n, int c, void *ws,
                  cudaStream_t s) {
    if (n <= 0 || c <= 0) return;
    int vec = c % 8 == 0 && qt_aligned16(dy) && (!x || qt_aligned16(x));
    int cpt = vec ? 8 : 1;
    int chunks = n < QT_COLREDUCE_CHUNKS ? (int)n : QT_COLREDUCE_CHUNKS;
    dim3 grid((unsigned)((c / cpt + CR_X - 1) / CR_X), (unsigned)chunks);
    colreduce_bwd_kernel<<<grid, dim3(CR_X, CR_Y), 0, s>>>((float *)ws, dy, x, rstd, n, c, vec);
    QT_CUDA(cudaGetLastError());
    colreduce_sum_bwd_kernel<<<(c + 255) / 256, 256, 0, s>>>(out, out_bf16, (const float *)ws, chunks, c);
    QT_CUDA(cudaGetLastError());
}

extern "C" size_t qt_colreduce_ws_bytes(int c) {
    size_t rows = QT_COLREDUCE_CHUNKS > QT_RMSNORM_BWD_PARTS ? QT_COLREDUCE_CHUNKS : QT_RMSNORM_BWD_PARTS;
    return rows * (size_t)(c > 0 ? c : 0) * sizeof(float);
}

extern "C" void qt_bias_add(void *y, const void *b, long n, int o, cudaStream_t s) {
    if (n <= 0 || o <= 0) return;
    int vec = o % 8 == 0 && qt_aligned16(y) && qt_aligned16(b);
    long long work = (long long)n * (vec ? o / 8 : o);
    bias_add_fwd_kernel<<<qt_grid_for(work, 256), 256, 0, s>>>((bf16 *)y, (const bf16 *)b, n, o, vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_bias_bwd(void *db, qt_dtype db_dt, const void *dy, long n, int o, void *ws, cudaStream_t s) {
    QT_CHECK(db_dt == QT_DT_F32 || db_dt == QT_DT_BF16, "bias bwd: db dtype %s: expected fp32 or bf16", qt_dtype_name(db_dt));
    qt_colreduce(db, db_dt == QT_DT_BF16, (const bf16 *)dy, NULL, NULL, n, o, ws, s);
}
