/*
 * arch_gemma3.c — gemma3: the dense layer with QK-norm, post-attention and post-FFN norms, GELU
 * (tanh) FFN, embeddings scaled by sqrt(n_embd) and the softmax scale applied to the queries.
 *
 * Sliding-window attention: a window layer (KVT_KIND_WINDOW) sees the last n_swa positions
 * (attention.sliding_window, 512 when absent) and rotates with the local RoPE base
 * (rope_base_swa). Which layers are window layers is read from attention.sliding_window_pattern:
 * either a period p (layer il is a window layer iff il % p < p - 1, i.e. p - 1 window layers then
 * one global one) or one boolean per layer (true: window). Without the key, the family's period
 * of 6 applies.
 */
#include "model_int.h"

#define GEMMA3_SWA_PERIOD 6 /* five window layers, then one global (the Gemma 3 family) */

static kvt_status gemma3_hparams(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen) {
    (void)hd_v;
    const char *key = "gemma3.attention.sliding_window";
    if (!kvt_gguf_get_u32(g, key, &hp->n_swa)) {
        KVT_WARN("gemma3 model without %s: assuming 512", key);
        hp->n_swa = 512;
    }
    if (hp->n_swa == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "sliding_window is 0");
    return KVT_OK;
}

static kvt_status gemma3_layer_kinds(const kvt_model *m, const kvt_gguf *g, uint8_t *kind, char *err,
                                     size_t errlen) {
    const uint32_t L = kvt_model_hparams(m)->n_layer;
    const char *key = "gemma3.attention.sliding_window_pattern";
    uint32_t period = GEMMA3_SWA_PERIOD;
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &period)) {
        kvt_gguf_vtype et;
        uint64_t n;
        const void *data;
        if (!kvt_gguf_get_arr(g, key, &et, &n, &data) || et != KVT_GGUF_BOOL || n != L)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: expected a period or %u booleans", key, L);
        for (uint32_t il = 0; il < L; il++) kind[il] = ((const uint8_t *)data)[il] ? KVT_KIND_WINDOW : KVT_KIND_FULL;
        return KVT_OK;
    }
    if (period == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: period 0", key);
    for (uint32_t il = 0; il < L; il++) kind[il] = il % period < period - 1 ? KVT_KIND_WINDOW : KVT_KIND_FULL;
    return KVT_OK;
}

const kvt_arch_ops kvt_arch_gemma3 = {
    .name = "gemma3",
    .rope_neox = true,
    .hparams = gemma3_hparams,
    .layer_tensors = KVT_LT_QK_NORM | KVT_LT_POST_NORMS,
    .layer_kinds = gemma3_layer_kinds,
    .embd_scale = true,
    .q_prescale = true,
    .window_rope = true,
    .ffn_act = KVT_FFN_GELU_TANH,
    .batches = true,
};
