/*
 * arch_list.h — the architecture registry: one line per supported architecture.
 *
 * KVT_ARCH_ENTRY(ID, value, ops) names the kvt_arch enumerator KVT_ARCH_<ID> (model.h; the value
 * is part of the public enum and stays fixed) and the kvt_arch_ops table that model/arch_*.c
 * defines for it (model_int.h). Includers define KVT_ARCH_ENTRY before including this file; it
 * is undefined at the end. Adding an architecture: write model/arch_<name>.c with its ops table
 * and add its line here (docs/models.md "Adding an architecture").
 */
KVT_ARCH_ENTRY(LLAMA, 1, kvt_arch_llama)
KVT_ARCH_ENTRY(QWEN2, 2, kvt_arch_qwen2)
KVT_ARCH_ENTRY(QWEN3, 3, kvt_arch_qwen3)
KVT_ARCH_ENTRY(GEMMA3, 4, kvt_arch_gemma3)
KVT_ARCH_ENTRY(QWEN3MOE, 5, kvt_arch_qwen3moe)   /* qwen3 attention + MoE FFN (moe.c) */
KVT_ARCH_ENTRY(DEEPSEEK2, 6, kvt_arch_deepseek2) /* MLA attention (mla.c) + MoE FFN with shared experts */
KVT_ARCH_ENTRY(QWEN35, 7, kvt_arch_qwen35)       /* hybrid gated DeltaNet + gated attention */
#undef KVT_ARCH_ENTRY
