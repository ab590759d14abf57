/*
 * unicode.c — UTF-8 helpers for the tokenizers: strict sequence validation (Unicode's well-formed
 * table, so overlongs, surrogates and > U+10FFFF are rejected), the GPT-2 byte<->unicode map, and
 * the U+FFFD sanitizer used by streaming detokenization.
 */
#include <stdlib.h>

#include "tok_internal.h"

/* Validates the sequence at s: returns its length (1..4) if it is a complete well-formed code
 * point. Otherwise returns 0 and sets *sub to the length of the maximal subpart (bytes that form a
 * valid prefix of some sequence, >= 1) and *incomplete to true if those bytes run to the end of the
 * buffer (so more data could still complete them). */
static uint32_t utf8_check(const unsigned char *s, size_t len, uint32_t *sub, bool *incomplete) {
    unsigned char c = s[0];
    *incomplete = false;
    *sub = 1;
    if (c < 0x80) return 1;
    uint32_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0; /* 80..C1, F5..FF: never valid */
    for (uint32_t k = 1; k < need; k++) {
        if (k >= len) {
            *sub = k;
            *incomplete = true;
            return 0;
        }
        unsigned char b = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *sub = k;
            return 0;
        }
    }
    return need;
}

uint32_t kvt_utf8_seq_len(const unsigned char *s, size_t len) {
    uint32_t sub;
    bool inc;
    if (len == 0) return 0;
    return utf8_check(s, len, &sub, &inc);
}

size_t kvt_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t kvt_utf8_decode(const unsigned char *s, size_t len, uint32_t *n) {
    uint32_t l = kvt_utf8_seq_len(s, len);
    *n = l;
    switch (l) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    case 4:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    default: return 0xFFFD;
    }
}

/* GPT-2 byte map: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in
 * increasing byte order. */
void kvt_bytes_to_unicode(uint32_t byte_to_cp[256]) {
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = keep ? b : next++;
    }
}

size_t kvt_utf8_complete_prefix(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        uint32_t sub;
        bool inc;
        uint32_t l = utf8_check(u + i, len - i, &sub, &inc);
        if (l) {
            i += l;
            continue;
        }
        if (inc) break; /* may still complete */
        i += sub;
    }
    return i;
}

char *kvt_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    /* worst case: every byte becomes 3 bytes */
    uint64_t cap;
    if (!kvt_mul_ok(len, 3, &cap) || cap + 1 < cap) return NULL;
    char *o = malloc(cap + 1);
    if (!o) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t sub;
        bool inc;
        uint32_t l = utf8_check(u + i, len - i, &sub, &inc);
        if (l) {
            memcpy(o + n, u + i, l);
            n += l;
            i += l;
        } else {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i += sub;
        }
    }
    o[n] = 0;
    if (out_len) *out_len = n;
    return o;
}
