/* gpu_family.c — the GPU kernels of each model family (qt_gpu_family.h): the Llama/Qwen/Mistral set, and Gemma 3's
 * (1 + w) norms, GeGLU-tanh, scaled embedding, attention scalar and logit soft-cap (docs/models-gemma3.md). */
#include "qt_gpu_family.h"

#include "qt_ref.h"

qt_gpu_family qt_gpu_family_of(const qt_model_cfg *c) {
    qt_gpu_family f = {qt_rmsnorm_fwd, qt_rmsnorm_bwd, qt_qknorm_fwd, qt_qknorm_bwd, qt_swiglu_fwd, qt_swiglu_bwd,
                       qt_swiglu_bwd_h, qt_fp8_swiglu_bwd_requant, 1.0f, 0.0f, 0.0f};
    if (!qt_model_is_gemma(c)) return f;
    f = (qt_gpu_family){qt_rmsnorm1p_fwd, qt_rmsnorm1p_bwd, qt_qknorm1p_fwd, qt_qknorm1p_bwd, qt_geglu_fwd,
                        qt_geglu_bwd, qt_geglu_bwd_h, qt_fp8_geglu_bwd_requant,
                        qt_ref_embed_scale(c->hidden_size, 1), 0.0f, c->logit_softcap};
    if (c->attn_scalar > 0) f.attn_scale = (float)qt_model_attn_scale(c);
    return f;
}
