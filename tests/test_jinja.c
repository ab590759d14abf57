/* test_jinja.c — the Jinja interpreter: each construct, Python str()/repr() formats, whitespace
 * control, errors with line numbers, and the caps (recursion, loop steps, output, memory). The
 * byte-for-byte comparison with python3-jinja2 over the real templates is tests/e2e/templates.sh. */
#include "testutil.h"

#include "text/chat.h"
#include "text/jinja.h"

/* renders src with ctx (JSON, may be NULL); returns malloc'd text or NULL with err filled */
static char *R(const char *src, const char *ctx, kvt_status *st_out, char *err, size_t errlen,
               const kvt_jinja_limits *lim) {
    kvt_jinja_template *t = NULL;
    kvt_status st = kvt_jinja_template_create(src, strlen(src), &t, err, errlen);
    if (st_out) *st_out = st;
    if (st != KVT_OK) return NULL;
    char *out = NULL;
    size_t len = 0;
    kvt_jinja_render_opts o = {.limits = lim};
    st = kvt_jinja_render(t, ctx, ctx ? strlen(ctx) : 0, &o, &out, &len, err, errlen);
    if (st_out) *st_out = st;
    kvt_jinja_template_free(t);
    if (st == KVT_OK) assert_int_equal(strlen(out), len);
    return st == KVT_OK ? out : NULL;
}

static void expect(const char *src, const char *ctx, const char *want) {
    char err[512] = "";
    kvt_status st;
    char *out = R(src, ctx, &st, err, sizeof err, NULL);
    if (!out) fail_msg("template %s\n  failed: %s", src, err);
    if (strcmp(out, want)) fail_msg("template %s\n  got  '%s'\n  want '%s'", src, out, want);
    free(out);
}

/* expects an error of status st whose message contains `needle` */
static void expect_err(const char *src, const char *ctx, kvt_status want, const char *needle) {
    char err[512] = "";
    kvt_status st;
    char *out = R(src, ctx, &st, err, sizeof err, NULL);
    if (out) fail_msg("template %s\n  rendered '%s', want an error", src, out);
    if (st != want) fail_msg("template %s: status %d, want %d (%s)", src, st, want, err);
    if (needle && !strstr(err, needle)) fail_msg("template %s: error '%s' lacks '%s'", src, err, needle);
}

static void test_literals_and_repr(void **s) {
    (void)s;
    expect("{{ 1 }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e20 }}|{{ 1e-5 }}|{{ 1e16 }}|{{ 123456789012345678.0 }}|{{ -0.5 }}", NULL,
           "1|1.0|0.1|1e+20|1e-05|1e+16|1.2345678901234568e+17|-0.5");
    expect("{{ none }}|{{ true }}|{{ False }}|{{ 'a' 'b' }}", NULL, "None|True|False|ab");
    expect("{{ [1, 'a', none, true, 1.5, {'k': [2]}] }}", NULL, "[1, 'a', None, True, 1.5, {'k': [2]}]");
    expect("{{ (1,) }}{{ () }}{{ (1, 2) }}", NULL, "(1,)()(1, 2)");
    expect("{{ [\"it's\", 'a\"b', 'a\\'b\"', '\\n\\t\\x01\\\\', 'é😀'] }}", NULL,
           "[\"it's\", 'a\"b', 'a\\'b\"', '\\n\\t\\x01\\\\', 'é😀']");
    expect("{{ {'a': 1}.items() }}|{{ {'a': 1}.keys() }}", NULL, "dict_items([('a', 1)])|dict_keys(['a'])");
    expect("{{ namespace(a=1) }}", NULL, "<Namespace {'a': 1}>");
    expect("{{ x }}", "{\"x\": {\"b\": 2.50, \"a\": [1, -7, 1e3, \"\\u00e9\\ud83d\\ude00\"]}}",
           "{'b': 2.5, 'a': [1, -7, 1000.0, 'é😀']}");
}

static void test_expressions(void **s) {
    (void)s;
    expect("{{ 7/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}", NULL,
           "3.5 3 -4 2 1024 7 9");
    expect("{{ 'a' ~ 1 ~ none ~ u ~ 1.0 }}|{{ 'ab' * 2 }}|{{ [1] + [2] }}|{{ 'x' + 'y' }}", NULL, "a1None1.0|abab|[1, 2]|xy");
    expect("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1,2] == [1,2] }}", NULL,
           "True False True True True");
    expect("{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in u }}", NULL,
           "True True True True False");
    expect("{{ 0 or 'd' }}|{{ 1 and 'y' }}|{{ not [] }}|{{ '' or [] }}", NULL, "d|y|True|[]");
    expect("{{ 'y' if 1 > 0 else 'n' }}|{{ 'y' if 0 }}|{{ ('z' if false) is defined }}", NULL, "y||False");
    expect("{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ [1,2,3][-1] }}|{{ [1,2,3,4][1::2] }}|{{ 'héllo'[1] }}", NULL,
           "el|olleh|3|[2, 4]|é");
    expect("{{ m.a }}|{{ m['b'].c }}|{{ m.missing is defined }}|{{ l.0 }}", "{\"m\": {\"a\": 1, \"b\": {\"c\": 2}}, \"l\": [9]}",
           "1|2|False|9");
    expect("{{ -x|abs }}|{{ -(2) }}", "{\"x\": 3}", "3|-2");
}

static void test_tests(void **s) {
    (void)s;
    expect("{{ u is defined }}{{ u is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}"
           "{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ {} is mapping }}{{ [] is iterable }}"
           "{{ 'x' is sequence }}{{ 3 is divisibleby 3 }}{{ 1 is true }}{{ true is true }}{{ 2 is even }}"
           "{{ 'a' is equalto 'a' }}{{ 1 is not none }}{{ 'ab' is lower }}",
           NULL, "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrue");
}

static void test_filters(void **s) {
    (void)s;
    expect("{{ '  x  '|trim }}|{{ [1,2,3]|length }}|{{ 'héllo'|length }}|{{ u|d('y') }}|{{ ''|default('y', true) }}"
           "|{{ none|default('y') }}",
           NULL, "x|3|5|y|y|None");
    expect("{{ [1,2]|join(', ') }}|{{ ['a','b']|map('upper')|join }}|{{ [3,1,2]|sort }}|{{ [1,1,2]|unique|list }}"
           "|{{ {'b':1,'a':2}|dictsort }}|{{ [1,2]|first }}{{ [1,2]|last }}|{{ 'Ab'|lower }}{{ 'ab'|upper }}",
           NULL, "1, 2|AB|[1, 2, 3]|[1, 2]|[('a', 2), ('b', 1)]|12|abAB");
    expect("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|list }}|{{ ms|rejectattr('role', 'eq', 'user')|list|length }}",
           "{\"ms\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"bot\", \"c\": 2}]}", "[1]|1");
    expect("{{ {'a': [1, 'é'], 'b': none}|tojson }}|{{ {'b': 1, 'a': true}|tojson(indent=2, sort_keys=true) }}", NULL,
           "{\"a\": [1, \"é\"], \"b\": null}|{\n  \"a\": true,\n  \"b\": 1\n}");
    expect("{{ 'é\"\\n'|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ [1,2]|tojson(separators=(',', ':')) }}", NULL,
           "\"é\\\"\\n\"|\"\\u00e9\"|[1,2]");
    expect("{{ '3'|int }}{{ 'x'|int }}{{ 2.7|int }}{{ '1.5'|float }}|{{ 1|string ~ 2 }}|{{ 'a b'|replace(' ', '_') }}", NULL,
           "3021.5|12|a_b");
    expect("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, first=true) }}|{{ {'k': 1}|items|list }}", NULL,
           "a\n  b|  a\n  b|[('k', 1)]");
    expect("{% filter upper %}abc{% endfilter %}", NULL, "ABC");
    expect_err("{{ [1]|map('upper')|tojson }}", NULL, KVT_ERR_INVALID_ARG, "generator");
}

static void test_methods(void **s) {
    (void)s;
    expect("{{ ' x '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b'.split(',') }}|{{ 'a b  c'.split() }}|{{ 'a.b.c'.rsplit('.', 1) }}",
           NULL, "x|a|['a', 'b']|['a', 'b', 'c']|['a.b', 'c']");
    expect("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'hello world'.title() }}|{{ 'aXb'.replace('X', '-') }}",
           NULL, "TrueTrue|Hello World|a-b");
    expect("{{ d.get('a') }}|{{ d.get('z', 5) }}|{{ d.get('z') }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
           "{\"d\": {\"a\": 1, \"b\": 2}}", "1|5|None|a=1;b=2;");
    expect_err("{% set l = [1] %}{{ l.append(2) }}", NULL, KVT_ERR_INVALID_ARG, "unsafe");
    expect_err("{% set d = {} %}{{ d.update({'a': 1}) }}", NULL, KVT_ERR_INVALID_ARG, "unsafe");
}

static void test_statements(void **s) {
    (void)s;
    expect("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
           "{{ loop.revindex }};{% endfor %}",
           NULL, "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
    expect("{% for x in [1,2] %}{{ loop.previtem }}{{ loop.nextitem }}{% endfor %}", NULL, "21");
    expect("{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}",
           NULL, "empty|2242");
    expect("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
           NULL, "13");
    expect("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", NULL, "0001020");
    expect("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", NULL, "3");
    expect("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t %}in {{ a }}{% endset %}{{ t }}", NULL, "12|in 1");
    expect("{% if 0 %}a{% elif 1 %}b{% else %}c{% endif %}", NULL, "b");
    expect("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4, z=5) }}", NULL,
           "12(){}|13(4,){'z': 5}");
    expect("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", NULL, "[in]");
    expect("{% raw %}{{ x }}{% endraw %}{# comment #}", NULL, "{{ x }}");
    expect("{{ strftime_now('%Y-%m-%d %d %b %Y %A') }}", NULL, "2026-01-01 01 Jan 2026 Thursday");
    expect("{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ dict(a=1) }}", NULL, "[0, 1, 2][1, 3, 5]{'a': 1}");
}

static void test_whitespace(void **s) {
    (void)s;
    /* trim_blocks + lstrip_blocks */
    expect("  {% if true %}\n  x\n  {% endif %}\n  y", NULL, "  x\n  y");
    expect("a  {%- if true -%}  b  {%- endif %}", NULL, "ab");
    expect("a\n{{- 'b' -}}\nc", NULL, "abc");
    expect("{# c #}\nx\n", NULL, "x"); /* comment trims its newline; one trailing newline dropped */
    expect("a\r\nb\r\n\r\n", NULL, "a\nb\n");
    expect("  {%+ if true %}x{% endif %}", NULL, "  x");
    expect("{% if true +%}\nx{% endif %}", NULL, "\nx");
    expect("{{ {'a': {'b': 1}} }}", NULL, "{'a': {'b': 1}}");
}

static void test_errors(void **s) {
    (void)s;
    expect_err("line1\n{% if x %}\nno end", NULL, KVT_ERR_FORMAT, "line 3");
    expect_err("{{ 1 + }}", NULL, KVT_ERR_FORMAT, "line 1, column");
    expect_err("ok\n  {% endfor %}", NULL, KVT_ERR_FORMAT, "line 2, column 6");
    expect_err("{{ x|nosuchfilter }}", NULL, KVT_ERR_FORMAT, "nosuchfilter");
    expect("{% if false %}{{ x|nosuchfilter }}{% endif %}ok", NULL, "ok"); /* jinja2: raises only when run */
    expect_err("{% extends 'x' %}", NULL, KVT_ERR_FORMAT, "extends");
    expect_err("{{ 'abc", NULL, KVT_ERR_FORMAT, "unterminated");
    /* a slice inside a tuple subscript (the fuzzer's messages[messages, 1:] once read a slice node's
     * missing parts) */
    expect_err("{% set m = [1, 2] %}{{ m[m, 1:] }}", NULL, KVT_ERR_FORMAT, "slice inside a tuple");
    expect_err("{{ x[1:2, 0] }}", NULL, KVT_ERR_FORMAT, "slice inside a tuple");
    expect_err("{{ raise_exception('Only user and assistant roles are supported!') }}", NULL, KVT_ERR_INVALID_ARG,
               "Only user and assistant roles are supported!");
    expect_err("{{ u.x }}", NULL, KVT_ERR_INVALID_ARG, "'u' is undefined");
    expect_err("{{ 1 + 'a' }}", NULL, KVT_ERR_INVALID_ARG, "unsupported operand");
    expect_err("{{ 1 // 0 }}", NULL, KVT_ERR_INVALID_ARG, "division");
    expect_err("{{ u|tojson }}", NULL, KVT_ERR_INVALID_ARG, "not JSON serializable");
    expect_err("{{ x }}", "{\"x\": [1,}", KVT_ERR_FORMAT, "context JSON");
    expect_err("{{ x }}", "[1]", KVT_ERR_FORMAT, "object");
    expect_err("{% set n = 1 %}{% set n.a = 2 %}", NULL, KVT_ERR_INVALID_ARG, "namespace");
    /* a sort that raises half-way (unorderable items) unwinds without leaking (run under ASan) */
    expect_err("{{ ([3, 'a', 1] * 300)|sort }}", NULL, KVT_ERR_INVALID_ARG, "not supported between");
    expect_err("{{ {1: 0, 'a': 1}|tojson(sort_keys=true) }}", NULL, KVT_ERR_INVALID_ARG, "not supported between");
    expect("{{ ([3, 1, 2] * 100)|sort|unique|list }}{{ {'b': 1, 'a': 2, 'c': 0}|tojson(sort_keys=true) }}", NULL,
           "[1, 2, 3]{\"a\": 2, \"b\": 1, \"c\": 0}");
}

static void test_caps(void **s) {
    (void)s;
    char err[256];
    kvt_status st;
    /* recursion: a macro calling itself */
    char *out = R("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &st, err, sizeof err, NULL);
    assert_null(out);
    assert_int_equal(st, KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "recursion cap"));
    /* loop steps */
    kvt_jinja_limits lim = {.max_steps = 1000};
    out = R("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", NULL, &st, err, sizeof err, &lim);
    assert_null(out);
    assert_non_null(strstr(err, "steps"));
    lim = (kvt_jinja_limits){.max_steps = 50000}; /* 10,100 iterations + 10,100 range items */
    out = R("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}ok", NULL, &st, err, sizeof err, &lim);
    assert_non_null(out);
    free(out);
    /* output size */
    lim = (kvt_jinja_limits){.max_output = 1000};
    out = R("{% for i in range(1000) %}xx{% endfor %}", NULL, &st, err, sizeof err, &lim);
    assert_null(out);
    assert_non_null(strstr(err, "bytes"));
    /* memory: doubling a string */
    lim = (kvt_jinja_limits){.max_memory = 1 << 20};
    out = R("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, &st,
            err, sizeof err, &lim);
    assert_null(out);
    assert_int_equal(st, KVT_ERR_INVALID_ARG);
    /* a value nested deeper than repr's bound */
    out = R("{% set ns = namespace(v=[]) %}{% for i in range(500) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}", NULL,
            &st, err, sizeof err, NULL);
    assert_null(out);
    assert_non_null(strstr(err, "nested"));
    /* parse nesting */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 500; i++) strcat(deep, "(");
    out = R(deep, NULL, &st, err, sizeof err, NULL);
    assert_null(out);
    assert_int_equal(st, KVT_ERR_FORMAT);
    char blocks[8192] = "";
    for (int i = 0; i < 300; i++) strcat(blocks, "{% if 1 %}");
    out = R(blocks, NULL, &st, err, sizeof err, NULL);
    assert_null(out);
    assert_int_equal(st, KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "nested too deeply"));
}

/* the chat layer: HF's context from kvt_chat_msg, tools and kwargs */
static void test_chat_context(void **s) {
    (void)s;
    const char *tmpl =
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content if m.content is not none else '' }}"
        "{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}({{ m.tool_calls[0].function.arguments }}){% endif %}"
        "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}"
        "{% endfor %}{% if tools %}T{{ tools|length }}{% endif %}{% if enable_thinking is defined %}E{{ enable_thinking }}{% endif %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}";
    kvt_chat_template *c = NULL;
    char err[256];
    assert_int_equal(kvt_chat_template_create_jinja(tmpl, strlen(tmpl), NULL, "<s>", "</s>", &c, err, sizeof err), KVT_OK);
    assert_true(kvt_chat_is_jinja(c));
    kvt_chat_msg m[3] = {
        {.role = "user", .content = "hi \"x\"\n", .content_len = 7},
        {.role = "assistant", .reasoning_content = "think",
         .tool_calls_json = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}}]"},
        {.role = "tool", .content = "42", .content_len = 2, .tool_call_id = "c1"},
    };
    kvt_chat_opts o = {.add_generation_prompt = true, .tools_json = "[{\"type\":\"function\"}]",
                       .kwargs_json = "{\"enable_thinking\": false}"};
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(kvt_chat_render_ex(c, m, 3, &o, &out, &len, err, sizeof err), KVT_OK);
    assert_string_equal(out, "<s><user>hi \"x\"\n<assistant>f({\"a\": 1})[think]<tool>42#c1T1EFalse<assistant>");
    free(out);
    /* bad tools / kwargs / a template that raises: INVALID_ARG naming the field */
    o.tools_json = "{\"not\": \"a list\"}";
    assert_int_equal(kvt_chat_render_ex(c, m, 3, &o, &out, &len, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tools"));
    o.tools_json = NULL;
    o.kwargs_json = "[1]";
    assert_int_equal(kvt_chat_render_ex(c, m, 3, &o, &out, &len, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chat_template_kwargs"));
    kvt_chat_template_free(c);
    const char *bad = "{{ raise_exception('no tools here') }}";
    assert_int_equal(kvt_chat_template_create_jinja(bad, strlen(bad), NULL, NULL, NULL, &c, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_chat_render(c, m, 1, true, &out, &len, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_string_equal(err, "no tools here");
    kvt_chat_template_free(c);
    const char *broken = "{% for m in messages %}";
    assert_int_equal(kvt_chat_template_create_jinja(broken, strlen(broken), NULL, NULL, NULL, &c, err, sizeof err),
                     KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "line 1"));
}

/* garbage never crashes: random bytes from a template alphabet, rendered with a small context */
static void test_random_garbage(void **s) {
    (void)s;
    static const char *const atoms[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " ", "if ", "for ", "x", "in ",
                                        "endif", "endfor", "set ", "=", "(", ")", "[", "]", "{", "}", "'a'", "1",
                                        "|", "length", "loop.", "index", ".", ",", "macro ", "m", "endmacro", "~",
                                        "is ", "defined", "not ", "else", "\n", "range(", "9", "*", "**", "messages",
                                        "raise_exception(", ":", "tojson", "ns", "namespace("};
    uint64_t seed = 42;
    const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"x\": [1, 2]}";
    kvt_jinja_limits lim = {.max_steps = 100000, .max_output = 1 << 16, .max_memory = 8 << 20};
    for (int it = 0; it < 3000; it++) {
        char src[512] = "";
        int n = 1 + (int)(tu_rand(&seed) % 40);
        for (int k = 0; k < n; k++) {
            const char *a = atoms[tu_rand(&seed) % KVT_ARRAY_LEN(atoms)];
            if (strlen(src) + strlen(a) + 1 < sizeof src) strcat(src, a);
        }
        char err[256];
        kvt_status st;
        char *out = R(src, ctx, &st, err, sizeof err, &lim);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_literals_and_repr), cmocka_unit_test(test_expressions), cmocka_unit_test(test_tests),
        cmocka_unit_test(test_filters),           cmocka_unit_test(test_methods),     cmocka_unit_test(test_statements),
        cmocka_unit_test(test_whitespace),        cmocka_unit_test(test_errors),      cmocka_unit_test(test_caps),
        cmocka_unit_test(test_chat_context),      cmocka_unit_test(test_random_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
