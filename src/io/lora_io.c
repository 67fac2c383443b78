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

/* Writes p[0, n) then p2[0, n2) to path atomically. */
static int write_file(const char *path, const void *p, size_t n, const void *p2, size_t n2, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return qt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    if (fwrite(p, 1, n, f) != n || (n2 && fwrite(p2, 1, n2, f) != n2)) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        return qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
    }
    return qt_ckpt_commit_file(f, tmp, path, err, errlen);
}

static int write_config(const char *path, const qt_lora_layout *A, const char *base, char *err, size_t errlen) {
    char buf[8192], b[4200] = "null", targets[256] = "", alpha[32], drop[32];
    fmt_float(alpha, sizeof alpha, A->cfg.alpha);
    fmt_float(drop, sizeof drop, A->cfg.dropout);
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
                     "  \"modules_to_save\": null,\n  \"init_lora_weights\": true,\n  \"inference_mode\": true,\n"
                     "  \"use_dora\": false\n}\n",
                     b, A->cfg.rank, alpha, drop, A->cfg.rslora ? "true" : "false",
                     targets);
    return write_file(path, buf, (size_t)n, NULL, 0, err, errlen);
}

int qt_lora_export(const char *dir, const qt_lora_layout *A, const float *a, const char *base, char *err,
                   size_t errlen) {
    char path[4096];
    if (qt_ckpt_mkdirs(dir, err, errlen)) return -1;
    size_t cap = 128 + (size_t)A->n_tensors * 256, k = 0;
    char *h = malloc(cap);
    if (!h) return qt_errf(err, errlen, "%s: out of memory for the adapter header", dir);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < A->n_tensors; i++) {
        const qt_lora_tensor *t = &A->tensors[i];
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                              t->name, (long long)t->rows, (long long)t->cols, t->offset * 4, (t->offset + t->numel) * 4);
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';
    /* header length, header, then the tensors: the adapter array is already in the header's order */
    char *head = malloc(8 + k);
    if (!head) {
        free(h);
        return qt_errf(err, errlen, "%s: out of memory for the adapter header", dir);
    }
    uint64_t n64 = k;
    memcpy(head, &n64, 8);
    memcpy(head + 8, h, k);
    free(h);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = write_file(path, head, 8 + k, a, A->numel * sizeof *a, err, errlen);
    free(head);
    if (rc) return -1;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return write_config(path, A, base, err, errlen);
}

/* Reads and checks one header entry e into a. */
static int import_entry(FILE *f, const char *fp, long long data0, uint64_t data_bytes, const qt_lora_layout *A,
                        const qt_json_node *e, float *a, unsigned char *seen, char *err, size_t errlen) {
    const qt_lora_tensor *t = qt_lora_find(A, e->key);
    if (!t) return qt_errf(err, errlen, "%s: %s: not a tensor of this adapter (rank %d, its targets)", fp, e->key, A->cfg.rank);
    const qt_json_node *dt = qt_json_get(e, "dtype"), *sh = qt_json_get(e, "shape"), *off = qt_json_get(e, "data_offsets");
    if (!dt || dt->type != QT_JSON_STR || strcmp(dt->str, "F32"))
        return qt_errf(err, errlen, "%s: %s: expected dtype F32, got %s", fp, e->key, dt && dt->str ? dt->str : "none");
    const qt_json_node *r = sh ? sh->child : NULL, *c = r ? r->next : NULL;
    if (!r || !c || c->next || r->num != (double)t->rows || c->num != (double)t->cols)
        return qt_errf(err, errlen, "%s: %s: expected shape [%lld, %lld]", fp, e->key, (long long)t->rows,
                       (long long)t->cols);
    const qt_json_node *lo = off ? off->child : NULL, *hi = lo ? lo->next : NULL;
    if (!lo || !hi || hi->num - lo->num != (double)t->numel * 4 || lo->num < 0 || hi->num > (double)data_bytes)
        return qt_errf(err, errlen, "%s: %s: data_offsets do not hold %zu fp32 values inside the file", fp, e->key, t->numel);
    if (fseeko(f, data0 + (long long)lo->num, SEEK_SET) || fread(a + t->offset, 4, t->numel, f) != t->numel)
        return qt_errf(err, errlen, "%s: %s: read failed", fp, e->key);
    seen[t - A->tensors] = 1;
    return 0;
}

int qt_lora_import(const char *path, const qt_lora_layout *A, float *a, char *err, size_t errlen) {
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
    unsigned char *seen = calloc((size_t)A->n_tensors + 1, 1);
    if (fstat(fileno(f), &st) || fread(&hlen, 8, 1, f) != 1 || hlen > (uint64_t)st.st_size - 8 || !seen ||
        !(h = malloc(hlen + 1)) || fread(h, 1, hlen, f) != hlen) {
        qt_errf(err, errlen, "%s: not a readable safetensors file", fp);
        goto out;
    }
    if (!(j = qt_json_parse(h, hlen, jerr, sizeof jerr))) {
        qt_errf(err, errlen, "%s: header JSON: %s", fp, jerr);
        goto out;
    }
    for (const qt_json_node *e = qt_json_root(j)->child; e; e = e->next)
        if (strcmp(e->key, "__metadata__") &&
            import_entry(f, fp, 8 + (long long)hlen, (uint64_t)st.st_size - 8 - hlen, A, e, a, seen, err, errlen))
            goto out;
    for (int i = 0; i < A->n_tensors; i++)
        if (!seen[i]) {
            qt_errf(err, errlen, "%s: %s: missing", fp, A->tensors[i].name);
            goto out;
        }
    rc = 0;
out:
    qt_json_free(j);
    free(h);
    free(seen);
    fclose(f);
    return rc;
}
