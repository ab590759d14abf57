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

#include "model/gen_model.h" /* kvt_vocab_dir */

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
/* The repository's vocabulary folder (data/vocab, or $KVT_VOCAB_DIR; model/gen_model.h). The data
 * is part of the repository, so a missing folder fails the calling test (never a skip). */
static inline const char *tu_vocab_dir(void) {
    static char dir[4096];
    if (!dir[0] && !kvt_vocab_dir(dir, sizeof dir))
        fail_msg("vocabulary folder not found (data/vocab beside the build folder, or $KVT_VOCAB_DIR='%s')",
                 getenv("KVT_VOCAB_DIR") ? getenv("KVT_VOCAB_DIR") : "");
    return dir;
}
/* <vocab folder>/<file><suffix> into buf (suffix may be ""); fails the test if it does not fit. */
static inline const char *tu_vocab_path(char *buf, size_t n, const char *file, const char *suffix) {
    const char *d = tu_vocab_dir();
    size_t a = strlen(d), b = strlen(file), c = strlen(suffix);
    if (a + 1 + b + c + 1 > n) fail_msg("vocabulary path too long: %s/%s%s", d, file, suffix);
    memcpy(buf, d, a);
    buf[a] = '/';
    memcpy(buf + a + 1, file, b);
    memcpy(buf + a + 1 + b, suffix, c + 1);
    return buf;
}
#endif
