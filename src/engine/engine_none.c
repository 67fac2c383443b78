/* engine_none.c — the GPU entry points of the CPU-only build (`make CPU=1`, or no nvcc found): compiled
 * in place of cuda/, comm/, src/gpu/, the GPU engines and the GPU planner (the Makefile's CPU_ONLY_OUT),
 * never beside them. The machine sees no GPU; what asks for one gets QT_NO_CUDA as its error. */
#include <stdio.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_device.h"
#include "qt_dp_nodes.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_plan_auto.h"

#define QT_NO_CUDA "built without CUDA: rebuild with the CUDA toolkit (nvcc on PATH or CUDA_HOME; make CPU=0)"

/* No CUDA runtime linked: no device, so device: auto trains on the CPU engine. */
int qt_cuda_device_count(void) { return 0; }
size_t qt_cuda_mem_free(const int *devs, int n) {
    (void)devs, (void)n;
    return 0;
}

qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                const qt_gpu_rank *rank, char *err, size_t errlen) {
    (void)L, (void)src, (void)device, (void)rank;
    qt_errf(err, errlen, "%s: device: cuda: %s", plan->run.path, QT_NO_CUDA);
    return NULL;
}

qt_engine *qt_engine_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                               const int *devices, char *err, size_t errlen) {
    (void)L, (void)src, (void)n, (void)devices;
    qt_errf(err, errlen, "%s: parallel: %s", plan->run.path, QT_NO_CUDA);
    return NULL;
}

qt_engine *qt_engine_dp_nodes_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                     const int *devices, const struct qt_nodes *nodes, char *err, size_t errlen) {
    (void)L, (void)src, (void)n, (void)devices, (void)nodes;
    qt_errf(err, errlen, "%s: parallel: %s", plan->run.path, QT_NO_CUDA);
    return NULL;
}

int qt_dp_nodes_ids(unsigned char *ids, int gpus, char *err, size_t errlen) {
    (void)ids, (void)gpus;
    return qt_errf(err, errlen, "parallel.nodes: %s", QT_NO_CUDA);
}

qt_engine *qt_engine_gpu_lora_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                     char *err, size_t errlen) {
    (void)L, (void)src, (void)device;
    qt_errf(err, errlen, "%s: device: cuda: %s", plan->run.path, QT_NO_CUDA);
    return NULL;
}

qt_engine *qt_engine_gpu_lora_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                        const int *devices, char *err, size_t errlen) {
    (void)L, (void)src, (void)n, (void)devices;
    qt_errf(err, errlen, "%s: parallel: %s", plan->run.path, QT_NO_CUDA);
    return NULL;
}

/* The planner's GPU rows (qt_plan_run of a GPU run: device: cuda, `qtrain --plan` of a GPU config). */
int qt_gpu_model_plan(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, qt_mem_plan *plan, char *err,
                      size_t errlen) {
    (void)L, (void)sh, (void)plan;
    return qt_errf(err, errlen, "%s: a GPU run (device: cuda, or qtrain --plan of a GPU config): %s", pl->run.path,
                   QT_NO_CUDA);
}

/* Reached only after a GPU plan, which qt_gpu_model_plan refuses. */
void qt_comm_plan_bytes(int n, qt_comm_kind kind, size_t *dev_per_rank, size_t *pinned) {
    (void)n, (void)kind, (void)dev_per_rank, (void)pinned;
    qt_fail(__FILE__, __LINE__, "qt_comm_plan_bytes", "%s", QT_NO_CUDA);
}

/* memory.plan: auto chooses among GPU plans: nothing to probe, nothing to choose. */
qt_probe qt_probe_get(const char *cache_dir, int may_measure) {
    (void)cache_dir, (void)may_measure;
    qt_probe p;
    memset(&p, 0, sizeof p);
    snprintf(p.gpu, sizeof p.gpu, "none (built without CUDA)");
    return p;
}

void qt_probe_free_memory(qt_probe *pr, const qt_config *cfg) {
    (void)cfg;
    pr->gpu_free = 0;
}

size_t qt_plan_gpu_budget(const qt_config *cfg, const qt_probe *pr, char *what, size_t cap) {
    (void)cfg, (void)pr;
    snprintf(what, cap, "no GPU (%s)", QT_NO_CUDA);
    return 0;
}

int qt_plan_auto(qt_config *cfg, const qt_probe *pr, char *err, size_t errlen) {
    (void)pr;
    if (!cfg->memory.plan) return 0;
    return qt_errf(err, errlen, "%s: memory.plan: auto: %s", cfg->path, QT_NO_CUDA);
}

qt_plan_cost qt_plan_auto_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    (void)L, (void)cfg, (void)pr;
    qt_fail(__FILE__, __LINE__, "qt_plan_auto_cost_parts", "%s", QT_NO_CUDA);
}

double qt_plan_auto_cost(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    (void)L, (void)cfg, (void)pr;
    qt_fail(__FILE__, __LINE__, "qt_plan_auto_cost", "%s", QT_NO_CUDA);
}
