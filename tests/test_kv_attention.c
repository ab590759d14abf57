/* test_kv_attention.c — block-reading attention must equal kvt_attention_ref over the decoded f32
 * K/V bit for bit: across block boundaries, with GQA, windows (before/after the window slides and
 * blocks are dropped), mixed base/affine variants, head splits, and after clone/trim/append; and
 * split-K decode (kvt_attention_split) must equal kvt_attention on 1-4 threads. */
#include <math.h>

#include "testutil.h"
#include "kv/kv.h"
#include "kv/kv_int.h"

#define MAXP 160
#define NKV 2
#define HDK 32
#define HDV 64
#define NHEAD 6

typedef struct sim {
    kvt_kv_layout *l;
    kvt_block_pool *p;
    float *kref[2], *vref[2]; /* per layer [MAXP][NKV][HD] decoded values */
    uint64_t rng;
    float *scratch;
} sim;

static void sim_init(sim *m, uint32_t bt, kvt_codec base, kvt_codec c, uint32_t qs, uint32_t window) {
    kvt_layer_desc d[2];
    for (int i = 0; i < 2; i++)
        d[i] = (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = NKV, .head_dim_k = HDK, .head_dim_v = HDV, .codec = c};
    if (window) {
        d[1].kind = KVT_KIND_WINDOW;
        d[1].window = window;
    }
    char err[200];
    assert_int_equal(kvt_kv_layout_create(d, 2, bt, base, qs, &m->l, err, sizeof err), KVT_OK);
    m->p = kvt_block_pool_create(m->l, 0);
    for (int i = 0; i < 2; i++) {
        m->kref[i] = calloc(MAXP * NKV * HDK, sizeof(float));
        m->vref[i] = calloc(MAXP * NKV * HDV, sizeof(float));
    }
    m->rng = bt * 1000 + c.kind;
    m->scratch = malloc(kvt_attention_scratch_floats(m->l, MAXP) * sizeof(float));
}

static void sim_free(sim *m) {
    assert_int_equal(kvt_block_pool_used_bytes(m->p), 0);
    kvt_block_pool_free(m->p);
    kvt_kv_layout_free(m->l);
    for (int i = 0; i < 2; i++) free(m->kref[i]), free(m->vref[i]);
    free(m->scratch);
}

/* Write n tokens' K/V (not committed). The reference gets encode→decode of the same rows with the
 * codec of the position's block, computed independently of the block storage. */
static void sim_write(sim *m, kvt_seq *s, uint32_t n) {
    assert_int_equal(kvt_seq_prepare(s, n), KVT_OK);
    uint32_t bt = kvt_kv_layout_block_tokens(m->l);
    float k[NKV * HDK], v[NKV * HDV];
    uint8_t row[512];
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = kvt_seq_len(s) + t;
        assert_true(pos < MAXP);
        for (uint32_t li = 0; li < 2; li++) {
            for (int i = 0; i < NKV * HDK; i++) k[i] = tu_randf(&m->rng) * 2;
            for (int i = 0; i < NKV * HDV; i++) v[i] = tu_randf(&m->rng);
            kvt_seq_write_kv(s, li, pos, k, v);
            kvt_codec c = kvt_kv_layout_codec_at(m->l, li, pos / bt);
            for (int h = 0; h < NKV; h++) {
                kvt_codec_encode_row(c, k + h * HDK, HDK, row);
                kvt_codec_decode_row(c, row, HDK, m->kref[li] + ((size_t)pos * NKV + h) * HDK);
                kvt_codec_encode_row(c, v + h * HDV, HDV, row);
                kvt_codec_decode_row(c, row, HDV, m->vref[li] + ((size_t)pos * NKV + h) * HDV);
            }
        }
    }
}

static void sim_commit(kvt_seq *s, uint32_t n) {
    int32_t toks[MAXP];
    for (uint32_t i = 0; i < n; i++) toks[i] = (int32_t)(kvt_seq_len(s) + i) * 7 + 1;
    assert_int_equal(kvt_seq_commit(s, toks, n), KVT_OK);
}

/* Attention for queries at [pos0, pos0+n_q) on both layers, compared bitwise with the reference;
 * also with the heads split in two calls. */
static void check_attn(sim *m, const kvt_seq *s, uint32_t pos0, uint32_t n_q) {
    static float q[MAXP * NHEAD * HDK], o1[MAXP * NHEAD * HDV], o2[MAXP * NHEAD * HDV], o3[MAXP * NHEAD * HDV];
    const float scale = 1.0f / sqrtf((float)HDK);
    for (uint32_t i = 0; i < n_q * NHEAD * HDK; i++) q[i] = tu_randf(&m->rng) * 3;
    for (uint32_t li = 0; li < 2; li++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(m->l, li);
        uint32_t w = d->kind == KVT_KIND_WINDOW ? d->window : 0;
        memset(o1, 0xff, sizeof(float) * n_q * NHEAD * HDV); /* NaN garbage: must be overwritten */
        kvt_attention(s, li, q, n_q, NHEAD * HDK, pos0, NHEAD, scale, 0, NHEAD, o1, NHEAD * HDV, m->scratch);
        kvt_attention_ref(m->kref[li], m->vref[li], pos0 + n_q, NKV, HDK, HDV, q, n_q, NHEAD * HDK, pos0, NHEAD,
                          scale, w, o2, NHEAD * HDV);
        if (memcmp(o1, o2, sizeof(float) * n_q * NHEAD * HDV) != 0) {
            for (uint32_t i = 0; i < n_q * NHEAD * HDV; i++)
                if (memcmp(&o1[i], &o2[i], 4))
                    fail_msg("layer %u pos0 %u n_q %u: elem %u %.9g vs %.9g", li, pos0, n_q, i, o1[i], o2[i]);
        }
        kvt_attention(s, li, q, n_q, NHEAD * HDK, pos0, NHEAD, scale, 0, 2, o3, NHEAD * HDV, m->scratch);
        kvt_attention(s, li, q, n_q, NHEAD * HDK, pos0, NHEAD, scale, 2, NHEAD, o3, NHEAD * HDV, m->scratch);
        assert_memory_equal(o1, o3, sizeof(float) * n_q * NHEAD * HDV);
        if (w && pos0 + n_q > w) {
            /* sanity: the window mask matters (differs from full attention) */
            kvt_attention_ref(m->kref[li], m->vref[li], pos0 + n_q, NKV, HDK, HDV, q, n_q, NHEAD * HDK, pos0,
                              NHEAD, scale, 0, o3, NHEAD * HDV);
            assert_true(memcmp(o1, o3, sizeof(float) * n_q * NHEAD * HDV) != 0);
        }
    }
}

/* Prefill in chunks then decode, checking attention before each commit (as the forward pass does). */
static void run_stream(sim *m, kvt_seq *s, const uint32_t *chunks, int n_chunks) {
    for (int c = 0; c < n_chunks; c++) {
        uint32_t pos0 = kvt_seq_len(s);
        sim_write(m, s, chunks[c]);
        check_attn(m, s, pos0, chunks[c]);
        sim_commit(s, chunks[c]);
    }
}

static void stream_case(uint32_t bt, kvt_codec base, kvt_codec c, uint32_t qs, uint32_t window) {
    sim m;
    sim_init(&m, bt, base, c, qs, window);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(m.p, 1, &s), KVT_OK);
    const uint32_t chunks[] = {13, 1, 1, 1, 7, 1, 1, 16, 1, 1, 1, 3, 1};
    run_stream(&m, s, chunks, (int)KVT_ARRAY_LEN(chunks));
    if (window) assert_null(kvt_seq_block(s, kvt_kv_layout_layer_group(m.l, 1), 0)); /* window slid */
    kvt_seq_free(s);
    sim_free(&m);
}

static const kvt_codec F16 = {.kind = KVT_CODEC_F16}, BF16 = {.kind = KVT_CODEC_BF16};
static kvt_codec aff(uint32_t bits, uint32_t g, int bf) {
    return (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)bits, .group_size = (uint16_t)g, .scale_bf16 = (uint8_t)bf};
}

static void test_f16_bt4_window(void **st) {
    (void)st;
    stream_case(4, F16, F16, 0, 6);
}
static void test_bf16_bt16_window(void **st) {
    (void)st;
    stream_case(16, BF16, BF16, 0, 20);
}
static void test_affine_mixed_variants(void **st) {
    (void)st;
    stream_case(16, F16, aff(4, 32, 0), 20, 9); /* blocks 0,1 f16; 2.. q4g32 */
    stream_case(4, BF16, aff(8, 32, 1), 0, 0);
    stream_case(4, F16, aff(3, 32, 0), 6, 5);
}

static void test_clone_trim_append(void **st) {
    (void)st;
    sim m;
    sim_init(&m, 4, F16, aff(8, 32, 0), 8, 0); /* FULL layers only: every trim is allowed */
    kvt_seq *a, *b, *c;
    assert_int_equal(kvt_seq_create(m.p, 9, &a), KVT_OK);
    const uint32_t pre[] = {18, 1, 1, 1, 9};
    run_stream(&m, a, pre, 5); /* len 30 */
    /* donor attention output before */
    static float q[NHEAD * HDK], before[2][NHEAD * HDV], after[NHEAD * HDV];
    for (int i = 0; i < NHEAD * HDK; i++) q[i] = tu_randf(&m.rng);
    for (uint32_t li = 0; li < 2; li++)
        kvt_attention(a, li, q, 1, NHEAD * HDK, 29, NHEAD, 0.2f, 0, NHEAD, before[li], NHEAD * HDV, m.scratch);
    /* keep a copy of the donor's decoded K/V */
    float *ka[2], *va[2];
    for (int li = 0; li < 2; li++) {
        ka[li] = malloc(MAXP * NKV * HDK * sizeof(float));
        va[li] = malloc(MAXP * NKV * HDV * sizeof(float));
        memcpy(ka[li], m.kref[li], MAXP * NKV * HDK * sizeof(float));
        memcpy(va[li], m.vref[li], MAXP * NKV * HDV * sizeof(float));
    }
    assert_int_equal(kvt_seq_clone(a, &b), KVT_OK);
    assert_int_equal(kvt_seq_trim(b, 23), KVT_OK); /* mid-block cut inside a sealed shared block */
    const uint32_t more[] = {5, 1, 1};
    run_stream(&m, b, more, 3); /* new K/V overwrite reference rows 23.. */
    for (uint32_t li = 0; li < 2; li++) {
        kvt_attention(a, li, q, 1, NHEAD * HDK, 29, NHEAD, 0.2f, 0, NHEAD, after, NHEAD * HDV, m.scratch);
        assert_memory_equal(before[li], after, sizeof after);
    }
    /* rebuild a third sequence from the donor's blocks (full + frozen tail) and continue it */
    for (int li = 0; li < 2; li++) {
        memcpy(m.kref[li], ka[li], MAXP * NKV * HDK * sizeof(float));
        memcpy(m.vref[li], va[li], MAXP * NKV * HDV * sizeof(float));
    }
    assert_int_equal(kvt_seq_freeze_tail(a), KVT_OK);
    assert_int_equal(kvt_seq_create(m.p, 9, &c), KVT_OK);
    for (uint32_t i = 0; i < kvt_seq_n_blocks(a); i++) {
        kvt_block *blk[1] = {kvt_seq_block(a, 0, i)};
        assert_int_equal(kvt_seq_append_blocks(c, blk), KVT_OK);
    }
    assert_int_equal(kvt_seq_len(c), 30);
    check_attn(&m, c, 20, 10); /* reads the appended blocks directly */
    const uint32_t cont[] = {3, 1, 6};
    run_stream(&m, c, cont, 3);
    for (uint32_t li = 0; li < 2; li++) {
        kvt_attention(a, li, q, 1, NHEAD * HDK, 29, NHEAD, 0.2f, 0, NHEAD, after, NHEAD * HDV, m.scratch);
        assert_memory_equal(before[li], after, sizeof after);
    }
    for (int li = 0; li < 2; li++) free(ka[li]), free(va[li]);
    kvt_seq_free(a);
    kvt_seq_free(b);
    kvt_seq_free(c);
    sim_free(&m);
}

/* Quantized attention stays close to attention over the unquantized values (sanity, not identity). */
static void test_affine_error_small(void **st) {
    (void)st;
    kvt_layer_desc d[1] = {{.kind = KVT_KIND_FULL, .n_kv_heads = 1, .head_dim_k = 64, .head_dim_v = 64,
                            .codec = aff(8, 32, 0)}};
    kvt_kv_layout *l;
    char err[100];
    assert_int_equal(kvt_kv_layout_create(d, 1, 16, F16, 0, &l, err, sizeof err), KVT_OK);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    uint64_t rng = 77;
    static float k[64 * 64], v[64 * 64], q[64], o1[64], o2[64];
    assert_int_equal(kvt_seq_prepare(s, 64), KVT_OK);
    for (int t = 0; t < 64; t++) {
        for (int i = 0; i < 64; i++) k[t * 64 + i] = tu_randf(&rng) * 0.3f, v[t * 64 + i] = tu_randf(&rng) * 0.3f;
        kvt_seq_write_kv(s, 0, (uint32_t)t, k + t * 64, v + t * 64);
    }
    for (int i = 0; i < 64; i++) q[i] = tu_randf(&rng);
    float *scr = malloc(kvt_attention_scratch_floats(l, 64) * sizeof(float));
    kvt_attention(s, 0, q, 1, 64, 63, 1, 0.125f, 0, 1, o1, 64, scr);
    kvt_attention_ref(k, v, 64, 1, 64, 64, q, 1, 64, 63, 1, 0.125f, 0, o2, 64);
    for (int i = 0; i < 64; i++) assert_true(fabsf(o1[i] - o2[i]) < 1e-2f);
    free(scr);
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

/* The reference's rounding contract (llama.cpp's CPU attention): Q is rounded to f16 before K·Q and
 * the normalized softmax weights before the V sum. Checked against an independent double-precision
 * evaluation of that definition (tolerance far below the rounding's own effect), and shown to differ
 * from the unrounded result by more than that tolerance, so the roundings really are there. */
static void test_ref_f16_roundings(void **st) {
    (void)st;
    enum { NK = 9, HD = 16 };
    static float k[NK * HD], v[NK * HD], q[HD], out[HD];
    uint64_t rng = 5;
    for (int i = 0; i < NK * HD; i++) {
        k[i] = kvt_f16_to_f32(kvt_f32_to_f16(tu_randf(&rng) * 3.0f)); /* f16-representable, as a cache */
        v[i] = kvt_f16_to_f32(kvt_f32_to_f16(tu_randf(&rng) * 2.0f));
    }
    for (int i = 0; i < HD; i++) q[i] = tu_randf(&rng) * 2.5f + 1e-3f;
    const float scale = 0.25f;
    kvt_attention_ref(k, v, NK, 1, HD, HD, q, 1, HD, NK - 1, 1, scale, 0, out, HD);
    double want[HD] = {0}, plain[HD] = {0}, s16[NK], sp[NK], m16 = -1e300, mp = -1e300, z16 = 0, zp = 0;
    for (int j = 0; j < NK; j++) {
        double a = 0, b = 0;
        for (int i = 0; i < HD; i++) {
            a += (double)kvt_f16_to_f32(kvt_f32_to_f16(q[i])) * k[j * HD + i];
            b += (double)q[i] * k[j * HD + i];
        }
        s16[j] = a * scale, sp[j] = b * scale;
        m16 = s16[j] > m16 ? s16[j] : m16, mp = sp[j] > mp ? sp[j] : mp;
    }
    for (int j = 0; j < NK; j++) z16 += exp(s16[j] - m16), zp += exp(sp[j] - mp);
    for (int j = 0; j < NK; j++) {
        const double w16 = kvt_f16_to_f32(kvt_f32_to_f16((float)(exp(s16[j] - m16) / z16)));
        for (int i = 0; i < HD; i++) {
            want[i] += w16 * v[j * HD + i];
            plain[i] += exp(sp[j] - mp) / zp * v[j * HD + i];
        }
    }
    double err = 0, eff = 0;
    for (int i = 0; i < HD; i++) {
        err = fmax(err, fabs(out[i] - want[i]));
        eff = fmax(eff, fabs(plain[i] - want[i]));
    }
    assert_true(err < 2e-6);
    assert_true(eff > 10 * err && eff > 1e-5);
}

/* ---- prefill tiling: many shapes, one f16 layer, against the per-query reference ---- */

typedef struct pshape {
    uint32_t n_kv, rep, hdk, hdv, bt, window, n_ctx;
    uint32_t chunks[6]; /* prefill chunk sizes, summing to n_ctx (0 ends) */
    int skip_first;     /* the first chunk only fills the context (not checked: keeps the test fast) */
} pshape;

static uint64_t g_out_hash = 1469598103934665603ull; /* FNV-1a over every output, for the level check */
static void hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) g_out_hash = (g_out_hash ^ b[i]) * 1099511628211ull;
}

/* Writes each chunk, then checks before committing it: one call over all heads and queries equals
 * kvt_attention_ref bit for bit; so do the heads split at every GQA-group and mid-group boundary
 * (thread splits) and the queries split in two calls (batch invariance). */
static void prefill_shape(const pshape *ps) {
    const uint32_t n_head = ps->n_kv * ps->rep, qd = n_head * ps->hdk, od = n_head * ps->hdv;
    kvt_layer_desc d = {.kind = ps->window ? KVT_KIND_WINDOW : KVT_KIND_FULL, .window = ps->window,
                        .n_kv_heads = ps->n_kv, .head_dim_k = ps->hdk, .head_dim_v = ps->hdv, .codec = F16};
    kvt_kv_layout *l;
    char err[200];
    assert_int_equal(kvt_kv_layout_create(&d, 1, ps->bt, F16, 0, &l, err, sizeof err), KVT_OK);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    float *kr = malloc(sizeof(float) * ps->n_ctx * ps->n_kv * ps->hdk);
    float *vr = malloc(sizeof(float) * ps->n_ctx * ps->n_kv * ps->hdv);
    float *k = malloc(sizeof(float) * ps->n_kv * ps->hdk), *v = malloc(sizeof(float) * ps->n_kv * ps->hdv);
    float *scr = malloc(sizeof(float) * kvt_attention_scratch_floats(l, ps->n_ctx));
    uint32_t maxc = 0;
    for (int c = 0; c < 6 && ps->chunks[c]; c++) maxc = KVT_MAX(maxc, ps->chunks[c]);
    float *q = malloc(sizeof(float) * maxc * qd);
    float *o1 = malloc(sizeof(float) * maxc * od), *o2 = malloc(sizeof(float) * maxc * od);
    float *o3 = malloc(sizeof(float) * maxc * od);
    int32_t *toks = malloc(sizeof(int32_t) * maxc);
    uint8_t row[512];
    uint64_t rng = ps->n_ctx * 131 + ps->hdk * 7 + ps->rep;
    const float scale = 1.0f / sqrtf((float)ps->hdk);
    uint32_t pos0 = 0;
    for (int c = 0; c < 6 && ps->chunks[c]; c++) {
        const uint32_t n = ps->chunks[c];
        assert_int_equal(kvt_seq_prepare(s, n), KVT_OK);
        for (uint32_t t = 0; t < n; t++) {
            const uint32_t pos = pos0 + t;
            for (uint32_t i = 0; i < ps->n_kv * ps->hdk; i++) k[i] = tu_randf(&rng) * 2;
            for (uint32_t i = 0; i < ps->n_kv * ps->hdv; i++) v[i] = tu_randf(&rng);
            kvt_seq_write_kv(s, 0, pos, k, v);
            for (uint32_t h = 0; h < ps->n_kv; h++) {
                kvt_codec_encode_row(F16, k + h * ps->hdk, ps->hdk, row);
                kvt_codec_decode_row(F16, row, ps->hdk, kr + ((size_t)pos * ps->n_kv + h) * ps->hdk);
                kvt_codec_encode_row(F16, v + h * ps->hdv, ps->hdv, row);
                kvt_codec_decode_row(F16, row, ps->hdv, vr + ((size_t)pos * ps->n_kv + h) * ps->hdv);
            }
        }
        if (c == 0 && ps->skip_first) goto commit;
        for (uint32_t i = 0; i < n * qd; i++) q[i] = tu_randf(&rng) * 3;
        memset(o1, 0xff, sizeof(float) * n * od);
        kvt_attention(s, 0, q, n, qd, pos0, n_head, scale, 0, n_head, o1, od, scr);
        kvt_attention_ref(kr, vr, pos0 + n, ps->n_kv, ps->hdk, ps->hdv, q, n, qd, pos0, n_head, scale, ps->window,
                          o2, od);
        for (uint32_t i = 0; i < n * od; i++)
            if (memcmp(&o1[i], &o2[i], 4))
                fail_msg("shape kv%u rep%u hd%u/%u bt%u w%u: pos0 %u n %u elem %u: %.9g vs ref %.9g", ps->n_kv,
                         ps->rep, ps->hdk, ps->hdv, ps->bt, ps->window, pos0, n, i, o1[i], o2[i]);
        hash_bytes(o1, sizeof(float) * n * od);
        /* thread splits over heads: [0, h) and [h, n_head) */
        for (uint32_t h = 1; h < n_head; h += (ps->rep > 1 ? ps->rep - 1 : 1)) {
            memset(o3, 0xff, sizeof(float) * n * od);
            kvt_attention(s, 0, q, n, qd, pos0, n_head, scale, 0, h, o3, od, scr);
            kvt_attention(s, 0, q, n, qd, pos0, n_head, scale, h, n_head, o3, od, scr);
            assert_memory_equal(o1, o3, sizeof(float) * n * od);
        }
        /* batch invariance: queries in two calls */
        if (n > 1) {
            const uint32_t a = n / 3 + 1;
            memset(o3, 0xff, sizeof(float) * n * od);
            kvt_attention(s, 0, q, a, qd, pos0, n_head, scale, 0, n_head, o3, od, scr);
            kvt_attention(s, 0, q + (size_t)a * qd, n - a, qd, pos0 + a, n_head, scale, 0, n_head,
                          o3 + (size_t)a * od, od, scr);
            assert_memory_equal(o1, o3, sizeof(float) * n * od);
        }
    commit:
        for (uint32_t i = 0; i < n; i++) toks[i] = (int32_t)((pos0 + i) % 1000);
        assert_int_equal(kvt_seq_commit(s, toks, n), KVT_OK);
        pos0 += n;
    }
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
    free(kr), free(vr), free(k), free(v), free(scr), free(q), free(o1), free(o2), free(o3), free(toks);
}

static const pshape PSHAPES[] = {
    /* GQA ratios 1..8, head dims 64 and 128, pair counts below, at and above the 64-pair tile */
    {1, 1, 64, 64, 16, 0, 200, {100, 37, 63}, 0},
    {3, 3, 64, 64, 16, 0, 300, {129, 64, 1, 106}, 0},
    {2, 2, 128, 128, 32, 0, 260, {97, 96, 67}, 0},
    {1, 8, 64, 64, 8, 0, 150, {33, 17, 100}, 0},
    {2, 4, 128, 64, 16, 0, 180, {65, 115}, 0},
    {2, 3, 64, 128, 256, 0, 300, {300}, 0},
    /* window layers: the window slides within and across tiles, blocks drop */
    {3, 3, 64, 64, 16, 40, 300, {120, 57, 123}, 0},
    {2, 2, 128, 128, 8, 9, 120, {70, 50}, 0},
    {1, 4, 64, 64, 4, 100, 260, {150, 110}, 0},
    /* odd head dims (no 16-wide kernels), tails of chunks */
    {2, 2, 48, 40, 16, 0, 120, {71, 49}, 0},
    /* past ATT_BIG_CTX (16384): the short tile, and a chunk straddling the switch */
    {1, 2, 64, 64, 256, 0, 16400, {16370, 10, 20}, 1},
};

static void test_prefill_tiles_match_ref(void **st) {
    (void)st;
    for (size_t i = 0; i < KVT_ARRAY_LEN(PSHAPES); i++) prefill_shape(&PSHAPES[i]);
}

/* ---- split-K single-row attention (kvt_attention_split) against kvt_attention and the reference ---- */

typedef struct sshape {
    uint32_t n_kv, rep, hdk, hdv, bt, window;
    kvt_codec base, codec;
    uint32_t quant_start;
    uint32_t depths[4]; /* keys seen by the checked decode rows, increasing (0 ends) */
} sshape;

typedef struct split_run {
    const kvt_seq *s;
    const float *q;
    uint32_t pos, n_head;
    float scale;
    float *out, *shared, **scratch;
    kvt_threadpool *tp;
} split_run;

static void split_task(void *ctx, int ith, int nth) {
    const split_run *r = ctx;
    kvt_attention_split(r->s, 0, r->q, r->pos, r->n_head, r->scale, r->out, r->shared, r->scratch[ith], r->tp, ith,
                        nth);
}

/* Streams K/V up to each depth d (the row at d - 1 written but not committed, as in a decode step),
 * then: kvt_attention equals kvt_attention_ref, and kvt_attention_split on 1, 2, 3 and 4 threads
 * equals kvt_attention, bit for bit. */
static void split_shape(const sshape *ss, kvt_threadpool *const *tps) {
    const uint32_t n_head = ss->n_kv * ss->rep, qd = n_head * ss->hdk, od = n_head * ss->hdv;
    uint32_t n_ctx = 0;
    for (int i = 0; i < 4 && ss->depths[i]; i++) n_ctx = ss->depths[i];
    kvt_layer_desc d = {.kind = ss->window ? KVT_KIND_WINDOW : KVT_KIND_FULL, .window = ss->window,
                        .n_kv_heads = ss->n_kv, .head_dim_k = ss->hdk, .head_dim_v = ss->hdv, .codec = ss->codec};
    kvt_kv_layout *l;
    char err[200];
    assert_int_equal(kvt_kv_layout_create(&d, 1, ss->bt, ss->base, ss->quant_start, &l, err, sizeof err), KVT_OK);
    assert_true(kvt_attention_split_ok(l, 0, n_head));
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    float *kr = malloc(sizeof(float) * n_ctx * ss->n_kv * ss->hdk);
    float *vr = malloc(sizeof(float) * n_ctx * ss->n_kv * ss->hdv);
    float *k = malloc(sizeof(float) * ss->n_kv * ss->hdk), *v = malloc(sizeof(float) * ss->n_kv * ss->hdv);
    float *q = malloc(sizeof(float) * qd), *o1 = malloc(sizeof(float) * od), *o2 = malloc(sizeof(float) * od);
    float *o3 = malloc(sizeof(float) * od);
    float *shared = malloc(sizeof(float) * kvt_attention_split_floats(n_head, n_ctx));
    float *scr[4];
    for (int t = 0; t < 4; t++) scr[t] = malloc(sizeof(float) * kvt_attention_scratch_floats(l, n_ctx));
    uint8_t row[512];
    uint64_t rng = n_ctx * 31 + ss->hdv * 7 + ss->rep + ss->codec.kind;
    const float scale = 1.0f / sqrtf((float)ss->hdk);
    for (int di = 0; di < 4 && ss->depths[di]; di++) {
        const uint32_t pos = ss->depths[di] - 1, len = kvt_seq_len(s);
        assert_int_equal(kvt_seq_prepare(s, pos + 1 - len), KVT_OK);
        for (uint32_t t = len; t <= pos; t++) {
            for (uint32_t i = 0; i < ss->n_kv * ss->hdk; i++) k[i] = tu_randf(&rng) * 2;
            for (uint32_t i = 0; i < ss->n_kv * ss->hdv; i++) v[i] = tu_randf(&rng);
            kvt_seq_write_kv(s, 0, t, k, v);
            const kvt_codec c = kvt_kv_layout_codec_at(l, 0, t / ss->bt);
            for (uint32_t h = 0; h < ss->n_kv; h++) {
                kvt_codec_encode_row(c, k + h * ss->hdk, ss->hdk, row);
                kvt_codec_decode_row(c, row, ss->hdk, kr + ((size_t)t * ss->n_kv + h) * ss->hdk);
                kvt_codec_encode_row(c, v + h * ss->hdv, ss->hdv, row);
                kvt_codec_decode_row(c, row, ss->hdv, vr + ((size_t)t * ss->n_kv + h) * ss->hdv);
            }
            if (t < pos) { /* earlier rows are committed one by one (windows drop their blocks) */
                const int32_t tok = (int32_t)(t % 1000);
                assert_int_equal(kvt_seq_commit(s, &tok, 1), KVT_OK);
            }
        }
        for (uint32_t i = 0; i < qd; i++) q[i] = tu_randf(&rng) * 3;
        memset(o1, 0xff, sizeof(float) * od);
        kvt_attention(s, 0, q, 1, qd, pos, n_head, scale, 0, n_head, o1, od, scr[0]);
        kvt_attention_ref(kr, vr, pos + 1, ss->n_kv, ss->hdk, ss->hdv, q, 1, qd, pos, n_head, scale, ss->window, o2, od);
        assert_memory_equal(o1, o2, sizeof(float) * od);
        for (int nth = 1; nth <= 4; nth++) {
            memset(o3, 0xff, sizeof(float) * od); /* NaN garbage: every element must be written */
            split_run r = {s, q, pos, n_head, scale, o3, shared, scr, tps[nth - 1]};
            const uint64_t calls = kvt_attention_split_calls();
            kvt_threadpool_run(tps[nth - 1], split_task, &r);
            assert_true(kvt_attention_split_calls() == calls + 1);
            for (uint32_t i = 0; i < od; i++)
                if (memcmp(&o1[i], &o3[i], 4))
                    fail_msg("split kv%u rep%u hd%u/%u bt%u w%u: depth %u, %d threads, elem %u: %.9g vs %.9g",
                             ss->n_kv, ss->rep, ss->hdk, ss->hdv, ss->bt, ss->window, pos + 1, nth, i, o3[i], o1[i]);
        }
        const int32_t tok = (int32_t)(pos % 1000);
        assert_int_equal(kvt_seq_commit(s, &tok, 1), KVT_OK);
    }
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
    for (int t = 0; t < 4; t++) free(scr[t]);
    free(kr), free(vr), free(k), free(v), free(q), free(o1), free(o2), free(o3), free(shared);
}

static const sshape SSHAPES[] = {
    /* smol-135m's heads (3 KV heads, GQA 3, head dim 64): 1 key, depths off the block and thread
     * counts, and past the split threshold (1024) */
    {3, 3, 64, 64, 16, 0, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_F16}, 0, {1, 37, 301, 1100}},
    /* one KV head, GQA 8; f16 blocks then q8g32 (V columns in whole 32-wide groups) */
    {1, 8, 64, 64, 32, 0, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_AFFINE, .bits = 8, .group_size = 32}, 40, {50, 333}},
    /* bf16 blocks then q4g64 with bf16 scales, head dim 128 */
    {2, 2, 128, 128, 16, 0, {.kind = KVT_CODEC_BF16},
     {.kind = KVT_CODEC_AFFINE, .bits = 4, .group_size = 64, .scale_bf16 = 1}, 20, {17, 250}},
    /* odd head dims (V rows not in 16-column units), GQA 3 */
    {2, 3, 48, 40, 8, 0, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_F16}, 0, {29, 103}},
    /* window layer: the window slides, blocks are dropped */
    {2, 4, 64, 64, 16, 40, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_F16}, 0, {10, 45, 130, 200}},
    /* no GQA (one query head per KV head: the single-row kernels), 3-bit affine (scalar decode) */
    {4, 1, 32, 64, 256, 0, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_AFFINE, .bits = 3, .group_size = 32}, 256, {300}},
    /* window over 2-bit affine blocks of 4 tokens */
    {1, 2, 64, 64, 4, 9, {.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_AFFINE, .bits = 2, .group_size = 64}, 8, {5, 23}},
};

static void split_shapes(void) {
    kvt_threadpool *tps[4];
    for (int t = 0; t < 4; t++) assert_non_null(tps[t] = kvt_threadpool_create(t + 1));
    for (size_t i = 0; i < KVT_ARRAY_LEN(SSHAPES); i++) split_shape(&SSHAPES[i], tps);
    for (int t = 0; t < 4; t++) kvt_threadpool_free(tps[t]);
}

static void test_split_matches_unsplit(void **st) {
    (void)st;
    split_shapes();
}

/* Layers split-K cannot compute bit for bit are refused (their decode keeps kvt_attention). */
static void test_split_ok(void **st) {
    (void)st;
    const kvt_codec turbo = {.kind = KVT_CODEC_TURBO, .bits = 8, .vbits = 3};
    kvt_layer_desc d[3] = {
        {.kind = KVT_KIND_FULL, .n_kv_heads = 2, .head_dim_k = 64, .head_dim_v = 64, .codec = F16},
        {.kind = KVT_KIND_FULL, .n_kv_heads = 2, .head_dim_k = 64, .head_dim_v = 64, .codec = turbo},
        {.kind = KVT_KIND_MLA, .n_kv_heads = 1, .head_dim_k = 96, .head_dim_v = 64, .codec = F16},
    };
    kvt_kv_layout *l;
    char err[200];
    assert_int_equal(kvt_kv_layout_create(d, 3, 16, F16, 0, &l, err, sizeof err), KVT_OK);
    assert_true(kvt_attention_split_ok(l, 0, 8));
    assert_false(kvt_attention_split_ok(l, 0, 7));   /* not a GQA multiple */
    assert_false(kvt_attention_split_ok(l, 0, 130)); /* more than 64 query heads per KV head */
    assert_false(kvt_attention_split_ok(l, 1, 8));   /* TURBO */
    assert_false(kvt_attention_split_ok(l, 2, 8));   /* MLA */
    assert_false(kvt_attention_split_ok(l, 3, 8));   /* no such layer */
    kvt_kv_layout_free(l);
}

/* The SIMD softmax maximum equals the scalar one (NaNs ignored, -inf only, every tail length). */
static void test_max_scores(void **st) {
    (void)st;
    static float sc[200];
    uint64_t rng = 3;
    for (uint32_t n = 0; n <= 200; n++)
        for (int kind = 0; kind < 4; kind++) {
            for (uint32_t j = 0; j < n; j++) {
                const float r = tu_randf(&rng);
                sc[j] = kind == 0 ? r * 50 : kind == 1 ? -INFINITY : kind == 2 ? (r > 0.5f ? NAN : r) : -r * r;
            }
            if (kind == 3 && n) sc[tu_rand(&rng) % n] = 7.0f; /* one clear maximum */
            const float a = kvt_attention_max_scores(sc, n), b = kvt_attention_max_scores_scalar(sc, n);
            assert_true(a == b || (a != a && b != b));
            float want = -INFINITY;
            for (uint32_t j = 0; j < n; j++)
                if (sc[j] > want) want = sc[j];
            assert_true(a == want);
            if (kind == 3 && n) assert_true(a == 7.0f);
        }
}

/* Every SIMD level gives the same bits (the tiled kernels' lanes and the scalar fallbacks): the
 * outputs of all prefill shapes hash alike at the native level, AVX2 and scalar. Runs last: forcing
 * a level only lowers it. */
static void test_prefill_simd_levels(void **st) {
    (void)st;
    uint64_t h[3];
    const int top = kvt_vec_level();
    for (int lv = top; lv >= 0; lv--) {
        kvt_vec_force_level(lv);
        assert_int_equal(kvt_vec_level(), lv);
        g_out_hash = 1469598103934665603ull;
        for (size_t i = 0; i < KVT_ARRAY_LEN(PSHAPES); i++) prefill_shape(&PSHAPES[i]);
        h[lv] = g_out_hash;
        if (lv < top) assert_true(h[lv] == h[top]);
        split_shapes(); /* split-K against kvt_attention at this level */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_bt4_window),   cmocka_unit_test(test_bf16_bt16_window),
        cmocka_unit_test(test_affine_mixed_variants), cmocka_unit_test(test_clone_trim_append),
        cmocka_unit_test(test_affine_error_small), cmocka_unit_test(test_ref_f16_roundings),
        cmocka_unit_test(test_max_scores),          cmocka_unit_test(test_prefill_tiles_match_ref),
        cmocka_unit_test(test_split_matches_unsplit), cmocka_unit_test(test_split_ok),
        cmocka_unit_test(test_prefill_simd_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
