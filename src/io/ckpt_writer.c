/* ckpt_writer.c — checkpoints written on a thread of their own, so training goes on meanwhile.
 *
 * The caller hands over items that stay unchanged until it waits (a snapshot it owns); the thread runs
 * the check on each item, then qt_ckpt_save (hash, write the temp file, fsync, rename, fsync the
 * directory, retention). One write at a time: a kill at any point leaves the checkpoints already
 * renamed intact, and the temp file is never taken for a checkpoint. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_ckpt.h"
#include "qt_error.h"

#define WRITER_MAX_ITEMS 32

struct qt_ckpt_writer {
    qt_ckpt_check_fn check;
    void *ctx;
    pthread_t thread;
    int in_flight;      /* a thread was started and not joined */
    atomic_int done;    /* set by the thread as its last act */
    /* the job */
    char dir[4096];
    long step;
    int keep, n;
    qt_ckpt_item items[WRITER_MAX_ITEMS];
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

static void *write_job(void *arg) {
    qt_ckpt_writer *w = arg;
    double t0 = mono_s();
    w->rc = 0;
    for (int i = 0; w->check && i < w->n && w->rc == 0; i++)
        w->rc = w->check(&w->items[i], w->ctx, w->err, sizeof w->err);
    if (w->rc == 0) w->rc = qt_ckpt_save(w->dir, w->step, w->keep, w->items, w->n, w->err, sizeof w->err);
    w->seconds = mono_s() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

qt_ckpt_writer *qt_ckpt_writer_create(qt_ckpt_check_fn check, void *ctx) {
    qt_ckpt_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->check = check;
        w->ctx = ctx;
    }
    return w;
}

int qt_ckpt_writer_start(qt_ckpt_writer *w, const char *dir, long step, int keep, const qt_ckpt_item *items, int n,
                         char *err, size_t errlen) {
    if (w->in_flight) return qt_errf(err, errlen, "%s: step %ld: a checkpoint write is still in flight", dir, step);
    if (n < 0 || n > WRITER_MAX_ITEMS)
        return qt_errf(err, errlen, "%s: %d checkpoint items, at most %d", dir, n, WRITER_MAX_ITEMS);
    if (snprintf(w->dir, sizeof w->dir, "%s", dir) >= (int)sizeof w->dir)
        return qt_errf(err, errlen, "%s: path too long", dir);
    w->step = step;
    w->keep = keep;
    w->n = n;
    memcpy(w->items, items, (size_t)n * sizeof *items);
    w->err[0] = 0;
    atomic_store(&w->done, 0);
    int e = pthread_create(&w->thread, NULL, write_job, w);
    if (e) return qt_errf(err, errlen, "%s: cannot start the checkpoint writer thread: %s", dir, strerror(e));
    w->in_flight = 1;
    return 0;
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
    free(w);
}
