/* test_stop.c — stop strings over streamed text (engine/stop.h): a match reaching into the new text
 * is found (also one that began in earlier text), the earliest of several strings wins, the hold
 * back is the longest proper prefix at the end, empty strings never match, and streaming a text one
 * byte at a time emits exactly what precedes the first stop string. */
#include "testutil.h"

#include "engine/stop.h"

static kvt_strbuf text(const char *s) {
    kvt_strbuf t = {0};
    kvt_strbuf_add(&t, s, strlen(s));
    return t;
}

static void test_find(void **state) {
    (void)state;
    const char *stop[] = {"END", "<|im_end|>"};
    size_t ml = 0;
    kvt_strbuf t = text("hello END there");
    assert_int_equal(kvt_stop_find(&t, stop, 2, 0, &ml), 6);
    assert_int_equal(ml, 3);
    /* the match began before `from` (earlier tokens) and ends in the new text */
    assert_int_equal(kvt_stop_find(&t, stop, 2, 8, &ml), 6);
    /* a match wholly before from - len is not looked at again */
    assert_int_equal(kvt_stop_find(&t, stop, 2, 12, &ml), -1);
    kvt_strbuf_free(&t);
    /* the earliest match of any string wins, whatever the order of the strings */
    t = text("a<|im_end|>b END");
    ml = 0;
    assert_int_equal(kvt_stop_find(&t, stop, 2, 0, &ml), 1);
    assert_int_equal(ml, 10);
    kvt_strbuf_free(&t);
    t = text("no stop here");
    assert_int_equal(kvt_stop_find(&t, stop, 2, 0, &ml), -1);
    kvt_strbuf_free(&t);
}

static void test_holdback(void **state) {
    (void)state;
    const char *stop[] = {"<|im_end|>", "STOP"};
    kvt_strbuf t = text("text <|im_e");
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 6);
    kvt_strbuf_free(&t);
    t = text("xST"); /* the longest prefix of any string */
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 2);
    kvt_strbuf_free(&t);
    t = text("plain");
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 0);
    kvt_strbuf_free(&t);
    t = text("<"); /* text shorter than the string */
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 1);
    kvt_strbuf_free(&t);
    t = text("a STOP"); /* a full match is find's business, not a prefix to hold */
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 0);
    kvt_strbuf_free(&t);
}

static void test_empty_strings(void **state) {
    (void)state;
    const char *stop[] = {"", "Z"};
    size_t ml = 7;
    kvt_strbuf t = text("abc");
    assert_int_equal(kvt_stop_find(&t, stop, 2, 0, &ml), -1);
    assert_int_equal(ml, 7);
    assert_int_equal(kvt_stop_holdback(&t, stop, 2), 0);
    kvt_strbuf_free(&t);
}

/* The row's loop (row.c, sample): append a token's text, stop at a match, else emit up to the hold
 * back. One byte per token: a stop string split over many tokens. */
static void stream(const char *in, const char *const *stop, uint32_t n_stop, const char *want, bool want_hit) {
    kvt_strbuf t = {0}, out = {0};
    size_t emitted = 0;
    bool hit = false;
    for (size_t i = 0; in[i] && !hit; i++) {
        size_t before = t.n, ml = 0, upto;
        kvt_strbuf_add(&t, in + i, 1);
        int64_t at = kvt_stop_find(&t, stop, n_stop, before, &ml);
        if (at >= 0) {
            upto = (size_t)at;
            hit = true;
        } else {
            upto = t.n - kvt_stop_holdback(&t, stop, n_stop);
        }
        assert_true(upto >= emitted);
        kvt_strbuf_add(&out, t.p + emitted, upto - emitted);
        emitted = upto;
    }
    if (!hit) kvt_strbuf_add(&out, t.p + emitted, t.n - emitted); /* end of generation: flush */
    assert_int_equal(hit, want_hit);
    assert_int_equal(out.n, strlen(want));
    assert_memory_equal(out.p, want, out.n);
    kvt_strbuf_free(&t);
    kvt_strbuf_free(&out);
}

static void test_streaming(void **state) {
    (void)state;
    const char *stop[] = {"</s>", "\n\nUser:"};
    stream("The answer is 42.</s>ignored", stop, 2, "The answer is 42.", true);
    stream("a\n\nUse it\n\nUser: hi", stop, 2, "a\n\nUse it", true);
    stream("<</ s></", stop, 2, "<</ s></", false); /* near misses and a held tail are all emitted */
    stream("", stop, 2, "", false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_holdback),
        cmocka_unit_test(test_empty_strings),
        cmocka_unit_test(test_streaming),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
