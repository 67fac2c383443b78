/* train_ckpt.c — the trainer's checkpoints: snapshot + background write, refusal of non-finite
 * state, stop and error saves, resume with fallback and identity checks (qt_train_ckpt.h). */
#include "qt_train_ckpt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_ckpt_state.h"
#include "qt_dtype.h"
#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_planner.h"
#include "qt_test_hooks.h"
#include "qt_train_nodes.h"

#define CFG_CAP QT_CKPT_TEXT_MAX

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

void qt_trainer_tensor_name(const qt_layout *L, size_t i, char *buf, size_t cap) {
    for (int k = 0; k < L->n_tensors; k++) {
        const qt_tensor *tt = &L->tensors[k];
        if (i >= tt->offset && i < tt->offset + tt->numel) {
            snprintf(buf, cap, "%s[%zu]", tt->name, i - tt->offset);
            return;
        }
    }
    snprintf(buf, cap, "padding element %zu", qt_layout_compact(L, i));
}

static void ckpt_path(const qt_trainer *t, long step, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/ckpt_%08ld.qtc", t->cfg->checkpoint.dir, step);
}

void qt_trainer_newest(const qt_trainer *t, char *buf, size_t cap) {
    char p[QT_PATH_MAX + 32];
    long *steps = NULL;
    int n = qt_ckpt_list(t->cfg->checkpoint.dir, &steps);
    if (n > 0) {
        ckpt_path(t, steps[0], p, sizeof p);
        snprintf(buf, cap, "the newest checkpoint, %s, is kept", p);
    } else snprintf(buf, cap, "no checkpoint was written");
    free(steps);
}

int qt_trainer_check_weights(qt_trainer *t, int settle, char *err, size_t errlen) {
    long bad, step;
    if (qt_engine_nonfinite_weight(t->eng, settle, &bad, &step, err, errlen)) return -1;
    if (bad < 0) return 0;
    char name[128], newest[QT_PATH_MAX + 32];
    qt_trainer_tensor_name(t->eng->L, (size_t)bad, name, sizeof name);
    qt_trainer_newest(t, newest, sizeof newest);
    return qt_errf(err, errlen, "step %ld: %s is NaN/Inf after the update: training diverged (lower optim.lr?); "
                   "nothing saved, %s", step, name, newest);
}

/* The first index in [lo, hi) whose exponent bits are all set (NaN/Inf; `exp` the dtype's exponent
 * mask), else SIZE_MAX: one test per 4096 elements, so the inner loops vectorize. */
#define FIRST_NONFINITE(name, T)                                                                   \
    static size_t name(const T *u, size_t lo, size_t hi, T exp) {                                  \
        for (size_t i = lo; i < hi; i += 4096) {                                                   \
            size_t e = i + 4096 < hi ? i + 4096 : hi;                                              \
            unsigned any = 0;                                                                      \
            for (size_t j = i; j < e; j++) any |= (u[j] & exp) == exp;                             \
            for (size_t j = i; any && j < e; j++)                                                  \
                if ((u[j] & exp) == exp) return j;                                                 \
        }                                                                                          \
        return SIZE_MAX;                                                                           \
    }
FIRST_NONFINITE(first_nonfinite16, uint16_t)
FIRST_NONFINITE(first_nonfinite32, uint32_t)

/* Runs on the writer thread: reads only the layout, saved_step and the blob's bytes [lo, hi) (a widened
 * blob's bf16 values lo / 4 .. hi / 4). */
int qt_trainer_check_finite(const qt_ckpt_item *it, size_t lo, size_t hi, void *ctx, char *err, size_t errlen) {
    const qt_trainer *t = ctx;
    const qt_layout *L = t->eng->L;
    size_t n = L->compact_numel, bad = (size_t)-1; /* the items hold the compact layout (qt_engine_state_items) */
    int wide = (it->flags & QT_CKPT_WIDEN_BF16) && it->bytes == n * 4, f32 = !wide && it->dtype == QT_DT_F32 && it->bytes == n * 4;
    size_t es = wide || (it->dtype == QT_DT_BF16 && it->bytes == n * 2) ? 2 : f32 ? 4 : 0; /* bytes per value read */
    if (!es) return 0; /* not a weight array */
    size_t fe = wide ? 4 : es; /* bytes per value in the file */
    for (size_t e = lo / fe, run; e < hi / fe && bad == (size_t)-1; e += run / es) { /* run by run */
        const void *p = qt_ckpt_item_at(it, e * es, &run);
        if (run / es > hi / fe - e) run = (hi / fe - e) * es;
        size_t j = es == 4 ? first_nonfinite32(p, 0, run / 4, 0x7f800000u) : first_nonfinite16(p, 0, run / 2, 0x7f80u);
        if (j != SIZE_MAX) bad = e + j;
    }
    if (bad == (size_t)-1) return 0;
    char name[128];
    qt_trainer_tensor_name(L, qt_layout_flat(L, bad), name, sizeof name);
    return qt_errf(err, errlen, "checkpoint of step %ld refused: %s holds NaN/Inf in %s (the run diverged)",
                   t->ck.saved_step, it->name, name);
}

/* The engine's wait before its optimizer changes offloaded state below element hi (set_state_guard). */
static void guard_wait(void *ctx, size_t hi) {
    qt_trainer *t = ctx;
    if (!t->ck.writer) return;
#ifdef QT_MUTANTS
    if (qt_mutant_on(QT_MUT_CKPT_UNGUARDED)) return;
#endif
    t->ck.guard_s += qt_ckpt_writer_wait_mark(t->ck.writer, qt_layout_compact(t->eng->L, hi)); /* the file's element */
}

/* The engine's live items (written in place), none when it has no such state. */
static qt_ckpt_live live_items(qt_trainer *t) {
    qt_ckpt_live live = {0};
    if (t->eng->ops->state_live) t->eng->ops->state_live(t->eng, &live);
    if (live.elems == t->eng->L->numel) live.elems = t->eng->L->compact_numel; /* items of the compact layout */
    return live;
}

qt_ckpt_offload qt_trainer_offload_mode(qt_ckpt_offload want, size_t bytes, size_t avail) {
    if (want != QT_CKPT_OFFLOAD_AUTO) return want;
    size_t need = bytes + bytes / 8 + ((size_t)1 << 30); /* margin: the rest of the run's host allocations */
    return need <= avail ? QT_CKPT_OFFLOAD_COPY : QT_CKPT_OFFLOAD_IN_PLACE;
}

/* Chooses how the engine's offloaded state (live: its items, `bytes` of them) is checkpointed
 * (checkpoint.offloaded), tells the engine, and says why in buf. Returns 1 for a copy. */
static int choose_offload(qt_trainer *t, size_t bytes, char *buf, size_t cap) {
    static const char *const names[] = {"auto", "copy", "in_place"};
    qt_ckpt_offload want = t->cfg->checkpoint.offloaded;
    /* the run's host budget (memory.host_limit_gib, else MemAvailable), as the planner's; the budget left
     * after the planned host rows would be closer */
    char what[96];
    size_t avail = want == QT_CKPT_OFFLOAD_AUTO ? qt_plan_host_limit(t->cfg, what, sizeof what) : 0;
    int copy = t->eng->ops->set_state_copy && qt_trainer_offload_mode(want, bytes, avail) == QT_CKPT_OFFLOAD_COPY;
    int n = snprintf(buf, cap, "; offloaded optimizer state (%.1f MiB) %s (checkpoint.offloaded: %s", bytes / 1048576.0,
                     copy ? "copied at each checkpoint" : "written where it lives, the optimizer waiting for the write",
                     names[want]);
    if (want == QT_CKPT_OFFLOAD_AUTO && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - n, ", a host budget of %.1f GiB: %s)", avail / 1073741824.0, what);
    else if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - n, ")");
    if (copy) t->eng->ops->set_state_copy(t->eng, 1);
    return copy;
}

int qt_trainer_ckpt_init(qt_trainer *t, char *err, size_t errlen) {
    t->ck.cfgtext = malloc(CFG_CAP);
    t->ck.writer = qt_ckpt_writer_create(qt_trainer_check_finite, t);
    if (!t->ck.cfgtext || !t->ck.writer) return qt_errf(err, errlen, "out of host memory for the checkpoint writer");
    if (t->train) t->pos = qt_loader_get_pos(t->train); /* none: the embedder gives every batch */
    if (t->eng->plan->parallel.world_pieces) { /* a snapshot gathers every node's pieces: every node takes part, so
                                                * it is made at each save only (save_world) */
        printf("qtrain: checkpoint snapshot: made at each save, every node's pieces gathered on node 0 (ZeRO over "
               "the nodes)\n");
        return 0;
    }
    /* The engine's snapshot buffers (pinned host copies on a GPU) are made now, not at the first save:
     * that save then pauses training only for the copy, and a host that cannot hold them fails here,
     * not hours into the run. The first state_items makes all but those of an offloaded state; a
     * second one the offloaded state's when it is to be copied. */
    qt_ckpt_item items[24];
    double t0 = now_s();
    int n = qt_engine_state_items(t->eng, items, 16, err, errlen);
    if (n < 0) return -1;
    qt_ckpt_live live = live_items(t);
    size_t bytes = 0, offloaded = 0;
    for (int j = 0; j < live.n; j++) /* a widened item views another's blob: not a copy of its own */
        if (!(items[live.idx[j]].flags & QT_CKPT_WIDEN_BF16)) offloaded += items[live.idx[j]].bytes;
    char how[256] = "";
    if (live.n && choose_offload(t, offloaded, how, sizeof how)) {
        if ((n = qt_engine_state_items(t->eng, items, 16, err, errlen)) < 0) return -1;
        live = live_items(t);
    } else if (!live.n && t->eng->plan->optimizer.host && t->eng->ranks > 1) {
        snprintf(how, sizeof how, "; replicated data-parallel ranks: the offloaded optimizer state is copied "
                 "(checkpoint.offloaded applies to one GPU and ZeRO ranks)");
    }
    if (t->eng->ops->snapshot_bytes) { /* the engine's own buffers (a widened blob views another's) */
        bytes = t->eng->ops->snapshot_bytes(t->eng);
    } else { /* the trainer copies the engine's blobs at each save */
        for (int i = 0; i < n; i++) bytes += qt_ckpt_item_data_bytes(&items[i]);
        for (int j = 0; j < live.n; j++) bytes -= qt_ckpt_item_data_bytes(&items[live.idx[j]]);
    }
    t->st->ckpt_in_place = live.n > 0;
    t->st->ckpt_snapshot_bytes = bytes;
    printf("qtrain: checkpoint snapshot: %.1f MiB of host memory, made in %.2f s%s\n", bytes / 1048576.0, now_s() - t0, how);
    if (live.n && t->eng->ops->set_state_guard) t->eng->ops->set_state_guard(t->eng, guard_wait, t);
    return 0;
}

/* Waits for the write in flight (if any) and reports it. 0, or -1 with err when it failed. */
static int finish_write(qt_trainer *t, char *err, size_t errlen) {
    long step;
    double sec;
    char e2[2048];
    int rc = t->ck.writer ? qt_ckpt_writer_wait(t->ck.writer, &step, &sec, e2, sizeof e2) : 1;
    if (rc < 0) return qt_errf(err, errlen, "%s", e2);
    if (rc == 0) {
        char p[QT_PATH_MAX + 32];
        ckpt_path(t, step, p, sizeof p);
        printf("qtrain: saved %s (%.1f MiB, written in %.2f s beside training", p, t->ck.write_bytes / 1048576.0, sec);
        if (live_items(t).n) printf("; the optimizer waited %.3f s for the offloaded state", t->ck.guard_s);
        printf(")\n");
        fflush(stdout);
        if (t->ck.pause_s + t->ck.guard_s > t->st->ckpt_stall_max_s) t->st->ckpt_stall_max_s = t->ck.pause_s + t->ck.guard_s;
    }
    return 0;
}

int qt_trainer_poll_write(qt_trainer *t, char *err, size_t errlen) {
    if (!t->ck.writer || qt_ckpt_writer_running(t->ck.writer)) return 0;
    return finish_write(t, err, errlen);
}

/* Copies items[from, n) into t->ck.snap and points them there. */
static int snapshot(qt_trainer *t, qt_ckpt_item *items, int from, int n, char *err, size_t errlen) {
    size_t need = 0;
    for (int i = from; i < n; i++) need += align64(qt_ckpt_item_data_bytes(&items[i]));
    if (need > t->ck.snap_cap) {
        free(t->ck.snap);
        t->ck.snap_cap = 0;
        t->ck.snap = malloc(need);
        if (!t->ck.snap) return qt_errf(err, errlen, "out of host memory for a %.1f MiB checkpoint snapshot", need / 1048576.0);
        t->ck.snap_cap = need;
    }
    size_t off = 0;
    for (int i = from; i < n; i++) {
        size_t nb = qt_ckpt_item_data_bytes(&items[i]);
        qt_ckpt_item_read(&items[i], 0, nb, t->ck.snap + off);
        items[i].data = t->ck.snap + off;
        items[i].flags &= ~QT_CKPT_GATHERED;
        off += align64(nb);
    }
    return 0;
}

/* Before a snapshot: the write in flight done (*waited: the seconds that took) and the weights finite (never a
 * non-finite checkpoint). 0 or -1. */
static int save_ready(qt_trainer *t, double *waited, char *err, size_t errlen) {
    double t0 = now_s();
    if (finish_write(t, err, errlen)) return -1;
    *waited = now_s() - t0;
    return qt_trainer_check_weights(t, 1, err, errlen);
}

/* The snapshot of step t->step and its write started; t0 when the save began. */
static int save_items(qt_trainer *t, double t0, double waited, char *err, size_t errlen) {
    qt_ckpt_item items[32];
    int ne = qt_engine_state_items(t->eng, items, 16, err, errlen), n = ne;
    if (ne < 0) return -1;
    qt_ckpt_state cs = {t->step, t->rng, t->pos, t->eng->L->cfg, t->ck.cfgtext, qt_config_dump(t->cfg, t->ck.cfgtext, CFG_CAP),
                        (int64_t)t->cfg->data.grad_accum * t->eng->ranks};
    n += qt_ckpt_state_items(&cs, items + n); /* copied by snapshot() below */
    n += qt_train_dpo_ref_item(&t->dref, items + n);
    void *tuning = NULL; /* the autotuned picks: copied into the snapshot, so a temporary buffer */
    if (t->cfg->perf.deterministic && t->eng->ops->tuning_save) {
        size_t tb = t->eng->ops->tuning_save(t->eng, NULL, 0);
        if (!(tuning = malloc(tb))) return qt_errf(err, errlen, "out of host memory");
        t->eng->ops->tuning_save(t->eng, tuning, tb);
        items[n++] = (qt_ckpt_item){QT_CKPT_TUNING, -1, tuning, tb, 0};
    }
    int src = snapshot(t, items, t->eng->ops->state_is_snapshot ? ne : 0, n, err, errlen);
    free(tuning);
    if (src) return -1;
    t->ck.saved_step = t->step; /* read by qt_trainer_check_finite on the writer thread, which starts after this */
    t->ck.write_bytes = 0;
    for (int i = 0; i < n; i++) t->ck.write_bytes += items[i].bytes;
    qt_ckpt_live live = live_items(t);
    t->ck.guard_s = 0;
    if (qt_ckpt_writer_start_live(t->ck.writer, t->cfg->checkpoint.dir, t->step, t->cfg->checkpoint.keep, items, n, &live,
                                  err, errlen))
        return -1;
    if (qt_test_hooks_get()->ckpt_sync && finish_write(t, err, errlen)) return -1;
    double stall = t->ck.pause_s = now_s() - t0;
    t->st->ckpts++;
    if (stall > t->st->ckpt_stall_max_s) t->st->ckpt_stall_max_s = stall;
    printf("qtrain: checkpoint of step %ld: training paused %.3f s (%.3f s of it for the previous write), "
           "writing %.1f MiB in the background\n", t->step, stall, waited, t->ck.write_bytes / 1048576.0);
    fflush(stdout);
    char f[128], e2[512];
    snprintf(f, sizeof f, "\"stall_s\":%.6f,\"wait_s\":%.6f,\"bytes\":%zu", stall, waited, t->ck.write_bytes);
    /* a failing log is reported by the next train record or the close; the checkpoint is under way */
    qt_train_log_write(&t->log, "ckpt", t->step, t->step * t->tok_per_step, f, e2, sizeof e2);
    return 0;
}

int qt_trainer_save(qt_trainer *t, char *err, size_t errlen) {
    double t0 = now_s(), waited = 0;
    return save_ready(t, &waited, err, errlen) ? -1 : save_items(t, t0, waited, err, errlen);
}

/* Across nodes with ZeRO over the world (plan.parallel.world_pieces) the snapshot gathers every node's pieces
 * (engine_dp.c), so every node takes part in it: each checks its own pieces are finite, the nodes agree, then
 * every node snapshots and node 0 writes. */
static int save_world(qt_trainer *t, char *err, size_t errlen) {
    double t0 = now_s(), waited = 0;
    int rc = t->follower ? qt_trainer_check_weights(t, 1, err, errlen) : save_ready(t, &waited, err, errlen), failed = 0;
    if (qt_train_nodes_agree(t, rc != 0, &failed, err, errlen)) return -1;
    if (rc) return -1;
    if (failed)
        return qt_errf(err, errlen, "a node could not checkpoint step %ld (its message is on its output): every node stops",
                       t->step);
    if (!t->follower) return save_items(t, t0, waited, err, errlen);
    qt_ckpt_item items[16];
    return qt_engine_state_items(t->eng, items, 16, err, errlen) < 0 ? -1 : 0;
}

int qt_trainer_save_agreed(qt_trainer *t, char *err, size_t errlen) {
    if (!t->eng->ops->nodes_count) return qt_trainer_save(t, err, errlen);
    int rc = t->eng->plan->parallel.world_pieces ? save_world(t, err, errlen) : t->follower ? 0 : qt_trainer_save(t, err, errlen);
    int failed = 0;
    if (qt_train_nodes_agree(t, rc != 0, &failed, err, errlen)) return -1;
    if (rc == 0 && failed)
        return qt_errf(err, errlen, "node 0 failed to start the checkpoint of step %ld (its message is on its output): "
                       "every node stops", t->step);
    if (rc == 0 && t->follower) {
        t->ck.saved_step = t->step;
        printf("qtrain: checkpoint of step %ld: node 0 writes it\n", t->step);
        fflush(stdout);
    }
    return rc;
}

/* Saves the last completed step unless it is saved already or no step ran (a step-0 checkpoint holds
 * only the initial weights, and would make the directory refuse a fresh run), and waits. 0 or -1. */
static int save_now(qt_trainer *t, char *err, size_t errlen) {
    if (t->step > t->ck.saved_step && t->step > 0 && qt_trainer_save_agreed(t, err, errlen)) return -1;
    return finish_write(t, err, errlen);
}

int qt_trainer_save_after_error(qt_trainer *t, char *err, size_t errlen) {
    char e2[2048], p[QT_PATH_MAX + 32];
    size_t n = strlen(err);
    if (!t->ck.writer && !t->follower) return -1; /* a follower takes part in node 0's save */
    if (save_now(t, e2, sizeof e2)) {
        snprintf(err + n, errlen > n ? errlen - n : 0, " (and saving step %ld failed: %s)", t->step, e2);
        return -1;
    }
    if (t->ck.saved_step >= 0) {
        ckpt_path(t, t->ck.saved_step, p, sizeof p);
        snprintf(err + n, errlen > n ? errlen - n : 0, "\nqtrain: steps up to %ld are saved in %s: fix the problem and "
                 "continue with --resume", t->ck.saved_step, p);
    }
    return -1;
}

int qt_trainer_stop(qt_trainer *t, int sig, char *err, size_t errlen) {
    if (save_now(t, err, errlen)) return -1;
    char why[32], p[QT_PATH_MAX + 32];
    snprintf(why, sizeof why, "%s", sig == 2 ? "SIGINT" : sig == 15 ? "SIGTERM" : sig > 0 ? "a signal" : "request");
    if (t->ck.saved_step < 0) {
        printf("qtrain: stopped by %s before the first step: nothing to save\n", why);
    } else {
        ckpt_path(t, t->ck.saved_step, p, sizeof p);
        printf("qtrain: stopped by %s after step %ld/%d; checkpoint %s; continue with --resume\n", why, t->step,
               t->cfg->optim.steps, p);
    }
    fflush(stdout);
    return QT_TRAIN_STOPPED;
}

int qt_trainer_ckpt_finish(qt_trainer *t, int rc, char *err, size_t errlen) {
    char e2[2048];
    if (finish_write(t, e2, sizeof e2) == 0) return 0;
    if (rc < 0) fprintf(stderr, "qtrain: %s\n", e2); /* err already holds the first error */
    else snprintf(err, errlen, "%s", e2);
    return -1;
}

void qt_trainer_ckpt_free(qt_trainer *t) {
    qt_ckpt_writer_free(t->ck.writer); /* waits for a write still in flight */
    t->ck.writer = NULL;
    free(t->ck.snap);
    free(t->ck.cfgtext);
    t->ck.snap = NULL;
    t->ck.cfgtext = NULL;
}

/* Opens the newest valid checkpoint in checkpoint.dir; damaged newer ones are named in a warning and
 * (when this run holds the directory's lock) moved aside to <name>.bad. A file that cannot be read
 * (permissions, too many open files, an I/O error, not a regular file) may be intact: it stops the
 * resume, naming it, and is left where it is. */
static qt_ckpt *open_latest(qt_trainer *t, char *path, size_t cap, char *err, size_t errlen) {
    long *steps = NULL;
    int n = qt_ckpt_list(t->cfg->checkpoint.dir, &steps);
    qt_ckpt *ck = NULL;
    for (int i = 0; i < n && !ck; i++) {
        char e2[2048];
        qt_ckpt_status why;
        ckpt_path(t, steps[i], path, cap);
        ck = qt_ckpt_load(path, &why, e2, sizeof e2);
        if (ck) break;
        if (why != QT_CKPT_CORRUPT) {
            qt_errf(err, errlen, "--resume: %s\nqtrain: the checkpoint is not judged damaged and older ones are not "
                    "tried: make it readable (or move it out of %s) and resume again", e2, t->cfg->checkpoint.dir);
            free(steps);
            return NULL;
        }
        char bad[QT_PATH_MAX + 64];
        snprintf(bad, sizeof bad, "%s.bad", path);
        int moved = t->dir.lock_fd >= 0 && rename(path, bad) == 0;
        fprintf(stderr, "qtrain: warning: %s\nqtrain: warning: skipping %s%s%s; trying the checkpoint before it\n", e2,
                path, moved ? ", moved aside to " : "", moved ? bad : "");
    }
    if (!ck) {
        if (n == 0) qt_errf(err, errlen, "--resume: no checkpoint (ckpt_*.qtc) in %s", t->cfg->checkpoint.dir);
        else qt_errf(err, errlen, "--resume: none of the %d checkpoints in %s is valid (see the warnings)", n, t->cfg->checkpoint.dir);
    }
    free(steps);
    return ck;
}

/* The checkpoint's trainer blobs (qt_ckpt_state_read) into *cs, its loader position checked against
 * this run's data; training runs compare the identity keys of its config with ours (allow: the keys
 * that may differ) and set *data_moved. */
static int check_state(const qt_trainer *t, const qt_ckpt *ck, const char *path, const char *allow, qt_ckpt_state *cs,
                       int *data_moved, char *err, size_t errlen) {
    qt_config *old = malloc(sizeof *old);
    char e2[1024];
    *data_moved = 0;
    if (!old) return qt_errf(err, errlen, "out of host memory");
    int rc = qt_ckpt_state_read(ck, path, cs, old, err, errlen);
    if (!rc && memcmp(&cs->model, &t->eng->L->cfg, sizeof cs->model))
        rc = qt_errf(err, errlen, "%s: the checkpoint's model differs from the config's model", path);
    int64_t mb[2] = {cs->micro_batches, (int64_t)t->cfg->data.grad_accum * t->eng->ranks};
    if (!rc && t->train) rc = qt_rundir_check_resume(old, t->cfg, mb, allow, path, data_moved, err, errlen);
    if (!rc && t->train && !*data_moved && qt_loader_check_pos(t->train, cs->pos, e2, sizeof e2))
        rc = qt_errf(err, errlen, "%s: blob loader_pos: %s (did the data change since the checkpoint?)", path, e2);
    free(old);
    return rc;
}

/* The checkpoint's autotuned picks, when the run keeps them (perf.deterministic): the resumed run then
 * multiplies with the algorithms of the run it continues. Picks made on another GPU model or library
 * version cannot be reused: said, and this run times its own. */
static void load_tuning(qt_trainer *t, const qt_ckpt *ck, const char *path) {
    size_t nb = 0;
    const void *b = qt_ckpt_get(ck, QT_CKPT_TUNING, &nb, NULL);
    char e2[512];
    if (!b || !t->cfg->perf.deterministic || !t->eng->ops->tuning_load) return;
    if (t->eng->ops->tuning_load(t->eng, b, nb, e2, sizeof e2))
        printf("qtrain: %s: its matmul algorithm picks are not reused (%s): this run times its own, so its bits "
               "may differ from the run that wrote it\n", path, e2);
}

int qt_trainer_load(qt_trainer *t, const char *which, const char *allow, char *err, size_t errlen) {
    char path[QT_PATH_MAX + 64];
    qt_ckpt *ck;
    if (!strcmp(which, "latest")) {
        ck = open_latest(t, path, sizeof path, err, errlen);
    } else {
        snprintf(path, sizeof path, "%s", which);
        ck = qt_ckpt_open(path, err, errlen);
    }
    if (!ck) return -1;
    qt_ckpt_state cs;
    int rc = -1, data_moved = 0;
    if (check_state(t, ck, path, allow, &cs, &data_moved, err, errlen) == 0 &&
        qt_train_dpo_ref_check(&t->dref, ck, path, err, errlen) == 0 && qt_engine_load_state(t->eng, ck, err, errlen) == 0) {
        t->rng = cs.rng;
        if (t->train && !data_moved) qt_loader_set_pos(t->train, cs.pos);
        t->step = t->ck.saved_step = cs.step;
        load_tuning(t, ck, path);
        printf("qtrain: resumed from %s at step %ld%s\n", path, t->step,
               data_moved ? " (the data changed: reading it from its start)" : "");
        rc = 0;
    }
    qt_ckpt_close(ck);
    return rc;
}
