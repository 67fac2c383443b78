/* place_grads.c — which gradients placement a plan takes (qt_place.h). */
#include "qt_place.h"

#include "qt_error.h"

const qt_grads_place *qt_place_grads_of(const qt_plan *pl, int n_ranks) {
    QT_CHECK(!pl->grads.host || n_ranks == 1 || pl->parallel.zero >= 2, "parameter store: offloaded gradients on a ZeRO-%d "
             "shard of %d ranks (expected ZeRO-2 or 3: the rank's gradient shard)", pl->parallel.zero, n_ranks);
    if (pl->grads.host) return pl->parallel.zero >= 2 ? &qt_place_grads_host_shard : &qt_place_grads_host;
    if (pl->parallel.zero >= 2) return pl->parallel.zero == 2 ? &qt_place_grads_zero2 : &qt_place_grads_zero3;
    return &qt_place_grads_whole;
}
