/* seeds.c — writes the binary seed corpora of tests/fuzz/corpus/ (safetensors, shard, ckpt) with
 * qtrain's own writers; the text seeds (YAML, JSON) are kept as files. Run from the repository root:
 *   make fuzz-seeds   (rebuilds this program and rewrites tests/fuzz/corpus/{safetensors,shard,ckpt}) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tiny.h"
#include "qt_ckpt.h"
#include "qt_ckpt_state.h"
#include "qt_data.h"
#include "qt_hf.h"

static char err[512];

static void check(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "seeds: %s: %s\n", what, err);
        exit(1);
    }
}

/* Copies src to dst after the first np bytes of pre (the shard and ckpt harnesses read a mode byte,
 * the ckpt harness's forging mode two more). */
static void with_prefix(const char *src, const char *dst, const unsigned char *pre, int np) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) { fprintf(stderr, "seeds: %s -> %s\n", src, dst); exit(1); }
    for (int i = 0; i < np; i++) fputc(pre[i], out);
    int ch;
    while ((ch = fgetc(in)) != EOF) fputc(ch, out);
    fclose(in);
    fclose(out);
}

/* with_prefix with one mode byte when mode >= 0. */
static void with_mode(const char *src, const char *dst, int mode) {
    unsigned char m = (unsigned char)mode;
    with_prefix(src, dst, &m, mode >= 0);
}

/* A training checkpoint (the trainer's blobs of qt_ckpt_state.h beside a weights blob) as seeds: as
 * written, and with the harness forging a short step blob, a duplicate name and another header step. */
static void trainer_seeds(const char *root, const char *tmp, const float *w) {
    static const char yaml[] = "seed: 7\ndata: {seq_len: 16, micro_batch: 2, grad_accum: 1}\n";
    qt_ckpt_state cs = {3, {{1, 2, 3, 4}}, {0, 0, 5}, fuzz_tiny_cfg(), yaml, sizeof yaml - 1};
    qt_ckpt_item items[8] = {{"weights", 0, w, 16 * sizeof(float), 0}};
    int n = 1 + qt_ckpt_state_items(&cs, items + 1);
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/ckt", tmp);
    check(qt_ckpt_save(p, 3, 0, items, n, err, sizeof err), "trainer ckpt");
    snprintf(p, sizeof p, "%s/ckt/ckpt_00000003.qtc", tmp);
    static const struct { const char *name; unsigned char pre[3]; int np; } v[] = {
        {"trainer", {1}, 1},                  /* as written (checksums already right) */
        {"trainer_short_step", {3, 1, 7}, 3}, /* op 0 on entry 1 (step): 7 bytes shorter */
        {"trainer_dup_name", {7, 1, 0}, 3},   /* op 1: entry 1 takes entry 2's name */
        {"trainer_header_step", {11, 0, 9}, 3}, /* op 2: the header says step 9 */
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        snprintf(q, sizeof q, "%s/ckpt/%s", root, v[i].name);
        with_prefix(p, q, v[i].pre, v[i].np);
    }
}

int main(void) {
    const char *root = "tests/fuzz/corpus", *tmp = "build/fuzz/seedtmp";
    char p[512], q[512];
    qt_model_cfg c = fuzz_tiny_cfg();
    qt_layout L;
    check(qt_layout_init(&L, &c, err, sizeof err), "layout");
    float *w = malloc(L.numel * sizeof *w);
    qt_layout_init_weights(&L, w, 1, 0.5f);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        snprintf(p, sizeof p, "%s/st%d", tmp, bf16);
        check(qt_hf_export(p, &L, w, bf16, err, sizeof err), "export");
        snprintf(q, sizeof q, "%s/model.safetensors", p);
        snprintf(p, sizeof p, "%s/safetensors/tiny_%s.safetensors", root, bf16 ? "bf16" : "f32");
        with_mode(q, p, -1);
    }
    uint32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (uint32_t)(i * 7 % 50);
    const char *names[] = {"a.bin", "a.bin.zst"};
    for (int z = 0; z < 2; z++) {
        snprintf(p, sizeof p, "%s/%s", tmp, names[z]);
        check(qt_tokens_write(p, tok, 40, 2, 50, 3, err, sizeof err), "shard");
        snprintf(q, sizeof q, "%s/shard/%s", root, z ? "zst_raw" : "bin");
        with_mode(p, q, z ? 1 : 0);
    }
    snprintf(p, sizeof p, "%s/a.bin", tmp);
    snprintf(q, sizeof q, "%s/shard/zst_by_harness", root);
    with_mode(p, q, 5 | 2);
    uint8_t mask[40];
    uint64_t docs[4] = {0, 9, 10, 31};
    for (int i = 0; i < 40; i++) mask[i] = (uint8_t)(i % 3 != 0);
    snprintf(p, sizeof p, "%s/v3.bin", tmp);
    check(qt_tokens_write_docs(p, tok, mask, 40, docs, 4, 2, 50, 3, err, sizeof err), "v3 shard");
    snprintf(q, sizeof q, "%s/shard/v3_docs", root);
    with_mode(p, q, 0);
    qt_ckpt_item items[3] = {{"weights", 0, w, 64 * sizeof(float), 0}, {"step", -1, "\x05\0\0\0\0\0\0\0", 8, 0},
                             {"config", -1, "seed: 1\n", 8, 0}};
    snprintf(p, sizeof p, "%s/ck", tmp);
    check(qt_ckpt_save(p, 5, 0, items, 3, err, sizeof err), "ckpt");
    snprintf(p, sizeof p, "%s/ck/ckpt_00000005.qtc", tmp);
    snprintf(q, sizeof q, "%s/ckpt/three_blobs", root);
    with_mode(p, q, 0);
    snprintf(q, sizeof q, "%s/ckpt/three_blobs_fixed", root);
    with_mode(p, q, 1);
    trainer_seeds(root, tmp, w);
    free(w);
    qt_layout_free(&L);
    return 0;
}
