/*
 * strbuf.h — a growable byte/string buffer: the one string builder every layer uses.
 *
 * Ownership: the caller owns the kvt_strbuf struct (usually a zero-initialised local:
 * `kvt_strbuf b = {0};` is an empty, valid buffer). The bytes live in a malloc'd block at `p`,
 * `n` bytes long, and are always NUL-terminated once anything (even zero bytes) was appended, so
 * `p` can be used as a C string when the contents hold no NUL; embedded NULs are allowed and
 * counted in `n`. Release with kvt_strbuf_free, or hand the block over with kvt_strbuf_take
 * (the caller then frees it with free()).
 *
 * Errors: an allocation failure (or a size overflow, or a printf encoding error) sets the sticky
 * `oom` flag; every later append is then a no-op, and the contents stay the valid,
 * NUL-terminated prefix appended before the failure. Check `oom` once at the end instead of
 * after every append; a caller that wants that truncated prefix anyway may clear `oom` before
 * kvt_strbuf_take. Callers may read `p`/`n` directly and may shorten the contents in place
 * (keeping p[n] == 0). Not thread-safe: one buffer, one thread at a time.
 */
#ifndef KVT_STRBUF_H
#define KVT_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvt_strbuf {
    char *p;    /* malloc'd, NUL-terminated at p[n]; NULL until the first append */
    size_t n;   /* bytes in use, not counting the terminating NUL */
    size_t cap; /* bytes allocated at p */
    bool oom;   /* sticky: an allocation failed; appends are no-ops from then on */
} kvt_strbuf;

#if defined(__GNUC__) || defined(__clang__)
#define KVT_PRINTF_FMT(f, a) __attribute__((format(printf, f, a)))
#else
#define KVT_PRINTF_FMT(f, a)
#endif

/* Appends n bytes from s (may contain NULs; s may be NULL when n == 0). Appending zero bytes
 * still allocates the buffer, so `p` is non-NULL afterwards unless `oom` is set. */
void kvt_strbuf_add(kvt_strbuf *b, const char *s, size_t n);
/* Appends the C string s. */
void kvt_strbuf_addstr(kvt_strbuf *b, const char *s);
/* Appends printf-formatted text (any length). */
void kvt_strbuf_printf(kvt_strbuf *b, const char *fmt, ...) KVT_PRINTF_FMT(2, 3);
/* Appends bytes p[0..n) as a quoted JSON string, escaped as Python's json.dumps(ensure_ascii=False)
 * does: \" \\ \n \r \t \b \f, other bytes below 0x20 as \u00XX, everything else (UTF-8
 * included) as it is. */
void kvt_strbuf_json_str(kvt_strbuf *b, const char *p, size_t n);
/* Hands the malloc'd, NUL-terminated contents to the caller and resets *b to empty. Returns ""
 * (malloc'd) when nothing was appended. Returns NULL — and frees the partial contents — when
 * `oom` is set or the empty string cannot be allocated. *len (if len) gets the length, 0 on NULL. */
char *kvt_strbuf_take(kvt_strbuf *b, size_t *len);
/* Frees the contents and resets *b to empty (oom cleared). Safe on an empty buffer. */
void kvt_strbuf_free(kvt_strbuf *b);

#endif
