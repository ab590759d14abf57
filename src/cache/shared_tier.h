/*
 * shared_tier.h — the shared block tier: sealed KV blocks (full blocks and frozen tails) and, for
 * hybrid recurrent layouts, recurrent-state snapshots in Redis
 * (or Valkey / Redis Cluster, same protocol), shared by every kvtier server of one model, so a
 * prefix computed on one replica is reused by all. Format, faults and scale-out: docs/shared-tier.md.
 *
 * Keys and values: key = "kvtier:v1:" + compat dir (32 hex of SHA-256(compat key)) + ":b:<group>:"
 * + chain hash (16 hex) for a full block, or ":t:<group>:" + parent chain hash for a frozen tail
 * (one tail per position, the first published wins), or ":s:" + chain hash of the tokens a
 * snapshot covers (kvt_shared_snapshot_key). Keys are built only from hashes; the value is
 * the block's record (record.h, kvt_record_encode: header + payload checksums, compat key; the
 * bytes of its SSD cache file), verified with kvt_record_decode and compared token by token with
 * the prompt before use. What a lookup may use is planned by plan.h (the RAM and SSD tiers' one
 * planner: the n-1 cap, the window rule, the snapshot rule). Commands are
 * sent argv-style with binary-safe lengths; nothing of a request is ever a command argument except
 * the hashed key.
 *
 * TLS: rediss:// connections go through tls_bridge.h (verified OpenSSL session behind a socketpair
 * that hiredis uses as its socket), so the timeouts, breaker and counters below are the same.
 *
 * Faults: every Redis call is bounded (connect and socket timeouts = the remaining per-request
 * budget `timeout_ms`); failures feed a circuit breaker with exponential back-off (one for the
 * fetch path, one for the publisher); a corrupt or foreign value is counted, deleted and treated as
 * a miss. The engine then simply computes what the shared tier did not give.
 *
 * Ownership / threading: kvt_shared borrows the layout and the pool (both must outlive it; taken
 * from kvt_shared_opts or from an SSD tier's record model, kvt_ssd_record_fmt), copies the compat
 * key, and owns two Redis connections: the fetch connection, used only by the
 * caller of kvt_shared_extend (the engine's generate path, serialised by the engine), and the
 * publisher's, used only by its background thread. The publish queue retains each queued block
 * until it is sent or dropped; it is bounded in blocks and bytes (a full queue drops, counted).
 * stats/publish/set_busy/flush are thread-safe.
 */
#ifndef KVT_SHARED_TIER_H
#define KVT_SHARED_TIER_H

#include "../kv/kv.h"
#include "../util/breaker.h"
#include "record.h"
#include "ssd_cache.h"

typedef struct kvt_shared kvt_shared;

/* ---- URL ---- */
typedef struct kvt_shared_url {
    bool tls;           /* rediss:// */
    char user[128];     /* ACL user ("" = default user) */
    char password[256]; /* "" = no AUTH */
    char host[256];
    uint16_t port;      /* default 6379 */
    uint32_t db;        /* SELECT index, default 0 */
} kvt_shared_url;
/* Parses redis://[[user]:password@]host[:port][/db] and rediss://…; user and password may be
 * percent-encoded; an IPv6 host is written [addr]. KVT_ERR_INVALID_ARG with a message on anything
 * else (other schemes, empty host, bad port or db, query strings, control characters, overlong). */
kvt_status kvt_shared_url_parse(const char *url, kvt_shared_url *out, char *err, size_t errlen);

/* ---- lifecycle ---- */
typedef struct kvt_shared_opts {
    const char *url;
    /* The model, when no SSD tier is given to kvt_shared_create (borrowed: layout and pool must
     * outlive the tier; the compat key string is copied) */
    const kvt_kv_layout *layout;
    kvt_block_pool *pool;
    const char *compat_key;
    uint32_t timeout_ms;       /* per-request budget for the shared lookup, connect included; default 1000 */
    uint64_t queue_max_bytes;  /* publish queue bound in record bytes; default 256 MiB */
    uint32_t queue_max_blocks; /* publish queue bound in blocks; default 1024 */
    uint32_t pipeline;         /* commands per pipelined round trip; default 16 */
    /* rediss:// only (tls_bridge.h); the strings are borrowed for the duration of create */
    const char *tls_ca_file;   /* CA bundle for the server certificate; NULL = system store */
    const char *tls_cert_file; /* client certificate (mutual TLS), or NULL */
    const char *tls_key_file;  /* its key (NULL = inside tls_cert_file) */
    bool tls_insecure;         /* no certificate / host name verification (explicit opt-in) */
} kvt_shared_opts;
void kvt_shared_opts_default(kvt_shared_opts *o);

/* ssd: NULL, or an SSD tier whose model (layout, pool, compat key) the shared tier then uses
 * instead of o->layout / o->pool / o->compat_key (the SSD tier is not used otherwise).
 * Validates the URL, loads the TLS settings (rediss://), tries one connection (a failure only
 * warns: the tier retries later through its breaker) and starts the publisher. Errors: INVALID_ARG
 * (URL, TLS options without rediss://), IO (a CA / client certificate / key that cannot be loaded),
 * UNSUPPORTED (layout), NOMEM. */
kvt_status kvt_shared_create(const kvt_shared_opts *o, kvt_ssd *ssd, kvt_shared **out, char *err, size_t errlen);
/* Stops the publisher after its current batch; queued blocks are released unpublished (logged:
 * call kvt_shared_flush_wait first to publish them). */
void kvt_shared_free(kvt_shared *sh);

/* ---- fetch ---- */
/* Extends *seq with blocks fetched from Redis for the request's prompt = chain's tokens
 * (kvt_chain_tokens, n = kvt_chain_len; chain borrowed for the call). The chain is the one the
 * engine built for the request's local lookups: the full blocks' chain hashes (the keys) are read
 * from it, never hashed again. *seq: root = the chain's root, length a multiple of block_tokens
 * (= the chain's) and < n, holding prompt[0..len) (its last block's chain hash must equal the
 * chain's there; anything else is a miss). Fetches what follows: every group's full blocks by
 * chain hash up to the first position that misses a FULL group's, then each group's tail there.
 * Each block is verified and its tokens compared with the prompt. Then plan.h's planner decides
 * the usable length (capped at n-1; WINDOW groups need only their window's blocks; recurrent
 * layouts only at a fetched end whose snapshot verifies, each candidate fetched in turn). Stops
 * fetching at a miss, error, corrupt value, pool exhaustion or when the budget is spent; what was
 * fetched before still counts. When the plan is longer than len, *seq is REPLACED by a new
 * sequence (same pool and root: the old blocks, the fetched ones, for recurrent layouts the state;
 * fetched blocks are sealed and shared like restored ones) and the old one freed; otherwise *seq
 * is untouched. Returns the tokens added (0 = nothing). Never fails the request. */
uint32_t kvt_shared_extend(kvt_shared *sh, kvt_seq **seq, const kvt_chain *chain);

/* ---- publish ---- */
/* Queues every sealed block of seq (group 0..; frozen tails included, an unfrozen tail skipped)
 * that this server has not published or fetched already and, for recurrent layouts whose last
 * block is sealed, a snapshot of the state at seq's length. Never blocks on the network. Returns
 * the number of items queued. */
uint32_t kvt_shared_publish_seq(kvt_shared *sh, kvt_seq *seq);
/* The engine marks its decode loop busy: the publisher defers (bounded: 300 ms per item, or a
 * waiting flush) so publishing does not compete with the token loop. */
void kvt_shared_set_busy(kvt_shared *sh, bool busy);
/* What a flush found: empty = nothing queued or in flight any more; pending_* = what still is;
 * lost = publishes given up during the wait (connection failure, breaker open, Redis refused:
 * OOM or another error reply); error = why (the latest connection failure), "" when all went. */
typedef struct kvt_shared_flush_result {
    bool empty;
    uint64_t pending_blocks, pending_bytes;
    uint64_t lost;
    double elapsed_ms;
    char error[200];
} kvt_shared_flush_result;
/* Waits up to timeout_ms until the publish queue is empty (the busy deferral ends while it waits).
 * A NULL tier is empty. */
void kvt_shared_flush_wait(kvt_shared *sh, uint32_t timeout_ms, kvt_shared_flush_result *out);
/* kvt_shared_flush_wait(...).empty */
bool kvt_shared_flush(kvt_shared *sh, uint32_t timeout_ms);

/* ---- stats ---- */
typedef struct kvt_shared_stats {
    uint64_t lookups, hits;                 /* extend calls that asked Redis; those that appended */
    uint64_t fetched_blocks, fetched_bytes, fetched_tokens;
    uint64_t fetched_snapshots;             /* recurrent layouts: snapshots fetched and used */
    uint64_t published_blocks, published_bytes; /* bytes include snapshots */
    uint64_t published_snapshots;
    uint64_t publish_existing;              /* SET NX found the key (another server was first) */
    uint64_t dropped;                       /* queue full, breaker open, or failed batch */
    uint64_t errors;                        /* connection / timeout / protocol errors */
    uint64_t oom_errors;                    /* Redis refused a SET: maxmemory reached (OOM) */
    uint64_t corrupt;                       /* values that failed verification (deleted), oversized
                                               ones included */
    uint64_t oversized;                     /* values longer than any record of this model, refused
                                               before they were read (GETRANGE, bounded reader) */
    uint64_t skipped;                       /* lookups skipped because the breaker was open */
    uint64_t queue_blocks, queue_bytes;
    kvt_breaker_state fetch_breaker, publish_breaker;
    uint64_t breaker_opens;                 /* both breakers */
    double fetch_ms_last;
    char last_error[200];                   /* the latest connect failure of either connection
                                               ("" after a success): TLS verification, AUTH, … */
} kvt_shared_stats;
void kvt_shared_stats_get(kvt_shared *sh, kvt_shared_stats *out);

/* Key of a full block (tail = false, hash = its chain) or of the tail at a position (tail = true,
 * hash = the parent chain) for the given compat key; out needs KVT_SHARED_KEY_MAX bytes. */
#define KVT_SHARED_KEY_MAX 96
void kvt_shared_key(const char *compat_key, bool tail, uint32_t group, uint64_t hash, char out[KVT_SHARED_KEY_MAX]);
/* Key of the recurrent-state snapshot whose tokens have chain hash `chain` ("…:s:<chain>"). */
void kvt_shared_snapshot_key(const char *compat_key, uint64_t chain, char out[KVT_SHARED_KEY_MAX]);

#endif
