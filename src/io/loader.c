/* loader.c — the data loader: shards -> seeded stream of seq_len+1 windows -> per-rank micro-batches.
 *
 * The stream: epoch e visits the shards in the order of a Fisher-Yates shuffle seeded from
 * (seed, e), and shard s's windows in the order of a shuffle seeded from (seed, e, s). Window w of a
 * shard is tokens [w*seq_len, w*seq_len + seq_len] (stride seq_len, one token of overlap for the
 * last target), so a shard of n tokens has (n-1)/seq_len windows. A global batch is the next
 * world*micro_batch windows of the stream; rank r reads its slice and only moves the cursors over the
 * others' windows, so shards that hold none of its windows are never loaded. A masked shard's target
 * t of a window is -1 when the mask byte of its token (start + t + 1) is 0; a masked shard whose windows
 * hold no unmasked target is an error naming it (nothing to train or evaluate on). A window's document
 * starts are the shard's starts in [start, start + seq_len), found by binary search. Read errors come
 * back to the caller (the training loop saves a checkpoint before it stops), never exit the process.
 * Pair shards (QT_TOKENS_FLAG_PAIRS) are read in units of two windows (a pair: chosen, rejected): the cursors,
 * the shuffles and a shard's window count are in pairs, and a micro-batch is micro_batch / 2 of them. */
#include "qt_data.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_rng.h"

typedef struct {
    char *path;
    qt_tokens_header h;
    uint64_t n_windows;
    uint64_t first_row; /* the data's rows (windows) in the shards before this one, in glob order */
} shard_info;

struct qt_loader {
    shard_info *sh;
    int n_sh;
    int seq_len, micro_batch, rank, world, shuffle;
    uint64_t seed, total_windows;
    uint32_t vocab_limit;
    qt_loader_pos pos; /* start of the next window of the stream */
    uint64_t *order;   /* file index of the shard at each cursor, valid for epoch order_epoch */
    uint64_t order_epoch;
    int order_valid;
    uint64_t *wperm; /* window order of shard wperm_file in epoch wperm_epoch (shuffle only) */
    uint64_t wperm_epoch;
    int wperm_file;
    qt_tokens_data data; /* the shard being read (data_file), or nothing (-1) */
    int data_file;
    int unit;            /* windows per cursor step: 2 for pair shards, else 1 */
    uint64_t *rows;      /* [micro_batch] the data rows of the last micro-batch read (qt_loader_last_rows) */
    int n_rows;
};

/* Distinct stream tags keep the shard-order and window-order generators independent. */
#define TAG_ORDER 0x51544f52444552ull
#define TAG_WINDOWS 0x515457494e444f57ull

static void shuffle(uint64_t *a, uint64_t n, uint64_t seed) {
    qt_rng r;
    qt_rng_seed(&r, seed);
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = qt_rng_below(&r, i);
        uint64_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static void ensure_order(qt_loader *l) {
    if (l->order_valid && l->order_epoch == l->pos.epoch) return;
    for (int i = 0; i < l->n_sh; i++) l->order[i] = (uint64_t)i;
    if (l->shuffle) shuffle(l->order, (uint64_t)l->n_sh, qt_hash64(qt_hash64(l->seed, TAG_ORDER), l->pos.epoch));
    l->order_epoch = l->pos.epoch;
    l->order_valid = 1;
}

static uint64_t cur_windows(qt_loader *l) {
    ensure_order(l);
    return l->sh[l->order[l->pos.shard_cursor]].n_windows;
}

/* Moves the cursors k windows on, across shards and epochs, without loading anything. */
static void advance(qt_loader *l, uint64_t k) {
    while (k > 0) {
        uint64_t rem = cur_windows(l) - l->pos.window_cursor;
        if (k < rem) {
            l->pos.window_cursor += k;
            return;
        }
        k -= rem;
        l->pos.window_cursor = 0;
        if (++l->pos.shard_cursor == (uint64_t)l->n_sh) {
            l->pos.shard_cursor = 0;
            l->pos.epoch++;
        }
    }
}

/* 1 when d has a mask and no target of its windows is unmasked (tokens 1 to last are the targets). */
static int no_targets(const qt_tokens_data *d, uint64_t last) {
    if (!d->mask) return 0;
    for (uint64_t i = 1; i <= last; i++)
        if (d->mask[i]) return 0;
    return 1;
}

/* Makes shard file f the loaded one. Returns 0 or -1 with err. */
static int load_file(qt_loader *l, int f, char *err, size_t errlen) {
    if (l->data_file != f) {
        const qt_tokens_header *a = &l->sh[f].h, *b = &l->data.h;
        qt_tokens_unload(&l->data);
        l->data_file = -1;
        if (qt_tokens_load(l->sh[f].path, l->vocab_limit, &l->data, err, errlen) != 0) return -1;
        if (b->n_tokens != a->n_tokens || b->checksum != a->checksum || b->flags != a->flags ||
            b->token_bytes != a->token_bytes || b->n_docs != a->n_docs) {
            qt_tokens_unload(&l->data);
            snprintf(err, errlen, "%s: shard changed on disk since the loader opened it", l->sh[f].path);
            return -1;
        }
        uint64_t last = l->sh[f].n_windows * (uint64_t)l->unit * (uint64_t)l->seq_len;
        if (no_targets(&l->data, last)) {
            qt_tokens_unload(&l->data);
            snprintf(err, errlen, "%s: every target is masked out (mask bytes 1 to %llu are all 0): the shard has "
                     "nothing to train on; tokenize it again (tools/tokenize --chat keeps the assistant's turns) or "
                     "leave it out of the glob", l->sh[f].path, (unsigned long long)last);
            return -1;
        }
        l->data_file = f;
    }
    return 0;
}

/* Makes the shard under the cursor the loaded one (with its window order). Returns 0 or -1 with err. */
static int ensure_shard(qt_loader *l, char *err, size_t errlen) {
    ensure_order(l);
    int f = (int)l->order[l->pos.shard_cursor];
    if (load_file(l, f, err, errlen)) return -1;
    if (l->shuffle && (l->wperm_file != f || l->wperm_epoch != l->pos.epoch)) {
        uint64_t n = l->sh[f].n_windows;
        free(l->wperm);
        l->wperm_file = -1;
        l->wperm = malloc(n * sizeof *l->wperm);
        if (!l->wperm) {
            snprintf(err, errlen, "cannot allocate the window order of %s (%llu windows)", l->sh[f].path,
                     (unsigned long long)n);
            return -1;
        }
        for (uint64_t i = 0; i < n; i++) l->wperm[i] = i;
        shuffle(l->wperm, n, qt_hash64(qt_hash64(qt_hash64(l->seed, TAG_WINDOWS), l->pos.epoch), (uint64_t)f));
        l->wperm_file = f;
        l->wperm_epoch = l->pos.epoch;
    }
    return 0;
}

/* Writes the input positions of the document starts in tokens [start, start + seq_len) to starts
 * and returns their count. */
static int32_t window_docs(const qt_tokens_data *d, uint64_t start, int seq_len, int32_t *starts) {
    uint64_t lo = 0, hi = d->h.n_docs; /* the first start >= start */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (qt_tokens_doc_start(d, mid) < start) lo = mid + 1;
        else hi = mid;
    }
    int32_t n = 0;
    for (uint64_t i = lo; i < d->h.n_docs; i++) {
        uint64_t v = qt_tokens_doc_start(d, i);
        if (v >= start + (uint64_t)seq_len) break;
        starts[n++] = (int32_t)(v - start);
    }
    return n;
}

/* Window w of the loaded shard into in, tg (and starts, n_starts). */
static void copy_window(qt_loader *l, uint64_t w, int32_t *in, int32_t *tg, int32_t *starts, int32_t *n_starts) {
    uint64_t start = w * (uint64_t)l->seq_len;
    const uint8_t *mask = l->data.mask;
    uint32_t prev = qt_tokens_token(&l->data, start);
    for (int t = 0; t < l->seq_len; t++) {
        uint64_t i = start + t + 1;
        uint32_t next = qt_tokens_token(&l->data, i);
        in[t] = (int32_t)prev;
        tg[t] = !mask || mask[i] ? (int32_t)next : -1;
        prev = next;
    }
    if (n_starts) *n_starts = window_docs(&l->data, start, l->seq_len, starts);
}

/* The unit under the cursor (one window, or a pair's two) into rows of in, tg, starts, n_starts. */
static int read_window(qt_loader *l, int32_t *in, int32_t *tg, int32_t *starts, int32_t *n_starts, char *err,
                       size_t errlen) {
    if (ensure_shard(l, err, errlen) != 0) return -1;
    uint64_t u = l->shuffle ? l->wperm[l->pos.window_cursor] : l->pos.window_cursor, S = (uint64_t)l->seq_len;
    const shard_info *s = &l->sh[l->order[l->pos.shard_cursor]];
    for (int j = 0; j < l->unit; j++) {
        copy_window(l, u * l->unit + j, in + j * S, tg + j * S, starts ? starts + j * S : NULL, n_starts ? n_starts + j : NULL);
        l->rows[l->n_rows++] = s->first_row + u * l->unit + j;
    }
    advance(l, 1);
    return 0;
}

int qt_loader_next(qt_loader *l, int32_t *inputs, int32_t *targets, char *err, size_t errlen) {
    return qt_loader_next_docs(l, inputs, targets, NULL, NULL, err, errlen);
}

int qt_loader_next_docs(qt_loader *l, int32_t *inputs, int32_t *targets, int32_t *starts, int32_t *n_starts,
                        char *err, size_t errlen) {
    qt_loader_pos start = l->pos;
    l->n_rows = 0;
    uint64_t mb = (uint64_t)(l->micro_batch / l->unit), S = (uint64_t)l->seq_len * l->unit, k = (uint64_t)l->unit;
    advance(l, (uint64_t)l->rank * mb);
    for (uint64_t i = 0; i < mb; i++)
        if (read_window(l, inputs + i * S, targets + i * S, starts ? starts + i * S : NULL, n_starts ? n_starts + i * k : NULL,
                        err, errlen)) {
            l->pos = start;
            return -1;
        }
    advance(l, (uint64_t)(l->world - 1 - l->rank) * mb);
    return 0;
}

void qt_loader_last_rows(const qt_loader *l, uint64_t *rows) {
    memcpy(rows, l->rows, (size_t)l->micro_batch * sizeof *rows);
}

/* The shard holding data row r (< total rows), by binary search over first_row. */
static int shard_of_row(const qt_loader *l, uint64_t r) {
    int lo = 0, hi = l->n_sh - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->sh[mid].first_row <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int qt_loader_read_rows(qt_loader *l, uint64_t row0, int n, int32_t *in, int32_t *tg, int32_t *starts, int32_t *n_starts,
                        char *err, size_t errlen) {
    uint64_t total = l->total_windows * (uint64_t)l->unit, S = (uint64_t)l->seq_len;
    for (int b = 0; b < n; b++) {
        uint64_t r = row0 + (uint64_t)b;
        if (r >= total) { /* past the data: token 0, every target ignored */
            memset(in + b * S, 0, S * sizeof *in);
            memset(tg + b * S, 0xff, S * sizeof *tg);
            if (n_starts) n_starts[b] = 0;
            continue;
        }
        int f = shard_of_row(l, r);
        if (load_file(l, f, err, errlen)) return -1;
        copy_window(l, r - l->sh[f].first_row, in + b * S, tg + b * S, starts ? starts + b * S : NULL,
                    n_starts ? n_starts + b : NULL);
    }
    return 0;
}

const char *qt_loader_shard_path(const qt_loader *l, int i) { return l->sh[i].path; }

const qt_tokens_header *qt_loader_shard_header(const qt_loader *l, int i) { return &l->sh[i].h; }

uint64_t qt_loader_shard_rows(const qt_loader *l, int i, uint64_t *first) {
    *first = l->sh[i].first_row;
    return l->sh[i].n_windows * (uint64_t)l->unit;
}

qt_loader_pos qt_loader_get_pos(const qt_loader *l) { return l->pos; }

int qt_loader_check_pos(qt_loader *l, qt_loader_pos p, char *err, size_t errlen) {
    if (p.shard_cursor >= (uint64_t)l->n_sh)
        return qt_errf(err, errlen, "shard cursor %llu, but the data has %d shards", (unsigned long long)p.shard_cursor,
                       l->n_sh);
    qt_loader_pos keep = l->pos;
    l->pos = p;
    uint64_t nw = cur_windows(l);
    l->pos = keep;
    if (p.window_cursor >= nw)
        return qt_errf(err, errlen, "window cursor %llu, but shard %s has %llu windows", (unsigned long long)p.window_cursor,
                       l->sh[l->order[p.shard_cursor]].path, (unsigned long long)nw);
    return 0;
}

void qt_loader_set_pos(qt_loader *l, qt_loader_pos p) {
    QT_CHECK(p.shard_cursor < (uint64_t)l->n_sh,
             "loader position: shard cursor %llu, but the data has %d shards (did the data change since the "
             "checkpoint?)", (unsigned long long)p.shard_cursor, l->n_sh);
    l->pos = p;
    uint64_t nw = cur_windows(l);
    QT_CHECK(p.window_cursor < nw,
             "loader position: window cursor %llu, but shard %s has %llu windows (did the data or seq_len "
             "change since the checkpoint?)", (unsigned long long)p.window_cursor,
             l->sh[l->order[p.shard_cursor]].path, (unsigned long long)nw);
}

void qt_loader_reset(qt_loader *l) { qt_loader_set_pos(l, (qt_loader_pos){0, 0, 0}); }

uint64_t qt_loader_windows(const qt_loader *l) { return l->total_windows * (uint64_t)l->unit; }

int qt_loader_pairs(const qt_loader *l) { return l->unit == 2; }

int qt_loader_doc_shards(const qt_loader *l) {
    int n = 0;
    for (int i = 0; i < l->n_sh; i++) n += (l->sh[i].h.flags & QT_TOKENS_FLAG_DOCS) != 0;
    return n;
}

int qt_loader_shards(const qt_loader *l) { return l->n_sh; }

void qt_loader_free(qt_loader *l) {
    if (!l) return;
    qt_tokens_unload(&l->data);
    for (int i = 0; i < l->n_sh; i++) free(l->sh[i].path);
    free(l->sh);
    free(l->order);
    free(l->wperm);
    free(l->rows);
    free(l);
}

/* Appends every file matching one pattern, sorted. */
static int add_pattern(qt_loader *l, const char *pat, char *err, size_t errlen) {
    glob_t g;
    int rc = glob(pat, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        snprintf(err, errlen, "no files match %s", pat);
        if (rc == 0) globfree(&g);
        return -1;
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s: glob failed (%s)", pat, rc == GLOB_NOSPACE ? "out of memory" : "read error");
        return -1;
    }
    shard_info *sh = realloc(l->sh, (l->n_sh + g.gl_pathc) * sizeof *sh);
    if (!sh) {
        globfree(&g);
        snprintf(err, errlen, "%s: out of memory", pat);
        return -1;
    }
    l->sh = sh;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        shard_info *s = &l->sh[l->n_sh];
        memset(s, 0, sizeof *s);
        s->path = strdup(g.gl_pathv[i]);
        if (!s->path) {
            snprintf(err, errlen, "%s: out of memory", pat);
            globfree(&g);
            return -1;
        }
        l->n_sh++;
    }
    globfree(&g);
    return 0;
}

/* Shard i's pairs flag against shard 0's (l->unit), its pair_seq_len against seq_len and, with pairs, an even
 * micro_batch. */
static int check_pairs(qt_loader *l, const shard_info *s, int i, char *err, size_t errlen) {
    int pairs = (s->h.flags & QT_TOKENS_FLAG_PAIRS) != 0;
    if (i == 0) l->unit = pairs ? 2 : 1;
    if (pairs != (l->unit == 2))
        return qt_errf(err, errlen, "%s is %s pair shard but %s is %s: the shards of one run are all preference pairs "
                       "(tools/tokenize --pairs) or none", s->path, pairs ? "a" : "not a", l->sh[0].path,
                       pairs ? "not" : "one");
    if (!pairs) return 0;
    if (s->h.pair_seq_len != (uint32_t)l->seq_len)
        return qt_errf(err, errlen, "%s: a pair shard of seq_len %u (tools/tokenize --pairs --seq-len %u), but data.seq_len "
                       "is %d: set data.seq_len: %u", s->path, s->h.pair_seq_len, s->h.pair_seq_len, l->seq_len,
                       s->h.pair_seq_len);
    if (l->micro_batch % 2)
        return qt_errf(err, errlen, "%s: a pair shard, but data.micro_batch is %d: expected an even count (a micro-batch "
                       "holds micro_batch / 2 pairs of chosen and rejected sequences)", s->path, l->micro_batch);
    return 0;
}

/* Reads every header; checks vocab against vocab_limit and that each shard holds a window. */
static int scan_shards(qt_loader *l, char *err, size_t errlen) {
    uint64_t need = (uint64_t)l->seq_len + 1;
    for (int i = 0; i < l->n_sh; i++) {
        shard_info *s = &l->sh[i];
        if (qt_tokens_read_header(s->path, &s->h, err, errlen) != 0) return -1;
        if (l->vocab_limit > 0 && s->h.vocab_size > l->vocab_limit) {
            snprintf(err, errlen, "%s: vocab_size %u > the model's vocab %u", s->path, s->h.vocab_size,
                     l->vocab_limit);
            return -1;
        }
        if (s->h.n_tokens < need) {
            snprintf(err, errlen, "%s: shard has %llu tokens, fewer than one window of seq_len+1 = %llu", s->path,
                     (unsigned long long)s->h.n_tokens, (unsigned long long)need);
            return -1;
        }
        s->n_windows = (s->h.n_tokens - 1) / (uint64_t)l->seq_len;
        if (check_pairs(l, s, i, err, errlen)) return -1;
        s->n_windows /= (uint64_t)l->unit;
        s->first_row = l->total_windows * (uint64_t)l->unit;
        l->total_windows += s->n_windows;
    }
    return 0;
}

qt_loader *qt_loader_open(const char *glob_list, int seq_len, int micro_batch, int rank, int world,
                          uint64_t seed, int shuffle, uint32_t vocab_limit, char *err, size_t errlen) {
    if (seq_len < 1 || micro_batch < 1 || world < 1 || rank < 0 || rank >= world) {
        snprintf(err, errlen, "%s: bad loader arguments seq_len %d, micro_batch %d, rank %d, world %d "
                 "(expected seq_len >= 1, micro_batch >= 1, 0 <= rank < world)", glob_list, seq_len,
                 micro_batch, rank, world);
        return NULL;
    }
    qt_loader *l = calloc(1, sizeof *l);
    char *pats = strdup(glob_list);
    if (!l || !pats) {
        snprintf(err, errlen, "%s: out of memory", glob_list);
        free(l);
        free(pats);
        return NULL;
    }
    *l = (qt_loader){.seq_len = seq_len, .micro_batch = micro_batch, .rank = rank, .world = world,
                     .shuffle = shuffle != 0, .seed = seed, .vocab_limit = vocab_limit, .wperm_file = -1,
                     .data_file = -1, .unit = 1};
    int rc = 0, any = 0;
    for (char *save = NULL, *p = strtok_r(pats, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ') p++;
        if (!*p) continue;
        any = 1;
        rc = add_pattern(l, p, err, errlen);
    }
    free(pats);
    if (rc == 0 && !any) rc = -1, snprintf(err, errlen, "no data files given (empty glob \"%s\")", glob_list);
    if (rc == 0) rc = scan_shards(l, err, errlen);
    if (rc == 0 && (!(l->order = malloc((size_t)l->n_sh * sizeof *l->order)) ||
                    !(l->rows = calloc((size_t)micro_batch, sizeof *l->rows))))
        rc = -1, snprintf(err, errlen, "%s: out of memory", glob_list);
    if (rc != 0) {
        qt_loader_free(l);
        return NULL;
    }
    return l;
}
