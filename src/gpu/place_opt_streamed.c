/* place_opt_streamed.c — memory.offload's master, m, v (those named) in pinned host memory, streamed through device
 * slots by the copy engines in AdamW's chunks (qt_gpu_optim), with the weights and gradients that live in host
 * memory too; the other arrays stay in the arena. */
#include "qt_place.h"

#include "qt_pinned.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return qt_place_opt_pin(ps, pin_flags & ~QT_PIN_MAPPED, err, errlen); /* the copy engines move it: not mapped */
}

_Static_assert((int)QT_OPTIM_MASTER == (int)QT_OFF_MASTER && (int)QT_OPTIM_M == (int)QT_OFF_M && (int)QT_OPTIM_V == (int)QT_OFF_V,
               "opt_host (memory.offload bits) is handed to qt_gpu_optim as its host_mask");
_Static_assert((int)QT_OPTIM_G == (int)QT_OFF_GRADIENTS && (int)QT_OPTIM_W == (int)QT_OFF_WEIGHTS, "streamed bits");

/* the offloaded state arrays, and the weights and gradients where they live in host memory too */
static int streamed(const qt_param_store *ps) {
    return ps->host_opt.opt_host | (ps->plan.weights.host ? QT_OPTIM_W : 0) | (ps->plan.grads.host ? QT_OPTIM_G : 0);
}

static void carve(qt_param_store *ps, qt_mem_plan *p) {
    ps->host_opt.opt_slots = qt_mem_plan_carve(p, "optimizer slots (offload)", qt_gpu_optim_slot_bytes(ps->plan.optimizer.chunk,
                                                                               streamed(ps), ps->m_dt, ps->v_dt, ps->grad_dt));
    qt_mem_plan_host(p, "offloaded optimizer state", ps->host_opt.host_state_bytes);
    qt_place_opt_carve_device(ps, p, ps->host_opt.opt_host);
}

static void zero(qt_param_store *ps, cudaStream_t s) { qt_place_opt_zero_device(ps, ps->host_opt.opt_host, s); }

const qt_opt_place qt_place_opt_streamed = {alloc_host, carve, zero, streamed};
