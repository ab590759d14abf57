/* test_kv_block.c — layout, hashing, block pool, sequences (prepare/commit/clone/trim/append),
 * window release and recurrent state/snapshots. */
#include <xxhash.h>

#include "testutil.h"
#include "kv/kv.h"

static const kvt_codec F16 = {.kind = KVT_CODEC_F16};
static kvt_codec aff(uint32_t bits, uint32_t g) {
    return (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)bits, .group_size = (uint16_t)g};
}
static kvt_layer_desc full(kvt_codec c) {
    return (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = 2, .head_dim_k = 32, .head_dim_v = 32, .codec = c};
}
static kvt_layer_desc win(uint32_t w, kvt_codec c) {
    kvt_layer_desc d = full(c);
    d.kind = KVT_KIND_WINDOW;
    d.window = w;
    return d;
}

static kvt_kv_layout *mk(const kvt_layer_desc *d, uint32_t n, uint32_t bt, uint32_t qs) {
    kvt_kv_layout *l = NULL;
    char err[256] = "";
    kvt_status st = kvt_kv_layout_create(d, n, bt, F16, qs, &l, err, sizeof err);
    if (st != KVT_OK) fail_msg("layout: %s", err);
    return l;
}

static void expect_invalid(const kvt_layer_desc *d, uint32_t n, uint32_t bt, kvt_codec base, const char *needle) {
    kvt_kv_layout *l = (kvt_kv_layout *)1;
    char err[256] = "";
    assert_int_equal(kvt_kv_layout_create(d, n, bt, base, 0, &l, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_null(l);
    if (!strstr(err, needle)) fail_msg("error '%s' lacks '%s'", err, needle);
}

static void test_layout_invalid(void **st) {
    (void)st;
    kvt_layer_desc d[6];
    d[0] = full(F16);
    d[0].kind = (kvt_layer_kind)0;
    expect_invalid(d, 1, 16, F16, "kind");
    d[0].kind = (kvt_layer_kind)7;
    expect_invalid(d, 1, 16, F16, "kind");
    d[0] = full(F16);
    d[0].head_dim_v = 0;
    expect_invalid(d, 1, 16, F16, "dims");
    d[0] = full(F16);
    d[0].n_kv_heads = 0;
    expect_invalid(d, 1, 16, F16, "dims");
    d[0] = full(aff(4, 64)); /* head dim 32 not a multiple of 64 */
    expect_invalid(d, 1, 16, F16, "codec");
    d[0] = full(aff(7, 32));
    expect_invalid(d, 1, 16, F16, "codec");
    d[0] = win(0, F16);
    expect_invalid(d, 1, 16, F16, "window");
    d[0] = (kvt_layer_desc){.kind = KVT_KIND_RECURRENT, .state_bytes = 0};
    expect_invalid(d, 1, 16, F16, "state_bytes");
    d[0] = (kvt_layer_desc){.kind = KVT_KIND_RECURRENT, .state_bytes = 64};
    d[1] = d[0];
    expect_invalid(d, 2, 16, F16, "recurrent"); /* no attention layer: no blocks to chain */
    for (int i = 0; i < 5; i++) d[i] = win(8 + (uint32_t)i, F16);
    expect_invalid(d, 5, 16, F16, "groups");
    d[0] = full(F16);
    expect_invalid(d, 1, 0, F16, "block_tokens");
    expect_invalid(d, 1, 16, aff(8, 32), "base");
}

static void test_layout_groups_variants(void **st) {
    (void)st;
    /* Gemma-3 like: layer i is FULL iff i % 6 == 5, else WINDOW(8); plus one recurrent layer. */
    kvt_layer_desc d[13];
    for (int i = 0; i < 12; i++) d[i] = i % 6 == 5 ? full(aff(8, 32)) : win(8, aff(8, 32));
    d[12] = (kvt_layer_desc){.kind = KVT_KIND_RECURRENT, .state_bytes = 100};
    kvt_kv_layout *l = mk(d, 13, 16, 20);
    assert_int_equal(kvt_kv_layout_n_groups(l), 2);
    assert_int_equal(kvt_kv_layout_layer_group(l, 0), 0);
    assert_int_equal(kvt_kv_layout_layer_group(l, 5), 1);
    assert_int_equal(kvt_kv_layout_layer_group(l, 12), UINT32_MAX);
    assert_int_equal(kvt_kv_layout_group_kind(l, 0), KVT_KIND_WINDOW);
    assert_int_equal(kvt_kv_layout_group_window(l, 0), 8);
    assert_int_equal(kvt_kv_layout_group_n_layers(l, 0), 10);
    assert_int_equal(kvt_kv_layout_group_n_layers(l, 1), 2);
    assert_int_equal(kvt_kv_layout_group_layer(l, 1, 1), 11);
    assert_true(kvt_kv_layout_state_bytes(l) >= 100);
    /* quant_start 20 rounds up to 32: blocks 0,1 are f16; block 2 on is q8g32 */
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 1).kind, KVT_CODEC_F16);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 2).kind, KVT_CODEC_AFFINE);
    size_t rb16 = kvt_kv_layout_row_bytes(l, 5, 0, 0), rbq = kvt_kv_layout_row_bytes(l, 5, 2, 1);
    assert_int_equal(rb16, 64);
    assert_int_equal(rbq, 32 + 4);
    for (uint32_t i = 0; i < 12; i++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t bi = 0; bi < 4; bi++) assert_int_equal(kvt_kv_layout_section_offset(l, i, bi, kv) % 64, 0);
    /* group 1 (two FULL layers): layer 5 K, V then layer 11 K, V, each 16 tokens x 2 heads */
    assert_int_equal(kvt_kv_layout_section_offset(l, 5, 0, 0), 0);
    assert_int_equal(kvt_kv_layout_section_offset(l, 5, 0, 1), 16 * 2 * 64);
    assert_int_equal(kvt_kv_layout_section_offset(l, 11, 0, 0), 2 * 16 * 2 * 64);
    assert_int_equal(kvt_kv_layout_block_bytes(l, 1, 0), 4 * 16 * 2 * 64);
    assert_int_equal(kvt_kv_layout_section_offset(l, 5, 3, 1), 16 * 2 * 36); /* 1152 is 64-aligned */
    assert_int_equal(kvt_kv_layout_section_offset(l, 11, 3, 0), 2 * 16 * 2 * 36);
    assert_true(kvt_kv_layout_block_bytes(l, 1, 3) < kvt_kv_layout_block_bytes(l, 1, 0));
    assert_true(kvt_kv_layout_bytes_per_token(l) == 12 * 2 * 2 * 36.0);
    char buf[64];
    kvt_kv_layout_describe_layer(l, 0, buf, sizeof buf);
    assert_string_equal(buf, "window(8)/q8g32");
    kvt_kv_layout_describe_layer(l, 5, buf, sizeof buf);
    assert_string_equal(buf, "full/q8g32");
    kvt_kv_layout_describe_layer(l, 12, buf, sizeof buf);
    assert_string_equal(buf, "recurrent(100B)");
    kvt_kv_layout_key(l, buf, sizeof buf);
    assert_string_equal(buf, "bt16-f16-kv8g32-s20");
    kvt_kv_layout_free(l);
}

static void test_layout_key(void **st) {
    (void)st;
    kvt_layer_desc d[3] = {full(F16), full(F16), full(F16)};
    char k1[96], k2[96], k3[96];
    kvt_kv_layout *l = mk(d, 3, 256, 0);
    kvt_kv_layout_key(l, k1, sizeof k1);
    assert_string_equal(k1, "bt256-f16");
    kvt_kv_layout_free(l);
    d[1] = full(aff(4, 32));
    l = mk(d, 3, 256, 0);
    kvt_kv_layout_key(l, k1, sizeof k1);
    assert_non_null(strstr(k1, "bt256-f16-cfg-"));
    kvt_kv_layout_free(l);
    l = mk(d, 3, 256, 0);
    kvt_kv_layout_key(l, k2, sizeof k2);
    assert_string_equal(k1, k2); /* stable */
    kvt_kv_layout_free(l);
    d[1] = full(aff(8, 32));
    l = mk(d, 3, 256, 0);
    kvt_kv_layout_key(l, k3, sizeof k3);
    assert_string_not_equal(k1, k3);
    kvt_kv_layout_free(l);
    l = mk(d, 3, 256, 512);
    kvt_kv_layout_key(l, k2, sizeof k2);
    assert_string_not_equal(k2, k3); /* quant_start is part of the key */
    kvt_kv_layout_free(l);
    l = mk(d, 3, 128, 0);
    kvt_kv_layout_key(l, k2, sizeof k2);
    assert_string_not_equal(k2, k3);
    kvt_kv_layout_free(l);
}

static void test_hashes(void **st) {
    (void)st;
    int32_t t[4] = {1, 2, 3, 4};
    uint64_t h = kvt_chain_hash(7, t, 4);
    assert_true(h == kvt_chain_hash(7, t, 4));
    assert_true(h != kvt_chain_hash(8, t, 4));
    assert_true(h != kvt_chain_hash(7, t, 3));
    t[2] = 5;
    assert_true(h != kvt_chain_hash(7, t, 4));
    /* XXH3-64 over parent (LE) || tokens (LE) */
    uint8_t buf[8 + 16];
    uint64_t parent = 0x0102030405060708ull;
    memcpy(buf, &parent, 8);
    memcpy(buf + 8, t, 16);
    assert_true(kvt_chain_hash(parent, t, 4) == XXH3_64bits(buf, sizeof buf));
    assert_true(kvt_root_hash("ab", "c") != kvt_root_hash("a", "bc"));
    assert_true(kvt_root_hash("m", "x") != kvt_root_hash("m", "y"));
    assert_true(kvt_root_hash("m", "x") == kvt_root_hash("m", "x"));
}

/* ------------------------------------------------------------------ pool */
typedef struct press_ctx {
    kvt_block *victim;
    int calls;
} press_ctx;
static bool press_fn(void *ctx, uint64_t need) {
    press_ctx *p = ctx;
    p->calls++;
    assert_true(need > 0);
    if (!p->victim) return false;
    kvt_block_release(p->victim);
    p->victim = NULL;
    return true;
}

static void test_pool_budget_pressure(void **st) {
    (void)st;
    kvt_layer_desc d[1] = {full(F16)};
    kvt_kv_layout *l = mk(d, 1, 4, 0);
    const size_t bb = kvt_kv_layout_block_bytes(l, 0, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 2 * bb);
    kvt_block *a, *b, *c;
    assert_int_equal(kvt_block_alloc(p, 0, 0, &a), KVT_OK);
    assert_int_equal(kvt_block_alloc(p, 0, 1, &b), KVT_OK);
    assert_int_equal(kvt_block_pool_used_bytes(p), 2 * bb);
    assert_int_equal(kvt_block_alloc(p, 0, 2, &c), KVT_ERR_POOL_EXHAUSTED);
    assert_null(c);
    assert_int_equal(kvt_block_alloc(p, 5, 0, &c), KVT_ERR_INVALID_ARG);
    press_ctx pc = {.victim = b};
    kvt_block_pool_set_pressure(p, press_fn, &pc);
    assert_int_equal(kvt_block_alloc(p, 0, 2, &c), KVT_OK); /* pressure freed b, retry succeeded */
    assert_int_equal(pc.calls, 1);
    kvt_block *e;
    assert_int_equal(kvt_block_alloc(p, 0, 3, &e), KVT_ERR_POOL_EXHAUSTED);
    assert_int_equal(pc.calls, 2);
    assert_int_equal(kvt_block_pool_n_blocks(p), 2);
    /* refcounts: seal, retain, release exactly once each */
    int32_t toks[4] = {1, 2, 3, 4};
    assert_false(kvt_block_sealed(a));
    assert_int_equal(kvt_block_seal(a, 99, toks, 4, kvt_chain_hash(99, toks, 4) ^ 1), KVT_ERR_CORRUPT);
    assert_int_equal(kvt_block_seal(a, 99, toks, 4, kvt_chain_hash(99, toks, 4)), KVT_OK);
    assert_true(kvt_block_sealed(a));
    assert_int_equal(kvt_block_seal(a, 99, toks, 4, 0), KVT_ERR_INVALID_ARG);
    assert_true(kvt_block_hash(a) == kvt_chain_hash(99, toks, 4));
    kvt_block_retain(a);
    assert_int_equal(kvt_block_refcount(a), 2);
    kvt_block_release(a);
    assert_int_equal(kvt_block_pool_used_bytes(p), 2 * bb);
    kvt_block_release(a);
    kvt_block_release(c);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    assert_int_equal(kvt_block_pool_peak_bytes(p), 2 * bb);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

/* ------------------------------------------------------------------ sequences */
static void fill(kvt_seq *s, const kvt_kv_layout *l, uint32_t n, uint64_t *rng, int32_t tok0) {
    assert_int_equal(kvt_seq_prepare(s, n), KVT_OK);
    float k[2 * 64], v[2 * 64];
    int32_t toks[512];
    uint32_t len = kvt_seq_len(s);
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t li = 0; li < kvt_kv_layout_n_layers(l); li++) {
            if (kvt_kv_layout_layer(l, li)->kind == KVT_KIND_RECURRENT) continue;
            for (int i = 0; i < 2 * 64; i++) k[i] = tu_randf(rng), v[i] = tu_randf(rng);
            kvt_seq_write_kv(s, li, len + t, k, v);
        }
        toks[t] = tok0 + (int32_t)(len + t);
    }
    assert_int_equal(kvt_seq_commit(s, toks, n), KVT_OK);
}

static uint64_t hash_seq_blocks(const kvt_seq *s, const kvt_kv_layout *l) {
    uint64_t h = 0;
    for (uint32_t g = 0; g < kvt_kv_layout_n_groups(l); g++)
        for (uint32_t i = 0; i < kvt_seq_n_blocks(s); i++) {
            kvt_block *b = kvt_seq_block(s, g, i);
            if (!b) continue;
            h = XXH3_64bits_withSeed(kvt_block_data(b), kvt_block_data_bytes(b), h);
            h = XXH3_64bits_withSeed(kvt_block_tokens(b), 4 * kvt_block_n_tokens(b), h);
        }
    return h;
}

static void test_seq_commit_seal_chain(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {full(F16), full(aff(4, 32))};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t root = kvt_root_hash("model", "ns"), rng = 1;
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, root, &s), KVT_OK);
    fill(s, l, 3, &rng, 100);
    assert_int_equal(kvt_seq_n_blocks(s), 1);
    assert_false(kvt_block_sealed(kvt_seq_block(s, 0, 0)));
    fill(s, l, 6, &rng, 100); /* len 9: blocks 0,1 full and sealed, block 2 partial */
    assert_int_equal(kvt_seq_len(s), 9);
    assert_int_equal(kvt_seq_n_blocks(s), 3);
    uint64_t parent = root;
    for (uint32_t i = 0; i < 2; i++) {
        kvt_block *b = kvt_seq_block(s, 0, i);
        assert_true(kvt_block_sealed(b));
        assert_int_equal(kvt_block_n_tokens(b), 4);
        assert_true(kvt_block_parent(b) == parent);
        uint64_t h = kvt_chain_hash(parent, kvt_seq_tokens(s) + 4 * i, 4);
        assert_true(kvt_block_hash(b) == h && kvt_seq_block_chain(s, i) == h);
        parent = h;
    }
    assert_int_equal(kvt_seq_block_chain(s, 2), 0);
    assert_false(kvt_block_sealed(kvt_seq_block(s, 0, 2)));
    assert_int_equal(kvt_block_n_tokens(kvt_seq_block(s, 0, 2)), 1);
    /* commit beyond the prepared range is refused */
    int32_t t = 5;
    assert_int_equal(kvt_seq_commit(s, &t, 1), KVT_ERR_INVALID_ARG);
    kvt_seq_free(s);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

static void test_clone_cow_donor_unchanged(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {full(F16), win(64, F16)};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t rng = 3;
    kvt_seq *a, *b;
    assert_int_equal(kvt_seq_create(p, 11, &a), KVT_OK);
    fill(a, l, 10, &rng, 0);
    uint64_t ha = hash_seq_blocks(a, l);
    uint64_t used = kvt_block_pool_used_bytes(p);
    assert_int_equal(kvt_seq_clone(a, &b), KVT_OK);
    assert_int_equal(kvt_block_pool_used_bytes(p), used); /* clone shares everything */
    kvt_block *tail = kvt_seq_block(a, 0, 2);
    assert_true(kvt_block_sealed(tail)); /* frozen */
    assert_int_equal(kvt_block_n_tokens(tail), 2);
    assert_int_equal(kvt_block_refcount(tail), 2);
    assert_ptr_equal(kvt_seq_block(b, 0, 2), tail);
    fill(b, l, 7, &rng, 1000); /* writes into b must copy the shared tail */
    assert_ptr_not_equal(kvt_seq_block(b, 0, 2), tail);
    assert_true(ha == hash_seq_blocks(a, l));
    assert_int_equal(kvt_seq_len(a), 10);
    /* trim b back into the shared region and rewrite: donor still unchanged */
    assert_int_equal(kvt_seq_trim(b, 11), KVT_OK);
    fill(b, l, 3, &rng, 2000);
    assert_true(ha == hash_seq_blocks(a, l));
    /* writing to a (its tail is frozen) copies too; b keeps the old tail block */
    fill(a, l, 1, &rng, 0);
    assert_int_equal(kvt_seq_len(a), 11);
    kvt_seq_free(a);
    kvt_seq_free(b);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    assert_int_equal(kvt_block_pool_n_blocks(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

static void test_window_release_and_trim(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {full(F16), win(5, F16)};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    uint32_t gw = kvt_kv_layout_layer_group(l, 1), gf = kvt_kv_layout_layer_group(l, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t rng = 4;
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    fill(s, l, 8, &rng, 0);
    /* len 8, window 5: block 0 (last pos 3) is dropped iff 3 <= 8 - 5 */
    assert_null(kvt_seq_block(s, gw, 0));
    assert_non_null(kvt_seq_block(s, gw, 1));
    assert_non_null(kvt_seq_block(s, gf, 0));
    assert_true(kvt_seq_block_chain(s, 0) != 0); /* chain kept for dropped blocks */
    /* can_trim: next query at n sees (n-5, n): n=5 needs positions 1..4 (block 0, dropped) */
    assert_true(kvt_seq_can_trim(s, 8));
    assert_false(kvt_seq_can_trim(s, 7)); /* query at 7 needs 3..6; position 3 is in dropped block 0 */
    assert_false(kvt_seq_can_trim(s, 5));
    assert_true(kvt_seq_can_trim(s, 0));
    assert_false(kvt_seq_can_trim(s, 9));
    uint64_t h = hash_seq_blocks(s, l);
    assert_int_equal(kvt_seq_trim(s, 5), KVT_ERR_UNTRIMMABLE);
    assert_int_equal(kvt_seq_len(s), 8);
    assert_true(h == hash_seq_blocks(s, l));
    kvt_seq_free(s);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

/* kvt_seq_set_rollback (speculative decoding): a window sequence that keeps its blocks n tokens
 * longer can be cut back by up to n tokens from every length, over chunks of up to n + 1 tokens as
 * a verify pass commits them; without it some such cut is refused. */
static void test_window_rollback(void **st) {
    (void)st;
    kvt_layer_desc d[1] = {win(5, F16)};
    kvt_kv_layout *l = mk(d, 1, 4, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    enum { BACK = 3 };
    for (int keep = 0; keep < 2; keep++) {
        uint64_t rng = 9;
        kvt_seq *s;
        assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
        if (keep) kvt_seq_set_rollback(s, BACK);
        bool all = true;
        for (uint32_t step = 0; step < 12; step++) {
            const uint32_t before = kvt_seq_len(s);
            fill(s, l, BACK + 1, &rng, 0); /* a verify pass: next + BACK drafts */
            const uint32_t back = step % (BACK + 1); /* 0..BACK drafts rejected */
            const bool ok = kvt_seq_can_trim(s, kvt_seq_len(s) - back);
            all = all && ok;
            if (keep) {
                assert_true(ok);
                assert_int_equal(kvt_seq_trim(s, kvt_seq_len(s) - back), KVT_OK);
                assert_true(kvt_seq_len(s) > before);
            } else if (ok) {
                assert_int_equal(kvt_seq_trim(s, kvt_seq_len(s) - back), KVT_OK);
            } else {
                break;
            }
        }
        if (!keep) assert_false(all); /* the default drops a block some cut needs */
        /* what is held is at most one block per BACK tokens more than the window needs */
        uint32_t held = 0;
        for (uint32_t i = 0; i < kvt_seq_n_blocks(s); i++) held += kvt_seq_block(s, 0, i) != NULL;
        assert_true(held <= (5 + BACK + 2 * 4 - 2) / 4 + 1);
        kvt_seq_free(s);
    }
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

static void test_can_trim_exact(void **st) {
    (void)st;
    /* window 3, block 2, len 5: block 0 (pos 0,1) is dropped (1 <= 5-3), block 1 (2,3) is held. */
    kvt_layer_desc d[1] = {win(3, F16)};
    kvt_kv_layout *l = mk(d, 1, 2, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t rng = 5;
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    fill(s, l, 5, &rng, 0);
    assert_null(kvt_seq_block(s, 0, 0));
    assert_non_null(kvt_seq_block(s, 0, 1));
    assert_true(kvt_seq_can_trim(s, 4));  /* query at 4 sees 2..4: positions 2,3 held */
    assert_false(kvt_seq_can_trim(s, 3)); /* query at 3 needs 1,2: position 1 dropped */
    assert_int_equal(kvt_seq_trim(s, 3), KVT_ERR_UNTRIMMABLE);
    assert_int_equal(kvt_seq_trim(s, 4), KVT_OK);
    assert_int_equal(kvt_seq_len(s), 4);
    assert_int_equal(kvt_seq_n_blocks(s), 2);
    fill(s, l, 3, &rng, 50); /* continues after the cut at a block boundary */
    assert_int_equal(kvt_seq_len(s), 7);
    assert_null(kvt_seq_block(s, 0, 1)); /* 3 <= 7-3: dropped again */
    kvt_seq_free(s);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

static void test_prepare_exhaustion_no_partial_state(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {full(F16), win(64, F16)};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    const size_t bb = kvt_kv_layout_block_bytes(l, 0, 0) + kvt_kv_layout_block_bytes(l, 1, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 3 * bb);
    uint64_t rng = 6;
    kvt_seq *s, *c;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    fill(s, l, 6, &rng, 0); /* 2 blocks per group */
    assert_int_equal(kvt_seq_clone(s, &c), KVT_OK);
    uint64_t used = kvt_block_pool_used_bytes(p), h = hash_seq_blocks(c, l);
    /* 10 more tokens need the COW tail (2 blocks) + 2 new indices (4 blocks) > 1 group-pair left */
    assert_int_equal(kvt_seq_prepare(c, 10), KVT_ERR_POOL_EXHAUSTED);
    assert_int_equal(kvt_block_pool_used_bytes(p), used);
    assert_int_equal(kvt_seq_len(c), 6);
    assert_int_equal(kvt_seq_n_blocks(c), 2);
    assert_true(h == hash_seq_blocks(c, l));
    assert_true(kvt_block_sealed(kvt_seq_block(c, 0, 1))); /* still the shared frozen tail */
    assert_int_equal(kvt_seq_prepare(c, 2), KVT_OK);       /* COW of the tail fits */
    kvt_seq_free(s);
    kvt_seq_free(c);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

static void test_append_blocks(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {full(F16), win(5, F16)};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t rng = 8;
    kvt_seq *a, *b;
    assert_int_equal(kvt_seq_create(p, 77, &a), KVT_OK);
    fill(a, l, 14, &rng, 0);
    assert_int_equal(kvt_seq_freeze_tail(a), KVT_OK);
    uint64_t ha = hash_seq_blocks(a, l);
    assert_int_equal(kvt_seq_create(p, 77, &b), KVT_OK);
    kvt_block *blk[2];
    /* wrong index first */
    blk[0] = kvt_seq_block(a, 0, 1);
    blk[1] = kvt_seq_block(a, 1, 1);
    assert_int_equal(kvt_seq_append_blocks(b, blk), KVT_ERR_INVALID_ARG);
    /* FULL group may not be NULL */
    blk[0] = NULL;
    blk[1] = NULL;
    assert_int_equal(kvt_seq_append_blocks(b, blk), KVT_ERR_INVALID_ARG);
    for (uint32_t i = 0; i < 4; i++) {
        blk[0] = kvt_seq_block(a, 0, i);
        blk[1] = kvt_seq_block(a, 1, i); /* NULL for dropped window blocks */
        if (i == 0) assert_null(blk[1]);
        assert_int_equal(kvt_seq_append_blocks(b, blk), KVT_OK);
    }
    assert_int_equal(kvt_seq_len(b), 14);
    assert_memory_equal(kvt_seq_tokens(a), kvt_seq_tokens(b), 14 * 4);
    /* a frozen partial tail must be last */
    assert_int_equal(kvt_seq_append_blocks(b, blk), KVT_ERR_INVALID_ARG);
    /* wrong parent: a seq with another root */
    kvt_seq *c;
    assert_int_equal(kvt_seq_create(p, 78, &c), KVT_OK);
    blk[0] = kvt_seq_block(a, 0, 0);
    blk[1] = NULL;
    assert_int_equal(kvt_seq_append_blocks(c, blk), KVT_ERR_INVALID_ARG);
    /* unsealed block is refused */
    kvt_block *raw;
    assert_int_equal(kvt_block_alloc(p, 0, 0, &raw), KVT_OK);
    blk[0] = raw;
    assert_int_equal(kvt_seq_append_blocks(c, blk), KVT_ERR_INVALID_ARG);
    kvt_block_release(raw);
    kvt_seq_free(c);
    fill(b, l, 5, &rng, 500); /* continue: COW the appended frozen tail */
    assert_true(ha == hash_seq_blocks(a, l));
    assert_true(kvt_seq_block_chain(b, 2) == kvt_seq_block_chain(a, 2));
    kvt_seq_free(a);
    kvt_seq_free(b);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

/* Tiny synthetic recurrent layer: s = s*0.5 + x per token (4 floats of state). */
static void rec_step(kvt_seq *s, uint32_t layer, float x) {
    float st[4];
    memcpy(st, kvt_seq_state(s, layer), sizeof st);
    for (int i = 0; i < 4; i++) st[i] = st[i] * 0.5f + x * (float)(i + 1);
    memcpy(kvt_seq_state(s, layer), st, sizeof st);
}

static void test_recurrent_snapshot(void **st) {
    (void)st;
    kvt_layer_desc d[2] = {{.kind = KVT_KIND_RECURRENT, .state_bytes = 16}, full(F16)};
    kvt_kv_layout *l = mk(d, 2, 4, 0);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    uint64_t rng = 9;
    kvt_seq *s, *c;
    assert_int_equal(kvt_seq_create(p, 5, &s), KVT_OK);
    assert_null(kvt_seq_state(s, 1));
    for (int t = 0; t < 6; t++) {
        fill(s, l, 1, &rng, 0);
        rec_step(s, 0, (float)t);
    }
    kvt_snapshot *snap;
    assert_int_equal(kvt_seq_snapshot(s, &snap), KVT_OK);
    assert_int_equal(kvt_snapshot_pos(snap), 6);
    float ref[4];
    memcpy(ref, kvt_seq_state(s, 0), 16);
    assert_memory_equal(kvt_snapshot_data(snap), ref, 16);
    assert_false(kvt_seq_can_trim(s, 5));
    assert_true(kvt_seq_can_trim(s, 6));
    assert_int_equal(kvt_seq_trim(s, 3), KVT_ERR_UNTRIMMABLE);
    assert_int_equal(kvt_seq_clone(s, &c), KVT_OK);
    assert_memory_equal(kvt_seq_state(c, 0), ref, 16); /* clone copies state */
    rec_step(c, 0, 100.0f);
    assert_memory_equal(kvt_seq_state(s, 0), ref, 16); /* ... not shares it */
    memset(kvt_seq_state(c, 0), 0, 16);
    assert_int_equal(kvt_seq_restore_snapshot(c, snap), KVT_OK);
    assert_memory_equal(kvt_seq_state(c, 0), ref, 16);
    fill(s, l, 1, &rng, 0);
    rec_step(s, 0, 6.0f);
    assert_int_equal(kvt_seq_restore_snapshot(s, snap), KVT_ERR_INVALID_ARG); /* pos mismatch */
    /* continuing from the snapshot reproduces the uninterrupted state bit-exactly */
    fill(c, l, 1, &rng, 0);
    rec_step(c, 0, 6.0f);
    assert_memory_equal(kvt_seq_state(c, 0), kvt_seq_state(s, 0), 16);
    /* same position, different tokens: chain mismatch */
    kvt_seq *o;
    assert_int_equal(kvt_seq_create(p, 5, &o), KVT_OK);
    fill(o, l, 6, &rng, 1000);
    assert_int_equal(kvt_seq_restore_snapshot(o, snap), KVT_ERR_INVALID_ARG);
    kvt_snapshot_retain(snap);
    kvt_snapshot_release(snap);
    kvt_snapshot_release(snap);
    kvt_seq_free(o);
    kvt_seq_free(c);
    kvt_seq_free(s);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

/* Section layout is [kv_head][token]: the rows write_kv stores for (token t, head h) are found at
 * kvt_kv_layout_row_offset = section + (h*bt + t)*row_bytes in the raw payload, for both variants,
 * and sections do not overlap. */
static void test_row_layout_raw(void **st) {
    (void)st;
    enum { BT = 8, NKV = 3, HD = 64, NTOK = 24 };
    kvt_layer_desc d[2];
    for (int i = 0; i < 2; i++)
        d[i] = (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = NKV, .head_dim_k = HD, .head_dim_v = HD,
                                .codec = {.kind = KVT_CODEC_AFFINE, .bits = 8, .group_size = 64}};
    kvt_kv_layout *l;
    char err[128];
    assert_int_equal(kvt_kv_layout_create(d, 2, BT, (kvt_codec){.kind = KVT_CODEC_F16}, 8, &l, err, sizeof err), KVT_OK);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    assert_int_equal(kvt_seq_prepare(s, NTOK), KVT_OK);
    static float kv[2][NTOK][2][NKV * HD];
    uint64_t rng = 99;
    for (uint32_t t = 0; t < NTOK; t++)
        for (uint32_t li = 0; li < 2; li++) {
            for (int x = 0; x < 2; x++)
                for (int i = 0; i < NKV * HD; i++) kv[li][t][x][i] = tu_randf(&rng);
            kvt_seq_write_kv(s, li, t, kv[li][t][0], kv[li][t][1]);
        }
    int32_t toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = i + 5;
    assert_int_equal(kvt_seq_commit(s, toks, NTOK), KVT_OK);
    uint8_t enc[256];
    for (uint32_t t = 0; t < NTOK; t++) {
        const uint32_t bi = t / BT;
        const uint8_t *data = kvt_block_data(kvt_seq_block(s, 0, bi));
        for (uint32_t li = 0; li < 2; li++)
            for (int x = 0; x < 2; x++) {
                const size_t rb = kvt_kv_layout_row_bytes(l, li, bi, x);
                const kvt_codec c = kvt_kv_layout_codec_at(l, li, bi);
                for (uint32_t h = 0; h < NKV; h++) {
                    size_t off = kvt_kv_layout_row_offset(l, li, bi, x, t % BT, h);
                    assert_int_equal(off, kvt_kv_layout_section_offset(l, li, bi, x) + ((size_t)h * BT + t % BT) * rb);
                    assert_true(off + rb <= kvt_kv_layout_block_bytes(l, 0, bi));
                    kvt_codec_encode_row(c, kv[li][t][x] + h * HD, HD, enc);
                    assert_memory_equal(data + off, enc, rb);
                }
            }
    }
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}


/* MLA latent layers: one K section of [c | k_pe] rows, no V section, exact bytes per token
 * (DeepSeek-V2-Lite's shape: 512 + 64 = 576 values per layer), bad shapes rejected, and a
 * sequence of latent rows writes, seals, clones and trims like FULL. */
static void test_layout_mla(void **st) {
    (void)st;
    kvt_layer_desc d[27];
    for (int i = 0; i < 27; i++)
        d[i] = (kvt_layer_desc){.kind = KVT_KIND_MLA, .n_kv_heads = 1, .head_dim_k = 576, .head_dim_v = 512, .codec = F16};
    kvt_kv_layout *l = mk(d, 27, 16, 0);
    assert_true(kvt_kv_layout_layer_bytes_per_token(l, 0) == 576 * 2);
    assert_true(kvt_kv_layout_bytes_per_token(l) == 27 * 576 * 2);
    assert_int_equal(kvt_kv_layout_row_bytes(l, 3, 0, 1), 0);
    assert_int_equal(kvt_kv_layout_n_groups(l), 1);
    char key[128];
    kvt_kv_layout_key(l, key, sizeof key);
    assert_string_equal(key, "bt16-f16-mla");
    /* latent rows survive the block walk: write 40 tokens, clone, trim mid-block */
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s = NULL, *c = NULL;
    assert_int_equal(kvt_seq_create(p, 7, &s), KVT_OK);
    assert_int_equal(kvt_seq_prepare(s, 40), KVT_OK);
    float row[576];
    int32_t tok[40];
    for (uint32_t t = 0; t < 40; t++) {
        tok[t] = (int32_t)t;
        for (int i = 0; i < 576; i++) row[i] = (float)(t * 576 + i) / 1024.0f;
        for (uint32_t il = 0; il < 27; il++) kvt_seq_write_kv(s, il, t, row, NULL);
    }
    assert_int_equal(kvt_seq_commit(s, tok, 40), KVT_OK);
    assert_int_equal(kvt_block_data_bytes(kvt_seq_block(s, 0, 0)), kvt_kv_layout_block_bytes(l, 0, 0));
    assert_int_equal(kvt_seq_clone(s, &c), KVT_OK);
    assert_true(kvt_seq_can_trim(c, 21));
    assert_int_equal(kvt_seq_trim(c, 21), KVT_OK);
    assert_int_equal(kvt_seq_len(c), 21);
    const uint8_t *b = kvt_block_data(kvt_seq_block(s, 0, 1));
    const size_t off = kvt_kv_layout_row_offset(l, 26, 1, 0, 3, 0); /* token 19, last layer */
    uint16_t h;
    memcpy(&h, b + off + 2 * 5, 2);
    assert_true(kvt_f16_to_f32(h) == kvt_f16_to_f32(kvt_f32_to_f16((float)(19 * 576 + 5) / 1024.0f)));
    kvt_seq_free(c);
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
    d[0].n_kv_heads = 2;
    expect_invalid(d, 1, 16, F16, "MLA");
    d[0].n_kv_heads = 1;
    d[0].head_dim_v = 576;
    expect_invalid(d, 1, 16, F16, "MLA");
}

/* kvt_seq_read_rows returns what write_kv stored, decoded (f16: the rounded value; affine: the
 * codec's decode of the row), for committed and prepared-but-uncommitted positions, K and V, any
 * head, across a block boundary; with quant_start the codec changes by block and still decodes. */
static void test_seq_read_rows(void **st) {
    (void)st;
    const kvt_layer_desc d[2] = {full(F16), full(aff(8, 32))};
    kvt_kv_layout *l = mk(d, 2, 16, 16); /* layer 1: f16 block 0, q8g32 from block 1 */
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    enum { N = 40, HD = 32, ROW = 2 * HD };
    static float k[N][ROW], v[N][ROW];
    uint64_t seed = 5;
    int32_t tok[N];
    for (int t = 0; t < N; t++) {
        tok[t] = t;
        for (int i = 0; i < ROW; i++) k[t][i] = tu_randf(&seed), v[t][i] = tu_randf(&seed);
    }
    assert_int_equal(kvt_seq_prepare(s, 30), KVT_OK);
    for (uint32_t il = 0; il < 2; il++)
        for (int t = 0; t < 30; t++) kvt_seq_write_kv(s, il, (uint32_t)t, k[t], v[t]);
    assert_int_equal(kvt_seq_commit(s, tok, 30), KVT_OK);
    assert_int_equal(kvt_seq_prepare(s, 10), KVT_OK); /* 30..39: written, not committed */
    for (uint32_t il = 0; il < 2; il++)
        for (int t = 30; t < N; t++) kvt_seq_write_kv(s, il, (uint32_t)t, k[t], v[t]);
    static float out[N][HD], want[HD];
    for (uint32_t il = 0; il < 2; il++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < 2; h++) {
                kvt_seq_read_rows(s, il, kv, h, 3, N, out[0], HD);
                for (int t = 3; t < N; t++) {
                    const kvt_codec c = kvt_codec_side(kvt_kv_layout_codec_at(l, il, (uint32_t)t / 16), kv);
                    uint8_t enc[256];
                    kvt_codec_encode_row(c, (kv ? v[t] : k[t]) + h * HD, HD, enc);
                    kvt_codec_decode_row(c, enc, HD, want);
                    assert_memory_equal(out[t - 3], want, sizeof want);
                }
            }
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_invalid),
        cmocka_unit_test(test_layout_mla),
        cmocka_unit_test(test_row_layout_raw),
        cmocka_unit_test(test_layout_groups_variants),
        cmocka_unit_test(test_layout_key),
        cmocka_unit_test(test_hashes),
        cmocka_unit_test(test_pool_budget_pressure),
        cmocka_unit_test(test_seq_commit_seal_chain),
        cmocka_unit_test(test_clone_cow_donor_unchanged),
        cmocka_unit_test(test_window_release_and_trim),
        cmocka_unit_test(test_can_trim_exact),
        cmocka_unit_test(test_window_rollback),
        cmocka_unit_test(test_prepare_exhaustion_no_partial_state),
        cmocka_unit_test(test_append_blocks),
        cmocka_unit_test(test_recurrent_snapshot),
        cmocka_unit_test(test_seq_read_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
