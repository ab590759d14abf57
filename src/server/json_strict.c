/* json_strict.c — a strict RFC 8259 syntax check of request bodies, run before cJSON (see
 * server.h, kvt_json_strict_check). cJSON is lenient where it matters for untrusted input: it
 * accepts a leading UTF-8 BOM, raw control characters (a newline) inside strings, and it cuts a
 * string short at an escaped \u0000. This checker accepts exactly the RFC grammar, minus \u0000
 * (a NUL cannot be carried by cJSON's NUL-terminated strings, so it is refused, never truncated),
 * with a small nesting limit. It only validates; cJSON still builds the tree.
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
 * and only whitespace follows it. */
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

bool kvt_json_strict_check(const char *text, size_t n, size_t *off, const char **why) {
    const unsigned char *s = (const unsigned char *)text;
    char stack[KVT_JSON_MAX_DEPTH];
    int depth = 0;
    js_state st = S_VALUE;
    size_t i = 0;
    *off = 0;
    *why = NULL;
    if (n >= 3 && s[0] == 0xef && s[1] == 0xbb && s[2] == 0xbf) {
        *why = "byte order mark before the JSON text";
        return false;
    }
#define FAIL(msg)  \
    do {           \
        *off = i;  \
        *why = msg; \
        return false; \
    } while (0)
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) {
            if (st == S_AFTER && depth == 0) return true;
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
            if (!scan_string(s, n, &i, why)) {
                *off = i;
                return false;
            }
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
            if (c == '{' || c == '[') {
                if (depth >= KVT_JSON_MAX_DEPTH) FAIL("JSON nested too deeply");
                stack[depth++] = (char)c;
                st = c == '{' ? S_KEY_OR_END : S_VALUE_OR_END;
                i++;
                continue;
            }
            if (c == '"') {
                if (!scan_string(s, n, &i, why)) {
                    *off = i;
                    return false;
                }
            } else if (c == '-' || is_digit(c)) {
                if (!scan_number(s, n, &i)) FAIL("malformed number");
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
}
