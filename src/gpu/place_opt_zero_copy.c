/* place_opt_zero_copy.c — memory.zero_copy: the offloaded master, m, v in pinned host memory the GPU maps, read and
 * written there by AdamW's kernel (no device slots); the other arrays stay in the arena. */
#include "qt_place.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    return qt_place_opt_pin(ps, pin_flags, err, errlen);
}

static void carve(qt_param_store *ps, qt_mem_plan *p) {
    qt_mem_plan_host(p, "offloaded optimizer state", ps->host_opt.host_state_bytes);
    qt_place_opt_carve_device(ps, p, ps->host_opt.opt_host);
}

static void zero(qt_param_store *ps, cudaStream_t s) { qt_place_opt_zero_device(ps, ps->host_opt.opt_host, s); }

static int streamed(const qt_param_store *ps) {
    (void)ps;
    return 0;
}

const qt_opt_place qt_place_opt_zero_copy = {alloc_host, carve, zero, streamed};
