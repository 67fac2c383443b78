/* train_dpo.c — objective: dpo in the training loop: the data check, the per-pair step weight, the logged means. */
#include "qt_train_dpo.h"

#include <stdio.h>

#include "qt_error.h"

int qt_train_dpo_check_data(const qt_config *c, const qt_loader *l, const char *key, const char *glob, char *err,
                            size_t errlen) {
    int dpo = c->objective == QT_OBJ_DPO, pairs = qt_loader_pairs(l);
    if (dpo && !pairs)
        return qt_errf(err, errlen, "%s: %s holds no preference pairs, but objective is dpo: make the shards with "
                       "tools/tokenize --pairs (rows of prompt, chosen, rejected)", key, glob);
    if (!dpo && pairs)
        return qt_errf(err, errlen, "%s: %s holds preference pairs (tools/tokenize --pairs): train them with "
                       "objective: dpo", key, glob);
    return 0;
}

long qt_train_dpo_units(const qt_config *c, long rows, long targets) {
    return c->objective == QT_OBJ_DPO ? rows / 2 : targets;
}

void qt_train_dpo_format(qt_engine *e, const qt_config *c, int eval, char *line, size_t lcap, char *json, size_t jcap) {
    line[0] = json[0] = 0;
    if (c->objective != QT_OBJ_DPO || !e->ops->dpo_stats) return;
    qt_dpo_stats s;
    e->ops->dpo_stats(e, eval, &s);
    if (!s.pairs) return;
    double n = (double)s.pairs, rc = s.reward_chosen / n, rr = s.reward_rejected / n, m = s.margin / n,
           acc = s.accuracy / n;
    snprintf(line, lcap, " | margin %.4f | acc %.3f | rewards %.4f/%.4f", m, acc, rc, rr);
    snprintf(json, jcap, ",\"dpo_reward_chosen\":%.6f,\"dpo_reward_rejected\":%.6f,\"dpo_margin\":%.6f,"
             "\"dpo_accuracy\":%.6f,\"dpo_pairs\":%ld", rc, rr, m, acc, s.pairs);
}
