/* place_grads_whole.c — the whole gradient array (grad_dt) in the GPU's arena, which the backward adds into
 * directly: one GPU, or every rank below ZeRO-2 (the ranks' sums are made in place). */
#include "qt_place.h"

#include "qt_kernels.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    (void)ps, (void)pin_flags, (void)err, (void)errlen;
    return 0;
}

static void carve(qt_param_store *ps, qt_mem_plan *p) {
    ps->grad = qt_mem_plan_carve(p, ps->grad_dt == QT_DT_BF16 ? "gradients (bf16)" : "gradients (fp32)",
                                 ps->shard.total * qt_dtype_size(ps->grad_dt));
}

static void carve_stage(qt_param_store *ps, qt_mem_plan *p) { (void)ps, (void)p; }

static void zero(qt_param_store *ps, cudaStream_t s) { qt_zero(ps->grad, ps->shard.total * qt_dtype_size(ps->grad_dt), s); }

static void clear(qt_param_store *ps, int k0, int k1, cudaStream_t s) {
    size_t lo = ps->shard.bucket[k0], hi = ps->shard.bucket[k1], es = qt_dtype_size(ps->grad_dt);
    qt_zero((char *)ps->grad + lo * es, (hi - lo) * es, s);
}

static void free_host(qt_param_store *ps) { (void)ps; }

const qt_grads_place qt_place_grads_whole = {alloc_host, carve, carve_stage, zero, clear, qt_place_grads_get_whole,
                                             free_host, "the gradients", 0, 0, 0};
