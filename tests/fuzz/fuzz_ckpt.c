/* fuzz_ckpt.c — the checkpoint reader (src/io/ckpt.c: qt_ckpt_open, qt_ckpt_get) and the trainer's
 * checks of its own blobs (src/train/ckpt_state.c: qt_ckpt_state_read).
 *
 * Input: a mode byte, then the file. Mode bit 1: two more bytes (e, a) come first and the harness
 * forges the table before anything else: op (mode >> 2) & 3 on entry e % count — 0: the blob made a
 * bytes shorter, 1: the next entry's name copied onto it (a duplicate), 2: the header's step set to
 * a, 3: the blob's first payload byte set to a. Mode bit 0: the harness then recomputes the header
 * size, the header/table checksum and every in-range blob's checksum (ckpt_forge.h), so that the
 * table, blob and trainer checks behind them are reached. Every blob of an accepted file is read
 * whole; a file whose trainer blobs are accepted must hold them at their exact sizes. */
#include "ckpt_forge.h"
#include "fuzz_util.h"
#include "qt_ckpt_state.h"

static void forge_op(uint8_t *b, size_t n, int op, uint8_t e, uint8_t a) {
    uint32_t k = forge_count(b, n);
    if (!k) return;
    uint8_t *x = forge_entry(b, e % k);
    if (op == 0) {
        uint64_t bytes = forge_rd64(x + 104);
        forge_wr64(x + 104, bytes > a ? bytes - a : 0);
    } else if (op == 1) {
        memcpy(x, forge_entry(b, (e + 1) % k), FORGE_NAME);
    } else if (op == 2) {
        forge_wr64(b + 16, a);
    } else {
        uint64_t off = forge_rd64(x + 112);
        if (off < n) b[off] = a;
    }
}

/* The trainer's blobs of an accepted file hold exactly what the reader copies (model_cfg: from its base
 * bytes, a checkpoint written before qt_model_cfg grew, to the whole struct). */
static void check_state(const qt_ckpt *ck, const char *path) {
    static qt_config old;
    qt_ckpt_state s;
    char err[2048];
    if (qt_ckpt_state_read(ck, path, &s, &old, err, sizeof err)) {
        FUZZ_ASSERT(err[0] && strstr(err, path), "a refusal without the file's name: %s", err);
        return;
    }
    const char *names[4] = {"step", "rng", "loader_pos", "model_cfg"};
    size_t want[4] = {sizeof s.step, sizeof s.rng, sizeof s.pos, sizeof s.model}, nb = 0;
    for (int i = 0; i < 4; i++) {
        size_t least = i == 3 ? QT_MODEL_CFG_BASE_BYTES : want[i];
        FUZZ_ASSERT(qt_ckpt_get(ck, names[i], &nb, NULL) && nb >= least && nb <= want[i], "blob %s accepted with %zu bytes",
                    names[i], nb);
    }
    FUZZ_ASSERT(s.step == qt_ckpt_step(ck) && s.config_bytes > 0, "step %lld (header %ld), config %zu bytes",
                (long long)s.step, qt_ckpt_step(ck), s.config_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0], forged = mode & 2;
    if (forged && size < 3) return 0;
    size_t skip = forged ? 3 : 1, n = size - skip;
    uint8_t *file = malloc(n + 1);
    if (!file) return 0;
    memcpy(file, data + skip, n);
    if (forged) forge_op(file, n, (mode >> 2) & 3, data[1], data[2]);
    if (mode & 1) forge_fix(file, n);
    const char *path = fuzz_path("ckpt.qtc");
    fuzz_write(path, file, n);
    char err[512];
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    if (ck) {
        uint32_t cnt = forge_count(file, n);
        for (uint32_t i = 0; i < cnt; i++) { /* every blob named in the table, read whole; names unique */
            const char *name = (const char *)forge_entry(file, i);
            size_t bytes = 0;
            int dt = 0;
            const uint8_t *p = qt_ckpt_get(ck, name, &bytes, &dt);
            FUZZ_ASSERT(p, "blob %u (%.*s) listed but not found", i, FORGE_NAME, name);
            const uint8_t *e = forge_entry(file, i);
            FUZZ_ASSERT(bytes == forge_rd64(e + 104) && qt_ckpt_hash64(p, bytes) == forge_rd64(e + 120),
                        "blob %u: %zu bytes that differ from its table entry", i, bytes);
            for (uint32_t j = 0; j < i; j++)
                FUZZ_ASSERT(strcmp((const char *)forge_entry(file, j), name), "blobs %u and %u share a name", j, i);
        }
        check_state(ck, path);
        qt_ckpt_close(ck);
    } else {
        FUZZ_ASSERT(err[0], "an error without a message");
    }
    free(file);
    return 0;
}
