/* qt_gpu_optim.h — AdamW over one GPU's pieces of the flat parameter array, in groups of buckets
 * updated one after the other (a sharded rank's bucket 0, whose weights the next forward reads first,
 * then the rest; one GPU offloaded: every bucket, so that each layer's next forward can start once its
 * own bucket is updated), with the
 * optimizer state — fp32 master weights, m and v — in device memory or, with
 * memory.offload_optimizer, in pinned host memory. Offloaded, the state streams through three device
 * slots on two copy streams: chunk k+1 comes up while chunk k is updated and chunk k-1 goes back
 * down, so the GPU holds only the slots and the copy engines move 12 bytes per parameter each way
 * per step (fp32 moments; 8 with bf16 ones). The arithmetic is qt_adamw_step's either way, so both
 * placements give the same bits. */
#ifndef QT_GPU_OPTIM_H
#define QT_GPU_OPTIM_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_dtype.h"
#include "qt_kernels.h"
#include "qt_plan.h"

typedef struct qt_gpu_optim qt_gpu_optim;

/* Which arrays are offloaded (host_mask bits): the same values as memory.offload's items. W: the bf16
 * weights and G: the gradients (g_dt) in pinned host memory, streamed with the state (the weights up and
 * down, the gradients up), indexed like the state (a ZeRO-3 rank's pieces, a ZeRO-2/3 rank's gradient
 * shard: w_at_state / g_at_state) or, with one GPU, by the flat index that is its state index too. */
enum { QT_OPTIM_MASTER = 1, QT_OPTIM_M = 2, QT_OPTIM_V = 4, QT_OPTIM_ALL = 7, QT_OPTIM_G = 8, QT_OPTIM_W = 32 };
/* Device bytes of the slots an offloaded state (of host_mask's arrays: fp32 master weights, m_dt / v_dt
 * moments, bf16 weights, g_dt gradients) streams through in chunks of `chunk` state elements (rounded up
 * to a multiple of 4). */
size_t qt_gpu_optim_slot_bytes(size_t chunk, int host_mask, qt_dtype m_dt, qt_dtype v_dt, qt_dtype g_dt);

/* t[0..n): this rank's tensor pieces in ascending state order; group k starts at entry start[k]
 * (start[0] == 0, ascending; a group may be empty). master, m, v: the state arrays (borrowed; master NULL:
 * none, AdamW updates the bf16 weights in place, precision.master_dtype bf16), all on the device when
 * slots is NULL; else those in host_mask in pinned host memory, streamed through slots (borrowed,
 * qt_gpu_optim_slot_bytes(chunk, host_mask, m_dt, v_dt, g_dt) of device memory), the others on the device,
 * read and written in place; host_mask's W and G: the w_bf16 and g of every step are in host memory too,
 * streamed alike. Makes its streams and events on the current device. */
qt_gpu_optim *qt_gpu_optim_create(const qt_adamw_tensor *t, int n, const int *start, int groups, float *master,
                                  void *m, qt_dtype m_dt, void *v, qt_dtype v_dt, qt_dtype g_dt, void *slots, size_t chunk,
                                  int host_mask);
void qt_gpu_optim_free(qt_gpu_optim *o);
int qt_gpu_optim_groups(const qt_gpu_optim *o);

/* AdamW of group k on s (w_bf16, g and grad_scale on the device unless streamed; see qt_adamw_step).
 * Offloaded, s waits after the last group (with streamed weights: after each group) until all of the
 * state is back in host memory, so whoever syncs s may read it. */
void qt_gpu_optim_step(qt_gpu_optim *o, int k, void *w_bf16, const void *g, qt_dtype g_dt, const float *grad_scale,
                       const qt_adamw_args *a, cudaStream_t s);

/* Offloaded: before chunk [lo, hi) of the state goes back down to host memory (zero copy, no slots: before
 * the group's update, which writes it there), wait(ctx, hi) runs on the calling thread and returns once
 * host state below hi may change (a checkpoint writer reads it in place: the state, and offloaded weights,
 * which stream with it). wait NULL: no wait. */
void qt_gpu_optim_set_guard(qt_gpu_optim *o, void (*wait)(void *ctx, size_t hi), void *ctx);

#endif
