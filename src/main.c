/* main.c — `qtrain run.yaml [--set key=value ...] [--resume [path]]`: wires the modules together. */
#include <stdio.h>

int main(int argc, char **argv) {
    (void)argv;
    if (argc < 2) {
        fprintf(stderr, "usage: qtrain config.yaml [--set key=value ...] [--resume [path]]\n");
        return 2;
    }
    return 0;
}
