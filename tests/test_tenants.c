/* test_tenants.c — src/server/tenants.c: the --api-keys file parser and loader (good files, every
 * bad line, duplicates, size and line bounds, file modes, FIFOs), the constant-time key match, the
 * namespace derivation (and that distinct namespaces give distinct chain roots), cache_salt
 * validation in kvt_api_parse, and the bounded per-namespace counters. The HTTP side is
 * tests/e2e/namespaces.sh. */
#include "testutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv.h"
#include "server/server.h"

#define K1 "0123456789abcdef"
#define K2 "fedcba9876543210"
#define K3 "key-three-1234567"

static kvt_keyring *parse_ok(const char *text) {
    kvt_keyring *k = NULL;
    char err[256] = "";
    kvt_status st = kvt_keyring_parse(text, strlen(text), "keys", &k, err, sizeof err);
    if (st != KVT_OK) {
        print_error("unexpected error: %s\n", err);
        fail();
    }
    return k;
}

static void parse_bad_n(const char *text, size_t len, const char *msg_part) {
    kvt_keyring *k = (kvt_keyring *)1;
    char err[256] = "";
    kvt_status st = kvt_keyring_parse(text, len, "keys", &k, err, sizeof err);
    if (st != KVT_ERR_FORMAT) {
        print_error("expected a format error (%s) for '%.80s', got %s\n", msg_part, text, kvt_status_str(st));
        fail();
    }
    assert_null(k);
    if (!strstr(err, msg_part)) {
        print_error("message '%s' lacks '%s'\n", err, msg_part);
        fail();
    }
}
static void parse_bad(const char *text, const char *msg_part) { parse_bad_n(text, strlen(text), msg_part); }

static void test_keys_good(void **unused) {
    (void)unused;
    kvt_keyring *k = parse_ok("# tenants of this server\n"
                              "\n"
                              "   \t \n"
                              K1 " alpha\n"
                              "\t" K2 "\tbeta   admin  \r\n"
                              "  # indented comment\n"
                              K3 " alpha"); /* no final newline; a tenant may have several keys */
    assert_int_equal(kvt_keyring_count(k), 3);
    const kvt_key_entry *e = kvt_keyring_at(k, 0);
    assert_string_equal(e->key, K1);
    assert_string_equal(e->tenant, "alpha");
    assert_false(e->admin);
    assert_int_equal(e->line, 4);
    e = kvt_keyring_at(k, 1);
    assert_string_equal(e->key, K2);
    assert_string_equal(e->tenant, "beta");
    assert_true(e->admin);
    assert_int_equal(e->line, 5);
    assert_int_equal(kvt_keyring_at(k, 2)->line, 7);
    assert_null(kvt_keyring_at(k, 3));
    /* the largest key and tenant, and every tenant character */
    char big[KVT_KEYS_MAX_KEY + 200];
    memset(big, 'x', KVT_KEYS_MAX_KEY);
    snprintf(big + KVT_KEYS_MAX_KEY, 200, " %s", "Aa0._-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"); /* 64 */
    kvt_keyring *k2 = parse_ok(big);
    assert_int_equal(strlen(kvt_keyring_at(k2, 0)->tenant), KVT_TENANT_MAX);
    kvt_keyring_free(k2);
    kvt_keyring_free(k);
}

static void test_keys_bad(void **unused) {
    (void)unused;
    parse_bad("", "no keys");
    parse_bad("# only a comment\n\n", "no keys");
    parse_bad(K1 "\n", "keys:1: expected 'KEY TENANT [admin]', found one field");
    parse_bad("# c\n" K1 " a admin extra\n", "keys:2: expected 'KEY TENANT [admin]', found more than three");
    parse_bad(K1 " alpha root\n", "keys:1: the third field must be 'admin'");
    parse_bad(K1 " alpha Admin\n", "the third field must be 'admin'");
    parse_bad("0123456789abcde alpha\n", "keys:1: the key has 15 characters (16..256 needed)");
    char longkey[400];
    memset(longkey, 'k', 257);
    snprintf(longkey + 257, 100, " alpha\n");
    parse_bad(longkey, "the key has 257 characters");
    parse_bad("0123456789abcdef\x7f alpha\n", "not printable ASCII (0x7f)");
    parse_bad("0123456789abcdef\xc3\xa9 alpha\n", "not printable ASCII (0xc3)");
    parse_bad(K1 " al/pha\n", "keys:1: the tenant name may only hold");
    parse_bad(K1 " al\x1fpha\n", "the tenant name may only hold");
    parse_bad(K1 " alphaalphaalphaalphaalphaalphaalphaalphaalphaalphaalphaalphaalpha\n", /* 65 */
              "the tenant name has 65 characters (at most 64)");
    /* a duplicate names both lines, also under another tenant */
    parse_bad(K1 " alpha\n" K2 " beta\n\n" K1 " gamma admin\n", "keys:4: this key was already given on line 1");
    /* a NUL byte anywhere */
    const char nul[] = K1 " alpha\n" K2 " be\0ta\n";
    parse_bad_n(nul, sizeof nul - 1, "contains a NUL byte");
    /* a line over the bound (a long comment counts too) */
    char *line = malloc(KVT_KEYS_MAX_LINE + 64);
    snprintf(line, 64, K1 " alpha\n#");
    size_t n = strlen(line);
    memset(line + n, 'c', KVT_KEYS_MAX_LINE);
    line[n + KVT_KEYS_MAX_LINE] = 0;
    parse_bad(line, "keys:2: line longer than 1024 bytes");
    free(line);
    /* the file bound */
    char *huge = malloc(KVT_KEYS_MAX_FILE_BYTES + 2);
    memset(huge, '\n', KVT_KEYS_MAX_FILE_BYTES + 1);
    parse_bad_n(huge, KVT_KEYS_MAX_FILE_BYTES + 1, "bytes (at most 1048576)");
    free(huge);
}

static char *write_file(const char *text, mode_t mode) {
    static char path[128];
    snprintf(path, sizeof path, "/tmp/kvt-test-keys-%d", (int)getpid());
    unlink(path);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
    return path;
}

static void test_keys_load(void **unused) {
    (void)unused;
    kvt_keyring *k = NULL;
    char err[512];
    char *p = write_file("# t\n" K1 " alpha admin\n", 0600);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_keyring_count(k), 1);
    kvt_keyring_free(k);
    assert_int_equal(chmod(p, 0640), 0); /* group-readable: a warning only */
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_OK);
    kvt_keyring_free(k);
    assert_int_equal(chmod(p, 0644), 0);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_null(k);
    assert_non_null(strstr(err, "other users can read it (mode 644)"));
    assert_non_null(strstr(err, "chmod 600"));
    assert_int_equal(chmod(p, 0602), 0);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "other users can write it"));
    /* errors name the file and the line */
    p = write_file(K1 " alpha\nshort beta\n", 0600);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, ":2: the key has 5 characters"));
    assert_non_null(strstr(err, p));
    unlink(p);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_IO);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(kvt_keyring_load("/tmp", &k, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "not a regular file"));
    /* a FIFO without a writer: refused at once instead of blocking start-up */
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(p);
    /* larger than the bound on disk */
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, KVT_KEYS_MAX_FILE_BYTES + 1), 0);
    close(fd);
    assert_int_equal(kvt_keyring_load(p, &k, err, sizeof err), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "(at most 1048576)"));
    unlink(p);
}

static void test_keys_match(void **unused) {
    (void)unused;
    kvt_keyring *k = parse_ok(K1 " alpha\n" K2 " beta admin\n");
    const kvt_key_entry *e = kvt_keyring_match(k, "Bearer " K1);
    assert_non_null(e);
    assert_string_equal(e->tenant, "alpha");
    e = kvt_keyring_match(k, "bearer   " K2 " \t");
    assert_non_null(e);
    assert_true(e->admin);
    assert_null(kvt_keyring_match(k, NULL));
    assert_null(kvt_keyring_match(k, K1));                /* no scheme */
    assert_null(kvt_keyring_match(k, "Basic " K1));
    assert_null(kvt_keyring_match(k, "Bearer 0123456789abcde"));  /* a prefix */
    assert_null(kvt_keyring_match(k, "Bearer " K1 "0"));  /* longer */
    assert_null(kvt_keyring_match(k, "Bearer "));
    assert_null(kvt_keyring_match(NULL, "Bearer " K1));
    kvt_keyring_free(k);
}

static void test_namespace(void **unused) {
    (void)unused;
    char a[KVT_NS_MAX], b[KVT_NS_MAX];
    assert_true(kvt_tenant_namespace(NULL, NULL, a, sizeof a));
    assert_string_equal(a, ""); /* no tenant, no salt: the namespace of a server without keys */
    assert_true(kvt_tenant_namespace("alpha", NULL, a, sizeof a));
    assert_string_equal(a, "alpha\x1f");
    assert_true(kvt_tenant_namespace(NULL, "s1", a, sizeof a));
    assert_string_equal(a, "\x1fs1");
    assert_true(kvt_tenant_namespace("alpha", "s1", a, sizeof a));
    assert_string_equal(a, "alpha\x1fs1");
    /* distinct (tenant, salt) pairs give distinct namespaces and distinct chain roots, whatever the
     * split between the parts */
    const char *t[] = {NULL, "alpha", "alph", "a", "b"};
    const char *s[] = {NULL, "s1", "as1", "alpha", "a"};
    uint64_t roots[25];
    char seen[25][KVT_NS_MAX];
    int n = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            assert_true(kvt_tenant_namespace(t[i], s[j], seen[n], sizeof seen[n]));
            roots[n] = kvt_root_hash("compat", seen[n]);
            for (int m = 0; m < n; m++) {
                assert_string_not_equal(seen[m], seen[n]);
                assert_true(roots[m] != roots[n]);
            }
            n++;
        }
    /* the bounds: the largest parts fit KVT_NS_MAX, one byte more does not */
    char ten[KVT_TENANT_MAX + 2], salt[KVT_SALT_MAX + 2];
    memset(ten, 't', sizeof ten);
    memset(salt, 's', sizeof salt);
    ten[KVT_TENANT_MAX] = salt[KVT_SALT_MAX] = 0;
    assert_true(kvt_tenant_namespace(ten, salt, a, sizeof a));
    assert_int_equal(strlen(a), KVT_TENANT_MAX + 1 + KVT_SALT_MAX);
    salt[KVT_SALT_MAX] = 's';
    salt[KVT_SALT_MAX + 1] = 0;
    assert_false(kvt_tenant_namespace(ten, salt, b, sizeof b));
    assert_string_equal(b, "");
    assert_false(kvt_tenant_namespace("alpha", "s1", b, 8)); /* out too small */
}

static bool parse_completion(const char *body, kvt_api_req *r, kvt_api_err *e, cJSON **root) {
    memset(e, 0, sizeof *e);
    return kvt_api_parse(KVT_API_COMPLETION, body, strlen(body), 1000, root, r, e);
}

static void test_cache_salt_parse(void **unused) {
    (void)unused;
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_true(parse_completion("{\"prompt\":\"hi\",\"cache_salt\":\"tenant-secret\"}", &r, &e, &root));
    assert_string_equal(r.cache_salt, "tenant-secret");
    assert_string_equal(r.ns, ""); /* set by the server (parse_request), not by the parser */
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    assert_true(parse_completion("{\"prompt\":\"hi\",\"cache_salt\":null}", &r, &e, &root));
    assert_null(r.cache_salt);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    assert_true(kvt_api_parse(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"c\"}",
                              strlen("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"c\"}"), 1000,
                              &root, &r, &e));
    assert_string_equal(r.cache_salt, "c");
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    const char *bad[] = {"{\"prompt\":\"hi\",\"cache_salt\":1}", "{\"prompt\":\"hi\",\"cache_salt\":\"\"}",
                         "{\"prompt\":\"hi\",\"cache_salt\":{}}", "{\"prompt\":\"hi\",\"cache_salt\":true}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(parse_completion(bad[i], &r, &e, &root));
        assert_int_equal(e.http, 400);
        assert_string_equal(e.param, "cache_salt");
    }
    char body[600];
    char salt[KVT_SALT_MAX + 2];
    memset(salt, 'q', sizeof salt);
    salt[KVT_SALT_MAX] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"cache_salt\":\"%s\"}", salt);
    assert_true(parse_completion(body, &r, &e, &root));
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    salt[KVT_SALT_MAX] = 'q';
    salt[KVT_SALT_MAX + 1] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"cache_salt\":\"%s\"}", salt);
    assert_false(parse_completion(body, &r, &e, &root));
    assert_string_equal(e.param, "cache_salt");
    assert_non_null(strstr(e.message, "257 bytes (at most 256)"));
}

static void test_ns_stats(void **unused) {
    (void)unused;
    kvt_ns_stats *t = kvt_ns_stats_create(2);
    assert_non_null(t);
    char ns[KVT_NS_MAX];
    kvt_tenant_namespace("alpha", NULL, ns, sizeof ns);
    kvt_ns_stats_add(t, ns, 1, 100, 0);
    kvt_ns_stats_add(t, ns, 1, 100, 99);
    kvt_tenant_namespace("alpha", "very-secret-salt", ns, sizeof ns);
    kvt_ns_stats_add(t, ns, 1, 10, 0);
    /* the table is full: further namespaces (a client sending random salts) go to "other" */
    for (int i = 0; i < 1000; i++) {
        char s[32];
        snprintf(s, sizeof s, "random-%d", i);
        kvt_tenant_namespace("beta", s, ns, sizeof ns);
        kvt_ns_stats_add(t, ns, 1, 5, 1);
    }
    kvt_ns_stats_add(t, "", 1, 7, 0);
    cJSON *j = kvt_ns_stats_json(t);
    char *txt = cJSON_PrintUnformatted(j);
    assert_null(strstr(txt, "very-secret-salt")); /* salts are never shown */
    assert_null(strstr(txt, "random-"));
    assert_int_equal(cJSON_GetObjectItem(j, "tracked")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(j, "max")->valueint, 2);
    const cJSON *list = cJSON_GetObjectItem(j, "list");
    assert_int_equal(cJSON_GetArraySize(list), 2);
    const cJSON *a = cJSON_GetArrayItem(list, 0), *as = cJSON_GetArrayItem(list, 1);
    assert_string_equal(cJSON_GetObjectItem(a, "tenant")->valuestring, "alpha");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(a, "salt")));
    assert_int_equal(cJSON_GetObjectItem(a, "requests")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(a, "prompt_tokens")->valueint, 200);
    assert_int_equal(cJSON_GetObjectItem(a, "cached_tokens")->valueint, 99);
    assert_string_equal(cJSON_GetObjectItem(as, "tenant")->valuestring, "alpha");
    assert_int_equal(strlen(cJSON_GetObjectItem(as, "salt")->valuestring), 8);
    const cJSON *o = cJSON_GetObjectItem(j, "other");
    assert_int_equal(cJSON_GetObjectItem(o, "requests")->valueint, 1001);
    assert_int_equal(cJSON_GetObjectItem(o, "prompt_tokens")->valueint, 5007);
    assert_int_equal(cJSON_GetObjectItem(o, "cached_tokens")->valueint, 1000);
    free(txt);
    cJSON_Delete(j);
    kvt_ns_stats_free(t);
    /* rows of the namespace without tenant or salt, and of a salt without tenant */
    t = kvt_ns_stats_create(4);
    kvt_ns_stats_add(t, "", 1, 1, 0);
    kvt_tenant_namespace(NULL, "s", ns, sizeof ns);
    kvt_ns_stats_add(t, ns, 1, 1, 0);
    j = kvt_ns_stats_json(t);
    list = cJSON_GetObjectItem(j, "list");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "tenant")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "salt")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 1), "tenant")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 1), "salt")));
    cJSON_Delete(j);
    kvt_ns_stats_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_good),  cmocka_unit_test(test_keys_bad),         cmocka_unit_test(test_keys_load),
        cmocka_unit_test(test_keys_match), cmocka_unit_test(test_namespace),        cmocka_unit_test(test_cache_salt_parse),
        cmocka_unit_test(test_ns_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
