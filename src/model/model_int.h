/*
 * model_int.h — what model.c shares with the architecture files of src/model (arch_*.c) only:
 * the weight-matrix view, the checked tensor loaders and the hooks an architecture with its own
 * forward pass provides. Nothing outside src/model includes this file. Ownership is as in model.h:
 * matrices borrow the GGUF mapping; vectors are copied into model-owned storage.
 */
#ifndef KVT_MODEL_INT_H
#define KVT_MODEL_INT_H

#include "../util/threadpool.h"
#include "model.h"

typedef struct kvt_wmat {
    const void *data;
    uint32_t type;
    uint32_t n_in, n_out;
    uint64_t row_bytes;
} kvt_wmat;

/* Checked loaders (model.c): a 2-D matrix [n_in, n_out] of any supported type borrowed from the
 * mapping, and a 1-D vector of n elements converted to f32 in model-owned storage. A missing
 * optional tensor leaves *out zeroed / NULL. */
kvt_status kvt_model_load_mat(kvt_model *m, const kvt_gguf *g, const char *name, uint32_t n_in, uint32_t n_out,
                              bool required, kvt_wmat *out, char *err, size_t errlen);
kvt_status kvt_model_load_vec(kvt_model *m, const kvt_gguf *g, const char *name, uint64_t n, bool required,
                              const float **out, char *err, size_t errlen);
const kvt_wmat *kvt_model_tok_embd(const kvt_model *m);
const kvt_wmat *kvt_model_output(const kvt_model *m);
const float *kvt_model_output_norm(const kvt_model *m);

/* ---- qwen35 (arch_qwen35.c): hybrid gated DeltaNet + gated attention ---- */
typedef struct kvt_q35 kvt_q35;         /* per-model tables, owned by the kvt_model */
typedef struct kvt_q35_ctx kvt_q35_ctx; /* per-context scratch, owned by the kvt_ctx */

/* Reads the qwen35 keys and every per-layer tensor (token_embd/output are loaded by model.c). */
kvt_status kvt_q35_load(kvt_model *m, const kvt_gguf *g, kvt_q35 **out, char *err, size_t errlen);
void kvt_q35_free(kvt_q35 *q);
bool kvt_q35_layer_is_attn(const kvt_q35 *q, uint32_t il);
void kvt_q35_layer_descs(const kvt_q35 *q, const kvt_hparams *hp, const kvt_codec *codecs, kvt_layer_desc *out);
kvt_status kvt_q35_check_layout(const kvt_q35 *q, const kvt_hparams *hp, const kvt_kv_layout *l);
kvt_status kvt_q35_ctx_create(const kvt_model *m, const kvt_q35 *q, int n_threads, uint32_t ubatch,
                              kvt_q35_ctx **out);
void kvt_q35_ctx_free(kvt_q35_ctx *qc);
/* The forward pass of kvt_model_forward for qwen35 (same contract). logits: the ctx's buffer, big
 * enough for n rows when all_logits; att_scratch: one attention scratch per thread. */
kvt_status kvt_q35_forward(kvt_q35_ctx *qc, kvt_threadpool *tp, float *const *att_scratch, kvt_seq *seq,
                           const int32_t *tokens, uint32_t n, bool all_logits, const volatile int *cancel,
                           float *logits);

#endif
