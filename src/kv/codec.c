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
static int g_has_avx2; /* avx2 + f16c (row decoders) */
static int g_simd;     /* dot/axpy/exp level: 0 scalar, 1 AVX2+FMA, 2 AVX-512F */
static int g_has_vbmi; /* avx512 f+bw+vbmi (8-bit TURBO codebook lookup; used while g_simd == 2) */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_detect(void) {
    kvt_f16_table_init();
    kvt_turbo_init();
#ifdef KVT_X86
    __builtin_cpu_init();
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)); /* CPUID.1:ECX.F16C */
    g_has_avx2 = __builtin_cpu_supports("avx2") && f16c;
    g_has_vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vbmi");
#endif
    if (g_has_avx2 && __builtin_cpu_supports("fma")) g_simd = __builtin_cpu_supports("avx512f") ? 2 : 1;
    if (getenv("KVT_NO_AVX512") && g_simd > 1) g_simd = 1;
    if (getenv("KVT_NO_SIMD")) g_has_avx2 = 0, g_simd = 0;
}

void kvt_kv_cpu_init(void) { pthread_once(&g_cpu_once, cpu_detect); }
int kvt_kv_simd_level(void) {
    kvt_kv_cpu_init();
    return g_simd;
}
void kvt_kv_force_simd_level(int level) {
    kvt_kv_cpu_init();
    if (level < g_simd) g_simd = level < 0 ? 0 : level;
}
int kvt_kv_turbo_level(void) {
    kvt_kv_cpu_init();
    return !g_has_avx2 ? KVT_TURBO_SCALAR : g_simd == 2 && g_has_vbmi ? KVT_TURBO_VBMI : KVT_TURBO_AVX2;
}
bool kvt_kv_cpu_has_avx2(void) {
    kvt_kv_cpu_init();
    return g_has_avx2 != 0;
}

/* ------------------------------------------------------------------ validity / sizes */
static bool affine_bits_ok(uint32_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

kvt_codec kvt_codec_side(kvt_codec c, int kv) {
    if (c.kind != KVT_CODEC_TURBO) return c;
    const uint8_t b = kv ? c.vbits : c.bits;
    return (kvt_codec){.kind = KVT_CODEC_TURBO, .bits = b, .vbits = b};
}

uint32_t kvt_affine_auto_group(uint32_t head_dim) {
    static const uint32_t groups[3] = {128, 64, 32};
    for (int i = 0; i < 3; i++)
        if (head_dim && head_dim % groups[i] == 0) return groups[i];
    return 0;
}

bool kvt_codec_valid(kvt_codec c, uint32_t dim) {
    if (dim == 0) return false;
    switch (c.kind) {
    case KVT_CODEC_TURBO: return kvt_turbo_bits_ok(c.bits) && kvt_turbo_bits_ok(c.vbits) && kvt_turbo_dim_ok(dim);
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
    case KVT_CODEC_TURBO: /* a side codec (bits == vbits); see kvt_codec_side */
        if (!kvt_codec_valid(c, dim) || c.bits != c.vbits) return 0;
        return kvt_turbo_row_bytes(c.bits, dim);
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
    case KVT_CODEC_TURBO: snprintf(buf, n, "turbo-k%uv%u", (unsigned)c.bits, (unsigned)c.vbits); return;
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
/* f32 → f16, round to nearest even: F16C gives kvt_f32_to_f16's bits for every non-NaN value
 * (inf and overflow included); a group of 8 holding a NaN takes the scalar path (canonical NaN). */
__attribute__((target("f16c,avx2,fma"))) static void f16_encode_f16c(const float *x, uint32_t dim, uint8_t *d) {
    uint32_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) break;
        _mm_storeu_si128((__m128i *)(d + 2 * (size_t)i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < dim; i++) {
        const uint16_t h = kvt_f32_to_f16(x[i]);
        memcpy(d + 2 * (size_t)i, &h, 2);
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
#ifdef KVT_X86
        if (g_has_avx2) {
            f16_encode_f16c(x, dim, d);
            return;
        }
#endif
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
    case KVT_CODEC_TURBO: /* x is already rotated (kvt_turbo_rotate) */
        if (kvt_codec_row_bytes(c, dim)) kvt_turbo_encode_row(c.bits, x, dim, d);
        return;
    }
}

void kvt_decode_row_scalar(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst) {
    kvt_f16_table_init(); /* affine scale loads use the table */
    switch (c.kind) {
    case KVT_CODEC_F16: f16_decode_scalar(src, dim, dst); return;
    case KVT_CODEC_BF16: bf16_decode(src, dim, dst); return;
    case KVT_CODEC_AFFINE: affine_decode_row(c, src, dim, dst); return;
    case KVT_CODEC_TURBO: kvt_turbo_decode_row_scalar(c.bits, src, dim, dst); return;
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
    case KVT_CODEC_TURBO: kvt_turbo_decode_row(c.bits, src, dim, dst, kvt_kv_turbo_level()); return;
    }
}

void kvt_codec_decode_row(kvt_codec c, const void *src, uint32_t dim, float *dst) {
    kvt_kv_cpu_init();
    if ((c.kind == KVT_CODEC_AFFINE || c.kind == KVT_CODEC_TURBO) && !kvt_codec_row_bytes(c, dim)) {
        memset(dst, 0, (size_t)dim * sizeof(float));
        return;
    }
    kvt_decode_row_fast(c, src, dim, dst);
}

/* ------------------------------------------------------------------ dot / axpy / exp */
/* Numerics (KVT_NUMERICS_VERSION 2). Every multiply-add is a fused fmaf (one rounding).
 * dot(a, b, n): 16 lane sums, lane l taking elements i ≡ l (mod 16) of the first n & ~15 via
 *   acc[l] = fmaf(a[i], b[i], acc[l]); then t[l] = acc[l] + acc[l+8] (l < 8) and
 *   s = ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)); then the tail in order: s = fmaf(a[i], b[i], s).
 *   AVX-512 keeps the 16 lanes in one register, AVX2 in two (elements 0-7 and 8-15 of each step);
 *   adding the two 256-bit halves gives t, so every path produces the same bits. The transposed-key
 *   form (dot_kt_q4) holds lane l of 16 keys in one register and does the tree's adds vertically.
 * axpy: y[i] = fmaf(a, x[i], y[i]) — elementwise, so any vector width gives the same bits.
 * exp (softmax): see kvt_kv_exp_sum. */
static inline float lane_reduce(const float *t) {
    return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

float kvt_kv_dot_scalar(const float *a, const float *b, uint32_t n) {
    float acc[16] = {0};
    uint32_t n16 = n & ~15u, i;
    for (i = 0; i < n16; i += 16)
        for (uint32_t l = 0; l < 16; l++) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
    float s = lane_reduce(t);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

void kvt_kv_axpy_scalar(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

void kvt_kv_dot_rows_scalar(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                            float *out) {
    for (uint32_t r = 0; r < n_rows; r++) out[r] = kvt_kv_dot_scalar(q, k + r * stride, n) * scale;
}

void kvt_kv_axpy_rows_scalar(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
    for (uint32_t r = 0; r < n_rows; r++) kvt_kv_axpy_scalar(y, w[r], x + r * stride, n);
}

/* exp for softmax arguments (x <= 0 in use, but any x works): Cephes-style range reduction
 * x = k·ln2 + r with k = rint(x·log2e), r = fma(-k, C1, x), r = fma(-k, C2, r); a degree-5 Horner
 * polynomial in fmaf; e^r = fma(p, r·r, r) + 1; times 2^k built from the exponent bits. x < -87
 * gives exactly 0 (masked keys: -inf), NaN stays NaN, x > 88 is clamped. The AVX-512 version
 * performs the same operations per lane. Relative error ~2 ulp. */
#define EXP_LO (-87.0f)
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

static inline float exp_scalar(float x) {
    if (x != x) return x;
    if (x < EXP_LO) return 0.0f;
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

float kvt_kv_exp(float x) { return exp_scalar(x); }

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum in the dot's order (16 lanes, lane tree,
 * tail in order). */
float kvt_kv_exp_sum_scalar(float *sc, uint32_t n, float m) {
    float acc[16] = {0};
    uint32_t n16 = n & ~15u, j;
    for (j = 0; j < n16; j += 16)
        for (uint32_t l = 0; l < 16; l++) {
            sc[j + l] = exp_scalar(sc[j + l] - m);
            acc[l] += sc[j + l];
        }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
    float s = lane_reduce(t);
    for (; j < n; j++) {
        sc[j] = exp_scalar(sc[j] - m);
        s += sc[j];
    }
    return s;
}

#ifdef KVT_X86
/* ---- AVX2 + FMA (16 lanes in two registers) */
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, uint32_t n) {
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

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float a, const float *x, uint32_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* y kept in registers 32 floats at a time while the rows stream past. */
__attribute__((target("avx2,fma"))) static void axpy_rows_avx2(float *y, const float *w, const float *x,
                                                              size_t stride, uint32_t n_rows, uint32_t n) {
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);
        __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);
        for (uint32_t r = 0; r < n_rows; r++) {
            const float *xr = x + r * stride + i;
            const __m256 a = _mm256_set1_ps(w[r]);
            y0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(xr), y0);
            y1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(xr + 8), y1);
            y2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(xr + 16), y2);
            y3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(xr + 24), y3);
        }
        _mm256_storeu_ps(y + i, y0), _mm256_storeu_ps(y + i + 8, y1);
        _mm256_storeu_ps(y + i + 16, y2), _mm256_storeu_ps(y + i + 24, y3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 y0 = _mm256_loadu_ps(y + i);
        for (uint32_t r = 0; r < n_rows; r++)
            y0 = _mm256_fmadd_ps(_mm256_set1_ps(w[r]), _mm256_loadu_ps(x + r * stride + i), y0);
        _mm256_storeu_ps(y + i, y0);
    }
    for (; i < n; i++) {
        float yi = y[i];
        for (uint32_t r = 0; r < n_rows; r++) yi = fmaf(w[r], x[r * stride + i], yi);
        y[i] = yi;
    }
}

/* ---- AVX-512F */
/* acc[r] holds row r's 8 values t0..t7 (after adding the 256-bit halves). Result lane r is
 * ((t0+t4)+(t1+t5)) + ((t2+t6)+(t3+t7)) of acc[r]: the 128-bit halves are added, then two rounds
 * of hadd (IEEE addition is commutative, so hadd's operand order does not matter). */
__attribute__((target("avx512f,avx2,fma"))) static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2,
                                                                          __m256 a3, __m256 a4, __m256 a5,
                                                                          __m256 a6, __m256 a7) {
    const __m256 u0 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a4, 0x20), _mm256_permute2f128_ps(a0, a4, 0x31));
    const __m256 u1 = _mm256_add_ps(_mm256_permute2f128_ps(a1, a5, 0x20), _mm256_permute2f128_ps(a1, a5, 0x31));
    const __m256 u2 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a6, 0x20), _mm256_permute2f128_ps(a2, a6, 0x31));
    const __m256 u3 = _mm256_add_ps(_mm256_permute2f128_ps(a3, a7, 0x20), _mm256_permute2f128_ps(a3, a7, 0x31));
    return _mm256_hadd_ps(_mm256_hadd_ps(u0, u1), _mm256_hadd_ps(u2, u3));
}

__attribute__((target("avx512f,avx2,fma"))) static inline __m256 half_sum(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

__attribute__((target("avx512f,avx2,fma"))) static float dot_avx512(const float *a, const float *b, uint32_t n) {
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
__attribute__((target("avx512f,avx2,fma"))) static void dot_rows_avx512(const float *q, const float *k,
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
__attribute__((target("avx512f,avx2,fma"))) static void dot_q4_avx512(const float *const *q, const float *k,
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

__attribute__((target("avx512f,avx2,fma"))) static void dot_kt_q4_avx512(const float *const *q, const float *kt,
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
__attribute__((target("avx512f,avx2,fma"))) static void transpose_rows_avx512(const float *k, size_t stride,
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

__attribute__((target("avx512f,avx2,fma"))) static void axpy_avx512(float *y, float a, const float *x, uint32_t n) {
    const __m512 va = _mm512_set1_ps(a);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

__attribute__((target("avx512f,avx2,fma"))) static void axpy_rows_avx512(float *y, const float *w, const float *x,
                                                                        size_t stride, uint32_t n_rows, uint32_t n) {
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);
        __m512 y2 = _mm512_loadu_ps(y + i + 32), y3 = _mm512_loadu_ps(y + i + 48);
        for (uint32_t r = 0; r < n_rows; r++) {
            const float *xr = x + r * stride + i;
            const __m512 a = _mm512_set1_ps(w[r]);
            y0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(xr), y0);
            y1 = _mm512_fmadd_ps(a, _mm512_loadu_ps(xr + 16), y1);
            y2 = _mm512_fmadd_ps(a, _mm512_loadu_ps(xr + 32), y2);
            y3 = _mm512_fmadd_ps(a, _mm512_loadu_ps(xr + 48), y3);
        }
        _mm512_storeu_ps(y + i, y0), _mm512_storeu_ps(y + i + 16, y1);
        _mm512_storeu_ps(y + i + 32, y2), _mm512_storeu_ps(y + i + 48, y3);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 y0 = _mm512_loadu_ps(y + i);
        for (uint32_t r = 0; r < n_rows; r++)
            y0 = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), _mm512_loadu_ps(x + r * stride + i), y0);
        _mm512_storeu_ps(y + i, y0);
    }
    for (; i < n; i++) {
        float yi = y[i];
        for (uint32_t r = 0; r < n_rows; r++) yi = fmaf(w[r], x[r * stride + i], yi);
        y[i] = yi;
    }
}

/* Four outputs share each streamed row: y[qi] += w[qi][r] * x_r for r ascending. n % 16 == 0. */
__attribute__((target("avx512f,avx2,fma"))) static void axpy_q4_avx512(float *const *y, const float *const *w,
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

/* Same values as exp_scalar per lane, and the same 16-lane sum, in fewer operations:
 * - lanes below EXP_LO are zeroed by the final masked scalef, so x is only clamped above (their
 *   garbage, even NaN, never survives); NaN lanes are set back to x0 as in the scalar code;
 * - r = fnmadd(k, C1, x) is fma(-k, C1, x): negation is exact, so one rounding of the same value;
 * - y * 2^k by scalef, one rounding of the same exact product as the multiply by the 2^k built
 *   from exponent bits (k is in [-126, 127] for x in [EXP_LO, EXP_HI], so 2^k is a normal float). */
__attribute__((target("avx512f,avx2,fma"))) static float exp_sum_avx512(float *sc, uint32_t n, float m) {
    const __m512 vm = _mm512_set1_ps(m), lo = _mm512_set1_ps(EXP_LO), hi = _mm512_set1_ps(EXP_HI);
    __m512 acc = _mm512_setzero_ps();
    uint32_t n16 = n & ~15u, j;
    for (j = 0; j < n16; j += 16) {
        const __m512 x0 = _mm512_sub_ps(_mm512_loadu_ps(sc + j), vm);
        const __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q);
        const __mmask16 keep = _mm512_cmp_ps_mask(x0, lo, _CMP_NLT_UQ); /* not (x0 < lo): NaNs kept */
        const __m512 x = _mm512_min_ps(x0, hi);
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(EXP_C1), x);
        r = _mm512_fnmadd_ps(k, _mm512_set1_ps(EXP_C2), r);
        __m512 p = _mm512_set1_ps(EXP_P0);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
        const __m512 y0 = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
        __m512 y = _mm512_maskz_scalef_ps(keep, y0, k);
        y = _mm512_mask_mov_ps(y, nan, x0);
        _mm512_storeu_ps(sc + j, y);
        acc = _mm512_add_ps(acc, y);
    }
    float t[8];
    _mm256_storeu_ps(t, half_sum(acc));
    float s = lane_reduce(t);
    for (; j < n; j++) {
        sc[j] = exp_scalar(sc[j] - m);
        s += sc[j];
    }
    return s;
}
#endif

float kvt_kv_dot(const float *a, const float *b, uint32_t n) {
#ifdef KVT_X86
    if (g_simd == 2) return dot_avx512(a, b, n);
    if (g_simd == 1) return dot_avx2(a, b, n);
#endif
    return kvt_kv_dot_scalar(a, b, n);
}

void kvt_kv_axpy(float *y, float a, const float *x, uint32_t n) {
#ifdef KVT_X86
    if (g_simd == 2) return axpy_avx512(y, a, x, n);
    if (g_simd == 1) return axpy_avx2(y, a, x, n);
#endif
    kvt_kv_axpy_scalar(y, a, x, n);
}

void kvt_kv_dot_rows(const float *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                     float *out) {
#ifdef KVT_X86
    if (g_simd == 2 && n % 16 == 0) {
        dot_rows_avx512(q, k, stride, n_rows, n, scale, out);
        return;
    }
#endif
    for (uint32_t r = 0; r < n_rows; r++) out[r] = kvt_kv_dot(q, k + r * stride, n) * scale;
}

void kvt_kv_axpy_rows(float *y, const float *w, const float *x, size_t stride, uint32_t n_rows, uint32_t n) {
#ifdef KVT_X86
    if (g_simd == 2) return axpy_rows_avx512(y, w, x, stride, n_rows, n);
    if (g_simd == 1) return axpy_rows_avx2(y, w, x, stride, n_rows, n);
#endif
    kvt_kv_axpy_rows_scalar(y, w, x, stride, n_rows, n);
}

void kvt_kv_dot_q4(const float *const *q, const float *k, size_t stride, uint32_t n_rows, uint32_t n, float scale,
                   float *const *out) {
#ifdef KVT_X86
    if (g_simd == 2 && n % 16 == 0) {
        dot_q4_avx512(q, k, stride, n_rows, n, scale, out);
        return;
    }
#endif
    for (int j = 0; j < 4; j++) kvt_kv_dot_rows(q[j], k, stride, n_rows, n, scale, out[j]);
}

void kvt_kv_transpose_rows_scalar(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
    const uint32_t np = (n_rows + 15) & ~15u;
    for (uint32_t d = 0; d < n; d++)
        for (uint32_t r = 0; r < np; r++) kt[(size_t)d * ldk + r] = r < n_rows ? k[(size_t)r * stride + d] : 0.0f;
}

void kvt_kv_transpose_rows(const float *k, size_t stride, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
#ifdef KVT_X86
    if (g_simd == 2 && n % 16 == 0 && ldk % 16 == 0) {
        transpose_rows_avx512(k, stride, n_rows, n, kt, ldk);
        return;
    }
#endif
    kvt_kv_transpose_rows_scalar(k, stride, n_rows, n, kt, ldk);
}

void kvt_kv_transpose_f16_rows_scalar(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt,
                                      size_t ldk) {
    const uint32_t np = (n_rows + 15) & ~15u;
    for (uint32_t d = 0; d < n; d++)
        for (uint32_t r = 0; r < np; r++) {
            uint16_t h = 0;
            if (r < n_rows) memcpy(&h, src + (size_t)r * rb + 2 * (size_t)d, 2);
            kt[(size_t)d * ldk + r] = r < n_rows ? kvt_f16_to_f32_fast(h) : 0.0f;
        }
}

void kvt_kv_transpose_f16_rows(const uint8_t *src, size_t rb, uint32_t n_rows, uint32_t n, float *kt, size_t ldk) {
#ifdef KVT_X86
    if (g_simd == 2 && g_has_avx2 && n % 16 == 0 && ldk % 16 == 0) {
        transpose_f16_rows_avx512(src, rb, n_rows, n, kt, ldk);
        return;
    }
#endif
    kvt_kv_transpose_f16_rows_scalar(src, rb, n_rows, n, kt, ldk);
}

/* The scalar twin reads key r back out of kt into a row and calls the scalar dot (a row longer than
 * the stack buffer goes to the heap; without memory the scores are NaN, never a crash). */
void kvt_kv_dot_kt_q4_scalar(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n,
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
        for (int j = 0; j < 4; j++) out[j][r] = kvt_kv_dot_scalar(q[j], row, n) * scale;
    }
    if (row != stack_row) free(row);
}

void kvt_kv_dot_kt_q4(const float *const *q, const float *kt, size_t ldk, uint32_t n_keys, uint32_t n, float scale,
                      float *const *out) {
#ifdef KVT_X86
    if (g_simd == 2 && n % 16 == 0 && ldk % 16 == 0) {
        dot_kt_q4_avx512(q, kt, ldk, n_keys, n, scale, out);
        return;
    }
#endif
    kvt_kv_dot_kt_q4_scalar(q, kt, ldk, n_keys, n, scale, out);
}

void kvt_kv_axpy_q4(float *const *y, const float *const *w, const float *x, size_t stride, uint32_t n_rows,
                    uint32_t n) {
#ifdef KVT_X86
    if (g_simd == 2 && n % 16 == 0) {
        axpy_q4_avx512(y, w, x, stride, n_rows, n);
        return;
    }
#endif
    for (int j = 0; j < 4; j++) kvt_kv_axpy_rows(y[j], w[j], x, stride, n_rows, n);
}

/* ---- f16 rounding of attention operands (see attention.c): dst[i] = f16(src[i] * mul) widened back
 * to f32, round to nearest even. The F16C conversion rounds the same way, so both give the same bits
 * for every non-NaN input. */
void kvt_kv_round_f16_scalar(const float *src, float *dst, uint32_t n, float mul) {
    for (uint32_t i = 0; i < n; i++) dst[i] = kvt_f16_to_f32_fast(kvt_f32_to_f16(src[i] * mul));
}

#ifdef KVT_X86
__attribute__((target("f16c,avx2"))) static void round_f16_f16c(const float *src, float *dst, uint32_t n, float mul) {
    const __m256 vm = _mm256_set1_ps(mul);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), vm), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = kvt_f16_to_f32_fast(kvt_f32_to_f16(src[i] * mul));
}
#endif

#ifdef KVT_X86
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
#endif

void kvt_kv_round_f16(const float *src, float *dst, uint32_t n, float mul) {
#ifdef KVT_X86
    if (g_simd == 2) {
        round_f16_avx512(src, dst, n, mul);
        return;
    }
    if (g_simd >= 1) {
        round_f16_f16c(src, dst, n, mul);
        return;
    }
#endif
    kvt_kv_round_f16_scalar(src, dst, n, mul);
}

float kvt_kv_exp_sum(float *sc, uint32_t n, float m) {
#ifdef KVT_X86
    if (g_simd == 2) return exp_sum_avx512(sc, n, m);
#endif
    return kvt_kv_exp_sum_scalar(sc, n, m);
}
