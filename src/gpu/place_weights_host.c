/* place_weights_host.c — memory.offload: [weights]: the bf16 weights (and with quants their e4m3 codes) in pinned
 * host memory the GPU maps, copied up per bucket into the weight slots: on one GPU the whole array, under ZeRO-3 the
 * rank's pieces, gathered over the ranks into the slots (dp_sync.c). */
#include "qt_place.h"

#include "qt_pinned.h"

static int alloc_whole(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return qt_place_weights_pin(ps, ps->shard.total, pin_flags, err, errlen);
}

static int alloc_pieces(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return qt_place_weights_pin(ps, ps->shard.len, pin_flags, err, errlen);
}

/* The host rows of n elements (the arrays themselves: alloc_host), the slots; with quants the codes' host row and
 * the abs-maxes, and under ZeRO-3 the small params' gather buffers. */
static void carve_host(qt_param_store *ps, qt_mem_plan *p, size_t n, const char *bf16, const char *e4m3, int pieces) {
    qt_mem_plan_host(p, bf16, n * 2);
    qt_wslots_carve(ps->wslots, p);
    if (!ps->plan.weights.e4m3) return;
    qt_mem_plan_host(p, e4m3, n);
    if (pieces) qt_place_weights_e4m3_gather_carve(ps, p);
    else ps->e4m3.amax8 = qt_mem_plan_carve(p, "scratch: gradients", 64 * 4);
}

static void carve_whole(qt_param_store *ps, qt_mem_plan *p) {
    carve_host(ps, p, ps->shard.total, "weights (bf16, offloaded)", "weights (e4m3, offloaded)", 0);
}

static void carve_pieces(qt_param_store *ps, qt_mem_plan *p) {
    carve_host(ps, p, ps->shard.len, "weights (bf16 shard, offloaded)", "weights (e4m3 shard, offloaded)", 1);
}

/* zeroed at allocation */
static void zero(qt_param_store *ps, cudaStream_t s) { (void)ps, (void)s; }

static void free_host(qt_param_store *ps) {
    qt_pinned_free(ps->w);
    if (ps->plan.weights.e4m3) qt_pinned_free(ps->e4m3.w8);
}

const qt_weights_place qt_place_weights_host = {alloc_whole, carve_whole, zero, free_host, 0, 1};
const qt_weights_place qt_place_weights_zero3_host = {alloc_pieces, carve_pieces, zero, free_host, 1, 1};
