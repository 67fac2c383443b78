/* plan_axes.c — memory.plan: auto's axes: the config keys its search may choose, their candidate values and the
 * combinations the plan refuses (qt_plan_auto.h). */
#include <string.h>

#include "qt_config.h"
#include "qt_error.h"
#include "qt_plan.h"
#include "qt_plan_auto.h"

typedef struct {
    const char *key;                          /* a constraint when the config gives it */
    int n, v[8];                              /* candidate values (micro_batch: filled per config) */
    int (*get)(const qt_config *c);
    void (*set)(qt_config *c, int v, int seqs); /* seqs: sequences per optimizer step per rank */
} plan_axis;

static int get_mb(const qt_config *c) { return c->data.micro_batch; }
static void set_mb(qt_config *c, int v, int seqs) { c->data.micro_batch = v, c->data.grad_accum = seqs / v; }
static int get_rc(const qt_config *c) { return c->memory.recompute; }
static void set_rc(qt_config *c, int v, int seqs) { (void)seqs, c->memory.recompute = v; }
static int get_off(const qt_config *c) { return (c->memory.offload & QT_OFF_OPTIMIZER) != 0; }
static void set_off(qt_config *c, int v, int seqs) { (void)seqs, qt_config_set_offload(c, QT_OFF_OPTIMIZER, v); }
static int get_lm(const qt_config *c) { return c->memory.lmhead_chunks; }
static void set_lm(qt_config *c, int v, int seqs) { (void)seqs, c->memory.lmhead_chunks = v; }
static int get_att(const qt_config *c) { return c->memory.attn_bwd_chunks; }
static void set_att(qt_config *c, int v, int seqs) { (void)seqs, c->memory.attn_bwd_chunks = v; }
static int get_ores(const qt_config *c) { return (c->memory.offload & QT_OFF_RESIDUAL) != 0; }
static void set_ores(qt_config *c, int v, int seqs) { (void)seqs, qt_config_set_offload(c, QT_OFF_RESIDUAL, v); }
static int get_wc(const qt_config *c) { return c->memory.fp8_weight_cache; }
static void set_wc(qt_config *c, int v, int seqs) { (void)seqs, c->memory.fp8_weight_cache = v; }
static int get_mdt(const qt_config *c) { return c->precision.master_dtype; }
static void set_mdt(qt_config *c, int v, int seqs) { (void)seqs, c->precision.master_dtype = v; }
static int get_gdt(const qt_config *c) { return c->precision.grad_accum_dtype; }
static void set_gdt(qt_config *c, int v, int seqs) { (void)seqs, c->precision.grad_accum_dtype = v; }
#define OFF_WG (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS)
#define OFF_WGQ (OFF_WG | QT_OFF_QUANTS)
static int get_offw(const qt_config *c) { return c->memory.offload & OFF_WGQ; }
static void set_offw(qt_config *c, int v, int seqs) { (void)seqs, c->memory.offload = (c->memory.offload & ~OFF_WGQ) | v; }
static int get_cg(const qt_config *c) { return c->perf.cuda_graphs; }
static void set_cg(qt_config *c, int v, int seqs) { (void)seqs, c->perf.cuda_graphs = v; }
static int get_zero(const qt_config *c) { return c->parallel.zero; }
static void set_zero(qt_config *c, int v, int seqs) { (void)seqs, qt_config_set_zero(c, v); }

/* Each axis lists its values in order of preference at equal predicted speed (the plainest first): a
 * tie keeps the earlier candidate. fp8_weight_cache is an axis only with fp8 matmuls, parallel.zero only
 * with several ranks (qt_plan_axes_init narrows them). */
enum { AX_MB, AX_RC, AX_OFF, AX_LM, AX_ATT, AX_ORES, AX_WC, AX_MDT, AX_GDT, AX_ZERO, AX_OFFW, AX_CG, AX_N };
_Static_assert(AX_N == QT_PLAN_AXES, "qt_plan_axes holds one row per axis");
static const plan_axis AXES[AX_N] = {
    {"data.micro_batch", 0, {0}, get_mb, set_mb},
    {"memory.recompute", 4, {0, QT_RC_SWIGLU | QT_RC_NORM, QT_RC_FFN | QT_RC_NORM, QT_RC_BLOCK}, get_rc, set_rc},
    {"memory.offload_optimizer", 2, {0, 1}, get_off, set_off},
    {"memory.lmhead_chunks", 5, {1, 2, 4, 8, 16}, get_lm, set_lm},
    {"memory.attn_bwd_chunks", 3, {1, 2, 4}, get_att, set_att},
    {"memory.offload_residual", 2, {0, 1}, get_ores, set_ores},
    {"memory.fp8_weight_cache", 2, {QT_FP8_WCACHE_ALL, QT_FP8_WCACHE_NONE}, get_wc, set_wc},
    {"precision.master_dtype", 2, {QT_DT_F32, QT_DT_BF16}, get_mdt, set_mdt},
    {"precision.grad_accum_dtype", 2, {QT_DT_F32, QT_DT_BF16}, get_gdt, set_gdt},
    {"parallel.zero", 3, {1, 2, 3}, get_zero, set_zero},
    /* gradients: one GPU or ZeRO-2/3; weights: one GPU or ZeRO-3. quants is not a candidate: the cost model
     * charges it half the copy bytes, but at 1.5B it measures no faster than [weights] (bench/RESULTS.md,
     * offload); a config that gives it keeps it (get_offw reads the bit) */
    {"memory.offload", 4, {0, QT_OFF_GRADIENTS, QT_OFF_WEIGHTS, OFF_WG}, get_offw, set_offw},
    /* CUDA graphs first: the cost model does not charge the launches they save, so at equal predicted speed
     * the plan with them wins; without them only where the plan refuses them (offloaded weights, ZeRO-3) */
    {"perf.cuda_graphs", 2, {1, 0}, get_cg, set_cg},
};

/* bf16 master weights or gradients change the numerics, not only the speed: such a plan is a candidate
 * only when no plan with fp32 ones fits (see qt_plan_auto_enumerate). 0: fp32 both. */
static int lossy(const qt_config *c) {
    return (c->precision.master_dtype == QT_DT_BF16) + (c->precision.grad_accum_dtype == QT_DT_BF16);
}

/* LoRA on the GPU (qt_engine_gpu_refusal): only the frozen base offloaded (memory.offload: [weights], streamed to
 * every rank's GPU from one host copy with bf16 matmuls: an axis there), the adapters' state replicated over ranks (ZeRO 0 or 1: the same bytes),
 * a run without CUDA graphs; a frozen base has no master weights or gradients. Those axes keep the config's values;
 * the micro-batch, recompute, chunks and the fp8 weight cache stay axes. objective: dpo takes micro-batches of pairs
 * (even). */
static void lora_axes(qt_plan_axes *ax, const qt_config *cfg) {
    static const int fixed[] = {AX_OFF, AX_ORES, AX_MDT, AX_GDT, AX_ZERO, AX_OFFW, AX_CG};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) ax->n[fixed[i]] = 1, ax->v[fixed[i]][0] = AXES[fixed[i]].get(cfg);
    if (cfg->precision.matmul_dtype == QT_DT_BF16 && !cfg->perf.cuda_graphs && !(cfg->memory.offload & OFF_WG))
        ax->n[AX_OFFW] = 2, ax->v[AX_OFFW][0] = 0, ax->v[AX_OFFW][1] = QT_OFF_WEIGHTS; /* the base resident or streamed */
    int k = 0;
    for (int i = 0; i < ax->n[AX_MB]; i++)
        if (cfg->objective != QT_OBJ_DPO || ax->v[AX_MB][i] % 2 == 0) ax->v[AX_MB][k++] = ax->v[AX_MB][i];
    if (!k) ax->v[AX_MB][k++] = cfg->data.micro_batch; /* no even one keeps the step: the config's (the run says why) */
    ax->n[AX_MB] = k;
}

void qt_plan_axes_init(qt_plan_axes *ax, const qt_config *cfg, int ranks) {
    memset(ax, 0, sizeof *ax);
    for (int a = 0; a < AX_N; a++) {
        ax->n[a] = AXES[a].n;
        memcpy(ax->v[a], AXES[a].v, sizeof ax->v[a]);
    }
    ax->seqs = cfg->data.micro_batch * cfg->data.grad_accum;
    for (int v = 1; v <= 64 && v <= ax->seqs; v *= 2) /* micro-batches that keep the sequences per step */
        if (ax->seqs % v == 0) ax->v[AX_MB][ax->n[AX_MB]++] = v;
    if (cfg->precision.matmul_dtype != QT_DT_E4M3) ax->n[AX_WC] = 1, ax->v[AX_WC][0] = cfg->memory.fp8_weight_cache;
    if (ranks <= 1) ax->n[AX_ZERO] = 1, ax->v[AX_ZERO][0] = cfg->parallel.zero;
    if (cfg->lora.rank > 0) lora_axes(ax, cfg);
    ax->several = ranks > 1; /* offloaded weights: one GPU or ZeRO-3; gradients: one GPU or ZeRO-2/3 */
    for (int a = 0; a < AX_N; a++) { /* a key the config gives keeps its value */
        QT_CHECK(qt_config_plan_key(AXES[a].key), "%s is an axis of memory.plan: auto but not in config.c's plan_keys",
                 AXES[a].key);
        int named = !strcmp(AXES[a].key, "memory.offload_optimizer") && qt_config_given(cfg, "memory.offload") &&
                    (cfg->memory.offload & QT_OFF_OPTIMIZER); /* by the list */
        if (qt_config_given(cfg, AXES[a].key) || named)
            ax->n[a] = 1, ax->v[a][0] = AXES[a].get(cfg);
    }
}

int qt_plan_axes_config(const qt_plan_axes *ax, const qt_config *cfg, qt_config *c) {
    *c = *cfg;
    for (int a = 0; a < AX_N; a++) AXES[a].set(c, ax->v[a][ax->idx[a]], ax->seqs);
    int redundant = c->memory.attn_bwd_chunks > c->data.micro_batch; /* clamped to micro_batch: a repeat */
    char zerr[512];
    redundant |= qt_config_zero3_check(c, zerr, sizeof zerr) != 0; /* graphs, fp8 weight cache all: refused */
    redundant |= ax->several && (((c->memory.offload & QT_OFF_WEIGHTS) && c->parallel.zero < 3 && c->lora.rank <= 0) ||
                                 ((c->memory.offload & QT_OFF_GRADIENTS) && c->parallel.zero < 2)); /* setup.c refuses */
    if (!redundant && ax->n[AX_CG] == 2 && !c->perf.cuda_graphs) { /* a plan that allows CUDA graphs: with them only */
        c->perf.cuda_graphs = 1;
        redundant = qt_config_zero3_check(c, zerr, sizeof zerr) == 0;
        c->perf.cuda_graphs = 0;
    }
    return redundant;
}

int qt_plan_axes_next(qt_plan_axes *ax) {
    int a = 0; /* an odometer over the axes */
    while (a < AX_N && ++ax->idx[a] == ax->n[a]) ax->idx[a++] = 0;
    return a < AX_N;
}

qt_plan_choice qt_plan_choice_of(const qt_config *c) {
    return (qt_plan_choice){.micro_batch = c->data.micro_batch, .grad_accum = c->data.grad_accum,
                            .recompute = c->memory.recompute, .offload_optimizer = get_off(c),
                            .lmhead_chunks = c->memory.lmhead_chunks, .attn_bwd_chunks = c->memory.attn_bwd_chunks,
                            .offload_residual = get_ores(c), .fp8_weight_cache = c->memory.fp8_weight_cache,
                            .master_dtype = c->precision.master_dtype, .grad_accum_dtype = c->precision.grad_accum_dtype,
                            .zero = c->parallel.zero, .offload_bits = get_offw(c), .lossy = lossy(c),
                            .cuda_graphs = c->perf.cuda_graphs};
}
