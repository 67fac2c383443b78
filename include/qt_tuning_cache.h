/* qt_tuning_cache.h — the engine's autotuned kernel choices kept in a file between runs
 * (perf.tuning_cache; src/train/tuning_cache.c). Neither call fails the run: a cache that cannot be
 * read or written is said on stdout and costs the run only its own timing. */
#ifndef QT_TUNING_CACHE_H
#define QT_TUNING_CACHE_H

#include <stddef.h>

#include "qt_engine.h"

#define QT_TUNING_PATH_MAX 4096

/* The file perf.tuning_cache's value `key` names, into out: a leading "~/" is home (NULL or "": no
 * file). Returns 0 when there is no file to use (key "", or "~/" without a home), else 1. */
int qt_tuning_cache_path(const char *key, const char *home, char *out, size_t cap);
/* Loads the file's picks into the engine (before its first step); a missing file is nothing to say. */
void qt_tuning_cache_load(qt_engine *e, const char *path);
/* Writes the engine's picks to the file (replaced whole through a temporary file). */
void qt_tuning_cache_save(qt_engine *e, const char *path);

#endif
