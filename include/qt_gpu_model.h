/* qt_gpu_model.h — the Llama/Qwen2 model on one GPU in bf16: its memory plan, forward and backward.
 *
 * Everything lives in one device allocation carved by a plan (printed as the allocator table at start):
 * bf16 weights, fp32 master weights, fp32 gradients, AdamW m and v (fp32 or bf16), per-layer saved
 * activations for one micro-batch, the LM-head logits chunk, and the workspaces (with
 * memory.offload_optimizer, master, m and v live in pinned host memory instead: qt_gpu_optim.h).
 * The layout of every parameter buffer is the flat qt_layout array, so checkpoints and HF export see
 * the CPU's layout. */
#ifndef QT_GPU_MODEL_H
#define QT_GPU_MODEL_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "qt_attention.h"
#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_gpu_fp8.h"
#include "qt_gpu_optim.h"
#include "qt_kernels.h"
#include "qt_matmul.h"
#include "qt_model.h"
#include "qt_partition.h"

/* One layer's saved activations (bf16 unless noted), N = B*T tokens. */
typedef struct {
    void *res;      /* [N,C] residual stream entering the layer (input of ln1) */
    void *ln1;      /* [N,C] */
    float *rstd1;   /* [N] */
    void *qkv;      /* [N,(H+2Hkv)D] after RoPE */
    void *att;      /* [N,H*D] attention output */
    float *lse;     /* [B,H,T] attention softmax statistics */
    void *res_mid;  /* [N,C] o_proj output, then (after the fused add) the residual after attention */
    void *ln2;      /* [N,C] */
    float *rstd2;   /* [N] */
    void *gu;       /* [N,2F] gate|up */
    void *h;        /* [N,F] SwiGLU output */
} qt_gpu_layer;


typedef struct {
    const qt_layout *L; /* borrowed */
    const qt_config *cfg; /* borrowed */
    int B, T;
    long N;
    cudaStream_t stream;
    qt_matmul_ctx *mm;
    qt_attention_ctx *attn;
    char *arena;        /* the one allocation (owned) */
    size_t arena_bytes;
    /* parameters: w and grad [shard.total] (L->numel, padded for the ranks' equal pieces); master, m, v
     * [shard.len], this rank's pieces of the buckets back to back (all of the array on one GPU) */
    void *w;            /* bf16 */
    float *master, *grad; /* master: device, or host_state when offloaded (m and v too) */
    void *m, *v;
    qt_dtype m_dt, v_dt;
    qt_shard shard;
    double *sumsq;      /* [ranks][buckets] the gradient sums of squares of every rank's pieces (sharded norm) */
    /* Hooks (when set), called as the work is enqueued. weights_needed: the next op on g->stream reads
     * weights below flat index upto (before the embeddings, each layer, the final norm and LM head; a
     * data-parallel rank waits there for the all-gather of those weights). grads_ready: every gradient
     * at flat index >= from is final on g->stream (after the final norm, each layer, and 0 at the end). */
    void (*weights_needed)(void *ctx, size_t upto);
    void (*grads_ready)(void *ctx, size_t from);
    /* embed_ready: called once the LM head's backward is done (with skip_lookups: every gradient of
     * the embedding table is then final but for this micro-batch's lookups). */
    void (*embed_ready)(void *ctx);
    void *hook_ctx;
    int skip_lookups;   /* leave the embedding backward out: the engine adds every rank's lookups to its
                         * piece itself, from dres and tok, through `lookups` */
    /* activations */
    qt_gpu_layer *layers; /* host array of L->cfg.num_layers (owned) */
    void *res_final;    /* [N,C] down output of the last layer, then the final residual */
    void *lnf;          /* [N,C] */
    float *rstdf;       /* [N] */
    void *logits;       /* [N/chunks, V] */
    void *lookups;      /* over logits (sharded data parallel where ranks x N x (C+1) < V x C; else NULL):
                         * [ranks][N] tokens, [ranks][N][C] fp32 dres, an embedding-backward workspace
                         * (qt_gpu_model_lookups) */
    float *losses;      /* [N] */
    double *loss_sum;   /* device scalar: sum of losses since the last read */
    float *norm, *clip; /* device scalars */
    /* gradient scratch */
    float *dres;        /* [N,C] fp32 residual-stream gradient */
    void *dres_bf;      /* [N,C] its bf16 copy for the matmuls */
    void *dln;          /* [N,C] */
    void *datt;         /* [N,H*D] */
    void *dqkv;         /* [N,(H+2Hkv)D] */
    void *dlnf;         /* [N,C] */
    int32_t *tok, *tgt; /* [N] device */
    float *rope_cs;     /* [T, D] */
    void *ws;           /* kernel workspace */
    size_t ws_bytes;
    qt_gpu_optim *opt;  /* AdamW of this rank's pieces in groups: sharded, bucket 0 (the embeddings,
                         * gathered while group 1 runs) and the rest; one GPU offloaded, one group per
                         * (per-layer) bucket; else one group */
    char *host_state;   /* memory.offload_optimizer: pinned host memory holding master, m and v (owned) */
    size_t host_state_bytes;
    void *opt_slots;    /* offloaded: the device slots the state streams through, opt_chunk elements each */
    size_t opt_chunk;
    int lm_chunks;
    struct qt_gpu_prof *prof; /* per-op event timing, NULL when off */
    /* fp8 blocks (precision.matmul_dtype: e4m3); NULL/unused in bf16 */
    qt_gpu_fp8 *fp8;    /* owned host state; its device buffers are the two regions below */
    void *fp8_w, *fp8_a;
    /* plan, for the allocator table */
    int n_plan;
    struct { const char *kind; size_t bytes; } plan[24];
} qt_gpu_model;

/* Plans and allocates everything on the current device for micro-batches of B x T, uploads w0 (fp32
 * [L->numel]) to the bf16 weights and this shard's master copy (sh NULL: one GPU, one bucket). NULL
 * with err when it does not fit (names the plan). */
qt_gpu_model *qt_gpu_model_create(const qt_layout *L, const qt_config *cfg, const float *w0,
                                  const qt_shard *sh, char *err, size_t errlen);
void qt_gpu_model_free(qt_gpu_model *g);
void qt_gpu_model_print_plan(const qt_gpu_model *g);

/* Forward of the tokens already in g->tok / g->tgt. With backward: grads += d(loss_scale * sum of
 * token losses)/dw and the LM head's backward runs chunk by chunk inside the forward. Without: loss
 * only (logits overwritten). The token losses are added to *g->loss_sum. Asynchronous on g->stream. */
void qt_gpu_model_step(qt_gpu_model *g, float loss_scale, int backward);
/* Per-op timing with CUDA events (train_bench --breakdown). mark() starts an interval named label on
 * the stream (a no-op when profiling is off); collect() waits for the stream and adds the closed
 * intervals to per-label totals; print() prints ms per step over `steps` steps and resets. */
void qt_gpu_model_profile(qt_gpu_model *g, int on);
void qt_gpu_model_mark(qt_gpu_model *g, const char *label);
void qt_gpu_model_profile_collect(qt_gpu_model *g);
void qt_gpu_model_profile_print(qt_gpu_model *g, int steps);

/* g->lookups cut into every rank's tokens [ranks][N], residual gradients at the embeddings [ranks][N][C]
 * and a qt_embedding_bwd workspace; returns its bytes (base NULL: only the size). */
size_t qt_gpu_model_lookups(const qt_gpu_model *g, void *base, int32_t **tok, float **dres, void **ws);

/* Logits [N, V] as fp32 on the host for the tokens in g->tok (synchronises). */
void qt_gpu_model_logits(qt_gpu_model *g, float *host_logits);

#endif
