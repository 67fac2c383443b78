/* fuzz_util.h — shared by the libFuzzer harnesses in tests/fuzz: a per-process scratch file for the
 * readers that take a path, and a check that aborts (a finding) with a message. */
#ifndef QT_FUZZ_UTIL_H
#define QT_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "<tmp>/qt_fuzz_<pid>_<name>": /dev/shm when present (no disk I/O per execution). */
static inline const char *fuzz_path(const char *name) {
    static char p[256];
    snprintf(p, sizeof p, "%s/qt_fuzz_%d_%s", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid(),
             name);
    return p;
}

/* Writes data to path whole; aborts when it cannot (the harness, not the code under test, failed). */
static inline void fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
        fprintf(stderr, "fuzz harness: cannot write %s\n", path);
        abort();
    }
}

#define FUZZ_ASSERT(cond, ...)                                                                      \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "fuzz finding: %s: ", #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                  \
            abort();                                                                                \
        }                                                                                           \
    } while (0)

#endif
