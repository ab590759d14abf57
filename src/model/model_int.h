/*
 * model_int.h — internals shared by the files of src/model only (model.c, the architecture files
 * arch_*.c, and the sub-blocks mla.c, moe.c). Nothing outside src/model may include it; the public
 * contract is model.h.
 *
 * An architecture is one kvt_arch_ops table (below), defined by model/arch_<name>.c and registered
 * by one line of arch_list.h. model.c owns the loaders and the dense layer loop; it reads the table
 * and never the architecture's name. Sub-blocks that are not the dense ones plug in per layer, set
 * by the ops' load_layer hook:
 *   - kvt_mla_attention (mla.c): replaces the attention sub-block of a latent (deepseek2) layer;
 *   - kvt_moe_ffn (moe.c): replaces the dense FFN of a mixture-of-experts layer.
 * Both are called by every thread of the pool with a kvt_fwd view of the chunk, and both leave the
 * sub-block's output in fw->tmp (n rows of n_embd) after a final barrier, exactly where the dense
 * code leaves it, so the residual step that follows is shared.
 *
 * Ownership: the per-layer weight structs (kvt_layer_w and the kvt_mla_w / kvt_moe_w it points to)
 * are owned by the model (allocated at load, freed by kvt_model_free); the matrices inside borrow
 * the GGUF mapping, except the absorbed MLA matrices, which the kvt_mla_w owns. kvt_ext_scratch is
 * owned by the kvt_ctx. An architecture with its own forward pass (kvt_arch_pass: qwen35) owns the
 * state its hooks create; the model and the ctx hold it opaquely and free it through the hooks.
 */
#ifndef KVT_MODEL_INT_H
#define KVT_MODEL_INT_H

#include "../kernels/quant.h"
#include "../util/threadpool.h"
#include "model.h"

/* A weight matrix [n_in, n_out] borrowed from the GGUF mapping (data == NULL: absent). */
typedef struct kvt_wmat {
    const void *data;
    uint32_t type;
    uint32_t n_in, n_out;
    uint64_t row_bytes;
    kvt_packed *packed;     /* repacked copy for prefill GEMM (kernels/quant.h), owned; NULL if none */
    void *own;              /* BF16X / F16X / BF16G: the packed matrix that data points to, owned; else NULL */
} kvt_wmat;

/* Load-time preparation of a 2-D matrix for the GEMMs (kernels/quant.h), best effort: where the
 * bf16 kernel runs (kvt_bf16x_enabled) an F16/BF16 matrix becomes KVT_TYPE_BF16X, and where the
 * 16-bit group kernel runs (kvt_f16x_enabled) an F16/BF16 matrix the bf16 kernel did not take
 * becomes KVT_TYPE_F16X / BF16G (data, type and row_bytes then describe the packed copy in w->own;
 * the original stays untouched, e.g. the token embedding a tied output was copied from); otherwise
 * a repacked copy beside the original (w->packed). Counts BF16X and F16X / BF16G matrices in m
 * (kvt_model_numerics_tag). kvt_wmat_release frees what prepare allocated. */
void kvt_wmat_prepare(kvt_model *m, kvt_wmat *w);
void kvt_wmat_release(kvt_wmat *w);

#define KVT_N_ACT 3 /* distinct activation formats a group of matmuls sharing one input may need */
/* Matrices sharing one input that one kvt_quantize_rows / kvt_matmul_group call may take. The
 * caller's act[] holds one buffer per distinct activation format among them (model.c's groups of
 * at most 3 use KVT_N_ACT buffers; qwen35's groups of 4 hold 4). */
#define KVT_MAX_GROUP 4

/* ---- loading helpers (model.c) ---- */
/* Find a 1-D tensor of n elements, dequantize it into model-owned f32 storage. */
kvt_status kvt_load_vec(kvt_model *m, const kvt_gguf *g, const char *name, uint64_t n, bool required,
                        const float **out, char *err, size_t errlen);
/* Find a 2-D matrix [n_in, n_out] (n_mat == 1), or a 3-D tensor [n_in, n_out, n_mat] of stacked
 * matrices (MoE experts), returned as out[0..n_mat). */
kvt_status kvt_load_mat(kvt_model *m, const kvt_gguf *g, const char *name, uint32_t n_in, uint32_t n_out,
                        uint32_t n_mat, bool required, kvt_wmat *out, char *err, size_t errlen);

/* ---- row math and matmul helpers (model.c) ---- */
/* Sum of squares of x[0..n) in double, one fixed order everywhere (the norms' sums). */
double kvt_sum_squares(const float *x, uint32_t n);
void kvt_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps);
void kvt_rope_apply(float *x, const float *cs, uint32_t n_rot, bool neox);
void kvt_split_range(uint32_t n, int ith, int nth, uint32_t *r0, uint32_t *r1);
uint32_t kvt_att_row_split(uint32_t n, uint32_t pos0, uint32_t t, uint32_t nth);
void kvt_col_range(uint32_t n_out, int ith, int nth, int64_t *o0, int64_t *o1);
/* Quantize rows [r0, r1) of x (n_in wide) into act[] for every activation slot of the group. */
void kvt_quantize_rows(void *const *act, const kvt_wmat *const *ws, int nw, const float *x, uint32_t r0, uint32_t r1);
/* This thread's output columns of every matrix of the group, all n_rows rows. */
void kvt_matmul_group(void *const *act, const kvt_wmat *const *ws, float *const *ys, int nw, uint32_t n_rows,
                      int ith, int nth);
/* Bytes of one activation row of the group's input for slot s (rows are contiguous). */
size_t kvt_act_row_bytes(const kvt_wmat *const *ws, int nw, int slot);

typedef struct kvt_layer_w kvt_layer_w; /* one layer's weights (below) */

/* ---- one thread's view of a forward chunk (built by model.c for the hooks) ---- */
typedef struct kvt_ext_scratch kvt_ext_scratch;

typedef struct kvt_fwd {
    const kvt_hparams *hp;
    kvt_threadpool *tp;
    int ith, nth;
    bool repl;              /* replicated mode: X/XN/ACT are this thread's private copies (all rows) */
    uint32_t n, pos0;       /* chunk rows, position of row 0 */
    uint32_t r0, r1;        /* this thread's rows of X/XN/ACT */
    kvt_seq *seq;
    float *X, *XN;          /* residual stream and normed rows (n_embd wide) */
    void *const *ACT;       /* activation buffers matching X/XN (private in replicated mode) */
    void *const *act;       /* shared activation buffers (ubatch rows of any model matmul input) */
    float *tmp;             /* shared: the sub-block output, n rows of n_embd */
    float *att_scratch;     /* this thread's attention scratch */
    const float *rope_cs;   /* row r's (cos, sin) table of the default RoPE at rope_cs + r*rope_stride */
    size_t rope_stride;
    kvt_ext_scratch *ext;   /* MLA/MoE scratch */
} kvt_fwd;

/* ---- MLA (mla.c) ---- */
typedef struct kvt_mla_w {
    kvt_wmat wq;            /* plain q [n_embd, H*(d_nope+d_rope)] (q_lora_rank == 0) */
    kvt_wmat wq_a, wq_b;    /* low-rank q: [n_embd, q_lora], [q_lora, H*(d_nope+d_rope)] */
    const float *q_a_norm;  /* [q_lora] */
    kvt_wmat wkv_a;         /* [n_embd, r + d_rope]: latent c then the shared k_pe */
    const float *kv_a_norm; /* [r] */
    kvt_wmat wkv_b;         /* [r, H*(d_nope+d_v)]: per head W_UK (d_nope rows) then W_UV (d_v rows) */
    kvt_wmat wo;            /* [H*d_v, n_embd] */
    float *uk_t;            /* owned: [H][r][d_nope] = W_UK,h transposed (absorbs q_nope into latent space) */
    float *uv;              /* owned: [H][d_v][r] = W_UV,h (latent output -> value space) */
} kvt_mla_w;

/* Parse deepseek2 MLA keys (hd_k/hd_v: attention.key_length/value_length already read). */
kvt_status kvt_mla_hparams_load(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen);
/* YaRN multiplier of RoPE frequency i (folded into the model's inverse frequencies). */
double kvt_mla_yarn_freq_factor(const kvt_hparams *hp, uint32_t i);
kvt_status kvt_mla_load(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_mla_w *w, char *err, size_t errlen);
void kvt_mla_free(kvt_mla_w *w);
void kvt_mla_attention(const kvt_fwd *fw, const kvt_mla_w *w, const float *attn_norm, uint32_t il);
/* Before each chunk (outside the pool's threads): decides whether the chunk of n rows at pos0 runs
 * expanded (xs->exp_on) and, if so, sizes the head grouping and prepares the temporary K/V for
 * pos0 + n keys. KVT_ERR_NOMEM if that memory cannot be had (nothing run). */
kvt_status kvt_mla_prefill_setup(kvt_ext_scratch *xs, const kvt_hparams *hp, kvt_mla_prefill mode, uint32_t n,
                                 uint32_t pos0, int nth);
/* Frees the expanded-prefill part of the scratch (called by kvt_ext_scratch_free). */
void kvt_mla_expand_free(kvt_ext_scratch *xs);

/* ---- MoE (moe.c) ---- */
typedef struct kvt_moe_w {
    kvt_wmat router;        /* ffn_gate_inp [n_embd, n_expert] (any supported type; f32 in practice) */
    const float *bias;      /* exp_probs_b [n_expert] or NULL: selection bias only */
    kvt_wmat *gate, *up, *down; /* owned arrays of n_expert matrices */
    kvt_wmat sh_gate, sh_up, sh_down; /* shared experts (data NULL: none) */
} kvt_moe_w;

/* Parse the MoE keys. norm_topk: the family's default of expert_weights_norm when the key is absent
 * (as the reference engines: qwen3moe normalizes the top-k, deepseek2 does not). */
kvt_status kvt_moe_hparams_load(const kvt_gguf *g, kvt_hparams *hp, bool norm_topk, char *err, size_t errlen);
/* The load_layer hook of the MoE families: a mixture-of-experts layer (every one after the leading
 * dense ones) gets its w->moe, allocated and loaded; a dense one is left alone. */
kvt_status kvt_moe_load_layer(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_layer_w *w, char *err, size_t errlen);
void kvt_moe_free(kvt_moe_w *w);
/* The FFN of one MoE layer over XN (this thread's rows r0..r1 normed) into fw->tmp. */
void kvt_moe_ffn(const kvt_fwd *fw, const kvt_moe_w *w, uint32_t il);

/* ---- scratch for both (allocated in moe.c) ---- */
struct kvt_ext_scratch {
    /* MLA, ubatch rows each */
    float *qa;       /* [q_lora] */
    float *kva;      /* [r + d_rope]: the latent row written to the cache */
    float *q;        /* [H*(d_nope+d_rope)] */
    float *qabs;     /* [H*(r+d_rope)]: absorbed queries */
    float *olat;     /* [H*r]: attention output in latent space */
    float *att;      /* [H*d_v] */
    /* MLA expanded prefill (mla.c): set per chunk by kvt_mla_prefill_setup, allocated on first use */
    bool exp_on;               /* this chunk runs the expanded path */
    uint32_t exp_g;            /* heads per group of the temporary K/V (a divisor of H) */
    kvt_kv_layout *exp_layout; /* one FULL f16 layer: exp_g heads x (d_nope + d_rope, d_v) */
    kvt_block_pool *exp_pool;  /* its blocks (unbudgeted: bounded by the head grouping) */
    kvt_seq *exp_seq;          /* the temporary K/V; never committed, rewritten per layer */
    float *exp_lat;            /* [KVT_MLA_EXP_TILE][r + d_rope]: a key tile's latent rows, from the cache */
    float *exp_c;              /* [KVT_MLA_EXP_TILE][r]: their c part, contiguous */
    void *exp_act;             /* exp_c's activations for attn_kv_b (widest format of any type) */
    float *exp_y;              /* [KVT_MLA_EXP_TILE][H*(d_nope+d_v)]: attn_kv_b of the tile */
    float *exp_kv;             /* [exp_nth][H*(d_nope+d_rope+d_v)]: per-thread K/V row staging */
    int exp_nth;
    /* MoE: a chunk routes ubatch*k (token, expert) pairs, grouped by expert into slots */
    float *logit;    /* [ubatch][n_expert] router logits */
    int32_t *sel;    /* [ubatch][k] chosen experts, in selection order */
    float *selw;     /* [ubatch][k] their weights */
    uint32_t *slot;  /* [ubatch][k] slot of each pair */
    uint32_t *slot_row; /* [ubatch*k] token row of each slot */
    uint32_t *off;   /* [n_expert + 1] first slot of each expert */
    uint32_t *cur;   /* [n_expert + 1] fill cursor while assigning slots */
    float *xg, *yg;  /* [ubatch*k][n_embd]: gathered inputs, expert outputs */
    float *hg, *hu;  /* [ubatch*k][n_ff_exp] */
    float *sg, *su, *sy; /* shared experts: [ubatch][n_ff_exp*n_shared] x2, [ubatch][n_embd] */
    void *act_x[KVT_N_ACT], *act_h[KVT_N_ACT]; /* activations of xg and hg */
};

kvt_ext_scratch *kvt_ext_scratch_create(const kvt_hparams *hp, uint32_t ubatch);
void kvt_ext_scratch_free(kvt_ext_scratch *s);
/* Largest activation bytes the MLA/MoE matrices of a layer need for `rows` input rows. */
size_t kvt_ext_act_bytes(const kvt_mla_w *mla, const kvt_moe_w *moe, uint32_t rows, size_t cur);

/* Accessors for architectures with their own forward pass (qwen35). */
const void *kvt_model_arch_state(const kvt_model *m); /* the kvt_arch_pass state, NULL if none */
const kvt_wmat *kvt_model_tok_embd(const kvt_model *m);
const kvt_wmat *kvt_model_output(const kvt_model *m);
const float *kvt_model_output_norm(const kvt_model *m);

/* ---- one layer's weights (filled by model.c's loader and the ops' load_layer hook) ---- */
struct kvt_layer_w {
    const float *attn_norm, *ffn_norm;
    const float *q_norm, *k_norm;                /* KVT_LT_QK_NORM */
    const float *post_attn_norm, *post_ffw_norm; /* KVT_LT_POST_NORMS */
    const float *bq, *bk, *bv;                   /* KVT_LT_QKV_BIAS */
    kvt_wmat wq, wk, wv, wo, gate, up, down;
    kvt_mla_w *mla;                              /* owned or NULL: MLA attention instead of wq/wk/wv/wo */
    kvt_moe_w *moe;                              /* owned or NULL: experts instead of gate/up/down */
};

/* ---- architectures (arch_*.c, registered in arch_list.h) ---- */

/* Optional per-layer tensors of the dense layer (kvt_arch_ops.layer_tensors). */
enum {
    KVT_LT_QKV_BIAS = 1u << 0,   /* attn_{q,k,v}.bias */
    KVT_LT_QK_NORM = 1u << 1,    /* attn_{q,k}_norm.weight: per-head RMSNorm of queries and keys */
    KVT_LT_POST_NORMS = 1u << 2, /* post_attention_norm / post_ffw_norm: sub-block outputs normed */
};

/* The gated activation of the dense FFN: act(gate) * up. */
typedef enum kvt_ffn_act {
    KVT_FFN_SILU = 0,      /* the vector SiLU of deltanet.c */
    KVT_FFN_GELU_TANH = 1, /* GELU, tanh approximation (gemma3) */
} kvt_ffn_act;

/* An architecture with its own forward pass instead of the dense layer loop (qwen35). model.c
 * loads the hparams, token_embd, output and output_norm, then hands over: state is what load
 * creates (owned by the model, freed by free), ctx_state what ctx_create creates (owned by the
 * kvt_ctx, freed by ctx_free). The hooks have the contracts of the model.h functions they stand in
 * for (kvt_model_layer_descs, the layout check of kvt_model_forward, kvt_ctx_create,
 * kvt_model_forward: logits is the ctx's buffer, big enough for n rows when all_logits;
 * att_scratch holds one attention scratch per thread). */
typedef struct kvt_arch_pass {
    kvt_status (*load)(kvt_model *m, const kvt_gguf *g, void **state, char *err, size_t errlen);
    void (*free)(void *state);
    void (*layer_descs)(const void *state, const kvt_hparams *hp, const kvt_codec *codecs, kvt_layer_desc *out);
    kvt_status (*check_layout)(const void *state, const kvt_hparams *hp, const kvt_kv_layout *l);
    kvt_status (*ctx_create)(const kvt_model *m, const void *state, int n_threads, uint32_t ubatch, void **ctx_state);
    void (*ctx_free)(void *ctx_state);
    kvt_status (*forward)(void *ctx_state, kvt_threadpool *tp, float *const *att_scratch, kvt_seq *seq,
                          const int32_t *tokens, uint32_t n, bool all_logits, const volatile int *cancel,
                          float *logits);
} kvt_arch_pass;

/* What model.c needs to know of an architecture. Data fields are read by the shared code; hooks
 * are optional (NULL: nothing beyond the shared code). Tables are static and immutable. */
typedef struct kvt_arch_ops {
    const char *name;  /* general.architecture, and the prefix of the architecture's hparam keys */

    /* -- hparams: model.c reads the shared keys (lengths, heads, RoPE, norm eps) -- */
    bool rope_neox;      /* RoPE rotates the two halves of a head (NeoX), not adjacent pairs */
    bool rope_yarn;      /* rope.scaling.type "yarn" accepted (the hparams hook reads its keys) */
    bool kv_dims_differ; /* key_length != value_length accepted (the hparams hook checks them) */
    /* The architecture's own keys, after the shared ones (hd_v: attention.value_length). */
    kvt_status (*hparams)(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen);

    /* -- tensors -- */
    bool rope_freqs;        /* optional rope_freqs.weight (llama3 frequency factors) */
    unsigned layer_tensors; /* KVT_LT_*: the optional tensors of each dense layer */
    /* Before the dense tensors of layer il: may set w->mla and/or w->moe (allocated here, owned by
     * the layer), whose sub-blocks then replace the dense attention / FFN and their tensors. */
    kvt_status (*load_layer)(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_layer_w *w, char *err,
                             size_t errlen);

    /* -- layer kinds: the kvt_layer_kind (kv.h) of each layer's cache, after the tensors are loaded.
     *    NULL: every layer FULL. -- */
    kvt_status (*layer_kinds)(const kvt_model *m, const kvt_gguf *g, uint8_t *kind, char *err, size_t errlen);

    /* -- forward hooks of the dense layer loop -- */
    bool embd_scale;     /* token embeddings multiplied by sqrt(n_embd) */
    bool q_prescale;     /* the softmax scale multiplies the queries after RoPE (attention then at 1) */
    bool window_rope;    /* window layers rotate with rope_base_swa, unscaled (a second RoPE table) */
    kvt_ffn_act ffn_act;
    const kvt_arch_pass *pass; /* own forward pass instead of the layer loop, or NULL */

    /* -- batching -- */
    bool batches;        /* kvt_model_forward_batch runs the items in one pass (kvt_model_batches) */
} kvt_arch_ops;

/* The registry (arch_list.h, read by model.c) needs every table. */
#define KVT_ARCH_ENTRY(id, value, ops) extern const kvt_arch_ops ops;
#include "arch_list.h"

#endif
