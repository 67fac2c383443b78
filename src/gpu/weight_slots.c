/* weight_slots.c — ZeRO-3's weight slots: units and their home buckets, the slot layout, and the
 * gather / wait protocol of an acquire (qt_weight_slots.h, docs/memory.md). */
#include "qt_weight_slots.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif

typedef struct {
    char *alloc;          /* the slot's allocation (arena) */
    char *alloc8;         /* a shared slot's e4m3 codes of its bucket (parallel.gather_dtype e4m3; arena), else NULL */
    size_t cap;           /* data elements it holds */
    int bucket;           /* the bucket it holds, -1: none (a shared slot's data is stale) */
    int pending;          /* its gather's event is not yet waited for by the model stream */
    cudaEvent_t filled, free;
} wslot;

struct qt_weight_slots {
    qt_shard sh;
    size_t numel;
    int n_units;
    size_t *ustart;       /* [n_units] ascending, ustart[0] = 0 (owned) */
    int *uhome;           /* [n_units] home bucket: the one holding the whole unit (owned) */
    int *own;             /* [n_buckets] its own slot's index (>= QT_WSLOTS), -1: a shared one (owned) */
    int n_slots;
    wslot *slot;          /* [n_slots]: QT_WSLOTS shared, then the own ones (owned) */
    size_t big;           /* the largest bucket without an own slot */
    int cur;              /* the shared slot the model read last (-1: none) */
    int started;
    int with8;            /* the shared slots have e4m3 halves (qt_wslots_use_e4m3) */
};

static size_t blen(const qt_weight_slots *ws, int b) { return ws->sh.bucket[b + 1] - ws->sh.bucket[b]; }

/* The bucket holding flat element x (x < total). */
static int bucket_of(const qt_shard *sh, size_t x) {
    int lo = 0, hi = sh->n_buckets - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (sh->bucket[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

qt_weight_slots *qt_wslots_create(const qt_layout *L, const qt_shard *sh) {
    qt_weight_slots *ws = calloc(1, sizeof *ws);
    QT_CHECK(ws, "out of host memory");
    int nl = L->cfg.num_layers, nb = sh->n_buckets, untied = L->lm_head != L->embed;
    ws->sh = *sh;
    ws->numel = L->numel;
    ws->n_units = nl + 2;
    ws->ustart = calloc((size_t)ws->n_units, sizeof *ws->ustart);
    ws->uhome = calloc((size_t)ws->n_units, sizeof *ws->uhome);
    ws->own = calloc((size_t)nb, sizeof *ws->own);
    QT_CHECK(ws->ustart && ws->uhome && ws->own, "out of host memory");
    /* units: the table [0, layer 0), each layer, the final norm (+ untied LM head) up to numel; the buckets are
     * cut at units' starts (qt_partition.h), so each lies in one */
    for (int u = 0; u < ws->n_units; u++) {
        size_t s = u == 0 ? 0 : u <= nl ? L->layers[u - 1].ln1 : L->final_norm;
        size_t e = u == 0 ? L->layers[0].ln1 : u <= nl ? qt_layer_end(L, u - 1) : L->numel;
        int h = bucket_of(sh, s);
        ws->ustart[u] = s;
        ws->uhome[u] = h;
        QT_CHECK(e <= sh->bucket[h + 1], "ZeRO-3: unit %d [%zu, %zu) runs past its bucket %d [%zu, %zu)", u, s, e, h,
                 sh->bucket[h], sh->bucket[h + 1]);
    }
    for (int b = 0; b < nb; b++) ws->own[b] = -1;
    ws->n_slots = QT_WSLOTS;
    ws->own[ws->uhome[0]] = ws->n_slots++; /* the table (and a tied LM head) */
    if (untied && ws->own[ws->uhome[nl + 1]] < 0) ws->own[ws->uhome[nl + 1]] = ws->n_slots++;
    ws->slot = calloc((size_t)ws->n_slots, sizeof *ws->slot);
    QT_CHECK(ws->slot, "out of host memory");
    for (int b = 0; b < nb; b++) {
        if (ws->own[b] >= 0) ws->slot[ws->own[b]].cap = blen(ws, b);
        else if (blen(ws, b) > ws->big) ws->big = blen(ws, b);
    }
    for (int i = 0; i < ws->n_slots; i++) ws->slot[i].bucket = -1;
    for (int i = 0; i < QT_WSLOTS; i++) ws->slot[i].cap = ws->big;
    ws->cur = -1;
    return ws;
}

void qt_wslots_free(qt_weight_slots *ws) {
    if (!ws) return;
    for (int i = 0; ws->started && i < ws->n_slots; i++) {
        QT_CUDA(cudaEventDestroy(ws->slot[i].filled));
        QT_CUDA(cudaEventDestroy(ws->slot[i].free));
    }
    free(ws->ustart);
    free(ws->uhome);
    free(ws->own);
    free(ws->slot);
    free(ws);
}

/* A slot of cap elements: a 256-byte pad that puts the data at its bucket's address modulo 256, the data. */
static size_t slot_bytes(size_t cap) { return 256 + cap * 2; }

size_t qt_wslots_slot_bytes(const qt_weight_slots *ws, int b) {
    return slot_bytes(b < 0 || ws->own[b] < 0 ? ws->big : blen(ws, b));
}

void qt_wslots_use_e4m3(qt_weight_slots *ws) { ws->with8 = 1; }

void qt_wslots_carve(qt_weight_slots *ws, qt_mem_plan *p) {
    for (int i = 0; i < ws->n_slots; i++)
        if (ws->slot[i].cap)
            ws->slot[i].alloc = qt_mem_plan_carve(p, i < QT_WSLOTS ? "weight slots (layers)" : "weight slots (emb/head)",
                                                  slot_bytes(ws->slot[i].cap));
    for (int i = 0; ws->with8 && i < QT_WSLOTS; i++)
        ws->slot[i].alloc8 = qt_mem_plan_carve(p, "weight slots (e4m3)", ws->big);
}

void qt_wslots_start(qt_weight_slots *ws) {
    for (int i = 0; i < ws->n_slots; i++) {
        QT_CUDA(cudaEventCreateWithFlags(&ws->slot[i].filled, cudaEventDisableTiming));
        QT_CUDA(cudaEventCreateWithFlags(&ws->slot[i].free, cudaEventDisableTiming));
    }
    ws->started = 1;
}

int qt_wslots_home(const qt_weight_slots *ws, size_t off) {
    int lo = 0, hi = ws->n_units - 1; /* the last unit starting at or below off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ws->ustart[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    return ws->uhome[lo];
}

int qt_wslots_own(const qt_weight_slots *ws, int b) { return ws->own[b] >= 0; }

/* Where slot i's data starts when it holds bucket b (its address modulo 256 = bucket[b] x 2's). */
static char *data_of(const qt_weight_slots *ws, int i, int b) {
    return ws->slot[i].alloc + (ws->sh.bucket[b] * 2) % 256;
}

/* The slot holding bucket b, -1: none. */
static int slot_of(const qt_weight_slots *ws, int b) {
    if (ws->own[b] >= 0) return ws->slot[ws->own[b]].bucket == b ? ws->own[b] : -1;
    for (int i = 0; i < QT_WSLOTS; i++)
        if (ws->slot[i].bucket == b) return i;
    return -1;
}

void *qt_wslots_addr(const qt_weight_slots *ws, size_t off) {
    int b = qt_wslots_home(ws, off), i = slot_of(ws, b);
    QT_CHECK(i >= 0, "ZeRO-3: the weights at flat element %zu (bucket %d) are read but no slot holds them (not acquired)",
             off, b);
    return data_of(ws, i, b) + ((ptrdiff_t)off - (ptrdiff_t)ws->sh.bucket[b]) * 2;
}

void *qt_wslots_addr8(const qt_weight_slots *ws, size_t off) {
    int b = qt_wslots_home(ws, off), i = slot_of(ws, b);
    QT_CHECK(i >= 0 && i < QT_WSLOTS && ws->slot[i].alloc8 && off >= ws->sh.bucket[b] && off < ws->sh.bucket[b + 1],
             "ZeRO-3: the e4m3 codes of flat element %zu (bucket %d) are read but no shared e4m3 slot holds them", off, b);
    return ws->slot[i].alloc8 + (off - ws->sh.bucket[b]);
}

void *qt_wslots_own_data(const qt_weight_slots *ws, int b) {
    QT_CHECK(ws->own[b] >= 0, "ZeRO-3: bucket %d has no slot of its own", b);
    return data_of(ws, ws->own[b], b);
}

void qt_wslots_filled(qt_weight_slots *ws, int b, cudaStream_t s) {
    wslot *w = &ws->slot[ws->own[b]];
    QT_CUDA(cudaEventRecord(w->filled, s));
    w->bucket = b;
    w->pending = 1;
}

void qt_wslots_invalidate(qt_weight_slots *ws) {
    for (int i = 0; i < QT_WSLOTS; i++) ws->slot[i].bucket = -1;
    ws->cur = -1;
}

void *qt_wslots_scratch(const qt_weight_slots *ws, size_t *bytes, void **codes, size_t *codes_bytes) {
    QT_CHECK(ws->slot[0].bucket < 0 && ws->slot[0].alloc, "ZeRO-3: shared slot 0 used as scratch while it holds bucket %d",
             ws->slot[0].bucket);
    *bytes = slot_bytes(ws->big);
    *codes = ws->slot[0].alloc8;
    *codes_bytes = ws->slot[0].alloc8 ? ws->big : 0;
    return ws->slot[0].alloc;
}

static void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

/* Gathers bucket b into shared slot i on the side stream once the model stream has enqueued every
 * reader of what it held (free), and records filled. */
static void gather_into(qt_weight_slots *ws, const qt_wslots_io *io, int i, int b) {
    wslot *w = &ws->slot[i];
    QT_CUDA(cudaEventRecord(w->free, io->model));
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_WSLOT_NO_FREE_WAIT);
#endif
    if (!no_wait) QT_CUDA(cudaStreamWaitEvent(io->side, w->free, 0));
    io->gather(io->ctx, b, data_of(ws, i, b), ws->slot[i].alloc8, io->side);
    QT_CUDA(cudaEventRecord(w->filled, io->side));
    w->bucket = b;
    w->pending = 1;
}

/* The model stream waits for slot i's gather (once). */
static void wait_filled(qt_weight_slots *ws, const qt_wslots_io *io, int i) {
    wslot *w = &ws->slot[i];
    if (!w->pending) return;
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_WSLOT_NO_FILL_WAIT) && i < QT_WSLOTS;
#endif
    if (!no_wait) QT_CUDA(cudaStreamWaitEvent(io->model, w->filled, 0));
    w->pending = 0;
}

void qt_wslots_acquire(qt_weight_slots *ws, const qt_wslots_io *io, int b, int dir) {
    QT_CHECK(b >= 0 && b < ws->sh.n_buckets, "ZeRO-3: acquire of bucket %d of %d", b, ws->sh.n_buckets);
    int i = slot_of(ws, b), own = ws->own[b] >= 0;
    QT_CHECK(i >= 0 || !own, "ZeRO-3: bucket %d's own slot was never filled (its gather after AdamW or the load)", b);
    if (i < 0) gather_into(ws, io, i = ws->cur == 0 ? 1 : 0, b); /* not the slot just read */
    wait_filled(ws, io, i);
    if (*io->read_delay_ms) QT_CUDA(cudaLaunchHostFunc(io->model, sleep_ms, io->read_delay_ms));
    if (!own) ws->cur = i;
    int nb = b + dir; /* the prefetch: the next bucket in dir into the shared slot not read now */
    if (io->side != io->model && nb >= 0 && nb < ws->sh.n_buckets && ws->own[nb] < 0 && slot_of(ws, nb) < 0)
        gather_into(ws, io, ws->cur < 0 ? 0 : 1 - ws->cur, nb);
}
