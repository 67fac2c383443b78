/* qt_place.h — where a parameter store's items live: one implementation per placement, chosen once from the plan
 * (src/gpu/place_<item>_<placement>.c; docs/memory.md draws each). The store calls them at its fixed points:
 * pinning host memory, carving the arena, zeroing before the load, freeing. */
#ifndef QT_PLACE_H
#define QT_PLACE_H

#include "qt_cuda_types.h"
#include <stddef.h>

#include "qt_mem_plan.h"
#include "qt_param_store.h"

/* The bf16 weights (and with weights.e4m3 their e4m3 codes): resident, in pinned host memory the GPU maps
 * (memory.offload: [weights]), ZeRO-3's rank pieces, or those pieces in pinned host memory. */
typedef struct qt_weights_place {
    /* the pinned host arrays (qt_param_store_alloc_host): 0, or -1 with err */
    int (*alloc_host)(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen);
    void (*carve)(qt_param_store *ps, qt_mem_plan *p); /* the arena's and the host plan's rows */
    void (*init_zero)(qt_param_store *ps, cudaStream_t s); /* before the load: the device array, padding included */
    void (*free_host)(qt_param_store *ps);
    int pieces; /* the rank holds ZeRO-3's pieces of the weights, not the whole array */
    int slots;  /* the model reads the weights from weight slots (gathered, or copied up from the host) */
} qt_weights_place;

extern const qt_weights_place qt_place_weights_resident, qt_place_weights_host, qt_place_weights_zero3,
    qt_place_weights_zero3_host;

/* The gradients: the whole array in the arena (grad_dt), ZeRO-2/3's fp32 shard of the rank's summed pieces in the
 * arena, or (memory.offload: [gradients]) either in pinned host memory the GPU maps. Every placement but the whole
 * array has the backward write gradient slots (param_store.c); the host ones load and store them. */
typedef struct qt_grads_place {
    /* the pinned host array (qt_param_store_alloc_host): 0, or -1 with err */
    int (*alloc_host)(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen);
    void (*carve)(qt_param_store *ps, qt_mem_plan *p);       /* the array's row (arena or host) */
    void (*carve_stage)(qt_param_store *ps, qt_mem_plan *p); /* after the load staging: a host shard's add chunks */
    void (*init_zero)(qt_param_store *ps, cudaStream_t s);       /* before training: the device array */
    /* qt_param_zero_grads: the gradients of buckets [k0, k1), on s */
    void (*clear)(qt_param_store *ps, int k0, int k1, cudaStream_t s);
    void (*get)(const qt_param_store *ps, float *g); /* qt_param_get_grads */
    void (*free_host)(qt_param_store *ps);
    const char *key; /* the config key that places them (errors) */
    int shard;       /* the rank keeps the fp32 sums of its pieces [shard.len], indexed like m and v */
    int slots;       /* the backward writes gradient slots (qt_param_g), not the array */
    int host;        /* the array lives in pinned host memory */
} qt_grads_place;

extern const qt_grads_place qt_place_grads_whole, qt_place_grads_zero2, qt_place_grads_zero3, qt_place_grads_host,
    qt_place_grads_host_shard;

/* The optimizer state (fp32 master unless bf16, AdamW m and v): resident in the arena, the arrays memory.offload
 * names in pinned host memory streamed through device slots, or (memory.zero_copy) read there by AdamW. */
typedef struct qt_opt_place {
    /* the pinned host state and the offloaded arrays' pointers into it: 0, or -1 with err */
    int (*alloc_host)(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen);
    void (*carve)(qt_param_store *ps, qt_mem_plan *p); /* the slots, the host row, the arrays left on the device */
    void (*init_zero)(qt_param_store *ps, cudaStream_t s); /* before the load: the device arrays */
    int (*streamed)(const qt_param_store *ps);         /* qt_gpu_optim's host_mask: what streams through the slots */
} qt_opt_place;

extern const qt_opt_place qt_place_opt_resident, qt_place_opt_streamed, qt_place_opt_zero_copy;

/* The placement of pl's weights, on a shard of n_ranks. */
const qt_weights_place *qt_place_weights_of(const qt_plan *pl, int n_ranks);
/* The placement of pl's gradients, on a shard of n_ranks. */
const qt_grads_place *qt_place_grads_of(const qt_plan *pl, int n_ranks);
/* The placement of ps's optimizer state; sets ps->host_opt's opt_host (the offloaded arrays that exist) and
 * host_state_bytes. */
const qt_opt_place *qt_place_opt_init(qt_param_store *ps);
/* g[0, numel) (host) = the fp32 gradients of the rank's pieces (a host shard's cleared pieces: 0). */
void qt_place_grads_get_pieces(const qt_param_store *ps, float *g);
/* g[0, numel) (host) = the whole gradient array's (grad_dt) exact fp32 values. */
void qt_place_grads_get_whole(const qt_param_store *ps, float *g);
/* The optimizer arrays not in host_mask (QT_OFF_MASTER | QT_OFF_M | QT_OFF_V) carved in the arena / zeroed on s. */
void qt_place_opt_carve_device(qt_param_store *ps, qt_mem_plan *p, int host_mask);
void qt_place_opt_zero_device(qt_param_store *ps, int host_mask, cudaStream_t s);
/* The offloaded arrays: host_opt.opt_host = mask (QT_OFF_MASTER | QT_OFF_M | QT_OFF_V) and their host_state_bytes. */
void qt_place_opt_set_host(qt_param_store *ps, int mask);
/* The offloaded arrays (host_opt.opt_host) in zeroed pinned host memory (QT_PIN_* flags), back to back in
 * host_state: 0, or -1 with err. */
int qt_place_opt_pin(qt_param_store *ps, unsigned pin_flags, char *err, size_t errlen);
/* The offloaded weights of n elements (and their e4m3 codes) in pinned host memory: 0, or -1 with err. */
int qt_place_weights_pin(qt_param_store *ps, size_t n, unsigned pin_flags, char *err, size_t errlen);
/* ZeRO-3's e4m3 gathers: the small params' send and receive buffers and the abs-maxes (arena rows). */
void qt_place_weights_e4m3_gather_carve(qt_param_store *ps, qt_mem_plan *p);
/* *p = bytes of zeroed pinned host memory (QT_PIN_* flags) for the store's key: 0, or -1 with err naming key, what
 * and the way out (instead). Mapped memory must have the same address on the device (unified addressing). */
int qt_place_pin(void **p, size_t bytes, unsigned flags, const char *key, const char *what, const char *instead,
                 const qt_param_store *ps, char *err, size_t errlen);

#endif
