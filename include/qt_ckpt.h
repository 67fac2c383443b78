/* qt_ckpt.h — checkpoint files: named blobs, each checksummed, written atomically.
 *
 * The trainer decides what goes in (weights, Adam m and v, step, RNG state, loader position, the
 * resolved config); this module only stores named byte blobs with a dtype tag and verifies them.
 * Write: <dir>/ckpt_<step:08>.qtc.tmp, fsync, rename to ckpt_<step:08>.qtc, fsync the directory,
 * then delete all but the `keep` newest. Load: every blob's checksum is verified before use. */
#ifndef QT_CKPT_H
#define QT_CKPT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;  /* at most 95 bytes */
    int dtype;         /* qt_dtype, or -1 for opaque bytes */
    const void *data;
    size_t bytes;
} qt_ckpt_item;

/* Creates dir if needed. Returns 0 or -1 with err; on failure no ckpt_*.qtc is created or changed. */
int qt_ckpt_save(const char *dir, long step, int keep, const qt_ckpt_item *items, int n, char *err,
                 size_t errlen);

typedef struct qt_ckpt qt_ckpt;
/* Reads path whole and verifies every checksum. NULL with err naming the file and blob on failure. */
qt_ckpt *qt_ckpt_open(const char *path, char *err, size_t errlen);
/* The blob's bytes (owned by ck) or NULL when absent; *bytes and *dtype set when non-NULL. */
const void *qt_ckpt_get(const qt_ckpt *ck, const char *name, size_t *bytes, int *dtype);
long qt_ckpt_step(const qt_ckpt *ck);
void qt_ckpt_close(qt_ckpt *ck);
/* Path of the newest ckpt_*.qtc in dir. Returns 0, or -1 when there is none. */
int qt_ckpt_latest(const char *dir, char *path, size_t cap);

#endif
