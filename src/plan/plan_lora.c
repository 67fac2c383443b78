/* plan_lora.c — memory.plan: auto's predicted step of a LoRA run on the GPU: the frozen base's forward and
 * data-gradient backward, the adapters' thin products, an NF4 base's per-layer dequantizes, a streamed base's
 * per-layer copies over PCIe (qt_plan_auto.h, docs/memory.md "memory.plan: auto").
 *
 * The base has no weight gradient and no optimizer state: per token its block matmuls cost 2 x params in the
 * forward (at the e4m3 rate with fp8 matmuls) and 2 x params in the backward (the dgrad: bf16, or e4m3 with fp8
 * matmuls and precision.grad_dtype e4m3 / e5m2, whose output gradients are quantized first: one more pass over
 * each), the LM head 4 x V x C (bf16), attention its forward and backward as in full fine-tuning. The
 * adapter kernels (cuda/lora.cu) are memory-bound passes over x, y, dy and dx: charged by their bytes at
 * QT_PLAN_LORA_ADAPTER_EFF of the elementwise rate (measured). Rates, efficiency and overlap are otherwise the full
 * fine-tuning model's (plan_auto.c). */
#include <stdio.h>

#include "qt_error.h"
#include "qt_lora.h"
#include "qt_plan.h"
#include "qt_plan_auto.h"

/* A layer's adapter bytes per token (cuda/lora.cu's GEMMs, bf16 operands): the forward's down product reads x
 * (2 in) and writes u (2 r), its up product reads u (2 r) and adds into y's columns (4 out); the backward's g = dy B
 * reads dy (2 out) and writes g (2 r), dB reads dy and u (2 out + 2 r), dA reads x and g (2 in + 2 r), dx reads g
 * and adds into dx (4 in + 2 r). */
typedef struct {
    double fwd[4], bwd; /* forward bytes per site, backward bytes of all sites */
} adapter_bytes;

static adapter_bytes layer_bytes(const qt_lora_layout *A) {
    adapter_bytes b = {{0}, 0};
    double r = A->cfg.rank;
    for (int i = 0; i < A->per_layer; i++) { /* layer 0's modules: every layer has the same */
        const qt_lora_module *m = &A->mods[i];
        b.fwd[m->site] += 2.0 * m->in + 4.0 * m->out + 4 * r;
        b.bwd += 6.0 * m->in + 4.0 * m->out + 8 * r;
    }
    return b;
}

/* The block matmul parameters of one layer whose forward the recompute runs again (the matmuls block_run redoes). */
static double redo_params(const qt_model_cfg *c, int rc) {
    double C = c->hidden_size, F = c->intermediate_size, HD = (double)c->num_heads * c->head_dim;
    double QKV = HD + 2.0 * c->num_kv_heads * c->head_dim;
    return (rc & QT_RC_QKV ? C * QKV : 0) + (rc & QT_RC_BLOCK ? HD * C : 0) + (rc & QT_RC_FFN ? 2 * C * F : 0);
}

qt_plan_cost qt_plan_auto_lora_cost_parts(const qt_layout *L, const qt_config *cfg, const qt_probe *pr) {
    const qt_model_cfg *c = &L->cfg;
    double T = cfg->data.seq_len, n = (double)cfg->data.micro_batch * T, ga = cfg->data.grad_accum, tok = n * ga;
    double C = c->hidden_size, HD = (double)c->num_heads * c->head_dim, nl = c->num_layers, V = c->vocab_size;
    int rc = qt_act_recompute_resolve(cfg->memory.recompute), fp8 = cfg->precision.matmul_dtype == QT_DT_E4M3;
    int fp8_dgrad = fp8 && cfg->precision.grad_dtype != QT_DT_BF16;
    int dpo = cfg->objective == QT_OBJ_DPO; /* one more forward per micro-step: the reference, adapters off */
    double blocks = qt_plan_auto_block_params(c), lm = V * C;
    double attn = qt_model_flops_per_token(c, cfg->data.seq_len) - 6 * (blocks + lm); /* forward 1/3, backward 2/3 */
    double fwd_rate = fp8 ? pr->fp8_flops : pr->bf16_flops, eff = n / (n + 512);
    double redo = nl * redo_params(c, rc), redo_att = rc & QT_RC_ATT ? nl * 2 * T * HD : 0;
    qt_plan_cost k = {0};
    /* matmuls: the forward (twice with DPO) and the recomputed parts at the forward's rate, the dgrad at the
     * gradients' (fp8_dgrad: the forward's), the LM head and attention in bf16 */
    double dgrad = 2 * blocks, mm_fwd = (1 + dpo) * 2 * blocks + 2 * redo + (fp8_dgrad ? dgrad : 0);
    double mm_bf16 = (fp8_dgrad ? 0 : dgrad) + (4 + 2 * dpo) * lm + attn * (1 + dpo / 3.0) + redo_att +
                     (cfg->lora.trainable & QT_LORA_X_LM_HEAD ? 2 * lm : 0); /* a trained LM head's weight gradient */
    k.compute = tok * (mm_fwd / fwd_rate + mm_bf16 / pr->bf16_flops) / eff;
    /* elementwise passes as full fine-tuning's (a bf16 backward), the adapters' bytes and the fp8 weights' quantize
     * passes with memory.fp8_weight_cache none (the forward's, the recomputed matmuls' again, fp8_dgrad's Wq^T), at HBM */
    char err[256];
    qt_lora_layout A;
    QT_CHECK(qt_lora_layout_init(&A, &cfg->lora, c, err, sizeof err) == 0, "%s", err); /* validated with the config */
    adapter_bytes ab = layer_bytes(&A);
    size_t an = A.numel;
    qt_lora_layout_free(&A);
    for (int i = 0; i < L->n_tensors; i++) /* lora.trainable's base tensors: AdamW and the ranks' sum like the adapters */
        an += qt_lora_trains(&L->tensors[i], cfg->lora.trainable) ? L->tensors[i].numel : 0;
    double adapt = ab.bwd + (1 + dpo) * (ab.fwd[0] + ab.fwd[1] + ab.fwd[2] + ab.fwd[3]) +
                   (rc & QT_RC_QKV ? ab.fwd[QT_LORA_SITE_QKV] : 0) + (rc & QT_RC_BLOCK ? ab.fwd[QT_LORA_SITE_O] : 0) +
                   (rc & QT_RC_FFN ? ab.fwd[QT_LORA_SITE_GU] : 0);
    double elem_bps = qt_plan_auto_elem_bps(pr);
    k.compute += tok * (qt_plan_auto_elem_bytes(L, cfg) + nl * adapt / QT_PLAN_LORA_ADAPTER_EFF) / elem_bps;
    if (fp8 && cfg->memory.fp8_weight_cache == QT_FP8_WCACHE_NONE)
        k.compute += ga * ((1 + dpo) * blocks + (fp8_dgrad ? blocks : 0) + redo) * 3 / elem_bps;
    /* fp8_dgrad: each block matmul's output gradient quantized (bf16 read, e4m3 written: 3 B per element; its abs-max
     * comes from the kernel that made it) */
    double outs = HD + 2.0 * c->num_kv_heads * c->head_dim + 2 * C + 2.0 * c->intermediate_size; /* qkv, o, gate|up, down */
    if (fp8_dgrad) k.compute += tok * nl * 3 * outs / elem_bps;
    /* lora.base_dtype nf4: each block dequantized into its bf16 slot before its forward and its backward (the
     * forward's last two stay for the backward's first two): codes, scales read, bf16 written. On the base's own
     * stream beside the previous block's ops, each forward's first one excepted: the rest costs
     * QT_PLAN_OVERLAP_ALPHA of itself, as side copies do */
    double fwds = 1 + dpo, all = fwds * nl + nl - 2; /* the layer fills of a micro-step */
    if (cfg->lora.base_nf4 && nl >= 2) {
        double layer_s = blocks / nl * QT_PLAN_NF4_BYTES / (QT_PLAN_NF4_HBM_FRAC * pr->hbm_bps);
        k.compute += ga * layer_s * (fwds + QT_PLAN_OVERLAP_ALPHA * (all - fwds));
    }
    /* memory.offload: [weights]: every fill first copies its block's matrices up from pinned host memory (NF4: codes
     * and scales, QT_PLAN_NF4_STREAM_BYTES per weight; bf16: 2), beside the compute */
    if ((cfg->memory.offload & QT_OFF_WEIGHTS) && nl >= 2)
        k.pcie_micro_bytes += ga * all * blocks / nl * (cfg->lora.base_nf4 ? QT_PLAN_NF4_STREAM_BYTES : 2.0);
    /* once per step: AdamW over the fp32 adapters (a, g, m, v read, a, m, v written, g zeroed), and with ranks the
     * gradients' sum through host memory, rank by rank: each rank's down and the sum up (4 B each way) */
    int ranks = cfg->parallel.devices.n ? cfg->parallel.devices.n : cfg->parallel.gpus;
    k.once += (double)an * 4 * 8 / elem_bps;
    if (ranks > 1) k.pcie_once_bytes += (double)ranks * 2 * 4 * an;
    int ac = cfg->memory.attn_bwd_chunks < cfg->data.micro_batch ? cfg->memory.attn_bwd_chunks : cfg->data.micro_batch;
    k.once += ga * 10e-6 * (3.0 * (cfg->memory.lmhead_chunks - 1) + nl * (ac - 1));
    k.once += k.pcie_once_bytes / pr->pcie_bps;
    k.pcie_micro = k.pcie_micro_bytes / pr->pcie_bps;
    return k;
}
