/* cpu_model.c — the Llama/Qwen2/Gemma 3 forward and backward on the CPU in fp32, composed of qt_ref ops.
 *
 * Activations for N = B*T tokens; forward keeps per layer the block input and the mid-block residual
 * (both RMSNorm inputs), the norm outputs and rstd, qkv after RoPE (with qk_norm also the matmul's output
 * and the heads' rstd), attention out and lse, gate|up
 * and the SwiGLU output; then the final norm and the logits. Gemma 3 (docs/models-gemma3.md) also keeps the
 * o_proj and down_proj outputs and the rstd of their post-norms, and its norms scale by 1 + w; with a logit cap
 * the raw logits are kept beside the capped ones. Backward writes dlogits over the logits
 * and accumulates weight gradients straight into grad (the CE scale is grad_scale, the weight of one
 * target; the caller divides by the target count it averages over). An adapter (LoRA) may sit beside the
 * four block matmuls: it adds into their outputs and into their inputs' gradients; with grad NULL the base
 * takes no gradient at all. */
#include "qt_cpu_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_ref.h"
#include "qt_rope.h"

typedef struct {
    float *x, *mid;        /* [N,C] block input, residual after attention */
    float *ln1, *ln2;      /* [N,C] norm outputs */
    float *rstd1, *rstd2;  /* [N] */
    float *qkv;            /* [N,(H+2Hkv)D] after rope */
    float *att, *lse;      /* [N,H*D], [B,H,T] */
    float *gu, *sw;        /* [N,2F], [N,F] */
    float *qkx, *qkrstd;   /* qk_norm: [N,(H+2Hkv)D] qkv matmul output (the norm's input), [N,H+Hkv]; else NULL */
    float *po, *pm;        /* gemma3: [N,C] o_proj and down_proj outputs (the post-norms' inputs); else NULL */
    float *rstd_pa, *rstd_pf; /* gemma3: [N] their rstd */
} layer_acts;

struct qt_cpu_model {
    const qt_layout *L;
    int B, T;
    long N;
    layer_acts *la;
    float *xf;             /* [N,C] output of the last block */
    float *lnf, *rstdf;    /* [N,C], [N] */
    float *logits;         /* [N,V] (soft-capped when the model caps); dlogits after backward */
    float *raw;            /* [N,V] the LM head's output before the cap; NULL without a cap */
    float *losses;         /* [N] */
    int32_t *tokens, *targets;
    long n_targets;        /* rows with target >= 0 in the last forward */
    int has_targets;
    /* backward scratch */
    float *dres, *dln, *datt, *dqkv, *dgu, *dsw;
    double *rope_inv_freq; /* [head_dim/2], and the cos/sin factor: qt_rope_inv_freq at T */
    double rope_attn;
    double *rope_local_inv_freq; /* the local layers' (rope_local_theta > 0), else NULL */
    double rope_local_attn;
    int32_t *kv_lo, *pos;  /* [N] per-document key bounds and RoPE positions (qt_cpu_model_set_docs), or NULL */
    qt_cpu_adapter *ad;    /* beside the block matmuls (LoRA), or NULL */
    unsigned grads;        /* QT_CPU_GRAD_* bits: the base tensors backward writes gradients for */
};

static float *falloc(long n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    QT_CHECK(p, "out of memory allocating %ld floats of CPU activations", n);
    return p;
}

size_t qt_cpu_model_bytes(const qt_layout *L, int B, int T) {
    const qt_model_cfg *c = &L->cfg;
    size_t N = (size_t)B * T, C = c->hidden_size, HD = (size_t)c->num_heads * c->head_dim, F = c->intermediate_size;
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    size_t layer = 4 * N * C + 2 * N + N * QKV + N * HD + (size_t)B * c->num_heads * T + 3 * N * F;
    if (c->qk_norm) layer += N * QKV + N * (size_t)(c->num_heads + c->num_kv_heads);
    if (qt_model_is_gemma(c)) layer += 2 * N * C + 2 * N;
    size_t rest = 2 * N * C + 2 * N + N * c->vocab_size + 2 * N * C + N * HD + N * QKV + 3 * N * F;
    if (c->logit_softcap > 0) rest += N * c->vocab_size;
    return 4 * (c->num_layers * layer + rest) + 2 * N * sizeof(int32_t); /* floats, then tokens and targets */
}

qt_cpu_model *qt_cpu_model_create(const qt_layout *L, int B, int T) {
    const qt_model_cfg *c = &L->cfg;
    QT_CHECK(B > 0 && T > 0 && T <= c->max_seq_len, "cpu model: B=%d, T=%d (max_seq_len %d)", B, T, c->max_seq_len);
    qt_cpu_model *m = calloc(1, sizeof *m);
    QT_CHECK(m, "out of memory");
    long N = (long)B * T, C = c->hidden_size, HD = (long)c->num_heads * c->head_dim;
    long QKV = (long)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim, F = c->intermediate_size;
    m->L = L;
    m->grads = QT_CPU_GRAD_ALL;
    m->B = B;
    m->T = T;
    m->N = N;
    m->rope_inv_freq = malloc((size_t)(c->head_dim / 2 + 1) * sizeof *m->rope_inv_freq);
    QT_CHECK(m->rope_inv_freq, "out of memory");
    qt_rope_inv_freq(c, T, m->rope_inv_freq, &m->rope_attn);
    if (c->rope_local_theta > 0) {
        int l = 0; /* a local layer's config: its own base, the default RoPE */
        while (l < c->num_layers && !qt_model_layer_local(c, l)) l++;
        qt_model_cfg lc = qt_model_layer_rope(c, l < c->num_layers ? l : 0);
        m->rope_local_inv_freq = malloc((size_t)(c->head_dim / 2 + 1) * sizeof *m->rope_local_inv_freq);
        QT_CHECK(m->rope_local_inv_freq, "out of memory");
        qt_rope_inv_freq(&lc, T, m->rope_local_inv_freq, &m->rope_local_attn);
    }
    m->la = calloc((size_t)c->num_layers, sizeof *m->la);
    QT_CHECK(m->la, "out of memory");
    for (int l = 0; l < c->num_layers; l++) {
        layer_acts *a = &m->la[l];
        a->x = falloc(N * C);
        a->mid = falloc(N * C);
        a->ln1 = falloc(N * C);
        a->ln2 = falloc(N * C);
        a->rstd1 = falloc(N);
        a->rstd2 = falloc(N);
        a->qkv = falloc(N * QKV);
        a->att = falloc(N * HD);
        a->lse = falloc((long)B * c->num_heads * T);
        a->gu = falloc(N * 2 * F);
        a->sw = falloc(N * F);
        if (c->qk_norm) {
            a->qkx = falloc(N * QKV);
            a->qkrstd = falloc(N * (c->num_heads + c->num_kv_heads));
        }
        if (qt_model_is_gemma(c)) {
            a->po = falloc(N * C);
            a->pm = falloc(N * C);
            a->rstd_pa = falloc(N);
            a->rstd_pf = falloc(N);
        }
    }
    m->xf = falloc(N * C);
    m->lnf = falloc(N * C);
    m->rstdf = falloc(N);
    m->logits = falloc(N * c->vocab_size);
    if (c->logit_softcap > 0) m->raw = falloc(N * c->vocab_size);
    m->losses = falloc(N);
    m->tokens = malloc((size_t)N * sizeof *m->tokens);
    m->targets = malloc((size_t)N * sizeof *m->targets);
    QT_CHECK(m->tokens && m->targets, "out of memory");
    m->dres = falloc(N * C);
    m->dln = falloc(N * C);
    m->datt = falloc(N * HD);
    m->dqkv = falloc(N * QKV);
    m->dgu = falloc(N * 2 * F);
    m->dsw = falloc(N * F);
    return m;
}

void qt_cpu_model_free(qt_cpu_model *m) {
    if (!m) return;
    for (int l = 0; l < m->L->cfg.num_layers; l++) {
        layer_acts *a = &m->la[l];
        float *p[] = {a->x,   a->mid, a->ln1, a->ln2, a->rstd1, a->rstd2, a->qkv,
                      a->att, a->lse, a->gu,  a->sw,  a->qkx,   a->qkrstd, a->po, a->pm, a->rstd_pa, a->rstd_pf};
        for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
    }
    free(m->la);
    float *p[] = {m->xf, m->lnf, m->rstdf, m->logits, m->losses, m->dres, m->dln, m->datt, m->dqkv, m->dgu,
                  m->dsw, m->raw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
    free(m->tokens);
    free(m->targets);
    free(m->rope_inv_freq);
    free(m->rope_local_inv_freq);
    free(m->kv_lo);
    free(m->pos);
    free(m);
}

/* Layer l's RoPE table: the local one on a local layer of a model with rope_local_theta. */
static const double *layer_inv_freq(const qt_cpu_model *m, int l, double *attn) {
    int local = m->rope_local_inv_freq && qt_model_layer_local(&m->L->cfg, l);
    *attn = local ? m->rope_local_attn : m->rope_attn;
    return local ? m->rope_local_inv_freq : m->rope_inv_freq;
}

/* A norm of the model's form: x / rms(x) * w, or * (1 + w) for Gemma. */
static void norm_fwd(const qt_model_cfg *c, float *y, float *rstd, const float *x, const float *w, long N) {
    if (qt_model_is_gemma(c)) qt_ref_rmsnorm1p_fwd(y, rstd, x, w, N, c->hidden_size, c->rms_norm_eps);
    else qt_ref_rmsnorm_fwd(y, rstd, x, w, N, c->hidden_size, c->rms_norm_eps);
}

static void norm_bwd(const qt_model_cfg *c, float *dx, float *dw, const float *dy, const float *x, const float *w,
                     const float *rstd, long N) {
    if (qt_model_is_gemma(c)) qt_ref_rmsnorm1p_bwd(dx, dw, dy, x, w, rstd, N, c->hidden_size);
    else qt_ref_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, c->hidden_size);
}

/* res[N,C] = base + branch, or with a post-norm (Gemma's sandwich) base + norm(branch)  (=) */
static void residual_fwd(const qt_model_cfg *c, float *res, float *rstd, const float *base, const float *branch,
                         const float *w, size_t post, long N) {
    if (post != SIZE_MAX) norm_fwd(c, res, rstd, branch, w + post, N);
    else if (res != branch) memcpy(res, branch, (size_t)N * c->hidden_size * sizeof *res);
    qt_ref_add_inplace(res, base, N * (long)c->hidden_size);
}

/* One block: a->x in, out[N,C] = the block's output residual stream. */
static void block_fwd(qt_cpu_model *m, const float *w, int l, float *out) {
    const qt_model_cfg *c = &m->L->cfg;
    const qt_layer_offsets *o = &m->L->layers[l];
    layer_acts *a = &m->la[l];
    long N = m->N;
    int C = c->hidden_size, H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim, F = c->intermediate_size;
    int HD = H * D, QKV = (H + 2 * Hkv) * D;
    int gemma = qt_model_is_gemma(c);
    norm_fwd(c, a->ln1, a->rstd1, a->x, w + o->ln1, N);
    float *qkv = a->qkx ? a->qkx : a->qkv; /* with qk_norm, the norm writes a->qkv from the kept matmul output */
    qt_ref_matmul_fwd(qkv, a->ln1, w + o->wqkv, o->bqkv == SIZE_MAX ? NULL : w + o->bqkv, N, C, QKV);
    if (m->ad) m->ad->fwd(m->ad, l, QT_CPU_SITE_QKV, a->ln1, qkv, N);
    if (a->qkx && gemma) qt_ref_qknorm1p_fwd(a->qkv, a->qkrstd, a->qkx, w + o->qknorm, N, H, Hkv, D, c->rms_norm_eps);
    else if (a->qkx) qt_ref_qknorm_fwd(a->qkv, a->qkrstd, a->qkx, w + o->qknorm, N, H, Hkv, D, c->rms_norm_eps);
    double attn;
    const double *inv_freq = layer_inv_freq(m, l, &attn);
    qt_ref_rope_pos_fwd(a->qkv, m->B, m->T, H, Hkv, D, m->pos, inv_freq, attn);
    qt_ref_attention_scaled_fwd(a->att, a->lse, a->qkv, m->B, m->T, H, Hkv, D, qt_model_layer_window(c, l), m->kv_lo,
                                qt_model_attn_scale(c));
    float *po = gemma ? a->po : a->mid; /* the o_proj output: kept for the post-norm, else summed in place */
    qt_ref_matmul_fwd(po, a->att, w + o->wo, NULL, N, HD, C);
    if (m->ad) m->ad->fwd(m->ad, l, QT_CPU_SITE_O, a->att, po, N);
    residual_fwd(c, a->mid, a->rstd_pa, a->x, po, w, o->post_attn, N);
    norm_fwd(c, a->ln2, a->rstd2, a->mid, w + o->ln2, N);
    qt_ref_matmul_fwd(a->gu, a->ln2, w + o->wgu, NULL, N, C, 2 * F);
    if (m->ad) m->ad->fwd(m->ad, l, QT_CPU_SITE_GU, a->ln2, a->gu, N);
    if (gemma) qt_ref_geglu_fwd(a->sw, a->gu, N, F);
    else qt_ref_swiglu_fwd(a->sw, a->gu, N, F);
    float *pm = gemma ? a->pm : out;
    qt_ref_matmul_fwd(pm, a->sw, w + o->wdown, NULL, N, F, C);
    if (m->ad) m->ad->fwd(m->ad, l, QT_CPU_SITE_DOWN, a->sw, pm, N);
    residual_fwd(c, out, a->rstd_pf, a->mid, pm, w, o->post_ffn, N);
}

float qt_cpu_model_forward(qt_cpu_model *m, const float *w, const int32_t *tokens, const int32_t *targets) {
    const qt_model_cfg *c = &m->L->cfg;
    long N = m->N;
    int C = c->hidden_size, V = c->vocab_size, nl = c->num_layers;
    for (long n = 0; n < N; n++)
        QT_CHECK(tokens[n] >= 0 && tokens[n] < V, "token %d at %ld outside the vocabulary [0, %d)", tokens[n], n, V);
    memcpy(m->tokens, tokens, (size_t)N * sizeof *tokens);
    if (qt_model_is_gemma(c))
        qt_ref_embedding_scaled_fwd(m->la[0].x, tokens, w + m->L->embed, N, C, qt_ref_embed_scale(C, 0));
    else qt_ref_embedding_fwd(m->la[0].x, tokens, w + m->L->embed, N, C);
    for (int l = 0; l < nl; l++) block_fwd(m, w, l, l + 1 < nl ? m->la[l + 1].x : m->xf);
    norm_fwd(c, m->lnf, m->rstdf, m->xf, w + m->L->final_norm, N);
    float cap = c->logit_softcap, *raw = m->raw ? m->raw : m->logits;
    qt_ref_matmul_fwd(raw, m->lnf, w + m->L->lm_head, NULL, N, C, V);
    if (m->raw) { /* the capped logits, for the caller: cap * tanh(raw / cap) in fp32, the loss's value */
        for (long i = 0; i < N * (long)V; i++) m->logits[i] = cap * tanhf(raw[i] / cap);
    }
    m->has_targets = targets != NULL;
    m->n_targets = 0;
    if (!targets) return 0;
    memcpy(m->targets, targets, (size_t)N * sizeof *targets);
    qt_ref_cross_entropy_capped_fwd(m->losses, raw, targets, N, V, cap);
    double sum = 0; /* sequential: the loss must not depend on the thread count */
    for (long n = 0; n < N; n++)
        if (targets[n] >= 0) {
            sum += m->losses[n];
            m->n_targets++;
        }
    return m->n_targets ? (float)(sum / m->n_targets) : 0.0f;
}

/* The gradient of a residual branch from m->dres, the residual's: dres itself without a post-norm; with one
 * (Gemma) the norm's backward into m->dln (zeroed first: the norm's dx accumulates), its weight gradient into dw
 * (NULL: a frozen norm). */
static const float *post_bwd(qt_cpu_model *m, const float *w, float *dw, size_t post, const float *x,
                             const float *rstd) {
    if (post == SIZE_MAX) return m->dres;
    memset(m->dln, 0, (size_t)m->N * m->L->cfg.hidden_size * sizeof *m->dln);
    norm_bwd(&m->L->cfg, m->dln, dw, m->dres, x, w + post, rstd, m->N);
    return m->dln;
}

/* One block backward: m->dres holds d(block output) on entry and d(block input) on return. */
static void block_bwd(qt_cpu_model *m, const float *w, float *grad, int l) {
    const qt_model_cfg *c = &m->L->cfg;
    const qt_layer_offsets *o = &m->L->layers[l];
    layer_acts *a = &m->la[l];
    long N = m->N;
    int C = c->hidden_size, H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim, F = c->intermediate_size;
    int HD = H * D, QKV = (H + 2 * Hkv) * D;
    qt_cpu_adapter *ad = m->ad;
#define G(off) (grad && (m->grads & QT_CPU_GRAD_LINEAR) ? grad + (off) : NULL)
#define GN(off) (grad && (m->grads & QT_CPU_GRAD_NORMS) ? grad + (off) : NULL)
    int gemma = qt_model_is_gemma(c);
    /* MLP: out = mid + [post_ffn norm](down(swiglu|geglu(gate|up(norm2(mid))))) */
    const float *dm = post_bwd(m, w, o->post_ffn == SIZE_MAX ? NULL : GN(o->post_ffn), o->post_ffn, a->pm, a->rstd_pf);
    qt_ref_matmul_bwd(m->dsw, G(o->wdown), NULL, dm, a->sw, w + o->wdown, N, F, C);
    if (ad) ad->bwd(ad, l, QT_CPU_SITE_DOWN, a->sw, dm, m->dsw, N);
    if (gemma) qt_ref_geglu_bwd(m->dgu, m->dsw, a->gu, N, F);
    else qt_ref_swiglu_bwd(m->dgu, m->dsw, a->gu, N, F);
    qt_ref_matmul_bwd(m->dln, G(o->wgu), NULL, m->dgu, a->ln2, w + o->wgu, N, C, 2 * F);
    if (ad) ad->bwd(ad, l, QT_CPU_SITE_GU, a->ln2, m->dgu, m->dln, N);
    norm_bwd(c, m->dres, GN(o->ln2), m->dln, a->mid, w + o->ln2, a->rstd2, N);
    /* attention: mid = x + [post_attn norm](o_proj(attn(rope(qkv(norm1(x)))))) */
    const float *dpo = post_bwd(m, w, o->post_attn == SIZE_MAX ? NULL : GN(o->post_attn), o->post_attn, a->po, a->rstd_pa);
    qt_ref_matmul_bwd(m->datt, G(o->wo), NULL, dpo, a->att, w + o->wo, N, HD, C);
    if (ad) ad->bwd(ad, l, QT_CPU_SITE_O, a->att, dpo, m->datt, N);
    qt_ref_attention_scaled_bwd(m->dqkv, m->datt, a->qkv, a->att, a->lse, m->B, m->T, H, Hkv, D,
                                qt_model_layer_window(c, l), m->kv_lo, qt_model_attn_scale(c));
    double attn;
    const double *inv_freq = layer_inv_freq(m, l, &attn);
    qt_ref_rope_pos_bwd(m->dqkv, m->B, m->T, H, Hkv, D, m->pos, inv_freq, attn);
    if (a->qkx && gemma)
        qt_ref_qknorm1p_bwd(m->dqkv, GN(o->qknorm), m->dqkv, a->qkx, w + o->qknorm, a->qkrstd, N, H, Hkv, D);
    else if (a->qkx)
        qt_ref_qknorm_bwd(m->dqkv, GN(o->qknorm), m->dqkv, a->qkx, w + o->qknorm, a->qkrstd, N, H, Hkv, D);
    qt_ref_matmul_bwd(m->dln, G(o->wqkv), o->bqkv == SIZE_MAX ? NULL : G(o->bqkv), m->dqkv, a->ln1,
                      w + o->wqkv, N, C, QKV);
    if (ad) ad->bwd(ad, l, QT_CPU_SITE_QKV, a->ln1, m->dqkv, m->dln, N);
    norm_bwd(c, m->dres, GN(o->ln1), m->dln, a->x, w + o->ln1, a->rstd1, N);
#undef G
#undef GN
}

/* The backward from dlogits (written over m->logits) down to the embedding. */
static void backward_from_dlogits(qt_cpu_model *m, const float *w, float *grad) {
    const qt_model_cfg *c = &m->L->cfg;
    long N = m->N;
    int C = c->hidden_size, V = c->vocab_size;
    /* tied: the LM head's dw lands on the embedding rows, which embedding_bwd adds to as well */
    unsigned k = grad ? m->grads : 0;
    qt_ref_matmul_bwd(m->dln, k & QT_CPU_GRAD_LM_HEAD ? grad + m->L->lm_head : NULL, NULL, m->logits, m->lnf,
                      w + m->L->lm_head, N, C, V);
    memset(m->dres, 0, (size_t)N * C * sizeof *m->dres);
    norm_bwd(c, m->dres, k & QT_CPU_GRAD_NORMS ? grad + m->L->final_norm : NULL, m->dln, m->xf, w + m->L->final_norm,
             m->rstdf, N);
    for (int l = c->num_layers - 1; l >= 0; l--) block_bwd(m, w, grad, l);
    if (k & QT_CPU_GRAD_EMBED) {
        if (qt_model_is_gemma(c)) /* every row, token 0 (Gemma's pad) included: docs/models-gemma3.md */
            qt_ref_embedding_scaled_bwd(grad + m->L->embed, m->dres, m->tokens, N, C, V, qt_ref_embed_scale(C, 0));
        else qt_ref_embedding_bwd(grad + m->L->embed, m->dres, m->tokens, N, C, V);
    }
}

void qt_cpu_model_backward(qt_cpu_model *m, const float *w, float *grad, float grad_scale) {
    QT_CHECK(m->has_targets, "qt_cpu_model_backward: the last forward had no targets");
    const qt_model_cfg *c = &m->L->cfg;
    if (m->n_targets == 0) return; /* no target: the loss is constant 0 */
    /* d w.r.t. the raw logits (through the cap when there is one) */
    qt_ref_cross_entropy_capped_bwd(m->logits, m->raw ? m->raw : m->logits, m->targets, m->N, c->vocab_size, grad_scale,
                                    c->logit_softcap);
    backward_from_dlogits(m, w, grad);
}

void qt_cpu_model_backward_rows(qt_cpu_model *m, const float *w, float *grad, const float *row_scale) {
    QT_CHECK(m->has_targets, "qt_cpu_model_backward_rows: the last forward had no targets");
    const qt_model_cfg *c = &m->L->cfg;
    long TV = (long)m->T * c->vocab_size;
    if (m->n_targets == 0) return;
    for (int b = 0; b < m->B; b++)
        qt_ref_cross_entropy_capped_bwd(m->logits + b * TV, (m->raw ? m->raw : m->logits) + b * TV, m->targets + (long)b * m->T,
                                        m->T, c->vocab_size, row_scale[b], c->logit_softcap);
    backward_from_dlogits(m, w, grad);
}

int qt_cpu_model_set_docs(qt_cpu_model *m, const qt_docs *d, char *err, size_t errlen) {
    free(m->kv_lo);
    free(m->pos);
    m->kv_lo = m->pos = NULL;
    if (!d || (!d->attention && !d->positions)) return 0;
    size_t bytes = (size_t)m->N * sizeof(int32_t);
    int rc = 0;
    if ((d->attention && !(m->kv_lo = malloc(bytes))) || (d->positions && !(m->pos = malloc(bytes))))
        rc = qt_errf(err, errlen, "out of memory for %ld document positions", m->N);
    if (rc == 0) rc = qt_docs_expand(d, m->B, m->T, m->kv_lo, m->pos, err, errlen);
    if (rc) {
        free(m->kv_lo);
        free(m->pos);
        m->kv_lo = m->pos = NULL;
    }
    return rc;
}

void qt_cpu_model_set_adapter(qt_cpu_model *m, qt_cpu_adapter *ad) { m->ad = ad; }

void qt_cpu_model_set_grads(qt_cpu_model *m, unsigned kinds) { m->grads = kinds; }

const float *qt_cpu_model_logits(const qt_cpu_model *m) { return m->logits; }

long qt_cpu_model_targets(const qt_cpu_model *m) { return m->n_targets; }

const float *qt_cpu_model_token_losses(const qt_cpu_model *m) { return m->losses; }
