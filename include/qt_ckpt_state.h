/* qt_ckpt_state.h — the trainer's own blobs of a checkpoint, beside the engine's state: step, rng,
 * loader_pos, model_cfg, config (the resolved YAML) and micro_batches_per_step.
 *
 * One table (ckpt_state.c) names each blob, the field of qt_ckpt_state it holds and its size: a fixed
 * size for a struct (the blob must hold exactly that many bytes), or a text of 1..QT_CKPT_TEXT_MAX
 * bytes. Saving and loading both walk the table, so a new blob is one entry. Loading refuses, naming
 * the file and the blob, a blob that is missing or of another size, a step that disagrees with the
 * file's header, a loader epoch no run of that many steps can reach, and a config that does not load:
 * a file whose checksums are valid (forged, or written by a broken build) is never read past a blob's
 * end nor resumed at a wrong position. */
#ifndef QT_CKPT_STATE_H
#define QT_CKPT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_data.h"
#include "qt_model.h"
#include "qt_rng.h"

#define QT_CKPT_TEXT_MAX ((size_t)1 << 16) /* the largest text blob (the config) */

typedef struct {
    int64_t step;          /* steps done */
    qt_rng rng;            /* the trainer's random state */
    qt_loader_pos pos;     /* the train loader's position after the last completed step */
    qt_model_cfg model;    /* the model's shape */
    const char *config;    /* the resolved config as YAML, config_bytes of it (no NUL) */
    size_t config_bytes;
    int64_t micro_batches;   /* micro-batches per optimizer step: grad_accum x ranks (0: a file that predates it) */
} qt_ckpt_state;

/* The number of items qt_ckpt_state_items writes. */
int qt_ckpt_state_count(void);
/* items[0..qt_ckpt_state_count()) for the blobs of s (borrowing s's memory). Returns their count. */
int qt_ckpt_state_items(const qt_ckpt_state *s, qt_ckpt_item *items);
/* Reads the blobs of ck (the file path, for messages) into s (s->config points into ck) and checks
 * them as described above; old (NULL: not wanted) receives the config blob loaded. 0, or -1 with err
 * naming path and the blob. */
int qt_ckpt_state_read(const qt_ckpt *ck, const char *path, qt_ckpt_state *s, qt_config *old, char *err,
                       size_t errlen);

#endif
