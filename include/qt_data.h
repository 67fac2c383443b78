/* qt_data.h — token shards and the data loader.
 *
 * Shard format (little-endian), described in tools/README.md:
 *   header, 64 bytes: magic "QTTOKENS" | u32 version (1) | u32 token_bytes (2 or 4) | u64 n_tokens |
 *                     u32 vocab_size | u32 reserved (0) | u64 checksum (FNV-1a 64 of the payload
 *                     bytes) | 24 zero bytes
 *   payload: n_tokens tokens of token_bytes each.
 * A ".zst" suffix means the whole file (header + payload) is one zstd stream; it is read by
 * streaming decompression.
 *
 * The loader cuts each shard into windows of seq_len+1 tokens (stride seq_len). Each epoch visits
 * the shards in a seeded random order and each shard's windows in a seeded random order. A global
 * batch is world*micro_batch consecutive windows of that stream; rank r takes windows
 * [r*micro_batch, (r+1)*micro_batch). The position (epoch, shard cursor, window cursor) can be saved
 * and restored exactly. It marks the start of the next global batch, so it is the same on every rank
 * (save it from any rank) and does not depend on world or rank. Only the shard being read is held in
 * memory. */
#ifndef QT_DATA_H
#define QT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define QT_SHARD_MAGIC "QTTOKENS"
#define QT_SHARD_VERSION 1
#define QT_SHARD_HEADER_BYTES 64

typedef struct {
    uint32_t version, token_bytes, vocab_size;
    uint64_t n_tokens, checksum;
} qt_shard_header;

uint64_t qt_fnv1a64(const void *data, size_t n, uint64_t h); /* start with h = QT_FNV_INIT */
#define QT_FNV_INIT 0xcbf29ce484222325ull

/* Writes tokens to path (zstd-compressed at zstd_level when path ends in ".zst"), via a temporary
 * file and rename. token_bytes 2 requires vocab_size <= 65536. Returns 0 or -1 with err. */
int qt_shard_write(const char *path, const uint32_t *tokens, uint64_t n, int token_bytes,
                   uint32_t vocab_size, int zstd_level, char *err, size_t errlen);
/* Reads and checks only the header: magic, version, token_bytes, and for a plain .bin the file size
 * (64 + n_tokens*token_bytes). A .zst shard is decompressed only as far as its header. Returns 0 or
 * -1 with err naming the file and problem. */
int qt_shard_read_header(const char *path, qt_shard_header *h, char *err, size_t errlen);

/* A shard's payload held in memory: mmap'ed for .bin, decompressed into a malloc'ed buffer for .zst.
 * Tokens stay little-endian at their stored width; read token i with qt_shard_token(). */
typedef struct {
    qt_shard_header h;
    const uint8_t *payload; /* n_tokens * token_bytes bytes */
    void *base_;            /* owned mapping or buffer; released by qt_shard_unload */
    size_t len_;
    int mapped_;
} qt_shard_data;

/* Loads and verifies a shard (header, size, checksum, every token < vocab_size and, when
 * vocab_limit > 0, a header vocab_size <= vocab_limit). Returns 0 or -1 with err; on error d holds
 * nothing to unload. */
int qt_shard_load(const char *path, uint32_t vocab_limit, qt_shard_data *d, char *err, size_t errlen);
void qt_shard_unload(qt_shard_data *d); /* releases d's memory; safe on a zeroed or unloaded d */
static inline uint32_t qt_shard_token(const qt_shard_data *d, uint64_t i) {
    const uint8_t *p = d->payload + i * d->h.token_bytes;
    return d->h.token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                 : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                       (uint32_t)p[3] << 24;
}

/* Reads and verifies a whole shard (magic, version, size, checksum, every token < vocab_size).
 * *tokens is malloc'ed; the caller frees it. Returns 0 or -1 with err naming the file and problem. */
int qt_shard_read(const char *path, uint32_t **tokens, qt_shard_header *h, char *err, size_t errlen);

typedef struct {
    uint64_t epoch, shard_cursor, window_cursor;
} qt_loader_pos;

typedef struct qt_loader qt_loader;

/* Opens every file matching glob: one or more comma-separated glob(7) patterns, each of which must
 * match at least one file; matches are sorted within a pattern and patterns keep their order. shuffle=0 visits shards and windows in file order
 * (eval). vocab_limit > 0: any token >= vocab_limit, or a shard whose vocab_size exceeds it, is an
 * error. Returns NULL with err on failure (no match, bad shard, shard shorter than a window). */
qt_loader *qt_loader_open(const char *glob, int seq_len, int micro_batch, int rank, int world,
                          uint64_t seed, int shuffle, uint32_t vocab_limit, char *err, size_t errlen);
/* This rank's next micro-batch: inputs and targets [micro_batch * seq_len] each. Wraps to the next
 * epoch at the end of the data. Returns 0, or -1 with err naming the shard when it cannot be read or
 * changed on disk since the loader opened it (the position is then undefined). */
int qt_loader_next(qt_loader *l, int32_t *inputs, int32_t *targets, char *err, size_t errlen);
qt_loader_pos qt_loader_get_pos(const qt_loader *l);
void qt_loader_set_pos(qt_loader *l, qt_loader_pos p);
void qt_loader_reset(qt_loader *l);             /* back to the start of epoch 0 */
uint64_t qt_loader_windows(const qt_loader *l); /* windows per epoch, all shards */
void qt_loader_free(qt_loader *l);

#endif
