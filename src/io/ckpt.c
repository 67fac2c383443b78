/* ckpt.c — checkpoint files of named, checksummed blobs, written atomically (temp, fsync, rename).
 *
 * File (all integers little-endian; this code assumes a little-endian host, as x86 and arm64 are):
 *   [0,64)   header: "QTCKPT01", u32 version, u32 count, i64 step, u64 file_bytes, u64 meta_hash, 0...
 *   table    count x 128 bytes: char name[96] (NUL padded), i32 dtype, u32 0, u64 bytes, u64 offset,
 *            u64 hash
 *   data     each blob at a 64-byte aligned offset, zero padding between; file_bytes = total size.
 * meta_hash = hash64 of header bytes [0,32) then the table; each blob's hash = hash64 of its bytes.
 * hash64 is XXH64 (seed 0): 32-byte stripes in four lanes, so it runs at memory speed.
 * Writing: the blobs go first, piece by piece in the caller's order (qt_ckpt_save_pieces), each byte
 * read once — checked, fed to its blob's hash, written at its offset (padding stays a hole: zeros); a
 * widened item (QT_CKPT_WIDEN_BF16) converted to fp32 chunk by chunk first, its hash over the fp32 bytes —
 * then the table with the hashes at offset 0, the size set, fsync, rename. */
#include "qt_error.h"
#include "qt_ckpt.h"
#include "qt_dtype.h"
#include "qt_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_MAGIC "QTCKPT01"
#define CK_VERSION 1u
#define CK_HDR 64
#define CK_ENTRY 128
#define CK_NAME 96

static const uint64_t P1 = 11400714785074694791ull, P2 = 14029467366897019727ull,
                      P3 = 1609587929392839161ull, P4 = 9650029242287828579ull, P5 = 2870177450012600261ull;

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t xx_round(uint64_t acc, uint64_t in) { return rotl64(acc + in * P2, 31) * P1; }
static uint64_t xx_merge(uint64_t h, uint64_t v) { return (h ^ xx_round(0, v)) * P1 + P4; }

/* Lanes, length and unconsumed tail of a hash64 fed in pieces (header, then table). */
typedef struct { uint64_t v[4], len; unsigned char buf[32]; int nbuf; } xx_state;

static void xx_init(xx_state *s) {
    s->v[0] = P1 + P2; s->v[1] = P2; s->v[2] = 0; s->v[3] = -P1;
    s->len = 0; s->nbuf = 0;
}

/* Every update but the last must be a multiple of 32 bytes (the header part is exactly 32). */
static void xx_update(xx_state *s, const void *data, size_t n) {
    const unsigned char *p = data;
    if (n == 0) return;
    s->len += n;
    uint64_t v0 = s->v[0], v1 = s->v[1], v2 = s->v[2], v3 = s->v[3];
    for (; n >= 32; p += 32, n -= 32) {
        v0 = xx_round(v0, rd64(p)); v1 = xx_round(v1, rd64(p + 8));
        v2 = xx_round(v2, rd64(p + 16)); v3 = xx_round(v3, rd64(p + 24));
    }
    s->v[0] = v0; s->v[1] = v1; s->v[2] = v2; s->v[3] = v3;
    memcpy(s->buf, p, n);
    s->nbuf = (int)n;
}

/* xx_update without the multiple-of-32 rule: a partial stripe waits in buf for the next call. */
static void xx_feed(xx_state *s, const void *data, size_t n) {
    const unsigned char *p = data;
    if (s->nbuf && n) {
        unsigned char b[32];
        size_t have = (size_t)s->nbuf, take = 32 - have < n ? 32 - have : n;
        memcpy(b, s->buf, have);
        memcpy(b + have, p, take);
        s->len -= have; /* counted again by the update below */
        xx_update(s, b, have + take);
        p += take;
        n -= take;
        if (s->nbuf) return; /* still a partial stripe: n is spent */
    }
    xx_update(s, p, n);
}

static uint64_t xx_final(const xx_state *s) {
    uint64_t h;
    if (s->len >= 32) {
        h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
        for (int i = 0; i < 4; i++) h = xx_merge(h, s->v[i]);
    } else h = P5;
    h += s->len;
    const unsigned char *p = s->buf;
    int n = s->nbuf;
    for (; n >= 8; p += 8, n -= 8) h = rotl64(h ^ xx_round(0, rd64(p)), 27) * P1 + P4;
    if (n >= 4) { h = rotl64(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3; p += 4; n -= 4; }
    for (; n > 0; p++, n--) h = rotl64(h ^ *p * P5, 11) * P1;
    h ^= h >> 33; h *= P2; h ^= h >> 29; h *= P3; h ^= h >> 32;
    return h;
}

uint64_t qt_ckpt_hash64(const void *data, size_t n) {
    xx_state s;
    xx_init(&s);
    xx_update(&s, data, n);
    return xx_final(&s);
}


int qt_ckpt_mkdirs(const char *dir, char *err, size_t errlen) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return qt_errf(err, errlen, "%s: bad directory name", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return qt_errf(err, errlen, "%s: cannot create directory %s: %s", dir, p, strerror(errno));
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
            return qt_errf(err, errlen, "%s: %s exists and is not a directory", dir, p);
        p[i] = c;
    }
    return 0;
}

int qt_ckpt_commit_file(FILE *f, const char *tmp, const char *final, char *err, size_t errlen) {
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (!bad && fsync(fileno(f)) != 0) { bad = 1; e = errno; }
    if (fclose(f) != 0 && !bad) { bad = 1; e = errno; }
    if (bad) {
        unlink(tmp);
        return qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, final) != 0) {
        e = errno;
        unlink(tmp);
        return qt_errf(err, errlen, "%s: cannot rename to %s: %s", tmp, final, strerror(e));
    }
    /* The rename lives in the directory: sync it so a crash cannot forget the new name. */
    char d[4096];
    snprintf(d, sizeof d, "%s", final);
    char *slash = strrchr(d, '/');
    if (slash) *(slash == d ? slash + 1 : slash) = 0;
    else snprintf(d, sizeof d, ".");
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

/* Step of a file named ckpt_<digits>.qtc, or -1 for any other name (temp files included). */
static long ckpt_name_step(const char *name) {
    if (strncmp(name, "ckpt_", 5) != 0) return -1;
    const char *p = name + 5;
    long step = 0;
    int nd = 0;
    for (; *p >= '0' && *p <= '9'; p++, nd++) {
        if (step > (0x7fffffffffffffffL - 9) / 10) return -1;
        step = step * 10 + (*p - '0');
    }
    return nd > 0 && strcmp(p, ".qtc") == 0 ? step : -1;
}

static int cmp_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Lists the checkpoint steps in dir, newest first. Caller frees. */
static long *list_steps(const char *dir, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    long *steps = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = ckpt_name_step(e->d_name);
        if (s < 0) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            long *ns = realloc(steps, (size_t)cap * sizeof *ns);
            if (!ns) break;
            steps = ns;
        }
        steps[(*count)++] = s;
    }
    closedir(d);
    if (*count) qsort(steps, (size_t)*count, sizeof *steps, cmp_desc);
    return steps;
}

static void apply_retention(const char *dir, long just_written, int keep) {
    if (keep <= 0) return;
    int n;
    long *steps = list_steps(dir, &n);
    for (int i = keep; i < n; i++) {
        if (steps[i] == just_written) continue; /* an older step saved after a newer one survives */
        char p[4096];
        snprintf(p, sizeof p, "%s/ckpt_%08ld.qtc", dir, steps[i]);
        if (unlink(p) != 0) fprintf(stderr, "warning: %s: cannot delete old checkpoint: %s\n", p, strerror(errno));
    }
    free(steps);
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static int check_items(const qt_ckpt_item *items, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        size_t len = items[i].name ? strlen(items[i].name) : 0;
        if (len == 0 || len >= CK_NAME)
            return qt_errf(err, errlen, "checkpoint item %d: name must be 1..%d bytes, got %zu", i, CK_NAME - 1, len);
        if (items[i].bytes && !items[i].data)
            return qt_errf(err, errlen, "checkpoint item %s: %zu bytes but no data", items[i].name, items[i].bytes);
        const qt_ckpt_gather *g = items[i].flags & QT_CKPT_GATHERED ? items[i].data : NULL;
        for (int j = 0; g && j < g->n; j++)
            if (!g->segs[j].data || (j == 0 ? g->segs[0].lo != 0 : g->segs[j].lo <= g->segs[j - 1].lo) ||
                g->segs[j].lo >= qt_ckpt_item_data_bytes(&items[i]))
                return qt_errf(err, errlen, "checkpoint item %s: run %d of %d: no data, or its start %zu not after the "
                               "previous run's and inside the item's %zu bytes", items[i].name, j, g->n, g->segs[j].lo,
                               qt_ckpt_item_data_bytes(&items[i]));
        if (g && g->n < 1 && items[i].bytes)
            return qt_errf(err, errlen, "checkpoint item %s: gathered from no runs", items[i].name);
        if (items[i].flags & ~(QT_CKPT_WIDEN_BF16 | QT_CKPT_GATHERED))
            return qt_errf(err, errlen, "checkpoint item %s: unknown flags %#x", items[i].name, items[i].flags);
        if ((items[i].flags & QT_CKPT_WIDEN_BF16) && (items[i].dtype != QT_DT_F32 || items[i].bytes % 4))
            return qt_errf(err, errlen, "checkpoint item %s: widened from bf16: expected dtype f32 and a multiple of 4 "
                           "bytes, got dtype %d and %zu bytes", items[i].name, items[i].dtype, items[i].bytes);
        for (int j = 0; j < i; j++)
            if (strcmp(items[j].name, items[i].name) == 0)
                return qt_errf(err, errlen, "checkpoint item %s: duplicate name", items[i].name);
    }
    return 0;
}

/* Header + table for the items with their blob hashes, laid out as described at the top. */
static unsigned char *build_meta(long step, const qt_ckpt_item *items, int n, const uint64_t *hash, size_t *meta_bytes,
                                 size_t *file_bytes) {
    size_t mb = CK_HDR + (size_t)n * CK_ENTRY, off = align64(mb);
    unsigned char *m = calloc(1, mb);
    if (!m) return NULL;
    for (int i = 0; i < n; i++) {
        unsigned char *e = m + CK_HDR + (size_t)i * CK_ENTRY;
        int32_t dt = items[i].dtype;
        uint64_t bytes = items[i].bytes, o = off, h = hash[i];
        memcpy(e, items[i].name, strlen(items[i].name));
        memcpy(e + 96, &dt, 4);
        memcpy(e + 104, &bytes, 8);
        memcpy(e + 112, &o, 8);
        memcpy(e + 120, &h, 8);
        off = align64(off + items[i].bytes);
    }
    uint32_t ver = CK_VERSION, cnt = (uint32_t)n;
    int64_t st = step;
    uint64_t fb = off;
    memcpy(m, CK_MAGIC, 8);
    memcpy(m + 8, &ver, 4);
    memcpy(m + 12, &cnt, 4);
    memcpy(m + 16, &st, 8);
    memcpy(m + 24, &fb, 8);
    xx_state s;
    xx_init(&s);
    xx_update(&s, m, 32);
    xx_update(&s, m + CK_HDR, mb - CK_HDR);
    uint64_t mh = xx_final(&s);
    memcpy(m + 32, &mh, 8);
    *meta_bytes = mb;
    *file_bytes = off;
    return m;
}

/* Each item's pieces must cover its bytes once, in ascending order. */
static int check_pieces(const qt_ckpt_item *items, int n, const qt_ckpt_piece *pc, int np, char *err, size_t errlen) {
    size_t *next = calloc((size_t)n + 1, sizeof *next);
    if (!next) return qt_errf(err, errlen, "out of memory");
    int rc = 0;
    for (int k = 0; k < np && !rc; k++) {
        int i = pc[k].item;
        if (i < 0 || i >= n || pc[k].lo != next[i] || pc[k].hi < pc[k].lo || pc[k].hi > items[i].bytes)
            rc = qt_errf(err, errlen, "checkpoint piece %d (item %d, bytes %zu..%zu): out of order or out of range", k, i,
                         pc[k].lo, pc[k].hi);
        else if ((items[i].flags & QT_CKPT_WIDEN_BF16) && (pc[k].lo % 4 || pc[k].hi % 4))
            rc = qt_errf(err, errlen, "checkpoint piece %d (item %s, bytes %zu..%zu): a widened item's pieces are whole "
                         "fp32 values", k, items[i].name, pc[k].lo, pc[k].hi);
        else next[i] = pc[k].hi;
    }
    for (int i = 0; i < n && !rc; i++)
        if (next[i] != items[i].bytes)
            rc = qt_errf(err, errlen, "checkpoint item %s: pieces cover %zu of its %zu bytes", items[i].name, next[i], items[i].bytes);
    free(next);
    return rc;
}

size_t qt_ckpt_item_data_bytes(const qt_ckpt_item *it) {
    return it->flags & QT_CKPT_WIDEN_BF16 ? it->bytes / 2 : it->bytes;
}

const void *qt_ckpt_item_at(const qt_ckpt_item *it, size_t off, size_t *run) {
    size_t end = qt_ckpt_item_data_bytes(it);
    if (!(it->flags & QT_CKPT_GATHERED)) {
        *run = end - off;
        return (const char *)it->data + off;
    }
    const qt_ckpt_gather *g = it->data;
    int lo = 0, hi = g->n - 1; /* the last run starting at or before off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->segs[mid].lo <= off) lo = mid;
        else hi = mid - 1;
    }
    *run = (lo + 1 < g->n ? g->segs[lo + 1].lo : end) - off;
    return (const char *)g->segs[lo].data + (off - g->segs[lo].lo);
}

/* An fp32 or bf16 array of elems elements in `bytes`. */
static int units_array_dtype(int dtype, size_t bytes, size_t elems) {
    return (dtype == QT_DT_F32 && bytes == elems * 4) || (dtype == QT_DT_BF16 && bytes == elems * 2);
}

int qt_ckpt_units_is_array(const qt_ckpt_item *it, const qt_ckpt_units *u) {
    return units_array_dtype(it->dtype, it->bytes, u->at[u->n]);
}

int qt_ckpt_units_segs(const qt_ckpt_item *it, const qt_ckpt_units *u) {
    return u->n + (it->flags & QT_CKPT_GATHERED ? ((const qt_ckpt_gather *)it->data)->n : 0);
}

void qt_ckpt_units_view(const qt_ckpt_item *it, const qt_ckpt_units *u, qt_ckpt_seg *segs, qt_ckpt_gather *g,
                        qt_ckpt_item *out) {
    size_t fe = (size_t)qt_dtype_size((qt_dtype)it->dtype), de = it->flags & QT_CKPT_WIDEN_BF16 ? 2 : fe; /* file, data */
    int n = 0;
    for (int k = 0; k < u->n; k++) /* each unit run by run of `it` */
        for (size_t off = 0, len = (u->compact[k + 1] - u->compact[k]) * de, run; off < len; off += run) {
            const void *p = qt_ckpt_item_at(it, u->at[k] * de + off, &run);
            segs[n++] = (qt_ckpt_seg){u->compact[k] * de + off, p};
            if (run > len - off) run = len - off;
        }
    *g = (qt_ckpt_gather){segs, n};
    *out = (qt_ckpt_item){it->name, it->dtype, g, u->compact[u->n] * fe, it->flags | QT_CKPT_GATHERED};
}

void qt_ckpt_item_read(const qt_ckpt_item *it, size_t off, size_t n, void *dst) {
    while (n) {
        size_t run;
        const void *p = qt_ckpt_item_at(it, off, &run);
        size_t m = run < n ? run : n;
        memcpy(dst, p, m);
        dst = (char *)dst + m, off += m, n -= m;
    }
}

static int pwrite_all(int fd, const void *data, size_t n, size_t off) {
    const char *p = data;
    while (n) {
        ssize_t w = pwrite(fd, p, n < ((size_t)1 << 30) ? n : (size_t)1 << 30, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (size_t)w;
    }
    return 0;
}

#define WIDEN_CHUNK ((size_t)1 << 18) /* fp32 values per write of a widened item: 1 MiB */

/* Bytes [lo, hi) (multiples of 4) of a widened item: its bf16 values lo / 4 .. hi / 4 as fp32, through
 * *buf (WIDEN_CHUNK values, made at the first call), each chunk written at its place (the blob at base)
 * and fed to h. 0, -1 (a write failed) or -2 (no buffer). */
static int write_widened(int fd, const qt_ckpt_item *it, size_t lo, size_t hi, size_t base, xx_state *h, uint32_t **buf) {
    if (!*buf && !(*buf = malloc(WIDEN_CHUNK * 4))) return -2;
    uint32_t *u = *buf;
    for (size_t e = lo / 4; e < hi / 4;) {
        size_t run, m = hi / 4 - e < WIDEN_CHUNK ? hi / 4 - e : WIDEN_CHUNK;
        const uint16_t *src = qt_ckpt_item_at(it, e * 2, &run); /* bf16 value e, to the end of its run */
        if (m > run / 2) m = run / 2;
        for (size_t j = 0; j < m; j++) u[j] = (uint32_t)src[j] << 16; /* exact: qt_bf16_to_f32 */
        if (pwrite_all(fd, u, m * 4, base + e * 4)) return -1;
        xx_feed(h, u, m * 4);
        e += m;
    }
    return 0;
}

int qt_ckpt_save_pieces(const char *dir, long step, int keep, const qt_ckpt_item *items, int n, const qt_ckpt_piece *pieces,
                        int np, const qt_ckpt_piece_fns *fns, char *err, size_t errlen) {
    if (step < 0 || n < 0) return qt_errf(err, errlen, "%s: bad checkpoint step %ld or count %d", dir, step, n);
    if (check_items(items, n, err, errlen) || check_pieces(items, n, pieces, np, err, errlen) ||
        qt_ckpt_mkdirs(dir, err, errlen))
        return -1;
    char tmp[4100], final[4096];
    if (snprintf(final, sizeof final, "%s/ckpt_%08ld.qtc", dir, step) >= (int)sizeof final)
        return qt_errf(err, errlen, "%s: path too long", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    size_t *off = malloc(((size_t)n + 1) * sizeof *off);
    xx_state *hs = malloc(((size_t)n + 1) * sizeof *hs);
    uint64_t *hash = malloc(((size_t)n + 1) * sizeof *hash);
    int fd = off && hs && hash ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -2;
    if (fd < 0) {
        free(off), free(hs), free(hash);
        return fd == -2 ? qt_errf(err, errlen, "%s: out of memory", final) : qt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    }
    /* held until the file is closed: a run starting in dir leaves a temp file being written alone */
    (void)flock(fd, LOCK_EX | LOCK_NB);
    size_t pos = align64(CK_HDR + (size_t)n * CK_ENTRY);
    for (int i = 0; i < n; i++) {
        off[i] = pos;
        pos = align64(pos + items[i].bytes);
        xx_init(&hs[i]);
    }
    /* the blobs first, each byte read once (checked, hashed, written); padding is left as holes (zeros) */
    int rc = 0;
    uint32_t *wide = NULL; /* write_widened's buffer, made at its first use */
    for (int k = 0; k < np && !rc; k++) {
        const qt_ckpt_item *it = &items[pieces[k].item];
        size_t len = pieces[k].hi - pieces[k].lo;
        if (fns && fns->check && (rc = fns->check(it, pieces[k].lo, pieces[k].hi, fns->ctx, err, errlen))) break;
        if (it->flags & QT_CKPT_WIDEN_BF16) {
            int wr = len ? write_widened(fd, it, pieces[k].lo, pieces[k].hi, off[pieces[k].item], &hs[pieces[k].item], &wide) : 0;
            if (wr == -2) rc = qt_errf(err, errlen, "%s: out of memory widening %s", tmp, it->name);
            else if (wr) rc = qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
            if (rc) break;
        } else {
            for (size_t at = pieces[k].lo, run; at < pieces[k].hi && !rc; at += run) { /* run by run */
                const char *p = qt_ckpt_item_at(it, at, &run);
                if (run > pieces[k].hi - at) run = pieces[k].hi - at;
                if (pwrite_all(fd, p, run, off[pieces[k].item] + at))
                    rc = qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
                else xx_feed(&hs[pieces[k].item], p, run);
            }
            if (rc) break;
        }
        if (fns && fns->done) fns->done(fns->ctx, k);
    }
    free(wide);
    size_t mb = 0, fb = 0;
    unsigned char *meta = NULL;
    if (!rc) {
        for (int i = 0; i < n; i++) hash[i] = xx_final(&hs[i]);
        meta = build_meta(step, items, n, hash, &mb, &fb);
        if (!meta) rc = qt_errf(err, errlen, "%s: out of memory building the checkpoint table", final);
        else if (pwrite_all(fd, meta, mb, 0) || ftruncate(fd, (off_t)fb))
            rc = qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
    }
    free(meta), free(off), free(hs), free(hash);
    FILE *f = rc ? NULL : fdopen(fd, "wb");
    if (!f) {
        if (!rc) rc = qt_errf(err, errlen, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (qt_ckpt_commit_file(f, tmp, final, err, errlen)) return -1;
    apply_retention(dir, step, keep);
    return 0;
}

int qt_ckpt_save(const char *dir, long step, int keep, const qt_ckpt_item *items, int n, char *err, size_t errlen) {
    qt_ckpt_piece *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) return qt_errf(err, errlen, "%s: out of memory", dir);
    for (int i = 0; i < n; i++) p[i] = (qt_ckpt_piece){i, 0, items[i].bytes};
    int rc = qt_ckpt_save_pieces(dir, step, keep, items, n, p, n > 0 ? n : 0, NULL, err, errlen);
    free(p);
    return rc;
}

typedef struct {
    const char *name;
    int dtype;
    size_t bytes;
    const void *data;
} ck_blob;

struct qt_ckpt {
    unsigned char *buf;
    size_t size;
    long step;
    int count;
    ck_blob *blobs;
    unsigned char *padded; /* qt_ckpt_pad_units' blobs, back to back (NULL: none) */
};

void qt_ckpt_close(qt_ckpt *ck) {
    if (!ck) return;
    free(ck->buf);
    free(ck->blobs);
    free(ck->padded);
    free(ck);
}

int qt_ckpt_pad_units(qt_ckpt *ck, const qt_ckpt_units *u, char *err, size_t errlen) {
    size_t need = 0, cn = u->compact[u->n];
    for (int i = 0; i < ck->count; i++)
        if (units_array_dtype(ck->blobs[i].dtype, ck->blobs[i].bytes, cn))
            need += u->at[u->n] * (size_t)qt_dtype_size((qt_dtype)ck->blobs[i].dtype);
    if (!need || ck->padded) return 0;
    if (!(ck->padded = calloc(need, 1)))
        return qt_errf(err, errlen, "out of host memory for the checkpoint's arrays in the padded layout (%zu bytes)", need);
    unsigned char *at = ck->padded;
    for (int i = 0; i < ck->count; i++) {
        ck_blob *b = &ck->blobs[i];
        if (!units_array_dtype(b->dtype, b->bytes, cn)) continue;
        size_t es = (size_t)qt_dtype_size((qt_dtype)b->dtype);
        for (int k = 0; k < u->n; k++)
            memcpy(at + u->at[k] * es, (const unsigned char *)b->data + u->compact[k] * es,
                   (u->compact[k + 1] - u->compact[k]) * es);
        b->data = at;
        b->bytes = u->at[u->n] * es;
        at += b->bytes;
    }
    return 0;
}

/* Reads path whole into *size bytes. NULL with err on failure, then *io set: 1 when the file could not be
 * read (open or read failed, not a regular file: it may be intact), 0 when memory ran out. A FIFO in
 * its place is refused at once instead of blocking in open() (qt_open_regular). */
static unsigned char *read_whole(const char *path, size_t *size, int *io, char *err, size_t errlen) {
    *io = 1;
    const char *why;
    int fd = qt_open_regular(path, &why);
    struct stat st;
    if (fd < 0) {
        qt_errf(err, errlen, fd == -2 ? "%s: cannot read: not a regular file (%s)" : "%s: cannot read: %s", path, why);
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        qt_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    void *buf = NULL;
    size_t n = (size_t)st.st_size, got = 0;
    if (posix_memalign(&buf, 64, n ? n : 64) != 0) {
        close(fd);
        *io = 0;
        qt_errf(err, errlen, "%s: out of memory reading %zu bytes", path, n);
        return NULL;
    }
    ssize_t r = 1;
    while (got < n && (r = pread(fd, (char *)buf + got, n - got < ((size_t)1 << 30) ? n - got : (size_t)1 << 30,
                                 (off_t)got)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        got += (size_t)r;
    }
    int e = errno;
    close(fd);
    if (got != n) {
        free(buf);
        qt_errf(err, errlen, "%s: cannot read: %s after %zu of %zu bytes", path, r < 0 ? strerror(e) : "end of file",
                got, n);
        return NULL;
    }
    *size = n;
    return buf;
}

/* Checks the header and table of a file read whole; fills ck->blobs. */
static int parse_meta(qt_ckpt *ck, const char *path, char *err, size_t errlen) {
    const unsigned char *b = ck->buf;
    if (ck->size < CK_HDR || memcmp(b, CK_MAGIC, 8) != 0)
        return qt_errf(err, errlen, "%s: not a qtrain checkpoint (expected magic %s)", path, CK_MAGIC);
    uint32_t ver = rd32(b + 8), cnt = rd32(b + 12);
    uint64_t fb = rd64(b + 24), mh = rd64(b + 32);
    int64_t step;
    memcpy(&step, b + 16, 8);
    if (ver != CK_VERSION) return qt_errf(err, errlen, "%s: version %u, expected %u", path, ver, CK_VERSION);
    if (fb != ck->size)
        return qt_errf(err, errlen, "%s: truncated or extended: header says %llu bytes, file has %zu", path,
                    (unsigned long long)fb, ck->size);
    size_t mb = CK_HDR + (size_t)cnt * CK_ENTRY;
    if (cnt > (ck->size - CK_HDR) / CK_ENTRY)
        return qt_errf(err, errlen, "%s: %u blobs do not fit in %zu bytes", path, cnt, ck->size);
    xx_state s;
    xx_init(&s);
    xx_update(&s, b, 32);
    xx_update(&s, b + CK_HDR, mb - CK_HDR);
    if (xx_final(&s) != mh) return qt_errf(err, errlen, "%s: header/table checksum mismatch (corrupted)", path);
    ck->step = step;
    ck->count = (int)cnt;
    ck->blobs = calloc(cnt ? cnt : 1, sizeof *ck->blobs);
    if (!ck->blobs) return qt_errf(err, errlen, "%s: out of memory", path);
    for (uint32_t i = 0; i < cnt; i++) {
        unsigned char *e = ck->buf + CK_HDR + (size_t)i * CK_ENTRY;
        if (memchr(e, 0, CK_NAME) == NULL) return qt_errf(err, errlen, "%s: blob %u: name not terminated", path, i);
        int32_t dt;
        memcpy(&dt, e + 96, 4);
        uint64_t bytes = rd64(e + 104), off = rd64(e + 112), h = rd64(e + 120);
        const char *name = (const char *)e;
        if (off < mb || off > ck->size || bytes > ck->size - off)
            return qt_errf(err, errlen, "%s: blob %s: bytes [%llu, +%llu) outside the %zu-byte file", path, name,
                        (unsigned long long)off, (unsigned long long)bytes, ck->size);
        for (uint32_t j = 0; j < i; j++) /* a reader takes a blob by name: two of one name is a forged table */
            if (strcmp((const char *)ck->buf + CK_HDR + (size_t)j * CK_ENTRY, name) == 0)
                return qt_errf(err, errlen, "%s: blob %s: its name appears twice in the table (entries %u and %u)", path,
                               name, j, i);
        uint64_t got = qt_ckpt_hash64(ck->buf + off, bytes);
        if (got != h)
            return qt_errf(err, errlen, "%s: blob %s: checksum mismatch (stored %016llx, computed %016llx): corrupted",
                        path, name, (unsigned long long)h, (unsigned long long)got);
        ck->blobs[i] = (ck_blob){name, dt, bytes, ck->buf + off};
    }
    return 0;
}

/* A file named ckpt_<step>.qtc holds that step: a copy under another step's name would be taken for
 * the newest checkpoint (the directory is ordered by name) and resume at its own step. */
static int check_name_step(const qt_ckpt *ck, const char *path, char *err, size_t errlen) {
    const char *base = strrchr(path, '/');
    long named = ckpt_name_step(base ? base + 1 : path);
    if (named < 0 || named == ck->step) return 0;
    return qt_errf(err, errlen, "%s: the file's name says step %ld but its header holds step %ld (a copy or a rename?)",
                   path, named, ck->step);
}

qt_ckpt *qt_ckpt_load(const char *path, qt_ckpt_status *why, char *err, size_t errlen) {
    qt_ckpt *ck = calloc(1, sizeof *ck);
    int io = 0;
    if (!ck) qt_errf(err, errlen, "%s: out of memory", path);
    else if (!(ck->buf = read_whole(path, &ck->size, &io, err, errlen))) {
        *why = io ? QT_CKPT_UNREADABLE : QT_CKPT_NO_MEMORY;
    } else if (parse_meta(ck, path, err, errlen) || check_name_step(ck, path, err, errlen)) {
        *why = QT_CKPT_CORRUPT;
    } else {
        *why = QT_CKPT_OK;
        return ck;
    }
    if (!ck) *why = QT_CKPT_NO_MEMORY;
    qt_ckpt_close(ck);
    return NULL;
}

qt_ckpt *qt_ckpt_open(const char *path, char *err, size_t errlen) {
    qt_ckpt_status why;
    return qt_ckpt_load(path, &why, err, errlen);
}

const void *qt_ckpt_get(const qt_ckpt *ck, const char *name, size_t *bytes, int *dtype) {
    for (int i = 0; i < ck->count; i++) {
        if (strcmp(ck->blobs[i].name, name) != 0) continue;
        if (bytes) *bytes = ck->blobs[i].bytes;
        if (dtype) *dtype = ck->blobs[i].dtype;
        return ck->blobs[i].data;
    }
    return NULL;
}

long qt_ckpt_step(const qt_ckpt *ck) { return ck->step; }

int qt_ckpt_list(const char *dir, long **steps) {
    int n;
    *steps = list_steps(dir, &n);
    return n;
}

int qt_ckpt_latest(const char *dir, char *path, size_t cap) {
    int n;
    long *steps = list_steps(dir, &n);
    int rc = -1;
    if (n > 0 && snprintf(path, cap, "%s/ckpt_%08ld.qtc", dir, steps[0]) < (int)cap) rc = 0;
    free(steps);
    return rc;
}
