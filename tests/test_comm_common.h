/* test_comm_common.h — the comm test script shared by test_comm_cpu.c (host buffers) and
 * test_comm_gpu.c (device buffers): every op on every rank's thread, outputs poisoned and framed by
 * guard bands, results compared bitwise with references computed here, plus stress, abort and
 * fork-based failure tests. A ct_mem says where buffers live. */
#ifndef TEST_COMM_COMMON_H
#define TEST_COMM_COMMON_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qt_comm.h"
#include "qt_error.h"
#include "qt_rng.h"
#include "qt_test.h"

#define CT_G 64 /* guard bytes on each side of every output */

typedef struct {
    void *(*alloc)(int r, size_t bytes);
    void (*release)(int r, void *p);
    void (*put)(int r, cudaStream_t s, void *dst, const void *host, size_t bytes); /* returns when done */
    void (*get)(int r, cudaStream_t s, void *host, const void *src, size_t bytes); /* after s's work */
    cudaStream_t (*stream)(int r);
    void (*stream_free)(int r, cudaStream_t s);
    void *(*halloc)(size_t bytes); /* pinned host memory (all_gather_host sources) */
    void (*hrelease)(void *p);
} ct_mem;

typedef struct {
    qt_comm *c;
    const ct_mem *m;
    int n, delay;
    size_t count;
    float *xf[QT_COMM_MAX_RANKS];
    uint16_t *xb[QT_COMM_MAX_RANKS];
    uint8_t *xe[QT_COMM_MAX_RANKS];
    float *ag_f, *sum_f;
    uint16_t *ag_b, *sum_b;
    uint8_t *ag_e;
    double *sum64;
    char err[QT_COMM_MAX_RANKS][320];
} ct_job;

typedef struct {
    ct_job *j;
    int r;
} ct_arg;

#define CT_FAIL(j, r, ...)                                                                         \
    do {                                                                                           \
        if (!(j)->err[r][0]) snprintf((j)->err[r], sizeof (j)->err[r], __VA_ARGS__);              \
    } while (0)

static void ct_delay(ct_job *j, qt_rng *g) {
    if (j->delay) usleep((useconds_t)qt_rng_below(g, 300));
}

/* A device buffer of body bytes with guard bands; body poisoned with 0xff, guards 0xa5. */
static char *ct_dbuf(ct_job *j, int r, cudaStream_t s, size_t body) {
    size_t tot = body + 2 * CT_G;
    unsigned char *h = malloc(tot);
    memset(h, 0xa5, tot);
    memset(h + CT_G, 0xff, body);
    char *d = j->m->alloc(r, tot);
    j->m->put(r, s, d, h, tot);
    free(h);
    return d + CT_G;
}

/* Reads a guarded buffer back; checks the guards; returns the body (caller frees). */
static unsigned char *ct_read(ct_job *j, int r, cudaStream_t s, char *body_dev, size_t body, const char *what) {
    size_t tot = body + 2 * CT_G;
    unsigned char *h = malloc(tot);
    j->m->get(r, s, h, body_dev - CT_G, tot);
    for (size_t i = 0; i < CT_G; i++)
        if (h[i] != 0xa5 || h[CT_G + body + i] != 0xa5) {
            CT_FAIL(j, r, "rank %d %s count=%zu: guard band overwritten", r, what, j->count);
            break;
        }
    unsigned char *b = malloc(body ? body : 1);
    memcpy(b, h + CT_G, body);
    free(h);
    return b;
}

static void ct_cmp(ct_job *j, int r, const char *what, const void *got, const void *ref, size_t bytes, size_t es) {
    if (!memcmp(got, ref, bytes)) return;
    size_t i = 0;
    while (((const unsigned char *)got)[i] == ((const unsigned char *)ref)[i]) i++;
    CT_FAIL(j, r, "rank %d %s n=%d count=%zu: first difference at element %zu (byte %zu)", r, what, j->n, j->count,
            i / es, i);
}

static void ct_check_rc(ct_job *j, int r, int rc, const char *what) {
    if (rc) CT_FAIL(j, r, "rank %d %s returned %d", r, what, rc);
}

static void ct_ops(ct_job *j, int r, cudaStream_t s) {
    const ct_mem *m = j->m;
    qt_comm *c = j->c;
    size_t n = j->count, off, len;
    qt_comm_shard(n, j->n, r, &off, &len);
    qt_rng g;
    qt_rng_seed(&g, 1000 + r);
    unsigned char *h;

    /* all-gather fp32, out of place */
    char *src = m->alloc(r, len * 4 + 16), *dst = ct_dbuf(j, r, s, n * 4);
    m->put(r, s, src, j->xf[r] + off, len * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_gather(c, r, dst, src, n, QT_DT_F32, s), "all_gather");
    h = ct_read(j, r, s, dst, n * 4, "all_gather fp32");
    ct_cmp(j, r, "all_gather fp32", h, j->ag_f, n * 4, 4);
    free(h);
    m->release(r, src);
    m->release(r, dst - CT_G);

    /* all-gather from pinned host shards: host->device only */
    char *hsrc = m->halloc(len * 4 + 16);
    memcpy(hsrc, j->xf[r] + off, len * 4);
    dst = ct_dbuf(j, r, s, n * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_gather_host(c, r, dst, hsrc, n, QT_DT_F32, s), "all_gather_host");
    h = ct_read(j, r, s, dst, n * 4, "all_gather_host fp32");
    ct_cmp(j, r, "all_gather_host fp32", h, j->ag_f, n * 4, 4);
    free(h);
    m->hrelease(hsrc); /* safe: the collective ends on my stream only after every peer finished reading */
    m->release(r, dst - CT_G);

    /* all-gather bf16, in place */
    dst = ct_dbuf(j, r, s, n * 2);
    m->put(r, s, dst + off * 2, j->xb[r] + off, len * 2);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_gather(c, r, dst, dst + off * 2, n, QT_DT_BF16, s), "all_gather in place");
    h = ct_read(j, r, s, dst, n * 2, "all_gather bf16 in place");
    ct_cmp(j, r, "all_gather bf16 in place", h, j->ag_b, n * 2, 2);
    free(h);
    m->release(r, dst - CT_G);

    /* all-gather of 1-byte elements (fp8) */
    src = m->alloc(r, len + 16);
    dst = ct_dbuf(j, r, s, n);
    m->put(r, s, src, j->xe[r] + off, len);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_gather(c, r, dst, src, n, QT_DT_E4M3, s), "all_gather e4m3");
    h = ct_read(j, r, s, dst, n, "all_gather e4m3");
    ct_cmp(j, r, "all_gather e4m3", h, j->ag_e, n, 1);
    free(h);
    m->release(r, src);
    m->release(r, dst - CT_G);

    /* reduce-scatter fp32, out of place: bitwise vs the ordered sum, close to fp64 */
    src = m->alloc(r, n * 4 + 16);
    dst = ct_dbuf(j, r, s, len * 4);
    m->put(r, s, src, j->xf[r], n * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_reduce_scatter(c, r, dst, src, n, QT_DT_F32, s), "reduce_scatter");
    h = ct_read(j, r, s, dst, len * 4, "reduce_scatter fp32");
    ct_cmp(j, r, "reduce_scatter fp32", h, j->sum_f + off, len * 4, 4);
    for (size_t i = 0; i < len; i++) {
        double d = fabs(((float *)h)[i] - j->sum64[off + i]);
        if (!(d <= 1e-5 + 1e-5 * fabs(j->sum64[off + i]))) {
            CT_FAIL(j, r, "rank %d reduce_scatter fp32: [%zu] %.9g vs fp64 %.9g", r, i, ((float *)h)[i], j->sum64[off + i]);
            break;
        }
    }
    free(h);
    m->release(r, dst - CT_G);

    /* reduce-scatter bf16, in place: my shard reduced, the rest of src untouched */
    dst = ct_dbuf(j, r, s, n * 2);
    m->put(r, s, dst, j->xb[r], n * 2);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_reduce_scatter(c, r, dst + off * 2, dst, n, QT_DT_BF16, s), "reduce_scatter in place");
    h = ct_read(j, r, s, dst, n * 2, "reduce_scatter bf16 in place");
    ct_cmp(j, r, "reduce_scatter bf16 shard", h + off * 2, j->sum_b + off, len * 2, 2);
    ct_cmp(j, r, "reduce_scatter bf16 rest before", h, j->xb[r], off * 2, 2);
    ct_cmp(j, r, "reduce_scatter bf16 rest after", h + (off + len) * 2, j->xb[r] + off + len, (n - off - len) * 2, 2);
    free(h);
    m->release(r, dst - CT_G);

    /* all-reduce fp32 out of place, bf16 in place */
    dst = ct_dbuf(j, r, s, n * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_reduce(c, r, dst, src, n, QT_DT_F32, s), "all_reduce");
    h = ct_read(j, r, s, dst, n * 4, "all_reduce fp32");
    ct_cmp(j, r, "all_reduce fp32", h, j->sum_f, n * 4, 4);
    free(h);
    m->release(r, dst - CT_G);
    m->release(r, src);
    dst = ct_dbuf(j, r, s, n * 2);
    m->put(r, s, dst, j->xb[r], n * 2);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_reduce(c, r, dst, dst, n, QT_DT_BF16, s), "all_reduce in place");
    h = ct_read(j, r, s, dst, n * 2, "all_reduce bf16 in place");
    ct_cmp(j, r, "all_reduce bf16 in place", h, j->sum_b, n * 2, 2);
    free(h);
    m->release(r, dst - CT_G);

    /* broadcast from a root that moves with the size */
    int root = (int)(n % (size_t)j->n);
    dst = ct_dbuf(j, r, s, n * 4);
    m->put(r, s, dst, j->xf[r], n * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_broadcast(c, r, root, dst, n, QT_DT_F32, s), "broadcast");
    h = ct_read(j, r, s, dst, n * 4, "broadcast");
    ct_cmp(j, r, "broadcast", h, j->xf[root], n * 4, 4);
    free(h);
    m->release(r, dst - CT_G);

    /* scalars: sum, then max with a NaN from the last rank */
    int k = n < QT_COMM_MAX_SCALARS ? (int)n : QT_COMM_MAX_SCALARS;
    float v[QT_COMM_MAX_SCALARS], ref[QT_COMM_MAX_SCALARS];
    dst = ct_dbuf(j, r, s, QT_COMM_MAX_SCALARS * 4);
    m->put(r, s, dst, j->xf[r], (size_t)k * 4);
    ct_delay(j, &g);
    ct_check_rc(j, r, qt_comm_all_reduce_scalars(c, r, (float *)dst, k, QT_COMM_SUM, s), "scalars sum");
    m->get(r, s, v, dst, (size_t)k * 4);
    ct_cmp(j, r, "scalars sum", v, j->sum_f, (size_t)k * 4, 4);
    memcpy(v, j->xf[r], (size_t)k * 4);
    if (r == j->n - 1 && k > 1) v[1] = NAN;
    m->put(r, s, dst, v, (size_t)k * 4);
    ct_check_rc(j, r, qt_comm_all_reduce_scalars(c, r, (float *)dst, k, QT_COMM_MAX, s), "scalars max");
    for (int i = 0; i < k; i++) {
        ref[i] = j->xf[0][i];
        for (int q = 1; q < j->n; q++) ref[i] = j->xf[q][i] > ref[i] ? j->xf[q][i] : ref[i];
    }
    if (k > 1) ref[1] = NAN;
    m->get(r, s, v, dst, (size_t)k * 4);
    for (int i = 0; i < k; i++)
        if (!(v[i] == ref[i] || (isnan(v[i]) && isnan(ref[i])))) {
            CT_FAIL(j, r, "rank %d scalars max [%d]: %g, expected %g", r, i, v[i], ref[i]);
            break;
        }
    h = ct_read(j, r, s, dst, QT_COMM_MAX_SCALARS * 4, "scalars");
    free(h);
    m->release(r, dst - CT_G);
    ct_check_rc(j, r, qt_comm_barrier(c, r, s), "barrier");
}

static void *ct_worker(void *p) {
    ct_arg *a = p;
    qt_error_set_rank(a->r);
    cudaStream_t s = a->j->m->stream(a->r);
    ct_ops(a->j, a->r, s);
    a->j->m->stream_free(a->r, s);
    return NULL;
}

static void ct_run_threads(int n, void *(*fn)(void *), ct_arg *args) {
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) pthread_create(&t[r], NULL, fn, &args[r]);
    for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
}

/* Fills inputs and references for n ranks and count elements. */
static void ct_job_init(ct_job *j, int n, size_t count, uint64_t seed) {
    memset(j->err, 0, sizeof j->err);
    j->n = n;
    j->count = count;
    size_t cnt = count ? count : 1;
    qt_rng g;
    qt_rng_seed(&g, seed);
    for (int r = 0; r < n; r++) {
        j->xf[r] = malloc(cnt * 4);
        j->xb[r] = malloc(cnt * 2);
        j->xe[r] = malloc(cnt);
        for (size_t i = 0; i < count; i++) {
            j->xf[r][i] = qt_rng_normal(&g) * (1 + r);
            j->xb[r][i] = qt_f32_to_bf16(qt_rng_normal(&g));
            j->xe[r][i] = (uint8_t)qt_rng_u64(&g);
        }
    }
    j->ag_f = malloc(cnt * 4);
    j->sum_f = malloc(cnt * 4);
    j->ag_b = malloc(cnt * 2);
    j->sum_b = malloc(cnt * 2);
    j->ag_e = malloc(cnt);
    j->sum64 = malloc(cnt * 8);
    for (int r = 0; r < n; r++) {
        size_t off, len;
        qt_comm_shard(count, n, r, &off, &len);
        for (size_t i = off; i < off + len; i++) {
            j->ag_f[i] = j->xf[r][i];
            j->ag_b[i] = j->xb[r][i];
            j->ag_e[i] = j->xe[r][i];
        }
    }
    for (size_t i = 0; i < count; i++) {
        float a = j->xf[0][i], b = qt_bf16_to_f32(j->xb[0][i]);
        double d = j->xf[0][i];
        for (int r = 1; r < n; r++) {
            a += j->xf[r][i];
            b += qt_bf16_to_f32(j->xb[r][i]);
            d += j->xf[r][i];
        }
        j->sum_f[i] = a;
        j->sum_b[i] = qt_f32_to_bf16(b);
        j->sum64[i] = d;
    }
}

static void ct_job_free(ct_job *j) {
    for (int r = 0; r < j->n; r++) {
        free(j->xf[r]);
        free(j->xb[r]);
        free(j->xe[r]);
    }
    free(j->ag_f); free(j->sum_f); free(j->ag_b); free(j->sum_b); free(j->ag_e); free(j->sum64);
}

/* Runs the whole op script on comm c for one count; returns the first rank's error or NULL. */
static const char *ct_script(qt_comm *c, const ct_mem *m, size_t count, int delay, uint64_t seed, ct_job *j) {
    int n = qt_comm_size(c);
    ct_job_init(j, n, count, seed);
    j->c = c;
    j->m = m;
    j->delay = delay;
    ct_arg a[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) a[r] = (ct_arg){j, r};
    ct_run_threads(n, ct_worker, a);
    ct_job_free(j);
    for (int r = 0; r < n; r++)
        if (j->err[r][0]) return j->err[r];
    return NULL;
}

/* ---- stress: back-to-back collectives with exact small-integer data, checked every `every` ops ---- */

typedef struct {
    qt_comm *c;
    const ct_mem *m;
    int iters, every, delay_every;
    char err[QT_COMM_MAX_RANKS][256];
} ct_stress;

typedef struct {
    ct_stress *st;
    int r;
} ct_sarg;

static void *ct_stress_worker(void *p) {
    ct_sarg *a = p;
    ct_stress *st = a->st;
    int r = a->r, n = qt_comm_size(st->c);
    const ct_mem *m = st->m;
    cudaStream_t s = m->stream(r);
    enum { AGN = 37, RSN = 41 };
    size_t off, len, roff, rlen;
    qt_comm_shard(AGN, n, r, &off, &len);
    qt_comm_shard(RSN, n, r, &roff, &rlen);
    float *ag_src = m->alloc(r, AGN * 4), *ag_dst = m->alloc(r, AGN * 4), *rs_src = m->alloc(r, RSN * 4);
    float *rs_dst = m->alloc(r, RSN * 4), *sc = m->alloc(r, 4 * 4);
    float h[64];
    qt_rng g;
    qt_rng_seed(&g, 77 + r);
    for (int it = 0; it < st->iters && !st->err[r][0]; it++) {
        int op = it % 4, check = (it % st->every) == st->every - 1 || it == st->iters - 1;
        if (st->delay_every && it % st->delay_every == 0) usleep((useconds_t)qt_rng_below(&g, 200));
        int rc = 0;
        if (op == 0) {
            if (check) {
                for (size_t i = 0; i < len; i++) h[i] = (float)(it % 97 + off + i);
                m->put(r, s, ag_src, h, len * 4);
            }
            rc = qt_comm_all_gather(st->c, r, ag_dst, ag_src, AGN, QT_DT_F32, s);
            if (check) {
                m->get(r, s, h, ag_dst, AGN * 4);
                for (size_t i = 0; i < AGN; i++)
                    if (h[i] != (float)(it % 97 + i)) {
                        snprintf(st->err[r], 256, "rank %d iter %d all_gather[%zu] = %g", r, it, i, h[i]);
                        break;
                    }
            }
        } else if (op == 1) {
            if (check) {
                for (size_t i = 0; i < RSN; i++) h[i] = (float)(r + i);
                m->put(r, s, rs_src, h, RSN * 4);
            }
            rc = qt_comm_reduce_scatter(st->c, r, rs_dst, rs_src, RSN, QT_DT_F32, s);
            if (check) {
                m->get(r, s, h, rs_dst, rlen * 4);
                for (size_t i = 0; i < rlen; i++)
                    if (h[i] != (float)(n * (n - 1) / 2 + n * (roff + i))) {
                        snprintf(st->err[r], 256, "rank %d iter %d reduce_scatter[%zu] = %g", r, it, i, h[i]);
                        break;
                    }
            }
        } else if (op == 2) {
            if (check) {
                h[0] = (float)r;
                h[1] = 1;
                m->put(r, s, sc, h, 8);
            }
            rc = qt_comm_all_reduce_scalars(st->c, r, sc, 2, QT_COMM_SUM, s);
            if (check) {
                m->get(r, s, h, sc, 8);
                if (h[0] != (float)(n * (n - 1) / 2) || h[1] != (float)n)
                    snprintf(st->err[r], 256, "rank %d iter %d scalars %g %g", r, it, h[0], h[1]);
            }
        } else {
            rc = qt_comm_barrier(st->c, r, s);
        }
        if (rc) snprintf(st->err[r], 256, "rank %d iter %d: rc %d", r, it, rc);
    }
    m->get(r, s, h, sc, 4); /* drain the stream */
    m->release(r, ag_src); m->release(r, ag_dst); m->release(r, rs_src); m->release(r, rs_dst); m->release(r, sc);
    m->stream_free(r, s);
    return NULL;
}

static const char *ct_stress_run(qt_comm *c, const ct_mem *m, int iters, int every, int delay_every, ct_stress *st) {
    memset(st, 0, sizeof *st);
    st->c = c;
    st->m = m;
    st->iters = iters;
    st->every = every;
    st->delay_every = delay_every;
    int n = qt_comm_size(c);
    ct_sarg a[QT_COMM_MAX_RANKS];
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        a[r] = (ct_sarg){st, r};
        pthread_create(&t[r], NULL, ct_stress_worker, &a[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < n; r++)
        if (st->err[r][0]) return st->err[r];
    return NULL;
}

/* ---- abort: one rank aborts mid-stream, every other rank's call returns -1, all threads end ---- */

typedef struct {
    qt_comm *c;
    const ct_mem *m;
    int r, rc, iters_done;
} ct_aarg;

static void *ct_abort_worker(void *p) {
    ct_aarg *a = p;
    cudaStream_t s = a->m->stream(a->r);
    float *buf = a->m->alloc(a->r, 64 * 4);
    a->rc = 0;
    for (int it = 0; it < 1000000; it++) {
        if (a->r == 1 && it == 50) {
            qt_comm_abort(a->c);
            a->rc = -1;
            break;
        }
        int rc = it % 2 ? qt_comm_barrier(a->c, a->r, s) : qt_comm_all_gather(a->c, a->r, buf, buf, 64, QT_DT_F32, s);
        a->iters_done = it;
        if (rc) {
            a->rc = rc;
            break;
        }
    }
    float h;
    a->m->get(a->r, s, &h, buf, 4);
    a->m->release(a->r, buf);
    a->m->stream_free(a->r, s);
    return NULL;
}

/* Returns 0 when every thread ended with -1 within 20 s. */
static int ct_abort_run(qt_comm *c, const ct_mem *m, char *msg, size_t msglen) {
    int n = qt_comm_size(c);
    ct_aarg a[QT_COMM_MAX_RANKS];
    pthread_t t[QT_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        a[r] = (ct_aarg){c, m, r, 0, 0};
        pthread_create(&t[r], NULL, ct_abort_worker, &a[r]);
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 20;
    for (int r = 0; r < n; r++) {
        if (pthread_timedjoin_np(t[r], NULL, &dl)) {
            snprintf(msg, msglen, "rank %d still running 20 s after the abort (hang)", r);
            return -1;
        }
        if (a[r].rc != -1) {
            snprintf(msg, msglen, "rank %d returned %d after %d iterations, expected -1", r, a[r].rc, a[r].iters_done);
            return -1;
        }
    }
    return 0;
}

/* ---- fork-based: the child runs fn and should die with status 1 and a message within timeout ---- */

/* Runs fn(arg) in a child process with stderr captured into out. Returns the exit status, -2 on
 * timeout (child killed), -3 on a signal, 77 when the child skipped. */
static int ct_fork(void (*fn)(void *), void *arg, int timeout_s, char *out, size_t outlen) {
    int pfd[2];
    if (pipe(pfd)) return -4;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    size_t got = 0;
    int status = 0, done = 0;
    double waited = 0;
    while (!done && waited < timeout_s) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) done = 1;
        else {
            usleep(20000);
            waited += 0.02;
        }
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    ssize_t k;
    while (got + 1 < outlen && (k = read(pfd[0], out + got, outlen - 1 - got)) > 0) got += (size_t)k;
    out[got] = 0;
    close(pfd[0]);
    if (!done) return -2;
    if (WIFSIGNALED(status)) return -3;
    return WEXITSTATUS(status);
}

#endif
