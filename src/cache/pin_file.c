/* pin_file.c — see pin_file.h. */
#include "pin_file.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../kv/kv.h"

#define PIN_MAGIC "KVTPINS1"
#define PIN_VERSION 1u
#define PIN_HEAD 16u  /* magic, version, count */
#define PIN_ENTRY 32u /* id, created, expires, ns_len, n_tokens */

uint64_t kvt_pin_id(uint64_t root, const int32_t *tokens, uint32_t n) {
    return kvt_chain_hash(root ^ 0x70696e6e65640000ull /* "pinned": not a chain hash of the tier */, tokens, n);
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

kvt_status kvt_pin_file_encode(const kvt_pin_rec *v, uint32_t n, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (n > KVT_PIN_MAX) return KVT_ERR_RANGE;
    size_t total = PIN_HEAD + 8;
    for (uint32_t i = 0; i < n; i++) {
        size_t nl = strlen(v[i].ns ? v[i].ns : "");
        if (nl > KVT_PIN_MAX_NS || v[i].n_tokens == 0 || v[i].n_tokens > KVT_PIN_MAX_TOKENS) return KVT_ERR_RANGE;
        total += PIN_ENTRY + nl + (size_t)v[i].n_tokens * 4;
    }
    if (total > KVT_PIN_FILE_MAX) return KVT_ERR_RANGE;
    uint8_t *b = malloc(total), *p = b;
    if (!b) return KVT_ERR_NOMEM;
    memcpy(p, PIN_MAGIC, 8);
    put_u32(p + 8, PIN_VERSION);
    put_u32(p + 12, n);
    p += PIN_HEAD;
    for (uint32_t i = 0; i < n; i++) {
        const char *ns = v[i].ns ? v[i].ns : "";
        uint32_t nl = (uint32_t)strlen(ns);
        put_u64(p, v[i].id);
        put_u64(p + 8, (uint64_t)v[i].created);
        put_u64(p + 16, (uint64_t)v[i].expires);
        put_u32(p + 24, nl);
        put_u32(p + 28, v[i].n_tokens);
        p += PIN_ENTRY;
        memcpy(p, ns, nl);
        p += nl;
        memcpy(p, v[i].tokens, (size_t)v[i].n_tokens * 4);
        p += (size_t)v[i].n_tokens * 4;
    }
    put_u64(p, XXH3_64bits(b, (size_t)(p - b)));
    *out = b;
    *len = total;
    return KVT_OK;
}

void kvt_pin_recs_free(kvt_pin_rec *v, uint32_t n) {
    if (!v) return;
    for (uint32_t i = 0; i < n; i++) {
        free(v[i].ns);
        free(v[i].tokens);
    }
    free(v);
}

kvt_status kvt_pin_file_decode(const uint8_t *buf, size_t len, kvt_pin_rec **out, uint32_t *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (len < PIN_HEAD + 8 || memcmp(buf, PIN_MAGIC, 8) != 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "not a pin list (bad magic or %zu bytes)", len);
    if (len > KVT_PIN_FILE_MAX) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin list of %zu bytes is over the limit", len);
    if (get_u32(buf + 8) != PIN_VERSION)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin list version %u (this build reads %u)", get_u32(buf + 8), PIN_VERSION);
    if (get_u64(buf + len - 8) != XXH3_64bits(buf, len - 8))
        return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "pin list checksum mismatch");
    const uint32_t count = get_u32(buf + 12);
    if (count > KVT_PIN_MAX) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin list holds %u pins (limit %u)", count, KVT_PIN_MAX);
    kvt_pin_rec *v = calloc(count ? count : 1, sizeof(*v));
    if (!v) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    const uint8_t *p = buf + PIN_HEAD, *end = buf + len - 8;
    kvt_status st = KVT_OK;
    uint32_t i = 0;
    for (; i < count && st == KVT_OK; i++) {
        if ((size_t)(end - p) < PIN_ENTRY) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin %u: truncated", i);
            break;
        }
        const uint32_t nl = get_u32(p + 24), nt = get_u32(p + 28);
        if (nl > KVT_PIN_MAX_NS || nt == 0 || nt > KVT_PIN_MAX_TOKENS ||
            (size_t)(end - p) - PIN_ENTRY < (size_t)nl + (size_t)nt * 4) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin %u: bad lengths (namespace %u bytes, %u tokens)", i, nl, nt);
            break;
        }
        v[i].id = get_u64(p);
        v[i].created = (int64_t)get_u64(p + 8);
        v[i].expires = (int64_t)get_u64(p + 16);
        p += PIN_ENTRY;
        v[i].ns = malloc((size_t)nl + 1);
        v[i].tokens = malloc((size_t)nt * 4);
        if (!v[i].ns || !v[i].tokens) {
            i++;
            st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(v[i].ns, p, nl);
        v[i].ns[nl] = '\0';
        p += nl;
        if (memchr(v[i].ns, '\0', nl)) {
            i++;
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin %u: namespace holds a NUL byte", i - 1);
            break;
        }
        memcpy(v[i].tokens, p, (size_t)nt * 4);
        v[i].n_tokens = nt;
        p += (size_t)nt * 4;
        for (uint32_t t = 0; t < nt && st == KVT_OK; t++)
            if (v[i].tokens[t] < 0) st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin %u: negative token id", i);
    }
    if (st == KVT_OK && p != end) st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "pin list has %zu trailing bytes", (size_t)(end - p));
    if (st != KVT_OK) {
        kvt_pin_recs_free(v, count); /* entries past i are zeroed */
        return st;
    }
    *out = v;
    *n = count;
    return KVT_OK;
}
