/* ckpt_forge.h — forging checkpoint files (layout in src/io/ckpt.c: a 64-byte header, 128-byte table
 * entries: name[96], i32 dtype, u32 0, u64 bytes, u64 offset, u64 hash): edit the table or a payload,
 * then recompute every checksum, so that a reader gets past the hashes to its checks of what the
 * blobs hold. Used by the checkpoint fuzzer and by test_ckpt_forged.c. */
#ifndef QT_CKPT_FORGE_H
#define QT_CKPT_FORGE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qt_ckpt.h"

enum { FORGE_HDR = 64, FORGE_ENTRY = 128, FORGE_NAME = 96 };

static inline uint64_t forge_rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void forge_wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Table entries that fit in the n-byte file (at most the header's count). */
static inline uint32_t forge_count(const uint8_t *b, size_t n) {
    if (n < FORGE_HDR) return 0;
    uint32_t cnt;
    memcpy(&cnt, b + 12, 4);
    size_t max = (n - FORGE_HDR) / FORGE_ENTRY;
    return cnt < max ? cnt : (uint32_t)max;
}

static inline uint8_t *forge_entry(uint8_t *b, uint32_t i) { return b + FORGE_HDR + (size_t)i * FORGE_ENTRY; }

/* The entry named name, or -1. */
static inline int forge_find(uint8_t *b, size_t n, const char *name) {
    for (uint32_t i = 0; i < forge_count(b, n); i++)
        if (strncmp((const char *)forge_entry(b, i), name, FORGE_NAME) == 0) return (int)i;
    return -1;
}

/* Sets the header's file size to n, every in-range blob's hash and the header/table hash. */
static inline void forge_fix(uint8_t *b, size_t n) {
    if (n < FORGE_HDR) return;
    uint32_t k = forge_count(b, n);
    forge_wr64(b + 24, n);
    for (uint32_t i = 0; i < k; i++) {
        uint8_t *e = forge_entry(b, i);
        uint64_t bytes = forge_rd64(e + 104), off = forge_rd64(e + 112);
        if (off <= n && bytes <= n - off) forge_wr64(e + 120, qt_ckpt_hash64(b + off, bytes));
    }
    uint8_t *t = malloc(32 + (size_t)k * FORGE_ENTRY); /* the header's first 32 bytes, then the table */
    if (!t) abort();
    memcpy(t, b, 32);
    memcpy(t + 32, b + FORGE_HDR, (size_t)k * FORGE_ENTRY);
    forge_wr64(b + 32, qt_ckpt_hash64(t, 32 + (size_t)k * FORGE_ENTRY));
    free(t);
}

#endif
