/* qt_lora.h — LoRA adapters over a frozen base: their flat layout, PEFT names, init, dropout masks, merge and
 * PEFT's files.
 *
 * Per layer and target module t (q, k, v, o, gate, up, down), A_t [r, in] and B_t [out, r] live in one
 * flat fp32 array of their own (the base's qt_layout is untouched), A before B, layer by layer in target
 * order. The adapted matmul is y = x W^T + scale * (dropout(x) A^T) B^T, scale = alpha / r (rsLoRA:
 * alpha / sqrt(r)). q|k|v and gate|up share a fused base matmul: each target's output lands in its own
 * rows of the fused output (out_row0). Names are PEFT's saved ones
 * ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"). The CPU maths: qt_lora_cpu.h. */
#ifndef QT_LORA_H
#define QT_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "qt_model.h"
#include "qt_rng.h"

/* lora.targets bits, in layout order. */
typedef enum {
    QT_LORA_Q = 1, QT_LORA_K = 2, QT_LORA_V = 4, QT_LORA_O = 8, QT_LORA_GATE = 16, QT_LORA_UP = 32, QT_LORA_DOWN = 64
} qt_lora_target;
#define QT_LORA_ALL 127
#define QT_LORA_N_TARGETS 7

/* lora.trainable bits: base tensors that train beside the adapters. */
typedef enum { QT_LORA_X_EMBED = 1, QT_LORA_X_LM_HEAD = 2, QT_LORA_X_NORMS = 4 } qt_lora_extra;

/* The base matmul an adapter adds into: its input and fused output (the values of qt_cpu_model.h's sites). */
typedef enum { QT_LORA_SITE_QKV = 0, QT_LORA_SITE_O = 1, QT_LORA_SITE_GU = 2, QT_LORA_SITE_DOWN = 3 } qt_lora_site;

typedef struct {
    int rank;        /* r > 0 */
    float alpha;
    int rslora;      /* scale alpha / sqrt(r) instead of alpha / r */
    float dropout;   /* p in [0, 1) on the adapter input */
    int targets;     /* qt_lora_target bits, != 0 */
    int trainable;   /* qt_lora_extra bits */
    int export_merged; /* lora.export: 1 = the merged model in the family's HF format; 0 = PEFT's adapter files */
    int base_nf4;    /* lora.base_dtype: 1 = the block matrices of the frozen base in NF4 on the GPU (QLoRA); 0 = bf16 */
} qt_lora_cfg;

typedef struct {
    char name[128];  /* PEFT name */
    int layer, target; /* target: index 0..6 (q..down) */
    int is_b;        /* 0: A [r, in]; 1: B [out, r] */
    int64_t rows, cols;
    size_t offset, numel;
} qt_lora_tensor;

/* One adapted module of one layer. */
typedef struct {
    int target;            /* index 0..6 */
    qt_lora_site site;
    int in, out;           /* the module's input and output widths */
    int out_row0, out_ld;  /* its first row in the site's fused output, and that output's width */
    size_t a, b;           /* offsets of A and B in the adapter array */
} qt_lora_module;

typedef struct {
    qt_lora_cfg cfg;
    float scale;             /* alpha / r, or alpha / sqrt(r) */
    int n_layers, per_layer; /* modules per layer = popcount(targets) */
    qt_lora_module *mods;    /* owned, [n_layers * per_layer], layer-major in target order */
    int n_tensors;
    qt_lora_tensor *tensors; /* owned, A then B of each module */
    size_t numel;            /* adapter array length */
} qt_lora_layout;

/* Checks cfg (rank >= 1, alpha finite > 0, dropout in [0, 1), targets a non-empty subset): 0, or -1 with
 * a message naming the lora.* key. */
int qt_lora_cfg_validate(const qt_lora_cfg *cfg, char *err, size_t errlen);
/* Builds the adapter layout over the base model mc. Free with qt_lora_layout_free. */
int qt_lora_layout_init(qt_lora_layout *A, const qt_lora_cfg *cfg, const qt_model_cfg *mc, char *err, size_t errlen);
void qt_lora_layout_free(qt_lora_layout *A);
/* PEFT's module name of target index t ("q_proj") and its parent ("self_attn" / "mlp"). */
const char *qt_lora_target_name(int t);
/* The adapter tensor with this PEFT name, or NULL. */
const qt_lora_tensor *qt_lora_find(const qt_lora_layout *A, const char *name);
/* PEFT's default init: A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch's kaiming_uniform_ with a = sqrt(5)), each
 * element a hash of (seed, its index); B = 0. a[A->numel]. */
void qt_lora_init(const qt_lora_layout *A, float *a, uint64_t seed);
/* The seed of one dropout mask: a hash of (run seed, step, micro-batch, layer, target). micro is the
 * micro-batch's index in the step's global batch (the CPU engine's micro-step; with data parallel it must
 * count over the ranks, so the masks do not depend on the rank count). */
uint64_t qt_lora_mask_seed(uint64_t seed, long step, long micro, int layer, int target);
/* Element i of that mask: 0 with probability p, else keep_scale (= 1 / (1 - p)). */
static inline float qt_lora_mask(uint64_t mseed, uint64_t i, float p, float keep_scale) {
    return (double)(qt_hash64(mseed, i) >> 11) * 0x1.0p-53 >= p ? keep_scale : 0.0f;
}
/* 1 when base tensor t trains beside the adapters under the lora.trainable bits (norms: every RMSNorm weight,
 * q/k norms included; embeddings; lm_head: an untied LM head). */
int qt_lora_trains(const qt_tensor *t, int trainable);
/* 1 when lora.base_dtype nf4 holds base tensor t in NF4: a block's q, k, v, o, gate, up or down matrix (the
 * embeddings, norms, biases and LM head stay in the base's own dtype, as PEFT's QLoRA keeps them). */
int qt_lora_nf4_holds(const qt_tensor *t);
/* The flat base index of the first weight module m (index into A->mods) adds to: the start of its rows of the
 * fused matrix (a message naming the HF tensor an adapter belongs to). */
size_t qt_lora_base_offset(const qt_lora_layout *A, const qt_layout *L, int m);
/* base[L->numel] += scale * B A over every adapted module's rows of the fused matrices (the merged model). */
void qt_lora_merge(const qt_lora_layout *A, const qt_layout *L, const float *a, float *base);

/* PEFT's files in dir (created): adapter_model.safetensors (fp32, PEFT names; the base tensors that train,
 * qt_lora_trains, from w[L->numel] as "base_model.model." + their name) and adapter_config.json (r,
 * lora_alpha, lora_dropout, use_rslora, target_modules, modules_to_save; base_model_name_or_path = base,
 * "" = null), atomically each. */
int qt_lora_export(const char *dir, const qt_lora_layout *A, const float *a, const qt_layout *L, const float *w,
                   const char *base, char *err, size_t errlen);
/* The same with the trained base tensors packed back to back in layout order at x (the GPU engine's copy). */
int qt_lora_export_packed(const char *dir, const qt_lora_layout *A, const float *a, const qt_layout *L, const float *x,
                          const char *base, char *err, size_t errlen);
/* Reads an adapter_model.safetensors (path: the file or its folder) into a[A->numel] and the trained base
 * tensors into w[L->numel]: every tensor present with its shape, F32, nothing else in the file. -1 with err
 * naming the file and tensor. */
int qt_lora_import(const char *path, const qt_lora_layout *A, float *a, const qt_layout *L, float *w, char *err,
                   size_t errlen);

#endif
