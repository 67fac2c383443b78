/* param_store.c — the parameters, their gradients and optimizer state on one rank (qt_param_store.h).
 * How each placement (bf16 master, offloaded optimizer state, offloaded weights and gradients, the ranks'
 * host shards) keeps the bits of the state on the GPU: docs/memory.md. */
#include "qt_param_store.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_pinned.h"
#include "qt_place.h"

#define STAGE_ELEMS ((size_t)1 << 20)      /* 4 MiB of fp32 staging */
#define NODES_STAGE_ELEMS ((size_t)1 << 24) /* across nodes with ZeRO: 64 MiB, the node exchange's chunks too */

static void carve_grad_slots(qt_param_store *ps, qt_mem_plan *p);
/* The rank holds ZeRO-3's pieces of the weights, not the whole array. */
static int zero3(const qt_param_store *ps) { return ps->weights_place->pieces; }
/* Bytes per gradient element in the slots and the host array (ZeRO-2/3: fp32, config.c refuses bf16). */
static size_t ges(const qt_param_store *ps) { return qt_dtype_size(ps->acc_dt); } /* a gradient slot's element */
/* The backward writes gradient slots (ZeRO-2/3, offloaded gradients), not the whole array. */
static int grad_slots(const qt_param_store *ps) { return ps->grads_place->slots; }
/* Bucket b's slot at element delta from its bucket start. */
static void *slot_at(const qt_param_store *ps, int b, ptrdiff_t delta) { return (char *)ps->grad_slot[b] + delta * (ptrdiff_t)ges(ps); }
/* The model reads the weights from weight slots: ZeRO-3 (gathered) or w_host (copied up from host). */
static int slots(const qt_param_store *ps) { return ps->weights_place->slots; }

qt_param_store *qt_param_store_create(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, char *err, size_t errlen) {
    QT_CHECK((pl->parallel.zero >= 1) == (sh->n_ranks > 1) && pl->parallel.zero <= 3, "parameter store: ZeRO-%d placement on a shard of %d ranks",
             pl->parallel.zero, sh->n_ranks);
    qt_param_store *ps = calloc(1, sizeof *ps);
    QT_CHECK(ps, "out of host memory");
    ps->L = L;
    ps->plan = *pl;
    ps->shard = *sh;
    ps->weights_place = qt_place_weights_of(pl, sh->n_ranks);
    ps->grads_place = qt_place_grads_of(pl, sh->n_ranks);
    ps->m_dt = pl->precision.m_dt;
    ps->v_dt = pl->precision.v_dt;
    ps->w_master_dt = pl->precision.master_dt;
    ps->acc_dt = pl->precision.acc_dt;
    ps->grad_dt = ps->grads_place->shard ? QT_DT_F32 : ps->acc_dt;
    size_t stage = pl->parallel.world_pieces ? NODES_STAGE_ELEMS : STAGE_ELEMS;
    ps->stage_n = sh->total < stage ? sh->total : stage;
    if (slots(ps)) ps->wslots = qt_wslots_create(L, sh);
    if (pl->weights.e4m3) {
        QT_CHECK(slots(ps), "parameter store: e4m3 weight codes without weight slots (ZeRO-3 or offloaded weights)");
        if (qt_small_params_init(&ps->e4m3.small, L, sh, err, errlen)) {
            qt_param_store_free(ps);
            return NULL;
        }
        qt_wslots_use_e4m3(ps->wslots);
    }
    if (grad_slots(ps)) QT_CHECK(ps->grad_slot = calloc((size_t)sh->n_buckets, sizeof *ps->grad_slot), "out of host memory");
    ps->opt_place = qt_place_opt_init(ps);
    return ps;
}

int qt_param_store_alloc_host(qt_param_store *ps, char *err, size_t errlen) {
    unsigned wc = ps->plan.memory.host_wc ? QT_PIN_WC : 0, mapped = QT_PIN_MAPPED;
    if (ps->weights_place->alloc_host(ps, mapped | wc, err, errlen) || ps->grads_place->alloc_host(ps, mapped | wc, err, errlen))
        return -1;
    return ps->opt_place->alloc_host(ps, mapped | wc, err, errlen);
}

void qt_param_store_carve(qt_param_store *ps, qt_mem_plan *p) {
    ps->weights_place->carve(ps, p);
    ps->grads_place->carve(ps, p);
    if (grad_slots(ps)) carve_grad_slots(ps, p);
    ps->opt_place->carve(ps, p);
    ps->sumsq = qt_mem_plan_carve(p, "scratch: gradients", (size_t)ps->shard.n_ranks * ps->shard.n_buckets * 8);
    ps->norm = qt_mem_plan_carve(p, "scratch: gradients", 4);
    ps->clip = qt_mem_plan_carve(p, "scratch: gradients", 4);
    if (ps->plan.grads.reduce_bf16) {
        size_t big = 0;
        for (int b = 0; b < ps->shard.n_buckets; b++)
            if (ps->shard.bucket[b + 1] - ps->shard.bucket[b] > big) big = ps->shard.bucket[b + 1] - ps->shard.bucket[b];
        ps->comm_buf = qt_mem_plan_carve(p, "gradient comm buffer (bf16)", big * 2);
    }
    ps->staging = qt_mem_plan_carve(p, "load staging (fp32)", ps->stage_n * 4);
    ps->grads_place->carve_stage(ps, p);
}

/* ZeRO-2, embed_apart: the buckets of embeddings only, which nothing writes (no slot). */
static int slotless(const qt_param_store *ps, int b) {
    return ps->plan.grads.embed_apart && ps->shard.bucket[b + 1] <= ps->L->layers[0].ln1;
}

/* The gradient slots: those of the buckets with embedding or LM-head elements and QT_GRAD_SLOTS shared slots of
 * the largest other bucket (see qt_param_store.h). */
static void carve_grad_slots(qt_param_store *ps, qt_mem_plan *p) {
    const qt_shard *sh = &ps->shard;
    size_t big = 0;
    for (int b = 0; b < sh->n_buckets; b++)
        if (qt_param_grad_slot_shared(ps, b) >= 0 && sh->bucket[b + 1] - sh->bucket[b] > big)
            big = sh->bucket[b + 1] - sh->bucket[b];
    char *shared[QT_GRAD_SLOTS];
    for (int k = 0; k < QT_GRAD_SLOTS; k++)
        shared[k] = big ? qt_mem_plan_carve(p, "gradient slots (layers)", big * ges(ps)) : NULL;
    for (int b = 0; b < sh->n_buckets; b++) {
        int k = qt_param_grad_slot_shared(ps, b);
        size_t len = sh->bucket[b + 1] - sh->bucket[b];
        ps->grad_slot[b] = slotless(ps, b) ? NULL : k >= 0 ? shared[k]
                         : qt_mem_plan_carve(p, "gradient slots (emb/head)", len * ges(ps));
    }
}

/* Bucket b's bytes in the slot and in the host array (elements [bucket[b], bucket[b + 1])). */
static size_t bucket_bytes(const qt_param_store *ps, int b) {
    return (ps->shard.bucket[b + 1] - ps->shard.bucket[b]) * ges(ps);
}

void qt_param_grad_load(const qt_param_store *ps, int b, cudaStream_t s) {
    QT_CUDA(cudaMemcpyAsync(ps->grad_slot[b], (char *)ps->grad + ps->shard.bucket[b] * ges(ps), bucket_bytes(ps, b),
                            cudaMemcpyHostToDevice, s));
}

void qt_param_grad_store(const qt_param_store *ps, int b, int zero, cudaStream_t s) {
    QT_CUDA(cudaMemcpyAsync((char *)ps->grad + ps->shard.bucket[b] * ges(ps), ps->grad_slot[b], bucket_bytes(ps, b),
                            cudaMemcpyDeviceToHost, s));
    if (zero) qt_param_grad_slot_zero(ps, b, s);
}

void qt_param_grad_slot_zero(const qt_param_store *ps, int b, cudaStream_t s) { qt_zero(ps->grad_slot[b], bucket_bytes(ps, b), s); }

int qt_param_grad_slot_shared(const qt_param_store *ps, int b) {
    const qt_layout *L = ps->L;
    size_t lo = ps->shard.bucket[b], hi = ps->shard.bucket[b + 1], vc = (size_t)L->cfg.vocab_size * L->cfg.hidden_size;
    int table = (lo < L->embed + vc && L->embed < hi) || (lo < L->lm_head + vc && L->lm_head < hi);
    return table ? -1 : b % QT_GRAD_SLOTS;
}

void *qt_param_grad_slot(const qt_param_store *ps, int b) { return ps->grad_slot[b]; }

void *qt_param_g(const qt_param_store *ps, size_t off) {
    if (!grad_slots(ps)) return (char *)ps->grad + off * qt_dtype_size(ps->grad_dt);
    const size_t *bk = ps->shard.bucket;
    int lo = 0, hi = ps->shard.n_buckets - 1; /* the last bucket with bk[b] <= off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (bk[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    QT_CHECK(ps->grad_slot[lo], "gradient of flat element %zu: its bucket %d has no slot (placement.embed_apart)", off, lo);
    return slot_at(ps, lo, (ptrdiff_t)(off - bk[lo]));
}

void *qt_param_grad_piece(const qt_param_store *ps, int b) {
    size_t off, len, st;
    qt_shard_piece(&ps->shard, b, &off, &len, &st);
    return (char *)ps->grad + (ps->grads_place->shard ? st : off) * qt_dtype_size(ps->grad_dt);
}

void qt_param_grad_piece_add(const qt_param_store *ps, int b, const void *src, qt_dtype dt, size_t len, cudaStream_t s) {
    float *piece = qt_param_grad_piece(ps, b);
    if (ps->host_grad.gshard) qt_host_shard_add(ps->host_grad.gshard, b, piece, src, dt, len, s);
    else qt_add_inplace(piece, QT_DT_F32, src, dt, len, s);
}

void qt_param_grad_piece_fresh(const qt_param_store *ps, int b, cudaStream_t s) {
    size_t off, len, st;
    if (!ps->host_grad.gshard) return;
    qt_shard_piece(&ps->shard, b, &off, &len, &st);
    qt_host_shard_fresh(ps->host_grad.gshard, b, qt_param_grad_piece(ps, b), len, s);
}

void qt_param_get_grads(const qt_param_store *ps, float *g) { ps->grads_place->get(ps, g); }

/* dst[0, n) (bf16, device) = RNE(host[0, n)), through the staging buffer. */
static void upload_run(qt_param_store *ps, const float *host, void *dst, size_t n, cudaStream_t s) {
    for (size_t i = 0; i < n; i += ps->stage_n) {
        size_t c = n - i < ps->stage_n ? n - i : ps->stage_n;
        QT_CUDA(cudaMemcpyAsync(ps->staging, host + i, c * 4, cudaMemcpyHostToDevice, s));
        qt_cast_f32_to_bf16((char *)dst + i * 2, ps->staging, c, s);
    }
}

/* bf16 weights [lo, lo + n) = RNE(host[0, n)) (elementwise: any cut gives the same bits); ZeRO-3 only
 * where they fall in this rank's pieces. */
static void upload_bf16_at(qt_param_store *ps, const float *host, size_t lo, size_t n, cudaStream_t s) {
    if (!zero3(ps)) {
        upload_run(ps, host, (char *)ps->w + lo * 2, n, s);
        return;
    }
    for (int k = 0; k < ps->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        size_t a = off > lo ? off : lo, e = off + len < lo + n ? off + len : lo + n;
        if (a < e) upload_run(ps, host + (a - lo), qt_param_w_mine(ps, a), e - a, s);
    }
}

void qt_param_upload_bf16(qt_param_store *ps, const float *host, size_t n, cudaStream_t s) {
    upload_bf16_at(ps, host, 0, n, s);
}

/* AdamW's per-tensor table, cut to this rank's pieces: decay on matrices (and embeddings when
 * configured); padding untouched. A rank may hold no parameter at all (tiny models on many ranks).
 * Groups: every bucket (opt_per_bucket), else bucket 0 and the rest (when both hold some), else one. */
static void make_optimizer(qt_param_store *ps) {
    const qt_plan_optimizer *o = &ps->plan.optimizer;
    const qt_layout *L = ps->L;
    const qt_shard *sp = &ps->shard;
    QT_CHECK(sp->n_buckets >= 1 && sp->n_buckets <= QT_SHARD_MAX_BUCKETS, "shard of %d buckets", sp->n_buckets);
    qt_adamw_tensor *t = calloc((size_t)(L->n_tensors + 1) * sp->n_buckets, sizeof *t);
    int *start = calloc((size_t)sp->n_buckets, sizeof *start), nt = 0;
    QT_CHECK(t && start, "out of host memory");
    for (int b = 0; b < sp->n_buckets; b++) {
        start[b] = nt;
        size_t lo, len, st;
        qt_shard_piece(sp, b, &lo, &len, &st);
        for (int i = 0; i < L->n_tensors; i++) {
            const qt_tensor *tt = &L->tensors[i];
            int decay = tt->is_matrix || (o->decay_embeddings && (tt->kind == QT_T_EMBED || tt->kind == QT_T_LM_HEAD));
            size_t a = tt->offset > lo ? tt->offset : lo;
            size_t e = tt->offset + tt->numel < lo + len ? tt->offset + tt->numel : lo + len;
            if (a < e) t[nt++] = (qt_adamw_tensor){a, e - a, decay ? o->weight_decay : 0.0f, st + (a - lo), tt->offset - tt->compact};
        }
    }
    int groups = ps->plan.optimizer.ahead ? sp->n_buckets : sp->n_buckets > 1 && start[1] > 0 && start[1] < nt ? 2 : 1;
    int host = ps->opt_place->streamed(ps);
    ps->opt = qt_gpu_optim_create(t, nt, start, groups, ps->master, ps->m, ps->m_dt, ps->v, ps->v_dt, ps->grad_dt,
                                  host ? ps->host_opt.opt_slots : NULL, ps->plan.optimizer.chunk, host);
    free(t);
    free(start);
}

int qt_param_store_init(qt_param_store *ps, const qt_weight_src *src, cudaStream_t s, char *err, size_t errlen) {
    const qt_shard *sp = &ps->shard;
    size_t n = ps->L->numel, chunk = qt_weight_src_chunk(ps->L);
    int rc = 0;
    ps->weights_place->init_zero(ps, s); /* the padding stays zero */
    ps->opt_place->init_zero(ps, s); /* the offloaded arrays: zeroed at allocation */
    float *buf = malloc((chunk ? chunk : 1) * sizeof *buf); /* the plan's "weight init buffer" row */
    if (!buf) return qt_errf(err, errlen, "out of host memory for the %.1f MiB weight init buffer", chunk * 4 / 1048576.0);
    /* the source's ranges this rank keeps: ZeRO-3 its pieces only (a range of the hashed init, or of a file,
     * holds the whole array's values there: 1 / ranks of the init's work), else the whole array */
    for (int r = 0; r < (zero3(ps) ? sp->n_buckets : 1) && !rc; r++) {
        size_t lo = 0, hi = n, st;
        if (zero3(ps)) {
            qt_shard_piece(sp, r, &lo, &hi, &st);
            hi = lo + qt_shard_params(lo, hi, n);
        }
        for (size_t i = lo; i < hi && !rc; i += chunk) { /* a chunk of the source at a time: bf16 and master pieces */
            size_t c = hi - i < chunk ? hi - i : chunk;
            QT_CUDA(cudaStreamSynchronize(s)); /* the last chunk's copies have read buf */
            if ((rc = qt_weight_src_fill(src, i, c, buf, err, errlen))) break;
            upload_bf16_at(ps, buf, i, c, s);
            for (int b = 0; b < sp->n_buckets; b++) {
                size_t off, len, np;
                qt_shard_piece(sp, b, &off, &len, &st);
                np = qt_shard_params(off, len, n);
                size_t a = off > i ? off : i, e = off + np < i + c ? off + np : i + c;
                if (ps->master && a < e)
                    QT_CUDA(cudaMemcpyAsync(ps->master + st + (a - off), buf + (a - i), (e - a) * 4, cudaMemcpyDefault, s));
            }
        }
    }
    QT_CUDA(cudaStreamSynchronize(s));
    free(buf);
    if (rc) return -1;
    ps->grads_place->init_zero(ps, s);
    for (int b = 0; grad_slots(ps) && b < sp->n_buckets; b++)
        if (ps->grad_slot[b]) qt_param_grad_slot_zero(ps, b, s);
    make_optimizer(ps);
    if (ps->host_grad.shard_stage) ps->host_grad.gshard = qt_host_shard_create(ps->shard.n_buckets, ps->host_grad.shard_stage, ps->host_grad.shard_stage_n);
    if (slots(ps)) qt_wslots_start(ps->wslots);
    return 0;
}

void qt_param_store_free(qt_param_store *ps) {
    if (!ps) return;
    qt_gpu_optim_free(ps->opt);
    qt_host_shard_free(ps->host_grad.gshard);
    qt_wslots_free(ps->wslots);
    qt_pinned_free(ps->host_opt.host_state);
    ps->weights_place->free_host(ps);
    ps->grads_place->free_host(ps);
    qt_small_params_free(&ps->e4m3.small);
    free(ps->grad_slot);
    free(ps);
}

/* ZeRO-3 and w_host: the hooks gather or copy into the weight slots (dp_sync.c); every other placement
 * keeps the whole weights on this GPU and the hooks only wait for their updates. */
void qt_param_acquire_weights(const qt_param_store *ps, const qt_param_hooks *h, size_t upto) {
    (void)ps;
    if (h && h->weights_needed) h->weights_needed(h->ctx, upto);
}

void qt_param_acquire_weights_back(const qt_param_store *ps, const qt_param_hooks *h, size_t from) {
    (void)ps;
    if (h && h->weights_back) h->weights_back(h->ctx, from);
}

void *qt_param_w(const qt_param_store *ps, size_t off) {
    return slots(ps) ? qt_wslots_addr(ps->wslots, off) : (char *)ps->w + off * 2;
}

void *qt_param_w_mine(const qt_param_store *ps, size_t off) {
    if (!zero3(ps)) return (char *)ps->w + off * 2;
    const qt_shard *sh = &ps->shard;
    int lo = 0, hi = sh->n_buckets - 1; /* the last bucket with bucket[b] <= off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (sh->bucket[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    size_t po, len, st;
    qt_shard_piece(sh, lo, &po, &len, &st);
    QT_CHECK(off >= po && off < po + len, "ZeRO-3: flat element %zu is not in rank %d's piece [%zu, %zu) of bucket %d", off,
             sh->rank, po, po + len, lo);
    return (char *)ps->w + (st + (off - po)) * 2;
}

void qt_param_release_grads(const qt_param_store *ps, const qt_param_hooks *h, size_t from) {
    (void)ps;
    if (h && h->grads_ready) h->grads_ready(h->ctx, from);
}

void qt_param_release_embed(const qt_param_store *ps, const qt_param_hooks *h) {
    (void)ps;
    if (h && h->embed_ready) h->embed_ready(h->ctx);
}

int qt_param_opt_groups(const qt_param_store *ps) { return qt_gpu_optim_groups(ps->opt); }

void qt_param_opt_buckets(const qt_param_store *ps, int i, int *k0, int *k1) {
    int groups = qt_gpu_optim_groups(ps->opt), nb = ps->shard.n_buckets;
    *k0 = i == 0 ? 0 : groups == nb ? i : 1;
    *k1 = i == groups - 1 ? nb : *k0 + 1;
}

/* A bf16 master always rounds stochastically: with RNE an update below half a bf16 ulp would be lost. */
void qt_param_opt_step(qt_param_store *ps, int i, const qt_adamw_args *a, cudaStream_t s) {
    qt_adamw_args b = *a;
    b.g_at_state = ps->grads_place->shard; /* the gradient shard, indexed like m and v */
    b.w_at_state = zero3(ps); /* ZeRO-3: the rank's bf16 pieces, too */
    b.stochastic |= ps->w_master_dt == QT_DT_BF16;
    qt_gpu_optim_step(ps->opt, i, ps->w, ps->grad, ps->grad_dt, ps->clip, &b, s);
}

void qt_param_zero_grads(qt_param_store *ps, int k0, int k1, cudaStream_t s) {
    ps->grads_place->clear(ps, k0, k1, s);
}

/* n fp32 values from the master (fp32) or the bf16 weights at flat index off (the exact value of each). */
static void master_values(const qt_param_store *ps, float *dst, size_t off, size_t st, size_t n) {
    if (ps->master) {
        QT_CUDA(cudaMemcpy(dst, ps->master + st, n * 4, cudaMemcpyDefault));
        return;
    }
    uint16_t *h = malloc(n * 2 + 1);
    QT_CHECK(h, "out of host memory (%zu bf16 weights)", n);
    QT_CUDA(cudaMemcpy(h, qt_param_w_mine(ps, off), n * 2, cudaMemcpyDefault)); /* w_host: in host memory */
    for (size_t i = 0; i < n; i++) dst[i] = qt_bf16_to_f32(h[i]);
    free(h);
}

void qt_param_get_master(const qt_param_store *ps, float *w) {
    for (int k = 0; k < ps->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        master_values(ps, w + off, off, st, qt_shard_params(off, len, ps->L->numel));
    }
}

void qt_param_get_master_pieces(const qt_param_store *ps, float *w) {
    memset(w, 0, ps->shard.len * 4); /* padding */
    for (int k = 0; k < ps->shard.n_buckets; k++) {
        size_t off, len, st;
        qt_shard_piece(&ps->shard, k, &off, &len, &st);
        master_values(ps, w + st, off, st, qt_shard_params(off, len, ps->L->numel));
    }
}

void *qt_param_item(const qt_param_store *ps, int i, qt_dtype *dt) {
    static const qt_dtype fixed[2] = {QT_DT_F32, QT_DT_BF16};
    *dt = i < 2 ? fixed[i] : i == 2 ? ps->m_dt : ps->v_dt;
    return i == 0 ? (void *)ps->master : i == 1 ? ps->w : i == 2 ? ps->m : ps->v;
}
