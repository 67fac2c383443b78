/* planner.c — the memory plan of a whole run before anything is allocated (qt_planner.h). */
#include "qt_planner.h"

#include <stdio.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_cpu_model.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_partition.h"
#include "qt_test_hooks.h"
#include "qt_weight_src.h"

qt_param_placement qt_plan_placement(const qt_step_plan *p, const qt_layout *L) {
    size_t chunk = qt_test_hooks_get()->offload_chunk;
    return (qt_param_placement){.opt = p->offload_opt ? QT_OPT_STATE_HOST : QT_OPT_STATE_DEVICE, .zero = p->zero,
                                .opt_per_bucket = p->opt_ahead, .reduce_bf16 = p->reduce_bf16,
                                .opt_chunk = chunk ? chunk : QT_GPU_OPTIM_CHUNK,
                                .embed_apart = p->grads_sharded && p->lookups && L->lm_head != L->embed,
                                .w_host = p->weights_host || p->weights_shard_host, .g_host = p->grads_host || p->grads_shard_host,
                                .opt_mask = p->opt_mask, .zero_copy = p->zero_copy, .host_wc = p->host_wc,
                                .w8 = p->gather_e4m3};
}

/* The ranks engine_create (setup.c) starts, and how many share the busiest GPU: 0, or -1 with err. */
static int count_ranks(const qt_config *cfg, int gpus, qt_run_plan *rp, char *err, size_t errlen) {
    rp->ranks_per_gpu = 1;
    rp->ranks = 0;
    if (cfg->device == QT_DEVICE_CPU || (gpus == 0 && cfg->device != QT_DEVICE_CUDA)) return 0;
    int devs[QT_COMM_MAX_RANKS];
    rp->ranks = qt_engine_rank_devices(cfg, gpus, devs, err, errlen);
    if (rp->ranks < 0) return -1;
    for (int i = 0; i < rp->ranks; i++) {
        int k = 0;
        for (int j = 0; j < rp->ranks; j++) k += devs[j] == devs[i];
        if (k > rp->ranks_per_gpu) rp->ranks_per_gpu = k;
    }
    return 0;
}

/* Rank 0's device rows (the same code as qt_gpu_model_create) and the pinned rows that come with them,
 * times the ranks. */
static int gpu_rows(const qt_layout *L, const qt_config *cfg, qt_run_plan *rp, char *err, size_t errlen) {
    int n = rp->ranks, sharded = cfg->parallel.shard_optimizer && n > 1;
    qt_step_plan sp;
    qt_shard sh;
    qt_step_plan_make(&sp, L, cfg, n > 1 ? n : 0, 0, sharded);
    if (n > 1) qt_shard_init(&sh, L, sharded ? n : 1, 0, cfg->parallel.overlap_comm || sharded); /* as engine_dp.c */
    else qt_shard_init(&sh, L, 1, 0, sp.offload_opt || sp.weights_host || sp.grads_host); /* as engine_gpu.c */
    qt_param_placement pl = qt_plan_placement(&sp, L);
    qt_mem_plan one;
    if (qt_gpu_model_plan(L, cfg, &sh, &pl, &one, err, errlen)) return -1;
    for (int i = 0; i < one.n; i++) { /* device rows: one rank's; host rows: every rank's */
        const qt_mem_row *r = &one.row[i];
        int host = r->where == QT_MEM_PINNED || r->where == QT_MEM_PAGEABLE;
        qt_mem_plan_add(&rp->mem, r->where, r->kind, host ? r->bytes * n : r->bytes);
    }
    rp->mem.off = one.off;
    size_t N = (size_t)cfg->data.micro_batch * cfg->data.seq_len, numel = L->numel, ns = sh.len;
    size_t bf16 = (sp.zero >= 3 ? ns : numel) * 2; /* a rank's bf16 weights: ZeRO-3 its pieces */
    size_t es_m = cfg->precision.opt_m_dtype == QT_DT_BF16 ? 2 : 4, es_v = cfg->precision.opt_v_dtype == QT_DT_BF16 ? 2 : 4;
    /* engine_gpu.c: two pinned token buffers [tok | tgt] and the one read per step */
    qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "token staging", n * (2 * 2 * N * sizeof(int32_t) + 16));
    if (rp->training) { /* engine_gpu.c's state_items, made at training start: the bf16 weights, and an fp32
                         * master, m, v unless an offloaded state of one GPU or ZeRO ranks is written in place (live_state, with the
                         * weights too when they are offloaded; an explicit checkpoint.offloaded: copy copies
                         * them). A bf16 master has no fp32 copy: its
                         * "weights" is the bf16 weights widened as they are written. Replicated, only rank 0's
                         * (engine_dp.c); sharded, every rank's. */
        int live = sp.offload_opt && (n == 1 || sharded) && cfg->checkpoint.offloaded != QT_CKPT_OFFLOAD_COPY;
        int in_place = live ? sp.opt_mask : 0; /* the offloaded state arrays, written where they are */
        size_t master = cfg->precision.master_dtype == QT_DT_BF16 ? 0 : 4;
        size_t state = ns * ((in_place & QT_OFF_MASTER ? 0 : master) + (in_place & QT_OFF_M ? 0 : es_m) +
                             (in_place & QT_OFF_V ? 0 : es_v));
        if (live && (sp.weights_host || sp.weights_shard_host)) bf16 = 0; /* offloaded weights (a ZeRO-3 rank's pieces): in place too */
        /* sharded, the writer reads the ranks' pieces where they are (engine_dp.c: gathered items) */
        qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "checkpoint snapshot", (sharded ? n : 1) * (bf16 + state));
    }
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "weight init buffer (fp32)", n * qt_weight_src_chunk(L) * 4);
    if (n > 1) { /* engine_dp.c's comm: staging on every GPU, the host kinds' pinned arena */
        size_t dev, pin;
        qt_comm_plan_bytes(n, (qt_comm_kind)cfg->parallel.comm, &dev, &pin);
        qt_mem_plan_add(&rp->mem, QT_MEM_DEVICE, "comm buffers", dev);
        qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "comm host arena", pin);
    }
    return 0;
}

int qt_plan_run(const qt_layout *L, const qt_config *cfg, int gpus, int training, qt_run_plan *rp, char *err,
                size_t errlen) {
    memset(rp, 0, sizeof *rp);
    rp->training = training;
    if (count_ranks(cfg, gpus, rp, err, errlen)) return -1;
    qt_mem_plan_begin(&rp->mem, NULL);
    int B = cfg->data.micro_batch, T = cfg->data.seq_len;
    if (rp->ranks == 0) { /* engine_cpu.c: w, g, m, v and the model's activations */
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "weights, gradients, m, v (fp32)", 4 * L->numel * sizeof(float));
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "activations (CPU)", qt_cpu_model_bytes(L, B, T));
        if (training) /* train_ckpt.c's snapshot of weights, m, v at a save (64-byte aligned each) */
            qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "checkpoint snapshot", 3 * ((L->numel * 4 + 63) / 64 * 64));
    } else if (gpu_rows(L, cfg, rp, err, errlen)) {
        return -1;
    }
    if (training) { /* train.c: a step's inputs and targets, [grad_accum][ranks][B * T] */
        size_t ntok = (size_t)B * T * (rp->ranks ? rp->ranks : 1) * cfg->data.grad_accum;
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "step tokens", 2 * ntok * sizeof(int32_t));
    }
    rp->gpu_bytes = rp->ranks ? rp->ranks_per_gpu * qt_mem_plan_device_total(&rp->mem) : 0;
    rp->host_bytes = qt_mem_plan_host_total(&rp->mem);
    return 0;
}

size_t qt_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

size_t qt_plan_host_limit(const qt_config *cfg, char *what, size_t cap) {
    if (cfg->memory.host_limit_gib > 0) {
        snprintf(what, cap, "memory.host_limit_gib = %g", cfg->memory.host_limit_gib);
        return qt_mem_gib(cfg->memory.host_limit_gib);
    }
    snprintf(what, cap, "MemAvailable (/proc/meminfo; memory.host_limit_gib overrides it)");
    return qt_host_mem_available();
}

int qt_plan_check(const qt_run_plan *rp, size_t gpu_limit, const char *gpu_what, size_t host_limit,
                  const char *host_what, char *err, size_t errlen) {
    if (gpu_limit && rp->ranks && rp->gpu_bytes > gpu_limit) {
        qt_mem_plan per_gpu = rp->mem; /* the rows of the ranks sharing one GPU */
        for (int i = 0; i < per_gpu.n; i++) per_gpu.row[i].bytes *= (size_t)rp->ranks_per_gpu;
        return qt_mem_plan_check(&per_gpu, 0, gpu_limit, gpu_what, err, errlen);
    }
    if (host_limit && qt_mem_plan_check(&rp->mem, 1, host_limit, host_what, err, errlen)) return -1;
    return 0;
}

void qt_plan_print(const qt_run_plan *rp) {
    if (rp->ranks)
        printf("  device rows are one rank's; %d rank(s), %d on the busiest GPU: %.1f MiB per GPU\n", rp->ranks,
               rp->ranks_per_gpu, rp->gpu_bytes / 1048576.0);
    else
        printf("  the CPU engine: host rows only\n");
    qt_mem_plan_print(&rp->mem);
}

int qt_plan_report(const qt_config *cfg, const qt_probe *pr, double gpu_gib, double host_gib, char *err, size_t errlen) {
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    if (qt_model_layout(cfg, &L, &src, err, errlen)) return -1;
    int rc = qt_plan_run(&L, cfg, -1, 1, &rp, err, errlen);
    if (rc) {
        qt_layout_free(&L);
        return -1;
    }
    double g = gpu_gib > 0 ? gpu_gib : cfg->memory.gpu_limit_gib, h = host_gib > 0 ? host_gib : cfg->memory.host_limit_gib;
    char gw[64], hw[64];
    snprintf(gw, sizeof gw, "%s %g", gpu_gib > 0 ? "--gpu-mem" : "memory.gpu_limit_gib =", g);
    snprintf(hw, sizeof hw, "%s %g", host_gib > 0 ? "--host-mem" : "memory.host_limit_gib =", h);
    printf("qtrain --plan %s: %zu parameters, micro-batch %d x %d, grad_accum %d, %s\n", cfg->path, L.n_params,
           cfg->data.micro_batch, cfg->data.seq_len, cfg->data.grad_accum,
           rp.ranks ? "GPU" : "CPU engine (device: cpu)");
    qt_plan_print(&rp);
    char e2[1024];
    int gpu_no = qt_plan_check(&rp, qt_mem_gib(g), gw, 0, "", err, errlen) != 0;
    int host_no = qt_plan_check(&rp, 0, "", qt_mem_gib(h), hw, gpu_no ? e2 : err, gpu_no ? sizeof e2 : errlen) != 0;
    printf("  %-30s %10.1f MiB  %s: %s\n", "GPU per device", rp.gpu_bytes / 1048576.0, g > 0 ? gw : "no limit given",
           !rp.ranks ? "no GPU used" : gpu_no ? "does not fit" : "fits");
    printf("  %-30s %10.1f MiB  %s: %s\n", "host", rp.host_bytes / 1048576.0, h > 0 ? hw : "no limit given",
           host_no ? "does not fit" : "fits");
    if (rp.ranks) { /* the cost model's step (memory.plan: auto ranks plans by it) */
        qt_plan_cost k = qt_plan_auto_cost_parts(&L, cfg, pr);
        double t = qt_plan_auto_cost(&L, cfg, pr), tok = (double)cfg->data.micro_batch * cfg->data.seq_len * cfg->data.grad_accum;
        printf("  predicted on %s: %.0f tokens/s, %.2f s per step: compute %.2f s; beside it %.1f GB over PCIe (%.2f s); "
               "serial %.1f GB (%.2f s with the rest)\n", pr->gpu, tok * rp.ranks / t, t, k.compute, k.pcie_micro_bytes * 1e-9,
               k.pcie_micro, k.pcie_once_bytes * 1e-9, k.once);
    }
    rc = gpu_no || host_no;
    qt_layout_free(&L);
    return rc;
}
