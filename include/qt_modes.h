/* qt_modes.h — the values of the mode keys (memory.recompute parts, memory.offload items, the fp8 weight
 * cache, the host allocation kind), shared by the config that reads them and the plan that carries them. */
#ifndef QT_MODES_H
#define QT_MODES_H

/* memory.recompute parts (bits), as given; qt_act_recompute_resolve (qt_plan.h) adds the implied ones */
typedef enum {
    QT_RC_SWIGLU = 1, QT_RC_NORM = 2, QT_RC_QKV = 4, QT_RC_ATT = 8, QT_RC_FFN = 16, QT_RC_BLOCK = 32
} qt_recompute_part;

/* memory.offload items (bits): what lives in pinned host memory */
typedef enum {
    QT_OFF_MASTER = 1, QT_OFF_M = 2, QT_OFF_V = 4, QT_OFF_GRADIENTS = 8, QT_OFF_QUANTS = 16, QT_OFF_WEIGHTS = 32,
    QT_OFF_RESIDUAL = 64
} qt_offload_item;
#define QT_OFF_OPTIMIZER (QT_OFF_MASTER | QT_OFF_M | QT_OFF_V)

/* memory.fp8_weight_cache: where the fp8 copies of the block weights (Wq, Wq^T) live between uses */
typedef enum {
    QT_FP8_WCACHE_ALL = 0,  /* every layer's copies stay on the GPU (requantized per persistent_quants) */
    QT_FP8_WCACHE_NONE = 1, /* two layer slots; each layer quantized into one right before its forward and again
                             * before its backward, from the scale of the cached path: the same bytes */
} qt_fp8_wcache;

/* memory.host_alloc: how the offloaded items' pinned host memory is allocated */
typedef enum {
    QT_HOST_PINNED = 0,   /* registered pages (qt_pinned.h): cached for the CPU (the checkpoint writer reads it in place) */
    QT_HOST_WRITE_COMBINED = 1, /* cudaHostAllocWriteCombined: faster PCIe transfers on some hosts, slow CPU reads */
} qt_host_alloc;

#endif
