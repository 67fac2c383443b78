/* base_stream.c — a streamed frozen base's per-layer pieces in pinned host memory (qt_gpu_base.h: qt_base_host),
 * for memory.offload: [weights] with LoRA on the GPU.
 *
 * The placement (base_nf4.c) keeps 1..3 parts per layer: the bf16 block matrices of a bf16 base, or an NF4 base's
 * codes, block-scale codes and second-level scales. Each part is one pinned array with layer l's bytes at
 * [lo[l], lo[l + 1]); a device slot holds one layer's parts side by side, each at a 256-byte aligned place of the
 * largest layer's size. put() stores a layer from slot 0 at load (quantized or cast there); fetch() copies a layer up
 * into a slot on the caller's (copy) stream, one cudaMemcpyAsync per part: ~0.53 bytes per weight for NF4, 2 for
 * bf16. The slots are the caller's memory or carved here; the caller orders their reuse (events). Data-parallel LoRA
 * ranks share one store: rank 0's is filled, the others borrow its arrays (share) and copy into their own slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qt_error.h"
#include "qt_gpu_base.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_pinned.h"

static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

void qt_base_host_init(qt_base_host *h, int n_parts, int n_layers) {
    memset(h, 0, sizeof *h);
    QT_CHECK(n_parts >= 1 && n_parts <= QT_BASE_HOST_PARTS, "streamed base: %d parts", n_parts);
    h->n_parts = n_parts;
    h->n_layers = n_layers;
    for (int p = 0; p < n_parts; p++) {
        h->lo[p] = calloc((size_t)n_layers + 1, sizeof *h->lo[p]);
        QT_CHECK(h->lo[p], "out of host memory");
    }
}

/* The caps and slot bytes from lo[] (set by the caller). */
static void sizes(qt_base_host *h) {
    h->slot_bytes = 0;
    for (int p = 0; p < h->n_parts; p++) {
        h->cap[p] = 0;
        for (int l = 0; l < h->n_layers; l++)
            if (h->lo[p][l + 1] - h->lo[p][l] > h->cap[p]) h->cap[p] = h->lo[p][l + 1] - h->lo[p][l];
        h->at[p] = h->slot_bytes;
        h->slot_bytes += up256(h->cap[p]);
    }
}

void qt_base_host_carve(qt_base_host *h, qt_mem_plan *p, const char *host_kind, const char *slot_kind) {
    sizes(h);
    size_t all = 0;
    for (int q = 0; q < h->n_parts; q++) all += h->lo[q][h->n_layers];
    qt_mem_plan_host(p, host_kind, all);
    if (slot_kind)
        for (int k = 0; k < 2; k++) h->slot[k] = qt_mem_plan_carve(p, slot_kind, h->slot_bytes);
}

int qt_base_host_alloc(qt_base_host *h, const char *path, char *err, size_t errlen) {
    size_t all = 0;
    for (int p = 0; p < h->n_parts; p++) all += h->lo[p][h->n_layers];
    void *mem = NULL;
    if (qt_pinned_alloc(&mem, all ? all : 1, 0))
        return qt_errf(err, errlen, "%s: memory.offload: [weights]: %.2f GiB of pinned host memory for the streamed "
                       "frozen base could not be allocated (the host plan printed above counts it): lower "
                       "memory.host_limit_gib to what the host can pin, or keep the base on the GPU", path,
                       all / 1073741824.0);
    h->mem = mem;
    size_t off = 0;
    for (int p = 0; p < h->n_parts; p++) h->host[p] = (uint8_t *)mem + off, off += h->lo[p][h->n_layers];
    return 0;
}

int qt_base_host_share(qt_base_host *h, const qt_base_host *from, char *err, size_t errlen) {
    int same = from->n_parts == h->n_parts && from->n_layers == h->n_layers;
    for (int p = 0; same && p < h->n_parts; p++)
        same = !memcmp(from->lo[p], h->lo[p], ((size_t)h->n_layers + 1) * sizeof *h->lo[p]) && from->host[p];
    if (!same)
        return qt_errf(err, errlen, "streamed frozen base: another rank's pinned copy has another layout (%d parts of "
                       "%d layers, expected %d of %d) or is not filled", from->n_parts, from->n_layers, h->n_parts,
                       h->n_layers);
    for (int p = 0; p < h->n_parts; p++) h->host[p] = from->host[p];
    h->borrowed = 1;
    return 0;
}

void *qt_base_host_slot(const qt_base_host *h, int k, int part, int l, size_t off) {
    return h->slot[k] + h->at[part] + (off - h->lo[part][l]);
}

void qt_base_host_put(qt_base_host *h, int l, cudaStream_t s) {
    if (h->borrowed) return;
    for (int p = 0; p < h->n_parts; p++)
        QT_CUDA(cudaMemcpyAsync(h->host[p] + h->lo[p][l], h->slot[0] + h->at[p], h->lo[p][l + 1] - h->lo[p][l],
                                cudaMemcpyDeviceToHost, s));
}

void qt_base_host_fetch(const qt_base_host *h, int l, int k, cudaStream_t s) {
    int from = l;
#ifdef QT_MUTANTS
    if (l > 0 && qt_mutant_on(QT_MUT_BASE_STREAM_WRONG_LAYER)) from = l - 1; /* the layers' parts are equal in size */
    if (l > 0 && h->borrowed && qt_mutant_on(QT_MUT_BASE_SHARE_WRONG_LAYER)) from = l - 1;
#endif
    for (int p = 0; p < h->n_parts; p++)
        QT_CUDA(cudaMemcpyAsync(h->slot[k] + h->at[p], h->host[p] + h->lo[p][from], h->lo[p][l + 1] - h->lo[p][l],
                                cudaMemcpyHostToDevice, s));
}

void qt_base_host_free(qt_base_host *h) {
    qt_pinned_free(h->mem);
    for (int p = 0; p < h->n_parts; p++) free(h->lo[p]);
    memset(h, 0, sizeof *h);
}
