/* model_setup.c — from a config to a model layout and its initial weights (qt_engine.h). */
#include <stdio.h>
#include <stdlib.h>

#include "qt_config.h"
#include "qt_engine.h"
#include "qt_hf.h"

int qt_model_layout(const qt_config *cfg, qt_layout *L, qt_weight_src *src, char *err, size_t errlen) {
    qt_model_cfg mc = cfg->model;
    char path[QT_PATH_MAX + 32];
    if (cfg->hf_config[0]) {
        if (qt_hf_read_config(cfg->hf_config, &mc, err, errlen)) return -1;
    } else if (cfg->init.from[0] && !cfg->model_inline) {
        if (qt_hf_config_path(cfg->init.from, path, sizeof path, err, errlen) || qt_hf_read_config(path, &mc, err, errlen)) return -1;
    }
    qt_model_cfg_finish(&mc);
    if (mc.max_seq_len < cfg->data.seq_len) {
        snprintf(err, errlen, "%s: data.seq_len: expected <= model max_seq_len (%d), got %d", cfg->path,
                 mc.max_seq_len, cfg->data.seq_len);
        return -1;
    }
    if (qt_layout_init_units(L, &mc, qt_engine_unit_align(cfg), err, errlen)) return -1;
    qt_weight_src_of_config(src, L, cfg);
    float none;
    if (src->kind == QT_WSRC_HF && qt_weight_src_fill(src, 0, 0, &none, err, errlen)) { /* headers only */
        qt_layout_free(L);
        return -1;
    }
    return 0;
}

int qt_model_setup(const qt_config *cfg, qt_layout *L, float **w, char *err, size_t errlen) {
    qt_weight_src src;
    if (qt_model_layout(cfg, L, &src, err, errlen)) return -1;
    *w = calloc(L->numel, sizeof(float));
    if (!*w) {
        snprintf(err, errlen, "out of host memory for %zu parameters", L->numel);
        qt_layout_free(L);
        return -1;
    }
    if (qt_weight_src_fill(&src, 0, L->numel, *w, err, errlen)) {
        free(*w);
        qt_layout_free(L);
        return -1;
    }
    return 0;
}
