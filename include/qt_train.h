/* qt_train.h — the training loop: model setup, steps, logging, eval, checkpoints, export. */
#ifndef QT_TRAIN_H
#define QT_TRAIN_H

#include <stddef.h>

#include "qt_config.h"

typedef struct {
    const char *resume;  /* NULL: from scratch; "latest": newest in checkpoint.dir; else a path */
    long stop_after;     /* >= 0: stop (with a checkpoint) once this many steps are done */
    int export_only;     /* load (init or resume) and export, no training */
    float *losses;       /* optional [cfg->steps]: each step's mean training loss */
} qt_train_opts;

typedef struct {
    long steps_done;     /* the step count reached */
    float first_eval, last_eval; /* NAN when no eval ran */
    double tokens_per_s; /* over the whole run */
} qt_train_stats;

/* Resolves the model (model.hf_config, else init.from's config.json when no inline model keys were
 * given, else the inline keys), validates it, builds L and the initial weights: init.from's
 * safetensors or N(0, init.std) from init.seed. *w is malloc'ed (caller frees); L is freed with
 * qt_layout_free. Returns 0 or -1 with err. */
int qt_model_setup(const qt_config *cfg, qt_layout *L, float **w, char *err, size_t errlen);
/* The engine device.auto|cpu|cuda picks (prints a one-line notice when auto falls back to the CPU).
 * NULL with err when cuda is asked for and cannot be served. */
struct qt_engine *qt_engine_create(const qt_layout *L, const qt_config *cfg, const float *w0, char *err,
                                   size_t errlen);

/* Runs cfg. Returns 0, or -1 with err for user errors (missing files, bad shards, incompatible
 * checkpoint); device failures stop the process through QT_CHECK. */
int qt_train_run(const qt_config *cfg, const qt_train_opts *opts, qt_train_stats *st, char *err, size_t errlen);

#endif
