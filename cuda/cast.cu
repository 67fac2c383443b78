/* cast.cu — fp32 <-> bf16 casts (RNE), fill, zero and an elementwise add, over flat buffers.
 *
 * Shapes: flat [n], 64-bit sizes. Math in fp32; bf16 outputs rounded once, round-to-nearest-even.
 * Vector path: 8 elements per thread (16-byte bf16 / 2x16-byte fp32 accesses) when every pointer is
 * 16-byte aligned; the last n % 8 elements (or everything, when misaligned) go through a scalar path. */
#include "kcommon.cuh"
#include "qt_kernels.h"

/* Reads element i of an fp32 or bf16 buffer as fp32. */
static __device__ __forceinline__ float ld_any(const void *p, int is_bf16, size_t i) {
    return is_bf16 ? __bfloat162float(((const bf16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void st_any(void *p, int is_bf16, size_t i, float v) {
    if (is_bf16) ((bf16 *)p)[i] = __float2bfloat16_rn(v);
    else ((float *)p)[i] = v;
}
/* 8 consecutive elements starting at i (16-byte aligned) of an fp32 or bf16 buffer. */
static __device__ __forceinline__ void ld8_any(float *f, const void *p, int is_bf16, size_t i) {
    if (is_bf16) ld8(f, (const bf16 *)p + i);
    else {
        float4 a = ((const float4 *)((const float *)p + i))[0], b = ((const float4 *)((const float *)p + i))[1];
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
}
static __device__ __forceinline__ void st8_any(void *p, int is_bf16, size_t i, const float *f) {
    if (is_bf16) st8((bf16 *)p + i, f);
    else {
        float4 *q = (float4 *)((float *)p + i);
        q[0] = make_float4(f[0], f[1], f[2], f[3]);
        q[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

/* op 0: dst = src (cast); op 1: dst = v (fill); op 2: dst += src. vec: all pointers 16-byte aligned. */
__global__ void cast_fwd_kernel(void *dst, int dst_bf16, const void *src, int src_bf16, float v, int op,
                                size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t k = tid; k < nv; k += stride) {
        float f[8], d[8];
        if (op == 1) {
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = v;
        } else ld8_any(f, src, src_bf16, k * 8);
        if (op == 2) {
            ld8_any(d, dst, dst_bf16, k * 8);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = d[j] + f[j];
        }
        st8_any(dst, dst_bf16, k * 8, f);
    }
    for (size_t i = nv * 8 + tid; i < n; i += stride) {
        float f = op == 1 ? v : ld_any(src, src_bf16, i);
        if (op == 2) f = ld_any(dst, dst_bf16, i) + f;
        st_any(dst, dst_bf16, i, f);
    }
}

static void launch(void *dst, qt_dtype ddt, const void *src, qt_dtype sdt, float v, int op, size_t n,
                   cudaStream_t s) {
    QT_CHECK(ddt == QT_DT_F32 || ddt == QT_DT_BF16, "destination dtype %s: expected fp32 or bf16",
             qt_dtype_name(ddt));
    QT_CHECK(op == 1 || sdt == QT_DT_F32 || sdt == QT_DT_BF16, "source dtype %s: expected fp32 or bf16",
             qt_dtype_name(sdt));
    if (n == 0) return;
    int vec = qt_aligned16(dst) && (op == 1 || qt_aligned16(src));
    size_t work = vec ? n / 8 + n % 8 : n;
    cast_fwd_kernel<<<qt_grid_for((long long)work, 256), 256, 0, s>>>(dst, ddt == QT_DT_BF16, src,
                                                                      sdt == QT_DT_BF16, v, op, n, vec);
    QT_CUDA(cudaGetLastError());
}

extern "C" void qt_cast_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s) {
    launch(dst, QT_DT_BF16, src, QT_DT_F32, 0.0f, 0, n, s);
}

extern "C" void qt_cast_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s) {
    launch(dst, QT_DT_F32, src, QT_DT_BF16, 0.0f, 0, n, s);
}

extern "C" void qt_fill(void *dst, qt_dtype dt, float v, size_t n, cudaStream_t s) {
    launch(dst, dt, NULL, QT_DT_F32, v, 1, n, s);
}

extern "C" void qt_zero(void *dst, size_t bytes, cudaStream_t s) {
    if (bytes) QT_CUDA(cudaMemsetAsync(dst, 0, bytes, s));
}

extern "C" void qt_add_inplace(void *y, qt_dtype ydt, const void *x, qt_dtype xdt, size_t n, cudaStream_t s) {
    launch(y, ydt, x, xdt, 0.0f, 2, n, s);
}
