/*
 * sched.h — continuous batching (docs/batching.md): up to `parallel` generations (rows) share one
 * forward pass per step. A submitted row waits in a FIFO queue (follow-up rows enter at its head;
 * kvt_sched_run's rows are bounded by queue_max, kvt_sched_submit's by the caller) until a row
 * slot is free and its KV reservation fits the pool beside the active rows' (a row alone is always
 * admitted: its own admission check then decides); each step forwards one token of every decoding row and
 * fills the rest of the ubatch with prefill chunks, so a prefill delays the others' next token by
 * at most one step of <= ubatch tokens.
 *
 * Threading / ownership: kvt_sched owns one scheduler thread that runs every row phase but begin
 * (row.h) and the forward passes, so token callbacks run on that thread, and one begin thread that
 * runs kvt_row_begin (the tier lookup) for rows submitted without a waiting thread. kvt_sched_run is
 * called from any thread and blocks until the row ended. kvt_sched_free cancels what is queued or
 * running (finish = CANCELLED), waits for the thread and frees; no kvt_sched_run may start after it
 * began. Stats may be read from any thread.
 */
#ifndef KVT_SCHED_H
#define KVT_SCHED_H

#include "row.h"

typedef struct kvt_sched kvt_sched;

typedef struct kvt_sched_opts {
    uint32_t parallel;   /* row slots, >= 1 */
    uint32_t queue_max;  /* rows waiting for a slot or memory before KVT_ERR_POOL_EXHAUSTED */
    uint32_t ubatch;     /* tokens per step (the compute context's ubatch) */
    uint64_t budget;     /* pool bytes the active rows' reservations may add up to (0 = none) */
} kvt_sched_opts;

kvt_status kvt_sched_create(kvt_engine *e, const kvt_sched_opts *o, kvt_sched **out);
void kvt_sched_free(kvt_sched *s);

/* Queue r (state QUEUED, reserve set) and wait until it ended; kvt_row_begin runs on this thread.
 * KVT_ERR_POOL_EXHAUSTED (and r->err) when the wait queue is full; otherwise r->st. */
kvt_status kvt_sched_run(kvt_sched *s, kvt_row *r);
/* Queue r and return at once (no thread waits for it): the scheduler's begin thread runs
 * kvt_row_begin once r is admitted (or ends it cancelled when req->cancel was set meanwhile), and
 * on_done(r, ctx) is called once, on the scheduler thread, after kvt_row_end: r (owned by the
 * caller) must stay valid until then and is not touched by the scheduler after it. front: ahead of
 * every waiting row. queue_max does not apply: the caller bounds its submissions. Fails (r->err,
 * on_done not called) only with KVT_ERR_CANCELLED once kvt_sched_free began. */
kvt_status kvt_sched_submit(kvt_sched *s, kvt_row *r, bool front, void (*on_done)(kvt_row *r, void *ctx), void *ctx);

typedef struct kvt_sched_stats {
    uint32_t parallel, rows_active, queued, queue_max;
    uint64_t steps, step_tokens, rows_admitted, memory_waits, queue_full;
    uint64_t reserved;                         /* KV bytes the active rows reserved (admission) */
    double tokens_per_step_last, tokens_per_step_avg;
    double prefill_tps_1m, decode_tps_1m;      /* tokens forwarded over the last minute */
    double queue_wait_ms_last, queue_wait_ms_avg, queue_wait_ms_max;
    double max_decode_stall_ms;                /* longest step with prefill tokens while rows decoded */
    double max_decode_step_ms;                 /* longest step of decode rows only */
} kvt_sched_stats;
void kvt_sched_stats_get(kvt_sched *s, kvt_sched_stats *out);

#endif
