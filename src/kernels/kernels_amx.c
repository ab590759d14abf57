/*
 * kernels_amx.c — AMX int8 (TMUL) prefill GEMM for the signed small-block types (Q8_0, Q4_0, Q5_0:
 * kvt_packed kind KQP_SMALL_S), row-major kernels with the same arithmetic (decode under
 * KVT_ISA_AMX), the OS permission request, and the scalar reference.
 *
 * Layout (kvt_packed.amx, built by repack.c from the 4-row packed data): outputs in groups of
 * KQA_N = 16 (the last padded with zero rows), per group its blocks in order, one group-block =
 *   float d[16]; int8 q[8][16][4]   (576 bytes: q[k4][n][j] = weight 4·k4+j of output n)
 * i.e. a B tile of 8 rows × 64 bytes in the VNNI 4-byte interleave TDPBSSD reads.
 *
 * Kernel: 32 activation rows (2 A tiles of 16 rows × 32 bytes, read in place from the Q8_0 rows,
 * stride = row bytes) × 32 outputs (2 B tiles) → 4 C tiles; each block is its own TDPBSSD pass so
 * C holds the exact int32 dot of one block (s8·s8, no offset trick). Then, per element and block in
 * order: acc = fma((float)isum, dw·dx, acc). This is NOT the lane order of the AVX2/AVX-512 paths
 * (8 partial lanes per block, fma per lane, horizontal sum at the end), so results differ from them
 * in the last bits: kvt_kernels_numerics_id reports "int8-block" (shared with the 16-row VNNI GEMM of gemm_s16.c), every Q8_0/Q4_0/Q5_0 product under
 * KVT_ISA_AMX (row-major decode kernels kq_amx_mm_* included) uses this order, and tests/test_kernels.c checks the
 * kernel bit for bit against kvt_matmul_packed_amx_ref and within a stated tolerance against the
 * scalar reference. Each output element's value depends only on its row, column and the weights
 * (tile edges are configured, never padded with other rows' data), not on n_rows or [o0,o1).
 *
 * Threads: ldtilecfg at the start of each call (tile state is per thread), tilerelease at the end.
 * The process-wide XTILEDATA permission is requested once by kq_amx_request (dispatch.c init).
 */
#include "kernels_internal.h"

#include <math.h>
#include <stdlib.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Scalar reference of the AMX kernel's arithmetic (any CPU). */
void kvt_matmul_packed_amx_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy,
                               int64_t o0, int64_t o1) {
    kvt_f16_table_init();
    if (!P || !P->amx || o1 <= o0 || n_rows <= 0 || o0 < 0 || o1 > P->n_out) return;
    const size_t arb = (size_t)P->nb * sizeof(blk_q8_0);
    const uint8_t *A = act;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t o = o0; o < o1; o++) {
            const int64_t g = o / KQA_N;
            const int n = (int)(o % KQA_N);
            float acc = 0.0f;
            for (int64_t b = 0; b < P->nb; b++) {
                const uint8_t *p = P->amx + ((size_t)g * (size_t)P->nb + (size_t)b) * KQA_GBB;
                const uint8_t *pa = A + (size_t)r * arb + (size_t)b * sizeof(blk_q8_0);
                uint16_t h;
                memcpy(&h, pa, 2);
                float dw;
                memcpy(&dw, p + 4 * n, 4);
                int32_t isum = 0;
                for (int k4 = 0; k4 < 8; k4++)
                    for (int j = 0; j < 4; j++)
                        isum += (int32_t)(int8_t)p[64 + 64 * k4 + 4 * n + j] * (int8_t)pa[2 + 4 * k4 + j];
                const float s = dw * kq_h2f(h);
                acc = fmaf((float)isum, s, acc);
            }
            y[r * ldy + o] = acc;
        }
}

#if KVT_X86
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KQA_ARCH_REQ_XCOMP_PERM 0x1023
#define KQA_XFEATURE_XTILEDATA 18

bool kq_amx_request(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return false; /* AMX-TILE, AMX-INT8 */
    const char *deny = getenv("KVT_AMX_DENY"); /* test hook: behave as if the kernel refused */
    if (deny && !strcmp(deny, "1")) return false;
#ifdef SYS_arch_prctl
    /* fails (EINVAL/ENOSPC...) where the kernel has no AMX support or refuses the larger signal frame */
    return syscall(SYS_arch_prctl, KQA_ARCH_REQ_XCOMP_PERM, KQA_XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

typedef struct {
    uint8_t palette, start_row;
    uint8_t rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kqa_cfg;

#define KQA_TGT __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* tiles: 0..3 C (C[mi][ni] = 2·mi+ni, mi: activation tile, ni: weight tile), 4..5 A, 6..7 B */
static KQA_TGT void kqa_config(int m0, int m1) {
    kqa_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    const int rows[8] = {m0, m0, m1, m1, m0, m1, 8, 8};
    const int colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
    for (int t = 0; t < 8; t++)
        if (rows[t] > 0) cfg.rows[t] = (uint8_t)rows[t], cfg.colsb[t] = (uint16_t)colsb[t];
    _tile_loadconfig(&cfg);
}

KQA_TGT void kq_amx_pmm_small_s(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy,
                                int64_t o0, int64_t o1) {
    const int64_t nb = P->nb;
    const size_t arb = (size_t)nb * sizeof(blk_q8_0);
    const int64_t ng = (P->n_out + KQA_N - 1) / KQA_N;
    const uint8_t *A = act;
    int32_t cbuf[4][16][16] __attribute__((aligned(64)));
    __m512 acc[32][2];
    int cm0 = -1, cm1 = -1;
    for (int64_t r0 = 0; r0 < n_rows; r0 += 32) {
        const int mr = n_rows - r0 < 32 ? (int)(n_rows - r0) : 32;
        const int m0 = mr < 16 ? mr : 16, m1 = mr - m0;
        if (m0 != cm0 || m1 != cm1) kqa_config(m0, m1), cm0 = m0, cm1 = m1;
        for (int64_t g = o0 / KQA_N; g * KQA_N < o1; g += 2) {
            const int nn = g + 1 < ng && (g + 1) * KQA_N < o1 ? 2 : 1;
            for (int m = 0; m < mr; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
            const uint8_t *B0 = P->amx + (size_t)g * (size_t)nb * KQA_GBB;
            const uint8_t *B1 = B0 + (size_t)nb * KQA_GBB;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *a = A + (size_t)r0 * arb + (size_t)b * sizeof(blk_q8_0);
                const uint8_t *pb0 = B0 + (size_t)b * KQA_GBB, *pb1 = B1 + (size_t)b * KQA_GBB;
                _tile_zero(0);
                _tile_loadd(4, a + 2, (long)arb);
                _tile_loadd(6, pb0 + 64, 64);
                _tile_dpbssd(0, 4, 6);
                _tile_stored(0, cbuf[0], 64);
                if (nn == 2) {
                    _tile_zero(1);
                    _tile_loadd(7, pb1 + 64, 64);
                    _tile_dpbssd(1, 4, 7);
                    _tile_stored(1, cbuf[1], 64);
                }
                if (m1) {
                    _tile_zero(2);
                    _tile_loadd(5, a + 2 + 16 * arb, (long)arb);
                    _tile_dpbssd(2, 5, 6);
                    _tile_stored(2, cbuf[2], 64);
                    if (nn == 2) {
                        _tile_zero(3);
                        _tile_dpbssd(3, 5, 7);
                        _tile_stored(3, cbuf[3], 64);
                    }
                }
                const __m512 dw0 = _mm512_loadu_ps((const float *)pb0);
                const __m512 dw1 = nn == 2 ? _mm512_loadu_ps((const float *)pb1) : dw0;
                for (int m = 0; m < mr; m++) {
                    const uint8_t *pa = a + (size_t)m * arb;
                    uint16_t h;
                    memcpy(&h, pa, 2);
                    const __m512 dx = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
                    const int ci = m < 16 ? 0 : 2, mm = m & 15;
                    const __m512i c0 = _mm512_load_si512((const void *)cbuf[ci][mm]);
                    acc[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), _mm512_mul_ps(dw0, dx), acc[m][0]);
                    if (nn == 2) {
                        const __m512i c1 = _mm512_load_si512((const void *)cbuf[ci + 1][mm]);
                        acc[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), _mm512_mul_ps(dw1, dx), acc[m][1]);
                    }
                }
            }
            for (int ni = 0; ni < nn; ni++) {
                const int64_t base = (g + ni) * KQA_N;
                const int64_t c0 = o0 > base ? o0 : base, c1 = o1 < base + KQA_N ? o1 : base + KQA_N;
                for (int m = 0; m < mr; m++) {
                    float v[16];
                    _mm512_storeu_ps(v, acc[m][ni]);
                    for (int64_t c = c0; c < c1; c++) y[(r0 + m) * ldy + c] = v[c - base];
                }
            }
        }
    }
    _tile_release();
}

/* Row-major Q8_0 / Q4_0 / Q5_0 with the AMX kernel's arithmetic (the KVT_ISA_AMX table's matmul[]: decode,
 * small batches and the packed path below KVT_AMX_MIN_ROWS), so that every Q8_0 product under AMX
 * has one float order and decode equals a full recompute bit for bit. Per block: the exact int32 dot
 * (abs/sign + vpdpbusd lanes, reduced exactly), then acc = fma((float)isum, dw·dx, acc); 4 outputs
 * at a time, one float lane each (lane-wise fma = fmaf). */
#define KQB_TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KQB_AI static inline __attribute__((always_inline)) KQB_TGT
/* The 32 weights of a block at p: Q8_0 as signed bytes; Q4_0 / Q5_0 as their unsigned codes
 * (weight + 8 / + 16), which kqb_dot multiplies as u8 and corrects with the activation sum. */
KQB_AI __m256i kqb_wload(const uint32_t wt, const uint8_t *p) {
    if (wt == KVT_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(p + 2));
    const uint8_t *qs = p + (wt == KVT_TYPE_Q4_0 ? 2 : 6);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    if (wt == KVT_TYPE_Q4_0) return v;
    uint32_t h; /* Q5_0: bit k of qh is the 5th bit of weight k */
    memcpy(&h, p + 2, 4);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)h),
                                              _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                                0x0101010101010101LL, 0));
    const __m256i bitm = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bitm), bitm), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(v, hi);
}
/* 8 int32 lanes whose sum is the exact block dot Σ w·x. Q8_0: |w| (u8) · sign(w)·x. Q4_0 / Q5_0: the
 * unsigned codes c = w + k (k = 8 / 16) times x, started from xk = −k·(per-lane Σx) (kqb_xcorr,
 * computed once per activation block for all output rows): Σ c·x − kΣx = Σ w·x, exact integers. */
KQB_AI __m256i kqb_dot(const uint32_t wt, const uint8_t *w, __m256i x, __m256i xk) {
    const __m256i wv = kqb_wload(wt, w);
    if (wt != KVT_TYPE_Q8_0) return _mm256_dpbusd_epi32(xk, wv, x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(x, wv));
}
KQB_AI __m256i kqb_xcorr(const uint32_t wt, __m256i x) {
    if (wt == KVT_TYPE_Q8_0) return _mm256_setzero_si256();
    const __m256i xs = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), x); /* 4-byte sums */
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(xs, wt == KVT_TYPE_Q4_0 ? 3 : 4));
}
KQB_AI float kqb_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
KQB_AI void kqb_mm(const uint32_t wt, const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y,
                   int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = n_in / QK8_0;
    const size_t wbb = wt == KVT_TYPE_Q8_0 ? sizeof(blk_q8_0) : wt == KVT_TYPE_Q4_0 ? sizeof(blk_q4_0) : sizeof(blk_q5_0);
    const size_t rb = (size_t)nb * sizeof(blk_q8_0), wrb = (size_t)nb * wbb;
    const uint8_t *W8 = W, *A = act;
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *a = A + (size_t)r * rb;
        int64_t o = o0;
        for (; o + 4 <= o1; o += 4) {
            const uint8_t *w0 = W8 + (size_t)o * wrb, *w1 = w0 + wrb, *w2 = w1 + wrb, *w3 = w2 + wrb;
            __m128 acc = _mm_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const size_t off = (size_t)b * sizeof(blk_q8_0), wo = (size_t)b * wbb;
                if (n_rows == 1) { /* GEMV (decode): prefetch 12 rows ahead, as the AVX-512 kernels do */
                    _mm_prefetch((const char *)(w0 + wo + 12 * wrb), _MM_HINT_T0);
                    _mm_prefetch((const char *)(w1 + wo + 12 * wrb), _MM_HINT_T0);
                    _mm_prefetch((const char *)(w2 + wo + 12 * wrb), _MM_HINT_T0);
                    _mm_prefetch((const char *)(w3 + wo + 12 * wrb), _MM_HINT_T0);
                }
                const __m256i x = _mm256_loadu_si256((const __m256i *)(a + off + 2)), xk = kqb_xcorr(wt, x);
                const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(kqb_dot(wt, w0 + wo, x, xk), kqb_dot(wt, w1 + wo, x, xk)),
                                                    _mm256_hadd_epi32(kqb_dot(wt, w2 + wo, x, xk), kqb_dot(wt, w3 + wo, x, xk)));
                const __m128i is = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                uint16_t h[4];
                memcpy(&h[0], w0 + wo, 2), memcpy(&h[1], w1 + wo, 2), memcpy(&h[2], w2 + wo, 2), memcpy(&h[3], w3 + wo, 2);
                const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], 0, 0, 0, 0));
                const __m128 s = _mm_mul_ps(dw, _mm_set1_ps(kqb_h2f(a + off)));
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(is), s, acc);
            }
            _mm_storeu_ps(y + r * ldy + o, acc);
        }
        for (; o < o1; o++) {
            const uint8_t *w = W8 + (size_t)o * wrb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const size_t off = (size_t)b * sizeof(blk_q8_0), wo = (size_t)b * wbb;
                const __m256i x = _mm256_loadu_si256((const __m256i *)(a + off + 2));
                const __m256i d = kqb_dot(wt, w + wo, x, kqb_xcorr(wt, x));
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                const float sc = kqb_h2f(w + wo) * kqb_h2f(a + off);
                acc = fmaf((float)_mm_cvtsi128_si32(s4), sc, acc);
            }
            y[r * ldy + o] = acc;
        }
    }
}
KQB_TGT void kq_amx_mm_q8_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                            int64_t o0, int64_t o1) {
    kqb_mm(KVT_TYPE_Q8_0, W, n_in, act, n_rows, y, ldy, o0, o1);
}
KQB_TGT void kq_amx_mm_q4_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                            int64_t o0, int64_t o1) {
    kqb_mm(KVT_TYPE_Q4_0, W, n_in, act, n_rows, y, ldy, o0, o1);
}
KQB_TGT void kq_amx_mm_q5_0(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                            int64_t o0, int64_t o1) {
    kqb_mm(KVT_TYPE_Q5_0, W, n_in, act, n_rows, y, ldy, o0, o1);
}
#endif
