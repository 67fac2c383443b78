/* place_opt.c — which optimizer-state placement a store takes, and the device arrays they share (qt_place.h). */
#include "qt_place.h"

#include "qt_kernels.h"

/* Optimizer array k (0 master, 1 m, 2 v): its bytes per element (0: no master array), and its aligned bytes in
 * host_state (0 when it is not offloaded). */
static size_t opt_es(const qt_param_store *ps, int k) {
    return k == 0 ? (ps->w_master_dt == QT_DT_F32 ? 4 : 0) : qt_dtype_size(k == 1 ? ps->m_dt : ps->v_dt);
}

static size_t host_bytes(const qt_param_store *ps, int k) {
    return ps->host_opt.opt_host >> k & 1 ? qt_mem_aligned(ps->shard.len * opt_es(ps, k)) : 0;
}

/* The arrays memory.offload names that exist (no master with a bf16 master): none keeps the state resident. */
const qt_opt_place *qt_place_opt_init(qt_param_store *ps) {
    const qt_plan *pl = &ps->plan;
    if (!pl->optimizer.host) return &qt_place_opt_resident;
    ps->host_opt.opt_host = (pl->optimizer.mask ? pl->optimizer.mask : QT_OFF_OPTIMIZER) &
                            (ps->w_master_dt == QT_DT_F32 ? QT_OFF_OPTIMIZER : QT_OFF_M | QT_OFF_V);
    if (!ps->host_opt.opt_host) return &qt_place_opt_resident; /* only a master named, and there is none (bf16) */
    ps->host_opt.host_state_bytes = host_bytes(ps, 0) + host_bytes(ps, 1) + host_bytes(ps, 2);
    return pl->optimizer.zero_copy ? &qt_place_opt_zero_copy : &qt_place_opt_streamed;
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
