/* test_dpo_ref.c — objective: dpo with full fine-tuning and its stored reference (qt_train_dpo_ref.h).
 *
 * On the CPU: a micro-step against stored reference log-probs equals today's qt_dpo_cpu_step over a frozen copy of the
 * initial weights bit for bit (loss and gradients); a trainer run whose reference comes from <shard>.dporef equals,
 * bit for bit (every step's loss and the weights after it), a run that takes each micro-batch's reference from a
 * forward of the frozen initial weights; the loader's rows name the pairs it delivered; a resume reuses the file
 * (unchanged) or, with the file deleted, computes the same one again, bit for bit; a file made for other initial
 * weights or another shard is computed again (its header then names this run's reference and shard), a damaged or
 * truncated one is refused naming the file; the planted bug (the stored reference read by the row's place in the
 * micro-batch) caught in the mutant build. On a GPU (skipped without one): the GPU engine's full fine-tuning DPO
 * against the CPU engine's within the bf16 bound, CUDA graphs on and off to the same bits, two data-parallel ranks
 * equal to one GPU accumulating two micro-batches, and parallel.zero 2 refused naming the key. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qt_config.h"
#include "qt_cpu_model.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_dpo.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_optim.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_train.h"
#include "qt_train_ckpt.h"
#include "qt_train_session.h"

static char g_dir[256], g_shard[512], g_ref[600];

enum { VOCAB = 32, S = 12, P = 40, STEPS = 6 };

/* P random pairs: a prompt of 3..6 tokens, then each response (4..S-prompt tokens, mask 1) and padding. */
static void write_pairs(const char *path, uint64_t seed) {
    static uint32_t t[2 * P * S + 1];
    static uint8_t m[2 * P * S + 1];
    qt_rng r;
    qt_rng_seed(&r, seed);
    for (int p = 0; p < P; p++) {
        int prompt = 3 + (int)qt_rng_below(&r, 4);
        for (int j = 0; j < 2; j++) {
            uint32_t *w = t + (2 * p + j) * S;
            uint8_t *mk = m + (2 * p + j) * S;
            int end = prompt + 4 + (int)qt_rng_below(&r, (uint64_t)(S - prompt - 3));
            for (int i = 0; i < S; i++) {
                w[i] = i < prompt && j ? t[2 * p * S + i] : (uint32_t)qt_rng_below(&r, VOCAB);
                mk[i] = i >= prompt && i < end;
            }
        }
    }
    t[2 * P * S] = 0, m[2 * P * S] = 0;
    char err[512];
    QT_CHECK(qt_tokens_write_pairs(path, t, m, 2 * P * S + 1, NULL, 0, S, 2, VOCAB, 0, err, sizeof err) == 0, "%s", err);
}

static void load_cfg(qt_config *c, const char *tag, const char *const *set, int n_set) {
    char y[4096], err[1024];
    snprintf(y, sizeof y,
             "model: {vocab_size: %d, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,\n"
             "        intermediate_size: 64, max_seq_len: 16, qkv_bias: true}\n"
             "init: {seed: 3, std: 0.1}\n"
             "data: {train: '%s', eval: '', seq_len: %d, micro_batch: 4, grad_accum: 2}\n"
             "optim: {lr: 0.003, warmup: 2, steps: %d, schedule: cosine, grad_clip: 1.0, weight_decay: 0.01}\n"
             "eval: {every: 0}\ncheckpoint: {dir: '%s/ckpt_%s', every: 0, keep: 2}\n"
             "log: {file: '%s/log_%s.jsonl', every: 1}\n"
             "lora: {rank: 0}\nobjective: dpo\ndpo: {beta: 0.5, label_smoothing: 0.1}\ndevice: cpu\n",
             VOCAB, g_shard, S, STEPS, g_dir, tag, g_dir, tag);
    QT_REQUIRE(qt_config_load_string(c, y, "t.yaml", set, n_set, err, sizeof err) == 0, "%s", err);
}

/* steps of a trainer session of c: each step's loss, the weights after them into w[numel] (w may be NULL). */
static int session_run(const qt_config *c, int steps, float *loss, float *w, char *err, size_t errlen) {
    qt_train_opts o = {NULL, -1, 0, NULL, NULL, NULL};
    qt_train_stats st;
    qt_train_fail f;
    qt_trainer *t = qt_session_open(c, &o, 0, &st, &f, err, errlen);
    if (!t) return -1;
    int rc = 0;
    for (int s = 0; s < steps && rc == 0; s++) {
        qt_step_result r;
        rc = qt_session_step(t, QT_BATCH_LOADER, &r, err, errlen);
        loss[s] = r.loss;
    }
    if (rc == 0 && w) rc = qt_engine_get_weights(t->eng, w, err, errlen);
    return qt_session_close(t, rc, err, errlen);
}

/* The same steps with the engine driven here, each micro-batch's reference from a forward of a frozen copy of the
 * initial weights (qt_dpo_cpu_row_logps: the reference forward of qt_dpo_cpu_step), the loader and the schedule as
 * the trainer's. */
static void frozen_run(const qt_config *c, float *loss, float *w) {
    char err[1024];
    qt_layout L;
    qt_weight_src src;
    QT_REQUIRE(qt_model_layout(c, &L, &src, err, sizeof err) == 0, "%s", err);
    float *w0 = malloc(L.numel * sizeof *w0);
    QT_REQUIRE(w0 && qt_weight_src_fill(&src, 0, L.numel, w0, err, sizeof err) == 0, "%s", err);
    qt_engine *e = qt_engine_create(&L, c, &src, err, sizeof err);
    QT_REQUIRE(e, "%s", err);
    int B = c->data.micro_batch, acc = c->data.grad_accum;
    qt_cpu_model *m = qt_cpu_model_create(&L, B, S);
    qt_loader *l = qt_loader_open(c->data.train, S, B, 0, 1, c->seed, 1, VOCAB, err, sizeof err);
    QT_REQUIRE(l, "%s", err);
    qt_sched sc = {c->optim.schedule, c->optim.lr, c->optim.final_lr_frac, c->optim.warmup, c->optim.cooldown,
                   c->optim.steps};
    int32_t in[8 * S], tg[8 * S];
    double ref[8];
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < acc; k++) {
            QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
            qt_dpo_cpu_row_logps(m, w0, in, tg, B, S, ref);
            QT_REQUIRE(qt_engine_set_dpo_ref(e, ref, err, sizeof err) == 0 &&
                           qt_engine_micro_step(e, in, tg, qt_loss_scale(acc, 1, (long)acc * B / 2), err, sizeof err) == 0,
                       "%s", err);
        }
        float gn;
        QT_REQUIRE(qt_engine_opt_step(e, qt_sched_lr(&sc, s), s + 1, &loss[s], &gn, err, sizeof err) == 0, "%s", err);
    }
    QT_REQUIRE(qt_engine_get_weights(e, w, err, sizeof err) == 0, "%s", err);
    qt_loader_free(l);
    qt_cpu_model_free(m);
    qt_engine_free(e);
    free(w0);
    qt_layout_free(&L);
}

/* The stored and the frozen run of the same config: *same 1 when every loss and weight is the same bits. */
static void stored_equals_frozen(const char *tag, int verbose, int *same) {
    static qt_config c;
    char err[1024];
    load_cfg(&c, tag, NULL, 0);
    qt_layout L;
    qt_weight_src src;
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    size_t n = L.numel;
    qt_layout_free(&L);
    float la[STEPS], lb[STEPS], *wa = malloc(n * 4), *wb = malloc(n * 4);
    QT_REQUIRE(session_run(&c, STEPS, la, wa, err, sizeof err) == 0, "stored: %s", err);
    frozen_run(&c, lb, wb);
    *same = !memcmp(la, lb, sizeof la) && !memcmp(wa, wb, n * 4);
    for (int s = 0; s < STEPS && verbose; s++) printf("  step %d: loss stored %.9g, frozen %.9g\n", s + 1, la[s], lb[s]);
    free(wa), free(wb);
}

/* qt_dpo_cpu_step (reference forward over a frozen copy) and qt_dpo_cpu_step_stored given that forward's row
 * log-probs: the same loss, gradients and stats bits, with policy weights that differ from the reference's. */
static void test_micro_step_bits(void) {
    static qt_config c;
    char err[1024];
    load_cfg(&c, "bits", NULL, 0);
    qt_layout L;
    qt_weight_src src;
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    size_t n = L.numel;
    float *w0 = malloc(n * 4), *w = malloc(n * 4), *ga = calloc(n, 4), *gb = calloc(n, 4);
    QT_REQUIRE(qt_weight_src_fill(&src, 0, n, w0, err, sizeof err) == 0, "%s", err);
    qt_rng r;
    qt_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++) w[i] = w0[i] + 0.02f * qt_rng_normal(&r);
    qt_loader *l = qt_loader_open(g_shard, S, 8, 0, 1, 1, 1, VOCAB, err, sizeof err);
    int32_t in[8 * S], tg[8 * S];
    QT_REQUIRE(l && qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
    qt_cpu_model *m = qt_cpu_model_create(&L, 8, S);
    qt_dpo_stats sa = {0}, sb = {0};
    double ref[8];
    double la = qt_dpo_cpu_step(m, w, NULL, w0, in, tg, 8, S, &c.dpo, 1, ga, 0.25f, &sa);
    qt_dpo_cpu_row_logps(m, w0, in, tg, 8, S, ref);
    double lb = qt_dpo_cpu_step_stored(m, w, ref, in, tg, 8, S, &c.dpo, 1, gb, 0.25f, &sb);
    printf("  loss frozen %.17g, stored %.17g, margin %.6f\n", la, lb, sa.margin / sa.pairs);
    QT_EXPECT(!memcmp(&la, &lb, sizeof la), "loss: frozen %.17g, stored %.17g", la, lb);
    QT_EXPECT(!memcmp(&sa, &sb, sizeof sa), "the pairs' stats differ");
    QT_EXPECT(!memcmp(ga, gb, n * 4), "the gradients differ");
    QT_EXPECT(fabs(sa.margin) > 1e-4, "policy = reference (margin %g): the check would not see the reference", sa.margin);
    qt_cpu_model_free(m);
    qt_loader_free(l);
    free(w0), free(w), free(ga), free(gb);
    qt_layout_free(&L);
}

/* The loader's rows: a shuffled micro-batch's rows are whole pairs (2p, 2p + 1) whose tokens are those rows as
 * qt_loader_read_rows reads them in the data's order. */
static void test_loader_rows(void) {
    char err[1024];
    qt_loader *l = qt_loader_open(g_shard, S, 4, 0, 1, 9, 1, VOCAB, err, sizeof err);
    QT_REQUIRE(l, "%s", err);
    int32_t in[4 * S], tg[4 * S], in2[4 * S], tg2[4 * S];
    uint64_t rows[4];
    int moved = 0;
    for (int k = 0; k < 25; k++) { /* past the end of epoch 0 (20 batches) */
        QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
        qt_loader_last_rows(l, rows);
        for (int b = 0; b < 4; b += 2)
            QT_EXPECT(rows[b] % 2 == 0 && rows[b + 1] == rows[b] + 1 && rows[b] < 2 * P, "batch %d: rows %llu, %llu", k,
                      (unsigned long long)rows[b], (unsigned long long)rows[b + 1]);
        for (int b = 0; b < 4; b++) {
            QT_REQUIRE(qt_loader_read_rows(l, rows[b], 1, in2 + b * S, tg2 + b * S, NULL, NULL, err, sizeof err) == 0, "%s",
                       err);
            moved |= rows[b] != (uint64_t)(4 * k + b) % (2 * P);
        }
        QT_EXPECT(!memcmp(in, in2, sizeof in) && !memcmp(tg, tg2, sizeof tg), "batch %d: its rows read back differ", k);
    }
    QT_EXPECT(moved, "the shuffled order equals the file order: the check would not see a wrong row");
    QT_REQUIRE(qt_loader_read_rows(l, 2 * P - 1, 2, in2, tg2, NULL, NULL, err, sizeof err) == 0, "%s", err);
    for (int t = 0; t < S; t++) QT_EXPECT(tg2[S + t] == -1 && in2[S + t] == 0, "a row past the data: token %d", t);
    qt_loader_free(l);
}

/* The trainer's stored reference equals the frozen copy bit for bit; the file is there and names the reference. */
static void test_stored_equals_frozen(void) {
    unlink(g_ref);
    int same = 0;
    stored_equals_frozen("eq", 1, &same);
    QT_EXPECT(same, "the stored reference's run differs from the frozen copy's");
    size_t nb = 0;
    char *f = qt_t_read_file(g_ref, &nb);
    QT_EXPECT(f && nb == QT_DPOREF_HEADER + 2 * P * 8 && !memcmp(f, "QTDPOREF", 8) && strstr(f + 48, "engine cpu-fp32"),
              "%s: %zu bytes (expected %d)", g_ref, nb, QT_DPOREF_HEADER + 2 * P * 8);
    free(f);
}

/* 3 + 3 steps with a resume equal 6 straight ones: the file reused as it is, or computed again when deleted. */
static void test_resume(void) {
    static qt_config a, b;
    char err[1024];
    float la[STEPS], lb[STEPS];
    load_cfg(&a, "straight", NULL, 0);
    QT_REQUIRE(session_run(&a, STEPS, la, NULL, err, sizeof err) == 0, "%s", err);
    size_t n0, n1;
    char *before = qt_t_read_file(g_ref, &n0);
    for (int del = 0; del < 2; del++) {
        const char *tag = del ? "halves_deleted" : "halves";
        load_cfg(&b, tag, NULL, 0);
        qt_train_opts o1 = {NULL, 3, 0, lb, NULL, NULL}, o2 = {"latest", -1, 0, lb, NULL, NULL};
        QT_REQUIRE(qt_train_run(&b, &o1, NULL, err, sizeof err) == 0, "%s: first half: %s", tag, err);
        if (del) unlink(g_ref);
        QT_REQUIRE(qt_train_run(&b, &o2, NULL, err, sizeof err) == 0, "%s: resumed half: %s", tag, err);
        for (int s = 0; s < STEPS; s++)
            QT_EXPECT(!memcmp(&la[s], &lb[s], 4), "%s, step %d: straight %.9g, resumed %.9g", tag, s + 1, la[s], lb[s]);
        char *after = qt_t_read_file(g_ref, &n1);
        QT_EXPECT(before && after && n0 == n1 && !memcmp(before, after, n0), "%s: the file differs after the resume", tag);
        free(after);
    }
    free(before);
}

/* Made for other initial weights or another shard: computed again (the header then names them); damaged or
 * truncated: refused naming the file. */
static void test_stale_and_damaged(void) {
    static qt_config c;
    char err[1024];
    float l[STEPS];
    const char *seed4[] = {"init.seed=4"};
    load_cfg(&c, "s3", NULL, 0);
    QT_REQUIRE(session_run(&c, 1, l, NULL, err, sizeof err) == 0, "%s", err);
    size_t n;
    char *f3 = qt_t_read_file(g_ref, &n);
    load_cfg(&c, "s4", seed4, 1);
    QT_REQUIRE(session_run(&c, 1, l, NULL, err, sizeof err) == 0, "%s", err);
    char *f4 = qt_t_read_file(g_ref, &n);
    QT_REQUIRE(f3 && f4, "no %s", g_ref);
    printf("  seed 3: \"%s\"\n  seed 4: \"%s\"\n", f3 + 48, f4 + 48);
    QT_EXPECT(strcmp(f3 + 48, f4 + 48) && memcmp(f3 + QT_DPOREF_HEADER, f4 + QT_DPOREF_HEADER, 2 * P * 8),
              "other initial weights: the file was not computed again");
    /* another shard of the same size: the header's checksum follows it */
    write_pairs(g_shard, 77);
    qt_tokens_header h;
    QT_REQUIRE(qt_tokens_read_header(g_shard, &h, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(session_run(&c, 1, l, NULL, err, sizeof err) == 0, "%s", err);
    char *f5 = qt_t_read_file(g_ref, &n);
    uint64_t sum;
    memcpy(&sum, f5 + 32, 8);
    QT_EXPECT(sum == h.checksum && memcmp(f4 + QT_DPOREF_HEADER, f5 + QT_DPOREF_HEADER, 2 * P * 8),
              "another shard: the file was not computed again (checksum %llx, the shard's %llx)", (unsigned long long)sum,
              (unsigned long long)h.checksum);
    f5[QT_DPOREF_HEADER + 13] ^= 0x10;
    qt_t_write_file(g_ref, f5, n);
    QT_EXPECT(session_run(&c, 1, l, NULL, err, sizeof err) == -1 && strstr(err, ".dporef") && strstr(err, "CRC-32C"),
              "damaged: %s", err);
    qt_t_write_file(g_ref, f5, n - 8);
    QT_EXPECT(session_run(&c, 1, l, NULL, err, sizeof err) == -1 && strstr(err, ".dporef") && strstr(err, "truncated"),
              "truncated: %s", err);
    unlink(g_ref);
    write_pairs(g_shard, 5);
    free(f3), free(f4), free(f5);
}

/* The planted bug: the stored reference read by the row's place in the micro-batch. */
static void test_mutant_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    qt_t_hooks(NULL, QT_MUT_DPO_REF_ROW);
    int same = 1;
    stored_equals_frozen("mutant", 0, &same);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(!same, "the stored reference read for the wrong rows: not caught");
}

/* ---- the GPU engine (skipped without one) ---- */

static const char *const GPU_SET[] = {"device=cuda", "parallel.gpus=1", "model.hidden_size=128", "model.num_heads=2",
                                      "model.num_kv_heads=1", "model.intermediate_size=200"};
enum { GPU_NSET = sizeof GPU_SET / sizeof *GPU_SET };

static double rel_l2(const float *x, const float *x0, const float *y, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double a = (double)x[i] - x0[i], b = (double)y[i] - x0[i];
        d += (a - b) * (a - b), r += b * b;
    }
    return sqrt(d / (r > 0 ? r : 1e-300));
}

/* The GPU engine's full fine-tuning DPO against the CPU engine's on the same pairs: the step losses within 3e-2
 * relative, the weights' change within 3e-2 relative L2 (optim.eps 1: AdamW's update stays continuous in a gradient
 * that bf16 moves, as test_dpo's LoRA comparison); step 1 is log 2 on both (policy = the stored reference). The
 * loss is log 2 less beta times the pairs' log-ratio margins, and the GPU's forward reads bf16 weights that round
 * each step's update: its margins move 0.5-2.5e-2 of the loss from the CPU's on an H200 (fp32 adapters keep
 * LoRA's within 1e-3). A lost reference (policy = reference each step) leaves log 2, 3.6-4.1% off at steps 5-6. */
static void test_gpu_tracks_cpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    static qt_config c;
    char err[1024];
    float loss[2][STEPS], *w[2] = {NULL, NULL}, *w0;
    qt_layout L;
    qt_weight_src src;
    for (int d = 0; d < 2; d++) {
        load_cfg(&c, d ? "gpu_track" : "cpu_track", GPU_SET, GPU_NSET);
        c.device = d ? QT_DEVICE_CUDA : QT_DEVICE_CPU;
        c.optim.eps = 1.0f, c.optim.lr = 0.05f, c.optim.warmup = 0;
        if (!d) {
            QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
            w0 = malloc(L.numel * 4);
            QT_REQUIRE(qt_weight_src_fill(&src, 0, L.numel, w0, err, sizeof err) == 0, "%s", err);
        }
        w[d] = malloc(L.numel * 4);
        QT_REQUIRE(session_run(&c, STEPS, loss[d], w[d], err, sizeof err) == 0, "%s: %s", d ? "cuda" : "cpu", err);
    }
    for (int s = 0; s < STEPS; s++) {
        printf("  step %d: loss cpu %.6f, cuda %.6f\n", s + 1, loss[0][s], loss[1][s]);
        QT_EXPECT(fabs(loss[1][s] - loss[0][s]) <= 3e-2 * fabs(loss[0][s]), "step %d: cpu %g, cuda %g", s + 1, loss[0][s],
                  loss[1][s]);
    }
    QT_EXPECT(fabs(loss[1][0] - log(2.0)) < 1e-6 && fabs(loss[0][0] - log(2.0)) < 1e-6,
              "step 1: cpu %.9g, cuda %.9g, expected log 2 (the policy is the reference)", loss[0][0], loss[1][0]);
    double dw = rel_l2(w[1], w0, w[0], L.numel);
    printf("  the weights' change: cuda vs cpu %.3e relative L2\n", dw);
    QT_EXPECT(dw <= 3e-2, "the weights' change differs by %.3e relative L2 (bound 3e-2)", dw);
    free(w0), free(w[0]), free(w[1]);
    qt_layout_free(&L);
}

/* CUDA graphs on and off: the same loss and weight bits. Two data-parallel ranks sharing GPU 0 with one micro-batch
 * each against one GPU accumulating two: the same losses, the weights within 1e-3 relative L2 of their change (the
 * ranks' weight gradients are summed after their matmuls, one GPU's accumulate inside the second's: other
 * roundings). parallel.zero 2 is refused naming it. */
static void test_gpu_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    static qt_config c;
    char err[1024];
    const char *tag[3] = {"graphs", "eager", "two_ranks"};
    float loss[3][STEPS], *w[3];
    size_t n = 0;
    for (int k = 0; k < 3; k++) {
        load_cfg(&c, tag[k], GPU_SET, GPU_NSET);
        c.perf.cuda_graphs = k != 1;
        if (k == 2) c.data.grad_accum = 1, c.parallel.devices.n = 2; /* [0, 0] */
        if (!n) {
            qt_layout L;
            qt_weight_src src;
            QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
            n = L.numel;
            qt_layout_free(&L);
        }
        w[k] = malloc(n * 4);
        QT_REQUIRE(session_run(&c, STEPS, loss[k], w[k], err, sizeof err) == 0, "%s: %s", tag[k], err);
    }
    QT_EXPECT(!memcmp(loss[0], loss[1], sizeof loss[0]), "eager: the losses differ from graphs' (step 1: %.9g vs %.9g)",
              loss[1][0], loss[0][0]);
    QT_EXPECT(!memcmp(w[0], w[1], n * 4), "eager: the weights differ from graphs'");
    for (int s = 0; s < STEPS; s++)
        QT_EXPECT(fabs(loss[2][s] - loss[0][s]) <= 1e-4 * fabs(loss[0][s]), "two_ranks, step %d: %.9g, one GPU %.9g", s + 1,
                  loss[2][s], loss[0][s]);
    static qt_config c0;
    qt_layout L;
    qt_weight_src src;
    load_cfg(&c0, "initial", GPU_SET, GPU_NSET);
    QT_REQUIRE(qt_model_layout(&c0, &L, &src, err, sizeof err) == 0, "%s", err);
    float *w0 = malloc(n * 4);
    QT_REQUIRE(w0 && qt_weight_src_fill(&src, 0, n, w0, err, sizeof err) == 0, "%s", err);
    double dw = rel_l2(w[2], w0, w[0], n);
    printf("  two ranks vs one GPU accumulating two: the weights' change within %.3e relative L2\n", dw);
    QT_EXPECT(dw <= 1e-3, "two_ranks: the weights' change differs by %.3e relative L2 from one GPU's (bound 1e-3)", dw);
    free(w0);
    qt_layout_free(&L);
    for (int k = 0; k < 3; k++) free(w[k]);
    load_cfg(&c, "zero2", GPU_SET, GPU_NSET);
    c.parallel.zero = 2, c.parallel.devices.n = 2;
    float l[1];
    QT_EXPECT(session_run(&c, 1, l, NULL, err, sizeof err) == -1 && strstr(err, "parallel.zero 2 and 3"), "zero 2: %s", err);
}

int main(void) {
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_dpo_ref")) return 1;
    snprintf(g_shard, sizeof g_shard, "%s/pairs_0.bin", g_dir);
    snprintf(g_ref, sizeof g_ref, "%s%s", g_shard, QT_DPOREF_SUFFIX);
    write_pairs(g_shard, 5);
    QT_RUN(test_micro_step_bits);
    QT_RUN(test_loader_rows);
    QT_RUN(test_stored_equals_frozen);
    QT_RUN(test_resume);
    QT_RUN(test_stale_and_damaged);
    QT_RUN(test_mutant_caught);
    QT_RUN(test_gpu_tracks_cpu);
    QT_RUN(test_gpu_bitwise);
    return qt_test_end();
}
