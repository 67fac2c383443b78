/* place_weights.c — which weights placement a plan takes (qt_place.h). */
#include "qt_place.h"

const qt_weights_place *qt_place_weights_of(const qt_plan *pl) {
    if (pl->parallel.zero >= 3) return pl->weights.host ? &qt_place_weights_zero3_host : &qt_place_weights_zero3;
    return pl->weights.host ? &qt_place_weights_host : &qt_place_weights_resident;
}
