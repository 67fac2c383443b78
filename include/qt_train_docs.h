/* qt_train_docs.h — the trainer's packed documents: data.attention and data.positions resolved once
 * against the training shards and the engine, and each micro-batch's document starts (from the loader)
 * handed to the engine before it runs. */
#ifndef QT_TRAIN_DOCS_H
#define QT_TRAIN_DOCS_H

#include <stddef.h>
#include <stdint.h>

#include "qt_config.h"
#include "qt_data.h"
#include "qt_engine.h"

typedef struct {
    int attention, positions; /* resolved: 1 per document, 0 over the window */
    int32_t *starts;          /* [windows x seq_len] the step's windows' document starts (owned) */
    int32_t *n_starts;        /* [windows] */
    size_t windows;
    int seq_len;
} qt_train_docs;

/* Resolves data.attention / data.positions (auto: document when a training shard carries document
 * starts and the engine takes them), tries them on the engine once (it builds what they need: the GPU's
 * cuDNN plans; auto falls back to causal with a note when that fails), prints the choice, and allocates
 * room for `windows` windows. train may be NULL (no loader: every batch is given by the caller, causal).
 * Returns 0, or -1 with err: document asked for on an engine that cannot do it. */
int qt_train_docs_init(qt_train_docs *d, const qt_config *c, const qt_loader *train, qt_engine *e,
                       size_t windows, char *err, size_t errlen);
/* The next micro-batch from l into in/tgt, its document starts into window slot w0.. of d. */
int qt_train_docs_next(qt_train_docs *d, qt_loader *l, size_t w0, int32_t *in, int32_t *tgt, char *err,
                       size_t errlen);
/* Window slots w0.. as the documents of the engine's next calls (src_loader 0: the caller's own
 * batches, taken as one document per row). A no-op when both modes are over the window. 0 or -1. */
int qt_train_docs_apply(const qt_train_docs *d, qt_engine *e, size_t w0, int src_loader, char *err, size_t errlen);
/* Window slot w holds no document start (a rank given no batch). */
void qt_train_docs_clear(qt_train_docs *d, size_t w, int n);
void qt_train_docs_free(qt_train_docs *d);

#endif
