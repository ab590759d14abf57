/*
 * arch_qwen2.c — qwen2: the dense layer with biases on the Q, K and V projections, NeoX RoPE.
 */
#include "model_int.h"

const kvt_arch_ops kvt_arch_qwen2 = {
    .name = "qwen2",
    .rope_neox = true,
    .layer_tensors = KVT_LT_QKV_BIAS,
    .batches = true,
};
