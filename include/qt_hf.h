/* qt_hf.h — Hugging Face interchange: config.json and model.safetensors (Qwen2, Llama or Mistral naming).
 *
 * Export writes <dir>/model.safetensors (fp32 or bf16, HF tensor names, the tied lm_head omitted)
 * and <dir>/config.json (model_type qwen2, llama or mistral, with the family's sliding-window keys) that
 * transformers loads. Import reads F32, BF16 or F16 tensors into the fp32 flat array, checking every
 * name, shape and that nothing is missing. */
#ifndef QT_HF_H
#define QT_HF_H

#include <stddef.h>

#include "qt_model.h"

/* Reads a config.json into cfg (every number checked: integers in range, floats finite and > 0 in
 * the float range; then qt_model_cfg_validate) (hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, intermediate_size, vocab_size, rope_theta or rope_parameters.rope_theta,
 * rms_norm_eps, tie_word_embeddings, max_position_embeddings, head_dim, model_type, and the RoPE scaling
 * of rope_scaling / rope_parameters: qt_hf_rope.h). Export writes a scaled RoPE as both rope_scaling
 * (transformers 4) and rope_parameters (transformers 5). */
int qt_hf_read_config(const char *path, qt_model_cfg *cfg, char *err, size_t errlen);
int qt_hf_write_config(const char *path, const qt_model_cfg *cfg, int bf16, char *err, size_t errlen);
/* Writes dir/model.safetensors and dir/config.json (creating dir), atomically each. */
int qt_hf_export(const char *dir, const qt_layout *L, const float *w, int bf16, char *err, size_t errlen);
/* Copies the tokenizer files of folder src that exist (tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, generation_config.json, and the slow tokenizers' vocab.json, merges.txt,
 * tokenizer.model, added_tokens.json) into dir, atomically each, so AutoTokenizer loads from the
 * export (src may also be a file in that folder, as init.from may be). required: src must hold tokenizer.json or tokenizer_config.json (else an error naming src).
 * Returns the number of files copied, or -1 with err. */
int qt_hf_export_tokenizer(const char *dir, const char *src, int required, char *err, size_t errlen);
/* 0 when folder src holds a readable tokenizer.json or tokenizer_config.json, else -1 with err. */
int qt_hf_check_tokenizer(const char *src, char *err, size_t errlen);
/* Reads an HF model into w[L->numel] (padding zeroed). path is a directory (its model.safetensors,
 * else the shards its model.safetensors.index.json names), a .safetensors file or an index.json.
 * Each file's header is checked before any data is read: known dtypes, integer shapes, data_offsets
 * in bounds, dtype-sized and tiling the data without gap or overlap. NaN or Inf weights are refused.
 * Errors name the file and tensor: "x/model.safetensors: model.layers.0.mlp.up_proj.weight:
 * expected shape [4864, 896], got [896, 4864]". */
int qt_hf_import(const char *path, const qt_layout *L, float *w, char *err, size_t errlen);
/* The same for the elements [lo, lo + n) of the flat array only, into w[0, n): every file's header is
 * read and checked, only the overlapping tensor pieces are read (import layer by layer, no fp32 copy of
 * the whole model). */
int qt_hf_import_range(const char *path, const qt_layout *L, size_t lo, size_t n, float *w, char *err, size_t errlen);
/* The config.json that goes with init.from's path (a directory, or a file inside one). Returns 0, or
 * -1 with err when it does not fit cap. */
int qt_hf_config_path(const char *from, char *out, size_t cap, char *err, size_t errlen);

#endif
