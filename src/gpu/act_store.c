/* act_store.c — per-layer saved activations and the backward's scratch (see qt_act_store.h). */
#include "qt_act_store.h"

#include <stdio.h>
#include <stdlib.h>

#include "qt_config.h"
#include "qt_error.h"

int qt_act_recompute_resolve(int parts) {
    if (parts & QT_RC_BLOCK) parts |= QT_RC_ATT | QT_RC_FFN | QT_RC_NORM;
    if (parts & QT_RC_ATT) parts |= QT_RC_QKV;
    if (parts & QT_RC_FFN) parts |= QT_RC_SWIGLU;
    return parts;
}

const char *qt_act_recompute_names(int parts, char *buf, size_t cap) {
    static const char *const name[] = {"swiglu", "norm", "qkv", "att", "ffn", "block"};
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 6; i++)
        if (parts & (1 << i) && n < cap) n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name[i]);
    if (!parts) snprintf(buf, cap, "none");
    return buf;
}

qt_act_store *qt_act_store_create(const qt_model_cfg *c, long N, qt_act_policy policy, char *err, size_t errlen) {
    if (policy.offload_residual) {
        snprintf(err, errlen, "memory.offload_residual is not implemented yet");
        return NULL;
    }
    policy.recompute = qt_act_recompute_resolve(policy.recompute);
    qt_act_store *as = calloc(1, sizeof *as);
    QT_CHECK(as, "out of host memory");
    *as = (qt_act_store){.c = c, .N = N, .policy = policy, .layers = calloc((size_t)c->num_layers, sizeof *as->layers)};
    QT_CHECK(as->layers, "out of host memory");
    return as;
}

void qt_act_store_free(qt_act_store *as) {
    if (!as) return;
    free(as->layers);
    free(as);
}

/* Layer l's buffer of a tensor: its own, or (part recomputed) layer 0's for every layer. */
static void *take(qt_mem_plan *p, const qt_act_store *as, int l, int part, void *layer0, const char *kind,
                  size_t bytes) {
    if (l > 0 && (as->policy.recompute & part)) return layer0;
    return qt_mem_plan_carve(p, kind, bytes);
}

void qt_act_store_carve(qt_act_store *as, qt_mem_plan *p) {
    const qt_model_cfg *c = as->c;
    size_t N = (size_t)as->N, C = c->hidden_size, F = c->intermediate_size;
    size_t HD = (size_t)c->num_heads * c->head_dim, QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    const qt_gpu_layer *a0 = &as->layers[0];
    for (int l = 0; l < c->num_layers; l++) {
        qt_gpu_layer *a = &as->layers[l];
        a->res = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
        a->ln1 = take(p, as, l, QT_RC_NORM, a0->ln1, "activations: norms", N * C * 2);
        a->rstd1 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->qkv = take(p, as, l, QT_RC_QKV, a0->qkv, "activations: qkv", N * QKV * 2);
        a->att = take(p, as, l, QT_RC_ATT, a0->att, "activations: attention", N * HD * 2);
        a->lse = take(p, as, l, QT_RC_ATT, a0->lse, "activations: attention", N * c->num_heads * 4);
        a->res_mid = take(p, as, l, QT_RC_BLOCK, a0->res_mid, "activations: residual", N * C * 2);
        a->ln2 = take(p, as, l, QT_RC_NORM, a0->ln2, "activations: norms", N * C * 2);
        a->rstd2 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->gu = take(p, as, l, QT_RC_FFN, a0->gu, "activations: gate|up", N * 2 * F * 2);
        a->h = take(p, as, l, QT_RC_SWIGLU, a0->h, "activations: swiglu", N * F * 2);
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

qt_gpu_layer *qt_act_forward(qt_act_store *as, int l) { return &as->layers[l]; }
qt_gpu_layer *qt_act_backward(qt_act_store *as, int l) { return &as->layers[l]; }
void qt_act_release(qt_act_store *as, int l) {
    (void)as; /* saved: the buffers stay for the next micro-step's forward */
    (void)l;
}
