/* fuzz_tiny.h — the tiny model the safetensors harness imports into (and seeds.c exports). */
#ifndef QT_FUZZ_TINY_H
#define QT_FUZZ_TINY_H

#include "qt_model.h"

/* qwen2, untied: every tensor kind, biases included; 8 x 8 embeddings. */
static inline qt_model_cfg fuzz_tiny_cfg(void) {
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 8, .hidden_size = 8, .num_layers = 1, .num_heads = 2,
                      .num_kv_heads = 1, .intermediate_size = 8, .max_seq_len = 16, .rope_theta = 10000.0f,
                      .rms_norm_eps = 1e-6f, .qkv_bias = 1};
    return c;
}

#endif
