/* test_sft.c — supervised fine-tuning end to end: the per-target loss scale (bit-identical to the
 * old per-micro-batch one without masks), masked losses and exactly-zero gradients, grad
 * accumulation 1x4 = 4x1 with masks, the eval loss as a mean over unmasked targets, a chat SFT run
 * on tinyshakespeare whose assistant-token eval loss falls, the tokenizer files in the export, and
 * (GPU) bf16/fp8 masked losses and gradients against the CPU reference and data parallel against one
 * GPU. The shard format itself is tested in test_shard_v2.c. */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qt_config.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_hf.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_test_plan.h"
#include "qt_train.h"

static char g_dir[256];

static int load_cfg(qt_config *c, const char *yaml) {
    char err[1024];
    int rc = qt_config_load_string(c, yaml, "test_sft.yaml", NULL, 0, err, sizeof err);
    if (rc) printf("  config: %s\n", err);
    return rc;
}

/* ---- the loss normalization ---- */

/* Without masks qt_loss_scale equals, bit for bit, the per-target weight the engines used before:
 * (1/grad_accum)/count on one GPU (count = micro_batch*seq_len), ((1/grad_accum)/ranks)/count in data
 * parallel. With masks it is 1/valid within a few float roundings. */
static void test_loss_scale_bitwise(void) {
    long counts[] = {1, 3, 7, 24, 64, 100, 129, 1000, 4095, 4096, 12288, 65535, 100003, 1 << 20, 3 << 20};
    int bad = 0, checked = 0;
    for (int ga = 1; ga <= 33; ga++)
        for (int ranks = 1; ranks <= 8; ranks++)
            for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
                long n = counts[k];
                float grad_scale = 1.0f / ga;                             /* train.c, before */
                float old = ranks == 1 ? grad_scale / n                    /* engine_cpu/gpu, before */
                                       : grad_scale / ranks / n;           /* engine_dp, then gpu, before */
                float now = qt_loss_scale(ga, ranks, (long)ga * ranks * n);
                bad += memcmp(&old, &now, 4) != 0;
                checked++;
                double exact = 1.0 / ((double)ga * ranks * n);
                float masked = qt_loss_scale(ga, ranks, (long)ga * ranks * n - 1 - k);
                double exact_m = 1.0 / ((double)ga * ranks * n - 1 - k);
                if ((long)ga * ranks * n - 1 - (long)k > 0) bad += fabs(masked - exact_m) > 4 * 6e-8 * exact_m;
                (void)exact;
            }
    QT_EXPECT(bad == 0, "%d of %d scales differ from the old values or from 1/valid", bad, checked);
    QT_EXPECT(qt_loss_scale(4, 2, 0) == 0.0f, "no targets: scale 0");
}

/* A model every device can run: head_dim 64 (cuDNN), dimensions multiples of 16 (cuBLASLt fp8). */
static int engine_cfg(qt_config *c, const char *device, int mb, int ga, const char *matmul) {
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 256, hidden_size: 128, num_layers: 2, num_heads: 2, num_kv_heads: 1,\n"
             "        intermediate_size: 384, max_seq_len: 128, qkv_bias: true, tie_embeddings: false}\n"
             "data: {train: 'none_*.bin', seq_len: 64, micro_batch: %d, grad_accum: %d}\n"
             "precision: {matmul_dtype: %s, persistent_quants: true}\n"
             "init: {seed: 7, std: 0.05}\ndevice: %s\n",
             mb, ga, matmul, device);
    return load_cfg(c, yaml);
}

enum { B = 4, T = 64, TAIL = 8, TAIL_TOK = 200 };

/* 4 sequences: tokens of the last TAIL positions from [TAIL_TOK, 256) and nowhere else, their
 * targets masked; about a third of the other targets masked too, sequence 3 entirely. */
static long masked_batch(int32_t *in, int32_t *tgt, int32_t *full) {
    qt_rng r;
    qt_rng_seed(&r, 11);
    long valid = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int i = b * T + t, tail = t >= T - TAIL;
            in[i] = (int32_t)(tail ? TAIL_TOK + qt_rng_below(&r, 256 - TAIL_TOK) : qt_rng_below(&r, TAIL_TOK));
            full[i] = (int32_t)qt_rng_below(&r, 256);
            tgt[i] = tail || b == 3 || qt_rng_below(&r, 3) == 0 ? -1 : full[i];
            valid += tgt[i] >= 0;
        }
    return valid;
}

/* The mean cross-entropy over the targets >= 0, in double, from the logits. */
static double ref_loss(const float *logits, const int32_t *tgt, long n, int V) {
    double s = 0;
    long c = 0;
    for (long i = 0; i < n; i++) {
        if (tgt[i] < 0) continue;
        const float *l = logits + i * V;
        double mx = l[0], z = 0;
        for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < V; v++) z += exp((double)l[v] - mx);
        s += mx + log(z) - l[tgt[i]];
        c++;
    }
    return c ? s / c : 0;
}

/* The masked loss is the mean over the unmasked targets; masked positions give exactly zero
 * gradient: the embedding rows of tokens seen only at masked tail positions stay 0.0f, and changing
 * those tokens changes no gradient bit. */
static void test_masked_loss_and_zero_grads(void) {
    qt_config c;
    QT_REQUIRE(engine_cfg(&c, "cpu", B, 1, "bf16") == 0, "config");
    qt_layout L;
    float *w;
    char err[1024];
    QT_REQUIRE(qt_model_setup(&c, &L, &w, err, sizeof err) == 0, "%s", err);
    qt_engine *e = qt_t_cpu_engine(&L, &c, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    int32_t in[B * T], tgt[B * T], full[B * T];
    long valid = masked_batch(in, tgt, full);
    float *logits = malloc((size_t)B * T * 256 * sizeof *logits), *g = malloc(L.numel * sizeof *g);
    float *g2 = malloc(L.numel * sizeof *g2);
    e->ops->forward_logits(e, in, logits);
    double ref = ref_loss(logits, tgt, B * T, 256), ref_full = ref_loss(logits, full, B * T, 256);
    float l = e->ops->eval_loss(e, in, tgt);
    printf("  masked loss %.7f (reference %.7f; unmasked %.7f; %ld of %d targets)\n", l, ref, ref_full, valid, B * T);
    QT_EXPECT(fabs(l - ref) <= 2e-6 * ref, "masked loss %.8g, reference %.8g", l, ref);
    QT_EXPECT(fabs(ref - ref_full) > 1e-3, "the mask changed nothing");
    e->ops->micro_step(e, in, tgt, qt_loss_scale(1, 1, valid));
    e->ops->get_grads(e, g);
    long nz = 0, any = 0;
    for (int v = 0; v < 256; v++)
        for (int k = 0; k < 128; k++) {
            float x = g[L.embed + (size_t)v * 128 + k];
            if (v >= TAIL_TOK) nz += x != 0.0f;
            else any += x != 0.0f;
        }
    QT_EXPECT(nz == 0 && any > 0, "%ld embedding gradients of tail-only tokens are nonzero (%ld elsewhere)", nz, any);
    float lo, gn;
    e->ops->opt_step(e, 0.0f, 1, &lo, &gn); /* zeroes the gradients */
    for (int b = 0; b < B; b++)
        for (int t = T - TAIL; t < T; t++) in[b * T + t] = TAIL_TOK + (in[b * T + t] - TAIL_TOK + 17) % (256 - TAIL_TOK);
    e->ops->micro_step(e, in, tgt, qt_loss_scale(1, 1, valid));
    e->ops->get_grads(e, g2);
    QT_EXPECT(memcmp(g, g2, L.numel * sizeof *g) == 0, "masked tail tokens changed the gradient");
    e->ops->free(e);
    free(logits), free(g), free(g2), free(w);
    qt_layout_free(&L);
}

/* Grad accumulation with masks: 4 micro-batches of 1 sequence give the gradient of 1 micro-batch of
 * 4 (the sequences hold 0..64 targets each). The two differ only in fp32 summation order (the
 * matmul backward sums 4T rows at once vs 4 sums of T rows), so the bound is a few ulps of the
 * largest terms: rel L2 1e-5. The old normalization (each micro-batch's own mean / grad_accum) is
 * off by far more, which the test checks too, so it would catch a return to it. */
static void test_accum_1x4_vs_4x1(void) {
    qt_config c1, c4;
    QT_REQUIRE(engine_cfg(&c4, "cpu", B, 1, "bf16") == 0 && engine_cfg(&c1, "cpu", 1, B, "bf16") == 0, "config");
    qt_layout L;
    float *w;
    char err[1024];
    QT_REQUIRE(qt_model_setup(&c4, &L, &w, err, sizeof err) == 0, "%s", err);
    qt_engine *e4 = qt_t_cpu_engine(&L, &c4, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err), *e1 = qt_t_cpu_engine(&L, &c1, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    qt_engine *eo = qt_t_cpu_engine(&L, &c1, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    int32_t in[B * T], tgt[B * T], full[B * T];
    long valid = masked_batch(in, tgt, full);
    tgt[2 * T + 5] = full[2 * T + 5]; /* sequences with different counts, one with none */
    valid++;
    e4->ops->micro_step(e4, in, tgt, qt_loss_scale(1, 1, valid));
    for (int a = 0; a < B; a++) {
        long v = 0;
        for (int t = 0; t < T; t++) v += tgt[a * T + t] >= 0;
        e1->ops->micro_step(e1, in + a * T, tgt + a * T, qt_loss_scale(B, 1, valid));
        eo->ops->micro_step(eo, in + a * T, tgt + a * T, v ? 1.0f / B / v : 0.0f); /* the old way */
    }
    float *g4 = malloc(L.numel * 4), *g1 = malloc(L.numel * 4), *go = malloc(L.numel * 4);
    e4->ops->get_grads(e4, g4);
    e1->ops->get_grads(e1, g1);
    eo->ops->get_grads(eo, go);
    double amax = 0;
    for (size_t i = 0; i < L.numel; i++) amax = fmax(amax, fabs(g4[i]));
    QT_EXPECT(qt_t_close("4x1 vs 1x4", g1, g4, (long)L.numel, 1e-5 * amax, 1e-5), "accumulation differs");
    double num = 0, den = 0;
    for (size_t i = 0; i < L.numel; i++) num += (go[i] - g4[i]) * (double)(go[i] - g4[i]), den += (double)g4[i] * g4[i];
    printf("  rel L2: 4x1 vs 1x4 within bound; per-micro-batch normalization %.3g off\n", sqrt(num / den));
    QT_EXPECT(sqrt(num / den) > 1e-2, "the old normalization agrees too: the test cannot tell them apart");
    float l4, l1, gn;
    e4->ops->opt_step(e4, 0.0f, 1, &l4, &gn);
    e1->ops->opt_step(e1, 0.0f, 1, &l1, &gn);
    QT_EXPECT(fabs(l4 - l1) <= 1e-6 * l4, "step loss 1x4 %.8g vs 4x1 %.8g", l4, l1);
    e4->ops->free(e4), e1->ops->free(e1), eo->ops->free(eo);
    free(g4), free(g1), free(go), free(w);
    qt_layout_free(&L);
}

/* The eval loss is the mean over every unmasked target of the eval batches, not the mean of the
 * batches' means: batches here hold very different target counts. lr 1e-30 leaves the weights
 * bit-identical after the one step, so the reference is the initial model's per-batch losses. */
static void test_eval_token_mean(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    enum { N = 2000 };
    uint32_t t[N];
    uint8_t m[N];
    qt_rng r;
    qt_rng_seed(&r, 21);
    for (int i = 0; i < N; i++) t[i] = (uint32_t)qt_rng_below(&r, 256), m[i] = (i / 64) % 3 ? i % 9 == 0 : 1;
    char err[1024], yaml[2000];
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "ev_0.bin"), t, m, N, 2, 256, 0, err, sizeof err) == 0, "%s", err);
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 256, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1,"
             " intermediate_size: 48, max_seq_len: 64}\n"
             "data: {train: '%s/ev_*.bin', eval: '%s/ev_*.bin', seq_len: 64, micro_batch: 2}\n"
             "optim: {lr: 1e-30, steps: 1}\neval: {every: 1, batches: 5}\ncheckpoint: {dir: '%s/ck'}\n"
             "device: cpu\n",
             g_dir, g_dir, g_dir);
    qt_config c;
    qt_train_stats st;
    QT_REQUIRE(qt_t_train_yaml(&c, yaml, &st, err, sizeof err) == 0, "%s", err);
    qt_layout L;
    float *w;
    QT_REQUIRE(qt_model_setup(&c, &L, &w, err, sizeof err) == 0, "%s", err);
    qt_engine *e = qt_t_cpu_engine(&L, &c, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    qt_loader *l = qt_loader_open(c.data.eval, 64, 2, 0, 1, c.seed, 0, 256, err, sizeof err);
    QT_REQUIRE(l, "%s", err);
    double tok = 0, means = 0;
    long valid = 0;
    for (int b = 0; b < 5; b++) {
        int32_t in[128], tg[128];
        QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
        long v = 0;
        for (int i = 0; i < 128; i++) v += tg[i] >= 0;
        float lb = e->ops->eval_loss(e, in, tg);
        tok += (double)lb * v, means += lb, valid += v;
    }
    double ref = tok / valid;
    printf("  eval loss %.6f, token mean %.6f, mean of batch means %.6f\n", st.last_eval, ref, means / 5);
    QT_EXPECT(fabs(st.last_eval - ref) <= 1e-6 * ref, "eval %.8g vs token mean %.8g", st.last_eval, ref);
    QT_EXPECT(fabs(ref - means / 5) > 1e-3, "the batches' counts do not matter here: the test cannot fail");
    qt_loader_free(l);
    e->ops->free(e);
    free(w);
    qt_layout_free(&L);
    qt_t_rmtree(g_dir);
}

/* A step and an eval whose batches hold no unmasked target: the log says so, not "loss 0.0000" or
 * "ppl 1.00", and the records carry "loss": null. Two windows of 16: the first all masked, the second
 * all trained; micro_batch 1, so one of the two steps has no target; eval reads the first window. */
static void test_no_targets_logged(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    enum { N = 33 };
    uint32_t t[N];
    uint8_t m[N];
    for (int i = 0; i < N; i++) t[i] = (uint32_t)(i * 7 % 64), m[i] = i > 16;
    char err[1024], yaml[2000], out[600];
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "nt_0.bin"), t, m, N, 2, 64, 0, err, sizeof err) == 0, "%s", err);
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 64, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1,"
             " intermediate_size: 48, max_seq_len: 16}\n"
             "data: {train: '%s/nt_*.bin', eval: '%s/nt_*.bin', seq_len: 16, micro_batch: 1}\n"
             "optim: {lr: 0.001, steps: 2}\neval: {every: 2, batches: 1}\nlog: {every: 1, file: '%s/log.jsonl'}\n"
             "checkpoint: {dir: '%s/ck', every: 0}\ndevice: cpu\n",
             g_dir, g_dir, g_dir, g_dir);
    qt_config c;
    QT_REQUIRE(load_cfg(&c, yaml) == 0, "config");
    snprintf(out, sizeof out, "%s/stdout.txt", g_dir);
    fflush(stdout);
    int keep = dup(1), fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    QT_REQUIRE(keep >= 0 && fd >= 0, "cannot redirect stdout");
    dup2(fd, 1);
    close(fd);
    int rc = qt_train_run(&c, NULL, NULL, err, sizeof err);
    fflush(stdout);
    dup2(keep, 1);
    close(keep);
    QT_REQUIRE(rc == 0, "run: %s", err);
    size_t n;
    char *text = qt_t_read_file(out, &n), *log = qt_t_read_file(qt_t_path(g_dir, "log.jsonl"), &n);
    QT_REQUIRE(text && log, "no stdout or log.jsonl");
    int steps = 0, evals = 0;
    for (char *p = text; (p = strstr(p, "no unmasked targets")); p++) {
        char *line = p;
        while (line > text && line[-1] != '\n') line--;
        steps += !strncmp(line, "step ", 5), evals += !strncmp(line, "eval ", 5);
    }
    QT_EXPECT(steps == 1 && evals == 1, "%d step and %d eval lines say \"no unmasked targets\":\n%s", steps, evals, text);
    QT_EXPECT(!strstr(text, "loss 0.0000") && !strstr(text, "ppl 1.00"), "a loss of 0 logged:\n%s", text);
    QT_EXPECT(strstr(log, "\"loss\":null") && strstr(log, "\"type\":\"eval\""), "log.jsonl:\n%s", log);
    free(text), free(log);
    qt_t_rmtree(g_dir);
}

/* ---- chat SFT on tinyshakespeare ---- */

/* Conversations made of consecutive non-empty lines: "U: <line>\nA: <next line>\n"; the mask keeps
 * the assistant's line and its newline. Byte-level tokens. Returns the token count (0: no text). */
static size_t make_chats(uint32_t **tok, uint8_t **mask) {
    size_t n;
    char path[512];
    const char *src = getenv("QT_DATA_DIR");
    snprintf(path, sizeof path, "%s/tinyshakespeare.txt", src ? src : "../shared/data");
    char *text = qt_t_read_file(path, &n);
    if (!text) return 0;
    uint32_t *t = malloc((2 * n + 16) * sizeof *t);
    uint8_t *m = malloc(2 * n + 16);
    size_t k = 0, nl = 0;
    const char *lines[2];
    size_t lens[2];
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && text[j] != '\n') j++;
        if (j > i) {
            lines[nl] = text + i, lens[nl] = j - i, nl++;
            if (nl == 2) {
                for (int r = 0; r < 2; r++) {
                    const char *tag = r ? "A: " : "U: ";
                    for (int q = 0; q < 3; q++) t[k] = (uint8_t)tag[q], m[k++] = 0;
                    for (size_t q = 0; q <= lens[r]; q++)
                        t[k] = q < lens[r] ? (uint8_t)lines[r][q] : '\n', m[k++] = (uint8_t)r;
                }
                nl = 0;
            }
        }
        i = j + 1;
    }
    free(text);
    *tok = t, *mask = m;
    return k;
}

/* The same shard written by an independent Python writer of the spec (struct + zlib.crc32). */
static int python_writes_same(const uint32_t *t, const uint8_t *m, size_t n, const char *c_path) {
    if (system("python3 -c 'import zlib' >/dev/null 2>&1") != 0) return -1;
    const char *raw = qt_t_path(g_dir, "raw.u32"), *py = qt_t_path(g_dir, "py.bin");
    FILE *f = fopen(raw, "wb");
    for (size_t i = 0; i < n; i++) fputc((int)t[i], f), fputc(m[i], f);
    fclose(f);
    char cmd[2000];
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import struct, zlib, sys\n"
             "r = open('%s', 'rb').read(); t = r[0::2]; m = r[1::2]; n = len(t)\n"
             "pay = struct.pack('<%%dH' %% n, *t) + m\n"
             "h = b'QTTOKENS' + struct.pack('<IIQIIQ', 2, 2, n, 256, 1, zlib.crc32(pay)) + bytes(24)\n"
             "open('%s', 'wb').write(h + pay)\"",
             raw, py);
    if (system(cmd) != 0) return 0;
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", py, c_path);
    return system(cmd) == 0;
}

static void test_sft_run(void) {
    uint32_t *t;
    uint8_t *m;
    size_t n = make_chats(&t, &m);
    if (!n) QT_SKIP("no ../shared/data/tinyshakespeare.txt (set QT_DATA_DIR)");
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[1024], yaml[3000];
    size_t ne = n / 20, kept = 0;
    for (size_t i = 0; i < n; i++) kept += m[i];
    printf("  %zu chat tokens, %.1f%% assistant (learned)\n", n, 100.0 * kept / n);
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "sft_train_0.bin"), t, m, n - ne, 2, 256, 0, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_tokens_write_masked(qt_t_path(g_dir, "sft_eval_0.bin"), t + n - ne, m + n - ne, ne, 2, 256, 0, err, sizeof err) == 0,
               "%s", err);
    int same = python_writes_same(t + n - ne, m + n - ne, ne, qt_t_path(g_dir, "sft_eval_0.bin"));
    if (same < 0) printf("  no python3: the Python writer cross-check is skipped\n");
    else QT_EXPECT(same == 1, "the Python writer of the spec wrote different bytes");
    /* grad accumulation through the training loop: 1x4 and 4x1 (same windows) log the same losses */
    const char *fmt = "model: {vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 2, num_kv_heads: 1,\n"
                      "        intermediate_size: 192, max_seq_len: 64, qkv_bias: true, tie_embeddings: true}\n"
                      "data: {train: '%s/sft_train_*.bin', eval: '%s/sft_eval_*.bin', seq_len: 64, micro_batch: %d,"
                      " grad_accum: %d}\n"
                      "optim: {lr: 0.004, warmup: 2, steps: %d, grad_clip: 1.0}\n"
                      "eval: {every: 10, batches: 4}\ncheckpoint: {dir: '%s/ckpt_%d', every: 0}\n"
                      "log: {every: 10}\ndevice: cpu\nseed: 5\n";
    float la[3], lb[3];
    qt_config ca, cb;
    qt_train_stats st;
    snprintf(yaml, sizeof yaml, fmt, g_dir, g_dir, 4, 1, 3, g_dir, 1);
    QT_REQUIRE(load_cfg(&ca, yaml) == 0, "config");
    snprintf(yaml, sizeof yaml, fmt, g_dir, g_dir, 1, 4, 3, g_dir, 2);
    QT_REQUIRE(load_cfg(&cb, yaml) == 0, "config");
    qt_train_opts oa = {NULL, -1, 0, la, NULL, NULL}, ob = {NULL, -1, 0, lb, NULL, NULL};
    QT_REQUIRE(qt_train_run(&ca, &oa, &st, err, sizeof err) == 0, "1x4: %s", err);
    QT_REQUIRE(qt_train_run(&cb, &ob, &st, err, sizeof err) == 0, "4x1: %s", err);
    for (int i = 0; i < 3; i++)
        QT_EXPECT(fabs(la[i] - lb[i]) <= 2e-5 * la[i], "step %d: 1x4 loss %.8g, 4x1 %.8g", i + 1, la[i], lb[i]);
    /* SFT: the assistant-token eval loss falls */
    snprintf(yaml, sizeof yaml, fmt, g_dir, g_dir, 4, 1, 30, g_dir, 3);
    QT_REQUIRE(load_cfg(&ca, yaml) == 0, "config");
    ca.eval.every = 3;
    QT_REQUIRE(qt_train_run(&ca, NULL, &st, err, sizeof err) == 0, "sft: %s", err);
    printf("  assistant-token eval loss %.4f (step 3) -> %.4f (step 30)\n", st.first_eval, st.last_eval);
    QT_EXPECT(st.last_eval < st.first_eval - 1.0 && st.last_eval < 4.0, "eval loss %.4f -> %.4f", st.first_eval,
              st.last_eval);
    free(t), free(m);
    qt_t_rmtree(g_dir);
}

/* ---- tokenizer files in the export ---- */

static void test_export_tokenizer(void) {
    QT_REQUIRE(qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_sft"), "mkdtemp");
    char err[1024], src[600], out[600], p[700];
    snprintf(src, sizeof src, "%s/tok", g_dir);
    snprintf(out, sizeof out, "%s/export", g_dir);
    mkdir(src, 0755);
    const char *files[4] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                            "generation_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", src, files[i]);
        char body[100];
        snprintf(body, sizeof body, "{\"file\": %d}\n", i);
        qt_t_write_file(p, body, strlen(body));
    }
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    qt_t_write_file(p, "x", 1);
    /* through a whole export-only run with data.tokenizer */
    uint32_t tok[100] = {0};
    QT_REQUIRE(qt_tokens_write(qt_t_path(g_dir, "train_0.bin"), tok, 100, 2, 64, 0, err, sizeof err) == 0, "%s", err);
    char yaml[2000];
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 64, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1,"
             " intermediate_size: 48, max_seq_len: 16}\n"
             "data: {train: '%s/train_*.bin', seq_len: 8, micro_batch: 1, tokenizer: '%s'}\n"
             "export: {dir: '%s'}\ncheckpoint: {dir: '%s/ck'}\ndevice: cpu\n",
             g_dir, src, out, g_dir);
    qt_config c;
    QT_REQUIRE(load_cfg(&c, yaml) == 0, "config");
    qt_train_opts o = {NULL, -1, 1, NULL, NULL, NULL};
    QT_REQUIRE(qt_train_run(&c, &o, NULL, err, sizeof err) == 0, "export: %s", err);
    for (int i = 0; i < 4; i++) {
        size_t n;
        snprintf(p, sizeof p, "%s/%s", out, files[i]);
        char *got = qt_t_read_file(p, &n), want[100];
        snprintf(want, sizeof want, "{\"file\": %d}\n", i);
        QT_EXPECT(got && n == strlen(want) && !memcmp(got, want, n), "%s missing or different", p);
        free(got);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    struct stat st;
    QT_EXPECT(stat(p, &st) == 0 && st.st_size > 1, "the model was not exported");
    /* from init.from's folder (here: a path to its model file) when data.tokenizer is unset */
    char out2[700];
    snprintf(out2, sizeof out2, "%s/export2", g_dir);
    mkdir(out2, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    QT_EXPECT(qt_hf_export_tokenizer(out2, p, 0, err, sizeof err) == 4, "from a file's folder: %s", err);
    /* a data.tokenizer folder without a tokenizer is refused before training */
    snprintf(p, sizeof p, "%s/empty", g_dir);
    mkdir(p, 0755);
    QT_EXPECT(qt_hf_export_tokenizer(out2, p, 0, err, sizeof err) == 0, "optional and absent: 0 files");
    snprintf(c.data.tokenizer, sizeof c.data.tokenizer, "%s", p);
    int rc = qt_train_run(&c, &o, NULL, err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, "data.tokenizer") && strstr(err, "empty"), "rc %d: %s", rc, err);
    qt_t_rmtree(g_dir);
}

/* ---- GPU: bf16 and fp8 masked losses and gradients against the CPU reference ---- */

static double cosine(const float *a, const float *b, size_t n, double *rel) {
    double ab = 0, aa = 0, bb = 0, dd = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
        dd += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    }
    *rel = aa > 0 ? sqrt(dd / aa) : sqrt(dd);
    return aa == 0 && bb == 0 ? 1.0 : ab / (sqrt(aa) * sqrt(bb) + 1e-300);
}

static void gpu_case(const char *matmul, double loss_rel, double min_cos) {
    qt_config cc, cg;
    QT_REQUIRE(engine_cfg(&cc, "cpu", B, 1, "bf16") == 0 && engine_cfg(&cg, "cuda", B, 1, matmul) == 0, "config");
    qt_layout L;
    float *w;
    char err[1024];
    QT_REQUIRE(qt_model_setup(&cc, &L, &w, err, sizeof err) == 0, "%s", err);
    qt_engine *ec = qt_t_cpu_engine(&L, &cc, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err), *eg = qt_t_gpu_engine(&L, &cg, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    QT_REQUIRE(eg, "gpu engine: %s", err);
    int32_t in[B * T], tgt[B * T], full[B * T];
    long valid = masked_batch(in, tgt, full);
    float lc = ec->ops->eval_loss(ec, in, tgt), lg = eg->ops->eval_loss(eg, in, tgt);
    float lcf = ec->ops->eval_loss(ec, in, full);
    ec->ops->micro_step(ec, in, tgt, qt_loss_scale(1, 1, valid));
    eg->ops->micro_step(eg, in, tgt, qt_loss_scale(1, 1, valid));
    float *gc = malloc(L.numel * 4), *gg = malloc(L.numel * 4);
    ec->ops->get_grads(ec, gc);
    eg->ops->get_grads(eg, gg);
    printf("  %s: masked loss gpu %.6f cpu %.6f (unmasked cpu %.6f)\n", matmul, lg, lc, lcf);
    QT_EXPECT(fabs(lg - lc) <= loss_rel * lc, "%s: loss gpu %.6f vs cpu %.6f", matmul, lg, lc);
    double worst = 2;
    const char *wn = "";
    for (int i = 0; i < L.n_tensors; i++) {
        const qt_tensor *t = &L.tensors[i];
        double rel, c = cosine(gc + t->offset, gg + t->offset, t->numel, &rel);
        if (c < worst) worst = c, wn = t->name;
        QT_EXPECT(c >= min_cos, "%s: %s gradient cosine %.5f < %.3f (rel L2 %.4f)", matmul, t->name, c, min_cos, rel);
    }
    long nz = 0;
    for (size_t k = (size_t)TAIL_TOK * 128; k < 256 * 128; k++) nz += gg[L.embed + k] != 0.0f;
    QT_EXPECT(nz == 0, "%s: %ld embedding gradients of masked-only tokens are nonzero", matmul, nz);
    printf("  %s: worst gradient cosine %.5f (%s); masked-only embedding rows exactly 0\n", matmul, worst, wn);
    ec->ops->free(ec), eg->ops->free(eg);
    free(gc), free(gg), free(w);
    qt_layout_free(&L);
}

static void test_gpu_masked_vs_cpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    gpu_case("bf16", 5e-3, 0.999);
    struct cudaDeviceProp p;
    int cc = cudaGetDeviceProperties(&p, 0) == cudaSuccess ? p.major * 10 + p.minor : 0;
    if (cc < 89) {
        printf("  device cc %d has no fp8 tensor cores: fp8 case skipped\n", cc);
        return;
    }
    /* e4m3 activations and gradients: unmasked the worst tensor of test_fp8_model lands at 0.991-0.994;
     * here 107 of 256 targets count, and layer 1's q_proj gradient measured 0.984 on an H100 */
    gpu_case("e4m3", 2e-2, 0.98);
}

/* Data parallel with masks: 2 ranks (on device 0 twice) of 2 sequences each take one step whose loss
 * and gradient norm equal one GPU's step on all 4 (rank 1 holds far fewer targets than rank 0, so
 * the old per-rank mean normalization moves the norm by several percent, far past the 1e-3 bound of
 * the summation-order difference). */
static void test_gpu_dp_masked(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    qt_config c1, c2;
    QT_REQUIRE(engine_cfg(&c1, "cuda", B, 1, "bf16") == 0 && engine_cfg(&c2, "cuda", B / 2, 1, "bf16") == 0, "config");
    qt_layout L;
    float *w;
    char err[1024];
    QT_REQUIRE(qt_model_setup(&c1, &L, &w, err, sizeof err) == 0, "%s", err);
    int devs[2] = {0, 0};
    qt_engine *e1 = qt_t_gpu_engine(&L, &c1, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    QT_REQUIRE(e1, "one GPU: %s", err);
    qt_engine *e2 = qt_t_dp_engine(&L, &c2, (qt_weight_src[]){qt_weight_src_array(&L, w)}, 2, devs, err, sizeof err);
    QT_REQUIRE(e2, "2 ranks: %s", err);
    int32_t in[B * T], tgt[B * T], full[B * T];
    long valid = masked_batch(in, tgt, full), v0 = 0;
    for (int i = 0; i < 2 * T; i++) v0 += tgt[i] >= 0;
    e1->ops->micro_step(e1, in, tgt, qt_loss_scale(1, 1, valid));
    e2->ops->micro_step(e2, in, tgt, qt_loss_scale(1, 2, valid));
    float l1, l2, g1, g2;
    e1->ops->opt_step(e1, 0.0f, 1, &l1, &g1);
    e2->ops->opt_step(e2, 0.0f, 1, &l2, &g2);
    printf("  targets: rank 0 %ld, rank 1 %ld; loss 1 GPU %.7f, 2 ranks %.7f; grad norm %.6f vs %.6f\n", v0,
           valid - v0, l1, l2, g1, g2);
    QT_EXPECT(fabs(l1 - l2) <= 1e-5 * l1, "loss: one GPU %.8g, 2 ranks %.8g", l1, l2);
    QT_EXPECT(fabs(g1 - g2) <= 1e-3 * g1, "grad norm: one GPU %.8g, 2 ranks %.8g", g1, g2);
    e1->ops->free(e1), e2->ops->free(e2);
    free(w);
    qt_layout_free(&L);
}

int main(void) {
    QT_RUN(test_loss_scale_bitwise);
    QT_RUN(test_masked_loss_and_zero_grads);
    QT_RUN(test_accum_1x4_vs_4x1);
    QT_RUN(test_eval_token_mean);
    QT_RUN(test_export_tokenizer);
    QT_RUN(test_no_targets_logged);
    QT_RUN(test_sft_run);
    QT_RUN(test_gpu_masked_vs_cpu);
    QT_RUN(test_gpu_dp_masked);
    return qt_test_end();
}
