/* sync.c — the host rendezvous of comm: monotonic per-rank phase counters, waits that wake on abort,
 * and the registry that lets qt_fail abort every live communicator.
 *
 * Waits spin briefly (ranks usually arrive within microseconds of each other), then sleep on one
 * condition variable per communicator; every post broadcasts under the mutex, so no wake-up is lost. */
#include <errno.h>
#include <sched.h>
#include <time.h>

#include "comm_internal.h"
#include "qt_error.h"

#define QT_COMM_REG_MAX 16
static qt_comm *g_live[QT_COMM_REG_MAX];
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_hook_once = PTHREAD_ONCE_INIT;

static void abort_all_hook(void) {
    /* Runs in the failing thread; trylock so a failure while holding g_reg_mu cannot self-deadlock. */
    int locked = pthread_mutex_trylock(&g_reg_mu) == 0;
    for (int i = 0; i < QT_COMM_REG_MAX; i++)
        if (g_live[i]) qt_comm_abort(g_live[i]);
    if (locked) pthread_mutex_unlock(&g_reg_mu);
}

static void add_hook(void) { qt_error_add_abort_hook(abort_all_hook); }

void qt_comm_register(qt_comm *c) {
    pthread_once(&g_hook_once, add_hook);
    pthread_mutex_lock(&g_reg_mu);
    int i = 0;
    while (i < QT_COMM_REG_MAX && g_live[i]) i++;
    pthread_mutex_unlock(&g_reg_mu);
    QT_CHECK(i < QT_COMM_REG_MAX, "more than %d live communicators", QT_COMM_REG_MAX);
    pthread_mutex_lock(&g_reg_mu);
    g_live[i] = c;
    pthread_mutex_unlock(&g_reg_mu);
}

void qt_comm_unregister(qt_comm *c) {
    pthread_mutex_lock(&g_reg_mu);
    for (int i = 0; i < QT_COMM_REG_MAX; i++)
        if (g_live[i] == c) g_live[i] = NULL;
    pthread_mutex_unlock(&g_reg_mu);
}

void qt_comm_abort(qt_comm *c) {
    atomic_store(&c->aborted, 1);
    if (c->abort_word) *(volatile int *)c->abort_word = 1; /* one-shot kernels waiting on a dead rank return */
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void qt_comm_post(qt_comm *c, int ph, int r, int64_t seq) {
    atomic_store_explicit(&c->posted[ph][r], seq, memory_order_release);
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* The first rank (of all, or only rank `only` when >= 0) whose phase-ph counter is below seq, or -1
 * when they all reached it. */
static int laggard(qt_comm *c, int ph, int64_t seq, int only) {
    for (int j = only < 0 ? 0 : only; j < (only < 0 ? c->n : only + 1); j++)
        if (atomic_load_explicit(&c->posted[ph][j], memory_order_acquire) < seq) return j;
    return -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int qt_comm_wait_all(qt_comm *c, int ph, int r, int64_t seq) { return qt_comm_wait_one(c, ph, r, -1, seq); }

int qt_comm_wait_one(qt_comm *c, int ph, int r, int only, int64_t seq) {
    for (int spin = 0; spin < 4000; spin++) {
        if (atomic_load(&c->aborted)) return -1;
        if (laggard(c, ph, seq, only) < 0) return 0;
        if (spin > 200) sched_yield();
    }
    double t0 = now_s();
    pthread_mutex_lock(&c->mu);
    int j;
    while (!atomic_load(&c->aborted) && (j = laggard(c, ph, seq, only)) >= 0) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 1;
        pthread_cond_timedwait(&c->cv, &c->mu, &dl);
        if (c->timeout_s > 0 && now_s() - t0 > c->timeout_s) {
            long long got = (long long)atomic_load(&c->posted[ph][j]);
            pthread_mutex_unlock(&c->mu);
            int sh = ph >= QT_PH_W ? QT_COMM_STEP_BITS : 0; /* W/R count chunk steps inside a collective */
            QT_CHECK(0, "rank %d waited %.0f s in collective #%lld (phase %c%s) for rank %d, which is at #%lld: "
                     "a rank stopped calling, or ranks call different collectives",
                     r, c->timeout_s, (long long)(seq >> sh), "ABCWR"[ph], sh ? ", host all-gather chunk steps" : "",
                     j, got >> sh);
        }
    }
    int ab = atomic_load(&c->aborted);
    pthread_mutex_unlock(&c->mu);
    return ab ? -1 : 0;
}
