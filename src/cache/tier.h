/*
 * tier.h — the tier manager: the policy that ties the RAM tier (prompt_cache) and the SSD tier
 * (ssd_cache) together as one system, so the engine does not wire them by hand.
 *
 * What it owns today:
 *   - lookup: one plan per request over both tiers, along the request's chain (computed once by
 *     the caller): RAM's leading blocks shared, only the blocks RAM lacks restored from SSD, each
 *     block's source named in the hit, counters counted once per executed plan;
 *   - memory pressure: the pool's pressure callback evicts from RAM (spilling into the SSD tier)
 *     and then sheds SSD records that only the SSD tier still holds. The pressure path never waits
 *     for the disk ("free at once", docs/tiers.md): an allocation fails with the typed error only
 *     when nothing is evictable;
 *   - the durability boundary: flush. With write-behind on it is the SSD tier's flush; with
 *     write-behind off it first hands every block and snapshot the RAM tier holds to the SSD tier,
 *     so a durable answer means "what the tiers hold is on disk".
 *
 * Ownership / lifetime: kvt_tiers borrows the pool, the RAM tier and the SSD tier (ssd may be NULL);
 * all must outlive it. Create installs the pool pressure callback and the RAM tier's spill sinks;
 * free removes them. Thread-safe (it has no state of its own beyond the borrowed handles).
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include "prompt_cache.h"
#include "ssd_cache.h"

typedef struct kvt_tiers kvt_tiers;

typedef struct kvt_tiers_opts {
    kvt_block_pool *pool;  /* required */
    kvt_prompt_cache *ram; /* required */
    kvt_ssd *ssd;          /* NULL: RAM only */
    bool writeback;        /* the SSD tier persists blocks as they fill (--ssd-writeback) */
} kvt_tiers_opts;

/* NULL on out of memory. */
kvt_tiers *kvt_tiers_create(const kvt_tiers_opts *o);
void kvt_tiers_free(kvt_tiers *t); /* NULL is a no-op */

/* The pool pressure callback (kvt_pressure_fn, ctx = kvt_tiers*). True if any pool bytes were freed. */
bool kvt_tiers_pressure_cb(void *ctx, uint64_t bytes_needed);

/* Where a block of a lookup's plan comes from. Live rows (--parallel > 1, docs/batching.md)
 * register each block in the RAM tier as it seals, so a block another live row holds is served as
 * a RAM block: shared by reference with that row, never copied. */
typedef enum kvt_tiers_source { KVT_TIERS_NONE = 0, KVT_TIERS_RAM = 1, KVT_TIERS_SSD = 2 } kvt_tiers_source;

/* The plan a lookup executed: blocks [0, ram_blocks) are shared from the RAM tier, blocks
 * [ram_blocks, n_blocks) were read from the SSD tier; for recurrent layouts the state comes from
 * the tier named by state_from. */
typedef struct kvt_tiers_hit {
    kvt_seq *seq;            /* new sequence of n_reused tokens (caller owns), or NULL on a miss */
    uint32_t n_reused;
    kvt_tiers_source from;   /* SSD when the SSD tier supplied anything, else RAM (NONE: miss) */
    uint32_t n_blocks;       /* ceil(n_reused / block_tokens) */
    uint32_t ram_blocks;
    uint32_t ssd_blocks;
    kvt_tiers_source state_from; /* recurrent layouts: where the snapshot at n_reused came from */
    uint64_t ssd_files_read;     /* files the SSD restore read (blocks and snapshot) */
    uint64_t ssd_bytes_read;     /* payload bytes the SSD restore read from disk */
    double restore_ms;       /* time spent restoring from the SSD tier (0 if it was not used) */
} kvt_tiers_hit;
/* Source of block i of a hit's plan (NONE past n_blocks). */
kvt_tiers_source kvt_tiers_block_source(const kvt_tiers_hit *h, uint32_t i);

/* One lookup over both tiers for the request's chain (its hashes are computed once, by the caller,
 * and used by both tiers): peeks the RAM tier and the SSD index (no side effects) and executes one
 * plan. The SSD tier is planned on top of the leading full blocks RAM holds, so when it serves a
 * longer prefix it reads only the blocks (and snapshot) RAM lacks: RAM's blocks [0, k) are shared
 * and the SSD restore starts at block k. When the SSD tier adds nothing, RAM alone serves (ties go
 * to RAM). Counters are counted once per executed plan: a RAM take that is thrown away (the SSD
 * restore failed and RAM serves its own plan instead) is never a hit. An SSD restore that fails or
 * comes back no longer than RAM's prefix falls back to the RAM take. Errors: pool/allocation. */
kvt_status kvt_tiers_lookup(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out);

/* Registers a finished (or prompt-boundary) sequence in the RAM tier (kvt_prompt_cache_put) and,
 * with write-behind on, hands its sealed blocks and — for layouts with recurrent layers — a
 * snapshot at its end to the SSD tier, so boundary snapshots are persisted like blocks. Never waits
 * for the disk. */
kvt_status kvt_tiers_put(kvt_tiers *t, kvt_seq *seq);
/* The same for a growing sliding-window sequence's sealed full blocks (kvt_prompt_cache_put_blocks):
 * window blocks registered during prefill/decode enter write-behind too. */
kvt_status kvt_tiers_put_blocks(kvt_tiers *t, kvt_seq *seq);

/* Durability boundary (see kvt_ssd_flush). Without an SSD tier: durable, nothing written. */
void kvt_tiers_flush(kvt_tiers *t, uint32_t timeout_ms, kvt_ssd_flush_result *out);

#endif
