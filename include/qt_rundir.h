/* qt_rundir.h — a checkpoint directory as the home of one run: its lock, its identity (run.json) and
 * the config keys a resume may not change unnoticed.
 *
 * dir/.lock  an flock(2) held while a run trains there, and one on dir itself (so deleting .lock does
 *            not let a second run in); the kernel drops both when the process ends, however it ends, so
 *            a killed run leaves no stale lock. .lock holds the owner's pid.
 * dir/run.json  {"run_id": 16 hex digits, "created": UTC time, "config_hash": 16 hex digits, and the
 *            identity keys with their values}; config_hash is XXH64 of "key=value\n" over those keys. */
#ifndef QT_RUNDIR_H
#define QT_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

#include "qt_config.h"

/* The keys whose change makes a resumed run a different run: its data and the batch it cuts. The
 * model's shape is checked separately (the checkpoint holds it). */
#define QT_RUNDIR_IDENTITY_KEYS "data.train,data.seq_len,data.micro_batch,data.grad_accum,seed"

typedef struct {
    int lock_fd;          /* dir/.lock, flock'ed; -1 when not locked */
    int dir_fd;           /* dir itself, flock'ed; -1 when not locked */
    int created;          /* qt_rundir_open made dir */
    int wrote_identity;   /* a fresh run wrote run.json */
    char dir[QT_PATH_MAX];
    char run_id[17];
} qt_rundir;

/* Creates dir, checks that a file can be created in it and takes its locks (held until
 * qt_rundir_close or the end of the process). Deletes the temp files (ckpt_*.qtc.tmp) a killed write
 * left (never one a live write holds). Returns 0, or -1 with err (another run holds the lock, not a writable directory). */
int qt_rundir_open(qt_rundir *r, const char *dir, char *err, size_t errlen);
/* Drops the lock. discard (a run that failed before its first checkpoint): also removes what this
 * run made — a fresh run's run.json, the lock file, dir itself when it made it and it is empty. */
void qt_rundir_close(qt_rundir *r, int discard);
/* Fresh run (resume 0): refuses a dir that holds checkpoints, then writes run.json with a new run id.
 * Resume: keeps run.json's id (makes one when the file is missing) and rewrites it with cfg's hash.
 * Returns 0, or -1 with err. */
int qt_rundir_identity(qt_rundir *r, const qt_config *cfg, int resume, char *err, size_t errlen);
/* Compares the identity keys of the config a checkpoint was made with (old) and cfg. The keys named
 * in allow (comma separated, or "all") may differ. data.grad_accum differs when the micro-batches per
 * optimizer step (grad_accum x ranks) do: mb[0] the checkpoint's, mb[1] this run's (mb[0] 0: a checkpoint
 * that does not record them: the grad_accum values are compared), so a run may resume on another rank
 * count with grad_accum making up for it. Sets *data_moved when data.train or data.seq_len
 * differ (the saved loader position then means nothing). Returns 0, or -1 with err listing every
 * differing key with both values and the flag that accepts them. */
int qt_rundir_check_resume(const qt_config *old, const qt_config *cfg, const int64_t mb[2], const char *allow,
                           const char *ckpt, int *data_moved, char *err, size_t errlen);
/* XXH64 of the identity keys of cfg. */
uint64_t qt_rundir_config_hash(const qt_config *cfg);

#endif
