/*
 * model.h — transformer weights loaded from a GGUF (llama, qwen2, qwen3, gemma3, qwen3moe, deepseek2,
 * qwen35) and the CPU forward pass over a block-based KV sequence (kv/kv.h).
 *
 * Ownership: kvt_model borrows tensor data from the kvt_gguf mapping (the GGUF must outlive the
 * model) and owns only small derived tables (RoPE frequencies, per-layer pointers, deepseek2's
 * absorbed MLA matrices). kvt_ctx owns
 * all scratch memory and a thread pool; it is allocated once and the forward pass allocates nothing
 * in the token loop. One kvt_ctx is used by one thread at a time; many sequences can go through the
 * same ctx one after another.
 *
 * Numerics: every row of a batch is computed exactly as it would be alone (kernels/quant.h batch
 * invariance, attention per query row), so chunked prefill == unchunked == token-by-token decode
 * bit for bit, and a cache hit continues exactly as a cold prefill would. (Exception, opt-in:
 * deepseek2 under a non-default kvt_mla_prefill mode, where that holds only within tolerance.)
 */
#ifndef KVT_MODEL_H
#define KVT_MODEL_H

#include "../gguf/gguf.h"
#include "../kv/kv.h"

/* The supported architectures, one per line of model/arch_list.h (the registry). */
typedef enum kvt_arch {
#define KVT_ARCH_ENTRY(id, value, ops) KVT_ARCH_##id = value,
#include "arch_list.h"
} kvt_arch;
const char *kvt_arch_name(kvt_arch a); /* the general.architecture string; "?" if none */

/* Mixture of experts (qwen3moe, deepseek2; model/moe.c). n_expert == 0: every layer is dense. */
typedef struct kvt_moe_hparams {
    uint32_t n_expert, n_expert_used, n_expert_shared; /* routed, chosen per token, always-on */
    uint32_t n_ff_exp;     /* one expert's FFN width (the shared experts together: n_ff_exp * n_expert_shared) */
    uint32_t n_dense_lead; /* leading dense layers (deepseek2 leading_dense_block_count) */
    uint32_t gating;       /* 1 softmax, 2 sigmoid (expert_gating_func) */
    bool norm_topk;        /* divide the chosen weights by their sum (expert_weights_norm) */
    float weights_scale;   /* routed_scaling_factor (expert_weights_scale; 1 = none) */
} kvt_moe_hparams;

/* Multi-head latent attention (deepseek2; model/mla.c). kv_lora_rank == 0: not MLA. */
typedef struct kvt_mla_hparams {
    uint32_t q_lora_rank;   /* 0: plain attn_q (no low-rank q) */
    uint32_t kv_lora_rank;  /* r: the cached latent c */
    uint32_t d_nope, d_rope, d_v; /* per-head no-RoPE key dims, decoupled RoPE key dims, value dims */
    bool yarn;              /* YaRN RoPE scaling (rope.scaling.type = yarn) */
    float yarn_orig_ctx, yarn_log_mul;
    float kq_scale;         /* softmax scale, YaRN mscale^2 / sqrt(d_nope + d_rope) */
} kvt_mla_hparams;

typedef struct kvt_hparams {
    kvt_arch arch;
    uint32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    uint32_t n_swa;            /* gemma3 sliding window; 0 = none */
    float rope_base;           /* global layers */
    float rope_base_swa;       /* gemma3 local layers (10000) */
    float rope_freq_scale;     /* 1/factor for linear scaling (global layers) */
    float norm_eps;
    float attn_scale;          /* softmax scale (gemma3: applied as query pre-scale) */
    bool rope_neox;
    bool tied_output;
    char name[128];            /* general.name or "" */
    kvt_moe_hparams moe;
    kvt_mla_hparams mla;
} kvt_hparams;

typedef struct kvt_model kvt_model;

/* Validates architecture, hyperparameters (bounded), and every tensor's presence, type and shape. */
kvt_status kvt_model_load(const kvt_gguf *g, kvt_model **out, char *err, size_t errlen);
void kvt_model_free(kvt_model *m);
const kvt_hparams *kvt_model_hparams(const kvt_model *m);
/* True if layer il is a sliding-window layer (gemma3: by the GGUF's sliding_window_pattern, else
 * il % 6 < 5; model/arch_gemma3.c). */
bool kvt_model_layer_is_swa(const kvt_model *m, uint32_t il);
/* Fill n_layer layer descs (kind, window, heads, dims) using codecs[il] for each layer. */
void kvt_model_layer_descs(const kvt_model *m, const kvt_codec *codecs, kvt_layer_desc *out);
/* Bytes of weights (sum of tensor sizes). */
uint64_t kvt_model_weight_bytes(const kvt_model *m);
/* Heap bytes the loaded model holds beside the file mapping: the packed / bf16x copies of
 * kvt_wmat_prepare, the f32 vectors, deepseek2's absorbed f32 MLA matrices (memory budget). */
uint64_t kvt_model_private_bytes(const kvt_model *m);

/* MoE routing of one token (model/moe.c; exposed for tests): from the router logits (n_expert) and
 * the optional selection bias, the n_expert_used chosen experts in selection order and their
 * weights. */
void kvt_moe_route(const kvt_moe_hparams *mh, const float *logits, const float *bias, int32_t *sel, float *w);

/* How a deepseek2 (MLA) prefill chunk of n > 1 rows attends (mla.c, docs/models.md "MLA prefill").
 * Decode (n == 1) is always absorbed.
 *  ABSORBED (default): queries absorbed into latent space, attention over the cached latents. Every
 *    row is computed the same way whatever the chunking, so the numerics contract above holds.
 *  EXPANDED: every cached latent of the sequence is expanded per head into a temporary f16 K/V
 *    (attn_kv_b, the model's matmul kernels; neither cached nor billed as KV) and the normal attention
 *    kernel runs over it. A row's bits then depend on whether its chunk had one row or more.
 *  AUTO: per chunk, the cheaper of the two by kvt_mla_prefill_expands' cost model; bits depend on
 *    the chunking.
 * Non-absorbed modes enter the cache compatibility key (kvt_mla_prefill_numerics_tag). */
typedef enum kvt_mla_prefill {
    KVT_MLA_PREFILL_ABSORBED = 0,
    KVT_MLA_PREFILL_EXPANDED = 1,
    KVT_MLA_PREFILL_AUTO = 2,
} kvt_mla_prefill;
/* "absorbed" | "expanded" | "auto" -> mode; -1 for anything else. */
int kvt_mla_prefill_parse(const char *s);
const char *kvt_mla_prefill_name(kvt_mla_prefill mode);
/* Whether a chunk of n rows at positions pos0.. of a model with these hparams runs expanded under
 * mode (false for n <= 1 and for models without MLA). AUTO: the cost model in mla.c. */
bool kvt_mla_prefill_expands(const kvt_hparams *hp, kvt_mla_prefill mode, uint32_t n, uint32_t pos0);
/* What the mode appends to the kernel numerics id of the cache compatibility key: "" for ABSORBED
 * and for models without MLA (existing keys unchanged), "+mla-expanded" / "+mla-auto" otherwise,
 * so caches never mix KV computed under different modes. */
const char *kvt_mla_prefill_numerics_tag(const kvt_hparams *hp, kvt_mla_prefill mode);
/* "+bf16x" when the model multiplies some F16/BF16 matrices with the bf16 pair dot (bf16-rounded
 * activations, kernels/quant.h: KVT_TYPE_BF16X), "+f16x" when some F16/BF16 matrices are in
 * 16-output groups (KVT_TYPE_F16X / BF16G: another summation order), both ("+bf16x+f16x"), else "": part of the cache
 * compatibility key, since the same file gives other numbers where those kernels are absent or
 * KVT_BF16X=0 / KVT_F16X=0. Static. */
const char *kvt_model_numerics_tag(const kvt_model *m);

typedef struct kvt_ctx kvt_ctx;
/* n_threads: 0 = cores. ubatch: max tokens per forward chunk. */
kvt_status kvt_ctx_create(const kvt_model *m, int n_threads, uint32_t ubatch, kvt_ctx **out);
void kvt_ctx_free(kvt_ctx *c);
int kvt_ctx_n_threads(const kvt_ctx *c);
/* Heap bytes of the context's buffers (activations, per-thread attention scratch as reserved, the
 * logits rows held now); MoE/MLA and architecture scratch are not included (memory budget). */
uint64_t kvt_ctx_bytes(const kvt_ctx *c);
/* Pre-size the per-thread attention scratch for sequences of layout l up to n_ctx tokens, so the
 * forward pass never grows it (it otherwise grows geometrically at the start of a forward call, never
 * inside the token loop). */
kvt_status kvt_ctx_reserve(kvt_ctx *c, const kvt_kv_layout *l, uint32_t n_ctx);
/* MLA prefill mode of this context's forward calls (default ABSORBED); no effect on other models. */
void kvt_ctx_set_mla_prefill(kvt_ctx *c, kvt_mla_prefill mode);

/* Run tokens[0..n) at positions kvt_seq_len(seq) .. +n-1: prepares, writes KV, commits the tokens
 * to seq. Splits into ubatch chunks internally. Returns logits of the last token (n_vocab floats,
 * owned by ctx, valid until the next call), or, if all_logits (requires n <= ubatch), n rows (the
 * buffer for n rows is allocated on the first such call, before any token is processed).
 * Errors: KVT_ERR_POOL_EXHAUSTED from the pool (the sequence keeps the chunks committed so far),
 * KVT_ERR_INVALID_ARG for a token id out of range, KVT_ERR_CANCELLED if *cancel became non-zero
 * between chunks. */
kvt_status kvt_model_forward(kvt_ctx *c, kvt_seq *seq, const int32_t *tokens, uint32_t n,
                             bool all_logits, const volatile int *cancel, float **logits);

/* ---- batched forward (continuous batching, docs/batching.md) ---- */

#define KVT_MAX_BATCH_ITEMS 256 /* sequences in one kvt_model_forward_batch call */

/* One sequence's share of a batched step: tokens[0..n) at positions kvt_seq_len(seq).. . st is
 * set by the call: that item's outcome (KVT_ERR_POOL_EXHAUSTED: its sequence could not grow and is
 * unchanged; the other items still ran). */
typedef struct kvt_batch_item {
    kvt_seq *seq;
    const int32_t *tokens;
    uint32_t n;
    kvt_status st;
} kvt_batch_item;

/* True when kvt_model_forward_batch runs its items in one pass (the architecture's ops say so:
 * llama, qwen2, qwen3, gemma3); false for qwen35 (recurrent state), deepseek2 (MLA) and qwen3moe
 * (no test model yet), whose items are forwarded one after another inside the same call. */
bool kvt_model_batches(const kvt_model *m);

/* Several sequences (distinct, same layout) in one forward pass: every matmul runs once over the
 * concatenated rows of all items (the weights are read once), attention runs per item over its
 * own sequence. Needs 1 <= n_items <= min(ubatch, KVT_MAX_BATCH_ITEMS) and sum of n <= ubatch.
 * Returns n_items rows of logits (row i = item i's last token; owned by ctx, valid until the
 * next call; rows of failed items are undefined). Per-row numerics are those of
 * kvt_model_forward, so each item's logits are bit-identical to running it alone (batch
 * invariance, tested by test_batch). KVT_ERR_INVALID_ARG for a malformed call (nothing run). */
kvt_status kvt_model_forward_batch(kvt_ctx *c, kvt_batch_item *items, uint32_t n_items, float **logits);

#endif
