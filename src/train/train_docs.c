/* train_docs.c — data.attention and data.positions resolved at start, and each micro-batch's document
 * starts passed from the loader to the engine. */
#include "qt_train_docs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

/* Sets documents once before training, so that the engine builds what they need now (the GPU's cuDNN
 * plans with the document bound): a graph cuDNN refuses shows here. Returns 0, or -1 with err. */
static int probe(qt_train_docs *d, qt_engine *e, char *err, size_t errlen) {
    qt_docs none = {d->starts, d->n_starts, d->attention, d->positions}; /* no starts: one document per row */
    if (qt_engine_set_docs(e, &none, err, errlen)) return -1;
    return qt_engine_set_docs(e, NULL, err, errlen);
}

int qt_train_docs_init(qt_train_docs *d, const qt_config *c, const qt_loader *train, qt_engine *e,
                       size_t windows, char *err, size_t errlen) {
    *d = (qt_train_docs){.seq_len = c->data.seq_len, .windows = windows};
    int have = train ? qt_loader_doc_shards(train) : 0, shards = train ? qt_loader_shards(train) : 0;
    int can = e->ops->set_docs != NULL;
    const char *why;
    if (c->data.attention == QT_DOCS_AUTO) {
        d->attention = have > 0 && can;
        why = !train ? "no training shards" : !have ? "the shards carry no document starts"
              : !can ? "the engine has causal attention only" : "the shards carry document starts";
    } else {
        d->attention = c->data.attention == QT_DOCS_DOCUMENT;
        why = "data.attention";
    }
    d->positions = c->data.positions == QT_DOCS_AUTO ? d->attention : c->data.positions == QT_DOCS_DOCUMENT;
    if ((d->attention || d->positions) && !can)
        return qt_errf(err, errlen, "%s: data.attention: %s, data.positions: %s: engine %s has causal attention over "
                       "the window and positions t only; set data.attention: causal and data.positions: window",
                       c->path, d->attention ? "document" : "causal", d->positions ? "document" : "window",
                       e->ops->name);
    if (d->attention || d->positions) {
        d->starts = malloc(windows * (size_t)d->seq_len * sizeof *d->starts);
        d->n_starts = calloc(windows, sizeof *d->n_starts);
        if (!d->starts || !d->n_starts)
            return qt_errf(err, errlen, "out of host memory for %zu windows' document starts", windows);
        char e2[1024];
        if (probe(d, e, e2, sizeof e2)) {
            if (c->data.attention != QT_DOCS_AUTO || c->data.positions != QT_DOCS_AUTO)
                return qt_errf(err, errlen, "%s: data.attention / data.positions per document: %s", c->path, e2);
            printf("qtrain: note: attention per document is not available here (%s): causal over the window\n", e2);
            d->attention = d->positions = 0;
            why = "not available on this engine";
            qt_train_docs_free(d);
        }
    }
    if (train)
        printf("qtrain: attention %s, RoPE positions %s (%s; %d of %d training shards carry document starts)\n",
               d->attention ? "per document" : "causal over the window",
               d->positions ? "restarting at each document" : "over the window", why, have, shards);
    return 0;
}

int qt_train_docs_next(qt_train_docs *d, qt_loader *l, size_t w0, int32_t *in, int32_t *tgt, char *err,
                       size_t errlen) {
    if (!d->starts) return qt_loader_next(l, in, tgt, err, errlen);
    return qt_loader_next_docs(l, in, tgt, d->starts + w0 * d->seq_len, d->n_starts + w0, err, errlen);
}

int qt_train_docs_apply(const qt_train_docs *d, qt_engine *e, size_t w0, int src_loader, char *err, size_t errlen) {
    if (!d->attention && !d->positions) return 0;
    qt_docs docs = {d->starts + w0 * d->seq_len, d->n_starts + w0, d->attention, d->positions};
    return qt_engine_set_docs(e, src_loader ? &docs : NULL, err, errlen);
}

void qt_train_docs_clear(qt_train_docs *d, size_t w, int n) {
    if (d->n_starts) memset(d->n_starts + w, 0, (size_t)n * sizeof *d->n_starts);
}

void qt_train_docs_free(qt_train_docs *d) {
    free(d->starts);
    free(d->n_starts);
    d->starts = d->n_starts = NULL;
}
