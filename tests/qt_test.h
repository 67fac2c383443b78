/* qt_test.h — the tiny test harness every tests/test_*.c uses.
 *
 *   static void test_roundtrip(void) { QT_EXPECT(x == y, "x=%d y=%d", x, y); ... }
 *   int main(void) { QT_RUN(test_roundtrip); return qt_test_end(); }
 *
 * Each QT_RUN prints "PASS name", "FAIL name: first failure" or "SKIP name: why"; tests/run.sh
 * adds them up. QT_REQUIRE returns from the test on failure; QT_SKIP marks it skipped and returns.
 * QT_TEST_ONLY=part runs only the tests whose name contains part (device runs of one test);
 * QT_TEST_CASES=a,b runs only the named cases of a table-driven test that asks qt_t_case_selected
 * (a long suite split over device calls). */
#ifndef QT_TEST_H
#define QT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the planted bugs' names (qt_mutant.h is all inside QT_MUTANTS): the case tables name them in both builds; a
 * release build declares qt_mutant_set without defining it, and calls it only inside #ifdef QT_MUTANTS */
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#else
#define QT_MUTANTS
#include "qt_mutant.h"
#undef QT_MUTANTS
#endif
#include "qt_test_hooks.h"

static int qt_t_failed, qt_t_skipped, qt_t_nfail, qt_t_npass, qt_t_nskip;
static char qt_t_msg[1024];

#define QT_EXPECT(cond, ...)                                                                        \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            if (!qt_t_failed) {                                                                     \
                int qt_n_ = snprintf(qt_t_msg, sizeof qt_t_msg, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
                if (qt_n_ > 0 && (size_t)qt_n_ < sizeof qt_t_msg)                                  \
                    snprintf(qt_t_msg + qt_n_, sizeof qt_t_msg - qt_n_, __VA_ARGS__);                \
            }                                                                                       \
            qt_t_failed = 1;                                                                        \
        }                                                                                           \
    } while (0)
#define QT_REQUIRE(cond, ...)                                                                       \
    do {                                                                                            \
        QT_EXPECT(cond, __VA_ARGS__);                                                               \
        if (qt_t_failed) return;                                                                    \
    } while (0)
#define QT_SKIP(...)                                                                                \
    do {                                                                                            \
        snprintf(qt_t_msg, sizeof qt_t_msg, __VA_ARGS__);                                           \
        qt_t_skipped = 1;                                                                           \
        return;                                                                                     \
    } while (0)
static inline int qt_t_selected(const char *name) {
    const char *only = getenv("QT_TEST_ONLY");
    return !only || !*only || strstr(name, only) != NULL;
}
static inline int qt_t_case_selected(const char *name) {
    const char *list = getenv("QT_TEST_CASES");
    size_t n = strlen(name);
    if (!list || !*list) return 1;
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || !p[n])) return 1;
    return 0;
}

#define QT_RUN(fn)                                                                                  \
    do {                                                                                            \
        if (!qt_t_selected(#fn)) break;                                                             \
        qt_t_failed = qt_t_skipped = 0;                                                             \
        qt_t_msg[0] = 0;                                                                            \
        fn();                                                                                       \
        if (qt_t_failed) { printf("FAIL %s: %s\n", #fn, qt_t_msg); qt_t_nfail++; }                 \
        else if (qt_t_skipped) { printf("SKIP %s: %s\n", #fn, qt_t_msg); qt_t_nskip++; }           \
        else { printf("PASS %s\n", #fn); qt_t_npass++; }                                            \
        fflush(stdout);                                                                             \
    } while (0)

static inline int qt_test_end(void) { return qt_t_nfail ? 1 : 0; }

/* A test of the planted bugs (qt_mutant.h) runs in the mutant build only; QT_T_MUTANTS is 1 there. */
#ifdef QT_MUTANTS
#define QT_T_MUTANTS 1
#else
#define QT_T_MUTANTS 0
#endif
#define QT_T_MUTANTS_ONLY "mutant build only (make MUTANTS=1)"
#define QT_MUTANT_BUILD_ONLY()                                                                      \
    do {                                                                                            \
        if (!QT_T_MUTANTS) QT_SKIP(QT_T_MUTANTS_ONLY);                                              \
    } while (0)

/* The test hooks h (NULL: none) and the planted bug m (QT_MUT_NONE: none; the mutant build only) in force. */
static inline void qt_t_hooks(const qt_test_hooks *h, qt_mutant m) {
    qt_test_hooks_set(h);
#ifdef QT_MUTANTS
    qt_mutant_set(m);
#else
    (void)m;
#endif
}

/* Compares got to ref elementwise: |got-ref| <= atol + rtol*|ref|, and the relative L2 error
 * ||got-ref||/||ref|| <= rtol. On failure prints the worst index. Returns 1 when within bounds. */
static inline int qt_t_close(const char *what, const float *got, const float *ref, long n, double atol,
                             double rtol) {
    double num = 0, den = 0, worst = -1;
    long wi = -1;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), lim = atol + rtol * fabs((double)ref[i]);
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (!(d <= lim) && (wi < 0 || d - lim > worst)) { worst = d - lim; wi = i; }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (wi >= 0 || !(rel <= rtol)) {
        printf("  %s: rel L2 %.3g (bound %.3g)", what, rel, rtol);
        if (wi >= 0) printf("; worst [%ld] got %.8g ref %.8g", wi, got[wi], ref[wi]);
        printf("\n");
        return 0;
    }
    return 1;
}

#endif
