/* place_common.c — what the placements share: pinned host arrays, ZeRO-3's e4m3 gather buffers, the gradients'
 * host reads, the optimizer arrays left on the device and the offloaded ones' host state (qt_place.h). */
#include "qt_place.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_kernels.h"
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

void qt_place_grads_get_pieces(const qt_param_store *ps, float *g) {
    size_t n = ps->L->numel;
    for (int k = 0; k < ps->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        size_t np = qt_shard_params(off, len, n);
        if (ps->host_grad.gshard && qt_host_shard_cleared(ps->host_grad.gshard, k)) memset(g + off, 0, np * 4); /* what the piece reads as */
        else QT_CUDA(cudaMemcpy(g + off, (float *)ps->grad + st, np * 4, cudaMemcpyDefault));
    }
}

void qt_place_grads_get_whole(const qt_param_store *ps, float *g) {
    size_t n = ps->L->numel;
    if (ps->grad_dt == QT_DT_F32) {
        QT_CUDA(cudaMemcpy(g, ps->grad, n * 4, cudaMemcpyDefault));
        return;
    }
    uint16_t *h = malloc(n * 2 + 1); /* bf16 gradients: their exact fp32 values */
    QT_CHECK(h, "out of host memory (%zu bf16 gradients)", n);
    QT_CUDA(cudaMemcpy(h, ps->grad, n * 2, cudaMemcpyDefault));
    for (size_t i = 0; i < n; i++) g[i] = qt_bf16_to_f32(h[i]);
    free(h);
}

/* Optimizer array k (0 master, 1 m, 2 v): its bytes per element (0: no master array), and its aligned bytes in
 * host_state (0 when it is not offloaded). */
static size_t opt_es(const qt_param_store *ps, int k) {
    return k == 0 ? (ps->w_master_dt == QT_DT_F32 ? 4 : 0) : qt_dtype_size(k == 1 ? ps->m_dt : ps->v_dt);
}

static size_t host_bytes(const qt_param_store *ps, int k) {
    return ps->host_opt.opt_host >> k & 1 ? qt_mem_aligned(ps->shard.len * opt_es(ps, k)) : 0;
}

void qt_place_opt_set_host(qt_param_store *ps, int mask) {
    ps->host_opt.opt_host = mask;
    ps->host_opt.host_state_bytes = host_bytes(ps, 0) + host_bytes(ps, 1) + host_bytes(ps, 2);
}

void qt_place_opt_carve_device(qt_param_store *ps, qt_mem_plan *p, int host_mask) {
    size_t ns = ps->shard.len;
    if (ps->w_master_dt == QT_DT_F32 && !(host_mask & QT_OFF_MASTER)) ps->master = qt_mem_plan_carve(p, "master weights (fp32)", ns * 4);
    if (!(host_mask & QT_OFF_M))
        ps->m = qt_mem_plan_carve(p, ps->m_dt == QT_DT_BF16 ? "adam m (bf16)" : "adam m (fp32)", ns * qt_dtype_size(ps->m_dt));
    if (!(host_mask & QT_OFF_V))
        ps->v = qt_mem_plan_carve(p, ps->v_dt == QT_DT_BF16 ? "adam v (bf16)" : "adam v (fp32)", ns * qt_dtype_size(ps->v_dt));
}

void qt_place_opt_zero_device(qt_param_store *ps, int host_mask, cudaStream_t s) {
    size_t ns = ps->shard.len;
    if (ps->master && !(host_mask & QT_OFF_MASTER)) qt_zero(ps->master, ns * 4, s);
    if (!(host_mask & QT_OFF_M)) qt_zero(ps->m, ns * qt_dtype_size(ps->m_dt), s);
    if (!(host_mask & QT_OFF_V)) qt_zero(ps->v, ns * qt_dtype_size(ps->v_dt), s);
}

/* The offloaded arrays in the pinned host state (QT_PIN_* flags), back to back. */
int qt_place_opt_pin(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    size_t b0 = host_bytes(ps, 0), b1 = host_bytes(ps, 1);
    if (qt_place_pin((void **)&ps->host_opt.host_state, ps->host_opt.host_state_bytes, pin_flags, "memory.offload_optimizer",
                     "the optimizer state", "train without the offload", ps, err, errlen))
        return -1;
    if (ps->host_opt.opt_host & QT_OFF_MASTER) ps->master = (float *)ps->host_opt.host_state;
    if (ps->host_opt.opt_host & QT_OFF_M) ps->m = ps->host_opt.host_state + b0;
    if (ps->host_opt.opt_host & QT_OFF_V) ps->v = ps->host_opt.host_state + b0 + b1;
    return 0;
}
