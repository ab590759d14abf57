/*
 * attention.c — causal (optionally windowed) GQA attention that reads K/V rows straight from a
 * sequence's blocks, plus the naive contiguous-f32 reference it must match bit for bit.
 *
 * Both implementations compute, per (query row i, head h), with p = pos0 + i:
 *   keys j in [lo, hi], lo = window ? max(0, p - window + 1) : 0, hi = p
 *   q16 = f16(q)                                      (kvt_vec_round_f16)
 *   s_j = kvt_vec_dot(q16, k_j, hd_k) * scale          (same helper, same order)
 *   m = max_j s_j; e_j = kvt_vec_exp(s_j - m); sum = e_lo + ... + e_hi (kvt_vec_exp_sum order)
 *   w_j = f16(e_j * (1/sum))                          (kvt_vec_round_f16)
 *   acc[0..15] = 0; for j ascending: kvt_vec_axpy(acc[j % 16], w_j, v_j)  (lane = absolute position % 16)
 *   o = kvt_vec_lanes_reduce(acc): t_l = acc_l + acc_l+8, u_l = t_l + t_l+4, (u0 + u2) + (u1 + u3)
 * so for the same decoded f32 K/V they produce identical bits. The two f16 roundings are those of
 * llama.cpp's default (non-flash) CPU attention over an f16 cache, where K·Q converts Q to f16 and
 * the V product converts the normalized softmax weights to f16; the V product's 16 lanes over keys
 * are the order of that product for a batch on AVX-512 (tinyBLAS: a key's lane is its cache
 * position mod 16, each lane fused-multiply-adds in ascending order, then the 16-lane horizontal
 * sum; for a single token llama.cpp takes another order, ggml_vec_dot_f16, which kvtier does not
 * copy: decode must equal a full recompute). Models with large logits are
 * sensitive to exactly these roundings (tests/fixtures/llama-tiny-q5_k_m: without them the logits
 * differ from the reference by ~0.1-0.3 nats; with them by < 1e-3). MLA (latent) layers skip both
 * roundings: the reference engines run absorbed latent attention in f32 (tests/test_deepseek2.c). The block walker never gathers the
 * context: per KV head it streams that head's rows (contiguous within a block: sections are ordered
 * [kv_head][token]) in chunks of up to ATT_KC keys, decodes a chunk once (unpadded f16 rows: one call for the
 * whole chunk) into a small f32 tile and uses it
 * for up to ATT_TILE (query, head) pairs that share the KV head (GQA and multi-row prefill). Scores
 * come from kvt_vec_dot_rows / kvt_vec_dot_q4 (or, on AVX-512 with at least ATT_KT_MIN_PAIRS pairs,
 * kvt_vec_dot_kt_q4 over the chunk transposed so keys run across the vector lanes; f16 chunks are
 * decoded straight into that layout) and the weighted sum from kvt_vec_axpy_rows (per lane, the
 * lane's keys as a strided run of tile rows; MLA layers keep one accumulator and kvt_vec_axpy_q4),
 * all bit-identical to looping kvt_vec_dot / kvt_vec_axpy over the keys in ascending order (codec.c).
 * F16 and 8/4-bit AFFINE rows of non-latent layers, where the vector table has the encoded-row
 * forms (AVX2, AVX-512), are not decoded into the tile: kvt_vec_dot_enc_qn / kvt_vec_axpy_enc_qn read them
 * in place for up to KVT_VEC_QN pairs a pass (fused_rows; the same bits as the tile). At long
 * context this halves a decode step's attention over f16 rows and cuts it by about 2.5x over
 * affine ones (bench/attn --split): the tile's stores and reloads, the per-row decode calls and dot_q4's
 * fourth, repeated query of a GQA group of 3 cost more than the in-register decode they save.
 *
 * TURBO layers (turbo.c): their blocks hold K/V rotated by Π_K / Π_V of (layer, kv head). The query
 * of each pair is rotated once (q' = Π_K q, so s_j = <q', ŷ_j>·scale needs no per-key inverse
 * rotation), TURBO blocks' weighted values accumulate in a second, rotated set of lane accumulators
 * (reduced like the first), and after
 * the 1/sum scaling that accumulator is un-rotated once (Π_V^T) and added to the base-codec part
 * (or copied, when the pair sees no base-codec keys). Base-codec blocks before quant_start are read
 * as usual with the unrotated query. For an all-TURBO pair this equals, bit for bit, Π_V^T applied
 * to kvt_attention_ref over (Π_K q, decoded rotated rows) — what test_kv_turbo checks.
 *
 * Split-K (kvt_attention_split, the decode row of a multi-threaded forward pass): the threads share
 * every KV head instead of splitting heads, in three phases separated by barriers: (1) each thread
 * scores all query heads against its range of the visible keys (each score is one kvt_vec_dot, the
 * same bits whoever computes it); (2) each thread runs the softmax of whole heads (softmax_inplace
 * and the f16 rounding, as above: the exp sum's order stays kvt_vec_exp_sum's over all keys); (3)
 * each thread accumulates its range of V columns over all keys, each key into the lane of its
 * position and every lane in ascending order, then reduces the lanes per column (axpy is an
 * elementwise fmaf chain and kvt_vec_lanes_reduce works per column, so a column range has the bits of the
 * whole row). Every K and V row is
 * thus read by one thread, whatever the head counts, and the output equals kvt_attention's bit for
 * bit (tests/test_kv_attention.c). TURBO and MLA layers are not split this way.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "kv_int.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* (query, head) pairs sharing one pass over the KV head's rows: each decoded K/V chunk serves up to
 * ATT_TILE pairs, so a long prefill decodes every block row n_pairs / ATT_TILE times. The tile's
 * scores take ATT_TILE * context floats, so past ATT_BIG_CTX keys the tile shrinks to
 * ATT_TILE_SMALL to bound scratch memory. The tile size never changes results: every pair's
 * scores, softmax and weighted sum are computed by the same per-pair operations in the same order
 * whatever pairs share its tile (tests/test_kv_attention.c checks tile splits). */
#define ATT_TILE 64
#define ATT_TILE_SMALL 16
#define ATT_BIG_CTX 16384u
#define ATT_KC 64   /* keys decoded per chunk, at most (see chunk_keys) */
/* Keys per V chunk where V rows are read in place (fused_rows): no tile bounds it, and a lane's
 * call then covers 8 rows (its accumulators loaded and stored once per 8 rows instead of per 2 at
 * head dim 128 with chunk_keys' 32). Against chunk_keys: qwen3-0.6b shape (head dim 128) decode
 * attention at 16384 keys 4.0 -> 3.3 ms per layer on 2 threads, 512-query prefill at 3584 694 ->
 * 1170 q/s; smol-135m (64) about 5% faster; 256 keys was slower for decode at head dim 64
 * (bench/attn, AVX2 Zen 3). Chunking never changes results. */
#define ATT_VKC 128
/* Keys per V chunk read in place for a call with several queries (prefill): the groups of pairs
 * after a chunk's first read its rows from cache (kvt_vec_rowfmt cached: no fetches ahead), so a
 * longer chunk lengthens the lane calls (16 rows each) and costs no stream. With the skipped
 * fetches and lanes_group's common runs, 512-query attention 8-11% faster than 128-key chunks
 * with fetches and equal-range groups, for smol-135m's and qwen3-0.6b's shapes (one thread, AVX-512
 * Zen 5; bench/results/zen5-2026-12-07d.md). Chunking never changes results. */
#define ATT_VKC_MULTI 256
#define ATT_DUMMY 512 /* max head_dim for the padded 4-output V kernel */
/* Pass 1 transposes a K chunk (AVX-512, kvt_vec_dot_kt_q4) only when at least this many pairs score
 * it: the transpose costs about as much as four groups of four pairs save (decode steps keep the
 * row-major kernel). Either kernel gives the same bits. */
#define ATT_KT_MIN_PAIRS 16
/* The V product (non-latent layers) sums key p's term into lane p % ATT_VL, each lane in ascending
 * key order with fmaf, then reduces the lanes (kvt_vec_lanes_reduce): the order of llama.cpp's CPU V product
 * over an f16 cache for a batch on an AVX-512 machine (tinyBLAS, 16 lanes; the machine of the
 * reference fixtures, tests/test_ref_llama_q5km.c, whose agreement depends on this order). */
#define ATT_VL 16

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Keys per chunk: the decoded f32 tile (keys x head dim) stays at 16 KiB, half of L1, so 64 keys up
 * to head dim 64 and 32 above (a 32 KiB tile for head dim 128 evicts the scores and queries it
 * works with). Chunking never changes results. */
static uint32_t chunk_keys(uint32_t dim) { return dim <= 64 ? ATT_KC : ATT_KC / 2; }

/* Pairs per tile for a call whose keys end before position n (pos0 + n_q). */
static uint32_t tile_pairs(uint64_t n) { return n < ATT_BIG_CTX ? ATT_TILE : ATT_TILE_SMALL; }

size_t kvt_attention_scratch_floats(const kvt_kv_layout *l, uint32_t n_ctx) {
    /* f16-rounded queries of a tile, the decoded K/V chunk, the tile's scores, and (TURBO) rotated
     * queries + rotated accumulators. Scores: a call with n = pos0 + n_q <= n_ctx keys uses
     * tile_pairs(n) * pad16(n + 1) floats; the larger of the two regimes bounds every such n. */
    const size_t small_n = n_ctx < ATT_BIG_CTX - 1 ? n_ctx : ATT_BIG_CTX - 1;
    size_t sc = (size_t)ATT_TILE * pad16(small_n + 1);
    if (n_ctx >= ATT_BIG_CTX) {
        const size_t big = (size_t)ATT_TILE_SMALL * pad16((size_t)n_ctx + 1);
        sc = big > sc ? big : sc;
    }
    return (size_t)(ATT_TILE + 2 * ATT_KC) * pad16(l->max_head_dim) + sc + 2 * (size_t)ATT_TILE * pad16(l->max_head_dim) +
           2 * (size_t)ATT_TILE * ATT_VL * pad16(l->max_head_dim); /* the V product's lane accumulators */
}

/* Maximum of sc[0..n) ignoring NaNs, or -INFINITY. 8 running maxima then a combine: max is exact,
 * so only the sign of a zero maximum can depend on the order, and exp(s - m) is the same for m = +0
 * and m = -0 (s - 0 == s for s != 0, and exp(±0) = 1). */
float kvt_attention_max_scores_scalar(const float *sc, uint32_t n) {
    float m8[8];
    for (int l = 0; l < 8; l++) m8[l] = -INFINITY;
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            m8[l] = sc[j + l] > m8[l] ? sc[j + l] : m8[l];
    float m = -INFINITY;
    for (int l = 0; l < 8; l++)
        if (m8[l] > m) m = m8[l];
    for (; j < n; j++)
        if (sc[j] > m) m = sc[j];
    return m;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* The same maximum with 16-lane AVX-512 running maxima. _mm512_max_ps(x, m) returns m when x is NaN
 * and m for x == m (either zero sign), exactly `x > m ? x : m` of the scalar loop, so NaNs are
 * ignored alike and only the sign of a zero maximum can differ (harmless, see above). */
__attribute__((target("avx512f"))) static float max_scores_avx512(const float *sc, uint32_t n) {
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    uint32_t j = 0;
    for (; j + 16 <= n; j += 16) m16 = _mm512_max_ps(_mm512_loadu_ps(sc + j), m16);
    if (j < n) {
        const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        m16 = _mm512_mask_max_ps(m16, k, _mm512_maskz_loadu_ps(k, sc + j), m16);
    }
    return _mm512_reduce_max_ps(m16);
}
/* AVX2: 8 running maxima, exactly the scalar form's (the same lanes; _mm256_max_ps(x, m) is
 * `x > m ? x : m` as above), then the same combine and tail. */
__attribute__((target("avx2"))) static float max_scores_avx2(const float *sc, uint32_t n) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(sc + j), m8);
    float l8[8], m = -INFINITY;
    _mm256_storeu_ps(l8, m8);
    for (int l = 0; l < 8; l++)
        if (l8[l] > m) m = l8[l];
    for (; j < n; j++)
        if (sc[j] > m) m = sc[j];
    return m;
}
#define ATT_HAVE_AVX512 1
#endif

float kvt_attention_max_scores(const float *sc, uint32_t n) {
#ifdef ATT_HAVE_AVX512
    if (kvt_vec_level() == 2) return max_scores_avx512(sc, n);
    if (kvt_vec_level() == 1) return max_scores_avx2(sc, n);
#endif
    return kvt_attention_max_scores_scalar(sc, n);
}

/* Softmax over sc[0..n) in place: e_j = kvt_vec_exp(s_j - m), summed in the 16-lane order of the dot
 * (kvt_vec_exp_sum); returns 1/sum, or 0 when nothing is visible. The reference takes the scalar
 * maximum, kvt_attention the SIMD one, so the reference checks that too. */
static float softmax_inplace(float *sc, uint32_t n, bool scalar_max) {
    const float m = scalar_max ? kvt_attention_max_scores_scalar(sc, n) : kvt_attention_max_scores(sc, n);
    if (m == -INFINITY) return 0.0f;
    return 1.0f / kvt_vec_exp_sum(sc, n, m);
}

void kvt_attention_ref(const float *k, const float *v, uint32_t n_kv, uint32_t n_kv_heads, uint32_t hd_k,
                       uint32_t hd_v, const float *q, uint32_t n_q, uint32_t q_stride, uint32_t pos0,
                       uint32_t n_head, float scale, uint32_t window, float *out, uint32_t out_stride) {
    kvt_kv_cpu_init();
    const uint32_t rep = n_head / n_kv_heads;
    float *sc = malloc(((size_t)n_kv + 1) * sizeof(float));
    float *q16 = malloc(((size_t)hd_k + 1) * sizeof(float));
    float *acc = malloc(((size_t)ATT_VL * hd_v + 1) * sizeof(float));
    if (!sc || !q16 || !acc) {
        free(sc);
        free(q16);
        free(acc);
        return;
    }
    for (uint32_t i = 0; i < n_q; i++) {
        const uint32_t p = pos0 + i;
        const uint32_t lo = window && p + 1 > window ? p + 1 - window : 0;
        const uint32_t hi = n_kv == 0 ? 0 : KVT_MIN(p, n_kv - 1);
        for (uint32_t h = 0; h < n_head; h++) {
            const uint32_t kvh = h / rep;
            const float *qh = q + (size_t)i * q_stride + (size_t)h * hd_k;
            float *o = out + (size_t)i * out_stride + (size_t)h * hd_v;
            memset(o, 0, (size_t)hd_v * sizeof(float));
            if (n_kv == 0 || lo > hi) continue;
            const uint32_t n = hi - lo + 1;
            kvt_vec_round_f16(qh, q16, hd_k, 1.0f);
            for (uint32_t j = 0; j < n; j++)
                sc[j] = kvt_vec_dot(q16, k + ((size_t)(lo + j) * n_kv_heads + kvh) * hd_k, hd_k) * scale;
            float inv = softmax_inplace(sc, n, true);
            if (inv == 0.0f) continue;
            kvt_vec_round_f16(sc, sc, n, inv);
            memset(acc, 0, (size_t)ATT_VL * hd_v * sizeof(float));
            for (uint32_t j = 0; j < n; j++)
                kvt_vec_axpy(acc + (size_t)((lo + j) % ATT_VL) * hd_v, sc[j],
                             v + ((size_t)(lo + j) * n_kv_heads + kvh) * hd_v, hd_v);
            kvt_vec_lanes_reduce_ref(o, acc, hd_v, hd_v);
        }
    }
    free(sc);
    free(q16);
    free(acc);
}

/* Decodes n consecutive rows (row r at src + r*rb) into dst (row r at dst + r*dim). Unpadded f16
 * rows form one contiguous run of n*dim halves, decoded by one call (the conversion is exact, so
 * this equals the per-row loop bit for bit and saves a call per key). */
static void decode_chunk(kvt_codec c, const uint8_t *src, size_t rb, uint32_t dim, uint32_t n, float *dst) {
    if (c.kind == KVT_CODEC_F16 && rb == 2 * (size_t)dim) {
        kvt_decode_row_fast(c, src, dim * n, dst);
        return;
    }
    if (c.kind == KVT_CODEC_TURBO) { /* one call per chunk: the VBMI lookup loads its tables once */
        kvt_turbo_decode_rows(c.bits, src, rb, dim, n, dst, kvt_kv_turbo_level());
        return;
    }
    for (uint32_t r = 0; r < n; r++) kvt_decode_row_fast(c, src + (size_t)r * rb, dim, dst + (size_t)r * dim);
}

/* Whether elements [d0, d0 + w) of rows of codec c and width dim are read in place
 * (kvt_vec_dot_enc_qn / kvt_vec_axpy_enc_qn; *f gets their format) rather than decoded into the
 * tile: the codec is f16 or 8/4-bit affine, the vector table has SIMD forms for it and the range
 * (kvt_vec_rows_fused), and the layer is not latent (an MLA layer's one KV head serves all query
 * heads, which read the decoded tile more cheaply than they would decode its rows four queries at
 * a time). */
static bool fused_rows(kvt_codec c, bool mla, uint32_t dim, uint32_t d0, uint32_t w, kvt_vec_rowfmt *f) {
    if (mla) return false;
    *f = (kvt_vec_rowfmt){.kind = KVT_ROWS_F16, .dim = dim};
    if (c.kind == KVT_CODEC_AFFINE && (c.bits == 8 || c.bits == 4))
        *f = (kvt_vec_rowfmt){.kind = c.bits == 8 ? KVT_ROWS_A8 : KVT_ROWS_A4, .scale_bf16 = c.scale_bf16,
                              .group = c.group_size, .dim = dim};
    else if (c.kind != KVT_CODEC_F16) return false;
    return kvt_vec_rows_fused(f, d0, w);
}

/* Where KV head kvh's row of key p, side vs, lies; NULL when its block is not held or the layer
 * has no such side (MLA's V). For the fetches ahead only (rows_continue). */
static const uint8_t *run_at(const kvt_kv_layout *l, const kvt_layer_info *li, kvt_block *const *slots, uint32_t p,
                             uint32_t kvh, int vs) {
    const uint32_t bt = l->block_tokens, bi = p / bt;
    const int var = kvt_layout_variant(l, bi);
    const size_t rb = li->row_bytes[var][vs];
    if (!slots[bi] || rb == 0) return NULL;
    return slots[bi]->data + li->offset[var][vs] + ((size_t)kvh * bt + p % bt) * rb;
}

/* Sets f's continuation (kvt_vec_rowfmt run_end / run_next) for KV head kvh's rows of side vs
 * (0 K, 1 V) in held block bi of a pass over keys up to hi: before the pass's last block, the end
 * of the head's run in block bi and its run in block bi + 1 (when held); in the last block, the
 * end of the rows the pass reads (key hi) and `after`, where the next pass starts (run_at; NULL:
 * none). Only the kernels' fetches ahead use it (docs/kv-blocks.md "Rows read in place"). */
static void rows_continue(kvt_vec_rowfmt *f, const kvt_kv_layout *l, const kvt_layer_info *li,
                          kvt_block *const *slots, uint32_t bi, uint32_t hi, uint32_t kvh, int vs, const uint8_t *after) {
    const uint32_t bt = l->block_tokens;
    const bool last = bi == hi / bt;
    const size_t rb = li->row_bytes[kvt_layout_variant(l, bi)][vs];
    f->run_next = last ? after : run_at(l, li, slots, (bi + 1) * bt, kvh, vs);
    f->run_end = f->run_next ? run_at(l, li, slots, bi * bt, kvh, vs) + (last ? hi % bt + 1 : bt) * rb : NULL;
}

/* The V product of up to KVT_VEC_QN queries seeing the same keys [a, e], read from encoded rows in
 * place: key p into lane p % ATT_VL, each lane in ascending key order (kvt_vec_axpy_enc_qn), as the
 * tile path's kvt_vec_axpy_rows per lane does. Query t's weight of key p is wsc[t][p - ulo]; lane l
 * of its accumulators is acc[t] + l * ld; key p's row (format fm) is at rows + (p - p0) * rb, and
 * its elements [d0, d0 + w) are read. */
static void lanes_weighted(const float *const *wsc, float *const *acc, uint32_t nq, uint32_t a, uint32_t e,
                           uint32_t ulo, size_t ld, const kvt_vec_rowfmt *fm, const uint8_t *rows, uint32_t p0,
                           size_t rb, uint32_t d0, uint32_t w) {
    const float *ww[KVT_VEC_QN];
    for (uint32_t t = 0; t < nq; t++) ww[t] = wsc[t] + (a - ulo);
    kvt_vec_axpy_enc_qn(fm, acc, ld, ATT_VL, a % ATT_VL, ww, nq, rows + (size_t)(a - p0) * rb, rb, e - a + 1, d0, w);
}

/* The V product of a group of up to KVT_VEC_QN pairs over one chunk read in place (src: key p0's
 * row), pair t seeing keys [a[t], e[t]]: their common run [A, E] in one pass, each pair's keys
 * before A first and after E last (pairs with equal tails together), so every lane of every pair
 * still takes its keys in ascending order. A causal prefill's diagonal chunk, where each query sees
 * a different last key, thus runs four pairs a pass too. rd: the keys earlier calls over this chunk
 * read (rd[0] > rd[1]: none), widened here; a call within it skips the fetches ahead. */
static void lanes_group(const float *const *wsc, float *const *acc, const uint32_t *a, const uint32_t *e, uint32_t ng,
                        uint32_t ulo, size_t ld, kvt_vec_rowfmt *fm, const uint8_t *src, uint32_t p0, size_t rb,
                        uint32_t w, uint32_t *rd) {
    uint32_t A = 0, E = UINT32_MAX;
    for (uint32_t t = 0; t < ng; t++) A = KVT_MAX(A, a[t]), E = KVT_MIN(E, e[t]);
    if (A > E) A = E + 1; /* no common keys: each pair's run is its keys up to E, then the rest */
#define LANES_RUN(T, N, X, Y)                                                                              \
    do {                                                                                                   \
        fm->cached = (X) >= rd[0] && (Y) <= rd[1];                                                         \
        lanes_weighted(wsc + (T), acc + (T), (N), (X), (Y), ulo, ld, fm, src, p0, rb, 0, w);              \
        rd[0] = KVT_MIN(rd[0], (X)), rd[1] = KVT_MAX(rd[1], (Y));                                          \
    } while (0)
    for (uint32_t t = 0; t < ng; t++)
        if (a[t] < A) LANES_RUN(t, 1, a[t], KVT_MIN(e[t], A - 1));
    if (A <= E) LANES_RUN(0, ng, A, E);
    for (uint32_t t = 0, n; t < ng; t += n) {
        const uint32_t f = KVT_MAX(E + 1, a[t]);
        for (n = 1; t + n < ng && e[t + n] == e[t] && KVT_MAX(E + 1, a[t + n]) == f; n++) {}
        if (f <= e[t]) LANES_RUN(t, n, f, e[t]);
    }
#undef LANES_RUN
}

typedef struct att_pair {
    const float *q;
    float *o;
    const float *qr; /* TURBO: rotated query */
    float *orot;     /* TURBO: accumulator in the rotated value basis */
    uint32_t lo, hi; /* visible key positions [lo, hi]; lo > hi = none */
    float inv;
} att_pair;

void kvt_attention(const kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q, uint32_t q_stride,
                   uint32_t pos0, uint32_t n_head, float scale, uint32_t h0, uint32_t h1, float *out,
                   uint32_t out_stride, float *scratch) {
    kvt_kv_cpu_init();
    const kvt_kv_layout *l = s->layout;
    assert(layer < l->n_layers && l->info[layer].group != UINT32_MAX);
    const kvt_layer_desc *d = &l->layers[layer];
    const kvt_layer_info *li = &l->info[layer];
    const uint32_t g = li->group, bt = l->block_tokens, n_kv = d->n_kv_heads;
    const uint32_t hd_k = d->head_dim_k, hd_v = d->head_dim_v;
    const uint32_t window = d->kind == KVT_KIND_WINDOW ? d->window : 0;
    const bool mla = d->kind == KVT_KIND_MLA;
    /* The two f16 roundings (header) follow llama.cpp's attention over an f16 K/V cache. Latent
     * (MLA) attention is absorbed and computed in f32 by the reference engines: no rounding there. */
    const bool round16 = !mla;
    const uint32_t vdim = mla ? hd_k : hd_v; /* decoded V row width (= its tile stride) */
    assert(n_head % n_kv == 0 && h1 <= n_head);
    const uint32_t rep = n_head / n_kv;
    if (n_q == 0 || h0 >= h1) return;
    const bool turbo = li->codec[1].kind == KVT_CODEC_TURBO;
    const uint64_t plain_end = (uint64_t)l->quant_block * bt; /* keys below use the base codec */
    /* keys beyond the held blocks cannot have been written; clamp for safety */
    const uint64_t held = (uint64_t)s->n_slots * bt;
    const size_t hdp = pad16(l->max_head_dim);
    float *q16 = scratch;                       /* ATT_TILE rounded queries, pair j at q16 + j*hdp */
    float *tile = scratch + ATT_TILE * hdp;     /* kc decoded rows, row r at tile + r*hd */
    float *tile_t = tile + (size_t)ATT_KC * hdp; /* pass 1, AVX-512: the K chunk transposed, stride ATT_KC */
    const uint32_t kc = chunk_keys(KVT_MAX(hd_k, vdim));
    float *sc_base = tile_t + (size_t)ATT_KC * hdp;
    /* Pass 1 scores groups of four pairs from the transposed chunk where the CPU has AVX-512 and the
     * head dim is a multiple of 16 (kvt_vec_dot_kt_q4: keys across the lanes, no per-dot shuffles). */
    const bool kt = kvt_vec_level() == 2 && hd_k % 16 == 0;
    float *rot_base = sc_base + (size_t)tile_pairs((uint64_t)pos0 + n_q) * pad16((size_t)pos0 + n_q + 1); /* 2*ATT_TILE rows */
    const size_t rot_stride = hdp;
    /* lane accumulators of pair j: lane_base + j*ATT_VL*hdp (rotated: pair ATT_TILE + j), lane l at +l*hdp */
    float *lane_base = rot_base + 2 * (size_t)ATT_TILE * rot_stride;
    const bool lanes = !mla;
    kvt_block *const *slots = s->slots[g];
    float dummy[ATT_DUMMY] = {0}; /* output row for padding slots of the 4-output V kernel */

    const uint32_t tp = tile_pairs((uint64_t)pos0 + n_q);
    for (uint32_t kvh = h0 / rep; kvh <= (h1 - 1) / rep; kvh++) {
        const uint32_t ha = KVT_MAX(h0, kvh * rep), hb = KVT_MIN(h1, (kvh + 1) * rep), nh = hb - ha;
        const uint32_t n_pairs = n_q * nh;
        for (uint32_t t0 = 0; t0 < n_pairs; t0 += tp) {
            const uint32_t np = KVT_MIN(tp, n_pairs - t0);
            att_pair pr[ATT_TILE];
            uint32_t ulo = UINT32_MAX, uhi = 0;
            bool any = false;
            for (uint32_t j = 0; j < np; j++) {
                const uint32_t i = (t0 + j) / nh, h = ha + (t0 + j) % nh, p = pos0 + i;
                const float *qin = q + (size_t)i * q_stride + (size_t)h * hd_k;
                pr[j].q = qin;
                if (round16) { /* f16(q), as the reference engines' K·Q over an f16 cache */
                    kvt_vec_round_f16(qin, q16 + j * hdp, hd_k, 1.0f);
                    pr[j].q = q16 + j * hdp;
                }
                pr[j].o = out + (size_t)i * out_stride + (size_t)h * hd_v;
                pr[j].lo = window && p + 1 > window ? p + 1 - window : 0;
                pr[j].hi = held == 0 ? 0 : (uint32_t)KVT_MIN((uint64_t)p, held - 1);
                memset(pr[j].o, 0, (size_t)hd_v * sizeof(float));
                pr[j].qr = pr[j].q;
                pr[j].orot = pr[j].o;
                if (turbo) {
                    float *qr = rot_base + (size_t)j * rot_stride;
                    pr[j].orot = rot_base + (size_t)(ATT_TILE + j) * rot_stride;
                    kvt_turbo_rotate(layer, 0, kvh, qin, hd_k, qr); /* rotate, then round: f16(Π_K q) */
                    if (round16) kvt_vec_round_f16(qr, qr, hd_k, 1.0f);
                    pr[j].qr = qr;
                    memset(pr[j].orot, 0, (size_t)hd_v * sizeof(float));
                }
                if (held == 0 || pr[j].lo > pr[j].hi) {
                    pr[j].lo = 1, pr[j].hi = 0; /* empty */
                    continue;
                }
                any = true;
                ulo = KVT_MIN(ulo, pr[j].lo);
                uhi = KVT_MAX(uhi, pr[j].hi);
            }
            if (!any) continue;
            const size_t span = (size_t)uhi - ulo + 1;
            /* scores of pair j at key position p: sc_base[j*span + (p - ulo)] */

            /* Pass 1: K rows -> scores, kc keys at a time. */
            for (uint32_t bi = ulo / bt; bi <= uhi / bt; bi++) {
                const uint32_t pa = KVT_MAX(ulo, bi * bt), pb = KVT_MIN(uhi, bi * bt + bt - 1);
                const kvt_block *b = slots[bi];
                if (!b) { /* dropped WINDOW block: its keys are masked */
                    for (uint32_t j = 0; j < np; j++)
                        for (uint32_t p = KVT_MAX(pa, pr[j].lo); p <= KVT_MIN(pb, pr[j].hi); p++)
                            sc_base[j * span + (p - ulo)] = -INFINITY;
                    continue;
                }
                const int var = kvt_layout_variant(l, bi);
                const kvt_codec c = kvt_codec_side(li->codec[var], 0);
                const bool rotq = turbo && var == 1;
                const size_t rb = li->row_bytes[var][0];
                /* rows of this KV head: contiguous, token t at base + t*rb */
                const uint8_t *base = b->data + li->offset[var][0] + (size_t)kvh * bt * rb;
                kvt_vec_rowfmt fm;
                const bool fk = fused_rows(c, mla, hd_k, 0, hd_k, &fm);
                /* the K rows' fetches ahead run on into this head's V rows (mla: none), read next */
                if (fk) rows_continue(&fm, l, li, slots, bi, uhi, kvh, 0, mla ? NULL : run_at(l, li, slots, ulo, kvh, 1));
                for (uint32_t p0 = pa; p0 <= pb; p0 += kc) {
                    const uint32_t p1 = KVT_MIN(pb, p0 + kc - 1);
                    uint32_t act[ATT_TILE], na = 0;
                    for (uint32_t j = 0; j < np; j++)
                        if (KVT_MAX(p0, pr[j].lo) <= KVT_MIN(p1, pr[j].hi)) act[na++] = j;
                    if (na == 0) continue;
                    const bool use_kt = kt && na >= ATT_KT_MIN_PAIRS;
                    const uint8_t *src = base + (size_t)(p0 - bi * bt) * rb;
                    if (!use_kt && fk) { /* rows read in place, up to 4 pairs a pass */
                        for (uint32_t g0 = 0; g0 < na; g0 += KVT_VEC_QN) {
                            const uint32_t ng = KVT_MIN((uint32_t)KVT_VEC_QN, na - g0);
                            const float *qq[KVT_VEC_QN];
                            float *oo[KVT_VEC_QN];
                            uint32_t a = p0, e = p1;
                            for (uint32_t t = 0; t < ng; t++) {
                                const uint32_t j = act[g0 + t];
                                qq[t] = rotq ? pr[j].qr : pr[j].q;
                                oo[t] = sc_base + j * span;
                                if (ng == 1) a = KVT_MAX(p0, pr[j].lo), e = KVT_MIN(p1, pr[j].hi);
                            }
                            /* a group scores the whole chunk: scores outside a pair's visible range
                             * land in its own span and are never read */
                            for (uint32_t t = 0; t < ng; t++) oo[t] += a - ulo;
                            kvt_vec_dot_enc_qn(&fm, qq, ng, src + (size_t)(a - p0) * rb, rb, e - a + 1, scale, oo);
                        }
                        continue;
                    }
                    if (use_kt && c.kind == KVT_CODEC_F16) { /* decode straight into the transposed chunk */
                        kvt_vec_transpose_f16_rows(src, rb, p1 - p0 + 1, hd_k, tile_t, ATT_KC);
                    } else {
                        decode_chunk(c, src, rb, hd_k, p1 - p0 + 1, tile);
                        if (use_kt) kvt_vec_transpose_rows(tile, hd_k, p1 - p0 + 1, hd_k, tile_t, ATT_KC);
                    }
                    if (na == 1) {
                        const uint32_t j = act[0], a = KVT_MAX(p0, pr[j].lo), e = KVT_MIN(p1, pr[j].hi);
                        kvt_vec_dot_rows(rotq ? pr[j].qr : pr[j].q, tile + (size_t)(a - p0) * hd_k, hd_k, e - a + 1, hd_k, scale,
                                        sc_base + j * span + (a - ulo));
                        continue;
                    }
                    /* Groups of four pairs score the whole chunk: scores outside a pair's visible
                     * range land in its own span and are never read. Short groups repeat a pair
                     * (same inputs, same bits, same destination). */
                    for (uint32_t g0 = 0; g0 < na; g0 += 4) {
                        const float *qq[4];
                        float *oo[4];
                        for (uint32_t t = 0; t < 4; t++) {
                            const uint32_t j = act[g0 + t < na ? g0 + t : g0];
                            qq[t] = rotq ? pr[j].qr : pr[j].q;
                            oo[t] = sc_base + j * span + (p0 - ulo);
                        }
                        if (use_kt) kvt_vec_dot_kt_q4(qq, tile_t, ATT_KC, p1 - p0 + 1, hd_k, scale, oo);
                        else kvt_vec_dot_q4(qq, tile, hd_k, p1 - p0 + 1, hd_k, scale, oo);
                    }
                }
            }
            /* Softmax per pair, ascending key order, then the normalized weights rounded to f16. */
            for (uint32_t j = 0; j < np; j++) {
                pr[j].inv = 0.0f;
                if (pr[j].lo > pr[j].hi) continue;
                float *scj = sc_base + j * span + (pr[j].lo - ulo);
                const uint32_t nj = pr[j].hi - pr[j].lo + 1;
                pr[j].inv = softmax_inplace(scj, nj, false);
                if (pr[j].inv == 0.0f) continue;
                if (round16) kvt_vec_round_f16(scj, scj, nj, pr[j].inv);
                else
                    for (uint32_t t = 0; t < nj; t++) scj[t] *= pr[j].inv;
            }
            for (uint32_t j = 0; j < np && lanes; j++) { /* zero the pairs' lane accumulators */
                if (pr[j].inv == 0.0f) continue;
                memset(lane_base + (size_t)j * ATT_VL * hdp, 0, (size_t)ATT_VL * hdp * sizeof(float));
                if (turbo) memset(lane_base + (size_t)(ATT_TILE + j) * ATT_VL * hdp, 0, (size_t)ATT_VL * hdp * sizeof(float));
            }
            /* Pass 2: V rows, weighted accumulation in ascending key order. Keys of dropped blocks
             * have weight exactly 0, and adding 0*v changes nothing, so they are skipped. MLA: the
             * V rows are the K rows, decoded whole (vdim wide) and read as their hd_v prefix. */
            for (uint32_t bi = ulo / bt; bi <= uhi / bt; bi++) {
                const kvt_block *b = slots[bi];
                if (!b) continue;
                const uint32_t pa = KVT_MAX(ulo, bi * bt), pb = KVT_MIN(uhi, bi * bt + bt - 1);
                const int var = kvt_layout_variant(l, bi);
                const int vs = mla ? 0 : 1; /* MLA: the values are the latent prefix of the K row */
                const kvt_codec c = kvt_codec_side(li->codec[var], vs);
                const bool rotv = turbo && var == 1;
#define OUT(j) (rotv ? pr[j].orot : pr[j].o)
                const size_t rb = li->row_bytes[var][vs];
                const uint8_t *base = b->data + li->offset[var][vs] + (size_t)kvh * bt * rb;
                kvt_vec_rowfmt fm;
                const bool fv = lanes && fused_rows(c, mla, hd_v, 0, hd_v, &fm);
                /* the V rows' fetches ahead run on into the K rows the next pass reads: the next
                 * tile's of this head, else the next head's (its first keys taken as this tile's) */
                if (fv) {
                    const uint32_t nk = t0 + tp < n_pairs ? kvh : kvh + 1;
                    rows_continue(&fm, l, li, slots, bi, uhi, kvh, vs,
                                  nk <= (h1 - 1) / rep ? run_at(l, li, slots, ulo, nk, 0) : NULL);
                }
                const uint32_t vkc = fv ? (n_q > 1 ? ATT_VKC_MULTI : ATT_VKC) : kc;
                for (uint32_t p0 = pa; p0 <= pb; p0 += vkc) {
                    const uint32_t p1 = KVT_MIN(pb, p0 + vkc - 1);
                    uint32_t act[ATT_TILE], na = 0;
                    for (uint32_t j = 0; j < np; j++)
                        if (pr[j].inv != 0.0f && KVT_MAX(p0, pr[j].lo) <= KVT_MIN(p1, pr[j].hi)) act[na++] = j;
                    if (na == 0) continue;
                    const uint8_t *src = base + (size_t)(p0 - bi * bt) * rb;
                    if (fv) { /* rows in place: groups of up to KVT_VEC_QN pairs share a pass */
                        uint32_t rd[2] = {p1 + 1, 0}; /* keys an earlier call read (rd[0] > rd[1]: none) */
                        for (uint32_t g = 0; g < na; g += KVT_VEC_QN) {
                            const uint32_t ng = KVT_MIN((uint32_t)KVT_VEC_QN, na - g);
                            const float *wsc[KVT_VEC_QN];
                            float *acc[KVT_VEC_QN];
                            uint32_t a[KVT_VEC_QN], e[KVT_VEC_QN];
                            for (uint32_t t = 0; t < ng; t++) {
                                const att_pair *pj = &pr[act[g + t]];
                                wsc[t] = sc_base + act[g + t] * span;
                                acc[t] = lane_base + (size_t)((rotv ? ATT_TILE : 0) + act[g + t]) * ATT_VL * hdp;
                                a[t] = KVT_MAX(p0, pj->lo), e[t] = KVT_MIN(p1, pj->hi);
                            }
                            lanes_group(wsc, acc, a, e, ng, ulo, hdp, &fm, src, p0, rb, hd_v, rd);
                        }
                        continue;
                    }
                    decode_chunk(c, src, rb, vdim, p1 - p0 + 1, tile);
                    if (lanes) { /* key p into lane p % ATT_VL: per lane a strided run of rows */
                        for (uint32_t g = 0; g < na; g++) {
                            const uint32_t j = act[g], a = KVT_MAX(p0, pr[j].lo), e = KVT_MIN(p1, pr[j].hi);
                            float *acc = lane_base + (size_t)((rotv ? ATT_TILE : 0) + j) * ATT_VL * hdp;
                            const float *wj = sc_base + j * span;
                            for (uint32_t ln = 0; ln < ATT_VL; ln++) {
                                const uint32_t f = a + (ln + ATT_VL - a % ATT_VL) % ATT_VL; /* first key of lane ln */
                                if (f > e) continue;
                                const uint32_t cnt = (e - f) / ATT_VL + 1;
                                float wl[ATT_KC / ATT_VL + 1];
                                for (uint32_t r = 0; r < cnt; r++) wl[r] = wj[f + r * ATT_VL - ulo];
                                kvt_vec_axpy_rows(acc + (size_t)(f % ATT_VL) * hdp, wl, tile + (size_t)(f - p0) * vdim,
                                                  (size_t)ATT_VL * vdim, cnt, hd_v);
                            }
                        }
                        continue;
                    }
                    uint32_t g0 = 0;
                    if (na >= 2 && hd_v <= ATT_DUMMY)
                        for (; g0 < na; g0 += 4) {
                            /* common range [A, E] of the group through the 4-output kernel; each
                             * pair's keys before A go first and after E last, so every output still
                             * sees its keys in ascending order. Short groups write a dummy row. */
                            const uint32_t ng = KVT_MIN(4u, na - g0);
                            uint32_t A = p0, E = p1;
                            for (uint32_t t = 0; t < ng; t++) {
                                A = KVT_MAX(A, pr[act[g0 + t]].lo);
                                E = KVT_MIN(E, pr[act[g0 + t]].hi);
                            }
                            for (uint32_t t = 0; t < ng; t++) {
                                const uint32_t j = act[g0 + t], a = KVT_MAX(p0, pr[j].lo);
                                const uint32_t e = A > E ? KVT_MIN(p1, pr[j].hi) : A - 1;
                                if (a <= e)
                                    kvt_vec_axpy_rows(OUT(j), sc_base + j * span + (a - ulo),
                                                     tile + (size_t)(a - p0) * vdim, vdim, e - a + 1, hd_v);
                            }
                            if (A > E) continue;
                            float *yy[4];
                            const float *ww[4];
                            for (uint32_t t = 0; t < 4; t++) {
                                const uint32_t j = act[g0 + (t < ng ? t : 0)];
                                yy[t] = t < ng ? OUT(j) : dummy;
                                ww[t] = sc_base + j * span + (A - ulo);
                            }
                            kvt_vec_axpy_q4(yy, ww, tile + (size_t)(A - p0) * vdim, vdim, E - A + 1, hd_v);
                            for (uint32_t t = 0; t < ng; t++) {
                                const uint32_t j = act[g0 + t], e = KVT_MIN(p1, pr[j].hi);
                                if (E + 1 <= e)
                                    kvt_vec_axpy_rows(OUT(j), sc_base + j * span + (E + 1 - ulo),
                                                     tile + (size_t)(E + 1 - p0) * vdim, vdim, e - E, hd_v);
                            }
                        }
                    for (; g0 < na; g0++) {
                        const uint32_t j = act[g0], a = KVT_MAX(p0, pr[j].lo), e = KVT_MIN(p1, pr[j].hi);
                        kvt_vec_axpy_rows(OUT(j), sc_base + j * span + (a - ulo), tile + (size_t)(a - p0) * vdim,
                                         vdim, e - a + 1, hd_v);
                    }
#undef OUT
                }
            }
            if (lanes)
                for (uint32_t j = 0; j < np; j++) {
                    if (pr[j].inv == 0.0f) continue;
                    kvt_vec_lanes_reduce(pr[j].o, lane_base + (size_t)j * ATT_VL * hdp, hdp, hd_v);
                    if (turbo)
                        kvt_vec_lanes_reduce(pr[j].orot, lane_base + (size_t)(ATT_TILE + j) * ATT_VL * hdp, hdp, hd_v);
                }
            /* The weights were normalized before the V pass (f16-rounded), so no 1/sum here. */
            for (uint32_t j = 0; j < np && turbo; j++) {
                if (pr[j].inv == 0.0f) continue;
                kvt_turbo_unrotate(layer, 1, kvh, pr[j].orot, hd_v, pr[j].orot);
                if (pr[j].lo < plain_end)
                    for (uint32_t d2 = 0; d2 < hd_v; d2++) pr[j].o[d2] += pr[j].orot[d2];
                else
                    memcpy(pr[j].o, pr[j].orot, (size_t)hd_v * sizeof(float));
            }
        }
    }
}

/* ------------------------------------------------------------------ split-K single-row attention */

/* Phase 1 splits the visible keys into ranges of whole ATT_SPLIT_KEYS keys (a cache line of scores,
 * so no two threads write one line); phase 3 splits the V columns of all KV heads into units of
 * ATT_SPLIT_COLS columns (f16/bf16; an AFFINE codec's group otherwise, whose scale and bias cover
 * whole groups). */
#define ATT_SPLIT_KEYS 16
#define ATT_SPLIT_COLS 16

static _Atomic uint64_t g_split_calls;

uint64_t kvt_attention_split_calls(void) { return atomic_load_explicit(&g_split_calls, memory_order_relaxed); }

bool kvt_attention_split_ok(const kvt_kv_layout *l, uint32_t layer, uint32_t n_head) {
    if (layer >= l->n_layers || l->info[layer].group == UINT32_MAX) return false;
    const kvt_layer_desc *d = &l->layers[layer];
    if (d->kind == KVT_KIND_MLA || n_head == 0 || n_head % d->n_kv_heads != 0 || n_head / d->n_kv_heads > ATT_TILE)
        return false;
    for (int v = 0; v < KVT_N_VARIANTS; v++)
        if (l->info[layer].codec[v].kind == KVT_CODEC_TURBO) return false;
    return true;
}

size_t kvt_attention_split_floats(uint32_t n_head, uint32_t n_ctx) {
    return (size_t)n_head * pad16(n_ctx) + pad16(n_head);
}

/* Width of a phase 3 column unit of a layer: ATT_SPLIT_COLS, or the AFFINE group of its configured
 * codec (a multiple of 16 that divides hd_v), or the whole row when hd_v is not a multiple of 16. */
static uint32_t split_col_unit(const kvt_layer_info *li, uint32_t hd_v) {
    if (hd_v % ATT_SPLIT_COLS != 0) return hd_v;
    uint32_t u = ATT_SPLIT_COLS;
    for (int v = 0; v < KVT_N_VARIANTS; v++)
        if (li->codec[v].kind == KVT_CODEC_AFFINE) u = KVT_MAX(u, li->codec[v].group_size);
    return u;
}

/* What the three phases share: the layer, the visible keys [lo, lo + n) and the shared buffer. */
typedef struct split_job {
    const kvt_seq *s;
    const kvt_layer_info *li;
    kvt_block *const *slots;
    uint32_t bt, rep, hd_k, hd_v, kc, lo, n;
    size_t stride; /* floats between two heads' scores in sc */
    float *sc;     /* head h's score (then weight) of key lo + j at sc[h*stride + j] */
    float *inv;    /* [n_head] 1/sum of each head, 0 = nothing visible */
} split_job;

/* Phase 1: scores of the rep query heads of KV head kvh over keys [ka, kb), into the job's sc.
 * Queries are rounded to f16 and the keys decoded by chunks exactly as kvt_attention does, and
 * kvt_vec_dot_rows / kvt_vec_dot_q4 give every score the bits of kvt_vec_dot, so each score equals
 * the unsplit one. */
static void split_scores(const split_job *jb, uint32_t kvh, const float *q, float scale, uint32_t ka, uint32_t kb,
                         float *q16, size_t hdp, float *tile) {
    const kvt_kv_layout *l = jb->s->layout;
    const uint32_t bt = jb->bt, rep = jb->rep, hd_k = jb->hd_k, h0 = kvh * rep;
    for (uint32_t r = 0; r < rep; r++) kvt_vec_round_f16(q + (size_t)(h0 + r) * hd_k, q16 + r * hdp, hd_k, 1.0f);
    for (uint32_t bi = ka / bt; bi <= (kb - 1) / bt; bi++) {
        const uint32_t pa = KVT_MAX(ka, bi * bt), pb = KVT_MIN(kb - 1, bi * bt + bt - 1);
        const kvt_block *b = jb->slots[bi];
        if (!b) { /* dropped WINDOW block: its keys are masked */
            for (uint32_t r = 0; r < rep; r++)
                for (uint32_t p = pa; p <= pb; p++) jb->sc[(h0 + r) * jb->stride + (p - jb->lo)] = -INFINITY;
            continue;
        }
        const int var = kvt_layout_variant(l, bi);
        const kvt_codec c = jb->li->codec[var];
        const size_t rb = jb->li->row_bytes[var][0];
        const uint8_t *base = b->data + jb->li->offset[var][0] + (size_t)kvh * bt * rb;
        kvt_vec_rowfmt fm;
        if (fused_rows(c, false, hd_k, 0, hd_k, &fm)) { /* rows in place, the whole run at once */
            rows_continue(&fm, l, jb->li, jb->slots, bi, kb - 1, kvh, 0, NULL);
            for (uint32_t g0 = 0; g0 < rep; g0 += KVT_VEC_QN) {
                const uint32_t ng = KVT_MIN((uint32_t)KVT_VEC_QN, rep - g0);
                const float *qq[KVT_VEC_QN];
                float *oo[KVT_VEC_QN];
                for (uint32_t t = 0; t < ng; t++) {
                    qq[t] = q16 + (g0 + t) * hdp;
                    oo[t] = jb->sc + (h0 + g0 + t) * jb->stride + (pa - jb->lo);
                }
                kvt_vec_dot_enc_qn(&fm, qq, ng, base + (size_t)(pa - bi * bt) * rb, rb, pb - pa + 1, scale, oo);
            }
            continue;
        }
        for (uint32_t p0 = pa; p0 <= pb; p0 += jb->kc) {
            const uint32_t p1 = KVT_MIN(pb, p0 + jb->kc - 1), nr = p1 - p0 + 1;
            decode_chunk(c, base + (size_t)(p0 - bi * bt) * rb, rb, hd_k, nr, tile);
            if (rep == 1) {
                kvt_vec_dot_rows(q16, tile, hd_k, nr, hd_k, scale, jb->sc + h0 * jb->stride + (p0 - jb->lo));
                continue;
            }
            for (uint32_t g0 = 0; g0 < rep; g0 += 4) { /* short groups repeat a head (same bits, same place) */
                const float *qq[4];
                float *oo[4];
                for (uint32_t t = 0; t < 4; t++) {
                    const uint32_t r = g0 + t < rep ? g0 + t : g0;
                    qq[t] = q16 + r * hdp;
                    oo[t] = jb->sc + (h0 + r) * jb->stride + (p0 - jb->lo);
                }
                kvt_vec_dot_q4(qq, tile, hd_k, nr, hd_k, scale, oo);
            }
        }
    }
}

/* Phase 3: columns [d0, d1) of the outputs of KV head kvh's query heads, every visible key in
 * ascending order into the lane of its position (p % ATT_VL), then the lanes reduced: kvt_attention's
 * V product. The axpy kernels are elementwise fmaf chains and kvt_vec_lanes_reduce is per column, so a column
 * range of an output gets the bits of the whole-row accumulation. lanes: ATT_TILE * ATT_VL * w
 * floats of this thread's scratch. */
static void split_values(const split_job *jb, uint32_t kvh, uint32_t d0, uint32_t d1, float *out, float *tile,
                         float *lanes) {
    const kvt_kv_layout *l = jb->s->layout;
    const uint32_t bt = jb->bt, hd_v = jb->hd_v, w = d1 - d0, h0 = kvh * jb->rep;
    uint32_t act[ATT_TILE], na = 0;
    for (uint32_t r = 0; r < jb->rep; r++) {
        memset(out + (size_t)(h0 + r) * hd_v + d0, 0, (size_t)w * sizeof(float));
        if (jb->n && jb->inv[h0 + r] != 0.0f) act[na++] = h0 + r;
    }
    if (na == 0) return;
    memset(lanes, 0, (size_t)na * ATT_VL * w * sizeof(float));
    const uint32_t hi = jb->lo + jb->n - 1;
    for (uint32_t bi = jb->lo / bt; bi <= hi / bt; bi++) {
        const kvt_block *b = jb->slots[bi];
        if (!b) continue; /* dropped WINDOW block: weight exactly 0, adding 0*v changes nothing */
        const uint32_t pa = KVT_MAX(jb->lo, bi * bt), pb = KVT_MIN(hi, bi * bt + bt - 1);
        const int var = kvt_layout_variant(l, bi);
        const kvt_codec c = jb->li->codec[var];
        const size_t rb = jb->li->row_bytes[var][1];
        const uint8_t *base = b->data + jb->li->offset[var][1] + (size_t)kvh * bt * rb;
        kvt_vec_rowfmt fm;
        const bool fv = fused_rows(c, false, hd_v, d0, w, &fm);
        if (fv) rows_continue(&fm, l, jb->li, jb->slots, bi, hi, kvh, 1, NULL);
        const uint32_t kc = fv ? ATT_VKC : jb->kc;
        for (uint32_t p0 = pa; p0 <= pb; p0 += kc) {
            const uint32_t p1 = KVT_MIN(pb, p0 + kc - 1), nr = p1 - p0 + 1;
            const uint8_t *src = base + (size_t)(p0 - bi * bt) * rb;
            if (fv) { /* rows in place: the head's queries share a pass */
                for (uint32_t g = 0; g < na; g += KVT_VEC_QN) {
                    const uint32_t ng = KVT_MIN((uint32_t)KVT_VEC_QN, na - g);
                    const float *wsc[KVT_VEC_QN];
                    float *acc[KVT_VEC_QN];
                    for (uint32_t t = 0; t < ng; t++) {
                        wsc[t] = jb->sc + act[g + t] * jb->stride;
                        acc[t] = lanes + (size_t)(g + t) * ATT_VL * w;
                    }
                    lanes_weighted(wsc, acc, ng, p0, p1, jb->lo, w, &fm, src, p0, rb, d0, w);
                }
                continue;
            }
            if (w == hd_v) decode_chunk(c, src, rb, hd_v, nr, tile);
            else kvt_decode_rows_part(c, src, rb, hd_v, d0, w, nr, tile);
            for (uint32_t g = 0; g < na; g++) {
                const float *wj = jb->sc + act[g] * jb->stride;
                float *acc = lanes + (size_t)g * ATT_VL * w;
                for (uint32_t ln = 0; ln < ATT_VL; ln++) { /* lane ln: keys f, f + ATT_VL, ... of the chunk */
                    const uint32_t f = p0 + (ln + ATT_VL - p0 % ATT_VL) % ATT_VL;
                    if (f > p1) continue;
                    const uint32_t cnt = (p1 - f) / ATT_VL + 1;
                    float wl[ATT_KC / ATT_VL + 1];
                    for (uint32_t r = 0; r < cnt; r++) wl[r] = wj[f + r * ATT_VL - jb->lo];
                    kvt_vec_axpy_rows(acc + (size_t)(f % ATT_VL) * w, wl, tile + (size_t)(f - p0) * w, (size_t)ATT_VL * w,
                                      cnt, w);
                }
            }
        }
    }
    for (uint32_t g = 0; g < na; g++)
        kvt_vec_lanes_reduce(out + (size_t)act[g] * hd_v + d0, lanes + (size_t)g * ATT_VL * w, w, w);
}

void kvt_attention_split(const kvt_seq *s, uint32_t layer, const float *q, uint32_t pos, uint32_t n_head, float scale,
                         float *out, float *shared, float *scratch, kvt_threadpool *tp, int ith, int nth) {
    kvt_kv_cpu_init();
    const kvt_kv_layout *l = s->layout;
    assert(kvt_attention_split_ok(l, layer, n_head));
    const kvt_layer_desc *d = &l->layers[layer];
    const kvt_layer_info *li = &l->info[layer];
    const uint32_t bt = l->block_tokens, n_kv = d->n_kv_heads;
    const uint32_t window = d->kind == KVT_KIND_WINDOW ? d->window : 0;
    const uint64_t held = (uint64_t)s->n_slots * bt; /* keys beyond the held blocks cannot have been written */
    const uint32_t lo = window && pos + 1 > window ? pos + 1 - window : 0;
    const uint32_t hi = held == 0 ? 0 : (uint32_t)KVT_MIN((uint64_t)pos, held - 1);
    const uint32_t n = held == 0 || lo > hi ? 0 : hi - lo + 1;
    const size_t hdp = pad16(l->max_head_dim);
    split_job jb = {.s = s, .li = li, .slots = s->slots[li->group], .bt = bt, .rep = n_head / n_kv,
                    .hd_k = d->head_dim_k, .hd_v = d->head_dim_v, .kc = chunk_keys(KVT_MAX(d->head_dim_k, d->head_dim_v)),
                    .lo = lo, .n = n, .stride = pad16(n), .sc = shared};
    jb.inv = shared + (size_t)n_head * jb.stride;
    /* this thread's scratch (kvt_attention_scratch_floats): q16 and tile as kvt_attention's, the V
     * lanes in the part that holds kvt_attention's lane accumulators */
    float *q16 = scratch, *tile = scratch + ATT_TILE * hdp;
    float *lanes = scratch + (size_t)(ATT_TILE + 2 * ATT_KC) * hdp;
    if (ith == 0) atomic_fetch_add_explicit(&g_split_calls, 1, memory_order_relaxed);

    /* Phase 1: this thread's key range, every KV head (each K row is read by one thread). */
    const uint64_t nu = (n + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS;
    const uint32_t ka = lo + (uint32_t)(nu * (uint64_t)ith / (uint64_t)nth) * ATT_SPLIT_KEYS;
    const uint32_t kb = lo + (uint32_t)KVT_MIN(nu * (uint64_t)(ith + 1) / (uint64_t)nth * ATT_SPLIT_KEYS, (uint64_t)n);
    for (uint32_t kvh = 0; kvh < n_kv && ka < kb; kvh++) split_scores(&jb, kvh, q, scale, ka, kb, q16, hdp, tile);
    if (nth > 1) kvt_threadpool_barrier(tp);

    /* Phase 2: softmax of whole heads (the maximum, then the exp sum in kvt_vec_exp_sum's order, is
     * kvt_attention's per-pair code), weights normalized and rounded to f16. */
    const uint32_t ha = (uint32_t)((uint64_t)n_head * ith / nth), hb = (uint32_t)((uint64_t)n_head * (ith + 1) / nth);
    for (uint32_t h = ha; h < hb; h++) {
        float *sch = jb.sc + h * jb.stride;
        jb.inv[h] = n ? softmax_inplace(sch, n, false) : 0.0f;
        if (jb.inv[h] != 0.0f) kvt_vec_round_f16(sch, sch, n, jb.inv[h]);
    }
    if (nth > 1) kvt_threadpool_barrier(tp);

    /* Phase 3: this thread's V column units (KV head major), consecutive units of one head as one
     * range, so each V byte is read by one thread. */
    const uint32_t cu = split_col_unit(li, jb.hd_v), per = jb.hd_v / cu, nu3 = n_kv * per;
    const uint32_t u0 = (uint32_t)((uint64_t)nu3 * ith / nth), u1 = (uint32_t)((uint64_t)nu3 * (ith + 1) / nth);
    for (uint32_t u = u0; u < u1;) {
        const uint32_t kvh = u / per, ue = KVT_MIN(u1, (kvh + 1) * per);
        split_values(&jb, kvh, (u - kvh * per) * cu, (ue - kvh * per) * cu, out, tile, lanes);
        u = ue;
    }
}
