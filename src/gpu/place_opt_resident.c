/* place_opt_resident.c — the optimizer state (fp32 master unless bf16, AdamW m and v of the rank's pieces) in the
 * GPU's arena. */
#include "qt_place.h"

static int alloc_host(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen) {
    (void)ps, (void)pin_flags, (void)err, (void)errlen;
    return 0;
}

static void carve(qt_param_store *ps, qt_mem_plan *p) { qt_place_opt_carve_device(ps, p, 0); }

static void zero(qt_param_store *ps, cudaStream_t s) { qt_place_opt_zero_device(ps, 0, s); }

static int streamed(const qt_param_store *ps) {
    (void)ps;
    return 0;
}

const qt_opt_place qt_place_opt_resident = {alloc_host, carve, zero, streamed};
