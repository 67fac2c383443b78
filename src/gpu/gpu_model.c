/* gpu_model.c — the model's math on one GPU: the forward block by block (with the chunked LM-head loss
 * and its backward folded in) and the backward block by block, in bf16 with fp32 accumulation and fp32
 * gradients; its buffers come from the parameter store, the activation store and its own rows of the
 * memory plan (carve_all).
 *
 * The residual stream needs no copies: the fused RMSNorm adds the branch input into the buffer that
 * holds the branch output (o_proj / down output), which then *is* the next residual and stays saved
 * for the backward. dres, the residual-stream gradient, is fp32 and accumulates across the blocks.
 * A family's own kernels (norm scale, GLU, embedding and attention scales, logit cap) come through g->fam
 * (qt_gpu_family.h). Gemma's sandwich norms sit on the branch outputs: o_proj / down write po / pm, the post-norm
 * writes the buffer the residual add then goes into (res_mid / the next res), and in the backward the post-norm's
 * backward of dres_bf gives the matmul its dY (branch_dy).
 * With precision.matmul_dtype: e4m3 the blocks' four matmuls go through src/gpu/gpu_fp8.c (lin_fwd/lin_bwd);
 * its buffers are the plan's "fp8 weights (persistent)" and "fp8 activations" rows. The kernels that
 * produce a matmul's input or output gradient (RMSNorm, SwiGLU, RoPE bwd) also fold its abs-max into
 * the fp8 scale record (fp8_amax), which saves the quantizer a pass over the tensor. Weights are read
 * only after qt_param_acquire_weights and gradients handed on with qt_param_release_grads, so the
 * engine's sync (and a future sharded or streamed placement) sees every layer boundary. With
 * memory.recompute the activation store gives the recomputed tensors one buffer for all layers, and
 * block_run rebuilds them (the forward's ops again) before each layer's backward. With
 * memory.offload_residual the store keeps each layer's input residual in host memory between the
 * forward and the backward: the model only says when res is final (qt_act_residual_final, after the
 * first norm's add); qt_act_forward/backward/release order the copies (qt_act_store.h). With LoRA
 * (plan lora.rank > 0) the weights come from a frozen base's placement (qt_gpu_base.h) in place of the
 * parameter store (its layer hook runs before each block's forward and backward: base_layer), no weight gradient
 * is written (Gp is NULL), and each block matmul calls the adapters beside it (qt_gpu_lora.h: lin_fwd, lin_bwd). */
#include "qt_gpu_model.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_gpu_lora.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_place.h"
#include "qt_rope.h"
#include "qt_test_hooks.h"

/* The node's data-parallel ranks of the store's shard (a frozen base: one), whose lookups a rank gathers. */
static int n_ranks(const qt_gpu_model *g) { return g->ps ? qt_shard_local_ranks(&g->ps->shard) : 1; }

size_t qt_gpu_model_lookups(const qt_gpu_model *g, void *base, int32_t **tok, float **dres, void **ws) {
    size_t n = (size_t)n_ranks(g) * g->N, a = qt_mem_aligned(n * 4);
    size_t d = qt_mem_aligned(n * g->L->cfg.hidden_size * 4);
    if (base) {
        *tok = base;
        *dres = (float *)((char *)base + a);
        *ws = (char *)base + a + d;
    }
    return a + d + qt_embedding_bwd_ws_bytes(g->N, g->L->cfg.vocab_size);
}

/* The fp8 backward's weight gradients (full fine-tuning with grad_dtype e4m3 / e5m2). A frozen base (LoRA) has
 * none: its fp8 backward is the data gradient only (lin_bwd, base_dgrad), and the adapters read the bf16 inputs
 * and output gradients, so its activations, recompute and SwiGLU backward are the bf16 backward's. */
static int fp8_wgrad(const qt_gpu_model *g) { return g->fp8_bwd && !g->base; }

/* The fp8 matmuls whose input the recompute rebuilds (bit 1 << qt_fp8_mm): qkv (part qkv), o (block), gate|up
 * (ffn), down (swiglu: block_backward's SwiGLU backward makes down's input). */
static unsigned fp8_redone(const qt_act_redo *r) {
    return (r->qkv ? 1u << QT_FP8_QKV : 0) | (r->block ? 1u << QT_FP8_O : 0) | (r->ffn ? 1u << QT_FP8_GU : 0) |
           (r->swiglu ? 1u << QT_FP8_DOWN : 0);
}

/* The fp8 matmuls whose Xq^T has one buffer for all layers (bit 1 << qt_fp8_mm). Without fp8 weight gradients
 * nothing reads Xq^T after the forward: all four. With them, those whose input the recompute
 * quantizes again before the layer's wgrad (block_run, fp8_redone). */
static unsigned fp8_xq_shared(const qt_gpu_model *g) {
    return fp8_wgrad(g) ? fp8_redone(&g->as->policy.redo) : (1u << QT_FP8_NMM) - 1;
}

/* Device memory this model allocates outside the arena: the cuBLASLt workspace, the autotuner's
 * scratch output during the first step (the largest accumulating weight gradient it tunes), cuDNN's
 * attention workspace (g->attn_ws: measured from the plans on a GPU, estimated without
 * one) and the runtime reserve. */
static void outside_rows(const qt_gpu_model *g, qt_mem_plan *p) {
    const qt_model_cfg *c = &g->L->cfg;
    size_t C = c->hidden_size, F = c->intermediate_size, HD = (size_t)c->num_heads * c->head_dim;
    size_t QKV = HD + (size_t)2 * c->num_kv_heads * c->head_dim, tune = 0;
    size_t out[5] = {QKV * C, C * HD, 2 * F * C, C * F, (size_t)c->vocab_size * C}; /* the wgrad outputs */
    for (int i = 0; i < 5 && g->pl->perf.autotune && g->ps; i++) /* a frozen base (LoRA) has no weight gradient */
        if (qt_matmul_tune_scratch_bytes(out[i] * 4) > tune) tune = qt_matmul_tune_scratch_bytes(out[i] * 4);
    qt_mem_plan_add(p, QT_MEM_DEVICE, "cuBLASLt workspace", QT_MATMUL_WS_DEFAULT);
    if (tune) qt_mem_plan_add(p, QT_MEM_DEVICE, "matmul autotune scratch", tune);
    qt_mem_plan_add(p, QT_MEM_DEVICE, "cuDNN attention workspace", g->attn_ws);
    qt_mem_plan_add(p, QT_MEM_DEVICE, "runtime reserve", QT_GPU_RUNTIME_RESERVE);
}

/* The plan: the stores' rows, then the model's own. Two passes: base NULL only sizes it. */
static size_t carve_all(qt_gpu_model *g, char *base) {
    const qt_model_cfg *c = &g->L->cfg;
    qt_mem_plan *p = &g->plan;
    long N = g->N;
    size_t C = c->hidden_size, V = c->vocab_size;
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    size_t chunk = (N + g->lm_chunks - 1) / g->lm_chunks;
    qt_mem_plan_begin(p, base);
    if (g->base) { /* LoRA: the frozen base and the adapters in place of the store */
        g->base->ops->carve(g->base, p);
        qt_gpu_lora_carve(g->lora, p);
    } else {
        qt_param_store_carve(g->ps, p);
    }
    qt_act_store_carve(g->as, p);
    /* Every rank's lookups instead of the table's gradient, where they are the fewer bytes (2 ranks of
     * 16 x 1024 tokens at V = 151936, not 8 ranks of 32 x 1024). */
    int pay = qt_plan_lookups_pay(g->L, g->N, n_ranks(g));
    size_t lk = pay ? qt_gpu_model_lookups(g, NULL, NULL, NULL, NULL) : 0;
    g->head.logits = qt_mem_plan_carve(p, "lm-head logits chunk", chunk * V * 2 > lk ? chunk * V * 2 : lk);
    g->head.lookups = lk ? g->head.logits : NULL; /* dead from the LM head's end to the next micro-step's */
    g->head.losses = qt_mem_plan_carve(p, "lm-head logits chunk", N * 4);
    g->head.loss_sum = qt_mem_plan_carve(p, "scratch: gradients", 8);
    g->tok = qt_mem_plan_carve(p, "tokens, rope table", N * 4);
    g->tgt = qt_mem_plan_carve(p, "tokens, rope table", N * 4);
    g->rope_cs = qt_mem_plan_carve(p, "tokens, rope table", (size_t)g->T * c->head_dim * 4);
    g->rope_cs_local = c->rope_local_theta > 0 ? qt_mem_plan_carve(p, "tokens, rope table", (size_t)g->T * c->head_dim * 4)
                                               : NULL;
    size_t ws = qt_embedding_bwd_ws_bytes(N, (int)V);
    size_t cr = qt_colreduce_ws_bytes((int)(QKV > C ? QKV : C));
    if (cr > ws) ws = cr;
    if (c->qk_norm && qt_qknorm_ws_bytes(c->head_dim) > ws) ws = qt_qknorm_ws_bytes(c->head_dim);
    if (qt_grad_norm_ws_bytes() > ws) ws = qt_grad_norm_ws_bytes();
    g->ws_bytes = ws;
    g->ws = qt_mem_plan_carve(p, "kernel workspace", ws);
    if (g->fp8_fwd) {
        qt_fp8_wcache wc = (qt_fp8_wcache)g->pl->precision.fp8_cache;
        g->fp8_w = qt_mem_plan_carve(p, wc == QT_FP8_WCACHE_NONE ? "fp8 weights (layer slots)" : "fp8 weights (persistent)",
                                     qt_fp8_weight_bytes(c, wc));
        size_t fa = qt_fp8_act_bytes(c, N, g->pl->precision.grad_dt, fp8_xq_shared(g), fp8_wgrad(g));
        g->fp8_a = qt_mem_plan_carve(p, "fp8 activations", fa);
    }
    outside_rows(g, p);
    return p->off;
}

static void *Wp(const qt_gpu_model *g, size_t off) {
    return g->base ? g->base->ops->w(g->base, off) : qt_param_w(g->ps, off);
}
/* ZeRO-3: the rank keeps only its pieces of the bf16 weights; offloaded weights (w_host): they live in
 * host memory. Either way a layer's come whole into a weight slot when it is acquired (forward and
 * backward), and fp8 quantizes them from there (weight cache none). */
static int from_slots(const qt_gpu_model *g) { return g->ps && g->ps->weights_place->slots; }
/* Weight gradients: every writer below accumulates ("+=") into them in the store's acc_dt (fp32, or bf16
 * rounded once per accumulation from its fp32 result: cuBLASLt beta = 1 epilogue, column/embedding sums).
 * A frozen base has none: NULL, and the writers skip it (the norms' kernels take a NULL dw), but for the base
 * tensors lora.trainable names (fp32, beside the adapters: qt_gpu_lora_xgrad). */
static void *Gp(const qt_gpu_model *g, size_t off) {
    return g->ps ? qt_param_g(g->ps, off) : g->lora ? qt_gpu_lora_xgrad(g->lora, off) : NULL;
}
static qt_dtype Gdt(const qt_gpu_model *g) { return g->ps ? g->ps->acc_dt : QT_DT_F32; }

static void free_host(qt_gpu_model *g) {
    qt_act_store_free(g->as);
    if (g->base) g->base->ops->free(g->base);
    qt_gpu_lora_free(g->lora);
    qt_param_store_free(g->ps);
    free(g);
}

/* The attention workspace: the forward over the micro-batch, the backward over its slices (the last
 * may be shorter), for each window the layers use. measure: from cuDNN's plans (builds and caches them);
 * else the estimate (the fp32 parts and cuDNN's plan workspace as one more of them:
 * qt_attention_bwd_est_ws). */
static size_t attn_ws_of(qt_gpu_model *g, int measure) {
    const qt_model_cfg *c = &g->L->cfg;
    int per = (g->B + g->attn_chunks - 1) / g->attn_chunks, last = g->B - (g->attn_chunks - 1) * per;
    int H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    if (!measure) return qt_attention_bwd_est_ws(per, g->T, H, D, g->pl->perf.deterministic);
    size_t ws = 0, b;
    int done[4], nd = 0; /* the distinct windows measured: the layer rule gives at most two (0 and W) */
    for (int l = 0; l < c->num_layers; l++) {
        int w = qt_model_layer_window(c, l), seen = 0;
        for (int k = 0; k < nd; k++) seen |= done[k] == w;
        if (seen) continue;
        QT_CHECK(nd < 4, "attention workspace: more than 4 distinct layer windows");
        done[nd++] = w;
        if ((b = qt_attention_ws_bytes(g->attn, g->B, g->T, H, Hkv, D, w, 0)) > ws) ws = b;
        if ((b = qt_attention_ws_bytes(g->attn, per, g->T, H, Hkv, D, w, 1)) > ws) ws = b;
        if (last > 0 && (b = qt_attention_ws_bytes(g->attn, last, g->T, H, Hkv, D, w, 1)) > ws) ws = b;
    }
    return ws;
}

/* The host side of a model: its fields, the stores, the plan sized (no device memory yet). NULL with err. */
static qt_gpu_model *plan_host(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, char *err, size_t errlen) {
    if (qt_model_gpu_check(&L->cfg, err, errlen)) return NULL;
    qt_gpu_model *g = calloc(1, sizeof *g);
    QT_CHECK(g, "out of host memory");
    g->L = L;
    g->pl = pl;
    g->B = pl->run.B;
    g->T = pl->run.T;
    g->N = (long)g->B * g->T;
    g->lm_chunks = pl->acts.lm_chunks;
    g->attn_chunks = pl->acts.attn_chunks;
    g->fp8_fwd = pl->precision.fp8;
    g->fp8_bwd = pl->precision.fp8_bwd;
    g->fam = qt_gpu_family_of(&L->cfg);
    g->base = qt_gpu_base_create(L, pl); /* LoRA: a frozen base, and the adapters */
    if (g->base) g->lora = qt_gpu_lora_create(L, pl, g->N, err, errlen);
    else g->ps = qt_param_store_create(L, pl, sh, err, errlen);
    if (g->ps) g->pl = &g->ps->plan;
    qt_act_policy ap = pl->acts;
    ap.fp8_bwd = ap.fp8_bwd && !qt_test_hooks_get()->act_own_inputs;
    g->as = g->ps || g->lora ? qt_act_store_create(&L->cfg, g->N, ap, err, errlen) : NULL;
    if (!g->as) {
        free_host(g);
        return NULL;
    }
    g->attn_ws = attn_ws_of(g, 0);
    carve_all(g, NULL);
    return g;
}

int qt_gpu_model_plan(const qt_layout *L, const qt_plan *pl, const qt_shard *sh, qt_mem_plan *plan, char *err,
                      size_t errlen) {
    qt_gpu_model *g = plan_host(L, pl, sh, err, errlen);
    if (!g) return -1;
    *plan = g->plan;
    free_host(g);
    return 0;
}

/* The plan's device total against memory.gpu_limit_gib and the GPU's free memory: 0, or -1 with err. */
static int check_fits(const qt_gpu_model *g, char *err, size_t errlen) {
    size_t free_b, total_b;
    char what[96];
    QT_CUDA(cudaMemGetInfo(&free_b, &total_b));
    float lim = g->pl->memory.gpu_limit_gib;
    snprintf(what, sizeof what, "memory.gpu_limit_gib = %g", lim);
    int rc = lim > 0 ? qt_mem_plan_check(&g->plan, 0, qt_mem_gib(lim), what, err, errlen) : 0;
    if (!rc) rc = qt_mem_plan_check(&g->plan, 0, free_b, "the GPU's free memory", err, errlen);
    if (!rc) return 0;
    size_t n = strlen(err);
    snprintf(err + n, errlen - n, " (%s): lower data.micro_batch (%d), recompute more (memory.recompute: [ffn, norm] or "
             "[block]), raise memory.lmhead_chunks (%d) or set memory.offload_optimizer; qtrain --plan shows the rows",
             g->pl->run.path, g->B, g->lm_chunks);
    return -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The RoPE tables: the model's (the global layers'), and with rope_local_theta the local layers' (their own base,
 * the default RoPE: qt_model_layer_rope of a local layer). */
static void rope_tables(qt_gpu_model *g) {
    const qt_model_cfg *c = &g->L->cfg;
    double inv_freq[QT_ROPE_MAX_HALF], rope_attn;
    QT_CHECK(c->head_dim / 2 <= QT_ROPE_MAX_HALF, "head_dim %d: the GPU RoPE table takes at most %d", c->head_dim,
             2 * QT_ROPE_MAX_HALF);
    qt_rope_inv_freq(c, g->T, inv_freq, &rope_attn);
    qt_rope_table(g->rope_cs, g->T, c->head_dim, inv_freq, rope_attn, g->stream);
    if (!g->rope_cs_local) return;
    int l = 0;
    while (l + 1 < c->num_layers && !qt_model_layer_local(c, l)) l++;
    qt_model_cfg lc = qt_model_layer_rope(c, l);
    qt_rope_inv_freq(&lc, g->T, inv_freq, &rope_attn);
    qt_rope_table(g->rope_cs_local, g->T, c->head_dim, inv_freq, rope_attn, g->stream);
}

/* Layer l's RoPE table. */
static const float *layer_cs(const qt_gpu_model *g, int l) {
    return g->rope_cs_local && qt_model_layer_local(&g->L->cfg, l) ? g->rope_cs_local : g->rope_cs;
}

qt_gpu_model *qt_gpu_model_create(const qt_layout *L, const qt_plan *pl, const qt_weight_src *src, const qt_shard *sh,
                                  char *err, size_t errlen) {
    qt_gpu_model *g = plan_host(L, pl, sh, err, errlen);
    if (!g) return NULL;
    g->attn = qt_attention_create();
    int nondet = 0;
#ifdef QT_MUTANTS
    nondet = qt_mutant_on(QT_MUT_ATTENTION_NONDET);
#endif
    qt_attention_set_deterministic(g->attn, pl->perf.deterministic && !nondet);
    g->attn_ws = attn_ws_of(g, 1);
    size_t bytes = carve_all(g, NULL); /* again, with the measured attention workspace */
    double t0 = now_s();
    if (check_fits(g, err, errlen) || (g->ps && qt_param_store_alloc_host(g->ps, err, errlen))) {
        qt_attention_free(g->attn);
        free_host(g);
        return NULL;
    }
    if (cudaMalloc((void **)&g->arena, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "%s: the GPU memory plan's arena of %.2f GiB could not be allocated (cudaMalloc): another "
                 "process took the memory, or it is fragmented", pl->run.path, bytes / 1073741824.0);
        qt_attention_free(g->attn);
        free_host(g);
        return NULL;
    }
    qt_attention_reserve(g->attn, g->attn_ws);
    carve_all(g, g->arena); /* second pass: now with real addresses */
    QT_CUDA(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    if (qt_act_store_start(g->as, g->stream, pl->run.path, err, errlen)) {
        QT_CUDA(cudaStreamDestroy(g->stream));
        QT_CUDA(cudaFree(g->arena));
        free_host(g);
        return NULL;
    }
    g->timing.start_host_s = now_s() - t0; /* with the arena's cudaMalloc (quick beside the pinning) */
    g->mm = qt_matmul_create(0);
    qt_matmul_set_autotune(g->mm, pl->perf.autotune);
    cudaStream_t s = g->stream;
    t0 = now_s();
    if (g->base ? g->base->ops->init(g->base, src, s, err, errlen) : qt_param_store_init(g->ps, src, s, err, errlen)) {
        qt_gpu_model_free(g);
        return NULL;
    }
    if (g->lora && qt_gpu_lora_init(g->lora, g->mm, g->base, src, s, err, errlen)) {
        qt_gpu_model_free(g);
        return NULL;
    }
    g->timing.start_init_s = now_s() - t0;
    qt_zero(g->head.loss_sum, 8, s);
    rope_tables(g);
    if (g->fp8_fwd) {
        g->fp8 = qt_fp8_create(&L->cfg, pl->precision.grad_dt, (qt_fp8_wcache)pl->precision.fp8_cache,
                               g->N, fp8_xq_shared(g), fp8_wgrad(g), g->fp8_w, g->fp8_a, s);
        if (!from_slots(g)) qt_fp8_quantize_weights(g->fp8, L, g->ps ? g->ps->w : Wp(g, 0), 0, L->cfg.num_layers, s);
    }
    QT_CUDA(cudaStreamSynchronize(s));
    return g;
}

void qt_gpu_model_free(qt_gpu_model *g) {
    if (!g) return;
    qt_fp8_free(g->fp8);
    qt_attention_free(g->attn);
    qt_matmul_free(g->mm);
    qt_gpu_model_free_docs(g);
    QT_CUDA(cudaStreamDestroy(g->stream));
    QT_CUDA(cudaFree(g->arena));
    free_host(g);
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
    qt_plan_acts_print(&g->as->policy);
    qt_mem_plan_print(&g->plan);
    if (g->pl->memory.gpu_limit_gib > 0) printf("  %-30s %10.1f MiB\n", "memory.gpu_limit_gib", g->pl->memory.gpu_limit_gib * 1024.0);
    printf("  %-30s %10.1f MiB of %.1f MiB (the runtime reserve and autotune scratch come out of this)\n", "free now",
           free_b / 1048576.0, total_b / 1048576.0);
    printf("  start: host memory pinned and the GPU's allocated in %.1f s, the weights set in %.1f s\n", g->timing.start_host_s,
           g->timing.start_init_s);
}

/* The loss and dlogits in place of the logits of tokens [r0, r0 + n) (g->head.logits holds them from r0 on): with
 * row_scale (host [B]) the loss scale of each token is its sequence's, one launch per sequence the chunk meets (the
 * kernel's rows are independent: the same arithmetic as one launch); else loss_scale for all. */
static void lm_loss(qt_gpu_model *g, long r0, long n, float loss_scale, const float *row_scale) {
    int V = g->L->cfg.vocab_size;
    for (long i = r0; i < r0 + n;) {
        long end = row_scale ? (i / g->T + 1) * g->T : r0 + n;
        if (end > r0 + n) end = r0 + n;
        qt_lmhead_loss_softcap(QT_LMHEAD_AUTO, (char *)g->head.logits + (size_t)(i - r0) * V * 2, g->head.losses + i, NULL,
                               g->tgt + i, end - i, V, row_scale ? row_scale[i / g->T] : loss_scale, g->fam.logit_cap,
                               g->stream);
        i = end;
    }
}

/* The LM head over chunks of tokens: logits, loss and dlogits in place, then (with backward) dlnf and
 * the head's weight gradient, so the full [N, V] logits never exist. row_scale (host [B], or NULL): per-sequence
 * loss scales in place of loss_scale (lm_loss); the losses are then not summed into loss_sum again. */
static void lm_head(qt_gpu_model *g, float loss_scale, const float *row_scale, int backward) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    long chunk = (g->N + g->lm_chunks - 1) / g->lm_chunks;
    int C = c->hidden_size, V = c->vocab_size;
    for (long r0 = 0; r0 < g->N; r0 += chunk) {
        long n = g->N - r0 < chunk ? g->N - r0 : chunk;
        void *x = (char *)g->as->lnf + r0 * C * 2;
        qt_gpu_model_mark(g, "lm head: matmul fwd");
        qt_matmul_fwd(g->mm, g->head.logits, QT_DT_BF16, x, Wp(g, g->L->lm_head), NULL, n, C, V, 0, s);
        qt_gpu_model_mark(g, "lm head: loss");
        lm_loss(g, r0, n, loss_scale, row_scale);
        if (!backward) continue;
        qt_gpu_model_mark(g, "lm head: dgrad + wgrad");
        qt_matmul_dgrad(g->mm, (char *)g->as->dlnf + r0 * C * 2, QT_DT_BF16, g->head.logits, Wp(g, g->L->lm_head), n, C, V, 0, s);
        if (Gp(g, g->L->lm_head)) qt_matmul_wgrad(g->mm, Gp(g, g->L->lm_head), Gdt(g), NULL, g->head.logits, x, n, C, V, 1, s);
    }
    if (row_scale) return;
    qt_gpu_model_mark(g, "lm head: loss");
    qt_sum_f32(g->head.loss_sum, g->head.losses, g->N, s);
}

/* The abs-max slot the producer of layer l's matmul k input (grad 0) / output gradient (grad 1) fills;
 * NULL in bf16 (nothing to quantize). */
static float *fp8_amax(qt_gpu_model *g, int l, qt_fp8_mm k, int grad) {
    return g->fp8_fwd ? qt_fp8_producer_amax(g->fp8, l, k, grad) : NULL;
}

/* memory.fp8_weight_cache none: layer l's Wq (matrices in wq) and/or Wq^T into its slot (a no-op when
 * all are cached), from the bf16 weights where the model reads them; amax: take their abs-max first
 * (ZeRO-3's forward: no rank holds them all when qt_fp8_quantize_weights would run). With e4m3 gathers
 * (a layer bucket's matrices arrive as codes, their records set after AdamW) a copy and a transpose. */
static void fp8_use_weights(qt_gpu_model *g, int l, unsigned wq, int wqT, int amax) {
    const qt_layer_offsets *o = &g->L->layers[l];
    const qt_param_store *ps = g->ps;
    if (ps && ps->plan.weights.e4m3 && ps->e4m3.small.layer_bucket[qt_wslots_home(ps->wslots, o->wqkv)]) { /* gathered as e4m3 codes */
        const void *w8[QT_FP8_NMM] = {qt_wslots_addr8(ps->wslots, o->wqkv), qt_wslots_addr8(ps->wslots, o->wo),
                                      qt_wslots_addr8(ps->wslots, o->wgu), qt_wslots_addr8(ps->wslots, o->wdown)};
        qt_gpu_model_mark(g, "fp8 quantize: weights");
        qt_fp8_use_weights_e4m3(g->fp8, l, w8, wq, wqT, g->stream);
        return;
    }
    const void *w[QT_FP8_NMM] = {Wp(g, o->wqkv), Wp(g, o->wo), Wp(g, o->wgu), Wp(g, o->wdown)};
    qt_gpu_model_mark(g, "fp8 quantize: weights");
    if (amax) qt_fp8_weight_amax(g->fp8, l, w, g->stream);
    qt_fp8_use_weights(g->fp8, l, w, wq, wqT, g->stream);
}

/* The waits for a layer's weights (ZeRO-3 gathers, weight slots, the offloaded optimizer's uploads that run
 * ahead of the next forward) get an interval of their own in --breakdown: unmarked, they landed in the op
 * before (the previous layer's down projection). */
static void acquire(qt_gpu_model *g, const qt_param_hooks *h, size_t upto) {
    qt_gpu_model_mark(g, "weights: wait");
    qt_param_acquire_weights(g->ps, h, upto);
}
static void acquire_back(qt_gpu_model *g, const qt_param_hooks *h, size_t from) {
    qt_gpu_model_mark(g, "weights: wait");
    qt_param_acquire_weights_back(g->ps, h, from);
}

/* A frozen base's block l readable through Wp (an NF4 base dequantizes it into its slot): before the block's
 * forward and before its backward (and so its recompute). */
static void base_layer(qt_gpu_model *g, int l) {
    if (!g->base || !g->base->ops->layer) return;
    qt_gpu_model_mark(g, "base: dequantize");
    g->base->ops->layer(g->base, l, g->stream);
}

/* One block matmul forward: fp8 when configured, else bf16. redo: a recompute in the backward, which
 * quantizes x again with the forward's scale (qt_fp8_requant_input) and so multiplies the same bytes. */
static void lin_fwd(qt_gpu_model *g, const char *label, int l, qt_fp8_mm k, void *y, const void *x, size_t w,
                    const void *bias, int I, int O, int redo) {
    if (g->fp8_fwd) {
        qt_gpu_model_mark(g, redo ? "recompute: fp8 quantize" : "fp8 quantize: activations");
        if (redo) qt_fp8_requant_input(g->fp8, l, k, x, g->stream);
        else qt_fp8_quant_input(g->fp8, l, k, x, g->stream);
        qt_gpu_model_mark(g, label);
        qt_fp8_fwd(g->fp8, g->mm, l, k, y, bias, g->stream);
    } else {
        qt_gpu_model_mark(g, label);
        qt_matmul_fwd(g->mm, y, QT_DT_BF16, x, Wp(g, w), bias, g->N, I, O, 0, g->stream);
    }
    if (g->lora) {
        qt_gpu_model_mark(g, "lora fwd");
        qt_gpu_lora_fwd(g->lora, l, (int)k, x, y, g->stream);
    }
}

/* dX[N,I] (bf16, =) = dY W of block matmul k of layer l: in bf16 from the weights, or with an fp8 backward (a
 * frozen base's: fp8_wgrad's full fine-tuning quantizes dY in lin_bwd) dY quantized to grad_dtype and multiplied
 * with the e4m3 Wq^T. */
static void base_dgrad(qt_gpu_model *g, const char *label, int l, qt_fp8_mm k, void *dx, const void *dy, size_t w, int I,
                       int O) {
    if (g->fp8_bwd) {
        qt_gpu_model_mark(g, "fp8 quantize: gradients");
        qt_fp8_quant_grad(g->fp8, l, k, dy, g->stream);
        qt_gpu_model_mark(g, label);
        qt_fp8_dgrad(g->fp8, g->mm, l, k, dx, g->stream);
        return;
    }
    qt_gpu_model_mark(g, label);
    qt_matmul_dgrad(g->mm, dx, QT_DT_BF16, dy, Wp(g, w), g->N, I, O, 0, g->stream);
}

/* The adapters' data gradient of site k of layer l added into dx (after the base's dgrad wrote it). */
static void lora_bwd_x(qt_gpu_model *g, int l, qt_fp8_mm k, void *dx) {
    int skip = 0; /* 1: a planted bug's fp8 backward leaves the adapters' part out */
#ifdef QT_MUTANTS
    skip = g->fp8_bwd && qt_mutant_on(QT_MUT_LORA_FP8_NO_BWD_X);
#endif
    qt_gpu_model_mark(g, "lora bwd");
    if (!skip) qt_gpu_lora_bwd_x(g->lora, l, (int)k, dx, g->stream);
}

/* One block matmul backward, weight gradient first (dx may overwrite x's buffer): dW += dY^T X, dX = dY W. */
static void lin_bwd(qt_gpu_model *g, const char *label, int l, qt_fp8_mm k, void *dx, const void *dy, const void *x,
                    size_t w, int I, int O) {
    cudaStream_t s = g->stream;
    if (fp8_wgrad(g)) {
        qt_gpu_model_mark(g, "fp8 quantize: gradients");
        qt_fp8_quant_grad(g->fp8, l, k, dy, s);
        qt_gpu_model_mark(g, label);
        qt_fp8_wgrad(g->fp8, g->mm, l, k, Gp(g, w), Gdt(g), s);
        qt_fp8_dgrad(g->fp8, g->mm, l, k, dx, s);
        return;
    }
    qt_gpu_model_mark(g, label);
    if (Gp(g, w)) qt_matmul_wgrad(g->mm, Gp(g, w), Gdt(g), NULL, dy, x, g->N, I, O, 1, s);
    if (g->lora) { /* the adapters read x before the dgrad may write dx over it */
        qt_gpu_model_mark(g, "lora bwd");
        qt_gpu_lora_bwd_w(g->lora, l, (int)k, x, dy, s);
    }
    base_dgrad(g, label, l, k, dx, dy, w, I, O);
    if (g->lora) lora_bwd_x(g, l, k, dx);
}

_Static_assert((int)QT_FP8_QKV == (int)QT_LORA_SITE_QKV && (int)QT_FP8_O == (int)QT_LORA_SITE_O &&
                   (int)QT_FP8_GU == (int)QT_LORA_SITE_GU && (int)QT_FP8_DOWN == (int)QT_LORA_SITE_DOWN,
               "a block matmul's index is its LoRA site");

/* Shapes of a block, from the model config. */
typedef struct {
    int C, F, H, Hkv, D, HD, QKV;
} dims;
static dims dims_of(const qt_model_cfg *c) {
    int H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    return (dims){c->hidden_size, c->intermediate_size, H, Hkv, D, H * D, (H + 2 * Hkv) * D};
}

/* A branch's post-norm (Gemma's sandwich: post_attention_layernorm, post_feedforward_layernorm; x NULL and post
 * SIZE_MAX for the other families, a no-op): y = norm(x), the plain form (no add: the next norm fuses the residual
 * add into y). */
static void post_norm_fwd(qt_gpu_model *g, const char *label, void *y, float *rstd, void *x, size_t post) {
    if (post == SIZE_MAX) return;
    const qt_model_cfg *c = &g->L->cfg;
    qt_gpu_model_mark(g, label);
    g->fam.norm_fwd(y, rstd, x, NULL, Wp(g, post), g->N, c->hidden_size, c->rms_norm_eps, NULL, g->stream);
}

/* Block l's ops. The forward (redo NULL) runs them all from the residual in res: prev_mid (the previous
 * block's residual after attention) is first added into res by the fused RMSNorm, the kernels fold the
 * fp8 abs-maxes of the next matmuls' inputs, the down projection writes into out (the next block's res,
 * or res_final); it acquires the block's weights first. A recompute (redo = the store's policy.redo, the resolved
 * memory.recompute parts; before the layer's backward) runs, in the same order, the same kernels on
 * the same inputs (the ones the layer kept, or rebuilt just before) for the shared tensors only:
 *   norm: ln1 (and ln2 from the kept res_mid, which holds the sum already: no add); with an fp8
 *         backward ln1 goes with qkv and ln2 with ffn instead (nothing else reads them)   qkv: qkv + RoPE
 *                                      (qk_norm: the q/k norm between them, which rewrites its saved input, rstd)
 *   att: attention output and lse      block: o_proj into res_mid (with a post-norm: into po, the norm into
 *                                      res_mid), then ln2 with the fused add again
 *   ffn: gate|up                       swiglu: nothing here: block_backward's SwiGLU backward makes h
 *                                      (fp8: down's Xq^T) from gate|up
 * In fp8 each rebuilt matmul input is quantized again with the forward's scale, which also rewrites the
 * layer's Xq^T (one buffer for all layers where fp8_xq_shared says so). It folds no abs-max (the
 * forward's stay in the scale records) and writes no block output. The weights and, in fp8, their
 * quants are the forward's: nothing changes them before the optimizer step. */
static void block_run(qt_gpu_model *g, const qt_param_hooks *h, int l, const void *prev_mid, void *out,
                      const qt_act_redo *redo) {
    const qt_model_cfg *c = &g->L->cfg;
    const qt_layer_offsets *o = &g->L->layers[l];
    dims d = dims_of(c);
    cudaStream_t s = g->stream;
    long N = g->N;
    float eps = c->rms_norm_eps;
    int fwd = !redo;
    static const qt_act_redo none;
    const qt_act_redo *r = redo ? redo : &none;
#define LABEL(x) (redo ? "recompute: " x : x) /* the per-op breakdown shows the recompute's cost apart */
    qt_gpu_layer *a = fwd ? qt_act_forward(g->as, l) : qt_act_backward(g->as, l);
    if (fwd) acquire(g, h, qt_layer_end(g->L, l));
    if (fwd) base_layer(g, l);
    if (fwd && g->fp8_fwd) fp8_use_weights(g, l, (1u << QT_FP8_NMM) - 1, 0, from_slots(g));
    /* A bf16 backward's wgrads (and the adapters) read ln1 / ln2: the norm part rebuilds them. An fp8 backward's
     * wgrads read the kept (or requantized) Xq^T, and ln1 / ln2 / h have one buffer for all layers
     * (qt_act_policy.fp8_bwd): ln1 is rebuilt for a recomputed qkv, ln2 for a recomputed gate|up, whether norm is
     * listed or not. */
    int stale = 0; /* 1: a planted bug's stale ln1 / ln2 */
#ifdef QT_MUTANTS
    stale = l > 0 && qt_mutant_on(QT_MUT_RECOMPUTE_STALE_LN);
#endif
    int ln1_redo = fp8_wgrad(g) ? r->qkv && !stale : r->norm;
    int ln2_redo = fp8_wgrad(g) ? r->ffn && !stale : r->norm;
    if (fwd || ln1_redo) {
        qt_gpu_model_mark(g, LABEL("rmsnorm fwd"));
        g->fam.norm_fwd(a->ln1, a->rstd1, a->res, fwd ? prev_mid : NULL, Wp(g, o->ln1), N, d.C, eps,
                        fwd ? fp8_amax(g, l, QT_FP8_QKV, 0) : NULL, s);
        if (fwd) qt_act_residual_final(g->as, l); /* res now holds the sum: the backward's copy (offload) */
    }
    if (fwd || r->qkv) {
        lin_fwd(g, LABEL("matmul fwd: qkv"), l, QT_FP8_QKV, a->qkv, a->ln1, o->wqkv, c->qkv_bias ? Wp(g, o->bqkv) : NULL, d.C,
                d.QKV, !fwd);
        if (c->qk_norm) {
            qt_gpu_model_mark(g, LABEL("qk norm fwd"));
            g->fam.qknorm_fwd(a->qkv, a->qk, a->qk_rstd, Wp(g, o->qknorm), N, d.H, d.Hkv, d.D, eps, s);
        }
        qt_gpu_model_mark(g, LABEL("rope"));
        qt_rope_pos_fwd(a->qkv, layer_cs(g, l), g->docs.pos, g->B, g->T, d.H, d.Hkv, d.D, s);
    }
    if (fwd || r->att) {
        qt_gpu_model_mark(g, LABEL("attention fwd"));
        qt_attention_fwd_scaled(g->attn, a->att, a->lse, a->qkv, g->docs.kv_lo, g->B, g->T, d.H, d.Hkv, d.D,
                                qt_model_layer_window(c, l), g->fam.attn_scale, s);
    }
    if (fwd || r->block) {
        lin_fwd(g, LABEL("matmul fwd: o"), l, QT_FP8_O, a->po ? a->po : a->res_mid, a->att, o->wo, NULL, d.HD, d.C, !fwd);
        post_norm_fwd(g, LABEL("rmsnorm fwd"), a->res_mid, a->rstd_pa, a->po, o->post_attn);
        qt_gpu_model_mark(g, LABEL("rmsnorm fwd"));
        g->fam.norm_fwd(a->ln2, a->rstd2, a->res_mid, a->res, Wp(g, o->ln2), N, d.C, eps,
                        fwd ? fp8_amax(g, l, QT_FP8_GU, 0) : NULL, s);
    } else if (ln2_redo) {
        qt_gpu_model_mark(g, LABEL("rmsnorm fwd"));
        g->fam.norm_fwd(a->ln2, a->rstd2, a->res_mid, NULL, Wp(g, o->ln2), N, d.C, eps, NULL, s);
    }
    if (fwd || r->ffn)
        lin_fwd(g, LABEL("matmul fwd: gate|up"), l, QT_FP8_GU, a->gu, a->ln2, o->wgu, NULL, d.C, 2 * d.F, !fwd);
    if (fwd) {
        qt_gpu_model_mark(g, "swiglu");
        g->fam.glu_fwd(a->h, a->gu, N, d.F, fp8_amax(g, l, QT_FP8_DOWN, 0), s);
    } /* a recomputed SwiGLU: block_backward's SwiGLU backward makes h (or, in fp8, down's Xq^T) from gate|up */
    if (fwd) {
        lin_fwd(g, "matmul fwd: down", l, QT_FP8_DOWN, a->pm ? a->pm : out, a->h, o->wdown, NULL, d.F, d.C, 0);
        post_norm_fwd(g, "rmsnorm fwd", out, a->rstd_pf, a->pm, o->post_ffn);
    }
#undef LABEL
}

static void forward(qt_gpu_model *g, const qt_param_hooks *h) {
    const qt_model_cfg *c = &g->L->cfg;
    qt_act_store *as = g->as;
    cudaStream_t s = g->stream;
    int nl = c->num_layers;
    if (g->fp8_fwd) qt_fp8_reset_amax(g->fp8, s); /* a micro-step starts here */
    acquire(g, h, g->L->layers[0].ln1);
    qt_gpu_model_mark(g, "embedding fwd");
    qt_embedding_scaled_fwd(qt_act_forward(as, 0)->res, g->tok, Wp(g, g->L->embed), g->N, c->hidden_size, c->vocab_size,
                            g->fam.embed_scale, s);
    for (int l = 0; l < nl; l++)
        block_run(g, h, l, l ? as->layers[l - 1].res_mid : NULL, l + 1 < nl ? as->layers[l + 1].res : as->res_final, NULL);
    acquire(g, h, g->L->numel); /* the final norm and an untied LM head */
    qt_gpu_model_mark(g, "rmsnorm fwd");
    g->fam.norm_fwd(as->lnf, as->rstdf, as->res_final, as->layers[nl - 1].res_mid, Wp(g, g->L->final_norm), g->N,
                    c->hidden_size, c->rms_norm_eps, NULL, s);
}

/* The attention backward of layer a, over g->attn_chunks slices of whole sequences (the last may be
 * shorter): each sequence's gradient depends on that sequence only, so the slices compute what one call
 * would (the test checks the bits); cuDNN's workspace and fp32 dQ accumulator are sized by the slice. */
static void attention_bwd(qt_gpu_model *g, const qt_gpu_layer *a, dims d, int window) {
    qt_act_store *as = g->as;
    int per = (g->B + g->attn_chunks - 1) / g->attn_chunks;
    for (int b0 = 0; b0 < g->B; b0 += per) {
        int nb = g->B - b0 < per ? g->B - b0 : per;
        size_t r = (size_t)b0 * g->T; /* first token of the slice */
        qt_attention_bwd_scaled(g->attn, (char *)as->dqkv + r * d.QKV * 2, (const char *)as->datt + r * d.HD * 2,
                                (const char *)a->qkv + r * d.QKV * 2, (const char *)a->att + r * d.HD * 2,
                                a->lse + (size_t)b0 * d.H * g->T, g->docs.kv_lo ? g->docs.kv_lo + r : NULL, nb, g->T,
                                d.H, d.Hkv, d.D, window, g->fam.attn_scale, g->stream);
    }
}

/* The abs-max slot of layer l's matmul k output gradient for the norm backward that writes dres_bf (ln2's for o,
 * the next ln1's or the final norm's for down): NULL where the branch has a post-norm, whose backward makes that
 * gradient instead (branch_dy). */
static float *res_amax(qt_gpu_model *g, int l, qt_fp8_mm k) {
    const qt_layer_offsets *o = &g->L->layers[l];
    return (k == QT_FP8_O ? o->post_attn : o->post_ffn) == SIZE_MAX ? fp8_amax(g, l, k, 1) : NULL;
}

/* The output gradient of layer l's branch-ending matmul k (o or down), bf16: dres_bf itself; with the branch's
 * post-norm (Gemma; x its saved input, po or pm) that norm's backward of dres_bf, written into dln (zeroed first:
 * the norm's dx accumulates; dln is free until the branch's first matmul dgrad writes it), folding k's abs-max,
 * and adding the norm's weight gradient. */
static const void *branch_dy(qt_gpu_model *g, int l, qt_fp8_mm k, const void *x, const float *rstd) {
    const qt_layer_offsets *o = &g->L->layers[l];
    size_t post = k == QT_FP8_O ? o->post_attn : o->post_ffn;
    qt_act_store *as = g->as;
    if (post == SIZE_MAX) return as->dres_bf;
    int C = g->L->cfg.hidden_size;
    float *amax = fp8_amax(g, l, k, 1);
    qt_gpu_model_mark(g, "rmsnorm bwd");
    qt_zero(as->dln, (size_t)g->N * C * 2, g->stream);
    /* dx is bf16 (one rounding of 0 + the gradient); the abs-max is of the bf16 copy, which is dx itself */
    g->fam.norm_bwd(as->dln, QT_DT_BF16, amax ? as->dln : NULL, amax, Gp(g, post), Gdt(g), as->dres_bf, x, Wp(g, post),
                    rstd, g->N, C, g->ws, g->stream);
    return as->dln;
}

/* Block l's backward: dres (fp32, with its bf16 copy dres_bf) holds the gradient at the block's output;
 * afterwards at its input. Each rmsnorm bwd also writes dres_bf (bf16 of the updated dres) for the next
 * branch's matmuls (the dY of down, then of o), with its abs-max: no separate cast. Layer 0's ln1 has
 * no matmul after it. Releases the block's gradients at the end. */
static void block_backward(qt_gpu_model *g, const qt_param_hooks *h, int l) {
    const qt_model_cfg *c = &g->L->cfg;
    const qt_layer_offsets *o = &g->L->layers[l];
    qt_act_store *as = g->as;
    dims d = dims_of(c);
    cudaStream_t s = g->stream;
    long N = g->N;
    const qt_act_redo *r = &as->policy.redo;
    acquire_back(g, h, o->ln1);
    base_layer(g, l);
    if (g->fp8_fwd) /* the recompute's Wq (the matmuls block_run redoes: down's input is the SwiGLU backward's), the
                     * fp8 dgrad's Wq^T */
        fp8_use_weights(g, l, fp8_redone(r) & ~(1u << QT_FP8_DOWN), g->fp8_bwd, 0);
    if (r->any) block_run(g, h, l, NULL, NULL, r);
    qt_gpu_layer *a = qt_act_backward(as, l);
    /* MLP: h's buffer takes dh once down's weight gradient has read h; gu's takes dgu. With the SwiGLU
     * recomputed, what down's wgrad reads is made by the SwiGLU backward, which reads gu anyway: in fp8 down's
     * Xq^T (shared by the layers), in bf16 h itself, written over dh in h's buffer. Down's wgrad moves after it
     * (it is independent of the dgrad: the same bits). */
    int stale_h = 0; /* 1: a planted bug's stale h */
#ifdef QT_MUTANTS
    stale_h = l > 0 && qt_mutant_on(QT_MUT_RECOMPUTE_STALE_H);
#endif
    const void *dy = branch_dy(g, l, QT_FP8_DOWN, a->pm, a->rstd_pf); /* down's output gradient */
    if (fp8_wgrad(g) && r->swiglu) {
        qt_gpu_model_mark(g, "fp8 quantize: gradients");
        qt_fp8_quant_grad(g->fp8, l, QT_FP8_DOWN, dy, s);
        qt_gpu_model_mark(g, "matmul bwd: down");
        qt_fp8_dgrad(g->fp8, g->mm, l, QT_FP8_DOWN, a->h, s);
        qt_gpu_model_mark(g, "swiglu");
        if (stale_h) g->fam.glu_bwd(a->gu, a->h, a->gu, N, d.F, fp8_amax(g, l, QT_FP8_GU, 1), s); /* Xq^T: the layer above's */
        else g->fam.fp8_glu_bwd_requant(g->fp8, l, a->gu, a->h, a->gu, fp8_amax(g, l, QT_FP8_GU, 1), s);
        qt_gpu_model_mark(g, "matmul bwd: down");
        qt_fp8_wgrad(g->fp8, g->mm, l, QT_FP8_DOWN, Gp(g, o->wdown), Gdt(g), s);
    } else if (r->swiglu) { /* bf16, or a frozen base's fp8 dgrad */
        base_dgrad(g, "matmul bwd: down", l, QT_FP8_DOWN, a->h, dy, o->wdown, d.F, d.C);
        if (g->lora) { /* dh complete before the SwiGLU backward reads it; dA once h is back */
            qt_gpu_model_mark(g, "lora bwd");
            qt_gpu_lora_bwd_w(g->lora, l, QT_LORA_SITE_DOWN, NULL, dy, s);
            lora_bwd_x(g, l, QT_FP8_DOWN, a->h);
        }
        qt_gpu_model_mark(g, "swiglu");
        if (stale_h) g->fam.glu_bwd(a->gu, a->h, a->gu, N, d.F, fp8_amax(g, l, QT_FP8_GU, 1), s); /* h's buffer: dh */
        else g->fam.glu_bwd_h(a->gu, a->h, a->gu, N, d.F, fp8_amax(g, l, QT_FP8_GU, 1), s);
        qt_gpu_model_mark(g, "matmul bwd: down");
        if (Gp(g, o->wdown)) qt_matmul_wgrad(g->mm, Gp(g, o->wdown), Gdt(g), NULL, dy, a->h, N, d.F, d.C, 1, s);
        if (g->lora) {
            qt_gpu_model_mark(g, "lora bwd");
            qt_gpu_lora_bwd_a(g->lora, l, QT_LORA_SITE_DOWN, a->h, s);
        }
    } else {
        lin_bwd(g, "matmul bwd: down", l, QT_FP8_DOWN, a->h, dy, a->h, o->wdown, d.F, d.C);
        qt_gpu_model_mark(g, "swiglu");
        g->fam.glu_bwd(a->gu, a->h, a->gu, N, d.F, fp8_amax(g, l, QT_FP8_GU, 1), s);
    }
    lin_bwd(g, "matmul bwd: gate|up", l, QT_FP8_GU, as->dln, a->gu, a->ln2, o->wgu, d.C, 2 * d.F);
    qt_gpu_model_mark(g, "rmsnorm bwd");
    g->fam.norm_bwd(as->dres, QT_DT_F32, as->dres_bf, res_amax(g, l, QT_FP8_O), Gp(g, o->ln2), Gdt(g), as->dln,
                    a->res_mid, Wp(g, o->ln2), a->rstd2, N, d.C, g->ws, s);
    /* attention */
    dy = branch_dy(g, l, QT_FP8_O, a->po, a->rstd_pa); /* o_proj's output gradient */
    lin_bwd(g, "matmul bwd: o", l, QT_FP8_O, as->datt, dy, a->att, o->wo, d.HD, d.C);
    qt_gpu_model_mark(g, "attention bwd");
    attention_bwd(g, a, d, qt_model_layer_window(c, l));
    qt_gpu_model_mark(g, "rope");
    /* the abs-max of qkv's output gradient: from the last kernel that writes it (the q/k norm's, when there) */
    float *qkv_amax = fp8_amax(g, l, QT_FP8_QKV, 1);
    qt_rope_pos_bwd(as->dqkv, layer_cs(g, l), g->docs.pos, g->B, g->T, d.H, d.Hkv, d.D, c->qk_norm ? NULL : qkv_amax, s);
    if (c->qk_norm) {
        qt_gpu_model_mark(g, "qk norm bwd");
        g->fam.qknorm_bwd(as->dqkv, Gp(g, o->qknorm), Gdt(g), a->qk, Wp(g, o->qknorm), a->qk_rstd, N, d.H, d.Hkv, d.D,
                      qkv_amax, g->ws, s);
    }
    qt_gpu_model_mark(g, "bias grad");
    if (c->qkv_bias && Gp(g, o->bqkv)) qt_bias_bwd(Gp(g, o->bqkv), Gdt(g), as->dqkv, N, d.QKV, g->ws, s);
    lin_bwd(g, "matmul bwd: qkv", l, QT_FP8_QKV, as->dln, as->dqkv, a->ln1, o->wqkv, d.C, d.QKV);
    qt_gpu_model_mark(g, "rmsnorm bwd");
    g->fam.norm_bwd(as->dres, QT_DT_F32, l > 0 ? as->dres_bf : NULL, l > 0 ? res_amax(g, l - 1, QT_FP8_DOWN) : NULL,
                    Gp(g, o->ln1), Gdt(g), as->dln, a->res, Wp(g, o->ln1), a->rstd1, N, d.C, g->ws, s);
    qt_act_release(as, l);
    qt_param_release_grads(g->ps, h, o->ln1);
}

static void backward(qt_gpu_model *g, const qt_gpu_step_args *sa) {
    const qt_model_cfg *c = &g->L->cfg;
    qt_act_store *as = g->as;
    cudaStream_t s = g->stream;
    int nl = c->num_layers;
    acquire_back(g, sa->hooks, g->L->final_norm);
    qt_gpu_model_mark(g, "rmsnorm bwd");
    qt_zero(as->dres, (size_t)g->N * c->hidden_size * 4, s);
    g->fam.norm_bwd(as->dres, QT_DT_F32, as->dres_bf, res_amax(g, nl - 1, QT_FP8_DOWN), Gp(g, g->L->final_norm), Gdt(g),
                    as->dlnf, as->res_final, Wp(g, g->L->final_norm), as->rstdf, g->N, c->hidden_size, g->ws, s);
    qt_param_release_grads(g->ps, sa->hooks, g->L->final_norm); /* the untied LM head above it: lm_head() */
    for (int l = nl - 1; l >= 0; l--) block_backward(g, sa->hooks, l);
    if (!sa->skip_lookups && Gp(g, g->L->embed)) {
        qt_gpu_model_mark(g, "embedding bwd");
        qt_embedding_scaled_bwd(Gp(g, g->L->embed), Gdt(g), as->dres, QT_DT_F32, g->tok, g->N, c->hidden_size,
                                c->vocab_size, g->fam.embed_scale, g->ws, s);
    }
    qt_param_release_grads(g->ps, sa->hooks, 0);
}

void qt_gpu_model_step(qt_gpu_model *g, const qt_gpu_step_args *a) {
    /* without persistent quants the fp8 weights are rebuilt for every micro-batch (ZeRO-3: their abs-max
     * is taken at each layer's forward anyway); a frozen base's were made once, at creation */
    if (g->fp8_fwd && !g->pl->precision.persistent_quants && !from_slots(g) && g->ps) {
        qt_param_acquire_weights(g->ps, a->hooks, g->L->numel);
        qt_gpu_model_mark(g, "fp8 quantize: weights");
        qt_fp8_quantize_weights(g->fp8, g->L, g->ps->w, 0, g->L->cfg.num_layers, g->stream);
    }
    forward(g, a->hooks);
    lm_head(g, a->loss_scale, NULL, a->backward);
    if (a->backward) {
        qt_param_release_embed(g->ps, a->hooks);
        backward(g, a);
    }
    qt_gpu_model_profile_collect(g);
}

void qt_gpu_model_backward_rows(qt_gpu_model *g, const float *row_scale) {
    QT_CHECK(g->base, "qt_gpu_model_backward_rows: LoRA (a frozen base) only");
    qt_gpu_step_args a = {0.0f, 1, 0, NULL};
    lm_head(g, 0.0f, row_scale, 1);
    backward(g, &a);
    qt_gpu_model_profile_collect(g);
}

void qt_gpu_model_backward_rows_with(qt_gpu_model *g, const float *row_scale, const qt_gpu_step_args *a) {
    lm_head(g, 0.0f, row_scale, 1);
    qt_param_release_embed(g->ps, a->hooks);
    backward(g, a);
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
    if (on && !g->timing.prof) {
        g->timing.prof = calloc(1, sizeof *g->timing.prof);
        QT_CHECK(g->timing.prof, "out of host memory");
        for (int i = 0; i < PROF_EVENTS; i++) QT_CUDA(cudaEventCreate(&g->timing.prof->ev[i]));
    } else if (!on && g->timing.prof) {
        for (int i = 0; i < PROF_EVENTS; i++) QT_CUDA(cudaEventDestroy(g->timing.prof->ev[i]));
        free(g->timing.prof);
        g->timing.prof = NULL;
    }
}

void qt_gpu_model_mark(qt_gpu_model *g, const char *label) {
    struct qt_gpu_prof *p = g->timing.prof;
    if (!p || p->n == PROF_EVENTS) return;
    QT_CUDA(cudaEventRecord(p->ev[p->n], g->stream));
    p->at[p->n++] = label;
}

void qt_gpu_model_profile_collect(qt_gpu_model *g) {
    struct qt_gpu_prof *p = g->timing.prof;
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
    struct qt_gpu_prof *p = g->timing.prof;
    if (!p) return;
    double total = 0;
    for (int k = 0; k < p->nlabels; k++) total += p->ms[k];
    printf("time per optimizer step by op (CUDA events, %d steps):\n", steps);
    for (int k = 0; k < p->nlabels; k++)
        printf("  %-28s %8.2f ms  %5.1f%%\n", p->label[k], p->ms[k] / steps, 100 * p->ms[k] / total);
    printf("  %-28s %8.2f ms\n", "total", total / steps);
    memset(p->ms, 0, sizeof p->ms);
}

void qt_gpu_model_logits(qt_gpu_model *g, const qt_param_hooks *hooks, float *host) {
    const qt_model_cfg *c = &g->L->cfg;
    cudaStream_t s = g->stream;
    long chunk = (g->N + g->lm_chunks - 1) / g->lm_chunks;
    size_t V = c->vocab_size;
    forward(g, hooks);
    if (!host) {
        QT_CUDA(cudaStreamSynchronize(s));
        return;
    }
    uint16_t *tmp = malloc(chunk * V * 2);
    QT_CHECK(tmp, "out of host memory");
    for (long r0 = 0; r0 < g->N; r0 += chunk) {
        long n = g->N - r0 < chunk ? g->N - r0 : chunk;
        qt_matmul_fwd(g->mm, g->head.logits, QT_DT_BF16, (char *)g->as->lnf + r0 * c->hidden_size * 2, Wp(g, g->L->lm_head),
                      NULL, n, c->hidden_size, (int)V, 0, s);
        QT_CUDA(cudaMemcpyAsync(tmp, g->head.logits, n * V * 2, cudaMemcpyDeviceToHost, s));
        QT_CUDA(cudaStreamSynchronize(s));
        float cap = g->fam.logit_cap; /* the loss's logits: cap * tanh(x / cap) in fp32, as the loss kernel forms them */
        for (size_t i = 0; i < n * V; i++) {
            float x = qt_bf16_to_f32(tmp[i]);
            host[r0 * V + i] = cap > 0 ? cap * tanhf(x / cap) : x;
        }
    }
    free(tmp);
}
