/* test_nodes_plan.c — the plan and shards of a node of a run across nodes (CPU; no GPU, no NCCL).
 *
 * A node's rank shard of a layout padded for the world (qt_shard_init_world) has the buckets of one process with every
 * node's GPUs, and its piece of each bucket is, in order, the pieces of `nodes` world ranks: what
 * qt_dp_nodes_norm sums to give the one process's gradient norm bits. The plan of a node: one GPU is a
 * replicated data-parallel rank (not the one-GPU mode), the world's buckets with ZeRO (world_pieces), no
 * embedding lookups gathered across nodes, nodes = 1 unchanged; the unit alignment of each plan (64 x the world's
 * ranks when they shard or cut the world's pieces), the same before the layout exists; the refusals (offloaded
 * weights on nodes of one GPU). */
#include "qt_config.h"
#include "qt_model.h"
#include "qt_partition.h"
#include "qt_plan.h"
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
                    qt_shard node, world;
                    qt_shard_init_world(&node, &L, g, r, 1, W);
                    qt_shard_init(&world, &L, W, 0, 1);
                    QT_EXPECT(node.total == world.total && node.n_buckets == world.n_buckets, "tied %d, %d nodes x %d: "
                              "total %zu / %zu, buckets %d / %d", tied, nodes, g, node.total, world.total, node.n_buckets,
                              world.n_buckets);
                    for (int b = 0; b < node.n_buckets && b < world.n_buckets; b++) {
                        QT_EXPECT(node.bucket[b + 1] == world.bucket[b + 1], "bucket %d ends at %zu, the world's at %zu", b,
                                  node.bucket[b + 1], world.bucket[b + 1]);
                        size_t off, len, st, at;
                        qt_shard_piece(&node, b, &off, &len, &st);
                        at = off;
                        for (int j = 0; j < nodes; j++) { /* world pieces r * nodes + j, back to back */
                            qt_shard wr;
                            size_t woff, wlen, wst;
                            qt_shard_init(&wr, &L, W, r * nodes + j, 1);
                            qt_shard_piece(&wr, b, &woff, &wlen, &wst);
                            QT_EXPECT(woff == at && wlen * nodes == len && wlen % 64 == 0, "%d nodes x %d, rank %d, bucket %d: "
                                      "world piece %d at %zu (+%zu), expected at %zu (+%zu)", nodes, g, r, b, r * nodes + j,
                                      woff, wlen, at, len / nodes);
                            at += wlen;
                        }
                    }
                }
                qt_layout_free(&L);
            }
        /* world = n_ranks is qt_shard_init */
        make_layout(tied, 128);
        qt_shard a, b;
        qt_shard_init(&a, &L, 2, 1, 1);
        qt_shard_init_world(&b, &L, 2, 1, 1, 2);
        QT_EXPECT(!memcmp(&a, &b, sizeof a), "qt_shard_init_world(world = n_ranks) differs from qt_shard_init");
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

static void test_node_plans(void) {
    make_layout(1, 64);
    qt_plan p;
    /* one GPU per node: a replicated rank, the world's per-layer buckets with ZeRO, no lookups */
    plan_of("parallel: {nodes: 2, zero: 1, overlap_comm: false}", 1, &p, 128);
    QT_EXPECT(p.parallel.dp == QT_DP_REPLICATED && p.parallel.n_ranks == 1 && p.parallel.nodes == 2 && p.parallel.world_pieces &&
              p.parallel.buckets && !p.parallel.lookups, "1 GPU x 2 nodes, zero 1: dp %d, ranks %d, nodes %d, world %d, "
              "buckets %d, lookups %d", (int)p.parallel.dp, p.parallel.n_ranks, p.parallel.nodes, p.parallel.world_pieces,
              p.parallel.buckets, p.parallel.lookups);
    plan_of("parallel: {nodes: 2, zero: 0, overlap_comm: false}", 1, &p, 64);
    QT_EXPECT(p.parallel.dp == QT_DP_REPLICATED && !p.parallel.world_pieces && !p.parallel.buckets, "zero 0: world %d buckets %d",
              p.parallel.world_pieces, p.parallel.buckets);
    plan_of("parallel: {nodes: 2, zero: 3}", 1, &p, 128); /* ZeRO over one GPU holds everything */
    QT_EXPECT(p.parallel.dp == QT_DP_REPLICATED && p.parallel.zero == 0 && !p.weights.slots && p.parallel.world_pieces,
              "zero 3 on nodes of 1 GPU: dp %d zero %d slots %d", (int)p.parallel.dp, p.parallel.zero, p.weights.slots);
    /* two GPUs per node: sharded in the node; lookups (which 2 ranks of 8 tokens pay here) off across nodes */
    plan_of("parallel: {nodes: 2, zero: 2}", 2, &p, 256);
    QT_EXPECT(p.parallel.dp == QT_DP_SHARDED && p.parallel.zero == 2 && p.parallel.world_pieces && !p.parallel.lookups,
              "2 GPUs x 2 nodes, zero 2: dp %d zero %d world %d lookups %d", (int)p.parallel.dp, p.parallel.zero,
              p.parallel.world_pieces, p.parallel.lookups);
    plan_of("parallel: {zero: 2}", 2, &p, 128); /* one machine: as before */
    QT_EXPECT(p.parallel.nodes == 1 && !p.parallel.world_pieces && p.parallel.lookups, "one machine: nodes %d world %d lookups %d",
              p.parallel.nodes, p.parallel.world_pieces, p.parallel.lookups);
    plan_of("parallel: {nodes: 2}", 0, &p, 64); /* a one-GPU plan (no ranks) never spans nodes */
    QT_EXPECT(p.parallel.dp == QT_DP_ONE && p.parallel.nodes == 1, "0 ranks: dp %d nodes %d", (int)p.parallel.dp, p.parallel.nodes);
    plan_of("parallel: {zero: 0}", 2, &p, 64);    /* replicated ranks: the compact layout */
    plan_of("parallel: {zero: 1}", 6, &p, 384);   /* 6 ranks: units at multiples of 384 */
    plan_of("parallel: {zero: 1}", -1, &p, 64);   /* the CPU */
    /* offloaded weights or gradients on nodes of one GPU are refused, naming the key */
    qt_config c;
    char err[512];
    const char *yaml = "model: {vocab_size: 259, hidden_size: 72, num_layers: 5, num_heads: 2, num_kv_heads: 1, "
                       "intermediate_size: 100, max_seq_len: 64}\ndata: {seq_len: 8}\nparallel: {nodes: 2, zero: 3}\n"
                       "memory: {offload: [weights]}\n";
    QT_REQUIRE(qt_config_load_string(&c, yaml, "o.yaml", NULL, 0, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(qt_plan_resolve(&c, &L, 1, &p, err, sizeof err) == -1 && strstr(err, "o.yaml: memory.offload") &&
                  strstr(err, "nodes of one GPU"), "%s", err);
    QT_EXPECT(qt_plan_resolve(&c, &L, 2, &p, err, sizeof err) == 0, "2 GPUs per node, zero 3: %s", err);
    qt_layout_free(&L);
}

int main(void) {
    QT_RUN(test_world_shard_pieces);
    QT_RUN(test_node_plans);
    return qt_test_end();
}
