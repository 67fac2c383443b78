/* act_store.c — per-layer saved activations and the backward's scratch (see qt_act_store.h). */
#include "qt_act_store.h"

#include <stdio.h>
#include <stdlib.h>

#include "qt_error.h"

qt_act_store *qt_act_store_create(const qt_model_cfg *c, long N, qt_act_policy policy, char *err, size_t errlen) {
    if (policy != QT_ACT_SAVE) {
        snprintf(err, errlen, "activation policy %s is not implemented yet (only save)",
                 policy == QT_ACT_RECOMPUTE ? "recompute" : "offload");
        return NULL;
    }
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

void qt_act_store_carve(qt_act_store *as, qt_mem_plan *p) {
    const qt_model_cfg *c = as->c;
    size_t N = (size_t)as->N, C = c->hidden_size, F = c->intermediate_size;
    size_t HD = (size_t)c->num_heads * c->head_dim, QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    for (int l = 0; l < c->num_layers; l++) {
        qt_gpu_layer *a = &as->layers[l];
        a->res = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
        a->ln1 = qt_mem_plan_carve(p, "activations: norms", N * C * 2);
        a->rstd1 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->qkv = qt_mem_plan_carve(p, "activations: qkv", N * QKV * 2);
        a->att = qt_mem_plan_carve(p, "activations: attention", N * HD * 2);
        a->lse = qt_mem_plan_carve(p, "activations: attention", N * c->num_heads * 4);
        a->res_mid = qt_mem_plan_carve(p, "activations: residual", N * C * 2);
        a->ln2 = qt_mem_plan_carve(p, "activations: norms", N * C * 2);
        a->rstd2 = qt_mem_plan_carve(p, "activations: norms", N * 4);
        a->gu = qt_mem_plan_carve(p, "activations: gate|up", N * 2 * F * 2);
        a->h = qt_mem_plan_carve(p, "activations: swiglu", N * F * 2);
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
