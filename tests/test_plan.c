/* test_plan.c — the run's memory plan (qt_planner.h) and the weight source it relies on:
 *  CPU: a range of the weight source equals that part of the whole array (seeded init and HF import);
 *       the host rows' sums; a host limit below the plan refused with its message before allocating;
 *       the bytes the CPU engine really allocates (glibc mallinfo2) equal its planned rows.
 *  GPU (skipped without one): a few steps under memory.gpu_limit_gib with the device usage sampled
 *       (cudaMemGetInfo, less the baseline after context creation) before, during and after the steps:
 *       the peak stays within the cap and matches the plan; a cap below the plan is refused; the rows
 *       qtrain --plan computes without a GPU equal the arena and pinned rows a real model allocates. */
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "qt_attention.h"
#include "qt_comm.h"
#include "qt_cpu_model.h"
#include "qt_device.h"
#include "qt_error.h"
#include "qt_engine.h"
#include "qt_gpu_model.h"
#include "qt_hf.h"
#include "qt_plan_auto.h"
#include "qt_planner.h"
#include "qt_test.h"
#include "qt_weight_src.h"

static int load_cfg(qt_config *c, const char *yaml, const char *extra) {
    char err[1024], text[4096];
    snprintf(text, sizeof text, "%s%s", yaml, extra ? extra : "");
    int rc = qt_config_load_string(c, text, "test_plan.yaml", NULL, 0, err, sizeof err);
    if (rc) printf("  config: %s\n", err);
    return rc;
}

/* A small Qwen2 shape with odd sizes: tensors are not multiples of the ranges below. */
static const char SMALL[] =
    "model: {vocab_size: 301, hidden_size: 96, num_layers: 3, num_heads: 3, num_kv_heads: 1,\n"
    "        intermediate_size: 160, max_seq_len: 64, qkv_bias: true, tie_embeddings: false}\n"
    "data: {train: 'none_*.bin', seq_len: 32, micro_batch: 3, grad_accum: 2}\n"
    "init: {seed: 5, std: 0.05}\n";

static size_t row(const qt_mem_plan *p, qt_mem_where w, const char *kind) {
    for (int i = 0; i < p->n; i++)
        if (p->row[i].where == w && !strcmp(p->row[i].kind, kind)) return p->row[i].bytes;
    return 0;
}

/* Every cut of the source into ranges (odd lengths crossing tensor boundaries) is bit-identical to the
 * whole array, for the seeded init and for an HF import of the same weights. */
static void test_weight_src_ranges(void) {
    qt_config c;
    QT_REQUIRE(load_cfg(&c, SMALL, "device: cpu\n") == 0, "config");
    qt_layout L;
    qt_weight_src src;
    char err[1024];
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    size_t n = L.numel;
    float *whole = malloc(n * 4), *part = malloc(n * 4);
    QT_REQUIRE(whole && part, "malloc");
    qt_layout_init_weights(&L, whole, c.init.seed, c.init.std);
    char dir[] = "/tmp/qt_test_plan_XXXXXX";
    QT_REQUIRE(mkdtemp(dir), "mkdtemp");
    QT_REQUIRE(qt_hf_export(dir, &L, whole, 0, err, sizeof err) == 0, "%s", err);
    qt_weight_src hf = src;
    hf.kind = QT_WSRC_HF;
    snprintf(hf.path, sizeof hf.path, "%s", dir);
    const size_t cuts[] = {1, 37, 4099, n};
    for (int k = 0; k < 2; k++) {
        const qt_weight_src *s = k ? &hf : &src;
        for (int ci = k; ci < 4; ci++) { /* HF: not element by element (each fill reads the file's header) */
            memset(part, 0x7f, n * 4); /* poisoned */
            for (size_t i = 0; i < n; i += cuts[ci]) {
                size_t m = n - i < cuts[ci] ? n - i : cuts[ci];
                QT_REQUIRE(qt_weight_src_fill(s, i, m, part + i, err, sizeof err) == 0, "%s", err);
            }
            size_t bad = n;
            for (size_t i = 0; i < n && bad == n; i++)
                if (memcmp(part + i, whole + i, 4)) bad = i;
            QT_EXPECT(bad == n, "%s source in ranges of %zu: element %zu is %g, expected %g", k ? "HF" : "init", cuts[ci],
                      bad, bad < n ? part[bad] : 0.0, bad < n ? whole[bad] : 0.0);
        }
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    QT_EXPECT(system(cmd) == 0, "rm");
    free(whole);
    free(part);
    qt_layout_free(&L);
}

/* The host rows: the CPU engine's arrays and activations, the step tokens; the GPU engine's offloaded
 * state, token staging, checkpoint snapshot and init buffer per rank; ranks sharing a GPU multiply its
 * device total; every total is the sum of its rows. */
static void test_host_plan_sums(void) {
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    char err[1024];
    QT_REQUIRE(load_cfg(&c, SMALL, "device: cpu\n") == 0, "config");
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    size_t n = L.numel, ntok = 3 * 32 * 2;
    QT_REQUIRE(qt_plan_run(&L, &c, 0, 1, &rp, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(rp.ranks == 0 && rp.gpu_bytes == 0, "CPU engine: %d ranks", rp.ranks);
    QT_EXPECT(row(&rp.mem, QT_MEM_PAGEABLE, "weights, gradients, m, v (fp32)") == 16 * n &&
                  row(&rp.mem, QT_MEM_PAGEABLE, "step tokens") == 8 * ntok &&
                  row(&rp.mem, QT_MEM_PAGEABLE, "activations (CPU)") == qt_cpu_model_bytes(&L, 3, 32) &&
                  row(&rp.mem, QT_MEM_PAGEABLE, "checkpoint snapshot") == 3 * ((4 * n + 63) / 64 * 64),
              "CPU rows");
    QT_EXPECT(rp.host_bytes == 16 * n + 8 * ntok + qt_cpu_model_bytes(&L, 3, 32) + 3 * ((4 * n + 63) / 64 * 64),
              "CPU host total %zu", rp.host_bytes);

    QT_REQUIRE(load_cfg(&c, SMALL, "device: cuda\nmemory: {offload_optimizer: true}\nparallel: {devices: [0, 0, 1]}\n") == 0,
               "config");
    QT_REQUIRE(qt_plan_run(&L, &c, -1, 1, &rp, err, sizeof err) == 0, "%s", err);
    qt_shard sh;
    qt_layout P; /* the layout of the plan's ranks (the planner's, qt_plan_unit_align) */
    QT_REQUIRE(qt_layout_init_units(&P, &L.cfg, qt_plan_unit_align(&rp.plan), err, sizeof err) == 0, "%s", err);
    qt_shard_init(&sh, &P, 3, 0, c.parallel.overlap_comm);
    size_t n3 = P.numel; /* the padded layout's elements */
    qt_layout_free(&P);
    size_t ns = sh.len, st = qt_mem_aligned(ns * 4) * 3; /* master, m, v fp32, each aligned */
    QT_EXPECT(rp.ranks == 3 && rp.ranks_per_gpu == 2, "ranks %d, per GPU %d", rp.ranks, rp.ranks_per_gpu);
    QT_EXPECT(row(&rp.mem, QT_MEM_PINNED, "offloaded optimizer state") == 3 * st, "offloaded %zu, expected %zu",
              row(&rp.mem, QT_MEM_PINNED, "offloaded optimizer state"), 3 * st);
    /* the ranks' offloaded pieces written where they are, the writer gathering them: the bf16 weights only */
    QT_EXPECT(row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot") == 3 * 2 * n3 &&
                  row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot (assembled)") == 0,
              "snapshot rows: %zu", row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot"));
    QT_EXPECT(row(&rp.mem, QT_MEM_PINNED, "token staging") == 3 * (16 * 96 + 16) &&
                  row(&rp.mem, QT_MEM_PAGEABLE, "weight init buffer (fp32)") == 3 * 4 * n3 &&
                  row(&rp.mem, QT_MEM_PAGEABLE, "step tokens") == 3 * 8 * ntok,
              "staging, init buffer, tokens");
    size_t cdev, cpin;
    qt_comm_plan_bytes(3, QT_COMM_AUTO, &cdev, &cpin);
    QT_EXPECT(cdev >= 2 * 2 * ((size_t)16 << 20) && cpin >= ((size_t)64 << 20) && row(&rp.mem, QT_MEM_DEVICE, "comm buffers") == cdev &&
                  row(&rp.mem, QT_MEM_PINNED, "comm host arena") == cpin,
              "comm rows: %zu on each GPU, %zu pinned", cdev, cpin);
    size_t host = 0, dev = 0;
    for (int i = 0; i < rp.mem.n; i++)
        *(rp.mem.row[i].where >= QT_MEM_PINNED ? &host : &dev) += rp.mem.row[i].bytes;
    QT_EXPECT(rp.host_bytes == host && rp.gpu_bytes == 2 * dev && dev > rp.mem.off, "totals: host %zu/%zu, GPU %zu/%zu",
              rp.host_bytes, host, rp.gpu_bytes, 2 * dev);
    /* one GPU offloaded: master, m and v are written where they live, only the bf16 weights are copied */
    QT_REQUIRE(load_cfg(&c, SMALL, "device: cuda\nmemory: {offload_optimizer: true}\n") == 0, "config");
    QT_REQUIRE(qt_plan_run(&L, &c, -1, 1, &rp, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot") == 2 * n, "one GPU offloaded: snapshot %zu",
              row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot"));
    /* A bf16 master has no fp32 copy in the snapshot ("weights" is the bf16 weights widened as written):
     * one GPU offloaded in place, copied (checkpoint.offloaded: copy: m, v too), on the device; 3 ranks
     * sharded (each its bf16 weights and pieces of m, v, the writer gathering them: nothing assembled); 2 ranks
     * replicated (rank 0's) */
    static const struct { const char *extra; size_t snap, assembled; } bm[] = {
        {"memory: {offload_optimizer: true}\n", 2, 0},
        {"memory: {offload_optimizer: true}\ncheckpoint: {offloaded: copy}\n", 2 + 8, 0},
        {"\n", 2 + 8, 0},
        {"parallel: {devices: [0, 0, 1]}\n", 0, 0},
        {"parallel: {devices: [0, 1], zero: 0}\n", 2 + 8, 0},
        {"memory: {offload_optimizer: true}\nparallel: {devices: [0, 0, 1]}\ncheckpoint: {offloaded: copy}\n", 0, 0},
        {"memory: {offload_optimizer: true}\nparallel: {devices: [0, 0, 1]}\n", 3 * 2, 0}, /* m, v in place */
    };
    for (int k = 0; k < 7; k++) {
        char extra[256];
        snprintf(extra, sizeof extra, "device: cuda\nprecision: {master_dtype: bf16}\n%s", bm[k].extra);
        QT_REQUIRE(load_cfg(&c, SMALL, extra) == 0, "config %d", k);
        QT_REQUIRE(qt_plan_run(&L, &c, -1, 1, &rp, err, sizeof err) == 0, "%s", err);
        size_t nk = k == 3 || k >= 5 ? n3 : n; /* 3 ranks sharded: the padded layout's elements */
        size_t snap = k == 3 || k == 5 ? 3 * (2 * nk + 8 * ns) : bm[k].snap * nk; /* fp32 m, v */
        QT_EXPECT(row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot") == snap &&
                      row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot (assembled)") == bm[k].assembled * n,
                  "bf16 master, case %d: snapshot %zu (expected %zu), assembled %zu", k,
                  row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot"), snap,
                  row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot (assembled)"));
    }
    qt_layout_free(&L);
}

/* A host limit below the plan: refused with the total, the limit and the biggest items, by the check
 * and by the engine (before it allocates: no engine comes back). */
static void test_host_limit_refused(void) {
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    char err[1024];
    QT_REQUIRE(load_cfg(&c, SMALL, "device: cpu\nmemory: {host_limit_gib: 0.001}\n") == 0, "config");
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_plan_run(&L, &c, 0, 1, &rp, err, sizeof err) == 0, "%s", err);
    char what[96];
    size_t lim = qt_plan_host_limit(&c, what, sizeof what);
    QT_EXPECT(lim == qt_mem_gib(0.001) && strstr(what, "memory.host_limit_gib = 0.001"), "limit %zu (%s)", lim, what);
    QT_EXPECT(rp.host_bytes > lim, "the small model needs %zu bytes: raise the test's model", rp.host_bytes);
    QT_EXPECT(qt_plan_check(&rp, 0, "", lim, what, err, sizeof err) == -1 && strstr(err, "the host memory plan needs") &&
                  strstr(err, "memory.host_limit_gib = 0.001 allows 1.0 MiB") &&
                  strstr(err, "biggest items: weights, gradients, m, v (fp32) 4.1 MiB (host), checkpoint snapshot 3.1 MiB (host), activations (CPU) 1.8 MiB (host)"),
              "refusal: %s", err);
    qt_engine *e = qt_engine_create(&L, &c, &src, err, sizeof err);
    QT_EXPECT(!e && strstr(err, "host memory plan needs") && strstr(err, "qtrain --plan"), "engine: %s", e ? "created" : err);
    qt_engine_free(e);
    c.memory.host_limit_gib = 0;
    QT_EXPECT(qt_plan_host_limit(&c, what, sizeof what) == qt_host_mem_available() && qt_host_mem_available() > 0 &&
                  strstr(what, "MemAvailable"),
              "MemAvailable: %zu", qt_host_mem_available());
    qt_layout_free(&L);
}

static size_t heap_bytes(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd; /* in use from the heap + mmap'ed blocks */
}

/* What the CPU engine allocates (glibc's count of bytes in use) equals its planned rows, "weights,
 * gradients, m, v" and "activations (CPU)", within 16 KiB + 0.1% (allocator headers, page rounding of
 * mmap'ed blocks, the engine structs; the logits alone are 113 KiB). Covered: every array of engine_cpu.c and qt_cpu_model_create;
 * the step tokens are train.c's and counted by arithmetic only. */
static void test_cpu_alloc_matches_plan(void) {
#ifdef __SANITIZE_ADDRESS__
    QT_SKIP("mallinfo2 does not see AddressSanitizer's allocator (the plain build runs this test)");
#endif
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    char err[1024];
    QT_REQUIRE(load_cfg(&c, SMALL, "device: cpu\n") == 0, "config");
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_plan_run(&L, &c, 0, 0, &rp, err, sizeof err) == 0, "%s", err);
    size_t plan = rp.host_bytes;
    size_t before = heap_bytes();
    qt_engine *e = qt_engine_create(&L, &c, &src, err, sizeof err);
    QT_REQUIRE(e, "%s", err);
    size_t used = heap_bytes() - before;
    double diff = fabs((double)used - (double)plan);
    printf("  CPU engine: planned %zu bytes, allocated %zu (%+.0f)\n", plan, used, (double)used - (double)plan);
    QT_EXPECT(diff <= 0.001 * plan + (16 << 10), "planned %zu bytes, the engine allocated %zu", plan, used);
    qt_engine_free(e);
    qt_layout_free(&L);
}

/* A Qwen2.5-1.5B shape; micro_batch is not given (grad_accum 64 x the default 8: 512 sequences a step). */
static const char B15[] =
    "model: {vocab_size: 151936, hidden_size: 1536, num_layers: 28, num_heads: 12, num_kv_heads: 2,\n"
    "        intermediate_size: 8960, max_seq_len: 1024, qkv_bias: true, tie_embeddings: true}\n"
    "data: {train: 'none_*.bin', seq_len: 1024, grad_accum: 64}\n"
    "precision: {matmul_dtype: e4m3, persistent_quants: true}\n"
    "device: cuda\nmemory: {plan: auto, host_limit_gib: 512, ";

/* memory.plan: auto with a fixed probe: every candidate fits the cap (its plan made again agrees), they
 * come fastest first, the tokens per step are kept, a given key is a constraint, the cost model charges
 * recompute FLOPs and the offload's PCIe bytes, and a cap nothing fits is refused naming the smallest. */
static void test_auto_choice(void) {
    const qt_probe pr = {"test", 400e12, 640e12, 2e12, 25e9, (size_t)80 << 30, 0};
    static qt_plan_choice ch[QT_PLAN_AUTO_MAX];
    static qt_run_plan rp;
    char err[1024], yaml[2048];
    const double caps[3] = {80, 24, 16};
    qt_plan_choice best[3];
    for (int k = 0; k < 3; k++) {
        qt_config c;
        qt_layout L;
        qt_weight_src src;
        snprintf(yaml, sizeof yaml, "%sgpu_limit_gib: %g}\n", B15, caps[k]);
        QT_REQUIRE(load_cfg(&c, yaml, NULL) == 0, "config");
        QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
        int n;
        QT_REQUIRE(qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, &n, NULL, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(n > 3, "cap %g: %d plans fit", caps[k], n);
        for (int i = 0; i < n; i++) {
            QT_EXPECT(ch[i].micro_batch * ch[i].grad_accum == 512, "tokens per step changed: %d x %d", ch[i].micro_batch,
                      ch[i].grad_accum);
            QT_EXPECT(i == 0 || ch[i].tokens_per_s <= ch[i - 1].tokens_per_s, "not fastest first at %d", i);
            QT_EXPECT(ch[i].gpu_bytes <= qt_mem_gib(caps[k]), "cap %g: a plan of %zu bytes", caps[k], ch[i].gpu_bytes);
            QT_EXPECT(!ch[i].lossy, "cap %g: bf16 master/gradients offered though fp32 plans fit", caps[k]);
        }
        qt_config chosen = c;
        qt_plan_auto_apply(&chosen, &ch[0]);
        QT_REQUIRE(qt_plan_run(&L, &chosen, -1, 1, &rp, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(rp.gpu_bytes == ch[0].gpu_bytes && rp.gpu_bytes <= qt_mem_gib(caps[k]), "the chosen plan's bytes");
        double s = qt_plan_auto_cost(&L, &chosen, &pr);
        QT_EXPECT(fabs(ch[0].step_s - s) < 1e-12 && fabs(ch[0].tokens_per_s - 512 * 1024 / s) < 1e-6, "prediction");
        /* the model's charges: block recompute = one more forward of the blocks; offload = 2 x 12 B/param */
        qt_config a = chosen, b = chosen;
        a.memory.recompute = 0, b.memory.recompute = QT_RC_BLOCK;
        { /* block: every recomputed part's FLOPs once more at the matmul rate, its norms at HBM, h written by the SwiGLU bwd */
            const qt_model_cfg *m = &L.cfg;
            double C = m->hidden_size, F = m->intermediate_size, HD = (double)m->num_heads * m->head_dim, T = 1024;
            double QKV = HD + 2.0 * m->num_kv_heads * m->head_dim, n = chosen.data.micro_batch * T, tok = 512 * T;
            double rate = chosen.precision.matmul_dtype == QT_DT_E4M3 ? pr.fp8_flops : pr.bf16_flops;
            double want = tok * m->num_layers * ((2 * C * QKV + 2 * T * HD + 2 * HD * C + 4 * C * F) / rate / (n / (n + 512)) +
                                                 (8 * C + 2 * F) / pr.hbm_bps);
            double d = qt_plan_auto_cost_parts(&L, &b, &pr).compute - qt_plan_auto_cost_parts(&L, &a, &pr).compute;
            QT_EXPECT(fabs(d - want) < 1e-9 * want, "block recompute charged %g s, expected %g", d, want);
        }
        qt_config_set_offload(&a, QT_OFF_OPTIMIZER, 0), b = a, qt_config_set_offload(&b, QT_OFF_OPTIMIZER, 1);
        double pcie = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
        QT_EXPECT(fabs(pcie - (1 + QT_PLAN_DUPLEX) * L.numel * 12 / 25e9) < 1e-9, "offload charged %g s", pcie);
        best[k] = ch[0];
        char rc[64];
        printf("  cap %2g GiB: %d plans fit; chosen mb %d, recompute [%s], offload %d, lm chunks %d: %.2f GiB, %.0f tok/s\n",
               caps[k], n, ch[0].micro_batch, qt_act_recompute_names(qt_act_recompute_resolve(ch[0].recompute), rc, sizeof rc),
               ch[0].offload_optimizer, ch[0].lmhead_chunks, ch[0].gpu_bytes / 1073741824.0, ch[0].tokens_per_s);
        /* a given key is a constraint */
        snprintf(yaml, sizeof yaml, "%sgpu_limit_gib: %g, recompute: [block]}\n", B15, caps[k]);
        QT_REQUIRE(load_cfg(&c, yaml, NULL) == 0, "config");
        QT_REQUIRE(qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, &n, NULL, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < n; i++) QT_EXPECT(ch[i].recompute == QT_RC_BLOCK, "recompute %d, given [block]", ch[i].recompute);
        qt_layout_free(&L);
    }
    QT_EXPECT(best[0].tokens_per_s >= best[1].tokens_per_s && best[1].tokens_per_s >= best[2].tokens_per_s,
              "a smaller cap gave a faster plan");
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    snprintf(yaml, sizeof yaml, "%sgpu_limit_gib: 2}\n", B15);
    QT_REQUIRE(load_cfg(&c, yaml, NULL) == 0, "config");
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    int n;
    QT_EXPECT(qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, &n, NULL, err, sizeof err) == -1 &&
                  strstr(err, "no plan fits: the smallest needs") && strstr(err, "memory.gpu_limit_gib allows 2.00 GiB"),
              "2 GiB: %s", err);
    qt_layout_free(&L);
}

/* The GPU budget is what is free on the GPU as the run starts less QT_PLAN_GPU_MARGIN, capped by
 * memory.gpu_limit_gib (qt_plan_gpu_budget): with 24 GiB free (another process holding the rest of an 80 GiB
 * card) and no limit, every plan auto offers fits 23 GiB; a limit under the free memory is the budget, one over
 * it is not; unmeasured (no GPU), the limit, else the probe's memory less the margin. */
static void test_gpu_budget_free(void) {
    qt_probe pr = {"test", 400e12, 640e12, 2e12, 25e9, (size_t)80 << 30, (size_t)24 << 30};
    const size_t G = (size_t)1 << 30;
    char err[1024], yaml[2048], what[192];
    qt_config c;
    snprintf(yaml, sizeof yaml, "%sgpu_limit_gib: 0}\n", B15);
    QT_REQUIRE(load_cfg(&c, yaml, NULL) == 0, "config");
    QT_EXPECT(qt_plan_gpu_budget(&c, &pr, what, sizeof what) == 23 * G && strstr(what, "cudaMemGetInfo: 24.00 GiB") &&
                  strstr(what, "1 GiB margin"), "24 GiB free: %s", what);
    qt_layout L;
    qt_weight_src src;
    static qt_plan_choice ch[QT_PLAN_AUTO_MAX];
    int n;
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, &n, NULL, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < n; i++) QT_EXPECT(ch[i].gpu_bytes <= 23 * G, "a plan of %.2f GiB with 24 GiB free", ch[i].gpu_bytes / (double)G);
    pr.gpu_free = 0; /* the same config planned for the card's 80 GiB takes more of it */
    qt_plan_choice best;
    QT_REQUIRE(qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, &n, NULL, err, sizeof err) == 0, "%s", err);
    best = ch[0];
    QT_EXPECT(best.gpu_bytes > 23 * G, "80 GiB: the fastest plan takes %.2f GiB", best.gpu_bytes / (double)G);
    qt_layout_free(&L);
    QT_EXPECT(qt_plan_gpu_budget(&c, &pr, what, sizeof what) == 79 * G && strstr(what, "no free memory measured"), "%s", what);
    c.memory.gpu_limit_gib = 10;
    QT_EXPECT(qt_plan_gpu_budget(&c, &pr, what, sizeof what) == 10 * G && !strcmp(what, "memory.gpu_limit_gib = 10"), "%s", what);
    pr.gpu_free = (size_t)24 << 30;
    QT_EXPECT(qt_plan_gpu_budget(&c, &pr, what, sizeof what) == 10 * G && !strcmp(what, "memory.gpu_limit_gib = 10"), "%s", what);
    c.memory.gpu_limit_gib = 40; /* the cap does not raise the budget over the free memory */
    QT_EXPECT(qt_plan_gpu_budget(&c, &pr, what, sizeof what) == 23 * G && strstr(what, "below memory.gpu_limit_gib"), "%s", what);
}

/* Qwen2.5-7B and -14B shapes, fp8, LLM.Q's setting (512 sequences of 1024 a step). */
static const char B7[] =
    "model: {vocab_size: 152064, hidden_size: 3584, num_layers: 28, num_heads: 28, num_kv_heads: 4,\n"
    "        intermediate_size: 18944, max_seq_len: 1024, qkv_bias: true, tie_embeddings: false}\n"
    "device: cuda\n";
#define P7 "precision: {matmul_dtype: e4m3, persistent_quants: true}\n"
#define P14 "precision: {matmul_dtype: e4m3, persistent_quants: true"
static const char B14[] =
    "model: {vocab_size: 152064, hidden_size: 5120, num_layers: 48, num_heads: 40, num_kv_heads: 8,\n"
    "        intermediate_size: 13824, max_seq_len: 1024, qkv_bias: true, tie_embeddings: false}\n"
    "device: cuda\n";

/* memory.plan: auto over model + extra (the data, memory and parallel keys): *best the fastest plan that
 * fits, *n their count; every candidate is checked against the given keys. -1 when none fits. */
static int auto_pick_lossy(const char *model, const char *extra, qt_plan_choice *best, int *n, qt_plan_choice *lossy) {
    const qt_probe pr = {"test", 400e12, 640e12, 2e12, 25e9, (size_t)80 << 30, 0};
    static qt_plan_choice ch[QT_PLAN_AUTO_MAX];
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    char err[1024];
    *n = 0;
    QT_EXPECT(load_cfg(&c, model, extra) == 0, "config");
    QT_EXPECT(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    if (qt_t_failed) return -2;
    int rc = qt_plan_auto_enumerate(&L, &c, &pr, ch, QT_PLAN_AUTO_MAX, n, lossy, err, sizeof err);
    qt_layout_free(&L);
    if (rc) {
        printf("    (%s)\n", err);
        *n = 0;
        return -1;
    }
    for (int i = 0; i < *n; i++) { /* a key the config gives is a constraint */
        const qt_plan_choice *x = &ch[i];
        QT_EXPECT(!qt_config_given(&c, "memory.offload_residual") || x->offload_residual == c.memory.offload_residual,
                  "offload_residual %d, given %d", x->offload_residual, c.memory.offload_residual);
        QT_EXPECT(!qt_config_given(&c, "memory.fp8_weight_cache") || x->fp8_weight_cache == c.memory.fp8_weight_cache,
                  "fp8_weight_cache %d, given %d", x->fp8_weight_cache, c.memory.fp8_weight_cache);
        QT_EXPECT(!qt_config_given(&c, "precision.master_dtype") || x->master_dtype == c.precision.master_dtype,
                  "master_dtype %d, given %d", x->master_dtype, c.precision.master_dtype);
        QT_EXPECT(!qt_config_given(&c, "precision.grad_accum_dtype") || x->grad_accum_dtype == c.precision.grad_accum_dtype,
                  "grad_accum_dtype %d, given %d", x->grad_accum_dtype, c.precision.grad_accum_dtype);
        QT_EXPECT(!qt_config_given(&c, "parallel.zero") || x->zero == c.parallel.zero, "zero %d, given %d", x->zero,
                  c.parallel.zero);
        QT_EXPECT(x->lossy == ch[0].lossy, "bf16 master/gradients beside fp32 plans at %d", i);
    }
    *best = ch[0];
    printf("  %-60.60s: %5d fit; mb %2d, offload_residual %d, wcache %s, master %s, grads %s, zero %d%s, %.1f GiB\n",
           extra, *n, best->micro_batch, best->offload_residual, best->fp8_weight_cache ? "none" : "all",
           best->master_dtype == QT_DT_BF16 ? "bf16" : "fp32", best->grad_accum_dtype == QT_DT_BF16 ? "bf16" : "fp32",
           best->zero, best->offload_bits == (QT_OFF_WEIGHTS | QT_OFF_GRADIENTS) ? ", weights + gradients offloaded"
           : best->offload_bits == QT_OFF_WEIGHTS ? ", weights offloaded" : best->offload_bits ? ", gradients offloaded" : "",
           best->gpu_bytes / 1073741824.0);
    return 0;
}

static int auto_pick(const char *model, const char *extra, qt_plan_choice *best, int *n) {
    return auto_pick_lossy(model, extra, best, n, NULL);
}

/* 7B at 16 GiB (auto_vs_hand's case: measured 3,512 tokens/s with fp32 state, 8,348 given bf16 master
 * weights and gradients): auto keeps the fp32 plan and hands back the faster bf16 one for the NOTE; with
 * the dtypes given there is none to hand back. */
static void test_auto_lossy_hint(void) {
    qt_plan_choice b, lossy;
    int n;
#define D7S "data: {train: 'none_*.bin', seq_len: 1024, micro_batch: 8, grad_accum: 8}\n"
#define M7S "memory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 16}\n"
    QT_REQUIRE(auto_pick_lossy(B7, D7S P7 M7S, &b, &n, &lossy) == 0, "7B at 16 GiB: no plan");
    printf("  chosen %.0f tokens/s (lossy %d); left out: %.0f tokens/s (lossy %d, master %s, gradients %s)\n", b.tokens_per_s,
           b.lossy, lossy.tokens_per_s, lossy.lossy, lossy.master_dtype == QT_DT_BF16 ? "bf16" : "fp32",
           lossy.grad_accum_dtype == QT_DT_BF16 ? "bf16" : "fp32");
    QT_EXPECT(!b.lossy, "bf16 master/gradients chosen though an fp32 plan fits");
    QT_EXPECT(lossy.lossy > 0 && qt_plan_auto_lossy_worth(&b, &lossy), "no faster bf16 plan handed back: %.0f vs %.0f",
              lossy.tokens_per_s, b.tokens_per_s);
    QT_REQUIRE(auto_pick_lossy(B7, D7S "precision: {matmul_dtype: e4m3, persistent_quants: true, master_dtype: fp32, "
                                       "grad_accum_dtype: fp32}\n" M7S, &b, &n, &lossy) == 0, "7B at 16 GiB, fp32 given: no plan");
    QT_EXPECT(lossy.tokens_per_s == 0 && !qt_plan_auto_lossy_worth(&b, &lossy), "a bf16 plan handed back though fp32 was given");
#undef D7S
#undef M7S
}

/* The planner's memory-feature axes (offloaded items, bf16 state, ZeRO level): each is chosen where it is the only way to fit, not where
 * a plainer plan fits or the config fixes the key; their costs are the documented ones. */
static void test_auto_axes(void) {
    qt_plan_choice b;
    int n;
#define D7 "data: {train: 'none_*.bin', seq_len: 1024, micro_batch: 16, grad_accum: 32}\n" \
           "precision: {matmul_dtype: e4m3, persistent_quants: true, master_dtype: fp32, grad_accum_dtype: fp32}\n"
#define M7 "memory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 72, offload_optimizer: true, recompute: [ffn, norm], "
    /* 7B at micro-batch 16, recompute [ffn, norm], fp32 state, 72 GiB: smallest 73.2 GiB plain; the residuals
     * offloaded (70.3) or the fp8 weights not cached fit */
    QT_EXPECT(auto_pick(B7, D7 M7 "offload_residual: false, fp8_weight_cache: all, offload: []}\n", &b, &n) == -1,
              "7B mb 16 fits without either: the test proves nothing");
    QT_EXPECT(auto_pick(B7, D7 M7 "fp8_weight_cache: all}\n", &b, &n) == 0 && b.offload_residual == 1,
              "7B mb 16, weight cache all: offload_residual not chosen");
    QT_EXPECT(auto_pick(B7, D7 M7 "offload_residual: false}\n", &b, &n) == 0 && b.fp8_weight_cache == QT_FP8_WCACHE_NONE,
              "7B mb 16, no residual offload: fp8_weight_cache none not chosen");
    /* where the plain plan fits, none of the new axes is taken */
    QT_EXPECT(auto_pick(B7, D7 "memory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 80, offload_optimizer: true, "
                            "recompute: [block]}\n", &b, &n) == 0 &&
                  !b.offload_residual && b.fp8_weight_cache == QT_FP8_WCACHE_ALL && !b.lossy,
              "7B with block recompute: a new axis taken though the plain plan fits");
    /* 14B at 80 GiB with the weights and gradients on the GPU (memory.offload: [] given): only bf16 gradients
     * with the weight quants in slots fit; the master weights, offloaded, stay fp32 (bf16 only where needed) */
#define D14 "data: {train: 'none_*.bin', seq_len: 1024, grad_accum: 512}\n"
#define M14 "memory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 80"
    QT_EXPECT(auto_pick(B14, D14 P14 "}\n" M14 ", offload: []}\n", &b, &n) == 0 && b.master_dtype == QT_DT_F32 &&
                  b.grad_accum_dtype == QT_DT_BF16 && b.fp8_weight_cache == QT_FP8_WCACHE_NONE && b.lossy == 1 &&
                  !b.offload_bits,
              "14B at 80 GiB: not bf16 gradients + fp32 master + fp8_weight_cache none (weights on the GPU)");
    QT_EXPECT(auto_pick(B14, D14 P14 "}\n" M14 ", fp8_weight_cache: all, offload: []}\n", &b, &n) == -1,
              "14B fits with the weight cache");
    /* left to auto, fp32 gradients with weights and/or gradients offloaded win over bf16 gradients
     * (offloading keeps the bits; among those the cost model picks) */
    QT_EXPECT(auto_pick(B14, D14 P14 "}\n" M14 "}\n", &b, &n) == 0 && !b.lossy && b.offload_bits,
              "14B at 80 GiB: lossy %d, offloaded items %d", b.lossy, b.offload_bits);
    /* with fp32 gradients given, memory.offload's gradients or weights items make it fit; with memory.offload
     * given ([]: both stay on the GPU) nothing fits */
    QT_EXPECT(auto_pick(B14, D14 P14 ", grad_accum_dtype: fp32}\n" M14 "}\n", &b, &n) == 0 && b.offload_bits &&
                  b.grad_accum_dtype == QT_DT_F32,
              "14B with fp32 gradients at 80 GiB: offloaded items %d", b.offload_bits);
    QT_EXPECT(auto_pick(B14, D14 P14 ", grad_accum_dtype: fp32}\n" M14 ", offload: []}\n", &b, &n) == -1,
              "14B fits with fp32 gradients and the weights on the GPU");
    /* ZeRO-2 over 4 ranks: 7B at 30 GiB needs the gradients sharded */
#define D7x "data: {train: 'none_*.bin', seq_len: 1024, grad_accum: 128}\n" P7 "parallel: {gpus: 4"
#define M7x "}\nmemory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 30}\n"
    QT_EXPECT(auto_pick(B7, D7x M7x, &b, &n) == 0 && b.zero == 2, "7B x 4 at 30 GiB: zero 2 not chosen");
    QT_EXPECT(auto_pick(B7, D7x ", zero: 1" M7x, &b, &n) == -1 || b.zero == 1, "zero: 1 given");
    /* ZeRO-3 over 4 ranks: 7B at 22 GiB needs the bf16 weights sharded too (zero 2's smallest plan does not
     * fit with nothing offloaded), and with fp8 matmuls the weight quants made at use (fp8_weight_cache none) */
#define M7x22 "}\nmemory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 22, offload: []}\n"
    QT_EXPECT(auto_pick(B7, D7x M7x22, &b, &n) == 0 && b.zero == 3 && b.fp8_weight_cache == QT_FP8_WCACHE_NONE,
              "7B x 4 at 22 GiB: zero 3 not chosen");
    QT_EXPECT(auto_pick(B7, D7x ", zero: 2" M7x22, &b, &n) == -1, "7B x 4 at 22 GiB fits with zero 2: the test proves nothing");
    /* memory.offload an axis with ranks too: zero 2 fits there with its gradient shard offloaded (never the
     * weights: zero 3 only), and every plan auto takes offloads only what its ZeRO level allows */
#define M7x22o "}\nmemory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 22}\n"
    QT_EXPECT(auto_pick(B7, D7x ", zero: 2" M7x22o, &b, &n) == 0 && b.zero == 2 && b.offload_bits == QT_OFF_GRADIENTS,
              "7B x 4 at 22 GiB, zero 2: offloaded items %d", b.offload_bits);
    QT_EXPECT(auto_pick(B7, D7x M7x22o, &b, &n) == 0 && (!(b.offload_bits & QT_OFF_WEIGHTS) || b.zero == 3) &&
                  (!(b.offload_bits & QT_OFF_GRADIENTS) || b.zero >= 2),
              "7B x 4 at 22 GiB: zero %d with offloaded items %d", b.zero, b.offload_bits);
    /* at equal predicted speed (micro-batch 1 fixed, both fit) the plainer ZeRO-1 */
    QT_EXPECT(auto_pick(B7, "data: {train: 'none_*.bin', seq_len: 1024, micro_batch: 1, grad_accum: 128}\n" P7
                            "parallel: {gpus: 4}\nmemory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 80, recompute: [block]}\n", &b, &n) == 0 &&
                  b.zero == 1, "7B x 4 at 80 GiB, micro-batch 1: zero 2 chosen though zero 1 fits as fast");
}

/* memory.offload's weights / gradients are taken where they are predicted faster than every plan without
 * them, and only there. Four 24 GiB cards with a host transport at LLM.Q's precision: 7B with them at a
 * larger micro-batch beats the best plan without them (bench/RESULTS.md section 13 ran the one without:
 * 37,206 tokens/s). One GPU at 80 GiB: the plan without them is faster; none taken. */
static void test_auto_offload_only_faster(void) {
    qt_plan_choice b, p;
    int n;
#define D7B "data: {train: 'none_*.bin', seq_len: 1024, grad_accum: 128}\n" \
            "precision: {matmul_dtype: e4m3, grad_dtype: e4m3, persistent_quants: true, master_dtype: bf16, grad_accum_dtype: bf16}\n"
#define BOX "parallel: {gpus: 4, comm: host, gather_dtype: e4m3}\nperf: {cuda_graphs: false}\n" \
            "memory: {plan: auto, host_limit_gib: 500, gpu_limit_gib: 24"
    QT_REQUIRE(auto_pick(B7, D7B BOX "}\n", &b, &n) == 0, "7B on the box: no plan");
    QT_REQUIRE(auto_pick(B7, D7B BOX ", offload: []}\n", &p, &n) == 0, "7B on the box without offloaded items: no plan");
    printf("  7B on the box: %.0f tokens/s with offloaded items %d (mb %d), %.0f without (mb %d)\n", b.tokens_per_s,
           b.offload_bits, b.micro_batch, p.tokens_per_s, p.micro_batch);
    QT_EXPECT(b.offload_bits && b.tokens_per_s > p.tokens_per_s, "7B on the box: offloaded items %d at %.0f vs %.0f without",
              b.offload_bits, b.tokens_per_s, p.tokens_per_s);
    QT_REQUIRE(auto_pick(B7, D7B "memory: {plan: auto, host_limit_gib: 1024, gpu_limit_gib: 80}\n", &b, &n) == 0,
               "7B on one 80 GiB GPU: no plan");
    QT_EXPECT(!b.offload_bits, "7B on one 80 GiB GPU: offloaded items %d taken", b.offload_bits);
#undef D7B
#undef BOX
}

/* The charges of the new axes: residual offload's PCIe bytes, fp8_weight_cache none's quantize passes,
 * ZeRO-3's weight gathers, the offloaded weights' copies, gradient sums through host memory. */
static void test_auto_axes_cost(void) {
    const qt_probe pr = {"test", 400e12, 640e12, 2e12, 25e9, (size_t)80 << 30, 0};
    qt_config a, b;
    qt_layout L;
    qt_weight_src src;
    char err[1024];
    QT_REQUIRE(load_cfg(&a, B7, D7 "memory: {plan: auto}\n") == 0, "config");
    QT_REQUIRE(qt_model_layout(&a, &L, &src, err, sizeof err) == 0, "%s", err);
    /* the side copies of a micro-step (pcie_micro) apart from the step's serial bytes (once) */
    b = a, qt_config_set_offload(&b, QT_OFF_RESIDUAL, 1);
    qt_plan_cost ka = qt_plan_auto_cost_parts(&L, &a, &pr), kb = qt_plan_auto_cost_parts(&L, &b, &pr);
    double want = 32 * 2 * 26.0 * 16 * 1024 * 3584 * 2 / 25e9, d = kb.pcie_micro - ka.pcie_micro;
    QT_EXPECT(fabs(d - want) < 1e-9 * want && kb.once == ka.once && kb.compute == ka.compute,
              "offload_residual charged %g s beside the compute, expected %g", d, want);
    b = a, b.memory.fp8_weight_cache = QT_FP8_WCACHE_NONE;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    double P = 28.0 * (3584.0 * (3584 + 2 * 512) + 3584.0 * 3584 + 3 * 3584.0 * 18944);
    want = 32 * 2 * P * 3 / 2e12;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "fp8_weight_cache none charged %g s, expected %g", d, want);
    b = a, b.precision.master_dtype = b.precision.grad_accum_dtype = QT_DT_BF16, b.parallel.zero = 2;
    QT_EXPECT(qt_plan_auto_cost(&L, &b, &pr) == qt_plan_auto_cost(&L, &a, &pr), "bf16 state / zero 2 charged");
    /* zero 3: every layer's bf16 weights (the flat span of the layers) gathered twice per micro-step, at PCIe */
    b = a, b.parallel.zero = 3;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    want = 32 * 2 * (double)(L.final_norm - L.layers[0].ln1) * 2 / 25e9;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "zero 3 charged %g s, expected %g", d, want);
    /* offloaded weights: the layers copied up as zero 3 gathers them, the embedding and LM head once, AdamW's
     * writes and the finiteness count's reads of the host array (2 B/param each way) */
    b = a, b.memory.offload = QT_OFF_WEIGHTS;
    kb = qt_plan_auto_cost_parts(&L, &b, &pr);
    double span = (double)(L.final_norm - L.layers[0].ln1);
    want = 32 * 2 * span * 2 / 25e9, d = kb.pcie_micro - ka.pcie_micro;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "offloaded weights charged %g s beside the compute, expected %g", d, want);
    want = (((double)L.numel - span) * 2 + 4.0 * L.numel) / 25e9, d = kb.once - ka.once;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "offloaded weights charged %g s once, expected %g", d, want);
    /* offloaded gradients: 32 micro-steps' stores, 31 loads, the norm's and AdamW's reads and the zeroing (4 B/param) */
    b = a, b.memory.offload = QT_OFF_GRADIENTS;
    kb = qt_plan_auto_cost_parts(&L, &b, &pr);
    want = (double)L.numel * 4 * (32 + 31) / 25e9, d = kb.pcie_micro - ka.pcie_micro;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "offloaded gradients charged %g s beside the compute, expected %g", d, want);
    want = (double)L.numel * 4 * 3 / 25e9, d = kb.once - ka.once;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "offloaded gradients charged %g s once, expected %g", d, want);
    /* the step: the slower of compute and side copies, a fifth of the faster, the serial bytes (here the
     * copies, 75 s, outrun the compute) */
    qt_config_set_offload(&b, QT_OFF_RESIDUAL, 1), kb = qt_plan_auto_cost_parts(&L, &b, &pr);
    QT_EXPECT(kb.pcie_micro > kb.compute && kb.compute > 0, "copies %g s, compute %g s", kb.pcie_micro, kb.compute);
    want = kb.pcie_micro + 0.2 * kb.compute + kb.once, d = qt_plan_auto_cost(&L, &b, &pr);
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "step %g s, expected %g", d, want);
    QT_EXPECT(fabs(qt_plan_auto_cost(&L, &a, &pr) - ka.compute - ka.once) < 1e-9 * ka.compute, "no side copies");
    /* gradient sums through host memory, 4 ranks: 3/4 of the fp32 gradients once per step (ZeRO-1), every
     * micro-step (32) with ZeRO-2, half the bytes in bf16; peer is not charged */
    a.parallel.gpus = 4, a.parallel.comm = QT_COMM_PEER;
    b = a, b.parallel.comm = QT_COMM_HOST;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    want = 0.75 * (double)L.numel * 4 / 25e9;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "host sums, zero 1: charged %g s, expected %g", d, want);
    a.parallel.zero = b.parallel.zero = 2;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    QT_EXPECT(fabs(d - 32 * want) < 1e-9 * want, "host sums, zero 2: charged %g s, expected %g", d, 32 * want);
    b.parallel.reduce_dtype = QT_DT_BF16;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    QT_EXPECT(fabs(d - 16 * want) < 1e-9 * want, "host bf16 sums, zero 2: charged %g s, expected %g", d, 16 * want);
    /* 4 ZeRO ranks (peer): the offloaded gradient shard (numel / 4 fp32) brought up and written back by each
     * of the 32 micro-steps' adds (8 B; the first's only written back: -4 B) and read once by the norm and AdamW
     * (8 B; its clearing is a mark); ZeRO-3's offloaded
     * pieces: the gathers are ZeRO-3's charge already, the embedding and LM head once, AdamW's writes and
     * the count's reads of the rank's pieces (2 x 2 B x numel / 4) */
    a.parallel.zero = 2, a.parallel.reduce_dtype = QT_DT_F32;
    b = a, b.memory.offload = QT_OFF_GRADIENTS;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    want = (double)L.numel / 4 * (8 * 32 + 4) / 25e9;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "zero 2 x 4, offloaded gradient shard charged %g s, expected %g", d, want);
    a.parallel.zero = 3;
    b = a, b.memory.offload = QT_OFF_WEIGHTS;
    d = qt_plan_auto_cost(&L, &b, &pr) - qt_plan_auto_cost(&L, &a, &pr);
    want = (((double)L.numel - span) * 2 + (double)L.numel / 4 * 4) / 25e9;
    QT_EXPECT(fabs(d - want) < 1e-9 * want, "zero 3 x 4, offloaded pieces charged %g s, expected %g", d, want);
    qt_layout_free(&L);
}

/* ---- GPU ---- */

typedef struct {
    atomic_int stop;
    size_t base, peak; /* used bytes: baseline after context creation, peak since */
    int dev;
} sampler;

static size_t used_now(void) {
    size_t f, t;
    cudaMemGetInfo(&f, &t);
    return t - f;
}

static void *sample_loop(void *arg) {
    sampler *s = arg;
    cudaSetDevice(s->dev);
    while (!atomic_load(&s->stop)) {
        size_t u = used_now();
        if (u > s->peak) s->peak = u;
        usleep(200);
    }
    return NULL;
}

/* A model big enough that the plan dwarfs the sampling noise (~0.4 GiB of arena). */
static const char MID[] =
    "model: {vocab_size: 32000, hidden_size: 1024, num_layers: 6, num_heads: 8, num_kv_heads: 2,\n"
    "        intermediate_size: 2816, max_seq_len: 512, qkv_bias: true, tie_embeddings: false}\n"
    "data: {train: 'none_*.bin', seq_len: 512, micro_batch: 4, grad_accum: 2}\n"
    "init: {seed: 3, std: 0.02}\ndevice: cuda\n";

#define MARGIN_BYTES ((size_t)256 << 20) /* the plan's runtime reserve is an estimate: measured within this */

/* Steps under memory.gpu_limit_gib (the plan's total + 0.5 GiB, rounded up to 0.25 GiB: --plan cannot
 * know cuDNN's own attention workspace, the engine measures it) with a sampler thread:
 * peak device use (less the baseline after context creation) <= the cap, and within MARGIN_BYTES + 5%
 * of the plan's device total; then a cap below the plan is refused with its message. */
static void test_gpu_limit(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    qt_config c;
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    char err[2048];
    QT_REQUIRE(load_cfg(&c, MID, NULL) == 0, "config");
    QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_plan_run(&L, &c, 1, 0, &rp, err, sizeof err) == 0, "%s", err);
    double cap = ceil((rp.gpu_bytes + ((size_t)512 << 20)) / (1073741824.0 / 4)) / 4; /* + cuDNN's own workspace */
    c.memory.gpu_limit_gib = (float)cap;
    QT_CUDA(cudaSetDevice(0));
    QT_CUDA(cudaFree(0)); /* the context: not counted */
    sampler s = {.dev = 0};
    s.base = used_now();
    s.peak = s.base;
    pthread_t th;
    QT_REQUIRE(pthread_create(&th, NULL, sample_loop, &s) == 0, "thread");
    qt_engine *e = qt_engine_create(&L, &c, &src, err, sizeof err);
    QT_REQUIRE(e, "%s", err);
    long N = 4 * 512;
    int32_t *in = malloc(N * 4), *tgt = malloc(N * 4);
    for (long i = 0; i < N; i++) in[i] = (int32_t)((i * 7919) % 32000), tgt[i] = (int32_t)((i * 104729 + 1) % 32000);
    for (int step = 1; step <= 3; step++) {
        float loss, gn;
        for (int m = 0; m < 2; m++)
            QT_REQUIRE(qt_engine_micro_step(e, in, tgt, 1.0f / (2 * N), err, sizeof err) == 0, "%s", err);
        QT_REQUIRE(qt_engine_opt_step(e, 1e-4f, step, &loss, &gn, err, sizeof err) == 0, "%s", err);
    }
    QT_CUDA(cudaDeviceSynchronize());
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    size_t peak = s.peak - s.base, plan = rp.gpu_bytes;
    printf("  plan %.1f MiB (cap %.2f GiB), measured peak %.1f MiB over the context's %.1f MiB\n", plan / 1048576.0, cap,
           peak / 1048576.0, s.base / 1048576.0);
    QT_EXPECT(peak <= qt_mem_gib(cap), "peak %.1f MiB over the cap %.2f GiB", peak / 1048576.0, cap);
    /* The plan holds a fixed runtime reserve (kernel modules, library handles, graphs) that a small model
     * leaves mostly unused (H100, this test: peak 3034 MiB, plan 3520 MiB with the 512 MiB reserve), so the
     * plan may exceed the peak by up to that reserve; it must never fall short of it. */
    QT_EXPECT(peak <= plan + MARGIN_BYTES && plan - (peak < plan ? peak : plan) <= QT_GPU_RUNTIME_RESERVE + MARGIN_BYTES + 0.05 * plan,
              "peak %.1f MiB vs plan %.1f MiB (with a %zu MiB runtime reserve)", peak / 1048576.0, plan / 1048576.0,
              QT_GPU_RUNTIME_RESERVE >> 20);
    qt_engine_free(e);
    free(in);
    free(tgt);
    c.memory.gpu_limit_gib = (float)(rp.gpu_bytes / 1073741824.0 * 0.8);
    e = qt_engine_create(&L, &c, &src, err, sizeof err);
    QT_EXPECT(!e && strstr(err, "GPU memory plan needs") && strstr(err, "memory.gpu_limit_gib =") &&
                  strstr(err, "CUDA context not counted") && strstr(err, "biggest items:"),
              "a cap below the plan: %s", e ? "accepted" : err);
    qt_engine_free(e);
    qt_layout_free(&L);
}

/* The rows the planner makes without a GPU (qtrain --plan) equal what qt_gpu_model_create carves and
 * pins: every arena row, the arena total and the offloaded state. */
static void test_plan_equals_allocation(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    for (int off = 0; off < 2; off++) {
        qt_config c;
        qt_layout L;
        qt_weight_src src;
        static qt_run_plan rp;
        char err[2048];
        QT_REQUIRE(load_cfg(&c, MID, off ? "memory: {offload_optimizer: true, recompute: [ffn, norm]}\n" : NULL) == 0, "config");
        QT_REQUIRE(qt_model_layout(&c, &L, &src, err, sizeof err) == 0, "%s", err);
        QT_REQUIRE(qt_plan_run(&L, &c, -1, 0, &rp, err, sizeof err) == 0, "%s", err);
        qt_plan sp;
        qt_shard sh;
        QT_REQUIRE(qt_plan_resolve(&c, &L, 0, &sp, err, sizeof err) == 0, "%s", err);
        qt_shard_init(&sh, &L, 1, 0, sp.optimizer.host);
        QT_CUDA(cudaSetDevice(0));
        qt_gpu_model *g = qt_gpu_model_create(&L, &sp, &src, &sh, err, sizeof err);
        QT_REQUIRE(g, "%s", err);
        QT_EXPECT(g->plan.off == rp.mem.off, "offload %d: arena %zu, planned %zu", off, g->plan.off, rp.mem.off);
        for (int i = 0; i < g->plan.n; i++) {
            const qt_mem_row *r = &g->plan.row[i];
            if (r->where == QT_MEM_ARENA || r->where == QT_MEM_PINNED)
                QT_EXPECT(row(&rp.mem, r->where, r->kind) == r->bytes, "offload %d: %s: allocated %zu, planned %zu", off,
                          r->kind, r->bytes, row(&rp.mem, r->where, r->kind));
        }
        QT_EXPECT(!off || g->ps->host_opt.host_state_bytes == row(&rp.mem, QT_MEM_PINNED, "offloaded optimizer state"),
                  "offloaded state %zu", g->ps->host_opt.host_state_bytes);
        printf("  offload %d: arena %.1f MiB, attention workspace %.1f MiB measured\n", off, g->plan.off / 1048576.0,
               g->attn_ws / 1048576.0);
        qt_gpu_model_free(g);
        qt_layout_free(&L);
    }
}

/* The planner's attention workspace without a GPU (qt_attention_bwd_est_ws) against what cuDNN's plans ask
 * for, at the shapes of the shipped configs (0.5B, 7B, 14B, 32B heads) and the micro-batches auto picks
 * from, with the deterministic backward (perf.deterministic, the default) and without: never below the
 * backward's measured workspace (a plan auto picks must fit when the model measures it), at most 2x it, and
 * the forward's at the same B printed (the model reserves the larger). */
static void test_attention_ws_estimate(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    QT_CUDA(cudaSetDevice(0));
    const int heads[][2] = {{14, 2}, {28, 4}, {40, 8}};
    for (int det = 0; det < 2; det++) {
        qt_attention_ctx *a = qt_attention_create();
        qt_attention_set_deterministic(a, det);
        for (int h = 0; h < 3; h++)
            for (int B = 1; B <= 64; B *= 2) {
                int H = heads[h][0], Hkv = heads[h][1], T = 1024, D = 128;
                size_t est = qt_attention_bwd_est_ws(B, T, H, D, det), bwd = qt_attention_ws_bytes(a, B, T, H, Hkv, D, 0, 1);
                size_t fwd = qt_attention_ws_bytes(a, B, T, H, Hkv, D, 0, 0);
                printf("  det %d H %2d Hkv %d B %2d: backward %8.1f MiB measured, %8.1f estimated; forward %8.1f MiB\n", det,
                       H, Hkv, B, bwd / 1048576.0, est / 1048576.0, fwd / 1048576.0);
                QT_EXPECT(bwd > 0 && est >= bwd && est <= 2 * bwd, "det %d H %d B %d: backward workspace %zu measured, %zu "
                          "estimated", det, H, B, bwd, est);
            }
        qt_attention_free(a);
    }
}

/* An H200's rates for the measured runs below: the copy rates an H200's probe prints, the bf16 matmul rate
 * of train_bench's random-data ceilings (the probe then multiplied zeros: 810) */
static const qt_probe H200_RATES = {"H200 (bf16: random-data ceiling)", 690e12, QT_PROBE_FP8_RATIO * 690e12, 4110e9, 55.3e9,
                                    (size_t)140 << 30, 0};

/* The cost model's tokens/s (all ranks') for `path` with the --set keys set[0..) (NULL-ended, at most cap) on pr;
 * *c gets the config. -1 when the config or the layout fails (err). */
static double predicted(const char *path, const char *const *set, int cap, const qt_probe *pr, qt_config *c, char *err,
                        size_t errlen) {
    /* The micro-batch and memory keys of the plan each shipped config ran when these rows were measured (the
     * configs leave them to memory.plan: auto): set first, so that a row's own keys override them. */
    static const struct { const char *path, *set[6]; } measured_plan[] = {
        {"configs/qwen2.5-0.5b-bf16.yaml", {"data.micro_batch=32", "data.grad_accum=16", "memory.lmhead_chunks=4"}},
        {"configs/qwen2.5-0.5b-fp8.yaml", {"data.micro_batch=32", "data.grad_accum=16", "memory.lmhead_chunks=4"}},
        {"configs/qwen2.5-1.5b-fp8.yaml", {"data.micro_batch=16", "data.grad_accum=32", "memory.lmhead_chunks=1"}},
        {"configs/qwen2.5-3b-bf16.yaml",
         {"data.micro_batch=16", "data.grad_accum=32", "memory.lmhead_chunks=1", "memory.offload_optimizer=true"}},
        {"configs/qwen2.5-7b-fp8.yaml", {"data.micro_batch=8", "data.grad_accum=64", "memory.lmhead_chunks=4",
                                         "memory.offload_optimizer=true", "memory.recompute=[ffn,norm]"}},
        {"configs/qwen2.5-14b-fp8.yaml", {"data.micro_batch=4", "data.grad_accum=128", "memory.lmhead_chunks=4",
                                          "memory.offload_optimizer=true", "memory.recompute=[ffn,norm]",
                                          "memory.fp8_weight_cache=none"}},
    };
    const char *all[32];
    int n = 0;
    for (size_t i = 0; i < sizeof measured_plan / sizeof *measured_plan; i++)
        for (int j = 0; !strcmp(measured_plan[i].path, path) && j < 6 && measured_plan[i].set[j]; j++) all[n++] = measured_plan[i].set[j];
    for (int i = 0; i < cap && set[i] && n < 32; i++) all[n++] = set[i];
    qt_layout L;
    qt_weight_src src;
    if (qt_config_load(c, path, all, n, err, errlen) || qt_model_layout(c, &L, &src, err, errlen)) return -1;
    int ranks = c->parallel.devices.n ? c->parallel.devices.n : c->parallel.gpus > 0 ? c->parallel.gpus : 1;
    double tok = (double)c->data.micro_batch * c->data.grad_accum * c->data.seq_len * ranks, pred = tok / qt_plan_auto_cost(&L, c, pr);
    qt_layout_free(&L);
    return pred;
}

/* The cost model against measured runs (bench/RESULTS.md): the H100 rows at LLM.Q's setting with the
 * default probe (an H100's figures), and section 7's H200 runs held to 24/16/12 GiB with that H200's probe;
 * every prediction within 15% (issue 25's bound; the fit: QT_PROBE_FP8_RATIO, QT_PLAN_ELEM_PASSES(_FP8), QT_PLAN_ELEM_BPS,
 * QT_PLAN_OVERLAP_ALPHA, QT_PLAN_DUPLEX). The H200 rows' matmul rate is train_bench's random-data ceiling. */
static void test_cost_calibration(void) {
#define OPT16 "precision.opt_m_dtype=bf16", "precision.opt_v_dtype=bf16", "parallel.gpus=1"
#define AUTO24 "perf.cuda_graphs=false", "parallel.gpus=1", "memory.fp8_weight_cache=none", "memory.recompute=[block]"
    static const struct {
        const char *path, *set[12];
        int h200;
        double measured;
    } rows[] = {
        {"configs/qwen2.5-0.5b-bf16.yaml", {OPT16}, 0, 151558},
        {"configs/qwen2.5-0.5b-fp8.yaml", {OPT16}, 0, 172635},
        {"configs/qwen2.5-1.5b-fp8.yaml", {OPT16, "precision.matmul_dtype=bf16", "precision.grad_dtype=bf16"}, 0, 57678},
        {"configs/qwen2.5-1.5b-fp8.yaml", {OPT16}, 0, 73831},
        {"configs/qwen2.5-3b-bf16.yaml", {OPT16}, 0, 29655},
        {"configs/qwen2.5-7b-fp8.yaml", {OPT16, "memory.recompute=[ffn,norm]", "memory.offload_residual=true",
                                         "data.micro_batch=16", "data.grad_accum=32"}, 0, 17536},
        {"configs/qwen2.5-14b-fp8.yaml", {"parallel.gpus=1"}, 0, 8608},
        {"configs/qwen2.5-7b-fp8.yaml", {AUTO24, "memory.offload=[weights,gradients,master,m,v,residual]",
                                         "data.micro_batch=32", "data.grad_accum=16", "memory.lmhead_chunks=16",
                                         "memory.attn_bwd_chunks=2"}, 1, 13421},
        {"configs/qwen2.5-7b-fp8.yaml", {AUTO24, "memory.offload=[weights,master,m,v,residual]", "precision.master_dtype=bf16",
                                         "precision.grad_accum_dtype=bf16", "data.micro_batch=8", "data.grad_accum=64",
                                         "memory.lmhead_chunks=8", "memory.attn_bwd_chunks=2"}, 1, 13376},
        {"configs/qwen2.5-7b-fp8.yaml", {AUTO24, "memory.offload=[weights,gradients,master,m,v,residual]",
                                         "data.micro_batch=8", "data.grad_accum=8", "memory.lmhead_chunks=2"}, 1, 3453},
        {"configs/qwen2.5-7b-fp8.yaml", {AUTO24, "memory.offload=[weights,gradients,master,m,v,residual]",
                                         "precision.master_dtype=bf16", "data.micro_batch=1", "data.grad_accum=16",
                                         "memory.lmhead_chunks=16"}, 1, 533},
        {"configs/qwen2.5-14b-fp8.yaml", {AUTO24, "memory.offload=[weights,gradients,master,m,v,residual]",
                                          "precision.master_dtype=fp32", "precision.grad_accum_dtype=fp32", "data.micro_batch=16",
                                          "data.grad_accum=4", "memory.lmhead_chunks=2"}, 1, 2683},
    };
#undef OPT16
#undef AUTO24
    const qt_probe h100 = qt_probe_default();
    double worst = 0;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        qt_config c;
        char err[2048];
        double pred = predicted(rows[i].path, rows[i].set, 12, rows[i].h200 ? &H200_RATES : &h100, &c, err, sizeof err);
        QT_REQUIRE(pred > 0, "%s: %s", rows[i].path, err);
        double e = pred / rows[i].measured - 1;
        printf("  %-34s %-4s mb %2d x %3d: predicted %6.0f, measured %6.0f tokens/s (%+.1f%%)\n", rows[i].path + 8,
               rows[i].h200 ? "H200" : "H100", c.data.micro_batch, c.data.grad_accum, pred, rows[i].measured, 100 * e);
        worst = fabs(e) > worst ? fabs(e) : worst;
    }
    QT_EXPECT(worst <= 0.15, "a prediction %.2f%% off its measurement", 100 * worst);
}

/* A measured run: its config, --set keys (NULL-ended) and tokens/s. */
typedef struct {
    const char *tag, *path, *set[16];
    double measured;
} cost_row;

/* Each row predicted with an H200's rates and printed beside its measurement; every one within 15% (issue 25).
 * pred (may be NULL): the predictions, in row order. */
static void check_rows(const cost_row *rows, size_t n, double *pred_out) {
    char bad[256] = "";
    for (size_t i = 0; i < n; i++) {
        qt_config c;
        char err[2048];
        double pred = predicted(rows[i].path, rows[i].set, 16, &H200_RATES, &c, err, sizeof err);
        QT_REQUIRE(pred > 0, "%s: %s", rows[i].tag, err);
        if (pred_out) pred_out[i] = pred;
        double e = pred / rows[i].measured - 1;
        printf("  %-28s predicted %6.0f, measured %6.0f tokens/s (%+.1f%%)\n", rows[i].tag, pred, rows[i].measured, 100 * e);
        if (fabs(e) > 0.15) snprintf(bad, sizeof bad, "%s: %+.1f%%", rows[i].tag, 100 * e);
    }
    QT_EXPECT(!bad[0], "a prediction more than 15%% off: %s", bad);
}

/* Issue 25's grid, measured on an H200, after the fit above:
 * 1.5B fp8 on 128 sequences per step and 7B fp8 on 64 (one GPU, no cap), auto's and the config's plans at
 * 80 GiB, auto's plans at 24 GiB (7B with bf16 gradients, 14B with bf16 master and gradients), each
 * predicted with an H200's rates (the matmul rate of train_bench's random-data ceilings): within 15% (issue 25).
 * Not held out: before QT_PLAN_ELEM_BPS and QT_PLAN_DUPLEX, which were chosen on these rows, the 1.5B rows
 * were 15-33% over and the 7B rows 14-22% under. */
static void test_cost_grid(void) {
#define G15 "parallel.gpus=1", "data.grad_accum=8"
#define G7 "parallel.gpus=1", "perf.cuda_graphs=false"
#define CAP "perf.cuda_graphs=false", "parallel.gpus=1", "memory.fp8_weight_cache=none", "memory.recompute=[block]"
    static const cost_row rows[] = {
        {"1.5b none mb16", "configs/qwen2.5-1.5b-fp8.yaml", {G15, "data.micro_batch=16", "memory.recompute=[]"}, 74819},
        {"1.5b ffn+norm mb16", "configs/qwen2.5-1.5b-fp8.yaml", {G15, "data.micro_batch=16", "memory.recompute=[ffn,norm]"}, 64872},
        {"1.5b block mb16", "configs/qwen2.5-1.5b-fp8.yaml", {G15, "data.micro_batch=16", "memory.recompute=[block]"}, 61977},
        {"1.5b none opt-off mb16", "configs/qwen2.5-1.5b-fp8.yaml",
         {G15, "data.micro_batch=16", "memory.recompute=[]", "memory.offload_optimizer=true"}, 62846},
        {"1.5b block+res mb32", "configs/qwen2.5-1.5b-fp8.yaml",
         {G15, "data.micro_batch=32", "data.grad_accum=4", "memory.recompute=[block]", "memory.offload_residual=true"}, 62485},
        {"1.5b none mb8", "configs/qwen2.5-1.5b-fp8.yaml", {G15, "data.micro_batch=8", "data.grad_accum=16", "memory.recompute=[]"},
         72591},
        {"7b ffn+norm opt-off mb8", "configs/qwen2.5-7b-fp8.yaml",
         {G7, "data.micro_batch=8", "data.grad_accum=8", "memory.recompute=[ffn,norm]"}, 12125},
        {"7b block+res mb16", "configs/qwen2.5-7b-fp8.yaml",
         {G7, "data.micro_batch=16", "data.grad_accum=4", "memory.recompute=[block]", "memory.offload_residual=true"}, 12051},
        {"7b 80 GiB auto", "configs/qwen2.5-7b-fp8.yaml",
         {"parallel.gpus=1", "perf.cuda_graphs=false", "data.micro_batch=4", "data.grad_accum=128", "memory.recompute=[]",
          "memory.fp8_weight_cache=all", "memory.lmhead_chunks=1"}, 19124},
        {"7b 80 GiB config", "configs/qwen2.5-7b-fp8.yaml", {"parallel.gpus=1"}, 17103},
        {"7b 24 GiB auto bf16 grads", "configs/qwen2.5-7b-fp8.yaml",
         {CAP, "memory.offload=[weights,gradients,master,m,v,residual]", "precision.grad_accum_dtype=bf16", "data.micro_batch=32",
          "data.grad_accum=16", "memory.lmhead_chunks=4"}, 15830},
        {"14b 24 GiB auto bf16 master", "configs/qwen2.5-14b-fp8.yaml",
         {CAP, "memory.offload=[weights,gradients,m,v]", "data.micro_batch=16", "data.grad_accum=32", "memory.lmhead_chunks=16",
          "memory.attn_bwd_chunks=2"}, 7463},
    };
#undef G15
#undef G7
#undef CAP
    check_rows(rows, sizeof rows / sizeof *rows, NULL);
}

/* Held out: plans none of the constants were chosen on, measured after they were fixed (one
 * H200 each, beside other runs on the host's other GPUs; gpu-check.sh grid2, auto_vs_hand, avh_bf16,
 * h100_14b_*; docs/memory-planning.md), predicted as above: within 15% (issue 25). Not here: the
 * 4-GPU box runs (host bandwidth shared by four GPUs is not modelled; RESULTS section 9 says by how much). */
/* The LM head's chunks (QT_PLAN_LM_ROWS): two 7B fp8 plans at LLM.Q's setting, alternated in one call on an H200
 * (bench/RESULTS.md, one GPU at LLM.Q's setting): auto's pick without the chunk cost (the LM head in 16 chunks of 512 rows, whose
 * wgrads read and write the [V, C] gradient 1,024 times a step) runs 3.2% below auto's pick with it. Both within
 * 15%, and the measured faster plan predicted faster. */
static void test_cost_lm_chunks(void) {
#define L7 "parallel.gpus=1", "precision.opt_m_dtype=bf16", "precision.opt_v_dtype=bf16", "data.micro_batch=8", \
           "data.grad_accum=64", "memory.offload_optimizer=false"
    static const cost_row rows[] = {
        {"7b fp8 none lm1", "configs/qwen2.5-7b-fp8.yaml", {L7, "memory.recompute=[]", "memory.fp8_weight_cache=none",
         "memory.lmhead_chunks=1", "memory.attn_bwd_chunks=1"}, 21090},
        {"7b fp8 swiglu+norm res lm16", "configs/qwen2.5-7b-fp8.yaml", {L7, "memory.recompute=[swiglu,norm]",
         "memory.offload_residual=true", "memory.fp8_weight_cache=all", "memory.lmhead_chunks=16",
         "memory.attn_bwd_chunks=4"}, 20430},
    };
#undef L7
    double p[2];
    check_rows(rows, 2, p);
    QT_EXPECT(p[0] > p[1], "the measured faster plan predicted at %.0f tokens/s, the slower at %.0f", p[0], p[1]);
}

static void test_cost_held_out(void) {
#define G3 "parallel.gpus=1", "data.grad_accum=8"
#define G7 "parallel.gpus=1", "perf.cuda_graphs=false"
#define CAP16 "perf.cuda_graphs=false", "parallel.gpus=1", "memory.fp8_weight_cache=none", "memory.recompute=[block]", \
              "memory.gpu_limit_gib=16", "data.micro_batch=8", "data.grad_accum=8"
#define CAP79 "perf.cuda_graphs=false", "parallel.gpus=1", "memory.fp8_weight_cache=none", "memory.recompute=[block]", \
              "memory.gpu_limit_gib=79", "memory.offload=[weights,m,v,residual]", "precision.master_dtype=bf16", \
              "precision.grad_accum_dtype=fp32"
#define LQ "perf.cuda_graphs=false", "parallel.gpus=1", "memory.gpu_limit_gib=79", "memory.offload_optimizer=true", \
           "precision.master_dtype=bf16", "precision.grad_accum_dtype=bf16", "precision.opt_m_dtype=bf16", \
           "precision.opt_v_dtype=bf16"
    static const cost_row rows[] = {
        {"3b bf16 none opt-off mb8", "configs/qwen2.5-3b-bf16.yaml",
         {G3, "data.micro_batch=8", "memory.recompute=[]", "memory.offload_optimizer=true"}, 22466},
        {"3b bf16 swiglu+norm mb16", "configs/qwen2.5-3b-bf16.yaml",
         {G3, "data.micro_batch=16", "memory.recompute=[swiglu,norm]", "memory.offload_optimizer=false"}, 29411},
        {"3b bf16 block lm4 mb32", "configs/qwen2.5-3b-bf16.yaml",
         {G3, "data.micro_batch=32", "data.grad_accum=4", "memory.recompute=[block]", "memory.lmhead_chunks=4"}, 21664},
        {"7b ffn+norm mb16", "configs/qwen2.5-7b-fp8.yaml",
         {G7, "data.micro_batch=16", "data.grad_accum=16", "memory.recompute=[ffn,norm]"}, 16398},
        {"7b qkv+att+ffn+norm mb4", "configs/qwen2.5-7b-fp8.yaml",
         {G7, "data.micro_batch=4", "data.grad_accum=32", "memory.recompute=[qkv,att,ffn,norm]"}, 13787},
        {"7b 16 GiB auto", "configs/qwen2.5-7b-fp8.yaml",
         {CAP16, "memory.offload=[weights,gradients,master,m,v,residual]", "memory.lmhead_chunks=2"}, 3512},
        {"7b 16 GiB hand bf16 master", "configs/qwen2.5-7b-fp8.yaml",
         {CAP16, "memory.offload=[weights,gradients,master,m,v,residual]", "precision.master_dtype=bf16",
          "precision.grad_accum_dtype=bf16", "memory.lmhead_chunks=4"}, 6172},
        {"7b 16 GiB auto bf16 master", "configs/qwen2.5-7b-fp8.yaml",
         {CAP16, "memory.offload=[weights,gradients,master,m,v,residual]", "precision.master_dtype=bf16",
          "precision.grad_accum_dtype=bf16", "data.micro_batch=16", "data.grad_accum=4", "memory.lmhead_chunks=4"}, 8348},
        {"14b fp8 79 GiB auto", "configs/qwen2.5-14b-fp8.yaml",
         {CAP79, "data.micro_batch=32", "data.grad_accum=16", "memory.lmhead_chunks=2"}, 8024},
        {"14b bf16 79 GiB auto", "configs/qwen2.5-14b-fp8.yaml",
         {CAP79, "precision.matmul_dtype=bf16", "precision.grad_dtype=bf16", "data.micro_batch=64", "data.grad_accum=8",
          "memory.lmhead_chunks=16", "memory.attn_bwd_chunks=2"}, 5512},
        /* LLM.Q's precision at 79 GiB, the fp8 recompute's fused SwiGLU quantize */
        {"7b fp8 79 GiB llmq", "configs/qwen2.5-7b-fp8.yaml", {LQ, "data.micro_batch=8", "data.grad_accum=64",
         "memory.recompute=[]", "memory.fp8_weight_cache=all", "memory.lmhead_chunks=1"}, 20858},
        {"7b bf16 79 GiB llmq", "configs/qwen2.5-7b-fp8.yaml", {LQ, "precision.matmul_dtype=bf16", "precision.grad_dtype=bf16",
         "data.micro_batch=16", "data.grad_accum=32", "memory.recompute=[swiglu,norm]", "memory.fp8_weight_cache=all",
         "memory.lmhead_chunks=4"}, 13656},
        {"14b fp8 79 GiB llmq", "configs/qwen2.5-14b-fp8.yaml", {LQ, "data.micro_batch=4", "data.grad_accum=128",
         "memory.recompute=[swiglu,norm]", "memory.offload_residual=true", "memory.lmhead_chunks=1"}, 9972},
        {"14b bf16 79 GiB llmq", "configs/qwen2.5-14b-fp8.yaml", {LQ, "precision.matmul_dtype=bf16", "precision.grad_dtype=bf16",
         "data.micro_batch=4", "data.grad_accum=128", "memory.recompute=[swiglu,norm]", "memory.lmhead_chunks=1"}, 6772},
        /* 7B fp8 at micro-batch 8 with and without [swiglu, norm] (the fused SwiGLU
         * backward), 16 micro-steps, the mean of two runs each; 14B at LLM.Q's precision again */
        {"7b fp8 79 GiB mb8 ga16 none", "configs/qwen2.5-7b-fp8.yaml", {LQ, "data.micro_batch=8", "data.grad_accum=16",
         "memory.recompute=[]", "memory.fp8_weight_cache=all"}, 19697},
        {"7b fp8 79 GiB mb8 ga16 swiglu+norm", "configs/qwen2.5-7b-fp8.yaml", {LQ, "data.micro_batch=8", "data.grad_accum=16",
         "memory.recompute=[swiglu,norm]", "memory.fp8_weight_cache=all"}, 19809},
        {"14b fp8 79 GiB llmq s22", "configs/qwen2.5-14b-fp8.yaml", {LQ, "data.micro_batch=4", "data.grad_accum=128",
         "memory.recompute=[swiglu,norm]", "memory.offload_residual=true", "memory.lmhead_chunks=1"}, 10169},
    };
#undef G3
#undef G7
#undef CAP16
#undef CAP79
#undef LQ
    check_rows(rows, sizeof rows / sizeof *rows, NULL);
}

/* The emulated 4-card box (4 x H200 held to 24 GiB each, parallel.comm host, ZeRO-3; bench/RESULTS.md
 * section 6), predicted with an H200's rates: 7B without offloaded shards, whose gathers and sums overlap
 * its compute more than the model's serial charge says (-13.5%). Within 15%. Not here: the box runs with
 * offloaded shards (sections 8, 9, 13: with LLM.Q's precision the run's own probe predicts 14B +16.3% and
 * 32B +20.5%, 7B -10.8%): four GPUs share the host's bandwidth, which the model does not charge. */
static void test_cost_box(void) {
    static const cost_row rows[] = {
        {"7b box", "configs/qwen2.5-7b-fp8.yaml",
         {"parallel.gpus=4", "parallel.comm=host", "perf.cuda_graphs=false", "memory.fp8_weight_cache=none",
          "memory.recompute=[block]", "parallel.zero=3", "data.micro_batch=8", "data.grad_accum=16",
          "memory.offload=[master,m,v,residual]", "memory.lmhead_chunks=4"}, 24682},
    };
    check_rows(rows, sizeof rows / sizeof *rows, NULL);
}

int main(void) {
    QT_RUN(test_weight_src_ranges);
    QT_RUN(test_host_plan_sums);
    QT_RUN(test_host_limit_refused);
    QT_RUN(test_cpu_alloc_matches_plan);
    QT_RUN(test_auto_choice);
    QT_RUN(test_gpu_budget_free);
    QT_RUN(test_auto_axes);
    QT_RUN(test_auto_lossy_hint);
    QT_RUN(test_auto_offload_only_faster);
    QT_RUN(test_auto_axes_cost);
    QT_RUN(test_cost_calibration);
    QT_RUN(test_cost_grid);
    QT_RUN(test_cost_held_out);
    QT_RUN(test_cost_lm_chunks);
    QT_RUN(test_cost_box);
    QT_RUN(test_gpu_limit);
    QT_RUN(test_plan_equals_allocation);
    QT_RUN(test_attention_ws_estimate);
    return qt_test_end();
}
