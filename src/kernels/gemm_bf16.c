/*
 * gemm_bf16.c — bf16 pair-dot weights (KVT_TYPE_BF16X): the load-time pack of F16/BF16 matrices,
 * the scalar reference of their arithmetic, the f32 → bf16 activation conversion and the AVX-512
 * BF16 (vdpbf16ps) GEMM/GEMV; and what this pack and gemm_f16x.c's share: the parallel pack loop
 * (kq_groups_parallel) and the walk of a group product's rows and groups (kq_groups_mm).
 *
 * Why: an f32 FMA does 16 multiply-adds per instruction; vdpbf16ps does 32 (two bf16 products per
 * f32 lane). The f32 GEMM of F16/BF16 weights already runs near the FMA peak, so only the bf16 dot
 * can make their prefill faster. Its price is that the activations are rounded to bf16 (8
 * significant bits), as llama.cpp does for BF16 weights; the weights are never rounded: an F16
 * matrix is packed only if every value is exactly a bf16 (true of F16 files converted from bf16
 * checkpoints, which is how current models are published), otherwise it keeps the f32 path.
 *
 * Layout (the BF16X "row-major" storage; n_in even): outputs in groups of KBX_N = 16, the last
 * group padded with zero rows; group g holds, for each pair p = 0 .. n_in/2 - 1, 16 dwords:
 *   dword l = bf16 w[16g + l][2p] | bf16 w[16g + l][2p + 1] << 16
 * so one 64-byte load gives the next weight pair of 16 outputs (group stride n_in/2 · 64 bytes).
 * Activation rows are plain bf16 rows (kvt_vec_dot_type(BF16X) = BF16, kvt_f32_to_bf16 rounding).
 *
 * Arithmetic (per output element; the definition every path computes, bit for bit): with
 * daz(v) = v if v is normal or zero, else a zero of v's sign, and ftz() the same on results
 * (the accumulator then never holds a denormal),
 *   s = +0; for p ascending: s = ftz(fma(daz(w[2p+1]), daz(x[2p+1]), s));
 *                            s = ftz(fma(daz(w[2p]),   daz(x[2p]),   s))
 * This model is exact except where a sum comes within rounding of the underflow threshold 2^-126
 * (≈ 1.2e-38) or a product underflows f32 altogether: there the instruction's flush-to-zero (which
 * tests tininess before rounding, and drops products below about 2^-150) can give a zero where the
 * model gives ±2^-126, or the other zero sign. Dots of activations and weights never get there;
 * test_bf16x checks the model against the instruction everywhere else, DAZ inputs included.
 * which is what vdpbf16ps does per f32 lane (Intel SDM: odd product first, then even, each added
 * with round-to-nearest-even; denormal inputs read as zero, denormal results flushed; the product
 * of two bf16 is exact in f32, so each add is an fma). test_kernels checks the instruction against
 * this model on random and near-underflow operands. Each output is one sequential chain over the
 * pairs, so results do not depend on n_rows, [o0, o1), tile shapes or the thread count: decode
 * (n_rows = 1) equals the prefill GEMM bit for bit (batch invariance).
 *
 * Ownership: kvt_bf16x_pack returns a malloc'd buffer the caller owns (free()); the kernels are
 * stateless and read caller-owned buffers.
 */
#include "kernels_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Packing context: per group, each row's bf16 values go to a row-major scratch (F16: the lossless
 * check on the way), then pair p of the 16 rows becomes one 64-byte line. bad: an F16 value that is
 * not a bf16 (or out of memory) in some part; the others stop early. */
typedef struct bx_pack_ctx {
    uint32_t wtype;
    bool round; /* F16: round to nearest bf16 instead of refusing inexact values */
    const uint16_t *W;
    int64_t n_in, n_out;
    uint8_t *L;
    _Atomic bool bad;
} bx_pack_ctx;

#if KVT_X86
static bool bx_row_bf16_avx512(const uint16_t *src, uint16_t *dst, int64_t n, bool round);
static void bx_interleave_avx512(const uint32_t *rows, int64_t np, uint32_t *dst);
static bool bx_have_avx512(void);
#endif

/* F16 values to bf16: false unless every value is exactly a bf16, or (round) rounded to nearest
 * even with kvt_f32_to_bf16 */
static bool bx_row_bf16_scalar(const uint16_t *src, uint16_t *dst, int64_t n, bool round) {
    for (int64_t i = 0; i < n; i++) {
        const float f = kq_h2f(src[i]);
        if (round) {
            dst[i] = kvt_f32_to_bf16(f);
        } else {
            const uint32_t u = f_bits(f);
            if (u & 0xFFFFu) return false;
            dst[i] = (uint16_t)(u >> 16);
        }
    }
    return true;
}

/* one row to bf16 (BF16: copied; F16: bx_row_bf16_scalar's rule) */
static bool bx_row_bf16(uint32_t wtype, bool round, const uint16_t *src, uint16_t *dst, int64_t n) {
    if (wtype == KVT_TYPE_BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return true;
    }
#if KVT_X86
    if (bx_have_avx512()) return bx_row_bf16_avx512(src, dst, n, round);
#endif
    return bx_row_bf16_scalar(src, dst, n, round);
}

/* groups [g0, g1) */
static bool bx_pack_part(void *arg, int64_t g0, int64_t g1) {
    bx_pack_ctx *j = arg;
    const int64_t np = j->n_in / 2;
    uint32_t *rows = malloc((size_t)KBX_N * (size_t)j->n_in * 2); /* 16 bf16 rows = 16 x np dwords */
    if (!rows) {
        j->bad = true;
        return false;
    }
    for (int64_t g = g0; g < g1 && !j->bad; g++) {
        for (int l = 0; l < KBX_N; l++) {
            const int64_t o = g * KBX_N + l;
            uint16_t *d = (uint16_t *)(rows + (size_t)l * (size_t)np);
            if (o >= j->n_out) memset(d, 0, (size_t)j->n_in * 2); /* padding rows are +0 */
            else if (!bx_row_bf16(j->wtype, j->round, j->W + (size_t)o * (size_t)j->n_in, d, j->n_in)) {
                j->bad = true;
                break;
            }
        }
        uint32_t *dst = (uint32_t *)(j->L + (size_t)g * (size_t)np * 64);
#if KVT_X86
        if (bx_have_avx512() && np <= INT32_MAX / KBX_N) {
            bx_interleave_avx512(rows, np, dst);
            continue;
        }
#endif
        for (int64_t p = 0; p < np; p++)
            for (int l = 0; l < KBX_N; l++) dst[p * KBX_N + l] = rows[(size_t)l * (size_t)np + (size_t)p];
    }
    free(rows);
    return !j->bad;
}

typedef struct grp_job {
    bool (*part)(void *, int64_t, int64_t);
    void *ctx;
    int64_t g0, g1;
    bool ok;
} grp_job;

static void *grp_run(void *arg) {
    grp_job *j = arg;
    j->ok = j->part(j->ctx, j->g0, j->g1);
    return NULL;
}

bool kq_groups_parallel(int64_t ng, uint64_t n_all, bool (*part)(void *ctx, int64_t g0, int64_t g1), void *ctx) {
    /* large matrices in parallel (a 1B-parameter F16 model is ~2 GB to convert at load) */
    int nt = n_all >= (1u << 22) ? kvt_n_cpus() : 1;
    if (nt > 8) nt = 8;
    if (nt > ng) nt = (int)ng;
    if (nt < 1) nt = 1;
    grp_job jobs[8];
    pthread_t th[8];
    bool started[8] = {false};
    for (int t = 0; t < nt; t++) {
        jobs[t] = (grp_job){part, ctx, ng * t / nt, ng * (t + 1) / nt, false};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, grp_run, &jobs[t]) == 0;
    }
    for (int t = 1; t < nt; t++)
        if (!started[t]) grp_run(&jobs[t]); /* no thread: do its part here */
    grp_run(&jobs[0]);
    bool ok = true;
    for (int t = 0; t < nt; t++) {
        if (t > 0 && started[t]) pthread_join(th[t], NULL);
        ok = ok && jobs[t].ok;
    }
    return ok;
}

void kq_groups_mm(const kq_grp_plan *pl, kq_grp_tile tile, const void *W, size_t gs, const void *act, size_t xrb,
                  int64_t n, int64_t n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t g0 = o0 / 16, g1 = (o1 + 15) / 16;
    const uint8_t *A = act;
    for (int64_t rb = 0; rb < n_rows; rb += pl->rows_block) {
        const int64_t re = rb + pl->rows_block < n_rows ? rb + pl->rows_block : n_rows;
        const int64_t rows = re - rb < pl->tile_rows ? re - rb : pl->tile_rows;
        const int gstep = rows <= pl->g4_rows ? 4 : rows <= pl->g2_rows ? 2 : 1;
        for (int64_t g = g0; g < g1; g += gstep) {
            const int ng = (int)(g1 - g < gstep ? g1 - g : gstep);
            const uint8_t *Wg = (const uint8_t *)W + (size_t)g * gs;
            for (int64_t r = rb; r < re; r += pl->tile_rows) {
                const int nr = (int)(re - r < pl->tile_rows ? re - r : pl->tile_rows);
                const int most = nr <= pl->g4_rows ? 4 : nr <= pl->g2_rows ? 2 : 1;
                for (int done = 0; done < ng;) { /* e.g. 3 leftover groups of a 4-group step: 2 + 1 */
                    const int left = ng - done < most ? ng - done : most;
                    const int take = left >= 4 ? 4 : left >= 2 ? 2 : 1;
                    tile(take, nr, Wg + (size_t)done * gs, gs, A + (size_t)r * xrb, xrb, n, y + r * ldy, ldy,
                         (g + done) * 16, o0, o1);
                    done += take;
                }
            }
        }
    }
}

uint8_t *kvt_bf16x_pack(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out, bool round_f16, size_t *bytes_out) {
    if (bytes_out) *bytes_out = 0;
    if (!W || (wtype != KVT_TYPE_F16 && wtype != KVT_TYPE_BF16) || n_in < 2 || n_in % 2 || n_out < 1) return NULL;
    kvt_f16_table_init();
    const int64_t ng = (n_out + KBX_N - 1) / KBX_N, np = n_in / 2;
    uint64_t bytes, n_all;
    if (!kvt_mul_ok((uint64_t)ng * KBX_N, (uint64_t)np * 4, &bytes) || bytes > SIZE_MAX / 2 ||
        !kvt_mul_ok((uint64_t)n_in, (uint64_t)n_out, &n_all))
        return NULL;
    uint8_t *L = kq_group_alloc((size_t)bytes);
    if (!L) return NULL;
    bx_pack_ctx c = {.wtype = wtype, .round = round_f16, .W = W, .n_in = n_in, .n_out = n_out, .L = L};
    atomic_init(&c.bad, false);
    if (!kq_groups_parallel(ng, n_all, bx_pack_part, &c)) { /* an F16 value that is not a bf16, or out of memory */
        free(L);
        return NULL;
    }
    if (bytes_out) *bytes_out = (size_t)bytes;
    return L;
}

/* ---- the reference arithmetic ---- */

static inline float bx_daz(uint16_t b) {
    if ((b & 0x7F80u) == 0) b &= 0x8000u; /* zero or denormal: a zero of its sign */
    return kvt_bf16_to_f32(b);
}
static inline float bx_ftz(float f) {
    uint32_t u = f_bits(f);
    if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
    memcpy(&f, &u, 4);
    return f;
}

float kq_bf16x_step_ref(float s, uint32_t w2, uint32_t x2) {
    s = bx_ftz(s); /* a denormal accumulator reads as zero too (never one in the kernels: they FTZ) */
    s = bx_ftz(fmaf(bx_daz((uint16_t)(w2 >> 16)), bx_daz((uint16_t)(x2 >> 16)), s));
    return bx_ftz(fmaf(bx_daz((uint16_t)w2), bx_daz((uint16_t)x2), s));
}

void kq_bf16x_ref(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                  int64_t o1) {
    if (n_in < 2 || n_in % 2) return;
    const int64_t np = n_in / 2;
    const uint8_t *L = W;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wb = L + (size_t)(o / KBX_N) * (size_t)np * 64 + 4 * (size_t)(o % KBX_N);
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t *xr = (const uint8_t *)act + (size_t)r * (size_t)n_in * 2;
            float s = 0.0f;
            for (int64_t p = 0; p < np; p++) {
                uint32_t w2, x2;
                memcpy(&w2, wb + (size_t)p * 64, 4);
                memcpy(&x2, xr + (size_t)p * 4, 4);
                s = kq_bf16x_step_ref(s, w2, x2);
            }
            y[r * ldy + o] = s;
        }
    }
}

#if KVT_X86
#include <immintrin.h>

#define KBX_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define KBX_AI static inline __attribute__((always_inline)) KBX_TGT

/* 16 f32 (as bits) → bf16 with kvt_f32_to_bf16's rounding (round to nearest even; NaN → quiet
 * NaN) in integer arithmetic, so the bytes equal the scalar conversion for every input. */
KBX_AI __m256i bx_rne16(__m512i u) {
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), q = _mm512_set1_epi32(64);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), q);
    return _mm512_cvtepi32_epi16(r);
}

/* activation rows: the same bytes as kvt_quantize_ref(BF16) */
KBX_TGT void kq_bf16_act_avx512(const float *x, void *dst, int64_t n) {
    uint16_t *o = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(o + i), bx_rne16(_mm512_castps_si512(_mm512_loadu_ps(x + i))));
    for (; i < n; i++) o[i] = kvt_f32_to_bf16(x[i]);
}

/* Tiles of 4 rows and more fetch each group stream's line KBX_PF bytes (64 pairs) ahead (the last
 * lines' fetches reach into the next group, which the next tile reads). Measured on a 2-core Zen 5
 * (bench/batch_step, llama-1b BF16, 2 threads, alternated builds): 8-row steps 49–87 → 42–60 ms;
 * prefill qwen3-0.6b pp256 421–451 → 462–477 t/s in one A/B, within noise in another (pp512 383–408
 * → 383–396). The GEMV tiles (1–3 rows) do not: there the fetches cost llama-1b / qwen3-0.6b decode
 * 7–19 % in 11 of 12 cells (3 alternated rounds, 1 and 2 threads); the hardware prefetchers follow
 * their four streams alone. */
#define KBX_PF 4096

/* One tile: NG groups of 16 outputs × NR activation rows over all pairs. acc[g][r] lane l is output
 * 16·(g0+g)+l of row r: a single vdpbf16ps chain over the pairs (the reference order). */
KBX_AI void bx_tile(const int NG, const int NR, const uint8_t *Wg, size_t gstride, const uint8_t *X, size_t xrb,
                    int64_t np, float *y, int64_t ldy, int64_t obase, int64_t o0, int64_t o1) {
    __m512 acc[4][12];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) acc[g][r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        __m512bh w[4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) /* see KBX_PF */
            if (NR >= 4) _mm_prefetch((const char *)(Wg + (size_t)g * gstride + (size_t)p * 64 + KBX_PF), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
            w[g] = (__m512bh)_mm512_load_si512((const void *)(Wg + (size_t)g * gstride + (size_t)p * 64));
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) {
            int32_t x2;
            memcpy(&x2, X + (size_t)r * xrb + (size_t)p * 4, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(x2);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[g][r] = _mm512_dpbf16_ps(acc[g][r], w[g], xb);
        }
    }
    for (int g = 0; g < NG; g++) {
        const int64_t ob = obase + 16 * g; /* lanes outside [o0, o1) are not stored */
        const int64_t lo = o0 > ob ? o0 - ob : 0, hi = o1 < ob + 16 ? o1 - ob : 16;
        const __mmask16 m = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy + ob, m, acc[g][r]);
    }
}

/* NR rows of groups [ga, gb): GEMV-like shapes (few rows) take 4 groups at once for independent
 * chains; the GEMM takes 2 groups × 12 rows (24 accumulators). */
#define KBX_ROWS_CASES(NG)                                                                                      \
    switch (nr) {                                                                                               \
    case 1: bx_tile(NG, 1, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 2: bx_tile(NG, 2, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 3: bx_tile(NG, 3, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 4: bx_tile(NG, 4, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 5: bx_tile(NG, 5, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 6: bx_tile(NG, 6, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 7: bx_tile(NG, 7, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 8: bx_tile(NG, 8, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 9: bx_tile(NG, 9, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                      \
    case 10: bx_tile(NG, 10, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                    \
    case 11: bx_tile(NG, 11, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                    \
    default: bx_tile(NG, 12, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;                                    \
    }

static KBX_TGT void bx_tile_ng(int ng, int nr, const uint8_t *Wg, size_t gs, const uint8_t *X, size_t xrb, int64_t np,
                               float *y, int64_t ldy, int64_t ob, int64_t o0, int64_t o1) {
    if (ng == 4) {
        switch (nr) { /* only few-row tiles use 4 groups */
        case 1: bx_tile(4, 1, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;
        case 2: bx_tile(4, 2, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;
        default: bx_tile(4, 3, Wg, gs, X, xrb, np, y, ldy, ob, o0, o1); break;
        }
    } else if (ng == 2) {
        KBX_ROWS_CASES(2)
    } else {
        KBX_ROWS_CASES(1)
    }
}

/* Rows in blocks of 60 (their bf16 activations stay in L2 while every group of this call's output
 * range passes over them); within a block, tiles of 12 rows; up to 3 rows, 4 groups at once. */
static const kq_grp_plan bx_plan = {.rows_block = 60, .tile_rows = 12, .g4_rows = 3, .g2_rows = 12};

KBX_TGT void kq_bf16x_mm(const void *W, int64_t n_in, const void *act, int64_t n_rows, float *y, int64_t ldy,
                         int64_t o0, int64_t o1) {
    if (n_in < 2 || n_in % 2) return;
    const int64_t np = n_in / 2;
    kq_groups_mm(&bx_plan, bx_tile_ng, W, (size_t)np * 64, act, (size_t)n_in * 2, np, n_rows, y, ldy, o0, o1);
}

/* F16 row → bf16, 16 at a time with F16C: exact, so a value is a bf16 iff the low 16 bits of its
 * f32 are zero (the same test as the scalar loop) */
static KBX_TGT bool bx_row_bf16_avx512(const uint16_t *src, uint16_t *dst, int64_t n, bool round) {
    int64_t i = 0;
    const __m512i low = _mm512_set1_epi32(0xFFFF);
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
        if (round) {
            _mm256_storeu_si256((__m256i *)(dst + i), bx_rne16(u));
            continue;
        }
        if (_mm512_test_epi32_mask(u, low)) return false;
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
    return bx_row_bf16_scalar(src + i, dst + i, n - i, round);
}
/* dst line p = dword p of each of the 16 rows (one gather a line) */
static KBX_TGT void bx_interleave_avx512(const uint32_t *rows, int64_t np, uint32_t *dst) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int32_t)np));
    for (int64_t p = 0; p < np; p++)
        _mm512_store_si512((void *)(dst + p * KBX_N), _mm512_i32gather_epi32(idx, (const void *)(rows + p), 4));
}
static bool bx_have_avx512(void) { return kvt_kernels_best_isa() >= KVT_ISA_AVX512; }

/* The instruction itself on one vector, for the test that checks the reference model against it. */
KBX_TGT void kq_bf16x_dp_hw(float acc[16], const uint32_t w2[16], const uint32_t x2[16]) {
    __m512 a = _mm512_loadu_ps(acc);
    a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(w2), (__m512bh)_mm512_loadu_si512(x2));
    _mm512_storeu_ps(acc, a);
}
#endif
