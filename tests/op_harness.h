/* op_harness.h — the machinery of the table-driven op test (tests/test_ops_gpu.c), in the style of ggml's
 * test-backend-ops: an op is registered once (op_def: its tensors and bounds, its CPU reference, its launch)
 * and each row of the table (op_case) is one shape/dtype/option of it.
 *
 * One row runs twice on the GPU, with two poison patterns: pass 0 fills every output and every guard
 * region with 0xff bytes (NaN in fp32, bf16, e4m3 and e5m2), pass 1 with 0x7f bytes (3.4e38 in fp32 and
 * bf16, NaN in fp8). Each pass: fresh device buffers with 256-byte poisoned guards on both sides (and `off`
 * elements of misalignment), inputs uploaded (rounded to their dtype at build, so the bound measures the
 * kernel's own error), "+=" and in-place tensors uploaded with their starting values, the launch, then:
 *   - every element |got - ref| <= atol + rtol*|ref| (a NaN ref wants a NaN that is not the poison), and
 *     the relative L2 error ||got - ref|| / ||ref|| <= rtol (exact tensors: 0/0 means bit for bit);
 *   - elements the op must leave alone (op_def.keep: v heads of RoPE, AdamW padding, a range's outside)
 *     still hold their starting bits: the poison for "=" outputs, the old value for "+=" / in-place ones;
 *   - the guards still hold the poison; inputs are unchanged;
 *   - pass 1 gives the same bits as pass 0 (determinism, and no output depends on the poison), unless the
 *     op is OP_NONDET. Tensors marked T_PASS0 (an optional output such as a fused abs-max) are passed as
 *     NULL in pass 1 and must then stay untouched, and the other outputs must not change.
 * On failure the row prints the tensor, the worst index, got and ref, and the row's seed.
 *
 * The CPU self-check (op_selfcheck_row) runs every row without a GPU: the "device" result is the
 * reference rounded to the output dtype, which must pass (the bounds admit the dtype's rounding; uploads
 * are lossless), and planted bugs must each be caught by the same op_verify the GPU run uses: one element
 * off by a bound (and named as the worst), one element left as the poison, a kept element written, "="
 * instead of "+=", pass 1 one ulp away from pass 0, an optional output written although NULL was passed,
 * an input changed; test_selfcheck_guards plants guard bytes. It checks the harness and each row's bounds,
 * not the CPU references (test_ops.c checks those against finite differences). */
#ifndef OP_HARNESS_H
#define OP_HARNESS_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_quant.h"
#include "qt_rng.h"
#include "qt_test.h"

/* Storage types beyond qt_dtype: int32 (token ids, flags), fp64 (sums) and uint8 (packed codes such as NF4's);
 * all kept as float on the host (ids < 2^24; fp64 results are compared after rounding to fp32). */
#define DT_I32 ((qt_dtype)16)
#define DT_F64 ((qt_dtype)17)
#define DT_U8 ((qt_dtype)18)

enum { T_IN, T_OUT, T_UPD, T_WS };                /* role: input, "=" output, "+=" or in place, workspace */
enum { T_ADD = 1, T_PASS0 = 2, T_DERIVED = 4 };   /* T_ADD: accumulates (+=); T_DERIVED: ref set by derive */
enum { OP_NONDET = 1 };                           /* op_def.flags */
/* op_case.opt bits, shared by all ops (each op reads the ones it knows). */
enum { O_AMAX = 1, O_RES = 2, O_BIAS = 4, O_ACC = 8, O_BAD = 16, O_INPLACE = 32, O_FAST = 64, O_RANGE = 128,
       O_NOTUNE = 256, O_NODW = 512, O_CUR = 1024, O_NOY = 2048, O_G16 = 4096 };
static const char *const OPT_NAMES[] = {"amax", "resid", "bias", "acc",    "bad", "inplace",
                                        "fast", "range", "notune", "nodw", "cur", "noy", "g16"};

#define OP_MAXT 12
#define OP_GUARD 256
static const uint8_t OP_POISON[2] = {0xff, 0x7f};

typedef struct {
    const char *name;
    int role, flags;
    qt_dtype dt;
    long n;            /* elements (T_WS: bytes) */
    double atol, rtol; /* bounds of T_OUT / T_UPD; 0, 0 = bit for bit */
    float *h;          /* T_IN / T_UPD: the values uploaded, exact in dt */
    float *ref;        /* T_OUT / T_UPD: expected result */
    float *got[2];     /* the result of pass 0 / pass 1 */
    uint8_t *keep;     /* op_def.keep of each element (NULL: none kept), set by op_keep_mask */
    void *base, *d;    /* device allocation and the tensor's first element */
} op_tensor;

typedef struct op_run op_run;
typedef struct {
    const char *name;
    const char *shape; /* names of op_case.s[], e.g. "n c" */
    int ndt;           /* how many of op_case.dt, dt2 the op reads (printed in the label) */
    const char *fname; /* what op_case.f means, NULL when unused */
    void (*build)(op_run *r);            /* declares the tensors, draws the inputs */
    void (*ref)(op_run *r);              /* fills ref of each output from the inputs (CPU) */
    void (*launch)(op_run *r, int pass); /* the kernel(s), on D() pointers, stream 0 */
    void (*derive)(op_run *r, int pass); /* refs that follow from the kernel's own output; may be NULL */
    int (*keep)(const op_run *r, const op_tensor *t, long i); /* 1: element must keep its bits; may be NULL */
    int flags;
    int min_cc;      /* compute capability the op needs (major*10+minor); 0: any */
    int launch_only; /* bit k: op_case.s[k] matters to the launch only (the self-check runs one such row) */
} op_def;

typedef struct {
    const op_def *op;
    long s[5];
    qt_dtype dt, dt2;
    int opt;
    float f;
    int off; /* elements of misalignment of every device pointer */
} op_case;

struct op_run {
    const op_case *c;
    uint64_t seed;
    qt_rng rng;
    op_tensor t[OP_MAXT];
    int nt, pass, quiet;
    long aux;        /* the launch's note for derive/keep (e.g. whether a fused epilogue ran) */
    char log[2048];  /* the first failures */
    int nfail;
};

/* ---- small helpers ---- */

static int op_es(qt_dtype dt) { return dt == DT_F64 ? 8 : dt == DT_I32 ? 4 : dt == DT_U8 ? 1 : qt_dtype_size(dt); }
static int op_is_fp8(qt_dtype dt) { return dt == QT_DT_E4M3 || dt == QT_DT_E5M2; }
static const char *op_dt_name(qt_dtype dt) {
    return dt == DT_I32 ? "i32" : dt == DT_F64 ? "fp64" : dt == DT_U8 ? "u8" : qt_dtype_name(dt);
}
static uint32_t op_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* qt_fp8_decode of every code, by table (the self-check decodes tens of millions). */
static float op_fp8_value(qt_dtype dt, uint8_t code) {
    static float tab[2][256];
    static int init;
    if (!init) {
        for (int c = 0; c < 256; c++) {
            tab[0][c] = qt_fp8_decode(QT_DT_E4M3, (uint8_t)c);
            tab[1][c] = qt_fp8_decode(QT_DT_E5M2, (uint8_t)c);
        }
        init = 1;
    }
    return tab[dt == QT_DT_E5M2][code];
}
/* The value the device stores for x (bf16 RNE; fp8 RNE without saturation, so Inf and NaN codes survive;
 * int32 by truncation, uint8 modulo 256). */
static float op_round(qt_dtype dt, float x) {
    if (dt == QT_DT_BF16) return qt_bf16_to_f32(qt_f32_to_bf16(x));
    if (op_is_fp8(dt)) return op_fp8_value(dt, qt_fp8_encode(dt, x, 0));
    if (dt == DT_I32) return (float)(int32_t)x;
    if (dt == DT_U8) return (float)((int)x & 255);
    return x;
}
/* About one unit in the last place of dt at v. */
static double op_ulp(qt_dtype dt, float v) {
    double a = fmax(fabs((double)v), 1e-30);
    int mant = dt == QT_DT_BF16 ? 7 : dt == QT_DT_E4M3 ? 3 : dt == QT_DT_E5M2 ? 2 : 23;
    if (dt == DT_I32 || dt == DT_U8) return 1;
    if (op_is_fp8(dt)) a = fmax(a, qt_fp8_decode(dt, 1) * 8);
    return ldexp(a, -mant);
}

static void op_encode(qt_dtype dt, const float *x, long n, void *raw) {
    for (long i = 0; i < n; i++) {
        if (dt == QT_DT_F32) memcpy((float *)raw + i, &x[i], 4);
        else if (dt == QT_DT_BF16) ((uint16_t *)raw)[i] = qt_f32_to_bf16(x[i]);
        else if (op_is_fp8(dt)) ((uint8_t *)raw)[i] = qt_fp8_encode(dt, x[i], 0);
        else if (dt == DT_I32) ((int32_t *)raw)[i] = (int32_t)x[i];
        else if (dt == DT_U8) ((uint8_t *)raw)[i] = (uint8_t)((int)x[i] & 255);
        else ((double *)raw)[i] = x[i];
    }
}
static void op_decode(qt_dtype dt, const void *raw, long n, float *x) {
    for (long i = 0; i < n; i++) {
        if (dt == QT_DT_F32) memcpy(&x[i], (const float *)raw + i, 4);
        else if (dt == QT_DT_BF16) x[i] = qt_bf16_to_f32(((const uint16_t *)raw)[i]);
        else if (op_is_fp8(dt)) x[i] = op_fp8_value(dt, ((const uint8_t *)raw)[i]);
        else if (dt == DT_I32) x[i] = (float)((const int32_t *)raw)[i];
        else if (dt == DT_U8) x[i] = (float)((const uint8_t *)raw)[i];
        else x[i] = (float)((const double *)raw)[i];
    }
}
/* What an element of dt reads as when its bytes are the poison of `pass`. */
static float op_poison(qt_dtype dt, int pass) {
    uint8_t raw[8];
    float f;
    memset(raw, OP_POISON[pass], sizeof raw);
    op_decode(dt, raw, 1, &f);
    return f;
}

static float *op_alloc(long n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    QT_CHECK(p, "out of host memory (%ld floats)", n);
    return p;
}

static void op_fail(op_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void op_fail(op_run *r, const char *fmt, ...) {
    size_t len = strlen(r->log);
    r->nfail++;
    if (len + 8 >= sizeof r->log) return;
    if (len) r->log[len++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->log + len, sizeof r->log - len, fmt, ap);
    va_end(ap);
}

/* ---- declaring tensors (from op_def.build) ---- */

static op_tensor *t_new(op_run *r, const char *name, int role, qt_dtype dt, long n) {
    QT_CHECK(r->nt < OP_MAXT, "op %s: more than %d tensors", r->c->op->name, OP_MAXT);
    op_tensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->role = role;
    t->dt = dt;
    t->n = n;
    return t;
}
/* An input of n values ~ N(0, std), rounded to dt. Returns the host values for the op to adjust (they are
 * rounded again after build). */
static float *t_in(op_run *r, const char *name, qt_dtype dt, long n, float std) {
    op_tensor *t = t_new(r, name, T_IN, dt, n);
    t->h = op_alloc(n);
    for (long i = 0; i < n; i++) t->h[i] = op_round(dt, std * qt_rng_normal(&r->rng));
    return t->h;
}
/* An output written with "=" (starts as the poison). */
static void t_out(op_run *r, const char *name, qt_dtype dt, long n, double atol, double rtol, int flags) {
    op_tensor *t = t_new(r, name, T_OUT, dt, n);
    t->atol = atol;
    t->rtol = rtol;
    t->flags = flags;
}
/* An output updated in place or accumulated (T_ADD), starting from N(0, std) values. */
static float *t_upd(op_run *r, const char *name, qt_dtype dt, long n, float std, double atol, double rtol, int flags) {
    float *h = t_in(r, name, dt, n, std);
    op_tensor *t = &r->t[r->nt - 1];
    t->role = T_UPD;
    t->atol = atol;
    t->rtol = rtol;
    t->flags = flags;
    return h;
}
/* Device scratch of `bytes` bytes, poisoned, never compared. */
static void t_ws(op_run *r, const char *name, size_t bytes) { t_new(r, name, T_WS, QT_DT_E4M3, (long)bytes); }

static op_tensor *T(op_run *r, const char *name) {
    for (int k = 0; k < r->nt; k++)
        if (!strcmp(r->t[k].name, name)) return &r->t[k];
    return NULL;
}
/* Host inputs / expected values / results by name (the op declared them). */
static float *H(op_run *r, const char *name) { return T(r, name)->h; }
static float *REF(op_run *r, const char *name) { return T(r, name)->ref; }
static float *GOT(op_run *r, const char *name, int pass) { return T(r, name)->got[pass]; }
/* The device pointer the launch passes: NULL for an absent tensor and for a T_PASS0 tensor in pass 1. */
static void *D(op_run *r, const char *name) {
    op_tensor *t = T(r, name);
    return !t || (r->pass == 1 && (t->flags & T_PASS0)) ? NULL : t->d;
}
/* Host values of an int32 tensor as int32_t (caller frees). */
static int32_t *op_ints(op_run *r, const char *name) {
    op_tensor *t = T(r, name);
    int32_t *v = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *v);
    QT_CHECK(v, "out of host memory");
    for (long i = 0; i < t->n; i++) v[i] = (int32_t)t->h[i];
    return v;
}
/* ref starts as a copy of the starting values (T_UPD) or zeros (T_OUT). */
static float *op_ref_init(op_tensor *t) {
    t->ref = op_alloc(t->n);
    if (t->h) memcpy(t->ref, t->h, (size_t)t->n * sizeof(float));
    else memset(t->ref, 0, (size_t)t->n * sizeof(float));
    return t->ref;
}

/* ---- the label of a row ---- */

static void op_label(const op_case *c, char *buf, size_t len) {
    const op_def *op = c->op;
    int k = snprintf(buf, len, "%s", op->name);
    char names[64];
    snprintf(names, sizeof names, "%s", op->shape);
    int j = 0;
    for (char *tok = strtok(names, " "); tok && j < 5; tok = strtok(NULL, " "), j++)
        k += snprintf(buf + k, len - (size_t)k, " %s=%ld", tok, c->s[j]);
    if (op->ndt >= 1) k += snprintf(buf + k, len - (size_t)k, " %s", op_dt_name(c->dt));
    if (op->ndt >= 2) k += snprintf(buf + k, len - (size_t)k, "<-%s", op_dt_name(c->dt2));
    for (int b = 0; b < (int)(sizeof OPT_NAMES / sizeof OPT_NAMES[0]); b++)
        if (c->opt & (1 << b)) k += snprintf(buf + k, len - (size_t)k, " +%s", OPT_NAMES[b]);
    if (c->opt >> 16) k += snprintf(buf + k, len - (size_t)k, " rope_type=%d", c->opt >> 16); /* op_defs_kernels.h */
    if (op->fname) k += snprintf(buf + k, len - (size_t)k, " %s=%g", op->fname, c->f);
    if (c->off) snprintf(buf + k, len - (size_t)k, " off=%d", c->off);
}

/* ---- one row: build, reference, free ---- */

/* Evaluates op_def.keep once per element (again after each launch: it may depend on r->aux). */
static void op_keep_mask(op_run *r) {
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        free(t->keep);
        t->keep = NULL;
        if (!r->c->op->keep || (t->role != T_OUT && t->role != T_UPD)) continue;
        for (long i = 0; i < t->n; i++)
            if (r->c->op->keep(r, t, i)) {
                if (!t->keep) t->keep = calloc((size_t)t->n, 1);
                QT_CHECK(t->keep, "out of host memory");
                t->keep[i] = 1;
            }
    }
}
static int op_kept(const op_tensor *t, long i) { return t->keep && t->keep[i]; }

static void op_start(op_run *r, const op_case *c, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->seed = seed;
    qt_rng_seed(&r->rng, seed);
    c->op->build(r);
    for (int k = 0; k < r->nt; k++) { /* what the device will hold */
        op_tensor *t = &r->t[k];
        if (t->h)
            for (long i = 0; i < t->n; i++) t->h[i] = op_round(t->dt, t->h[i]);
        if (t->role == T_OUT || t->role == T_UPD) op_ref_init(t);
    }
    c->op->ref(r);
    op_keep_mask(r);
}
static void op_finish(op_run *r) {
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        free(t->h);
        free(t->ref);
        free(t->got[0]);
        free(t->got[1]);
        free(t->keep);
        if (t->base) cudaFree(t->base);
    }
    r->nt = 0;
}


/* The bits a kept element must still have in this pass. */
static float op_start_value(const op_tensor *t, long i, int pass) { return t->h ? t->h[i] : op_poison(t->dt, pass); }
/* Pass 1 gives pass 0's bits, kept elements aside (they hold each pass's poison). Returns 1 when so. */
static int op_twin(op_run *r, const op_tensor *t) {
    for (long i = 0; i < t->n; i++)
        if (!op_kept(t, i) && op_bits(t->got[0][i]) != op_bits(t->got[1][i])) {
            op_fail(r, "  %s[%ld] differs between passes: %.9g then %.9g (nondeterministic, or reads the poison)",
                    t->name, i, t->got[0][i], t->got[1][i]);
            return 0;
        }
    return 1;
}

/* ---- the comparison (shared by the GPU run and the self-check) ---- */

static void op_compare(op_run *r, const op_tensor *t, int pass) {
    const float *got = t->got[pass], *ref = t->ref;
    float pz = op_poison(t->dt, pass);
    double num = 0, den = 0, worst = -1;
    long wi = -1, nbad = 0, kbad = -1;
    for (long i = 0; i < t->n; i++) {
        if (op_kept(t, i)) {
            if (kbad < 0 && op_bits(got[i]) != op_bits(t->h ? t->h[i] : pz)) kbad = i;
            continue;
        }
        double g = got[i], f = ref[i], ex;
        if (g == f) { /* equal, infinities included */
            den += isfinite(f) ? f * f : 0;
            continue;
        }
        if (isnan(f)) { /* a NaN is expected: any NaN the kernel wrote, never the untouched poison */
            if (isnan(g) && (op_is_fp8(t->dt) || op_bits(got[i]) != op_bits(pz))) continue;
            ex = INFINITY;
        } else {
            double d = fabs(g - f), lim = t->atol + t->rtol * fabs(f);
            if (d <= lim) {
                num += d * d;
                den += f * f;
                continue;
            }
            ex = isnan(d) || isinf(d) ? INFINITY : d - lim;
            if (isfinite(d)) num += d * d, den += f * f;
            else num = INFINITY;
        }
        nbad++;
        if (wi < 0 || ex > worst) worst = ex, wi = i;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num), nb = t->rtol > 0 ? t->rtol : t->atol > 0 ? INFINITY : 0;
    if (wi >= 0)
        op_fail(r, "  pass %d: %s (%s, %ld elements): worst [%ld] got %.9g ref %.9g (bound %.3g + %.3g*|ref|); "
                   "%ld elements out of bounds; rel L2 %.3g", pass, t->name, op_dt_name(t->dt), t->n, wi, got[wi],
                ref[wi], t->atol, t->rtol, nbad, rel);
    else if (!(rel <= nb))
        op_fail(r, "  pass %d: %s: rel L2 error %.3g above %.3g", pass, t->name, rel, nb);
    if (kbad >= 0)
        op_fail(r, "  pass %d: %s: element [%ld] must keep %.9g (%s), got %.9g", pass, t->name, kbad,
                op_start_value(t, kbad, pass), t->h ? "its old value" : "the poison", got[kbad]);
}

/* Everything a pass must satisfy, given each output's got[pass] (only: that tensor alone; NULL: all). */
static void op_verify(op_run *r, int pass, const op_tensor *only) {
    const op_def *op = r->c->op;
    r->pass = pass;
    if (op->derive) op->derive(r, pass);
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        if ((t->role != T_OUT && t->role != T_UPD) || (only && t != only)) continue;
        if (pass == 1 && (t->flags & T_PASS0)) { /* passed as NULL: untouched */
            for (long i = 0; i < t->n; i++)
                if (op_bits(t->got[1][i]) != op_bits(op_start_value(t, i, 1))) {
                    op_fail(r, "  pass 1: %s was not asked for (NULL) but [%ld] changed to %.9g", t->name, i,
                            t->got[1][i]);
                    break;
                }
            continue;
        }
        op_compare(r, t, pass);
        if (pass == 1 && !(op->flags & OP_NONDET)) op_twin(r, t);
    }
}

/* An input read back after the launch must hold what was uploaded. Returns 1 when so. */
static int op_same_input(op_run *r, const op_tensor *t, const float *g, int pass) {
    for (long i = 0; i < t->n; i++)
        if (op_bits(g[i]) != op_bits(t->h[i])) {
            op_fail(r, "  pass %d: input %s changed at [%ld]: %.9g -> %.9g", pass, t->name, i, t->h[i], g[i]);
            return 0;
        }
    return 1;
}

/* First byte of raw[0..total) outside [pre, pre+body) that is not the poison byte pb; -1 if none. */
static long op_guard_hit(const uint8_t *raw, size_t pre, size_t body, size_t total, uint8_t pb) {
    for (size_t i = 0; i < total; i++)
        if ((i < pre || i >= pre + body) && raw[i] != pb) return (long)i;
    return -1;
}

/* ---- the GPU run of one pass ---- */

/* Bytes before a tensor's first element: the guard, plus the row's misalignment (workspaces stay aligned). */
static size_t op_pre(const op_case *c, const op_tensor *t) {
    return OP_GUARD + (t->role == T_WS ? 0 : (size_t)c->off * (size_t)op_es(t->dt));
}

static int op_gpu_pass(op_run *r, int pass) {
    const op_case *c = r->c;
    uint8_t pb = OP_POISON[pass];
    r->pass = pass;
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        size_t es = (size_t)op_es(t->dt), body = (size_t)t->n * es, pre = op_pre(c, t), total = pre + body + OP_GUARD;
        if (!t->base && cudaMalloc(&t->base, total) != cudaSuccess) {
            op_fail(r, "cudaMalloc of %zu bytes for %s failed", total, t->name);
            return 0;
        }
        cudaMemset(t->base, pb, total);
        t->d = (char *)t->base + pre;
        if (t->h && body) {
            void *raw = malloc(body);
            op_encode(t->dt, t->h, t->n, raw);
            cudaMemcpy(t->d, raw, body, cudaMemcpyHostToDevice);
            free(raw);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) {
        c->op->launch(r, pass);
        e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        op_fail(r, "pass %d: CUDA error %s", pass, cudaGetErrorString(e));
        return 0;
    }
    if (r->nfail) return 0; /* the launch itself reported (e.g. cuDNN refused the shape) */
    op_keep_mask(r);
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        if (t->role == T_WS) continue;
        size_t body = (size_t)t->n * (size_t)op_es(t->dt), pre = op_pre(c, t), total = pre + body + OP_GUARD;
        uint8_t *raw = malloc(total);
        QT_CHECK(raw, "out of host memory");
        cudaMemcpy(raw, t->base, total, cudaMemcpyDeviceToHost);
        long hit = op_guard_hit(raw, pre, body, total, pb);
        if (hit >= 0)
            op_fail(r, "  pass %d: %s: wrote outside its %ld elements, at byte %ld %s", pass, t->name, t->n,
                    hit < (long)pre ? hit - (long)pre : hit - (long)(pre + body), hit < (long)pre ? "before" : "past the end");
        float *g = op_alloc(t->n);
        op_decode(t->dt, raw + pre, t->n, g);
        free(raw);
        if (t->role == T_IN) {
            op_same_input(r, t, g, pass);
            free(g);
        } else {
            t->got[pass] = g;
        }
    }
    op_verify(r, pass, NULL);
    return r->nfail == 0;
}

/* ---- the CPU self-check: emulated device, planted bugs ---- */

/* 1 when a and b differ only in what the launch alone reads: the same CPU side. */
static int op_same_cpu_side(const op_case *a, const op_case *b) {
    if (a->op != b->op || a->dt != b->dt || a->dt2 != b->dt2 || a->opt != b->opt || a->f != b->f || a->off != b->off)
        return 0;
    for (int k = 0; k < 5; k++)
        if (a->s[k] != b->s[k] && !(a->op->launch_only & (1 << k))) return 0;
    return 1;
}

/* The result a correct kernel could give: ref rounded to the output dtype, kept elements untouched. */
static void op_emulate(op_run *r, int pass) {
    r->pass = pass;
    for (int round = 0; round < 2; round++) { /* derived tensors after the others: they read them */
        if (round == 1 && r->c->op->derive) r->c->op->derive(r, pass);
        for (int k = 0; k < r->nt; k++) {
            op_tensor *t = &r->t[k];
            if ((t->role != T_OUT && t->role != T_UPD) || !!(t->flags & T_DERIVED) != round) continue;
            if (!t->got[pass]) t->got[pass] = op_alloc(t->n);
            for (long i = 0; i < t->n; i++)
                t->got[pass][i] = (pass == 1 && (t->flags & T_PASS0)) || op_kept(t, i)
                                      ? op_start_value(t, i, pass) : op_round(t->dt, t->ref[i]);
        }
    }
}

/* A value of dt that lies well outside v's bound. */
static float op_mutate(const op_tensor *t, float v) {
    double delta = 4 * (t->atol + t->rtol * fabs((double)v)) + 4 * op_ulp(t->dt, v);
    float m = op_round(t->dt, (float)(v + delta));
    if (fabs((double)m - v) <= t->atol + t->rtol * fabs((double)v)) m = op_round(t->dt, (float)(v - delta));
    return m;
}

/* Any other value of dt: v moved well outside its bound, or 0 for a NaN / Inf. */
static float op_other(const op_tensor *t, float v) { return isfinite(v) ? op_mutate(t, v) : 0.0f; }

/* Verifies tensor t of a pass that holds one planted bug; returns 1 when it is caught and (when `want` is
 * set) the log names it. */
static int op_caught(op_run *r, int pass, const op_tensor *t, const char *want) {
    r->nfail = 0;
    r->log[0] = 0;
    op_verify(r, pass, t);
    return r->nfail > 0 && (!want || strstr(r->log, want));
}

/* Returns the number of planted bugs that went unnoticed (each printed as "  missed: ..."); a correct
 * emulated result that fails is counted too, its message left in r->log. *planted counts the bugs tried. */
static int op_selfcheck_row(op_run *r, int *planted) {
    int missed = 0;
    op_emulate(r, 0);
    op_emulate(r, 1);
    op_verify(r, 0, NULL);
    op_verify(r, 1, NULL);
    if (r->nfail) return 1;
    for (int k = 0; k < r->nt; k++) {
        op_tensor *t = &r->t[k];
        if (t->h && t->n) { /* the upload is lossless: what the device gets is what the reference read */
            void *raw = malloc((size_t)t->n * (size_t)op_es(t->dt));
            float *back = op_alloc(t->n);
            QT_CHECK(raw, "out of host memory");
            op_encode(t->dt, t->h, t->n, raw);
            op_decode(t->dt, raw, t->n, back);
            if (!op_same_input(r, t, back, 0)) missed++, printf("  missed: %s does not survive its upload\n", t->name);
            back[t->n - 1] = op_other(t, t->h[t->n - 1]); /* an input the kernel overwrote */
            (*planted)++;
            r->nfail = 0;
            if (op_same_input(r, t, back, 0)) missed++, printf("  missed: input %s changed went unnoticed\n", t->name);
            free(raw);
            free(back);
        }
        if ((t->role != T_OUT && t->role != T_UPD) || t->n == 0) continue;
        float *g = t->got[0], *save = op_alloc(t->n);
        memcpy(save, g, (size_t)t->n * sizeof *g);
        long i = -1, kept = -1;
        for (int tries = 0; tries < 64 && i < 0; tries++) { /* a free element with a finite ref, not the poison */
            long j = (long)qt_rng_below(&r->rng, (uint64_t)t->n);
            if (!op_kept(t, j) && isfinite(t->ref[j]) && op_round(t->dt, t->ref[j]) != op_poison(t->dt, 0)) i = j;
        }
        for (long j = 0; j < t->n && kept < 0; j++)
            if (op_kept(t, j)) kept = j;
        char at[48];
        if (i >= 0) {
            snprintf(at, sizeof at, "worst [%ld]", i);
            g[i] = op_mutate(t, t->ref[i]); /* one element off: caught, and named */
            (*planted)++;
            if (!op_caught(r, 0, t, at)) missed++, printf("  missed: %s[%ld] off by a bound went unnoticed\n", t->name, i);
            g[i] = op_poison(t->dt, 0); /* one element never written */
            (*planted)++;
            if (!op_caught(r, 0, t, at)) missed++, printf("  missed: %s[%ld] left as poison went unnoticed\n", t->name, i);
            memcpy(g, save, (size_t)t->n * sizeof *g);
        }
        if (kept >= 0) { /* an element the op must leave alone, written */
            g[kept] = op_other(t, op_start_value(t, kept, 0));
            (*planted)++;
            if (!op_caught(r, 0, t, "must keep")) missed++, printf("  missed: %s[%ld] overwritten went unnoticed\n", t->name, kept);
            memcpy(g, save, (size_t)t->n * sizeof *g);
        }
        if (t->flags & T_ADD) { /* "=" instead of "+=": the starting values lost */
            for (long j = 0; j < t->n; j++)
                if (!op_kept(t, j)) g[j] = op_round(t->dt, t->ref[j] - t->h[j]);
            (*planted)++;
            if (!op_caught(r, 0, t, NULL)) missed++, printf("  missed: %s written instead of accumulated went unnoticed\n", t->name);
            memcpy(g, save, (size_t)t->n * sizeof *g);
        }
        if (i >= 0 && !(r->c->op->flags & OP_NONDET) && !(t->flags & T_PASS0)) { /* pass 1 one step away */
            float *g1 = t->got[1], keep1 = g1[i];
            g1[i] = op_round(t->dt, (float)(g1[i] + op_ulp(t->dt, g1[i]) * 1.5));
            if (g1[i] == keep1) g1[i] = op_round(t->dt, (float)(keep1 - op_ulp(t->dt, keep1) * 1.5));
            (*planted)++;
            if (!op_caught(r, 1, t, "differs between passes"))
                missed++, printf("  missed: %s[%ld] different in pass 1 went unnoticed\n", t->name, i);
            g1[i] = keep1;
        }
        if (t->flags & T_PASS0) { /* an optional output written although NULL was passed */
            float *g1 = t->got[1], keep1 = g1[0];
            g1[0] = op_other(t, op_start_value(t, 0, 1));
            (*planted)++;
            if (!op_caught(r, 1, t, "not asked for")) missed++, printf("  missed: %s written in pass 1 went unnoticed\n", t->name);
            g1[0] = keep1;
        }
        free(save);
    }
    r->nfail = 0;
    r->log[0] = 0;
    return missed;
}

#endif
