/* test_offload.c — memory.offload: [weights] and [gradients] on one GPU and with ZeRO ranks: the bf16 weights in pinned host
 * memory, read through ZeRO-3's weight slots (each bucket copied up on the side stream as the model
 * reaches it); the fp32 gradients in pinned host memory, written through ZeRO-2's gradient slots (each
 * loaded from host before its bucket is written, stored back after); both with the on-GPU bits.
 *
 * CPU (no GPU needed): the plan of Qwen2.5-7B on one GPU: the device row "weights (bf16)" (numel x 2
 * bytes) leaves, the host row "weights (bf16, offloaded)" (padded numel x 2) and the device rows
 * "weight slots (layers)" (2 shared slots of the largest layer bucket and the head-margin cache) and
 * "weight slots (emb/head)" (the embedding and untied LM-head buckets) come; every other row stays, and
 * qtrain --plan (qt_plan_run) shows the same rows. The config refusals live in test_config.
 * GPU (skips without one): a 5-layer model trains 20 steps at grad_accum 2; every logged loss and
 * gradient norm and the final checkpoint's weights, bf16 weights, m and v must be the same bytes with
 * the weights offloaded as without — bf16, fp8 (each layer quantized from its slot against the persistent
 * fp8 cache), a bf16 master (AdamW reads and writes the host weights in place), the optimizer state
 * offloaded too (chunks of 1000), block recompute; [weights, quants] (fp8: each layer's e4m3 codes copied up instead of
 * its bf16 matrices), also with everything else offloaded (the one-rank case). A run stopped at step 10 with the weights offloaded
 * and resumed without (and the other way) ends with the uninterrupted run's bits. Mutants (test hooks,
 * qt_weight_slots.h): a slot copied into before its last reader ran (reads delayed), a slot read without
 * waiting for its copy (copies delayed) must change the bits; with quants also codes made only once.
 * Gradients — CPU: the 7B rows (host "gradients (fp32, offloaded)", device gradient slots), the slot
 * homes (each element written at one place, which load and store move); GPU: offloaded = on the GPU
 * bitwise at grad_accum 2 (bf16, fp8, CUDA graphs, tied, optimizer offloaded, and everything offloaded
 * at once in bf16, fp8 and bf16 master + block recompute); mutants: a slot written before its store and
 * reload (stores delayed), a shared slot not zeroed after its store, the norm and AdamW before the last
 * stores (stores delayed).
 * Several ranks (QT_TEST_ONLY=offload_ranks) — CPU: 7B on 4 ranks, the shard rows move to the host
 * ("weights (bf16 shard, offloaded)", "gradients (fp32 shard, offloaded)"); the lifted and kept refusals.
 * GPU (qt_t_ranks: 2 and 3 ranks, on GPU 0 when there are fewer GPUs): ZeRO-3 + [weights], ZeRO-2/3 +
 * [gradients] and ZeRO-3 + both = the same ZeRO level without the offload, bitwise (bf16, fp8, overlap
 * on/off, grad_accum 2, bf16 master with the optimizer offloaded, tied, bf16 sums); mutants 7 (weight
 * slots from a stale device copy of the pieces), 8 (the host shard overwritten by each micro-step's sum)
 * and 2 (sums in descending rank order, 3 ranks) caught. Autotuning off: every run multiplies with the
 * same algorithms. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_device.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_param_store.h"
#include "qt_partition.h"
#include "qt_pinned.h"
#include "qt_planner.h"
#include "qt_test.h"
#include "qt_test_plan.h"
#include "qt_test_data.h"
#include "qt_test_hooks.h"
#include "qt_train.h"

enum { STEPS = QT_T_STEPS };
static char g_dir[256];
#define MODEL "model: {vocab_size: 256, hidden_size: 128, num_layers: 5, num_heads: 2, num_kv_heads: 1,\n" \
              "        intermediate_size: 96, max_seq_len: 64, tie_embeddings: false}\n"
#define TIED "model: {vocab_size: 8192, hidden_size: 128, num_layers: 5, num_heads: 2, num_kv_heads: 1,\n" \
             "        intermediate_size: 96, max_seq_len: 64, tie_embeddings: true}\n"
static const char *g_model = MODEL;
static int g_graphs; /* perf.cuda_graphs of the runs */
#define FP8 "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true}\n"
#define G16 "precision: {grad_accum_dtype: bf16}\n"

typedef qt_t_run_out run_out;

/* ---- CPU: the memory plan ---- */

static size_t row(const qt_mem_plan *p, const char *kind) {
    size_t b = 0;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->row[i].kind, kind)) b += p->row[i].bytes;
    return b;
}

/* The plan of config `path` with the n overrides o on `gpus` GPUs: *c, *L (the caller frees it) and *rp. 0, or
 * -1 with err. */
static int plan_of(const char *path, const char *const *o, int n, int gpus, qt_config *c, qt_layout *L, qt_run_plan *rp,
                   char *err, size_t errlen) {
    qt_weight_src src;
    if (qt_config_load(c, path, o, n, err, errlen)) return -1;
    if (qt_model_layout(c, L, &src, err, errlen)) return -1;
    if (qt_plan_run(L, c, gpus, 1, rp, err, errlen)) {
        qt_layout_free(L);
        return -1;
    }
    return 0;
}

/* qt_pinned_alloc, every flag set, an odd size: zeroed, pinned (the driver knows it as host memory: pageable
 * memory reads as unregistered), mapped at the same address where asked, a round trip through the GPU exact,
 * freed. */
static void test_pinned_alloc(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    size_t n = ((size_t)64 << 20) + 12345;
    unsigned char *dev;
    QT_CUDA(cudaMalloc((void **)&dev, n));
    for (unsigned flags = 0; flags < 4; flags++) {
        unsigned char *a, *b;
        QT_REQUIRE(qt_pinned_alloc((void **)&a, n, flags) == 0 && qt_pinned_alloc((void **)&b, n, flags) == 0,
                   "flags %u: qt_pinned_alloc failed", flags);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++) nonzero += a[i] != 0;
        struct cudaPointerAttributes at;
        QT_CUDA(cudaPointerGetAttributes(&at, a));
        for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 2654435761u >> 13);
        QT_CUDA(cudaMemcpy(dev, a, n, cudaMemcpyHostToDevice));
        QT_CUDA(cudaMemcpy(b, dev, n, cudaMemcpyDeviceToHost));
        void *mapped = NULL;
        if (flags & QT_PIN_MAPPED) QT_CUDA(cudaHostGetDevicePointer(&mapped, a, 0));
        printf("  flags %u: %zu nonzero bytes at start, memory type %d, round trip %s\n", flags, nonzero, (int)at.type,
               memcmp(a, b, n) ? "DIFFERS" : "exact");
        QT_EXPECT(nonzero == 0, "flags %u: %zu bytes not zeroed", flags, nonzero);
        QT_EXPECT(at.type == cudaMemoryTypeHost, "flags %u: memory type %d, not pinned host memory", flags, (int)at.type);
        QT_EXPECT(!memcmp(a, b, n), "flags %u: the round trip through the GPU differs", flags);
        QT_EXPECT(!(flags & QT_PIN_MAPPED) || mapped == (void *)a, "flags %u: mapped at %p, host %p", flags, mapped, (void *)a);
        qt_pinned_free(a);
        qt_pinned_free(b);
    }
    QT_CUDA(cudaFree(dev));
}

static void test_plan_7b_weights(void) {
    qt_config cfg[2];
    char err[512];
    const char *o[2][3] = {{"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[master, m, v]"},
                           {"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[weights, master, m, v]"}};
    static qt_run_plan rp[2];
    qt_layout L;
    for (int k = 0; k < 2; k++) {
        QT_REQUIRE(plan_of("configs/qwen2.5-7b-bf16.yaml", o[k], 3, 1, &cfg[k], &L, &rp[k], err, sizeof err) == 0, "%s", err);
        if (k == 0) qt_layout_free(&L);
    }
    QT_EXPECT(cfg[1].memory.offload_optimizer, "the list sets offload_optimizer");
    QT_EXPECT(cfg[0].memory.offload_optimizer, "the 7B config offloads its optimizer state");
    const double G = 1073741824.0;
    size_t total = (L.numel + 63) / 64 * 64, w0 = row(&rp[0].mem, "weights (bf16)"), w1 = row(&rp[1].mem, "weights (bf16)");
    size_t host = row(&rp[1].mem, "weights (bf16, offloaded)"), sl = row(&rp[1].mem, "weight slots (layers)"),
           se = row(&rp[1].mem, "weight slots (emb/head)");
    printf("  7B, one GPU: weights on the GPU %.2f GiB; offloaded: host %.2f GiB, layer slots %.3f GiB, emb/head slots "
           "%.3f GiB; GPU total %.2f -> %.2f GiB, host %.2f -> %.2f GiB\n", w0 / G, host / G, sl / G, se / G,
           rp[0].gpu_bytes / G, rp[1].gpu_bytes / G, rp[0].host_bytes / G, rp[1].host_bytes / G);
    QT_EXPECT(w0 == qt_mem_aligned(total * 2) && w1 == 0, "weights row %zu / %zu", w0, w1);
    QT_EXPECT(host == total * 2 && row(&rp[0].mem, "weights (bf16, offloaded)") == 0, "host row %zu, expected %zu", host,
              total * 2);
    QT_EXPECT(sl > 0 && se > 0 && row(&rp[0].mem, "weight slots (layers)") == 0, "slot rows %zu %zu", sl, se);
    /* a layer bucket of 7B is ~233M elements: two of them (x 2 bytes) plus margins, well under a tenth of w */
    size_t layer = (size_t)(L.layers[1].ln1 - L.layers[0].ln1);
    QT_EXPECT(sl >= 2 * layer * 2 && sl < 2 * layer * 2 + ((size_t)64 << 20), "layer slots %zu for layers of %zu", sl, layer);
    QT_EXPECT(se >= (size_t)L.cfg.vocab_size * L.cfg.hidden_size * 2 * 2, "emb/head slots %zu", se);
    /* the offloaded optimizer's slots carry the weights too (streamed up and down with the state) */
    size_t os = row(&rp[1].mem, "optimizer slots (offload)") - row(&rp[0].mem, "optimizer slots (offload)");
    QT_EXPECT(os == qt_gpu_optim_slot_bytes(QT_GPU_OPTIM_CHUNK, QT_OPTIM_W, QT_DT_F32, QT_DT_F32, QT_DT_F32),
              "the optimizer slots grow by %zu bytes", os);
    QT_EXPECT(rp[0].gpu_bytes - rp[1].gpu_bytes == w0 - sl - se - os, "the GPU saves %zu bytes, expected %zu",
              rp[0].gpu_bytes - rp[1].gpu_bytes, w0 - sl - se - os);
    /* the host array comes; the checkpoint snapshot's copy of the bf16 weights goes (the optimizer state is
     * offloaded too: checkpoints write the host weights in place, as they do m and v) */
    size_t s0 = row(&rp[0].mem, "checkpoint snapshot"), s1 = row(&rp[1].mem, "checkpoint snapshot");
    QT_EXPECT(s0 == L.numel * 2 && s1 == 0, "checkpoint snapshot rows %zu -> %zu, expected %zu -> 0", s0, s1, L.numel * 2);
    QT_EXPECT(rp[1].host_bytes + s0 - rp[0].host_bytes == host, "the host grows by %zu, expected %zu",
              rp[1].host_bytes - rp[0].host_bytes, host - s0);
    qt_layout_free(&L);
    /* quants (the fp8 config): the host gets the codes (1 byte per padded element) beside the bf16 array, the
     * GPU the shared slots' e4m3 halves (one byte per element of the two layer slots) and 64 abs-maxes (256 bytes) */
    const char *q[2][5] = {{"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[weights, master, m, v]",
                            "memory.fp8_weight_cache=none", "precision.grad_dtype=e4m3"},
                           {"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[weights, quants, master, m, v]",
                            "memory.fp8_weight_cache=none", "precision.grad_dtype=e4m3"}};
    for (int k = 0; k < 2; k++) {
        QT_REQUIRE(plan_of("configs/qwen2.5-7b-fp8.yaml", q[k], 5, 1, &cfg[k], &L, &rp[k], err, sizeof err) == 0, "%s", err);
        if (k == 0) qt_layout_free(&L);
    }
    size_t codes = row(&rp[1].mem, "weights (e4m3, offloaded)"), s8 = row(&rp[1].mem, "weight slots (e4m3)");
    total = (L.numel + 63) / 64 * 64;
    printf("  7B fp8, one GPU, [weights, quants]: host codes %.2f GiB, e4m3 slots %.3f GiB; GPU %.2f -> %.2f GiB, host "
           "%.2f -> %.2f GiB\n", codes / G, s8 / G, rp[0].gpu_bytes / G, rp[1].gpu_bytes / G, rp[0].host_bytes / G,
           rp[1].host_bytes / G);
    QT_EXPECT(codes == total && row(&rp[0].mem, "weights (e4m3, offloaded)") == 0, "codes row %zu, expected %zu", codes, total);
    QT_EXPECT(rp[1].host_bytes - rp[0].host_bytes == codes, "the host grows by %zu, expected %zu",
              rp[1].host_bytes - rp[0].host_bytes, codes);
    size_t sl1 = row(&rp[1].mem, "weight slots (layers)"); /* the bf16 slots hold a head-margin cache beside */
    QT_EXPECT(s8 * 2 <= sl1 && sl1 - s8 * 2 < ((size_t)1 << 20) && rp[1].gpu_bytes - rp[0].gpu_bytes == s8 + 256,
              "e4m3 slots %zu (layer slots %zu), GPU grows by %zu", s8, row(&rp[1].mem, "weight slots (layers)"),
              rp[1].gpu_bytes - rp[0].gpu_bytes);
    qt_layout_free(&L);
}

/* 7B on one GPU with the gradients offloaded: the device row "gradients (fp32)" (padded numel x 4) leaves,
 * the host row "gradients (fp32, offloaded)" (the same bytes) and ZeRO-2's slot rows come (three of the
 * largest layer bucket, the LM head's and embedding's own, each with 2 x 64 elements of margins). */
/* 7B on one GPU with parts of the optimizer state offloaded (memory.offload's master, m, v on their own):
 * each named array leaves the arena for the host row "offloaded optimizer state" (aligned, back to back),
 * the others keep their device rows, the slots stream only the named ones (3 slots x chunk x their bytes),
 * and the checkpoint snapshot (written in place: checkpoint.offloaded auto) copies only the others. */
static void test_plan_7b_opt_parts(void) {
    static const struct { const char *list; int mask; } parts[] = {
        {"memory.offload=[master]", QT_OFF_MASTER}, {"memory.offload=[m]", QT_OFF_M}, {"memory.offload=[v]", QT_OFF_V},
        {"memory.offload=[m, v]", QT_OFF_M | QT_OFF_V}, {"memory.offload=[master, m, v]", QT_OFF_OPTIMIZER}};
    static const char *const dev_rows[3] = {"master weights (fp32)", "adam m (fp32)", "adam v (fp32)"};
    char err[512];
    qt_layout L;
    static qt_run_plan none, rp;
    qt_config c;
    const char *o0[3] = {"parallel.gpus=1", "memory.offload_optimizer=false", "data.micro_batch=1"};
    QT_REQUIRE(plan_of("configs/qwen2.5-7b-fp8.yaml", o0, 3, 1, &c, &L, &none, err, sizeof err) == 0, "%s", err);
    qt_layout_free(&L);
    size_t ns = (L.numel + 63) / 64 * 64, arr = qt_mem_aligned(ns * 4); /* fp32 master, m, v: 4 B each */
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const char *o[3] = {"parallel.gpus=1", parts[i].list, "data.micro_batch=1"};
        QT_REQUIRE(plan_of("configs/qwen2.5-7b-fp8.yaml", o, 3, 1, &c, &L, &rp, err, sizeof err) == 0, "%s: %s", parts[i].list,
                   err);
        int k = 0, bad = 0;
        for (int a = 0; a < 3; a++) {
            int off = parts[i].mask >> a & 1;
            k += off;
            bad += row(&rp.mem, dev_rows[a]) != (off ? 0 : row(&none.mem, dev_rows[a]));
        }
        size_t host = row(&rp.mem, "offloaded optimizer state"), slots = row(&rp.mem, "optimizer slots (offload)");
        size_t want_slots = qt_gpu_optim_slot_bytes(QT_GPU_OPTIM_CHUNK, parts[i].mask, QT_DT_F32, QT_DT_F32, QT_DT_F32);
        size_t snap = row(&rp.mem, "checkpoint snapshot"), want_snap = L.numel * 2 + (3 - (size_t)k) * ns * 4;
        printf("  7B, %-30s host %.2f GiB, slots %.0f MiB, snapshot %.2f GiB, GPU %.2f -> %.2f GiB\n", parts[i].list,
               host / 1073741824.0, slots / 1048576.0, snap / 1073741824.0, none.gpu_bytes / 1073741824.0,
               rp.gpu_bytes / 1073741824.0);
        QT_EXPECT(!bad && host == (size_t)k * arr && slots == qt_mem_aligned(want_slots) && snap == want_snap,
                  "%s: %d device rows wrong, host %zu (want %zu), slots %zu (want %zu), snapshot %zu (want %zu)", parts[i].list,
                  bad, host, (size_t)k * arr, slots, qt_mem_aligned(want_slots), snap, want_snap);
        qt_layout_free(&L);
    }
    /* memory.zero_copy: the same host arrays, no slots (AdamW reads and writes the host state in place) */
    const char *oz[4] = {"parallel.gpus=1", "memory.offload=[m, v]", "data.micro_batch=1", "memory.zero_copy=true"};
    QT_REQUIRE(plan_of("configs/qwen2.5-7b-fp8.yaml", oz, 4, 1, &c, &L, &rp, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(row(&rp.mem, "optimizer slots (offload)") == 0 && row(&rp.mem, "offloaded optimizer state") == 2 * arr &&
                  row(&rp.mem, "master weights (fp32)") == row(&none.mem, "master weights (fp32)"),
              "zero copy: slots %zu, host %zu", row(&rp.mem, "optimizer slots (offload)"), row(&rp.mem, "offloaded optimizer state"));
    qt_layout_free(&L);
}

static void test_plan_7b_gradients(void) {
    qt_config cfg[2];
    char err[512];
    const char *o[2][3] = {{"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[master, m, v]"},
                           {"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[gradients, master, m, v]"}};
    static qt_run_plan rp[2];
    qt_layout L;
    for (int k = 0; k < 2; k++) {
        QT_REQUIRE(plan_of("configs/qwen2.5-7b-bf16.yaml", o[k], 3, 1, &cfg[k], &L, &rp[k], err, sizeof err) == 0, "%s", err);
        if (k == 0) qt_layout_free(&L);
    }
    const double G = 1073741824.0;
    size_t total = (L.numel + 63) / 64 * 64, g0 = row(&rp[0].mem, "gradients (fp32)");
    size_t host = row(&rp[1].mem, "gradients (fp32, offloaded)"), sl = row(&rp[1].mem, "gradient slots (layers)"),
           se = row(&rp[1].mem, "gradient slots (emb/head)");
    printf("  7B, one GPU: gradients on the GPU %.2f GiB; offloaded: host %.2f GiB, layer slots %.3f GiB, emb/head slots "
           "%.3f GiB; GPU total %.2f -> %.2f GiB\n", g0 / G, host / G, sl / G, se / G, rp[0].gpu_bytes / G,
           rp[1].gpu_bytes / G);
    QT_EXPECT(g0 == qt_mem_aligned(total * 4) && row(&rp[1].mem, "gradients (fp32)") == 0, "gradient rows %zu", g0);
    QT_EXPECT(host == total * 4, "host row %zu, expected %zu", host, total * 4);
    size_t layer = (size_t)(L.layers[1].ln1 - L.layers[0].ln1);
    QT_EXPECT(sl >= 3 * layer * 4 && sl < 3 * (layer + 256) * 4 + 4096, "layer slots %zu for layers of %zu", sl, layer);
    QT_EXPECT(se >= (size_t)L.cfg.vocab_size * L.cfg.hidden_size * 4 * 2, "emb/head slots %zu", se);
    size_t os = row(&rp[1].mem, "optimizer slots (offload)") - row(&rp[0].mem, "optimizer slots (offload)");
    QT_EXPECT(os == qt_gpu_optim_slot_bytes(QT_GPU_OPTIM_CHUNK, QT_OPTIM_G, QT_DT_F32, QT_DT_F32, QT_DT_F32),
              "the optimizer slots grow by %zu bytes (the fp32 gradients streamed up with the state)", os);
    QT_EXPECT(rp[0].gpu_bytes - rp[1].gpu_bytes == g0 - sl - se - os, "the GPU saves %zu bytes, expected %zu",
              rp[0].gpu_bytes - rp[1].gpu_bytes, g0 - sl - se - os);
    QT_EXPECT(rp[1].host_bytes - rp[0].host_bytes == host, "the host grows by %zu", rp[1].host_bytes - rp[0].host_bytes);
    qt_layout_free(&L);
    /* bf16 gradients offloaded (precision.grad_accum_dtype bf16): half the host array and half the slots */
    const char *o16[4] = {"parallel.gpus=1", "perf.cuda_graphs=false", "memory.offload=[gradients, master, m, v]",
                          "precision.grad_accum_dtype=bf16"};
    static qt_run_plan r16;
    qt_config c16;
    QT_REQUIRE(plan_of("configs/qwen2.5-7b-bf16.yaml", o16, 4, 1, &c16, &L, &r16, err, sizeof err) == 0, "%s", err);
    size_t h16 = row(&r16.mem, "gradients (bf16, offloaded)"), sl16 = row(&r16.mem, "gradient slots (layers)"),
           se16 = row(&r16.mem, "gradient slots (emb/head)");
    printf("  bf16 gradients offloaded: host %.2f GiB, layer slots %.3f GiB, emb/head slots %.3f GiB, GPU total %.2f GiB\n",
           h16 / G, sl16 / G, se16 / G, r16.gpu_bytes / G);
    QT_EXPECT(h16 == total * 2 && row(&r16.mem, "gradients (fp32, offloaded)") == 0, "bf16 host row %zu", h16);
    QT_EXPECT(sl16 * 2 + 4096 >= sl && sl16 * 2 <= sl + 4096 && se16 * 2 + 4096 >= se && se16 * 2 <= se + 4096,
              "bf16 slots %zu + %zu, fp32 %zu + %zu", sl16, se16, sl, se);
    qt_layout_free(&L);
}

/* The slot map of offloaded gradients without a GPU (the store carved at a fake base), one rank: the
 * slots' homes cut [0, total) in order without overlap, each within its slot (margins included; on one
 * rank they are exactly the buckets), and every tensor the backward writes lands, from qt_param_g of its
 * start, at its elements' home places: so loading a home before the backward and storing it after
 * reproduces a whole array's accumulation, whatever its writers do. */
static void test_grad_homes(void) {
    for (int bf16 = 0; bf16 < 2; bf16++) /* precision.grad_accum_dtype: the slots' elements are 4 or 2 bytes */
    for (int tie = 0; tie < 2; tie++)
        for (int V = 301; V <= 9001; V += 8700) {
            qt_model_cfg mc = {.vocab_size = V, .hidden_size = 96, .num_layers = 7, .num_heads = 3, .num_kv_heads = 1,
                               .head_dim = 32, .intermediate_size = 160, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                               .tie_embeddings = tie, .qkv_bias = 1, .max_seq_len = 64};
            qt_model_cfg_finish(&mc);
            char err[256];
            qt_layout L;
            QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
            qt_config cfg;
            qt_config_defaults(&cfg);
            cfg.precision.grad_accum_dtype = bf16 ? QT_DT_BF16 : QT_DT_F32;
            const ptrdiff_t es = bf16 ? 2 : 4;
            qt_shard sh;
            qt_shard_init(&sh, &L, 1, 0, 1);
            qt_plan pl = {.optimizer.chunk = QT_GPU_OPTIM_CHUNK, .grads.host = 1}, tp;
            qt_param_store *ps = qt_param_store_create(&L, qt_t_placed(&tp, &cfg, &L, &pl), &sh, err, sizeof err);
            QT_REQUIRE(ps, "%s", err);
            qt_mem_plan p;
            qt_mem_plan_begin(&p, NULL);
            qt_param_store_carve(ps, &p);
            char *base = malloc(p.off); /* addresses only */
            QT_REQUIRE(base, "out of memory");
            qt_mem_plan_begin(&p, base);
            qt_param_store_carve(ps, &p);
            int bad = 0, nb = sh.n_buckets;
            const size_t *hi = sh.bucket + 1; /* slot b holds bucket b */
            /* the place qt_param_g gives each tensor's first and last element (written from its start) */
            for (int i = 0; i < L.n_tensors; i++) {
                const qt_tensor *t = &L.tensors[i];
                size_t e = t->offset + t->numel - 1;
                int hb = 0, he = 0;
                while (hb < nb - 1 && hi[hb] <= t->offset) hb++;
                while (he < nb - 1 && hi[he] <= e) he++;
                char *p0 = qt_param_g(ps, t->offset), *p1 = qt_param_g(ps, e);
                char *want0 = (char *)qt_param_grad_slot(ps, hb) + ((ptrdiff_t)t->offset - (ptrdiff_t)sh.bucket[hb]) * es;
                char *want1 = (char *)qt_param_grad_slot(ps, he) + ((ptrdiff_t)e - (ptrdiff_t)sh.bucket[he]) * es;
                if (p0 != want0 || p0 + (ptrdiff_t)(t->numel - 1) * es != want1 || p1 != want1) {
                    if (bad < 5) printf("  tie %d, V %d: tensor %s [%zu, %zu) not at its home place (buckets %d..%d)\n", tie, V,
                                        t->name, t->offset, e + 1, hb, he);
                    bad++;
                }
            }
            /* the slots do not overlap: each is its bucket's bytes in the grad_dt (the arena rows) */
            size_t rows = 0;
            for (int i = 0; i < p.n; i++)
                if (!strncmp(p.row[i].kind, "gradient slots", 14)) rows += p.row[i].bytes;
            size_t need = 0, big = 0;
            for (int b = 0; b < nb; b++) {
                size_t len = sh.bucket[b + 1] - sh.bucket[b];
                if (qt_param_grad_slot_shared(ps, b) < 0) need += len * es;
                else if (len > big) big = len;
            }
            need += QT_GRAD_SLOTS * big * es;
            bad += rows < need || rows > need + 256 * (size_t)(nb + QT_GRAD_SLOTS);
            printf("  %s, tie %d, V %d: %d buckets, slots %zu bytes\n", bf16 ? "bf16" : "fp32", tie, V, nb, rows);
            QT_EXPECT(bad == 0, "tie %d, V %d: %d wrong homes", tie, V, bad);
            free(base);
            qt_param_store_free(ps);
            qt_layout_free(&L);
        }
}

/* ---- GPU runs ---- */

/* One run: `extra` holds the memory/precision lines; its checkpoints go to g_dir/ckpt_<dir>. resume: NULL
 * or "latest" (of that folder); stop: stop after that many steps (-1: all). */
static int run(const char *tag, const char *dir, const char *extra, const char *resume, long stop, run_out *o, char *err,
               size_t errlen) {
    char yaml[4096], logp[512];
    snprintf(logp, sizeof logp, "%s/log_%s.jsonl", g_dir, tag);
    snprintf(yaml, sizeof yaml,
             "%sdata: {train: '%s/syn_train_*.bin.zst', seq_len: 32, micro_batch: 3, grad_accum: 2}\n"
                   "optim: {lr: 0.003, warmup: 3, steps: %d, schedule: cosine, grad_clip: 1.0}\n"
                   "checkpoint: {dir: '%s/ckpt_%s', every: 0, keep: 1}\nlog: {file: '%s', every: 1}\ndevice: cuda\n"
                   "parallel: {gpus: 1}\nperf: {matmul_autotune: false, cuda_graphs: %s}\n%s\n",
             g_model, g_dir, STEPS, g_dir, dir, logp, g_graphs ? "true" : "false", extra);
    char d[512];
    snprintf(d, sizeof d, "%s/ckpt_%s", g_dir, dir);
    return qt_t_run_yaml(yaml, logp, d, resume, stop, o, err, errlen);
}

static void setup_data(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/syn_train_0.bin.zst", g_dir);
    qt_t_write_synthetic(p, 40000, 1);
}

/* `lines` with nothing offloaded against `lines` + memory.offload `list`: 1 same bits, 0 not (why), -1 a
 * run failed (why). */
static int compare(const char *name, const char *lines, const char *mem, const char *list, run_out *ra, run_out *rb,
                   char *why, size_t cap) {
    char extra[1024], tag[160], err[1024];
    for (int k = 0; k < 2; k++) {
        snprintf(extra, sizeof extra, "%smemory: {%s%s%s}\n", lines, mem, *mem && k ? ", " : "", k ? list : "");
        snprintf(tag, sizeof tag, "%s_%s", name, k ? "off" : "ref");
        if (run(tag, tag, extra, NULL, -1, k ? rb : ra, err, sizeof err)) return snprintf(why, cap, "%s: %s", tag, err), -1;
    }
    return qt_t_same_bits(ra, rb, 0, why, cap);
}

/* Offloaded weights against the weights on the GPU, bitwise, at grad_accum 2 (the same slot is read by
 * two forwards and two backwards per step). With the optimizer state offloaded too, the reference keeps
 * it on the GPU: the offloaded AdamW has the GPU's bits (tests/test_train). */
static void test_offload_weights_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const struct { const char *name, *lines, *mem, *list; } cases[] = {
        {"w_bf16", "", "", "offload: [weights]"},
        {"w_bf16_opt", "", "", "offload: [weights, master, m, v]"},
        {"w_bf16_master", "precision: {master_dtype: bf16}\n", "", "offload: [weights]"},
        {"w_bf16_master_opt", "precision: {master_dtype: bf16}\n", "", "offload: [weights, master, m, v]"},
        {"w_bf16_recompute", "", "recompute: [block]", "offload: [weights]"},
        {"w_fp8", FP8, "", "offload: [weights]"},
        {"w_fp8_opt", FP8, "", "offload: [weights, master, m, v]"},
        {"w_fp8_npq_recompute", "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: false}\n",
         "recompute: [block]", "offload: [weights]"},
        /* quants: each layer's e4m3 codes copied up instead of its bf16 matrices (made once per step from
         * the host weights), and the everything-offloaded rank */
        {"wq_fp8", FP8, "", "offload: [weights, quants]"},
        {"wq_fp8_npq_recompute", "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: false}\n",
         "recompute: [block]", "offload: [weights, quants]"},
        {"wq_fp8_all", FP8, "", "offload: [weights, quants, gradients, master, m, v]"},
        {"wq_fp8_bf16_master_all", "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, master_dtype: bf16}\n", "",
         "offload: [weights, quants, gradients, m, v]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!qt_t_case_selected(cases[i].name)) continue;
        run_out a, b;
        char why[512];
        qt_test_hooks h = {.offload_chunk = qt_t_offload_chunk()}; /* many chunks of the offloaded optimizer state */
        qt_test_hooks_set(strstr(cases[i].list, "master") ? &h : NULL);
        int rc = compare(cases[i].name, cases[i].lines, cases[i].mem, cases[i].list, &a, &b, why, sizeof why);
        qt_test_hooks_set(NULL);
        printf("  %-22s %s vs on the GPU: %s\n", cases[i].name, cases[i].list, rc == 1 ? "bitwise equal" : why);
        QT_EXPECT(rc == 1, "%s: %s", cases[i].name, why);
        if (rc == 1 && i == 0) QT_EXPECT(b.loss[STEPS - 1] < b.loss[0], "loss did not fall: %g -> %g", b.loss[0], b.loss[STEPS - 1]);
    }
}

/* Checkpoints are the same either way: 10 steps with the weights offloaded resumed on the GPU to 20, and
 * the other way round, end with the uninterrupted on-GPU run's bits (the load writes the host weights and
 * drops every slot). */
static void test_offload_weights_resume(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    run_out full, part, res;
    char why[512], err[1024];
    QT_REQUIRE(run("wres_full", "wres_full", "", NULL, -1, &full, err, sizeof err) == 0, "%s", err);
    for (int from = 0; from < 2; from++) {
        const char *first = from ? "memory: {offload: [weights]}" : "", *then = from ? "" : "memory: {offload: [weights]}";
        char dir[32], tag[32];
        snprintf(dir, sizeof dir, "wres_from%d", from);
        QT_REQUIRE(run(dir, dir, first, NULL, 10, &part, err, sizeof err) == 0, "%s", err);
        snprintf(tag, sizeof tag, "%s_res", dir);
        QT_REQUIRE(run(tag, dir, then, "latest", -1, &res, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < 10; i++) res.loss[i] = part.loss[i], res.gn[i] = part.gn[i];
        int same = qt_t_same_bits(&full, &res, 0, why, sizeof why);
        printf("  10 steps %s, resumed %s to 20, vs 20 steps on the GPU: %s\n", from ? "offloaded" : "on the GPU",
               from ? "on the GPU" : "offloaded", same ? "bitwise equal" : why);
        QT_EXPECT(same, "resume from %s: %s", from ? "offloaded" : "on the GPU", why);
    }
}

typedef struct {
    const char *name;
    qt_test_hooks h;
    qt_mutant m; /* a mutant, which must change the bits (or stop the run); QT_MUT_NONE: the same bits */
} mutant_case;

/* Each case's run with memory.offload `list` against the run with nothing offloaded (tag: the runs'
 * prefix, what: the reference's words). */
static void mutants_caught(const char *tag, const char *lines, const char *list, const char *what, const mutant_case *cases,
                           size_t n) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    run_out ref, got;
    char why[512], err[1024], t[64], extra[512];
    snprintf(t, sizeof t, "%s_ref", tag);
    QT_REQUIRE(run(t, t, lines, NULL, -1, &ref, err, sizeof err) == 0, "%s", err);
    snprintf(extra, sizeof extra, "%smemory: {offload: [%s]}", lines, list);
    for (size_t i = 0; i < n; i++) {
        snprintf(t, sizeof t, "%s_%zu", tag, i);
        int differs = cases[i].m != QT_MUT_NONE;
        qt_t_hooks(&cases[i].h, cases[i].m);
        int rc = run(t, t, extra, NULL, -1, &got, err, sizeof err);
        qt_t_hooks(NULL, QT_MUT_NONE);
        if (rc && differs) { /* a mutant may make the run fail (NaN weights): caught too */
            printf("  %-42s caught: the run failed: %s\n", cases[i].name, err);
            continue;
        }
        QT_REQUIRE(rc == 0, "%s: %s", cases[i].name, err);
        int same = qt_t_same_bits(&ref, &got, 0, why, sizeof why);
        printf("  %-42s %s\n", cases[i].name, same ? what : why);
        if (differs && !same) printf("  %-42s caught\n", cases[i].name);
        QT_EXPECT(same != differs, "%s: %s", cases[i].name, same ? "NOT caught (same bits)" : why);
    }
}

/* Parts of the optimizer state offloaded (memory.offload's master, m, v on their own) against none offloaded,
 * bitwise at grad_accum 2 (chunks of 1000 state elements: many per step), bf16 and fp8, a bf16 master (no
 * master array: [m] alone); then checkpoints: 10 steps with [m, v] (written in place) resumed with nothing
 * offloaded to 20, vs 20 steps of nothing offloaded. */
static void test_offload_opt_parts_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const struct { const char *name, *lines, *list; } cases[] = {
        {"o_m_v", "", "offload: [m, v]"},
        {"o_master", "", "offload: [master]"},
        {"o_v_fp8", FP8, "offload: [v]"},
        {"o_master_m_fp8", FP8, "offload: [master, m]"},
        {"o_m_bf16master", "precision: {master_dtype: bf16}\n", "offload: [m]"},
        /* memory.zero_copy (AdamW on the host state in place) and memory.host_alloc: write_combined */
        {"o_all_zc", "", "offload: [master, m, v], zero_copy: true"},
        {"o_m_v_zc_fp8", FP8, "offload: [m, v], zero_copy: true"},
        {"o_all_wc", "", "offload: [weights, gradients, master, m, v, residual], host_alloc: write_combined"},
        {"o_all_zc_wc_bf16master", "precision: {master_dtype: bf16}\n",
         "offload: [weights, master, m, v], zero_copy: true, host_alloc: write_combined"},
    };
    qt_test_hooks h = {.offload_chunk = qt_t_offload_chunk()};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_out a, b;
        char why[512];
        if (!qt_t_case_selected(cases[i].name)) continue;
        qt_test_hooks_set(&h);
        int rc = compare(cases[i].name, cases[i].lines, "", cases[i].list, &a, &b, why, sizeof why);
        qt_test_hooks_set(NULL);
        printf("  %-16s %s vs nothing offloaded: %s\n", cases[i].name, cases[i].list, rc == 1 ? "bitwise equal" : why);
        QT_EXPECT(rc == 1, "%s: %s", cases[i].name, why);
    }
    if (!qt_t_case_selected("o_resume")) return;
    run_out full, part, res;
    char why[512], err[1024];
    qt_test_hooks_set(&h);
    QT_REQUIRE(run("opres_full", "opres_full", "", NULL, -1, &full, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(run("opres_part", "opres", "memory: {offload: [m, v]}", NULL, 10, &part, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(run("opres_res", "opres", "", "latest", -1, &res, err, sizeof err) == 0, "%s", err);
    qt_test_hooks_set(NULL);
    for (int i = 0; i < 10; i++) res.loss[i] = part.loss[i], res.gn[i] = part.gn[i];
    int same = qt_t_same_bits(&full, &res, 0, why, sizeof why);
    printf("  10 steps with [m, v] offloaded, resumed with nothing offloaded to 20, vs 20 steps: %s\n",
           same ? "bitwise equal" : why);
    QT_EXPECT(same, "resume from [m, v]: %s", why);
}

/* The weight slots' mutants (qt_weight_slots.h) with offloaded weights must change
 * the bits (or stop the run); the delays alone must not. A slot copied into before its last reader ran
 * shows when the model stream lags (it sleeps after each acquire); a read that does not wait for its copy
 * shows when the copies lag (the side stream sleeps before each, dp_ag_delay_ms). */
static void test_offload_weights_mutants_caught(void) {
    static const mutant_case cases[] = {
        {"reads delayed 5 ms (no mutant)", {.zero3_read_delay_ms = 5}, QT_MUT_NONE},
        {"slot copied into before its last reader", {.zero3_read_delay_ms = 5}, QT_MUT_WSLOT_NO_FREE_WAIT},
        {"copies delayed 20 ms (no mutant)", {.dp_ag_delay_ms = 20}, QT_MUT_NONE},
        {"slot read before its H2D copy finished", {.dp_ag_delay_ms = 20}, QT_MUT_WSLOT_NO_FILL_WAIT},
    };
    mutants_caught("wmut", "", "weights", "bitwise equal to the weights on the GPU", cases, sizeof cases / sizeof cases[0]);
}

/* memory.offload [weights, quants]: codes made once (AdamW's later steps never reach the GPU) and a slot
 * read before its H2D copy of the codes finished (copies delayed) must change the bits; the delay alone
 * must not. */
static void test_offload_quants_mutants_caught(void) {
    static const mutant_case cases[] = {
        {"copies delayed 20 ms (no mutant)", {.dp_ag_delay_ms = 20}, QT_MUT_NONE},
        {"codes made once", {0}, QT_MUT_E4M3_CODES_ONCE},
        {"slot read before its H2D copy finished", {.dp_ag_delay_ms = 20}, QT_MUT_WSLOT_NO_FILL_WAIT},
    };
    mutants_caught("qmut", FP8, "weights, quants", "bitwise equal to the weights on the GPU", cases,
                   sizeof cases / sizeof cases[0]);
}

/* Offloaded gradients against the gradients on the GPU, bitwise, at grad_accum 2 (the second micro-step
 * adds to what the first stored: each slot is loaded from host first): bf16, fp8, CUDA graphs, a tied model
 * (the table written twice per micro-step, its tail past its bucket), the optimizer state offloaded (AdamW
 * reads the host gradients), and everything offloaded at once. */
static void test_offload_gradients_bitwise(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    const struct { const char *name, *model, *lines, *mem, *list; int graphs; } cases[] = {
        {"g_bf16", MODEL, "", "", "offload: [gradients]", 0},
        {"g_bf16_graphs", MODEL, "", "", "offload: [gradients]", 1},
        {"g_bf16_tied", TIED, "", "", "offload: [gradients]", 0},
        {"g_bf16_opt", MODEL, "", "", "offload: [gradients, master, m, v]", 0},
        {"g_fp8", MODEL, FP8, "", "offload: [gradients]", 0},
        {"all_bf16", MODEL, "", "", "offload: [weights, gradients, master, m, v]", 0},
        {"all_bf16_tied", TIED, "", "", "offload: [weights, gradients, master, m, v]", 0},
        {"all_fp8", MODEL, FP8, "", "offload: [weights, gradients, master, m, v]", 0},
        {"all_bf16_master_recompute", MODEL, "precision: {master_dtype: bf16}\n", "recompute: [block]",
         "offload: [weights, gradients, master, m, v]", 0},
        /* bf16 gradients (precision.grad_accum_dtype bf16) offloaded vs bf16 gradients on the GPU */
        {"g16_bf16", MODEL, G16, "", "offload: [gradients]", 0},
        {"g16_bf16_graphs", MODEL, G16, "", "offload: [gradients]", 1},
        {"g16_bf16_tied", TIED, G16, "", "offload: [gradients]", 0},
        {"g16_fp8", MODEL, "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true, grad_accum_dtype: bf16}\n",
         "", "offload: [gradients]", 0},
        {"all16_bf16_master_recompute", MODEL, "precision: {master_dtype: bf16, grad_accum_dtype: bf16}\n", "recompute: [block]",
         "offload: [weights, gradients, master, m, v]", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_out a, b;
        char why[512];
        qt_test_hooks h = {.offload_chunk = qt_t_offload_chunk()};
        if (!qt_t_case_selected(cases[i].name)) continue;
        qt_test_hooks_set(strstr(cases[i].list, "master") ? &h : NULL);
        g_model = cases[i].model;
        g_graphs = cases[i].graphs;
        int rc = compare(cases[i].name, cases[i].lines, cases[i].mem, cases[i].list, &a, &b, why, sizeof why);
        g_model = MODEL;
        g_graphs = 0;
        qt_test_hooks_set(NULL);
        printf("  %-26s %s vs on the GPU: %s\n", cases[i].name, cases[i].list, rc == 1 ? "bitwise equal" : why);
        QT_EXPECT(rc == 1, "%s: %s", cases[i].name, why);
    }
}

/* The offloaded gradients' mutants must change the bits; the delay alone must not: the backward writing a
 * shared slot before its last bucket was stored and zeroed and its next loaded (the stores delayed), a
 * slot not zeroed after its store, the norm and AdamW reading the host gradients before the last stores
 * landed (the stores delayed), a slot's load (on its own stream) not waiting for the slot's store and
 * zeroing (the stores delayed). */
static void test_offload_gradients_mutants_caught(void) {
    static const mutant_case cases[] = {
        {"stores delayed 20 ms (no mutant)", {.dp_sum_delay_ms = 20}, QT_MUT_NONE},
        {"slot written before its store and load", {.dp_sum_delay_ms = 20}, QT_MUT_GRAD_SLOT_NO_WAIT},
        {"slot not zeroed after its store", {0}, QT_MUT_GRAD_SLOT_NOT_ZEROED},
        {"AdamW before the last stores", {.dp_sum_delay_ms = 20}, QT_MUT_ADAMW_NO_STORE_WAIT},
        {"slot loaded before its store finished", {.dp_sum_delay_ms = 20}, QT_MUT_GRAD_LOAD_NO_STORE_WAIT},
    };
    mutants_caught("gmut", "", "gradients", "bitwise equal to the gradients on the GPU", cases, sizeof cases / sizeof cases[0]);
}

/* Two ranks sharing GPU 0 are refused with the key named (the loader; the engine refuses gpus: 0 over
 * several visible GPUs the same way). */
static void test_offload_weights_ranks_refused(void) {
    char err[1024];
    qt_config c;
    const char *yaml = MODEL "memory: {offload: [weights]}\nparallel: {devices: [0, 0]}\nperf: {cuda_graphs: false}\n";
    QT_EXPECT(qt_config_load_string(&c, yaml, "r.yaml", NULL, 0, err, sizeof err) != 0 &&
                  strstr(err, "parallel.devices: expected one GPU"),
              "%s", err);
    printf("  %s\n", err);
}

/* ---- several ranks: ZeRO-3's offloaded pieces, ZeRO-2/3's offloaded gradient shard ---- */

/* 7B on 4 ranks (the planner's rows, no GPU; the optimizer state offloaded, as the config has it): ZeRO-3 + [weights] moves the device row "weights (bf16
 * shard)" (shard.len x 2) to the host row "weights (bf16 shard, offloaded)" (every rank's: x 4); ZeRO-2 or
 * 3 + [gradients] moves "gradients (fp32 shard)" (shard.len x 4) to "gradients (fp32 shard, offloaded)";
 * the slots and every other row stay, so the GPU saves exactly those rows and the host grows by them. */
static void test_plan_7b_ranks(void) {
    enum { N = 4 };
    static const struct { int zero; const char *list; int w, g; } cases[] = {
        {3, "memory.offload=[weights, master, m, v]", 1, 0}, {3, "memory.offload=[gradients, master, m, v]", 0, 1},
        {3, "memory.offload=[weights, gradients, master, m, v]", 1, 1}, {2, "memory.offload=[gradients, master, m, v]", 0, 1},
    };
    const double G = 1073741824.0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qt_config cfg[2];
        char err[512], z[32];
        static qt_run_plan rp[2];
        qt_layout L;
        snprintf(z, sizeof z, "parallel.zero=%d", cases[i].zero);
        const char *o[2][4] = {{"parallel.gpus=4", "perf.cuda_graphs=false", z, "memory.offload=[master, m, v]"},
                               {"parallel.gpus=4", "perf.cuda_graphs=false", z, cases[i].list}};
        for (int k = 0; k < 2; k++) {
            QT_REQUIRE(plan_of("configs/qwen2.5-7b-bf16.yaml", o[k], 4, N, &cfg[k], &L, &rp[k], err, sizeof err) == 0, "%s", err);
            if (k == 0) qt_layout_free(&L);
        }
        qt_shard sh;
        qt_layout P; /* as the planner: sharded, on the layout of the plan's ranks */
        QT_REQUIRE(qt_layout_init_units(&P, &L.cfg, qt_plan_unit_align(&rp[0].plan), err, sizeof err) == 0, "%s", err);
        qt_shard_init(&sh, &P, N, 0, 1);
        qt_layout_free(&P);
        size_t wd = row(&rp[0].mem, "weights (bf16 shard)"), gd = row(&rp[0].mem, "gradients (fp32 shard)");
        size_t wh = row(&rp[1].mem, "weights (bf16 shard, offloaded)"), gh = row(&rp[1].mem, "gradients (fp32 shard, offloaded)");
        size_t wd1 = row(&rp[1].mem, "weights (bf16 shard)"), gd1 = row(&rp[1].mem, "gradients (fp32 shard)");
        /* offloaded weights are written in place by checkpoints (the optimizer state is offloaded too): the
         * snapshot's copy of the bf16 pieces goes as the pieces move to host memory, the host total stays */
        size_t saved = (cases[i].w ? wd : 0) + (cases[i].g ? gd : 0), grown = (size_t)N * sh.len * 4 * cases[i].g;
        size_t snap0 = row(&rp[0].mem, "checkpoint snapshot"), snap1 = row(&rp[1].mem, "checkpoint snapshot");
        QT_EXPECT(snap0 - snap1 == (cases[i].w ? (size_t)N * sh.len * 2 : 0), "%s: snapshot %zu -> %zu", cases[i].list, snap0, snap1);
        printf("  7B, 4 ranks, ZeRO-%d %-36s GPU %.2f -> %.2f GiB, host %.1f -> %.1f GiB (weights shard %.2f GiB, gradient "
               "shard %.2f GiB a rank)\n", cases[i].zero, cases[i].list, rp[0].gpu_bytes / G, rp[1].gpu_bytes / G,
               rp[0].host_bytes / G, rp[1].host_bytes / G, sh.len * 2 / G, sh.len * 4 / G);
        QT_EXPECT(gd == qt_mem_aligned(sh.len * 4) && (cases[i].zero < 3 || wd == qt_mem_aligned(sh.len * 2)),
                  "%s: reference rows %zu %zu", cases[i].list, wd, gd);
        QT_EXPECT(wd1 == (cases[i].w ? 0 : wd) && gd1 == (cases[i].g ? 0 : gd), "%s: device rows left %zu %zu", cases[i].list,
                  wd1, gd1);
        QT_EXPECT(wh == (cases[i].w ? N * sh.len * 2 : 0) && gh == (cases[i].g ? N * sh.len * 4 : 0),
                  "%s: host rows %zu %zu (shard %zu)", cases[i].list, wh, gh, sh.len);
        QT_EXPECT(row(&rp[1].mem, "weights (bf16, offloaded)") == 0 && row(&rp[1].mem, "gradients (fp32, offloaded)") == 0,
                  "%s: one GPU's rows", cases[i].list);
        /* the host shard's pieces are added in device staging slots (three chunks of 16 MiB at most) */
        size_t stage = row(&rp[1].mem, "gradient shard staging (fp32)");
        QT_EXPECT(cases[i].g ? stage > 0 && stage <= qt_mem_aligned(qt_host_shard_slot_bytes((size_t)1 << 22)) : stage == 0,
                  "%s: staging row %zu", cases[i].list, stage);
        /* with the optimizer state offloaded, its slots carry the pieces and the shard too */
        size_t os = row(&rp[1].mem, "optimizer slots (offload)") - row(&rp[0].mem, "optimizer slots (offload)");
        size_t want_os = !row(&rp[0].mem, "optimizer slots (offload)") ? 0
                         : qt_gpu_optim_slot_bytes(QT_GPU_OPTIM_CHUNK, (cases[i].w ? QT_OPTIM_W : 0) | (cases[i].g ? QT_OPTIM_G : 0),
                                                   QT_DT_F32, QT_DT_F32, QT_DT_F32);
        QT_EXPECT(os == want_os, "%s: the optimizer slots grow by %zu bytes, expected %zu", cases[i].list, os, want_os);
        QT_EXPECT(rp[0].gpu_bytes - rp[1].gpu_bytes == saved - stage - os, "%s: the GPU saves %zu bytes, expected %zu",
                  cases[i].list, rp[0].gpu_bytes - rp[1].gpu_bytes, saved - stage - os);
        QT_EXPECT(rp[1].host_bytes - rp[0].host_bytes == grown, "%s: the host grows by %zu, expected %zu", cases[i].list,
                  rp[1].host_bytes - rp[0].host_bytes, grown);
        qt_layout_free(&L);
    }
}

/* With several ranks the offloads are the rank's shard: [weights] needs ZeRO-3, [gradients] ZeRO-2 or 3
 * (lifted); [weights] with ZeRO 1 or 2 and [gradients] with ZeRO 1 stay refused, with the key named, and
 * ZeRO-3's own refusals (CUDA graphs) hold with the offloads. */
static void test_offload_ranks_config(void) {
    static const struct { const char *par, *mem; int graphs; const char *says; } cases[] = {
        {"devices: [0, 0], zero: 3", "offload: [weights]", 0, NULL},
        {"devices: [0, 0], zero: 3", "offload: [weights, gradients, master, m, v]", 0, NULL},
        {"devices: [0, 0], zero: 2", "offload: [gradients]", 0, NULL},
        {"devices: [0, 0], zero: 3", "offload: [gradients]", 0, NULL},
        {"gpus: 4, zero: 2", "offload: [gradients, master, m, v]", 0, NULL},
        {"devices: [0, 0], zero: 2", "offload: [weights]", 0, "parallel.zero: expected one GPU (parallel.gpus: 1, parallel.zero "
         "0 or 1) or parallel.zero: 3 with memory.offload: [weights]"},
        {"devices: [0, 0], zero: 1", "offload: [weights]", 0, "parallel.devices: expected one GPU"},
        {"gpus: 2, zero: 1", "offload: [gradients]", 0, "parallel.gpus: expected one GPU (parallel.gpus: 1) or parallel.zero: "
         "2 or 3 with memory.offload: [gradients]"},
        {"devices: [0, 0], zero: 3", "offload: [weights, gradients]", 1, "perf.cuda_graphs: expected false with parallel.zero: 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char yaml[1024], err[1024] = "";
        qt_config c;
        snprintf(yaml, sizeof yaml, MODEL "data: {seq_len: 32}\nparallel: {%s}\nmemory: {%s}\nperf: {cuda_graphs: %s}\n",
                 cases[i].par, cases[i].mem, cases[i].graphs ? "true" : "false");
        int rc = qt_config_load_string(&c, yaml, "r.yaml", NULL, 0, err, sizeof err);
        printf("  parallel {%s}, memory {%s}: %s\n", cases[i].par, cases[i].mem, rc ? err : "taken");
        if (cases[i].says) QT_EXPECT(rc != 0 && strstr(err, cases[i].says), "%zu: expected a refusal with '%s', got %s", i,
                                     cases[i].says, rc ? err : "none");
        else QT_EXPECT(rc == 0, "%zu: %s", i, err);
    }
}

/* One run on `ranks` ranks at ZeRO `zero` (parallel keys `par`), with memory keys `mem` and extra
 * sections `lines`, at grad_accum `accum`. */
static int run_ranks(const char *tag, int ranks, int zero, const char *par, const char *mem, const char *lines, int accum,
                     run_out *o, char *err, size_t errlen) {
    char yaml[4096], logp[512], d[512];
    snprintf(logp, sizeof logp, "%s/log_%s.jsonl", g_dir, tag);
    snprintf(d, sizeof d, "%s/ckpt_%s", g_dir, tag);
    snprintf(yaml, sizeof yaml,
             "%sdata: {train: '%s/syn_train_*.bin.zst', seq_len: 32, micro_batch: 3, grad_accum: %d}\n"
             "optim: {lr: 0.003, warmup: 3, steps: %d, schedule: cosine, grad_clip: 1.0}\n"
             "checkpoint: {dir: '%s', every: 0, keep: 1}\nlog: {file: '%s', every: 1}\ndevice: cuda\n"
             "parallel: {%s, zero: %d%s%s}\nperf: {matmul_autotune: false, cuda_graphs: false}\n%s%s%s%s\n",
             g_model, g_dir, accum, STEPS, d, logp, qt_t_ranks(ranks), zero, *par ? ", " : "", par, *mem ? "memory: {" : "",
             mem, *mem ? "}\n" : "", lines);
    return qt_t_run_yaml(yaml, logp, d, NULL, -1, o, err, errlen);
}

typedef struct {
    const char *name, *model;
    int zero;
    const char *par, *lines, *mem, *list; /* the reference's memory keys `mem`; the offloaded run's: mem + list */
    int accum;
} rank_case;

/* Each case on 2 and 3 ranks, and 4 on a machine of 4 GPUs (one rank per GPU there): the same ZeRO level
 * with nothing offloaded against `list` offloaded, bitwise. */
static void ranks_bitwise(const rank_case *cases, size_t n) {
    for (int ranks = 2; ranks <= (qt_cuda_device_count() >= 4 ? 4 : 3); ranks++)
        for (size_t i = 0; i < n; i++) {
            run_out a, b;
            char why[512] = "", err[1024], tag[160], mem[256];
            qt_test_hooks h = {.offload_chunk = qt_t_offload_chunk()}; /* many chunks of an offloaded optimizer state */
            g_model = cases[i].model;
            int rc = 0;
            for (int k = 0; k < 2 && !rc; k++) {
                snprintf(mem, sizeof mem, "%s%s%s", cases[i].mem, *cases[i].mem && k ? ", " : "", k ? cases[i].list : "");
                snprintf(tag, sizeof tag, "%s_r%d_%s", cases[i].name, ranks, k ? "off" : "ref");
                qt_test_hooks_set(strstr(cases[i].list, "master") ? &h : NULL); /* both runs: the same chunks */
                if (run_ranks(tag, ranks, cases[i].zero, cases[i].par, mem, cases[i].lines, cases[i].accum, k ? &b : &a, err,
                              sizeof err))
                    rc = -1, snprintf(why, sizeof why, "%s: %s", tag, err);
                qt_test_hooks_set(NULL);
            }
            g_model = MODEL;
            if (!rc) rc = qt_t_same_bits(&a, &b, 0, why, sizeof why);
            printf("  %d ranks %-24s ZeRO-%d + %s vs ZeRO-%d: %s\n", ranks, cases[i].name, cases[i].zero, cases[i].list,
                   cases[i].zero, rc == 1 ? "bitwise equal" : why);
            QT_EXPECT(rc == 1, "%d ranks, %s: %s", ranks, cases[i].name, why);
            if (rc == 1 && i == 0) QT_EXPECT(b.loss[STEPS - 1] < b.loss[0], "loss did not fall: %g -> %g", b.loss[0], b.loss[STEPS - 1]);
        }
}

/* ZeRO-3 with the rank's bf16 pieces offloaded = ZeRO-3 (every weight slot all-gathered from the ranks'
 * host pieces, AdamW writing them through the mapping): bf16 with and without overlap, grad_accum 2, a bf16
 * master with the optimizer state offloaded (AdamW rounds the host pieces in place), fp8 (each layer
 * quantized from its slot), a tied model (its table's slot gathered once per step), and [weights,
 * gradients] together in bf16 and fp8. */
static void test_offload_ranks_weights_zero3(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    static const rank_case cases[] = {
        {"z3w_bf16_ov", MODEL, 3, "overlap_comm: true", "", "", "offload: [weights]", 1},
        {"z3w_bf16_noov_acc", MODEL, 3, "overlap_comm: false", "", "", "offload: [weights]", 2},
        {"z3w_bf16_master_opt", MODEL, 3, "overlap_comm: true", "precision: {master_dtype: bf16}\n", "offload_optimizer: true",
         "offload: [weights, master, m, v]", 2},
        {"z3w_fp8_acc", MODEL, 3, "overlap_comm: true", FP8, "", "offload: [weights]", 2},
        {"z3w_bf16_tied", TIED, 3, "overlap_comm: true", "", "", "offload: [weights]", 2},
        {"z3wg_bf16_acc", MODEL, 3, "overlap_comm: true", "", "", "offload: [weights, gradients]", 2},
        {"z3wg_fp8_noov_acc", MODEL, 3, "overlap_comm: false", FP8, "", "offload: [weights, gradients]", 2},
        {"z3wq_fp8_acc", MODEL, 3, "overlap_comm: true", FP8, "", "offload: [weights, quants]", 2}, /* e4m3 gathers */
        /* the 4-card box's plan at LLM.Q's precision: pieces and shard streamed through the optimizer's slots */
        {"z3wg_llmq_opt", MODEL, 3, "overlap_comm: true, gather_dtype: e4m3",
         "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true, master_dtype: bf16, grad_accum_dtype: bf16}\n",
         "offload_optimizer: true", "offload: [weights, gradients, master, m, v]", 2},
    };
    ranks_bitwise(cases, sizeof cases / sizeof cases[0]);
}

/* ZeRO-2 with the rank's fp32 gradient shard offloaded = ZeRO-2 at grad_accum 2 (the second micro-step's
 * sums are added into the host shard, brought up and written back in staging chunks): bf16 with and
 * without overlap, fp8, bf16 sums, the optimizer state offloaded too, a tied model whose embedding lookups
 * are gathered and added into the host shard (through the mapping), ZeRO-3 with its gradient shard
 * offloaded, and bf16 gradients (bf16 slots; ZeRO-3 with a tied model and its weight pieces offloaded too). */
static void test_offload_ranks_gradients_zero2(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    static const rank_case cases[] = {
        {"z2g_bf16_ov", MODEL, 2, "overlap_comm: true", "", "", "offload: [gradients]", 2},
        {"z2g_bf16_noov", MODEL, 2, "overlap_comm: false", "", "", "offload: [gradients]", 2},
        {"z2g_bf16_sums", MODEL, 2, "overlap_comm: true, reduce_dtype: bf16", "", "", "offload: [gradients]", 2},
        {"z2g_bf16_opt", MODEL, 2, "overlap_comm: true", "", "offload_optimizer: true", "offload: [gradients, master, m, v]", 2},
        {"z2g_fp8", MODEL, 2, "overlap_comm: true", FP8, "", "offload: [gradients]", 2},
        {"z2g_bf16_tied", TIED, 2, "overlap_comm: true", "", "", "offload: [gradients]", 2},
        {"z3g_bf16", MODEL, 3, "overlap_comm: true", "", "", "offload: [gradients]", 2},
        /* bf16 gradients: bf16 slots summed in bf16 into the fp32 host shard */
        {"z2g_g16", MODEL, 2, "overlap_comm: true", G16, "", "offload: [gradients]", 2},
        {"z3wg_g16_tied", TIED, 3, "overlap_comm: true", G16, "", "offload: [weights, gradients]", 2},
    };
    ranks_bitwise(cases, sizeof cases / sizeof cases[0]);
}

/* The mutants with ranks must change the bits (or stop the run); the delays and small staging chunks
 * alone must not: ZeRO-3 with offloaded pieces filling its slots from a stale device copy, ZeRO-2 with an
 * offloaded gradient shard overwritten by each micro-step's sum instead of added to (grad_accum 2), added
 * in its staging without bringing the shard's chunk up, its staging slot refilled before the chunk in it
 * went back down (the ways down delayed), and summed in descending rank order into the host shard (3
 * ranks); with the optimizer state offloaded too, the pieces and the shard streamed through its slots in
 * 1000-element chunks (bitwise equal), the updated pieces not copied back down and the shard not copied
 * up. The 1000-element
 * chunks split every piece of the test model (the default chunk holds them whole) and end in a partial one. */
static void test_offload_ranks_mutants_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    setup_data();
    static const struct { const char *name; int zero, ranks; const char *list; qt_test_hooks h; qt_mutant m; } cases[] = {
        {"z3 weights: gathers delayed 20 ms (no mutant)", 3, 2, "offload: [weights]", {.dp_ag_delay_ms = 20}, QT_MUT_NONE},
        {"z3 weights: slots from a stale device copy", 3, 2, "offload: [weights]", {0}, QT_MUT_Z3_STALE_FILL},
        {"z2 gradients: sums delayed 20 ms (no mutant)", 2, 2, "offload: [gradients]", {.dp_sum_delay_ms = 20}, QT_MUT_NONE},
        {"z2 gradients: shard = sum, not += sum", 2, 2, "offload: [gradients]", {0}, QT_MUT_HOST_SHARD_ASSIGN},
        {"z2 gradients: staged in 1000-element chunks", 2, 3, "offload: [gradients]", {.grad_stage_elems = 1000}, QT_MUT_NONE},
        {"z3 gradients: staged in 1000-element chunks", 3, 2, "offload: [gradients]", {.grad_stage_elems = 1000}, QT_MUT_NONE},
        {"z2 gradients: shard chunk not brought up", 2, 2, "offload: [gradients]", {0}, QT_MUT_SHARD_CHUNK_NOT_UP},
        {"z2 gradients: chunks' ways down delayed 1 ms", 2, 2, "offload: [gradients]",
         {.grad_stage_elems = 1000, .stage_down_delay_ms = 1}, QT_MUT_NONE},
        {"z2 gradients: staging slot refilled before its way down", 2, 2, "offload: [gradients]",
         {.grad_stage_elems = 1000, .stage_down_delay_ms = 1}, QT_MUT_STAGE_REUSE_EARLY},
        {"z2 gradients: descending rank order", 2, 3, "offload: [gradients]", {0}, QT_MUT_ZERO2_DESC_RANK_SUM},
        {"z2 gradients: cleared chunks not zeroed in slots", 2, 2, "offload: [gradients]",
         {.grad_stage_elems = 1000}, QT_MUT_CLEARED_CHUNK_NOT_ZEROED},
        {"z3 gradients: cleared chunks not zeroed in slots", 3, 2, "offload: [gradients]",
         {.grad_stage_elems = 1000}, QT_MUT_CLEARED_CHUNK_NOT_ZEROED},
        {"z2 gradients: cleared piece read unzeroed", 2, 2, "offload: [gradients]", {0}, QT_MUT_CLEARED_PIECE_NOT_ZEROED},
        {"z3 weights+gradients+state streamed (no mutant)", 3, 2, "offload: [weights, gradients, master, m, v]",
         {.offload_chunk = 1000}, QT_MUT_NONE},
        {"z3 weights+state: streamed pieces not down", 3, 2, "offload: [weights, master, m, v]",
         {.offload_chunk = 1000}, QT_MUT_OPT_W_NOT_DOWN},
        {"z2 gradients+state: streamed shard not up", 2, 2, "offload: [gradients, master, m, v]",
         {.offload_chunk = 1000}, QT_MUT_OPT_G_NOT_UP},
    };
    run_out ref[2][4], got;
    char why[512], err[1024], tag[64];
    for (int z = 2; z <= 3; z++)
        for (int r = 2; r <= 3; r++) {
            snprintf(tag, sizeof tag, "rmut_ref_z%d_r%d", z, r);
            QT_REQUIRE(run_ranks(tag, r, z, "overlap_comm: true", "", "", 2, &ref[z - 2][r], err, sizeof err) == 0, "%s", err);
        }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(tag, sizeof tag, "rmut_%zu", i);
        int differs = cases[i].m != QT_MUT_NONE;
        qt_t_hooks(&cases[i].h, cases[i].m);
        int rc = run_ranks(tag, cases[i].ranks, cases[i].zero, "overlap_comm: true", cases[i].list, "", 2, &got, err, sizeof err);
        qt_t_hooks(NULL, QT_MUT_NONE);
        if (rc && differs) { /* a mutant may make the run fail (NaN weights): caught too */
            printf("  %-46s caught: the run failed: %s\n", cases[i].name, err);
            continue;
        }
        QT_REQUIRE(rc == 0, "%s: %s", cases[i].name, err);
        int same = qt_t_same_bits(&ref[cases[i].zero - 2][cases[i].ranks], &got, 0, why, sizeof why);
        printf("  %-46s %s\n", cases[i].name, same ? "bitwise equal to nothing offloaded" : why);
        QT_EXPECT(same != differs, "%s: %s", cases[i].name, same ? "NOT caught (same bits)" : why);
    }
}

int main(void) {
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, "qt_offload")) return 1;
    QT_RUN(test_pinned_alloc);
    QT_RUN(test_plan_7b_weights);
    QT_RUN(test_plan_7b_gradients);
    QT_RUN(test_plan_7b_opt_parts);
    QT_RUN(test_grad_homes);
    QT_RUN(test_offload_weights_ranks_refused);
    QT_RUN(test_offload_weights_bitwise);
    QT_RUN(test_offload_weights_resume);
    QT_RUN(test_offload_weights_mutants_caught);
    QT_RUN(test_offload_quants_mutants_caught);
    QT_RUN(test_offload_gradients_bitwise);
    QT_RUN(test_offload_gradients_mutants_caught);
    QT_RUN(test_offload_opt_parts_bitwise);
    QT_RUN(test_plan_7b_ranks);
    QT_RUN(test_offload_ranks_config);
    QT_RUN(test_offload_ranks_weights_zero3);
    QT_RUN(test_offload_ranks_gradients_zero2);
    QT_RUN(test_offload_ranks_mutants_caught);
    qt_t_rmtree(g_dir);
    return qt_test_end();
}
