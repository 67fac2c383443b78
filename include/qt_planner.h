/* qt_planner.h — the memory plan of a whole run, made before anything is allocated and without a GPU:
 * one GPU rank's device rows (the GPU model's plan: arena, library workspaces, runtime reserve) and
 * every host buffer of the process (pinned offloaded state, token staging and checkpoint snapshots;
 * pageable weight init buffer, step tokens, the CPU engine's arrays), checked against
 * memory.gpu_limit_gib and memory.host_limit_gib (or MemAvailable). The engine refuses a plan that
 * does not fit before allocating (qt_engine_create); `qtrain --plan` prints it.
 *
 * Not counted: the CUDA context, the data loader's shard buffers (the current shard file of each of
 * data.train and data.eval), the checkpoint writer's compression buffers, and small bookkeeping. */
#ifndef QT_PLANNER_H
#define QT_PLANNER_H

#include <stddef.h>

#include "qt_config.h"
#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_plan.h"
#include "qt_plan_auto.h"
#include "qt_weight_src.h"

#define QT_EXIT_NO_FIT 3 /* qtrain --plan: the plan does not fit the limits */

typedef struct {
    int ranks;         /* GPU ranks; 0: the CPU engine */
    int ranks_per_gpu; /* ranks on the busiest GPU (parallel.devices may repeat one) */
    int training;      /* the run trains: checkpoint snapshot buffers and the step's token arrays exist */
    qt_mem_plan mem;   /* device rows: one rank's; host rows: the whole process */
    qt_plan plan;      /* rank 0's (GPU ranks only) */
    size_t gpu_bytes;  /* per GPU: ranks_per_gpu x one rank's device total */
    size_t host_bytes;
} qt_run_plan;

/* The plan of cfg for layout L. gpus: the CUDA devices visible (0: the CPU engine unless device: cuda;
 * -1: plan for GPUs without one, parallel.devices or parallel.gpus of them, else 1). 0, or -1 with err. */
int qt_plan_run(const qt_layout *L, const qt_config *cfg, int gpus, int training, qt_run_plan *rp, char *err,
                size_t errlen);
/* 0 when the plan fits: the per-GPU total within gpu_limit (bytes; 0 = none) and the host total within
 * host_limit (0 = none); else -1 with the message of qt_mem_plan_check (total, limit, biggest items). */
int qt_plan_check(const qt_run_plan *rp, size_t gpu_limit, const char *gpu_what, size_t host_limit,
                  const char *host_what, char *err, size_t errlen);
/* Prints the rows and totals (stdout). */
void qt_plan_print(const qt_run_plan *rp);
/* `qtrain --plan`: the plan of cfg printed (no GPU needed, nothing allocated) and checked against
 * gpu_gib / host_gib (> 0: --gpu-mem / --host-mem), else the budgets a run plans for, each printed with
 * where it came from (qt_plan_gpu_budget: the free memory pr->gpu_free less the margin, capped by
 * memory.gpu_limit_gib; qt_plan_host_limit: memory.host_limit_gib, else MemAvailable); on a GPU plan also the cost
 * model's step on pr (qt_plan_auto_cost_parts: compute, the PCIe bytes beside it and serial). 0 fits, 1
 * does not (err says why: total, limit, biggest items), -1 the config cannot be planned (err). */
int qt_plan_report(const qt_config *cfg, const qt_probe *pr, double gpu_gib, double host_gib, char *err, size_t errlen);

#endif
