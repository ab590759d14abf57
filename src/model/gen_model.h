/*
 * gen_model.h — deterministic random-weight GGUF model generator (`kvtier gen-model`).
 *
 * Writes a complete, loadable GGUF v3 model for llama / qwen2 / qwen3 / gemma3 / qwen35 / qwen3moe /
 * deepseek2 (mixture of experts, latent attention) with a real shape
 * (or a tiny test shape), random weights from a seeded splitmix64 stream (same options → same
 * bytes), and a real vocabulary copied from a vocab GGUF (tokenizer.* keys verbatim): the one given,
 * else the repository's data/vocab/ggml-vocab-gpt-2.gguf (an error when none is found), or a
 * 256-token byte vocabulary only when asked for (byte_vocab). Each tensor's values depend only on
 * (seed, tensor name), and tensors are generated one at a time while the file is written, so
 * memory stays at one tensor even for 1B-parameter shapes.
 *
 * Ownership: stateless; everything passed in is borrowed for the duration of the call.
 */
#ifndef KVT_GEN_MODEL_H
#define KVT_GEN_MODEL_H

#include "../util/common.h"

typedef struct kvt_gen_model_opts {
    const char *arch;       /* kvt_gen_model_archs; NULL = the shape's own arch */
    const char *shape;      /* kvt_gen_model_shapes ("tiny", "qwen3moe-30b-a3b", ...) */
    const char *type;       /* kvt_gen_model_types ("f16", "q8_0", "q4_k", ...; NULL = f16) */
    uint32_t n_layers;      /* 0 = the shape's own layer count; else this many (1..512) */
    const char *vocab_path; /* vocab GGUF; NULL = ggml-vocab-gpt-2.gguf in kvt_vocab_dir() */
    uint64_t seed;
    bool byte_vocab;        /* skip the vocab search: use the 256-token byte vocabulary */
    bool peaked;            /* scale the final norm (x8) and Q/K (x2 each) so logits and attention are
                             * as peaked as a trained model's (gen_model.c peak_factor) */
    uint32_t k_outliers;    /* 0 = off; else 2..64: the K projection rows of each KV head's
                             * lowest-frequency RoPE pair are scaled by this factor, giving the key
                             * outlier channels trained models have (gen_model.c; not for deepseek2) */
    bool f16_full;          /* F16 tensors at full f16 precision; default: values of a bf16 checkpoint
                             * (every F16 value exactly a bf16), as an F16 GGUF converted from a bf16
                             * Hugging Face model holds */
} kvt_gen_model_opts;

/* Generates the model into out_path (atomic: tmp + rename). One-line error in err on failure. */
kvt_status kvt_gen_model(const kvt_gen_model_opts *o, const char *out_path, char *err, size_t errlen);

/* The vocabulary folder: $KVT_VOCAB_DIR when set (used as given), else the first data/vocab found
 * beside the executable's folder or one or two levels above it (/proc/self/exe: build/kvtier and
 * build/tests/test_* both find <repo>/data/vocab); never relative to the working directory. Writes
 * the path into buf; returns false (buf = "" unless from the environment) if it is not there. */
bool kvt_vocab_dir(char *buf, size_t buflen);

/* Exposed for tests: the weight type a 2-D tensor with rows of n0 elements gets when `want` was
 * asked for (llama-quantize fallback: Q4_K→Q5_0, Q5_K→Q5_1, Q6_K→Q8_0, else F16), and the llama3
 * rope_freqs value for pair i (factor 32, low 1, high 4, original context 8192). */
uint32_t kvt_gen_model_pick_type(uint32_t want, int64_t n0);
float kvt_gen_model_llama3_factor(float base, uint32_t n_rot, uint32_t i);

/* Names accepted by the options (for --help and validation). */
extern const char *const kvt_gen_model_shapes[];  /* NULL-terminated */
extern const char *const kvt_gen_model_types[];   /* NULL-terminated */
extern const char *const kvt_gen_model_archs[];   /* NULL-terminated */

#endif
