/*
 * codec.c — row codecs for K/V: f16, bf16 and MLX affine (kv-codecs.md §1.2–1.4), plus the f32
 * dot/axpy helpers that attention and its reference share.
 *
 * Numerics: all affine math is fp32 with rintf (ties to even); scale/bias are rounded to f16 (or
 * bf16) for storage and decode computes scale*q + bias in fp32. Floating-point contraction is off
 * (gcc in -std=c11 mode does not contract; clang is told below) so the SIMD paths and their scalar
 * references produce the same bits.
 *
 * Affine row layout: D*bits/32 little-endian u32 words (LSB-first bit stream, element j at bits
 * [j*bits, j*bits+bits)), then D/G scales (u16), then D/G biases (u16).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_int.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVT_X86 1
#endif

/* ------------------------------------------------------------------ cpu features */
static int g_has_avx2; /* avx2 + f16c */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_detect(void) {
    kvt_f16_table_init();
#ifdef KVT_X86
    __builtin_cpu_init();
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)); /* CPUID.1:ECX.F16C */
    g_has_avx2 = __builtin_cpu_supports("avx2") && f16c;
#endif
    if (getenv("KVT_NO_SIMD")) g_has_avx2 = 0;
}

void kvt_kv_cpu_init(void) { pthread_once(&g_cpu_once, cpu_detect); }
bool kvt_kv_cpu_has_avx2(void) {
    kvt_kv_cpu_init();
    return g_has_avx2 != 0;
}

/* ------------------------------------------------------------------ validity / sizes */
static bool affine_bits_ok(uint32_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

bool kvt_codec_valid(kvt_codec c, uint32_t dim) {
    if (dim == 0) return false;
    switch (c.kind) {
    case KVT_CODEC_F16:
    case KVT_CODEC_BF16: return true;
    case KVT_CODEC_AFFINE:
        if (!affine_bits_ok(c.bits)) return false;
        if (c.group_size != 32 && c.group_size != 64 && c.group_size != 128) return false;
        return dim % c.group_size == 0;
    }
    return false;
}

size_t kvt_codec_row_bytes(kvt_codec c, uint32_t dim) {
    switch (c.kind) {
    case KVT_CODEC_F16:
    case KVT_CODEC_BF16: return (size_t)dim * 2;
    case KVT_CODEC_AFFINE:
        if (!kvt_codec_valid(c, dim)) return 0;
        return (size_t)dim * c.bits / 8 + 2 * 2 * (size_t)(dim / c.group_size);
    }
    return 0;
}

void kvt_codec_name(kvt_codec c, char *buf, size_t n) {
    if (!buf || n == 0) return;
    switch (c.kind) {
    case KVT_CODEC_F16: snprintf(buf, n, "f16"); return;
    case KVT_CODEC_BF16: snprintf(buf, n, "bf16"); return;
    case KVT_CODEC_AFFINE:
        snprintf(buf, n, "q%ug%u%s", (unsigned)c.bits, (unsigned)c.group_size, c.scale_bf16 ? "-bf16s" : "");
        return;
    }
    snprintf(buf, n, "invalid");
}

/* ------------------------------------------------------------------ affine */
void kvt_affine_quantize_group(const float *w, uint32_t g, uint32_t bits, uint32_t *codes, float *scale,
                               float *bias) {
    const float n_bins = (float)((1u << bits) - 1u);
    const float eps = 1e-7f;
    float w_min = w[0], w_max = w[0];
    for (uint32_t i = 1; i < g; i++) {
        if (w[i] < w_min) w_min = w[i];
        if (w[i] > w_max) w_max = w[i];
    }
    bool side = fabsf(w_min) > fabsf(w_max);
    float s = (w_max - w_min) / n_bins;
    if (!(s >= eps)) s = eps; /* max(s, eps); also maps NaN to eps */
    s = side ? s : -s;
    float edge = side ? w_min : w_max;
    float q0 = rintf(edge / s);
    float b = 0.0f;
    if (q0 != 0.0f) {
        s = edge / q0;
        b = edge;
    }
    for (uint32_t i = 0; i < g; i++) {
        float q = rintf((w[i] - b) / s);
        if (!(q > 0.0f)) q = 0.0f; /* clamp low; NaN -> 0 */
        if (q > n_bins) q = n_bins;
        codes[i] = (uint32_t)q;
    }
    *scale = s;
    *bias = b;
}

static inline uint16_t store_scale(float x, bool bf16) { return bf16 ? kvt_f32_to_bf16(x) : kvt_f32_to_f16(x); }
static inline float load_scale(uint16_t h, bool bf16) { return bf16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32_fast(h); }

static void affine_encode_row(kvt_codec c, const float *x, uint32_t dim, uint8_t *dst) {
    const uint32_t b = c.bits, G = c.group_size, n_groups = dim / G;
    const size_t code_bytes = (size_t)dim * b / 8;
    uint8_t *sc = dst + code_bytes, *bi = sc + 2 * (size_t)n_groups;
    memset(dst, 0, code_bytes);
    uint32_t codes[128];
    for (uint32_t g = 0; g < n_groups; g++) {
        float s, bias;
        kvt_affine_quantize_group(x + (size_t)g * G, G, b, codes, &s, &bias);
        for (uint32_t i = 0; i < G; i++) {
            /* bit stream, LSB first: element j occupies bits [j*b, j*b+b) of the row */
            uint64_t bitpos = (uint64_t)(g * G + i) * b;
            uint32_t byte = (uint32_t)(bitpos >> 3), off = (uint32_t)(bitpos & 7);
            uint32_t v = codes[i] << off;
            for (uint32_t k = 0; v && k < 3; k++) dst[byte + k] |= (uint8_t)(v >> (8 * k));
        }
        uint16_t hs = store_scale(s, c.scale_bf16), hb = store_scale(bias, c.scale_bf16);
        memcpy(sc + 2 * (size_t)g, &hs, 2);
        memcpy(bi + 2 * (size_t)g, &hb, 2);
    }
}

/* Extract code j (b bits) from the bit stream. A code spans at most 2 bytes for b <= 8 (off <= 7,
 * off + b <= 15), so reading 2 bytes is enough; the second byte is only read when needed. */
static inline uint32_t get_code(const uint8_t *p, uint32_t j, uint32_t b) {
    uint32_t bitpos = j * b, byte = bitpos >> 3, off = bitpos & 7;
    uint32_t v = p[byte];
    if (off + b > 8) v |= (uint32_t)p[byte + 1] << 8;
    return (v >> off) & ((1u << b) - 1u);
}

static void affine_decode_row(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst) {
    const uint32_t b = c.bits, G = c.group_size, n_groups = dim / G;
    const uint8_t *sc = src + (size_t)dim * b / 8, *bi = sc + 2 * (size_t)n_groups;
    for (uint32_t g = 0; g < n_groups; g++) {
        uint16_t hs, hb;
        memcpy(&hs, sc + 2 * (size_t)g, 2);
        memcpy(&hb, bi + 2 * (size_t)g, 2);
        const float s = load_scale(hs, c.scale_bf16), bias = load_scale(hb, c.scale_bf16);
        float *o = dst + (size_t)g * G;
        const uint32_t j0 = g * G;
        switch (b) {
        case 8: {
            const uint8_t *p = src + j0;
            for (uint32_t i = 0; i < G; i++) o[i] = s * (float)p[i] + bias;
            break;
        }
        case 4: {
            const uint8_t *p = src + j0 / 2;
            for (uint32_t i = 0; i < G; i += 2) {
                o[i] = s * (float)(p[i / 2] & 15u) + bias;
                o[i + 1] = s * (float)(p[i / 2] >> 4) + bias;
            }
            break;
        }
        case 2: {
            const uint8_t *p = src + j0 / 4;
            for (uint32_t i = 0; i < G; i++) o[i] = s * (float)((p[i / 4] >> (2 * (i & 3))) & 3u) + bias;
            break;
        }
        default:
            for (uint32_t i = 0; i < G; i++) o[i] = s * (float)get_code(src, j0 + i, b) + bias;
            break;
        }
    }
}

#ifdef KVT_X86
/* AVX2 affine decode for the common 8- and 4-bit codes: x = s*q + b with mul then add separately
 * rounded (no "fma" in the target), exactly the scalar expression above. Other widths use the
 * scalar path. Requires G % 8 == 0 (always true: G in {32,64,128}). */
__attribute__((target("avx2"))) static void affine_decode_avx2(kvt_codec c, const uint8_t *src, uint32_t dim,
                                                              float *dst) {
    const uint32_t b = c.bits, G = c.group_size, n_groups = dim / G;
    const uint8_t *sc = src + (size_t)dim * b / 8, *bi = sc + 2 * (size_t)n_groups;
    const __m256i lo4 = _mm256_set1_epi32(15);
    for (uint32_t g = 0; g < n_groups; g++) {
        uint16_t hs, hb;
        memcpy(&hs, sc + 2 * (size_t)g, 2);
        memcpy(&hb, bi + 2 * (size_t)g, 2);
        const __m256 vs = _mm256_set1_ps(load_scale(hs, c.scale_bf16)), vb = _mm256_set1_ps(load_scale(hb, c.scale_bf16));
        float *o = dst + (size_t)g * G;
        const uint32_t j0 = g * G;
        if (b == 8) {
            for (uint32_t i = 0; i < G; i += 8) {
                __m128i q8 = _mm_loadl_epi64((const __m128i *)(src + j0 + i));
                __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8));
                _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(vs, q), vb));
            }
        } else { /* b == 4: byte k holds element 2k (low nibble) and 2k+1 (high nibble) */
            for (uint32_t i = 0; i < G; i += 8) {
                uint32_t w;
                memcpy(&w, src + (j0 + i) / 2, 4);
                /* lane e takes nibble e of w: shift each lane by 4*e */
                __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
                __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(v, lo4));
                _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(vs, q), vb));
            }
        }
    }
}

__attribute__((target("avx2"))) static void bf16_decode_avx2(const uint8_t *src, uint32_t dim, float *dst) {
    uint32_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * (size_t)i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    for (; i < dim; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)i, 2);
        dst[i] = kvt_bf16_to_f32(h);
    }
}
#endif

/* ------------------------------------------------------------------ f16 / bf16 rows */
static void f16_decode_scalar(const uint8_t *src, uint32_t dim, float *dst) {
    for (uint32_t i = 0; i < dim; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)i, 2);
        dst[i] = kvt_f16_to_f32(h);
    }
}

static void f16_decode_table(const uint8_t *src, uint32_t dim, float *dst) {
    for (uint32_t i = 0; i < dim; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)i, 2);
        dst[i] = kvt_f16_to_f32_fast(h);
    }
}

#ifdef KVT_X86
/* F16C conversion is exact (same values as kvt_f16_to_f32 for every non-signalling-NaN input). */
__attribute__((target("f16c,avx2,fma"))) static void f16_decode_f16c(const uint8_t *src, uint32_t dim, float *dst) {
    uint32_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * (size_t)i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < dim; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)i, 2);
        dst[i] = kvt_f16_to_f32_fast(h);
    }
}
#endif

static void bf16_decode(const uint8_t *src, uint32_t dim, float *dst) {
    for (uint32_t i = 0; i < dim; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)i, 2);
        dst[i] = kvt_bf16_to_f32(h);
    }
}

void kvt_codec_encode_row(kvt_codec c, const float *x, uint32_t dim, void *dst) {
    uint8_t *d = dst;
    switch (c.kind) {
    case KVT_CODEC_F16:
        for (uint32_t i = 0; i < dim; i++) {
            uint16_t h = kvt_f32_to_f16(x[i]);
            memcpy(d + 2 * (size_t)i, &h, 2);
        }
        return;
    case KVT_CODEC_BF16:
        for (uint32_t i = 0; i < dim; i++) {
            uint16_t h = kvt_f32_to_bf16(x[i]);
            memcpy(d + 2 * (size_t)i, &h, 2);
        }
        return;
    case KVT_CODEC_AFFINE:
        if (kvt_codec_valid(c, dim)) affine_encode_row(c, x, dim, d);
        return;
    }
}

void kvt_decode_row_scalar(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst) {
    kvt_f16_table_init(); /* affine scale loads use the table */
    switch (c.kind) {
    case KVT_CODEC_F16: f16_decode_scalar(src, dim, dst); return;
    case KVT_CODEC_BF16: bf16_decode(src, dim, dst); return;
    case KVT_CODEC_AFFINE: affine_decode_row(c, src, dim, dst); return;
    }
}

/* Hot path: caller has run kvt_kv_cpu_init(). */
void kvt_decode_row_fast(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst) {
    switch (c.kind) {
    case KVT_CODEC_F16:
#ifdef KVT_X86
        if (g_has_avx2) {
            f16_decode_f16c(src, dim, dst);
            return;
        }
#endif
        f16_decode_table(src, dim, dst);
        return;
    case KVT_CODEC_BF16:
#ifdef KVT_X86
        if (g_has_avx2) {
            bf16_decode_avx2(src, dim, dst);
            return;
        }
#endif
        bf16_decode(src, dim, dst);
        return;
    case KVT_CODEC_AFFINE:
#ifdef KVT_X86
        if (g_has_avx2 && (c.bits == 8 || c.bits == 4)) {
            affine_decode_avx2(c, src, dim, dst);
            return;
        }
#endif
        affine_decode_row(c, src, dim, dst);
        return;
    }
}

void kvt_codec_decode_row(kvt_codec c, const void *src, uint32_t dim, float *dst) {
    kvt_kv_cpu_init();
    if (c.kind == KVT_CODEC_AFFINE && !kvt_codec_valid(c, dim)) {
        memset(dst, 0, (size_t)dim * sizeof(float));
        return;
    }
    kvt_decode_row_fast(c, src, dim, dst);
}

/* ------------------------------------------------------------------ dot / axpy */
/* The dot product is defined as 8 interleaved lane sums (lane l takes elements i ≡ l mod 8 of the
 * first n & ~7), combined as ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)), then the tail added in order.
 * The AVX2 version computes exactly this (mul then add, no FMA), so both give the same bits. */
static inline float lane_reduce(const float *acc) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float kvt_kv_dot_scalar(const float *a, const float *b, uint32_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t n8 = n & ~7u, i;
    for (i = 0; i < n8; i += 8)
        for (uint32_t l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float s = lane_reduce(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void kvt_kv_axpy_scalar(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] += a * x[i];
}

#ifdef KVT_X86
/* No "fma" in the target on purpose: mul and add must stay separately rounded. */
__attribute__((target("avx2"))) static float dot_avx2(const float *a, const float *b, uint32_t n) {
    __m256 acc = _mm256_setzero_ps();
    uint32_t n8 = n & ~7u, i;
    for (i = 0; i < n8; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float s = lane_reduce(lanes);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

__attribute__((target("avx2"))) static void axpy_avx2(float *y, float a, const float *x, uint32_t n) {
    __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(va, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

float kvt_kv_dot(const float *a, const float *b, uint32_t n) {
#ifdef KVT_X86
    if (g_has_avx2) return dot_avx2(a, b, n);
#endif
    return kvt_kv_dot_scalar(a, b, n);
}

void kvt_kv_axpy(float *y, float a, const float *x, uint32_t n) {
#ifdef KVT_X86
    if (g_has_avx2) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    kvt_kv_axpy_scalar(y, a, x, n);
}

/* ------------------------------------------------------------------ multi-row dot / axpy */
/* kvt_kv_dot_rows: out[r] = kvt_kv_dot(q, k + r*stride, n) * scale for r < n_rows, computed 8 rows
 * at a time with one accumulator per row, then reduced with the same lane tree for all 8 rows at
 * once (see reduce8 below). Bit-identical to the per-row helper. */
void kvt_kv_dot_rows_scalar(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                            float *out) {
    for (uint32_t r = 0; r < n_rows; r++) out[r] = kvt_kv_dot_scalar(q, k + r * stride, n) * scale;
}

/* kvt_kv_axpy_rows: for r ascending, y += w[r] * x[r*stride .. +n] — the same sequence of
 * separately rounded mul/add per element as n_rows calls of kvt_kv_axpy. */
void kvt_kv_axpy_rows_scalar(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
    for (uint32_t r = 0; r < n_rows; r++) kvt_kv_axpy_scalar(y, w[r], x + r * stride, n);
}

#ifdef KVT_X86
/* acc[r] holds row r's 8 lane sums l0..l7. Result lane r = ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)) of
 * acc[r], i.e. lane_reduce: first the 128-bit halves are added (a=l0+l4, b=l1+l5, c=l2+l6, d=l3+l7),
 * then two rounds of hadd form (a+b) and then (a+b)+(c+d). IEEE addition is commutative, so hadd's
 * operand order does not matter. */
__attribute__((target("avx2"))) static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                                              __m256 a5, __m256 a6, __m256 a7) {
    /* u_r = [row r: a b c d | row r+4: a b c d] */
    const __m256 u0 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a4, 0x20), _mm256_permute2f128_ps(a0, a4, 0x31));
    const __m256 u1 = _mm256_add_ps(_mm256_permute2f128_ps(a1, a5, 0x20), _mm256_permute2f128_ps(a1, a5, 0x31));
    const __m256 u2 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a6, 0x20), _mm256_permute2f128_ps(a2, a6, 0x31));
    const __m256 u3 = _mm256_add_ps(_mm256_permute2f128_ps(a3, a7, 0x20), _mm256_permute2f128_ps(a3, a7, 0x31));
    const __m256 h01 = _mm256_hadd_ps(u0, u1); /* [r0: a+b c+d, r1: a+b c+d | r4 .., r5 ..] */
    const __m256 h23 = _mm256_hadd_ps(u2, u3);
    return _mm256_hadd_ps(h01, h23); /* [r0 r1 r2 r3 | r4 r5 r6 r7] */
}

/* Eight named accumulators (an array would live in memory at -O2). */
__attribute__((target("avx2"))) static void dot_rows_avx2(const float *q, const float *k, size_t stride,
                                                         uint32_t n_rows, uint32_t n, float scale, float *out) {
    const __m256 vscale = _mm256_set1_ps(scale);
    uint32_t r = 0;
    for (; r + 8 <= n_rows; r += 8) {
        const float *k0 = k + r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        const float *k4 = k3 + stride, *k5 = k4 + stride, *k6 = k5 + stride, *k7 = k6 + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (uint32_t i = 0; i < n; i += 8) {
            const __m256 vq = _mm256_loadu_ps(q + i);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(vq, _mm256_loadu_ps(k0 + i)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(vq, _mm256_loadu_ps(k1 + i)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(vq, _mm256_loadu_ps(k2 + i)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(vq, _mm256_loadu_ps(k3 + i)));
            a4 = _mm256_add_ps(a4, _mm256_mul_ps(vq, _mm256_loadu_ps(k4 + i)));
            a5 = _mm256_add_ps(a5, _mm256_mul_ps(vq, _mm256_loadu_ps(k5 + i)));
            a6 = _mm256_add_ps(a6, _mm256_mul_ps(vq, _mm256_loadu_ps(k6 + i)));
            a7 = _mm256_add_ps(a7, _mm256_mul_ps(vq, _mm256_loadu_ps(k7 + i)));
        }
        _mm256_storeu_ps(out + r, _mm256_mul_ps(reduce8(a0, a1, a2, a3, a4, a5, a6, a7), vscale));
    }
    for (; r < n_rows; r++) out[r] = dot_avx2(q, k + r * stride, n) * scale;
}

/* y is kept in registers 32 floats at a time while all rows stream past. */
__attribute__((target("avx2"))) static void axpy_rows_avx2(float *y, const float *w, const float *x, size_t stride,
                                                          uint32_t n_rows, uint32_t n) {
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);
        __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);
        for (uint32_t r = 0; r < n_rows; r++) {
            const float *xr = x + r * stride + i;
            const __m256 a = _mm256_set1_ps(w[r]);
            y0 = _mm256_add_ps(y0, _mm256_mul_ps(a, _mm256_loadu_ps(xr)));
            y1 = _mm256_add_ps(y1, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 8)));
            y2 = _mm256_add_ps(y2, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 16)));
            y3 = _mm256_add_ps(y3, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 24)));
        }
        _mm256_storeu_ps(y + i, y0), _mm256_storeu_ps(y + i + 8, y1);
        _mm256_storeu_ps(y + i + 16, y2), _mm256_storeu_ps(y + i + 24, y3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 y0 = _mm256_loadu_ps(y + i);
        for (uint32_t r = 0; r < n_rows; r++)
            y0 = _mm256_add_ps(y0, _mm256_mul_ps(_mm256_set1_ps(w[r]), _mm256_loadu_ps(x + r * stride + i)));
        _mm256_storeu_ps(y + i, y0);
    }
    for (; i < n; i++) {
        float yi = y[i];
        for (uint32_t r = 0; r < n_rows; r++) yi += w[r] * x[r * stride + i];
        y[i] = yi;
    }
}
#endif

void kvt_kv_dot_rows(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                     float *out) {
#ifdef KVT_X86
    if (g_has_avx2 && n % 8 == 0) {
        dot_rows_avx2(q, k, stride, n_rows, n, scale, out);
        return;
    }
#endif
    for (uint32_t r = 0; r < n_rows; r++) out[r] = kvt_kv_dot(q, k + r * stride, n) * scale;
}

void kvt_kv_axpy_rows(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
#ifdef KVT_X86
    if (g_has_avx2) {
        axpy_rows_avx2(y, w, x, stride, n_rows, n);
        return;
    }
#endif
    kvt_kv_axpy_rows_scalar(y, w, x, stride, n_rows, n);
}
