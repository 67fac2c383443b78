/* test_recompute.c — memory.recompute, memory.offload_residual and memory.fp8_weight_cache change no bit (GPU; skips without one).
 *
 * A 4-layer model trains 20 optimizer steps (2 micro-steps of 3 x 32 tokens each) with each recompute
 * set (and memory.attn_bwd_chunks, and offload_residual alone, with block and with ffn+norm) and without;
 * every logged loss and gradient norm and the final checkpoint's weights (fp32 master and bf16), AdamW m
 * and v must be the same bytes. Groups: bf16 eager, bf16 from CUDA graphs, fp8 with an fp8 backward
 * (grad_dtype e4m3) eager, the same from graphs with persistent quants, fp8 with a bf16 backward (the
 * backward's matmuls read the bf16 activations the recompute rebuilds); 2 ranks sharing GPU 0 (ZeRO-1,
 * overlapped, graphs) in bf16 and fp8; the optimizer offloaded. Every residual copy is delayed (test hook
 * offload_residual_delay_ms), so a compute stream that does not wait for one reads or overwrites a slot
 * too early. Mutants that must differ (the mutant build only): layer 1's down wgrad reads what its SwiGLU
 * backward did not remake (in bf16 the gradient dh left in h's buffer, in fp8 down's Xq^T as layer 2 left
 * it), a fetched residual read without waiting, a slot overwritten before its copy out finished. 4
 * layers: the backward of a middle layer is the one a stale shared buffer would betray, and two layers'
 * residuals (0 and 1) go to the host, the other two stay in the device slots. Autotuning off: every run
 * multiplies with the same cuBLASLt algorithms. The plan check: the device memory a run takes
 * (cudaMemGetInfo sampled through the run) against the plan.
 * fp8_weight_cache (test_fp8_weight_cache): none (the weight quants in 2 layer slots, quantized at use)
 * against all, alone and with recompute [block] and [ffn, norm], in fp8 eager and from graphs, with and
 * without persistent_quants, with a bf16 backward, and 2 ranks sharing GPU 0 (ZeRO-1): layers 0 and 2
 * share slot 0, 1 and 3 slot 1. Two mutants must differ: a backward that reads its slot as layer l + 2
 * left it and quants with the first step's scale. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_data.h"
#include "qt_device.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_partition.h"
#include "qt_test.h"
#include "qt_test_plan.h"
#include "qt_test_data.h"
#include "qt_test_hooks.h"
#include "qt_train.h"

enum { STEPS = 20, DELAY_MS = 5 };
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
             "model: {vocab_size: 256, hidden_size: 128, num_layers: 4, num_heads: 2, num_kv_heads: 1,\n"
             "        intermediate_size: 96, max_seq_len: 64, tie_embeddings: false}\n"
             "data: {train: '%s/syn_train_*.bin.zst', seq_len: 32, micro_batch: 3, grad_accum: 2}\n"
             "optim: {lr: 0.003, warmup: 3, steps: %d, schedule: cosine, grad_clip: 1.0}\n"
             "checkpoint: {dir: '%s/ckpt_%s', every: 0, keep: 1}\nlog: {file: '%s', every: 1}\ndevice: cuda\n%s\n",
             g_dir, STEPS, g_dir, tag, logp, extra);
    qt_t_shape_yaml(yaml, sizeof yaml);
    qt_config c;
    if (qt_config_load_string(&c, yaml, "test.yaml", NULL, 0, err, errlen)) return -1;
    qt_train_opts opts = {NULL, -1, 0, o->loss, NULL, NULL};
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
    return qt_t_same_state(a->ckpt, b->ckpt, why, cap);
}

/* memory: keys against none: each part alone, block, ffn+norm; the attention backward over 2 slices of the
 * 3 sequences (2 + 1), alone and with block */
static const char *const SETS[] = {"recompute: [swiglu]", "recompute: [norm]", "recompute: [qkv]",  "recompute: [att]",
                                   "recompute: [ffn]",    "recompute: [block]", "recompute: [ffn, norm]",
                                   "attn_bwd_chunks: 2",  "recompute: [block], attn_bwd_chunks: 2",
                                   "offload_residual: true", "recompute: [block], offload_residual: true",
                                   "recompute: [ffn, norm], offload_residual: true"};
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

/* Every residual copy starts DELAY_MS late (and, with offload_chunk, the optimizer state in small chunks). */
static void delay_copies(size_t offload_chunk) {
    qt_test_hooks h = {.offload_chunk = offload_chunk, .offload_residual_delay_ms = DELAY_MS};
    qt_test_hooks_set(&h);
}

static void test_recompute_bf16(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    delay_copies(0);
    group("bf16", "parallel: {gpus: 1}\n" NOTUNE, SETS, NSETS);
    group("bf16_graph", "parallel: {gpus: 1}\n" GRAPHS, SETS, NSETS);
    qt_test_hooks_set(NULL);
}

static void test_recompute_fp8(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    delay_copies(0);
    group("fp8", "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3}\n" NOTUNE, SETS, NSETS);
    group("fp8pq_graph",
          "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true}\n" GRAPHS, SETS,
          NSETS);
    group("fp8_bf16bwd", "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3, grad_dtype: bf16}\n" NOTUNE, SETS, NSETS);
    qt_test_hooks_set(NULL);
}

/* 2 ranks on GPU 0 (or 2 GPUs; 4 on 4), ZeRO-1 with the sums overlapping the backward, from graphs (each rank its
 * own host residuals and copy stream); and one GPU with the optimizer state in host memory. */
static void test_recompute_dp_offload(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const char *two = qt_t_ranks(qt_cuda_device_count() >= 4 ? 4 : 2); /* 4 ranks on a 4-GPU machine */
    const char *const dp_sets[] = {"recompute: [block]", "recompute: [ffn, norm]", "offload_residual: true",
                                   "recompute: [block], offload_residual: true",
                                   "recompute: [ffn, norm], offload_residual: true"};
    char base[512];
    delay_copies(1000);
    snprintf(base, sizeof base, "parallel: {%s, shard_optimizer: true, overlap_comm: true}\n" GRAPHS, two);
    group("dp_bf16", base, dp_sets, 5);
    snprintf(base, sizeof base,
             "parallel: {%s, shard_optimizer: true, overlap_comm: true}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3, "
             "persistent_quants: true}\n" GRAPHS, two);
    group("dp_fp8", base, dp_sets, 5);
    const char *const off_sets[] = {"recompute: [block], offload_optimizer: true",
                                    "offload_residual: true, offload_optimizer: true",
                                    "recompute: [ffn, norm], offload_residual: true, offload_optimizer: true"};
    group("offload", "parallel: {gpus: 1}\n" NOTUNE, off_sets, 3);
    qt_test_hooks_set(NULL);
}

/* Runs `memory` eager in bf16 with the test hooks h and mutant m and says whether it trains ref's bits. */
#define FP8(g, pq) "precision: {matmul_dtype: e4m3, grad_dtype: " g ", persistent_quants: " pq "}\n"
static int mutant_same(const run_out *ref, const char *tag, const char *prec, const char *memory, const qt_test_hooks *h,
                       qt_mutant m, const char *what) {
    run_out got;
    char err[1024], why[512], extra[512];
    snprintf(extra, sizeof extra, "parallel: {gpus: 1}\n%s" NOTUNE "\nmemory: {%s}", prec, memory);
    qt_t_hooks(h, m);
    int rc = run(tag, extra, &got, err, sizeof err);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(rc == 0, "%s: %s", tag, err);
    if (rc) return 1;
    int same = same_bits(ref, &got, why, sizeof why);
    printf("  mutant (%s): %s\n", what, same ? "NOT caught" : why);
    return same;
}

/* The mutants: layer 1's backward reads the shared SwiGLU buffer as layer 2's backward left it (its dh;
 * the bf16 backward's down-projection weight gradient reads h, so the bits must move), and in fp8 the
 * shared Xq^T of down as layer 2's wgrad left it (the fused SwiGLU quantize skipped); with the residual
 * copies 20 ms late, a backward that reads a fetched residual without waiting for it (it reads layer
 * l + 2's), and a forward that overwrites a slot before its copy to host finished (the host gets layer
 * l + 2's residual). */
static void test_recompute_mutant_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    run_out ref, ref8;
    char err[1024];
    QT_REQUIRE(run("mut_none", "parallel: {gpus: 1}\n" NOTUNE, &ref, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(run("mut_none8", "parallel: {gpus: 1}\n" FP8("e4m3", "false") NOTUNE, &ref8, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(!mutant_same(&ref, "mut_swiglu", "", "recompute: [swiglu]", NULL, QT_MUT_RECOMPUTE_STALE_H, "stale SwiGLU buffer"),
              "the stale-buffer mutant trains the same bits: the comparison cannot fail");
    QT_EXPECT(!mutant_same(&ref8, "mut_swiglu8", FP8("e4m3", "false"), "recompute: [swiglu]", NULL, QT_MUT_RECOMPUTE_STALE_H,
                           "fp8: stale Xq^T of down"),
              "the stale fp8 Xq^T mutant trains the same bits: the comparison cannot fail");
    qt_test_hooks h = {.offload_residual_delay_ms = 20};
    QT_EXPECT(!mutant_same(&ref, "mut_fetch", "", "recompute: [block], offload_residual: true", &h, QT_MUT_RESIDUAL_READ_NO_WAIT,
                           "fetch not waited for"),
              "a backward that does not wait for the residual's fetch trains the same bits: the test cannot catch it");
    QT_EXPECT(!mutant_same(&ref, "mut_slot", "", "offload_residual: true", &h, QT_MUT_RESIDUAL_REUSE_NO_WAIT,
                           "slot reused before its copy out"),
              "a slot overwritten before its copy to host trains the same bits: the test cannot catch it");
}

/* ---- the plan against the device memory a run takes ---- */

typedef struct {
    volatile int stop;
    size_t min_free;
} sampler;

/* Samples the device's free memory every 200 us until stop, keeping the least. */
static void *sample(void *arg) {
    sampler *sp = arg;
    QT_CUDA(cudaSetDevice(0));
    struct timespec t = {0, 200000};
    while (!sp->stop) {
        size_t f, tot;
        QT_CUDA(cudaMemGetInfo(&f, &tot));
        if (f < sp->min_free) sp->min_free = f;
        nanosleep(&t, NULL);
    }
    return NULL;
}

/* A 12-layer model (N = 16 x 256 tokens) for `memory`: its plan's bytes (qt_gpu_model_plan, as the engine
 * sizes one GPU) and the most device memory a 4-step run took beyond what was in use before it. */
static void plan_and_peak(const char *tag, const char *memory, size_t *plan, size_t *peak) {
    char yaml[2048], err[1024];
    snprintf(yaml, sizeof yaml,
             "model: {vocab_size: 256, hidden_size: 768, num_layers: 12, num_heads: 12, num_kv_heads: 4,\n"
             "        intermediate_size: 2048, max_seq_len: 256, tie_embeddings: false}\n"
             "data: {train: '%s/syn_train_*.bin.zst', seq_len: 256, micro_batch: 16, grad_accum: 1}\n"
             "optim: {lr: 0.001, warmup: 1, steps: 4}\ncheckpoint: {dir: '%s/ckpt_%s', every: 0, keep: 1}\n"
             "device: cuda\nparallel: {gpus: 1}\n" NOTUNE "\nmemory: {%s}\n",
             g_dir, g_dir, tag, memory);
    qt_config c;
    QT_REQUIRE(qt_config_load_string(&c, yaml, "peak.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    qt_model_cfg mc = c.model;
    qt_model_cfg_finish(&mc);
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
    qt_shard one;
    qt_shard_init(&one, &L, 1, 0, 0);
    qt_plan pl = {.parallel.zero = 0}, tp; /* everything on the device */
    qt_mem_plan p;
    QT_REQUIRE(qt_gpu_model_plan(&L, qt_t_placed(&tp, &c, &L, &pl), &one, &p, err, sizeof err) == 0, "%s", err);
    *plan = p.off;
    size_t before, tot;
    QT_CUDA(cudaSetDevice(0));
    QT_CUDA(cudaMemGetInfo(&before, &tot));
    sampler sp = {0, before};
    pthread_t th;
    QT_REQUIRE(pthread_create(&th, NULL, sample, &sp) == 0, "pthread_create");
    qt_train_opts opts = {NULL, -1, 0, NULL, NULL, NULL};
    int rc = qt_train_run(&c, &opts, NULL, err, sizeof err);
    sp.stop = 1;
    pthread_join(th, NULL);
    QT_REQUIRE(rc == 0, "%s: %s", tag, err);
    *peak = before - sp.min_free;
    qt_layout_free(&L);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt_%s", g_dir, tag); /* 1 GiB each */
    qt_t_rmtree(dir);
}

/* The plan is what the run allocates: each run takes at least its plan and, after a warm-up run that
 * loads the kernels on first use (its peak is printed, checked only against the plan), at most MARGIN
 * more (cuBLASLt's 64 MiB and cuDNN's workspaces; eager steps, no graphs); the difference between the
 * two measured runs' peaks is the difference of their plans within 64 MiB (what the plan leaves out is
 * the same for both). */
static void test_plan_matches_device(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    char p[512];
    snprintf(p, sizeof p, "%s/syn_train_0.bin.zst", g_dir);
    qt_t_write_synthetic(p, 200000, 2);
    const size_t MiB = 1 << 20, MARGIN = 1024 * MiB;
    size_t plan[3], peak[3];
    const char *mem[3] = {"recompute: []", "recompute: []", "recompute: [block], offload_residual: true"};
    for (int k = 0; k < 3; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "peak_%d", k);
        plan_and_peak(tag, mem[k], &plan[k], &peak[k]);
        printf("  %-44s plan %8.1f MiB, measured peak %8.1f MiB (+%.1f)\n", mem[k], plan[k] / (double)MiB,
               peak[k] / (double)MiB, ((double)peak[k] - plan[k]) / MiB);
        QT_EXPECT(peak[k] >= plan[k] && (k == 0 || peak[k] <= plan[k] + MARGIN), "%s: peak %zu vs plan %zu (margin %zu)",
                  mem[k], peak[k], plan[k], MARGIN);
    }
    double dplan = (double)plan[1] - plan[2], dpeak = (double)peak[1] - peak[2];
    printf("  saving: plan %.1f MiB, measured %.1f MiB\n", dplan / MiB, dpeak / MiB);
    QT_EXPECT(dplan > 512.0 * MiB && fabs(dpeak - dplan) <= 64.0 * MiB, "saving: measured %.1f MiB, planned %.1f MiB",
              dpeak / MiB, dplan / MiB);
    setup_data(); /* the other tests' data again */
}

/* An fp8 backward shares ln1, ln2 and h over the layers (qt_act_policy.fp8_bwd): the same bits as every layer
 * keeping its own (test hook act_own_inputs), with nothing recomputed and with qkv, ffn and block (which
 * rebuild ln1 / ln2 into the shared buffer before the matmul reads it), eager and from graphs. A recompute
 * that reads the shared norm output as the forward's last layer left it (a mutant: the mutant build only)
 * must differ. */
static void test_fp8_shared_inputs(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    static const char *const sets[] = {"recompute: []", "recompute: [qkv]", "recompute: [ffn]", "recompute: [block]"};
    char yaml[512], tag[64], err[1024], why[512];
    for (int gr = 0; gr < 2; gr++)
        for (int k = 0; k < 4; k++) {
            run_out own, shared;
            snprintf(yaml, sizeof yaml, "parallel: {gpus: 1}\n%s%s\nmemory: {%s}", FP8("e4m3", "false"),
                     gr ? GRAPHS : NOTUNE, sets[k]);
            qt_test_hooks h = {.act_own_inputs = 1};
            qt_test_hooks_set(&h);
            snprintf(tag, sizeof tag, "own_%d_%d", gr, k);
            int rc = run(tag, yaml, &own, err, sizeof err);
            qt_test_hooks_set(NULL);
            QT_REQUIRE(rc == 0, "%s: %s", tag, err);
            snprintf(tag, sizeof tag, "shared_%d_%d", gr, k);
            QT_REQUIRE(run(tag, yaml, &shared, err, sizeof err) == 0, "%s: %s", tag, err);
            int same = same_bits(&own, &shared, why, sizeof why);
            printf("  fp8%s %-20s shared ln1/ln2/h vs own: %s\n", gr ? " graphs" : "       ", sets[k], same ? "bitwise equal" : why);
            QT_EXPECT(same, "%s, %s: %s", gr ? "graphs" : "eager", sets[k], why);
            if (gr || k == 0 || k == 3) continue; /* the mutant: qkv and ffn rebuild a norm output that block rebuilds anyway */
            if (!QT_T_MUTANTS) {
                printf("  mutant (%s reads a stale shared norm output): " QT_T_MUTANTS_ONLY "\n", sets[k]);
                continue;
            }
            qt_t_hooks(NULL, QT_MUT_RECOMPUTE_STALE_LN);
            snprintf(tag, sizeof tag, "stale_ln_%d", k);
            rc = run(tag, yaml, &shared, err, sizeof err);
            qt_t_hooks(NULL, QT_MUT_NONE);
            QT_REQUIRE(rc == 0, "%s: %s", tag, err);
            same = same_bits(&own, &shared, why, sizeof why);
            printf("  mutant (%s reads a stale shared norm output): %s\n", sets[k], same ? "NOT caught" : why);
            QT_EXPECT(!same, "the stale-norm mutant trains the same bits with %s: the test cannot catch it", sets[k]);
        }
}

/* memory.fp8_weight_cache: none = all, bit for bit (each group's baseline caches all layers). */
static const char *const WC_SETS[] = {"fp8_weight_cache: none", "fp8_weight_cache: none, recompute: [block]",
                                      "fp8_weight_cache: none, recompute: [ffn, norm]"};

static void test_fp8_weight_cache(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    group("wc_fp8", "parallel: {gpus: 1}\n" FP8("e4m3", "false") NOTUNE, WC_SETS, 3);
    group("wc_fp8_graph", "parallel: {gpus: 1}\n" FP8("e4m3", "false") GRAPHS, WC_SETS, 3);
    group("wc_fp8pq", "parallel: {gpus: 1}\n" FP8("e4m3", "true") NOTUNE, WC_SETS, 3);
    group("wc_fp8pq_graph", "parallel: {gpus: 1}\n" FP8("e4m3", "true") GRAPHS, WC_SETS, 3);
    group("wc_fp8_bf16bwd", "parallel: {gpus: 1}\n" FP8("bf16", "true") NOTUNE, WC_SETS, 3);
    const char *two = qt_t_ranks(qt_cuda_device_count() >= 4 ? 4 : 2); /* 4 ranks on a 4-GPU machine */
    char base[512];
    snprintf(base, sizeof base, "parallel: {%s, shard_optimizer: true, overlap_comm: true}\n" FP8("e4m3", "true") GRAPHS, two);
    group("wc_dp_fp8", base, WC_SETS, 2);
}

/* The weight-cache mutants: each must move the bits away from the cached run's. */
static void test_fp8_weight_cache_mutants(void) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const char *base = "parallel: {gpus: 1}\n" FP8("e4m3", "true") NOTUNE;
    run_out ref, got;
    char err[1024], why[512], yaml[1024];
    QT_REQUIRE(run("wcmut_all", base, &ref, err, sizeof err) == 0, "%s", err);
    snprintf(yaml, sizeof yaml, "%s\nmemory: {fp8_weight_cache: none}", base);
    const char *names[2] = {"backward reads a slot layer l + 2 left", "quants with the first step's scale"};
    for (int m = 0; m < 2; m++) {
        qt_t_hooks(NULL, m ? QT_MUT_FP8_WCACHE_STALE_SCALE : QT_MUT_FP8_WSLOT_STALE);
        int rc = run(m ? "wcmut_scale" : "wcmut_slot", yaml, &got, err, sizeof err);
        qt_t_hooks(NULL, QT_MUT_NONE);
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
    QT_RUN(test_fp8_shared_inputs);
    QT_RUN(test_recompute_dp_offload);
    QT_RUN(test_plan_matches_device);
    QT_RUN(test_fp8_weight_cache_mutants);
    QT_RUN(test_fp8_weight_cache);
    qt_t_rmtree(g_dir);
    return qt_test_end();
}
