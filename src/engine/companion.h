/*
 * companion.h — the draft's own tier set: speculative decoding's companion state (issue 29,
 * docs/speculative.md "The draft's state in the tiers").
 *
 * A draft model keeps KV of its own layout for the same tokens as the target. Those blocks are
 * cached, demoted, persisted and fetched like the target's, by the same code: a second tier manager
 * (tier.h) over the draft's block pool, with its own RAM tier, its own SSD compat directory (in the
 * same --ssd-cache root) and its own shared-tier key space. Its compatibility key names the target
 * and the draft together (kvt_spec_companion_key): a block of it is named by (target compat key,
 * draft identity, tokens) through the chain hash, so a server with another draft, or without one,
 * never reads it, and the target's own tiers are untouched by the draft (target-only reuse works
 * across configurations).
 *
 * Policy is the tier manager's, unchanged: the RAM tier's LRU and the draft pool's pressure callback
 * (spilling into the companion SSD tier), write-behind, idle demotion, the durability boundary, the
 * shared tier's publish queue. The engine drives the two tier managers together (flush, drain,
 * tick, busy): a flush is durable only when both are.
 *
 * Ownership / lifetime: kvt_companion owns its RAM tier, SSD tier, shared tier and tier manager; it
 * borrows the draft's layout and pool (kvt_spec owns them: free the companion first). Create after
 * the draft (kvt_spec_create), free after the last row ended (the scheduler stopped) and before
 * kvt_spec_free. kvt_companion_tiers's pointer is valid until kvt_companion_free. Thread-safety is
 * the tier manager's (tier.h).
 */
#ifndef KVT_COMPANION_H
#define KVT_COMPANION_H

#include "../cache/tier.h"

typedef struct kvt_companion kvt_companion;

typedef struct kvt_companion_opts {
    const char *key;             /* the companion compatibility key (kvt_spec_companion_key); required */
    const kvt_kv_layout *layout; /* the draft's layout and block pool (kvt_spec_layout / kvt_spec_pool) */
    kvt_block_pool *pool;
    uint64_t ram_bytes;          /* the companion RAM tier's cap (> 0) */
    /* the SSD tier's settings (the target's --ssd-cache root, the draft's share of the cap, the
     * queue bound); the compat key is replaced by key. NULL: RAM only */
    const kvt_ssd_opts *ssd;
    bool writeback;              /* --ssd-writeback, as for the target */
    double demote_idle_s;        /* idle demotion, as for the target */
    /* the target's shared-tier settings (URL, TLS, timeout); layout, pool and key are replaced by
     * the draft's. NULL: no shared tier. */
    const kvt_shared_opts *shared;
    bool (*admit)(void *ctx);    /* the tier manager's admit gate (both model files unchanged) */
    void *admit_ctx;
} kvt_companion_opts;

/* Opens the companion tiers. Errors from the SSD tier (directory) or the shared tier (URL, TLS) and
 * KVT_ERR_NOMEM, with a message naming the draft's state. */
kvt_status kvt_companion_create(const kvt_companion_opts *o, kvt_companion **out, char *err, size_t errlen);
/* Publishes what is queued for the shared tier (bounded), writes what write-behind still owes
 * (bounded: kvt_tiers_flush), then frees everything. NULL is a no-op. */
void kvt_companion_free(kvt_companion *c);
kvt_tiers *kvt_companion_tiers(kvt_companion *c);
/* Waits (up to timeout_ms) until the draft's shared-tier publishes are done (kvt_shared_flush).
 * True when nothing is left, also without a shared tier or with c NULL. */
bool kvt_companion_shared_flush(kvt_companion *c, uint32_t timeout_ms);

typedef struct kvt_companion_stats {
    uint64_t ram_entries, ram_bytes; /* the companion RAM tier */
    uint64_t ssd_entries, ssd_bytes; /* the companion SSD directory (0 without an SSD tier) */
    uint64_t ssd_pending_blocks;     /* write-behind records still owed to the disk */
} kvt_companion_stats;
void kvt_companion_stats_get(kvt_companion *c, kvt_companion_stats *out); /* c NULL: all 0 */

/* Merges the companion's flush result into the target's: durable only when both are, counts added,
 * the reason names the draft's state when it is the one owing records. */
void kvt_companion_merge_flush(kvt_tiers_flush_result *target, const kvt_tiers_flush_result *draft);

#endif
