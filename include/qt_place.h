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
    void (*zero)(qt_param_store *ps, cudaStream_t s);  /* before the load: the device array, padding included */
    void (*free_host)(qt_param_store *ps);
    int pieces; /* the rank holds ZeRO-3's pieces of the weights, not the whole array */
    int slots;  /* the model reads the weights from weight slots (gathered, or copied up from the host) */
} qt_weights_place;

extern const qt_weights_place qt_place_weights_resident, qt_place_weights_host, qt_place_weights_zero3,
    qt_place_weights_zero3_host;

/* The placement of pl's weights. */
const qt_weights_place *qt_place_weights_of(const qt_plan *pl);
/* The offloaded weights of n elements (and their e4m3 codes) in pinned host memory: 0, or -1 with err. */
int qt_place_weights_pin(qt_param_store *ps, size_t n, unsigned pin_flags, char *err, size_t errlen);
/* ZeRO-3's e4m3 gathers: the small params' send and receive buffers and the abs-maxes (arena rows). */
void qt_place_weights_e4m3_gather_carve(qt_param_store *ps, qt_mem_plan *p);
/* *p = bytes of zeroed pinned host memory (QT_PIN_* flags) for the store's key: 0, or -1 with err naming key, what
 * and the way out (instead). Mapped memory must have the same address on the device (unified addressing). */
int qt_place_pin(void **p, size_t bytes, unsigned flags, const char *key, const char *what, const char *instead,
                 const qt_param_store *ps, char *err, size_t errlen);

#endif
