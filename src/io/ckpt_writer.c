/* ckpt_writer.c — checkpoints written on a thread of their own, so training goes on meanwhile.
 *
 * The caller hands over items that stay unchanged until it waits (a snapshot it owns), and optionally
 * live items (an offloaded optimizer state in host memory, qt_ckpt_live) that it keeps updating from
 * element 0 upwards. The thread writes the live items first, range by range ([e0, e1) of each in turn,
 * qt_ckpt_save_pieces: checked, hashed, written), publishing after each range the mark e1 below which
 * the caller may change them again (qt_ckpt_writer_wait_mark); then the other items, fsync, rename,
 * fsync of the directory, retention. One write at a time: a kill at any point leaves the checkpoints
 * already renamed intact, and the temp file is never taken for a checkpoint. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_ckpt.h"
#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_test_hooks.h"

#define WRITER_MAX_ITEMS 32
#define LIVE_PIECE ((size_t)1 << 24) /* elements per range of the live items: 64 MiB of fp32 */

struct qt_ckpt_writer {
    qt_ckpt_check_fn check;
    void *ctx;
    pthread_t thread;
    int in_flight;      /* a thread was started and not joined */
    atomic_int done;    /* set by the thread as its last act */
    /* the progress mark of the live items: SIZE_MAX when no write is in flight or it ended */
    atomic_size_t mark;
    pthread_mutex_t mu;
    pthread_cond_t moved;
    /* the job */
    char dir[4096];
    long step;
    int keep, n, np;
    qt_ckpt_item items[WRITER_MAX_ITEMS];
    qt_ckpt_piece *pieces; /* owned: the write order */
    size_t *mark_at;       /* owned: [np] the mark piece k completes, 0 for none */
    /* its outcome */
    int rc;
    double seconds;
    char err[2048];
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void set_mark(qt_ckpt_writer *w, size_t m) {
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->mark, m);
    pthread_cond_broadcast(&w->moved);
    pthread_mutex_unlock(&w->mu);
}

static int piece_check(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen) {
    qt_ckpt_writer *w = ctx;
    return w->check ? w->check(item, lo, hi, w->ctx, err, errlen) : 0;
}

static void piece_done(void *ctx, int k) {
    qt_ckpt_writer *w = ctx;
    if (!w->mark_at[k]) return;
    long ms = qt_test_hooks_get()->ckpt_write_delay_ms; /* a slow disk, for the tests */
    if (ms > 0) nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
    set_mark(w, w->mark_at[k]);
}

static void *write_job(void *arg) {
    qt_ckpt_writer *w = arg;
    double t0 = mono_s();
    qt_ckpt_piece_fns fns = {piece_check, piece_done, w};
    w->rc = qt_ckpt_save_pieces(w->dir, w->step, w->keep, w->items, w->n, w->pieces, w->np, &fns, w->err, sizeof w->err);
    w->seconds = mono_s() - t0;
    set_mark(w, SIZE_MAX); /* saved or failed: nothing left to wait for */
    atomic_store(&w->done, 1);
    return NULL;
}

qt_ckpt_writer *qt_ckpt_writer_create(qt_ckpt_check_fn check, void *ctx) {
    qt_ckpt_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->check = check;
        w->ctx = ctx;
        atomic_store(&w->mark, SIZE_MAX);
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->moved, NULL);
    }
    return w;
}

/* The write order: the live items range by range (each range's last piece sets the mark), then the
 * rest whole. 0, or -1 with err. */
static int plan_pieces(qt_ckpt_writer *w, const qt_ckpt_live *live, char *err, size_t errlen) {
    int nl = live ? live->n : 0;
    size_t step = live && live->piece ? live->piece : LIVE_PIECE, ranges = nl && live->elems ? (live->elems + step - 1) / step : 0;
    int is_live[WRITER_MAX_ITEMS] = {0};
    size_t es[WRITER_MAX_ITEMS] = {0}, ne[WRITER_MAX_ITEMS] = {0}; /* a live item's bytes per element, elements */
    for (int j = 0; j < nl; j++) {
        int i = live->idx[j];
        if (i >= 0 && i < w->n) es[i] = (size_t)qt_dtype_size(w->items[i].dtype), ne[i] = w->items[i].bytes / es[i];
        if (i < 0 || i >= w->n || is_live[i] || w->items[i].bytes % es[i] || ne[i] > live->elems)
            return qt_errf(err, errlen, "%s: live checkpoint item %d: not an item, a repeat, or more than %zu elements", w->dir,
                           i, live->elems);
        is_live[i] = 1;
    }
    size_t np = ranges * (size_t)nl + (size_t)w->n;
    w->pieces = malloc((np ? np : 1) * sizeof *w->pieces);
    w->mark_at = calloc(np ? np : 1, sizeof *w->mark_at);
    if (!w->pieces || !w->mark_at) return qt_errf(err, errlen, "%s: out of memory for the checkpoint write order", w->dir);
    w->np = 0;
    for (size_t r = 0; r < ranges; r++) {
        size_t e0 = r * step, e1 = e0 + step < live->elems ? e0 + step : live->elems;
        for (int j = 0; j < nl; j++) { /* an item of fewer elements (the weights without the shard's padding) ends early */
            int i = live->idx[j];
            w->pieces[w->np++] = (qt_ckpt_piece){i, (e0 < ne[i] ? e0 : ne[i]) * es[i], (e1 < ne[i] ? e1 : ne[i]) * es[i]};
        }
        w->mark_at[w->np - 1] = e1;
    }
    for (int i = 0; i < w->n; i++)
        if (!is_live[i]) w->pieces[w->np++] = (qt_ckpt_piece){i, 0, w->items[i].bytes};
    return 0;
}

int qt_ckpt_writer_start_live(qt_ckpt_writer *w, const char *dir, long step, int keep, const qt_ckpt_item *items,
                              int n, const qt_ckpt_live *live, char *err, size_t errlen) {
    if (w->in_flight) return qt_errf(err, errlen, "%s: step %ld: a checkpoint write is still in flight", dir, step);
    if (n < 0 || n > WRITER_MAX_ITEMS)
        return qt_errf(err, errlen, "%s: %d checkpoint items, at most %d", dir, n, WRITER_MAX_ITEMS);
    if (snprintf(w->dir, sizeof w->dir, "%s", dir) >= (int)sizeof w->dir)
        return qt_errf(err, errlen, "%s: path too long", dir);
    w->step = step;
    w->keep = keep;
    w->n = n;
    memcpy(w->items, items, (size_t)n * sizeof *items);
    free(w->pieces);
    free(w->mark_at);
    w->pieces = NULL;
    w->mark_at = NULL;
    if (live && (live->n < 0 || live->n > 8)) return qt_errf(err, errlen, "%s: %d live checkpoint items, at most 8", dir, live->n);
    if (plan_pieces(w, live, err, errlen)) return -1;
    w->err[0] = 0;
    atomic_store(&w->done, 0);
    atomic_store(&w->mark, 0); /* before the thread: the caller's next wait sees the write */
    int e = pthread_create(&w->thread, NULL, write_job, w);
    if (e) {
        atomic_store(&w->mark, SIZE_MAX);
        return qt_errf(err, errlen, "%s: cannot start the checkpoint writer thread: %s", dir, strerror(e));
    }
    w->in_flight = 1;
    return 0;
}

int qt_ckpt_writer_start(qt_ckpt_writer *w, const char *dir, long step, int keep, const qt_ckpt_item *items, int n,
                         char *err, size_t errlen) {
    return qt_ckpt_writer_start_live(w, dir, step, keep, items, n, NULL, err, errlen);
}

double qt_ckpt_writer_wait_mark(qt_ckpt_writer *w, size_t hi) {
    if (atomic_load(&w->mark) >= hi) return 0;
    double t0 = mono_s();
    pthread_mutex_lock(&w->mu);
    while (atomic_load(&w->mark) < hi) pthread_cond_wait(&w->moved, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return mono_s() - t0;
}

int qt_ckpt_writer_running(qt_ckpt_writer *w) { return w->in_flight && !atomic_load(&w->done); }

int qt_ckpt_writer_wait(qt_ckpt_writer *w, long *step, double *seconds, char *err, size_t errlen) {
    if (!w->in_flight) return 1;
    pthread_join(w->thread, NULL);
    w->in_flight = 0;
    if (step) *step = w->step;
    if (seconds) *seconds = w->seconds;
    if (w->rc) return qt_errf(err, errlen, "%s", w->err);
    return 0;
}

void qt_ckpt_writer_free(qt_ckpt_writer *w) {
    if (!w) return;
    qt_ckpt_writer_wait(w, NULL, NULL, NULL, 0);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->moved);
    free(w->pieces);
    free(w->mark_at);
    free(w);
}
