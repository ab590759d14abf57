/* test_plan.c — the shared usable-prefix planner and supersession rule (src/cache/plan.c) over a
 * fake index: n-1 cap, window rule, recurrent-snapshot rule, token-carrier rule, supersession. */
#include "testutil.h"

#include "cache/plan.h"

#define BT 4

/* A fake tier index: held[i] = group mask of path block i; rows_max[j] = the longest m for which a
 * unit at index j holding every group matches the prompt (0 = none). */
typedef struct fake {
    uint32_t held[32];
    uint32_t rows_max[33];
    int unit_id[33]; /* handle returned by rows */
} fake;

static uint32_t f_held(void *ctx, uint32_t i) { return ((fake *)ctx)->held[i]; }
static const void *f_rows(void *ctx, uint32_t j, uint32_t m) {
    fake *f = ctx;
    return m <= f->rows_max[j] ? &f->unit_id[j] : NULL;
}

static kvt_plan_geom geom(uint32_t n_groups, uint32_t w1, bool recurrent) {
    kvt_plan_geom g;
    memset(&g, 0, sizeof g);
    g.bt = BT;
    g.n_groups = n_groups;
    if (n_groups > 1) g.window[1] = w1;
    g.recurrent = recurrent;
    return g;
}

/* k full path blocks held in `mask` with full units, plus a child at k matching `child` tokens. */
static void fake_path(fake *f, uint32_t k, uint32_t mask, uint32_t child, kvt_plan_index *ix) {
    memset(f, 0, sizeof *f);
    for (uint32_t i = 0; i < k; i++) {
        f->held[i] = mask;
        f->rows_max[i] = BT;
    }
    f->rows_max[k] = child;
    memset(ix, 0, sizeof *ix);
    ix->ctx = f;
    ix->k = k;
    ix->match = k * BT + child;
    ix->held = f_held;
    ix->rows = f_rows;
}

static void test_full_cap(void **st) {
    (void)st;
    kvt_plan_geom g = geom(1, 0, false);
    fake f;
    kvt_plan_index ix;
    kvt_plan_prefix p;
    fake_path(&f, 3, 1, 2, &ix);
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 14);
    assert_int_equal(p.n_full, 3);
    assert_int_equal(p.last_m, 2);
    assert_ptr_equal(p.last, &f.unit_id[3]);
    /* the whole prompt cached: at most n-1 (one token left for the logits), cut inside block 3 */
    kvt_plan_usable_prefix(&g, &ix, 14, &p);
    assert_int_equal(p.len, 13);
    assert_int_equal(p.match, 13);
    /* n-1 at a block boundary: the last block is path block 2, kept whole */
    kvt_plan_usable_prefix(&g, &ix, 13, &p);
    assert_int_equal(p.len, 12);
    assert_int_equal(p.n_full, 2);
    assert_int_equal(p.last_m, 4);
    assert_ptr_equal(p.last, &f.unit_id[2]);
    /* too short a prompt, or nothing matched */
    kvt_plan_usable_prefix(&g, &ix, 1, &p);
    assert_int_equal(p.len, 0);
    fake_path(&f, 0, 1, 0, &ix);
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 0);
    /* a FULL block missing in the path caps the prefix at the last block that is whole */
    fake_path(&f, 5, 1, 0, &ix);
    f.held[2] = 0;
    f.rows_max[2] = 0;
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 8);
    assert_int_equal(p.match, 20);
}

/* WINDOW groups need only the blocks the final window sees; a shorter cut at a block boundary can
 * succeed when the longest one needs an old dropped block. */
static void test_window_rule(void **st) {
    (void)st;
    kvt_plan_geom g = geom(2, 8, false);
    fake f;
    kvt_plan_index ix;
    kvt_plan_prefix p;
    fake_path(&f, 6, 3, 2, &ix);
    for (uint32_t i = 0; i < 4; i++) { /* window blocks 0..3 dropped (outside the window of 26) */
        f.held[i] = 1;
        f.rows_max[i] = 0; /* a unit must hold every group to end a prefix */
    }
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 26);
    assert_int_equal(kvt_plan_window_lo(26, 8, BT), 4);
    /* block 4's window half missing: 26 needs it; no boundary works either (each needs 3 or 4) */
    f.held[4] = 1;
    f.rows_max[4] = 0;
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 0);
    assert_int_equal(p.match, 26);
    /* only block 1's window half missing: 10 needs it, 8 ends in block 1, 4 works */
    fake_path(&f, 2, 3, 2, &ix);
    f.held[1] = 1;
    f.rows_max[1] = 0;
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 4);
    assert_ptr_equal(p.last, &f.unit_id[0]);
}

/* Recurrent layouts resume only at snapshot positions, longest usable first. */
static void test_recurrent_rule(void **st) {
    (void)st;
    kvt_plan_geom g = geom(1, 0, true);
    fake f;
    kvt_plan_index ix;
    kvt_plan_prefix p;
    fake_path(&f, 3, 1, 2, &ix);
    int s_a, s_b, s_c, s_d, s_e;
    uint32_t pos[] = {0, 8, 13, 4, 15};
    const void *h[] = {&s_a, &s_b, &s_c, &s_d, &s_e};
    ix.snap_pos = pos;
    ix.snap = h;
    ix.n_snaps = 5;
    kvt_plan_usable_prefix(&g, &ix, 40, &p); /* 15 > match: unusable; 13 ends in block 3 (child 2 tokens) */
    assert_int_equal(p.len, 13);
    assert_ptr_equal(p.snap, &s_c);
    assert_int_equal(p.last_m, 1);
    f.rows_max[3] = 0; /* no unit at index 3: 13 cannot be built */
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 8);
    assert_ptr_equal(p.snap, &s_b);
    ix.n_snaps = 1; /* only the position-0 one: never usable */
    kvt_plan_usable_prefix(&g, &ix, 40, &p);
    assert_int_equal(p.len, 0);
    assert_null(p.snap);
    /* a match of the whole prompt but the only snapshot is at n: the n-1 cap wins, no cut */
    fake_path(&f, 3, 1, 0, &ix);
    uint32_t pos2[] = {12};
    ix.snap_pos = pos2;
    ix.snap = h;
    ix.n_snaps = 1;
    kvt_plan_usable_prefix(&g, &ix, 12, &p);
    assert_int_equal(p.len, 0);
    kvt_plan_usable_prefix(&g, &ix, 13, &p);
    assert_int_equal(p.len, 12);
}

/* A layout of WINDOW groups only: an index that no group holds cannot be rebuilt (its tokens are
 * nowhere), even where no window needs it. */
static void test_token_carrier(void **st) {
    (void)st;
    kvt_plan_geom g = geom(1, 0, false);
    g.window[0] = 4;
    fake f;
    kvt_plan_index ix;
    kvt_plan_prefix p;
    fake_path(&f, 4, 1, 0, &ix);
    kvt_plan_usable_prefix(&g, &ix, 17, &p);
    assert_int_equal(p.len, 16);
    f.held[0] = 0;
    f.rows_max[0] = 0;
    kvt_plan_usable_prefix(&g, &ix, 17, &p);
    assert_int_equal(p.len, 0);
    /* need masks: outside the window only the lowest held group carries the tokens */
    kvt_plan_geom g2 = geom(2, 8, false);
    assert_int_equal(kvt_plan_need_mask(&g2, 40, 0, 3), 1); /* window group not needed at 40 */
    assert_int_equal(kvt_plan_need_mask(&g2, 40, 8, 3), 3);
    assert_int_equal(kvt_plan_need_mask(&g2, 40, 0, 0), 0);
    assert_int_equal(kvt_plan_need_mask(&g, 16, 0, 1), 1); /* carrier */
    assert_int_equal(kvt_plan_need_mask(&g, 16, 3, 1), 1);
}

static void test_supersedes(void **st) {
    (void)st;
    int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9, 4};
    kvt_plan_unit t = {.parent = 7, .index = 2, .n_tokens = 2, .tokens = a, .groups = 3, .tail = true};
    kvt_plan_unit c = {.parent = 7, .index = 2, .n_tokens = 3, .tokens = a, .groups = 3, .tail = true};
    assert_true(kvt_plan_supersedes(&t, &c));
    assert_false(kvt_plan_supersedes(&c, &t)); /* never by a shorter one */
    assert_false(kvt_plan_supersedes(&t, &t));
    kvt_plan_unit full = {.parent = 7, .index = 2, .n_tokens = 4, .tokens = a, .groups = 3, .tail = false};
    assert_true(kvt_plan_supersedes(&t, &full));
    assert_false(kvt_plan_supersedes(&full, &t)); /* full blocks are never superseded */
    kvt_plan_unit x = c;
    x.parent = 8;
    assert_false(kvt_plan_supersedes(&t, &x));
    x = c;
    x.index = 3;
    assert_false(kvt_plan_supersedes(&t, &x));
    x = c;
    x.tokens = b;
    assert_true(kvt_plan_supersedes(&t, &x)); /* only the first 2 tokens matter */
    t.n_tokens = 3;
    x.n_tokens = 4;
    assert_false(kvt_plan_supersedes(&t, &x)); /* tokens differ inside t */
    t.n_tokens = 2;
    x = c;
    x.groups = 1; /* the newer unit lacks a group the older one is held in */
    assert_false(kvt_plan_supersedes(&t, &x));
    t.groups = 1;
    assert_true(kvt_plan_supersedes(&t, &x));
    t.pinned = true; /* the tier finds something through it (an SSD mid-block snapshot) */
    assert_false(kvt_plan_supersedes(&t, &x));
    t.pinned = false;
    t.groups = 0;
    assert_false(kvt_plan_supersedes(&t, &x));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_cap),      cmocka_unit_test(test_window_rule), cmocka_unit_test(test_recurrent_rule),
        cmocka_unit_test(test_token_carrier), cmocka_unit_test(test_supersedes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
