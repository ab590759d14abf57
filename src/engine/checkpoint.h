/*
 * checkpoint.h — generation checkpoints for the engine's token loop (--generation-checkpoint N,
 * docs/server.md "Generation checkpoints"; issue 10 item 4).
 *
 * Every N emitted tokens the loop records (write-behind, never waiting for the disk) the emitted
 * prefix's sealed KV blocks in the SSD tier and a checkpoint record (src/cache/ssd_ckpt.h) under
 * the request key. A later identical request (after kill -9 and restart, or after the client went
 * away) finds the record, restores/prefills the KV of prompt ++ emitted ++ pending through the
 * ordinary tier lookup (usable up to prompt ++ emitted: where the checkpoint's state is), replays
 * the emitted tokens and the pending one through the ordinary emission path (detokenizer, stop
 * strings, callback) without computing them, then samples the next token from the prefill's last
 * logits with the saved RNG state. Because prefill and decode give identical bits
 * (docs/architecture.md, "Batch invariance") and the sampler's history is rebuilt by the same
 * accepts, the whole response is byte-identical to an uninterrupted run.
 *
 * Hybrid (recurrent) layouts: the state cannot be recomputed from blocks, so each checkpoint also
 * freezes the partial tail block (when the length is not block-aligned) and queues a state
 * snapshot at prompt ++ emitted for the SSD tier; the planner resumes exactly there (a snapshot
 * position held by a unit ending at it, src/cache/plan.c), so a resume restores the state and
 * computes only the pending token.
 *
 * Checkpoint state machine (per request):
 *
 *   CLEAN --save--> IN_FLIGHT --published--> CLEAN
 *                       |
 *                       +--failed / dropped--> DIRTY(retry_at) --due at retry_at--> IN_FLIGHT
 *
 * Invariants:
 *   C1. At most one record of this request is in flight (its watch); a retry is never saved while
 *       one is in flight.
 *   C2. A failed or dropped record makes the run DIRTY: a fresh record (the current state) is saved
 *       `backoff` tokens after the failure is seen, backoff = 1, 2, 4, ... capped at `every`,
 *       reset by a publish. A regular checkpoint point saves as usual whatever the state.
 *   C3. Nothing here waits: a failure is seen by one atomic load of the watch on the token loop;
 *       the previous published record stays valid until a newer one is published (ssd_ckpt.h).
 *   C4. Retries stop with the request (kvt_ckpt_run_free releases the watch).
 *
 * Request key = SHA-256 over: the compat key (model, KV scheme, block size, numerics), the
 * namespace, the rendered prompt ids, every sampling field (temperature, top_k, top_p, min_p,
 * penalties and their window, seed), the effective max_tokens, ignore_eog and the stop strings.
 * Any change starts normally. Normal completion (length, stop) invalidates the record; client
 * cancellation and errors keep it.
 *
 * Ownership: kvt_ckpt_run is a per-request value on the generating thread's stack; begin fills it,
 * kvt_ckpt_run_free releases what it owns. The tier manager is borrowed: persistence and the
 * record store are reached only through it (kvt_tiers_checkpoint_*).
 */
#ifndef KVT_CHECKPOINT_H
#define KVT_CHECKPOINT_H

#include "../cache/tier.h"
#include "engine.h"

typedef enum kvt_ckpt_src {
    KVT_CKPT_SAMPLE = 0,   /* not from the checkpoint: sample it */
    KVT_CKPT_REPLAYED = 1, /* an emitted or the pending token: emit it, its KV exists (no forward) */
} kvt_ckpt_src;

typedef struct kvt_ckpt_run {
    bool on;             /* this request is checkpointed (a checkpoint store, caching on) */
    uint32_t every;
    uint8_t key[32];
    bool resumed;
    kvt_ckpt_rec rec;    /* the loaded checkpoint (resumed only) */
    int32_t *look;       /* prompt ++ emitted ++ pending: what the lookup and prefill see (resumed only) */
    uint32_t n_look;
    uint32_t replay_i;   /* emitted tokens then the pending one */
    bool saved;          /* a record was queued by this request */
    kvt_ckpt_watch *watch; /* the record in flight (C1), NULL when none */
    bool dirty;          /* the latest record failed or was dropped (C2) */
    uint32_t backoff;    /* tokens before the next retry; 0 after a publish */
    uint32_t retry_at;   /* n_gen at which a dirty run saves again */
} kvt_ckpt_run;

/* The request key digest (see above). */
void kvt_ckpt_request_key(const char *compat, const kvt_gen_request *req, uint32_t max_new, uint8_t out[32]);

/* Before the lookup: computes the key and, if a usable checkpoint exists, loads it (resumed).
 * No checkpoint store in tiers, or every 0: checkpointing off (r->on false). */
void kvt_ckpt_begin(kvt_ckpt_run *r, kvt_tiers *tiers, uint32_t every, const char *compat, const kvt_gen_request *req,
                    uint32_t max_new, uint32_t n_vocab);
/* Where the next token comes from; fills *id unless KVT_CKPT_SAMPLE. */
kvt_ckpt_src kvt_ckpt_next(kvt_ckpt_run *r, int32_t *id);
/* After the lookup: the tokens of prompt ++ emitted the tiers supplied (resumed requests only;
 * stats.resume_reused_tokens). */
void kvt_ckpt_note_reused(const kvt_ckpt_run *r, kvt_tiers *tiers, uint32_t reused);
/* After sampling `pending` (not an end-of-generation token) with n_gen tokens emitted: is a
 * checkpoint due here (a regular point every `every` tokens, or a retry of a failed or dropped
 * record, C2)? Reads the in-flight record's outcome (one atomic load); never waits. */
bool kvt_ckpt_due(kvt_ckpt_run *r, kvt_ckpt_src src, uint32_t n_gen);
/* Records a checkpoint through the tier manager (kvt_tiers_checkpoint_put): the sealed blocks of seq
 * (the prompt + emitted prefix) go to the SSD tier and, for recurrent layouts, the frozen tail and a
 * state snapshot at its length; then the record is queued. Never waits for the disk. seq's tail may
 * be frozen (its next write copies it). regular: a regular point (else counted as a retry, C2).
 * A speculating row saves at the end of a round in which a checkpoint fell due (row.c): n_gen is
 * then the tokens before the round's last one, which is `pending`. */
void kvt_ckpt_save(kvt_ckpt_run *r, kvt_tiers *tiers, kvt_seq *seq, uint32_t n_prompt, const int32_t *gen, uint32_t n_gen,
                   int32_t pending, uint64_t rng, bool regular);
/* At the end of the request: completed (length/stop) invalidates the record; otherwise it stays. */
void kvt_ckpt_end(kvt_ckpt_run *r, kvt_tiers *tiers, bool completed);
void kvt_ckpt_run_free(kvt_ckpt_run *r);

#endif
