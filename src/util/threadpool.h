/*
 * threadpool.h — a small fixed-size thread pool for the forward pass: kvt_threadpool_run(fn, ctx)
 * runs fn(ctx, ith, nth) on every thread (the caller is thread 0) and returns when all are done.
 * Inside fn, kvt_threadpool_barrier synchronizes all nth threads (ggml style: one run per forward
 * chunk, a barrier between ops).
 *
 * Wake-up cost is kept low: idle workers spin briefly (so back-to-back runs within a token do not
 * pay a syscall), then sleep on a futex; the caller only issues a wake syscall when some worker is
 * actually asleep. n_threads == 1 runs fn inline with no synchronization.
 *
 * Ownership: kvt_threadpool_create starts n-1 worker threads; kvt_threadpool_free joins them. One
 * caller thread at a time may call kvt_threadpool_run (it is not reentrant); fn must not call run.
 */
#ifndef KVT_THREADPOOL_H
#define KVT_THREADPOOL_H

#include <stdint.h>

typedef struct kvt_threadpool kvt_threadpool;
typedef void (*kvt_task_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (values < 1 are treated as 1). NULL on allocation / thread creation failure. */
kvt_threadpool *kvt_threadpool_create(int n_threads);
void kvt_threadpool_free(kvt_threadpool *tp);
int kvt_threadpool_n_threads(const kvt_threadpool *tp);
/* Runs fn(ctx, ith, nth) for ith in [0, nth) concurrently, ith 0 on the calling thread. */
void kvt_threadpool_run(kvt_threadpool *tp, kvt_task_fn fn, void *ctx);
/* Called by all nth threads from inside fn: returns once every thread has reached it. Memory
 * written before the barrier by any thread is visible to all threads after it. */
void kvt_threadpool_barrier(kvt_threadpool *tp);

#endif
