/* strbuf.c — growable byte/string buffer (see strbuf.h for the ownership rules). */
#include "util/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for `extra` more bytes plus the NUL; false (and oom set) on failure. Capacity
 * doubles from 256 so that a run of appends costs amortised O(1) per byte. */
static bool reserve(kvt_strbuf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX - 1 - b->n) {
        b->oom = true;
        return false;
    }
    size_t need = b->n + extra + 1;
    if (b->p && need <= b->cap) return true;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) {
            nc = need;
            break;
        }
        nc *= 2;
    }
    char *np = realloc(b->p, nc);
    if (!np) {
        b->oom = true;
        return false;
    }
    if (!b->p) np[0] = 0; /* first allocation: keep the NUL-termination promise */
    b->p = np;
    b->cap = nc;
    return true;
}

void kvt_strbuf_add(kvt_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void kvt_strbuf_addstr(kvt_strbuf *b, const char *s) { kvt_strbuf_add(b, s, strlen(s)); }

void kvt_strbuf_json_str(kvt_strbuf *b, const char *p, size_t n) {
    kvt_strbuf_addstr(b, "\"");
    size_t run = 0, i = 0;
    for (; i < n; i++) {
        uint8_t ch = (uint8_t)p[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') {
            run++;
            continue;
        }
        kvt_strbuf_add(b, p + i - run, run);
        run = 0;
        switch (ch) {
        case '"': kvt_strbuf_addstr(b, "\\\""); break;
        case '\\': kvt_strbuf_addstr(b, "\\\\"); break;
        case '\n': kvt_strbuf_addstr(b, "\\n"); break;
        case '\r': kvt_strbuf_addstr(b, "\\r"); break;
        case '\t': kvt_strbuf_addstr(b, "\\t"); break;
        case '\b': kvt_strbuf_addstr(b, "\\b"); break;
        case '\f': kvt_strbuf_addstr(b, "\\f"); break;
        default: kvt_strbuf_printf(b, "\\u%04x", ch);
        }
    }
    kvt_strbuf_add(b, p + i - run, run);
    kvt_strbuf_addstr(b, "\"");
}

void kvt_strbuf_printf(kvt_strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    /* first try into the space already there; on a short buffer vsnprintf reports the length */
    size_t room = b->p ? b->cap - b->n : 0;
    int k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = true;
        if (b->p) b->p[b->n] = 0; /* vsnprintf may have written a partial result */
    } else if ((size_t)k < room) {
        b->n += (size_t)k;
    } else if (!reserve(b, (size_t)k)) {
        if (b->p) b->p[b->n] = 0;
    } else {
        vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap2);
        b->n += (size_t)k;
    }
    va_end(ap2);
}

char *kvt_strbuf_take(kvt_strbuf *b, size_t *len) {
    if (!b->oom && !b->p) reserve(b, 0);
    char *p = NULL;
    size_t n = 0;
    if (b->oom) {
        free(b->p);
    } else {
        p = b->p;
        n = b->n;
    }
    *b = (kvt_strbuf){0};
    if (len) *len = n;
    return p;
}

void kvt_strbuf_free(kvt_strbuf *b) {
    free(b->p);
    *b = (kvt_strbuf){0};
}
