/*
 * kernels_internal.h — private to src/kernels: ggml block structs, the per-ISA kernel table and the
 * scalar helpers shared by quant_ref.c, the SIMD kernel files and dispatch.c.
 *
 * Ownership: nothing here allocates. The kernel tables are static, filled once by kvt_kernels_init.
 */
#ifndef KVT_KERNELS_INTERNAL_H
#define KVT_KERNELS_INTERNAL_H

#include "quant.h"

/* x86 SIMD kernels are built when the target is x86 (per-function target attributes, no global -m
 * flags); -DKVT_NO_SIMD builds the scalar-only configuration used on other CPUs (e.g. ARM). */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(KVT_NO_SIMD)
#define KVT_X86 1
#else
#define KVT_X86 0
#endif

/* ---- ggml block layouts (packed, sizes checked below) ---- */
#define QK4_0 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { uint16_t d; int8_t qs[QK8_0]; } blk_q8_0;
typedef struct { uint16_t d; uint16_t s; int8_t qs[QK8_0]; } blk_q8_1;
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } blk_q4_0;
typedef struct { uint16_t d; uint16_t m; uint8_t qs[QK4_0 / 2]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } blk_q5_0;
typedef struct { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } blk_q5_1;
typedef struct { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } blk_q4_K;
typedef struct {
    uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
} blk_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } blk_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } blk_q8_K;

_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 size");
_Static_assert(sizeof(blk_q8_1) == 36, "q8_1 size");
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 size");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1 size");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0 size");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1 size");
_Static_assert(sizeof(blk_q4_K) == 144, "q4_K size");
_Static_assert(sizeof(blk_q5_K) == 176, "q5_K size");
_Static_assert(sizeof(blk_q6_K) == 210, "q6_K size");
_Static_assert(sizeof(blk_q8_K) == 292, "q8_K size");

/* f16 -> f32 through the table (kvt_f16_table_init must have run: kvt_kernels_init and the public
 * ref entry points ensure it). */
static inline float kq_h2f(uint16_t h) { return kvt_f16_table[h]; }
/* 16-bit little-endian field at an unaligned address (block scales) */
static inline uint16_t kq_rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Unpack the 6-bit scale and min of sub-block j (0..7) from a Q4_K/Q5_K scales[12] array. */
static inline void kq_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- repacked (interleaved) weights for prefill GEMM (repack.c; layout read by the SIMD files) ----
 * Rows are taken in groups of KQP_ROWS = 4 (the last group padded with zero rows); a group stores its
 * blocks in order, and one group-block holds the 4 rows' weights of that block side by side, already
 * unpacked to one byte per weight, so a micro-kernel reads a 4-row tile with plain contiguous loads.
 * Small-block types (Q8_0 Q4_0 Q5_0 signed; Q4_1 Q5_1 unsigned), 32 weights a block:
 *   float d[4]; [float m[4] (unsigned types only)]; int8 q[4][32]        (144 / 160 bytes)
 * K-quants (Q4_K Q5_K: 6-bit scale + min; Q6_K: 16 int8 scales, q offset by 32), 256 a block:
 *   float d[4]; float dmin[4] (0 for Q6_K); int16 sc[8 groups][4 rows][2 halves];
 *   int16 mv[4 rows][16] (the bsums partners: min of the 16-value half for Q4/5_K, scale for Q6_K);
 *   uint8 q[8 groups][4 rows][32]                                          (1312 bytes)
 * f16 values are stored widened to f32 (exact), so the kernels compute the same numbers. */
#define KQP_ROWS 4
#define KQP_SMALL_S_BYTES 144
#define KQP_SMALL_U_BYTES 160
#define KQP_K_BYTES 1312
#define KQP_K_SC 32
#define KQP_K_MV 160
#define KQP_K_Q 288
struct kvt_packed {
    uint32_t type;
    int kind;              /* 0 small signed, 1 small unsigned, 2 Q4_K/Q5_K, 3 Q6_K, 4 F16/BF16 (GEMV copy only) */
    int64_t n_in, n_out;
    int64_t nb;            /* blocks per row */
    int64_t ngroups;       /* ceil(n_out / 4) */
    size_t gbb;            /* bytes per group-block */
    uint8_t *data;         /* ngroups * nb * gbb bytes, 64-byte aligned, owned */
    const void *W;         /* original rows (borrowed; scalar ISA path) */
    uint8_t *amx;          /* kind KQP_SMALL_S with AMX in use at create time: the AMX layout
                            * (kernels_amx.c; ceil(n_out/16) * nb * KQA_GBB bytes, owned), else NULL */
    uint8_t *s16;          /* kind KQP_SMALL_S with AVX-512 VNNI (not AMX) in use at create time: the
                            * 16-row layout of gemm_s16.c (owned; data is then NULL), else NULL */
    uint8_t *k16;          /* kinds KQP_KM / KQP_K6 with AVX-512 VNNI (not AMX) in use at create time: the
                            * 16-row layout (gemm_k16.c; kq_k16_bytes, owned) and then data == NULL */
    uint8_t *n16;          /* Q4_K/Q5_K/Q6_K, Q4_0/Q5_0/Q4_1/Q5_1 with AVX-512 VNNI or AMX in use at create
                            * time: the decode copy in a 16-row nibble layout (kq_n16_bytes, owned); ilv
                            * is then NULL */
    uint8_t *ilv;          /* the single-row GEMV copy (kq_ilv_build; owned) or NULL: the original blocks
                            * with rows taken 4 at a time and interleaved by block, group g holding
                            * block b of rows 4g..4g+3 at (g * nb + b) * 4 + i blocks; n_out rounded
                            * down to 4 rows (the rest stay in W only); the same bytes as W */
};
/* AMX layout (kernels_amx.c): groups of KQA_N outputs, per block float d[16] + int8 q[8][16][4] */
#define KQA_N 16
#define KQA_GBB 576
/* 16-row VNNI layout (gemm_s16.c): groups of KQS_N outputs, per block float d[16] + u8 q[8][16][4]
 * (weights + 128) */
#define KQS_N 16
#define KQS_GBB 576
bool kq_ilv_build(kvt_packed *P);            /* fills P->ilv from P->W; false on OOM / overflow */
/* Bytes of one interleaving block of the GEMV copy: the type's block, or 8 elements (one AVX2
 * vector: tile_f_s's block) for F16/BF16. */
size_t kq_ilv_block_bytes(const kvt_packed *P);
size_t kq_ilv_bytes(const kvt_packed *P);
bool kq_s16_build(kvt_packed *P);            /* fills P->s16 from P->W; false on OOM / overflow */
size_t kq_s16_bytes(const kvt_packed *P);
void kq_s16_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
void kq_s16_pmm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
/* One activation row (decode) on the s16 layout: y[o] for o in [o0, o1), the same bits as kq_s16_pmm. */
void kq_s16_gemv(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1);
/* 64-byte aligned storage for a packed weight copy (repack.c): from 2 MiB on it is 2 MiB aligned and
 * advised MADV_HUGEPAGE (transparent huge pages: fewer TLB misses and page faults while the kernels
 * stream it; advisory, 4 KiB pages otherwise). Freed with free(). kq_packed_alloc zeroes it;
 * kq_group_alloc does not (the group packs write every byte, so each page is first touched, and
 * cleared by the kernel, in their parallel parts). */
void *kq_packed_alloc(size_t bytes);
void *kq_group_alloc(size_t bytes);
/* Whether packed copies get MADV_HUGEPAGE (env KVT_HUGEPAGES=0 turns it off, for measuring its
 * effect; read once). */
bool kq_hugepages(void);
/* AVX-512 VNNI present (dispatch.c; after kvt_kernels_init) */
bool kq_has_vnni(void);
/* Whether the ISA in use runs single-row products of this kvt_packed.kind on the GEMV copy: a
 * gemv_ilv kernel with the bits of its row-major product (not Q8_0/Q4_0/Q5_0 under AMX or AVX-512
 * VNNI, whose row-major products take the int8-block order). */
bool kq_ilv_fits(int kind);
/* This thread's scratch of at least `bytes` (64-byte aligned, reused across calls), NULL on OOM. */
uint8_t *kq_tls_scratch(size_t bytes);
/* KQP_F: F16/BF16 rows whose only copy is the single-row GEMV one (no GEMM layout: products of more
 * rows read the original rows) */
enum { KQP_SMALL_S = 0, KQP_SMALL_U = 1, KQP_KM = 2, KQP_K6 = 3, KQP_F = 4, KQP_KINDS = 5 };

/* ---- per-ISA kernel table; NULL entries fall back to the scalar reference ---- */
typedef void (*kq_matmul_fn)(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1);
typedef void (*kq_pmatmul_fn)(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy,
                              int64_t o0, int64_t o1);
typedef void (*kq_dequant_fn)(const void *src, float *dst, int64_t n);
typedef struct kq_table {
    kq_matmul_fn matmul[KVT_TYPE_COUNT];
    kq_pmatmul_fn pmatmul[KQP_KINDS]; /* by kvt_packed.kind; must equal matmul[type] bit for bit */
    /* one activation row on kvt_packed.ilv, outputs [o0, o1) of whole groups (both multiples of 4,
     * o1 <= n_out rounded down to 4); must equal matmul[type] bit for bit */
    void (*gemv_ilv)(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1);
    kq_dequant_fn dequant[KVT_TYPE_COUNT];
    /* activation rows → vec-dot type (indexed by the vec-dot type: Q8_0, Q8_1, Q8_K); must produce
     * the same bytes as kvt_quantize_ref */
    void (*act_quant[KVT_TYPE_COUNT])(const float *x, void *dst, int64_t n);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
} kq_table;

/* AMX (kernels_amx.c, x86 only): CPUID AMX-TILE/INT8 + the Linux XTILEDATA permission request
 * (false if either is missing or refused); the KQP_SMALL_S kernel on P->amx (n_rows >= 1). */
bool kq_amx_request(void);
void kq_amx_pmm_small_s(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                        int64_t o1);
/* Row-major Q8_0 / Q4_0 / Q5_0 with the AMX kernel's float order (the AMX table's matmul[]). */
void kq_amx_mm_q8_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                    int64_t o1);
void kq_amx_mm_q4_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                    int64_t o1);
void kq_amx_mm_q5_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                    int64_t o1);

/* 16-row K-quant layout and AVX-512 VNNI GEMM (gemm_k16.c): per 16-row group and super-block
 * float dw[16]; float dm[16]; int8 sc[16 halves][16]; int16 mv[8][16][2]; uint8 q[64 k4][16][4]. */
#define K16_ROWS 16
#define K16_DM 64
#define K16_SC 128
#define K16_MV 384
#define K16_Q 896
#define K16_GBB 4992
/* 16-row nibble layouts for decode and small batches (kvt_packed.n16), groups of 16 outputs stored
 * in tiles of N16_NG groups (64 rows): a tile's blocks in order, each holding its groups'
 * group-blocks side by side. Every group-block is a multiple of 64 bytes and its vectors 64-byte
 * aligned. Q4_K/Q5_K (gemm_k16.c), per group and super-block: uint16 d[16] (f16); uint16 dm[16];
 * uint8 sc[8][16]; uint8 mn[4][16][2]; uint8 q[32 steps][16][4] (two 4-bit weights a byte); Q5_K also
 * uint8 qh[8][16][4] (fifth bits). Q6_K (gemm_k16.c), per group and super-block: uint16 d[16] (f16);
 * 32 zero bytes; int8 sc[16 halves][16]; the q plane of Q4_K holding the low 4 bits of q + 32; uint8
 * qh[8 sub-blocks g][2 k][16][4] (the top 2 bits: byte j holds, for the steps s = 4g + 2k + u, u = 0
 * and 1, those of weight 8s+j at bits 2u..2u+1 and of weight 8s+4+j at bits 4+2u..5+2u). Q4_0 and
 * Q5_0 (gemm_s16.c), per group and pair of 32-weight blocks: uint8 q[2][4][16][4] (the file's nibble
 * bytes: byte j of k holds weights 4k+j and 16+4k+j); uint16 d[2][16]; Q5_0 also uint8
 * qh[2][16][4] (byte j holds the fifth bit of weight 4k+j at bit k and of weight 16+4k+j at bit 4+k).
 * Q4_1 and Q5_1: Q4_0's q and d, then uint16 m[2][16] (f16); Q5_1 also Q5_0's qh plane. */
#define N16_NG 4
#define N16_DM 32
#define N16_SC 64
#define N16_MN 192
#define N16_Q 320
#define N16_QH 2368
#define N16_GBB_Q4 2368
#define N16_GBB_Q5 2880
#define N16_GBB_Q6 3392
#define N16_Q40_D 512
#define N16_GBB_Q40 576
#define N16_Q50_H 576
#define N16_GBB_Q50 704
#define N16_Q41_M 576
#define N16_GBB_Q41 640
#define N16_Q51_H 640
#define N16_GBB_Q51 768
enum { N16_K4 = 0, N16_K5 = 1, N16_K6 = 2 }; /* the K-quant kernel's variants */
#define N16_MAX_ROWS 8 /* activation rows the n16 kernels take (more: the GEMM layouts) */
#define N16_PFD 8192   /* bytes of the layout's stream the n16 kernels prefetch ahead */
static inline size_t kq_n16_gbb(const kvt_packed *P) {
    return P->type == KVT_TYPE_Q5_K   ? N16_GBB_Q5
           : P->type == KVT_TYPE_Q6_K ? N16_GBB_Q6
           : P->type == KVT_TYPE_Q4_0 ? N16_GBB_Q40
           : P->type == KVT_TYPE_Q5_0 ? N16_GBB_Q50
           : P->type == KVT_TYPE_Q4_1 ? N16_GBB_Q41
           : P->type == KVT_TYPE_Q5_1 ? N16_GBB_Q51
                                      : N16_GBB_Q4;
}
/* Whether P's type takes the nibble layout of the 32-weight blocks (Q4_0, Q5_0, Q4_1, Q5_1: pairs of
 * blocks, gemm_s16.c) rather than the K-quants' one. */
static inline bool kq_n16_pairs(const kvt_packed *P) {
    return P->type == KVT_TYPE_Q4_0 || P->type == KVT_TYPE_Q5_0 || P->kind == KQP_SMALL_U;
}
/* Group-blocks a group holds: the blocks (kq_n16_pairs: pairs of blocks; their rows have an even count). */
static inline int64_t kq_n16_nblk(const kvt_packed *P) { return kq_n16_pairs(P) ? P->nb / 2 : P->nb; }
/* Groups in the tile that starts at group t0 (N16_NG but for the last tile). */
static inline int64_t kq_n16_ntg(const kvt_packed *P, int64_t t0) {
    const int64_t ng = (P->n_out + 15) / 16;
    return ng - t0 < N16_NG ? ng - t0 : N16_NG;
}
/* The n16 kernels' prefetch of the next part of their stream: the n bytes from q on (64-byte lines),
 * none at or past pend (the end of the layout). */
static inline void kq_n16_prefetch(const uint8_t *q, size_t n, const uint8_t *pend) {
    for (const uint8_t *e = q + n; q < e && q < pend; q += 64) __builtin_prefetch(q, 0, 3);
}
/* Byte offset of group g's group-block b. */
static inline size_t kq_n16_off(const kvt_packed *P, int64_t g, int64_t b) {
    const int64_t t0 = g / N16_NG * N16_NG;
    return ((size_t)t0 * (size_t)kq_n16_nblk(P) + (size_t)b * (size_t)kq_n16_ntg(P, t0) + (size_t)(g - t0)) * kq_n16_gbb(P);
}
/* The n16 kernels' schedule (gemm_k16.c): tile by tile (N16_NG groups: 64 rows) over the groups of
 * [o0, o1), and within a tile the activation rows in chunks of 4, 2, 1 (the first chunk reads the
 * tile's stream from memory, the others find it in L2): fn(ctx, r, nr, g, tend, bs) for the groups
 * [g, tend) of one tile, bs its bytes per block. */
typedef void (*kq_n16_fn)(void *ctx, int64_t r, int nr, int64_t g, int64_t tend, size_t bs);
void kq_n16_drive(const kvt_packed *P, int64_t n_rows, int64_t o0, int64_t o1, kq_n16_fn fn, void *ctx);
bool kq_n16_build(kvt_packed *P); /* fills P->n16 from P->W (Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q4_1, Q5_1); false on OOM / overflow */
size_t kq_n16_bytes(const kvt_packed *P);
/* Scalar reference of the n16 kernels for one activation row: y[o] for o in [o0, o1). */
void kq_n16_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1);
void kq_n16_s_build(kvt_packed *P, uint8_t *L); /* gemm_s16.c: fills L (Q4_0, Q5_0, Q4_1, Q5_1) */
void kq_n16_s_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1);
void kq_n16_u_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1);
/* Up to N16_MAX_ROWS activation rows on P->n16: kvt_matmul_packed's contract, the bits of the GEMM
 * layouts and of the row-major kernels (Q4_K/Q5_K/Q6_K: gemm_k16.c; Q4_0/Q5_0, Q4_1/Q5_1: gemm_s16.c). */
void kq_n16_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
void kq_n16_s_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
void kq_n16_u_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
/* The SIMD horizontal sum of 8 float lanes (hsum_ps in kernels_x86_tmpl.h) in scalar: the order of
 * the Q4_1/Q5_1 products' 8 lanes. */
static inline float kq_hsum8(const float *a) {
    float s4[4];
    for (int k = 0; k < 4; k++) s4[k] = a[k] + a[k + 4];
    const float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
    return s0 + s1;
}
/* One 32-weight block of Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 at p → q[32] (signed values; Q4_1/Q5_1 their
 * unsigned codes), scale d and (Q4_1/Q5_1) min m (repack.c). */
void kq_unpack_small(uint32_t t, const uint8_t *p, int8_t *q, float *d, float *m);
void kq_unpack_k(uint32_t t, const uint8_t *p, uint8_t *q, float *d, float *dmin, int16_t sc2[8][2], int16_t mv[16]);
uint8_t *kq_k16_pack(const kvt_packed *P); /* from P->W; NULL on overflow / OOM */
size_t kq_k16_bytes(const kvt_packed *P);
void kq_k16_pmm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
void kq_k16_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);

/* bf16 pair-dot weights (gemm_bf16.c): groups of KBX_N outputs, per weight pair 16 dwords. */
#define KBX_N 16
void kq_bf16x_ref(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                  int64_t o1);
/* One reference step: s + w2.hi·x2.hi, then + w2.lo·x2.lo (each an fma, DAZ inputs, FTZ result). */
float kq_bf16x_step_ref(float s, uint32_t w2, uint32_t x2);
/* Load-time packs into output groups (gemm_bf16.c; their buffers from kq_group_alloc): part(ctx,
 * g0, g1) over groups [0, ng) on up to 8 threads once the matrix has 2^22 elements (the calling
 * thread takes the first part). false if any part returned false. */
bool kq_groups_parallel(int64_t ng, uint64_t n_all, bool (*part)(void *ctx, int64_t g0, int64_t g1), void *ctx);
/* The products of those packs (gemm_bf16.c, gemm_f16x.c): tile(ng, nr, ...) multiplies ng groups of
 * 16 outputs (the first at Wg, the next gs bytes on) with nr activation rows (X, xrb bytes apart,
 * n steps of the type's unit) and stores lanes [o0, o1) of outputs ob.. into y. kq_groups_mm walks
 * outputs [o0, o1) and rows [0, n_rows) of a product in rows_block-row blocks (their activations stay
 * in L2 while every group passes over them), tiles of tile_rows rows, and tiles of 4 groups for up to
 * g4_rows rows, 2 groups for up to g2_rows, else 1. Each output's arithmetic is the tile's, whatever
 * the walk. */
typedef void (*kq_grp_tile)(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb, int64_t n,
                            float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1);
typedef struct kq_grp_plan {
    int rows_block, tile_rows, g4_rows, g2_rows;
} kq_grp_plan;
void kq_groups_mm(const kq_grp_plan *pl, kq_grp_tile tile, const void *W, size_t gs, const void *act, size_t xrb,
                  int64_t n, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);

/* 16-bit weights in output groups (gemm_f16x.c): groups of KFX_N outputs, per input one 32-byte
 * line; wtype KVT_TYPE_F16X or KVT_TYPE_BF16G. */
#define KFX_N 16
void kq_f16x_ref(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                 int64_t o0, int64_t o1);
#if KVT_X86
void kq_f16x_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                int64_t o1);
void kq_bf16g_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                 int64_t o1);
void kq_f16x_mm_avx2(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                     int64_t o1);
void kq_bf16g_mm_avx2(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                      int64_t o1);
void kq_bf16x_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                 int64_t o1);
void kq_bf16_act_avx512(const float *x, void *dst, int64_t n);
void kq_bf16x_dp_hw(float acc[16], const uint32_t w2[16], const uint32_t x2[16]);
#endif

/* Filled by the SIMD files (x86 only). */
void kq_fill_avx2(kq_table *t);
void kq_fill_avx512(kq_table *t, bool vnni);

/* scalar reference pieces (quant_ref.c) */
float kq_dot_f32_ref(const float *a, const float *b, int64_t n);
void kq_axpy_f32_ref(float *y, float a, const float *x, int64_t n);

#endif
