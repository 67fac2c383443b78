/* qt_train_ckpt.h — the trainer (qt_trainer, a run's state: train.c's, read by the C API in src/api)
 * and its checkpoints: what a training checkpoint holds, snapshots written in the background,
 * non-finite state refused, resume with fallback to the newest valid checkpoint and a check of the
 * keys that make the run what it is.
 *
 * A checkpoint holds the engine's state_items (weights, master copy, Adam m and v) plus step, rng,
 * loader_pos (after the last completed step), model_cfg, config (the resolved YAML) and, with
 * perf.deterministic on a GPU, matmul_algos (the autotuned picks, reused on resume). Saving stops
 * training only for the snapshot: state_items, plus a copy of the blobs when the engine's alias live
 * state (the CPU engine: 12 bytes per parameter of host memory); GPU engines' state_items already are
 * pinned host copies of their device state. An offloaded optimizer state (one GPU) is copied the same
 * way or written in place, as checkpoint.offloaded chooses at start (qt_trainer_offload_mode); in place
 * the writer reads it where it lives, chunk by chunk ahead of the next optimizer step, which waits per
 * chunk for the writer's mark while the write is in flight (stall: max(0, write time of the chunks -
 * time until the optimizer next touches them)). The writer thread checks every fp32/bf16 piece is
 * finite, hashes, writes, fsyncs and renames. The next save waits for the previous write. Before a
 * snapshot the engine's finiteness checks of the last update are settled: never a NaN checkpoint. */
#ifndef QT_TRAIN_CKPT_H
#define QT_TRAIN_CKPT_H

#include <stddef.h>

#include "qt_ckpt.h"
#include "qt_data.h"
#include "qt_engine.h"
#include "qt_optim.h"
#include "qt_rng.h"
#include "qt_rundir.h"
#include "qt_train.h"
#include "qt_train_docs.h"
#include "qt_train_dpo_ref.h"
#include "qt_train_log.h"

/* The checkpoint blob of the engine's autotuned kernel choices (engine ops tuning_save/tuning_load). */
#define QT_CKPT_TUNING "matmul_algos"

/* A trainer's checkpoints: the background writer, the snapshot it writes from, and their timings. */
typedef struct {
    qt_ckpt_writer *writer;
    unsigned char *snap;      /* the copies being written (owned), snap_cap bytes */
    size_t snap_cap, write_bytes;
    char *cfgtext;            /* the resolved config as YAML (owned) */
    long saved_step;          /* newest checkpoint written or being written; -1: none */
    double pause_s;           /* the write in flight: training stopped for its snapshot, */
    double guard_s;           /* and the optimizer's waits for the writer (offloaded state written in place) */
} qt_trainer_ckpt;

typedef struct qt_trainer {
    const qt_config *cfg;
    qt_engine *eng;
    qt_layout layout;         /* the model (owned); eng->L points here */
    qt_weight_src wsrc;       /* where the initial weights come from (read range by range by the engine) */
    qt_loader *train, *eval;  /* train NULL: an export, no data */
    int32_t *in, *tgt;        /* one micro-batch per rank */
    qt_train_log log;
    qt_rundir dir;
    qt_train_stats *st;
    qt_rng rng;               /* trainer randomness (saved so resumed runs draw the same numbers) */
    qt_loader_pos pos;        /* the train loader's position after the last completed step */
    long step;                /* steps done */
    double tok_per_step;
    qt_trainer_ckpt ck;       /* checkpoints: the writer and what it writes */
    /* the session (train.c, qt_train_session.h) */
    qt_sched sched;
    float lr_override;        /* >= 0: every step's lr (qtrain_set_lr); < 0: the schedule's */
    long start, stop;         /* steps done at open; the step training ends at */
    long last_logged;         /* step of the last train record */
    double t0, tlast, tstep;  /* CLOCK_MONOTONIC at open, at the last train record, at this step's start */
    int pending;              /* a step's micro-steps ran, its update not yet */
    int fail;                 /* qt_train_fail kind of the last error */
    int broken;               /* an engine call failed: the engine may only be freed */
    char *tuning_cache;       /* perf.tuning_cache's file, "~/" expanded (owned); "": none */
    long step_targets;        /* unmasked targets of the last step's batches (0: its loss means nothing) */
    qt_train_docs docs;       /* data.attention / data.positions and the step's document starts */
    qt_train_dpo_ref dref;    /* objective: dpo with full fine-tuning: the stored reference log-probs */
    const struct qt_nodes *nodes; /* a run across nodes: where this node stands (borrowed); NULL: one machine */
    int follower;             /* a node > 0 of a run across nodes: node 0 keeps the run directory, log and checkpoints */
} qt_trainer;

/* After qt_trainer_load (or for a fresh run): the writer and the loader position. 0 or -1 with err. */
int qt_trainer_ckpt_init(qt_trainer *t, char *err, size_t errlen);
/* Snapshots step t->step and starts writing it (waiting first for the previous write). 0 or -1. */
int qt_trainer_save(qt_trainer *t, char *err, size_t errlen);
/* A checkpoint of step t->step across nodes (qt_train_nodes.h): node 0 writes it (qt_trainer_save), the others
 * wait for its start and take its outcome; on one machine qt_trainer_save. 0, or -1 with err on every node when
 * node 0's failed. */
int qt_trainer_save_agreed(qt_trainer *t, char *err, size_t errlen);
/* When the write in flight has finished: reports it. Returns -1 with err when it failed. */
int qt_trainer_poll_write(qt_trainer *t, char *err, size_t errlen);
/* err holds a mid-run error (data, log): saves the last completed step when it is not yet saved,
 * waits, and adds to err where the run can resume from. Returns -1. */
int qt_trainer_save_after_error(qt_trainer *t, char *err, size_t errlen);
/* A stop request (sig: the signal, or -1): saves the last completed step when not yet saved, waits,
 * prints where. Returns QT_TRAIN_STOPPED, or -1 with err when the checkpoint failed. */
int qt_trainer_stop(qt_trainer *t, int sig, char *err, size_t errlen);
/* The end of training (rc: the loop's return): waits for the write in flight. Returns -1 with err
 * when it failed and rc did not already carry an error; else 0. */
int qt_trainer_ckpt_finish(qt_trainer *t, int rc, char *err, size_t errlen);
void qt_trainer_ckpt_free(qt_trainer *t);
/* Resumes from which ("latest": the newest valid checkpoint of checkpoint.dir, a damaged newer one
 * is named in a warning and moved aside to *.bad; else a path). Training runs (t->train set) refuse
 * a checkpoint whose identity keys differ from the config's unless allow names them. 0 or -1. */
int qt_trainer_load(qt_trainer *t, const char *which, const char *allow, char *err, size_t errlen);
/* The writer's check of bytes [lo, hi) of a blob (ctx: the qt_trainer; reads t->eng->L and t->saved_step):
 * an fp32 or bf16 blob of L->numel elements holding a NaN/Inf there is refused, naming the blob, the
 * tensor and the element. */
int qt_trainer_check_finite(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen);
/* "model.layers.1.mlp.down_proj.weight[17]" for flat element i of L. */
void qt_trainer_tensor_name(const qt_layout *L, size_t i, char *buf, size_t cap);
/* The engine's finiteness checks of the weights after the update (settle: qt_engine_ops.nonfinite_weight;
 * qt_trainer_save settles them first): -1 with err naming the first NaN/Inf weight, the step whose
 * update made it and the checkpoint kept (nothing is saved after it, so retention never deletes the
 * last good one); else 0. */
int qt_trainer_check_weights(qt_trainer *t, int settle, char *err, size_t errlen);
/* checkpoint.offloaded resolved for an offloaded optimizer state of `bytes` when the host has `avail`
 * bytes free: copy or in_place as asked; auto: copy when bytes + bytes/8 + 1 GiB <= avail (the copy's
 * pinned buffers are made at start), else in_place. */
qt_ckpt_offload qt_trainer_offload_mode(qt_ckpt_offload want, size_t bytes, size_t avail);
/* "the newest checkpoint, <path>, is kept" or "no checkpoint was written". */
void qt_trainer_newest(const qt_trainer *t, char *buf, size_t cap);

#endif
