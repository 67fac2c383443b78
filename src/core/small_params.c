/* small_params.c — the bf16 part of a ZeRO-3 layer bucket under e4m3 gathers (qt_small_params.h). */
#include "qt_small_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

void qt_small_matrices(const qt_layout *L, int l, size_t lo[4], size_t hi[4]) {
    const qt_model_cfg *c = &L->cfg;
    const qt_layer_offsets *o = &L->layers[l];
    size_t C = (size_t)c->hidden_size, F = (size_t)c->intermediate_size, HD = (size_t)c->num_heads * c->head_dim;
    size_t QKV = HD + 2 * (size_t)c->num_kv_heads * c->head_dim;
    lo[0] = o->wqkv, hi[0] = o->wqkv + QKV * C;
    lo[1] = o->wo, hi[1] = o->wo + C * HD;
    lo[2] = o->wgu, hi[2] = o->wgu + 2 * F * C;
    lo[3] = o->wdown, hi[3] = o->wdown + C * F;
}

int qt_small_in_matrix(const qt_layout *L, int l, size_t x) {
    size_t lo[4], hi[4];
    qt_small_matrices(L, l, lo, hi);
    for (int k = 0; k < 4; k++)
        if (x >= lo[k] && x < hi[k]) return 1;
    return 0;
}

/* Appends [a, b) to the list (merging with the last range when adjacent). */
static void push(qt_flat_range **v, int *n, int *cap, size_t a, size_t b) {
    if (a >= b) return;
    if (*n && (*v)[*n - 1].off + (*v)[*n - 1].len == a) {
        (*v)[*n - 1].len += b - a;
        return;
    }
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        *v = realloc(*v, (size_t)*cap * sizeof **v);
        QT_CHECK(*v, "out of host memory");
    }
    (*v)[(*n)++] = (qt_flat_range){a, b - a};
}

int qt_small_params_init(qt_small_params *m, const qt_layout *L, const qt_shard *sh, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    int nb = sh->n_buckets, n = sh->n_ranks, nl = L->cfg.num_layers;
    size_t vc = (size_t)L->cfg.vocab_size * L->cfg.hidden_size;
    (void)err, (void)errlen;
    m->n_buckets = nb, m->n_ranks = n;
    m->layer_bucket = calloc((size_t)nb, sizeof *m->layer_bucket);
    m->packed = calloc((size_t)nb, sizeof *m->packed);
    m->n_seg = calloc((size_t)nb * n, sizeof *m->n_seg);
    m->seg = calloc((size_t)nb * n, sizeof *m->seg);
    QT_CHECK(m->layer_bucket && m->packed && m->n_seg && m->seg, "out of host memory");
    for (int b = 0; b < nb; b++) {
        size_t lo = sh->bucket[b], hi = sh->bucket[b + 1];
        int table = (lo < L->embed + vc && L->embed < hi) || (lo < L->lm_head + vc && L->lm_head < hi);
        int fnorm = lo < L->final_norm + L->cfg.hidden_size && L->final_norm < hi;
        int layers = 0, whole = 1; /* the layers it touches; their matrices all inside it */
        for (int l = 0; l < nl; l++) {
            if (qt_layer_end(L, l) <= lo || L->layers[l].ln1 >= hi) continue;
            size_t a[4], z[4];
            qt_small_matrices(L, l, a, z);
            layers++;
            for (int k = 0; k < 4; k++) whole &= !(z[k] > lo && a[k] < hi) || (a[k] >= lo && z[k] <= hi);
        }
        if (table || fnorm || !layers || !whole) continue; /* their slots stay bf16 */
        m->layer_bucket[b] = 1;
        /* the bucket's ranges outside every matrix of the layers it touches */
        qt_flat_range *sm = NULL;
        int ns = 0, cap = 0;
        size_t at = lo;
        for (int l = 0; l < nl; l++) {
            if (qt_layer_end(L, l) <= lo || L->layers[l].ln1 >= hi) continue;
            size_t a[4], z[4];
            qt_small_matrices(L, l, a, z);
            for (int k = 0; k < 4; k++) {
                size_t s0 = a[k] > lo ? a[k] : lo, s1 = z[k] < hi ? z[k] : hi;
                if (s0 >= s1) continue;
                push(&sm, &ns, &cap, at, s0);
                at = s1;
            }
        }
        push(&sm, &ns, &cap, at, hi);
        for (int r = 0; r < n; r++) { /* rank r's piece: the r-th of n equal parts */
            size_t pl = (hi - lo) / n, p0 = lo + r * pl, p1 = p0 + pl, tot = 0;
            qt_flat_range **v = &m->seg[b * n + r];
            int *cnt = &m->n_seg[b * n + r], c2 = 0;
            for (int i = 0; i < ns; i++) {
                size_t s0 = sm[i].off > p0 ? sm[i].off : p0, s1 = sm[i].off + sm[i].len < p1 ? sm[i].off + sm[i].len : p1;
                if (s0 < s1) push(v, cnt, &c2, s0, s1), tot += s1 - s0;
            }
            if (tot > m->packed[b]) m->packed[b] = tot;
        }
        if (m->packed[b] % 2) m->packed[b]++; /* even: some transports move 4-byte words */
        if (m->packed[b] > m->max_packed) m->max_packed = m->packed[b];
        free(sm);
    }
    return 0;
}

void qt_small_params_free(qt_small_params *m) {
    if (!m || !m->seg) return;
    for (int i = 0; i < m->n_buckets * m->n_ranks; i++) free(m->seg[i]);
    free(m->seg);
    free(m->n_seg);
    free(m->packed);
    free(m->layer_bucket);
    memset(m, 0, sizeof *m);
}
