/* place_weights.c — which weights placement a plan takes (qt_place.h). */
#include "qt_place.h"

#include "qt_error.h"

const qt_weights_place *qt_place_weights_of(const qt_plan *pl, int n_ranks) {
    QT_CHECK(!pl->weights.host || n_ranks == 1 || pl->parallel.zero >= 3, "parameter store: offloaded weights on a ZeRO-%d "
             "shard of %d ranks (expected ZeRO-3: the rank's pieces)", pl->parallel.zero, n_ranks);
    if (pl->parallel.zero >= 3) return pl->weights.host ? &qt_place_weights_zero3_host : &qt_place_weights_zero3;
    return pl->weights.host ? &qt_place_weights_host : &qt_place_weights_resident;
}
