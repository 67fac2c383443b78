/* qt_test_data.h — test helpers that read files and write the tinyshakespeare shards. */
#ifndef QT_TEST_DATA_H
#define QT_TEST_DATA_H

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_test.h"
#include "qt_train.h"

/* Whether the GPU suites' runs train packed documents: QT_TEST_DOCS=1 (a test-only variable, like
 * QT_TEST_SHAPE) gives the synthetic shards document starts and the runs attention and RoPE positions per
 * document, so the bitwise suites compare their memory features with documents on. */
static inline int qt_t_docs_on(void) {
    const char *v = getenv("QT_TEST_DOCS");
    return v && *v && strcmp(v, "0");
}

/* A learnable synthetic shard of n tokens (vocabulary 64): each token mostly follows from the previous one.
 * With qt_t_docs_on, document starts every 2-65 tokens (3 in 4) or 2-601 tokens. */
static inline void qt_t_write_synthetic(const char *path, uint64_t n, uint64_t seed) {
    uint32_t *t = malloc(n * sizeof *t);
    uint64_t *docs = malloc(n * sizeof *docs), nd = 0, next = 0, x = seed;
    t[0] = 1;
    for (uint64_t i = 1; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (x >> 60) == 0 ? (uint32_t)((x >> 33) % 64) : (t[i - 1] * 7 + 3) % 64;
        if (i >= next) {
            if (next) docs[nd++] = i;
            next = i + 2 + ((x >> 20) & 3 ? (x >> 24) % 64 : (x >> 24) % 600);
        }
    }
    char err[512];
    if (qt_tokens_write_docs(path, t, NULL, n, qt_t_docs_on() ? docs : NULL, nd, 2, 64, 3, err, sizeof err))
        printf("  shard: %s\n", err);
    free(docs);
    free(t);
}

/* n data-parallel ranks as parallel: keys: "gpus: n" where the machine has n GPUs, else
 * "devices: [0, 0, ...]" (all on GPU 0), then ", comm: X" when the run sets QT_TEST_COMM (a test hook:
 * tools/gpu-check.sh multi runs the data-parallel tests once per transport). In one of 4 rotating
 * static buffers. */
static inline const char *qt_t_ranks(int n) {
    static char buf[4][160];
    static int k;
    char *p = buf[k++ & 3];
    int o = 0;
    if (qt_cuda_device_count() >= n) o = snprintf(p, 160, "gpus: %d", n);
    else {
        o = snprintf(p, 160, "devices: [0");
        for (int r = 1; r < n; r++) o += snprintf(p + o, 160 - o, ", 0");
        o += snprintf(p + o, 160 - o, "]");
    }
    const char *comm = getenv("QT_TEST_COMM");
    if (comm && *comm) snprintf(p + o, 160 - o, ", comm: %s", comm);
    return p;
}

/* dir/name in one of 8 rotating static buffers (a call's result lives for the next 7 calls). */
static inline const char *qt_t_path(const char *dir, const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* Loads the YAML text into *c and trains it (no resume), stats in *st: qt_train_run's status, or -1
 * with the config error in err. */
static inline int qt_t_train_yaml(qt_config *c, const char *yaml, qt_train_stats *st, char *err, size_t errlen) {
    if (qt_config_load_string(c, yaml, "test.yaml", NULL, 0, err, errlen)) return -1;
    return qt_train_run(c, NULL, st, err, errlen);
}

/* The whole file, malloc'ed (caller frees) with a NUL after its n bytes (text may be searched), or NULL. */
static inline char *qt_t_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) len = 0;
    fclose(f);
    if (!buf) return NULL;
    buf[len] = 0;
    *n = (size_t)len;
    return buf;
}

/* Writes n bytes to path (a message on failure). */
static inline void qt_t_write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) perror(path);
    if (f) fclose(f);
}

/* Byte-level tinyshakespeare shards dir/ts_train_0.bin and dir/ts_eval_0.bin (the last 5%); 0 when
 * the text is absent. QT_DATA_DIR overrides ../shared/data (the GPU machine has no ../shared). */
static inline int qt_t_write_tinyshakespeare(const char *dir) {
    size_t n;
    char path[512], err[1024];
    const char *src = getenv("QT_DATA_DIR");
    snprintf(path, sizeof path, "%s/tinyshakespeare.txt", src ? src : "../shared/data");
    char *text = qt_t_read_file(path, &n);
    if (!text) return 0;
    size_t ne = n / 20, nt = n - ne;
    uint32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (unsigned char)text[i];
    snprintf(path, sizeof path, "%s/ts_train_0.bin", dir);
    if (qt_tokens_write(path, tok, nt, 2, 256, 0, err, sizeof err)) printf("  %s\n", err);
    snprintf(path, sizeof path, "%s/ts_eval_0.bin", dir);
    if (qt_tokens_write(path, tok + nt, ne, 2, 256, 0, err, sizeof err)) printf("  %s\n", err);
    free(tok);
    free(text);
    return 1;
}

/* A fresh /tmp/<prefix>_XXXXXX directory in dir[cap]; 0 on failure. */
static inline int qt_t_mkdtemp(char *dir, size_t cap, const char *prefix) {
    snprintf(dir, cap, "/tmp/%s_XXXXXX", prefix);
    return mkdtemp(dir) != NULL;
}

/* Removes dir and everything below it. */
static inline void qt_t_rmtree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) printf("  could not remove %s\n", dir);
}

/* The rank-failure run: writes dir/fail.yaml (a 2-layer model on dir/syn_train_*.bin.zst, 6 steps,
 * `data` extra data keys such as ", grad_accum: 2", then the `parallel` line) and runs `tool fail.yaml 1 3`
 * (tool_train_fault: rank 1 fails before step 3; with gather, e.g. "5", instead of issuing its 5th ZeRO-3
 * weight gather: `tool fail.yaml 1 3 5`) in a child whose output goes to dir/fail.err, waiting up
 * to 120 s. Returns the output (malloc'd) with *status and *secs set; NULL with *why when the config
 * could not be written, fork failed or the child still ran after 120 s (a rank hung: killed). The child
 * execs at once: it never touches the parent's CUDA state. */
static inline char *qt_t_rank_fault(const char *tool, const char *dir, const char *data, const char *parallel,
                                    const char *gather, int *status, double *secs, const char **why) {
    char cfgp[512], errp[512];
    snprintf(cfgp, sizeof cfgp, "%s/fail.yaml", dir);
    snprintf(errp, sizeof errp, "%s/fail.err", dir);
    FILE *f = fopen(cfgp, "w");
    int ok = f && fprintf(f,
                          "model: {vocab_size: 64, hidden_size: 128, num_layers: 2, num_heads: 2, num_kv_heads: 1, "
                          "intermediate_size: 96}\ndata: {train: '%s/syn_train_*.bin.zst', seq_len: 32, micro_batch: 3%s}\n"
                          "optim: {steps: 6}\ncheckpoint: {dir: '%s/ckpt_fail'}\ndevice: cuda\n%s\n",
                          dir, data, dir, parallel) > 0;
    if (f && fclose(f)) ok = 0;
    if (!ok) return *why = "cannot write the failure run's config", NULL;
    pid_t pid = fork();
    if (pid < 0) return *why = "fork failed", NULL;
    if (pid == 0) {
        int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(tool, tool, cfgp, "1", "3", gather, (char *)NULL); /* gather NULL ends the list there */
        _exit(127);
    }
    int waited = 0;
    *status = 0;
    while (waitpid(pid, status, WNOHANG) == 0 && waited < 1200) {
        usleep(100000);
        waited++;
    }
    *secs = waited / 10.0;
    if (waited >= 1200) {
        kill(pid, SIGKILL);
        waitpid(pid, status, 0);
        return *why = "still running 120 s after the injected failure: a rank hung", NULL;
    }
    size_t n = 0;
    char *out = qt_t_read_file(errp, &n);
    if (!out) *why = "no output from the failure run";
    return out;
}

/* 1 when checkpoints a and b hold the same bytes of weights (fp32 and bf16), AdamW m and v; else 0 and
 * why names the first that differs. */
static inline int qt_t_same_state(const char *a, const char *b, char *why, size_t cap) {
    static const char *const items[] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    char err[512];
    qt_ckpt *ca = qt_ckpt_open(a, err, sizeof err), *cb = ca ? qt_ckpt_open(b, err, sizeof err) : NULL;
    int ok = ca && cb;
    if (!ok) snprintf(why, cap, "checkpoint: %s", err);
    for (int i = 0; ok && i < 4; i++) {
        size_t na = 0, nb = 0;
        const void *pa = qt_ckpt_get(ca, items[i], &na, NULL), *pb = qt_ckpt_get(cb, items[i], &nb, NULL);
        if (!pa || !pb || na != nb || na == 0 || memcmp(pa, pb, na)) {
            snprintf(why, cap, "final %s differ (%zu vs %zu bytes)", items[i], na, nb);
            ok = 0;
        }
    }
    qt_ckpt_close(ca);
    qt_ckpt_close(cb);
    return ok;
}

/* The runs the memory-feature tests compare bit for bit: QT_T_STEPS optimizer steps, each step's loss
 * and grad norm, and the final checkpoint. */
enum { QT_T_STEPS = 20 };
typedef struct {
    float loss[QT_T_STEPS], gn[QT_T_STEPS];
    char ckpt[512];
} qt_t_run_out;

/* Trains `yaml` (read as "test.yaml"; its optim.steps <= QT_T_STEPS, its log.file logp with every: 1 and
 * its checkpoint.dir ckpt_dir) from `resume` (NULL or "latest") for `stop` steps (-1: all): each step's
 * loss, its grad norm from the log, and the newest checkpoint into o. 0, or -1 with err. */
/* The bitwise suites' runs at a real attention shape. QT_TEST_SHAPE (a test-only variable of the GPU
 * suites; unset: the tiny default) rewrites the tiny model of a run's YAML (hidden 128, 2 query / 1 kv
 * head, seq 32 x micro-batch 3) into a shipped config's grouped-query attention at seq 1024 x 1, keeping
 * the test's layers, vocab and tying:
 *   gqa64   Qwen2.5-0.5B's: hidden 896, 14 / 2 heads (head_dim 64)
 *   gqa128  Qwen2.5-7B's:  hidden 3584, 28 / 4 heads (head_dim 128)
 *   llama   a held-out Llama-like one: hidden 1024, 16 / 4 heads (head_dim 64) at seq 512 x 2
 *   qwen3   Qwen3-0.6B's: hidden 1024, 16 / 8 heads of head_dim 128 (not hidden / heads), q/k norms, no
 *           q/k/v bias, at seq 512 x 2
 *   swa     the same with a sliding window of 128 on every layer (cuDNN's band mask)
 *   gemma   Gemma-3-like: hidden 1024, 8 / 4 heads of head_dim 128, sandwich (1 + w) norms, GeGLU-tanh, scaled
 *           embedding, q/k norms, local layers (window 128) between global ones (every 2nd) with their own RoPE
 *           base, query_pre_attn_scalar 96, logit soft-cap 30, at seq 512 x 2
 * (the MLP at 1024: the attention and its sums are what the shape is for). Returns the shape's name. */
static inline const char *qt_t_shape_yaml(char *yaml, size_t cap) {
    static const struct {
        const char *name, *hidden, *heads, *batch;
    } shapes[] = {{"gqa64", "hidden_size: 896,", "num_heads: 14, num_kv_heads: 2", "seq_len: 1024, micro_batch: 1"},
                  {"gqa128", "hidden_size: 3584,", "num_heads: 28, num_kv_heads: 4", "seq_len: 1024, micro_batch: 1"},
                  {"llama", "hidden_size: 1024,", "num_heads: 16, num_kv_heads: 4", "seq_len: 512, micro_batch: 2"},
                  {"qwen3", "hidden_size: 1024,", "num_heads: 16, num_kv_heads: 8, head_dim: 128, arch: qwen3, qkv_bias: false",
                   "seq_len: 512, micro_batch: 2"},
                  {"swa", "hidden_size: 1024,", "num_heads: 16, num_kv_heads: 4, sliding_window: 128",
                   "seq_len: 512, micro_batch: 2"},
                  {"gemma", "hidden_size: 1024,",
                   "num_heads: 8, num_kv_heads: 4, head_dim: 128, arch: gemma3, qkv_bias: false, sliding_window: 128, "
                   "window_pattern: 2, rope_theta: 1000000, rope_local_theta: 10000, query_pre_attn_scalar: 96, "
                   "final_logit_softcapping: 30",
                   "seq_len: 512, micro_batch: 2"}};
    const char *want = getenv("QT_TEST_SHAPE");
    for (size_t k = 0; want && k < sizeof shapes / sizeof shapes[0]; k++) {
        if (strcmp(want, shapes[k].name)) continue;
        const char *from[5] = {"hidden_size: 128,", "num_heads: 2, num_kv_heads: 1", "intermediate_size: 96",
                               "max_seq_len: 64", "seq_len: 32, micro_batch: 3"};
        const char *to[5] = {shapes[k].hidden, shapes[k].heads, "intermediate_size: 1024", "max_seq_len: 1024",
                             shapes[k].batch};
        for (int r = 0; r < 5; r++) {
            char *at = strstr(yaml, from[r]);
            size_t lf = strlen(from[r]), lt = strlen(to[r]), n = strlen(yaml);
            if (!at || n - lf + lt >= cap) continue;
            memmove(at + lt, at + lf, n - (size_t)(at - yaml) - lf + 1);
            memcpy(at, to[r], lt);
        }
        return shapes[k].name;
    }
    return "tiny";
}

/* 1 when QT_TEST_SHAPE names one of qt_t_shape_yaml's shapes (the runs are shaped), else 0 (the tiny default). */
static inline int qt_t_shaped(void) {
    char none[1] = "";
    return strcmp(qt_t_shape_yaml(none, sizeof none), "tiny") != 0;
}

/* State elements per chunk of an offloaded optimizer in the bitwise suites: hundreds of chunks, their boundaries
 * inside tensors. 1000 at the tiny default; at a shaped run's 23-40M parameters 1000 would mean 23-40k chunk
 * copies per state array and step (a case's run outlasting a device call), so 63,000 (a multiple of 8 and of no
 * row length). */
static inline size_t qt_t_offload_chunk(void) { return qt_t_shaped() ? 63000 : 1000; }

static inline int qt_t_run_yaml(const char *yaml, const char *logp, const char *ckpt_dir, const char *resume, long stop,
                                qt_t_run_out *o, char *err, size_t errlen) {
    qt_config c;
    char shaped[8192];
    snprintf(shaped, sizeof shaped, "%s", yaml);
    qt_t_shape_yaml(shaped, sizeof shaped);
    char *data = strstr(shaped, "data: {");
    const char *per_doc = "attention: document, positions: document, ";
    if (qt_t_docs_on() && data && strlen(shaped) + strlen(per_doc) < sizeof shaped) {
        memmove(data + 7 + strlen(per_doc), data + 7, strlen(data + 7) + 1);
        memcpy(data + 7, per_doc, strlen(per_doc));
    }
    if (qt_config_load_string(&c, shaped, "test.yaml", NULL, 0, err, errlen)) return -1;
    float losses[QT_T_STEPS];
    for (int i = 0; i < QT_T_STEPS; i++) losses[i] = NAN;
    qt_train_opts opts = {resume, stop, 0, losses, NULL, NULL};
    if (qt_train_run(&c, &opts, NULL, err, errlen) < 0) return -1;
    for (int i = 0; i < QT_T_STEPS; i++) o->loss[i] = losses[i], o->gn[i] = NAN;
    FILE *f = fopen(logp, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"grad_norm\":"), *s = strstr(line, "\"step\":");
        long st = s ? strtol(s + 7, NULL, 10) : 0;
        if (strstr(line, "\"train\"") && p && st >= 1 && st <= QT_T_STEPS) o->gn[st - 1] = strtof(p + 12, NULL);
    }
    if (f) fclose(f);
    if (qt_ckpt_latest(ckpt_dir, o->ckpt, sizeof o->ckpt)) return snprintf(err, errlen, "no checkpoint in %s", ckpt_dir), -1;
    return 0;
}

/* Whether steps [from, QT_T_STEPS) and the final checkpoints of a and b are the same bits; says where
 * they differ. */
static inline int qt_t_same_bits(const qt_t_run_out *a, const qt_t_run_out *b, int from, char *why, size_t cap) {
    for (int i = from; i < QT_T_STEPS; i++)
        if (memcmp(&a->loss[i], &b->loss[i], 4) || memcmp(&a->gn[i], &b->gn[i], 4))
            return snprintf(why, cap, "step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", i + 1, a->loss[i], b->loss[i],
                            a->gn[i], b->gn[i]), 0;
    return qt_t_same_state(a->ckpt, b->ckpt, why, cap);
}

/* Expects qt_tokens_load(path) to fail with a message that names path and contains want. */
static inline void qt_t_expect_load_error(const char *path, const char *want) {
    char err[512] = "";
    qt_tokens_data d;
    int rc = qt_tokens_load(path, 0, &d, err, sizeof err);
    QT_EXPECT(rc == -1 && strstr(err, want) && strstr(err, path), "%s: rc %d, message \"%s\" lacks \"%s\"", path,
              rc, err, want);
    if (rc == 0) qt_tokens_unload(&d);
}

#endif
