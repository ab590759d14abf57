/* test_block_rows.c — the row-range walk over part of a KV block (src/cache/block_rows.c): the
 * ranges are exactly rows [0, m) of every layer, k/v and head, in increasing block order, and the
 * copy moves those bytes and no others. */
#include "testutil.h"

#include "cache/block_rows.h"

#define BT 8
#define HEADS 3

static kvt_kv_layout *mk_layout(void) {
    kvt_layer_desc d[2];
    memset(d, 0, sizeof(d));
    for (int i = 0; i < 2; i++) {
        d[i].kind = KVT_KIND_FULL;
        d[i].n_kv_heads = HEADS;
        d[i].head_dim_k = 8;
        d[i].head_dim_v = 4 * (i + 1);
        d[i].codec.kind = KVT_CODEC_F16;
    }
    kvt_codec base = {.kind = KVT_CODEC_F16};
    kvt_kv_layout *l = NULL;
    char err[128];
    assert_int_equal(kvt_kv_layout_create(d, 2, BT, base, 0, &l, err, sizeof(err)), KVT_OK);
    return l;
}

typedef struct walk_log {
    uint64_t last_end, n, total;
    bool ordered;
} walk_log;

static void log_range(void *ctx, uint64_t bo, uint64_t co, uint64_t len) {
    walk_log *w = ctx;
    if (bo < w->last_end || co != w->total) w->ordered = false;
    w->last_end = bo + len;
    w->total += len;
    w->n++;
}

/* Is byte `off` of the block inside rows [0, m) of some section? (by the layout's own offsets) */
static bool in_rows(const kvt_kv_layout *l, uint64_t off, uint32_t m) {
    for (uint32_t layer = 0; layer < 2; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < HEADS; h++) {
                uint64_t a = kvt_kv_layout_row_offset(l, layer, 0, kv, 0, h);
                if (off >= a && off < a + (uint64_t)m * kvt_kv_layout_row_bytes(l, layer, 0, kv)) return true;
            }
    return false;
}

static void test_walk_and_copy(void **state) {
    (void)state;
    kvt_kv_layout *l = mk_layout();
    const size_t bb = kvt_kv_layout_block_bytes(l, 0, 0);
    uint8_t *src = malloc(bb), *dst = malloc(bb);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < bb; i++) src[i] = (uint8_t)(i * 31 + 7) | 1u; /* never 0 */
    for (uint32_t m = 0; m <= BT; m++) {
        walk_log w = {.ordered = true};
        uint64_t total = kvt_block_rows_walk(l, 0, 0, m, log_range, &w);
        uint64_t want = 0;
        for (uint32_t layer = 0; layer < 2; layer++)
            for (int kv = 0; kv < 2; kv++) want += (uint64_t)HEADS * m * kvt_kv_layout_row_bytes(l, layer, 0, kv);
        assert_int_equal(total, want);
        assert_int_equal(w.total, want);
        assert_true(w.ordered);
        assert_int_equal(w.n, m ? 2 * 2 * HEADS : 0);
        assert_int_equal(kvt_block_rows_walk(l, 0, 0, m, NULL, NULL), want);
        memset(dst, 0, bb);
        kvt_block_rows_copy(l, 0, 0, m, src, dst);
        for (size_t i = 0; i < bb; i++) assert_int_equal(dst[i], in_rows(l, i, m) ? src[i] : 0);
    }
    assert_int_equal(kvt_block_rows_walk(l, 0, 0, BT, NULL, NULL), bb); /* a full block: every byte */
    free(src);
    free(dst);
    kvt_kv_layout_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_walk_and_copy)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
