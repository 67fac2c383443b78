/* plan.c — the run's plan from the config, the model and the rank count (qt_plan.h). */
#include "qt_plan.h"

#include <stdio.h>
#include <string.h>

#include "qt_comm.h"
#include "qt_config.h"
#include "qt_mem_plan.h"
#include "qt_test_hooks.h"

int qt_plan_lookups_pay(const qt_layout *L, long tokens, int n_ranks) {
    size_t n = (size_t)n_ranks, N = (size_t)tokens;
    size_t C = L->cfg.hidden_size, V = L->cfg.vocab_size;
    return n > 1 && n * N * (C + 1) < V * C;
}

int qt_plan_rank_devices(const qt_config *cfg, int ngpu, int *devs, char *err, size_t errlen) {
    int n = cfg->parallel.gpus ? cfg->parallel.gpus : ngpu > 0 ? ngpu : 1;
    if (cfg->parallel.devices.n) { /* one rank per entry, several may share a GPU */
        n = cfg->parallel.devices.n;
        if (n > QT_COMM_MAX_RANKS) {
            snprintf(err, errlen, "%s: parallel.devices: %d ranks, expected at most %d", cfg->path, n, QT_COMM_MAX_RANKS);
            return -1;
        }
        for (int r = 0; r < n; r++) {
            if (ngpu > 0 && cfg->parallel.devices.v[r] >= ngpu) {
                snprintf(err, errlen, "%s: parallel.devices: entry %d is device %d, expected a device id < %d (%d visible)",
                         cfg->path, r, cfg->parallel.devices.v[r], ngpu, ngpu);
                return -1;
            }
            devs[r] = cfg->parallel.devices.v[r];
        }
        return n;
    }
    if (ngpu > 0 && n > ngpu) {
        snprintf(err, errlen, "%s: parallel.gpus: %d GPUs asked for, %d visible", cfg->path, n, ngpu);
        return -1;
    }
    if (n > QT_COMM_MAX_RANKS && !cfg->parallel.gpus) n = QT_COMM_MAX_RANKS; /* "all visible", up to what comm serves */
    if (n > QT_COMM_MAX_RANKS) {
        snprintf(err, errlen, "%s: parallel.gpus: %d, expected at most %d", cfg->path, n, QT_COMM_MAX_RANKS);
        return -1;
    }
    for (int r = 0; r < n; r++) devs[r] = r;
    return n;
}

size_t qt_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

size_t qt_plan_host_limit(const qt_config *cfg, char *what, size_t cap) {
    if (cfg->memory.host_limit_gib > 0) {
        snprintf(what, cap, "memory.host_limit_gib = %g", cfg->memory.host_limit_gib);
        return qt_mem_gib(cfg->memory.host_limit_gib);
    }
    snprintf(what, cap, "MemAvailable (/proc/meminfo; memory.host_limit_gib overrides it)");
    return qt_host_mem_available();
}

/* The rules that need the rank count and the dtypes the engines serve: 0, or -1 with err. */
static int check_ranks(const qt_config *cfg, int n_ranks, char *err, size_t errlen) {
    int mm = cfg->precision.matmul_dtype, gd = cfg->precision.grad_dtype, zero = cfg->parallel.zero;
    if (mm != QT_DT_BF16 && mm != QT_DT_E4M3)
        return snprintf(err, errlen, "%s: precision.matmul_dtype: %s: expected bf16 or e4m3", cfg->path,
                        qt_dtype_name(mm)), -1;
    if (mm == QT_DT_E4M3 && gd != QT_DT_E4M3 && gd != QT_DT_E5M2 && gd != QT_DT_BF16)
        return snprintf(err, errlen, "%s: precision.grad_dtype: %s with matmul_dtype e4m3: expected e4m3, e5m2 or bf16",
                        cfg->path, qt_dtype_name(gd)), -1;
    if (zero >= 2 && n_ranks == 0)
        return snprintf(err, errlen, "%s: parallel.zero: %d shards the gradients%s over the data-parallel ranks, expected "
                        ">= 2 ranks, got 1 (parallel.devices: [0, 0] puts two ranks on GPU 0; one rank keeps everything: "
                        "zero 0 or 1)", cfg->path, zero, zero == 3 ? " and weights" : ""), -1;
    if (qt_config_zero3_check(cfg, err, errlen)) return -1; /* a config changed after loading (memory.plan: auto) */
    int across = cfg->parallel.nodes > 1 && n_ranks >= 1;
    if (across && (cfg->memory.offload & QT_OFF_WEIGHTS))
        return snprintf(err, errlen, "%s: memory.offload: [weights] across nodes is not built (ZeRO-3's pieces are the "
                        "world's, gathered between the nodes by NCCL from GPU memory): drop it", cfg->path), -1;
    if ((cfg->memory.offload & QT_OFF_GRADIENTS) && across && n_ranks == 1)
        return snprintf(err, errlen, "%s: memory.offload: [gradients] on nodes of one GPU is not built: drop it, or give "
                        "each node 2 or more GPUs with parallel.zero 2 or 3", cfg->path), -1;
    int w_off = (cfg->memory.offload & QT_OFF_WEIGHTS) && zero < 3, g_off = (cfg->memory.offload & QT_OFF_GRADIENTS) && zero < 2;
    if ((w_off || g_off) && n_ranks > 1) /* several ranks: the rank's ZeRO-3 pieces / ZeRO-2 gradient shard only */
        return snprintf(err, errlen, "%s: memory.offload: [%s] with parallel.zero: %d is built for one GPU, expected 1 rank, "
                        "got %d (parallel.gpus: 0 takes every visible GPU: set parallel.gpus: 1; with several ranks "
                        "parallel.zero: %s offloads the rank's shard)", cfg->path, w_off ? "weights" : "gradients", zero,
                        n_ranks, w_off ? "3" : "2 or 3"), -1;
    return 0;
}

static void place(const qt_config *cfg, const qt_layout *L, qt_plan *p) {
    const qt_parallel_cfg *par = &cfg->parallel;
    const qt_memory_cfg *mem = &cfg->memory;
    qt_plan_parallel *pp = &p->parallel;
    int off = mem->offload, quants = (off & (QT_OFF_QUANTS | QT_OFF_WEIGHTS)) == (QT_OFF_QUANTS | QT_OFF_WEIGHTS);
    int fp8 = p->precision.fp8;
    qt_plan_weights *w = &p->weights;
    qt_plan_grads *g = &p->grads;
    qt_plan_optimizer *o = &p->optimizer;
    size_t chunk = qt_test_hooks_get()->offload_chunk;
    o->host = (off & QT_OFF_OPTIMIZER) != 0;
    o->mask = off & QT_OFF_OPTIMIZER;
    o->zero_copy = o->host && mem->zero_copy;
    o->chunk = chunk ? chunk : QT_GPU_OPTIM_CHUNK;
    o->ahead = pp->dp == QT_DP_ONE && o->host;
    w->host_one = pp->dp == QT_DP_ONE && (off & QT_OFF_WEIGHTS) != 0; /* ranks: host_shard */
    w->host_shard = pp->zero >= 3 && (off & QT_OFF_WEIGHTS) != 0;    /* else refused (check_ranks) */
    w->host = w->host_one || w->host_shard;
    w->slots = pp->zero >= 3 || w->host_one;
    w->e4m3 = fp8 && ((pp->zero >= 3 && (par->gather_dtype == QT_DT_E4M3 || quants)) || (w->host_one && quants));
    g->host_one = pp->dp == QT_DP_ONE && (off & QT_OFF_GRADIENTS) != 0;
    g->host_shard = pp->zero >= 2 && (off & QT_OFF_GRADIENTS) != 0;
    g->host = g->host_one || g->host_shard;
    g->sharded = pp->zero >= 2;
    /* bf16 gradients cross in bf16 already: no comm buffer to cast them into */
    g->reduce_dt = (qt_dtype)par->reduce_dtype;
    g->reduce_bf16 = pp->dp != QT_DP_ONE && par->reduce_dtype == QT_DT_BF16 && cfg->precision.grad_accum_dtype != QT_DT_BF16;
    pp->overlap = pp->dp != QT_DP_ONE && par->overlap_comm;
    /* across nodes the table's gradient crosses in its bucket: the lookups' gathers stay inside a node */
    pp->lookups = pp->dp == QT_DP_SHARDED && pp->nodes == 1 &&
                  qt_plan_lookups_pay(L, (long)cfg->data.micro_batch * cfg->data.seq_len, pp->n_ranks);
    g->embed_apart = g->sharded && pp->lookups && L->lm_head != L->embed;
    w->ahead = (pp->dp == QT_DP_SHARDED && pp->overlap) || o->ahead;
    pp->buckets = pp->dp != QT_DP_ONE ? (pp->overlap || pp->dp == QT_DP_SHARDED || pp->world_pieces) && pp->n_ranks * pp->nodes > 1
                                      : o->host || w->host_one || g->host_one;
    p->perf.side_stream = pp->dp != QT_DP_ONE || o->ahead || w->host_one || g->host_one;
}

/* The data-parallel part of the plan for n_ranks >= 0 GPU ranks (0: one GPU). */
static void ranks_of(const qt_config *cfg, int n_ranks, qt_plan_parallel *pp) {
    pp->nodes = n_ranks && cfg->parallel.nodes > 1 ? cfg->parallel.nodes : 1; /* a node of one GPU: a data-parallel rank */
    pp->dp = n_ranks == 0 ? QT_DP_ONE : cfg->parallel.zero >= 1 && n_ranks * pp->nodes > 1 ? QT_DP_SHARDED : QT_DP_REPLICATED;
    pp->n_ranks = n_ranks ? n_ranks : 1;
    pp->zero = pp->dp == QT_DP_SHARDED ? cfg->parallel.zero : 0;
    pp->split = (qt_plan_split){.state = pp->zero >= 1, .grads = pp->zero >= 2, .weights = pp->zero >= 3};
    pp->comm = cfg->parallel.comm;
    pp->world_pieces = pp->nodes > 1 && pp->zero >= 1; /* the shard is the world's (qt_shard_init_nodes) */
}

void qt_plan_make(const qt_config *cfg, const qt_layout *L, int n_ranks, qt_plan *p) {
    memset(p, 0, sizeof *p);
    const qt_precision_cfg *pr = &cfg->precision;
    const qt_optim_cfg *oc = &cfg->optim;
    p->run = (qt_plan_batch){cfg->data.micro_batch, cfg->data.seq_len, cfg->data.grad_accum, cfg->path};
    p->optimizer = (qt_plan_optimizer){.beta1 = oc->beta1, .beta2 = oc->beta2, .eps = oc->eps,
                                       .weight_decay = oc->weight_decay, .grad_clip = oc->grad_clip,
                                       .decay_embeddings = oc->decay_embeddings, .seed = cfg->seed};
    p->precision = (qt_plan_precision){
        .fp8 = pr->matmul_dtype == QT_DT_E4M3, .grad_dt = (qt_dtype)pr->grad_dtype,
        .m_dt = pr->opt_m_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32, .v_dt = pr->opt_v_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32,
        .master_dt = pr->master_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32,
        .acc_dt = pr->grad_accum_dtype == QT_DT_BF16 ? QT_DT_BF16 : QT_DT_F32, .stochastic_rounding = pr->stochastic_rounding};
    p->precision.fp8_bwd = p->precision.fp8 && pr->grad_dtype != QT_DT_BF16;
    p->precision.persistent_quants = p->precision.fp8 && pr->persistent_quants;
    const qt_memory_cfg *mem = &cfg->memory;
    p->precision.fp8_cache = mem->fp8_weight_cache;
    int B = cfg->data.micro_batch;
    long N = (long)B * cfg->data.seq_len;
    p->acts = (qt_plan_acts){.recompute = mem->recompute, .redo = qt_act_redo_of(mem->recompute),
                             .offload_residual = (mem->offload & QT_OFF_RESIDUAL) != 0,
                             .host_wc = mem->host_alloc == QT_HOST_WRITE_COMBINED,
                             .fp8_bwd = p->precision.fp8_bwd && cfg->lora.rank <= 0, /* LoRA: the adapters read ln1, ln2, h */
                             .lm_chunks = mem->lmhead_chunks > 0 ? mem->lmhead_chunks : 1,
                             .attn_chunks = mem->attn_bwd_chunks < 1 ? 1 : mem->attn_bwd_chunks > B ? B : mem->attn_bwd_chunks};
    if (p->acts.lm_chunks > N) p->acts.lm_chunks = (int)N;
    p->perf.graphs = cfg->perf.cuda_graphs;
    p->perf.autotune = cfg->perf.matmul_autotune;
    p->perf.deterministic = cfg->perf.deterministic;
    p->memory = (qt_plan_memory){.host_wc = mem->host_alloc == QT_HOST_WRITE_COMBINED, .gpu_limit_gib = mem->gpu_limit_gib,
                                 .host_limit_gib = mem->host_limit_gib, .ckpt_offloaded = cfg->checkpoint.offloaded};
    p->lora = cfg->lora;
    p->dpo = cfg->objective == QT_OBJ_DPO;
    p->dpo_cfg = cfg->dpo;
    if (n_ranks < 0) return; /* no GPU ranks: nothing placed */
    ranks_of(cfg, n_ranks, &p->parallel);
    place(cfg, L, p);
}

size_t qt_plan_unit_align(const qt_plan *p) {
    const qt_plan_parallel *pp = &p->parallel;
    size_t world = pp->world_pieces ? (size_t)pp->n_ranks * (size_t)pp->nodes : pp->split.state ? (size_t)pp->n_ranks : 1;
    return QT_LAYOUT_ALIGN * world;
}

size_t qt_plan_unit_align_for(const qt_config *cfg, int n_ranks) {
    qt_plan p;
    memset(&p, 0, sizeof p);
    if (n_ranks >= 0) ranks_of(cfg, n_ranks, &p.parallel);
    return qt_plan_unit_align(&p);
}

int qt_plan_resolve(const qt_config *cfg, const qt_layout *L, int n_ranks, qt_plan *p, char *err, size_t errlen) {
    if (n_ranks >= 0 && check_ranks(cfg, n_ranks, err, errlen)) return -1;
    qt_plan_make(cfg, L, n_ranks, p);
    return 0;
}

int qt_act_recompute_resolve(int parts) {
    if (parts & QT_RC_BLOCK) parts |= QT_RC_ATT | QT_RC_FFN | QT_RC_NORM;
    if (parts & QT_RC_ATT) parts |= QT_RC_QKV;
    if (parts & QT_RC_FFN) parts |= QT_RC_SWIGLU;
    return parts;
}

qt_act_redo qt_act_redo_of(int parts) {
    int r = qt_act_recompute_resolve(parts);
    return (qt_act_redo){.norm = !!(r & QT_RC_NORM), .qkv = !!(r & QT_RC_QKV), .att = !!(r & QT_RC_ATT),
                         .block = !!(r & QT_RC_BLOCK), .ffn = !!(r & QT_RC_FFN), .swiglu = !!(r & QT_RC_SWIGLU),
                         .any = r != 0};
}

void qt_plan_acts_print(const qt_plan_acts *a) {
    char rc[64];
    printf("  memory.recompute: %s (one buffer for all layers, rebuilt before each layer's backward)\n",
           qt_act_recompute_names(qt_act_recompute_resolve(a->recompute), rc, sizeof rc));
    if (a->offload_residual) printf("  memory.offload_residual: layers' input residuals in host memory, 2 on the GPU\n");
}

const char *qt_act_recompute_names(int parts, char *buf, size_t cap) {
    static const char *const name[] = {"swiglu", "norm", "qkv", "att", "ffn", "block"};
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 6; i++)
        if (parts & (1 << i) && n < cap) n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name[i]);
    if (!parts) snprintf(buf, cap, "none");
    return buf;
}
