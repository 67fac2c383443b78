/* qt_docs.h — where the documents of a packed micro-batch begin, and what the model does with it.
 *
 * A packed window holds several documents back to back (tools/tokenize --seq-len). With attention per
 * document a query sees only the keys of its own document (and, as always, none after itself); with
 * positions per document RoPE counts from 0 at each document's first token. A window that opens
 * inside a document treats its first token as that document's position 0. */
#ifndef QT_DOCS_H
#define QT_DOCS_H

#include <stddef.h>
#include <stdint.h>

/* One micro-batch's documents, as qt_loader_next_docs gives them: window b of n windows of T tokens
 * has n_starts[b] starts at starts[b*T + k] (ascending input positions in [0, T)). The engines take it
 * through qt_engine_set_docs; the arrays are borrowed for that call only (the engine copies them). */
typedef struct {
    const int32_t *starts;   /* [n x T] */
    const int32_t *n_starts; /* [n] */
    int attention;           /* 1: keys of the query's own document only; 0: causal over the window */
    int positions;           /* 1: RoPE positions restart at each document; 0: the window position t */
} qt_docs;

/* Per token of the n windows of T tokens: kv_lo[b*T + t] = the first key query t may see (its document's
 * start with d->attention, else 0) and pos[b*T + t] = its RoPE position (t minus that start with
 * d->positions, else t). Either output may be NULL. Returns 0, or -1 with err when a window's starts are
 * not ascending inside [0, T). */
int qt_docs_expand(const qt_docs *d, int n, int T, int32_t *kv_lo, int32_t *pos, char *err, size_t errlen);

#endif
