/* qt_hf_rope.h — RoPE scaling in HF config.json: rope_scaling (transformers 4, the hub's Llama 3.1 and
 * Qwen3 files) and rope_parameters (transformers 5) read into qt_rope_cfg, and written back. */
#ifndef QT_HF_ROPE_H
#define QT_HF_ROPE_H

#include <stddef.h>

#include "qt_json.h"
#include "qt_model.h"

/* Reads root's rope_scaling and rope_parameters (either may be absent or null: the default RoPE). Both given:
 * they must mean the same. Refuses an unknown rope_type, a missing required parameter and
 * partial_rotary_factor != 1, naming path and the key ("cfg.json: rope_scaling.rope_type: expected ...").
 * yarn's mscale / mscale_all_dim become attention_factor as transformers derives it. Returns 0 or -1. */
int qt_hf_read_rope(const char *path, const qt_json_node *root, qt_rope_cfg *out, char *err, size_t errlen);

/* One rope dict x (the object at key path `dict`, for messages; absent or null: the default), the checks above. */
int qt_hf_read_rope_dict(const char *path, const char *dict, const qt_json_node *x, qt_rope_cfg *out, char *err,
                         size_t errlen);

/* The members of r's JSON object without braces ("\"rope_type\": \"llama3\", \"factor\": 8.0, ..."), the
 * parameters r's type uses, with transformers' names. Returns the length, or -1 when cap is too small. */
int qt_hf_rope_json(char *buf, size_t cap, const qt_rope_cfg *r);

#endif
