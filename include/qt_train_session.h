/* qt_train_session.h — the training run as calls: open, step (or backward + update), eval, export,
 * close. qt_train_run (the CLI) is a loop over qt_session_step; the embeddable API (qtrain.h) makes
 * the same calls, so a step is the same code, and the same bits, whoever drives it.
 *
 * A step, as the CLI runs it: backward (the step's grad_accum x ranks micro-batches read from the
 * loader, or the caller's, into t->in / t->tgt [grad_accum][ranks][micro_batch * seq_len]; their
 * targets counted; grad_accum engine micro-steps with qt_loss_scale of that count) then update (lr
 * from the schedule, the engine's opt_step, finiteness, step += 1, the train record every log.every
 * steps, eval every eval.every steps and at optim.steps, a checkpoint every checkpoint.every steps and
 * at the step training ends at). */
#ifndef QT_TRAIN_SESSION_H
#define QT_TRAIN_SESSION_H

#include <stddef.h>

#include "qt_config.h"
#include "qt_train.h"

typedef struct qt_trainer qt_trainer;

/* What failed, for callers that map errors to their own kinds (qtrain.h's codes, Python's classes). */
typedef enum {
    QT_TF_NONE = 0,
    QT_TF_CONFIG,     /* the config or what it names (init.from, data.tokenizer) */
    QT_TF_DATA,       /* a token shard (or caller-given tokens) */
    QT_TF_CHECKPOINT, /* checkpoint.dir, a checkpoint to resume, a write */
    QT_TF_DEVICE,     /* an engine call (CUDA, a rank thread): the trainer is broken, only close it */
    QT_TF_DIVERGED,   /* NaN/Inf loss, gradient norm or weights */
    QT_TF_IO,         /* log.file, an export */
    QT_TF_ARGUMENT,   /* a call out of order or with bad arguments */
    QT_TF_INTERNAL,   /* host memory, a broken invariant */
} qt_train_fail;

/* Where a step's micro-batches come from: the configured loader, or t->in / t->tgt, which the caller
 * filled (see the layout above). */
typedef enum { QT_BATCH_LOADER, QT_BATCH_GIVEN } qt_batch_source;

typedef struct {
    long step;           /* steps done after this one */
    float loss;          /* mean loss over the step's targets */
    float grad_norm;     /* before clipping */
    float lr;
    double tokens_per_s; /* this step's tokens (all ranks) over its wall time */
    int evaluated;       /* eval ran after this step on batches with unmasked targets: eval_loss holds its loss */
    float eval_loss;
    int saved;           /* a checkpoint of this step was started */
} qt_step_result;

/* Opens a run of cfg (borrowed; it must outlive the session): the checks of qt_train_run, the model,
 * the loaders (o->export_only opens none and takes no run directory; data_optional: none when
 * data.train is "", the caller gives every batch; else data.train "" is an error naming it), the
 * engine, the resume (o->resume), the run record and the checkpoint writer. stop_after bounds
 * t->stop as qt_train_run's --stop-after does. Returns the session (free with qt_session_close), or
 * NULL with err and *fail set. */
qt_trainer *qt_session_open(const qt_config *cfg, const qt_train_opts *o, int data_optional, qt_train_stats *st,
                            qt_train_fail *fail, char *err, size_t errlen);
/* One optimizer step (backward + update). 0, or -1 with err and t->fail; a data error first saves
 * the last completed step (qt_trainer_save_after_error). */
int qt_session_step(qt_trainer *t, qt_batch_source src, qt_step_result *r, char *err, size_t errlen);
/* The first half of a step: forward + backward of its micro-batches; the gradients are then readable
 * (qt_engine_get_grads) until qt_session_update. 0 or -1 with err. */
int qt_session_backward(qt_trainer *t, qt_batch_source src, char *err, size_t errlen);
/* The second half: AdamW, bookkeeping, log, eval, checkpoint. 0 or -1 with err. */
int qt_session_update(qt_trainer *t, qt_step_result *r, char *err, size_t errlen);
/* The eval loss over eval.batches batches of data.eval (from its start, as the run's evals); NaN when
 * every target of those batches is masked out. 0 or -1. */
int qt_session_eval(qt_trainer *t, float *loss, char *err, size_t errlen);
/* Writes the HF export of the current weights (model.safetensors + config.json, the tokenizer's
 * files when data.tokenizer or init.from has them) to dir, bf16 or fp32. 0 or -1 with err (weights
 * holding a NaN/Inf: QT_TF_DIVERGED naming the tensor, nothing written). */
int qt_session_export(qt_trainer *t, const char *dir, int bf16, char *err, size_t errlen);
/* export.dir, or <checkpoint.dir>/export when it is "". */
void qt_session_export_dir(const qt_config *cfg, char *buf, size_t cap);
/* A checkpoint of the current step into checkpoint.dir, waited for; its path into path. 0 or -1. */
int qt_session_save(qt_trainer *t, char *path, size_t cap, char *err, size_t errlen);
/* Ends the session: waits for the checkpoint write in flight, closes the log, unlocks the run
 * directory (rc < 0 and nothing saved: removes what the run made there), frees everything. rc is the
 * session's outcome so far (0, or the error already in err). Returns rc, or -1 with err when the
 * last write or the log failed. Takes NULL. */
int qt_session_close(qt_trainer *t, int rc, char *err, size_t errlen);

#endif
