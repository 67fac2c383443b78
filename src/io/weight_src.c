/* weight_src.c — the initial weights a range at a time (qt_weight_src.h). */
#include "qt_weight_src.h"

#include <stdio.h>
#include <string.h>

#include "qt_error.h"
#include "qt_hf.h"

void qt_weight_src_of_config(qt_weight_src *s, const qt_layout *L, const qt_config *cfg) {
    memset(s, 0, sizeof *s);
    s->L = L;
    s->kind = cfg->init.from[0] ? QT_WSRC_HF : QT_WSRC_INIT;
    s->seed = cfg->init.seed;
    s->std = cfg->init.std;
    snprintf(s->path, sizeof s->path, "%s", cfg->init.from);
}

qt_weight_src qt_weight_src_array(const qt_layout *L, const float *w) {
    qt_weight_src s;
    memset(&s, 0, sizeof s);
    s.kind = QT_WSRC_ARRAY;
    s.L = L;
    s.w = w;
    return s;
}

int qt_weight_src_fill(const qt_weight_src *s, size_t off, size_t n, float *dst, char *err, size_t errlen) {
    QT_CHECK(off + n <= s->L->numel, "weight source: range [%zu, %zu) past %zu parameters", off, off + n, s->L->numel);
    switch (s->kind) {
    case QT_WSRC_INIT:
    case QT_WSRC_INIT_GPU: qt_layout_init_range(s->L, off, n, dst, s->seed, s->std); return 0;
    case QT_WSRC_HF: return qt_hf_import_range(s->path, s->L, off, n, dst, err, errlen);
    case QT_WSRC_ARRAY: memcpy(dst, s->w + off, n * sizeof *dst); return 0;
    }
    return qt_errf(err, errlen, "weight source: unknown kind %d", (int)s->kind);
}

size_t qt_weight_src_chunk(const qt_layout *L) { return L->numel < QT_WSRC_CHUNK ? L->numel : QT_WSRC_CHUNK; }
