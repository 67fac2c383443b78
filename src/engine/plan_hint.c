/* plan_hint.c — when memory.plan: auto finds no plan: which of the config's constraints blocks it, and the
 * plan each one's drop gives (with LoRA over a bf16 base also the NF4 base's), every hint a real search
 * (qt_plan_auto.h, qt_plan_auto_hints). */
#include <stdio.h>
#include <string.h>

#include "qt_config.h"
#include "qt_dtype.h"
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
