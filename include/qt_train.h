/* qt_train.h — the training loop: model setup, steps, logging, eval, checkpoints, export. */
#ifndef QT_TRAIN_H
#define QT_TRAIN_H

#include <stddef.h>

#include "qt_config.h"

typedef struct {
    const char *resume;  /* NULL: from scratch; "latest": newest valid one in checkpoint.dir; else a path */
    long stop_after;     /* >= 0: stop (with a checkpoint) once this many steps are done */
    int export_only;     /* load (init or resume) and export, no training (needs no data) */
    float *losses;       /* optional [cfg->steps]: each step's mean training loss */
    const char *allow_changed; /* resume: identity keys that may differ from the checkpoint's config
                                * (comma separated, or "all"; qt_rundir.h); NULL: none */
    const char *home_dir;      /* a "~/" in perf.tuning_cache is this directory; NULL: such a cache is not used */
} qt_train_opts;

typedef struct {
    long steps_done;     /* the step count reached */
    float first_eval, last_eval; /* NAN when no eval ran */
    double tokens_per_s; /* over the whole run */
    int ckpts;           /* checkpoints started by this run */
    double ckpt_stall_max_s; /* the longest training stopped for one of them (snapshot + waiting for
                              * the previous write + an offloaded optimizer's waits for the write of
                              * its state); the write itself runs in the background */
    int ckpt_in_place;   /* 1: an offloaded optimizer state was checkpointed where it lives (checkpoint.offloaded) */
    size_t ckpt_snapshot_bytes; /* the host memory of the checkpoint snapshot: a GPU engine's pinned buffers,
                                 * made at training start (the plan's "checkpoint snapshot" rows), or the
                                 * CPU engine's state copied at each save */
} qt_train_stats;

/* qt_train_run's returns besides 0 and -1, and the exit status the qtrain program maps them to. */
#define QT_TRAIN_STOPPED 1 /* a stop was requested (qt_train_request_stop, SIGINT, SIGTERM): the
                            * current step finished, a checkpoint was written, the run can resume */
#define QT_EXIT_STOPPED 75 /* EX_TEMPFAIL: "try again later" — here, with --resume */

/* Runs cfg: checks first what the run will need (checkpoint.dir writable and locked, log.file
 * writable, the data's shards), then trains, logs, evaluates, checkpoints in the background, exports.
 * Returns 0 when done; QT_TRAIN_STOPPED after a stop request (checkpoint written and waited for); or
 * -1 with err for user errors (missing files, bad shards, incompatible checkpoint, a used
 * checkpoint.dir, divergence, a failed write). A data or log error found mid-run first saves a
 * checkpoint of the last completed step; an engine failure (a CUDA call, a failed rank) comes back as
 * -1 with its message, without a new checkpoint. */
int qt_train_run(const qt_config *cfg, const qt_train_opts *opts, qt_train_stats *st, char *err, size_t errlen);
/* The same for one node of a run across nodes (parallel.nodes > 1): nodes is where it stands and node 0's
 * NCCL ids (the CLI's meeting, qt_dp_nodes.h; borrowed for the run). NULL nodes: qt_train_run. */
struct qt_nodes;
int qt_train_run_nodes(const qt_config *cfg, const qt_train_opts *opts, const struct qt_nodes *nodes, qt_train_stats *st,
                       char *err, size_t errlen);

/* Asks the running (or the next) qt_train_run to stop after its current optimizer step — every GPU
 * thread finishes that step — save a checkpoint and return QT_TRAIN_STOPPED. Safe from any thread
 * and from a signal handler (it only sets a flag). The request is cleared when qt_train_run returns. */
void qt_train_request_stop(void);
/* Takes SIGINT and SIGTERM for the process: blocks them in the calling thread (and so in every thread
 * made after it: call it first, before any other thread exists) and waits for them on a thread of its
 * own. The first signal calls qt_train_request_stop (and says so on stderr); a second one ends the
 * process at once, killed by that signal (shell status 130 or 143). Checkpoints already written stay
 * intact either way. */
void qt_train_install_signal_handlers(void);

#endif
