/*
 * codec.c — row codecs for K/V: f16, bf16 and MLX affine (kv-codecs.md §1.2–1.4). The f32 vector
 * math attention runs on (dot, axpy, exp, f16 rounding) is in kernels/vec.c.
 *
 * Numerics: all affine math is fp32 with rintf (ties to even); scale/bias are rounded to f16 (or
 * bf16) for storage and decode computes scale*q + bias in fp32. Floating-point contraction is off
 * (gcc in -std=c11 mode does not contract; clang is told below) so the SIMD paths and their scalar
 * references produce the same bits.
 *
 * Affine row layout: D*bits/32 little-endian u32 words (LSB-first bit stream, element j at bits
 * [j*bits, j*bits+bits)), then D/G scales (u16), then D/G biases (u16).
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_int.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVT_X86 1
#endif

/* ------------------------------------------------------------------ cpu features */
/* The SIMD level is the f32 vector table's (kernels/vec.h: the kernels' ISA, CPUID or KVT_ISA):
 * this file detects nothing itself. Row decoders take their AVX2/F16C forms from level 1 on. */
static bool g_has_vbmi; /* AVX-512 VBMI (8-bit TURBO codebook lookup; used at level 2) */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_detect(void) {
    kvt_f16_table_init();
    kvt_turbo_init();
    kvt_kernels_init(); /* selects the vector table */
    g_has_vbmi = kvt_kernels_has_vbmi();
}

void kvt_kv_cpu_init(void) { pthread_once(&g_cpu_once, cpu_detect); }
int kvt_kv_turbo_level(void) {
    kvt_kv_cpu_init();
    const int level = kvt_vec_level();
    return level == 0 ? KVT_TURBO_SCALAR : level == 2 && g_has_vbmi ? KVT_TURBO_VBMI : KVT_TURBO_AVX2;
}
/* What the CPU has (the SIMD paths exist to be tested), whatever KVT_ISA selected. */
bool kvt_kv_cpu_has_avx2(void) { return kvt_kernels_best_isa() >= KVT_ISA_AVX2; }

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

/* Groups [g0, g1) of an affine row of dim elements: group g's values go to dst + (g - g0)*G (each
 * group decodes from its own codes, scale and bias, so any group range gives the full decode's bits). */
static void affine_decode_groups(kvt_codec c, const uint8_t *src, uint32_t dim, uint32_t g0, uint32_t g1, float *dst) {
    const uint32_t b = c.bits, G = c.group_size, n_groups = dim / G;
    const uint8_t *sc = src + (size_t)dim * b / 8, *bi = sc + 2 * (size_t)n_groups;
    for (uint32_t g = g0; g < g1; g++) {
        uint16_t hs, hb;
        memcpy(&hs, sc + 2 * (size_t)g, 2);
        memcpy(&hb, bi + 2 * (size_t)g, 2);
        const float s = load_scale(hs, c.scale_bf16), bias = load_scale(hb, c.scale_bf16);
        float *o = dst + (size_t)(g - g0) * G;
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
                                                              uint32_t g0, uint32_t g1, float *dst) {
    const uint32_t b = c.bits, G = c.group_size, n_groups = dim / G;
    const uint8_t *sc = src + (size_t)dim * b / 8, *bi = sc + 2 * (size_t)n_groups;
    const __m256i lo4 = _mm256_set1_epi32(15);
    for (uint32_t g = g0; g < g1; g++) {
        uint16_t hs, hb;
        memcpy(&hs, sc + 2 * (size_t)g, 2);
        memcpy(&hb, bi + 2 * (size_t)g, 2);
        const __m256 vs = _mm256_set1_ps(load_scale(hs, c.scale_bf16)), vb = _mm256_set1_ps(load_scale(hb, c.scale_bf16));
        float *o = dst + (size_t)(g - g0) * G;
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
    /* Attention decodes whole chunks of K/V rows straight from DRAM at long context: fetching 4 KiB
     * ahead (one line per 32 values) took smol-135m f16 decode at depth 16k from 18.4 to 20.2 tok/s
     * on an AVX2 Zen 3 (2 KiB 19.7, 8 KiB 19.2, 16 KiB 18.9; bench/splitk_decode). A prefetch past
     * the rows is harmless. */
    for (; i + 32 <= dim; i += 32) {
        _mm_prefetch((const char *)(src + 2 * (size_t)i + 4096), _MM_HINT_T0);
        for (uint32_t k = 0; k < 32; k += 8)
            _mm256_storeu_ps(dst + i + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * (size_t)(i + k)))));
    }
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
/* Rows of w halves (row r at src + r*rb) into dst (row r at dst + r*w): one call for a chunk of
 * rows, so a decode of a few columns per row does not pay a dispatch per row. */
__attribute__((target("f16c,avx2,fma"))) static void f16_decode_rows_f16c(const uint8_t *src, size_t rb, uint32_t w,
                                                                          uint32_t n, float *dst) {
    for (uint32_t r = 0; r < n; r++) f16_decode_f16c(src + r * rb, w, dst + (size_t)r * w);
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
        if (kvt_vec_level() >= 1) {
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
    case KVT_CODEC_AFFINE: affine_decode_groups(c, src, dim, 0, dim / c.group_size, dst); return;
    case KVT_CODEC_TURBO: kvt_turbo_decode_row_scalar(c.bits, src, dim, dst); return;
    }
}

/* Hot path: caller has run kvt_kv_cpu_init(). */
void kvt_decode_row_fast(kvt_codec c, const uint8_t *src, uint32_t dim, float *dst) {
    switch (c.kind) {
    case KVT_CODEC_F16:
#ifdef KVT_X86
        if (kvt_vec_level() >= 1) {
            f16_decode_f16c(src, dim, dst);
            return;
        }
#endif
        f16_decode_table(src, dim, dst);
        return;
    case KVT_CODEC_BF16:
#ifdef KVT_X86
        if (kvt_vec_level() >= 1) {
            bf16_decode_avx2(src, dim, dst);
            return;
        }
#endif
        bf16_decode(src, dim, dst);
        return;
    case KVT_CODEC_AFFINE:
#ifdef KVT_X86
        if (kvt_vec_level() >= 1 && (c.bits == 8 || c.bits == 4)) {
            affine_decode_avx2(c, src, dim, 0, dim / c.group_size, dst);
            return;
        }
#endif
        affine_decode_groups(c, src, dim, 0, dim / c.group_size, dst);
        return;
    case KVT_CODEC_TURBO: kvt_turbo_decode_row(c.bits, src, dim, dst, kvt_kv_turbo_level()); return;
    }
}

void kvt_decode_rows_part(kvt_codec c, const uint8_t *src, size_t rb, uint32_t dim, uint32_t d0, uint32_t w, uint32_t n,
                          float *dst) {
    switch (c.kind) {
    case KVT_CODEC_F16:
#ifdef KVT_X86
        if (kvt_vec_level() >= 1) {
            f16_decode_rows_f16c(src + 2 * (size_t)d0, rb, w, n, dst);
            return;
        }
#endif
        for (uint32_t r = 0; r < n; r++) f16_decode_table(src + r * rb + 2 * (size_t)d0, w, dst + (size_t)r * w);
        return;
    case KVT_CODEC_BF16:
#ifdef KVT_X86
        if (kvt_vec_level() >= 1) {
            for (uint32_t r = 0; r < n; r++) bf16_decode_avx2(src + r * rb + 2 * (size_t)d0, w, dst + (size_t)r * w);
            return;
        }
#endif
        for (uint32_t r = 0; r < n; r++) bf16_decode(src + r * rb + 2 * (size_t)d0, w, dst + (size_t)r * w);
        return;
    case KVT_CODEC_AFFINE: {
        const uint32_t g0 = d0 / c.group_size, g1 = (d0 + w) / c.group_size;
#ifdef KVT_X86
        if (kvt_vec_level() >= 1 && (c.bits == 8 || c.bits == 4)) {
            for (uint32_t r = 0; r < n; r++) affine_decode_avx2(c, src + r * rb, dim, g0, g1, dst + (size_t)r * w);
            return;
        }
#endif
        for (uint32_t r = 0; r < n; r++) affine_decode_groups(c, src + r * rb, dim, g0, g1, dst + (size_t)r * w);
        return;
    }
    case KVT_CODEC_TURBO: break; /* whole rows only (kvt_decode_row_fast) */
    }
    assert(!"kvt_decode_rows_part: TURBO rows decode whole");
}

void kvt_codec_decode_row(kvt_codec c, const void *src, uint32_t dim, float *dst) {
    kvt_kv_cpu_init();
    if ((c.kind == KVT_CODEC_AFFINE || c.kind == KVT_CODEC_TURBO) && !kvt_codec_row_bytes(c, dim)) {
        memset(dst, 0, (size_t)dim * sizeof(float));
        return;
    }
    kvt_decode_row_fast(c, src, dim, dst);
}
