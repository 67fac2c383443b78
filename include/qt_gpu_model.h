/* qt_gpu_model.h — the Llama/Qwen2 model on one GPU in bf16 (fp8 blocks optional): its buffers,
 * forward and backward.
 *
 * Everything lives in one device allocation carved by a memory plan (qt_mem_plan.h, printed as the
 * allocator table at start), whose rows come from three owners: the parameter store (weights,
 * gradients, optimizer state: qt_param_store.h), the activation store (per-layer saved activations and
 * the backward's scratch: qt_act_store.h) and the model itself (LM-head logits chunk, tokens, RoPE
 * table, kernel workspace, fp8 buffers). The layout of every parameter buffer is the flat qt_layout
 * array, so checkpoints and HF export see the CPU's layout. */
#ifndef QT_GPU_MODEL_H
#define QT_GPU_MODEL_H

#include "qt_cuda_types.h"
#include <stdint.h>

#include "qt_act_store.h"
#include "qt_attention.h"
#include "qt_docs.h"
#include "qt_dtype.h"
#include "qt_gpu_family.h"
#include "qt_gpu_fp8.h"
#include "qt_kernels.h"
#include "qt_matmul.h"
#include "qt_mem_plan.h"
#include "qt_model.h"
#include "qt_param_store.h"

/* Device memory the runtime takes as training starts, outside any buffer of ours and beside the CUDA
 * context: lazily loaded kernel modules, cuBLASLt/cuDNN handles, CUDA graph instantiations, AdamW's
 * tensor table. A fixed row of the plan, checked on the GPU by test_plan. */
#define QT_GPU_RUNTIME_RESERVE ((size_t)512 << 20)

/* The documents of the micro-batch (qt_gpu_model_set_docs): device arrays the attention and RoPE read. */
typedef struct {
    int32_t *kv_lo;        /* device [N]: each query's first key (attention per packed document), or NULL: causal */
    int32_t *pos;          /* device [N]: each token's RoPE position (restarting per document), or NULL: t */
    int32_t *buf;          /* device [2N] (owned, allocated by the first qt_gpu_model_set_docs): kv_lo, then pos */
    int32_t *host[2];      /* pinned [2N] staging, alternated (owned, with buf) */
    cudaEvent_t free[2];   /* recorded after the copy that read host[k] */
    int k;
} qt_gpu_docs;

typedef struct {
    const qt_layout *L;    /* borrowed */
    const qt_plan *pl;     /* the store's copy of the plan (ps->plan) */
    int B, T;
    long N;
    int lm_chunks;
    int attn_chunks;       /* memory.attn_bwd_chunks, at most B */
    int fp8_fwd;           /* precision.matmul_dtype e4m3: the blocks' matmuls in fp8 (through g->fp8) */
    int fp8_bwd;           /* and their backward too (precision.grad_dtype e4m3 or e5m2; bf16: backward in bf16);
                            * over a frozen base (LoRA) the data gradient only */
    cudaStream_t stream;
    qt_matmul_ctx *mm;
    qt_attention_ctx *attn;
    size_t attn_ws;        /* the attention workspace the plan counts (measured from cuDNN's plans on a GPU) */
    char *arena;           /* the one allocation (owned), carved by plan */
    qt_mem_plan plan;
    qt_param_store *ps;    /* owned */
    qt_act_store *as;      /* owned */
    struct {               /* the LM head's outputs */
        void *logits;      /* [N/chunks, V] */
        void *lookups;     /* over logits (sharded data parallel where ranks x N x (C+1) < V x C; else NULL):
                            * [ranks][N] tokens, [ranks][N][C] fp32 dres, an embedding-backward workspace
                            * (qt_gpu_model_lookups) */
        float *losses;     /* [N] */
        double *loss_sum;  /* device scalar: sum of losses since the last read */
    } head;
    int32_t *tok, *tgt;    /* [N] device */
    float *rope_cs;        /* [T, D] */
    void *ws;              /* kernel workspace */
    size_t ws_bytes;
    qt_gpu_fp8 *fp8;       /* precision.matmul_dtype: e4m3 (owned host state; its device buffers are fp8_w,
                            * fp8_a); NULL in bf16 */
    void *fp8_w, *fp8_a;
    struct {               /* what the model measures of itself */
        struct qt_gpu_prof *prof; /* per-op event timing, NULL when off */
        double start_host_s, start_init_s; /* qt_gpu_model_create's seconds pinning host memory and setting the
                            * weights (printed with the plan: a 14B box rank pins ~50 GiB) */
    } timing;
    qt_gpu_docs docs;      /* packed documents' per-token bounds and positions (qt_gpu_model_set_docs) */
    qt_gpu_family fam;     /* the family's kernels and scales (qt_gpu_family.h), from L->cfg */
    float *rope_cs_local;  /* [T, D] the local layers' RoPE table (cfg.rope_local_theta > 0), else NULL */
    struct qt_gpu_base *base; /* LoRA (plan lora.rank > 0): the frozen base's placement (qt_gpu_base.h, owned); ps is
                            * NULL then and no weight gets a gradient. NULL: ps holds the trained weights */
    struct qt_gpu_lora *lora; /* with base: the adapters beside the block matmuls (qt_gpu_lora.h, owned) */
} qt_gpu_model;

/* One micro-step's arguments. With backward: grads += d(loss_scale * sum of token losses)/dw and the
 * LM head's backward runs chunk by chunk inside the forward; without: loss only (logits overwritten).
 * skip_lookups leaves the embedding backward out (the data-parallel sync adds every rank's lookups to
 * its piece itself, from dres and tok, through g->head.lookups). hooks: the engine's, called as the work is
 * enqueued (qt_param_store.h); NULL for none. */
typedef struct {
    float loss_scale;
    int backward;
    int skip_lookups;
    const qt_param_hooks *hooks;
} qt_gpu_step_args;

/* Plans and allocates everything on the current device for micro-batches of B x T, with the parameters
 * cut as sh says and placed as the plan pl says, and fills the weights from src (qt_param_store_init). The plan's device total (arena,
 * workspaces, runtime reserve; the attention workspace measured from cuDNN's plans) is checked against
 * memory.gpu_limit_gib and the free memory before anything is allocated: NULL with err naming the total,
 * the limit and the biggest rows when it does not fit. */
qt_gpu_model *qt_gpu_model_create(const qt_layout *L, const qt_plan *pl, const qt_weight_src *src, const qt_shard *sh,
                                  char *err, size_t errlen);
void qt_gpu_model_free(qt_gpu_model *g);
/* The memory plan qt_gpu_model_create would allocate for these arguments (the same code), without a
 * GPU and without allocating anything (the pinned host state of an offloaded optimizer is a host row);
 * the attention workspace counts its fp32 parts only (cuDNN's own plan workspace needs the GPU). 0, or
 * -1 with err. */
int qt_gpu_model_plan(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, qt_mem_plan *plan, char *err,
                      size_t errlen);
void qt_gpu_model_print_plan(const qt_gpu_model *g);

/* The packed documents of the following steps (qt_docs.h; its windows are the B rows of g->tok; NULL: causal
 * over each row, positions t): expanded on the host, copied to the device on g->stream, and the cuDNN plans
 * with the document bound built (not under capture: the engine calls it between micro-steps). Returns 0, or
 * -1 with err (malformed starts). */
int qt_gpu_model_set_docs(qt_gpu_model *g, const qt_docs *d, char *err, size_t errlen);
void qt_gpu_model_free_docs(qt_gpu_model *g); /* releases what qt_gpu_model_set_docs allocated (qt_gpu_model_free) */
/* What the steps' graphs depend on: bit 0 attention per document, bit 1 positions per document. */
static inline int qt_gpu_model_docs_mode(const qt_gpu_model *g) {
    return (g->docs.kv_lo != NULL) | (g->docs.pos != NULL) << 1;
}
/* Forward (and backward) of the tokens already in g->tok / g->tgt; the token losses are added to
 * *g->loss_sum. Asynchronous on g->stream. */
void qt_gpu_model_step(qt_gpu_model *g, const qt_gpu_step_args *a);
/* The backward of the last step's forward (run with backward 0; its activations are kept) with a loss scale per
 * sequence: grads += d(sum over b of row_scale[b] * (sequence b's summed token losses))/dw, row_scale on the host
 * [B]. The LM head runs again over the kept final norm's output (its logits were overwritten). LoRA (a frozen base)
 * only: the DPO objective's backward (qt_gpu_dpo.h). */
void qt_gpu_model_backward_rows(qt_gpu_model *g, const float *row_scale);
/* The same for trained weights too (full fine-tuning's DPO, qt_dp_sync_backward_rows): a's hooks and skip_lookups
 * as a micro-step's backward takes them (a->backward 1, its loss_scale unused). */
void qt_gpu_model_backward_rows_with(qt_gpu_model *g, const float *row_scale, const qt_gpu_step_args *a);
/* Per-op timing with CUDA events (train_bench --breakdown). mark() starts an interval named label on
 * the stream (a no-op when profiling is off); collect() waits for the stream and adds the closed
 * intervals to per-label totals; print() prints ms per step over `steps` steps and resets. */
void qt_gpu_model_profile(qt_gpu_model *g, int on);
void qt_gpu_model_mark(qt_gpu_model *g, const char *label);
void qt_gpu_model_profile_collect(qt_gpu_model *g);
void qt_gpu_model_profile_print(qt_gpu_model *g, int steps);

/* g->head.lookups cut into every rank's tokens [ranks][N], residual gradients at the embeddings [ranks][N][C]
 * and a qt_embedding_bwd workspace; returns its bytes (base NULL: only the size). */
size_t qt_gpu_model_lookups(const qt_gpu_model *g, void *base, int32_t **tok, float **dres, void **ws);


/* Logits [N, V] as fp32 on the host for the tokens in g->tok (synchronises; soft-capped as the loss reads them when
 * the model caps: cap * tanh(x / cap) in fp32 of the bf16 x); hooks as in step. host NULL:
 * the forward only (a ZeRO-3 rank taking part in rank 0's weight gathers). */
void qt_gpu_model_logits(qt_gpu_model *g, const qt_param_hooks *hooks, float *host_logits);

#endif
