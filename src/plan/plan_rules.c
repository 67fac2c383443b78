/* plan_rules.c — the cross-mode rules of the precision / memory / parallel / perf keys (qt_plan.h). */
#include <stdio.h>

#include "qt_config.h"
#include "qt_plan.h"

/* What memory.offload: [weights] cannot run with (one GPU or ZeRO-3, no CUDA graphs, no persistent fp8
 * weight cache; with LoRA any rank count: the frozen base is streamed to every rank from one host copy) and
 * [gradients] (one GPU, fp32 or bf16, or ZeRO-2/3, fp32), NULL when nothing: *key names the
 * key to blame. Called below ZeRO-3 only (qt_plan_refusal): ZeRO-3 takes both offloads, its own refusals
 * covering the weights'. */
static const char *weights_refusal(const qt_config *c, const char **key) {
    int ranks = c->parallel.gpus > 1 || c->parallel.devices.n > 1;
    if (c->memory.offload & QT_OFF_GRADIENTS) {
        if (ranks && c->parallel.zero < 2) {
            *key = c->parallel.devices.n > 1 ? "parallel.devices" : "parallel.gpus";
            return "expected one GPU (parallel.gpus: 1) or parallel.zero: 2 or 3 with memory.offload: [gradients]: "
                   "with several ranks the offloaded gradients are the rank's ZeRO-2 shard";
        }
    }
    if (!(c->memory.offload & QT_OFF_WEIGHTS)) return NULL;
    if (c->lora.rank <= 0 && (c->parallel.zero == 2 || ranks)) { /* LoRA's ranks share one streamed frozen base */
        *key = c->parallel.zero == 2 ? "parallel.zero" : c->parallel.devices.n > 1 ? "parallel.devices" : "parallel.gpus";
        return "expected one GPU (parallel.gpus: 1, parallel.zero 0 or 1) or parallel.zero: 3 with memory.offload: "
               "[weights]: with several ranks the offloaded bf16 weights are the rank's ZeRO-3 pieces";
    }
    if (c->perf.cuda_graphs) {
        *key = "perf.cuda_graphs";
        return "expected false with memory.offload: [weights], got \"true\": the weights come up into weight slots "
               "picked as each micro-step runs, which a captured graph would replay stale; set perf.cuda_graphs: false";
    }
    if (c->precision.matmul_dtype == QT_DT_E4M3 && c->memory.fp8_weight_cache != QT_FP8_WCACHE_NONE) {
        *key = "memory.fp8_weight_cache";
        return "expected none with memory.offload: [weights] and precision.matmul_dtype: e4m3, got \"all\": the GPU "
               "holds no layer's bf16 weights outside its weight slot, so each layer is quantized from its slot at use "
               "(the same bits); give none, or leave the key out";
    }
    return NULL;
}

/* The rules a config leaves to the planner wait for it only where the config names memory.plan: auto: the
 * default auto plans GPU runs alone, and the loader cannot tell a GPU run from a CPU one. */
static int names_auto(const qt_config *c) { return c->memory.plan && qt_config_given(c, "memory.plan"); }

/* The rules needing no rank count; parallel.zero: 3 (or memory.offload: [weights]) last. */
const char *qt_plan_refusal(const qt_config *c, const char **key) {
    if ((c->memory.offload & QT_OFF_OPTIMIZER) == QT_OFF_MASTER && c->precision.master_dtype == QT_DT_BF16) {
        *key = "memory.offload";
        return "expected m or v beside master with precision.master_dtype: bf16 (a bf16 master has no master "
               "array to offload: the bf16 weights are the master), got only master";
    }
    if (c->memory.zero_copy && !(c->memory.offload & QT_OFF_OPTIMIZER) && !names_auto(c)) {
        *key = "memory.zero_copy";
        return "expected false without an offloaded optimizer state (memory.offload_optimizer, or master, m, v in "
               "memory.offload): zero copy is how AdamW reads the offloaded state, got true";
    }
    int zero_free = names_auto(c) && !qt_config_given(c, "parallel.zero"); /* memory.plan: auto picks it */
    if (c->memory.offload & QT_OFF_QUANTS) {
        *key = "memory.offload";
        if (!(c->memory.offload & QT_OFF_WEIGHTS))
            return "expected weights with quants: the fp8 codes that live in host memory are those of the offloaded "
                   "weights (with the weights on the GPU, memory.fp8_weight_cache: none keeps two layers' quants only)";
        if (c->precision.matmul_dtype != QT_DT_E4M3 || c->precision.grad_dtype == QT_DT_BF16)
            return "expected precision.matmul_dtype: e4m3 and grad_dtype e4m3 or e5m2 with quants: the layers' e4m3 codes "
                   "replace their bf16 weights on the GPU, which a bf16 matmul or backward would need";
        if (c->parallel.gather_dtype != QT_DT_E4M3 && qt_config_given(c, "parallel.gather_dtype")) {
            *key = "parallel.gather_dtype";
            return "expected e4m3 (or the key left out) with memory.offload: [weights, quants], got \"bf16\": with ZeRO-3 "
                   "the quants offloaded are the rank's e4m3 pieces, gathered as codes";
        }
    }
    if (c->parallel.gather_dtype == QT_DT_E4M3 && ((c->parallel.zero < 3 && !zero_free) || c->precision.matmul_dtype != QT_DT_E4M3)) {
        *key = "parallel.gather_dtype";
        return "expected bf16 unless parallel.zero: 3 with precision.matmul_dtype: e4m3, got \"e4m3\": the e4m3 gathers "
               "move ZeRO-3's fp8 weight codes";
    }
    if (c->parallel.gather_dtype == QT_DT_E4M3 && c->precision.grad_dtype == QT_DT_BF16) {
        *key = "parallel.gather_dtype";
        return "expected bf16 with parallel.zero: 3 and precision.grad_dtype: bf16, got \"e4m3\": a bf16 backward multiplies by the bf16 "
               "weights, which e4m3 gathers do not bring (give grad_dtype e4m3 or e5m2)";
    }
    if (c->parallel.zero < 3) return weights_refusal(c, key);
    if (c->perf.cuda_graphs) {
        *key = "perf.cuda_graphs";
        return "expected false with parallel.zero: 3, got \"true\": ZeRO-3 picks its weight slots and gathers as each "
               "micro-step runs, which a captured graph would replay stale; set perf.cuda_graphs: false (or parallel.zero: 2)";
    }
    if (c->precision.matmul_dtype == QT_DT_E4M3 && c->memory.fp8_weight_cache != QT_FP8_WCACHE_NONE) {
        *key = "memory.fp8_weight_cache";
        return "expected none with parallel.zero: 3 and precision.matmul_dtype: e4m3, got \"all\": no rank holds every "
               "layer's bf16 weights to quantize them once per step, so each layer is quantized from its gathered weight "
               "slot at use (the same bits); give none, or leave the key out";
    }
    return NULL;
}

int qt_config_zero3_check(const qt_config *c, char *err, size_t errlen) {
    const char *key = NULL, *why = qt_plan_refusal(c, &key);
    if (!why) return 0;
    snprintf(err, errlen, "%s: %s: %s", c->path, key, why);
    return -1;
}

int qt_config_offload_quants(const qt_config *c) {
    return (c->memory.offload & (QT_OFF_QUANTS | QT_OFF_WEIGHTS)) == (QT_OFF_QUANTS | QT_OFF_WEIGHTS);
}

int qt_config_opt_offload_mask(const qt_config *c) { return c->memory.offload & QT_OFF_OPTIMIZER; }

/* ZeRO-3 with fp8 matmuls quantizes each layer from its weight slot at use: the weight cache none path, taken
 * when the config does not say otherwise (offloaded weights: the same). */
void qt_plan_fp8_cache_default(qt_config *c) {
    int wslots = c->parallel.zero >= 3 || (c->memory.offload & QT_OFF_WEIGHTS);
    if (wslots && c->precision.matmul_dtype == QT_DT_E4M3 && !qt_config_given(c, "memory.fp8_weight_cache"))
        c->memory.fp8_weight_cache = QT_FP8_WCACHE_NONE;
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

const char *qt_plan_rows_refusal(const qt_plan *p) {
    if (p->weights.slots) return "parallel.zero 3 and memory.offload: [weights] (their weight slots)";
    if (p->grads.sharded) return "parallel.zero 2 (sharded gradients)";
    if (p->grads.host_one) return "memory.offload: [gradients]";
    return NULL;
}

qt_plan_ckpt_live qt_plan_ckpt_in_place(const qt_plan *p) {
    /* replicated ranks copy rank 0's; across nodes node 0 writes every node's pieces, gathered into copies */
    if (!p->optimizer.host || p->parallel.dp == QT_DP_REPLICATED || p->parallel.world_pieces) return (qt_plan_ckpt_live){0};
    int mask = p->optimizer.mask ? p->optimizer.mask : QT_OFF_OPTIMIZER; /* as the store's placement (place_opt.c) */
    return (qt_plan_ckpt_live){.master = (mask & QT_OFF_MASTER) != 0, .weights = p->weights.host,
                               .m = (mask & QT_OFF_M) != 0, .v = (mask & QT_OFF_V) != 0};
}
