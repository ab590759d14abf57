/* json_schema.c — see json_schema.h.
 *
 * Matcher state machine. A thread is (stage, pos, stack of frames):
 *   stage PREFIX  matching the literal prefix at pos; at its end the root VALUE frame is pushed;
 *   stage VALUE   frames on the stack (top = innermost):
 *     VALUE(node)  expecting a value: one whitespace byte, then the first byte picks the frame
 *                  (anyOf: one thread per alternative; enum/const: LIT over the node's literals);
 *     OBJ          phases OPEN -> (KEY) -> AFTER_KEY -> ':' -> AFTER_VALUE -> ',' -> AFTER_COMMA ...;
 *                  '}' only once every required property was seen;
 *     KEY          a property name: narrowed to the declared names with that prefix (a sorted
 *                  range), or free text when additional properties are allowed;
 *     ARR          phases OPEN / AFTER_VALUE / AFTER_COMMA with the item count (min/maxItems);
 *     STR          string bytes, escapes, code-point count (min/maxLength);
 *     NUM          sign, integer, fraction, exponent (integers: no fraction or exponent);
 *     LIT          a sorted range of literal texts (true/false/null, enum, const).
 *     NUM and LIT end at the first byte that cannot continue them: the frame pops and that byte
 *     is stepped again in the parent.
 *   stage SUFFIX  matching the literal suffix after the root value; DONE at its end.
 * Invariants: (1) a thread exists only if the bytes so far are a prefix of a text the schema
 * accepts (modulo the threads dropped past KVT_JS_MAX_THREADS, which only narrows the language);
 * (2) every frame push checks KVT_JS_MAX_DEPTH, every count its bound (digits, whitespace, key
 * length), so a step is O(threads x depth) and never allocates; (3) complete() is true exactly when
 * the text so far is a whole accepted text. */
#include "json_schema.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64, T_ALL = 127 };
enum { F_VALUE = 1, F_OBJ, F_KEY, F_ARR, F_STR, F_NUM, F_LIT };
enum { S_PREFIX = 0, S_VALUE = 1, S_SUFFIX = 2, S_DONE = 3 };
enum { LIT_TRUE = 0, LIT_FALSE = 1, LIT_NULL = 2 };

#define MAX_DIGITS 16
#define MAX_FREE_KEY 256

typedef struct jnode {
    uint8_t types;
    bool additional;
    uint16_t n_props;
    uint32_t props;      /* first index in prop_* (this node's names, sorted) */
    uint64_t required;   /* bit i: props + i is required */
    int32_t items;
    uint32_t min_items, max_items, min_len, max_len;
    uint32_t n_lits, lits; /* enum / const literals (sorted) */
    uint32_t n_any, any;   /* anyOf alternatives in any_list */
} jnode;

struct kvt_json_schema {
    int refs;            /* cache_mu */
    char *key;           /* cache key text */
    uint64_t hash;
    jnode *nodes;
    uint32_t n_nodes, cap_nodes;
    char **prop_name;
    uint32_t *prop_len;
    int32_t *prop_node;
    uint32_t n_prop, cap_prop;
    char **lit;
    uint32_t *lit_len;
    uint32_t n_lit, cap_lit;
    int32_t *any_list;
    uint32_t n_anyl, cap_anyl;
    int32_t root, any_node;
    char *prefix, *suffix;
    uint32_t prefix_len, suffix_len;
};

typedef struct frame {
    uint8_t kind, phase, ws, flags; /* flags: NUM int-only / KEY free / STR escape state */
    int32_t node;
    uint32_t a, b;  /* OBJ: b = current key's prop (or UINT32_MAX free); KEY/LIT: a..b range; ARR: a count; STR: a count */
    uint64_t used;  /* OBJ: properties seen; KEY/LIT/NUM: position or digit counts */
} frame;

typedef struct thread {
    uint8_t stage, depth;
    uint16_t pad;
    uint32_t pos;
    frame f[KVT_JS_MAX_DEPTH];
} thread;

typedef struct jstate {
    uint32_t n;
    thread t[KVT_JS_MAX_THREADS];
} jstate;

#define THR_SIZE(t) (offsetof(thread, f) + (size_t)(t)->depth * sizeof(frame))

/* ---------------------------------------------------------------------------------------------
 * Compile
 * ------------------------------------------------------------------------------------------- */
typedef struct cctx {
    kvt_json_schema *s;
    char *err;
    size_t errlen;
} cctx;

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t el) {
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * el);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static int32_t new_node(cctx *c) {
    kvt_json_schema *s = c->s;
    if (s->n_nodes >= KVT_JS_MAX_NODES || !grow((void **)&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof(jnode)))
        return -1;
    jnode *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->items = -1;
    n->max_items = UINT32_MAX;
    n->max_len = UINT32_MAX;
    n->additional = true;
    return (int32_t)s->n_nodes++;
}

static int32_t add_lit(cctx *c, const char *text) {
    kvt_json_schema *s = c->s;
    if (!grow((void **)&s->lit, &s->cap_lit, s->n_lit + 1, sizeof(char *))) return -1;
    uint32_t cap2 = s->cap_lit;
    (void)cap2;
    uint32_t *nl = realloc(s->lit_len, (size_t)s->cap_lit * sizeof(uint32_t));
    if (!nl) return -1;
    s->lit_len = nl;
    s->lit[s->n_lit] = strdup(text);
    if (!s->lit[s->n_lit]) return -1;
    s->lit_len[s->n_lit] = (uint32_t)strlen(text);
    return (int32_t)s->n_lit++;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

#define REFUSE(st, ...) (snprintf(c->err, c->errlen, __VA_ARGS__), (st))

static bool known_annotation(const char *k) {
    static const char *const ann[] = {"title", "description", "default", "examples", "$schema", "$id", "strict",
                                      "format", "$comment", "readOnly", "writeOnly", "deprecated", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return true;
    return false;
}

static kvt_status get_count(cctx *c, const cJSON *v, const char *kw, const char *path, uint32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != floor(v->valuedouble))
        return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: '%s' at %s must be a non-negative integer", kw, path);
    *out = (uint32_t)v->valuedouble;
    return KVT_OK;
}

static kvt_status compile(cctx *c, const cJSON *j, const char *path, int depth, int32_t *out);

static kvt_status compile_lits(cctx *c, const cJSON *vals, jnode *n_unused, int32_t node) {
    kvt_json_schema *s = c->s;
    uint32_t first = s->n_lit;
    const cJSON *v;
    cJSON_ArrayForEach(v, vals) {
        char *t = cJSON_PrintUnformatted(v);
        if (!t || add_lit(c, t) < 0) {
            free(t);
            return KVT_ERR_NOMEM;
        }
        free(t);
    }
    uint32_t n = s->n_lit - first;
    qsort(s->lit + first, n, sizeof(char *), cmp_str);
    for (uint32_t i = first; i < s->n_lit; i++) s->lit_len[i] = (uint32_t)strlen(s->lit[i]);
    s->nodes[node].lits = first;
    s->nodes[node].n_lits = n;
    (void)n_unused;
    return KVT_OK;
}

static kvt_status compile(cctx *c, const cJSON *j, const char *path, int depth, int32_t *out) {
    kvt_json_schema *s = c->s;
    if (depth > KVT_JS_MAX_DEPTH - 2) return REFUSE(KVT_ERR_UNSUPPORTED, "JSON schema nested deeper than %d at %s", KVT_JS_MAX_DEPTH - 2, path);
    if (cJSON_IsTrue(j)) {
        *out = s->any_node;
        return KVT_OK;
    }
    if (!cJSON_IsObject(j)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema at %s: a schema must be an object", path);
    int32_t id = new_node(c);
    if (id < 0) return REFUSE(KVT_ERR_UNSUPPORTED, "JSON schema has more than %d nodes", KVT_JS_MAX_NODES);
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        const char *kw = k->string;
        if (known_annotation(kw)) continue;
        if (!strcmp(kw, "type") || !strcmp(kw, "properties") || !strcmp(kw, "required") ||
            !strcmp(kw, "additionalProperties") || !strcmp(kw, "items") || !strcmp(kw, "minItems") ||
            !strcmp(kw, "maxItems") || !strcmp(kw, "enum") || !strcmp(kw, "const") || !strcmp(kw, "anyOf") ||
            !strcmp(kw, "oneOf") || !strcmp(kw, "minLength") || !strcmp(kw, "maxLength"))
            continue;
        return REFUSE(KVT_ERR_UNSUPPORTED, "unsupported JSON schema keyword '%.40s' at %s", kw, path);
    }
    char sub[256];
    uint8_t types = 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (ty) {
        const cJSON *one = ty;
        bool arr = cJSON_IsArray(ty);
        if (arr) one = ty->child;
        if (!arr && !cJSON_IsString(ty)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'type' at %s must be a string or a list", path);
        for (; one; one = arr ? one->next : NULL) {
            if (!cJSON_IsString(one)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'type' at %s must name types", path);
            const char *t = one->valuestring;
            if (!strcmp(t, "object")) types |= T_OBJ;
            else if (!strcmp(t, "array")) types |= T_ARR;
            else if (!strcmp(t, "string")) types |= T_STR;
            else if (!strcmp(t, "number")) types |= T_NUM | T_INT;
            else if (!strcmp(t, "integer")) types |= T_INT;
            else if (!strcmp(t, "boolean")) types |= T_BOOL;
            else if (!strcmp(t, "null")) types |= T_NULL;
            else return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: unknown type '%.40s' at %s", t, path);
            if (!arr) break;
        }
        if (!types) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: empty 'type' at %s", path);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(j, "anyOf");
    const char *any_kw = "anyOf";
    if (!any) any = cJSON_GetObjectItemCaseSensitive(j, "oneOf"), any_kw = "oneOf";
    if (any) {
        if (!cJSON_IsArray(any) || !cJSON_GetArraySize(any))
            return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: '%s' at %s must be a non-empty list", any_kw, path);
        if (ty || cJSON_GetObjectItemCaseSensitive(j, "properties") || cJSON_GetObjectItemCaseSensitive(j, "enum"))
            return REFUSE(KVT_ERR_UNSUPPORTED, "unsupported JSON schema: '%s' beside other constraints at %s", any_kw, path);
        int n = cJSON_GetArraySize(any);
        int32_t alts[64];
        if (n > 64) return REFUSE(KVT_ERR_UNSUPPORTED, "JSON schema '%s' at %s has more than 64 alternatives", any_kw, path);
        int i = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any) {
            snprintf(sub, sizeof sub, "%.200s.%s[%d]", path, any_kw, i);
            kvt_status st = compile(c, a, sub, depth + 1, &alts[i]);
            if (st) return st;
            i++;
        }
        if (!grow((void **)&s->any_list, &s->cap_anyl, s->n_anyl + (uint32_t)n, sizeof(int32_t))) return KVT_ERR_NOMEM;
        s->nodes[id].any = s->n_anyl;
        s->nodes[id].n_any = (uint32_t)n;
        memcpy(s->any_list + s->n_anyl, alts, (size_t)n * sizeof(int32_t));
        s->n_anyl += (uint32_t)n;
        *out = id;
        return KVT_OK;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(j, "const");
    if (en || cn) {
        kvt_status st;
        if (en) {
            if (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))
                return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'enum' at %s must be a non-empty list", path);
            st = compile_lits(c, en, NULL, id);
        } else {
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemReferenceToArray(one, (cJSON *)cn);
            st = compile_lits(c, one, NULL, id);
            cJSON_Delete(one);
        }
        *out = id;
        return st;
    }
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "properties");
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, "items");
    if (!types) types = pr ? T_OBJ : it ? T_ARR : T_ALL;
    s->nodes[id].types = types;
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties");
    if (ap && !cJSON_IsBool(ap))
        return REFUSE(KVT_ERR_UNSUPPORTED, "unsupported JSON schema: 'additionalProperties' as a schema at %s (true or false only)", path);
    s->nodes[id].additional = !ap || cJSON_IsTrue(ap);
    if (pr) {
        if (!cJSON_IsObject(pr)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'properties' at %s must be an object", path);
        int n = cJSON_GetArraySize(pr);
        if (n > KVT_JS_MAX_PROPS) return REFUSE(KVT_ERR_UNSUPPORTED, "JSON schema object at %s has more than %d properties", path, KVT_JS_MAX_PROPS);
        const char *names[KVT_JS_MAX_PROPS];
        int i = 0;
        cJSON_ArrayForEach(k, pr) {
            for (const char *q = k->string; *q; q++)
                if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
                    return REFUSE(KVT_ERR_UNSUPPORTED, "unsupported JSON schema: property name at %s needs escaping", path);
            names[i++] = k->string;
        }
        qsort(names, (size_t)n, sizeof(char *), cmp_str);
        for (i = 1; i < n; i++)
            if (!strcmp(names[i], names[i - 1])) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: property '%.40s' twice at %s", names[i], path);
        uint32_t base = s->n_prop;
        if (!grow((void **)&s->prop_name, &s->cap_prop, base + (uint32_t)n, sizeof(char *))) return KVT_ERR_NOMEM;
        uint32_t *pl = realloc(s->prop_len, (size_t)s->cap_prop * sizeof(uint32_t));
        if (!pl) return KVT_ERR_NOMEM;
        s->prop_len = pl;
        int32_t *pn = realloc(s->prop_node, (size_t)s->cap_prop * sizeof(int32_t));
        if (!pn) return KVT_ERR_NOMEM;
        s->prop_node = pn;
        s->n_prop += (uint32_t)n;
        for (i = 0; i < n; i++) {
            s->prop_name[base + i] = strdup(names[i]);
            if (!s->prop_name[base + i]) return KVT_ERR_NOMEM;
            s->prop_len[base + i] = (uint32_t)strlen(names[i]);
            s->prop_node[base + i] = -1;
        }
        s->nodes[id].props = base;
        s->nodes[id].n_props = (uint16_t)n;
        for (i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%.180s.properties.%.60s", path, names[i]);
            int32_t ch;
            kvt_status st = compile(c, cJSON_GetObjectItemCaseSensitive(pr, s->prop_name[base + i]), sub, depth + 1, &ch);
            if (st) return st;
            s->prop_node[base + i] = ch;
        }
    }
    const cJSON *rq = cJSON_GetObjectItemCaseSensitive(j, "required");
    if (rq) {
        if (!cJSON_IsArray(rq)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'required' at %s must be a list", path);
        const cJSON *r;
        cJSON_ArrayForEach(r, rq) {
            if (!cJSON_IsString(r)) return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: 'required' at %s must list names", path);
            const jnode *nd = &s->nodes[id];
            uint32_t i = 0;
            while (i < nd->n_props && strcmp(s->prop_name[nd->props + i], r->valuestring)) i++;
            if (i == nd->n_props)
                return REFUSE(KVT_ERR_UNSUPPORTED, "unsupported JSON schema: required '%.40s' at %s is not in 'properties'", r->valuestring, path);
            s->nodes[id].required |= 1ull << i;
        }
    }
    if (it) {
        snprintf(sub, sizeof sub, "%.200s.items", path);
        int32_t ch;
        kvt_status st = compile(c, it, sub, depth + 1, &ch);
        if (st) return st;
        s->nodes[id].items = ch;
    }
    const cJSON *v;
    kvt_status st;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "minItems")) && (st = get_count(c, v, "minItems", path, &s->nodes[id].min_items))) return st;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "maxItems")) && (st = get_count(c, v, "maxItems", path, &s->nodes[id].max_items))) return st;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "minLength")) && (st = get_count(c, v, "minLength", path, &s->nodes[id].min_len))) return st;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "maxLength")) && (st = get_count(c, v, "maxLength", path, &s->nodes[id].max_len))) return st;
    if (s->nodes[id].min_items > s->nodes[id].max_items || s->nodes[id].min_len > s->nodes[id].max_len)
        return REFUSE(KVT_ERR_INVALID_ARG, "invalid JSON schema: minimum above maximum at %s", path);
    *out = id;
    return KVT_OK;
}

static void schema_free(kvt_json_schema *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_prop; i++) free(s->prop_name[i]);
    for (uint32_t i = 0; i < s->n_lit; i++) free(s->lit[i]);
    free(s->prop_name);
    free(s->prop_len);
    free(s->prop_node);
    free(s->lit);
    free(s->lit_len);
    free(s->any_list);
    free(s->nodes);
    free(s->prefix);
    free(s->suffix);
    free(s->key);
    free(s);
}

static kvt_status schema_build(const cJSON *schema, const char *prefix, const char *suffix, kvt_json_schema **out,
                               char *err, size_t errlen) {
    kvt_json_schema *s = calloc(1, sizeof *s);
    if (!s) return KVT_ERR_NOMEM;
    cctx c = {.s = s, .err = err, .errlen = errlen};
    s->prefix = strdup(prefix ? prefix : "");
    s->suffix = strdup(suffix ? suffix : "");
    kvt_status st = KVT_ERR_NOMEM;
    if (!s->prefix || !s->suffix) goto fail;
    s->prefix_len = (uint32_t)strlen(s->prefix);
    s->suffix_len = (uint32_t)strlen(s->suffix);
    /* built-in literals true / false / null at LIT_TRUE.. */
    if (add_lit(&c, "true") < 0 || add_lit(&c, "false") < 0 || add_lit(&c, "null") < 0) goto fail;
    s->any_node = new_node(&c);
    if (s->any_node < 0) goto fail;
    s->nodes[s->any_node].types = T_ALL;
    s->nodes[s->any_node].items = s->any_node;
    if (schema) {
        st = compile(&c, schema, "$", 0, &s->root);
        if (st) goto fail;
    } else { /* json_object: any object */
        s->root = new_node(&c);
        if (s->root < 0) goto fail;
        s->nodes[s->root].types = T_OBJ;
    }
    s->refs = 1;
    *out = s;
    return KVT_OK;
fail:
    if (st == KVT_ERR_NOMEM) snprintf(err, errlen, "out of memory");
    schema_free(s);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Cache of compiled schemas (by the hash of schema text + prefix + suffix)
 * ------------------------------------------------------------------------------------------- */
#define CACHE_N 32
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static kvt_json_schema *cache[CACHE_N];
static uint64_t cache_used[CACHE_N], cache_clock;

kvt_status kvt_json_schema_get(const cJSON *schema, const char *prefix, const char *suffix, kvt_json_schema **out,
                               char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = '\0';
    char *txt = schema ? cJSON_PrintUnformatted(schema) : strdup("<object>");
    if (!txt) return KVT_ERR_NOMEM;
    size_t tl = strlen(txt), pl = prefix ? strlen(prefix) : 0, sl = suffix ? strlen(suffix) : 0;
    char *key = malloc(tl + pl + sl + 3);
    if (!key) {
        free(txt);
        return KVT_ERR_NOMEM;
    }
    memcpy(key, txt, tl);
    key[tl] = '\x01';
    memcpy(key + tl + 1, prefix ? prefix : "", pl);
    key[tl + 1 + pl] = '\x01';
    memcpy(key + tl + 2 + pl, suffix ? suffix : "", sl);
    key[tl + pl + sl + 2] = '\0';
    free(txt);
    uint64_t h = XXH3_64bits(key, strlen(key));
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < CACHE_N; i++)
        if (cache[i] && cache[i]->hash == h && !strcmp(cache[i]->key, key)) {
            cache[i]->refs++;
            cache_used[i] = ++cache_clock;
            *out = cache[i];
            pthread_mutex_unlock(&cache_mu);
            free(key);
            return KVT_OK;
        }
    pthread_mutex_unlock(&cache_mu);
    kvt_json_schema *s;
    kvt_status st = schema_build(schema, prefix, suffix, &s, err, errlen);
    if (st) {
        free(key);
        return st;
    }
    s->key = key;
    s->hash = h;
    pthread_mutex_lock(&cache_mu);
    int slot = 0;
    for (int i = 1; i < CACHE_N; i++)
        if (!cache[i] || (cache[slot] && cache_used[i] < cache_used[slot])) slot = cache[slot] ? i : slot;
    if (cache[slot] && --cache[slot]->refs == 0) schema_free(cache[slot]);
    cache[slot] = s;
    cache_used[slot] = ++cache_clock;
    s->refs++; /* the cache's reference */
    pthread_mutex_unlock(&cache_mu);
    *out = s;
    return KVT_OK;
}

void kvt_json_schema_release(kvt_json_schema *s) {
    if (!s) return;
    pthread_mutex_lock(&cache_mu);
    bool last = --s->refs == 0;
    pthread_mutex_unlock(&cache_mu);
    if (last) schema_free(s);
}

/* ---------------------------------------------------------------------------------------------
 * Matcher
 * ------------------------------------------------------------------------------------------- */
static bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Continuation bytes a UTF-8 lead byte announces; -1 for bytes that cannot start a character. */
static int utf8_cont(uint8_t c) {
    if (c < 0x80) return 0;
    if (c >= 0xc2 && c <= 0xdf) return 1;
    if (c >= 0xe0 && c <= 0xef) return 2;
    if (c >= 0xf0 && c <= 0xf4) return 3;
    return -1;
}

/* The range code of the byte after lead byte c (0: any continuation; 1..4: the narrower second-byte
 * ranges that exclude overlongs, surrogates and code points past U+10FFFF). */
static uint8_t utf8_second(uint8_t c) { return c == 0xe0 ? 1 : c == 0xed ? 2 : c == 0xf0 ? 3 : c == 0xf4 ? 4 : 0; }

static bool utf8_cont_ok(uint8_t code, uint8_t c) {
    static const uint8_t lo[5] = {0x80, 0xa0, 0x80, 0x90, 0x80}, hi[5] = {0xbf, 0xbf, 0x9f, 0xbf, 0x8f};
    return c >= lo[code] && c <= hi[code];
}

static void emit(jstate *out, const thread *t) {
    if (out->n >= KVT_JS_MAX_THREADS) return; /* dropped: the language only narrows (invariant 1) */
    size_t sz = THR_SIZE(t);
    for (uint32_t i = 0; i < out->n; i++)
        if (out->t[i].depth == t->depth && !memcmp(&out->t[i], t, sz)) return;
    memcpy(&out->t[out->n++], t, sz);
}

static bool push(thread *t, uint8_t kind, int32_t node) {
    if (t->depth >= KVT_JS_MAX_DEPTH) return false;
    frame *f = &t->f[t->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->node = node;
    return true;
}

/* The top frame's value is complete: pop it and move the parent on. */
static void value_done(const kvt_json_schema *s, thread *t) {
    t->depth--;
    if (t->depth == 0) {
        t->stage = s->suffix_len ? S_SUFFIX : S_DONE;
        t->pos = 0;
    }
    /* OBJ / ARR parents already sit in their AFTER_VALUE phase */
}

static void step(const kvt_json_schema *s, const thread *in, uint8_t c, jstate *out);

/* A NUM or LIT frame that cannot take c ends; c is stepped again in the parent. */
static void end_and_restep(const kvt_json_schema *s, const thread *in, uint8_t c, jstate *out) {
    thread t;
    memcpy(&t, in, THR_SIZE(in));
    value_done(s, &t);
    step(s, &t, c, out);
}

static bool num_complete(const frame *f) { return f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8; }

static bool lit_complete(const kvt_json_schema *s, const frame *f) {
    for (uint32_t i = f->a; i < f->b; i++)
        if (s->lit_len[i] == f->used) return true;
    return false;
}

static void step(const kvt_json_schema *s, const thread *in, uint8_t c, jstate *out) {
    thread t;
    memcpy(&t, in, THR_SIZE(in));
    if (t.stage == S_PREFIX) {
        if (c != (uint8_t)s->prefix[t.pos]) return;
        if (++t.pos == s->prefix_len) {
            t.stage = S_VALUE;
            push(&t, F_VALUE, s->root);
        }
        emit(out, &t);
        return;
    }
    if (t.stage == S_SUFFIX) {
        if (c != (uint8_t)s->suffix[t.pos]) return;
        if (++t.pos == s->suffix_len) t.stage = S_DONE;
        emit(out, &t);
        return;
    }
    if (t.stage != S_VALUE || t.depth == 0) return;
    frame *f = &t.f[t.depth - 1];
    const jnode *nd = &s->nodes[f->node];
    switch (f->kind) {
    case F_VALUE:
        if (nd->n_any) {
            for (uint32_t i = 0; i < nd->n_any; i++) {
                thread a;
                memcpy(&a, &t, THR_SIZE(&t));
                a.f[a.depth - 1].node = s->any_list[nd->any + i];
                step(s, &a, c, out);
            }
            return;
        }
        if (is_ws(c)) {
            if (f->ws++ >= 1) return;
            emit(out, &t);
            return;
        }
        if (nd->n_lits) {
            f->kind = F_LIT;
            f->a = nd->lits;
            f->b = nd->lits + nd->n_lits;
            f->used = 0;
            f->ws = 0;
            step(s, &t, c, out);
            return;
        }
        f->ws = 0;
        f->phase = 0;
        f->a = f->b = 0;
        f->used = 0;
        if (c == '{' && (nd->types & T_OBJ)) {
            f->kind = F_OBJ;
            emit(out, &t);
        } else if (c == '[' && (nd->types & T_ARR)) {
            f->kind = F_ARR;
            emit(out, &t);
        } else if (c == '"' && (nd->types & T_STR)) {
            f->kind = F_STR;
            emit(out, &t);
        } else if ((c == '-' || is_digit(c)) && (nd->types & (T_NUM | T_INT))) {
            f->kind = F_NUM;
            f->flags = !(nd->types & T_NUM);
            step(s, &t, c, out);
        } else if ((c == 't' || c == 'f') && (nd->types & T_BOOL)) {
            f->kind = F_LIT;
            f->a = c == 't' ? LIT_TRUE : LIT_FALSE;
            f->b = f->a + 1;
            step(s, &t, c, out);
        } else if (c == 'n' && (nd->types & T_NULL)) {
            f->kind = F_LIT;
            f->a = LIT_NULL;
            f->b = f->a + 1;
            step(s, &t, c, out);
        }
        return;
    case F_LIT: {
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t i = f->a; i < f->b; i++)
            if (s->lit_len[i] > f->used && (uint8_t)s->lit[i][f->used] == c) {
                if (lo == UINT32_MAX) lo = i;
                hi = i + 1;
            }
        if (lit_complete(s, f)) end_and_restep(s, &t, c, out);
        if (lo != UINT32_MAX) {
            f->a = lo;
            f->b = hi;
            f->used++;
            emit(out, &t);
        }
        return;
    }
    case F_STR:
        if (f->flags == 1) { /* after a backslash */
            if (c == 'u') f->flags = 14;
            else if (strchr("\"\\/bfnrt", c) && c) f->flags = 0;
            else return;
            emit(out, &t);
            return;
        }
        if (f->flags >= 11) { /* \uXXXX: flags - 10 hex digits left */
            if (!is_hex(c)) return;
            f->flags = f->flags == 11 ? 0 : f->flags - 1;
            emit(out, &t);
            return;
        }
        if (f->b) { /* inside a UTF-8 sequence: b continuation bytes still due (ws: the next one's range) */
            if (!utf8_cont_ok(f->ws, c)) return;
            f->b--;
            f->ws = 0;
            emit(out, &t);
            return;
        }
        if (c == '"') {
            if (f->a < nd->min_len) return;
            value_done(s, &t);
            emit(out, &t);
            return;
        }
        int cont = utf8_cont(c);
        if (c < 0x20 || cont < 0 || f->a >= nd->max_len) return;
        f->a++;
        f->b = (uint32_t)cont;
        f->ws = utf8_second(c);
        if (c == '\\') f->flags = 1;
        emit(out, &t);
        return;
    case F_NUM: {
        const bool int_only = f->flags;
        switch (f->phase) {
        case 0:
            if (c == '-') f->phase = 1;
            else if (c == '0') f->phase = 3;
            else if (is_digit(c)) f->phase = 2, f->a = 1;
            else return;
            emit(out, &t);
            return;
        case 1:
            if (c == '0') f->phase = 3;
            else if (is_digit(c)) f->phase = 2, f->a = 1;
            else return;
            emit(out, &t);
            return;
        case 2:
        case 3:
            if (f->phase == 2 && is_digit(c)) {
                if (++f->a > MAX_DIGITS) return;
                emit(out, &t);
                return;
            }
            if (!int_only && c == '.') {
                f->phase = 4;
                emit(out, &t);
                return;
            }
            if (!int_only && (c == 'e' || c == 'E')) {
                f->phase = 6;
                emit(out, &t);
                return;
            }
            end_and_restep(s, &t, c, out);
            return;
        case 4:
            if (!is_digit(c)) return;
            f->phase = 5;
            f->b = 1;
            emit(out, &t);
            return;
        case 5:
            if (is_digit(c)) {
                if (++f->b > MAX_DIGITS) return;
                emit(out, &t);
                return;
            }
            if (c == 'e' || c == 'E') {
                f->phase = 6;
                emit(out, &t);
                return;
            }
            end_and_restep(s, &t, c, out);
            return;
        case 6:
            if (c == '+' || c == '-') f->phase = 7;
            else if (is_digit(c)) f->phase = 8, f->used = 1;
            else return;
            emit(out, &t);
            return;
        case 7:
            if (!is_digit(c)) return;
            f->phase = 8;
            f->used = 1;
            emit(out, &t);
            return;
        case 8:
            if (is_digit(c)) {
                if (++f->used > 3) return;
                emit(out, &t);
                return;
            }
            end_and_restep(s, &t, c, out);
            return;
        }
        return;
    }
    case F_OBJ: {
        const bool more = nd->additional || (nd->n_props && (f->used != (nd->n_props == 64 ? ~0ull : (1ull << nd->n_props) - 1)));
        const uint64_t req = nd->required;
        if (is_ws(c) && f->phase != 2) {
            if (f->ws++ >= 1) return;
            emit(out, &t);
            return;
        }
        switch (f->phase) {
        case 0: /* OPEN */
        case 4: /* AFTER_COMMA */
            if (c == '}' && f->phase == 0 && (req & ~f->used) == 0) {
                value_done(s, &t);
                emit(out, &t);
                return;
            }
            if (c != '"' || (f->phase == 0 && !more)) return;
            f->ws = 0;
            if (!push(&t, F_KEY, f->node)) return;
            {
                frame *k = &t.f[t.depth - 1];
                k->a = nd->props;
                k->b = nd->props + nd->n_props;
                k->flags = nd->additional; /* free keys allowed */
                /* narrow away used names now: a KEY frame checks 'used' at its end */
            }
            emit(out, &t);
            return;
        case 1: /* AFTER_KEY */
            if (c != ':') return;
            f->ws = 0;
            f->phase = 3;
            if (!push(&t, F_VALUE, f->b == UINT32_MAX ? s->any_node : s->prop_node[f->b])) return;
            emit(out, &t);
            return;
        case 3: /* AFTER_VALUE */
            if (c == ',' && more) {
                f->ws = 0;
                f->phase = 4;
                emit(out, &t);
            } else if (c == '}' && (req & ~f->used) == 0) {
                value_done(s, &t);
                emit(out, &t);
            }
            return;
        }
        return;
    }
    case F_KEY: {
        /* declared names still unused narrow the range; free keys (additional properties) may be
         * any text without escapes, so no path here can dead-end (invariant 1) */
        frame *o = &t.f[t.depth - 2];
        const jnode *on = &s->nodes[o->node];
        const uint32_t pos = (uint32_t)f->used;
        const bool free_key = f->flags & 1;
        bool was_cont = false;
        if (f->phase) { /* continuation bytes of a UTF-8 character still due (ws: the next one's range) */
            if (!utf8_cont_ok(f->ws, c)) return;
            f->phase--;
            f->ws = 0;
            was_cont = true;
        } else if (c == '"') {
            for (uint32_t i = f->a; i < f->b; i++)
                if (s->prop_len[i] == pos && !(o->used & (1ull << (i - on->props)))) {
                    o->used |= 1ull << (i - on->props);
                    o->b = i;
                    t.depth--;
                    o->phase = 1;
                    o->ws = 0;
                    emit(out, &t);
                    return;
                }
            if (!free_key) return;
            o->b = UINT32_MAX;
            t.depth--;
            o->phase = 1;
            o->ws = 0;
            emit(out, &t);
            return;
        }
        if (!was_cont) {
            const int cont = utf8_cont(c);
            if (c < 0x20 || c == '\\' || cont < 0) return;
            /* a character starts only if all its bytes fit the key bound: a lead byte at the
             * bound's last bytes would leave no continuation allowed (a dead end, against
             * invariant 1) */
            if (pos + 1 + (uint32_t)cont > MAX_FREE_KEY) return;
            f->phase = (uint8_t)cont;
            f->ws = utf8_second(c);
        }
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t i = f->a; i < f->b; i++)
            if (s->prop_len[i] > pos && (uint8_t)s->prop_name[i][pos] == c && !(o->used & (1ull << (i - on->props)))) {
                if (lo == UINT32_MAX) lo = i;
                hi = i + 1;
            }
        if (lo == UINT32_MAX) {
            if (!free_key) return;
            f->a = f->b = 0; /* no declared name any more: a free key */
        } else {
            f->a = lo;
            f->b = hi;
        }
        f->used++;
        emit(out, &t);
        return;
    }
    case F_ARR: {
        const int32_t item = nd->items >= 0 ? nd->items : s->any_node;
        if (is_ws(c)) {
            if (f->ws++ >= 1) return;
            emit(out, &t);
            return;
        }
        if (f->phase == 1) { /* AFTER_VALUE */
            if (c == ',' && f->a < nd->max_items) {
                f->phase = 2;
                f->ws = 0;
                emit(out, &t);
            } else if (c == ']' && f->a >= nd->min_items) {
                value_done(s, &t);
                emit(out, &t);
            }
            return;
        }
        if (f->phase == 0 && c == ']') { /* OPEN */
            if (nd->min_items == 0) {
                value_done(s, &t);
                emit(out, &t);
            }
            return;
        }
        if (f->a >= nd->max_items) return;
        f->a++;
        f->phase = 1;
        f->ws = 0;
        if (!push(&t, F_VALUE, item)) return;
        step(s, &t, c, out);
        return;
    }
    default: return;
    }
}

static bool thread_complete(const kvt_json_schema *s, const thread *t) {
    if (t->stage == S_DONE) return true;
    if (t->stage != S_VALUE || t->depth != 1 || s->suffix_len) return false;
    const frame *f = &t->f[0];
    return (f->kind == F_NUM && num_complete(f)) || (f->kind == F_LIT && lit_complete(s, f));
}

static void state_init(const kvt_json_schema *s, jstate *st) {
    st->n = 1;
    thread *t = &st->t[0];
    memset(t, 0, sizeof *t);
    if (s->prefix_len) {
        t->stage = S_PREFIX;
    } else {
        t->stage = S_VALUE;
        push(t, F_VALUE, s->root);
    }
}

static void state_step(const kvt_json_schema *s, const jstate *in, uint8_t c, jstate *out) {
    out->n = 0;
    for (uint32_t i = 0; i < in->n; i++) step(s, &in->t[i], c, out);
}

static bool state_complete(const kvt_json_schema *s, const jstate *st) {
    for (uint32_t i = 0; i < st->n; i++)
        if (thread_complete(s, &st->t[i])) return true;
    return false;
}

static bool run_bytes(const kvt_json_schema *s, const char *text, size_t n, jstate *st) {
    jstate *tmp = malloc(sizeof *tmp);
    if (!tmp) return false;
    state_init(s, st);
    for (size_t i = 0; i < n && st->n; i++) {
        state_step(s, st, (uint8_t)text[i], tmp);
        memcpy(st, tmp, offsetof(jstate, t) + tmp->n * sizeof(thread));
    }
    free(tmp);
    return st->n > 0;
}

bool kvt_json_schema_prefix_ok(const kvt_json_schema *s, const char *text, size_t n) {
    jstate *st = malloc(sizeof *st);
    bool ok = st && run_bytes(s, text, n, st);
    free(st);
    return ok;
}

bool kvt_json_schema_accepts(const kvt_json_schema *s, const char *text, size_t n) {
    jstate *st = malloc(sizeof *st);
    bool ok = st && run_bytes(s, text, n, st) && state_complete(s, st);
    free(st);
    return ok;
}

/* ---------------------------------------------------------------------------------------------
 * Vocabulary trie (one per tokenizer, shared)
 * ------------------------------------------------------------------------------------------- */
typedef struct tnode {
    uint32_t child, sibling; /* 0 = none (node 0 is the root) */
    int32_t tok;             /* first token ending here, -1 none */
    uint8_t byte;
} tnode;

typedef struct vocab {
    const kvt_tokenizer *tok;
    uint64_t fp;
    uint32_t n_vocab;
    tnode *nodes;
    uint32_t n_nodes, cap_nodes;
    int32_t *tok_next;  /* further tokens ending at the same node */
    int32_t *eog;       /* end-of-generation ids */
    uint32_t n_eog;
    uint32_t max_len;
    char *bytes;        /* token bytes, concatenated */
    uint32_t *off;      /* n_vocab + 1 offsets into bytes */
    /* the string fast path: a "plain" token is whole valid UTF-8 characters none of which is '"',
     * '\\' or a control character, so inside a string (no escape, no partial character pending) it
     * is allowed exactly when its code points fit the length bound; the others are walked */
    uint8_t *plain;
    uint16_t *cps;      /* code points of a plain token */
    int32_t *walk;      /* the non-plain tokens with bytes */
    uint32_t n_walk;
} vocab;

static pthread_mutex_t vocab_mu = PTHREAD_MUTEX_INITIALIZER;
static vocab *vocab_cached;

static uint64_t vocab_fp(const kvt_tokenizer *t) {
    uint32_t nv = kvt_tokenizer_n_vocab(t);
    uint64_t h = nv;
    char buf[256];
    for (uint32_t i = 0; i < nv; i += 1 + nv / 64) {
        int32_t n = kvt_token_to_bytes(t, (int32_t)i, true, buf, sizeof buf);
        if (n > (int32_t)sizeof buf) n = sizeof buf;
        if (n > 0) h = XXH3_64bits_withSeed(buf, (size_t)n, h);
    }
    return h ^ (uint64_t)(uintptr_t)t;
}

static void vocab_free(vocab *v) {
    if (!v) return;
    free(v->plain);
    free(v->cps);
    free(v->walk);
    free(v->nodes);
    free(v->tok_next);
    free(v->eog);
    free(v->bytes);
    free(v->off);
    free(v);
}

static vocab *vocab_build(const kvt_tokenizer *t) {
    vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->tok = t;
    v->n_vocab = kvt_tokenizer_n_vocab(t);
    v->tok_next = malloc(v->n_vocab * sizeof(int32_t));
    v->eog = malloc(v->n_vocab * sizeof(int32_t));
    v->off = malloc((v->n_vocab + 1) * sizeof(uint32_t));
    size_t cap_b = (size_t)v->n_vocab * 8 + 256, nb = 0;
    v->bytes = malloc(cap_b);
    if (!v->tok_next || !v->eog || !v->off || !v->bytes || !grow((void **)&v->nodes, &v->cap_nodes, 1, sizeof(tnode))) goto fail;
    v->nodes[0] = (tnode){0, 0, -1, 0};
    v->n_nodes = 1;
    char buf[512];
    for (uint32_t id = 0; id < v->n_vocab; id++) {
        v->tok_next[id] = -1;
        v->off[id] = (uint32_t)nb;
        if (kvt_tokenizer_is_eog(t, (int32_t)id)) {
            v->eog[v->n_eog++] = (int32_t)id;
            continue;
        }
        int32_t n = kvt_token_to_bytes(t, (int32_t)id, true, buf, sizeof buf);
        if (n <= 0 || n > (int32_t)sizeof buf || n > 255) continue;
        if (nb + (size_t)n > cap_b) {
            cap_b = (nb + (size_t)n) * 2;
            char *nbuf = realloc(v->bytes, cap_b);
            if (!nbuf) goto fail;
            v->bytes = nbuf;
        }
        memcpy(v->bytes + nb, buf, (size_t)n);
        nb += (size_t)n;
        if ((uint32_t)n > v->max_len) v->max_len = (uint32_t)n;
        uint32_t cur = 0;
        for (int32_t k = 0; k < n; k++) {
            uint8_t b = (uint8_t)buf[k];
            uint32_t ch = v->nodes[cur].child;
            while (ch && v->nodes[ch].byte != b) ch = v->nodes[ch].sibling;
            if (!ch) {
                if (!grow((void **)&v->nodes, &v->cap_nodes, v->n_nodes + 1, sizeof(tnode))) goto fail;
                ch = v->n_nodes++;
                v->nodes[ch] = (tnode){0, v->nodes[cur].child, -1, b};
                v->nodes[cur].child = ch;
            }
            cur = ch;
        }
        v->tok_next[id] = v->nodes[cur].tok;
        v->nodes[cur].tok = (int32_t)id;
    }
    v->off[v->n_vocab] = (uint32_t)nb;
    v->plain = calloc(v->n_vocab, 1);
    v->cps = calloc(v->n_vocab, sizeof(uint16_t));
    v->walk = malloc(v->n_vocab * sizeof(int32_t));
    if (!v->plain || !v->cps || !v->walk) goto fail;
    for (uint32_t id = 0; id < v->n_vocab; id++) {
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[id];
        uint32_t n = v->off[id + 1] - v->off[id], i = 0, cp = 0;
        if (!n) continue;
        bool ok = true;
        while (ok && i < n) {
            const uint8_t ch = b[i];
            const int cont = utf8_cont(ch);
            if (ch < 0x20 || ch == '"' || ch == '\\' || cont < 0 || i + 1 + (uint32_t)cont > n) {
                ok = false;
                break;
            }
            for (int k = 1; k <= cont; k++)
                if (!utf8_cont_ok(k == 1 ? utf8_second(ch) : 0, b[i + (uint32_t)k])) ok = false;
            i += 1 + (uint32_t)cont;
            cp++;
        }
        if (ok) {
            v->plain[id] = 1;
            v->cps[id] = (uint16_t)cp;
        } else {
            v->walk[v->n_walk++] = (int32_t)id;
        }
    }
    return v;
fail:
    vocab_free(v);
    return NULL;
}

/* The shared trie for t (built on first use; a different tokenizer replaces it once no
 * constraint uses it: constraints keep their own reference). */
typedef struct vocab_ref {
    vocab *v;
} vocab_ref;
static int vocab_users;

static vocab *vocab_get(const kvt_tokenizer *t, bool *owned) {
    uint64_t fp = vocab_fp(t);
    pthread_mutex_lock(&vocab_mu);
    if (vocab_cached && vocab_cached->fp == fp && vocab_cached->tok == t) {
        vocab_users++;
        *owned = false;
        vocab *v = vocab_cached;
        pthread_mutex_unlock(&vocab_mu);
        return v;
    }
    pthread_mutex_unlock(&vocab_mu);
    vocab *v = vocab_build(t);
    if (!v) return NULL;
    v->fp = fp;
    pthread_mutex_lock(&vocab_mu);
    if (vocab_users == 0) {
        vocab_free(vocab_cached);
        vocab_cached = v;
        vocab_users++;
        *owned = false;
    } else {
        *owned = true; /* another trie is in use: this one belongs to its constraint */
    }
    pthread_mutex_unlock(&vocab_mu);
    return v;
}

static void vocab_put(vocab *v, bool owned) {
    if (owned) {
        vocab_free(v);
        return;
    }
    pthread_mutex_lock(&vocab_mu);
    vocab_users--;
    pthread_mutex_unlock(&vocab_mu);
}

/* ---------------------------------------------------------------------------------------------
 * Token-level constraint
 * ------------------------------------------------------------------------------------------- */
struct kvt_json_constraint {
    kvt_json_schema *s;
    vocab *v;
    bool v_owned;
    jstate cur;
    jstate *work;        /* one state per trie depth (max_len + 1) */
    uint8_t *allowed;    /* n_vocab flags of the last apply */
    uint32_t n_allowed;
    bool dead;
};

kvt_status kvt_json_constraint_create(const kvt_tokenizer *tok, kvt_json_schema *s, kvt_json_constraint **out) {
    *out = NULL;
    kvt_json_constraint *c = calloc(1, sizeof *c);
    if (!c) return KVT_ERR_NOMEM;
    c->v = vocab_get(tok, &c->v_owned);
    if (!c->v) {
        free(c);
        return KVT_ERR_NOMEM;
    }
    c->work = malloc((size_t)(c->v->max_len + 2) * sizeof(jstate));
    c->allowed = calloc(c->v->n_vocab, 1);
    if (!c->work || !c->allowed) {
        vocab_put(c->v, c->v_owned);
        free(c->work);
        free(c->allowed);
        free(c);
        return KVT_ERR_NOMEM;
    }
    pthread_mutex_lock(&cache_mu);
    s->refs++;
    pthread_mutex_unlock(&cache_mu);
    c->s = s;
    kvt_json_constraint_reset(c);
    *out = c;
    return KVT_OK;
}

void kvt_json_constraint_free(kvt_json_constraint *c) {
    if (!c) return;
    kvt_json_schema_release(c->s);
    vocab_put(c->v, c->v_owned);
    free(c->work);
    free(c->allowed);
    free(c);
}

void kvt_json_constraint_reset(kvt_json_constraint *c) {
    state_init(c->s, &c->cur);
    c->dead = false;
}

uint32_t kvt_json_constraint_n_allowed(const kvt_json_constraint *c) { return c->n_allowed; }

/* Marks every token under trie node `node` (reached with state st at depth d) that keeps a live state. */
static void dfs(kvt_json_constraint *c, uint32_t node, const jstate *st, uint32_t d) {
    const vocab *v = c->v;
    jstate *nx = &c->work[d + 1];
    for (uint32_t ch = v->nodes[node].child; ch; ch = v->nodes[ch].sibling) {
        state_step(c->s, st, v->nodes[ch].byte, nx);
        if (!nx->n) continue;
        for (int32_t id = v->nodes[ch].tok; id >= 0; id = v->tok_next[id]) {
            c->allowed[id] = 1;
            c->n_allowed++;
        }
        if (v->nodes[ch].child) dfs(c, ch, nx, d + 1);
        nx = &c->work[d + 1]; /* (recursion reuses deeper slots only) */
    }
}

/* Inside a string or a free property name (one thread whose top frame is STR, or KEY with free
 * names allowed, no escape or partial character pending): plain tokens by their code points (STR:
 * maxLength) or bytes (KEY: MAX_FREE_KEY), the others walked byte by byte. Same result as dfs(). */
static bool string_fast(kvt_json_constraint *c) {
    const jstate *st = &c->cur;
    if (st->n != 1 || st->t[0].stage != S_VALUE || !st->t[0].depth) return false;
    const frame *f = &st->t[0].f[st->t[0].depth - 1];
    const vocab *v = c->v;
    if (f->kind == F_STR && !f->flags && !f->b) {
        const uint32_t max_len = c->s->nodes[f->node].max_len;
        const uint32_t room = max_len == UINT32_MAX ? UINT32_MAX : max_len - f->a;
        for (uint32_t id = 0; id < v->n_vocab; id++)
            if (v->plain[id] && v->cps[id] <= room) {
                c->allowed[id] = 1;
                c->n_allowed++;
            }
    } else if (f->kind == F_KEY && (f->flags & 1) && !f->phase) {
        const uint32_t room = MAX_FREE_KEY - (uint32_t)f->used;
        for (uint32_t id = 0; id < v->n_vocab; id++)
            if (v->plain[id] && v->off[id + 1] - v->off[id] <= room) {
                c->allowed[id] = 1;
                c->n_allowed++;
            }
    } else {
        return false;
    }
    jstate *a = &c->work[0], *b = &c->work[1];
    for (uint32_t k = 0; k < v->n_walk; k++) {
        const int32_t id = v->walk[k];
        uint32_t i = v->off[id], e = v->off[id + 1];
        if (i == e) continue;
        state_step(c->s, st, (uint8_t)v->bytes[i++], a);
        while (a->n && i < e) {
            state_step(c->s, a, (uint8_t)v->bytes[i++], b);
            jstate *t = a;
            a = b;
            b = t;
        }
        if (a->n) {
            c->allowed[id] = 1;
            c->n_allowed++;
        }
    }
    return true;
}

void kvt_json_constraint_apply(void *ctx, float *logits, uint32_t n_vocab) {
    kvt_json_constraint *c = ctx;
    const vocab *v = c->v;
    memset(c->allowed, 0, v->n_vocab);
    c->n_allowed = 0;
    const bool done = state_complete(c->s, &c->cur);
    if (!c->dead && c->cur.n && !string_fast(c)) dfs(c, 0, &c->cur, 0);
    const bool eog_ok = done || c->dead || c->n_allowed == 0;
    if (eog_ok)
        for (uint32_t i = 0; i < v->n_eog; i++) c->allowed[v->eog[i]] = 1;
    uint32_t n = KVT_MIN(n_vocab, v->n_vocab);
    for (uint32_t i = 0; i < n; i++)
        if (!c->allowed[i]) logits[i] = -INFINITY;
    for (uint32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY;
}

void kvt_json_constraint_accept(void *ctx, int32_t id) {
    kvt_json_constraint *c = ctx;
    const vocab *v = c->v;
    if (id < 0 || (uint32_t)id >= v->n_vocab || c->dead) return;
    uint32_t a = v->off[id], b = v->off[id + 1];
    if (b <= a) return; /* end-of-generation or empty */
    jstate *tmp = &c->work[0];
    for (uint32_t i = a; i < b && !c->dead; i++) {
        state_step(c->s, &c->cur, (uint8_t)v->bytes[i], tmp);
        if (!tmp->n) c->dead = true;
        else memcpy(&c->cur, tmp, offsetof(jstate, t) + tmp->n * sizeof(thread));
    }
}
