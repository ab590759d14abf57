/*
 * kernels_x86_tmpl.h — x86 SIMD kernels, written once and instantiated per ISA by kernels_avx2.c and
 * kernels_avx512.c (private to src/kernels; include only from those files).
 *
 * The including file defines:
 *   KVT_SFX      suffix for function names (avx2, avx512)
 *   KVT_TGT_STR  target attribute string (every function gets __attribute__((target(...))))
 *   KVT_VNNI     1: u8×s8 dots use vpdpbusd (AVX512-VNNI, 256-bit), 0: maddubs+madd
 *   KVT_TR       activation rows per register tile (weights: always 4 rows per tile)
 *   KVT_ZMM      1: f32-family kernels use 512-bit vectors with masked tails
 *
 * Batch invariance: every tile variant (4×TR, 4×r, 1×TR, 1×r) runs, for each output element, the
 * same instruction sequence over the blocks in order (one accumulator per element, the same
 * horizontal reduction), so y[r][o] does not depend on n_rows, the tile it fell in or [o0,o1).
 * K-quant kernels reduce each super-block to exact integers and then evaluate the same scalar
 * float expression as kvt_matmul_rows_ref, so they equal the reference bit for bit.
 */
#if !defined(KVT_SFX) || !defined(KVT_TGT_STR) || !defined(KVT_VNNI) || !defined(KVT_TR) || !defined(KVT_ZMM)
#error "define KVT_SFX, KVT_TGT_STR, KVT_VNNI, KVT_TR, KVT_ZMM before including kernels_x86_tmpl.h"
#endif

#include <immintrin.h>
#include <math.h>

#include "kernels_internal.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define KQ_CAT2(a, b) a##_##b
#define KQ_CAT(a, b) KQ_CAT2(a, b)
#define F(name) KQ_CAT(name, KVT_SFX)
#define TGT __attribute__((target(KVT_TGT_STR)))
#define AI static inline __attribute__((always_inline)) TGT
#define KQ_MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---------------- helpers ---------------- */

AI float F(hsum_ps)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
AI int32_t F(hsum_i32)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* f16 → f32 with F16C (exact, same values as kvt_f16_to_f32; avoids the 256 KiB table in hot loops) */
AI float F(h2f)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
/* Σ over groups of 4 of u8·s8 → 8 × i32 (no saturation for |u|<=128, |s|<=127) */
AI __m256i F(dot_us)(__m256i u, __m256i s) {
#if KVT_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* 32 bits → 32 bytes of 0x10 where the bit is set (bit k → byte k) */
AI __m256i F(bits_to_0x10)(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    const __m256i b = _mm256_set1_epi32((int32_t)v);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i bytes = _mm256_shuffle_epi8(b, shuf);
    const __m256i bitm = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bitm), bitm);
    return _mm256_and_si256(on, _mm256_set1_epi8(0x10));
}
/* 16 nibble bytes → 32 values: low nibbles are elements 0..15, high nibbles 16..31 */
AI __m256i F(nibbles32)(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* ---------------- small-block types (act Q8_0 / Q8_1) ---------------- */

static inline size_t F(wblk_bytes)(uint32_t wt) {
    switch (wt) {
    case KVT_TYPE_Q8_0: return 34;
    case KVT_TYPE_Q4_0: return 18;
    case KVT_TYPE_Q4_1: return 20;
    case KVT_TYPE_Q5_0: return 22;
    default: return 24; /* Q5_1 */
    }
}
/* The 32 weights of one block as bytes: signed (Q8_0/Q4_0/Q5_0) or unsigned (Q4_1/Q5_1). */
AI __m256i F(unpack_small)(const uint32_t wt, const uint8_t *p) {
    switch (wt) {
    case KVT_TYPE_Q8_0: return _mm256_loadu_si256((const __m256i *)(p + 2));
    case KVT_TYPE_Q4_0: return _mm256_sub_epi8(F(nibbles32)(p + 2), _mm256_set1_epi8(8));
    case KVT_TYPE_Q4_1: return F(nibbles32)(p + 4);
    case KVT_TYPE_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(F(nibbles32)(p + 6), F(bits_to_0x10)(p + 2)), _mm256_set1_epi8(16));
    default: return _mm256_or_si256(F(nibbles32)(p + 8), F(bits_to_0x10)(p + 4)); /* Q5_1 */
    }
}

/* GEMV software prefetch distance in weight rows (3 tiles ahead). Single-row matmuls (decode) are
 * bound by DRAM latency on the streamed weights; prefetching doubled Q8_0 decode speed on the
 * SmolLM2-135M shape (8-16 measured alike, 4 and 32 slower). Prefetch never changes results. */
#ifndef KQ_PF_ROWS
#define KQ_PF_ROWS 12
#endif
/* Block b of weight row i is at W + i * rs + b * bstr: row-major rows (rs = row bytes, bstr = block
 * bytes) or the 4-row interleaved GEMV copy (rs = block bytes, bstr = 4 blocks; kq_ilv_build). A
 * single-row tile prefetches pfo bytes ahead of each block it reads. */
AI void F(tile_small_s)(const uint32_t wt, const int NW, const int NR, const uint8_t *W, size_t rs, size_t bstr,
                        size_t pfo, const uint8_t *A, size_t arb, int64_t nb, float *y, int64_t ldy) {
    const bool sgn = wt == KVT_TYPE_Q8_0 || wt == KVT_TYPE_Q4_0 || wt == KVT_TYPE_Q5_0;
    const size_t abb = sgn ? 34 : 36, aqo = sgn ? 2 : 4;
    __m256 acc[4][KVT_TR];
    float macc[4][KVT_TR];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps(), macc[i][j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq[4], wa[4];
        __m256 dw[4];
        float mw[4];
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            const uint8_t *p = W + (size_t)i * rs + (size_t)b * bstr;
            /* GEMV (decode): weights stream from DRAM once; fetch the bytes a later tile reads
             * (KQ_PF_ROWS rows ahead) so the loads overlap this tile's math. A prefetch past the
             * matrix end is harmless (no fault). */
            if (NR == 1) _mm_prefetch((const char *)(p + pfo), _MM_HINT_T0);
            dw[i] = _mm256_set1_ps(F(h2f)(p));
            wq[i] = F(unpack_small)(wt, p);
            if (sgn) wa[i] = _mm256_abs_epi8(wq[i]);
            else mw[i] = F(h2f)(p + 2);
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const uint8_t *pa = A + (size_t)j * arb + (size_t)b * abb;
            const __m256 dx = _mm256_set1_ps(F(h2f)(pa));
            const float sx = sgn ? 0.0f : F(h2f)(pa + 2);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(pa + aqo));
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) {
                const __m256i d = sgn ? F(dot_us)(wa[i], _mm256_sign_epi8(xq, wq[i])) : F(dot_us)(wq[i], xq);
                /* lanes of dw*dx equal the scalar product dw*dx of the reference */
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dw[i], dx), acc[i][j]);
                if (!sgn) macc[i][j] += mw[i] * sx;
            }
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) y[(int64_t)j * ldy + i] = F(hsum_ps)(acc[i][j]) + macc[i][j];
}
/* Row-major rows of wrb bytes. */
AI void F(tile_small)(const uint32_t wt, const int NW, const int NR, const uint8_t *W, size_t wrb,
                      const uint8_t *A, size_t arb, int64_t nb, float *y, int64_t ldy) {
    F(tile_small_s)(wt, NW, NR, W, wrb, F(wblk_bytes)(wt), KQ_PF_ROWS * wrb, A, arb, nb, y, ldy);
}

/* ---------------- K-quants (act Q8_K) ---------------- */

/* The 4 horizontal sums of a0..a3 as the 4 lanes of one vector (a transposing reduction) */
AI __m128i F(hsum4y_i32)(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* One 32-value group g (0..7) of a Q4_K/Q5_K/Q6_K super-block as unsigned bytes, and the int16
 * scale vector for it (Q6_K: two 16-value halves with their own scales). */
AI __m256i F(kgroup)(const uint32_t wt, const uint8_t *p, int g) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (wt == KVT_TYPE_Q6_K) {
        const int h = g / 4, k = g % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (k & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        const __m256i lo = (k < 2) ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    }
    const size_t qso = wt == KVT_TYPE_Q4_K ? 16 : 48;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + qso + 32 * (g / 2)));
    __m256i v = (g & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
    if (wt == KVT_TYPE_Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, g), _mm256_set1_epi8(1));
        v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
    }
    return v;
}

AI void F(tile_k)(const uint32_t wt, const int NW, const int NR, const uint8_t *W, size_t wrb,
                  const uint8_t *A, size_t arb, int64_t nb, float *y, int64_t ldy) {
    const size_t wbb = wt == KVT_TYPE_Q4_K ? 144 : wt == KVT_TYPE_Q5_K ? 176 : 210;
    const size_t abb = sizeof(blk_q8_K);
    float sumf[4][KVT_TR];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) sumf[i][j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wp[4];
        uint8_t sm[4][16]; /* Q4/5_K: unpacked 6-bit scales sc[0..7] then mins m[0..7] */
        int16_t sc6[4][16]; /* Q6_K: the 16 int8 scales widened */
        __m256i mvec[4];   /* Q4/5_K: mins paired with bsums; Q6_K: scales paired with bsums */
        float dw[4], dmw[4];
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            const uint8_t *p = W + (size_t)i * wrb + (size_t)b * wbb;
            wp[i] = p;
            if (NR == 1) /* GEMV: prefetch a later tile's super-block (see tile_small) */
                for (size_t cl = 0; cl < wbb; cl += 64)
                    _mm_prefetch((const char *)(p + KQ_PF_ROWS * wrb + cl), _MM_HINT_T0);
            if (wt == KVT_TYPE_Q6_K) {
                dw[i] = F(h2f)(p + 208);
                dmw[i] = 0.0f;
                mvec[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
                for (int g = 0; g < 16; g++) sc6[i][g] = (int8_t)p[192 + g];
            } else {
                dw[i] = F(h2f)(p);
                dmw[i] = F(h2f)(p + 2);
                /* unpack the 12 packed bytes into 8 scales + 8 mins with 32-bit masks (same
                 * values as kq_scale_min_k4) */
                uint32_t u[4];
                memcpy(u, p + 4, 12);
                const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
                u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
                const uint32_t m03 = u[1] & k1;
                u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
                u[2] = m03;
                u[0] &= k1;
                memcpy(sm[i], u, 16);
                const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm[i] + 8)));
                mvec[i] = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
            }
        }
        __m256i iacc[4][KVT_TR];
        for (int i = 0; i < NW; i++)
            for (int j = 0; j < NR; j++) iacc[i][j] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i q[4], s[4];
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) {
                q[i] = F(kgroup)(wt, wp[i], g);
                if (wt == KVT_TYPE_Q6_K)
                    s[i] = _mm256_set_m128i(_mm_set1_epi16(sc6[i][2 * g + 1]), _mm_set1_epi16(sc6[i][2 * g]));
                else
                    s[i] = _mm256_set1_epi16(sm[i][g]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(A + (size_t)j * arb + (size_t)b * abb + 4 + 32 * g));
#pragma GCC unroll 4
                for (int i = 0; i < NW; i++)
                    iacc[i][j] = _mm256_add_epi32(iacc[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(q[i], yv), s[i]));
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const blk_q8_K *xa = (const blk_q8_K *)(A + (size_t)j * arb + (size_t)b * abb);
            const __m256i bs = _mm256_loadu_si256((const __m256i *)xa->bsums);
            float dx;
            memcpy(&dx, &xa->d, 4); /* act buffers need not be 4-aligned */
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) {
                const int32_t isum = F(hsum_i32)(iacc[i][j]);
                const int32_t msum = F(hsum_i32)(_mm256_madd_epi16(bs, mvec[i]));
                if (wt == KVT_TYPE_Q6_K)
                    sumf[i][j] += (dw[i] * dx) * (float)(isum - 32 * msum);
                else
                    sumf[i][j] += (dw[i] * dx) * (float)isum - (dmw[i] * dx) * (float)msum;
            }
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) y[(int64_t)j * ldy + i] = sumf[i][j];
}

/* gemv_k4 helpers (both vector widths). The 12 packed scale bytes of a Q4_K/Q5_K super-block at p
 * as 8 scales then 8 mins, one byte each (the values of kq_scale_min_k4). */
AI __m128i F(kq_scales_mins)(const uint8_t *p) {
    /* 32-bit lanes l0..l2 = bytes 0-3, 4-7, 8-11 (l3: 4 bytes of qs, unused); per byte:
     * sc[0..3] = l0 & 63, sc[4..7] = (l2 & 15) | (l0 >> 6) << 4, m[0..3] = l1 & 63,
     * m[4..7] = (l2 >> 4) | (l1 >> 6) << 4 (whole-lane shifts: the bits shifted in from the
     * neighbouring byte are masked off) */
    const __m128i v = _mm_loadu_si128((const __m128i *)(p + 4));
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* l0, l2, l1, l2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* l0, l0, l1, l1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_set_epi32(4, 0, 0, 0)),
                                     _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_set_epi32(0x30303030, 0, 0x30303030, 0));
    return _mm_or_si128(lo, hi);
}
/* One super-block's contribution to the 4 rows' sums: tile_k's float expression on 4 lanes, from the
 * exact integer sums isum (weights x activations) and msum (bsums x mins, or x scales for Q6_K). */
AI __m128 F(gemv_k4_sb)(const uint32_t wt, __m128 sumf, __m128i isum, __m128i msum, const blk_q8_K *xa, __m128 dwv,
                        __m128 dmv) {
    float dx;
    memcpy(&dx, &xa->d, 4);
    const __m128 dxv = _mm_set1_ps(dx);
    if (wt == KVT_TYPE_Q6_K) {
        const __m128i t = _mm_sub_epi32(isum, _mm_slli_epi32(msum, 5)); /* isum - 32 * msum */
        return _mm_add_ps(sumf, _mm_mul_ps(_mm_mul_ps(dwv, dxv), _mm_cvtepi32_ps(t)));
    }
    const __m128 a = _mm_mul_ps(_mm_mul_ps(dwv, dxv), _mm_cvtepi32_ps(isum));
    const __m128 c = _mm_mul_ps(_mm_mul_ps(dmv, dxv), _mm_cvtepi32_ps(msum));
    return _mm_add_ps(sumf, _mm_sub_ps(a, c));
}

#if KVT_ZMM
/* K-quant GEMV (decode: one activation row) on 4 weight rows with 512-bit integer vectors: one
 * vector holds two 32-value groups, so a super-block takes 4 multiply steps instead of 8, and the
 * 4 rows' super-block sums are reduced together (one transposing reduction instead of 8 horizontal
 * sums) and scaled with 4-lane float vectors. The integer sums are exact and every lane evaluates
 * tile_k's float expression in the same order, so y equals tile_k (and kvt_matmul_rows_ref) bit
 * for bit. Weights are prefetched KQ_PF_ROWS rows ahead (every cache line of the block). */
AI __m128i F(hsum4z_i32)(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
#define KQ_H(v) _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(KQ_H(a0), KQ_H(a1)), _mm256_hadd_epi32(KQ_H(a2), KQ_H(a3)));
#undef KQ_H
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
/* Block b of row i at W + i * rs + b * bstr, prefetching pfo bytes ahead (see tile_small_s). */
AI void F(gemv_k4)(const uint32_t wt, const uint8_t *W, size_t rs, size_t bstr, size_t pfo, const uint8_t *A, int64_t nb,
                   float *y) {
    const size_t wbb = wt == KVT_TYPE_Q4_K ? 144 : wt == KVT_TYPE_Q5_K ? 176 : 210;
    const size_t abb = sizeof(blk_q8_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* permutexvar indices: int16 lane l of pair m takes scale 2m + l/16 (Q4/5_K: one scale per 32
     * values) or 4m + l/8 (Q6_K: one per 16 values) */
    __m512i sidx[4];
    for (int m = 0; m < 4; m++)
        sidx[m] = wt == KVT_TYPE_Q6_K ? _mm512_add_epi16(_mm512_set1_epi16((short)(4 * m)),
                                                         _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3))
                                      : _mm512_add_epi16(_mm512_set1_epi16((short)(2 * m)),
                                                         _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 4));
    __m128 sumf = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wp[4];
        __m512i sv[4];   /* scales as int16 (first 8 or 16 lanes) */
        __m256i msv[4];  /* madd(bsums, mins or scales): 8 int32 */
        float dw[4], dmw[4];
        const blk_q8_K *xa = (const blk_q8_K *)(A + (size_t)b * abb);
        const __m256i bs = _mm256_loadu_si256((const __m256i *)xa->bsums);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *p = W + (size_t)i * rs + (size_t)b * bstr;
            wp[i] = p;
            for (size_t cl = 0; cl < wbb + 63; cl += 64)
                _mm_prefetch((const char *)(p + pfo + cl), _MM_HINT_T0);
            if (wt == KVT_TYPE_Q6_K) {
                dw[i] = F(h2f)(p + 208);
                dmw[i] = 0.0f;
                const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
                sv[i] = _mm512_castsi256_si512(s16);
                msv[i] = _mm256_madd_epi16(bs, s16);
            } else {
                dw[i] = F(h2f)(p);
                dmw[i] = F(h2f)(p + 2);
                const __m128i sm = F(kq_scales_mins)(p); /* sc[0..7], m[0..7] */
                sv[i] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
                const __m128i m8 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
                msv[i] = _mm256_madd_epi16(bs, _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8)));
            }
        }
        __m512i iacc[4];
        for (int i = 0; i < 4; i++) iacc[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const __m512i yv = _mm512_loadu_si512((const void *)(A + (size_t)b * abb + 4 + 64 * m));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *p = wp[i];
                __m512i q;
                if (wt == KVT_TYPE_Q6_K) {
                    const int h = m / 2;
                    const __m512i ql = _mm512_loadu_si512((const void *)(p + 64 * h));
                    const __m512i lo = (m % 2 == 0) ? _mm512_and_si512(ql, m4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)));
                    const int k0 = (2 * m) % 4;
                    const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * k0)), _mm256_set1_epi16((short)(2 * k0 + 2)), 1);
                    const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(3));
                    q = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
                } else {
                    const size_t qso = wt == KVT_TYPE_Q4_K ? 16 : 48;
                    const __m256i q8 = _mm256_loadu_si256((const __m256i *)(p + qso + 32 * m));
                    q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q8), _mm256_srli_epi16(q8, 4), 1), m4);
                    if (wt == KVT_TYPE_Q5_K) {
                        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16)));
                        const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * m)), _mm256_set1_epi16((short)(2 * m + 1)), 1);
                        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(1));
                        q = _mm512_or_si512(q, _mm512_slli_epi16(hb, 4));
                    }
                }
                const __m512i s = _mm512_permutexvar_epi16(sidx[m], sv[i]);
                iacc[i] = _mm512_add_epi32(iacc[i], _mm512_madd_epi16(_mm512_maddubs_epi16(q, yv), s));
            }
        }
        const __m128i isum = F(hsum4z_i32)(iacc[0], iacc[1], iacc[2], iacc[3]);
        const __m128i msum = F(hsum4y_i32)(msv[0], msv[1], msv[2], msv[3]);
        sumf = F(gemv_k4_sb)(wt, sumf, isum, msum, xa, _mm_loadu_ps(dw), _mm_loadu_ps(dmw));
    }
    _mm_storeu_ps(y, sumf);
}
#else
/* K-quant GEMV (decode: one activation row) on 4 weight rows with 256-bit vectors. tile_k with
 * NR = 1 spent most of its time outside the multiplies (a group loop the compiler kept rolled, with
 * a branch per group, and two horizontal sums per row and super-block); here the 8 groups are
 * unrolled with the scale vectors made by one byte shuffle each, the activation of a group is
 * loaded once for the 4 rows, and the 4 rows' integer sums are reduced together and scaled with
 * 4-lane float vectors. The integer sums are exact and every lane evaluates tile_k's float
 * expression in the same order, so y equals tile_k (and kvt_matmul_rows_ref) bit for bit. */
/* vpshufb controls that broadcast group g's int16 scale from the scale vectors of gemv_k4: [0][g]
 * word g in both 128-bit lanes (Q4_K/Q5_K: one scale per 32 values); [1][g] words 2g and 2g + 1
 * mod 8 in the low and high lane (Q6_K: one scale per 16 values) */
static const uint8_t F(kq_sidx)[2][8][32] __attribute__((aligned(32))) = {
#define KQ_W(w) 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, \
                2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1
    {{KQ_W(0), KQ_W(0)}, {KQ_W(1), KQ_W(1)}, {KQ_W(2), KQ_W(2)}, {KQ_W(3), KQ_W(3)},
     {KQ_W(4), KQ_W(4)}, {KQ_W(5), KQ_W(5)}, {KQ_W(6), KQ_W(6)}, {KQ_W(7), KQ_W(7)}},
    {{KQ_W(0), KQ_W(1)}, {KQ_W(2), KQ_W(3)}, {KQ_W(4), KQ_W(5)}, {KQ_W(6), KQ_W(7)},
     {KQ_W(0), KQ_W(1)}, {KQ_W(2), KQ_W(3)}, {KQ_W(4), KQ_W(5)}, {KQ_W(6), KQ_W(7)}},
#undef KQ_W
};
/* Group g of the super-block at p times the activation groups at xq (Q8_K: qs at +4), each
 * 16-bit pair sum scaled by its scale from sv: 8 exact int32 partial sums. */
AI __m256i F(kgroup_dot)(const uint32_t wt, const uint8_t *p, const uint8_t *xq, __m256i sv, const int g) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i q;
    if (wt == KVT_TYPE_Q6_K) {
        const int h = g / 4, k = g % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (k & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        const __m256i lo = k < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        q = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3)), 4));
    } else {
        const __m256i q8 = _mm256_loadu_si256((const __m256i *)(p + (wt == KVT_TYPE_Q4_K ? 16 : 48) + 32 * (g / 2)));
        q = (g & 1) ? _mm256_and_si256(_mm256_srli_epi16(q8, 4), m4) : _mm256_and_si256(q8, m4);
        if (wt == KVT_TYPE_Q5_K) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g), _mm256_set1_epi8(1)), 4));
        }
    }
    const __m256i yv = _mm256_loadu_si256((const __m256i *)(xq + 4 + 32 * g));
    const __m256i s = _mm256_shuffle_epi8(sv, _mm256_load_si256((const __m256i *)F(kq_sidx)[wt == KVT_TYPE_Q6_K][g]));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), s);
}
/* Block b of row i at W + i * rs + b * bstr, prefetching pfo bytes ahead (see tile_small_s). */
AI void F(gemv_k4)(const uint32_t wt, const uint8_t *W, size_t rs, size_t bstr, size_t pfo, const uint8_t *A, int64_t nb,
                   float *y) {
    const size_t wbb = wt == KVT_TYPE_Q4_K ? 144 : wt == KVT_TYPE_Q5_K ? 176 : 210;
    const size_t abb = sizeof(blk_q8_K);
    __m128 sumf = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wp[4];
        __m256i sv[4][2]; /* int16 scales: Q4/5_K sc[0..7] in both halves; Q6_K [0..7] / [8..15] */
        __m256i msv[4];   /* madd(bsums, mins or scales): 8 int32 */
        uint32_t dd[4];   /* per row the f16 d and dmin (Q6_K: d in the low half) */
        const uint8_t *xq = A + (size_t)b * abb;
        const blk_q8_K *xa = (const blk_q8_K *)xq;
        const __m256i bs = _mm256_loadu_si256((const __m256i *)xa->bsums);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *p = W + (size_t)i * rs + (size_t)b * bstr;
            wp[i] = p;
#pragma GCC unroll 4
            for (size_t cl = 0; cl < wbb + 63; cl += 64)
                _mm_prefetch((const char *)(p + pfo + cl), _MM_HINT_T0);
            if (wt == KVT_TYPE_Q6_K) {
                uint16_t h;
                memcpy(&h, p + 208, 2);
                dd[i] = h;
                const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
                sv[i][0] = _mm256_permute2x128_si256(s16, s16, 0x00);
                sv[i][1] = _mm256_permute2x128_si256(s16, s16, 0x11);
                msv[i] = _mm256_madd_epi16(bs, s16);
            } else {
                memcpy(&dd[i], p, 4);
                const __m128i sm = F(kq_scales_mins)(p); /* sc[0..7], m[0..7] */
                const __m128i s8 = _mm_cvtepu8_epi16(sm), m8 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
                sv[i][0] = sv[i][1] = _mm256_set_m128i(s8, s8);
                msv[i] = _mm256_madd_epi16(bs, _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8)));
            }
        }
        /* row by row (a row's scales and accumulator stay in registers; the activation groups are
         * re-read from L1 per row) */
        __m256i iacc[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *p = wp[i];
            /* two accumulators (even and odd groups) for two independent add chains */
            __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int g = 0; g < 8; g += 2) {
                acc0 = _mm256_add_epi32(acc0, F(kgroup_dot)(wt, p, xq, sv[i][wt == KVT_TYPE_Q6_K && g >= 4], g));
                acc1 = _mm256_add_epi32(acc1, F(kgroup_dot)(wt, p, xq, sv[i][wt == KVT_TYPE_Q6_K && g >= 4], g + 1));
                /* keep the two add chains as written: GCC otherwise rebalances the 32 sums of the 4
                 * rows into one tree, which keeps all products live and spills them to the stack */
                __asm__("" : "+x"(acc0), "+x"(acc1));
            }
            iacc[i] = _mm256_add_epi32(acc0, acc1);
        }
        const __m128i isum = F(hsum4y_i32)(iacc[0], iacc[1], iacc[2], iacc[3]);
        const __m128i msum = F(hsum4y_i32)(msv[0], msv[1], msv[2], msv[3]);
        /* the 4 rows' f16 d (and dmin) to f32 at once: exact conversions, as h2f */
        const __m256 df = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dd)); /* d0 m0 d1 m1 d2 m2 d3 m3 */
        const __m128 dlo = _mm256_castps256_ps128(df), dhi = _mm256_extractf128_ps(df, 1);
        const __m128 dwv = _mm_shuffle_ps(dlo, dhi, _MM_SHUFFLE(2, 0, 2, 0)), dmv = _mm_shuffle_ps(dlo, dhi, _MM_SHUFFLE(3, 1, 3, 1));
        sumf = F(gemv_k4_sb)(wt, sumf, isum, msum, xa, dwv, dmv);
    }
    _mm_storeu_ps(y, sumf);
}
#endif

/* ---------------- F32 / F16 / BF16 weights × f32 activations ---------------- */

#if KVT_ZMM
#define FV __m512
#define FV_W 16
AI __m512 F(fload)(const uint32_t wt, const uint8_t *p, int64_t k, __mmask16 m, bool masked) {
    if (wt == KVT_TYPE_F32)
        return masked ? _mm512_maskz_loadu_ps(m, (const float *)p + k) : _mm512_loadu_ps((const float *)p + k);
    const __m256i h = masked ? _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + k)
                             : _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + k));
    if (wt == KVT_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#else
#define FV __m256
#define FV_W 8
AI __m256 F(fload)(const uint32_t wt, const uint8_t *p, int64_t k) {
    if (wt == KVT_TYPE_F32) return _mm256_loadu_ps((const float *)p + k);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
    if (wt == KVT_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float F(fscalar)(const uint32_t wt, const uint8_t *p, int64_t k) {
    if (wt == KVT_TYPE_F32) return ((const float *)p)[k];
    uint16_t h;
    memcpy(&h, p + 2 * k, 2);
    return wt == KVT_TYPE_F16 ? kq_h2f(h) : kvt_bf16_to_f32(h);
}
#endif

/* Block b (FV_W elements) of weight row i is at W + i * rs + b * bstr: row-major rows (rs = row bytes,
 * bstr = FV_W elements) or, on AVX2, the 4-row interleaved GEMV copy (rs = 8 elements, bstr = 4 of
 * them; kq_ilv_build, whose rows have no tail). A single-row tile prefetches pfo bytes ahead of each
 * cache line it starts. */
AI void F(tile_f_s)(const uint32_t wt, const int NW, const int NR, const uint8_t *W, size_t rs, size_t bstr, size_t pfo,
                    const uint8_t *A, size_t arb, int64_t n, float *y, int64_t ldy) {
    FV acc[4][KVT_TR];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = (FV){0};
    int64_t k = 0;
    const uint8_t *Wk = W; /* block k / FV_W */
    for (; k + FV_W <= n; k += FV_W, Wk += bstr) {
        FV wv[4];
        if (NR == 1 && (size_t)(Wk - W) % 64 == 0) /* GEMV: see tile_small */
            for (int i = 0; i < NW; i++)
                if (i == 0 || rs >= 64) _mm_prefetch((const char *)(Wk + (size_t)i * rs + pfo), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++)
#if KVT_ZMM
            wv[i] = F(fload)(wt, Wk + (size_t)i * rs, 0, 0xFFFF, false);
#else
            wv[i] = F(fload)(wt, Wk + (size_t)i * rs, 0);
#endif
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
#if KVT_ZMM
            const FV xv = _mm512_loadu_ps((const float *)(A + (size_t)j * arb) + k);
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
#else
            const FV xv = _mm256_loadu_ps((const float *)(A + (size_t)j * arb) + k);
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
#endif
        }
    }
    const uint8_t *Wt = Wk; /* the tail's block (row-major: k's byte) */
#if KVT_ZMM
    if (k < n) { /* masked tail: same lanes, zeros elsewhere */
        const __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
        FV wv[4];
        for (int i = 0; i < NW; i++) wv[i] = F(fload)(wt, Wt + (size_t)i * rs, 0, m, true);
        for (int j = 0; j < NR; j++) {
            const FV xv = _mm512_maskz_loadu_ps(m, (const float *)(A + (size_t)j * arb) + k);
            for (int i = 0; i < NW; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) {
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]),
                                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][j]), 1)));
            y[(int64_t)j * ldy + i] = F(hsum_ps)(h);
        }
#else
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NR; j++) {
            float s = F(hsum_ps)(acc[i][j]);
            const float *xa = (const float *)(A + (size_t)j * arb);
            for (int64_t t = k; t < n; t++) s += F(fscalar)(wt, Wt + (size_t)i * rs, t - k) * xa[t];
            y[(int64_t)j * ldy + i] = s;
        }
#endif
}
AI void F(tile_f)(const uint32_t wt, const int NW, const int NR, const uint8_t *W, size_t wrb, const uint8_t *A,
                  size_t arb, int64_t n, float *y, int64_t ldy) {
    const size_t vb = (size_t)FV_W * (wt == KVT_TYPE_F32 ? 4 : 2);
    F(tile_f_s)(wt, NW, NR, W, wrb, vb, KQ_PF_ROWS * wrb, A, arb, n, y, ldy);
}

#if !KVT_ZMM
/* F32/F16/BF16 weights with 2 to 16 activation rows on AVX2 (batched decode steps and speculative
 * verification; there is no packed copy for these types): one weight row × up to 8 activation rows
 * (8 accumulators), so the weights are read once per 8 rows instead of once per KVT_TR = 2, and as
 * one stream (the 4 × 2 tile reads 4 rows a row apart, which the hardware prefetchers follow badly,
 * as in the GEMV copy's case). smol-135m F16, 2 threads: an 8-row step 47.6 / 39.7 → 29.5 / 28.4 ms,
 * a 2-row step about 1.05× a 1-row one. Prefill chunks (more rows) keep the 4 × 2 tiles, whose
 * activation loads feed 4 FMAs each. Each output keeps tile_f's accumulator, lane order, horizontal
 * sum and scalar tail, so the bits do not depend on the tiling. */
AI void F(tile_f_tall)(const uint32_t wt, const int NR, const uint8_t *W, const uint8_t *A, size_t arb, int64_t n,
                       float *y, int64_t ldy) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) acc[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 wv = F(fload)(wt, W, k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps((const float *)(A + (size_t)j * arb) + k), acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        float s = F(hsum_ps)(acc[j]);
        const float *xa = (const float *)(A + (size_t)j * arb);
        for (int64_t t = k; t < n; t++) s += F(fscalar)(wt, W, t) * xa[t];
        y[(int64_t)j * ldy] = s;
    }
}
/* Rows [0, n_rows) × outputs [o0, o1) of a F32/F16/BF16 matrix with tile_f_tall. */
AI void F(mm_f_tall)(const uint32_t wt, const uint8_t *W, int64_t n_in, const uint8_t *A, int64_t n_rows, float *y,
                     int64_t ldy, int64_t o0, int64_t o1) {
    const size_t wrb = (size_t)kvt_type_row_bytes(wt, (uint64_t)n_in), arb = (size_t)n_in * sizeof(float);
    for (int64_t o = o0; o < o1; o++)
        for (int64_t r = 0; r < n_rows; r += 8) {
            const uint8_t *w = W + (size_t)o * wrb, *a = A + (size_t)r * arb;
            float *yo = y + r * ldy + o;
            switch (n_rows - r < 8 ? n_rows - r : 8) {
            case 1: F(tile_f_tall)(wt, 1, w, a, arb, n_in, yo, ldy); break;
            case 2: F(tile_f_tall)(wt, 2, w, a, arb, n_in, yo, ldy); break;
            case 3: F(tile_f_tall)(wt, 3, w, a, arb, n_in, yo, ldy); break;
            case 4: F(tile_f_tall)(wt, 4, w, a, arb, n_in, yo, ldy); break;
            case 5: F(tile_f_tall)(wt, 5, w, a, arb, n_in, yo, ldy); break;
            case 6: F(tile_f_tall)(wt, 6, w, a, arb, n_in, yo, ldy); break;
            case 7: F(tile_f_tall)(wt, 7, w, a, arb, n_in, yo, ldy); break;
            default: F(tile_f_tall)(wt, 8, w, a, arb, n_in, yo, ldy); break;
            }
        }
}
/* F32/F16/BF16 products of 2..16 rows take mm_f_tall (AVX2 only; AVX-512 keeps its 4 × 4 tiles) */
#define KQ_F_TALL_RET(WT)                                                                                \
    if (((WT) == KVT_TYPE_F32 || (WT) == KVT_TYPE_F16 || (WT) == KVT_TYPE_BF16) && n_rows >= 2 &&         \
        n_rows <= 16) {                                                                                  \
        F(mm_f_tall)(WT, W, n_in, A, n_rows, y, ldy, o0, o1);                                            \
        return;                                                                                          \
    }
#else
#define KQ_F_TALL_RET(WT)
#endif

/* ---------------- matmul drivers ---------------- */

/* Tiles of 4 weight rows × KVT_TR activation rows; leftovers use narrower tiles of the same code. */
#define KQ_ROWS(TILE, WT, NW, WP)                                                                       \
    do {                                                                                                \
        int64_t r = 0;                                                                                  \
        for (; r + KVT_TR <= n_rows; r += KVT_TR)                                                       \
            TILE(WT, NW, KVT_TR, WP, wrb, A + (size_t)r * arb, arb, inner, y + r * ldy + o, ldy);       \
        switch (n_rows - r) {                                                                           \
        case 1: TILE(WT, NW, 1, WP, wrb, A + (size_t)r * arb, arb, inner, y + r * ldy + o, ldy); break; \
        case 2: TILE(WT, NW, KQ_MIN(2, KVT_TR), WP, wrb, A + (size_t)r * arb, arb, inner, y + r * ldy + o, ldy); break; \
        case 3: TILE(WT, NW, KQ_MIN(3, KVT_TR), WP, wrb, A + (size_t)r * arb, arb, inner, y + r * ldy + o, ldy); break; \
        default: break;                                                                                 \
        }                                                                                               \
    } while (0)

/* K-quant single-row products take gemv_k4 (same bits as tile_k) */
#define KQ_GEMV_K(WT) ((WT) == KVT_TYPE_Q4_K || (WT) == KVT_TYPE_Q5_K || (WT) == KVT_TYPE_Q6_K)
#define KQ_DEFINE_MM(NAME, TILE, WT, INNER_DIV)                                                          \
    static TGT void F(NAME)(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y,      \
                            int64_t ldy, int64_t o0, int64_t o1) {                                       \
        const size_t wrb = (size_t)kvt_type_row_bytes(WT, (uint64_t)n_in);                              \
        const size_t arb = (size_t)kvt_type_row_bytes(kvt_vec_dot_type(WT), (uint64_t)n_in);            \
        const int64_t inner = n_in / (INNER_DIV);                                                        \
        const uint8_t *A = act;                                                                          \
        int64_t o = o0;                                                                                  \
        KQ_F_TALL_RET(WT)                                                                                \
        if (KQ_GEMV_K(WT) && n_rows == 1)                                                                \
            for (; o + 4 <= o1; o += 4)                                                                  \
                F(gemv_k4)(WT, (const uint8_t *)W + (size_t)o * wrb, wrb, kvt_type_block_bytes(WT),      \
                           KQ_PF_ROWS * wrb, A, inner, y + o);                                           \
        for (; o + 4 <= o1; o += 4) KQ_ROWS(TILE, WT, 4, (const uint8_t *)W + (size_t)o * wrb);          \
        for (; o < o1; o++) KQ_ROWS(TILE, WT, 1, (const uint8_t *)W + (size_t)o * wrb);                  \
    }

_Static_assert(KVT_TR >= 1 && KVT_TR <= 4, "tile rows");

KQ_DEFINE_MM(mm_q8_0, F(tile_small), KVT_TYPE_Q8_0, 32)
KQ_DEFINE_MM(mm_q4_0, F(tile_small), KVT_TYPE_Q4_0, 32)
KQ_DEFINE_MM(mm_q4_1, F(tile_small), KVT_TYPE_Q4_1, 32)
KQ_DEFINE_MM(mm_q5_0, F(tile_small), KVT_TYPE_Q5_0, 32)
KQ_DEFINE_MM(mm_q5_1, F(tile_small), KVT_TYPE_Q5_1, 32)
KQ_DEFINE_MM(mm_q4_K, F(tile_k), KVT_TYPE_Q4_K, 256)
KQ_DEFINE_MM(mm_q5_K, F(tile_k), KVT_TYPE_Q5_K, 256)
KQ_DEFINE_MM(mm_q6_K, F(tile_k), KVT_TYPE_Q6_K, 256)
KQ_DEFINE_MM(mm_f32, F(tile_f), KVT_TYPE_F32, 1)
KQ_DEFINE_MM(mm_f16, F(tile_f), KVT_TYPE_F16, 1)
KQ_DEFINE_MM(mm_bf16, F(tile_f), KVT_TYPE_BF16, 1)

/* ---------------- single-row GEMV on the 4-row interleaved copy (kq_ilv_build) ----------------
 * The tile code of the row-major products with other strides, so the same bits. A group of 4 rows
 * [o, o + 4) (o % 4 == 0) is one contiguous stream instead of 4 rows wrb bytes apart, which the
 * hardware prefetchers follow: on an AVX2 Zen 3 (docs/architecture.md), Q4_K/Q6_K GEMV from DRAM went from
 * about 11.5 to 17.5 GB/s on one core (what the kernel does on weights in cache). o0 and o1 are
 * multiples of 4 within the copy's groups (kvt_matmul_packed runs the rest on the original rows). */
#define KQ_ILV_K(WT) F(gemv_k4)(WT, G, wbb, 4 * wbb, pfo, A, P->nb, y + o)
#define KQ_ILV_S(WT) F(tile_small_s)(WT, 4, 1, G, wbb, 4 * wbb, pfo, A, 0, P->nb, y + o, 0)
#define KQ_ILV_F(WT) F(tile_f_s)(WT, 4, 1, G, wbb, 4 * wbb, pfo, A, 0, P->n_in, y + o, 0)
static TGT void F(gemv_ilv)(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1) {
    const uint32_t wt = P->type;
    const size_t wbb = kq_ilv_block_bytes(P), wrb = (size_t)P->nb * wbb, pfo = KQ_PF_ROWS * wrb;
    const uint8_t *A = act;
    for (int64_t o = o0; o < o1; o += 4) {
        const uint8_t *G = P->ilv + (size_t)o * wrb; /* group o / 4 */
        switch (wt) {
        case KVT_TYPE_Q4_K: KQ_ILV_K(KVT_TYPE_Q4_K); break;
        case KVT_TYPE_Q5_K: KQ_ILV_K(KVT_TYPE_Q5_K); break;
        case KVT_TYPE_Q6_K: KQ_ILV_K(KVT_TYPE_Q6_K); break;
        case KVT_TYPE_Q8_0: KQ_ILV_S(KVT_TYPE_Q8_0); break;
        case KVT_TYPE_Q4_0: KQ_ILV_S(KVT_TYPE_Q4_0); break;
        case KVT_TYPE_Q4_1: KQ_ILV_S(KVT_TYPE_Q4_1); break;
        case KVT_TYPE_Q5_0: KQ_ILV_S(KVT_TYPE_Q5_0); break;
        case KVT_TYPE_Q5_1: KQ_ILV_S(KVT_TYPE_Q5_1); break;
#if !KVT_ZMM
        case KVT_TYPE_F16: KQ_ILV_F(KVT_TYPE_F16); break;
        case KVT_TYPE_BF16: KQ_ILV_F(KVT_TYPE_BF16); break;
#endif
        default: return;
        }
    }
}
#undef KQ_ILV_K
#undef KQ_ILV_S
#undef KQ_ILV_F

/* ---------------- packed GEMM (repacked 4-row interleaved weights, repack.c) ----------------
 * One tile = the 4 rows of a weight group × NR activation rows. With KVT_ZMM a 512-bit integer
 * vector holds two weight rows (PV = 2; the activation block is broadcast to both 256-bit halves),
 * otherwise a 256-bit vector holds one. Every 256-bit half computes exactly what the row-major
 * kernels above compute for that row: the same i32 per 4-weight lane (u8·s8 dots are exact
 * integers however formed), the same float fmadd per lane and block, the same horizontal sum;
 * K-quants the same exact integers and the same scalar float expression per super-block. */
#if KVT_ZMM
#if !KVT_VNNI
#error "the 512-bit packed kernels use vpdpbusd / vpdpwssd"
#endif
#define KQP_PV 2
#define KQP_VI __m512i
#define KQP_VF __m512
#else
#define KQP_PV 1
#define KQP_VI __m256i
#define KQP_VF __m256
#endif
#define KQP_NV (KQP_ROWS / KQP_PV)
/* Activation rows per packed register tile: 8 on the 512-bit path (a batched decode step of 8
 * rows then reads each weight group once, in one pass: 16 accumulators of 32 zmm registers), else
 * KVT_TR. Rows left over use tiles of 4 and then 1-3 rows of the same code; the tile size never
 * changes a result (each output element has its own accumulator and the same operations). */
#if KVT_ZMM
#define KQP_TR 8
#else
#define KQP_TR KVT_TR
#endif
/* Software prefetch of the weight stream, in weight groups ahead (KQP_PF_GROUPS × 4 rows; the
 * GEMV prefetch distance of the row-major kernels is 12 rows). Decode steps of a few rows read
 * every weight once from DRAM, so the loads are latency-bound like a GEMV; only the first row
 * tile of a group prefetches (later tiles find the group in L1/L2). Never changes results. */
#ifndef KQP_PF_GROUPS
#define KQP_PF_GROUPS 3
#endif
/* activation rows per row block: the block's quantized rows stay in L2 while every weight group of
 * the column range streams past them once (cache blocking for large n_in and long chunks) */
#ifndef KQP_ACT_BLOCK_BYTES
#define KQP_ACT_BLOCK_BYTES (1u << 20)
#endif

AI KQP_VI F(pload)(const uint8_t *p) {
#if KVT_ZMM
    return _mm512_loadu_si512((const void *)p);
#else
    return _mm256_loadu_si256((const __m256i *)p);
#endif
}
/* 32 activation bytes, in every 256-bit half */
AI KQP_VI F(pbcast)(const uint8_t *p) {
#if KVT_ZMM
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
#else
    return _mm256_loadu_si256((const __m256i *)p);
#endif
}
AI KQP_VI F(pset1_8)(char c) {
#if KVT_ZMM
    return _mm512_set1_epi8(c);
#else
    return _mm256_set1_epi8(c);
#endif
}
AI KQP_VF F(pset1_ps)(float f) {
#if KVT_ZMM
    return _mm512_set1_ps(f);
#else
    return _mm256_set1_ps(f);
#endif
}
/* the weight scale of each row of vector v, in its half: d[PV*v + h] in half h */
AI KQP_VF F(pdw)(const uint8_t *p, int v) {
#if KVT_ZMM
    const __m512i idx = _mm512_set_epi32(2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1,
                                         2 * v + 1, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps((const float *)p)));
#else
    return _mm256_broadcast_ss((const float *)p + v);
#endif
}
/* int16 scales of vector v for one 32-weight group: p holds [lo, hi] per row (PV rows); lanes 0-7
 * of a row's half get lo (weights 0-15), lanes 8-15 hi (weights 16-31) */
AI KQP_VI F(pscale)(const uint8_t *p) {
#if KVT_ZMM
    static const uint16_t idx16[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)idx16),
                                    _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)p)));
#else
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i m = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                       3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)u), m);
#endif
}
AI __m256 F(phalf_ps)(KQP_VF v, int h) {
#if KVT_ZMM
    return h == 0 ? _mm512_castps512_ps256(v) : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
#else
    (void)h;
    return v;
#endif
}
AI __m256i F(phalf_i)(KQP_VI v, int h) {
#if KVT_ZMM
    return h == 0 ? _mm512_castsi512_si256(v) : _mm512_extracti64x4_epi64(v, 1);
#else
    (void)h;
    return v;
#endif
}
/* [Σa, Σb, Σc, Σd] of four 8×i32 vectors (exact: integer adds in any order) */
AI __m128i F(hsum4_i32)(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* Converted activation block for the small-type packed tiles (KQP_CA bytes): float dx, float sx (0
 * for Q8_0 activations), 32 int8 x (on the 512-bit signed path stored as x^0x80, the u8 operand of
 * the offset dot). Converting once per row block instead of once per weight group takes the f16
 * conversion and the offset out of the inner loop; both conversions are exact. */
#define KQP_CA 40
AI void F(pconv_small)(const bool sgn, const uint8_t *A, size_t arb, int64_t r0, int64_t r1, int64_t nb, uint8_t *C) {
    const size_t abb = sgn ? 34 : 36, aqo = sgn ? 2 : 4;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pa = A + (size_t)r * arb + (size_t)b * abb;
            uint8_t *c = C + ((size_t)(r - r0) * (size_t)nb + (size_t)b) * KQP_CA;
            const float dx = F(h2f)(pa), sx = sgn ? 0.0f : F(h2f)(pa + 2);
            memcpy(c, &dx, 4);
            memcpy(c + 4, &sx, 4);
            __m256i x = _mm256_loadu_si256((const __m256i *)(pa + aqo));
#if KVT_ZMM
            if (sgn) x = _mm256_xor_si256(x, _mm256_set1_epi8((char)0x80));
#endif
            _mm256_storeu_si256((__m256i *)(c + 8), x);
        }
}

AI void F(ptile_small)(const bool sgn, const int NR, const uint8_t *G, size_t gbb, const uint8_t *C, size_t crb,
                       int64_t nb, const uint8_t *pf, float out[KQP_ROWS][KQP_TR]) {
    const size_t qo = sgn ? 16 : 32;
    KQP_VF acc[KQP_NV][KQP_TR];
    __m128 macc[KQP_TR];
    for (int j = 0; j < NR; j++) {
        macc[j] = _mm_setzero_ps();
        for (int v = 0; v < KQP_NV; v++) acc[v][j] = F(pset1_ps)(0.0f);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)b * gbb;
        if (pf) { /* the same block KQP_PF_GROUPS groups ahead (gbb <= 160: three lines cover it) */
            const char *q = (const char *)(pf + (size_t)b * gbb);
            _mm_prefetch(q, _MM_HINT_T0);
            _mm_prefetch(q + 64, _MM_HINT_T0);
            _mm_prefetch(q + 128, _MM_HINT_T0);
        }
        KQP_VI w[KQP_NV], wx[KQP_NV];
        KQP_VF dw[KQP_NV];
#pragma GCC unroll 8
        for (int v = 0; v < KQP_NV; v++) {
            w[v] = F(pload)(p + qo + (size_t)v * KQP_PV * 32);
            dw[v] = F(pdw)(p, v);
#if KVT_ZMM
            /* x·w = (x+128)·w − 128·Σw per lane: start each dot at −128·Σw, feed x^0x80 (u8) */
            if (sgn) wx[v] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), F(pset1_8)((char)0x80), w[v]));
#else
            if (sgn) wx[v] = _mm256_abs_epi8(w[v]);
#endif
            else wx[v] = w[v];
        }
        const __m128 m4 = sgn ? _mm_setzero_ps() : _mm_loadu_ps((const float *)(p + 16));
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            const uint8_t *c = C + (size_t)j * crb + (size_t)b * KQP_CA;
            float dxs;
            memcpy(&dxs, c, 4);
            const KQP_VF dx = F(pset1_ps)(dxs);
            const KQP_VI x = F(pbcast)(c + 8);
#pragma GCC unroll 8
            for (int v = 0; v < KQP_NV; v++) {
#if KVT_ZMM
                const __m512i d = sgn ? _mm512_dpbusd_epi32(wx[v], x, w[v]) : _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[v], x);
                acc[v][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dw[v], dx), acc[v][j]);
#else
                const __m256i d = sgn ? F(dot_us)(wx[v], _mm256_sign_epi8(x, w[v])) : F(dot_us)(w[v], x);
                acc[v][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dw[v], dx), acc[v][j]);
#endif
            }
            if (!sgn) {
                float sxs;
                memcpy(&sxs, c + 4, 4);
                macc[j] = _mm_add_ps(macc[j], _mm_mul_ps(m4, _mm_set1_ps(sxs)));
            }
        }
    }
    for (int j = 0; j < NR; j++) {
        float mc[4];
        _mm_storeu_ps(mc, macc[j]);
        for (int v = 0; v < KQP_NV; v++)
            for (int h = 0; h < KQP_PV; h++) {
                const int row = v * KQP_PV + h;
                out[row][j] = F(hsum_ps)(F(phalf_ps)(acc[v][j], h)) + mc[row];
            }
    }
}

AI void F(ptile_k)(const bool q6, const int NR, const uint8_t *G, const uint8_t *A, size_t arb, int64_t nb,
                   const uint8_t *pf, float out[KQP_ROWS][KQP_TR]) {
    float sumf[KQP_ROWS][KQP_TR];
    for (int i = 0; i < KQP_ROWS; i++)
        for (int j = 0; j < NR; j++) sumf[i][j] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)b * KQP_K_BYTES;
        if (pf) /* the same super-block KQP_PF_GROUPS groups ahead */
            for (size_t off = 0; off < KQP_K_BYTES; off += 64) _mm_prefetch((const char *)(pf + (size_t)b * KQP_K_BYTES + off), _MM_HINT_T0);
        const uint8_t *xb[KQP_TR];
        KQP_VI iacc[KQP_NV][KQP_TR];
        for (int j = 0; j < NR; j++) {
            xb[j] = A + (size_t)j * arb + (size_t)b * sizeof(blk_q8_K);
            for (int v = 0; v < KQP_NV; v++) iacc[v][j] = F(pset1_8)(0);
        }
        for (int g = 0; g < 8; g++) {
            KQP_VI q[KQP_NV], sc[KQP_NV];
#pragma GCC unroll 8
            for (int v = 0; v < KQP_NV; v++) {
                q[v] = F(pload)(p + KQP_K_Q + 128 * g + (size_t)v * KQP_PV * 32);
                sc[v] = F(pscale)(p + KQP_K_SC + 16 * g + (size_t)v * KQP_PV * 4);
            }
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) {
                const KQP_VI yv = F(pbcast)(xb[j] + 4 + 32 * g);
#pragma GCC unroll 8
                for (int v = 0; v < KQP_NV; v++)
#if KVT_ZMM
                    iacc[v][j] = _mm512_dpwssd_epi32(iacc[v][j], _mm512_maddubs_epi16(q[v], yv), sc[v]);
#else
                    iacc[v][j] = _mm256_add_epi32(iacc[v][j], _mm256_madd_epi16(_mm256_maddubs_epi16(q[v], yv), sc[v]));
#endif
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)(xb[j] + 4 + QK_K));
            __m256i iv[KQP_ROWS], mv[KQP_ROWS];
            for (int v = 0; v < KQP_NV; v++)
                for (int h = 0; h < KQP_PV; h++) {
                    const int row = v * KQP_PV + h;
                    iv[row] = F(phalf_i)(iacc[v][j], h);
                    mv[row] = _mm256_madd_epi16(bs, _mm256_loadu_si256((const __m256i *)(p + KQP_K_MV + 32 * row)));
                    if (q6) iv[row] = _mm256_sub_epi32(iv[row], _mm256_slli_epi32(mv[row], 5)); /* isum − 32·msum */
                }
            int32_t is[4], ms[4];
            _mm_storeu_si128((__m128i *)is, F(hsum4_i32)(iv[0], iv[1], iv[2], iv[3]));
            if (!q6) _mm_storeu_si128((__m128i *)ms, F(hsum4_i32)(mv[0], mv[1], mv[2], mv[3]));
            float dx, dw[4], dm[4];
            memcpy(&dx, xb[j], 4);
            memcpy(dw, p, 16);
            memcpy(dm, p + 16, 16);
            for (int i = 0; i < KQP_ROWS; i++) {
                if (q6) sumf[i][j] += (dw[i] * dx) * (float)is[i];
                else sumf[i][j] += (dw[i] * dx) * (float)is[i] - (dm[i] * dx) * (float)ms[i];
            }
        }
    }
    for (int i = 0; i < KQP_ROWS; i++)
        for (int j = 0; j < NR; j++) out[i][j] = sumf[i][j];
}

/* Row blocks of activations (cache blocking) × weight groups of [o0,o1) × tiles of KQP_TR rows;
 * columns of a group outside [o0,o1) are computed and dropped (results do not depend on it). */
#define KQP_STORE(NR)                                                                                   \
    for (int j_ = 0; j_ < (NR); j_++)                                                                   \
        for (int64_t c_ = c0; c_ < c1; c_++) y[(r + j_) * ldy + c_] = out[c_ - g * KQP_ROWS][j_]
#define KQ_DEFINE_PMM(NAME, TILE, CONV, ROWMAJOR)                                                        \
    static TGT void F(NAME)(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, \
                            int64_t o0, int64_t o1) {                                                   \
        const size_t arb = (size_t)kvt_type_row_bytes(kvt_vec_dot_type(P->type), (uint64_t)P->n_in);   \
        const size_t gbb = P->gbb, gs = (size_t)P->nb * gbb;                                            \
        const int64_t nb = P->nb;                                                                       \
        int64_t rb = (int64_t)(KQP_ACT_BLOCK_BYTES / arb) / KQP_TR * KQP_TR;                            \
        if (rb < KQP_TR) rb = KQP_TR;                                                                   \
        const uint8_t *A = act;                                                                         \
        float out[KQP_ROWS][KQP_TR];                                                                    \
        const size_t crb = CONV ? (size_t)nb * KQP_CA : arb;                                            \
        uint8_t *C = CONV ? kq_tls_scratch((size_t)rb * crb) : NULL;                                    \
        if (CONV && !C) { /* no scratch memory: the row-major kernel, same results */                   \
            ROWMAJOR(P, act, n_rows, y, ldy, o0, o1);                                                   \
            return;                                                                                     \
        }                                                                                               \
        (void)gbb;                                                                                      \
        for (int64_t r0 = 0; r0 < n_rows; r0 += rb) {                                                   \
            const int64_t r1 = r0 + rb < n_rows ? r0 + rb : n_rows;                                     \
            if (CONV) F(pconv_small)(CONV == 1, A, arb, r0, r1, nb, C);                                  \
            for (int64_t g = o0 / KQP_ROWS; g * KQP_ROWS < o1; g++) {                                   \
                const uint8_t *G = P->data + (size_t)g * gs;                                            \
                const int64_t c0 = o0 > g * KQP_ROWS ? o0 : g * KQP_ROWS;                               \
                const int64_t c1 = o1 < (g + 1) * KQP_ROWS ? o1 : (g + 1) * KQP_ROWS;                   \
                const uint8_t *PF = g + KQP_PF_GROUPS < P->ngroups /* first tile only; never past the buffer */ \
                                        ? G + (size_t)KQP_PF_GROUPS * gs : NULL;                                \
                int64_t r = r0;                                                                         \
                for (; r + KQP_TR <= r1; r += KQP_TR, PF = NULL) {                                      \
                    TILE(KQP_TR);                                                                       \
                    KQP_STORE(KQP_TR);                                                                  \
                }                                                                                       \
                for (; KQP_TR > 4 && r + 4 <= r1; r += 4, PF = NULL) {                                  \
                    TILE(KQ_MIN(4, KQP_TR));                                                            \
                    KQP_STORE(KQ_MIN(4, KQP_TR));                                                       \
                }                                                                                       \
                switch (r1 - r) {                                                                       \
                case 1: TILE(1); KQP_STORE(1); break;                                                   \
                case 2: TILE(KQ_MIN(2, KQP_TR)); KQP_STORE(KQ_MIN(2, KQP_TR)); break;                   \
                case 3: TILE(KQ_MIN(3, KQP_TR)); KQP_STORE(KQ_MIN(3, KQP_TR)); break;                   \
                default: break;                                                                         \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }
#define KQP_T_SS(NR) F(ptile_small)(true, NR, G, gbb, C + (size_t)(r - r0) * crb, crb, nb, PF, out)
#define KQP_T_SU(NR) F(ptile_small)(false, NR, G, gbb, C + (size_t)(r - r0) * crb, crb, nb, PF, out)
#define KQP_T_KM(NR) F(ptile_k)(false, NR, G, A + (size_t)r * arb, arb, nb, PF, out)
#define KQP_T_K6(NR) F(ptile_k)(true, NR, G, A + (size_t)r * arb, arb, nb, PF, out)
/* the row-major kernel of the packed type (used only if the scratch cannot be allocated) */
static TGT void F(pmm_rowmajor)(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy,
                                int64_t o0, int64_t o1) {
    switch (P->type) {
    case KVT_TYPE_Q8_0: F(mm_q8_0)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q4_0: F(mm_q4_0)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q5_0: F(mm_q5_0)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q4_1: F(mm_q4_1)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q5_1: F(mm_q5_1)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q4_K: F(mm_q4_K)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    case KVT_TYPE_Q5_K: F(mm_q5_K)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    default: F(mm_q6_K)(P->W, P->n_in, act, n_rows, y, ldy, o0, o1); break;
    }
}
KQ_DEFINE_PMM(pmm_small_s, KQP_T_SS, 1, F(pmm_rowmajor))
KQ_DEFINE_PMM(pmm_small_u, KQP_T_SU, 2, F(pmm_rowmajor))
KQ_DEFINE_PMM(pmm_km, KQP_T_KM, 0, F(pmm_rowmajor))
KQ_DEFINE_PMM(pmm_k6, KQP_T_K6, 0, F(pmm_rowmajor))

/* ---------------- dequantization (bit-identical to the reference) ---------------- */

AI void F(store_bytes_scaled)(float *dst, __m256i q, __m256 d) { /* 32 signed bytes × d */
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(dst + 0, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}
static TGT void F(dq_q8_0)(const void *src, float *dst, int64_t n) {
    const blk_q8_0 *x = src;
    for (int64_t i = 0; i < n / 32; i++)
        F(store_bytes_scaled)(dst + 32 * i, _mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_set1_ps(kq_h2f(x[i].d)));
}
static TGT void F(dq_q4_0)(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / 32; i++, p += 18) {
        uint16_t h;
        memcpy(&h, p, 2);
        F(store_bytes_scaled)(dst + 32 * i, F(unpack_small)(KVT_TYPE_Q4_0, p), _mm256_set1_ps(kq_h2f(h)));
    }
}
static TGT void F(dq_f16)(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + k))));
    for (; k < n; k++) dst[k] = kq_h2f(h[k]);
}
static TGT void F(dq_bf16)(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(
                                      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + k))), 16)));
    for (; k < n; k++) dst[k] = kvt_bf16_to_f32(h[k]);
}
/* unsigned bytes → 4×8 floats of a*q - b (mul then sub: same rounding as the reference) */
AI void F(store_affine)(float *dst, __m256i q, float a, float b) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(dst + 8 * k,
                         _mm256_sub_ps(_mm256_mul_ps(va, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]))), vb));
}
static TGT void F(dq_q4_K)(const void *src, float *dst, int64_t n) {
    const blk_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kq_h2f(x[i].d), dmin = kq_h2f(x[i].dmin);
        for (int g = 0; g < 8; g++) {
            uint8_t sc, m;
            kq_scale_min_k4(g, x[i].scales, &sc, &m);
            F(store_affine)(dst + QK_K * i + 32 * g, F(kgroup)(KVT_TYPE_Q4_K, (const uint8_t *)&x[i], g),
                            d * (float)sc, dmin * (float)m);
        }
    }
}
static TGT void F(dq_q6_K)(const void *src, float *dst, int64_t n) {
    const blk_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kq_h2f(x[i].d);
        for (int g = 0; g < 8; g++) {
            const __m256i q = _mm256_sub_epi8(F(kgroup)(KVT_TYPE_Q6_K, (const uint8_t *)&x[i], g), _mm256_set1_epi8(32));
            float *o = dst + QK_K * i + 32 * g;
            const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
            const __m256 d0 = _mm256_set1_ps(d * (float)x[i].scales[2 * g]);
            const __m256 d1 = _mm256_set1_ps(d * (float)x[i].scales[2 * g + 1]);
            _mm256_storeu_ps(o + 0, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
            _mm256_storeu_ps(o + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
            _mm256_storeu_ps(o + 24, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
        }
    }
}

/* ---------------- activation quantization (bytes identical to kvt_act_quantize_ref) ---------------- */

AI float F(hmax_ps)(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
/* 4 × 8 int32 (each in [-127,127]) → 32 int8 in order */
AI __m256i F(pack32)(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
/* f32 → f16 bits: F16C (round to nearest even, the same bits as kvt_f32_to_f16 for finite values:
 * tests/test_kernels.c test_f2h_matches) and the software conversion for inf/NaN (its NaN is 0x7e00) */
AI uint16_t F(f2h)(float f) {
    if (!isfinite(f)) return kvt_f32_to_f16(f);
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}
AI void F(aq_q8_block)(const float *x, uint8_t *out, bool with_sum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], am = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        am = _mm256_max_ps(am, _mm256_and_ps(v[k], absmask));
    }
    const float amax = F(hmax_ps)(am);
    /* kvt_act_quantize_ref: id = 127/amax (0 when not finite), ties to even (the MXCSR default) */
    const float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!isfinite(id)) id = 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
    const uint16_t dh = F(f2h)(d);
    memcpy(out, &dh, 2);
    _mm256_storeu_si256((__m256i *)(out + (with_sum ? 4 : 2)), F(pack32)(q[0], q[1], q[2], q[3]));
    if (with_sum) {
        const int32_t sum = F(hsum_i32)(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        const uint16_t sh = F(f2h)((float)sum * d);
        memcpy(out + 2, &sh, 2);
    }
}
static TGT void F(aq_q8_0)(const float *x, void *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++) F(aq_q8_block)(x + 32 * i, (uint8_t *)dst + 34 * i, false);
}
static TGT void F(aq_q8_1)(const float *x, void *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++) F(aq_q8_block)(x + 32 * i, (uint8_t *)dst + 36 * i, true);
}
/* Q8_K activations, the bytes of kvt_act_quantize_ref (quant_q8_K): amax by vector max (exact), the
 * first element of that magnitude found by a vector compare (its sign sets the scale, as the
 * reference's strict ">" scan does), q = clamp(round-to-even(iscale·x), ±127). With AVX-512 each
 * 16-weight bsum is one 128-bit lane of the stored qs: vpdpbusd against ones, two in-lane shuffles,
 * and a masked permute gathers the 16 sums (it was a scalar scan and two horizontal sums a 32, about
 * 1.4 cycles a float; an 8-row batched step quantizes 1.8 M floats on each thread). */
static TGT void F(aq_q8_K)(const float *x, void *dst, int64_t n) {
#if KVT_ZMM
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), ones = _mm512_set1_epi8(1);
    /* element 4L + j of a lane-reduced vector: lane j's sum (any element of that lane) */
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *v = x + QK_K * i;
        blk_q8_K *y = (blk_q8_K *)dst + i;
        __m512 am = _mm512_setzero_ps();
        for (int k = 0; k < QK_K; k += 16) am = _mm512_max_ps(am, _mm512_abs_ps(_mm512_loadu_ps(v + k)));
        const float amax = _mm512_reduce_max_ps(am);
        if (amax == 0.0f) {
            memset(y, 0, sizeof *y);
            continue;
        }
        const __m512 va = _mm512_set1_ps(amax);
        float max = 0.0f; /* first element of largest magnitude, with its sign */
        for (int k = 0; k < QK_K; k += 16) {
            const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + k)), va, _CMP_EQ_OQ);
            if (m) {
                max = v[k + __builtin_ctz(m)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 16) {
            const __m512i q = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(v + k)))));
            _mm_storeu_si128((__m128i *)(y->qs + k), _mm512_cvtepi32_epi8(q));
        }
        __m512i bs = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) { /* groups 4g..4g+3: the 4 lanes of qs[64g..64g+63] */
            __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512((const void *)(y->qs + 64 * g)));
            t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
            t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
            bs = _mm512_mask_permutexvar_epi32(bs, (__mmask16)(0xFu << (4 * g)), gather, t);
        }
        _mm256_storeu_si256((__m256i *)y->bsums, _mm512_cvtepi32_epi16(bs));
        y->d = 1.0f / iscale;
    }
#else
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *v = x + QK_K * i;
        blk_q8_K *y = (blk_q8_K *)dst + i;
        __m256 am = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8) am = _mm256_max_ps(am, _mm256_and_ps(_mm256_loadu_ps(v + k), absmask));
        const float amax = F(hmax_ps)(am);
        if (amax == 0.0f) {
            memset(y, 0, sizeof *y);
            continue;
        }
        const __m256 va = _mm256_set1_ps(amax);
        float max = 0.0f; /* first element of largest magnitude, with its sign */
        for (int k = 0; k < QK_K; k += 8) {
            const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(v + k), absmask), va, _CMP_EQ_OQ));
            if (m) {
                max = v[k + __builtin_ctz((unsigned)m)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
        for (int g = 0; g < QK_K / 32; g++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(v + 32 * g + 8 * k)))));
            _mm256_storeu_si256((__m256i *)(y->qs + 32 * g), F(pack32)(q[0], q[1], q[2], q[3]));
            y->bsums[2 * g] = (int16_t)F(hsum_i32)(_mm256_add_epi32(q[0], q[1]));
            y->bsums[2 * g + 1] = (int16_t)F(hsum_i32)(_mm256_add_epi32(q[2], q[3]));
        }
        y->d = 1.0f / iscale;
    }
#endif
}

/* ---------------- f32 helpers ---------------- */

static TGT float F(dot_f32)(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    for (; k + 8 <= n; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    float s = F(hsum_ps)(_mm256_add_ps(acc0, acc1));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}
static TGT void F(axpy_f32)(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
    for (; k < n; k++) y[k] += a * x[k];
}

static void F(fill_table)(kq_table *t) {
    t->matmul[KVT_TYPE_Q8_0] = F(mm_q8_0);
    t->matmul[KVT_TYPE_Q4_0] = F(mm_q4_0);
    t->matmul[KVT_TYPE_Q4_1] = F(mm_q4_1);
    t->matmul[KVT_TYPE_Q5_0] = F(mm_q5_0);
    t->matmul[KVT_TYPE_Q5_1] = F(mm_q5_1);
    t->matmul[KVT_TYPE_Q4_K] = F(mm_q4_K);
    t->matmul[KVT_TYPE_Q5_K] = F(mm_q5_K);
    t->matmul[KVT_TYPE_Q6_K] = F(mm_q6_K);
    t->matmul[KVT_TYPE_F32] = F(mm_f32);
    t->matmul[KVT_TYPE_F16] = F(mm_f16);
    t->matmul[KVT_TYPE_BF16] = F(mm_bf16);
    t->pmatmul[KQP_SMALL_S] = F(pmm_small_s);
    t->pmatmul[KQP_SMALL_U] = F(pmm_small_u);
    t->pmatmul[KQP_KM] = F(pmm_km);
    t->pmatmul[KQP_K6] = F(pmm_k6);
    t->gemv_ilv = F(gemv_ilv);
    t->dequant[KVT_TYPE_Q8_0] = F(dq_q8_0);
    t->dequant[KVT_TYPE_Q4_0] = F(dq_q4_0);
    t->dequant[KVT_TYPE_F16] = F(dq_f16);
    t->dequant[KVT_TYPE_BF16] = F(dq_bf16);
    t->dequant[KVT_TYPE_Q4_K] = F(dq_q4_K);
    t->dequant[KVT_TYPE_Q6_K] = F(dq_q6_K);
    t->act_quant[KVT_TYPE_Q8_0] = F(aq_q8_0);
    t->act_quant[KVT_TYPE_Q8_1] = F(aq_q8_1);
    t->act_quant[KVT_TYPE_Q8_K] = F(aq_q8_K);
    t->dot_f32 = F(dot_f32);
    t->axpy_f32 = F(axpy_f32);
}
