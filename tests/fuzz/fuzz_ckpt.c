/* fuzz_ckpt.c — the checkpoint reader (src/io/ckpt.c: qt_ckpt_open, qt_ckpt_get).
 *
 * Input: a mode byte, then the file. Mode bit 0: the harness first recomputes the header/table
 * checksum and every in-range blob's checksum (layout in src/io/ckpt.c: 64-byte header, 128-byte table
 * entries), so that the table and blob checks behind them are reached. Every blob of an accepted
 * file is read whole. */
#include "fuzz_util.h"
#include "qt_ckpt.h"

enum { HDR = 64, ENTRY = 128, NAME = 96 };

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void fix_checksums(uint8_t *b, size_t n) {
    if (n < HDR) return;
    uint32_t cnt;
    memcpy(&cnt, b + 12, 4);
    uint64_t size = n;
    memcpy(b + 24, &size, 8); /* the file size the header must state */
    size_t max = (n - HDR) / ENTRY, k = cnt < max ? cnt : max;
    for (size_t i = 0; i < k; i++) {
        uint8_t *e = b + HDR + i * ENTRY;
        uint64_t bytes = rd64(e + 104), off = rd64(e + 112);
        if (off <= n && bytes <= n - off) {
            uint64_t h = qt_ckpt_hash64(b + off, bytes);
            memcpy(e + 120, &h, 8);
        }
    }
    uint8_t *t = malloc(32 + k * ENTRY); /* the header's first 32 bytes, then the table */
    if (!t) abort();
    memcpy(t, b, 32);
    memcpy(t + 32, b + HDR, k * ENTRY);
    uint64_t h = qt_ckpt_hash64(t, 32 + k * ENTRY);
    memcpy(b + 32, &h, 8);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n = size - 1;
    uint8_t *file = malloc(n + 1);
    if (!file) return 0;
    memcpy(file, data + 1, n);
    if (data[0] & 1) fix_checksums(file, n);
    const char *path = fuzz_path("ckpt.qtc");
    fuzz_write(path, file, n);
    char err[512];
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    if (ck) {
        /* every blob named in the table, read whole */
        uint32_t cnt;
        memcpy(&cnt, file + 12, 4);
        for (uint32_t i = 0; i < cnt; i++) {
            const char *name = (const char *)file + HDR + (size_t)i * ENTRY;
            size_t bytes = 0;
            int dt = 0;
            const uint8_t *p = qt_ckpt_get(ck, name, &bytes, &dt);
            FUZZ_ASSERT(p, "blob %u (%.*s) listed but not found", i, NAME, name);
            uint32_t j = 0; /* qt_ckpt_get answers with the first blob of that name */
            while (strcmp((const char *)file + HDR + (size_t)j * ENTRY, name)) j++;
            const uint8_t *e = file + HDR + (size_t)j * ENTRY;
            FUZZ_ASSERT(bytes == rd64(e + 104) && qt_ckpt_hash64(p, bytes) == rd64(e + 120),
                        "blob %u: %zu bytes that differ from its table entry", j, bytes);
        }
        (void)qt_ckpt_step(ck);
        qt_ckpt_close(ck);
    } else {
        FUZZ_ASSERT(err[0], "an error without a message");
    }
    free(file);
    return 0;
}
