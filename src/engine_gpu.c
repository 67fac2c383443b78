/* engine_gpu.c — one GPU's engine: token upload, micro-steps (optionally replayed from a CUDA graph),
 * the optimizer step with the one host read per step, and checkpoint state. As a rank of the
 * data-parallel engine (engine_dp.c) it sums the gradients over the ranks before the optimizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"

typedef struct {
    qt_engine base;
    qt_gpu_model *g;
    int32_t *pin[2];        /* pinned token staging [2][tok | tgt], alternated */
    cudaEvent_t pin_free[2]; /* recorded after the upload that read pin[k] */
    int k;
    long valid_total;       /* targets >= 0 since the last opt_step */
    struct { double loss; float norm; int nonfinite; } *out; /* pinned: the one read per optimizer step */
    void *host_state[4];    /* state_items' host copies (owned) */
    cudaGraphExec_t graph;
    float graph_scale;
    int micro_done;
    qt_comm *comm;          /* data-parallel rank: gradients are summed over comm before the norm */
    int rank;
    double last_loss_sum;   /* the last opt_step's loss sum and target count, for the ranks' mean */
    long last_valid;
} gpu_engine;

/* Host -> pinned -> device without racing an upload still in flight from the same pinned buffer. */
static long upload(gpu_engine *e, const int32_t *in, const int32_t *tgt) {
    qt_gpu_model *g = e->g;
    int k = e->k ^= 1;
    QT_CUDA(cudaEventSynchronize(e->pin_free[k]));
    int32_t *p = e->pin[k];
    long n = g->N, valid = 0;
    memcpy(p, in, n * 4);
    if (tgt) {
        memcpy(p + n, tgt, n * 4);
        for (long i = 0; i < n; i++) valid += tgt[i] >= 0;
    } else {
        memset(p + n, 0xff, n * 4); /* all ignored */
    }
    QT_CUDA(cudaMemcpyAsync(g->tok, p, n * 4, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaMemcpyAsync(g->tgt, p + n, n * 4, cudaMemcpyHostToDevice, g->stream));
    QT_CUDA(cudaEventRecord(e->pin_free[k], g->stream));
    return valid;
}

static void run_step(gpu_engine *e, float scale) {
    qt_gpu_model *g = e->g;
    /* The first micro-step runs eagerly: it autotunes the matmuls and builds the cuDNN plans, which
     * cannot happen under capture. A new loss scale means a new graph. */
    if (!e->base.cfg->cuda_graphs || e->micro_done == 0 || g->prof) {
        qt_gpu_model_step(g, scale, 1);
        return;
    }
    if (!e->graph || e->graph_scale != scale) {
        cudaGraph_t graph;
        if (e->graph) QT_CUDA(cudaGraphExecDestroy(e->graph));
        QT_CUDA(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
        qt_gpu_model_step(g, scale, 1);
        QT_CUDA(cudaStreamEndCapture(g->stream, &graph));
        QT_CUDA(cudaGraphInstantiate(&e->graph, graph, 0));
        QT_CUDA(cudaGraphDestroy(graph));
        e->graph_scale = scale;
    }
    QT_CUDA(cudaGraphLaunch(e->graph, g->stream));
}

static void gpu_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    gpu_engine *e = (gpu_engine *)b;
    long valid = upload(e, in, tgt);
    e->valid_total += valid;
    run_step(e, valid ? grad_scale / valid : 0.0f);
    e->micro_done++;
}

/* Gradients summed over the ranks (when a data-parallel rank), then the norm and clip scale. Sharded
 * (ZeRO-1): each rank gets the sum of its shard only, the norm adds the ranks' sums of squares. With
 * parallel.reduce_dtype bf16 the sum travels in the bf16 weight buffer: nothing reads the weights
 * between the backward and AdamW, which rewrites every parameter of the shard (the all-gather the
 * rest), and its gaps and tail stay zero because the gradient's are. */
static void reduce_grads(gpu_engine *e, cudaStream_t s) {
    qt_gpu_model *g = e->g;
    const qt_shard *sh = &g->shard;
    float clip = e->base.cfg->grad_clip;
    int half = e->base.cfg->reduce_dtype == QT_DT_BF16;
    qt_dtype dt = half ? QT_DT_BF16 : QT_DT_F32;
    void *buf = half ? g->w : (void *)g->grad;
    size_t es = qt_dtype_size(dt);
    if (e->comm && half) qt_cast_f32_to_bf16(g->w, g->grad, sh->total, s);
    if (e->comm && sh->n_ranks == 1) {
        qt_gpu_model_mark(g, "optimizer: gradient all-reduce");
        QT_CHECK(qt_comm_all_reduce(e->comm, e->rank, buf, buf, sh->total, dt, s) == 0,
                 "rank %d: gradient all-reduce aborted (another rank failed)", e->rank);
        if (half) qt_cast_bf16_to_f32(g->grad, g->w, sh->total, s);
    }
    if (sh->n_ranks == 1) {
        qt_gpu_model_mark(g, "optimizer: norm + adamw");
        qt_grad_norm(g->norm, g->clip, g->grad, sh->total, clip, g->ws, s);
        return;
    }
    qt_gpu_model_mark(g, "optimizer: gradient reduce-scatter");
    void *mine = (char *)buf + sh->off * es;
    QT_CHECK(qt_comm_reduce_scatter(e->comm, e->rank, mine, buf, sh->total, dt, s) == 0,
             "rank %d: gradient reduce-scatter aborted (another rank failed)", e->rank);
    if (half) qt_cast_bf16_to_f32(g->grad + sh->off, mine, sh->len, s);
    qt_gpu_model_mark(g, "optimizer: norm + adamw");
    qt_grad_sumsq(g->sumsq + e->rank, g->grad + sh->off, sh->len, g->ws, s);
    /* every rank's fp64 sum (two fp32 words each), gathered in place */
    QT_CHECK(qt_comm_all_gather(e->comm, e->rank, g->sumsq, g->sumsq + e->rank, 2 * (size_t)sh->n_ranks, QT_DT_F32, s) == 0,
             "rank %d: gradient norm all-gather aborted (another rank failed)", e->rank);
    qt_clip_from_sumsq(g->norm, g->clip, g->sumsq, sh->n_ranks, clip, s);
}

static void gpu_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    const qt_config *c = b->cfg;
    const qt_shard *sh = &g->shard;
    cudaStream_t s = g->stream;
    reduce_grads(e, s);
    qt_adamw_args a = {lr, c->beta1, c->beta2, c->eps, t, c->seed, c->stochastic_rounding, sh->off};
    qt_adamw_step(g->adamw, g->w, g->master, g->grad, g->m, g->m_dt, g->v, g->v_dt, g->clip, NULL, &a, s);
    if (sh->n_ranks > 1) {
        qt_gpu_model_mark(g, "optimizer: weight all-gather");
        QT_CHECK(qt_comm_all_gather(e->comm, e->rank, g->w, (uint16_t *)g->w + sh->off, sh->total, QT_DT_BF16, s) == 0,
                 "rank %d: weight all-gather aborted (another rank failed)", e->rank);
    }
    if (g->fp8) { /* once per step: the persistent quants */
        qt_gpu_model_mark(g, "fp8 quantize: weights");
        qt_fp8_quantize_weights(g->fp8, b->L, g->w, s);
    }
    qt_zero(g->grad, sh->total * 4, s);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, s));
    QT_CUDA(cudaMemcpyAsync(&e->out->norm, g->norm, 4, cudaMemcpyDeviceToHost, s));
    if (g->fp8) QT_CUDA(cudaMemcpyAsync(&e->out->nonfinite, g->fp8->nonfinite, 4, cudaMemcpyDeviceToHost, s));
    qt_zero(g->loss_sum, 8, s);
    QT_CUDA(cudaStreamSynchronize(s));
    if (g->fp8 && e->out->nonfinite) {
        char name[96];
        QT_CHECK(0, "step %ld: fp8 scale of %s is NaN/Inf (its abs-max was not finite): the run diverged", t,
                 qt_fp8_tag_name(e->out->nonfinite, name, sizeof name));
    }
    qt_gpu_model_profile_collect(g);
    *loss = e->valid_total ? (float)(e->out->loss / e->valid_total) : 0.0f;
    *gnorm = e->out->norm;
    e->last_loss_sum = e->out->loss;
    e->last_valid = e->valid_total;
    e->valid_total = 0;
}

static float gpu_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    long valid = upload(e, in, tgt);
    qt_gpu_model_step(g, 0.0f, 0);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->loss_sum, 8, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return valid ? (float)(e->out->loss / valid) : 0.0f;
}

/* Elements of the shard that are parameters (the padded tail past L->numel is not). */
static size_t shard_params(const qt_gpu_model *g) {
    size_t n = g->L->numel, o = g->shard.off;
    return o >= n ? 0 : (n - o < g->shard.len ? n - o : g->shard.len);
}

/* Sharded: only this rank's slice w[off, off + len) is written (the data-parallel engine fills the
 * rest from the other ranks). */
static void gpu_get_weights(qt_engine *b, float *w) {
    qt_gpu_model *g = ((gpu_engine *)b)->g;
    QT_CUDA(cudaStreamSynchronize(g->stream));
    QT_CUDA(cudaMemcpy(w + g->shard.off, g->master, shard_params(g) * 4, cudaMemcpyDeviceToHost));
}

static void gpu_get_grads(qt_engine *b, float *gr) {
    qt_gpu_model *g = ((gpu_engine *)b)->g;
    QT_CUDA(cudaStreamSynchronize(g->stream));
    QT_CUDA(cudaMemcpy(gr, g->grad, b->L->numel * 4, cudaMemcpyDeviceToHost));
}

static void gpu_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    gpu_engine *e = (gpu_engine *)b;
    upload(e, in, NULL);
    qt_gpu_model_logits(e->g, logits);
}

/* Blobs: the fp32 master as "weights" (the CPU engine's name, so checkpoints move between paths),
 * the bf16 working copy (it differs from RNE(master) under stochastic rounding) and m, v. Sharded:
 * weights, adam_m and adam_v hold this rank's slice only (the model's shard says which). */
static int gpu_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    size_t n = b->L->numel, ns = shard_params(g);
    const char *names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    const void *src[4] = {g->master, g->w, g->m, g->v};
    int dts[4] = {QT_DT_F32, QT_DT_BF16, g->m_dt, g->v_dt};
    QT_CHECK(cap >= 4, "need room for 4 checkpoint items, got %d", cap);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < 4; i++) {
        size_t bytes = (i == 1 ? n : ns) * qt_dtype_size(dts[i]);
        if (!e->host_state[i]) QT_CUDA(cudaMallocHost(&e->host_state[i], bytes ? bytes : 1));
        QT_CUDA(cudaMemcpy(e->host_state[i], src[i], bytes, cudaMemcpyDeviceToHost));
        items[i] = (qt_ckpt_item){names[i], dts[i], e->host_state[i], bytes};
    }
    return 4;
}

/* Checkpoints hold whole arrays; a sharded rank takes its slice. */
static int gpu_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    size_t n = b->L->numel, ns = shard_params(g), o = g->shard.off;
    const char *names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    void *dst[4] = {g->master, g->w, g->m, g->v};
    int dts[4] = {QT_DT_F32, QT_DT_BF16, g->m_dt, g->v_dt};
    for (int i = 0; i < 4; i++) {
        size_t bytes, want = n * qt_dtype_size(dts[i]);
        int dt;
        const void *p = qt_ckpt_get(ck, names[i], &bytes, &dt);
        if (!p && i == 1) { /* a CPU checkpoint: the bf16 copy from all of "weights", via the gradients */
            QT_CUDA(cudaMemcpyAsync(g->grad, qt_ckpt_get(ck, names[0], NULL, NULL), n * 4, cudaMemcpyHostToDevice, g->stream));
            qt_cast_f32_to_bf16(g->w, g->grad, n, g->stream);
            qt_zero(g->grad, g->shard.total * 4, g->stream);
            continue;
        }
        if (!p || bytes != want || dt != dts[i]) {
            snprintf(err, errlen, "checkpoint blob %s: expected %zu bytes of %s (precision.opt_*_dtype must match the run that wrote it), got %s",
                     names[i], want, qt_dtype_name(dts[i]), p ? "another size or dtype" : "none");
            return -1;
        }
        size_t es = qt_dtype_size(dts[i]);
        if (i == 1) QT_CUDA(cudaMemcpyAsync(dst[i], p, want, cudaMemcpyHostToDevice, g->stream));
        else if (ns) QT_CUDA(cudaMemcpyAsync(dst[i], (const char *)p + o * es, ns * es, cudaMemcpyHostToDevice, g->stream));
    }
    if (g->fp8) qt_fp8_quantize_weights(g->fp8, b->L, g->w, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return 0;
}

static void gpu_print_memory(qt_engine *b) { qt_gpu_model_print_plan(((gpu_engine *)b)->g); }

static void gpu_free(qt_engine *b) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    if (e->graph) QT_CUDA(cudaGraphExecDestroy(e->graph));
    for (int i = 0; i < 2; i++) {
        QT_CUDA(cudaFreeHost(e->pin[i]));
        QT_CUDA(cudaEventDestroy(e->pin_free[i]));
    }
    for (int i = 0; i < 4; i++)
        if (e->host_state[i]) QT_CUDA(cudaFreeHost(e->host_state[i]));
    QT_CUDA(cudaFreeHost(e->out));
    qt_gpu_model_free(e->g);
    free(e);
}

static void gpu_profile(qt_engine *b, int on) { qt_gpu_model_profile(((gpu_engine *)b)->g, on); }
static void gpu_profile_print(qt_engine *b, int steps) { qt_gpu_model_profile_print(((gpu_engine *)b)->g, steps); }

/* The same ops under the name the run's log shows. */
#define GPU_OPS(nm)                                                                                   \
    {.name = nm, .micro_step = gpu_micro_step, .opt_step = gpu_opt_step, .eval_loss = gpu_eval_loss,    \
     .get_weights = gpu_get_weights, .get_grads = gpu_get_grads, .forward_logits = gpu_forward_logits, \
     .state_items = gpu_state_items, .load_state = gpu_load_state, .print_memory = gpu_print_memory,   \
     .profile = gpu_profile, .profile_print = gpu_profile_print, .free = gpu_free}
static const qt_engine_ops gpu_ops = GPU_OPS("cuda-bf16"), fp8_ops = GPU_OPS("cuda-fp8 (e4m3 blocks)");

void qt_engine_gpu_attach(qt_engine *b, qt_comm *comm, int rank) {
    gpu_engine *e = (gpu_engine *)b;
    e->comm = comm;
    e->rank = rank;
}

void qt_engine_gpu_last_loss(const qt_engine *b, double *sum, long *valid) {
    const gpu_engine *e = (const gpu_engine *)b;
    *sum = e->last_loss_sum;
    *valid = e->last_valid;
}

qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_config *cfg, const float *w0, int device,
                                const qt_shard *sh, char *err, size_t errlen) {
    if (cfg->matmul_dtype != QT_DT_BF16 && cfg->matmul_dtype != QT_DT_E4M3) {
        snprintf(err, errlen, "%s: precision.matmul_dtype: %s: expected bf16 or e4m3", cfg->path,
                 qt_dtype_name(cfg->matmul_dtype));
        return NULL;
    }
    QT_CUDA(cudaSetDevice(device));
    if (cfg->matmul_dtype == QT_DT_E4M3) {
        struct cudaDeviceProp p;
        QT_CUDA(cudaGetDeviceProperties(&p, device));
        if (qt_fp8_check(&L->cfg, cfg, (long)cfg->micro_batch * cfg->seq_len, p.major * 10 + p.minor, err, errlen))
            return NULL;
    }
    gpu_engine *e = calloc(1, sizeof *e);
    QT_CHECK(e, "out of host memory");
    e->base = (qt_engine){cfg->matmul_dtype == QT_DT_E4M3 ? &fp8_ops : &gpu_ops, L, cfg, 1};
    e->g = qt_gpu_model_create(L, cfg, w0, sh, err, errlen);
    if (!e->g) {
        free(e);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        QT_CUDA(cudaMallocHost((void **)&e->pin[i], 2 * e->g->N * sizeof(int32_t)));
        QT_CUDA(cudaEventCreateWithFlags(&e->pin_free[i], cudaEventDisableTiming));
        QT_CUDA(cudaEventRecord(e->pin_free[i], e->g->stream));
    }
    QT_CUDA(cudaMallocHost((void **)&e->out, sizeof *e->out));
    return &e->base;
}
