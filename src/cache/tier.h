/*
 * tier.h — the tier manager: the one owner of cache policy. The engine reaches the RAM tier
 * (prompt_cache), the SSD tier (ssd_cache), the generation-checkpoint store (ssd_ckpt) and the
 * shared tier (shared_tier) only through it; it creates those backends, then hands them here.
 *
 * What it owns:
 *   - lookup: one plan per request along the request's chain (computed once by the caller), in the
 *     order RAM -> SSD -> shared: RAM's leading blocks shared, only the blocks RAM lacks restored
 *     from SSD, then blocks no local tier had fetched from the shared tier (and put into RAM/SSD
 *     through the one put path). Each block's source is named in the hit; counters are counted once
 *     per executed plan;
 *   - put: the one path by which a sequence enters the tiers (RAM, write-behind, shared publish);
 *   - the write-behind switch (--ssd-writeback): checked here and nowhere else;
 *   - memory pressure: the pool's pressure callback evicts from RAM (spilling into the SSD tier)
 *     and then stages the SSD records that alone hold their blocks (file image to the heap, block
 *     released; written later). The pressure path never waits for the disk ("free at once",
 *     docs/tiers.md): an allocation fails with the typed error only when nothing is evictable;
 *   - the idle demotion clock (kvt_tiers_tick), which also ends expired pins;
 *   - pinned prefixes: the pin list (RAM-tier pins, ram_index.c R8), its budget and its file in the
 *     SSD tier's compat directory (pin_file.h), read back at create for the engine to warm;
 *   - generation checkpoints' persistence (kvt_tiers_checkpoint_*): the prefix's blocks and state
 *     into the SSD tier, the record into the checkpoint store;
 *   - the durability boundary: flush, one result for blocks, snapshots and checkpoint records.
 *
 * Ownership / lifetime: kvt_tiers borrows the pool and every backend (ssd, ckpt, shared may be
 * NULL); all must outlive it. Create installs the pool pressure callback and the RAM tier's spill
 * sinks; free removes them. Thread-safe: lookups are serialized by the caller (the shared tier's
 * fetch connection is single-user); put, flush and the checkpoint calls may run on any thread;
 * kvt_tiers_tick runs on one thread at a time.
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <pthread.h>

#include "pin_file.h"
#include "prompt_cache.h"
#include "shared_tier.h"
#include "ssd_cache.h"
#include "ssd_ckpt.h"
#include "tier_source.h"

typedef struct kvt_tiers kvt_tiers;

typedef struct kvt_tiers_opts {
    kvt_block_pool *pool;    /* required */
    kvt_prompt_cache *ram;   /* required */
    kvt_ssd *ssd;            /* NULL: RAM only */
    kvt_ckpt_store *ckpt;    /* generation checkpoint records (needs ssd); NULL: off */
    kvt_shared *shared;      /* shared tier, looked up after the local ones; NULL: off */
    bool writeback;          /* the SSD tier persists blocks as they fill (--ssd-writeback) */
    double demote_idle_s;    /* kvt_tiers_tick demotes RAM entries idle this long; <= 0: off */
    /* Gate on everything entering a tier (put, a lookup's fetched blocks): false drops it (the
     * engine's W1: the model file changed). NULL: always admit. */
    bool (*admit)(void *ctx);
    void *admit_ctx;
    uint64_t pin_budget;     /* bytes the pinned prefixes may hold in RAM together */
} kvt_tiers_opts;

/* NULL on out of memory or a missing required handle. */
kvt_tiers *kvt_tiers_create(const kvt_tiers_opts *o);
void kvt_tiers_free(kvt_tiers *t); /* NULL is a no-op */

/* The pool pressure callback (kvt_pressure_fn, ctx = kvt_tiers*). True if any pool bytes were freed. */
bool kvt_tiers_pressure_cb(void *ctx, uint64_t bytes_needed);
/* Pressure callbacks so far, the bytes they freed, and those that found nothing to free (the
 * allocation then failed with KVT_ERR_POOL_EXHAUSTED). t may be NULL (all 0). */
void kvt_tiers_pressure_stats(const kvt_tiers *t, uint64_t *events, uint64_t *freed_bytes, uint64_t *failed);


/* The plan a lookup executed: blocks [0, ram_blocks) are shared from the RAM tier, the next
 * ssd_blocks were read from the SSD tier, the next shared_blocks fetched from the shared tier; for
 * recurrent layouts the state comes from the tier named by state_from. */
typedef struct kvt_tiers_hit {
    kvt_seq *seq;            /* new sequence of n_reused tokens (caller owns), or NULL on a miss */
    uint32_t n_reused;
    kvt_tier from;           /* the last tier that supplied anything (NONE: miss) */
    uint32_t n_blocks;       /* ceil(n_reused / block_tokens) */
    uint32_t ram_blocks;
    uint32_t ssd_blocks;
    uint32_t shared_blocks;
    kvt_tier state_from;     /* recurrent layouts: where the snapshot at n_reused came from */
    uint64_t ssd_files_read; /* files the SSD restore read (blocks and snapshot) */
    uint64_t ssd_bytes_read; /* payload bytes the SSD restore read from disk */
    double restore_ms;       /* time spent restoring from the SSD and shared tiers (0 if unused) */
} kvt_tiers_hit;
/* Source of block i of a hit's plan (NONE past n_blocks). */
kvt_tier kvt_tiers_block_source(const kvt_tiers_hit *h, uint32_t i);

/* One lookup for the request's chain (its hashes are computed once, by the caller, and used by
 * every tier). Local part: peeks the RAM tier and the SSD index (no side effects) and executes one
 * plan. The SSD tier is planned on top of the leading full blocks RAM holds, so when it serves a
 * longer prefix it reads only the blocks (and snapshot) RAM lacks: RAM's blocks [0, k) are shared
 * and the SSD restore starts at block k. When the SSD tier adds nothing, RAM alone serves (ties go
 * to RAM). Counters are counted once per executed plan: a RAM take that is thrown away (the SSD
 * restore failed and RAM serves its own plan instead) is never a hit. An SSD restore that fails or
 * comes back no longer than RAM's prefix falls back to the RAM take. Shared part: when the local
 * prefix ends on a block boundary, the shared tier extends it (kvt_shared_extend), and what it
 * fetched is put into RAM and write-behind (admit permitting). Errors: pool/allocation. */
kvt_status kvt_tiers_lookup(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out);

/* Registers a finished (or prompt-boundary) sequence in the RAM tier (kvt_prompt_cache_put) and,
 * with write-behind on, hands its sealed blocks and — for layouts with recurrent layers — a
 * snapshot at its end to the SSD tier, so boundary snapshots are persisted like blocks; then queues
 * its sealed blocks for the shared tier's publisher. Never waits for the disk or the network.
 * NULL t or a refused admit: KVT_OK, nothing happens. */
kvt_status kvt_tiers_put(kvt_tiers *t, kvt_seq *seq);
/* The same for a growing sliding-window sequence's sealed full blocks (kvt_prompt_cache_put_blocks):
 * window blocks registered during prefill/decode enter write-behind too (not the shared tier). */
kvt_status kvt_tiers_put_blocks(kvt_tiers *t, kvt_seq *seq);
/* kvt_tiers_put for the RAM and SSD tiers only: the state snapshot a recurrent prefill takes at n-1
 * (identical retries). The shared tier keys one tail per position and sets it once, so the n-1
 * tail published first would keep the prompt's whole tail (and its boundary snapshot) out of it. */
kvt_status kvt_tiers_put_local(kvt_tiers *t, kvt_seq *seq);

/* The engine's decode loop is busy: the SSD writer and the shared publisher defer. */
void kvt_tiers_set_busy(kvt_tiers *t, bool busy);

/* At most once a second: unpins pins whose ttl ran out, and (idle demotion) moves RAM entries idle
 * longer than demote_idle_s to the SSD tier (counted as the SSD tier's demotions). Demotion runs
 * only while `quiet` can be taken at once (the engine passes the mutex its steps hold: a busy
 * engine skips), and not without an SSD tier or with demotion off. */
void kvt_tiers_tick(kvt_tiers *t, pthread_mutex_t *quiet);

/* ---- generation checkpoints (docs/tiers.md, "Generation checkpoints") ---- */
bool kvt_tiers_checkpoints(const kvt_tiers *t); /* a checkpoint store is attached */
/* Loads the record of key (kvt_ckpt_store_load). False: none usable. */
bool kvt_tiers_checkpoint_get(kvt_tiers *t, const uint8_t key[32], uint32_t n_prompt, uint32_t n_vocab, uint32_t max_new,
                              kvt_ckpt_rec *out);
/* Persists a checkpoint: the sealed blocks of seq (the prompt + emitted prefix) go to the SSD tier
 * (write-behind, or written at once with write-behind off), for recurrent layouts with a snapshot of
 * the state at seq's end (the tail is frozen for it), then the record is queued (*watch follows it,
 * kvt_ckpt_store_save). False: the record was dropped. */
bool kvt_tiers_checkpoint_put(kvt_tiers *t, kvt_seq *seq, const kvt_ckpt_rec *rec, kvt_ckpt_watch **watch);
/* Removes key's record (a completed generation). */
void kvt_tiers_checkpoint_drop(kvt_tiers *t, const uint8_t key[32]);
/* Checkpoint counters kept by the store. */
typedef enum kvt_tiers_ckpt_event {
    KVT_TIERS_CKPT_RESUMED,       /* a request resumed from a record */
    KVT_TIERS_CKPT_RETRY,         /* a record saved off the regular points (a retry) */
    KVT_TIERS_CKPT_RESUME_REUSED, /* n tokens of a resume the tiers supplied */
} kvt_tiers_ckpt_event;
void kvt_tiers_checkpoint_note(kvt_tiers *t, kvt_tiers_ckpt_event ev, uint32_t n);

/* ---- pinned prefixes (docs/tiers.md, "Pinned prefixes") ---- */
typedef struct kvt_tiers_pin_info {
    uint64_t id;              /* kvt_pin_id(root, tokens) */
    uint32_t n_tokens;        /* the pinned prompt */
    uint32_t tokens_in_ram;   /* the prefix its pinned RAM units cover (0: not warm yet) */
    uint64_t bytes;           /* bytes of those units */
    int64_t created, expires; /* unix seconds; expires 0 = no ttl */
    bool warm;                /* pinned in RAM (false: loaded from the pin list, still being warmed) */
} kvt_tiers_pin_info;
/* Pins the chain's prompt (it must be in RAM: the engine computes it first through the put path):
 * kvt_prompt_cache_pin, then (SSD tier on) hands the pinned blocks and snapshots to the SSD tier and
 * rewrites the pin list file. A pin of the same id replaces the older one (a new created time and
 * ttl); created 0 = now (the warm-up passes the pin list's). ns is kept for the restart's warm-up. Errors: KVT_ERR_UNSUPPORTED
 * without the RAM tier's pins, KVT_ERR_NOT_FOUND (nothing of it in RAM), KVT_ERR_RANGE (over the pin
 * budget; out->bytes says what it needed), KVT_ERR_NOMEM; a pin list that cannot be written is
 * logged (the pin holds in RAM, the next change retries the file). */
kvt_status kvt_tiers_pin(kvt_tiers *t, const kvt_chain *c, const char *ns, int64_t created, int64_t expires,
                         kvt_tiers_pin_info *out);
/* Unpins (and rewrites the pin list). KVT_ERR_NOT_FOUND: no pin of that id. */
kvt_status kvt_tiers_unpin(kvt_tiers *t, uint64_t id);
/* The pins now (*out malloc'd, caller frees; *n may be 0). */
kvt_status kvt_tiers_pins(kvt_tiers *t, kvt_tiers_pin_info **out, uint32_t *n);
/* The pins read from the pin list at create that are not warm yet (copies; kvt_pin_recs_free). */
kvt_status kvt_tiers_pins_cold(kvt_tiers *t, kvt_pin_rec **out, uint32_t *n);
uint64_t kvt_tiers_pin_budget(const kvt_tiers *t);

/* ---- durability ---- */
typedef struct kvt_tiers_flush_result {
    bool durable;                /* nothing below (blocks, snapshots, checkpoint records) is owed */
    kvt_ssd_flush_result blocks; /* the SSD tier's records: blocks and snapshots (kvt_ssd_flush) */
    bool checkpoints_durable;    /* every queued checkpoint record was written (true without a store) */
    uint64_t shared_pending;     /* the shared tier's publishes still queued (not part of durable) */
    uint64_t demoted;            /* kvt_tiers_drain: RAM-tier blocks and snapshots moved to the SSD tier */
    char reason[160];            /* why not durable (empty when durable) */
} kvt_tiers_flush_result;
/* Durability boundary (see kvt_ssd_flush). With write-behind off it first hands every block and
 * snapshot the RAM tier holds to the SSD tier. Then waits for the checkpoint records. Without an SSD
 * tier (or t NULL): durable, nothing written. */
void kvt_tiers_flush(kvt_tiers *t, uint32_t timeout_ms, kvt_tiers_flush_result *out);
/* Drain (POST /admin/drain): demotes every RAM-tier entry to the SSD tier now (spilled like an idle
 * demotion, counted as demotions; pinned entries stay in RAM and are handed to the SSD tier too),
 * then flushes (kvt_tiers_flush's boundary and result; out->demoted counts what left RAM).
 * KVT_ERR_UNSUPPORTED (nothing done) without an SSD tier. */
kvt_status kvt_tiers_drain(kvt_tiers *t, uint32_t timeout_ms, kvt_tiers_flush_result *out);

/* The longest prefixes the RAM tier holds, longest first (kvt_prompt_cache_prefixes). */
uint32_t kvt_tiers_prefixes(kvt_tiers *t, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes);

#endif
