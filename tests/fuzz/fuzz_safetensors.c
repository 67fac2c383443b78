/* fuzz_safetensors.c — the safetensors import (src/io/hf.c: header, offsets, dtypes, data) into the
 * tiny model of fuzz_tiny.h. Input: the whole file. An accepted import must leave only finite
 * weights. */
#include <math.h>

#include "fuzz_tiny.h"
#include "fuzz_util.h"
#include "qt_hf.h"

static qt_layout L;
static float *w;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (!w) {
        qt_model_cfg c = fuzz_tiny_cfg();
        if (qt_layout_init(&L, &c, err, sizeof err) || !(w = malloc(L.numel * sizeof *w))) abort();
    }
    const char *path = fuzz_path("model.safetensors");
    fuzz_write(path, data, size);
    if (qt_hf_import(path, &L, w, err, sizeof err) == 0) {
        for (size_t i = 0; i < L.numel; i++) FUZZ_ASSERT(isfinite(w[i]), "weight %zu is %g after an accepted import", i, w[i]);
    } else {
        FUZZ_ASSERT(err[0], "an error without a message");
    }
    return 0;
}
