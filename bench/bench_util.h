/* bench/bench_util.h — the helpers the bench programs share: a monotonic clock in ms, the best of
 * repeated timings and the comparison qsort orders timings with (medians). Header-only (each bench/
 * program is one file). */
#ifndef KVT_BENCH_UTIL_H
#define KVT_BENCH_UTIL_H

#include <time.h>

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* OUT = the shortest of the timings (ms) of CALL run again and again for BUDGET_MS ms: on a shared
 * machine the minimum is the stable number. No warm-up call (the caller's, where it wants one).
 * OUT must not be named best_, a_, d_ or end_ (the macro's own). */
#define BENCH_BEST_MS(OUT, BUDGET_MS, CALL)                                                            \
    do {                                                                                               \
        double best_ = 1e30;                                                                           \
        const double end_ = now_ms() + (BUDGET_MS);                                                    \
        while (now_ms() < end_) {                                                                      \
            const double a_ = now_ms();                                                                \
            CALL;                                                                                      \
            const double d_ = now_ms() - a_;                                                           \
            if (d_ < best_) best_ = d_;                                                                \
        }                                                                                              \
        (OUT) = best_;                                                                                 \
    } while (0)

/* qsort comparison of doubles, ascending */
static inline int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
