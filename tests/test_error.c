/* test_error.c — the error family (qt_error.h): a failed check inside a catch point comes back to it
 * with the message, kind and rank; catch points nest and are per thread; the abort hooks run once per
 * failure; outside any catch point a failure still prints and exits with status 1 (the CLI's
 * behaviour); the engine calls (src/engine/engine.c) turn an engine's failure into -1 and a message. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qt_engine.h"
#include "qt_error.h"
#include "qt_test.h"

static int g_hook_runs;
static void count_hook(void) { g_hook_runs++; }

static void fail_deep(int depth) {
    if (depth > 0) {
        fail_deep(depth - 1);
        return;
    }
    volatile int two = 2;
    QT_CHECK(two == 3, "arithmetic broke at depth %d", depth);
}

static void test_catch_returns_message(void) {
    qt_catch c;
    volatile int reached_end = 0;
    int hooks0 = g_hook_runs;
    qt_catch_push(&c);
    if (setjmp(c.jb) == 0) {
        fail_deep(5);
        reached_end = 1;
        qt_catch_pop(&c);
    }
    QT_EXPECT(!reached_end, "the failure did not jump");
    QT_EXPECT(c.kind == QT_ERR_INTERNAL, "kind %d", c.kind);
    QT_EXPECT(strstr(c.msg, "test_error.c:") && strstr(c.msg, "two == 3") && strstr(c.msg, "arithmetic broke at depth 0"),
              "message: %s", c.msg);
    QT_EXPECT(g_hook_runs == hooks0 + 1, "abort hooks ran %d times, expected once", g_hook_runs - hooks0);
    /* the catch point was popped by the jump: a second one works the same */
    qt_catch d;
    qt_catch_push(&d);
    if (setjmp(d.jb) == 0) {
        QT_CHECK(0, "second");
        qt_catch_pop(&d);
    }
    QT_EXPECT(strstr(d.msg, "second"), "second message: %s", d.msg);
}

static void test_catch_nests(void) {
    qt_catch outer, inner;
    volatile int inner_caught = 0, outer_caught = 0;
    qt_catch_push(&outer);
    if (setjmp(outer.jb) == 0) {
        qt_catch_push(&inner);
        if (setjmp(inner.jb) == 0) {
            QT_CHECK(0, "inner failure");
            qt_catch_pop(&inner);
        } else {
            inner_caught = 1;
        }
        QT_CHECK(0, "outer failure"); /* the inner point is gone: this goes to the outer one */
        qt_catch_pop(&outer);
    } else {
        outer_caught = 1;
    }
    QT_EXPECT(inner_caught && strstr(inner.msg, "inner failure"), "inner: %s", inner.msg);
    QT_EXPECT(outer_caught && strstr(outer.msg, "outer failure"), "outer: %s", outer.msg);
}

static void *rank_thread(void *arg) {
    qt_catch *c = arg;
    qt_error_set_rank(3);
    qt_catch_push(c);
    if (setjmp(c->jb) == 0) {
        QT_CHECK(0, "rank thread failure");
        qt_catch_pop(c);
    }
    return NULL;
}

static void test_catch_per_thread_with_rank(void) {
    qt_catch c;
    pthread_t th;
    QT_REQUIRE(pthread_create(&th, NULL, rank_thread, &c) == 0, "pthread_create");
    pthread_join(th, NULL);
    QT_EXPECT(strncmp(c.msg, "[rank 3] ", 9) == 0 && strstr(c.msg, "rank thread failure"), "message: %s", c.msg);
}

/* Without a catch point the process prints and exits 1: run in a child. */
static void test_uncaught_exits(void) {
    int fds[2];
    QT_REQUIRE(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    QT_REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        dup2(fds[1], 2);
        QT_CHECK(0, "uncaught %d", 42);
        _exit(0);
    }
    close(fds[1]);
    char buf[512] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    QT_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    QT_EXPECT(n > 0 && strstr(buf, "qtrain: ") && strstr(buf, "uncaught 42"), "stderr: %s", buf);
}

/* A fake engine whose ops fail the way a CUDA call does deep inside. */
static void bad_micro(qt_engine *e, const int32_t *in, const int32_t *tgt, float s) {
    (void)e, (void)in, (void)tgt, (void)s;
    qt_fail_cuda("fake.cu", 7, "cudaMalloc(&p, huge)", 2 /* cudaErrorMemoryAllocation */);
}
static void bad_opt(qt_engine *e, float lr, long t, float *loss, float *gnorm) {
    (void)e, (void)lr, (void)t, (void)loss, (void)gnorm;
    QT_CHECK(0, "opt failed");
}
static int g_freed;
static void fake_free(qt_engine *e) { (void)e, g_freed++; }

static void test_engine_calls_return_errors(void) {
    qt_engine_ops ops = {.name = "fake", .micro_step = bad_micro, .opt_step = bad_opt, .free = fake_free};
    qt_engine e = {.ops = &ops};
    char err[1024] = "";
    int32_t tok[1] = {0};
    QT_EXPECT(qt_engine_micro_step(&e, tok, tok, 1.0f, err, sizeof err) == -1, "micro_step did not fail");
    QT_EXPECT(strstr(err, "fake.cu:7") && strstr(err, "cudaErrorMemoryAllocation") && strstr(err, "data.micro_batch"),
              "OOM message lacks the call or the hint: %s", err);
    float loss = 0, gnorm = 0;
    QT_EXPECT(qt_engine_opt_step(&e, 1e-3f, 1, &loss, &gnorm, err, sizeof err) == -1, "opt_step did not fail");
    QT_EXPECT(strstr(err, "opt failed") && !strstr(err, "data.micro_batch"), "message: %s", err);
    qt_engine_free(&e);
    QT_EXPECT(g_freed == 1, "free ran %d times", g_freed);
}

int main(void) {
    qt_error_add_abort_hook(count_hook);
    QT_RUN(test_catch_returns_message);
    QT_RUN(test_catch_nests);
    QT_RUN(test_catch_per_thread_with_rank);
    QT_RUN(test_uncaught_exits);
    QT_RUN(test_engine_calls_return_errors);
    return qt_test_end();
}
