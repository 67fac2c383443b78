/* qt_small_params.h — parallel.gather_dtype e4m3 (ZeRO-3): which elements of a bucket travel in bf16.
 *
 * With e4m3 gathers a layer bucket's block matrices (Wqkv, Wo, gate|up, down) move as fp8 codes; every
 * other element of the bucket (the norms, the qkv bias, padding: the "small params", a few thousand per
 * layer) must still arrive as bf16. They lie in every rank's piece in pieces of their own, so each rank
 * packs its piece's small elements back to back (its segments, in flat order) into a buffer of P_b
 * elements (the most any rank has in bucket b), the buffers are all-gathered, and each rank's segments
 * are copied from its part of the result into the bucket's bf16 slot. A layer bucket holds whole layers
 * (the buckets are cut at units' starts, qt_partition.h); a bucket that a block matrix crosses stays bf16, as
 * do the buckets with table or final-norm elements. */
#ifndef QT_SMALL_PARAMS_H
#define QT_SMALL_PARAMS_H

#include <stddef.h>

#include "qt_model.h"
#include "qt_partition.h"

typedef struct {
    size_t off, len; /* flat elements [off, off + len) */
} qt_flat_range;

typedef struct {
    int n_buckets, n_ranks;
    int *layer_bucket;          /* [n_buckets] 1: a layer bucket whose matrices can travel as e4m3 */
    size_t *packed;             /* [n_buckets] P_b: each rank's packed buffer, elements */
    int *n_seg;                 /* [n_buckets * n_ranks] rank r's segments in bucket b */
    qt_flat_range **seg;        /* [n_buckets * n_ranks] those segments, ascending (owned) */
    size_t max_packed;          /* the largest P_b */
} qt_small_params;

/* The map for layout L cut as sh. 0 (err is for future refusals). */
int qt_small_params_init(qt_small_params *m, const qt_layout *L, const qt_shard *sh, char *err, size_t errlen);
void qt_small_params_free(qt_small_params *m);
/* Layer l's block matrices (Wqkv, Wo, gate|up, down) as flat [lo[k], hi[k]). */
void qt_small_matrices(const qt_layout *L, int l, size_t lo[4], size_t hi[4]);
/* Whether flat element x lies in one of layer l's four block matrices. */
int qt_small_in_matrix(const qt_layout *L, int l, size_t x);

#endif
