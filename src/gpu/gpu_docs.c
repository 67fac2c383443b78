/* gpu_docs.c — packed documents on one GPU: a micro-batch's document starts turned into the device arrays
 * the attention (per-query key bound) and RoPE (per-token position) kernels read, and the cuDNN plans with
 * the document bound built before any step that may be captured into a CUDA graph.
 *
 * The arrays go host -> pinned (two buffers, alternated) -> device on the model's stream, in order with
 * the steps: the copy for the next micro-step runs after the current one's kernels, which read them. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "qt_error.h"
#include "qt_gpu_model.h"

/* Builds the forward and backward plans of every layer window with the document bound, for the micro-batch
 * and for the attention backward's slices (gpu_model.c's attention_bwd). */
static int prepare_plans(qt_gpu_model *g, char *err, size_t errlen) {
    const qt_model_cfg *c = &g->L->cfg;
    int per = (g->B + g->attn_chunks - 1) / g->attn_chunks, last = g->B - (g->attn_chunks - 1) * per;
    int sizes[3] = {g->B, per, last};
    for (int l = 0; l < c->num_layers; l++)
        for (int k = 0; k < 3; k++)
            if (sizes[k] > 0 && qt_attention_prepare_docs(g->attn, sizes[k], g->T, c->num_heads, c->num_kv_heads,
                                                          c->head_dim, qt_model_layer_window(c, l), 1, err, errlen))
                return -1;
    return 0;
}

/* The device array and the pinned staging, on first use (the memory plan does not count these 16 x N bytes). */
static int alloc_docs(qt_gpu_model *g, char *err, size_t errlen) {
    size_t bytes = 2 * (size_t)g->N * sizeof(int32_t);
    if (g->docs.buf) return 0;
    if (cudaMalloc((void **)&g->docs.buf, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        g->docs.buf = NULL;
        return qt_errf(err, errlen, "out of GPU memory for %ld tokens' document bounds and positions", g->N);
    }
    for (int k = 0; k < 2; k++) {
        QT_CUDA(cudaMallocHost((void **)&g->docs.host[k], bytes));
        QT_CUDA(cudaEventCreateWithFlags(&g->docs.free[k], cudaEventDisableTiming));
        QT_CUDA(cudaEventRecord(g->docs.free[k], g->stream));
    }
    return 0;
}

int qt_gpu_model_set_docs(qt_gpu_model *g, const qt_docs *d, char *err, size_t errlen) {
    int had_attention = g->docs.kv_lo != NULL;
    g->docs.kv_lo = g->docs.pos = NULL;
    if (!d || (!d->attention && !d->positions)) return 0;
    if (alloc_docs(g, err, errlen)) return -1;
    size_t n = (size_t)g->N;
    int k = g->docs.k ^= 1;
    QT_CUDA(cudaEventSynchronize(g->docs.free[k])); /* the copy that last read this buffer is done */
    int32_t *h = g->docs.host[k];
    if (qt_docs_expand(d, g->B, g->T, h, h + n, err, errlen)) return -1;
    QT_CUDA(cudaMemcpyAsync(g->docs.buf, h, 2 * n * sizeof *h, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaEventRecord(g->docs.free[k], g->stream));
    if (d->attention && !had_attention && prepare_plans(g, err, errlen)) return -1;
    g->docs.kv_lo = d->attention ? g->docs.buf : NULL;
    g->docs.pos = d->positions ? g->docs.buf + n : NULL;
    return 0;
}

void qt_gpu_model_free_docs(qt_gpu_model *g) {
    if (!g->docs.buf) return;
    QT_CUDA(cudaFree(g->docs.buf));
    for (int k = 0; k < 2; k++) {
        QT_CUDA(cudaFreeHost(g->docs.host[k]));
        QT_CUDA(cudaEventDestroy(g->docs.free[k]));
    }
    g->docs.buf = NULL;
}
