/* stop.c — stop strings over streamed text (stop.h). */
#include "stop.h"

#include <string.h>

#include "../util/common.h"

int64_t kvt_stop_find(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop, size_t from, size_t *match_len) {
    int64_t best = -1;
    for (uint32_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        if (!L) continue;
        size_t start = from > L ? from - L : 0;
        for (size_t p = start; p + L <= t->n; p++) {
            if (!memcmp(t->p + p, stop[i], L)) {
                if (best < 0 || (int64_t)p < best) {
                    best = (int64_t)p;
                    *match_len = L;
                }
                break;
            }
        }
    }
    return best;
}

size_t kvt_stop_holdback(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop) {
    size_t hold = 0;
    for (uint32_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        for (size_t k = KVT_MIN(L - (L > 0), t->n); k > hold; k--) {
            if (!memcmp(t->p + t->n - k, stop[i], k)) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}
