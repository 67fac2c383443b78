/* docs.c — a packed micro-batch's document starts turned into per-token key bounds and RoPE positions. */
#include "qt_docs.h"

#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

int qt_docs_expand(const qt_docs *d, int n, int T, int32_t *kv_lo, int32_t *pos, char *err, size_t errlen) {
    for (int b = 0; b < n; b++) {
        const int32_t *s = d->starts + (long)b * T;
        int ns = d->n_starts[b], k = 0, cur = 0;
        if (ns < 0 || ns > T)
            return qt_errf(err, errlen, "window %d: %d document starts: expected 0 to %d", b, ns, T);
        for (int i = 0; i < ns; i++)
            if (s[i] < 0 || s[i] >= T || (i > 0 && s[i] <= s[i - 1]))
                return qt_errf(err, errlen, "window %d: document start %d is %d: expected ascending starts in [0, %d)",
                               b, i, s[i], T);
        for (int t = 0; t < T; t++) {
            while (k < ns && s[k] <= t) cur = s[k++];
            if (kv_lo) kv_lo[(long)b * T + t] = d->attention ? cur : 0;
            if (pos) pos[(long)b * T + t] = d->positions ? t - cur : t;
#ifdef QT_MUTANTS
            if (qt_mutant_on(QT_MUT_DOCS_BOUNDARY_IGNORED) && kv_lo) kv_lo[(long)b * T + t] = 0;
            if (qt_mutant_on(QT_MUT_DOCS_POS_NOT_RESTARTED) && pos) pos[(long)b * T + t] = t;
#endif
        }
    }
    return 0;
}
