/* qt_train_dpo.h — what the training loop does differently for objective: dpo: the data must be pair shards, a
 * step's gradient weight is per pair, and the log lines carry the rewards, margin and accuracy (qt_dpo.h). */
#ifndef QT_TRAIN_DPO_H
#define QT_TRAIN_DPO_H

#include <stddef.h>

#include "qt_config.h"
#include "qt_data.h"
#include "qt_engine.h"

/* 0 when loader l's shards (of glob, given by key: data.train or data.eval) fit c's objective (pair shards for
 * objective: dpo, none otherwise), else -1 with err naming the key. */
int qt_train_dpo_check_data(const qt_config *c, const qt_loader *l, const char *key, const char *glob, char *err,
                            size_t errlen);
/* The count a step's gradient is averaged over: its pairs (objective: dpo, rows / 2) or its unmasked targets. */
long qt_train_dpo_units(const qt_config *c, long rows, long targets);
/* The DPO means of the engine's last step (eval 0) or last evaluation (eval 1) as a console suffix
 * (" | margin ... | acc ... | rewards c/r") and JSON fields (",\"dpo_margin\":..."); both "" without objective: dpo. */
void qt_train_dpo_format(qt_engine *e, const qt_config *c, int eval, char *line, size_t lcap, char *json, size_t jcap);

#endif
