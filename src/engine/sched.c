/*
 * sched.c — the continuous-batching scheduler (see sched.h, docs/batching.md).
 *
 * A row's life (row.h states, drawn and enforced in row.c), all transitions on the scheduler thread
 * except begin's:
 *
 *   QUEUED --admit--> admitted --(kvt_row_begin: submitter, or the begin thread)--> ready: PREFILL
 *      \                  \--> ready: DONE (lookup/admission error; async: cancelled while queued)
 *       \--> DONE (shutdown)   PREFILL --chunks--> DECODE --tokens/cancel/error/stop--> DONE --end--> done
 *
 * Invariants:
 *   1. Rows leave the queue in FIFO order (a follow-up row enters at the head); a row is admitted
 *      only when fewer than `parallel` rows are active and either no row is active or the active
 *      rows' reservations plus its own fit the budget (so a pool too small for all rows serves them
 *      in order, never OOM). A row that ended in begin frees its slot for the next admission at once.
 *   2. The queue never holds more than queue_max rows submitted bounded; such a submit beyond that
 *      fails at once (unbounded submitters, the server, bound their own submissions).
 *   3. Every step forwards at most ubatch tokens: first the tokens of every DECODE row (one, or one
 *      plus its draft tokens in a speculative round, leaving at least one for each DECODE row after
 *      it), then prefill chunks, fewest prompt tokens left first, with what is left, so no decode
 *      waits more than one step for a prefill and a short prompt never waits behind a long one.
 *      A speculative round's verify pass needs the logits of every position, so it runs on its own
 *      after the batched pass, in the same step (docs/speculative.md).
 *   4. kvt_row_begin runs after admission off the scheduler thread (a slow restore pauses no other
 *      row): on the submitting thread for kvt_sched_run, on the begin thread, in admission order,
 *      for kvt_sched_submit; every other phase and every forward pass run on the scheduler thread, the forward
 *      under the engine's context mutex; only ready rows are planned, stepped or ended; s->mu is
 *      never held across a phase or a forward.
 *   5. A row is ended (kvt_row_end) exactly once, after it reached DONE, and only then marked done;
 *      its submitter returns only after that, so the row (on its stack) outlives the scheduler's use;
 *      an async row's on_done is its last use by the scheduler (it may free the row).
 *   6. rows_active + queued counts every submitted row not yet done; reserved is the sum of the
 *      active rows' reservations.
 */
#include "sched.h"

#include <pthread.h>
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
    kvt_batch_item *vitems; /* [parallel] the step's verify passes (speculative rounds) */
    kvt_row **vitem_row;    /* [parallel] */
    float *vlogits;         /* a verify pass's logits (kvt_rows_forward_verify), vlogits_cap floats */
    size_t vlogits_cap;
    /* the begin thread (async rows): admitted rows waiting for kvt_row_begin, in admission order */
    pthread_t begin_th;
    bool begin_started, begin_stop;
    pthread_cond_t begin_cv;
    kvt_row *b_head, *b_tail;
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

/* End a DONE row outside mu (it calls back into the tiers and the token callback), then mark it;
 * an async row is then handed back (invariant 5: its last use here). */
static void finish_row(kvt_sched *s, kvt_row *r) {
    kvt_row_end(r);
    void (*cb)(kvt_row *, void *) = r->on_done;
    void *cb_ctx = r->done_ctx;
    pthread_mutex_lock(&s->mu);
    r->done = true; /* a sync row's submitter may return (and its row go) from here on */
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    if (cb) cb(r, cb_ctx);
}

static bool row_cancelled(const kvt_row *r) {
    return r->req->cancel && __atomic_load_n(r->req->cancel, __ATOMIC_RELAXED);
}

/* Invariant 4: begins the admitted async rows in admission order, off the scheduler thread. */
static void *begin_main(void *arg) {
    kvt_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->b_head && !s->begin_stop) pthread_cond_wait(&s->begin_cv, &s->mu);
        if (!s->b_head) break;
        kvt_row *r = s->b_head;
        s->b_head = r->qnext;
        if (!s->b_head) s->b_tail = NULL;
        r->qnext = NULL;
        pthread_mutex_unlock(&s->mu);
        if (row_cancelled(r)) /* cancelled while it waited (client gone): no lookup, no prefill */
            kvt_row_cancel_queued(r, "request cancelled before it started");
        else
            kvt_row_begin(r);
        pthread_mutex_lock(&s->mu);
        r->ready = true;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
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
        r->admitted = true; /* kvt_row_begin runs (invariant 4), then the row is marked ready */
        if (r->on_done) {
            if (s->b_tail) s->b_tail->qnext = r;
            else s->b_head = r;
            s->b_tail = r;
            pthread_cond_signal(&s->begin_cv);
        } else {
            pthread_cond_broadcast(&s->done_cv);
        }
    }
}

/* Drop DONE rows from the active set and end them. Called and returns with mu held. True when it
 * ended one (a slot may have come free). */
static bool reap(kvt_sched *s) {
    bool any = false;
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
        any = true;
        i = 0; /* the set may have been reordered: rescan (at most parallel rows) */
    }
    return any;
}

/* One forward pass over the active rows (invariant 3). Runs without mu. */
static void step(kvt_sched *s, kvt_row **rows, uint32_t n_rows, bool stopping) {
    uint32_t budget = s->o.ubatch, ni = 0, nvi = 0, n_dec = 0, n_pre_tok = 0, dec_left = 0;
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
    for (uint32_t i = 0; i < n_rows; i++) dec_left += rows[i]->state == KVT_ROW_DECODE;
    for (int pass = 0; pass < 2; pass++) /* pass 0: decode rows, pass 1: prefill rows */
        for (uint32_t i = 0; i < n_rows && budget; i++) {
            kvt_row *r = rows[i];
            if (r->state != (pass == 0 ? KVT_ROW_DECODE : KVT_ROW_PREFILL)) continue;
            const int32_t *tok = NULL;
            if (pass == 0) dec_left--; /* one token stays for each decode row after this one */
            uint32_t m = kvt_row_plan(r, pass == 0 ? budget - dec_left : budget, &tok);
            if (!m) continue; /* cancelled: DONE */
            if (kvt_row_verifies(r)) {
                s->vitems[nvi] = (kvt_batch_item){r->seq, tok, m, KVT_OK};
                s->vitem_row[nvi++] = r;
            } else {
                s->items[ni] = (kvt_batch_item){r->seq, tok, m, KVT_OK};
                s->item_row[ni++] = r;
            }
            budget -= m;
            if (pass == 0) n_dec += m;
            else n_pre_tok += m;
        }
    for (uint32_t i = 0; i < n_rows; i++) any_decoding = any_decoding || rows[i]->state == KVT_ROW_DECODE;
    if (!ni && !nvi) return;
    kvt_rows_set_decoding(s->e, any_decoding);
    const double t0 = kvt_now_ms();
    if (ni) {
        float *logits = NULL;
        kvt_status st = kvt_rows_forward(s->e, s->items, ni, &logits);
        const uint32_t V = kvt_engine_n_vocab(s->e);
        for (uint32_t i = 0; i < ni; i++) {
            kvt_status fst = st != KVT_OK ? st : s->items[i].st;
            kvt_row_advance(s->item_row[i], s->items[i].n, fst, fst == KVT_OK ? logits + (size_t)i * V : NULL);
        }
    }
    for (uint32_t i = 0; i < nvi; i++) { /* verify passes: every position's logits, one row at a time */
        const kvt_batch_item *it = &s->vitems[i];
        kvt_status st = kvt_rows_forward_verify(s->e, it->seq, it->tokens, it->n, &s->vlogits, &s->vlogits_cap);
        kvt_row_advance(s->vitem_row[i], it->n, st, st == KVT_OK ? s->vlogits : NULL);
    }
    const double t1 = kvt_now_ms();
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
                kvt_row_cancel_queued(r, "the engine is shutting down");
                pthread_mutex_unlock(&s->mu);
                finish_row(s, r);
                pthread_mutex_lock(&s->mu);
            }
            s->q_tail = NULL;
            if (!s->n_active) break;
        } else {
            admit(s);
        }
        const bool reaped = reap(s);
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->n_active; i++)
            if (s->active[i]->ready) rows[n++] = s->active[i];
        if (!n) { /* nothing to step: wait for a new row, a begun row or stop */
            /* a row that ended in begin (error, cancelled while queued) freed its slot: admit again */
            if (reaped || (s->stop && !s->n_active)) continue;
            /* idle: nothing decodes until the next step says so, so the tier writers (SSD
             * write-behind, shared-tier publisher) need not defer while the server waits */
            kvt_rows_set_decoding(s->e, false);
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
    kvt_rows_set_decoding(s->e, false);
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
    s->vitems = calloc(s->o.parallel, sizeof *s->vitems);
    s->vitem_row = calloc(s->o.parallel, sizeof *s->vitem_row);
    s->t_start = kvt_now_ms();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_cond_init(&s->begin_cv, NULL);
    if (!s->active || !s->items || !s->item_row || !s->rows || !s->vitems || !s->vitem_row || pthread_create(&s->begin_th, NULL, begin_main, s) != 0) {
        kvt_sched_free(s);
        return KVT_ERR_NOMEM;
    }
    s->begin_started = true;
    if (pthread_create(&s->th, NULL, sched_main, s) != 0) {
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
    if (s->begin_started) { /* after the scheduler thread: it ended every row, so none waits to begin */
        pthread_mutex_lock(&s->mu);
        s->begin_stop = true;
        pthread_cond_broadcast(&s->begin_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->begin_th, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->begin_cv);
    free(s->active);
    free(s->items);
    free(s->item_row);
    free(s->rows);
    free(s->vitems);
    free(s->vitem_row);
    free(s->vlogits);
    free(s);
}

/* Queue r (mu held). KVT_OK, or the refusal (r->err) when stopping or, bounded, the queue is full. */
static kvt_status enqueue(kvt_sched *s, kvt_row *r, bool front, bool bounded) {
    if (s->stop) return kvt_errf(r->err, r->errlen, KVT_ERR_CANCELLED, "the engine is shutting down");
    if (bounded && s->n_queued >= s->o.queue_max) { /* invariant 2 */
        s->queue_full++;
        return kvt_errf(r->err, r->errlen, KVT_ERR_POOL_EXHAUSTED,
                        "out of KV memory: %u requests already wait for KV blocks (queue full)", s->o.queue_max);
    }
    r->batched = true;
    r->t_enq = kvt_now_ms();
    if (front) {
        r->qnext = s->q_head;
        s->q_head = r;
        if (!s->q_tail) s->q_tail = r;
    } else {
        r->qnext = NULL;
        if (s->q_tail) s->q_tail->qnext = r;
        else s->q_head = r;
        s->q_tail = r;
    }
    s->n_queued++;
    pthread_cond_signal(&s->cv);
    return KVT_OK;
}

kvt_status kvt_sched_submit(kvt_sched *s, kvt_row *r, bool front, void (*on_done)(kvt_row *r, void *ctx), void *ctx) {
    r->on_done = on_done;
    r->done_ctx = ctx;
    pthread_mutex_lock(&s->mu);
    kvt_status st = enqueue(s, r, front, false);
    pthread_mutex_unlock(&s->mu);
    return st;
}

kvt_status kvt_sched_run(kvt_sched *s, kvt_row *r) {
    pthread_mutex_lock(&s->mu);
    kvt_status st = enqueue(s, r, false, true);
    if (st) {
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    s->n_inside++;
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
    out->reserved = s->reserved;
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
