/* bench/bench_util.h — the helpers the bench programs share: a monotonic clock in ms and the
 * comparison qsort orders timings with (medians). Header-only (each bench/ program is one file). */
#ifndef KVT_BENCH_UTIL_H
#define KVT_BENCH_UTIL_H

#include <time.h>

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* qsort comparison of doubles, ascending */
static inline int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
