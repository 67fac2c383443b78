/* test_hooks.c — the process's test-only switches (see qt_test_hooks.h). */
#include "qt_test_hooks.h"

#include <string.h>

static qt_test_hooks g_hooks;

void qt_test_hooks_set(const qt_test_hooks *h) {
    if (h) g_hooks = *h;
    else memset(&g_hooks, 0, sizeof g_hooks);
}

const qt_test_hooks *qt_test_hooks_get(void) { return &g_hooks; }
