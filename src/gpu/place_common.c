/* place_common.c — what the placements share: pinned host arrays, ZeRO-3's e4m3 gather buffers (qt_place.h). */
#include "qt_place.h"

#include <cuda_runtime.h>

#include "qt_error.h"
#include "qt_pinned.h"

/* *p = `bytes` of zeroed pinned host memory (flags: QT_PIN_*; mapped: kernels use the host address itself,
 * which unified addressing makes the device's; m, v start at zero, padding stays zero and defined). 0, or -1
 * with err naming key, what and the way out. */
int qt_place_pin(void **p, size_t bytes, unsigned flags, const char *key, const char *what, const char *instead,
                 const qt_param_store *ps, char *err, size_t errlen) {
    if (qt_pinned_alloc(p, bytes, flags))
        return qt_errf(err, errlen, "%s: %s: %.2f GiB of pinned host memory for %s could not be allocated (the host plan "
                       "printed above counts it): lower memory.host_limit_gib to what the host can pin, or %s",
                       ps->plan.run.path, key, bytes / 1073741824.0, what, instead);
    if (flags & QT_PIN_MAPPED) {
        void *dev = NULL;
        QT_CUDA(cudaHostGetDevicePointer(&dev, *p, 0));
        QT_CHECK(dev == *p, "%s needs unified addressing (the device address %p of the pinned %s differs from its host "
                 "address %p)", key, dev, what, *p);
    }
    return 0;
}

/* One GPU the whole array, ZeRO-3 the rank's pieces; AdamW and the upload's cast write them in place. */
int qt_place_weights_pin(qt_param_store *ps, size_t n, unsigned pin_flags, char *err, size_t errlen) {
    if (qt_place_pin(&ps->w, n * 2, pin_flags, "memory.offload: [weights]", "the bf16 weights", "keep the weights on the GPU",
                     ps, err, errlen))
        return -1;
    if (ps->plan.weights.e4m3 && qt_place_pin((void **)&ps->e4m3.w8, n, pin_flags, "memory.offload: [quants]",
                                              "the e4m3 weight codes", "leave quants out", ps, err, errlen))
        return -1;
    return 0;
}

void qt_place_weights_e4m3_gather_carve(qt_param_store *ps, qt_mem_plan *p) {
    size_t P = ps->e4m3.small.max_packed;
    ps->e4m3.small_send = qt_mem_plan_carve(p, "weight slots (e4m3)", P * 2);
    /* every layer bucket's gathered small params, remade when the pieces change (dp_sync small_gather) */
    ps->e4m3.small_recv = qt_mem_plan_carve(p, "weight slots (e4m3)", (size_t)ps->shard.n_buckets * ps->shard.n_ranks * P * 2);
    ps->e4m3.amax8 = qt_mem_plan_carve(p, "scratch: gradients", 64 * 4);
}
