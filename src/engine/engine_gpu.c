/* engine_gpu.c — one GPU's engine: a training step as its step plan (qt_step_plan.h) says.
 *
 * micro_step: the tokens go up through pinned staging, then the forward and backward run, eagerly or
 * from CUDA graphs, with the data-parallel sync's hooks (qt_dp_sync.h). opt_step: the gradients are
 * summed over the ranks and their norm taken (qt_dp_sync_reduce), AdamW runs group by group on the
 * plan's stream, each group's weights are released to the next forward (gathered over the ranks when
 * sharded, quantized to fp8), the gradients are zeroed, and the one host read per step brings the loss
 * and norm back. The rest is checkpoint state and host copies for tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_dp_sync.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_step_plan.h"
#include "qt_test_hooks.h"

typedef struct {
    qt_engine base;
    qt_step_plan plan;      /* chosen at creation */
    qt_gpu_model *g;
    qt_dp_sync *sync;
    int32_t *pin[2];        /* pinned token staging [2][tok | tgt], alternated */
    cudaEvent_t pin_free[2]; /* recorded after the upload that read pin[k] */
    int k;
    long valid_total;       /* targets >= 0 since the last opt_step */
    struct { double loss; float norm; int nonfinite; } *out; /* pinned: the one read per optimizer step */
    void *host_state[4];    /* state_items' host copies (owned) */
    int micro_done;         /* micro-steps since creation (the first runs eagerly) */
    int micro_in_step;      /* micro-steps since the last opt_step */
    double last_loss_sum;   /* the last opt_step's loss sum and target count, for the ranks' mean */
    long last_valid;
} gpu_engine;

/* Host -> pinned -> device without racing an upload still in flight from the same pinned buffer. */
static long upload(gpu_engine *e, const int32_t *in, const int32_t *tgt) {
    qt_gpu_model *g = e->g;
    int k = e->k ^= 1;
    qt_dp_sync_inputs(e->sync); /* ZeRO-2: the last micro-step's sums may still read the tokens */
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

static void gpu_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(qt_dp_sync_idle(e->sync), "rank %d: a micro-step after the last of this step (a step is data.grad_accum = %d "
             "micro-steps)", e->plan.rank, b->cfg->data.grad_accum);
    long valid = upload(e, in, tgt);
    e->valid_total += valid;
    int last = e->plan.dp != QT_DP_ONE && ++e->micro_in_step == b->cfg->data.grad_accum;
    /* The first micro-step runs eagerly: it autotunes the matmuls and builds the cuDNN plans, which
     * cannot happen under capture. */
    int eager = !e->plan.graphs || e->micro_done == 0 || e->g->prof;
    qt_dp_sync_micro_step(e->sync, grad_scale, last, eager); /* the weight of one target (qt_loss_scale) */
    e->micro_done++;
}

/* AdamW group by group on the plan's stream (the side stream when it runs ahead of the next forward,
 * the gradients zeroed behind it), each group's weights released to the next forward; then the fp8
 * quants of one GPU (once per step) and the gradients zeroed. */
static void optimizer(gpu_engine *e, const qt_adamw_args *a) {
    qt_gpu_model *g = e->g;
    qt_param_store *ps = g->ps;
    cudaStream_t os = qt_dp_sync_opt_stream(e->sync);
    int ahead = e->plan.opt_ahead;
    for (int i = 0; i < qt_param_opt_groups(ps); i++) {
        int k0, k1;
        qt_param_opt_buckets(ps, i, &k0, &k1);
        qt_param_opt_step(ps, i, a, os);
        if (ahead) qt_param_zero_grads(ps, k0, k1, os);
        qt_dp_sync_release(e->sync, k0, k1);
    }
    if (!ahead) {
        if (e->plan.dp != QT_DP_SHARDED && e->plan.fp8) { /* once per step: the persistent quants */
            qt_gpu_model_mark(g, "fp8 quantize: weights");
            qt_fp8_quantize_weights(g->fp8, e->base.L, ps->w, 0, e->base.L->cfg.num_layers, g->stream);
        }
        qt_param_zero_grads(ps, 0, ps->shard.n_buckets, g->stream);
    }
}

static void gpu_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    const qt_config *c = b->cfg;
    cudaStream_t s = g->stream;
    qt_dp_sync_join(e->sync);
    qt_dp_sync_reduce(e->sync);
    e->micro_in_step = 0;
    qt_adamw_args a = {lr, c->optim.beta1, c->optim.beta2, c->optim.eps, t, c->seed, c->precision.stochastic_rounding, 0};
    optimizer(e, &a);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, s));
    QT_CUDA(cudaMemcpyAsync(&e->out->norm, g->ps->norm, 4, cudaMemcpyDeviceToHost, s));
    if (e->plan.fp8) QT_CUDA(cudaMemcpyAsync(&e->out->nonfinite, g->fp8->nonfinite, 4, cudaMemcpyDeviceToHost, s));
    qt_zero(g->loss_sum, 8, s);
    QT_CUDA(cudaStreamSynchronize(s));
    if (e->plan.fp8 && e->out->nonfinite) {
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
    qt_gpu_step_args a = {0.0f, 0, 0, qt_dp_sync_wait_hooks(e->sync)};
    qt_gpu_model_step(g, &a);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->loss_sum, 8, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->loss_sum, 8, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return valid ? (float)(e->out->loss / valid) : 0.0f;
}

/* Sharded: only this rank's pieces of w are written (the data-parallel engine fills the rest from the
 * other ranks). */
static void gpu_get_weights(qt_engine *b, float *w) {
    gpu_engine *e = (gpu_engine *)b;
    qt_dp_sync_join(e->sync); /* the master weights too, where AdamW runs ahead */
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    qt_param_get_master(e->g->ps, w);
}

static void gpu_get_grads(qt_engine *b, float *gr) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(qt_dp_sync_idle(e->sync),
             "rank %d: get_grads after the last micro-step of a step: its gradients are summed over the GPUs (or "
             "wait for the other ranks' embedding lookups); read them before that micro-step", e->plan.rank);
    qt_dp_sync_join(e->sync); /* AdamW running ahead zeroes them; ZeRO-2's sums run beside */
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    qt_param_get_grads(e->g->ps, gr);
}

static void gpu_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    gpu_engine *e = (gpu_engine *)b;
    upload(e, in, NULL);
    qt_gpu_model_logits(e->g, qt_dp_sync_wait_hooks(e->sync), logits);
}

static const char *const item_names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};

/* Blobs: the fp32 master as "weights" (the CPU engine's name, so checkpoints move between paths),
 * the bf16 working copy (it differs from RNE(master) under stochastic rounding) and m, v. Sharded:
 * weights, adam_m and adam_v hold this rank's pieces only, back to back with their padding (the
 * store's shard says where each goes). */
static int gpu_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    gpu_engine *e = (gpu_engine *)b;
    const qt_param_store *ps = e->g->ps;
    size_t n = b->L->numel, ns = ps->shard.len;
    QT_CHECK(cap >= 4, "need room for 4 checkpoint items, got %d", cap);
    qt_dp_sync_join(e->sync);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    for (int i = 0; i < 4; i++) {
        qt_dtype dt;
        const void *src = qt_param_item(ps, i, &dt);
        size_t bytes = (i == 1 ? n : ns) * qt_dtype_size(dt);
        if (!e->host_state[i]) QT_CUDA(cudaMallocHost(&e->host_state[i], bytes ? bytes : 1));
        QT_CUDA(cudaMemcpy(e->host_state[i], src, bytes, cudaMemcpyDefault)); /* master, m, v: maybe host */
        items[i] = (qt_ckpt_item){item_names[i], dt, e->host_state[i], bytes};
    }
    return 4;
}

/* Checkpoints hold whole arrays; a sharded rank takes its pieces. */
static int gpu_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    qt_param_store *ps = g->ps;
    size_t n = b->L->numel;
    qt_dp_sync_join(e->sync);
    for (int i = 0; i < 4; i++) {
        qt_dtype want_dt;
        void *dst = qt_param_item(ps, i, &want_dt);
        size_t bytes, es = qt_dtype_size(want_dt), want = n * es;
        int dt;
        const void *p = qt_ckpt_get(ck, item_names[i], &bytes, &dt);
        if (!p && i == 1) { /* a CPU checkpoint: the bf16 copy from all of "weights" */
            qt_param_upload_bf16(ps, qt_ckpt_get(ck, item_names[0], NULL, NULL), n, g->stream);
            continue;
        }
        if (!p || bytes != want || dt != (int)want_dt) {
            snprintf(err, errlen, "checkpoint blob %s: expected %zu bytes of %s (precision.opt_*_dtype must match the run that wrote it), got %s",
                     item_names[i], want, qt_dtype_name(want_dt), p ? "another size or dtype" : "none");
            return -1;
        }
        if (i == 1) {
            QT_CUDA(cudaMemcpyAsync(dst, p, want, cudaMemcpyHostToDevice, g->stream));
            continue;
        }
        for (int k = 0; k < ps->shard.n_buckets; k++) {
            size_t off, len, st, np;
            qt_shard_piece(&ps->shard, k, &off, &len, &st);
            if ((np = qt_shard_params(off, len, n)))
                QT_CUDA(cudaMemcpyAsync((char *)dst + st * es, (const char *)p + off * es, np * es,
                                        cudaMemcpyDefault, g->stream));
        }
    }
    if (e->plan.fp8) qt_fp8_quantize_weights(g->fp8, b->L, ps->w, 0, b->L->cfg.num_layers, g->stream);
    QT_CUDA(cudaStreamSynchronize(g->stream));
    return 0;
}

static void gpu_print_memory(qt_engine *b) { qt_gpu_model_print_plan(((gpu_engine *)b)->g); }

static void gpu_free(qt_engine *b) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    qt_dp_sync_free(e->sync);
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
     .profile = gpu_profile, .profile_print = gpu_profile_print, .free = gpu_free, .state_is_snapshot = 1}
static const qt_engine_ops gpu_ops = GPU_OPS("cuda-bf16"), fp8_ops = GPU_OPS("cuda-fp8 (e4m3 blocks)");

void qt_engine_gpu_last_loss(const qt_engine *b, double *sum, long *valid) {
    const gpu_engine *e = (const gpu_engine *)b;
    *sum = e->last_loss_sum;
    *valid = e->last_valid;
}

/* Where the parameters live, from the plan. */
static qt_param_placement placement(const qt_step_plan *p, const qt_layout *L) {
    size_t chunk = qt_test_hooks_get()->offload_chunk;
    return (qt_param_placement){p->offload_opt ? QT_OPT_STATE_HOST : QT_OPT_STATE_DEVICE, p->zero,
                                p->opt_ahead, p->reduce_bf16, chunk ? chunk : QT_GPU_OPTIM_CHUNK,
                                p->grads_sharded && p->lookups && L->lm_head != L->embed};
}

qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_config *cfg, const float *w0, int device,
                                const qt_gpu_rank *rank, char *err, size_t errlen) {
    if (cfg->precision.matmul_dtype != QT_DT_BF16 && cfg->precision.matmul_dtype != QT_DT_E4M3) {
        snprintf(err, errlen, "%s: precision.matmul_dtype: %s: expected bf16 or e4m3", cfg->path,
                 qt_dtype_name(cfg->precision.matmul_dtype));
        return NULL;
    }
    QT_CUDA(cudaSetDevice(device));
    if (cfg->precision.matmul_dtype == QT_DT_E4M3) {
        struct cudaDeviceProp p;
        QT_CUDA(cudaGetDeviceProperties(&p, device));
        if (qt_fp8_check(&L->cfg, cfg, (long)cfg->data.micro_batch * cfg->data.seq_len, p.major * 10 + p.minor, err, errlen))
            return NULL;
    }
    gpu_engine *e = calloc(1, sizeof *e);
    QT_CHECK(e, "out of host memory");
    e->base = (qt_engine){cfg->precision.matmul_dtype == QT_DT_E4M3 ? &fp8_ops : &gpu_ops, L, cfg, 1};
    qt_shard one;
    if (rank) qt_step_plan_make(&e->plan, L, cfg, qt_comm_size(rank->comm), rank->rank, rank->shard->n_ranks > 1);
    else qt_step_plan_make(&e->plan, L, cfg, 0, 0, 0);
    if (!rank) qt_shard_init(&one, L, 1, 0, e->plan.offload_opt); /* offloaded: AdamW bucket by bucket */
    qt_param_placement pl = placement(&e->plan, L);
    e->g = qt_gpu_model_create(L, cfg, w0, rank ? rank->shard : &one, &pl, err, errlen);
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
    /* a forward that did not wait for its bucket would then read last step's weights (test_train) */
    e->sync = qt_dp_sync_create(e->g, &e->plan, cfg, rank ? rank->comm : NULL, qt_test_hooks_get());
    return &e->base;
}
