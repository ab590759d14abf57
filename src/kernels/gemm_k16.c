/*
 * gemm_k16.c — 16-row interleaved layout and AVX-512 VNNI prefill GEMM for the K-quants (Q4_K,
 * Q5_K: kvt_packed kind KQP_KM; Q6_K: KQP_K6), and the scalar reference of the kernel's arithmetic.
 *
 * Layout (kvt_packed.k16, built at create time when the ISA in use is AVX-512 VNNI or AMX; it
 * replaces the 4-row `data` for these kinds): outputs in groups of K16_ROWS = 16 (the last padded
 * with zero rows), per group its super-blocks in order, one group-block (K16_GBB bytes) =
 *   float dw[16]; float dm[16] (0 for Q6_K);
 *   int8 sc[16 halves][16 rows]          (the scale of each 16-weight half; Q4/5_K: both halves = the
 *                                          6-bit sub-block scale)
 *   int16 mv[8][16 rows][2]              (the bsums partners mv[2k], mv[2k+1] as pairs: Q4/5_K the
 *                                          6-bit min of the half, Q6_K its scale)
 *   uint8 q[8 sub-blocks][8 k4][16 rows][4]  (VNNI 4-byte interleave: one zmm = 4 consecutive weights
 *                                          of each of the 16 rows; Q6_K stored unsigned, q + 32)
 * 312 bytes per row and super-block (the 4-row layout: 328).
 *
 * Kernel: a tile is the 16 rows of a group × up to K16_NC activation rows. Per super-block and
 * 16-weight half (Q6_K) or 32-weight sub-block (Q4/5_K), vpdpbusd with the activation's 4 bytes
 * broadcast accumulates the exact int32 dot of every row (lane) from zero; vpmulld by the lane's
 * scale and vpaddd give isum = Σ sc·q·x, vpdpwssd over the q8_K bsums gives msum = Σ mv·bsums —
 * the same integers as ptile_k / the row-major kernels (exact, whatever the order). Then, lane-wise
 * with separate mul/sub/add (FP contraction off: -std=c11 / the pragma), the same float expression
 * in the same order as kvt_matmul_rows_ref:
 *   Q4_K/Q5_K  sumf += (dw*dx)*(float)isum - (dm*dx)*(float)msum
 *   Q6_K       sumf += (dw*dx)*(float)(isum - 32*msum)
 * so kvt_matmul_packed equals kvt_matmul_rows bit for bit (tests/test_kernels.c).
 *
 * Decode and batched steps of up to N16_MAX_ROWS rows read another 16-row layout, kvt_packed.n16
 * (kernels_internal.h), which keeps the weights as nibbles: the byte layout above holds 2.2x the
 * file's bytes, and a decode step streams every weight byte once. Q4_K per group and super-block
 * (N16_GBB_Q4 = 2368 bytes, 148 a row and super-block against the file's 144): the file's f16 d and
 * dmin, the 6-bit scales and min pairs as bytes, and q[32 steps][16 rows][4] with byte j of step s
 * holding weight 8s+j (low nibble) and 8s+4+j (high); Q5_K adds a plane of fifth bits. So one zmm
 * of q gives two vpdpbusd operands against 4 contiguous activation bytes each, for 16 rows. Groups
 * are stored in tiles of N16_NG (64 rows), a tile's group-blocks side by side per super-block, and
 * the kernel runs a tile's groups at once (n16_tile): one sequential stream, prefetched a fixed
 * distance ahead. The integers (isum = Σ sc·Σq·x, msum = Σ mn·bsums) are exact and the float
 * expression is the one above, so it equals the GEMM and the row-major kernels bit for bit; it
 * replaces the 4-row GEMV copy (kq_ilv_build) of these types under AVX-512 VNNI and AMX. Q6_K
 * (N16_GBB_Q6 = 3392 bytes, 212 a row and super-block against the file's 210): its f16 d, the int8
 * scale of each 16-weight half, the low 4 bits of q + 32 in Q4_K's q plane and the top 2 bits in a
 * plane of bit pairs, two vectors a sub-block (n16_sub6 moves a pair to bits 4-5 with a shift and a
 * ternary-logic merge). Its isum − 32·msum is formed per half by starting each lane at −32·bsum, so
 * the float expression is Q6_K's above. In cache it multiplies at 2.4x the 4-row copy's rate, which
 * was bound by the unpacking of the file's ql/qh bytes (bench/results/zen5-2026-12-06d.md).
 *
 * Ownership: the layouts are owned by the kvt_packed (freed by kvt_packed_free), 64-byte aligned.
 */
#include "kernels_internal.h"

#include <stdlib.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif


size_t kq_k16_bytes(const kvt_packed *P) {
    return (size_t)((P->n_out + K16_ROWS - 1) / K16_ROWS) * (size_t)P->nb * K16_GBB;
}

uint8_t *kq_k16_pack(const kvt_packed *P) {
    const int64_t ng = (P->n_out + K16_ROWS - 1) / K16_ROWS;
    uint64_t bytes;
    if (!kvt_mul_ok((uint64_t)ng * (uint64_t)P->nb, K16_GBB, &bytes) || bytes > SIZE_MAX / 2) return NULL;
    uint8_t *L = kq_packed_alloc((size_t)bytes); /* zeroed: padding rows are 0 */
    if (!L) return NULL;
    const size_t wrb = (size_t)kvt_type_row_bytes(P->type, (uint64_t)P->n_in), wbb = kvt_type_block_bytes(P->type);
    for (int64_t o = 0; o < P->n_out; o++)
        for (int64_t b = 0; b < P->nb; b++) {
            uint8_t q[QK_K];
            float d, dm;
            int16_t sc2[8][2], mv[16];
            kq_unpack_k(P->type, (const uint8_t *)P->W + (size_t)o * wrb + (size_t)b * wbb, q, &d, &dm, sc2, mv);
            uint8_t *p = L + ((size_t)(o / K16_ROWS) * (size_t)P->nb + (size_t)b) * K16_GBB;
            const int n = (int)(o % K16_ROWS);
            memcpy(p + 4 * n, &d, 4);
            memcpy(p + K16_DM + 4 * n, &dm, 4);
            for (int h = 0; h < 16; h++) p[K16_SC + 16 * h + n] = (uint8_t)(int8_t)sc2[h / 2][h % 2];
            for (int k = 0; k < 8; k++) memcpy(p + K16_MV + 64 * k + 4 * n, mv + 2 * k, 4);
            for (int k4 = 0; k4 < QK_K / 4; k4++) memcpy(p + K16_Q + 64 * k4 + 4 * n, q + 4 * k4, 4);
        }
    return L;
}

size_t kq_n16_bytes(const kvt_packed *P) {
    return P->n16 ? (size_t)((P->n_out + K16_ROWS - 1) / K16_ROWS) * (size_t)kq_n16_nblk(P) * kq_n16_gbb(P) : 0;
}

bool kq_n16_build(kvt_packed *P) {
    const bool small = kq_n16_pairs(P);
    if (P->kind != KQP_KM && P->kind != KQP_K6 && !(small && P->nb % 2 == 0)) return false;
    const int64_t ng = (P->n_out + K16_ROWS - 1) / K16_ROWS;
    const size_t gbb = kq_n16_gbb(P);
    uint64_t bytes;
    if (!kvt_mul_ok((uint64_t)ng * (uint64_t)kq_n16_nblk(P), gbb, &bytes) || bytes > SIZE_MAX / 2) return false;
    uint8_t *L = kq_packed_alloc((size_t)bytes); /* zeroed: padding rows are 0 (scales 0) */
    if (!L) return false;
    if (small) {
        kq_n16_s_build(P, L);
        P->n16 = L;
        return true;
    }
    const size_t wrb = (size_t)kvt_type_row_bytes(P->type, (uint64_t)P->n_in), wbb = kvt_type_block_bytes(P->type);
    if (P->kind == KQP_K6) {
        for (int64_t o = 0; o < P->n_out; o++)
            for (int64_t b = 0; b < P->nb; b++) {
                const uint8_t *src = (const uint8_t *)P->W + (size_t)o * wrb + (size_t)b * wbb;
                uint8_t *p = L + kq_n16_off(P, o / K16_ROWS, b);
                const int n = (int)(o % K16_ROWS);
                uint8_t q[QK_K]; /* q + 32 */
                float d, dm;
                int16_t sc2[8][2], mv[16];
                kq_unpack_k(P->type, src, q, &d, &dm, sc2, mv);
                memcpy(p + 2 * n, src + 208, 2); /* f16 d */
                for (int h = 0; h < 16; h++) p[N16_SC + 16 * h + n] = src[192 + h];
                for (int s = 0; s < 32; s++) {
                    const int g = s / 4, k = (s % 4) / 2, u = s % 2;
                    for (int j = 0; j < 4; j++) {
                        const int wl = 8 * s + j, wh = wl + 4;
                        p[N16_Q + 64 * s + 4 * n + j] = (uint8_t)((q[wl] & 15) | (q[wh] & 15) << 4);
                        p[N16_QH + 128 * g + 64 * k + 4 * n + j] |= (uint8_t)((q[wl] >> 4) << (2 * u) | (q[wh] >> 4) << (4 + 2 * u));
                    }
                }
            }
        P->n16 = L;
        return true;
    }
    const bool q5 = P->type == KVT_TYPE_Q5_K;
    const size_t qso = q5 ? 48 : 16; /* qs in the block (Q5_K: after the 32 bytes of fifth bits) */
    for (int64_t o = 0; o < P->n_out; o++)
        for (int64_t b = 0; b < P->nb; b++) {
            const uint8_t *src = (const uint8_t *)P->W + (size_t)o * wrb + (size_t)b * wbb;
            uint8_t *p = L + kq_n16_off(P, o / K16_ROWS, b);
            const int n = (int)(o % K16_ROWS);
            memcpy(p + 2 * n, src, 2);              /* f16 d */
            memcpy(p + N16_DM + 2 * n, src + 2, 2); /* f16 dmin */
            for (int g = 0; g < 8; g++) {
                uint8_t sc, mn;
                kq_scale_min_k4(g, src + 4, &sc, &mn);
                p[N16_SC + 16 * g + n] = sc;
                p[N16_MN + 32 * (g / 2) + 2 * n + (g % 2)] = mn;
                /* weight 32g + e: nibble g & 1 of qs[32 (g / 2) + e]; Q5_K fifth bit g of qh[e] */
                const uint8_t *qs = src + qso + 32 * (g / 2);
                const int sh = 4 * (g & 1);
                for (int t = 0; t < 4; t++) {
                    uint8_t *dq = p + N16_Q + 64 * (4 * g + t) + 4 * n;
                    for (int j = 0; j < 4; j++) {
                        const int el = 8 * t + j, eh = el + 4;
                        dq[j] = (uint8_t)(((qs[el] >> sh) & 15) | ((qs[eh] >> sh) & 15) << 4);
                        if (q5)
                            p[N16_QH + 64 * g + 4 * n + j] |= (uint8_t)(((src[16 + el] >> g) & 1) << t | ((src[16 + eh] >> g) & 1) << (4 + t));
                    }
                }
            }
        }
    P->n16 = L;
    return true;
}

/* Weight e (0..255) of lane n in the n16 group-block p of a K-quant: Q4_K its 4 bits, Q5_K 5, Q6_K q + 32. */
static int n16_weight(uint32_t type, const uint8_t *p, int n, int e) {
    const int s = e / 8, j = e % 4, hi = (e / 4) % 2; /* step s, byte j, high nibble */
    const uint8_t v = p[N16_Q + 64 * s + 4 * n + j];
    const int lo4 = hi ? v >> 4 : v & 15;
    if (type == KVT_TYPE_Q5_K) return lo4 | ((p[N16_QH + 64 * (s / 4) + 4 * n + j] >> (4 * hi + s % 4)) & 1) << 4;
    if (type == KVT_TYPE_Q6_K) return lo4 | ((p[N16_QH + 64 * (s / 2) + 4 * n + j] >> (4 * hi + 2 * (s % 2))) & 3) << 4;
    return lo4;
}

/* The n16 GEMV's arithmetic in scalar C (any CPU): the integers of kq_k16_ref (per 16-weight half: the
 * dot times the half's scale, and the bsum times its min, Q6_K its scale), the same float expression. */
void kq_n16_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1) {
    if (P->type == KVT_TYPE_Q4_0 || P->type == KVT_TYPE_Q5_0) {
        kq_n16_s_ref(P, act, y, o0, o1);
        return;
    }
    if (P->kind == KQP_SMALL_U) {
        kq_n16_u_ref(P, act, y, o0, o1);
        return;
    }
    const bool q6 = P->type == KVT_TYPE_Q6_K;
    for (int64_t o = o0; o < o1; o++) {
        const int n = (int)(o % K16_ROWS);
        float sumf = 0.0f;
        for (int64_t b = 0; b < P->nb; b++) {
            const uint8_t *p = P->n16 + kq_n16_off(P, o / K16_ROWS, b);
            const blk_q8_K *xa = (const blk_q8_K *)act + b;
            int32_t isum = 0, msum = 0;
            for (int h = 0; h < 16; h++) {
                int32_t dot = 0;
                for (int e = 16 * h; e < 16 * h + 16; e++) dot += n16_weight(P->type, p, n, e) * xa->qs[e];
                const int32_t sc = q6 ? (int8_t)p[N16_SC + 16 * h + n] : p[N16_SC + 16 * (h / 2) + n];
                const int32_t mn = q6 ? sc : p[N16_MN + 32 * (h / 4) + 2 * n + (h / 2) % 2];
                isum += dot * sc;
                msum += mn * xa->bsums[h];
            }
            const float dw = kq_h2f(kq_rd16(p + 2 * n));
            if (q6) sumf += (dw * xa->d) * (float)(isum - 32 * msum);
            else sumf += (dw * xa->d) * (float)isum - (kq_h2f(kq_rd16(p + N16_DM + 2 * n)) * xa->d) * (float)msum;
        }
        y[o] = sumf;
    }
}

/* The kernel's arithmetic in scalar C (any CPU): the same integers, the same float expression. */
void kq_k16_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const size_t arb = (size_t)P->nb * sizeof(blk_q8_K);
    const bool q6 = P->kind == KQP_K6;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t o = o0; o < o1; o++) {
            const int n = (int)(o % K16_ROWS);
            float sumf = 0.0f;
            for (int64_t b = 0; b < P->nb; b++) {
                const uint8_t *p = P->k16 + ((size_t)(o / K16_ROWS) * (size_t)P->nb + (size_t)b) * K16_GBB;
                const blk_q8_K *xa = (const blk_q8_K *)((const uint8_t *)act + (size_t)r * arb) + b;
                int32_t isum = 0, msum = 0;
                for (int h = 0; h < 16; h++) { /* 16-weight halves: 4 k4 steps each */
                    int32_t dot = 0;
                    for (int k4 = 4 * h; k4 < 4 * h + 4; k4++)
                        for (int j = 0; j < 4; j++) dot += (int32_t)p[K16_Q + 64 * k4 + 4 * n + j] * xa->qs[4 * k4 + j];
                    isum += dot * (int8_t)p[K16_SC + 16 * h + n];
                }
                for (int k = 0; k < 8; k++) {
                    int16_t mv[2];
                    memcpy(mv, p + K16_MV + 64 * k + 4 * n, 4);
                    msum += (int32_t)mv[0] * xa->bsums[2 * k] + (int32_t)mv[1] * xa->bsums[2 * k + 1];
                }
                float dw, dm;
                memcpy(&dw, p + 4 * n, 4);
                memcpy(&dm, p + K16_DM + 4 * n, 4);
                if (q6) sumf += (dw * xa->d) * (float)(isum - 32 * msum);
                else sumf += (dw * xa->d) * (float)isum - (dm * xa->d) * (float)msum;
            }
            y[r * ldy + o] = sumf;
        }
}

#if KVT_X86
#include <immintrin.h>

#define K16_TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define K16_AI static inline __attribute__((always_inline)) K16_TGT
/* activation rows per register tile: an int32 dot and an int32 isum per row in registers (16 of the
 * 32 zmm), the float sumf on the stack (updated once a super-block); 12 measured slower */
#define K16_NC 8
/* activation rows per row block: the block's q8_K rows stay in L2 while the weight groups of the
 * column range stream past them once */
#define K16_ACT_BLOCK_BYTES (1u << 20)

/* The 4 bytes at x in every 32-bit lane (vpbroadcastd from memory: on Zen 5 a vpdpbusd with an
 * m32bcst operand issues at less than half the rate of vpbroadcastd + vpdpbusd on registers). */
K16_AI __m512i k16_bcast(const uint8_t *x) {
    uint32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32((int)v);
}
/* acc += dot of the u8 weights w with 4 activation int8 at x broadcast to every lane (vpdpbusd with
 * an m32bcst operand: GCC does not fold _mm512_set1_epi32 into it); likewise vpdpwssd for int16 pairs */
typedef uint32_t k16_u32 __attribute__((may_alias, aligned(1)));
K16_AI __m512i k16_dpbusd(__m512i acc, __m512i w, const uint8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const k16_u32 *)x));
    return acc;
}
K16_AI __m512i k16_dpwssd(__m512i acc, __m512i w, const uint8_t *x) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const k16_u32 *)x));
    return acc;
}

/* One tile: 16 rows of the group at G × NC activation q8_K rows at A (stride arb); y rows of the tile
 * get lanes [c0, c1) of the group (masked stores: nothing else is written). */
K16_AI void k16_tile(const bool q6, const int NC, const uint8_t *G, const uint8_t *A, size_t arb, int64_t nb,
                     float *y, int64_t ldy, __mmask16 keep) {
    float sumf[K16_NC][K16_ROWS] __attribute__((aligned(64))); /* in memory: updated once a super-block */
#pragma GCC unroll 16
    for (int j = 0; j < NC; j++) _mm512_store_ps(sumf[j], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)b * K16_GBB;
        const uint8_t *xb[K16_NC];
        __m512i isum[K16_NC], dot[K16_NC];
#pragma GCC unroll 16
        for (int j = 0; j < NC; j++) {
            xb[j] = A + (size_t)j * arb + (size_t)b * sizeof(blk_q8_K);
            isum[j] = _mm512_setzero_si512();
        }
        /* q6: 16 halves of 4 k4 steps (a scale each); else 8 sub-blocks of 8 steps (scale of half 2g) */
        const int nh = q6 ? 16 : 8, hs = q6 ? 4 : 8;
        for (int h = 0; h < nh; h++) {
#pragma GCC unroll 16
            for (int j = 0; j < NC; j++) dot[j] = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int k = 0; k < hs; k++) {
                const int k4 = h * hs + k;
                const __m512i w = _mm512_load_si512((const void *)(p + K16_Q + 64 * k4));
#pragma GCC unroll 16
                for (int j = 0; j < NC; j++) dot[j] = k16_dpbusd(dot[j], w, xb[j] + 4 + 4 * k4);
            }
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + K16_SC + 16 * (q6 ? h : 2 * h))));
#pragma GCC unroll 16
            for (int j = 0; j < NC; j++) isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(dot[j], sc));
        }
#pragma GCC unroll 16
        for (int j = 0; j < NC; j++) dot[j] = _mm512_setzero_si512(); /* msum = Σ mv·bsums */
#pragma GCC unroll 16
        for (int k = 0; k < 8; k++) {
            const __m512i mv = _mm512_load_si512((const void *)(p + K16_MV + 64 * k));
#pragma GCC unroll 16
            for (int j = 0; j < NC; j++) dot[j] = k16_dpwssd(dot[j], mv, xb[j] + 4 + QK_K + 4 * k);
        }
        const __m512 dw = _mm512_load_ps((const float *)p);
        const __m512 dm = _mm512_load_ps((const float *)(p + K16_DM));
#pragma GCC unroll 16
        for (int j = 0; j < NC; j++) {
            float dxs;
            memcpy(&dxs, xb[j], 4);
            const __m512 dx = _mm512_set1_ps(dxs);
            if (q6) {
                const __m512i is = _mm512_sub_epi32(isum[j], _mm512_slli_epi32(dot[j], 5)); /* isum − 32·msum */
                _mm512_store_ps(sumf[j], _mm512_add_ps(_mm512_load_ps(sumf[j]), _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is))));
            } else {
                const __m512 a = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[j]));
                const __m512 m = _mm512_mul_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(dot[j]));
                _mm512_store_ps(sumf[j], _mm512_add_ps(_mm512_load_ps(sumf[j]), _mm512_sub_ps(a, m)));
            }
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NC; j++) _mm512_mask_storeu_ps(y + (int64_t)j * ldy, keep, _mm512_load_ps(sumf[j]));
}

/* The lanes of the group of outputs [base, base + 16) that fall in [o0, o1). */
static inline __mmask16 k16_cols(int64_t base, int64_t o0, int64_t o1) {
    const int64_t c0 = o0 > base ? o0 : base, c1 = o1 < base + K16_ROWS ? o1 : base + K16_ROWS;
    return (__mmask16)(((1u << (c1 - base)) - 1u) & ~((1u << (c0 - base)) - 1u));
}

K16_AI void k16_pmm(const bool q6, const kvt_packed *P, const void *act, int64_t n_rows, float *y,
                    int64_t ldy, int64_t o0, int64_t o1) {
    const size_t arb = (size_t)P->nb * sizeof(blk_q8_K), gs = (size_t)P->nb * K16_GBB;
    const int64_t nb = P->nb;
    int64_t rb = (int64_t)(K16_ACT_BLOCK_BYTES / arb) / K16_NC * K16_NC;
    if (rb < K16_NC) rb = K16_NC;
    const uint8_t *A = act;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rb) {
        const int64_t r1 = r0 + rb < n_rows ? r0 + rb : n_rows;
        for (int64_t g = o0 / K16_ROWS; g * K16_ROWS < o1; g++) {
            const uint8_t *G = P->k16 + (size_t)g * gs;
            const int64_t base = g * K16_ROWS;
            const __mmask16 keep = k16_cols(base, o0, o1);
            int64_t r = r0;
#define K16_T(NC) k16_tile(q6, NC, G, A + (size_t)r * arb, arb, nb, y + r * ldy + base, ldy, keep)
            for (; r + K16_NC <= r1; r += K16_NC) K16_T(K16_NC);
            if (r + 4 <= r1) K16_T(4), r += 4;
            if (r + 2 <= r1) K16_T(2), r += 2;
            if (r < r1) K16_T(1), r += 1;
#undef K16_T
        }
    }
}

/* One weight vector's two vpdpbusd operands (lo: weights 8st..8st+3 of each lane's row, hi: 8st+4..)
 * against the 4 activation bytes of each of the NR rows: dot (and doth, with two chains) of group i. */
K16_AI void n16_dots(const int NR, const bool two, const int i, const __m512i lo, const __m512i hi,
                     const uint8_t *const *xq, const int st, __m512i *dot, __m512i *doth) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        const int k = i * NR + r;
        dot[k] = _mm512_dpbusd_epi32(dot[k], lo, k16_bcast(xq[r] + 4 + 8 * st));
        if (two) doth[k] = _mm512_dpbusd_epi32(doth[k], hi, k16_bcast(xq[r] + 8 + 8 * st));
        else dot[k] = _mm512_dpbusd_epi32(dot[k], hi, k16_bcast(xq[r] + 8 + 8 * st));
    }
}
/* isum += the exact dots times each lane's scale, the int8 scales of NG groups at sc, gbb apart
 * (Q4_K/Q5_K's 6-bit scales read the same sign- or zero-extended). */
K16_AI void n16_scaled(const int NG, const int NR, const bool two, const uint8_t *sc, size_t gbb, const __m512i *dot,
                       const __m512i *doth, __m512i *isum) {
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++) {
        const __m512i s = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(sc + (size_t)i * gbb)));
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const int k = i * NR + r;
            const __m512i d = two ? _mm512_add_epi32(dot[k], doth[k]) : dot[k];
            isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(d, s));
        }
    }
}

/* Sub-block g (32 weights a row) of one super-block for n16_tile: isum[i·NR + r] += scale ×
 * the exact int32 dot of group i's 16 rows with activation row r. Up to 8 (group, row) pairs keep the
 * low and high nibbles in separate accumulators (16 independent vpdpbusd chains); 16 pairs (4 groups
 * × 4 rows) have 16 chains with one accumulator each, and every weight vector's nibble split and
 * every activation broadcast then serves 4 pairs (the integers are the same). */
K16_AI void n16_sub(const bool q5, const int NG, const int NR, const uint8_t *p, size_t gbb, const uint8_t *const *xq,
                    const int g, __m512i *isum) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const bool two = NG * NR <= 8;
    __m512i dot[16], doth[8], h[4];
#pragma GCC unroll 16
    for (int k = 0; k < NG * NR; k++) dot[k] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        if (two && k < NG * NR) doth[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++)
        if (q5) h[i] = _mm512_load_si512((const void *)(p + (size_t)i * gbb + N16_QH + 64 * g));
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const int st = 4 * g + t;
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++) {
            const __m512i v = _mm512_load_si512((const void *)(p + (size_t)i * gbb + N16_Q + 64 * st));
            __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (q5) { /* bit t / 4+t of each byte to bit 4 (16-bit shifts: the masked bit stays in its byte) */
                lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h[i], 4 - t), b4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h[i], t), b4));
            }
            n16_dots(NR, two, i, lo, hi, xq, st, dot, doth);
        }
    }
    n16_scaled(NG, NR, two, p + N16_SC + 16 * g, gbb, dot, doth, isum);
}

/* Q6_K's sub-block g for n16_tile: per 16-weight half h = 2g + k, each (group, row) pair's lanes start
 * from -32·bsums[h] of the row, vpdpbusd adds the 6-bit weights (q + 32: the low nibbles of the q plane
 * with the two top bits of the qh plane moved to bits 4-5) against the activations, and the lane's
 * scale multiplies that (vpmulld). Σ sc·(Σ(q+32)·x − 32·bsum) is exactly kq_k16_ref's isum − 32·msum. */
K16_AI void n16_sub6(const int NG, const int NR, const uint8_t *p, size_t gbb, const uint8_t *const *xq, const int g,
                     __m512i *isum) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const bool two = NG * NR <= 8;
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        const int h = 2 * g + k;
        __m512i dot[16], doth[8];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m512i c0 = _mm512_set1_epi32(-32 * (int32_t)((const blk_q8_K *)xq[r])->bsums[h]);
#pragma GCC unroll 4
            for (int i = 0; i < NG; i++) {
                dot[i * NR + r] = c0;
                if (two) doth[i * NR + r] = _mm512_setzero_si512();
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++) {
            const __m512i hb = _mm512_load_si512((const void *)(p + (size_t)i * gbb + N16_QH + 64 * h));
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                const int st = 2 * h + u;
                const __m512i v = _mm512_load_si512((const void *)(p + (size_t)i * gbb + N16_Q + 64 * st));
                /* A | (B & C) (imm 0xF8): the nibble, and bits 4-5 from the moved pair (16-bit shifts:
                 * what crosses from the neighbouring byte lands outside 0x30) */
                const __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), _mm512_slli_epi16(hb, 4 - 2 * u), m30, 0xF8);
                const __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                                             u ? _mm512_srli_epi16(hb, 2) : hb, m30, 0xF8);
                n16_dots(NR, two, i, lo, hi, xq, st, dot, doth);
            }
        }
        n16_scaled(NG, NR, two, p + N16_SC + 16 * h, gbb, dot, doth, isum);
    }
}

/* Decode and small batches (1..N16_MAX_ROWS activation rows): the NG groups of a tile × NR activation
 * rows per register tile (NG <= 4, NR 1, 2 or 4). Each loaded weight vector gives two
 * vpdpbusd operands (low nibbles against x[8s..8s+3] of each row, high against x[8s+4..8s+7],
 * broadcast from memory) for all NR rows; per sub-block the exact int32 dot from zero times the scale
 * (vpmulld); msum by vpdpwssd of the min pairs against the pairs of sub-block bsums. G: the first
 * group's super-block 0; groups gbb apart, super-blocks bs apart. With pf, each super-block
 * prefetches its share of the layout's stream N16_PFD bytes ahead (pf bytes a super-block), below
 * pend, an eighth before each sub-block.
 * The sub-block loop stays rolled (n16_sub): unrolled, GCC kept the 8 sub-blocks' dot products live
 * at once and spilled them to a 10 KiB stack frame. Rolled, with the prefetches spread (at the top of
 * the super-block they were a burst of ~150 that the loads waited behind), Q4_K ran 1.3-1.8x the
 * MAC/s in cache and llama-1b decode 1.13x, its 8-row steps 1.3-1.4x
 * (bench/results/zen5-2026-12-05c.md). 4 rows take all 4 groups with one accumulator a pair (n16_sub)
 * rather than 2 groups a pass: llama-1b Q4_K/Q5_K 4- and 8-row steps 0.78-0.94x the time
 * (bench/results/zen5-2026-12-06.md). */
K16_AI void n16_tile(const int kind, const int NG, const int NR, const uint8_t *G, size_t gbb, size_t bs, const uint8_t *A,
                     size_t arb, int64_t nb, size_t pf, const uint8_t *pend, float *y, int64_t ldy, const __mmask16 *keep) {
    const bool q5 = kind == N16_K5;
    float sumf[16][K16_ROWS] __attribute__((aligned(64))); /* [i * NR + r]: updated once a super-block */
    const size_t pfs = (pf / 8 + 63) & ~(size_t)63; /* prefetched a sub-block */
#pragma GCC unroll 16
    for (int k = 0; k < NG * NR; k++) _mm512_store_ps(sumf[k], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)b * bs;
        const uint8_t *xq[4]; /* row r's q8_K block b */
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) xq[r] = A + (size_t)r * arb + (size_t)b * sizeof(blk_q8_K);
        __m512i isum[16];
#pragma GCC unroll 16
        for (int k = 0; k < NG * NR; k++) isum[k] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int g = 0; g < 8; g++) {
            if (pf) kq_n16_prefetch(p + N16_PFD + (size_t)g * pfs, pfs, pend);
            if (kind == N16_K6) n16_sub6(NG, NR, p, gbb, xq, g, isum);
            else n16_sub(q5, NG, NR, p, gbb, xq, g, isum);
        }
        if (kind == N16_K6) { /* sumf += (dw·dx)·(float)(isum − 32·msum), the −32·msum already in isum */
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                float dxs;
                memcpy(&dxs, &((const blk_q8_K *)xq[r])->d, 4);
                const __m512 dx = _mm512_set1_ps(dxs);
#pragma GCC unroll 4
                for (int i = 0; i < NG; i++) {
                    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p + (size_t)i * gbb)));
                    const __m512 a = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[i * NR + r]));
                    _mm512_store_ps(sumf[i * NR + r], _mm512_add_ps(_mm512_load_ps(sumf[i * NR + r]), a));
                }
            }
            continue;
        }
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const blk_q8_K *xa = (const blk_q8_K *)xq[r];
            /* the 8 sub-block bsums (pairs of the 16 half sums, |.| <= 4064) as int16, two a dword */
            int32_t bp[4];
            const __m256i bsv = _mm256_loadu_si256((const __m256i *)xa->bsums);
            const __m256i b32 = _mm256_madd_epi16(bsv, _mm256_set1_epi16(1));
            _mm_storeu_si128((__m128i *)bp, _mm_packs_epi32(_mm256_castsi256_si128(b32), _mm256_extracti128_si256(b32, 1)));
            float dxs;
            memcpy(&dxs, &xa->d, 4);
            const __m512 dx = _mm512_set1_ps(dxs);
#pragma GCC unroll 4
            for (int i = 0; i < NG; i++) {
                const uint8_t *pi = p + (size_t)i * gbb;
                __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m512i mn = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(pi + N16_MN + 32 * k)));
                    msum = k16_dpwssd(msum, mn, (const uint8_t *)(bp + k));
                }
                const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)pi));
                const __m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(pi + N16_DM)));
                const __m512 a = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[i * NR + r]));
                const __m512 m = _mm512_mul_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(msum));
                _mm512_store_ps(sumf[i * NR + r], _mm512_add_ps(_mm512_load_ps(sumf[i * NR + r]), _mm512_sub_ps(a, m)));
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++)
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++)
            _mm512_mask_storeu_ps(y + (int64_t)r * ldy + (int64_t)i * K16_ROWS, keep[i], _mm512_load_ps(sumf[i * NR + r]));
}

/* Rows [r, r + NR) of the activation × the in-range groups [g, tend) of one tile (at most N16_NG),
 * in one register tile; pf: prefetch the tile's stream (the first row chunk, which reads it first;
 * later chunks find it in L2). */
K16_AI void n16_rows(const int kind, const int NR, const kvt_packed *P, const uint8_t *A, size_t arb, float *y, int64_t ldy,
                     int64_t o0, int64_t o1, int64_t g, int64_t tend, size_t bs, bool pf) {
    const int ng = (int)(tend - g);
    const size_t gbb = kq_n16_gbb(P), pfb = (size_t)ng * gbb; /* the tile's groups from g on, a super-block */
    const uint8_t *pend = P->n16 + kq_n16_bytes(P);
    __mmask16 keep[N16_NG];
    for (int i = 0; i < ng; i++) keep[i] = k16_cols((g + i) * K16_ROWS, o0, o1);
    const uint8_t *G = P->n16 + kq_n16_off(P, g, 0);
    float *yg = y + g * K16_ROWS;
#define N16_T(NG) n16_tile(kind, NG, NR, G, gbb, bs, A, arb, P->nb, pf ? pfb : 0, pend, yg, ldy, keep)
    switch (ng) { /* constant widths: the accumulators stay in registers */
    case 4: N16_T(4); break;
    case 3: N16_T(3); break;
    case 2: N16_T(2); break;
    default: N16_T(1); break;
    }
#undef N16_T
}

void kq_n16_drive(const kvt_packed *P, int64_t n_rows, int64_t o0, int64_t o1, kq_n16_fn fn, void *ctx) {
    const int64_t gend = (o1 + K16_ROWS - 1) / K16_ROWS;
    for (int64_t g = o0 / K16_ROWS; g < gend;) {
        const int64_t t0 = g / N16_NG * N16_NG, ntg = kq_n16_ntg(P, t0), tend = gend < t0 + ntg ? gend : t0 + ntg;
        for (int64_t r = 0; r < n_rows;) {
            const int nr = n_rows - r >= 4 ? 4 : n_rows - r >= 2 ? 2 : 1;
            fn(ctx, r, nr, g, tend, (size_t)ntg * kq_n16_gbb(P));
            r += nr;
        }
        g = tend;
    }
}

typedef struct n16_job {
    const kvt_packed *P;
    const uint8_t *A;
    float *y;
    int64_t ldy, o0, o1;
} n16_job;

static K16_TGT void n16_step(void *ctx, int64_t r, int nr, int64_t g, int64_t tend, size_t bs) {
    const n16_job *j = ctx;
    const size_t arb = (size_t)j->P->nb * sizeof(blk_q8_K);
    const uint8_t *Ar = j->A + (size_t)r * arb;
    float *yr = j->y + r * j->ldy;
#define N16_R(K, NR) n16_rows(K, NR, j->P, Ar, arb, yr, j->ldy, j->o0, j->o1, g, tend, bs, r == 0)
    if (j->P->type == KVT_TYPE_Q5_K) {
        if (nr == 4) N16_R(N16_K5, 4);
        else if (nr == 2) N16_R(N16_K5, 2);
        else N16_R(N16_K5, 1);
    } else if (j->P->type == KVT_TYPE_Q6_K) {
        if (nr == 4) N16_R(N16_K6, 4);
        else if (nr == 2) N16_R(N16_K6, 2);
        else N16_R(N16_K6, 1);
    } else {
        if (nr == 4) N16_R(N16_K4, 4);
        else if (nr == 2) N16_R(N16_K4, 2);
        else N16_R(N16_K4, 1);
    }
#undef N16_R
}

void kq_n16_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    n16_job j = {P, act, y, ldy, o0, o1};
    kq_n16_drive(P, n_rows, o0, o1, n16_step, &j);
}

K16_TGT void kq_k16_pmm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                        int64_t o1) {
    if (P->kind == KQP_K6) k16_pmm(true, P, act, n_rows, y, ldy, o0, o1);
    else k16_pmm(false, P, act, n_rows, y, ldy, o0, o1);
}
#endif
