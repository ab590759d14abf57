/*
 * jinja_value.c — the interpreter's values with Python's semantics: the arena they live in, ordered
 * dicts, json.loads in, str()/repr()/json.dumps out, ==, ordering and iteration.
 *
 * Invariants:
 *   1. Every value built during a render is allocated from the render's arena; ja_alloc raises
 *      (through the arena's ctx) once the arena's cap is reached, so a render's memory is bounded.
 *   2. A jdict keeps insertion order in k/v; setting an existing key replaces its value in place
 *      (Python dict semantics); idx, when present, indexes every key.
 *   3. Recursive walks (repr, json.dumps, ==, ordering, JSON parsing) carry a depth and raise past
 *      JV_MAX_DEPTH, so a self-nested value cannot exhaust the C stack.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

#define JV_MAX_DEPTH 200
#define CHUNK (64 * 1024)

struct jarena_chunk {
    jarena_chunk *next;
    size_t used, size;
    max_align_t data[];
};

/* Allocates n bytes; zero them when zero is set. */
static void *ja_get(jarena *a, size_t n, bool zero) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->cap && (n > a->cap || a->used > a->cap - n)) {
        if (a->ctx) jraise(a->ctx, "the template used more than %zu bytes of memory (cap)", a->cap);
        return NULL;
    }
    jarena_chunk *h = a->head;
    if (!h || h->size - h->used < n) {
        size_t sz = n > CHUNK / 4 ? n : CHUNK;
        jarena_chunk *c = NULL;
        if (sz == CHUNK && a->spare) { /* reuse a chunk of an earlier render (jinja_eval.c) */
            c = a->spare;
            a->spare = c->next;
        } else c = malloc(sizeof *c + sz);
        if (!c) {
            if (a->ctx) jraise(a->ctx, "out of memory");
            return NULL;
        }
        c->used = 0;
        c->size = sz;
        if (sz == n && h) { /* a big block: keep the current chunk as the head */
            c->next = h->next;
            h->next = c;
        } else {
            c->next = h;
            a->head = c;
        }
        h = c;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    a->used += n;
    if (zero) memset(p, 0, n);
    return p;
}
void *ja_alloc(jarena *a, size_t n) { return ja_get(a, n, true); }
void *ja_alloc_nz(jarena *a, size_t n) { return ja_get(a, n, false); }

jarena_chunk *ja_take_chunks(jarena *a, size_t max_bytes) {
    jarena_chunk *keep = NULL;
    size_t kept = 0;
    for (jarena_chunk *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        if (c->size == CHUNK && kept + CHUNK <= max_bytes) {
            c->used = 0;
            c->next = keep;
            keep = c;
            kept += CHUNK;
        } else free(c);
    }
    for (jarena_chunk *c = a->spare, *nx; c; c = nx) {
        nx = c->next;
        if (kept + CHUNK <= max_bytes) {
            c->next = keep;
            keep = c;
            kept += CHUNK;
        } else free(c);
    }
    a->head = a->spare = NULL;
    a->used = 0;
    return keep;
}

void ja_free_all(jarena *a) {
    for (int k = 0; k < 2; k++)
        for (jarena_chunk *c = k ? a->spare : a->head, *nx; c; c = nx) {
            nx = c->next;
            free(c);
        }
    a->head = a->spare = NULL;
    a->used = 0;
}

const jstr *jstr_new(jarena *a, const char *p, size_t n) {
    jstr *s = ja_alloc_nz(a, sizeof *s + n + 1);
    if (!s) return NULL;
    char *d = (char *)(s + 1);
    if (n) memcpy(d, p, n);
    d[n] = 0;
    s->p = d;
    s->n = n;
    return s;
}

jv jv_str(jarena *a, const char *p, size_t n) {
    jv v = {0};
    v.t = JV_STR;
    v.s = jstr_new(a, p, n);
    return v;
}
jv jv_str_ref(jarena *a, const char *p, size_t n) {
    jstr *s = ja_alloc(a, sizeof *s);
    jv v = {0};
    v.t = JV_STR;
    if (s) {
        s->p = p;
        s->n = n;
    }
    v.s = s;
    return v;
}
jv jv_strz(jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }
jv jv_str_take(jarena *a, kvt_strbuf *b) {
    if (b->oom && a->ctx) {
        kvt_strbuf_free(b);
        jraise(a->ctx, "out of memory");
    }
    jv v = jv_str(a, b->p ? b->p : "", b->n);
    kvt_strbuf_free(b);
    return v;
}

jv jv_list(jarena *a, size_t cap) {
    jv v = {0};
    v.t = JV_LIST;
    v.l = ja_alloc(a, sizeof *v.l);
    if (cap) {
        v.l->v = ja_alloc_nz(a, cap * sizeof(jv));
        v.l->cap = cap;
    }
    return v;
}

void jl_push(jarena *a, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc_nz(a, nc * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

jv jv_dict(jarena *a) {
    jv v = {0};
    v.t = JV_DICT;
    v.d = ja_alloc(a, sizeof *v.d);
    return v;
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}
/* equal keys hash equal: 1 == 1.0 == True */
static uint64_t hash_key(jv k) {
    switch (k.t) {
    case JV_STR: return hash_bytes(k.s->p, k.s->n);
    case JV_INT: return (uint64_t)k.i * 0x9E3779B97F4A7C15ull;
    case JV_BOOL: return (uint64_t)k.b * 0x9E3779B97F4A7C15ull;
    case JV_FLOAT:
        if (k.f == floor(k.f) && fabs(k.f) < 9e18) return (uint64_t)(int64_t)k.f * 0x9E3779B97F4A7C15ull;
        return hash_bytes((const char *)&k.f, sizeof k.f);
    case JV_NONE: return 7;
    default: return 11;
    }
}
/* key equality without raising (keys are scalars in practice; containers compare by identity) */
static bool key_eq(jv a, jv b) {
    if (a.t == JV_STR && b.t == JV_STR) return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    bool an = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT, bn = b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT;
    if (an && bn) {
        double x = a.t == JV_FLOAT ? a.f : a.t == JV_INT ? (double)a.i : a.b;
        double y = b.t == JV_FLOAT ? b.f : b.t == JV_INT ? (double)b.i : b.b;
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
        return x == y;
    }
    if (a.t != b.t) return false;
    if (a.t == JV_NONE) return true;
    return a.l == b.l;
}

static void idx_insert(jdict *d, size_t i) {
    size_t m = d->idx_cap - 1, h = hash_key(d->k[i]) & m;
    while (d->idx[h] >= 0) h = (h + 1) & m;
    d->idx[h] = (int32_t)i;
}

static void idx_rebuild(jarena *a, jdict *d, size_t want) {
    size_t cap = 16;
    while (cap < want * 2) cap *= 2;
    d->idx = ja_alloc(a, cap * sizeof(int32_t));
    if (!d->idx) {
        d->idx_cap = 0;
        return;
    }
    memset(d->idx, 0xff, cap * sizeof(int32_t));
    d->idx_cap = cap;
    for (size_t i = 0; i < d->n; i++) idx_insert(d, i);
}

static jv *dict_find(const jdict *d, jv k, size_t *pos) {
    if (d->idx_cap) {
        size_t m = d->idx_cap - 1, h = hash_key(k) & m;
        for (; d->idx[h] >= 0; h = (h + 1) & m)
            if (key_eq(d->k[d->idx[h]], k)) {
                if (pos) *pos = (size_t)d->idx[h];
                return &d->v[d->idx[h]];
            }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            if (pos) *pos = i;
            return &d->v[i];
        }
    return NULL;
}

jv *jd_get(const jdict *d, jv k) { return dict_find(d, k, NULL); }
jv *jd_gets(const jdict *d, const char *key, size_t n) {
    jstr s = {n, key};
    jv k = {0};
    k.t = JV_STR;
    k.s = &s;
    return dict_find(d, k, NULL);
}

void jd_set(jarena *a, jdict *d, jv k, jv v) {
    jv *e = dict_find(d, k, NULL);
    if (e) {
        *e = v;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc_nz(a, nc * sizeof(jv)), *nv = ja_alloc_nz(a, nc * sizeof(jv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->n > 8) {
        if (d->idx_cap < d->n * 2) idx_rebuild(a, d, d->n);
        else idx_insert(d, d->n - 1);
    }
}

/* ---- UTF-8 ---- */
size_t ju_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((uint8_t)p[i] & 0xC0) != 0x80;
    return c;
}
size_t ju_offset(const char *p, size_t n, size_t cp) {
    size_t i = 0;
    for (; i < n && cp; cp--) {
        i++;
        while (i < n && ((uint8_t)p[i] & 0xC0) == 0x80) i++;
    }
    return i;
}
/* decodes one code point at p[*i] (invalid bytes come back as themselves, 0x80..0xFF) */
static uint32_t ju_next(const char *p, size_t n, size_t *i) {
    uint8_t c = (uint8_t)p[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || *i + (size_t)len > n) {
        (*i)++;
        return c;
    }
    uint32_t u = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < len; k++) {
        uint8_t d = (uint8_t)p[*i + (size_t)k];
        if ((d & 0xC0) != 0x80) {
            (*i)++;
            return c;
        }
        u = (u << 6) | (d & 0x3Fu);
    }
    *i += (size_t)len;
    return u;
}

/* ---- Python type names and truthiness ---- */
const char *jv_type_name(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        switch (v.l->kind) {
        case JL_GEN: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        }
        return v.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s->n != 0;
    case JV_LIST: return v.l->kind == JL_GEN || v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num_f(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }

bool jv_eq(jctx *c, jv a, jv b, int depth) {
    if (depth > JV_MAX_DEPTH) jraise(c, "values nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    case JV_LIST:
        if (jl_special(a.l) || jl_special(b.l)) return a.l == b.l;
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_eq(c, a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = jd_get(b.d, a.d->k[i]);
            if (!o || !jv_eq(c, a.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    case JV_LOOP: return a.lp == b.lp;
    }
    return false;
}

int jv_cmp(jctx *c, jv a, jv b, int depth) {
    if (depth > JV_MAX_DEPTH) jraise(c, "values nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.i : a.b, y = b.t == JV_INT ? b.i : b.b;
            return x < y ? -1 : x > y;
        }
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y; /* NaN compares as equal-ish; Python says False to both */
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = a.s->n < b.s->n ? a.s->n : b.s->n;
        int r = memcmp(a.s->p, b.s->p, m);
        if (r) return r < 0 ? -1 : 1;
        return a.s->n < b.s->n ? -1 : a.s->n > b.s->n;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.l->tuple == b.l->tuple && !jl_special(a.l) && !jl_special(b.l)) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_eq(c, a.l->v[i], b.l->v[i], depth + 1)) continue;
            return jv_cmp(c, a.l->v[i], b.l->v[i], depth + 1);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        jraise(c, "'%.*s' is undefined", (int)(a.t == JV_UNDEF ? (a.s ? a.s->n : 0) : (b.s ? b.s->n : 0)),
               a.t == JV_UNDEF ? (a.s ? a.s->p : "") : (b.s ? b.s->p : ""));
    jraise(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

/* ---- str / repr ---- */
void jv_float_repr(kvt_strbuf *b, double f) {
    if (isnan(f)) {
        kvt_strbuf_addstr(b, "nan");
        return;
    }
    if (isinf(f)) {
        kvt_strbuf_addstr(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[48];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    const char *s = buf;
    bool neg = *s == '-';
    if (neg) s++;
    char dig[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.' && nd < 20) dig[nd++] = *s;
    int e = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) kvt_strbuf_addstr(b, "-");
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) kvt_strbuf_add(b, i < nd ? &dig[i] : "0", 1);
            kvt_strbuf_addstr(b, ".");
            if (nd > e + 1) kvt_strbuf_add(b, dig + e + 1, (size_t)(nd - e - 1));
            else kvt_strbuf_addstr(b, "0");
        } else {
            kvt_strbuf_addstr(b, "0.");
            for (int i = 0; i < -e - 1; i++) kvt_strbuf_addstr(b, "0");
            kvt_strbuf_add(b, dig, (size_t)nd);
        }
    } else {
        kvt_strbuf_add(b, dig, 1);
        if (nd > 1) {
            kvt_strbuf_addstr(b, ".");
            kvt_strbuf_add(b, dig + 1, (size_t)(nd - 1));
        }
        kvt_strbuf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* Python's str.isprintable, approximately: control, separator, format and private-use ranges */
static bool u_printable(uint32_t u) {
    if (u < 0x20 || (u >= 0x7f && u <= 0xa0) || u == 0xad) return false;
    if ((u >= 0x2000 && u <= 0x200f) || (u >= 0x2028 && u <= 0x202f) || (u >= 0x205f && u <= 0x206f)) return false;
    if (u == 0x1680 || u == 0x180e || u == 0x3000 || u == 0xfeff || (u >= 0xfff9 && u <= 0xfffb)) return false;
    if ((u >= 0xd800 && u <= 0xf8ff) || u >= 0xf0000) return false;
    return true;
}

static void repr_str(kvt_strbuf *b, const char *p, size_t n) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    kvt_strbuf_add(b, &q, 1);
    size_t i = 0, run = 0;
    while (i < n) {
        uint8_t ch = (uint8_t)p[i];
        if (ch >= 0x20 && ch < 0x7f && ch != (uint8_t)q && ch != '\\') {
            run++;
            i++;
            continue;
        }
        kvt_strbuf_add(b, p + i - run, run);
        run = 0;
        size_t st = i;
        uint32_t u = ju_next(p, n, &i);
        if (u == (uint32_t)q || u == '\\') kvt_strbuf_printf(b, "\\%c", (char)u);
        else if (u == '\n') kvt_strbuf_addstr(b, "\\n");
        else if (u == '\r') kvt_strbuf_addstr(b, "\\r");
        else if (u == '\t') kvt_strbuf_addstr(b, "\\t");
        else if (u_printable(u) && i - st > 1) kvt_strbuf_add(b, p + st, i - st);
        else if (u <= 0xff) kvt_strbuf_printf(b, "\\x%02x", u);
        else if (u <= 0xffff) kvt_strbuf_printf(b, "\\u%04x", u);
        else kvt_strbuf_printf(b, "\\U%08x", u);
    }
    kvt_strbuf_add(b, p + i - run, run);
    kvt_strbuf_add(b, &q, 1);
}

void jv_repr(jctx *c, kvt_strbuf *b, jv v, int depth) {
    if (depth > JV_MAX_DEPTH) jraise(c, "value nested too deeply to print");
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: kvt_strbuf_addstr(b, "None"); return;
    case JV_BOOL: kvt_strbuf_addstr(b, v.b ? "True" : "False"); return;
    case JV_INT: kvt_strbuf_printf(b, "%lld", (long long)v.i); return;
    case JV_FLOAT: jv_float_repr(b, v.f); return;
    case JV_STR: repr_str(b, v.s->p, v.s->n); return;
    case JV_LIST:
        if (v.l->kind == JL_GEN) {
            kvt_strbuf_addstr(b, "<generator object>");
            return;
        }
        if (v.l->kind != JL_LIST) {
            kvt_strbuf_addstr(b, jv_type_name(v));
            kvt_strbuf_addstr(b, "(");
        }
        kvt_strbuf_addstr(b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) kvt_strbuf_addstr(b, ", ");
            jv_repr(c, b, v.l->v[i], depth + 1);
        }
        if (v.l->tuple && v.l->n == 1) kvt_strbuf_addstr(b, ",");
        kvt_strbuf_addstr(b, v.l->tuple ? ")" : "]");
        if (v.l->kind != JL_LIST) kvt_strbuf_addstr(b, ")");
        return;
    case JV_NS:
        kvt_strbuf_addstr(b, "<Namespace ");
        /* fall through */
    case JV_DICT:
        kvt_strbuf_addstr(b, "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) kvt_strbuf_addstr(b, ", ");
            jv_repr(c, b, v.d->k[i], depth + 1);
            kvt_strbuf_addstr(b, ": ");
            jv_repr(c, b, v.d->v[i], depth + 1);
        }
        kvt_strbuf_addstr(b, v.t == JV_NS ? "}>" : "}");
        return;
    case JV_MACRO: return;
    case JV_FUNC: kvt_strbuf_printf(b, "<built-in method %.*s>", (int)v.fn->name->n, v.fn->name->p); return;
    case JV_LOOP: kvt_strbuf_printf(b, "<LoopContext %zu/%zu>", v.lp->i + 1, v.lp->items->n); return;
    }
}

void jv_to_str(jctx *c, kvt_strbuf *b, jv v) {
    if (v.t == JV_STR) kvt_strbuf_add(b, v.s->p, v.s->n);
    else jv_repr(c, b, v, 0);
}

jv jv_as_str(jctx *c, jv v) {
    if (v.t == JV_STR) return v;
    if (v.t == JV_UNDEF) return jv_str_ref(&c->a, "", 0);
    kvt_strbuf *b = jbuf(c);
    jv_to_str(c, b, v);
    return jbuf_str(c, b);
}

/* ---- json.dumps(ensure_ascii=False) ---- */
static void json_str_ascii(kvt_strbuf *b, const char *p, size_t n) {
    kvt_strbuf_addstr(b, "\"");
    for (size_t i = 0; i < n;) {
        uint8_t ch = (uint8_t)p[i];
        if (ch < 0x80) {
            i++;
            if (ch == '"') kvt_strbuf_addstr(b, "\\\"");
            else if (ch == '\\') kvt_strbuf_addstr(b, "\\\\");
            else if (ch == '\n') kvt_strbuf_addstr(b, "\\n");
            else if (ch == '\r') kvt_strbuf_addstr(b, "\\r");
            else if (ch == '\t') kvt_strbuf_addstr(b, "\\t");
            else if (ch == '\b') kvt_strbuf_addstr(b, "\\b");
            else if (ch == '\f') kvt_strbuf_addstr(b, "\\f");
            else if (ch < 0x20) kvt_strbuf_printf(b, "\\u%04x", ch);
            else kvt_strbuf_add(b, (const char *)&ch, 1);
            continue;
        }
        uint32_t u = ju_next(p, n, &i);
        if (u >= 0x10000) {
            u -= 0x10000;
            kvt_strbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
        } else kvt_strbuf_printf(b, "\\u%04x", u);
    }
    kvt_strbuf_addstr(b, "\"");
}

static void json_str_c(jctx *c, kvt_strbuf *b, const char *p, size_t n);
#define json_str(b, p, n) json_str_c(c, b, p, n)

static void json_str_c(jctx *c, kvt_strbuf *b, const char *p, size_t n) {
    if (c->json_ascii) json_str_ascii(b, p, n);
    else kvt_strbuf_json_str(b, p, n);
}

static void json_nl(kvt_strbuf *b, const jstr *indent, int level) {
    kvt_strbuf_addstr(b, "\n");
    for (int i = 0; i < level; i++) kvt_strbuf_add(b, indent->p, indent->n);
}

static void json_scalar(jctx *c, kvt_strbuf *b, jv v) {
    switch (v.t) {
    case JV_NONE: kvt_strbuf_addstr(b, "null"); return;
    case JV_BOOL: kvt_strbuf_addstr(b, v.b ? "true" : "false"); return;
    case JV_INT: kvt_strbuf_printf(b, "%lld", (long long)v.i); return;
    case JV_FLOAT:
        if (isnan(v.f)) kvt_strbuf_addstr(b, "NaN");
        else if (isinf(v.f)) kvt_strbuf_addstr(b, v.f < 0 ? "-Infinity" : "Infinity");
        else jv_float_repr(b, v.f);
        return;
    case JV_STR: json_str(b, v.s->p, v.s->n); return;
    default: jraise(c, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

typedef struct {
    jctx *c;
    const jv *k;
} sortctx;
static int cmp_keys_qsort(const void *x, const void *y, void *u) {
    sortctx *s = u;
    return jv_cmp(s->c, s->k[*(const size_t *)x], s->k[*(const size_t *)y], 0);
}

static void tojson_rec(jctx *c, kvt_strbuf *b, jv v, const jstr *indent, const jstr *isep, const jstr *ksep,
                       bool sort_keys, int depth, int level) {
    if (depth > JV_MAX_DEPTH) jraise(c, "value nested too deeply for tojson");
    if (v.t == JV_LIST && jl_special(v.l)) jraise(c, "Object of type %s is not JSON serializable", jv_type_name(v));
    if (v.t == JV_LIST) {
        if (!v.l->n) {
            kvt_strbuf_addstr(b, "[]");
            return;
        }
        kvt_strbuf_addstr(b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) kvt_strbuf_add(b, isep->p, isep->n);
            if (indent) json_nl(b, indent, level + 1);
            tojson_rec(c, b, v.l->v[i], indent, isep, ksep, sort_keys, depth + 1, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        kvt_strbuf_addstr(b, "]");
        return;
    }
    if (v.t == JV_DICT) {
        if (!v.d->n) {
            kvt_strbuf_addstr(b, "{}");
            return;
        }
        size_t *ord = ja_alloc(&c->a, v.d->n * sizeof(size_t));
        for (size_t i = 0; i < v.d->n; i++) ord[i] = i;
        if (sort_keys) {
            sortctx s = {c, v.d->k};
            jsort(c, ord, v.d->n, cmp_keys_qsort, &s);
        }
        kvt_strbuf_addstr(b, "{");
        for (size_t j = 0; j < v.d->n; j++) {
            size_t i = ord[j];
            if (j) kvt_strbuf_add(b, isep->p, isep->n);
            if (indent) json_nl(b, indent, level + 1);
            jv k = v.d->k[i];
            if (k.t == JV_STR) json_str(b, k.s->p, k.s->n);
            else if (k.t == JV_NONE || k.t == JV_BOOL || k.t == JV_INT || k.t == JV_FLOAT) {
                kvt_strbuf kb = {0};
                json_scalar(c, &kb, k);
                json_str(b, kb.p, kb.n);
                kvt_strbuf_free(&kb);
            } else jraise(c, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
            kvt_strbuf_add(b, ksep->p, ksep->n);
            tojson_rec(c, b, v.d->v[i], indent, isep, ksep, sort_keys, depth + 1, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        kvt_strbuf_addstr(b, "}");
        return;
    }
    json_scalar(c, b, v);
}

void jv_tojson(jctx *c, kvt_strbuf *b, jv v, const jstr *indent, const jstr *item_sep, const jstr *key_sep,
               bool sort_keys, int depth) {
    static const jstr comma_sp = {2, ", "}, comma = {1, ","}, colon_sp = {2, ": "};
    if (!item_sep) item_sep = indent ? &comma : &comma_sp;
    if (!key_sep) key_sep = &colon_sp;
    tojson_rec(c, b, v, indent, item_sep, key_sep, sort_keys, depth, 0);
}

/* ---- json.loads ---- */
typedef struct {
    jarena *a;
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    bool bad;
} jp;

static bool jp_fail(jp *p, const char *what) {
    if (!p->bad) kvt_errf(p->err, p->errlen, KVT_ERR_FORMAT, "context JSON: %s at byte %zu", what, p->i);
    p->bad = true;
    return false;
}
static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}
static void put_utf8(kvt_strbuf *b, uint32_t u) {
    char t[4];
    if (u < 0x80) t[0] = (char)u, kvt_strbuf_add(b, t, 1);
    else if (u < 0x800) t[0] = (char)(0xC0 | (u >> 6)), t[1] = (char)(0x80 | (u & 63)), kvt_strbuf_add(b, t, 2);
    else if (u < 0x10000)
        t[0] = (char)(0xE0 | (u >> 12)), t[1] = (char)(0x80 | ((u >> 6) & 63)), t[2] = (char)(0x80 | (u & 63)),
        kvt_strbuf_add(b, t, 3);
    else
        t[0] = (char)(0xF0 | (u >> 18)), t[1] = (char)(0x80 | ((u >> 12) & 63)), t[2] = (char)(0x80 | ((u >> 6) & 63)),
        t[3] = (char)(0x80 | (u & 63)), kvt_strbuf_add(b, t, 4);
}
static int hex4(const char *s, size_t n, size_t i, uint32_t *u) {
    if (i + 4 > n) return 0;
    *u = 0;
    for (int k = 0; k < 4; k++) {
        char ch = s[i + (size_t)k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return 0;
        *u = *u * 16 + (uint32_t)d;
    }
    return 1;
}
static bool jp_string(jp *p, jv *out) {
    p->i++; /* opening quote */
    size_t st = p->i;
    while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (uint8_t)p->s[p->i] >= 0x20) p->i++;
    if (p->i < p->n && p->s[p->i] == '"') { /* no escapes: borrow the text (it outlives the render) */
        *out = jv_str_ref(p->a, p->s + st, p->i - st);
        p->i++;
        return out->s != NULL || jp_fail(p, "out of memory");
    }
    kvt_strbuf b = {0};
    kvt_strbuf_add(&b, p->s + st, p->i - st);
    while (p->i < p->n) {
        char ch = p->s[p->i];
        if (ch == '"') {
            p->i++;
            if (b.oom) {
                kvt_strbuf_free(&b);
                return jp_fail(p, "out of memory");
            }
            *out = jv_str(p->a, b.p ? b.p : "", b.n);
            kvt_strbuf_free(&b);
            return out->s != NULL || jp_fail(p, "out of memory");
        }
        if ((uint8_t)ch < 0x20) break;
        if (ch != '\\') {
            kvt_strbuf_add(&b, &ch, 1);
            p->i++;
            continue;
        }
        if (++p->i >= p->n) break;
        ch = p->s[p->i++];
        uint32_t u;
        switch (ch) {
        case '"': kvt_strbuf_addstr(&b, "\""); break;
        case '\\': kvt_strbuf_addstr(&b, "\\"); break;
        case '/': kvt_strbuf_addstr(&b, "/"); break;
        case 'b': kvt_strbuf_addstr(&b, "\b"); break;
        case 'f': kvt_strbuf_addstr(&b, "\f"); break;
        case 'n': kvt_strbuf_addstr(&b, "\n"); break;
        case 'r': kvt_strbuf_addstr(&b, "\r"); break;
        case 't': kvt_strbuf_addstr(&b, "\t"); break;
        case 'u':
            if (!hex4(p->s, p->n, p->i, &u)) goto bad;
            p->i += 4;
            if (u >= 0xD800 && u < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                uint32_t lo;
                if (hex4(p->s, p->n, p->i + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                    p->i += 6;
                }
            }
            put_utf8(&b, u);
            break;
        default: goto bad;
        }
    }
bad:
    kvt_strbuf_free(&b);
    return jp_fail(p, "bad string");
}

static bool jp_value(jp *p, jv *out, int depth) {
    if (depth > JV_MAX_DEPTH) return jp_fail(p, "nested too deeply");
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    char ch = p->s[p->i];
    if (ch == '{') {
        p->i++;
        *out = jv_dict(p->a);
        if (!out->d) return jp_fail(p, "out of memory");
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return true;
        }
        for (;;) {
            jp_ws(p);
            jv k, v;
            if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a key");
            if (!jp_string(p, &k)) return false;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
            p->i++;
            if (!jp_value(p, &v, depth + 1)) return false;
            jd_set(p->a, out->d, k, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                return true;
            }
            return jp_fail(p, "expected ',' or '}'");
        }
    }
    if (ch == '[') {
        p->i++;
        *out = jv_list(p->a, 0);
        if (!out->l) return jp_fail(p, "out of memory");
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return true;
        }
        for (;;) {
            jv v;
            if (!jp_value(p, &v, depth + 1)) return false;
            jl_push(p->a, out->l, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                return true;
            }
            return jp_fail(p, "expected ',' or ']'");
        }
    }
    if (ch == '"') return jp_string(p, out);
    static const struct { const char *w; int t; bool b; } lits[] = {{"true", JV_BOOL, true}, {"false", JV_BOOL, false}, {"null", JV_NONE, false}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(lits[k].w);
        if (p->n - p->i >= l && !memcmp(p->s + p->i, lits[k].w, l)) {
            p->i += l;
            *out = lits[k].t == JV_BOOL ? jv_bool(lits[k].b) : jv_none();
            return true;
        }
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        size_t st = p->i;
        bool flt = false;
        if (p->s[p->i] == '-') p->i++;
        size_t d0 = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        if (p->i == d0) return jp_fail(p, "bad number");
        if (p->i < p->n && p->s[p->i] == '.') {
            flt = true;
            p->i++;
            size_t f0 = p->i;
            while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
            if (p->i == f0) return jp_fail(p, "bad number");
        }
        if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
            flt = true;
            p->i++;
            if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
            size_t e0 = p->i;
            while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
            if (p->i == e0) return jp_fail(p, "bad number");
        }
        char buf[64];
        size_t l = p->i - st;
        if (l >= sizeof buf) flt = true, l = sizeof buf - 1; /* huge ints become floats (Python keeps bigints) */
        memcpy(buf, p->s + st, l);
        buf[l] = 0;
        if (!flt) {
            errno = 0;
            long long v = strtoll(buf, NULL, 10);
            if (errno == 0) {
                *out = jv_int(v);
                return true;
            }
        }
        *out = jv_float(strtod(buf, NULL));
        return true;
    }
    return jp_fail(p, "unexpected character");
}

bool jv_from_json(jarena *a, const char *s, size_t n, jv *out, char *err, size_t errlen) {
    jp p = {a, s, n, 0, err, errlen, false};
    if (!jp_value(&p, out, 0)) return false;
    jp_ws(&p);
    if (p.i != n) return jp_fail(&p, "trailing characters");
    return true;
}

void jsort(jctx *c, size_t *ord, size_t n, int (*cmp)(const void *, const void *, void *), void *u) {
    if (n < 2) return;
    size_t *tmp = ja_alloc_nz(&c->a, n * sizeof *tmp);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(&ord[j], &ord[i], u) < 0 ? ord[j++] : ord[i++];
            while (i < mid) tmp[k++] = ord[i++];
            while (j < hi) tmp[k++] = ord[j++];
        }
        memcpy(ord, tmp, n * sizeof *ord);
    }
}

/* ---- iteration ---- */
jlist *jv_iterate(jctx *c, jv v) {
    switch (v.t) {
    case JV_LIST:
        if (v.l->kind == JL_GEN) { /* one shot: what is left, then nothing */
            jlist *l = jv_list(&c->a, 0).l;
            l->v = v.l->v ? v.l->v + v.l->pos : NULL;
            l->n = l->cap = v.l->n - v.l->pos;
            v.l->pos = v.l->n;
            return l;
        }
        return v.l;
    case JV_UNDEF: return jv_list(&c->a, 0).l;
    case JV_DICT: {
        jlist *l = jv_list(&c->a, v.d->n).l;
        for (size_t i = 0; i < v.d->n; i++) jl_push(&c->a, l, v.d->k[i]);
        return l;
    }
    case JV_STR: {
        jlist *l = jv_list(&c->a, v.s->n).l;
        for (size_t i = 0; i < v.s->n;) {
            size_t st = i;
            ju_next(v.s->p, v.s->n, &i);
            jl_push(&c->a, l, jv_str_ref(&c->a, v.s->p + st, i - st));
        }
        return l;
    }
    default: jraise(c, "'%s' object is not iterable", jv_type_name(v));
    }
}
