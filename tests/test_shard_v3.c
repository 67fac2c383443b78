/* test_shard_v3.c — shard format version 3: document starts after the tokens and mask (layout byte by
 * byte, .zst too, writer and reader errors), each window's document starts from the loader (against a
 * scan of the shard, shuffled, over shard boundaries), none for a version 2 shard, and a shard whose
 * every target is masked out refused by the loader, naming it. */
#include <stdint.h>

#include "qt_crc32.h"
#include "qt_data.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"

static char g_dir[256];

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A hand-made version 3 shard of 2-byte tokens, vocab 300: header fields as given, CRC-32 over pay. */
static size_t make_v3(uint8_t *b, uint32_t flags, uint64_t n_docs, const uint8_t *pay, size_t plen, uint64_t n_tokens) {
    memset(b, 0, 64);
    memcpy(b, "QTTOKENS", 8);
    put_le(b + 8, 3, 4);
    put_le(b + 12, 2, 4);
    put_le(b + 16, n_tokens, 8);
    put_le(b + 24, 300, 4);
    put_le(b + 28, flags, 4);
    put_le(b + 32, qt_crc32(0, pay, plen), 8);
    put_le(b + 40, n_docs, 8);
    memcpy(b + 64, pay, plen);
    return 64 + plen;
}

static void test_shard_v3_layout(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_v3"), "mkdtemp");
    char err[512];
    uint32_t t[5] = {7, 299, 0, 42, 1};
    uint8_t m[5] = {0, 1, 1, 0, 1};
    uint64_t docs[3] = {0, 2, 4};
    const char *names[2] = {"d.bin", "d.bin.zst"};
    for (int z = 0; z < 2; z++) {
        const char *p = qt_t_path(g_dir, names[z]);
        QT_REQUIRE(qt_tokens_write_docs(p, t, m, 5, docs, 3, 2, 300, 3, err, sizeof err) == 0, "%s", err);
        qt_tokens_data d;
        QT_REQUIRE(qt_tokens_load(p, 0, &d, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(d.h.version == 3 && d.h.flags == (QT_TOKENS_FLAG_MASK | QT_TOKENS_FLAG_DOCS) && d.h.n_docs == 3 &&
                      d.docs && d.mask && memcmp(d.mask, m, 5) == 0,
                  "%s: v%u flags %u n_docs %llu", p, d.h.version, d.h.flags, (unsigned long long)d.h.n_docs);
        for (uint64_t i = 0; d.docs && i < 3; i++)
            QT_EXPECT(qt_tokens_doc_start(&d, i) == docs[i], "%s: start %llu", p, (unsigned long long)i);
        qt_tokens_unload(&d);
    }
    /* the bytes: header (flags 3, n_docs 3 at offset 40), tokens, mask, starts as u64 */
    uint8_t pay[15 + 24] = {7, 0, 0x2b, 1, 0, 0, 42, 0, 1, 0, 0, 1, 1, 0, 1};
    for (int i = 0; i < 3; i++) put_le(pay + 15 + 8 * i, docs[i], 8);
    uint8_t b[64 + 39], want[64 + 39];
    FILE *f = fopen(qt_t_path(g_dir, "d.bin"), "rb");
    QT_REQUIRE(f && fread(b, 1, sizeof b, f) == sizeof b && fgetc(f) == EOF, "d.bin is not 64 + 5*2 + 5 + 3*8 bytes");
    fclose(f);
    make_v3(want, 3, 3, pay, sizeof pay, 5);
    QT_EXPECT(memcmp(b, want, sizeof b) == 0, "d.bin bytes differ from the spec");
    /* the writer refuses starts out of order or past the end */
    uint64_t bad1[2] = {2, 2}, bad2[1] = {5};
    QT_EXPECT(qt_tokens_write_docs(qt_t_path(g_dir, "w.bin"), t, m, 5, bad1, 2, 2, 300, 0, err, sizeof err) == -1 &&
                  strstr(err, "document start 2 at index 1"), "writer, repeated start: %s", err);
    QT_EXPECT(qt_tokens_write_docs(qt_t_path(g_dir, "w.bin"), t, NULL, 5, bad2, 1, 2, 300, 0, err, sizeof err) == -1 &&
                  strstr(err, "document start 5 at index 0"), "writer, start past the end: %s", err);
    /* the reader: a start past the end (checksum matching), n_docs without the flag, more starts than
     * tokens, a payload short of its starts */
    put_le(pay + 15 + 16, 9, 8);
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_v3(want, 3, 3, pay, sizeof pay, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "document start 9 at index 2 (expected increasing, < 5 tokens)");
    put_le(pay + 15 + 16, 4, 8);
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_v3(want, 1, 3, pay, sizeof pay, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "n_docs 3 without the document-starts flag");
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_v3(want, 3, 6, pay, sizeof pay, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "n_docs 6 > n_tokens 5");
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_v3(want, 3, 3, pay, sizeof pay - 8, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "their mask and document starts");
    qt_t_rmtree(g_dir);
}

/* Each window's document starts equal a scan of its shard's starts, in shuffled order over two shards
 * of different lengths (a start at token 0 and one at a window's last input position included); a
 * version 2 shard gives none. */
static void test_loader_doc_starts(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_v3"), "mkdtemp");
    char err[512], glob[600];
    enum { N0 = 193, N1 = 97, T = 8, B = 3 };
    uint32_t t[N0]; /* token i of shard s = 200 s + i: a window's first input tells its shard and start */
    uint64_t docs[N0];
    uint8_t is_start[2][N0] = {{0}};
    qt_rng r;
    qt_rng_seed(&r, 11);
    int nd[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        int n = s ? N1 : N0;
        nd[s] = 0;
        for (int i = 0; i < n; i++) {
            t[i] = (uint32_t)(200 * s + i);
            if (i == 0 || i == T - 1 || qt_rng_below(&r, 9) == 0) docs[nd[s]++] = (uint64_t)i, is_start[s][i] = 1;
        }
        char name[32];
        snprintf(name, sizeof name, "train_%d.bin", s);
        QT_REQUIRE(qt_tokens_write_docs(qt_t_path(g_dir, name), t, NULL, n, docs, nd[s], 2, 300, 0, err, sizeof err) == 0,
                   "%s", err);
    }
    snprintf(glob, sizeof glob, "%s/train_0.bin,%s/train_1.bin", g_dir, g_dir);
    qt_loader *l = qt_loader_open(glob, T, B, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    int32_t in[B * T], tg[B * T], st[B * T], ns[B];
    int bad = 0, seen = 0, windows = (int)qt_loader_windows(l);
    for (int k = 0; k < 2 * windows / B; k++) {
        for (int i = 0; i < B * T; i++) st[i] = -7;
        QT_REQUIRE(qt_loader_next_docs(l, in, tg, st, ns, err, sizeof err) == 0, "next: %s", err);
        for (int b = 0; b < B; b++) {
            int s = in[b * T] >= 200, start = in[b * T] - 200 * s, m = 0;
            for (int p = 0; p < T; p++) {
                int want = is_start[s][start + p];
                int got = 0;
                for (int q = 0; q < ns[b]; q++) got |= st[b * T + q] == p;
                bad += want != got;
                m += want;
            }
            bad += ns[b] != m;
            for (int q = 1; q < ns[b]; q++) bad += st[b * T + q] <= st[b * T + q - 1];
            seen += ns[b];
        }
    }
    qt_loader_free(l);
    QT_EXPECT(bad == 0 && seen > 0, "%d window document starts wrong (%d seen)", bad, seen);
    /* a version 2 shard: no starts */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "v2_0.bin"), t, N1, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    snprintf(glob, sizeof glob, "%s/v2_*", g_dir);
    l = qt_loader_open(glob, T, B, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    for (int b = 0; b < B; b++) ns[b] = -7;
    QT_REQUIRE(qt_loader_next_docs(l, in, tg, st, ns, err, sizeof err) == 0, "next: %s", err);
    QT_EXPECT(ns[0] == 0 && ns[1] == 0 && ns[2] == 0, "v2 shard: %d %d %d starts", ns[0], ns[1], ns[2]);
    qt_loader_free(l);
    qt_t_rmtree(g_dir);
}

/* A masked shard with no unmasked target in its windows (mask[0] is no target) is refused when the
 * loader reads it, naming the shard; qt_loader_next never hands out a batch of only -1 from it. */
static void test_all_masked_shard(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_v3"), "mkdtemp");
    char err[512] = "", glob[600];
    enum { N = 65, T = 16 };
    uint32_t t[N];
    uint8_t m[N] = {1};
    for (int i = 0; i < N; i++) t[i] = (uint32_t)i;
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "sft_0.bin"), t, m, N, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    snprintf(glob, sizeof glob, "%s/sft_*", g_dir);
    qt_loader *l = qt_loader_open(glob, T, 2, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    int32_t in[2 * T], tg[2 * T];
    int rc = qt_loader_next(l, in, tg, err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, "sft_0.bin") && strstr(err, "every target is masked out"), "rc %d: %s", rc, err);
    qt_loader_free(l);
    m[N - 1] = 1; /* one target: read */
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "sft_0.bin"), t, m, N, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    l = qt_loader_open(glob, T, 2, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    QT_EXPECT(qt_loader_next(l, in, tg, err, sizeof err) == 0, "one unmasked target: %s", err);
    qt_loader_free(l);
    qt_t_rmtree(g_dir);
}

int main(void) {
    QT_RUN(test_shard_v3_layout);
    QT_RUN(test_loader_doc_starts);
    QT_RUN(test_all_masked_shard);
    return qt_test_end();
}
