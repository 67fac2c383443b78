/* qt_chunk_pipe.h — host memory worked on in device slots a chunk at a time, with the copies both ways beside
 * the work: chunk k comes up on the up stream while the worker stream works on chunk k-1 and chunk k-2 goes back
 * down on the down stream, through QT_CHUNK_PIPE_SLOTS device slots (a slot is refilled only after its last way
 * down; the down stream is in order, so the last chunk's way down covers every earlier one). The offloaded
 * optimizer state's stream (gpu_optim.c) and the offloaded gradient shard's per-micro-step add
 * (qt_param_grad_piece_add) run through one each.
 *
 * A chunk: qt_chunk_pipe_next (the slot; enqueue its copies up on the stream it gives), qt_chunk_pipe_ready
 * (the worker waits for them), the work on the worker stream, qt_chunk_pipe_done (enqueue the copies down on
 * the stream it gives), qt_chunk_pipe_back. qt_chunk_pipe_up / _down do that for one buffer each way. Test
 * hook (every pipe): stage_down_delay_ms sleeps on the down stream before each way down. */
#ifndef QT_CHUNK_PIPE_H
#define QT_CHUNK_PIPE_H

#include "qt_cuda_types.h"
#include <stddef.h>

#define QT_CHUNK_PIPE_SLOTS 3

typedef struct qt_chunk_pipe qt_chunk_pipe;

/* slots: borrowed device memory of QT_CHUNK_PIPE_SLOTS x slot_bytes. Makes its streams and events on the
 * current device. */
qt_chunk_pipe *qt_chunk_pipe_create(void *slots, size_t slot_bytes);
void qt_chunk_pipe_free(qt_chunk_pipe *p);
/* The up stream waits for worker stream s's work so far (host memory others wrote behind it: the last run's
 * ways down once qt_chunk_pipe_end made s wait for them, a kernel's output). */
void qt_chunk_pipe_begin(qt_chunk_pipe *p, cudaStream_t s);
/* The next slot, once its last way down is done; *up: the stream for its copies up. */
void *qt_chunk_pipe_next(qt_chunk_pipe *p, cudaStream_t *up);
/* Worker stream s waits for the current slot's copies up. */
void qt_chunk_pipe_ready(qt_chunk_pipe *p, cudaStream_t s);
/* The stream for the current slot's copies down, after s's work so far (then qt_chunk_pipe_back). */
cudaStream_t qt_chunk_pipe_done(qt_chunk_pipe *p, cudaStream_t s);
/* The current slot's way down ends after the copies enqueued since qt_chunk_pipe_done. */
void qt_chunk_pipe_back(qt_chunk_pipe *p);
/* s waits until every chunk is back in host memory. */
void qt_chunk_pipe_end(qt_chunk_pipe *p, cudaStream_t s);

/* One buffer each way: the next slot with `up` bytes (<= slot_bytes) copied into it from host, s waiting
 * for them (up 0: nothing copied, the slot holds what it held); then `bytes` of the slot back to
 * host after s's work. */
void *qt_chunk_pipe_up(qt_chunk_pipe *p, const void *host, size_t up, cudaStream_t s);
void qt_chunk_pipe_down(qt_chunk_pipe *p, void *host, size_t bytes, cudaStream_t s);

#endif
