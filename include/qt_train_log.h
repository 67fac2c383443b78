/* qt_train_log.h — the JSONL run log (log.file): one JSON object per line, each written with one
 * write(), so a killed run loses no record it printed and never leaves half of one.
 *
 * First line of each (re)start: {"type": "config", "run_id": ..., "resume": bool, "config": {every
 * key as "section.key": value}}. Every other line: {"type": ..., "step": N, <fields>, "tokens": tokens
 * seen (steps x tokens per step), "elapsed_s": seconds since this process started the run, "time":
 * Unix time in seconds}. */
#ifndef QT_TRAIN_LOG_H
#define QT_TRAIN_LOG_H

#include "qt_config.h"

typedef struct qt_tb qt_tb;

typedef struct {
    int fd;                   /* -1: no log (log.file ""); else open for append, flock'ed for the run's life */
    int created;              /* 1: this run created the file (a run that fails before saving removes it) */
    qt_tb *tb;                /* NULL: no TensorBoard events (log.tensorboard "") */
    char path[QT_PATH_MAX];
    char made[QT_PATH_MAX];   /* the shallowest folder of path this run made ("" none): removed with it */
    double t0;                /* CLOCK_MONOTONIC at open */
    /* called with every record line (JSON, no newline) also when fd is -1; may be NULL (embedders'
     * log callbacks: the Python binding's) */
    void (*hook)(void *ctx, const char *line);
    void *hook_ctx;
} qt_train_log;

/* Opens cfg's log.file (creating its folders), "" opens nothing. A fresh run (resume 0) creates the
 * file; one already there is refused (another run's log, never overwritten) unless its last config
 * record names the same checkpoint.dir (an earlier attempt of this run folder, which the checkpoint
 * directory's rules then judge): then, as a resumed run does, it appends after cutting the file back to
 * its last complete line (a record a full disk cut short). Either way the file is flock'ed until close:
 * a second run given the same log.file is refused. log.tensorboard "" writes no TensorBoard events; else a
 * new event file in that folder (qt_tb_events.h) gets the scalars of every record. Returns 0, or -1 with
 * err naming log.file (or log.tensorboard) and the file. */
int qt_train_log_open(qt_train_log *lg, const qt_config *cfg, int resume, char *err, size_t errlen);
/* The config line. Returns 0, or -1 with err when the write fails. */
int qt_train_log_config(qt_train_log *lg, const qt_config *cfg, const char *run_id, int resume, char *err,
                        size_t errlen);
/* One record, written whole with one write(); fields are JSON members ("\"loss\":1.5,\"lr\":3e-4"), may
 * be "". Its numeric fields also go to TensorBoard as "<type>/<name>" scalars. Returns 0, or -1 with
 * err naming the file when the write fails (a full disk). */
int qt_train_log_write(qt_train_log *lg, const char *type, long step, double tokens, const char *fields,
                       char *err, size_t errlen);
/* Closes (and releases the lock); discard 1 (a run that failed before saving anything) also removes a
 * file this run created, its event file and the folders made for them (when empty: close the run's
 * other files first). Returns -1 with err when closing failed. Safe on an unopened log. */
int qt_train_log_close(qt_train_log *lg, int discard, char *err, size_t errlen);

#endif
