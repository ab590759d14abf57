/*
 * sched.c — the continuous-batching scheduler (see sched.h, docs/batching.md).
 *
 * A row's life (engine_int.h states), all transitions on the scheduler thread except the first:
 *
 *   QUEUED --admit--> admitted --(kvt_row_begin, submitter)--> ready: PREFILL --chunks--> DECODE
 *      \                                                   \--> ready: DONE (lookup/admission error)
 *       \--> DONE (shutdown)      PREFILL/DECODE --tokens/cancel/error/stop--> DONE --end--> done
 *
 * Invariants:
 *   1. Rows leave the queue in FIFO order; a row is admitted only when fewer than `parallel` rows
 *      are active and either no row is active or the active rows' reservations plus its own fit
 *      the budget (so a pool too small for all rows serves them in order, never OOM).
 *   2. The queue never holds more than queue_max rows; a submit beyond that fails at once.
 *   3. Every step forwards at most ubatch tokens: first one token of every DECODE row, then
 *      prefill chunks, fewest prompt tokens left first, with what is left, so no decode waits more
 *      than one step for a prefill and a short prompt never waits behind a long one.
 *   4. kvt_row_begin runs on the submitting thread after admission (a slow restore pauses no other
 *      row); every other phase and every forward pass run on the scheduler thread, the forward
 *      under the engine's context mutex; only ready rows are planned, stepped or ended; s->mu is
 *      never held across a phase or a forward.
 *   5. A row is ended (kvt_row_end) exactly once, after it reached DONE, and only then marked done;
 *      its submitter returns only after that, so the row (on its stack) outlives the scheduler's use.
 *   6. rows_active + queued counts every submitted row not yet done; reserved is the sum of the
 *      active rows' reservations.
 */
#include "sched.h"

#include <stdlib.h>

#define WIN_S 60 /* seconds of per-second token buckets for the last-minute rates */

struct kvt_sched {
    kvt_engine *e;
    kvt_sched_opts o;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* new row / stop (scheduler waits) */
    pthread_cond_t done_cv; /* a row ended (submitters wait) */
    bool stop;
    kvt_row *q_head, *q_tail;
    uint32_t n_queued;
    uint32_t n_inside;      /* submitters inside kvt_sched_run (free waits for them to leave) */
    kvt_row **active;       /* [parallel] */
    uint32_t n_active;
    uint64_t reserved;
    kvt_batch_item *items;  /* [parallel] */
    kvt_row **rows;         /* [parallel] the ready rows of one step (scheduler thread) */
    kvt_row **item_row;     /* [parallel] */
    /* stats (mu) */
    uint64_t steps, step_tokens, admitted, memory_waits, queue_full;
    uint32_t last_step_tokens;
    double wait_last, wait_sum, wait_max, stall_max, decode_step_max;
    int64_t bucket_sec[WIN_S];
    uint64_t bucket_prefill[WIN_S], bucket_decode[WIN_S];
    double t_start;
};

static void note_tokens(kvt_sched *s, double now_ms, uint64_t prefill, uint64_t decode) {
    int64_t sec = (int64_t)(now_ms / 1000.0);
    int i = (int)(sec % WIN_S);
    if (s->bucket_sec[i] != sec) {
        s->bucket_sec[i] = sec;
        s->bucket_prefill[i] = s->bucket_decode[i] = 0;
    }
    s->bucket_prefill[i] += prefill;
    s->bucket_decode[i] += decode;
}

/* End a DONE row outside mu (it calls back into the tiers and the token callback), then mark it. */
static void finish_row(kvt_sched *s, kvt_row *r) {
    kvt_row_end(r);
    pthread_mutex_lock(&s->mu);
    r->done = true;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Invariant 1: admit from the queue head while a slot and the memory allow. Called with mu held. */
static void admit(kvt_sched *s) {
    while (s->q_head && s->n_active < s->o.parallel) {
        kvt_row *r = s->q_head;
        if (s->n_active > 0 && s->o.budget && s->reserved + r->reserve > s->o.budget) {
            if (!r->mem_waited) {
                r->mem_waited = true;
                s->memory_waits++;
            }
            return;
        }
        s->q_head = r->qnext;
        if (!s->q_head) s->q_tail = NULL;
        r->qnext = NULL;
        s->n_queued--;
        double w = kvt_now_ms() - r->t_enq;
        s->wait_last = w;
        s->wait_sum += w;
        if (w > s->wait_max) s->wait_max = w;
        s->admitted++;
        s->active[s->n_active++] = r; /* counted active while it begins (invariant 6) */
        s->reserved += r->reserve;
        r->admitted = true; /* its submitter runs kvt_row_begin, then marks it ready */
        pthread_cond_broadcast(&s->done_cv);
    }
}

/* Drop DONE rows from the active set and end them. Called and returns with mu held. */
static void reap(kvt_sched *s) {
    for (uint32_t i = 0; i < s->n_active;) {
        kvt_row *r = s->active[i];
        if (!r->ready || r->state != KVT_ROW_DONE) {
            i++;
            continue;
        }
        s->active[i] = s->active[--s->n_active];
        s->reserved -= r->reserve;
        pthread_mutex_unlock(&s->mu);
        finish_row(s, r);
        pthread_mutex_lock(&s->mu);
        i = 0; /* the set may have been reordered: rescan (at most parallel rows) */
    }
}

/* One forward pass over the active rows (invariant 3). Runs without mu. */
static void step(kvt_sched *s, kvt_row **rows, uint32_t n_rows, bool stopping) {
    uint32_t budget = s->o.ubatch, ni = 0, n_dec = 0, n_pre_tok = 0;
    bool any_decoding = false;
    if (stopping) /* shutdown: every row's next plan ends it cancelled */
        for (uint32_t i = 0; i < n_rows; i++) __atomic_store_n(&rows[i]->abort, 1, __ATOMIC_RELAXED);
    /* prefill rows by fewest prompt tokens left (ties: admission order), so a short request that
     * arrives during a long prefill gets its chunk in the next step (TTFT <= its own prefill + one
     * step) while the long one takes what is left of the budget */
    for (uint32_t i = 1; i < n_rows; i++) {
        kvt_row *r = rows[i];
        uint32_t j = i;
        for (; j > 0 && rows[j - 1]->n - rows[j - 1]->done_tok > r->n - r->done_tok; j--) rows[j] = rows[j - 1];
        rows[j] = r;
    }
    for (int pass = 0; pass < 2; pass++) /* pass 0: decode rows, pass 1: prefill rows */
        for (uint32_t i = 0; i < n_rows && budget; i++) {
            kvt_row *r = rows[i];
            if (r->state != (pass == 0 ? KVT_ROW_DECODE : KVT_ROW_PREFILL)) continue;
            const int32_t *tok = NULL;
            uint32_t m = kvt_row_plan(r, budget, &tok);
            if (!m) continue; /* cancelled: DONE */
            s->items[ni] = (kvt_batch_item){r->seq, tok, m, KVT_OK};
            s->item_row[ni++] = r;
            budget -= m;
            if (pass == 0) n_dec++;
            else n_pre_tok += m;
        }
    for (uint32_t i = 0; i < n_rows; i++) any_decoding = any_decoding || rows[i]->state == KVT_ROW_DECODE;
    if (!ni) return;
    kvt_engine_set_decoding(s->e, any_decoding);
    const double t0 = kvt_now_ms();
    float *logits = NULL;
    pthread_mutex_lock(kvt_engine_ctx_mu(s->e));
    kvt_status st = kvt_model_forward_batch(kvt_engine_ctx(s->e), s->items, ni, &logits);
    pthread_mutex_unlock(kvt_engine_ctx_mu(s->e));
    const double t1 = kvt_now_ms();
    const uint32_t V = kvt_engine_n_vocab(s->e);
    for (uint32_t i = 0; i < ni; i++) {
        kvt_status fst = st != KVT_OK ? st : s->items[i].st;
        kvt_row_advance(s->item_row[i], s->items[i].n, fst, fst == KVT_OK ? logits + (size_t)i * V : NULL);
    }
    pthread_mutex_lock(&s->mu);
    s->steps++;
    s->step_tokens += n_dec + n_pre_tok;
    s->last_step_tokens = n_dec + n_pre_tok;
    if (n_dec && n_pre_tok && t1 - t0 > s->stall_max) s->stall_max = t1 - t0;
    if (n_dec && !n_pre_tok && t1 - t0 > s->decode_step_max) s->decode_step_max = t1 - t0;
    note_tokens(s, t1, n_pre_tok, n_dec);
    pthread_mutex_unlock(&s->mu);
}

static void *sched_main(void *arg) {
    kvt_sched *s = arg;
    kvt_row **rows = s->rows;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stop) { /* shutdown: queued rows end cancelled, active rows are aborted below */
            while (s->q_head) {
                kvt_row *r = s->q_head;
                s->q_head = r->qnext;
                s->n_queued--;
                r->st = kvt_errf(r->err, r->errlen, KVT_ERR_CANCELLED, "the engine is shutting down");
                r->res->finish = KVT_FINISH_CANCELLED;
                r->state = KVT_ROW_DONE;
                pthread_mutex_unlock(&s->mu);
                finish_row(s, r);
                pthread_mutex_lock(&s->mu);
            }
            s->q_tail = NULL;
            if (!s->n_active) break;
        } else {
            admit(s);
        }
        reap(s);
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->n_active; i++)
            if (s->active[i]->ready) rows[n++] = s->active[i];
        if (!n) { /* nothing to step: wait for a new row, a begun row or stop */
            if (s->stop && !s->n_active) continue;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        step(s, rows, n, stopping);
        pthread_mutex_lock(&s->mu);
        reap(s);
    }
    pthread_mutex_unlock(&s->mu);
    kvt_engine_set_decoding(s->e, false);
    return NULL;
}

kvt_status kvt_sched_create(kvt_engine *e, const kvt_sched_opts *o, kvt_sched **out) {
    *out = NULL;
    if (!o->parallel || o->parallel > KVT_MAX_BATCH_ITEMS || !o->ubatch) return KVT_ERR_INVALID_ARG;
    kvt_sched *s = calloc(1, sizeof *s);
    if (!s) return KVT_ERR_NOMEM;
    s->e = e;
    s->o = *o;
    if (s->o.parallel > s->o.ubatch) s->o.parallel = s->o.ubatch; /* every decode row needs a token */
    s->active = calloc(s->o.parallel, sizeof *s->active);
    s->items = calloc(s->o.parallel, sizeof *s->items);
    s->item_row = calloc(s->o.parallel, sizeof *s->item_row);
    s->rows = calloc(s->o.parallel, sizeof *s->rows);
    s->t_start = kvt_now_ms();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (!s->active || !s->items || !s->item_row || !s->rows || pthread_create(&s->th, NULL, sched_main, s) != 0) {
        kvt_sched_free(s);
        return KVT_ERR_NOMEM;
    }
    s->started = true;
    *out = s;
    return KVT_OK;
}

void kvt_sched_free(kvt_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
        pthread_mutex_lock(&s->mu); /* every row is done: wait until their submitters returned */
        while (s->n_inside) pthread_cond_wait(&s->done_cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->done_cv);
    free(s->active);
    free(s->items);
    free(s->item_row);
    free(s->rows);
    free(s);
}

kvt_status kvt_sched_run(kvt_sched *s, kvt_row *r) {
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return kvt_errf(r->err, r->errlen, KVT_ERR_CANCELLED, "the engine is shutting down");
    }
    if (s->n_queued >= s->o.queue_max) { /* invariant 2 */
        s->queue_full++;
        pthread_mutex_unlock(&s->mu);
        return kvt_errf(r->err, r->errlen, KVT_ERR_POOL_EXHAUSTED,
                        "out of KV memory: %u requests already wait for KV blocks (queue full)", s->o.queue_max);
    }
    r->state = KVT_ROW_QUEUED;
    r->t_enq = kvt_now_ms();
    r->qnext = NULL;
    if (s->q_tail) s->q_tail->qnext = r;
    else s->q_head = r;
    s->q_tail = r;
    s->n_queued++;
    s->n_inside++;
    pthread_cond_signal(&s->cv);
    while (!r->done && !r->admitted) pthread_cond_wait(&s->done_cv, &s->mu);
    if (r->admitted) { /* invariant 4: begin here, off the scheduler thread */
        pthread_mutex_unlock(&s->mu);
        kvt_row_begin(r);
        pthread_mutex_lock(&s->mu);
        r->ready = true;
        pthread_cond_signal(&s->cv);
    }
    while (!r->done) pthread_cond_wait(&s->done_cv, &s->mu);
    s->n_inside--;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    return r->st;
}

void kvt_sched_stats_get(kvt_sched *s, kvt_sched_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    out->parallel = s->o.parallel;
    out->queue_max = s->o.queue_max;
    out->rows_active = s->n_active;
    out->queued = s->n_queued;
    out->steps = s->steps;
    out->step_tokens = s->step_tokens;
    out->rows_admitted = s->admitted;
    out->memory_waits = s->memory_waits;
    out->queue_full = s->queue_full;
    out->tokens_per_step_last = s->last_step_tokens;
    out->tokens_per_step_avg = s->steps ? (double)s->step_tokens / (double)s->steps : 0;
    out->queue_wait_ms_last = s->wait_last;
    out->queue_wait_ms_avg = s->admitted ? s->wait_sum / (double)s->admitted : 0;
    out->queue_wait_ms_max = s->wait_max;
    out->max_decode_stall_ms = s->stall_max;
    out->max_decode_step_ms = s->decode_step_max;
    const double now = kvt_now_ms();
    const int64_t sec = (int64_t)(now / 1000.0);
    uint64_t pf = 0, dc = 0;
    for (int i = 0; i < WIN_S; i++)
        if (s->bucket_sec[i] > sec - WIN_S) {
            pf += s->bucket_prefill[i];
            dc += s->bucket_decode[i];
        }
    double span = (now - s->t_start) / 1000.0;
    if (span > WIN_S) span = WIN_S;
    if (span < 1) span = 1;
    out->prefill_tps_1m = (double)pf / span;
    out->decode_tps_1m = (double)dc / span;
    pthread_mutex_unlock(&s->mu);
}
