/* train.c — the training loop: steps of grad_accum micro-batches, logging, eval, checkpoints, export.
 *
 * One step, top to bottom: lr from the schedule -> the step's grad_accum x N micro-batches read (loader
 * next once per rank and micro-step) and their targets counted -> grad_accum x engine micro_step with
 * the weight of one target, 1/(the step's target count) -> engine opt_step (gradient sum over ranks,
 * norm, clip, AdamW; the one device sync) -> log -> eval -> checkpoint. With N GPUs a step holds
 * micro_batch x grad_accum x N sequences. Normalizing by the whole step's count (not each
 * micro-batch's) makes the gradient that of the mean loss over every target of the step, so
 * accumulation and data parallel give the one-big-batch result also when loss masks leave the
 * micro-batches with different target counts (qt_loss_scale in qt_engine.h). */
#include "qt_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "qt_ckpt.h"
#include "qt_data.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_hf.h"
#include "qt_optim.h"
#include "qt_rng.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p of path's directory, so log.file may point into a fresh run folder. */
static void make_parent_dirs(const char *path) {
    char buf[QT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0777);
        *p = '/';
    }
}

static void fmt_duration(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

typedef struct {
    const qt_config *cfg;
    qt_engine *eng;
    qt_loader *train, *eval;
    int32_t *in, *tgt; /* a step's micro-batches: [grad_accum][ranks][micro_batch * seq_len] */
    FILE *log;
    qt_rng rng;        /* trainer randomness (saved so resumed runs draw the same numbers) */
    long step;         /* steps done */
} trainer;

static long count_targets(const int32_t *tgt, size_t n) {
    long v = 0;
    for (size_t i = 0; i < n; i++) v += tgt[i] >= 0;
    return v;
}

/* The eval loss: the mean over every target >= 0 of the eval batches. When all batches hold the same
 * count (no masks) that is the mean of the batch means, computed so to keep the bits of earlier
 * versions; otherwise each batch mean is weighted by its count, and a multi-GPU call whose batches
 * hold different counts is split into one call per batch (eval_loss sums the ranks' means). */
static int run_eval(trainer *t, float *loss, char *err, size_t errlen) {
    qt_loader_reset(t->eval);
    double sum = 0, tok_sum = 0;
    long valid = 0, v0 = -1;
    int ranks = t->eng->ranks, uneven = 0;
    size_t ntok = (size_t)t->cfg->micro_batch * t->cfg->seq_len;
    for (int i = 0; i < t->cfg->eval_batches; i += ranks) { /* one batch per GPU; spare GPUs get none */
        int n = t->cfg->eval_batches - i < ranks ? t->cfg->eval_batches - i : ranks, same = 1;
        long first = 0;
        for (int r = 0; r < ranks; r++) {
            if (r < n) {
                if (qt_loader_next(t->eval, t->in + r * ntok, t->tgt + r * ntok, err, errlen)) return -1;
                long v = count_targets(t->tgt + r * ntok, ntok);
                if (v0 < 0) v0 = v;
                if (r == 0) first = v;
                same &= v == first;
                uneven |= v != v0;
                valid += v;
            } else { /* token 0, every target ignored */
                memset(t->in + r * ntok, 0, ntok * sizeof(int32_t));
                memset(t->tgt + r * ntok, 0xff, ntok * sizeof(int32_t));
            }
        }
        if (same) {
            float l = t->eng->ops->eval_loss(t->eng, t->in, t->tgt);
            sum += l;
            tok_sum += (double)l * first; /* every batch of the call holds `first` targets */
            continue;
        }
        int32_t *keep = malloc((size_t)n * ntok * sizeof(int32_t)); /* rare: masked multi-GPU eval */
        if (!keep) {
            snprintf(err, errlen, "out of host memory for %zu eval targets", (size_t)n * ntok);
            return -1;
        }
        memcpy(keep, t->tgt, (size_t)n * ntok * sizeof(int32_t));
        for (int r = 0; r < n; r++) { /* batch r alone, the other ranks' targets all ignored */
            memset(t->tgt, 0xff, (size_t)ranks * ntok * sizeof(int32_t));
            memcpy(t->tgt + r * ntok, keep + r * ntok, ntok * sizeof(int32_t));
            tok_sum += (double)t->eng->ops->eval_loss(t->eng, t->in, t->tgt) * count_targets(keep + r * ntok, ntok);
        }
        free(keep);
    }
    if (uneven) *loss = valid ? (float)(tok_sum / valid) : 0.0f;
    else *loss = (float)(sum / t->cfg->eval_batches);
    return 0;
}

/* Everything that makes a resumed run continue bit-for-bit: the engine's optimizer state plus the
 * step, the trainer RNG, the loader position and the model/config it was made with. */
static int save_checkpoint(trainer *t, char *err, size_t errlen) {
    qt_ckpt_item items[16];
    int n = t->eng->ops->state_items(t->eng, items, 10);
    int64_t step = t->step;
    qt_loader_pos pos = qt_loader_get_pos(t->train);
    static char cfgtext[1 << 16];
    size_t cl = qt_config_dump(t->cfg, cfgtext, sizeof cfgtext);
    items[n++] = (qt_ckpt_item){"step", -1, &step, sizeof step};
    items[n++] = (qt_ckpt_item){"rng", -1, &t->rng, sizeof t->rng};
    items[n++] = (qt_ckpt_item){"loader_pos", -1, &pos, sizeof pos};
    items[n++] = (qt_ckpt_item){"model_cfg", -1, &t->eng->L->cfg, sizeof t->eng->L->cfg};
    items[n++] = (qt_ckpt_item){"config", -1, cfgtext, cl < sizeof cfgtext ? cl : sizeof cfgtext - 1};
    return qt_ckpt_save(t->cfg->ckpt_dir, t->step, t->cfg->ckpt_keep, items, n, err, errlen);
}

static int load_checkpoint(trainer *t, const char *which, char *err, size_t errlen) {
    char path[QT_PATH_MAX + 64];
    if (!strcmp(which, "latest")) {
        if (qt_ckpt_latest(t->cfg->ckpt_dir, path, sizeof path)) {
            snprintf(err, errlen, "--resume: no checkpoint (ckpt_*.qtc) in %s", t->cfg->ckpt_dir);
            return -1;
        }
    } else {
        snprintf(path, sizeof path, "%s", which);
    }
    qt_ckpt *ck = qt_ckpt_open(path, err, errlen);
    if (!ck) return -1;
    size_t nb;
    const void *mc = qt_ckpt_get(ck, "model_cfg", &nb, NULL);
    const void *step = qt_ckpt_get(ck, "step", NULL, NULL), *rng = qt_ckpt_get(ck, "rng", NULL, NULL);
    const void *pos = qt_ckpt_get(ck, "loader_pos", NULL, NULL);
    int rc = -1;
    if (!mc || !step || !rng || !pos) {
        snprintf(err, errlen, "%s: not a qtrain training checkpoint (missing step/rng/loader_pos/model_cfg)", path);
    } else if (nb != sizeof(qt_model_cfg) || memcmp(mc, &t->eng->L->cfg, nb)) {
        snprintf(err, errlen, "%s: the checkpoint's model differs from the config's model", path);
    } else if (t->eng->ops->load_state(t->eng, ck, err, errlen) == 0) {
        int64_t s;
        qt_loader_pos p;
        memcpy(&s, step, sizeof s);
        memcpy(&t->rng, rng, sizeof t->rng);
        memcpy(&p, pos, sizeof p);
        qt_loader_set_pos(t->train, p);
        t->step = s;
        printf("qtrain: resumed from %s at step %ld\n", path, t->step);
        rc = 0;
    }
    qt_ckpt_close(ck);
    return rc;
}

static int export_model(trainer *t, char *err, size_t errlen) {
    char dir[QT_PATH_MAX + 16];
    if (t->cfg->export_dir[0]) snprintf(dir, sizeof dir, "%s", t->cfg->export_dir);
    else snprintf(dir, sizeof dir, "%s/export", t->cfg->ckpt_dir);
    float *w = malloc(t->eng->L->numel * sizeof(float));
    if (!w) {
        snprintf(err, errlen, "out of host memory for the export");
        return -1;
    }
    t->eng->ops->get_weights(t->eng, w);
    int rc = qt_hf_export(dir, t->eng->L, w, t->cfg->export_bf16, err, errlen);
    free(w);
    if (rc == 0) printf("qtrain: exported %s/model.safetensors and config.json (%s)\n", dir, t->cfg->export_bf16 ? "bf16" : "fp32");
    /* the tokenizer the data was made with: data.tokenizer, else init.from's when it has one */
    const char *tok = t->cfg->tokenizer_dir[0] ? t->cfg->tokenizer_dir : t->cfg->init_from;
    int n = rc == 0 && tok[0] ? qt_hf_export_tokenizer(dir, tok, t->cfg->tokenizer_dir[0] != 0, err, errlen) : 0;
    if (n > 0) printf("qtrain: exported %d tokenizer files from %s\n", n, tok);
    return rc == 0 && n >= 0 ? 0 : -1;
}

static void log_train(trainer *t, float loss, float gnorm, float lr, double tok_s, double eta_s) {
    const qt_config *c = t->cfg;
    char eta[32];
    fmt_duration(eta, sizeof eta, eta_s);
    printf("step %6ld/%d | loss %.4f | gnorm %7.3f | lr %.3e | %8.0f tok/s | ETA %s\n", t->step, c->steps,
           loss, gnorm, lr, tok_s, eta);
    fflush(stdout);
    if (t->log)
        fprintf(t->log, "{\"type\":\"train\",\"step\":%ld,\"loss\":%.6f,\"grad_norm\":%.6f,\"lr\":%.6e,\"tokens_per_s\":%.1f}\n",
                t->step, loss, gnorm, lr, tok_s);
}

static void log_eval(trainer *t, float loss) {
    printf("eval %6ld/%d | loss %.4f | ppl %.2f\n", t->step, t->cfg->steps, loss, exp(loss));
    fflush(stdout);
    if (t->log) {
        fprintf(t->log, "{\"type\":\"eval\",\"step\":%ld,\"loss\":%.6f}\n", t->step, loss);
        fflush(t->log);
    }
}

static int open_loaders(trainer *t, const qt_layout *L, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    t->train = qt_loader_open(c->train_glob, c->seq_len, c->micro_batch, 0, 1, c->seed, 1,
                              (uint32_t)L->cfg.vocab_size, err, errlen);
    if (!t->train) return -1;
    if (c->eval_glob[0] && c->eval_every > 0) {
        t->eval = qt_loader_open(c->eval_glob, c->seq_len, c->micro_batch, 0, 1, c->seed, 0,
                                 (uint32_t)L->cfg.vocab_size, err, errlen);
        if (!t->eval) return -1;
    }
    return 0;
}

static int train_loop(trainer *t, const qt_train_opts *o, qt_train_stats *st, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    qt_sched sched = {c->schedule, c->lr, c->final_lr_frac, c->warmup, c->cooldown, c->steps};
    int ranks = t->eng->ranks;
    size_t ntok = (size_t)c->micro_batch * c->seq_len;
    double tok_per_step = (double)ntok * c->grad_accum * ranks;
    double t0 = now_s(), tlast = t0;
    long start = t->step, last_logged = t->step;
    long stop = o->stop_after >= 0 && o->stop_after < c->steps ? o->stop_after : c->steps;
    while (t->step < stop) {
        float lr = qt_sched_lr(&sched, t->step), loss, gnorm;
        qt_loader_pos p0 = qt_loader_get_pos(t->train);
        long valid = 0;
        for (size_t k = 0; k < (size_t)c->grad_accum * ranks; k++) {
            if (qt_loader_next(t->train, t->in + k * ntok, t->tgt + k * ntok, err, errlen)) {
                qt_loader_set_pos(t->train, p0); /* back to the step's start, as a checkpoint wants it */
                return -1;
            }
            valid += count_targets(t->tgt + k * ntok, ntok);
        }
        float scale = qt_loss_scale(c->grad_accum, ranks, valid);
        for (size_t a = 0; a < (size_t)c->grad_accum; a++)
            t->eng->ops->micro_step(t->eng, t->in + a * ranks * ntok, t->tgt + a * ranks * ntok, scale);
        t->eng->ops->opt_step(t->eng, lr, t->step + 1, &loss, &gnorm);
        if (!isfinite(loss) || !isfinite(gnorm)) {
            snprintf(err, errlen, "step %ld: loss %g, grad norm %g: training diverged (lower optim.lr?)",
                     t->step + 1, loss, gnorm);
            return -1;
        }
        if (o->losses) o->losses[t->step] = loss;
        t->step++;
        int last = t->step == stop;
        if (t->step % c->log_every == 0 || last || t->step == start + 1) {
            double tn = now_s(), tok_s = (t->step - last_logged) * tok_per_step / (tn - tlast);
            double eta = (tn - t0) / (t->step - start) * (c->steps - t->step);
            log_train(t, loss, gnorm, lr, tok_s, eta);
            tlast = tn;
            last_logged = t->step;
        }
        if (t->eval && ((c->eval_every > 0 && t->step % c->eval_every == 0) || t->step == c->steps)) {
            float el;
            if (run_eval(t, &el, err, errlen)) return -1;
            if (isnan(st->first_eval)) st->first_eval = el;
            st->last_eval = el;
            log_eval(t, el);
        }
        if ((c->ckpt_every > 0 && t->step % c->ckpt_every == 0) || last) {
            if (save_checkpoint(t, err, errlen)) return -1;
        }
    }
    double dt = now_s() - t0;
    st->tokens_per_s = dt > 0 ? (t->step - start) * tok_per_step / dt : 0;
    return 0;
}

int qt_train_run(const qt_config *cfg, const qt_train_opts *opts, qt_train_stats *st, char *err, size_t errlen) {
    qt_train_opts dflt = {NULL, -1, 0, NULL};
    qt_train_stats dst;
    const qt_train_opts *o = opts ? opts : &dflt;
    if (!st) st = &dst;
    *st = (qt_train_stats){0, NAN, NAN, 0};
    qt_layout L;
    float *w0 = NULL;
    if (qt_model_setup(cfg, &L, &w0, err, errlen)) return -1;
    trainer t = {.cfg = cfg};
    qt_rng_seed(&t.rng, cfg->seed);
    int rc = -1;
    if (cfg->tokenizer_dir[0] && qt_hf_check_tokenizer(cfg->tokenizer_dir, err, errlen)) goto done;
    if (open_loaders(&t, &L, err, errlen)) goto done;
    t.eng = qt_engine_create(&L, cfg, w0, err, errlen);
    if (!t.eng) goto done;
    size_t ntok = (size_t)cfg->micro_batch * cfg->seq_len * t.eng->ranks * cfg->grad_accum;
    t.in = malloc(ntok * sizeof(int32_t));
    t.tgt = malloc(ntok * sizeof(int32_t));
    if (!t.in || !t.tgt) {
        snprintf(err, errlen, "out of host memory for %zu tokens", ntok);
        goto done;
    }
    printf("qtrain: %s | %zu parameters | %d layers, hidden %d, heads %d/%d, vocab %d | %s | %.2f GFLOP/token\n",
           cfg->path, L.n_params, L.cfg.num_layers, L.cfg.hidden_size, L.cfg.num_heads, L.cfg.num_kv_heads,
           L.cfg.vocab_size, t.eng->ops->name, qt_model_flops_per_token(&L.cfg, cfg->seq_len) * 1e-9);
    if (t.eng->ops->print_memory) t.eng->ops->print_memory(t.eng);
    if (o->resume && load_checkpoint(&t, o->resume, err, errlen)) goto done;
    if (!o->export_only) {
        if (cfg->log_file[0]) {
            make_parent_dirs(cfg->log_file);
            t.log = fopen(cfg->log_file, o->resume ? "a" : "w");
            if (!t.log) {
                snprintf(err, errlen, "%s: log.file: cannot open %s for writing", cfg->path, cfg->log_file);
                goto done;
            }
        }
        if (train_loop(&t, o, st, err, errlen)) goto done;
    }
    st->steps_done = t.step;
    if (t.step == cfg->steps || o->export_only) rc = export_model(&t, err, errlen);
    else rc = 0;
done:
    if (t.log) fclose(t.log);
    if (t.eng) t.eng->ops->free(t.eng);
    if (t.train) qt_loader_free(t.train);
    if (t.eval) qt_loader_free(t.eval);
    free(t.in);
    free(t.tgt);
    free(w0);
    qt_layout_free(&L);
    return rc;
}
