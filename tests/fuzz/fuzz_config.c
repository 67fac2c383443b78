/* fuzz_config.c — the YAML config loader and --set overrides (src/config/config.c, src/config/config_keys.c).
 *
 * Input: YAML text, then up to 4 overrides, separated by NUL bytes. Beyond "no crash, no UB": a config
 * that loads must dump (--print-config) to YAML that loads back to an equal config. */
#include "fuzz_util.h"
#include "qt_config.h"

static qt_config a, b;
static char dump[1 << 18], err[2048];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    const char *ovr[4];
    int n_ovr = 0;
    for (size_t i = strlen(text); i < size && n_ovr < 4; i += strlen(text + i + 1) + 1) ovr[n_ovr++] = text + i + 1;
    if (qt_config_load_string(&a, text, "fuzz.yaml", ovr, n_ovr, err, sizeof err) == 0) {
        size_t n = qt_config_dump(&a, dump, sizeof dump);
        FUZZ_ASSERT(n < sizeof dump, "dump of %zu bytes", n);
        int rc = qt_config_load_string(&b, dump, "dump.yaml", NULL, 0, err, sizeof err);
        FUZZ_ASSERT(rc == 0, "the dump does not load: %s\n%s", err, dump);
        const char *diff = "?";
        FUZZ_ASSERT(qt_config_equal(&a, &b, &diff), "%s differs after dump and reload", diff);
    } else {
        FUZZ_ASSERT(err[0] && strlen(err) < sizeof err, "an error without a message");
    }
    free(text);
    return 0;
}
