/* lora_dump.h — what tool_lora_dump (CPU) and tool_lora_dump_gpu share: their arguments as a config, the token
 * windows, and the logits and loss files (the arguments and outputs are described in tool_lora_dump.c). */
#ifndef LORA_DUMP_H
#define LORA_DUMP_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "qt_config.h"

/* cfg: the defaults with init.from HF_DIR, micro-batch B x T and the lora: section of the arguments; *seed: SEED.
 * 0, or 2 after printing the usage. */
static int lora_dump_args(int argc, char **argv, const char *tool, qt_config *cfg, uint64_t *seed) {
    if (argc != 14) {
        fprintf(stderr, "usage: %s HF_DIR ADAPTER TOKENS.i32 B T OUT_DIR R ALPHA RSLORA TARGETS DROPOUT SEED TRAINABLE\n",
                tool);
        return 2;
    }
    qt_config_defaults(cfg);
    snprintf(cfg->init.from, sizeof cfg->init.from, "%s", argv[1]);
    cfg->data.micro_batch = atoi(argv[4]);
    cfg->data.seq_len = atoi(argv[5]);
    cfg->lora = (qt_lora_cfg){atoi(argv[7]), (float)atof(argv[8]), atoi(argv[9]), (float)atof(argv[11]), atoi(argv[10]),
                              atoi(argv[13]), 0, 0};
    *seed = strtoull(argv[12], NULL, 10);
    return 0;
}

/* in, tgt [B*T] from the B windows of T + 1 tokens in path; -1 when it is short. */
static int lora_dump_tokens(const char *path, int B, int T, int32_t *in, int32_t *tgt) {
    int32_t *win = malloc(sizeof(int32_t) * B * (T + 1));
    FILE *f = fopen(path, "rb");
    int ok = win && f && fread(win, sizeof(int32_t), (size_t)B * (T + 1), f) == (size_t)B * (T + 1);
    if (f) fclose(f);
    for (int b = 0; ok && b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = win[b * (T + 1) + t];
            tgt[b * T + t] = win[b * (T + 1) + t + 1];
        }
    free(win);
    return ok ? 0 : -1;
}

/* dir (created)/logits.f32 = logits[n] and dir/loss.txt = loss. */
static void lora_dump_write(const char *dir, const float *logits, size_t n, double loss) {
    char path[2048];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    FILE *f = fopen(path, "wb");
    if (f) fwrite(logits, sizeof(float), n, f), fclose(f);
    snprintf(path, sizeof path, "%s/loss.txt", dir);
    f = fopen(path, "w");
    if (f) fprintf(f, "%.9g\n", loss), fclose(f);
    printf("loss %.9g\n", loss);
}

#endif
