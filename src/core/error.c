/* error.c — the one error family (qt_error.h): qt_fail, the per-thread catch points, the abort hooks and
 * qt_errf. Depends on nothing but libc; the CUDA, cuBLASLt and cuDNN status decoders behind QT_CUDA,
 * QT_CUBLAS and QT_CUDNN are cuda/error.c's. */
#include "qt_error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local int g_rank = -1;
static _Thread_local qt_catch *g_catch; /* innermost catch point of this thread */
static void (*g_hooks[8])(void);
static int g_nhooks;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void qt_error_set_rank(int rank) { g_rank = rank; }

void qt_error_add_abort_hook(void (*hook)(void)) {
    pthread_mutex_lock(&g_lock);
    if (g_nhooks < 8) g_hooks[g_nhooks++] = hook;
    pthread_mutex_unlock(&g_lock);
}

void qt_catch_push(qt_catch *c) {
    c->prev = g_catch;
    c->kind = 0;
    c->msg[0] = 0;
    g_catch = c;
}

void qt_catch_pop(qt_catch *c) {
    QT_CHECK(g_catch == c, "catch points popped out of order");
    g_catch = c->prev;
}

static void run_hooks(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_nhooks;
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++) g_hooks[i]();
}

/* The message of this thread's failure in progress (formatted before the jump or the exit). */
static _Thread_local char g_msg[1024];

/* Jumps to this thread's innermost catch point with g_msg, or prints it and exits the process: one
 * thread reports and exits; a second failing thread without a catch point waits here for the exit. */
__attribute__((noreturn)) static void fail_end(qt_err_kind kind) {
    qt_catch *c = g_catch;
    if (c) {
        g_catch = c->prev;
        c->kind = kind;
        snprintf(c->msg, sizeof c->msg, "%s", g_msg);
        run_hooks();
        longjmp(c->jb, 1);
    }
    static int failing;
    pthread_mutex_lock(&g_lock);
    if (failing) {
        pthread_mutex_unlock(&g_lock);
        for (;;) pthread_exit(NULL);
    }
    failing = 1;
    pthread_mutex_unlock(&g_lock);
    fprintf(stderr, "qtrain: %s\n", g_msg);
    run_hooks();
    fflush(stdout);
    fflush(stderr);
    exit(1);
}

static void vreport(const char *file, int line, const char *call, const char *fmt, va_list ap) {
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (g_rank >= 0)
        snprintf(g_msg, sizeof g_msg, "[rank %d] %s:%d: %s: %s", g_rank, file, line, call, msg);
    else
        snprintf(g_msg, sizeof g_msg, "%s:%d: %s: %s", file, line, call, msg);
}

void qt_fail(const char *file, int line, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(file, line, call, fmt, ap);
    va_end(ap);
    fail_end(QT_ERR_INTERNAL);
}

void qt_fail_as(qt_err_kind kind, const char *file, int line, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(file, line, call, fmt, ap);
    va_end(ap);
    fail_end(kind);
}

int qt_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}
