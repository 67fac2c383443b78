/* test_hooks.c — the process's test-only switches (see qt_test_hooks.h) and, in the test build with
 * QT_MUTANTS only, the planted bug in force (qt_mutant.h). */
#include "qt_test_hooks.h"

#include <string.h>

#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

static qt_test_hooks g_hooks;

void qt_test_hooks_set(const qt_test_hooks *h) {
    if (h) g_hooks = *h;
    else memset(&g_hooks, 0, sizeof g_hooks);
}

const qt_test_hooks *qt_test_hooks_get(void) { return &g_hooks; }

#ifdef QT_MUTANTS
static qt_mutant g_mutant;

void qt_mutant_set(qt_mutant m) { g_mutant = m; }
int qt_mutant_on(qt_mutant m) { return g_mutant == m; }
#endif
