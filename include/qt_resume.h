/* qt_resume.h — what a resumed run starts from: the checkpoint `--resume` (or qtrain_options.resume)
 * names, and the config stored in it with only the caller's overrides changed. The CLI and the
 * embeddable API (the Python binding) both take a resumed run's config from here. */
#ifndef QT_RESUME_H
#define QT_RESUME_H

#include <stddef.h>

#include "qt_config.h"

/* Where which points: a checkpoint file (1, its path into out) or a folder of checkpoints (0, into out:
 * which itself, or which/ckpt when which is a run.dir that holds no ckpt_*.qtc but a ckpt folder).
 * Returns -1 with err when which does not exist. */
int qt_resume_target(const char *which, char *out, size_t cap, char *err, size_t errlen);

/* Loads into c the config stored in the checkpoint which names (a file, or a folder's newest
 * checkpoint that opens), with overrides applied after it; a folder also sets checkpoint.dir to it
 * (and run.dir to which when which is a run.dir), before the overrides. *ckpt receives what to pass
 * as qt_train_opts.resume: the file, or "latest" for a folder. Returns 0; -1 with err for the
 * checkpoint (none, unreadable, without a stored config); -2 with err for the config (a bad override:
 * "--set k=v: ..."). */
int qt_resume_config(qt_config *c, const char *which, const char *const *overrides, int n_overrides, char *ckpt,
                     size_t cap, char *err, size_t errlen);

#endif
