/* test_dpo.c — objective: dpo on the CPU LoRA engine: the DPO loss of a micro-batch equals one written here from
 * the model's own forwards (policy: adapters on, reference: off), its row weights equal a finite difference of the
 * loss; the loader serves pair shards as whole pairs (shuffled by pair, never split) and refuses an odd
 * micro_batch, another seq_len or a mix with other shards; the config refuses an odd micro_batch, the GPU refuses
 * full fine-tuning's dpo with parallel.zero 2; a synthetic preference task ("a+b=" with the right sum chosen and a wrong one rejected, LoRA over a random
 * base, and full fine-tuning) whose logged reward accuracy climbs above 90%; a resume bit for bit (LoRA and full),
 * one over other initial weights refused; the planted bugs (chosen and rejected swapped, the reference taken as
 * the policy) caught in the mutant build. On a GPU (skipped without one) the GPU LoRA engine's DPO: its losses, rewards
 * and adapters track the CPU LoRA engine's on the same pairs, a resume bit for bit, two data-parallel ranks and
 * memory.recompute to the same bits, and the synthetic task above 90%. The match with torch and TRL is
 * tests/test_dpo_torch.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qt_config.h"
#include "qt_cpu_model.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_dpo.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_lora.h"
#include "qt_lora_cpu.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_train.h"

static char g_dir[256];

enum { PLUS = 10, EQ = 11, EOS = 12, VOCAB = 16, S = 8 };

/* The sequence "a+b=" then r's digits and EOS into t[S] (padded with EOS), mask 1 on the response tokens. */
static void sequence(uint32_t *t, uint8_t *m, int a, int b, int r) {
    int n = 0;
    t[n++] = (uint32_t)a, t[n++] = PLUS, t[n++] = (uint32_t)b, t[n++] = EQ;
    int first = n;
    if (r >= 10) t[n++] = (uint32_t)(r / 10);
    t[n++] = (uint32_t)(r % 10);
    t[n++] = EOS;
    for (int i = 0; i < S; i++) m[i] = i >= first && i < n;
    for (int i = n; i < S; i++) t[i] = EOS;
}

/* The pair shard of every a+b (a, b in 0..9): the right sum chosen, a wrong one (1 to 5 off, seeded) rejected. */
static void write_arith(const char *path, uint64_t seed) {
    enum { P = 100 };
    static uint32_t t[2 * P * S + 1];
    static uint8_t m[2 * P * S + 1];
    static uint64_t docs[2 * P];
    qt_rng r;
    qt_rng_seed(&r, seed);
    for (int p = 0; p < P; p++) {
        int a = p / 10, b = p % 10, wrong = (a + b + 1 + (int)qt_rng_below(&r, 5)) % 19;
        sequence(t + 2 * p * S, m + 2 * p * S, a, b, a + b);
        sequence(t + (2 * p + 1) * S, m + (2 * p + 1) * S, a, b, wrong);
        docs[2 * p] = 2 * p * S, docs[2 * p + 1] = (2 * p + 1) * S;
    }
    t[2 * P * S] = EOS, m[2 * P * S] = 0;
    char err[512];
    QT_CHECK(qt_tokens_write_pairs(path, t, m, 2 * P * S + 1, docs, 2 * P, S, 2, VOCAB, 0, err, sizeof err) == 0, "%s", err);
}

static const char *yaml_of(char *y, size_t cap, const char *tag, int steps, const char *extra) {
    snprintf(y, cap,
             "model: {vocab_size: %d, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,\n"
             "        intermediate_size: 64, max_seq_len: 16, qkv_bias: true}\n"
             "init: {seed: 3, std: 0.1}\n"
             "data: {train: '%s/arith_*.bin', eval: '', seq_len: %d, micro_batch: 8, grad_accum: 2}\n"
             "optim: {lr: 0.01, warmup: 5, steps: %d, schedule: cosine, grad_clip: 1.0, weight_decay: 0.0}\n"
             "eval: {every: 0}\ncheckpoint: {dir: '%s/ckpt_%s', every: 0, keep: 2}\n"
             "log: {file: '%s/log_%s.jsonl', every: 1}\n"
             "lora: {rank: 8, alpha: 16, dropout: 0.05}\nobjective: dpo\ndpo: {beta: 0.5, label_smoothing: 0.0}\n"
             "device: cpu\n%s",
             VOCAB, g_dir, S, steps, g_dir, tag, g_dir, tag, extra);
    return y;
}

static int load(qt_config *c, const char *yaml, char *err, size_t errlen) {
    return qt_config_load_string(c, yaml, "t.yaml", NULL, 0, err, errlen);
}

/* The mean of a JSON number field over the log's train records from step `from` on. */
static double log_mean(const char *path, const char *field, int from) {
    size_t n;
    char *s = qt_t_read_file(path, &n), key[64];
    if (!s) return NAN;
    snprintf(key, sizeof key, "\"%s\":", field);
    double sum = 0;
    int k = 0, step = 0;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        char *st = strstr(line, "\"step\":"), *f = strstr(line, key);
        if (!strstr(line, "\"train\"") || !st || !f) continue;
        step = atoi(st + 7);
        if (step >= from) sum += atof(f + strlen(key)), k++;
    }
    free(s);
    return k ? sum / k : NAN;
}

/* A small model with non-zero adapters and one micro-batch of 3 pairs of random tokens and masks. */
typedef struct {
    qt_layout L;
    qt_lora_layout A;
    float *w, *a, *ga;
    qt_cpu_model *m;
    qt_lora_cpu *lc;
    int32_t in[6 * S], tg[6 * S];
} fixture;

static void fixture_init(fixture *f) {
    char err[512];
    qt_model_cfg mc = {.arch = QT_ARCH_QWEN2, .vocab_size = VOCAB, .hidden_size = 32, .num_layers = 2, .num_heads = 4,
                       .num_kv_heads = 2, .intermediate_size = 48, .max_seq_len = 16, .qkv_bias = 1};
    qt_model_cfg_finish(&mc);
    qt_lora_cfg lc = {.rank = 4, .alpha = 8, .targets = QT_LORA_ALL};
    QT_CHECK(qt_layout_init(&f->L, &mc, err, sizeof err) == 0 && qt_lora_layout_init(&f->A, &lc, &mc, err, sizeof err) == 0,
             "%s", err);
    f->w = malloc(f->L.numel * 4), f->a = malloc(f->A.numel * 4), f->ga = calloc(f->A.numel, 4);
    qt_rng r;
    qt_rng_seed(&r, 11);
    for (size_t i = 0; i < f->L.numel; i++) f->w[i] = 0.2f * qt_rng_normal(&r);
    for (size_t i = 0; i < f->A.numel; i++) f->a[i] = 0.2f * qt_rng_normal(&r); /* B != 0: policy != reference */
    for (int i = 0; i < 6 * S; i++) {
        f->in[i] = (int32_t)qt_rng_below(&r, VOCAB);
        f->tg[i] = i % S >= 2 + i / S % 3 ? (int32_t)qt_rng_below(&r, VOCAB) : -1;
    }
    f->m = qt_cpu_model_create(&f->L, 6, S);
    f->lc = qt_lora_cpu_create(&f->A, f->a, f->ga, 6 * S, 1);
    qt_lora_cpu_set_batch(f->lc, 1, 0);
}

static void fixture_free(fixture *f) {
    qt_lora_cpu_free(f->lc);
    qt_cpu_model_free(f->m);
    qt_lora_layout_free(&f->A);
    qt_layout_free(&f->L);
    free(f->w), free(f->a), free(f->ga);
}

/* Row b's summed target log-prob under the last forward, summed here from the token losses. */
static double row_logp(const fixture *f, int b) {
    const float *l = qt_cpu_model_token_losses(f->m);
    double s = 0;
    for (int t = 0; t < S; t++)
        if (f->tg[b * S + t] >= 0) s -= l[b * S + t];
    return s;
}

/* qt_dpo_cpu_step's loss minus the loss written here: -(1-e) log sig(bh) - e log sig(-bh), mean over pairs. LoRA
 * (full 0): the policy is the base with the adapters, the reference the base; full fine-tuning (full 1): the policy
 * is the weights, the reference other weights, no adapter. */
static double loss_error(int full, double *got) {
    fixture f;
    fixture_init(&f);
    qt_dpo_cfg c = {0.5f, 0.2f};
    double pol[6], ref[6];
    float *wr = malloc(f.L.numel * 4);
    qt_rng r;
    qt_rng_seed(&r, 12);
    for (size_t i = 0; i < f.L.numel; i++) wr[i] = full ? f.w[i] + 0.05f * qt_rng_normal(&r) : f.w[i];
    qt_cpu_adapter *pa = full ? NULL : qt_lora_cpu_adapter(f.lc);
    qt_cpu_model_set_adapter(f.m, pa);
    qt_cpu_model_forward(f.m, f.w, f.in, f.tg);
    for (int b = 0; b < 6; b++) pol[b] = row_logp(&f, b);
    qt_cpu_model_set_adapter(f.m, NULL);
    qt_cpu_model_forward(f.m, wr, f.in, f.tg);
    for (int b = 0; b < 6; b++) ref[b] = row_logp(&f, b);
    double want = 0, beta = c.beta, e = c.label_smoothing;
    for (int p = 0; p < 3; p++) {
        double z = beta * ((pol[2 * p] - pol[2 * p + 1]) - (ref[2 * p] - ref[2 * p + 1]));
        want += ((1 - e) * log1p(exp(-z)) + e * log1p(exp(z))) / 3;
    }
    *got = qt_dpo_cpu_step(f.m, f.w, pa, wr, f.in, f.tg, 6, S, &c, 0, NULL, 0, NULL);
    fixture_free(&f);
    free(wr);
    return fabs(*got - want) / want;
}

static void test_loss_matches_written(void) {
    for (int full = 0; full < 2; full++) {
        double got, e = loss_error(full, &got);
        QT_EXPECT(e < 1e-12, "%s: loss %.12g is %.3g off the written DPO", full ? "full" : "lora", got, e);
    }
}

/* The row weights are the loss's derivative: d loss / d (row b's token loss) against a central difference of
 * qt_dpo_batch in the row log-probs. */
static void test_row_weights(void) {
    qt_dpo_cfg c = {0.3f, 0.1f};
    double pi[6] = {-3.1, -2.2, -5.0, -4.9, -1.0, -7.5}, ref[6] = {-3.0, -2.5, -4.0, -5.2, -1.5, -6.0};
    float scale[6];
    qt_dpo_stats st = {0};
    qt_dpo_batch(&c, pi, ref, 6, 1.0f / 3, scale, &st);
    for (int b = 0; b < 6; b++) {
        double h = 1e-5, keep = pi[b];
        pi[b] = keep + h;
        double up = qt_dpo_batch(&c, pi, ref, 6, 0, NULL, NULL);
        pi[b] = keep - h;
        double dn = qt_dpo_batch(&c, pi, ref, 6, 0, NULL, NULL);
        pi[b] = keep;
        double d = -(up - dn) / (2 * h); /* the token loss is -log p */
        QT_EXPECT(fabs(scale[b] - d) <= 1e-6 * fabs(d) + 1e-9, "row %d: weight %.9g, finite difference %.9g", b, scale[b], d);
    }
    /* rewards beta (pi - ref): pair 0 0.3*(-0.1) vs 0.3*0.3, pair 1 -0.3 vs 0.09, pair 2 0.15 vs -0.45 */
    QT_EXPECT(st.pairs == 3 && st.accuracy == 1 && fabs(st.margin - (-0.12 - 0.39 + 0.6)) < 1e-7,
              "stats: %ld pairs, accuracy %g, margin sum %.12g", st.pairs, st.accuracy, st.margin);
}

/* Pairs come whole in a seeded order of pairs: every pair once per epoch, chosen row then rejected row. */
static void test_loader_pairs(void) {
    enum { P = 7 };
    uint32_t t[2 * P * S + 1];
    uint8_t m[2 * P * S + 1];
    for (int w = 0; w < 2 * P; w++)
        for (int i = 0; i < S; i++) t[w * S + i] = (uint32_t)(w * 2 + (i > 3)), m[w * S + i] = i > 3;
    t[2 * P * S] = 0, m[2 * P * S] = 0;
    char path[512], p2[512], err[1024];
    snprintf(path, sizeof path, "%s/pairs_0.bin", g_dir);
    QT_REQUIRE(qt_tokens_write_pairs(path, t, m, 2 * P * S + 1, NULL, 0, S, 2, 64, 0, err, sizeof err) == 0, "%s", err);
    qt_loader *l = qt_loader_open(path, S, 2, 0, 1, 9, 1, 64, err, sizeof err);
    QT_REQUIRE(l, "%s", err);
    QT_EXPECT(qt_loader_pairs(l) && qt_loader_windows(l) == 2 * P, "pairs %d, windows %llu", qt_loader_pairs(l),
              (unsigned long long)qt_loader_windows(l));
    int seen[P] = {0}, order[P];
    int32_t in[2 * S], tg[2 * S];
    for (int k = 0; k < P; k++) {
        QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
        int w = in[0] / 2;
        QT_EXPECT(w % 2 == 0 && in[S] / 2 == w + 1, "rows hold windows %d and %d (expected a pair 2p, 2p + 1)", w, in[S] / 2);
        QT_EXPECT(tg[2] == -1 && tg[3] == (int32_t)(w * 2 + 1), "window %d's mask not served", w);
        seen[w / 2]++, order[k] = w / 2;
    }
    int shuffled = 0;
    for (int p = 0; p < P; p++) {
        QT_EXPECT(seen[p] == 1, "pair %d seen %d times in an epoch", p, seen[p]);
        shuffled |= order[p] != p;
    }
    QT_EXPECT(shuffled, "the pairs came in file order");
    qt_loader_free(l);
    QT_EXPECT(!qt_loader_open(path, S, 3, 0, 1, 9, 1, 64, err, sizeof err) && strstr(err, "expected an even count"), "odd: %s", err);
    QT_EXPECT(!qt_loader_open(path, S + 1, 2, 0, 1, 9, 1, 64, err, sizeof err) && strstr(err, "set data.seq_len: 8"),
              "seq_len: %s", err);
    snprintf(p2, sizeof p2, "%s/pairs_1.bin", g_dir);
    QT_REQUIRE(qt_tokens_write_masked(p2, t, m, 2 * P * S + 1, 2, 64, 0, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/pairs_*.bin", g_dir);
    QT_EXPECT(!qt_loader_open(path, S, 2, 0, 1, 9, 1, 64, err, sizeof err) && strstr(err, "all preference pairs"),
              "mixed: %s", err);
    QT_EXPECT(qt_tokens_write_pairs(p2, t, m, 2 * P * S, NULL, 0, S, 2, 64, 0, err, sizeof err) != 0 &&
                  strstr(err, "2 P x seq_len + 1"), "a pair shard of the wrong length: %s", err);
}

/* objective: dpo needs an even micro_batch; pair shards need objective: dpo; the GPU takes it with full fine-tuning
 * (its stored reference, test_dpo_ref.c) but for parallel.zero 2 and 3. */
static void test_refusals(void) {
    static qt_config c;
    char y[4096], err[1024];
    const char *odd[] = {"data.micro_batch=3"};
    QT_EXPECT(qt_config_load_string(&c, yaml_of(y, sizeof y, "r1", 10, ""), "t.yaml", odd, 1, err, sizeof err) == -1 &&
                  strstr(err, "data.micro_batch: expected an even count"), "got: %s", err);
    QT_EXPECT(load(&c, "dpo: {beta: 0}\n", err, sizeof err) == -1 && strstr(err, "dpo.beta"), "got: %s", err);
    QT_EXPECT(load(&c, "dpo: {label_smoothing: 0.5}\n", err, sizeof err) == -1 && strstr(err, "dpo.label_smoothing"),
              "got: %s", err);
    QT_REQUIRE(load(&c, yaml_of(y, sizeof y, "r2", 10, ""), err, sizeof err) == 0, "%s", err);
    const char *no = qt_engine_gpu_refusal(&c);
    QT_EXPECT(!no, "GPU refusal of LoRA's dpo: %s", no ? no : "none");
    c.lora.rank = 0;
    no = qt_engine_gpu_refusal(&c);
    QT_EXPECT(!no, "GPU refusal of full fine-tuning's dpo: %s", no ? no : "none");
    int zero = c.parallel.zero;
    c.parallel.zero = 2;
    no = qt_engine_gpu_refusal(&c);
    QT_EXPECT(no && strstr(no, "objective: dpo with full fine-tuning on the GPU: parallel.zero 2 and 3"),
              "GPU refusal of full fine-tuning's dpo with parallel.zero 2: %s", no ? no : "none");
    c.parallel.zero = zero;
    c.lora.rank = 8;
    c.objective = QT_OBJ_LM;
    QT_EXPECT(qt_train_run(&c, NULL, NULL, err, sizeof err) == -1 && strstr(err, "train them with objective: dpo"),
              "pairs without dpo: %s", err);
}

/* "a+b=": LoRA over a random base learns to prefer the right sum: the logged reward accuracy of the last 40 of
 * 200 steps (8 pairs each: 16 passes over the 100 pairs) is above 0.9, starting at 0 (adapters B = 0: policy =
 * reference). */
static void arith_accuracy(const char *tag, const char *const *set, int n_set) {
    static qt_config c;
    char y[4096], err[1024], log[512];
    snprintf(log, sizeof log, "%s/log_%s.jsonl", g_dir, tag);
    QT_REQUIRE(qt_config_load_string(&c, yaml_of(y, sizeof y, tag, 200, ""), "t.yaml", set, n_set, err, sizeof err) == 0,
               "%s", err);
    qt_train_stats st;
    QT_REQUIRE(qt_train_run(&c, NULL, &st, err, sizeof err) == 0, "%s", err);
    double first = log_mean(log, "dpo_accuracy", 1) * 200 - log_mean(log, "dpo_accuracy", 2) * 199;
    double acc = log_mean(log, "dpo_accuracy", 161), margin = log_mean(log, "dpo_margin", 161);
    printf("  %s: reward accuracy: step 1 %.3f, steps 161-200 %.3f (margin %.3f)\n", tag, first, acc, margin);
    QT_EXPECT(fabs(first) < 1e-6, "step 1's accuracy %g (policy = reference: every margin 0)", first);
    QT_EXPECT(acc > 0.9 && margin > 0, "reward accuracy %.3f, margin %.3f at the end (expected > 0.9, > 0)", acc, margin);
}

static void test_arith_accuracy(void) { arith_accuracy("arith", NULL, 0); }

/* The same with full fine-tuning: the reference is the initial weights' stored log-probs (<shard>.dporef). */
static void test_arith_accuracy_full(void) {
    const char *full[] = {"lora.rank=0", "optim.lr=0.003"};
    arith_accuracy("arith_full", full, 2);
}

/* 12 steps + resume + 12 steps equal 24 straight steps bit for bit (losses and the export: the adapters, or with
 * lora.rank 0 the model). */
static void resume_bit_exact(const char *tag, const char *const *set, int n_set, const char *export_file) {
    static qt_config a, b;
    char y[4096], err[1024], ta[64], tb[64];
    float la[24], lb[24];
    snprintf(ta, sizeof ta, "straight%s", tag);
    snprintf(tb, sizeof tb, "halves%s", tag);
    QT_REQUIRE(qt_config_load_string(&a, yaml_of(y, sizeof y, ta, 24, ""), "t.yaml", set, n_set, err, sizeof err) == 0,
               "%s", err);
    QT_REQUIRE(qt_config_load_string(&b, yaml_of(y, sizeof y, tb, 24, ""), "t.yaml", set, n_set, err, sizeof err) == 0,
               "%s", err);
    qt_train_opts oa = {NULL, -1, 0, la, NULL, NULL}, ob1 = {NULL, 12, 0, lb, NULL, NULL}, ob2 = {"latest", -1, 0, lb, NULL, NULL};
    QT_REQUIRE(qt_train_run(&a, &oa, NULL, err, sizeof err) == 0, "straight: %s", err);
    QT_REQUIRE(qt_train_run(&b, &ob1, NULL, err, sizeof err) == 0, "first half: %s", err);
    QT_REQUIRE(qt_train_run(&b, &ob2, NULL, err, sizeof err) == 0, "resumed half: %s", err);
    for (int i = 0; i < 24; i++) QT_EXPECT(!memcmp(&la[i], &lb[i], 4), "step %d: straight %.9g, resumed %.9g", i + 1, la[i], lb[i]);
    char ea[512], eb[512];
    size_t na = 0, nb = 0;
    snprintf(ea, sizeof ea, "%s/ckpt_%s/export/%s", g_dir, ta, export_file);
    snprintf(eb, sizeof eb, "%s/ckpt_%s/export/%s", g_dir, tb, export_file);
    char *fa = qt_t_read_file(ea, &na), *fb = qt_t_read_file(eb, &nb);
    QT_EXPECT(fa && fb && na == nb && na > 0 && !memcmp(fa, fb, na), "exports differ (%zu vs %zu bytes)", na, nb);
    free(fa);
    free(fb);
}

static void test_resume_bit_exact(void) { resume_bit_exact("", NULL, 0, "adapter_model.safetensors"); }

/* Full fine-tuning: the same, and a resume whose initial weights (the reference) differ is refused. */
static void test_resume_bit_exact_full(void) {
    const char *full[] = {"lora.rank=0"}, *other[] = {"lora.rank=0", "init.seed=4"};
    resume_bit_exact("_full", full, 1, "model.safetensors");
    static qt_config c;
    char y[4096], err[1024];
    QT_REQUIRE(qt_config_load_string(&c, yaml_of(y, sizeof y, "halves_full", 30, ""), "t.yaml", other, 2, err, sizeof err) == 0,
               "%s", err);
    qt_train_opts o = {"latest", -1, 0, NULL, NULL, "init.seed,optim.steps"};
    QT_EXPECT(qt_train_run(&c, &o, NULL, err, sizeof err) == -1 && strstr(err, "dpo_reference"), "got: %s", err);
}

/* The planted bugs of dpo.c: each makes the loss differ from the written one. */
static void test_mutants_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    double got, e[2][2];
    qt_mutant m[2] = {QT_MUT_DPO_SWAPPED, QT_MUT_DPO_REF_ADAPTED};
    for (int i = 0; i < 2; i++)
        for (int full = 0; full < 2; full++) {
            qt_t_hooks(NULL, m[i]);
            e[i][full] = loss_error(full, &got);
        }
    qt_t_hooks(NULL, QT_MUT_NONE);
    for (int full = 0; full < 2; full++) {
        QT_EXPECT(e[0][full] > 1e-3, "%s: chosen and rejected swapped: loss %.3g off (not caught)", full ? "full" : "lora",
                  e[0][full]);
        QT_EXPECT(e[1][full] > 1e-3, "%s: the reference taken as the policy: loss %.3g off (not caught)",
                  full ? "full" : "lora", e[1][full]);
    }
}

/* ---- the GPU LoRA engine ---- */

/* A model shape the GPU kernels take (head_dim 64, widths multiples of 8), on one GPU. */
static const char *const GPU_SET[] = {"device=cuda", "parallel.gpus=1", "model.hidden_size=128", "model.num_heads=2",
                                      "model.num_kv_heads=1", "model.intermediate_size=200"};
enum { GPU_NSET = sizeof GPU_SET / sizeof *GPU_SET };

/* steps optimizer steps of engine e over the arith pairs in the loader's seeded order: the step losses and the
 * stats of each step's pairs; the adapters after them (the checkpoint blob) into a[numel]. */
static void dpo_steps(qt_engine *e, const qt_config *c, int steps, float *loss, qt_dpo_stats *st, float *a, size_t numel) {
    char err[1024];
    qt_loader *l = qt_loader_open(c->data.train, c->data.seq_len, c->data.micro_batch, 0, 1, c->seed, 1,
                                  (uint32_t)c->model.vocab_size, err, sizeof err);
    QT_REQUIRE(l, "%s", err);
    long N = (long)c->data.micro_batch * c->data.seq_len;
    int32_t *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    int acc = c->data.grad_accum;
    for (int s = 0; s < steps; s++) {
        for (int k = 0; k < acc; k++) {
            QT_REQUIRE(qt_loader_next(l, in, tg, err, sizeof err) == 0, "%s", err);
            QT_REQUIRE(qt_engine_micro_step(e, in, tg, qt_loss_scale(acc, 1, (long)acc * c->data.micro_batch / 2), err,
                                            sizeof err) == 0, "%s", err);
        }
        float gn;
        QT_REQUIRE(qt_engine_opt_step(e, c->optim.lr, s + 1, &loss[s], &gn, err, sizeof err) == 0, "%s", err);
        e->ops->dpo_stats(e, 0, &st[s]);
    }
    qt_ckpt_item it[8];
    int n = qt_engine_state_items(e, it, 8, err, sizeof err);
    QT_REQUIRE(n >= 5 && !strcmp(it[0].name, "lora_adapters") && it[0].bytes == numel * 4, "adapter blob: %s", err);
    memcpy(a, it[0].data, numel * 4);
    free(in), free(tg);
    qt_loader_free(l);
}

static double rel_l2(const double *x, const double *y, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (x[i] - y[i]) * (x[i] - y[i]), r += y[i] * y[i];
    return sqrt(d / (r > 0 ? r : 1e-300));
}

/* The GPU LoRA engine's DPO against the CPU LoRA engine's on the same pairs, seed and dropout masks: the step losses
 * within 1e-2 relative, the steps' mean rewards (chosen and rejected) and the adapters' change within 3e-2 relative
 * L2: the bf16 bounds of test_lora's test_gpu_tracks_cpu (optim.eps 1 for the same reason: AdamW's update stays
 * continuous in a gradient that bf16 moves). Step 1 is log 2 on both (the adapters' B = 0: policy = reference); the
 * rewards must have moved apart (bf16 rounds an adapter term far below the activations' ulp away, so a comparison of
 * rewards near 0 would measure that rounding, not the engine). */
static void test_gpu_tracks_cpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    enum { STEPS = 10 };
    static qt_config c;
    char y[4096], err[1024];
    float loss[2][STEPS], *a[2] = {NULL, NULL};
    qt_dpo_stats st[2][STEPS];
    qt_layout L;
    qt_weight_src src;
    size_t numel = 0;
    for (int d = 0; d < 2; d++) {
        QT_REQUIRE(qt_config_load_string(&c, yaml_of(y, sizeof y, "track", STEPS, ""), "t.yaml", GPU_SET, GPU_NSET, err,
                                         sizeof err) == 0, "%s", err);
        c.device = d ? QT_DEVICE_CUDA : QT_DEVICE_CPU;
        c.optim.eps = 1.0f; /* with it the update is about lr x the gradient: lr 0.25 moves the rewards well off 0 */
        c.optim.lr = 0.25f;
        c.optim.warmup = 0;
        if (!d) QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
        qt_engine *e = qt_engine_create(&L, &c, &src, err, sizeof err);
        QT_REQUIRE(e, "%s engine: %s", d ? "cuda" : "cpu", err);
        QT_EXPECT(!strcmp(e->ops->name, d ? "cuda-bf16-lora" : "cpu-fp32-lora"), "engine %s", e->ops->name);
        qt_lora_layout A;
        QT_REQUIRE(qt_lora_layout_init(&A, &c.lora, &L.cfg, err, sizeof err) == 0, "%s", err);
        numel = A.numel;
        qt_lora_layout_free(&A);
        a[d] = malloc(numel * 4);
        dpo_steps(e, &c, STEPS, loss[d], st[d], a[d], numel);
        qt_engine_free(e);
    }
    float *a0 = malloc(numel * 4);
    qt_lora_layout A;
    QT_REQUIRE(qt_lora_layout_init(&A, &c.lora, &L.cfg, err, sizeof err) == 0, "%s", err);
    qt_lora_init(&A, a0, c.seed);
    qt_lora_layout_free(&A);
    static double rw[2][2 * STEPS], da[2][1 << 16];
    QT_REQUIRE(numel <= 1 << 16, "%zu adapter parameters", numel);
    for (int s = 0; s < STEPS; s++) {
        for (int d = 0; d < 2; d++)
            rw[d][2 * s] = st[d][s].reward_chosen / st[d][s].pairs, rw[d][2 * s + 1] = st[d][s].reward_rejected / st[d][s].pairs;
        printf("  step %2d: loss cpu %.6f, cuda %.6f; rewards cpu %+.5f/%+.5f, cuda %+.5f/%+.5f\n", s + 1, loss[0][s],
               loss[1][s], rw[0][2 * s], rw[0][2 * s + 1], rw[1][2 * s], rw[1][2 * s + 1]);
        QT_EXPECT(st[1][s].pairs == st[0][s].pairs && st[0][s].pairs == 8, "step %d: pairs cpu %ld, cuda %ld", s + 1,
                  st[0][s].pairs, st[1][s].pairs);
        QT_EXPECT(fabs(loss[1][s] - loss[0][s]) <= 1e-2 * fabs(loss[0][s]), "step %d: loss cpu %g, cuda %g", s + 1,
                  loss[0][s], loss[1][s]);
    }
    QT_EXPECT(fabs(loss[1][0] - log(2.0)) < 1e-6, "step 1: cuda loss %.9g, expected log 2 (policy = reference)", loss[1][0]);
    for (size_t i = 0; i < numel; i++) da[0][i] = (double)a[0][i] - a0[i], da[1][i] = (double)a[1][i] - a0[i];
    double dr = rel_l2(rw[1], rw[0], 2 * STEPS), dad = rel_l2(da[1], da[0], numel), moved = 0;
    for (size_t i = 0; i < numel; i++) moved += da[0][i] * da[0][i];
    printf("  rewards: cuda vs cpu %.3e relative L2; adapters' change %.3e (its norm %.3e)\n", dr, dad, sqrt(moved));
    QT_EXPECT(moved > 1e-8, "the adapters did not move (%g)", sqrt(moved));
    QT_EXPECT(fabs(rw[0][2 * STEPS - 2] - rw[0][2 * STEPS - 1]) > 1e-2, "the rewards did not separate: %g / %g",
              rw[0][2 * STEPS - 2], rw[0][2 * STEPS - 1]);
    QT_EXPECT(dr <= 3e-2, "the rewards differ by %.3e relative L2 (bound 3e-2)", dr);
    QT_EXPECT(dad <= 3e-2, "the adapters' change differs by %.3e relative L2 (bound 3e-2)", dad);
    free(a0), free(a[0]), free(a[1]);
    qt_layout_free(&L);
}

/* On the GPU: 12 steps + resume + 12 steps equal 24 straight steps bit for bit. */
static void test_gpu_resume_bit_exact(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    resume_bit_exact("_gpu", GPU_SET, GPU_NSET, "adapter_model.safetensors");
}

/* The 8 steps' losses and the adapter export of a GPU run: grad_accum micro-batches a step on each of ranks ranks
 * (sharing GPU 0), with memory.recompute recompute. */
static void gpu_run(const char *tag, int grad_accum, int ranks, int recompute, float *loss, char **export, size_t *bytes) {
    static qt_config c;
    char y[4096], err[1024], path[512];
    QT_REQUIRE(qt_config_load_string(&c, yaml_of(y, sizeof y, tag, 8, ""), "t.yaml", GPU_SET, GPU_NSET, err, sizeof err) == 0,
               "%s", err);
    c.data.grad_accum = grad_accum;
    c.parallel.devices.n = ranks; /* [0, 0]: both on GPU 0 */
    c.memory.recompute = recompute;
    qt_train_opts o = {NULL, -1, 0, loss, NULL, NULL};
    QT_REQUIRE(qt_train_run(&c, &o, NULL, err, sizeof err) == 0, "%s: %s", tag, err);
    snprintf(path, sizeof path, "%s/ckpt_%s/export/adapter_model.safetensors", g_dir, tag);
    *export = qt_t_read_file(path, bytes);
}

/* On the GPU, the same bits (losses and adapter export) from one GPU accumulating two micro-batches, two data-parallel
 * ranks sharing GPU 0 with one each (the pairs' losses and stats summed over the ranks), and memory.recompute
 * [block] (the forward that the backward rebuilds is the policy's: adapters on). */
static void test_gpu_ranks_recompute_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    const char *tag[3] = {"one_gpu", "two_ranks", "recompute"};
    const int accum[3] = {2, 1, 2}, ranks[3] = {0, 2, 0}, rc[3] = {0, 0, QT_RC_BLOCK};
    float loss[3][8];
    char *ex[3];
    size_t bytes[3];
    for (int k = 0; k < 3; k++) gpu_run(tag[k], accum[k], ranks[k], rc[k], loss[k], &ex[k], &bytes[k]);
    for (int k = 1; k < 3; k++) {
        for (int s = 0; s < 8; s++)
            QT_EXPECT(!memcmp(&loss[0][s], &loss[k][s], 4), "%s, step %d: %.9g, one GPU %.9g", tag[k], s + 1, loss[k][s],
                      loss[0][s]);
        QT_EXPECT(ex[0] && ex[k] && bytes[0] == bytes[k] && bytes[0] > 0 && !memcmp(ex[0], ex[k], bytes[0]),
                  "%s: the adapter export differs from one GPU's (%zu vs %zu bytes)", tag[k], bytes[k], bytes[0]);
    }
    for (int k = 0; k < 3; k++) free(ex[k]);
}

/* "a+b=" on the GPU: the reward accuracy of the last 40 of 200 steps above 0.9, as on the CPU; the evaluations (every
 * 50 steps, on the same pairs) log the DPO fields, their last accuracy above 0.9 too. At optim.lr 3e-3: the CPU's
 * 1e-2 makes the GPU's bf16 run unstable at this shape (H200: gradient-norm spikes to 185, accuracy 0.869 over steps
 * 161-200, 0.953 without dropout; the CPU engine at the same shape, fp32: 0.981), 3e-3 reaches 1.000. */
static void test_gpu_arith_accuracy(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    const char *set[GPU_NSET + 4];
    char eval[600], log[512];
    snprintf(eval, sizeof eval, "data.eval=%s/arith_*.bin", g_dir);
    memcpy(set, GPU_SET, sizeof GPU_SET);
    set[GPU_NSET] = eval, set[GPU_NSET + 1] = "eval.every=50", set[GPU_NSET + 2] = "eval.batches=4";
    set[GPU_NSET + 3] = "optim.lr=0.003";
    arith_accuracy("arith_gpu", set, GPU_NSET + 4);
    snprintf(log, sizeof log, "%s/log_arith_gpu.jsonl", g_dir);
    size_t n;
    char *s = qt_t_read_file(log, &n), *last = NULL;
    QT_REQUIRE(s, "no log %s", log);
    for (char *p = strstr(s, "\"eval\""); p; p = strstr(p + 1, "\"eval\"")) last = p;
    char *f = last ? strstr(last, "\"dpo_accuracy\":") : NULL;
    double acc = f ? atof(f + 15) : -1;
    printf("  the last evaluation's reward accuracy: %.3f\n", acc);
    QT_EXPECT(acc > 0.9, "the last evaluation's dpo_accuracy: %g (expected > 0.9; no field: -1)", acc);
    free(s);
}

int main(void) {
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_dpo")) return 1;
    char path[512];
    snprintf(path, sizeof path, "%s/arith_0.bin", g_dir);
    write_arith(path, 5);
    QT_RUN(test_loss_matches_written);
    QT_RUN(test_row_weights);
    QT_RUN(test_loader_pairs);
    QT_RUN(test_refusals);
    QT_RUN(test_resume_bit_exact);
    QT_RUN(test_resume_bit_exact_full);
    QT_RUN(test_arith_accuracy);
    QT_RUN(test_arith_accuracy_full);
    QT_RUN(test_mutants_caught);
    QT_RUN(test_gpu_tracks_cpu);
    QT_RUN(test_gpu_resume_bit_exact);
    QT_RUN(test_gpu_ranks_recompute_bitwise);
    QT_RUN(test_gpu_arith_accuracy);
    return qt_test_end();
}
