/* qt_train_log.h — the JSONL run log (log.file): one JSON object per line, flushed as written, so a
 * killed run loses no record it printed.
 *
 * First line of each (re)start: {"type": "config", "run_id": ..., "resume": bool, "config": {every
 * key as "section.key": value}}. Every other line: {"type": ..., "step": N, <fields>, "tokens": tokens
 * seen (steps x tokens per step), "elapsed_s": seconds since this process started the run, "time":
 * Unix time in seconds}. */
#ifndef QT_TRAIN_LOG_H
#define QT_TRAIN_LOG_H

#include <stdio.h>

#include "qt_config.h"

typedef struct {
    FILE *f;                  /* NULL: no log (log.file "") */
    char path[QT_PATH_MAX];
    double t0;                /* CLOCK_MONOTONIC at open */
    /* called with every record line (JSON, no newline) also when f is NULL; may be NULL (embedders'
     * log callbacks: the Python binding's) */
    void (*hook)(void *ctx, const char *line);
    void *hook_ctx;
} qt_train_log;

/* Opens path (creating its folders) to append (append 1) or overwrite; path "" opens nothing.
 * Returns 0, or -1 with err naming log.file and the file. */
int qt_train_log_open(qt_train_log *lg, const char *path, int append, char *err, size_t errlen);
/* The config line. Returns 0, or -1 with err when the write fails. */
int qt_train_log_config(qt_train_log *lg, const qt_config *cfg, const char *run_id, int resume, char *err,
                        size_t errlen);
/* One record; fields are JSON members ("\"loss\":1.5,\"lr\":3e-4"), may be "". Returns 0, or -1 with
 * err naming the file when the write or flush fails (a full disk). */
int qt_train_log_write(qt_train_log *lg, const char *type, long step, double tokens, const char *fields,
                       char *err, size_t errlen);
/* Closes; returns -1 with err when the last flush failed. Safe on an unopened log. */
int qt_train_log_close(qt_train_log *lg, char *err, size_t errlen);

#endif
