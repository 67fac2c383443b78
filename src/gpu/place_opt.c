/* place_opt.c — which optimizer-state placement a store takes (qt_place.h). */
#include "qt_place.h"

/* The arrays memory.offload names that exist (no master with a bf16 master): none keeps the state resident. */
const qt_opt_place *qt_place_opt_init(qt_param_store *ps) {
    const qt_plan *pl = &ps->plan;
    if (!pl->optimizer.host) return &qt_place_opt_resident;
    int mask = (pl->optimizer.mask ? pl->optimizer.mask : QT_OFF_OPTIMIZER) &
               (ps->w_master_dt == QT_DT_F32 ? QT_OFF_OPTIMIZER : QT_OFF_M | QT_OFF_V);
    if (!mask) return &qt_place_opt_resident; /* only a master named, and there is none (bf16) */
    qt_place_opt_set_host(ps, mask);
    return pl->optimizer.zero_copy ? &qt_place_opt_zero_copy : &qt_place_opt_streamed;
}
