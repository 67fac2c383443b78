/* main.c — `qtrain run.yaml [--set key=value ...] [--resume [path]] [--stop-after N] [--export]`:
 * parses the command line and the config, then hands over to the training loop (src/train.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_config.h"
#include "qt_train.h"

static int usage(void) {
    fprintf(stderr,
            "usage: qtrain config.yaml [options]\n"
            "  --set key=value   override a config key (repeatable), e.g. --set optim.lr=3e-4\n"
            "  --resume [path]   continue from the newest checkpoint in checkpoint.dir, or from path\n"
            "  --stop-after N    stop (with a checkpoint) once N steps are done\n"
            "  --export          write the HF export of the initial or resumed weights, then exit\n"
            "  --allow-changed K  with --resume: accept these changed keys (comma list of data.train,\n"
            "                    data.seq_len, data.micro_batch, seed; or all)\n"
            "  --print-config    print the resolved config and exit\n"
            "Config keys: configs/README.md\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *path = NULL, *sets[256];
    int nsets = 0, print_cfg = 0;
    qt_train_opts o = {NULL, -1, 0, NULL, NULL};
    qt_train_install_signal_handlers(); /* first: a signal during setup still stops cleanly */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") && i + 1 < argc && nsets < 256) sets[nsets++] = argv[++i];
        else if (!strncmp(a, "--set=", 6) && nsets < 256) sets[nsets++] = a + 6;
        else if (!strcmp(a, "--resume")) o.resume = (i + 1 < argc && argv[i + 1][0] != '-') ? argv[++i] : "latest";
        else if (!strcmp(a, "--stop-after") && i + 1 < argc) o.stop_after = atol(argv[++i]);
        else if (!strcmp(a, "--export")) o.export_only = 1;
        else if (!strcmp(a, "--allow-changed") && i + 1 < argc) o.allow_changed = argv[++i];
        else if (!strcmp(a, "--print-config")) print_cfg = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage();
        else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "qtrain: unknown argument \"%s\"\n", a);
            return usage();
        }
    }
    if (!path) return usage();
    static qt_config cfg;
    char err[2048];
    if (qt_config_load(&cfg, path, sets, nsets, err, sizeof err)) {
        fprintf(stderr, "qtrain: %s\n", err);
        return 1;
    }
    if (print_cfg) {
        static char buf[1 << 16];
        qt_config_dump(&cfg, buf, sizeof buf);
        fputs(buf, stdout);
        return 0;
    }
    int rc = qt_train_run(&cfg, &o, NULL, err, sizeof err);
    if (rc == QT_TRAIN_STOPPED) return QT_EXIT_STOPPED;
    if (rc) {
        fprintf(stderr, "qtrain: %s\n", err);
        return 1;
    }
    return 0;
}
