/* place_weights_resident.c — the whole bf16 weight array in the GPU's arena (one GPU, or every rank below ZeRO-3). */
#include "qt_place.h"

#include "qt_kernels.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    (void)ps, (void)pin_flags, (void)err, (void)errlen;
    return 0;
}

static void carve(qt_param_store *ps, qt_mem_plan *p) { ps->w = qt_mem_plan_carve(p, "weights (bf16)", ps->shard.total * 2); }

static void zero(qt_param_store *ps, cudaStream_t s) { qt_zero(ps->w, ps->shard.total * 2, s); }

static void free_host(qt_param_store *ps) { (void)ps; }

const qt_weights_place qt_place_weights_resident = {alloc_host, carve, zero, free_host, 0, 0};
