/* test_stores.c — the host side of the GPU trainer's structure, without a GPU: the memory plan's rows
 * (each store's, summing to the allocation), the plan resolved from a config, and the
 * parallel.devices key. */
#include <stdlib.h>
#include <string.h>

#include "qt_act_store.h"
#include "qt_config.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_gpu_optim.h"
#include "qt_partition.h"
#include "qt_mem_plan.h"
#include "qt_param_store.h"
#include "qt_plan.h"
#include "qt_test.h"
#include "qt_test_plan.h"

static size_t al(size_t b) { return (b + 255) / 256 * 256; }

static size_t row(const qt_mem_plan *p, const char *kind) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->row[i].kind, kind)) return p->row[i].bytes;
    return 0;
}

/* The plan's pinned host rows: how many, and the i-th (NULL past the end). */
static int n_pinned(const qt_mem_plan *p) {
    int n = 0;
    for (int i = 0; i < p->n; i++) n += p->row[i].where == QT_MEM_PINNED;
    return n;
}

static const qt_mem_row *pinned(const qt_mem_plan *p, int k) {
    for (int i = 0; i < p->n; i++)
        if (p->row[i].where == QT_MEM_PINNED && k-- == 0) return &p->row[i];
    return NULL;
}

static size_t rows_sum(const qt_mem_plan *p) {
    size_t s = 0;
    for (int i = 0; i < p->n; i++) s += p->row[i].where == QT_MEM_ARENA ? p->row[i].bytes : 0;
    return s;
}

/* A small Qwen2-shaped layout with an odd width (C = 96: rows are not multiples of 256 bytes), its units padded for
 * 2 ranks (a layout one GPU runs as well). */
static void small_layout(qt_layout *L, int tie) {
    qt_model_cfg c = {.vocab_size = 300, .hidden_size = 96, .num_layers = 3, .num_heads = 3, .num_kv_heads = 1,
                      .head_dim = 32, .intermediate_size = 160, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                      .tie_embeddings = tie, .qkv_bias = 1, .max_seq_len = 64};
    qt_model_cfg_finish(&c);
    char err[256];
    QT_REQUIRE(qt_layout_init_units(L, &c, 2 * QT_LAYOUT_ALIGN, err, sizeof err) == 0, "%s", err);
}

/* Carving: sizes align to 256, rows of one kind merge, the second pass hands out the addresses the
 * sizing pass counted, in order. */
static void test_mem_plan(void) {
    qt_mem_plan p;
    const char *k[4] = {"a", "b", "a", "c"};
    size_t b[4] = {1, 300, 256, 0};
    void *at[4];
    qt_mem_plan_begin(&p, NULL);
    for (int i = 0; i < 4; i++) QT_EXPECT(qt_mem_plan_carve(&p, k[i], b[i]) == NULL, "sizing pass gave an address");
    size_t total = p.off;
    QT_EXPECT(total == 256 + 512 + 256 + 0, "total %zu", total);
    QT_EXPECT(p.n == 3 && row(&p, "a") == 512 && row(&p, "b") == 512 && row(&p, "c") == 0, "rows %d", p.n);
    char *base = (char *)0x100000;
    qt_mem_plan_begin(&p, base);
    for (int i = 0; i < 4; i++) at[i] = qt_mem_plan_carve(&p, k[i], b[i]);
    QT_EXPECT(at[0] == base && at[1] == base + 256 && at[2] == base + 768 && at[3] == base + 1024 && p.off == total,
              "addresses %p %p %p %p", at[0], at[1], at[2], at[3]);
    qt_mem_plan_host(&p, "h", 123);
    qt_mem_plan_add(&p, QT_MEM_PAGEABLE, "h", 7);
    qt_mem_plan_add(&p, QT_MEM_DEVICE, "ws", 1000);
    QT_EXPECT(p.n == 6 && row(&p, "h") == 123 && p.off == total, "host rows");
    QT_EXPECT(qt_mem_plan_device_total(&p) == total + 1000 && qt_mem_plan_host_total(&p) == 130, "totals %zu %zu",
              qt_mem_plan_device_total(&p), qt_mem_plan_host_total(&p));
    char err[512];
    QT_EXPECT(qt_mem_plan_check(&p, 0, total + 1000, "cap", err, sizeof err) == 0, "device total at the limit fits");
    QT_EXPECT(qt_mem_plan_check(&p, 0, total + 999, "memory.gpu_limit_gib = 1", err, sizeof err) == -1 &&
                  strstr(err, "needs 0.0 MiB (the CUDA context not counted) but memory.gpu_limit_gib = 1 allows") &&
                  strstr(err, "biggest items: ws 0.0 MiB (GPU), a 0.0 MiB (GPU arena), b 0.0 MiB (GPU arena)"),
              "device refusal: %s", err);
    QT_EXPECT(qt_mem_plan_check(&p, 1, 129, "MemAvailable", err, sizeof err) == -1 && strstr(err, "host memory plan") &&
                  strstr(err, "h 0.0 MiB (pinned host), h 0.0 MiB (host)"),
              "host refusal: %s", err);
}

/* The parameter store's rows for each placement: weights, gradients, master/m/v or the offload slots,
 * the scalars, the bf16 comm buffer (the largest bucket) and the load staging; they sum to its bytes. */
static void test_param_store_rows(void) {
    qt_layout L;
    small_layout(&L, 0);
    qt_config cfg;
    qt_config_defaults(&cfg);
    cfg.precision.opt_v_dtype = QT_DT_BF16;
    char err[256];
    for (int k = 0; k < 3; k++) { /* one GPU; 2 ranks sharded with bf16 sums; 2 ranks replicated */
        int n = k ? 2 : 1;
        qt_shard sh;
        qt_shard_init(&sh, &L, k == 1 ? n : 1, k == 1 ? 1 : 0, k > 0);
        qt_plan pl = {.parallel.zero = k == 1, .grads.reduce_bf16 = k == 1, .optimizer.chunk = QT_GPU_OPTIM_CHUNK}, tp;
        qt_param_store *ps = qt_param_store_create(&L, qt_t_placed(&tp, &cfg, &L, &pl), &sh, err, sizeof err);
        QT_REQUIRE(ps, "%s", err);
        qt_mem_plan p;
        qt_mem_plan_begin(&p, NULL);
        qt_param_store_carve(ps, &p);
        size_t big = 0;
        for (int b = 0; b < sh.n_buckets; b++)
            if (sh.bucket[b + 1] - sh.bucket[b] > big) big = sh.bucket[b + 1] - sh.bucket[b];
        size_t stage = sh.total < ((size_t)1 << 20) ? sh.total : (size_t)1 << 20;
        QT_EXPECT(row(&p, "weights (bf16)") == al(sh.total * 2) && row(&p, "gradients (fp32)") == al(sh.total * 4),
                  "case %d: weights %zu, gradients %zu", k, row(&p, "weights (bf16)"), row(&p, "gradients (fp32)"));
        QT_EXPECT(row(&p, "master weights (fp32)") == al(sh.len * 4) && row(&p, "adam m (fp32)") == al(sh.len * 4) &&
                      row(&p, "adam v (bf16)") == al(sh.len * 2),
                  "case %d: optimizer rows for %zu state elements", k, sh.len);
        QT_EXPECT(row(&p, "gradient comm buffer (bf16)") == (k == 1 ? al(big * 2) : 0), "case %d: comm buffer %zu", k,
                  row(&p, "gradient comm buffer (bf16)"));
        QT_EXPECT(row(&p, "load staging (fp32)") == al(stage * 4), "case %d: staging", k);
        QT_EXPECT(rows_sum(&p) == p.off, "case %d: rows %zu != total %zu", k, rows_sum(&p), p.off);
        qt_param_store_free(ps);
    }
    qt_layout_free(&L);
}

/* The activation store: per layer res, ln1, rstd1, qkv, att, lse, res_mid, ln2, rstd2, gu, h; the final
 * norm's; the backward scratch. A recomputed part's tensors have one buffer for all layers: every layer's
 * pointer is layer 0's (what the backward's rebuild relies on and what the plan's rows show), every
 * other tensor has its own per layer. Implications: block => att, ffn, norm; att => qkv; ffn => swiglu.
 * Each set also with memory.offload_residual: the layers' input residuals take two device slots (layer
 * l's is slot l % 2) and the first L - 2 layers' a host row. */
static void test_act_store_rows(void) {
    qt_layout L;
    small_layout(&L, 1);
    const qt_model_cfg *c = &L.cfg;
    long N = 3 * 17; /* odd token count */
    char err[256];
    QT_EXPECT(qt_act_recompute_resolve(QT_RC_BLOCK) == 63 && qt_act_recompute_resolve(QT_RC_ATT) == (QT_RC_ATT | QT_RC_QKV) &&
                  qt_act_recompute_resolve(QT_RC_FFN | QT_RC_NORM) == (QT_RC_FFN | QT_RC_SWIGLU | QT_RC_NORM) &&
                  qt_act_recompute_resolve(QT_RC_QKV) == QT_RC_QKV && qt_act_recompute_resolve(0) == 0,
              "implications");
    char names[64];
    QT_EXPECT(!strcmp(qt_act_recompute_names(qt_act_recompute_resolve(QT_RC_ATT), names, sizeof names), "qkv, att") &&
                  !strcmp(qt_act_recompute_names(0, names, sizeof names), "none"),
              "names: %s", names);
    const int sets[] = {0, QT_RC_SWIGLU, QT_RC_NORM, QT_RC_QKV, QT_RC_ATT, QT_RC_FFN, QT_RC_BLOCK, QT_RC_FFN | QT_RC_NORM};
    size_t C = c->hidden_size, F = c->intermediate_size, HD = 3 * 32, QKV = 5 * 32, nl = c->num_layers;
    /* k: set k / 4, offload_residual k & 1, an fp8 backward k & 2 (ln1 / ln2 / h shared whatever the set) */
    for (int k = 0; k < 4 * (int)(sizeof sets / sizeof sets[0]); k++) {
        int off = k & 1, f8 = k >> 1 & 1, set = sets[k / 4];
        qt_act_policy pol = {.recompute = set, .redo = qt_act_redo_of(set), .offload_residual = off, .fp8_bwd = f8};
        qt_act_store *as = qt_act_store_create(c, N, pol, err, sizeof err);
        QT_REQUIRE(as, "%s", err);
        int r = qt_act_recompute_resolve(set);
        const qt_act_redo *rd = &as->policy.redo; /* the decisions: the resolved parts */
        QT_EXPECT(rd->norm == !!(r & QT_RC_NORM) && rd->qkv == !!(r & QT_RC_QKV) && rd->att == !!(r & QT_RC_ATT) &&
                      rd->block == !!(r & QT_RC_BLOCK) && rd->ffn == !!(r & QT_RC_FFN) &&
                      rd->swiglu == !!(r & QT_RC_SWIGLU) && rd->any == (r != 0),
                  "set %d: the parts rebuilt", set);
        /* layers holding a buffer of the part's tensors: 1 when recomputed */
#define NL_(part) ((r & (part)) ? 1 : nl)
        int sh[3] = {r & QT_RC_NORM || f8, r & QT_RC_NORM || f8, r & QT_RC_SWIGLU || f8}; /* ln1, ln2, h */
        qt_mem_plan p;
        qt_mem_plan_begin(&p, NULL);
        qt_act_store_carve(as, &p);
        size_t res = ((off ? 2 : nl) + NL_(QT_RC_BLOCK)) * al(N * C * 2) + al(N * C * 2);
        QT_EXPECT(n_pinned(&p) == off && (!off || (!strcmp(pinned(&p, 0)->kind, "offloaded residuals") &&
                                                pinned(&p, 0)->bytes == (nl - 2) * al(N * C * 2))),
                  "set %d offload %d: %d host rows", set, off, n_pinned(&p));
        size_t norms = ((sh[0] ? 1 : nl) + (sh[1] ? 1 : nl)) * al(N * C * 2) + nl * 2 * al(N * 4) + al(N * C * 2) + al(N * 4);
        QT_EXPECT(row(&p, "activations: residual") == res && row(&p, "activations: norms") == norms,
                  "set %d: residual %zu (want %zu), norms %zu (want %zu)", set, row(&p, "activations: residual"), res,
                  row(&p, "activations: norms"), norms);
        QT_EXPECT(row(&p, "activations: qkv") == NL_(QT_RC_QKV) * al(N * QKV * 2) &&
                      row(&p, "activations: gate|up") == NL_(QT_RC_FFN) * al(N * 2 * F * 2) &&
                      row(&p, "activations: swiglu") == (sh[2] ? 1 : nl) * al(N * F * 2) &&
                      row(&p, "activations: attention") == NL_(QT_RC_ATT) * (al(N * HD * 2) + al(N * 3 * 4)),
                  "set %d: per-layer rows", set);
        QT_EXPECT(row(&p, "scratch: gradients") == al(N * C * 4) + 3 * al(N * C * 2) + al(N * HD * 2) + al(N * QKV * 2),
                  "scratch %zu", row(&p, "scratch: gradients"));
        QT_EXPECT(rows_sum(&p) == p.off, "rows %zu != total %zu", rows_sum(&p), p.off);
#undef NL_
        /* second pass with real addresses: who shares a buffer */
        char *base = malloc(p.off);
        QT_REQUIRE(base, "malloc");
        size_t total = p.off;
        qt_mem_plan_begin(&p, base);
        qt_act_store_carve(as, &p);
        QT_EXPECT(p.off == total, "second pass %zu != %zu", p.off, total);
        for (int l = 1; l < (int)nl; l++) {
            const qt_gpu_layer *a = &as->layers[l], *a0 = &as->layers[0];
            const void *mine[] = {a->ln1, a->ln2, a->qkv, a->att, a->lse, a->res_mid, a->gu, a->h, a->res, a->rstd1, a->rstd2};
            const void *first[] = {a0->ln1, a0->ln2, a0->qkv, a0->att, a0->lse, a0->res_mid, a0->gu, a0->h, a0->res, a0->rstd1, a0->rstd2};
            const int shared[] = {sh[0], sh[1], r & QT_RC_QKV, r & QT_RC_ATT, r & QT_RC_ATT, r & QT_RC_BLOCK, r & QT_RC_FFN, sh[2], 0, 0, 0};
            QT_EXPECT(!off || (a->res == as->layers[l % 2].res && as->layers[0].res != as->layers[1].res),
                      "offload: layer %d's residual is not slot %d", l, l % 2);
            for (int t = 0; t < 11; t++) {
                if (off && t == 8) continue; /* res: the slots, checked above */
                QT_EXPECT((mine[t] == first[t]) == !!shared[t], "set %d fp8 bwd %d: layer %d tensor %d %s layer 0's buffer", set,
                          f8, l, t, mine[t] == first[t] ? "shares" : "does not share");
            }
        }
        QT_EXPECT(qt_act_forward(as, 1) == qt_act_backward(as, 1) && qt_act_forward(as, 1) == &as->layers[1], "one buffer set");
        free(base);
        qt_act_store_free(as);
    }
    qt_layout_free(&L);
}

/* The plan from the config and the rank count: every mode is a value, decided here. */
static void test_step_plan(void) {
    qt_layout L;
    small_layout(&L, 1);
    qt_config c;
    qt_config_defaults(&c);
    c.data.micro_batch = 1;
    c.data.seq_len = 8;
    qt_plan p;
    char err[512];
    QT_REQUIRE(qt_plan_resolve(&c, &L, 0, &p, err, sizeof err) == 0, "%s", err); /* one GPU */
    QT_EXPECT(p.parallel.dp == QT_DP_ONE && p.parallel.n_ranks == 1 && !p.perf.side_stream && !p.weights.ahead &&
                  !p.optimizer.ahead && !p.parallel.overlap && !p.parallel.lookups && !p.grads.reduce_bf16 && !p.precision.fp8,
              "one GPU");
    qt_config_set_offload(&c, QT_OFF_OPTIMIZER, 1);
    c.parallel.reduce_dtype = QT_DT_BF16;
    QT_REQUIRE(qt_plan_resolve(&c, &L, 0, &p, err, sizeof err) == 0, "%s", err); /* one GPU offloaded: AdamW ahead */
    QT_EXPECT(p.optimizer.ahead && p.weights.ahead && p.perf.side_stream && p.optimizer.host && !p.grads.reduce_bf16,
              "one GPU offloaded");
    QT_REQUIRE(qt_plan_resolve(&c, &L, 2, &p, err, sizeof err) == 0, "%s", err); /* sharded, overlapped (default), offloaded */
    QT_EXPECT(p.parallel.dp == QT_DP_SHARDED && p.parallel.n_ranks == 2 && p.parallel.overlap && p.weights.ahead &&
                  !p.optimizer.ahead && p.perf.side_stream && p.grads.reduce_bf16,
              "sharded");
    QT_EXPECT(p.parallel.lookups, "2 ranks x 8 tokens x 97 < 300 x 96: lookups pay");
    c.data.micro_batch = 64;
    QT_REQUIRE(qt_plan_resolve(&c, &L, 2, &p, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(!p.parallel.lookups, "2 x 512 x 97 > 300 x 96: the table's gradient is summed");
    c.parallel.overlap_comm = 0;
    c.parallel.zero = 0;
    c.precision.matmul_dtype = QT_DT_E4M3;
    c.precision.persistent_quants = 1;
    QT_REQUIRE(qt_plan_resolve(&c, &L, 2, &p, err, sizeof err) == 0, "%s", err); /* replicated, no overlap */
    QT_EXPECT(p.parallel.dp == QT_DP_REPLICATED && !p.parallel.overlap && !p.weights.ahead && !p.optimizer.ahead &&
                  p.perf.side_stream && !p.parallel.lookups && p.precision.fp8 && p.precision.persistent_quants,
              "replicated");
    qt_layout_free(&L);
}

/* parallel.devices: a YAML list (flow or block), --set, the dump reads back; bad entries are refused
 * naming the key. */
static void test_parallel_devices_key(void) {
    qt_config c;
    char err[512];
    QT_REQUIRE(qt_config_load_string(&c, "parallel: {devices: [0, 0, 2]}\n", "t.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(c.parallel.devices.n == 3 && c.parallel.devices.v[0] == 0 && c.parallel.devices.v[1] == 0 && c.parallel.devices.v[2] == 2, "flow list: %d", c.parallel.devices.n);
    QT_REQUIRE(qt_config_load_string(&c, "parallel:\n  devices:\n    - 1\n    - 3\n", "t.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(c.parallel.devices.n == 2 && c.parallel.devices.v[0] == 1 && c.parallel.devices.v[1] == 3, "block list: %d", c.parallel.devices.n);
    const char *set[1] = {"parallel.devices=[4,4]"};
    QT_REQUIRE(qt_config_load_string(&c, "", "t.yaml", set, 1, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(c.parallel.devices.n == 2 && c.parallel.devices.v[1] == 4, "--set: %d", c.parallel.devices.n);
    QT_REQUIRE(qt_config_load_string(&c, "parallel: {devices: []}\n", "t.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(c.parallel.devices.n == 0, "empty list: %d", c.parallel.devices.n);
    static char dump[1 << 16];
    qt_config d;
    QT_REQUIRE(qt_config_load_string(&c, "parallel: {devices: [0, 0, 2]}\n", "t.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    qt_config_dump(&c, dump, sizeof dump);
    QT_EXPECT(strstr(dump, "  devices: [0, 0, 2]\n"), "dump:\n%s", dump);
    QT_REQUIRE(qt_config_load_string(&d, dump, "dump.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(qt_config_equal(&c, &d, NULL), "the dump reads back to another config");
    const char *bad[3] = {"parallel: {devices: [0, -1]}\n", "parallel: {devices: [a]}\n", "parallel: {devices: [[0]]}\n"};
    for (int i = 0; i < 3; i++)
        QT_EXPECT(qt_config_load_string(&c, bad[i], "t.yaml", NULL, 0, err, sizeof err) == -1 &&
                      strstr(err, "t.yaml:1:") && strstr(err, "parallel.devices") && strstr(err, "list of at most"),
                  "%s -> %s", bad[i], err);
}

static size_t rows_from(const qt_mem_plan *p, const char *prefix) {
    size_t s = 0;
    for (int i = 0; i < p->n; i++)
        if (!strncmp(p->row[i].kind, prefix, strlen(prefix))) s += p->row[i].bytes;
    return s;
}

/* A store for 16 tokens (who shares what) carved over host memory (*base, the caller frees it), so its layers'
 * buffer pointers can be compared. */
static qt_act_store *carved_store(const qt_model_cfg *c, qt_act_policy acts, char **base) {
    char err[512];
    qt_act_store *as = qt_act_store_create(c, 16, acts, err, sizeof err);
    QT_CHECK(as, "%s", err);
    qt_mem_plan ap;
    qt_mem_plan_begin(&ap, NULL);
    qt_act_store_carve(as, &ap);
    *base = malloc(ap.off);
    QT_CHECK(*base, "malloc %zu", ap.off);
    qt_mem_plan_begin(&ap, *base);
    qt_act_store_carve(as, &ap);
    return as;
}

/* qk_norm (Qwen3): each layer also keeps the pre-norm q|k heads [N,(H+Hkv)D] bf16 and their rstd [N,H+Hkv] in
 * the "activations: qkv" row; they go with qkv (one buffer for all layers when qkv is recomputed). The
 * Qwen3-8B example's whole plan on one GPU is printed, and its activations exceed those of the same shape
 * without q/k norms by exactly those two tensors per layer. */
static void test_act_store_qknorm(void) {
    qt_config cfg;
    char err[512];
    QT_REQUIRE(qt_config_load(&cfg, "configs/qwen3-8b-fp8.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    const int sets[] = {0, QT_RC_QKV, QT_RC_FFN | QT_RC_NORM, QT_RC_BLOCK};
    for (int k = 0; k < 4; k++) {
        qt_mem_plan p[2];
        size_t nl = cfg.model.num_layers, NH = cfg.model.num_heads + cfg.model.num_kv_heads, D = 128;
        size_t N = (size_t)cfg.data.micro_batch * cfg.data.seq_len, shared = qt_act_recompute_resolve(sets[k]) & QT_RC_QKV;
        for (int qk = 0; qk < 2; qk++) {
            qt_model_cfg mc = cfg.model;
            if (!qk) mc.arch = QT_ARCH_LLAMA; /* the same shape without q/k norms */
            qt_layout L;
            QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
            QT_REQUIRE(L.cfg.qk_norm == qk, "qk_norm %d", L.cfg.qk_norm);
            qt_shard one;
            qt_shard_init(&one, &L, 1, 0, 0);
            qt_plan pl;
            cfg.memory.recompute = sets[k];
            QT_REQUIRE(qt_plan_resolve(&cfg, &L, 0, &pl, err, sizeof err) == 0, "%s", err);
            QT_REQUIRE(qt_gpu_model_plan(&L, &pl, &one, &p[qk], err, sizeof err) == 0, "%s", err);
            QT_EXPECT(rows_sum(&p[qk]) == p[qk].off, "rows %zu != total %zu", rows_sum(&p[qk]), p[qk].off);
            char *base;
            qt_act_store *as = carved_store(&L.cfg, pl.acts, &base);
            for (int l = 0; l < (int)nl; l++) {
                const qt_gpu_layer *a = &as->layers[l];
                QT_EXPECT(!qk == !a->qk && !qk == !a->qk_rstd, "layer %d: qk buffers %p %p with qk_norm %d", l, a->qk,
                          (void *)a->qk_rstd, qk);
                if (qk && l > 0)
                    QT_EXPECT((a->qk == as->layers[0].qk && a->qk_rstd == as->layers[0].qk_rstd) == !!shared,
                              "set %d layer %d: q/k buffers shared %d, expected %d", sets[k], l, a->qk == as->layers[0].qk,
                              !!shared);
            }
            free(base);
            qt_act_store_free(as);
            qt_layout_free(&L);
        }
        size_t per = al(N * NH * D * 2) + al(N * NH * 4), want = (shared ? 1 : nl) * per;
        QT_EXPECT(row(&p[1], "activations: qkv") - row(&p[0], "activations: qkv") == want &&
                      rows_from(&p[1], "activations:") - rows_from(&p[0], "activations:") == want,
                  "set %d: qk_norm adds %zu to the qkv row, expected %zu", sets[k],
                  row(&p[1], "activations: qkv") - row(&p[0], "activations: qkv"), want);
        printf("  qwen3-8b-fp8 mb %d recompute %d: GPU plan %.2f GiB (q/k norm activations %.2f GiB)\n", cfg.data.micro_batch,
               sets[k], p[1].off / 1073741824.0, want / 1073741824.0);
    }
}

/* Gemma 3 on the GPU: the plan of a Gemma-3-4B-shaped model (hidden 2560, 8/4 heads of 256, local layers with a
 * window of 1024 and every 6th global, soft-cap 30) is made (the GPU model takes the family), and its activations
 * exceed those of the same shape as Qwen3 (q/k norms too, plain norms, no post-norms) by exactly the sandwich
 * norms' saved tensors: per layer the o_proj output [N,C] bf16 (one buffer for all layers under recompute block),
 * the down_proj output [N,C] bf16 and the two post-norms' rstd [N] fp32. Every layer holds those buffers. The
 * GPU family each arch picks: Gemma's (1 + w) norms, GeGLU, bf16 sqrt(C) embedding scale, attention scalar, cap. */
static void test_act_store_gemma(void) {
    qt_config cfg;
    char err[512];
    QT_REQUIRE(qt_config_load(&cfg, "configs/qwen3-8b-fp8.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    cfg.model.vocab_size = 262144, cfg.model.hidden_size = 2560, cfg.model.num_layers = 7, cfg.model.num_heads = 8;
    cfg.model.num_kv_heads = 4, cfg.model.head_dim = 256, cfg.model.intermediate_size = 10240;
    const int sets[] = {0, QT_RC_FFN | QT_RC_NORM, QT_RC_BLOCK};
    for (int k = 0; k < 3; k++) {
        qt_mem_plan p[2];
        size_t nl = cfg.model.num_layers, C = 2560, N = (size_t)cfg.data.micro_batch * cfg.data.seq_len;
        int block = qt_act_recompute_resolve(sets[k]) & QT_RC_BLOCK;
        for (int gm = 0; gm < 2; gm++) {
            qt_model_cfg mc = cfg.model;
            if (gm) {
                mc.arch = QT_ARCH_GEMMA3, mc.sliding_window = 1024, mc.window_pattern = 6, mc.rope_local_theta = 10000;
                mc.attn_scalar = 256, mc.logit_softcap = 30;
            }
            qt_layout L;
            QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
            qt_shard one;
            qt_shard_init(&one, &L, 1, 0, 0);
            qt_plan pl;
            cfg.memory.recompute = sets[k];
            QT_REQUIRE(qt_plan_resolve(&cfg, &L, 0, &pl, err, sizeof err) == 0, "%s", err);
            QT_REQUIRE(qt_gpu_model_plan(&L, &pl, &one, &p[gm], err, sizeof err) == 0, "arch %d: %s", gm, err);
            char *base;
            qt_act_store *as = carved_store(&L.cfg, pl.acts, &base);
            for (int l = 0; l < (int)nl; l++) {
                const qt_gpu_layer *a = &as->layers[l], *a0 = &as->layers[0];
                QT_EXPECT(!gm == !a->po && !gm == !a->pm && !gm == !a->rstd_pa && !gm == !a->rstd_pf,
                          "layer %d: post-norm buffers %p %p with gemma %d", l, a->po, a->pm, gm);
                if (gm && l > 0)
                    QT_EXPECT((a->po == a0->po) == !!block && a->pm != a0->pm && a->rstd_pa != a0->rstd_pa,
                              "set %d layer %d: po shared %d (block %d), pm shared %d", sets[k], l, a->po == a0->po,
                              block, a->pm == a0->pm);
            }
            free(base);
            qt_act_store_free(as);
            qt_layout_free(&L);
        }
        if (k == 0) { /* the family the GPU model runs each with (no GPU needed to pick it) */
            qt_model_cfg mq = cfg.model, mg = cfg.model;
            mg.arch = QT_ARCH_GEMMA3, mg.attn_scalar = 256, mg.logit_softcap = 30;
            qt_gpu_family fq = qt_gpu_family_of(&mq), fg = qt_gpu_family_of(&mg);
            QT_EXPECT(fq.norm_fwd == qt_rmsnorm_fwd && fq.glu_bwd == qt_swiglu_bwd && fq.qknorm_bwd == qt_qknorm_bwd &&
                          fq.embed_scale == 1.0f && fq.attn_scale == 0.0f && fq.logit_cap == 0.0f,
                      "qwen3's family: scales %g %g %g", fq.embed_scale, fq.attn_scale, fq.logit_cap);
            QT_EXPECT(fg.norm_fwd == qt_rmsnorm1p_fwd && fg.norm_bwd == qt_rmsnorm1p_bwd && fg.qknorm_fwd == qt_qknorm1p_fwd &&
                          fg.glu_fwd == qt_geglu_fwd && fg.glu_bwd_h == qt_geglu_bwd_h &&
                          fg.fp8_glu_bwd_requant == qt_fp8_geglu_bwd_requant && fg.embed_scale == 50.5f &&
                          fg.attn_scale == 0.0625f && fg.logit_cap == 30.0f,
                      "gemma3's family: embed scale %g (bf16 sqrt(2560) = 50.5), attention %g, cap %g", fg.embed_scale,
                      fg.attn_scale, fg.logit_cap);
        }
        size_t want = (block ? 1 : nl) * al(N * C * 2) + nl * (al(N * C * 2) + 2 * al(N * 4));
        size_t got = rows_from(&p[1], "activations:") - rows_from(&p[0], "activations:");
        QT_EXPECT(got == want, "set %d: gemma's activations exceed qwen3's by %zu, expected %zu", sets[k], got, want);
        printf("  gemma-3-4b shape, 7 layers, recompute %d: GPU plan %.2f GiB (post-norm activations %.2f GiB)\n",
               sets[k], p[1].off / 1073741824.0, want / 1073741824.0);
    }
}

/* The GPU plan of the Qwen2.5-7B configs (configs/qwen2.5-7b-*.yaml: hidden 3584, 28 layers, 28/4 heads,
 * ffn 18944, vocab 152064, untied) at micro-batch 1/4/8/16 with each recompute set, sized by
 * qt_gpu_model_plan (the allocator's own code, no GPU). Prints the table (GiB): activations = the
 * "activations:" rows; "offloaded" = the device total without master, m and v (memory.offload_optimizer
 * keeps them in host memory; its streaming slots are not counted). Checks each set's saving against the
 * shared buffers' sizes: every recomputed tensor leaves (layers - 1) copies. */
static void test_plan_7b(void) {
    const char *files[] = {"configs/qwen2.5-7b-bf16.yaml", "configs/qwen2.5-7b-fp8.yaml"};
    const int sets[] = {0, QT_RC_SWIGLU, QT_RC_NORM, QT_RC_QKV, QT_RC_ATT, QT_RC_FFN, QT_RC_FFN | QT_RC_NORM, QT_RC_BLOCK};
    const int mbs[] = {1, 4, 8, 16};
    const double G = 1073741824.0;
    for (int f = 0; f < 2; f++) {
        qt_config cfg;
        char err[512], names[64];
        QT_REQUIRE(qt_config_load(&cfg, files[f], NULL, 0, err, sizeof err) == 0, "%s", err);
        qt_model_cfg mc = cfg.model;
        qt_model_cfg_finish(&mc);
        qt_layout L;
        QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(L.numel > 7600000000ul && L.numel < 7700000000ul, "%s: %zu parameters", files[f], L.numel);
        qt_shard one;
        qt_shard_init(&one, &L, 1, 0, 0);
        qt_plan pl = {.parallel.zero = 0}, tp; /* everything on the device */
        printf("  %s (%.2fB parameters), GiB:\n  %3s %-38s %11s %9s %8s %9s\n", files[f], L.numel / 1e9, "mb", "recompute",
               "activations", "fp8 acts", "total", "offloaded");
        size_t C = mc.hidden_size, F = mc.intermediate_size, nl = mc.num_layers, H = mc.num_heads;
        size_t HD = H * mc.head_dim, QKV = (H + 2 * mc.num_kv_heads) * mc.head_dim;
        for (int b = 0; b < 4; b++) {
            size_t act0 = 0, fp80 = 0;
            for (int k = 0; k < 8; k++) {
                cfg.data.micro_batch = mbs[b];
                cfg.memory.recompute = sets[k];
                qt_mem_plan p;
                QT_REQUIRE(qt_gpu_model_plan(&L, qt_t_placed(&tp, &cfg, &L, &pl), &one, &p, err, sizeof err) == 0, "%s", err);
                QT_EXPECT(rows_sum(&p) == p.off, "rows %zu != total %zu", rows_sum(&p), p.off);
                size_t act = rows_from(&p, "activations:"), opt = row(&p, "master weights (fp32)") +
                                                                 row(&p, "adam m (fp32)") + row(&p, "adam v (fp32)");
                if (k == 0) act0 = act, fp80 = row(&p, "fp8 activations");
                /* the expected saving: (layers - 1) copies of each shared tensor (sizes are multiples of 256) */
                size_t N = (size_t)mbs[b] * cfg.data.seq_len, r = qt_act_recompute_resolve(sets[k]), per = 0;
                int f8 = f != 0 && cfg.precision.grad_dtype != QT_DT_BF16; /* ln1, ln2, h shared in the baseline */
                if (r & QT_RC_NORM && !f8) per += 2 * N * C * 2;
                if (r & QT_RC_QKV) per += N * QKV * 2;
                if (r & QT_RC_ATT) per += N * HD * 2 + N * H * 4;
                if (r & QT_RC_BLOCK) per += N * C * 2;
                if (r & QT_RC_FFN) per += N * 2 * F * 2;
                if (r & QT_RC_SWIGLU && !f8) per += N * F * 2;
                /* fp8 backward: the Xq^T of qkv, o, gate|up, down inputs shared with qkv, block, ffn, swiglu */
                size_t fper = f == 0 ? 0 : (r & QT_RC_QKV ? N * C : 0) + (r & QT_RC_BLOCK ? N * HD : 0) +
                                                (r & QT_RC_FFN ? N * C : 0) + (r & QT_RC_SWIGLU ? N * F : 0);
                QT_EXPECT(fp80 - row(&p, "fp8 activations") == (nl - 1) * fper, "%s mb %d set %d: fp8 saves %zu, expected %zu",
                          files[f], mbs[b], sets[k], fp80 - row(&p, "fp8 activations"), (nl - 1) * fper);
                QT_EXPECT(act0 - act == (nl - 1) * per, "%s mb %d set %d: saves %zu, expected %zu", files[f], mbs[b], sets[k],
                          act0 - act, (nl - 1) * per);
                printf("  %3d %-38s %11.2f %9.2f %8.2f %9.2f\n", mbs[b],
                       qt_act_recompute_names(qt_act_recompute_resolve(sets[k]), names, sizeof names), act / G,
                       row(&p, "fp8 activations") / G, p.off / G, (p.off - opt) / G);
            }
        }
        /* memory.offload_residual: (layers - 2) residuals leave the GPU for the host row; at micro-batch 1
         * with block the activations (the "activations:" rows and the fp8 ones) fit in 0.5 GiB (issue 23). */
        for (int b = 0; b < 4; b++)
            for (int k = 0; k < 2; k++) {
                cfg.data.micro_batch = mbs[b];
                cfg.memory.recompute = k ? QT_RC_BLOCK : QT_RC_FFN | QT_RC_NORM;
                size_t N = (size_t)mbs[b] * cfg.data.seq_len, act[2], fp8 = 0, total = 0, opt = 0;
                qt_mem_plan p;
                for (int off = 0; off < 2; off++) {
                    qt_config_set_offload(&cfg, QT_OFF_RESIDUAL, off);
                    QT_REQUIRE(qt_gpu_model_plan(&L, qt_t_placed(&tp, &cfg, &L, &pl), &one, &p, err, sizeof err) == 0, "%s", err);
                    QT_EXPECT(rows_sum(&p) == p.off, "rows %zu != total %zu", rows_sum(&p), p.off);
                    act[off] = rows_from(&p, "activations:");
                    fp8 = row(&p, "fp8 activations"), total = p.off;
                    opt = row(&p, "master weights (fp32)") + row(&p, "adam m (fp32)") + row(&p, "adam v (fp32)");
                }
                qt_config_set_offload(&cfg, QT_OFF_RESIDUAL, 0);
                QT_EXPECT(act[0] - act[1] == (nl - 2) * N * C * 2 && n_pinned(&p) == 1 &&
                              !strcmp(pinned(&p, 0)->kind, "offloaded residuals") && pinned(&p, 0)->bytes == (nl - 2) * N * C * 2,
                          "%s mb %d: offload saves %zu, expected %zu", files[f], mbs[b], act[0] - act[1], (nl - 2) * N * C * 2);
                printf("  %3d %-38s %11.2f %9.2f %8.2f %9.2f (host %.2f)\n", mbs[b],
                       k ? "block + offload_residual" : "ffn, norm + offload_residual", act[1] / G, fp8 / G, total / G,
                       (total - opt) / G, pinned(&p, 0)->bytes / G);
                if (mbs[b] == 1 && k)
                    QT_EXPECT(act[1] + fp8 <= G / 2, "%s: 7B at micro-batch 1, block + offload_residual: %.3f GiB of "
                              "activations, expected <= 0.5", files[f], (act[1] + fp8) / G);
            }
        qt_layout_free(&L);
    }
}

/* The 14B config (configs/qwen2.5-14b-fp8.yaml: Qwen2.5-14B shape, bf16 master, bf16 gradients, m and v
 * bf16 offloaded, recompute [ffn, norm], lmhead_chunks 4) sized by qt_gpu_model_plan at micro-batch 1, 2, 4
 * and 8, fp8 and bf16 matmuls. Offloaded, the device holds the store's slots instead of m and v (the plan
 * is sized with the state on the device, which needs no pinned allocation here, then m and v swapped
 * for qt_gpu_optim_slot_bytes). Prints device GiB per row and the host bytes the offloaded state needs;
 * checks: no master row, bf16 gradient and weight rows of 2 bytes per parameter, and with bf16 matmuls
 * micro-batch >= 1 fits 78 GiB (an 80 GB H100 less the context and cuBLASLt/cuDNN workspaces). fp8 adds
 * its weight quants (Wq, Wq^T: 2 bytes per block-matrix parameter) and does not fit (printed). */
static void test_plan_14b(void) {
    qt_config cfg;
    char err[512];
    /* the plan the config ran on the H100 (it leaves these keys to memory.plan: auto) */
    const char *measured[] = {"data.micro_batch=4", "data.grad_accum=128", "memory.lmhead_chunks=4", "memory.offload_optimizer=true",
                              "memory.recompute=[ffn,norm]", "memory.fp8_weight_cache=none"};
    QT_REQUIRE(qt_config_load(&cfg, "configs/qwen2.5-14b-fp8.yaml", measured, 6, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(cfg.precision.master_dtype == QT_DT_BF16 && cfg.precision.grad_accum_dtype == QT_DT_BF16 &&
                  cfg.memory.offload_optimizer && (long)cfg.data.micro_batch * cfg.data.grad_accum * cfg.data.seq_len == 524288 &&
                  cfg.precision.matmul_dtype == QT_DT_E4M3 && cfg.memory.fp8_weight_cache == QT_FP8_WCACHE_NONE,
              "the 14B config's settings");
    int cfg_mb = cfg.data.micro_batch;
    qt_model_cfg mc = cfg.model;
    qt_model_cfg_finish(&mc);
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(L.numel > 14700000000ul && L.numel < 14800000000ul, "%zu parameters", L.numel);
    qt_shard one;
    qt_shard_init(&one, &L, 1, 0, 0);
    qt_plan pl = {.parallel.zero = 0}, tp; /* everything on the device */
    const double G = 1073741824.0;
    size_t host = L.numel * 4; /* m, v bf16 */
    printf("  14B (%.2fB parameters), bf16 master + bf16 gradients, m/v bf16 offloaded: %.1f GiB pinned host memory\n",
           L.numel / 1e9, host / G);
    int fits_bf16 = 0, fits_fp8 = 0, fits_fp8_all = 0;
    /* fp8 with the weight quants in two layer slots (the config), fp8 with every layer's cached, bf16 */
    for (int mm = 0; mm < 3; mm++) {
        cfg.precision.matmul_dtype = mm == 2 ? QT_DT_BF16 : QT_DT_E4M3;
        cfg.memory.fp8_weight_cache = mm == 1 ? QT_FP8_WCACHE_ALL : QT_FP8_WCACHE_NONE;
        for (int mb = 1; mb <= 8; mb *= 2) {
            cfg.data.micro_batch = mb;
            qt_mem_plan p;
            QT_REQUIRE(qt_gpu_model_plan(&L, qt_t_placed(&tp, &cfg, &L, &pl), &one, &p, err, sizeof err) == 0, "%s", err);
            QT_EXPECT(row(&p, "master weights (fp32)") == 0 && row(&p, "gradients (fp32)") == 0 &&
                          row(&p, "gradients (bf16)") == al(one.total * 2) && row(&p, "weights (bf16)") == al(one.total * 2),
                      "14B rows: master %zu, gradients %zu", row(&p, "master weights (fp32)"), row(&p, "gradients (bf16)"));
            size_t dev = p.off - row(&p, "adam m (bf16)") - row(&p, "adam v (bf16)") +
                         al(qt_gpu_optim_slot_bytes(QT_GPU_OPTIM_CHUNK, QT_OPTIM_M | QT_OPTIM_V, QT_DT_BF16, QT_DT_BF16, QT_DT_F32));
            int fits = dev <= (size_t)(78 * G);
            int *fit = mm == 0 ? &fits_fp8 : mm == 1 ? &fits_fp8_all : &fits_bf16;
            if (fits) *fit = mb;
            size_t wq = rows_from(&p, "fp8 weights");
            QT_EXPECT(mm == 2 || row(&p, mm ? "fp8 weights (persistent)" : "fp8 weights (layer slots)") == wq,
                      "fp8 weight rows: %zu bytes", wq);
            if (mm == 0 && mb == cfg_mb)
                QT_EXPECT(fits, "configs/qwen2.5-14b-fp8.yaml: micro-batch %d needs %.2f GiB of the GPU: does not fit 78 GiB",
                          mb, dev / G);
            printf("  %s mb %d: device %.2f GiB (weights %.2f, gradients %.2f, activations %.2f, fp8 weights %.2f + "
                   "activations %.2f): %s\n",
                   mm == 2 ? "bf16         " : mm ? "fp8 cache all" : "fp8 slots    ", mb, dev / G, row(&p, "weights (bf16)") / G,
                   row(&p, "gradients (bf16)") / G, rows_from(&p, "activations:") / G, wq / G, row(&p, "fp8 activations") / G,
                   fits ? "fits 78 GiB" : "does not fit");
        }
    }
    QT_EXPECT(fits_bf16 >= 1, "14B with bf16 matmuls does not fit 78 GiB at micro-batch 1");
    QT_EXPECT(fits_fp8 >= cfg_mb && fits_fp8_all == 0, "14B fp8: fits up to micro-batch %d with the quants in slots, "
              "%d with every layer's cached (expected none)", fits_fp8, fits_fp8_all);
    qt_layout_free(&L);
}

int main(void) {
    QT_RUN(test_mem_plan);
    QT_RUN(test_param_store_rows);
    QT_RUN(test_act_store_rows);
    QT_RUN(test_act_store_qknorm);
    QT_RUN(test_act_store_gemma);
    QT_RUN(test_step_plan);
    QT_RUN(test_parallel_devices_key);
    QT_RUN(test_plan_7b);
    QT_RUN(test_plan_14b);
    return qt_test_end();
}
