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
#include <stdio.h>

/* flags of an item: QT_CKPT_WIDEN_BF16: data holds bytes / 4 bf16 values (bytes / 2 bytes) and the file
 * the fp32 of each (its bits << 16, exact), dtype QT_DT_F32: a bf16 array written as fp32 without an fp32
 * copy in memory. The writer widens it chunk by chunk through a small buffer; the checksum is over the
 * fp32 bytes written, so the file equals one written from the widened fp32 array. */
#define QT_CKPT_WIDEN_BF16 1u

/* QT_CKPT_GATHERED: the item's bytes are not in one array: data points to a qt_ckpt_gather whose runs
 * hold them in order (an array whose pieces live on several ranks, written without putting it together
 * first). It combines with QT_CKPT_WIDEN_BF16 (the runs then hold the bf16 values). */
#define QT_CKPT_GATHERED 2u

/* One run of a gathered item: its bytes from `lo` (of the bytes the item reads, qt_ckpt_item_data_bytes)
 * up to the next run's lo (the last: to the end) are at data. */
typedef struct {
    size_t lo;
    const void *data;
} qt_ckpt_seg;
typedef struct {
    const qt_ckpt_seg *segs; /* segs[0].lo 0, lo ascending */
    int n;
} qt_ckpt_gather;

typedef struct {
    const char *name;  /* at most 95 bytes */
    int dtype;         /* qt_dtype, or -1 for opaque bytes */
    const void *data;  /* the bytes the item reads, or with QT_CKPT_GATHERED its qt_ckpt_gather */
    size_t bytes;      /* the blob's bytes in the file */
    unsigned flags;    /* 0, QT_CKPT_WIDEN_BF16, QT_CKPT_GATHERED */
} qt_ckpt_item;

/* The bytes the item reads at data: bytes, or bytes / 2 when widened. */
size_t qt_ckpt_item_data_bytes(const qt_ckpt_item *it);
/* The address of byte `off` (< qt_ckpt_item_data_bytes) of the bytes the item reads, and in *run how many
 * bytes from there are contiguous (to the end of its run). */
const void *qt_ckpt_item_at(const qt_ckpt_item *it, size_t off, size_t *run);
/* Copies bytes [off, off + n) of the bytes the item reads to dst, run by run. */
void qt_ckpt_item_read(const qt_ckpt_item *it, size_t off, size_t n, void *dst);

/* A padded flat array's units (a sharded layout, qt_model.h): unit u's elements [at[u], at[u] + compact[u + 1] -
 * compact[u]) are the compact array's [compact[u], compact[u + 1]); the rest up to at[u + 1] is padding. at[n] and
 * compact[n] are the two lengths. A checkpoint holds the compact array. */
typedef struct {
    int n;
    const size_t *at, *compact;
} qt_ckpt_units;
/* The compact view of item `it` (an array of u->at[n] elements): *out gathers its units' runs, at most
 * qt_ckpt_units_segs(it, u) of them into segs, and views `it`'s own memory (borrowed, as `it` is); g holds the
 * runs' table. */
int qt_ckpt_units_segs(const qt_ckpt_item *it, const qt_ckpt_units *u);
void qt_ckpt_units_view(const qt_ckpt_item *it, const qt_ckpt_units *u, qt_ckpt_seg *segs, qt_ckpt_gather *g,
                        qt_ckpt_item *out);
/* 1 when `it` is such an array: fp32 or bf16 of u->at[n] elements (a widened item counts its fp32 values). */
int qt_ckpt_units_is_array(const qt_ckpt_item *it, const qt_ckpt_units *u);

/* Creates dir if needed. Returns 0 or -1 with err; on failure no ckpt_*.qtc is created or changed.
 * keep <= 0 keeps every file; the file just written is never deleted, even when older by step. */
int qt_ckpt_save(const char *dir, long step, int keep, const qt_ckpt_item *items, int n, char *err,
                 size_t errlen);

/* Bytes [lo, hi) of item `item`: one piece of a write order. */
typedef struct {
    int item;
    size_t lo, hi;
} qt_ckpt_piece;
/* check (NULL: none) runs on each piece just before it is written (lo, hi: bytes of the blob in the file;
 * a widened item's data elements lo / 4 .. hi / 4): non-zero (with err) cancels the save with that message. done (NULL: none) runs once piece k is in the file: from then on the caller
 * may change that memory. */
typedef struct {
    int (*check)(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen);
    void (*done)(void *ctx, int k);
    void *ctx;
} qt_ckpt_piece_fns;
/* qt_ckpt_save writing the blobs piece by piece in the order pieces[0..np) gives (each item's bytes
 * covered once, in ascending order; items may interleave; a widened item's pieces at multiples of 4
 * bytes), each byte read once: checked, hashed and written at its place in the file; the table follows.
 * The same file as qt_ckpt_save. */
int qt_ckpt_save_pieces(const char *dir, long step, int keep, const qt_ckpt_item *items, int n,
                        const qt_ckpt_piece *pieces, int np, const qt_ckpt_piece_fns *fns, char *err,
                        size_t errlen);

typedef struct qt_ckpt qt_ckpt;
/* Why qt_ckpt_load failed. UNREADABLE: the file could not be read (open or read failed: permissions,
 * too many open files, an I/O error; or it is not a regular file): it may well be intact, so it is
 * never to be moved aside or deleted. CORRUPT: read whole, its bytes are not a valid checkpoint. */
typedef enum { QT_CKPT_OK, QT_CKPT_UNREADABLE, QT_CKPT_CORRUPT, QT_CKPT_NO_MEMORY } qt_ckpt_status;
/* Reads path whole and verifies every checksum, that no two blobs share a name and, for a file named
 * ckpt_<step>.qtc, that its header holds that step. NULL with err naming the file (and blob) and
 * *why on failure. */
qt_ckpt *qt_ckpt_load(const char *path, qt_ckpt_status *why, char *err, size_t errlen);
/* qt_ckpt_load without the reason. */
qt_ckpt *qt_ckpt_open(const char *path, char *err, size_t errlen);
/* The blob's bytes (owned by ck) or NULL when absent; *bytes and *dtype set when non-NULL. */
const void *qt_ckpt_get(const qt_ckpt *ck, const char *name, size_t *bytes, int *dtype);
/* Puts every fp32 or bf16 blob of u->compact[n] elements (a compact array) into the padded layout of u: the
 * units at their places, the padding zero (memory owned by ck). 0, or -1 with err when out of memory. */
int qt_ckpt_pad_units(qt_ckpt *ck, const qt_ckpt_units *u, char *err, size_t errlen);
long qt_ckpt_step(const qt_ckpt *ck);
void qt_ckpt_close(qt_ckpt *ck);
/* Path of the newest ckpt_*.qtc in dir. Returns 0, or -1 when there is none. */
int qt_ckpt_latest(const char *dir, char *path, size_t cap);
/* Steps of the ckpt_*.qtc files in dir, newest first, in *steps (malloc'ed, caller frees; NULL when
 * none). Returns their count: 0 when there are none or dir does not exist. */
int qt_ckpt_list(const char *dir, long **steps);

/* Background writing: qt_ckpt_save on a thread of its own, so training goes on while a checkpoint is
 * hashed, written, fsync'ed and renamed. One write at a time. A kill at any moment leaves every
 * checkpoint already renamed intact; the temp file is never taken for a checkpoint.
 *
 * Live items: state the caller does not copy (an offloaded optimizer state in host memory) but keeps
 * changing from element 0 upwards once it is written. The writer takes them first, interleaved piece
 * by piece (element range [e0, e1) of each, in turn), and after each range publishes a progress mark
 * (every live item is written below e1); the caller waits for the mark before it changes elements below
 * it (qt_ckpt_writer_wait_mark). The file holds the items as they were when the write started. */
typedef struct qt_ckpt_writer qt_ckpt_writer;
/* Runs on the writer's thread on bytes [lo, hi) of an item in the file (element-aligned; a widened
 * item's data elements lo / 4 .. hi / 4) just before they are written; non-zero (with err) cancels the
 * save, which then fails with that message. */
typedef int (*qt_ckpt_check_fn)(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen);
/* check may be NULL. NULL when out of memory. Free with qt_ckpt_writer_free (which waits). */
qt_ckpt_writer *qt_ckpt_writer_create(qt_ckpt_check_fn check, void *ctx);
/* Starts qt_ckpt_save(dir, step, keep, items, n) on the writer's thread and returns at once. The
 * items' names and data are borrowed until qt_ckpt_writer_wait returns: they must stay unchanged
 * until then. n <= 32. Returns 0, or -1 with err (a write still in flight: wait first). */
int qt_ckpt_writer_start(qt_ckpt_writer *w, const char *dir, long step, int keep, const qt_ckpt_item *items,
                         int n, char *err, size_t errlen);
/* Which items are live: items[idx[0..n)] are arrays of at most `elems` elements each (elements of the
 * item's dtype; a widened item counts its fp32 values; a shorter one's ranges past its end are empty),
 * written first in element-aligned ranges of `piece` elements (0: 16M), every live item's range [e0, e1)
 * in turn. */
typedef struct {
    int n, idx[8];
    size_t elems, piece;
} qt_ckpt_live;
/* qt_ckpt_writer_start with live items (live NULL or live->n == 0: none): the live items may change
 * below the progress mark (qt_ckpt_writer_wait_mark) while the write goes on; the others may not. */
int qt_ckpt_writer_start_live(qt_ckpt_writer *w, const char *dir, long step, int keep, const qt_ckpt_item *items,
                              int n, const qt_ckpt_live *live, char *err, size_t errlen);
/* From any thread: returns once the live items are written below element hi, or the write in flight
 * has ended (saved or failed), or none is in flight (at once, one atomic load, when so). Returns the
 * seconds it waited. */
double qt_ckpt_writer_wait_mark(qt_ckpt_writer *w, size_t hi);
/* 1 while a write is in flight and not finished (qt_ckpt_writer_wait then returns at once). */
int qt_ckpt_writer_running(qt_ckpt_writer *w);
/* Waits for the write in flight. Returns 1 when none was in flight, 0 when it was saved, -1 with err
 * when it failed or its check refused it; *step and *seconds (the write's wall time), when non-NULL,
 * describe it. */
int qt_ckpt_writer_wait(qt_ckpt_writer *w, long *step, double *seconds, char *err, size_t errlen);
void qt_ckpt_writer_free(qt_ckpt_writer *w);

/* Helpers shared with the HF export (both write files the same careful way). */
/* The 64-bit checksum of the blobs (XXH64, seed 0). */
uint64_t qt_ckpt_hash64(const void *data, size_t n);
/* mkdir -p. Returns 0, or -1 with err naming the component that is not a directory. */
int qt_ckpt_mkdirs(const char *dir, char *err, size_t errlen);
/* Finishes a file written to tmp: fflush, fsync, fclose (always), rename to final, fsync the
 * directory. Returns 0, or -1 with err (tmp removed). */
int qt_ckpt_commit_file(FILE *f, const char *tmp, const char *final, char *err, size_t errlen);

#endif
