/* testutil.h — shared helpers for the cmocka test binaries. */
#ifndef KVT_TESTUTIL_H
#define KVT_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

/* Deterministic PRNG for tests (splitmix64). */
static inline uint64_t tu_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float tu_randf(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(tu_rand(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp); caller frees the string. */
static inline char *tu_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    if (!base) base = "/tmp";
    char *p = malloc(strlen(base) + strlen(tag) + 32);
    sprintf(p, "%s/kvt-%s-XXXXXX", base, tag);
    if (!mkdtemp(p)) { free(p); return NULL; }
    return p;
}
/* Path of the vocab directory (data/vocab of the repository, tests run from its root), or NULL. */
static inline const char *tu_vocab_dir(void) {
    const char *e = getenv("KVT_VOCAB_DIR");
    if (e) return e;
    if (access("data/vocab", R_OK) == 0) return "data/vocab";
    if (access("../shared/vocab", R_OK) == 0) return "../shared/vocab";
    return NULL;
}
#endif
