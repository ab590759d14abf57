/*
 * arch_qwen3moe.c — qwen3moe (Qwen3-30B-A3B family): qwen3's attention (QK-norm, NeoX RoPE) with a
 * mixture-of-experts FFN (moe.c) in every layer after the leading dense ones. Softmax routing with
 * the top-k weights normalized unless expert_weights_norm says otherwise (docs/models.md).
 *
 * Batching: MoE is row-wise like the dense FFN, but there is no test model to check batch
 * invariance against, so items run one after another until there is one.
 */
#include "model_int.h"

static kvt_status qwen3moe_hparams(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen) {
    (void)hd_v;
    return kvt_moe_hparams_load(g, hp, true, err, errlen);
}

const kvt_arch_ops kvt_arch_qwen3moe = {
    .name = "qwen3moe",
    .rope_neox = true,
    .hparams = qwen3moe_hparams,
    .layer_tensors = KVT_LT_QK_NORM,
    .load_layer = kvt_moe_load_layer,
    .batches = false,
};
