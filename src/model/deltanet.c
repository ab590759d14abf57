/*
 * deltanet.c — gated delta rule in the position-aligned chunkwise form, the causal conv and the
 * elementwise gates of the qwen35 layers (see deltanet.h for the math and the state layout).
 *
 * Numerics: every reduction is written as a chain of fused multiply-adds in a fixed order along
 * one index, vectorized along ANOTHER index (never a lane tree). So each output element sees the
 * same operations in the same order whatever the vector width, the tile shape or the number of
 * rows in a call: the scalar reference (fmaf), AVX2 and AVX-512 give the same bits, and so do
 * prefill batches of any size and token-by-token decode. exp is our own polynomial
 * (kvt_vec_exp_clamped and its vector copies in kernels/vec.c, same operation sequence), not libm's,
 * for the same reason. The elementwise operations (axpy, fma, scale, exp, the gates) are
 * kernels/vec.h's table of the chosen implementation's ISA.
 * The AVX-512 implementation adds register-tiled kernels for the two d×d products (S·k/S·q for a
 * block of rows, and the chunk-closing rank-64 update); they compute exactly the generic code's
 * per-element FMA chain.
 */
#include "deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/vec.h"

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

/* ------------------------------------------------------------------ AVX-512 tiles */

#if DN_X86
#define T5 __attribute__((target("avx512f,avx2,fma")))
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

/* The kernels' ISA in use (KVT_ISA or the best the CPU runs), as the level of its vector table. */
kvt_dn_impl kvt_dn_best_impl(void) { return (kvt_dn_impl)kvt_vec_ops_for(kvt_kernels_isa())->level; }

/* ------------------------------------------------------------------ dispatch */

/* The elementwise operations of an implementation: kernels/vec.h's table of the same ISA (the
 * kvt_dn_impl values are kvt_isa's). */
static const kvt_vec_ops *ops_for(kvt_dn_impl impl) { return kvt_vec_ops_for((kvt_isa)impl); }

void kvt_dn_silu_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n) {
    ops_for(impl)->silu_mul(y, g, u, n);
}
void kvt_dn_sigmoid_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n) {
    ops_for(impl)->sigmoid_mul(y, g, u, n);
}

/* out[t][i] = Σ_c X[t][c]·M[c][i], c = 0..nc-1 ascending as an FMA chain from +0, for R rows and
 * w columns (row stride ldm of M, ldo of out). */
static void matt(const kvt_vec_ops *op, const float *M, size_t ldm, uint32_t nc, uint32_t w, const float *const *X,
                 uint32_t R, float *out, size_t ldo) {
#if DN_X86
    if (op->level == 2 && w % 16 == 0) {
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
static void comb(const kvt_vec_ops *op, float *y, const float *w, const float *U, uint32_t ns, uint32_t d) {
#if DN_X86
    if (op->level == 2 && d == 128) {
        comb128_avx512(y, w, U, ns);
        return;
    }
#endif
    for (uint32_t s = 0; s < ns; s++) op->axpy(y, w[s], U + (size_t)s * d, d);
}

/* ------------------------------------------------------------------ conv */

void kvt_dn_conv(const kvt_dn_dims *dm, kvt_dn_impl impl, const float *w, float *state, const float *u, uint32_t n,
                 float *out, uint32_t ch0, uint32_t ch1) {
    const kvt_vec_ops *op = ops_for(impl);
    const uint32_t K = dm->conv_k, CD = kvt_dn_conv_dim(dm), nch = ch1 - ch0;
    if (ch0 >= ch1) return;
    for (uint32_t r = 0; r < n; r++) {
        float *o = out + (size_t)r * CD + ch0;
        memset(o, 0, nch * sizeof(float));
        for (uint32_t j = 0; j < K; j++) { /* input of position r - (K-1) + j: a row of u or of the state */
            const int64_t t = (int64_t)r - (int64_t)(K - 1) + j;
            const float *x = t >= 0 ? u + (size_t)t * CD : state + (size_t)(K - 1 + t) * CD;
            op->vfma(o, w + (size_t)j * CD + ch0, x + ch0, nch);
        }
        op->silu_mul(o, o, NULL, nch);
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
    const kvt_vec_ops *op = ops_for(impl);
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
            matt(op, ST, d, d, d, X, 2 * m, &akq[0][0], 512);
            /* k_s·k_t and k_s·q_t for every s <= the block's last row (columns 32-aligned; extra ones unused) */
            const uint32_t w = (j0 + m + 31) & ~31u; /* <= C_ */
            matt(op, kT, C_, d, w, X, 2 * m, &kkq[0][0], C_);
            for (uint32_t t = 0; t < m; t++) {
                const uint32_t j = j0 + t, r = r0 + t;
                const float G = Gb[j];
                for (uint32_t s = 0; s <= j; s++) tmp[s] = G - Gb[s];
                op->exp_clamped(e, tmp, j + 1); /* e[j] = exp(0) = 1 */
                const float eG = kvt_vec_exp_clamped(G);
                const float *v = qkv + (size_t)r * CD + (size_t)(2 * HK + h) * d;
                float *Uj = U + (size_t)j * d, *o = out + (size_t)r * VD + (size_t)h * d;
                /* U_j = beta (v - e^G S_a k - Σ_{s<j} e^{G-G_s} (k_s·k) U_s) */
                for (uint32_t s = 0; s < j; s++) wk[s] = -(e[s] * kkq[t][s]);
                for (uint32_t s = 0; s <= j; s++) wq[s] = e[s] * kkq[m + t][s];
                memcpy(Uj, v, d * sizeof(float));
                op->axpy(Uj, -eG, akq[t], d);
                comb(op, Uj, wk, U, j, d);
                op->scale(Uj, beta[(size_t)r * HV + h], d);
                /* o = (e^G S_a q + Σ_{s<=j} e^{G-G_s} (k_s·q) U_s) / sqrt(d) */
                memset(o, 0, d * sizeof(float));
                op->axpy(o, eG, akq[m + t], d);
                comb(op, o, wq, U, j + 1, d);
                op->scale(o, inv_sqrt_d, d);
            }
            if (j0 + m == C_) { /* close the chunk: S_{a+C} = e^{G_last} S_a + Σ_s e^{G_last-G_s} U_s k_s^T */
                const float GL = Gb[C_ - 1], eG = kvt_vec_exp_clamped(GL);
                for (uint32_t s = 0; s < C_; s++) tmp[s] = GL - Gb[s];
                op->exp_clamped(e, tmp, C_);
                for (uint32_t s = 0; s < C_; s++) op->scale(U + (size_t)s * d, e[s], d); /* rows are dead after this */
#if DN_X86
                if (op->level == 2 && d % 32 == 0) {
                    close_avx512(ST, d, kT, U, eG);
                } else
#endif
                {
                    for (uint32_t c = 0; c < d; c++) {
                        float *sc = ST + (size_t)c * d;
                        op->scale(sc, eG, d);
                        for (uint32_t s = 0; s < C_; s++) op->axpy(sc, kT[(size_t)c * C_ + s], U + (size_t)s * d, d);
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
