/* qt_lora_ckpt.h — the checkpoint blobs of a LoRA engine's adapters (the CPU and GPU engines write the same ones,
 * so a run resumes on either): lora_adapters, lora_adam_m, lora_adam_v (fp32 [numel] each), lora_base (the base's
 * identity, "crc32c <hex> numel <n> from <source>") and lora_step (int64, the last optimizer step). */
#ifndef QT_LORA_CKPT_H
#define QT_LORA_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "qt_ckpt.h"

/* Fills items[0..5) with views of a, m, v [numel] (host), id and *step; returns 5. */
int qt_lora_ckpt_items(qt_ckpt_item *items, const float *a, const float *m, const float *v, size_t numel,
                       const char *id, const int64_t *step);
/* Reads them back into a, m, v [numel] and *step, after checking that the checkpoint's lora_base matches id up to
 * id_key characters (the part that names the weights; the source path may differ). rank: the adapters' (for the
 * message). 0, or -1 with err naming the blob. */
int qt_lora_ckpt_load(const qt_ckpt *ck, float *a, float *m, float *v, size_t numel, int rank, const char *id,
                      size_t id_key, long *step, char *err, size_t errlen);

#endif
