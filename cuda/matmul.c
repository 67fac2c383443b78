/* matmul.c — cuBLASLt GEMMs: bf16 fwd/dgrad/wgrad and fp8 TN, a per-shape plan cache, autotuning.
 *
 * Row-major callers, column-major cuBLASLt: a row-major [r,c] buffer IS the column-major [c,r]
 * matrix (ld = c), so every product is computed transposed:
 *   fwd   Y^T[O,N]  = W[O,I] (buffer W, op T) . X^T[I,N] (buffer X, op N)     m=O n=N k=I  "TN"
 *   dgrad dX^T[I,N] = W^T[I,O] (buffer W, op N) . dY^T[O,N] (buffer dY, op N) m=I n=N k=O  "NN"
 *   wgrad dW^T[I,O] = X^T[I,N] (buffer X, op N) . dY[N,O] (buffer dY, op T)   m=I n=O k=N  "NT"
 *   fp8   D^T[N,M]  = B[N,K] (buffer B, op T) . A^T[K,M] (buffer A, op N)     m=N n=M k=K  "TN"
 * Hence the forward/fp8 bias runs along m (EPILOGUE_BIAS adds one value per row of the col-major D =
 * per column of the row-major output) and wgrad's bias gradient reduces B = dY over k (BGRADB).
 * Compute fp32 (CUBLAS_COMPUTE_32F), alpha = 1 (the _ld forms: the caller's), beta = 0 or 1 (accumulate into the
 * output). */
#include "qt_matmul.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"

#define MAX_ALGOS 8
#define TUNE_SCRATCH_MAX ((size_t)1 << 30) /* largest scratch output allocated to tune an accumulating GEMM */

typedef struct { /* everything a plan depends on; memset to 0 before filling so memcmp works */
    int32_t transa, transb, atype, btype, dtype, epi, bias_type, fast_accum;
    int64_t m, n, k, lda, ldb, ldd;
    int32_t align_a, align_b, align_d, pad;
} mm_key;

typedef struct {
    mm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int ok; /* 0: the heuristic offered nothing (an unsupported epilogue) */
} mm_plan;

typedef struct { /* the pointers of one call */
    const void *a, *b;
    void *d;
    const void *bias;
    const float *sa, *sb;
    float alpha; /* the product's scale (1 but for the _ld forms) */
    int accumulate;
    cudaStream_t s;
} mm_call;

struct qt_matmul_ctx {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    int autotune, cc, device, sms;
    char dev_name[256];
    mm_plan *plans;
    int nplans, cap;
    long built;
};

static cudaDataType_t cuda_type(qt_dtype t) {
    switch (t) {
    case QT_DT_F32: return CUDA_R_32F;
    case QT_DT_BF16: return CUDA_R_16BF;
    case QT_DT_F16: return CUDA_R_16F;
    case QT_DT_E4M3: return CUDA_R_8F_E4M3;
    case QT_DT_E5M2: return CUDA_R_8F_E5M2;
    }
    QT_CHECK(0, "unknown dtype %d", (int)t);
    return CUDA_R_32F;
}

static int ptr_align(const void *p) { /* the alignment cuBLASLt may assume, 256 at most */
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u % (uintptr_t)a)) a >>= 1;
    return a;
}

size_t qt_matmul_tune_scratch_bytes(size_t out_bytes) { return out_bytes > TUNE_SCRATCH_MAX ? 0 : out_bytes; }

qt_matmul_ctx *qt_matmul_create(size_t ws_bytes) {
    qt_matmul_ctx *c = calloc(1, sizeof *c);
    QT_CHECK(c != NULL, "out of host memory");
    QT_CUBLAS(cublasLtCreate(&c->lt));
    c->ws_bytes = ws_bytes ? ws_bytes : QT_MATMUL_WS_DEFAULT;
    QT_CUDA(cudaMalloc(&c->ws, c->ws_bytes));
    c->autotune = 1; /* the trainer sets perf.matmul_autotune through qt_matmul_set_autotune */
    struct cudaDeviceProp prop;
    QT_CUDA(cudaGetDevice(&c->device));
    QT_CUDA(cudaGetDeviceProperties(&prop, c->device));
    c->cc = prop.major * 10 + prop.minor;
    c->sms = prop.multiProcessorCount;
    snprintf(c->dev_name, sizeof c->dev_name, "%s", prop.name);
    return c;
}

void qt_matmul_free(qt_matmul_ctx *c) {
    if (!c) return;
    for (int i = 0; i < c->nplans; i++) {
        mm_plan *p = &c->plans[i];
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->ld);
        cublasLtMatmulDescDestroy(p->desc);
    }
    free(c->plans);
    cudaFree(c->ws);
    cublasLtDestroy(c->lt);
    free(c);
}

void qt_matmul_set_autotune(qt_matmul_ctx *c, int on) { c->autotune = on; }
long qt_matmul_plan_count(const qt_matmul_ctx *c) { return c->built; }
int qt_matmul_cc(const qt_matmul_ctx *c) { return c->cc; }

static void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
    QT_CUBLAS(cublasLtMatmulDescSetAttribute(d, a, v, n));
}

/* One cublasLtMatmul with the plan's descriptors; the per-call pointers go into the shared desc. */
static cublasStatus_t mm_launch(qt_matmul_ctx *c, mm_plan *p, const mm_call *k, const cublasLtMatmulAlgo_t *algo,
                                void *d) {
    if (p->key.epi != CUBLASLT_EPILOGUE_DEFAULT) set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &k->bias, sizeof k->bias);
    if (p->key.atype == CUDA_R_8F_E4M3 || p->key.atype == CUDA_R_8F_E5M2) {
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &k->sa, sizeof k->sa);
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &k->sb, sizeof k->sb);
    }
    float beta = k->accumulate ? 1.0f : 0.0f;
    return cublasLtMatmul(c->lt, p->desc, &k->alpha, k->a, p->la, k->b, p->lb, &beta, d, p->ld, d, p->ld, algo, c->ws,
                          c->ws_bytes, k->s);
}

/* Mean time in ms of `reps` back-to-back launches; negative when the algorithm fails to launch. */
static float time_algo(qt_matmul_ctx *c, mm_plan *p, const mm_call *k, const cublasLtMatmulAlgo_t *algo, void *d,
                       int reps, cudaEvent_t e0, cudaEvent_t e1) {
    QT_CUDA(cudaEventRecord(e0, k->s));
    for (int i = 0; i < reps; i++)
        if (mm_launch(c, p, k, algo, d) != CUBLAS_STATUS_SUCCESS) return -1;
    QT_CUDA(cudaEventRecord(e1, k->s));
    QT_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    QT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define TUNE_ROUNDS 7
#define TUNE_MARGIN 0.02f /* a candidate must beat the heuristic's first by this much to replace it */

/* Picks the fastest of the heuristic's candidates; -1 when none of them launches. The GPU is first
 * brought to its sustained (power-limited) clocks, then the candidates are timed round-robin and
 * compared by their median over the rounds: timed one after the other, an early candidate ran on
 * cooler, faster clocks and won by drift, not by speed (gemm_bench saw a "winner" 12% slower than the
 * heuristic's first). Accumulating calls run on a scratch output so the caller's partial sums survive;
 * when that cannot be had (or under graph capture), the first candidate stays. */
static int tune(qt_matmul_ctx *c, mm_plan *p, const mm_call *k, const cublasLtMatmulHeuristicResult_t *res, int n) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    QT_CUDA(cudaStreamIsCapturing(k->s, &cap));
    if (cap != cudaStreamCaptureStatusNone) return 0;
    void *d = k->d, *scratch = NULL;
    if (k->accumulate) {
        size_t dsz = p->key.dtype == CUDA_R_32F ? 4 : 2, bytes = (size_t)p->key.ldd * (size_t)p->key.n * dsz;
        if (!qt_matmul_tune_scratch_bytes(bytes) || cudaMalloc(&scratch, bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* an out-of-memory here only means "do not tune" */
            return 0;
        }
        d = scratch;
    }
    cudaEvent_t e0, e1;
    QT_CUDA(cudaEventCreate(&e0));
    QT_CUDA(cudaEventCreate(&e1));
    /* Launches per timing: about 1 ms of work, from one probe launch of the first candidate. */
    int first = 0;
    while (first < n && res[first].state != CUBLAS_STATUS_SUCCESS) first++;
    float probe = first < n ? time_algo(c, p, k, &res[first].algo, d, 2, e0, e1) : -1; /* loads the kernel */
    if (probe > 0) probe = time_algo(c, p, k, &res[first].algo, d, 1, e0, e1);
    int reps = probe > 0 ? (int)(1.0f / probe) : 1;
    reps = reps < 1 ? 1 : reps > 50 ? 50 : reps;
    if (probe > 0) (void)time_algo(c, p, k, &res[first].algo, d, 20 * reps, e0, e1); /* ~20 ms of warm-up */
    float t[MAX_ALGOS][TUNE_ROUNDS];
    int alive[MAX_ALGOS];
    for (int i = 0; i < n; i++) alive[i] = res[i].state == CUBLAS_STATUS_SUCCESS;
    for (int r = 0; r < TUNE_ROUNDS; r++)
        for (int i = 0; i < n; i++)
            if (alive[i] && (t[i][r] = time_algo(c, p, k, &res[i].algo, d, reps, e0, e1)) < 0) alive[i] = 0;
    QT_CUDA(cudaEventDestroy(e0));
    QT_CUDA(cudaEventDestroy(e1));
    if (scratch) QT_CUDA(cudaFree(scratch));
    int best = -1;
    float best_ms = 0;
    for (int i = 0; i < n; i++) {
        if (!alive[i]) continue;
        qsort(t[i], TUNE_ROUNDS, sizeof t[i][0], cmp_f);
        float ms = t[i][TUNE_ROUNDS / 2];
        if (best < 0) ms *= 1 - TUNE_MARGIN; /* the heuristic's own pick gets the benefit of the doubt */
        if (best < 0 || ms < best_ms) { best_ms = ms; best = i; }
    }
    return best;
}

/* ---- the autotuned choices, shared by every context of the process ----
 * One record per (GPU model, shape key): the index of the chosen algorithm in the heuristic's candidate
 * list, which is the same list for the same key, cuBLASLt version and GPU model. The first context to
 * tune a key records its pick; every context after it (other ranks, later engines, a resumed run that
 * loaded the records) takes the recorded pick instead of timing again, so they all multiply alike. */
typedef struct {
    mm_key key;
    int32_t cc, sms;  /* the GPU model the pick was timed on */
    int32_t index, n; /* the pick among the heuristic's n candidates */
} mm_choice;

static pthread_mutex_t g_choice_mu = PTHREAD_MUTEX_INITIALIZER;
static mm_choice *g_choices;
static long g_nchoices, g_capchoices;

static mm_choice *choice_find(const qt_matmul_ctx *c, const mm_key *key) { /* under g_choice_mu */
    for (long i = 0; i < g_nchoices; i++)
        if (g_choices[i].cc == c->cc && g_choices[i].sms == c->sms && !memcmp(&g_choices[i].key, key, sizeof *key))
            return &g_choices[i];
    return NULL;
}

static void choice_add(const mm_choice *ch) { /* under g_choice_mu; the key is not there yet */
    if (g_nchoices == g_capchoices) {
        long cap = g_capchoices ? 2 * g_capchoices : 64;
        mm_choice *m = realloc(g_choices, (size_t)cap * sizeof *m);
        QT_CHECK(m != NULL, "out of host memory");
        g_choices = m, g_capchoices = cap;
    }
    g_choices[g_nchoices++] = *ch;
}

/* The recorded pick of this key, or -1 (none, or recorded for another candidate count). */
static int choice_get(const qt_matmul_ctx *c, const mm_key *key, int n) {
    pthread_mutex_lock(&g_choice_mu);
    mm_choice *ch = choice_find(c, key);
    int idx = ch && ch->n == n && ch->index < n ? ch->index : -1;
    pthread_mutex_unlock(&g_choice_mu);
    return idx;
}

/* Records best unless another context recorded this key first; returns the recorded pick. */
static int choice_put(const qt_matmul_ctx *c, const mm_key *key, int best, int n) {
    pthread_mutex_lock(&g_choice_mu);
    mm_choice *ch = choice_find(c, key);
    if (!ch) choice_add(&(mm_choice){.key = *key, .cc = c->cc, .sms = c->sms, .index = best, .n = n});
    else if (ch->n == n) best = ch->index;
    pthread_mutex_unlock(&g_choice_mu);
    return best;
}

#define CHOICES_MAGIC "QTMMALG1"
typedef struct { /* the serialized records' header */
    char magic[8];
    uint32_t lt_version, key_bytes;
    int64_t count;
} choices_hdr;

size_t qt_matmul_choices_save(void *buf, size_t cap) {
    pthread_mutex_lock(&g_choice_mu);
    size_t need = sizeof(choices_hdr) + (size_t)g_nchoices * sizeof(mm_choice);
    if (buf && cap >= need) {
        choices_hdr h = {.lt_version = (uint32_t)cublasLtGetVersion(), .key_bytes = sizeof(mm_key), .count = g_nchoices};
        memcpy(h.magic, CHOICES_MAGIC, 8);
        memcpy(buf, &h, sizeof h);
        if (g_nchoices) memcpy((char *)buf + sizeof h, g_choices, (size_t)g_nchoices * sizeof(mm_choice));
    }
    pthread_mutex_unlock(&g_choice_mu);
    return need;
}

int qt_matmul_choices_load(const void *buf, size_t n, char *err, size_t errlen) {
    choices_hdr h;
    if (n < sizeof h) return qt_errf(err, errlen, "%zu bytes: shorter than the header", n);
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, CHOICES_MAGIC, 8) || h.key_bytes != sizeof(mm_key) || h.count < 0 ||
        (size_t)h.count > (n - sizeof h) / sizeof(mm_choice) || n != sizeof h + (size_t)h.count * sizeof(mm_choice))
        return qt_errf(err, errlen, "not matmul algorithm records of this build (%zu bytes)", n);
    if (h.lt_version != (uint32_t)cublasLtGetVersion())
        return qt_errf(err, errlen, "timed with cuBLASLt %u, this is %zu (its candidate lists may differ)", h.lt_version,
                       cublasLtGetVersion());
    const mm_choice *in = (const mm_choice *)((const char *)buf + sizeof h);
    pthread_mutex_lock(&g_choice_mu);
    for (int64_t i = 0; i < h.count; i++) {
        mm_choice ch;
        memcpy(&ch, &in[i], sizeof ch);
        if (ch.index < 0 || ch.index >= ch.n || ch.n > MAX_ALGOS) continue;
        mm_choice *have = NULL;
        for (long j = 0; j < g_nchoices && !have; j++)
            if (g_choices[j].cc == ch.cc && g_choices[j].sms == ch.sms && !memcmp(&g_choices[j].key, &ch.key, sizeof ch.key))
                have = &g_choices[j];
        if (have) *have = ch; /* the loaded record wins: it is what the run being continued used */
        else choice_add(&ch);
    }
    pthread_mutex_unlock(&g_choice_mu);
    return 0;
}


static void build_plan(qt_matmul_ctx *c, mm_plan *p, const mm_call *k) {
    const mm_key *y = &p->key;
    QT_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = y->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = y->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)y->epi;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (y->epi != CUBLASLT_EPILOGUE_DEFAULT) {
        int32_t bt = y->bias_type;
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    if (y->atype == CUDA_R_8F_E4M3 || y->atype == CUDA_R_8F_E5M2) {
        int8_t fa = (int8_t)y->fast_accum;
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
        /* The heuristic sees the same descriptor the launches use: scale pointers set, as at launch. */
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &k->sa, sizeof k->sa);
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &k->sb, sizeof k->sb);
    }
    /* Stored shapes: op(A) is m x k, op(B) is k x n, D is m x n (column-major). */
    QT_CUBLAS(cublasLtMatrixLayoutCreate(&p->la, (cudaDataType_t)y->atype, y->transa ? y->k : y->m,
                                         y->transa ? y->m : y->k, y->lda));
    QT_CUBLAS(cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType_t)y->btype, y->transb ? y->n : y->k,
                                         y->transb ? y->k : y->n, y->ldb));
    QT_CUBLAS(cublasLtMatrixLayoutCreate(&p->ld, (cudaDataType_t)y->dtype, y->m, y->n, y->ldd));

    cublasLtMatmulPreference_t pref;
    QT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = c->ws_bytes;
    uint32_t aa = (uint32_t)y->align_a, ab = (uint32_t)y->align_b, ad = (uint32_t)y->align_d;
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    /* Split-K partial sums stay in fp32: the INPLACE and OUTPUT_TYPE schemes add the slices in D's dtype, so
     * a bf16 D (an accumulating wgrad's dW += dY^T X above all) would be rounded once per slice. */
    uint32_t red = y->dtype == CUDA_R_32F ? CUBLASLT_REDUCTION_SCHEME_MASK : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    QT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, MAX_ALGOS,
                                                       res, &n);
    QT_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    c->built++;
    if (st != CUBLAS_STATUS_SUCCESS || n == 0) {
        /* An unsupported fused epilogue is the caller's to handle; a plain GEMM without kernel is fatal. */
        QT_CHECK(y->epi == CUBLASLT_EPILOGUE_BGRADB,
                 "cuBLASLt (%zu) has no algorithm for m=%ld n=%ld k=%ld trans=%c%c types a=%d b=%d d=%d epilogue=%d "
                 "on %s (cc %d): status %d",
                 cublasLtGetVersion(), (long)y->m, (long)y->n, (long)y->k, y->transa ? 'T' : 'N',
                 y->transb ? 'T' : 'N', y->atype, y->btype, y->dtype, y->epi, c->dev_name, c->cc, (int)st);
        p->ok = 0;
        return;
    }
    int best = 0;
    if (c->autotune && n > 1 && (best = choice_get(c, y, n)) < 0) {
        best = tune(c, p, k, res, n);
        if (best >= 0) best = choice_put(c, y, best, n);
    }
    if (best < 0) { /* every candidate failed to launch: say which problem, not just the status */
        p->ok = 0;
        QT_CHECK(y->epi == CUBLASLT_EPILOGUE_BGRADB,
                 "cuBLASLt (%zu): none of the %d algorithms offered for m=%ld n=%ld k=%ld trans=%c%c types a=%d b=%d "
                 "d=%d epilogue=%d launches on %s (cc %d)",
                 cublasLtGetVersion(), n, (long)y->m, (long)y->n, (long)y->k, y->transa ? 'T' : 'N',
                 y->transb ? 'T' : 'N', y->atype, y->btype, y->dtype, y->epi, c->dev_name, c->cc);
        return;
    }
    p->algo = res[best].algo;
    p->ok = 1;
}

static mm_plan *get_plan(qt_matmul_ctx *c, const mm_key *key, const mm_call *k) {
    for (int i = 0; i < c->nplans; i++)
        if (!memcmp(&c->plans[i].key, key, sizeof *key)) return &c->plans[i];
    if (c->nplans == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->plans = realloc(c->plans, (size_t)c->cap * sizeof *c->plans);
        QT_CHECK(c->plans != NULL, "out of host memory");
    }
    mm_plan *p = &c->plans[c->nplans];
    memset(p, 0, sizeof *p);
    p->key = *key;
    build_plan(c, p, k);
    c->nplans++;
    return p;
}

/* Fills the key's shape part and alignments; types and epilogue are the caller's. */
static void key_shape(mm_key *y, int ta, int tb, long m, long n, long k, long lda, long ldb, long ldd,
                      const mm_call *call) {
    y->transa = ta;
    y->transb = tb;
    y->m = m;
    y->n = n;
    y->k = k;
    y->lda = lda;
    y->ldb = ldb;
    y->ldd = ldd;
    y->align_a = ptr_align(call->a);
    y->align_b = ptr_align(call->b);
    y->align_d = ptr_align(call->d);
}

static int run(qt_matmul_ctx *c, const mm_key *key, const mm_call *k) {
    mm_plan *p = get_plan(c, key, k);
    if (!p->ok) return 0;
    cublasStatus_t st = mm_launch(c, p, k, &p->algo, k->d);
    if (st != CUBLAS_STATUS_SUCCESS) {
        const mm_key *y = &p->key;
        fprintf(stderr, "cuBLASLt (%zu) launch failed: m=%ld n=%ld k=%ld trans=%c%c types a=%d b=%d d=%d epilogue=%d "
                "lda=%ld ldb=%ld ldd=%ld align a/b/d=%d/%d/%d fast_accum=%d on %s (cc %d)\n", cublasLtGetVersion(),
                (long)y->m, (long)y->n, (long)y->k, y->transa ? 'T' : 'N', y->transb ? 'T' : 'N', y->atype, y->btype,
                y->dtype, y->epi, (long)y->lda, (long)y->ldb, (long)y->ldd, y->align_a, y->align_b, y->align_d,
                y->fast_accum, c->dev_name, c->cc);
        QT_CUBLAS(st);
    }
    return 1;
}

static void check_out_type(qt_dtype t, const char *fn) {
    QT_CHECK(t == QT_DT_BF16 || t == QT_DT_F32, "%s: output dtype %s: expected bf16 or fp32", fn, qt_dtype_name(t));
}

/* The three bf16 products with every operand's row stride and the product's scale alpha (the public forms below
 * pass dense strides and alpha 1). */
static void fwd(qt_matmul_ctx *c, void *y, qt_dtype ydt, long ldy, const void *x, long ldx, const void *w,
                const void *bias, long N, int I, int O, float alpha, int accumulate, cudaStream_t s) {
    mm_call k = {.a = w, .b = x, .d = y, .bias = bias, .alpha = alpha, .accumulate = accumulate, .s = s};
    mm_key key;
    memset(&key, 0, sizeof key);
    key_shape(&key, 1, 0, O, N, I, I, ldx, ldy, &k);
    key.atype = key.btype = CUDA_R_16BF;
    key.dtype = cuda_type(ydt);
    key.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    key.bias_type = key.dtype;
    run(c, &key, &k);
}

static void dgrad(qt_matmul_ctx *c, void *dx, qt_dtype dxdt, long lddx, const void *dy, long lddy, const void *w, long N,
                  int I, int O, float alpha, int accumulate, cudaStream_t s) {
    mm_call k = {.a = w, .b = dy, .d = dx, .alpha = alpha, .accumulate = accumulate, .s = s};
    mm_key key;
    memset(&key, 0, sizeof key);
    key_shape(&key, 0, 0, I, N, O, I, lddy, lddx, &k);
    key.atype = key.btype = CUDA_R_16BF;
    key.dtype = cuda_type(dxdt);
    key.epi = CUBLASLT_EPILOGUE_DEFAULT;
    run(c, &key, &k);
}

static int wgrad(qt_matmul_ctx *c, void *dw, qt_dtype dwdt, void *dbias, const void *dy, long lddy, const void *x,
                 long ldx, long N, int I, int O, float alpha, int accumulate, cudaStream_t s) {
    mm_call k = {.a = x, .b = dy, .d = dw, .bias = dbias, .alpha = alpha, .accumulate = accumulate, .s = s};
    mm_key key;
    memset(&key, 0, sizeof key);
    key_shape(&key, 0, 1, I, O, N, ldx, lddy, I, &k);
    key.atype = key.btype = CUDA_R_16BF;
    key.dtype = cuda_type(dwdt);
    key.bias_type = key.dtype;
    if (dbias) {
        key.epi = CUBLASLT_EPILOGUE_BGRADB;
        if (run(c, &key, &k)) return 1;
    }
    key.epi = CUBLASLT_EPILOGUE_DEFAULT;
    key.bias_type = 0;
    k.bias = NULL;
    run(c, &key, &k);
    return 0;
}

void qt_matmul_fwd(qt_matmul_ctx *c, void *y, qt_dtype ydt, const void *x, const void *w, const void *bias, long N,
                   int I, int O, int accumulate, cudaStream_t s) {
    check_out_type(ydt, "qt_matmul_fwd");
    fwd(c, y, ydt, O, x, I, w, bias, N, I, O, 1.0f, accumulate, s);
}

void qt_matmul_dgrad(qt_matmul_ctx *c, void *dx, qt_dtype dxdt, const void *dy, const void *w, long N, int I, int O,
                     int accumulate, cudaStream_t s) {
    check_out_type(dxdt, "qt_matmul_dgrad");
    dgrad(c, dx, dxdt, I, dy, O, w, N, I, O, 1.0f, accumulate, s);
}

int qt_matmul_wgrad(qt_matmul_ctx *c, void *dw, qt_dtype dwdt, void *dbias, const void *dy, const void *x, long N,
                    int I, int O, int accumulate, cudaStream_t s) {
    check_out_type(dwdt, "qt_matmul_wgrad");
    return wgrad(c, dw, dwdt, dbias, dy, O, x, I, N, I, O, 1.0f, accumulate, s);
}

/* A row stride below the row's length would overlap the rows. */
static void check_ld(long ld, int len, const char *fn, const char *what) {
    QT_CHECK(ld >= len, "%s: %s row stride %ld below its row length %d", fn, what, ld, len);
}

void qt_matmul_fwd_ld(qt_matmul_ctx *c, void *y, qt_dtype ydt, long ldy, const void *x, long ldx, const void *w, long N,
                      int I, int O, float alpha, int accumulate, cudaStream_t s) {
    check_out_type(ydt, "qt_matmul_fwd_ld");
    check_ld(ldy, O, "qt_matmul_fwd_ld", "y");
    check_ld(ldx, I, "qt_matmul_fwd_ld", "x");
    fwd(c, y, ydt, ldy, x, ldx, w, NULL, N, I, O, alpha, accumulate, s);
}

void qt_matmul_dgrad_ld(qt_matmul_ctx *c, void *dx, qt_dtype dxdt, long lddx, const void *dy, long lddy, const void *w,
                        long N, int I, int O, float alpha, int accumulate, cudaStream_t s) {
    check_out_type(dxdt, "qt_matmul_dgrad_ld");
    check_ld(lddx, I, "qt_matmul_dgrad_ld", "dx");
    check_ld(lddy, O, "qt_matmul_dgrad_ld", "dy");
    dgrad(c, dx, dxdt, lddx, dy, lddy, w, N, I, O, alpha, accumulate, s);
}

void qt_matmul_wgrad_ld(qt_matmul_ctx *c, void *dw, qt_dtype dwdt, const void *dy, long lddy, const void *x, long ldx,
                        long N, int I, int O, float alpha, int accumulate, cudaStream_t s) {
    check_out_type(dwdt, "qt_matmul_wgrad_ld");
    check_ld(lddy, O, "qt_matmul_wgrad_ld", "dy");
    check_ld(ldx, I, "qt_matmul_wgrad_ld", "x");
    wgrad(c, dw, dwdt, NULL, dy, lddy, x, ldx, N, I, O, alpha, accumulate, s);
}

void qt_matmul_fp8(qt_matmul_ctx *c, void *d, qt_dtype ddt, const void *a, qt_dtype adt, const float *a_scale,
                   const void *b, qt_dtype bdt, const float *b_scale, const void *bias, long M, int N, int K,
                   int fast_accum, int accumulate, cudaStream_t s) {
    QT_CHECK(c->cc >= 89, "fp8 matmul needs fp8 tensor cores (cc >= 8.9): device %d \"%s\" has cc %d.%d", c->device,
             c->dev_name, c->cc / 10, c->cc % 10);
    QT_CHECK((adt == QT_DT_E4M3 || adt == QT_DT_E5M2) && (bdt == QT_DT_E4M3 || bdt == QT_DT_E5M2) &&
                 !(adt == QT_DT_E5M2 && bdt == QT_DT_E5M2),
             "qt_matmul_fp8: operand types %s x %s: expected e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3",
             qt_dtype_name(adt), qt_dtype_name(bdt));
    /* Hopper's fp8 kernels (TMA tiles) need every dimension of the TN problem 16-byte aligned, M (the
     * column count of cuBLASLt's col-major D) included: M=1/7/33 pass the heuristic and then fail in
     * cublasLtMatmul with CUBLAS_STATUS_NOT_SUPPORTED. Say so here instead. */
    QT_CHECK(M % 16 == 0 && K % 16 == 0 && N % 16 == 0,
             "qt_matmul_fp8: M=%ld N=%d K=%d: cuBLASLt's fp8 kernels need all three to be multiples of 16", M, N, K);
    QT_CHECK(ptr_align(a) >= 16 && ptr_align(b) >= 16 && ptr_align(d) >= 16 && (!bias || ptr_align(bias) >= 16),
             "qt_matmul_fp8: operand pointers must be 16-byte aligned (a %p b %p d %p bias %p)", a, b, (void *)d, bias);
    /* A 4-byte aligned scale pointer makes every algorithm fail at launch with NOT_SUPPORTED. */
    QT_CHECK((!a_scale || ptr_align(a_scale) >= 16) && (!b_scale || ptr_align(b_scale) >= 16),
             "qt_matmul_fp8: scale pointers must be 16-byte aligned (a_scale %p b_scale %p)", (const void *)a_scale,
             (const void *)b_scale);
    check_out_type(ddt, "qt_matmul_fp8");
    /* cuBLASLt's A is our B (see the mapping at the top), so the scales swap too. */
    mm_call k = {.a = b, .b = a, .d = d, .bias = bias, .sa = b_scale, .sb = a_scale, .alpha = 1.0f, .accumulate = accumulate, .s = s};
    mm_key key;
    memset(&key, 0, sizeof key);
    key_shape(&key, 1, 0, N, M, K, K, K, N, &k);
    key.atype = cuda_type(bdt);
    key.btype = cuda_type(adt);
    key.dtype = cuda_type(ddt);
    key.fast_accum = fast_accum ? 1 : 0;
    key.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    key.bias_type = CUDA_R_16BF; /* fp8 kernels take a bf16 bias whatever D is */
    run(c, &key, &k);
}
