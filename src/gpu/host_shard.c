/* host_shard.c — a rank's fp32 gradient shard in host memory: chunked adds, lazy clearing (qt_host_shard.h). */
#include "qt_host_shard.h"

#include <stdlib.h>

#include "qt_chunk_pipe.h"
#include "qt_error.h"
#include "qt_kernels.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

struct qt_host_shard {
    qt_chunk_pipe *pipe; /* owned */
    size_t chunk;        /* fp32 elements per slot */
    char *cleared;       /* [n_buckets] 1: the piece reads as zeros, whatever host memory holds (owned) */
    int n_buckets;
};

size_t qt_host_shard_slot_bytes(size_t chunk) { return QT_CHUNK_PIPE_SLOTS * chunk * 4; }

qt_host_shard *qt_host_shard_create(int n_buckets, float *slots, size_t chunk) {
    qt_host_shard *h = calloc(1, sizeof *h);
    QT_CHECK(h && chunk > 0, "host gradient shard: out of host memory or chunks of 0 elements");
    h->cleared = malloc((size_t)n_buckets + 1);
    QT_CHECK(h->cleared, "out of host memory");
    h->n_buckets = n_buckets;
    h->chunk = chunk;
    h->pipe = qt_chunk_pipe_create(slots, chunk * 4);
    qt_host_shard_clear(h, 0, n_buckets);
    return h;
}

void qt_host_shard_free(qt_host_shard *h) {
    if (!h) return;
    qt_chunk_pipe_free(h->pipe);
    free(h->cleared);
    free(h);
}

void qt_host_shard_add(qt_host_shard *h, int b, float *piece, const void *src, qt_dtype dt, size_t len, cudaStream_t s) {
    QT_CHECK(b >= 0 && b < h->n_buckets, "host gradient shard: bucket %d of %d", b, h->n_buckets);
    int cleared = h->cleared[b], skip_up = cleared, zero = cleared;
#ifdef QT_MUTANTS
    skip_up = skip_up || qt_mutant_on(QT_MUT_SHARD_CHUNK_NOT_UP);
    zero = zero && !qt_mutant_on(QT_MUT_CLEARED_CHUNK_NOT_ZEROED);
#endif
    size_t es = qt_dtype_size(dt);
    qt_chunk_pipe_begin(h->pipe, s);
    for (size_t i = 0; i < len; i += h->chunk) {
        size_t n = len - i < h->chunk ? len - i : h->chunk;
        float *d = qt_chunk_pipe_up(h->pipe, piece + i, skip_up ? 0 : n * 4, s);
        if (zero) qt_zero(d, n * 4, s); /* +0.0f, what the cleared piece holds: 0 + x as before */
        qt_add_inplace(d, QT_DT_F32, (const char *)src + i * es, dt, n, s);
        qt_chunk_pipe_down(h->pipe, piece + i, n * 4, s);
    }
    qt_chunk_pipe_end(h->pipe, s);
    h->cleared[b] = 0;
}

void qt_host_shard_clear(qt_host_shard *h, int k0, int k1) {
    for (int b = k0; b < k1; b++) h->cleared[b] = 1;
}

void qt_host_shard_fresh(qt_host_shard *h, int b, float *piece, size_t len, cudaStream_t s) {
    if (!h->cleared[b]) return;
    int no_zero = 0;
#ifdef QT_MUTANTS
    no_zero = qt_mutant_on(QT_MUT_CLEARED_PIECE_NOT_ZEROED);
#endif
    if (!no_zero) qt_fill(piece, QT_DT_F32, 0.0f, len, s); /* a kernel through the mapping: a few pieces */
    h->cleared[b] = 0;
}

int qt_host_shard_cleared(const qt_host_shard *h, int b) { return h->cleared[b]; }
