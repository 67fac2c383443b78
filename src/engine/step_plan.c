/* step_plan.c — the step plan from the config and the rank's place (see qt_step_plan.h). */
#include "qt_step_plan.h"

#include <string.h>

#include "qt_dtype.h"
#include "qt_gpu_model.h"

void qt_step_plan_make(qt_step_plan *p, const qt_layout *L, const qt_config *cfg, int n_ranks, int rank, int sharded) {
    memset(p, 0, sizeof *p);
    p->dp = n_ranks == 0 ? QT_DP_ONE : sharded && n_ranks > 1 ? QT_DP_SHARDED : QT_DP_REPLICATED;
    p->n_ranks = n_ranks ? n_ranks : 1;
    p->zero = p->dp == QT_DP_SHARDED ? cfg->parallel.zero : 0;
    p->rank = rank;
    p->offload_opt = cfg->memory.offload_optimizer;
    p->opt_mask = qt_config_opt_offload_mask(cfg);
    p->zero_copy = p->offload_opt && cfg->memory.zero_copy;
    p->host_wc = cfg->memory.host_alloc == QT_HOST_WRITE_COMBINED;
    p->weights_host = p->dp == QT_DP_ONE && (cfg->memory.offload & QT_OFF_WEIGHTS) != 0; /* ranks: weights_shard_host */
    p->wslots = p->zero >= 3 || p->weights_host;
    int quants = qt_config_offload_quants(cfg);
    p->gather_e4m3 = cfg->precision.matmul_dtype == QT_DT_E4M3 &&
                     ((p->zero >= 3 && (cfg->parallel.gather_dtype == QT_DT_E4M3 || quants)) || (p->weights_host && quants));
    p->grads_host = p->dp == QT_DP_ONE && (cfg->memory.offload & QT_OFF_GRADIENTS) != 0;
    p->weights_shard_host = p->zero >= 3 && (cfg->memory.offload & QT_OFF_WEIGHTS) != 0; /* else refused (setup.c) */
    p->grads_shard_host = p->zero >= 2 && (cfg->memory.offload & QT_OFF_GRADIENTS) != 0;
    p->overlap = p->dp != QT_DP_ONE && cfg->parallel.overlap_comm;
    p->grads_sharded = p->zero >= 2;
    p->opt_ahead = p->dp == QT_DP_ONE && p->offload_opt;
    p->weights_ahead = (p->dp == QT_DP_SHARDED && p->overlap) || p->opt_ahead;
    p->side_stream = p->dp != QT_DP_ONE || p->opt_ahead || p->weights_host || p->grads_host;
    p->lookups = p->dp == QT_DP_SHARDED && qt_gpu_model_lookups_pay(L, cfg, n_ranks);
    /* bf16 gradients cross in bf16 already: no comm buffer to cast them into */
    p->reduce_bf16 = p->dp != QT_DP_ONE && cfg->parallel.reduce_dtype == QT_DT_BF16 && cfg->precision.grad_accum_dtype != QT_DT_BF16;
    p->graphs = cfg->perf.cuda_graphs;
    p->fp8 = cfg->precision.matmul_dtype == QT_DT_E4M3;
    p->persistent_quants = p->fp8 && cfg->precision.persistent_quants;
}
