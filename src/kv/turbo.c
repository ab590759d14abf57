/*
 * turbo.c — the TurboQuant_mse row codec (kv-codecs.md §3.2, §3.9): per-vector norm, a seeded
 * randomized Walsh–Hadamard rotation per (layer, K/V, kv head), and a fixed Lloyd–Max codebook for
 * the Gaussian limit of the rotated coordinates.
 *
 * Split of work between this file and its callers
 * -----------------------------------------------
 * - The rotation Π = (1/√d)·H_d·diag(σ) is applied OUTSIDE the row codec: kvt_seq_write_kv rotates
 *   a K/V head vector with kvt_turbo_rotate before kvt_codec_encode_row, and attention rotates the
 *   query once per head (scores are rotation invariant: <Πq, Πk> = <q, k>) and un-rotates the
 *   value accumulator once per head (Π^T Σ p_t Πv_t = Σ p_t v_t). A TURBO row therefore encodes
 *   and decodes a vector IN THE ROTATED BASIS; kvt_codec_decode_row returns ŷ = s·c[idx].
 * - σ (d random signs) is a pure function of (KVT_TURBO_SEED, layer, kv, head): nothing is stored.
 *   The seed is part of the scheme key (layout.c), so a different seed can never alias cached KV.
 *
 * Row layout (d = head_dim, a power of two in [8, 1024], b = bits of this side):
 *   d*b/8 bytes of codes, LSB-first bit stream (element j at bits [j*b, j*b+b), the affine rule of
 *   kv-codecs.md §1.4), then one little-endian f32 s = ||x|| / √d. Decode: ŷ_j = s · c_b[idx_j] where
 *   c_b are the N(0,1) Lloyd–Max centroids (coordinates of a rotated unit vector are ≈ N(0, 1/d)).
 *
 * Codebooks: computed once (pthread_once) by Lloyd iteration on N(0,1) with the closed-form
 * conditional mean c_i = (φ(t_{i-1}) − φ(t_i)) / (Φ(t_i) − Φ(t_{i-1})), in double, then rounded to
 * f32. Encode is a binary search over the midpoints (b comparisons per coordinate).
 *
 * Numerics: no contraction (see codec.c); the AVX2 decode computes the same s*c product per lane, so
 * it is bit-identical to the scalar decode (test_kv_turbo).
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
#include <immintrin.h>
#define KVT_X86 1
#endif

#define TQ_MAX_BITS 8

static float g_cb[TQ_MAX_BITS + 1][1u << TQ_MAX_BITS];     /* centroids, ascending */
static float g_thr[TQ_MAX_BITS + 1][(1u << TQ_MAX_BITS) - 1]; /* midpoints between neighbours */
static pthread_once_t g_cb_once = PTHREAD_ONCE_INIT;
/* The 8-bit codebook as 4 byte planes: g_cb8_planes[p][i] = byte p (little-endian) of the IEEE bits
 * of g_cb[8][i], for the AVX-512 VBMI byte-permute lookup (turbo_decode8_vbmi). */
static _Alignas(64) uint8_t g_cb8_planes[4][256];
/* g_cb8_sym: the 8-bit codebook is exactly antisymmetric, cb[255 - i] == -cb[i] bit for bit (the
 * Lloyd–Max centroids of N(0,1) are; checked at init, not assumed), so the VBMI lookup needs only
 * the 128 entries of the lower half. g_cb8_use_sym: whether it uses that (test hook below). */
static bool g_cb8_sym, g_cb8_use_sym;

static double norm_pdf(double t) { return isinf(t) ? 0.0 : exp(-0.5 * t * t) / sqrt(2.0 * M_PI); }
/* Φ(b) − Φ(a) for a < b, accurate in both tails (differences of upper or lower tails). */
static double norm_mass(double a, double b) {
    if (a >= 0) return 0.5 * (erfc(a / M_SQRT2) - erfc(b / M_SQRT2));
    if (b <= 0) return 0.5 * (erfc(-b / M_SQRT2) - erfc(-a / M_SQRT2));
    return 1.0 - 0.5 * erfc(-a / M_SQRT2) - 0.5 * erfc(b / M_SQRT2);
}

/* Φ^{-1}(p) by bisection on Φ (only used to seed the iteration). */
static double norm_quantile(double p) {
    double lo = -40, hi = 40;
    for (int i = 0; i < 200; i++) {
        const double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / M_SQRT2) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Lloyd map g_i(c) = E[Y | t_{i-1} < Y <= t_i] (t = midpoints) into g; with jac, also the three
 * non-zero entries of row i of its Jacobian: d/dc_{i-1}, d/dc_i, d/dc_{i+1}. Uses
 * dμ/da = φ(a)(μ - a)/M and dμ/db = φ(b)(b - μ)/M for μ(a, b) = (φ(a) - φ(b))/M, M = Φ(b) - Φ(a). */
static void lloyd_map(const double *c, uint32_t n, double *g, double (*jac)[3]) {
    for (uint32_t i = 0; i < n; i++) {
        const double a = i ? 0.5 * (c[i - 1] + c[i]) : -INFINITY, b = i + 1 < n ? 0.5 * (c[i] + c[i + 1]) : INFINITY;
        const double m = norm_mass(a, b), pa = norm_pdf(a), pb = norm_pdf(b);
        const double mu = m > 0 ? (pa - pb) / m : c[i];
        g[i] = mu;
        if (!jac) continue;
        const double da = m > 0 && i ? pa * (mu - a) / m : 0, db = m > 0 && i + 1 < n ? pb * (b - mu) / m : 0;
        jac[i][0] = 0.5 * da, jac[i][1] = 0.5 * (da + db), jac[i][2] = 0.5 * db;
    }
}

void kvt_turbo_lloyd_max(uint32_t bits, double *c) {
    const uint32_t n = 1u << bits;
    double g[1u << TQ_MAX_BITS], jac[1u << TQ_MAX_BITS][3], cp[1u << TQ_MAX_BITS], dp[1u << TQ_MAX_BITS];
    /* Start at the quantiles of N(0, 3) (the asymptotically optimal point density is ∝ pdf^(1/3)),
     * take plain Lloyd steps, then Newton steps on F(c) = c - g(c) = 0 (a tridiagonal system, solved
     * by the Thomas algorithm): plain Lloyd needs ~10^5 iterations at 8 bits, Newton a handful. The
     * fixed point is unique for the (log-concave) Gaussian, so this is the Lloyd–Max quantizer. */
    for (uint32_t i = 0; i < n; i++) c[i] = sqrt(3.0) * norm_quantile((i + 0.5) / n);
    for (int it = 0; it < 64; it++) {
        lloyd_map(c, n, g, NULL);
        memcpy(c, g, n * sizeof(double));
    }
    for (int it = 0; it < 100; it++) {
        lloyd_map(c, n, g, jac);
        /* (I - J) Δ = g - c, rows: -J[i][0] Δ_{i-1} + (1 - J[i][1]) Δ_i - J[i][2] Δ_{i+1} */
        double delta = 0;
        for (uint32_t i = 0; i < n; i++) {
            const double lo = i ? -jac[i][0] : 0, di = 1.0 - jac[i][1], up = -jac[i][2], r = g[i] - c[i];
            const double den = di - (i ? lo * cp[i - 1] : 0);
            cp[i] = up / den;
            dp[i] = (r - (i ? lo * dp[i - 1] : 0)) / den;
        }
        for (uint32_t i = n; i-- > 0;) {
            if (i + 1 < n) dp[i] -= cp[i] * dp[i + 1];
            delta = fmax(delta, fabs(dp[i]));
        }
        /* keep the centroids strictly increasing (halve the step if needed) */
        double step = 1.0;
        for (int k = 0; k < 30; k++) {
            bool mono = true;
            for (uint32_t i = 1; i < n && mono; i++) mono = c[i - 1] + step * dp[i - 1] < c[i] + step * dp[i];
            if (mono) break;
            step *= 0.5;
        }
        for (uint32_t i = 0; i < n; i++) c[i] += step * dp[i];
        if (delta < 1e-14) break;
    }
}

static void codebook_init(void) {
    double c[1u << TQ_MAX_BITS];
    for (uint32_t b = 1; b <= TQ_MAX_BITS; b++) {
        const uint32_t n = 1u << b;
        kvt_turbo_lloyd_max(b, c);
        for (uint32_t i = 0; i < n; i++) g_cb[b][i] = (float)c[i];
        for (uint32_t i = 0; i + 1 < n; i++) g_thr[b][i] = (float)(0.5 * (c[i] + c[i + 1]));
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t u;
        memcpy(&u, &g_cb[8][i], 4);
        for (uint32_t p = 0; p < 4; p++) g_cb8_planes[p][i] = (uint8_t)(u >> (8 * p));
    }
    g_cb8_sym = g_cb[8][127] < 0; /* the lower half negative (ascending, so up to entry 127) */
    for (uint32_t i = 0; i < 256; i++) {
        const float neg = -g_cb[8][255 - i];
        g_cb8_sym = g_cb8_sym && memcmp(&neg, &g_cb[8][i], 4) == 0;
    }
    g_cb8_use_sym = g_cb8_sym;
}

bool kvt_turbo_test_vbmi8_sym(bool on) {
    pthread_once(&g_cb_once, codebook_init);
    const bool was = g_cb8_use_sym;
    g_cb8_use_sym = on && g_cb8_sym;
    return was;
}

const float *kvt_turbo_codebook(uint32_t bits) {
    if (bits < 1 || bits > TQ_MAX_BITS) return NULL;
    pthread_once(&g_cb_once, codebook_init);
    return g_cb[bits];
}

bool kvt_turbo_bits_ok(uint32_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 8; }
bool kvt_turbo_key_bits_ok(uint32_t b) { return b == 2 || b == 4 || b == 5 || b == 8; }
bool kvt_turbo_dim_ok(uint32_t d) { return d >= 8 && d <= KVT_TURBO_MAX_DIM && (d & (d - 1)) == 0; }

kvt_status kvt_turbo_parse(const char *s, kvt_codec *out, char *err, size_t errlen) {
    unsigned kb = 8, vb = 3;
    if (!s || strncmp(s, "turbo", 5) != 0) goto bad;
    if (s[5] == ':') {
        char tail;
        if (sscanf(s + 6, "k%uv%u%c", &kb, &vb, &tail) != 2) goto bad;
    } else if (s[5] != 0) {
        goto bad;
    }
    if (!kvt_turbo_key_bits_ok(kb) || !kvt_turbo_bits_ok(vb))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "turbo: key bits %u / value bits %u unsupported (keys 2,4,5,8; values 2,3,4,5,8)", kb, vb);
    *out = (kvt_codec){.kind = KVT_CODEC_TURBO, .bits = (uint8_t)kb, .vbits = (uint8_t)vb};
    return KVT_OK;
bad:
    return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "expected turbo or turbo:k<bits>v<bits> (got '%s')", s ? s : "");
}

/* ------------------------------------------------------------------ rotation */
static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sign word w (64 signs, bit i set = negate element 64w+i) of the rotation of (layer, kv, head). */
static uint64_t sign_word(uint32_t layer, int kv, uint32_t head, uint32_t w) {
    return mix64(KVT_TURBO_SEED ^ mix64(((uint64_t)layer << 32) ^ ((uint64_t)(kv ? 1 : 0) << 31) ^
                                        ((uint64_t)head << 12) ^ w));
}

/* In-place unnormalised fast Walsh–Hadamard transform (Sylvester order), d a power of two. */
static void fwht(float *x, uint32_t d) {
    for (uint32_t h = 1; h < d; h <<= 1)
        for (uint32_t i = 0; i < d; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void kvt_turbo_rotate(uint32_t layer, int kv, uint32_t head, const float *x, uint32_t d, float *out) {
    const float inv = 1.0f / sqrtf((float)d);
    for (uint32_t w = 0; w * 64 < d; w++) {
        const uint64_t s = sign_word(layer, kv, head, w);
        for (uint32_t i = w * 64; i < d && i < w * 64 + 64; i++) out[i] = (s >> (i - w * 64)) & 1 ? -x[i] : x[i];
    }
    fwht(out, d);
    for (uint32_t i = 0; i < d; i++) out[i] *= inv;
}

void kvt_turbo_unrotate(uint32_t layer, int kv, uint32_t head, const float *y, uint32_t d, float *out) {
    const float inv = 1.0f / sqrtf((float)d);
    if (out != y) memcpy(out, y, (size_t)d * sizeof(float));
    fwht(out, d);
    for (uint32_t w = 0; w * 64 < d; w++) {
        const uint64_t s = sign_word(layer, kv, head, w);
        for (uint32_t i = w * 64; i < d && i < w * 64 + 64; i++) {
            const float v = out[i] * inv;
            out[i] = (s >> (i - w * 64)) & 1 ? -v : v;
        }
    }
}

/* ------------------------------------------------------------------ row codec (rotated basis) */
size_t kvt_turbo_row_bytes(uint32_t bits, uint32_t d) { return (size_t)d * bits / 8 + 4; }

void kvt_turbo_encode_row(uint32_t bits, const float *y, uint32_t d, uint8_t *dst) {
    pthread_once(&g_cb_once, codebook_init);
    const size_t code_bytes = (size_t)d * bits / 8;
    double ss = 0;
    for (uint32_t i = 0; i < d; i++) ss += (double)y[i] * y[i];
    const float norm = (float)sqrt(ss);
    const float s = norm / sqrtf((float)d);
    memset(dst, 0, code_bytes);
    /* NaN/inf or zero norm: all codes 0 with s = 0 decodes to zeros (never divide by zero) */
    const bool ok = s > 0 && isfinite(s);
    const float inv = ok ? 1.0f / s : 0.0f;
    const float *thr = g_thr[bits];
    const uint32_t n = 1u << bits;
    for (uint32_t j = 0; ok && j < d; j++) {
        const float u = y[j] * inv; /* ≈ N(0, 1) */
        uint32_t lo = 0, hi = n - 1;  /* smallest idx with u <= thr[idx] (or n-1) */
        while (lo < hi) {
            const uint32_t mid = (lo + hi) / 2;
            if (u > thr[mid]) lo = mid + 1;
            else hi = mid;
        }
        const uint64_t bitpos = (uint64_t)j * bits;
        const uint32_t byte = (uint32_t)(bitpos >> 3), off = (uint32_t)(bitpos & 7);
        const uint32_t v = lo << off;
        for (uint32_t k = 0; v >> (8 * k) && k < 2; k++) dst[byte + k] |= (uint8_t)(v >> (8 * k));
    }
    const float sv = ok ? s : 0.0f;
    memcpy(dst + code_bytes, &sv, 4);
}

static inline uint32_t tq_code(const uint8_t *p, uint32_t j, uint32_t b) {
    const uint32_t bitpos = j * b, byte = bitpos >> 3, off = bitpos & 7;
    uint32_t v = p[byte];
    if (off + b > 8) v |= (uint32_t)p[byte + 1] << 8;
    return (v >> off) & ((1u << b) - 1u);
}

void kvt_turbo_decode_row_scalar(uint32_t bits, const uint8_t *src, uint32_t d, float *dst) {
    pthread_once(&g_cb_once, codebook_init);
    const float *cb = g_cb[bits];
    float s;
    memcpy(&s, src + (size_t)d * bits / 8, 4);
    for (uint32_t j = 0; j < d; j++) dst[j] = s * cb[tq_code(src, j, bits)];
}

#ifdef KVT_X86
/* Eight codes of a row starting at element j (j % 8 == 0) as 32-bit lanes. The codes of elements
 * j..j+7 are exactly `bits` bytes at byte j/8*bits. Each group is read with ONE full-width load of
 * 4 (2..4 bits) or 8 (5 bits) bytes straight into a register: assembling a 3- or 5-byte group with
 * a short memcpy into a zeroed stack word stalls store-to-load forwarding on every group (measured:
 * 3-bit rows decoded slower than the scalar loop, and 3-bit values made attention 3x slower than
 * 4-bit). A wide load may read past the group's bytes but never past the row: the row ends with the
 * 4-byte scale, and the last group starts bits bytes before it (3 + 4 >= 4, 5 + 4 >= 8). The extra
 * bits are masked off. */
__attribute__((target("avx2"))) static inline __m256i tq_codes8(const uint8_t *src, uint32_t j, uint32_t bits) {
    const uint8_t *p = src + (size_t)(j / 8) * bits;
    switch (bits) {
    case 8: return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    case 4: {
        uint32_t w;
        memcpy(&w, p, 4);
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                _mm256_set1_epi32(15));
    }
    case 3: {
        uint32_t w;
        memcpy(&w, p, 4); /* 3 code bytes + 1 byte of the next group or of the scale */
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
                                _mm256_set1_epi32(7));
    }
    case 2: {
        uint16_t w;
        memcpy(&w, p, 2);
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                _mm256_set1_epi32(3));
    }
    default: { /* 5: 40 bits; shift 64-bit lanes, then pack the low halves in element order */
        uint64_t w;
        memcpy(&w, p, 8); /* 5 code bytes + 3 bytes of the next group or of the scale */
        const __m256i vw = _mm256_set1_epi64x((long long)w), mask = _mm256_set1_epi64x(31);
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi64(vw, _mm256_setr_epi64x(0, 5, 10, 15)), mask);
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi64(vw, _mm256_setr_epi64x(20, 25, 30, 35)), mask);
        const __m256i pack = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        return _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(lo, pack), _mm256_permutevar8x32_epi32(hi, pack), 0x20);
    }
    }
}

/* Codebook lookup of eight codes: up to 8 entries is one in-register permute, 16 and 32 entries
 * select between permutes on code bits 3 and 4 (blendv reads the sign bit), 256 entries gather.
 * Every path returns exactly cb[idx], so s * cb[idx] matches the scalar decode bit for bit. */
__attribute__((target("avx2"))) static void turbo_decode_avx2(uint32_t bits, const uint8_t *src, uint32_t d,
                                                             float *dst) {
    const float *cb = g_cb[bits];
    float s;
    memcpy(&s, src + (size_t)d * bits / 8, 4);
    const __m256 vs = _mm256_set1_ps(s);
    /* g_cb rows are 256 wide and zero past 2^bits entries, so 8 floats are readable for every width */
    const __m256 t0 = _mm256_loadu_ps(cb);
    const __m256 t1 = bits >= 4 && bits <= 5 ? _mm256_loadu_ps(cb + 8) : t0;
    const __m256 t2 = bits == 5 ? _mm256_loadu_ps(cb + 16) : t0, t3 = bits == 5 ? _mm256_loadu_ps(cb + 24) : t0;
    for (uint32_t j = 0; j < d; j += 8) {
        const __m256i idx = tq_codes8(src, j, bits);
        __m256 c;
        if (bits <= 3) {
            c = _mm256_permutevar8x32_ps(t0, idx);
        } else if (bits == 4) {
            c = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx),
                                 _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
        } else if (bits == 5) {
            const __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
            const __m256 lo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx), b3);
            const __m256 hi = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t2, idx), _mm256_permutevar8x32_ps(t3, idx), b3);
            c = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27)));
        } else {
            c = _mm256_i32gather_ps(cb, idx, 4);
        }
        _mm256_storeu_ps(dst + j, _mm256_mul_ps(vs, c));
    }
}


/* 8-bit codebook lookup without gathers (AVX-512 F/BW/VBMI): the 256 f32 centroids are held as 4
 * byte planes of 256 bytes (4 zmm each, 16 zmm in all, loaded once per call). 64 codes (one zmm of
 * bytes) look up byte p of their centroids with two vpermt2b (codes 0-127 and 128-255: bits 0-6
 * index, bit 7 picks the half through a byte blend), and two rounds of unpacks interleave the 4
 * byte vectors into the f32 bit patterns. Unpacks work within 128-bit lanes: lane L of the k-th
 * result (unpack{lo,hi}_epi16 of unpack{lo,hi}_epi8) holds bytes 16L+4k .. 16L+4k+3. Transposing
 * the 4x4 dwords of the codes first (code dword 4k+L moved to dword 4L+k; the permutation is its
 * own inverse) makes result k hold elements 16k .. 16k+15 in order. Each lane is exactly the bit
 * pattern of cb[idx], so s * cb[idx] matches the scalar decode bit for bit. Rows shorter than 64
 * codes (d = 8, 16, 32) load and store under masks, never touching bytes past the codes. */
#define TQ_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) static inline
/* 64 codes (already dword-transposed) -> s * cb[idx] in element order, e[k] = elements 16k..16k+15. */
TQ_VBMI void tq_lookup64(__m512i idx, const __m512i P[4][4], bool sym, __m512 vs, __m512 e[4]) {
    __m512i b0, b1, b2, b3;
    if (sym) { /* codes >= 128 read the planes of cb[255 - idx] = -cb[idx]: min(idx, ~idx) is idx below
                * 128 and 255 - idx above; every lower-half entry is negative (sign bit, the top bit of
                * plane 3, set), so XOR-ing code bit 7 into plane 3 gives cb[idx]'s sign */
        const __m512i i7 = _mm512_min_epu8(idx, _mm512_xor_si512(idx, _mm512_set1_epi8(-1)));
        b0 = _mm512_permutex2var_epi8(P[0][0], i7, P[0][1]);
        b1 = _mm512_permutex2var_epi8(P[1][0], i7, P[1][1]);
        b2 = _mm512_permutex2var_epi8(P[2][0], i7, P[2][1]);
        b3 = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(P[3][0], i7, P[3][1]), idx,
                                       _mm512_set1_epi8((char)0x80), 0x78); /* b3 ^ (idx & 0x80) */
    } else {
        const __mmask64 hi = _mm512_movepi8_mask(idx);
        b0 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(P[0][0], idx, P[0][1]),
                                    _mm512_permutex2var_epi8(P[0][2], idx, P[0][3]));
        b1 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(P[1][0], idx, P[1][1]),
                                    _mm512_permutex2var_epi8(P[1][2], idx, P[1][3]));
        b2 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(P[2][0], idx, P[2][1]),
                                    _mm512_permutex2var_epi8(P[2][2], idx, P[2][3]));
        b3 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(P[3][0], idx, P[3][1]),
                                    _mm512_permutex2var_epi8(P[3][2], idx, P[3][3]));
    }
    const __m512i w01l = _mm512_unpacklo_epi8(b0, b1), w01h = _mm512_unpackhi_epi8(b0, b1);
    const __m512i w23l = _mm512_unpacklo_epi8(b2, b3), w23h = _mm512_unpackhi_epi8(b2, b3);
    e[0] = _mm512_mul_ps(vs, _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l)));
    e[1] = _mm512_mul_ps(vs, _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l)));
    e[2] = _mm512_mul_ps(vs, _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h)));
    e[3] = _mm512_mul_ps(vs, _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h)));
}

TQ_VBMI void tq_decode8_rows(const uint8_t *src, size_t rb, uint32_t d, uint32_t n, float *dst, bool sym) {
    __m512i P[4][4];
    for (int p = 0; p < 4; p++)
        for (int h = 0; h < 4; h++) P[p][h] = _mm512_load_si512((const void *)(g_cb8_planes[p] + 64 * h));
    const __m512i T = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 e[4];
    for (uint32_t r = 0; r < n; r++, src += rb, dst += d) {
        float s;
        memcpy(&s, src + d, 4);
        const __m512 vs = _mm512_set1_ps(s);
        if (d < 64) { /* d = 8, 16, 32: masked load and stores, nothing past the codes is touched */
            const __m512i idx = _mm512_permutexvar_epi32(T, _mm512_maskz_loadu_epi8(((__mmask64)1 << d) - 1, src));
            tq_lookup64(idx, P, sym, vs, e);
            for (uint32_t k = 0; 16 * k < d; k++)
                _mm512_mask_storeu_ps(dst + 16 * k, d >= 16 ? (__mmask16)0xffff : (__mmask16)0xff, e[k]);
            continue;
        }
        for (uint32_t j = 0; j < d; j += 64) {
            tq_lookup64(_mm512_permutexvar_epi32(T, _mm512_loadu_si512((const void *)(src + j))), P, sym, vs, e);
            _mm512_storeu_ps(dst + j, e[0]);
            _mm512_storeu_ps(dst + j + 16, e[1]);
            _mm512_storeu_ps(dst + j + 32, e[2]);
            _mm512_storeu_ps(dst + j + 48, e[3]);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void turbo_decode8_vbmi(const uint8_t *src, size_t rb,
                                                                                    uint32_t d, uint32_t n,
                                                                                    float *dst) {
    if (g_cb8_use_sym) tq_decode8_rows(src, rb, d, n, dst, true);
    else tq_decode8_rows(src, rb, d, n, dst, false);
}

/* 2-, 3- and 4-bit rows (d >= 16) with AVX-512 VBMI: the codes of 16 elements are 2*bits <= 8 bytes,
 * read with one 8-byte load (it may cover bytes of the next group or of the scale, never past the
 * row: the last group starts 2*bits >= 4 bytes before the scale) and broadcast; one vpmultishiftqb
 * moves the code of element i (bits [i*b, i*b+b)) to the low byte of dword lane i, an AND drops the
 * rest, and one vpermps looks the 16 lanes up in the codebook's first 16 entries (g_cb rows are zero
 * past 2^bits). Exactly cb[idx], as the AVX2 and scalar decodes. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void turbo_decode_narrow_vbmi(uint32_t bits,
                                                                                         const uint8_t *src,
                                                                                         size_t rb, uint32_t d,
                                                                                         uint32_t n, float *dst) {
    const __m512 tab = _mm512_loadu_ps(g_cb[bits]);
    int64_t ctl[8];
    for (uint32_t q = 0; q < 8; q++) ctl[q] = (int64_t)((uint64_t)(bits * 2 * q) | (uint64_t)(bits * (2 * q + 1)) << 32);
    const __m512i vctl = _mm512_loadu_si512((const void *)ctl), vmask = _mm512_set1_epi32((int)((1u << bits) - 1u));
    const size_t code_bytes = (size_t)d * bits / 8;
    for (uint32_t r = 0; r < n; r++, src += rb, dst += d) {
        float s;
        memcpy(&s, src + code_bytes, 4);
        const __m512 vs = _mm512_set1_ps(s);
        for (uint32_t j = 0; j < d; j += 16) {
            uint64_t w;
            memcpy(&w, src + (size_t)(j / 16) * 2 * bits, 8);
            const __m512i idx = _mm512_and_si512(_mm512_multishift_epi64_epi8(vctl, _mm512_set1_epi64((long long)w)), vmask);
            _mm512_storeu_ps(dst + j, _mm512_mul_ps(vs, _mm512_permutexvar_ps(idx, tab)));
        }
    }
}
#endif

void kvt_turbo_init(void) { pthread_once(&g_cb_once, codebook_init); }

/* Hot path (attention): the caller has run kvt_kv_cpu_init, which runs kvt_turbo_init. level:
 * KVT_TURBO_SCALAR, KVT_TURBO_AVX2 or KVT_TURBO_VBMI (kvt_kv_turbo_level: what the CPU has). */
void kvt_turbo_decode_rows(uint32_t bits, const uint8_t *src, size_t rb, uint32_t d, uint32_t n, float *dst,
                           int level) {
#ifdef KVT_X86
    if (level >= KVT_TURBO_VBMI && bits == 8) {
        turbo_decode8_vbmi(src, rb, d, n, dst);
        return;
    }
    if (level >= KVT_TURBO_VBMI && bits <= 4 && d >= 16) {
        turbo_decode_narrow_vbmi(bits, src, rb, d, n, dst);
        return;
    }
    if (level >= KVT_TURBO_AVX2) {
        for (uint32_t r = 0; r < n; r++) turbo_decode_avx2(bits, src + (size_t)r * rb, d, dst + (size_t)r * d);
        return;
    }
#endif
    (void)level;
    for (uint32_t r = 0; r < n; r++) kvt_turbo_decode_row_scalar(bits, src + (size_t)r * rb, d, dst + (size_t)r * d);
}

void kvt_turbo_decode_row(uint32_t bits, const uint8_t *src, uint32_t d, float *dst, int level) {
    kvt_turbo_decode_rows(bits, src, kvt_turbo_row_bytes(bits, d), d, 1, dst, level);
}

/* ------------------------------------------------------------------ QJL residual (measured only) */
/* TurboQuant_prod (kv-codecs.md §3.5) on a rotated key y: an MSE row at bits_mse bits, then the 1-bit
 * QJL sketch z = sign(S r) of the residual r = y - ŷ with S a d×d i.i.d. N(0,1) matrix, and ρ = ||r||.
 * Estimate: <q, y> ≈ <q, ŷ> + ρ·√(π/2)/d · <S q, z>, unbiased over S. Not used by the row codec:
 * docs/kv-codecs.md gives the measurement behind MSE-only keys. */
void kvt_turbo_qjl_matrix(uint64_t seed, uint32_t d, float *S) {
    uint64_t st = seed ^ 0x716a6c5f6d6174ull;
    for (size_t i = 0; i < (size_t)d * d; i += 2) {
        const double u1 = ((double)(mix64(st++) >> 11) + 0.5) / 9007199254740992.0;
        const double u2 = (double)(mix64(st++) >> 11) / 9007199254740992.0;
        const double r = sqrt(-2.0 * log(u1));
        S[i] = (float)(r * cos(2.0 * M_PI * u2));
        if (i + 1 < (size_t)d * d) S[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
    }
}

static void matvec(const float *S, const float *x, uint32_t d, float *out) {
    for (uint32_t i = 0; i < d; i++) {
        double a = 0;
        for (uint32_t j = 0; j < d; j++) a += (double)S[(size_t)i * d + j] * x[j];
        out[i] = (float)a;
    }
}

void kvt_turbo_qjl_encode(const float *S, uint32_t bits_mse, const float *y, uint32_t d, uint8_t *mse_row,
                          uint8_t *signs, float *rho) {
    float yh[KVT_TURBO_MAX_DIM], r[KVT_TURBO_MAX_DIM] = {0}, sr[KVT_TURBO_MAX_DIM];
    if (d > KVT_TURBO_MAX_DIM) return;
    kvt_turbo_encode_row(bits_mse, y, d, mse_row);
    kvt_turbo_decode_row_scalar(bits_mse, mse_row, d, yh);
    double ss = 0;
    for (uint32_t i = 0; i < d; i++) {
        r[i] = y[i] - yh[i];
        ss += (double)r[i] * r[i];
    }
    *rho = (float)sqrt(ss);
    matvec(S, r, d, sr);
    memset(signs, 0, d / 8);
    for (uint32_t i = 0; i < d; i++)
        if (sr[i] >= 0) signs[i / 8] |= (uint8_t)(1u << (i % 8));
}

float kvt_turbo_qjl_dot(const float *S, uint32_t bits_mse, const float *q, uint32_t d, const uint8_t *mse_row,
                        const uint8_t *signs, float rho) {
    float yh[KVT_TURBO_MAX_DIM], sq[KVT_TURBO_MAX_DIM];
    if (d > KVT_TURBO_MAX_DIM) return 0.0f;
    kvt_turbo_decode_row_scalar(bits_mse, mse_row, d, yh);
    matvec(S, q, d, sq);
    double a = 0, b = 0;
    for (uint32_t i = 0; i < d; i++) {
        a += (double)q[i] * yh[i];
        b += (signs[i / 8] >> (i % 8)) & 1 ? sq[i] : -sq[i];
    }
    return (float)(a + rho * sqrt(M_PI / 2.0) / d * b);
}
