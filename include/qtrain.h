/* qtrain.h — the embeddable C API of qtrain (build/libqtrain.so, build/libqtrain.a): a trainer made
 * from one YAML config, stepped from its configured data or from the caller's token batches, with
 * eval, checkpoints, HF export, parameters and gradients by name and the memory plan.
 *
 * A trainer runs the same code as the `qtrain` program (src/train/train.c: the CLI is a loop over
 * the same step), so N steps here give the CLI's losses, gradient norms and checkpoints bit for bit.
 * Every step also does what the config says the run does after it: the train record every log.every
 * steps (stdout, log.file and the log callback), eval every eval.every steps, a checkpoint every
 * checkpoint.every steps and at optim.steps. With several GPUs the rank threads live inside the
 * trainer; the calls return when every rank is done.
 *
 * Errors: every call returns a qtrain_status; QTRAIN_OK is 0, and otherwise the message is
 * qtrain_error(t) (config errors name file:line:col and the key). Nothing here exits the process or
 * installs signal handlers. After QTRAIN_ERR_DEVICE (a failed CUDA call, a failed rank) the trainer
 * may only be closed; the other errors leave it usable. One thread at a time per trainer.
 *
 * Batches from the caller: tokens int32 [rows][seq_len + 1], rows = qtrain_info.rows =
 * micro_batch x grad_accum x GPUs (data.* and parallel.* keys), in the order the loader deals
 * them: row r is in micro-batch k = r / micro_batch, which micro-step k / GPUs runs on GPU k % GPUs.
 * Row r trains inputs tokens[r][0..seq_len) on targets tokens[r][1..seq_len]. The optional
 * mask, uint8 [rows][seq_len + 1] like the tokens (a shard v2 loss mask, qt_data.h): mask[r][j] = 0
 * leaves token j out of the loss as a target (column 0 is never a target); NULL and a mask of ones
 * are the same bits. The step's loss is the mean over its counted targets (qt_loss_scale). */
#ifndef QTRAIN_H
#define QTRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qtrain_trainer qtrain_trainer;

typedef enum {
    QTRAIN_OK = 0,
    QTRAIN_ERR_CONFIG = 1,     /* the YAML, an override, what the config names (init.from, ...) */
    QTRAIN_ERR_DATA = 2,       /* a token shard */
    QTRAIN_ERR_CHECKPOINT = 3, /* checkpoint.dir (locked, another run's), a checkpoint to resume, a write */
    QTRAIN_ERR_DEVICE = 4,     /* CUDA / a rank failed: close the trainer */
    QTRAIN_ERR_DIVERGED = 5,   /* NaN/Inf loss, gradient norm or weights */
    QTRAIN_ERR_IO = 6,         /* log.file, an export */
    QTRAIN_ERR_ARGUMENT = 7,   /* a bad argument: a token or mask value, an unknown tensor, a wrong size,
                                * a NaN/Inf weight to set, a call out of order */
    QTRAIN_ERR_INTERNAL = 8,   /* out of host memory, a broken invariant */
} qtrain_status;

typedef struct {
    const char *config;            /* a YAML file's path, or YAML text when config_is_text */
    int config_is_text;
    const char *const *overrides;  /* "optim.lr=3e-4" (as `qtrain --set`), n_overrides of them */
    int n_overrides;
    /* NULL: a fresh run. Else resume: a checkpoint file, or a directory (its newest valid one). With
     * config NULL the checkpoint's own config is used (the overrides still apply). */
    const char *resume;
    const char *allow_changed;     /* resume: identity keys that may change (qtrain --allow-changed) */
    int export_only;               /* load (init or resume) for export/parameters only: no run directory,
                                    * no data, no steps */
    const char *home_dir;          /* the user's home directory, for a "~/" in perf.tuning_cache (the
                                    * library reads no environment); NULL: such a cache is not used */
} qtrain_options;

/* Creates a trainer. *out is NULL on failure, with the message in err (errlen >= 1024 advised). The
 * trainer's data loader opens data.train when it is set; when it is "", every step needs tokens. On a GPU
 * run memory.plan: auto (the default) chooses the keys the config leaves open, as the qtrain program
 * does, for the GPU's free memory, ranking plans with the rates the qtrain program probed and cached in
 * <home_dir>/.cache/qtrain, else the default ones (nothing is measured here). */
qtrain_status qtrain_open(const qtrain_options *o, qtrain_trainer **out, char *err, size_t errlen);
/* Waits for a checkpoint write in flight, releases the run directory, frees everything. Returns
 * QTRAIN_ERR_CHECKPOINT with err (may be NULL) when that last write or the log failed; the trainer
 * is freed either way. Takes NULL. */
qtrain_status qtrain_close(qtrain_trainer *t, char *err, size_t errlen);
/* The message of the trainer's last error ("" after success); valid until the next call. */
const char *qtrain_error(const qtrain_trainer *t);

typedef struct {
    long step;            /* steps done */
    long steps;           /* optim.steps: the step the run (and its lr schedule) ends at */
    int rows, seq_len;    /* a caller batch: tokens [rows][seq_len + 1] */
    int micro_batch;      /* rows of one micro-batch */
    int vocab_size;
    int ranks;            /* data-parallel GPUs (1 on the CPU) */
    int n_tensors;
    size_t numel;         /* the flat parameter array (padding included) */
    size_t n_params;
    const char *engine;   /* "cpu-fp32", "gpu-bf16", ... (static) */
    const char *run_dir;  /* checkpoint.dir */
} qtrain_info;
void qtrain_get_info(const qtrain_trainer *t, qtrain_info *info);

typedef struct {
    long step;            /* steps done after this one */
    float loss;           /* mean over the step's targets */
    float grad_norm;      /* before clipping */
    float lr;
    double tokens_per_s;  /* this step's tokens over its wall time */
    int evaluated;        /* eval.every fell on this step: eval_loss is set */
    float eval_loss;
    int saved;            /* checkpoint.every fell on this step: a checkpoint was started */
} qtrain_step_result;

/* One optimizer step on the configured loader's next batch. */
qtrain_status qtrain_step(qtrain_trainer *t, qtrain_step_result *r);
/* One optimizer step on the caller's batch (see the top; mask may be NULL). Tokens are checked
 * (0 <= token < vocab_size, mask bytes 0 or 1) before anything runs: QTRAIN_ERR_ARGUMENT naming the
 * first bad [row][column] and its value. */
qtrain_status qtrain_step_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask, qtrain_step_result *r);
/* The configured loader's next step batch as a caller batch: tokens and mask [rows][seq_len + 1]
 * (mask 1 where the shard's mask counts the token as a target, 1 everywhere for unmasked shards and
 * in column 0). The loader moves on, as a step would: qtrain_step_tokens(t, tokens, mask) then gives
 * qtrain_step's result bit for bit (a masked-out last target's token reads as 0: it is never used). */
qtrain_status qtrain_next_batch(qtrain_trainer *t, int32_t *tokens, uint8_t *mask);
/* A step in two halves, for reading the gradients between them: backward (forward + backward of the
 * step's micro-batches, gradients accumulated with the step's loss scale) then update (AdamW and
 * what follows a step). qtrain_step is backward + update. */
qtrain_status qtrain_backward(qtrain_trainer *t);
qtrain_status qtrain_backward_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask);
qtrain_status qtrain_update(qtrain_trainer *t, qtrain_step_result *r);

/* The eval loss over eval.batches batches of data.eval, as the run's evals compute it. */
qtrain_status qtrain_eval(qtrain_trainer *t, float *loss);
/* The mean loss over the counted targets of the caller's rows (tokens [n_rows][seq_len + 1], mask
 * as for a step, may be NULL; n_rows a multiple of micro_batch); no gradients. */
qtrain_status qtrain_eval_tokens(qtrain_trainer *t, const int32_t *tokens, const uint8_t *mask, int n_rows, float *loss);

/* A checkpoint of the current step in checkpoint.dir, written and synced before this returns; its
 * path into path. Resume it with qtrain_options.resume. */
qtrain_status qtrain_save(qtrain_trainer *t, char *path, size_t cap);
/* HF export of the current weights to dir: model.safetensors (bf16 or fp32), config.json and the
 * tokenizer files of data.tokenizer / init.from when present. Weights holding a NaN/Inf (a diverged
 * run) are refused, QTRAIN_ERR_DIVERGED naming the first such tensor element; nothing is written. */
qtrain_status qtrain_export(qtrain_trainer *t, const char *dir, int bf16);

typedef struct {
    const char *name;     /* the HF name, "model.layers.0.self_attn.q_proj.weight" (static while open) */
    int ndim;             /* 1 or 2 */
    int64_t shape[2];
    size_t numel;
    size_t offset;        /* into the flat array of qtrain_get_weights / qtrain_get_gradients */
} qtrain_tensor;
/* Tensor i, 0 <= i < info.n_tensors, in layout order. */
qtrain_status qtrain_tensor_at(const qtrain_trainer *t, int i, qtrain_tensor *out);
/* The index of the tensor called name, or -1. */
int qtrain_tensor_find(const qtrain_trainer *t, const char *name);
/* Host fp32 copies of all weights / of the gradients accumulated by qtrain_backward (zero after an
 * update), flat [info.numel] (tensor i at its offset). On a GPU the weights are the fp32 master copy. */
qtrain_status qtrain_get_weights(qtrain_trainer *t, float *flat);
qtrain_status qtrain_get_gradients(qtrain_trainer *t, float *flat);
/* One tensor: n must equal its numel. Setting writes the fp32 weights (on a GPU the master copy and
 * the model-dtype copy rounded from it); the optimizer state is kept. Not between backward and update;
 * a NaN/Inf in src is refused (QTRAIN_ERR_ARGUMENT naming the tensor and element), nothing written. */
qtrain_status qtrain_get_parameter(qtrain_trainer *t, const char *name, float *out, size_t n);
qtrain_status qtrain_set_parameter(qtrain_trainer *t, const char *name, const float *src, size_t n);

/* One tensor's accumulated gradients in device memory (fp32, C-contiguous, shape as qtrain_tensor),
 * for sharing without a copy (DLPack): the device has finished writing them when this returns. Valid
 * until the next backward/update/step and while the trainer is open. One GPU only: other engines
 * return QTRAIN_ERR_ARGUMENT (read qtrain_get_gradients' host copies there). */
typedef struct {
    float *data;          /* device pointer */
    int device;           /* CUDA device id */
    int ndim;
    int64_t shape[2];
} qtrain_device_tensor;
qtrain_status qtrain_gradient_device(qtrain_trainer *t, const char *name, qtrain_device_tensor *out);

/* Learning rate for the following steps: lr >= 0 replaces the schedule by this constant; lr < 0
 * returns to the schedule (optim.*). */
qtrain_status qtrain_set_lr(qtrain_trainer *t, float lr);
/* The memory plan as text (the table the program prints at start: device rows, host rows); returns
 * the length it needs (excluding NUL), truncating at cap like snprintf. */
size_t qtrain_plan(qtrain_trainer *t, char *buf, size_t cap);
/* The CUDA devices of the ranks, in rank order, into ids (at most cap); returns their count (0 on
 * the CPU engine). */
int qtrain_devices(const qtrain_trainer *t, int *ids, int cap);
/* Called with each JSON record the run logs (train, eval, ckpt: the lines of log.file, no newline),
 * on the calling thread, during step/update. fn NULL removes it. */
void qtrain_set_log_callback(qtrain_trainer *t, void (*fn)(void *ctx, const char *json), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
