/* test_strbuf.c — kvt_strbuf: growth, printf, take/free, embedded NULs and the sticky oom flag. */
#include "testutil.h"

#include <stdint.h>

#include "util/common.h"
#include "util/strbuf.h"

/* Checks the invariants every non-failed buffer keeps after an append. */
static void check_invariants(const kvt_strbuf *b) {
    assert_false(b->oom);
    assert_non_null(b->p);
    assert_true(b->n < b->cap);
    assert_int_equal(b->p[b->n], 0);
}

static void test_empty(void **state) {
    (void)state;
    kvt_strbuf b = {0};
    size_t len = 99;
    char *s = kvt_strbuf_take(&b, &len);
    assert_non_null(s); /* "" even though nothing was appended */
    assert_string_equal(s, "");
    assert_int_equal(len, 0);
    free(s);
    /* appending zero bytes allocates and terminates */
    kvt_strbuf_add(&b, NULL, 0);
    check_invariants(&b);
    assert_int_equal(b.n, 0);
    kvt_strbuf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.n, 0);
    assert_int_equal(b.cap, 0);
    kvt_strbuf_free(&b); /* twice is fine */
}

/* Random chunk sizes cross many growth boundaries; the contents must match a reference copy. */
static void test_add_growth(void **state) {
    (void)state;
    enum { TOTAL = 200000 };
    char *ref = malloc(TOTAL + 1024);
    char chunk[1024];
    assert_non_null(ref);
    uint64_t seed = 12345;
    kvt_strbuf b = {0};
    size_t n = 0, last_cap = 0, n_grow = 0;
    while (n < TOTAL) {
        size_t k = tu_rand(&seed) % 700;
        if (tu_rand(&seed) % 8 == 0) k = 0;
        for (size_t i = 0; i < k; i++) chunk[i] = (char)('a' + tu_rand(&seed) % 26);
        memcpy(ref + n, chunk, k);
        n += k;
        kvt_strbuf_add(&b, chunk, k);
        check_invariants(&b);
        assert_int_equal(b.n, n);
        if (b.cap != last_cap) n_grow++;
        last_cap = b.cap;
    }
    assert_true(n_grow >= 5);
    assert_memory_equal(b.p, ref, n);
    /* exact fills: append so that n + 1 == cap, then one more byte */
    kvt_strbuf_free(&b);
    kvt_strbuf_add(&b, "", 0);
    size_t cap = b.cap;
    memset(ref, 'x', cap);
    kvt_strbuf_add(&b, ref, cap - 1);
    check_invariants(&b);
    assert_int_equal(b.cap, cap);
    kvt_strbuf_addstr(&b, "y");
    check_invariants(&b);
    assert_true(b.cap > cap);
    assert_int_equal(b.n, cap);
    assert_int_equal(b.p[cap - 1], 'y');
    assert_int_equal(strspn(b.p, "x"), cap - 1);
    kvt_strbuf_free(&b);
    free(ref);
}

/* printf output of every length around the free space, compared with snprintf. */
static void test_printf(void **state) {
    (void)state;
    enum { MAXS = 3000 };
    char *pad = malloc(MAXS + 1), *ref = malloc(1 << 22), one[MAXS + 64];
    assert_non_null(pad);
    assert_non_null(ref);
    memset(pad, 'p', MAXS);
    pad[MAXS] = 0;
    uint64_t seed = 777;
    kvt_strbuf b = {0};
    size_t n = 0;
    for (int it = 0; it < 2000; it++) {
        int w = (int)(tu_rand(&seed) % MAXS);
        int v = (int)(tu_rand(&seed) % 100000) - 50000;
        int k = snprintf(one, sizeof one, "[%.*s|%d]", w, pad, v);
        kvt_strbuf_printf(&b, "[%.*s|%d]", w, pad, v);
        check_invariants(&b);
        memcpy(ref + n, one, (size_t)k);
        n += (size_t)k;
        assert_int_equal(b.n, n);
    }
    assert_memory_equal(b.p, ref, n);
    /* land exactly on the room boundary: output of room - 1 bytes fits, room bytes must grow */
    for (int extra = 0; extra <= 1; extra++) {
        kvt_strbuf_free(&b);
        kvt_strbuf_add(&b, "", 0);
        size_t room = b.cap - b.n;
        int w = (int)(room - 1) + extra;
        kvt_strbuf_printf(&b, "%.*s", w, pad);
        check_invariants(&b);
        assert_int_equal(b.n, (size_t)w);
        assert_int_equal(strspn(b.p, "p"), (size_t)w);
    }
    /* one long formatted line, larger than the initial capacity many times over */
    kvt_strbuf_free(&b);
    kvt_strbuf_printf(&b, "%s%s%s", pad, pad, pad);
    check_invariants(&b);
    assert_int_equal(b.n, 3 * MAXS);
    kvt_strbuf_free(&b);
    free(pad);
    free(ref);
}

static void test_embedded_nul(void **state) {
    (void)state;
    kvt_strbuf b = {0};
    kvt_strbuf_add(&b, "a\0b", 3);
    kvt_strbuf_printf(&b, "%c%c", 0, 'c');
    kvt_strbuf_addstr(&b, "d\0ignored");
    check_invariants(&b);
    assert_int_equal(b.n, 6);
    assert_memory_equal(b.p, "a\0b\0cd", 7);
    size_t len = 0;
    char *s = kvt_strbuf_take(&b, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(s, "a\0b\0cd", 7);
    free(s);
}

static void test_take_resets(void **state) {
    (void)state;
    kvt_strbuf b = {0};
    kvt_strbuf_addstr(&b, "hello ");
    kvt_strbuf_printf(&b, "%s %d", "world", 42);
    size_t len = 0;
    char *s = kvt_strbuf_take(&b, &len);
    assert_string_equal(s, "hello world 42");
    assert_int_equal(len, strlen("hello world 42"));
    assert_null(b.p);
    assert_int_equal(b.n, 0);
    assert_int_equal(b.cap, 0);
    assert_false(b.oom);
    /* the struct is reusable and independent of the taken block */
    kvt_strbuf_addstr(&b, "again");
    check_invariants(&b);
    assert_string_equal(b.p, "again");
    assert_string_equal(s, "hello world 42");
    free(s);
    s = kvt_strbuf_take(&b, NULL);
    assert_string_equal(s, "again");
    free(s);
}

/* A size that cannot be allocated sets the sticky flag; the prefix survives, later appends are
 * no-ops, take returns NULL and frees, free resets. */
static void test_oom_sticky(void **state) {
    (void)state;
    kvt_strbuf b = {0};
    kvt_strbuf_addstr(&b, "keep");
    kvt_strbuf_add(&b, "x", SIZE_MAX); /* overflows n + len + 1: never touches the source */
    assert_true(b.oom);
    assert_int_equal(b.n, 4);
    assert_string_equal(b.p, "keep");
    kvt_strbuf_addstr(&b, "more");
    kvt_strbuf_printf(&b, "%d", 5);
    kvt_strbuf_add(&b, "z", 1);
    assert_true(b.oom);
    assert_int_equal(b.n, 4);
    assert_string_equal(b.p, "keep");
    size_t len = 7;
    char *s = kvt_strbuf_take(&b, &len);
    assert_null(s);
    assert_int_equal(len, 0);
    assert_null(b.p);
    assert_false(b.oom);
    /* reusable after take */
    kvt_strbuf_add(&b, "x", SIZE_MAX);
    assert_true(b.oom);
    assert_null(b.p);
    kvt_strbuf_free(&b);
    assert_false(b.oom);
    kvt_strbuf_addstr(&b, "ok");
    check_invariants(&b);
    kvt_strbuf_free(&b);
}

/* kvt_fmt_bytes (util/common.h): decimal units, 3 significant digits, never "0 MB" for a small size */
static void test_fmt_bytes(void **state) {
    (void)state;
    char b[24];
    static const struct { double v; const char *want; } cases[] = {
        {0, "0 B"},           {999, "999 B"},          {1000, "1.00 kB"},     {1790, "1.79 kB"},
        {99940, "99.9 kB"},   {999400, "999 kB"},      {999600, "1.00 MB"},   {12.6e6, "12.6 MB"},
        {1.5e9, "1.50 GB"},   {2.5e12, "2.50 TB"},     {3e15, "3000 TB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_string_equal(kvt_fmt_bytes(cases[i].v, b, sizeof b), cases[i].want);
    char tiny[4];
    assert_string_equal(kvt_fmt_bytes(1.5e9, tiny, sizeof tiny), "1.5"); /* truncated, terminated */
}

/* the JSON string writer escapes as Python's json.dumps(ensure_ascii=False): named escapes, other
 * control bytes as \u00XX, UTF-8 and NUL-free text as it is, embedded NULs escaped */
static void test_json_str(void **state) {
    (void)state;
    kvt_strbuf b = {0};
    const char in[] = "a\"b\\c\n\r\t\b\f\x01\x1f \xc3\xa9\x7f";
    kvt_strbuf_json_str(&b, in, sizeof in - 1);
    kvt_strbuf_json_str(&b, "x\0y", 3);
    kvt_strbuf_json_str(&b, NULL, 0);
    size_t n = 0;
    char *out = kvt_strbuf_take(&b, &n);
    assert_string_equal(out, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f \xc3\xa9\x7f\"\"x\\u0000y\"\"\"");
    assert_int_equal(n, strlen(out));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),        cmocka_unit_test(test_add_growth),  cmocka_unit_test(test_printf),
        cmocka_unit_test(test_embedded_nul), cmocka_unit_test(test_take_resets), cmocka_unit_test(test_oom_sticky), cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_json_str),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
