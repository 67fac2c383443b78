/* base_bf16.c — the frozen base resident on the GPU in bf16 (qt_gpu_base.h): one array of L->numel bf16 weights,
 * RNE of the source's fp32 values, filled through a staging buffer of qt_weight_src_chunk(L) floats. Its plan
 * rows are "frozen base (bf16)" and "load staging (fp32)"; there are no gradient or optimizer rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_kernels.h"

typedef struct {
    qt_gpu_base base;
    void *w;          /* bf16 [L->numel], device (arena) */
    float *staging;   /* fp32 [stage_n], device (arena) */
    size_t stage_n;
} base_bf16;

static void bf16_carve(qt_gpu_base *b, qt_mem_plan *p) {
    base_bf16 *s = (base_bf16 *)b;
    s->w = qt_mem_plan_carve(p, "frozen base (bf16)", b->L->numel * 2);
    s->staging = qt_mem_plan_carve(p, "load staging (fp32)", s->stage_n * 4);
}

static int bf16_init(qt_gpu_base *b, const qt_weight_src *src, cudaStream_t st, char *err, size_t errlen) {
    base_bf16 *s = (base_bf16 *)b;
    size_t n = b->L->numel;
    qt_gpu_wsrc rd;
    qt_gpu_wsrc_open(&rd, src, s->stage_n);
    for (size_t lo = 0; lo < n; lo += s->stage_n) {
        size_t c = n - lo < s->stage_n ? n - lo : s->stage_n;
        if (qt_gpu_wsrc_fill(&rd, lo, c, s->staging, st, err, errlen)) {
            qt_gpu_wsrc_close(&rd, b->id, sizeof b->id);
            return -1;
        }
        qt_cast_f32_to_bf16((char *)s->w + lo * 2, s->staging, c, st);
    }
    QT_CUDA(cudaStreamSynchronize(st));
    qt_gpu_wsrc_close(&rd, b->id, sizeof b->id);
    return 0;
}

static void *bf16_w(const qt_gpu_base *b, size_t off) { return (char *)((const base_bf16 *)b)->w + off * 2; }

static void bf16_get(const qt_gpu_base *b, float *w) {
    size_t n = b->L->numel;
    uint16_t *h = malloc(n * 2);
    QT_CHECK(h, "out of host memory (%zu bf16 weights)", n);
    QT_CUDA(cudaDeviceSynchronize()); /* a synchronous copy does not wait for the non-blocking streams that wrote them */
    QT_CUDA(cudaMemcpy(h, ((const base_bf16 *)b)->w, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) w[i] = qt_bf16_to_f32(h[i]);
    free(h);
}

static void bf16_free(qt_gpu_base *b) { free(b); }

static const qt_gpu_base_ops bf16_ops = {"bf16 resident", bf16_carve, bf16_init, bf16_w, bf16_get, bf16_free,
                                         NULL, NULL}; /* no layer hook: every weight is resident; not streamed */

qt_gpu_base *qt_gpu_base_bf16_create(const qt_layout *L) {
    base_bf16 *s = calloc(1, sizeof *s);
    QT_CHECK(s, "out of host memory");
    s->base = (qt_gpu_base){&bf16_ops, L, ""};
    s->stage_n = qt_weight_src_chunk(L);
    if (s->stage_n > L->numel) s->stage_n = L->numel;
    return &s->base;
}

qt_gpu_base *qt_gpu_base_create(const qt_layout *L, const qt_plan *pl) {
    if (pl->lora.rank <= 0) return NULL;
    if (pl->weights.host) return qt_gpu_base_nf4_create(L, pl->lora.base_nf4, 1, pl->run.path);
    return pl->lora.base_nf4 ? qt_gpu_base_nf4_create(L, 1, 0, pl->run.path) : qt_gpu_base_bf16_create(L);
}
