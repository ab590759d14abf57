/*
 * kv.h — the KV block substrate: layer kinds, codecs, the KV layout, the block pool, sequences and
 * block-reading attention. Every tier (live sequences, RAM prompt cache, SSD) holds these blocks.
 *
 * Concepts
 * --------
 * - Layer desc: every layer declares a kind (FULL, WINDOW(W), RECURRENT, MLA) and a codec. There is no
 *   "unknown" kind: kvt_kv_layout_create rejects anything else.
 * - Layer group: layers of the same kind (and window) form one group. A block holds K and V of every
 *   layer of ONE group for a fixed token range [index*block_tokens, (index+1)*block_tokens).
 *   Llama/Qwen have one group; Gemma 3 has a FULL group and a WINDOW group. RECURRENT layers have no
 *   blocks: their state lives in the sequence and in snapshots.
 * - Block variant: the scheme's `quant_start` (tokens kept in the base 16-bit codec before the
 *   configured codec applies) is resolved per block: block `index` uses the configured codec iff
 *   index*block_tokens >= round_up(quant_start, block_tokens); otherwise the base codec (f16 or
 *   bf16). The codec of a block is therefore a pure function of its position: no conversion ever
 *   rewrites a block, so immutability holds.
 * - Block payload layout (per group, per variant): for each layer of the group in increasing layer
 *   order, a K section then a V section; a section holds block_tokens rows per KV head, ordered
 *   [kv_head][token] (the rows of one head are contiguous, so attention streams them), each row =
 *   one head of one token encoded by the layer's codec (kvt_codec_row_bytes). Sections start at
 *   64-byte aligned offsets. Quantization groups run along head_dim and never span tokens, so a
 *   token range of one head is a byte range: tokens [0, m) of head h are the m*row_bytes bytes at
 *   section_offset + h*block_tokens*row_bytes (kvt_kv_layout_row_offset).
 * - Chain hash: hash(parent_hash, tokens of the block) with XXH3-64; the root parent of a sequence
 *   is `root` = hash(compatibility key, namespace) supplied by the caller. The chain hash of a
 *   block index is the same for all groups; a block is identified by (chain hash, group).
 *   Lookups must also compare tokens and parent, so a 64-bit collision can never alias KV.
 *
 * Block state machine and invariants: see the top of block.c.
 *
 * Ownership / lifetime
 * --------------------
 * - kvt_kv_layout: immutable after create; shared by pool, sequences and caches; outlives them.
 * - kvt_block_pool: owns block memory; every block must be released before kvt_block_pool_free.
 *   All pool/block/seq functions are thread-safe with respect to refcounts and pool accounting
 *   (a mutex + atomics); a single kvt_seq must not be used from two threads at once, except that
 *   kvt_attention and kvt_seq_read_rows may be called concurrently on one seq from many threads
 *   (read-only), and kvt_seq_write_kv / kvt_seq_write_kv_heads may be called concurrently for
 *   DISTINCT (position, KV head) rows of the prepared range (each call writes only its rows; see
 *   kvt_seq_write_kv).
 * - kvt_block: refcounted. alloc returns refcount 1 owned by the caller. retain/release adjust it;
 *   the last release returns the memory to the pool. Sealed blocks are immutable forever.
 *   Only SEALED blocks may be retained (asserted): a block with refcount > 1 is never mutable.
 * - kvt_seq: owns one reference to each block it lists, plus its recurrent state buffers.
 */
#ifndef KVT_KV_H
#define KVT_KV_H

#include "../util/common.h"
#include "../util/threadpool.h"

#define KVT_MAX_LAYERS 512
#define KVT_MAX_GROUPS 4
#define KVT_DEFAULT_BLOCK_TOKENS 256

/* ------------------------------------------------------------------ codecs */
typedef enum kvt_codec_kind {
    KVT_CODEC_F16 = 1,
    KVT_CODEC_BF16 = 2,
    KVT_CODEC_AFFINE = 3, /* MLX affine: bits in {2,3,4,5,6,8}, group in {32,64,128} along head_dim */
    KVT_CODEC_TURBO = 4,  /* TurboQuant_mse (turbo.c): bits (keys) and vbits (values) in {2,3,4,5,8};
                           * head_dim a power of two in [8, KVT_TURBO_MAX_DIM]. Rows hold the vector in
                           * the rotated basis (see "TurboQuant" below). */
} kvt_codec_kind;

typedef struct kvt_codec {
    kvt_codec_kind kind;
    uint8_t bits;        /* AFFINE: code bits; TURBO: key bits */
    uint16_t group_size; /* AFFINE only */
    uint8_t scale_bf16;  /* AFFINE only: scales/biases stored as bf16 (else f16) */
    uint8_t vbits;       /* TURBO only: value bits */
} kvt_codec;

bool kvt_codec_valid(kvt_codec c, uint32_t dim);
/* The codec of the K (kv = 0) or V (kv = 1) rows of a layer codec: TURBO gives a codec with
 * bits = vbits = that side's bits; every other codec is returned unchanged. Row sizes, encode and
 * decode always take a side codec. */
kvt_codec kvt_codec_side(kvt_codec c, int kv);
/* Largest affine group (128, 64, 32) that divides head_dim; 0 if none does. */
uint32_t kvt_affine_auto_group(uint32_t head_dim);
/* Bytes of one encoded row of `dim` elements (affine: packed u32 words, then scales, then biases). */
size_t kvt_codec_row_bytes(kvt_codec c, uint32_t dim);
void kvt_codec_encode_row(kvt_codec c, const float *x, uint32_t dim, void *dst);
void kvt_codec_decode_row(kvt_codec c, const void *src, uint32_t dim, float *dst);
/* "f16", "bf16", "q8g64", "q4g32", "turbo-k8v3" … */
void kvt_codec_name(kvt_codec c, char *buf, size_t n);

/* Scalar reference of MLX affine quantization for one group (kv-codecs.md §1.2). Exposed for tests.
 * codes[i] in [0, 2^bits-1]; scale/bias are the unrounded fp32 values. */
void kvt_affine_quantize_group(const float *w, uint32_t g, uint32_t bits, uint32_t *codes,
                               float *scale, float *bias);

/* ------------------------------------------------------------------ TurboQuant (turbo.c) */
/* Fixed rotation seed; recorded in the scheme key ("…-turbo-k8v3-r<seed>…"), so changing it can never
 * alias cached blocks. Sign vector of (layer, kv, head) = a pure function of the seed. */
#define KVT_TURBO_SEED 0x7475726230303031ull /* "turb0001" */
#define KVT_TURBO_MAX_DIM 1024
bool kvt_turbo_bits_ok(uint32_t bits);     /* 2,3,4,5,8 (values) */
bool kvt_turbo_key_bits_ok(uint32_t bits); /* 2,4,5,8 (keys, the seed's set) */
bool kvt_turbo_dim_ok(uint32_t head_dim);  /* power of two in [8, KVT_TURBO_MAX_DIM] */
/* "turbo" (= k8v3) or "turbo:k<b>v<b>" -> a TURBO layer codec; errors name the accepted values. */
kvt_status kvt_turbo_parse(const char *s, kvt_codec *out, char *err, size_t errlen);
/* Rotation Π = H_d/√d · diag(σ(layer, kv, head)) and its inverse Π^T; out may equal x for unrotate. */
void kvt_turbo_rotate(uint32_t layer, int kv, uint32_t head, const float *x, uint32_t d, float *out);
void kvt_turbo_unrotate(uint32_t layer, int kv, uint32_t head, const float *y, uint32_t d, float *out);
/* N(0,1) Lloyd–Max centroids for `bits` (1..8), ascending, 2^bits floats; static storage. */
const float *kvt_turbo_codebook(uint32_t bits);
/* The Lloyd iteration behind the codebook, in double (exposed for tests): c gets 2^bits centroids. */
void kvt_turbo_lloyd_max(uint32_t bits, double *c);
/* TurboQuant_prod QJL residual for a rotated key y (measured by tests and docs; the codec stores
 * MSE-only keys). S: d*d floats from kvt_turbo_qjl_matrix (i.i.d. N(0,1) from seed). mse_row gets
 * d*bits_mse/8 + 4 bytes, signs d/8 bytes, rho the residual norm. kvt_turbo_qjl_dot estimates
 * <q, y> for a rotated query q (unbiased over S). d <= KVT_TURBO_MAX_DIM. */
void kvt_turbo_qjl_matrix(uint64_t seed, uint32_t d, float *S);
void kvt_turbo_qjl_encode(const float *S, uint32_t bits_mse, const float *y, uint32_t d, uint8_t *mse_row,
                          uint8_t *signs, float *rho);
float kvt_turbo_qjl_dot(const float *S, uint32_t bits_mse, const float *q, uint32_t d, const uint8_t *mse_row,
                        const uint8_t *signs, float rho);

/* ------------------------------------------------------------------ layout */
typedef enum kvt_layer_kind {
    KVT_KIND_FULL = 1,
    KVT_KIND_WINDOW = 2,
    KVT_KIND_RECURRENT = 3,
    /* Multi-head latent attention (deepseek2): one row per token shared by all heads, the normed
     * latent c (head_dim_v values) followed by the RoPE'd decoupled key (head_dim_k - head_dim_v):
     * n_kv_heads = 1, a K section only (the "V" of a token is the c prefix of its K row, so the
     * block holds exactly the latent: no expanded K/V). Blocks, sharing, tiers and trimming behave
     * as FULL. */
    KVT_KIND_MLA = 4,
} kvt_layer_kind;

typedef struct kvt_layer_desc {
    kvt_layer_kind kind;
    uint32_t window;      /* WINDOW: a query at p sees keys in (p - window, p] */
    uint32_t n_kv_heads;  /* FULL/WINDOW; MLA: 1 */
    uint32_t head_dim_k;  /* FULL/WINDOW; MLA: latent + rope key dims (the row) */
    uint32_t head_dim_v;  /* FULL/WINDOW; MLA: latent dims (< head_dim_k) */
    kvt_codec codec;      /* FULL/WINDOW/MLA: codec for blocks at/after quant_start */
    uint32_t state_bytes; /* RECURRENT: bytes of per-sequence state */
} kvt_layer_desc;

typedef struct kvt_kv_layout kvt_kv_layout;

/* base: the 16-bit codec used before quant_start (KVT_CODEC_F16 or KVT_CODEC_BF16). */
kvt_status kvt_kv_layout_create(const kvt_layer_desc *layers, uint32_t n_layers,
                                uint32_t block_tokens, kvt_codec base, uint32_t quant_start,
                                kvt_kv_layout **out, char *err, size_t errlen);
void kvt_kv_layout_free(kvt_kv_layout *l);

uint32_t kvt_kv_layout_n_layers(const kvt_kv_layout *l);
uint32_t kvt_kv_layout_block_tokens(const kvt_kv_layout *l);
uint32_t kvt_kv_layout_n_groups(const kvt_kv_layout *l);
const kvt_layer_desc *kvt_kv_layout_layer(const kvt_kv_layout *l, uint32_t layer);
/* group of a FULL/WINDOW layer; UINT32_MAX for RECURRENT */
uint32_t kvt_kv_layout_layer_group(const kvt_kv_layout *l, uint32_t layer);
kvt_layer_kind kvt_kv_layout_group_kind(const kvt_kv_layout *l, uint32_t group);
uint32_t kvt_kv_layout_group_window(const kvt_kv_layout *l, uint32_t group);
/* number of layers in a group and the i-th layer index of that group */
uint32_t kvt_kv_layout_group_n_layers(const kvt_kv_layout *l, uint32_t group);
uint32_t kvt_kv_layout_group_layer(const kvt_kv_layout *l, uint32_t group, uint32_t i);
/* codec a given layer uses for the block at `block_index` (resolves quant_start) */
kvt_codec kvt_kv_layout_codec_at(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index);
/* payload bytes of a block of `group` at `block_index` */
size_t kvt_kv_layout_block_bytes(const kvt_kv_layout *l, uint32_t group, uint32_t block_index);
/* byte offset of layer's K (kv=0) or V (kv=1) section inside such a block. The section is ordered
 * [kv_head][token]: the row of (token t, head h) is at section_offset + (h*block_tokens + t)*row_bytes.
 * An MLA layer has no V section: its V row_bytes is 0 (and its V offset that of K). */
size_t kvt_kv_layout_section_offset(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv);
size_t kvt_kv_layout_row_bytes(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv);
/* byte offset inside the block of the row of (token, head) of layer's K (kv=0) or V (kv=1) section */
size_t kvt_kv_layout_row_offset(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv, uint32_t token,
                                uint32_t head);
/* Steady-state KV bytes per token over all layers (after quant_start), for admission/accounting. */
double kvt_kv_layout_bytes_per_token(const kvt_kv_layout *l);
/* The same for one layer (0 for RECURRENT); MLA: exactly one latent row. */
double kvt_kv_layout_layer_bytes_per_token(const kvt_kv_layout *l, uint32_t layer);
/* Total bytes of recurrent state per sequence. */
size_t kvt_kv_layout_state_bytes(const kvt_kv_layout *l);
/* RECURRENT layer `layer`: offset of its state in the sequence state buffer and in a snapshot's
 * data (each layer's state starts 64-byte aligned, so states are not packed). 0 for other kinds. */
size_t kvt_kv_layout_state_offset(const kvt_kv_layout *l, uint32_t layer);
/* "full/f16" / "window(512)/q8g64" / "recurrent(4096B)" */
void kvt_kv_layout_describe_layer(const kvt_kv_layout *l, uint32_t layer, char *buf, size_t n);
/* Stable key for the scheme part of compatibility: e.g. "bt256-f16" or "bt256-kv8g64-s0" or
 * "bt256-cfg-<hash>"; identical layouts give identical keys. */
void kvt_kv_layout_key(const kvt_kv_layout *l, char *buf, size_t n);

/* ------------------------------------------------------------------ hashing */
uint64_t kvt_chain_hash(uint64_t parent, const int32_t *tokens, uint32_t n_tokens);
uint64_t kvt_root_hash(const char *compat_key, const char *ns);
/* Process-wide number of kvt_chain_hash calls so far (relaxed atomic counter; tests check that a
 * request hashes each prompt block once). */
uint64_t kvt_chain_hash_calls(void);

/* A request's chain: the chain hashes of a prompt's full blocks, computed once per request and
 * shared by every tier's lookup and by block sealing (kvt_seq_set_chain), so nothing recomputes
 * them. chain(0) = root, chain(i+1) = kvt_chain_hash(chain(i), tokens of block i).
 * Refcounted and immutable after create (thread-safe to share); it copies the tokens. */
typedef struct kvt_chain kvt_chain;
/* n may be 0. KVT_ERR_NOMEM / KVT_ERR_INVALID_ARG (block_tokens 0, tokens NULL with n > 0). */
kvt_status kvt_chain_create(uint64_t root, const int32_t *tokens, uint32_t n, uint32_t block_tokens, kvt_chain **out);
void kvt_chain_retain(kvt_chain *c);
void kvt_chain_release(kvt_chain *c); /* NULL is a no-op */
uint64_t kvt_chain_root(const kvt_chain *c);
uint32_t kvt_chain_len(const kvt_chain *c);          /* tokens */
uint32_t kvt_chain_block_tokens(const kvt_chain *c);
uint32_t kvt_chain_n_full(const kvt_chain *c);       /* len / block_tokens */
const int32_t *kvt_chain_tokens(const kvt_chain *c);
/* Chain hash after i full blocks (i <= n_full; root for i = 0). */
uint64_t kvt_chain_at(const kvt_chain *c, uint32_t i);

/* ------------------------------------------------------------------ block pool */
typedef struct kvt_block_pool kvt_block_pool;
typedef struct kvt_block kvt_block;

/* budget_bytes: cap on payload bytes of all live blocks (0 = unlimited). */
kvt_block_pool *kvt_block_pool_create(const kvt_kv_layout *layout, uint64_t budget_bytes);
void kvt_block_pool_free(kvt_block_pool *p);
const kvt_kv_layout *kvt_block_pool_layout(const kvt_block_pool *p);
uint64_t kvt_block_pool_used_bytes(const kvt_block_pool *p);
uint64_t kvt_block_pool_peak_bytes(const kvt_block_pool *p);
uint64_t kvt_block_pool_budget(const kvt_block_pool *p);
uint64_t kvt_block_pool_n_blocks(const kvt_block_pool *p);
/* Called (outside the pool lock) when an allocation would exceed the budget; it may free blocks
 * (e.g. evict cache-only blocks) and returns true if it freed anything, after which the allocation
 * is retried. */
typedef bool (*kvt_pressure_fn)(void *ctx, uint64_t bytes_needed);
void kvt_block_pool_set_pressure(kvt_block_pool *p, kvt_pressure_fn fn, void *ctx);

/* New mutable block (state WRITING, n_tokens 0, refcount 1). KVT_ERR_POOL_EXHAUSTED if over budget. */
kvt_status kvt_block_alloc(kvt_block_pool *p, uint32_t group, uint32_t block_index, kvt_block **out);
void kvt_block_retain(kvt_block *b);
void kvt_block_release(kvt_block *b);
uint32_t kvt_block_refcount(const kvt_block *b);

bool kvt_block_sealed(const kvt_block *b);
uint32_t kvt_block_group(const kvt_block *b);
uint32_t kvt_block_index(const kvt_block *b);     /* first position = index * block_tokens */
uint32_t kvt_block_n_tokens(const kvt_block *b);  /* block_tokens when full; fewer for a frozen tail */
const int32_t *kvt_block_tokens(const kvt_block *b);
uint64_t kvt_block_hash(const kvt_block *b);       /* valid once sealed */
uint64_t kvt_block_parent(const kvt_block *b);     /* valid once sealed */
const uint8_t *kvt_block_data(const kvt_block *b);
uint8_t *kvt_block_data_mut(kvt_block *b);         /* asserts !sealed */
size_t kvt_block_data_bytes(const kvt_block *b);
kvt_block_pool *kvt_block_pool_of(const kvt_block *b);
/* Seal a block filled from outside (SSD restore): sets tokens, parent and computes the hash.
 * Returns KVT_ERR_CORRUPT if expect_hash != 0 and differs. */
kvt_status kvt_block_seal(kvt_block *b, uint64_t parent, const int32_t *tokens, uint32_t n_tokens,
                          uint64_t expect_hash);
/* Last-use stamp for LRU by caches (monotonic ns); atomically updated. */
void kvt_block_touch(kvt_block *b);
uint64_t kvt_block_last_use(const kvt_block *b);

/* ------------------------------------------------------------------ recurrent snapshots */
/* A snapshot is the recurrent state of all RECURRENT layers at one chain position: refcounted,
 * immutable after creation. */
typedef struct kvt_snapshot kvt_snapshot;
uint32_t kvt_snapshot_pos(const kvt_snapshot *s);        /* number of tokens it covers */
uint64_t kvt_snapshot_chain(const kvt_snapshot *s);      /* chain hash of the tokens it covers */
const uint8_t *kvt_snapshot_data(const kvt_snapshot *s); /* kvt_kv_layout_state_bytes bytes */
void kvt_snapshot_retain(kvt_snapshot *s);
void kvt_snapshot_release(kvt_snapshot *s);

/* ------------------------------------------------------------------ sequences */
typedef struct kvt_seq kvt_seq;

kvt_status kvt_seq_create(kvt_block_pool *p, uint64_t root, kvt_seq **out);
void kvt_seq_free(kvt_seq *s);
kvt_block_pool *kvt_seq_pool(const kvt_seq *s);
uint64_t kvt_seq_root(const kvt_seq *s);
uint32_t kvt_seq_len(const kvt_seq *s);             /* committed tokens */
const int32_t *kvt_seq_tokens(const kvt_seq *s);
/* chain hash after the full block ending at token (block_index+1)*block_tokens */
uint64_t kvt_seq_block_chain(const kvt_seq *s, uint32_t block_index);

/* Shares every block (refcount), copies recurrent state. The tail (partial block) is shared too, but
 * frozen first, so the next write on either side copies it (copy-on-write of at most one block). */
kvt_status kvt_seq_clone(kvt_seq *src, kvt_seq **out);
/* True if the sequence can be cut back to n tokens: FULL always; WINDOW only if every block the
 * cut sequence's window would need is still held; RECURRENT only if n == len.
 * Exactly: for each WINDOW group, the blocks covering positions [n - window + 1, n) (what a query at
 * position n sees) must not have been dropped. n == len is always trimmable (a no-op). */
bool kvt_seq_can_trim(const kvt_seq *s, uint32_t n);
/* Keep WINDOW blocks until no query at position >= len - n can see them (from the next commit on),
 * so kvt_seq_trim back by up to n tokens from any length stays possible: speculative decoding
 * (engine/spec.h) cuts rejected draft tokens this way. A window group then holds up to n more
 * tokens of blocks. 0 (the default) releases blocks as soon as no later query can see them. */
void kvt_seq_set_rollback(kvt_seq *s, uint32_t n);
/* Drops tokens >= n (releases block refs past the cut). KVT_ERR_UNTRIMMABLE when !can_trim. */
kvt_status kvt_seq_trim(kvt_seq *s, uint32_t n);

/* Forward-pass write path. prepare() makes positions [len, len+n_new) writable: allocates blocks
 * and copies a shared/frozen tail; after it succeeds writes cannot fail. write_kv() encodes K and V
 * of one token (n_kv_heads*head_dim floats each) for one layer at an absolute position in that
 * range (MLA: k is the latent row, v is ignored and may be NULL). write_kv_heads() writes only
 * KV heads [h0, h1) of that position (k and v still hold all heads' rows; h1 <= n_kv_heads).
 * commit() appends the tokens, seals blocks that became full and releases WINDOW blocks that
 * no later query can see. Threads: write calls for distinct positions, or distinct KV heads of
 * one position, may run concurrently (a call encodes only its rows, each in its head's section,
 * and reads the block table, which only prepare/commit/trim change); never concurrently with
 * prepare, commit, trim or a read of the same rows (mla.c's expanded prefill fills its private
 * K/V by positions, a decode step's threads write their own KV heads, model.c). */
kvt_status kvt_seq_prepare(kvt_seq *s, uint32_t n_new);
void kvt_seq_write_kv(kvt_seq *s, uint32_t layer, uint32_t pos, const float *k, const float *v);
void kvt_seq_write_kv_heads(kvt_seq *s, uint32_t layer, uint32_t pos, const float *k, const float *v, uint32_t h0,
                            uint32_t h1);
kvt_status kvt_seq_commit(kvt_seq *s, const int32_t *tokens, uint32_t n);
/* Decode the rows of positions [t0, t1) of one KV head of `layer` (kv 0: K, 1: V) back to f32:
 * out gets t1 - t0 rows of head_dim floats, row stride ld. Reads committed positions and prepared
 * ones already written by write_kv (t1 <= the end of the last prepare), whose blocks must be held (FULL and MLA
 * always are). TURBO rows are un-rotated. MLA: kv 0, head 0 is the latent row [c | k_pe]. Read only:
 * like kvt_attention, may run concurrently on one seq from many threads. */
void kvt_seq_read_rows(const kvt_seq *s, uint32_t layer, int kv, uint32_t head, uint32_t t0, uint32_t t1, float *out,
                       size_t ld);

/* Block access for caches. n_blocks = ceil(len / block_tokens) (the last may be partial). A WINDOW
 * group's old blocks may be NULL (dropped). Returned pointers are borrowed. */
uint32_t kvt_seq_n_blocks(const kvt_seq *s);
kvt_block *kvt_seq_block(const kvt_seq *s, uint32_t group, uint32_t block_index);
/* Freeze the partial tail blocks (seal them with their n < block_tokens tokens) so a cache can share
 * them; afterwards kvt_seq_block returns them sealed and the next prepare() copies before writing. */
kvt_status kvt_seq_freeze_tail(kvt_seq *s);
/* Build a sequence from cached blocks: append sealed blocks for the next block index, one per group
 * (blocks[g]; a WINDOW group's entry may be NULL when outside the window of the final length).
 * Retains them. The block's parent must equal the sequence's current chain hash. */
kvt_status kvt_seq_append_blocks(kvt_seq *s, kvt_block *const *blocks);

/* Recurrent state (RECURRENT layers): a mutable per-sequence buffer per layer. */
uint8_t *kvt_seq_state(kvt_seq *s, uint32_t layer);
kvt_status kvt_seq_snapshot(kvt_seq *s, kvt_snapshot **out); /* at current len; caller owns ref */
/* Set the recurrent state from a snapshot; only valid when snapshot pos == seq len and chains match. */
kvt_status kvt_seq_restore_snapshot(kvt_seq *s, const kvt_snapshot *snap);
/* Attach a request's chain (retained; NULL detaches): when a block at index i becomes full with the
 * chain's tokens and parent, sealing takes its hash from the chain instead of hashing again. A
 * block whose tokens or parent differ (generated tokens, another prompt) is hashed as usual. */
void kvt_seq_set_chain(kvt_seq *s, kvt_chain *c);

/* ------------------------------------------------------------------ attention */
/* Attention for n_q queries at absolute positions pos0 .. pos0+n_q-1 over the sequence's KV for
 * `layer` (K/V of those positions must already be written by write_kv). Causal; WINDOW layers mask
 * keys with p_q - p_k >= window. Reads rows straight from the blocks (no gather), decoding each row
 * to f32 (affine: on the fly). GQA: query head h uses KV head h / (n_head / n_kv_heads).
 * q: n_q rows with stride q_stride floats, head h at q + h*head_dim_k.
 * out: n_q rows with stride out_stride floats, head h at out + h*head_dim_v.
 * Computes only heads [h0, h1) so callers can split heads across threads.
 * scratch: kvt_attention_scratch_floats(...) floats, private to the calling thread. */
/* n_ctx must be >= pos0 + n_q of every call that uses the scratch. */
size_t kvt_attention_scratch_floats(const kvt_kv_layout *l, uint32_t n_ctx);
void kvt_attention(const kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q, uint32_t q_stride,
                   uint32_t pos0, uint32_t n_head, float scale, uint32_t h0, uint32_t h1, float *out,
                   uint32_t out_stride, float *scratch);

/* Split-K attention for one query row at position pos, all n_head heads (the decode step): the
 * nth threads of a kvt_threadpool_run each call it with their ith and private scratch
 * (kvt_attention_scratch_floats), the same other arguments, and `shared`, one buffer of
 * kvt_attention_split_floats(n_head, n_ctx) floats for all of them (n_ctx > pos). Three phases,
 * a kvt_threadpool_barrier between them (none when nth == 1; tp may then be NULL):
 *   1. scores: the visible keys split into nth ranges, every KV head, so each K row is read once;
 *   2. softmax of whole heads, heads split across threads (kvt_attention's per-head code);
 *   3. weighted V sum: the V columns of all KV heads split across threads, every key in ascending
 *      order, so each V row is read once (a thread decodes only its columns).
 * out (n_head * head_dim_v floats) gets, bit for bit, what kvt_attention(s, layer, q, 1, ., pos,
 * n_head, scale, 0, n_head, out, ., scratch) computes, for any nth. The caller must reach a barrier
 * before `shared` is used again or out is read. Only layers kvt_attention_split_ok accepts: FULL
 * and WINDOW layers whose codecs are f16, bf16 or AFFINE (TURBO keeps V rotated per head; MLA reads
 * V from the K rows), with at most 64 query heads per KV head; the others use kvt_attention. */
bool kvt_attention_split_ok(const kvt_kv_layout *l, uint32_t layer, uint32_t n_head);
size_t kvt_attention_split_floats(uint32_t n_head, uint32_t n_ctx);
void kvt_attention_split(const kvt_seq *s, uint32_t layer, const float *q, uint32_t pos, uint32_t n_head, float scale,
                         float *out, float *shared, float *scratch, kvt_threadpool *tp, int ith, int nth);
/* Process-wide number of kvt_attention_split calls so far (counted by thread 0; relaxed atomic):
 * tests check that the forward pass took the split. */
uint64_t kvt_attention_split_calls(void);
/* Split-K pays from this many visible keys (below, its two extra barriers cost about what it saves). */
#define KVT_ATT_SPLIT_MIN_KEYS 1024u

/* Naive reference over contiguous f32 K/V ([n_kv][n_kv_heads][hd]) with the same semantics;
 * window = 0 means full attention. For tests. */
void kvt_attention_ref(const float *k, const float *v, uint32_t n_kv, uint32_t n_kv_heads,
                       uint32_t hd_k, uint32_t hd_v, const float *q, uint32_t n_q,
                       uint32_t q_stride, uint32_t pos0, uint32_t n_head, float scale,
                       uint32_t window, float *out, uint32_t out_stride);

#endif
