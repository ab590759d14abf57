/* json_strict.c — a strict RFC 8259 syntax check of request bodies, run before cJSON (see
 * server.h, kvt_json_scan / kvt_json_strict_check). cJSON is lenient where it matters for untrusted
 * input: it accepts a leading UTF-8 BOM, raw control characters (a newline) inside strings, it cuts
 * a string short at an escaped \u0000, and it turns a number too small for a double (1e-400) into 0.
 * This checker accepts exactly the RFC grammar, minus \u0000 (a NUL cannot be carried by cJSON's
 * NUL-terminated strings, so it is refused, never truncated) and minus numbers that underflow to
 * zero, with a small nesting limit. It also counts the values cJSON would allocate a node for, so
 * the server can refuse a body whose tree would be out of proportion to its bytes (up to ~40 bytes
 * of tree per body byte for `[[[[0]]]]...`) before cJSON builds it. It only validates; cJSON
 * still builds the tree.
 *
 * One pass, no allocation: an explicit stack of open containers (depth <= KVT_JSON_MAX_DEPTH) and
 * a "what may come next" state:
 *   VALUE   a value is required (start, after ':' or ',' in an array, after '[')
 *   KEY     an object key string is required (after ',' in an object)
 *   KEY_OR_END   after '{': a key or '}'
 *   VALUE_OR_END after '[': a value or ']'
 *   AFTER   a value ended: ',' or the container's closer, or the end of input at depth 0
 * Invariants: (1) depth == number of open containers, each recorded in stack[];
 * (2) the input is accepted only when the top-level value is complete (state AFTER at depth 0)
 * and only whitespace follows it; (3) r->nodes == number of values begun so far (<= max_nodes when
 * capped); (4) keys[d] holds the last key scanned in the object open at depth d, set before any
 * value inside that object is scanned. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

typedef enum { S_VALUE, S_KEY, S_KEY_OR_END, S_VALUE_OR_END, S_AFTER } js_state;

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex4(const unsigned char *p, size_t left, unsigned *out) {
    if (left < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* Scans a string starting at s[*i] == '"'; leaves *i after the closing quote. */
static bool scan_string(const unsigned char *s, size_t n, size_t *i, const char **why) {
    size_t p = *i + 1;
    while (p < n) {
        unsigned char c = s[p];
        if (c == '"') {
            *i = p + 1;
            return true;
        }
        if (c < 0x20) {
            *i = p;
            *why = "raw control character inside a string (escape it, e.g. \\n)";
            return false;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        if (p + 1 >= n) break;
        unsigned char e = s[p + 1];
        if (e && strchr("\"\\/bfnrt", e)) {
            p += 2;
            continue;
        }
        unsigned u;
        if (e != 'u' || hex4(s + p + 2, n - p - 2, &u) != 0) {
            *i = p;
            *why = "invalid escape sequence in a string";
            return false;
        }
        if (u == 0) {
            *i = p;
            *why = "\\u0000 (NUL) inside a string is not supported";
            return false;
        }
        if (u >= 0xdc00 && u <= 0xdfff) {
            *i = p;
            *why = "lone low surrogate escape in a string";
            return false;
        }
        if (u >= 0xd800 && u <= 0xdbff) {
            unsigned lo;
            if (n - p < 12 || s[p + 6] != '\\' || s[p + 7] != 'u' || hex4(s + p + 8, n - p - 8, &lo) != 0 ||
                lo < 0xdc00 || lo > 0xdfff) {
                *i = p;
                *why = "high surrogate escape not followed by a low surrogate";
                return false;
            }
            p += 12;
            continue;
        }
        p += 6;
    }
    *i = n;
    *why = "unterminated string";
    return false;
}

/* number = [-] int [frac] [exp]; int = 0 | [1-9][0-9]*. */
static bool scan_number(const unsigned char *s, size_t n, size_t *i) {
    size_t p = *i;
    if (p < n && s[p] == '-') p++;
    if (p >= n || !is_digit(s[p])) return false;
    if (s[p] == '0') p++;
    else
        while (p < n && is_digit(s[p])) p++;
    if (p < n && s[p] == '.') {
        p++;
        if (p >= n || !is_digit(s[p])) return false;
        while (p < n && is_digit(s[p])) p++;
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= n || !is_digit(s[p])) return false;
        while (p < n && is_digit(s[p])) p++;
    }
    *i = p;
    return true;
}

/* True when the syntactically valid number s[a, b) has a nonzero digit but is so small that a
 * double rounds it to zero (strtod's underflow, which cJSON silently takes as 0). The decimal
 * exponent of the first nonzero digit decides all but a narrow band; there strtod gets the
 * significant digits (up to 780, more than the ~750 that decide the rounding of any value). */
static bool number_underflows(const unsigned char *s, size_t a, size_t b) {
    size_t p = a;
    if (s[p] == '-') p++;
    size_t i0 = p;
    while (p < b && is_digit(s[p])) p++;
    size_t i1 = p, f0 = p, f1 = p;
    if (p < b && s[p] == '.') {
        f0 = ++p;
        while (p < b && is_digit(s[p])) p++;
        f1 = p;
    }
    long long e = 0;
    if (p < b && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        bool neg = p < b && s[p] == '-';
        if (p < b && (s[p] == '+' || s[p] == '-')) p++;
        for (; p < b; p++)
            if (e < 1000000000LL) e = e * 10 + (s[p] - '0');
        if (neg) e = -e;
    }
    /* the first nonzero digit and its power of ten */
    size_t first = b;
    long long pos = 0;
    for (size_t k = i0; k < i1 && first == b; k++)
        if (s[k] != '0') first = k, pos = (long long)(i1 - k) - 1;
    for (size_t k = f0; k < f1 && first == b; k++)
        if (s[k] != '0') first = k, pos = -(long long)(k - f0) - 1;
    if (first == b) return false; /* a zero is a zero */
    long long E = pos + e;
    if (E >= -300) return false;
    if (E < -330) return true;
    char buf[800];
    size_t m = 0;
    buf[m++] = (char)s[first];
    buf[m++] = '.';
    for (size_t k = first + 1; k < f1 && m < 782; k++)
        if (is_digit(s[k])) buf[m++] = (char)s[k];
    snprintf(buf + m, sizeof buf - m, "e%lld", E);
    return strtod(buf, NULL) == 0.0;
}

/* The innermost object member key enclosing the current position: the key slot of the deepest
 * open object (keys[] holds, per depth, the last key scanned at that depth). */
static void innermost_key(const char *stack, const size_t (*keys)[2], int depth, const char *text,
                          kvt_json_scan_result *r) {
    for (int d = depth - 1; d >= 0; d--)
        if (stack[d] == '{') {
            r->key = text + keys[d][0];
            r->key_len = keys[d][1];
            return;
        }
}

bool kvt_json_scan(const char *text, size_t n, size_t max_nodes, kvt_json_scan_result *r) {
    const unsigned char *s = (const unsigned char *)text;
    char stack[KVT_JSON_MAX_DEPTH];
    size_t keys[KVT_JSON_MAX_DEPTH][2]; /* per depth: offset and length of the last key (no quotes) */
    int depth = 0;
    js_state st = S_VALUE;
    size_t i = 0;
    memset(r, 0, sizeof *r);
    if (n >= 3 && s[0] == 0xef && s[1] == 0xbb && s[2] == 0xbf) {
        r->fail = KVT_JSON_SYNTAX;
        r->why = "byte order mark before the JSON text";
        return false;
    }
#define FAIL_AS(kind, msg) \
    do {                   \
        r->off = i;        \
        r->why = msg;      \
        r->fail = kind;    \
        return false;      \
    } while (0)
#define FAIL(msg) FAIL_AS(KVT_JSON_SYNTAX, msg)
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) {
            if (st == S_AFTER && depth == 0) {
                r->off = n;
                return true;
            }
            FAIL(depth ? "unexpected end of input inside a container" : "unexpected end of input");
        }
        unsigned char c = s[i];
        switch (st) {
        case S_AFTER:
            if (depth == 0) FAIL("trailing data after the JSON value");
            if (c == ',') {
                st = stack[depth - 1] == '{' ? S_KEY : S_VALUE;
                i++;
            } else if ((c == '}' && stack[depth - 1] == '{') || (c == ']' && stack[depth - 1] == '[')) {
                depth--;
                i++;
            } else {
                FAIL(stack[depth - 1] == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
            }
            continue;
        case S_KEY_OR_END:
            if (c == '}') {
                depth--;
                i++;
                st = S_AFTER;
                continue;
            }
            /* fall through */
        case S_KEY: {
            if (c != '"') FAIL("expected a string key");
            size_t k0 = i;
            if (!scan_string(s, n, &i, &r->why)) {
                r->off = i;
                r->fail = KVT_JSON_SYNTAX;
                return false;
            }
            keys[depth - 1][0] = k0 + 1;
            keys[depth - 1][1] = i - k0 - 2;
            while (i < n && is_ws(s[i])) i++;
            if (i >= n || s[i] != ':') FAIL("expected ':' after an object key");
            i++;
            st = S_VALUE;
            continue;
        }
        case S_VALUE_OR_END:
            if (c == ']') {
                depth--;
                i++;
                st = S_AFTER;
                continue;
            }
            /* fall through */
        case S_VALUE:
            if (max_nodes && r->nodes >= max_nodes) FAIL_AS(KVT_JSON_TOO_MANY, "too many JSON values");
            r->nodes++;
            if (c == '{' || c == '[') {
                if (depth >= KVT_JSON_MAX_DEPTH) FAIL("JSON nested too deeply");
                stack[depth++] = (char)c;
                st = c == '{' ? S_KEY_OR_END : S_VALUE_OR_END;
                i++;
                continue;
            }
            if (c == '"') {
                if (!scan_string(s, n, &i, &r->why)) {
                    r->off = i;
                    r->fail = KVT_JSON_SYNTAX;
                    return false;
                }
            } else if (c == '-' || is_digit(c)) {
                size_t a = i;
                if (!scan_number(s, n, &i)) FAIL("malformed number");
                if (number_underflows(s, a, i)) {
                    innermost_key(stack, (const size_t(*)[2])keys, depth, text, r);
                    i = a;
                    FAIL_AS(KVT_JSON_UNDERFLOW, "number too small for a double (it would be read as 0)");
                }
            } else if (n - i >= 4 && !memcmp(s + i, "true", 4)) {
                i += 4;
            } else if (n - i >= 5 && !memcmp(s + i, "false", 5)) {
                i += 5;
            } else if (n - i >= 4 && !memcmp(s + i, "null", 4)) {
                i += 4;
            } else {
                FAIL("expected a JSON value");
            }
            st = S_AFTER;
            continue;
        }
    }
#undef FAIL
#undef FAIL_AS
}

bool kvt_json_strict_check(const char *text, size_t n, size_t *off, const char **why) {
    static __thread char msg[160];
    kvt_json_scan_result r;
    bool ok = kvt_json_scan(text, n, 0, &r);
    *off = ok ? 0 : r.off;
    *why = r.why;
    if (!ok && r.fail == KVT_JSON_UNDERFLOW) {
        char key[72];
        *why = kvt_json_key_label(r.key, r.key_len, key, sizeof key)
                   ? (snprintf(msg, sizeof msg, "'%s': %s", key, r.why), msg)
                   : r.why;
    }
    return ok;
}

bool kvt_json_key_label(const char *key, size_t len, char *out, size_t cap) {
    if (!key || len == 0 || len + 1 > cap) return false;
    for (size_t k = 0; k < len; k++)
        if (key[k] < 0x20 || key[k] > 0x7e || key[k] == '\\' || key[k] == '\'') return false;
    memcpy(out, key, len);
    out[len] = 0;
    return true;
}
