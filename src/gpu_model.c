/* gpu_model.c — the model on one GPU: memory plan, forward (with the chunked LM-head loss and its
 * backward folded in) and backward, in bf16 with fp32 accumulation and fp32 gradients.
 *
 * The residual stream needs no copies: the fused RMSNorm adds the branch input into the buffer that
 * holds the branch output (o_proj / down output), which then *is* the next residual and stays saved
 * for the backward. dres, the residual-stream gradient, is fp32 and accumulates across the blocks.
 * With precision.matmul_dtype: e4m3 the blocks' four matmuls go through src/gpu_fp8.c (lin_fwd/lin_bwd);
 * its buffers are the plan's "fp8 weights (persistent)" and "fp8 activations" rows. The kernels that
 * produce a matmul's input or output gradient (RMSNorm, SwiGLU, RoPE bwd) also fold its abs-max into
 * the fp8 scale record (fp8_amax), which saves the quantizer a pass over the tensor. */
#include "qt_gpu_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

#define ALIGN_BYTES 256
static size_t aligned(size_t bytes) { return (bytes + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES; }

static size_t plan_add(qt_gpu_model *g, const char *kind, size_t bytes) {
    bytes = aligned(bytes);
    for (int i = 0; i < g->n_plan; i++)
        if (!strcmp(g->plan[i].kind, kind)) {
            g->plan[i].bytes += bytes;
            return bytes;
        }
    QT_CHECK(g->n_plan < 24, "memory plan has too many kinds");
    g->plan[g->n_plan].kind = kind;
    g->plan[g->n_plan++].bytes = bytes;
    return bytes;
}

/* Two passes over the same carve list: the first (arena NULL) only sizes the plan. */
static void *carve(qt_gpu_model *g, size_t *off, const char *kind, size_t bytes) {
    size_t b = plan_add(g, kind, bytes);
    void *p = g->arena ? g->arena + *off : NULL;
    *off += b;
    return p;
}

size_t qt_gpu_model_lookups(const qt_gpu_model *g, void *base, int32_t **tok, float **dres, void **ws) {
    size_t n = (size_t)g->shard.n_ranks * g->N, a = aligned(n * 4), d = aligned(n * g->L->cfg.hidden_size * 4);
    if (base) {
        *tok = base;
        *dres = (float *)((char *)base + a);
        *ws = (char *)base + a + d;
    }
    return a + d + qt_embedding_bwd_ws_bytes(g->N, g->L->cfg.vocab_size);
}

static size_t carve_all(qt_gpu_model *g) {
    const qt_model_cfg *c = &g->L->cfg;
    long N = g->N;
    size_t n = g->shard.total, ns = g->shard.len, C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    size_t HD = (size_t)c->num_heads * c->head_dim, QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    size_t off = 0, chunk = (N + g->lm_chunks - 1) / g->lm_chunks;
    g->n_plan = 0;
    g->w = carve(g, &off, "weights (bf16)", n * 2);
    g->grad = carve(g, &off, "gradients (fp32)", n * 4);
    if (g->host_state_bytes) { /* master, m and v in host memory (host_state) */
        g->opt_slots = carve(g, &off, "optimizer slots (offload)", qt_gpu_optim_slot_bytes(g->opt_chunk, g->m_dt, g->v_dt));
    } else {
        g->master = carve(g, &off, "master weights (fp32)", ns * 4);
        g->m = carve(g, &off, g->m_dt == QT_DT_BF16 ? "adam m (bf16)" : "adam m (fp32)", ns * qt_dtype_size(g->m_dt));
        g->v = carve(g, &off, g->v_dt == QT_DT_BF16 ? "adam v (bf16)" : "adam v (fp32)", ns * qt_dtype_size(g->v_dt));
    }
    g->sumsq = carve(g, &off, "scratch: gradients", (size_t)g->shard.n_ranks * g->shard.n_buckets * 8);
    for (int l = 0; l < c->num_layers; l++) {
        qt_gpu_layer *a = &g->layers[l];
        a->res = carve(g, &off, "activations: residual", N * C * 2);
        a->ln1 = carve(g, &off, "activations: norms", N * C * 2);
        a->rstd1 = carve(g, &off, "activations: norms", N * 4);
        a->qkv = carve(g, &off, "activations: qkv", N * QKV * 2);
        a->att = carve(g, &off, "activations: attention", N * HD * 2);
        a->lse = carve(g, &off, "activations: attention", (size_t)N * c->num_heads * 4);
        a->res_mid = carve(g, &off, "activations: residual", N * C * 2);
        a->ln2 = carve(g, &off, "activations: norms", N * C * 2);
        a->rstd2 = carve(g, &off, "activations: norms", N * 4);
        a->gu = carve(g, &off, "activations: gate|up", N * 2 * F * 2);
        a->h = carve(g, &off, "activations: swiglu", N * F * 2);
    }
    g->res_final = carve(g, &off, "activations: residual", N * C * 2);
    g->lnf = carve(g, &off, "activations: norms", N * C * 2);
    g->rstdf = carve(g, &off, "activations: norms", N * 4);
    /* Every rank's lookups instead of the table's gradient, where they are the fewer bytes (n N (C+1) <
     * V C: 2 ranks of 16 x 1024 tokens at V = 151936, not 8 ranks of 32 x 1024). */
    size_t nr = (size_t)g->shard.n_ranks;
    size_t lk = nr > 1 && nr * N * (C + 1) < V * C ? qt_gpu_model_lookups(g, NULL, NULL, NULL, NULL) : 0;
    g->logits = carve(g, &off, "lm-head logits chunk", chunk * V * 2 > lk ? chunk * V * 2 : lk);
    g->lookups = lk ? g->logits : NULL; /* dead from the LM head's end to the next micro-step's */
    g->losses = carve(g, &off, "lm-head logits chunk", N * 4);
    g->loss_sum = carve(g, &off, "scratch: gradients", 8);
    g->norm = carve(g, &off, "scratch: gradients", 4);
    g->clip = carve(g, &off, "scratch: gradients", 4);
    g->dres = carve(g, &off, "scratch: gradients", N * C * 4);
    g->dres_bf = carve(g, &off, "scratch: gradients", N * C * 2);
    g->dln = carve(g, &off, "scratch: gradients", N * C * 2);
    g->dlnf = carve(g, &off, "scratch: gradients", N * C * 2);
    g->datt = carve(g, &off, "scratch: gradients", N * HD * 2);
    g->dqkv = carve(g, &off, "scratch: gradients", N * QKV * 2);
    g->tok = carve(g, &off, "tokens, rope table", N * 4);
    g->tgt = carve(g, &off, "tokens, rope table", N * 4);
    g->rope_cs = carve(g, &off, "tokens, rope table", (size_t)g->T * c->head_dim * 4);
    size_t ws = qt_embedding_bwd_ws_bytes(N, (int)V);
    size_t cr = qt_colreduce_ws_bytes((int)(QKV > C ? QKV : C));
    if (cr > ws) ws = cr;
    if (qt_grad_norm_ws_bytes() > ws) ws = qt_grad_norm_ws_bytes();
    g->ws_bytes = ws;
    g->ws = carve(g, &off, "kernel workspace", ws);
    if (g->cfg->matmul_dtype == QT_DT_E4M3) {
        g->fp8_w = carve(g, &off, "fp8 weights (persistent)", qt_fp8_weight_bytes(c));
        g->fp8_a = carve(g, &off, "fp8 activations", qt_fp8_act_bytes(c, N, (qt_dtype)g->cfg->grad_dtype));
    }
    return off;
}

static void *Wp(const qt_gpu_model *g, size_t off) { return (char *)g->w + off * 2; }
static float *Gp(const qt_gpu_model *g, size_t off) { return g->grad + off; }

qt_gpu_model *qt_gpu_model_create(const qt_layout *L, const qt_config *cfg, const float *w0,
                                  const qt_shard *sh, char *err, size_t errlen) {
    qt_gpu_model *g = calloc(1, sizeof *g);
    QT_CHECK(g, "out of host memory");
    if (sh) g->shard = *sh;
    else qt_shard_init(&g->shard, L, 1, 0, cfg->offload_optimizer); /* offloaded: AdamW bucket by bucket */
    g->L = L;
    g->cfg = cfg;
    g->B = cfg->micro_batch;
    g->T = cfg->seq_len;
    g->N = (long)g->B * g->T;
    g->m_dt = cfg->opt_m_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32;
    g->v_dt = cfg->opt_v_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32;
    g->lm_chunks = cfg->lmhead_chunks > 0 ? cfg->lmhead_chunks : 1;
    if (g->lm_chunks > g->N) g->lm_chunks = (int)g->N;
    g->layers = calloc(L->cfg.num_layers, sizeof *g->layers);
    size_t ns = g->shard.len;
    if (cfg->offload_optimizer) {
        const char *oc = getenv("QT_OFFLOAD_CHUNK"); /* tests: many chunks in a small model */
        g->opt_chunk = oc && atol(oc) > 0 ? (size_t)atol(oc) : QT_GPU_OPTIM_CHUNK;
        size_t st_b[3] = {aligned(ns * 4), aligned(ns * qt_dtype_size(g->m_dt)), aligned(ns * qt_dtype_size(g->v_dt))};
        g->host_state_bytes = st_b[0] + st_b[1] + st_b[2];
        if (cudaHostAlloc((void **)&g->host_state, g->host_state_bytes, cudaHostAllocDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(err, errlen, "%s: memory.offload_optimizer: %.2f GiB of pinned host memory for the optimizer state "
                     "could not be allocated", cfg->path, g->host_state_bytes / 1073741824.0);
            free(g->layers);
            free(g);
            return NULL;
        }
        memset(g->host_state, 0, g->host_state_bytes); /* m, v start at zero; padding stays defined */
        g->master = (float *)g->host_state;
        g->m = g->host_state + st_b[0];
        g->v = g->host_state + st_b[0] + st_b[1];
    }
    g->arena_bytes = carve_all(g);
    size_t free_b, total_b;
    QT_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (cudaMalloc((void **)&g->arena, g->arena_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen,
                 "%s: the GPU memory plan needs %.2f GiB but %.2f GiB are free: lower data.micro_batch (%d), "
                 "raise memory.lmhead_chunks (%d) or set memory.offload_optimizer",
                 cfg->path, g->arena_bytes / 1073741824.0, free_b / 1073741824.0, g->B, g->lm_chunks);
        if (g->host_state) QT_CUDA(cudaFreeHost(g->host_state));
        free(g->layers);
        free(g);
        return NULL;
    }
    carve_all(g); /* second pass: now with real addresses */
    QT_CUDA(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    g->mm = qt_matmul_create(0);
    g->attn = qt_attention_create();
    cudaStream_t s = g->stream;
    const qt_shard *sp = &g->shard;
    size_t n = L->numel, tot = sp->total;
    /* w0 through the gradient buffer (zeroed right after): bf16 copy of all, master of this rank's pieces */
    qt_zero(g->grad, tot * 4, s);
    QT_CUDA(cudaMemcpyAsync(g->grad, w0, n * 4, cudaMemcpyHostToDevice, s));
    qt_cast_f32_to_bf16(g->w, g->grad, tot, s);
    for (int b = 0; b < sp->n_buckets; b++) {
        size_t off, len, st;
        qt_shard_piece(sp, b, &off, &len, &st);
        QT_CUDA(cudaMemcpyAsync(g->master + st, g->grad + off, len * 4, cudaMemcpyDefault, s));
    }
    qt_zero(g->grad, tot * 4, s);
    if (!g->host_state) {
        qt_zero(g->m, ns * qt_dtype_size(g->m_dt), s);
        qt_zero(g->v, ns * qt_dtype_size(g->v_dt), s);
    }
    qt_zero(g->loss_sum, 8, s);
    qt_rope_table(g->rope_cs, g->T, L->cfg.head_dim, L->cfg.rope_theta, s);
    /* AdamW's per-tensor table, cut to this rank's pieces: decay on matrices (and embeddings when
     * configured); padding untouched. A rank may hold no parameter at all (tiny models on many ranks). */
    qt_adamw_tensor *t = calloc((size_t)(L->n_tensors + 1) * sp->n_buckets, sizeof *t);
    int *start = calloc((size_t)sp->n_buckets, sizeof *start), nt = 0;
    QT_CHECK(t && start, "out of host memory");
    for (int b = 0; b < sp->n_buckets; b++) {
        start[b] = nt;
        size_t lo, len, st;
        qt_shard_piece(sp, b, &lo, &len, &st);
        for (int i = 0; i < L->n_tensors; i++) {
            const qt_tensor *tt = &L->tensors[i];
            int decay = tt->is_matrix || (cfg->decay_embeddings && (tt->kind == QT_T_EMBED || tt->kind == QT_T_LM_HEAD));
            size_t a = tt->offset > lo ? tt->offset : lo;
            size_t e = tt->offset + tt->numel < lo + len ? tt->offset + tt->numel : lo + len;
            if (a < e) t[nt++] = (qt_adamw_tensor){a, e - a, decay ? cfg->weight_decay : 0.0f, st + (a - lo)};
        }
    }
    /* groups: every bucket (one GPU, offloaded), else bucket 0 and the rest (sharded), else one */
    int groups = !sh && g->host_state ? sp->n_buckets : sp->n_buckets > 1 && start[1] > 0 && start[1] < nt ? 2 : 1;
    g->opt = qt_gpu_optim_create(t, nt, start, groups, g->master, g->m, g->m_dt, g->v, g->v_dt,
                                 g->host_state ? g->opt_slots : NULL, g->opt_chunk);
    free(t);
    free(start);
    if (cfg->matmul_dtype == QT_DT_E4M3) {
        g->fp8 = qt_fp8_create(&L->cfg, (qt_dtype)cfg->grad_dtype, g->N, g->fp8_w, g->fp8_a, s);
        qt_fp8_quantize_weights(g->fp8, L, g->w, 0, L->cfg.num_layers, s);
    }
    QT_CUDA(cudaStreamSynchronize(s));
    return g;
}

void qt_gpu_model_free(qt_gpu_model *g) {
    if (!g) return;
    qt_fp8_free(g->fp8);
    qt_gpu_optim_free(g->opt);
    qt_attention_free(g->attn);
    qt_matmul_free(g->mm);
    QT_CUDA(cudaStreamDestroy(g->stream));
    QT_CUDA(cudaFree(g->arena));
    if (g->host_state) QT_CUDA(cudaFreeHost(g->host_state));
    free(g->layers);
    free(g);
}

void qt_gpu_model_print_plan(const qt_gpu_model *g) {
    struct cudaDeviceProp p;
    int dev;
    size_t free_b, total_b;
    QT_CUDA(cudaGetDevice(&dev));
    QT_CUDA(cudaGetDeviceProperties(&p, dev));
    QT_CUDA(cudaMemGetInfo(&free_b, &total_b));
    printf("qtrain: GPU %d %s (sm_%d%d), memory plan for micro-batch %d x %d tokens:\n", dev, p.name, p.major,
           p.minor, g->B, g->T);
    for (int i = 0; i < g->n_plan; i++) printf("  %-28s %10.1f MiB\n", g->plan[i].kind, g->plan[i].bytes / 1048576.0);
    printf("  %-28s %10.1f MiB\n", "total (one allocation)", g->arena_bytes / 1048576.0);
    if (g->host_state)
        printf("  %-28s %10.1f MiB (pinned host memory: master weights, adam m, v)\n", "offloaded optimizer state",
               g->host_state_bytes / 1048576.0);
    printf("  %-28s %10.1f MiB of %.1f MiB (cuBLASLt and cuDNN workspaces come out of this)\n", "free now",
           free_b / 1048576.0, total_b / 1048576.0);
}

/* The LM head over chunks of tokens: logits, loss and dlogits in place, then (with backward) dlnf and
 * the head's weight gradient, so the full [N, V] logits never exist. */
static void lm_head(qt_gpu_model *g, float loss_scale, int backward) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    long chunk = (g->N + g->lm_chunks - 1) / g->lm_chunks;
    int C = c->hidden_size, V = c->vocab_size;
    for (long r0 = 0; r0 < g->N; r0 += chunk) {
        long n = g->N - r0 < chunk ? g->N - r0 : chunk;
        void *x = (char *)g->lnf + r0 * C * 2;
        qt_gpu_model_mark(g, "lm head: matmul fwd");
        qt_matmul_fwd(g->mm, g->logits, QT_DT_BF16, x, Wp(g, g->L->lm_head), NULL, n, C, V, 0, s);
        qt_gpu_model_mark(g, "lm head: loss");
        qt_lmhead_loss(g->logits, g->losses + r0, NULL, g->tgt + r0, n, V, loss_scale, s);
        if (!backward) continue;
        qt_gpu_model_mark(g, "lm head: dgrad + wgrad");
        qt_matmul_dgrad(g->mm, (char *)g->dlnf + r0 * C * 2, QT_DT_BF16, g->logits, Wp(g, g->L->lm_head), n, C, V, 0, s);
        qt_matmul_wgrad(g->mm, Gp(g, g->L->lm_head), QT_DT_F32, NULL, g->logits, x, n, C, V, 1, s);
    }
    qt_gpu_model_mark(g, "lm head: loss");
    qt_sum_f32(g->loss_sum, g->losses, g->N, s);
}

/* The abs-max slot the producer of layer l's matmul k input (grad 0) / output gradient (grad 1) fills;
 * NULL in bf16 (nothing to quantize). */
static float *fp8_amax(qt_gpu_model *g, int l, qt_fp8_mm k, int grad) {
    return g->fp8 ? qt_fp8_producer_amax(g->fp8, l, k, grad) : NULL;
}

/* One block matmul forward: fp8 when configured, else bf16. */
static void lin_fwd(qt_gpu_model *g, const char *label, int l, qt_fp8_mm k, void *y, const void *x, size_t w,
                    const void *bias, int I, int O) {
    if (g->fp8) {
        qt_gpu_model_mark(g, "fp8 quantize: activations");
        qt_fp8_quant_input(g->fp8, l, k, x, g->stream);
        qt_gpu_model_mark(g, label);
        qt_fp8_fwd(g->fp8, g->mm, l, k, y, bias, g->stream);
    } else {
        qt_gpu_model_mark(g, label);
        qt_matmul_fwd(g->mm, y, QT_DT_BF16, x, Wp(g, w), bias, g->N, I, O, 0, g->stream);
    }
}

/* One block matmul backward, weight gradient first (dx may overwrite x's buffer): dW += dY^T X, dX = dY W. */
static void lin_bwd(qt_gpu_model *g, const char *label, int l, qt_fp8_mm k, void *dx, const void *dy, const void *x,
                    size_t w, int I, int O) {
    cudaStream_t s = g->stream;
    if (g->fp8 && g->fp8->grad_dt != QT_DT_BF16) {
        qt_gpu_model_mark(g, "fp8 quantize: gradients");
        qt_fp8_quant_grad(g->fp8, l, k, dy, s);
        qt_gpu_model_mark(g, label);
        qt_fp8_wgrad(g->fp8, g->mm, l, k, Gp(g, w), s);
        qt_fp8_dgrad(g->fp8, g->mm, l, k, dx, s);
        return;
    }
    qt_gpu_model_mark(g, label);
    qt_matmul_wgrad(g->mm, Gp(g, w), QT_DT_F32, NULL, dy, x, g->N, I, O, 1, s);
    qt_matmul_dgrad(g->mm, dx, QT_DT_BF16, dy, Wp(g, w), g->N, I, O, 0, s);
}

/* Tells the weights_needed hook that the next op reads weights below flat index upto. */
static void weights_needed(qt_gpu_model *g, size_t upto) {
    if (g->weights_needed) g->weights_needed(g->hook_ctx, upto);
}

static void forward(qt_gpu_model *g) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    int C = c->hidden_size, F = c->intermediate_size, H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    int HD = H * D, QKV = (H + 2 * Hkv) * D;
    long N = g->N;
    float eps = c->rms_norm_eps;
    if (g->fp8) qt_fp8_reset_amax(g->fp8, s); /* a micro-step starts here */
    weights_needed(g, g->L->layers[0].ln1);
    qt_gpu_model_mark(g, "embedding fwd");
    qt_embedding_fwd(g->layers[0].res, g->tok, Wp(g, g->L->embed), N, C, c->vocab_size, s);
    for (int l = 0; l < c->num_layers; l++) {
        const qt_layer_offsets *o = &g->L->layers[l];
        qt_gpu_layer *a = &g->layers[l];
        weights_needed(g, qt_layer_end(g->L, l));
        /* res (the previous block's down output) += the previous block's residual, then norm */
        qt_gpu_model_mark(g, "rmsnorm fwd");
        qt_rmsnorm_fwd(a->ln1, a->rstd1, a->res, l ? g->layers[l - 1].res_mid : NULL, Wp(g, o->ln1), N, C, eps,
                       fp8_amax(g, l, QT_FP8_QKV, 0), s);
        lin_fwd(g, "matmul fwd: qkv", l, QT_FP8_QKV, a->qkv, a->ln1, o->wqkv, c->qkv_bias ? Wp(g, o->bqkv) : NULL, C, QKV);
        qt_gpu_model_mark(g, "rope");
        qt_rope_fwd(a->qkv, g->rope_cs, g->B, g->T, H, Hkv, D, s);
        qt_gpu_model_mark(g, "attention fwd");
        qt_attention_fwd(g->attn, a->att, a->lse, a->qkv, g->B, g->T, H, Hkv, D, s);
        lin_fwd(g, "matmul fwd: o", l, QT_FP8_O, a->res_mid, a->att, o->wo, NULL, HD, C);
        qt_gpu_model_mark(g, "rmsnorm fwd");
        qt_rmsnorm_fwd(a->ln2, a->rstd2, a->res_mid, a->res, Wp(g, o->ln2), N, C, eps, fp8_amax(g, l, QT_FP8_GU, 0),
                       s);
        lin_fwd(g, "matmul fwd: gate|up", l, QT_FP8_GU, a->gu, a->ln2, o->wgu, NULL, C, 2 * F);
        qt_gpu_model_mark(g, "swiglu");
        qt_swiglu_fwd(a->h, a->gu, N, F, fp8_amax(g, l, QT_FP8_DOWN, 0), s);
        void *out = l + 1 < c->num_layers ? g->layers[l + 1].res : g->res_final;
        lin_fwd(g, "matmul fwd: down", l, QT_FP8_DOWN, out, a->h, o->wdown, NULL, F, C);
    }
    weights_needed(g, g->L->numel); /* the final norm and an untied LM head */
    qt_gpu_model_mark(g, "rmsnorm fwd");
    qt_rmsnorm_fwd(g->lnf, g->rstdf, g->res_final, g->layers[c->num_layers - 1].res_mid, Wp(g, g->L->final_norm), N,
                   C, eps, NULL, s);
}

/* Tells the grads_ready hook that every gradient from flat index `from` up is final. */
static void grads_final(qt_gpu_model *g, size_t from) {
    if (g->grads_ready) g->grads_ready(g->hook_ctx, from);
}

static void backward(qt_gpu_model *g) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    int C = c->hidden_size, F = c->intermediate_size, H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    int HD = H * D, QKV = (H + 2 * Hkv) * D;
    long N = g->N;
    size_t NC = (size_t)N * C;
    qt_gpu_model_mark(g, "rmsnorm bwd");
    qt_zero(g->dres, NC * 4, s);
    /* Each rmsnorm bwd also writes dres_bf (bf16 of the updated dres) for the next branch's matmuls
     * (the dY of down, then of o), with its abs-max: no separate cast. The last one (layer 0's ln1) has
     * no matmul after it. */
    int nl = c->num_layers;
    qt_rmsnorm_bwd(g->dres, QT_DT_F32, g->dres_bf, fp8_amax(g, nl - 1, QT_FP8_DOWN, 1), Gp(g, g->L->final_norm),
                   g->dlnf, g->res_final, Wp(g, g->L->final_norm), g->rstdf, N, C, g->ws, s);
    grads_final(g, g->L->final_norm); /* the untied LM head above it was done by lm_head() */
    for (int l = nl - 1; l >= 0; l--) {
        const qt_layer_offsets *o = &g->L->layers[l];
        qt_gpu_layer *a = &g->layers[l];
        /* MLP: h's buffer takes dh once down's weight gradient has read h; gu's takes dgu. */
        lin_bwd(g, "matmul bwd: down", l, QT_FP8_DOWN, a->h, g->dres_bf, a->h, o->wdown, F, C);
        qt_gpu_model_mark(g, "swiglu");
        qt_swiglu_bwd(a->gu, a->h, a->gu, N, F, fp8_amax(g, l, QT_FP8_GU, 1), s);
        lin_bwd(g, "matmul bwd: gate|up", l, QT_FP8_GU, g->dln, a->gu, a->ln2, o->wgu, C, 2 * F);
        qt_gpu_model_mark(g, "rmsnorm bwd");
        qt_rmsnorm_bwd(g->dres, QT_DT_F32, g->dres_bf, fp8_amax(g, l, QT_FP8_O, 1), Gp(g, o->ln2), g->dln, a->res_mid,
                       Wp(g, o->ln2), a->rstd2, N, C, g->ws, s);
        /* attention */
        lin_bwd(g, "matmul bwd: o", l, QT_FP8_O, g->datt, g->dres_bf, a->att, o->wo, HD, C);
        qt_gpu_model_mark(g, "attention bwd");
        qt_attention_bwd(g->attn, g->dqkv, g->datt, a->qkv, a->att, a->lse, g->B, g->T, H, Hkv, D, s);
        qt_gpu_model_mark(g, "rope");
        qt_rope_bwd(g->dqkv, g->rope_cs, g->B, g->T, H, Hkv, D, fp8_amax(g, l, QT_FP8_QKV, 1), s);
        qt_gpu_model_mark(g, "bias grad");
        if (c->qkv_bias) qt_bias_bwd(Gp(g, o->bqkv), g->dqkv, N, QKV, g->ws, s);
        lin_bwd(g, "matmul bwd: qkv", l, QT_FP8_QKV, g->dln, g->dqkv, a->ln1, o->wqkv, C, QKV);
        qt_gpu_model_mark(g, "rmsnorm bwd");
        qt_rmsnorm_bwd(g->dres, QT_DT_F32, l > 0 ? g->dres_bf : NULL, l > 0 ? fp8_amax(g, l - 1, QT_FP8_DOWN, 1) : NULL,
                       Gp(g, o->ln1), g->dln, a->res, Wp(g, o->ln1), a->rstd1, N, C, g->ws, s);
        grads_final(g, o->ln1);
    }
    if (!g->skip_lookups) {
        qt_gpu_model_mark(g, "embedding bwd");
        qt_embedding_bwd(Gp(g, g->L->embed), g->dres, QT_DT_F32, g->tok, N, C, c->vocab_size, g->ws, s);
    }
    grads_final(g, 0);
}

void qt_gpu_model_step(qt_gpu_model *g, float loss_scale, int backward_too) {
    /* without persistent quants the fp8 weights are rebuilt for every micro-batch */
    if (g->fp8 && !g->cfg->persistent_quants) {
        weights_needed(g, g->L->numel);
        qt_gpu_model_mark(g, "fp8 quantize: weights");
        qt_fp8_quantize_weights(g->fp8, g->L, g->w, 0, g->L->cfg.num_layers, g->stream);
    }
    forward(g);
    lm_head(g, loss_scale, backward_too);
    if (backward_too && g->embed_ready) g->embed_ready(g->hook_ctx);
    if (backward_too) backward(g);
    qt_gpu_model_profile_collect(g);
}

/* ---- per-op timing ---- */
#define PROF_EVENTS 4096
#define PROF_LABELS 48
struct qt_gpu_prof {
    cudaEvent_t ev[PROF_EVENTS];
    const char *at[PROF_EVENTS]; /* label of the interval that starts at ev[i] */
    int n;
    const char *label[PROF_LABELS];
    double ms[PROF_LABELS];
    int nlabels;
};

void qt_gpu_model_profile(qt_gpu_model *g, int on) {
    if (on && !g->prof) {
        g->prof = calloc(1, sizeof *g->prof);
        QT_CHECK(g->prof, "out of host memory");
        for (int i = 0; i < PROF_EVENTS; i++) QT_CUDA(cudaEventCreate(&g->prof->ev[i]));
    } else if (!on && g->prof) {
        for (int i = 0; i < PROF_EVENTS; i++) QT_CUDA(cudaEventDestroy(g->prof->ev[i]));
        free(g->prof);
        g->prof = NULL;
    }
}

void qt_gpu_model_mark(qt_gpu_model *g, const char *label) {
    struct qt_gpu_prof *p = g->prof;
    if (!p || p->n == PROF_EVENTS) return;
    QT_CUDA(cudaEventRecord(p->ev[p->n], g->stream));
    p->at[p->n++] = label;
}

void qt_gpu_model_profile_collect(qt_gpu_model *g) {
    struct qt_gpu_prof *p = g->prof;
    if (!p || p->n == 0) return;
    qt_gpu_model_mark(g, NULL); /* closes the last interval */
    QT_CUDA(cudaStreamSynchronize(g->stream));
    for (int i = 0; i + 1 < p->n; i++) {
        float ms;
        QT_CUDA(cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]));
        int k = 0;
        while (k < p->nlabels && strcmp(p->label[k], p->at[i])) k++;
        if (k == p->nlabels && k < PROF_LABELS) p->label[p->nlabels++] = p->at[i];
        if (k < PROF_LABELS) p->ms[k] += ms;
    }
    p->n = 0;
}

void qt_gpu_model_profile_print(qt_gpu_model *g, int steps) {
    struct qt_gpu_prof *p = g->prof;
    if (!p) return;
    double total = 0;
    for (int k = 0; k < p->nlabels; k++) total += p->ms[k];
    printf("time per optimizer step by op (CUDA events, %d steps):\n", steps);
    for (int k = 0; k < p->nlabels; k++)
        printf("  %-28s %8.2f ms  %5.1f%%\n", p->label[k], p->ms[k] / steps, 100 * p->ms[k] / total);
    printf("  %-28s %8.2f ms\n", "total", total / steps);
    memset(p->ms, 0, sizeof p->ms);
}

void qt_gpu_model_logits(qt_gpu_model *g, float *host) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    long chunk = (g->N + g->lm_chunks - 1) / g->lm_chunks;
    size_t V = c->vocab_size;
    uint16_t *tmp = malloc(chunk * V * 2);
    QT_CHECK(tmp, "out of host memory");
    forward(g);
    for (long r0 = 0; r0 < g->N; r0 += chunk) {
        long n = g->N - r0 < chunk ? g->N - r0 : chunk;
        qt_matmul_fwd(g->mm, g->logits, QT_DT_BF16, (char *)g->lnf + r0 * c->hidden_size * 2, Wp(g, g->L->lm_head),
                      NULL, n, c->hidden_size, (int)V, 0, s);
        QT_CUDA(cudaMemcpyAsync(tmp, g->logits, n * V * 2, cudaMemcpyDeviceToHost, s));
        QT_CUDA(cudaStreamSynchronize(s));
        for (size_t i = 0; i < n * V; i++) host[r0 * V + i] = qt_bf16_to_f32(tmp[i]);
    }
    free(tmp);
}
