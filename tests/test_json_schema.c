/* test_json_schema.c — structured output (text/json_schema.h): schema refusals name the keyword;
 * the byte matcher accepts exactly the texts the schema allows (and every prefix of them); the
 * token constraint over the real GPT-2 vocabulary makes random logits (a random model) produce
 * schema-valid JSON 100 times out of 100, with a tool-call prefix/suffix too; the schema cache. */
#include <cjson/cJSON.h>
#include <math.h>

#include "testutil.h"

#include "engine/sampler.h"
#include "gguf/gguf.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

static kvt_gguf *g_g;
static kvt_tokenizer *g_tok;

static int setup_all(void **state) {
    char path[4096], err[256];
    tu_vocab_path(path, sizeof path, "ggml-vocab-gpt-2.gguf", "");
    if (kvt_gguf_open(path, &g_g, err, sizeof err) != KVT_OK) return -1;
    return kvt_tokenizer_create(g_g, &g_tok, err, sizeof err) == KVT_OK ? 0 : -1;
}

static int teardown_all(void **state) {
    kvt_tokenizer_free(g_tok);
    kvt_gguf_free(g_g);
    return 0;
}

static kvt_status compile_text(const char *js, kvt_json_schema **out, char *err, size_t errlen) {
    cJSON *j = cJSON_Parse(js);
    if (!j) fail_msg("test schema is not JSON: %s", js);
    kvt_status st = kvt_json_schema_get(j, NULL, NULL, out, err, errlen);
    cJSON_Delete(j);
    return st;
}

static void test_refusals(void **st) {
    static const struct {
        const char *schema, *word;
        kvt_status want;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'", KVT_ERR_UNSUPPORTED},
        {"{\"$ref\":\"#/defs/x\"}", "'$ref'", KVT_ERR_UNSUPPORTED},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "'allOf'", KVT_ERR_UNSUPPORTED},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1}}}", "'minimum' at $.properties.a",
         KVT_ERR_UNSUPPORTED},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", "additionalProperties", KVT_ERR_UNSUPPORTED},
        {"{\"type\":\"strnig\"}", "unknown type 'strnig'", KVT_ERR_INVALID_ARG},
        {"{\"type\":5}", "'type'", KVT_ERR_INVALID_ARG},
        {"{\"enum\":[]}", "'enum'", KVT_ERR_INVALID_ARG},
        {"{\"type\":\"array\",\"minItems\":-1}", "'minItems'", KVT_ERR_INVALID_ARG},
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "minimum above maximum", KVT_ERR_INVALID_ARG},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required 'b'", KVT_ERR_UNSUPPORTED},
        {"[1,2]", "must be an object", KVT_ERR_INVALID_ARG},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", "'not' at $.anyOf[1]", KVT_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvt_json_schema *s = NULL;
        char err[256] = "";
        kvt_status got = compile_text(cases[i].schema, &s, err, sizeof err);
        if (got != cases[i].want || !strstr(err, cases[i].word))
            fail_msg("schema %s: status %d, message '%s' (want %d with '%s')", cases[i].schema, got, err, cases[i].want,
                     cases[i].word);
        assert_null(s);
    }
    /* nesting past the bound is refused, not recursed into */
    char deep[4096] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"string\"}");
    for (int i = 0; i < 40; i++) strcat(deep, "}");
    kvt_json_schema *s = NULL;
    char err[256];
    assert_int_equal(compile_text(deep, &s, err, sizeof err), KVT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "deeper"));
}

static const char *NESTED =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"integer\"},"
    "\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"cc\"]},\"maxItems\":3},"
    "\"loc\":{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"},"
    "\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":5}},\"required\":[\"lat\",\"ok\",\"note\"],"
    "\"additionalProperties\":false},"
    "\"kind\":{\"anyOf\":[{\"type\":\"integer\"},{\"const\":\"x\"}]}},"
    "\"required\":[\"id\",\"name\",\"tags\",\"loc\",\"kind\"],\"additionalProperties\":false}";

static void test_matcher(void **st) {
    kvt_json_schema *s;
    char err[256];
    assert_int_equal(compile_text(NESTED, &s, err, sizeof err), KVT_OK);
    static const struct {
        const char *text;
        bool ok;
    } cases[] = {
        {"{\"id\":1,\"name\":\"ab\",\"tags\":[],\"loc\":{\"lat\":1.5,\"ok\":true,\"note\":null},\"kind\":\"x\"}", true},
        {"{\"kind\":-7, \"loc\":{\"note\":\"h\u00e9\",\"ok\":false,\"lat\":-0.25e+3},\"tags\":[\"cc\",\"a\"],\"name\":\"\",\"id\":0}", true},
        {"{ \"id\": 1, \"name\": \"ab\", \"tags\": [ \"b\" ], \"loc\": { \"lat\": 0, \"ok\": true, \"note\": \"x\" }, \"kind\": 3 }", true},
        {"{\"id\":1,\"name\":\"ab\",\"tags\":[],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null}}", false},          /* kind missing */
        {"{\"id\":1.5,\"name\":\"ab\",\"tags\":[],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1}", false}, /* id not integer */
        {"{\"id\":1,\"name\":\"123456789\",\"tags\":[],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1}", false}, /* maxLength */
        {"{\"id\":1,\"name\":\"a\",\"tags\":[\"d\"],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1}", false}, /* enum */
        {"{\"id\":1,\"name\":\"a\",\"tags\":[\"a\",\"a\",\"a\",\"a\"],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1}", false},
        {"{\"id\":1,\"name\":\"a\",\"tags\":[],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1,\"extra\":1}", false},
        {"{\"id\":01,\"name\":\"a\",\"tags\":[],\"loc\":{\"lat\":1,\"ok\":true,\"note\":null},\"kind\":1}", false}, /* leading zero */
        {"{\"id\":1,\"id\":2}", false},
        {"{\"id\":1,\"name\":\"a\\q\"}", false}, /* bad escape */
        {"{\"id\":1,\"name\":\"a\xff\"}", false},  /* not UTF-8 */
        {"[1]", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *t = cases[i].text;
        size_t n = strlen(t);
        if (kvt_json_schema_accepts(s, t, n) != cases[i].ok) fail_msg("case %zu '%s': want %d", i, t, cases[i].ok);
        if (cases[i].ok)
            for (size_t k = 0; k <= n; k++)
                if (!kvt_json_schema_prefix_ok(s, t, k)) fail_msg("case %zu: prefix of %zu bytes refused", i, k);
    }
    kvt_json_schema_release(s);

    /* json_object mode, scalars at the top level, prefix/suffix */
    assert_int_equal(kvt_json_schema_get(NULL, NULL, NULL, &s, err, sizeof err), KVT_OK);
    assert_true(kvt_json_schema_accepts(s, "{\"a\":[1,{\"b\":null}],\"\u00fc\":\"x\"}", strlen("{\"a\":[1,{\"b\":null}],\"\u00fc\":\"x\"}")));
    assert_false(kvt_json_schema_accepts(s, "[1]", 3));
    assert_false(kvt_json_schema_accepts(s, "{\"a\":1", 6));
    { /* a free key holds at most 256 bytes, and a character starts only where all of it fits: a
       * lead byte at byte 256 (or a 3-byte character from byte 255) is refused, not a dead end */
        char k[300];
        memcpy(k, "{\"", 2);
        memset(k + 2, 'a', 255);
        memcpy(k + 257, "\xc3\xa9", 2);
        assert_false(kvt_json_schema_prefix_ok(s, k, 258)); /* 2-byte character from byte 256 */
        assert_true(kvt_json_schema_prefix_ok(s, k, 257));
        k[256] = '"';
        memcpy(k + 257, ":1}", 3);
        assert_true(kvt_json_schema_accepts(s, k, 260)); /* a key of 254 bytes */
        memset(k + 2, 'a', 254);
        memcpy(k + 256, "\xc3\xa9\":1}", 6);
        assert_true(kvt_json_schema_accepts(s, k, 262)); /* 254 + a 2-byte character = 256 */
        memcpy(k + 256, "\xe2\x82\xac", 3);
        assert_false(kvt_json_schema_prefix_ok(s, k, 257)); /* a 3-byte character from byte 255 */
    }
    kvt_json_schema_release(s);
    assert_int_equal(compile_text("{\"type\":\"number\"}", &s, err, sizeof err), KVT_OK);
    assert_true(kvt_json_schema_accepts(s, "12.5", 4));
    assert_true(kvt_json_schema_accepts(s, "12", 2));
    assert_false(kvt_json_schema_accepts(s, "12.", 3));
    assert_false(kvt_json_schema_accepts(s, "12345678901234567", 17)); /* 17 digits: over the bound */
    kvt_json_schema_release(s);
    cJSON *j = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}},\"required\":[\"q\"]}");
    assert_int_equal(kvt_json_schema_get(j, "<tool_call>\n", "\n</tool_call>", &s, err, sizeof err), KVT_OK);
    const char *call = "<tool_call>\n{\"q\":\"hi\"}\n</tool_call>";
    assert_true(kvt_json_schema_accepts(s, call, strlen(call)));
    assert_false(kvt_json_schema_accepts(s, call, strlen(call) - 1));
    assert_false(kvt_json_schema_prefix_ok(s, "<tool_cal {", 11));
    /* the cache hands the same compiled schema back */
    kvt_json_schema *s2;
    assert_int_equal(kvt_json_schema_get(j, "<tool_call>\n", "\n</tool_call>", &s2, err, sizeof err), KVT_OK);
    assert_ptr_equal(s, s2);
    kvt_json_schema_release(s2);
    kvt_json_schema_release(s);
    cJSON_Delete(j);
}

/* Random logits through the constraint and the sampler until end-of-generation; the text. */
static char *generate(kvt_json_constraint *c, kvt_sampler *sm, uint64_t *rs, int max_steps, bool *ended) {
    const uint32_t nv = kvt_tokenizer_n_vocab(g_tok);
    float *l = malloc(nv * sizeof *l);
    size_t cap = 4096, n = 0;
    char *out = malloc(cap);
    int32_t *ids = malloc((size_t)max_steps * sizeof *ids);
    int n_ids = 0;
    *ended = false;
    kvt_json_constraint_reset(c);
    for (int step = 0; step < max_steps; step++) {
        for (uint32_t i = 0; i < nv; i++) l[i] = tu_randf(rs) * 4.0f;
        kvt_json_constraint_apply(c, l, nv);
        int32_t id = kvt_sampler_sample(sm, l);
        kvt_json_constraint_accept(c, id);
        if (kvt_tokenizer_is_eog(g_tok, id)) {
            *ended = true;
            break;
        }
        ids[n_ids++] = id;
        char buf[512];
        int32_t k = kvt_token_to_bytes(g_tok, id, true, buf, sizeof buf);
        if (n + (size_t)k + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + n, buf, (size_t)k);
        n += (size_t)k;
    }
    out[n] = 0;
    /* the bytes the constraint allowed are what the detokenizer streams (valid UTF-8: nothing replaced) */
    kvt_detok *dt = kvt_detok_create(g_tok, true);
    size_t dn = 0;
    char *dec = malloc(n + 64);
    for (int i = 0; i < n_ids; i++) {
        size_t k = 0;
        const char *d = kvt_detok_push(dt, ids[i], &k);
        memcpy(dec + dn, d, k);
        dn += k;
    }
    size_t k = 0;
    const char *d = kvt_detok_flush(dt, &k);
    memcpy(dec + dn, d, k);
    dn += k;
    if (dn != n || memcmp(dec, out, n)) fail_msg("detokenized text differs from the constrained bytes: %s", out);
    kvt_detok_free(dt);
    free(dec);
    free(ids);
    free(l);
    return out;
}

static void test_constrained_random_model(void **st) {
    kvt_json_schema *s;
    char err[256];
    assert_int_equal(compile_text(NESTED, &s, err, sizeof err), KVT_OK);
    kvt_json_constraint *c;
    assert_int_equal(kvt_json_constraint_create(g_tok, s, &c), KVT_OK);
    kvt_sampler *sm = kvt_sampler_create(kvt_tokenizer_n_vocab(g_tok));
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.0f;
    uint64_t rs = 2024;
    int valid = 0;
    for (int it = 0; it < 100; it++) {
        p.seed = (uint64_t)it;
        kvt_sampler_reset(sm, &p);
        bool ended;
        char *txt = generate(c, sm, &rs, 2000, &ended);
        cJSON *j = cJSON_Parse(txt);
        bool ok = ended && j && kvt_json_schema_accepts(s, txt, strlen(txt)) &&
                  cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "id")) &&
                  cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "loc"));
        if (!ok) fail_msg("generation %d (ended %d) is not valid: %s", it, ended, txt);
        valid++;
        cJSON_Delete(j);
        free(txt);
    }
    assert_int_equal(valid, 100);
    kvt_sampler_free(sm);
    kvt_json_constraint_free(c);
    kvt_json_schema_release(s);
}

/* tool_choice "required": the forced syntax of the tagged format parses back into a call. */
static void tc_sink(void *ctx, const kvt_tc_event *ev) {
    if (ev->kind == KVT_TC_CALL) *(int *)ctx += 1;
    else if (ev->kind == KVT_TC_CONTENT) *(int *)ctx += 1000;
}

static void test_constrained_tool_call(void **st) {
    const char *pre, *suf, *key;
    assert_true(kvt_toolcall_syntax(KVT_TOOL_FMT_TAGGED, &pre, &suf, &key));
    cJSON *j = cJSON_Parse("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
                           "\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":6}},"
                           "\"required\":[\"city\"],\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],"
                           "\"additionalProperties\":false}]}");
    kvt_json_schema *s;
    char err[256];
    assert_int_equal(kvt_json_schema_get(j, pre, suf, &s, err, sizeof err), KVT_OK);
    cJSON_Delete(j);
    kvt_json_constraint *c;
    assert_int_equal(kvt_json_constraint_create(g_tok, s, &c), KVT_OK);
    kvt_sampler *sm = kvt_sampler_create(kvt_tokenizer_n_vocab(g_tok));
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.0f;
    uint64_t rs = 77;
    for (int it = 0; it < 20; it++) {
        p.seed = 100 + (uint64_t)it;
        kvt_sampler_reset(sm, &p);
        bool ended;
        char *txt = generate(c, sm, &rs, 2000, &ended);
        assert_true(ended);
        kvt_tc_opts o = {.format = KVT_TOOL_FMT_TAGGED, .id_seed = 1};
        kvt_toolcall *tc;
        assert_int_equal(kvt_toolcall_create(&o, &tc), KVT_OK);
        int got = 0;
        kvt_toolcall_feed(tc, txt, strlen(txt), tc_sink, &got);
        kvt_toolcall_finish(tc, tc_sink, &got);
        if (got != 1) fail_msg("forced call %d did not parse as one call: %s", it, txt);
        kvt_toolcall_free(tc);
        free(txt);
    }
    kvt_sampler_free(sm);
    kvt_json_constraint_free(c);
    kvt_json_schema_release(s);
}


/* The token mask equals a brute-force check of every token (prefix + its bytes still a valid
 * prefix), in structural contexts (trie walk) and inside strings (the string fast path), with and
 * without a length bound and mid-escape. */
static void test_mask_matches_bruteforce(void **st) {
    static const struct {
        const char *schema, *prefix;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"words\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}", ""},
        {"{\"type\":\"object\",\"properties\":{\"words\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}", "{\"words\":[\"ab"},
        {"{\"type\":\"object\",\"properties\":{\"words\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}", "{\"words\":[\"ab\\"},
        {"{\"type\":\"object\",\"properties\":{\"words\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}", "{\"wo"},
        {"{\"type\":\"string\",\"maxLength\":4}", "\"ab"},
        {"{\"type\":\"string\",\"minLength\":3}", "\"a"},
        {"{\"enum\":[\"red\",\"green\",12,125]}", "12"},
        {"{\"type\":\"number\"}", "-1.5"},
        {NULL, "{\"k\":[true,"},
        {NULL, "{\"free key"},
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}}}", "{\"na"},
    };
    const uint32_t nv = kvt_tokenizer_n_vocab(g_tok);
    float *l = malloc(nv * sizeof *l);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        kvt_json_schema *s;
        char err[256];
        cJSON *j = cases[ci].schema ? cJSON_Parse(cases[ci].schema) : NULL;
        assert_int_equal(kvt_json_schema_get(j, NULL, NULL, &s, err, sizeof err), KVT_OK);
        cJSON_Delete(j);
        kvt_json_constraint *c;
        assert_int_equal(kvt_json_constraint_create(g_tok, s, &c), KVT_OK);
        const char *pre = cases[ci].prefix;
        size_t pn = strlen(pre);
        int32_t ids[256];
        int64_t n = kvt_tokenize(g_tok, pre, pn, false, false, ids, 256);
        assert_true(n >= 0 && n < 256);
        for (int64_t i = 0; i < n; i++) kvt_json_constraint_accept(c, ids[i]);
        for (uint32_t i = 0; i < nv; i++) l[i] = 0.0f;
        kvt_json_constraint_apply(c, l, nv);
        char buf[1024];
        memcpy(buf, pre, pn);
        uint32_t mism = 0, allowed = 0;
        for (uint32_t id = 0; id < nv; id++) {
            if (kvt_tokenizer_is_eog(g_tok, (int32_t)id)) continue;
            int32_t k = kvt_token_to_bytes(g_tok, (int32_t)id, true, buf + pn, (int32_t)(sizeof buf - pn));
            bool want = k > 0 && k <= 255 && kvt_json_schema_prefix_ok(s, buf, pn + (size_t)k);
            bool got = l[id] > -INFINITY;
            allowed += got;
            if (want != got && mism++ < 3) print_error("case %zu: token %u '%.*s' want %d got %d\n", ci, id, k, buf + pn, want, got);
        }
        if (mism) fail_msg("case %zu (prefix '%s'): %u tokens differ from the brute-force check", ci, pre, mism);
        assert_int_equal(allowed, kvt_json_constraint_n_allowed(c));
        kvt_json_constraint_free(c);
        kvt_json_schema_release(s);
    }
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_matcher),
        cmocka_unit_test(test_constrained_random_model),
        cmocka_unit_test(test_constrained_tool_call),
        cmocka_unit_test(test_mask_matches_bruteforce),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
