/* qt_test_plan.h — tests that build one kind of engine, a store or a model straight from a config: the plan
 * resolved first (qt_plan_resolve), as qt_engine_create does. */
#ifndef QT_TEST_PLAN_H
#define QT_TEST_PLAN_H

#include "qt_config.h"
#include "qt_engine.h"
#include "qt_plan.h"

/* The CPU engine of cfg. */
static inline qt_engine *qt_t_cpu_engine(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, char *err,
                                         size_t errlen) {
    qt_plan p;
    return qt_plan_resolve(cfg, L, -1, &p, err, errlen) ? NULL : qt_engine_cpu_create(L, &p, src, err, errlen);
}
/* One GPU's engine of cfg on device 0. */
static inline qt_engine *qt_t_gpu_engine(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, char *err,
                                         size_t errlen) {
    qt_plan p;
    return qt_plan_resolve(cfg, L, 0, &p, err, errlen) ? NULL : qt_engine_gpu_create(L, &p, src, 0, NULL, err, errlen);
}
/* The data-parallel engine of cfg on n ranks, devices devs. */
static inline qt_engine *qt_t_dp_engine(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, int n,
                                        const int *devs, char *err, size_t errlen) {
    qt_plan p;
    return qt_plan_resolve(cfg, L, n, &p, err, errlen) ? NULL : qt_engine_dp_create(L, &p, src, n, devs, err, errlen);
}
/* cfg's plan with the parameters placed as in pl (its parallel.zero, weights, grads, the optimizer state's
 * place and memory.host_wc; the rest of pl unused): a store or model on a shard the test cuts itself. */
static inline const qt_plan *qt_t_placed(qt_plan *out, const qt_config *cfg, const qt_layout *L, const qt_plan *pl) {
    char err[8];
    qt_plan_resolve(cfg, L, -1, out, err, sizeof err); /* no ranks: nothing checked, nothing placed */
    out->parallel.zero = pl->parallel.zero;
    out->weights = pl->weights;
    out->grads = pl->grads;
    out->optimizer.host = pl->optimizer.host;
    out->optimizer.mask = pl->optimizer.mask;
    out->optimizer.zero_copy = pl->optimizer.zero_copy;
    out->optimizer.ahead = pl->optimizer.ahead;
    out->optimizer.chunk = pl->optimizer.chunk;
    out->memory.host_wc = pl->memory.host_wc;
    return out;
}

#endif
