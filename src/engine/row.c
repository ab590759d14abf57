/*
 * row.c — one generation as a row (row.h): the phases kvt_row_begin / kvt_row_plan /
 * kvt_row_advance / kvt_row_end and the row state machine. Steps of the generate loop
 * (engine.c's header): 2 (lookup) and 3's setup in begin, 3 (prefill chunks) and 4 (decode: sample,
 * stream, stop strings) in plan + advance, 5 (put back) in end.
 *
 * Row state machine (kvt_row_set_state is the only writer of r->state and refuses anything else):
 *
 *     QUEUED ──begin ok──▶ PREFILL ──last chunk, token sampled──▶ DECODE ──token sampled──┐
 *       │                    │                                     │   ▲                 │
 *       │ begin failed /     │ cancel / error / stop / EOG /       │   └─────────────────┘
 *       │ shutdown           │ max tokens at the first token       │ cancel / error / stop /
 *       ▼                    ▼                                     ▼ EOG / max tokens
 *     DONE ◀─────────────────┴─────────────────────────────────────┘      ──kvt_row_end──▶ (freed)
 *
 *   QUEUED   kvt_row_init made it; nothing is held yet. It waits (sched.c) for a slot and memory.
 *   PREFILL  begun: seq holds the reused prefix, done_tok < pn prompt tokens are forwarded.
 *   DECODE   next is the sampled token the next forward takes; n_gen tokens were emitted.
 *   DONE     finished for any reason (res->finish, st); only kvt_row_end remains.
 *
 * Invariants:
 *   1. The legal transitions are exactly the six drawn above (kvt_row_transition_legal):
 *      QUEUED->PREFILL, QUEUED->DONE, PREFILL->DECODE, PREFILL->DONE, DECODE->DECODE, DECODE->DONE.
 *      Every other request is refused: the state stays and the row's status records the error.
 *   2. DONE is final: no phase but kvt_row_end touches a DONE row, and kvt_row_plan returns 0 for it.
 *   3. begun is set (in begin, before PREFILL) exactly when the lookup and the admission check
 *      passed; kvt_row_end puts the sequence back and counts the request only then.
 *   4. decoding is set (in advance, before the first sample) exactly when the row reached decode;
 *      kvt_row_end flushes held-back text and reports decode figures only then.
 *   5. A row forwards at most one token per step in DECODE (1 + k in a speculative round, with
 *      k <= min(draft_max, budget - 1)) and at most min(chunk, budget) prompt tokens per step in
 *      PREFILL, never past a recurrent snapshot position (kvt_row_plan): every `every` tokens, and
 *      n-1 (snap_at), so an identical retry reuses n-1 tokens (the lookup's n-1 cap excludes the
 *      boundary snapshot at n).
 *   6. kvt_row_end runs once per row, in any state, and frees everything the row holds (sequence,
 *      chain, checkpoint run, detokenizer, sampler, text buffer, emitted tokens not handed to res,
 *      draft state).
 *
 * Speculative rounds (spec.h, docs/speculative.md). A DECODE row with a draft state plans next and
 * the draft's k proposals d_0..d_{k-1} (kvt_spec_propose); the verify pass forwards all k + 1 and
 * returns the logits of each position: row j is the target's distribution after next, d_0..d_{j-1}.
 * advance walks the rows in order, emitting through the same sample() as a plain step:
 *   greedy settings: the target's own draw at row j; d_j is accepted when it is that token;
 *   sampled settings: d_j is accepted or replaced by kvt_spec_verify against the target's
 *   distribution (kvt_sampler_probs after the constraint mask), the token it returns is emitted;
 * the walk stops at the first replaced token, at the end of the row, or after row k (every draft
 * accepted: the target's token there is the bonus). Invariants:
 *   7. With the same logits, a row emits under greedy settings exactly the tokens plain decoding
 *      emits: each is the sampler's draw from the target's row at its position, with the same
 *      history, and the verify pass's rows are bit-identical to one-token steps (model.h numerics).
 *   8. After a round the target's sequence holds exactly the row's tokens before next's successor
 *      (base + 1 + accepted): no rejected draft token stays (the window groups keep the blocks the
 *      cut needs: kvt_seq_set_rollback), and only then are sealed blocks handed to the tiers.
 */
#include "row.h"

#include <stdio.h>

#include <stdlib.h>

#include "engine_int.h"
#include "spec_verify.h"
#include "stop.h"

static const char *const state_names[KVT_ROW_N_STATES] = {"QUEUED", "PREFILL", "DECODE", "DONE"};

const char *kvt_row_state_name(kvt_row_state s) { return (unsigned)s < KVT_ROW_N_STATES ? state_names[s] : "?"; }

bool kvt_row_transition_legal(kvt_row_state from, kvt_row_state to) {
    switch (from) { /* invariant 1 */
    case KVT_ROW_QUEUED: return to == KVT_ROW_PREFILL || to == KVT_ROW_DONE;
    case KVT_ROW_PREFILL: return to == KVT_ROW_DECODE || to == KVT_ROW_DONE;
    case KVT_ROW_DECODE: return to == KVT_ROW_DECODE || to == KVT_ROW_DONE;
    default: return false; /* DONE is final (invariant 2); unknown states go nowhere */
    }
}

bool kvt_row_set_state(kvt_row *r, kvt_row_state to) {
    if (kvt_row_transition_legal(r->state, to)) {
        r->state = to;
        return true;
    }
    KVT_ERROR("row: illegal transition %s -> %s refused", kvt_row_state_name(r->state), kvt_row_state_name(to));
    if (r->st == KVT_OK)
        r->st = kvt_errf(r->err, r->errlen, KVT_ERR_INVALID_ARG, "internal error: illegal row transition %s -> %s",
                         kvt_row_state_name(r->state), kvt_row_state_name(to));
    return false;
}

void kvt_row_init(kvt_row *r, kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen,
                  uint32_t n, uint32_t max_new) {
    memset(r, 0, sizeof *r);
    r->state = KVT_ROW_QUEUED;
    r->e = e;
    r->req = req;
    r->res = res;
    r->err = err;
    r->errlen = errlen;
    r->n = n;
    r->max_new = max_new;
    r->reserve = kvt_engine_row_reserve(e, n, max_new);
}

void kvt_row_cancel_queued(kvt_row *r, const char *msg) {
    r->st = kvt_errf(r->err, r->errlen, KVT_ERR_CANCELLED, "%s", msg);
    r->res->finish = KVT_FINISH_CANCELLED;
    kvt_row_set_state(r, KVT_ROW_DONE);
}

kvt_status kvt_rows_forward(kvt_engine *e, kvt_batch_item *items, uint32_t n_items, float **logits) {
    pthread_mutex_lock(&e->gen_mu);
    kvt_status st = kvt_model_forward_batch(e->ctx, items, n_items, logits);
    pthread_mutex_unlock(&e->gen_mu);
    return st;
}

void kvt_rows_set_decoding(kvt_engine *e, bool any) { kvt_engine_set_decoding(e, any); }

kvt_status kvt_rows_forward_verify(kvt_engine *e, kvt_seq *seq, const int32_t *tokens, uint32_t n, float **buf,
                                   size_t *cap) {
    const size_t need = (size_t)n * e->n_vocab;
    if (need > *cap) {
        float *nb = realloc(*buf, need * sizeof(float));
        if (!nb) return KVT_ERR_NOMEM;
        *buf = nb;
        *cap = need;
    }
    pthread_mutex_lock(&e->gen_mu);
    float *logits = NULL;
    kvt_status st = kvt_model_forward(e->ctx, seq, tokens, n, true, NULL, &logits);
    if (st == KVT_OK) memcpy(*buf, logits, need * sizeof(float));
    pthread_mutex_unlock(&e->gen_mu);
    return st;
}

static bool row_cancelled(const kvt_row *r) {
    return (r->req->cancel && __atomic_load_n(r->req->cancel, __ATOMIC_RELAXED)) || /* set by another thread */
           __atomic_load_n(&r->abort, __ATOMIC_RELAXED);
}

/* 2. lookup and admission, then the prefill setup. False (r->st set) on an error. */
static bool begin(kvt_row *r) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    const uint32_t n = r->n;
    r->gen = malloc(sizeof(int32_t) * (r->max_new + 1));
    r->sampler = kvt_sampler_create(e->n_vocab);
    if (!r->gen || !r->sampler) {
        r->st = kvt_errf(r->err, r->errlen, KVT_ERR_NOMEM, "out of memory");
        return false;
    }
    if (!kvt_file_watch_ok(e->watch)) { /* W3: a queued row admitted after the change */
        r->st = kvt_engine_stale(e, r->err, r->errlen);
        return false;
    }
    r->t0 = kvt_now_ms();
    r->root = kvt_root_hash(e->compat, req->ns ? req->ns : "");
    r->use_cache = e->pc && !req->no_cache;
    /* [ckpt] before the lookup: an identical request with a checkpoint resumes from it. Lookup and
     * prefill then cover prompt ++ already-emitted tokens (pp[0..pn)); the sampler history still
     * starts from the prompt (the emitted tokens are accepted again as they are replayed). The
     * record is read here, on the submitting thread, never on the scheduler's token loop. */
    /* a logits processor or bias is not part of the checkpoint key: such requests take none */
    const bool ckpt_ok = r->use_cache && !req->proc.apply && !req->sampling.n_bias;
    kvt_ckpt_begin(&r->ck, ckpt_ok ? e->tier : NULL, e->o.generation_checkpoint, e->ckpt_compat, req, r->max_new,
                   e->n_vocab);
    r->pp = r->ck.resumed ? r->ck.look : req->prompt;
    r->pn = r->ck.resumed ? r->ck.n_look : n;
    kvt_status st;
    if (r->use_cache) {
        /* lookups run on the submitting threads (sched.h): one at a time (the shared tier's fetch
         * connection is single-user), concurrently with the scheduler's steps */
        pthread_mutex_lock(&e->lookup_mu);
        /* the prompt's chain hashes once, shared by both tiers' lookups and block sealing */
        st = kvt_chain_create(r->root, r->pp, r->pn, e->o.block_tokens, &r->chain);
        kvt_tiers_hit hit;
        if (st == KVT_OK) st = kvt_tiers_lookup(e->tier, r->chain, &hit);
        if (st) {
            pthread_mutex_unlock(&e->lookup_mu);
            r->st = st;
            return false;
        }
        r->seq = hit.seq;
        r->reused = hit.n_reused;
        res->restore_ms = hit.restore_ms;
        res->reused_from = hit.from;
        pthread_mutex_unlock(&e->lookup_mu);
        kvt_ckpt_note_reused(&r->ck, e->tier, r->reused); /* [ckpt] how much of a resume was restored */
    }
    if (!r->seq) {
        if ((st = kvt_seq_create(e->pool, r->root, &r->seq))) {
            r->st = st;
            return false;
        }
        r->reused = 0;
        res->reused_from = KVT_TIER_NONE;
    }
    if (r->chain) kvt_seq_set_chain(r->seq, r->chain);
    /* Recurrent layouts: a state restored from the SSD or shared tier at exactly n-1 (the retry
     * snapshot) enters the RAM tier as the prefill's own n-1 snapshot would, so the next identical
     * request (and a pin warmed after a restart) is served from RAM. */
    if (r->use_cache && e->recurrent && !r->ck.resumed && r->reused && r->reused + 1 == r->pn &&
        res->reused_from != KVT_TIER_RAM)
        kvt_engine_cache_put_local(e, r->seq);
    res->n_prompt = n;
    res->n_reused = KVT_MIN(r->reused, n); /* a resume also reuses emitted tokens: not prompt tokens */

    /* admission: the whole request must fit in the pool once cache-only blocks are evicted; it
     * holds at most its reservation (kvt_engine_row_reserve), reused blocks included */
    {
        const double need = (double)r->reserve;
        uint64_t budget = kvt_block_pool_budget(e->pool);
        if (budget && need > (double)budget) {
            char a[24], b[24];
            r->st = kvt_errf(r->err, r->errlen, KVT_ERR_POOL_EXHAUSTED,
                             "out of KV memory: the request needs %s of KV but the pool holds %s",
                             kvt_fmt_bytes(need, a, sizeof a), kvt_fmt_bytes((double)budget, b, sizeof b));
            return false;
        }
    }
    r->begun = true;
    /* speculative decoding: the row's draft state, and a target sequence a round can cut back by its
     * draft tokens (invariant 8); out of memory for it, the row decodes plainly */
    if (e->spec) {
        /* [ckpt] a resume looks up prompt ++ emitted ++ pending: the draft's state saved with it */
        r->sp = kvt_spec_row_create(e->spec, &req->sampling, req->prompt, n, r->max_new, r->use_cache, req->ns, r->pp,
                                    r->pn, r->reused);
        if (r->sp) kvt_seq_set_rollback(r->seq, kvt_spec_draft_max(e->spec));
    }

    /* 3. prefill setup */
    kvt_sampler_reset(r->sampler, &req->sampling);
    for (uint32_t i = n > 64 ? n - 64 : 0; i < n; i++) kvt_sampler_accept(r->sampler, req->prompt[i]);
    if (r->ck.resumed) kvt_sampler_set_rng_state(r->sampler, r->ck.rec.rng); /* [ckpt] RNG after the pending draw */
    r->tp0 = kvt_now_ms();
    /* Sliding-window layouts: blocks leave the live window as the sequence grows; registering the
     * sealed blocks after every chunk keeps them reusable from the cache. Chunks are capped at the
     * window so no block can be sealed and dropped within one chunk. */
    r->keep_window = r->use_cache && e->min_window > 0;
    /* Rows beside other rows: the sealed prompt blocks enter the RAM tier after every chunk, so a
     * request arriving meanwhile with the same prefix reuses them (docs/batching.md). Recurrent
     * layouts need a state snapshot to reuse anything, which only whole-prompt puts make. */
    r->share_prefix = r->use_cache && e->parallel > 1 && !e->recurrent;
    r->chunk = r->pn - r->reused;
    if (r->keep_window) r->chunk = KVT_MIN(KVT_MIN(e->o.ubatch, e->min_window), r->chunk);
    if (e->progress) r->chunk = KVT_MIN(e->o.ubatch, r->chunk); /* same chunks the model makes, reported one by one */
    kvt_engine_report(e, KVT_PROGRESS_PREFILL, 0, r->pn - r->reused);
    /* Recurrent layouts: a state snapshot every `every` tokens (whole blocks), so an edit at token
     * p can reuse up to the last snapshot <= p; the prefill stops at those positions. */
    const uint32_t bt = e->o.block_tokens;
    r->every = r->use_cache && e->recurrent && e->o.recurrent_snapshot_every ? (e->o.recurrent_snapshot_every + bt - 1) / bt * bt : 0;
    /* Recurrent layouts: a snapshot at n-1 too (the last prompt token then forwards as its own
     * step), so an identical retry or a regenerated answer reuses n-1 tokens, in RAM and on SSD:
     * the one at n, taken below, is past the lookup's n-1 cap. Only when tokens before n-1 are
     * left to compute (else a snapshot at n-1 already served this row). */
    r->snap_at = r->use_cache && e->recurrent && !r->ck.resumed && r->pn > r->reused + 1 ? r->pn - 1 : 0;
    r->done_tok = r->reused;
    return true;
}

void kvt_row_begin(kvt_row *r) { kvt_row_set_state(r, begin(r) ? KVT_ROW_PREFILL : KVT_ROW_DONE); }

uint32_t kvt_row_plan(kvt_row *r, uint32_t budget, const int32_t **tokens) {
    if (r->state != KVT_ROW_PREFILL && r->state != KVT_ROW_DECODE) return 0;
    if (row_cancelled(r)) {
        r->res->finish = KVT_FINISH_CANCELLED;
        if (r->state == KVT_ROW_PREFILL) kvt_engine_report(r->e, KVT_PROGRESS_PREFILL, r->pn - r->reused, r->pn - r->reused);
        kvt_row_set_state(r, KVT_ROW_DONE);
        return 0;
    }
    if (r->state == KVT_ROW_DECODE) {
        if (!budget) return 0;
        /* a speculative round: k drafts and the target's own token may all be emitted, so
         * k <= max_new - n_gen - 1 (n_gen < max_new in DECODE): the sequence never outgrows a plain
         * decode's, nor the context */
        r->n_verify = r->sp ? kvt_spec_propose(r->sp, KVT_MIN(budget - 1, r->max_new - r->n_gen - 1),
                                               kvt_sampler_rng_state(r->sampler), tokens)
                            : 0;
        if (r->n_verify) return 1 + r->n_verify;
        *tokens = &r->next;
        return 1;
    }
    uint32_t m = KVT_MIN(KVT_MIN(r->chunk, r->pn - r->done_tok), budget);
    if (r->every) m = KVT_MIN(m, (r->done_tok / r->every + 1) * r->every - r->done_tok);
    if (r->snap_at > r->done_tok) m = KVT_MIN(m, r->snap_at - r->done_tok);
    *tokens = r->pp + r->done_tok;
    return m;
}

/* 4. one sampled token: stream its text (stop strings held back until they can no longer match).
 * True when the row forwards it next (r->next), false when the row ends. forced >= 0: a speculative
 * round's verification drew that token from these logits (already masked and penalised), so it is
 * taken instead of a draw. */
static bool sample(kvt_row *r, float *logits, int32_t forced) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    for (;;) { /* more than one iteration only while replaying a checkpoint's emitted tokens */
        int32_t id;
        const kvt_ckpt_src src = kvt_ckpt_next(&r->ck, &id); /* [ckpt] replayed / pending tokens first */
        if (src == KVT_CKPT_SAMPLE) {
            kvt_token_logprobs lp;
            const bool want_lp = req->n_logprobs && req->on_logprobs;
            if (forced >= 0) {
                id = forced;
                if (want_lp) kvt_logprobs_of(logits, e->n_vocab, id, req->n_logprobs - 1, &lp);
            } else {
                /* a constraint masks first; logprobs describe the distribution actually drawn from */
                if (req->proc.apply) req->proc.apply(req->proc.ctx, logits, e->n_vocab);
                id = kvt_sampler_sample_lp(r->sampler, logits, want_lp ? req->n_logprobs - 1 : 0, want_lp ? &lp : NULL);
            }
            if (want_lp) req->on_logprobs(req->cb_ctx, &lp);
        }
        if (req->proc.accept) req->proc.accept(req->proc.ctx, id);
        if (r->n_gen == 0) res->ttft_ms = kvt_now_ms() - r->t0;
        if (!req->ignore_eog && kvt_tokenizer_is_eog(e->tok, id)) {
            res->finish = KVT_FINISH_STOP;
            return false;
        }
        if (kvt_ckpt_due(&r->ck, src, r->n_gen) && kvt_engine_weights_ok(e)) { /* [ckpt] n_gen emitted, id sampled but not yet emitted; W1 */
            if (r->in_verify) /* the target's sequence still holds the round's draft tokens: at its end */
                r->ck_owed = KVT_MAX(r->ck_owed, r->n_gen % r->ck.every ? 2 : 1);
            else
                kvt_ckpt_save(&r->ck, e->tier, r->seq, r->n, r->gen, r->n_gen, id, kvt_sampler_rng_state(r->sampler),
                              r->n_gen % r->ck.every == 0);
        }
        r->gen[r->n_gen++] = id;
        kvt_sampler_accept(r->sampler, id);
        if (r->sp) kvt_spec_row_push(r->sp, id);
        size_t dl = 0;
        const char *d = kvt_detok_push(r->dt, id, &dl);
        bool stop_hit = false;
        if (req->n_stop) {
            kvt_strbuf *tb = &r->tb;
            size_t before = tb->n;
            kvt_strbuf_add(tb, d, dl);
            if (tb->oom) {
                r->st = KVT_ERR_NOMEM;
                return false;
            }
            size_t ml = 0;
            int64_t at = kvt_stop_find(tb, req->stop, req->n_stop, before, &ml);
            size_t upto;
            if (at >= 0) {
                upto = (size_t)at;
                stop_hit = true;
            } else {
                upto = tb->n - kvt_stop_holdback(tb, req->stop, req->n_stop);
            }
            bool keep = true;
            if (upto > r->emitted) {
                if (req->on_token) keep = req->on_token(req->cb_ctx, id, tb->p + r->emitted, upto - r->emitted);
                r->emitted = upto;
            } else if (req->on_token) {
                keep = req->on_token(req->cb_ctx, id, "", 0);
            }
            if (!keep) {
                res->finish = KVT_FINISH_CANCELLED;
                return false;
            }
        } else if (req->on_token && !req->on_token(req->cb_ctx, id, d, dl)) {
            res->finish = KVT_FINISH_CANCELLED;
            return false;
        }
        if (stop_hit) {
            res->finish = KVT_FINISH_STOP;
            return false;
        }
        if (row_cancelled(r)) {
            res->finish = KVT_FINISH_CANCELLED;
            return false;
        }
        if (r->n_gen >= r->max_new) return false;
        if (src == KVT_CKPT_REPLAYED && r->sp && r->ck.replay_i > r->ck.rec.n_emitted) {
            /* [ckpt] a speculating row resumes as the uninterrupted run went on: the pending token
             * is the next one forwarded, in a round (its KV, prefilled, is cut off and recomputed
             * bit-identically by the verify pass; the prefill's logits after it are not used) */
            if (kvt_seq_trim(r->seq, kvt_seq_len(r->seq) - 1) != KVT_OK) {
                r->st = kvt_errf(r->err, r->errlen, KVT_ERR_NOMEM, "checkpoint resume: cannot cut the pending token");
                return false;
            }
            r->next = id;
            return true;
        }
        if (src == KVT_CKPT_REPLAYED) continue; /* [ckpt] its KV was restored or prefilled: no forward */
        r->next = id;
        return true;
    }
}

/* The row either ends (DONE) or forwards the sampled token next (DECODE). */
static void row_sample(kvt_row *r, float *logits) {
    kvt_row_set_state(r, sample(r, logits, -1) ? KVT_ROW_DECODE : KVT_ROW_DONE);
}

/* A speculative round's verify pass came back (k draft tokens after next; logits: k + 1 rows): emit
 * what the target accepts, then cut both sequences back to it (the top of this file). */
static void verify(kvt_row *r, uint32_t k, float *logits) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    const uint32_t nv = e->n_vocab, base = kvt_seq_len(r->seq) - (k + 1);
    const bool greedy = kvt_sampling_greedy(&req->sampling);
    uint32_t j = 0; /* draft tokens accepted */
    bool more = true;
    r->in_verify = true;
    r->ck_owed = 0;
    for (;; j++) {
        float *row = logits + (size_t)j * nv;
        const int32_t d = j < k ? kvt_spec_row_token(r->sp, j) : -1;
        int32_t forced = -1;
        bool acc = false;
        if (d >= 0 && !greedy) { /* speculative rejection sampling: the output is drawn from p exactly */
            if (req->proc.apply) req->proc.apply(req->proc.ctx, row, nv);
            float *p = kvt_spec_row_p(r->sp);
            kvt_sampler_probs(r->sampler, row, p);
            const double u_accept = kvt_sampler_uniform(r->sampler), u_resample = kvt_sampler_uniform(r->sampler);
            forced = kvt_spec_verify(p, kvt_spec_row_q(r->sp, j), nv, d, u_accept, u_resample, &acc);
        }
        more = sample(r, row, forced);
        if (!more || d < 0) break; /* the row ended, or row k: the bonus token after every draft */
        if (greedy) acc = r->next == d;
        if (!acc) break;
    }
    r->in_verify = false;
    kvt_spec_row_verified(r->sp, k, j);
    const kvt_status ts = kvt_seq_trim(r->seq, base + 1 + j); /* invariant 8 */
    if (ts != KVT_OK) {
        kvt_row_set_state(r, KVT_ROW_DONE);
        r->st = kvt_errf(r->err, r->errlen, ts, "speculative decoding: cannot cut the sequence back to its accepted tokens (%s)",
                         kvt_status_str(ts));
        return;
    }
    /* [ckpt] a checkpoint due inside the round, at its boundary: the tokens before the new next
     * emitted, next pending (its KV not computed yet), the RNG the next round starts from; the
     * draft's blocks beside the target's */
    if (r->ck_owed && more && kvt_engine_weights_ok(e)) {
        kvt_ckpt_save(&r->ck, e->tier, r->seq, r->n, r->gen, r->n_gen - 1, r->next, kvt_sampler_rng_state(r->sampler),
                      r->ck_owed == 1);
        kvt_spec_row_checkpoint(r->sp);
    }
    r->ck_owed = 0;
    const uint32_t bt = e->o.block_tokens;
    if (r->keep_window && (base + 1 + j) / bt > base / bt) kvt_engine_put_blocks(e, r->seq);
    kvt_row_set_state(r, more ? KVT_ROW_DECODE : KVT_ROW_DONE);
}

void kvt_row_advance(kvt_row *r, uint32_t m, kvt_status st, float *logits) {
    kvt_engine *e = r->e;
    kvt_gen_result *res = r->res;
    const uint32_t n = r->n, reused = r->reused;
    if ((r->state == KVT_ROW_PREFILL || r->state == KVT_ROW_DECODE) && !kvt_file_watch_ok(e->watch)) { /* W2 */
        if (r->state == KVT_ROW_PREFILL) kvt_engine_report(e, KVT_PROGRESS_PREFILL, r->pn - reused, r->pn - reused);
        kvt_row_set_state(r, KVT_ROW_DONE);
        r->st = kvt_engine_stale(e, r->err, r->errlen);
        return;
    }
    if (r->state == KVT_ROW_PREFILL) {
        if (st == KVT_OK) {
            const uint32_t before = r->done_tok;
            r->done_tok += m;
            if (r->done_tok < r->pn) {
                if (r->keep_window) kvt_engine_put_blocks(e, r->seq);
                else if (r->share_prefix && r->done_tok / e->o.block_tokens > before / e->o.block_tokens)
                    kvt_engine_put_blocks(e, r->seq); /* a block sealed: visible to new rows */
                kvt_engine_report(e, KVT_PROGRESS_PREFILL, r->done_tok - reused, r->pn - reused);
                if (r->every && r->done_tok % r->every == 0) kvt_engine_cache_put(e, r->seq);
                else if (r->done_tok == r->snap_at) kvt_engine_cache_put_local(e, r->seq);
                return;
            }
        }
        kvt_engine_report(e, KVT_PROGRESS_PREFILL, r->pn - reused, r->pn - reused);
        if (st) {
            kvt_row_set_state(r, KVT_ROW_DONE);
            if (st == KVT_ERR_POOL_EXHAUSTED) {
                char a[24];
                r->st = kvt_errf(r->err, r->errlen, st, "out of KV memory during prefill (pool %s in use)",
                                 kvt_fmt_bytes((double)kvt_block_pool_used_bytes(e->pool), a, sizeof a));
            }
            else if (st == KVT_ERR_CANCELLED)
                res->finish = KVT_FINISH_CANCELLED;
            else
                r->st = kvt_errf(r->err, r->errlen, st, "prefill failed: %s", kvt_status_str(st));
            return;
        }
        res->prefill_ms = kvt_now_ms() - r->tp0;
        if (res->prefill_ms > 0) res->prefill_tps = (double)(r->pn - reused) / (res->prefill_ms / 1000.0);
        /* prompt-boundary snapshot: the prompt-only prefix is what the next turn renders identically
         * (always for recurrent layouts: their state cannot be cut back to the prompt later; with
         * prefix sharing too, so the whole prompt is visible to new rows while this one decodes) */
        if (r->use_cache && !r->ck.resumed && n > reused && (n - reused >= e->o.snapshot_min_tokens || e->recurrent || r->share_prefix))
            kvt_engine_cache_put(e, r->seq);
        /* 4. decode (the SSD writer defers while rows decode; see kvt_engine_set_decoding) */
        if (!r->batched) kvt_engine_set_decoding(e, true);
        r->dt = kvt_detok_create(e->tok, r->req->render_special);
        if (!r->dt) {
            kvt_row_set_state(r, KVT_ROW_DONE);
            r->st = KVT_ERR_NOMEM;
            return;
        }
        r->decoding = true;
        r->td0 = kvt_now_ms();
        res->finish = KVT_FINISH_LENGTH;
        row_sample(r, logits);
        return;
    }
    if (r->state != KVT_ROW_DECODE) return;
    const uint32_t k = r->n_verify;
    r->n_verify = 0;
    if (st == KVT_OK && k) {
        verify(r, k, logits);
        return;
    }
    if (st == KVT_OK && r->keep_window && kvt_seq_len(r->seq) % e->o.block_tokens == 0) kvt_engine_put_blocks(e, r->seq);
    if (st) {
        kvt_row_set_state(r, KVT_ROW_DONE);
        if (st == KVT_ERR_CANCELLED)
            res->finish = KVT_FINISH_CANCELLED;
        else
            r->st = kvt_errf(r->err, r->errlen, st, "decode failed: %s", kvt_status_str(st));
        return;
    }
    row_sample(r, logits);
}

void kvt_row_end(kvt_row *r) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    if (r->decoding) {
        /* flush held-back text when finishing for a reason other than a stop string */
        if (r->st == KVT_OK && res->finish != KVT_FINISH_CANCELLED && req->on_token) {
            size_t fl = 0;
            const char *f = kvt_detok_flush(r->dt, &fl);
            if (req->n_stop) {
                if (res->finish != KVT_FINISH_STOP) {
                    kvt_strbuf_add(&r->tb, f, fl);
                    if (r->tb.n > r->emitted) req->on_token(req->cb_ctx, -1, r->tb.p + r->emitted, r->tb.n - r->emitted);
                }
            } else if (fl) {
                req->on_token(req->cb_ctx, -1, f, fl);
            }
        }
        res->decode_ms = kvt_now_ms() - r->td0;
        res->n_gen = r->n_gen;
        if (r->n_gen > 1 && res->decode_ms > 0) res->decode_tps = (double)(r->n_gen - 1) / (res->decode_ms / 1000.0);
        res->tokens = r->gen;
        r->gen = NULL;
        /* [ckpt] normal completion invalidates the checkpoint; cancellation and errors keep it */
        kvt_ckpt_end(&r->ck, e->tier, r->st == KVT_OK && res->finish != KVT_FINISH_CANCELLED);
    }
    kvt_spec_row_free(r->sp, r->decoding ? res->decode_ms : 0);
    r->sp = NULL;
    if (r->begun) {
        if (!r->batched) kvt_engine_set_decoding(e, false);
        /* 5. what was computed stays cached, also for cancelled requests */
        if (r->seq && r->use_cache && kvt_seq_len(r->seq) > 0) kvt_engine_cache_put(e, r->seq);
        res->peak_kv_bytes = kvt_block_pool_peak_bytes(e->pool);
        pthread_mutex_lock(&e->stats_mu);
        e->requests++;
        e->prompt_tokens += r->n;
        e->generated_tokens += res->n_gen;
        e->cached_tokens += res->n_reused;
        pthread_mutex_unlock(&e->stats_mu);
    }
    if (r->seq) kvt_seq_free(r->seq);
    r->seq = NULL;
    kvt_chain_release(r->chain);
    r->chain = NULL;
    kvt_ckpt_run_free(&r->ck); /* [ckpt] */
    kvt_detok_free(r->dt);
    r->dt = NULL;
    kvt_sampler_free(r->sampler);
    r->sampler = NULL;
    kvt_strbuf_free(&r->tb);
    free(r->gen);
    r->gen = NULL;
}
