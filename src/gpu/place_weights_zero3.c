/* place_weights_zero3.c — ZeRO-3: the rank's bf16 pieces (and with e4m3 gathers their codes) in the arena, and the
 * slots the model reads whole buckets from, gathered over the ranks (dp_sync.c). */
#include "qt_place.h"

#include "qt_kernels.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    (void)ps, (void)pin_flags, (void)err, (void)errlen;
    return 0;
}

static void carve(qt_param_store *ps, qt_mem_plan *p) {
    size_t ns = ps->shard.len;
    ps->w = qt_mem_plan_carve(p, "weights (bf16 shard)", ns * 2);
    qt_wslots_carve(ps->wslots, p);
    if (ps->plan.weights.e4m3) { /* e4m3 gathers: the pieces' codes, the small params' buffers, the abs-maxes */
        ps->e4m3.w8 = qt_mem_plan_carve(p, "weights (e4m3 shard)", ns);
        qt_place_weights_e4m3_gather_carve(ps, p);
    }
}

static void zero(qt_param_store *ps, cudaStream_t s) { qt_zero(ps->w, ps->shard.len * 2, s); }

static void free_host(qt_param_store *ps) { (void)ps; }

const qt_weights_place qt_place_weights_zero3 = {alloc_host, carve, zero, free_host, 1, 1};
