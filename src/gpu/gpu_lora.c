/* gpu_lora.c — LoRA adapters on one GPU (qt_gpu_lora.h): their buffers in the model's memory plan, the module
 * kernels (cuda/lora.cu) called per site beside the base matmuls on the adapters' bf16 copy, and AdamW over the
 * adapter array (and lora.trainable's base tensors after it). */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_gpu_lora.h"
#include "qt_kernels.h"
#include "qt_lora_kernels.h"

qt_gpu_lora *qt_gpu_lora_create(const qt_layout *L, const qt_plan *pl, long N, char *err, size_t errlen) {
    if (pl->lora.rank <= 0) return NULL;
    qt_gpu_lora *gl = calloc(1, sizeof *gl);
    QT_CHECK(gl, "out of host memory");
    if (qt_lora_layout_init(&gl->A, &pl->lora, &L->cfg, err, errlen)) {
        free(gl);
        return NULL;
    }
    gl->N = N;
    gl->seed = pl->optimizer.seed;
    gl->step = -1;
    gl->L = L;
    gl->n = gl->A.numel;
    int tr = pl->lora.trainable;
    if (tr && L->cfg.tie_embeddings && (tr & (QT_LORA_X_EMBED | QT_LORA_X_LM_HEAD))) {
        qt_errf(err, errlen, "lora.trainable: embeddings and lm_head of a model with tied embeddings are not supported "
                "(PEFT's modules_to_save unties them); train norms only, or untie the model");
        qt_gpu_lora_free(gl);
        return NULL;
    }
    gl->xt = malloc(((size_t)L->n_tensors + 1) * sizeof *gl->xt);
    gl->xat = malloc(((size_t)L->n_tensors + 1) * sizeof *gl->xat);
    gl->x16 = calloc((size_t)L->n_tensors + 1, sizeof *gl->x16);
    QT_CHECK(gl->xt && gl->xat && gl->x16, "out of host memory");
    for (int i = 0; tr && i < L->n_tensors; i++)
        if (qt_lora_trains(&L->tensors[i], tr)) {
            gl->xat[gl->nxt] = gl->n;
            gl->xt[gl->nxt++] = i;
            gl->n += L->tensors[i].numel;
        }
    gl->xn = gl->n - gl->A.numel;
    return gl;
}

void qt_gpu_lora_carve(qt_gpu_lora *gl, qt_mem_plan *p) {
    size_t n = gl->n, nm = (size_t)gl->A.n_layers * gl->A.per_layer, r = (size_t)gl->A.cfg.rank;
    gl->a = qt_mem_plan_carve(p, "LoRA adapters (fp32)", n * 4);
    gl->ab = qt_mem_plan_carve(p, "LoRA adapters (bf16 copy)", gl->A.numel * 2);
    gl->ga = qt_mem_plan_carve(p, "LoRA gradients (fp32)", n * 4);
    gl->m = qt_mem_plan_carve(p, "LoRA adam m, v (fp32)", n * 4);
    gl->v = qt_mem_plan_carve(p, "LoRA adam m, v (fp32)", n * 4);
    gl->u = qt_mem_plan_carve(p, "LoRA activations (bf16)", nm * gl->N * r * 2);
    gl->g = qt_mem_plan_carve(p, "LoRA activations (bf16)", 3 * gl->N * r * 2);
    int in = 0;
    for (int i = 0; i < gl->A.per_layer; i++) /* every layer's modules are layer 0's */
        in = gl->A.mods[i].in > in ? gl->A.mods[i].in : in;
    size_t xs = qt_lora_ws_bytes(gl->N, in, gl->A.cfg.dropout);
    gl->xs = xs ? qt_mem_plan_carve(p, "LoRA activations (bf16)", xs) : NULL;
    gl->norm = qt_mem_plan_carve(p, "scratch: gradients", 4);
    gl->clip = qt_mem_plan_carve(p, "scratch: gradients", 4);
    gl->ws = qt_mem_plan_carve(p, "scratch: gradients", qt_grad_norm_ws_bytes());
}

/* The trained base tensors' fp32 weights from src into a[xat[i]..], a chunk at a time through host memory. */
static int init_extras(qt_gpu_lora *gl, const qt_weight_src *src, cudaStream_t s, char *err, size_t errlen) {
    size_t chunk = qt_weight_src_chunk(gl->L);
    float *h = gl->nxt ? malloc(chunk * sizeof *h) : NULL;
    QT_CHECK(h || !gl->nxt, "out of host memory for the trained base tensors' load buffer");
    for (int i = 0; i < gl->nxt; i++) {
        const qt_tensor *t = &gl->L->tensors[gl->xt[i]];
        for (size_t lo = 0; lo < t->numel; lo += chunk) {
            size_t c = t->numel - lo < chunk ? t->numel - lo : chunk;
            if (qt_weight_src_fill(src, t->offset + lo, c, h, err, errlen)) {
                free(h);
                return -1;
            }
            QT_CUDA(cudaMemcpyAsync(gl->a + gl->xat[i] + lo, h, c * 4, cudaMemcpyHostToDevice, s));
            QT_CUDA(cudaStreamSynchronize(s)); /* h is reused */
        }
    }
    free(h);
    return 0;
}

int qt_gpu_lora_init(qt_gpu_lora *gl, qt_matmul_ctx *mm, const struct qt_gpu_base *base, const qt_weight_src *src,
                     cudaStream_t s, char *err, size_t errlen) {
    size_t n = gl->A.numel;
    gl->mm = mm;
    float *h = malloc(n * sizeof *h);
    QT_CHECK(h, "out of host memory for %zu adapter parameters", n);
    qt_lora_init(&gl->A, h, gl->seed);
    QT_CUDA(cudaMemcpyAsync(gl->a, h, n * 4, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < gl->nxt; i++) gl->x16[i] = base->ops->w(base, gl->L->tensors[gl->xt[i]].offset);
    int rc = init_extras(gl, src, s, err, errlen);
    qt_gpu_lora_refresh(gl, s);
    qt_zero(gl->ga, gl->n * 4, s);
    qt_zero(gl->m, gl->n * 4, s);
    qt_zero(gl->v, gl->n * 4, s);
    QT_CUDA(cudaStreamSynchronize(s));
    free(h);
    return rc;
}

float *qt_gpu_lora_xgrad(const qt_gpu_lora *gl, size_t off) {
    for (int i = 0; i < gl->nxt; i++) {
        const qt_tensor *t = &gl->L->tensors[gl->xt[i]];
        if (off >= t->offset && off < t->offset + t->numel) return gl->ga + gl->xat[i] + (off - t->offset);
    }
    return NULL;
}

void qt_gpu_lora_refresh(qt_gpu_lora *gl, cudaStream_t s) {
    qt_cast_f32_to_bf16(gl->ab, gl->a, gl->A.numel, s);
    for (int i = 0; i < gl->nxt; i++)
        qt_cast_f32_to_bf16(gl->x16[i], gl->a + gl->xat[i], gl->L->tensors[gl->xt[i]].numel, s);
}

void qt_gpu_lora_free(qt_gpu_lora *gl) {
    if (!gl) return;
    qt_adamw_plan_free(gl->opt);
    qt_lora_layout_free(&gl->A);
    free(gl->xt), free(gl->xat), free(gl->x16);
    free(gl);
}

void qt_gpu_lora_set_batch(qt_gpu_lora *gl, long step, long micro) {
    gl->step = step;
    gl->micro = micro;
}

void qt_gpu_lora_set_on(qt_gpu_lora *gl, int on) { gl->off = !on; }

/* p and the mask seed of module md of layer l at the current batch (p 0 when evaluating). */
static float drop_p(const qt_gpu_lora *gl) { return gl->step < 0 ? 0.0f : gl->A.cfg.dropout; }
static uint64_t mseed(const qt_gpu_lora *gl, int l, const qt_lora_module *md) {
    return qt_lora_mask_seed(gl->seed, gl->step, gl->micro, l, md->target);
}

/* The bf16 copy of adapter tensor offset off (A or B of a module). */
static const void *ab(const qt_gpu_lora *gl, size_t off) { return (const char *)gl->ab + off * 2; }
/* Module i's u [N, r] (bf16), and the site's j-th module's g [N, r] (bf16). */
static void *u_of(const qt_gpu_lora *gl, int i) { return (char *)gl->u + (size_t)i * gl->N * gl->A.cfg.rank * 2; }
static void *g_of(const qt_gpu_lora *gl, int j) { return (char *)gl->g + (size_t)j * gl->N * gl->A.cfg.rank * 2; }

void qt_gpu_lora_fwd(qt_gpu_lora *gl, int l, int site, const void *x, void *y, cudaStream_t s) {
    if (gl->off) return;
    int r = gl->A.cfg.rank;
    for (int i = l * gl->A.per_layer; i < (l + 1) * gl->A.per_layer; i++) {
        const qt_lora_module *md = &gl->A.mods[i];
        if ((int)md->site != site) continue;
        qt_lora_down_fwd(gl->mm, u_of(gl, i), gl->xs, x, ab(gl, md->a), gl->N, md->in, r, drop_p(gl), mseed(gl, l, md), s);
        qt_lora_up_fwd(gl->mm, y, u_of(gl, i), ab(gl, md->b), gl->N, md->out, r, md->out_row0, md->out_ld, gl->A.scale, s);
    }
}

void qt_gpu_lora_bwd_w(qt_gpu_lora *gl, int l, int site, const void *x, const void *dy, cudaStream_t s) {
    QT_CHECK(!gl->off, "LoRA backward with the adapters switched off (the last forward kept no adapter activations)");
    int r = gl->A.cfg.rank, j = 0;
    for (int i = l * gl->A.per_layer; i < (l + 1) * gl->A.per_layer; i++) {
        const qt_lora_module *md = &gl->A.mods[i];
        if ((int)md->site != site) continue;
        qt_lora_bwd_w(gl->mm, g_of(gl, j++), gl->ga + md->a, gl->ga + md->b, gl->xs, dy, u_of(gl, i), x, ab(gl, md->b),
                      gl->N, md->in, md->out, r, md->out_row0, md->out_ld, gl->A.scale, drop_p(gl), mseed(gl, l, md), s);
    }
}

void qt_gpu_lora_bwd_a(qt_gpu_lora *gl, int l, int site, const void *x, cudaStream_t s) {
    int r = gl->A.cfg.rank, j = 0;
    for (int i = l * gl->A.per_layer; i < (l + 1) * gl->A.per_layer; i++) {
        const qt_lora_module *md = &gl->A.mods[i];
        if ((int)md->site != site) continue;
        qt_lora_bwd_a(gl->mm, gl->ga + md->a, gl->xs, g_of(gl, j++), x, gl->N, md->in, r, drop_p(gl), mseed(gl, l, md), s);
    }
}

void qt_gpu_lora_bwd_x(qt_gpu_lora *gl, int l, int site, void *dx, cudaStream_t s) {
    int r = gl->A.cfg.rank, j = 0;
    for (int i = l * gl->A.per_layer; i < (l + 1) * gl->A.per_layer; i++) {
        const qt_lora_module *md = &gl->A.mods[i];
        if ((int)md->site != site) continue;
        qt_lora_bwd_x(gl->mm, dx, gl->xs, g_of(gl, j++), ab(gl, md->a), gl->N, md->in, r, drop_p(gl), mseed(gl, l, md), s);
    }
}

void qt_gpu_lora_opt_step(qt_gpu_lora *gl, const qt_plan_optimizer *o, float lr, long t, cudaStream_t s) {
    if (!gl->opt) { /* the table once: every adapter decays by weight_decay, the trained base tensors as the CPU's */
        int nt = gl->A.n_tensors + gl->nxt;
        qt_adamw_tensor *tt = malloc((size_t)nt * sizeof *tt);
        QT_CHECK(tt, "out of host memory");
        for (int i = 0; i < gl->A.n_tensors; i++)
            tt[i] = (qt_adamw_tensor){gl->A.tensors[i].offset, gl->A.tensors[i].numel, o->weight_decay,
                                      gl->A.tensors[i].offset, 0};
        for (int i = 0; i < gl->nxt; i++) {
            const qt_tensor *x = &gl->L->tensors[gl->xt[i]];
            int decay = o->decay_embeddings && (x->kind == QT_T_EMBED || x->kind == QT_T_LM_HEAD);
            tt[gl->A.n_tensors + i] = (qt_adamw_tensor){gl->xat[i], x->numel, decay ? o->weight_decay : 0.0f, gl->xat[i], 0};
        }
        gl->opt = qt_adamw_plan_create(tt, nt);
        free(tt);
    }
    qt_grad_norm(gl->norm, gl->clip, gl->ga, QT_DT_F32, gl->n, o->grad_clip, gl->ws, s);
    qt_adamw_args a = {lr, o->beta1, o->beta2, o->eps, t, o->seed, 0, 0, 0, NULL};
    qt_adamw_step(gl->opt, NULL, gl->a, gl->ga, QT_DT_F32, gl->m, QT_DT_F32, gl->v, QT_DT_F32, gl->clip, NULL, &a, s);
    qt_gpu_lora_refresh(gl, s);
    qt_zero(gl->ga, gl->n * 4, s);
}
