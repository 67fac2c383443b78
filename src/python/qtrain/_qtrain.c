/* _qtrain.c — the CPython extension over the embeddable C API (include/qtrain.h): the Trainer type,
 * the exception classes, buffers in and out. The package's __init__.py adds the numpy conveniences.
 *
 * Steps release the GIL. SIGINT and SIGTERM are blocked in the stepping thread for the step's length
 * (so no system call of the step sees EINTR; the signal is taken by another thread or left pending),
 * and after the step PyErr_CheckSignals runs Python's handlers: Ctrl-C raises KeyboardInterrupt once
 * the step is done, and the trainer stays usable.
 *
 * One call at a time per trainer: each call that reaches the C trainer claims it first (begin_call:
 * `busy` names the call, under `mu`) and gives it back at its end, so a second call from another
 * thread, or from a callback of the running one, raises RuntimeError naming the call in progress
 * instead of racing. close() waits for another thread's call to end, then claims the trainer and
 * frees it; from inside the running call (a callback) it raises. Gradient views handed out through
 * DLPack point into the trainer's GPU memory: close() refuses while any is alive. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <pythread.h>
#include <signal.h>
#include <string.h>

#include "qtrain.h"

static PyObject *Error, *ConfigError, *DataError, *CheckpointError, *DeviceError, *DivergedError, *OutputError,
    *ArgumentError;

/* The exception class of a status. */
static PyObject *exc_of(qtrain_status st) {
    switch (st) {
    case QTRAIN_ERR_CONFIG: return ConfigError;
    case QTRAIN_ERR_DATA: return DataError;
    case QTRAIN_ERR_CHECKPOINT: return CheckpointError;
    case QTRAIN_ERR_DEVICE: return DeviceError;
    case QTRAIN_ERR_DIVERGED: return DivergedError;
    case QTRAIN_ERR_IO: return OutputError;
    case QTRAIN_ERR_ARGUMENT: return ArgumentError;
    default: return Error;
    }
}

static PyObject *raise_status(qtrain_status st, const char *msg) {
    PyErr_SetString(exc_of(st), msg && msg[0] ? msg : "qtrain: unknown error");
    return NULL;
}

typedef struct {
    PyObject_HEAD
    qtrain_trainer *t;  /* NULL once closed; changed only by the call that holds busy */
    pthread_mutex_t mu; /* guards busy and owner; never held while waiting for the GIL */
    pthread_cond_t idle;/* signalled when busy becomes NULL */
    const char *busy;   /* the call holding the trainer ("step()"), or NULL */
    unsigned long owner;/* the thread of that call */
    int closing;        /* close() waits for busy: no new call may claim the trainer before it */
    Py_ssize_t views;   /* DLPack gradient views alive (their memory is the trainer's) */
    PyObject *log_cb;   /* callable(dict) or NULL */
    PyObject *cb_error; /* (type, value, tb) the callback raised during the last call, or NULL */
    PyObject *weakrefs;
} TrainerObject;

/* ---- helpers ---- */

static const char CLOSING[] = "close()"; /* busy while close() frees the trainer */

/* Gives the trainer back (the end of every call that claimed it). */
static void end_call(TrainerObject *self) {
    pthread_mutex_lock(&self->mu);
    if (self->busy == CLOSING) self->closing = 0;
    self->busy = NULL;
    pthread_cond_broadcast(&self->idle);
    pthread_mutex_unlock(&self->mu);
}

/* Claims the trainer for the call named what ("export()"). 0, or -1 with RuntimeError (another call
 * holds it) or ValueError (closed, or being closed). The GIL is held. */
static int begin_call(TrainerObject *self, const char *what) {
    pthread_mutex_lock(&self->mu);
    const char *running = self->closing ? CLOSING : self->busy;
    int same = running && self->owner == PyThread_get_thread_ident();
    if (!running) {
        self->busy = what;
        self->owner = PyThread_get_thread_ident();
    }
    pthread_mutex_unlock(&self->mu);
    if (running == CLOSING) {
        PyErr_Format(PyExc_ValueError, "%s: the trainer is closed (close() is freeing it)", what);
        return -1;
    }
    if (running) {
        PyErr_Format(PyExc_RuntimeError, "%s: the trainer is busy in %s (%s); one call at a time per trainer", what,
                     running, same ? "this thread's call, from a callback of it" : "called from another thread");
        return -1;
    }
    if (!self->t) {
        end_call(self);
        PyErr_Format(PyExc_ValueError, "%s: the trainer is closed", what);
        return -1;
    }
    return 0;
}

/* The body of a method: call, with the trainer claimed as what for its length. */
#define CLAIMED(self, what, call)                    \
    do {                                             \
        if (begin_call(self, what)) return NULL;     \
        PyObject *claimed_result_ = (call);          \
        end_call(self);                              \
        return claimed_result_;                      \
    } while (0)

/* Signals masked in the stepping thread during a call that runs with the GIL released. */
typedef struct {
    PyThreadState *ts;
    sigset_t old;
} released;

static void release(released *r) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &s, &r->old);
    r->ts = PyEval_SaveThread();
}

/* Takes the GIL back, unmasks (a pending SIGINT runs Python's C handler now), then runs Python's
 * handlers and re-raises what the log callback raised. Returns 0, or -1 with an exception set. */
static int reacquire(TrainerObject *self, released *r) {
    PyEval_RestoreThread(r->ts);
    pthread_sigmask(SIG_SETMASK, &r->old, NULL);
    if (self->cb_error) {
        PyObject *e = self->cb_error;
        self->cb_error = NULL;
        PyErr_Restore(PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2));
        Py_INCREF(PyTuple_GET_ITEM(e, 0)); /* PyErr_Restore stole them; the tuple still holds its own */
        Py_XINCREF(PyTuple_GET_ITEM(e, 1));
        Py_XINCREF(PyTuple_GET_ITEM(e, 2));
        Py_DECREF(e);
        return -1;
    }
    return PyErr_CheckSignals();
}

/* The log hook: runs on the stepping thread, which holds no GIL. */
static void log_hook(void *ctx, const char *json) {
    TrainerObject *self = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    if (self->log_cb && !self->cb_error) {
        PyObject *cb = Py_NewRef(self->log_cb); /* set_log_callback from another thread may replace it */
        PyObject *mod = PyImport_ImportModule("json"), *rec = NULL, *res = NULL;
        if (mod) rec = PyObject_CallMethod(mod, "loads", "s", json);
        if (rec) res = PyObject_CallOneArg(cb, rec);
        Py_DECREF(cb);
        Py_XDECREF(mod);
        Py_XDECREF(rec);
        Py_XDECREF(res);
        if (!res) { /* kept for the end of the call: the step itself goes on */
            PyObject *ty, *va, *tb;
            PyErr_Fetch(&ty, &va, &tb);
            PyErr_NormalizeException(&ty, &va, &tb);
            self->cb_error = PyTuple_Pack(3, ty, va ? va : Py_None, tb ? tb : Py_None);
            Py_XDECREF(ty);
            Py_XDECREF(va);
            Py_XDECREF(tb);
        }
    }
    PyGILState_Release(g);
}

/* A C-contiguous buffer of obj with itemsize bytes per element and shape [rows][cols]; rows < 0:
 * any multiple of `multiple`. kind names the argument in errors. */
static int get_matrix(PyObject *obj, Py_buffer *b, Py_ssize_t itemsize, const char *formats, Py_ssize_t rows,
                      Py_ssize_t multiple, Py_ssize_t cols, const char *kind) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (b->itemsize != itemsize || !strchr(formats, *f) || f[1]) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s elements, got format '%s' (itemsize %zd)", kind,
                     itemsize == 4 ? "int32" : "uint8/bool", b->format ? b->format : "B", b->itemsize);
        goto bad;
    }
    if (b->ndim != 2 || b->shape[1] != cols || (rows >= 0 ? b->shape[0] != rows : b->shape[0] % multiple != 0 || b->shape[0] == 0)) {
        if (rows >= 0)
            PyErr_Format(PyExc_ValueError, "%s: expected shape (%zd, %zd) (rows = micro_batch x grad_accum x GPUs, "
                         "seq_len + 1), got %d dimensions%s", kind, rows, cols, b->ndim,
                         b->ndim == 2 ? "" : "");
        else
            PyErr_Format(PyExc_ValueError, "%s: expected shape (k x %zd, %zd) (micro_batch rows, seq_len + 1)", kind,
                         multiple, cols);
        if (b->ndim == 2) {
            PyObject *ty, *va, *tb;
            PyErr_Fetch(&ty, &va, &tb);
            PyErr_Format(ty, "%S, got (%zd, %zd)", va, b->shape[0], b->shape[1]);
            Py_XDECREF(ty);
            Py_XDECREF(va);
            Py_XDECREF(tb);
        }
        goto bad;
    }
    return 0;
bad:
    PyBuffer_Release(b);
    return -1;
}

/* tokens (and mask when not None) as buffers for a batch of `rows` rows (rows < 0: a multiple of the
 * micro-batch). Returns 0, or -1 with an exception (nothing held). */
static int get_batch(TrainerObject *self, PyObject *tokens, PyObject *mask, Py_ssize_t rows, Py_buffer *tb,
                     Py_buffer *mb, int *has_mask) {
    qtrain_info in;
    qtrain_get_info(self->t, &in);
    if (get_matrix(tokens, tb, 4, "ilI", rows, in.micro_batch, in.seq_len + 1, "tokens")) return -1;
    *has_mask = mask && mask != Py_None;
    if (*has_mask && get_matrix(mask, mb, 1, "?BbcC", tb->shape[0], 1, in.seq_len + 1, "mask")) {
        PyBuffer_Release(tb);
        return -1;
    }
    return 0;
}

static PyObject *result_dict(const qtrain_step_result *r) {
    PyObject *d = Py_BuildValue("{s:l,s:f,s:f,s:f,s:d}", "step", r->step, "loss", (double)r->loss, "grad_norm",
                                (double)r->grad_norm, "lr", (double)r->lr, "tokens_per_s", r->tokens_per_s);
    if (d && r->evaluated) {
        PyObject *v = PyFloat_FromDouble(r->eval_loss);
        if (!v || PyDict_SetItemString(d, "eval_loss", v)) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (d && PyDict_SetItemString(d, "saved", r->saved ? Py_True : Py_False)) Py_CLEAR(d);
    return d;
}

/* ---- Trainer ---- */

static int Trainer_init(TrainerObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"config", "overrides", "resume", "allow_changed", "export_only", "config_is_text", "home",
                             NULL};
    PyObject *config = Py_None, *overrides = Py_None;
    const char *resume = NULL, *allow = NULL, *home = NULL;
    int export_only = 0, is_text = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOzzppz:Trainer", kwlist, &config, &overrides, &resume, &allow,
                                     &export_only, &is_text, &home))
        return -1;
    if (self->t) {
        PyErr_SetString(PyExc_RuntimeError, "Trainer.__init__ called twice");
        return -1;
    }
    if (config != Py_None && !PyUnicode_Check(config)) {
        PyErr_SetString(PyExc_TypeError, "config: expected a YAML path or YAML text (str)");
        return -1;
    }
    PyObject *items = NULL;
    Py_ssize_t n = 0;
    const char **ov = NULL;
    int rc = -1;
    if (overrides != Py_None) { /* a sequence of "key=value" strings (__init__.py turns a dict into one) */
        items = PySequence_Fast(overrides, "overrides: expected a sequence of \"key=value\" strings");
        if (!items) return -1;
        n = PySequence_Fast_GET_SIZE(items);
        ov = PyMem_Calloc(n ? n : 1, sizeof *ov);
        if (!ov) {
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (!(ov[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(items, i)))) goto out;
    }
    qtrain_options o = {config == Py_None ? NULL : PyUnicode_AsUTF8(config), is_text, ov, (int)n, resume, allow,
                        export_only, home}; /* home: the user's home directory, named by the Python wrapper */
    if (config != Py_None && !o.config) goto out;
    char err[4096];
    qtrain_trainer *t = NULL;
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qtrain_open(&o, &t, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (st) {
        raise_status(st, err);
        goto out;
    }
    self->t = t;
    qtrain_set_log_callback(t, log_hook, self);
    rc = 0;
out:
    PyMem_Free(ov);
    Py_XDECREF(items);
    return rc;
}

static PyObject *Trainer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    TrainerObject *self = (TrainerObject *)PyType_GenericNew(type, args, kw);
    if (self && (pthread_mutex_init(&self->mu, NULL) || pthread_cond_init(&self->idle, NULL))) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

/* Waits (GIL released) until no call holds the trainer, then claims it for close(); meanwhile new calls
 * are refused as on a closed trainer, so a thread calling in a loop cannot keep close() waiting. From
 * inside the call that holds it (a callback on its thread) it raises instead: waiting would never end. */
static int claim_for_close(TrainerObject *self) {
    unsigned long me = PyThread_get_thread_ident();
    pthread_mutex_lock(&self->mu);
    if (self->busy && self->owner == me) {
        const char *running = self->busy;
        pthread_mutex_unlock(&self->mu);
        PyErr_Format(PyExc_RuntimeError, "close(): called from a callback of %s on the same thread; close the "
                     "trainer once %s has returned", running, running);
        return -1;
    }
    if (!self->busy) {
        self->busy = CLOSING;
        self->owner = me;
        pthread_mutex_unlock(&self->mu);
        return 0;
    }
    self->closing = 1; /* the running call is the last one before close() */
    pthread_mutex_unlock(&self->mu);
    Py_BEGIN_ALLOW_THREADS /* mu is never held while taking the GIL: begin_call takes mu holding it */
    pthread_mutex_lock(&self->mu);
    while (self->busy) pthread_cond_wait(&self->idle, &self->mu);
    self->busy = CLOSING;
    self->owner = me;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return 0;
}

static PyObject *Trainer_close(TrainerObject *self, PyObject *unused) {
    (void)unused;
    if (claim_for_close(self)) return NULL;
    if (self->t && self->views) {
        end_call(self);
        return PyErr_Format(PyExc_RuntimeError, "close(): %zd DLPack gradient view%s of this trainer %s alive (tensors "
                            "over its GPU memory): delete them first; the trainer stays open", self->views,
                            self->views == 1 ? "" : "s", self->views == 1 ? "is" : "are");
    }
    char err[4096];
    qtrain_status st = QTRAIN_OK;
    qtrain_trainer *t = self->t;
    self->t = NULL;
    if (t) {
        Py_BEGIN_ALLOW_THREADS
        st = qtrain_close(t, err, sizeof err);
        Py_END_ALLOW_THREADS
    }
    end_call(self);
    if (st) return raise_status(st, err);
    Py_RETURN_NONE;
}

/* No call can hold the trainer here: a call holds a reference to it, and so does each DLPack view. */
static void Trainer_dealloc(TrainerObject *self) {
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    if (self->t) {
        char err[4096];
        if (qtrain_close(self->t, err, sizeof err)) fprintf(stderr, "qtrain: closing a trainer: %s\n", err);
        self->t = NULL;
    }
    Py_CLEAR(self->log_cb);
    Py_CLEAR(self->cb_error);
    pthread_cond_destroy(&self->idle);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* step / backward: from the loader (tokens None) or the caller's batch. update 1: the whole step. */
static PyObject *run_step(TrainerObject *self, PyObject *args, PyObject *kw, int update) {
    static char *kwlist[] = {"tokens", "mask", NULL};
    PyObject *tokens = Py_None, *mask = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", kwlist, &tokens, &mask)) return NULL;
    Py_buffer tb, mb;
    int has_mask = 0, given = tokens != Py_None;
    if (!given && mask != Py_None) {
        PyErr_SetString(PyExc_ValueError, "mask given without tokens (the loader's shards carry their own masks)");
        return NULL;
    }
    if (given) {
        qtrain_info in;
        qtrain_get_info(self->t, &in);
        if (get_batch(self, tokens, mask, in.rows, &tb, &mb, &has_mask)) return NULL;
    }
    qtrain_step_result r;
    qtrain_status st;
    released rel;
    release(&rel);
    if (given) st = qtrain_backward_tokens(self->t, tb.buf, has_mask ? mb.buf : NULL);
    else st = qtrain_backward(self->t);
    if (st == QTRAIN_OK && update) st = qtrain_update(self->t, &r);
    int sig = reacquire(self, &rel);
    if (given) PyBuffer_Release(&tb);
    if (has_mask) PyBuffer_Release(&mb);
    if (st) {
        PyErr_Clear(); /* the trainer's error wins over a pending KeyboardInterrupt: it is raised next time */
        return raise_status(st, qtrain_error(self->t));
    }
    if (sig) return NULL;
    if (!update) Py_RETURN_NONE;
    return result_dict(&r);
}

static PyObject *Trainer_step(TrainerObject *self, PyObject *args, PyObject *kw) {
    CLAIMED(self, "step()", run_step(self, args, kw, 1));
}
static PyObject *Trainer_backward(TrainerObject *self, PyObject *args, PyObject *kw) {
    CLAIMED(self, "backward()", run_step(self, args, kw, 0));
}

static PyObject *update_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    qtrain_step_result r;
    released rel;
    release(&rel);
    qtrain_status st = qtrain_update(self->t, &r);
    int sig = reacquire(self, &rel);
    if (st) {
        PyErr_Clear();
        return raise_status(st, qtrain_error(self->t));
    }
    return sig ? NULL : result_dict(&r);
}

static PyObject *Trainer_update(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "update()", update_impl(self, unused));
}

static PyObject *eval_impl(TrainerObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "mask", NULL};
    PyObject *tokens = Py_None, *mask = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", kwlist, &tokens, &mask)) return NULL;
    Py_buffer tb, mb;
    int has_mask = 0, given = tokens != Py_None;
    if (given && get_batch(self, tokens, mask, -1, &tb, &mb, &has_mask)) return NULL;
    float loss = 0;
    qtrain_status st;
    released rel;
    release(&rel);
    if (given) st = qtrain_eval_tokens(self->t, tb.buf, has_mask ? mb.buf : NULL, (int)tb.shape[0], &loss);
    else st = qtrain_eval(self->t, &loss);
    int sig = reacquire(self, &rel);
    if (given) PyBuffer_Release(&tb);
    if (has_mask) PyBuffer_Release(&mb);
    if (st) {
        PyErr_Clear();
        return raise_status(st, qtrain_error(self->t));
    }
    return sig ? NULL : PyFloat_FromDouble(loss);
}

static PyObject *Trainer_eval(TrainerObject *self, PyObject *args, PyObject *kw) {
    CLAIMED(self, "eval()", eval_impl(self, args, kw));
}

/* (tokens bytes, mask bytes, rows, cols): the Python layer makes numpy arrays of them. */
static PyObject *next_batch_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    qtrain_info in;
    qtrain_get_info(self->t, &in);
    Py_ssize_t n = (Py_ssize_t)in.rows * (in.seq_len + 1);
    PyObject *tok = PyBytes_FromStringAndSize(NULL, n * 4), *mask = PyBytes_FromStringAndSize(NULL, n);
    if (!tok || !mask) goto bad;
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qtrain_next_batch(self->t, (int32_t *)PyBytes_AS_STRING(tok), (uint8_t *)PyBytes_AS_STRING(mask));
    Py_END_ALLOW_THREADS
    if (st) {
        raise_status(st, qtrain_error(self->t));
        goto bad;
    }
    return Py_BuildValue("(NNii)", tok, mask, in.rows, in.seq_len + 1);
bad:
    Py_XDECREF(tok);
    Py_XDECREF(mask);
    return NULL;
}

static PyObject *Trainer_next_batch(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "next_batch()", next_batch_impl(self, unused));
}

static PyObject *save_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    char path[4200];
    qtrain_status st;
    released rel;
    release(&rel);
    st = qtrain_save(self->t, path, sizeof path);
    int sig = reacquire(self, &rel);
    if (st) {
        PyErr_Clear();
        return raise_status(st, qtrain_error(self->t));
    }
    return sig ? NULL : PyUnicode_FromString(path);
}

static PyObject *Trainer_save(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "save()", save_impl(self, unused));
}

static PyObject *export_impl(TrainerObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dir", "dtype", NULL};
    const char *dir, *dtype = "bf16";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|s", kwlist, &dir, &dtype)) return NULL;
    if (strcmp(dtype, "bf16") && strcmp(dtype, "fp32"))
        return PyErr_Format(PyExc_ValueError, "export: dtype \"%s\", expected \"bf16\" or \"fp32\"", dtype);
    int bf16 = !strcmp(dtype, "bf16");
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qtrain_export(self->t, dir, bf16);
    Py_END_ALLOW_THREADS
    if (st) return raise_status(st, qtrain_error(self->t));
    Py_RETURN_NONE;
}

static PyObject *Trainer_export(TrainerObject *self, PyObject *args, PyObject *kw) {
    CLAIMED(self, "export()", export_impl(self, args, kw));
}

static PyObject *info_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    qtrain_info i;
    qtrain_get_info(self->t, &i);
    return Py_BuildValue("{s:l,s:l,s:i,s:i,s:i,s:i,s:i,s:n,s:n,s:s,s:s}", "step", i.step, "steps", i.steps, "rows",
                         i.rows, "seq_len", i.seq_len, "micro_batch", i.micro_batch, "vocab_size", i.vocab_size, "ranks",
                         i.ranks, "numel", (Py_ssize_t)i.numel, "n_params", (Py_ssize_t)i.n_params, "engine", i.engine,
                         "run_dir", i.run_dir);
}

static PyObject *Trainer_info(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "info()", info_impl(self, unused));
}

/* [(name, shape tuple, offset)] in layout order. */
static PyObject *tensors_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    qtrain_info in;
    qtrain_get_info(self->t, &in);
    PyObject *l = PyList_New(in.n_tensors);
    for (int i = 0; l && i < in.n_tensors; i++) {
        qtrain_tensor tt;
        qtrain_tensor_at(self->t, i, &tt);
        PyObject *shape = tt.ndim == 2 ? Py_BuildValue("(LL)", (long long)tt.shape[0], (long long)tt.shape[1])
                                       : Py_BuildValue("(L)", (long long)tt.shape[0]);
        PyObject *e = shape ? Py_BuildValue("(sNn)", tt.name, shape, (Py_ssize_t)tt.offset) : NULL;
        if (!e) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, e);
    }
    return l;
}

static PyObject *Trainer_tensors(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "tensors()", tensors_impl(self, unused));
}

/* Fills a writable float32 buffer of info.numel elements with the weights (which 0) or gradients. */
static PyObject *read_flat(TrainerObject *self, PyObject *arg, int grads) {
    qtrain_info in;
    qtrain_get_info(self->t, &in);
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    if (b.itemsize != 4 || !b.format || strcmp(b.format, "f") || b.len != (Py_ssize_t)(in.numel * 4)) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "expected a writable float32 buffer of %zu elements", in.numel);
    }
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = grads ? qtrain_get_gradients(self->t, b.buf) : qtrain_get_weights(self->t, b.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (st) return raise_status(st, qtrain_error(self->t));
    Py_RETURN_NONE;
}

static PyObject *Trainer_read_weights(TrainerObject *self, PyObject *arg) {
    CLAIMED(self, "parameters()", read_flat(self, arg, 0));
}
static PyObject *Trainer_read_gradients(TrainerObject *self, PyObject *arg) {
    CLAIMED(self, "gradients()", read_flat(self, arg, 1));
}

/* ---- DLPack (dlpack.h v0.8's ABI, the part a producer needs: DLManagedTensor and what it holds) ---- */

typedef struct {
    int32_t device_type; /* kDLCUDA = 2 */
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code; /* kDLFloat = 2 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: C-contiguous */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx; /* the TrainerObject, kept alive while the tensor is */
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    DLManagedTensor m;
    int64_t shape[2];
} grad_view;

/* Called by the consumer (any thread) when its tensor dies, or by the capsule when never consumed. */
static void grad_view_deleter(DLManagedTensor *m) {
    PyGILState_STATE g = PyGILState_Ensure();
    ((TrainerObject *)m->manager_ctx)->views--;
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyMem_RawFree(m);
    PyGILState_Release(g);
}

static void capsule_destructor(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor")) return; /* consumed: renamed "used_dltensor", the consumer deletes */
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m) m->deleter(m);
}

/* A "dltensor" capsule of one tensor's device gradients (no copy), keeping the trainer alive. */
static PyObject *grad_dlpack_impl(TrainerObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    qtrain_device_tensor d;
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qtrain_gradient_device(self->t, name, &d);
    Py_END_ALLOW_THREADS
    if (st) return raise_status(st, qtrain_error(self->t));
    grad_view *v = PyMem_RawCalloc(1, sizeof *v);
    if (!v) return PyErr_NoMemory();
    v->shape[0] = d.shape[0];
    v->shape[1] = d.shape[1];
    v->m.dl_tensor = (DLTensor){d.data, {2, d.device}, d.ndim, {2, 32, 1}, v->shape, NULL, 0};
    v->m.manager_ctx = Py_NewRef((PyObject *)self);
    v->m.deleter = grad_view_deleter;
    self->views++;
    PyObject *cap = PyCapsule_New(&v->m, "dltensor", capsule_destructor);
    if (!cap) grad_view_deleter(&v->m);
    return cap;
}

static PyObject *Trainer_grad_dlpack(TrainerObject *self, PyObject *arg) {
    CLAIMED(self, "gradients(device=True)", grad_dlpack_impl(self, arg));
}

/* The device address of a tensor's gradients (for tests: torch's data_ptr must equal it). */
static PyObject *grad_device_ptr_impl(TrainerObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    qtrain_device_tensor d;
    qtrain_status st = qtrain_gradient_device(self->t, name, &d);
    if (st) return raise_status(st, qtrain_error(self->t));
    return PyLong_FromVoidPtr(d.data);
}

static PyObject *Trainer_grad_device_ptr(TrainerObject *self, PyObject *arg) {
    CLAIMED(self, "_grad_device_ptr()", grad_device_ptr_impl(self, arg));
}

static PyObject *set_parameter_impl(TrainerObject *self, PyObject *args) {
    const char *name;
    PyObject *arr;
    if (!PyArg_ParseTuple(args, "sO:set_parameter", &name, &arr)) return NULL;
    int idx = qtrain_tensor_find(self->t, name);
    if (idx < 0) return PyErr_Format(PyExc_KeyError, "no tensor \"%s\" in this model", name);
    qtrain_tensor tt;
    qtrain_tensor_at(self->t, idx, &tt);
    Py_buffer b;
    if (PyObject_GetBuffer(arr, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    int shape_ok = b.ndim == tt.ndim;
    for (int d = 0; shape_ok && d < tt.ndim; d++) shape_ok = b.shape[d] == tt.shape[d];
    if (b.itemsize != 4 || !b.format || strcmp(b.format, "f") || !shape_ok) {
        PyObject *want = tt.ndim == 2 ? PyUnicode_FromFormat("(%lld, %lld)", (long long)tt.shape[0], (long long)tt.shape[1])
                                      : PyUnicode_FromFormat("(%lld,)", (long long)tt.shape[0]);
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous float32 array of shape %U, got format '%s', %d "
                     "dimensions, %zd bytes", name, want, b.format ? b.format : "B", b.ndim, b.len);
        Py_XDECREF(want);
        PyBuffer_Release(&b);
        return NULL;
    }
    qtrain_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qtrain_set_parameter(self->t, name, b.buf, tt.numel);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (st) return raise_status(st, qtrain_error(self->t));
    Py_RETURN_NONE;
}

static PyObject *Trainer_set_parameter(TrainerObject *self, PyObject *args) {
    CLAIMED(self, "set_parameter()", set_parameter_impl(self, args));
}

static PyObject *plan_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    size_t n = qtrain_plan(self->t, NULL, 0);
    char *buf = PyMem_Malloc(n + 1);
    if (!buf) return PyErr_NoMemory();
    qtrain_plan(self->t, buf, n + 1);
    PyObject *s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    PyMem_Free(buf);
    return s;
}

static PyObject *Trainer_plan(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "plan()", plan_impl(self, unused));
}

static PyObject *devices_impl(TrainerObject *self, PyObject *unused) {
    (void)unused;
    int ids[64], n = qtrain_devices(self->t, ids, 64);
    PyObject *l = PyList_New(n < 64 ? n : 64);
    for (int i = 0; l && i < n && i < 64; i++) PyList_SET_ITEM(l, i, PyLong_FromLong(ids[i]));
    return l;
}

static PyObject *Trainer_devices(TrainerObject *self, PyObject *unused) {
    CLAIMED(self, "devices()", devices_impl(self, unused));
}

static PyObject *set_lr_impl(TrainerObject *self, PyObject *arg) {
    double lr = arg == Py_None ? -1.0 : PyFloat_AsDouble(arg);
    if (lr == -1.0 && PyErr_Occurred()) return NULL;
    if (arg != Py_None && !(lr >= 0)) return PyErr_Format(PyExc_ValueError, "set_lr: expected a number >= 0 or None");
    qtrain_set_lr(self->t, (float)lr);
    Py_RETURN_NONE;
}

static PyObject *Trainer_set_lr(TrainerObject *self, PyObject *arg) {
    CLAIMED(self, "set_lr()", set_lr_impl(self, arg));
}

static PyObject *Trainer_set_log_callback(TrainerObject *self, PyObject *arg) {
    if (arg != Py_None && !PyCallable_Check(arg)) return PyErr_Format(PyExc_TypeError, "log callback: expected a callable or None");
    Py_XINCREF(arg == Py_None ? NULL : arg);
    Py_XSETREF(self->log_cb, arg == Py_None ? NULL : arg);
    Py_RETURN_NONE;
}

static PyObject *Trainer_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *Trainer_exit(TrainerObject *self, PyObject *args) {
    (void)args;
    PyObject *r = Trainer_close(self, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *Trainer_closed(TrainerObject *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(self->t == NULL);
}

static PyMethodDef Trainer_methods[] = {
    {"close", (PyCFunction)Trainer_close, METH_NOARGS,
     "close()\n--\n\nWaits for a checkpoint write in flight, releases the run directory and frees the trainer "
     "(GPU memory included). Idempotent."},
    {"step", (PyCFunction)(void (*)(void))Trainer_step, METH_VARARGS | METH_KEYWORDS,
     "step(tokens=None, mask=None)\n--\n\nOne optimizer step; returns {step, loss, grad_norm, lr, tokens_per_s, saved"
     "[, eval_loss]}. tokens: int32 (rows, seq_len + 1) or None for the configured loader; mask: uint8/bool like "
     "tokens (0 = not a target). The GIL is released; Ctrl-C raises KeyboardInterrupt after the step."},
    {"backward", (PyCFunction)(void (*)(void))Trainer_backward, METH_VARARGS | METH_KEYWORDS,
     "backward(tokens=None, mask=None)\n--\n\nThe first half of a step: forward + backward of its micro-batches. "
     "Gradients are then readable until update()."},
    {"update", (PyCFunction)Trainer_update, METH_NOARGS,
     "update()\n--\n\nThe second half of a step (AdamW, log, eval, checkpoint per the config); returns step()'s dict."},
    {"eval", (PyCFunction)(void (*)(void))Trainer_eval, METH_VARARGS | METH_KEYWORDS,
     "eval(tokens=None, mask=None)\n--\n\nMean loss, no gradients: over data.eval (eval.batches batches) or over the "
     "given rows (a multiple of micro_batch)."},
    {"_next_batch", (PyCFunction)Trainer_next_batch, METH_NOARGS,
     "_next_batch()\n--\n\n(tokens int32 bytes, mask uint8 bytes, rows, cols) of the loader's next step batch."},
    {"_save", (PyCFunction)Trainer_save, METH_NOARGS, "_save()\n--\n\nCheckpoint into checkpoint.dir; returns the path."},
    {"export", (PyCFunction)(void (*)(void))Trainer_export, METH_VARARGS | METH_KEYWORDS,
     "export(dir, dtype=\"bf16\")\n--\n\nHF export (model.safetensors, config.json, tokenizer files) of the current "
     "weights."},
    {"info", (PyCFunction)Trainer_info, METH_NOARGS, "info()\n--\n\nA dict: step, steps, rows, seq_len, micro_batch, "
     "vocab_size, ranks, numel, n_params, engine, run_dir."},
    {"tensors", (PyCFunction)Trainer_tensors, METH_NOARGS,
     "tensors()\n--\n\n[(name, shape, offset)] of every parameter tensor, offsets into the flat arrays."},
    {"_read_weights", (PyCFunction)Trainer_read_weights, METH_O, "Fills a float32 buffer [numel] with the weights."},
    {"_read_gradients", (PyCFunction)Trainer_read_gradients, METH_O, "Fills a float32 buffer [numel] with the gradients."},
    {"_grad_dlpack", (PyCFunction)Trainer_grad_dlpack, METH_O,
     "_grad_dlpack(name)\n--\n\nA DLPack capsule of the tensor's device gradients (one GPU)."},
    {"_grad_device_ptr", (PyCFunction)Trainer_grad_device_ptr, METH_O,
     "_grad_device_ptr(name)\n--\n\nThe device address of the tensor's gradients (one GPU)."},
    {"set_parameter", (PyCFunction)Trainer_set_parameter, METH_VARARGS,
     "set_parameter(name, array)\n--\n\nWrites one tensor's weights from a C-contiguous float32 array of its shape "
     "(buffer protocol); the optimizer state is kept."},
    {"plan", (PyCFunction)Trainer_plan, METH_NOARGS, "plan()\n--\n\nThe memory plan as text."},
    {"devices", (PyCFunction)Trainer_devices, METH_NOARGS,
     "devices()\n--\n\nThe CUDA device of each rank ([] on the CPU engine)."},
    {"set_lr", (PyCFunction)Trainer_set_lr, METH_O,
     "set_lr(lr)\n--\n\nA constant learning rate for the following steps; None returns to the schedule."},
    {"set_log_callback", (PyCFunction)Trainer_set_log_callback, METH_O,
     "set_log_callback(fn)\n--\n\nfn(record: dict) for every record the run logs (train, eval, ckpt); None removes it. "
     "An exception it raises is raised by the call that logged."},
    {"__enter__", (PyCFunction)Trainer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Trainer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Trainer_getset[] = {
    {"closed", (getter)Trainer_closed, NULL, "True once close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TrainerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "qtrain._qtrain.Trainer",
    .tp_basicsize = sizeof(TrainerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Trainer(config, overrides=None, resume=None, allow_changed=None, export_only=False, config_is_text=False)\n"
              "--\n\nA qtrain run: the C trainer of include/qtrain.h.",
    .tp_new = Trainer_new,
    .tp_init = (initproc)Trainer_init,
    .tp_dealloc = (destructor)Trainer_dealloc,
    .tp_methods = Trainer_methods,
    .tp_getset = Trainer_getset,
    .tp_weaklistoffset = offsetof(TrainerObject, weakrefs),
};

/* ---- module ---- */

static int add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *base, int code, const char *doc) {
    char full[64];
    snprintf(full, sizeof full, "qtrain.%s", name);
    *slot = PyErr_NewExceptionWithDoc(full, doc, base, NULL);
    if (!*slot || PyModule_AddObjectRef(m, name, *slot)) return -1;
    PyObject *c = PyLong_FromLong(code);
    int rc = c ? PyObject_SetAttrString(*slot, "code", c) : -1;
    Py_XDECREF(c);
    return rc;
}

static int exec_module(PyObject *m) {
    if (PyType_Ready(&TrainerType) < 0 || PyModule_AddObjectRef(m, "Trainer", (PyObject *)&TrainerType)) return -1;
    PyObject *argbase = NULL;
    int rc = add_exc(m, &Error, "Error", PyExc_Exception, QTRAIN_ERR_INTERNAL, "Base of qtrain's errors; str() is the C message.");
    rc = rc ? rc : add_exc(m, &ConfigError, "ConfigError", Error, QTRAIN_ERR_CONFIG, "The config (file:line:col: key: ...).");
    rc = rc ? rc : add_exc(m, &DataError, "DataError", Error, QTRAIN_ERR_DATA, "A token shard.");
    rc = rc ? rc : add_exc(m, &CheckpointError, "CheckpointError", Error, QTRAIN_ERR_CHECKPOINT,
                           "checkpoint.dir, a checkpoint to resume, a checkpoint write.");
    rc = rc ? rc : add_exc(m, &DeviceError, "DeviceError", Error, QTRAIN_ERR_DEVICE,
                           "A CUDA call or a GPU thread failed: close the trainer, resume from a checkpoint.");
    rc = rc ? rc : add_exc(m, &DivergedError, "DivergedError", Error, QTRAIN_ERR_DIVERGED, "NaN/Inf loss or weights.");
    rc = rc ? rc : add_exc(m, &OutputError, "OutputError", Error, QTRAIN_ERR_IO, "log.file or an export could not be written.");
    if (!rc) argbase = PyTuple_Pack(2, Error, PyExc_ValueError);
    rc = rc || !argbase ? -1 : add_exc(m, &ArgumentError, "ArgumentError", argbase, QTRAIN_ERR_ARGUMENT,
                                       "A bad argument (a token or mask value, a NaN/Inf weight, a shape, a name) "
                                       "or a call out of order.");
    Py_XDECREF(argbase);
    return rc;
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, .m_name = "qtrain._qtrain", .m_doc = "qtrain's C extension (use the qtrain package).",
    .m_size = 0, .m_slots = slots,
};

PyMODINIT_FUNC PyInit__qtrain(void) { return PyModuleDef_Init(&moduledef); }
