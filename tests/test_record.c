/* test_record.c — the self-checking record codec (src/cache/record.c) on its own, over a
 * kvt_record_fmt with no SSD tier behind it: block and compact-tail images of a layout with a
 * FULL and a WINDOW group round-trip bit-exactly per group, and every check refuses what it
 * must (another model, another group / index / identity, truncation, a flipped byte). */
#include "testutil.h"

#include "cache/record.h"

#define BT 16
#define COMPAT_A "record-test-a"
#define COMPAT_B "record-test-b"

/* layer 0: FULL, layer 1: WINDOW(32): two groups */
static kvt_kv_layout *make_layout(void) {
    kvt_layer_desc d[2];
    memset(d, 0, sizeof d);
    for (int i = 0; i < 2; i++) {
        d[i].kind = i ? KVT_KIND_WINDOW : KVT_KIND_FULL;
        d[i].window = i ? 32 : 0;
        d[i].n_kv_heads = 2;
        d[i].head_dim_k = 8;
        d[i].head_dim_v = 8;
        d[i].codec.kind = KVT_CODEC_F16;
    }
    kvt_codec base = {.kind = KVT_CODEC_F16};
    kvt_kv_layout *l = NULL;
    char err[256];
    assert_int_equal(kvt_kv_layout_create(d, 2, BT, base, 0, &l, err, sizeof err), KVT_OK);
    return l;
}

/* A sealed block of group g at index i with m tokens; rows [0, m) filled from seed, the rest 0. */
static kvt_block *make_block(kvt_block_pool *pool, const kvt_kv_layout *l, uint32_t g, uint32_t i, uint64_t parent,
                             const int32_t *tok, uint32_t m, uint64_t seed) {
    kvt_block *b = NULL;
    assert_int_equal(kvt_block_alloc(pool, g, i, &b), KVT_OK);
    uint8_t *d = kvt_block_data_mut(b);
    memset(d, 0, kvt_block_data_bytes(b));
    for (uint32_t li = 0; li < kvt_kv_layout_group_n_layers(l, g); li++) {
        const uint32_t layer = kvt_kv_layout_group_layer(l, g, li);
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t t = 0; t < m; t++)
                for (uint32_t h = 0; h < 2; h++) {
                    const size_t off = kvt_kv_layout_row_offset(l, layer, i, kv, t, h);
                    for (size_t k = 0; k < kvt_kv_layout_row_bytes(l, layer, i, kv); k++) d[off + k] = (uint8_t)tu_rand(&seed);
                }
    }
    assert_int_equal(kvt_block_seal(b, parent, tok, m, 0), KVT_OK);
    return b;
}

static void test_round_trip_per_group(void **state) {
    (void)state;
    kvt_kv_layout *l = make_layout();
    assert_int_equal(kvt_kv_layout_n_groups(l), 2);
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_record_fmt fa, fb;
    kvt_record_fmt_init(&fa, l, pool, COMPAT_A);
    kvt_record_fmt_init(&fb, l, pool, COMPAT_B);
    int32_t tok[BT];
    uint64_t s = 5;
    for (uint32_t t = 0; t < BT; t++) tok[t] = (int32_t)(tu_rand(&s) % 1000);
    const uint64_t root = kvt_root_hash(COMPAT_A, ""), parent = 0x1234567890abcdefull;
    char err[256];
    static const uint32_t ms[] = {BT, 5}; /* a full block, then a 5-token tail */
    for (uint32_t g = 0; g < 2; g++)
        for (uint32_t mi = 0; mi < 2; mi++) {
            const uint32_t m = ms[mi];
            const uint32_t kind = m == BT ? KVT_RECORD_BLOCK : KVT_RECORD_TAIL;
            kvt_block *b = make_block(pool, l, g, 3, parent, tok, m, 100 + g * 7 + m);
            uint8_t *buf = NULL;
            size_t len = 0;
            assert_int_equal(kvt_record_encode(&fa, b, root, &buf, &len), KVT_OK);
            assert_true(len <= kvt_record_max_bytes(&fa, kind));
            const uint64_t expect = kind == KVT_RECORD_BLOCK ? kvt_block_hash(b) : parent;
            kvt_block *out = NULL;
            assert_int_equal(kvt_record_decode(&fa, buf, len, kind, expect, g, 3, &out, err, sizeof err), KVT_OK);
            assert_int_equal(kvt_block_n_tokens(out), m);
            assert_int_equal(kvt_block_group(out), g);
            assert_int_equal(kvt_block_hash(out), kvt_block_hash(b));
            assert_memory_equal(kvt_block_data(out), kvt_block_data(b), kvt_block_data_bytes(b)); /* tail rows unpacked */
            kvt_block_release(out);
            /* another model, another group, index or identity: refused */
            assert_int_not_equal(kvt_record_decode(&fb, buf, len, kind, expect, g, 3, &out, err, sizeof err), KVT_OK);
            assert_int_not_equal(kvt_record_decode(&fa, buf, len, kind, expect, 1 - g, 3, &out, err, sizeof err), KVT_OK);
            assert_int_not_equal(kvt_record_decode(&fa, buf, len, kind, expect, g, 4, &out, err, sizeof err), KVT_OK);
            assert_int_not_equal(kvt_record_decode(&fa, buf, len, kind, expect ^ 1, g, 3, &out, err, sizeof err), KVT_OK);
            /* truncated, or one byte flipped in the header, the token ids or the payload */
            assert_int_not_equal(kvt_record_decode(&fa, buf, len - 1, kind, expect, g, 3, &out, err, sizeof err), KVT_OK);
            static const size_t offs[] = {8, 40, 130, 4096, 4100};
            for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
                if (offs[k] >= len) continue;
                buf[offs[k]] ^= 0x21;
                assert_int_not_equal(kvt_record_decode(&fa, buf, len, kind, expect, g, 3, &out, err, sizeof err), KVT_OK);
                buf[offs[k]] ^= 0x21;
            }
            /* the buffer is as it was: it still decodes */
            assert_int_equal(kvt_record_decode(&fa, buf, len, kind, expect, g, 3, &out, err, sizeof err), KVT_OK);
            kvt_block_release(out);
            free(buf);
            kvt_block_release(b);
        }
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
}

/* A compact tail is smaller than its block's image; snapshots need recurrent layers. */
static void test_tail_is_compact_and_snapshot_needs_state(void **state) {
    (void)state;
    kvt_kv_layout *l = make_layout();
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_record_fmt f;
    kvt_record_fmt_init(&f, l, pool, COMPAT_A);
    int32_t tok[BT] = {0};
    kvt_block *full = make_block(pool, l, 0, 0, 7, tok, BT, 1), *tail = make_block(pool, l, 0, 0, 7, tok, 2, 1);
    uint8_t *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    assert_int_equal(kvt_record_encode(&f, full, 7, &a, &la), KVT_OK);
    assert_int_equal(kvt_record_encode(&f, tail, 7, &b, &lb), KVT_OK);
    kvt_record_hdr ha, hb;
    char err[256];
    assert_int_equal(kvt_record_header_decode(a, get_u32(a + 12), la, &ha, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_record_header_decode(b, get_u32(b + 12), lb, &hb, err, sizeof err), KVT_OK);
    assert_true(kvt_record_section_at(&hb, 0).length < kvt_record_section_at(&ha, 0).length);
    assert_int_equal(kvt_record_check(&f, &hb, kvt_block_hash(tail), 0, KVT_RECORD_TAIL, err, sizeof err), KVT_OK);
    uint8_t st[64];
    assert_int_equal(kvt_record_snapshot_decode(&f, a, la, 1, 16, st, err, sizeof err), KVT_ERR_INVALID_ARG);
    free(a);
    free(b);
    kvt_block_release(full);
    kvt_block_release(tail);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_per_group),
        cmocka_unit_test(test_tail_is_compact_and_snapshot_needs_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
