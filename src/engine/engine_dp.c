/* engine_dp.c — data parallelism over the GPUs of this process: one pthread per rank, each driving its
 * own single-GPU engine (the whole model) on its device.
 *
 * The training loop stays single-threaded: every engine call is handed to the rank threads at once
 * and returns when each has run it (micro-steps only enqueue GPU work, so the hand-off costs
 * microseconds, not a device sync). Each rank trains on its own micro-batch; opt_step sums the
 * gradients over the comm (fp32, ascending rank order: every rank gets the same bits) before the norm
 * and AdamW, so the ranks' weights stay bitwise identical (opt_step checks the norms). With
 * parallel.zero 1 (ZeRO-1, the default) each rank holds the master weights and moments of 1/N of the
 * parameters (its piece of every bucket, qt_partition.h): gradients are reduce-scattered, each rank
 * updates its pieces, the bf16 weights are all-gathered; checkpoints and get_weights assemble the
 * pieces. ZeRO-2 keeps only the rank's pieces of the gradients too (reduced every micro-step;
 * get_grads assembles them); ZeRO-3 of the bf16 weights too (each layer's gathered into a weight slot
 * as the model reads it, qt_weight_slots.h; checkpoints assemble weights_bf16 like the rest). zero 0: every rank keeps all of it (all-reduce) and get_weights checks
 * the replicas agree. Sharded, or with parallel.overlap_comm, the buckets are one per layer; with the
 * overlap each is summed while the backward of the layers below runs (dp_sync.c). A failure in a rank thread jumps to that thread's
 * catch point around its job (qt_error.h), whose abort hooks abort the comm, so ranks blocked in a
 * collective fail too instead of hanging; when every rank is back, the call fails in the caller's thread
 * with the first failing rank's message (the engine calls of src/engine/engine.c return it as an
 * error). After that the engine may only be freed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qt_comm.h"
#include "qt_dp_nodes.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_gpu_model.h"
#include "qt_test_hooks.h"

_Static_assert(QT_SHARD_MAX_RANKS >= QT_COMM_MAX_RANKS, "a rank's gradient sum of squares needs a slot per rank");

typedef struct dp_engine dp_engine;
typedef void (*dp_job)(dp_engine *d, int r);
typedef struct {
    dp_engine *d;
    int r;
} rank_arg;

struct dp_engine {
    qt_engine base;
    qt_engine_ops ops;
    char name[256];
    int n;
    int dev[QT_COMM_MAX_RANKS];
    qt_plan plan;                     /* every rank's, but for its rank index */
    qt_engine *rk[QT_COMM_MAX_RANKS]; /* owned; made and freed by their rank's thread */
    qt_comm *comm;                    /* owned */
    qt_dp_nodes *nodes;               /* owned; NULL on one machine (parallel.nodes 1) */
    int first;                        /* the global rank of this node's rank 0 (node x n): its micro-batches */
    struct {                          /* the rank threads, the hand-off of a job and the failures they caught (mu) */
        pthread_t th[QT_COMM_MAX_RANKS];
        rank_arg arg[QT_COMM_MAX_RANKS];
        pthread_mutex_t mu;
        pthread_cond_t go, done;
        long gen;      /* job generation: each rank runs every new job once */
        int pending;   /* ranks still running the current job */
        int only;      /* the job's single rank, or -1 for all */
        int quit;
        dp_job job;
        char fail[QT_COMM_MAX_RANKS][1024]; /* a rank's caught failure ("[rank R] file:line: ...") */
        int fail_order[QT_COMM_MAX_RANKS];  /* 1 for the first rank that failed, 2 the next, ...; 0: none */
        int nfail;
    } pool;
    struct {                          /* the current job's arguments and results */
        const qt_weight_src *src;
        char err[QT_COMM_MAX_RANKS][512];
        const int32_t *in, *tgt;
        float scale, lr;
        long t;
        float loss[QT_COMM_MAX_RANKS], gnorm[QT_COMM_MAX_RANKS];
        float *out;
        qt_ckpt_item *items;
        int cap, nitems, on;
        int settle;
        long bad[QT_COMM_MAX_RANKS], bad_step[QT_COMM_MAX_RANKS]; /* each rank's nonfinite_weight */
        const qt_ckpt *ck;
        int rc[QT_COMM_MAX_RANKS];
        const qt_docs *docs;  /* set_docs' documents of all ranks' windows (NULL: none) */
        const double *dref;   /* set_dpo_ref's reference log-probs of all ranks' rows (NULL: none) */
        double *logp;         /* row_logps' output [ranks x B] */
        qt_dpo_stats dst[QT_COMM_MAX_RANKS]; /* each rank's dpo_stats */
    } call;
    int fail_rank; /* test hook (qt_test_hooks): that rank fails just before optimizer step fail_step */
    long fail_step;
    qt_shard shard[QT_COMM_MAX_RANKS];
    qt_plan_split split; /* the plan's: what each rank holds in pieces (ZeRO), the rest whole */
    struct {       /* sharded: each checkpoint array as the runs of the ranks' pieces in file order (owned: segs[k]) */
        qt_ckpt_item mine[QT_COMM_MAX_RANKS][8]; /* each rank's own items (its snapshot buffers) */
        void *wide[QT_COMM_MAX_RANKS][4]; /* across nodes, node 0: every node's pieces of a rank's local pieces (owned) */
        qt_ckpt_seg *segs[4];
        qt_ckpt_gather gather[4];
        void (*guard)(void *ctx, size_t hi); /* the trainer's wait for the checkpoint writer (set_state_guard) */
        void *guard_ctx;
    } ckpt;
};

/* Runs job on every rank (only < 0) or on rank `only`, and returns when it is done. */
static void job_free(dp_engine *d, int r);

/* Runs job on every rank (only < 0) or on rank `only`, and returns when it is done; fails (qt_fail, in
 * this thread) with the first failing rank's message when a rank failed, now or in an earlier call
 * (but for job_free, which takes a broken engine down). */
static void run(dp_engine *d, dp_job job, int only) {
    pthread_mutex_lock(&d->pool.mu);
    int broken = d->pool.nfail && job != job_free;
    if (!broken) {
        d->pool.job = job;
        d->pool.only = only;
        d->pool.pending = d->n;
        d->pool.gen++;
        pthread_cond_broadcast(&d->pool.go);
        while (d->pool.pending) pthread_cond_wait(&d->pool.done, &d->pool.mu);
    }
    int first = -1;
    for (int r = 0; r < d->n; r++)
        if (d->pool.fail_order[r] == 1) first = r;
    pthread_mutex_unlock(&d->pool.mu);
    char lost[1024]; /* another node failed: its message, whatever the ranks here met after the abort */
    if (d->nodes && job != job_free && qt_dp_nodes_failed(d->nodes, lost, sizeof lost))
        qt_fail(__FILE__, __LINE__, "a node failed", "%s", lost);
    if (first >= 0 && job != job_free) qt_fail(__FILE__, __LINE__, "a rank failed", "%s", d->pool.fail[first]);
}

static void *rank_loop(void *p) {
    dp_engine *d = ((rank_arg *)p)->d;
    int r = ((rank_arg *)p)->r;
    qt_error_set_rank(r);
    QT_CUDA(cudaSetDevice(d->dev[r]));
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&d->pool.mu);
        while (d->pool.gen == seen) pthread_cond_wait(&d->pool.go, &d->pool.mu);
        seen = d->pool.gen;
        dp_job job = d->pool.job;
        int mine = d->pool.only < 0 || d->pool.only == r, quit = d->pool.quit;
        pthread_mutex_unlock(&d->pool.mu);
        if (quit) return NULL;
        if (mine) {
            qt_catch c;
            qt_catch_push(&c);
            if (setjmp(c.jb) == 0) {
                job(d, r);
                qt_catch_pop(&c);
            } else {
                pthread_mutex_lock(&d->pool.mu);
                d->pool.fail_order[r] = ++d->pool.nfail;
                snprintf(d->pool.fail[r], sizeof d->pool.fail[r], "%s", c.msg);
                pthread_mutex_unlock(&d->pool.mu);
            }
        }
        pthread_mutex_lock(&d->pool.mu);
        if (--d->pool.pending == 0) pthread_cond_signal(&d->pool.done);
        pthread_mutex_unlock(&d->pool.mu);
    }
}

/* ---- jobs (run in rank r's thread, its device current) ---- */

static void job_create(dp_engine *d, int r) {
    qt_gpu_rank rank = {d->comm, r, &d->shard[r], d->nodes ? qt_dp_nodes_link(d->nodes) : NULL};
    d->rk[r] = qt_engine_gpu_create(d->base.L, &d->plan, d->call.src, d->dev[r], &rank, d->call.err[r], sizeof d->call.err[r]);
}
static void job_micro(dp_engine *d, int r) {
    size_t ntok = (size_t)d->plan.run.B * d->plan.run.T;
    size_t at = (size_t)(d->first + r) * ntok; /* the global rank's micro-batch */
    d->rk[r]->ops->micro_step(d->rk[r], d->call.in + at, d->call.tgt ? d->call.tgt + at : NULL, d->call.scale);
}
static void job_opt(dp_engine *d, int r) {
    /* the other ranks are then already waiting in the gradient all-reduce: they must stop too */
    QT_CHECK(r != d->fail_rank || d->call.t != d->fail_step, "injected failure (test hook dp_fail_step) before step %ld", d->call.t);
    d->rk[r]->ops->opt_step(d->rk[r], d->call.lr, d->call.t, &d->call.loss[r], &d->call.gnorm[r]);
}
static void job_eval(dp_engine *d, int r) {
    size_t ntok = (size_t)d->plan.run.B * d->plan.run.T;
    size_t at = (size_t)(d->first + r) * ntok;
    d->call.loss[r] = d->rk[r]->ops->eval_loss(d->rk[r], d->call.in + at, d->call.tgt + at);
}
static void job_weights(dp_engine *d, int r) { d->rk[r]->ops->get_weights(d->rk[r], d->call.out); }
static void job_grads(dp_engine *d, int r) { d->rk[r]->ops->get_grads(d->rk[r], d->call.out); }
/* Rank 0's logits; ZeRO-3: every rank runs the forward (its weight gathers are collectives), the others
 * without the LM head's host copy. */
static void job_logits(dp_engine *d, int r) { d->rk[r]->ops->forward_logits(d->rk[r], d->call.in, r == 0 ? d->call.out : NULL); }
static void job_items(dp_engine *d, int r) { d->call.nitems = d->rk[r]->ops->state_items(d->rk[r], d->call.items, d->call.cap); }
/* Across nodes with ZeRO over the world: rank r's items that hold its world pieces (weights unless widened from
 * the bf16 ones, ZeRO-3's weights_bf16, adam_m, adam_v; handed over where they live, engine_gpu.c's node_item)
 * gathered over the nodes; node 0 keeps them in wide[r] and its items point there, as the rank's local pieces
 * of one node holding the state. */
static void job_widen(dp_engine *d, int r) {
    qt_ckpt_item *it = d->ckpt.mine[r];
    size_t nodes = (size_t)d->shard[r].nodes;
    for (int k = 0; k < 4; k++) {
        if ((k == 1 && !d->split.weights) || (k == 0 && (it[0].flags & QT_CKPT_WIDEN_BF16))) continue;
        size_t es = qt_dtype_size((qt_dtype)it[k].dtype), bytes = d->shard[r].len * es * nodes;
        if (d->plan.parallel.node == 0 && !d->ckpt.wide[r][k]) {
            d->ckpt.wide[r][k] = malloc(bytes);
            QT_CHECK(d->ckpt.wide[r][k], "out of host memory for %.1f MiB of the nodes' %s pieces", bytes / 1048576.0, it[k].name);
        }
        qt_engine_gpu_node_widen(d->rk[r], it[k].data, es, d->ckpt.wide[r][k]);
        if (d->ckpt.wide[r][k]) it[k] = (qt_ckpt_item){it[k].name, it[k].dtype, d->ckpt.wide[r][k], bytes, it[k].flags};
    }
}
static void job_weights_nodes(dp_engine *d, int r) { qt_engine_gpu_weights_nodes(d->rk[r], d->call.out); }
static void job_load(dp_engine *d, int r) { d->call.rc[r] = d->rk[r]->ops->load_state(d->rk[r], d->call.ck, d->call.err[r], sizeof d->call.err[r]); }
static void job_nonfinite(dp_engine *d, int r) {
    d->call.bad[r] = d->rk[r]->ops->nonfinite_weight(d->rk[r], d->call.settle, &d->call.bad_step[r]);
}
static void job_memory(dp_engine *d, int r) { d->rk[r]->ops->print_memory(d->rk[r]); }
static void job_profile(dp_engine *d, int r) { d->rk[r]->ops->profile(d->rk[r], d->call.on); }
static void job_profile_print(dp_engine *d, int r) { d->rk[r]->ops->profile_print(d->rk[r], d->call.on); }
/* Rank r's windows of the documents: rows [r*B, (r+1)*B) of the ranks x B. */
static void job_docs(dp_engine *d, int r) {
    if (!d->call.docs) {
        d->rk[r]->ops->set_docs(d->rk[r], NULL);
        return;
    }
    size_t B = (size_t)d->plan.run.B, T = (size_t)d->plan.run.T;
    size_t g = (size_t)(d->first + r);
    qt_docs mine = {d->call.docs->starts + g * B * T, d->call.docs->n_starts + g * B, d->call.docs->attention, d->call.docs->positions};
    d->rk[r]->ops->set_docs(d->rk[r], &mine);
}
/* objective: dpo: rank r's rows [r*B, (r+1)*B) of the ranks x B. */
static void job_row_logps(dp_engine *d, int r) {
    size_t B = (size_t)d->plan.run.B, ntok = B * d->plan.run.T;
    size_t g = (size_t)(d->first + r);
    d->rk[r]->ops->row_logps(d->rk[r], d->call.in + g * ntok, d->call.tgt + g * ntok, d->call.logp + g * B);
}
static void job_dpo_ref(dp_engine *d, int r) {
    d->rk[r]->ops->set_dpo_ref(d->rk[r], d->call.dref ? d->call.dref + (size_t)(d->first + r) * d->plan.run.B : NULL);
}
static void job_dpo_stats(dp_engine *d, int r) { d->rk[r]->ops->dpo_stats(d->rk[r], d->call.on, &d->call.dst[r]); }
static void job_free(dp_engine *d, int r) {
    if (d->rk[r]) d->rk[r]->ops->free(d->rk[r]);
    d->rk[r] = NULL;
}

/* ---- the engine ops ---- */

/* The world's values: this node's mine[per] and, across nodes, every node's after it in node order
 * (qt_dp_nodes_gather), into all; returns how many. */
static int world_values(dp_engine *d, const double *mine, int per, double *all) {
    if (!d->nodes) {
        memcpy(all, mine, (size_t)per * sizeof *mine);
        return per;
    }
    qt_dp_nodes_gather(d->nodes, mine, per, all);
    return per * d->plan.parallel.nodes;
}

static int dp_nodes_count(qt_engine *b, int mine) {
    dp_engine *d = (dp_engine *)b;
    double v = mine != 0, all[QT_NODES_MAX];
    int n = world_values(d, &v, 1, all), count = 0;
    for (int i = 0; i < n; i++) count += all[i] != 0;
    return count;
}

static void dp_micro_step(qt_engine *b, const int32_t *in, const int32_t *tgt, float grad_scale) {
    dp_engine *d = (dp_engine *)b;
    d->call.in = in;
    d->call.tgt = tgt;
    d->call.scale = grad_scale; /* per target, over all ranks' targets (qt_loss_scale): the sum over ranks is the mean */
    run(d, job_micro, -1);
}

static void dp_opt_step(qt_engine *b, float lr, long t, float *loss, float *gnorm) {
    dp_engine *d = (dp_engine *)b;
    d->call.lr = lr;
    d->call.t = t;
    run(d, job_opt, -1);
    int per = 2 * d->n + 1; /* the ranks' (loss sum, count) pairs, then the norm */
    double sv[2 * QT_COMM_MAX_RANKS + 1], all[(2 * QT_COMM_MAX_RANKS + 1) * QT_NODES_MAX], sum = 0;
    long valid = 0;
    for (int r = 0; r < d->n; r++) {
        long v;
        qt_engine_gpu_last_loss(d->rk[r], &sv[2 * r], &v);
        sv[2 * r + 1] = (double)v;
        QT_CHECK(memcmp(&d->call.gnorm[r], &d->call.gnorm[0], sizeof(float)) == 0,
                 "step %ld: rank %d's gradient norm %.9g differs from rank 0's %.9g: the replicas diverged", t, r,
                 d->call.gnorm[r], d->call.gnorm[0]);
    }
    sv[2 * d->n] = d->call.gnorm[0];
    int nv = world_values(d, sv, per, all);
    for (int k = 0; k < nv; k += per) { /* every node's ranks in global rank order */
        for (int i = 0; i < 2 * d->n; i += 2) {
            sum += all[k + i];
            valid += (long)all[k + i + 1];
        }
        QT_CHECK(!memcmp(&all[k + 2 * d->n], &all[2 * d->n], sizeof *all), "step %ld: node %d's gradient norm %.9g "
                 "differs from node 0's %.9g: the nodes' replicas diverged", t, k / per, all[k + 2 * d->n], all[2 * d->n]);
    }
    *loss = valid ? (float)(sum / valid) : 0.0f;
    *gnorm = d->call.gnorm[0];
}

static float dp_eval_loss(qt_engine *b, const int32_t *in, const int32_t *tgt) {
    dp_engine *d = (dp_engine *)b;
    d->call.in = in;
    d->call.tgt = tgt;
    run(d, job_eval, -1);
    double mine[QT_COMM_MAX_RANKS], all[QT_COMM_MAX_RANKS * QT_NODES_MAX];
    for (int r = 0; r < d->n; r++) mine[r] = d->call.loss[r];
    int nv = world_values(d, mine, d->n, all);
    float sum = 0;
    for (int i = 0; i < nv; i++) sum += (float)all[i];
    return sum;
}

/* Sharded: every rank writes its slice. Else rank 0's weights, after checking every replica holds the
 * same bits (one extra host copy). */
static void dp_get_weights(qt_engine *b, float *w) {
    dp_engine *d = (dp_engine *)b;
    size_t n = b->L->numel;
    d->call.out = w;
    if (d->plan.parallel.world_pieces) { /* every node takes part; w NULL on a node that only does */
        run(d, job_weights_nodes, -1);
        return;
    }
    run(d, job_weights, d->split.state ? -1 : 0);
    if (d->n == 1 || d->split.state) return;
    float *tmp = malloc(n * sizeof(float));
    QT_CHECK(tmp, "out of host memory for a replica check of %zu weights", n);
    d->call.out = tmp;
    for (int r = 1; r < d->n; r++) {
        run(d, job_weights, r);
        QT_CHECK(memcmp(tmp, w, n * sizeof(float)) == 0, "rank %d's weights differ from rank 0's: the replicas diverged", r);
    }
    free(tmp);
}

/* The gradients accumulated since the last opt_step, summed over the ranks in rank order (ZeRO-2: every
 * rank writes its summed pieces). */
static void dp_get_grads(qt_engine *b, float *g) {
    dp_engine *d = (dp_engine *)b;
    size_t n = b->L->numel;
    d->call.out = g;
    QT_CHECK(!(d->split.grads && d->plan.parallel.world_pieces), "get_grads across nodes with parallel.zero 2 or 3: the "
             "summed gradients are sharded over the nodes (read them with parallel.zero 0 or 1)");
    run(d, job_grads, d->split.grads ? -1 : 0);
    if (d->split.grads) return;
    float *tmp = malloc(n * sizeof(float));
    QT_CHECK(tmp, "out of host memory for %zu gradients", n);
    d->call.out = tmp;
    for (int r = 1; r < d->n; r++) {
        run(d, job_grads, r);
        for (size_t i = 0; i < n; i++) g[i] += tmp[i];
    }
    free(tmp);
}

static void dp_forward_logits(qt_engine *b, const int32_t *in, float *logits) {
    dp_engine *d = (dp_engine *)b;
    d->call.in = in;
    d->call.out = logits;
    run(d, job_logits, d->split.weights ? -1 : 0);
}

/* Rank 0's blobs; sharded, the pieces of weights, adam_m and adam_v (ZeRO-3: and weights_bf16) of every
 * rank, gathered in file order (QT_CKPT_GATHERED: the writer reads each rank's snapshot buffers where they
 * are, no whole copy is put together). A bf16 master's "weights" is no array of its own: weights_bf16
 * widened as it is written (gpu_state_items). */
typedef struct {
    size_t off, n; /* elements of the whole array */
    const char *at;
} piece_run;
static int by_off(const void *a, const void *b) {
    size_t x = ((const piece_run *)a)->off, y = ((const piece_run *)b)->off;
    return (x > y) - (x < y);
}
static int dp_state_items(qt_engine *b, qt_ckpt_item *items, int cap) {
    dp_engine *d = (dp_engine *)b;
    d->call.items = items;
    d->call.cap = cap;
    run(d, job_items, 0);
    if (!d->split.state) return d->call.nitems;
    int whole_bf16 = !d->split.weights; /* the bf16 weights are whole on every rank below ZeRO-3 */
    int widen = items[0].flags & QT_CKPT_WIDEN_BF16;
    memcpy(d->ckpt.mine[0], items, (size_t)(d->call.nitems < 8 ? d->call.nitems : 8) * sizeof *items);
    for (int r = 1; r < d->n; r++) {
        d->call.items = d->ckpt.mine[r];
        run(d, job_items, r);
    }
    int world = d->plan.parallel.world_pieces; /* the node exchange; then the local pieces tile the array */
    if (world) run(d, job_widen, -1);
    if (world && d->plan.parallel.node > 0) return 0; /* node 0 writes */
    size_t numel = b->L->numel, most = (size_t)d->n * d->shard[0].n_buckets;
    piece_run *pr = malloc(most * sizeof *pr);
    QT_CHECK(pr, "out of host memory for the checkpoint's %zu runs", most);
    for (int k = 0; k < 4; k++) {
        if ((k == 1 && whole_bf16) || (k == 0 && widen)) continue; /* rank 0's whole bf16; the widened view below */
        size_t es = qt_dtype_size((qt_dtype)items[k].dtype);
        int np = 0;
        for (int r = 0; r < d->n; r++)
            for (int i = 0; i < d->shard[r].n_buckets; i++) {
                size_t off, len, st, m;
                qt_shard_piece(&d->shard[r], i, &off, &len, &st);
                if (world) { /* the local piece, in wide[r] */
                    qt_shard_local_piece(&d->shard[r], i, &off, &len);
                    st = d->shard[r].bucket[i] / (size_t)qt_shard_local_ranks(&d->shard[r]);
                }
                if ((m = qt_shard_params(off, len, numel)))
                    pr[np++] = (piece_run){off, m, (const char *)d->ckpt.mine[r][k].data + st * es};
            }
        qsort(pr, (size_t)np, sizeof *pr, by_off);
        if (!d->ckpt.segs[k]) d->ckpt.segs[k] = malloc(most * sizeof *d->ckpt.segs[k]);
        QT_CHECK(d->ckpt.segs[k], "out of host memory for the checkpoint's %zu runs", most);
        for (int j = 0; j < np; j++) { /* the pieces tile the array: each starts where the one before ends */
            QT_CHECK(pr[j].off == (j ? pr[j - 1].off + pr[j - 1].n : 0) && (j + 1 < np || pr[j].off + pr[j].n == numel),
                     "%s: the ranks' pieces do not tile the %zu elements (piece %d at %zu)", items[k].name, numel, j, pr[j].off);
            d->ckpt.segs[k][j] = (qt_ckpt_seg){pr[j].off * es, pr[j].at};
        }
        d->ckpt.gather[k] = (qt_ckpt_gather){d->ckpt.segs[k], np};
        items[k] = (qt_ckpt_item){items[k].name, items[k].dtype, &d->ckpt.gather[k], numel * es, QT_CKPT_GATHERED};
    }
    free(pr);
    if (widen) items[0] = (qt_ckpt_item){items[0].name, QT_DT_F32, items[1].data, numel * 4, items[1].flags | QT_CKPT_WIDEN_BF16};
    return d->call.nitems;
}

/* Live items (an offloaded state written where it lives, engine_gpu.c's live_state): ZeRO ranks only
 * (replicated ranks copy rank 0's); the same items on every rank, gathered over the whole array. */
static int dp_state_live(qt_engine *b, qt_ckpt_live *live) {
    dp_engine *d = (dp_engine *)b;
    live->n = 0;
    if (!d->split.state || !d->rk[0]->ops->state_live || !d->rk[0]->ops->state_live(d->rk[0], live)) return live->n = 0;
    live->elems = b->L->numel; /* the writer's mark: elements of the whole array */
    return live->n;
}
static void dp_set_state_copy(qt_engine *b, int copy) {
    dp_engine *d = (dp_engine *)b;
    for (int r = 0; r < d->n; r++)
        if (d->rk[r]->ops->set_state_copy) d->rk[r]->ops->set_state_copy(d->rk[r], copy);
}
/* A rank's AdamW asks before changing its state below local element hi (its pieces back to back, padded,
 * in the order of the whole array): the wait is for the whole array's element where that ends. */
static void rank_guard(void *ctx, size_t hi) {
    rank_arg *a = ctx;
    dp_engine *d = a->d;
    const qt_shard *sh = &d->shard[a->r];
    size_t g = 0;
    for (int i = 0; i < sh->n_buckets; i++) {
        size_t off, len, st;
        qt_shard_piece(sh, i, &off, &len, &st);
        if (hi <= st) break;
        g = off + (hi - st < len ? hi - st : len);
    }
    d->ckpt.guard(d->ckpt.guard_ctx, g < d->base.L->numel ? g : d->base.L->numel);
}
static void dp_set_state_guard(qt_engine *b, void (*wait)(void *ctx, size_t hi), void *ctx) {
    dp_engine *d = (dp_engine *)b;
    d->ckpt.guard = wait;
    d->ckpt.guard_ctx = ctx;
    for (int r = 0; r < d->n; r++)
        if (d->rk[r]->ops->set_state_guard) d->rk[r]->ops->set_state_guard(d->rk[r], wait ? rank_guard : NULL, &d->pool.arg[r]);
}

/* The ranks' snapshot buffers (the checkpoint reads the pieces there). */
static size_t dp_snapshot_bytes(const qt_engine *b) {
    const dp_engine *d = (const dp_engine *)b;
    size_t bytes = 0;
    for (int r = 0; r < d->n; r++)
        if (d->rk[r] && d->rk[r]->ops->snapshot_bytes) bytes += d->rk[r]->ops->snapshot_bytes(d->rk[r]);
    return bytes;
}

/* Each rank checks the weights its AdamW wrote (its pieces when sharded): the earliest step's first
 * NaN/Inf over the ranks. */
static long dp_nonfinite_weight(qt_engine *b, int settle, long *step) {
    dp_engine *d = (dp_engine *)b;
    d->call.settle = settle;
    run(d, job_nonfinite, -1);
    long bad = -1;
    *step = -1;
    for (int r = 0; r < d->n; r++)
        if (d->call.bad[r] >= 0 && (bad < 0 || d->call.bad_step[r] < *step || (d->call.bad_step[r] == *step && d->call.bad[r] < bad))) {
            bad = d->call.bad[r];
            *step = d->call.bad_step[r];
        }
    return bad;
}

static int dp_load_state(qt_engine *b, const qt_ckpt *ck, char *err, size_t errlen) {
    dp_engine *d = (dp_engine *)b;
    d->call.ck = ck;
    run(d, job_load, -1);
    for (int r = 0; r < d->n; r++)
        if (d->call.rc[r]) {
            snprintf(err, errlen, "%s", d->call.err[r]);
            return -1;
        }
    return 0;
}

static void dp_print_memory(qt_engine *b) {
    dp_engine *d = (dp_engine *)b;
    printf("qtrain: data parallel over %d ranks (comm %s, ZeRO-%d), each with the plan below\n", d->n,
           qt_comm_name(d->comm), d->plan.parallel.zero);
    run(d, job_memory, 0);
}

static void dp_profile(qt_engine *b, int on) {
    dp_engine *d = (dp_engine *)b;
    d->call.on = on;
    run(d, job_profile, 0);
}
static void dp_profile_print(qt_engine *b, int steps) {
    dp_engine *d = (dp_engine *)b;
    d->call.on = steps;
    run(d, job_profile_print, 0);
}

static void dp_free(qt_engine *b) {
    dp_engine *d = (dp_engine *)b;
    /* the communicators first (their work is done or aborted): no watchdog then takes another node's
     * leaving for a failure */
    qt_dp_nodes_free(d->nodes, d->pool.nfail > 0);
    d->nodes = NULL;
    run(d, job_free, -1);
    pthread_mutex_lock(&d->pool.mu);
    d->pool.quit = 1;
    d->pool.gen++;
    pthread_cond_broadcast(&d->pool.go);
    pthread_mutex_unlock(&d->pool.mu);
    for (int r = 0; r < d->n; r++) pthread_join(d->pool.th[r], NULL);
    qt_comm_free(d->comm);
    for (int k = 0; k < 4; k++) {
        free(d->ckpt.segs[k]);
        for (int r = 0; r < d->n; r++) free(d->ckpt.wide[r][k]);
    }
    pthread_mutex_destroy(&d->pool.mu);
    pthread_cond_destroy(&d->pool.go);
    pthread_cond_destroy(&d->pool.done);
    free(d);
}

static void dp_set_docs(qt_engine *b, const qt_docs *docs) {
    dp_engine *d = (dp_engine *)b;
    d->call.docs = docs;
    run(d, job_docs, -1);
    d->call.docs = NULL;
}

static void dp_row_logps(qt_engine *b, const int32_t *in, const int32_t *tgt, double *logp) {
    dp_engine *d = (dp_engine *)b;
    d->call.in = in, d->call.tgt = tgt, d->call.logp = logp;
    run(d, job_row_logps, -1);
}

static void dp_set_dpo_ref(qt_engine *b, const double *ref) {
    dp_engine *d = (dp_engine *)b;
    d->call.dref = ref;
    run(d, job_dpo_ref, -1);
    d->call.dref = NULL;
}

/* The ranks' pairs summed in rank order. */
static void dp_dpo_stats(qt_engine *b, int eval, qt_dpo_stats *s) {
    dp_engine *d = (dp_engine *)b;
    d->call.on = eval;
    run(d, job_dpo_stats, -1);
    *s = (qt_dpo_stats){0};
    for (int r = 0; r < d->n; r++) qt_dpo_stats_add(s, &d->call.dst[r]);
}

static const qt_engine_ops dp_ops = {
    .micro_step = dp_micro_step,
    .opt_step = dp_opt_step,
    .eval_loss = dp_eval_loss,
    .get_weights = dp_get_weights,
    .get_grads = dp_get_grads,
    .forward_logits = dp_forward_logits,
    .state_items = dp_state_items,
    .snapshot_bytes = dp_snapshot_bytes,
    .state_live = dp_state_live,
    .set_state_guard = dp_set_state_guard,
    .set_state_copy = dp_set_state_copy,
    .state_is_snapshot = 1,
    .nonfinite_weight = dp_nonfinite_weight,
    .load_state = dp_load_state,
    .tuning_save = qt_engine_gpu_tuning_save,
    .tuning_load = qt_engine_gpu_tuning_load,
    .print_memory = dp_print_memory,
    .profile = dp_profile,
    .profile_print = dp_profile_print,
    .free = dp_free,
    .set_docs = dp_set_docs,
    .dpo_stats = dp_dpo_stats,
    .row_logps = dp_row_logps,
    .set_dpo_ref = dp_set_dpo_ref,
};

qt_engine *qt_engine_dp_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                   const int *devices, char *err, size_t errlen) {
    return qt_engine_dp_nodes_create(L, plan, src, n, devices, NULL, err, errlen);
}

qt_engine *qt_engine_dp_nodes_create(const qt_layout *L, const qt_plan *plan, const qt_weight_src *src, int n,
                                     const int *devices, const qt_nodes *nodes, char *err, size_t errlen) {
    int nn = plan->parallel.nodes;
    if (nn > 1 && (!nodes || nodes->nodes != nn || nodes->node < 0 || nodes->node >= nn)) {
        snprintf(err, errlen, "%s: parallel.nodes: %d: a node's engine needs the nodes' meeting (the qtrain CLI under a "
                 "launcher: docs/multi-node.md)", plan->run.path, nn);
        return NULL;
    }
    if (n < 1 || n > QT_COMM_MAX_RANKS) {
        snprintf(err, errlen, "%s: parallel.gpus: %d ranks, expected 1..%d", plan->run.path, n, QT_COMM_MAX_RANKS);
        return NULL;
    }
    QT_CHECK(plan->parallel.dp != QT_DP_ONE && plan->parallel.n_ranks == n, "a data-parallel engine of %d ranks on a plan "
             "for %d", n, plan->parallel.n_ranks);
    dp_engine *d = calloc(1, sizeof *d);
    QT_CHECK(d, "out of host memory");
    d->ops = dp_ops;
    d->plan = *plan;
    d->base = (qt_engine){&d->ops, L, &d->plan, n * nn, NULL};
    d->n = n;
    d->plan.parallel.node = nn > 1 ? nodes->node : 0;
    d->first = d->plan.parallel.node * n;
    memcpy(d->dev, devices, (size_t)n * sizeof(int));
    d->split = plan->parallel.split;
    /* Sharded: a bucket per layer with overlap or not, so the norm's per-bucket sums (and so its bits)
     * are the same at every ZeRO level; ZeRO-2 needs them for its slots. */
    int pn = d->split.state ? n : 1, sn = plan->parallel.world_pieces ? nn : 1; /* across nodes with ZeRO: the world's shard */
    for (int r = 0; r < n; r++)
        qt_shard_init_nodes(&d->shard[r], L, pn, pn > 1 ? r : 0, plan->parallel.buckets, sn, sn > 1 ? d->plan.parallel.node : 0);
    const qt_test_hooks *th = qt_test_hooks_get();
    d->fail_rank = th->dp_fail_step > 0 ? th->dp_fail_rank : -1;
    d->fail_step = th->dp_fail_step;
    pthread_mutex_init(&d->pool.mu, NULL);
    pthread_cond_init(&d->pool.go, NULL);
    pthread_cond_init(&d->pool.done, NULL);
    /* auto: the link probe decides, printed once. Sums that overlap the backward pull with copy engines
     * and reduce locally: reductions that load from peers take SMs from the backward (slower there). */
    int overlap = plan->parallel.overlap && n > 1;
    qt_comm_opts opts = {.probe_log = stdout, .peer_rs = overlap ? QT_COMM_RS_COPY : QT_COMM_RS_AUTO};
    d->comm = qt_comm_create(n, devices, (qt_comm_kind)plan->parallel.comm, 0, &opts);
    qt_comm_kind kind = qt_comm_kind_of(d->comm);
    if ((kind == QT_COMM_HOST || kind == QT_COMM_HOST_WC) && plan->grads.reduce_dt == QT_DT_F32 &&
        plan->precision.acc_dt != QT_DT_BF16) /* bf16 gradients cross in bf16 */
        printf("qtrain: the gradients cross host memory as fp32; parallel.reduce_dtype: bf16 halves those bytes\n");
    QT_CUDA(cudaSetDevice(devices[0]));
    if (nn > 1 && !(d->nodes = qt_dp_nodes_create(nodes, n, devices, d->comm, 300.0, err, errlen))) {
        qt_comm_free(d->comm);
        pthread_mutex_destroy(&d->pool.mu);
        pthread_cond_destroy(&d->pool.go);
        pthread_cond_destroy(&d->pool.done);
        free(d);
        return NULL;
    }
    if (nn > 1) d->ops.nodes_count = dp_nodes_count;
    for (int r = 0; r < n; r++) {
        d->pool.arg[r].d = d;
        d->pool.arg[r].r = r;
        QT_CHECK(pthread_create(&d->pool.th[r], NULL, rank_loop, &d->pool.arg[r]) == 0, "cannot start the thread of rank %d", r);
    }
    d->call.src = src; /* read by every rank's thread at once: fills are pure */
    run(d, job_create, -1); /* in parallel: each rank allocates and initialises its own GPU */
    for (int r = 0; r < n; r++)
        if (!d->rk[r]) {
            snprintf(err, errlen, "rank %d (GPU %d): %s", d->first + r, d->dev[r], d->call.err[r]);
            dp_free(&d->base);
            return NULL;
        }
    char devs[64] = "";
    for (int r = 0, o = 0; r < n && o < (int)sizeof devs - 4; r++) o += snprintf(devs + o, sizeof devs - o, r ? ",%d" : "%d", d->dev[r]);
    char across[96] = "";
    if (nn > 1)
        snprintf(across, sizeof across, ", node %d of %d (NCCL between the nodes, %s)", d->plan.parallel.node, nn,
                 plan->parallel.world_pieces ? "ZeRO over every node's GPUs" : "the state replicated per node");
    snprintf(d->name, sizeof d->name, "%s x %d (data parallel on GPUs %s%s, comm %s%s%s%s)", d->rk[0]->ops->name, n, devs, across,
             qt_comm_name(d->comm), d->split.weights ? ", optimizer state, gradients and bf16 weights sharded (ZeRO-3)"
                                    : d->split.grads ? ", optimizer state and gradients sharded (ZeRO-2)"
                                    : d->split.state ? ", optimizer state sharded" : "",
             plan->grads.reduce_dt == QT_DT_BF16 ? ", gradients summed in bf16" : "",
             overlap ? ", sums overlapped with the backward" : "");
    d->ops.name = d->name;
    return &d->base;
}
