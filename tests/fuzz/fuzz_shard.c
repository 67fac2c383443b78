/* fuzz_shard.c — token shards (src/io/tokens.c): the header, the .bin payload and the .zst stream.
 *
 * Input: a mode byte, then the file. Mode bit 0: a .zst shard; bit 1: the harness first writes the
 * payload's FNV-1a checksum into the header (so the token checks behind it are reached); bit 2 (with
 * bit 0): the harness compresses the bytes itself (so the zstd stream is valid and the shard logic
 * behind it is reached) instead of writing them as they are. Every accepted shard's tokens are read
 * and must be < vocab_size. */
#include <zstd.h>

#include "fuzz_util.h"
#include "qt_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0];
    size_t n = size - 1;
    uint8_t *file = malloc(n + 1);
    if (!file) return 0;
    memcpy(file, data + 1, n);
    if ((mode & 2) && n >= QT_TOKENS_HEADER_BYTES) {
        uint64_t sum = qt_fnv1a64(file + QT_TOKENS_HEADER_BYTES, n - QT_TOKENS_HEADER_BYTES, QT_FNV_INIT);
        for (int i = 0; i < 8; i++) file[32 + i] = (uint8_t)(sum >> (8 * i));
    }
    const char *path = fuzz_path(mode & 1 ? "shard.bin.zst" : "shard.bin");
    if ((mode & 5) == 5) {
        size_t cap = ZSTD_compressBound(n);
        void *z = malloc(cap);
        size_t zn = z ? ZSTD_compress(z, cap, file, n, 1) : 0;
        if (!z || ZSTD_isError(zn)) abort();
        fuzz_write(path, z, zn);
        free(z);
    } else {
        fuzz_write(path, file, n);
    }
    free(file);
    char err[512];
    qt_tokens_header h;
    int hdr_ok = qt_tokens_read_header(path, &h, err, sizeof err) == 0;
    qt_tokens_data d;
    if (qt_tokens_load(path, (uint32_t)(mode >> 3) * 1000, &d, err, sizeof err) == 0) {
        FUZZ_ASSERT(hdr_ok, "load accepted what read_header refused");
        for (uint64_t i = 0; i < d.h.n_tokens; i++)
            FUZZ_ASSERT(qt_tokens_token(&d, i) < d.h.vocab_size, "token %llu out of range", (unsigned long long)i);
        for (uint64_t i = 0; i < d.h.n_docs; i++)
            FUZZ_ASSERT(qt_tokens_doc_start(&d, i) < d.h.n_tokens && (!i || qt_tokens_doc_start(&d, i) >
                                                                             qt_tokens_doc_start(&d, i - 1)),
                        "document start %llu out of order or range", (unsigned long long)i);
        qt_tokens_unload(&d);
        uint32_t *t;
        FUZZ_ASSERT(qt_tokens_read(path, &t, &h, err, sizeof err) == 0, "read refused what load accepted: %s", err);
        free(t);
    }
    return 0;
}
