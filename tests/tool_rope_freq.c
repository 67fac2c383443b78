/* tool_rope_freq.c — prints the RoPE frequencies qtrain uses for an HF config.json, for the transformers
 * comparison (tests/test_hf_compare.py checks them against ROPE_INIT_FUNCTIONS):
 *   tool_rope_freq CONFIG.json SEQ_LEN [EXPORT.json]
 * First line: the attention factor (cos/sin multiplier); then inv_freq[i] for each rotary pair, %.17g.
 * With EXPORT.json, also writes the config read as qtrain's export writes it (qt_hf_write_config). */
#include <stdio.h>
#include <stdlib.h>

#include "qt_hf.h"
#include "qt_rope.h"

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: tool_rope_freq CONFIG.json SEQ_LEN [EXPORT.json]\n");
        return 2;
    }
    qt_model_cfg c;
    char err[1024];
    if (qt_hf_read_config(argv[1], &c, err, sizeof err)) {
        fprintf(stderr, "tool_rope_freq: %s\n", err);
        return 1;
    }
    if (argc == 4 && qt_hf_write_config(argv[3], &c, 0, err, sizeof err)) {
        fprintf(stderr, "tool_rope_freq: %s\n", err);
        return 1;
    }
    double *inv = malloc((size_t)(c.head_dim / 2 + 1) * sizeof *inv), attn;
    if (!inv) return 1;
    qt_rope_inv_freq(&c, atoi(argv[2]), inv, &attn);
    printf("%.17g\n", attn);
    for (int i = 0; i < c.head_dim / 2; i++) printf("%.17g\n", inv[i]);
    free(inv);
    return 0;
}
