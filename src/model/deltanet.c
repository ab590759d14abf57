/*
 * deltanet.c — gated delta rule in the position-aligned chunkwise form, the causal conv and the
 * elementwise gates of the qwen35 layers (see deltanet.h for the math and the state layout).
 *
 * Numerics: every reduction is written as a chain of fused multiply-adds in a fixed order along
 * one index, vectorized along ANOTHER index (never a lane tree). So each output element sees the
 * same operations in the same order whatever the vector width, the tile shape or the number of
 * rows in a call: the scalar reference (fmaf), AVX2 and AVX-512 give the same bits, and so do
 * prefill batches of any size and token-by-token decode. exp is our own polynomial (dn_exp1 and
 * its vector copies, same operation sequence), not libm's, for the same reason.
 * The AVX-512 implementation adds register-tiled kernels for the two d×d products (S·k/S·q for a
 * block of rows, and the chunk-closing rank-64 update); they compute exactly the generic code's
 * per-element FMA chain.
 */
#include "deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DN_X86 1
#else
#define DN_X86 0
#endif

#define C_ KVT_DN_CHUNK
#define TB 8 /* rows of a call processed as one block (S·k / S·q, k·k / k·q products) */

uint32_t kvt_dn_conv_dim(const kvt_dn_dims *dm) { return (2 * dm->n_k_heads + dm->n_v_heads) * dm->d; }

size_t kvt_dn_state_bytes(const kvt_dn_dims *dm) {
    const size_t d = dm->d, hv = dm->n_v_heads;
    size_t n = (size_t)(dm->conv_k - 1) * kvt_dn_conv_dim(dm) + hv * d * d;
    n += (size_t)C_ * (2 * hv * d + hv);
    return n * sizeof(float);
}

/* ------------------------------------------------------------------ exp (scalar reference) */

/* Cephes-style expf: n = round(x·log2 e), r = x − n·ln2 (two-part ln2), degree-6 polynomial,
 * times 2^n built in the exponent bits. |rel err| <= 2 ulp on [-87.3, 88]; x < -87.3 gives 0,
 * x > 88 (and NaN, as the vector min does) is clamped to 88. The vector versions below run the
 * same operations. */
#define EXP_LO (-87.33654f)
#define EXP_HI 88.0f
#define EXP_L2E 1.44269504088896341f
#define EXP_C1 (-0.693359375f)
#define EXP_C2 2.12194440e-4f
#define EXP_P0 1.9875691500E-4f
#define EXP_P1 1.3981999507E-3f
#define EXP_P2 8.3334519073E-3f
#define EXP_P3 4.1665795894E-2f
#define EXP_P4 1.6666665459E-1f
#define EXP_P5 5.0000001201E-1f

float kvt_dn_exp(float x) {
    if (x < EXP_LO) return 0.0f;
    x = x < EXP_HI ? x : EXP_HI; /* exactly the vector min(x, HI): NaN -> HI (no NaN -> int cast) */
    const float n = nearbyintf(x * EXP_L2E);
    float r = fmaf(n, EXP_C1, x);
    r = fmaf(n, EXP_C2, r);
    float p = EXP_P0;
    p = fmaf(p, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    union { uint32_t u; float f; } sc = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return y * sc.f;
}

/* ------------------------------------------------------------------ generic row ops (scalar) */

static void axpy_scalar(float *y, float a, const float *x, uint32_t n) { /* y = fma(a, x, y) */
    for (uint32_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
static void vfma_scalar(float *y, const float *w, const float *x, uint32_t n) { /* y = fma(w, x, y) */
    for (uint32_t i = 0; i < n; i++) y[i] = fmaf(w[i], x[i], y[i]);
}
static void scale_scalar(float *y, float a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] *= a;
}
static void exp_scalar(float *y, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = kvt_dn_exp(x[i]);
}
static void silu_mul_scalar(float *y, const float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const float s = g[i] / (1.0f + kvt_dn_exp(-g[i]));
        y[i] = u ? s * u[i] : s;
    }
}
static void sigmoid_mul_scalar(float *y, const float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = u[i] / (1.0f + kvt_dn_exp(-g[i]));
}

/* ------------------------------------------------------------------ AVX2 + FMA */

#if DN_X86
#define T2 __attribute__((target("avx2,fma")))
T2 static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(EXP_LO);
    const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_L2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero_mask, y);
}
T2 static void axpy_avx2(float *y, float a, const float *x, uint32_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
T2 static void vfma_avx2(float *y, const float *w, const float *x, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(w[i], x[i], y[i]);
}
T2 static void scale_avx2(float *y, float a, uint32_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}
T2 static void exp_avx2(float *y, const float *x, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    exp_scalar(y + i, x + i, n - i);
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
    silu_mul_scalar(y + i, g + i, u ? u + i : NULL, n - i);
}
T2 static void sigmoid_mul_avx2(float *y, const float *g, const float *u, uint32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_xor_ps(_mm256_loadu_ps(g + i), neg));
        _mm256_storeu_ps(y + i, _mm256_div_ps(_mm256_loadu_ps(u + i), _mm256_add_ps(one, e)));
    }
    sigmoid_mul_scalar(y + i, g + i, u + i, n - i);
}

/* ------------------------------------------------------------------ AVX-512 */

#define T5 __attribute__((target("avx512f,avx2,fma")))
T5 static inline __m512 exp16(__m512 x) {
    const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_L2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(EXP_C1), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(EXP_C2), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~zero, y);
}
T5 static void axpy_avx512(float *y, float a, const float *x, uint32_t n) {
    const __m512 va = _mm512_set1_ps(a);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
T5 static void vfma_avx512(float *y, const float *w, const float *x, uint32_t n) {
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(w[i], x[i], y[i]);
}
T5 static void scale_avx512(float *y, float a, uint32_t n) {
    const __m512 va = _mm512_set1_ps(a);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}
/* Tails run the same vector code on masked lanes (inactive lanes read as 0 and are not stored). */
T5 static void exp_avx512(float *y, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}
T5 static void silu_mul_avx512(float *y, const float *g, const float *u, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 vg = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), vg));
        __m512 s = _mm512_div_ps(vg, _mm512_add_ps(one, e));
        if (u) s = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i));
        _mm512_mask_storeu_ps(y + i, k, s);
    }
}
T5 static void sigmoid_mul_avx512(float *y, const float *g, const float *u, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(k, g + i)));
        _mm512_mask_storeu_ps(y + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, u + i), _mm512_add_ps(one, e)));
    }
}

/* out[t][i] = Σ_c X[t][c]·M[c][i] (c ascending, FMA chain from +0) for R rows t and Z·16 columns
 * i from i0: R·Z accumulators stay in registers while c runs. */
#define MATT_TILE(R, Z)                                                                                   \
    T5 static void matt_##R##x##Z(const float *M, size_t ldm, uint32_t nc, const float *const *X,        \
                                  float *out, size_t ldo, uint32_t i0) {                                 \
        __m512 acc[R][Z];                                                                                 \
        for (int r = 0; r < R; r++)                                                                       \
            for (int z = 0; z < Z; z++) acc[r][z] = _mm512_setzero_ps();                                  \
        for (uint32_t c = 0; c < nc; c++) {                                                               \
            __m512 m[Z];                                                                                  \
            for (int z = 0; z < Z; z++) m[z] = _mm512_loadu_ps(M + c * ldm + i0 + 16 * z);               \
            for (int r = 0; r < R; r++) {                                                                 \
                const __m512 xb = _mm512_set1_ps(X[r][c]);                                                \
                for (int z = 0; z < Z; z++) acc[r][z] = _mm512_fmadd_ps(xb, m[z], acc[r][z]);             \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < R; r++)                                                                       \
            for (int z = 0; z < Z; z++) _mm512_storeu_ps(out + r * ldo + i0 + 16 * z, acc[r][z]);       \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
MATT_TILE(8, 2)
MATT_TILE(4, 4)
MATT_TILE(2, 8)
MATT_TILE(1, 1)
#pragma GCC pop_options

T5 static void matt_avx512(const float *M, size_t ldm, uint32_t nc, uint32_t w, const float *const *X, uint32_t R,
                           float *out, size_t ldo) {
    uint32_t r = 0;
    if (w % 128 == 0 && R <= 2) { /* decode: S·k and S·q of one row */
        for (; r + 2 <= R; r += 2)
            for (uint32_t i = 0; i < w; i += 128) matt_2x8(M, ldm, nc, X + r, out + r * ldo, ldo, i);
    }
    if (w % 32 == 0)
        for (; r + 8 <= R; r += 8)
            for (uint32_t i = 0; i < w; i += 32) matt_8x2(M, ldm, nc, X + r, out + r * ldo, ldo, i);
    if (w % 64 == 0)
        for (; r + 4 <= R; r += 4)
            for (uint32_t i = 0; i < w; i += 64) matt_4x4(M, ldm, nc, X + r, out + r * ldo, ldo, i);
    for (; r < R; r++)
        for (uint32_t i = 0; i < w; i += 16) matt_1x1(M, ldm, nc, X + r, out + r * ldo, ldo, i);
}

/* Chunk close, tiles of 8 rows c of S^T × 32 columns i (U's 32-column strip stays in L1 while c
 * runs): S^T[c][i] = S^T[c][i]·eG, then S^T[c][i] = fma(kT[c][s], U_s[i], S^T[c][i]) for s
 * ascending (U already scaled by e^{G_last-G_s}): the generic loop's per-element chain. */
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
T5 static void close_avx512(float *ST, uint32_t d, const float *kT, const float *U, float eG) {
    const __m512 ve = _mm512_set1_ps(eG);
    for (uint32_t i0 = 0; i0 < d; i0 += 32)
        for (uint32_t c0 = 0; c0 < d; c0 += 8) {
            __m512 a[8][2];
            for (int r = 0; r < 8; r++)
                for (int z = 0; z < 2; z++) a[r][z] = _mm512_mul_ps(_mm512_loadu_ps(ST + (size_t)(c0 + r) * d + i0 + 16 * z), ve);
            for (uint32_t s = 0; s < C_; s++) {
                const __m512 u0 = _mm512_loadu_ps(U + (size_t)s * d + i0), u1 = _mm512_loadu_ps(U + (size_t)s * d + i0 + 16);
                for (int r = 0; r < 8; r++) {
                    const __m512 k = _mm512_set1_ps(kT[(size_t)(c0 + r) * C_ + s]);
                    a[r][0] = _mm512_fmadd_ps(k, u0, a[r][0]);
                    a[r][1] = _mm512_fmadd_ps(k, u1, a[r][1]);
                }
            }
            for (int r = 0; r < 8; r++)
                for (int z = 0; z < 2; z++) _mm512_storeu_ps(ST + (size_t)(c0 + r) * d + i0 + 16 * z, a[r][z]);
        }
}

/* y = fma(w[s], U_s, y) for s = 0..ns-1 ascending, y (128 values) held in registers: the generic
 * axpy sequence's per-element chain. */
T5 static void comb128_avx512(float *y, const float *w, const float *U, uint32_t ns) {
    __m512 a[8];
    for (int z = 0; z < 8; z++) a[z] = _mm512_loadu_ps(y + 16 * z);
    for (uint32_t s = 0; s < ns; s++) {
        const __m512 b = _mm512_set1_ps(w[s]);
        for (int z = 0; z < 8; z++) a[z] = _mm512_fmadd_ps(b, _mm512_loadu_ps(U + (size_t)s * 128 + 16 * z), a[z]);
    }
    for (int z = 0; z < 8; z++) _mm512_storeu_ps(y + 16 * z, a[z]);
}
#pragma GCC pop_options
#endif

kvt_dn_impl kvt_dn_best_impl(void) {
#if DN_X86
    const char *e = getenv("KVT_NO_SIMD");
    if (e && e[0] == '1') return KVT_DN_SCALAR;
    switch (kvt_kernels_isa()) { /* follows KVT_ISA (kernels/dispatch.c) */
    case KVT_ISA_AVX512:
    case KVT_ISA_AMX: return KVT_DN_AVX512;
    case KVT_ISA_AVX2: return KVT_DN_AVX2;
    default: return KVT_DN_SCALAR;
    }
#else
    return KVT_DN_SCALAR;
#endif
}

/* ------------------------------------------------------------------ dispatch */

typedef struct dn_ops {
    void (*axpy)(float *, float, const float *, uint32_t);
    void (*vfma)(float *, const float *, const float *, uint32_t);
    void (*scale)(float *, float, uint32_t);
    void (*exp)(float *, const float *, uint32_t);
    void (*silu_mul)(float *, const float *, const float *, uint32_t);
    void (*sigmoid_mul)(float *, const float *, const float *, uint32_t);
    bool avx512;
} dn_ops;

static dn_ops ops_for(kvt_dn_impl impl) {
#if DN_X86
    if (impl == KVT_DN_AVX512)
        return (dn_ops){axpy_avx512, vfma_avx512, scale_avx512, exp_avx512, silu_mul_avx512, sigmoid_mul_avx512, true};
    if (impl == KVT_DN_AVX2)
        return (dn_ops){axpy_avx2, vfma_avx2, scale_avx2, exp_avx2, silu_mul_avx2, sigmoid_mul_avx2, false};
#endif
    (void)impl;
    return (dn_ops){axpy_scalar, vfma_scalar, scale_scalar, exp_scalar, silu_mul_scalar, sigmoid_mul_scalar, false};
}

void kvt_dn_silu_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n) {
    ops_for(impl).silu_mul(y, g, u, n);
}
void kvt_dn_sigmoid_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n) {
    ops_for(impl).sigmoid_mul(y, g, u, n);
}

/* out[t][i] = Σ_c X[t][c]·M[c][i], c = 0..nc-1 ascending as an FMA chain from +0, for R rows and
 * w columns (row stride ldm of M, ldo of out). */
static void matt(const dn_ops *op, const float *M, size_t ldm, uint32_t nc, uint32_t w, const float *const *X,
                 uint32_t R, float *out, size_t ldo) {
#if DN_X86
    if (op->avx512 && w % 16 == 0) {
        matt_avx512(M, ldm, nc, w, X, R, out, ldo);
        return;
    }
#endif
    for (uint32_t r = 0; r < R; r++) {
        float *o = out + r * ldo;
        memset(o, 0, w * sizeof(float));
        for (uint32_t c = 0; c < nc; c++) op->axpy(o, X[r][c], M + c * ldm, w);
    }
}

/* y = fma(w[s], U_s, y) for s = 0..ns-1 ascending (U rows of d). */
static void comb(const dn_ops *op, float *y, const float *w, const float *U, uint32_t ns, uint32_t d) {
#if DN_X86
    if (op->avx512 && d == 128) {
        comb128_avx512(y, w, U, ns);
        return;
    }
#endif
    for (uint32_t s = 0; s < ns; s++) op->axpy(y, w[s], U + (size_t)s * d, d);
}

/* ------------------------------------------------------------------ conv */

void kvt_dn_conv(const kvt_dn_dims *dm, kvt_dn_impl impl, const float *w, float *state, const float *u, uint32_t n,
                 float *out, uint32_t ch0, uint32_t ch1) {
    const dn_ops op = ops_for(impl);
    const uint32_t K = dm->conv_k, CD = kvt_dn_conv_dim(dm), nch = ch1 - ch0;
    if (ch0 >= ch1) return;
    for (uint32_t r = 0; r < n; r++) {
        float *o = out + (size_t)r * CD + ch0;
        memset(o, 0, nch * sizeof(float));
        for (uint32_t j = 0; j < K; j++) { /* input of position r - (K-1) + j: a row of u or of the state */
            const int64_t t = (int64_t)r - (int64_t)(K - 1) + j;
            const float *x = t >= 0 ? u + (size_t)t * CD : state + (size_t)(K - 1 + t) * CD;
            op.vfma(o, w + (size_t)j * CD + ch0, x + ch0, nch);
        }
        op.silu_mul(o, o, NULL, nch);
    }
    /* keep the last K-1 inputs; ascending j reads state row j+n > j before anything overwrites it */
    for (uint32_t j = 0; j + 1 < K; j++) {
        const uint64_t t = (uint64_t)j + n; /* position j - (K-1) + n relative to the old state */
        const float *src = t < K - 1 ? state + t * CD : u + (t - (K - 1)) * CD;
        memmove(state + (size_t)j * CD + ch0, src + ch0, nch * sizeof(float));
    }
}

/* ------------------------------------------------------------------ delta rule */

void kvt_dn_rows(const kvt_dn_dims *dm, kvt_dn_impl impl, float *state, const float *qkv, const float *beta,
                 const float *g, uint32_t pos0, uint32_t n, float *out, uint32_t h0, uint32_t h1) {
    const dn_ops op = ops_for(impl);
    const uint32_t d = dm->d, HK = dm->n_k_heads, HV = dm->n_v_heads, CD = kvt_dn_conv_dim(dm);
    const size_t VD = (size_t)HV * d;
    float *S0 = state + (size_t)(dm->conv_k - 1) * CD;
    float *kbuf = S0 + VD * d, *ubuf = kbuf + (size_t)C_ * VD, *gbuf = ubuf + (size_t)C_ * VD;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    /* d <= 512 (checked by the loader): ~40 KB of stack */
    float akq[2 * TB][512], kkq[2 * TB][C_], e[C_], tmp[C_], wk[C_], wq[C_];
    const float *X[2 * TB];
    for (uint32_t h = h0; h < h1; h++) {
        float *ST = S0 + (size_t)h * d * d, *kT = kbuf + (size_t)h * d * C_, *U = ubuf + (size_t)h * C_ * d;
        float *Gb = gbuf + (size_t)h * C_;
        const uint32_t kh = h % HK;
        for (uint32_t r0 = 0; r0 < n;) {
            const uint32_t j0 = (pos0 + r0) % C_;
            const uint32_t tb = n - r0 < TB ? n - r0 : TB, m = tb < C_ - j0 ? tb : C_ - j0; /* rows of this block */
            for (uint32_t t = 0; t < m; t++) {
                const float *row = qkv + (size_t)(r0 + t) * CD;
                X[t] = row + (size_t)(HK + kh) * d;  /* k */
                X[m + t] = row + (size_t)kh * d;     /* q */
                const uint32_t j = j0 + t;
                Gb[j] = (j ? Gb[j - 1] : 0.0f) + g[(size_t)(r0 + t) * HV + h];
                for (uint32_t c = 0; c < d; c++) kT[(size_t)c * C_ + j] = X[t][c];
            }
            /* S_a k_t and S_a q_t (S stored transposed: S^T[c][i]) */
            matt(&op, ST, d, d, d, X, 2 * m, &akq[0][0], 512);
            /* k_s·k_t and k_s·q_t for every s <= the block's last row (columns 32-aligned; extra ones unused) */
            const uint32_t w = (j0 + m + 31) & ~31u; /* <= C_ */
            matt(&op, kT, C_, d, w, X, 2 * m, &kkq[0][0], C_);
            for (uint32_t t = 0; t < m; t++) {
                const uint32_t j = j0 + t, r = r0 + t;
                const float G = Gb[j];
                for (uint32_t s = 0; s <= j; s++) tmp[s] = G - Gb[s];
                op.exp(e, tmp, j + 1); /* e[j] = exp(0) = 1 */
                const float eG = kvt_dn_exp(G);
                const float *v = qkv + (size_t)r * CD + (size_t)(2 * HK + h) * d;
                float *Uj = U + (size_t)j * d, *o = out + (size_t)r * VD + (size_t)h * d;
                /* U_j = beta (v - e^G S_a k - Σ_{s<j} e^{G-G_s} (k_s·k) U_s) */
                for (uint32_t s = 0; s < j; s++) wk[s] = -(e[s] * kkq[t][s]);
                for (uint32_t s = 0; s <= j; s++) wq[s] = e[s] * kkq[m + t][s];
                memcpy(Uj, v, d * sizeof(float));
                op.axpy(Uj, -eG, akq[t], d);
                comb(&op, Uj, wk, U, j, d);
                op.scale(Uj, beta[(size_t)r * HV + h], d);
                /* o = (e^G S_a q + Σ_{s<=j} e^{G-G_s} (k_s·q) U_s) / sqrt(d) */
                memset(o, 0, d * sizeof(float));
                op.axpy(o, eG, akq[m + t], d);
                comb(&op, o, wq, U, j + 1, d);
                op.scale(o, inv_sqrt_d, d);
            }
            if (j0 + m == C_) { /* close the chunk: S_{a+C} = e^{G_last} S_a + Σ_s e^{G_last-G_s} U_s k_s^T */
                const float GL = Gb[C_ - 1], eG = kvt_dn_exp(GL);
                for (uint32_t s = 0; s < C_; s++) tmp[s] = GL - Gb[s];
                op.exp(e, tmp, C_);
                for (uint32_t s = 0; s < C_; s++) op.scale(U + (size_t)s * d, e[s], d); /* rows are dead after this */
#if DN_X86
                if (op.avx512 && d % 32 == 0) {
                    close_avx512(ST, d, kT, U, eG);
                } else
#endif
                {
                    for (uint32_t c = 0; c < d; c++) {
                        float *sc = ST + (size_t)c * d;
                        op.scale(sc, eG, d);
                        for (uint32_t s = 0; s < C_; s++) op.axpy(sc, kT[(size_t)c * C_ + s], U + (size_t)s * d, d);
                    }
                }
            }
            r0 += m;
        }
    }
}

void kvt_dn_recurrence_ref(const kvt_dn_dims *dm, float *S0, const float *qkv, const float *beta, const float *g,
                           uint32_t n, float *out) {
    const uint32_t d = dm->d, HK = dm->n_k_heads, HV = dm->n_v_heads, CD = kvt_dn_conv_dim(dm);
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t h = 0; h < HV; h++) {
            float *S = S0 + (size_t)h * d * d;
            const float *row = qkv + (size_t)r * CD;
            const uint32_t kh = h % HK;
            const float *q = row + (size_t)kh * d, *k = row + (size_t)(HK + kh) * d, *v = row + (size_t)(2 * HK + h) * d;
            const float a = expf(g[(size_t)r * HV + h]), b = beta[(size_t)r * HV + h];
            float *o = out + (size_t)r * HV * d + (size_t)h * d;
            for (size_t i = 0; i < (size_t)d * d; i++) S[i] *= a;
            for (uint32_t i = 0; i < d; i++) {
                double sk = 0.0;
                for (uint32_t c = 0; c < d; c++) sk += (double)S[(size_t)i * d + c] * k[c];
                const float vn = b * (v[i] - (float)sk);
                for (uint32_t c = 0; c < d; c++) S[(size_t)i * d + c] += vn * k[c];
            }
            for (uint32_t i = 0; i < d; i++) {
                double sq = 0.0;
                for (uint32_t c = 0; c < d; c++) sq += (double)S[(size_t)i * d + c] * q[c];
                o[i] = (float)(sq / sqrt((double)d));
            }
        }
}
