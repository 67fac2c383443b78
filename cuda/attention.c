/* attention.c — causal GQA SDPA forward/backward as cuDNN backend-API graphs (no C++ frontend).
 *
 * Shapes: qkv[B,T,(H+2Hkv)*D] bf16 read in place: q = [B,H,T,D], K^T = [B,Hkv,D,T], v = [B,Hkv,T,D]
 * described by strides into the token rows (row length W = (H+2Hkv)*D). out[B,T,H*D] bf16,
 * stats[B,H,T,1] fp32. The graphs are the op patterns cuDNN's fused flash-attention engines match
 * (the ones cudnn-frontend's SDPA nodes emit):
 *   fwd  S = Q.K^T (fp32) -> *scale -> causal select(row >= col ? S : -FLT_MAX) [-> band select(col + W >
 *        row ? S : -FLT_MAX) with a sliding window W < T] [-> document select(col >= kv_lo[b,row] ? S : -FLT_MAX)
 *        with packed documents] -> max, S-max, exp, sum, log, max+log = Stats
 *        (out), exp/sum = P (bf16) -> O = P.V
 *   bwd  Ssum = rowsum(dO*O)*1 (fp32, workspace); P = exp(mask(S*scale - Stats)), mask as in fwd;
 *        dV = P^T.dO; dS = P*(dP*1 - Ssum)*scale with dP = dO.V^T; dK = dS^T.Q; dQacc = dS.K (fp32,
 *        workspace) -> dQ. With Hkv < H, dK and dV are computed per query head and summed over the
 *        group by a reduction (so they come back with Hkv heads).
 * Accumulation fp32 throughout; P and dS are bf16 matmul operands; outputs rounded once to bf16. */
#include "qt_attention.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

#define MAX_DESC 256
#define MAX_OPS 64
#define MAX_CFG 8

/* Unique ids of the tensors the caller binds; virtual tensors count up from VIRTUAL_UID. */
enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG, U_ONE, U_DO, U_DQ, U_DK, U_DV, U_SSUM, U_DQACC, U_WINDOW,
       U_KVLO, VIRTUAL_UID = 100 };

typedef cudnnBackendDescriptor_t desc_t;

typedef struct { /* a graph under construction; every descriptor it made lives until the context dies */
    cudnnHandle_t h;
    desc_t all[MAX_DESC], ops[MAX_OPS];
    int nall, nops;
    int64_t next_uid;
    int failed;
    char err[768];
    const char *shape;
} gb;

typedef struct {
    int B, T, H, Hkv, D, bwd, det;
    int window;      /* sliding window W (0: plain causal; a window >= T is stored as 0) */
    int docs;        /* the graph reads kv_lo[B,1,T,1] int32: query row sees no key before its document start */
    gb g;
    desc_t plan;
    int64_t plan_ws; /* bytes the engine needs */
    int64_t engine;  /* cuDNN's global index of the chosen engine */
    int nondet;      /* cuDNN notes that engine as nondeterministic */
    size_t ws;       /* all workspace bytes: plan_ws, then (bwd) the softmax sums and the fp32 dQ */
    int ok;
    char shape[128];
    float scale, neg, one; /* host values of the by-value scalars (the variant pack points at them) */
    float win;             /* the window as the float scalar the band mask adds to the column index */
} att_plan;

struct qt_attention_ctx {
    cudnnHandle_t h;
    int det; /* backward plans: the deterministic graph, engines noted nondeterministic skipped */
    att_plan **plans;
    int nplans, cap;
    long built;
    void *ws;
    size_t ws_bytes;
};

/* ---- graph-building helpers: each is a no-op once the graph failed; the first failure is kept ---- */

static void gb_fail(gb *g, const char *what, cudnnStatus_t st) {
    if (g->failed) return;
    char detail[512] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    snprintf(g->err, sizeof g->err, "cuDNN %zu: attention %s: %s: %s%s%s", cudnnGetVersion(), g->shape, what,
             cudnnGetErrorString(st), detail[0] ? ": " : "", detail);
    g->failed = 1;
}

static desc_t gb_new(gb *g, cudnnBackendDescriptorType_t t, const char *what) {
    desc_t d = NULL;
    if (g->failed) return NULL;
    QT_CHECK(g->nall < MAX_DESC, "attention graph: more than %d descriptors", MAX_DESC);
    cudnnStatus_t st = cudnnBackendCreateDescriptor(t, &d);
    if (st != CUDNN_STATUS_SUCCESS) { gb_fail(g, what, st); return NULL; }
    g->all[g->nall++] = d;
    return d;
}

static void gb_set(gb *g, desc_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
                   const void *v, const char *what) {
    if (g->failed) return;
    cudnnStatus_t st = cudnnBackendSetAttribute(d, a, t, n, v);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, what, st);
}

static void gb_fin(gb *g, desc_t d, const char *what) {
    if (g->failed) return;
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, what, st);
}

static void gb_op(gb *g, desc_t op, const char *what) {
    gb_fin(g, op, what);
    if (g->failed) return;
    QT_CHECK(g->nops < MAX_OPS, "attention graph: more than %d operations", MAX_OPS);
    g->ops[g->nops++] = op;
}

/* A tensor [4 dims] whose pointer is a multiple of align bytes; uid 0 takes the next virtual id. */
static desc_t tensor_aligned(gb *g, const char *name, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                             const int64_t str[4], bool virt, bool by_value, int64_t align) {
    desc_t d = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    if (!uid) uid = g->next_uid++;
    gb_set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, name);
    gb_set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, name);
    gb_set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, name);
    gb_set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name);
    gb_set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name);
    gb_set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, name);
    if (by_value) gb_set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, name);
    gb_fin(g, d, name);
    return d;
}

/* The same, 16-byte aligned (every tensor but the documents' kv_lo, whose slices start at any row). */
static desc_t tensor(gb *g, const char *name, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                     const int64_t str[4], bool virt, bool by_value) {
    return tensor_aligned(g, name, uid, dt, dim, str, virt, by_value, 16);
}

static desc_t virt(gb *g, const char *name, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4]) {
    return tensor(g, name, 0, dt, dim, str, true, false);
}

static desc_t scalar(gb *g, const char *name, int64_t uid) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, name, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* y = mode(x[, b][, t]); prec is the math precision; axis >= 0 for GEN_INDEX. Returns y. */
static desc_t pw(gb *g, const char *name, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis, desc_t x,
                 desc_t b, desc_t t, desc_t y) {
    desc_t p = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    gb_set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name);
    gb_set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, name);
    if (axis >= 0) gb_set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name);
    gb_fin(g, p, name);
    desc_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, name);
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    gb_op(g, op, name);
    return y;
}

static desc_t reduce(gb *g, const char *name, cudnnReduceTensorOp_t red, desc_t x, desc_t y) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    desc_t r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red, name);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    gb_fin(g, r, name);
    desc_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, name);
    gb_op(g, op, name);
    return y;
}

static desc_t matmul(gb *g, const char *name, desc_t a, desc_t b, desc_t c) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    desc_t m = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    gb_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    gb_fin(g, m, name);
    desc_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, name);
    gb_op(g, op, name);
    return c;
}

static desc_t reshape(gb *g, const char *name, desc_t x, desc_t y) {
    desc_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    gb_op(g, op, name);
    return y;
}

/* ---- the two graphs ---- */

typedef struct { /* dims and strides shared by both graphs */
    int64_t q_dim[4], q_str[4], kt_dim[4], kt_str[4], kv_dim[4], kv_str[4], o_dim[4], o_str[4];
    int64_t s_dim[4], s_str[4], st_str[4], row_dim[4], row_str[4], full_str[4];
} att_shapes;

static void shapes_of(att_shapes *a, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    int64_t W = (H + 2 * Hkv) * D;
    const int64_t q_dim[4] = {B, H, T, D}, q_str[4] = {T * W, D, W, 1};
    const int64_t kt_dim[4] = {B, Hkv, D, T}, kt_str[4] = {T * W, D, 1, W};
    const int64_t kv_dim[4] = {B, Hkv, T, D}, kv_str[4] = {T * W, D, W, 1};
    const int64_t o_str[4] = {T * H * D, D, H * D, 1};
    const int64_t s_dim[4] = {B, H, T, T}, s_str[4] = {H * T * T, T * T, T, 1}, st_str[4] = {H * T * T, T * T, 1, T};
    const int64_t row_dim[4] = {B, H, T, 1}, row_str[4] = {H * T, T, 1, 1}, full_str[4] = {H * T * D, T * D, D, 1};
    memcpy(a->q_dim, q_dim, sizeof q_dim), memcpy(a->q_str, q_str, sizeof q_str);
    memcpy(a->kt_dim, kt_dim, sizeof kt_dim), memcpy(a->kt_str, kt_str, sizeof kt_str);
    memcpy(a->kv_dim, kv_dim, sizeof kv_dim), memcpy(a->kv_str, kv_str, sizeof kv_str);
    memcpy(a->o_dim, q_dim, sizeof q_dim), memcpy(a->o_str, o_str, sizeof o_str);
    memcpy(a->s_dim, s_dim, sizeof s_dim), memcpy(a->s_str, s_str, sizeof s_str), memcpy(a->st_str, st_str, sizeof st_str);
    memcpy(a->row_dim, row_dim, sizeof row_dim), memcpy(a->row_str, row_str, sizeof row_str);
    memcpy(a->full_str, full_str, sizeof full_str);
}

/* The int32 row (axis 2: query) or column (axis 3: key) index of every score of s. */
static desc_t gen_index(gb *g, const att_shapes *a, const char *name, int64_t axis, desc_t s) {
    desc_t idx = virt(g, name, CUDNN_DATA_INT32, a->s_dim, a->s_str);
    return pw(g, name, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, axis, s, NULL, NULL, idx);
}

/* Keeps s where row >= col, -FLT_MAX elsewhere (the causal mask as GEN_INDEX / CMP_GE / BINARY_SELECT). */
static desc_t causal(gb *g, const att_shapes *a, desc_t s, desc_t neg) {
    desc_t row = gen_index(g, a, "gen_row_index", 2, s), col = gen_index(g, a, "gen_col_index", 3, s);
    desc_t keep = virt(g, "row_ge_col", CUDNN_DATA_BOOLEAN, a->s_dim, a->s_str);
    desc_t out = virt(g, "causal_select", CUDNN_DATA_FLOAT, a->s_dim, a->s_str);
    pw(g, "row_ge_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    return pw(g, "causal_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg, keep, out);
}

/* Keeps s where col + W > row (transformers' kv_idx > q_idx - W), -FLT_MAX elsewhere: cudnn-frontend's
 * top-left aligned left-bound diagonal band (GEN_INDEX / ADD of the fp32 window / CMP_GT / BINARY_SELECT),
 * applied after the causal mask. win is the by-value fp32 scalar W. */
static desc_t band(gb *g, const att_shapes *a, desc_t s, desc_t neg, desc_t win) {
    desc_t row = gen_index(g, a, "band_row_index", 2, s), col = gen_index(g, a, "band_col_index", 3, s);
    desc_t colw = virt(g, "col+window", CUDNN_DATA_FLOAT, a->s_dim, a->s_str);
    desc_t keep = virt(g, "col+window>row", CUDNN_DATA_BOOLEAN, a->s_dim, a->s_str);
    desc_t out = virt(g, "band_select", CUDNN_DATA_FLOAT, a->s_dim, a->s_str);
    pw(g, "col+window", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, 3, col, win, NULL, colw);
    pw(g, "col+window>row", CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, -1, colw, row, NULL, keep);
    return pw(g, "band_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg, keep, out);
}

/* Keeps s where col >= kv_lo[b, row] (the first key of the query's packed document), -FLT_MAX elsewhere:
 * GEN_INDEX / CMP_GE against the int32 row-broadcast tensor kv_lo[B,1,T,1] / BINARY_SELECT, the form of
 * cudnn-frontend's padding mask (GEN_INDEX compared with the per-sequence seq_len tensors). */
static desc_t doc_mask(gb *g, const att_shapes *a, desc_t s, desc_t neg, desc_t kvlo) {
    desc_t col = gen_index(g, a, "doc_col_index", 3, s);
    desc_t keep = virt(g, "col>=kv_lo", CUDNN_DATA_BOOLEAN, a->s_dim, a->s_str);
    desc_t out = virt(g, "doc_select", CUDNN_DATA_FLOAT, a->s_dim, a->s_str);
    pw(g, "col>=kv_lo", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, col, kvlo, NULL, keep);
    return pw(g, "doc_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg, keep, out);
}

/* The causal mask, then the window's band when the graph has one (win != NULL), then the documents'
 * bound when it has one (kvlo != NULL). */
static desc_t mask(gb *g, const att_shapes *a, desc_t s, desc_t neg, desc_t win, desc_t kvlo) {
    s = causal(g, a, s, neg);
    s = win ? band(g, a, s, neg, win) : s;
    return kvlo ? doc_mask(g, a, s, neg, kvlo) : s;
}

/* The graph's kv_lo input [B,1,T,1] int32 (one per query row, broadcast over heads and keys), or NULL; 4-byte
 * aligned: the attention backward's slices start it at row b0 * T. */
static desc_t kvlo_tensor(gb *g, const att_shapes *a, int docs) {
    if (!docs) return NULL;
    const int64_t dim[4] = {a->s_dim[0], 1, a->s_dim[2], 1}, str[4] = {a->s_dim[2], a->s_dim[2], 1, 1};
    return tensor_aligned(g, "kv_lo", U_KVLO, CUDNN_DATA_INT32, dim, str, false, false, 4);
}

#define F32 CUDNN_DATA_FLOAT
#define BF16 CUDNN_DATA_BFLOAT16

/* Elementwise binary op into a new fp32 virtual tensor of dims/strides (dim, str). */
static desc_t pw2(gb *g, const char *name, cudnnPointwiseMode_t mode, desc_t x, desc_t b, const int64_t *dim,
                  const int64_t *str) {
    return pw(g, name, mode, F32, -1, x, b, NULL, virt(g, name, F32, dim, str));
}

static void build_fwd(gb *g, const att_shapes *a, int window, int docs) {
    desc_t q = tensor(g, "Q", U_Q, BF16, a->q_dim, a->q_str, false, false);
    desc_t kt = tensor(g, "K^T", U_K, BF16, a->kt_dim, a->kt_str, false, false);
    desc_t v = tensor(g, "V", U_V, BF16, a->kv_dim, a->kv_str, false, false);
    desc_t o = tensor(g, "O", U_O, BF16, a->o_dim, a->o_str, false, false);
    desc_t stats = tensor(g, "Stats", U_STATS, F32, a->row_dim, a->row_str, false, false);
    desc_t scale = scalar(g, "attn_scale", U_SCALE), neg = scalar(g, "mask_value", U_NEG);
    desc_t win = window ? scalar(g, "window", U_WINDOW) : NULL, kvlo = kvlo_tensor(g, a, docs);
    desc_t s = matmul(g, "bmm1 Q.K^T", q, kt, virt(g, "S", F32, a->s_dim, a->s_str));
    s = pw2(g, "attn_scale", CUDNN_POINTWISE_MUL, s, scale, a->s_dim, a->s_str);
    s = mask(g, a, s, neg, win, kvlo);
    desc_t m = reduce(g, "softmax max", CUDNN_REDUCE_TENSOR_MAX, s, virt(g, "M", F32, a->row_dim, a->row_str));
    desc_t e = pw2(g, "softmax sub", CUDNN_POINTWISE_SUB, s, m, a->s_dim, a->s_str);
    e = pw(g, "softmax exp", CUDNN_POINTWISE_EXP, F32, -1, e, NULL, NULL, virt(g, "E", F32, a->s_dim, a->s_str));
    desc_t z = reduce(g, "softmax sum", CUDNN_REDUCE_TENSOR_ADD, e, virt(g, "Z", F32, a->row_dim, a->row_str));
    desc_t lz = pw(g, "softmax log", CUDNN_POINTWISE_LOG, F32, -1, z, NULL, NULL, virt(g, "logZ", F32, a->row_dim, a->row_str));
    pw(g, "softmax stats", CUDNN_POINTWISE_ADD, F32, -1, m, lz, NULL, stats);
    desc_t p = pw(g, "softmax div", CUDNN_POINTWISE_DIV, F32, -1, e, z, NULL, virt(g, "P", BF16, a->s_dim, a->s_str));
    matmul(g, "bmm2 P.V", p, v, o);
}

static void build_bwd(gb *g, const att_shapes *a, int H, int Hkv, int det, int window, int docs) {
    const int64_t *qd = a->q_dim, *sd = a->s_dim, *ss = a->s_str, *rd = a->row_dim, *rs = a->row_str;
    int64_t vt_dim[4] = {a->kt_dim[0], a->kt_dim[1], a->kt_dim[2], a->kt_dim[3]};
    int64_t odd_str[4] = {a->full_str[0], a->full_str[1], a->o_str[2], 1}; /* cudnn-frontend's dO*O layout */
    desc_t q = tensor(g, "Q", U_Q, BF16, qd, a->q_str, false, false);
    desc_t kt = tensor(g, "K^T", U_K, BF16, a->kt_dim, a->kt_str, false, false);
    desc_t vt = tensor(g, "V^T", U_V, BF16, vt_dim, a->kt_str, false, false);
    desc_t o = tensor(g, "O", U_O, BF16, a->o_dim, a->o_str, false, false);
    desc_t dout = tensor(g, "dO", U_DO, BF16, a->o_dim, a->o_str, false, false);
    desc_t stats = tensor(g, "Stats", U_STATS, F32, rd, rs, false, false);
    desc_t dq = tensor(g, "dQ", U_DQ, BF16, qd, a->q_str, false, false);
    desc_t dk = tensor(g, "dK", U_DK, BF16, a->kv_dim, a->kv_str, false, false);
    desc_t dv = tensor(g, "dV", U_DV, BF16, a->kv_dim, a->kv_str, false, false);
    desc_t ssum = tensor(g, "softmax_sum", U_SSUM, F32, rd, rs, false, false);
    desc_t dqacc = det ? NULL : tensor(g, "dQ_accum", U_DQACC, F32, qd, a->full_str, false, false);
    desc_t scale = scalar(g, "attn_scale", U_SCALE), neg = scalar(g, "mask_value", U_NEG), one = scalar(g, "one", U_ONE);
    desc_t win = window ? scalar(g, "window", U_WINDOW) : NULL, kvlo = kvlo_tensor(g, a, docs);

    desc_t t = pw2(g, "mul dO*O", CUDNN_POINTWISE_MUL, dout, o, qd, odd_str);
    t = reduce(g, "reduce dO*O", CUDNN_REDUCE_TENSOR_ADD, t, virt(g, "rowsum dO*O", F32, rd, rs));
    pw(g, "softmax_sum", CUDNN_POINTWISE_MUL, F32, -1, t, one, NULL, ssum);

    desc_t s = matmul(g, "bmm Q.K^T", q, kt, virt(g, "S", F32, sd, ss));
    s = pw2(g, "attn_scale", CUDNN_POINTWISE_MUL, s, scale, sd, ss);
    s = pw2(g, "sub stats", CUDNN_POINTWISE_SUB, s, stats, sd, ss);
    s = mask(g, a, s, neg, win, kvlo);
    desc_t p = pw(g, "exp", CUDNN_POINTWISE_EXP, F32, -1, s, NULL, NULL, virt(g, "P", F32, sd, ss));

    desc_t pt = reshape(g, "P^T", p, virt(g, "P^T", BF16, sd, a->st_str));
    if (H == Hkv) {
        matmul(g, "bmm P^T.dO", pt, dout, dv);
    } else {
        desc_t full = matmul(g, "bmm P^T.dO", pt, dout, virt(g, "dV per q head", BF16, qd, a->full_str));
        reduce(g, "dV group sum", CUDNN_REDUCE_TENSOR_ADD, full, dv);
    }
    desc_t dp = matmul(g, "bmm dO.V^T", dout, vt, virt(g, "dP", F32, sd, ss));
    dp = pw2(g, "dP*1", CUDNN_POINTWISE_MUL, dp, one, sd, ss);
    dp = pw2(g, "dP-softmax_sum", CUDNN_POINTWISE_SUB, dp, ssum, sd, ss);
    dp = pw2(g, "dS=P*(dP-sum)", CUDNN_POINTWISE_MUL, dp, p, sd, ss);
    desc_t ds = pw2(g, "dS*scale", CUDNN_POINTWISE_MUL, dp, scale, sd, ss);

    desc_t dst = reshape(g, "dS^T", ds, virt(g, "dS^T", BF16, sd, a->st_str));
    if (H == Hkv) {
        matmul(g, "bmm dS^T.Q", dst, q, dk);
    } else {
        desc_t full = matmul(g, "bmm dS^T.Q", dst, q, virt(g, "dK per q head", BF16, qd, a->full_str));
        reduce(g, "dK group sum", CUDNN_REDUCE_TENSOR_ADD, full, dk);
    }
    desc_t k = reshape(g, "K", kt, virt(g, "K", BF16, a->kv_dim, a->kv_str));
    if (det) { /* dQ written straight by one matmul: no fp32 accumulator summed into by atomics */
        matmul(g, "bmm dS.K", ds, k, dq);
    } else {
        matmul(g, "bmm dS.K", ds, k, dqacc);
        pw(g, "dQ", CUDNN_POINTWISE_IDENTITY, F32, -1, dqacc, NULL, NULL, dq);
    }
}

static void keep(gb *g, desc_t d) {
    QT_CHECK(g->nall < MAX_DESC, "attention graph: more than %d descriptors", MAX_DESC);
    g->all[g->nall++] = d;
}

/* Reads the engine config's engine: its global index and whether cuDNN notes it nondeterministic. */
static void engine_info(desc_t cfg, int64_t *index, int *nondet) {
    desc_t eng = NULL;
    int64_t n = 0;
    *index = -1;
    *nondet = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
        CUDNN_STATUS_SUCCESS) {
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t nn = 0;
        (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, index);
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < nn; i++) *nondet |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    }
    cudnnBackendDestroyDescriptor(eng);
}

/* Finalizes the graph and takes the first engine config (heuristic mode A, then the fallback list)
 * that yields an execution plan; with det, engines cuDNN notes as nondeterministic are passed over. */
static desc_t make_plan(gb *g, int det, int64_t *ws, int64_t *engine, int *nondet) {
    desc_t graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->h, "operation graph");
    gb_fin(g, graph, "operation graph finalize");
    if (g->failed) return NULL;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char last[512] = "no engine config returned";
    int tried = 0;
    for (int mi = 0; mi < 2; mi++) {
        desc_t heur = NULL, cfg[MAX_CFG];
        int64_t n = 0;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS) continue;
        int ok = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                          &graph) == CUDNN_STATUS_SUCCESS &&
                 cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi]) ==
                     CUDNN_STATUS_SUCCESS &&
                 cudnnBackendFinalize(heur) == CUDNN_STATUS_SUCCESS;
        for (int i = 0; i < MAX_CFG; i++) QT_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i]));
        if (ok) ok = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                              MAX_CFG, &n, cfg) == CUDNN_STATUS_SUCCESS;
        if (!ok) cudnnGetLastErrorString(last, sizeof last);
        desc_t plan = NULL;
        for (int64_t i = 0; ok && i < n && i < MAX_CFG && !plan; i++, tried++) {
            engine_info(cfg[i], engine, nondet);
            if (det && *nondet) {
                snprintf(last, sizeof last, "engine %lld is noted nondeterministic", (long long)*engine);
                continue;
            }
            desc_t p;
            QT_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p));
            cudnnStatus_t st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->h);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                              &cfg[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
            if (st == CUDNN_STATUS_SUCCESS) {
                int64_t cnt = 0;
                QT_CUDNN(cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, ws));
                plan = p;
            } else {
                char d[400] = "";
                cudnnGetLastErrorString(d, sizeof d);
                snprintf(last, sizeof last, "%s%s%s", cudnnGetErrorString(st), d[0] ? ": " : "", d);
                cudnnBackendDestroyDescriptor(p);
            }
        }
        /* Kept with the graph until the context dies: the plan may refer to its engine config. */
        for (int i = 0; i < MAX_CFG; i++) keep(g, cfg[i]);
        keep(g, heur);
        if (plan) return plan;
    }
    snprintf(g->err, sizeof g->err,
             "cuDNN %zu: attention %s: no engine supports the graph (%d engine configs tried; last: %s)",
             cudnnGetVersion(), g->shape, tried, last);
    g->failed = 1;
    return NULL;
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The window a plan of sequence length T uses: one that covers the whole sequence changes nothing, so
 * it shares the plain causal plan (0). A negative one stays, for the build to refuse. */
static int plan_window(int window, int T) { return window >= T ? 0 : window; }

static att_plan *get_plan(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int docs, int bwd) {
    int det = bwd && c->det; /* the forward has no cross-block sums: one graph serves both */
    window = plan_window(window, T);
    for (int i = 0; i < c->nplans; i++) {
        att_plan *p = c->plans[i];
        if (p->B == B && p->T == T && p->H == H && p->Hkv == Hkv && p->D == D && p->window == window &&
            p->docs == docs && p->bwd == bwd && p->det == det)
            return p;
    }
    att_plan *p = calloc(1, sizeof *p);
    QT_CHECK(p != NULL, "out of host memory");
    *p = (att_plan){.B = B, .T = T, .H = H, .Hkv = Hkv, .D = D, .window = window, .docs = docs, .bwd = bwd, .det = det};
    p->scale = 1.0f / sqrtf((float)D);
    p->neg = -FLT_MAX; /* what cudnn-frontend's causal mask writes: exp() of it minus anything is 0 */
    p->one = 1.0f;
    p->win = (float)window; /* exact: window < 2^24 (checked below) */
    snprintf(p->shape, sizeof p->shape, "%s%s B=%d T=%d H=%d Hkv=%d D=%d W=%d%s", bwd ? "bwd" : "fwd",
             det ? " (deterministic)" : "", B, T, H, Hkv, D, window, docs ? " per document" : "");
    gb *g = &p->g;
    g->h = c->h;
    g->next_uid = VIRTUAL_UID;
    g->shape = p->shape;
    if (B < 1 || T < 1 || Hkv < 1 || H % Hkv || D % 8 || window < 0 || window >= (1 << 24)) {
        snprintf(g->err, sizeof g->err,
                 "attention %s: expected B, T >= 1, H %% Hkv == 0, D %% 8 == 0 and a window 0 <= W < 2^24", p->shape);
        g->failed = 1;
    } else {
        att_shapes a;
        shapes_of(&a, B, T, H, Hkv, D);
        if (bwd) build_bwd(g, &a, H, Hkv, det, window, docs);
        else build_fwd(g, &a, window, docs);
        p->plan = make_plan(g, p->det, &p->plan_ws, &p->engine, &p->nondet);
    }
    p->ok = !g->failed;
    p->ws = align256((size_t)p->plan_ws);
    if (bwd) p->ws += qt_attention_bwd_fixed_ws(B, T, H, D);
    if (c->nplans == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 8;
        c->plans = realloc(c->plans, (size_t)c->cap * sizeof *c->plans);
        QT_CHECK(c->plans != NULL, "out of host memory");
    }
    c->plans[c->nplans++] = p;
    c->built++;
    return p;
}

qt_attention_ctx *qt_attention_create(void) {
    qt_attention_ctx *c = calloc(1, sizeof *c);
    QT_CHECK(c != NULL, "out of host memory");
    QT_CUDNN(cudnnCreate(&c->h));
    return c;
}

void qt_attention_free(qt_attention_ctx *c) {
    if (!c) return;
    for (int i = 0; i < c->nplans; i++) {
        att_plan *p = c->plans[i];
        if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
        for (int j = p->g.nall - 1; j >= 0; j--) cudnnBackendDestroyDescriptor(p->g.all[j]);
        free(p);
    }
    free(c->plans);
    cudaFree(c->ws);
    cudnnDestroy(c->h);
    free(c);
}

long qt_attention_plan_count(const qt_attention_ctx *c) { return c->built; }

void qt_attention_set_deterministic(qt_attention_ctx *c, int on) { c->det = on != 0; }

int qt_attention_engine(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int bwd, long *engine) {
    att_plan *p = get_plan(c, B, T, H, Hkv, D, window, 0, bwd);
    if (engine) *engine = p->ok ? (long)p->engine : -1;
    return p->ok ? p->nondet : -1;
}

int qt_attention_prepare(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, char *err,
                         size_t errlen) {
    return qt_attention_prepare_docs(c, B, T, H, Hkv, D, window, 0, err, errlen);
}

int qt_attention_prepare_docs(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int docs,
                              char *err, size_t errlen) {
    for (int bwd = 0; bwd < 2; bwd++) {
        att_plan *p = get_plan(c, B, T, H, Hkv, D, window, docs != 0, bwd);
        if (!p->ok) {
            if (err && errlen) snprintf(err, errlen, "%s", p->g.err);
            return -1;
        }
        if (docs) qt_attention_reserve(c, p->ws); /* now, not at a first call that may be under graph capture */
    }
    return 0;
}

size_t qt_attention_bwd_fixed_ws(int B, int T, int H, int D) {
    return align256((size_t)B * H * T * 4) + align256((size_t)B * H * T * D * 4);
}

size_t qt_attention_bwd_est_ws(int B, int T, int H, int D, int det) {
    return 2 * qt_attention_bwd_fixed_ws(B, T, H, D) + (det ? align256((size_t)B * H * T * T * 2) : 0);
}

size_t qt_attention_ws_bytes(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int bwd) {
    att_plan *p = get_plan(c, B, T, H, Hkv, D, window, 0, bwd);
    return p->ok ? p->ws : 0;
}

void qt_attention_reserve(qt_attention_ctx *c, size_t bytes) {
    if (bytes <= c->ws_bytes) return;
    QT_CUDA(cudaFree(c->ws));
    c->ws = NULL;
    QT_CUDA(cudaMalloc(&c->ws, bytes));
    c->ws_bytes = bytes;
}

/* The plan of this shape, failing hard with its build error; grows the workspace to fit it. */
static att_plan *ready_plan(qt_attention_ctx *c, int B, int T, int H, int Hkv, int D, int window, int docs,
                            int bwd) {
    att_plan *p = get_plan(c, B, T, H, Hkv, D, window, docs, bwd);
    QT_CHECK(p->ok, "%s", p->g.err);
    qt_attention_reserve(c, p->ws); /* cudaFree synchronises: nothing in flight still uses the old one */
    return p;
}

static void execute(qt_attention_ctx *c, att_plan *p, const int64_t *uids, void *const *ptrs, int n, cudaStream_t s) {
    desc_t vp;
    void *ws = c->ws;
    QT_CUDNN(cudnnSetStream(c->h, s));
    QT_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    QT_CUDNN(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
    QT_CUDNN(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    QT_CUDNN(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
    QT_CUDNN(cudnnBackendFinalize(vp));
    cudnnStatus_t st = cudnnBackendExecute(c->h, p->plan, vp);
    cudnnBackendDestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char d[512] = "";
        cudnnGetLastErrorString(d, sizeof d);
        qt_fail(__FILE__, __LINE__, "cudnnBackendExecute", "cuDNN %zu: attention %s: %s%s%s", cudnnGetVersion(),
                p->shape, cudnnGetErrorString(st), d[0] ? ": " : "", d);
    }
}

void qt_attention_fwd(qt_attention_ctx *c, void *out, float *lse, const void *qkv, int B, int T, int H, int Hkv,
                      int D, int window, cudaStream_t s) {
    qt_attention_docs_fwd(c, out, lse, qkv, NULL, B, T, H, Hkv, D, window, s);
}

void qt_attention_docs_fwd(qt_attention_ctx *c, void *out, float *lse, const void *qkv, const int32_t *kv_lo, int B,
                           int T, int H, int Hkv, int D, int window, cudaStream_t s) {
    qt_attention_fwd_scaled(c, out, lse, qkv, kv_lo, B, T, H, Hkv, D, window, 0.0f, s);
}

void qt_attention_fwd_scaled(qt_attention_ctx *c, void *out, float *lse, const void *qkv, const int32_t *kv_lo, int B,
                             int T, int H, int Hkv, int D, int window, float scale, cudaStream_t s) {
    att_plan *p = ready_plan(c, B, T, H, Hkv, D, window, kv_lo != NULL, 0);
    const uint16_t *q = qkv;
    float sc = scale > 0 ? scale : p->scale; /* a by-value scalar: cuDNN copies it at the execute */
    int64_t uids[9] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG};
    void *ptrs[9] = {(void *)q, (void *)(q + (size_t)H * D), (void *)(q + (size_t)(H + Hkv) * D), out, lse,
                     &sc, &p->neg};
    int n = 7; /* the window scalar and kv_lo only where the graph has the band / the documents */
    if (p->window) uids[n] = U_WINDOW, ptrs[n++] = &p->win;
    if (p->docs) uids[n] = U_KVLO, ptrs[n++] = (void *)kv_lo;
    execute(c, p, uids, ptrs, n, s);
}

void qt_attention_bwd(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                      const float *lse, int B, int T, int H, int Hkv, int D, int window, cudaStream_t s) {
    qt_attention_docs_bwd(c, dqkv, dout, qkv, out, lse, NULL, B, T, H, Hkv, D, window, s);
}

void qt_attention_docs_bwd(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                           const float *lse, const int32_t *kv_lo, int B, int T, int H, int Hkv, int D, int window,
                           cudaStream_t s) {
    qt_attention_bwd_scaled(c, dqkv, dout, qkv, out, lse, kv_lo, B, T, H, Hkv, D, window, 0.0f, s);
}

void qt_attention_bwd_scaled(qt_attention_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out,
                             const float *lse, const int32_t *kv_lo, int B, int T, int H, int Hkv, int D, int window,
                             float scale, cudaStream_t s) {
    att_plan *p = ready_plan(c, B, T, H, Hkv, D, window, kv_lo != NULL, 1);
    float sc = scale > 0 ? scale : p->scale;
    const uint16_t *q = qkv;
    uint16_t *dq = dqkv;
    char *ssum = (char *)c->ws + align256((size_t)p->plan_ws);
    char *dqacc = ssum + align256((size_t)B * H * T * 4);
    /* cuDNN before 9.6 expects the fp32 dQ accumulator zeroed by the caller; later ones do not mind. */
    if (!p->det) QT_CUDA(cudaMemsetAsync(dqacc, 0, (size_t)B * H * T * D * 4, s));
    int64_t uids[16] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_SCALE, U_NEG, U_ONE, U_SSUM};
    void *ptrs[16] = {(void *)q, (void *)(q + (size_t)H * D), (void *)(q + (size_t)(H + Hkv) * D), (void *)out,
                      (void *)dout, (void *)lse, dq, dq + (size_t)H * D, dq + (size_t)(H + Hkv) * D, &sc,
                      &p->neg, &p->one, ssum};
    int n = 13;
    if (!p->det) uids[n] = U_DQACC, ptrs[n++] = dqacc; /* the deterministic graph has no dQ accumulator */
    if (p->window) uids[n] = U_WINDOW, ptrs[n++] = &p->win;
    if (p->docs) uids[n] = U_KVLO, ptrs[n++] = (void *)kv_lo;
    execute(c, p, uids, ptrs, n, s);
}
