/* place_grads_host.c — memory.offload: [gradients]: in pinned host memory the GPU maps, on one GPU the whole array
 * (grad_dt), under ZeRO-2/3 the rank's fp32 shard. The backward writes gradient slots that are loaded from and stored
 * to the host array (one GPU), or whose summed pieces are added into the host shard through device chunks
 * (qt_host_shard.h); the norm and AdamW read the array where it lives. */
#include "qt_place.h"

#include "qt_kernels.h"
#include "qt_pinned.h"
#include "qt_test_hooks.h"

#define SHARD_STAGE_ELEMS ((size_t)1 << 22) /* 16 MiB: a host gradient shard's chunk (copies of ~0.1-0.5 ms at PCIe rates) */

/* n elements of grad_dt, zeroed; the norm, AdamW and the zeroing kernels read and write them in place */
static int pin(qt_param_store *ps, size_t n, unsigned pin_flags, char *err, size_t errlen) {
    return qt_place_pin(&ps->grad, n * qt_dtype_size(ps->grad_dt), pin_flags, "memory.offload: [gradients]",
                        ps->grad_dt == QT_DT_BF16 ? "the bf16 gradients" : "the fp32 gradients", "keep the gradients on the GPU",
                        ps, err, errlen);
}

static int alloc_whole(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return pin(ps, ps->shard.total, pin_flags, err, errlen);
}

static int alloc_shard(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return pin(ps, ps->shard.len, pin_flags, err, errlen);
}

static void carve_whole(qt_param_store *ps, qt_mem_plan *p) {
    qt_mem_plan_host(p, ps->grad_dt == QT_DT_BF16 ? "gradients (bf16, offloaded)" : "gradients (fp32, offloaded)",
                     ps->shard.total * qt_dtype_size(ps->acc_dt));
}

static void carve_shard(qt_param_store *ps, qt_mem_plan *p) {
    qt_mem_plan_host(p, "gradients (fp32 shard, offloaded)", ps->shard.len * 4);
}

static void no_stage(qt_param_store *ps, qt_mem_plan *p) { (void)ps, (void)p; }

/* the device slots the host shard's adds move through: chunks of at most the largest piece */
static void carve_stage(qt_param_store *ps, qt_mem_plan *p) {
    size_t big = 0;
    for (int b = 0; b < ps->shard.n_buckets; b++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, b, &off, &len, &st);
        big = len > big ? len : big;
    }
    size_t chunk = qt_test_hooks_get()->grad_stage_elems > 0 ? (size_t)qt_test_hooks_get()->grad_stage_elems : SHARD_STAGE_ELEMS;
    ps->host_grad.shard_stage_n = big < chunk ? big : chunk;
    ps->host_grad.shard_stage = qt_mem_plan_carve(p, "gradient shard staging (fp32)", qt_host_shard_slot_bytes(ps->host_grad.shard_stage_n));
}

/* zeroed at allocation */
static void zero(qt_param_store *ps, cudaStream_t s) { (void)ps, (void)s; }

/* a kernel, not a memset: the array is in host memory */
static void clear_whole(qt_param_store *ps, int k0, int k1, cudaStream_t s) {
    size_t lo = ps->shard.bucket[k0], hi = ps->shard.bucket[k1];
    qt_fill((char *)ps->grad + lo * qt_dtype_size(ps->acc_dt), ps->grad_dt, 0.0f, hi - lo, s);
}

/* no pass over host memory: the pieces are marked cleared */
static void clear_shard(qt_param_store *ps, int k0, int k1, cudaStream_t s) {
    (void)s;
    qt_host_shard_clear(ps->host_grad.gshard, k0, k1);
}

/* fp32: the pieces' copy (as the shard's); bf16: their exact fp32 values */
static void get_whole(const qt_param_store *ps, float *g) {
    if (ps->grad_dt == QT_DT_F32) qt_place_grads_get_pieces(ps, g);
    else qt_place_grads_get_whole(ps, g);
}

static void free_host(qt_param_store *ps) { qt_pinned_free(ps->grad); }

const qt_grads_place qt_place_grads_host = {alloc_whole, carve_whole, no_stage, zero, clear_whole, get_whole, free_host,
                                            "memory.offload: [gradients]", 0, 1, 1};
const qt_grads_place qt_place_grads_host_shard = {alloc_shard, carve_shard, carve_stage, zero, clear_shard,
                                                  qt_place_grads_get_pieces, free_host, "memory.offload: [gradients]",
                                                  1, 1, 1};
