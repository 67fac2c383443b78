/* tool_train_fault.c — trains from a config with a failure injected into one data-parallel rank (the
 * qt_test_hooks dp_fail_* hooks), the way the qtrain program would, for test_train's failure test:
 *   tool_train_fault CONFIG.yaml RANK STEP [GATHER]
 * Rank RANK fails just before optimizer step STEP, or with GATHER (ZeRO-3) instead of issuing its
 * GATHER-th weight gather into a shared slot (counted from 1) while the others wait in it; the process
 * must stop with that rank's message and status 1, never hang. */
#include <stdio.h>
#include <stdlib.h>

#include "qt_config.h"
#include "qt_test_hooks.h"
#include "qt_train.h"

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: tool_train_fault CONFIG.yaml RANK STEP [GATHER]\n");
        return 2;
    }
    static qt_config cfg;
    char err[2048];
    if (qt_config_load(&cfg, argv[1], NULL, 0, err, sizeof err)) {
        fprintf(stderr, "tool_train_fault: %s\n", err);
        return 1;
    }
    qt_test_hooks h = {.dp_fail_rank = atoi(argv[2]), .dp_fail_step = argc == 5 ? 0 : atol(argv[3]),
                       .dp_fail_gather = argc == 5 ? atol(argv[4]) : 0};
    qt_test_hooks_set(&h);
    qt_train_opts o = {NULL, -1, 0, NULL, NULL, NULL};
    if (qt_train_run(&cfg, &o, NULL, err, sizeof err)) {
        fprintf(stderr, "tool_train_fault: %s\n", err);
        return 1;
    }
    return 0;
}
