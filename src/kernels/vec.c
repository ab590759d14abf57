/*
 * vec.c — the f32 vector operations of vec.h: scalar references, AVX2+FMA and AVX-512 variants, and
 * the per-ISA tables the kernels' dispatcher selects (kvt_vec_select, called from dispatch.c).
 *
 * Numerics (KVT_NUMERICS_VERSION 2). Every multiply-add is a fused fmaf (one rounding).
 * dot(a, b, n): 16 lane sums, lane l taking elements i ≡ l (mod 16) of the first n & ~15 via
 *   acc[l] = fmaf(a[i], b[i], acc[l]); then t[l] = acc[l] + acc[l+8] (l < 8) and
 *   s = ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)); then the tail in order: s = fmaf(a[i], b[i], s).
 *   AVX-512 keeps the 16 lanes in one register, AVX2 in two (elements 0-7 and 8-15 of each step);
 *   adding the two 256-bit halves gives t, so every path produces the same bits. The transposed-key
 *   form (dot_kt_q4) holds lane l of 16 keys in one register and does the tree's adds vertically.
 * axpy, vfma, scale and the gates are elementwise, so any vector width gives the same bits.
 * exp: one polynomial (exp_core and its 8- and 16-lane copies run the same operations per lane).
 * Floating-point contraction is off (gcc in -std=c11 mode does not contract; clang is told below)
 * so the SIMD paths and their scalar references produce the same bits.
 */
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if KVT_X86
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------ scalar references */
static inline float lane_reduce(const float *t) {
    return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

/* A scale or bias of an affine row (f16 or bf16, widened exactly). */
static inline float enc_scale(const kvt_vec_rowfmt *f, const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f->scale_bf16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32_fast(h);
}

/* Element i of an encoded row (vec.h kvt_vec_rowfmt), as the codec decodes it. */
static float enc_at(const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t i) {
    if (f->kind == KVT_ROWS_F16) {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)i, 2);
        return kvt_f16_to_f32_fast(h);
    }
    const uint32_t bits = f->kind == KVT_ROWS_A8 ? 8 : 4, ng = f->dim / f->group, g = i / f->group;
    const uint8_t *sc = row + (size_t)f->dim * bits / 8;
    const uint32_t code = bits == 8 ? row[i] : (uint32_t)(row[i / 2] >> (4 * (i & 1))) & 15u;
    return enc_scale(f, sc + 2 * (size_t)g) * (float)code + enc_scale(f, sc + 2 * (size_t)(ng + g));
}

/* Element i of a row given as f32 (b) or encoded (row, when b is NULL). */
static inline float row_at(const float *b, const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t i) {
    return b ? b[i] : enc_at(f, row, i);
}

/* The dot's order over an f32 or an encoded row (row_at). */
static float dot_ref_row(const float *a, const float *b, const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t n) {
    float acc[16] = {0};
    uint32_t n16 = n & ~15u, i;
    for (i = 0; i < n16; i += 16)
        for (uint32_t l = 0; l < 16; l++) acc[l] = fmaf(a[i + l], row_at(b, f, row, i + l), acc[l]);
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
    float s = lane_reduce(t);
    for (; i < n; i++) s = fmaf(a[i], row_at(b, f, row, i), s);
    return s;
}

float kvt_vec_dot_ref(const float *a, const float *b, uint32_t n) { return dot_ref_row(a, b, NULL, NULL, n); }

void kvt_vec_dot_enc_qn_ref(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, size_t rb,
                            uint32_t n_rows, float scale, float *const *out) {
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t j = 0; j < nq; j++) out[j][r] = dot_ref_row(q[j], NULL, f, k + (size_t)r * rb, f->dim) * scale;
}

void kvt_vec_axpy_enc_qn_ref(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,
                             const float *const *w, uint32_t nq, const uint8_t *x, size_t rb, uint32_t n_rows,
                             uint32_t d0, uint32_t n) {
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t j = 0; j < nq; j++) {
            float *yl = y[j] + (size_t)((lane0 + r) % nl) * ld;
            for (uint32_t i = 0; i < n; i++) yl[i] = fmaf(w[j][r], enc_at(f, x + (size_t)r * rb, d0 + i), yl[i]);
        }
}

void kvt_vec_lanes_reduce_ref(float *o, const float *acc, size_t ld, uint32_t n) {
    for (uint32_t d = 0; d < n; d++) {
        float t[8], u[4];
        for (int l = 0; l < 8; l++) t[l] = acc[(size_t)l * ld + d] + acc[(size_t)(l + 8) * ld + d];
        for (int l = 0; l < 4; l++) u[l] = t[l] + t[l + 4];
        o[d] = (u[0] + u[2]) + (u[1] + u[3]);
    }
}

void kvt_vec_axpy_ref(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

void kvt_vec_dot_rows_ref(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                            float *out) {
    for (uint32_t r = 0; r < n_rows; r++) out[r] = kvt_vec_dot_ref(q, k + r * stride, n) * scale;
}

void kvt_vec_axpy_rows_ref(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
    for (uint32_t r = 0; r < n_rows; r++) kvt_vec_axpy_ref(y, w[r], x + r * stride, n);
}

/* exp, the one polynomial: Cephes-style range reduction x = k·ln2 + r with k = rint(x·log2e),
 * r = fma(-k, C1, x), r = fma(-k, C2, r) (two-part ln2); a degree-5 Horner polynomial in fmaf;
 * e^r = fma(p, r·r, r) + 1; times 2^k built from the exponent bits. Relative error ~2 ulp. The
 * 8- and 16-lane copies (exp8, exp16) perform the same operations per lane. Two lower edges, both
 * kept for bit-identical results: the softmax zeroes below EXP_LO (its numerics are part of the
 * persisted KV's identity), the gates below EXP_LO_CLAMPED (~ln 2^-126, the last normal 2^k).
 * k is in [-126, 127] for x in [EXP_LO_CLAMPED, EXP_HI], so 2^k is a normal float. */
#define EXP_LO (-87.0f)
#define EXP_LO_CLAMPED (-87.33654f)
#define EXP_HI 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

/* exp_core's reduction and polynomial on a vector (VT, intrinsic prefix PF: _mm256 or _mm512) of x
 * with k = rint(x·log2e): Y = e^r, before the scaling by 2^k. */
#define EXP_POLY(VT, PF, X, K, Y)                                                                \
    do {                                                                                          \
        VT r_ = PF##_fnmadd_ps(K, PF##_set1_ps(EXP_C1), X);                                       \
        r_ = PF##_fnmadd_ps(K, PF##_set1_ps(EXP_C2), r_);                                         \
        VT p_ = PF##_set1_ps(EXP_P0);                                                             \
        p_ = PF##_fmadd_ps(p_, r_, PF##_set1_ps(EXP_P1));                                         \
        p_ = PF##_fmadd_ps(p_, r_, PF##_set1_ps(EXP_P2));                                         \
        p_ = PF##_fmadd_ps(p_, r_, PF##_set1_ps(EXP_P3));                                         \
        p_ = PF##_fmadd_ps(p_, r_, PF##_set1_ps(EXP_P4));                                         \
        p_ = PF##_fmadd_ps(p_, r_, PF##_set1_ps(EXP_P5));                                         \
        Y = PF##_add_ps(PF##_fmadd_ps(p_, PF##_mul_ps(r_, r_), r_), PF##_set1_ps(1.0f));          \
    } while (0)

/* x is not NaN. Below lo: 0; above EXP_HI: clamped. */
static inline float exp_core(float x, float lo) {
    if (x < lo) return 0.0f;
    if (x > EXP_HI) x = EXP_HI;
    const float k = rintf(x * EXP_LOG2E);
    float r = fmaf(-k, EXP_C1, x);
    r = fmaf(-k, EXP_C2, r);
    float p = EXP_P0;
    p = fmaf(p, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, 4);
    return y * two_k;
}

float kvt_vec_exp(float x) { return x != x ? x : exp_core(x, EXP_LO); }
float kvt_vec_exp_clamped(float x) { return exp_core(x != x ? EXP_HI : x, EXP_LO_CLAMPED); }

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum in the dot's order (16 lanes, lane tree,
 * tail in order). */
float kvt_vec_exp_sum_ref(float *sc, uint32_t n, float m) {
    float acc[16] = {0};
    uint32_t n16 = n & ~15u, j;
    for (j = 0; j < n16; j += 16)
        for (uint32_t l = 0; l < 16; l++) {
            sc[j + l] = kvt_vec_exp(sc[j + l] - m);
            acc[l] += sc[j + l];
        }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
    float s = lane_reduce(t);
    for (; j < n; j++) {
        sc[j] = kvt_vec_exp(sc[j] - m);
        s += sc[j];
    }
    return s;
}

void kvt_vec_transpose_rows_ref(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
    const uint32_t np = (n_rows + 15) & ~15u;
    for (uint32_t d = 0; d < n; d++)
        for (uint32_t r = 0; r < np; r++) kt[(size_t)d * ldk + r] = r < n_rows ? k[(size_t)r * stride + d] : 0.0f;
}

void kvt_vec_transpose_f16_rows_ref(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt,
                                      size_t ldk) {
    const uint32_t np = (n_rows + 15) & ~15u;
    for (uint32_t d = 0; d < n; d++)
        for (uint32_t r = 0; r < np; r++) {
            uint16_t h = 0;
            if (r < n_rows) memcpy(&h, src + (size_t)r * rb + 2 * (size_t)d, 2);
            kt[(size_t)d * ldk + r] = r < n_rows ? kvt_f16_to_f32_fast(h) : 0.0f;
        }
}

/* The scalar twin reads key r back out of kt into a row and calls the scalar dot (a row longer than
 * the stack buffer goes to the heap; without memory the scores are NaN, never a crash). */
void kvt_vec_dot_kt_q4_ref(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n,
                             float scale, float *const *out) {
    float stack_row[KVT_KT_MAX_DIM];
    float *row = n <= KVT_KT_MAX_DIM ? stack_row : malloc((size_t)n * sizeof(float));
    if (!row) {
        for (uint32_t r = 0; r < n_keys; r++)
            for (int j = 0; j < 4; j++) out[j][r] = NAN;
        return;
    }
    for (uint32_t r = 0; r < n_keys; r++) {
        for (uint32_t d = 0; d < n; d++) row[d] = kt[(size_t)d * ldk + r];
        for (int j = 0; j < 4; j++) out[j][r] = kvt_vec_dot_ref(q[j], row, n) * scale;
    }
    if (row != stack_row) free(row);
}

/* ---- f16 rounding of attention operands (see attention.c): dst[i] = f16(src[i] * mul) widened back
 * to f32, round to nearest even. The F16C conversion rounds the same way, so both give the same bits
 * for every non-NaN input. */
void kvt_vec_round_f16_ref(const float *src, float *dst, uint32_t n, float mul) {
    for (uint32_t i = 0; i < n; i++) dst[i] = kvt_f16_to_f32_fast(kvt_f32_to_f16(src[i] * mul));
}

/* Elementwise helpers of the delta rule and the gates. */
static void vfma_ref(float *y, const float *w, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = fmaf(w[i], x[i], y[i]);
}
static void scale_ref(float *y, float a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] *= a;
}
static void exp_clamped_ref(float *y, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = kvt_vec_exp_clamped(x[i]);
}
static void silu_mul_ref(float *y, const float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const float s = g[i] / (1.0f + kvt_vec_exp_clamped(-g[i]));
        y[i] = u ? s * u[i] : s;
    }
}
/* GELU's tanh form 0.5·g·(1 + tanh(z)), z = sqrt(2/π)·g·(1 + 0.044715·g²), is g·σ(2z): written so, it
 * takes the gates' exp and has no cancellation in 1 + tanh(z) for negative g. */
#define GELU_K2 1.5957691216057308f /* 2·sqrt(2/π) */
#define GELU_C 0.044715f
static void gelu_mul_ref(float *y, const float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const float z2 = (g[i] * GELU_K2) * (1.0f + GELU_C * (g[i] * g[i]));
        y[i] = (g[i] / (1.0f + kvt_vec_exp_clamped(-z2))) * u[i];
    }
}
static void sigmoid_mul_ref(float *y, const float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = u[i] / (1.0f + kvt_vec_exp_clamped(-g[i]));
}

/* The greedy draw's scan. Its loop-carried compare against x[best] (a load whose address waits on
 * the previous compare) ran at ~4 ns an element: ~0.6 ms for a 152k vocabulary, serial on the
 * thread that samples while the others wait. */
uint32_t kvt_vec_argmax_ref(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Four-query forms at any level: four calls of the single-query form of the same table. */
#define Q4_LOOPS(SFX, DOT_ROWS, AXPY_ROWS)                                                                  \
    static void dot_q4_##SFX(const float *const *q, const float *k, size_t stride, uint32_t n_rows,       \
                             uint32_t n, float scale, float *const *out) {                                 \
        for (int j = 0; j < 4; j++) DOT_ROWS(q[j], k, stride, n_rows, n, scale, out[j]);                  \
    }                                                                                                     \
    static void axpy_q4_##SFX(float *const *y, const float *const *w, const float *x, size_t stride,       \
                              uint32_t n_rows, uint32_t n) {                                               \
        for (int j = 0; j < 4; j++) AXPY_ROWS(y[j], w[j], x, stride, n_rows, n);                          \
    }
Q4_LOOPS(ref, kvt_vec_dot_rows_ref, kvt_vec_axpy_rows_ref)

#if KVT_X86
/* ------------------------------------------------------------------ AVX2 + FMA */
#define T2 __attribute__((target("avx2,fma")))
/* ---- AVX2 + FMA (16 lanes in two registers) */
T2 static float dot_avx2(const float *a, const float *b, uint32_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    uint32_t n16 = n & ~15u, i;
    for (i = 0; i < n16; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(lo, hi));
    float s = lane_reduce(t);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* The elementwise forms and axpy_rows, written once for both vector widths (W floats a register).
 * axpy_rows keeps y in registers 4·W floats at a time while the rows stream past. */
#define VEC_ELEMENTWISE(SFX, TGT, VT, W, LD, ST, SET1, FMADD, MUL)                                      \
    TGT static void axpy_##SFX(float *y, float a, const float *x, uint32_t n) {                         \
        const VT va = SET1(a);                                                                          \
        uint32_t i = 0;                                                                                 \
        for (; i + W <= n; i += W) ST(y + i, FMADD(va, LD(x + i), LD(y + i)));                          \
        for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);                                                  \
    }                                                                                                   \
    TGT static void vfma_##SFX(float *y, const float *w, const float *x, uint32_t n) {                  \
        uint32_t i = 0;                                                                                 \
        for (; i + W <= n; i += W) ST(y + i, FMADD(LD(w + i), LD(x + i), LD(y + i)));                   \
        for (; i < n; i++) y[i] = fmaf(w[i], x[i], y[i]);                                               \
    }                                                                                                   \
    TGT static void scale_##SFX(float *y, float a, uint32_t n) {                                        \
        const VT va = SET1(a);                                                                          \
        uint32_t i = 0;                                                                                 \
        for (; i + W <= n; i += W) ST(y + i, MUL(va, LD(y + i)));                                       \
        for (; i < n; i++) y[i] *= a;                                                                   \
    }                                                                                                   \
    TGT static void axpy_rows_##SFX(float *y, const float *w, const float *x, size_t stride,            \
                                    uint32_t n_rows, uint32_t n) {                                      \
        uint32_t i = 0;                                                                                 \
        for (; i + 4 * W <= n; i += 4 * W) {                                                            \
            VT y0 = LD(y + i), y1 = LD(y + i + W), y2 = LD(y + i + 2 * W), y3 = LD(y + i + 3 * W);      \
            for (uint32_t r = 0; r < n_rows; r++) {                                                     \
                const float *xr = x + r * stride + i;                                                   \
                const VT a = SET1(w[r]);                                                                \
                y0 = FMADD(a, LD(xr), y0);                                                              \
                y1 = FMADD(a, LD(xr + W), y1);                                                          \
                y2 = FMADD(a, LD(xr + 2 * W), y2);                                                      \
                y3 = FMADD(a, LD(xr + 3 * W), y3);                                                      \
            }                                                                                           \
            ST(y + i, y0), ST(y + i + W, y1), ST(y + i + 2 * W, y2), ST(y + i + 3 * W, y3);            \
        }                                                                                               \
        for (; i + W <= n; i += W) {                                                                    \
            VT y0 = LD(y + i);                                                                          \
            for (uint32_t r = 0; r < n_rows; r++) y0 = FMADD(SET1(w[r]), LD(x + r * stride + i), y0);   \
            ST(y + i, y0);                                                                              \
        }                                                                                               \
        for (; i < n; i++) {                                                                            \
            float yi = y[i];                                                                            \
            for (uint32_t r = 0; r < n_rows; r++) yi = fmaf(w[r], x[r * stride + i], yi);              \
            y[i] = yi;                                                                                  \
        }                                                                                               \
    }
VEC_ELEMENTWISE(avx2, T2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_mul_ps)



/* exp_core on 8 lanes with the gates' edges (kvt_vec_exp_clamped): lanes below EXP_LO_CLAMPED give 0,
 * NaN lanes become EXP_HI (min returns its second operand). fnmadd(k, C, x) is fma(-k, C, x). */
T2 static inline __m256 exp8(__m256 x) {
    const __m256 zero_mask = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO_CLAMPED), _CMP_LT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y;
    EXP_POLY(__m256, _mm256, x, k, y);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero_mask, y);
}
T2 static void exp_clamped_avx2(float *y, const float *x, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    exp_clamped_ref(y + i, x + i, n - i);
}
/* kvt_vec_exp per lane (lanes below EXP_LO give 0, NaN lanes set back to x0) and the dot's 16-lane
 * sum: two 8-lane accumulators hold lanes 0-7 and 8-15, added pairwise before the lane tree, the
 * scalar order exactly. */
T2 static float exp_sum_avx2(float *sc, uint32_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m), lo = _mm256_set1_ps(EXP_LO), hi = _mm256_set1_ps(EXP_HI);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const uint32_t n16 = n & ~15u;
    uint32_t j;
    for (j = 0; j < n16; j += 16)
        for (int h = 0; h < 2; h++) {
            const __m256 x0 = _mm256_sub_ps(_mm256_loadu_ps(sc + j + 8 * h), vm);
            const __m256 nan = _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q), zero = _mm256_cmp_ps(x0, lo, _CMP_LT_OQ);
            const __m256 x = _mm256_min_ps(x0, hi);
            const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256 y;
            EXP_POLY(__m256, _mm256, x, k, y);
            const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
            y = _mm256_andnot_ps(zero, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
            y = _mm256_blendv_ps(y, x0, nan);
            _mm256_storeu_ps(sc + j + 8 * h, y);
            acc[h] = _mm256_add_ps(acc[h], y);
        }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(acc[0], acc[1]));
    float s = lane_reduce(t);
    for (; j < n; j++) {
        sc[j] = kvt_vec_exp(sc[j] - m);
        s += sc[j];
    }
    return s;
}
T2 static void silu_mul_avx2(float *y, const float *g, const float *u, uint32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 vg = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(vg, _mm256_add_ps(one, exp8(_mm256_xor_ps(vg, neg))));
        if (u) s = _mm256_mul_ps(s, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(y + i, s);
    }
    silu_mul_ref(y + i, g + i, u ? u + i : NULL, n - i);
}
T2 static void gelu_mul_avx2(float *y, const float *g, const float *u, uint32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    const __m256 k2 = _mm256_set1_ps(GELU_K2), c = _mm256_set1_ps(GELU_C);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 vg = _mm256_loadu_ps(g + i);
        const __m256 z2 = _mm256_mul_ps(_mm256_mul_ps(vg, k2), _mm256_add_ps(one, _mm256_mul_ps(c, _mm256_mul_ps(vg, vg))));
        const __m256 s = _mm256_div_ps(vg, _mm256_add_ps(one, exp8(_mm256_xor_ps(z2, neg))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    gelu_mul_ref(y + i, g + i, u + i, n - i);
}
T2 static void sigmoid_mul_avx2(float *y, const float *g, const float *u, uint32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_xor_ps(_mm256_loadu_ps(g + i), neg));
        _mm256_storeu_ps(y + i, _mm256_div_ps(_mm256_loadu_ps(u + i), _mm256_add_ps(one, e)));
    }
    sigmoid_mul_ref(y + i, g + i, u + i, n - i);
}

__attribute__((target("f16c,avx2"))) static void round_f16_f16c(const float *src, float *dst, uint32_t n, float mul) {
    const __m256 vm = _mm256_set1_ps(mul);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), vm), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = kvt_f16_to_f32_fast(kvt_f32_to_f16(src[i] * mul));
}


/* ------------------------------------------------------------------ AVX-512F */
#define T5 __attribute__((target("avx512f,avx2,fma")))
/* acc[r] holds row r's 8 values t0..t7 (after adding the 256-bit halves). Result lane r is
 * ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)) of acc[r]: the 128-bit halves are added, then two rounds
 * of hadd (IEEE addition is commutative, so hadd's operand order does not matter). */
T5 static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2,
                                                                          __m256 a3, __m256 a4, __m256 a5,
                                                                          __m256 a6, __m256 a7) {
    const __m256 u0 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a4, 0x20), _mm256_permute2f128_ps(a0, a4, 0x31));
    const __m256 u1 = _mm256_add_ps(_mm256_permute2f128_ps(a1, a5, 0x20), _mm256_permute2f128_ps(a1, a5, 0x31));
    const __m256 u2 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a6, 0x20), _mm256_permute2f128_ps(a2, a6, 0x31));
    const __m256 u3 = _mm256_add_ps(_mm256_permute2f128_ps(a3, a7, 0x20), _mm256_permute2f128_ps(a3, a7, 0x31));
    return _mm256_hadd_ps(_mm256_hadd_ps(u0, u1), _mm256_hadd_ps(u2, u3));
}

T5 static inline __m256 half_sum(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

T5 static float dot_avx512(const float *a, const float *b, uint32_t n) {
    __m512 acc = _mm512_setzero_ps();
    uint32_t n16 = n & ~15u, i;
    for (i = 0; i < n16; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    float t[8];
    _mm256_storeu_ps(t, half_sum(acc));
    float s = lane_reduce(t);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* Requires n % 16 == 0. Eight rows at a time, one accumulator each, reduced together. */
T5 static void dot_rows_avx512(const float *q, const float *k,
                                                                       size_t stride, uint32_t n_rows, uint32_t n,
                                                                       float scale, float *out) {
    const __m256 vscale = _mm256_set1_ps(scale);
    uint32_t r = 0;
    for (; r + 8 <= n_rows; r += 8) {
        const float *k0 = k + r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        const float *k4 = k3 + stride, *k5 = k4 + stride, *k6 = k5 + stride, *k7 = k6 + stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (uint32_t i = 0; i < n; i += 16) {
            const __m512 vq = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k0 + i), a0);
            a1 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k1 + i), a1);
            a2 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k2 + i), a2);
            a3 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k3 + i), a3);
            a4 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k4 + i), a4);
            a5 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k5 + i), a5);
            a6 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k6 + i), a6);
            a7 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k7 + i), a7);
        }
        const __m256 s = reduce8(half_sum(a0), half_sum(a1), half_sum(a2), half_sum(a3), half_sum(a4),
                                 half_sum(a5), half_sum(a6), half_sum(a7));
        _mm256_storeu_ps(out + r, _mm256_mul_ps(s, vscale));
    }
    for (; r < n_rows; r++) out[r] = dot_avx512(q, k + r * stride, n) * scale;
}

/* Four queries x four keys per step (16 accumulators, 8 loads per 16 FMAs). Requires n % 16 == 0.
 * out[qi][r] = dot(q[qi], k + r*stride) * scale. */
T5 static void dot_q4_avx512(const float *const *q, const float *k,
                                                                     size_t stride, uint32_t n_rows, uint32_t n,
                                                                     float scale, float *const *out) {
    const __m256 vscale = _mm256_set1_ps(scale);
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    uint32_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const float *k0 = k + r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
               a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        for (uint32_t i = 0; i < n; i += 16) {
            const __m512 x0 = _mm512_loadu_ps(k0 + i), x1 = _mm512_loadu_ps(k1 + i);
            const __m512 x2 = _mm512_loadu_ps(k2 + i), x3 = _mm512_loadu_ps(k3 + i);
            __m512 v = _mm512_loadu_ps(q0 + i);
            a00 = _mm512_fmadd_ps(v, x0, a00), a01 = _mm512_fmadd_ps(v, x1, a01);
            a02 = _mm512_fmadd_ps(v, x2, a02), a03 = _mm512_fmadd_ps(v, x3, a03);
            v = _mm512_loadu_ps(q1 + i);
            a10 = _mm512_fmadd_ps(v, x0, a10), a11 = _mm512_fmadd_ps(v, x1, a11);
            a12 = _mm512_fmadd_ps(v, x2, a12), a13 = _mm512_fmadd_ps(v, x3, a13);
            v = _mm512_loadu_ps(q2 + i);
            a20 = _mm512_fmadd_ps(v, x0, a20), a21 = _mm512_fmadd_ps(v, x1, a21);
            a22 = _mm512_fmadd_ps(v, x2, a22), a23 = _mm512_fmadd_ps(v, x3, a23);
            v = _mm512_loadu_ps(q3 + i);
            a30 = _mm512_fmadd_ps(v, x0, a30), a31 = _mm512_fmadd_ps(v, x1, a31);
            a32 = _mm512_fmadd_ps(v, x2, a32), a33 = _mm512_fmadd_ps(v, x3, a33);
        }
        /* lanes 0-3: query A's four keys, lanes 4-7: query B's */
        __m256 s01 = _mm256_mul_ps(reduce8(half_sum(a00), half_sum(a01), half_sum(a02), half_sum(a03),
                                           half_sum(a10), half_sum(a11), half_sum(a12), half_sum(a13)), vscale);
        __m256 s23 = _mm256_mul_ps(reduce8(half_sum(a20), half_sum(a21), half_sum(a22), half_sum(a23),
                                           half_sum(a30), half_sum(a31), half_sum(a32), half_sum(a33)), vscale);
        _mm_storeu_ps(out[0] + r, _mm256_castps256_ps128(s01));
        _mm_storeu_ps(out[1] + r, _mm256_extractf128_ps(s01, 1));
        _mm_storeu_ps(out[2] + r, _mm256_castps256_ps128(s23));
        _mm_storeu_ps(out[3] + r, _mm256_extractf128_ps(s23, 1));
    }
    for (; r < n_rows; r++)
        for (int j = 0; j < 4; j++) out[j][r] = dot_avx512(q[j], k + r * stride, n) * scale;
}

/* ---- transposed keys (attention's pass 1): kt[d*ldk + r] = element d of key r.
 * Sixteen keys sit in the lanes of one register, so a query's 16 per-lane sums of the dot (lane l:
 * elements d ≡ l mod 16, fmaf in ascending d) are 16 registers acc_l, each built from broadcasts of
 * q[d] times the key row d of kt, and the dot's fixed tree t_l = acc_l + acc_{l+8},
 * ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)) becomes 15 vertical adds: no shuffles, one result per lane.
 * Four queries share every loaded key row. Requires n % 16 == 0 (no tail) and ldk % 16 == 0. */
#define KT_FMA4(d)                                                                                  \
    do {                                                                                            \
        const __m512 x_ = _mm512_loadu_ps(kt + (size_t)(d) * ldk);                                  \
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), x_, a0);                                        \
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[d]), x_, a1);                                        \
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[d]), x_, a2);                                        \
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[d]), x_, a3);                                        \
    } while (0)

/* t_l = acc_l + acc_{l+8} of four queries over the 16 keys at kt (n % 16 == 0). */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
kt_t4(const float *q0, const float *q1, const float *q2, const float *q3, const float *kt, size_t ldk,
      uint32_t n, uint32_t l, __m512 *t) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    _Pragma("GCC unroll 16")
    for (uint32_t d = l; d < n; d += 16) KT_FMA4(d);
    const __m512 b0 = a0, b1 = a1, b2 = a2, b3 = a3;
    a0 = a1 = a2 = a3 = _mm512_setzero_ps();
    _Pragma("GCC unroll 16")
    for (uint32_t d = l + 8; d < n; d += 16) KT_FMA4(d);
    t[0] = _mm512_add_ps(b0, a0), t[1] = _mm512_add_ps(b1, a1);
    t[2] = _mm512_add_ps(b2, a2), t[3] = _mm512_add_ps(b3, a3);
}

/* u = t_l + t_{l+4} of four queries. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
kt_u4(const float *q0, const float *q1, const float *q2, const float *q3, const float *kt, size_t ldk,
      uint32_t n, uint32_t l, __m512 *u) {
    __m512 t[4], s[4];
    kt_t4(q0, q1, q2, q3, kt, ldk, n, l, t);
    kt_t4(q0, q1, q2, q3, kt, ldk, n, l + 4, s);
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; j++) u[j] = _mm512_add_ps(t[j], s[j]);
}
#undef KT_FMA4

/* Inlined with a constant n for the common head dims, so the lane loops unroll completely. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
dot_kt_q4_body(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n, float scale,
               float *const *out) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (uint32_t r = 0; r < n_keys; r += 16) {
        const float *k = kt + r;
        __m512 u0[4], u1[4], u2[4], u3[4];
        kt_u4(q0, q1, q2, q3, k, ldk, n, 0, u0);
        kt_u4(q0, q1, q2, q3, k, ldk, n, 1, u1);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 4; j++) u0[j] = _mm512_add_ps(u0[j], u1[j]); /* (t0+t4)+(t1+t5) */
        kt_u4(q0, q1, q2, q3, k, ldk, n, 2, u2);
        kt_u4(q0, q1, q2, q3, k, ldk, n, 3, u3);
        const __mmask16 m = n_keys - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n_keys - r)) - 1u);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 4; j++) {
            const __m512 s = _mm512_add_ps(u0[j], _mm512_add_ps(u2[j], u3[j])); /* + ((t2+t6)+(t3+t7)) */
            _mm512_mask_storeu_ps(out[j] + r, m, _mm512_mul_ps(s, vscale));
        }
    }
}

T5 static void dot_kt_q4_avx512(const float *const *q, const float *kt,
                                                                        size_t ldk, uint32_t n_keys, uint32_t n,
                                                                        float scale, float *const *out) {
    if (n == 64) dot_kt_q4_body(q, kt, ldk, n_keys, 64, scale, out);
    else if (n == 128) dot_kt_q4_body(q, kt, ldk, n_keys, 128, scale, out);
    else dot_kt_q4_body(q, kt, ldk, n_keys, n, scale, out);
}

/* In-register 16x16 transpose: on return r[c] holds column c of the input rows (lane i = row i).
 * Pure data movement, so exact. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void transpose16(__m512 *r) {
    __m512 t[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 4) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        t[i + 2] = _mm512_unpacklo_ps(r[i + 2], r[i + 3]);
        t[i + 3] = _mm512_unpackhi_ps(r[i + 2], r[i + 3]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    _Pragma("GCC unroll 16")
    for (int h = 0; h < 16; h += 8)
        _Pragma("GCC unroll 16")
        for (int c = 0; c < 4; c++) {
            t[h + c] = _mm512_shuffle_f32x4(r[h + c], r[h + 4 + c], 0x88);
            t[h + 4 + c] = _mm512_shuffle_f32x4(r[h + c], r[h + 4 + c], 0xdd);
        }
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
    }
}

/* kt[d*ldk + r] = k[r*stride + d] for d < n, r < n_rows; columns n_rows..pad16(n_rows)-1 are zero.
 * n % 16 == 0. */
T5 static void transpose_rows_avx512(const float *k, size_t stride,
                                                                             uint32_t n_rows, uint32_t n, float *kt,
                                                                             size_t ldk) {
    for (uint32_t r0 = 0; r0 < n_rows; r0 += 16)
        for (uint32_t d0 = 0; d0 < n; d0 += 16) {
            __m512 a[16];
            if (r0 + 16 <= n_rows) {
                _Pragma("GCC unroll 16")
                for (uint32_t i = 0; i < 16; i++) a[i] = _mm512_loadu_ps(k + (size_t)(r0 + i) * stride + d0);
            } else {
                for (uint32_t i = 0; i < 16; i++)
                    a[i] = r0 + i < n_rows ? _mm512_loadu_ps(k + (size_t)(r0 + i) * stride + d0) : _mm512_setzero_ps();
            }
            transpose16(a);
            _Pragma("GCC unroll 16")
            for (uint32_t c = 0; c < 16; c++) _mm512_storeu_ps(kt + (size_t)(d0 + c) * ldk + r0, a[c]);
        }
}

/* The same from f16 rows (row r at src + r*rb bytes): decoded by vcvtph2ps, exact like every f16
 * decoder here, and transposed without an f32 row-major copy. */
__attribute__((target("avx512f,avx2,fma,f16c"))) static void transpose_f16_rows_avx512(const uint8_t *src, size_t rb,
                                                                                      uint32_t n_rows, uint32_t n,
                                                                                      float *kt, size_t ldk) {
#define KT_LD16(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + (size_t)(r0 + (i)) * rb + 2 * (size_t)d0)))
    for (uint32_t r0 = 0; r0 < n_rows; r0 += 16)
        for (uint32_t d0 = 0; d0 < n; d0 += 16) {
            __m512 a[16];
            if (r0 + 16 <= n_rows) {
                _Pragma("GCC unroll 16")
                for (uint32_t i = 0; i < 16; i++) a[i] = KT_LD16(i);
            } else {
                for (uint32_t i = 0; i < 16; i++) a[i] = r0 + i < n_rows ? KT_LD16(i) : _mm512_setzero_ps();
            }
            transpose16(a);
            _Pragma("GCC unroll 16")
            for (uint32_t c = 0; c < 16; c++) _mm512_storeu_ps(kt + (size_t)(d0 + c) * ldk + r0, a[c]);
        }
#undef KT_LD16
}

VEC_ELEMENTWISE(avx512, T5, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps,
                _mm512_mul_ps)



/* Four outputs share each streamed row: y[qi] += w[qi][r] * x_r for r ascending. n % 16 == 0. */
T5 static void axpy_q4_avx512(float *const *y, const float *const *w,
                                                                      const float *x, size_t stride,
                                                                      uint32_t n_rows, uint32_t n) {
    float *y0 = y[0], *y1 = y[1], *y2 = y[2], *y3 = y[3];
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 b00 = _mm512_loadu_ps(y0 + i), b01 = _mm512_loadu_ps(y0 + i + 16), b02 = _mm512_loadu_ps(y0 + i + 32),
               b03 = _mm512_loadu_ps(y0 + i + 48);
        __m512 b10 = _mm512_loadu_ps(y1 + i), b11 = _mm512_loadu_ps(y1 + i + 16), b12 = _mm512_loadu_ps(y1 + i + 32),
               b13 = _mm512_loadu_ps(y1 + i + 48);
        __m512 b20 = _mm512_loadu_ps(y2 + i), b21 = _mm512_loadu_ps(y2 + i + 16), b22 = _mm512_loadu_ps(y2 + i + 32),
               b23 = _mm512_loadu_ps(y2 + i + 48);
        __m512 b30 = _mm512_loadu_ps(y3 + i), b31 = _mm512_loadu_ps(y3 + i + 16), b32 = _mm512_loadu_ps(y3 + i + 32),
               b33 = _mm512_loadu_ps(y3 + i + 48);
        for (uint32_t r = 0; r < n_rows; r++) {
            const float *xr = x + r * stride + i;
            const __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
            const __m512 x2 = _mm512_loadu_ps(xr + 32), x3 = _mm512_loadu_ps(xr + 48);
            __m512 a = _mm512_set1_ps(w0[r]);
            b00 = _mm512_fmadd_ps(a, x0, b00), b01 = _mm512_fmadd_ps(a, x1, b01);
            b02 = _mm512_fmadd_ps(a, x2, b02), b03 = _mm512_fmadd_ps(a, x3, b03);
            a = _mm512_set1_ps(w1[r]);
            b10 = _mm512_fmadd_ps(a, x0, b10), b11 = _mm512_fmadd_ps(a, x1, b11);
            b12 = _mm512_fmadd_ps(a, x2, b12), b13 = _mm512_fmadd_ps(a, x3, b13);
            a = _mm512_set1_ps(w2[r]);
            b20 = _mm512_fmadd_ps(a, x0, b20), b21 = _mm512_fmadd_ps(a, x1, b21);
            b22 = _mm512_fmadd_ps(a, x2, b22), b23 = _mm512_fmadd_ps(a, x3, b23);
            a = _mm512_set1_ps(w3[r]);
            b30 = _mm512_fmadd_ps(a, x0, b30), b31 = _mm512_fmadd_ps(a, x1, b31);
            b32 = _mm512_fmadd_ps(a, x2, b32), b33 = _mm512_fmadd_ps(a, x3, b33);
        }
        _mm512_storeu_ps(y0 + i, b00), _mm512_storeu_ps(y0 + i + 16, b01);
        _mm512_storeu_ps(y0 + i + 32, b02), _mm512_storeu_ps(y0 + i + 48, b03);
        _mm512_storeu_ps(y1 + i, b10), _mm512_storeu_ps(y1 + i + 16, b11);
        _mm512_storeu_ps(y1 + i + 32, b12), _mm512_storeu_ps(y1 + i + 48, b13);
        _mm512_storeu_ps(y2 + i, b20), _mm512_storeu_ps(y2 + i + 16, b21);
        _mm512_storeu_ps(y2 + i + 32, b22), _mm512_storeu_ps(y2 + i + 48, b23);
        _mm512_storeu_ps(y3 + i, b30), _mm512_storeu_ps(y3 + i + 16, b31);
        _mm512_storeu_ps(y3 + i + 32, b32), _mm512_storeu_ps(y3 + i + 48, b33);
    }
    for (; i < n; i += 16) {
        __m512 b0 = _mm512_loadu_ps(y0 + i), b1 = _mm512_loadu_ps(y1 + i);
        __m512 b2 = _mm512_loadu_ps(y2 + i), b3 = _mm512_loadu_ps(y3 + i);
        for (uint32_t r = 0; r < n_rows; r++) {
            const __m512 xv = _mm512_loadu_ps(x + r * stride + i);
            b0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[r]), xv, b0);
            b1 = _mm512_fmadd_ps(_mm512_set1_ps(w1[r]), xv, b1);
            b2 = _mm512_fmadd_ps(_mm512_set1_ps(w2[r]), xv, b2);
            b3 = _mm512_fmadd_ps(_mm512_set1_ps(w3[r]), xv, b3);
        }
        _mm512_storeu_ps(y0 + i, b0), _mm512_storeu_ps(y1 + i, b1);
        _mm512_storeu_ps(y2 + i, b2), _mm512_storeu_ps(y3 + i, b3);
    }
}

/* exp_core on 16 lanes: lanes below lo (x0 < lo, ordered) give 0; NaN lanes and lanes above EXP_HI
 * give exp(EXP_HI) (min returns its second operand for NaN). Below lo x is not clamped: the masked
 * scalef zeroes those lanes whatever they hold. fnmadd(k, C, x) is fma(-k, C, x) (negation is
 * exact); y·2^k by scalef is one rounding of the same exact product as the scalar multiply by 2^k. */
T5 static inline __m512 exp16(__m512 x0, __m512 lo) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x0, lo, _CMP_NLT_UQ); /* not (x0 < lo): NaNs kept */
    const __m512 x = _mm512_min_ps(x0, _mm512_set1_ps(EXP_HI));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 y0;
    EXP_POLY(__m512, _mm512, x, k, y0);
    return _mm512_maskz_scalef_ps(keep, y0, k);
}

/* kvt_vec_exp per lane (NaN lanes set back to x0) and the dot's 16-lane sum. */
T5 static float exp_sum_avx512(float *sc, uint32_t n, float m) {
    const __m512 vm = _mm512_set1_ps(m), lo = _mm512_set1_ps(EXP_LO);
    __m512 acc = _mm512_setzero_ps();
    uint32_t n16 = n & ~15u, j;
    for (j = 0; j < n16; j += 16) {
        const __m512 x0 = _mm512_sub_ps(_mm512_loadu_ps(sc + j), vm);
        const __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q);
        const __m512 y = _mm512_mask_mov_ps(exp16(x0, lo), nan, x0);
        _mm512_storeu_ps(sc + j, y);
        acc = _mm512_add_ps(acc, y);
    }
    float t[8];
    _mm256_storeu_ps(t, half_sum(acc));
    float s = lane_reduce(t);
    for (; j < n; j++) {
        sc[j] = kvt_vec_exp(sc[j] - m);
        s += sc[j];
    }
    return s;
}
/* Tails run the same vector code on masked lanes (inactive lanes read as 0 and are not stored). */
T5 static void exp_clamped_avx512(float *y, const float *x, uint32_t n) {
    const __m512 lo = _mm512_set1_ps(EXP_LO_CLAMPED);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i), lo));
    }
}
T5 static void silu_mul_avx512(float *y, const float *g, const float *u, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), lo = _mm512_set1_ps(EXP_LO_CLAMPED);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 vg = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), vg), lo);
        __m512 s = _mm512_div_ps(vg, _mm512_add_ps(one, e));
        if (u) s = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i));
        _mm512_mask_storeu_ps(y + i, k, s);
    }
}
T5 static void gelu_mul_avx512(float *y, const float *g, const float *u, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), lo = _mm512_set1_ps(EXP_LO_CLAMPED);
    const __m512 k2 = _mm512_set1_ps(GELU_K2), c = _mm512_set1_ps(GELU_C);
    const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u); /* -z2: the sign bit flipped, as in C */
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 vg = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 z2 = _mm512_mul_ps(_mm512_mul_ps(vg, k2), _mm512_add_ps(one, _mm512_mul_ps(c, _mm512_mul_ps(vg, vg))));
        const __m512 nz2 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(z2), sign));
        const __m512 s = _mm512_div_ps(vg, _mm512_add_ps(one, exp16(nz2, lo)));
        _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
    }
}
T5 static void sigmoid_mul_avx512(float *y, const float *g, const float *u, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), lo = _mm512_set1_ps(EXP_LO_CLAMPED);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(k, g + i)), lo);
        _mm512_mask_storeu_ps(y + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, u + i), _mm512_add_ps(one, e)));
    }
}

/* 16 at a time (the same conversions, 512 bits wide); the tail goes to the F16C version. */
__attribute__((target("avx512f,f16c,avx2"))) static void round_f16_avx512(const float *src, float *dst, uint32_t n,
                                                                           float mul) {
    const __m512 vm = _mm512_set1_ps(mul);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(src + i), vm), _MM_FROUND_TO_NEAREST_INT);
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
    if (i < n) round_f16_f16c(src + i, dst + i, n - i, mul);
}

/* ------------------------------------------------------------------ per-level forms */
/* AVX2: rows of dots in blocks of 8 (dot_rows8_avx2), exp_sum on 8-lane vectors; the
 * transposed-key products and the transposes use the scalar references (no AVX2 version: the
 * attention takes them only on AVX-512). */
/* One row's 16-lane products folded to the 8 lanes lane_reduce takes (lanes l and l + 8 added). */
T2 static inline __m256 dot_lanes8_avx2(const float *q, const float *k, uint32_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (uint32_t i = 0; i < n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), hi);
    }
    return _mm256_add_ps(lo, hi);
}
/* 8 rows at once (n % 16 == 0): each row's 8 lanes as dot_avx2 makes them, then (reduce8_avx2) an
 * in-register 8x8 transpose (pure data movement) so that lane_reduce's tree runs vertically on 8
 * rows: the same additions in the same order per row, so every score has dot_avx2's bits. */
T2 static inline __m256 reduce8_avx2(const __m256 *t) {
    const __m256 a0 = _mm256_unpacklo_ps(t[0], t[1]), a1 = _mm256_unpackhi_ps(t[0], t[1]);
    const __m256 a2 = _mm256_unpacklo_ps(t[2], t[3]), a3 = _mm256_unpackhi_ps(t[2], t[3]);
    const __m256 a4 = _mm256_unpacklo_ps(t[4], t[5]), a5 = _mm256_unpackhi_ps(t[4], t[5]);
    const __m256 a6 = _mm256_unpacklo_ps(t[6], t[7]), a7 = _mm256_unpackhi_ps(t[6], t[7]);
    const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee);
    const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xee);
    const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee);
    const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
    __m256 c[8]; /* c[l]: lane l of rows 0..7 */
    c[0] = _mm256_permute2f128_ps(b0, b4, 0x20), c[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
    c[1] = _mm256_permute2f128_ps(b1, b5, 0x20), c[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
    c[2] = _mm256_permute2f128_ps(b2, b6, 0x20), c[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
    c[3] = _mm256_permute2f128_ps(b3, b7, 0x20), c[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
    /* lane_reduce: ((t0 + t4) + (t1 + t5)) + ((t2 + t6) + (t3 + t7)) */
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[4]), _mm256_add_ps(c[1], c[5])),
                         _mm256_add_ps(_mm256_add_ps(c[2], c[6]), _mm256_add_ps(c[3], c[7])));
}
T2 static void dot_rows8_avx2(const float *q, const float *k, size_t stride, uint32_t n, float scale, float *out) {
    __m256 t[8];
    for (int r = 0; r < 8; r++) t[r] = dot_lanes8_avx2(q, k + (size_t)r * stride, n);
    _mm256_storeu_ps(out, _mm256_mul_ps(reduce8_avx2(t), _mm256_set1_ps(scale)));
}
static void dot_rows_avx2(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                          float *out) {
    uint32_t r = 0;
    if (n % 16 == 0 && n > 0)
        for (; r + 8 <= n_rows; r += 8) dot_rows8_avx2(q, k + r * stride, stride, n, scale, out + r);
    for (; r < n_rows; r++) out[r] = dot_avx2(q, k + r * stride, n) * scale;
}
Q4_LOOPS(avx2, dot_rows_avx2, axpy_rows_avx2)

/* Encoded rows in place (vec.h: dot_enc_qn, axpy_enc_qn). Attention at long context reads every K
 * and V row of a KV head once per step and uses it for the head's GQA group of queries: decoding
 * each row's 16-element steps in registers (f16: F16C, exact; affine: codes widened, then
 * scale * code + bias, the codec's two roundings) and using them for all nq queries at once
 * replaces the decode into an f32 tile, the tile's reloads per query, and dot_q4's fourth,
 * repeated query of a group of 3. The products are the f32 forms' operations in the same order,
 * so the bits are those of decoding the rows and calling dot_rows / axpy_rows. Both fetch ahead of
 * every line they read (the rows stream from DRAM; a prefetch past the rows is harmless): the dot
 * ENC_PF bytes (8 KiB against 2, 4 and 16 KiB: 1.04-1.13 against 1.18-1.28 ms per layer on f16,
 * bench/attn --split 2 16384 smol-135m f16, AVX2 Zen 3), the axpy one call's rows ahead
 * (enc_axpy_body). Each kernel is compiled per format (K, a constant) and query count. */
#define T2H __attribute__((target("avx2,fma,f16c")))
#define ENC_PF 8192
#define T2I T2H static inline __attribute__((always_inline))
T2I __m256 ld_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Byte offset of element i's code in a row of format K, and the code bytes of a row. */
T2I size_t enc_off(int K, uint32_t i) { return K == KVT_ROWS_F16 ? 2 * (size_t)i : K == KVT_ROWS_A8 ? i : i / 2; }

/* An f16 or bf16 scale at p, widened exactly (F16C or a shift: no 256 KiB table lookup) into all
 * lanes. */
T2I __m256 enc_bcast_scale(const kvt_vec_rowfmt *f, const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    if (f->scale_bf16) return _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)h << 16)));
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

/* The scale and bias of group g of an affine row (ng groups a row), broadcast. */
T2I void enc_group(int K, const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t g, uint32_t ng, __m256 *vs,
                   __m256 *vb) {
    const uint8_t *sc = row + enc_off(K, f->dim);
    *vs = enc_bcast_scale(f, sc + 2 * (size_t)g);
    *vb = enc_bcast_scale(f, sc + 2 * (size_t)(ng + g));
}

/* Elements [i, i + 16) of an encoded row in two registers (affine: vs, vb of their group). */
T2I void enc16(int K, const uint8_t *row, uint32_t i, __m256 vs, __m256 vb, __m256 *x0, __m256 *x1) {
    if (K == KVT_ROWS_F16) {
        *x0 = ld_f16x8(row + 2 * (size_t)i), *x1 = ld_f16x8(row + 2 * (size_t)i + 16);
        return;
    }
    __m256 q0, q1;
    if (K == KVT_ROWS_A8) {
        q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + i))));
        q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + i + 8))));
    } else { /* lane e of a 4-byte word takes nibble e: element 2k low, 2k + 1 high */
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), m = _mm256_set1_epi32(15);
        uint32_t w0, w1;
        memcpy(&w0, row + i / 2, 4);
        memcpy(&w1, row + i / 2 + 4, 4);
        q0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w0), sh), m));
        q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w1), sh), m));
    }
    *x0 = _mm256_add_ps(_mm256_mul_ps(vs, q0), vb);
    *x1 = _mm256_add_ps(_mm256_mul_ps(vs, q1), vb);
}

/* The address to fetch for byte address a ahead of a run of rows: past the run's end, the same
 * distance into its continuation (kvt_vec_rowfmt run_end / run_next). Integers, not pointers: a
 * may lie past the rows' object, and it is never dereferenced. */
T2I const char *enc_pf_addr(const kvt_vec_rowfmt *f, uintptr_t a) {
    const uintptr_t e = (uintptr_t)f->run_end;
    return (const char *)(f->run_end && a >= e ? (uintptr_t)f->run_next + (a - e) : a);
}

/* f16 rows: the lines of the n bytes at byte address a (a row, or its steps' part), one address
 * test for them all (a row never straddles a run's end). */
T2I void enc_prefetch_lines(const kvt_vec_rowfmt *f, uintptr_t a, size_t n) {
    if (f->cached) return;
    const char *pf = enc_pf_addr(f, a);
#pragma GCC unroll 8
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
}

/* Fetch dist bytes ahead of the line holding element i's code when that code starts a line of
 * the step sequence, and of an affine row's scales with its first step (d0). */
T2I void enc_prefetch(int K, const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t i, uint32_t d0, size_t dist) {
    if (f->cached) return;
    const size_t o = enc_off(K, i);
    if ((o & 63) < enc_off(K, 16)) _mm_prefetch(enc_pf_addr(f, (uintptr_t)row + o + dist), _MM_HINT_T0);
    if (K != KVT_ROWS_F16 && i == d0)
        _mm_prefetch(enc_pf_addr(f, (uintptr_t)row + enc_off(K, f->dim) + dist), _MM_HINT_T0);
}

/* One row's 16-lane products with nq queries folded to 8 lanes each (dot_lanes8_avx2's per query). */
T2I void enc_dot_lanes(int K, const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *kr, uint32_t gs,
                       uint32_t ng, __m256 *t) {
    __m256 lo[KVT_VEC_QN], hi[KVT_VEC_QN];
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    const uint32_t gw = K == KVT_ROWS_F16 ? f->dim : 1u << gs; /* elements sharing a scale */
    if (K == KVT_ROWS_F16) enc_prefetch_lines(f, (uintptr_t)kr + ENC_PF, 2 * (size_t)f->dim);
    for (uint32_t g0 = 0; g0 < f->dim; g0 += gw) {
        __m256 vs = _mm256_setzero_ps(), vb = vs;
        if (K != KVT_ROWS_F16) enc_group(K, f, kr, g0 >> gs, ng, &vs, &vb);
        for (uint32_t i = g0; i < g0 + gw; i += 16) {
            if (K != KVT_ROWS_F16) enc_prefetch(K, f, kr, i, 0, ENC_PF);
            __m256 k0, k1;
            enc16(K, kr, i, vs, vb, &k0, &k1);
#pragma GCC unroll 4
            for (int j = 0; j < nq; j++) {
                lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i), k0, lo[j]);
                hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i + 8), k1, hi[j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) t[j * 8] = _mm256_add_ps(lo[j], hi[j]);
}
/* Rows in groups of 8 reduced vertically (reduce8_avx2), the rest one by one. */
T2I void enc_dot_body(int K, const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *k, size_t rb,
                      uint32_t n_rows, float scale, float *const *out) {
    const __m256 vs = _mm256_set1_ps(scale);
    const uint32_t gs = K == KVT_ROWS_F16 ? 0 : (uint32_t)__builtin_ctz(f->group), ng = f->dim >> gs;
    __m256 t[KVT_VEC_QN * 8]; /* query j, row rr: t[j*8 + rr] */
    uint32_t r = 0;
    for (; r + 8 <= n_rows; r += 8) {
        for (int rr = 0; rr < 8; rr++) enc_dot_lanes(K, f, q, nq, k + (size_t)(r + rr) * rb, gs, ng, t + rr);
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) _mm256_storeu_ps(out[j] + r, _mm256_mul_ps(reduce8_avx2(t + j * 8), vs));
    }
    for (; r < n_rows; r++) {
        enc_dot_lanes(K, f, q, nq, k + (size_t)r * rb, gs, ng, t);
        for (int j = 0; j < nq; j++) {
            float tl[8];
            _mm256_storeu_ps(tl, t[j * 8]);
            out[j][r] = lane_reduce(tl) * scale;
        }
    }
}

/* 16 columns at a time (two registers per query) over all rows: each y element is one fmaf chain
 * over the rows in ascending order, as axpy_rows makes it. Each row read fetches the row n_rows
 * strides on: for an attention V lane (rows ATT_VL apart, n_rows of them per chunk) that is the
 * same lane's row of the next chunk, whatever the chunk's length. */
T2I void enc_axpy_body(int K, const kvt_vec_rowfmt *f, float *const *y, const float *const *w, uint32_t ws, int nq,
                       const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0, uint32_t n) {
    const uint32_t gs = K == KVT_ROWS_F16 ? 0 : (uint32_t)__builtin_ctz(f->group), ng = f->dim >> gs;
    const size_t pfd = (size_t)n_rows * rb;
    for (uint32_t i = 0; i < n; i += 16) {
        __m256 a0[KVT_VEC_QN], a1[KVT_VEC_QN];
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) a0[j] = _mm256_loadu_ps(y[j] + i), a1[j] = _mm256_loadu_ps(y[j] + i + 8);
        for (uint32_t r = 0; r < n_rows; r++) {
            const uint8_t *xr = x + (size_t)r * rb;
            enc_prefetch(K, f, xr, d0 + i, d0, pfd);
            __m256 k0, k1, vs = _mm256_setzero_ps(), vb = vs;
            if (K != KVT_ROWS_F16) enc_group(K, f, xr, (d0 + i) >> gs, ng, &vs, &vb);
            enc16(K, xr, d0 + i, vs, vb, &k0, &k1);
#pragma GCC unroll 4
            for (int j = 0; j < nq; j++) {
                const __m256 wv = _mm256_set1_ps(w[j][(size_t)r * ws]);
                a0[j] = _mm256_fmadd_ps(wv, k0, a0[j]);
                a1[j] = _mm256_fmadd_ps(wv, k1, a1[j]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) _mm256_storeu_ps(y[j] + i, a0[j]), _mm256_storeu_ps(y[j] + i + 8, a1[j]);
    }
}

/* The lanes of an axpy_enc_qn call (vec.h): lane l's rows are r0, r0 + nl, ... (r0 its first), one
 * body call each with the rows and weights nl apart, so a lane's accumulators stay in registers
 * over its rows. BODY is an ISA's enc*_axpy_body (inlined with K and NQ constant). */
#define enc_axpy_lanes(BODY, K, f, y, ld, nl, lane0, w, NQ, x, rb, n_rows, d0, n)                                      \
    do {                                                                                                               \
        for (uint32_t l_ = 0; l_ < (nl); l_++) {                                                                       \
            const uint32_t r0_ = (l_ + (nl) - (lane0)) % (nl);                                                         \
            if (r0_ >= (n_rows)) continue;                                                                             \
            float *yl_[KVT_VEC_QN];                                                                                    \
            const float *wl_[KVT_VEC_QN];                                                                              \
            for (int j_ = 0; j_ < (NQ); j_++) yl_[j_] = (y)[j_] + (size_t)l_ * (ld), wl_[j_] = (w)[j_] + r0_;         \
            BODY(K, f, yl_, wl_, nl, NQ, (x) + (size_t)r0_ * (rb), (size_t)(nl) * (rb), ((n_rows) - 1 - r0_) / (nl) + 1, \
                 d0, n);                                                                                               \
        }                                                                                                              \
    } while (0)

#define ENC_KERNELS(TGT, B, NAME, K)                                                                                   \
    TGT static void dot_##NAME(const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *k, size_t rb,    \
                               uint32_t n_rows, float scale, float *const *out) {                                      \
        switch (nq) { /* the query count a constant too: its loops unroll, its registers stay */                       \
        case 1: B##dot_body(K, f, q, 1, k, rb, n_rows, scale, out); break;                                             \
        case 2: B##dot_body(K, f, q, 2, k, rb, n_rows, scale, out); break;                                             \
        case 3: B##dot_body(K, f, q, 3, k, rb, n_rows, scale, out); break;                                             \
        default: B##dot_body(K, f, q, 4, k, rb, n_rows, scale, out); break;                                            \
        }                                                                                                              \
    }                                                                                                                  \
    TGT static void axpy_##NAME(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,     \
                                const float *const *w, int nq, const uint8_t *x, size_t rb, uint32_t n_rows,           \
                                uint32_t d0, uint32_t n) {                                                             \
        switch (nq) {                                                                                                  \
        case 1: enc_axpy_lanes(B##axpy_body, K, f, y, ld, nl, lane0, w, 1, x, rb, n_rows, d0, n); break;               \
        case 2: enc_axpy_lanes(B##axpy_body, K, f, y, ld, nl, lane0, w, 2, x, rb, n_rows, d0, n); break;               \
        case 3: enc_axpy_lanes(B##axpy_body, K, f, y, ld, nl, lane0, w, 3, x, rb, n_rows, d0, n); break;               \
        default: enc_axpy_lanes(B##axpy_body, K, f, y, ld, nl, lane0, w, 4, x, rb, n_rows, d0, n); break;              \
        }                                                                                                              \
    }

/* The SIMD forms' domain (vec.h kvt_vec_rows_fused): whole 16-element steps, affine groups of
 * 32-128 (a step never straddles two), rows no wider than the attention's (KVT_KT_MAX_DIM). */
static bool enc_simd_ok(const kvt_vec_rowfmt *f, uint32_t d0, uint32_t n) {
    if (f->dim == 0 || f->dim % 16 || f->dim > KVT_KT_MAX_DIM || d0 % 16 || n % 16 || d0 + n > f->dim) return false;
    if (f->kind == KVT_ROWS_F16) return true;
    if (f->kind != KVT_ROWS_A8 && f->kind != KVT_ROWS_A4) return false;
    return (f->group == 32 || f->group == 64 || f->group == 128) && f->dim % f->group == 0;
}

/* One ISA's entries (the table's dot_enc_qn / axpy_enc_qn): its kernels per format, the scalar
 * references outside the SIMD domain. */
#define ENC_ISA(TGT, B, ISA)                                                                                    \
    ENC_KERNELS(TGT, B, f16_rows_##ISA, KVT_ROWS_F16)                                                           \
    ENC_KERNELS(TGT, B, a8_rows_##ISA, KVT_ROWS_A8)                                                             \
    ENC_KERNELS(TGT, B, a4_rows_##ISA, KVT_ROWS_A4)                                                             \
    static void dot_enc_qn_##ISA(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, \
                                 size_t rb, uint32_t n_rows, float scale, float *const *out) {                  \
        if (nq < 1 || nq > KVT_VEC_QN || !enc_simd_ok(f, 0, f->dim))                                            \
            kvt_vec_dot_enc_qn_ref(f, q, nq, k, rb, n_rows, scale, out);                                        \
        else if (f->kind == KVT_ROWS_F16) dot_f16_rows_##ISA(f, q, (int)nq, k, rb, n_rows, scale, out);         \
        else if (f->kind == KVT_ROWS_A8) dot_a8_rows_##ISA(f, q, (int)nq, k, rb, n_rows, scale, out);           \
        else dot_a4_rows_##ISA(f, q, (int)nq, k, rb, n_rows, scale, out);                                       \
    }                                                                                                           \
    static void axpy_enc_qn_##ISA(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl,             \
                                  uint32_t lane0, const float *const *w, uint32_t nq, const uint8_t *x,         \
                                  size_t rb, uint32_t n_rows, uint32_t d0, uint32_t n) {                        \
        if (nq < 1 || nq > KVT_VEC_QN || !enc_simd_ok(f, d0, n))                                                \
            kvt_vec_axpy_enc_qn_ref(f, y, ld, nl, lane0, w, nq, x, rb, n_rows, d0, n);                          \
        else if (f->kind == KVT_ROWS_F16) axpy_f16_rows_##ISA(f, y, ld, nl, lane0, w, (int)nq, x, rb, n_rows, d0, n); \
        else if (f->kind == KVT_ROWS_A8) axpy_a8_rows_##ISA(f, y, ld, nl, lane0, w, (int)nq, x, rb, n_rows, d0, n); \
        else axpy_a4_rows_##ISA(f, y, ld, nl, lane0, w, (int)nq, x, rb, n_rows, d0, n);                         \
    }
ENC_ISA(T2H, enc_, avx2)

/* AVX-512 forms of the encoded-row kernels. A 16-element step is one register, the AVX2 forms'
 * two 8-lane halves side by side: a row's 16 lane sums are one accumulator per query, and folding
 * it (low half + high half) is the AVX2 forms' lo + hi; the axpy's columns are the same fmaf
 * chains. The same operations in the same order, so the same bits, with half the instructions
 * per step (the dot's fused multiply-adds read the queries from L1). Prefetching as above. */
#define T5H __attribute__((target("avx512f,avx2,fma,f16c")))
#define T5I T5H static inline __attribute__((always_inline))

T5I __m512 enc_bcast_scale512(const kvt_vec_rowfmt *f, const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    if (f->scale_bf16) return _mm512_castsi512_ps(_mm512_set1_epi32((int)((uint32_t)h << 16)));
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

/* Elements [i, i + 16) of an encoded row (affine: vs, vb of their group). 4-bit codes: the 8
 * bytes' low and high nibbles interleaved, so element 2k (low nibble of byte k) comes first. */
T5I __m512 enc16_512(int K, const uint8_t *row, uint32_t i, __m512 vs, __m512 vb) {
    if (K == KVT_ROWS_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)i)));
    __m128i c;
    if (K == KVT_ROWS_A8) {
        c = _mm_loadu_si128((const __m128i *)(row + i));
    } else {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(row + i / 2)), m = _mm_set1_epi8(15);
        c = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    }
    return _mm512_add_ps(_mm512_mul_ps(vs, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c))), vb);
}

T5I void enc_group512(int K, const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t g, uint32_t ng, __m512 *vs,
                      __m512 *vb) {
    const uint8_t *sc = row + enc_off(K, f->dim);
    *vs = enc_bcast_scale512(f, sc + 2 * (size_t)g);
    *vb = enc_bcast_scale512(f, sc + 2 * (size_t)(ng + g));
}

/* R rows' 16 lane sums per query, folded to 8 (enc_dot_lanes' lo + hi) into t[j * 8 + rr]: the
 * rows side by side, so R * nq independent accumulators hide the multiply-add latency (one row
 * at a time left its nq short chains waiting on it). R * nq <= 24 registers. */
T5I void enc5_dot_rows(int K, const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *k, size_t rb,
                       int R, uint32_t D, uint32_t gs, uint32_t ng, __m256 *t) {
    __m512 acc[8][KVT_VEC_QN];
#pragma GCC unroll 8
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) acc[rr][j] = _mm512_setzero_ps();
    if (K == KVT_ROWS_F16) { /* D: the row width, a constant where the caller made it one */
#pragma GCC unroll 8
        for (int rr = 0; rr < R; rr++) /* each row's lines, once, ENC_PF bytes on */
            enc_prefetch_lines(f, (uintptr_t)(k + (size_t)rr * rb) + ENC_PF, 2 * (size_t)D);
#pragma GCC unroll 8
        for (uint32_t i = 0; i < D; i += 16) {
            __m512 qv[KVT_VEC_QN];
#pragma GCC unroll 4
            for (int j = 0; j < nq; j++) qv[j] = _mm512_loadu_ps(q[j] + i);
#pragma GCC unroll 8
            for (int rr = 0; rr < R; rr++) {
                const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + (size_t)rr * rb + 2 * (size_t)i)));
#pragma GCC unroll 4
                for (int j = 0; j < nq; j++) acc[rr][j] = _mm512_fmadd_ps(qv[j], kv, acc[rr][j]);
            }
        }
#pragma GCC unroll 8
        for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
            for (int j = 0; j < nq; j++) t[j * 8 + rr] = half_sum(acc[rr][j]);
        return;
    }
    const uint32_t gw = 1u << gs;
    for (uint32_t g0 = 0; g0 < f->dim; g0 += gw) {
        __m512 vs[8], vb[8];
#pragma GCC unroll 8
        for (int rr = 0; rr < R; rr++) {
            vs[rr] = vb[rr] = _mm512_setzero_ps();
            if (K != KVT_ROWS_F16) enc_group512(K, f, k + (size_t)rr * rb, g0 >> gs, ng, &vs[rr], &vb[rr]);
        }
        for (uint32_t i = g0; i < g0 + gw; i += 16) {
#pragma GCC unroll 8
            for (int rr = 0; rr < R; rr++) {
                const uint8_t *kr = k + (size_t)rr * rb;
                enc_prefetch(K, f, kr, i, 0, ENC_PF);
                const __m512 kv = enc16_512(K, kr, i, vs[rr], vb[rr]);
#pragma GCC unroll 4
                for (int j = 0; j < nq; j++) acc[rr][j] = _mm512_fmadd_ps(_mm512_loadu_ps(q[j] + i), kv, acc[rr][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) t[j * 8 + rr] = half_sum(acc[rr][j]);
}
/* Rows in groups of 8 (f16 with up to 3 queries: all 8 side by side; else two runs of 4) reduced
 * vertically (reduce8_avx2), the rest one by one. f16 rows of 64 and 128 elements (the head dims
 * of most models) take D constant: the column loop unrolls, the queries' steps stay in registers
 * and the fetches ahead are a row's lines with no test per step. */
T5I void enc5_dot_rows_d(int K, const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *k, size_t rb,
                         uint32_t n_rows, float scale, float *const *out, uint32_t D) {
    const __m256 vs = _mm256_set1_ps(scale);
    const uint32_t gs = K == KVT_ROWS_F16 ? 0 : (uint32_t)__builtin_ctz(f->group), ng = f->dim >> gs;
    __m256 t[KVT_VEC_QN * 8];
    uint32_t r = 0;
    for (; r + 8 <= n_rows; r += 8) {
        if (K == KVT_ROWS_F16 && nq <= 3) {
            enc5_dot_rows(K, f, q, nq, k + (size_t)r * rb, rb, 8, D, gs, ng, t);
        } else {
            enc5_dot_rows(K, f, q, nq, k + (size_t)r * rb, rb, 4, D, gs, ng, t);
            enc5_dot_rows(K, f, q, nq, k + (size_t)(r + 4) * rb, rb, 4, D, gs, ng, t + 4);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) _mm256_storeu_ps(out[j] + r, _mm256_mul_ps(reduce8_avx2(t + j * 8), vs));
    }
    for (; r < n_rows; r++) {
        enc5_dot_rows(K, f, q, nq, k + (size_t)r * rb, rb, 1, D, gs, ng, t);
        for (int j = 0; j < nq; j++) {
            float tl[8];
            _mm256_storeu_ps(tl, t[j * 8]);
            out[j][r] = lane_reduce(tl) * scale;
        }
    }
}
T5I void enc5_dot_body(int K, const kvt_vec_rowfmt *f, const float *const *q, int nq, const uint8_t *k, size_t rb,
                       uint32_t n_rows, float scale, float *const *out) {
    if (K == KVT_ROWS_F16 && f->dim == 64) enc5_dot_rows_d(K, f, q, nq, k, rb, n_rows, scale, out, 64);
    else if (K == KVT_ROWS_F16 && f->dim == 128) enc5_dot_rows_d(K, f, q, nq, k, rb, n_rows, scale, out, 128);
    else enc5_dot_rows_d(K, f, q, nq, k, rb, n_rows, scale, out, f->dim);
}
/* C 16-column steps side by side over all rows (C * nq <= 16 accumulators): each column is one
 * fmaf chain over the rows in ascending order, and C chains per query run at once. */
T5I void enc5_axpy_cols(int K, const kvt_vec_rowfmt *f, float *const *y, const float *const *w, uint32_t ws, int nq,
                        const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0, uint32_t i, int C, uint32_t gs,
                        uint32_t ng, size_t pfd) {
    __m512 a[4][KVT_VEC_QN];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) a[c][j] = _mm512_loadu_ps(y[j] + i + 16 * c);
    for (uint32_t r = 0; r < n_rows; r++) {
        const uint8_t *xr = x + (size_t)r * rb;
        __m512 wv[KVT_VEC_QN];
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) wv[j] = _mm512_set1_ps(w[j][(size_t)r * ws]);
        if (K == KVT_ROWS_F16) /* the steps' lines (32 bytes a step) */
            enc_prefetch_lines(f, (uintptr_t)xr + 2 * (size_t)(d0 + i) + pfd, 32 * (size_t)C);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const uint32_t e = d0 + i + 16 * (uint32_t)c;
            if (K != KVT_ROWS_F16) enc_prefetch(K, f, xr, e, d0, pfd);
            __m512 vs = _mm512_setzero_ps(), vb = vs;
            if (K != KVT_ROWS_F16) enc_group512(K, f, xr, e >> gs, ng, &vs, &vb);
            const __m512 kv = enc16_512(K, xr, e, vs, vb);
#pragma GCC unroll 4
            for (int j = 0; j < nq; j++) a[c][j] = _mm512_fmadd_ps(wv[j], kv, a[c][j]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) _mm512_storeu_ps(y[j] + i + 16 * c, a[c][j]);
}
T5I void enc5_axpy_body(int K, const kvt_vec_rowfmt *f, float *const *y, const float *const *w, uint32_t ws, int nq,
                        const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0, uint32_t n) {
    const uint32_t gs = K == KVT_ROWS_F16 ? 0 : (uint32_t)__builtin_ctz(f->group), ng = f->dim >> gs;
    const size_t pfd = (size_t)n_rows * rb;
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64) enc5_axpy_cols(K, f, y, w, ws, nq, x, rb, n_rows, d0, i, 4, gs, ng, pfd);
    if (i + 32 <= n) enc5_axpy_cols(K, f, y, w, ws, nq, x, rb, n_rows, d0, i, 2, gs, ng, pfd), i += 32;
    if (i < n) enc5_axpy_cols(K, f, y, w, ws, nq, x, rb, n_rows, d0, i, 1, gs, ng, pfd);
}
ENC_ISA(T5H, enc5_, avx512)
#undef ENC_ISA
#undef ENC_KERNELS

/* AVX-512: the blocked kernels need n % 16 == 0 (and ldk % 16 == 0 for transposed keys); other
 * shapes take the single-row AVX-512 forms or the scalar references, with the same bits. */
static void dot_rows_512(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                         float *out) {
    if (n % 16 == 0) dot_rows_avx512(q, k, stride, n_rows, n, scale, out);
    else
        for (uint32_t r = 0; r < n_rows; r++) out[r] = dot_avx512(q, k + r * stride, n) * scale;
}
static void dot_q4_512(const float *const *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n,
                       float scale, float *const *out) {
    if (n % 16 == 0) dot_q4_avx512(q, k, stride, n_rows, n, scale, out);
    else
        for (int j = 0; j < 4; j++) dot_rows_512(q[j], k, stride, n_rows, n, scale, out[j]);
}
static void axpy_q4_512(float *const *y, const float *const *w, const float *x, size_t stride, uint32_t n_rows,
                        uint32_t n) {
    if (n % 16 == 0) axpy_q4_avx512(y, w, x, stride, n_rows, n);
    else
        for (int j = 0; j < 4; j++) axpy_rows_avx512(y[j], w[j], x, stride, n_rows, n);
}
static void transpose_rows_512(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
    if (n % 16 == 0 && ldk % 16 == 0) transpose_rows_avx512(k, stride, n_rows, n, kt, ldk);
    else kvt_vec_transpose_rows_ref(k, stride, n_rows, n, kt, ldk);
}
static void transpose_f16_rows_512(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt,
                                   size_t ldk) {
    if (n % 16 == 0 && ldk % 16 == 0) transpose_f16_rows_avx512(src, rb, n_rows, n, kt, ldk);
    else kvt_vec_transpose_f16_rows_ref(src, rb, n_rows, n, kt, ldk);
}
static void dot_kt_q4_512(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n,
                          float scale, float *const *out) {
    if (n % 16 == 0 && ldk % 16 == 0) dot_kt_q4_avx512(q, kt, ldk, n_keys, n, scale, out);
    else kvt_vec_dot_kt_q4_ref(q, kt, ldk, n_keys, n, scale, out);
}
#endif

/* lanes_reduce, 8 or 16 columns a step: the same adds per column as the reference. */
#define LANES_REDUCE_BODY(V, W, LD, ST, ADD)                                                                           \
    uint32_t d = 0;                                                                                                    \
    for (; d + (W) <= n; d += (W)) {                                                                                   \
        V t[8], u[4];                                                                                                  \
        for (int l = 0; l < 8; l++) t[l] = ADD(LD(acc + (size_t)l * ld + d), LD(acc + (size_t)(l + 8) * ld + d));      \
        for (int l = 0; l < 4; l++) u[l] = ADD(t[l], t[l + 4]);                                                        \
        ST(o + d, ADD(ADD(u[0], u[2]), ADD(u[1], u[3])));                                                              \
    }                                                                                                                  \
    if (d < n) kvt_vec_lanes_reduce_ref(o + d, acc + d, ld, n - d)
#if KVT_X86
T2 static void lanes_reduce_avx2(float *o, const float *acc, size_t ld, uint32_t n) {
    LANES_REDUCE_BODY(__m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps);
}
T5 static void lanes_reduce_avx512(float *o, const float *acc, size_t ld, uint32_t n) {
    LANES_REDUCE_BODY(__m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps);
}
#endif
#undef LANES_REDUCE_BODY

/* argmax: the largest non-NaN value by vector max (exact; a NaN element loses: maxps returns its
 * second operand, the running maximum, when either is NaN), then the first element equal to it.
 * This is the scan's answer: its strict ">" keeps the first of equal values (+0 and -0 compare
 * equal there and here), skips NaN, and keeps index 0 when x[0] is NaN. */
#define ARGMAX_BODY(V, W, SET1, LOADU, MAX, FIRST_EQ)                                                   \
    if (n == 0 || x[0] != x[0]) return 0;                                                              \
    V m = SET1(x[0]);                                                                                  \
    uint32_t i = 0;                                                                                    \
    for (; i + W <= n; i += W) m = MAX(LOADU(x + i), m);                                               \
    float best[W], mx = x[0];                                                                          \
    memcpy(best, &m, sizeof best);                                                                     \
    for (int l = 0; l < W; l++) mx = best[l] > mx ? best[l] : mx;                                      \
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;                                                     \
    const V vm = SET1(mx);                                                                             \
    for (i = 0; i + W <= n; i += W) {                                                                  \
        const unsigned k = FIRST_EQ(LOADU(x + i), vm);                                                 \
        if (k) return i + (uint32_t)__builtin_ctz(k);                                                  \
    }                                                                                                  \
    for (; i < n; i++)                                                                                 \
        if (x[i] == mx) return i;                                                                      \
    return 0
#if KVT_X86
#define EQ8(a, b) (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ))
#define EQ16(a, b) (unsigned)_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)
T2 static uint32_t argmax_avx2(const float *x, uint32_t n) {
    ARGMAX_BODY(__m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_max_ps, EQ8);
}
T5 static uint32_t argmax_avx512(const float *x, uint32_t n) {
    ARGMAX_BODY(__m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_max_ps, EQ16);
}
#undef EQ8
#undef EQ16
#endif
#undef ARGMAX_BODY

/* ------------------------------------------------------------------ tables and dispatch */
static const kvt_vec_ops ops_ref = {
    .level = 0, .dot = kvt_vec_dot_ref, .axpy = kvt_vec_axpy_ref, .vfma = vfma_ref, .scale = scale_ref,
    .dot_rows = kvt_vec_dot_rows_ref, .axpy_rows = kvt_vec_axpy_rows_ref, .dot_q4 = dot_q4_ref,
    .axpy_q4 = axpy_q4_ref, .transpose_rows = kvt_vec_transpose_rows_ref,
    .transpose_f16_rows = kvt_vec_transpose_f16_rows_ref, .dot_kt_q4 = kvt_vec_dot_kt_q4_ref,
    .exp_sum = kvt_vec_exp_sum_ref, .lanes_reduce = kvt_vec_lanes_reduce_ref, .round_f16 = kvt_vec_round_f16_ref,
    .exp_clamped = exp_clamped_ref, .silu_mul = silu_mul_ref, .gelu_mul = gelu_mul_ref, .sigmoid_mul = sigmoid_mul_ref,
    .argmax = kvt_vec_argmax_ref,
};
#if KVT_X86
static const kvt_vec_ops ops_avx2 = {
    .level = 1, .dot = dot_avx2, .axpy = axpy_avx2, .vfma = vfma_avx2, .scale = scale_avx2,
    .dot_rows = dot_rows_avx2, .axpy_rows = axpy_rows_avx2, .dot_q4 = dot_q4_avx2, .axpy_q4 = axpy_q4_avx2,
    .transpose_rows = kvt_vec_transpose_rows_ref, .transpose_f16_rows = kvt_vec_transpose_f16_rows_ref,
    .dot_kt_q4 = kvt_vec_dot_kt_q4_ref, .dot_enc_qn = dot_enc_qn_avx2, .axpy_enc_qn = axpy_enc_qn_avx2,
    .exp_sum = exp_sum_avx2, .lanes_reduce = lanes_reduce_avx2, .round_f16 = round_f16_f16c,
    .exp_clamped = exp_clamped_avx2, .silu_mul = silu_mul_avx2, .gelu_mul = gelu_mul_avx2, .sigmoid_mul = sigmoid_mul_avx2,
    .argmax = argmax_avx2,
};
static const kvt_vec_ops ops_avx512 = {
    .level = 2, .dot = dot_avx512, .axpy = axpy_avx512, .vfma = vfma_avx512, .scale = scale_avx512,
    .dot_rows = dot_rows_512, .axpy_rows = axpy_rows_avx512, .dot_q4 = dot_q4_512, .axpy_q4 = axpy_q4_512,
    .transpose_rows = transpose_rows_512, .transpose_f16_rows = transpose_f16_rows_512,
    .dot_kt_q4 = dot_kt_q4_512, .dot_enc_qn = dot_enc_qn_avx512, .axpy_enc_qn = axpy_enc_qn_avx512,
    .exp_sum = exp_sum_avx512, .lanes_reduce = lanes_reduce_avx512, .round_f16 = round_f16_avx512,
    .exp_clamped = exp_clamped_avx512, .silu_mul = silu_mul_avx512, .gelu_mul = gelu_mul_avx512, .sigmoid_mul = sigmoid_mul_avx512,
    .argmax = argmax_avx512,
};
#endif

static const kvt_vec_ops *g_cur = &ops_ref;

static const kvt_vec_ops *ops_at(int level) {
#if KVT_X86
    if (level >= 2) return &ops_avx512;
    if (level == 1) return &ops_avx2;
#endif
    (void)level;
    return &ops_ref;
}

const kvt_vec_ops *kvt_vec_ops_for(kvt_isa isa) {
    return ops_at(isa == KVT_ISA_AVX2 ? 1 : isa == KVT_ISA_AVX512 || isa == KVT_ISA_AMX ? 2 : 0);
}
const kvt_vec_ops *kvt_vec(void) { return g_cur; }
void kvt_vec_select(kvt_isa isa) { g_cur = kvt_vec_ops_for(isa); }
int kvt_vec_level(void) { return g_cur->level; }
void kvt_vec_force_level(int level) {
    if (level < g_cur->level) g_cur = ops_at(level);
}

float kvt_vec_dot(const float *a, const float *b, uint32_t n) { return g_cur->dot(a, b, n); }
void kvt_vec_axpy(float *y, float a, const float *x, uint32_t n) { g_cur->axpy(y, a, x, n); }
void kvt_vec_dot_rows(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                      float *out) {
    g_cur->dot_rows(q, k, stride, n_rows, n, scale, out);
}
void kvt_vec_axpy_rows(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
    g_cur->axpy_rows(y, w, x, stride, n_rows, n);
}
void kvt_vec_dot_q4(const float *const *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                    float *const *out) {
    g_cur->dot_q4(q, k, stride, n_rows, n, scale, out);
}
void kvt_vec_axpy_q4(float *const *y, const float *const *w, const float *x, size_t stride, uint32_t n_rows,
                     uint32_t n) {
    g_cur->axpy_q4(y, w, x, stride, n_rows, n);
}
void kvt_vec_transpose_rows(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
    g_cur->transpose_rows(k, stride, n_rows, n, kt, ldk);
}
void kvt_vec_transpose_f16_rows(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
    g_cur->transpose_f16_rows(src, rb, n_rows, n, kt, ldk);
}
void kvt_vec_dot_kt_q4(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n, float scale,
                       float *const *out) {
    g_cur->dot_kt_q4(q, kt, ldk, n_keys, n, scale, out);
}
bool kvt_vec_rows_fused(const kvt_vec_rowfmt *f, uint32_t d0, uint32_t n) {
    return g_cur->dot_enc_qn != NULL && enc_simd_ok(f, d0, n);
}
void kvt_vec_dot_enc_qn(const kvt_vec_rowfmt *f, const float *const *q, uint32_t nq, const uint8_t *k, size_t rb,
                        uint32_t n_rows, float scale, float *const *out) {
    if (g_cur->dot_enc_qn) g_cur->dot_enc_qn(f, q, nq, k, rb, n_rows, scale, out);
    else kvt_vec_dot_enc_qn_ref(f, q, nq, k, rb, n_rows, scale, out);
}
void kvt_vec_axpy_enc_qn(const kvt_vec_rowfmt *f, float *const *y, size_t ld, uint32_t nl, uint32_t lane0,
                         const float *const *w, uint32_t nq, const uint8_t *x, size_t rb, uint32_t n_rows, uint32_t d0,
                         uint32_t n) {
    if (g_cur->axpy_enc_qn) g_cur->axpy_enc_qn(f, y, ld, nl, lane0, w, nq, x, rb, n_rows, d0, n);
    else kvt_vec_axpy_enc_qn_ref(f, y, ld, nl, lane0, w, nq, x, rb, n_rows, d0, n);
}
float kvt_vec_exp_sum(float *sc, uint32_t n, float m) { return g_cur->exp_sum(sc, n, m); }
void kvt_vec_lanes_reduce(float *o, const float *acc, size_t ld, uint32_t n) { g_cur->lanes_reduce(o, acc, ld, n); }
void kvt_vec_round_f16(const float *src, float *dst, uint32_t n, float mul) { g_cur->round_f16(src, dst, n, mul); }
void kvt_vec_silu_mul(float *y, const float *g, const float *u, uint32_t n) { g_cur->silu_mul(y, g, u, n); }
void kvt_vec_gelu_mul(float *y, const float *g, const float *u, uint32_t n) { g_cur->gelu_mul(y, g, u, n); }
uint32_t kvt_vec_argmax(const float *x, uint32_t n) { return g_cur->argmax(x, n); }
