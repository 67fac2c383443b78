/* qt_data.h — token shards and the data loader.
 *
 * Shard format (little-endian), described in tools/README.md:
 *   header, 64 bytes: magic "QTTOKENS" | u32 version (3; 1 and 2 are still read) | u32 token_bytes
 *                     (2 or 4) | u64 n_tokens | u32 vocab_size (every token id < vocab_size: the
 *                     tokenizer's largest id + 1) | u32 flags (version 1: reserved, 0) | u64 checksum |
 *                     u64 n_docs (version 3; zero bytes before) | 16 zero bytes
 *   payload: n_tokens tokens of token_bytes each, then, when flags & QT_TOKENS_FLAG_MASK (version 2
 *   and 3), n_tokens mask bytes, each 0 or 1: mask[i] = 1 means token i counts as a target; then,
 *   when flags & QT_TOKENS_FLAG_DOCS (version 3), n_docs u64 document starts: the indices of the
 *   tokens that begin a document, strictly increasing, each < n_tokens. Token 0 is a start only when
 *   a document begins there (a shard may open inside a document that an earlier shard began).
 *   checksum: versions 2 and 3: CRC-32 (IEEE, = Python's zlib.crc32) of all payload bytes,
 *   zero-extended; version 1: FNV-1a 64 of the payload bytes.
 *   version 4 adds QT_TOKENS_FLAG_PAIRS (preference pairs, tools/tokenize --pairs): u32 pair_seq_len S at byte 48;
 *   the shard is 2 P windows of S + 1 tokens at stride S (n_tokens = 2 P S + 1), window 2p holding pair p's chosen
 *   sequence and window 2p + 1 its rejected one (prompt + response from the window's first token, then padding),
 *   the mask (required) keeping the response tokens only.
 * A ".zst" suffix means the whole file (header + payload) is one zstd stream; it is read by
 * streaming decompression.
 *
 * The loader cuts each shard into windows of seq_len+1 tokens (stride seq_len). Each epoch visits
 * the shards in a seeded random order and each shard's windows in a seeded random order. A global
 * batch is world*micro_batch consecutive windows of that stream; rank r takes windows
 * [r*micro_batch, (r+1)*micro_batch). The position (epoch, shard cursor, window cursor) can be saved
 * and restored exactly. A masked shard's targets whose mask byte is 0 come out as -1 (ignored by the
 * loss, which averages over the targets >= 0). It marks the start of the next global batch, so it is the same on every rank
 * (save it from any rank) and does not depend on world or rank. Only the shard being read is held in
 * memory. */
#ifndef QT_DATA_H
#define QT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define QT_TOKENS_MAGIC "QTTOKENS"
#define QT_TOKENS_VERSION 4 /* the newest version read; 3 is written when a shard carries document starts, 4 for pairs */
#define QT_TOKENS_HEADER_BYTES 64
#define QT_TOKENS_FLAG_MASK 1u /* a loss mask follows the tokens */
#define QT_TOKENS_FLAG_DOCS 2u /* document starts follow the tokens and mask (version 3) */
#define QT_TOKENS_FLAG_PAIRS 4u /* the windows are preference pairs of pair_seq_len (version 4) */

typedef struct {
    uint32_t version, token_bytes, vocab_size, flags;
    uint64_t n_tokens, checksum;
    uint64_t n_docs; /* document starts in the payload (flags & QT_TOKENS_FLAG_DOCS), else 0 */
    uint32_t pair_seq_len; /* flags & QT_TOKENS_FLAG_PAIRS: the windows' seq_len S, else 0 */
} qt_tokens_header;

/* Payload bytes after the header: the tokens, plus the mask when flags has QT_TOKENS_FLAG_MASK, plus
 * 8 * n_docs bytes of document starts. */
uint64_t qt_tokens_payload_bytes(const qt_tokens_header *h);

uint64_t qt_fnv1a64(const void *data, size_t n, uint64_t h); /* start with h = QT_FNV_INIT */
#define QT_FNV_INIT 0xcbf29ce484222325ull

/* Writes tokens (and mask[n], each 0 or 1, when mask != NULL) as a version 2 shard to path
 * (zstd-compressed at zstd_level when path ends in ".zst"), via a temporary file and rename.
 * token_bytes 2 requires vocab_size <= 65536. Returns 0 or -1 with err. */
int qt_tokens_write_masked(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n,
                          int token_bytes, uint32_t vocab_size, int zstd_level, char *err, size_t errlen);
/* qt_tokens_write_masked, plus the document starts docs[n_docs] (strictly increasing, each < n):
 * a version 3 shard with QT_TOKENS_FLAG_DOCS. docs == NULL writes what qt_tokens_write_masked does. */
int qt_tokens_write_docs(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n,
                         const uint64_t *docs, uint64_t n_docs, int token_bytes, uint32_t vocab_size,
                         int zstd_level, char *err, size_t errlen);
/* qt_tokens_write_docs as a version 4 pair shard (QT_TOKENS_FLAG_PAIRS, qt_data.h's layout) of pair_seq_len S:
 * n = 2 P S + 1 tokens, P >= 1, and a mask. */
int qt_tokens_write_pairs(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n, const uint64_t *docs,
                          uint64_t n_docs, uint32_t pair_seq_len, int token_bytes, uint32_t vocab_size, int zstd_level,
                          char *err, size_t errlen);
/* qt_tokens_write_masked without a mask. */
int qt_tokens_write(const char *path, const uint32_t *tokens, uint64_t n, int token_bytes,
                   uint32_t vocab_size, int zstd_level, char *err, size_t errlen);
/* Reads and checks only the header: magic, version, flags, token_bytes, and for a plain .bin the file
 * size (64 + qt_tokens_payload_bytes). A .zst shard is decompressed only as far as its header. Returns
 * 0 or -1 with err naming the file and problem. */
int qt_tokens_read_header(const char *path, qt_tokens_header *h, char *err, size_t errlen);

/* A shard's payload held in memory, in a malloc'ed buffer (read with pread for .bin, decompressed for
 * .zst; never mmap'ed, so a file truncated under us is an error, not SIGBUS). Tokens stay
 * little-endian at their stored width; read token i with qt_tokens_token(). */
typedef struct {
    qt_tokens_header h;
    const uint8_t *payload; /* n_tokens * token_bytes bytes (then the mask) */
    const uint8_t *mask;    /* [n_tokens] 0/1 inside payload, or NULL when the shard has no mask */
    void *base_;            /* owned buffer; released by qt_tokens_unload */
    const uint8_t *docs;    /* [h.n_docs] u64 little-endian document starts inside payload, or NULL */
} qt_tokens_data;

/* Loads and verifies a shard (header, size, checksum, every token < vocab_size, mask bytes 0 or 1,
 * document starts increasing and < n_tokens and, when vocab_limit > 0, a header vocab_size <=
 * vocab_limit). Returns 0 or -1 with err; on error
 * d holds nothing to unload. */
int qt_tokens_load(const char *path, uint32_t vocab_limit, qt_tokens_data *d, char *err, size_t errlen);
void qt_tokens_unload(qt_tokens_data *d); /* releases d's memory; safe on a zeroed or unloaded d */
static inline uint32_t qt_tokens_token(const qt_tokens_data *d, uint64_t i) {
    const uint8_t *p = d->payload + i * d->h.token_bytes;
    return d->h.token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                 : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                       (uint32_t)p[3] << 24;
}

/* Document start i of a loaded shard (i < d->h.n_docs). */
static inline uint64_t qt_tokens_doc_start(const qt_tokens_data *d, uint64_t i) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | d->docs[8 * i + k];
    return v;
}

/* Reads and verifies a whole shard (magic, version, size, checksum, every token < vocab_size); the
 * tokens only (a mask is checked, not returned: qt_tokens_load has it). *tokens is malloc'ed; the
 * caller frees it. Returns 0 or -1 with err naming the file and problem. */
int qt_tokens_read(const char *path, uint32_t **tokens, qt_tokens_header *h, char *err, size_t errlen);

typedef struct {
    uint64_t epoch, shard_cursor, window_cursor;
} qt_loader_pos;

typedef struct qt_loader qt_loader;

/* Opens every file matching glob: one or more comma-separated glob(7) patterns, each of which must
 * match at least one file; matches are sorted within a pattern and patterns keep their order. shuffle=0 visits shards and windows in file order
 * (eval). vocab_limit > 0: any token >= vocab_limit, or a shard whose vocab_size exceeds it, is an
 * error. Every shard's header (and a .bin's size) is checked here, so a bad shard stops the run before
 * its first step; payload checksums are checked when a shard is first read. Returns NULL with err on
 * failure (no match, bad shard, shard shorter than a window). */
qt_loader *qt_loader_open(const char *glob, int seq_len, int micro_batch, int rank, int world,
                          uint64_t seed, int shuffle, uint32_t vocab_limit, char *err, size_t errlen);
/* This rank's next micro-batch: inputs and targets [micro_batch * seq_len] each (a masked-out target
 * is -1). Wraps to the next epoch at the end of the data. Returns 0, or -1 with err when a shard
 * cannot be read or fails its checks (corrupt, truncated or changed on disk since qt_loader_open);
 * the position is then where it was before the call, so a checkpoint saved now resumes there. */
int qt_loader_next(qt_loader *l, int32_t *inputs, int32_t *targets, char *err, size_t errlen);
/* qt_loader_next, plus where documents begin in each window b of the micro-batch: starts[b*seq_len +
 * k] for k < n_starts[b] are the input positions (ascending, in [0, seq_len)) whose token begins a
 * document. Position 0 is listed only when a document begins exactly there (a window may open inside
 * one). n_starts[b] = 0 for a shard without document starts (version 1 and 2, or version 3 without
 * QT_TOKENS_FLAG_DOCS). starts[b*seq_len + k] for k >= n_starts[b] is left as it was. */
int qt_loader_next_docs(qt_loader *l, int32_t *inputs, int32_t *targets, int32_t *starts, int32_t *n_starts,
                        char *err, size_t errlen);
qt_loader_pos qt_loader_get_pos(const qt_loader *l);
void qt_loader_set_pos(qt_loader *l, qt_loader_pos p);
/* 0 when qt_loader_set_pos(l, p) would accept p (its cursors inside this data), else -1 with err. */
int qt_loader_check_pos(qt_loader *l, qt_loader_pos p, char *err, size_t errlen);
void qt_loader_reset(qt_loader *l);             /* back to the start of epoch 0 */
uint64_t qt_loader_windows(const qt_loader *l); /* windows per epoch, all shards */
int qt_loader_shards(const qt_loader *l);       /* the shards opened */
int qt_loader_doc_shards(const qt_loader *l);   /* those carrying document starts (QT_TOKENS_FLAG_DOCS) */
/* 1 when the shards are pair shards (QT_TOKENS_FLAG_PAIRS; qt_loader_open refuses a mix): a micro-batch is then
 * micro_batch / 2 pairs, rows 2p and 2p + 1 pair p's chosen and rejected sequences, and the seeded order shuffles
 * pairs, never splitting one; qt_loader_windows counts sequences. */
int qt_loader_pairs(const qt_loader *l);
/* The data's rows: its windows in glob order, each shard's in file order (a pair shard's pair p: rows 2p, 2p + 1 of
 * it); the shuffle never changes a window's row. rows[b] for b < micro_batch: the row of window b of the last
 * successful qt_loader_next / qt_loader_next_docs call (rank r's rows, as it read them). */
void qt_loader_last_rows(const qt_loader *l, uint64_t *rows);
/* Rows [row0, row0 + n) into in, tgt [n * seq_len] (and starts, n_starts as qt_loader_next_docs; both may be NULL),
 * whatever the position, which it leaves as it is; a row past the last is token 0 with every target ignored (-1)
 * and no document start. 0, or -1 with err when a shard cannot be read. */
int qt_loader_read_rows(qt_loader *l, uint64_t row0, int n, int32_t *in, int32_t *tgt, int32_t *starts,
                        int32_t *n_starts, char *err, size_t errlen);
/* Shard i (< qt_loader_shards, glob order): its path, its header, its row count and its first row (*first). */
const char *qt_loader_shard_path(const qt_loader *l, int i);
const qt_tokens_header *qt_loader_shard_header(const qt_loader *l, int i);
uint64_t qt_loader_shard_rows(const qt_loader *l, int i, uint64_t *first);
void qt_loader_free(qt_loader *l);

#endif
