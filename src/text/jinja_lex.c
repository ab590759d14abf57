/*
 * jinja_lex.c — template text -> tokens, with jinja2's whitespace rules as transformers configures
 * them (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
 *   - newlines (\r\n, \r, \n) are normalised to \n, and one trailing newline is dropped;
 *   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` all after it;
 *   - trim_blocks: the first \n after `%}` or `#}` is dropped (not after `+%}`);
 *   - lstrip_blocks: spaces/tabs between a line start and `{%` / `{#` are dropped (not `{%+`);
 *   - `{% raw %}…{% endraw %}` is data;
 *   - inside a tag, `}}` / `%}` only ends it when every bracket opened in it is closed.
 *
 * Invariant: tokens are emitted in source order; every T_VAR_BEGIN/T_BLOCK_BEGIN is followed by its
 * T_VAR_END/T_BLOCK_END (or lexing fails), so the parser can rely on balanced tags.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

typedef struct {
    jarena *a;
    const char *s;
    size_t n;
    jtoks *t;
    char *err;
    size_t errlen;
    size_t p_off; /* position cache: p_off is at line p_line, column p_col */
    uint32_t p_line, p_col;
} lx;

/* line and column (1-based, in code points) of s[off]; incremental, as offsets mostly grow */
static void pos_of(lx *L, size_t off, uint32_t *line, uint32_t *col) {
    if (off < L->p_off || L->p_line == 0) L->p_off = 0, L->p_line = 1, L->p_col = 1;
    for (size_t i = L->p_off; i < off && i < L->n; i++) {
        if (L->s[i] == '\n') L->p_line++, L->p_col = 1;
        else if (((uint8_t)L->s[i] & 0xC0) != 0x80) L->p_col++;
    }
    L->p_off = off;
    *line = L->p_line;
    *col = L->p_col;
}

static kvt_status lx_fail(lx *L, size_t off, const char *what) {
    uint32_t line, col;
    pos_of(L, off, &line, &col);
    return kvt_errf(L->err, L->errlen, KVT_ERR_FORMAT, "template: line %u, column %u: %s", line, col, what);
}

static bool push(lx *L, int type, size_t off, const char *p, size_t n) {
    if (L->t->n == L->t->cap) {
        size_t nc = L->t->cap ? L->t->cap * 2 : 256;
        jtok *nv = realloc(L->t->v, nc * sizeof(jtok));
        if (!nv) return false;
        L->t->v = nv;
        L->t->cap = nc;
    }
    jtok *k = &L->t->v[L->t->n++];
    memset(k, 0, sizeof *k);
    k->type = type;
    pos_of(L, off, &k->line, &k->col);
    if (p) {
        k->s = jstr_new(L->a, p, n);
        if (!k->s) return false;
    }
    return true;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* Decodes a Python string literal body (escapes as Python's unicode-escape; unknown ones kept). */
static void unescape(kvt_strbuf *b, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 >= n) {
            kvt_strbuf_add(b, p + i, 1);
            continue;
        }
        char e = p[++i];
        uint32_t u = 0;
        int nd = 0;
        switch (e) {
        case 'n': kvt_strbuf_addstr(b, "\n"); continue;
        case 't': kvt_strbuf_addstr(b, "\t"); continue;
        case 'r': kvt_strbuf_addstr(b, "\r"); continue;
        case '\\': kvt_strbuf_addstr(b, "\\"); continue;
        case '\'': kvt_strbuf_addstr(b, "'"); continue;
        case '"': kvt_strbuf_addstr(b, "\""); continue;
        case 'a': kvt_strbuf_addstr(b, "\a"); continue;
        case 'b': kvt_strbuf_addstr(b, "\b"); continue;
        case 'f': kvt_strbuf_addstr(b, "\f"); continue;
        case 'v': kvt_strbuf_addstr(b, "\v"); continue;
        case '\n': continue; /* line continuation */
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                u = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; k++) u = u * 8 + (uint32_t)(p[++i] - '0');
                goto put;
            }
            kvt_strbuf_add(b, p + i - 1, 2);
            continue;
        }
        {
            size_t st = i;
            for (int k = 0; k < nd; k++) {
                char c = i + 1 < n ? p[i + 1] : 0;
                int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
                if (d < 0) { /* Python: a syntax error; keep the text */
                    kvt_strbuf_add(b, p + st - 1, i - st + 2);
                    goto next;
                }
                u = u * 16 + (uint32_t)d;
                i++;
            }
            if (u > 0x10FFFF) u = 0xFFFD;
        }
    put : {
        char t[4];
        if (u < 0x80) t[0] = (char)u, kvt_strbuf_add(b, t, 1);
        else if (u < 0x800) t[0] = (char)(0xC0 | (u >> 6)), t[1] = (char)(0x80 | (u & 63)), kvt_strbuf_add(b, t, 2);
        else if (u < 0x10000)
            t[0] = (char)(0xE0 | (u >> 12)), t[1] = (char)(0x80 | ((u >> 6) & 63)), t[2] = (char)(0x80 | (u & 63)),
            kvt_strbuf_add(b, t, 3);
        else
            t[0] = (char)(0xF0 | (u >> 18)), t[1] = (char)(0x80 | ((u >> 12) & 63)),
            t[2] = (char)(0x80 | ((u >> 6) & 63)), t[3] = (char)(0x80 | (u & 63)), kvt_strbuf_add(b, t, 4);
    }
    next:;
    }
}

/* Emits data s[a..b) after whitespace control. */
static bool emit_data(lx *L, size_t a, size_t b) {
    if (b <= a) return true;
    return push(L, T_DATA, a, L->s + a, b - a);
}

/* Strip rules before a tag at `ts` whose data starts at `ds`; returns the data end. */
static size_t strip_before(lx *L, size_t ds, size_t ts, char kind, char sign, bool line_starting) {
    size_t e = ts;
    if (sign == '-') {
        while (e > ds && is_space(L->s[e - 1])) e--;
    } else if (sign != '+' && kind != '{') { /* lstrip_blocks: block and comment tags */
        size_t l = e;
        while (l > ds && (L->s[l - 1] == ' ' || L->s[l - 1] == '\t')) l--;
        if ((l > ds && L->s[l - 1] == '\n') || (l == ds && line_starting)) e = l;
    }
    return e;
}

/* Lexes the inside of a {{ }} or {% %} tag starting at *pos; stops after the end marker. */
static kvt_status lex_tag(lx *L, size_t *pos, bool block, bool *line_starting) {
    size_t i = *pos;
    char stack[KVT_JINJA_MAX_NESTING];
    int depth = 0;
    const char *s = L->s;
    size_t n = L->n;
    for (;;) {
        while (i < n && is_space(s[i])) i++;
        if (i >= n) return lx_fail(L, i, block ? "unexpected end of template: missing '%}'" : "unexpected end of template: missing '}}'");
        if (depth == 0) {
            char c2 = block ? '%' : '}';
            size_t j = i;
            char sign = 0;
            if ((s[j] == '-' || (block && s[j] == '+')) && j + 2 < n + 0 && s[j + 1] == c2 && s[j + 2] == '}') sign = s[j++];
            if (j + 1 < n && s[j] == c2 && s[j + 1] == '}') {
                j += 2;
                if (!push(L, block ? T_BLOCK_END : T_VAR_END, i, NULL, 0)) return lx_fail(L, i, "out of memory");
                if (sign == '-') while (j < n && is_space(s[j])) j++;
                else if (block && sign != '+' && j < n && s[j] == '\n') j++;
                *line_starting = j > 0 && s[j - 1] == '\n';
                *pos = j;
                return KVT_OK;
            }
        }
        char c = s[i];
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) j += s[j] == '\\' ? 2 : 1;
            if (j >= n) return lx_fail(L, i, "unterminated string");
            kvt_strbuf b = {0};
            unescape(&b, s + i + 1, j - i - 1);
            if (b.oom || !push(L, T_STRING, i, b.p ? b.p : "", b.n)) {
                kvt_strbuf_free(&b);
                return lx_fail(L, i, "out of memory");
            }
            kvt_strbuf_free(&b);
            i = j + 1;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])))) j++;
            bool flt = false;
            bool after_dot = i > 0 && s[i - 1] == '.';
            if (!after_dot && j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
                flt = true;
                j++;
                while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])))) j++;
            }
            if (!after_dot && j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && is_digit(s[k])) {
                    flt = true;
                    j = k;
                    while (j < n && is_digit(s[j])) j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t k = i; k < j && m + 1 < sizeof buf; k++)
                if (s[k] != '_') buf[m++] = s[k];
            buf[m] = 0;
            if (!push(L, flt ? T_FLOAT : T_INT, i, NULL, 0)) return lx_fail(L, i, "out of memory");
            jtok *t = &L->t->v[L->t->n - 1];
            if (flt) t->f = strtod(buf, NULL);
            else {
                errno = 0;
                t->i = strtoll(buf, NULL, 10);
                if (errno || j - i > 30) return lx_fail(L, i, "integer literal too large");
            }
            i = j;
            continue;
        }
        if (is_name0(c)) {
            size_t j = i;
            while (j < n && (is_name0(s[j]) || is_digit(s[j]))) j++;
            if (!push(L, T_NAME, i, s + i, j - i)) return lx_fail(L, i, "out of memory");
            i = j;
            continue;
        }
        static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
        size_t ol = 0;
        for (size_t k = 0; k < KVT_ARRAY_LEN(ops2); k++)
            if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) ol = 2;
        if (!ol && strchr("+-/*%~[](){}><=.:|,;", c) && c) ol = 1;
        if (!ol) return lx_fail(L, i, "unexpected character in tag");
        if (ol == 1) {
            if (c == '(' || c == '[' || c == '{') {
                if (depth >= KVT_JINJA_MAX_NESTING) return lx_fail(L, i, "brackets nested too deeply");
                stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0 || stack[depth - 1] != c) return lx_fail(L, i, "unbalanced bracket");
                depth--;
            }
        }
        if (!push(L, T_OP, i, s + i, ol)) return lx_fail(L, i, "out of memory");
        i += ol;
    }
}

/* `{%[-+]? raw [-]?%}` at ts: returns the offset after it, or 0 */
static size_t match_word_tag(const char *s, size_t n, size_t ts, const char *word, char *sign_in, char *sign_out) {
    size_t i = ts + 2;
    *sign_in = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) *sign_in = s[i++];
    while (i < n && is_space(s[i])) i++;
    size_t wl = strlen(word);
    if (n - i < wl || memcmp(s + i, word, wl)) return 0;
    i += wl;
    if (i < n && (is_name0(s[i]) || is_digit(s[i]))) return 0;
    while (i < n && is_space(s[i])) i++;
    *sign_out = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) *sign_out = s[i++];
    if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') return i + 2;
    return 0;
}

kvt_status jinja_lex(jarena *a, const char *s, size_t n, jtoks *out, char *err, size_t errlen) {
    lx L = {a, s, n, out, err, errlen, 0, 0, 0};
    size_t pos = 0;
    bool line_starting = true;
    for (;;) {
        size_t ts = pos;
        while (ts + 1 < n && !(s[ts] == '{' && (s[ts + 1] == '{' || s[ts + 1] == '%' || s[ts + 1] == '#'))) ts++;
        if (ts + 1 >= n) { /* no more tags */
            if (!emit_data(&L, pos, n)) return lx_fail(&L, pos, "out of memory");
            if (!push(&L, T_EOF, n, NULL, 0)) return lx_fail(&L, n, "out of memory");
            return KVT_OK;
        }
        char kind = s[ts + 1];
        char sign = ts + 2 < n && (s[ts + 2] == '-' || s[ts + 2] == '+') ? s[ts + 2] : 0;
        if (kind == '{' && sign == '+') sign = 0;
        size_t de = strip_before(&L, pos, ts, kind, sign, line_starting);
        if (!emit_data(&L, pos, de)) return lx_fail(&L, pos, "out of memory");
        if (kind == '#') {
            size_t i = ts + 2;
            while (i + 1 < n && !(s[i] == '#' && s[i + 1] == '}')) i++;
            if (i + 1 >= n) return lx_fail(&L, ts, "missing end of comment tag");
            char esign = i > ts + 2 && (s[i - 1] == '-' || s[i - 1] == '+') ? s[i - 1] : 0;
            if (i - 1 == ts + 2 && sign) esign = 0; /* `{#-#}`: the sign belongs to the start */
            i += 2;
            if (esign == '-') while (i < n && is_space(s[i])) i++;
            else if (esign != '+' && i < n && s[i] == '\n') i++;
            line_starting = s[i - 1] == '\n';
            pos = i;
            continue;
        }
        char si, so;
        size_t rawend = kind == '%' ? match_word_tag(s, n, ts, "raw", &si, &so) : 0;
        if (rawend) {
            size_t i = rawend;
            if (so == '-') while (i < n && is_space(s[i])) i++;
            /* find {% endraw %} */
            size_t j = i, endt = 0;
            char esi = 0, eso = 0;
            for (; j + 1 < n; j++)
                if (s[j] == '{' && s[j + 1] == '%' && (endt = match_word_tag(s, n, j, "endraw", &esi, &eso))) break;
            if (!endt) return lx_fail(&L, ts, "missing {% endraw %}");
            size_t e = strip_before(&L, i, j, '%', esi, false);
            if (!emit_data(&L, i, e)) return lx_fail(&L, i, "out of memory");
            if (eso == '-') while (endt < n && is_space(s[endt])) endt++;
            else if (eso != '+' && endt < n && s[endt] == '\n') endt++;
            line_starting = s[endt - 1] == '\n';
            pos = endt;
            continue;
        }
        if (!push(&L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, ts, NULL, 0)) return lx_fail(&L, ts, "out of memory");
        size_t p = ts + 2 + (sign ? 1 : 0);
        kvt_status st = lex_tag(&L, &p, kind == '%', &line_starting);
        if (st != KVT_OK) return st;
        pos = p;
    }
}
