/* qt_weight_src.h — where a run's initial weights come from, read a range of the flat parameter array
 * at a time: the seeded init (init.seed, init.std), an HF import (init.from) or a host array (tests,
 * tools). No fp32 copy of the whole model is made at start: each engine fills its own buffers from the
 * source, QT_WSRC_CHUNK elements at a time (the GPU engine through its upload staging); every range
 * is bit-identical to the same part of the whole array. */
#ifndef QT_WEIGHT_SRC_H
#define QT_WEIGHT_SRC_H

#include <stddef.h>
#include <stdint.h>

#include "qt_config.h"
#include "qt_model.h"

#define QT_WSRC_CHUNK ((size_t)16 << 20) /* elements per fill: 64 MiB of pageable fp32 on the host */

typedef enum {
    QT_WSRC_INIT,  /* N(0, std) matrices, ones for norms, zero biases (qt_layout_init_range) */
    QT_WSRC_HF,    /* safetensors at path (qt_hf_import_range) */
    QT_WSRC_ARRAY, /* w[L->numel] (borrowed) */
    QT_WSRC_INIT_GPU, /* INIT, drawn on the GPU where an engine can (a frozen LoRA base: qt_gpu_wsrc_fill), the host's
                       * values up to a last-bit difference about once in 10^9 (cuda/init.cu); the bench's start-up,
                       * never a run compared with another; elsewhere it fills as INIT */
} qt_wsrc_kind;

typedef struct {
    qt_wsrc_kind kind;
    const qt_layout *L;  /* borrowed */
    uint64_t seed;       /* INIT */
    float std;           /* INIT */
    char path[QT_PATH_MAX]; /* HF */
    const float *w;      /* ARRAY */
    const struct qt_base_host *base_host; /* a streamed frozen base's pinned copy already made from this source by
                                           * another data-parallel rank (qt_gpu_base.h), which a LoRA rank's streamed
                                           * base borrows instead of pinning its own; NULL: none */
} qt_weight_src;

/* The source a config names: init.from's safetensors, else the seeded init. */
void qt_weight_src_of_config(qt_weight_src *s, const qt_layout *L, const qt_config *cfg);
/* A source reading w[L->numel] (borrowed). */
qt_weight_src qt_weight_src_array(const qt_layout *L, const float *w);
/* dst[0, n) = the initial weights [off, off + n). 0, or -1 with err (an HF file that cannot be read). */
int qt_weight_src_fill(const qt_weight_src *s, size_t off, size_t n, float *dst, char *err, size_t errlen);
/* Elements of one fill buffer for this layout: min(numel, QT_WSRC_CHUNK). */
size_t qt_weight_src_chunk(const qt_layout *L);

#endif
