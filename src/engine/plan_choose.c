/* plan_choose.c — memory.plan: auto's outcome (qt_plan_auto.h): the fastest plan that fits, printed and written
 * into the config (qt_plan_auto); when none fits, which of the config's constraints blocks it and the plan each
 * one's drop gives (with LoRA over a bf16 base also the NF4 base's), every hint a real search
 * (qt_plan_auto_hints). */
#include <stdio.h>
#include <string.h>

#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_plan_auto.h"

#define MAX_CONSTRAINTS 16

/* The constraints of cfg a hint may drop: the planner keys it gives. */
static int constraints(const qt_config *cfg, const char **keys) {
    int n = 0;
    const qt_config_key *k;
    for (int i = 0; (k = qt_config_key_at(i)) && n < MAX_CONSTRAINTS; i++)
        if (qt_config_plan_key(k->path) && qt_config_given(cfg, k->path)) keys[n++] = k->path;
    return n;
}

/* cfg with the keys of mask dropped, as `--set key=auto` does: the value kept, the key no longer given. */
static void drop(qt_config *c, const char **keys, unsigned mask) {
    for (int i = 0; keys[i]; i++)
        if (mask >> i & 1) qt_config_ungive(c, keys[i]);
}

/* " --set k=auto --set ..." for the keys of mask. */
static void sets_text(const char **keys, unsigned mask, char *out, size_t cap) {
    size_t u = 0;
    out[0] = 0;
    for (int i = 0; keys[i] && u < cap; i++)
        if (mask >> i & 1)
            u += (size_t)snprintf(out + u, cap - u, " --set %s=auto", keys[i]);
}

/* The best plan of cfg with mask's keys dropped into *best: 1 when one fits. */
static int search(const qt_layout *L, const qt_config *cfg, const char **keys, unsigned mask, const qt_probe *pr,
                  qt_plan_choice *buf, qt_plan_choice *best) {
    static qt_config c;
    c = *cfg;
    drop(&c, keys, mask);
    char e[1024];
    int n = 0;
    if (qt_plan_auto_enumerate(L, &c, pr, buf, QT_PLAN_AUTO_MAX, &n, NULL, e, sizeof e) || n < 1) return 0;
    *best = buf[0];
    return 1;
}

/* Appends "\n  <what>; with <sets>: <the plan>" to err. */
static void append(char *err, size_t errlen, const char *what, const char *sets, const qt_plan_choice *b) {
    size_t u = strlen(err);
    if (u + 1 >= errlen) return;
    snprintf(err + u, errlen - u, "\n  %s; with%s: %.2f GiB GPU, %.1f GiB host, %.0f tokens/s predicted (%s)", what, sets,
             b->gpu_bytes / 1073741824.0, b->host_bytes / 1073741824.0, b->tokens_per_s, qt_plan_auto_describe(b));
}

/* LoRA over a bf16 base: the plan with the base's block matrices in NF4 (QLoRA; bf16 matmuls, which it needs), the
 * config's keys kept. Appends its line and returns 1 when one fits. A hint, not a plan axis: NF4 changes the base
 * the adapters train over. */
static int nf4_hint(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *buf, char *err,
                    size_t errlen) {
    if (cfg->lora.rank <= 0 || cfg->lora.base_nf4) return 0;
    static qt_config c;
    c = *cfg;
    c.lora.base_nf4 = 1;
    c.precision.matmul_dtype = QT_DT_BF16;
    char e[1024];
    int n = 0;
    if (qt_plan_auto_enumerate(L, &c, pr, buf, QT_PLAN_AUTO_MAX, &n, NULL, e, sizeof e) || n < 1) return 0;
    int fp8 = cfg->precision.matmul_dtype != QT_DT_BF16;
    append(err, errlen, "lora.base_dtype: bf16 blocks it",
           fp8 ? " --set lora.base_dtype=nf4 --set precision.matmul_dtype=bf16" : " --set lora.base_dtype=nf4", &buf[0]);
    return 1;
}

void qt_plan_auto_hints(const qt_layout *L, const qt_config *cfg, const qt_probe *pr, qt_plan_choice *buf, char *err,
                        size_t errlen) {
    const char *keys[MAX_CONSTRAINTS + 1] = {0};
    int n = constraints(cfg, keys), found = 0;
    char sets[512], what[768];
    qt_plan_choice b;
    for (int i = 0; i < n; i++) { /* each constraint alone */
        if (!search(L, cfg, keys, 1u << i, pr, buf, &b)) continue;
        char v[128];
        qt_config_key_format(cfg, qt_config_key_find(keys[i]), v, sizeof v);
        snprintf(what, sizeof what, "%s: %s blocks it", keys[i], v);
        sets_text(keys, 1u << i, sets, sizeof sets);
        append(err, errlen, what, sets, &b);
        found++;
    }
    found += nf4_hint(L, cfg, pr, buf, err, errlen);
    if (found) return;
    unsigned all = (1u << n) - 1, need = all;
    if (!n || !search(L, cfg, keys, all, pr, buf, &b)) {
        size_t u = strlen(err);
        snprintf(err + u, errlen - u, "\n  %s", n ? "no plan fits with all of the config's planner keys left "
                 "to the planner either" : "the config gives none of the planner's keys");
        return;
    }
    for (int i = 0; i < n; i++) /* keep each constraint again while a plan still fits: the fewest to drop */
        if (search(L, cfg, keys, need & ~(1u << i), pr, buf, &b)) need &= ~(1u << i);
    search(L, cfg, keys, need, pr, buf, &b);
    size_t u = 0;
    for (int i = 0; i < n && u < sizeof what; i++)
        if (need >> i & 1) u += (size_t)snprintf(what + u, sizeof what - u, "%s%s", u ? " + " : "", keys[i]);
    if (u < sizeof what) snprintf(what + u, sizeof what - u, " together block it (none alone)");
    sets_text(keys, need, sets, sizeof sets);
    append(err, errlen, what, sets, &b);
}

int qt_plan_auto(qt_config *cfg, const qt_probe *pr, char *err, size_t errlen) {
    if (!cfg->memory.plan) return 0;
    const char *no = qt_engine_gpu_refusal(cfg); /* before a plan for what the GPU engines cannot run is searched */
    if (no) return qt_errf(err, errlen, "%s: %s", cfg->path, no);
    qt_layout L;
    qt_weight_src src;
    static qt_plan_choice ch[QT_PLAN_AUTO_MAX];
    int n;
    if (qt_model_layout(cfg, &L, &src, err, errlen)) return -1;
    qt_plan_choice lossy;
    int rc = qt_plan_auto_enumerate(&L, cfg, pr, ch, QT_PLAN_AUTO_MAX, &n, &lossy, err, errlen);
    if (rc && n == 0) qt_plan_auto_hints(&L, cfg, pr, ch, err, errlen); /* none fits: which constraint blocks */
    qt_layout_free(&L);
    if (rc) return -1;
    char lora[96] = "";
    if (cfg->lora.rank > 0)
        snprintf(lora, sizeof lora, " for LoRA rank %d over a frozen %s base", cfg->lora.rank, cfg->lora.base_nf4 ? "nf4" : "bf16");
    printf("qtrain: memory.plan: auto: %d plans fit%s (rates: %s, bf16 %.0f TFLOP/s, PCIe %.0f GB/s); the config's keys "
           "are kept as constraints\n", n, lora, pr->gpu, pr->bf16_flops * 1e-12, pr->pcie_bps * 1e-9);
    for (int i = 0; i < n && i < 3; i++) qt_plan_auto_print_choice(i ? "next" : "chosen", &ch[i], cfg);
    if (qt_plan_auto_lossy_worth(&ch[0], &lossy)) { /* say what the numerics cost, where they cost much */
        printf("         NOTE: bf16 %s would predict %.0f tokens/s (%+.0f%%) with %s; auto keeps fp32 ones while a plan "
               "with them fits: give precision.master_dtype / precision.grad_accum_dtype bf16 to take it\n",
               lossy.master_dtype == QT_DT_BF16 && lossy.grad_accum_dtype == QT_DT_BF16 ? "master weights and gradients"
               : lossy.master_dtype == QT_DT_BF16 ? "master weights" : "gradients",
               lossy.tokens_per_s, 100 * (lossy.tokens_per_s / ch[0].tokens_per_s - 1), qt_plan_auto_describe(&lossy));
    }
    qt_plan_auto_apply(cfg, &ch[0]);
    return 0;
}
