/* qt_host_shard.h — a ZeRO-2/3 rank's fp32 gradient shard in pinned host memory (memory.offload: [gradients]):
 * the adds into it and its clearing.
 *
 * Each micro-step's summed piece of a bucket is added into the shard a chunk at a time in device slots (a
 * qt_chunk_pipe: the copy engines bring the chunk up, the add kernel runs there, the chunk goes back down
 * while the next comes up; a kernel adding through the mapping runs at ~16 GB/s with four GPUs at once, the
 * copy engines at 33-40 GB/s each way).
 *
 * Clearing the shard after AdamW costs no pass over host memory: the buckets are only marked cleared, and a
 * cleared piece's first add of the next step zeroes the device slot instead of bringing the chunk up, then
 * adds there as always (0 + x: the same kernel on the same values, so the same bits, and no chunk comes up).
 * Clearing 14 GB per rank through the mapping would take 1.86 s, 13% of the 4-card 14B box's step. Any
 * other writer (the embedding lookups' add through the mapping, the non-finite test hook) and any
 * reader (the norm, AdamW, get_grads) must see zeros: qt_host_shard_fresh zeroes a piece that is still
 * marked, in host memory, first.
 *
 * The marks are host state, changed as the work is enqueued: one thread enqueues all of a shard's work, in
 * the order the streams run it (each rank's thread does). */
#ifndef QT_HOST_SHARD_H
#define QT_HOST_SHARD_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_dtype.h"

typedef struct qt_host_shard qt_host_shard;

/* Device bytes of the slots for chunks of `chunk` fp32 elements (the caller carves them). */
size_t qt_host_shard_slot_bytes(size_t chunk);
/* n_buckets pieces, every one marked cleared; slots: borrowed device memory of qt_host_shard_slot_bytes(chunk).
 * Makes its pipe's streams on the current device. */
qt_host_shard *qt_host_shard_create(int n_buckets, float *slots, size_t chunk);
void qt_host_shard_free(qt_host_shard *h);

/* Bucket b's piece[0, len) (pinned host) += src[len] (device, dt), on s; s goes on once the piece is back in
 * host memory. */
void qt_host_shard_add(qt_host_shard *h, int b, float *piece, const void *src, qt_dtype dt, size_t len, cudaStream_t s);
/* Marks buckets [k0, k1) cleared. */
void qt_host_shard_clear(qt_host_shard *h, int k0, int k1);
/* Bucket b's piece[0, len) zeroed in host memory on s if it is marked cleared (then no longer marked). */
void qt_host_shard_fresh(qt_host_shard *h, int b, float *piece, size_t len, cudaStream_t s);
/* Whether bucket b's piece is marked cleared (it reads as zeros). */
int qt_host_shard_cleared(const qt_host_shard *h, int b);

#endif
