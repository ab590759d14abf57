/* api.c — OpenAI request validation and response/statistics rendering (see server.h). Pure: no
 * engine calls, no network, so everything here is unit-tested directly. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "text/toolcall.h"
#include "util/strbuf.h"

/* ---------------------------------------------------------------------------------------------
 * Small utilities
 * ------------------------------------------------------------------------------------------- */
bool kvt_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false; /* continuation byte, overlong 2-byte lead, or > U+10FFFF lead */
        }
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return false;
        if (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) return false;
        i += len;
    }
    return true;
}

bool kvt_ct_equal(const char *given, size_t given_len, const char *expected) {
    size_t n = strlen(expected);
    volatile unsigned char diff = (unsigned char)(given_len != n);
    for (size_t i = 0; i < n; i++) {
        unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)(g ^ (unsigned char)expected[i]);
    }
    return diff == 0;
}

bool kvt_api_check_bearer(const char *header, const char *key) {
    if (!key) return true;
    if (!header) return false;
    if (strncasecmp(header, "Bearer ", 7) != 0) return false;
    const char *v = header + 7;
    while (*v == ' ') v++;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    return kvt_ct_equal(v, n, key);
}

void kvt_api_set_err(kvt_api_err *e, int http, const char *type, const char *param, const char *code,
                     const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(param, ...) \
    (kvt_api_set_err(err, 400, "invalid_request_error", (param), NULL, __VA_ARGS__), false)

char *kvt_api_error_json(const kvt_api_err *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

bool kvt_api_model_matches(const char *requested, const char *alias, const char *engine_name, const char *path) {
    if (!requested || !*requested) return true;
    if (alias && !strcmp(requested, alias)) return true;
    if (engine_name && !strcmp(requested, engine_name)) return true;
    if (path) {
        const char *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        if (!strcmp(requested, b)) return true;
        size_t bl = strlen(b);
        if (bl > 5 && !strcmp(b + bl - 5, ".gguf") && strlen(requested) == bl - 5 && !strncmp(requested, b, bl - 5))
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * Request parsing
 * ------------------------------------------------------------------------------------------- */
/* Optional number field in [lo, hi]; false (with err) when present but wrong. */
static bool get_num(const cJSON *root, const char *name, double lo, double hi, bool *given, double *out,
                    kvt_api_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    *given = false;
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v)) return BAD(name, "'%s' must be a number", name);
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || x > hi) return BAD(name, "'%s' must be in [%g, %g]", name, lo, hi);
    *given = true;
    *out = x;
    return true;
}

/* JSON numbers arrive as doubles; integers are exact only up to 2^53, so every integer field is
 * bounded inside +-KVT_API_MAX_SAFE_INT: the cast below is then exact and defined, and two different
 * integers can never collapse into one (a seed of 1e19 is a 400, not a saturated cast). */
#define KVT_API_MAX_SAFE_INT 9007199254740991.0 /* 2^53 - 1 */

static bool get_int(const cJSON *root, const char *name, double lo, double hi, bool *given, int64_t *out,
                    kvt_api_err *err) {
    lo = fmax(lo, -KVT_API_MAX_SAFE_INT);
    hi = fmin(hi, KVT_API_MAX_SAFE_INT);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    *given = false;
    if (!v || cJSON_IsNull(v)) return true;
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(x) || x != floor(x) || x < lo || x > hi)
        return BAD(name, "'%s' must be an integer in [%.0f, %.0f]", name, lo, hi);
    *given = true;
    *out = (int64_t)x;
    return true;
}

static bool get_bool(const cJSON *root, const char *name, bool *out, kvt_api_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return BAD(name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return true;
}

static bool parse_sampling(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    kvt_sampling *s = &r->sampling;
    bool g;
    double x;
    int64_t i;
    /* Server default temperature is 1.0 (OpenAI's documented default). */
    s->temperature = 1.0f;
    if (!get_num(root, "temperature", 0, 2, &g, &x, err)) return false;
    if (g) s->temperature = (float)x;
    if (!get_num(root, "top_p", 0, 1, &g, &x, err)) return false;
    if (g) s->top_p = x <= 0 ? 1.0f : (float)x;
    if (!get_int(root, "top_k", 0, 1 << 20, &g, &i, err)) return false;
    if (g) s->top_k = (int32_t)i;
    if (!get_num(root, "min_p", 0, 1, &g, &x, err)) return false;
    if (g) s->min_p = (float)x;
    if (!get_num(root, "presence_penalty", -2, 2, &g, &x, err)) return false;
    if (g) s->presence_penalty = (float)x;
    if (!get_num(root, "frequency_penalty", -2, 2, &g, &x, err)) return false;
    if (g) s->frequency_penalty = (float)x;
    if (!get_num(root, "repeat_penalty", 0.01, 10, &g, &x, err)) return false;
    if (g) s->repeat_penalty = (float)x;
    /* negative seeds are taken modulo 2^64 (two's complement), as an int64 seed would be */
    if (!get_int(root, "seed", -KVT_API_MAX_SAFE_INT, KVT_API_MAX_SAFE_INT, &g, &i, err)) return false;
    if (g) {
        s->seed = (uint64_t)i;
        r->seed_given = true;
    }
    int64_t mt = -1, mct = -1;
    if (!get_int(root, "max_tokens", 1, 1e9, &g, &mt, err)) return false;
    if (!get_int(root, "max_completion_tokens", 1, 1e9, &g, &mct, err)) return false;
    r->max_tokens = mct > 0 ? mct : mt;
    int64_t n = 1;
    if (!get_int(root, "n", 1, KVT_API_MAX_N, &g, &n, err)) return false;
    r->n_choices = (uint32_t)n;
    if (!get_int(root, "best_of", 1, 1e9, &g, &n, err)) return false;
    if (g && n != 1) return BAD("best_of", "only best_of = 1 is supported");
    /* chat: logprobs (bool) + top_logprobs (0..20); completions: logprobs as a count (0..20) */
    const cJSON *lpv = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (lpv && !cJSON_IsNull(lpv)) {
        if (r->kind == KVT_API_CHAT) {
            if (!get_bool(root, "logprobs", &r->logprobs, err)) return false;
        } else {
            int64_t k = 0;
            if (!get_int(root, "logprobs", 0, KVT_MAX_TOP_LOGPROBS, &g, &k, err)) return false;
            r->logprobs = true;
            r->top_logprobs = (uint32_t)k;
        }
    }
    if (r->kind == KVT_API_CHAT) {
        if (!get_int(root, "top_logprobs", 0, KVT_MAX_TOP_LOGPROBS, &g, &i, err)) return false;
        if (g) {
            if (i > 0 && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            r->top_logprobs = (uint32_t)i;
        }
    }
    bool echo = false;
    if (!get_bool(root, "echo", &echo, err)) return false;
    if (echo) return BAD("echo", "echo is not supported");
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb)) return BAD("logit_bias", "'logit_bias' must be an object");
        int cnt = cJSON_GetArraySize(lb);
        if (cnt > 1024) return BAD("logit_bias", "'logit_bias' has more than 1024 entries");
        if (cnt > 0) {
            r->bias_ids = malloc((size_t)cnt * sizeof *r->bias_ids);
            r->bias_vals = malloc((size_t)cnt * sizeof *r->bias_vals);
            if (!r->bias_ids || !r->bias_vals) {
                kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
                return false;
            }
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, lb) {
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || fabs(it->valuedouble) > 100)
                return BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
            char *end = NULL;
            long long id = strtoll(it->string, &end, 10);
            if (!it->string[0] || *end || id < 0 || (uint64_t)id >= r->n_vocab_bound)
                return BAD("logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %u)", it->string,
                           r->n_vocab_bound);
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias_vals[r->n_bias] = (float)it->valuedouble;
            r->n_bias++;
        }
        s->bias_ids = r->bias_ids;
        s->bias_vals = r->bias_vals;
        s->n_bias = r->n_bias;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user)) {
        if (!cJSON_IsString(user)) return BAD("user", "'user' must be a string");
        r->user = user->valuestring;
    }

    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            if (stop->valuestring[0]) r->stop[r->n_stop++] = stop->valuestring;
        } else if (cJSON_IsArray(stop)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, stop) {
                if (!cJSON_IsString(it)) return BAD("stop", "'stop' must be a string or an array of strings");
                if (r->n_stop >= KVT_API_MAX_STOP) return BAD("stop", "at most %d stop strings", KVT_API_MAX_STOP);
                if (it->valuestring[0]) r->stop[r->n_stop++] = it->valuestring;
            }
        } else {
            return BAD("stop", "'stop' must be a string or an array of strings");
        }
    }
    if (!get_bool(root, "stream", &r->stream, err)) return false;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, err)) return false;
    }
    return true;
}

/* Joins a content value (string or array of {type:"text", text}) into msg; sets *owned when a new
 * buffer was allocated. */
static bool parse_content(const cJSON *c, size_t idx, kvt_chat_msg *m, bool *owned, kvt_api_err *err) {
    *owned = false;
    if (!c || cJSON_IsNull(c)) {
        m->content = "";
        m->content_len = 0;
        return true;
    }
    if (cJSON_IsString(c)) {
        m->content = c->valuestring;
        m->content_len = strlen(c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c)) return BAD("messages", "messages[%zu].content must be a string or an array", idx);
    size_t total = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return BAD("messages", "messages[%zu].content parts must be objects with a 'type'", idx);
        if (strcmp(t->valuestring, "text") != 0)
            return BAD("messages", "messages[%zu]: content part type '%.40s' is not supported", idx, t->valuestring);
        if (!cJSON_IsString(tx)) return BAD("messages", "messages[%zu]: text part needs a string 'text'", idx);
        total += strlen(tx->valuestring);
    }
    char *buf = malloc(total + 1);
    if (!buf) {
        kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    size_t off = 0;
    cJSON_ArrayForEach(p, c) {
        const char *s = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(s);
        memcpy(buf + off, s, l);
        off += l;
    }
    buf[off] = '\0';
    m->content = buf;
    m->content_len = off;
    *owned = true;
    return true;
}

/* Keeps a malloc'd string for kvt_api_req_free; false (500) when out of memory. */
static bool own(kvt_api_req *r, char *str, kvt_api_err *err) {
    char **n = str ? realloc(r->owned, (r->n_owned + 1) * sizeof *n) : NULL;
    if (!n) {
        free(str);
        kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    r->owned = n;
    r->owned[r->n_owned++] = str;
    return true;
}

/* An assistant message's tool_calls: [{id?, type: "function", function: {name, arguments}}], with
 * arguments a JSON text (as OpenAI sends it) or an object. Kept as compact JSON for the template. */
static bool parse_tool_calls(const cJSON *tc, size_t idx, kvt_api_req *r, kvt_chat_msg *m, kvt_api_err *err) {
    if (!cJSON_IsArray(tc)) return BAD("messages", "messages[%zu].tool_calls must be an array", idx);
    int j = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f))
            return BAD("messages", "messages[%zu].tool_calls[%d] must be an object with a 'function'", idx, j);
        if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function")))
            return BAD("messages", "messages[%zu].tool_calls[%d].type must be \"function\"", idx, j);
        if (id && !cJSON_IsString(id)) return BAD("messages", "messages[%zu].tool_calls[%d].id must be a string", idx, j);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm) || !nm->valuestring[0])
            return BAD("messages", "messages[%zu].tool_calls[%d].function.name must be a non-empty string", idx, j);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (a && !cJSON_IsString(a) && !cJSON_IsObject(a))
            return BAD("messages", "messages[%zu].tool_calls[%d].function.arguments must be a JSON string", idx, j);
        if (cJSON_IsString(a)) {
            cJSON *x = cJSON_Parse(a->valuestring);
            bool ok = x && cJSON_IsObject(x);
            cJSON_Delete(x);
            if (!ok)
                return BAD("messages", "messages[%zu].tool_calls[%d].function.arguments is not a JSON object text", idx, j);
        }
        j++;
    }
    /* templates read arguments as a mapping (HF convention; Llama 3.1's tojson, Qwen3-Coder's
     * items()): the JSON text the client sent becomes the object it holds */
    cJSON *copy = cJSON_Duplicate(tc, true);
    const cJSON *cc;
    cJSON_ArrayForEach(cc, copy) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(cc, "function");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (cJSON_IsString(a)) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", cJSON_Parse(a->valuestring));
    }
    char *js = copy ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    if (!own(r, js, err)) return false;
    m->tool_calls_json = js;
    return true;
}

static bool parse_messages(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(ms)) return BAD("messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(ms);
    if (n <= 0) return BAD("messages", "'messages' must not be empty");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    r->msg_owned = calloc((size_t)n, sizeof *r->msg_owned);
    if (!r->msgs || !r->msg_owned) {
        kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        size_t i = r->n_msgs;
        if (!cJSON_IsObject(m)) return BAD("messages", "messages[%zu] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) return BAD("messages", "messages[%zu].role must be a string", i);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (!strcmp(rs, "function")) rs = "tool"; /* the legacy name of a tool result */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return BAD("messages", "messages[%zu].role '%.40s' is not supported (system, user, assistant, tool)", i, rs);
        const bool asst = !strcmp(rs, "assistant");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tc && cJSON_IsNull(tc)) tc = NULL;
        if (tc && !asst) return BAD("messages", "messages[%zu]: only assistant messages carry tool_calls", i);
        if (!c && !asst) return BAD("messages", "messages[%zu].content is required", i);
        if (cJSON_IsNull(c) && !asst) return BAD("messages", "messages[%zu].content must not be null", i);
        r->msgs[i].role = rs;
        if (!parse_content(c, i, &r->msgs[i], &r->msg_owned[i], err)) return false;
        r->n_msgs++;
        if (tc && !parse_tool_calls(tc, i, r, &r->msgs[i], err)) return false;
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rc && !cJSON_IsNull(rc)) {
            if (!cJSON_IsString(rc) || !asst)
                return BAD("messages", "messages[%zu].reasoning_content must be a string on an assistant message", i);
            r->msgs[i].reasoning_content = rc->valuestring;
        }
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (tid && !cJSON_IsNull(tid)) {
            if (!cJSON_IsString(tid)) return BAD("messages", "messages[%zu].tool_call_id must be a string", i);
            r->msgs[i].tool_call_id = tid->valuestring;
        }
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (nm && !cJSON_IsNull(nm)) {
            if (!cJSON_IsString(nm)) return BAD("messages", "messages[%zu].name must be a string", i);
            r->msgs[i].name = nm->valuestring;
        }
    }
    return true;
}

/* tools: [{type: "function", function: {name, description?, parameters?}}] */
static bool parse_tools(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!t || cJSON_IsNull(t)) return true;
    if (!cJSON_IsArray(t)) return BAD("tools", "'tools' must be an array of {type: \"function\", function: {...}}");
    if (cJSON_GetArraySize(t) > KVT_API_MAX_TOOLS) return BAD("tools", "at most %d tools", KVT_API_MAX_TOOLS);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, t) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
        if (!cJSON_IsObject(it) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
            return BAD("tools", "tools[%d].type must be \"function\"", i);
        if (!cJSON_IsObject(f)) return BAD("tools", "tools[%d].function must be an object", i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 64)
            return BAD("tools", "tools[%d].function.name must be a string of 1 to 64 characters", i);
        for (const char *c = nm->valuestring; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
                  *c == '-' || *c == '.'))
                return BAD("tools", "tools[%d].function.name '%.64s' may hold only a-z, A-Z, 0-9, '_', '-' and '.'", i,
                           nm->valuestring);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(f, "description");
        if (d && !cJSON_IsNull(d) && !cJSON_IsString(d)) return BAD("tools", "tools[%d].function.description must be a string", i);
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa))
            return BAD("tools", "tools[%d].function.parameters must be a JSON schema object", i);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(f, "strict");
        if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st)) return BAD("tools", "tools[%d].function.strict must be a boolean", i);
        for (const cJSON *o = t->child; o != it; o = o->next) {
            const cJSON *on = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "function"), "name");
            if (!strcmp(on->valuestring, nm->valuestring))
                return BAD("tools", "tools[%d]: the function name '%.64s' is given twice", i, nm->valuestring);
        }
        i++;
    }
    if (i > 0) {
        r->tools = t;
        r->tools_json = cJSON_PrintUnformatted(t);
        if (!r->tools_json) {
            kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
            return false;
        }
    }
    return true;
}

/* tool_choice: "auto" | "none" | "required" | {type: "function", function: {name}} */
static bool parse_tool_choice(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    r->parallel_tool_calls = true;
    if (!get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err)) return false;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return true;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "auto")) r->tool_choice = KVT_TOOL_CHOICE_AUTO;
        else if (!strcmp(tc->valuestring, "none")) r->tool_choice = KVT_TOOL_CHOICE_NONE;
        else if (!strcmp(tc->valuestring, "required")) r->tool_choice = KVT_TOOL_CHOICE_REQUIRED;
        else return BAD("tool_choice", "unknown tool_choice '%.40s' (auto, none, required, or {\"type\": \"function\", ...})", tc->valuestring);
    } else if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
            return BAD("tool_choice", "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        r->tool_choice = KVT_TOOL_CHOICE_NAMED;
        r->tool_choice_name = nm->valuestring;
    } else {
        return BAD("tool_choice", "tool_choice must be a string or an object");
    }
    if (r->tool_choice == KVT_TOOL_CHOICE_REQUIRED || r->tool_choice == KVT_TOOL_CHOICE_NAMED) {
        if (!r->tools) return BAD("tool_choice", "tool_choice '%s' needs 'tools'", r->tool_choice_name ? r->tool_choice_name : "required");
        if (r->tool_choice == KVT_TOOL_CHOICE_NAMED) {
            const cJSON *it;
            bool found = false;
            cJSON_ArrayForEach(it, r->tools) {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(it, "function"), "name");
                if (!strcmp(n->valuestring, r->tool_choice_name)) found = true;
            }
            if (!found) return BAD("tool_choice", "tool_choice names '%.64s', which is not in 'tools'", r->tool_choice_name);
        }
    }
    return true;
}

/* chat_template_kwargs (an object) and reasoning_effort (a string, passed as a kwarg unless the
 * kwargs set it) become the template's extra variables. */
static bool parse_kwargs(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (kw && cJSON_IsNull(kw)) kw = NULL;
    if (re && cJSON_IsNull(re)) re = NULL;
    if (kw && !cJSON_IsObject(kw)) return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (re && !cJSON_IsString(re)) return BAD("reasoning_effort", "'reasoning_effort' must be a string");
    if (re && strcmp(re->valuestring, "minimal") && strcmp(re->valuestring, "low") && strcmp(re->valuestring, "medium") &&
        strcmp(re->valuestring, "high") && strcmp(re->valuestring, "none"))
        return BAD("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high");
    if (!kw && !re) return true;
    cJSON *o = kw ? cJSON_Duplicate(kw, true) : cJSON_CreateObject();
    if (o && re && !cJSON_GetObjectItemCaseSensitive(o, "reasoning_effort"))
        cJSON_AddStringToObject(o, "reasoning_effort", re->valuestring);
    r->kwargs_json = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!r->kwargs_json) {
        kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

/* response_format: {type: text} | {type: json_object} | {type: json_schema, json_schema: {name?, schema, strict?}}.
 * The schema itself is compiled (and refused) by the server with json_schema.h. */
static bool parse_response_format(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf)) return true;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(ty)) return BAD("response_format", "'response_format' must be {\"type\": ...}");
    if (!strcmp(ty->valuestring, "text")) return true;
    if (!strcmp(ty->valuestring, "json_object")) {
        r->response_format = KVT_FMT_JSON_OBJECT;
        return true;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return BAD("response_format", "response_format.type '%.40s' is not one of text, json_object, json_schema", ty->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return BAD("response_format", "response_format.json_schema must be an object");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(sc)) return BAD("response_format", "response_format.json_schema.schema must be an object");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st)) return BAD("response_format", "response_format.json_schema.strict must be a boolean");
    r->response_format = KVT_FMT_JSON_SCHEMA;
    r->json_schema = sc;
    return true;
}

static bool parse_prompt(const cJSON *root, kvt_api_req *r, uint32_t n_vocab, kvt_api_err *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0); /* ["text"]: a batch of one */
    if (cJSON_IsString(p)) {
        r->prompt_text = p->valuestring;
        r->prompt_text_len = strlen(p->valuestring);
        if (r->prompt_text_len == 0) return BAD("prompt", "'prompt' must not be empty");
        return true;
    }
    if (!cJSON_IsArray(p)) return BAD("prompt", "'prompt' must be a string or an array of token ids");
    int n = cJSON_GetArraySize(p);
    if (n <= 0) return BAD("prompt", "'prompt' must not be empty");
    r->prompt_ids = malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt_ids) {
        kvt_api_set_err(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        uint32_t i = r->n_prompt_ids;
        if (!cJSON_IsNumber(it)) return BAD("prompt", "prompt[%u] must be a token id (integer)", i);
        double x = it->valuedouble;
        if (!isfinite(x) || x != floor(x) || x < 0 || x >= (double)n_vocab)
            return BAD("prompt", "prompt[%u] = %g is not a token id in [0, %u)", i, x, n_vocab);
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)x;
    }
    return true;
}

/* cache_salt (vLLM's name): 1..KVT_SALT_MAX bytes; part of the request's namespace (tenants.h). */
static bool parse_cache_salt(const cJSON *root, kvt_api_req *r, kvt_api_err *err) {
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(root, "cache_salt");
    if (!cs || cJSON_IsNull(cs)) return true;
    if (!cJSON_IsString(cs)) return BAD("cache_salt", "'cache_salt' must be a string");
    size_t n = strlen(cs->valuestring);
    if (n == 0) return BAD("cache_salt", "'cache_salt' must not be empty (omit it for no salt)");
    if (n > KVT_SALT_MAX) return BAD("cache_salt", "'cache_salt' has %zu bytes (at most %u)", n, KVT_SALT_MAX);
    r->cache_salt = cs->valuestring;
    return true;
}

bool kvt_api_parse(kvt_api_kind kind, const char *body, size_t len, uint32_t n_vocab, cJSON **rootp,
                   kvt_api_req *r, kvt_api_err *err) {
    memset(r, 0, sizeof *r);
    *rootp = NULL;
    r->kind = kind;
    r->max_tokens = -1;
    r->n_choices = 1;
    r->parallel_tool_calls = true;
    r->n_vocab_bound = n_vocab;
    kvt_sampling_default(&r->sampling);
    if (!body || len == 0) return BAD(NULL, "request body is empty (expected JSON)");
    if (memchr(body, '\0', len)) return BAD(NULL, "request body contains a NUL byte");
    if (!kvt_utf8_valid(body, len)) return BAD(NULL, "request body is not valid UTF-8");
    size_t bad_at = 0;
    const char *why = NULL;
    if (!kvt_json_strict_check(body, len, &bad_at, &why)) return BAD(NULL, "malformed JSON near byte %zu: %s", bad_at, why);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        return BAD(NULL, "malformed JSON near byte %zu", off);
    }
    /* Trailing garbage after the value is malformed too. */
    for (const char *q = end; q && q < body + len; q++)
        if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') {
            cJSON_Delete(root);
            return BAD(NULL, "malformed JSON: trailing data after the object");
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return BAD(NULL, "request body must be a JSON object");
    }
    *rootp = root;
    bool ok = true;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) ok = BAD("model", "'model' must be a string");
        else r->model = model->valuestring;
    }
    if (ok) ok = parse_cache_salt(root, r, err);
    if (ok) ok = parse_sampling(root, r, err);
    if (ok) ok = kind == KVT_API_CHAT ? parse_messages(root, r, err) : parse_prompt(root, r, n_vocab, err);
    if (ok && kind == KVT_API_CHAT) ok = parse_tools(root, r, err) && parse_tool_choice(root, r, err) && parse_kwargs(root, r, err);
    if (ok) ok = parse_response_format(root, r, err);
    if (!ok) {
        kvt_api_req_free(r);
        cJSON_Delete(root);
        *rootp = NULL;
    }
    return ok;
}

void kvt_api_req_free(kvt_api_req *r) {
    if (r->msgs && r->msg_owned)
        for (size_t i = 0; i < r->n_msgs; i++)
            if (r->msg_owned[i]) free((void *)r->msgs[i].content);
    free(r->msgs);
    free(r->msg_owned);
    free(r->prompt_ids);
    free(r->tools_json);
    free(r->kwargs_json);
    free(r->bias_ids);
    free(r->bias_vals);
    for (size_t i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    r->owned = NULL;
    r->n_owned = 0;
    r->tools_json = r->kwargs_json = NULL;
    r->bias_ids = NULL;
    r->bias_vals = NULL;
    r->n_bias = 0;
    r->msgs = NULL;
    r->msg_owned = NULL;
    r->prompt_ids = NULL;
    r->n_msgs = 0;
    r->n_prompt_ids = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------------------------- */
const char *kvt_api_finish_str(kvt_finish f) {
    switch (f) {
    case KVT_FINISH_STOP: return "stop";
    case KVT_FINISH_LENGTH: return "length";
    case KVT_FINISH_CANCELLED: return "cancelled";
    default: return "error";
    }
}

static void add_usage(cJSON *root, const kvt_api_resp_info *ri) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", ri->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", ri->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)ri->n_prompt + ri->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", ri->n_cached);
    /* the kvtier extension beside usage (OpenAI clients ignore unknown fields): where the reused
     * tokens came from and the request's timings, for the chat page's per-turn cache badges */
    static const char *const tier[] = {"none", "ram", "ssd", "shared"};
    cJSON *k = cJSON_AddObjectToObject(root, "kvtier");
    cJSON_AddStringToObject(k, "reused_from", tier[(unsigned)ri->reused_from < 4 ? ri->reused_from : 0]);
    cJSON_AddNumberToObject(k, "cached_tokens", ri->n_cached);
    cJSON_AddNumberToObject(k, "computed_tokens", ri->n_prompt > ri->n_cached ? ri->n_prompt - ri->n_cached : 0);
    cJSON_AddNumberToObject(k, "ttft_ms", ri->ttft_ms);
    cJSON_AddNumberToObject(k, "prefill_tps", ri->prefill_tps);
    cJSON_AddNumberToObject(k, "decode_tps", ri->decode_tps);
}

static cJSON *resp_head(const kvt_api_resp_info *ri, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", ri->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)ri->created);
    cJSON_AddStringToObject(root, "model", ri->model);
    cJSON_AddStringToObject(root, "system_fingerprint", "kvtier");
    return root;
}

/* cJSON strings are NUL-terminated; model text never contains NUL (the detokenizer maps bytes to
 * text), but copy defensively with the exact length. */
static cJSON *str_n(const char *s, size_t n) {
    char *tmp = malloc(n + 1);
    if (!tmp) return cJSON_CreateString("");
    if (n) memcpy(tmp, s, n);
    tmp[n] = '\0';
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

/* ---------------------------------------------------------------------------------------------
 * /stats and /metrics
 * ------------------------------------------------------------------------------------------- */
/* One counter as the two outputs see it: a row of engine/stats_table.h or of KVT_SERVER_COUNTERS
 * (server.h) with its value. */
typedef struct stat_row {
    const char *section, *key, *metric, *kind, *help;
    double v;
} stat_row;
#define ENGINE_ROW_(field, ctype, section, key, metric, kind, help) {section, key, metric, #kind, help, (double)st->field},
#define SERVER_ROW_(field, section, key, metric, kind, help) {section, key, metric, #kind, help, (double)c->field},
#define STAT_ROWS(rows)                                                                                             \
    const stat_row rows[] = {KVT_STATS_ALL(ENGINE_ROW_) KVT_SERVER_COUNTERS(SERVER_ROW_)};                      \
    const size_t n_##rows = sizeof rows / sizeof rows[0]

/* the object `name` of parent, made when missing; NULL when it is there but not an object (a
 * section whose subsystem is off is null) */
static cJSON *obj_at(cJSON *parent, const char *name, size_t len) {
    char n[64];
    snprintf(n, sizeof n, "%.*s", (int)KVT_MIN(len, sizeof n - 1), name);
    cJSON *o = cJSON_GetObjectItemCaseSensitive(parent, n);
    if (!o) return cJSON_AddObjectToObject(parent, n);
    return cJSON_IsObject(o) ? o : NULL;
}
/* a subsystem's section: an object while it is on, null while it is off */
static cJSON *section(cJSON *root, const char *name, bool on) {
    if (on) return cJSON_AddObjectToObject(root, name);
    cJSON_AddNullToObject(root, name);
    return NULL;
}

char *kvt_api_stats_json(const kvt_engine_stats *st, const kvt_server_counters *c, const char *model, kvt_ns_stats *ns) {
    static const char *const br[] = {"closed", "open", "half-open"};
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model ? model : "");
    section(root, "prompt_cache", st->pc_enabled);
    cJSON *ssd = section(root, "ssd_cache", st->ssd_enabled);
    if (ssd) cJSON_AddStringToObject(ssd, "dir", st->ssd_dir);
    section(root, "generation_checkpoints", st->ckpt_enabled);
    section(root, "speculative", st->spec_enabled); /* --draft-model */
    cJSON *sh = section(root, "shared_cache", st->shared_enabled);
    if (sh) {
        cJSON_AddStringToObject(sh, "fetch_breaker", br[st->shared_fetch_breaker % 3]);
        cJSON_AddStringToObject(sh, "publish_breaker", br[st->shared_publish_breaker % 3]);
        cJSON_AddStringToObject(sh, "last_error", st->shared_last_error);
    }
    cJSON *mf = cJSON_AddObjectToObject(root, "model_file"); /* model/file_watch.h */
    cJSON_AddStringToObject(mf, "path", st->model_path);
    cJSON_AddStringToObject(mf, "state", st->model_changed ? "changed" : "unchanged");
    cJSON_AddStringToObject(mf, "change", st->model_change);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "kv"), "scheme", st->scheme);
    STAT_ROWS(rows);
    for (size_t i = 0; i < n_rows; i++) {
        const stat_row *r = &rows[i];
        if (!r->key[0]) continue;
        cJSON *o = obj_at(root, r->section, strlen(r->section));
        const char *dot = strchr(r->key, '.'), *leaf = dot ? dot + 1 : r->key;
        if (o && dot) o = obj_at(o, r->key, (size_t)(dot - r->key));
        if (o) cJSON_AddNumberToObject(o, leaf, r->v);
    }
    if (ns) cJSON_AddItemToObject(root, "namespaces", kvt_ns_stats_json(ns));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static void metric(kvt_strbuf *b, const char *name, const char *type, const char *help, double v) {
    kvt_strbuf_printf(b, "# HELP kvtier_%s %s\n# TYPE kvtier_%s %s\nkvtier_%s %.17g\n", name, help, name, type, name, v);
}

char *kvt_api_metrics_text(const kvt_engine_stats *st, const kvt_server_counters *c) {
    kvt_strbuf b = {0};
    metric(&b, "prompt_cache_enabled", "gauge", "1 when the RAM prompt cache is on", st->pc_enabled);
    metric(&b, "ssd_cache_enabled", "gauge", "1 when the SSD tier is on", st->ssd_enabled);
    metric(&b, "shared_cache_enabled", "gauge", "1 when the shared (Redis) tier is on", st->shared_enabled);
    metric(&b, "shared_cache_breaker_open", "gauge", "1 when a shared tier circuit breaker is not closed",
           (st->shared_fetch_breaker || st->shared_publish_breaker) ? 1.0 : 0.0);
    /* the KV scheme as an info-style metric; label value escaped per the exposition format */
    kvt_strbuf_addstr(&b, "# HELP kvtier_kv_scheme_info KV cache scheme key\n# TYPE kvtier_kv_scheme_info gauge\n"
                          "kvtier_kv_scheme_info{scheme=\"");
    for (const char *p = st->scheme; *p && p < st->scheme + sizeof st->scheme; p++) {
        if (*p == '\n') {
            kvt_strbuf_addstr(&b, "\\n");
            continue;
        }
        if (*p == '\\' || *p == '"') kvt_strbuf_addstr(&b, "\\");
        kvt_strbuf_add(&b, p, 1);
    }
    kvt_strbuf_addstr(&b, "\"} 1\n");
    STAT_ROWS(rows);
    for (size_t i = 0; i < n_rows; i++)
        if (rows[i].metric[0]) metric(&b, rows[i].metric, rows[i].kind, rows[i].help, rows[i].v);
    return kvt_strbuf_take(&b, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Choice output: reasoning / content / tool calls / logprobs (kvt_api_out, server.h)
 * ------------------------------------------------------------------------------------------- */
typedef struct out_choice {
    kvt_toolcall *tc;
    kvt_strbuf content, reasoning;
    cJSON *calls;      /* non-stream: message.tool_calls */
    cJSON *lp_all;     /* non-stream chat: logprobs.content; completions: built at the end */
    cJSON *lp_pending; /* stream: entries not sent yet */
    cJSON *c_tokens, *c_lps, *c_tops, *c_offs; /* completions logprobs (all, or pending when streaming) */
    size_t text_off;   /* completions: byte offset of the next token's text */
    uint32_t n_calls;  /* calls returned (after parallel_tool_calls) */
    kvt_finish finish;
} out_choice;

struct kvt_api_out {
    kvt_api_out_opts o;
    char *tools_json;
    out_choice *ch;
    /* the event sink's context while feeding */
    const kvt_api_resp_info *cur_ri;
    uint32_t cur;
    kvt_strbuf *cur_sb;
};

kvt_status kvt_api_out_create(const kvt_api_out_opts *op, kvt_api_out **out) {
    *out = NULL;
    kvt_api_out *o = calloc(1, sizeof *o);
    if (!o) return KVT_ERR_NOMEM;
    o->o = *op;
    if (o->o.n_choices == 0) o->o.n_choices = 1;
    o->ch = calloc(o->o.n_choices, sizeof *o->ch);
    if (op->tools_json) o->tools_json = strdup(op->tools_json);
    o->o.tools_json = o->tools_json;
    if (!o->ch || (op->tools_json && !o->tools_json)) {
        kvt_api_out_free(o);
        return KVT_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < o->o.n_choices; i++) {
        out_choice *c = &o->ch[i];
        kvt_tc_opts to = {.format = (kvt_tool_format)op->tool_format, .reasoning = op->reasoning,
                          .in_think = op->in_think, .tools_json = op->tools_json,
                          .id_seed = op->id_seed + 0x9e3779b97f4a7c15ull * (i + 1)};
        c->calls = cJSON_CreateArray();
        c->lp_all = cJSON_CreateArray();
        c->lp_pending = cJSON_CreateArray();
        c->c_tokens = cJSON_CreateArray();
        c->c_lps = cJSON_CreateArray();
        c->c_tops = cJSON_CreateArray();
        c->c_offs = cJSON_CreateArray();
        if (kvt_toolcall_create(&to, &c->tc) != KVT_OK || !c->calls || !c->lp_all || !c->lp_pending ||
            !c->c_tokens || !c->c_lps || !c->c_tops || !c->c_offs) {
            kvt_api_out_free(o);
            return KVT_ERR_NOMEM;
        }
    }
    *out = o;
    return KVT_OK;
}

void kvt_api_out_free(kvt_api_out *o) {
    if (!o) return;
    for (uint32_t i = 0; o->ch && i < o->o.n_choices; i++) {
        out_choice *c = &o->ch[i];
        kvt_toolcall_free(c->tc);
        kvt_strbuf_free(&c->content);
        kvt_strbuf_free(&c->reasoning);
        cJSON_Delete(c->calls);
        cJSON_Delete(c->lp_all);
        cJSON_Delete(c->lp_pending);
        cJSON_Delete(c->c_tokens);
        cJSON_Delete(c->c_lps);
        cJSON_Delete(c->c_tops);
        cJSON_Delete(c->c_offs);
    }
    free(o->ch);
    free(o->tools_json);
    free(o);
}

uint32_t kvt_api_out_n_calls(const kvt_api_out *o, uint32_t choice) {
    return choice < o->o.n_choices ? o->ch[choice].n_calls : 0;
}

/* A token's text as a JSON-safe string: valid UTF-8 as is, else OpenAI's "bytes:\xNN..." form. */
static int token_text(const kvt_tokenizer *tok, int32_t id, char *buf, size_t cap, char *shown, size_t shown_cap) {
    int32_t n = tok ? kvt_token_to_bytes(tok, id, true, buf, (int32_t)cap) : 0;
    if (n < 0) n = 0;
    if ((size_t)n > cap) n = (int32_t)cap;
    if (kvt_utf8_valid(buf, (size_t)n) && !memchr(buf, '\0', (size_t)n)) {
        snprintf(shown, shown_cap, "%.*s", n, buf);
    } else {
        size_t k = (size_t)snprintf(shown, shown_cap, "bytes:");
        for (int32_t i = 0; i < n && k + 5 < shown_cap; i++)
            k += (size_t)snprintf(shown + k, shown_cap - k, "\\x%02x", (unsigned char)buf[i]);
    }
    return n;
}

static double lp_num(float x) { return isfinite(x) ? (double)x : -9999.0; }

static cJSON *lp_entry(const kvt_tokenizer *tok, int32_t id, float lp, bool with_bytes) {
    char buf[256], shown[1100];
    int n = token_text(tok, id, buf, sizeof buf, shown, sizeof shown);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", shown);
    cJSON_AddNumberToObject(e, "logprob", lp_num(lp));
    if (with_bytes) {
        cJSON *b = cJSON_AddArrayToObject(e, "bytes");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    }
    return e;
}

void kvt_api_out_logprobs(kvt_api_out *o, uint32_t choice, const kvt_token_logprobs *lp) {
    if (!o->o.logprobs || choice >= o->o.n_choices) return;
    out_choice *c = &o->ch[choice];
    const uint32_t k = KVT_MIN(lp->n_top, o->o.top_logprobs);
    if (o->o.kind == KVT_API_CHAT) {
        cJSON *e = lp_entry(o->o.tok, lp->id, lp->logprob, true);
        cJSON *t = cJSON_AddArrayToObject(e, "top_logprobs");
        for (uint32_t i = 0; i < k; i++) cJSON_AddItemToArray(t, lp_entry(o->o.tok, lp->top_ids[i], lp->top_lps[i], true));
        cJSON_AddItemToArray(o->o.stream ? c->lp_pending : c->lp_all, e);
        return;
    }
    char buf[256], shown[1100];
    int n = token_text(o->o.tok, lp->id, buf, sizeof buf, shown, sizeof shown);
    cJSON_AddItemToArray(c->c_tokens, cJSON_CreateString(shown));
    cJSON_AddItemToArray(c->c_lps, cJSON_CreateNumber(lp_num(lp->logprob)));
    cJSON_AddItemToArray(c->c_offs, cJSON_CreateNumber((double)c->text_off));
    c->text_off += (size_t)n;
    cJSON *tops = cJSON_CreateObject();
    for (uint32_t i = 0; i < k; i++) {
        token_text(o->o.tok, lp->top_ids[i], buf, sizeof buf, shown, sizeof shown);
        if (!cJSON_GetObjectItemCaseSensitive(tops, shown))
            cJSON_AddNumberToObject(tops, shown, lp_num(lp->top_lps[i]));
    }
    cJSON_AddItemToArray(c->c_tops, tops);
}

/* Moves the completions arrays into a logprobs object (and fresh arrays in their place). */
static cJSON *take_completion_lps(out_choice *c) {
    cJSON *l = cJSON_CreateObject();
    cJSON_AddItemToObject(l, "tokens", c->c_tokens);
    cJSON_AddItemToObject(l, "token_logprobs", c->c_lps);
    cJSON_AddItemToObject(l, "top_logprobs", c->c_tops);
    cJSON_AddItemToObject(l, "text_offset", c->c_offs);
    c->c_tokens = cJSON_CreateArray();
    c->c_lps = cJSON_CreateArray();
    c->c_tops = cJSON_CreateArray();
    c->c_offs = cJSON_CreateArray();
    return l;
}

static void sb_add_sse(kvt_strbuf *sb, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) {
        sb->oom = true;
        return;
    }
    kvt_strbuf_addstr(sb, "data: ");
    kvt_strbuf_addstr(sb, s);
    kvt_strbuf_addstr(sb, "\n\n");
    free(s);
}

/* A streaming chunk for one choice: returns the root; *delta = the chat delta (NULL for completions). */
static cJSON *chunk_for(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t idx, cJSON **delta, cJSON **choice) {
    bool chat = o->o.kind == KVT_API_CHAT;
    cJSON *root = resp_head(ri, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", idx);
    *delta = chat ? cJSON_AddObjectToObject(c, "delta") : NULL;
    *choice = c;
    return root;
}

/* Attaches the pending logprobs of a choice to a streaming chunk's choice object. */
static void chunk_lps(kvt_api_out *o, out_choice *c, cJSON *choice) {
    if (!o->o.logprobs) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    if (o->o.kind == KVT_API_CHAT) {
        cJSON *l = cJSON_AddObjectToObject(choice, "logprobs");
        cJSON_AddItemToObject(l, "content", c->lp_pending);
        c->lp_pending = cJSON_CreateArray();
    } else {
        cJSON_AddItemToObject(choice, "logprobs", take_completion_lps(c));
    }
}

static void on_tc_event(void *ctx, const kvt_tc_event *ev) {
    kvt_api_out *o = ctx;
    out_choice *c = &o->ch[o->cur];
    if (ev->kind == KVT_TC_CALL && !o->o.parallel_tool_calls && c->n_calls >= 1) return;
    if (!o->o.stream) {
        if (ev->kind == KVT_TC_CONTENT) kvt_strbuf_add(&c->content, ev->text, ev->len);
        else if (ev->kind == KVT_TC_REASONING) kvt_strbuf_add(&c->reasoning, ev->text, ev->len);
        else {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "id", ev->id);
            cJSON_AddStringToObject(t, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(t, "function");
            cJSON_AddStringToObject(f, "name", ev->name);
            cJSON_AddStringToObject(f, "arguments", ev->arguments);
            cJSON_AddItemToArray(c->calls, t);
            c->n_calls++;
        }
        return;
    }
    cJSON *delta, *choice;
    if (ev->kind == KVT_TC_CALL) {
        /* OpenAI's order: the call's head (index, id, type, name, empty arguments), then its arguments */
        cJSON *root = chunk_for(o, o->cur_ri, o->cur, &delta, &choice);
        cJSON *arr = cJSON_AddArrayToObject(delta, "tool_calls");
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, t);
        cJSON_AddNumberToObject(t, "index", c->n_calls);
        cJSON_AddStringToObject(t, "id", ev->id);
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "name", ev->name);
        cJSON_AddStringToObject(f, "arguments", "");
        chunk_lps(o, c, choice);
        cJSON_AddNullToObject(choice, "finish_reason");
        sb_add_sse(o->cur_sb, root);
        root = chunk_for(o, o->cur_ri, o->cur, &delta, &choice);
        arr = cJSON_AddArrayToObject(delta, "tool_calls");
        t = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, t);
        cJSON_AddNumberToObject(t, "index", c->n_calls);
        f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "arguments", ev->arguments);
        cJSON_AddNullToObject(choice, "logprobs");
        cJSON_AddNullToObject(choice, "finish_reason");
        sb_add_sse(o->cur_sb, root);
        c->n_calls++;
        return;
    }
    cJSON *root = chunk_for(o, o->cur_ri, o->cur, &delta, &choice);
    if (delta) cJSON_AddItemToObject(delta, ev->kind == KVT_TC_REASONING ? "reasoning_content" : "content", str_n(ev->text, ev->len));
    else cJSON_AddItemToObject(choice, "text", str_n(ev->text, ev->len));
    chunk_lps(o, c, choice);
    cJSON_AddNullToObject(choice, "finish_reason");
    sb_add_sse(o->cur_sb, root);
}

void kvt_api_out_begin(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, kvt_strbuf *sb) {
    if (!o->o.stream || o->o.kind != KVT_API_CHAT || choice >= o->o.n_choices) return;
    cJSON *delta, *ch;
    cJSON *root = chunk_for(o, ri, choice, &delta, &ch);
    cJSON_AddStringToObject(delta, "role", "assistant");
    cJSON_AddStringToObject(delta, "content", "");
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    sb_add_sse(sb, root);
}

void kvt_api_out_text(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, const char *text, size_t len,
                      kvt_strbuf *sb) {
    if (choice >= o->o.n_choices) return;
    out_choice *c = &o->ch[choice];
    o->cur_ri = ri;
    o->cur = choice;
    o->cur_sb = sb;
    if (o->o.kind == KVT_API_CHAT) {
        if (kvt_toolcall_feed(c->tc, text, len, on_tc_event, o) != KVT_OK) sb->oom = true;
        return;
    }
    if (!o->o.stream) {
        kvt_strbuf_add(&c->content, text, len);
        return;
    }
    if (!len && !(o->o.logprobs && cJSON_GetArraySize(c->c_tokens))) return;
    kvt_tc_event ev = {.kind = KVT_TC_CONTENT, .text = text, .len = len};
    on_tc_event(o, &ev);
}

static const char *finish_reason(const out_choice *c) {
    if (c->n_calls && c->finish == KVT_FINISH_STOP) return "tool_calls";
    return kvt_api_finish_str(c->finish);
}

void kvt_api_out_end(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, kvt_finish finish, kvt_strbuf *sb) {
    if (choice >= o->o.n_choices) return;
    out_choice *c = &o->ch[choice];
    o->cur_ri = ri;
    o->cur = choice;
    o->cur_sb = sb;
    c->finish = finish;
    if (o->o.kind == KVT_API_CHAT && kvt_toolcall_finish(c->tc, on_tc_event, o) != KVT_OK) sb->oom = true;
    if (!o->o.stream) return;
    cJSON *delta, *ch;
    cJSON *root = chunk_for(o, ri, choice, &delta, &ch);
    if (!delta) cJSON_AddStringToObject(ch, "text", "");
    chunk_lps(o, c, ch);
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(c));
    sb_add_sse(sb, root);
}

void kvt_api_out_usage(const kvt_api_resp_info *ri, kvt_strbuf *sb) {
    cJSON *root = resp_head(ri, ri->kind == KVT_API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, ri);
    sb_add_sse(sb, root);
}

char *kvt_api_out_response(const kvt_api_out *o, const kvt_api_resp_info *ri) {
    bool chat = o->o.kind == KVT_API_CHAT;
    cJSON *root = resp_head(ri, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (uint32_t i = 0; i < o->o.n_choices; i++) {
        out_choice *c = &o->ch[i];
        if (c->content.oom || c->reasoning.oom) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (c->n_calls && c->content.n == 0) cJSON_AddNullToObject(m, "content");
            else cJSON_AddItemToObject(m, "content", str_n(c->content.p ? c->content.p : "", c->content.n));
            if (c->reasoning.n) cJSON_AddItemToObject(m, "reasoning_content", str_n(c->reasoning.p, c->reasoning.n));
            if (c->n_calls) cJSON_AddItemReferenceToObject(m, "tool_calls", c->calls);
            if (o->o.logprobs) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemReferenceToObject(l, "content", c->lp_all);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            cJSON_AddItemToObject(ch, "text", str_n(c->content.p ? c->content.p : "", c->content.n));
            if (o->o.logprobs) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemReferenceToObject(l, "tokens", c->c_tokens);
                cJSON_AddItemReferenceToObject(l, "token_logprobs", c->c_lps);
                cJSON_AddItemReferenceToObject(l, "top_logprobs", c->c_tops);
                cJSON_AddItemReferenceToObject(l, "text_offset", c->c_offs);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        cJSON_AddStringToObject(ch, "finish_reason", finish_reason(c));
    }
    add_usage(root, ri);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
