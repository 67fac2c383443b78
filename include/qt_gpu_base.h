/* qt_gpu_base.h — a frozen base model on one GPU (LoRA): how its weights are held and handed to the model's ops.
 *
 * A frozen base has no gradient, no master copy and no optimizer state: only the weights, in whatever form the
 * placement keeps them. The model asks for the weight at a flat qt_layout index (a bf16 pointer its matmuls and
 * norms read) and never for a gradient. The placement is picked once from the plan (qt_gpu_base_create); one
 * file per implementation: bf16 resident (base_bf16.c), NF4 block matrices with a per-layer bf16 slot (base_nf4.c:
 * QLoRA). The model calls layer() before a block's forward and before its backward (the recompute included), and
 * reads that block's matrices through w() until the next layer() call; the trainable parameters (the adapters) live
 * elsewhere (qt_gpu_lora.h). */
#ifndef QT_GPU_BASE_H
#define QT_GPU_BASE_H

#include <stddef.h>

#include "qt_cuda_types.h"
#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_plan.h"
#include "qt_weight_src.h"

typedef struct qt_gpu_base qt_gpu_base;

typedef struct {
    const char *name;
    /* Adds the placement's rows to p (sizing pass, its pointers NULL) or takes its buffers (second pass). */
    void (*carve)(qt_gpu_base *b, qt_mem_plan *p);
    /* Once the arena exists: the weights from src, a chunk at a time, on s (returns synchronised); sets id. 0, or
     * -1 with err when the source cannot be read. */
    int (*init)(qt_gpu_base *b, const qt_weight_src *src, cudaStream_t s, char *err, size_t errlen);
    /* The bf16 weight at flat index off, where the model's ops read it (device). */
    void *(*w)(const qt_gpu_base *b, size_t off);
    /* w[0, L->numel) (host fp32) = the weights as the model computes with them (synchronous). */
    void (*get)(const qt_gpu_base *b, float *w);
    void (*free)(qt_gpu_base *b);
    /* Makes block l's matrices readable through w() (work queued on s); the other blocks' matrices are not until
     * their own call. NULL: every weight is always readable (bf16 resident). */
    void (*layer)(qt_gpu_base *b, int l, cudaStream_t s);
} qt_gpu_base_ops;

struct qt_gpu_base {
    const qt_gpu_base_ops *ops;
    const qt_layout *L;    /* borrowed */
    char id[160];          /* "crc32c <hex> numel <n>": the CRC-32C of the fp32 weights as read from the source, the
                            * identity a LoRA checkpoint records (the CPU LoRA engine's, bit for bit) */
};

/* The frozen base the plan asks for (plan->lora.rank > 0: lora.base_dtype bf16 or nf4), sized, nothing allocated;
 * NULL when the plan trains the whole model (the parameter store holds the weights then). */
qt_gpu_base *qt_gpu_base_create(const qt_layout *L, const qt_plan *pl);
/* The resident bf16 placement (base_bf16.c). */
qt_gpu_base *qt_gpu_base_bf16_create(const qt_layout *L);
/* The NF4 placement (base_nf4.c): the blocks' q, k, v, o, gate, up, down in NF4, the rest in bf16. */
qt_gpu_base *qt_gpu_base_nf4_create(const qt_layout *L);

#endif
