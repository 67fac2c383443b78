/* test_nodes_plan.c — the plan and shards of a node of a run across nodes (CPU; no GPU, no NCCL).
 *
 * ZeRO over the world: local GPU r of node k (qt_shard_init_nodes) holds the shard of world rank r x nodes + k
 * of one process with every node's GPUs (the same buckets, pieces and state indices: what AdamW, the norm and
 * the checkpoint's pieces read), and its local piece (what comm/ sums between the node's GPUs) is world
 * pieces [r x nodes, (r + 1) x nodes) back to back, the piece of GPU r of the node alone on the world's
 * layout. The plan of a node: one GPU is a data-parallel rank (sharded with ZeRO, not the one-GPU mode), the
 * world's buckets, no embedding lookups gathered across nodes, nodes = 1 unchanged; the unit alignment of each
 * plan (64 x the world's ranks when they shard), the same before the layout exists; the memory plan's state
 * rows a 1 / world share; the refusals (offloaded weights, offloaded gradients on nodes of one GPU). */
#include "qt_config.h"
#include "qt_model.h"
#include "qt_partition.h"
#include "qt_plan.h"
#include "qt_planner.h"
#include "qt_test.h"

static qt_layout L;

/* A 5-layer model whose layer and table sizes are no multiple of 64 x ranks (so the padding shows), its units
 * aligned to A. */
static void make_layout(int tied, size_t A) {
    qt_model_cfg m = {.vocab_size = 259, .hidden_size = 72, .num_layers = 5, .num_heads = 2, .num_kv_heads = 1,
                      .intermediate_size = 100, .max_seq_len = 64, .rope_theta = 10000, .rms_norm_eps = 1e-5f,
                      .tie_embeddings = tied};
    qt_model_cfg_finish(&m);
    char err[256];
    QT_REQUIRE(qt_layout_init_units(&L, &m, A, err, sizeof err) == 0, "%s", err);
}

static void test_world_shard_pieces(void) {
    for (int tied = 0; tied <= 1; tied++) {
        for (int nodes = 2; nodes <= 3; nodes++)
            for (int g = 1; g <= 2; g++) {
                int W = nodes * g;
                make_layout(tied, 64 * (size_t)W);
                for (int r = 0; r < g; r++) {
                    qt_shard local;
                    qt_shard_init(&local, &L, g, r, 1); /* GPU r of one node holding the state */
                    for (int k = 0; k < nodes; k++) {
                        qt_shard node, world;
                        qt_shard_init_nodes(&node, &L, g, r, 1, nodes, k);
                        qt_shard_init(&world, &L, W, r * nodes + k, 1);
                        QT_EXPECT(node.total == world.total && node.len == world.len && node.rank == world.rank &&
                                      node.n_ranks == W && node.nodes == nodes && qt_shard_local_ranks(&node) == g &&
                                      node.n_buckets == world.n_buckets &&
                                      !memcmp(node.bucket, world.bucket, sizeof node.bucket),
                                  "tied %d, %d nodes x %d, GPU %d of node %d: rank %d of %d (len %zu), the world's %d of %d "
                                  "(len %zu)", tied, nodes, g, r, k, node.rank, node.n_ranks, node.len, world.rank,
                                  world.n_ranks, world.len);
                        for (int b = 0; b < node.n_buckets; b++) {
                            size_t off, len, st, woff, wlen, wst, loff, llen, goff, glen, gst;
                            qt_shard_piece(&node, b, &off, &len, &st);
                            qt_shard_piece(&world, b, &woff, &wlen, &wst);
                            qt_shard_local_piece(&node, b, &loff, &llen);
                            qt_shard_piece(&local, b, &goff, &glen, &gst);
                            QT_EXPECT(off == woff && len == wlen && st == wst && len % 64 == 0, "%d nodes x %d, bucket %d: "
                                      "piece %zu +%zu at %zu, the world's %zu +%zu at %zu", nodes, g, b, off, len, st, woff,
                                      wlen, wst);
                            QT_EXPECT(loff == goff && llen == glen && llen == len * (size_t)nodes && off == loff + (size_t)k * len,
                                      "%d nodes x %d, GPU %d of node %d, bucket %d: local piece %zu +%zu (one node's %zu +%zu), "
                                      "world piece %zu +%zu", nodes, g, r, k, b, loff, llen, goff, glen, off, len);
                        }
                    }
                }
                qt_layout_free(&L);
            }
        /* one node is qt_shard_init */
        make_layout(tied, 128);
        qt_shard a, b;
        qt_shard_init(&a, &L, 2, 1, 1);
        qt_shard_init_nodes(&b, &L, 2, 1, 1, 1, 0);
        QT_EXPECT(!memcmp(&a, &b, sizeof a) && a.nodes == 1, "qt_shard_init_nodes(1 node) differs from qt_shard_init");
        qt_layout_free(&L);
    }
}

/* The plan of `extra` on n_ranks ranks, whose unit alignment is `align` (qt_plan_unit_align_for's too). */
static void plan_of(const char *extra, int n_ranks, qt_plan *p, size_t align) {
    qt_config c;
    char err[512], yaml[512];
    snprintf(yaml, sizeof yaml, "model: {vocab_size: 259, hidden_size: 72, num_layers: 5, num_heads: 2, num_kv_heads: 1, "
             "intermediate_size: 100, max_seq_len: 64, tie_embeddings: true}\ndata: {seq_len: 8, micro_batch: 1}\n%s\n", extra);
    QT_REQUIRE(qt_config_load_string(&c, yaml, "n.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_plan_resolve(&c, &L, n_ranks, p, err, sizeof err) == 0, "%s: %s", extra, err);
    QT_EXPECT(qt_plan_unit_align(p) == align && qt_plan_unit_align_for(&c, n_ranks) == align, "%s on %d ranks: unit "
              "alignment %zu (before the layout %zu), expected %zu", extra, n_ranks, qt_plan_unit_align(p),
              qt_plan_unit_align_for(&c, n_ranks), align);
}

/* The bytes of p's rows of that kind in w. */
static size_t row(const qt_mem_plan *p, qt_mem_where w, const char *kind) {
    size_t n = 0;
    for (int i = 0; i < p->n; i++)
        if (p->row[i].where == w && !strcmp(p->row[i].kind, kind)) n += p->row[i].bytes;
    return n;
}

/* config `extra` resolved on n_ranks: -1 with err expected to hold `want` (NULL: 0 expected) */
static void refusal(const char *extra, int n_ranks, const char *want) {
    qt_config c;
    qt_plan p;
    char err[512], yaml[512];
    snprintf(yaml, sizeof yaml, "model: {vocab_size: 259, hidden_size: 72, num_layers: 5, num_heads: 2, num_kv_heads: 1, "
             "intermediate_size: 100, max_seq_len: 64}\ndata: {seq_len: 8}\n%s\n", extra);
    QT_REQUIRE(qt_config_load_string(&c, yaml, "o.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    int rc = qt_plan_resolve(&c, &L, n_ranks, &p, err, sizeof err);
    if (want) QT_EXPECT(rc == -1 && strstr(err, "o.yaml: ") && strstr(err, want), "%s on %d ranks: rc %d, %s", extra, n_ranks, rc, err);
    else QT_EXPECT(rc == 0, "%s on %d ranks: %s", extra, n_ranks, err);
}

static void test_node_plans(void) {
    make_layout(1, 64);
    qt_plan p;
    /* one GPU per node: a sharded rank (ZeRO over the world), the world's per-layer buckets, no lookups */
    plan_of("parallel: {nodes: 2, zero: 1, overlap_comm: false}", 1, &p, 128);
    QT_EXPECT(p.parallel.dp == QT_DP_SHARDED && p.parallel.zero == 1 && p.parallel.n_ranks == 1 && p.parallel.nodes == 2 &&
                  p.parallel.world_pieces && p.parallel.split.state && p.parallel.buckets && !p.parallel.lookups,
              "1 GPU x 2 nodes, zero 1: dp %d, zero %d, ranks %d, nodes %d, world %d, buckets %d, lookups %d",
              (int)p.parallel.dp, p.parallel.zero, p.parallel.n_ranks, p.parallel.nodes, p.parallel.world_pieces,
              p.parallel.buckets, p.parallel.lookups);
    plan_of("parallel: {nodes: 2, zero: 0, overlap_comm: false}", 1, &p, 64);
    QT_EXPECT(p.parallel.dp == QT_DP_REPLICATED && !p.parallel.world_pieces && !p.parallel.buckets, "zero 0: world %d buckets %d",
              p.parallel.world_pieces, p.parallel.buckets);
    plan_of("parallel: {nodes: 2, zero: 3}", 1, &p, 128); /* ZeRO-3 over the world: weight slots on one GPU a node */
    QT_EXPECT(p.parallel.dp == QT_DP_SHARDED && p.parallel.zero == 3 && p.weights.slots && p.grads.sharded &&
                  p.parallel.world_pieces, "zero 3 on nodes of 1 GPU: dp %d zero %d slots %d", (int)p.parallel.dp,
              p.parallel.zero, p.weights.slots);
    /* two GPUs per node: sharded over the world; lookups (which 2 ranks of 8 tokens pay here) off across nodes */
    plan_of("parallel: {nodes: 2, zero: 2}", 2, &p, 256);
    QT_EXPECT(p.parallel.dp == QT_DP_SHARDED && p.parallel.zero == 2 && p.parallel.world_pieces && !p.parallel.lookups,
              "2 GPUs x 2 nodes, zero 2: dp %d zero %d world %d lookups %d", (int)p.parallel.dp, p.parallel.zero,
              p.parallel.world_pieces, p.parallel.lookups);
    QT_EXPECT(!qt_plan_ckpt_in_place(&p).m, "across nodes a checkpoint copies the state (node 0 writes every node's pieces)");
    plan_of("parallel: {zero: 2}", 2, &p, 128); /* one machine: as before */
    QT_EXPECT(p.parallel.nodes == 1 && !p.parallel.world_pieces && p.parallel.lookups, "one machine: nodes %d world %d lookups %d",
              p.parallel.nodes, p.parallel.world_pieces, p.parallel.lookups);
    plan_of("parallel: {nodes: 2}", 0, &p, 64); /* a one-GPU plan (no ranks) never spans nodes */
    QT_EXPECT(p.parallel.dp == QT_DP_ONE && p.parallel.nodes == 1, "0 ranks: dp %d nodes %d", (int)p.parallel.dp, p.parallel.nodes);
    plan_of("parallel: {zero: 0}", 2, &p, 64);    /* replicated ranks: the compact layout */
    plan_of("parallel: {zero: 1}", 6, &p, 384);   /* 6 ranks: units at multiples of 384 */
    plan_of("parallel: {zero: 1}", -1, &p, 64);   /* the CPU */
    /* the refusals name the key */
    refusal("parallel: {nodes: 2, zero: 3}\nmemory: {offload: [weights]}", 1, "memory.offload: [weights] across nodes");
    refusal("parallel: {nodes: 2, zero: 3}\nmemory: {offload: [weights]}", 2, "memory.offload: [weights] across nodes");
    refusal("parallel: {nodes: 2, zero: 3, gather_dtype: e4m3}\nprecision: {matmul_dtype: e4m3, grad_dtype: e4m3}", 2, NULL);
    refusal("parallel: {nodes: 2, zero: 2}\nmemory: {offload: [gradients]}", 1, "memory.offload: [gradients] on nodes of one GPU");
    refusal("parallel: {nodes: 2, zero: 2}\nmemory: {offload: [gradients]}", 2, NULL);
    refusal("parallel: {zero: 3}\nmemory: {offload: [weights]}", 2, NULL); /* one machine */
    qt_layout_free(&L);
}

/* The memory plan of a node: the optimizer state a 1 / (nodes x GPUs) share, as one process with every
 * node's GPUs holds it; a checkpoint's snapshot: the whole bf16 weights pinned, and node 0's copies of every
 * node's pieces (fp32 master, m, v: 12 bytes a parameter) in pageable memory, which one GPU pins whole. */
static void test_node_memory(void) {
    const char *base = "model: {vocab_size: 259, hidden_size: 72, num_layers: 5, num_heads: 2, num_kv_heads: 1, "
                       "intermediate_size: 100, max_seq_len: 64}\ndata: {seq_len: 8, micro_batch: 1}\ndevice: cuda\n"
                       "memory: {plan: manual}\nparallel: {zero: 1, gpus: 1, nodes: %d}\n";
    size_t master[2], pinned[2], paged[2], numel = 0;
    for (int i = 0; i < 2; i++) {
        char yaml[512], err[512];
        snprintf(yaml, sizeof yaml, base, i ? 2 : 1);
        qt_config c;
        QT_REQUIRE(qt_config_load_string(&c, yaml, "m.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
        qt_layout Lw;
        qt_model_cfg m = c.model;
        QT_REQUIRE(qt_layout_init_units(&Lw, &m, 128, err, sizeof err) == 0, "%s", err);
        static qt_run_plan rp;
        int rc = qt_plan_run(&Lw, &c, 1, 1, &rp, err, sizeof err);
        if (rc && strstr(err, "built without CUDA")) {
            qt_layout_free(&Lw);
            QT_SKIP("%s", err);
        }
        QT_REQUIRE(rc == 0, "%s", err);
        master[i] = row(&rp.mem, QT_MEM_ARENA, "master weights (fp32)");
        pinned[i] = row(&rp.mem, QT_MEM_PINNED, "checkpoint snapshot");
        paged[i] = row(&rp.mem, QT_MEM_PAGEABLE, "checkpoint snapshot");
        numel = Lw.numel;
        QT_EXPECT(master[i] == numel * 4 / (i ? 2 : 1), "nodes %d: master weights %zu bytes, expected %zu", i + 1, master[i],
                  numel * 4 / (i ? 2 : 1));
        qt_layout_free(&Lw);
    }
    QT_EXPECT(pinned[0] == numel * 14 && paged[0] == 0, "one GPU's snapshot: %zu pinned, %zu pageable bytes, expected "
              "%zu pinned", pinned[0], paged[0], numel * 14);
    QT_EXPECT(pinned[1] == numel * 2 && paged[1] == numel * 12, "2 nodes' snapshot: %zu pinned, %zu pageable bytes, "
              "expected %zu and %zu", pinned[1], paged[1], numel * 2, numel * 12);
}

int main(void) {
    QT_RUN(test_world_shard_pieces);
    QT_RUN(test_node_plans);
    QT_RUN(test_node_memory);
    return qt_test_end();
}
