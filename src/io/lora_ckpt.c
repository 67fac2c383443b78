/* lora_ckpt.c — a LoRA engine's adapter blobs in a checkpoint (qt_lora_ckpt.h). */
#include <string.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_lora_ckpt.h"

int qt_lora_ckpt_items(qt_ckpt_item *items, const float *a, const float *m, const float *v, size_t numel,
                       const char *id, const int64_t *step) {
    size_t bytes = numel * sizeof(float);
    items[0] = (qt_ckpt_item){"lora_adapters", QT_DT_F32, a, bytes, 0};
    items[1] = (qt_ckpt_item){"lora_adam_m", QT_DT_F32, m, bytes, 0};
    items[2] = (qt_ckpt_item){"lora_adam_v", QT_DT_F32, v, bytes, 0};
    items[3] = (qt_ckpt_item){"lora_base", -1, id, strlen(id), 0};
    items[4] = (qt_ckpt_item){"lora_step", -1, step, sizeof *step, 0};
    return 5;
}

int qt_lora_ckpt_load(const qt_ckpt *ck, float *a, float *m, float *v, size_t numel, int rank, const char *id,
                      size_t id_key, long *step, char *err, size_t errlen) {
    size_t bytes;
    int dt;
    const char *got = qt_ckpt_get(ck, "lora_base", &bytes, &dt);
    if (!got) return qt_errf(err, errlen, "checkpoint: no lora_base blob (not a LoRA checkpoint: resume it without lora:)");
    if (bytes < id_key || memcmp(got, id, id_key) || (bytes > id_key && got[id_key] != ' '))
        return qt_errf(err, errlen, "checkpoint blob lora_base: the adapters were trained over the base \"%.*s\", this run's "
                       "base is \"%s\": resume over the same base weights", (int)bytes, got, id);
    const int64_t *st = qt_ckpt_get(ck, "lora_step", &bytes, &dt);
    if (!st || bytes != sizeof *st) return qt_errf(err, errlen, "checkpoint blob lora_step: expected 8 bytes");
    const char *names[3] = {"lora_adapters", "lora_adam_m", "lora_adam_v"};
    float *dst[3] = {a, m, v};
    size_t want = numel * sizeof(float);
    for (int i = 0; i < 3; i++) {
        const void *p = qt_ckpt_get(ck, names[i], &bytes, &dt);
        if (!p || bytes != want || dt != QT_DT_F32)
            return qt_errf(err, errlen, "checkpoint blob %s: expected %zu bytes of fp32 (rank %d adapters), got %s",
                           names[i], want, rank, p ? "a different size or dtype" : "none");
        memcpy(dst[i], p, want);
    }
    *step = (long)*st;
    return 0;
}
