/* api.c — OpenAI request validation and response/statistics rendering (see server.h). Pure: no
 * engine calls, no network, so everything here is unit-tested directly. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
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
    if (!get_int(root, "n", 1, 1e9, &g, &n, err)) return false;
    if (n != 1) return BAD("n", "only n = 1 is supported");
    if (!get_int(root, "best_of", 1, 1e9, &g, &n, err)) return false;
    if (g && n != 1) return BAD("best_of", "only best_of = 1 is supported");
    bool lp = false;
    if (!get_bool(root, "logprobs", &lp, err)) {
        /* the completions API spells logprobs as an integer count */
        int64_t k = 0;
        if (!get_int(root, "logprobs", 0, 20, &g, &k, err)) return false;
        lp = k > 0;
    }
    if (lp) return BAD("logprobs", "logprobs are not supported");
    if (!get_int(root, "top_logprobs", 0, 20, &g, &i, err)) return false;
    if (g && i > 0) return BAD("top_logprobs", "logprobs are not supported");
    bool echo = false;
    if (!get_bool(root, "echo", &echo, err)) return false;
    if (echo) return BAD("echo", "echo is not supported");
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb)) return BAD("logit_bias", "'logit_bias' must be an object");
        const cJSON *it;
        cJSON_ArrayForEach(it, lb) {
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || fabs(it->valuedouble) > 100)
                return BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        }
        if (lb->child) return BAD("logit_bias", "logit_bias is not supported");
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
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return BAD("messages", "messages[%zu].role '%.40s' is not supported (system, user, assistant)", i, rs);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!c && strcmp(rs, "assistant") != 0) return BAD("messages", "messages[%zu].content is required", i);
        r->msgs[i].role = rs;
        if (!parse_content(c, i, &r->msgs[i], &r->msg_owned[i], err)) return false;
        r->n_msgs++;
    }
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

bool kvt_api_parse(kvt_api_kind kind, const char *body, size_t len, uint32_t n_vocab, cJSON **rootp,
                   kvt_api_req *r, kvt_api_err *err) {
    memset(r, 0, sizeof *r);
    *rootp = NULL;
    r->kind = kind;
    r->max_tokens = -1;
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
    if (ok) ok = parse_sampling(root, r, err);
    if (ok) ok = kind == KVT_API_CHAT ? parse_messages(root, r, err) : parse_prompt(root, r, n_vocab, err);
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

char *kvt_api_response_json(const kvt_api_resp_info *ri, const char *text, size_t text_len) {
    bool chat = ri->kind == KVT_API_CHAT;
    cJSON *root = resp_head(ri, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", str_n(text, text_len));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, text_len));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", kvt_api_finish_str(ri->finish));
    add_usage(root, ri);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static char *sse_wrap(cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, s, n);
        memcpy(out + 6 + n, "\n\n", 3);
    }
    free(s);
    return out;
}

char *kvt_api_chunk_sse(const kvt_api_resp_info *ri, const char *text, size_t text_len, bool first, bool final,
                        bool usage_only) {
    bool chat = ri->kind == KVT_API_CHAT;
    cJSON *root = resp_head(ri, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (usage_only) {
        add_usage(root, ri);
        return sse_wrap(root);
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) {
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
        } else if (text) {
            cJSON_AddItemToObject(d, "content", str_n(text, text_len));
        }
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text ? text : "", text ? text_len : 0));
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (final) cJSON_AddStringToObject(c, "finish_reason", kvt_api_finish_str(ri->finish));
    else cJSON_AddNullToObject(c, "finish_reason");
    return sse_wrap(root);
}

/* ---------------------------------------------------------------------------------------------
 * /stats and /metrics
 * ------------------------------------------------------------------------------------------- */
char *kvt_api_stats_json(const kvt_engine_stats *st, const kvt_server_counters *c, const char *model) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model ? model : "");
    if (st->pc_enabled) {
        cJSON *p = cJSON_AddObjectToObject(root, "prompt_cache");
        cJSON_AddNumberToObject(p, "entries", (double)st->pc_entries);
        cJSON_AddNumberToObject(p, "blocks", (double)st->pc_blocks);
        cJSON_AddNumberToObject(p, "bytes", (double)st->pc_bytes);
        cJSON_AddNumberToObject(p, "max_bytes", (double)st->pc_max_bytes);
        cJSON_AddNumberToObject(p, "hits", (double)st->pc_hits);
        cJSON_AddNumberToObject(p, "misses", (double)st->pc_misses);
        cJSON_AddNumberToObject(p, "reused_tokens", (double)st->pc_reused_tokens);
        cJSON_AddNumberToObject(p, "evictions", (double)st->pc_evictions);
        cJSON *ri = cJSON_AddObjectToObject(p, "reuse_impossible");
        cJSON_AddNumberToObject(ri, "untrimmable", (double)st->pc_reuse_impossible_untrimmable);
        cJSON_AddNumberToObject(ri, "namespace", (double)st->pc_reuse_impossible_namespace);
        cJSON_AddNumberToObject(ri, "budget", (double)st->pc_reuse_impossible_budget);
    } else {
        cJSON_AddNullToObject(root, "prompt_cache");
    }
    if (st->ssd_enabled) {
        cJSON *s = cJSON_AddObjectToObject(root, "ssd_cache");
        cJSON_AddStringToObject(s, "dir", st->ssd_dir);
        cJSON_AddNumberToObject(s, "entries", (double)st->ssd_entries);
        cJSON_AddNumberToObject(s, "bytes", (double)st->ssd_bytes);
        cJSON_AddNumberToObject(s, "max_bytes", (double)st->ssd_max_bytes);
        cJSON_AddNumberToObject(s, "restores", (double)st->ssd_restores);
        cJSON_AddNumberToObject(s, "spills", (double)st->ssd_spills);
        cJSON_AddNumberToObject(s, "restore_ms_last", st->ssd_restore_ms_last);
        cJSON_AddNumberToObject(s, "demotions", (double)st->ssd_demotions);
        cJSON_AddNumberToObject(s, "pending_blocks", (double)st->ssd_pending_blocks);
        cJSON_AddNumberToObject(s, "pending_bytes", (double)st->ssd_pending_bytes);
        cJSON_AddNumberToObject(s, "dropped", (double)st->ssd_dropped);
        cJSON_AddNumberToObject(s, "failed", (double)st->ssd_failed);
        cJSON_AddNumberToObject(s, "longest_durable_prefix_tokens", (double)st->ssd_longest_durable_prefix_tokens);
        cJSON_AddNumberToObject(s, "dirty_records", (double)st->ssd_dirty_records);
        cJSON_AddNumberToObject(s, "shed", (double)st->ssd_shed);
        cJSON_AddNumberToObject(s, "skipped_nonregular", (double)st->ssd_skipped_nonregular);
        cJSON_AddNumberToObject(s, "lost_entries", (double)st->ssd_lost_entries);
        cJSON_AddNumberToObject(s, "dir_recreated", (double)st->ssd_dir_recreated);
    } else {
        cJSON_AddNullToObject(root, "ssd_cache");
    }
    if (st->ckpt_enabled) { /* generation checkpoints (issue 10) */
        cJSON *c = cJSON_AddObjectToObject(root, "generation_checkpoints");
        cJSON_AddNumberToObject(c, "written", (double)st->ckpt_written);
        cJSON_AddNumberToObject(c, "resumed", (double)st->ckpt_resumed);
        cJSON_AddNumberToObject(c, "invalidated", (double)st->ckpt_invalidated);
        cJSON_AddNumberToObject(c, "failed", (double)st->ckpt_failed);
        cJSON_AddNumberToObject(c, "dropped", (double)st->ckpt_dropped);
        cJSON_AddNumberToObject(c, "corrupt_removed", (double)st->ckpt_corrupt);
        cJSON_AddNumberToObject(c, "pending", (double)st->ckpt_pending);
        cJSON_AddNumberToObject(c, "retried", (double)st->ckpt_retried);
        cJSON_AddNumberToObject(c, "resume_reused_tokens", (double)st->ckpt_resume_reused_tokens);
    } else {
        cJSON_AddNullToObject(root, "generation_checkpoints");
    }
    if (st->shared_enabled) { /* shared block tier (issue 17) */
        static const char *const br[] = {"closed", "open", "half-open"};
        cJSON *s = cJSON_AddObjectToObject(root, "shared_cache");
        cJSON_AddNumberToObject(s, "lookups", (double)st->shared_lookups);
        cJSON_AddNumberToObject(s, "hits", (double)st->shared_hits);
        cJSON_AddNumberToObject(s, "fetched_blocks", (double)st->shared_fetched_blocks);
        cJSON_AddNumberToObject(s, "fetched_bytes", (double)st->shared_fetched_bytes);
        cJSON_AddNumberToObject(s, "fetched_tokens", (double)st->shared_fetched_tokens);
        cJSON_AddNumberToObject(s, "published_blocks", (double)st->shared_published_blocks);
        cJSON_AddNumberToObject(s, "published_bytes", (double)st->shared_published_bytes);
        cJSON_AddNumberToObject(s, "publish_existing", (double)st->shared_publish_existing);
        cJSON_AddNumberToObject(s, "dropped", (double)st->shared_dropped);
        cJSON_AddNumberToObject(s, "errors", (double)st->shared_errors);
        cJSON_AddNumberToObject(s, "oom_errors", (double)st->shared_oom_errors);
        cJSON_AddNumberToObject(s, "corrupt", (double)st->shared_corrupt);
        cJSON_AddNumberToObject(s, "skipped", (double)st->shared_skipped);
        cJSON_AddNumberToObject(s, "queue_blocks", (double)st->shared_queue_blocks);
        cJSON_AddNumberToObject(s, "breaker_opens", (double)st->shared_breaker_opens);
        cJSON_AddStringToObject(s, "fetch_breaker", br[st->shared_fetch_breaker % 3]);
        cJSON_AddStringToObject(s, "publish_breaker", br[st->shared_publish_breaker % 3]);
        cJSON_AddNumberToObject(s, "fetched_snapshots", (double)st->shared_fetched_snapshots);
        cJSON_AddNumberToObject(s, "published_snapshots", (double)st->shared_published_snapshots);
        cJSON_AddStringToObject(s, "last_error", st->shared_last_error);
    } else {
        cJSON_AddNullToObject(root, "shared_cache");
    }
    cJSON *kv = cJSON_AddObjectToObject(root, "kv");
    cJSON_AddStringToObject(kv, "scheme", st->scheme);
    cJSON_AddNumberToObject(kv, "pool_used_bytes", (double)st->pool_used_bytes);
    cJSON_AddNumberToObject(kv, "pool_peak_bytes", (double)st->pool_peak_bytes);
    cJSON_AddNumberToObject(kv, "pool_budget_bytes", (double)st->pool_budget_bytes);
    cJSON *rq = cJSON_AddObjectToObject(root, "requests");
    cJSON_AddNumberToObject(rq, "total", (double)c->total);
    cJSON_AddNumberToObject(rq, "ok", (double)c->ok);
    cJSON_AddNumberToObject(rq, "client_errors", (double)c->client_errors);
    cJSON_AddNumberToObject(rq, "server_errors", (double)c->server_errors);
    cJSON_AddNumberToObject(rq, "cancelled", (double)c->cancelled);
    cJSON_AddNumberToObject(rq, "rejected_shutdown", (double)c->rejected_shutdown);
    cJSON_AddNumberToObject(rq, "in_flight", (double)c->in_flight);
    cJSON_AddNumberToObject(rq, "queued", (double)c->queued);
    cJSON_AddNumberToObject(rq, "streamed", (double)c->streamed);
    cJSON_AddNumberToObject(rq, "generations", (double)st->requests);
    cJSON_AddNumberToObject(rq, "prompt_tokens", (double)st->prompt_tokens);
    cJSON_AddNumberToObject(rq, "generated_tokens", (double)st->generated_tokens);
    cJSON_AddNumberToObject(rq, "cached_tokens", (double)st->cached_tokens);
    cJSON *ba = cJSON_AddObjectToObject(root, "batching"); /* docs/batching.md */
    cJSON_AddNumberToObject(ba, "parallel", (double)st->parallel);
    cJSON_AddNumberToObject(ba, "rows_active", (double)st->rows_active);
    cJSON_AddNumberToObject(ba, "rows_queued", (double)st->rows_queued);
    cJSON_AddNumberToObject(ba, "queue_max", (double)st->batch_queue_max);
    cJSON_AddNumberToObject(ba, "steps", (double)st->batch_steps);
    cJSON_AddNumberToObject(ba, "tokens_per_step_last", st->batch_tokens_per_step_last);
    cJSON_AddNumberToObject(ba, "tokens_per_step_avg", st->batch_tokens_per_step_avg);
    cJSON_AddNumberToObject(ba, "prefill_tokens_per_s_1m", st->batch_prefill_tps_1m);
    cJSON_AddNumberToObject(ba, "decode_tokens_per_s_1m", st->batch_decode_tps_1m);
    cJSON_AddNumberToObject(ba, "queue_wait_ms_last", st->queue_wait_ms_last);
    cJSON_AddNumberToObject(ba, "queue_wait_ms_avg", st->queue_wait_ms_avg);
    cJSON_AddNumberToObject(ba, "queue_wait_ms_max", st->queue_wait_ms_max);
    cJSON_AddNumberToObject(ba, "max_decode_stall_ms", st->max_decode_stall_ms);
    cJSON_AddNumberToObject(ba, "max_decode_step_ms", st->max_decode_step_ms);
    cJSON_AddNumberToObject(ba, "memory_waits", (double)st->batch_memory_waits);
    cJSON_AddNumberToObject(ba, "queue_full", (double)st->batch_queue_full);
    cJSON *cn = cJSON_AddObjectToObject(root, "connections");
    cJSON_AddNumberToObject(cn, "open", (double)c->conn_open);
    cJSON_AddNumberToObject(cn, "refused", (double)c->conn_refused);
    cJSON_AddNumberToObject(cn, "evicted", (double)c->conn_evicted);
    cJSON_AddNumberToObject(cn, "timed_out", (double)c->conn_timed_out);
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
    metric(&b, "prompt_cache_entries", "gauge", "Entries in the RAM prompt cache", (double)st->pc_entries);
    metric(&b, "prompt_cache_blocks", "gauge", "KV blocks held by the RAM prompt cache", (double)st->pc_blocks);
    metric(&b, "prompt_cache_bytes", "gauge", "Bytes held by the RAM prompt cache", (double)st->pc_bytes);
    metric(&b, "prompt_cache_max_bytes", "gauge", "RAM prompt cache cap in bytes", (double)st->pc_max_bytes);
    metric(&b, "prompt_cache_hits_total", "counter", "RAM prompt cache lookups that reused tokens", (double)st->pc_hits);
    metric(&b, "prompt_cache_misses_total", "counter", "RAM prompt cache lookups without reuse", (double)st->pc_misses);
    metric(&b, "prompt_cache_reused_tokens_total", "counter", "Prompt tokens reused from the RAM tier",
           (double)st->pc_reused_tokens);
    metric(&b, "prompt_cache_evictions_total", "counter", "RAM prompt cache evictions", (double)st->pc_evictions);
    metric(&b, "prompt_cache_reuse_impossible_untrimmable_total", "counter",
           "Lookups that could not reuse an entry because it cannot be trimmed",
           (double)st->pc_reuse_impossible_untrimmable);
    metric(&b, "prompt_cache_reuse_impossible_namespace_total", "counter",
           "Lookups that could not reuse an entry from another namespace", (double)st->pc_reuse_impossible_namespace);
    metric(&b, "prompt_cache_reuse_impossible_budget_total", "counter",
           "Lookups that could not reuse an entry for lack of pool budget", (double)st->pc_reuse_impossible_budget);
    metric(&b, "ssd_cache_enabled", "gauge", "1 when the SSD tier is on", st->ssd_enabled);
    metric(&b, "ssd_cache_entries", "gauge", "Entries on the SSD tier", (double)st->ssd_entries);
    metric(&b, "ssd_cache_bytes", "gauge", "Bytes on the SSD tier", (double)st->ssd_bytes);
    metric(&b, "ssd_cache_max_bytes", "gauge", "SSD tier cap in bytes (0 = unlimited)", (double)st->ssd_max_bytes);
    metric(&b, "ssd_cache_restores_total", "counter", "Restores from the SSD tier", (double)st->ssd_restores);
    metric(&b, "ssd_cache_spills_total", "counter", "Entries written to the SSD tier", (double)st->ssd_spills);
    metric(&b, "ssd_cache_restore_ms_last", "gauge", "Duration of the last SSD restore in ms", st->ssd_restore_ms_last);
    metric(&b, "ssd_cache_demotions_total", "counter", "Idle demotions to the SSD tier", (double)st->ssd_demotions);
    metric(&b, "ssd_cache_pending_blocks", "gauge", "Blocks queued for the SSD writer", (double)st->ssd_pending_blocks);
    metric(&b, "ssd_cache_pending_bytes", "gauge", "Bytes queued for the SSD writer", (double)st->ssd_pending_bytes);
    metric(&b, "ssd_cache_dropped_total", "counter", "SSD writes dropped (queue budget)", (double)st->ssd_dropped);
    metric(&b, "ssd_cache_failed_total", "counter", "SSD writes that failed", (double)st->ssd_failed);
    metric(&b, "ssd_cache_longest_durable_prefix_tokens", "gauge", "Longest prefix known durable on SSD",
           (double)st->ssd_longest_durable_prefix_tokens);
    /* shared block tier (issue 17) */
    metric(&b, "shared_cache_enabled", "gauge", "1 when the shared (Redis) tier is on", st->shared_enabled);
    metric(&b, "shared_cache_hits_total", "counter", "Requests that reused blocks from the shared tier", (double)st->shared_hits);
    metric(&b, "shared_cache_fetched_blocks_total", "counter", "Blocks fetched from the shared tier", (double)st->shared_fetched_blocks);
    metric(&b, "shared_cache_fetched_bytes_total", "counter", "Bytes fetched from the shared tier", (double)st->shared_fetched_bytes);
    metric(&b, "shared_cache_published_blocks_total", "counter", "Blocks published to the shared tier", (double)st->shared_published_blocks);
    metric(&b, "shared_cache_published_bytes_total", "counter", "Bytes published to the shared tier", (double)st->shared_published_bytes);
    metric(&b, "shared_cache_errors_total", "counter", "Shared tier connection, timeout and protocol errors", (double)st->shared_errors);
    metric(&b, "shared_cache_oom_errors_total", "counter", "Shared tier writes refused for maxmemory (OOM)", (double)st->shared_oom_errors);
    metric(&b, "shared_cache_corrupt_total", "counter", "Shared tier values that failed verification", (double)st->shared_corrupt);
    metric(&b, "shared_cache_fetched_snapshots_total", "counter", "Recurrent-state snapshots fetched from the shared tier",
           (double)st->shared_fetched_snapshots);
    metric(&b, "shared_cache_published_snapshots_total", "counter", "Recurrent-state snapshots published to the shared tier",
           (double)st->shared_published_snapshots);
    metric(&b, "shared_cache_dropped_total", "counter", "Blocks not published (queue bound, breaker open, failure)", (double)st->shared_dropped);
    metric(&b, "shared_cache_breaker_open", "gauge", "1 when a shared tier circuit breaker is not closed",
           (st->shared_fetch_breaker || st->shared_publish_breaker) ? 1.0 : 0.0);
    metric(&b, "generation_checkpoints_written_total", "counter", "Generation checkpoint records published", (double)st->ckpt_written);
    metric(&b, "generation_checkpoints_resumed_total", "counter", "Requests resumed from a generation checkpoint", (double)st->ckpt_resumed);
    metric(&b, "generation_checkpoints_invalidated_total", "counter", "Checkpoints removed at normal completion",
           (double)st->ckpt_invalidated);
    metric(&b, "generation_checkpoints_failed_total", "counter", "Checkpoint writes or removals that failed", (double)st->ckpt_failed);
    metric(&b, "generation_checkpoints_retried_total", "counter", "Checkpoints saved early to replace a failed or dropped record",
           (double)st->ckpt_retried);
    metric(&b, "generation_checkpoints_resume_reused_tokens_total", "counter",
           "Prompt and emitted tokens restored from the tiers (not recomputed) when resuming", (double)st->ckpt_resume_reused_tokens);
    metric(&b, "ssd_cache_dirty_records", "gauge", "Records dropped or failed, awaiting a retry", (double)st->ssd_dirty_records);
    metric(&b, "ssd_cache_shed_total", "counter", "Records given up under memory pressure", (double)st->ssd_shed);
    metric(&b, "ssd_cache_skipped_nonregular_total", "counter", "Cache-file names that were not regular files",
           (double)st->ssd_skipped_nonregular);
    metric(&b, "ssd_cache_lost_entries_total", "counter", "Entries lost because the cache directory was deleted",
           (double)st->ssd_lost_entries);
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
    metric(&b, "kv_pool_used_bytes", "gauge", "KV block pool bytes in use", (double)st->pool_used_bytes);
    metric(&b, "kv_pool_peak_bytes", "gauge", "KV block pool peak bytes", (double)st->pool_peak_bytes);
    metric(&b, "kv_pool_budget_bytes", "gauge", "KV block pool byte budget", (double)st->pool_budget_bytes);
    metric(&b, "http_requests_total", "counter", "HTTP requests answered", (double)c->total);
    metric(&b, "http_requests_ok_total", "counter", "HTTP requests answered with 2xx", (double)c->ok);
    metric(&b, "http_requests_client_errors_total", "counter", "HTTP requests answered with 4xx",
           (double)c->client_errors);
    metric(&b, "http_requests_server_errors_total", "counter", "HTTP requests answered with 5xx",
           (double)c->server_errors);
    metric(&b, "requests_cancelled_total", "counter", "Generations cancelled (client gone or shutdown)",
           (double)c->cancelled);
    metric(&b, "requests_rejected_shutdown_total", "counter", "Requests refused while shutting down",
           (double)c->rejected_shutdown);
    metric(&b, "requests_in_flight", "gauge", "Generation jobs running", (double)c->in_flight);
    metric(&b, "requests_queued", "gauge", "Generation jobs waiting", (double)c->queued);
    metric(&b, "http_connections_open", "gauge", "HTTP connections held", (double)c->conn_open);
    metric(&b, "http_connections_refused_total", "counter", "HTTP connections refused at accept (limits)",
           (double)c->conn_refused);
    metric(&b, "http_connections_evicted_total", "counter",
           "HTTP connections still sending a request closed to make room for a new one", (double)c->conn_evicted);
    metric(&b, "http_connections_timed_out_total", "counter",
           "HTTP connections closed for missing the header or body deadline", (double)c->conn_timed_out);
    metric(&b, "generations_total", "counter", "Engine generations", (double)st->requests);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens processed", (double)st->prompt_tokens);
    metric(&b, "generated_tokens_total", "counter", "Tokens generated", (double)st->generated_tokens);
    metric(&b, "cached_tokens_total", "counter", "Prompt tokens served from a cache tier", (double)st->cached_tokens);
    metric(&b, "batch_parallel", "gauge", "Rows batched per forward step (--parallel)", (double)st->parallel);
    metric(&b, "batch_rows_active", "gauge", "Generations holding a row", (double)st->rows_active);
    metric(&b, "batch_rows_queued", "gauge", "Generations waiting for a row or KV memory", (double)st->rows_queued);
    metric(&b, "batch_steps_total", "counter", "Batched forward steps", (double)st->batch_steps);
    metric(&b, "batch_tokens_per_step", "gauge", "Tokens forwarded in the last step", st->batch_tokens_per_step_last);
    metric(&b, "batch_tokens_per_step_avg", "gauge", "Tokens forwarded per step since start", st->batch_tokens_per_step_avg);
    metric(&b, "batch_prefill_tokens_per_second", "gauge", "Prompt tokens forwarded per second over the last minute",
           st->batch_prefill_tps_1m);
    metric(&b, "batch_decode_tokens_per_second", "gauge", "Generated tokens forwarded per second over the last minute",
           st->batch_decode_tps_1m);
    metric(&b, "batch_queue_wait_ms_last", "gauge", "Queue wait of the last admitted generation (ms)", st->queue_wait_ms_last);
    metric(&b, "batch_queue_wait_ms_avg", "gauge", "Mean queue wait of admitted generations (ms)", st->queue_wait_ms_avg);
    metric(&b, "batch_queue_wait_ms_max", "gauge", "Longest queue wait (ms)", st->queue_wait_ms_max);
    metric(&b, "batch_max_decode_stall_ms", "gauge", "Longest step carrying prefill tokens while rows decoded (ms)",
           st->max_decode_stall_ms);
    metric(&b, "batch_memory_waits_total", "counter", "Generations that waited for KV memory", (double)st->batch_memory_waits);
    metric(&b, "batch_queue_full_total", "counter", "Generations refused because the wait queue was full",
           (double)st->batch_queue_full);
    return kvt_strbuf_take(&b, NULL);
}
