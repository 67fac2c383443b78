/* tool_dpo_dump.c — one DPO micro-batch of an HF model with LoRA adapters through the CPU fp32 model
 * (qt_dpo_cpu_step, as the CPU engines run it), dumped for the torch / TRL comparison (tests/test_dpo_torch.py):
 *   tool_dpo_dump HF_DIR ADAPTER TOKENS.i32 MASK.u8 B T OUT_DIR R ALPHA TARGETS BETA EPS
 * R = 0: full fine-tuning, ADAPTER being the reference model's HF folder (the policy is HF_DIR) and the gradients
 * those of every weight, written as OUT_DIR/model.safetensors (the HF export of the gradient array).
 * TOKENS.i32: B*(T+1) int32 tokens (B windows; rows 2p, 2p+1 pair p's chosen and rejected); MASK.u8: B*T bytes,
 * 1 where the target counts (the response). Writes OUT_DIR/loss.txt (the mean over the pairs), OUT_DIR/logps.f64
 * (the policy's B row log-probs, then the reference's B), OUT_DIR/scale.f32 (qt_dpo_batch's row weights from those:
 * d mean loss / d token loss of each row) and OUT_DIR/adapter_model.safetensors: the adapters' gradients of the
 * mean loss under their PEFT names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qt_config.h"
#include "qt_cpu_model.h"
#include "qt_dpo.h"
#include "qt_engine.h"
#include "qt_hf.h"
#include "qt_lora_cpu.h"

static int die(const char *what, const char *err) {
    fprintf(stderr, "tool_dpo_dump: %s: %s\n", what, err);
    return 1;
}

static int read_all(const char *path, void *p, size_t size, size_t n) {
    FILE *f = fopen(path, "rb");
    int ok = f && fread(p, size, n, f) == n;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 13) {
        fprintf(stderr, "usage: tool_dpo_dump HF_DIR ADAPTER TOKENS.i32 MASK.u8 B T OUT_DIR R ALPHA TARGETS BETA EPS\n");
        return 2;
    }
    static qt_config cfg;
    char err[2048], path[2048];
    qt_config_defaults(&cfg);
    snprintf(cfg.init.from, sizeof cfg.init.from, "%s", argv[1]);
    int B = atoi(argv[5]), T = atoi(argv[6]);
    long N = (long)B * T;
    cfg.data.micro_batch = B;
    cfg.data.seq_len = T;
    qt_lora_cfg lc = {atoi(argv[8]), (float)atof(argv[9]), 0, 0.0f, atoi(argv[10]), 0, 0, 0};
    qt_dpo_cfg dc = {(float)atof(argv[11]), (float)atof(argv[12])};
    qt_layout L;
    qt_lora_layout A;
    float *w;
    if (qt_model_setup(&cfg, &L, &w, err, sizeof err)) return die(argv[1], err);
    int full = lc.rank == 0;
    float *a = NULL, *ga = NULL, *ref = w, *gw = NULL;
    if (full) { /* the reference: another HF folder of the same shape */
        static qt_config rc;
        qt_layout L2;
        rc = cfg;
        snprintf(rc.init.from, sizeof rc.init.from, "%s", argv[2]);
        if (qt_model_setup(&rc, &L2, &ref, err, sizeof err)) return die(argv[2], err);
        if (L2.numel != L.numel) return die(argv[2], "the reference's shape differs from the policy's");
        qt_layout_free(&L2);
        gw = calloc(L.numel, sizeof *gw);
    } else {
        if (qt_lora_layout_init(&A, &lc, &L.cfg, err, sizeof err)) return die("lora", err);
        a = malloc(A.numel * sizeof *a), ga = calloc(A.numel, sizeof *ga);
        if (qt_lora_import(argv[2], &A, a, &L, w, err, sizeof err)) return die(argv[2], err);
    }
    int32_t *win = malloc(sizeof(int32_t) * B * (T + 1)), *in = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    uint8_t *mask = malloc((size_t)N);
    if (read_all(argv[3], win, sizeof(int32_t), (size_t)B * (T + 1))) return die(argv[3], "short");
    if (read_all(argv[4], mask, 1, (size_t)N)) return die(argv[4], "short");
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = win[b * (T + 1) + t];
            tgt[b * T + t] = mask[b * T + t] ? win[b * (T + 1) + t + 1] : -1;
        }
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    qt_lora_cpu *ad = full ? NULL : qt_lora_cpu_create(&A, a, ga, N, 1);
    qt_cpu_adapter *pol = full ? NULL : qt_lora_cpu_adapter(ad);
    if (!full) {
        qt_cpu_model_set_grads(m, 0);
        qt_lora_cpu_set_batch(ad, 1, 0);
    }
    qt_dpo_stats st = {0};
    double loss = qt_dpo_cpu_step(m, w, pol, ref, in, tgt, B, T, &dc, 1, gw, 2.0f / B, &st);
    /* the row log-probs again, for the comparison: the policy's (adapters on), then the reference's (off) */
    double *lp = malloc(2 * (size_t)B * sizeof *lp);
    qt_cpu_model_forward(m, w, in, tgt);
    qt_dpo_row_logps(lp, qt_cpu_model_token_losses(m), tgt, B, T);
    qt_cpu_model_set_adapter(m, NULL);
    qt_cpu_model_forward(m, ref, in, tgt);
    qt_dpo_row_logps(lp + B, qt_cpu_model_token_losses(m), tgt, B, T);
    mkdir(argv[7], 0777);
    if (full ? qt_hf_export(argv[7], &L, gw, 0, err, sizeof err) : qt_lora_export(argv[7], &A, ga, &L, w, "", err, sizeof err))
        return die(argv[7], err);
    snprintf(path, sizeof path, "%s/loss.txt", argv[7]);
    FILE *f = fopen(path, "w");
    fprintf(f, "%.17g\n", loss);
    fclose(f);
    snprintf(path, sizeof path, "%s/logps.f64", argv[7]);
    f = fopen(path, "wb");
    fwrite(lp, sizeof *lp, 2 * (size_t)B, f);
    fclose(f);
    float *scale = malloc((size_t)B * sizeof *scale);
    qt_dpo_batch(&dc, lp, lp + B, B, 2.0f / B, scale, NULL);
    snprintf(path, sizeof path, "%s/scale.f32", argv[7]);
    f = fopen(path, "wb");
    fwrite(scale, sizeof *scale, (size_t)B, f);
    fclose(f);
    free(scale);
    printf("loss %.9g, accuracy %.3f over %ld pairs\n", loss, st.accuracy / st.pairs, st.pairs);
    if (!full) qt_lora_cpu_free(ad), qt_lora_layout_free(&A);
    qt_cpu_model_free(m);
    qt_layout_free(&L);
    if (ref != w) free(ref);
    free(w), free(a), free(ga), free(gw), free(win), free(in), free(tgt), free(mask), free(lp);
    return 0;
}
