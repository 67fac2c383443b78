/* place_grads.c — which gradients placement a plan takes, and the host reads they share (qt_place.h). */
#include "qt_place.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

const qt_grads_place *qt_place_grads_of(const qt_plan *pl, int n_ranks) {
    QT_CHECK(!pl->grads.host || n_ranks == 1 || pl->parallel.zero >= 2, "parameter store: offloaded gradients on a ZeRO-%d "
             "shard of %d ranks (expected ZeRO-2 or 3: the rank's gradient shard)", pl->parallel.zero, n_ranks);
    if (pl->grads.host) return pl->parallel.zero >= 2 ? &qt_place_grads_host_shard : &qt_place_grads_host;
    if (pl->parallel.zero >= 2) return pl->parallel.zero == 2 ? &qt_place_grads_zero2 : &qt_place_grads_zero3;
    return &qt_place_grads_whole;
}

void qt_place_grads_get_pieces(const qt_param_store *ps, float *g) {
    size_t n = ps->L->numel;
    for (int k = 0; k < ps->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        size_t np = qt_shard_params(off, len, n);
        if (ps->host_grad.gshard && qt_host_shard_cleared(ps->host_grad.gshard, k)) memset(g + off, 0, np * 4); /* what the piece reads as */
        else QT_CUDA(cudaMemcpy(g + off, (float *)ps->grad + st, np * 4, cudaMemcpyDefault));
    }
}

void qt_place_grads_get_whole(const qt_param_store *ps, float *g) {
    size_t n = ps->L->numel;
    if (ps->grad_dt == QT_DT_F32) {
        QT_CUDA(cudaMemcpy(g, ps->grad, n * 4, cudaMemcpyDefault));
        return;
    }
    uint16_t *h = malloc(n * 2 + 1); /* bf16 gradients: their exact fp32 values */
    QT_CHECK(h, "out of host memory (%zu bf16 gradients)", n);
    QT_CUDA(cudaMemcpy(h, ps->grad, n * 2, cudaMemcpyDefault));
    for (size_t i = 0; i < n; i++) g[i] = qt_bf16_to_f32(h[i]);
    free(h);
}
