/* act_store.c — per-layer saved activations and the backward's scratch (see qt_act_store.h). */
#include "qt_act_store.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "qt_error.h"
#include "qt_pinned.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_test_hooks.h"

/* memory.offload_residual's state once started. One copy is in flight at a time (pending): the forward
 * joins each copy out before starting the next, the backward each fetch before the next layer. */
struct qt_res_offload {
    char *host;              /* [L-2][N,C] bf16, pinned (owned) */
    cudaStream_t s, copy;    /* compute (borrowed), copies (owned) */
    cudaEvent_t ready, done; /* compute -> copy: the slot may be read/written; copy -> compute: copied */
    int pending;             /* the layer whose residual is being copied (either way); -1: none */
    long delay_ms;           /* test hook offload_residual_delay_ms, read at start */
};

qt_act_store *qt_act_store_create(const qt_model_cfg *c, long N, qt_act_policy policy, char *err, size_t errlen) {
    (void)err, (void)errlen;
    qt_act_store *as = calloc(1, sizeof *as);
    QT_CHECK(as, "out of host memory");
    *as = (qt_act_store){.c = c, .N = N, .policy = policy, .layers = calloc((size_t)c->num_layers, sizeof *as->layers)};
    QT_CHECK(as->layers, "out of host memory");
    if (policy.offload_residual && c->num_layers > 2)
        as->host_bytes = (size_t)(c->num_layers - 2) * qt_mem_aligned((size_t)N * c->hidden_size * 2);
    return as;
}

int qt_act_store_start(qt_act_store *as, cudaStream_t s, const char *cfg_path, char *err, size_t errlen) {
    if (!as->policy.offload_residual) return 0;
    struct qt_res_offload *o = calloc(1, sizeof *o);
    QT_CHECK(o, "out of host memory");
    if (as->host_bytes && qt_pinned_alloc((void **)&o->host, as->host_bytes, as->policy.host_wc ? QT_PIN_WC : 0)) {
        snprintf(err, errlen, "%s: memory.offload_residual: %.2f GiB of pinned host memory for %d layers' residuals "
                 "could not be allocated", cfg_path, as->host_bytes / 1073741824.0, as->c->num_layers - 2);
        free(o);
        return -1;
    }
    o->s = s;
    o->pending = -1;
    o->delay_ms = qt_test_hooks_get()->offload_residual_delay_ms;
    QT_CUDA(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking));
    QT_CUDA(cudaEventCreateWithFlags(&o->ready, cudaEventDisableTiming));
    QT_CUDA(cudaEventCreateWithFlags(&o->done, cudaEventDisableTiming));
    as->off = o;
    return 0;
}

void qt_act_store_free(qt_act_store *as) {
    if (!as) return;
    if (as->off) {
        struct qt_res_offload *o = as->off;
        QT_CUDA(cudaStreamSynchronize(o->copy));
        QT_CUDA(cudaEventDestroy(o->ready));
        QT_CUDA(cudaEventDestroy(o->done));
        QT_CUDA(cudaStreamDestroy(o->copy));
        qt_pinned_free(o->host);
        free(o);
    }
    free(as->layers);
    free(as);
}

/* Layer l's buffer of a tensor: its own, or (shared: recomputed, or read by no backward) layer 0's. */
static void *take(qt_mem_plan *p, int l, int shared, void *layer0, const char *kind, size_t bytes) {
    if (l > 0 && shared) return layer0;
    return qt_mem_plan_carve(p, kind, bytes);
}

void qt_act_store_carve(qt_act_store *as, qt_mem_plan *p) {
    const qt_model_cfg *c = as->c;
    size_t N = (size_t)as->N, C = c->hidden_size, F = c->intermediate_size;
    size_t HD = (size_t)c->num_heads * c->head_dim, QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    const qt_gpu_layer *a0 = &as->layers[0];
    const qt_act_redo *r = &as->policy.redo;
    int f8 = as->policy.fp8_bwd;
    /* ln1, ln2, h: recomputed, or (fp8 backward) read by no backward (a recomputed qkv / gate|up rebuilds
     * its norm input first: block_run) */
    int sh_ln = r->norm || f8, sh_h = r->swiglu || f8;
    void *slot[2] = {NULL, NULL};
    if (as->policy.offload_residual) {
        for (int i = 0; i < 2 && i < c->num_layers; i++) slot[i] = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
        if (as->host_bytes) qt_mem_plan_host(p, "offloaded residuals", as->host_bytes);
    }
    for (int l = 0; l < c->num_layers; l++) {
        qt_gpu_layer *a = &as->layers[l];
        a->res = as->policy.offload_residual ? slot[l % 2] : qt_mem_plan_carve(p, "activations: residual", N * C * 2);
        a->ln1 = take(p, l, sh_ln, a0->ln1, "activations: norms", N * C * 2);
        a->rstd1 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->qkv = take(p, l, r->qkv, a0->qkv, "activations: qkv", N * QKV * 2);
        a->att = take(p, l, r->att, a0->att, "activations: attention", N * HD * 2);
        a->lse = take(p, l, r->att, a0->lse, "activations: attention", N * c->num_heads * 4);
        a->res_mid = take(p, l, r->block, a0->res_mid, "activations: residual", N * C * 2);
        a->ln2 = take(p, l, sh_ln, a0->ln2, "activations: norms", N * C * 2);
        a->rstd2 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->gu = take(p, l, r->ffn, a0->gu, "activations: gate|up", N * 2 * F * 2);
        a->h = take(p, l, sh_h, a0->h, "activations: swiglu", N * F * 2);
        if (c->qk_norm) {
            size_t NH = (size_t)c->num_heads + c->num_kv_heads;
            a->qk = take(p, l, r->qkv, a0->qk, "activations: qkv", N * NH * c->head_dim * 2);
            a->qk_rstd = take(p, l, r->qkv, a0->qk_rstd, "activations: qkv", N * NH * 4);
        }
        if (qt_model_is_gemma(c)) { /* the branch outputs before their post-norms, and those norms' rstd */
            a->po = take(p, l, r->block, a0->po, "activations: residual", N * C * 2);
            a->pm = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
            a->rstd_pa = qt_mem_plan_carve(p, "activations: norms", N * 4);
            a->rstd_pf = qt_mem_plan_carve(p, "activations: norms", N * 4);
        }
    }
    as->res_final = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
    as->lnf = qt_mem_plan_carve(p, "activations: norms", N * C * 2);
    as->rstdf = qt_mem_plan_carve(p, "activations: norms", N * 4);
    as->dres = qt_mem_plan_carve(p, "scratch: gradients", N * C * 4);
    as->dres_bf = qt_mem_plan_carve(p, "scratch: gradients", N * C * 2);
    as->dln = qt_mem_plan_carve(p, "scratch: gradients", N * C * 2);
    as->dlnf = qt_mem_plan_carve(p, "scratch: gradients", N * C * 2);
    as->datt = qt_mem_plan_carve(p, "scratch: gradients", N * HD * 2);
    as->dqkv = qt_mem_plan_carve(p, "scratch: gradients", N * QKV * 2);
}

/* ---- residual offload: the copies and their order (see qt_act_store.h) ---- */

static int offloaded(const qt_act_store *as, int l) { return as->off && l >= 0 && l < as->c->num_layers - 2; }

static void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

/* Copies layer l's residual between its slot and the host (to_host) on the copy stream, after the
 * compute stream's work so far. */
static void copy_start(qt_act_store *as, int l, int to_host) {
    struct qt_res_offload *o = as->off;
    QT_CHECK(o->pending < 0, "residual offload: layer %d's copy started while layer %d's is in flight", l, o->pending);
    size_t n = (size_t)as->N * as->c->hidden_size * 2;
    char *h = o->host + (size_t)l * qt_mem_aligned(n);
    void *d = as->layers[l].res;
    QT_CUDA(cudaEventRecord(o->ready, o->s));
    QT_CUDA(cudaStreamWaitEvent(o->copy, o->ready, 0));
    if (o->delay_ms) QT_CUDA(cudaLaunchHostFunc(o->copy, sleep_ms, &o->delay_ms)); /* test hook: a late copy */
    QT_CUDA(cudaMemcpyAsync(to_host ? (void *)h : d, to_host ? d : (void *)h, n,
                            to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, o->copy));
    QT_CUDA(cudaEventRecord(o->done, o->copy));
    o->pending = l;
}

/* The compute stream waits for layer l's copy, if it is the one in flight (no_wait: a planted bug's, it
 * does not: qt_mutant.h). */
static void copy_join(qt_act_store *as, int l, int no_wait) {
    struct qt_res_offload *o = as->off;
    if (!o || o->pending != l || l < 0) return;
    if (!no_wait) QT_CUDA(cudaStreamWaitEvent(o->s, o->done, 0));
    o->pending = -1;
}

qt_gpu_layer *qt_act_forward(qt_act_store *as, int l) {
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_RESIDUAL_REUSE_NO_WAIT);
#endif
    copy_join(as, l - 1, no_wait); /* this layer's down projection writes the slot of layer l - 1 */
    return &as->layers[l];
}

void qt_act_residual_final(qt_act_store *as, int l) {
    if (offloaded(as, l)) copy_start(as, l, 1);
}

qt_gpu_layer *qt_act_backward(qt_act_store *as, int l) {
    if (offloaded(as, l - 1) && as->off->pending != l - 1) copy_start(as, l - 1, 0); /* into the slot of layer l + 1 */
    return &as->layers[l];
}

void qt_act_release(qt_act_store *as, int l) {
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_RESIDUAL_READ_NO_WAIT);
#endif
    copy_join(as, l - 1, no_wait); /* layer l - 1's backward reads it next */
}
