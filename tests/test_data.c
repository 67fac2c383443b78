/* test_data.c — token shards (round trip, zstd, corruption errors) and the data loader (order,
 * ranks, epochs, save/restore, eval). */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qt_crc32.h"
#include "qt_data.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_data_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

static void clean_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(g_dir);
}

static uint32_t *random_tokens(uint64_t n, uint32_t vocab, uint64_t seed) {
    qt_rng r;
    qt_rng_seed(&r, seed);
    uint32_t *t = malloc(n * sizeof *t + 1);
    for (uint64_t i = 0; i < n; i++) t[i] = (uint32_t)qt_rng_below(&r, vocab);
    return t;
}

/* Overwrites len bytes at off in a file. */
static void patch(const char *path, long off, const void *b, size_t len) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || pwrite(fd, b, len, off) != (ssize_t)len) perror(path);
    close(fd);
}

static void test_fnv_vectors(void) {
    QT_EXPECT(qt_fnv1a64("", 0, QT_FNV_INIT) == 0xcbf29ce484222325ull, "empty");
    QT_EXPECT(qt_fnv1a64("a", 1, QT_FNV_INIT) == 0xaf63dc4c8601ec8cull, "a");
    QT_EXPECT(qt_fnv1a64("foobar", 6, QT_FNV_INIT) == 0x85944171f73967e8ull, "foobar");
    /* chaining over pieces equals one pass */
    QT_EXPECT(qt_fnv1a64("bar", 3, qt_fnv1a64("foo", 3, QT_FNV_INIT)) == 0x85944171f73967e8ull, "chained");
}

static void roundtrip(const char *name, int tb, uint32_t vocab, uint64_t n) {
    char err[512];
    uint32_t *t = random_tokens(n, vocab, n * 31 + (uint64_t)tb);
    if (n > 2) t[0] = vocab - 1, t[n - 1] = 0;
    const char *p = qt_t_path(g_dir, name);
    QT_REQUIRE(qt_tokens_write(p, t, n, tb, vocab, 3, err, sizeof err) == 0, "%s", err);
    uint32_t *got = NULL;
    qt_tokens_header h = {0};
    QT_REQUIRE(qt_tokens_read(p, &got, &h, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(h.version == 2 && h.flags == 0 && h.token_bytes == (uint32_t)tb && h.vocab_size == vocab && h.n_tokens == n,
              "%s: header v%u tb%u vocab%u n%llu", name, h.version, h.token_bytes, h.vocab_size,
              (unsigned long long)h.n_tokens);
    for (uint64_t i = 0; i < n; i++) QT_REQUIRE(got[i] == t[i], "%s: token %llu: %u != %u", name, (unsigned long long)i, got[i], t[i]);
    qt_tokens_header h2;
    QT_EXPECT(qt_tokens_read_header(p, &h2, err, sizeof err) == 0 && h2.checksum == h.checksum, "%s: header", name);
    if (!strstr(name, ".zst")) {
        struct stat st;
        stat(p, &st);
        QT_EXPECT((uint64_t)st.st_size == 64 + n * tb, "%s: size %lld", name, (long long)st.st_size);
    }
    free(t);
    free(got);
}

static void test_shard_roundtrip(void) {
    make_dir();
    roundtrip("a.bin", 2, 256, 1);
    roundtrip("b.bin", 2, 65536, 10007);
    roundtrip("c.bin", 4, 151936, 3001);
    roundtrip("d.bin", 4, 0xffffffffu, 517);
    roundtrip("e.bin", 2, 50, 0);
    roundtrip("f.bin.zst", 2, 65536, 200003);
    roundtrip("g.bin.zst", 4, 151936, 7);
    roundtrip("h.bin.zst", 2, 300, 0);
    /* the on-disk layout, byte by byte */
    uint32_t t[2] = {0x1234, 0xfffe};
    char err[512];
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "x.bin"), t, 2, 2, 65536, 0, err, sizeof err) == 0, "%s", err);
    uint8_t b[68];
    FILE *f = fopen(qt_t_path(g_dir, "x.bin"), "rb");
    QT_REQUIRE(f && fread(b, 1, 68, f) == 68, "read x.bin");
    fclose(f);
    uint8_t pay[4] = {0x34, 0x12, 0xfe, 0xff};
    uint64_t sum = qt_crc32(0, pay, 4);
    QT_EXPECT(memcmp(b, "QTTOKENS\2\0\0\0\2\0\0\0\2\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0", 32) == 0, "header bytes");
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= b[32 + i] == (uint8_t)(sum >> (8 * i));
    for (int i = 40; i < 64; i++) ok &= b[i] == 0;
    QT_EXPECT(ok, "checksum or padding bytes");
    QT_EXPECT(memcmp(b + 64, pay, 4) == 0, "payload bytes");
    clean_dir();
}

static void test_zstd_cli(void) {
    if (system("command -v zstd >/dev/null 2>&1") != 0) QT_SKIP("no zstd command-line tool");
    make_dir();
    char err[512], cmd[1200];
    uint32_t *t = random_tokens(50000, 151936, 5);
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "a.bin"), t, 50000, 4, 151936, 0, err, sizeof err) == 0, "%s", err);
    /* from stdin: the frame carries no content size, so the reader must stream */
    snprintf(cmd, sizeof cmd, "zstd -q -c < %s > %s", qt_t_path(g_dir, "a.bin"), qt_t_path(g_dir, "a.bin.zst"));
    QT_REQUIRE(system(cmd) == 0, "zstd -c failed");
    uint32_t *got = NULL;
    qt_tokens_header h;
    QT_REQUIRE(qt_tokens_read(qt_t_path(g_dir, "a.bin.zst"), &got, &h, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(h.n_tokens == 50000 && memcmp(got, t, 50000 * 4) == 0, "zstd CLI shard differs");
    free(got);
    /* and our .zst decompresses with the CLI to the same bytes as our .bin */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "b.bin.zst"), t, 50000, 4, 151936, 19, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "zstd -q -d -c %s | cmp -s - %s", qt_t_path(g_dir, "b.bin.zst"), qt_t_path(g_dir, "a.bin"));
    QT_EXPECT(system(cmd) == 0, "zstd -d of our .zst differs from the .bin");
    free(t);
    clean_dir();
}

/* Expects qt_tokens_read(path) to fail with a message containing want (and the path). */
static void expect_read_error(const char *path, const char *want) {
    char err[512] = "";
    uint32_t *got = NULL;
    qt_tokens_header h;
    int rc = qt_tokens_read(path, &got, &h, err, sizeof err);
    QT_EXPECT(rc == -1 && got == NULL, "%s: read succeeded", path);
    QT_EXPECT(strstr(err, want) && strstr(err, path), "%s: message \"%s\" lacks \"%s\"", path, err, want);
}

static void test_shard_errors(void) {
    make_dir();
    char err[512];
    uint32_t *t = random_tokens(1000, 1000, 9);
    const char *p = qt_t_path(g_dir, "s.bin");
    /* truncated */
    QT_REQUIRE(qt_tokens_write(p, t, 1000, 2, 1000, 0, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(truncate(p, 1500) == 0, "truncate");
    expect_read_error(p, "truncated: header says 1000 tokens (2064 bytes), file has 1500 bytes");
    qt_tokens_header h;
    QT_EXPECT(qt_tokens_read_header(p, &h, err, sizeof err) == -1 && strstr(err, "truncated"), "header: %s", err);
    QT_REQUIRE(truncate(p, 20) == 0, "truncate");
    expect_read_error(p, "fewer than the 64-byte header");
    /* bad magic */
    QT_REQUIRE(qt_tokens_write(p, t, 1000, 2, 1000, 0, err, sizeof err) == 0, "%s", err);
    patch(p, 0, "QTTOKENZ", 8);
    expect_read_error(p, "bad magic (expected QTTOKENS)");
    /* flipped payload byte */
    QT_REQUIRE(qt_tokens_write(p, t, 1000, 2, 1000, 0, err, sizeof err) == 0, "%s", err);
    uint8_t b = (uint8_t)(t[500] ^ 1);
    patch(p, 64 + 1000, &b, 1);
    expect_read_error(p, "checksum mismatch (header 0x");
    /* token >= vocab, with a checksum that matches the bad payload */
    uint32_t bad[5] = {1, 2, 3, 999, 4};
    QT_REQUIRE(qt_tokens_write(p, bad, 5, 2, 1000, 0, err, sizeof err) == 0, "%s", err);
    uint8_t pay[10] = {1, 0, 2, 0, 3, 0, 0xb0, 0x04, 4, 0}; /* 1200 at index 3 */
    uint64_t sum = qt_crc32(0, pay, 10);
    uint8_t sb[8];
    for (int i = 0; i < 8; i++) sb[i] = (uint8_t)(sum >> (8 * i));
    patch(p, 64, pay, 10);
    patch(p, 32, sb, 8);
    expect_read_error(p, "token 1200 at index 3 >= vocab_size 1000");
    /* the writer refuses such tokens too */
    bad[3] = 1000;
    QT_EXPECT(qt_tokens_write(p, bad, 5, 2, 1000, 0, err, sizeof err) == -1 &&
                  strstr(err, "token 1000 at index 3 >= vocab_size 1000"), "write: %s", err);
    QT_EXPECT(qt_tokens_write(p, bad, 5, 2, 70000, 0, err, sizeof err) == -1 && strstr(err, "vocab_size 70000"),
              "write tb2 vocab 70000: %s", err);
    /* bad version and token width */
    QT_REQUIRE(qt_tokens_write(p, t, 1000, 2, 1000, 0, err, sizeof err) == 0, "%s", err);
    patch(p, 8, "\7", 1);
    expect_read_error(p, "unsupported version 7");
    patch(p, 8, "\2", 1);
    patch(p, 12, "\3", 1);
    expect_read_error(p, "token_bytes is 3");
    /* a truncated .zst, and a .zst whose stream is longer than its header says */
    const char *z = qt_t_path(g_dir, "s.bin.zst");
    QT_REQUIRE(qt_tokens_write(z, t, 1000, 4, 1000, 1, err, sizeof err) == 0, "%s", err);
    struct stat st;
    stat(z, &st);
    QT_REQUIRE(truncate(z, st.st_size - 40) == 0, "truncate zst");
    expect_read_error(z, "truncated");
    expect_read_error(qt_t_path(g_dir, "missing.bin"), "cannot open");
    free(t);
    clean_dir();
}

/* Shard s token i = s*1000000 + i: a window is identified by its first token. */
static const uint64_t k_lens[] = {1000, 337, 2049, 300, 777};
#define N_SHARDS 5

static void write_loader_shards(int zst_every) {
    char err[512], name[64];
    for (int s = 0; s < N_SHARDS; s++) {
        uint64_t n = k_lens[s];
        uint32_t *t = malloc(n * sizeof *t);
        for (uint64_t i = 0; i < n; i++) t[i] = (uint32_t)(s * 1000000 + i);
        snprintf(name, sizeof name, "train_%06d.bin%s", s, zst_every && s % zst_every == 0 ? ".zst" : "");
        if (qt_tokens_write(qt_t_path(g_dir, name), t, n, 4, 1 << 23, 1, err, sizeof err) != 0) printf("  %s\n", err);
        free(t);
    }
}

static uint64_t expected_windows(int seq_len) {
    uint64_t w = 0;
    for (int s = 0; s < N_SHARDS; s++) w += (k_lens[s] - 1) / seq_len;
    return w;
}

static qt_loader *open_l(int seq_len, int mb, int rank, int world, uint64_t seed, int shuffle) {
    char err[512], glob[600];
    snprintf(glob, sizeof glob, "%s/train_*", g_dir);
    qt_loader *l = qt_loader_open(glob, seq_len, mb, rank, world, seed, shuffle, 0, err, sizeof err);
    if (!l) printf("  open: %s\n", err);
    return l;
}

/* Reads n micro-batches; returns the first token of each window, and checks targets = inputs + 1. */
static int read_firsts(qt_loader *l, int seq_len, int mb, int n, int32_t *firsts) {
    int32_t *in = malloc((size_t)mb * seq_len * 4), *tg = malloc((size_t)mb * seq_len * 4);
    int ok = 1;
    char err_[512];
    for (int b = 0; b < n; b++) {
        for (int i = 0; i < mb * seq_len; i++) in[i] = tg[i] = -1;
        if (qt_loader_next(l, in, tg, err_, sizeof err_) != 0) {
            printf("  next: %s\n", err_);
            ok = 0;
            break;
        }
        for (int w = 0; w < mb; w++) {
            int32_t *x = in + w * seq_len, *y = tg + w * seq_len;
            firsts[b * mb + w] = x[0];
            ok &= x[0] % 1000000 % seq_len == 0; /* windows start at multiples of seq_len */
            for (int t = 0; t < seq_len; t++) ok &= y[t] == x[t] + 1 && (t == 0 || x[t] == y[t - 1]);
        }
    }
    free(in);
    free(tg);
    return ok;
}

static void test_loader_determinism(void) {
    make_dir();
    write_loader_shards(2);
    int T = 16, mb = 3, n = 20;
    int32_t a[60], b[60], c[60];
    qt_loader *la = open_l(T, mb, 0, 1, 42, 1), *lb = open_l(T, mb, 0, 1, 42, 1), *lc = open_l(T, mb, 0, 1, 43, 1);
    QT_REQUIRE(la && lb && lc, "open");
    QT_EXPECT(qt_loader_windows(la) == expected_windows(T), "windows %llu", (unsigned long long)qt_loader_windows(la));
    QT_EXPECT(read_firsts(la, T, mb, n, a) && read_firsts(lb, T, mb, n, b) && read_firsts(lc, T, mb, n, c),
              "targets are not inputs shifted by one");
    QT_EXPECT(memcmp(a, b, sizeof a) == 0, "same seed, different batches");
    QT_EXPECT(memcmp(a, c, sizeof a) != 0, "seeds 42 and 43 give the same batches");
    qt_loader_free(la);
    qt_loader_free(lb);
    qt_loader_free(lc);
    clean_dir();
}

static void test_loader_epoch_coverage(void) {
    make_dir();
    write_loader_shards(4);
    for (int T = 1; T <= 64; T += 63) {
        qt_loader *l = open_l(T, 1, 0, 1, 7, 1);
        QT_REQUIRE(l, "open");
        uint64_t nw = qt_loader_windows(l);
        QT_REQUIRE(nw == expected_windows(T), "T=%d: windows %llu", T, (unsigned long long)nw);
        int32_t *f = malloc(2 * nw * 4);
        QT_REQUIRE(read_firsts(l, T, 1, (int)(2 * nw), f), "T=%d: targets", T);
        /* epoch 0 and epoch 1 each visit every window exactly once, in different orders */
        for (int e = 0; e < 2; e++) {
            uint64_t seen = 0;
            for (int s = 0; s < N_SHARDS; s++) {
                uint64_t ws = (k_lens[s] - 1) / T;
                uint8_t *hit = calloc(ws, 1);
                for (uint64_t i = 0; i < nw; i++) {
                    int32_t x = f[e * nw + i];
                    if (x / 1000000 != s) continue;
                    uint64_t w = (uint64_t)(x % 1000000) / T;
                    QT_EXPECT(w < ws && !hit[w], "T=%d epoch %d: shard %d window %llu twice or out of range", T, e, s,
                              (unsigned long long)w);
                    if (w < ws) hit[w] = 1;
                    seen++;
                }
                free(hit);
            }
            QT_EXPECT(seen == nw, "T=%d epoch %d: %llu windows seen, want %llu", T, e, (unsigned long long)seen,
                      (unsigned long long)nw);
        }
        QT_EXPECT(memcmp(f, f + nw, nw * 4) != 0, "T=%d: epochs 0 and 1 in the same order", T);
        /* each shard's windows are contiguous in an epoch; shards come in a shuffled order */
        int changes = 0, order[2][N_SHARDS], k[2] = {0, 0}, shuffled = 0;
        for (uint64_t i = 0; i < 2 * nw; i++) {
            int e = i >= nw, s = f[i] / 1000000;
            if (i % nw == 0 || s != f[i - 1] / 1000000) {
                changes++;
                if (k[e] < N_SHARDS) order[e][k[e]++] = s;
            }
        }
        for (int e = 0; e < 2; e++)
            for (int s = 0; s < N_SHARDS; s++) shuffled |= order[e][s] != s;
        QT_EXPECT(changes == 2 * N_SHARDS, "T=%d: %d shard switches in 2 epochs, want %d", T, changes, 2 * N_SHARDS);
        QT_EXPECT(shuffled, "T=%d: shards visited in file order in both epochs", T);
        qt_loader_pos p = qt_loader_get_pos(l);
        QT_EXPECT(p.epoch == 2 && p.shard_cursor == 0 && p.window_cursor == 0, "T=%d: pos after 2 epochs %llu/%llu/%llu",
                  T, (unsigned long long)p.epoch, (unsigned long long)p.shard_cursor, (unsigned long long)p.window_cursor);
        free(f);
        qt_loader_free(l);
    }
    clean_dir();
}

static void test_loader_ranks_disjoint(void) {
    make_dir();
    write_loader_shards(3);
    int T = 32, mb = 3, world = 3, nb = 20; /* 180 windows pass the epoch end (138 windows) */
    int32_t g[20 * 9], r[20 * 3];
    qt_loader *l1 = open_l(T, mb * world, 0, 1, 11, 1);
    QT_REQUIRE(l1 && read_firsts(l1, T, mb * world, nb, g), "world=1 read");
    for (int rank = 0; rank < world; rank++) {
        qt_loader *l = open_l(T, mb, rank, world, 11, 1);
        QT_REQUIRE(l && read_firsts(l, T, mb, nb, r), "rank %d read", rank);
        for (int b = 0; b < nb; b++)
            for (int w = 0; w < mb; w++)
                QT_EXPECT(r[b * mb + w] == g[b * mb * world + rank * mb + w], "batch %d rank %d window %d: %d != %d", b,
                          rank, w, r[b * mb + w], g[b * mb * world + rank * mb + w]);
        qt_loader_pos p = qt_loader_get_pos(l), p1 = qt_loader_get_pos(l1);
        QT_EXPECT(memcmp(&p, &p1, sizeof p) == 0, "rank %d: position differs from world=1", rank);
        qt_loader_free(l);
    }
    /* no window repeats within an epoch's worth of batches */
    uint64_t nw = qt_loader_windows(l1);
    for (uint64_t i = 0; i < nw && i < (uint64_t)nb * 9; i++)
        for (uint64_t j = 0; j < i; j++) QT_EXPECT(g[i] != g[j], "window %d repeats at %llu", g[i], (unsigned long long)i);
    qt_loader_free(l1);
    clean_dir();
}

static void check_restore(int T, int mb, int rank, int world, int k, int shuffle) {
    int32_t a[5 * 8], b[5 * 8], skip[64 * 8];
    qt_loader *l = open_l(T, mb, rank, world, 99, shuffle);
    QT_REQUIRE(l && read_firsts(l, T, mb, k, skip), "read k");
    qt_loader_pos p = qt_loader_get_pos(l);
    QT_REQUIRE(read_firsts(l, T, mb, 5, a), "read 5");
    qt_loader *l2 = open_l(T, mb, rank, world, 99, shuffle);
    QT_REQUIRE(l2, "open 2");
    read_firsts(l2, T, mb, 1, b); /* its own state must not leak into the restored position */
    qt_loader_set_pos(l2, p);
    QT_REQUIRE(read_firsts(l2, T, mb, 5, b), "read 5 after restore");
    QT_EXPECT(memcmp(a, b, (size_t)5 * mb * 4) == 0, "T=%d mb=%d rank %d/%d k=%d: restored batches differ", T, mb, rank,
              world, k);
    qt_loader_free(l);
    qt_loader_free(l2);
}

static void test_loader_save_restore(void) {
    make_dir();
    write_loader_shards(2);
    check_restore(16, 2, 0, 1, 3, 1);
    /* 16 windows/epoch at T=256: 7 batches of 2 leave 2 windows, so the next 5 cross into epoch 1 */
    check_restore(256, 2, 0, 1, 7, 1);
    check_restore(256, 3, 1, 3, 1, 1);
    check_restore(256, 3, 2, 3, 2, 1);
    check_restore(100, 1, 0, 1, 40, 0);
    clean_dir();
}

static void test_loader_eval_order(void) {
    make_dir();
    write_loader_shards(2);
    int T = 100, nw = (int)expected_windows(T);
    int32_t *f = malloc((size_t)(nw + 3) * 4), *g = malloc((size_t)(nw + 3) * 4);
    qt_loader *l = open_l(T, 1, 0, 1, 5, 0);
    QT_REQUIRE(l && read_firsts(l, T, 1, nw + 3, f), "read");
    int i = 0;
    for (int s = 0; s < N_SHARDS; s++)
        for (uint64_t w = 0; w < (k_lens[s] - 1) / T; w++, i++)
            QT_EXPECT(f[i] == (int32_t)(s * 1000000 + w * T), "eval window %d: %d, want %d", i, f[i],
                      (int)(s * 1000000 + w * T));
    QT_EXPECT(f[nw] == 0 && f[nw + 1] == T, "eval does not wrap to the start");
    qt_loader_reset(l);
    QT_REQUIRE(read_firsts(l, T, 1, nw + 3, g), "read after reset");
    QT_EXPECT(memcmp(f, g, (size_t)(nw + 3) * 4) == 0, "reset does not restart the same sequence");
    free(f);
    free(g);
    qt_loader_free(l);
    clean_dir();
}

static void test_loader_errors(void) {
    make_dir();
    char err[512], glob[600];
    snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "no files match") &&
                  strstr(err, glob), "no match: %s", err);
    uint32_t t[50] = {0};
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "train_0.bin"), t, 50, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(!qt_loader_open(glob, 128, 1, 0, 1, 0, 1, 0, err, sizeof err) &&
                  strstr(err, "shard has 50 tokens, fewer than one window of seq_len+1 = 129") &&
                  strstr(err, "train_0.bin"), "short shard: %s", err);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 256, err, sizeof err) && strstr(err, "vocab_size 300"),
              "vocab limit: %s", err);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 3, 3, 0, 1, 0, err, sizeof err) && strstr(err, "rank 3"), "rank: %s", err);
    /* comma-separated patterns: each must match; windows add up */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "eval_0.bin"), t, 50, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    char two[1300];
    snprintf(two, sizeof two, "%s, %s/eval_*.bin", glob, g_dir);
    qt_loader *l2 = qt_loader_open(two, 7, 1, 0, 1, 0, 1, 0, err, sizeof err);
    QT_EXPECT(l2 && qt_loader_windows(l2) == 14, "two patterns: %s", l2 ? "wrong window count" : err);
    qt_loader_free(l2);
    snprintf(two, sizeof two, "%s,%s/nothing_*.bin", glob, g_dir);
    QT_EXPECT(!qt_loader_open(two, 7, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "nothing_*.bin"),
              "second pattern unmatched: %s", err);
    patch(qt_t_path(g_dir, "train_0.bin"), 3, "X", 1);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "bad magic"), "magic: %s", err);
    /* a payload corrupted after the header passes open, and comes back as an error when loaded (it
     * used to exit the process); the position stays where it was */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "train_0.bin"), t, 50, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    patch(qt_t_path(g_dir, "train_0.bin"), 70, "\1", 1);
    qt_loader *l = qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    int32_t in[8], tg[8];
    qt_loader_pos p0 = qt_loader_get_pos(l);
    int rc = qt_loader_next(l, in, tg, err, sizeof err);
    qt_loader_pos p1 = qt_loader_get_pos(l);
    QT_EXPECT(rc == -1 && strstr(err, "checksum mismatch") && strstr(err, "train_0.bin"), "rc %d: %s", rc, err);
    QT_EXPECT(memcmp(&p0, &p1, sizeof p0) == 0, "the position moved on a failed read");
    qt_loader_free(l);
    clean_dir();
}

/* Shards written by tools/tokenize (Python) load in C: same layout, same checksum, zstd via the CLI. */
static void test_tokenize_tool_shards(void) {
    if (access("tools/tokenize", X_OK) != 0) QT_SKIP("tools/tokenize not found (run from the repository root)");
    if (system("python3 -c '' >/dev/null 2>&1") != 0) QT_SKIP("no python3");
    make_dir();
    char text[3000], cmd[1400], err[512];
    for (int i = 0; i < (int)sizeof text; i++) text[i] = (char)(32 + (i * 7 + i / 13) % 95);
    FILE *f = fopen(qt_t_path(g_dir, "in.txt"), "wb");
    QT_REQUIRE(f && fwrite(text, 1, sizeof text, f) == sizeof text, "write in.txt");
    fclose(f);
    int zst = system("command -v zstd >/dev/null 2>&1 || python3 -c 'import zstandard' 2>/dev/null") == 0;
    snprintf(cmd, sizeof cmd, "python3 tools/tokenize --byte-level %s --out %s --eval-frac 0.1 --shard-tokens 1000 "
             "--quiet %s >/dev/null", qt_t_path(g_dir, "in.txt"), g_dir, zst ? "--zstd" : "");
    QT_REQUIRE(system(cmd) == 0, "tools/tokenize failed");
    /* 2700 train tokens in 3 shards of 900, 300 eval tokens; read back in order they equal the text */
    const char *names[4] = {"train_000000.bin", "train_000001.bin", "train_000002.bin", "eval_000000.bin"};
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%s", names[i], zst ? ".zst" : "");
        uint32_t *t = NULL;
        qt_tokens_header h;
        QT_REQUIRE(qt_tokens_read(qt_t_path(g_dir, name), &t, &h, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(h.n_tokens == (i < 3 ? 900u : 300u) && h.vocab_size == 256 && h.token_bytes == 2, "%s: header", name);
        for (uint64_t j = 0; j < h.n_tokens && off + j < sizeof text; j++)
            QT_EXPECT(t[j] == (uint8_t)text[off + j], "%s: token %llu", name, (unsigned long long)j);
        off += h.n_tokens;
        free(t);
    }
    QT_EXPECT(off == sizeof text, "%llu tokens in all", (unsigned long long)off);
    char glob[600];
    snprintf(glob, sizeof glob, "%s/train_*", g_dir);
    qt_loader *l = qt_loader_open(glob, 64, 2, 0, 1, 1, 1, 256, err, sizeof err);
    QT_EXPECT(l && qt_loader_windows(l) == 3 * (899 / 64), "loader on tool shards: %s", l ? "window count" : err);
    qt_loader_free(l);
    clean_dir();
}

int main(void) {
    QT_RUN(test_fnv_vectors);
    QT_RUN(test_shard_roundtrip);
    QT_RUN(test_zstd_cli);
    QT_RUN(test_shard_errors);
    QT_RUN(test_loader_determinism);
    QT_RUN(test_loader_epoch_coverage);
    QT_RUN(test_loader_ranks_disjoint);
    QT_RUN(test_loader_save_restore);
    QT_RUN(test_loader_eval_order);
    QT_RUN(test_loader_errors);
    QT_RUN(test_tokenize_tool_shards);
    return qt_test_end();
}
