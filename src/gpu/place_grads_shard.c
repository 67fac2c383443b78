/* place_grads_shard.c — ZeRO-2 and 3: the rank keeps the fp32 sums of its pieces [shard.len] in the arena; the
 * backward writes each bucket's gradient slot, whose sum over the ranks is added into the piece (dp_sync.c). */
#include "qt_place.h"

#include "qt_kernels.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    (void)ps, (void)pin_flags, (void)err, (void)errlen;
    return 0;
}

static void carve(qt_param_store *ps, qt_mem_plan *p) { ps->grad = qt_mem_plan_carve(p, "gradients (fp32 shard)", ps->shard.len * 4); }

static void carve_stage(qt_param_store *ps, qt_mem_plan *p) { (void)ps, (void)p; }

static void zero(qt_param_store *ps, cudaStream_t s) { qt_zero(ps->grad, ps->shard.len * 4, s); }

/* the pieces of buckets [k0, k1): equal pieces of each, back to back (the slots are zero already) */
static void clear(qt_param_store *ps, int k0, int k1, cudaStream_t s) {
    size_t lo = ps->shard.bucket[k0], hi = ps->shard.bucket[k1], n = (size_t)ps->shard.n_ranks;
    qt_zero((float *)ps->grad + lo / n, (hi - lo) / n * 4, s);
}

static void free_host(qt_param_store *ps) { (void)ps; }

const qt_grads_place qt_place_grads_zero2 = {alloc_host, carve, carve_stage, zero, clear, qt_place_grads_get_pieces,
                                             free_host, "parallel.zero: 2", 1, 1, 0};
const qt_grads_place qt_place_grads_zero3 = {alloc_host, carve, carve_stage, zero, clear, qt_place_grads_get_pieces,
                                             free_host, "parallel.zero: 3", 1, 1, 0};
