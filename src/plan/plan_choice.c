/* plan_choice.c — memory.plan: auto's candidate plan: applied to a config, described, printed (qt_plan_auto.h). */
#include <stdio.h>

#include "qt_config.h"
#include "qt_plan.h"
#include "qt_plan_auto.h"

#define OFF_WGQ (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS | QT_OFF_QUANTS) /* the offload items the plan chooses */

void qt_plan_auto_apply(qt_config *cfg, const qt_plan_choice *c) {
    cfg->data.micro_batch = c->micro_batch;
    cfg->data.grad_accum = c->grad_accum;
    cfg->memory.recompute = c->recompute;
    cfg->memory.lmhead_chunks = c->lmhead_chunks;
    cfg->memory.attn_bwd_chunks = c->attn_bwd_chunks;
    cfg->memory.fp8_weight_cache = c->fp8_weight_cache;
    cfg->precision.master_dtype = c->master_dtype;
    cfg->precision.grad_accum_dtype = c->grad_accum_dtype;
    qt_config_set_zero(cfg, c->zero);
    cfg->memory.offload = (cfg->memory.offload & ~OFF_WGQ) | c->offload_bits;
    cfg->perf.cuda_graphs = c->cuda_graphs;
    qt_config_set_offload(cfg, QT_OFF_OPTIMIZER, c->offload_optimizer);
    qt_config_set_offload(cfg, QT_OFF_RESIDUAL, c->offload_residual);
}

int qt_plan_auto_lossy_worth(const qt_plan_choice *chosen, const qt_plan_choice *lossy) {
    return lossy->tokens_per_s > QT_PLAN_LOSSY_HINT * chosen->tokens_per_s;
}

/* ", weights and gradients offloaded" (quants: "weights (as e4m3)"), "" for none (a static buffer). */
static const char *offload_text(const qt_plan_choice *c) {
    static char buf[64];
    int w = c->offload_bits & QT_OFF_WEIGHTS, g = c->offload_bits & QT_OFF_GRADIENTS;
    if (!w && !g) return "";
    snprintf(buf, sizeof buf, ", %s%s%s offloaded", !w ? "" : c->offload_bits & QT_OFF_QUANTS ? "weights (as e4m3)" : "weights",
             w && g ? " and " : "", g ? "gradients" : "");
    return buf;
}

const char *qt_plan_auto_describe(const qt_plan_choice *c) {
    static char buf[256];
    char rc[64];
    snprintf(buf, sizeof buf, "micro_batch %d x grad_accum %d, recompute [%s]%s", c->micro_batch, c->grad_accum,
             qt_act_recompute_names(qt_act_recompute_resolve(c->recompute), rc, sizeof rc), offload_text(c));
    return buf;
}

void qt_plan_auto_print_choice(const char *tag, const qt_plan_choice *c, const qt_config *cfg) {
    char rc[64];
    printf("  %-6s micro_batch %2d x grad_accum %3d, recompute [%s], offload_optimizer %s, offload_residual %s, "
           "fp8_weight_cache %s, lmhead_chunks %2d, attn_bwd_chunks %d, zero %d, cuda_graphs %s%s: %.2f GiB GPU, %.1f GiB host, "
           "%.0f tokens/s predicted\n",
           tag, c->micro_batch, c->grad_accum, qt_act_recompute_names(qt_act_recompute_resolve(c->recompute), rc, sizeof rc),
           c->offload_optimizer ? "true" : "false", c->offload_residual ? "true" : "false",
           c->fp8_weight_cache == QT_FP8_WCACHE_NONE ? "none" : "all", c->lmhead_chunks, c->attn_bwd_chunks, c->zero,
           c->cuda_graphs ? "true" : "false", offload_text(c),
           c->gpu_bytes / 1073741824.0, c->host_bytes / 1073741824.0, c->tokens_per_s);
    int chose = (c->master_dtype == QT_DT_BF16 && !qt_config_given(cfg, "precision.master_dtype")) ||
                (c->grad_accum_dtype == QT_DT_BF16 && !qt_config_given(cfg, "precision.grad_accum_dtype"));
    if (chose) /* auto changed the numerics: say so where it cannot be missed */
        printf("         NOTE: precision.master_dtype %s, precision.grad_accum_dtype %s: no plan with fp32 master "
               "weights and gradients fits (give these keys as fp32 to refuse)\n", c->master_dtype == QT_DT_BF16 ? "bf16" : "fp32",
               c->grad_accum_dtype == QT_DT_BF16 ? "bf16" : "fp32");
}
