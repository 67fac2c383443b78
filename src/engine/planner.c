/* planner.c — the memory plan of a whole run before anything is allocated (qt_planner.h). */
#include "qt_planner.h"

#include <stdio.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_cpu_model.h"
#include "qt_device.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_lora.h"
#include "qt_partition.h"
#include "qt_weight_src.h"

/* The ranks engine_create (setup.c) starts, and how many share the busiest GPU: 0, or -1 with err. */
static int count_ranks(const qt_config *cfg, int gpus, qt_run_plan *rp, char *err, size_t errlen) {
    rp->ranks_per_gpu = 1;
    rp->ranks = 0;
    if (cfg->device == QT_DEVICE_CPU || (gpus == 0 && cfg->device != QT_DEVICE_CUDA)) return 0;
    int devs[QT_COMM_MAX_RANKS];
    rp->ranks = qt_plan_rank_devices(cfg, gpus, devs, err, errlen);
    if (rp->ranks < 0) return -1;
    for (int i = 0; i < rp->ranks; i++) {
        int k = 0;
        for (int j = 0; j < rp->ranks; j++) k += devs[j] == devs[i];
        if (k > rp->ranks_per_gpu) rp->ranks_per_gpu = k;
    }
    return 0;
}

/* engine_gpu_lora.c's host rows, every rank's: the base's load buffer and, training, the adapters, m and v (and the
 * trained base tensors') copied at a save (and with ranks the gradients' sum and one rank's). */
static int gpu_lora_host_rows(const qt_layout *L, const qt_plan *p, qt_run_plan *rp, char *err, size_t errlen) {
    qt_lora_layout A;
    if (qt_lora_layout_init(&A, &p->lora, &L->cfg, err, errlen)) return -1;
    size_t an = A.numel, n = (size_t)rp->ranks;
    qt_lora_layout_free(&A);
    for (int i = 0; i < L->n_tensors; i++) /* lora.trainable's base tensors: saved beside the adapters */
        an += qt_lora_trains(&L->tensors[i], p->lora.trainable) ? L->tensors[i].numel : 0;
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "weight init buffer (fp32)", n * qt_weight_src_chunk(L) * 4);
    if (rp->training) qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "checkpoint snapshot", n * 3 * an * sizeof(float));
    if (n > 1) qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "LoRA gradient sum (fp32)", 2 * an * sizeof(float));
    return 0;
}

/* Rank 0's device rows (the same code as qt_gpu_model_create) and the pinned rows that come with them,
 * times the ranks. */
static int gpu_rows_of(const qt_layout *L, const qt_plan *p, qt_run_plan *rp, char *err, size_t errlen) {
    int n = rp->ranks, sharded = p->parallel.split.state;
    qt_shard sh;
    int nodes = p->parallel.world_pieces ? p->parallel.nodes : 1; /* ZeRO over the world: a rank's pieces are the world's */
    qt_shard_init_nodes(&sh, L, sharded ? n : 1, 0, p->parallel.buckets, nodes, 0);
    qt_mem_plan one;
    if (qt_gpu_model_plan(L, p, &sh, &one, err, errlen)) return -1;
    for (int i = 0; i < one.n; i++) { /* device rows: one rank's; host rows: every rank's, but LoRA's pinned base */
        const qt_mem_row *r = &one.row[i];
        int host = r->where == QT_MEM_PINNED || r->where == QT_MEM_PAGEABLE;
        int shared = p->lora.rank > 0 && r->where == QT_MEM_PINNED; /* a streamed frozen base: one copy (base_stream.c) */
        qt_mem_plan_add(&rp->mem, r->where, r->kind, host && !shared ? r->bytes * n : r->bytes);
    }
    rp->mem.off = one.off;
    if (p->lora.rank > 0) return gpu_lora_host_rows(L, p, rp, err, errlen);
    size_t N = (size_t)p->run.B * p->run.T, numel = L->numel, ns = sh.len;
    size_t bf16 = (p->parallel.split.weights ? ns : numel) * 2; /* a rank's bf16 weights: ZeRO-3 its pieces */
    size_t es_m = qt_dtype_size(p->precision.m_dt), es_v = qt_dtype_size(p->precision.v_dt);
    /* engine_gpu.c: two pinned token buffers [tok | tgt] and the one read per step */
    qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "token staging", n * (2 * 2 * N * sizeof(int32_t) + 16));
    if (rp->training) { /* engine_gpu.c's state_items, made at training start: the bf16 weights, and an fp32
                         * master, m, v unless an offloaded state of one GPU or ZeRO ranks is written in place (live_state, with the
                         * weights too when they are offloaded; an explicit checkpoint.offloaded: copy copies
                         * them). A bf16 master has no fp32 copy: its
                         * "weights" is the bf16 weights widened as they are written. Replicated, only rank 0's
                         * (engine_dp.c); sharded, every rank's. */
        qt_plan_ckpt_live lv = {0}; /* the offloaded arrays, written where they are */
        if (p->memory.ckpt_offloaded != QT_CKPT_OFFLOAD_COPY) lv = qt_plan_ckpt_in_place(p);
        size_t master = p->precision.master_dt == QT_DT_BF16 ? 0 : 4;
        size_t state = ns * ((lv.master ? 0 : master) + (lv.m ? 0 : es_m) + (lv.v ? 0 : es_v));
        if (lv.weights) bf16 = 0; /* offloaded weights (a ZeRO-3 rank's pieces): in place too */
        /* sharded, the writer reads the ranks' pieces where they are (engine_dp.c: gathered items) */
        if (nodes > 1) { /* the world pieces gathered from where they live into node 0's host memory, the local
                          * pieces of its ranks for every node (engine_dp.c's node exchange); the whole bf16 weights
                          * pinned below ZeRO-3 */
            qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "checkpoint snapshot", n * (size_t)nodes *
                            ((p->parallel.split.weights ? ns * 2 : 0) + state));
            bf16 = p->parallel.split.weights ? 0 : bf16, state = 0;
        }
        qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "checkpoint snapshot", (sharded ? n : 1) * (bf16 + state));
    }
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "weight init buffer (fp32)", n * qt_weight_src_chunk(L) * 4);
    if (n > 1) { /* engine_dp.c's comm: staging on every GPU, the host kinds' pinned arena */
        size_t dev, pin;
        qt_comm_plan_bytes(n, (qt_comm_kind)p->parallel.comm, &dev, &pin);
        qt_mem_plan_add(&rp->mem, QT_MEM_DEVICE, "comm buffers", dev);
        qt_mem_plan_add(&rp->mem, QT_MEM_PINNED, "comm host arena", pin);
    }
    return 0;
}

/* gpu_rows on L, or for a plan of other ranks than L was built for (--plan without the GPUs, a candidate of
 * memory.plan: auto) on the layout of the plan's unit alignment. */
static int gpu_rows(const qt_layout *L, const qt_plan *p, qt_run_plan *rp, char *err, size_t errlen) {
    if (L->unit_align % qt_plan_unit_align(p) == 0) return gpu_rows_of(L, p, rp, err, errlen);
    qt_layout padded;
    if (qt_layout_init_units(&padded, &L->cfg, qt_plan_unit_align(p), err, errlen)) return -1;
    int rc = gpu_rows_of(&padded, p, rp, err, errlen);
    qt_layout_free(&padded);
    return rc;
}

/* engine_cpu_lora.c: the frozen base, the adapters with their gradients and moments (and those of the base tensors
 * that train), the model's activations and
 * the adapters' kept inputs [N, r] per module; a checkpoint snapshots the adapters, m and v. */
static int cpu_lora_rows(const qt_layout *L, const qt_config *cfg, qt_run_plan *rp, char *err, size_t errlen) {
    qt_lora_layout A;
    if (qt_lora_layout_init(&A, &cfg->lora, &L->cfg, err, errlen)) return -1;
    int B = cfg->data.micro_batch, T = cfg->data.seq_len;
    size_t mods = (size_t)A.n_layers * A.per_layer, an = A.numel;
    qt_lora_layout_free(&A);
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "base weights (fp32, frozen)", L->numel * sizeof(float));
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "adapters, grads, m, v (fp32)", 4 * an * sizeof(float));
    size_t xn = 0; /* lora.trainable's base tensors: their gradients and moments (+ a packed copy at a save) */
    for (int i = 0; i < L->n_tensors; i++) xn += qt_lora_trains(&L->tensors[i], cfg->lora.trainable) ? L->tensors[i].numel : 0;
    if (xn) qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "trained base: grads, m, v", 6 * xn * sizeof(float));
    qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "activations (CPU)",
                    qt_cpu_model_bytes(L, B, T) + mods * B * T * cfg->lora.rank * sizeof(float));
    if (rp->training) qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "checkpoint snapshot", 3 * ((an * 4 + 63) / 64 * 64));
    return 0;
}

int qt_plan_run(const qt_layout *L, const qt_config *cfg, int gpus, int training, qt_run_plan *rp, char *err,
                size_t errlen) {
    memset(rp, 0, sizeof *rp);
    rp->training = training;
    if (count_ranks(cfg, gpus, rp, err, errlen)) return -1;
    qt_mem_plan_begin(&rp->mem, NULL);
    int B = cfg->data.micro_batch, T = cfg->data.seq_len;
    if (rp->ranks == 0 && cfg->lora.rank > 0) {
        if (cpu_lora_rows(L, cfg, rp, err, errlen)) return -1;
    } else if (rp->ranks == 0) { /* engine_cpu.c: w, g, m, v and the model's activations */
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "weights, gradients, m, v (fp32)", 4 * L->numel * sizeof(float));
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "activations (CPU)", qt_cpu_model_bytes(L, B, T));
        if (training) /* train_ckpt.c's snapshot of weights, m, v at a save (64-byte aligned each) */
            qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "checkpoint snapshot", 3 * ((L->numel * 4 + 63) / 64 * 64));
    } else {
        int dp = cfg->lora.rank <= 0 && (rp->ranks > 1 || cfg->parallel.nodes > 1); /* LoRA's ranks: one GPU's plan */
        qt_plan_make(cfg, L, dp ? rp->ranks : 0, &rp->plan); /* as setup.c */
        if (gpu_rows(L, &rp->plan, rp, err, errlen)) return -1;
    }
    if (training) { /* train.c: a step's inputs and targets, [grad_accum][ranks][B * T] */
        size_t ntok = (size_t)B * T * (rp->ranks ? rp->ranks : 1) * cfg->data.grad_accum;
        qt_mem_plan_add(&rp->mem, QT_MEM_PAGEABLE, "step tokens", 2 * ntok * sizeof(int32_t));
    }
    rp->gpu_bytes = rp->ranks ? rp->ranks_per_gpu * qt_mem_plan_device_total(&rp->mem) : 0;
    rp->host_bytes = qt_mem_plan_host_total(&rp->mem);
    return 0;
}

int qt_plan_auto_wanted(const qt_config *cfg) {
    return cfg->memory.plan && (cfg->device == QT_DEVICE_CUDA || (cfg->device == QT_DEVICE_AUTO && qt_cuda_device_count() > 0));
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
