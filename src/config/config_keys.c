/* config_keys.c — the config key table and per-key parse, format, range text, defaults and docs.
 *
 * Everything that knows a key's type, range or default reads it from keys[] below; config.c walks the
 * YAML and calls in here, so adding a key is adding one row (and its README row, which a test checks). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qt_config.h"
#include "qt_comm.h"
#include "qt_dtype.h"

_Static_assert(sizeof(qt_sched_kind) == sizeof(int) && sizeof(qt_device_kind) == sizeof(int) &&
                   sizeof(qt_arch) == sizeof(int) && sizeof(qt_ckpt_offload) == sizeof(int) &&
                   sizeof(qt_rope_type) == sizeof(int),
               "enum keys are stored as int");

static const qt_key_enum arch_names[] = {
    {"qwen2", QT_ARCH_QWEN2}, {"llama", QT_ARCH_LLAMA}, {"qwen3", QT_ARCH_QWEN3}, {"mistral", QT_ARCH_MISTRAL},
    {"gemma3", QT_ARCH_GEMMA3}, {NULL, 0}};
static const qt_key_enum rope_names[] = {{"default", QT_ROPE_DEFAULT}, {"linear", QT_ROPE_LINEAR},
                                         {"dynamic", QT_ROPE_DYNAMIC}, {"yarn", QT_ROPE_YARN},
                                         {"llama3", QT_ROPE_LLAMA3},    {NULL, 0}};
static const qt_key_enum sched_names[] = {
    {"cosine", QT_SCHED_COSINE}, {"linear", QT_SCHED_LINEAR}, {"wsd", QT_SCHED_WSD}, {NULL, 0}};
static const qt_key_enum device_names[] = {
    {"auto", QT_DEVICE_AUTO}, {"cpu", QT_DEVICE_CPU}, {"cuda", QT_DEVICE_CUDA}, {NULL, 0}};
static const qt_key_enum comm_names[] = {{"auto", QT_COMM_AUTO},
                                         {"peer", QT_COMM_PEER},
                                         {"host", QT_COMM_HOST},
                                         {"host_wc", QT_COMM_HOST_WC},
                                         {NULL, 0}};
/* fp32 GPU weights are not implemented: the GPU path trains bf16 weights (fp32 master copy) and the
 * CPU path fp32, so the key takes bf16 only and a config asking for fp32 is refused when read. */
static const qt_key_enum model_dtype_names[] = {{"bf16", QT_DT_BF16}, {NULL, 0}};
static const qt_key_enum f32_bf16_names[] = {{"fp32", QT_DT_F32}, {"bf16", QT_DT_BF16}, {NULL, 0}};
static const qt_key_enum matmul_names[] = {{"bf16", QT_DT_BF16}, {"e4m3", QT_DT_E4M3}, {NULL, 0}};
static const qt_key_enum grad_names[] = {
    {"e4m3", QT_DT_E4M3}, {"e5m2", QT_DT_E5M2}, {"bf16", QT_DT_BF16}, {NULL, 0}};
static const qt_key_enum plan_names[] = {{"manual", 0}, {"auto", 1}, {NULL, 0}};
static const qt_key_enum fp8_wcache_names[] = {{"all", QT_FP8_WCACHE_ALL}, {"none", QT_FP8_WCACHE_NONE}, {NULL, 0}};
static const qt_key_enum gather_names[] = {{"bf16", QT_DT_BF16}, {"e4m3", QT_DT_E4M3}, {NULL, 0}};
static const qt_key_enum host_alloc_names[] = {{"pinned", QT_HOST_PINNED}, {"write_combined", QT_HOST_WRITE_COMBINED}, {NULL, 0}};
static const qt_key_enum export_names[] = {{"fp32", 0}, {"bf16", 1}, {NULL, 0}};
static const qt_key_enum ckpt_offload_names[] = {
    {"auto", QT_CKPT_OFFLOAD_AUTO}, {"copy", QT_CKPT_OFFLOAD_COPY}, {"in_place", QT_CKPT_OFFLOAD_IN_PLACE}, {NULL, 0}};
static const qt_key_enum offload_names[] = {{"master", QT_OFF_MASTER},   {"m", QT_OFF_M},
                                            {"v", QT_OFF_V},             {"gradients", QT_OFF_GRADIENTS},
                                            {"quants", QT_OFF_QUANTS},   {"weights", QT_OFF_WEIGHTS},
                                            {"residual", QT_OFF_RESIDUAL}, {NULL, 0}};
static const qt_key_enum attention_names[] = {
    {"auto", QT_DOCS_AUTO}, {"document", QT_DOCS_DOCUMENT}, {"causal", QT_DOCS_WINDOW}, {NULL, 0}};
static const qt_key_enum positions_names[] = {
    {"auto", QT_DOCS_AUTO}, {"document", QT_DOCS_DOCUMENT}, {"window", QT_DOCS_WINDOW}, {NULL, 0}};
static const qt_key_enum lora_target_names[] = {{"q", QT_LORA_Q},       {"k", QT_LORA_K},   {"v", QT_LORA_V},
                                                {"o", QT_LORA_O},       {"gate", QT_LORA_GATE},
                                                {"up", QT_LORA_UP},     {"down", QT_LORA_DOWN}, {NULL, 0}};
static const qt_key_enum lora_extra_names[] = {
    {"embeddings", QT_LORA_X_EMBED}, {"lm_head", QT_LORA_X_LM_HEAD}, {"norms", QT_LORA_X_NORMS}, {NULL, 0}};
static const qt_key_enum lora_export_names[] = {{"adapter", 0}, {"merged", 1}, {NULL, 0}};
static const qt_key_enum lora_base_names[] = {{"bf16", 0}, {"nf4", 1}, {NULL, 0}};
static const qt_key_enum objective_names[] = {{"lm", QT_OBJ_LM}, {"dpo", QT_OBJ_DPO}, {NULL, 0}};
static const qt_key_enum recompute_names[] = {{"swiglu", QT_RC_SWIGLU}, {"norm", QT_RC_NORM}, {"qkv", QT_RC_QKV},
                                              {"att", QT_RC_ATT},       {"ffn", QT_RC_FFN},   {"block", QT_RC_BLOCK},
                                              {NULL, 0}};

#define OFF(f) offsetof(qt_config, f)
#define NOLO (-HUGE_VAL)
#define NOHI HUGE_VAL
/* Row builders: I(nt) range [lo, hi]; F(loat) with open/closed bounds; B(ool), S(tring), E(num), U64. */
#define I(p, f, lo, hi, d, u, m, h) {p, QT_KEY_INT, OFF(f), lo, hi, 0, 0, NULL, d, u, m, h}
#define F(p, f, lo, hi, lo_o, hi_o, d, u, m, h) {p, QT_KEY_FLOAT, OFF(f), lo, hi, lo_o, hi_o, NULL, d, u, m, h}
#define U64(p, f, d, u, h) {p, QT_KEY_U64, OFF(f), NOLO, NOHI, 0, 0, NULL, d, u, 0, h}
#define B(p, f, d, u, m, h) {p, QT_KEY_BOOL, OFF(f), NOLO, NOHI, 0, 0, NULL, d, u, m, h}
#define S(p, f, d, u, h) {p, QT_KEY_STRING, OFF(f), NOLO, NOHI, 0, 0, NULL, d, u, 0, h}
#define E(p, f, n, d, u, m, h) {p, QT_KEY_ENUM, OFF(f), NOLO, NOHI, 0, 0, n, d, u, m, h}
#define IL(p, f, lo, hi, d, u, h) {p, QT_KEY_INT_LIST, OFF(f), lo, hi, 0, 0, NULL, d, u, 0, h}
#define NL(p, f, n, d, u, h) {p, QT_KEY_NAME_LIST, OFF(f), NOLO, NOHI, 0, 0, n, d, u, 0, h}

static const qt_config_key keys[] = {
    U64("seed", seed, "1234", "all", "seeds the data order (and, on the GPU, stochastic rounding)"),
    E("device", device, device_names, "auto", "all", 0,
      "where to train; auto = cuda when a GPU is visible, else cpu"),
    S("run.dir", run.dir, "", "all",
      "the run's folder: checkpoint.dir defaults to <run.dir>/ckpt and log.file to <run.dir>/log.jsonl (the export "
      "to <checkpoint.dir>/export), so one `--set run.dir=runs/mine` moves them all; keys given explicitly still "
      "win; \"\" = checkpoint.dir ckpt and no log file"),

    S("model.hf_config", hf_config, "", "all",
      "an HF config.json to take the model from; exclusive with the inline model keys below"),
    E("model.arch", model.arch, arch_names, "qwen2", "all", 1,
      "architecture name written on export; qwen3 adds an RMSNorm over each q and k head before RoPE (the other "
      "maths differs only by qkv_bias and the sliding window); gemma3 is Gemma 3's text model: (1 + w) norms, also "
      "after attention and MLP, q/k norms, GeGLU-tanh, embeddings times sqrt(hidden_size) (docs/models-gemma3.md)"),
    I("model.vocab_size", model.vocab_size, 1, INT_MAX, "256", "all", 1, "vocabulary size"),
    I("model.hidden_size", model.hidden_size, 1, INT_MAX, "128", "all", 1, "model width C"),
    I("model.num_layers", model.num_layers, 1, INT_MAX, "4", "all", 1, "transformer blocks"),
    I("model.num_heads", model.num_heads, 1, INT_MAX, "4", "all", 1, "attention (query) heads"),
    I("model.num_kv_heads", model.num_kv_heads, 1, INT_MAX, "2", "all", 1,
      "key/value heads (grouped-query attention); must divide num_heads"),
    I("model.head_dim", model.head_dim, 0, INT_MAX, "0", "all", 1, "per-head width; 0 = hidden_size / num_heads"),
    I("model.intermediate_size", model.intermediate_size, 1, INT_MAX, "384", "all", 1, "SwiGLU MLP width F"),
    F("model.rope_theta", model.rope_theta, 0, NOHI, 1, 0, "10000", "all", 1, "RoPE base frequency"),
    F("model.rms_norm_eps", model.rms_norm_eps, 0, NOHI, 1, 0, "1e-06", "all", 1, "RMSNorm epsilon"),
    B("model.tie_embeddings", model.tie_embeddings, "true", "all", 1,
      "the LM head shares the embedding matrix"),
    B("model.qkv_bias", model.qkv_bias, "true", "all", 1,
      "q/k/v projections carry a bias (Qwen2: true; set false for Llama)"),
    I("model.max_seq_len", model.max_seq_len, 1, INT_MAX, "256", "all", 1,
      "longest sequence the model supports (HF max_position_embeddings); data.seq_len must fit"),
    E("model.rope_type", model.rope.type, rope_names, "default", "all", 1,
      "RoPE frequency scaling, as transformers' rope_type: default (theta^(-2i/D)), linear (/ rope_factor), dynamic "
      "(NTK: a larger base past max_seq_len, which data.seq_len never is, so the default frequencies in training), "
      "yarn (Qwen3 long context: a ramp between default and / rope_factor, cos and sin times rope_attention_factor) "
      "or llama3 (Llama 3.1+: low frequencies / rope_factor, high ones kept, a smooth band between)"),
    F("model.rope_factor", model.rope.factor, 0, NOHI, 0, 0, "0", "all", 1,
      "RoPE scaling factor (HF rope_scaling.factor); required by every rope_type but default"),
    I("model.rope_original_max_position_embeddings", model.rope.original_max_pos, 0, INT_MAX, "0", "all", 1,
      "yarn, llama3: the pretraining context length; 0 = model.max_seq_len"),
    F("model.rope_low_freq_factor", model.rope.low_freq_factor, 0, NOHI, 0, 0, "0", "all", 1,
      "llama3: wavelengths above original_max_position_embeddings / this are divided by rope_factor (Llama 3.1: 1)"),
    F("model.rope_high_freq_factor", model.rope.high_freq_factor, 0, NOHI, 0, 0, "0", "all", 1,
      "llama3: wavelengths below original_max_position_embeddings / this are kept (Llama 3.1: 4); > rope_low_freq_factor"),
    F("model.rope_beta_fast", model.rope.beta_fast, 0, NOHI, 0, 0, "0", "all", 1,
      "yarn: turns over the original context that end the unscaled band; 0 = 32"),
    F("model.rope_beta_slow", model.rope.beta_slow, 0, NOHI, 0, 0, "0", "all", 1,
      "yarn: turns over the original context that start the fully scaled band; 0 = 1"),
    F("model.rope_attention_factor", model.rope.attention_factor, 0, NOHI, 0, 0, "0", "all", 1,
      "yarn: the factor on cos and sin; 0 = 0.1 ln(rope_factor) + 1 (1 when rope_factor <= 1)"),
    B("model.rope_truncate", model.rope.truncate, "true", "all", 1,
      "yarn: round the ramp's ends to whole pairs (floor, ceil), as transformers does by default"),
    I("model.sliding_window", model.sliding_window, 0, INT_MAX, "0", "all", 1,
      "sliding-window attention: a windowed layer's query sees the last W keys, its own included; 0 = none "
      "(llama: must be 0)"),
    I("model.window_layers_from", model.window_layers_from, 0, INT_MAX, "0", "all", 1,
      "the first layer with the sliding window (qwen2's max_window_layers); 0 = every layer (mistral: must be 0)"),
    I("model.window_pattern", model.window_pattern, 0, INT_MAX, "0", "all", 1,
      "gemma3: every Nth layer (layer index + 1 a multiple of N) is global (no window, rope_theta), the others local "
      "(HF sliding_window_pattern, 6 in Gemma 3); 0 = none"),
    F("model.rope_local_theta", model.rope_local_theta, 0, NOHI, 0, 0, "0", "all", 1,
      "gemma3: the local layers' RoPE base, default RoPE (HF rope_local_base_freq, 10000); the rope_type keys apply "
      "to the global layers only; 0 = every layer takes rope_theta and the rope_type keys"),
    F("model.query_pre_attn_scalar", model.attn_scalar, 0, NOHI, 0, 0, "0", "all", 1,
      "gemma3: attention scale query_pre_attn_scalar^-0.5; 0 = head_dim^-0.5"),
    F("model.final_logit_softcapping", model.logit_softcap, 0, NOHI, 0, 0, "0", "all", 1,
      "gemma3: logits = cap * tanh(logits / cap) before the loss; 0 = none (Gemma 3's null)"),

    S("init.from", init.from, "", "all",
      "HF model to start from: its directory (config.json + model.safetensors), that .safetensors file or its model.safetensors.index.json; \"\" = from scratch"),
    U64("init.seed", init.seed, "1234", "all", "seeds the random weight init"),
    F("init.std", init.std, 0, NOHI, 1, 0, "0.02", "all", 0, "std of the normal init of matrices and embeddings"),

    S("data.train", data.train, "", "all", "glob of training token shards; must be set to train"),
    S("data.eval", data.eval, "", "all",
      "glob of eval token shards; not given: data.train's glob with the leading train of its file name made eval "
      "(tools/tokenize's train_*.bin -> eval_*.bin beside them), used when it matches files; \"\" = no eval"),
    S("data.tokenizer", data.tokenizer, "", "all",
      "HF tokenizer folder the shards were made with (tokenizer.json, tokenizer_config.json, ...), copied "
      "into the export; \"\" = init.from's tokenizer files when it has them"),
    I("data.seq_len", data.seq_len, 1, INT_MAX, "256", "all", 0, "tokens per sequence"),
    I("data.micro_batch", data.micro_batch, 1, INT_MAX, "8", "all", 0, "sequences per forward/backward (per GPU)"),
    I("data.grad_accum", data.grad_accum, 1, INT_MAX, "1", "all", 0, "micro-batches per optimizer step"),
    E("data.attention", data.attention, attention_names, "auto", "all", 0,
      "document: a packed window's tokens attend only to the earlier tokens of their own document (the shards' "
      "document starts, tools/tokenize); causal: to every earlier token of the window; auto: document when the "
      "training shards carry document starts, else causal. The startup line says which is used"),
    E("data.positions", data.positions, positions_names, "auto", "all", 0,
      "RoPE positions: document restarts them at 0 at each document's first token, window counts them from the "
      "window's first token; auto: document with data.attention document, else window"),

    F("optim.lr", optim.lr, 0, NOHI, 1, 0, "0.0003", "all", 0, "peak learning rate"),
    I("optim.warmup", optim.warmup, 0, INT_MAX, "0", "all", 0, "linear warmup steps; warmup + cooldown <= steps"),
    I("optim.cooldown", optim.cooldown, 0, INT_MAX, "0", "all", 0,
      "wsd: steps of the final decay to final_lr_frac * lr; ignored by cosine and linear"),
    E("optim.schedule", optim.schedule, sched_names, "cosine", "all", 0,
      "decay after warmup: cosine or linear to final_lr_frac * lr, or wsd (constant, then cooldown)"),
    F("optim.final_lr_frac", optim.final_lr_frac, 0, 1, 0, 0, "0.1", "all", 0, "last-step lr as a fraction of lr"),
    F("optim.beta1", optim.beta1, 0, 1, 0, 1, "0.9", "all", 0, "AdamW first-moment decay"),
    F("optim.beta2", optim.beta2, 0, 1, 0, 1, "0.95", "all", 0, "AdamW second-moment decay"),
    F("optim.eps", optim.eps, 0, NOHI, 1, 0, "1e-08", "all", 0, "AdamW epsilon"),
    F("optim.weight_decay", optim.weight_decay, 0, NOHI, 0, 0, "0.1", "all", 0,
      "decoupled weight decay of the projection matrices"),
    F("optim.grad_clip", optim.grad_clip, 0, NOHI, 0, 0, "1", "all", 0, "max global gradient L2 norm; 0 = off"),
    I("optim.steps", optim.steps, 1, INT_MAX, "1000", "all", 0, "optimizer steps in the run"),
    B("optim.decay_embeddings", optim.decay_embeddings, "false", "all", 0,
      "apply weight decay to the embedding and LM head too"),

    I("eval.every", eval.every, 0, INT_MAX, "100", "all", 0, "evaluate every N steps (and at the end); 0 = never"),
    I("eval.batches", eval.batches, 1, INT_MAX, "8", "all", 0, "micro-batches per evaluation"),

    S("checkpoint.dir", checkpoint.dir, "ckpt", "all", "directory for checkpoints; not given: <run.dir>/ckpt when run.dir is set"),
    I("checkpoint.every", checkpoint.every, 0, INT_MAX, "0", "all", 0, "checkpoint every N steps; 0 = only at the end"),
    I("checkpoint.keep", checkpoint.keep, 1, INT_MAX, "3", "all", 0, "newest checkpoints kept; older ones are deleted"),
    E("checkpoint.offloaded", checkpoint.offloaded, ckpt_offload_names, "auto", "GPU", 0,
      "an offloaded optimizer state (one GPU, or ZeRO ranks' pieces) is checkpointed by copy (fast: training "
      "pauses for the copy, needs host memory for it) or in_place (written where it lives: no memory, the optimizer "
      "waits for the write, up to the write time); auto = copy when the copy plus 1 GiB + 1/8 fits in the host budget "
      "(memory.host_limit_gib, else MemAvailable at start), else in_place. Replicated data-parallel ranks (parallel.zero: 0) and runs across nodes always copy"),

    S("export.dir", export.dir, "", "all",
      "HF export (config.json + model.safetensors) at the end; \"\" = checkpoint.dir + \"/export\""),
    E("export.dtype", export.bf16, export_names, "fp32", "all", 0, "dtype of the exported weights"),

    S("log.file", log.file, "", "all",
      "JSON-lines log file, created by a fresh run (a file already there is refused, like a used checkpoint.dir), "
      "appended to by a resumed one, locked by the run while it runs; not given: <run.dir>/log.jsonl when run.dir "
      "is set; \"\" = stdout only"),
    S("log.tensorboard", log.tensorboard, "", "all",
      "folder for TensorBoard event files (events.out.tfevents.*: train/loss, train/lr, train/grad_norm, "
      "train/tokens_per_s, train/host_mem_gib (peak resident host memory), eval/loss per logged step, ckpt/*); \"\" = none"),
    I("log.every", log.every, 1, INT_MAX, "10", "all", 0, "log the training loss every N steps"),

    E("precision.model_dtype", precision.model_dtype, model_dtype_names, "bf16", "GPU", 0,
      "dtype of the GPU weights and activations (fp32 master copy kept); bf16 only: fp32 GPU weights are not implemented (the CPU path trains fp32)"),
    E("precision.matmul_dtype", precision.matmul_dtype, matmul_names, "bf16", "GPU", 0,
      "dtype of the transformer blocks' matmul inputs; e4m3 = FP8 with per-tensor current scaling (GPU, sm_89+)"),
    E("precision.grad_dtype", precision.grad_dtype, grad_names, "bf16", "GPU", 0,
      "dtype of the activation gradients fed to the FP8 backward matmuls (e4m3, e5m2, or bf16 = backward in bf16)"),
    E("precision.opt_m_dtype", precision.opt_m_dtype, f32_bf16_names, "fp32", "GPU", 0, "AdamW first-moment storage"),
    E("precision.opt_v_dtype", precision.opt_v_dtype, f32_bf16_names, "fp32", "GPU", 0, "AdamW second-moment storage"),
    E("precision.master_dtype", precision.master_dtype, f32_bf16_names, "fp32", "GPU", 0,
      "the weights AdamW updates: fp32 = a separate fp32 master copy (4 bytes per parameter, on the GPU or offloaded); bf16 = no master copy, AdamW updates the bf16 weights in place (fp32 arithmetic, stochastic rounding from a hash of seed, step and the parameter's flat index, so any cut of the update gives the same bits). Checkpoints keep the fp32 weights item either way; an fp32-master checkpoint resumed with bf16 rounds them (RNE) once"),
    E("precision.grad_accum_dtype", precision.grad_accum_dtype, f32_bf16_names, "fp32", "GPU", 0,
      "the weight-gradient buffers every micro-batch accumulates into: bf16 halves them (2 bytes per parameter less); each accumulation is computed in fp32 and rounded to bf16 once (RNE); the sums over GPUs then cross in bf16 whatever parallel.reduce_dtype (added in fp32 in rank order, rounded once); with parallel.zero 2 or 3 the gradient slots are bf16 and each micro-step's summed piece is added into the rank's fp32 shard (ZeRO-2 = ZeRO-1 and ZeRO-3 = ZeRO-2 bitwise with bf16 slots: tests/test_zero `g16_*` and `z3_g16_*`, ranks sharing one H200 and on four)"),
    B("precision.stochastic_rounding", precision.stochastic_rounding, "false", "GPU", 0,
      "round the bf16 weights (and bf16 AdamW moments) written by AdamW stochastically"),
    B("precision.persistent_quants", precision.persistent_quants, "false", "GPU", 0,
      "quantize the FP8 weights once per optimizer step and reuse them for every micro-batch (false: again before every micro-batch); with memory.fp8_weight_cache none it says when their abs-max (the scale) is taken, the quants being made at each use"),

    I("memory.lmhead_chunks", memory.lmhead_chunks, 1, INT_MAX, "1", "GPU", 0,
      "split the LM head + loss over tokens into N chunks to bound logits memory"),
    NL("memory.recompute", memory.recompute, recompute_names, "[]", "GPU",
       "activations the backward recomputes before each layer instead of keeping them from the forward, with the same kernels and inputs (the same bits): one buffer for all layers instead of one per layer. swiglu: SwiGLU output, from the kept gate-up output; norm: both RMSNorm outputs, from the kept residuals; qkv: QKV projection and RoPE, from the norm output; att: attention output and softmax statistics (implies qkv); ffn: gate-up projection (implies swiglu); block: everything but the layer's input residual (implies att, ffn, norm). The resolved set is printed at start"),
    I("memory.attn_bwd_chunks", memory.attn_bwd_chunks, 1, INT_MAX, "1", "GPU", 0,
      "run the attention backward over N slices of the micro-batch's sequences (at most micro_batch): cuDNN's workspace and fp32 dQ accumulator shrink N-fold"),
    B("memory.offload_residual", memory.offload_residual, "false", "GPU", 0,
      "keep each layer's input residual (the one tensor a block recompute starts from) in pinned host memory from the forward to the backward: copied out on a copy stream while the layer computes, fetched back while the layer above runs its backward; the GPU keeps two residual slots instead of one per layer (host: (layers - 2) x micro_batch x seq_len x hidden x 2 bytes)"),
    B("memory.offload_optimizer", memory.offload_optimizer, "false", "GPU", 0,
      "keep the fp32 master weights and AdamW m, v (a GPU's shard when sharded) in pinned host memory, streamed through the GPU in chunks by AdamW: 12 bytes per parameter less GPU memory (8 with bf16 moments), the same bytes each way over PCIe per optimizer step"),
    NL("memory.offload", memory.offload, offload_names, "[]", "GPU",
       "what lives in pinned host memory instead of on the GPU, one list: master, m, v (the optimizer state, each on its own: the fp32 master weights (none with precision.master_dtype bf16), AdamW m and v; all three = offload_optimizer: true; the named ones live in pinned host memory and stream through device slots in AdamW, the others stay on the GPU; checkpoints write the offloaded ones in place; each part on its own bitwise equal to nothing offloaded on an H200), residual (the same as offload_residual: true), weights (one GPU, or with several ranks parallel.zero: 3, where it is the rank's bf16 pieces (2 bytes per parameter / ranks), every weight slot all-gathered from the ranks' pinned host pieces; one GPU: the bf16 weights, 2 bytes per parameter, copied up bucket by bucket into two layer slots as the forward and the backward reach them, the embedding and LM-head buckets into slots of their own once per step; AdamW updates them in host memory (streamed up and down through the optimizer's slots with its offloaded state, else through the mapping); the same bits as on the GPU; costs 2 x grad_accum x 2 bytes per parameter over PCIe per step; needs perf.cuda_graphs: false, and fp8 the weight cache none, implied when not given; with the optimizer state offloaded too, checkpoints write them in place (no pinned copy of them; the same file bytes as the run without the offload on an H200)), gradients (one GPU, or with several ranks parallel.zero: 2 or 3, where it is the rank's fp32 gradient shard (4 bytes per parameter / ranks), each micro-step's summed piece added into it in 16 MiB device chunks moved by the copy engines (three slots: one chunk up while one is added and one goes down), the slots staying on the GPU, 8 bytes per shard element over PCIe per micro-step; one GPU: the gradient buffer, 4 bytes per parameter (2 with precision.grad_accum_dtype: bf16, the slots bf16 too); the backward writes ZeRO-2's gradient slots (three of the largest layer bucket, the embedding and LM-head buckets' own), each loaded from host before its bucket is written and stored back after (the embedding and LM-head slots keep theirs within a step), so the same bits as on the GPU; costs (2 x grad_accum - 1) x 4 (bf16: 2) bytes per parameter over PCIe per step, and the norm and AdamW read them over PCIe (AdamW through the optimizer's slots with its offloaded state)); quants (with weights, fp8 matmuls and an fp8 backward): the offloaded weights' e4m3 codes also live in pinned host memory, made once per optimizer step from the host weights (their abs-max, then the codes: the bytes a quantize of the layer on the GPU gives), and are what crosses to the GPU: one GPU copies each layer's codes up into the weight slot's e4m3 half (1 byte per block-matrix parameter instead of 2; the norms and biases in bf16) and takes Wq and the transposed Wq^T from them; with ZeRO-3 it implies parallel.gather_dtype e4m3 (the rank's host pieces' codes gathered); the same bits as the bf16 weights. With LoRA (lora.rank > 0; one GPU, bf16 matmuls) weights is the only item: the frozen base's block matrices (bf16, or lora.base_dtype nf4's codes and scales, ~0.52 bytes per weight) live in pinned host memory and are copied up a layer at a time into two GPU slots ahead of the forward and the backward (the recompute's included), the embeddings, LM head, norms, adapters and activations staying on the GPU; the same bits as the base on the GPU. Given with offload_optimizer or offload_residual, the two must agree ([] leaves those as they are)"),
    F("memory.gpu_limit_gib", memory.gpu_limit_gib, 0, NOHI, 0, 0, "0", "GPU", 0,
      "cap on the GPU memory qtrain plans and allocates per GPU (GiB): the arena, cuBLASLt/cuDNN workspaces, comm buffers and a fixed runtime reserve (kernel modules, library handles, CUDA graphs); the CUDA context (about 0.5 GiB) is not counted. A plan over the cap is refused before allocating, naming its biggest rows; 0 = no cap (the GPU's free memory still applies)"),
    F("memory.host_limit_gib", memory.host_limit_gib, 0, NOHI, 0, 0, "0", "all", 0,
      "host memory the run may plan for (GiB): pinned offloaded state and snapshot buffers, pageable loader and weight buffers. A plan over it is refused before allocating; 0 = MemAvailable from /proc/meminfo at start (set it where a VM reports less at start than it grants later)"),
    E("memory.plan", memory.plan, plan_names, "auto", "GPU", 0,
      "auto (the default; it plans GPU runs, a CPU run takes the keys as given): before training, choose data.micro_batch (keeping micro_batch x grad_accum), memory.recompute, memory.offload_optimizer, memory.lmhead_chunks, memory.attn_bwd_chunks, memory.offload_residual, memory.fp8_weight_cache, precision.master_dtype, precision.grad_accum_dtype, parallel.zero, memory.offload's gradients and weights items (one GPU, or with several ranks gradients with zero 2/3 and weights with zero 3; ranked by their PCIe bytes like the rest, after keeping fp32 master weights and gradients) and perf.cuda_graphs (on wherever the plan allows it), among those the config does not give (a key given as auto, e.g. --set data.micro_batch=auto, counts as not given), as the plan that fits the GPU budget (its free memory as the run starts, cudaMemGetInfo, less a 1 GiB margin, capped by memory.gpu_limit_gib) and the host's (memory.host_limit_gib, else MemAvailable) with the highest predicted tokens/s (a FLOP and PCIe cost model against a matmul and copy rate probed once per GPU model and cached in ~/.cache/qtrain); prints the choice, its prediction and the next two, and a NOTE naming the plan with bf16 master weights or gradients where it would predict over 1.2 x the chosen speed; when none fits, the refusal names the given keys that block it, each with the plan the search finds without it. LoRA runs (lora.rank > 0): the micro-batch, recompute, the chunk counts, the fp8 weight cache and (bf16 matmuls) memory.offload's weights item, the frozen base streamed from pinned host memory (what the GPU LoRA engine runs; one host copy for every rank), ranked by LoRA's step (no weight gradients or optimizer over the base, the adapters' passes, an NF4 base's dequantizes, a streamed base's copies over PCIe); over a bf16 base that fits no plan the refusal also names the NF4 base's. manual: the keys as given"),
    E("memory.host_alloc", memory.host_alloc, host_alloc_names, "pinned", "GPU", 0,
      "how memory.offload's items (the optimizer state, weights, gradients, residuals) are allocated in host memory: pinned (mmap, pages touched by all cores, cudaHostRegister: ~5x faster to make than cudaHostAlloc, bench/RESULTS.md, Offload) or write_combined (cudaHostAlloc + cudaHostAllocWriteCombined, pinned at ~2 GiB/s, as LLM.Q's --write-combined: the GPU's transfers may be faster on some hosts, but the CPU reads such memory uncached, which slows a checkpoint written in place; on an H200 no measurable difference at 1.5B, bench/RESULTS.md, Offload)"),
    B("memory.zero_copy", memory.zero_copy, "false", "GPU", 0,
      "with the optimizer state offloaded: AdamW reads and writes it where it lives, in host memory (mapped), instead of streaming it through device slots by the copy engines (LLM.Q's --use-zero-copy, much faster on L40S there): no slots on the GPU, the same bytes over PCIe, read by the kernel; checkpoints written in place wait before each group's update; on an H200 (PCIe Gen5) 1.5% slower than the slots at 1.5B (bench/RESULTS.md, Offload)"),
    E("memory.fp8_weight_cache", memory.fp8_weight_cache, fp8_wcache_names, "all", "GPU", 0,
      "with matmul_dtype e4m3, where the fp8 copies of the block weights (Wq and the transposed Wq^T for the backward, 2 bytes per block parameter: 24.6 GiB at 14B) live: all = every layer's stay on the GPU; none = two layer slots (about 2/num_layers of that), each layer quantized into one right before its forward and again before its backward (and its recompute), with the scale the cached copies would have (the weights' abs-max, still taken when persistent_quants says: once per optimizer step or per micro-batch): the same bytes, the same training bit for bit, at the cost of one quantize pass over the block weights per forward and per backward. parallel.zero: 3 implies none (all is refused there: no rank holds every layer's weights)"),
    B("perf.cuda_graphs", perf.cuda_graphs, "false", "GPU", 0, "capture the training step as a CUDA graph; not given, memory.plan: auto turns it on wherever its plan allows (not with offloaded weights or ZeRO-3)"),
    B("perf.deterministic", perf.deterministic, "true", "GPU", 0,
      "the same config, data and binary on the same GPU model give the same bits, run after run and across resume: the attention backward runs cuDNN's deterministic graph (dQ from one matmul instead of an fp32 accumulator that thread blocks add into in any order) and the autotuned matmul algorithms are kept in each checkpoint and in perf.tuning_cache; its cost is within run-to-run noise on an H200 (bench/RESULTS.md, Determinism); false = cuDNN's default backward, whose dQ sums vary in the last bits run to run at grouped-query shapes"),
    S("perf.tuning_cache", perf.tuning_cache, "~/.cache/qtrain/matmul-picks.bin", "GPU",
      "with perf.deterministic and perf.matmul_autotune: the file that keeps the autotuned matmul algorithms per GPU model and shape between runs (read before the first step, written after it and after each checkpoint), so a repeated run multiplies with the algorithms of the first; \"\" = none (a resumed run still takes them from its checkpoint); \"~/\" is $HOME"),
    B("perf.matmul_autotune", perf.matmul_autotune, "true", "GPU", 0,
      "time cuBLASLt's candidate algorithms on each matmul shape's first use and keep the fastest; false = the heuristic's first choice (the same algorithms on every run, for A/B comparisons)"),

    I("parallel.gpus", parallel.gpus, 0, INT_MAX, "0", "multi-GPU", 0,
      "GPUs to train on, data parallel (one thread and one full replica each; a step then holds micro_batch x grad_accum x gpus sequences); 0 = all visible, up to 8"),
    IL("parallel.devices", parallel.devices, 0, INT_MAX, "[]", "multi-GPU",
       "one data-parallel rank per entry, on that CUDA device: [0, 1] = two GPUs, [0, 0, 0] = three ranks sharing GPU 0 (so every data-parallel feature can be tested on one GPU); [] = parallel.gpus decides"),
    E("parallel.comm", parallel.comm, comm_names, "auto", "multi-GPU", 0,
      "how the GPUs sum gradients: peer copies (NVLink/PCIe P2P), host staging through pinned memory, write-combined host; auto = from the link probe printed at start"),
    B("parallel.shard_optimizer", parallel.shard_optimizer, "true", "multi-GPU", 0,
      "shorthand for parallel.zero: true = 1 (each GPU keeps the fp32 master weights and AdamW moments of 1/N of the parameters), false = 0; given with parallel.zero it must agree (true with zero >= 1, false with zero 0)"),
    I("parallel.zero", parallel.zero, 0, 3, "1", "multi-GPU", 0,
      "ZeRO level over the data-parallel ranks: 0 every rank keeps everything; 1 each keeps the fp32 master weights and AdamW moments of 1/N of the parameters; 2 also only 1/N of the fp32 gradients (each layer's gradients are reduce-scattered into the rank's shard as the backward releases them, every micro-step, through full-size slots: one per bucket with embedding or LM-head rows, three shared by the layers); 3 also only 1/N of the bf16 weights (each layer's bucket is all-gathered into one of two weight slots before its forward and again before its backward, the next one's gather running beside the layer with parallel.overlap_comm; the embedding and LM-head buckets have slots of their own, gathered once per step; the gathers move bf16, 2 bytes per parameter; fp8 matmuls quantize each layer from its slot as memory.fp8_weight_cache none does, which zero 3 implies; perf.cuda_graphs is refused). 2 and 3 need >= 2 ranks (parallel.devices: [0, 0] puts two on one GPU); shard_optimizer is the older spelling of 0 / 1"),
    E("parallel.reduce_dtype", parallel.reduce_dtype, f32_bf16_names, "fp32", "multi-GPU", 0,
      "dtype the gradients cross between GPUs in: bf16 halves the bytes (each GPU's sum is rounded to bf16 once, the sum over GPUs is still taken in fp32)"),
    E("parallel.gather_dtype", parallel.gather_dtype, gather_names, "bf16", "multi-GPU", 0,
      "what ZeRO-3's layer gathers move: bf16 weights (2 bytes per parameter), or with precision.matmul_dtype e4m3 and an fp8 backward (grad_dtype e4m3 or e5m2) the e4m3 codes of the block matrices (1 byte: each rank quantizes its pieces once per step with the whole tensor's abs-max, all-reduced over the ranks, so the codes are those the bf16 path would make; the norms and biases still travel in bf16) — the same bits, half the bytes (tests/test_zero `zero3_e4m3_gathers`: bitwise the bf16 gathers' training, ranks sharing one H200 and on two)"),
    B("parallel.overlap_comm", parallel.overlap_comm, "true", "multi-GPU", 0,
      "in the last micro-batch of a step, sum each layer's gradients over the GPUs while the backward goes on to the layers below (one bucket per layer), and (sharded) all-gather the updated weights while the next forward runs, each layer waiting for its own; false: one sum after the backward, one all-gather before the next forward"),
    I("parallel.nodes", parallel.nodes, 1, 64, "1", "multi-node", 0,
      "machines the run spans, one qtrain process per machine started by torchrun --nproc_per_node=1, srun --ntasks-per-node=1 or mpirun --npernode 1 (their RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, SLURM_* or OMPI_COMM_WORLD_* variables; docs/multi-node.md); the launcher's process count must equal it. > 1: the nodes meet (node 0's port, the config and GPU count checked equal), then train data parallel over every node's GPUs (NCCL between the nodes; parallel.zero >= 1 shards the optimizer state over every node's GPUs; node 0 writes the checkpoints)"),

    I("lora.rank", lora.rank, 0, 65536, "0", "all", 0,
      "LoRA rank r: > 0 trains low-rank adapters (A [r, in], B [out, r] per target module, PEFT's init: A Kaiming-uniform, B zero, from seed) over a frozen base that has no gradients and no optimizer state; checkpoints hold the adapters, their AdamW state and the base's identity; the export is PEFT's adapter_model.safetensors + adapter_config.json (--export merged: the merged model). 0 = full fine-tuning. The CPU and the GPU engines train it (docs/fine-tuning.md)"),
    F("lora.alpha", lora.alpha, 0, NOHI, 1, 0, "8", "all", 0, "LoRA alpha: the adapters' output is scaled by alpha / r"),
    B("lora.rslora", lora.rslora, "false", "all", 0, "rank-stabilized LoRA: scale alpha / sqrt(r) instead of alpha / r"),
    F("lora.dropout", lora.dropout, 0, 1, 0, 1, "0", "all", 0,
      "dropout on each adapter's input (its own mask per module, a hash of seed, step, micro-batch, layer and module: the same across resume)"),
    NL("lora.targets", lora.targets, lora_target_names, "[q, k, v, o, gate, up, down]", "all",
       "the blocks' linear layers that get adapters (q_proj ... down_proj)"),
    NL("lora.trainable", lora.trainable, lora_extra_names, "[]", "all",
       "base tensors that train beside the adapters, with gradients and AdamW state of their own (PEFT's modules_to_save): embeddings, lm_head (untied models only: PEFT unties them), norms (every RMSNorm weight)"),
    E("lora.export", lora.export_merged, lora_export_names, "adapter", "all", 0,
      "what the export writes with lora.rank > 0: adapter = PEFT's adapter_model.safetensors + adapter_config.json "
      "(peft.PeftModel.from_pretrained loads them over the base), merged = the merged model (base + scale B A) as "
      "model.safetensors + config.json in export.dtype; `qtrain run.yaml --export merged` sets it"),
    E("lora.base_dtype", lora.base_nf4, lora_base_names, "bf16", "all", 0,
      "how the frozen base is held: bf16, or nf4 (QLoRA): the blocks' q, k, v, o, gate, up and down matrices "
      "quantized once at load to 4-bit NormalFloat with double-quantized block scales (bitsandbytes' layout, about "
      "4.13 bits per weight), each layer's dequantized into a bf16 slot before its forward and its backward; the "
      "embeddings, norms and LM head stay bf16. Either held on the GPU, or with memory.offload: [weights] in pinned "
      "host memory, streamed a layer at a time. Checkpoints record the weights as read, so a resume finds the same "
      "base; the merged export writes the dequantized weights. Needs lora.rank > 0 and bf16 matmuls. The CPU engine "
      "computes with the same dequantized values in fp32"),

    E("objective", objective, objective_names, "lm", "all", 0,
      "the loss: lm = next-token cross-entropy over the unmasked targets; dpo = sigmoid DPO over preference pairs "
      "(shards of tools/tokenize --pairs: a micro-batch holds micro_batch / 2 pairs, chosen and rejected), the "
      "reference log-probs from the frozen base under the LoRA adapters, or without LoRA those of the initial weights, "
      "computed in a first pass before step 1 and stored beside each shard as <shard>.dporef (reused by later runs of "
      "the same initial weights; on the GPU not with parallel.zero 2 or 3 or offloaded weights or gradients); "
      "docs/preference-tuning.md"),
    F("dpo.beta", dpo.beta, 0, NOHI, 1, 0, "0.1", "all", 0,
      "objective: dpo: beta, the implicit reward's scale: loss = -log sigmoid(beta ((pi_c - pi_r) - (ref_c - ref_r)))"),
    F("dpo.label_smoothing", dpo.label_smoothing, 0, 0.5, 0, 1, "0", "all", 0,
      "objective: dpo: eps, the assumed rate of flipped preference labels (conservative DPO): loss = -(1 - eps) "
      "log sigmoid(beta h) - eps log sigmoid(-beta h)"),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

const qt_config_key *qt_config_key_at(int i) { return i >= 0 && i < N_KEYS ? &keys[i] : NULL; }

int qt_config_given(const qt_config *c, const char *path) {
    const qt_config_key *k = qt_config_key_find(path);
    long i = k ? k - keys : -1;
    return i >= 0 && i < (long)sizeof c->given && c->given[i];
}

void qt_config_ungive(qt_config *c, const char *path) {
    const qt_config_key *k = qt_config_key_find(path);
    long i = k ? k - keys : -1;
    if (i >= 0 && i < (long)sizeof c->given) c->given[i] = 0;
}

const qt_config_key *qt_config_key_find(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].path, path)) return &keys[i];
    return NULL;
}

static int in_range(const qt_config_key *k, double v) {
    if (k->lo_open ? !(v > k->lo) : !(v >= k->lo)) return 0;
    if (k->hi_open ? !(v < k->hi) : !(v <= k->hi)) return 0;
    return 1;
}

/* YAML 1.1/1.2 booleans, in the three casings YAML allows. */
static int parse_bool(const char *t, int *out) {
    static const char *yes[] = {"true", "yes", "on"}, *no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(t, yes[i])) { *out = 1; return 0; }
        if (!strcasecmp(t, no[i])) { *out = 0; return 0; }
    }
    return -1;
}

/* A list value: "[a, b]", "a,b", "[]" or "" (the config reader joins a YAML sequence's scalars with
 * commas); item(k, text, length, acc) takes each entry in turn, returning -1 to refuse it. */
static int walk_list(const qt_config_key *k, const char *t, int (*item)(const qt_config_key *, const char *, size_t, void *),
                     void *acc) {
    while (*t == ' ') t++;
    int bracket = *t == '[';
    t += bracket;
    for (;;) {
        while (*t == ' ') t++;
        if (!*t || *t == ']') break;
        size_t n = strcspn(t, " ,]");
        if (item(k, t, n, acc)) return -1;
        for (t += n; *t == ' '; t++) {}
        if (*t == ',') t++;
        else if (*t && *t != ']') return -1;
    }
    return bracket != (*t == ']') || (*t == ']' && t[1]) ? -1 : 0;
}

/* An integer in k's range, at most QT_LIST_MAX of them. */
static int int_item(const qt_config_key *k, const char *t, size_t n, void *acc) {
    qt_int_list *l = acc;
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (end != t + n || n == 0 || errno || v < INT_MIN || v > INT_MAX || !in_range(k, (double)v) || l->n == QT_LIST_MAX)
        return -1;
    l->v[l->n++] = (int)v;
    return 0;
}

/* A name of k's table, its bit OR-ed in. */
static int name_item(const qt_config_key *k, const char *t, size_t n, void *acc) {
    const qt_key_enum *e = k->names;
    while (e->name && (strlen(e->name) != n || strncmp(e->name, t, n))) e++;
    if (!e->name) return -1;
    *(int *)acc |= e->value;
    return 0;
}

static int parse_int_list(const qt_config_key *k, const char *t, qt_int_list *out) {
    qt_int_list l = {0};
    if (walk_list(k, t, int_item, &l)) return -1;
    *out = l;
    return 0;
}

static int parse_name_list(const qt_config_key *k, const char *t, int *out) {
    int bits = 0;
    if (walk_list(k, t, name_item, &bits)) return -1;
    *out = bits;
    return 0;
}

int qt_config_key_set(qt_config *c, const qt_config_key *k, const char *t) {
    char *field = (char *)c + k->offset, *end;
    errno = 0;
    switch (k->type) {
    case QT_KEY_INT: {
        long long v = strtoll(t, &end, 10);
        if (!*t || *end || errno || v < INT_MIN || v > INT_MAX || !in_range(k, (double)v)) return -1;
        *(int *)field = (int)v;
        return 0;
    }
    case QT_KEY_U64: {
        if (!*t || *t == '-' || *t == '+' || *t == ' ') return -1;
        unsigned long long v = strtoull(t, &end, 10);
        if (*end || errno) return -1;
        *(uint64_t *)field = (uint64_t)v;
        return 0;
    }
    case QT_KEY_FLOAT: {
        float v = strtof(t, &end); /* ERANGE with 0: so small it became 0 (subnormals are kept) */
        if (!*t || *end || !isfinite(v) || (errno == ERANGE && v == 0) || !in_range(k, v)) return -1;
        *(float *)field = v;
        return 0;
    }
    case QT_KEY_BOOL: return parse_bool(t, (int *)field);
    case QT_KEY_STRING:
        if (strlen(t) >= QT_PATH_MAX) return -1;
        memcpy(field, t, strlen(t) + 1);
        return 0;
    case QT_KEY_ENUM:
        for (const qt_key_enum *e = k->names; e->name; e++)
            if (!strcmp(e->name, t)) { *(int *)field = e->value; return 0; }
        return -1;
    case QT_KEY_INT_LIST: return parse_int_list(k, t, (qt_int_list *)field);
    case QT_KEY_NAME_LIST: return parse_name_list(k, t, (int *)field);
    }
    return -1;
}

/* Shortest %g that reads back to the same float, so dumps stay readable ("0.02", not 0.0199999996). */
static void format_float(float v, char *buf, size_t cap) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

/* The code point of the UTF-8 sequence at p (its length in *len); -1 when it is not valid UTF-8. */
static long utf8_at(const unsigned char *p, int *len) {
    int n = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!n) return -1;
    long cp = n == 1 ? p[0] : p[0] & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return -1;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    *len = n;
    return cp;
}

/* A YAML double-quoted scalar that libyaml reads back to the same bytes: backslash escapes for the
 * quote, the backslash, and every code point YAML does not allow raw or folds as a line break
 * (C0 and C1 controls, DEL, U+2028/9, U+FEFF, U+FFFE/F). A byte that is not UTF-8 (which the YAML
 * loader never produces) is written as \xNN. */
static void format_string(const char *s, char *buf, size_t cap) {
    size_t n = 0;
#define PUT(ch) do { if (n + 1 < cap) buf[n] = (ch); n++; } while (0)
    PUT('"');
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int len = 1;
        long cp = utf8_at(p, &len);
        char esc[12] = "";
        if (cp < 0) snprintf(esc, sizeof esc, "\\x%02x", *p);
        else if (cp == '"' || cp == '\\') snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) snprintf(esc, sizeof esc, "\\x%02lx", cp);
        else if (cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe || cp == 0xffff ||
                 (cp >= 0xd800 && cp <= 0xdfff))
            snprintf(esc, sizeof esc, "\\u%04lx", cp);
        if (esc[0]) {
            for (char *e = esc; *e; e++) PUT(*e);
        } else {
            for (int i = 0; i < len; i++) PUT((char)p[i]);
        }
        p += cp < 0 ? 1 : len;
    }
    PUT('"');
#undef PUT
    if (cap) buf[n < cap ? n : cap - 1] = 0;
}

void qt_config_key_format(const qt_config *c, const qt_config_key *k, char *buf, size_t cap) {
    const char *field = (const char *)c + k->offset;
    switch (k->type) {
    case QT_KEY_INT: snprintf(buf, cap, "%d", *(const int *)field); return;
    case QT_KEY_U64: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)field); return;
    case QT_KEY_FLOAT: format_float(*(const float *)field, buf, cap); return;
    case QT_KEY_BOOL: snprintf(buf, cap, "%s", *(const int *)field ? "true" : "false"); return;
    case QT_KEY_STRING: format_string(field, buf, cap); return;
    case QT_KEY_ENUM:
        for (const qt_key_enum *e = k->names; e->name; e++)
            if (e->value == *(const int *)field) { snprintf(buf, cap, "%s", e->name); return; }
        snprintf(buf, cap, "%d", *(const int *)field); /* not a valid name: reading it back fails loudly */
        return;
    case QT_KEY_INT_LIST: {
        const qt_int_list *l = (const qt_int_list *)field;
        size_t n = (size_t)snprintf(buf, cap, "[");
        for (int i = 0; i < l->n && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, i ? ", %d" : "%d", l->v[i]);
        if (n < cap) snprintf(buf + n, cap - n, "]");
        return;
    }
    case QT_KEY_NAME_LIST: {
        int bits = *(const int *)field, first = 1;
        size_t n = (size_t)snprintf(buf, cap, "[");
        for (const qt_key_enum *e = k->names; e->name && n < cap; e++)
            if (bits & e->value) {
                n += (size_t)snprintf(buf + n, cap - n, first ? "%s" : ", %s", e->name);
                first = 0;
            }
        if (n < cap) snprintf(buf + n, cap - n, "]");
        return;
    }
    }
}

/* The range alone: ">= 1", "> 0", "[0, 1)"; "" when unbounded. sep joins enum names. */
static void range_text(const qt_config_key *k, const char *sep, char *buf, size_t cap) {
    buf[0] = 0;
    if (k->type == QT_KEY_ENUM || k->type == QT_KEY_NAME_LIST) {
        size_t n = 0;
        for (const qt_key_enum *e = k->names; e->name && n < cap; e++)
            n += snprintf(buf + n, cap - n, "%s%s", e == k->names ? "" : sep, e->name);
        return;
    }
    if (k->type != QT_KEY_INT && k->type != QT_KEY_FLOAT && k->type != QT_KEY_INT_LIST) return;
    int has_hi = k->hi != NOHI && !(k->type != QT_KEY_FLOAT && k->hi >= INT_MAX);
    if (k->lo != NOLO && has_hi)
        snprintf(buf, cap, "%c%g, %g%c", k->lo_open ? '(' : '[', k->lo, k->hi, k->hi_open ? ')' : ']');
    else if (k->lo != NOLO) snprintf(buf, cap, "%s %g", k->lo_open ? ">" : ">=", k->lo);
    else if (has_hi) snprintf(buf, cap, "%s %g", k->hi_open ? "<" : "<=", k->hi);
}

void qt_config_key_expect(const qt_config_key *k, char *buf, size_t cap) {
    char r[160];
    range_text(k, "|", r, sizeof r);
    const char *join = r[0] == '[' || r[0] == '(' ? " in " : " ";
    switch (k->type) {
    case QT_KEY_INT: snprintf(buf, cap, "an integer%s%s", r[0] ? join : "", r); return;
    case QT_KEY_FLOAT: snprintf(buf, cap, "a number%s%s", r[0] ? join : "", r); return;
    case QT_KEY_U64: snprintf(buf, cap, "an integer in [0, 2^64)"); return;
    case QT_KEY_BOOL: snprintf(buf, cap, "true or false"); return;
    case QT_KEY_STRING: snprintf(buf, cap, "a string of at most %d bytes", QT_PATH_MAX - 1); return;
    case QT_KEY_ENUM: snprintf(buf, cap, "one of %s", r); return;
    case QT_KEY_INT_LIST: snprintf(buf, cap, "a list of at most %d integers%s%s", QT_LIST_MAX, r[0] ? " " : "", r); return;
    case QT_KEY_NAME_LIST: snprintf(buf, cap, "a list of names from %s", r); return;
    }
}

void qt_config_defaults(qt_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) {
        int rc = qt_config_key_set(c, &keys[i], keys[i].def);
        (void)rc; /* a bad default in the table is caught by test_config's defaults test */
    }
}

int qt_config_equal(const qt_config *a, const qt_config *b, const char **diff) {
    static const size_t width[] = {sizeof(int), sizeof(uint64_t), sizeof(float), sizeof(int), 0, sizeof(int),
                                   sizeof(qt_int_list), sizeof(int)};
    for (int i = 0; i < N_KEYS; i++) {
        const char *fa = (const char *)a + keys[i].offset, *fb = (const char *)b + keys[i].offset;
        int same = keys[i].type == QT_KEY_STRING ? !strcmp(fa, fb) : !memcmp(fa, fb, width[keys[i].type]);
        if (!same) {
            if (diff) *diff = keys[i].path;
            return 0;
        }
    }
    if (a->model_inline != b->model_inline) {
        if (diff) *diff = "model_inline";
        return 0;
    }
    return 1;
}

static const char *type_name(qt_key_type t) {
    static const char *n[] = {"int", "uint64", "float", "bool", "string", "enum", "int list", "name list"};
    return n[t];
}

size_t qt_config_doc_table(char *buf, size_t cap) {
    size_t n = 0;
#define OUT(...) do { int w_ = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__); \
                      if (w_ > 0) n += (size_t)w_; } while (0)
    OUT("| key | type | range | default | used by | meaning |\n");
    OUT("|-----|------|-------|---------|---------|---------|\n");
    for (int i = 0; i < N_KEYS; i++) {
        const qt_config_key *k = &keys[i];
        char r[160], d[64];
        range_text(k, " \\| ", r, sizeof r);
        if (k->type == QT_KEY_STRING) snprintf(d, sizeof d, "`\"%s\"`", k->def);
        else snprintf(d, sizeof d, "`%s`", k->def);
        OUT("| `%s` | %s | %s | %s | %s | %s |\n", k->path, type_name(k->type), r[0] ? r : "-", d, k->used_by,
            k->help);
    }
#undef OUT
    return n;
}
