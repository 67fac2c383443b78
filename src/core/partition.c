/* partition.c — buckets of whole layers and each rank's pieces of them (see qt_partition.h). */
#include "qt_partition.h"

#include <string.h>

#include "qt_error.h"

/* Appends a boundary at a unit's start, which must be a multiple of q (the layout padded for this world). */
static void cut(qt_shard *sh, const qt_layout *L, size_t at, size_t q) {
    QT_CHECK(at % q == 0, "shard: a unit starts at element %zu, not a multiple of %zu (64 x the world's ranks): the layout's "
             "unit alignment is %zu (qt_layout_init_units with 64 x the ranks)", at, q, L->unit_align);
    if (at > sh->bucket[sh->n_buckets]) sh->bucket[++sh->n_buckets] = at;
}

void qt_shard_init(qt_shard *sh, const qt_layout *L, int n_ranks, int rank, int per_layer) {
    qt_shard_init_nodes(sh, L, n_ranks, rank, per_layer, 1, 0);
}

void qt_shard_init_nodes(qt_shard *sh, const qt_layout *L, int n_ranks, int rank, int per_layer, int nodes, int node) {
    QT_CHECK(n_ranks >= 1 && n_ranks <= QT_SHARD_MAX_RANKS && rank >= 0 && rank < n_ranks && nodes >= 1 && node >= 0 &&
                 node < nodes, "shard: rank %d of %d ranks on node %d of %d (expected 1..%d ranks)", rank, n_ranks, node,
             nodes, QT_SHARD_MAX_RANKS);
    memset(sh, 0, sizeof *sh);
    size_t world = (size_t)n_ranks * (size_t)nodes, q = 64 * world; /* aligned vector loads in every world piece */
    sh->rank = rank * nodes + node;
    sh->n_ranks = (int)world;
    sh->nodes = nodes;
    sh->total = L->numel;
    sh->len = sh->total / world;
    /* Cuts at units' starts only: a bucket holds whole units, so it is final once the backward is done with its
     * first layer. The embeddings' bucket holds the embeddings alone: a sharded step sums it as soon as the LM
     * head's backward is done (qt_param_release_embed, qt_dp_sync.h). */
    if (per_layer) {
        int nl = L->cfg.num_layers, group = (nl + QT_SHARD_MAX_BUCKETS - 3) / (QT_SHARD_MAX_BUCKETS - 2);
        for (int l = 0; l < nl; l += group) cut(sh, L, L->layers[l].ln1, q);
        if (L->lm_head != L->embed) cut(sh, L, L->final_norm, q); /* a final norm alone is too small */
    }
    cut(sh, L, sh->total, q);
}

void qt_shard_piece(const qt_shard *sh, int b, size_t *off, size_t *len, size_t *state) {
    size_t w = (sh->bucket[b + 1] - sh->bucket[b]) / (size_t)sh->n_ranks;
    *off = sh->bucket[b] + (size_t)sh->rank * w;
    *len = w;
    *state = sh->bucket[b] / (size_t)sh->n_ranks;
}

int qt_shard_local_ranks(const qt_shard *sh) { return sh->n_ranks / sh->nodes; }

void qt_shard_local_piece(const qt_shard *sh, int b, size_t *off, size_t *len) {
    size_t w = (sh->bucket[b + 1] - sh->bucket[b]) / (size_t)qt_shard_local_ranks(sh);
    *off = sh->bucket[b] + (size_t)(sh->rank / sh->nodes) * w;
    *len = w;
}

size_t qt_shard_params(size_t off, size_t len, size_t numel) {
    return off >= numel ? 0 : numel - off < len ? numel - off : len;
}

int qt_shard_final_from(const qt_shard *sh, size_t from) {
    int b = sh->n_buckets;
    while (b > 0 && sh->bucket[b - 1] >= from) b--;
    return b;
}

int qt_shard_needed(const qt_shard *sh, size_t upto) {
    int b = 0;
    while (b < sh->n_buckets && sh->bucket[b] < upto) b++;
    return b;
}
