/* ckpt_state.c — the trainer's own checkpoint blobs: one table, saved and loaded by walking it, every
 * blob's size and value checked on load (qt_ckpt_state.h). */
#include "qt_ckpt_state.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_error.h"

/* One blob: the field of qt_ckpt_state at off; bytes > 0: a value of exactly that size; 0: a text whose
 * pointer is at off and whose length is at len_off. optional: a file without it (written before the
 * blob existed) loads with the field zeroed; a present one is checked all the same. min_bytes > 0: a
 * struct that grows at its end: a file written before it grew holds its first min_bytes..bytes bytes
 * and the rest loads as zeros (what each added member means "as before" by). */
typedef struct {
    const char *name;
    size_t off, bytes, len_off;
    int optional;
    size_t min_bytes;
} blob_spec;

#define FIXED(n, f) {n, offsetof(qt_ckpt_state, f), sizeof(((qt_ckpt_state *)0)->f), 0, 0, 0}
#define FIXED_OPTIONAL(n, f) {n, offsetof(qt_ckpt_state, f), sizeof(((qt_ckpt_state *)0)->f), 0, 1, 0}
#define FIXED_GROWN(n, f, min) {n, offsetof(qt_ckpt_state, f), sizeof(((qt_ckpt_state *)0)->f), 0, 0, min}
#define TEXT(n, f, len) {n, offsetof(qt_ckpt_state, f), 0, offsetof(qt_ckpt_state, len), 0, 0}

static const blob_spec BLOBS[] = {
    FIXED("step", step),
    FIXED("rng", rng),
    FIXED("loader_pos", pos),
    FIXED_GROWN("model_cfg", model, QT_MODEL_CFG_BASE_BYTES),
    TEXT("config", config, config_bytes),
    FIXED_OPTIONAL("micro_batches_per_step", micro_batches),
};
enum { N_BLOBS = sizeof BLOBS / sizeof BLOBS[0] };

int qt_ckpt_state_count(void) { return N_BLOBS; }

int qt_ckpt_state_items(const qt_ckpt_state *s, qt_ckpt_item *items) {
    const char *base = (const char *)s;
    for (int i = 0; i < N_BLOBS; i++) {
        const blob_spec *b = &BLOBS[i];
        if (b->bytes) {
            items[i] = (qt_ckpt_item){b->name, -1, base + b->off, b->bytes, 0};
        } else {
            const char *text;
            size_t n;
            memcpy(&text, base + b->off, sizeof text);
            memcpy(&n, base + b->len_off, sizeof n);
            items[i] = (qt_ckpt_item){b->name, -1, text, n < QT_CKPT_TEXT_MAX ? n : QT_CKPT_TEXT_MAX - 1, 0};
        }
    }
    return N_BLOBS;
}

/* Every blob of the table present, of its size, copied into s. */
static int read_blobs(const qt_ckpt *ck, const char *path, qt_ckpt_state *s, char *err, size_t errlen) {
    char *base = (char *)s;
    for (int i = 0; i < N_BLOBS; i++) {
        const blob_spec *b = &BLOBS[i];
        size_t nb;
        const void *p = qt_ckpt_get(ck, b->name, &nb, NULL);
        if (!p && b->optional) continue;
        if (!p)
            return qt_errf(err, errlen, "%s: blob %s: missing (not a qtrain training checkpoint)", path, b->name);
        if (b->bytes && b->min_bytes && (nb < b->min_bytes || nb > b->bytes))
            return qt_errf(err, errlen, "%s: blob %s: %zu bytes, expected %zu to %zu", path, b->name, nb, b->min_bytes,
                           b->bytes);
        if (b->bytes && !b->min_bytes && nb != b->bytes)
            return qt_errf(err, errlen, "%s: blob %s: %zu bytes, expected %zu", path, b->name, nb, b->bytes);
        if (!b->bytes && (nb == 0 || nb >= QT_CKPT_TEXT_MAX))
            return qt_errf(err, errlen, "%s: blob %s: %zu bytes, expected 1..%zu", path, b->name, nb, QT_CKPT_TEXT_MAX - 1);
        if (b->bytes) {
            memcpy(base + b->off, p, nb);
        } else {
            memcpy(base + b->off, &p, sizeof p);
            memcpy(base + b->len_off, &nb, sizeof nb);
        }
    }
    return 0;
}

/* The config blob loaded into old. */
static int load_config(const qt_ckpt_state *s, const char *path, qt_config *old, char *err, size_t errlen) {
    char *yaml = malloc(s->config_bytes + 1), e2[2048];
    if (!yaml) return qt_errf(err, errlen, "%s: out of host memory", path);
    memcpy(yaml, s->config, s->config_bytes);
    yaml[s->config_bytes] = 0;
    int rc = 0;
    if (memchr(yaml, 0, s->config_bytes))
        rc = qt_errf(err, errlen, "%s: blob config: a NUL byte in its text: not a config", path);
    else if (qt_config_load_string(old, yaml, path, NULL, 0, e2, sizeof e2))
        rc = qt_errf(err, errlen, "%s: blob config: does not load as a config: %s", path, e2);
    free(yaml);
    return rc;
}

int qt_ckpt_state_read(const qt_ckpt *ck, const char *path, qt_ckpt_state *s, qt_config *old, char *err,
                       size_t errlen) {
    memset(s, 0, sizeof *s);
    if (read_blobs(ck, path, s, err, errlen)) return -1;
    if (s->micro_batches < 0)
        return qt_errf(err, errlen, "%s: blob micro_batches_per_step: %lld, expected >= 0", path, (long long)s->micro_batches);
    if (s->step < 0 || s->step != qt_ckpt_step(ck))
        return qt_errf(err, errlen, "%s: blob step: %lld, but the file's header holds step %ld", path,
                       (long long)s->step, qt_ckpt_step(ck));
    qt_config *c = old ? old : malloc(sizeof *c);
    if (!c) return qt_errf(err, errlen, "%s: out of host memory", path);
    int rc = load_config(s, path, c, err, errlen);
    /* an epoch reads at least one window; a step reads at most micro_batch x grad_accum x ranks */
    uint64_t most = (uint64_t)s->step * (uint64_t)(c->data.micro_batch > 0 ? c->data.micro_batch : 1) *
                    (uint64_t)(c->data.grad_accum > 0 ? c->data.grad_accum : 1) * QT_COMM_MAX_RANKS;
    if (!rc && s->pos.epoch > most)
        rc = qt_errf(err, errlen, "%s: blob loader_pos: epoch %llu, but %lld steps read at most %llu windows", path,
                     (unsigned long long)s->pos.epoch, (long long)s->step, (unsigned long long)most);
    if (c != old) free(c);
    return rc;
}
