/*
 * quant.h — ggml tensor types: block layouts, scalar reference dequantization and quantization,
 * and the dot/matmul kernels (scalar, AVX2, AVX-512) chosen at run time.
 *
 * Every SIMD kernel has a scalar reference here (the *_ref functions) and a test comparing them.
 * Numerics contract (batch invariance): kvt_matmul_rows computes every output element with the same
 * instruction sequence whatever n_rows, the [o0,o1) split or the thread count, so chunked prefill,
 * unchunked prefill and single-token decode give bit-identical rows.
 *
 * Implementation notes (kvtier kernels):
 *  - Activations: Q8_0 (f16 d) for Q4_0/Q5_0/Q8_0, Q8_1 (f16 d, s = d·Σq) for Q4_1/Q5_1, Q8_K (f32 d,
 *    int8 qs[256], int16 bsums[16]) for K-quants. F32, F16 and BF16 weights use the f32 activations
 *    unchanged (F16 weights are widened to f32 in registers; activations are not rounded to f16),
 *    except where loaders packed them as KVT_TYPE_BF16X (bf16 activations; see below).
 *    kvt_act_quantize's SIMD versions write exactly the bytes of kvt_act_quantize_ref(vec_dot_type)
 *    (Q8_0/Q8_1 as ggml's run-time CPU quantizer rounds them; weights keep kvt_quantize_ref's).
 *  - kvt_matmul_rows tiles 4 weight rows × (4 on AVX-512, 2 on AVX2) activation rows. K-quant
 *    results equal kvt_matmul_rows_ref bit for bit on every ISA; the other types differ from the
 *    reference only by float summation order (lane-parallel), |diff| <= 1e-5·Σ|w·x| in the tests.
 *  - Build with -DKVT_NO_SIMD (or on non-x86) for the scalar-only configuration.
 *
 * Ownership: stateless; all buffers are caller-owned. kvt_kernels_init() must be called once (it is
 * idempotent and thread-safe) before the dispatched functions are used.
 */
#ifndef KVT_QUANT_H
#define KVT_QUANT_H

#include "../util/common.h"

typedef enum kvt_type {
    KVT_TYPE_F32 = 0, KVT_TYPE_F16 = 1, KVT_TYPE_Q4_0 = 2, KVT_TYPE_Q4_1 = 3, KVT_TYPE_Q5_0 = 6,
    KVT_TYPE_Q5_1 = 7, KVT_TYPE_Q8_0 = 8, KVT_TYPE_Q8_1 = 9, KVT_TYPE_Q2_K = 10, KVT_TYPE_Q3_K = 11,
    KVT_TYPE_Q4_K = 12, KVT_TYPE_Q5_K = 13, KVT_TYPE_Q6_K = 14, KVT_TYPE_Q8_K = 15,
    KVT_TYPE_BF16 = 30,
    /* Not a GGUF type: F16/BF16 weights packed at load for the bf16 pair dot (kvt_bf16x_pack). */
    KVT_TYPE_BF16X = 40,
    /* Not GGUF types: F16 / BF16 weights packed at load in 16-output groups (kvt_f16x_pack). */
    KVT_TYPE_F16X = 41,
    KVT_TYPE_BF16G = 42,
    KVT_TYPE_COUNT = 43,
} kvt_type;

/* true for the weight types we load: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K */
bool kvt_type_supported(uint32_t t);
/* true for any id ggml defines (for "unsupported type X" vs "invalid type id X" messages); false
 * for the internal KVT_TYPE_BF16X, KVT_TYPE_F16X and KVT_TYPE_BF16G */
bool kvt_type_known(uint32_t t);
const char *kvt_type_name(uint32_t t);          /* "q4_K", "f16"; "?" if unknown */
int kvt_type_from_name(const char *name);       /* -1 if unknown */
uint32_t kvt_type_block_elems(uint32_t t);      /* 0 if unknown */
uint32_t kvt_type_block_bytes(uint32_t t);      /* 0 if unknown */
/* bytes of a row of n elements; 0 if n is not a multiple of the block size */
uint64_t kvt_type_row_bytes(uint32_t t, uint64_t n);

/* Scalar reference dequantization of n elements (n multiple of the block size). */
void kvt_dequant_ref(uint32_t t, const void *src, float *dst, int64_t n);
/* Reference quantization (ggml's reference quantizers), used by gen-model and tests. */
void kvt_quantize_ref(uint32_t t, const float *src, void *dst, int64_t n);
/* Activation quantization to the vec-dot type t (what kvt_act_quantize writes): Q8_0/Q8_1 with the
 * rounding of ggml's CPU quantizer (id = 127/amax, ties to even; quant_ref.c), other types as
 * kvt_quantize_ref. */
void kvt_act_quantize_ref(uint32_t t, const float *src, void *dst, int64_t n);
/* Dispatched dequantization (SIMD where available). */
void kvt_dequant_row(uint32_t t, const void *src, float *dst, int64_t n);

/* ---- matmul: y[r*ldy + o] = dot(W row o, x row r) ---- */
/* The activation type a weight type is multiplied with (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1,
 * Q8_K for K-quants, F32 for F32/F16/BF16). */
uint32_t kvt_vec_dot_type(uint32_t wtype);
/* Bytes needed to hold n_rows activation rows of n_in elements converted for wtype. */
size_t kvt_act_bytes(uint32_t wtype, int64_t n_in, int64_t n_rows);
/* Convert activation rows [r0, r1) (row stride n_in floats) into buf (laid out as returned by
 * kvt_act_bytes for all rows). Threads may convert disjoint row ranges. */
void kvt_act_quantize(uint32_t wtype, const float *x, int64_t n_in, int64_t r0, int64_t r1, void *buf);
/* Output columns [o0, o1) for all n_rows rows. W has n_out rows of n_in elements of wtype. */
void kvt_matmul_rows(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows,
                     float *y, int64_t ldy, int64_t o0, int64_t o1);
/* Reference (scalar) version of the same, for tests. */
void kvt_matmul_rows_ref(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows,
                         float *y, int64_t ldy, int64_t o0, int64_t o1);

/* ---- prefill GEMM on repacked weights ----
 * kvt_packed_create copies W (n_out rows of n_in elements of wtype) once, at model load, into an
 * interleaved layout (4 rows per block, one byte per weight; see kernels_internal.h) that the GEMM
 * micro-kernels read contiguously. Types: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K; and F16/BF16 with
 * rows of at most 2 KiB under AVX2, which get only the single-row GEMV copy below (their products
 * of more rows read W); others (and KVT_REPACK=0 in the environment) give NULL, and the caller keeps
 * using kvt_matmul_rows.
 * KVT_REPACK=gemv makes only the single-row GEMV copy below (benchmarks of decode).
 * Memory: about 1.06x (Q8_0), 2x (Q4_0/Q5_0), 2.3x (Q4_K) of the original weight bytes, plus 1x for
 * the single-row GEMV copy: the original blocks with 4 rows interleaved by block, so the rows a
 * GEMV tile reads are one contiguous stream (about 1.5x the GEMV speed from DRAM of 4 rows a row
 * apart, measured on an AVX2 Zen 3; KVT_GEMV_ILV=0 turns the copy off). n_rows == 1 reads that
 * copy (or W when it could not be made), more rows the GEMM layout. Q8_0 under AVX-512 VNNI has no
 * interleaved copy (its products take the int8-block order): its 16-row GEMM layout (gemm_s16.c,
 * 1.06x) serves one row too, and KVT_REPACK=gemv makes it.
 * kvt_matmul_packed gives results bit-identical to kvt_matmul_rows on the same W for the ISA in use
 * (so the numerics id and batch invariance are unchanged): the same integer dot per 4-lane group,
 * the same float operations in the same order.
 * The layout follows the ISA in use at create time (Q4_K/Q5_K/Q6_K under AVX-512 VNNI: 16 rows per
 * group, gemm_k16.c, instead of the 4-row one); used under another ISA it runs kvt_matmul_rows.
 * Ownership: the packed copy is owned by the handle; W is borrowed and must outlive it. */
typedef struct kvt_packed kvt_packed;
kvt_packed *kvt_packed_create(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out);
void kvt_packed_free(kvt_packed *p);
size_t kvt_packed_bytes(const kvt_packed *p);
/* Same contract as kvt_matmul_rows(p's type, W, n_in, act, ...). */
void kvt_matmul_packed(const kvt_packed *p, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                       int64_t o1);
/* Scalar reference reading the packed layout: emulates the SIMD path's lane order (bit-identical to
 * kvt_matmul_rows on the AVX2 and AVX-512 paths; K-quants equal kvt_matmul_rows_ref). For tests. */
void kvt_matmul_packed_ref(const kvt_packed *p, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                           int64_t o1);
/* AMX (ISA KVT_ISA_AMX): kvt_matmul_packed of Q8_0/Q4_0/Q5_0 weights with n_rows >= this runs the
 * int8 TMUL kernel. Its float order (per block: exact int32 dot, then acc = fma(isum, dw·dx, acc))
 * differs from the AVX-512 path, so under AMX every such product (kvt_matmul_rows, packed with fewer rows) uses it
 * too: results are the same for any n_rows (decode == full recompute); numerics id "int8-block",
 * shared with AVX-512 VNNI, whose 16-row GEMM (gemm_s16.c) computes the same arithmetic.
 * Other types keep the AVX-512 kernels. */
#define KVT_AMX_MIN_ROWS 16
/* Scalar reference of the AMX kernel's arithmetic on p's AMX layout (p built while the ISA was
 * KVT_ISA_AMX and of type Q8_0/Q4_0/Q5_0; otherwise does nothing). For tests. */
void kvt_matmul_packed_amx_ref(const kvt_packed *p, const void *act, int64_t n_rows, float *y, int64_t ldy,
                               int64_t o0, int64_t o1);
/* Whether p carries the AMX layout (used by kvt_matmul_packed when the ISA is KVT_ISA_AMX). */
bool kvt_packed_has_amx(const kvt_packed *p);
/* Whether p carries the single-row GEMV copy (4 rows interleaved by block; for tests). */
bool kvt_packed_has_ilv(const kvt_packed *p);
/* The layout single-row products of p read ("interleaved": the 4-row copy; "16-row": the K-quants'
 * and Q4_0's nibble layouts or Q8_0's 16-row layout under AVX-512 VNNI), or NULL: the original rows.
 * The string is static. */
const char *kvt_packed_gemv_layout(const kvt_packed *p);

/* ---- bf16 pair-dot weights (KVT_TYPE_BF16X, gemm_bf16.c) ----
 * Where the CPU has AVX-512 BF16 (vdpbf16ps: 32 multiply-adds an instruction, twice an f32 FMA),
 * the model loader packs F16 and BF16 matrices into KVT_TYPE_BF16X: groups of 16 outputs, each
 * weight pair of the 16 in one 64-byte vector. Weights are never rounded: an F16 matrix is packed
 * only when every value is exactly a bf16 (F16 files converted from bf16 checkpoints are); the
 * activations are rounded to bf16 (kvt_vec_dot_type(BF16X) = BF16), and each output is one
 * sequential vdpbf16ps chain over the pairs (exact model in gemm_bf16.c), so decode == prefill bit
 * for bit. The packed buffer is the matrix's only storage for kvt_matmul_rows(BF16X, buf, ...):
 * kvt_type_row_bytes(BF16X, n) = 2n, but rows are interleaved, so only whole matrices (allocated
 * by kvt_bf16x_pack) are valid W, and o0/o1 may be any range. Without the instruction (another
 * ISA forced after loading) the scalar reference computes the same bits, slowly. */
/* What loaders should pack (env KVT_BF16X, read once at kernel init): OFF where the ISA in use has
 * no bf16 kernel or KVT_BF16X=0; ROUND with KVT_BF16X=round: F16 matrices with values that are not
 * bf16 values too, their weights rounded to nearest bf16 (lossy, opt-in: faster prefill for F16
 * files made from f16 checkpoints); else LOSSLESS. */
typedef enum kvt_bf16x_mode { KVT_BF16X_OFF = 0, KVT_BF16X_LOSSLESS = 1, KVT_BF16X_ROUND = 2 } kvt_bf16x_mode;
kvt_bf16x_mode kvt_bf16x_policy(void);
static inline bool kvt_bf16x_enabled(void) { return kvt_bf16x_policy() != KVT_BF16X_OFF; }
/* Pack W (n_out rows of n_in F16 or BF16 values). NULL when not applicable (other type, odd n_in,
 * an F16 value that is not a bf16 unless round_f16) or out of memory. Returns a 64-byte aligned
 * buffer of *bytes, owned by the caller (free()). Does not consult kvt_bf16x_policy. */
uint8_t *kvt_bf16x_pack(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out, bool round_f16, size_t *bytes);

/* ---- 16-bit weights in output groups (KVT_TYPE_F16X / KVT_TYPE_BF16G, gemm_f16x.c) ----
 * Where the ISA in use is AVX-512 or AVX2, the model loader packs the F16 and BF16 matrices the bf16 pair
 * dot does not take (F16 values that are not bf16 values; any, where the CPU lacks AVX-512 BF16 or
 * KVT_BF16X=0) into KVT_TYPE_F16X (F16) or KVT_TYPE_BF16G (BF16): groups of 16 outputs, per input
 * one 32-byte line of the 16 outputs' weights. Weights are not rounded and the activations stay f32
 * (kvt_vec_dot_type = F32); each output is one sequential f32 FMA chain over the inputs
 * (gemm_f16x.c), so decode == prefill bit for bit, on every ISA. As with BF16X, the packed buffer is
 * the matrix's only storage: only whole matrices from kvt_f16x_pack are valid W
 * (kvt_type_row_bytes(F16X, n) = 2n), and o0/o1 may be any range. Without an AVX-512 or AVX2 kernel
 * (the scalar ISA forced after loading) the scalar reference computes the same bits, slowly. */
/* Whether loaders should pack: the ISA in use has the kernel and KVT_F16X is not 0/off (read once
 * at kernel init). */
bool kvt_f16x_enabled(void);
/* Pack W (n_out rows of n_in values of wtype F16 or BF16; the result is F16X or BF16G). NULL for
 * another type, a bad shape or out of memory. Returns a 64-byte aligned buffer of *bytes, owned by
 * the caller (free()). Does not consult kvt_f16x_enabled. */
uint8_t *kvt_f16x_pack(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out, size_t *bytes);

/* ---- dispatch ---- */
/* KVT_ISA_AMX = the AVX-512 VNNI kernels plus the AMX int8 prefill GEMM (CPUID AMX-TILE/INT8 and
 * the Linux arch_prctl XTILEDATA permission; KVT_AMX_DENY=1 simulates a refusal). */
typedef enum kvt_isa { KVT_ISA_SCALAR = 0, KVT_ISA_AVX2 = 1, KVT_ISA_AVX512 = 2, KVT_ISA_AMX = 3 } kvt_isa;
void kvt_kernels_init(void);
kvt_isa kvt_kernels_best_isa(void);     /* what the CPU supports */
kvt_isa kvt_kernels_isa(void);          /* what is in use */
/* Force an ISA (tests, benchmarks; env KVT_ISA=scalar|avx2|avx512|amx does the same at init). Returns
 * false if the CPU lacks it. Not thread-safe against concurrent kernel use. */
bool kvt_kernels_force_isa(kvt_isa isa);
const char *kvt_isa_name(kvt_isa isa);
/* AVX-512 VBMI (byte permutes) beside KVT_ISA_AVX512: the KV cache's 8-bit TURBO decode uses it
 * while the ISA in use is AVX-512 or AMX (kv/codec.c). What the CPU has, not what is in use. */
bool kvt_kernels_has_vbmi(void);
/* Names the numerics of the kernels in use (after kvt_kernels_init): the ISA path and any kernel
 * variant that changes results ("scalar", "avx2", "int8-block" = AVX-512 VNNI or AMX). Paths are not
 * bit-identical, so persisted KV is keyed by this (kvt_ssd_compat_key). Static string. A model with
 * KVT_TYPE_BF16X or KVT_TYPE_F16X / BF16G matrices adds its own tags (kvt_model_numerics_tag). */
const char *kvt_kernels_numerics_id(void);

/* Small f32 helpers used by the forward pass (dispatched). */
float kvt_dot_f32(const float *a, const float *b, int64_t n);
void kvt_axpy_f32(float *y, float a, const float *x, int64_t n); /* y += a*x */

#endif
