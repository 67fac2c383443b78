/* test_recompute.c — memory.recompute and memory.fp8_weight_cache change no bit (GPU; skips without one).
 *
 * A 3-layer model trains 20 optimizer steps (2 micro-steps of 3 x 32 tokens each) with each recompute
 * set (and memory.attn_bwd_chunks) and without; every logged loss and gradient norm and the final checkpoint's weights (fp32 master and
 * bf16), AdamW m and v must be the same bytes. Groups: bf16 eager, bf16 from CUDA graphs, fp8 with an
 * fp8 backward (grad_dtype e4m3) eager, the same from graphs with persistent quants, fp8 with a bf16
 * backward (the backward's matmuls read the bf16 activations the recompute rebuilds); 2 ranks sharing
 * GPU 0 (ZeRO-1, overlapped, graphs) in bf16 and fp8 for block and ffn+norm; block with the optimizer
 * offloaded. A mutant (test hook recompute_stale_h: layer 1's backward reads the SwiGLU output buffer as
 * layer 2 left it) must differ. 3 layers: the backward of a middle layer is the one a stale shared
 * buffer would betray. Autotuning off: every run multiplies with the same cuBLASLt algorithms.
 * fp8_weight_cache (test_fp8_weight_cache): none (the weight quants in 2 layer slots, quantized at use)
 * against all, alone and with recompute [block] and [ffn, norm], in fp8 eager and from graphs, with and
 * without persistent_quants, with a bf16 backward, and 2 ranks sharing GPU 0 (ZeRO-1). 3 layers: layers 0
 * and 2 share slot 0. Two mutants must differ: a backward that reads its slot as layer l + 2 left it
 * (hook fp8_wslot_stale) and quants with the first step's scale (hook fp8_wcache_stale_scale). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_test_hooks.h"
#include "qt_train.h"

enum { STEPS = 20 };
static char g_dir[256];

typedef struct {
    float loss[STEPS], gn[STEPS];
    char ckpt[512];
} run_out;

/* One run: `extra` holds the precision/perf/parallel/memory lines; tag names its folder and log. */
static int run(const char *tag, const char *extra, run_out *o, char *err, size_t errlen) {
    char yaml[4096], logp[512];
    snprintf(logp, sizeof logp, "%s/log_%s.jsonl", g_dir, tag);
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 256, hidden_size: 128, num_layers: 3, num_heads: 2, num_kv_heads: 1,\n"
             "        intermediate_size: 96, max_seq_len: 64, tie_embeddings: false}\n"
             "data: {train: '%s/syn_train_*.bin.zst', seq_len: 32, micro_batch: 3, grad_accum: 2}\n"
             "optim: {lr: 0.003, warmup: 3, steps: %d, schedule: cosine, grad_clip: 1.0}\n"
             "checkpoint: {dir: '%s/ckpt_%s', every: 0, keep: 1}\nlog: {file: '%s', every: 1}\ndevice: cuda\n%s\n",
             g_dir, STEPS, g_dir, tag, logp, extra);
    qt_config c;
    if (qt_config_load_string(&c, yaml, "test.yaml", NULL, 0, err, errlen)) return -1;
    qt_train_opts opts = {NULL, -1, 0, o->loss, NULL};
    if (qt_train_run(&c, &opts, NULL, err, errlen)) return -1;
    FILE *f = fopen(logp, "r");
    int n = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f) && n < STEPS) {
        const char *p = strstr(line, "\"grad_norm\":");
        if (strstr(line, "\"train\"") && p) o->gn[n++] = strtof(p + 12, NULL);
    }
    if (f) fclose(f);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt_%s", g_dir, tag);
    if (n != STEPS || qt_ckpt_latest(dir, o->ckpt, sizeof o->ckpt))
        return snprintf(err, errlen, "%s: %d grad norms logged, checkpoint in %s: %s", tag, n, dir, o->ckpt), -1;
    return 0;
}

/* Whether b is a's computation bit for bit; says where it first differs. */
static int same_bits(const run_out *a, const run_out *b, char *why, size_t cap) {
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&a->loss[i], &b->loss[i], 4) || memcmp(&a->gn[i], &b->gn[i], 4))
            return snprintf(why, cap, "step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", i + 1, a->loss[i], b->loss[i],
                            a->gn[i], b->gn[i]), 0;
    char err[512];
    qt_ckpt *ca = qt_ckpt_open(a->ckpt, err, sizeof err), *cb = qt_ckpt_open(b->ckpt, err, sizeof err);
    int ok = ca && cb;
    if (!ok) snprintf(why, cap, "checkpoint: %s", err);
    const char *items[] = {"weights", "weights_bf16", "adam_m", "adam_v"};
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

/* memory: keys against none: each part alone, block, ffn+norm; the attention backward over 2 slices of the
 * 3 sequences (2 + 1), alone and with block */
static const char *const SETS[] = {"recompute: [swiglu]", "recompute: [norm]", "recompute: [qkv]",  "recompute: [att]",
                                   "recompute: [ffn]",    "recompute: [block]", "recompute: [ffn, norm]",
                                   "attn_bwd_chunks: 2",  "recompute: [block], attn_bwd_chunks: 2"};
#define NSETS ((int)(sizeof SETS / sizeof SETS[0]))

/* One group: the baseline without memory keys, then each `memory: {...}` of `sets` against it. */
static void group(const char *name, const char *base, const char *const *sets, int nsets) {
    run_out ref, got;
    char err[1024], tag[128], extra[1024], why[512];
    snprintf(tag, sizeof tag, "%s_none", name);
    QT_REQUIRE(run(tag, base, &ref, err, sizeof err) == 0, "%s: %s", tag, err);
    QT_EXPECT(ref.loss[STEPS - 1] < ref.loss[0], "%s: loss did not fall: %g -> %g", tag, ref.loss[0], ref.loss[STEPS - 1]);
    for (int k = 0; k < nsets; k++) {
        snprintf(tag, sizeof tag, "%s_%d", name, k);
        snprintf(extra, sizeof extra, "%s\nmemory: {%s}", base, sets[k]);
        QT_REQUIRE(run(tag, extra, &got, err, sizeof err) == 0, "%s %s: %s", name, sets[k], err);
        int same = same_bits(&ref, &got, why, sizeof why);
        printf("  %-12s %-40s %s\n", name, sets[k], same ? "bitwise equal" : why);
        QT_EXPECT(same, "%s, %s: %s", name, sets[k], why);
    }
}

static void setup_data(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/syn_train_0.bin.zst", g_dir);
    qt_t_write_synthetic(p, 20000, 1);
}

#define NOTUNE "perf: {matmul_autotune: false}"
#define GRAPHS "perf: {cuda_graphs: true, matmul_autotune: false}"

static void test_recompute_bf16(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    group("bf16", "parallel: {gpus: 1}\n" NOTUNE, SETS, NSETS);
    group("bf16_graph", "parallel: {gpus: 1}\n" GRAPHS, SETS, NSETS);
}

static void test_recompute_fp8(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    group("fp8", "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3}\n" NOTUNE, SETS, NSETS);
    group("fp8pq_graph",
          "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true}\n" GRAPHS, SETS,
          NSETS);
    group("fp8_bf16bwd", "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: bf16}\n" NOTUNE, SETS, NSETS);
}

/* 2 ranks on GPU 0 (or 2 GPUs), ZeRO-1 with the sums overlapping the backward, from graphs; and one
 * GPU with the optimizer state in host memory. */
static void test_recompute_dp_offload(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const char *two = qt_cuda_device_count() >= 2 ? "gpus: 2" : "devices: [0, 0]";
    const char *const dp_sets[] = {"recompute: [block]", "recompute: [ffn, norm]"};
    char base[512];
    snprintf(base, sizeof base, "parallel: {%s, shard_optimizer: true, overlap_comm: true}\n" GRAPHS, two);
    group("dp_bf16", base, dp_sets, 2);
    snprintf(base, sizeof base,
             "parallel: {%s, shard_optimizer: true, overlap_comm: true}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3, "
             "persistent_quants: true}\n" GRAPHS, two);
    group("dp_fp8", base, dp_sets, 2);
    qt_test_hooks h = {.offload_chunk = 1000};
    qt_test_hooks_set(&h);
    group("offload", "parallel: {gpus: 1}\n" NOTUNE, (const char *const[]){"recompute: [block], offload_optimizer: true"}, 1);
    qt_test_hooks_set(NULL);
}

/* The mutant: layer 1's backward reads the shared SwiGLU buffer as layer 2's backward left it (its dh).
 * The bf16 backward's down-projection weight gradient reads h, so the bits must move. */
static void test_recompute_mutant_caught(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    run_out ref, got;
    char err[1024], why[512];
    QT_REQUIRE(run("mut_none", "parallel: {gpus: 1}\n" NOTUNE, &ref, err, sizeof err) == 0, "%s", err);
    qt_test_hooks h = {.recompute_stale_h = 1};
    qt_test_hooks_set(&h);
    int rc = run("mut_swiglu", "parallel: {gpus: 1}\n" NOTUNE "\nmemory: {recompute: [swiglu]}", &got, err, sizeof err);
    qt_test_hooks_set(NULL);
    QT_REQUIRE(rc == 0, "%s", err);
    int same = same_bits(&ref, &got, why, sizeof why);
    printf("  mutant (stale SwiGLU buffer): %s\n", same ? "NOT caught" : why);
    QT_EXPECT(!same, "the stale-buffer mutant trains the same bits: the comparison cannot fail");
}

/* memory.fp8_weight_cache: none = all, bit for bit (each group's baseline caches all layers). */
static const char *const WC_SETS[] = {"fp8_weight_cache: none", "fp8_weight_cache: none, recompute: [block]",
                                      "fp8_weight_cache: none, recompute: [ffn, norm]"};
#define FP8(g, pq) "precision: {matmul_dtype: e4m3, grad_dtype: " g ", persistent_quants: " pq "}\n"

static void test_fp8_weight_cache(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    group("wc_fp8", "parallel: {gpus: 1}\n" FP8("e4m3", "false") NOTUNE, WC_SETS, 3);
    group("wc_fp8_graph", "parallel: {gpus: 1}\n" FP8("e4m3", "false") GRAPHS, WC_SETS, 3);
    group("wc_fp8pq", "parallel: {gpus: 1}\n" FP8("e4m3", "true") NOTUNE, WC_SETS, 3);
    group("wc_fp8pq_graph", "parallel: {gpus: 1}\n" FP8("e4m3", "true") GRAPHS, WC_SETS, 3);
    group("wc_fp8_bf16bwd", "parallel: {gpus: 1}\n" FP8("bf16", "true") NOTUNE, WC_SETS, 3);
    const char *two = qt_cuda_device_count() >= 2 ? "gpus: 2" : "devices: [0, 0]";
    char base[512];
    snprintf(base, sizeof base, "parallel: {%s, shard_optimizer: true, overlap_comm: true}\n" FP8("e4m3", "true") GRAPHS, two);
    group("wc_dp_fp8", base, WC_SETS, 2);
}

/* The weight-cache mutants: each must move the bits away from the cached run's. */
static void test_fp8_weight_cache_mutants(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const char *base = "parallel: {gpus: 1}\n" FP8("e4m3", "true") NOTUNE;
    run_out ref, got;
    char err[1024], why[512], yaml[1024];
    QT_REQUIRE(run("wcmut_all", base, &ref, err, sizeof err) == 0, "%s", err);
    snprintf(yaml, sizeof yaml, "%s\nmemory: {fp8_weight_cache: none}", base);
    const char *names[2] = {"backward reads a slot layer l + 2 left", "quants with the first step's scale"};
    for (int m = 0; m < 2; m++) {
        qt_test_hooks h = {.fp8_wslot_stale = m == 0, .fp8_wcache_stale_scale = m == 1};
        qt_test_hooks_set(&h);
        int rc = run(m ? "wcmut_scale" : "wcmut_slot", yaml, &got, err, sizeof err);
        qt_test_hooks_set(NULL);
        QT_REQUIRE(rc == 0, "%s", err);
        int same = same_bits(&ref, &got, why, sizeof why);
        printf("  mutant (%s): %s\n", names[m], same ? "NOT caught" : why);
        QT_EXPECT(!same, "mutant '%s' trains the same bits: the comparison cannot fail", names[m]);
    }
}

int main(void) {
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_recompute")) return 1;
    QT_RUN(test_recompute_mutant_caught);
    QT_RUN(test_recompute_bf16);
    QT_RUN(test_recompute_fp8);
    QT_RUN(test_recompute_dp_offload);
    QT_RUN(test_fp8_weight_cache_mutants);
    QT_RUN(test_fp8_weight_cache);
    qt_t_rmtree(g_dir);
    return qt_test_end();
}
