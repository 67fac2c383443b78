/* qt_partition.h — how the flat parameter array is cut between data-parallel ranks.
 *
 * The array is cut into buckets at its units' starts (qt_model.h: the embeddings, each layer, the final norm
 * with the LM head), in the layout's order. The backward finishes the gradients from the
 * top of the array down, so a bucket's gradients are final as soon as the backward has passed its
 * first layer: it can be summed over the ranks while the backward goes on (parallel.overlap_comm).
 * The layout pads every unit to a multiple of 64 x the world's ranks (qt_layout_init_units), so every bucket is
 * one too and no tensor straddles two ranks' pieces; rank r holds the r-th of the n_ranks equal
 * pieces of every bucket (ZeRO-1): its optimizer state (master, m, v) keeps those pieces back to back,
 * so the piece of bucket b sits at state index bucket[b] / n_ranks. One bucket is one contiguous slice
 * per rank.
 *
 * Across nodes (parallel.nodes, docs/multi-node.md) the shard is the world's: n_ranks = the node's GPUs x nodes
 * pieces, and local GPU r of node k holds world piece r x nodes + k. The node's local piece r (what comm/ sums
 * and gathers between the node's GPUs) is world pieces [r x nodes, (r + 1) x nodes), back to back, so the
 * legs between nodes (a reduce-scatter of the local piece, an all-gather back into it) work in place. */
#ifndef QT_PARTITION_H
#define QT_PARTITION_H

#include <stddef.h>

#include "qt_model.h"

#define QT_SHARD_MAX_RANKS 8
#define QT_SHARD_MAX_BUCKETS 256

typedef struct qt_shard_s {
    size_t total;   /* the layout's numel: a multiple of 64 x the world's ranks */
    size_t len;     /* elements of optimizer state this rank holds: total / n_ranks */
    int rank, n_ranks; /* the world's: rank = local GPU x nodes + node */
    int nodes;         /* world pieces per local piece (1 on one machine) */
    int n_buckets;
    size_t bucket[QT_SHARD_MAX_BUCKETS + 1]; /* 0 = bucket[0] < ... < bucket[n_buckets] = total */
} qt_shard;

/* Rank `rank` of n_ranks (1..QT_SHARD_MAX_RANKS) on a layout of unit alignment 64 x n_ranks (a multiple of it;
 * else a failed QT_CHECK). per_layer: a bucket of embeddings only, one per layer
 * (consecutive layers share one past QT_SHARD_MAX_BUCKETS - 2 layers; the last one takes the final norm)
 * and one for an untied LM head with the final norm; else one bucket. */
void qt_shard_init(qt_shard *sh, const qt_layout *L, int n_ranks, int rank, int per_layer);
/* Local GPU `rank` of n_ranks on node `node` of nodes: world rank rank x nodes + node of n_ranks x nodes (the
 * layout's unit alignment a multiple of 64 x that), the buckets those of one process with every node's GPUs.
 * nodes 1 is qt_shard_init. */
void qt_shard_init_nodes(qt_shard *sh, const qt_layout *L, int n_ranks, int rank, int per_layer, int nodes, int node);
/* The node's GPUs (n_ranks / nodes) and this rank's local piece of bucket b, [*off, *off + *len): the world
 * pieces of its node's GPU, which hold this rank's piece at *off + node x its length. One machine: the piece. */
int qt_shard_local_ranks(const qt_shard *sh);
void qt_shard_local_piece(const qt_shard *sh, int b, size_t *off, size_t *len);

/* This rank's piece of bucket b: flat elements [*off, *off + *len), at state index *state. */
void qt_shard_piece(const qt_shard *sh, int b, size_t *off, size_t *len, size_t *state);

/* How many of the piece's elements [off, off + len) are parameters (below numel; the rest is padding). */
size_t qt_shard_params(size_t off, size_t len, size_t numel);

/* The lowest bucket whose gradients are all final once every gradient at flat index >= from is
 * (n_buckets when none is). */
int qt_shard_final_from(const qt_shard *sh, size_t from);

/* How many buckets (from bucket 0 up) hold the weights below flat index upto. */
int qt_shard_needed(const qt_shard *sh, size_t upto);

#endif
