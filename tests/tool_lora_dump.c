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

#include "qt_config.h"
#include "qt_cpu_model.h"
#include "qt_engine.h"
#include "qt_lora_cpu.h"
#include "lora_dump.h"

static int die(const char *what, const char *err) {
    fprintf(stderr, "tool_lora_dump: %s: %s\n", what, err);
    return 1;
}

int main(int argc, char **argv) {
    static qt_config cfg;
    char err[2048], path[2048];
    uint64_t seed;
    if (lora_dump_args(argc, argv, "tool_lora_dump", &cfg, &seed)) return 2;
    int B = cfg.data.micro_batch, T = cfg.data.seq_len;
    long N = (long)B * T;
    qt_lora_cfg lc = cfg.lora;
    qt_layout L;
    qt_lora_layout A;
    float *w;
    if (qt_model_setup(&cfg, &L, &w, err, sizeof err)) return die(argv[1], err);
    if (qt_lora_layout_init(&A, &lc, &L.cfg, err, sizeof err)) return die("lora", err);
    float *a = malloc(A.numel * sizeof *a), *ga = calloc(A.numel, sizeof *ga), *gw = calloc(L.numel, sizeof *gw);
    if (qt_lora_import(argv[2], &A, a, &L, w, err, sizeof err)) return die(argv[2], err);
    int32_t *in = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    if (lora_dump_tokens(argv[3], B, T, in, tgt)) return die(argv[3], "short");
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    qt_lora_cpu *ad = qt_lora_cpu_create(&A, a, ga, N, seed);
    qt_cpu_model_set_adapter(m, qt_lora_cpu_adapter(ad));
    qt_cpu_model_set_grads(m, qt_lora_cpu_grads(lc.trainable));
    qt_lora_cpu_set_batch(ad, 1, 0);
    float loss = qt_cpu_model_forward(m, w, in, tgt);
    lora_dump_write(argv[6], qt_cpu_model_logits(m), (size_t)N * L.cfg.vocab_size, loss);
    qt_cpu_model_backward(m, w, gw, qt_loss_scale(1, 1, qt_cpu_model_targets(m)));
    if (qt_lora_export(argv[6], &A, ga, &L, gw, "", err, sizeof err)) return die(argv[6], err);
    if (lc.dropout > 0) {
        snprintf(path, sizeof path, "%s/masks.f32", argv[6]);
        FILE *f = fopen(path, "wb");
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
    qt_lora_cpu_free(ad);
    qt_cpu_model_free(m);
    qt_lora_layout_free(&A);
    qt_layout_free(&L);
    free(w), free(a), free(ga), free(gw), free(in), free(tgt);
    return 0;
}
