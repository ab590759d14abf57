/*
 * prompt_cache.h — the RAM tier: a byte-capped, LRU, leaf-first cache of sealed KV blocks (and
 * frozen tails and recurrent snapshots) indexed by chain hash, serving longest-usable-prefix reuse.
 *
 * take() builds a new sequence that shares cached blocks (refcount) and copies at most one partial
 * block; the cached donor is never modified or consumed. put() registers a finished (or
 * prompt-boundary) sequence's blocks; identical blocks dedup by construction.
 *
 * Ownership: the cache holds one reference to every block/snapshot it indexes; the pool must outlive
 * the cache. Thread-safe (one internal mutex); take/put may be called from any thread. The spill
 * callback is called with the cache lock NOT held, with a block reference that the callee must
 * retain if it keeps the block beyond the call.
 */
#ifndef KVT_PROMPT_CACHE_H
#define KVT_PROMPT_CACHE_H

#include "../kv/kv.h"
#include "tier_source.h"

typedef struct kvt_prompt_cache kvt_prompt_cache;

typedef enum kvt_reuse_reason {
    KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE = 0, /* a longer match existed but a layer cannot be cut there */
    KVT_REUSE_IMPOSSIBLE_NAMESPACE = 1,   /* tokens matched only under another namespace */
    KVT_REUSE_IMPOSSIBLE_BUDGET = 2,      /* entry not stored / evicted for the byte cap */
    KVT_REUSE_IMPOSSIBLE_N = 3,
} kvt_reuse_reason;

typedef struct kvt_prompt_cache_stats {
    uint64_t entries;       /* distinct registered prefixes (leaves: tails, snapshots, last blocks) */
    uint64_t blocks;        /* blocks held (each counted once) */
    uint64_t bytes;         /* payload bytes held (shared blocks once) */
    uint64_t max_bytes;
    uint64_t hits, misses;
    uint64_t reused_tokens;
    uint64_t evictions;
    uint64_t spills;
    uint64_t reuse_impossible[KVT_REUSE_IMPOSSIBLE_N];
} kvt_prompt_cache_stats;

/* Spill sink (cold tier). Called for every block/snapshot leaving RAM by eviction or demotion,
 * before it is released. Returns true if the cold tier accepted it. */
typedef bool (*kvt_spill_block_fn)(void *ctx, kvt_block *b);
typedef bool (*kvt_spill_snapshot_fn)(void *ctx, kvt_snapshot *s);

kvt_prompt_cache *kvt_prompt_cache_create(kvt_block_pool *pool, uint64_t max_bytes);
void kvt_prompt_cache_free(kvt_prompt_cache *pc);
void kvt_prompt_cache_set_spill(kvt_prompt_cache *pc, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx);

/* Register the sequence's blocks, frozen tail and (if it has recurrent layers) a snapshot at its
 * end. Freezes the sequence's tail (see kvt_seq_freeze_tail). */
kvt_status kvt_prompt_cache_put(kvt_prompt_cache *pc, kvt_seq *seq);
/* Register only the sequence's sealed full blocks (no tail freeze, no snapshot, no supersession
 * effects on the sequence). The engine calls it while a sliding-window sequence grows, so blocks
 * that leave the live window stay reusable from the cache ("reuse survives a wrap"). */
kvt_status kvt_prompt_cache_put_blocks(kvt_prompt_cache *pc, kvt_seq *seq);
/* Evict cache-only data (LRU, leaf-first, spilling first) until at least `bytes` were freed from the
 * pool or nothing evictable remains. Returns bytes freed. Used as the pool pressure callback. */
uint64_t kvt_prompt_cache_evict_bytes(kvt_prompt_cache *pc, uint64_t bytes);
/* Spill entries idle for >= seconds to the cold tier and drop them from RAM. No-op (returns 0)
 * without a spill sink. Returns the number of blocks demoted. */
uint64_t kvt_prompt_cache_demote_idle(kvt_prompt_cache *pc, double seconds);
/* Drop everything (pins included) without spilling. */
void kvt_prompt_cache_clear(kvt_prompt_cache *pc);
void kvt_prompt_cache_stats_get(kvt_prompt_cache *pc, kvt_prompt_cache_stats *out);

/* ---- additions (add-only) ---- */
/* Adapter with the kvt_pressure_fn signature: pass it with the cache as ctx to
 * kvt_block_pool_set_pressure. Returns true if it freed any pool bytes. The pool calls it outside its
 * lock; the cache never allocates pool blocks while holding its own lock, so this cannot deadlock. */
bool kvt_prompt_cache_pressure_cb(void *ctx, uint64_t bytes_needed);
/* Calls fb for every block and fs for every snapshot the cache holds (each block once per unit),
 * with the cache lock NOT held: references are taken under the lock, the callbacks run after it
 * and the references are released afterwards (the callee retains what it keeps). Returns the
 * number of objects visited, or -1 when out of memory (nothing visited). Used by a flush with
 * write-behind off to write what the RAM tier holds. */
int64_t kvt_prompt_cache_visit(kvt_prompt_cache *pc, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx);
/* ---- lookup (the tier manager's; the request's chain hashes are computed once) ---- */
/* The chain's root and tokens are the prompt; its block size must be the cache's. The usable prefix
 * is the longest one capped at n-1 (kvt_plan_usable_prefix, plan.h); a take builds a new sequence
 * that shares cached blocks (refcount) and copies at most one partial block. */
typedef struct kvt_prompt_cache_peek_info {
    uint32_t usable;      /* the length take_plan would return (0 = miss) */
    uint32_t full_blocks; /* leading full blocks of the prompt held in every FULL group, at most
                             (n-1)/block_tokens: what a mixed RAM+SSD plan may take from RAM */
} kvt_prompt_cache_peek_info;
/* One plan of this tier for one lookup (the tier manager plans each tier once per lookup and
 * carries the plan into the take). The plan borrows c (it must outlive the plan) and stays usable
 * across calls: a take re-plans only when the index lost a unit since (eviction, supersession).
 * kvt_prompt_cache_plan_create: no side effects (no counters, no recency); info (may be NULL) gets what it
 * found. Errors: allocation. */
typedef struct kvt_prompt_cache_plan kvt_prompt_cache_plan;
kvt_status kvt_prompt_cache_plan_create(kvt_prompt_cache *pc, const kvt_chain *c, kvt_prompt_cache_plan **out,
                                 kvt_prompt_cache_peek_info *info);
void kvt_prompt_cache_plan_free(kvt_prompt_cache_plan *p); /* NULL is a no-op */
/* Plans built by this process (tests check one plan per lookup). */
uint64_t kvt_prompt_cache_plan_calls(void);
/* Executes the plan: the usable prefix as a new sequence (counts a hit or a miss). */
kvt_status kvt_prompt_cache_take_plan(kvt_prompt_cache *pc, kvt_prompt_cache_plan *p, kvt_seq **out, uint32_t *n_reused);
/* From plan p: a new sequence of the chain's first k' <= k full blocks (k'*block_tokens tokens, shared by
 * reference; no snapshot), for a plan of final length final_len whose later blocks come from
 * another tier: each block carries the groups final_len needs (FULL groups; WINDOW groups inside
 * their window, kvt_plan_need_mask), and k' stops before the first block the cache cannot supply
 * that way (evicted since the peek, or a needed WINDOW block dropped); k' = 0 gives an empty
 * sequence. Bumps recency but counts nothing: the caller counts the take with
 * kvt_prompt_cache_count_take once the whole plan succeeded, so a take that is thrown away is
 * never a hit. */
kvt_status kvt_prompt_cache_take_blocks(kvt_prompt_cache *pc, kvt_prompt_cache_plan *p, uint32_t k, uint32_t final_len,
                                        kvt_seq **out);
/* Counts one take of `tokens` tokens served by this tier (0: a miss). */
void kvt_prompt_cache_count_take(kvt_prompt_cache *pc, uint32_t tokens);

/* ---- listing (the admin table of the largest cached prefixes) ---- */
/* Writes the `max` longest cached prefixes into out, longest first, and returns how many it wrote;
 * *n_prefixes (may be NULL) gets how many the cache holds. O(units x depth) under the lock. */
uint32_t kvt_prompt_cache_prefixes(kvt_prompt_cache *pc, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes);

/* ---- pins (ram_index.c R8): a pinned prefix is never evicted, demoted or superseded ---- */
typedef struct kvt_prompt_cache_pin_info {
    uint32_t tokens;       /* the prefix the pinned units cover (full blocks + the longest tail) */
    uint64_t bytes;        /* bytes of the pin's units */
    uint64_t new_bytes;    /* of which no other pin held yet (what the pin adds to pinned_bytes) */
    uint64_t pinned_bytes; /* pinned bytes after the call (before it when refused) */
    uint64_t budget;       /* the pin budget */
} kvt_prompt_cache_pin_info;
/* The most bytes pinned units may hold together (default 0: every pin is refused). */
void kvt_prompt_cache_set_pin_budget(kvt_prompt_cache *pc, uint64_t bytes);
/* Pins the units that hold the chain's prompt now: the full blocks along the chain, the longest
 * frozen tail continuing it and (recurrent layouts) the snapshots inside it. *handle names the pin
 * for kvt_prompt_cache_unpin; pins may overlap (a unit stays pinned while any pin names it).
 * info (may be NULL) says what it covers. Errors: KVT_ERR_NOT_FOUND (the tier holds none of it),
 * KVT_ERR_RANGE (the pinned bytes would exceed the budget; nothing pinned), KVT_ERR_NOMEM. */
kvt_status kvt_prompt_cache_pin(kvt_prompt_cache *pc, const kvt_chain *c, uint64_t *handle, kvt_prompt_cache_pin_info *info);
/* Drops a pin; its units become evictable again unless another pin names them. False: no such pin. */
bool kvt_prompt_cache_unpin(kvt_prompt_cache *pc, uint64_t handle);
/* Calls fb / fs for every block and snapshot of one pin (as kvt_prompt_cache_visit: references
 * taken under the lock, callbacks after it). Returns the objects visited (0: no such pin), -1 when
 * out of memory. */
int64_t kvt_prompt_cache_pin_visit(kvt_prompt_cache *pc, uint64_t handle, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs,
                                   void *ctx);
uint64_t kvt_prompt_cache_pinned_bytes(kvt_prompt_cache *pc);

/* Every checkable invariant of the index (ram_index.c R1-R4, R8) holds (tests). */
bool kvt_prompt_cache_check(kvt_prompt_cache *pc);

/* Replace the monotonic clock used for idle stamps (demote_idle); NULL restores kvt_now_ns. Tests. */
void kvt_prompt_cache_set_clock(kvt_prompt_cache *pc, uint64_t (*now_ns)(void *ctx), void *ctx);

#endif
