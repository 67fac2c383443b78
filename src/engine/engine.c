/* engine.c — the engine calls as the training loop and the bindings make them: each runs the engine's
 * op inside a catch point (qt_error.h), so a failure deep in the engine — a CUDA call, a cuDNN plan, a
 * rank of the data-parallel engine — comes back as -1 with its message instead of ending the process.
 * After a failed call the engine is broken and may only be freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_engine.h"
#include "qt_error.h"

/* The message of a caught failure, with what a user can do about running out of device memory. */
static int caught(const qt_catch *c, char *err, size_t errlen) {
    return qt_errf(err, errlen, "%s%s", c->msg,
                   c->kind == QT_ERR_DEVICE_OOM
                       ? " (out of GPU memory: lower data.micro_batch, raise memory.lmhead_chunks or set "
                         "memory.offload_optimizer)"
                       : "");
}

/* Runs `body` inside a catch point; on a failure the enclosing function returns caught(...). */
#define CAUGHT(err, errlen, body)                                                                  \
    do {                                                                                           \
        qt_catch c_;                                                                               \
        qt_catch_push(&c_);                                                                        \
        if (setjmp(c_.jb)) return caught(&c_, err, errlen);                                        \
        body;                                                                                      \
        qt_catch_pop(&c_);                                                                         \
    } while (0)

int qt_engine_micro_step(qt_engine *e, const int32_t *in, const int32_t *tgt, float grad_scale, char *err,
                         size_t errlen) {
    CAUGHT(err, errlen, e->ops->micro_step(e, in, tgt, grad_scale));
    return 0;
}

int qt_engine_set_docs(qt_engine *e, const qt_docs *d, char *err, size_t errlen) {
    if (!e->ops->set_docs) {
        if (!d || (!d->attention && !d->positions)) return 0;
        return qt_errf(err, errlen, "engine %s: data.attention: %s and data.positions: %s are not implemented here; "
                       "set data.attention: causal and data.positions: window", e->ops->name,
                       d->attention ? "document" : "causal", d->positions ? "document" : "window");
    }
    CAUGHT(err, errlen, e->ops->set_docs(e, d));
    return 0;
}

int qt_engine_opt_step(qt_engine *e, float lr, long t, float *loss, float *gnorm, char *err, size_t errlen) {
    CAUGHT(err, errlen, e->ops->opt_step(e, lr, t, loss, gnorm));
    return 0;
}

int qt_engine_eval_loss(qt_engine *e, const int32_t *in, const int32_t *tgt, float *loss, char *err,
                        size_t errlen) {
    CAUGHT(err, errlen, *loss = e->ops->eval_loss(e, in, tgt));
    return 0;
}

int qt_engine_get_weights(qt_engine *e, float *w, char *err, size_t errlen) {
    CAUGHT(err, errlen, e->ops->get_weights(e, w));
    return 0;
}

int qt_engine_get_grads(qt_engine *e, float *g, char *err, size_t errlen) {
    CAUGHT(err, errlen, e->ops->get_grads(e, g));
    return 0;
}

int qt_engine_grads_device(qt_engine *e, float **g, int *device, char *err, size_t errlen) {
    if (!e->ops->grads_device)
        return qt_errf(err, errlen, "the %s engine keeps no device gradients to share (one GPU only)", e->ops->name);
    CAUGHT(err, errlen, *g = e->ops->grads_device(e, device));
    return 0;
}

int qt_engine_forward_logits(qt_engine *e, const int32_t *in, float *logits, char *err, size_t errlen) {
    if (!e->ops->forward_logits) return qt_errf(err, errlen, "engine %s cannot return logits", e->ops->name);
    CAUGHT(err, errlen, e->ops->forward_logits(e, in, logits));
    return 0;
}

/* The compact views' tables: per item, its runs and their gather. */
struct qt_engine_compact {
    qt_ckpt_seg *segs[QT_ENGINE_MAX_ITEMS];
    int cap[QT_ENGINE_MAX_ITEMS];
    qt_ckpt_gather gather[QT_ENGINE_MAX_ITEMS];
};

qt_ckpt_units qt_engine_units(const qt_engine *e) {
    return (qt_ckpt_units){e->L->n_units, e->L->unit_at, e->L->unit_compact};
}

/* Replaces a padded layout's flat arrays among items[0, n) by their compact views. */
static void compact_items(qt_engine *e, qt_ckpt_item *items, int n) {
    if (e->L->numel == e->L->compact_numel) return;
    qt_ckpt_units u = qt_engine_units(e);
    if (!e->compact) QT_CHECK(e->compact = calloc(1, sizeof *e->compact), "out of host memory");
    QT_CHECK(n <= QT_ENGINE_MAX_ITEMS, "%d checkpoint items, at most %d", n, QT_ENGINE_MAX_ITEMS);
    struct qt_engine_compact *c = e->compact;
    for (int i = 0; i < n; i++) {
        if (!qt_ckpt_units_is_array(&items[i], &u)) continue;
        int need = qt_ckpt_units_segs(&items[i], &u);
        if (need > c->cap[i]) {
            free(c->segs[i]);
            QT_CHECK(c->segs[i] = malloc((size_t)need * sizeof *c->segs[i]), "out of host memory");
            c->cap[i] = need;
        }
        qt_ckpt_item in = items[i];
        qt_ckpt_units_view(&in, &u, c->segs[i], &c->gather[i], &items[i]);
    }
}

int qt_engine_state_items(qt_engine *e, qt_ckpt_item *items, int cap, char *err, size_t errlen) {
    volatile int n = 0;
    CAUGHT(err, errlen, n = e->ops->state_items(e, items, cap); compact_items(e, items, n));
    return n;
}

int qt_engine_nonfinite_weight(qt_engine *e, int settle, long *index, long *step, char *err, size_t errlen) {
    volatile long i = -1;
    *step = -1;
    if (e->ops->nonfinite_weight) CAUGHT(err, errlen, i = e->ops->nonfinite_weight(e, settle, step));
    *index = i;
    return 0;
}

int qt_engine_load_state(qt_engine *e, qt_ckpt *ck, char *err, size_t errlen) {
    qt_ckpt_units u = qt_engine_units(e);
    if (e->L->numel != e->L->compact_numel && qt_ckpt_pad_units(ck, &u, err, errlen)) return -1;
    volatile int rc = 0;
    CAUGHT(err, errlen, rc = e->ops->load_state(e, ck, err, errlen));
    return rc;
}

int qt_engine_export_adapter(qt_engine *e, const char *dir, char *err, size_t errlen) {
    if (!e->ops->export_adapter) return qt_errf(err, errlen, "the %s engine has no export of its own", e->ops->name);
    volatile int rc = 0;
    CAUGHT(err, errlen, rc = e->ops->export_adapter(e, dir, err, errlen));
    return rc;
}

int qt_engine_row_logps(qt_engine *e, const int32_t *in, const int32_t *tgt, double *logp, char *err, size_t errlen) {
    if (!e->ops->row_logps)
        return qt_errf(err, errlen, "the %s engine has no forward of row log-probs (objective: dpo's stored reference)",
                       e->ops->name);
    CAUGHT(err, errlen, e->ops->row_logps(e, in, tgt, logp));
    return 0;
}

int qt_engine_set_dpo_ref(qt_engine *e, const double *ref, char *err, size_t errlen) {
    if (!e->ops->set_dpo_ref)
        return qt_errf(err, errlen, "the %s engine takes no stored DPO reference (its reference is its own)", e->ops->name);
    CAUGHT(err, errlen, e->ops->set_dpo_ref(e, ref));
    return 0;
}

int qt_engine_nodes_count(qt_engine *e, int mine, int *count, char *err, size_t errlen) {
    *count = mine != 0;
    if (e->ops->nodes_count) CAUGHT(err, errlen, *count = e->ops->nodes_count(e, mine));
    return 0;
}

void qt_engine_free(qt_engine *e) {
    if (!e) return;
    qt_catch c;
    qt_catch_push(&c);
    if (setjmp(c.jb)) { /* a broken engine may fail again while it is taken down: say so, go on */
        fprintf(stderr, "qtrain: while freeing the engine: %s\n", c.msg);
        return;
    }
    if (e->compact)
        for (int i = 0; i < QT_ENGINE_MAX_ITEMS; i++) free(e->compact->segs[i]);
    free(e->compact);
    e->compact = NULL;
    e->ops->free(e);
    qt_catch_pop(&c);
}
