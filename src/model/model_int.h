/*
 * model_int.h — internals shared by the forward-pass files of src/model only (model.c, mla.c,
 * moe.c). Nothing outside src/model may include it; the public contract is model.h.
 *
 * model.c owns the layer loop. Architectures whose attention or FFN is not the dense one plug in at
 * two hook points of that loop:
 *   - kvt_mla_attention (mla.c): replaces the attention sub-block of a deepseek2 layer;
 *   - kvt_moe_ffn (moe.c): replaces the dense FFN of a mixture-of-experts layer.
 * Both are called by every thread of the pool with a kvt_fwd view of the chunk, and both leave the
 * sub-block's output in fw->tmp (n rows of n_embd) after a final barrier, exactly where the dense
 * code leaves it, so the residual step that follows is shared.
 *
 * Ownership: the per-layer weight structs (kvt_mla_w, kvt_moe_w) are owned by the model (allocated
 * at load, freed by kvt_model_free); the matrices inside borrow the GGUF mapping, except the
 * absorbed MLA matrices, which the kvt_mla_w owns. kvt_ext_scratch is owned by the kvt_ctx.
 *
 * Architectures with their own forward pass (qwen35, arch_qwen35.c) use the loaders below and the
 * kvt_q35_* hooks instead of the layer loop.
 */
#ifndef KVT_MODEL_INT_H
#define KVT_MODEL_INT_H

#include "../util/threadpool.h"
#include "model.h"

/* A weight matrix [n_in, n_out] borrowed from the GGUF mapping (data == NULL: absent). */
typedef struct kvt_wmat {
    const void *data;
    uint32_t type;
    uint32_t n_in, n_out;
    uint64_t row_bytes;
    kvt_packed *packed;     /* repacked copy for prefill GEMM (kernels/quant.h), owned; NULL if none */
    void *own;              /* KVT_TYPE_BF16X: the packed matrix that data points to, owned; else NULL */
} kvt_wmat;

/* Load-time preparation of a 2-D matrix for the GEMMs (kernels/quant.h), best effort: where the
 * bf16 kernel runs (kvt_bf16x_enabled) an F16/BF16 matrix becomes KVT_TYPE_BF16X (data, type and
 * row_bytes then describe the packed copy in w->own; the original stays untouched, e.g. the token
 * embedding a tied output was copied from); otherwise a repacked copy beside the original
 * (w->packed). Counts BF16X matrices in m (kvt_model_numerics_tag). kvt_wmat_release frees what
 * prepare allocated. */
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

kvt_status kvt_moe_hparams_load(const kvt_gguf *g, kvt_hparams *hp, char *err, size_t errlen);
bool kvt_moe_layer(const kvt_hparams *hp, uint32_t il);
kvt_status kvt_moe_load(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_moe_w *w, char *err, size_t errlen);
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
