/* qt_error.h — the one error family: QT_CHECK, QT_CUDA, QT_CUBLAS, QT_CUDNN, catch points, qt_errf.
 *
 * A failed check ends in qt_fail(), which formats "[rank R] file:line: call: message" and runs the
 * registered abort hooks (they wake GPU threads blocked in comm, so they fail too instead of hanging).
 * Then:
 *   - inside a catch point of this thread (qt_catch_push ... qt_catch_pop), it jumps back to it with
 *     the message and a kind: library entry points (the engine calls of qt_engine.h, the training run)
 *     catch, so a failure deep in a kernel launcher comes back to the caller as an error;
 *   - outside any catch point (tools, tests, a thread of our own), it prints the message and exits the
 *     process with status 1, as a CLI should.
 * Checks are always on, never compiled out. What a jump leaves behind: the object whose call failed
 * is broken (its streams, comms and half-done state); the caller may only free it. The header needs no
 * CUDA headers: status codes travel as ints and are decoded in cuda/error.c; the rest is src/core/error.c,
 * which depends on nothing.
 *
 * Catch point, in one function (setjmp must stay in the frame that pushed the catch):
 *     qt_catch c;
 *     qt_catch_push(&c);
 *     if (setjmp(c.jb)) return qt_errf(err, errlen, "%s", c.msg);   // popped already
 *     ... work that may fail ...
 *     qt_catch_pop(&c);
 * Locals changed between the push and a failure are indeterminate after the jump unless volatile. */
#ifndef QT_ERROR_H
#define QT_ERROR_H

#include <setjmp.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What failed, for callers that map errors to their own kinds (the CLI's exit codes, Python's
 * exception classes). */
typedef enum {
    QT_ERR_INTERNAL = 1, /* a broken invariant (QT_CHECK) */
    QT_ERR_DEVICE,       /* a CUDA / cuBLASLt / cuDNN call failed */
    QT_ERR_DEVICE_OOM,   /* the device ran out of memory */
} qt_err_kind;

typedef struct qt_catch {
    jmp_buf jb;
    struct qt_catch *prev;
    qt_err_kind kind;
    char msg[1024]; /* "[rank R] file:line: call: message", no trailing newline */
} qt_catch;

/* Makes c the innermost catch point of this thread. */
void qt_catch_push(qt_catch *c);
/* Removes c (the innermost catch point) after the work succeeded. */
void qt_catch_pop(qt_catch *c);

void qt_fail(const char *file, int line, const char *call, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
/* qt_fail with the kind the caller names (the status decoders of cuda/error.c). */
void qt_fail_as(qt_err_kind kind, const char *file, int line, const char *call, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 5, 6)));
void qt_fail_cuda(const char *file, int line, const char *call, int status) __attribute__((noreturn));
void qt_fail_cublas(const char *file, int line, const char *call, int status) __attribute__((noreturn));
void qt_fail_cudnn(const char *file, int line, const char *call, int status) __attribute__((noreturn));

/* Formats a user-facing error into err (when err and errlen are set) and returns -1, so a parser can
 * `return qt_errf(err, errlen, "%s:%d: ...", ...)`. */
int qt_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The rank printed in messages from this thread (-1, the default, prints none). */
void qt_error_set_rank(int rank);
/* Hooks run once per failure, in the failing thread, before the jump or the exit (at most 8). */
void qt_error_add_abort_hook(void (*hook)(void));

#define QT_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) qt_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                              \
    } while (0)
#define QT_CUDA(call)                                                                              \
    do {                                                                                           \
        int qt_s_ = (int)(call);                                                                   \
        if (qt_s_ != 0) qt_fail_cuda(__FILE__, __LINE__, #call, qt_s_);                            \
    } while (0)
#define QT_CUBLAS(call)                                                                            \
    do {                                                                                           \
        int qt_s_ = (int)(call);                                                                   \
        if (qt_s_ != 0) qt_fail_cublas(__FILE__, __LINE__, #call, qt_s_);                          \
    } while (0)
#define QT_CUDNN(call)                                                                             \
    do {                                                                                           \
        int qt_s_ = (int)(call);                                                                   \
        if (qt_s_ != 0) qt_fail_cudnn(__FILE__, __LINE__, #call, qt_s_);                           \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
