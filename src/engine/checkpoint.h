/*
 * checkpoint.h — generation checkpoints for the engine's token loop (--generation-checkpoint N,
 * docs/server.md "Generation checkpoints"; issue 10 item 4).
 *
 * Every N emitted tokens the loop records (write-behind, never waiting for the disk) the emitted
 * prefix's sealed KV blocks in the SSD tier and a checkpoint record (src/cache/ssd_ckpt.h) under
 * the request key. A later identical request (after kill -9 and restart, or after the client went
 * away) finds the record, restores/prefills the KV of prompt + emitted tokens through the ordinary
 * tier lookup, replays the emitted tokens through the ordinary emission path (detokenizer, stop
 * strings, callback) without computing them, then continues with the pending token and the saved
 * RNG state. Because prefill and decode give identical bits (docs/architecture.md, "Batch
 * invariance") and the sampler's history is rebuilt by the same accepts, the whole response is
 * byte-identical to an uninterrupted run.
 *
 * Request key = SHA-256 over: the compat key (model, KV scheme, block size, numerics), the
 * namespace, the rendered prompt ids, every sampling field (temperature, top_k, top_p, min_p,
 * penalties and their window, seed), the effective max_tokens, ignore_eog and the stop strings.
 * Any change starts normally. Normal completion (length, stop) invalidates the record; client
 * cancellation and errors keep it.
 *
 * Ownership: kvt_ckpt_run is a per-request value on the generating thread's stack; begin fills it,
 * kvt_ckpt_run_free releases what it owns. The store is borrowed.
 */
#ifndef KVT_CHECKPOINT_H
#define KVT_CHECKPOINT_H

#include "../cache/ssd_cache.h"
#include "../cache/ssd_ckpt.h"
#include "engine.h"

typedef enum kvt_ckpt_src {
    KVT_CKPT_SAMPLE = 0,   /* not from the checkpoint: sample it */
    KVT_CKPT_REPLAYED = 1, /* an already-emitted token: emit it again, its KV exists (no forward) */
    KVT_CKPT_PENDING = 2,  /* the checkpoint's pending token: emit and forward it as if just sampled */
} kvt_ckpt_src;

typedef struct kvt_ckpt_run {
    bool on;             /* this request is checkpointed (store present, caching on) */
    uint32_t every;
    uint8_t key[32];
    bool resumed;
    kvt_ckpt_rec rec;    /* the loaded checkpoint (resumed only) */
    int32_t *look;       /* prompt ++ emitted: what the lookup and prefill see (resumed only) */
    uint32_t n_look;
    uint32_t replay_i;
    bool pending_done;
    bool saved;          /* a record was queued by this request */
} kvt_ckpt_run;

/* The request key digest (see above). */
void kvt_ckpt_request_key(const char *compat, const kvt_gen_request *req, uint32_t max_new, uint8_t out[32]);

/* Before the lookup: computes the key and, if a usable checkpoint exists, loads it (resumed).
 * store NULL or every 0: checkpointing off (r->on false). */
void kvt_ckpt_begin(kvt_ckpt_run *r, kvt_ckpt_store *store, uint32_t every, const char *compat, const kvt_gen_request *req,
                    uint32_t max_new, uint32_t n_vocab);
/* Where the next token comes from; fills *id unless KVT_CKPT_SAMPLE. */
kvt_ckpt_src kvt_ckpt_next(kvt_ckpt_run *r, int32_t *id);
/* After sampling `pending` (not an end-of-generation token) with n_gen tokens emitted: is a
 * checkpoint due here? */
static inline bool kvt_ckpt_due(const kvt_ckpt_run *r, kvt_ckpt_src src, uint32_t n_gen) {
    return r->on && src == KVT_CKPT_SAMPLE && n_gen > 0 && n_gen % r->every == 0;
}
/* Records a checkpoint: the sealed blocks of seq (the prompt + emitted prefix) go to the SSD tier
 * (write-behind; with writeback off they are persisted anyway), then the record is queued. Never
 * waits for the disk. */
void kvt_ckpt_save(kvt_ckpt_run *r, kvt_ckpt_store *store, kvt_ssd *ssd, bool writeback, const kvt_seq *seq,
                   uint32_t n_prompt, const int32_t *gen, uint32_t n_gen, int32_t pending, uint64_t rng);
/* At the end of the request: completed (length/stop) invalidates the record; otherwise it stays. */
void kvt_ckpt_end(kvt_ckpt_run *r, kvt_ckpt_store *store, bool completed);
void kvt_ckpt_run_free(kvt_ckpt_run *r);

#endif
