/* base_nf4.c — the frozen base with its block matrices a layer at a time in two bf16 slots: in NF4 on the GPU
 * (QLoRA), or streamed from pinned host memory in NF4 or bf16 (memory.offload: [weights]; qt_gpu_base.h, qt_nf4.h).
 *
 * Each block's q, k, v, o, gate, up and down matrix is quantized once, at load, on its own (as bitsandbytes'
 * Linear4bit does per module): NF4 codes in blocks of 64, their scales double-quantized (8-bit codes in blocks of
 * 256, an fp32 scale per 256 and the mean as offset): 0.5 + 1/64 + ~1/4096 bytes per weight, ~4.13 bits. The input
 * is the bf16 rounding of the weights as read, the dtype a user loads the model in before quantizing. Everything
 * else (embeddings, norms, biases, the LM head) stays bf16, as PEFT's QLoRA keeps it.
 * Two bf16 slots hold one block's matrices each, packed in flat order (q|k|v and gate|up adjacent, as the fused
 * matmuls read them); block l lives in slot l % 2. layer(l) makes the model's stream wait until slot l % 2 holds
 * block l (dequantized on the base's own stream: already, when the previous call guessed it) and then dequantizes
 * the block that comes next (l + 1 in a forward, l - 1 in a backward: the direction of the last two calls) into the
 * other slot, once the model's stream is past its reads of the block there, so it overlaps block l's ops. The
 * forward's last two blocks stay in the slots for the backward's first two.
 * A flat offset maps to its place through a table of regions sorted by offset: bf16 runs (the rest array) and
 * matrices (their block's slot); w() of a matrix of another block than the last layer() call's is an error. At
 * load, slot 0 takes each block's bf16 weights before they are quantized.
 * Streamed (base_stream.c's qt_base_host): the codes, block-scale codes and second-level scales (NF4), or the bf16
 * matrices in slot order (bf16), live in pinned host memory; a fill first copies the block's bytes up on the base's
 * stream (NF4: into a packed slot, then dequantized from there; bf16: straight into the bf16 slot, once the model's
 * stream is past the block there). At load each block goes down from slot 0 (quantized there first, for NF4). The
 * data-parallel LoRA ranks share one host store: a rank given another's (qt_weight_src.base_host) borrows it, reading
 * the source only for its bf16 rest and the base's identity, and streams its own layers into its own slots. A bf16
 * base places each matrix in its slot and each run of the rest at its flat offset's alignment (mod 128 elements), so
 * the matmuls see the resident base's pointer alignments and pick its algorithms: streamed trains its bits.
 * Plan rows: "frozen base: NF4 codes", "frozen base: NF4 scales" (streamed: "frozen base: NF4 (pinned host)" and
 * "NF4 streamed layers (packed, 2)"; bf16: "frozen base: bf16 blocks (pinned host)"), "frozen base (bf16 rest)",
 * "NF4 layer slots (bf16, 2)" ("base layer slots (bf16, 2)") and "load staging (fp32)" (with the quantizer's fp32
 * block scales). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_gpu_base.h"
#include "qt_kernels.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_nf4.h"

typedef struct {
    size_t lo, hi; /* flat range [lo, hi) */
    int layer;     /* -1: a bf16 run of the rest array; else the block whose slot holds it */
    size_t dst;    /* its first element in the rest array or in the slot */
} region;

typedef struct {
    size_t lo;           /* flat offset */
    long rows, cols;
    int layer;
    size_t slot;         /* first element in the slot */
    size_t codes, qabs;  /* byte offsets into codes[] and qabs[] (16-byte aligned) */
    size_t fsc;          /* float offset into fsc[]: the offset, then absmax2[nb2] (16-byte aligned) */
} nf4_mat;

typedef struct {
    qt_gpu_base base;
    region *reg;
    int nreg;
    nf4_mat *mat; /* flat order, so block by block */
    int nmat;
    int *first;   /* [num_layers + 1]: block l's matrices are mat[first[l] .. first[l + 1]) */
    size_t rest_n, slot_n, code_bytes, qabs_bytes, fsc_n, max_nb, stage_n;
    void *rest;       /* bf16 [rest_n], device (arena) */
    void *slot;       /* bf16 [2][slot_n]: block l in slot l % 2 */
    uint8_t *codes;   /* [code_bytes] */
    uint8_t *qabs;    /* [qabs_bytes]: the 8-bit codes of the block scales */
    float *fsc;       /* [fsc_n]: per matrix its offset and second-level scales */
    float *staging;   /* fp32 [stage_n]: the load's chunks */
    float *absmax;    /* fp32 [max_nb]: the quantizer's first-level scales (load only) */
    int nf4;          /* the block matrices in NF4 (else bf16: streamed only) */
    int stream;       /* memory.offload: [weights]: they live in pinned host memory (hb), copied up per layer */
    const char *path; /* the config, for messages (borrowed) */
    qt_base_host hb;  /* stream: NF4 parts codes, qabs, fsc; bf16 one part, the slots its device slots */
    int cur;          /* the block of the last layer() call, whose matrices w() hands out; -1 none */
    int held[2];      /* the block each slot holds (or is being filled with), -1 none */
    cudaStream_t side;      /* the dequantizes; NULL until init */
    cudaEvent_t ready[2];   /* slot k's last fill done (side) */
    cudaEvent_t past;       /* the model's stream at a layer() call: every read of an earlier block queued before */
} base_nf4;

static size_t up16(size_t x) { return (x + 15) & ~(size_t)15; }

static int by_offset(const void *a, const void *b) {
    size_t x = ((const nf4_mat *)a)->lo, y = ((const nf4_mat *)b)->lo;
    return x < y ? -1 : x > y;
}

static void nf4_carve(qt_gpu_base *b, qt_mem_plan *p) {
    base_nf4 *s = (base_nf4 *)b;
    if (s->stream && s->nf4) {
        qt_base_host_carve(&s->hb, p, "frozen base: NF4 (pinned host)", "NF4 streamed layers (packed, 2)");
    } else if (!s->stream) {
        s->codes = qt_mem_plan_carve(p, "frozen base: NF4 codes", s->code_bytes);
        s->qabs = qt_mem_plan_carve(p, "frozen base: NF4 scales", s->qabs_bytes);
        s->fsc = qt_mem_plan_carve(p, "frozen base: NF4 scales", s->fsc_n * 4);
    }
    s->rest = qt_mem_plan_carve(p, "frozen base (bf16 rest)", s->rest_n * 2);
    s->slot = qt_mem_plan_carve(p, s->nf4 ? "NF4 layer slots (bf16, 2)" : "base layer slots (bf16, 2)", 2 * s->slot_n * 2);
    if (!s->nf4) { /* the bf16 slots are the store's device slots */
        qt_base_host_carve(&s->hb, p, "frozen base: bf16 blocks (pinned host)", NULL);
        for (int k = 0; k < 2; k++) s->hb.slot[k] = s->slot ? (uint8_t *)s->slot + (size_t)k * s->slot_n * 2 : NULL;
    }
    s->staging = qt_mem_plan_carve(p, "load staging (fp32)", s->stage_n * 4);
    if (s->nf4) s->absmax = qt_mem_plan_carve(p, "load staging (fp32)", s->max_nb * 4);
}

/* Matrix m's NF4 codes, block-scale codes and second-level scales (offset first) on the device: the resident arrays,
 * or (streamed) packed slot k. */
typedef struct {
    uint8_t *codes, *qabs;
    float *fsc;
} nf4_at;
static nf4_at mat_at(const base_nf4 *s, const nf4_mat *m, int k) {
    if (!s->stream) return (nf4_at){s->codes + m->codes, s->qabs + m->qabs, s->fsc + m->fsc};
    int l = m->layer;
    return (nf4_at){qt_base_host_slot(&s->hb, k, 0, l, m->codes), qt_base_host_slot(&s->hb, k, 1, l, m->qabs),
                    qt_base_host_slot(&s->hb, k, 2, l, m->fsc * 4)};
}

/* Block l's matrices, in bf16 in slot 0, into their NF4 codes and scales (streamed: packed slot 0, then down to the
 * host), or (bf16 streamed) down to the host as they are. */
static void quantize_layer(base_nf4 *s, int l, cudaStream_t st) {
    if (s->hb.borrowed) return; /* the owner's store holds the layer's bytes */
    for (int i = s->first[l]; i < s->first[l + 1] && s->nf4; i++) {
        const nf4_mat *m = &s->mat[i];
        nf4_at a = mat_at(s, m, 0);
        qt_nf4_quantize(QT_DT_BF16, (char *)s->slot + m->slot * 2, m->rows, m->cols, a.codes, s->absmax, a.qabs,
                        a.fsc + 1, a.fsc, st);
    }
    if (s->stream) qt_base_host_put(&s->hb, l, st);
}

/* The chunk [lo, lo + c) in staging (fp32) to bf16 where its regions go, region cursor *r; quantizes a block's
 * matrices once the chunk moves on to another block's. */
static void place_chunk(base_nf4 *s, size_t lo, size_t c, int *r, cudaStream_t st) {
    for (; *r < s->nreg && s->reg[*r].lo < lo + c; ++*r) {
        const region *g = &s->reg[*r];
        size_t a = g->lo > lo ? g->lo : lo, e = g->hi < lo + c ? g->hi : lo + c;
        if (g->layer < 0) {
            qt_cast_f32_to_bf16((char *)s->rest + (g->dst + a - g->lo) * 2, s->staging + (a - lo), e - a, st);
        } else {
            if (s->cur != g->layer && s->cur >= 0) quantize_layer(s, s->cur, st);
            s->cur = g->layer;
            qt_cast_f32_to_bf16((char *)s->slot + (g->dst + a - g->lo) * 2, s->staging + (a - lo), e - a, st);
        }
        if (g->hi > lo + c) return; /* the region goes on in the next chunk */
    }
}

static int nf4_init(qt_gpu_base *b, const qt_weight_src *src, cudaStream_t st, char *err, size_t errlen) {
    base_nf4 *s = (base_nf4 *)b;
    QT_CUDA(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
    for (int k = 0; k < 2; k++) QT_CUDA(cudaEventCreateWithFlags(&s->ready[k], cudaEventDisableTiming));
    QT_CUDA(cudaEventCreateWithFlags(&s->past, cudaEventDisableTiming));
    size_t n = b->L->numel;
    if (s->stream && (src->base_host ? qt_base_host_share(&s->hb, src->base_host, err, errlen)
                                     : qt_base_host_alloc(&s->hb, s->path, err, errlen)))
        return -1;
    qt_gpu_wsrc rd;
    qt_gpu_wsrc_open(&rd, src, s->stage_n);
    int r = 0;
    s->cur = -1;
    for (size_t lo = 0; lo < n; lo += s->stage_n) {
        size_t c = n - lo < s->stage_n ? n - lo : s->stage_n;
        if (qt_gpu_wsrc_fill(&rd, lo, c, s->staging, st, err, errlen)) {
            qt_gpu_wsrc_close(&rd, b->id, sizeof b->id);
            return -1;
        }
        place_chunk(s, lo, c, &r, st);
    }
    if (s->cur >= 0) quantize_layer(s, s->cur, st);
    s->cur = -1; /* slot 0 holds the last block as read, not dequantized */
    QT_CUDA(cudaStreamSynchronize(st));
    qt_gpu_wsrc_close(&rd, b->id, sizeof b->id);
    return 0;
}

/* Block l's matrices into slot l % 2 on the side stream, ready[l % 2] after: streamed, its bytes copied up first
 * (NF4's packed slot is the side stream's alone: before the wait); then, once the side stream waits for s->past
 * (the model's reads of the slot's last block), the slot written. */
static void fill(base_nf4 *s, int l) {
    int k = l % 2, from = l;
#ifdef QT_MUTANTS
    if (l > 0 && qt_mutant_on(QT_MUT_NF4_SLOT_STALE)) from = l - 1;
#endif
    char *slot = (char *)s->slot + (size_t)k * s->slot_n * 2;
    if (s->stream && s->nf4) qt_base_host_fetch(&s->hb, from, k, s->side);
    QT_CUDA(cudaStreamWaitEvent(s->side, s->past, 0));
    if (!s->nf4) qt_base_host_fetch(&s->hb, from, k, s->side);
    for (int i = s->first[from]; i < s->first[from + 1] && s->nf4; i++) {
        const nf4_mat *m = &s->mat[i];
        nf4_at a = mat_at(s, m, k);
        qt_nf4_dequant(QT_DT_BF16, slot + s->mat[i - s->first[from] + s->first[l]].slot * 2, a.codes, NULL, a.qabs,
                       a.fsc + 1, a.fsc, m->rows, m->cols, s->side);
    }
    QT_CUDA(cudaEventRecord(s->ready[k], s->side));
    s->held[k] = l;
}

static void nf4_layer(qt_gpu_base *b, int l, cudaStream_t st) {
    base_nf4 *s = (base_nf4 *)b;
    int nl = b->L->cfg.num_layers, prev = s->cur;
    QT_CHECK(l >= 0 && l < nl, "NF4 base: block %d of %d", l, nl);
    QT_CUDA(cudaEventRecord(s->past, st)); /* the reads of every block before l are queued before this */
    if (s->held[l % 2] != l) fill(s, l);
    QT_CUDA(cudaStreamWaitEvent(st, s->ready[l % 2], 0));
    s->cur = l;
    int next = l == prev - 1 ? l - 1 : l + 1; /* a backward goes down, a forward (or a new step's) up */
    if (next >= 0 && next < nl && s->held[next % 2] != next) fill(s, next);
}

static const region *region_of(const base_nf4 *s, size_t off) {
    int lo = 0, hi = s->nreg - 1;
    while (lo < hi) { /* the last region with reg.lo <= off */
        int mid = (lo + hi + 1) / 2;
        if (s->reg[mid].lo <= off) lo = mid;
        else hi = mid - 1;
    }
    QT_CHECK(off >= s->reg[lo].lo && off < s->reg[lo].hi, "NF4 base: weight offset %zu outside the layout", off);
    return &s->reg[lo];
}

static void *nf4_w(const qt_gpu_base *b, size_t off) {
    const base_nf4 *s = (const base_nf4 *)b;
    const region *g = region_of(s, off);
    if (g->layer < 0) return (char *)s->rest + (g->dst + off - g->lo) * 2;
    QT_CHECK(g->layer == s->cur, "NF4 base: block %d's matrix at %zu read after layer(%d)", g->layer, off, s->cur);
    return (char *)s->slot + ((size_t)(g->layer % 2) * s->slot_n + g->dst + off - g->lo) * 2;
}

/* The weights the model computes with: the rest widened, each matrix dequantized by the CPU reference (bit for bit
 * the kernel's) from its codes and scales, or (bf16 streamed) widened from the host copy. */
static void nf4_get(const qt_gpu_base *b, float *w) {
    const base_nf4 *s = (const base_nf4 *)b;
    uint16_t *rest = malloc(s->rest_n * 2), *m16 = malloc(s->slot_n * 2);
    uint8_t *codes = malloc(s->code_bytes), *qabs = malloc(s->qabs_bytes);
    float *fsc = malloc(s->fsc_n * 4), *absmax = malloc(s->max_nb * 4);
    QT_CHECK(rest && m16 && codes && qabs && fsc && absmax, "out of host memory (the NF4 base's copy)");
    QT_CUDA(cudaDeviceSynchronize());
    QT_CUDA(cudaMemcpy(rest, s->rest, s->rest_n * 2, cudaMemcpyDeviceToHost));
    if (s->stream && s->nf4) { /* the host arrays have the resident ones' layout */
        memcpy(codes, s->hb.host[0], s->code_bytes);
        memcpy(qabs, s->hb.host[1], s->qabs_bytes);
        memcpy(fsc, s->hb.host[2], s->fsc_n * 4);
    } else if (s->nf4) {
        QT_CUDA(cudaMemcpy(codes, s->codes, s->code_bytes, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(qabs, s->qabs, s->qabs_bytes, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(fsc, s->fsc, s->fsc_n * 4, cudaMemcpyDeviceToHost));
    }
    for (int i = 0; i < s->nreg; i++) {
        const region *g = &s->reg[i];
        for (size_t j = 0; g->layer < 0 && j < g->hi - g->lo; j++) w[g->lo + j] = qt_bf16_to_f32(rest[g->dst + j]);
    }
    for (int i = 0; i < s->nmat; i++) {
        const nf4_mat *m = &s->mat[i];
        long n = m->rows * m->cols, nb = qt_nf4_blocks(n);
        const uint16_t *src = m16;
        if (s->nf4) {
            qt_nf4_absmax_ref(absmax, qabs + m->qabs, fsc + m->fsc + 1, fsc[m->fsc], nb);
            qt_nf4_dequant_ref(QT_DT_BF16, m16, codes + m->codes, absmax, n);
        } else {
            src = (const uint16_t *)(s->hb.host[0] + s->hb.lo[0][m->layer]) + m->slot;
        }
        for (long j = 0; j < n; j++) w[m->lo + j] = qt_bf16_to_f32(src[j]);
    }
    free(rest), free(m16), free(codes), free(qabs), free(fsc), free(absmax);
}

static void nf4_free(qt_gpu_base *b) {
    base_nf4 *s = (base_nf4 *)b;
    if (s->side) {
        QT_CUDA(cudaStreamSynchronize(s->side));
        QT_CUDA(cudaStreamDestroy(s->side));
        for (int k = 0; k < 2; k++) QT_CUDA(cudaEventDestroy(s->ready[k]));
        QT_CUDA(cudaEventDestroy(s->past));
    }
    if (s->stream) qt_base_host_free(&s->hb);
    free(s->reg), free(s->mat), free(s->first);
    free(s);
}

static const qt_base_host *nf4_host(const qt_gpu_base *b) { return &((const base_nf4 *)b)->hb; }

static const qt_gpu_base_ops nf4_ops = {"nf4 (block matrices) + bf16", nf4_carve, nf4_init, nf4_w, nf4_get, nf4_free,
                                        nf4_layer, NULL};
static const qt_gpu_base_ops nf4_stream_ops = {"nf4 (block matrices, streamed from pinned host) + bf16", nf4_carve,
                                               nf4_init, nf4_w, nf4_get, nf4_free, nf4_layer, nf4_host};
static const qt_gpu_base_ops bf16_stream_ops = {"bf16 (block matrices streamed from pinned host)", nf4_carve, nf4_init,
                                                nf4_w, nf4_get, nf4_free, nf4_layer, nf4_host};

/* The rest array's run of flat [lo, hi) as a region; a bf16 base keeps the resident base's alignment (mod 128). */
static void rest_run(base_nf4 *s, size_t lo, size_t hi) {
    if (!s->nf4) s->rest_n += (lo - s->rest_n) % 128;
    s->reg[s->nreg++] = (region){lo, hi, -1, s->rest_n};
    s->rest_n += hi - lo;
}

/* The block matrices in flat order with their sizes and places, and the regions over [0, numel). */
static void build_tables(base_nf4 *s, const qt_layout *L) {
    int nl = L->cfg.num_layers;
    s->mat = calloc(L->n_tensors, sizeof *s->mat);
    s->reg = calloc(2 * (size_t)L->n_tensors + 1, sizeof *s->reg);
    s->first = calloc(nl + 1, sizeof *s->first);
    QT_CHECK(s->mat && s->reg && s->first, "out of host memory");
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (qt_lora_nf4_holds(t)) s->mat[s->nmat++] = (nf4_mat){.lo = t->offset, .rows = t->shape[0], .cols = t->shape[1], .layer = t->layer};
    }
    qsort(s->mat, s->nmat, sizeof *s->mat, by_offset);
    size_t pos = 0, slot = 0;
    int l = -1;
    for (int i = 0; i < s->nmat; i++) {
        nf4_mat *m = &s->mat[i];
        size_t n = (size_t)m->rows * m->cols;
        long nb = qt_nf4_blocks((long)n);
        QT_CHECK(m->layer >= l, "NF4 base: block %d's matrices after block %d's in the layout", m->layer, l);
        if (m->layer != l) {
            while (l < m->layer) s->first[++l] = i;
            slot = 0;
        }
        if (pos < m->lo) rest_run(s, pos, m->lo);
        if (!s->nf4) slot += (m->lo - slot) % 128; /* the resident base's alignment: slot = lo (mod 128) */
        m->slot = slot;
        s->reg[s->nreg++] = (region){m->lo, m->lo + n, m->layer, slot};
        slot += n;
        pos = m->lo + n;
        if (slot > s->slot_n) s->slot_n = slot;
        if ((size_t)nb > s->max_nb) s->max_nb = nb;
        m->codes = s->code_bytes, s->code_bytes += up16(qt_nf4_code_bytes((long)n));
        m->qabs = s->qabs_bytes, s->qabs_bytes += up16(nb);
        m->fsc = s->fsc_n, s->fsc_n += up16((1 + qt_nf4_blocks2((long)n)) * 4) / 4;
    }
    while (l < nl) s->first[++l] = s->nmat;
    if (pos < L->numel) rest_run(s, pos, L->numel);
}

/* The streamed store's per-layer byte ranges: NF4's codes, block-scale codes and second-level scales (the resident
 * arrays' layout), or the bf16 matrices of each layer in slot order. */
static void host_ranges(base_nf4 *s, int nl) {
    qt_base_host_init(&s->hb, s->nf4 ? 3 : 1, nl);
    for (int l = 0; l < nl; l++) {
        const nf4_mat *m = s->first[l + 1] > s->first[l] ? &s->mat[s->first[l + 1] - 1] : NULL;
        if (!s->nf4) {
            s->hb.lo[0][l + 1] = s->hb.lo[0][l] + (m ? (m->slot + (size_t)m->rows * m->cols) * 2 : 0);
            continue;
        }
        int e = s->first[l + 1];
        s->hb.lo[0][l + 1] = e < s->nmat ? s->mat[e].codes : s->code_bytes;
        s->hb.lo[1][l + 1] = e < s->nmat ? s->mat[e].qabs : s->qabs_bytes;
        s->hb.lo[2][l + 1] = (e < s->nmat ? s->mat[e].fsc : s->fsc_n) * 4;
    }
}

qt_gpu_base *qt_gpu_base_nf4_create(const qt_layout *L, int nf4, int stream, const char *path) {
    base_nf4 *s = calloc(1, sizeof *s);
    QT_CHECK(s, "out of host memory");
    QT_CHECK(nf4 || stream, "the resident bf16 base is base_bf16.c's");
    s->base = (qt_gpu_base){!stream ? &nf4_ops : nf4 ? &nf4_stream_ops : &bf16_stream_ops, L, ""};
    s->nf4 = nf4;
    s->stream = stream;
    s->path = path;
    s->cur = s->held[0] = s->held[1] = -1;
    build_tables(s, L);
    if (!nf4) s->slot_n = (s->slot_n + 127) / 128 * 128; /* slot 1 keeps slot 0's alignment */
    if (stream) host_ranges(s, L->cfg.num_layers);
    s->stage_n = qt_weight_src_chunk(L);
    if (s->stage_n > L->numel) s->stage_n = L->numel;
    return &s->base;
}
