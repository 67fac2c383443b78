/* setup.c — from a config to an engine: the run's plan (qt_plan_resolve) checked against the memory limits,
 * then the engine it asks for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_planner.h"

size_t qt_engine_unit_align(const qt_config *cfg) {
    int ngpu = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count(), devs[QT_COMM_MAX_RANKS];
    if ((ngpu == 0 && cfg->parallel.nodes <= 1) || cfg->lora.rank > 0) return QT_LAYOUT_ALIGN; /* as engine_create */
    char e[512]; /* a bad rank count: engine_create says so */
    int n = qt_plan_rank_devices(cfg, ngpu, devs, e, sizeof e);
    return n < 0 ? QT_LAYOUT_ALIGN : qt_plan_unit_align_for(cfg, n == 1 && cfg->parallel.nodes <= 1 ? 0 : n);
}

static qt_engine *engine_create(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src,
                                const struct qt_nodes *nodes, char *err, size_t errlen) {
    int ngpu = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count();
    if (cfg->device == QT_DEVICE_CUDA && ngpu == 0) {
        snprintf(err, errlen, "%s: device: cuda was asked for but no CUDA device is visible", cfg->path);
        return NULL;
    }
    qt_plan plan;
    int across = cfg->parallel.nodes > 1; /* a node of one GPU is a data-parallel rank too */
    if (ngpu == 0 && across) {
        snprintf(err, errlen, "%s: parallel.nodes: %d: training across nodes runs on GPUs (NCCL between them), and "
                 "no CUDA device is visible here", cfg->path, cfg->parallel.nodes);
        return NULL;
    }
    if (ngpu == 0) {
        if (cfg->device == QT_DEVICE_AUTO)
            printf("qtrain: no CUDA device found; training on the CPU fp32 reference path\n");
        qt_plan_resolve(cfg, L, -1, &plan, err, errlen);
        if (plan.lora.rank > 0) return qt_engine_cpu_lora_create(L, &plan, src, err, errlen);
        return qt_engine_cpu_create(L, &plan, src, err, errlen);
    }
    const char *no = qt_engine_gpu_refusal(cfg);
    if (no) {
        snprintf(err, errlen, "%s: %s", cfg->path, no);
        return NULL;
    }
    int devs[QT_COMM_MAX_RANKS], n = qt_plan_rank_devices(cfg, ngpu, devs, err, errlen);
    if (n > 1 && cfg->lora.rank > 0) /* every rank one GPU's LoRA engine, the adapters replicated (a streamed base:
                                       * one pinned copy for them all) */
        return qt_plan_resolve(cfg, L, 0, &plan, err, errlen) ? NULL : qt_engine_gpu_lora_dp_create(L, &plan, src, n, devs, err, errlen);
    if (n < 0 || qt_plan_resolve(cfg, L, n == 1 && !across ? 0 : n, &plan, err, errlen)) return NULL;
    if (L->unit_align % qt_plan_unit_align(&plan)) {
        snprintf(err, errlen, "%s: a layout of unit alignment %zu for a plan that shards over %zu ranks (expected a multiple of "
                 "%zu: qt_engine_unit_align)", cfg->path, L->unit_align, qt_plan_unit_align(&plan) / QT_LAYOUT_ALIGN,
                 qt_plan_unit_align(&plan));
        return NULL;
    }
    if (n == 1 && plan.lora.rank > 0) return qt_engine_gpu_lora_create(L, &plan, src, devs[0], err, errlen);
    if (n == 1 && !across) return qt_engine_gpu_create(L, &plan, src, devs[0], NULL, err, errlen);
    return qt_engine_dp_nodes_create(L, &plan, src, n, devs, nodes, err, errlen);
}

/* The run's memory plan against the limits, before anything is allocated; prints the host rows. The GPU
 * model checks its device rows again with the attention workspace measured (qt_gpu_model_create). */
static int check_plan(const qt_layout *L, const qt_config *cfg, char *err, size_t errlen) {
    static qt_run_plan rp;
    char host_what[96], gpu_what[64];
    int gpus = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count();
    if (qt_plan_run(L, cfg, gpus, 1, &rp, err, errlen)) return -1;
    size_t host = qt_plan_host_limit(cfg, host_what, sizeof host_what);
    snprintf(gpu_what, sizeof gpu_what, "memory.gpu_limit_gib = %g", cfg->memory.gpu_limit_gib);
    printf("qtrain: host memory plan: %.2f GiB of %.2f GiB (%s)\n", rp.host_bytes / 1073741824.0, host / 1073741824.0,
           host_what);
    qt_mem_plan_print_rows(&rp.mem, QT_MEM_PINNED);
    qt_mem_plan_print_rows(&rp.mem, QT_MEM_PAGEABLE);
    if (qt_plan_check(&rp, qt_mem_gib(cfg->memory.gpu_limit_gib), gpu_what, host, host_what, err, errlen)) {
        size_t n = strlen(err);
        snprintf(err + n, errlen - n, " (%s; qtrain --plan %s lists every row)", cfg->path, cfg->path);
        return -1;
    }
    return 0;
}

void qt_engine_profile(qt_engine *e, int on) {
    if (e->ops->profile) e->ops->profile(e, on);
}
void qt_engine_profile_print(qt_engine *e, int steps) {
    if (e->ops->profile_print) e->ops->profile_print(e, steps);
}

/* A failure while the engine is built (a CUDA call, a rank's thread) comes back as NULL with its
 * message; what was allocated before it is not freed (the process is expected to end or retry). */
qt_engine *qt_engine_create(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, char *err,
                                size_t errlen) {
    return qt_engine_create_nodes(L, cfg, src, NULL, err, errlen);
}

qt_engine *qt_engine_create_nodes(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src,
                                  const struct qt_nodes *nodes, char *err, size_t errlen) {
    qt_catch c;
    qt_catch_push(&c);
    if (setjmp(c.jb)) {
        qt_errf(err, errlen, "%s", c.msg);
        return NULL;
    }
    int gpu = cfg->device != QT_DEVICE_CPU && qt_cuda_device_count() > 0;
    if ((gpu && qt_model_gpu_check(&L->cfg, err, errlen)) || check_plan(L, cfg, err, errlen)) {
        qt_catch_pop(&c);
        return NULL;
    }
    qt_engine *e = engine_create(L, cfg, src, nodes, err, errlen);
    qt_catch_pop(&c);
    return e;
}
