/* qt_config.h — one YAML file describes a run; `--set a.b=v` overrides keys.
 *
 * Every key, its type, range and default is listed in configs/README.md (and in the key table of
 * src/config/config.c, which is the single source of truth: the README is checked against it by a test).
 * Errors name the file, line:column and key and say what was expected:
 *   configs/x.yaml:12:3: optim.lr: expected a number > 0, got "fast"  */
#ifndef QT_CONFIG_H
#define QT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "qt_dpo.h"
#include "qt_lora.h"
#include "qt_model.h"
#include "qt_modes.h"

#define QT_PATH_MAX 1024

typedef enum { QT_SCHED_COSINE, QT_SCHED_LINEAR, QT_SCHED_WSD } qt_sched_kind;
typedef enum { QT_DEVICE_AUTO, QT_DEVICE_CPU, QT_DEVICE_CUDA } qt_device_kind;

#define QT_LIST_MAX 16
typedef struct {
    int n;                 /* entries used; the rest of v stays zero */
    int v[QT_LIST_MAX];
} qt_int_list;

/* The config in sections, one struct per YAML section: the C path of a key is its YAML path
 * (optim.lr is cfg->optim.lr). Each module is handed the section it reads. */
typedef struct {
    char from[QT_PATH_MAX];       /* HF dir (config.json + model.safetensors) or a file in it; "" = scratch */
    uint64_t seed;
    float std;
} qt_init_cfg;

typedef struct {
    char train[QT_PATH_MAX], eval[QT_PATH_MAX]; /* shard globs */
    char tokenizer[QT_PATH_MAX];  /* HF tokenizer folder the shards were made with; "" = init.from's */
    int seq_len, micro_batch, grad_accum;
    int attention;                /* qt_docs_mode: QT_DOCS_AUTO = document when the shards carry document starts */
    int positions;                /* qt_docs_mode: QT_DOCS_AUTO = document with attention document, else window */
} qt_data_cfg;

/* data.attention and data.positions: per packed document, over the whole window, or chosen at start. */
/* objective: lm = next-token cross-entropy over the unmasked targets; dpo = the sigmoid DPO loss over pairs of
 * sequences (qt_dpo.h, shards of tools/tokenize --pairs). */
typedef enum { QT_OBJ_LM = 0, QT_OBJ_DPO = 1 } qt_objective;
typedef enum { QT_DOCS_AUTO = 0, QT_DOCS_DOCUMENT, QT_DOCS_WINDOW } qt_docs_mode;

typedef struct {
    float lr, final_lr_frac, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup, cooldown, steps;
    qt_sched_kind schedule;
    int decay_embeddings;         /* weight decay on the embedding / LM head too */
} qt_optim_cfg;

typedef struct {
    int every, batches;
} qt_eval_cfg;

/* checkpoint.offloaded: how a checkpoint takes an offloaded optimizer state (one GPU) */
typedef enum {
    QT_CKPT_OFFLOAD_AUTO,     /* copy when the host can hold the copy (qt_trainer_offload_mode), else in place */
    QT_CKPT_OFFLOAD_COPY,     /* copied into snapshot buffers: + its bytes of host memory, stall = the copy */
    QT_CKPT_OFFLOAD_IN_PLACE  /* written where it lives: no memory, stall up to the write time */
} qt_ckpt_offload;

typedef struct {
    char dir[QT_PATH_MAX];
    int every, keep;
    qt_ckpt_offload offloaded;
} qt_checkpoint_cfg;

typedef struct {                  /* HF safetensors + config.json at the end of the run */
    char dir[QT_PATH_MAX];        /* "" = <checkpoint.dir>/export */
    int bf16;                     /* export.dtype: bf16 (1) or fp32 (0) */
} qt_export_cfg;

typedef struct {
    char file[QT_PATH_MAX];       /* JSONL log; not given: <run.dir>/log.jsonl */
    char tensorboard[QT_PATH_MAX]; /* TensorBoard event files' folder; "" = none */
    int every;
} qt_log_cfg;

typedef struct {
    char dir[QT_PATH_MAX];        /* the run's folder: checkpoint.dir and log.file default inside it */
} qt_run_cfg;

typedef struct {                  /* GPU; qt_dtype values */
    int model_dtype, matmul_dtype, grad_dtype, opt_m_dtype, opt_v_dtype;
    int stochastic_rounding, persistent_quants;
    int master_dtype;             /* fp32: separate master copy; bf16: AdamW updates the bf16 weights (SR) */
    int grad_accum_dtype;         /* dtype of the weight-gradient buffers (fp32 or bf16) */
} qt_precision_cfg;

typedef struct {                  /* GPU */
    int lmhead_chunks;
    int recompute;                /* memory.recompute: qt_recompute_part bits */
    int attn_bwd_chunks;          /* attention backward over this many slices of the micro-batch */
    int offload_optimizer;        /* master weights and AdamW moments in pinned host memory */
    int fp8_weight_cache;         /* memory.fp8_weight_cache: qt_fp8_wcache */
    int offload_residual;         /* each layer's input residual in pinned host memory (two device slots) */
    int offload;                  /* memory.offload: qt_offload_item bits, as given; the loader sets
                                   * offload_optimizer / offload_residual from it (they stay the engine's fields) */
    float gpu_limit_gib;          /* 0: no cap; else the plan's device total (context excluded) must fit */
    float host_limit_gib;         /* 0: MemAvailable from /proc/meminfo; else the host plan must fit this */
    int plan;                     /* memory.plan: 0 manual, 1 auto (qt_plan_auto picks the keys not given) */
    int host_alloc;               /* memory.host_alloc: qt_host_alloc */
    int zero_copy;                /* memory.zero_copy: AdamW reads and writes the offloaded state in host memory */
} qt_memory_cfg;

typedef struct {                  /* GPU */
    int cuda_graphs;
    int matmul_autotune;          /* time cuBLASLt's candidate algorithms on each shape's first use */
    int deterministic;            /* the same bits run after run: deterministic attention backward, the
                                   * autotuned algorithms kept and reused */
    char tuning_cache[QT_PATH_MAX]; /* file of the autotuned picks between runs ("~/" = home; "" none) */
} qt_perf_cfg;

typedef struct {
    int gpus;                     /* 0 = all visible */
    qt_int_list devices;          /* one rank per entry, on that CUDA device (may repeat); n 0 = by gpus */
    int comm;                     /* qt_comm_kind (qt_comm.h): the transport between GPUs */
    int shard_optimizer;          /* zero >= 1 (set from parallel.zero when the config is read) */
    int zero;                     /* ZeRO level: 1 optimizer state, 2 + fp32 gradients, 3 + bf16 weights sharded */
    int reduce_dtype;             /* qt_dtype the gradients cross between GPUs in (fp32 or bf16) */
    int overlap_comm;             /* sums overlap the backward, the weight all-gather the next forward */
    int gather_dtype;             /* qt_dtype ZeRO-3's layer gathers move (bf16, or e4m3 with fp8 matmuls) */
    int nodes;                    /* machines, one qtrain process each (qt_launch.h); 1 = this one only */
} qt_parallel_cfg;

typedef struct qt_config {
    char path[QT_PATH_MAX];       /* the YAML file (for messages) */
    uint64_t seed;
    qt_device_kind device;
    qt_run_cfg run;
    /* model: either hf_config (a config.json) or the inline fields; model_inline says which were given */
    char hf_config[QT_PATH_MAX];
    qt_model_cfg model;
    int model_inline;             /* 1 when any inline model key was given */
    unsigned char given[128];     /* per key index (qt_config_key_at): 1 when the file or a --set gave it */
    qt_init_cfg init;
    qt_data_cfg data;
    qt_optim_cfg optim;
    qt_eval_cfg eval;
    qt_checkpoint_cfg checkpoint;
    qt_export_cfg export;
    qt_log_cfg log;
    qt_precision_cfg precision;
    qt_memory_cfg memory;
    qt_perf_cfg perf;
    qt_parallel_cfg parallel;
    qt_lora_cfg lora;             /* lora.rank 0: full fine-tuning; else adapters over a frozen base (qt_lora.h) */
    int objective;                /* qt_objective: what a step's loss is */
    qt_dpo_cfg dpo;               /* dpo.*: the DPO loss's settings (objective: dpo; qt_dpo.h) */
} qt_config;

/* The key table: one row per YAML key, the single source of truth for parsing, validation, defaults,
 * qt_config_dump and the table in configs/README.md. */
typedef enum { QT_KEY_INT, QT_KEY_U64, QT_KEY_FLOAT, QT_KEY_BOOL, QT_KEY_STRING, QT_KEY_ENUM, QT_KEY_INT_LIST,
              QT_KEY_NAME_LIST } qt_key_type;
typedef struct {
    const char *name;
    int value;
} qt_key_enum;
typedef struct {
    const char *path;          /* "optim.lr" */
    qt_key_type type;
    size_t offset;             /* of the field in qt_config (int, uint64_t, float, char[QT_PATH_MAX],
                                * qt_int_list or, for a name list, int) */
    double lo, hi;             /* numeric range (of each entry of a list); -HUGE_VAL / HUGE_VAL when unbounded */
    int lo_open, hi_open;      /* 1: the bound itself is excluded */
    const qt_key_enum *names;  /* QT_KEY_ENUM, QT_KEY_NAME_LIST (values are bits, stored OR-ed in an int):
                                * {NULL, 0}-terminated */
    const char *def;           /* default, as YAML scalar text */
    const char *used_by;       /* which trainer path reads it: "all", "GPU", "multi-GPU" */
    int model_inline;          /* 1: an inline model key (sets qt_config.model_inline) */
    const char *help;
} qt_config_key;

/* Row i of the key table, or NULL when i is past the end. */
const qt_config_key *qt_config_key_at(int i);
/* The row for a dotted path ("optim.lr"), or NULL. */
const qt_config_key *qt_config_key_find(const char *path);
/* Parses text (a YAML scalar's value) into k's field of c. Returns 0, or -1 leaving c unchanged. */
int qt_config_key_set(qt_config *c, const qt_config_key *k, const char *text);
/* The longest text qt_config_key_format writes, NUL included: a string of QT_PATH_MAX - 1 bytes
 * whose every byte needs a 4-character escape, and its quotes. */
#define QT_KEY_TEXT_MAX (4 * QT_PATH_MAX + 8)
/* Writes k's value in c as a YAML scalar that the loader reads back exactly (cap >= QT_KEY_TEXT_MAX
 * for every value to fit). */
void qt_config_key_format(const qt_config *c, const qt_config_key *k, char *buf, size_t cap);
/* Writes what k accepts, as error messages say it: "a number > 0", "one of cosine|linear|wsd". */
void qt_config_key_expect(const qt_config_key *k, char *buf, size_t cap);
/* 1 when every key (and model_inline) is equal in a and b; else 0 and *diff names the first key. */
int qt_config_equal(const qt_config *a, const qt_config *b, const char **diff);
/* Writes the markdown key table of configs/README.md (header and one row per key). Returns the
 * length written (excluding NUL), truncating at cap like snprintf. */
size_t qt_config_doc_table(char *buf, size_t cap);

/* 1 when path is a key memory.plan: auto chooses; such a key given as `auto` counts as not given. */
int qt_config_plan_key(const char *path);

/* Which of master, m, v live in pinned host memory (QT_OFF_MASTER | QT_OFF_M | QT_OFF_V bits): memory.offload's
 * items (the loader makes memory.offload_optimizer alone all three). */
int qt_config_opt_offload_mask(const qt_config *c);
/* The older spellings are memory.offload's items and parallel.zero: memory.offload_optimizer (master, m, v),
 * memory.offload_residual (residual), parallel.shard_optimizer (zero >= 1). The loader maps them; nothing else
 * reads them. These set the canonical key and keep its older spelling equal (for qt_config_dump):
 * items QT_OFF_OPTIMIZER or QT_OFF_RESIDUAL on (the items already named stay, else all of them) or off. */
void qt_config_set_offload(qt_config *c, int items, int on);
void qt_config_set_zero(qt_config *c, int zero);
/* memory.offload has weights and quants: the offloaded weights' e4m3 codes are what crosses to the GPU
 * (the config check refuses quants without weights). */
int qt_config_offload_quants(const qt_config *c);

/* 1 when key path's value, when not given, derives from other keys (checkpoint.dir and log.file from
 * run.dir, data.eval from data.train): qt_config_dump leaves such a key out (as a comment) when it was
 * not given, so that the text read back derives it again. */
int qt_config_derived_key(const char *path);
/* 1 when the config file or a --set gave key path (not its default). */
int qt_config_given(const qt_config *c, const char *path);
/* Marks key path as not given, its value kept: what `--set path=auto` does to a planner key. */
void qt_config_ungive(qt_config *c, const char *path);
/* Fills every field with its default. */
void qt_config_defaults(qt_config *c);
/* Loads path over the defaults, then applies overrides ("optim.lr=3e-4"; the value is parsed as a
 * YAML scalar). Returns 0, or -1 with one message in err (file:line:col: key: expected ..., got ...;
 * "--set optim.lr=x: ..." for overrides). */
int qt_config_load(qt_config *c, const char *path, const char *const *overrides, int n_overrides,
                   char *err, size_t errlen);
/* The same from YAML text in memory; name stands in for the file name in messages. */
int qt_config_load_string(qt_config *c, const char *yaml, const char *name,
                          const char *const *overrides, int n_overrides, char *err, size_t errlen);
/* Writes every key with its resolved value as YAML that qt_config_load_string reads back to an
 * equal config. Returns the length written (excluding NUL), truncating at cap like snprintf. */
size_t qt_config_dump(const qt_config *c, char *buf, size_t cap);

#endif
