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
    if (n == 1 && plan.lora.rank > 0) return qt_engine_gpu_lora_create(L, &plan, src, devs[0], err, errlen);
    if (n == 1 && !across) return qt_engine_gpu_create(L, &plan, src, devs[0], NULL, err, errlen);
    return qt_engine_dp_nodes_create(L, &plan, src, n, devs, nodes, err, errlen);
}

/* LoRA on the GPU runs a bf16 or NF4 base resident on each GPU with fp32 adapters (engine_gpu_lora.c: one GPU, or
 * ranks with the adapters replicated, whatever parallel.zero's default), or streamed from one pinned host copy
 * to each rank's GPU (memory.offload: [weights]), lora.trainable's base tensors (not with dpo), objective: dpo included, fp8 matmuls with the base's data gradient in bf16 or
 * in fp8 (precision.grad_dtype); what else it would need is refused here, naming the key (device: cpu trains every
 * LoRA setting on the CPU fp32 engine). */
const char *qt_engine_gpu_refusal(const qt_config *cfg) {
    /* full fine-tuning's DPO splits a micro-step around the host's DPO arithmetic (qt_dp_sync_forward_rows) */
    if (cfg->objective == QT_OBJ_DPO && cfg->lora.rank <= 0 && cfg->parallel.zero >= 2)
        return "objective: dpo with full fine-tuning on the GPU: parallel.zero 2 and 3 are not yet supported (set 0 or 1)";
    if (cfg->objective == QT_OBJ_DPO && cfg->lora.rank <= 0 && (cfg->memory.offload & (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS)))
        return "objective: dpo with full fine-tuning on the GPU: memory.offload of weights or gradients is not yet "
               "supported (the optimizer state may be offloaded)";
    if (cfg->parallel.nodes > 1 && cfg->objective == QT_OBJ_DPO)
        return "objective: dpo trains on one machine (its rows' losses are summed inside a node): set parallel.nodes 1";
    if (cfg->lora.rank <= 0) return NULL;
    if (cfg->lora.trainable && cfg->objective == QT_OBJ_DPO) /* the reference is the base with the adapters off */
        return "lora.trainable with objective: dpo on the GPU: the reference model is the frozen base, which trained "
               "base tensors would change; train the adapters only (or device: cpu)";
    if (cfg->lora.base_nf4 && cfg->precision.matmul_dtype != QT_DT_BF16) /* the fp8 weights are made from a bf16 base */
        return "lora.base_dtype: nf4 feeds the block matmuls bf16 weights dequantized per layer: set "
               "precision.matmul_dtype bf16";
    if (cfg->parallel.zero >= 2) /* zero 0 or 1 (the default): the adapters' AdamW state is replicated (it is small) */
        return "parallel.zero: LoRA's data parallel replicates the adapters and the base (ZeRO-2/3 is not yet there): "
               "set 0 or 1";
    if (cfg->parallel.nodes > 1) return "parallel.nodes: LoRA on the GPU trains on one machine: set 1";
    int off = cfg->memory.offload;
    if ((off & QT_OFF_WEIGHTS) && cfg->precision.matmul_dtype != QT_DT_BF16) /* the fp8 weights are made from a resident base */
        return "precision.matmul_dtype: LoRA over a base streamed from host memory (memory.offload: [weights]) feeds "
               "the block matmuls the bf16 weights of its layer slots: set bf16";
    if ((off & ~QT_OFF_WEIGHTS) || cfg->memory.offload_optimizer || cfg->memory.offload_residual)
        return off & QT_OFF_RESIDUAL || cfg->memory.offload_residual
                   ? "memory.offload: [residual] with LoRA on the GPU is not yet supported (the activations stay on the "
                     "GPU; [weights] streams the frozen base from host memory)"
                   : off & (QT_OFF_GRADIENTS | QT_OFF_QUANTS)
                   ? "memory.offload: [gradients] and [quants] name full fine-tuning's arrays: LoRA's frozen base has "
                     "none (only [weights] streams the base from host memory)"
                   : "memory.offload: [optimizer] with LoRA on the GPU is not yet supported (the adapters' AdamW "
                     "state is small and stays on the GPU; [weights] streams the frozen base from host memory)";
    return NULL;
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
