/* qt_rope.h — RoPE frequencies of a model config: the one place that turns rope_theta and the scaling
 * parameters (qt_rope_cfg in qt_model.h) into the per-pair inverse frequencies and the cos/sin factor
 * that the CPU reference and the GPU table kernel both use. Exact to transformers' ROPE_INIT_FUNCTIONS
 * (modeling_rope_utils.py), computed in double. */
#ifndef QT_ROPE_H
#define QT_ROPE_H

#include <stddef.h>

#include "qt_model.h"

/* The rope_type names transformers uses, indexed by qt_rope_type. */
extern const char *const qt_rope_type_names[QT_ROPE_LLAMA3 + 1];

/* The qt_rope_type named s ("llama3"), or -1. */
int qt_rope_type_parse(const char *s);

/* Fills what transformers derives from the other keys: original_max_pos = max_seq_len when 0 (yarn,
 * llama3); clears truncate outside yarn. Called by qt_model_cfg_finish. */
void qt_rope_finish(qt_model_cfg *c);

/* Checks c->rope for c's head_dim. Returns 0, or -1 with a message that starts with the YAML key it
 * blames ("model.rope_factor: expected a finite number > 0 for rope_type llama3, got 0"). */
int qt_rope_validate(const qt_model_cfg *c, char *err, size_t errlen);

/* inv_freq[i], i < head_dim/2: the angle per position of rotary pair i; *attn: the factor cos and sin are
 * multiplied by (yarn; 1 otherwise). seq_len: the run's sequence length (positions 0 .. seq_len-1), which
 * dynamic NTK reads as transformers' forward does: a larger base only when seq_len > max_seq_len. */
void qt_rope_inv_freq(const qt_model_cfg *c, int seq_len, double *inv_freq, double *attn);

#endif
