/* toolcall.c — see toolcall.h.
 *
 * State machine (p->st), over the unconsumed bytes in p->buf:
 *   THINK    inside <think>: reasoning up to "</think>" (a tail that could start it is held back);
 *            "</think>" and the whitespace after it are dropped, then START.
 *   START    at the start of the reply: leading whitespace is held; "<think>" (reasoning on) enters
 *            THINK; for LLAMA3 a '{' and for MISTRAL a '[' enter BARE; a start marker enters CALL;
 *            anything else CONTENT.
 *   CONTENT  content up to the next start marker (a tail that could start one is held back).
 *   CALL     a call block after its start marker, buffered until its end marker (TAGGED,
 *            DEEPSEEK) or the end of output (the others); parsed calls are emitted, a block that
 *            does not parse is emitted as content, raw. Then AFTER.
 *   AFTER    after calls: whitespace is held (and dropped at the end); a start marker enters CALL
 *            again; anything else is content.
 *   BARE     the reply may be one bare JSON call: buffered to the end of output, then parsed; if it
 *            is not a call it is content.
 * Invariants: (1) every fed byte is emitted exactly once as content or reasoning, or consumed by a
 * marker or a parsed call, or (whitespace only) dropped at a reply start / after calls / after
 * "</think>"; (2) what is emitted never depends on how the input was split (decisions wait until
 * the held bytes decide them); (3) memory is the unconsumed text (the caller bounds the output). */
#include "toolcall.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "../util/strbuf.h"

enum { ST_START, ST_THINK, ST_CONTENT, ST_CALL, ST_AFTER, ST_BARE };

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define TAG_OPEN "<tool_call>"
#define TAG_CLOSE "</tool_call>"
#define PY_TAG "<|python_tag|>"
#define MI_TAG "[TOOL_CALLS]"
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"

struct kvt_toolcall {
    kvt_tc_opts o;
    char *tools_json;
    cJSON *tools;     /* parsed tools_json (NULL when none or unparsable) */
    int st;
    const char *marker; /* CALL: the start marker that opened the block */
    kvt_strbuf buf;   /* unconsumed text */
    uint32_t n_calls;
    uint64_t id_state;
    bool failed;      /* NOMEM seen */
};

kvt_tool_format kvt_tool_format_detect(const char *t) {
    if (!t) return KVT_TOOL_FMT_NONE;
    if (strstr(t, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) return KVT_TOOL_FMT_DEEPSEEK;
    if (strstr(t, "<tool_call>")) return KVT_TOOL_FMT_TAGGED;
    if (strstr(t, "[TOOL_CALLS]")) return KVT_TOOL_FMT_MISTRAL;
    if (strstr(t, "<|python_tag|>") || (strstr(t, "<|start_header_id|>") && strstr(t, "\"parameters\"")))
        return KVT_TOOL_FMT_LLAMA3;
    return KVT_TOOL_FMT_NONE;
}

bool kvt_tool_reasoning_detect(const char *t) { return t && strstr(t, "</think>") != NULL; }

const char *kvt_tool_format_name(kvt_tool_format f) {
    switch (f) {
    case KVT_TOOL_FMT_TAGGED: return "tagged (Hermes / Qwen)";
    case KVT_TOOL_FMT_LLAMA3: return "llama3";
    case KVT_TOOL_FMT_MISTRAL: return "mistral";
    case KVT_TOOL_FMT_DEEPSEEK: return "deepseek";
    default: return "none";
    }
}

bool kvt_tool_prompt_opens_think(const char *p, size_t n) {
    while (n && (p[n - 1] == '\n' || p[n - 1] == ' ' || p[n - 1] == '\r')) n--;
    const size_t k = strlen(THINK_OPEN);
    return n >= k && !memcmp(p + n - k, THINK_OPEN, k);
}

bool kvt_toolcall_syntax(kvt_tool_format f, const char **prefix, const char **suffix, const char **args_key) {
    *args_key = "arguments";
    switch (f) {
    case KVT_TOOL_FMT_TAGGED: *prefix = TAG_OPEN "\n"; *suffix = "\n" TAG_CLOSE; return true;
    case KVT_TOOL_FMT_LLAMA3: *prefix = ""; *suffix = ""; *args_key = "parameters"; return true;
    case KVT_TOOL_FMT_MISTRAL: *prefix = MI_TAG "["; *suffix = "]"; return true;
    default: return false;
    }
}

kvt_status kvt_toolcall_create(const kvt_tc_opts *o, kvt_toolcall **out) {
    *out = NULL;
    kvt_toolcall *p = calloc(1, sizeof *p);
    if (!p) return KVT_ERR_NOMEM;
    p->o = *o;
    if (o->tools_json) {
        p->tools_json = strdup(o->tools_json);
        if (!p->tools_json) {
            free(p);
            return KVT_ERR_NOMEM;
        }
        p->tools = cJSON_Parse(p->tools_json);
    }
    p->o.tools_json = p->tools_json;
    p->st = (o->reasoning && o->in_think) ? ST_THINK : ST_START;
    p->id_state = o->id_seed;
    *out = p;
    return KVT_OK;
}

void kvt_toolcall_free(kvt_toolcall *p) {
    if (!p) return;
    kvt_strbuf_free(&p->buf);
    cJSON_Delete(p->tools);
    free(p->tools_json);
    free(p);
}

uint32_t kvt_toolcall_n_calls(const kvt_toolcall *p) { return p->n_calls; }

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */
static void emit_text(kvt_toolcall *p, kvt_tc_kind k, const char *s, size_t n, kvt_tc_emit emit, void *ctx) {
    if (!n) return;
    kvt_tc_event ev = {.kind = k, .text = s, .len = n};
    emit(ctx, &ev);
}

/* Drops the first n bytes of the buffer. */
static void consume(kvt_toolcall *p, size_t n) {
    if (n >= p->buf.n) {
        p->buf.n = 0;
        if (p->buf.p) p->buf.p[0] = '\0';
        return;
    }
    memmove(p->buf.p, p->buf.p + n, p->buf.n - n);
    p->buf.n -= n;
    p->buf.p[p->buf.n] = '\0';
}

static const char *find(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    if (nn > hn) return NULL;
    return memmem(h, hn, needle, nn);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial_suffix(const char *s, size_t n, const char *m) {
    size_t mn = strlen(m);
    for (size_t k = mn - 1 < n ? mn - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void emit_call(kvt_toolcall *p, const char *name, const char *args, kvt_tc_emit emit, void *ctx) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char id[5 + 24 + 1] = "call_";
    uint64_t a = splitmix(&p->id_state), b = splitmix(&p->id_state);
    for (int i = 0; i < 24; i++) {
        uint64_t *src = i < 12 ? &a : &b;
        id[5 + i] = al[*src % 62];
        *src /= 62;
    }
    id[29] = '\0';
    kvt_tc_event ev = {.kind = KVT_TC_CALL, .index = p->n_calls, .id = id, .name = name, .arguments = args};
    p->n_calls++;
    emit(ctx, &ev);
}

/* The compact JSON text of a call's arguments value (object, or a string holding JSON); NULL when
 * it is neither. Caller frees. */
static char *args_text(const cJSON *a) {
    if (!a || cJSON_IsNull(a)) return strdup("{}");
    if (cJSON_IsObject(a)) return cJSON_PrintUnformatted(a);
    if (cJSON_IsString(a)) {
        cJSON *x = cJSON_Parse(a->valuestring);
        char *s = x && cJSON_IsObject(x) ? cJSON_PrintUnformatted(x) : NULL;
        cJSON_Delete(x);
        return s;
    }
    return NULL;
}

/* One JSON call object {"name", "arguments"|"parameters"} (also {"function": {...}}) -> event.
 * A list of calls is several. False when it is not one. */
typedef struct pend_call {
    char *name, *args;
} pend_call;

static char *dupn(const char *s, size_t n);

/* Raw JSON scanning over text cJSON already accepted: the model's own argument text is returned,
 * not a re-print (which would turn 16-digit integers into 1e15 forms). */
static size_t skip_ws_at(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

static size_t skip_value(const char *s, size_t n, size_t i) {
    i = skip_ws_at(s, n, i);
    if (i >= n) return n;
    if (s[i] == '"') {
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\') i++;
        return i < n ? i + 1 : n;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        bool in_str = false;
        for (; i < n; i++) {
            char d = s[i];
            if (in_str) {
                if (d == '\\') i++;
                else if (d == '"') in_str = false;
                continue;
            }
            if (d == '"') in_str = true;
            else if (d == '{' || d == '[') depth++;
            else if ((d == '}' || d == ']') && --depth == 0) return i + 1;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

/* The span [*vs, *ve) of member `key`'s value in the object text at s[0..n). */
static bool member_span(const char *s, size_t n, const char *key, size_t *vs, size_t *ve) {
    size_t i = skip_ws_at(s, n, 0), kl = strlen(key);
    if (i >= n || s[i] != '{') return false;
    i++;
    for (;;) {
        i = skip_ws_at(s, n, i);
        if (i >= n || s[i] != '"') return false;
        size_t ke = skip_value(s, n, i);
        bool match = ke - i == kl + 2 && !memcmp(s + i + 1, key, kl);
        i = skip_ws_at(s, n, ke);
        if (i >= n || s[i] != ':') return false;
        size_t v0 = skip_ws_at(s, n, i + 1), v1 = skip_value(s, n, v0);
        if (match) {
            *vs = v0;
            *ve = v1;
            return true;
        }
        i = skip_ws_at(s, n, v1);
        if (i >= n || s[i] != ',') return false;
        i++;
    }
}

static bool json_call(const cJSON *o, const char *raw, size_t raw_n, pend_call *pc) {
    if (!cJSON_IsObject(o)) return false;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "function");
    if (cJSON_IsObject(f)) {
        o = f;
        size_t vs, ve;
        if (raw && member_span(raw, raw_n, "function", &vs, &ve)) raw += vs, raw_n = ve - vs;
        else raw = NULL;
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(n) || !n->valuestring[0]) return false;
    const char *key = "arguments";
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, key = "parameters");
    char *args = NULL;
    size_t vs, ve;
    if (cJSON_IsObject(a) && raw && member_span(raw, raw_n, key, &vs, &ve)) args = dupn(raw + vs, ve - vs);
    else if (cJSON_IsString(a)) {
        cJSON *x = cJSON_Parse(a->valuestring);
        args = x && cJSON_IsObject(x) ? strdup(a->valuestring) : NULL;
        cJSON_Delete(x);
    } else args = args_text(a);
    if (!args) return false;
    pc->name = strdup(n->valuestring);
    pc->args = args;
    if (!pc->name) {
        free(args);
        return false;
    }
    return true;
}

typedef struct pend_list {
    pend_call c[64];
    uint32_t n;
} pend_list;

static void pend_clear(pend_list *l) {
    for (uint32_t i = 0; i < l->n; i++) {
        free(l->c[i].name);
        free(l->c[i].args);
    }
    l->n = 0;
}

static bool pend_add_json(pend_list *l, const cJSON *v, const char *raw, size_t raw_n) {
    if (cJSON_IsArray(v)) {
        if (!cJSON_GetArraySize(v)) return false;
        size_t i = skip_ws_at(raw, raw_n, 0) + 1; /* past '[' */
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            size_t e0 = skip_ws_at(raw, raw_n, i), e1 = skip_value(raw, raw_n, e0);
            if (!pend_add_json(l, it, raw + e0, e1 - e0)) return false;
            i = skip_ws_at(raw, raw_n, e1) + 1; /* past ',' */
        }
        return true;
    }
    if (l->n >= sizeof l->c / sizeof l->c[0]) return false;
    if (!json_call(v, raw, raw_n, &l->c[l->n])) return false;
    l->n++;
    return true;
}

/* Parses one JSON value at s (leading whitespace allowed); *end = where it stopped. */
static cJSON *json_prefix(const char *s, size_t n, size_t *end) {
    const char *e = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &e, false);
    *end = v && e ? (size_t)(e - s) : 0;
    return v;
}

static bool all_ws(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) return false;
    return true;
}

/* The whole text is one JSON value that is a call or list of calls (";"-separated also). */
static bool parse_json_calls(const char *s, size_t n, pend_list *l) {
    size_t off = 0;
    while (off < n) {
        while (off < n && (is_ws(s[off]) || s[off] == ';')) off++;
        if (off == n) break;
        size_t e;
        cJSON *v = json_prefix(s + off, n - off, &e);
        bool ok = v && pend_add_json(l, v, s + off, e);
        cJSON_Delete(v);
        if (!ok) return false;
        off += e;
    }
    return l->n > 0;
}

/* Schema type of parameter `key` of function `fn` in the tools (NULL if unknown). */
static const char *param_type(const kvt_toolcall *p, const char *fn, const char *key) {
    const cJSON *t;
    if (!cJSON_IsArray(p->tools)) return NULL;
    cJSON_ArrayForEach(t, p->tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, fn)) continue;
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pr, key), "type");
        return cJSON_IsString(ty) ? ty->valuestring : NULL;
    }
    return NULL;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* <function=NAME><parameter=K>V</parameter>…</function> (whitespace between elements allowed). */
static bool parse_xml_call(const kvt_toolcall *p, const char *s, size_t n, pend_list *l) {
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    if (n - i < 10 || memcmp(s + i, "<function=", 10)) return false;
    i += 10;
    const char *gt = memchr(s + i, '>', n - i);
    if (!gt || gt == s + i) return false;
    char *name = dupn(s + i, (size_t)(gt - (s + i)));
    if (!name) return false;
    i = (size_t)(gt - s) + 1;
    cJSON *args = cJSON_CreateObject();
    bool ok = args != NULL;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (!ok) break;
        if (n - i >= 11 && !memcmp(s + i, "</function>", 11)) {
            i += 11;
            break;
        }
        if (n - i < 11 || memcmp(s + i, "<parameter=", 11)) {
            ok = false;
            break;
        }
        i += 11;
        const char *kg = memchr(s + i, '>', n - i);
        if (!kg || kg == s + i) {
            ok = false;
            break;
        }
        char *key = dupn(s + i, (size_t)(kg - (s + i)));
        i = (size_t)(kg - s) + 1;
        const char *ve = find(s + i, n - i, "</parameter>");
        if (!key || !ve) {
            free(key);
            ok = false;
            break;
        }
        size_t vs = i, vn = (size_t)(ve - (s + i));
        if (vn && s[vs] == '\n') vs++, vn--;
        if (vn && s[vs + vn - 1] == '\n') vn--;
        char *val = dupn(s + vs, vn);
        const char *ty = param_type(p, name, key);
        cJSON *v = NULL;
        if (val && !(ty && !strcmp(ty, "string"))) {
            const char *e = NULL;
            v = cJSON_ParseWithOpts(val, &e, true);
        }
        if (!v && val) v = cJSON_CreateString(val);
        free(val);
        if (!v || cJSON_GetObjectItemCaseSensitive(args, key)) {
            cJSON_Delete(v);
            free(key);
            ok = false;
            break;
        }
        cJSON_AddItemToObject(args, key, v);
        free(key);
        i = (size_t)(ve - s) + 12;
    }
    if (ok && !all_ws(s + i, n - i)) ok = false;
    if (ok && l->n < sizeof l->c / sizeof l->c[0]) {
        l->c[l->n].name = name;
        l->c[l->n].args = cJSON_PrintUnformatted(args);
        if (l->c[l->n].args) {
            l->n++;
            name = NULL;
        } else {
            ok = false;
        }
    } else {
        ok = false;
    }
    free(name);
    cJSON_Delete(args);
    return ok;
}

/* [TOOL_CALLS] body: a JSON list/object, or NAME[ARGS]{…} repeated (optionally [TOOL_CALLS] between). */
static bool parse_mistral(const char *s, size_t n, pend_list *l) {
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    if (i < n && (s[i] == '[' || s[i] == '{')) return parse_json_calls(s + i, n - i, l);
    while (i < n) {
        while (i < n && is_ws(s[i])) i++;
        if (n - i >= strlen(MI_TAG) && !memcmp(s + i, MI_TAG, strlen(MI_TAG))) {
            i += strlen(MI_TAG);
            continue;
        }
        if (i == n) break;
        const char *a = find(s + i, n - i, "[ARGS]");
        if (!a || a == s + i || l->n >= sizeof l->c / sizeof l->c[0]) return false;
        size_t nm_end = (size_t)(a - s);
        const char *ci = find(s + i, nm_end - i, "[CALL_ID]");
        if (ci) nm_end = (size_t)(ci - s);
        for (size_t k = i; k < nm_end; k++)
            if (is_ws(s[k])) return false;
        size_t e;
        size_t as = (size_t)(a - s) + 6;
        cJSON *v = json_prefix(s + as, n - as, &e);
        if (!v || !cJSON_IsObject(v)) {
            cJSON_Delete(v);
            return false;
        }
        l->c[l->n].name = dupn(s + i, nm_end - i);
        l->c[l->n].args = dupn(s + as + skip_ws_at(s + as, n - as, 0), e - skip_ws_at(s + as, n - as, 0));
        cJSON_Delete(v);
        l->n++;
        if (!l->c[l->n - 1].name || !l->c[l->n - 1].args) return false;
        i = as + e;
    }
    return l->n > 0;
}

/* Inside <｜tool▁calls▁begin｜> … (<｜tool▁calls▁end｜> removed by the caller). */
static bool parse_deepseek(const char *s, size_t n, pend_list *l) {
    size_t i = 0;
    const size_t cb = strlen(DS_CALL_BEGIN), ce = strlen(DS_CALL_END), sp = strlen(DS_SEP);
    while (i < n) {
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;
        if (n - i < cb || memcmp(s + i, DS_CALL_BEGIN, cb)) return false;
        i += cb;
        const char *end = find(s + i, n - i, DS_CALL_END);
        if (!end) return false;
        size_t bn = (size_t)(end - (s + i));
        const char *b = s + i;
        const char *sep = find(b, bn, DS_SEP);
        if (!sep || l->n >= sizeof l->c / sizeof l->c[0]) return false;
        const char *name, *args;
        size_t name_n, args_n;
        const char *after = sep + sp;
        size_t after_n = bn - (size_t)(after - b);
        if ((size_t)(sep - b) == 8 && !memcmp(b, "function", 8)) { /* R1: function<sep>NAME\n```json\n{…}\n``` */
            const char *nl = memchr(after, '\n', after_n);
            if (!nl) return false;
            name = after;
            name_n = (size_t)(nl - after);
            const char *js = find(nl, after_n - (size_t)(nl - after), "```json");
            if (!js) return false;
            args = js + 7;
            const char *fence = find(args, after_n - (size_t)(args - after), "```");
            if (!fence) return false;
            args_n = (size_t)(fence - args);
        } else { /* V3.1: NAME<sep>{…} */
            name = b;
            name_n = (size_t)(sep - b);
            args = after;
            args_n = after_n;
        }
        while (name_n && is_ws(*name)) name++, name_n--;
        while (name_n && is_ws(name[name_n - 1])) name_n--;
        if (!name_n) return false;
        cJSON *v = cJSON_ParseWithLength(args, args_n);
        if (!v || !cJSON_IsObject(v)) {
            cJSON_Delete(v);
            return false;
        }
        while (args_n && is_ws(*args)) args++, args_n--;
        while (args_n && is_ws(args[args_n - 1])) args_n--;
        l->c[l->n].name = dupn(name, name_n);
        l->c[l->n].args = dupn(args, args_n);
        cJSON_Delete(v);
        l->n++;
        if (!l->c[l->n - 1].name || !l->c[l->n - 1].args) return false;
        i = (size_t)(end - s) + ce;
    }
    return l->n > 0;
}

/* Ends a call block that took the first `used` bytes of buf (raw): its calls when it parsed, else
 * the start marker (if any) and the raw text as content (never an error). The parser goes on after it. */
static bool settle_block(kvt_toolcall *p, bool ok, pend_list *l, const char *marker, const char *raw, size_t used,
                         kvt_tc_emit emit, void *ctx) {
    if (ok) {
        for (uint32_t i = 0; i < l->n; i++) emit_call(p, l->c[i].name, l->c[i].args, emit, ctx);
    } else {
        if (marker) emit_text(p, KVT_TC_CONTENT, marker, strlen(marker), emit, ctx);
        emit_text(p, KVT_TC_CONTENT, raw, used, emit, ctx);
    }
    pend_clear(l);
    consume(p, used);
    p->st = ok ? ST_AFTER : ST_CONTENT;
    return true;
}

/* The start markers of the format (content may switch to a call at any of them). */
static const char *const *markers(kvt_tool_format f) {
    static const char *const tagged[] = {TAG_OPEN, NULL};
    static const char *const llama[] = {PY_TAG, NULL};
    static const char *const mistral[] = {MI_TAG, NULL};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    static const char *const none[] = {NULL};
    switch (f) {
    case KVT_TOOL_FMT_TAGGED: return tagged;
    case KVT_TOOL_FMT_LLAMA3: return llama;
    case KVT_TOOL_FMT_MISTRAL: return mistral;
    case KVT_TOOL_FMT_DEEPSEEK: return deepseek;
    default: return none;
    }
}

/* Earliest full marker in buf (returns its offset, *which = it), else -1 and *hold = the longest
 * tail that could still become one. */
static long find_marker(const kvt_toolcall *p, const char *s, size_t n, const char **which, size_t *hold) {
    long best = -1;
    *hold = 0;
    for (const char *const *m = markers(p->o.format); *m; m++) {
        const char *f = find(s, n, *m);
        if (f && (best < 0 || f - s < best)) {
            best = (long)(f - s);
            *which = *m;
        }
        size_t h = partial_suffix(s, n, *m);
        if (h > *hold) *hold = h;
    }
    return best;
}

static bool is_prefix_of(const char *s, size_t n, const char *m) {
    size_t mn = strlen(m);
    return n < mn && !memcmp(s, m, n);
}

/* The call block in buf (after its start marker, which is consumed) when complete or at the end:
 * true when it was settled. */
static bool try_call(kvt_toolcall *p, bool at_end, kvt_tc_emit emit, void *ctx) {
    const char *s = p->buf.p ? p->buf.p : "";
    size_t n = p->buf.n;
    pend_list l = {.n = 0};
    const char *m = p->marker;
    if (!strcmp(m, TAG_OPEN)) {
        const char *e = find(s, n, TAG_CLOSE);
        if (!e && !at_end) return false;
        size_t bn = e ? (size_t)(e - s) : n;
        size_t used = e ? bn + strlen(TAG_CLOSE) : n;
        bool ok = false;
        if (e) {
            size_t i = 0;
            while (i < bn && is_ws(s[i])) i++;
            ok = (bn - i >= 10 && !memcmp(s + i, "<function=", 10)) ? parse_xml_call(p, s, bn, &l)
                                                                     : parse_json_calls(s, bn, &l) && l.n == 1;
        }
        return settle_block(p, ok, &l, m, s, used, emit, ctx);
    }
    if (!strcmp(m, DS_CALLS_BEGIN) || !strcmp(m, DS_CALL_BEGIN)) {
        const char *e = find(s, n, DS_CALLS_END);
        if (!e && !at_end) return false;
        size_t bn = e ? (size_t)(e - s) : n;
        size_t used = e ? bn + strlen(DS_CALLS_END) : n;
        /* with only <｜tool▁call▁begin｜> as the marker, the block text starts after it: re-add it */
        kvt_strbuf body = {0};
        if (!strcmp(m, DS_CALL_BEGIN)) kvt_strbuf_addstr(&body, DS_CALL_BEGIN);
        kvt_strbuf_add(&body, s, bn);
        bool ok = !body.oom && parse_deepseek(body.p ? body.p : "", body.n, &l);
        kvt_strbuf_free(&body);
        return settle_block(p, ok, &l, m, s, used, emit, ctx);
    }
    /* [TOOL_CALLS] and <|python_tag|>: to the end of the output */
    if (!at_end) return false;
    bool ok = !strcmp(m, MI_TAG) ? parse_mistral(s, n, &l) : parse_json_calls(s, n, &l);
    return settle_block(p, ok, &l, m, s, n, emit, ctx);
}

/* Runs the state machine over buf as far as the held bytes allow. */
static void run(kvt_toolcall *p, bool at_end, kvt_tc_emit emit, void *ctx) {
    for (;;) {
        const char *s = p->buf.p ? p->buf.p : "";
        size_t n = p->buf.n;
        switch (p->st) {
        case ST_THINK: {
            const char *e = find(s, n, THINK_CLOSE);
            if (e) {
                emit_text(p, KVT_TC_REASONING, s, (size_t)(e - s), emit, ctx);
                consume(p, (size_t)(e - s) + strlen(THINK_CLOSE));
                p->st = ST_START;
                continue;
            }
            size_t hold = at_end ? 0 : partial_suffix(s, n, THINK_CLOSE);
            emit_text(p, KVT_TC_REASONING, s, n - hold, emit, ctx);
            consume(p, n - hold);
            return;
        }
        case ST_START: {
            size_t i = 0;
            while (i < n && is_ws(s[i])) i++;
            if (i == n) {
                if (at_end) consume(p, n);
                return; /* only whitespace so far: wait */
            }
            const char *r = s + i;
            size_t rn = n - i;
            if (p->o.reasoning && rn >= strlen(THINK_OPEN) && !memcmp(r, THINK_OPEN, strlen(THINK_OPEN))) {
                consume(p, i + strlen(THINK_OPEN));
                p->st = ST_THINK;
                continue;
            }
            if (!at_end && p->o.reasoning && is_prefix_of(r, rn, THINK_OPEN)) return;
            const char *which = NULL;
            size_t hold;
            long at = find_marker(p, r, rn, &which, &hold);
            if (at == 0) {
                consume(p, i + strlen(which));
                p->marker = which;
                p->st = ST_CALL;
                continue;
            }
            if (!at_end && hold == rn) return; /* could still become a marker */
            if ((p->o.format == KVT_TOOL_FMT_LLAMA3 && r[0] == '{') || (p->o.format == KVT_TOOL_FMT_MISTRAL && r[0] == '[')) {
                consume(p, i);
                p->st = ST_BARE;
                continue;
            }
            consume(p, i); /* leading whitespace of the reply is dropped */
            p->st = ST_CONTENT;
            continue;
        }
        case ST_CONTENT:
        case ST_AFTER: {
            const char *which = NULL;
            size_t hold;
            long at = find_marker(p, s, n, &which, &hold);
            if (p->st == ST_AFTER) {
                size_t i = 0;
                while (i < n && is_ws(s[i])) i++;
                if (at >= 0 && (size_t)at == i) {
                    consume(p, i + strlen(which));
                    p->marker = which;
                    p->st = ST_CALL;
                    continue;
                }
                if (i == n || (!at_end && hold == n - i)) {
                    if (at_end) consume(p, n); /* whitespace after the calls is dropped */
                    return;
                }
                p->st = ST_CONTENT;
                continue;
            }
            if (at >= 0) {
                emit_text(p, KVT_TC_CONTENT, s, (size_t)at, emit, ctx);
                consume(p, (size_t)at + strlen(which));
                p->marker = which;
                p->st = ST_CALL;
                continue;
            }
            if (at_end) hold = 0;
            emit_text(p, KVT_TC_CONTENT, s, n - hold, emit, ctx);
            consume(p, n - hold);
            return;
        }
        case ST_CALL:
            if (!try_call(p, at_end, emit, ctx)) return;
            continue;
        case ST_BARE: {
            if (!at_end) return;
            pend_list l = {.n = 0};
            bool ok = parse_json_calls(s, n, &l);
            settle_block(p, ok, &l, NULL, s, n, emit, ctx);
            return;
        }
        default: return;
        }
    }
}

kvt_status kvt_toolcall_feed(kvt_toolcall *p, const char *text, size_t len, kvt_tc_emit emit, void *ctx) {
    if (p->failed) return KVT_ERR_NOMEM;
    kvt_strbuf_add(&p->buf, text, len);
    if (p->buf.oom) {
        p->failed = true;
        return KVT_ERR_NOMEM;
    }
    run(p, false, emit, ctx);
    return KVT_OK;
}

kvt_status kvt_toolcall_finish(kvt_toolcall *p, kvt_tc_emit emit, void *ctx) {
    if (p->failed) return KVT_ERR_NOMEM;
    run(p, true, emit, ctx);
    return KVT_OK;
}
