/* qt_model.h — the Llama/Qwen2 model description and the flat parameter layout.
 *
 * All parameters of a model live in one flat array (fp32 on the CPU; bf16 + fp32 master on the GPU)
 * in the order of qt_layout's tensor table. Tensors that one fused matmul reads are adjacent:
 *   q_proj, k_proj, v_proj  -> one [(H + 2*Hkv) * D, C] matrix  (and their biases -> one vector)
 *   gate_proj, up_proj      -> one [2F, C] matrix (gate rows first)
 * Every tensor group starts at a multiple of QT_LAYOUT_ALIGN elements; the padding is zero and stays
 * zero (its gradient is zero and it takes no weight decay). A sharded run also starts each shard unit (the
 * embedding, each layer, the final norm with the LM head) at a multiple of its unit alignment
 * (qt_layout_init_units), so that no tensor straddles two ranks; a tensor's compact offset is its offset in
 * the layout of alignment QT_LAYOUT_ALIGN, which the seeded init, the stochastic rounding and the
 * checkpoint files use, so that a run's bits do not depend on its unit alignment. Names are the HF ones
 * ("model.layers.3.self_attn.q_proj.weight"), so checkpoints and safetensors use them as they are. */
#ifndef QT_MODEL_H
#define QT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define QT_LAYOUT_ALIGN 64

typedef enum { QT_ARCH_QWEN2 = 0, QT_ARCH_LLAMA = 1, QT_ARCH_QWEN3 = 2, QT_ARCH_MISTRAL = 3,
               QT_ARCH_GEMMA3 = 4 } qt_arch;

/* RoPE frequency schemes, as transformers' ROPE_INIT_FUNCTIONS names them (rope_type). */
typedef enum {
    QT_ROPE_DEFAULT = 0, /* theta^(-2i/D) */
    QT_ROPE_LINEAR = 1,  /* default / factor */
    QT_ROPE_DYNAMIC = 2, /* NTK: a larger base once the sequence passes max_seq_len */
    QT_ROPE_YARN = 3,    /* a ramp between default and default / factor; cos and sin times attention_factor */
    QT_ROPE_LLAMA3 = 4   /* Llama 3.1: low frequencies / factor, high ones kept, a smooth band between */
} qt_rope_type;

/* RoPE scaling parameters (HF rope_scaling / rope_parameters). Every member is 4 bytes (no padding: the
 * model config is compared with memcmp). Fields a type does not use are ignored. */
typedef struct {
    qt_rope_type type;
    float factor;           /* linear, dynamic, yarn, llama3 */
    int original_max_pos;   /* yarn, llama3: original_max_position_embeddings; 0 = max_seq_len */
    float low_freq_factor;  /* llama3 */
    float high_freq_factor; /* llama3; > low_freq_factor */
    float beta_fast;        /* yarn; 0 = 32 */
    float beta_slow;        /* yarn; 0 = 1 */
    float attention_factor; /* yarn: cos/sin multiplier; 0 = 0.1 ln(factor) + 1 (1 when factor <= 1) */
    int truncate;           /* yarn: 1 = floor/ceil the correction range (transformers' default) */
} qt_rope_cfg;

typedef struct {
    qt_arch arch;          /* naming in config.json; the maths differs by qkv_bias, qk_norm and the window */
    int vocab_size;
    int hidden_size;       /* C */
    int num_layers;        /* L */
    int num_heads;         /* H */
    int num_kv_heads;      /* Hkv; H % Hkv == 0 */
    int head_dim;          /* D; hidden_size / num_heads unless set */
    int intermediate_size; /* F */
    int max_seq_len;
    float rope_theta;
    float rms_norm_eps;
    int tie_embeddings;    /* lm_head shares the embedding matrix */
    int qkv_bias;          /* Qwen2: q/k/v projections carry a bias */
    qt_rope_cfg rope;      /* RoPE scaling; all zero = the default RoPE */
    int qk_norm;           /* Qwen3: RMSNorm over each q and k head (weight [D] each) after the qkv matmul,
                            * before RoPE; qt_model_cfg_finish sets it for qwen3 */
    int sliding_window;    /* W > 0: the windowed layers' queries see the last W keys (their own included);
                            * 0 = every layer causal over the whole sequence */
    int window_layers_from; /* the first windowed layer (Qwen2's max_window_layers); 0 = all (Mistral) */
    int window_pattern;    /* N > 0: every Nth layer (l + 1 multiple of N) is global, the others local (Gemma 3's
                            * sliding_window_pattern, 6); 0 = the rule of window_layers_from alone */
    float rope_local_theta; /* > 0: the local layers' RoPE base, default RoPE without scaling (Gemma 3's
                             * rope_local_base_freq); the global layers keep rope_theta and `rope`. 0 = one RoPE */
    float attn_scalar;     /* > 0: attention scale attn_scalar^-0.5 (Gemma's query_pre_attn_scalar); 0 = head_dim */
    float logit_softcap;   /* > 0: logits = cap * tanh(logits / cap) before the loss (final_logit_softcapping) */
} qt_model_cfg;

/* A checkpoint's model_cfg blob is this struct's bytes. Members from `rope` on came after the format
 * began: a checkpoint written before them holds only the first QT_MODEL_CFG_BASE_BYTES bytes and loads
 * with the rest zero, so every member added at the end means "the model as before" when zero. */
#define QT_MODEL_CFG_BASE_BYTES offsetof(qt_model_cfg, rope)

typedef enum {
    QT_T_EMBED, QT_T_NORM, QT_T_Q, QT_T_K, QT_T_V, QT_T_QB, QT_T_KB, QT_T_VB, QT_T_O,
    QT_T_GATE, QT_T_UP, QT_T_DOWN, QT_T_FINAL_NORM, QT_T_LM_HEAD, QT_T_QNORM, QT_T_KNORM
} qt_tensor_kind;

typedef struct {
    char name[96];       /* HF name */
    qt_tensor_kind kind;
    int layer;           /* -1 outside the blocks */
    int ndim;            /* 1 or 2 */
    int64_t shape[2];    /* [rows, cols] for matrices, [n] for vectors */
    size_t offset;       /* into the flat array, elements */
    size_t compact;      /* offset in the layout of unit alignment QT_LAYOUT_ALIGN (== offset there) */
    size_t numel;
    int is_matrix;       /* projection matrices: the ones AdamW decays by default */
} qt_tensor;

typedef struct {
    size_t ln1, wqkv, bqkv, wo, ln2, wgu, wdown; /* offsets; bqkv == SIZE_MAX without qkv bias */
    size_t qknorm; /* q_norm [D] then k_norm [D], adjacent, after down; SIZE_MAX without qk_norm */
    size_t post_attn, post_ffn; /* gemma3: the norms of the attention and MLP outputs (each [C], before the
                                 * residual add), last in the layer; SIZE_MAX otherwise */
} qt_layer_offsets;

typedef struct {
    qt_model_cfg cfg;
    int n_tensors;
    qt_tensor *tensors;        /* owned */
    qt_layer_offsets *layers;  /* owned, cfg.num_layers entries */
    size_t embed, final_norm, lm_head; /* lm_head == embed when tied */
    size_t numel;              /* length of the flat array, padding included */
    size_t n_params;           /* real parameters (tied embedding counted once) */
    size_t unit_align;         /* every shard unit starts at a multiple of it (QT_LAYOUT_ALIGN: the compact layout) */
    size_t compact_numel;      /* numel of the compact layout: a checkpoint blob's elements */
    int n_units;               /* the embedding, each layer, the final norm with the LM head */
    size_t *unit_at;           /* owned, n_units + 1 entries: each unit's first element, then numel */
    size_t *unit_compact;      /* owned, n_units + 1 entries: the same in the compact layout, then compact_numel */
} qt_layout;

/* The most elements a model may have (2^40: 4 TiB of fp32 weights), so that every size derived
 * from a config is far from overflowing 64 bits. */
#define QT_MODEL_MAX_NUMEL (1ull << 40)
#define QT_MODEL_MAX_LAYERS 65536

/* Checks cfg (positive sizes, H % Hkv, head_dim given or C % H == 0, head_dim even, finite
 * rope_theta and rms_norm_eps, the RoPE scaling parameters of its rope_type (qt_rope_validate), the
 * fused matrices' rows within int, at most QT_MODEL_MAX_NUMEL elements). Returns 0, or -1 with a message
 * that starts with the field it blames ("model.num_kv_heads: expected a divisor of num_heads (14), got 3";
 * "model: ..." for the total). */
int qt_model_cfg_validate(const qt_model_cfg *cfg, char *err, size_t errlen);
/* The flat array's length for cfg, padding included, computed without overflow (UINT64_MAX when
 * it does not fit 64 bits). cfg's int fields must be >= 0. */
uint64_t qt_model_cfg_numel(const qt_model_cfg *cfg);
/* 1 when layer l is a local (sliding) layer: from window_layers_from on, and not a global layer of
 * window_pattern. The one rule of the layer types, which the window and the RoPE of a layer follow. */
int qt_model_layer_local(const qt_model_cfg *cfg, int l);
/* Layer l's attention window: sliding_window when the layer is local (and sliding_window > 0), else 0
 * (causal). Every trainer and the export read it. */
int qt_model_layer_window(const qt_model_cfg *cfg, int l);
/* Layer l's RoPE config: cfg itself, or for a local layer of a model with rope_local_theta, a copy with
 * that base and the default RoPE (Gemma 3). */
qt_model_cfg qt_model_layer_rope(const qt_model_cfg *cfg, int l);
/* The attention scale: attn_scalar^-0.5 when set, else head_dim^-0.5. */
double qt_model_attn_scale(const qt_model_cfg *cfg);
/* 0 when the GPU model trains c's architecture (every family above: Gemma 3 through qt_gpu_family.h and its
 * post-norm offsets), else -1 with a message naming model.arch. */
int qt_model_gpu_check(const qt_model_cfg *c, char *err, size_t errlen);
/* Gemma 3 maths (the (1 + w) norms, sandwich norms, GeGLU-tanh, scaled embedding): 1 for arch gemma3. */
static inline int qt_model_is_gemma(const qt_model_cfg *cfg) { return cfg->arch == QT_ARCH_GEMMA3; }
/* Fills head_dim (when 0 and H divides C: C/H), num_kv_heads (when 0: H), the family's rope_theta and
 * rms_norm_eps when 0 (qwen2 and qwen3 1e6, 1e-6; llama 1e4, 1e-5; mistral 1e4, 1e-6; gemma3 1e6, 1e-6), the
 * RoPE defaults (qt_rope_finish); qwen3 and gemma3 get qk_norm. */
void qt_model_cfg_finish(qt_model_cfg *cfg);
/* Builds the tensor table of the compact layout (unit alignment QT_LAYOUT_ALIGN). Caller frees with
 * qt_layout_free. Returns 0 or -1 (invalid cfg). */
int qt_layout_init(qt_layout *L, const qt_model_cfg *cfg, char *err, size_t errlen);
/* The same with every unit (the embedding at 0, each layer's ln1, the final norm) and the end at a multiple of
 * unit_align (a multiple of QT_LAYOUT_ALIGN; the padding between is zero). -1 with err for a bad unit_align. */
int qt_layout_init_units(qt_layout *L, const qt_model_cfg *cfg, size_t unit_align, char *err, size_t errlen);
void qt_layout_free(qt_layout *L);
/* The compact index of flat element i (i in a unit's padding: where that unit's compact part ends). */
size_t qt_layout_compact(const qt_layout *L, size_t i);
/* The flat index of compact element c (< compact_numel). */
size_t qt_layout_flat(const qt_layout *L, size_t c);
/* One past layer l's last element in the flat array: the next layer's first (ln1), or the final norm. */
static inline size_t qt_layer_end(const qt_layout *L, int l) {
    return l + 1 < L->cfg.num_layers ? L->layers[l + 1].ln1 : L->final_norm;
}
/* The tensor with this HF name, or NULL. */
const qt_tensor *qt_layout_find(const qt_layout *L, const char *name);
/* Fills w (L->numel floats): matrices and embeddings ~ N(0, std) from the seed, norms 1 (gemma3's 0: they
 * scale by 1 + w), biases and padding 0. Deterministic for a seed whatever the thread count. */
void qt_layout_init_weights(const qt_layout *L, float *w, uint64_t seed, float std);
/* The same values for the flat elements [lo, lo + n) only, into dst[0, n) (each element is a hash of
 * (seed, its compact index): a range is bit-identical to that part of the whole array, and a tensor's values
 * are the same at every unit alignment). */
void qt_layout_init_range(const qt_layout *L, size_t lo, size_t n, float *dst, uint64_t seed, float std);
/* How those values fill tensor t: QT_INIT_NORMAL (2-D: N(0, std) by flat index), QT_INIT_CONST (norms: *v, 1 or
 * gemma3's 0) or QT_INIT_ZERO (biases). */
enum { QT_INIT_ZERO, QT_INIT_CONST, QT_INIT_NORMAL };
int qt_layout_init_kind(const qt_layout *L, const qt_tensor *t, float *v);
/* Matmul FLOPs per token of one training step (forward + backward), T = sequence length:
 *   6 * (L * (C*(H+2*Hkv)*D + H*D*C + 3*C*F) + V*C)   every matmul weight, the LM head even when tied
 * + 6 * L * H * D * T                                 causal attention: QK^T and PV take 2*2*H*D*T/2
 *                                                     forward per token per layer, x3 for fwd + bwd
 * where a layer with a sliding window W < T counts W - W^2/(2T) keys per query instead of T/2. */
double qt_model_flops_per_token(const qt_model_cfg *cfg, int T);

#endif
