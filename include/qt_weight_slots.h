/* qt_weight_slots.h — ZeRO-3 (parallel.zero: 3) and offloaded weights: the device slots a rank gathers or
 * copies the whole bf16 weights of a bucket into while the model reads them; the rank itself keeps only
 * its pieces (qt_shard) or a host array. Two shared slots for the layers (one read while the next is
 * prefetched), slots of their own for the embedding and LM-head buckets, and the free/filled events that
 * order gathers and reads: docs/memory.md ("Weights"). Each unit (qt_model.h) lies whole in one bucket, its
 * home: the buckets are cut at units' starts (qt_partition.h). */
#ifndef QT_WEIGHT_SLOTS_H
#define QT_WEIGHT_SLOTS_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_partition.h"

#define QT_WSLOTS 2

typedef struct qt_weight_slots qt_weight_slots;

/* How the slots are filled, per call of qt_wslots_acquire: gather(ctx, b, dst, dst8, s) enqueues on s the
 * all-gather of bucket b's whole bf16 weights into dst[bucket[b+1] - bucket[b]] (with dst8, the shared
 * slot's e4m3 half: its block matrices' codes there and only the rest into dst). Gathers go to `side`
 * (== model: no prefetch, each gather right before its reads). Test hook read_delay_ms > 0: the model
 * stream sleeps that long after each acquire (qt_test_hooks.h). */
typedef struct {
    void (*gather)(void *ctx, int b, void *dst, void *dst8, cudaStream_t s);
    void *ctx;
    cudaStream_t model, side;
    long *read_delay_ms;
} qt_wslots_io;

/* The slots of layout L cut as sh (host side, sizes only; NULL never: failures are QT_CHECKs, a unit that runs
 * past its bucket among them). */
qt_weight_slots *qt_wslots_create(const qt_layout *L, const qt_shard *sh);
void qt_wslots_free(qt_weight_slots *ws);
/* parallel.gather_dtype e4m3: each shared slot gets an e4m3 half of the largest such bucket's elements
 * (row "weight slots (e4m3)"), handed to the gather as dst8. Before qt_wslots_carve. */
void qt_wslots_use_e4m3(qt_weight_slots *ws);
/* Adds the rows "weight slots (layers)" (QT_WSLOTS shared slots) and "weight slots (emb/head)" to p, or takes
 * their addresses (second pass). */
void qt_wslots_carve(qt_weight_slots *ws, qt_mem_plan *p);
/* Makes the events on the current device (once the slots have addresses). */
void qt_wslots_start(qt_weight_slots *ws);

/* The home bucket of the unit holding flat element off (off >= numel: the last unit). */
int qt_wslots_home(const qt_weight_slots *ws, size_t off);
/* 1 when bucket b has a slot of its own (home to the embedding table or the untied LM head). */
int qt_wslots_own(const qt_weight_slots *ws, int b);
/* Bytes of one shared slot / of bucket b's own slot (the alignment pad included). */
size_t qt_wslots_slot_bytes(const qt_weight_slots *ws, int b);

/* Where the model reads flat element off: in the slot of its unit's home bucket, which must hold it
 * (acquired). */
void *qt_wslots_addr(const qt_weight_slots *ws, size_t off);
/* The e4m3 code of flat element off (a block matrix's, in its home bucket) in the shared slot holding it. */
void *qt_wslots_addr8(const qt_weight_slots *ws, size_t off);
/* Own bucket b's data (bucket[b+1] - bucket[b] elements): where the caller gathers it after AdamW. */
void *qt_wslots_own_data(const qt_weight_slots *ws, int b);
/* The caller gathered own bucket b into its slot on s: recorded; the next acquire waits for it. */
void qt_wslots_filled(qt_weight_slots *ws, int b, cudaStream_t s);
/* The model's next ops (enqueued on io->model) read the units homed in bucket b; dir +1 in the forward,
 * -1 in the backward (the prefetch direction). Gathers b if no slot holds it, waits for its gather, then
 * gathers the next bucket in dir into the other shared slot. */
void qt_wslots_acquire(qt_weight_slots *ws, const qt_wslots_io *io, int b, int dir);
/* The rank's pieces changed (AdamW, a load): no shared slot is valid any more. */
void qt_wslots_invalidate(qt_weight_slots *ws);
/* Shared slot 0's memory as the caller's scratch: *bytes of room for bf16 data, and its e4m3 half (*codes,
 * *codes_bytes; NULL and 0 without qt_wslots_use_e4m3). Only between qt_wslots_invalidate and the next
 * acquire, on a stream that follows the slot's last readers and gathers. */
void *qt_wslots_scratch(const qt_weight_slots *ws, size_t *bytes, void **codes, size_t *codes_bytes);

#endif
