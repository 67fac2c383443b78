/* qt_tuning_cache.h — the engine's autotuned kernel choices kept in a file between runs
 * (perf.tuning_cache; src/train/tuning_cache.c). Neither call fails the run: a cache that cannot be
 * read or written is said on stdout and costs the run only its own timing. */
#ifndef QT_TUNING_CACHE_H
#define QT_TUNING_CACHE_H

#include <stddef.h>

#include "qt_engine.h"

/* Loads the file's picks into the engine (before its first step); a missing file is nothing to say. */
void qt_tuning_cache_load(qt_engine *e, const char *key);
/* Writes the engine's picks to the file (replaced whole through a temporary file). */
void qt_tuning_cache_save(qt_engine *e, const char *key);

#endif
