/* test_weight_slots.c — ZeRO-3's weight slots (src/gpu/weight_slots.c) driven through whole micro-steps
 * on the CPU: the module is compiled here against host stand-ins of the CUDA calls it makes (events and
 * stream waits do nothing, so every enqueued gather happens at once, in the order the streams would run
 * it), and the gather writes each bucket's elements as a hash of their flat
 * index. The acquire sequence of dp_sync.c's hooks (the forward's units, the backward's, eval forwards,
 * grad_accum micro-steps, the own slots refilled and everything invalidated after each optimizer step)
 * must let the model read every element of every unit it reads at its flat value through
 * qt_wslots_addr, each unit whole in its home bucket's slot (the layout padded for the ranks). Models: tied and
 * untied, 1 (offloaded weights), 2 and 3 ranks, a table smaller than a
 * bucket (layer 0 in the table's own slot), prefetch on (a side stream) and off. It also counts the
 * gathers: with the prefetch, a micro-step's backward gathers only the layers below the top two. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

/* host stand-ins, before the module's calls are compiled */
static cudaError_t st_record(cudaEvent_t e, cudaStream_t s) { return (void)e, (void)s, cudaSuccess; }
static cudaError_t st_wait(cudaStream_t s, cudaEvent_t e, unsigned f) { return (void)s, (void)e, (void)f, cudaSuccess; }
static cudaError_t st_hostfn(cudaStream_t s, cudaHostFn_t fn, void *ud) { return (void)s, fn(ud), cudaSuccess; }
static cudaError_t st_create(cudaEvent_t *e, unsigned f) { return (void)f, *e = NULL, cudaSuccess; }
static cudaError_t st_destroy(cudaEvent_t e) { return (void)e, cudaSuccess; }
#define cudaEventRecord st_record
#define cudaStreamWaitEvent st_wait
#define cudaLaunchHostFunc st_hostfn
#define cudaEventCreateWithFlags st_create
#define cudaEventDestroy st_destroy
#include "../src/gpu/weight_slots.c"
#undef cudaEventRecord
#undef cudaStreamWaitEvent
#undef cudaLaunchHostFunc
#undef cudaEventCreateWithFlags
#undef cudaEventDestroy

#include "qt_model.h"
#include "qt_partition.h"
#include "qt_test.h"

static uint16_t val(size_t x) { return (uint16_t)((x * 0x9E3779B97F4A7C15ull) >> 48); }

typedef struct {
    const qt_shard *sh;
    long gathers;
} sim;

/* the all-gather's result: bucket b's elements at their flat values */
static void sim_gather(void *ctx, int b, void *dst, void *dst8, cudaStream_t s) {
    (void)dst8;
    sim *m = ctx;
    (void)s;
    for (size_t x = m->sh->bucket[b]; x < m->sh->bucket[b + 1]; x++) ((uint16_t *)dst)[x - m->sh->bucket[b]] = val(x);
    m->gathers++;
}

/* Elements [lo, hi) read through the slots: how many differ from their flat values. */
static long check_range(const qt_weight_slots *ws, size_t lo, size_t hi) {
    const uint16_t *p = qt_wslots_addr(ws, lo);
    long bad = 0;
    for (size_t x = lo; x < hi; x++) bad += p[x - lo] != val(x);
    return bad;
}

/* What dp_sync.c does after AdamW (and at the first forward): the own slots gathered, the rest stale. */
static void refill(qt_weight_slots *ws, const qt_shard *sh, sim *m) {
    qt_wslots_invalidate(ws);
    for (int k = 0; k < sh->n_buckets; k++)
        if (qt_wslots_own(ws, k)) {
            sim_gather(m, k, qt_wslots_own_data(ws, k), NULL, NULL);
            m->gathers--; /* counted apart: the shared slots' gathers are the ones per micro-step */
            qt_wslots_filled(ws, k, NULL);
        }
}

/* One forward (and backward) the way gpu_model.c reads the weights and dp_sync.c's hooks acquire them;
 * returns the elements read wrong. */
static long micro_step(qt_weight_slots *ws, const qt_wslots_io *io, const qt_layout *L, int backward) {
    int nl = L->cfg.num_layers;
    size_t vc = (size_t)L->cfg.vocab_size * L->cfg.hidden_size;
    long bad = 0;
    qt_wslots_acquire(ws, io, qt_wslots_home(ws, L->layers[0].ln1 - 1), +1);
    bad += check_range(ws, L->embed, L->embed + vc);
    for (int l = 0; l < nl; l++) {
        qt_wslots_acquire(ws, io, qt_wslots_home(ws, qt_layer_end(L, l) - 1), +1);
        bad += check_range(ws, L->layers[l].ln1, qt_layer_end(L, l));
    }
    qt_wslots_acquire(ws, io, qt_wslots_home(ws, L->numel - 1), +1);
    bad += check_range(ws, L->final_norm, L->final_norm + L->cfg.hidden_size) + check_range(ws, L->lm_head, L->lm_head + vc);
    if (!backward) return bad;
    qt_wslots_acquire(ws, io, qt_wslots_home(ws, L->final_norm), -1);
    bad += check_range(ws, L->final_norm, L->final_norm + L->cfg.hidden_size);
    for (int l = nl - 1; l >= 0; l--) {
        qt_wslots_acquire(ws, io, qt_wslots_home(ws, L->layers[l].ln1), -1);
        bad += check_range(ws, L->layers[l].ln1, qt_layer_end(L, l));
    }
    return bad;
}

static void test_acquire_sequences(void) {
    const struct { int vocab, hidden, layers, tie; } models[] = {
        {301, 96, 7, 0}, {301, 96, 7, 1}, {256, 128, 5, 0}, {8192, 128, 5, 1}, {2, 64, 4, 1}, {3, 64, 3, 0},
    };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++)
        for (int n = 1; n <= 3; n++) /* 1: memory.offload: [weights] (copies from host) */
            for (int prefetch = 0; prefetch < 2; prefetch++) {
                qt_model_cfg mc = {.vocab_size = models[mi].vocab, .hidden_size = models[mi].hidden,
                                   .num_layers = models[mi].layers, .num_heads = models[mi].hidden / 32, .num_kv_heads = 1,
                                   .head_dim = 32, .intermediate_size = 160, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                                   .tie_embeddings = models[mi].tie, .qkv_bias = 1, .max_seq_len = 64};
                qt_model_cfg_finish(&mc);
                char err[256];
                qt_layout L;
                QT_REQUIRE(qt_layout_init_units(&L, &mc, (size_t)n * QT_LAYOUT_ALIGN, err, sizeof err) == 0, "%s", err);
                qt_shard sh;
                qt_shard_init(&sh, &L, n, 0, 1);
                qt_weight_slots *ws = qt_wslots_create(&L, &sh);
                qt_mem_plan p;
                qt_mem_plan_begin(&p, NULL);
                qt_wslots_carve(ws, &p);
                char *mem = malloc(p.off + 256), *base = (char *)(((uintptr_t)mem + 255) & ~(uintptr_t)255);
                QT_REQUIRE(mem, "out of memory");
                memset(mem, 0xa5, p.off + 256);
                qt_mem_plan_begin(&p, base);
                qt_wslots_carve(ws, &p);
                qt_wslots_start(ws);
                sim m = {&sh, 0};
                long delay = 0;
                int s_model = 1, s_side = 2; /* stand-in streams: only their difference matters */
                qt_wslots_io io = {sim_gather, &m, (cudaStream_t)(uintptr_t)s_model,
                                   (cudaStream_t)(uintptr_t)(prefetch ? s_side : s_model), &delay};
                long bad = 0, first_step = -1;
                for (int step = 0; step < 3; step++) { /* 2 micro-steps, an eval, then "AdamW" */
                    refill(ws, &sh, &m);
                    long g0 = m.gathers;
                    bad += micro_step(ws, &io, &L, 1);
                    if (step == 0) first_step = m.gathers - g0;
                    bad += micro_step(ws, &io, &L, 1);
                    bad += micro_step(ws, &io, &L, 0);
                }
                int shared = 0;
                for (int b = 0; b < sh.n_buckets; b++) shared += !qt_wslots_own(ws, b);
                /* a micro-step after AdamW gathers every shared bucket in its forward and, in its backward, all
                 * but the top two (still in the slots); the second micro-step only those the first's backward
                 * evicted; without prefetch the same */
                long want = shared + (shared > 2 ? shared - 2 : 0);
                printf("  vocab %5d, %d layers, tied %d, %d ranks, prefetch %d: %d buckets (%d shared), %ld gathers in a "
                       "step's first micro-step, %ld wrong reads\n", mc.vocab_size, mc.num_layers, mc.tie_embeddings, n,
                       prefetch, sh.n_buckets, shared, first_step, bad);
                QT_EXPECT(bad == 0, "vocab %d, tied %d, %d ranks, prefetch %d: %ld elements read wrong", mc.vocab_size,
                          mc.tie_embeddings, n, prefetch, bad);
                QT_EXPECT(first_step == want, "vocab %d, tied %d, %d ranks, prefetch %d: %ld gathers, expected %ld",
                          mc.vocab_size, mc.tie_embeddings, n, prefetch, first_step, want);
                qt_wslots_free(ws);
                free(mem);
                qt_layout_free(&L);
            }
}

int main(void) {
    QT_RUN(test_acquire_sequences);
    return qt_test_end();
}
