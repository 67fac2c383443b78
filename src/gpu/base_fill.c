/* base_fill.c — a frozen base's initial weights a chunk at a time into device staging (qt_gpu_base.h: qt_gpu_wsrc).
 *
 * Host kinds (init, HF import, an array): read into a pageable buffer on the host, their fp32 bytes into the CRC-32C
 * that identifies the base, copied up. QT_WSRC_INIT_GPU: drawn on the GPU tensor by tensor (cuda/init.cu), nothing
 * read or checksummed on the host, so a 70B base starts in seconds, not the minutes of the host's hashed normals
 * and CRC over 280 GB of fp32; its identity is the init's seed and std. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "qt_crc32c.h"
#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_kernels.h"

void qt_gpu_wsrc_open(qt_gpu_wsrc *r, const qt_weight_src *src, size_t chunk) {
    *r = (qt_gpu_wsrc){src, NULL, chunk, 0};
    if (src->kind == QT_WSRC_INIT_GPU) return;
    r->host = malloc(chunk * sizeof *r->host);
    QT_CHECK(r->host, "out of host memory for the weights' load buffer (%zu floats)", chunk);
}

/* dev[0, n) = the init of flat [lo, lo + n), tensor by tensor (each drawn by compact index), on s. */
static void draw(const qt_weight_src *src, size_t lo, size_t n, float *dev, cudaStream_t s) {
    const qt_layout *L = src->L;
    qt_zero(dev, n * sizeof *dev, s); /* biases and padding */
    for (int k = 0; k < L->n_tensors; k++) {
        const qt_tensor *t = &L->tensors[k];
        size_t a = t->offset > lo ? t->offset : lo, e = t->offset + t->numel < lo + n ? t->offset + t->numel : lo + n;
        float v;
        int kind = a < e ? qt_layout_init_kind(L, t, &v) : QT_INIT_ZERO;
        if (kind == QT_INIT_CONST) qt_fill(dev + (a - lo), QT_DT_F32, v, e - a, s);
        if (kind == QT_INIT_NORMAL) qt_init_normal(dev + (a - lo), e - a, src->seed, t->compact + (a - t->offset), src->std, s);
    }
}

int qt_gpu_wsrc_fill(qt_gpu_wsrc *r, size_t lo, size_t n, float *dev, cudaStream_t s, char *err, size_t errlen) {
    QT_CHECK(n <= r->chunk, "weight chunk of %zu elements, the buffer holds %zu", n, r->chunk);
    if (!r->host) {
        draw(r->src, lo, n, dev, s);
        return 0;
    }
    QT_CUDA(cudaStreamSynchronize(s)); /* the last chunk's copy is done: host may be refilled */
    if (qt_weight_src_fill(r->src, lo, n, r->host, err, errlen)) return -1;
    r->crc = qt_crc32c(r->crc, r->host, n * sizeof *r->host);
    QT_CUDA(cudaMemcpyAsync(dev, r->host, n * sizeof *r->host, cudaMemcpyHostToDevice, s));
    return 0;
}

void qt_gpu_wsrc_close(qt_gpu_wsrc *r, char *id, size_t cap) {
    size_t n = r->src->L->numel;
    if (r->host) snprintf(id, cap, "crc32c %08x numel %zu", r->crc, n);
    else snprintf(id, cap, "init seed %llu std %.9g numel %zu", (unsigned long long)r->src->seed, (double)r->src->std, n);
    free(r->host);
    r->host = NULL;
}
