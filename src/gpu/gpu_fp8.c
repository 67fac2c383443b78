/* gpu_fp8.c — the transformer blocks' four linear layers in fp8 through cuBLASLt (TN only on Hopper).
 *
 * Every operand handed to qt_matmul_fp8 is K-major (row-major with the contracted dimension as the
 * row), which is cuBLASLt's "TN"; the quantize-transpose kernel produces the transposed copies, so no
 * separate transpose runs:
 *   fwd    Y[N,O]  = Xq[N,I]    . (Wq[O,I])^T          A = Xq   (K=I)   B = Wq    M=N  N=O  K=I
 *   dgrad  dX[N,I] = dYq[N,O]   . (Wq^T[I,O])^T        A = dYq  (K=O)   B = Wq^T  M=N  N=I  K=O
 *   wgrad  dW[O,I] += dYq^T[O,N] . (Xq^T[I,N])^T       A = dYq^T (K=N)  B = Xq^T  M=O  N=I  K=N
 * Wq, Wq^T: one quantize-transpose of W[O,I] per optimizer step (persistent quants, shared by all
 * micro-batches). With memory.fp8_weight_cache: none they live in QT_FP8_WSLOTS layer slots instead:
 * qt_fp8_quantize_weights then takes only the abs-max, and qt_fp8_use_weights quantizes each layer
 * into its slot right before use (Wq for the forward, Wq^T for the backward) from that record. Xq, Xq^T: one quantize-transpose of the bf16 input in the forward; Xq^T stays for the
 * wgrad. dYq, dYq^T: one quantize-transpose of the bf16 output gradient in grad_dt (e4m3 / e5m2); without
 * a weight gradient (a frozen base: LoRA's dgrad only) dYq alone, by the plain quantize.
 * Scaling: per-tensor current scaling (qt_quant.h). The abs-max of a block input or output gradient
 * comes from the kernel that produced the tensor (RMSNorm, SwiGLU, RoPE bwd fold it into the slot of
 * qt_fp8_producer_amax, zeroed once per micro-step by qt_fp8_reset_amax) or, where no producer did
 * (the cuDNN attention output, the weights), from a separate abs-max pass. The scale is derived on
 * the device inside the quantize launch; the GEMMs read &sc->descale through cuBLASLt's scale
 * pointers, so nothing reaches the host. Output bf16 (fwd, dgrad) or accumulated into the gradients
 * (wgrad: beta = 1 into fp32, or into bf16 rounded once, RNE, per accumulation), fp32 accumulation throughout. Fast accumulation only where K is a feature
 * dimension (fwd, dgrad); the wgrad contracts over all N tokens and keeps the periodic fp32 promotion.
 * A NaN/Inf abs-max sets *nonfinite to the tensor's tag (first one wins), read once per optimizer step. */
#include "qt_gpu_fp8.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_kernels.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_test_hooks.h"

#define AL 256 /* sub-buffer alignment inside the regions */
#define NSC 3  /* scale records per matmul: weight, input, output gradient */

enum { SC_W = 0, SC_X = 1, SC_DY = 2 };

static const char *MM_NAME[QT_FP8_NMM] = {"qkv", "o_proj", "gate|up", "down"};
static const char *SC_NAME[NSC] = {"weight", "input activation", "output gradient"};

static size_t up(size_t b) { return (b + AL - 1) / AL * AL; }

static void dims(const qt_model_cfg *c, int in[QT_FP8_NMM], int out[QT_FP8_NMM]) {
    int C = c->hidden_size, F = c->intermediate_size, HD = c->num_heads * c->head_dim;
    int QKV = (c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    in[QT_FP8_QKV] = C, out[QT_FP8_QKV] = QKV;
    in[QT_FP8_O] = HD, out[QT_FP8_O] = C;
    in[QT_FP8_GU] = C, out[QT_FP8_GU] = 2 * F;
    in[QT_FP8_DOWN] = F, out[QT_FP8_DOWN] = C;
}

static int max4(const int v[QT_FP8_NMM]) {
    int m = 0;
    for (int k = 0; k < QT_FP8_NMM; k++) m = v[k] > m ? v[k] : m;
    return m;
}

static size_t scale_bytes(const qt_model_cfg *c) {
    return up((size_t)c->num_layers * QT_FP8_NMM * NSC * sizeof(qt_fp8_scale)) + up(sizeof(int));
}

/* Layers whose Wq, Wq^T have their own buffers: all, or the transient slots. */
static int wbufs(const qt_model_cfg *c, qt_fp8_wcache wc) {
    return wc == QT_FP8_WCACHE_NONE && c->num_layers > QT_FP8_WSLOTS ? QT_FP8_WSLOTS : c->num_layers;
}

size_t qt_fp8_weight_bytes(const qt_model_cfg *c, qt_fp8_wcache wc) {
    int in[QT_FP8_NMM], out[QT_FP8_NMM];
    dims(c, in, out);
    size_t b = scale_bytes(c);
    for (int k = 0; k < QT_FP8_NMM; k++) b += 2 * up((size_t)in[k] * out[k]) * wbufs(c, wc);
    return b;
}

size_t qt_fp8_act_bytes(const qt_model_cfg *c, long N, qt_dtype grad_dt, unsigned xq_shared, int wgrad) {
    int in[QT_FP8_NMM], out[QT_FP8_NMM];
    dims(c, in, out);
    size_t b = up((size_t)N * max4(in)); /* Xq scratch */
    for (int k = 0; k < QT_FP8_NMM; k++) b += up((size_t)N * in[k]) * (xq_shared >> k & 1 ? 1 : c->num_layers);
    if (grad_dt != QT_DT_BF16) b += (wgrad ? 2 : 1) * up((size_t)N * max4(out)); /* dYq (and dYq^T for the wgrad) */
    return b;
}

int qt_fp8_check(const qt_model_cfg *c, const char *path, long N, int cc, char *err, size_t errlen) {
    if (cc < 89) {
        snprintf(err, errlen,
                 "%s: precision.matmul_dtype: e4m3 needs fp8 tensor cores (compute capability >= 8.9, e.g. "
                 "Ada/Hopper); this GPU has cc %d.%d: use bf16",
                 path, cc / 10, cc % 10);
        return -1;
    }
    int in[QT_FP8_NMM], out[QT_FP8_NMM];
    dims(c, in, out);
    for (int k = 0; k < QT_FP8_NMM; k++)
        if (in[k] % 16 || out[k] % 16) {
            snprintf(err, errlen,
                     "%s: precision.matmul_dtype: e4m3: the %s matmul is %d -> %d features; cuBLASLt's fp8 GEMMs "
                     "need multiples of 16 (check hidden_size, intermediate_size, heads x head_dim)",
                     path, MM_NAME[k], in[k], out[k]);
            return -1;
        }
    if (N % 16) {
        snprintf(err, errlen,
                 "%s: precision.matmul_dtype: e4m3: data.micro_batch x data.seq_len = %ld tokens; cuBLASLt's fp8 "
                 "GEMMs need a multiple of 16",
                 path, N);
        return -1;
    }
    return 0;
}

static void *take(char **p, size_t bytes) {
    void *r = *p;
    *p += up(bytes);
    return r;
}

qt_gpu_fp8 *qt_fp8_create(const qt_model_cfg *c, qt_dtype grad_dt, qt_fp8_wcache wc, long N, unsigned xq_shared,
                          int wgrad, void *wregion, void *aregion, cudaStream_t s) {
    qt_gpu_fp8 *f = calloc(1, sizeof *f);
    QT_CHECK(f, "out of host memory");
    int nl = c->num_layers;
    f->n_layers = nl;
    f->N = N;
    f->grad_dt = grad_dt;
    f->wcache = wc;
    f->xq_shared = xq_shared;
    dims(c, f->in, f->out);
    f->wq = calloc((size_t)nl * QT_FP8_NMM, sizeof *f->wq);
    f->wqT = calloc((size_t)nl * QT_FP8_NMM, sizeof *f->wqT);
    f->xqT = calloc((size_t)nl * QT_FP8_NMM, sizeof *f->xqT);
    f->amax_ready = calloc((size_t)nl * QT_FP8_NMM * 2, 1);
    QT_CHECK(f->wq && f->wqT && f->xqT && f->amax_ready, "out of host memory");
    f->fuse_amax = !qt_test_hooks_get()->fp8_unfused_amax;
    char *w = wregion, *a = aregion;
    f->sc = take(&w, (size_t)nl * QT_FP8_NMM * NSC * sizeof(qt_fp8_scale));
    f->nonfinite = take(&w, sizeof(int));
    int nb = wbufs(c, wc); /* layer l's copies: buffer l % nb (transient: slot l % QT_FP8_WSLOTS) */
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < QT_FP8_NMM; k++) {
            size_t n = (size_t)f->in[k] * f->out[k];
            int i = l * QT_FP8_NMM + k, i0 = l % nb * QT_FP8_NMM + k;
            f->wq[i] = l < nb ? take(&w, n) : f->wq[i0];
            f->wqT[i] = l < nb ? take(&w, n) : f->wqT[i0];
        }
    QT_CHECK((size_t)(w - (char *)wregion) == qt_fp8_weight_bytes(c, wc), "fp8 weight region layout mismatch");
    f->xq = take(&a, (size_t)N * max4(f->in));
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < QT_FP8_NMM; k++)
            f->xqT[l * QT_FP8_NMM + k] = l && xq_shared >> k & 1 ? f->xqT[k] : take(&a, (size_t)N * f->in[k]);
    if (grad_dt != QT_DT_BF16) {
        f->dyq = take(&a, (size_t)N * max4(f->out));
        f->dyqT = wgrad ? take(&a, (size_t)N * max4(f->out)) : NULL;
    }
    QT_CHECK((size_t)(a - (char *)aregion) == qt_fp8_act_bytes(c, N, grad_dt, xq_shared, wgrad),
             "fp8 activation region layout mismatch");
    qt_quant_scale_reset(f->sc, nl * QT_FP8_NMM * NSC, s);
    qt_zero(f->nonfinite, sizeof(int), s);
    return f;
}

void qt_fp8_free(qt_gpu_fp8 *f) {
    if (!f) return;
    free(f->wq);
    free(f->wqT);
    free(f->xqT);
    free(f->amax_ready);
    free(f);
}

/* Tags are 1 + (layer*4 + matmul)*3 + record, so 0 stays "all finite". */
static int tag_of(int layer, qt_fp8_mm k, int which) { return 1 + (layer * QT_FP8_NMM + (int)k) * NSC + which; }

const char *qt_fp8_tag_name(int tag, char *buf, size_t len) {
    int t = tag - 1, which = t % NSC, k = (t / NSC) % QT_FP8_NMM, layer = t / NSC / QT_FP8_NMM;
    if (tag <= 0) snprintf(buf, len, "no tensor");
    else snprintf(buf, len, "layer %d %s %s", layer, MM_NAME[k], SC_NAME[which]);
    return buf;
}

/* The weights' records first, then an (input, output gradient) pair per matmul: the per-micro-step
 * reset of the latter is one memset that leaves the persistent weight scales alone. */
static qt_fp8_scale *sc_of(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, int which) {
    int mm = layer * QT_FP8_NMM + (int)k;
    if (which == SC_W) return &f->sc[mm];
    return &f->sc[f->n_layers * QT_FP8_NMM + mm * 2 + (which - SC_X)];
}

void qt_fp8_reset_amax(qt_gpu_fp8 *f, cudaStream_t s) {
    int nmm = f->n_layers * QT_FP8_NMM;
    memset(f->amax_ready, 0, (size_t)nmm * 2);
    if (f->fuse_amax) qt_quant_scale_reset(f->sc + nmm, nmm * 2, s);
}

float *qt_fp8_producer_amax(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, int grad) {
    if (!f->fuse_amax || (grad && f->grad_dt == QT_DT_BF16)) return NULL;
    f->amax_ready[(layer * QT_FP8_NMM + (int)k) * 2 + grad] = 1;
    return &sc_of(f, layer, k, grad ? SC_DY : SC_X)->amax;
}

/* Whether a producer filled the slot since the reset (and consumes that: the next use needs a new one). */
static int take_ready(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, int grad) {
    unsigned char *r = &f->amax_ready[(layer * QT_FP8_NMM + (int)k) * 2 + grad];
    int ready = *r;
    *r = 0;
    return ready;
}

/* One quantize-transpose launch with the scale derived on the device from sc->amax, after a separate
 * abs-max pass unless the producer of x already folded it in (amax_ready); yT NULL: y only, by the plain
 * quantize (the same codes, no transposing tiles). */
static void quant_cur(qt_gpu_fp8 *f, qt_dtype ydt, void *y, void *yT, const void *x, long rows, long cols,
                      qt_fp8_scale *sc, int amax_ready, int tag, cudaStream_t s) {
    if (!amax_ready) qt_quant_amax(QT_DT_BF16, x, rows * cols, &sc->amax, 0, s);
    if (yT) qt_quant_fp8_transpose_cur(ydt, y, yT, QT_DT_BF16, x, rows, cols, sc, f->nonfinite, tag, s);
    else qt_quant_fp8_cur(ydt, y, QT_DT_BF16, x, rows * cols, sc, f->nonfinite, tag, s);
}

/* The bf16 block matrix k of layer l inside w_bf16 (the flat array of L). */
static const void *wmat(const qt_layout *L, const void *w_bf16, int l, int k) {
    const qt_layer_offsets *o = &L->layers[l];
    size_t off[QT_FP8_NMM] = {o->wqkv, o->wo, o->wgu, o->wdown};
    return (const char *)w_bf16 + off[k] * 2;
}

void qt_fp8_quantize_weights(qt_gpu_fp8 *f, const qt_layout *L, const void *w_bf16, int l0, int l1, cudaStream_t s) {
    QT_CHECK(l0 >= 0 && l0 <= l1 && l1 <= f->n_layers, "qt_fp8_quantize_weights: layers [%d, %d) of %d", l0, l1, f->n_layers);
    int transient = f->wcache == QT_FP8_WCACHE_NONE;
#ifdef QT_MUTANTS
    if (transient && qt_mutant_on(QT_MUT_FP8_WCACHE_STALE_SCALE) && f->wamax_taken) return;
    f->wamax_taken = 1;
#endif
    for (int l = l0; l < l1; l++)
        for (int k = 0; k < QT_FP8_NMM; k++) {
            const void *w = wmat(L, w_bf16, l, k);
            int i = l * QT_FP8_NMM + k;
            qt_fp8_scale *sc = sc_of(f, l, k, SC_W);
            if (transient) qt_quant_amax(QT_DT_BF16, w, (long)f->out[k] * f->in[k], &sc->amax, 0, s);
            else quant_cur(f, QT_DT_E4M3, f->wq[i], f->wqT[i], w, f->out[k], f->in[k], sc, 0, tag_of(l, k, SC_W), s);
        }
}

/* Both kernels compute sat(rne(fp32(w) * scale)) with the scale kernel_scale derives from the record
 * (cuda/quant.cu): the bytes of quant_cur's, whichever of them writes. */
void qt_fp8_weight_amax(qt_gpu_fp8 *f, int layer, const void *const w[QT_FP8_NMM], cudaStream_t s) {
    QT_CHECK(f->wcache == QT_FP8_WCACHE_NONE && layer >= 0 && layer < f->n_layers,
             "qt_fp8_weight_amax: layer %d of %d, weight cache %d (expected none)", layer, f->n_layers, (int)f->wcache);
    for (int k = 0; k < QT_FP8_NMM; k++)
        qt_quant_amax(QT_DT_BF16, w[k], (long)f->out[k] * f->in[k], &sc_of(f, layer, (qt_fp8_mm)k, SC_W)->amax, 0, s);
}

void qt_fp8_use_weights(qt_gpu_fp8 *f, int layer, const void *const wm[QT_FP8_NMM], unsigned wq, int want_wqT,
                        cudaStream_t s) {
    if (f->wcache != QT_FP8_WCACHE_NONE || !(wq || want_wqT)) return;
#ifdef QT_MUTANTS
    if (want_wqT && layer < f->n_layers - QT_FP8_WSLOTS && qt_mutant_on(QT_MUT_FP8_WSLOT_STALE)) return;
#endif
    for (int k = 0; k < QT_FP8_NMM; k++) {
        const void *w = wm[k];
        int i = layer * QT_FP8_NMM + k, tag = tag_of(layer, k, SC_W), want_wq = wq >> k & 1;
        if (!want_wq && !want_wqT) continue;
        qt_fp8_scale *sc = sc_of(f, layer, k, SC_W);
        if (want_wqT)
            qt_quant_fp8_transpose_cur(QT_DT_E4M3, want_wq ? f->wq[i] : NULL, f->wqT[i], QT_DT_BF16, w, f->out[k], f->in[k],
                                       sc, f->nonfinite, tag, s);
        else qt_quant_fp8_cur(QT_DT_E4M3, f->wq[i], QT_DT_BF16, w, (long)f->out[k] * f->in[k], sc, f->nonfinite, tag, s);
    }
}

void qt_fp8_use_weights_e4m3(qt_gpu_fp8 *f, int layer, const void *const w8[QT_FP8_NMM], unsigned wq, int want_wqT,
                             cudaStream_t s) {
    QT_CHECK(f->wcache == QT_FP8_WCACHE_NONE && layer >= 0 && layer < f->n_layers,
             "qt_fp8_use_weights_e4m3: layer %d of %d, weight cache %d (expected none)", layer, f->n_layers, (int)f->wcache);
    for (int k = 0; k < QT_FP8_NMM; k++) {
        int i = layer * QT_FP8_NMM + k;
        size_t n = (size_t)f->out[k] * f->in[k];
        if (wq >> k & 1) QT_CUDA(cudaMemcpyAsync(f->wq[i], w8[k], n, cudaMemcpyDeviceToDevice, s));
        if (want_wqT) qt_transpose_u8(f->wqT[i], w8[k], f->out[k], f->in[k], s);
    }
}

qt_fp8_scale *qt_fp8_weight_scale(qt_gpu_fp8 *f, int layer, qt_fp8_mm k) { return sc_of(f, layer, k, SC_W); }
int qt_fp8_weight_tag(int layer, qt_fp8_mm k) { return tag_of(layer, k, SC_W); }

void qt_fp8_quant_input(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *x, cudaStream_t s) {
    /* a shared Xq^T is made again before any wgrad reads it (or never read): the forward writes Xq only */
    void *xqT = f->xq_shared >> k & 1 ? NULL : f->xqT[layer * QT_FP8_NMM + k];
    quant_cur(f, QT_DT_E4M3, f->xq, xqT, x, f->N, f->in[k], sc_of(f, layer, k, SC_X), take_ready(f, layer, k, 0),
              tag_of(layer, k, SC_X), s);
}

void qt_fp8_requant_input(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *x, cudaStream_t s) {
    quant_cur(f, QT_DT_E4M3, f->xq, f->xqT[layer * QT_FP8_NMM + k], x, f->N, f->in[k], sc_of(f, layer, k, SC_X), 1,
              tag_of(layer, k, SC_X), s);
}

void qt_fp8_swiglu_bwd_requant(qt_gpu_fp8 *f, int layer, void *dgu, const void *dh, const void *gu, float *amax,
                               cudaStream_t s) {
    qt_fp8_mm k = QT_FP8_DOWN;
    qt_swiglu_bwd_quant_transpose_cur(dgu, dh, gu, f->N, f->in[k], amax, QT_DT_E4M3, f->xqT[layer * QT_FP8_NMM + k],
                                      sc_of(f, layer, k, SC_X), f->nonfinite, tag_of(layer, k, SC_X), s);
}

void qt_fp8_geglu_bwd_requant(qt_gpu_fp8 *f, int layer, void *dgu, const void *dh, const void *gu, float *amax,
                              cudaStream_t s) {
    qt_fp8_mm k = QT_FP8_DOWN;
    qt_geglu_bwd_quant_transpose_cur(dgu, dh, gu, f->N, f->in[k], amax, QT_DT_E4M3, f->xqT[layer * QT_FP8_NMM + k],
                                     sc_of(f, layer, k, SC_X), f->nonfinite, tag_of(layer, k, SC_X), s);
}

void qt_fp8_fwd(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *y, const void *bias,
                cudaStream_t s) {
    int I = f->in[k], O = f->out[k];
    qt_fp8_scale *sx = sc_of(f, layer, k, SC_X), *sw = sc_of(f, layer, k, SC_W);
    qt_matmul_fp8(mm, y, QT_DT_BF16, f->xq, QT_DT_E4M3, &sx->descale, f->wq[layer * QT_FP8_NMM + k], QT_DT_E4M3,
                  &sw->descale, bias, f->N, O, I, 1, 0, s);
}

void qt_fp8_quant_grad(qt_gpu_fp8 *f, int layer, qt_fp8_mm k, const void *dy, cudaStream_t s) {
    QT_CHECK(f->grad_dt != QT_DT_BF16, "qt_fp8_quant_grad: grad_dtype is bf16 (the backward stays bf16)");
    quant_cur(f, f->grad_dt, f->dyq, f->dyqT, dy, f->N, f->out[k], sc_of(f, layer, k, SC_DY),
              take_ready(f, layer, k, 1), tag_of(layer, k, SC_DY), s);
}

void qt_fp8_dgrad(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *dx, cudaStream_t s) {
    qt_fp8_scale *sd = sc_of(f, layer, k, SC_DY), *sw = sc_of(f, layer, k, SC_W);
    qt_matmul_fp8(mm, dx, QT_DT_BF16, f->dyq, f->grad_dt, &sd->descale, f->wqT[layer * QT_FP8_NMM + k], QT_DT_E4M3,
                  &sw->descale, NULL, f->N, f->in[k], f->out[k], 1, 0, s);
}

void qt_fp8_wgrad(qt_gpu_fp8 *f, qt_matmul_ctx *mm, int layer, qt_fp8_mm k, void *dw, qt_dtype dw_dt, cudaStream_t s) {
    qt_fp8_scale *sd = sc_of(f, layer, k, SC_DY), *sx = sc_of(f, layer, k, SC_X);
    QT_CHECK(f->N <= 0x7fffffffL, "qt_fp8_wgrad: %ld tokens do not fit cuBLASLt's int K", f->N);
    QT_CHECK(f->dyqT, "qt_fp8_wgrad: the fp8 state was created without a weight gradient (a frozen base's)");
    qt_matmul_fp8(mm, dw, dw_dt, f->dyqT, f->grad_dt, &sd->descale, f->xqT[layer * QT_FP8_NMM + k], QT_DT_E4M3,
                  &sx->descale, NULL, f->out[k], f->in[k], (int)f->N, 0, 1, s);
}
