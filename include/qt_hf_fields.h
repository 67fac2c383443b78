/* qt_hf_fields.h — config.json's typed members (src/io/hf_fields.c), shared by the families' readers (hf.c,
 * hf_gemma.c). Each returns 0, or -1 with a message naming path and key. */
#ifndef QT_HF_FIELDS_H
#define QT_HF_FIELDS_H

#include <stddef.h>

#include "qt_json.h"
#include "qt_model.h"

/* "a number", "a string", ...: what x is, for a message ("nothing" for NULL). */
const char *qt_hf_type_name(const qt_json_node *x);
/* An integer member in [lo, hi]; absent (or null): def, or an error when def < lo (required). */
int qt_hf_get_int(const char *path, const qt_json_node *o, const char *key, int def, int lo, int hi, int *out,
                  char *err, size_t errlen);
/* A number > 0 that fp32 holds (absent or null: def). */
int qt_hf_get_num(const char *path, const qt_json_node *o, const char *key, float def, float *out, char *err,
                  size_t errlen);
/* true or false (absent or null: def). */
int qt_hf_get_bool(const char *path, const qt_json_node *o, const char *key, int def, int *out, char *err,
                   size_t errlen);
/* The sizes every family has: hidden_size .. tie_word_embeddings, and rope_theta (top level or in
 * rope_parameters; both must agree). */
int qt_hf_read_sizes(const char *path, const qt_json_node *r, qt_model_cfg *c, char *err, size_t errlen);

#endif
