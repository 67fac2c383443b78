/* errf.c — qt_errf (qt_error.h), apart from error.c so that code built without CUDA (the fuzz
 * harnesses of the host readers) links it. */
#include <stdarg.h>
#include <stdio.h>

#include "qt_error.h"

int qt_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}
