/*
 * membw.c — see membw.h. Plain C on purpose (no SIMD kernel to keep a scalar twin of): eight
 * independent 64-bit accumulators already issue loads faster than one core's share of DRAM
 * bandwidth, and the triad loop is what the compiler vectorizes for STREAM itself. Each thread
 * touches its own contiguous part first (first-touch placement), the buffers ask for transparent
 * huge pages (fewer TLB misses, as the packed weights get), and every timed pass starts for all
 * threads at one barrier and ends at the next.
 */
#include "membw.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MEMBW_ALIGN (2u << 20)

typedef struct membw_job {
    int n;
    size_t read_words;    /* uint64 words of the read buffer */
    size_t triad_elems;   /* doubles per triad array */
    uint64_t *rbuf;
    double *a, *b, *c;
    int runs;
    pthread_barrier_t bar;
    pthread_mutex_t mu;       /* start gate: workers wait until every thread exists (go) or abort */
    pthread_cond_t cv;
    int go;                   /* 1 run, -1 abort (a thread could not be started) */
    double *t_read, *t_triad; /* [runs] seconds, written by thread 0 */
    volatile uint64_t sink;   /* keeps the read sums alive */
} membw_job;

typedef struct membw_arg {
    membw_job *j;
    int ith;
} membw_arg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void part(size_t n, int ith, int nth, size_t *p0, size_t *p1) {
    /* 4 KiB-aligned parts (512 words) so no page is shared by two threads */
    size_t per = (n + (size_t)nth - 1) / (size_t)nth;
    per = (per + 511) & ~(size_t)511;
    size_t a = (size_t)ith * per, b = a + per;
    *p0 = a < n ? a : n;
    *p1 = b < n ? b : n;
}

static uint64_t read_pass(const uint64_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 ^= p[i], s1 ^= p[i + 1], s2 ^= p[i + 2], s3 ^= p[i + 3];
        s4 ^= p[i + 4], s5 ^= p[i + 5], s6 ^= p[i + 6], s7 ^= p[i + 7];
    }
    for (; i < n; i++) s0 ^= p[i];
    return s0 ^ s1 ^ s2 ^ s3 ^ s4 ^ s5 ^ s6 ^ s7;
}

static void *membw_thread(void *arg) {
    membw_arg *ma = arg;
    membw_job *j = ma->j;
    const int ith = ma->ith;
    if (ith != 0) {
        pthread_mutex_lock(&j->mu);
        while (!j->go) pthread_cond_wait(&j->cv, &j->mu);
        const int go = j->go;
        pthread_mutex_unlock(&j->mu);
        if (go < 0) return NULL;
    }
    size_t r0, r1, t0, t1;
    part(j->read_words, ith, j->n, &r0, &r1);
    part(j->triad_elems, ith, j->n, &t0, &t1);
    /* first touch: this thread's parts, then one untimed pass of each kind */
    for (size_t i = r0; i < r1; i++) j->rbuf[i] = i * 0x9e3779b97f4a7c15ull;
    for (size_t i = t0; i < t1; i++) j->a[i] = 0.0, j->b[i] = (double)(i & 1023), j->c[i] = 1.0 / (double)((i & 7) + 1);
    uint64_t acc = read_pass(j->rbuf + r0, r1 - r0);
    for (int r = 0; r < j->runs; r++) {
        pthread_barrier_wait(&j->bar);
        const double ts = ith == 0 ? now_s() : 0;
        acc ^= read_pass(j->rbuf + r0, r1 - r0);
        pthread_barrier_wait(&j->bar);
        if (ith == 0) j->t_read[r] = now_s() - ts;
        pthread_barrier_wait(&j->bar);
        const double tt = ith == 0 ? now_s() : 0;
        const double s = 3.0 + r;
        double *restrict a = j->a;
        const double *restrict b = j->b, *restrict c = j->c;
        for (size_t i = t0; i < t1; i++) a[i] = b[i] + s * c[i];
        pthread_barrier_wait(&j->bar);
        if (ith == 0) j->t_triad[r] = now_s() - tt;
    }
    if (ith == 0) j->sink = acc ^ (uint64_t)j->a[t0 < t1 ? t0 : 0];
    return NULL;
}

static int cmp_d(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}
static double med(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *big_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, MEMBW_ALIGN, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure leaves 4 KiB pages */
#endif
    return p;
}

kvt_status kvt_membw_measure(int n_threads, uint32_t mib, int runs, kvt_membw_result *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > 256 || mib < 64 || mib > 16384 || runs < 1 || runs > 100)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "membw: threads 1..256, MiB 64..16384, runs 1..100");
    membw_job j = {.n = n_threads, .runs = runs};
    const size_t rbytes = (size_t)mib << 20, tbytes = rbytes / 2;
    j.read_words = rbytes / 8;
    j.triad_elems = tbytes / 8;
    j.rbuf = big_alloc(rbytes);
    j.a = big_alloc(tbytes);
    j.b = big_alloc(tbytes);
    j.c = big_alloc(tbytes);
    j.t_read = calloc((size_t)runs, sizeof(double));
    j.t_triad = calloc((size_t)runs, sizeof(double));
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    membw_arg *args = calloc((size_t)n_threads, sizeof *args);
    kvt_status st = KVT_OK;
    int started = 0;
    bool bar = false;
    if (!j.rbuf || !j.a || !j.b || !j.c || !j.t_read || !j.t_triad || !th || !args) {
        st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "membw: cannot allocate %u MiB of buffers", mib * 2 + mib / 2);
        goto out;
    }
    if (pthread_barrier_init(&j.bar, NULL, (unsigned)n_threads) != 0) {
        st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "membw: barrier");
        goto out;
    }
    bar = true;
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    for (int i = 0; i < n_threads; i++) args[i] = (membw_arg){&j, i};
    for (started = 1; started < n_threads; started++)
        if (pthread_create(&th[started], NULL, membw_thread, &args[started]) != 0) break;
    pthread_mutex_lock(&j.mu);
    j.go = started == n_threads ? 1 : -1;
    pthread_cond_broadcast(&j.cv);
    pthread_mutex_unlock(&j.mu);
    if (j.go > 0) membw_thread(&args[0]);
    else st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "membw: cannot start %d threads", n_threads);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    pthread_cond_destroy(&j.cv);
    pthread_mutex_destroy(&j.mu);
    if (st != KVT_OK) goto out;
    out->n_threads = n_threads;
    out->read_bytes = rbytes;
    out->triad_bytes = tbytes;
    out->runs = runs;
    double best_r = 1e30, best_t = 1e30;
    for (int r = 0; r < runs; r++) {
        if (j.t_read[r] < best_r) best_r = j.t_read[r];
        if (j.t_triad[r] < best_t) best_t = j.t_triad[r];
    }
    out->read_gbs = rbytes / med(j.t_read, runs) * 1e-9;
    out->triad_gbs = 3.0 * tbytes / med(j.t_triad, runs) * 1e-9;
    out->read_best_gbs = rbytes / best_r * 1e-9;
    out->triad_best_gbs = 3.0 * tbytes / best_t * 1e-9;
out:
    if (bar) pthread_barrier_destroy(&j.bar);
    free(j.rbuf);
    free(j.a);
    free(j.b);
    free(j.c);
    free(j.t_read);
    free(j.t_triad);
    free(th);
    free(args);
    return st;
}
