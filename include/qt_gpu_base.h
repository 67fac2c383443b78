/* qt_gpu_base.h — a frozen base model on one GPU (LoRA): how its weights are held and handed to the model's ops.
 *
 * A frozen base has no gradient, no master copy and no optimizer state: only the weights, in whatever form the
 * placement keeps them. The model asks for the weight at a flat qt_layout index (a bf16 pointer its matmuls and
 * norms read) and never for a gradient. The placement is picked once from the plan (qt_gpu_base_create); one
 * file per implementation: bf16 resident (base_bf16.c), the block matrices a layer at a time in two bf16 slots
 * (base_nf4.c: NF4 on the GPU for QLoRA, or with memory.offload: [weights] NF4 or bf16 streamed from pinned host
 * memory through base_stream.c's per-layer store). The model calls layer() before a block's forward and before its backward (the recompute included), and
 * reads that block's matrices through w() until the next layer() call; the trainable parameters (the adapters) live
 * elsewhere (qt_gpu_lora.h). */
#ifndef QT_GPU_BASE_H
#define QT_GPU_BASE_H

#include <stddef.h>
#include <stdint.h>

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
    /* A streamed base's pinned host store (after init), which another rank's base of the same source may borrow
     * (qt_weight_src.base_host). NULL: the base is not streamed. */
    const struct qt_base_host *(*host)(const qt_gpu_base *b);
} qt_gpu_base_ops;

struct qt_gpu_base {
    const qt_gpu_base_ops *ops;
    const qt_layout *L;    /* borrowed */
    char id[160];          /* "crc32c <hex> numel <n>": the CRC-32C of the fp32 weights as read from the source, the
                            * identity a LoRA checkpoint records (the CPU LoRA engine's, bit for bit); a base drawn on
                            * the GPU (QT_WSRC_INIT_GPU): "init seed <s> std <x> numel <n>" */
};

/* The frozen base the plan asks for (plan->lora.rank > 0: lora.base_dtype bf16 or nf4; weights.host: streamed),
 * sized, nothing allocated; NULL when the plan trains the whole model (the parameter store holds the weights then). */
qt_gpu_base *qt_gpu_base_create(const qt_layout *L, const qt_plan *pl);
/* The resident bf16 placement (base_bf16.c). */
qt_gpu_base *qt_gpu_base_bf16_create(const qt_layout *L);
/* The per-layer placement (base_nf4.c): the blocks' q, k, v, o, gate, up, down in NF4 (nf4 1) or bf16 (nf4 0, stream
 * 1 only), the rest in bf16 on the GPU; stream: those matrices in pinned host memory, copied up a layer at a time
 * ahead of use (memory.offload: [weights]); path names the config in messages (borrowed). */
qt_gpu_base *qt_gpu_base_nf4_create(const qt_layout *L, int nf4, int stream, const char *path);

/* The initial weights a chunk at a time into device staging (base_fill.c): host kinds read on the host (their fp32
 * bytes into the CRC-32C of the base's id) and copied up; QT_WSRC_INIT_GPU drawn on the GPU (id: seed and std). */
typedef struct {
    const qt_weight_src *src; /* borrowed */
    float *host;              /* [chunk] pageable, the host kinds' (owned); NULL: drawn on the GPU */
    size_t chunk;
    uint32_t crc;
} qt_gpu_wsrc;
/* A reader of src in chunks of at most `chunk` elements. */
void qt_gpu_wsrc_open(qt_gpu_wsrc *r, const qt_weight_src *src, size_t chunk);
/* dev[0, n) = the weights [lo, lo + n), queued on s (chunks in order from 0: the CRC runs over them). 0, or -1 with err
 * (an HF file that cannot be read). */
int qt_gpu_wsrc_fill(qt_gpu_wsrc *r, size_t lo, size_t n, float *dev, cudaStream_t s, char *err, size_t errlen);
/* The base's identity into id ("crc32c <hex> numel <n>", or "init seed <s> std <x> numel <n>"); frees the buffer. */
void qt_gpu_wsrc_close(qt_gpu_wsrc *r, char *id, size_t cap);

/* A streamed base's per-layer store (base_stream.c): n_parts pinned host arrays, layer l's bytes of part p at
 * [lo[p][l], lo[p][l + 1]), and two device slots that each hold one layer's parts at at[p]. */
#define QT_BASE_HOST_PARTS 3
typedef struct qt_base_host {
    int n_parts, n_layers;
    size_t *lo[QT_BASE_HOST_PARTS];   /* [n_layers + 1] byte offsets, set by the owner before carve (owned) */
    size_t cap[QT_BASE_HOST_PARTS];   /* the largest layer's bytes of each part */
    size_t at[QT_BASE_HOST_PARTS];    /* each part's place in a slot (256-byte aligned) */
    size_t slot_bytes;                /* one slot */
    uint8_t *host[QT_BASE_HOST_PARTS]; /* pinned (in mem) */
    uint8_t *slot[2];                 /* device: carved here, or the owner's own (carve with slot_kind NULL) */
    void *mem;                        /* the one pinned allocation (owned; NULL when borrowed) */
    int borrowed;                     /* host[] are another store's arrays (qt_base_host_share): put() stores nothing */
} qt_base_host;

/* Empty offsets for n_parts parts of n_layers layers. */
void qt_base_host_init(qt_base_host *h, int n_parts, int n_layers);
/* Sizes the slots from lo[], adds the pinned row host_kind and (slot_kind not NULL) carves the two slots. */
void qt_base_host_carve(qt_base_host *h, qt_mem_plan *p, const char *host_kind, const char *slot_kind);
/* The pinned arrays (once the plan fits): 0, or -1 with err naming the config (path) and the way out. */
int qt_base_host_alloc(qt_base_host *h, const char *path, char *err, size_t errlen);
/* Instead of qt_base_host_alloc: host[] point at `from`'s arrays (another rank's store of the same layout and
 * source, filled), which outlive h and which h only reads: one pinned copy of the base for every data-parallel rank,
 * each copying its own layers into its own slots. 0, or -1 with err when the layouts differ. */
int qt_base_host_share(qt_base_host *h, const qt_base_host *from, char *err, size_t errlen);
/* The device address in slot k of byte off of part `part` (off within layer l's range). */
void *qt_base_host_slot(const qt_base_host *h, int k, int part, int l, size_t off);
/* Layer l's parts from slot 0 down into the host arrays (queued on s: the load, which synchronises); borrowed:
 * nothing (the owner stored them). */
void qt_base_host_put(qt_base_host *h, int l, cudaStream_t s);
/* Layer l's parts up into slot k (queued on s; the caller orders the slot's reuse). */
void qt_base_host_fetch(const qt_base_host *h, int l, int k, cudaStream_t s);
void qt_base_host_free(qt_base_host *h);

#endif
