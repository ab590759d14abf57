/*
 * jinja_builtins.c — jinja2's filters and tests, transformers' globals (raise_exception,
 * strftime_now, tojson) and the methods of str / dict / list that templates call, with Python's
 * results. Methods that mutate a list or dict are refused as ImmutableSandboxedEnvironment refuses
 * them ("access to attribute 'append' of 'list' object is unsafe.").
 *
 * Invariant: every filter that walks a sequence counts its items with jstep, so the step cap
 * bounds filter work as well as loops.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

/* ---- names ---- */
enum {
    F_TOJSON, F_LENGTH, F_TRIM, F_DEFAULT, F_JOIN, F_MAP, F_SELECT, F_REJECT, F_SELECTATTR, F_REJECTATTR, F_ITEMS,
    F_FIRST, F_LAST, F_STRING, F_INT, F_FLOAT, F_UPPER, F_LOWER, F_REPLACE, F_LIST, F_UNIQUE, F_DICTSORT, F_SAFE,
    F_ESCAPE, F_INDENT, F_WORDCOUNT, F_ROUND, F_ABS, F_MIN, F_MAX, F_SUM, F_CENTER, F_CAPITALIZE, F_TITLE,
    F_SORT, F_REVERSE, F_ATTR, F_TRUNCATE, F_BOOL_UNUSED
};
static const struct { const char *n; int id; } k_filters[] = {
    {"tojson", F_TOJSON}, {"length", F_LENGTH}, {"count", F_LENGTH}, {"trim", F_TRIM}, {"default", F_DEFAULT},
    {"d", F_DEFAULT}, {"join", F_JOIN}, {"map", F_MAP}, {"select", F_SELECT}, {"reject", F_REJECT},
    {"selectattr", F_SELECTATTR}, {"rejectattr", F_REJECTATTR}, {"items", F_ITEMS}, {"first", F_FIRST},
    {"last", F_LAST}, {"string", F_STRING}, {"int", F_INT}, {"float", F_FLOAT}, {"upper", F_UPPER},
    {"lower", F_LOWER}, {"replace", F_REPLACE}, {"list", F_LIST}, {"unique", F_UNIQUE}, {"dictsort", F_DICTSORT},
    {"safe", F_SAFE}, {"escape", F_ESCAPE}, {"e", F_ESCAPE}, {"forceescape", F_ESCAPE}, {"indent", F_INDENT},
    {"wordcount", F_WORDCOUNT}, {"round", F_ROUND}, {"abs", F_ABS}, {"min", F_MIN}, {"max", F_MAX},
    {"sum", F_SUM}, {"center", F_CENTER}, {"capitalize", F_CAPITALIZE}, {"title", F_TITLE}, {"sort", F_SORT},
    {"reverse", F_REVERSE}, {"attr", F_ATTR}, {"truncate", F_TRUNCATE},
};

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_STRING_, T_NUMBER, T_INTEGER, T_FLOAT_, T_BOOLEAN, T_MAPPING, T_ITERABLE,
    T_SEQUENCE, T_CALLABLE, T_TRUE, T_FALSE, T_DIVISIBLEBY, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_ODD,
    T_EVEN, T_LOWER, T_UPPER, T_SAMEAS, T_ESCAPED, T_FILTER, T_TEST
};
static const struct { const char *n; int id; } k_tests[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"string", T_STRING_},
    {"number", T_NUMBER}, {"integer", T_INTEGER}, {"float", T_FLOAT_}, {"boolean", T_BOOLEAN},
    {"mapping", T_MAPPING}, {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE},
    {"true", T_TRUE}, {"false", T_FALSE}, {"divisibleby", T_DIVISIBLEBY}, {"equalto", T_EQ}, {"eq", T_EQ},
    {"==", T_EQ}, {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE},
    {"<=", T_LE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"in", T_IN},
    {"odd", T_ODD}, {"even", T_EVEN}, {"lower", T_LOWER}, {"upper", T_UPPER}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"filter", T_FILTER}, {"test", T_TEST},
};

int jb_filter_id(const char *name, size_t n) {
    for (size_t i = 0; i < KVT_ARRAY_LEN(k_filters); i++)
        if (strlen(k_filters[i].n) == n && !memcmp(k_filters[i].n, name, n)) return k_filters[i].id;
    return -1;
}
int jb_test_id(const char *name, size_t n) {
    for (size_t i = 0; i < KVT_ARRAY_LEN(k_tests); i++)
        if (strlen(k_tests[i].n) == n && !memcmp(k_tests[i].n, name, n)) return k_tests[i].id;
    return -1;
}

/* methods and globals */
enum {
    M_NONE = 0,
    /* str */
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_REPLACE, M_UPPER, M_LOWER, M_TITLE,
    M_CAPITALIZE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISLOWER,
    M_ISUPPER, M_SPLITLINES, M_INDEX, M_FORMAT,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES,
    /* list */
    M_LINDEX, M_LCOUNT,
    /* loop */
    M_CYCLE,
    /* globals */
    G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_LIST_UNUSED
};
static const struct { const char *n; int id; } k_str_methods[] = {
    {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"replace", M_REPLACE}, {"upper", M_UPPER},
    {"lower", M_LOWER}, {"title", M_TITLE}, {"capitalize", M_CAPITALIZE}, {"find", M_FIND}, {"rfind", M_RFIND},
    {"count", M_COUNT}, {"join", M_JOIN}, {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA}, {"isalnum", M_ISALNUM},
    {"isspace", M_ISSPACE}, {"islower", M_ISLOWER}, {"isupper", M_ISUPPER}, {"splitlines", M_SPLITLINES},
    {"index", M_INDEX}, {"format", M_FORMAT},
};
static const struct { const char *n; int id; } k_dict_methods[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES},
};
static const struct { const char *n; int id; } k_list_methods[] = {{"index", M_LINDEX}, {"count", M_LCOUNT}};
static const char *const k_list_unsafe[] = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"};
static const char *const k_dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};

static bool eqs(const jstr *s, const char *z) { return s->n == strlen(z) && !memcmp(s->p, z, s->n); }

static jv mkfunc(jctx *c, int id, jv self, const jstr *name) {
    jv v = {0};
    v.t = JV_FUNC;
    v.fn = ja_alloc(&c->a, sizeof *v.fn);
    v.fn->id = id;
    v.fn->self = self;
    v.fn->name = name;
    return v;
}

static jv unsafe_attr(jctx *c, const jstr *name, const char *tname) {
    char msg[160];
    snprintf(msg, sizeof msg, "access to attribute '%.*s' of '%s' object is unsafe.", (int)(name->n > 40 ? 40 : name->n),
             name->p, tname);
    jv u = jv_undef(jstr_new(&c->a, msg, strlen(msg)));
    u.unsafe = 1;
    return u;
}

jv jb_getattr(jctx *c, jv obj, const jstr *name) {
    if (obj.t == JV_STR) {
        for (size_t i = 0; i < KVT_ARRAY_LEN(k_str_methods); i++)
            if (eqs(name, k_str_methods[i].n)) return mkfunc(c, k_str_methods[i].id, obj, name);
    } else if (obj.t == JV_DICT) {
        for (size_t i = 0; i < KVT_ARRAY_LEN(k_dict_methods); i++)
            if (eqs(name, k_dict_methods[i].n)) return mkfunc(c, k_dict_methods[i].id, obj, name);
        for (size_t i = 0; i < KVT_ARRAY_LEN(k_dict_unsafe); i++)
            if (eqs(name, k_dict_unsafe[i])) return unsafe_attr(c, name, "dict");
        if (eqs(name, "copy")) return unsafe_attr(c, name, "dict"); /* not modelled */
    } else if (obj.t == JV_LIST) {
        if (!obj.l->tuple)
            for (size_t i = 0; i < KVT_ARRAY_LEN(k_list_unsafe); i++)
                if (eqs(name, k_list_unsafe[i])) return unsafe_attr(c, name, "list");
        for (size_t i = 0; i < KVT_ARRAY_LEN(k_list_methods); i++)
            if (eqs(name, k_list_methods[i].n)) return mkfunc(c, k_list_methods[i].id, obj, name);
    } else if (obj.t == JV_LOOP) {
        if (eqs(name, "cycle")) return mkfunc(c, M_CYCLE, obj, name);
    }
    return jv_undef(name);
}

bool jb_global(jctx *c, const jstr *name, jv *out) {
    static const struct { const char *n; int id; } g[] = {{"range", G_RANGE}, {"namespace", G_NAMESPACE},
                                                         {"dict", G_DICT}, {"raise_exception", G_RAISE},
                                                         {"strftime_now", G_STRFTIME}};
    for (size_t i = 0; i < KVT_ARRAY_LEN(g); i++)
        if (eqs(name, g[i].n)) {
            *out = mkfunc(c, g[i].id, jv_none(), name);
            return true;
        }
    return false;
}

/* ---- helpers ---- */
static jv S(jctx *c, jv v) { return jv_as_str(c, v); }
static bool ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1f); }
static bool in_chars(const jstr *chars, const char *p, size_t n) {
    /* is the code point p[0..n) one of chars? */
    for (size_t i = 0; i < chars->n;) {
        size_t st = i;
        i++;
        while (i < chars->n && ((uint8_t)chars->p[i] & 0xC0) == 0x80) i++;
        if (i - st == n && !memcmp(chars->p + st, p, n)) return true;
    }
    return false;
}
static size_t cp_len_at(const char *p, size_t n, size_t i) {
    size_t j = i + 1;
    while (j < n && ((uint8_t)p[j] & 0xC0) == 0x80) j++;
    return j - i;
}
static size_t cp_start_before(const char *p, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)p[j] & 0xC0) == 0x80) j--;
    return j;
}
/* Python str.strip family; chars NULL = whitespace */
static jv do_strip(jctx *c, jv s, const jstr *chars, bool left, bool right) {
    const char *p = s.s->p;
    size_t a = 0, b = s.s->n;
    if (left)
        while (a < b) {
            size_t l = cp_len_at(p, b, a);
            if (chars ? !in_chars(chars, p + a, l) : !(l == 1 && ws(p[a]))) break;
            a += l;
        }
    if (right)
        while (b > a) {
            size_t st = cp_start_before(p, b);
            if (st < a) st = a;
            if (chars ? !in_chars(chars, p + st, b - st) : !(b - st == 1 && ws(p[st]))) break;
            b = st;
        }
    return jv_str_ref(&c->a, p + a, b - a);
}

static jv case_map(jctx *c, jv s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize (ASCII letters) */
    kvt_strbuf *b = jbuf(c);
    kvt_strbuf_add(b, s.s->p, s.s->n);
    bool prev_letter = false;
    for (size_t i = 0; i < b->n; i++) {
        unsigned char ch = (unsigned char)b->p[i];
        bool letter = isalpha(ch);
        if (mode == 0) b->p[i] = (char)tolower(ch);
        else if (mode == 1) b->p[i] = (char)toupper(ch);
        else if (mode == 2) b->p[i] = (char)(prev_letter ? tolower(ch) : toupper(ch));
        else b->p[i] = (char)(i == 0 ? toupper(ch) : tolower(ch));
        prev_letter = letter || (ch >= 0x80) || isdigit(ch) ? (mode == 2 ? (letter || ch >= 0x80) : letter) : false;
        if (mode == 2 && (ch == '\'' )) prev_letter = true;
    }
    return jbuf_str(c, b);
}

static jv do_replace(jctx *c, jv s, jv old, jv neu, int64_t count) {
    kvt_strbuf *b = jbuf(c);
    const char *p = s.s->p;
    size_t n = s.s->n, i = 0;
    int64_t done = 0;
    if (old.s->n == 0) {
        /* Python inserts `new` between every code point (and at both ends) */
        for (; i <= n && (count < 0 || done < count);) {
            kvt_strbuf_add(b, neu.s->p, neu.s->n);
            done++;
            if (i == n) {
                i++;
                break;
            }
            size_t l = cp_len_at(p, n, i);
            kvt_strbuf_add(b, p + i, l);
            i += l;
        }
        if (i <= n) kvt_strbuf_add(b, p + i, n - i);
        return jbuf_str(c, b);
    }
    while (i < n && (count < 0 || done < count)) {
        const char *hit = memmem(p + i, n - i, old.s->p, old.s->n);
        if (!hit) break;
        kvt_strbuf_add(b, p + i, (size_t)(hit - (p + i)));
        kvt_strbuf_add(b, neu.s->p, neu.s->n);
        i = (size_t)(hit - p) + old.s->n;
        done++;
        if (b->n > c->lim.max_output) jraise(c, "replace result too large");
    }
    kvt_strbuf_add(b, p + i, n - i);
    return jbuf_str(c, b);
}

static jv do_split(jctx *c, jv s, jv sep, int64_t maxsplit, bool from_right) {
    jv out = jv_list(&c->a, 0);
    const char *p = s.s->p;
    size_t n = s.s->n;
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) { /* whitespace runs */
        jv parts = jv_list(&c->a, 0);
        size_t i = 0;
        if (!from_right) {
            int64_t done = 0;
            while (i < n) {
                while (i < n && ws(p[i])) i++;
                if (i >= n) break;
                if (maxsplit >= 0 && done >= maxsplit) { /* the rest, its trailing whitespace kept */
                    jl_push(&c->a, parts.l, jv_str_ref(&c->a, p + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n && !ws(p[i])) i++;
                jl_push(&c->a, parts.l, jv_str_ref(&c->a, p + st, i - st));
                done++;
            }
            return parts;
        }
        size_t e = n;
        int64_t done = 0;
        while (e > 0) {
            while (e > 0 && ws(p[e - 1])) e--;
            if (e == 0) break;
            if (maxsplit >= 0 && done >= maxsplit) { /* the rest, its leading whitespace kept */
                jl_push(&c->a, parts.l, jv_str_ref(&c->a, p, e));
                break;
            }
            size_t st = e;
            while (st > 0 && !ws(p[st - 1])) st--;
            jl_push(&c->a, parts.l, jv_str_ref(&c->a, p + st, e - st));
            e = st;
            done++;
        }
        for (size_t k = parts.l->n; k-- > 0;) jl_push(&c->a, out.l, parts.l->v[k]);
        return out;
    }
    if (sep.t != JV_STR) jraise(c, "must be str or None, not %s", jv_type_name(sep));
    if (sep.s->n == 0) jraise(c, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sep.s->p, sep.s->n) : NULL;
            if (!hit) {
                jl_push(&c->a, out.l, jv_str_ref(&c->a, p + i, n - i));
                return out;
            }
            jl_push(&c->a, out.l, jv_str_ref(&c->a, p + i, (size_t)(hit - p) - i));
            i = (size_t)(hit - p) + sep.s->n;
            done++;
            jstep(c, 1);
        }
    }
    jv parts = jv_list(&c->a, 0);
    size_t e = n;
    int64_t done = 0;
    for (;;) {
        const char *hit = NULL;
        if (maxsplit < 0 || done < maxsplit)
            for (size_t k = e; k >= sep.s->n; k--)
                if (!memcmp(p + k - sep.s->n, sep.s->p, sep.s->n)) {
                    hit = p + k - sep.s->n;
                    break;
                }
        if (!hit) {
            jl_push(&c->a, parts.l, jv_str_ref(&c->a, p, e));
            break;
        }
        size_t hs = (size_t)(hit - p);
        jl_push(&c->a, parts.l, jv_str_ref(&c->a, p + hs + sep.s->n, e - hs - sep.s->n));
        e = hs;
        done++;
        jstep(c, 1);
    }
    for (size_t k = parts.l->n; k-- > 0;) jl_push(&c->a, out.l, parts.l->v[k]);
    return out;
}

static bool affix(jv s, jv x, bool end) {
    if (x.t != JV_STR || x.s->n > s.s->n) return false;
    return !memcmp(end ? s.s->p + s.s->n - x.s->n : s.s->p, x.s->p, x.s->n);
}

/* argument access: positional i, or keyword name */
typedef struct {
    jv *a;
    size_t na;
    const jstr **kn;
    jv *kv;
    size_t nk;
} argv_t;
static bool arg(const argv_t *A, size_t i, const char *name, jv *out) {
    for (size_t k = 0; k < A->nk; k++)
        if (name && eqs(A->kn[k], name)) {
            *out = A->kv[k];
            return true;
        }
    if (i < A->na) {
        *out = A->a[i];
        return true;
    }
    return false;
}
static jv argd(const argv_t *A, size_t i, const char *name, jv def) {
    jv v;
    return arg(A, i, name, &v) ? v : def;
}

/* attribute getter used by map/selectattr/sort/...: dotted path, items then attributes */
static jv attr_path(jctx *c, jv obj, jv path) {
    jv ps = jv_as_str(c, path);
    const char *p = ps.s->p;
    size_t n = ps.s->n, i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        const jstr *part = jstr_new(&c->a, p + i, j - i);
        jv key = {0};
        key.t = JV_STR;
        key.s = part;
        bool all_digits = part->n > 0;
        for (size_t k = 0; k < part->n; k++) all_digits &= isdigit((unsigned char)part->p[k]) != 0;
        if (obj.t == JV_UNDEF) return obj;
        if (all_digits && obj.t == JV_LIST) {
            int64_t ix = atoll(part->p);
            obj = ix < (int64_t)obj.l->n ? obj.l->v[ix] : jv_undef(part);
        } else if (obj.t == JV_DICT || obj.t == JV_NS) {
            jv *v = jd_get(obj.d, key);
            obj = v ? *v : (obj.t == JV_DICT ? jb_getattr(c, obj, part) : jv_undef(part));
        } else obj = jb_getattr(c, obj, part);
        i = j + 1;
    }
    return obj;
}

jv jb_html_escape(jctx *c, jv s) {
    if (s.markup) return s;
    kvt_strbuf *b = jbuf(c);
    for (size_t i = 0; i < s.s->n; i++) {
        char ch = s.s->p[i];
        switch (ch) {
        case '&': kvt_strbuf_addstr(b, "&amp;"); break;
        case '<': kvt_strbuf_addstr(b, "&lt;"); break;
        case '>': kvt_strbuf_addstr(b, "&gt;"); break;
        case '"': kvt_strbuf_addstr(b, "&#34;"); break;
        case '\'': kvt_strbuf_addstr(b, "&#39;"); break;
        default: kvt_strbuf_add(b, &ch, 1);
        }
    }
    jv r = jbuf_str(c, b);
    r.markup = 1;
    return r;
}

/* Markup's str methods return Markup */
static jv keep_markup(jv from, jv r) {
    if (from.t == JV_STR && from.markup && r.t == JV_STR) r.markup = 1;
    return r;
}

static jv lower_if_str(jctx *c, jv v, bool case_sensitive) {
    if (!case_sensitive && v.t == JV_STR) return case_map(c, v, 0);
    return v;
}

typedef struct {
    jctx *c;
    jv *keys;
    bool reverse;
} sort_ctx;
static int sort_cmp(const void *x, const void *y, void *u) {
    sort_ctx *s = u;
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    int r = jv_cmp(s->c, s->keys[i], s->keys[j], 0);
    if (s->reverse) r = -r;
    if (r == 0) r = i < j ? -1 : i > j; /* stable */
    return r;
}
static jv sorted(jctx *c, jlist *l, jv *keys, bool reverse) {
    size_t *ord = ja_alloc(&c->a, (l->n + 1) * sizeof(size_t));
    for (size_t i = 0; i < l->n; i++) ord[i] = i;
    sort_ctx s = {c, keys, reverse};
    jstep(c, l->n);
    jsort(c, ord, l->n, sort_cmp, &s);
    jv out = jv_list(&c->a, l->n);
    for (size_t i = 0; i < l->n; i++) jl_push(&c->a, out.l, l->v[ord[i]]);
    return out;
}

static int64_t to_int(jctx *c, jv v, const char *what) {
    if (v.t == JV_INT) return v.i;
    if (v.t == JV_BOOL) return v.b;
    if (v.t == JV_FLOAT && isfinite(v.f) && fabs(v.f) < 9.2e18) return (int64_t)v.f;
    jraise(c, "'%s' object cannot be interpreted as an integer (%s)", jv_type_name(v), what);
}

/* the filter `int`: Python int(value) with jinja's fallbacks */
static jv f_int(jctx *c, jv x, jv def, int64_t base) {
    if (x.t == JV_INT) return x;
    if (x.t == JV_BOOL) return jv_int(x.b);
    if (x.t == JV_FLOAT) return isfinite(x.f) && fabs(x.f) < 9.2e18 ? jv_int((int64_t)x.f) : def;
    if (x.t == JV_STR) {
        char buf[64];
        jv t = do_strip(c, x, NULL, true, true);
        if (t.s->n == 0 || t.s->n >= sizeof buf) return def;
        memcpy(buf, t.s->p, t.s->n);
        buf[t.s->n] = 0;
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, (int)base);
        if (!*end && !errno) return jv_int(v);
        double d = strtod(buf, &end);
        if (!*end && isfinite(d) && fabs(d) < 9.2e18) return jv_int((int64_t)d);
    }
    return def;
}

static jv indent_f(jctx *c, jv s, jv width, bool first, bool blank) {
    jv ind = width.t == JV_STR ? width : jv_none();
    kvt_strbuf *ib = NULL;
    if (ind.t != JV_STR) {
        int64_t w = to_int(c, width, "indent width");
        if (w < 0) w = 0;
        if (w > 4096) jraise(c, "indent width too large");
        ib = jbuf(c);
        for (int64_t i = 0; i < w; i++) kvt_strbuf_addstr(ib, " ");
        ind = jbuf_str(c, ib);
    }
    /* s + "\n", then splitlines */
    jlist *lines = jv_list(&c->a, 0).l;
    const char *p = s.s->p;
    size_t n = s.s->n, i = 0;
    while (i <= n) {
        size_t st = i;
        while (i < n && p[i] != '\n' && p[i] != '\r') i++;
        jl_push(&c->a, lines, jv_str_ref(&c->a, p + st, i - st));
        if (i >= n) break; /* the appended "\n" ends the last line */
        if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') i++;
        i++;
        if (i == n) break;
    }
    jstep(c, lines->n);
    kvt_strbuf *b = jbuf(c);
    if (first) kvt_strbuf_add(b, ind.s->p, ind.s->n);
    for (size_t k = 0; k < lines->n; k++) {
        jv l = lines->v[k];
        if (k) {
            kvt_strbuf_addstr(b, "\n");
            if (blank || l.s->n) kvt_strbuf_add(b, ind.s->p, ind.s->n);
        }
        kvt_strbuf_add(b, l.s->p, l.s->n);
    }
    return jbuf_str(c, b);
}

static jv tojson_f(jctx *c, jv x, const argv_t *A) {
    jv ea = argd(A, 0, "ensure_ascii", jv_bool(false));
    jv ind = argd(A, 1, "indent", jv_none());
    jv seps = argd(A, 2, "separators", jv_none());
    jv sk = argd(A, 3, "sort_keys", jv_bool(false));
    const jstr *indent = NULL, *isep = NULL, *ksep = NULL;
    if (ind.t == JV_INT || ind.t == JV_BOOL) {
        int64_t w = ind.t == JV_INT ? ind.i : ind.b;
        if (w > 4096) jraise(c, "tojson indent too large");
        kvt_strbuf *b = jbuf(c);
        for (int64_t i = 0; i < w; i++) kvt_strbuf_addstr(b, " ");
        indent = jbuf_str(c, b).s;
    } else if (ind.t == JV_STR) indent = ind.s;
    else if (ind.t != JV_NONE) jraise(c, "tojson: bad indent (%s)", jv_type_name(ind));
    if (seps.t == JV_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].t != JV_STR || seps.l->v[1].t != JV_STR) jraise(c, "tojson: separators must be two strings");
        isep = seps.l->v[0].s;
        ksep = seps.l->v[1].s;
    } else if (seps.t != JV_NONE) jraise(c, "tojson: bad separators");
    kvt_strbuf *b = jbuf(c);
    bool save = c->json_ascii;
    c->json_ascii = jv_truthy(ea);
    jv_tojson(c, b, x, indent, isep, ksep, jv_truthy(sk), 0);
    c->json_ascii = save;
    return jbuf_str(c, b);
}

/* select/reject/selectattr/rejectattr: apply a test (or truthiness) */
static bool apply_test(jctx *c, const jnode *n, jv x, jv *targs, size_t ntargs) {
    if (ntargs == 0) return jv_truthy(x);
    jv name = targs[0];
    if (name.t != JV_STR) jraise(c, "test name must be a string");
    int id = jb_test_id(name.s->p, name.s->n);
    if (id < 0) jraise(c, "No test named '%.*s'.", (int)name.s->n, name.s->p);
    return jb_test(c, n, id, x, targs + 1, ntargs - 1);
}

static jv filter_impl(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                      size_t nkw, jframe *f);
jv jb_filter(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
             size_t nkw, jframe *f) {
    jv r = filter_impl(c, n, id, x, args, nargs, kwn, kwv, nkw, f);
    switch (id) {
    case F_TRIM: case F_STRING: case F_UPPER: case F_LOWER: case F_CAPITALIZE: case F_TITLE: case F_INDENT:
    case F_CENTER:
        return keep_markup(x, r);
    }
    return r;
}

static jv filter_impl(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                      size_t nkw, jframe *f) {
    (void)f;
    argv_t A = {args, nargs, kwn, kwv, nkw};
    switch (id) {
    case F_TOJSON: return tojson_f(c, x, &A);
    case F_LENGTH:
        switch (x.t) {
        case JV_STR: return jv_int((int64_t)ju_len(x.s->p, x.s->n));
        case JV_LIST:
            if (x.l->kind == JL_GEN) jraise(c, "object of type 'generator' has no len()");
            return jv_int((int64_t)x.l->n);
        case JV_DICT: return jv_int((int64_t)x.d->n);
        case JV_UNDEF: return jv_int(0);
        default: jraise(c, "object of type '%s' has no len()", jv_type_name(x));
        }
    case F_TRIM: {
        jv ch = argd(&A, 0, "chars", jv_none());
        return do_strip(c, S(c, x), ch.t == JV_STR ? ch.s : NULL, true, true);
    }
    case F_DEFAULT: {
        jv dv = argd(&A, 0, "default_value", jv_str_ref(&c->a, "", 0));
        bool boolean = jv_truthy(argd(&A, 1, "boolean", jv_bool(false)));
        if (x.t == JV_UNDEF || (boolean && !jv_truthy(x))) return dv;
        return x;
    }
    case F_JOIN: {
        jv sep = argd(&A, 0, "d", jv_str_ref(&c->a, "", 0));
        jv at;
        bool has_attr = arg(&A, 1, "attribute", &at);
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        sep = S(c, sep);
        kvt_strbuf *b = jbuf(c);
        for (size_t i = 0; i < l->n; i++) {
            if (i) kvt_strbuf_add(b, sep.s->p, sep.s->n);
            jv it = has_attr ? attr_path(c, l->v[i], at) : l->v[i];
            if (it.t != JV_UNDEF) jv_to_str(c, b, it);
            if (b->n > c->lim.max_output) jraise(c, "join result too large");
        }
        return jbuf_str(c, b);
    }
    case F_MAP: {
        jv out = jv_list(&c->a, 0);
        out.l->kind = JL_GEN;
        if (!jv_truthy(x)) return out;
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        jv at;
        if (arg(&A, (size_t)-1, "attribute", &at)) {
            jv def;
            bool has_def = arg(&A, (size_t)-1, "default", &def);
            for (size_t i = 0; i < l->n; i++) {
                jv v = attr_path(c, l->v[i], at);
                jl_push(&c->a, out.l, v.t == JV_UNDEF && has_def ? def : v);
            }
            return out;
        }
        if (nargs == 0) jraise(c, "map requires a filter argument");
        if (args[0].t != JV_STR) jraise(c, "map: filter name must be a string");
        int fid = jb_filter_id(args[0].s->p, args[0].s->n);
        if (fid < 0) jraise(c, "No filter named '%.*s'.", (int)args[0].s->n, args[0].s->p);
        for (size_t i = 0; i < l->n; i++)
            jl_push(&c->a, out.l, jb_filter(c, n, fid, l->v[i], args + 1, nargs - 1, kwn, kwv, nkw, f));
        return out;
    }
    case F_SELECT:
    case F_REJECT: {
        jv out = jv_list(&c->a, 0);
        out.l->kind = JL_GEN;
        if (!jv_truthy(x)) return out;
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        for (size_t i = 0; i < l->n; i++)
            if (apply_test(c, n, l->v[i], args, nargs) == (id == F_SELECT)) jl_push(&c->a, out.l, l->v[i]);
        return out;
    }
    case F_SELECTATTR:
    case F_REJECTATTR: {
        jv out = jv_list(&c->a, 0);
        out.l->kind = JL_GEN;
        if (!jv_truthy(x)) return out;
        if (nargs == 0) jraise(c, "selectattr requires an attribute");
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        for (size_t i = 0; i < l->n; i++) {
            jv v = attr_path(c, l->v[i], args[0]);
            if (apply_test(c, n, v, args + 1, nargs - 1) == (id == F_SELECTATTR)) jl_push(&c->a, out.l, l->v[i]);
        }
        return out;
    }
    case F_ITEMS: {
        jv out = jv_list(&c->a, x.t == JV_DICT ? x.d->n : 0);
        out.l->kind = JL_GEN;
        if (x.t == JV_UNDEF) return out;
        if (x.t != JV_DICT) jraise(c, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < x.d->n; i++) {
            jv t = jv_list(&c->a, 2);
            t.l->tuple = true;
            jl_push(&c->a, t.l, x.d->k[i]);
            jl_push(&c->a, t.l, x.d->v[i]);
            jl_push(&c->a, out.l, t);
        }
        return out;
    }
    case F_FIRST: {
        if (x.t == JV_LIST && x.l->kind == JL_GEN) return x.l->pos < x.l->n ? x.l->v[x.l->pos++] : jv_undef(NULL);
        jlist *l = jv_iterate(c, x);
        return l->n ? l->v[0] : jv_undef(NULL);
    }
    case F_LAST: {
        if (x.t == JV_UNDEF) jraise(c, "undefined value has no last item");
        if (x.t == JV_LIST && x.l->kind == JL_GEN) jraise(c, "'generator' object is not reversible");
        jlist *l = jv_iterate(c, x);
        return l->n ? l->v[l->n - 1] : jv_undef(NULL);
    }
    case F_STRING: return S(c, x);
    case F_SAFE: {
        jv r = S(c, x);
        r.markup = 1;
        return r;
    }
    case F_INT: {
        jv def = argd(&A, 0, "default", jv_int(0));
        jv base = argd(&A, 1, "base", jv_int(10));
        int64_t b = to_int(c, base, "base");
        if (b < 2 || b > 36) b = 10;
        return f_int(c, x, def, b);
    }
    case F_FLOAT: {
        jv def = argd(&A, 0, "default", jv_float(0.0));
        if (x.t == JV_FLOAT) return x;
        if (x.t == JV_INT || x.t == JV_BOOL) return jv_float((double)(x.t == JV_INT ? x.i : x.b));
        if (x.t == JV_STR) {
            jv t = do_strip(c, x, NULL, true, true);
            char buf[64];
            if (t.s->n && t.s->n < sizeof buf) {
                memcpy(buf, t.s->p, t.s->n);
                buf[t.s->n] = 0;
                char *end;
                double d = strtod(buf, &end);
                if (!*end) return jv_float(d);
            }
        }
        return def;
    }
    case F_UPPER: return case_map(c, S(c, x), 1);
    case F_LOWER: return case_map(c, S(c, x), 0);
    case F_CAPITALIZE: return case_map(c, S(c, x), 3);
    case F_TITLE: return case_map(c, S(c, x), 2);
    case F_REPLACE: {
        if (nargs < 2) jraise(c, "replace needs two arguments");
        jv cnt = argd(&A, 2, "count", jv_none());
        return do_replace(c, S(c, x), S(c, args[0]), S(c, args[1]), cnt.t == JV_NONE ? -1 : to_int(c, cnt, "count"));
    }
    case F_LIST: {
        jlist *l = jv_iterate(c, x);
        jv out = jv_list(&c->a, l->n);
        for (size_t i = 0; i < l->n; i++) jl_push(&c->a, out.l, l->v[i]);
        return out;
    }
    case F_UNIQUE: {
        bool cs = jv_truthy(argd(&A, 0, "case_sensitive", jv_bool(false)));
        jv at;
        bool has_attr = arg(&A, 1, "attribute", &at);
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        jv out = jv_list(&c->a, 0), seen = jv_dict(&c->a);
        out.l->kind = JL_GEN;
        for (size_t i = 0; i < l->n; i++) {
            jv k = lower_if_str(c, has_attr ? attr_path(c, l->v[i], at) : l->v[i], cs);
            if (k.t == JV_LIST || k.t == JV_DICT) jraise(c, "unhashable type: '%s'", jv_type_name(k));
            if (jd_get(seen.d, k)) continue;
            jd_set(&c->a, seen.d, k, jv_none());
            jl_push(&c->a, out.l, l->v[i]);
        }
        return out;
    }
    case F_DICTSORT: {
        if (x.t != JV_DICT) jraise(c, "dictsort needs a mapping");
        bool cs = jv_truthy(argd(&A, 0, "case_sensitive", jv_bool(false)));
        jv by = argd(&A, 1, "by", jv_str_ref(&c->a, "key", 3));
        bool rev = jv_truthy(argd(&A, 2, "reverse", jv_bool(false)));
        int pos = by.t == JV_STR && eqs(by.s, "value") ? 1 : 0;
        jv pairs = jb_filter(c, n, F_ITEMS, x, NULL, 0, NULL, NULL, 0, f);
        pairs.l->kind = JL_LIST;
        jv *keys = ja_alloc(&c->a, (pairs.l->n + 1) * sizeof(jv));
        for (size_t i = 0; i < pairs.l->n; i++) keys[i] = lower_if_str(c, pairs.l->v[i].l->v[pos], cs);
        return sorted(c, pairs.l, keys, rev);
    }
    case F_SORT: {
        bool rev = jv_truthy(argd(&A, 0, "reverse", jv_bool(false)));
        bool cs = jv_truthy(argd(&A, 1, "case_sensitive", jv_bool(false)));
        jv at;
        bool has_attr = arg(&A, 2, "attribute", &at);
        jlist *l = jv_iterate(c, x);
        jv *keys = ja_alloc(&c->a, (l->n + 1) * sizeof(jv));
        for (size_t i = 0; i < l->n; i++) keys[i] = lower_if_str(c, has_attr ? attr_path(c, l->v[i], at) : l->v[i], cs);
        return sorted(c, l, keys, rev);
    }
    case F_MIN:
    case F_MAX: {
        bool cs = jv_truthy(argd(&A, 0, "case_sensitive", jv_bool(false)));
        jv at;
        bool has_attr = arg(&A, 1, "attribute", &at);
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        if (!l->n) return jv_undef(NULL);
        size_t best = 0;
        jv bk = lower_if_str(c, has_attr ? attr_path(c, l->v[0], at) : l->v[0], cs);
        for (size_t i = 1; i < l->n; i++) {
            jv k = lower_if_str(c, has_attr ? attr_path(c, l->v[i], at) : l->v[i], cs);
            int r = jv_cmp(c, k, bk, 0);
            if (id == F_MIN ? r < 0 : r > 0) best = i, bk = k;
        }
        return l->v[best];
    }
    case F_SUM: {
        jv at;
        bool has_attr = arg(&A, 0, "attribute", &at);
        jv acc = argd(&A, 1, "start", jv_int(0));
        jlist *l = jv_iterate(c, x);
        jstep(c, l->n);
        for (size_t i = 0; i < l->n; i++) {
            jv v = has_attr ? attr_path(c, l->v[i], at) : l->v[i];
            if (!((acc.t == JV_INT || acc.t == JV_FLOAT || acc.t == JV_BOOL) && (v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL)))
                jraise(c, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(acc), jv_type_name(v));
            if (acc.t == JV_FLOAT || v.t == JV_FLOAT)
                acc = jv_float((acc.t == JV_FLOAT ? acc.f : (double)(acc.t == JV_INT ? acc.i : acc.b)) +
                               (v.t == JV_FLOAT ? v.f : (double)(v.t == JV_INT ? v.i : v.b)));
            else {
                int64_t r;
                if (__builtin_add_overflow(acc.t == JV_INT ? acc.i : acc.b, v.t == JV_INT ? v.i : v.b, &r)) jraise(c, "integer overflow");
                acc = jv_int(r);
            }
        }
        return acc;
    }
    case F_ESCAPE: return jb_html_escape(c, S(c, x));
    case F_INDENT: {
        jv w = argd(&A, 0, "width", jv_int(4));
        bool first = jv_truthy(argd(&A, 1, "first", jv_bool(false)));
        bool blank = jv_truthy(argd(&A, 2, "blank", jv_bool(false)));
        return indent_f(c, S(c, x), w, first, blank);
    }
    case F_WORDCOUNT: {
        jv s = S(c, x);
        int64_t k = 0;
        bool in = false;
        for (size_t i = 0; i < s.s->n; i++) {
            bool w = isalnum((unsigned char)s.s->p[i]) || s.s->p[i] == '_' || (unsigned char)s.s->p[i] >= 0x80;
            if (w && !in) k++;
            in = w;
        }
        return jv_int(k);
    }
    case F_ROUND: {
        int64_t prec = to_int(c, argd(&A, 0, "precision", jv_int(0)), "precision");
        jv m = argd(&A, 1, "method", jv_str_ref(&c->a, "common", 6));
        if (x.t != JV_INT && x.t != JV_FLOAT && x.t != JV_BOOL) jraise(c, "round needs a number");
        if (x.t != JV_FLOAT && (m.t != JV_STR || eqs(m.s, "common"))) return jv_int(x.t == JV_INT ? x.i : x.b);
        double v = x.t == JV_FLOAT ? x.f : (double)(x.t == JV_INT ? x.i : x.b);
        if (prec > 15 || prec < -15) return jv_float(v);
        double s = pow(10.0, (double)prec);
        if (m.t == JV_STR && eqs(m.s, "floor")) return jv_float(floor(v * s) / s);
        if (m.t == JV_STR && eqs(m.s, "ceil")) return jv_float(ceil(v * s) / s);
        return jv_float(nearbyint(v * s) / s);
    }
    case F_ABS:
        if (x.t == JV_INT) {
            if (x.i == INT64_MIN) jraise(c, "integer overflow");
            return jv_int(x.i < 0 ? -x.i : x.i);
        }
        if (x.t == JV_BOOL) return jv_int(x.b);
        if (x.t == JV_FLOAT) return jv_float(fabs(x.f));
        jraise(c, "bad operand type for abs(): '%s'", jv_type_name(x));
    case F_CENTER: {
        jv s = S(c, x);
        int64_t w = to_int(c, argd(&A, 0, "width", jv_int(80)), "width");
        int64_t len = (int64_t)ju_len(s.s->p, s.s->n);
        if (w > 100000) jraise(c, "center width too large");
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        kvt_strbuf *b = jbuf(c);
        for (int64_t i = 0; i < left; i++) kvt_strbuf_addstr(b, " ");
        kvt_strbuf_add(b, s.s->p, s.s->n);
        for (int64_t i = 0; i < pad - left; i++) kvt_strbuf_addstr(b, " ");
        return jbuf_str(c, b);
    }
    case F_REVERSE: {
        if (x.t == JV_STR) {
            kvt_strbuf *b = jbuf(c);
            for (size_t i = x.s->n; i > 0;) {
                size_t st = cp_start_before(x.s->p, i);
                kvt_strbuf_add(b, x.s->p + st, i - st);
                i = st;
            }
            return jbuf_str(c, b);
        }
        if (x.t == JV_LIST && x.l->kind == JL_GEN) jraise(c, "'generator' object is not reversible");
        jlist *l = jv_iterate(c, x);
        jv out = jv_list(&c->a, l->n);
        for (size_t i = l->n; i-- > 0;) jl_push(&c->a, out.l, l->v[i]);
        out.l->kind = JL_GEN;
        return out;
    }
    case F_ATTR: {
        if (nargs < 1 || args[0].t != JV_STR) jraise(c, "attr needs a name");
        if (x.t == JV_NS) {
            jv *v = jd_get(x.d, args[0]);
            return v ? *v : jv_undef(args[0].s);
        }
        return jb_getattr(c, x, args[0].s);
    }
    case F_TRUNCATE: {
        jv s = S(c, x);
        int64_t len = to_int(c, argd(&A, 0, "length", jv_int(255)), "length");
        bool killwords = jv_truthy(argd(&A, 1, "killwords", jv_bool(false)));
        jv end = S(c, argd(&A, 2, "end", jv_str_ref(&c->a, "...", 3)));
        int64_t leeway = to_int(c, argd(&A, 3, "leeway", jv_int(5)), "leeway");
        int64_t sl = (int64_t)ju_len(s.s->p, s.s->n), el = (int64_t)ju_len(end.s->p, end.s->n);
        if (sl <= len + leeway) return s;
        int64_t keep = len - el;
        if (keep < 0) keep = 0;
        size_t cut = ju_offset(s.s->p, s.s->n, (size_t)keep);
        if (!killwords) {
            size_t sp = cut;
            while (sp > 0 && s.s->p[sp - 1] != ' ') sp--;
            if (sp > 0) cut = sp - 1;
        }
        kvt_strbuf *b = jbuf(c);
        kvt_strbuf_add(b, s.s->p, cut);
        kvt_strbuf_add(b, end.s->p, end.s->n);
        return jbuf_str(c, b);
    }
    }
    jraise_node(c, n, "filter not implemented");
}

bool jb_test(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs) {
    jv a0 = nargs ? args[0] : jv_undef(NULL);
    switch (id) {
    case T_DEFINED: return x.t != JV_UNDEF;
    case T_UNDEFINED: return x.t == JV_UNDEF;
    case T_NONE: return x.t == JV_NONE;
    case T_STRING_: return x.t == JV_STR;
    case T_NUMBER: return x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL;
    case T_INTEGER: return x.t == JV_INT;
    case T_FLOAT_: return x.t == JV_FLOAT;
    case T_BOOLEAN: return x.t == JV_BOOL;
    case T_MAPPING: return x.t == JV_DICT;
    case T_ITERABLE: return x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT || x.t == JV_UNDEF;
    case T_SEQUENCE:
        return x.t == JV_STR || (x.t == JV_LIST && !jl_special(x.l)) || x.t == JV_DICT || x.t == JV_UNDEF;
    case T_CALLABLE: return x.t == JV_MACRO || x.t == JV_FUNC;
    case T_TRUE: return x.t == JV_BOOL && x.b;
    case T_FALSE: return x.t == JV_BOOL && !x.b;
    case T_DIVISIBLEBY: {
        if (!nargs) jraise(c, "divisibleby needs an argument");
        jv r = jv_int(0);
        if ((x.t == JV_INT || x.t == JV_BOOL) && (a0.t == JV_INT || a0.t == JV_BOOL)) {
            int64_t d = a0.t == JV_INT ? a0.i : a0.b, v = x.t == JV_INT ? x.i : x.b;
            if (d == 0) jraise(c, "integer division or modulo by zero");
            if (d == -1) return true;
            return v % d == 0;
        }
        if ((x.t == JV_FLOAT || x.t == JV_INT) && (a0.t == JV_FLOAT || a0.t == JV_INT)) {
            double d = a0.t == JV_FLOAT ? a0.f : (double)a0.i, v = x.t == JV_FLOAT ? x.f : (double)x.i;
            if (d == 0) jraise(c, "float modulo");
            return fmod(v, d) == 0;
        }
        (void)r;
        jraise(c, "unsupported operand type(s) for %%: '%s' and '%s'", jv_type_name(x), jv_type_name(a0));
    }
    case T_EQ: return jv_eq(c, x, a0, 0);
    case T_NE: return !jv_eq(c, x, a0, 0);
    case T_LT: return jv_cmp(c, x, a0, 0) < 0;
    case T_LE: return jv_cmp(c, x, a0, 0) <= 0;
    case T_GT: return jv_cmp(c, x, a0, 0) > 0;
    case T_GE: return jv_cmp(c, x, a0, 0) >= 0;
    case T_IN:
        if (a0.t == JV_STR) {
            if (x.t != JV_STR) jraise(c, "'in <string>' requires string as left operand");
            return memmem(a0.s->p, a0.s->n, x.s->p, x.s->n) != NULL || x.s->n == 0;
        }
        if (a0.t == JV_LIST) {
            for (size_t i = 0; i < a0.l->n; i++)
                if (jv_eq(c, x, a0.l->v[i], 0)) return true;
            return false;
        }
        if (a0.t == JV_DICT) return jd_get(a0.d, x) != NULL;
        if (a0.t == JV_UNDEF) return false;
        jraise(c, "argument of type '%s' is not iterable", jv_type_name(a0));
    case T_ODD:
    case T_EVEN: {
        if (x.t != JV_INT && x.t != JV_BOOL) jraise(c, "odd/even need an integer");
        int64_t v = x.t == JV_INT ? x.i : x.b;
        return (id == T_ODD) == ((v & 1) != 0);
    }
    case T_LOWER:
    case T_UPPER: {
        jv s = S(c, x);
        bool cased = false;
        for (size_t i = 0; i < s.s->n; i++) {
            unsigned char ch = (unsigned char)s.s->p[i];
            if (id == T_LOWER ? isupper(ch) : islower(ch)) return false;
            cased |= isalpha(ch) != 0;
        }
        return cased;
    }
    case T_SAMEAS:
        if (x.t != a0.t) return false;
        switch (x.t) {
        case JV_NONE:
        case JV_UNDEF: return true;
        case JV_BOOL: return x.b == a0.b;
        case JV_INT: return x.i == a0.i && x.i >= -5 && x.i <= 256; /* CPython small-int cache */
        default: return x.l == a0.l;
        }
    case T_ESCAPED: return false;
    case T_FILTER: return a0.t == JV_STR && jb_filter_id(a0.s->p, a0.s->n) >= 0;
    case T_TEST: return a0.t == JV_STR && jb_test_id(a0.s->p, a0.s->n) >= 0;
    }
    jraise_node(c, n, "test not implemented");
}

/* ---- strftime on the fixed date ---- */
static int weekday(int y, int m, int d) { /* 0 = Monday */
    static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    if (m < 3) y -= 1;
    int w = (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7; /* 0 = Sunday */
    return (w + 6) % 7;
}
static int yday(int y, int m, int d) {
    static const int cum[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return cum[m - 1] + d + (leap && m > 2);
}
static jv strftime_fixed(jctx *c, jv fmt) {
    static const char *const days[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
    static const char *const months[] = {"January", "February", "March", "April", "May", "June", "July",
                                         "August", "September", "October", "November", "December"};
    if (fmt.t != JV_STR) jraise(c, "strftime() argument 1 must be str, not %s", jv_type_name(fmt));
    const struct tm_fixed *t = &c->now;
    int wd = weekday(t->y, t->mo, t->d);
    kvt_strbuf *b = jbuf(c);
    const char *p = fmt.s->p;
    for (size_t i = 0; i < fmt.s->n; i++) {
        if (p[i] != '%' || i + 1 >= fmt.s->n) {
            kvt_strbuf_add(b, p + i, 1);
            continue;
        }
        char k = p[++i];
        switch (k) {
        case 'Y': kvt_strbuf_printf(b, "%d", t->y); break;
        case 'y': kvt_strbuf_printf(b, "%02d", t->y % 100); break;
        case 'm': kvt_strbuf_printf(b, "%02d", t->mo); break;
        case 'd': kvt_strbuf_printf(b, "%02d", t->d); break;
        case '-': /* %-d, %-m (glibc) */
            if (i + 1 < fmt.s->n && (p[i + 1] == 'd' || p[i + 1] == 'm' || p[i + 1] == 'H')) {
                kvt_strbuf_printf(b, "%d", p[i + 1] == 'd' ? t->d : p[i + 1] == 'm' ? t->mo : t->h);
                i++;
            } else kvt_strbuf_addstr(b, "%-");
            break;
        case 'e': kvt_strbuf_printf(b, "%2d", t->d); break;
        case 'H': kvt_strbuf_printf(b, "%02d", t->h); break;
        case 'I': kvt_strbuf_printf(b, "%02d", t->h % 12 ? t->h % 12 : 12); break;
        case 'M': kvt_strbuf_printf(b, "%02d", t->mi); break;
        case 'S': kvt_strbuf_printf(b, "%02d", t->s); break;
        case 'p': kvt_strbuf_addstr(b, t->h < 12 ? "AM" : "PM"); break;
        case 'B': kvt_strbuf_addstr(b, months[t->mo - 1]); break;
        case 'b':
        case 'h': kvt_strbuf_add(b, months[t->mo - 1], 3); break;
        case 'A': kvt_strbuf_addstr(b, days[wd]); break;
        case 'a': kvt_strbuf_add(b, days[wd], 3); break;
        case 'j': kvt_strbuf_printf(b, "%03d", yday(t->y, t->mo, t->d)); break;
        case 'w': kvt_strbuf_printf(b, "%d", (wd + 1) % 7); break;
        case 'u': kvt_strbuf_printf(b, "%d", wd + 1); break;
        case 'F': kvt_strbuf_printf(b, "%d-%02d-%02d", t->y, t->mo, t->d); break;
        case 'T': kvt_strbuf_printf(b, "%02d:%02d:%02d", t->h, t->mi, t->s); break;
        case 'D': kvt_strbuf_printf(b, "%02d/%02d/%02d", t->mo, t->d, t->y % 100); break;
        case 'Z': break;
        case 'z': kvt_strbuf_addstr(b, "+0000"); break;
        case '%': kvt_strbuf_addstr(b, "%"); break;
        default: kvt_strbuf_add(b, p + i - 1, 2);
        }
    }
    return jbuf_str(c, b);
}

static bool str_all(jv s, int (*pred)(int), bool need_cased) {
    if (!s.s->n) return false;
    for (size_t i = 0; i < s.s->n; i++)
        if (!pred((unsigned char)s.s->p[i])) return false;
    (void)need_cased;
    return true;
}

static jv find_f(jctx *c, jv s, jv sub, bool rev) {
    if (sub.t != JV_STR) jraise(c, "must be str, not %s", jv_type_name(sub));
    const char *hit = NULL;
    if (!rev) hit = sub.s->n ? memmem(s.s->p, s.s->n, sub.s->p, sub.s->n) : s.s->p;
    else
        for (size_t k = s.s->n + 1; k-- > 0;)
            if (k + sub.s->n <= s.s->n && !memcmp(s.s->p + k, sub.s->p, sub.s->n)) {
                hit = s.s->p + k;
                break;
            }
    if (!hit) return jv_int(-1);
    return jv_int((int64_t)ju_len(s.s->p, (size_t)(hit - s.s->p)));
}

static jv call_impl(jctx *c, const jnode *n, jfunc *fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                    size_t nkw);
jv jb_call_func(jctx *c, const jnode *n, jfunc *fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                size_t nkw) {
    jv r = call_impl(c, n, fn, args, nargs, kwn, kwv, nkw);
    switch (fn->id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: case M_UPPER: case M_LOWER: case M_TITLE: case M_CAPITALIZE:
    case M_REPLACE:
        return keep_markup(fn->self, r);
    }
    return r;
}

static jv call_impl(jctx *c, const jnode *n, jfunc *fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                    size_t nkw) {
    argv_t A = {args, nargs, kwn, kwv, nkw};
    jv self = fn->self;
    switch (fn->id) {
    case G_RANGE: {
        int64_t a = 0, b, st = 1;
        if (nargs == 1) b = to_int(c, args[0], "range");
        else if (nargs >= 2) {
            a = to_int(c, args[0], "range");
            b = to_int(c, args[1], "range");
            if (nargs >= 3) st = to_int(c, args[2], "range");
        } else jraise(c, "range expected at least 1 argument, got 0");
        if (st == 0) jraise(c, "range() arg 3 must not be zero");
        jv out = jv_list(&c->a, 0);
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
            jstep(c, 1);
            jl_push(&c->a, out.l, jv_int(i));
            if (__builtin_add_overflow(i, st, &(int64_t){0})) break;
        }
        return out;
    }
    case G_NAMESPACE:
    case G_DICT: {
        jv d = jv_dict(&c->a);
        if (nargs) {
            if (args[0].t != JV_DICT) jraise(c, "%s() positional argument must be a mapping", fn->id == G_DICT ? "dict" : "namespace");
            for (size_t i = 0; i < args[0].d->n; i++) jd_set(&c->a, d.d, args[0].d->k[i], args[0].d->v[i]);
        }
        for (size_t k = 0; k < nkw; k++) {
            jv key = {0};
            key.t = JV_STR;
            key.s = kwn[k];
            jd_set(&c->a, d.d, key, kwv[k]);
        }
        if (fn->id == G_NAMESPACE) d.t = JV_NS;
        return d;
    }
    case G_RAISE: {
        jv m = nargs ? S(c, args[0]) : jv_str_ref(&c->a, "", 0);
        jraise(c, "%.*s", (int)(m.s->n > 4000 ? 4000 : m.s->n), m.s->p);
    }
    case G_STRFTIME: return strftime_fixed(c, nargs ? args[0] : argd(&A, 0, "format", jv_undef(NULL)));
    case M_CYCLE: {
        if (!nargs) jraise(c, "no items for cycling given");
        return args[self.lp->i % nargs];
    }
    /* dict */
    case M_GET: {
        if (!nargs) jraise(c, "get expected at least 1 argument, got 0");
        jv *v = jd_get(self.d, args[0]);
        return v ? *v : (nargs > 1 ? args[1] : jv_none());
    }
    case M_ITEMS: {
        jv out = jb_filter(c, n, F_ITEMS, self, NULL, 0, NULL, NULL, 0, NULL);
        out.l->kind = JL_ITEMS;
        return out;
    }
    case M_KEYS:
    case M_VALUES: {
        jv out = jv_list(&c->a, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) jl_push(&c->a, out.l, fn->id == M_KEYS ? self.d->k[i] : self.d->v[i]);
        out.l->kind = fn->id == M_KEYS ? JL_KEYS : JL_VALUES;
        return out;
    }
    case M_LINDEX:
    case M_LCOUNT: {
        if (!nargs) jraise(c, "%s() takes at least 1 argument", fn->id == M_LINDEX ? "index" : "count");
        int64_t k = 0;
        jstep(c, self.l->n);
        for (size_t i = 0; i < self.l->n; i++)
            if (jv_eq(c, self.l->v[i], args[0], 0)) {
                if (fn->id == M_LINDEX) return jv_int((int64_t)i);
                k++;
            }
        if (fn->id == M_LINDEX) jraise(c, "value is not in list");
        return jv_int(k);
    }
    }
    /* str methods */
    if (self.t != JV_STR) jraise_node(c, n, "'%s' object is not callable", jv_type_name(self));
    switch (fn->id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        jv ch = argd(&A, 0, "chars", jv_none());
        if (ch.t != JV_NONE && ch.t != JV_STR) jraise(c, "strip arg must be None or str");
        return do_strip(c, self, ch.t == JV_STR ? ch.s : NULL, fn->id != M_RSTRIP, fn->id != M_LSTRIP);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        jv sep = argd(&A, 0, "sep", jv_none());
        int64_t mx = to_int(c, argd(&A, 1, "maxsplit", jv_int(-1)), "maxsplit");
        return do_split(c, self, sep, mx, fn->id == M_RSPLIT);
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (!nargs) jraise(c, "startswith/endswith need an argument");
        if (args[0].t == JV_LIST && args[0].l->tuple) {
            for (size_t i = 0; i < args[0].l->n; i++)
                if (affix(self, args[0].l->v[i], fn->id == M_ENDSWITH)) return jv_bool(true);
            return jv_bool(false);
        }
        if (args[0].t != JV_STR) jraise(c, "startswith first arg must be str or a tuple of str, not %s", jv_type_name(args[0]));
        return jv_bool(affix(self, args[0], fn->id == M_ENDSWITH));
    }
    case M_REPLACE: {
        if (nargs < 2 || args[0].t != JV_STR || args[1].t != JV_STR) jraise(c, "replace() needs two strings");
        return do_replace(c, self, args[0], args[1], nargs > 2 ? to_int(c, args[2], "count") : -1);
    }
    case M_UPPER: return case_map(c, self, 1);
    case M_LOWER: return case_map(c, self, 0);
    case M_TITLE: return case_map(c, self, 2);
    case M_CAPITALIZE: return case_map(c, self, 3);
    case M_FIND: return find_f(c, self, nargs ? args[0] : jv_none(), false);
    case M_RFIND: return find_f(c, self, nargs ? args[0] : jv_none(), true);
    case M_INDEX: {
        jv r = find_f(c, self, nargs ? args[0] : jv_none(), false);
        if (r.i < 0) jraise(c, "substring not found");
        return r;
    }
    case M_COUNT: {
        if (!nargs || args[0].t != JV_STR) jraise(c, "count() needs a string");
        if (!args[0].s->n) return jv_int((int64_t)ju_len(self.s->p, self.s->n) + 1);
        int64_t k = 0;
        for (const char *p = self.s->p, *e = p + self.s->n; (p = memmem(p, (size_t)(e - p), args[0].s->p, args[0].s->n));
             p += args[0].s->n)
            k++;
        return jv_int(k);
    }
    case M_JOIN: {
        if (!nargs) jraise(c, "join() takes exactly one argument");
        jlist *l = jv_iterate(c, args[0]);
        jstep(c, l->n);
        kvt_strbuf *b = jbuf(c);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != JV_STR) jraise(c, "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i]));
            if (i) kvt_strbuf_add(b, self.s->p, self.s->n);
            kvt_strbuf_add(b, l->v[i].s->p, l->v[i].s->n);
            if (b->n > c->lim.max_output) jraise(c, "join result too large");
        }
        return jbuf_str(c, b);
    }
    case M_ISDIGIT: return jv_bool(str_all(self, isdigit, false));
    case M_ISALPHA: return jv_bool(str_all(self, isalpha, false));
    case M_ISALNUM: return jv_bool(str_all(self, isalnum, false));
    case M_ISSPACE: return jv_bool(str_all(self, isspace, false));
    case M_ISLOWER:
    case M_ISUPPER: {
        bool cased = false;
        for (size_t i = 0; i < self.s->n; i++) {
            unsigned char ch = (unsigned char)self.s->p[i];
            if (fn->id == M_ISLOWER ? isupper(ch) : islower(ch)) return jv_bool(false);
            cased |= isalpha(ch) != 0;
        }
        return jv_bool(cased);
    }
    case M_SPLITLINES: {
        jv out = jv_list(&c->a, 0);
        const char *p = self.s->p;
        size_t len = self.s->n, i = 0;
        while (i < len) {
            size_t st = i;
            while (i < len && p[i] != '\n' && p[i] != '\r') i++;
            jl_push(&c->a, out.l, jv_str_ref(&c->a, p + st, i - st));
            if (i < len && p[i] == '\r' && i + 1 < len && p[i + 1] == '\n') i++;
            if (i < len) i++;
        }
        return out;
    }
    case M_FORMAT: jraise(c, "str.format is not supported in templates here");
    }
    jraise_node(c, n, "unknown method");
}
