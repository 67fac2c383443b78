/* test_qlora.c — QLoRA: LoRA over a frozen base whose block matrices the GPU holds in NF4 (lora.base_dtype: nf4,
 * src/gpu/base_nf4.c). Without a GPU: the key's errors, the CPU engine's NF4 base training the bits of the base of its
 * dequantized weights, the memory plan's rows (codes at half a byte per weight, the double-quantized scales, the
 * bf16 rest and the two layer slots) and an 8B shape's bits per weight. With a GPU:
 * the NF4 base trains to the same bits as a bf16 base loaded with the weights the CPU reference codec dequantizes
 * (losses, logits, the merged weights), a bit-exact resume whose loss falls, and recompute bitwise equal to none;
 * in the mutant build a slot filled with the block before's weights (not refreshed for its block) is caught.
 * The streamed base (memory.offload: [weights], base_stream.c): without a GPU its plan rows (the block matrices in
 * pinned host memory, two layer slots on the GPU); with one, bf16 and NF4 bases streamed train the resident bases'
 * bits with and without the block recompute, resume bit-exact, and in the mutant build a block copied up from the
 * block before's host bytes is caught; two ranks on one GPU sharing one pinned copy of the streamed base train what one
 * GPU accumulating their micro-batches trains over the resident base, bit for bit (bf16 and NF4), and resume bit-exact
 * (the mutant build: a borrowing rank streaming the wrong layers is caught). The bench's base drawn on the GPU equals the host's draw but for rare last
 * bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_device.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_hf.h"
#include "qt_lora.h"
#include "qt_modes.h"
#include "qt_nf4.h"
#include "qt_planner.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_test_steps.h"
#include "qt_train.h"

static char g_dir[256];

static int load(qt_config *c, const char *yaml, char *err, size_t errlen) {
    return qt_config_load_string(c, yaml, "t.yaml", NULL, 0, err, errlen);
}

/* The test run: 3 layers (slot 0 holds blocks 0 and 2 in turn), heads 64 wide (cuDNN's attention), one GPU, the
 * matmuls' heuristic algorithms (two engines compared bit for bit pick the same ones). extra: more YAML lines. */
static const char *run_yaml(char *yaml, size_t cap, const char *tag, const char *base, const char *extra) {
    snprintf(yaml, cap,
             "model: {vocab_size: 64, hidden_size: 128, num_layers: 3, num_heads: 2, num_kv_heads: 1,\n"
             "        intermediate_size: 200, max_seq_len: 64, qkv_bias: true, tie_embeddings: true}\n"
             "init: {seed: 3, std: 0.1}\n"
             "data: {train: '%s/syn_train_*.bin.zst', eval: '%s/syn_eval_*.bin', seq_len: 24, micro_batch: 3, grad_accum: 2}\n"
             "optim: {lr: 0.01, warmup: 3, steps: 20, schedule: cosine, grad_clip: 1.0, weight_decay: 0.1}\n"
             "eval: {every: 5, batches: 2}\n"
             "checkpoint: {dir: '%s/ckpt_%s', every: 0, keep: 2}\n"
             "log: {file: '%s/log_%s.jsonl', every: 5}\n"
             "lora: {rank: 4, alpha: 8, dropout: 0.1, base_dtype: %s}\n"
             "device: cuda\nparallel: {gpus: 1}\nperf: {matmul_autotune: false}\n%s",
             g_dir, g_dir, g_dir, tag, g_dir, tag, base, extra);
    return yaml;
}

static void write_data(void) {
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/syn_train_0.bin.zst", g_dir);
    snprintf(p2, sizeof p2, "%s/syn_eval_0.bin", g_dir);
    qt_t_write_synthetic(p1, 20000, 1);
    qt_t_write_synthetic(p2, 3000, 2);
}

/* lora.base_dtype: an unknown value, nf4 without adapters or with fp8 matmuls are refused naming the key and the
 * file; bf16 is the default. */
static void test_config_errors(void) {
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {"lora: {rank: 4, base_dtype: nf8}\n", "lora.base_dtype"},
        {"lora: {base_dtype: nf4}\n", "lora.rank > 0"},
        {"lora: {rank: 4, base_dtype: nf4}\nprecision: {matmul_dtype: e4m3}\n", "precision.matmul_dtype bf16"},
    };
    static qt_config c;
    char err[1024];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = load(&c, cases[i].yaml, err, sizeof err);
        QT_EXPECT(rc == -1 && strstr(err, "t.yaml:") && strstr(err, "lora.base_dtype") && strstr(err, cases[i].want),
                  "%s: got \"%s\"", cases[i].yaml, rc ? err : "accepted");
    }
    QT_REQUIRE(load(&c, "lora: {rank: 4}\n", err, sizeof err) == 0, "%s", err);
    QT_EXPECT(!c.lora.base_nf4, "the default base is not bf16");
    c.lora.base_nf4 = 1; /* set past the config's rules: the GPU engines refuse it too */
    c.precision.matmul_dtype = QT_DT_E4M3;
    const char *no = qt_engine_gpu_refusal(&c);
    QT_EXPECT(no && !strncmp(no, "lora.base_dtype", 15), "nf4 with fp8 matmuls: refusal %s", no ? no : "none");
    QT_REQUIRE(load(&c, "lora: {rank: 4, base_dtype: nf4}\n", err, sizeof err) == 0, "%s", err);
    QT_EXPECT(c.lora.base_nf4 == 1, "base_dtype nf4 parsed as %d", c.lora.base_nf4);
}

/* The block matrices of L: their elements, NF4 code bytes and double-quantized scale bytes (8-bit codes, an fp32
 * scale per 256 blocks and the offset), and the largest block's elements. */
typedef struct {
    size_t numel, codes, scales, layer_max;
} mats;
static mats block_mats(const qt_layout *L) {
    mats m = {0, 0, 0, 0};
    size_t per_layer[64] = {0};
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (!qt_lora_nf4_holds(t)) continue;
        m.numel += t->numel;
        m.codes += qt_nf4_code_bytes((long)t->numel);
        m.scales += qt_nf4_blocks((long)t->numel) + 4 * (1 + qt_nf4_blocks2((long)t->numel));
        if (t->layer < 64) per_layer[t->layer] += t->numel;
    }
    for (int l = 0; l < 64; l++) m.layer_max = per_layer[l] > m.layer_max ? per_layer[l] : m.layer_max;
    return m;
}

static size_t row_bytes(const qt_run_plan *rp, const char *kind) {
    size_t b = 0;
    for (int i = 0; i < rp->mem.n; i++) b += strcmp(rp->mem.row[i].kind, kind) ? 0 : rp->mem.row[i].bytes;
    return b;
}

/* The plan of cfg c on one GPU (no GPU needed); 0, or 1 when the build has no GPU planner. */
static int gpu_plan(const qt_config *c, qt_layout *L, qt_run_plan *rp) {
    qt_weight_src src;
    char err[1024];
    QT_CHECK(qt_model_layout(c, L, &src, err, sizeof err) == 0, "%s", err);
    if (qt_plan_run(L, c, 1, 1, rp, err, sizeof err) && strstr(err, "built without CUDA")) return 1;
    QT_CHECK(qt_plan_run(L, c, 1, 1, rp, err, sizeof err) == 0, "%s", err);
    return 0;
}
/* gpu_plan, or the calling test skipped in a CPU-only build. */
#define GPU_PLAN_OR_SKIP(c, L, rp)                                  \
    do {                                                             \
        if (gpu_plan(c, L, rp)) {                                    \
            qt_layout_free(L);                                       \
            QT_SKIP("a CPU-only build has no GPU planner");          \
        }                                                            \
    } while (0)

/* The adapter exports of runs a and b (their checkpoint folders ckpt_<a>, ckpt_<b>) are byte-identical. */
static void expect_same_exports(const char *a, const char *b) {
    char ea[600], eb[600];
    snprintf(ea, sizeof ea, "%s/ckpt_%s/export/adapter_model.safetensors", g_dir, a);
    snprintf(eb, sizeof eb, "%s/ckpt_%s/export/adapter_model.safetensors", g_dir, b);
    size_t na = 0, nb = 0;
    char *fa = qt_t_read_file(ea, &na), *fb = qt_t_read_file(eb, &nb);
    QT_EXPECT(fa && fb && na == nb && na > 0 && !memcmp(fa, fb, na), "adapter exports of %s and %s differ (%zu vs %zu bytes)",
              a, b, na, nb);
    free(fa), free(fb);
}

/* The NF4 plan's rows: codes of (n + 1) / 2 bytes per matrix, the scales, the rest of the base in bf16 and two
 * blocks' bf16 slots, each within its alignment (16 bytes per matrix, 256 per row); no bf16 copy of the whole base. */
static void test_plan_rows(void) {
    static qt_config c;
    char yaml[4096], err[1024];
    QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, "plan", "nf4", ""), err, sizeof err) == 0, "%s", err);
    qt_layout L;
    static qt_run_plan rp;
    GPU_PLAN_OR_SKIP(&c, &L, &rp);
    mats m = block_mats(&L);
    size_t nmat = 7 * (size_t)L.cfg.num_layers, codes = row_bytes(&rp, "frozen base: NF4 codes"),
           scales = row_bytes(&rp, "frozen base: NF4 scales"), rest = row_bytes(&rp, "frozen base (bf16 rest)"),
           slot = row_bytes(&rp, "NF4 layer slots (bf16, 2)");
    printf("  codes %zu (want %zu), scales %zu (want %zu), rest %zu (want %zu), slots %zu (want %zu)\n", codes, m.codes,
           scales, m.scales, rest, (L.numel - m.numel) * 2, slot, m.layer_max * 4);
    QT_EXPECT(codes >= m.codes && codes <= m.codes + 16 * nmat + 256, "codes row %zu bytes, expected ~%zu", codes, m.codes);
    QT_EXPECT(scales >= m.scales && scales <= m.scales + 32 * nmat + 512, "scales row %zu, expected ~%zu", scales, m.scales);
    QT_EXPECT(rest >= (L.numel - m.numel) * 2 && rest < (L.numel - m.numel) * 2 + 256, "bf16 rest row %zu, expected %zu",
              rest, (L.numel - m.numel) * 2);
    QT_EXPECT(slot >= m.layer_max * 4 && slot < m.layer_max * 4 + 256, "slots row %zu, expected two blocks' bf16 %zu", slot,
              m.layer_max * 4);
    QT_EXPECT(!row_bytes(&rp, "frozen base (bf16)"), "the NF4 plan holds the whole bf16 base");
    qt_layout_free(&L);
}

/* The streamed NF4 and bf16 plans: the block matrices in pinned host memory (NF4: the resident codes and scales'
 * bytes; bf16: 2 bytes per weight), on the GPU only the bf16 rest, two bf16 layer slots and (NF4) two layers' packed
 * codes and scales; no resident codes, scales or whole bf16 base. */
static void test_plan_rows_streamed(void) {
    static qt_config c;
    char yaml[4096], err[1024];
    QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, "plan", "nf4", "memory: {offload: [weights]}\n"), err, sizeof err) == 0,
               "%s", err);
    qt_layout L;
    static qt_run_plan rp, rr;
    GPU_PLAN_OR_SKIP(&c, &L, &rp);
    mats m = block_mats(&L);
    size_t nmat = 7 * (size_t)L.cfg.num_layers, nl = (size_t)L.cfg.num_layers;
    size_t host = row_bytes(&rp, "frozen base: NF4 (pinned host)"), packed = row_bytes(&rp, "NF4 streamed layers (packed, 2)");
    size_t slot = row_bytes(&rp, "NF4 layer slots (bf16, 2)"), rest = row_bytes(&rp, "frozen base (bf16 rest)");
    printf("  NF4 streamed: pinned %zu (want ~%zu), packed slots %zu (want ~%zu), bf16 slots %zu, rest %zu\n", host,
           m.codes + m.scales, packed, 2 * (m.codes + m.scales) / nl, slot, rest);
    QT_EXPECT(host >= m.codes + m.scales && host <= m.codes + m.scales + 48 * nmat + 768, "pinned row %zu, expected ~%zu",
              host, m.codes + m.scales);
    QT_EXPECT(packed >= 2 * (m.codes + m.scales) / nl && packed <= 2 * (m.codes + m.scales + 48 * nmat) / nl + 4096,
              "packed slots row %zu, expected two layers' ~%zu", packed, 2 * (m.codes + m.scales) / nl);
    QT_EXPECT(slot >= m.layer_max * 4 && slot < m.layer_max * 4 + 256, "bf16 slots row %zu, expected %zu", slot, m.layer_max * 4);
    QT_EXPECT(rest >= (L.numel - m.numel) * 2 && rest < (L.numel - m.numel) * 2 + 256, "rest row %zu", rest);
    QT_EXPECT(!row_bytes(&rp, "frozen base: NF4 codes") && !row_bytes(&rp, "frozen base: NF4 scales") &&
                  !row_bytes(&rp, "frozen base (bf16)"), "the streamed NF4 plan holds codes, scales or the bf16 base on the GPU");
    QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, "plan", "nf4", ""), err, sizeof err) == 0, "%s", err);
    qt_layout_free(&L);
    QT_REQUIRE(gpu_plan(&c, &L, &rr) == 0, "resident plan");
    QT_EXPECT(qt_mem_plan_device_total(&rp.mem) < qt_mem_plan_device_total(&rr.mem) &&
                  qt_mem_plan_host_total(&rp.mem) >= qt_mem_plan_host_total(&rr.mem) + host,
              "streamed: device %zu, host %zu; resident: device %zu, host %zu", qt_mem_plan_device_total(&rp.mem),
              qt_mem_plan_host_total(&rp.mem), qt_mem_plan_device_total(&rr.mem), qt_mem_plan_host_total(&rr.mem));
    QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, "plan", "bf16", "memory: {offload: [weights]}\n"), err, sizeof err) == 0,
               "%s", err);
    qt_layout_free(&L);
    QT_REQUIRE(gpu_plan(&c, &L, &rp) == 0, "bf16 streamed plan");
    host = row_bytes(&rp, "frozen base: bf16 blocks (pinned host)");
    slot = row_bytes(&rp, "base layer slots (bf16, 2)");
    printf("  bf16 streamed: pinned %zu (want ~%zu), slots %zu\n", host, m.numel * 2, slot);
    QT_EXPECT(host >= m.numel * 2 && host <= m.numel * 2 + 256 * nmat, "pinned row %zu, expected ~%zu", host, m.numel * 2);
    QT_EXPECT(slot >= m.layer_max * 4 && slot <= m.layer_max * 4 + 2 * 256 * 7 + 512, "slots row %zu, expected ~%zu", slot,
              m.layer_max * 4);
    QT_EXPECT(!row_bytes(&rp, "frozen base (bf16)") && !row_bytes(&rp, "frozen base: NF4 codes"),
              "the streamed bf16 plan holds the block matrices on the GPU");
    qt_layout_free(&L);
}

/* Llama-3.1-8B's shape: the block matrices at ~4.13 bits per weight (4 + 8/64 + 32/16384), the whole base with its
 * bf16 embeddings and LM head printed beside the bf16 base's. */
static void test_plan_8b(void) {
    static qt_config c;
    char err[1024];
    QT_REQUIRE(load(&c,
                    "model: {arch: llama, vocab_size: 128256, hidden_size: 4096, num_layers: 32, num_heads: 32, "
                    "num_kv_heads: 8, intermediate_size: 14336, max_seq_len: 8192, tie_embeddings: false}\n"
                    "data: {train: x.bin, seq_len: 1024, micro_batch: 1}\nmemory: {recompute: [block]}\n"
                    "lora: {rank: 16, alpha: 32, base_dtype: nf4}\ndevice: cuda\n",
                    err, sizeof err) == 0, "%s", err);
    qt_layout L;
    static qt_run_plan rp, rb;
    GPU_PLAN_OR_SKIP(&c, &L, &rp);
    mats m = block_mats(&L);
    size_t q = row_bytes(&rp, "frozen base: NF4 codes") + row_bytes(&rp, "frozen base: NF4 scales");
    size_t base = q + row_bytes(&rp, "frozen base (bf16 rest)");
    double bits = 8.0 * q / m.numel, all = 8.0 * base / L.n_params;
    qt_layout_free(&L);
    c.lora.base_nf4 = 0;
    QT_REQUIRE(gpu_plan(&c, &L, &rb) == 0, "bf16 plan");
    printf("  8B: block matrices %.4f bits per weight (%.2f GiB), the base %.3f bits per weight (%.2f GiB; bf16 %.2f "
           "GiB), slots %.0f MiB; device total nf4 %.2f GiB, bf16 %.2f GiB\n", bits, q / 1073741824.0, all,
           base / 1073741824.0, row_bytes(&rb, "frozen base (bf16)") / 1073741824.0,
           row_bytes(&rp, "NF4 layer slots (bf16, 2)") / 1048576.0, qt_mem_plan_device_total(&rp.mem) / 1073741824.0,
           qt_mem_plan_device_total(&rb.mem) / 1073741824.0);
    QT_EXPECT(bits > 4.125 && bits < 4.13, "block matrices at %.4f bits per weight, expected 4.127", bits);
    QT_EXPECT(all < 6.0 && base < row_bytes(&rb, "frozen base (bf16)") * 0.36, "the NF4 base at %.3f bits per weight", all);
    qt_layout_free(&L);
}

/* qt_t_fixed_steps on e (vocabulary 64), then its merged weights into w. */
static void run_engine(qt_engine *e, int steps, float *loss, float *logits, float *w) {
    char err[1024];
    qt_t_fixed_steps(e, steps, 64, loss, logits);
    QT_CHECK(qt_engine_get_weights(e, w, err, sizeof err) == 0, "%s", err);
}

/* The NF4 base against a bf16 base loaded (init.from, fp32 safetensors) with the block matrices of the same init
 * through the CPU reference codec (qt_nf4_roundtrip_ref, each on its own from its bf16 rounding): the same weights
 * in every matmul, so the same bits: 4 steps' losses, the logits and the merged weights (the NF4 base's get()). On
 * dev (QT_DEVICE_CUDA: the GPU's bf16 base and NF4 slots; QT_DEVICE_CPU: the fp32 engine). Returns 1 when every bit
 * agrees; prints the first difference. */
static int nf4_equals_dequantized_bf16(const char *tag, qt_device_kind dev) {
    write_data();
    enum { STEPS = 4 };
    static qt_config c[2];
    char yaml[4096], err[1024], dir[600];
    qt_layout L[2];
    qt_weight_src src[2];
    float loss[2][STEPS], *logits[2], *w[2];
    QT_CHECK(load(&c[0], run_yaml(yaml, sizeof yaml, tag, "nf4", ""), err, sizeof err) == 0, "%s", err);
    QT_CHECK(load(&c[1], run_yaml(yaml, sizeof yaml, tag, "bf16", ""), err, sizeof err) == 0, "%s", err);
    QT_CHECK(qt_model_layout(&c[0], &L[0], &src[0], err, sizeof err) == 0, "%s", err);
    float *ref = malloc(L[0].numel * 4);
    QT_CHECK(qt_weight_src_fill(&src[0], 0, L[0].numel, ref, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < L[0].n_tensors; i++) {
        const qt_tensor *t = &L[0].tensors[i];
        if (qt_lora_nf4_holds(t))
            QT_CHECK(qt_nf4_roundtrip_ref(ref + t->offset, (long)t->numel, t->name, err, sizeof err) == 0, "%s", err);
    }
    snprintf(dir, sizeof dir, "%s/dequant_%s", g_dir, tag);
    QT_CHECK(qt_hf_export(dir, &L[0], ref, 0, err, sizeof err) == 0, "%s", err);
    snprintf(c[1].init.from, sizeof c[1].init.from, "%s", dir);
    QT_CHECK(qt_model_layout(&c[1], &L[1], &src[1], err, sizeof err) == 0, "%s", err);
    QT_CHECK(L[1].numel == L[0].numel, "layouts differ");
    long NV = (long)c[0].data.micro_batch * c[0].data.seq_len * L[0].cfg.vocab_size;
    c[0].device = c[1].device = dev;
    for (int k = 0; k < 2; k++) {
        qt_engine *e = qt_engine_create(&L[k], &c[k], &src[k], err, sizeof err);
        QT_CHECK(e, "%s engine: %s", k ? "bf16" : "nf4", err);
        logits[k] = malloc(NV * 4), w[k] = malloc(L[k].numel * 4);
        run_engine(e, STEPS, loss[k], logits[k], w[k]);
        qt_engine_free(e);
    }
    int same = 1;
    for (int s = 0; s < STEPS; s++) {
        printf("  step %d: loss nf4 %.9g, bf16 over the dequantized weights %.9g\n", s + 1, loss[0][s], loss[1][s]);
        same &= !memcmp(&loss[0][s], &loss[1][s], 4);
    }
    long i = 0;
    while (i < NV && !memcmp(&logits[0][i], &logits[1][i], 4)) i++;
    if (i < NV) printf("  logit %ld: nf4 %.9g, bf16 %.9g\n", i, logits[0][i], logits[1][i]);
    size_t j = 0;
    while (j < L[0].numel && !memcmp(&w[0][j], &w[1][j], 4)) j++;
    if (j < L[0].numel) printf("  merged weight %zu: nf4 %.9g, bf16 %.9g\n", j, w[0][j], w[1][j]);
    same &= i == NV && j == L[0].numel;
    free(ref), free(logits[0]), free(logits[1]), free(w[0]), free(w[1]);
    qt_layout_free(&L[0]);
    qt_layout_free(&L[1]);
    return same;
}

/* The CPU engine's NF4 base (its block matrices through the codec at load, held in fp32) trains the bits of the fp32
 * base loaded with those weights. */
static void test_cpu_equals_dequantized(void) {
    QT_EXPECT(nf4_equals_dequantized_bf16("cpu", QT_DEVICE_CPU), "the CPU engine's NF4 base trains other bits than "
              "the base of its dequantized weights");
}

static void test_gpu_equals_dequantized_bf16(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    QT_EXPECT(nf4_equals_dequantized_bf16("eq", QT_DEVICE_CUDA), "the NF4 base trains other bits than the bf16 base of its dequantized "
              "weights");
}

/* The mutant build: the slot of blocks 1.. gets the block before's weights; the comparison must see it. */
static void test_gpu_mutant_stale_slot(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    if (!QT_T_MUTANTS) QT_SKIP(QT_T_MUTANTS_ONLY);
    qt_t_hooks(NULL, QT_MUT_NF4_SLOT_STALE);
    int same = nf4_equals_dequantized_bf16("mut", QT_DEVICE_CUDA);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(!same, "a stale NF4 slot trains the same bits: the comparison cannot fail");
}

/* 10 steps + resume + 10 steps of QLoRA equal 20 straight steps bit for bit, the loss falls and the PEFT exports are
 * byte-identical; the checkpoint's base identity (the weights as read) lets a bf16 base of the same weights resume
 * it and refuses an NF4 base of other weights. */
static void test_gpu_resume_bit_exact(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    write_data();
    static qt_config a, b;
    char yaml[4096], err[1024];
    float la[20], lb[20];
    QT_REQUIRE(load(&a, run_yaml(yaml, sizeof yaml, "straight", "nf4", ""), err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(load(&b, run_yaml(yaml, sizeof yaml, "halves", "nf4", ""), err, sizeof err) == 0, "%s", err);
    qt_train_opts oa = {NULL, -1, 0, la, NULL, NULL}, ob1 = {NULL, 10, 0, lb, NULL, NULL}, ob2 = {"latest", -1, 0, lb, NULL, NULL};
    qt_train_stats st;
    QT_REQUIRE(qt_train_run(&a, &oa, &st, err, sizeof err) == 0, "straight run: %s", err);
    QT_REQUIRE(st.steps_done == 20, "steps %ld", st.steps_done);
    QT_REQUIRE(qt_train_run(&b, &ob1, &st, err, sizeof err) == 0, "first half: %s", err);
    QT_REQUIRE(st.steps_done == 10, "stopped at %ld", st.steps_done);
    QT_REQUIRE(qt_train_run(&b, &ob2, &st, err, sizeof err) == 0, "resumed half: %s", err);
    for (int i = 0; i < 20; i++)
        QT_EXPECT(!memcmp(&la[i], &lb[i], 4), "step %d: straight %.9g, resumed %.9g", i + 1, la[i], lb[i]);
    printf("  loss %.4f -> %.4f\n", la[0], la[19]);
    QT_EXPECT(la[19] < la[0] - 0.05f, "loss did not fall: %g -> %g", la[0], la[19]);
    expect_same_exports("straight", "halves");
    /* a resume over the bf16 base of the same weights finds the same base (the identity is the weights as read) */
    QT_REQUIRE(load(&b, run_yaml(yaml, sizeof yaml, "halves", "bf16", ""), err, sizeof err) == 0, "%s", err);
    b.optim.steps = 21;
    qt_train_opts ob3 = {"latest", -1, 0, NULL, NULL, NULL};
    QT_EXPECT(qt_train_run(&b, &ob3, &st, err, sizeof err) == 0, "resume over the bf16 base of the same weights: %s", err);
    /* and over an NF4 base of other weights (another init seed) it is refused, naming the base */
    QT_REQUIRE(load(&b, run_yaml(yaml, sizeof yaml, "halves", "nf4", ""), err, sizeof err) == 0, "%s", err);
    b.optim.steps = 22;
    b.init.seed = 4;
    QT_EXPECT(qt_train_run(&b, &ob3, &st, err, sizeof err) == -1 && strstr(err, "lora_base"), "other weights: %s", err);
}

/* memory.recompute [block] and [norm, qkv, att] train QLoRA's adapters to the bits of no recompute: the recompute
 * before a block's backward reads that block's dequantized matrices. */
static void test_gpu_recompute_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    write_data();
    static qt_config c;
    static const char *const rc[3] = {"", "memory: {recompute: [norm, qkv, att]}\n", "memory: {recompute: [block]}\n"};
    char yaml[4096], err[1024], tag[32], ex[3][600];
    float loss[3][8];
    for (int k = 0; k < 3; k++) {
        snprintf(tag, sizeof tag, "rc%d", k);
        QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, tag, "nf4", rc[k]), err, sizeof err) == 0, "%s", err);
        c.optim.steps = 8;
        qt_train_opts o = {NULL, -1, 0, loss[k], NULL, NULL};
        qt_train_stats st;
        QT_REQUIRE(qt_train_run(&c, &o, &st, err, sizeof err) == 0, "%s: %s", tag, err);
        snprintf(ex[k], sizeof ex[k], "%s/ckpt_%s/export/adapter_model.safetensors", g_dir, tag);
    }
    size_t na = 0;
    char *fa = qt_t_read_file(ex[0], &na);
    for (int k = 1; k < 3; k++) {
        for (int s = 0; s < 8; s++)
            QT_EXPECT(!memcmp(&loss[0][s], &loss[k][s], 4), "%sstep %d: %.9g without recompute, %.9g with", rc[k], s + 1,
                      loss[0][s], loss[k][s]);
        size_t nb = 0;
        char *fb = qt_t_read_file(ex[k], &nb);
        QT_EXPECT(fa && fb && na == nb && na > 0 && !memcmp(fa, fb, na), "%sadapter exports differ", rc[k]);
        free(fb);
    }
    free(fa);
}

/* Two data-parallel ranks on GPU 0 (grad_accum 1) sharing one pinned copy of the streamed base: c's ranks. */
static void two_ranks(qt_config *c) {
    c->data.grad_accum = 1;
    c->parallel.devices.n = 2; /* both on GPU 0 */
}

/* memory.offload: [weights] (streamed from pinned host memory) against the resident base, base "bf16" or "nf4", with
 * extra memory keys rc ("" or "recompute: [block], "); ranks 1: the streamed run on two ranks sharing the base
 * (two_ranks) against one GPU accumulating their micro-batches. 8 steps' losses and the adapter exports, bit for bit.
 * *same = 1 when they agree; prints the first difference. */
static void streamed_vs_resident(const char *tag, const char *base, const char *rc, int ranks, int *same) {
    write_data();
    static qt_config c;
    char yaml[4096], err[1024], t[2][64], ex[2][600], mem[256];
    float loss[2][8];
    for (int k = 0; k < 2; k++) {
        snprintf(t[k], sizeof t[k], "%s_%s_%s%s", tag, base, k ? ranks ? "ranks" : "stream" : "resident", rc[0] ? "_rc" : "");
        snprintf(mem, sizeof mem, "memory: {plan: manual, %s%s}\n", rc, k ? "offload: [weights]" : "offload: []");
        QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, t[k], base, mem), err, sizeof err) == 0, "%s: %s", t[k], err);
        c.optim.steps = 8;
        if (k && ranks) two_ranks(&c);
        qt_train_opts o = {NULL, -1, 0, loss[k], NULL, NULL};
        qt_train_stats st;
        QT_REQUIRE(qt_train_run(&c, &o, &st, err, sizeof err) == 0, "%s: %s", t[k], err);
        snprintf(ex[k], sizeof ex[k], "%s/ckpt_%s/export/adapter_model.safetensors", g_dir, t[k]);
    }
    *same = 1;
    for (int s = 0; s < 8 && *same; s++)
        if (memcmp(&loss[0][s], &loss[1][s], 4))
            printf("  %s base%s: step %d: loss resident %.9g, streamed%s %.9g\n", base, rc[0] ? " (recompute)" : "", s + 1,
                   loss[0][s], ranks ? " on two ranks" : "", loss[1][s]), *same = 0;
    size_t na = 0, nb = 0;
    char *fa = qt_t_read_file(ex[0], &na), *fb = qt_t_read_file(ex[1], &nb);
    QT_REQUIRE(fa && fb && na > 0, "adapter exports %s, %s", ex[0], ex[1]);
    if (na != nb || memcmp(fa, fb, na)) printf("  %s base: the adapter exports differ\n", base), *same = 0;
    free(fa), free(fb);
}

/* The streamed bf16 and NF4 bases train the resident bases' bits, with and without the block recompute (which reads
 * each block's slot again before its backward). */
static void test_gpu_streamed_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    static const char *const bases[2] = {"bf16", "nf4"}, *const rcs[2] = {"", "recompute: [block], "};
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 2; r++) {
            int same = 0;
            streamed_vs_resident("st", bases[b], rcs[r], 0, &same);
            QT_EXPECT(same, "the streamed %s base%s trains other bits than the resident one", bases[b],
                      r ? " with recompute" : "");
        }
}

/* The mutant build: blocks 1.. copied up from the block before's host bytes; the comparison must see it. */
static void test_gpu_mutant_stream_wrong_layer(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    if (!QT_T_MUTANTS) QT_SKIP(QT_T_MUTANTS_ONLY);
    qt_t_hooks(NULL, QT_MUT_BASE_STREAM_WRONG_LAYER);
    int same_nf4 = 1, same_bf16 = 1;
    streamed_vs_resident("mw", "nf4", "", 0, &same_nf4);
    streamed_vs_resident("mw", "bf16", "", 0, &same_bf16);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(!same_nf4 && !same_bf16, "a block streamed from the wrong layer trains the same bits (nf4 %d, bf16 %d): "
              "the comparison cannot fail", same_nf4, same_bf16);
}

/* 5 steps + resume + 5 steps over the streamed NF4 base equal 10 straight steps bit for bit, the PEFT exports
 * byte-identical; tweak (or NULL) changes both configs after they are read, pre prefixes the runs' folders. */
static void streamed_resume(const char *pre, void (*tweak)(qt_config *)) {
    write_data();
    static qt_config a, b;
    static const char *const mem = "memory: {plan: manual, offload: [weights], recompute: [block]}\n";
    char yaml[4096], err[1024], ta[64], tb[64];
    float la[10], lb[10];
    snprintf(ta, sizeof ta, "%sst_straight", pre);
    snprintf(tb, sizeof tb, "%sst_halves", pre);
    QT_REQUIRE(load(&a, run_yaml(yaml, sizeof yaml, ta, "nf4", mem), err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(load(&b, run_yaml(yaml, sizeof yaml, tb, "nf4", mem), err, sizeof err) == 0, "%s", err);
    a.optim.steps = b.optim.steps = 10;
    if (tweak) tweak(&a), tweak(&b);
    qt_train_opts oa = {NULL, -1, 0, la, NULL, NULL}, ob1 = {NULL, 5, 0, lb, NULL, NULL}, ob2 = {"latest", -1, 0, lb, NULL, NULL};
    qt_train_stats st;
    QT_REQUIRE(qt_train_run(&a, &oa, &st, err, sizeof err) == 0, "straight run: %s", err);
    QT_REQUIRE(qt_train_run(&b, &ob1, &st, err, sizeof err) == 0, "first half: %s", err);
    QT_REQUIRE(st.steps_done == 5, "stopped at %ld", st.steps_done);
    QT_REQUIRE(qt_train_run(&b, &ob2, &st, err, sizeof err) == 0, "resumed half: %s", err);
    for (int i = 0; i < 10; i++)
        QT_EXPECT(!memcmp(&la[i], &lb[i], 4), "step %d: straight %.9g, resumed %.9g", i + 1, la[i], lb[i]);
    expect_same_exports(ta, tb);
}

static void test_gpu_streamed_resume_bit_exact(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    streamed_resume("", NULL);
}

/* The same with two ranks sharing the streamed base's pinned copy. */
static void test_gpu_streamed_ranks_resume_bit_exact(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    streamed_resume("r2", two_ranks);
}

/* Two ranks on GPU 0 sharing the streamed bf16 and NF4 bases train one GPU's bits over the resident base. */
static void test_gpu_streamed_ranks_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    static const char *const bases[2] = {"bf16", "nf4"};
    for (int b = 0; b < 2; b++) {
        int same = 0;
        streamed_vs_resident("sr", bases[b], "", 1, &same);
        QT_EXPECT(same, "two ranks sharing the streamed %s base train other bits than one GPU over the resident one",
                  bases[b]);
    }
}

/* The mutant build: the rank that borrows the pinned base copies blocks 1.. from the block before's bytes. */
static void test_gpu_mutant_share_wrong_layer(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    if (!QT_T_MUTANTS) QT_SKIP(QT_T_MUTANTS_ONLY);
    qt_t_hooks(NULL, QT_MUT_BASE_SHARE_WRONG_LAYER);
    int same = 1;
    streamed_vs_resident("ms", "nf4", "", 1, &same);
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(!same, "a borrowing rank streaming the wrong layers trains the same bits: the comparison cannot fail");
}

/* The bench's base drawn on the GPU (QT_WSRC_INIT_GPU: cuda/init.cu, src/gpu/base_fill.c) against the host's draw of
 * the same seed: the base's weights (get(), before any step) of a resident bf16 base and a streamed NF4 base agree
 * element for element but for the rare last-bit difference of CUDA's fp64 log / cos (at most 1 in 10^5 here, each
 * within a bf16 ulp for the bf16 base); norms, biases and padding exactly. */
static void test_gpu_base_drawn_on_gpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    write_data();
    static const char *const bases[2] = {"bf16", "nf4"}, *const mem[2] = {"", "memory: {plan: manual, offload: [weights]}\n"};
    for (int b = 0; b < 2; b++) {
        static qt_config c;
        char yaml[4096], err[1024];
        qt_layout L;
        qt_weight_src src;
        QT_REQUIRE(load(&c, run_yaml(yaml, sizeof yaml, "drawn", bases[b], mem[b]), err, sizeof err) == 0, "%s", err);
        QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
        float *w[2];
        for (int k = 0; k < 2; k++) {
            src.kind = k ? QT_WSRC_INIT_GPU : QT_WSRC_INIT;
            qt_engine *e = qt_engine_create(&L, &c, &src, err, sizeof err);
            QT_REQUIRE(e, "%s base, %s: %s", bases[b], k ? "drawn on the GPU" : "host init", err);
            w[k] = malloc(L.numel * 4);
            QT_REQUIRE(qt_engine_get_weights(e, w[k], err, sizeof err) == 0, "%s", err);
            qt_engine_free(e);
        }
        size_t diff = 0, far = 0;
        for (size_t i = 0; i < L.numel; i++) {
            if (!memcmp(&w[0][i], &w[1][i], 4)) continue;
            diff++;
            far += fabsf(w[0][i] - w[1][i]) > fabsf(w[0][i]) * 0x1.0p-7f || (b == 0 && w[0][i] == 0);
            if (diff <= 3) printf("  %s base, weight %zu: host %.9g, GPU %.9g\n", bases[b], i, w[0][i], w[1][i]);
        }
        printf("  %s base: %zu of %zu weights differ between the host's and the GPU's draw\n", bases[b], diff, L.numel);
        QT_EXPECT(diff * 100000 <= L.numel && (b || !far), "%s base drawn on the GPU: %zu of %zu weights differ (%zu by more "
                  "than a bf16 ulp)", bases[b], diff, L.numel, far);
        free(w[0]), free(w[1]);
        qt_layout_free(&L);
    }
}

int main(void) {
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_qlora")) return 1;
    QT_RUN(test_config_errors);
    QT_RUN(test_cpu_equals_dequantized);
    QT_RUN(test_plan_rows);
    QT_RUN(test_plan_rows_streamed);
    QT_RUN(test_plan_8b);
    QT_RUN(test_gpu_equals_dequantized_bf16);
    QT_RUN(test_gpu_mutant_stale_slot);
    QT_RUN(test_gpu_resume_bit_exact);
    QT_RUN(test_gpu_recompute_bitwise);
    QT_RUN(test_gpu_streamed_bitwise);
    QT_RUN(test_gpu_mutant_stream_wrong_layer);
    QT_RUN(test_gpu_streamed_resume_bit_exact);
    QT_RUN(test_gpu_streamed_ranks_bitwise);
    QT_RUN(test_gpu_mutant_share_wrong_layer);
    QT_RUN(test_gpu_streamed_ranks_resume_bit_exact);
    QT_RUN(test_gpu_base_drawn_on_gpu);
    qt_t_rmtree(g_dir);
    return qt_test_end();
}
