/* test_shard_v2.c — shard format version 2: CRC-32 (against the bit-serial definition and Python's
 * zlib.crc32), the loss mask (layout byte by byte, errors), version 1 still read, masked targets
 * through the loader, shards truncated under the loader (an error, not SIGBUS or exit), and every
 * header (.zst too) checked when the loader opens. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "qt_crc32.h"
#include "qt_data.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"

static char g_dir[256];

/* ---- CRC-32 ---- */

static uint32_t crc_bitwise(const uint8_t *p, size_t n) { /* the definition, one bit at a time */
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void test_crc32_vectors(void) {
    QT_EXPECT(qt_crc32(0, "", 0) == 0, "empty");
    QT_EXPECT(qt_crc32(0, "123456789", 9) == 0xcbf43926u, "check value 0x%08x", qt_crc32(0, "123456789", 9));
    QT_EXPECT(qt_crc32(0, "a", 1) == 0xe8b7be43u, "a");
    QT_EXPECT(qt_crc32(qt_crc32(0, "12345", 5), "6789", 4) == 0xcbf43926u, "chained");
    /* every length 0..300 at every alignment 0..7 against the bit-serial definition */
    uint8_t buf[320];
    qt_rng r;
    qt_rng_seed(&r, 3);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)qt_rng_u64(&r);
    int bad = 0;
    for (int a = 0; a < 8; a++)
        for (size_t n = 0; n <= 300; n++) bad += qt_crc32(0, buf + a, n) != crc_bitwise(buf + a, n);
    QT_EXPECT(bad == 0, "%d lengths/alignments differ from the bitwise CRC", bad);
    /* and against Python's zlib.crc32, computed here */
    if (system("python3 -c 'import zlib' >/dev/null 2>&1") != 0) return;
    FILE *f = popen("python3 -c \"import zlib; d=bytes((i*7+3)%256 for i in range(100003)); "
                    "print(zlib.crc32(d), zlib.crc32(d[:13]), zlib.crc32(b'qtrain'))\"", "r");
    unsigned long z[3] = {0};
    QT_REQUIRE(f && fscanf(f, "%lu %lu %lu", &z[0], &z[1], &z[2]) == 3, "python zlib.crc32 failed");
    pclose(f);
    uint8_t *d = malloc(100003);
    for (int i = 0; i < 100003; i++) d[i] = (uint8_t)((i * 7 + 3) % 256);
    QT_EXPECT(qt_crc32(0, d, 100003) == z[0] && qt_crc32(0, d, 13) == z[1] && qt_crc32(0, "qtrain", 6) == z[2],
              "vs zlib: 0x%08x/0x%08lx 0x%08x/0x%08lx", qt_crc32(0, d, 100003), z[0], qt_crc32(0, d, 13), z[1]);
    free(d);
}

/* ---- shard format v2 ---- */

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A hand-made shard: header fields as given, checksum fnv (v1) or crc (v2) over payload. */
static size_t make_shard(uint8_t *b, uint32_t version, uint32_t flags, const uint8_t *pay, size_t plen,
                         uint64_t n_tokens) {
    memset(b, 0, 64);
    memcpy(b, "QTTOKENS", 8);
    put_le(b + 8, version, 4);
    put_le(b + 12, 2, 4);
    put_le(b + 16, n_tokens, 8);
    put_le(b + 24, 300, 4);
    put_le(b + 28, flags, 4);
    put_le(b + 32, version == 1 ? qt_fnv1a64(pay, plen, QT_FNV_INIT) : qt_crc32(0, pay, plen), 8);
    memcpy(b + 64, pay, plen);
    return 64 + plen;
}

static void test_shard_v2_mask(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[512];
    uint32_t t[5] = {7, 299, 0, 42, 1};
    uint8_t m[5] = {0, 1, 1, 0, 1};
    const char *names[2] = {"m.bin", "m.bin.zst"};
    for (int z = 0; z < 2; z++) {
        const char *p = qt_t_path(g_dir, names[z]);
        QT_REQUIRE(qt_tokens_write_masked(p, t, m, 5, 2, 300, 3, err, sizeof err) == 0, "%s", err);
        qt_tokens_data d;
        QT_REQUIRE(qt_tokens_load(p, 0, &d, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(d.h.version == 2 && d.h.flags == QT_TOKENS_FLAG_MASK && d.mask && memcmp(d.mask, m, 5) == 0,
                  "%s: v%u flags %u mask %p", p, d.h.version, d.h.flags, (const void *)d.mask);
        for (int i = 0; i < 5; i++) QT_EXPECT(qt_tokens_token(&d, i) == t[i], "%s token %d", p, i);
        qt_tokens_unload(&d);
    }
    /* the bytes: header (flags 1 at offset 28, CRC-32 of tokens then mask), tokens, mask */
    uint8_t b[64 + 15], want[64 + 15], pay[15] = {7, 0, 0x2b, 1, 0, 0, 42, 0, 1, 0, 0, 1, 1, 0, 1};
    FILE *f = fopen(qt_t_path(g_dir, "m.bin"), "rb");
    QT_REQUIRE(f && fread(b, 1, sizeof b, f) == sizeof b && fgetc(f) == EOF, "m.bin is not 64 + 5*2 + 5 bytes");
    fclose(f);
    make_shard(want, 2, 1, pay, 15, 5);
    QT_EXPECT(memcmp(b, want, sizeof b) == 0, "m.bin bytes differ from the spec");
    /* unmasked: flags 0, no mask */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "u.bin"), t, 5, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    qt_tokens_data d;
    QT_REQUIRE(qt_tokens_load(qt_t_path(g_dir, "u.bin"), 0, &d, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(d.h.version == 2 && d.h.flags == 0 && !d.mask, "unmasked v2: flags %u", d.h.flags);
    qt_tokens_unload(&d);
    /* errors: a mask byte 2 (checksum matching), unknown flags, flags in v1, a short mask, the writer */
    pay[12] = 2;
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_shard(want, 2, 1, pay, 15, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "mask byte 2 at index 2 (expected 0 or 1)");
    pay[12] = 1;
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_shard(want, 2, 3, pay, 15, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "unknown flags 0x3");
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_shard(want, 1, 1, pay, 15, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "unknown flags 0x1 in a version 1 header");
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_shard(want, 2, 1, pay, 14, 5));
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "truncated: header says 5 tokens and their mask (79 bytes), file has 78");
    pay[14] ^= 1;
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, make_shard(want, 2, 1, pay, 15, 5));
    want[64 + 14] ^= 1; /* a flipped mask byte after the checksum was taken */
    qt_t_write_file(qt_t_path(g_dir, "bad.bin"), want, 79);
    qt_t_expect_load_error(qt_t_path(g_dir, "bad.bin"), "checksum mismatch");
    m[2] = 5;
    QT_EXPECT(qt_tokens_write_masked(qt_t_path(g_dir, "w.bin"), t, m, 5, 2, 300, 0, err, sizeof err) == -1 &&
                  strstr(err, "mask byte 5 at index 2"), "writer: %s", err);
    qt_t_rmtree(g_dir);
}

/* Version 1 (FNV-1a checksum, no flags) is still read. */
static void test_shard_v1_read(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    uint8_t pay[6] = {1, 0, 0x2b, 1, 9, 0}, b[70];
    qt_t_write_file(qt_t_path(g_dir, "v1.bin"), b, make_shard(b, 1, 0, pay, 6, 3));
    char err[512];
    uint32_t *t = NULL;
    qt_tokens_header h;
    QT_REQUIRE(qt_tokens_read(qt_t_path(g_dir, "v1.bin"), &t, &h, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(h.version == 1 && h.n_tokens == 3 && t[0] == 1 && t[1] == 299 && t[2] == 9, "v1 content");
    free(t);
    b[64] ^= 1; /* its FNV checksum is checked */
    qt_t_write_file(qt_t_path(g_dir, "v1.bin"), b, 70);
    qt_t_expect_load_error(qt_t_path(g_dir, "v1.bin"), "checksum mismatch");
    qt_t_rmtree(g_dir);
}

/* ---- the loader ---- */

static void test_loader_masked_targets(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[512], glob[600];
    enum { N = 300, T = 8 };
    uint32_t t[N]; /* token i = i, so a window's input tells the target's index */
    uint8_t m[N];
    for (int i = 0; i < N; i++) t[i] = (uint32_t)i, m[i] = (uint8_t)(i % 3 != 0);
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "train_0.bin.zst"), t, m, N, 2, 300, 1, err, sizeof err) == 0, "%s", err);
    snprintf(glob, sizeof glob, "%s/train_*", g_dir);
    qt_loader *l = qt_loader_open(glob, T, 2, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    int32_t in[2 * T], tg[2 * T];
    int bad = 0, masked = 0;
    for (int b = 0; b < 40; b++) {
        QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "next: %s", err);
        for (int k = 0; k < 2 * T; k++) {
            int32_t i = in[k] + 1; /* the target's index */
            masked += tg[k] == -1;
            bad += tg[k] != (m[i] ? i : -1);
        }
    }
    QT_EXPECT(bad == 0 && masked > 0, "%d targets wrong (%d masked)", bad, masked);
    qt_loader_free(l);
    qt_t_rmtree(g_dir);
}

/* A shard truncated after the loader opened it is an error from qt_loader_next, not SIGBUS or exit;
 * and a shard loaded before it was truncated stays readable (it was mmap'ed: SIGBUS on touch). */
static void test_truncated_under_us(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[512], glob[600];
    enum { N = 200000 };
    uint32_t *t = malloc(N * sizeof *t);
    for (int i = 0; i < N; i++) t[i] = (uint32_t)(i * 2654435761u % 300);
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "train_0.bin"), t, N, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    snprintf(glob, sizeof glob, "%s/train_*", g_dir);
    qt_loader *l = qt_loader_open(glob, 16, 2, 0, 1, 5, 1, 300, err, sizeof err);
    QT_REQUIRE(l, "open: %s", err);
    QT_REQUIRE(truncate(qt_t_path(g_dir, "train_0.bin"), 64 + N) == 0, "truncate");
    int32_t in[32], tg[32];
    int rc = qt_loader_next(l, in, tg, err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, "truncated") && strstr(err, "train_0.bin"), "rc %d: %s", rc, err);
    qt_loader_free(l);
    /* loaded, then truncated to nothing: every token still reads */
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "s.bin"), t, N, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    qt_tokens_data d;
    QT_REQUIRE(qt_tokens_load(qt_t_path(g_dir, "s.bin"), 0, &d, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(truncate(qt_t_path(g_dir, "s.bin"), 0) == 0, "truncate");
    uint64_t sum = 0, want = 0;
    for (int i = 0; i < N; i++) sum += qt_tokens_token(&d, i), want += t[i];
    QT_EXPECT(sum == want, "tokens changed after truncation");
    qt_tokens_unload(&d);
    free(t);
    qt_t_rmtree(g_dir);
}

/* Opening checks every shard's header, .zst ones too (decompressed as far as the header), and a .bin's
 * size, so a bad shard anywhere in the list fails at start, not when first read mid-run. */
static void test_open_checks_every_header(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[512], glob[600];
    uint32_t t[100] = {0};
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "train_0.bin"), t, 100, 2, 300, 0, err, sizeof err) == 0, "%s", err);
    uint8_t pay[200] = {0}, b[264], z[600];
    size_t zn = ZSTD_compress(z, sizeof z, b, make_shard(b, 2, 4, pay, 200, 100), 3);
    QT_REQUIRE(!ZSTD_isError(zn), "zstd");
    qt_t_write_file(qt_t_path(g_dir, "train_1.bin.zst"), z, zn);
    snprintf(glob, sizeof glob, "%s/train_*", g_dir);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "train_1.bin.zst") &&
                  strstr(err, "unknown flags 0x4"), "zst header: %s", err);
    zn = ZSTD_compress(z, sizeof z, b, 40, 3); /* a stream that ends inside the header */
    qt_t_write_file(qt_t_path(g_dir, "train_1.bin.zst"), z, zn);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "train_1.bin.zst") &&
                  strstr(err, "fewer than the 64-byte header"), "short zst: %s", err);
    unlink(qt_t_path(g_dir, "train_1.bin.zst"));
    qt_t_write_file(qt_t_path(g_dir, "train_2.bin"), b, make_shard(b, 2, 0, pay, 200, 100) - 1);
    QT_EXPECT(!qt_loader_open(glob, 8, 1, 0, 1, 0, 1, 0, err, sizeof err) && strstr(err, "train_2.bin") &&
                  strstr(err, "truncated"), "short bin: %s", err);
    qt_t_rmtree(g_dir);
}

/* A .zst whose header claims 2^40 tokens over a 200-byte payload is refused as truncated: the reader's
 * buffer grows with the data instead of taking the header's size (it used to ask malloc for 2 TiB and
 * fail with "cannot allocate"; tests/fuzz/findings/shard-zst-header-sized-alloc). */
static void test_zst_header_claims_more(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    uint8_t pay[200] = {0}, b[264], z[600];
    size_t zn = ZSTD_compress(z, sizeof z, b, make_shard(b, 2, 0, pay, 200, (uint64_t)1 << 40), 3);
    QT_REQUIRE(!ZSTD_isError(zn), "zstd");
    qt_t_write_file(qt_t_path(g_dir, "big.bin.zst"), z, zn);
    qt_t_expect_load_error(qt_t_path(g_dir, "big.bin.zst"), "truncated: header says 1099511627776 tokens");
    qt_t_rmtree(g_dir);
}

int main(void) {
    QT_RUN(test_crc32_vectors);
    QT_RUN(test_shard_v2_mask);
    QT_RUN(test_shard_v1_read);
    QT_RUN(test_loader_masked_targets);
    QT_RUN(test_truncated_under_us);
    QT_RUN(test_open_checks_every_header);
    QT_RUN(test_zst_header_claims_more);
    return qt_test_end();
}
