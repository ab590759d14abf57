/*
 * arch_deepseek2.c — deepseek2 (DeepSeek-V2 / V2-Lite / V3 family): multi-head latent attention
 * (mla.c) in every layer, whose cache holds one latent row per token (KVT_KIND_MLA), and a
 * mixture-of-experts FFN with shared experts (moe.c) after the leading dense layers. RoPE on
 * adjacent pairs, optionally YaRN-scaled; key and value head sizes differ (mla.c checks them).
 * The top-k expert weights are not normalized unless expert_weights_norm says so.
 *
 * Batching: none (per item), the latent attention's prefill setup is per sequence.
 */
#include <stdlib.h>

#include "model_int.h"

static kvt_status deepseek2_hparams(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen) {
    kvt_status st = kvt_moe_hparams_load(g, hp, false, err, errlen);
    return st != KVT_OK ? st : kvt_mla_hparams_load(g, hp, hd_v, err, errlen);
}

static kvt_status deepseek2_load_layer(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_layer_w *w, char *err,
                                       size_t errlen) {
    if (!(w->mla = calloc(1, sizeof *w->mla))) return KVT_ERR_NOMEM;
    kvt_status st = kvt_mla_load(m, g, il, w->mla, err, errlen);
    return st != KVT_OK ? st : kvt_moe_load_layer(m, g, il, w, err, errlen);
}

static kvt_status deepseek2_layer_kinds(const kvt_model *m, const kvt_gguf *g, uint8_t *kind, char *err,
                                        size_t errlen) {
    for (uint32_t il = 0; il < kvt_model_hparams(m)->n_layer; il++) kind[il] = KVT_KIND_MLA;
    return KVT_OK;
}

const kvt_arch_ops kvt_arch_deepseek2 = {
    .name = "deepseek2",
    .rope_neox = false,
    .rope_yarn = true,
    .kv_dims_differ = true,
    .hparams = deepseek2_hparams,
    .load_layer = deepseek2_load_layer,
    .layer_kinds = deepseek2_layer_kinds,
    .batches = false,
};
