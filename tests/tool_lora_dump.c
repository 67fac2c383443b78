/* tool_lora_dump.c — runs one micro-batch of an HF model with LoRA adapters through the CPU fp32 model and
 * dumps what the PEFT comparison (tests/test_lora_peft.py) checks:
 *   tool_lora_dump HF_DIR ADAPTER TOKENS.i32 B T OUT_DIR R ALPHA RSLORA TARGETS DROPOUT SEED TRAINABLE
 * ADAPTER: a PEFT adapter_model.safetensors (or its folder) of rank R over the targets (qt_lora_target bits),
 * with the base tensors of the TRAINABLE bits (qt_lora_extra: PEFT's modules_to_save) that replace the base's;
 * TOKENS.i32 holds B*(T+1) int32 tokens (B windows). The dropout masks are those of step 1, micro-batch 0
 * under SEED. Writes OUT_DIR/logits.f32 [B*T, V], OUT_DIR/loss.txt, OUT_DIR/adapter_model.safetensors
 * holding the adapters' (and trained base tensors') gradients of the mean loss under their PEFT names, and with DROPOUT > 0
 * OUT_DIR/masks.f32: each module's mask [B*T, in] (0 or 1/(1-p)) in layout order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qt_config.h"
#include "qt_cpu_model.h"
#include "qt_engine.h"
#include "qt_lora_cpu.h"

static int die(const char *what, const char *err) {
    fprintf(stderr, "tool_lora_dump: %s: %s\n", what, err);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 14) {
        fprintf(stderr, "usage: tool_lora_dump HF_DIR ADAPTER TOKENS.i32 B T OUT_DIR R ALPHA RSLORA TARGETS DROPOUT SEED "
                "TRAINABLE\n");
        return 2;
    }
    static qt_config cfg;
    char err[2048], path[2048];
    qt_config_defaults(&cfg);
    snprintf(cfg.init.from, sizeof cfg.init.from, "%s", argv[1]);
    int B = atoi(argv[4]), T = atoi(argv[5]);
    long N = (long)B * T;
    cfg.data.micro_batch = B;
    cfg.data.seq_len = T;
    qt_lora_cfg lc = {atoi(argv[7]), (float)atof(argv[8]), atoi(argv[9]), (float)atof(argv[11]), atoi(argv[10]), atoi(argv[13]), 0};
    uint64_t seed = strtoull(argv[12], NULL, 10);
    qt_layout L;
    qt_lora_layout A;
    float *w;
    if (qt_model_setup(&cfg, &L, &w, err, sizeof err)) return die(argv[1], err);
    if (qt_lora_layout_init(&A, &lc, &L.cfg, err, sizeof err)) return die("lora", err);
    float *a = malloc(A.numel * sizeof *a), *ga = calloc(A.numel, sizeof *ga), *gw = calloc(L.numel, sizeof *gw);
    if (qt_lora_import(argv[2], &A, a, &L, w, err, sizeof err)) return die(argv[2], err);
    int32_t *win = malloc(sizeof(int32_t) * B * (T + 1)), *in = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(win, sizeof(int32_t), (size_t)B * (T + 1), f) != (size_t)B * (T + 1)) return die(argv[3], "short");
    fclose(f);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = win[b * (T + 1) + t];
            tgt[b * T + t] = win[b * (T + 1) + t + 1];
        }
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    qt_lora_cpu *ad = qt_lora_cpu_create(&A, a, ga, N, seed);
    qt_cpu_model_set_adapter(m, qt_lora_cpu_adapter(ad));
    qt_cpu_model_set_grads(m, qt_lora_cpu_grads(lc.trainable));
    qt_lora_cpu_set_batch(ad, 1, 0);
    float loss = qt_cpu_model_forward(m, w, in, tgt);
    mkdir(argv[6], 0777);
    snprintf(path, sizeof path, "%s/logits.f32", argv[6]);
    f = fopen(path, "wb");
    fwrite(qt_cpu_model_logits(m), sizeof(float), (size_t)N * L.cfg.vocab_size, f);
    fclose(f);
    qt_cpu_model_backward(m, w, gw, qt_loss_scale(1, 1, qt_cpu_model_targets(m)));
    if (qt_lora_export(argv[6], &A, ga, &L, gw, "", err, sizeof err)) return die(argv[6], err);
    snprintf(path, sizeof path, "%s/loss.txt", argv[6]);
    f = fopen(path, "w");
    fprintf(f, "%.9g\n", loss);
    fclose(f);
    if (lc.dropout > 0) {
        snprintf(path, sizeof path, "%s/masks.f32", argv[6]);
        f = fopen(path, "wb");
        for (int i = 0; i < A.n_layers * A.per_layer; i++) {
            const qt_lora_module *md = &A.mods[i];
            uint64_t ms = qt_lora_mask_seed(seed, 1, 0, i / A.per_layer, md->target);
            for (size_t j = 0; j < (size_t)N * md->in; j++) {
                float v = qt_lora_mask(ms, j, lc.dropout, 1.0f / (1.0f - lc.dropout));
                fwrite(&v, sizeof v, 1, f);
            }
        }
        fclose(f);
    }
    printf("loss %.9g\n", loss);
    qt_lora_cpu_free(ad);
    qt_cpu_model_free(m);
    qt_lora_layout_free(&A);
    qt_layout_free(&L);
    free(w), free(a), free(ga), free(gw), free(win), free(in), free(tgt);
    return 0;
}
