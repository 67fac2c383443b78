/* qt_train_dpo_ref.h — objective: dpo with full fine-tuning: the reference model's row log-probs, stored beside each
 * pair shard, instead of a second copy of the weights.
 *
 * Before step 1 a first pass runs the initial model (init.from, or the seeded init) over every row of the train and
 * eval shards (the engine's row_logps, forward only) and writes each shard's rows' log-probs (qt_dpo_row_logps: the
 * sum over the row's trained targets, f64) to <shard>.dporef. A later run whose reference is the same reuses the file
 * bit for bit; one made for another reference (other initial weights, engine, micro_batch or attention) or another
 * shard (its tokens' checksum, size or seq_len) is computed again, naming the file and why; a damaged one is refused.
 * Each step the loader says which data rows it delivered (qt_loader_last_rows) and their stored log-probs go to the
 * engine with the micro-batch (set_dpo_ref), ranks x micro_batch at a time. A checkpoint holds the reference's
 * identity (the initial weights' CRC-32C) as the blob dpo_reference; a resume from another is refused.
 *
 * File, little-endian: 256-byte header: "QTDPOREF" | u32 version (1) | u32 CRC-32C of the rows | u64 rows | u64 the
 * shard's n_tokens | u64 the shard's checksum | u32 seq_len | u32 0 | the reference's identity, NUL-padded to the
 * header's end; then rows f64 log-probs, row r of the shard at r (pair p: 2p chosen, 2p + 1 rejected). */
#ifndef QT_TRAIN_DPO_REF_H
#define QT_TRAIN_DPO_REF_H

#include <stddef.h>
#include <stdint.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_data.h"
#include "qt_engine.h"
#include "qt_train_docs.h"
#include "qt_weight_src.h"

#define QT_DPOREF_SUFFIX ".dporef"
#define QT_DPOREF_HEADER 256

typedef struct {
    int on;              /* objective: dpo with full fine-tuning */
    char model_id[64];   /* "crc32c <hex> numel <n>" of the initial fp32 weights: the checkpoint's dpo_reference */
    char id[200];        /* model_id, the engine, micro_batch and attention: what a file must have been made for */
    double *lp[2];       /* [the train (0) / eval (1) loader's rows] their reference log-probs (owned) */
    double *slots;       /* [windows] the step's (or evaluation's) micro-batches' rows, slot by slot (owned) */
    uint64_t *rows;      /* [micro_batch] scratch for qt_loader_last_rows */
    size_t windows;
    int micro_batch;
} qt_train_dpo_ref;

/* For objective: dpo with lora.rank 0 (else r->on = 0 and every call below is a no-op): the identity of the initial
 * weights read from src, then for the train and eval loaders (eval may be NULL) every shard's stored reference read,
 * or computed with engine e (its weights still the initial ones; documents as docs says, which it uses as scratch)
 * and written. windows: the slots of a step (grad_accum x ranks x micro_batch). 0, or -1 with err naming the file. */
int qt_train_dpo_ref_init(qt_train_dpo_ref *r, const qt_config *c, const qt_weight_src *src, qt_loader *train,
                          qt_loader *eval, qt_engine *e, qt_train_docs *docs, size_t windows, char *err, size_t errlen);
/* The stored log-probs of the rows loader l (eval 0: the train loader, 1: the eval loader) last delivered, into slots
 * w0 .. w0 + micro_batch. */
void qt_train_dpo_ref_take(qt_train_dpo_ref *r, const qt_loader *l, int eval, size_t w0);
/* Slots w0 .. w0 + n hold no rows (a rank given no batch): 0. */
void qt_train_dpo_ref_clear(qt_train_dpo_ref *r, size_t w0, size_t n);
/* Slots w0 .. as the reference of the engine's next calls (src_loader 0: the caller's own batches, which have no
 * stored rows: none). 0 or -1 with err. */
int qt_train_dpo_ref_apply(const qt_train_dpo_ref *r, qt_engine *e, size_t w0, int src_loader, char *err, size_t errlen);
/* The checkpoint's dpo_reference blob into *item; returns 1, or 0 when r is off. */
int qt_train_dpo_ref_item(const qt_train_dpo_ref *r, qt_ckpt_item *item);
/* 0 when checkpoint ck (at path) was made with this reference (or r is off), else -1 with err. */
int qt_train_dpo_ref_check(const qt_train_dpo_ref *r, const qt_ckpt *ck, const char *path, char *err, size_t errlen);
void qt_train_dpo_ref_free(qt_train_dpo_ref *r);

#endif
