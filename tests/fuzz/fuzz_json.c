/* fuzz_json.c — the JSON parser (src/core/json.c) and the HF config.json reader and writer (src/io/hf.c).
 *
 * The input is parsed as it is (not NUL-terminated, so an over-read is caught); the tree is walked.
 * A document that qt_hf_read_config accepts must be written by qt_hf_write_config as JSON that reads
 * back to the same model config (the export never writes invalid JSON). */
#include <math.h>

#include "fuzz_util.h"
#include "qt_hf.h"
#include "qt_json.h"

static size_t walk(const qt_json_node *x, int depth) {
    size_t n = 0;
    for (; x; x = x->next) {
        n += 1 + (x->key ? strlen(x->key) : 0) + (x->str ? strlen(x->str) : 0);
        FUZZ_ASSERT(x->begin <= x->end, "node range [%zu, %zu)", x->begin, x->end);
        if (x->type == QT_JSON_NUM) FUZZ_ASSERT(!isnan(x->num), "a NaN number");
        n += walk(x->child, depth + 1);
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    qt_json *j = qt_json_parse((const char *)data, size, err, sizeof err);
    if (!j) {
        FUZZ_ASSERT(!strncmp(err, "offset ", 7), "error without an offset: %s", err);
        return 0;
    }
    walk(qt_json_root(j), 0);
    int obj = qt_json_root(j)->type == QT_JSON_OBJ;
    qt_json_free(j);
    if (!obj) return 0;
    char path[300], out[300];
    snprintf(path, sizeof path, "%s", fuzz_path("config.json"));
    snprintf(out, sizeof out, "%s", fuzz_path("written.json"));
    fuzz_write(path, data, size);
    qt_model_cfg c, back;
    if (qt_hf_read_config(path, &c, err, sizeof err) != 0) return 0;
    int rc = qt_hf_write_config(out, &c, 0, err, sizeof err);
    if (rc != 0) { /* only a model with no HF equivalent may be refused */
        FUZZ_ASSERT(strstr(err, "qkv_bias"), "write refused an accepted config: %s", err);
        return 0;
    }
    rc = qt_hf_read_config(out, &back, err, sizeof err);
    FUZZ_ASSERT(rc == 0, "the written config.json does not read back: %s", err);
    FUZZ_ASSERT(!memcmp(&c, &back, sizeof c), "config.json round trip differs");
    return 0;
}
