/* setup.c — from a config to a model layout, initial weights and an engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_hf.h"
#include "qt_planner.h"

int qt_model_layout(const qt_config *cfg, qt_layout *L, qt_weight_src *src, char *err, size_t errlen) {
    qt_model_cfg mc = cfg->model;
    char path[QT_PATH_MAX + 32];
    if (cfg->hf_config[0]) {
        if (qt_hf_read_config(cfg->hf_config, &mc, err, errlen)) return -1;
    } else if (cfg->init.from[0] && !cfg->model_inline) {
        if (qt_hf_config_path(cfg->init.from, path, sizeof path, err, errlen) || qt_hf_read_config(path, &mc, err, errlen)) return -1;
    }
    qt_model_cfg_finish(&mc);
    if (mc.max_seq_len < cfg->data.seq_len) {
        snprintf(err, errlen, "%s: data.seq_len: expected <= model max_seq_len (%d), got %d", cfg->path,
                 mc.max_seq_len, cfg->data.seq_len);
        return -1;
    }
    if (qt_layout_init(L, &mc, err, errlen)) return -1;
    qt_weight_src_of_config(src, L, cfg);
    float none;
    if (src->kind == QT_WSRC_HF && qt_weight_src_fill(src, 0, 0, &none, err, errlen)) { /* headers only */
        qt_layout_free(L);
        return -1;
    }
    return 0;
}

int qt_model_setup(const qt_config *cfg, qt_layout *L, float **w, char *err, size_t errlen) {
    qt_weight_src src;
    if (qt_model_layout(cfg, L, &src, err, errlen)) return -1;
    *w = calloc(L->numel, sizeof(float));
    if (!*w) {
        snprintf(err, errlen, "out of host memory for %zu parameters", L->numel);
        qt_layout_free(L);
        return -1;
    }
    if (qt_weight_src_fill(&src, 0, L->numel, *w, err, errlen)) {
        free(*w);
        qt_layout_free(L);
        return -1;
    }
    return 0;
}

int qt_engine_rank_devices(const qt_config *cfg, int ngpu, int *devs, char *err, size_t errlen) {
    int n = cfg->parallel.gpus ? cfg->parallel.gpus : ngpu > 0 ? ngpu : 1;
    if (cfg->parallel.devices.n) { /* one rank per entry, several may share a GPU */
        n = cfg->parallel.devices.n;
        if (n > QT_COMM_MAX_RANKS) {
            snprintf(err, errlen, "%s: parallel.devices: %d ranks, expected at most %d", cfg->path, n, QT_COMM_MAX_RANKS);
            return -1;
        }
        for (int r = 0; r < n; r++) {
            if (ngpu > 0 && cfg->parallel.devices.v[r] >= ngpu) {
                snprintf(err, errlen, "%s: parallel.devices: entry %d is device %d, expected a device id < %d (%d visible)",
                         cfg->path, r, cfg->parallel.devices.v[r], ngpu, ngpu);
                return -1;
            }
            devs[r] = cfg->parallel.devices.v[r];
        }
        return n;
    }
    if (ngpu > 0 && n > ngpu) {
        snprintf(err, errlen, "%s: parallel.gpus: %d GPUs asked for, %d visible", cfg->path, n, ngpu);
        return -1;
    }
    if (n > QT_COMM_MAX_RANKS && !cfg->parallel.gpus) n = QT_COMM_MAX_RANKS; /* "all visible", up to what comm serves */
    if (n > QT_COMM_MAX_RANKS) {
        snprintf(err, errlen, "%s: parallel.gpus: %d, expected at most %d", cfg->path, n, QT_COMM_MAX_RANKS);
        return -1;
    }
    for (int r = 0; r < n; r++) devs[r] = r;
    return n;
}

static qt_engine *engine_create(const qt_layout *L, const qt_config *cfg, const qt_weight_src *src, char *err,
                                size_t errlen) {
    int ngpu = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count();
    if (cfg->device == QT_DEVICE_CUDA && ngpu == 0) {
        snprintf(err, errlen, "%s: device: cuda was asked for but no CUDA device is visible", cfg->path);
        return NULL;
    }
    if (ngpu == 0) {
        if (cfg->device == QT_DEVICE_AUTO)
            printf("qtrain: no CUDA device found; training on the CPU fp32 reference path\n");
        return qt_engine_cpu_create(L, cfg, src, err, errlen);
    }
    int devs[QT_COMM_MAX_RANKS], n = qt_engine_rank_devices(cfg, ngpu, devs, err, errlen);
    if (n < 0) return NULL;
    if (cfg->parallel.zero >= 2 && n == 1) {
        snprintf(err, errlen, "%s: parallel.zero: %d shards the gradients%s over the data-parallel ranks, expected >= 2 "
                 "ranks, got 1 (parallel.devices: [0, 0] puts two ranks on GPU 0; one rank keeps everything: zero 0 or 1)",
                 cfg->path, cfg->parallel.zero, cfg->parallel.zero == 3 ? " and weights" : "");
        return NULL;
    }
    if (qt_config_zero3_check(cfg, err, errlen)) return NULL; /* a config changed after loading (memory.plan: auto) */
    int w_off = (cfg->memory.offload & QT_OFF_WEIGHTS) && cfg->parallel.zero < 3,
        g_off = (cfg->memory.offload & QT_OFF_GRADIENTS) && cfg->parallel.zero < 2;
    if ((w_off || g_off) && n > 1) { /* several ranks: the rank's ZeRO-3 pieces / ZeRO-2 gradient shard only */
        snprintf(err, errlen, "%s: memory.offload: [%s] with parallel.zero: %d is built for one GPU, expected 1 rank, got "
                 "%d (parallel.gpus: 0 takes every visible GPU: set parallel.gpus: 1; with several ranks parallel.zero: %s "
                 "offloads the rank's shard)", cfg->path, w_off ? "weights" : "gradients", cfg->parallel.zero, n,
                 w_off ? "3" : "2 or 3");
        return NULL;
    }
    if (n == 1) return qt_engine_gpu_create(L, cfg, src, devs[0], NULL, err, errlen);
    return qt_engine_dp_create(L, cfg, src, n, devs, err, errlen);
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
    qt_catch c;
    qt_catch_push(&c);
    if (setjmp(c.jb)) {
        qt_errf(err, errlen, "%s", c.msg);
        return NULL;
    }
    if (check_plan(L, cfg, err, errlen)) {
        qt_catch_pop(&c);
        return NULL;
    }
    qt_engine *e = engine_create(L, cfg, src, err, errlen);
    qt_catch_pop(&c);
    return e;
}
