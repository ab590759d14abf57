/* test_web.c — the embedded page table and the request rules of src/server/web.c that need no
 * socket: which paths the module owns, exact lookup (no `..` or prefix match), If-None-Match
 * matching, and the table itself (content types, ETags, the pages' references to their assets).
 * The HTTP answers (headers, HEAD, 304, 404, 405) are checked over a socket by tests/e2e/web.sh. */
#include <string.h>

#include "testutil.h"

#include "server/web.h"

static void test_owns_and_find(void **st) {
    (void)st;
    assert_true(kvt_web_owns("/"));
    assert_true(kvt_web_owns("/dashboard"));
    assert_true(kvt_web_owns("/assets/x"));
    assert_false(kvt_web_owns("/v1/models"));
    assert_false(kvt_web_owns("/stats"));
    assert_false(kvt_web_owns("/dashboard/"));
    assert_false(kvt_web_owns("/assets"));
    assert_false(kvt_web_owns(""));
    assert_non_null(kvt_web_find("/"));
    assert_non_null(kvt_web_find("/dashboard"));
    assert_non_null(kvt_web_find("/assets/chat.js"));
    static const char *const bad[] = {"/assets/", "/assets/../assets/chat.js", "/assets/./chat.js", "/assets//chat.js",
                                      "/assets/chat.js/", "/assets/CHAT.JS", "/assets/chat.j", "/index.html",
                                      "/assets/index.html", "/assets/../../etc/passwd", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_null(kvt_web_find(bad[i]));
}

static void test_etag_match(void **st) {
    (void)st;
    const char *e = "\"abc\"";
    assert_false(kvt_web_etag_match(NULL, e));
    assert_false(kvt_web_etag_match("", e));
    assert_true(kvt_web_etag_match("\"abc\"", e));
    assert_true(kvt_web_etag_match("*", e));
    assert_true(kvt_web_etag_match("W/\"abc\"", e));
    assert_true(kvt_web_etag_match("\"x\", \"abc\"", e));
    assert_true(kvt_web_etag_match("\"x\",W/\"abc\" ,\"y\"", e));
    assert_false(kvt_web_etag_match("\"abcd\"", e));
    assert_false(kvt_web_etag_match("\"ab\"", e));
    assert_false(kvt_web_etag_match("abc", e));
    assert_false(kvt_web_etag_match("\"x\", \"y\"", e));
    assert_false(kvt_web_etag_match(" , ,", e));
    assert_false(kvt_web_etag_match("W/", e));
}

/* every asset has a known content type, a distinct quoted ETag and bytes; each page's
 * script and stylesheet references name assets that exist */
static void test_table(void **st) {
    (void)st;
    assert_true(kvt_web_n_assets >= 6);
    for (size_t i = 0; i < kvt_web_n_assets; i++) {
        const kvt_web_asset *a = &kvt_web_assets[i];
        assert_true(a->len > 0);
        assert_true(!strcmp(a->ctype, "text/html; charset=utf-8") || !strcmp(a->ctype, "text/javascript; charset=utf-8") ||
                    !strcmp(a->ctype, "text/css; charset=utf-8"));
        size_t n = strlen(a->etag);
        assert_true(n == 22 && a->etag[0] == '"' && a->etag[n - 1] == '"');
        for (size_t k = 0; k < i; k++) assert_string_not_equal(kvt_web_assets[k].path, a->path);
        assert_ptr_equal(kvt_web_find(a->path), a);
        if (strncmp(a->ctype, "text/html", 9)) continue;
        char *html = strndup((const char *)a->data, a->len);
        assert_non_null(html);
        assert_null(strstr(html, "<script>")); /* the CSP allows no inline script */
        int refs = 0;
        for (const char *p = html; (p = strstr(p, "\"/assets/")); p++) {
            char ref[128];
            const char *end = strchr(p + 1, '"');
            assert_non_null(end);
            snprintf(ref, sizeof ref, "%.*s", (int)(end - p - 1), p + 1);
            assert_non_null(kvt_web_find(ref));
            refs++;
        }
        assert_int_equal(refs, 2); /* its script and its stylesheet */
        free(html);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owns_and_find),
        cmocka_unit_test(test_etag_match),
        cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
