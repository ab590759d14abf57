/*
 * deltanet.c — gated delta rule in the position-aligned chunkwise form and the causal conv (see
 * deltanet.h for the math and the state layout). Two implementations of the inner dot/axpy
 * (scalar reference and AVX2+FMA) share one driver, so the algorithm exists once; they differ only
 * in float summation order, which the tests bound.
 */
#include "deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DN_X86 1
#else
#define DN_X86 0
#endif

uint32_t kvt_dn_conv_dim(const kvt_dn_dims *dm) { return (2 * dm->n_k_heads + dm->n_v_heads) * dm->d; }

size_t kvt_dn_state_bytes(const kvt_dn_dims *dm) {
    const size_t d = dm->d, hv = dm->n_v_heads;
    size_t n = (size_t)(dm->conv_k - 1) * kvt_dn_conv_dim(dm) + hv * d * d;
    n += (size_t)KVT_DN_CHUNK * (2 * hv * d + hv);
    return n * sizeof(float);
}

/* ------------------------------------------------------------------ inner kernels */

static float dot_scalar(const float *a, const float *b, uint32_t n) {
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void axpy_scalar(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] += a * x[i];
}
static void scale_scalar(float *y, float a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] *= a;
}

#if DN_X86
#define TGT __attribute__((target("avx2,fma")))
TGT static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
TGT static float dot_avx2(const float *a, const float *b, uint32_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
TGT static void axpy_avx2(float *y, float a, const float *x, uint32_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
TGT static void scale_avx2(float *y, float a, uint32_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}
#endif

kvt_dn_impl kvt_dn_best_impl(void) {
#if DN_X86
    const char *e = getenv("KVT_NO_SIMD");
    if (e && e[0] == '1') return KVT_DN_SCALAR;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KVT_DN_AVX2;
#endif
    return KVT_DN_SCALAR;
}

typedef struct dn_ops {
    float (*dot)(const float *, const float *, uint32_t);
    void (*axpy)(float *, float, const float *, uint32_t);
    void (*scale)(float *, float, uint32_t);
} dn_ops;

static dn_ops ops_for(kvt_dn_impl impl) {
#if DN_X86
    if (impl == KVT_DN_AVX2) return (dn_ops){dot_avx2, axpy_avx2, scale_avx2};
#endif
    (void)impl;
    return (dn_ops){dot_scalar, axpy_scalar, scale_scalar};
}

/* ------------------------------------------------------------------ conv */

void kvt_dn_conv(const kvt_dn_dims *dm, const float *w, float *state, const float *u, uint32_t n, float *out,
                 uint32_t ch0, uint32_t ch1) {
    const uint32_t K = dm->conv_k, CD = kvt_dn_conv_dim(dm);
    float win[16]; /* K <= 16 (checked by the loader) */
    for (uint32_t ch = ch0; ch < ch1; ch++) {
        const float *wc = w + (size_t)ch * K;
        for (uint32_t j = 0; j + 1 < K; j++) win[j] = state[(size_t)j * CD + ch];
        for (uint32_t r = 0; r < n; r++) {
            const float x = u[(size_t)r * CD + ch];
            float s = 0.0f;
            for (uint32_t j = 0; j + 1 < K; j++) s += wc[j] * win[j];
            s += wc[K - 1] * x;
            out[(size_t)r * CD + ch] = s / (1.0f + expf(-s));
            for (uint32_t j = 0; j + 2 < K; j++) win[j] = win[j + 1];
            if (K > 1) win[K - 2] = x;
        }
        for (uint32_t j = 0; j + 1 < K; j++) state[(size_t)j * CD + ch] = win[j];
    }
}

/* ------------------------------------------------------------------ delta rule */

void kvt_dn_rows(const kvt_dn_dims *dm, kvt_dn_impl impl, float *state, const float *qkv, const float *beta,
                 const float *g, uint32_t pos0, uint32_t n, float *out, uint32_t h0, uint32_t h1) {
    const dn_ops op = ops_for(impl);
    const uint32_t d = dm->d, HK = dm->n_k_heads, HV = dm->n_v_heads, CD = kvt_dn_conv_dim(dm);
    const size_t VD = (size_t)HV * d;
    float *S0 = state + (size_t)(dm->conv_k - 1) * CD;
    float *kbuf = S0 + VD * d, *ubuf = kbuf + (size_t)KVT_DN_CHUNK * VD, *gbuf = ubuf + (size_t)KVT_DN_CHUNK * VD;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    float ak[512], aq[512], wk[KVT_DN_CHUNK], wq[KVT_DN_CHUNK]; /* d <= 512 (checked by the loader) */
    for (uint32_t h = h0; h < h1; h++) {
        float *S = S0 + (size_t)h * d * d;
        const uint32_t kh = h % HK;
        for (uint32_t r = 0; r < n; r++) {
            const uint32_t j = (pos0 + r) % KVT_DN_CHUNK; /* row inside the open chunk */
            const float *row = qkv + (size_t)r * CD;
            const float *q = row + (size_t)kh * d, *k = row + (size_t)(HK + kh) * d, *v = row + (size_t)(2 * HK + h) * d;
            const float b = beta[(size_t)r * HV + h];
            const float G = (j ? gbuf[(size_t)(j - 1) * HV + h] : 0.0f) + g[(size_t)r * HV + h];
            const float eG = expf(G);
            for (uint32_t i = 0; i < d; i++) {
                ak[i] = op.dot(S + (size_t)i * d, k, d);
                aq[i] = op.dot(S + (size_t)i * d, q, d);
            }
            float *U = ubuf + ((size_t)j * HV + h) * d, *kj = kbuf + ((size_t)j * HV + h) * d;
            for (uint32_t i = 0; i < d; i++) U[i] = v[i] - eG * ak[i];
            for (uint32_t s = 0; s < j; s++) {
                const float *ks = kbuf + ((size_t)s * HV + h) * d;
                const float e = expf(G - gbuf[(size_t)s * HV + h]);
                wk[s] = e * op.dot(ks, k, d);
                wq[s] = e * op.dot(ks, q, d);
            }
            for (uint32_t s = 0; s < j; s++) op.axpy(U, -wk[s], ubuf + ((size_t)s * HV + h) * d, d);
            op.scale(U, b, d);
            float *o = out + (size_t)r * VD + (size_t)h * d;
            for (uint32_t i = 0; i < d; i++) o[i] = eG * aq[i];
            for (uint32_t s = 0; s < j; s++) op.axpy(o, wq[s], ubuf + ((size_t)s * HV + h) * d, d);
            op.axpy(o, op.dot(k, q, d), U, d);
            op.scale(o, inv_sqrt_d, d);
            memcpy(kj, k, d * sizeof(float));
            gbuf[(size_t)j * HV + h] = G;
            if (j == KVT_DN_CHUNK - 1) { /* close the chunk: fold its rows into S */
                op.scale(S, eG, d * d);
                for (uint32_t s = 0; s < KVT_DN_CHUNK; s++) {
                    const float e = expf(G - gbuf[(size_t)s * HV + h]);
                    const float *us = ubuf + ((size_t)s * HV + h) * d, *ks = kbuf + ((size_t)s * HV + h) * d;
                    for (uint32_t i = 0; i < d; i++) op.axpy(S + (size_t)i * d, e * us[i], ks, d);
                }
            }
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
