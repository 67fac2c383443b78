/* shard.c — token shards: write, read the header, load and verify the payload (.bin or .bin.zst).
 *
 * The byte layout is in include/qt_data.h and tools/README.md. Every integer is encoded byte by byte
 * so the files are little-endian whatever the host. A .bin payload is read with pread into a buffer
 * (not mmap'ed: a file truncated under a mapping kills the process with SIGBUS, a short pread is an
 * error we can report); a .zst shard is read by ZSTD_decompressStream into a buffer sized from the
 * header (never from the frame content size, which streaming writers such as `zstd -` leave out).
 * Version 2 checksums with CRC-32 (qt_crc32.h, 2.5x faster than the byte-serial FNV-1a of version 1,
 * which is still read) and may carry a loss mask after the tokens; version 3 adds the document starts
 * after the mask (their count in the header, so the payload size is known before it is read). A shard
 * without document starts is written as version 2, which every reader takes; version 4 marks a shard of preference
 * pairs (QT_TOKENS_FLAG_PAIRS and their window length in the header). */
#include "qt_data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "qt_crc32.h"
#include "qt_file.h"

#define CHUNK_TOKENS 65536

uint64_t qt_fnv1a64(const void *data, size_t n, uint64_t h) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    if (!err || !errlen) return -1;
    int n = snprintf(err, errlen, "%s: ", path);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int is_zst(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".zst") == 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void encode_header(uint8_t *b, const qt_tokens_header *h) {
    memset(b, 0, QT_TOKENS_HEADER_BYTES);
    memcpy(b, QT_TOKENS_MAGIC, 8);
    put32(b + 8, h->version);
    put32(b + 12, h->token_bytes);
    put64(b + 16, h->n_tokens);
    put32(b + 24, h->vocab_size);
    put32(b + 28, h->flags);
    put64(b + 32, h->checksum);
    if (h->version >= 3) put64(b + 40, h->n_docs);
    if (h->version >= 4) put32(b + 48, h->pair_seq_len);
}

/* Version 4's pair layout: pair_seq_len S with QT_TOKENS_FLAG_PAIRS (0 without), a mask, n_tokens = 2 P S + 1. */
static int decode_pairs(const uint8_t *b, qt_tokens_header *h, const char *path, char *err, size_t errlen) {
    h->pair_seq_len = get32(b + 48);
    uint64_t S = h->pair_seq_len;
    if (!(h->flags & QT_TOKENS_FLAG_PAIRS))
        return S ? fail(err, errlen, path, "pair_seq_len %u without the pairs flag 0x%x", h->pair_seq_len,
                        QT_TOKENS_FLAG_PAIRS) : 0;
    if (!(h->flags & QT_TOKENS_FLAG_MASK))
        return fail(err, errlen, path, "a pair shard (flag 0x%x) without a loss mask (flag 0x%x): nothing says which "
                    "tokens are the responses", QT_TOKENS_FLAG_PAIRS, QT_TOKENS_FLAG_MASK);
    if (S == 0 || h->n_tokens < 2 * S + 1 || (h->n_tokens - 1) % (2 * S))
        return fail(err, errlen, path, "a pair shard of %llu tokens with pair_seq_len %u (expected 2 P x seq_len + 1 "
                    "tokens, P >= 1 pairs)", (unsigned long long)h->n_tokens, h->pair_seq_len);
    return 0;
}

/* Decodes and checks the fields that do not need the payload. */
static int decode_header(const uint8_t *b, qt_tokens_header *h, const char *path, char *err, size_t errlen) {
    if (memcmp(b, QT_TOKENS_MAGIC, 8) != 0) return fail(err, errlen, path, "bad magic (expected QTTOKENS)");
    h->version = get32(b + 8);
    h->token_bytes = get32(b + 12);
    h->n_tokens = get64(b + 16);
    h->vocab_size = get32(b + 24);
    h->flags = get32(b + 28);
    h->checksum = get64(b + 32);
    h->n_docs = 0;
    h->pair_seq_len = 0;
    if (h->version < 1 || h->version > QT_TOKENS_VERSION)
        return fail(err, errlen, path, "unsupported version %u (expected 1 to %d)", h->version, QT_TOKENS_VERSION);
    uint32_t known = h->version == 1   ? 0 /* version 1: the field is reserved, 0 */
                     : h->version == 2 ? QT_TOKENS_FLAG_MASK
                     : h->version == 3 ? QT_TOKENS_FLAG_MASK | QT_TOKENS_FLAG_DOCS
                                       : QT_TOKENS_FLAG_MASK | QT_TOKENS_FLAG_DOCS | QT_TOKENS_FLAG_PAIRS;
    if (h->flags & ~known)
        return fail(err, errlen, path, "unknown flags 0x%x in a version %u header (expected 0x%x or less)",
                    h->flags, h->version, known);
    if (h->token_bytes != 2 && h->token_bytes != 4)
        return fail(err, errlen, path, "token_bytes is %u (expected 2 or 4)", h->token_bytes);
    if (h->vocab_size == 0 || (h->token_bytes == 2 && h->vocab_size > 65536))
        return fail(err, errlen, path, "vocab_size %u does not fit token_bytes %u", h->vocab_size, h->token_bytes);
    if (h->n_tokens > (SIZE_MAX - QT_TOKENS_HEADER_BYTES) / (h->token_bytes + 1 + 8))
        return fail(err, errlen, path, "header says %llu tokens, too many for this machine",
                    (unsigned long long)h->n_tokens);
    if (h->version >= 3) h->n_docs = get64(b + 40);
    if (h->n_docs && !(h->flags & QT_TOKENS_FLAG_DOCS))
        return fail(err, errlen, path, "n_docs %llu without the document-starts flag 0x%x", (unsigned long long)h->n_docs,
                    QT_TOKENS_FLAG_DOCS);
    if (h->n_docs > h->n_tokens)
        return fail(err, errlen, path, "n_docs %llu > n_tokens %llu (at most one document starts at each token)",
                    (unsigned long long)h->n_docs, (unsigned long long)h->n_tokens);
    return h->version >= 4 ? decode_pairs(b, h, path, err, errlen) : 0;
}

static void encode_tokens(uint8_t *out, const uint32_t *t, size_t n, int tb) {
    for (size_t i = 0; i < n; i++) {
        if (tb == 2) {
            out[2 * i] = (uint8_t)t[i];
            out[2 * i + 1] = (uint8_t)(t[i] >> 8);
        } else {
            put32(out + 4 * i, t[i]);
        }
    }
}

/* Streams header + payload through fwrite, or through a zstd compressor when cctx is set. */
static int write_bytes(FILE *f, ZSTD_CCtx *cctx, const void *src, size_t n, int end, uint8_t *zbuf,
                       size_t zcap) {
    if (!cctx) return fwrite(src, 1, n, f) == n ? 0 : -1;
    ZSTD_inBuffer in = {src, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {zbuf, zcap, 0};
        size_t left = ZSTD_compressStream2(cctx, &out, &in, end ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(left)) return -1;
        if (out.pos && fwrite(zbuf, 1, out.pos, f) != out.pos) return -1;
        if (end ? left == 0 : in.pos == in.size) return 0;
    }
}

/* docs[n_docs] as u64 little-endian into out[8 * n_docs]. */
static void encode_docs(uint8_t *out, const uint64_t *docs, size_t n_docs) {
    for (size_t i = 0; i < n_docs; i++) put64(out + 8 * i, docs[i]);
}

/* use_zstd: compress the whole file (header + tokens + mask + document starts) as one zstd frame at
 * zstd_level. */
static int write_file(FILE *f, const uint32_t *tokens, const uint8_t *mask, const uint64_t *docs, uint64_t n, int tb,
                      const qt_tokens_header *h, int use_zstd, int zstd_level) {
    uint8_t hb[QT_TOKENS_HEADER_BYTES];
    encode_header(hb, h);
    ZSTD_CCtx *cctx = NULL;
    size_t zcap = ZSTD_CStreamOutSize();
    uint8_t *buf = malloc((size_t)CHUNK_TOKENS * (tb > 8 ? tb : 8)), *zbuf = NULL;
    int rc = buf ? 0 : -1;
    if (use_zstd && rc == 0) {
        cctx = ZSTD_createCCtx();
        zbuf = malloc(zcap);
        if (!cctx || !zbuf || ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, zstd_level)))
            rc = -1;
    }
    if (rc == 0) rc = write_bytes(f, cctx, hb, sizeof hb, 0, zbuf, zcap);
    for (uint64_t i = 0; rc == 0 && i < n; i += CHUNK_TOKENS) {
        size_t m = (size_t)(n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS);
        encode_tokens(buf, tokens + i, m, tb);
        rc = write_bytes(f, cctx, buf, m * tb, 0, zbuf, zcap);
    }
    for (uint64_t i = 0; rc == 0 && mask && i < n; i += CHUNK_TOKENS) {
        size_t m = (size_t)(n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS);
        rc = write_bytes(f, cctx, mask + i, m, 0, zbuf, zcap);
    }
    for (uint64_t i = 0; rc == 0 && docs && i < h->n_docs; i += CHUNK_TOKENS) {
        size_t m = (size_t)(h->n_docs - i < CHUNK_TOKENS ? h->n_docs - i : CHUNK_TOKENS);
        encode_docs(buf, docs + i, m);
        rc = write_bytes(f, cctx, buf, 8 * m, 0, zbuf, zcap);
    }
    if (rc == 0 && cctx) rc = write_bytes(f, cctx, "", 0, 1, zbuf, zcap);
    ZSTD_freeCCtx(cctx);
    free(zbuf);
    free(buf);
    return rc;
}

int qt_tokens_write(const char *path, const uint32_t *tokens, uint64_t n, int token_bytes,
                   uint32_t vocab_size, int zstd_level, char *err, size_t errlen) {
    return qt_tokens_write_masked(path, tokens, NULL, n, token_bytes, vocab_size, zstd_level, err, errlen);
}

int qt_tokens_write_masked(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n,
                          int token_bytes, uint32_t vocab_size, int zstd_level, char *err, size_t errlen) {
    return qt_tokens_write_docs(path, tokens, mask, n, NULL, 0, token_bytes, vocab_size, zstd_level, err, errlen);
}

int qt_tokens_write_docs(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n,
                         const uint64_t *docs, uint64_t n_docs, int token_bytes, uint32_t vocab_size,
                         int zstd_level, char *err, size_t errlen) {
    return qt_tokens_write_pairs(path, tokens, mask, n, docs, n_docs, 0, token_bytes, vocab_size, zstd_level, err, errlen);
}

int qt_tokens_write_pairs(const char *path, const uint32_t *tokens, const uint8_t *mask, uint64_t n, const uint64_t *docs,
                          uint64_t n_docs, uint32_t pair_seq_len, int token_bytes, uint32_t vocab_size, int zstd_level,
                          char *err, size_t errlen) {
    uint64_t S = pair_seq_len;
    if (S && (!mask || n < 2 * S + 1 || (n - 1) % (2 * S)))
        return fail(err, errlen, path, "pairs of seq_len %u: expected a mask and 2 P x seq_len + 1 tokens, got %llu%s",
                    pair_seq_len, (unsigned long long)n, mask ? "" : " and no mask");
    if (token_bytes != 2 && token_bytes != 4)
        return fail(err, errlen, path, "token_bytes %d (expected 2 or 4)", token_bytes);
    if (vocab_size == 0 || (token_bytes == 2 && vocab_size > 65536))
        return fail(err, errlen, path, "vocab_size %u does not fit token_bytes %d", vocab_size, token_bytes);
    /* First pass: range checks and the checksum of the encoded payload (tokens, then mask), so the
     * header goes first even into a zstd stream that cannot seek back. */
    uint8_t buf[4 * 1024];
    uint32_t sum = 0;
    for (uint64_t i = 0; i < n; i += 1024) {
        size_t m = (size_t)(n - i < 1024 ? n - i : 1024);
        for (size_t j = 0; j < m; j++)
            if (tokens[i + j] >= vocab_size)
                return fail(err, errlen, path, "token %u at index %llu >= vocab_size %u", tokens[i + j],
                            (unsigned long long)(i + j), vocab_size);
        encode_tokens(buf, tokens + i, m, token_bytes);
        sum = qt_crc32(sum, buf, m * token_bytes);
    }
    for (uint64_t i = 0; mask && i < n; i++)
        if (mask[i] > 1)
            return fail(err, errlen, path, "mask byte %u at index %llu (expected 0 or 1)", mask[i],
                        (unsigned long long)i);
    if (mask) sum = qt_crc32(sum, mask, (size_t)n);
    for (uint64_t i = 0; docs && i < n_docs; i++) {
        if (docs[i] >= n || (i && docs[i] <= docs[i - 1]))
            return fail(err, errlen, path, "document start %llu at index %llu (expected increasing, < %llu tokens)",
                        (unsigned long long)docs[i], (unsigned long long)i, (unsigned long long)n);
        encode_docs(buf, docs + i, 1);
        sum = qt_crc32(sum, buf, 8);
    }
    qt_tokens_header h = {.version = S ? 4 : docs ? 3 : 2, .token_bytes = (uint32_t)token_bytes, .vocab_size = vocab_size,
                         .flags = (mask ? QT_TOKENS_FLAG_MASK : 0) | (docs ? QT_TOKENS_FLAG_DOCS : 0) |
                                  (S ? QT_TOKENS_FLAG_PAIRS : 0),
                         .n_tokens = n, .checksum = sum, .n_docs = docs ? n_docs : 0, .pair_seq_len = pair_seq_len};
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return fail(err, errlen, path, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fail(err, errlen, path, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int rc = write_file(f, tokens, mask, docs, n, token_bytes, &h, is_zst(path), zstd_level);
    int saved = errno;
    if (fclose(f) != 0 && rc == 0) rc = -1, saved = errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1, saved = errno;
    if (rc != 0) {
        unlink(tmp);
        fail(err, errlen, path, "write failed: %s", strerror(saved));
    }
    free(tmp);
    return rc;
}

/* Streaming zstd reader: fills dst (exactly cap bytes) from the decompressed stream. Returns the
 * bytes produced (< cap at end of input), or -1 on a zstd or I/O error (message in err). */
typedef struct {
    FILE *f;
    ZSTD_DCtx *d;
    uint8_t *in;
    size_t in_cap;
    ZSTD_inBuffer ib;
    size_t last; /* last ZSTD_decompressStream result: 0 when a frame ended cleanly */
} zreader;

static int zreader_open(zreader *z, const char *path, char *err, size_t errlen) {
    memset(z, 0, sizeof *z);
    const char *why = NULL;
    int fd = qt_open_regular(path, &why);
    if (fd < 0 || !(z->f = fdopen(fd, "rb"))) {
        if (fd >= 0) close(fd);
        return fail(err, errlen, path, fd == -2 ? "not a regular file (%s)" : "cannot open: %s", why ? why : strerror(errno));
    }
    z->d = ZSTD_createDCtx();
    z->in_cap = ZSTD_DStreamInSize();
    z->in = malloc(z->in_cap);
    z->ib = (ZSTD_inBuffer){z->in, 0, 0};
    if (!z->d || !z->in) return fail(err, errlen, path, "out of memory");
    return 0;
}

static void zreader_close(zreader *z) {
    if (z->f) fclose(z->f);
    ZSTD_freeDCtx(z->d);
    free(z->in);
}

static int64_t zreader_read(zreader *z, void *dst, size_t cap, const char *path, char *err, size_t errlen) {
    ZSTD_outBuffer ob = {dst, cap, 0};
    while (ob.pos < cap) {
        if (z->ib.pos == z->ib.size) {
            size_t got = fread(z->in, 1, z->in_cap, z->f);
            if (got == 0) {
                if (ferror(z->f)) return fail(err, errlen, path, "read error: %s", strerror(errno));
                break;
            }
            z->ib = (ZSTD_inBuffer){z->in, got, 0};
        }
        size_t r = ZSTD_decompressStream(z->d, &ob, &z->ib);
        if (ZSTD_isError(r)) return fail(err, errlen, path, "zstd: %s", ZSTD_getErrorName(r));
        z->last = r;
    }
    return (int64_t)ob.pos;
}

uint64_t qt_tokens_payload_bytes(const qt_tokens_header *h) {
    return h->n_tokens * (h->token_bytes + (h->flags & QT_TOKENS_FLAG_MASK ? 1 : 0)) + 8 * h->n_docs;
}

static int check_bin_size(const char *path, const qt_tokens_header *h, uint64_t size, char *err, size_t errlen) {
    uint64_t want = QT_TOKENS_HEADER_BYTES + qt_tokens_payload_bytes(h);
    const char *what = h->flags & QT_TOKENS_FLAG_MASK ? (h->n_docs ? ", their mask and document starts" : " and their mask")
                       : h->n_docs                    ? " and document starts"
                                                      : "";
    if (size < want)
        return fail(err, errlen, path, "truncated: header says %llu tokens%s (%llu bytes), file has %llu bytes",
                    (unsigned long long)h->n_tokens, what, (unsigned long long)want, (unsigned long long)size);
    if (size > want)
        return fail(err, errlen, path, "trailing data: header says %llu tokens%s (%llu bytes), file has %llu bytes",
                    (unsigned long long)h->n_tokens, what, (unsigned long long)want, (unsigned long long)size);
    return 0;
}

/* Opens a .bin and checks its header and file size. Returns the open fd (the caller closes it) or -1. */
static int open_bin(const char *path, qt_tokens_header *h, uint64_t *size, char *err, size_t errlen) {
    uint8_t hb[QT_TOKENS_HEADER_BYTES];
    struct stat st;
    const char *why;
    int fd = qt_open_regular(path, &why);
    if (fd < 0) return fail(err, errlen, path, fd == -2 ? "not a regular file (%s)" : "cannot open: %s", why);
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = fail(err, errlen, path, "cannot stat: %s", strerror(errno));
    *size = rc ? 0 : (uint64_t)st.st_size;
    if (rc == 0 && *size < QT_TOKENS_HEADER_BYTES)
        rc = fail(err, errlen, path, "truncated: file has %llu bytes, fewer than the %d-byte header",
                  (unsigned long long)*size, QT_TOKENS_HEADER_BYTES);
    if (rc == 0 && pread(fd, hb, sizeof hb, 0) != (ssize_t)sizeof hb)
        rc = fail(err, errlen, path, "cannot read header: %s", strerror(errno));
    if (rc == 0) rc = decode_header(hb, h, path, err, errlen);
    if (rc == 0) rc = check_bin_size(path, h, *size, err, errlen);
    if (rc != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Opens a .zst and decompresses and checks its header; z is left open either way (zreader_close). */
static int open_zst(zreader *z, const char *path, qt_tokens_header *h, char *err, size_t errlen) {
    uint8_t hb[QT_TOKENS_HEADER_BYTES];
    if (zreader_open(z, path, err, errlen) != 0) return -1;
    int64_t got = zreader_read(z, hb, sizeof hb, path, err, errlen);
    if (got < 0) return -1;
    if (got < QT_TOKENS_HEADER_BYTES)
        return fail(err, errlen, path, "truncated: %lld bytes decompressed, fewer than the %d-byte header",
                    (long long)got, QT_TOKENS_HEADER_BYTES);
    return decode_header(hb, h, path, err, errlen);
}

int qt_tokens_read_header(const char *path, qt_tokens_header *h, char *err, size_t errlen) {
    if (is_zst(path)) {
        zreader z;
        int rc = open_zst(&z, path, h, err, errlen);
        zreader_close(&z);
        return rc;
    }
    uint64_t size;
    int fd = open_bin(path, h, &size, err, errlen);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

static int load_zst(const char *path, qt_tokens_data *d, char *err, size_t errlen) {
    zreader z;
    uint8_t extra[16];
    int64_t got = open_zst(&z, path, &d->h, err, errlen);
    size_t plen = got >= 0 ? (size_t)qt_tokens_payload_bytes(&d->h) : 0, have = 0;
    /* The buffer grows with the data (64 MiB, doubling, up to what the header says), so a small stream
     * whose header claims terabytes is refused as truncated instead of sizing an allocation. */
    size_t cap = plen < ((size_t)64 << 20) ? plen : (size_t)64 << 20;
    if (got >= 0 && !(d->base_ = malloc(cap ? cap : 1)))
        got = fail(err, errlen, path, "cannot allocate %zu bytes for the payload", cap);
    while (got >= 0 && have < plen) {
        if (have == cap) {
            size_t ncap = cap > plen / 2 ? plen : cap * 2;
            uint8_t *nb = realloc(d->base_, ncap);
            if (!nb) {
                got = fail(err, errlen, path, "cannot allocate %zu bytes for the payload", ncap);
                break;
            }
            d->base_ = nb, cap = ncap;
        }
        got = zreader_read(&z, (char *)d->base_ + have, cap - have, path, err, errlen);
        if (got < 0) break;
        have += (size_t)got;
        if (have < cap) break; /* the stream ended */
    }
    if (got >= 0 && have < plen)
        got = fail(err, errlen, path, "truncated: header says %llu tokens (%zu payload bytes), stream has %zu",
                   (unsigned long long)d->h.n_tokens, plen, have);
    if (got >= 0) {
        int64_t more = zreader_read(&z, extra, sizeof extra, path, err, errlen);
        if (more > 0)
            got = fail(err, errlen, path, "trailing data: stream is longer than the %llu tokens the header says",
                       (unsigned long long)d->h.n_tokens);
        else if (more < 0)
            got = -1;
        else if (z.last != 0)
            got = fail(err, errlen, path, "truncated: the zstd frame ends early");
    }
    zreader_close(&z);
    if (got < 0) {
        free(d->base_);
        d->base_ = NULL;
        return -1;
    }
    d->payload = d->base_;
    return 0;
}

/* Reads the payload with pread: a file truncated since open_bin checked its size is a short read,
 * reported as an error (with mmap it would be SIGBUS on first touch). */
static int load_bin(const char *path, qt_tokens_data *d, char *err, size_t errlen) {
    uint64_t size;
    int fd = open_bin(path, &d->h, &size, err, errlen);
    if (fd < 0) return -1;
    size_t plen = (size_t)qt_tokens_payload_bytes(&d->h), done = 0;
    uint8_t *buf = malloc(plen ? plen : 1);
    int rc = buf ? 0 : fail(err, errlen, path, "cannot allocate %zu bytes for the payload", plen);
    while (rc == 0 && done < plen) {
        size_t want = plen - done < ((size_t)1 << 30) ? plen - done : (size_t)1 << 30;
        ssize_t got = pread(fd, buf + done, want, (off_t)(QT_TOKENS_HEADER_BYTES + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) rc = fail(err, errlen, path, "read error at byte %zu: %s", QT_TOKENS_HEADER_BYTES + done,
                               strerror(errno));
        else if (got == 0)
            rc = fail(err, errlen, path, "truncated while reading: %zu of %zu payload bytes (the file shrank "
                      "after it was opened)", done, plen);
        else done += (size_t)got;
    }
    close(fd);
    if (rc != 0) {
        free(buf);
        return -1;
    }
    d->base_ = buf;
    d->payload = buf;
    return 0;
}

int qt_tokens_load(const char *path, uint32_t vocab_limit, qt_tokens_data *d, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if ((is_zst(path) ? load_zst : load_bin)(path, d, err, errlen) != 0) return -1;
    const qt_tokens_header *h = &d->h;
    int rc = 0;
    if (vocab_limit > 0 && h->vocab_size > vocab_limit)
        rc = fail(err, errlen, path, "vocab_size %u > the model's vocab %u", h->vocab_size, vocab_limit);
    size_t plen = (size_t)qt_tokens_payload_bytes(h);
    uint64_t sum = rc                  ? 0
                   : h->version == 1 ? qt_fnv1a64(d->payload, plen, QT_FNV_INIT)
                                     : qt_crc32(0, d->payload, plen);
    if (rc == 0 && sum != h->checksum)
        rc = fail(err, errlen, path, "checksum mismatch (header 0x%016llx, payload 0x%016llx)",
                  (unsigned long long)h->checksum, (unsigned long long)sum);
    if (rc == 0 && (h->flags & QT_TOKENS_FLAG_MASK)) {
        d->mask = d->payload + h->n_tokens * h->token_bytes;
        for (uint64_t i = 0; i < h->n_tokens && rc == 0; i++)
            if (d->mask[i] > 1)
                rc = fail(err, errlen, path, "mask byte %u at index %llu (expected 0 or 1)", d->mask[i],
                          (unsigned long long)i);
    }
    if (rc == 0 && (h->flags & QT_TOKENS_FLAG_DOCS)) {
        d->docs = d->payload + h->n_tokens * (h->token_bytes + (h->flags & QT_TOKENS_FLAG_MASK ? 1 : 0));
        for (uint64_t i = 0; i < h->n_docs && rc == 0; i++) {
            uint64_t v = qt_tokens_doc_start(d, i);
            if (v >= h->n_tokens || (i && v <= qt_tokens_doc_start(d, i - 1)))
                rc = fail(err, errlen, path, "document start %llu at index %llu (expected increasing, < %llu tokens)",
                          (unsigned long long)v, (unsigned long long)i, (unsigned long long)h->n_tokens);
        }
    }
    if (rc == 0 && (h->token_bytes == 4 || h->vocab_size < 65536)) {
        for (uint64_t i = 0; i < h->n_tokens; i++) {
            uint32_t t = qt_tokens_token(d, i);
            if (t >= h->vocab_size) {
                rc = fail(err, errlen, path, "token %u at index %llu >= vocab_size %u", t, (unsigned long long)i,
                          h->vocab_size);
                break;
            }
        }
    }
    if (rc != 0) qt_tokens_unload(d);
    return rc;
}

void qt_tokens_unload(qt_tokens_data *d) {
    free(d->base_);
    memset(d, 0, sizeof *d);
}

int qt_tokens_read(const char *path, uint32_t **tokens, qt_tokens_header *h, char *err, size_t errlen) {
    qt_tokens_data d;
    *tokens = NULL;
    if (qt_tokens_load(path, 0, &d, err, errlen) != 0) return -1;
    uint32_t *t = malloc(d.h.n_tokens ? (size_t)d.h.n_tokens * sizeof *t : 1);
    if (!t) {
        qt_tokens_unload(&d);
        return fail(err, errlen, path, "cannot allocate %llu tokens", (unsigned long long)d.h.n_tokens);
    }
    for (uint64_t i = 0; i < d.h.n_tokens; i++) t[i] = qt_tokens_token(&d, i);
    if (h) *h = d.h;
    *tokens = t;
    qt_tokens_unload(&d);
    return 0;
}
