/*
 * quantize.h — `kvtier quantize`: rewrite a GGUF model's weights in another type (the work of
 * llama.cpp's llama-quantize), so a trained F16/BF16/F32 file can be served as Q8_0, Q4_K, …
 *
 * What is converted: tensors of two or more dimensions whose name ends in ".weight", except MoE
 * routers (ffn_gate_inp), recurrent-layer parameters (ssm_*) and RoPE tables (rope_freqs), which stay
 * as they are; 1-D tensors (norms, biases) stay as they are. Rows whose length is not a multiple
 * of the type's block take llama-quantize's fallback (kvt_gen_model_pick_type). The two mixes
 * follow llama-quantize's rules for Q4_K_M / Q5_K_M: output.weight in Q6_K; attn_v and ffn_down in
 * Q6_K on the layers use_more_bits picks (the first and last eighth and every third between), the
 * base type elsewhere. Quantization is kvt_quantize_ref (plain per-block min/max and absmax, not
 * llama-quantize's error-weighted search, so its perplexity can be slightly higher at 4 bits).
 *
 * Every metadata key is copied verbatim except general.file_type (set to llama.cpp's id of the
 * result) and general.quantization_version (set to 2). The input is untrusted (kvt_gguf_open
 * validates it); an already quantized input tensor is refused unless allow_requantize. The output
 * is written atomically (temporary file + rename, kvt_gguf_writer_finish) one tensor at a time, so
 * memory stays at one tensor's f32 rows plus its output; a failure leaves no output file.
 *
 * Ownership: the caller owns the paths and the options; nothing is kept after the call returns.
 */
#ifndef KVT_QUANTIZE_H
#define KVT_QUANTIZE_H

#include <stdio.h>

#include "../util/common.h"

typedef struct kvt_quantize_opts {
    const char *type;      /* kvt_quantize_types: "q8_0", "q4_k", "q4_k_m", "f16", ... */
    bool allow_requantize; /* accept quantized input tensors (dequantized, then quantized again) */
    FILE *progress;        /* a line per converted tensor, or NULL for none */
} kvt_quantize_opts;

/* NULL-terminated list of the accepted type names (for --help and validation). */
extern const char *const kvt_quantize_types[];

/* Counts of the last run, for the summary line and tests. */
typedef struct kvt_quantize_result {
    uint64_t n_tensors, n_converted, n_fallback; /* fallback: rows not a multiple of the block */
    uint64_t bytes_in, bytes_out;                /* tensor data bytes */
    uint32_t ftype;                              /* general.file_type written */
} kvt_quantize_result;

/* Converts in_path into out_path. KVT_ERR_INVALID_ARG for an unknown type or a requantization not
 * allowed, KVT_ERR_FORMAT / KVT_ERR_UNSUPPORTED for a bad input, KVT_ERR_IO for a failed write;
 * err gets one line naming the problem. res may be NULL. */
kvt_status kvt_quantize_model(const kvt_quantize_opts *o, const char *in_path, const char *out_path,
                              kvt_quantize_result *res, char *err, size_t errlen);

/* Exposed for tests: the type llama-quantize's rule gives tensor `name` (rows of n0 elements) of a
 * model with n_layer layers, for mix type `want` (a kvt_quantize_types name); UINT32_MAX when the
 * tensor is not converted. */
uint32_t kvt_quantize_tensor_type(const char *want, const char *name, uint32_t n_dims, int64_t n0,
                                  uint32_t n_layer);

#endif
