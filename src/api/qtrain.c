/* qtrain.c — the embeddable C API (include/qtrain.h) over the training session (qt_train_session.h):
 * config loading, caller batches turned into the engine's inputs/targets, parameters by name, the
 * memory plan, error codes. No training logic of its own: steps are qt_session_step's. */
#include "qtrain.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_plan_auto.h"
#include "qt_resume.h"
#include "qt_train_ckpt.h"
#include "qt_train_session.h"

struct qtrain_trainer {
    qt_config cfg;           /* the session borrows it */
    qt_trainer *s;           /* the session (owned) */
    qt_train_stats st;
    char err[4096];          /* the last error, "" after success */
};

static const qtrain_status status_of[] = {
    [QT_TF_NONE] = QTRAIN_OK, [QT_TF_CONFIG] = QTRAIN_ERR_CONFIG, [QT_TF_DATA] = QTRAIN_ERR_DATA,
    [QT_TF_CHECKPOINT] = QTRAIN_ERR_CHECKPOINT, [QT_TF_DEVICE] = QTRAIN_ERR_DEVICE,
    [QT_TF_DIVERGED] = QTRAIN_ERR_DIVERGED, [QT_TF_IO] = QTRAIN_ERR_IO, [QT_TF_ARGUMENT] = QTRAIN_ERR_ARGUMENT,
    [QT_TF_INTERNAL] = QTRAIN_ERR_INTERNAL,
};

/* A session call's result: OK, or the session's failure kind as a status (the message is in t->err). */
static qtrain_status done(qtrain_trainer *t, int rc) {
    if (rc == 0) {
        t->err[0] = 0;
        return QTRAIN_OK;
    }
    return status_of[t->s->fail ? t->s->fail : QT_TF_INTERNAL];
}

/* st with a message of our own in t->err. */
static qtrain_status __attribute__((format(printf, 3, 4))) fail_msg(qtrain_trainer *t, qtrain_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    return st;
}

const char *qtrain_error(const qtrain_trainer *t) { return t->err; }

/* The config of o: its file or text then the overrides, or a resumed checkpoint's (qt_resume.h); the
 * checkpoint to resume into which ("latest" for a folder, whose path is then checkpoint.dir). */
static qtrain_status load_config(qt_config *c, const qtrain_options *o, char *which, size_t cap, char *err,
                                 size_t errlen) {
    int rc;
    if (!o->config && !o->resume) {
        qt_errf(err, errlen, "no config given (a YAML path or text, or a checkpoint to resume)");
        return QTRAIN_ERR_ARGUMENT;
    }
    if (!o->config) {
        rc = qt_resume_config(c, o->resume, o->overrides, o->n_overrides, which, cap, err, errlen);
        return rc == 0 ? QTRAIN_OK : rc == -1 ? QTRAIN_ERR_CHECKPOINT : QTRAIN_ERR_CONFIG;
    }
    if (!o->config_is_text) rc = qt_config_load(c, o->config, o->overrides, o->n_overrides, err, errlen);
    else rc = qt_config_load_string(c, o->config, "<config>", o->overrides, o->n_overrides, err, errlen);
    if (rc) return QTRAIN_ERR_CONFIG;
    if (!o->resume) return QTRAIN_OK;
    char target[QT_PATH_MAX + 8];
    int file = qt_resume_target(o->resume, target, sizeof target, err, errlen);
    if (file < 0) return QTRAIN_ERR_CHECKPOINT;
    if (!file) snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s", target);
    snprintf(which, cap, "%s", file ? target : "latest");
    return QTRAIN_OK;
}

qtrain_status qtrain_open(const qtrain_options *o, qtrain_trainer **out, char *err, size_t errlen) {
    *out = NULL;
    qtrain_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        qt_errf(err, errlen, "out of host memory");
        return QTRAIN_ERR_INTERNAL;
    }
    char which[QT_PATH_MAX + 64];
    qtrain_status st = load_config(&t->cfg, o, which, sizeof which, err, errlen);
    if (!st && qt_plan_auto_wanted(&t->cfg)) { /* memory.plan: auto on a GPU run, as the qtrain program does */
        char cache[QT_PATH_MAX + 32]; /* the probe the qtrain program cached (nothing is measured here) */
        snprintf(cache, sizeof cache, "%s/.cache/qtrain", o->home_dir ? o->home_dir : "");
        qt_probe pr = qt_probe_get(o->home_dir && *o->home_dir ? cache : NULL, 0);
        qt_probe_free_memory(&pr, &t->cfg);
        if (qt_plan_auto(&t->cfg, &pr, err, errlen)) st = QTRAIN_ERR_CONFIG;
    }
    if (st) {
        free(t);
        return st;
    }
    qt_train_opts to = {o->resume ? which : NULL, -1, o->export_only, NULL, o->allow_changed, o->home_dir};
    qt_train_fail fail;
    t->s = qt_session_open(&t->cfg, &to, 1, &t->st, &fail, err, errlen);
    if (!t->s) {
        free(t);
        return status_of[fail ? fail : QT_TF_INTERNAL];
    }
    *out = t;
    return QTRAIN_OK;
}

qtrain_status qtrain_close(qtrain_trainer *t, char *err, size_t errlen) {
    if (!t) return QTRAIN_OK;
    int rc = qt_session_close(t->s, 0, err, errlen);
    free(t);
    return rc ? QTRAIN_ERR_CHECKPOINT : QTRAIN_OK; /* the last checkpoint write or the log failed */
}

void qtrain_get_info(const qtrain_trainer *t, qtrain_info *i) {
    const qt_trainer *s = t->s;
    const qt_config *c = &t->cfg;
    *i = (qtrain_info){s->step, c->optim.steps, c->data.micro_batch * c->data.grad_accum * s->eng->ranks,
                       c->data.seq_len, c->data.micro_batch, s->layout.cfg.vocab_size, s->eng->ranks,
                       s->layout.n_tensors, s->layout.numel, s->layout.n_params, s->eng->ops->name,
                       c->checkpoint.dir};
}

static int batch_rows(const qtrain_trainer *t) {
    return t->cfg.data.micro_batch * t->cfg.data.grad_accum * t->s->eng->ranks;
}

/* tokens [rows][T+1] (+ mask) -> inputs/targets [rows][T] in dst_in/dst_tgt, checked first. */
static qtrain_status fill_batch(qtrain_trainer *t, const int32_t *tok, const uint8_t *mask, int rows,
                                int32_t *in, int32_t *tgt) {
    int T = t->cfg.data.seq_len, V = t->s->layout.cfg.vocab_size;
    size_t W = (size_t)T + 1;
    if (!tok) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "no tokens given");
    for (size_t i = 0; i < (size_t)rows * W; i++) {
        if (tok[i] < 0 || tok[i] >= V)
            return fail_msg(t, QTRAIN_ERR_ARGUMENT, "tokens[%zu][%zu] = %d: expected a token id in [0, %d) (model.vocab_size)",
                            i / W, i % W, tok[i], V);
        if (mask && mask[i] > 1)
            return fail_msg(t, QTRAIN_ERR_ARGUMENT, "mask[%zu][%zu] = %d: expected 0 or 1", i / W, i % W, mask[i]);
    }
    for (int r = 0; r < rows; r++) {
        const int32_t *w = tok + r * W;
        for (int j = 0; j < T; j++) {
            in[(size_t)r * T + j] = w[j];
            tgt[(size_t)r * T + j] = mask && !mask[r * W + j + 1] ? -1 : w[j + 1];
        }
    }
    return QTRAIN_OK;
}


static void copy_result(const qt_step_result *a, qtrain_step_result *r) {
    if (r) *r = (qtrain_step_result){a->step, a->loss, a->grad_norm, a->lr, a->tokens_per_s, a->evaluated,
                                     a->eval_loss, a->saved};
}

qtrain_status qtrain_next_batch(qtrain_trainer *t, int32_t *tokens, uint8_t *mask) {
    qt_trainer *s = t->s;
    int T = t->cfg.data.seq_len, B = t->cfg.data.micro_batch, rows = batch_rows(t);
    size_t W = (size_t)T + 1;
    if (!s->train) return fail_msg(t, QTRAIN_ERR_DATA, "data.train is not set: there is no loader to read");
    if (s->pending) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "step %ld: backward ran already; update first", s->step + 1);
    for (int k = 0; k < rows / B; k++) { /* through the step buffers, one micro-batch at a time */
        if (qt_loader_next(s->train, s->in, s->tgt, t->err, sizeof t->err)) return QTRAIN_ERR_DATA;
        for (int r = 0; r < B; r++) {
            int32_t *tok = tokens + ((size_t)k * B + r) * W;
            uint8_t *m = mask + ((size_t)k * B + r) * W;
            const int32_t *in = s->in + (size_t)r * T, *tg = s->tgt + (size_t)r * T;
            m[0] = 1;
            for (int j = 0; j < T; j++) {
                tok[j] = in[j];
                m[j + 1] = tg[j] >= 0;
            }
            tok[T] = tg[T - 1] >= 0 ? tg[T - 1] : 0;
        }
    }
    t->err[0] = 0;
    return QTRAIN_OK;
}

qtrain_status qtrain_backward(qtrain_trainer *t) {
    return done(t, qt_session_backward(t->s, QT_BATCH_LOADER, t->err, sizeof t->err));
}

qtrain_status qtrain_backward_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask) {
    if (t->s->pending) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "step %ld: backward ran already; update first", t->s->step + 1);
    qtrain_status st = fill_batch(t, tokens, mask, batch_rows(t), t->s->in, t->s->tgt);
    return st ? st : done(t, qt_session_backward(t->s, QT_BATCH_GIVEN, t->err, sizeof t->err));
}

qtrain_status qtrain_update(qtrain_trainer *t, qtrain_step_result *r) {
    qt_step_result a;
    int rc = qt_session_update(t->s, &a, t->err, sizeof t->err);
    if (rc == 0) copy_result(&a, r);
    return done(t, rc);
}

qtrain_status qtrain_step(qtrain_trainer *t, qtrain_step_result *r) {
    qtrain_status st = qtrain_backward(t);
    return st ? st : qtrain_update(t, r);
}

qtrain_status qtrain_step_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask, qtrain_step_result *r) {
    qtrain_status st = qtrain_backward_tokens(t, tokens, mask);
    return st ? st : qtrain_update(t, r);
}

qtrain_status qtrain_eval(qtrain_trainer *t, float *loss) {
    if (t->s->pending) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "step %ld: eval between backward and update", t->s->step + 1);
    return done(t, qt_session_eval(t->s, loss, t->err, sizeof t->err));
}

/* Each micro-batch alone (on the first rank; the others' targets all ignored), its mean weighted by
 * its target count, so the result is the mean over every counted target whatever the rank count. */
qtrain_status qtrain_eval_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask, int n_rows, float *loss) {
    qt_trainer *s = t->s;
    int B = t->cfg.data.micro_batch, T = t->cfg.data.seq_len, ranks = s->eng->ranks;
    if (s->pending) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "step %ld: eval between backward and update", s->step + 1);
    if (n_rows <= 0 || n_rows % B)
        return fail_msg(t, QTRAIN_ERR_ARGUMENT, "eval: %d rows, expected a positive multiple of data.micro_batch (%d)", n_rows, B);
    size_t ntok = (size_t)B * T;
    double sum = 0;
    long valid = 0;
    for (int k = 0; k < n_rows / B; k++) {
        memset(s->tgt, 0xff, ranks * ntok * sizeof(int32_t));
        memset(s->in, 0, ranks * ntok * sizeof(int32_t));
        qtrain_status st = fill_batch(t, tokens + (size_t)k * B * (T + 1), mask ? mask + (size_t)k * B * (T + 1) : NULL,
                                      B, s->in, s->tgt);
        if (st) return st;
        long v = 0;
        for (size_t i = 0; i < ntok; i++) v += s->tgt[i] >= 0;
        float l;
        if (qt_train_docs_apply(&s->docs, s->eng, 0, 0, t->err, sizeof t->err) || /* the caller's rows: causal */
            qt_engine_eval_loss(s->eng, s->in, s->tgt, &l, t->err, sizeof t->err)) {
            s->fail = QT_TF_DEVICE;
            s->broken = 1;
            return QTRAIN_ERR_DEVICE;
        }
        sum += (double)l * v;
        valid += v;
    }
    *loss = valid ? (float)(sum / valid) : 0.0f;
    t->err[0] = 0;
    return QTRAIN_OK;
}

qtrain_status qtrain_save(qtrain_trainer *t, char *path, size_t cap) {
    return done(t, qt_session_save(t->s, path, cap, t->err, sizeof t->err));
}

qtrain_status qtrain_export(qtrain_trainer *t, const char *dir, int bf16) {
    if (!dir || !dir[0]) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "export: no directory given");
    return done(t, qt_session_export(t->s, dir, bf16, t->err, sizeof t->err));
}

qtrain_status qtrain_set_lr(qtrain_trainer *t, float lr) {
    t->s->lr_override = lr >= 0 ? lr : -1.0f;
    t->err[0] = 0;
    return QTRAIN_OK;
}

void qtrain_set_log_callback(qtrain_trainer *t, void (*fn)(void *ctx, const char *json), void *ctx) {
    t->s->log.hook = fn;
    t->s->log.hook_ctx = ctx;
}

/* ---- tensors by name ---- */

qtrain_status qtrain_tensor_at(const qtrain_trainer *t, int i, qtrain_tensor *out) {
    const qt_layout *L = &t->s->layout;
    if (i < 0 || i >= L->n_tensors) return QTRAIN_ERR_ARGUMENT;
    const qt_tensor *tt = &L->tensors[i];
    *out = (qtrain_tensor){tt->name, tt->ndim, {tt->shape[0], tt->ndim > 1 ? tt->shape[1] : 0}, tt->numel, tt->offset};
    return QTRAIN_OK;
}

int qtrain_tensor_find(const qtrain_trainer *t, const char *name) {
    const qt_tensor *tt = qt_layout_find(&t->s->layout, name);
    return tt ? (int)(tt - t->s->layout.tensors) : -1;
}

/* The tensor called name holding n elements, or NULL with the error in t->err. */
static const qt_tensor *tensor_n(qtrain_trainer *t, const char *name, size_t n) {
    const qt_tensor *tt = qt_layout_find(&t->s->layout, name);
    if (!tt) snprintf(t->err, sizeof t->err, "no tensor \"%s\" in this model (%d tensors, e.g. \"%s\")", name,
                      t->s->layout.n_tensors, t->s->layout.tensors[0].name);
    else if (tt->numel != n) {
        char shape[64];
        if (tt->ndim > 1) snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)tt->shape[0], (long long)tt->shape[1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)tt->shape[0]);
        snprintf(t->err, sizeof t->err, "%s: %zu elements given, expected %zu (shape %s)", name, n, tt->numel, shape);
        return NULL;
    }
    return tt;
}

static qtrain_status engine_failed(qtrain_trainer *t) {
    t->s->fail = QT_TF_DEVICE;
    t->s->broken = 1;
    return QTRAIN_ERR_DEVICE;
}

qtrain_status qtrain_get_weights(qtrain_trainer *t, float *flat) {
    return qt_engine_get_weights(t->s->eng, flat, t->err, sizeof t->err) ? engine_failed(t) : done(t, 0);
}

qtrain_status qtrain_get_gradients(qtrain_trainer *t, float *flat) {
    return qt_engine_get_grads(t->s->eng, flat, t->err, sizeof t->err) ? engine_failed(t) : done(t, 0);
}

qtrain_status qtrain_gradient_device(qtrain_trainer *t, const char *name, qtrain_device_tensor *out) {
    const qt_tensor *tt = qt_layout_find(&t->s->layout, name);
    if (!tt) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "no tensor \"%s\" in this model", name);
    float *g;
    int dev;
    if (qt_engine_grads_device(t->s->eng, &g, &dev, t->err, sizeof t->err))
        return t->s->eng->ops->grads_device ? engine_failed(t) : QTRAIN_ERR_ARGUMENT;
    *out = (qtrain_device_tensor){g + tt->offset, dev, tt->ndim, {tt->shape[0], tt->ndim > 1 ? tt->shape[1] : 0}};
    return done(t, 0);
}

qtrain_status qtrain_get_parameter(qtrain_trainer *t, const char *name, float *out, size_t n) {
    const qt_tensor *tt = tensor_n(t, name, n);
    if (!tt) return QTRAIN_ERR_ARGUMENT;
    float *w = malloc(t->s->layout.numel * sizeof(float));
    if (!w) return fail_msg(t, QTRAIN_ERR_INTERNAL, "out of host memory for %zu weights", t->s->layout.numel);
    qtrain_status st = qtrain_get_weights(t, w);
    if (!st) memcpy(out, w + tt->offset, n * sizeof(float));
    free(w);
    return st;
}

/* Loads items (the engine's state, edited) back into the engine through a checkpoint file in a
 * temporary directory: the one path every engine has for writing its whole state. */
static qtrain_status reload_state(qtrain_trainer *t, const qt_ckpt_item *items, int n) {
    char dir[QT_PATH_MAX + 64], path[QT_PATH_MAX + 96];
    struct stat sb;
    const char *base = stat(t->cfg.checkpoint.dir, &sb) == 0 && S_ISDIR(sb.st_mode) ? t->cfg.checkpoint.dir : "/tmp";
    snprintf(dir, sizeof dir, "%s/.qtrain_set_XXXXXX", base);
    if (!mkdtemp(dir)) return fail_msg(t, QTRAIN_ERR_IO, "cannot make a temporary directory in %s: %s", base, strerror(errno));
    qtrain_status st = QTRAIN_ERR_IO;
    if (qt_ckpt_save(dir, 0, 1, items, n, t->err, sizeof t->err) == 0 && qt_ckpt_latest(dir, path, sizeof path) == 0) {
        qt_ckpt *ck = qt_ckpt_open(path, t->err, sizeof t->err);
        if (ck) {
            st = qt_engine_load_state(t->s->eng, ck, t->err, sizeof t->err) ? engine_failed(t) : QTRAIN_OK;
            qt_ckpt_close(ck);
        }
        unlink(path);
    }
    rmdir(dir);
    return st;
}

qtrain_status qtrain_set_parameter(qtrain_trainer *t, const char *name, const float *src, size_t n) {
    qt_trainer *s = t->s;
    if (s->pending) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "step %ld: set_parameter between backward and update", s->step + 1);
    const qt_tensor *tt = tensor_n(t, name, n);
    if (!tt) return QTRAIN_ERR_ARGUMENT;
    for (size_t j = 0; j < n; j++) /* a NaN/Inf weight would surface steps later as a divergence */
        if (!isfinite(src[j]))
            return fail_msg(t, QTRAIN_ERR_ARGUMENT, "%s[%zu] = %g: expected finite weights", name, j, (double)src[j]);
    qt_ckpt_item items[16];
    int ni = qt_engine_state_items(s->eng, items, 16, t->err, sizeof t->err), hit = 0;
    if (ni < 0) return engine_failed(t);
    for (int i = 0; i < ni; i++) { /* the fp32 weights (master) and the model-dtype copy */
        qt_ckpt_item *it = &items[i];
        if (strncmp(it->name, "weights", 7) || it->bytes != s->layout.compact_numel * (size_t)qt_dtype_size(it->dtype)) continue;
        if (it->flags & QT_CKPT_WIDEN_BF16) continue; /* a bf16 master's "weights": the bf16 blob's view, set there */
        if (it->dtype == QT_DT_F32 || it->dtype == QT_DT_BF16) /* run by run: a gathered item's pieces are the ranks' */
            for (size_t j = 0, run; j < n; j += run / qt_dtype_size(it->dtype)) {
                size_t es = qt_dtype_size(it->dtype);
                void *p = (void *)qt_ckpt_item_at(it, (tt->compact + j) * es, &run); /* the items' compact layout */
                if (run / es > n - j) run = (n - j) * es;
                for (size_t k = 0; k < run / es; k++)
                    if (es == 4) ((float *)p)[k] = src[j + k];
                    else ((uint16_t *)p)[k] = qt_f32_to_bf16(src[j + k]);
            }
        else return fail_msg(t, QTRAIN_ERR_ARGUMENT, "%s: the engine keeps its weights in %s; setting them is not supported",
                             name, qt_dtype_name(it->dtype));
        hit++;
    }
    if (!hit) return fail_msg(t, QTRAIN_ERR_ARGUMENT, "%s: the engine's state holds no whole weight array", name);
    /* the CPU engine's items are its live arrays: written already */
    return s->eng->ops->state_is_snapshot ? reload_state(t, items, ni) : done(t, 0);
}

/* ---- plan and devices ---- */

size_t qtrain_plan(qtrain_trainer *t, char *buf, size_t cap) {
    qt_engine *e = t->s->eng;
    if (!e->ops->print_memory) {
        double mib = e->L->numel * 4.0 / 1048576.0;
        return (size_t)snprintf(buf, cap, "  host (%s): weights %.1f MiB, gradients %.1f MiB, AdamW m %.1f MiB, "
                                "AdamW v %.1f MiB (fp32 each), total %.1f MiB\n", e->ops->name, mib, mib, mib, mib, 4 * mib);
    }
    /* the engine prints its table on stdout: caught in a temporary file */
    FILE *tmp = tmpfile();
    int saved = dup(1);
    if (!tmp || saved < 0) return (size_t)snprintf(buf, cap, "(no temporary file for the memory plan)\n");
    fflush(stdout);
    dup2(fileno(tmp), 1);
    e->ops->print_memory(e);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    long n = ftell(tmp) > 0 ? ftell(tmp) : lseek(fileno(tmp), 0, SEEK_END);
    rewind(tmp);
    size_t got = cap ? fread(buf, 1, cap - 1 < (size_t)n ? cap - 1 : (size_t)n, tmp) : 0;
    if (cap) buf[got] = 0;
    fclose(tmp);
    return n > 0 ? (size_t)n : 0;
}

int qtrain_devices(const qtrain_trainer *t, int *ids, int cap) {
    const qt_engine *e = t->s->eng;
    if (!strncmp(e->ops->name, "cpu", 3)) return 0;
    for (int r = 0; r < e->ranks && r < cap; r++)
        ids[r] = t->cfg.parallel.devices.n ? t->cfg.parallel.devices.v[r] : r;
    return e->ranks;
}
