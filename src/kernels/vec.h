/*
 * vec.h — f32 vector math of the forward pass and of attention: dot, axpy and their multi-row and
 * four-query forms, the transposed-key attention products, exp (softmax and gates), SiLU and
 * sigmoid gates, f16 rounding. One scalar reference (`_ref`) per operation, AVX2+FMA and AVX-512
 * variants, and one dispatcher: the table follows the kernels' ISA (kernels/dispatch.c: CPUID or
 * KVT_ISA; AMX runs the AVX-512 table).
 *
 * Numerics: every SIMD variant gives the bits of its `_ref` twin (vec.c says how, per operation;
 * tests/test_vec.c and tests/test_kv_codec.c compare them bit for bit), so the ISA never changes
 * a result of these operations.
 *
 * Ownership: nothing here allocates except kvt_vec_dot_kt_q4_ref for rows longer than
 * KVT_KT_MAX_DIM (freed before it returns). Pointers are borrowed for the call. The tables are
 * static and live for the process.
 *
 * Threads: every operation is reentrant. kvt_vec_force_level (tests) and kvt_kernels_force_isa
 * switch the table for the whole process; not thread-safe against concurrent use.
 */
#ifndef KVT_VEC_H
#define KVT_VEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* The layout of an encoded K/V row that the kernels read in place (kv/codec.c writes them):
 *   KVT_ROWS_F16: dim halves (IEEE f16, widened exactly);
 *   KVT_ROWS_A8 / KVT_ROWS_A4: affine, dim * bits / 8 code bytes (4 bits: element 2k in the low
 *   nibble of byte k, 2k + 1 in the high one), then dim / group scales, then as many biases, each
 *   f16 (bf16 when scale_bf16); element j = scale * code + bias of its group (an f32 multiply,
 *   then an add: the codec's decode). group is 32, 64 or 128. */
enum { KVT_ROWS_F16, KVT_ROWS_A8, KVT_ROWS_A4 };
typedef struct kvt_vec_rowfmt {
    uint8_t kind;       /* KVT_ROWS_* */
    uint8_t scale_bf16; /* affine: scales and biases are bf16 */
    uint16_t group;     /* affine: elements per scale/bias pair */
    uint32_t dim;       /* elements per row */
    /* Where the rows continue, for the kernels' fetches ahead only (results never depend on it): a
     * fetch address at or past run_end is taken at run_next + (address - run_end) instead. The
     * attention's rows of one KV head are one run per block, and the next block's run is
     * elsewhere; without this the fetches past a block's run land on rows read much later (the next
     * head's). run_end NULL: no continuation. Both borrowed for the call. */
    const uint8_t *run_end, *run_next;
    /* Nonzero: the rows are already in cache (an earlier pass over them just read them), so the
     * kernels skip their fetches ahead, whose instructions cost more than they save there. Results
     * never depend on it. */
    uint8_t cached;
} kvt_vec_rowfmt;

/* One ISA's implementations. Argument meaning is that of the kvt_vec_* functions below. */
typedef struct kvt_vec_ops {
    int level; /* 0 scalar reference, 1 AVX2+FMA(+F16C), 2 AVX-512 */
    float (*dot)(const float *a, const float *b, uint32_t n);
    void (*axpy)(float *y, float a, const float *x, uint32_t n);
    void (*vfma)(float *y, const float *w, const float *x, uint32_t n);
    void (*scale)(float *y, float a, uint32_t n);
    void (*dot_rows)(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                     float *out);
    void (*axpy_rows)(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n);
    void (*dot_q4)(const float *const *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                   float *const *out);
    void (*axpy_q4)(float *const *y, const float *const *w, const float *x, size_t stride, uint32_t n_rows,
                    uint32_t n);
    void (*transpose_rows)(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk);
    void (*transpose_f16_rows)(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt, size_t ldk);
    void (*dot_kt_q4)(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n, float scale,
                      float *const *out);
    /* encoded rows read in place (NULL: this level decodes rows into a tile and runs the f32 forms) */
    void (*dot_enc_qn)(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, size_t rb,
                       uint32_t n_rows, float scale, float *const *out);
    void (*axpy_enc_qn)(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,
                        const float *const *w, uint32_t nq, const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0,
                        uint32_t n);
    float (*exp_sum)(float *sc, uint32_t n, float m);
    void (*lanes_reduce)(float *o, const float *acc, size_t ld, uint32_t n);
    void (*round_f16)(const float *src, float *dst, uint32_t n, float mul);
    void (*exp_clamped)(float *y, const float *x, uint32_t n);
    void (*silu_mul)(float *y, const float *g, const float *u, uint32_t n);
    void (*gelu_mul)(float *y, const float *g, const float *u, uint32_t n);
    void (*sigmoid_mul)(float *y, const float *g, const float *u, uint32_t n);
    uint32_t (*argmax)(const float *x, uint32_t n);
} kvt_vec_ops;

/* The table of an ISA (AMX: the AVX-512 one). The caller makes sure the CPU runs it
 * (isa <= kvt_kernels_best_isa()); out-of-range values give the scalar table. */
const kvt_vec_ops *kvt_vec_ops_for(kvt_isa isa);
/* The table in use: kvt_kernels_isa()'s, or lower after kvt_vec_force_level. Before
 * kvt_kernels_init has run it is the scalar table (same results, slower). */
const kvt_vec_ops *kvt_vec(void);
/* Called by the kernels' dispatcher whenever it selects an ISA. */
void kvt_vec_select(kvt_isa isa);
/* Level of the table in use (kvt_vec_ops.level). */
int kvt_vec_level(void);
/* Tests: lower the level (0..2) of the table in use; never raises it. */
void kvt_vec_force_level(int level);

/* ---- operations (the table in use) ----
 * dot(a, b, n): 16 lane sums (lane l: elements i ≡ l mod 16 of the first n & ~15, fmaf in
 *   ascending i), t[l] = acc[l] + acc[l+8], ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)), then the tail in
 *   order with fmaf.
 * axpy: y[i] = fmaf(a, x[i], y[i]). vfma: y[i] = fmaf(w[i], x[i], y[i]). scale: y[i] *= a.
 * dot_rows: out[r] = dot(q, k + r*stride, n) * scale, r < n_rows.
 * axpy_rows: for r ascending, axpy(y, w[r], x + r*stride, n).
 * dot_q4 / axpy_q4: four queries (exactly 4 distinct outputs; callers pad q/out with duplicates,
 *   y/w with a dummy): out[j][r] = dot(q[j], k + r*stride, n) * scale; axpy_rows(y[j], w[j], ...).
 * Transposed keys (attention's pass 1): kt holds keys as columns, element d of key r at
 *   kt[d*ldk + r]. transpose_rows fills it from n_rows rows (row r at k + r*stride, n elements) and
 *   zeroes columns n_rows..pad16(n_rows)-1 (kt needs that many columns; ldk >= them);
 *   transpose_f16_rows does the same from f16 rows (row r at src + r*rb bytes, exact decode).
 *   dot_kt_q4: out[j][r] = dot(q[j], key r, n) * scale for j < 4, r < n_keys (the dot's lanes and
 *   tree, keys across the vector lanes); any n (the scalar twin copies rows of up to
 *   KVT_KT_MAX_DIM on the stack, longer ones on the heap; without memory the scores are NaN). The
 *   SIMD path needs AVX-512, n % 16 == 0 and ldk % 16 == 0 and reads columns up to pad16(n_keys).
 * Encoded rows read in place (attention over an f16 or affine KV cache; row r at x + r*rb bytes,
 *   laid out as f says, each element decoded exactly as the codec does), for nq = 1..KVT_VEC_QN
 *   queries:
 *   dot_enc_qn: out[j][r] = dot(q[j], row r, f->dim) * scale;
 *   axpy_enc_qn: for r ascending, axpy(y[j] + ((lane0 + r) % nl) * ld, w[j][r], elements [d0, d0 + n)
 *   of row r, n): row r into lane (lane0 + r) % nl of nl >= 1 lanes (lane0 < nl), lane l
 *   of query j at y[j] + l * ld (the attention's V product: key p into lane p % 16). Each element
 *   of a lane is one fmaf chain over its rows in ascending order, however the kernel orders the
 *   lanes.
 *   The same bits as decoding the rows and calling dot_rows / axpy_rows per query (and lane).
 *   kvt_vec_rows_fused(f, d0, n) says whether the table in use has SIMD forms for that format and
 *   column range (dim, d0 and n multiples of 16, dim <= KVT_KT_MAX_DIM); the kvt_vec_* calls work
 *   for any valid format at every level (the scalar references otherwise).
 * lanes_reduce: o[d] = the 16 lanes acc[l * ld + d] (l < 16) of column d reduced as
 *   _mm512_reduce_add_ps does (t_l = a_l + a_l+8, u_l = t_l + t_l+4, (u0 + u2) + (u1 + u3)), d < n:
 *   the attention's V lanes into its output. Column by column, so every level has the same bits.
 * exp_sum (softmax): sc[j] = kvt_vec_exp(sc[j] - m) for j < n; returns their sum in the dot's
 *   16-lane order.
 * round_f16: dst[i] = f16(src[i] * mul) widened to f32, round to nearest even (src == dst allowed).
 * exp_clamped: y[i] = kvt_vec_exp_clamped(x[i]).
 * silu_mul: y[i] = g/(1 + exp_clamped(-g)) * u[i] (u NULL: the silu alone); y may alias g or u.
 * gelu_mul: y[i] = GELU(g[i]) * u[i], GELU's tanh form as g/(1 + exp_clamped(-z2)) with
 *   z2 = (g·2·sqrt(2/π))·(1 + 0.044715·g²) (= g·σ(2z), no 1 + tanh cancellation); y may alias g or u.
 * sigmoid_mul: y[i] = u[i] / (1 + exp_clamped(-g[i])); y may alias g or u.
 * argmax: the index the scan best = 0; for i: if (x[i] > x[best]) best = i gives (greedy sampling):
 *   the first of the largest values, NaN never chosen unless x[0] is NaN (then 0); 0 for n == 0. */
#define KVT_KT_MAX_DIM 1024
#define KVT_VEC_QN 4

float kvt_vec_dot(const float *a, const float *b, uint32_t n);
void kvt_vec_axpy(float *y, float a, const float *x, uint32_t n);
void kvt_vec_dot_rows(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                      float *out);
void kvt_vec_axpy_rows(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n);
void kvt_vec_dot_q4(const float *const *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                    float *const *out);
void kvt_vec_axpy_q4(float *const *y, const float *const *w, const float *x, size_t stride, uint32_t n_rows,
                     uint32_t n);
void kvt_vec_transpose_rows(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk);
void kvt_vec_transpose_f16_rows(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt, size_t ldk);
void kvt_vec_dot_kt_q4(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n, float scale,
                       float *const *out);
bool kvt_vec_rows_fused(const kvt_vec_rowfmt *f, uint32_t d0, uint32_t n);
void kvt_vec_dot_enc_qn(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, size_t rb,
                        uint32_t n_rows, float scale, float *const *out);
void kvt_vec_axpy_enc_qn(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,
                         const float *const *w, uint32_t nq, const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0,
                         uint32_t n);
float kvt_vec_exp_sum(float *sc, uint32_t n, float m);
void kvt_vec_lanes_reduce(float *o, const float *acc, size_t ld, uint32_t n);
void kvt_vec_round_f16(const float *src, float *dst, uint32_t n, float mul);
void kvt_vec_silu_mul(float *y, const float *g, const float *u, uint32_t n);
void kvt_vec_gelu_mul(float *y, const float *g, const float *u, uint32_t n);
uint32_t kvt_vec_argmax(const float *x, uint32_t n);

/* ---- exp: one polynomial (Cephes-style range reduction x = k·ln2 + r with a two-part ln2, a
 * degree-5 Horner polynomial in fmaf, e^r = fma(p, r·r, r) + 1, times 2^k), two edge rules:
 * kvt_vec_exp (softmax): 0 below -87 (masked keys: -inf), NaN stays NaN, clamped above 88;
 * kvt_vec_exp_clamped (gates, delta rule): 0 below -87.33654, NaN and x > 88 give exp(88) (what a
 *   vector min(x, 88) does). Relative error <= 2 ulp where neither edge applies. */
float kvt_vec_exp(float x);
float kvt_vec_exp_clamped(float x);

/* ---- scalar references (the level-0 table's entries) ---- */
float kvt_vec_dot_ref(const float *a, const float *b, uint32_t n);
void kvt_vec_axpy_ref(float *y, float a, const float *x, uint32_t n);
void kvt_vec_dot_rows_ref(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                          float *out);
void kvt_vec_axpy_rows_ref(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n);
void kvt_vec_transpose_rows_ref(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk);
void kvt_vec_transpose_f16_rows_ref(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt,
                                    size_t ldk);
void kvt_vec_dot_kt_q4_ref(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n,
                           float scale, float *const *out);
void kvt_vec_dot_enc_qn_ref(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, size_t rb,
                            uint32_t n_rows, float scale, float *const *out);
void kvt_vec_axpy_enc_qn_ref(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,
                             const float *const *w, uint32_t nq, const uint8_t *x, size_t rb, uint32_t n_rows,
                             uint32_t d0, uint32_t n);
float kvt_vec_exp_sum_ref(float *sc, uint32_t n, float m);
void kvt_vec_lanes_reduce_ref(float *o, const float *acc, size_t ld, uint32_t n);
void kvt_vec_round_f16_ref(const float *src, float *dst, uint32_t n, float mul);
uint32_t kvt_vec_argmax_ref(const float *x, uint32_t n);

#endif
