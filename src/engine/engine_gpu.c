/* engine_gpu.c — one GPU's engine: a training step as its plan (qt_plan.h) says.
 *
 * micro_step: the tokens go up through pinned staging, then the forward and backward run, eagerly or
 * from CUDA graphs, with the data-parallel sync's hooks (qt_dp_sync.h). opt_step: the gradients are
 * summed over the ranks and their norm taken (qt_dp_sync_reduce), AdamW runs group by group on the
 * plan's stream, each group's weights are released to the next forward (gathered over the ranks when
 * sharded, quantized to fp8), the gradients are zeroed, and the one host read per step brings the loss
 * and norm back, with the count of NaN/Inf among the bf16 weights this rank's AdamW just wrote (one
 * read of 2 bytes per parameter on the GPU; with AdamW ahead of the next forward the count is taken at
 * the end of the next step, or before a checkpoint). objective: dpo (full fine-tuning) splits a micro-step
 * around the host: the forward, the DPO loss against the trainer's stored reference log-probs (set_dpo_ref), the
 * backward with per-row weights, eagerly. The rest is checkpoint state and host copies for tests. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_dp_sync.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_matmul.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_pinned.h"
#include "qt_place.h"
#include "qt_test_hooks.h"

typedef struct {
    qt_engine base;
    qt_plan plan;           /* the plan it was created with, its rank index set */
    qt_gpu_model *g;
    qt_dp_sync *sync;
    int32_t *pin[2];        /* pinned token staging [2][tok | tgt], alternated */
    cudaEvent_t pin_free[2]; /* recorded after the upload that read pin[k] */
    int k;
    long valid_total;       /* targets >= 0 since the last opt_step */
    /* pinned: the one read per optimizer step; bad[t & 1]: step t's NaN/Inf count of the updated weights */
    struct { double loss; float norm; int nonfinite; unsigned bad[2]; } *out;
    unsigned *bad_dev;      /* device: the count being taken (owned) */
    cudaEvent_t bad_ev[2];  /* [t & 1]: recorded on the optimizer's stream once bad[t & 1] is copied */
    long bad_pending[2];    /* [t & 1]: step t when its count is in flight, else 0 */
    long first_bad, first_bad_step; /* the first NaN/Inf weight found (-1: none) and the step that made it */
    void *host_state[4];    /* state_items' host copies (owned; none for a bf16 master's "weights") */
    size_t snap_bytes;      /* their pinned bytes (snapshot_bytes) */
    int ckpt_copy;          /* 1: an offloaded optimizer state is copied for checkpoints (set_state_copy) */
    int micro_done;         /* micro-steps since creation (the first runs eagerly) */
    int micro_in_step;      /* micro-steps since the last opt_step */
    int dp_rank;            /* a data-parallel rank's engine: its step's last micro-step starts the sums */
    double last_loss_sum;   /* the last opt_step's loss sum and target count, for the ranks' mean */
    long last_valid;
    /* objective: dpo (full fine-tuning, dpo_micro_step): the stored reference of the next micro-batch's rows */
    struct gpu_dpo {
        double *ref, *lp;   /* [B] the reference's row log-probs (set_dpo_ref), the policy's */
        float *losses;      /* [N] a forward's token losses on the host */
        float *scale;       /* [B] each row's loss weight in the backward */
        int have_ref;
        double loss_sum;    /* the pairs' losses and count since the last opt_step */
        long pairs;
        qt_dpo_log log;
    } dpo;
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

/* ---- objective: dpo with full fine-tuning: the policy forward, the host's DPO arithmetic against the stored
 * reference (qt_dpo.h, the CPU engine's code), the backward with per-row loss weights; eager, two host syncs ---- */

static void dpo_init(gpu_engine *e) {
    struct gpu_dpo *d = &e->dpo;
    if (!e->plan.dpo) return;
    int B = e->g->B;
    QT_CHECK(B >= 2 && B % 2 == 0, "objective: dpo: a micro-batch of %d rows (expected pairs: an even count)", B);
    d->ref = malloc((size_t)B * sizeof *d->ref);
    d->lp = malloc((size_t)B * sizeof *d->lp);
    d->scale = malloc((size_t)B * sizeof *d->scale);
    d->losses = malloc((size_t)e->g->N * sizeof *d->losses);
    QT_CHECK(d->ref && d->lp && d->scale && d->losses, "out of host memory");
}

static void dpo_free(gpu_engine *e) {
    free(e->dpo.ref), free(e->dpo.lp), free(e->dpo.scale), free(e->dpo.losses);
}

/* The forward (losses only, activations kept) of the tokens upload() sent; the rows' log-probs into lp[B]. */
static void dpo_forward(gpu_engine *e, const int32_t *tgt, double *lp) {
    qt_gpu_model *g = e->g;
    qt_dp_sync_forward_rows(e->sync);
    QT_CUDA(cudaMemcpyAsync(e->dpo.losses, g->head.losses, g->N * sizeof *e->dpo.losses, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->head.loss_sum, 8, g->stream); /* the token losses' sum means nothing here: the loss is the pairs' */
    QT_CUDA(cudaStreamSynchronize(g->stream));
    qt_dpo_row_logps(lp, e->dpo.losses, tgt, g->B, g->T);
}

static const double *dpo_ref(const gpu_engine *e) {
    QT_CHECK(e->dpo.have_ref, "objective: dpo with full fine-tuning: no reference log-probs were given for this "
             "micro-batch (the trainer reads them from the pair shards' stored reference, <shard>.dporef; batches given "
             "by the caller have none)");
    return e->dpo.ref;
}

static void dpo_micro_step(gpu_engine *e, const int32_t *in, const int32_t *tgt, float pair_weight) {
    struct gpu_dpo *d = &e->dpo;
    int last = e->dp_rank && ++e->micro_in_step == e->plan.run.grad_accum;
    upload(e, in, tgt);
    dpo_forward(e, tgt, d->lp);
    qt_dpo_stats st = {0};
    qt_dpo_batch(&e->plan.dpo_cfg, d->lp, dpo_ref(e), e->g->B, pair_weight, d->scale, &st);
    d->loss_sum += st.loss;
    d->pairs += st.pairs;
    qt_dpo_stats_add(&d->log.acc, &st);
    qt_dp_sync_backward_rows(e->sync, d->scale, last);
    e->micro_done++;
}

/* After opt_step: the step's loss is the mean over its pairs (the ranks' mean: qt_engine_gpu_last_loss). */
static void dpo_opt_step(gpu_engine *e, float *loss) {
    struct gpu_dpo *d = &e->dpo;
    *loss = d->pairs ? (float)(d->loss_sum / d->pairs) : 0.0f;
    e->last_loss_sum = d->loss_sum;
    e->last_valid = d->pairs;
    d->loss_sum = 0;
    d->pairs = 0;
    qt_dpo_log_step(&d->log);
}

static float dpo_eval_loss(gpu_engine *e, const int32_t *in, const int32_t *tgt) {
    upload(e, in, tgt);
    dpo_forward(e, tgt, e->dpo.lp);
    return (float)qt_dpo_batch(&e->plan.dpo_cfg, e->dpo.lp, dpo_ref(e), e->g->B, 0.0f, NULL, &e->dpo.log.eval);
}

static void gpu_row_logps(qt_engine *b, const int32_t *in, const int32_t *tgt, double *logp) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(e->plan.dpo, "row_logps: the run's objective is not dpo");
    upload(e, in, tgt);
    dpo_forward(e, tgt, logp);
}

static void gpu_set_dpo_ref(qt_engine *b, const double *ref) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(e->plan.dpo, "set_dpo_ref: the run's objective is not dpo");
    e->dpo.have_ref = ref != NULL;
    if (ref) memcpy(e->dpo.ref, ref, (size_t)e->g->B * sizeof *e->dpo.ref);
}

static void gpu_dpo_stats(qt_engine *b, int eval, qt_dpo_stats *s) { qt_dpo_log_take(&((gpu_engine *)b)->dpo.log, eval, s); }

static void gpu_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(qt_dp_sync_idle(e->sync), "rank %d: a micro-step after the last of this step (a step is data.grad_accum = %d "
             "micro-steps)", e->plan.parallel.rank, e->plan.run.grad_accum);
    if (e->plan.dpo) {
        dpo_micro_step(e, in, tgt, grad_scale);
        return;
    }
    long valid = upload(e, in, tgt);
    e->valid_total += valid;
    int last = e->dp_rank && ++e->micro_in_step == e->plan.run.grad_accum;
    /* The first micro-step runs eagerly: it autotunes the matmuls and builds the cuDNN plans, which
     * cannot happen under capture. */
    int eager = !e->plan.perf.graphs || e->micro_done == 0 || e->g->timing.prof;
    qt_dp_sync_micro_step(e->sync, grad_scale, last, eager); /* the weight of one target (qt_loss_scale) */
    e->micro_done++;
}

/* Test hook nonfinite_tensor/step: a NaN gradient in the middle of that tensor (when it lies in buckets
 * [k0, k1)) before step t's AdamW of them, set by the rank whose piece holds it (the one that updates
 * it), in its summed gradients (grad_dt; ZeRO-2: its shard). */
static void inject_nonfinite(gpu_engine *e, long t, int k0, int k1, cudaStream_t s) {
    const qt_test_hooks *h = qt_test_hooks_get();
    const qt_param_store *ps = e->g->ps;
    const qt_tensor *tt = h->nonfinite_step == t && h->nonfinite_tensor ? qt_layout_find(e->base.L, h->nonfinite_tensor) : NULL;
    size_t i = tt ? tt->offset + tt->numel / 2 : 0, off, len, st;
    for (int b = k0; tt && b < k1; b++) {
        qt_shard_piece(&ps->shard, b, &off, &len, &st);
        if (i >= off && i < off + len)
            qt_fill((char *)qt_param_grad_piece(ps, b) + (i - off) * qt_dtype_size(ps->grad_dt), ps->grad_dt, NAN, 1, s);
    }
}

/* AdamW group by group on the plan's stream (the side stream when it runs ahead of the next forward,
 * the gradients zeroed behind it), each group's new weights counted for NaN/Inf by AdamW itself as it
 * writes them (qt_adamw_args.nonfinite: no second read of weights that may live in host memory) and
 * released to the next forward; then the count goes to out->bad[t & 1], the fp8 quants of one GPU (once
 * per step) and the gradients zeroed. */
static void optimizer(gpu_engine *e, const qt_adamw_args *a) {
    qt_gpu_model *g = e->g;
    qt_param_store *ps = g->ps;
    cudaStream_t os = qt_dp_sync_opt_stream(e->sync);
    int ahead = e->plan.optimizer.ahead, slot = (int)(a->t & 1);
    qt_zero(e->bad_dev, sizeof *e->bad_dev, os);
    for (int i = 0; i < qt_param_opt_groups(ps); i++) {
        int k0, k1;
        qt_param_opt_buckets(ps, i, &k0, &k1);
        inject_nonfinite(e, a->t, k0, k1, os);
        qt_gpu_model_mark(g, "optimizer: adamw"); /* the marks time the model's stream: not ahead (os is it) */
        qt_param_opt_step(ps, i, a, os);
        if (ahead) qt_param_zero_grads(ps, k0, k1, os);
        qt_dp_sync_release(e->sync, k0, k1);
    }
    QT_CUDA(cudaMemcpyAsync(&e->out->bad[slot], e->bad_dev, sizeof *e->bad_dev, cudaMemcpyDeviceToHost, os));
    QT_CUDA(cudaEventRecord(e->bad_ev[slot], os));
    e->bad_pending[slot] = a->t;
    if (!ahead) {
        if (e->plan.parallel.dp != QT_DP_SHARDED && e->plan.precision.fp8 && !e->plan.weights.slots) { /* once per step: the persistent quants */
            qt_gpu_model_mark(g, "fp8 quantize: weights");
            qt_fp8_quantize_weights(g->fp8, e->base.L, ps->w, 0, e->base.L->cfg.num_layers, g->stream);
        }
        qt_gpu_model_mark(g, "optimizer: zero gradients");
        qt_param_zero_grads(ps, 0, ps->shard.n_buckets, g->stream);
    }
}

/* The flat index of the first NaN/Inf among this rank's pieces of the bf16 weights (host scan: only once
 * a count said there is one), -1 when none. */
static long first_nonfinite(gpu_engine *e) {
    const qt_param_store *ps = e->g->ps;
    qt_dp_sync_join(e->sync);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    long bad = -1;
    for (int k = 0; k < ps->shard.n_buckets && bad < 0; k++) {
        size_t off, len, st, np = 0;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        uint16_t *h = (np = qt_shard_params(off, len, e->base.L->numel)) ? malloc(np * 2) : NULL;
        QT_CHECK(h || !np, "out of host memory");
        if (np) QT_CUDA(cudaMemcpy(h, qt_param_w_mine(ps, off), np * 2, cudaMemcpyDefault)); /* maybe host (offloaded) */
        for (size_t i = 0; i < np && bad < 0; i++)
            if ((h[i] & 0x7f80u) == 0x7f80u) bad = (long)(off + i);
        free(h);
    }
    return bad;
}

/* Takes in the counts in flight of steps before `upto` (wait: their copy is waited for; else only those
 * already copied), keeping the first step that found a NaN/Inf. */
static void take_counts(gpu_engine *e, long upto, int wait) {
    int older = e->bad_pending[1] && (!e->bad_pending[0] || e->bad_pending[1] < e->bad_pending[0]);
    for (int pass = 0; pass < 2; pass++) { /* the older step first */
        int k = pass ^ older;
        long t = e->bad_pending[k];
        if (!t || t >= upto) continue;
        if (!wait && cudaEventQuery(e->bad_ev[k]) == cudaErrorNotReady) continue;
        QT_CUDA(cudaEventSynchronize(e->bad_ev[k]));
        e->bad_pending[k] = 0;
        if (e->out->bad[k] && e->first_bad < 0) {
            e->first_bad = first_nonfinite(e);
            e->first_bad_step = t;
            QT_CHECK(e->first_bad >= 0, "step %ld: %u NaN/Inf weights counted but none found", t, e->out->bad[k]);
        }
    }
}

static long gpu_nonfinite_weight(qt_engine *b, int settle, long *step) {
    gpu_engine *e = (gpu_engine *)b;
    take_counts(e, LONG_MAX, settle);
    *step = e->first_bad_step;
    return e->first_bad;
}

static void gpu_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    const qt_plan_optimizer *o = &e->plan.optimizer;
    cudaStream_t s = g->stream;
    qt_dp_sync_join(e->sync);
    qt_dp_sync_reduce(e->sync);
    e->micro_in_step = 0;
    qt_adamw_args a = {lr, o->beta1, o->beta2, o->eps, t, o->seed, e->plan.precision.stochastic_rounding, 0, 0,
                       e->bad_dev};
#ifdef QT_MUTANTS
    if (qt_mutant_on(QT_MUT_NONFINITE_UNCHECKED)) a.nonfinite = NULL;
#endif
    optimizer(e, &a);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->head.loss_sum, 8, cudaMemcpyDeviceToHost, s));
    QT_CUDA(cudaMemcpyAsync(&e->out->norm, g->ps->norm, 4, cudaMemcpyDeviceToHost, s));
    if (e->plan.precision.fp8) QT_CUDA(cudaMemcpyAsync(&e->out->nonfinite, g->fp8->nonfinite, 4, cudaMemcpyDeviceToHost, s));
    qt_zero(g->head.loss_sum, 8, s);
    QT_CUDA(cudaStreamSynchronize(s));
    /* this step's count when AdamW ran on s; ahead of the next forward, the last step's (that forward
     * waited for every bucket: the copy is done or about to be) */
    take_counts(e, e->plan.optimizer.ahead ? t : LONG_MAX, 1);
    if (e->plan.precision.fp8 && e->out->nonfinite && e->first_bad < 0) { /* NaN weights: the precise message wins */
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
    if (e->plan.dpo) dpo_opt_step(e, loss);
}

static float gpu_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    gpu_engine *e = (gpu_engine *)b;
    if (e->plan.dpo) return dpo_eval_loss(e, in, tgt);
    qt_gpu_model *g = e->g;
    long valid = upload(e, in, tgt);
    qt_gpu_step_args a = {0.0f, 0, 0, qt_dp_sync_wait_hooks(e->sync)};
    qt_gpu_model_step(g, &a);
    QT_CUDA(cudaMemcpyAsync(&e->out->loss, g->head.loss_sum, 8, cudaMemcpyDeviceToHost, g->stream));
    qt_zero(g->head.loss_sum, 8, g->stream);
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

void qt_engine_gpu_node_widen(qt_engine *b, const void *pieces, size_t es, void *out) {
    qt_dp_sync_node_widen(((gpu_engine *)b)->sync, pieces, es, out);
}

void qt_engine_gpu_weights_nodes(qt_engine *b, float *w) {
    gpu_engine *e = (gpu_engine *)b;
    const qt_param_store *ps = e->g->ps;
    const qt_shard *sh = &ps->shard;
    size_t nodes = (size_t)sh->nodes, numel = b->L->numel;
    float *mine = malloc(sh->len * 4), *wide = w ? malloc(sh->len * nodes * 4) : NULL;
    QT_CHECK(mine && (wide || !w), "out of host memory for %.1f MiB of master pieces", sh->len * (nodes + 1) * 4 / 1048576.0);
    qt_dp_sync_join(e->sync);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    qt_param_get_master_pieces(ps, mine);
    qt_dp_sync_node_widen(e->sync, mine, 4, wide);
    for (int k = 0; w && k < sh->n_buckets; k++) { /* the local piece's values to their flat places */
        size_t off, len;
        qt_shard_local_piece(sh, k, &off, &len);
        size_t np = qt_shard_params(off, len, numel);
        if (np) memcpy(w + off, wide + sh->bucket[k] / (size_t)qt_shard_local_ranks(sh), np * 4);
    }
    free(mine);
    free(wide);
}

static void gpu_get_grads(qt_engine *b, float *gr) {
    gpu_engine *e = (gpu_engine *)b;
    QT_CHECK(qt_dp_sync_idle(e->sync),
             "rank %d: get_grads after the last micro-step of a step: its gradients are summed over the GPUs (or "
             "wait for the other ranks' embedding lookups); read them before that micro-step", e->plan.parallel.rank);
    qt_dp_sync_join(e->sync); /* AdamW running ahead zeroes them; ZeRO-2's sums run beside */
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    qt_param_get_grads(e->g->ps, gr);
}

static float *gpu_grads_device(qt_engine *b, int *device) {
    gpu_engine *e = (gpu_engine *)b;
    const qt_param_store *ps = e->g->ps;
    QT_CHECK(!ps->grads_place->host && ps->grad_dt == QT_DT_F32,
             "device gradients: expected fp32 gradients on the GPU, got %s (memory.offload: [gradients] keeps them in "
             "host memory; precision.grad_accum_dtype bf16 is not fp32): read them with qtrain_get_gradients",
             ps->grads_place->host ? "gradients in host memory" : "bf16 gradients");
    qt_dp_sync_join(e->sync);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    QT_CUDA(cudaGetDevice(device));
    return e->g->ps->grad;
}

static void gpu_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    gpu_engine *e = (gpu_engine *)b;
    upload(e, in, NULL);
    qt_gpu_model_logits(e->g, qt_dp_sync_wait_hooks(e->sync), logits);
}

static const char *const item_names[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};

/* One GPU or a ZeRO rank offloaded: m, v and an fp32 master are checkpointed from where they live (pinned
 * host memory) unless the trainer chose to copy them (set_state_copy); the optimizer waits for the writer
 * per chunk (set_state_guard; a rank's guard is the data-parallel engine's, which maps the rank's chunk
 * to the whole array the writer goes through). The bf16 weights too when memory.offload has them in host
 * memory (AdamW writes them in the same chunks; with a bf16 master the widened "weights" is their view,
 * live as well); otherwise they are the device weights and their copy is the checkpoint's. A replicated
 * rank's are copied: the data-parallel engine hands rank 0's blobs on as snapshots. */
/* Item i (weights, weights_bf16, adam_m, adam_v) lives in host memory and is written in place (the plan's
 * qt_plan_ckpt_in_place): the state arrays memory.offload names, the host weights, and with a bf16 master
 * "weights" (their view). */
static int live_item(const gpu_engine *e, int i) {
    if (e->ckpt_copy) return 0;
    qt_plan_ckpt_live lv = qt_plan_ckpt_in_place(&e->plan);
    if (i == 0) return e->g->ps->master ? lv.master : lv.weights;
    return i == 1 ? lv.weights : i == 2 ? lv.m : lv.v;
}
/* Across nodes with ZeRO over the world, item i holds the rank's world pieces (all but the whole bf16 weights below
 * ZeRO-3): it is handed over where it lives, device or host, and the data-parallel engine gathers every node's
 * pieces of it into node 0's host memory (engine_dp.c's job_widen): no snapshot of its own. */
static int node_item(const gpu_engine *e, int i) {
    return e->plan.parallel.world_pieces && (i != 1 || e->plan.parallel.split.weights);
}
/* Elements of checkpoint item i (0 master, 1 bf16 weights, 2 m, 3 v): the rank's pieces, but the bf16 weights
 * whole below ZeRO-3. */
static size_t item_elems(const gpu_engine *e, int i) {
    return i == 1 && !e->plan.parallel.split.weights ? e->base.L->numel : e->g->ps->shard.len;
}

/* The bytes of those items when they are live (a widened "weights" is the host weights' view: no bytes). */
static size_t live_bytes(const gpu_engine *e) {
    const qt_param_store *ps = e->g->ps;
    size_t es[4] = {ps->master ? 4 : 0, 2, qt_dtype_size(ps->m_dt), qt_dtype_size(ps->v_dt)}, bytes = 0;
    for (int i = 0; i < 4; i++)
        if (live_item(e, i)) bytes += item_elems(e, i) * es[i];
    return bytes;
}

/* Blobs: the fp32 master as "weights" (the CPU engine's name, so checkpoints move between paths), the
 * bf16 working copy (it differs from RNE(master) under stochastic rounding) and m, v. Sharded: weights,
 * adam_m and adam_v hold this rank's pieces only, back to back with their padding (the store's shard
 * says where each goes); ZeRO-3 weights_bf16 too. With precision.master_dtype bf16 there is no master:
 * "weights" is the weights_bf16 copy widened as it is written (QT_CKPT_WIDEN_BF16: the exact fp32 values
 * of the bf16 weights, no fp32 buffer), laid out as weights_bf16 is (whole below ZeRO-3). */
static int gpu_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    gpu_engine *e = (gpu_engine *)b;
    const qt_param_store *ps = e->g->ps;
    QT_CHECK(cap >= 4, "need room for 4 checkpoint items, got %d", cap);
    qt_dp_sync_join(e->sync);
    QT_CUDA(cudaStreamSynchronize(e->g->stream));
    for (int i = ps->master ? 0 : 1; i < 4; i++) {
        qt_dtype dt;
        const void *src = qt_param_item(ps, i, &dt);
        size_t bytes = item_elems(e, i) * qt_dtype_size(dt);
        if (live_item(e, i) || node_item(e, i)) {
            items[i] = (qt_ckpt_item){item_names[i], dt, src, bytes, 0};
            continue;
        }
        if (!e->host_state[i]) {
            QT_CHECK(qt_pinned_alloc(&e->host_state[i], bytes ? bytes : 1, 0) == 0,
                     "checkpoint snapshot: %.2f GiB of pinned host memory for %s could not be allocated", bytes / 1073741824.0,
                     item_names[i]);
            e->snap_bytes += bytes;
        }
        if (i == 0) qt_param_get_master_pieces(ps, e->host_state[0]);
        else QT_CUDA(cudaMemcpy(e->host_state[i], src, bytes, cudaMemcpyDefault)); /* m, v: maybe host */
        items[i] = (qt_ckpt_item){item_names[i], dt, e->host_state[i], bytes, 0};
    }
    if (!ps->master) items[0] = (qt_ckpt_item){item_names[0], QT_DT_F32, items[1].data, items[1].bytes * 2, QT_CKPT_WIDEN_BF16};
    return 4;
}

static size_t gpu_snapshot_bytes(const qt_engine *b) { return ((const gpu_engine *)b)->snap_bytes; }

static int gpu_state_live(qt_engine *b, qt_ckpt_live *live) {
    gpu_engine *e = (gpu_engine *)b;
    *live = (qt_ckpt_live){0, {0}, e->g->ps->shard.len, e->g->ps->plan.optimizer.chunk}; /* the weights: numel <= shard.len */
    for (int i = 0; i < 4; i++)
        if (live_item(e, i)) live->idx[live->n++] = i;
    return live->n;
}

static void gpu_set_state_copy(qt_engine *b, int copy) {
    gpu_engine *e = (gpu_engine *)b;
    if (copy) qt_mem_plan_host(&e->g->plan, "checkpoint snapshot", live_bytes(e)); /* the copies state_items makes */
    e->ckpt_copy = copy;
}

static void gpu_set_state_guard(qt_engine *b, void (*wait)(void *ctx, size_t hi), void *ctx) {
    gpu_engine *e = (gpu_engine *)b; /* offloaded weights in place: AdamW's kernel writes them, so it waits first */
    qt_gpu_optim_set_guard(e->g->ps->opt, wait, ctx);
}

/* Checkpoints hold whole arrays; a sharded rank takes its pieces. */
static int gpu_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    gpu_engine *e = (gpu_engine *)b;
    qt_gpu_model *g = e->g;
    qt_param_store *ps = g->ps;
    size_t n = b->L->numel;
    qt_dp_sync_join(e->sync);
    /* host-resident items (memory.offload) are copied on the CPU: nothing queued may still write them */
    QT_CUDA(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < 4; i++) {
        qt_dtype want_dt;
        void *dst = qt_param_item(ps, i, &want_dt);
        size_t bytes, es = qt_dtype_size(want_dt), want = n * es;
        int dt;
        const void *p = qt_ckpt_get(ck, item_names[i], &bytes, &dt);
        /* a CPU checkpoint, or a bf16 master: the bf16 weights are RNE("weights") — the same bits where a
         * bf16-master run wrote it, one rounding of an fp32 master's (documented at precision.master_dtype) */
        if (i == 1 && (!p || !ps->master)) {
            qt_param_upload_bf16(ps, qt_ckpt_get(ck, item_names[0], NULL, NULL), n, g->stream);
            continue;
        }
        if (!p || bytes != want || dt != (int)want_dt) {
            snprintf(err, errlen, "checkpoint blob %s: expected %zu bytes of %s (precision.opt_*_dtype must match the run that wrote it), got %s",
                     item_names[i], want, qt_dtype_name(want_dt), p ? "another size or dtype" : "none");
            return -1;
        }
        if (i == 1 && !e->plan.parallel.split.weights) { /* whole; offloaded weights: host to host */
            QT_CUDA(cudaMemcpyAsync(dst, p, want, cudaMemcpyDefault, g->stream));
            continue;
        }
        if (!dst) continue; /* no master array (bf16): "weights" goes into the bf16 weights (i == 1) */
        for (int k = 0; k < ps->shard.n_buckets; k++) {
            size_t off, len, st, np;
            qt_shard_piece(&ps->shard, k, &off, &len, &st);
            if ((np = qt_shard_params(off, len, n)))
                QT_CUDA(cudaMemcpyAsync((char *)dst + st * es, (const char *)p + off * es, np * es,
                                        cudaMemcpyDefault, g->stream));
        }
    }
    /* the weight slots' fp8 abs-maxes come at each layer's forward; whole weights are quantized here */
    if (!qt_dp_sync_reload(e->sync) && e->plan.precision.fp8)
        qt_fp8_quantize_weights(g->fp8, b->L, ps->w, 0, b->L->cfg.num_layers, g->stream);
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
        qt_pinned_free(e->host_state[i]);
    QT_CUDA(cudaFreeHost(e->out));
    QT_CUDA(cudaFree(e->bad_dev));
    for (int i = 0; i < 2; i++) QT_CUDA(cudaEventDestroy(e->bad_ev[i]));
    qt_gpu_model_free(e->g);
    dpo_free(e);
    free(e);
}

static void gpu_profile(qt_engine *b, int on) { qt_gpu_model_profile(((gpu_engine *)b)->g, on); }
static void gpu_profile_print(qt_engine *b, int steps) { qt_gpu_model_profile_print(((gpu_engine *)b)->g, steps); }

size_t qt_engine_gpu_tuning_save(qt_engine *b, void *buf, size_t cap) {
    (void)b;
    return qt_matmul_choices_save(buf, cap);
}

int qt_engine_gpu_tuning_load(qt_engine *b, const void *buf, size_t n, char *err, size_t errlen) {
    (void)b;
    return qt_matmul_choices_load(buf, n, err, errlen);
}

static void gpu_set_docs(qt_engine *b, const qt_docs *d) {
    char err[512];
    QT_CHECK(qt_gpu_model_set_docs(((gpu_engine *)b)->g, d, err, sizeof err) == 0, "%s", err);
}

/* The same ops under the name the run's log shows. */
#define GPU_OPS(nm)                                                                                   \
    {.name = nm, .micro_step = gpu_micro_step, .opt_step = gpu_opt_step, .eval_loss = gpu_eval_loss,    \
     .get_weights = gpu_get_weights, .get_grads = gpu_get_grads, .grads_device = gpu_grads_device,      \
     .forward_logits = gpu_forward_logits,                                                            \
     .state_items = gpu_state_items, .load_state = gpu_load_state, .print_memory = gpu_print_memory,   \
     .nonfinite_weight = gpu_nonfinite_weight, .state_live = gpu_state_live,                             \
     .set_state_guard = gpu_set_state_guard, .set_state_copy = gpu_set_state_copy,                     \
     .snapshot_bytes = gpu_snapshot_bytes, .tuning_save = qt_engine_gpu_tuning_save,                   \
     .tuning_load = qt_engine_gpu_tuning_load,                                                         \
     .profile = gpu_profile, .profile_print = gpu_profile_print, .free = gpu_free, .state_is_snapshot = 1, \
     .set_docs = gpu_set_docs, .dpo_stats = gpu_dpo_stats, .row_logps = gpu_row_logps, \
     .set_dpo_ref = gpu_set_dpo_ref}
static const qt_engine_ops gpu_ops = GPU_OPS("cuda-bf16"), fp8_ops = GPU_OPS("cuda-fp8 (e4m3 blocks)");

void qt_engine_gpu_last_loss(const qt_engine *b, double *sum, long *valid) {
    const gpu_engine *e = (const gpu_engine *)b;
    *sum = e->last_loss_sum;
    *valid = e->last_valid;
}

int qt_engine_gpu_select(const qt_layout *L, const qt_plan *plan, int device, char *err, size_t errlen) {
    QT_CUDA(cudaSetDevice(device));
    if (!plan->precision.fp8) return 0;
    struct cudaDeviceProp p;
    QT_CUDA(cudaGetDeviceProperties(&p, device));
    return qt_fp8_check(&L->cfg, plan->run.path, (long)plan->run.B * plan->run.T, p.major * 10 + p.minor, err, errlen);
}

qt_engine *qt_engine_gpu_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int device,
                                    const qt_gpu_rank *rank, char *err, size_t errlen) {
    if (qt_engine_gpu_select(L, plan, device, err, errlen)) return NULL;
    gpu_engine *e = calloc(1, sizeof *e);
    QT_CHECK(e, "out of host memory");
    e->plan = *plan;
    if (rank) e->plan.parallel.rank = rank->rank;
    e->dp_rank = rank != NULL;
    e->base = (qt_engine){plan->precision.fp8 ? &fp8_ops : &gpu_ops, L, &e->plan, 1, NULL};
    qt_shard one;
    QT_CHECK((rank != NULL) == (plan->parallel.dp != QT_DP_ONE), "a %s engine on a plan for %d rank(s)",
             rank ? "data-parallel rank's" : "one GPU's", plan->parallel.n_ranks);
    /* offloaded optimizer: AdamW bucket by bucket; offloaded weights / gradients: a slot per layer bucket */
    if (!rank) qt_shard_init(&one, L, 1, 0, plan->parallel.buckets);
    e->g = qt_gpu_model_create(L, &e->plan, src, rank ? rank->shard : &one, err, errlen);
    if (!e->g) {
        free(e);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        QT_CUDA(cudaMallocHost((void **)&e->pin[i], 2 * e->g->N * sizeof(int32_t)));
        QT_CUDA(cudaEventCreateWithFlags(&e->pin_free[i], cudaEventDisableTiming));
        QT_CUDA(cudaEventRecord(e->pin_free[i], e->g->stream));
    }
    /* the checkpoint snapshot (gpu_state_items): the bf16 weights, and an fp32 master, m, v unless written
     * in place (the default of an offloaded state; set_state_copy adds their copy when the trainer chooses
     * one); a bf16 master's "weights" is the bf16 copy, widened as it is written */
    const qt_param_store *ps = e->g->ps;
    size_t snap = item_elems(e, 1) * 2 +
                  ps->shard.len * ((ps->master ? 4 : 0) + qt_dtype_size(ps->m_dt) + qt_dtype_size(ps->v_dt)) - live_bytes(e);
    if (e->plan.parallel.world_pieces) snap = node_item(e, 1) ? 0 : item_elems(e, 1) * 2; /* the whole bf16 weights only */
    qt_mem_plan_host(&e->g->plan, "checkpoint snapshot", snap);
    QT_CUDA(cudaMallocHost((void **)&e->out, sizeof *e->out));
    QT_CUDA(cudaMalloc((void **)&e->bad_dev, sizeof *e->bad_dev));
    for (int i = 0; i < 2; i++) QT_CUDA(cudaEventCreateWithFlags(&e->bad_ev[i], cudaEventDisableTiming));
    e->first_bad = e->first_bad_step = -1;
    /* a forward that did not wait for its bucket would then read last step's weights (test_train) */
    e->sync = qt_dp_sync_create(e->g, &e->plan, rank ? rank->comm : NULL, rank ? rank->nodes : NULL, qt_test_hooks_get());
    dpo_init(e);
    return &e->base;
}
