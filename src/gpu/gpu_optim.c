/* gpu_optim.c — AdamW plans per group, and the offloaded state's stream through the device slots.
 *
 * Offloaded, the state is cut into chunks at multiples of `chunk` state elements (so every
 * vector-aligned tensor stays aligned in its slot), each with its own AdamW plan whose state indices
 * are relative to the chunk's slot. The chunks go through a qt_chunk_pipe: the offloaded arrays of
 * master/m/v come up into a slot (those on the device are read and written in place at the chunk's
 * state), the caller's stream runs the plan, and the slot goes back down while the next chunks come up and
 * run. Weights and gradients in pinned host memory (memory.offload: [weights], [gradients]) ride along in
 * the same slots (the weights up and down, the gradients up): the copy engines move them at the link's rate
 * where a kernel reading them through the mapping gets ~16 GB/s with four GPUs at once. */
#include "qt_gpu_optim.h"

#include <cuda_runtime.h>
#include <stdlib.h>

#include "qt_chunk_pipe.h"
#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif


typedef struct {
    qt_adamw_plan *plan;
    size_t lo, hi, c0; /* state [lo, hi), in a slot that starts at state c0 (0 on the device) */
} opt_chunk;

/* The arrays a chunk may stream, in their order in a slot: the fp32 master, m, v, the bf16 weights and the
 * gradients (up only: AdamW reads them). */
enum { ARR_MASTER, ARR_M, ARR_V, ARR_W, ARR_G, NARR };
static const int arr_bit[NARR] = {QT_OPTIM_MASTER, QT_OPTIM_M, QT_OPTIM_V, QT_OPTIM_W, QT_OPTIM_G};

struct qt_gpu_optim {
    opt_chunk *chunk;  /* owned */
    int n_chunks, groups, *group_end; /* owned: chunks [group_end[k-1], group_end[k]) are group k's */
    size_t size;       /* state elements per chunk (a multiple of 4), offloaded */
    float *master;     /* borrowed: device, or pinned host when slots */
    void *m, *v;
    qt_dtype m_dt, v_dt;
    size_t es[NARR];   /* bytes per state element of each array (master: 0 without a master copy,
                        * precision.master_dtype bf16: AdamW updates w_bf16) */
    int flat;          /* every tensor's state index is its flat index (one GPU): weights and gradients
                        * indexed by flat index may stream too */
    char *slots;       /* borrowed device memory; NULL: the state is on the device */
    int host;          /* with slots: the arrays in host memory (QT_OPTIM_* bits), streamed */
    qt_chunk_pipe *pipe; /* owned, with slots: the chunks' way up and down */
    void (*guard)(void *ctx, size_t hi); /* before a chunk goes back down (qt_gpu_optim_set_guard) */
    void *guard_ctx;
};

static size_t round4(size_t chunk) { return (chunk + 3) / 4 * 4; }

/* Bytes per state element of array k (a master: 4). */
static size_t arr_es(int k, qt_dtype m_dt, qt_dtype v_dt, qt_dtype g_dt) {
    return k == ARR_MASTER ? 4 : k == ARR_W ? 2 : (size_t)qt_dtype_size(k == ARR_M ? m_dt : k == ARR_V ? v_dt : g_dt);
}

size_t qt_gpu_optim_slot_bytes(size_t chunk, int host_mask, qt_dtype m_dt, qt_dtype v_dt, qt_dtype g_dt) {
    size_t es = 0;
    for (int k = 0; k < NARR; k++) es += host_mask & arr_bit[k] ? arr_es(k, m_dt, v_dt, g_dt) : 0;
    return QT_CHUNK_PIPE_SLOTS * round4(chunk) * es;
}

/* The plan of t[j0..j1)'s elements whose state lies in [lo, hi), state indices counted from c0. */
static void add_chunk(qt_gpu_optim *o, const qt_adamw_tensor *t, int j0, int j1, size_t lo, size_t hi, size_t c0) {
    qt_adamw_tensor *p = malloc(sizeof *p * (size_t)(j1 - j0));
    QT_CHECK(p, "out of host memory");
    int n = 0;
    for (int j = j0; j < j1; j++) {
        size_t a = t[j].state > lo ? t[j].state : lo, e = t[j].state + t[j].numel < hi ? t[j].state + t[j].numel : hi;
        if (a < e) p[n++] = (qt_adamw_tensor){t[j].offset + (a - t[j].state), e - a, t[j].wd, a - c0, t[j].sr_shift};
    }
    if (n) o->chunk[o->n_chunks++] = (opt_chunk){qt_adamw_plan_create(p, n), lo, hi, c0};
    free(p);
}

static void add_group(qt_gpu_optim *o, const qt_adamw_tensor *t, int j0, int j1) {
    if (j0 < j1) {
        size_t lo = t[j0].state, hi = t[j1 - 1].state + t[j1 - 1].numel;
        if (!o->slots) add_chunk(o, t, j0, j1, lo, hi, 0);
        else
            for (size_t c = lo / o->size * o->size; c < hi; c += o->size)
                add_chunk(o, t, j0, j1, c > lo ? c : lo, c + o->size < hi ? c + o->size : hi, c);
    }
    o->group_end[o->groups++] = o->n_chunks;
}

qt_gpu_optim *qt_gpu_optim_create(const qt_adamw_tensor *t, int n, const int *start, int groups, float *master,
                                  void *m, qt_dtype m_dt, void *v, qt_dtype v_dt, qt_dtype g_dt, void *slots, size_t chunk,
                                  int host_mask) {
    qt_gpu_optim *o = calloc(1, sizeof *o);
    QT_CHECK(o, "out of host memory");
    int state = master ? QT_OPTIM_ALL : QT_OPTIM_M | QT_OPTIM_V;
    *o = (qt_gpu_optim){.master = master, .m = m, .v = v, .m_dt = m_dt, .v_dt = v_dt, .slots = slots,
                        .host = slots ? host_mask & (state | QT_OPTIM_W | QT_OPTIM_G) : 0, .size = round4(chunk),
                        .flat = 1};
    for (int k = 0; k < NARR; k++) o->es[k] = k == ARR_MASTER && !master ? 0 : arr_es(k, m_dt, v_dt, g_dt);
    for (int j = 0; j < n; j++) o->flat &= t[j].state == t[j].offset;
    QT_CHECK(!slots || o->host & state, "offloaded adamw: no state array named offloaded");
    QT_CHECK(!slots || o->size > 0, "offloaded adamw: chunks of 0 elements");
    /* a chunk per group on the device; offloaded, one per `size` of state + 2 per group */
    size_t cap = (size_t)groups * 2 + (slots && n ? (t[n - 1].state + t[n - 1].numel - t[0].state) / o->size : 0);
    o->chunk = calloc(cap, sizeof *o->chunk);
    o->group_end = calloc((size_t)groups, sizeof *o->group_end);
    QT_CHECK(o->chunk && o->group_end, "out of host memory");
    QT_CHECK(groups >= 1 && start[0] == 0, "adamw: %d groups, the first at entry %d", groups, groups ? start[0] : -1);
    for (int k = 0; k < groups; k++) {
        int end = k + 1 < groups ? start[k + 1] : n;
        QT_CHECK(start[k] <= end && end <= n, "adamw group %d: entries %d..%d of %d", k, start[k], end, n);
        add_group(o, t, start[k], end);
    }
    if (slots) {
        size_t es = 0;
        for (int k = 0; k < NARR; k++) es += o->host & arr_bit[k] ? o->es[k] : 0;
        o->pipe = qt_chunk_pipe_create(slots, o->size * es);
    }
    return o;
}

void qt_gpu_optim_free(qt_gpu_optim *o) {
    if (!o) return;
    for (int c = 0; c < o->n_chunks; c++) qt_adamw_plan_free(o->chunk[c].plan);
    qt_chunk_pipe_free(o->pipe);
    free(o->chunk);
    free(o->group_end);
    free(o);
}

int qt_gpu_optim_groups(const qt_gpu_optim *o) { return o->groups; }

void qt_gpu_optim_set_guard(qt_gpu_optim *o, void (*wait)(void *ctx, size_t hi), void *ctx) {
    o->guard = wait;
    o->guard_ctx = ctx;
}

/* The streamed arrays in the slot at base (each holding state [c0, c0 + size) of its chunk, back to back);
 * NULL for an array not streamed (on the device, or no master). */
static void slot_arrays(const qt_gpu_optim *o, char *base, char *p[NARR]) {
    for (int k = 0; k < NARR; k++) {
        int on = o->host & arr_bit[k] && o->es[k];
        p[k] = on ? base : NULL;
        base += on ? o->size * o->es[k] : 0;
    }
}

/* Chunk ch between the host arrays and the slot's arrays dev on stream s: up, every streamed array; down, all
 * but the gradients. */
static void move(const qt_gpu_optim *o, const opt_chunk *ch, char *const dev[NARR], void *const host[NARR], int up,
                 cudaStream_t s) {
    for (int k = 0; k < NARR; k++) {
        if (!dev[k] || (!up && k == ARR_G)) continue;
#ifdef QT_MUTANTS
        if ((qt_mutant_on(QT_MUT_OPT_W_NOT_DOWN) && !up && k == ARR_W) || (qt_mutant_on(QT_MUT_OPT_G_NOT_UP) && k == ARR_G))
            continue;
#endif
        char *h = (char *)host[k] + ch->lo * o->es[k], *d = dev[k] + (ch->lo - ch->c0) * o->es[k];
        size_t bytes = (ch->hi - ch->lo) * o->es[k];
        QT_CUDA(cudaMemcpyAsync(up ? d : h, up ? h : d, bytes, up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    }
}

void qt_gpu_optim_step(qt_gpu_optim *o, int k, void *w_bf16, const void *g, qt_dtype g_dt, const float *grad_scale,
                       const qt_adamw_args *a, cudaStream_t s) {
    QT_CHECK(k >= 0 && k < o->groups, "adamw group %d of %d", k, o->groups);
    QT_CHECK(!(o->host & QT_OPTIM_G) || (size_t)qt_dtype_size(g_dt) == o->es[ARR_G], "adamw: gradients of %s, slots made for %zu bytes",
             qt_dtype_name(g_dt), o->es[ARR_G]);
    QT_CHECK(!(o->host & QT_OPTIM_W) || a->w_at_state || o->flat, "adamw: streamed weights indexed by flat index, state is not");
    QT_CHECK(!(o->host & QT_OPTIM_G) || a->g_at_state || o->flat, "adamw: streamed gradients indexed by flat index, state is not");
    void *const host[NARR] = {o->master, o->m, o->v, w_bf16, (void *)g};
    /* the copies up of streamed weights / gradients follow what s waited for (others write them: the
     * backward's adds into the host shard, a load) */
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_OPT_UP_NO_STREAM_WAIT);
#endif
    if (o->slots && o->host & (QT_OPTIM_W | QT_OPTIM_G) && !no_wait) qt_chunk_pipe_begin(o->pipe, s);
    for (int c = k ? o->group_end[k - 1] : 0; c < o->group_end[k]; c++) {
        const opt_chunk *ch = &o->chunk[c];
        if (!o->slots) { /* the state where it is: the device, or host memory read in place (zero copy) */
            if (o->guard) o->guard(o->guard_ctx, ch->hi); /* a checkpoint reads the host state below hi */
            qt_adamw_step(ch->plan, w_bf16, o->master, g, g_dt, o->m, o->m_dt, o->v, o->v_dt, grad_scale, NULL, a, s);
            continue;
        }
        cudaStream_t up;
        char *p[NARR];
        slot_arrays(o, qt_chunk_pipe_next(o->pipe, &up), p);
        move(o, ch, p, host, 1, up);
        qt_chunk_pipe_ready(o->pipe, s);
        /* the arrays on the device: at the chunk's state (its plan counts state from c0); a gradient shard
         * (g_at_state) and a weight shard (w_at_state) are indexed like the state; streamed ones sit in the
         * slot like m and v (with one GPU's flat arrays state = flat index, so the slot is the same view) */
        qt_adamw_args b = *a;
        b.w_at_state |= p[ARR_W] != NULL;
        b.g_at_state |= p[ARR_G] != NULL;
        float *mp = !o->master ? NULL : p[ARR_MASTER] ? (float *)p[ARR_MASTER] : o->master + ch->c0;
        void *mm = p[ARR_M] ? p[ARR_M] : (char *)o->m + ch->c0 * o->es[ARR_M];
        void *vv = p[ARR_V] ? p[ARR_V] : (char *)o->v + ch->c0 * o->es[ARR_V];
        void *ww = p[ARR_W] ? p[ARR_W] : a->w_at_state ? (char *)w_bf16 + ch->c0 * 2 : w_bf16;
        const void *gg = p[ARR_G] ? p[ARR_G] : a->g_at_state ? (const char *)g + ch->c0 * qt_dtype_size(g_dt) : g;
        qt_adamw_step(ch->plan, ww, mp, gg, g_dt, mm, o->m_dt, vv, o->v_dt, grad_scale, NULL, &b, s);
        cudaStream_t down = qt_chunk_pipe_done(o->pipe, s);
        if (o->guard) o->guard(o->guard_ctx, ch->hi); /* the host state below hi (host weights too) is ours again */
        move(o, ch, p, host, 0, down);
        qt_chunk_pipe_back(o->pipe);
    }
    /* s goes on once the state is back in host memory: after the last group, or after every group when the
     * weights stream (what follows a group on s reads them there: the finiteness count, the gathers) */
    if (o->slots && (k == o->groups - 1 || o->host & QT_OPTIM_W)) qt_chunk_pipe_end(o->pipe, s);
}
