/* test_toolcall.c — the tool-call / reasoning output parser (text/toolcall.h) over the fixtures in
 * tests/fixtures/toolcalls/cases.json: each output parsed whole, cut in two at every byte, and fed
 * one byte at a time must give the same content, reasoning and calls (malformed calls come back as
 * content); format detection from template text; call ids; the forced-call syntax. */
#include <cjson/cJSON.h>

#include "testutil.h"

#include "text/toolcall.h"
#include "util/strbuf.h"

typedef struct got {
    kvt_strbuf content, reasoning;
    cJSON *calls;
    uint32_t next_index;
    bool bad_order;
} got;

static void sink(void *ctx, const kvt_tc_event *ev) {
    got *g = ctx;
    if (ev->kind == KVT_TC_CONTENT) kvt_strbuf_add(&g->content, ev->text, ev->len);
    else if (ev->kind == KVT_TC_REASONING) kvt_strbuf_add(&g->reasoning, ev->text, ev->len);
    else {
        if (ev->index != g->next_index++) g->bad_order = true;
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", ev->name);
        cJSON *a = cJSON_Parse(ev->arguments);
        if (!a) fail_msg("arguments are not JSON: %s", ev->arguments);
        cJSON_AddItemToObject(c, "arguments", a);
        cJSON_AddStringToObject(c, "id", ev->id);
        cJSON_AddItemToArray(g->calls, c);
    }
}

static kvt_tool_format fmt_of(const char *s) {
    if (!strcmp(s, "tagged")) return KVT_TOOL_FMT_TAGGED;
    if (!strcmp(s, "llama3")) return KVT_TOOL_FMT_LLAMA3;
    if (!strcmp(s, "mistral")) return KVT_TOOL_FMT_MISTRAL;
    if (!strcmp(s, "deepseek")) return KVT_TOOL_FMT_DEEPSEEK;
    return KVT_TOOL_FMT_NONE;
}

/* Parses out[] fed in pieces at the given cut points (cuts ascending, n_cuts of them). */
static void run(const cJSON *cs, const char *out, size_t n, const size_t *cuts, size_t n_cuts, got *g) {
    memset(g, 0, sizeof *g);
    g->calls = cJSON_CreateArray();
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(cs, "tools");
    char *tj = tools ? cJSON_PrintUnformatted(tools) : NULL;
    kvt_tc_opts o = {.format = fmt_of(cJSON_GetObjectItemCaseSensitive(cs, "format")->valuestring),
                     .reasoning = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cs, "reasoning")),
                     .in_think = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cs, "in_think")),
                     .tools_json = tj, .id_seed = 42};
    kvt_toolcall *p;
    assert_int_equal(kvt_toolcall_create(&o, &p), KVT_OK);
    free(tj);
    size_t at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        assert_int_equal(kvt_toolcall_feed(p, out + at, end - at, sink, g), KVT_OK);
        at = end;
    }
    assert_int_equal(kvt_toolcall_finish(p, sink, g), KVT_OK);
    assert_int_equal(kvt_toolcall_n_calls(p), (uint32_t)cJSON_GetArraySize(g->calls));
    kvt_toolcall_free(p);
}

static void check(const cJSON *cs, got *g, const char *how) {
    const char *name = cJSON_GetObjectItemCaseSensitive(cs, "name")->valuestring;
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(cs, "expect");
    const char *ec = cJSON_GetObjectItemCaseSensitive(ex, "content")->valuestring;
    const char *er = cJSON_GetObjectItemCaseSensitive(ex, "reasoning")->valuestring;
    const char *gc = g->content.p ? g->content.p : "", *gr = g->reasoning.p ? g->reasoning.p : "";
    if (strcmp(gc, ec)) fail_msg("%s (%s): content '%s' != expected '%s'", name, how, gc, ec);
    if (strcmp(gr, er)) fail_msg("%s (%s): reasoning '%s' != expected '%s'", name, how, gr, er);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(ex, "calls");
    if (cJSON_GetArraySize(calls) != cJSON_GetArraySize(g->calls))
        fail_msg("%s (%s): %d calls, expected %d", name, how, cJSON_GetArraySize(g->calls), cJSON_GetArraySize(calls));
    for (int i = 0; i < cJSON_GetArraySize(calls); i++) {
        const cJSON *e = cJSON_GetArrayItem(calls, i), *c = cJSON_GetArrayItem(g->calls, i);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring,
                            cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring);
        if (!cJSON_Compare(cJSON_GetObjectItemCaseSensitive(c, "arguments"), cJSON_GetObjectItemCaseSensitive(e, "arguments"), true))
            fail_msg("%s (%s): call %d arguments differ", name, how, i);
        const char *id = cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring;
        assert_int_equal(strlen(id), 29);
        assert_memory_equal(id, "call_", 5);
    }
    assert_false(g->bad_order);
}

static void got_free(got *g) {
    kvt_strbuf_free(&g->content);
    kvt_strbuf_free(&g->reasoning);
    cJSON_Delete(g->calls);
}

static cJSON *load_cases(void) {
    const char *path = "tests/fixtures/toolcalls/cases.json";
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (run from the repository root)", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j) fail_msg("%s is not JSON", path);
    return j;
}

static void test_fixtures(void **st) {
    cJSON *cases = load_cases();
    int n_cases = 0, n_malformed = 0;
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cases) {
        const char *out = cJSON_GetObjectItemCaseSensitive(cs, "output")->valuestring;
        size_t n = strlen(out);
        got g;
        run(cs, out, n, NULL, 0, &g); /* whole */
        check(cs, &g, "whole");
        got_free(&g);
        for (size_t cut = 1; cut < n; cut++) { /* cut in two at every byte */
            run(cs, out, n, &cut, 1, &g);
            char how[32];
            snprintf(how, sizeof how, "cut at %zu", cut);
            check(cs, &g, how);
            got_free(&g);
        }
        size_t *cuts = malloc(n * sizeof *cuts); /* one byte at a time */
        for (size_t i = 1; i < n; i++) cuts[i - 1] = i;
        run(cs, out, n, cuts, n ? n - 1 : 0, &g);
        check(cs, &g, "bytewise");
        got_free(&g);
        free(cuts);
        n_cases++;
        n_malformed += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cs, "malformed"));
    }
    assert_true(n_cases >= 20);
    assert_true(n_malformed >= 5);
    cJSON_Delete(cases);
}

static void test_detect(void **st) {
    assert_int_equal(kvt_tool_format_detect(NULL), KVT_TOOL_FMT_NONE);
    assert_int_equal(kvt_tool_format_detect("{{- '<tool_call>\\n' }}"), KVT_TOOL_FMT_TAGGED);
    assert_int_equal(kvt_tool_format_detect("{{- '[TOOL_CALLS][' }}"), KVT_TOOL_FMT_MISTRAL);
    assert_int_equal(kvt_tool_format_detect("<|python_tag|>"), KVT_TOOL_FMT_LLAMA3);
    assert_int_equal(kvt_tool_format_detect("<|start_header_id|> {\"name\": function name, \"parameters\": ...}"),
                     KVT_TOOL_FMT_LLAMA3);
    assert_int_equal(kvt_tool_format_detect("<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"),
                     KVT_TOOL_FMT_DEEPSEEK);
    assert_int_equal(kvt_tool_format_detect("<|im_start|>{{ message.content }}"), KVT_TOOL_FMT_NONE);
    assert_true(kvt_tool_reasoning_detect("{% if '</think>' in content %}"));
    assert_false(kvt_tool_reasoning_detect("<|im_start|>"));
    assert_true(kvt_tool_prompt_opens_think("<|im_start|>assistant\n<think>\n", 30));
    assert_false(kvt_tool_prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n", 42));
    assert_false(kvt_tool_prompt_opens_think("", 0));
}

static void count_ids(void *ctx, const kvt_tc_event *ev) {
    if (ev->kind != KVT_TC_CALL) return;
    char (*ids)[32] = ctx;
    snprintf(ids[ev->index], 32, "%s", ev->id);
}

static void test_ids_unique(void **st) {
    kvt_tc_opts o = {.format = KVT_TOOL_FMT_TAGGED, .id_seed = 7};
    kvt_toolcall *p;
    assert_int_equal(kvt_toolcall_create(&o, &p), KVT_OK);
    char ids[8][32];
    for (int i = 0; i < 8; i++) {
        const char *c = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n";
        assert_int_equal(kvt_toolcall_feed(p, c, strlen(c), count_ids, ids), KVT_OK);
    }
    assert_int_equal(kvt_toolcall_finish(p, count_ids, ids), KVT_OK);
    assert_int_equal(kvt_toolcall_n_calls(p), 8);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < i; k++) assert_string_not_equal(ids[i], ids[k]);
    kvt_toolcall_free(p);
}

static void test_syntax(void **st) {
    const char *pre, *suf, *key;
    assert_true(kvt_toolcall_syntax(KVT_TOOL_FMT_TAGGED, &pre, &suf, &key));
    assert_string_equal(pre, "<tool_call>\n");
    assert_string_equal(suf, "\n</tool_call>");
    assert_string_equal(key, "arguments");
    assert_true(kvt_toolcall_syntax(KVT_TOOL_FMT_LLAMA3, &pre, &suf, &key));
    assert_string_equal(key, "parameters");
    assert_true(kvt_toolcall_syntax(KVT_TOOL_FMT_MISTRAL, &pre, &suf, &key));
    assert_false(kvt_toolcall_syntax(KVT_TOOL_FMT_DEEPSEEK, &pre, &suf, &key));
    assert_false(kvt_toolcall_syntax(KVT_TOOL_FMT_NONE, &pre, &suf, &key));
}

/* Random bytes mixed with marker fragments never crash the parser, and every byte fed comes out
 * somewhere unless it was part of a recognised marker or call (bounded: content+reasoning <= input). */
static void test_garbage(void **st) {
    static const char *frag[] = {"<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "\"name\"", ":", "[TOOL_CALLS]",
                                 "<|python_tag|>", "<function=", "<parameter=", "</parameter>", "</function>", "x", " ", "\n"};
    uint64_t rs = 99;
    for (int fmt = 0; fmt <= 4; fmt++)
        for (int it = 0; it < 300; it++) {
            kvt_tc_opts o = {.format = (kvt_tool_format)fmt, .reasoning = it & 1, .in_think = (it & 3) == 3, .id_seed = 1};
            kvt_toolcall *p;
            assert_int_equal(kvt_toolcall_create(&o, &p), KVT_OK);
            got g;
            memset(&g, 0, sizeof g);
            g.calls = cJSON_CreateArray();
            size_t total = 0;
            int pieces = 1 + (int)(tu_rand(&rs) % 30);
            for (int k = 0; k < pieces; k++) {
                const char *f = frag[tu_rand(&rs) % (sizeof frag / sizeof frag[0])];
                size_t fl = strlen(f), cut = tu_rand(&rs) % (fl + 1);
                assert_int_equal(kvt_toolcall_feed(p, f, cut, sink, &g), KVT_OK);
                assert_int_equal(kvt_toolcall_feed(p, f + cut, fl - cut, sink, &g), KVT_OK);
                total += fl;
            }
            assert_int_equal(kvt_toolcall_finish(p, sink, &g), KVT_OK);
            assert_true(g.content.n + g.reasoning.n <= total);
            kvt_toolcall_free(p);
            got_free(&g);
        }
}


/* Arguments come back as the model wrote them (not re-printed: a 16-digit integer stays one). */
static void keep_args(void *ctx, const kvt_tc_event *ev) {
    if (ev->kind == KVT_TC_CALL) snprintf(ctx, 256, "%s", ev->arguments);
}

static void test_raw_arguments(void **st) {
    static const struct {
        kvt_tool_format f;
        const char *out, *args;
    } cases[] = {
        {KVT_TOOL_FMT_TAGGED, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2939295630435610, \"b\": [1.50]}}\n</tool_call>",
         "{\"a\": 2939295630435610, \"b\": [1.50]}"},
        {KVT_TOOL_FMT_TAGGED, "<tool_call>{\"arguments\":\"{\\\"x\\\": 1e2}\",\"name\":\"f\"}</tool_call>", "{\"x\": 1e2}"},
        {KVT_TOOL_FMT_LLAMA3, "{\"name\": \"f\", \"parameters\": {\"q\": \"a}b\\\"c\", \"n\": 12345678901234567}}",
         "{\"q\": \"a}b\\\"c\", \"n\": 12345678901234567}"},
        {KVT_TOOL_FMT_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"k\": 0.10}}]", "{\"k\": 0.10}"},
        {KVT_TOOL_FMT_MISTRAL, "[TOOL_CALLS]f[ARGS] {\"k\": 1.0}", "{\"k\": 1.0}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvt_tc_opts o = {.format = cases[i].f, .id_seed = 1};
        kvt_toolcall *p;
        assert_int_equal(kvt_toolcall_create(&o, &p), KVT_OK);
        char got[256] = "";
        kvt_toolcall_feed(p, cases[i].out, strlen(cases[i].out), keep_args, got);
        kvt_toolcall_finish(p, keep_args, got);
        assert_string_equal(got, cases[i].args);
        kvt_toolcall_free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures), cmocka_unit_test(test_detect), cmocka_unit_test(test_ids_unique),
        cmocka_unit_test(test_syntax),   cmocka_unit_test(test_garbage), cmocka_unit_test(test_raw_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
