/* fuzz_support.c — what the fuzzed modules need from cuda/error.c, without CUDA: the harnesses
 * link only the host readers (config, json, hf, layout, shard, ckpt) so that they build with
 * clang -fsanitize=fuzzer on any machine. Same contract as qt_errf in include/qt_error.h. */
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
