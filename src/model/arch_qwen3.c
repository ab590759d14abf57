/*
 * arch_qwen3.c — qwen3 (dense): the dense layer with per-head RMSNorm of queries and keys before
 * RoPE (QK-norm), NeoX RoPE.
 */
#include "model_int.h"

const kvt_arch_ops kvt_arch_qwen3 = {
    .name = "qwen3",
    .rope_neox = true,
    .layer_tensors = KVT_LT_QK_NORM,
    .batches = true,
};
