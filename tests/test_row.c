/* test_row.c — the row state machine (engine/row.c): every transition that is not drawn is refused
 * (the state stays, the row's status and message say which), the six drawn ones are taken, DONE is
 * final. The phases themselves run in test_engine and test_sched. */
#include "testutil.h"

#include "engine/row.h"

static const kvt_row_state all[KVT_ROW_N_STATES] = {KVT_ROW_QUEUED, KVT_ROW_PREFILL, KVT_ROW_DECODE, KVT_ROW_DONE};

/* The drawn transitions (row.c, invariant 1), written out independently of the implementation. */
static bool drawn(kvt_row_state a, kvt_row_state b) {
    return (a == KVT_ROW_QUEUED && (b == KVT_ROW_PREFILL || b == KVT_ROW_DONE)) ||
           (a == KVT_ROW_PREFILL && (b == KVT_ROW_DECODE || b == KVT_ROW_DONE)) ||
           (a == KVT_ROW_DECODE && (b == KVT_ROW_DECODE || b == KVT_ROW_DONE));
}

static void test_every_pair(void **state) {
    (void)state;
    unsigned legal = 0, illegal = 0;
    for (unsigned i = 0; i < KVT_ROW_N_STATES; i++)
        for (unsigned j = 0; j < KVT_ROW_N_STATES; j++) {
            kvt_row r;
            memset(&r, 0, sizeof r);
            char err[128] = "";
            r.err = err;
            r.errlen = sizeof err;
            r.state = all[i]; /* fixture: the state under test */
            const bool ok = kvt_row_set_state(&r, all[j]);
            assert_int_equal(kvt_row_transition_legal(all[i], all[j]), drawn(all[i], all[j]));
            if (drawn(all[i], all[j])) {
                legal++;
                assert_true(ok);
                assert_int_equal(r.state, all[j]);
                assert_int_equal(r.st, KVT_OK);
                assert_string_equal(err, "");
            } else {
                illegal++;
                assert_false(ok);
                assert_int_equal(r.state, all[i]); /* refused: the state stays */
                assert_int_equal(r.st, KVT_ERR_INVALID_ARG);
                char want[64];
                snprintf(want, sizeof want, "%s -> %s", kvt_row_state_name(all[i]), kvt_row_state_name(all[j]));
                assert_non_null(strstr(err, want));
            }
        }
    assert_int_equal(legal, 6);
    assert_int_equal(illegal, 10);
}

/* A refused transition keeps the first error: a row that already failed reports that failure. */
static void test_refusal_keeps_first_error(void **state) {
    (void)state;
    kvt_row r;
    memset(&r, 0, sizeof r);
    char err[128] = "prefill failed";
    r.err = err;
    r.errlen = sizeof err;
    r.state = KVT_ROW_DONE;
    r.st = KVT_ERR_IO;
    assert_false(kvt_row_set_state(&r, KVT_ROW_DECODE));
    assert_int_equal(r.state, KVT_ROW_DONE);
    assert_int_equal(r.st, KVT_ERR_IO);
    assert_string_equal(err, "prefill failed");
}

/* A value outside the enum is never a legal source or target. */
static void test_out_of_range(void **state) {
    (void)state;
    for (unsigned i = 0; i < KVT_ROW_N_STATES; i++) {
        assert_false(kvt_row_transition_legal(all[i], KVT_ROW_N_STATES));
        assert_false(kvt_row_transition_legal(KVT_ROW_N_STATES, all[i]));
    }
    assert_string_equal(kvt_row_state_name(KVT_ROW_N_STATES), "?");
}

/* A full life along the drawn edges, as the phases take it. */
static void test_life(void **state) {
    (void)state;
    kvt_row r;
    memset(&r, 0, sizeof r);
    assert_true(kvt_row_set_state(&r, KVT_ROW_PREFILL));
    assert_true(kvt_row_set_state(&r, KVT_ROW_DECODE));
    for (int i = 0; i < 3; i++) assert_true(kvt_row_set_state(&r, KVT_ROW_DECODE));
    assert_true(kvt_row_set_state(&r, KVT_ROW_DONE));
    assert_int_equal(r.st, KVT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_pair),
        cmocka_unit_test(test_refusal_keeps_first_error),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_life),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
