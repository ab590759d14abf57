/*
 * arch_llama.c — llama (Llama 2/3 and the models that reuse its layout): the dense layer of
 * model.c as it is, RoPE on adjacent pairs, llama3's optional rope_freqs.weight factors.
 */
#include "model_int.h"

const kvt_arch_ops kvt_arch_llama = {
    .name = "llama",
    .rope_neox = false,
    .rope_freqs = true,
    .batches = true,
};
