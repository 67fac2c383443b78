/* plan_cost.c — memory.plan: auto's cost of a full fine-tuning step (qt_plan_auto.h): the matmuls at the probed
 * rates, the elementwise passes, what crosses PCIe per micro-step and per step; and the pieces the LoRA step
 * (plan_lora.c) shares. */
#include "qt_plan_auto.h"

#include "qt_comm.h"
#include "qt_plan.h"

double qt_plan_auto_block_params(const qt_model_cfg *c) {
    double C = c->hidden_size, HD = (double)c->num_heads * c->head_dim;
    double QKV = HD + 2.0 * c->num_kv_heads * c->head_dim;
    return (double)c->num_layers * (C * QKV + HD * C + 3 * C * (double)c->intermediate_size);
}

double qt_plan_auto_elem_bytes(const qt_layout *L, const qt_config *cfg) {
    const qt_model_cfg *c = &L->cfg;
    double C = c->hidden_size, F = c->intermediate_size, nl = c->num_layers;
    int rc = qt_act_recompute_resolve(cfg->memory.recompute);
    /* the recompute's elementwise passes, bytes per token: RMSNorm reads and writes [C] bf16 per norm; the
     * SwiGLU backward, which reads gate|up anyway, also writes h (2F) for down's wgrad. An fp8 backward
     * (block_run) rebuilds ln1 / ln2 only as the input of a recomputed qkv / gate|up (norm listed or not),
     * and its SwiGLU backward writes down's e4m3 Xq^T instead (F). LoRA's is the bf16 backward's in either case:
     * its adapters read ln1, ln2 and h. */
    int fp8_bwd = cfg->precision.matmul_dtype == QT_DT_E4M3 && cfg->precision.grad_dtype != QT_DT_BF16 && cfg->lora.rank <= 0;
    double norm_b = fp8_bwd ? ((rc & QT_RC_QKV ? 4 : 0) + (rc & QT_RC_FFN ? 4 : 0)) * C : (rc & QT_RC_NORM ? 8 * C : 0);
    double elem = nl * (norm_b + (rc & QT_RC_SWIGLU ? (fp8_bwd ? 1 : 2) * F : 0));
    /* the elementwise and fp8 quantize passes of every step, as bf16 [tokens, C + F] passes per layer */
    int passes = QT_PLAN_ELEM_PASSES + (cfg->precision.matmul_dtype == QT_DT_E4M3 ? QT_PLAN_ELEM_PASSES_FP8 : 0);
    elem += nl * (C + F) * 2 * passes;
    /* qk_norm: bf16 passes over the q|k heads [(H + Hkv) D] per layer: the forward reads them and writes them and
     * their saved copy (3, again with a recomputed qkv), the backward's dw pass reads dy and x, its dx pass dy, x
     * and writes dx (5) */
    if (c->qk_norm)
        elem += nl * (double)(c->num_heads + c->num_kv_heads) * c->head_dim * 2 * (8 + (rc & QT_RC_QKV ? 3 : 0));
    /* post-norms (Gemma's sandwich): two more norms per layer, bf16 [C] passes: each forward reads and writes (2),
     * each backward zeroes dx, reads dy and x, writes dx (4); recompute block runs the attention one again (2) */
    if (L->layers[0].post_attn != SIZE_MAX) elem += nl * C * 2 * (12 + (rc & QT_RC_BLOCK ? 2 : 0));
    return elem;
}

double qt_plan_auto_elem_bps(const qt_probe *pr) { return pr->hbm_bps < QT_PLAN_ELEM_BPS ? pr->hbm_bps : QT_PLAN_ELEM_BPS; }

qt_plan_cost qt_plan_auto_full_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    const qt_model_cfg *c = &L->cfg;
    double T = cfg->data.seq_len, n = (double)cfg->data.micro_batch * T, tok = n * cfg->data.grad_accum;
    double C = c->hidden_size, F = c->intermediate_size, HD = (double)c->num_heads * c->head_dim;
    double QKV = HD + 2.0 * c->num_kv_heads * c->head_dim, nl = c->num_layers, V = c->vocab_size;
    int rc = qt_act_recompute_resolve(cfg->memory.recompute);
    double lm = 6 * V * C, blocks = qt_model_flops_per_token(c, cfg->data.seq_len) - lm;
    double redo = nl * ((rc & QT_RC_QKV ? 2 * C * QKV : 0) + (rc & QT_RC_ATT ? 2 * T * HD : 0) +
                        (rc & QT_RC_BLOCK ? 2 * HD * C : 0) + (rc & QT_RC_FFN ? 4 * C * F : 0));
    double rate = cfg->precision.matmul_dtype == QT_DT_E4M3 ? pr->fp8_flops : pr->bf16_flops;
    double eff = n / (n + 512); /* small micro-batches: smaller, less efficient matmuls */
    double lm_rows = n / (cfg->memory.lmhead_chunks > 1 ? cfg->memory.lmhead_chunks : 1);
    double lm_eff = lm_rows / (lm_rows + QT_PLAN_LM_ROWS); /* the LM head's dgrad + wgrad per chunk */
    qt_plan_cost k = {0};
    k.compute = tok * ((blocks + redo) / rate + lm / 3 / pr->bf16_flops) / eff + tok * lm * 2 / 3 / pr->bf16_flops / lm_eff;
    double elem_bps = qt_plan_auto_elem_bps(pr);
    k.compute += tok * qt_plan_auto_elem_bytes(L, cfg) / elem_bps;
    if (cfg->memory.offload & QT_OFF_OPTIMIZER) {
        int off = qt_config_opt_offload_mask(cfg); /* the offloaded arrays of master, m, v */
        double es = (off & QT_OFF_MASTER && cfg->precision.master_dtype != QT_DT_BF16 ? 4 : 0) +
                    (off & QT_OFF_M ? (cfg->precision.opt_m_dtype == QT_DT_BF16 ? 2 : 4) : 0) +
                    (off & QT_OFF_V ? (cfg->precision.opt_v_dtype == QT_DT_BF16 ? 2 : 4) : 0);
        k.pcie_once_bytes += (1 + QT_PLAN_DUPLEX) * (double)L->numel * es; /* up and down once per step, half overlapped */
    }
    /* memory.offload_residual: each micro-step moves (layers - 2) bf16 residuals [B*T, C] down in the
     * forward and up in the backward, on copy streams beside the compute */
    if ((cfg->memory.offload & QT_OFF_RESIDUAL) && nl > 2)
        k.pcie_micro_bytes += cfg->data.grad_accum * 2 * (nl - 2) * n * C * 2;
    /* memory.fp8_weight_cache: none: the block weights are quantized again before each layer's forward and
     * its backward: per pass, 2 B/param read (bf16) and 1 B/param written (e4m3), at the HBM rate */
    if (cfg->memory.fp8_weight_cache == QT_FP8_WCACHE_NONE && cfg->precision.matmul_dtype == QT_DT_E4M3)
        k.compute += cfg->data.grad_accum * 2 * qt_plan_auto_block_params(c) * 3 / elem_bps;
    /* bf16 master weights / gradients cost nothing here: the same matmuls. parallel.zero 3 gathers every
     * layer's bf16 weights (the flat span of the layers, 2 B/param) twice per micro-step, before its forward
     * and its backward: charged at the PCIe rate as if every byte crossed ((n-1)/n do) and nothing overlapped
     * (an upper bound; ZeRO-1/2's one gather of all weights per step is not charged either way) */
    int quants = qt_config_offload_quants(cfg);
    if (cfg->parallel.zero >= 3) /* e4m3 gathers (or quants): the layers' codes, 1 B/param (the norms and biases: few) */
        k.pcie_once_bytes += cfg->data.grad_accum * 2 * (double)(L->final_norm - L->layers[0].ln1) *
                             (cfg->parallel.gather_dtype == QT_DT_E4M3 || quants ? 1 : 2);
    /* memory.offload: [weights] (one GPU): the layers' bf16 weights copied up twice per micro-step (before
     * each layer's forward and backward, prefetched beside the compute), and once per step the embedding
     * and LM-head buckets, AdamW's bf16 writes (2 B/param down) and the finiteness count's reads (2 B/param
     * up) of the host array, plus a bf16 master's reads (2 B/param up) */
    int ranks = cfg->parallel.devices.n ? cfg->parallel.devices.n : cfg->parallel.gpus;
    double mine = ranks > 1 && cfg->parallel.zero >= 1 ? (double)L->numel / ranks : (double)L->numel; /* a rank's state */
    if (cfg->memory.offload & QT_OFF_WEIGHTS) { /* ZeRO-3 ranks: the gathers read the host pieces, charged above */
        double span = (double)(L->final_norm - L->layers[0].ln1), rest = (double)L->numel - span;
        /* quants: the layers' e4m3 codes copied up (1 B/param), made once per step from the host weights
         * (2 B/param read, 1 written, through the mapping) */
        k.pcie_micro_bytes += (cfg->parallel.zero >= 3 ? 0 : cfg->data.grad_accum * 2 * span * (quants ? 1 : 2));
        k.pcie_once_bytes += (rest * 2 + mine * 2 * 2 + (cfg->precision.master_dtype == QT_DT_BF16 ? mine * 2 : 0)) +
                             (quants ? span / (cfg->parallel.zero >= 3 ? ranks : 1) * 3 : 0);
    }
    /* memory.offload: [gradients] (one GPU): each micro-step stores every bucket's gradients to host and,
     * but the first, loads them first (4 B/param each way, bf16 2, beside the compute; an upper bound: the
     * embedding and LM-head buckets keep theirs on the GPU within a step); the norm and AdamW read them
     * and the zeroing writes them once per step (3 x 4 or 2 B/param) */
    if ((cfg->memory.offload & QT_OFF_GRADIENTS) && cfg->parallel.zero < 2) {
        double ge = cfg->precision.grad_accum_dtype == QT_DT_BF16 ? 2 : 4; /* bf16 gradients: half the bytes */
        k.pcie_micro_bytes += (double)L->numel * ge * (2.0 * cfg->data.grad_accum - 1);
        k.pcie_once_bytes += (double)L->numel * ge * 3;
    }
    /* memory.offload: [gradients] with ZeRO-2/3 ranks: each micro-step's summed piece is added into the
     * rank's host shard (brought up and written back by the copy engines, 8 B per shard element; the first
     * micro-step's only written back: the shard's clearing is a mark, qt_host_shard.h), and the norm and
     * AdamW read the shard once per step (2 x 4 B) */
    if ((cfg->memory.offload & QT_OFF_GRADIENTS) && cfg->parallel.zero >= 2)
        k.pcie_once_bytes += mine * (8.0 * cfg->data.grad_accum + 4);
    /* Gradient sums through host memory (parallel.comm host / host_wc: boards without P2P): each GPU moves
     * (n-1)/n of the gradients (4 B/param, 2 with reduce_dtype bf16) per sum, once per step with ZeRO-0/1
     * but every micro-step with ZeRO-2/3 (they reduce-scatter as the backward goes); charged at the
     * PCIe rate as if not overlapped. Calibration: 7B fp8 on 4 x H200 held to 24 GiB, host, ZeRO-3,
     * 16 micro-steps: 29,594 tokens/s predicted without this term, 21,563 with it (from the same probe),
     * 24,682 measured. Peer transports (NVLink) and auto are not charged. */
    if (ranks > 1 && (cfg->parallel.comm == QT_COMM_HOST || cfg->parallel.comm == QT_COMM_HOST_WC)) {
        double sums = cfg->parallel.zero >= 2 ? cfg->data.grad_accum : 1;
        int half = cfg->parallel.reduce_dtype == QT_DT_BF16 || cfg->precision.grad_accum_dtype == QT_DT_BF16; /* bf16 sums */
        k.pcie_once_bytes += sums * (ranks - 1.0) / ranks * (double)L->numel * (half ? 2 : 4);
    }
    int ac = cfg->memory.attn_bwd_chunks < cfg->data.micro_batch ? cfg->memory.attn_bwd_chunks : cfg->data.micro_batch;
    k.once += cfg->data.grad_accum * 10e-6 * (3.0 * (cfg->memory.lmhead_chunks - 1) + nl * (ac - 1));
    k.pcie_micro = k.pcie_micro_bytes / pr->pcie_bps;
    k.once += k.pcie_once_bytes / pr->pcie_bps;
    return k;
}
