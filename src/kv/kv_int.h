/*
 * kv_int.h — internal structures of the KV block substrate, shared by the .c files of src/kv only.
 * Nothing outside src/kv may include this file; the public contract is kv.h, whose ownership rules
 * apply to these structures too.
 */
#ifndef KVT_KV_INT_H
#define KVT_KV_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "../kernels/vec.h"
#include "kv.h"

/* Block variants: 0 = base 16-bit codec (before quant_start), 1 = configured codec. */
#define KVT_N_VARIANTS 2

typedef struct kvt_group_info {
    kvt_layer_kind kind;
    uint32_t window;
    uint32_t n_layers;
    uint32_t *layers;                    /* [n_layers] layer indices, increasing */
    size_t block_bytes[KVT_N_VARIANTS];  /* payload bytes of one block */
} kvt_group_info;

typedef struct kvt_layer_info {
    uint32_t group;                       /* UINT32_MAX for RECURRENT */
    kvt_codec codec[KVT_N_VARIANTS];      /* resolved codec per variant */
    size_t row_bytes[KVT_N_VARIANTS][2];  /* [variant][kv] */
    size_t offset[KVT_N_VARIANTS][2];     /* section offset inside the group's block */
    size_t state_offset;                  /* RECURRENT: offset in the sequence state buffer */
} kvt_layer_info;

struct kvt_kv_layout {
    uint32_t n_layers;
    uint32_t block_tokens;
    kvt_codec base;
    uint32_t quant_start;
    uint32_t quant_block; /* first block index that uses the configured codec */
    kvt_layer_desc *layers;
    kvt_layer_info *info;
    uint32_t n_groups;
    kvt_group_info groups[KVT_MAX_GROUPS];
    size_t state_bytes;
    uint32_t max_head_dim; /* max over K/V head dims of all attention layers */
    char key[96];
};

static inline int kvt_layout_variant(const kvt_kv_layout *l, uint32_t block_index) {
    return block_index >= l->quant_block ? 1 : 0;
}

/* Block states (see block.c for the state machine). */
enum { KVT_BLOCK_WRITING = 1, KVT_BLOCK_SEALED = 2 };

struct kvt_block {
    kvt_block_pool *pool;
    _Atomic uint32_t refcount;
    _Atomic uint32_t state;
    uint32_t group;
    uint32_t index;
    uint32_t n_tokens;
    uint64_t hash;
    uint64_t parent;
    _Atomic uint64_t last_use;
    size_t bytes;
    uint8_t *data;   /* 64-byte aligned payload of `bytes` bytes */
    int32_t *tokens; /* block_tokens entries */
};

struct kvt_block_pool {
    const kvt_kv_layout *layout;
    pthread_mutex_t mu;
    uint64_t budget;
    uint64_t used;
    uint64_t peak;
    uint64_t n_blocks;
    kvt_pressure_fn pressure;
    void *pressure_ctx;
};

struct kvt_snapshot {
    _Atomic uint32_t refcount;
    uint32_t pos;
    uint64_t chain;
    size_t bytes;
    uint8_t *data;
};

struct kvt_seq {
    kvt_block_pool *pool;
    const kvt_kv_layout *layout;
    uint64_t root;
    uint32_t len;       /* committed tokens */
    uint32_t prepared;  /* positions [len, prepared) are writable */
    int32_t *tokens;
    uint32_t cap_tokens;
    uint32_t n_slots;   /* block slots held per group (covers [0, prepared)) */
    uint32_t cap_slots;
    kvt_block **slots[KVT_MAX_GROUPS]; /* [cap_slots]; NULL = dropped (WINDOW only) */
    uint32_t first_held[KVT_MAX_GROUPS]; /* WINDOW: slots below this are NULL */
    uint64_t *chain;    /* [cap_slots] chain hash of each full block below len */
    uint8_t *state;     /* kvt_kv_layout_state_bytes bytes */
    kvt_chain *hint;    /* the request's chain (retained; kvt_seq_set_chain): sealing reuses its hashes */
    uint32_t rollback;  /* WINDOW blocks stay held this many tokens longer (kvt_seq_set_rollback) */
};

/* Internal helpers (block.c). */
void kvt_block_seal_internal(kvt_block *b, uint64_t parent, uint32_t n_tokens);
/* The same with the chain hash already known (== kvt_chain_hash(parent, b->tokens, n_tokens)). */
void kvt_block_seal_hashed(kvt_block *b, uint64_t parent, uint32_t n_tokens, uint64_t hash);
/* Whether the CPU has AVX2+FMA+F16C (kvt_kernels_best_isa; KVT_ISA does not lower it). */
bool kvt_kv_cpu_has_avx2(void);
/* f16 table, TURBO codebooks and the SIMD level the kernels' dispatcher chose (kernels/dispatch.c). */
void kvt_kv_cpu_init(void);

/* TURBO rows in the rotated basis (turbo.c): encode a rotated vector y; decode s*c[idx]. The SIMD
 * decodes (kvt_turbo_decode_row/_rows at level KVT_TURBO_AVX2, or KVT_TURBO_VBMI: 8-bit rows by
 * AVX-512 VBMI byte permutes, other widths as AVX2) are bit-identical to the scalar one. Pass a level
 * the CPU has: kvt_kv_turbo_level() (codec.c; follows the kernels' ISA, KVT_ISA, and
 * is lowered by kvt_vec_force_level). _rows decodes n rows, row r at src + r*rb, into dst + r*d. */
enum { KVT_TURBO_SCALAR = 0, KVT_TURBO_AVX2 = 1, KVT_TURBO_VBMI = 2 };
int kvt_kv_turbo_level(void);
size_t kvt_turbo_row_bytes(uint32_t bits, uint32_t d);
void kvt_turbo_encode_row(uint32_t bits, const float *y, uint32_t d, uint8_t *dst);
void kvt_turbo_init(void); /* builds the codebooks once (kvt_kv_cpu_init calls it) */
void kvt_turbo_decode_row(uint32_t bits, const uint8_t *src, uint32_t d, float *dst, int level);
void kvt_turbo_decode_rows(uint32_t bits, const uint8_t *src, size_t rb, uint32_t d, uint32_t n, float *dst,
                           int level);
void kvt_turbo_decode_row_scalar(uint32_t bits, const uint8_t *src, uint32_t d, float *dst);
/* Test hook: on = false makes the 8-bit VBMI lookup use both codebook halves even where the codebook
 * is antisymmetric (the default then reads only the lower half); returns the previous setting. */
bool kvt_turbo_test_vbmi8_sym(bool on);

/* Codec helpers shared by attention (codec.c). The f32 vector math attention runs on (dot, axpy,
 * their multi-row, four-query and transposed-key forms, exp, f16 rounding) is kernels/vec.h. */
void kvt_decode_row_fast(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst);
void kvt_decode_row_scalar(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst);
/* Elements [d0, d0 + w) of n rows of dim elements (row r at src + r*rb) into dst (row r at
 * dst + r*w), the bits of kvt_decode_row_fast's (split-K attention decodes the V columns of its
 * thread). f16/bf16: any range; AFFINE: d0 and w multiples of the group size; not TURBO (asserted). */
void kvt_decode_rows_part(kvt_codec c, const uint8_t *src, size_t rb, uint32_t dim, uint32_t d0, uint32_t w, uint32_t n,
                          float *dst);
/* Maximum of sc[0..n) ignoring NaNs, or -INFINITY (attention.c, softmax): the SIMD dispatch and its
 * scalar reference; equal except possibly the sign of a zero maximum. */
float kvt_attention_max_scores(const float *sc, uint32_t n);
float kvt_attention_max_scores_scalar(const float *sc, uint32_t n);

#endif
