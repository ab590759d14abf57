/*
 * threadpool.c — see threadpool.h. Workers wait for a new generation number (`gen`), spinning for a
 * while and then sleeping on a futex; the last worker to finish publishes the generation in `done`
 * for the caller. The barrier is a sense-reversing counter barrier on atomics.
 */
#include "threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVT_CPU_RELAX() _mm_pause()
#else
#define KVT_CPU_RELAX() ((void)0)
#endif

/* Spin iterations (one pause each, ~10-60 ns) before a worker sleeps between runs (~0.2-1 ms), and
 * before a thread waiting at a barrier sleeps (~20-100 µs: longer than a typical decode op, short
 * enough not to starve a late thread on an oversubscribed machine). */
#define KVT_TP_IDLE_SPIN 20000
#define KVT_TP_BARRIER_SPIN 2000

typedef struct kvt_tp_worker {
    struct kvt_threadpool *tp;
    int ith;
} kvt_tp_worker;

struct kvt_threadpool {
    int n;
    pthread_t *threads;
    kvt_tp_worker *workers;
    kvt_task_fn fn;
    void *ctx;
    _Atomic uint32_t gen;          /* futex word: bumped once per run */
    _Atomic uint32_t done;         /* futex word: generation finished by all workers */
    _Atomic int32_t n_pending;     /* workers still running the current generation */
    _Atomic int32_t n_sleeping;    /* workers blocked (or about to block) on gen */
    _Atomic int32_t caller_sleeping;
    _Atomic int stop;
    /* barrier */
    _Atomic int32_t bar_count;
    _Atomic uint32_t bar_phase;    /* futex word */
    _Atomic int32_t bar_sleeping;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void *worker_main(void *arg) {
    kvt_tp_worker *w = arg;
    kvt_threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < KVT_TP_IDLE_SPIN; i++) {
            KVT_CPU_RELAX();
            g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        }
        while (g == seen) {
            atomic_fetch_add(&tp->n_sleeping, 1); /* seq_cst: pairs with the caller's check */
            futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        }
        seen = g;
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        tp->fn(tp->ctx, w->ith, tp->n);
        if (atomic_fetch_sub_explicit(&tp->n_pending, 1, memory_order_acq_rel) == 1) {
            atomic_store(&tp->done, g);
            if (atomic_load(&tp->caller_sleeping)) futex_wake(&tp->done, 1);
        }
    }
    return NULL;
}

kvt_threadpool *kvt_threadpool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    kvt_threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp) return NULL;
    tp->n = n_threads;
    if (n_threads == 1) return tp;
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    tp->workers = calloc((size_t)n_threads, sizeof(kvt_tp_worker));
    if (!tp->threads || !tp->workers) {
        free(tp->threads);
        free(tp->workers);
        free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        tp->workers[i].tp = tp;
        tp->workers[i].ith = i;
        if (pthread_create(&tp->threads[i], NULL, worker_main, &tp->workers[i]) != 0) {
            tp->n = i; /* join the ones that started */
            kvt_threadpool_free(tp);
            return NULL;
        }
    }
    return tp;
}

void kvt_threadpool_free(kvt_threadpool *tp) {
    if (!tp) return;
    if (tp->n > 1) {
        atomic_store(&tp->stop, 1);
        atomic_fetch_add(&tp->gen, 1);
        futex_wake(&tp->gen, INT_MAX);
        for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    }
    free(tp->threads);
    free(tp->workers);
    free(tp);
}

int kvt_threadpool_n_threads(const kvt_threadpool *tp) { return tp->n; }

void kvt_threadpool_run(kvt_threadpool *tp, kvt_task_fn fn, void *ctx) {
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->n_pending, tp->n - 1);
    uint32_t g = atomic_fetch_add(&tp->gen, 1) + 1; /* seq_cst: publishes fn/ctx */
    if (atomic_load(&tp->n_sleeping) > 0) futex_wake(&tp->gen, INT_MAX);
    fn(ctx, 0, tp->n);
    uint32_t d = atomic_load_explicit(&tp->done, memory_order_acquire);
    for (int i = 0; d != g && i < KVT_TP_IDLE_SPIN; i++) {
        KVT_CPU_RELAX();
        d = atomic_load_explicit(&tp->done, memory_order_acquire);
    }
    while (d != g) {
        atomic_store(&tp->caller_sleeping, 1);
        futex_wait(&tp->done, d);
        atomic_store(&tp->caller_sleeping, 0);
        d = atomic_load_explicit(&tp->done, memory_order_acquire);
    }
}

void kvt_threadpool_barrier(kvt_threadpool *tp) {
    if (tp->n == 1) return;
    uint32_t phase = atomic_load_explicit(&tp->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == tp->n - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&tp->bar_phase, 1); /* seq_cst: pairs with the sleepers' increment */
        if (atomic_load(&tp->bar_sleeping) > 0) futex_wake(&tp->bar_phase, INT_MAX);
        return;
    }
    for (int i = 0; i < KVT_TP_BARRIER_SPIN; i++) {
        if (atomic_load_explicit(&tp->bar_phase, memory_order_acquire) != phase) return;
        KVT_CPU_RELAX();
    }
    /* Still waiting (slow op or an oversubscribed machine): sleep instead of burning the core the
     * late thread may need. */
    while (atomic_load_explicit(&tp->bar_phase, memory_order_acquire) == phase) {
        atomic_fetch_add(&tp->bar_sleeping, 1);
        futex_wait(&tp->bar_phase, phase);
        atomic_fetch_sub(&tp->bar_sleeping, 1);
    }
}
