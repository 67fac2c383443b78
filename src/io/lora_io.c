/* lora_io.c — LoRA adapters as PEFT's files: adapter_model.safetensors (fp32, PEFT names) and
 * adapter_config.json, written for peft.PeftModel.from_pretrained and read back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_error.h"
#include "qt_json.h"
#include "qt_lora.h"

/* Appends s to out as a JSON string body (quotes and backslashes escaped, control bytes as \u00XX). */
static void json_escape(char *out, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 8 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') out[k++] = '\\', out[k++] = (char)ch;
        else if (ch < 0x20) k += (size_t)snprintf(out + k, cap - k, "\\u%04x", ch);
        else out[k++] = (char)ch;
    }
    out[k] = 0;
}

/* x in the fewest digits that read back as x (0.1f as 0.1). */
static void fmt_float(char *out, size_t cap, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) return;
    }
}

/* Writes the n pieces (p[i], len[i] bytes) to path atomically. */
static int write_file(const char *path, const void *const *p, const size_t *len, int n, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return qt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    for (int i = 0; i < n; i++)
        if (len[i] && fwrite(p[i], 1, len[i], f) != len[i]) {
            int e = errno;
            fclose(f);
            unlink(tmp);
            return qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
        }
    return qt_ckpt_commit_file(f, tmp, path, err, errlen);
}

/* PEFT's modules_to_save names of the trained base tensors (the modules whose weight they are). */
static void modules_to_save(char *out, size_t cap, const qt_layout *L, int trainable) {
    static const char *const norms[] = {"input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm"};
    size_t k = (size_t)snprintf(out, cap, "[");
    if (trainable & QT_LORA_X_EMBED) k += (size_t)snprintf(out + k, cap - k, "%s\"embed_tokens\"", k > 1 ? ", " : "");
    if (trainable & QT_LORA_X_LM_HEAD) k += (size_t)snprintf(out + k, cap - k, "%s\"lm_head\"", k > 1 ? ", " : "");
    if (trainable & QT_LORA_X_NORMS)
        for (int i = 0; i < (L->cfg.qk_norm ? 5 : 3); i++)
            k += (size_t)snprintf(out + k, cap - k, "%s\"%s\"", k > 1 ? ", " : "", norms[i]);
    snprintf(out + k, cap - k, "]");
    if (!trainable) snprintf(out, cap, "null");
}

static int write_config(const char *path, const qt_lora_layout *A, const qt_layout *L, const char *base, char *err,
                        size_t errlen) {
    char buf[8192], b[4200] = "null", targets[256] = "", alpha[32], drop[32], mods[256];
    fmt_float(alpha, sizeof alpha, A->cfg.alpha);
    fmt_float(drop, sizeof drop, A->cfg.dropout);
    modules_to_save(mods, sizeof mods, L, A->cfg.trainable);
    if (base && base[0]) {
        char e[4096];
        json_escape(e, sizeof e, base);
        snprintf(b, sizeof b, "\"%s\"", e);
    }
    for (int t = 0, k = 0; t < QT_LORA_N_TARGETS; t++)
        if ((A->cfg.targets >> t) & 1)
            k += snprintf(targets + k, sizeof targets - (size_t)k, "%s\"%s\"", k ? ", " : "", qt_lora_target_name(t));
    int n = snprintf(buf, sizeof buf,
                     "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": %s,\n"
                     "  \"r\": %d,\n  \"lora_alpha\": %s,\n  \"lora_dropout\": %s,\n  \"use_rslora\": %s,\n"
                     "  \"target_modules\": [%s],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n"
                     "  \"modules_to_save\": %s,\n  \"init_lora_weights\": true,\n  \"inference_mode\": true,\n"
                     "  \"use_dora\": false\n}\n",
                     b, A->cfg.rank, alpha, drop, A->cfg.rslora ? "true" : "false", targets, mods);
    return write_file(path, (const void *[]){buf}, (size_t[]){(size_t)n}, 1, err, errlen);
}

/* The files of qt_lora_export; the trained base tensors at w + their flat offset, or (packed) back to back in layout
 * order from w. */
static int export_files(const char *dir, const qt_lora_layout *A, const float *a, const qt_layout *L, const float *w,
                        int packed, const char *base, char *err, size_t errlen) {
    char path[4096];
    if (qt_ckpt_mkdirs(dir, err, errlen)) return -1;
    int n = 1; /* pieces: the header, the adapter array, each trained base tensor */
    for (int i = 0; i < L->n_tensors; i++) n += qt_lora_trains(&L->tensors[i], A->cfg.trainable);
    size_t cap = 128 + (size_t)(A->n_tensors + n) * 256, k = 8;
    char *h = malloc(cap);
    const void **p = malloc((size_t)(n + 1) * sizeof *p);
    size_t *len = malloc((size_t)(n + 1) * sizeof *len);
    if (!h || !p || !len) {
        free(h), free(p), free(len);
        return qt_errf(err, errlen, "%s: out of memory for the adapter header", dir);
    }
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < A->n_tensors; i++) {
        const qt_lora_tensor *t = &A->tensors[i];
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                              t->name, (long long)t->rows, (long long)t->cols, t->offset * 4, (t->offset + t->numel) * 4);
    }
    size_t at = A->numel * 4;
    int np = 2;
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (!qt_lora_trains(t, A->cfg.trainable)) continue;
        k += (size_t)snprintf(h + k, cap - k, ",\"base_model.model.%s\":{\"dtype\":\"F32\",\"shape\":[%lld", t->name,
                              (long long)t->shape[0]);
        if (t->ndim == 2) k += (size_t)snprintf(h + k, cap - k, ",%lld", (long long)t->shape[1]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", at, at + t->numel * 4);
        p[np] = packed ? w + (at - A->numel * 4) / 4 : w + t->offset;
        len[np++] = t->numel * 4;
        at += t->numel * 4;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while ((k - 8) % 8) h[k++] = ' ';
    uint64_t n64 = k - 8;
    memcpy(h, &n64, 8);
    p[0] = h, len[0] = k;
    p[1] = a, len[1] = A->numel * 4;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = write_file(path, p, len, np, err, errlen);
    free(h), free(p), free(len);
    if (rc) return -1;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return write_config(path, A, L, base, err, errlen);
}

int qt_lora_export(const char *dir, const qt_lora_layout *A, const float *a, const qt_layout *L, const float *w,
                   const char *base, char *err, size_t errlen) {
    return export_files(dir, A, a, L, w, 0, base, err, errlen);
}

int qt_lora_export_packed(const char *dir, const qt_lora_layout *A, const float *a, const qt_layout *L, const float *x,
                          const char *base, char *err, size_t errlen) {
    return export_files(dir, A, a, L, x, 1, base, err, errlen);
}

/* Where a file's tensor goes: into a (an adapter tensor) or into w (a trained base tensor). */
typedef struct {
    float *dst;
    int64_t shape[2];
    int ndim, idx; /* idx: which seen[] flag (adapters first, then the base tensors by layout index) */
    size_t numel;
} dest;

static int find_dest(const char *name, const qt_lora_layout *A, float *a, const qt_layout *L, float *w, dest *d) {
    const qt_lora_tensor *t = qt_lora_find(A, name);
    if (t) {
        *d = (dest){a + t->offset, {t->rows, t->cols}, 2, (int)(t - A->tensors), t->numel};
        return 0;
    }
    const char *pre = "base_model.model.";
    const qt_tensor *b = strncmp(name, pre, strlen(pre)) ? NULL : qt_layout_find(L, name + strlen(pre));
    if (!b || !qt_lora_trains(b, A->cfg.trainable)) return -1;
    *d = (dest){w + b->offset, {b->shape[0], b->shape[1]}, b->ndim, A->n_tensors + (int)(b - L->tensors), b->numel};
    return 0;
}

/* Reads and checks one header entry e. */
static int import_entry(FILE *f, const char *fp, long long data0, uint64_t data_bytes, const qt_lora_layout *A,
                        const qt_json_node *e, float *a, const qt_layout *L, float *w, unsigned char *seen, char *err,
                        size_t errlen) {
    dest d;
    if (find_dest(e->key, A, a, L, w, &d))
        return qt_errf(err, errlen, "%s: %s: not a tensor of this adapter (rank %d, its targets, lora.trainable)", fp,
                       e->key, A->cfg.rank);
    const qt_json_node *dt = qt_json_get(e, "dtype"), *sh = qt_json_get(e, "shape"), *off = qt_json_get(e, "data_offsets");
    if (!dt || dt->type != QT_JSON_STR || strcmp(dt->str, "F32"))
        return qt_errf(err, errlen, "%s: %s: expected dtype F32, got %s", fp, e->key, dt && dt->str ? dt->str : "none");
    const qt_json_node *r = sh ? sh->child : NULL, *c = r && d.ndim == 2 ? r->next : NULL;
    if (!r || (d.ndim == 2 && !c) || (c ? c : r)->next || r->num != (double)d.shape[0] || (c && c->num != (double)d.shape[1]))
        return qt_errf(err, errlen, "%s: %s: expected shape [%lld%s%lld]", fp, e->key, (long long)d.shape[0],
                       d.ndim == 2 ? ", " : "", d.ndim == 2 ? (long long)d.shape[1] : 0LL);
    const qt_json_node *lo = off ? off->child : NULL, *hi = lo ? lo->next : NULL;
    if (!lo || !hi || hi->num - lo->num != (double)d.numel * 4 || lo->num < 0 || hi->num > (double)data_bytes)
        return qt_errf(err, errlen, "%s: %s: data_offsets do not hold %zu fp32 values inside the file", fp, e->key, d.numel);
    if (fseeko(f, data0 + (long long)lo->num, SEEK_SET) || fread(d.dst, 4, d.numel, f) != d.numel)
        return qt_errf(err, errlen, "%s: %s: read failed", fp, e->key);
    seen[d.idx] = 1;
    return 0;
}

int qt_lora_import(const char *path, const qt_lora_layout *A, float *a, const qt_layout *L, float *w, char *err,
                   size_t errlen) {
    char fp[4200];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(fp, sizeof fp, "%s/adapter_model.safetensors", path);
    else snprintf(fp, sizeof fp, "%s", path);
    FILE *f = fopen(fp, "rb");
    if (!f) return qt_errf(err, errlen, "%s: cannot open: %s", fp, strerror(errno));
    uint64_t hlen = 0;
    int rc = -1;
    char *h = NULL, jerr[256];
    qt_json *j = NULL;
    unsigned char *seen = calloc((size_t)A->n_tensors + L->n_tensors + 1, 1);
    if (fstat(fileno(f), &st) || fread(&hlen, 8, 1, f) != 1 || hlen > (uint64_t)st.st_size - 8 || !seen ||
        !(h = malloc(hlen + 1)) || fread(h, 1, hlen, f) != hlen) {
        qt_errf(err, errlen, "%s: not a readable safetensors file", fp);
        goto out;
    }
    if (!(j = qt_json_parse(h, hlen, jerr, sizeof jerr)) || qt_json_root(j)->type != QT_JSON_OBJ) {
        qt_errf(err, errlen, "%s: header JSON: %s", fp, j ? "expected an object" : jerr);
        goto out;
    }
    for (const qt_json_node *e = qt_json_root(j)->child; e; e = e->next)
        if (strcmp(e->key, "__metadata__") && import_entry(f, fp, 8 + (long long)hlen, (uint64_t)st.st_size - 8 - hlen,
                                                           A, e, a, L, w, seen, err, errlen))
            goto out;
    for (int i = 0; i < A->n_tensors + L->n_tensors; i++) {
        const char *name = i < A->n_tensors ? A->tensors[i].name : L->tensors[i - A->n_tensors].name;
        if (!seen[i] && (i < A->n_tensors || qt_lora_trains(&L->tensors[i - A->n_tensors], A->cfg.trainable))) {
            qt_errf(err, errlen, "%s: %s%s: missing", fp, i < A->n_tensors ? "" : "base_model.model.", name);
            goto out;
        }
    }
    rc = 0;
out:
    qt_json_free(j);
    free(h);
    free(seen);
    fclose(f);
    return rc;
}
