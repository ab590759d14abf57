/*
 * gemm_s16.c — AVX-512 VNNI prefill GEMM for the signed small-block types (Q8_0, Q4_0, Q5_0:
 * kvt_packed kind KQP_SMALL_S) on a 16-row interleaved layout, with the same arithmetic as the AMX
 * kernel (kernels_amx.c), and the scalar reference of it; the 16-row nibble decode layouts of the
 * 4- and 5-bit 32-weight types (Q4_0, Q5_0, Q4_1, Q5_1) and their kernels.
 *
 * Why: the 4-row packed tiles (kernels_x86_tmpl.h) keep 8 partial int32 lanes per row and block and
 * convert, scale and fma each of them: 4 vector ops per 64 multiply-adds. Here a zmm holds 4
 * consecutive weights of 16 output rows (the VNNI 4-byte interleave), one vpdpbusd with 4 broadcast
 * activation bytes advances all 16 rows, and after the block's 8 steps each lane holds the EXACT
 * int32 dot of one row's block: 8 dot instructions + 3 float ops per 512 multiply-adds and column.
 *
 * Layout (kvt_packed.s16, built here from the original rows): outputs in groups of KQS_N = 16 (the
 * last padded with zero rows), per group its blocks in order, one group-block (KQS_GBB = 576 bytes) =
 *   float d[16]; uint8 q[8][16][4]      q[k4][n][j] = (weight 4·k4+j of output n) + 128
 * The weights are stored offset by 128 (u8) because vpdpbusd multiplies u8 by s8; the activation
 * bytes stay signed, so the dot is Σ(w+128)·x = Σw·x + 128·Σx and each column starts from −128·Σx
 * of its block (computed exactly when the activation rows are converted).
 *
 * Arithmetic (per output element, blocks in order): isum = exact int32 Σ w·x over the block;
 * acc = fma((float)isum, dw·dx, acc). This is the AMX kernel's order, and kq_amx_mm_* (row-major,
 * used for decode) computes the same, so every Q8_0/Q4_0/Q5_0 product has one float order on the
 * AVX-512 VNNI and AMX paths: results do not depend on n_rows, [o0,o1), tile shapes or the thread
 * count (decode == full recompute), and the numerics id is shared ("int8-block").
 *
 * Q4_0 and Q5_0 decode and batched steps of up to N16_MAX_ROWS rows read a nibble layout instead
 * (kvt_packed.n16, kernels_internal.h: the file's bytes regrouped 16 rows at a time, 0.5 / 0.6 the
 * bytes of this one) with the same arithmetic: each lane starts from −8·Σx (Q5_0: −16·Σx) of the
 * block, vpdpbusd adds the low and high nibbles (Q5_0: with their fifth bits) against their
 * activation bytes (n16q_tile; one Q4_0 row n16q_tile1). Q4_1 and Q5_1 (kind KQP_SMALL_U, no GEMM
 * layout here) read the same nibble layout with their mins beside the scales, keeping the 8-lane
 * arithmetic of their row-major kernels (n16u_tile).
 *
 * Ownership: the layout is owned by the kvt_packed (freed by kvt_packed_free); the kernel keeps its
 * converted activation rows in the calling thread's scratch (kq_tls_scratch).
 */
#include "kernels_internal.h"

#include <math.h>
#include <stdlib.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

bool kq_s16_build(kvt_packed *P) {
    const int64_t ng = (P->n_out + KQS_N - 1) / KQS_N;
    uint64_t bytes;
    if (!kvt_mul_ok((uint64_t)ng * (uint64_t)P->nb, KQS_GBB, &bytes) || bytes > SIZE_MAX / 2) return false;
    uint8_t *L = kq_packed_alloc((size_t)bytes);
    if (!L) return false;
    const uint64_t wrb = kvt_type_row_bytes(P->type, (uint64_t)P->n_in);
    const size_t wbb = kvt_type_block_bytes(P->type);
    const uint8_t *W = P->W;
    for (int64_t o = 0; o < ng * KQS_N; o++) {
        const int n = (int)(o % KQS_N);
        for (int64_t b = 0; b < P->nb; b++) {
            uint8_t *dst = L + ((size_t)(o / KQS_N) * (size_t)P->nb + (size_t)b) * KQS_GBB;
            int8_t q[32] = {0};
            float d = 0.0f; /* padding rows: weights 0 (stored as 128), scale 0 */
            float m;
            if (o < P->n_out) kq_unpack_small(P->type, W + (size_t)o * wrb + (size_t)b * wbb, q, &d, &m);
            memcpy(dst + 4 * n, &d, 4);
            for (int k4 = 0; k4 < 8; k4++) { /* 4 weights at a time, +128 (xor of the sign bit) */
                uint32_t v;
                memcpy(&v, q + 4 * k4, 4);
                v ^= 0x80808080u;
                memcpy(dst + 64 + 64 * k4 + 4 * n, &v, 4);
            }
        }
    }
    P->s16 = L;
    return true;
}

/* The n16 decode layout of the 32-weight nibble types (kernels_internal.h): per pair of blocks the 16
 * bytes of nibbles (byte i: weight i low, 16+i high), 4 bytes of each of 16 rows a vector, then the
 * file's f16 scales (Q4_1/Q5_1: and mins); Q5_0/Q5_1 then the fifth bits, regrouped so that byte j of
 * vector k's lane holds those of its weights at bits k (low nibble) and 4+k (high). */
void kq_n16_s_build(kvt_packed *P, uint8_t *L) {
    const size_t wrb = (size_t)kvt_type_row_bytes(P->type, (uint64_t)P->n_in), wbb = kvt_type_block_bytes(P->type);
    const bool mins = P->type == KVT_TYPE_Q4_1 || P->type == KVT_TYPE_Q5_1;
    const bool q5 = P->type == KVT_TYPE_Q5_0 || P->type == KVT_TYPE_Q5_1;
    const size_t ho = mins ? 4 : 2, qo = ho + (q5 ? 4 : 0);               /* qh, qs in the file's block */
    const size_t lh = P->type == KVT_TYPE_Q5_1 ? N16_Q51_H : N16_Q50_H; /* the qh plane */
    for (int64_t o = 0; o < P->n_out; o++)
        for (int64_t b = 0; b < P->nb; b++) {
            const uint8_t *src = (const uint8_t *)P->W + (size_t)o * wrb + (size_t)b * wbb;
            uint8_t *p = L + kq_n16_off(P, o / KQS_N, b / 2);
            const int n = (int)(o % KQS_N), h = (int)(b % 2);
            memcpy(p + N16_Q40_D + 32 * h + 2 * n, src, 2);
            if (mins) memcpy(p + N16_Q41_M + 32 * h + 2 * n, src + 2, 2);
            for (int k = 0; k < 4; k++) memcpy(p + 256 * h + 64 * k + 4 * n, src + qo + 4 * k, 4);
            if (!q5) continue;
            const uint32_t qh = (uint32_t)src[ho] | (uint32_t)src[ho + 1] << 8 | (uint32_t)src[ho + 2] << 16 | (uint32_t)src[ho + 3] << 24;
            for (int j = 0; j < 4; j++) {
                uint8_t v = 0;
                for (int k = 0; k < 4; k++) v |= (uint8_t)(((qh >> (4 * k + j)) & 1) << k | ((qh >> (16 + 4 * k + j)) & 1) << (4 + k));
                p[lh + 64 * h + 4 * n + j] = v;
            }
        }
}

/* Weight 4k+j (hi: 16+4k+j) of lane n in block h of the group-block p: its 4 or 5 bits. */
static int n16s_weight(uint32_t type, const uint8_t *p, int h, int n, int k, int j, int hi) {
    const uint8_t v = p[256 * h + 64 * k + 4 * n + j];
    const int lo4 = hi ? v >> 4 : v & 15;
    if (type != KVT_TYPE_Q5_0 && type != KVT_TYPE_Q5_1) return lo4;
    const uint8_t e = p[(type == KVT_TYPE_Q5_1 ? N16_Q51_H : N16_Q50_H) + 64 * h + 4 * n + j];
    return lo4 | ((e >> (4 * hi + k)) & 1) << 4;
}

/* The arithmetic of kq_s16_ref (exact int32 block dot, fma in block order) on the Q4_0/Q5_0 n16 layout. */
void kq_n16_s_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1) {
    const uint8_t *A = act;
    const int off = P->type == KVT_TYPE_Q5_0 ? 16 : 8; /* the codes' zero */
    for (int64_t o = o0; o < o1; o++) {
        const int n = (int)(o % KQS_N);
        float acc = 0.0f;
        for (int64_t b = 0; b < P->nb; b++) {
            const uint8_t *p = P->n16 + kq_n16_off(P, o / KQS_N, b / 2), *pa = A + (size_t)b * sizeof(blk_q8_0);
            const int h = (int)(b % 2);
            int32_t isum = 0;
            for (int k = 0; k < 4; k++)
                for (int j = 0; j < 4; j++)
                    isum += (n16s_weight(P->type, p, h, n, k, j, 0) - off) * (int8_t)pa[2 + 4 * k + j] +
                            (n16s_weight(P->type, p, h, n, k, j, 1) - off) * (int8_t)pa[2 + 16 + 4 * k + j];
            acc = fmaf((float)isum, kq_h2f(kq_rd16(p + N16_Q40_D + 32 * h + 2 * n)) * kq_h2f(kq_rd16(pa)), acc);
        }
        y[o] = acc;
    }
}

/* The arithmetic of the Q4_1/Q5_1 row-major kernels (tile_small_s, kernels_x86_tmpl.h) on their n16
 * layout: per block 8 lanes of exact 4-weight dots (lane k: weights 4k..4k+3, lane 4+k: 16+4k..),
 * lane = fma(dot, dw·dx, lane), the mins' products m·s summed apart; then the lanes' horizontal sum
 * in hsum_ps order plus that sum. */
void kq_n16_u_ref(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1) {
    const uint8_t *A = act;
    for (int64_t o = o0; o < o1; o++) {
        const int n = (int)(o % KQS_N);
        float lane[8] = {0}, macc = 0.0f;
        for (int64_t b = 0; b < P->nb; b++) {
            const uint8_t *p = P->n16 + kq_n16_off(P, o / KQS_N, b / 2), *pa = A + (size_t)b * sizeof(blk_q8_1);
            const int h = (int)(b % 2);
            const float s = kq_h2f(kq_rd16(p + N16_Q40_D + 32 * h + 2 * n)) * kq_h2f(kq_rd16(pa));
            for (int k = 0; k < 4; k++) {
                int32_t dl = 0, dh = 0;
                for (int j = 0; j < 4; j++) {
                    dl += n16s_weight(P->type, p, h, n, k, j, 0) * (int8_t)pa[4 + 4 * k + j];
                    dh += n16s_weight(P->type, p, h, n, k, j, 1) * (int8_t)pa[4 + 16 + 4 * k + j];
                }
                lane[k] = fmaf((float)dl, s, lane[k]);
                lane[4 + k] = fmaf((float)dh, s, lane[4 + k]);
            }
            macc += kq_h2f(kq_rd16(p + N16_Q41_M + 32 * h + 2 * n)) * kq_h2f(kq_rd16(pa + 2));
        }
        y[o] = kq_hsum8(lane) + macc;
    }
}

size_t kq_s16_bytes(const kvt_packed *P) {
    return P->s16 ? (size_t)((P->n_out + KQS_N - 1) / KQS_N) * (size_t)P->nb * KQS_GBB : 0;
}

/* Scalar reference of the kernel's arithmetic, reading the s16 layout and the Q8_0 activation rows. */
void kq_s16_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const size_t arb = (size_t)P->nb * sizeof(blk_q8_0);
    const uint8_t *A = act;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t o = o0; o < o1; o++) {
            const int n = (int)(o % KQS_N);
            float acc = 0.0f;
            for (int64_t b = 0; b < P->nb; b++) {
                const uint8_t *p = P->s16 + ((size_t)(o / KQS_N) * (size_t)P->nb + (size_t)b) * KQS_GBB;
                const uint8_t *pa = A + (size_t)r * arb + (size_t)b * sizeof(blk_q8_0);
                float dw;
                memcpy(&dw, p + 4 * n, 4);
                int32_t isum = 0;
                for (int k = 0; k < 32; k++)
                    isum += ((int32_t)p[64 + 64 * (k / 4) + 4 * n + (k % 4)] - 128) * (int8_t)pa[2 + k];
                acc = fmaf((float)isum, dw * kq_h2f(kq_rd16(pa)), acc);
            }
            y[r * ldy + o] = acc;
        }
}

#if KVT_X86
#include <immintrin.h>

#define KQS_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KQS_AI static inline __attribute__((always_inline)) KQS_TGT

/* Converted activation block (KQS_CA = 40 bytes): int32 −128·Σx, float dx, int8 x[32]. */
#define KQS_CA 40
#define KQS_COLS 12 /* activation rows per register tile: 12 int32 + 12 float accumulators */

static KQS_TGT void s16_convert(const uint8_t *A, size_t arb, int64_t r0, int64_t r1, int64_t nb, uint8_t *C) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pa = A + (size_t)r * arb + (size_t)b * sizeof(blk_q8_0);
            uint8_t *c = C + ((size_t)(r - r0) * (size_t)nb + (size_t)b) * KQS_CA;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(pa + 2));
            /* Σx exactly: maddubs(1, x) gives 16 int16 pair sums, madd with 1 widens them */
            const __m256i s16 = _mm256_maddubs_epi16(ones, x);
            const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            const int32_t corr = -128 * _mm_cvtsi128_si32(t);
            const float dx = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(kq_rd16(pa))));
            memcpy(c, &corr, 4);
            memcpy(c + 4, &dx, 4);
            _mm256_storeu_si256((__m256i *)(c + 8), x);
        }
}

/* NC columns (converted rows at C, stride crb) × the 16 outputs of group G; results to out[c][16]. */
KQS_AI void s16_tile(const int NC, const uint8_t *G, int64_t nb, const uint8_t *C, size_t crb, const uint8_t *pf,
                     __m512 out[KQS_COLS]) {
    __m512 acc[KQS_COLS];
#pragma GCC unroll 12
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)b * KQS_GBB;
        if (pf) {
            const char *q = (const char *)(pf + (size_t)b * KQS_GBB);
            for (int l = 0; l < KQS_GBB; l += 64) _mm_prefetch(q + l, _MM_HINT_T0);
        }
        const uint8_t *cb = C + (size_t)b * KQS_CA;
        __m512i is[KQS_COLS];
#pragma GCC unroll 12
        for (int c = 0; c < NC; c++) is[c] = _mm512_set1_epi32(*(const int32_t *)(cb + (size_t)c * crb));
#pragma GCC unroll 8
        for (int k4 = 0; k4 < 8; k4++) {
            const __m512i w = _mm512_load_si512((const void *)(p + 64 + 64 * k4));
#pragma GCC unroll 12
            for (int c = 0; c < NC; c++) {
                int32_t xv;
                memcpy(&xv, cb + (size_t)c * crb + 8 + 4 * k4, 4);
                is[c] = _mm512_dpbusd_epi32(is[c], w, _mm512_set1_epi32(xv));
            }
        }
        const __m512 dw = _mm512_load_ps((const float *)p);
#pragma GCC unroll 12
        for (int c = 0; c < NC; c++) {
            float dx;
            memcpy(&dx, cb + (size_t)c * crb + 4, 4);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[c]), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[c]);
        }
    }
#pragma GCC unroll 12
    for (int c = 0; c < NC; c++) out[c] = acc[c];
}

/* The lanes of the group of outputs [base, base + 16) that fall in [o0, o1). */
static inline __mmask16 s16_cols(int64_t base, int64_t o0, int64_t o1) {
    const int64_t c0 = o0 > base ? o0 : base, c1 = o1 < base + KQS_N ? o1 : base + KQS_N;
    return (__mmask16)(((1u << (c1 - base)) - 1u) & ~((1u << (c0 - base)) - 1u));
}

/* Activation rows per row block: the converted rows stay in L2 while the weight groups stream. */
#define KQS_ACT_BLOCK_BYTES (512u << 10)
/* weight groups ahead for the software prefetch (first column tile of a group only) */
#define KQS_PF_GROUPS 2

KQS_TGT void kq_s16_pmm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                        int64_t o1) {
    const int64_t nb = P->nb;
    const size_t arb = (size_t)nb * sizeof(blk_q8_0), crb = (size_t)nb * KQS_CA, gs = (size_t)nb * KQS_GBB;
    const int64_t ng = (P->n_out + KQS_N - 1) / KQS_N;
    int64_t rb = (int64_t)(KQS_ACT_BLOCK_BYTES / crb) / KQS_COLS * KQS_COLS;
    if (rb < KQS_COLS) rb = KQS_COLS;
    if (rb > n_rows) rb = n_rows;
    uint8_t *C = kq_tls_scratch((size_t)rb * crb);
    if (!C) { /* no scratch memory: the row-major kernel with the same arithmetic */
        kvt_matmul_rows(P->type, P->W, P->n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    __m512 out[KQS_COLS];
    for (int64_t r0 = 0; r0 < n_rows; r0 += rb) {
        const int64_t r1 = r0 + rb < n_rows ? r0 + rb : n_rows;
        s16_convert(act, arb, r0, r1, nb, C);
        for (int64_t g = o0 / KQS_N; g * KQS_N < o1; g++) {
            const uint8_t *G = P->s16 + (size_t)g * gs;
            const int64_t base = g * KQS_N;
            const __mmask16 m = s16_cols(base, o0, o1);
            const uint8_t *pf = g + KQS_PF_GROUPS < ng ? G + (size_t)KQS_PF_GROUPS * gs : NULL;
            for (int64_t r = r0; r < r1;) {
                const int64_t left = r1 - r;
                const int nc = left >= KQS_COLS ? KQS_COLS : (int)left;
                const uint8_t *Cr = C + (size_t)(r - r0) * crb;
                switch (nc) { /* constant tile widths, so the accumulators stay in registers */
                case 12: s16_tile(12, G, nb, Cr, crb, pf, out); break;
                case 11: s16_tile(11, G, nb, Cr, crb, pf, out); break;
                case 10: s16_tile(10, G, nb, Cr, crb, pf, out); break;
                case 9: s16_tile(9, G, nb, Cr, crb, pf, out); break;
                case 8: s16_tile(8, G, nb, Cr, crb, pf, out); break;
                case 7: s16_tile(7, G, nb, Cr, crb, pf, out); break;
                case 6: s16_tile(6, G, nb, Cr, crb, pf, out); break;
                case 5: s16_tile(5, G, nb, Cr, crb, pf, out); break;
                case 4: s16_tile(4, G, nb, Cr, crb, pf, out); break;
                case 3: s16_tile(3, G, nb, Cr, crb, pf, out); break;
                case 2: s16_tile(2, G, nb, Cr, crb, pf, out); break;
                default: s16_tile(1, G, nb, Cr, crb, pf, out); break;
                }
                for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(y + (r + c) * ldy + base, m, out[c]);
                r += nc;
                pf = NULL;
            }
        }
    }
}

/* Decode (one activation row): KQS_GEMV_NG groups of 16 outputs side by side over the blocks, each
 * 4-byte activation broadcast serving all of them (s16_tile with one column has one 8-long dot
 * chain per block; here NG chains run at once). Every lane is s16_tile's exact int32 block dot
 * and fma in block order, so the bits are those of the GEMM and of the row-major kernel
 * (kq_amx_mm_*); the layout's 576 bytes a block of 16 outputs stream at about the bandwidth, where
 * the row-major kernel's four rows with horizontal adds per block did not. */
/* Nibble vector k of a block (64 bytes: 4 of each of 16 rows) as the two vpdpbusd operands: the low
 * nibbles (weights 4k..4k+3 of each row) and the high ones (16+4k..); with q5, the fifth bits from the
 * block's qh plane vector moved to bit 4 by A | (B & C) (imm 0xF8; 16-bit shifts: what crosses from
 * the neighbouring byte lands outside 0x10). */
KQS_AI void n16s_split(const bool q5, const __m512i v, const __m512i qh, const int k, __m512i *wl, __m512i *wh) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    *wl = _mm512_and_si512(v, m4);
    *wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (q5) {
        *wl = _mm512_ternarylogic_epi32(*wl, _mm512_slli_epi16(qh, 4 - k), b4, 0xF8);
        *wh = _mm512_ternarylogic_epi32(*wh, k ? _mm512_srli_epi16(qh, k) : qh, b4, 0xF8);
    }
}

/* Q4_0 and Q5_0 decode and small batches on the n16 layout: the NG groups of a tile (NG <= 4) × NR
 * converted activation rows (1, 2 or 4). Per block each lane starts from −8·Σx (Q5_0: −16·Σx; the
 * converted block's −128·Σx / 16 or / 8, exact), vpdpbusd adds the low nibbles against x[4k..4k+3]
 * and the high ones against x[16+4k..] (Q5_0: each with its fifth bit at bit 4, n16s_split; a second
 * chain for up to 8 (group, row) pairs; 16 pairs have 16 chains of one accumulator, each nibble split and broadcast then serving 4 pairs: 4- and 8-row llama-1b steps
 * 0.78-0.81x the time of 2 groups a pass, bench/results/zen5-2026-12-06.md), so the sum is the exact
 * Σ(q−8)·x (Σ(q−16)·x) of s16_tile; then its fma in block order: the bits of kq_s16_pmm and
 * kq_amx_mm_q4_0 / kq_amx_mm_q5_0. */
KQS_AI void n16q_tile(const bool q5, const int NG, const int NR, const uint8_t *G, size_t bs, int64_t nb, const uint8_t *C,
                      size_t crb, size_t pf, const uint8_t *pend, float *y, int64_t ldy, const __mmask16 *keep) {
    const size_t gbb = q5 ? N16_GBB_Q50 : N16_GBB_Q40;
    const size_t pfh = (pf / 2 + 63) & ~(size_t)63;
    const bool two = NG * NR <= 8; /* low and high nibbles in separate chains (else one a pair: 16 chains) */
    __m512 acc[16];
#pragma GCC unroll 16
    for (int k = 0; k < NG * NR; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)(b / 2) * bs + 256 * (size_t)(b % 2), *pd = G + (size_t)(b / 2) * bs + N16_Q40_D + 32 * (size_t)(b % 2);
        if (pf) /* the group-block's share, half of it a block (spread: n16_tile, gemm_k16.c) */
            kq_n16_prefetch(G + (size_t)(b / 2) * bs + N16_PFD + (size_t)(b % 2) * pfh, pfh, pend);
        __m512i lo[16], hi[8], qh[N16_NG];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m512i c0 = _mm512_srai_epi32(_mm512_set1_epi32(*(const int32_t *)(C + (size_t)r * crb + (size_t)b * KQS_CA)), q5 ? 3 : 4);
#pragma GCC unroll 4
            for (int i = 0; i < NG; i++) {
                lo[i * NR + r] = c0;
                if (two) hi[i * NR + r] = _mm512_setzero_si512();
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++)
            qh[i] = q5 ? _mm512_load_si512((const void *)(G + (size_t)(b / 2) * bs + (size_t)i * gbb + N16_Q50_H + 64 * (size_t)(b % 2)))
                       : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
#pragma GCC unroll 4
            for (int i = 0; i < NG; i++) {
                __m512i wl, wh;
                n16s_split(q5, _mm512_load_si512((const void *)(p + (size_t)i * gbb + 64 * k)), qh[i], k, &wl, &wh);
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++) {
                    const uint8_t *x = C + (size_t)r * crb + (size_t)b * KQS_CA + 8;
                    int32_t xl, xh;
                    memcpy(&xl, x + 4 * k, 4);
                    memcpy(&xh, x + 16 + 4 * k, 4);
                    lo[i * NR + r] = _mm512_dpbusd_epi32(lo[i * NR + r], wl, _mm512_set1_epi32(xl));
                    if (two) hi[i * NR + r] = _mm512_dpbusd_epi32(hi[i * NR + r], wh, _mm512_set1_epi32(xh));
                    else lo[i * NR + r] = _mm512_dpbusd_epi32(lo[i * NR + r], wh, _mm512_set1_epi32(xh));
                }
            }
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(pd + (size_t)i * gbb)));
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                float dx;
                memcpy(&dx, C + (size_t)r * crb + (size_t)b * KQS_CA + 4, 4);
                const __m512i is = two ? _mm512_add_epi32(lo[i * NR + r], hi[i * NR + r]) : lo[i * NR + r];
                acc[i * NR + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[i * NR + r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++)
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy + (int64_t)i * KQS_N, keep[i], acc[i * NR + r]);
}

/* Q4_0 decode (one activation row) on the n16 layout: n16q_tile's arithmetic and bits, in another
 * order. The block's 8 activation broadcasts are made once for all groups, the groups run one after
 * the other (each its low and high chains over the 4 nibble vectors), and the block's prefetch is
 * issued a quarter at a time during the first group instead of as one burst: llama-1b shapes streamed
 * 1.05-1.07x the bytes a second from DRAM on 2 threads where the machine's bandwidth was free, and
 * 1.04-1.10x on 1 thread (bench/results/zen5-2026-12-06f.md). Q5_0 was no faster this way. */
KQS_AI void n16q_tile1(const int NG, const uint8_t *G, size_t bs, int64_t nb, const uint8_t *C, size_t pf,
                       const uint8_t *pend, float *y, const __mmask16 *keep) {
    const size_t pfh = (pf / 2 + 63) & ~(size_t)63, pfq = (pfh / 4 + 63) & ~(size_t)63;
    const __m512i zero = _mm512_setzero_si512(); /* no fifth bits */
    __m512 acc[N16_NG];
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = G + (size_t)(b / 2) * bs, *p = pb + 256 * (size_t)(b % 2), *pd = pb + N16_Q40_D + 32 * (size_t)(b % 2);
        const uint8_t *pfa = pb + N16_PFD + (size_t)(b % 2) * pfh, *cb = C + (size_t)b * KQS_CA;
        const __m512i c0 = _mm512_srai_epi32(_mm512_set1_epi32(*(const int32_t *)cb), 4);
        float dx;
        memcpy(&dx, cb + 4, 4);
        const __m512 vdx = _mm512_set1_ps(dx);
        __m512i xl[4], xh[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            int32_t a, h;
            memcpy(&a, cb + 8 + 4 * k, 4);
            memcpy(&h, cb + 24 + 4 * k, 4);
            xl[k] = _mm512_set1_epi32(a);
            xh[k] = _mm512_set1_epi32(h);
        }
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++) {
            __m512i lo = c0, hi = zero;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                if (pf && i == 0) kq_n16_prefetch(pfa + (size_t)k * pfq, pfq, pend);
                __m512i wl, wh;
                n16s_split(false, _mm512_load_si512((const void *)(p + (size_t)i * N16_GBB_Q40 + 64 * k)), zero, k, &wl, &wh);
                lo = _mm512_dpbusd_epi32(lo, wl, xl[k]);
                hi = _mm512_dpbusd_epi32(hi, wh, xh[k]);
            }
            const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(pd + (size_t)i * N16_GBB_Q40)));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(dw, vdx), acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++) _mm512_mask_storeu_ps(y + (int64_t)i * KQS_N, keep[i], acc[i]);
}

/* Rows [r, r + NR) (converted at C) × the in-range groups [g, tend) of one tile (at most N16_NG) in one
 * register tile; pf: prefetch the tile's stream (the first row chunk). */
KQS_AI void n16q_rows(const bool q5, const int NR, const kvt_packed *P, const uint8_t *C, size_t crb, float *y, int64_t ldy,
                      int64_t o0, int64_t o1, int64_t g, int64_t tend, size_t bs, bool pf) {
    const int ng = (int)(tend - g);
    const size_t pfb = (size_t)ng * kq_n16_gbb(P);
    const uint8_t *pend = P->n16 + kq_n16_bytes(P);
    __mmask16 keep[N16_NG];
    for (int i = 0; i < ng; i++) keep[i] = s16_cols((g + i) * KQS_N, o0, o1);
    const uint8_t *G = P->n16 + kq_n16_off(P, g, 0);
    float *yg = y + g * KQS_N;
#define N16Q_1(NG) n16q_tile1(NG, G, bs, P->nb, C, pf ? pfb : 0, pend, yg, keep)
    if (!q5 && NR == 1) {
        switch (ng) { /* constant widths: the accumulators stay in registers */
        case 4: N16Q_1(4); break;
        case 3: N16Q_1(3); break;
        case 2: N16Q_1(2); break;
        default: N16Q_1(1); break;
        }
        return;
    }
#undef N16Q_1
#define N16Q_T(NG) n16q_tile(q5, NG, NR, G, bs, P->nb, C, crb, pf ? pfb : 0, pend, yg, ldy, keep)
    switch (ng) { /* constant widths: the accumulators stay in registers */
    case 4: N16Q_T(4); break;
    case 3: N16Q_T(3); break;
    case 2: N16Q_T(2); break;
    default: N16Q_T(1); break;
    }
#undef N16Q_T
}

typedef struct n16s_job {
    const kvt_packed *P;
    const uint8_t *A; /* activation rows, arb bytes apart: Q4_0/Q5_0 converted (KQS_CA a block), Q4_1/Q5_1 Q8_1 */
    size_t arb;
    float *y;
    int64_t ldy, o0, o1;
} n16s_job;

static KQS_TGT void n16q_step(void *ctx, int64_t r, int nr, int64_t g, int64_t tend, size_t bs) {
    const n16s_job *j = ctx;
    const uint8_t *Cr = j->A + (size_t)r * j->arb;
    float *yr = j->y + r * j->ldy;
#define N16Q_R(Q5, NR) n16q_rows(Q5, NR, j->P, Cr, j->arb, yr, j->ldy, j->o0, j->o1, g, tend, bs, r == 0)
    if (j->P->type == KVT_TYPE_Q5_0) {
        if (nr == 4) N16Q_R(true, 4);
        else if (nr == 2) N16Q_R(true, 2);
        else N16Q_R(true, 1);
    } else {
        if (nr == 4) N16Q_R(false, 4);
        else if (nr == 2) N16Q_R(false, 2);
        else N16Q_R(false, 1);
    }
#undef N16Q_R
}

void kq_n16_s_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = P->nb;
    const size_t arb = (size_t)nb * sizeof(blk_q8_0), crb = (size_t)nb * KQS_CA;
    uint8_t *C = kq_tls_scratch((size_t)n_rows * crb);
    if (!C || n_rows > N16_MAX_ROWS) { /* no scratch memory: the row-major kernel with the same arithmetic */
        kvt_matmul_rows(P->type, P->W, P->n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    s16_convert(act, arb, 0, n_rows, nb, C);
    n16s_job j = {P, C, crb, y, ldy, o0, o1};
    kq_n16_drive(P, n_rows, o0, o1, n16q_step, &j);
}

/* Q4_1 and Q5_1 decode and small batches on the n16 layout, with the row-major kernels' arithmetic
 * (tile_small_s): the NG groups of a tile × one activation row (Q8_1 blocks at A). Per block, each
 * nibble vector k (n16s_split; Q5_1 with its fifth bits) gives by vpdpbusd from zero the exact
 * dots of lanes k (low nibbles against x[4k..4k+3]) and 4+k (high, x[16+4k..]) for 16 rows; each
 * lane's float accumulator takes fma(dot, dw·dx, ·), the mins' m·s add apart, and at the end the 8
 * lanes are summed in hsum_ps order plus that sum: the bits of the row-major kernel and of the 4-row
 * GEMV copy. That is 9 accumulators a (group, row) pair: a 4-group tile keeps 36 (a few live in the
 * stack frame), and more rows take one pass each over the tile, which later rows find in L2 (4 rows
 * a pass spilled 144 accumulators: llama-1b Q4_1 8-row steps took 4.1x a 1-row step; pairs of rows
 * over 2 groups at a time were no faster than single rows, bench/results/zen5-2026-12-06e.md). */
KQS_AI void n16u_tile(const bool q5, const int NG, const uint8_t *G, size_t bs, int64_t nb, const uint8_t *A, size_t pf,
                      const uint8_t *pend, float *y, const __mmask16 *keep) {
    const size_t gbb = q5 ? N16_GBB_Q51 : N16_GBB_Q41;
    const size_t pfh = (pf / 2 + 63) & ~(size_t)63;
    __m512 acc[N16_NG][8], macc[N16_NG];
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++) {
        macc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[i][l] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *P2 = G + (size_t)(b / 2) * bs, *x = A + (size_t)b * sizeof(blk_q8_1); /* the pair's group-blocks */
        const size_t h = (size_t)(b % 2);
        if (pf) kq_n16_prefetch(P2 + N16_PFD + h * pfh, pfh, pend);
        const __m512 dx = _mm512_set1_ps(kq_h2f(kq_rd16(x))), sx = _mm512_set1_ps(kq_h2f(kq_rd16(x + 2)));
#pragma GCC unroll 4
        for (int i = 0; i < NG; i++) {
            const uint8_t *pi = P2 + (size_t)i * gbb;
            const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(pi + N16_Q40_D + 32 * h)));
            const __m512 mw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(pi + N16_Q41_M + 32 * h)));
            const __m512i qh = q5 ? _mm512_load_si512((const void *)(pi + N16_Q51_H + 64 * h)) : _mm512_setzero_si512();
            const __m512 sc = _mm512_mul_ps(dw, dx);
            macc[i] = _mm512_add_ps(macc[i], _mm512_mul_ps(mw, sx));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i wl, wh;
                n16s_split(q5, _mm512_load_si512((const void *)(pi + 256 * h + 64 * k)), qh, k, &wl, &wh);
                int32_t xl, xh;
                memcpy(&xl, x + 4 + 4 * k, 4);
                memcpy(&xh, x + 20 + 4 * k, 4);
                const __m512i dl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl, _mm512_set1_epi32(xl));
                const __m512i dh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wh, _mm512_set1_epi32(xh));
                acc[i][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dl), sc, acc[i][k]);
                acc[i][4 + k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dh), sc, acc[i][4 + k]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NG; i++) {
        const __m512 *a = acc[i];
        const __m512 s0 = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        const __m512 s1 = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        _mm512_mask_storeu_ps(y + (int64_t)i * KQS_N, keep[i], _mm512_add_ps(_mm512_add_ps(s0, s1), macc[i]));
    }
}

/* Activation row r × the in-range groups [g, tend) of one tile; the first row prefetches the tile's
 * stream. */
KQS_AI void n16u_row(const bool q5, const n16s_job *j, int64_t r, int64_t g, int64_t tend, size_t bs) {
    const kvt_packed *P = j->P;
    const int ng = (int)(tend - g);
    const size_t pfb = r == 0 ? (size_t)ng * kq_n16_gbb(P) : 0;
    const uint8_t *pend = P->n16 + kq_n16_bytes(P), *G = P->n16 + kq_n16_off(P, g, 0), *Ar = j->A + (size_t)r * j->arb;
    __mmask16 keep[N16_NG];
    for (int i = 0; i < ng; i++) keep[i] = s16_cols((g + i) * KQS_N, j->o0, j->o1);
    float *yg = j->y + r * j->ldy + g * KQS_N;
#define N16U_T(NG) n16u_tile(q5, NG, G, bs, P->nb, Ar, pfb, pend, yg, keep)
    switch (ng) { /* constant widths */
    case 4: N16U_T(4); break;
    case 3: N16U_T(3); break;
    case 2: N16U_T(2); break;
    default: N16U_T(1); break;
    }
#undef N16U_T
}

static KQS_TGT void n16u_step(void *ctx, int64_t r, int nr, int64_t g, int64_t tend, size_t bs) {
    const n16s_job *j = ctx;
    for (int64_t q = r; q < r + nr; q++)
        if (j->P->type == KVT_TYPE_Q5_1) n16u_row(true, j, q, g, tend, bs);
        else n16u_row(false, j, q, g, tend, bs);
}

void kq_n16_u_mm(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    n16s_job j = {P, act, (size_t)P->nb * sizeof(blk_q8_1), y, ldy, o0, o1};
    kq_n16_drive(P, n_rows, o0, o1, n16u_step, &j);
}

#define KQS_GEMV_NG 4
#define KQS_GEMV_PF 4 /* blocks ahead of each group's stream */
KQS_AI void s16_gemv_tile(const int NG, const uint8_t *G, size_t gs, int64_t nb, const uint8_t *C, int nn, __m512 *out) {
    __m512 acc[KQS_GEMV_NG];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) acc[g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *cb = C + (size_t)b * KQS_CA, *p = G + (size_t)b * KQS_GBB;
        if (b + KQS_GEMV_PF < nb) {
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
                for (int l = 0; l < KQS_GBB; l += 64)
                    _mm_prefetch((const char *)(p + (size_t)g * gs + KQS_GEMV_PF * KQS_GBB + l), _MM_HINT_T0);
        } else if (b + KQS_GEMV_PF - nb < nb) /* the first blocks of the next tile's nn groups (it follows at G + NG·gs) */
            for (int g = 0; g < nn; g++)
                for (int l = 0; l < KQS_GBB; l += 64)
                    _mm_prefetch((const char *)(G + (size_t)(NG + g) * gs + (size_t)(b + KQS_GEMV_PF - nb) * KQS_GBB + l), _MM_HINT_T0);
        __m512i is[KQS_GEMV_NG];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) is[g] = _mm512_set1_epi32(*(const int32_t *)cb);
#pragma GCC unroll 8
        for (int k4 = 0; k4 < 8; k4++) {
            int32_t xv;
            memcpy(&xv, cb + 8 + 4 * k4, 4);
            const __m512i xb = _mm512_set1_epi32(xv);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
                is[g] = _mm512_dpbusd_epi32(is[g], _mm512_load_si512((const void *)(p + (size_t)g * gs + 64 + 64 * k4)), xb);
        }
        float dx;
        memcpy(&dx, cb + 4, 4);
        const __m512 vdx = _mm512_set1_ps(dx);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
            acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[g]),
                                     _mm512_mul_ps(_mm512_load_ps((const float *)(p + (size_t)g * gs)), vdx), acc[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) out[g] = acc[g];
}

KQS_TGT void kq_s16_gemv(const kvt_packed *P, const void *act, float *y, int64_t o0, int64_t o1) {
    const int64_t nb = P->nb;
    const size_t arb = (size_t)nb * sizeof(blk_q8_0), gs = (size_t)nb * KQS_GBB;
    uint8_t *C = kq_tls_scratch((size_t)nb * KQS_CA);
    if (!C) { /* no scratch memory: the row-major kernel with the same arithmetic */
        kvt_matmul_rows(P->type, P->W, P->n_in, act, 1, y, 0, o0, o1);
        return;
    }
    s16_convert(act, arb, 0, 1, nb, C);
    const int64_t gend = (o1 + KQS_N - 1) / KQS_N;
    __m512 out[KQS_GEMV_NG];
    for (int64_t g = o0 / KQS_N; g < gend && g < o0 / KQS_N + KQS_GEMV_NG; g++) /* the first tile's first blocks */
        for (size_t l = 0; l < (size_t)(nb < KQS_GEMV_PF ? nb : KQS_GEMV_PF) * KQS_GBB; l += 64)
            _mm_prefetch((const char *)(P->s16 + (size_t)g * gs + l), _MM_HINT_T0);
    for (int64_t g = o0 / KQS_N; g < gend;) {
        const int ng = gend - g >= KQS_GEMV_NG ? KQS_GEMV_NG : (int)(gend - g);
        const int64_t left = gend - g - ng; /* groups of this call after the tile */
        const int nn = left >= KQS_GEMV_NG ? KQS_GEMV_NG : (int)left;
        const uint8_t *G = P->s16 + (size_t)g * gs;
        switch (ng) { /* constant widths: the accumulators stay in registers */
        case 4: s16_gemv_tile(4, G, gs, nb, C, nn, out); break;
        case 3: s16_gemv_tile(3, G, gs, nb, C, nn, out); break;
        case 2: s16_gemv_tile(2, G, gs, nb, C, nn, out); break;
        default: s16_gemv_tile(1, G, gs, nb, C, nn, out); break;
        }
        for (int i = 0; i < ng; i++) {
            const int64_t base = (g + i) * KQS_N;
            const __mmask16 m = s16_cols(base, o0, o1);
            _mm512_mask_storeu_ps(y + base, m, out[i]);
        }
        g += ng;
    }
}
#endif
