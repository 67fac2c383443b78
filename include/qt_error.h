/* qt_error.h — the one error family: QT_CHECK, QT_CUDA, QT_CUBLAS, QT_CUDNN.
 *
 * Every failure ends in qt_fail(): it prints "[rank R] file:line: call: message (hint)", runs the
 * registered abort hooks (they wake GPU threads blocked in comm so they stop instead of hanging) and
 * exits the process with status 1. Always on; never compiled out. The header needs no CUDA headers:
 * status codes travel as ints and are decoded in cuda/error.c. */
#ifndef QT_ERROR_H
#define QT_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void qt_fail(const char *file, int line, const char *call, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
void qt_fail_cuda(const char *file, int line, const char *call, int status) __attribute__((noreturn));
void qt_fail_cublas(const char *file, int line, const char *call, int status) __attribute__((noreturn));
void qt_fail_cudnn(const char *file, int line, const char *call, int status) __attribute__((noreturn));

/* Formats a user-facing error into err (when err and errlen are set) and returns -1, so a parser can
 * `return qt_errf(err, errlen, "%s:%d: ...", ...)`. */
int qt_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The rank printed in messages from this thread (-1, the default, prints none). */
void qt_error_set_rank(int rank);
/* Hooks run once, in the failing thread, before exit (at most 8). */
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
