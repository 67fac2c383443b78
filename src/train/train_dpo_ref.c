/* train_dpo_ref.c — objective: dpo with full fine-tuning: the stored reference log-probs (qt_train_dpo_ref.h): the
 * reference's identity, the <shard>.dporef files read, checked or made by a first pass, and each micro-batch's rows'
 * log-probs handed to the engine. */
#include "qt_train_dpo_ref.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qt_crc32c.h"
#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

/* The identity of the initial weights: the CRC-32C of their fp32 bytes in the compact layout (each unit without
 * its padding: the same at every unit alignment), read from src a chunk at a time. */
static int model_id(const qt_weight_src *src, char *id, size_t cap, char *err, size_t errlen) {
    const qt_layout *L = src->L;
    size_t chunk = qt_weight_src_chunk(L);
    float *buf = malloc(chunk * sizeof *buf);
    if (!buf) return qt_errf(err, errlen, "out of host memory for %zu weights", chunk);
    uint32_t crc = 0;
    for (int u = 0; u < L->n_units; u++)
        for (size_t off = L->unit_at[u], end = off + (L->unit_compact[u + 1] - L->unit_compact[u]); off < end; off += chunk) {
            size_t k = end - off < chunk ? end - off : chunk;
            if (qt_weight_src_fill(src, off, k, buf, err, errlen)) {
                free(buf);
                return -1;
            }
            crc = qt_crc32c(crc, buf, k * sizeof *buf);
        }
    free(buf);
    snprintf(id, cap, "crc32c %08x numel %zu", crc, L->compact_numel);
    return 0;
}

/* The header of a file of `rows` rows of shard h made for id. */
static void header(unsigned char *hd, const char *id, uint64_t rows, const qt_tokens_header *h, uint32_t crc) {
    uint32_t version = 1, seq = h->pair_seq_len, zero = 0;
    memset(hd, 0, QT_DPOREF_HEADER);
    memcpy(hd, "QTDPOREF", 8);
    memcpy(hd + 8, &version, 4);
    memcpy(hd + 12, &crc, 4);
    memcpy(hd + 16, &rows, 8);
    memcpy(hd + 24, &h->n_tokens, 8);
    memcpy(hd + 32, &h->checksum, 8);
    memcpy(hd + 40, &seq, 4);
    memcpy(hd + 44, &zero, 4);
    snprintf((char *)hd + 48, QT_DPOREF_HEADER - 48, "%s", id);
}

/* Reads file into lp[rows]: 1 when it holds the rows of shard h for id, 0 when there is no file or it was made for
 * another reference or shard (*why says which), -1 with err when it is damaged. */
static int read_file(const char *file, const char *id, uint64_t rows, const qt_tokens_header *h, double *lp,
                     char *why, size_t wcap, char *err, size_t errlen) {
    FILE *f = fopen(file, "rb");
    if (!f) {
        if (errno == ENOENT) return snprintf(why, wcap, "none yet"), 0;
        return qt_errf(err, errlen, "%s: cannot open the stored DPO reference: %s", file, strerror(errno));
    }
    unsigned char hd[QT_DPOREF_HEADER], want[QT_DPOREF_HEADER];
    int rc = -1;
    if (fread(hd, 1, sizeof hd, f) != sizeof hd || memcmp(hd, "QTDPOREF", 8)) {
        qt_errf(err, errlen, "%s: not a stored DPO reference (no QTDPOREF header of %d bytes): delete it and the run "
                "computes it again", file, QT_DPOREF_HEADER);
    } else if (hd[QT_DPOREF_HEADER - 1] != 0) {
        qt_errf(err, errlen, "%s: the reference's identity in the header is not NUL-terminated: delete the file", file);
    } else {
        header(want, id, rows, h, 0);
        memcpy(want + 12, hd + 12, 4); /* the rows' CRC is checked below */
        if (memcmp(hd, want, 48)) {
            snprintf(why, wcap, "it was made for another shard (rows, tokens, checksum or seq_len differ)");
            rc = 0;
        } else if (strcmp((const char *)hd + 48, id)) {
            snprintf(why, wcap, "it was made for \"%s\", this run's reference is \"%s\"", (const char *)hd + 48, id);
            rc = 0;
        } else if (fread(lp, sizeof *lp, rows, f) != rows || fgetc(f) != EOF) {
            qt_errf(err, errlen, "%s: expected %llu rows of f64 after the header: the file is truncated or too long; delete "
                    "it and the run computes it again", file, (unsigned long long)rows);
        } else {
            uint32_t crc;
            memcpy(&crc, hd + 12, 4);
            if (crc != qt_crc32c(0, lp, rows * sizeof *lp))
                qt_errf(err, errlen, "%s: the rows' CRC-32C does not match the header: the file is damaged; delete it and "
                        "the run computes it again", file);
            else rc = 1;
        }
    }
    fclose(f);
    return rc;
}

/* Writes lp[rows] to file (through file.tmp and a rename). 0 or -1 with err. */
static int write_file(const char *file, const char *id, uint64_t rows, const qt_tokens_header *h, const double *lp,
                      char *err, size_t errlen) {
    char tmp[QT_PATH_MAX + 16];
    unsigned char hd[QT_DPOREF_HEADER];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    header(hd, id, rows, h, qt_crc32c(0, lp, rows * sizeof *lp));
    FILE *f = fopen(tmp, "wb");
    if (!f) return qt_errf(err, errlen, "%s: cannot write the stored DPO reference: %s", tmp, strerror(errno));
    int ok = fwrite(hd, 1, sizeof hd, f) == sizeof hd && fwrite(lp, sizeof *lp, rows, f) == rows;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, file) != 0) {
        int e = errno;
        remove(tmp);
        return qt_errf(err, errlen, "%s: cannot write the stored DPO reference: %s", file, strerror(e));
    }
    return 0;
}

/* The first pass over rows [first, first + rows) of l: lp[rows] from engine e, ranks x micro_batch rows a call. */
static int first_pass(const qt_train_dpo_ref *r, qt_loader *l, uint64_t first, uint64_t rows, qt_engine *e,
                      qt_train_docs *docs, double *lp, char *err, size_t errlen) {
    size_t n = (size_t)e->ranks * r->micro_batch, T = (size_t)docs->seq_len;
    int32_t *in = malloc(n * T * sizeof *in), *tg = malloc(n * T * sizeof *tg);
    double *out = malloc(n * sizeof *out);
    int rc = in && tg && out ? 0 : qt_errf(err, errlen, "out of host memory for the DPO reference's first pass");
    for (uint64_t r0 = 0; r0 < rows && rc == 0; r0 += n) {
        size_t k = rows - r0 < n ? (size_t)(rows - r0) : n; /* the rest: no rows (token 0, targets ignored) */
        rc = qt_loader_read_rows(l, first + r0, (int)k, in, tg, docs->starts, docs->n_starts, err, errlen);
        if (rc) break;
        memset(in + k * T, 0, (n - k) * T * sizeof *in);
        memset(tg + k * T, 0xff, (n - k) * T * sizeof *tg);
        qt_train_docs_clear(docs, k, (int)(n - k));
        rc = qt_train_docs_apply(docs, e, 0, 1, err, errlen) || qt_engine_row_logps(e, in, tg, out, err, errlen) ? -1 : 0;
        if (rc == 0) memcpy(lp + r0, out, k * sizeof *lp);
    }
    free(in), free(tg), free(out);
    return rc;
}

/* Every shard of l: its stored rows into lp, read or made. */
static int prepare(const qt_train_dpo_ref *r, qt_loader *l, qt_engine *e, qt_train_docs *docs, double *lp, char *err,
                   size_t errlen) {
    for (int i = 0; i < qt_loader_shards(l); i++) {
        const char *path = qt_loader_shard_path(l, i);
        const qt_tokens_header *h = qt_loader_shard_header(l, i);
        uint64_t first, rows = qt_loader_shard_rows(l, i, &first);
        char file[QT_PATH_MAX + 16], why[512];
        snprintf(file, sizeof file, "%s%s", path, QT_DPOREF_SUFFIX);
        int got = read_file(file, r->id, rows, h, lp + first, why, sizeof why, err, errlen);
        if (got < 0) return -1;
        if (got) {
            printf("qtrain: objective: dpo: the reference log-probs of %s: %s (%llu rows)\n", path, file,
                   (unsigned long long)rows);
            continue;
        }
        printf("qtrain: objective: dpo: computing the reference log-probs of %s (%llu rows) into %s (%s)\n", path,
               (unsigned long long)rows, file, why);
        if (first_pass(r, l, first, rows, e, docs, lp + first, err, errlen) ||
            write_file(file, r->id, rows, h, lp + first, err, errlen))
            return -1;
    }
    return 0;
}

int qt_train_dpo_ref_init(qt_train_dpo_ref *r, const qt_config *c, const qt_weight_src *src, qt_loader *train,
                          qt_loader *eval, qt_engine *e, qt_train_docs *docs, size_t windows, char *err, size_t errlen) {
    *r = (qt_train_dpo_ref){0};
    if (c->objective != QT_OBJ_DPO || c->lora.rank > 0 || !train) return 0;
    r->on = 1;
    r->windows = windows;
    r->micro_batch = c->data.micro_batch;
    if (model_id(src, r->model_id, sizeof r->model_id, err, errlen)) return -1;
    snprintf(r->id, sizeof r->id, "%s | engine %s | micro_batch %d | attention %s, positions %s", r->model_id,
             e->ops->name, c->data.micro_batch, docs->attention ? "document" : "causal",
             docs->positions ? "document" : "window");
    qt_loader *ls[2] = {train, eval};
    r->slots = calloc(windows, sizeof *r->slots);
    r->rows = malloc((size_t)r->micro_batch * sizeof *r->rows);
    if (!r->slots || !r->rows) return qt_errf(err, errlen, "out of host memory");
    for (int k = 0; k < 2; k++) {
        if (!ls[k]) continue;
        uint64_t n = qt_loader_windows(ls[k]);
        if (!(r->lp[k] = malloc(n * sizeof *r->lp[k])))
            return qt_errf(err, errlen, "out of host memory for %llu reference log-probs", (unsigned long long)n);
        if (prepare(r, ls[k], e, docs, r->lp[k], err, errlen)) return -1;
    }
    return qt_train_docs_apply(docs, e, 0, 0, err, errlen); /* the first pass's documents are done with */
}

void qt_train_dpo_ref_take(qt_train_dpo_ref *r, const qt_loader *l, int eval, size_t w0) {
    if (!r->on) return;
    qt_loader_last_rows(l, r->rows);
    for (int b = 0; b < r->micro_batch; b++) {
        uint64_t row = r->rows[b];
#ifdef QT_MUTANTS
        if (qt_mutant_on(QT_MUT_DPO_REF_ROW)) row = (r->rows[0] + (uint64_t)b) % qt_loader_windows(l); /* the batch's place */
#endif
        r->slots[w0 + b] = r->lp[eval][row];
    }
}

void qt_train_dpo_ref_clear(qt_train_dpo_ref *r, size_t w0, size_t n) {
    if (r->on) memset(r->slots + w0, 0, n * sizeof *r->slots);
}

int qt_train_dpo_ref_apply(const qt_train_dpo_ref *r, qt_engine *e, size_t w0, int src_loader, char *err, size_t errlen) {
    if (!r->on) return 0;
    return qt_engine_set_dpo_ref(e, src_loader ? r->slots + w0 : NULL, err, errlen);
}

int qt_train_dpo_ref_item(const qt_train_dpo_ref *r, qt_ckpt_item *item) {
    if (!r->on) return 0;
    *item = (qt_ckpt_item){"dpo_reference", -1, r->model_id, strlen(r->model_id), 0};
    return 1;
}

int qt_train_dpo_ref_check(const qt_train_dpo_ref *r, const qt_ckpt *ck, const char *path, char *err, size_t errlen) {
    if (!r->on) return 0;
    size_t bytes;
    int dt;
    const char *id = qt_ckpt_get(ck, "dpo_reference", &bytes, &dt);
    if (!id)
        return qt_errf(err, errlen, "%s: no dpo_reference blob (not an objective: dpo checkpoint of full fine-tuning): "
                       "resume it with its own objective", path);
    if (bytes != strlen(r->model_id) || memcmp(id, r->model_id, bytes))
        return qt_errf(err, errlen, "%s: blob dpo_reference: the run's reference (its initial weights) was \"%.*s\", this "
                       "run's is \"%s\": resume from the same init.from (or init.seed)", path, (int)bytes, id, r->model_id);
    return 0;
}

void qt_train_dpo_ref_free(qt_train_dpo_ref *r) {
    free(r->lp[0]), free(r->lp[1]), free(r->slots), free(r->rows);
    *r = (qt_train_dpo_ref){0};
}
