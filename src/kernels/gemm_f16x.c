/*
 * gemm_f16x.c — 16-bit float weights in 16-output groups (KVT_TYPE_F16X for f16 values,
 * KVT_TYPE_BF16G for bf16 values): the load-time pack of the F16/BF16 matrices the bf16 pair dot does
 * not take (F16 values that are not bf16 values: files made from f16 checkpoints, f16 fine-tunes;
 * or, for both, a CPU without AVX-512 BF16, e.g. Ice Lake), the scalar reference of their arithmetic
 * and the AVX-512 and AVX2 (F16C + FMA) GEMM/GEMV.
 *
 * Why: on the row-major path (kernels_x86_tmpl.h tile_f) a decode step reads four F16 rows a row
 * apart, each with lane-parallel partial sums; on a Zen 5 that streamed llama-1b's and qwen3-0.6b's
 * weights at 0.65–0.8 of the read bandwidth (AVX2 code: 0.5–0.9), and prefill ran at about half of
 * the f32 FMA peak (0.53–0.7× ik_llama.cpp's pp128/pp512 on qwen3-0.6b). Here the 16 outputs of a
 * group share one 32-byte line per input, so a GEMV is one contiguous stream per group and a GEMM
 * tile loads a line once for 12 (AVX2: 6) activation rows. The weights are never rounded and the
 * activations stay f32: the same precision as the row-major path, another summation order (hence
 * its own numerics tag, kvt_model_numerics_tag).
 *
 * Layout (n_in >= 1): outputs in groups of KFX_N = 16, the last group padded with +0 rows; group g
 * holds, for each input k = 0 .. n_in - 1, one 32-byte line: u16 l = w[16g + l][k] (the file's f16 or
 * bf16 bits). Group stride n_in · 32 bytes. Activation rows are f32 (kvt_vec_dot_type = F32).
 *
 * Arithmetic (per output element; the definition every path computes, bit for bit):
 *   s = +0; for k ascending: s = fma(f32(w[k]), x[k], s)
 * with round-to-nearest-even and no flushing (f16 or bf16 → f32 is exact; kvtier never sets
 * FTZ/DAZ). Each output is one sequential chain over the inputs, so results do not depend on n_rows,
 * [o0, o1), tile shapes, the thread count or the ISA: decode (n_rows = 1) equals the prefill GEMM
 * bit for bit.
 *
 * The two types differ only in that widening (F16C's vcvtph2ps, or a 16-bit shift).
 *
 * Ownership: kvt_f16x_pack returns a buffer the caller owns (free()); the kernels are stateless and
 * read caller-owned buffers.
 */
#include "kernels_internal.h"

#include <math.h>
#include <stdlib.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

typedef struct fx_pack_ctx {
    const uint16_t *W;
    int64_t n_in, n_out;
    uint8_t *L;
} fx_pack_ctx;

#if KVT_X86
static void fx_group_avx512(const uint16_t *Wg, int64_t n_in, int rows, uint16_t *dst);
#endif

/* group g's lines: line k = w[16g + l][k] for l = 0..15 (rows past n_out: +0) */
static void fx_group_scalar(const uint16_t *Wg, int64_t n_in, int rows, uint16_t *dst) {
    for (int64_t k = 0; k < n_in; k++)
        for (int l = 0; l < KFX_N; l++) dst[k * KFX_N + l] = l < rows ? Wg[(size_t)l * (size_t)n_in + (size_t)k] : 0;
}

static bool fx_pack_part(void *arg, int64_t g0, int64_t g1) {
    const fx_pack_ctx *c = arg;
    for (int64_t g = g0; g < g1; g++) {
        const int64_t left = c->n_out - g * KFX_N;
        const int rows = left < KFX_N ? (int)left : KFX_N;
        const uint16_t *Wg = c->W + (size_t)g * KFX_N * (size_t)c->n_in;
        uint16_t *dst = (uint16_t *)(c->L + (size_t)g * (size_t)c->n_in * 2 * KFX_N);
#if KVT_X86
        if (kvt_kernels_best_isa() >= KVT_ISA_AVX512 && c->n_in % 2 == 0 && c->n_in / 2 <= INT32_MAX / KFX_N) {
            fx_group_avx512(Wg, c->n_in, rows, dst);
            continue;
        }
#endif
        fx_group_scalar(Wg, c->n_in, rows, dst);
    }
    return true;
}

uint8_t *kvt_f16x_pack(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out, size_t *bytes_out) {
    if (bytes_out) *bytes_out = 0;
    if (!W || (wtype != KVT_TYPE_F16 && wtype != KVT_TYPE_BF16) || n_in < 1 || n_out < 1) return NULL;
    const int64_t ng = (n_out + KFX_N - 1) / KFX_N;
    uint64_t bytes, n_all;
    if (!kvt_mul_ok((uint64_t)ng * KFX_N, (uint64_t)n_in * 2, &bytes) || bytes > SIZE_MAX / 2 ||
        !kvt_mul_ok((uint64_t)n_in, (uint64_t)n_out, &n_all))
        return NULL;
    uint8_t *L = kq_group_alloc((size_t)bytes);
    if (!L) return NULL;
    fx_pack_ctx c = {W, n_in, n_out, L};
    if (!kq_groups_parallel(ng, n_all, fx_pack_part, &c)) {
        free(L);
        return NULL;
    }
    if (bytes_out) *bytes_out = (size_t)bytes;
    return L;
}

/* ---- the reference arithmetic ---- */

void kq_f16x_ref(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                 int64_t o0, int64_t o1) {
    if (n_in < 1) return;
    const bool bf = wtype == KVT_TYPE_BF16G;
    const uint8_t *L = W;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wb = L + (size_t)(o / KFX_N) * (size_t)n_in * 2 * KFX_N + 2 * (size_t)(o % KFX_N);
        for (int64_t r = 0; r < n_rows; r++) {
            const float *x = (const float *)act + (size_t)r * (size_t)n_in;
            float s = 0.0f;
            for (int64_t k = 0; k < n_in; k++) {
                const uint16_t h = kq_rd16(wb + (size_t)k * 2 * KFX_N);
                s = fmaf(bf ? kvt_bf16_to_f32(h) : kq_h2f(h), x[k], s);
            }
            y[r * ldy + o] = s;
        }
    }
}

#if KVT_X86
#include <immintrin.h>

#define KFX_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define KFX_AI static inline __attribute__((always_inline)) KFX_TGT

/* Each group stream fetches the line KFX_PF bytes (64 inputs) ahead, one fetch per 64-byte line (the
 * last lines' fetches reach into the next group, which the next tile reads). Measured on a 2-core Zen 5
 * (bench/batch_step, llama-1b full-precision F16, 2 threads, alternated builds): 8-row steps 73–80 →
 * 53–61 ms, 1-row steps 35–39 → 32–35 ms; 4096 and 8192 bytes ahead were slower again. */
#define KFX_PF 2048

/* 16 weights widened to f32: f16 by F16C, bf16 by a shift (both exact) */
KFX_AI __m512 fx_widen(const bool BF, const uint8_t *p) {
    const __m256i h = _mm256_load_si256((const __m256i *)p);
    return BF ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* One tile: NG groups of 16 outputs × NR activation rows over all inputs. acc[g][r] lane l is output
 * 16·(g0+g)+l of row r: a single FMA chain over k (the reference order). */

KFX_AI void fx_tile(const bool BF, const int NG, const int NR, const uint8_t *Wg, size_t gs, const float *X, size_t ldx,
                    int64_t n, float *y, int64_t ldy, int64_t obase, int64_t o0, int64_t o1) {
    __m512 acc[4][12];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) acc[g][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k++) {
        __m512 w[4];
        if ((k & 1) == 0) /* each group's next lines: see KFX_PF */
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) _mm_prefetch((const char *)(Wg + (size_t)g * gs + (size_t)k * 32 + KFX_PF), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
            w[g] = fx_widen(BF, Wg + (size_t)g * gs + (size_t)k * 32);
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) {
            const __m512 xb = _mm512_set1_ps(X[(size_t)r * ldx + (size_t)k]);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[g][r] = _mm512_fmadd_ps(w[g], xb, acc[g][r]);
        }
    }
    for (int g = 0; g < NG; g++) {
        const int64_t ob = obase + 16 * g; /* lanes outside [o0, o1) are not stored */
        const int64_t lo = o0 > ob ? o0 - ob : 0, hi = o1 < ob + 16 ? o1 - ob : 16;
        const __mmask16 m = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy + ob, m, acc[g][r]);
    }
}

#define KFX_ROWS_CASES(NG)                                                       \
    switch (nr) {                                                                \
    case 1: fx_tile(BF, NG, 1, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 2: fx_tile(BF, NG, 2, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 3: fx_tile(BF, NG, 3, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 4: fx_tile(BF, NG, 4, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 5: fx_tile(BF, NG, 5, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 6: fx_tile(BF, NG, 6, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 7: fx_tile(BF, NG, 7, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 8: fx_tile(BF, NG, 8, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 9: fx_tile(BF, NG, 9, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;    \
    case 10: fx_tile(BF, NG, 10, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;  \
    case 11: fx_tile(BF, NG, 11, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;  \
    default: fx_tile(BF, NG, 12, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;  \
    }

KFX_AI void fx_tile_ng(const bool BF, int ng, int nr, const uint8_t *Wg, size_t gs, const float *X, size_t ldx,
                       int64_t n, float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    if (ng == 4) {
        switch (nr) { /* only few-row tiles use 4 groups */
        case 1: fx_tile(BF, 4, 1, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        case 2: fx_tile(BF, 4, 2, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        default: fx_tile(BF, 4, 3, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        }
    } else if (ng == 2) {
        KFX_ROWS_CASES(2)
    } else {
        KFX_ROWS_CASES(1)
    }
}

/* The tiles for kq_groups_mm (X: f32 rows xrb bytes apart) */
static KFX_TGT void fx_tile_f16(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb, int64_t n,
                                float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    fx_tile_ng(false, ng, nr, Wg, gs, (const float *)X, xrb / 4, n, y, ldy, ob, o0, o1);
}
static KFX_TGT void fx_tile_bf16(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb, int64_t n,
                                 float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    fx_tile_ng(true, ng, nr, Wg, gs, (const float *)X, xrb / 4, n, y, ldy, ob, o0, o1);
}

/* Rows in blocks of 36 (their f32 activations stay in L2 while every group of the call's output
 * range passes over them); within a block, tiles of 2 groups × 12 rows (24 accumulators); up to 3
 * rows, 4 groups × the rows (4 independent chains a row). */
static const kq_grp_plan fx_plan = {.rows_block = 36, .tile_rows = 12, .g4_rows = 3, .g2_rows = 12};

KFX_TGT void kq_f16x_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                        int64_t o0, int64_t o1) {
    if (n_in < 1) return;
    kq_groups_mm(&fx_plan, fx_tile_f16, W, (size_t)n_in * 32, act, (size_t)n_in * 4, n_in, n_rows, y, ldy, o0, o1);
}
KFX_TGT void kq_bf16g_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                         int64_t o0, int64_t o1) {
    if (n_in < 1) return;
    kq_groups_mm(&fx_plan, fx_tile_bf16, W, (size_t)n_in * 32, act, (size_t)n_in * 4, n_in, n_rows, y, ldy, o0, o1);
}

/* ---- AVX2 (F16C + FMA): a group's 16 lanes as two 8-lane halves, the same chains, the same bits ----
 * 16 registers: the GEMM tile is 1 group × 6 rows (12 accumulators), the GEMV 4 groups × 1 row (8
 * chains), 2 rows 2 groups. */
#define KFX2_TGT __attribute__((target("avx2,fma,f16c")))
#define KFX2_AI static inline __attribute__((always_inline)) KFX2_TGT

KFX2_AI __m256 fx2_widen(const bool BF, const uint8_t *p) {
    const __m128i h = _mm_load_si128((const __m128i *)p);
    return BF ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

KFX2_AI void fx2_tile(const bool BF, const int NG, const int NR, const uint8_t *Wg, size_t gs, const float *X,
                      size_t ldx, int64_t n, float *y, int64_t ldy, int64_t obase, int64_t o0, int64_t o1) {
    __m256 acc[4][6][2];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) acc[g][r][0] = acc[g][r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; k++) {
        if ((k & 1) == 0) /* as the AVX-512 tiles: KFX_PF */
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) _mm_prefetch((const char *)(Wg + (size_t)g * gs + (size_t)k * 32 + KFX_PF), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const uint8_t *p = Wg + (size_t)g * gs + (size_t)k * 32;
            const __m256 wl = fx2_widen(BF, p), wh = fx2_widen(BF, p + 16);
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++) {
                const __m256 xb = _mm256_set1_ps(X[(size_t)r * ldx + (size_t)k]);
                acc[g][r][0] = _mm256_fmadd_ps(wl, xb, acc[g][r][0]);
                acc[g][r][1] = _mm256_fmadd_ps(wh, xb, acc[g][r][1]);
            }
        }
    }
    for (int g = 0; g < NG; g++) {
        const int64_t ob = obase + 16 * g; /* lanes outside [o0, o1) are not stored */
        const int64_t lo = o0 > ob ? o0 - ob : 0, hi = o1 < ob + 16 ? o1 - ob : 16;
        for (int r = 0; r < NR; r++) {
            float t[16];
            _mm256_storeu_ps(t, acc[g][r][0]);
            _mm256_storeu_ps(t + 8, acc[g][r][1]);
            memcpy(y + (int64_t)r * ldy + ob + lo, t + lo, (size_t)(hi - lo) * sizeof(float));
        }
    }
}

KFX2_AI void fx2_tile_ng(const bool BF, int ng, int nr, const uint8_t *Wg, size_t gs, const float *X, size_t ldx,
                         int64_t n, float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    if (ng == 4) fx2_tile(BF, 4, 1, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); /* one row only */
    else if (ng == 2 && nr == 1) fx2_tile(BF, 2, 1, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1);
    else if (ng == 2) fx2_tile(BF, 2, 2, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1);
    else switch (nr) {
        case 1: fx2_tile(BF, 1, 1, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        case 2: fx2_tile(BF, 1, 2, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        case 3: fx2_tile(BF, 1, 3, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        case 4: fx2_tile(BF, 1, 4, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        case 5: fx2_tile(BF, 1, 5, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        default: fx2_tile(BF, 1, 6, Wg, gs, X, ldx, n, y, ldy, ob, o0, o1); break;
        }
}

static KFX2_TGT void fx2_tile_f16(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb,
                                  int64_t n, float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    fx2_tile_ng(false, ng, nr, Wg, gs, (const float *)X, xrb / 4, n, y, ldy, ob, o0, o1);
}
static KFX2_TGT void fx2_tile_bf16(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb,
                                   int64_t n, float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    fx2_tile_ng(true, ng, nr, Wg, gs, (const float *)X, xrb / 4, n, y, ldy, ob, o0, o1);
}

/* Row blocks as on AVX-512; within a block, 1 group × 6 rows, or for 1 (2) rows 4 (2) groups at once. */
static const kq_grp_plan fx2_plan = {.rows_block = 36, .tile_rows = 6, .g4_rows = 1, .g2_rows = 2};

KFX2_TGT void kq_f16x_mm_avx2(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                              int64_t o0, int64_t o1) {
    if (n_in < 1) return;
    kq_groups_mm(&fx2_plan, fx2_tile_f16, W, (size_t)n_in * 32, act, (size_t)n_in * 4, n_in, n_rows, y, ldy, o0, o1);
}
KFX2_TGT void kq_bf16g_mm_avx2(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                               int64_t o0, int64_t o1) {
    if (n_in < 1) return;
    kq_groups_mm(&fx2_plan, fx2_tile_bf16, W, (size_t)n_in * 32, act, (size_t)n_in * 4, n_in, n_rows, y, ldy, o0, o1);
}

/* The group's 16 rows two inputs at a time: one gather of their (k, k+1) dwords, then the low halves
 * are line k and the high halves line k+1. Rows past `rows` read as +0 (masked gather). */
static KFX_TGT void fx_group_avx512(const uint16_t *Wg, int64_t n_in, int rows, uint16_t *dst) {
    const int64_t np = n_in / 2;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int32_t)np));
    const __mmask16 m = (__mmask16)(rows >= 16 ? 0xFFFFu : (1u << rows) - 1u);
    for (int64_t p = 0; p < np; p++) {
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, (const void *)(Wg + 2 * p), 4);
        _mm256_store_si256((__m256i *)(dst + (2 * p) * KFX_N), _mm512_cvtepi32_epi16(v));
        _mm256_store_si256((__m256i *)(dst + (2 * p + 1) * KFX_N), _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
    }
}
#endif
