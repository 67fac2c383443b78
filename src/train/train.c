/* train.c — the training loop: steps of grad_accum micro-batches, logging, eval, checkpoints, export.
 *
 * One step, top to bottom: lr from the schedule -> the step's grad_accum x N micro-batches read (loader
 * next once per rank and micro-step) and their targets counted -> grad_accum x engine micro_step with
 * the weight of one target, 1/(the step's target count) -> engine opt_step (gradient sum over ranks,
 * norm, clip, AdamW; the one device sync) -> finiteness of the new weights -> log -> eval ->
 * checkpoint. With N GPUs a step holds micro_batch x grad_accum x N sequences. Normalizing by the
 * whole step's count (not each micro-batch's) makes the gradient that of the mean loss over every
 * target of the step, so accumulation and data parallel give the one-big-batch result also when loss
 * masks leave the micro-batches with different target counts (qt_loss_scale in qt_engine.h). A stop
 * request is looked at between steps, so every GPU thread ends the same step. Checkpoints are
 * snapshots written by a background thread (train_ckpt.c). */
#include "qt_train.h"

#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "qt_data.h"
#include "qt_dp_nodes.h"
#include "qt_engine.h"
#include "qt_error.h"
#include "qt_hf.h"
#include "qt_optim.h"
#include "qt_train_ckpt.h"
#include "qt_train_dpo.h"
#include "qt_train_nodes.h"
#include "qt_train_session.h"
#include "qt_tuning_cache.h"

/* 0: run on; > 0: the signal that asked for a stop; -1: qt_train_request_stop. Lock-free, so a signal
 * handler may set it. */
static atomic_int g_stop;

void qt_train_request_stop(void) {
    int none = 0;
    atomic_compare_exchange_strong(&g_stop, &none, -1);
}

/* SIGINT and SIGTERM are blocked in every thread (the mask is inherited by the threads CUDA, cuDNN,
 * OpenMP and we create later) and taken by one thread of ours with sigwait, so a signal never
 * interrupts a system call inside a library (with a handler, a SIGINT during the first step's cuDNN/NVRTC
 * set-up ends the process with status 4 and no message) and no library's handler sees it.
 * The first asks for a stop; the second ends the process at once with the signal's default action. */
static sigset_t g_stop_signals;

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&g_stop_signals, &sig)) continue;
        int none = 0;
        if (!atomic_compare_exchange_strong(&g_stop, &none, sig)) { /* the second signal: go now */
            signal(sig, SIG_DFL);
            pthread_sigmask(SIG_UNBLOCK, &g_stop_signals, NULL);
            raise(sig);
        }
        static const char msg[] = "\nqtrain: stop requested: finishing this step, then saving a checkpoint "
                                  "(signal again to quit at once)\n";
        if (write(2, msg, sizeof msg - 1) < 0) { /* stderr is gone: nothing to say it on */ }
    }
    return NULL;
}

static void start_signal_thread(void) {
    pthread_t th;
    if (pthread_create(&th, NULL, signal_thread, NULL) == 0) pthread_detach(th);
}

void qt_train_install_signal_handlers(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    sigemptyset(&g_stop_signals);
    sigaddset(&g_stop_signals, SIGINT);
    sigaddset(&g_stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &g_stop_signals, NULL); /* this thread and every thread made after it */
    pthread_once(&once, start_signal_thread);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fmt_duration(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static long count_targets(const int32_t *tgt, size_t n) {
    long v = 0;
    for (size_t i = 0; i < n; i++) v += tgt[i] >= 0;
    return v;
}

/* Records the kind of a failure (an engine failure breaks the trainer) and returns rc (-1). */
static int failed(qt_trainer *t, qt_train_fail kind, int rc) {
    t->fail = kind;
    if (kind == QT_TF_DEVICE) t->broken = 1;
    return rc;
}

static int broken(qt_trainer *t, char *err, size_t errlen) {
    t->fail = QT_TF_DEVICE;
    return qt_errf(err, errlen, "an earlier engine failure left this trainer unusable: close it and resume from the "
                   "last checkpoint");
}

/* The eval loss into *out: the mean over every target >= 0 of the eval batches. When all batches hold
 * the same count (no masks) that is the mean of the batch means, computed as such so that unmasked
 * runs keep their bits; otherwise each batch mean is weighted by its count, and a multi-GPU call whose
 * batches hold different counts is split into one call per batch (eval_loss sums the ranks' means).
 * Returns 0; 1 with err when an eval shard cannot be read (the run can still be saved); -1 with err
 * when the engine failed. */
static int run_eval(qt_trainer *t, float *out, long *targets, char *err, size_t errlen) {
    qt_loader_reset(t->eval);
    double sum = 0, tok_sum = 0;
    long valid = 0, v0 = -1;
    int ranks = t->eng->ranks, uneven = 0;
    size_t ntok = (size_t)t->cfg->data.micro_batch * t->cfg->data.seq_len;
    for (int i = 0; i < t->cfg->eval.batches; i += ranks) { /* one batch per GPU; spare GPUs get none */
        int n = t->cfg->eval.batches - i < ranks ? t->cfg->eval.batches - i : ranks, same = 1;
        long first = 0;
        for (int r = 0; r < ranks; r++) {
            if (r < n) {
                if (qt_train_docs_next(&t->docs, t->eval, (size_t)r * t->cfg->data.micro_batch, t->in + r * ntok,
                                       t->tgt + r * ntok, err, errlen))
                    return 1;
                qt_train_dpo_ref_take(&t->dref, t->eval, 1, (size_t)r * t->cfg->data.micro_batch);
                long v = qt_train_dpo_units(t->cfg, t->cfg->data.micro_batch, count_targets(t->tgt + r * ntok, ntok));
                if (v0 < 0) v0 = v;
                if (r == 0) first = v;
                same &= v == first;
                uneven |= v != v0;
                valid += v;
            } else { /* token 0, every target ignored */
                memset(t->in + r * ntok, 0, ntok * sizeof(int32_t));
                memset(t->tgt + r * ntok, 0xff, ntok * sizeof(int32_t));
                qt_train_docs_clear(&t->docs, (size_t)r * t->cfg->data.micro_batch, t->cfg->data.micro_batch);
                qt_train_dpo_ref_clear(&t->dref, (size_t)r * t->cfg->data.micro_batch, t->cfg->data.micro_batch);
            }
        }
        if (qt_train_docs_apply(&t->docs, t->eng, 0, 1, err, errlen) || qt_train_dpo_ref_apply(&t->dref, t->eng, 0, 1, err, errlen))
            return -1;
        float l;
        if (same) {
            if (qt_engine_eval_loss(t->eng, t->in, t->tgt, &l, err, errlen)) return -1;
            sum += l;
            tok_sum += (double)l * first; /* every batch of the call holds `first` targets */
            continue;
        }
        int32_t *keep = malloc((size_t)n * ntok * sizeof(int32_t)); /* rare: masked multi-GPU eval */
        if (!keep) return qt_errf(err, errlen, "out of host memory for %zu eval targets", (size_t)n * ntok);
        memcpy(keep, t->tgt, (size_t)n * ntok * sizeof(int32_t));
        for (int r = 0; r < n; r++) { /* batch r alone, the other ranks' targets all ignored */
            memset(t->tgt, 0xff, (size_t)ranks * ntok * sizeof(int32_t));
            memcpy(t->tgt + r * ntok, keep + r * ntok, ntok * sizeof(int32_t));
            if (qt_engine_eval_loss(t->eng, t->in, t->tgt, &l, err, errlen)) {
                free(keep);
                return -1;
            }
            tok_sum += (double)l * count_targets(keep + r * ntok, ntok);
        }
        free(keep);
    }
    *targets = valid;
    if (uneven) *out = valid ? (float)(tok_sum / valid) : 0.0f;
    else *out = (float)(sum / t->cfg->eval.batches);
    return 0;
}

void qt_session_export_dir(const qt_config *cfg, char *buf, size_t cap) {
    if (cfg->export.dir[0]) snprintf(buf, cap, "%s", cfg->export.dir);
    else snprintf(buf, cap, "%s/export", cfg->checkpoint.dir);
}

int qt_session_export(qt_trainer *t, const char *dir, int bf16, char *err, size_t errlen) {
    if (t->broken) return broken(t, err, errlen);
    if (t->eng->ops->export_adapter && !t->cfg->lora.export_merged) { /* LoRA: PEFT's adapter files */
        if (qt_engine_export_adapter(t->eng, dir, err, errlen)) return failed(t, QT_TF_IO, -1);
        printf("qtrain: exported %s/adapter_model.safetensors and adapter_config.json\n", dir);
        return 0;
    }
    float *w = malloc(t->eng->L->numel * sizeof(float));
    if (!w) return failed(t, QT_TF_INTERNAL, qt_errf(err, errlen, "out of host memory for the export"));
    if (qt_engine_get_weights(t->eng, w, err, errlen)) {
        free(w);
        return failed(t, QT_TF_DEVICE, -1);
    }
    for (size_t i = 0; i < t->eng->L->numel; i++) /* qtrain's own import refuses what would be written */
        if (!isfinite(w[i])) {
            char name[160];
            qt_trainer_tensor_name(t->eng->L, i, name, sizeof name);
            qt_errf(err, errlen, "export to %s: %s is %g: the weights hold a NaN/Inf (a diverged run); nothing written",
                    dir, name, (double)w[i]);
            free(w);
            return failed(t, QT_TF_DIVERGED, -1);
        }
    int rc = qt_hf_export(dir, t->eng->L, w, bf16, err, errlen);
    free(w);
    if (rc) return failed(t, QT_TF_IO, -1);
    printf("qtrain: exported %s/model.safetensors and config.json (%s)\n", dir, bf16 ? "bf16" : "fp32");
    /* the tokenizer the data was made with: data.tokenizer, else init.from's when it has one */
    const char *tok = t->cfg->data.tokenizer[0] ? t->cfg->data.tokenizer : t->cfg->init.from;
    int n = tok[0] ? qt_hf_export_tokenizer(dir, tok, t->cfg->data.tokenizer[0] != 0, err, errlen) : 0;
    if (n > 0) printf("qtrain: exported %d tokenizer files from %s\n", n, tok);
    return n >= 0 ? 0 : failed(t, QT_TF_IO, -1);
}

/* A step or eval whose batches hold no unmasked target has no loss (the engines report 0): the line
 * and the record say so instead of "loss 0.0000" (and "loss": null). */
static int log_train(qt_trainer *t, float loss, float gnorm, float lr, double tok_s, double eta_s, char *err,
                     size_t errlen) {
    const qt_config *c = t->cfg;
    char eta[32], f[512], l[32] = "null", dl[128], dj[256];
    fmt_duration(eta, sizeof eta, eta_s);
    qt_train_dpo_format(t->eng, c, 0, dl, sizeof dl, dj, sizeof dj);
    if (t->step_targets) snprintf(l, sizeof l, "%.6f", loss);
    if (t->step_targets)
        printf("step %6ld/%d | loss %.4f%s | gnorm %7.3f | lr %.3e | %8.0f tok/s | ETA %s\n", t->step, c->optim.steps,
               loss, dl, gnorm, lr, tok_s, eta);
    else
        printf("step %6ld/%d | no unmasked targets (every target of the step is masked out) | lr %.3e | %8.0f tok/s "
               "| ETA %s\n", t->step, c->optim.steps, lr, tok_s, eta);
    fflush(stdout);
    struct rusage ru; /* the process's peak resident host memory (ru_maxrss: KiB) */
    double mem = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss / 1048576.0 : 0;
    snprintf(f, sizeof f, "\"loss\":%s,\"grad_norm\":%.6f,\"lr\":%.6e,\"tokens_per_s\":%.1f,\"host_mem_gib\":%.3f%s", l,
             gnorm, lr, tok_s, mem, dj);
    return qt_train_log_write(&t->log, "train", t->step, t->step * t->tok_per_step, f, err, errlen);
}

static int log_eval(qt_trainer *t, float loss, long targets, char *err, size_t errlen) {
    char f[320], dl[128], dj[256];
    qt_train_dpo_format(t->eng, t->cfg, 1, dl, sizeof dl, dj, sizeof dj);
    if (targets && t->cfg->objective == QT_OBJ_DPO) printf("eval %6ld/%d | loss %.4f%s\n", t->step, t->cfg->optim.steps, loss, dl);
    else if (targets) printf("eval %6ld/%d | loss %.4f | ppl %.2f\n", t->step, t->cfg->optim.steps, loss, exp(loss));
    else printf("eval %6ld/%d | no unmasked targets (every target of the eval batches is masked out)\n", t->step,
                t->cfg->optim.steps);
    fflush(stdout);
    if (targets) snprintf(f, sizeof f, "\"loss\":%.6f%s", loss, dj);
    else snprintf(f, sizeof f, "\"loss\":null");
    return qt_train_log_write(&t->log, "eval", t->step, t->step * t->tok_per_step, f, err, errlen);
}

/* 1 when glob pattern p matches a file. */
static int matches(const char *p) {
    glob_t g;
    int rc = glob(p, 0, NULL, &g);
    if (rc == 0) globfree(&g);
    return rc == 0;
}

/* The loaders; their errors name the key. An eval glob derived from data.train (not given) that
 * matches nothing means no eval. */
static int open_loaders(qt_trainer *t, const qt_layout *L, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    char e2[2048];
    if (!c->data.train[0])
        return qt_errf(err, errlen, "%s: data.train: not set: give the training shards, e.g. --set "
                       "data.train='data/mine/train_*.bin' (tools/tokenize makes them)", c->path);
    t->train = qt_loader_open(c->data.train, c->data.seq_len, c->data.micro_batch, 0, 1, c->seed, 1,
                              (uint32_t)L->cfg.vocab_size, e2, sizeof e2);
    if (!t->train) return qt_errf(err, errlen, "data.train: %s", e2);
    if (qt_train_dpo_check_data(c, t->train, "data.train", c->data.train, err, errlen)) return -1;
    if (c->data.eval[0] && c->eval.every > 0 && (qt_config_given(c, "data.eval") || matches(c->data.eval))) {
        t->eval = qt_loader_open(c->data.eval, c->data.seq_len, c->data.micro_batch, 0, 1, c->seed, 0,
                                 (uint32_t)L->cfg.vocab_size, e2, sizeof e2);
        if (!t->eval) return qt_errf(err, errlen, "data.eval: %s", e2);
        if (qt_train_dpo_check_data(c, t->eval, "data.eval", c->data.eval, err, errlen)) return -1;
        uint64_t have = qt_loader_windows(t->eval) / (uint64_t)c->data.micro_batch; /* more would read it twice */
        if ((uint64_t)c->eval.batches > have)
            return qt_errf(err, errlen, "eval.batches: %d, but data.eval (%s) holds %llu batches of data.micro_batch %d "
                           "x data.seq_len %d: give at most %llu", c->eval.batches, c->data.eval, (unsigned long long)have,
                           c->data.micro_batch, c->data.seq_len, (unsigned long long)have);
    }
    if (c->eval.every > 0)
        printf("qtrain: training on %s, evaluating on %s\n", c->data.train, t->eval ? c->data.eval : "nothing (no data.eval)");
    return 0;
}

int qt_session_backward(qt_trainer *t, qt_batch_source src, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    if (t->broken) return broken(t, err, errlen);
    if (t->pending)
        return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "step %ld: backward ran already; update first", t->step + 1));
    if (t->step >= t->stop)
        return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "the run ends at step %ld (optim.steps %d): nothing left to "
                                                 "train; raise optim.steps", t->stop, c->optim.steps));
    if (src == QT_BATCH_LOADER && !t->train)
        return failed(t, QT_TF_DATA, qt_errf(err, errlen, "data.train is not set: give the step its tokens"));
    if (qt_trainer_poll_write(t, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
    t->tstep = now_s();
    int ranks = t->eng->ranks;
    size_t ntok = (size_t)c->data.micro_batch * c->data.seq_len;
    long valid = 0;
    for (size_t k = 0; k < (size_t)c->data.grad_accum * ranks; k++) {
        if (src == QT_BATCH_LOADER && qt_train_docs_next(&t->docs, t->train, k * c->data.micro_batch, t->in + k * ntok,
                                                         t->tgt + k * ntok, err, errlen)) {
            t->fail = QT_TF_DATA; /* the step did not happen: the last one can be saved */
            qt_trainer_save_after_error(t, err, errlen);
            return -1;
        }
        if (src == QT_BATCH_LOADER) qt_train_dpo_ref_take(&t->dref, t->train, 0, k * c->data.micro_batch);
        valid += count_targets(t->tgt + k * ntok, ntok);
    }
    long rows = (long)c->data.grad_accum * ranks * c->data.micro_batch;
    float scale = qt_loss_scale(c->data.grad_accum, ranks, qt_train_dpo_units(c, rows, valid));
    t->step_targets = valid;
    t->pending = 1;
    for (size_t a = 0; a < (size_t)c->data.grad_accum; a++)
        if (qt_train_docs_apply(&t->docs, t->eng, a * ranks * c->data.micro_batch, src == QT_BATCH_LOADER, err, errlen) ||
            qt_train_dpo_ref_apply(&t->dref, t->eng, a * ranks * c->data.micro_batch, src == QT_BATCH_LOADER, err, errlen) ||
            qt_engine_micro_step(t->eng, t->in + a * ranks * ntok, t->tgt + a * ranks * ntok, scale, err, errlen))
            return failed(t, QT_TF_DEVICE, -1);
    return 0;
}

int qt_session_update(qt_trainer *t, qt_step_result *r, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    if (t->broken) return broken(t, err, errlen);
    if (!t->pending) return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "step %ld: update before backward", t->step + 1));
    float lr = t->lr_override >= 0 ? t->lr_override : qt_sched_lr(&t->sched, t->step), loss, gnorm;
    t->pending = 0;
    if (qt_engine_opt_step(t->eng, lr, t->step + 1, &loss, &gnorm, err, errlen)) return failed(t, QT_TF_DEVICE, -1);
    /* the weights first: a NaN/Inf weight of an earlier step (a GPU engine learns it a step late) is the cause */
    if (qt_trainer_check_weights(t, 0, err, errlen)) return failed(t, QT_TF_DIVERGED, -1);
    if (!isfinite(loss) || !isfinite(gnorm))
        return failed(t, QT_TF_DIVERGED, qt_errf(err, errlen, "step %ld: loss %g, grad norm %g: training diverged (lower "
                                                 "optim.lr?)", t->step + 1, loss, gnorm));
    t->step++;
    if (t->train) t->pos = qt_loader_get_pos(t->train);
    if (c->perf.deterministic && t->step == t->start + 1) qt_tuning_cache_save(t->eng, t->tuning_cache);
    double tn = now_s();
    *r = (qt_step_result){t->step, loss, gnorm, lr, t->tok_per_step / (tn - t->tstep), 0, 0, 0};
    int last = t->step == t->stop;
    if (t->step % c->log.every == 0 || last || t->step == t->start + 1) {
        double tok_s = (t->step - t->last_logged) * t->tok_per_step / (tn - t->tlast);
        double eta = (tn - t->t0) / (t->step - t->start) * (c->optim.steps - t->step);
        if (log_train(t, loss, gnorm, lr, tok_s, eta, err, errlen)) return failed(t, QT_TF_IO, qt_trainer_save_after_error(t, err, errlen));
        t->tlast = tn;
        t->last_logged = t->step;
    }
    if (t->eval && ((c->eval.every > 0 && t->step % c->eval.every == 0) || t->step == c->optim.steps)) {
        long targets = 0;
        int erc = run_eval(t, &r->eval_loss, &targets, err, errlen);
        if (erc < 0) return failed(t, QT_TF_DEVICE, -1);
        if (erc) return failed(t, QT_TF_DATA, qt_trainer_save_after_error(t, err, errlen));
        if (log_eval(t, r->eval_loss, targets, err, errlen)) return failed(t, QT_TF_IO, qt_trainer_save_after_error(t, err, errlen));
        r->evaluated = targets > 0;
        if (targets && isnan(t->st->first_eval)) t->st->first_eval = r->eval_loss;
        if (targets) t->st->last_eval = r->eval_loss;
    }
    if ((c->checkpoint.every > 0 && t->step % c->checkpoint.every == 0) || last) {
        if (qt_trainer_save_agreed(t, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
        r->saved = 1;
        /* the picks of shapes first met after step 1 (the evaluation's, the fp8 path's later ones) too */
        if (c->perf.deterministic) qt_tuning_cache_save(t->eng, t->tuning_cache);
    }
    return 0;
}

int qt_session_step(qt_trainer *t, qt_batch_source src, qt_step_result *r, char *err, size_t errlen) {
    if (qt_session_backward(t, src, err, errlen)) return -1;
    return qt_session_update(t, r, err, errlen);
}

int qt_session_eval(qt_trainer *t, float *loss, char *err, size_t errlen) {
    if (t->broken) return broken(t, err, errlen);
    if (!t->eval) return failed(t, QT_TF_DATA, qt_errf(err, errlen, "no eval data: set data.eval (and eval.every > 0)"));
    long targets = 0;
    int rc = run_eval(t, loss, &targets, err, errlen);
    if (rc == 0 && targets == 0) *loss = NAN; /* no unmasked target: no loss */
    return rc ? failed(t, rc < 0 ? QT_TF_DEVICE : QT_TF_DATA, -1) : 0;
}

int qt_session_save(qt_trainer *t, char *path, size_t cap, char *err, size_t errlen) {
    if (t->broken) return broken(t, err, errlen);
    if (!t->ck.writer) return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "an export-only session cannot save"));
    if (t->pending) return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "step %ld: backward ran, update first", t->step + 1));
    if ((t->step > t->ck.saved_step && qt_trainer_save(t, err, errlen)) || qt_trainer_ckpt_finish(t, 0, err, errlen))
        return failed(t, QT_TF_CHECKPOINT, -1);
    snprintf(path, cap, "%s/ckpt_%08ld.qtc", t->cfg->checkpoint.dir, t->step);
    return 0;
}

/* What the run will need later, checked before the (long) engine setup: log.file created (fresh runs)
 * and locked, checkpoint.dir created, writable and locked, not another run's (fresh runs). */
static int check_run_needs(qt_trainer *t, const qt_train_opts *o, char *err, size_t errlen) {
    /* the log first: it makes the run.dir folder, which a refused start then removes with the log */
    if (qt_train_log_open(&t->log, t->cfg, o->resume != NULL, err, errlen))
        return failed(t, QT_TF_IO, -1);
    if (qt_rundir_open(&t->dir, t->cfg->checkpoint.dir, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
    if (!o->resume && qt_rundir_identity(&t->dir, t->cfg, 0, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
    return 0;
}

/* From a resumed checkpoint on: refuses a run with nothing left to train, then records the run. */
static int begin_training(qt_trainer *t, const qt_train_opts *o, char *err, size_t errlen) {
    const qt_config *c = t->cfg;
    if (o->resume && t->step >= t->stop)
        return failed(t, QT_TF_CHECKPOINT, qt_errf(err, errlen, "--resume: the checkpoint is at step %ld and the run ends at step %ld (%s): nothing "
                       "to train; raise optim.steps (e.g. --set optim.steps=%ld)", t->step, t->stop,
                       t->stop == c->optim.steps ? "optim.steps" : "--stop-after", t->step + (c->optim.steps > 0 ? c->optim.steps : 1)));
    if (t->follower) {
        printf("qtrain: node %d of %d: node 0 keeps the run directory, the log and the checkpoints (%s)\n",
               t->nodes->node, t->nodes->nodes, c->checkpoint.dir);
    } else {
        if (o->resume && qt_rundir_identity(&t->dir, c, 1, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
        printf("qtrain: run %s, checkpoints in %s\n", t->dir.run_id, c->checkpoint.dir);
        if (qt_train_log_config(&t->log, c, t->dir.run_id, o->resume != NULL, err, errlen)) return failed(t, QT_TF_IO, -1);
        if (qt_trainer_ckpt_init(t, err, errlen)) return failed(t, QT_TF_DEVICE, -1);
    }
    t->start = t->last_logged = t->step;
    t->t0 = t->tlast = now_s();
    return 0;
}

/* Set when a stop request ended a start-up (qt_train_run then returns QT_TRAIN_STOPPED). */
static atomic_int g_stopped_at_start;

/* A SIGINT or SIGTERM during start-up ends it between its stages: nothing is trained, nothing to save.
 * -1 with err then, else 0. (A library caller's qt_train_request_stop is for a running loop.) */
static int stopped_at_start(qt_trainer *t, char *err, size_t errlen) {
    int sig = atomic_load(&g_stop);
    if (sig <= 0) return 0;
    atomic_store(&g_stopped_at_start, 1);
    return failed(t, QT_TF_ARGUMENT, qt_errf(err, errlen, "stopped by %s during start-up: nothing trained, nothing saved",
                                             sig == SIGINT ? "SIGINT" : "SIGTERM"));
}

/* The model, the loaders and the engine of an opened session. 0 or -1 with err and t->fail. */
static int build(qt_trainer *t, const qt_train_opts *o, int data_optional, char *err, size_t errlen) {
    const qt_config *cfg = t->cfg;
    int training = !o->export_only;
    if (cfg->data.tokenizer[0] && qt_hf_check_tokenizer(cfg->data.tokenizer, err, errlen)) return failed(t, QT_TF_CONFIG, -1);
    if (stopped_at_start(t, err, errlen)) return -1;
    if (qt_model_layout(cfg, &t->layout, &t->wsrc, err, errlen)) return failed(t, QT_TF_CONFIG, -1);
    /* an export needs no data; an embedder may give every batch itself (data.train "") */
    if (training && (cfg->data.train[0] || !data_optional) && open_loaders(t, &t->layout, err, errlen))
        return failed(t, QT_TF_DATA, -1);
    /* the run's folders only once the config and the data are found good: a refused start makes none */
    if (stopped_at_start(t, err, errlen) || (training && !t->follower && check_run_needs(t, o, err, errlen))) return -1;
    t->eng = qt_engine_create_nodes(&t->layout, cfg, &t->wsrc, t->nodes, err, errlen);
    if (!t->eng) return failed(t, QT_TF_DEVICE, -1);
    if (stopped_at_start(t, err, errlen)) return -1;
    /* a step's micro-batches: [grad_accum][ranks][micro_batch * seq_len], read before the step runs */
    size_t ntok = (size_t)cfg->data.micro_batch * cfg->data.seq_len * t->eng->ranks * cfg->data.grad_accum;
    t->tok_per_step = (double)ntok;
    t->in = malloc(ntok * sizeof(int32_t));
    t->tgt = malloc(ntok * sizeof(int32_t));
    if (!t->in || !t->tgt) return failed(t, QT_TF_INTERNAL, qt_errf(err, errlen, "out of host memory for %zu tokens", ntok));
    if (training && qt_train_docs_init(&t->docs, cfg, t->train, t->eng, ntok / cfg->data.seq_len, err, errlen))
        return failed(t, QT_TF_CONFIG, -1);
    /* before a resume loads the checkpoint's weights: the first pass runs the initial model */
    if (training && qt_train_dpo_ref_init(&t->dref, cfg, &t->wsrc, t->train, t->eval, t->eng, &t->docs,
                                          ntok / cfg->data.seq_len, err, errlen))
        return failed(t, QT_TF_DATA, -1);
    const qt_layout *L = &t->layout;
    printf("qtrain: %s | %zu parameters | %d layers, hidden %d, heads %d/%d, vocab %d | %s | %.2f GFLOP/token\n",
           cfg->path, L->n_params, L->cfg.num_layers, L->cfg.hidden_size, L->cfg.num_heads, L->cfg.num_kv_heads,
           L->cfg.vocab_size, t->eng->ops->name, qt_model_flops_per_token(&L->cfg, cfg->data.seq_len) * 1e-9);
    if (t->eng->ops->print_memory) t->eng->ops->print_memory(t->eng);
    if (!(t->tuning_cache = calloc(1, QT_TUNING_PATH_MAX)))
        return failed(t, QT_TF_INTERNAL, qt_errf(err, errlen, "out of host memory"));
    if (cfg->perf.deterministic && qt_tuning_cache_path(cfg->perf.tuning_cache, o->home_dir, t->tuning_cache, QT_TUNING_PATH_MAX))
        qt_tuning_cache_load(t->eng, t->tuning_cache); /* a checkpoint's picks replace them */
    if (o->resume && qt_trainer_load(t, o->resume, o->allow_changed, err, errlen)) return failed(t, QT_TF_CHECKPOINT, -1);
    return training ? begin_training(t, o, err, errlen) : 0;
}

static qt_trainer *session_open(const qt_config *cfg, const qt_train_opts *o, const qt_nodes *nodes, int data_optional,
                                qt_train_stats *st, qt_train_fail *fail, char *err, size_t errlen);

qt_trainer *qt_session_open(const qt_config *cfg, const qt_train_opts *o, int data_optional, qt_train_stats *st,
                            qt_train_fail *fail, char *err, size_t errlen) {
    return session_open(cfg, o, NULL, data_optional, st, fail, err, errlen);
}

/* qt_session_open for one node of a run across nodes (nodes NULL: one machine). */
static qt_trainer *session_open(const qt_config *cfg, const qt_train_opts *o, const qt_nodes *nodes, int data_optional,
                                qt_train_stats *st, qt_train_fail *fail, char *err, size_t errlen) {
    qt_trainer *t = calloc(1, sizeof *t);
    *fail = QT_TF_INTERNAL;
    if (!t) {
        qt_errf(err, errlen, "out of host memory");
        return NULL;
    }
    *t = (qt_trainer){.cfg = cfg, .dir = {.lock_fd = -1, .dir_fd = -1}, .log = {.fd = -1}, .st = st, .ck = {.saved_step = -1},
                      .lr_override = -1, .nodes = nodes, .follower = qt_train_nodes_follower(nodes)};
    *st = (qt_train_stats){0, NAN, NAN, 0, 0, 0, 0, 0};
    qt_rng_seed(&t->rng, cfg->seed);
    t->sched = (qt_sched){cfg->optim.schedule, cfg->optim.lr, cfg->optim.final_lr_frac, cfg->optim.warmup,
                          cfg->optim.cooldown, cfg->optim.steps};
    t->stop = o->stop_after >= 0 && o->stop_after < cfg->optim.steps ? o->stop_after : cfg->optim.steps;
    if (build(t, o, data_optional, err, errlen)) {
        *fail = t->fail;
        qt_session_close(t, -1, err, errlen);
        return NULL;
    }
    *fail = QT_TF_NONE;
    return t;
}

int qt_session_close(qt_trainer *t, int rc, char *err, size_t errlen) {
    if (!t) return rc;
    if (t->ck.writer && qt_trainer_ckpt_finish(t, rc, err, errlen)) rc = -1;
    t->st->steps_done = t->step;
    qt_trainer_ckpt_free(t);
    int discard = rc < 0 && t->ck.saved_step < 0; /* a run that failed before saving leaves nothing */
    qt_rundir_close(&t->dir, discard);
    if (qt_train_log_close(&t->log, discard, rc ? NULL : err, rc ? 0 : errlen) && rc == 0) rc = -1;
    qt_engine_free(t->eng);
    if (t->train) qt_loader_free(t->train);
    if (t->eval) qt_loader_free(t->eval);
    free(t->in);
    free(t->tgt);
    qt_train_docs_free(&t->docs);
    qt_train_dpo_ref_free(&t->dref);
    free(t->tuning_cache);
    if (t->layout.tensors) qt_layout_free(&t->layout);
    free(t);
    return rc;
}

int qt_train_run(const qt_config *cfg, const qt_train_opts *opts, qt_train_stats *st, char *err, size_t errlen) {
    return qt_train_run_nodes(cfg, opts, NULL, st, err, errlen);
}

int qt_train_run_nodes(const qt_config *cfg, const qt_train_opts *opts, const qt_nodes *nodes, qt_train_stats *st,
                       char *err, size_t errlen) {
    qt_train_opts dflt = {NULL, -1, 0, NULL, NULL, NULL};
    qt_train_stats dst;
    const qt_train_opts *o = opts ? opts : &dflt;
    if (!st) st = &dst;
    qt_train_fail fail;
    qt_trainer *t = session_open(cfg, o, nodes, 0, st, &fail, err, errlen);
    if (!t) {
        atomic_store(&g_stop, 0);
        if (!atomic_exchange(&g_stopped_at_start, 0)) return -1;
        printf("qtrain: %s\n", err);
        fflush(stdout);
        return QT_TRAIN_STOPPED;
    }
    int rc = 0;
    if (!o->export_only) {
        double t0 = now_s();
        int stop = 0;
        while (t->step < t->stop && !(stop = qt_train_nodes_stop(t, atomic_load(&g_stop), err, errlen))) {
            qt_step_result r;
            if (qt_session_step(t, QT_BATCH_LOADER, &r, err, errlen)) {
                rc = -1;
                break;
            }
            if (o->losses) o->losses[r.step - 1] = r.loss;
        }
        double dt = now_s() - t0;
        st->tokens_per_s = dt > 0 ? (t->step - t->start) * t->tok_per_step / dt : 0;
        /* a request that comes after the last step lets the run finish (and export) */
        if (stop < 0) rc = -1;
        if (rc == 0 && t->step < t->stop) rc = qt_trainer_stop(t, atomic_load(&g_stop), err, errlen);
        if (t->ck.writer && qt_trainer_ckpt_finish(t, rc, err, errlen)) rc = -1;
    }
    if (rc == 0 && (t->step == cfg->optim.steps || o->export_only) && !t->follower) { /* node 0 exports */
        char dir[QT_PATH_MAX + 16];
        qt_session_export_dir(cfg, dir, sizeof dir);
        rc = qt_session_export(t, dir, cfg->export.bf16, err, errlen);
    } else if (rc == 0 && (t->step == cfg->optim.steps || o->export_only) && t->eng->plan->parallel.world_pieces &&
               qt_engine_get_weights(t->eng, NULL, err, errlen)) { /* ZeRO over the nodes: the weights cross to node 0 */
        rc = -1;
    }
    rc = qt_train_nodes_finish(t, rc, err, errlen); /* every node waits for node 0's last write and export */
    rc = qt_session_close(t, rc, err, errlen);
    atomic_store(&g_stop, 0);
    return rc;
}
