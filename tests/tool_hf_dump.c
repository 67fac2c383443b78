/* tool_hf_dump.c — runs one micro-batch of an HF model through a qtrain engine and dumps what the
 * transformers comparison (tests/test_hf_compare.py) checks:
 *   tool_hf_dump HF_DIR cpu|cuda TOKENS.i32 B T OUT_DIR [DOCS]
 * TOKENS.i32 holds B*(T+1) int32 tokens (B windows). DOCS (packed documents, attention and RoPE
 * positions per document): each window's document starts, the windows separated by ';' ("0,5,11;3,9"). Writes OUT_DIR/logits.f32 [B*T, V] (when the
 * engine can), OUT_DIR/loss.txt, and OUT_DIR/model.safetensors holding the fp32 gradients under the
 * parameter names (the tied embedding's gradient includes the LM head's part). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qt_config.h"
#include "qt_engine.h"
#include "qt_hf.h"
#include "qt_train.h"

/* Parses DOCS ("0,5,11;3,9": window b's starts before its ';') and hands them to the engine. */
static int set_docs(qt_engine *e, const char *spec, int B, int T) {
    int32_t *starts = calloc((size_t)B * T, sizeof *starts), *n = calloc((size_t)B, sizeof *n);
    char err[512];
    const char *p = spec;
    for (int b = 0; b < B && *p; b++) {
        while (*p && *p != ';') {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || n[b] >= T) {
                fprintf(stderr, "tool_hf_dump: DOCS %s: expected comma-separated starts, windows split by ';'\n", spec);
                return -1;
            }
            starts[(long)b * T + n[b]++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
        }
        if (*p == ';') p++;
    }
    qt_docs d = {starts, n, 1, 1};
    int rc = qt_engine_set_docs(e, &d, err, sizeof err);
    if (rc) fprintf(stderr, "tool_hf_dump: %s\n", err);
    free(starts);
    free(n);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: tool_hf_dump HF_DIR cpu|cuda TOKENS.i32 B T OUT_DIR [DOCS]\n");
        return 2;
    }
    static qt_config cfg;
    char err[2048], path[2048];
    qt_config_defaults(&cfg);
    snprintf(cfg.init.from, sizeof cfg.init.from, "%s", argv[1]);
    cfg.device = !strcmp(argv[2], "cuda") ? QT_DEVICE_CUDA : QT_DEVICE_CPU;
    int B = atoi(argv[4]), T = atoi(argv[5]);
    cfg.data.micro_batch = B;
    cfg.parallel.gpus = 1; /* one replica is enough for logits */
    cfg.data.seq_len = T;
    snprintf(cfg.path, sizeof cfg.path, "tool_hf_dump");
    qt_layout L;
    float *w;
    if (qt_model_setup(&cfg, &L, &w, err, sizeof err)) {
        fprintf(stderr, "tool_hf_dump: %s\n", err);
        return 1;
    }
    int32_t *win = malloc(sizeof(int32_t) * B * (T + 1)), *in = malloc(sizeof(int32_t) * B * T),
            *tgt = malloc(sizeof(int32_t) * B * T);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(win, sizeof(int32_t), (size_t)B * (T + 1), f) != (size_t)B * (T + 1)) {
        fprintf(stderr, "tool_hf_dump: %s: expected %d int32 tokens\n", argv[3], B * (T + 1));
        return 1;
    }
    fclose(f);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = win[b * (T + 1) + t];
            tgt[b * T + t] = win[b * (T + 1) + t + 1];
        }
    qt_engine *e = qt_engine_create(&L, &cfg, (qt_weight_src[]){qt_weight_src_array(&L, w)}, err, sizeof err);
    if (!e) {
        fprintf(stderr, "tool_hf_dump: %s\n", err);
        return 1;
    }
    if (argc == 8 && set_docs(e, argv[7], B, T)) return 1;
    mkdir(argv[6], 0777);
    size_t nlog = (size_t)B * T * L.cfg.vocab_size;
    if (e->ops->forward_logits) {
        float *logits = malloc(nlog * sizeof(float));
        e->ops->forward_logits(e, in, logits);
        snprintf(path, sizeof path, "%s/logits.f32", argv[6]);
        f = fopen(path, "wb");
        fwrite(logits, sizeof(float), nlog, f);
        fclose(f);
        free(logits);
    }
    float loss = e->ops->eval_loss(e, in, tgt);
    long valid = 0; /* the gradient of the mean loss: one target weighs 1/valid */
    for (long i = 0; i < (long)B * T; i++) valid += tgt[i] >= 0;
    e->ops->micro_step(e, in, tgt, qt_loss_scale(1, 1, valid));
    float *g = malloc(L.numel * sizeof(float));
    e->ops->get_grads(e, g);
    /* grads travel in the weights' file format: same names and shapes */
    if (qt_hf_export(argv[6], &L, g, 0, err, sizeof err)) {
        fprintf(stderr, "tool_hf_dump: %s\n", err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/loss.txt", argv[6]);
    f = fopen(path, "w");
    fprintf(f, "%.9g\n", loss);
    fclose(f);
    printf("loss %.9g (%s)\n", loss, e->ops->name);
    e->ops->free(e);
    free(g);
    free(w);
    free(win);
    free(in);
    free(tgt);
    qt_layout_free(&L);
    return 0;
}
