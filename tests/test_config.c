/* test_config.c — config loading, every error kind and its message, overrides, dump round trip, docs.
 *
 * Run from the repository root (it reads configs/). `test_config --doc` prints the key table that
 * configs/README.md must contain. */
#include <glob.h>
#include <stdint.h>
#include <unistd.h>

#include "qt_comm.h"
#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_plan.h"
#include "qt_test.h"

/* Failure messages quote whole error strings and paths; cutting them at qt_t_msg's size is fine. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static qt_config cfg, cfg2; /* large (path buffers): static rather than on the stack */
static char err[2048];

/* Loads yaml (named "t.yaml") and expects failure with exactly msg. */
#define EXPECT_ERR(yaml, msg)                                                                      \
    do {                                                                                           \
        err[0] = 0;                                                                                \
        int rc_ = qt_config_load_string(&cfg, yaml, "t.yaml", NULL, 0, err, sizeof err);           \
        QT_EXPECT(rc_ == -1 && !strcmp(err, msg), "rc %d\n  got  %s\n  want %s", rc_, err, msg);  \
    } while (0)

static int load(const char *yaml, const char *const *ovr, int n) {
    err[0] = 0;
    return qt_config_load_string(&cfg, yaml, "t.yaml", ovr, n, err, sizeof err);
}

static void test_defaults(void) {
    qt_config d;
    qt_config_defaults(&d);
    QT_REQUIRE(load("", NULL, 0) == 0, "empty file: %s", err);
    const char *diff = NULL;
    QT_EXPECT(qt_config_equal(&d, &cfg, &diff), "empty file differs from defaults at %s", diff);
    QT_REQUIRE(load("# only a comment\n", NULL, 0) == 0, "comment-only file: %s", err);
    QT_EXPECT(load("~\n", NULL, 0) == 0, "null document: %s", err);
    QT_EXPECT(d.model.vocab_size == 256 && d.model.hidden_size == 128 && d.model.num_layers == 4 &&
                  d.model.num_heads == 4 && d.model.num_kv_heads == 2 && d.model.intermediate_size == 384 &&
                  d.model.rope_theta == 10000.f && d.model.rms_norm_eps == 1e-6f && d.model.max_seq_len == 256 &&
                  d.model.tie_embeddings == 1 && d.model.qkv_bias == 1 && d.model.arch == QT_ARCH_QWEN2,
              "tiny model defaults");
    QT_EXPECT(d.init.std == 0.02f && d.model_inline == 0 && d.hf_config[0] == 0 && d.init.from[0] == 0,
              "init defaults");
    QT_EXPECT(d.precision.matmul_dtype == QT_DT_BF16 && d.precision.opt_m_dtype == QT_DT_F32 && d.optim.decay_embeddings == 0 &&
                  d.optim.schedule == QT_SCHED_COSINE && d.device == QT_DEVICE_AUTO && d.parallel.comm == QT_COMM_AUTO &&
                  d.memory.lmhead_chunks == 1 && d.parallel.gpus == 0,
              "enum/bool defaults");
    /* Every default in the table parses and formats back to itself. */
    for (int i = 0; qt_config_key_at(i); i++) {
        const qt_config_key *k = qt_config_key_at(i);
        qt_config t;
        memset(&t, 0, sizeof t);
        QT_REQUIRE(qt_config_key_set(&t, k, k->def) == 0, "%s: default \"%s\" does not parse", k->path, k->def);
        char buf[QT_PATH_MAX + 8], want[QT_PATH_MAX + 8];
        qt_config_key_format(&t, k, buf, sizeof buf);
        if (k->type == QT_KEY_STRING) snprintf(want, sizeof want, "\"%s\"", k->def);
        else snprintf(want, sizeof want, "%s", k->def);
        QT_EXPECT(!strcmp(buf, want), "%s: default formats as %s, table says %s", k->path, buf, want);
    }
}

static void test_examples_load(void) {
    glob_t g;
    QT_REQUIRE(glob("configs/*.yaml", 0, NULL, &g) == 0, "no configs/*.yaml (run from the repo root)");
    int named = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *p = g.gl_pathv[i];
        int rc = qt_config_load(&cfg, p, NULL, 0, err, sizeof err);
        QT_EXPECT(rc == 0, "%s: %s", p, err);
        if (rc) continue;
        QT_EXPECT(!strcmp(cfg.path, p), "path %s", cfg.path);
        /* each run in a folder of its own, named after its file; no config reads another run's data */
        char run[QT_PATH_MAX];
        snprintf(run, sizeof run, "runs/%.*s", (int)(strlen(strrchr(p, '/') + 1) - 5), strrchr(p, '/') + 1);
        QT_EXPECT(!strcmp(cfg.run.dir, run) && !qt_config_given(&cfg, "checkpoint.dir") && !qt_config_given(&cfg, "log.file"),
                  "%s: run.dir %s, expected %s alone", p, cfg.run.dir, run);
        QT_EXPECT(!strstr(cfg.data.train, "runs/") && !strstr(cfg.data.eval, "runs/"), "%s: data in a run folder: %s", p,
                  cfg.data.train);
        if (strstr(p, "/tiny-cpu.yaml")) {
            named++;
            QT_EXPECT(cfg.data.seq_len == 128 && cfg.data.micro_batch == 8 && cfg.optim.steps == 300 && cfg.optim.warmup == 30 &&
                          cfg.optim.lr == 3e-3f && cfg.eval.every == 50 && cfg.optim.schedule == QT_SCHED_COSINE &&
                          cfg.model_inline && cfg.device == QT_DEVICE_AUTO,
                      "tiny-cpu values");
            QT_EXPECT(!strcmp(cfg.data.train, "") && !strcmp(cfg.data.eval, "") &&
                          !strcmp(cfg.checkpoint.dir, "runs/tiny-cpu/ckpt") && !strcmp(cfg.log.file, "runs/tiny-cpu/log.jsonl"),
                      "tiny-cpu paths: %s %s %s %s", cfg.data.train, cfg.data.eval, cfg.checkpoint.dir, cfg.log.file);
        } else if (strstr(p, "/llama-tiny.yaml")) {
            named++;
            QT_EXPECT(cfg.model.arch == QT_ARCH_LLAMA && !cfg.model.tie_embeddings && !cfg.model.qkv_bias,
                      "llama-tiny model");
        } else if (strstr(p, "/qwen2.5-0.5b-bf16.yaml") || strstr(p, "/qwen2.5-0.5b-fp8.yaml")) {
            named++;
            int fp8 = strstr(p, "fp8") != NULL;
            QT_EXPECT(cfg.model.hidden_size == 896 && cfg.model.num_layers == 24 && cfg.model.num_heads == 14 &&
                          cfg.model.num_kv_heads == 2 && cfg.model.intermediate_size == 4864 &&
                          cfg.model.vocab_size == 151936 && cfg.model.tie_embeddings && cfg.model.qkv_bias &&
                          cfg.model.rope_theta == 1e6f && cfg.model.rms_norm_eps == 1e-6f,
                      "%s: model", p);
            QT_EXPECT(cfg.data.seq_len == 1024 && cfg.data.micro_batch * cfg.data.grad_accum == 512 && !qt_config_given(&cfg, "perf.cuda_graphs") &&
                          !qt_config_given(&cfg, "data.micro_batch") && cfg.memory.plan && !qt_config_given(&cfg, "memory.plan") &&
                          cfg.device == QT_DEVICE_CUDA &&
                          cfg.precision.model_dtype == QT_DT_BF16 && cfg.precision.matmul_dtype == (fp8 ? QT_DT_E4M3 : QT_DT_BF16),
                      "%s: run", p);
        } else if (strstr(p, "/qwen2.5-1.5b-fp8.yaml")) {
            named++;
            QT_EXPECT(cfg.model.hidden_size == 1536 && cfg.model.num_layers == 28 && cfg.model.num_heads == 12 &&
                          cfg.model.num_kv_heads == 2 && cfg.model.intermediate_size == 8960 &&
                          cfg.model.vocab_size == 151936 && cfg.model.tie_embeddings &&
                          cfg.precision.matmul_dtype == QT_DT_E4M3,
                      "1.5b model");
        }
    }
    globfree(&g);
    QT_EXPECT(named == 5, "found %d of the 5 named example configs", named);
}

/* The Qwen3-8B example: arch qwen3 (q/k norms per head), head_dim 128 given, no q/k/v bias, untied. */
static void test_qwen3_example(void) {
    int rc = qt_config_load(&cfg, "configs/qwen3-8b-fp8.yaml", NULL, 0, err, sizeof err);
    QT_REQUIRE(rc == 0, "configs/qwen3-8b-fp8.yaml: %s", err);
    const qt_model_cfg *m = &cfg.model;
    QT_EXPECT(m->arch == QT_ARCH_QWEN3 && m->hidden_size == 4096 && m->num_layers == 36 && m->num_heads == 32 &&
                  m->num_kv_heads == 8 && m->head_dim == 128 && m->intermediate_size == 12288 && m->vocab_size == 151936 &&
                  !m->tie_embeddings && !m->qkv_bias && m->rope_theta == 1e6f && cfg.precision.matmul_dtype == QT_DT_E4M3,
              "qwen3-8b model: arch %d C %d L %d H %d/%d D %d", m->arch, m->hidden_size, m->num_layers, m->num_heads,
              m->num_kv_heads, m->head_dim);
    EXPECT_ERR("model:\n  arch: qwen4\n", "t.yaml:2:3: model.arch: expected one of qwen2|llama|qwen3|mistral|gemma3, got \"qwen4\"");
}

static void test_error_unknown_key(void) {
    EXPECT_ERR("optim:\n  lrr: 1\n", "t.yaml:2:3: optim.lrr: expected a known key (did you mean \"optim.lr\"?), got \"optim.lrr\"");
    EXPECT_ERR("data:\n  micro_bacth: 4\n",
               "t.yaml:2:3: data.micro_bacth: expected a known key (did you mean \"data.micro_batch\"?), got \"data.micro_bacth\"");
    /* The right key under the wrong section. */
    EXPECT_ERR("seed: 1\noptim:\n  seq_len: 64\n",
               "t.yaml:3:3: optim.seq_len: expected a known key (did you mean \"data.seq_len\"?), got \"optim.seq_len\"");
    EXPECT_ERR("optimm:\n  lr: 1\n", "t.yaml:1:1: optimm: expected a known key (did you mean \"optim\"?), got \"optimm\"");
    EXPECT_ERR("model:\n  hidden: 64\n",
               "t.yaml:2:3: model.hidden: expected a known key (did you mean \"model.hidden_size\"?), got \"model.hidden\"");
    EXPECT_ERR("banana: 1\n", "t.yaml:1:1: banana: expected a known key (see configs/README.md), got \"banana\"");
    /* A key under a known section is not answered with the section, nor with a key it barely shares. */
    EXPECT_ERR("optim:\n  b: 1\n", "t.yaml:2:3: optim.b: expected a known key (see configs/README.md), got \"optim.b\"");
    EXPECT_ERR("data:\n  x: 1\n", "t.yaml:2:3: data.x: expected a known key (see configs/README.md), got \"data.x\"");
    EXPECT_ERR("optimm:\n  lr: 1\n", "t.yaml:1:1: optimm: expected a known key (did you mean \"optim\"?), got \"optimm\"");
}

static void test_error_type_and_range(void) {
    EXPECT_ERR("optim:\n  lr: fast\n", "t.yaml:2:3: optim.lr: expected a number > 0, got \"fast\"");
    EXPECT_ERR("optim:\n  lr: 0\n", "t.yaml:2:3: optim.lr: expected a number > 0, got \"0\"");
    EXPECT_ERR("optim:\n  lr: .nan\n", "t.yaml:2:3: optim.lr: expected a number > 0, got \".nan\"");
    /* A number beyond (or below) the 32-bit float range says so, rather than only repeating the range. */
    EXPECT_ERR("optim:\n  lr: 1e39\n",
               "t.yaml:2:3: optim.lr: expected a number > 0, got \"1e39\" (beyond the 32-bit float range, |x| <= 3.4e38)");
    EXPECT_ERR("optim:\n  weight_decay: 1e-50\n",
               "t.yaml:2:3: optim.weight_decay: expected a number >= 0, got \"1e-50\" (below the 32-bit float range: it rounds to 0)");
    EXPECT_ERR("optim:\n    beta2: 1\n", "t.yaml:2:5: optim.beta2: expected a number in [0, 1), got \"1\"");
    EXPECT_ERR("optim:\n  final_lr_frac: -0.5\n",
               "t.yaml:2:3: optim.final_lr_frac: expected a number in [0, 1], got \"-0.5\"");
    EXPECT_ERR("data:\n  seq_len: 1.5\n", "t.yaml:2:3: data.seq_len: expected an integer >= 1, got \"1.5\"");
    EXPECT_ERR("data:\n  micro_batch: 0\n", "t.yaml:2:3: data.micro_batch: expected an integer >= 1, got \"0\"");
    EXPECT_ERR("data:\n  grad_accum: 3000000000\n",
               "t.yaml:2:3: data.grad_accum: expected an integer >= 1, got \"3000000000\"");
    EXPECT_ERR("model:\n  qkv_bias: maybe\n", "t.yaml:2:3: model.qkv_bias: expected true or false, got \"maybe\"");
    EXPECT_ERR("optim:\n  schedule: cosin\n",
               "t.yaml:2:3: optim.schedule: expected one of cosine|linear|wsd, got \"cosin\"");
    EXPECT_ERR("precision:\n  matmul_dtype: fp32\n",
               "t.yaml:2:3: precision.matmul_dtype: expected one of bf16|e4m3, got \"fp32\"");
    EXPECT_ERR("seed: -1\n", "t.yaml:1:1: seed: expected an integer in [0, 2^64), got \"-1\"");
    EXPECT_ERR("seed: 18446744073709551616\n",
               "t.yaml:1:1: seed: expected an integer in [0, 2^64), got \"18446744073709551616\"");
    /* Quoted numbers are accepted: the key's type decides, not the YAML tag. */
    QT_EXPECT(load("optim:\n  lr: \"3e-4\"\n  decay_embeddings: yes\n", NULL, 0) == 0 && cfg.optim.lr == 3e-4f &&
                  cfg.optim.decay_embeddings == 1,
              "quoted number: %s", err);
    char big[QT_PATH_MAX + 64];
    int n = snprintf(big, sizeof big, "log:\n  file: ");
    memset(big + n, 'a', QT_PATH_MAX);
    big[n + QT_PATH_MAX] = 0;
    QT_EXPECT(load(big, NULL, 0) == -1 && strstr(err, "t.yaml:2:3: log.file: expected a string of at most 1023 bytes"),
              "long string: %s", err);
}

static void test_error_structure(void) {
    EXPECT_ERR("optim: 3\n", "t.yaml:1:1: optim: expected a mapping of optim.* keys, got \"3\"");
    EXPECT_ERR("optim:\n  - lr\n", "t.yaml:1:1: optim: expected a mapping of optim.* keys, got a sequence");
    EXPECT_ERR("optim:\n  lr: {a: 1}\n", "t.yaml:2:3: optim.lr: expected a number > 0, got a mapping");
    EXPECT_ERR("data:\n  train: [a, b]\n",
               "t.yaml:2:3: data.train: expected a string of at most 1023 bytes, got a sequence");
    EXPECT_ERR("- a\n- b\n", "t.yaml:1:1: expected a mapping of config keys, got a sequence");
    EXPECT_ERR("hello\n", "t.yaml:1:1: expected a mapping of config keys, got \"hello\"");
    EXPECT_ERR("seed: 1\n---\nseed: 2\n", "t.yaml:2:1: expected one YAML document, got a second one");
    EXPECT_ERR("optim:\n  lr: 1\n  steps: 5\n  lr: 2\n",
               "t.yaml:4:3: optim.lr: expected each key once (first at line 2), got it again");
    EXPECT_ERR("optim:\n  lr: 1\ndata:\n  seq_len: 8\noptim:\n  steps: 5\n",
               "t.yaml:5:1: optim: expected each key once (first at line 1), got it again");
    EXPECT_ERR("optim:\n  lr: *a\n",
               "t.yaml:2:3: optim.lr: expected a number > 0, got an alias (quote values that start with '*')");
}

static void test_error_syntax(void) {
    QT_EXPECT(load("optim:\n  lr: 1\n  steps: 5: 6\n", NULL, 0) == -1, "'5: 6' accepted");
    int line = 0, col = 0;
    QT_EXPECT(sscanf(err, "t.yaml:%d:%d: YAML syntax error: ", &line, &col) == 2 && line == 3 && col >= 3 &&
                  strstr(err, "YAML syntax error"),
              "message: %s", err);
    QT_EXPECT(load("optim:\n  lr: 1\n bad: 2\n", NULL, 0) == -1 && !strncmp(err, "t.yaml:3:", 9) &&
                  strstr(err, "YAML syntax error"),
              "bad indent: %s", err);
    QT_EXPECT(load("log:\n  file: \"unterminated\n", NULL, 0) == -1 && !strncmp(err, "t.yaml:", 7) &&
                  strstr(err, "YAML syntax error"),
              "unterminated quote: %s", err);
}

static void test_error_files(void) {
    const char *missing = "/nonexistent-qtrain/x.yaml";
    QT_EXPECT(qt_config_load(&cfg, missing, NULL, 0, err, sizeof err) == -1 &&
                  !strcmp(err, "/nonexistent-qtrain/x.yaml: expected a readable YAML file, got \"No such file or directory\""),
              "missing file: %s", err);
    char path[] = "/tmp/qt_test_config_XXXXXX";
    int fd = mkstemp(path);
    QT_REQUIRE(fd >= 0, "mkstemp");
    const char *text = "# a comment\noptim:\n  steps: 10\n  lr: fast\n";
    QT_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write");
    close(fd);
    char want[256];
    snprintf(want, sizeof want, "%s:4:3: optim.lr: expected a number > 0, got \"fast\"", path);
    QT_EXPECT(qt_config_load(&cfg, path, NULL, 0, err, sizeof err) == -1 && !strcmp(err, want), "got %s\nwant %s",
              err, want);
    unlink(path);
    /* A directory opens on Linux and then fails to read: say what it is. */
    QT_EXPECT(qt_config_load(&cfg, "configs", NULL, 0, err, sizeof err) == -1 &&
                  !strcmp(err, "configs: expected a YAML file, got a directory"),
              "directory: %s", err);
}

static void test_cross_checks(void) {
    EXPECT_ERR("optim:\n  steps: 100\n  warmup: 60\n  cooldown: 50\n  schedule: wsd\n",
               "t.yaml:3:3: optim.warmup: expected warmup + cooldown <= steps (100), got \"60\"");
    EXPECT_ERR("optim:\n  steps: 100\n  cooldown: 150\n",
               "t.yaml:3:3: optim.cooldown: expected warmup + cooldown <= steps (100), got \"150\"");
    QT_EXPECT(load("optim:\n  steps: 100\n  warmup: 50\n  cooldown: 50\n", NULL, 0) == 0, "sum == steps: %s", err);
    EXPECT_ERR("data:\n  seq_len: 512\n", "t.yaml:2:3: data.seq_len: expected <= model.max_seq_len (256), got \"512\"");
    EXPECT_ERR("model:\n  max_seq_len: 64\n", "t.yaml:2:3: model.max_seq_len: expected >= data.seq_len (256), got \"64\"");
    /* The model comes from elsewhere: its max_seq_len is not known here. */
    QT_EXPECT(load("model:\n  hf_config: m/config.json\ndata:\n  seq_len: 4096\n", NULL, 0) == 0 && !cfg.model_inline,
              "hf_config + long seq: %s", err);
    EXPECT_ERR("model:\n  hf_config: m/config.json\n  hidden_size: 896\n  num_layers: 3\n",
               "t.yaml:3:3: model.hidden_size: expected no inline model keys when model.hf_config is set, got \"896\"");
    EXPECT_ERR("model:\n  num_layers: 3\n  hf_config: m/config.json\n",
               "t.yaml:2:3: model.num_layers: expected no inline model keys when model.hf_config is set, got \"3\"");
    QT_EXPECT(load("model:\n  hf_config: \"\"\n  num_layers: 3\n", NULL, 0) == 0 && cfg.model_inline, "empty hf_config: %s", err);
    /* init.from's config.json defines the model: inline keys would silently be mixed with it. */
    EXPECT_ERR("init:\n  from: hf/qwen\nmodel:\n  num_layers: 2\n",
               "t.yaml:4:3: model.num_layers: expected no inline model keys when init.from is set (its config.json "
               "defines the model), got \"2\"");
    QT_EXPECT(load("init:\n  from: hf/qwen\nmodel:\n  hf_config: hf/qwen/config.json\n", NULL, 0) == 0,
              "init.from + hf_config: %s", err);
}

/* The inline model's shape is checked when the file is read, at the key that breaks it. */
static void test_model_shape(void) {
    /* hidden 64 over 6 heads used to train with head_dim 10 (64 / 6 truncated). */
    EXPECT_ERR("model:\n  hidden_size: 64\n  num_heads: 6\n  num_kv_heads: 2\n",
               "t.yaml:3:3: model.head_dim: unset, and hidden_size (64) is not a multiple of num_heads (6); set "
               "head_dim or change num_heads");
    QT_EXPECT(load("model:\n  hidden_size: 64\n  num_heads: 6\n  num_kv_heads: 2\n  head_dim: 10\n", NULL, 0) == 0,
              "explicit head_dim: %s", err);
    EXPECT_ERR("model:\n  num_layers: 2\n  num_kv_heads: 3\n",
               "t.yaml:3:3: model.num_kv_heads: expected a divisor of num_heads (4), got 3");
    EXPECT_ERR("model:\n  head_dim: 7\n", "t.yaml:2:3: model.head_dim: expected an even number (rotary pairs), got 7");
    /* Sizes whose products overflow: used to wrap the parameter count and write past a buffer. */
    EXPECT_ERR("model:\n  hidden_size: 4\n  num_heads: 1073741824\n  num_kv_heads: 1073741824\n  head_dim: 1073741824\n"
               "  qkv_bias: false\n",
               "t.yaml:5:3: model.head_dim: (num_heads + 2 * num_kv_heads) * head_dim = (1073741824 + 2 * 1073741824) "
               "* 1073741824, expected at most 2^31 - 1 rows of the fused q|k|v matrix");
    EXPECT_ERR("model:\n  hidden_size: 65536\n  intermediate_size: 1000000\n  num_layers: 1000\n",
               "t.yaml:2:3: model: hidden_size 65536, num_layers 1000, intermediate_size 1000000, vocab_size 256, "
               "4 + 2 x 2 heads of 16384 give 2.095e+14 parameters, expected at most 2^40");
    EXPECT_ERR("model:\n  num_layers: 1000000\n", "t.yaml:2:3: model.num_layers: expected at most 65536, got 1000000");
    EXPECT_ERR("model:\n  intermediate_size: 2000000000\n",
               "t.yaml:2:3: model.intermediate_size: expected at most 2^30 - 1 (gate|up rows fused), got 2000000000");
    EXPECT_ERR("data:\n  seq_len: 100000\n  micro_batch: 100000\nmodel:\n  max_seq_len: 100000\n",
               "t.yaml:3:3: data.micro_batch: expected micro_batch x seq_len <= 2^31 - 1 tokens, got 100000 x 100000");
    /* An override is blamed when it breaks the shape. */
    const char *o[] = {"model.num_heads=6"};
    QT_EXPECT(load("model:\n  hidden_size: 64\n", o, 1) == -1 &&
                  !strcmp(err, "--set model.num_heads=6: model.head_dim: unset, and hidden_size (64) is not a multiple "
                               "of num_heads (6); set head_dim or change num_heads"),
              "override: %s", err);
}

/* precision.model_dtype: fp32 was parsed and documented but the GPU trained bf16 anyway. */
/* Sliding window: the keys load, the per-layer rule follows them, and a rule the family's HF config
 * cannot say is refused at the key that breaks it. */
static void test_model_window(void) {
    QT_REQUIRE(load("model:\n  arch: mistral\n  qkv_bias: false\n  sliding_window: 16\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.model.arch == QT_ARCH_MISTRAL && cfg.model.sliding_window == 16 &&
                  qt_model_layer_window(&cfg.model, 0) == 16 && qt_model_layer_window(&cfg.model, 3) == 16,
              "mistral: window %d, layers %d %d", cfg.model.sliding_window, qt_model_layer_window(&cfg.model, 0),
              qt_model_layer_window(&cfg.model, 3));
    QT_REQUIRE(load("model:\n  sliding_window: 8\n  window_layers_from: 2\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(qt_model_layer_window(&cfg.model, 1) == 0 && qt_model_layer_window(&cfg.model, 2) == 8 &&
                  qt_model_layer_window(&cfg.model, 3) == 8,
              "qwen2 from layer 2: %d %d %d", qt_model_layer_window(&cfg.model, 1), qt_model_layer_window(&cfg.model, 2),
              qt_model_layer_window(&cfg.model, 3));
    QT_REQUIRE(load("model:\n  window_layers_from: 2\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(qt_model_layer_window(&cfg.model, 3) == 0, "no window: layer 3 has %d", qt_model_layer_window(&cfg.model, 3));
    EXPECT_ERR("model:\n  arch: llama\n  qkv_bias: false\n  sliding_window: 8\n",
               "t.yaml:4:3: model.sliding_window: expected 0 for llama (transformers' Llama has no sliding window), got 8; "
               "use arch mistral or qwen2");
    EXPECT_ERR("model:\n  arch: mistral\n  qkv_bias: false\n  sliding_window: 8\n  window_layers_from: 1\n",
               "t.yaml:5:3: model.window_layers_from: expected 0 for mistral (every layer has the window), got 1; use arch qwen2");
    EXPECT_ERR("model:\n  sliding_window: -1\n", "t.yaml:2:3: model.sliding_window: expected an integer >= 0, got \"-1\"");
}

static void test_model_dtype(void) {
    EXPECT_ERR("precision:\n  model_dtype: fp32\n", "t.yaml:2:3: precision.model_dtype: expected one of bf16, got \"fp32\"");
    QT_EXPECT(load("precision:\n  model_dtype: bf16\n", NULL, 0) == 0 && cfg.precision.model_dtype == QT_DT_BF16, "%s", err);
}

/* memory.offload: the list sets offload_optimizer / offload_residual; parts of the optimizer state are
 * offloaded on their own; a disagreeing older key is refused naming the key; weights run on one GPU without
 * CUDA graphs (fp8: weight cache none), refused otherwise naming the key; quants needs weights and an fp8
 * forward and backward (with ZeRO-3, e4m3 gathers). */
static void test_offload_list(void) {
    QT_REQUIRE(load("memory:\n  offload: [master, m, v, residual]\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.memory.offload_optimizer == 1 && cfg.memory.offload_residual == 1, "optimizer %d residual %d",
              cfg.memory.offload_optimizer, cfg.memory.offload_residual);
    QT_REQUIRE(load("memory:\n  offload: [residual]\n  offload_residual: true\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.memory.offload_optimizer == 0 && cfg.memory.offload_residual == 1, "residual only");
    QT_EXPECT(qt_config_opt_offload_mask(&cfg) == 0, "no optimizer offload: mask %d", qt_config_opt_offload_mask(&cfg));
    static const struct { const char *list; int mask; } parts[] = {
        {"[master]", QT_OFF_MASTER}, {"[m]", QT_OFF_M}, {"[v, residual]", QT_OFF_V}, {"[master, m]", QT_OFF_MASTER | QT_OFF_M},
        {"[m, v]", QT_OFF_M | QT_OFF_V}, {"[master, m, v]", QT_OFF_OPTIMIZER}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char y[96];
        snprintf(y, sizeof y, "memory:\n  offload: %s\n", parts[i].list);
        QT_REQUIRE(load(y, NULL, 0) == 0, "%s: %s", parts[i].list, err);
        QT_EXPECT(cfg.memory.offload_optimizer == 1 && qt_config_opt_offload_mask(&cfg) == parts[i].mask,
                  "%s: offload_optimizer %d, mask %d", parts[i].list, cfg.memory.offload_optimizer,
                  qt_config_opt_offload_mask(&cfg));
    }
    QT_REQUIRE(load("memory:\n  offload_optimizer: true\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(qt_config_opt_offload_mask(&cfg) == QT_OFF_OPTIMIZER, "offload_optimizer alone: all three");
    /* memory.zero_copy and memory.host_alloc */
    QT_REQUIRE(load("memory:\n  offload: [m, v]\n  zero_copy: true\n  host_alloc: write_combined\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.memory.zero_copy == 1 && cfg.memory.host_alloc == QT_HOST_WRITE_COMBINED, "zero_copy %d host_alloc %d",
              cfg.memory.zero_copy, cfg.memory.host_alloc);
    EXPECT_ERR("memory:\n  zero_copy: true\n",
               "t.yaml:2:3: memory.zero_copy: expected false without an offloaded optimizer state (memory.offload_optimizer, "
               "or master, m, v in memory.offload): zero copy is how AdamW reads the offloaded state, got true");
    EXPECT_ERR("memory:\n  offload: [master, weights]\nprecision:\n  master_dtype: bf16\n",
               "t.yaml:2:3: memory.offload: expected m or v beside master with precision.master_dtype: bf16 (a bf16 master "
               "has no master array to offload: the bf16 weights are the master), got only master");
    EXPECT_ERR("memory:\n  host_alloc: cached\n", "t.yaml:2:3: memory.host_alloc: expected one of pinned|write_combined, got \"cached\"");
    EXPECT_ERR("memory:\n  offload: [m]\n  offload_optimizer: false\n",
               "t.yaml:3:3: memory.offload_optimizer: expected true, as memory.offload says, got false");
    /* quants: the offloaded weights' e4m3 codes (fp8 matmuls and backward); one GPU copies them up, ZeRO-3 gathers them */
#define F8 "precision:\n  matmul_dtype: e4m3\n  grad_dtype: e4m3\nperf:\n  cuda_graphs: false\n"
    QT_REQUIRE(load("memory:\n  offload: [weights, quants]\n" F8, NULL, 0) == 0, "%s", err);
    QT_EXPECT((cfg.memory.offload & (QT_OFF_WEIGHTS | QT_OFF_QUANTS)) == (QT_OFF_WEIGHTS | QT_OFF_QUANTS), "quants: offload %d",
              cfg.memory.offload);
    QT_REQUIRE(load("memory:\n  offload: [weights, quants]\n" F8 "parallel:\n  devices: [0, 0]\n  zero: 3\n", NULL, 0) == 0,
               "%s", err);
    EXPECT_ERR("memory:\n  offload: [quants]\n" F8,
               "t.yaml:2:3: memory.offload: expected weights with quants: the fp8 codes that live in host memory are those of "
               "the offloaded weights (with the weights on the GPU, memory.fp8_weight_cache: none keeps two layers' quants only)");
    EXPECT_ERR("memory:\n  offload: [weights, quants]\nperf:\n  cuda_graphs: false\n",
               "t.yaml:2:3: memory.offload: expected precision.matmul_dtype: e4m3 and grad_dtype e4m3 or e5m2 with quants: "
               "the layers' e4m3 codes replace their bf16 weights on the GPU, which a bf16 matmul or backward would need");
    EXPECT_ERR("memory:\n  offload: [weights, quants]\n" F8 "parallel:\n  devices: [0, 0]\n  zero: 3\n  gather_dtype: bf16\n",
               "t.yaml:11:3: parallel.gather_dtype: expected e4m3 (or the key left out) with memory.offload: [weights, quants], "
               "got \"bf16\": with ZeRO-3 the quants offloaded are the rank's e4m3 pieces, gathered as codes");
#undef F8
    /* gradients: one GPU, fp32 or bf16 (ZeRO-2/3: fp32, refused below) */
    QT_REQUIRE(load("memory:\n  offload: [gradients, master, m, v]\nparallel:\n  gpus: 1\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT((cfg.memory.offload & QT_OFF_GRADIENTS) && cfg.memory.offload_optimizer, "gradients: offload %d",
              cfg.memory.offload);
    QT_REQUIRE(load("memory:\n  offload: [gradients]\nprecision:\n  grad_accum_dtype: bf16\nparallel:\n  gpus: 1\n", NULL, 0) == 0,
               "%s", err);
    QT_EXPECT(cfg.precision.grad_accum_dtype == QT_DT_BF16, "bf16 offloaded gradients");
    EXPECT_ERR("memory:\n  offload: [gradients]\nparallel:\n  devices: [0, 0]\n",
               "t.yaml:4:3: parallel.devices: expected one GPU (parallel.gpus: 1) or parallel.zero: 2 or 3 with "
               "memory.offload: [gradients]: with several ranks the offloaded gradients are the rank's ZeRO-2 shard");
    EXPECT_ERR("memory:\n  offload: [gradients]\nparallel:\n  gpus: 2\n  zero: 1\n",
               "t.yaml:4:3: parallel.gpus: expected one GPU (parallel.gpus: 1) or parallel.zero: 2 or 3 with "
               "memory.offload: [gradients]: with several ranks the offloaded gradients are the rank's ZeRO-2 shard");
    /* gradients with several ranks: ZeRO-2 and 3 offload the rank's gradient shard */
    for (int z = 2; z <= 3; z++) {
        char y[160];
        snprintf(y, sizeof y, "memory:\n  offload: [gradients]\nparallel:\n  devices: [0, 0]\n  zero: %d\nperf:\n  "
                 "cuda_graphs: false\n", z);
        QT_REQUIRE(load(y, NULL, 0) == 0, "gradients, zero %d: %s", z, err);
        QT_EXPECT((cfg.memory.offload & QT_OFF_GRADIENTS) && cfg.parallel.zero == z, "zero %d: offload %d", z,
                  cfg.memory.offload);
    }
    /* weights: one GPU, no CUDA graphs, fp8 quantized from the weight slots (cache none implied) */
    QT_REQUIRE(load("memory:\n  offload: [weights]\nparallel:\n  gpus: 1\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT((cfg.memory.offload & QT_OFF_WEIGHTS) && !cfg.memory.offload_optimizer && !cfg.perf.cuda_graphs,
              "weights only: offload %d optimizer %d graphs %d", cfg.memory.offload, cfg.memory.offload_optimizer,
              cfg.perf.cuda_graphs);
    QT_REQUIRE(load("memory:\n  offload: [weights, master, m, v]\nprecision:\n  matmul_dtype: e4m3\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.memory.offload_optimizer && cfg.memory.fp8_weight_cache == QT_FP8_WCACHE_NONE, "fp8 cache %d",
              cfg.memory.fp8_weight_cache);
    EXPECT_ERR("memory:\n  offload: [weights]\nperf:\n  cuda_graphs: true\n",
               "t.yaml:4:3: perf.cuda_graphs: expected false with memory.offload: [weights], got \"true\": the weights "
               "come up into weight slots picked as each micro-step runs, which a captured graph would replay stale; set "
               "perf.cuda_graphs: false");
    EXPECT_ERR("memory:\n  offload: [weights]\n  fp8_weight_cache: all\nprecision:\n  matmul_dtype: e4m3\n",
               "t.yaml:3:3: memory.fp8_weight_cache: expected none with memory.offload: [weights] and "
               "precision.matmul_dtype: e4m3, got \"all\": the GPU holds no layer's bf16 weights outside its weight slot, "
               "so each layer is quantized from its slot at use (the same bits); give none, or leave the key out");
    EXPECT_ERR("memory:\n  offload: [weights]\nparallel:\n  devices: [0, 0]\n",
               "t.yaml:4:3: parallel.devices: expected one GPU (parallel.gpus: 1, parallel.zero 0 or 1) or parallel.zero: 3 "
               "with memory.offload: [weights]: with several ranks the offloaded bf16 weights are the rank's ZeRO-3 pieces");
    EXPECT_ERR("parallel:\n  zero: 2\nmemory:\n  offload: [weights]\n",
               "t.yaml:2:3: parallel.zero: expected one GPU (parallel.gpus: 1, parallel.zero 0 or 1) or parallel.zero: 3 "
               "with memory.offload: [weights]: with several ranks the offloaded bf16 weights are the rank's ZeRO-3 pieces");
    /* weights with ZeRO-3 ranks: the rank's pieces (and its gradient shard), no CUDA graphs */
    QT_REQUIRE(load("memory:\n  offload: [weights, gradients]\nparallel:\n  devices: [0, 0]\n  zero: 3\nperf:\n  "
                    "cuda_graphs: false\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT((cfg.memory.offload & (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS)) == (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS) &&
                  cfg.parallel.zero == 3, "zero 3: offload %d", cfg.memory.offload);
    const char *ow[] = {"memory.offload=[weights]", "parallel.gpus=2"};
    QT_EXPECT(load("", ow, 2) == -1 && strstr(err, "parallel.gpus: expected one GPU"), "--set: %s", err);
    EXPECT_ERR("memory:\n  offload_optimizer: true\n  offload: [residual]\n",
               "t.yaml:2:3: memory.offload_optimizer: expected false, as memory.offload says, got true");
}

/* A planner key given as auto is left to memory.plan: auto (its value kept, not given); with the
 * plan manual it is refused naming the key. */
static void test_plan_keys_auto(void) {
    const char *file = "data:\n  micro_batch: 4\n  grad_accum: 128\nmemory:\n  plan: auto\n  recompute: [ffn]\n";
    const char *o[] = {"data.micro_batch=auto", "memory.recompute=auto", "parallel.zero=auto"};
    QT_REQUIRE(load(file, o, 3) == 0, "%s", err);
    QT_EXPECT(cfg.data.micro_batch == 4 && cfg.data.grad_accum == 128 && !qt_config_given(&cfg, "data.micro_batch") &&
                  qt_config_given(&cfg, "data.grad_accum") && !qt_config_given(&cfg, "memory.recompute") &&
                  !qt_config_given(&cfg, "parallel.zero") && cfg.parallel.zero == 1,
              "micro_batch %d given %d, recompute given %d", cfg.data.micro_batch, qt_config_given(&cfg, "data.micro_batch"),
              qt_config_given(&cfg, "memory.recompute"));
    EXPECT_ERR("memory:\n  plan: manual\ndata:\n  micro_batch: auto\n",
               "t.yaml:4:3: data.micro_batch: expected a value: auto leaves the key to memory.plan: auto, and memory.plan is manual");
    EXPECT_ERR("data:\n  grad_accum: auto\nmemory:\n  plan: auto\n",
               "t.yaml:2:3: data.grad_accum: expected an integer >= 1, got \"auto\"");
    QT_EXPECT(qt_config_plan_key("memory.offload_residual") && !qt_config_plan_key("optim.lr"), "plan key list");
}

static void test_overrides(void) {
    const char *file = "optim:\n  lr: 1e-3\n  steps: 200\n";
    const char *o1[] = {"optim.lr=3e-4", "optim.warmup=20", "data.train=\"*.bin\"", "log.every=5",
                        "model.head_dim=32", "optim.lr=5e-4"};
    QT_REQUIRE(load(file, o1, 6) == 0, "%s", err);
    QT_EXPECT(cfg.optim.lr == 5e-4f && cfg.optim.steps == 200 && cfg.optim.warmup == 20 && !strcmp(cfg.data.train, "*.bin") &&
                  cfg.log.every == 5 && cfg.model.head_dim == 32 && cfg.model_inline,
              "override values lr %g warmup %d train %s", cfg.optim.lr, cfg.optim.warmup, cfg.data.train);
    const char *o2[] = {"data.eval=", "export.dir='a b: c'"};
    QT_REQUIRE(load("data:\n  eval: x\n", o2, 2) == 0, "%s", err);
    QT_EXPECT(cfg.data.eval[0] == 0 && !strcmp(cfg.export.dir, "a b: c"), "eval %s export %s", cfg.data.eval,
              cfg.export.dir);
    const char *bad[] = {"optim.lr=fast"};
    QT_EXPECT(load(file, bad, 1) == -1 && !strcmp(err, "--set optim.lr=fast: optim.lr: expected a number > 0, got \"fast\""),
              "bad override: %s", err);
    const char *unk[] = {"optim.lrr=1"};
    QT_EXPECT(load(file, unk, 1) == -1 &&
                  !strcmp(err, "--set optim.lrr=1: optim.lrr: expected a known key (did you mean \"optim.lr\"?), got \"optim.lrr\""),
              "unknown override: %s", err);
    const char *noeq[] = {"optim.lr"};
    QT_EXPECT(load(file, noeq, 1) == -1 && !strcmp(err, "--set optim.lr: expected key=value, got \"optim.lr\""),
              "no '=': %s", err);
    const char *map[] = {"optim.lr={a: 1}"};
    QT_EXPECT(load(file, map, 1) == -1 && !strcmp(err, "--set optim.lr={a: 1}: optim.lr: expected a number > 0, got a mapping"),
              "mapping override: %s", err);
    const char *sect[] = {"optim=3"};
    QT_EXPECT(load(file, sect, 1) == -1 && strstr(err, "--set optim=3: optim: expected a key of the section optim (optim.lr, ") &&
                  !strstr(err, "did you mean"), "section: %s", err);
    const char *model[] = {"model=5"};
    QT_EXPECT(load(file, model, 1) == -1 && strstr(err, "--set model=5: optim: expected a key of the section model (") == NULL &&
                  strstr(err, "--set model=5: model: expected a key of the section model (model.hf_config, "), "model section: %s", err);
    /* A --set that breaks a rule with a key of the file is reported at the --set, not at the file's line. */
    const char *steps[] = {"optim.steps=5"};
    QT_EXPECT(load("optim:\n  warmup: 30\n", steps, 1) == -1 &&
                  !strcmp(err, "--set optim.steps=5: optim.steps: expected >= warmup + cooldown (30), got \"5\""),
              "steps override against the file's warmup: %s", err);
    const char *msl[] = {"model.max_seq_len=64"};
    QT_EXPECT(load("data:\n  seq_len: 128\n", msl, 1) == -1 &&
                  !strcmp(err, "--set model.max_seq_len=64: model.max_seq_len: expected >= data.seq_len (128), got \"64\""),
              "max_seq_len override against the file's seq_len: %s", err);
    /* An override that breaks a cross-field rule is reported at the override. */
    const char *cross[] = {"optim.warmup=500"};
    QT_EXPECT(load(file, cross, 1) == -1 &&
                  !strcmp(err, "--set optim.warmup=500: optim.warmup: expected warmup + cooldown <= steps (200), got \"500\""),
              "cross override: %s", err);
    const char *hf[] = {"model.hf_config=c.json"};
    QT_EXPECT(load("model:\n  num_layers: 2\n", hf, 1) == -1 &&
                  !strcmp(err, "t.yaml:2:3: model.num_layers: expected no inline model keys when model.hf_config is set, got \"2\""),
              "hf_config override: %s", err);
}

/* run.dir moves checkpoint.dir and log.file; keys given still win; data.eval follows data.train's
 * tools/tokenize layout unless given; a dump reads back deriving them again. */
static void test_run_dir(void) {
    const char *mine[] = {"run.dir=runs/mine", "data.train=data/mine/train_*.bin"};
    QT_REQUIRE(load("run:\n  dir: runs/x\n", mine, 2) == 0, "%s", err);
    QT_EXPECT(!strcmp(cfg.checkpoint.dir, "runs/mine/ckpt") && !strcmp(cfg.log.file, "runs/mine/log.jsonl") &&
                  !strcmp(cfg.data.eval, "data/mine/eval_*.bin"),
              "derived: %s %s %s", cfg.checkpoint.dir, cfg.log.file, cfg.data.eval);
    const char *own[] = {"run.dir=runs/mine", "checkpoint.dir=elsewhere", "data.train=d/tr.bin", "data.eval="};
    QT_REQUIRE(load("log:\n  file: my.jsonl\n", own, 4) == 0, "%s", err);
    QT_EXPECT(!strcmp(cfg.checkpoint.dir, "elsewhere") && !strcmp(cfg.log.file, "my.jsonl") && !cfg.data.eval[0],
              "given keys win: %s %s %s", cfg.checkpoint.dir, cfg.log.file, cfg.data.eval);
    QT_REQUIRE(load("data:\n  train: 'shards/*.bin'\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(!strcmp(cfg.checkpoint.dir, "ckpt") && !cfg.log.file[0] && !cfg.data.eval[0],
              "no run.dir, no train_ prefix: %s %s %s", cfg.checkpoint.dir, cfg.log.file, cfg.data.eval);
    QT_REQUIRE(load("run:\n  dir: runs/a\n", mine + 1, 1) == 0, "%s", err);
    static char buf[1 << 16];
    qt_config_dump(&cfg, buf, sizeof buf);
    const char *moved[] = {"run.dir=runs/b"};
    QT_REQUIRE(qt_config_load_string(&cfg2, buf, "dump.yaml", moved, 1, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(!strcmp(cfg2.checkpoint.dir, "runs/b/ckpt") && !strcmp(cfg2.log.file, "runs/b/log.jsonl"),
              "a dump keeps the paths derived: %s %s", cfg2.checkpoint.dir, cfg2.log.file);
}

static void check_roundtrip(const char *what) {
    static char buf[1 << 16];
    size_t n = qt_config_dump(&cfg, buf, sizeof buf);
    QT_REQUIRE(n > 0 && n < sizeof buf, "%s: dump length %zu", what, n);
    QT_REQUIRE(qt_config_dump(&cfg, NULL, 0) == n, "%s: length-only dump differs", what);
    int rc = qt_config_load_string(&cfg2, buf, "dump.yaml", NULL, 0, err, sizeof err);
    QT_REQUIRE(rc == 0, "%s: dump does not load: %s\n%s", what, err, buf);
    const char *diff = "?";
    QT_EXPECT(qt_config_equal(&cfg, &cfg2, &diff), "%s: %s differs after the round trip", what, diff);
    for (int i = 0; qt_config_key_at(i); i++) {
        const char *p = qt_config_key_at(i)->path, *leaf = strrchr(p, '.') ? strrchr(p, '.') + 1 : p;
        char pat[128], commented[128]; /* unset inline model keys and derived paths are written as comments */
        snprintf(pat, sizeof pat, "\n%s%s: ", strchr(p, '.') ? "  " : "", leaf);
        snprintf(commented, sizeof commented, "\n  # %s: ", leaf);
        int comment = (qt_config_key_at(i)->model_inline && !cfg.model_inline) ||
                      (qt_config_derived_key(p) && !qt_config_given(&cfg, p));
        QT_EXPECT(strstr(buf, pat) || (comment && strstr(buf, commented)),
                  "%s: dump lacks %s", what, p);
    }
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Fills every key with a random valid value (strings with characters that need escaping). */
static void randomize(uint64_t *s) {
    static char long_ctl[QT_PATH_MAX]; /* the longest string, every byte escaped in the dump */
    memset(long_ctl, 1, QT_PATH_MAX - 1);
    static const char *strs[] = {"", "plain", "with \"quotes\" and \\back\\slash", "tab\there\nnewline",
                                 "*.bin", "a: b # not a comment", "ünïcode/路径", "'single'", "- dash", "null", "~",
                                 /* what YAML folds as a line break (U+0085, U+2028, U+2029) or refuses raw
                                  * (C1 controls, U+FEFF inside a scalar): written escaped */
                                 "nel\xc2\x85 ls\xe2\x80\xa8 ps\xe2\x80\xa9 c1\xc2\x80 bom\xef\xbb\xbf", long_ctl};
    for (int i = 0; qt_config_key_at(i); i++) {
        const qt_config_key *k = qt_config_key_at(i);
        char *f = (char *)&cfg + k->offset;
        switch (k->type) {
        case QT_KEY_INT: /* within [lo, hi] where that is narrow (parallel.zero) */
            *(int *)f = k->hi - k->lo < 1000 ? (int)k->lo + (int)(lcg(s) % (unsigned)(k->hi - k->lo + 1))
                                              : (int)(lcg(s) % 1000) + (int)k->lo + 1;
            break;
        case QT_KEY_U64: *(uint64_t *)f = lcg(s) * 2654435761ull + (lcg(s) & 1 ? UINT64_MAX - 5 : 0); break;
        case QT_KEY_FLOAT: {
            float v;
            do {
                uint32_t u = (uint32_t)lcg(s) & 0x7fffffffu;
                memcpy(&v, &u, 4);
            } while (!(isfinite(v) && (k->lo_open ? v > k->lo : v >= k->lo) && (k->hi_open ? v < k->hi : v <= k->hi)));
            *(float *)f = v;
            break;
        }
        case QT_KEY_BOOL: *(int *)f = (int)(lcg(s) & 1); break;
        case QT_KEY_STRING: snprintf(f, QT_PATH_MAX, "%s", strs[lcg(s) % (sizeof strs / sizeof strs[0])]); break;
        case QT_KEY_ENUM: {
            int n = 0;
            while (k->names[n].name) n++;
            *(int *)f = k->names[lcg(s) % n].value;
            break;
        }
        case QT_KEY_INT_LIST: {
            qt_int_list *l = (qt_int_list *)f;
            memset(l, 0, sizeof *l);
            l->n = (int)(lcg(s) % 4);
            for (int j = 0; j < l->n; j++) l->v[j] = (int)(lcg(s) % 8) + (int)k->lo;
            break;
        }
        case QT_KEY_NAME_LIST: {
            int bits = 0;
            for (const qt_key_enum *e = k->names; e->name; e++) bits |= lcg(s) & 1 ? e->value : 0;
            *(int *)f = bits;
            break;
        }
        }
    }
    memset(cfg.given, 1, sizeof cfg.given); /* every key set: none derived */
    cfg.hf_config[0] = cfg.init.from[0] = 0;
    cfg.model_inline = 1;
    /* A model shape that qt_model_cfg_validate accepts: Hkv | H, even head_dim. */
    cfg.model.num_kv_heads = 1 + (int)(lcg(s) % 8);
    cfg.model.num_heads = cfg.model.num_kv_heads * (1 + (int)(lcg(s) % 4));
    cfg.model.head_dim = lcg(s) & 1 ? 0 : 2 * (1 + (int)(lcg(s) % 64));
    if (!cfg.model.head_dim) cfg.model.hidden_size = cfg.model.num_heads * 2 * (1 + (int)(lcg(s) % 16));
    /* RoPE parameters that qt_rope_validate accepts: a factor > 0, llama3's high > low frequency factor,
     * dynamic's head_dim > 2 */
    qt_rope_cfg *rp = &cfg.model.rope;
    if (!(rp->factor > 0)) rp->factor = 8;
    rp->low_freq_factor = 1, rp->high_freq_factor = 4;
    if (rp->type == QT_ROPE_DYNAMIC && (cfg.model.head_dim ? cfg.model.head_dim : cfg.model.hidden_size / cfg.model.num_heads) <= 2)
        rp->type = QT_ROPE_LINEAR;
    cfg.optim.warmup = cfg.optim.cooldown = 0;
    if (cfg.lora.rank > 0 && !cfg.lora.targets) cfg.lora.targets = QT_LORA_ALL; /* LoRA: some target */
    if (cfg.lora.rank <= 0 || cfg.precision.matmul_dtype != QT_DT_BF16 || cfg.device == QT_DEVICE_CPU)
        cfg.lora.base_nf4 = 0; /* an NF4 base: adapters, bf16 matmuls, a GPU */
    if (cfg.objective == QT_OBJ_DPO) /* DPO: pairs in a micro-batch */
        cfg.data.micro_batch = cfg.data.micro_batch > 1 ? cfg.data.micro_batch & ~1 : 2;
    /* The window rule the family can say: none for llama, every layer for mistral. */
    if (cfg.model.arch == QT_ARCH_LLAMA) cfg.model.sliding_window = 0;
    if (cfg.model.arch == QT_ARCH_MISTRAL) cfg.model.window_layers_from = 0;
    /* Gemma 3's keys are gemma3's alone; gemma3's layer types come from window_pattern */
    if (cfg.model.arch != QT_ARCH_GEMMA3)
        cfg.model.window_pattern = 0, cfg.model.rope_local_theta = cfg.model.attn_scalar = cfg.model.logit_softcap = 0;
    else
        cfg.model.window_layers_from = 0;
    cfg.parallel.shard_optimizer = cfg.parallel.zero >= 1; /* as loading leaves them (the older spelling) */
    if (cfg.parallel.zero >= 3) { /* ZeRO-3: no CUDA graphs; fp8 quantizes at use (qt_config_zero3_check) */
        cfg.perf.cuda_graphs = 0;
        if (cfg.precision.matmul_dtype == QT_DT_E4M3) cfg.memory.fp8_weight_cache = QT_FP8_WCACHE_NONE;
    }
    /* memory.offload: what is built (any of master, m, v; weights and gradients on one GPU; residual), and the
     * older keys agreeing */
    cfg.memory.offload &= QT_OFF_OPTIMIZER | QT_OFF_RESIDUAL | QT_OFF_WEIGHTS | QT_OFF_GRADIENTS;
    if (cfg.memory.offload & (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS)) { /* one GPU (qt_config_zero3_check) */
        cfg.parallel.zero = cfg.parallel.shard_optimizer = 0;
        cfg.parallel.gpus = 1;
        memset(&cfg.parallel.devices, 0, sizeof cfg.parallel.devices);
    }
    if (cfg.memory.offload & QT_OFF_WEIGHTS) { /* no graphs, fp8 from the slots */
        cfg.perf.cuda_graphs = 0;
        if (cfg.precision.matmul_dtype == QT_DT_E4M3) cfg.memory.fp8_weight_cache = QT_FP8_WCACHE_NONE;
    }
    if (cfg.parallel.gather_dtype == QT_DT_E4M3 &&
        !(cfg.parallel.zero >= 3 && cfg.precision.matmul_dtype == QT_DT_E4M3 && cfg.precision.grad_dtype != QT_DT_BF16))
        cfg.parallel.gather_dtype = QT_DT_BF16; /* e4m3 gathers: ZeRO-3 with fp8 matmuls only */
    if ((cfg.memory.offload & QT_OFF_OPTIMIZER) == QT_OFF_MASTER && cfg.precision.master_dtype == QT_DT_BF16)
        cfg.memory.offload |= QT_OFF_M; /* a bf16 master has no master array to offload alone (refused) */
    if (cfg.memory.offload) {
        cfg.memory.offload_optimizer = (cfg.memory.offload & QT_OFF_OPTIMIZER) != 0;
        cfg.memory.offload_residual = (cfg.memory.offload & QT_OFF_RESIDUAL) != 0;
    }
    int opt = cfg.memory.offload_optimizer, res = cfg.memory.offload_residual; /* the older keys as the items */
    qt_config_set_offload(&cfg, QT_OFF_OPTIMIZER, opt);
    qt_config_set_offload(&cfg, QT_OFF_RESIDUAL, res);
    if (!cfg.memory.offload_optimizer && !cfg.memory.plan) cfg.memory.zero_copy = 0; /* refused without the offload */
    if (cfg.model.max_seq_len < cfg.data.seq_len) cfg.model.max_seq_len = cfg.data.seq_len;
}

/* model.rope_*: transformers' RoPE scaling types and their parameters; an unknown type and an incomplete
 * setting are refused at the key. */
static void test_rope_keys(void) {
    QT_REQUIRE(load("model:\n  rope_type: llama3\n  rope_factor: 8\n  rope_low_freq_factor: 1\n  rope_high_freq_factor: 4\n"
                    "  rope_original_max_position_embeddings: 64\n", NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.model.rope.type == QT_ROPE_LLAMA3 && cfg.model.rope.factor == 8 && cfg.model.rope.low_freq_factor == 1 &&
                  cfg.model.rope.high_freq_factor == 4 && cfg.model.rope.original_max_pos == 64 && cfg.model_inline,
              "llama3 keys");
    check_roundtrip("rope llama3");
    QT_REQUIRE(load("model:\n  rope_type: yarn\n  rope_factor: 4\n  rope_attention_factor: 1.5\n  rope_truncate: false\n",
                    NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.model.rope.type == QT_ROPE_YARN && cfg.model.rope.attention_factor == 1.5f && !cfg.model.rope.truncate,
              "yarn keys");
    check_roundtrip("rope yarn");
    EXPECT_ERR("model:\n  rope_type: longrope\n",
               "t.yaml:2:3: model.rope_type: expected one of default|linear|dynamic|yarn|llama3, got \"longrope\"");
    EXPECT_ERR("model:\n  rope_type: linear\n",
               "t.yaml:2:3: model.rope_factor: expected a finite number > 0 for rope_type linear, got 0");
    EXPECT_ERR("model:\n  rope_type: llama3\n  rope_factor: 8\n  rope_low_freq_factor: 2\n  rope_high_freq_factor: 1\n",
               "t.yaml:5:3: model.rope_high_freq_factor: expected a finite number > rope_low_freq_factor (2), got 1");
}

/* memory.recompute: a YAML sequence, a flow list or a --set value; the given parts only (the store adds
 * the implied ones); unknown names refused with the list of names. */
static void test_recompute_list(void) {
    QT_EXPECT(load("memory:\n  recompute: [ffn, norm]\n", NULL, 0) == 0 && cfg.memory.recompute == (QT_RC_FFN | QT_RC_NORM),
              "flow list: %s", err);
    QT_EXPECT(load("memory:\n  recompute:\n    - block\n    - swiglu\n", NULL, 0) == 0 &&
                  cfg.memory.recompute == (QT_RC_BLOCK | QT_RC_SWIGLU),
              "sequence: %s", err);
    const char *ovr[] = {"memory.recompute=[att,qkv]"};
    QT_EXPECT(load("", ovr, 1) == 0 && cfg.memory.recompute == (QT_RC_ATT | QT_RC_QKV), "override: %s", err);
    QT_EXPECT(load("memory: {recompute: []}\n", NULL, 0) == 0 && cfg.memory.recompute == 0, "empty: %s", err);
    EXPECT_ERR("memory:\n  recompute: [ffn, mlp]\n",
               "t.yaml:2:3: memory.recompute: expected a list of names from swiglu|norm|qkv|att|ffn|block, got \"ffn,mlp\"");
    EXPECT_ERR("memory:\n  recompute: [ffn, [norm]]\n",
               "t.yaml:2:3: memory.recompute: expected a list of names from swiglu|norm|qkv|att|ffn|block, got a sequence in the list");
}

static void test_dump_roundtrip(void) {
    QT_REQUIRE(load("", NULL, 0) == 0, "%s", err);
    check_roundtrip("defaults");
    glob_t g;
    if (glob("configs/*.yaml", 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            QT_REQUIRE(qt_config_load(&cfg, g.gl_pathv[i], NULL, 0, err, sizeof err) == 0, "%s", err);
            check_roundtrip(g.gl_pathv[i]);
        }
        globfree(&g);
    }
    /* hf_config set: the (unset) inline keys are dumped as comments, so the dump reloads. */
    QT_REQUIRE(load("model:\n  hf_config: \"x/config.json\"\n", NULL, 0) == 0, "%s", err);
    check_roundtrip("hf_config");
    uint64_t s = 12345;
    for (int t = 0; t < 300 && !qt_t_failed; t++) {
        qt_config_defaults(&cfg);
        randomize(&s);
        char what[32];
        snprintf(what, sizeof what, "random config %d", t);
        check_roundtrip(what);
    }
}

static void test_readme_covers_keys(void) {
    FILE *f = fopen("configs/README.md", "r");
    QT_REQUIRE(f, "configs/README.md not found (run from the repo root)");
    static char readme[1 << 17], table[1 << 16];
    size_t n = fread(readme, 1, sizeof readme - 1, f);
    fclose(f);
    readme[n] = 0;
    qt_config_doc_table(table, sizeof table);
    /* Every generated row is in the README verbatim (type, range, default and meaning up to date). */
    for (char *line = strtok(table, "\n"); line; line = strtok(NULL, "\n")) {
        char row[1024];
        snprintf(row, sizeof row, "\n%s\n", line);
        QT_EXPECT(strstr(readme, row), "README lacks or has a stale row (regenerate: test_config --doc):\n%s", line);
    }
    /* And every key row in the README is a key of the table. */
    int rows = 0;
    for (char *line = strtok(readme, "\n"); line; line = strtok(NULL, "\n")) {
        char key[256];
        if (sscanf(line, "| `%255[^`]` |", key) != 1 || strstr(line, ".yaml`")) continue;
        rows++;
        QT_EXPECT(qt_config_key_find(key), "README documents \"%s\", which is not a key", key);
    }
    int nkeys = 0;
    while (qt_config_key_at(nkeys)) nkeys++;
    QT_EXPECT(rows == nkeys, "README has %d key rows, the table %d keys", rows, nkeys);
}

/* The older spellings are memory.offload's items and parallel.zero, all the plan reads: offload_optimizer alone
 * is master, m and v, offload_residual the residual, shard_optimizer false ZeRO 0. A config dumped by an older
 * build (memory.offload: [] beside offload_optimizer: true, as older checkpoints store it) loads equal to the
 * same file loaded now, so it resumes. */
static void test_alias_spellings(void) {
    QT_REQUIRE(load("memory:\n  offload_optimizer: true\n  offload_residual: true\nparallel:\n  shard_optimizer: false\n",
                    NULL, 0) == 0, "%s", err);
    QT_EXPECT(cfg.memory.offload == (QT_OFF_OPTIMIZER | QT_OFF_RESIDUAL) && cfg.parallel.zero == 0, "offload %d, zero %d",
              cfg.memory.offload, cfg.parallel.zero);
    qt_model_cfg mc = cfg.model;
    qt_model_cfg_finish(&mc);
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
    qt_plan p;
    QT_REQUIRE(qt_plan_resolve(&cfg, &L, 2, &p, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(p.optimizer.host && p.optimizer.mask == QT_OFF_OPTIMIZER && p.acts.offload_residual &&
                  p.parallel.dp == QT_DP_REPLICATED && p.parallel.zero == 0,
              "plan: optimizer host %d mask %d, residual %d, dp %d", p.optimizer.host, p.optimizer.mask,
              p.acts.offload_residual, p.parallel.dp);
    qt_layout_free(&L);
    QT_REQUIRE(qt_config_load_string(&cfg2, "memory:\n  offload: []\n  offload_optimizer: true\n  offload_residual: false\n"
                                     "parallel:\n  zero: 1\n  shard_optimizer: true\n", "ckpt.yaml", NULL, 0, err, sizeof err) == 0,
               "%s", err);
    QT_REQUIRE(load("memory:\n  offload_optimizer: true\n", NULL, 0) == 0, "%s", err);
    const char *diff = NULL;
    QT_EXPECT(qt_config_equal(&cfg2, &cfg, &diff), "an older dump differs at %s", diff ? diff : "?");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--doc")) {
        static char table[1 << 16];
        qt_config_doc_table(table, sizeof table);
        fputs(table, stdout);
        return 0;
    }
    QT_RUN(test_defaults);
    QT_RUN(test_rope_keys);
    QT_RUN(test_run_dir);
    QT_RUN(test_examples_load);
    QT_RUN(test_qwen3_example);
    QT_RUN(test_error_unknown_key);
    QT_RUN(test_error_type_and_range);
    QT_RUN(test_error_structure);
    QT_RUN(test_error_syntax);
    QT_RUN(test_error_files);
    QT_RUN(test_cross_checks);
    QT_RUN(test_model_shape);
    QT_RUN(test_model_window);
    QT_RUN(test_model_dtype);
    QT_RUN(test_overrides);
    QT_RUN(test_plan_keys_auto);
    QT_RUN(test_offload_list);
    QT_RUN(test_alias_spellings);
    QT_RUN(test_recompute_list);
    QT_RUN(test_dump_roundtrip);
    QT_RUN(test_readme_covers_keys);
    return qt_test_end();
}
