/* qt_hf_gemma.h — Gemma 3's HF config.json and tensor names (src/io/hf_gemma.c); qt_hf.h's read and write
 * calls come here for model_type "gemma3_text" / "gemma3" and arch gemma3. */
#ifndef QT_HF_GEMMA_H
#define QT_HF_GEMMA_H

#include <stddef.h>

#include "qt_json.h"
#include "qt_model.h"

/* Fills c (arch gemma3, not yet finished or validated) from root, a config.json whose model_type is
 * "gemma3_text", or "gemma3" with the text model under text_config. Refuses another activation,
 * attention_bias, use_bidirectional_attention and layer_types that no window_pattern gives, naming path
 * and the key. Returns 0 or -1. */
int qt_hf_gemma_read_config(const char *path, const qt_json_node *root, qt_model_cfg *c, char *err, size_t errlen);

/* Gemma3ForCausalLM's config.json text of c (validated, arch gemma3) into buf: the older top-level RoPE keys
 * and transformers 5's rope_parameters per layer type, layer_types and sliding_window_pattern. Returns the
 * length, or -1 when cap is too small. */
int qt_hf_gemma_config_json(char *buf, size_t cap, const qt_model_cfg *c, int bf16);

/* The text model's name of a Gemma3ForConditionalGeneration tensor: "language_model.model.X" and
 * "model.language_model.X" become "model.X", others stay; *skip = 1 for the vision tower and projector. */
void qt_hf_gemma_text_name(char *out, size_t cap, const char *name, int *skip);

#endif
