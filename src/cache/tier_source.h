/*
 * tier_source.h — where a reused block came from: the one enum, shared by the tier manager
 * (tier.h: a lookup's hit) and the engine's public result (engine.h: kvt_gen_result.reused_from).
 * Also the listing of cached prefixes (the RAM tier's, for the admin table), which the engine's
 * public API passes through. Its own header so that API does not pull in the cache's headers.
 */
#ifndef KVT_TIER_SOURCE_H
#define KVT_TIER_SOURCE_H

#include <stdint.h>

/* Live rows (--parallel > 1, docs/batching.md) register each block in the RAM tier as it seals, so
 * a block another live row holds is served as a RAM block: shared by reference, never copied. */
typedef enum kvt_tier { KVT_TIER_NONE = 0, KVT_TIER_RAM = 1, KVT_TIER_SSD = 2, KVT_TIER_SHARED = 3 } kvt_tier;

#define KVT_PREFIX_HEAD 32 /* leading tokens a listed prefix carries (a preview for the operator) */
/* One cached prefix: a leaf of the index (no cached unit extends it), with the path above it. */
typedef struct kvt_cached_prefix {
    uint32_t tokens;                /* its length */
    uint32_t units;                 /* units on the path (blocks, tail, snapshot) */
    uint64_t bytes;                 /* bytes of those units (blocks shared with other prefixes included) */
    uint64_t root;                  /* root hash: compatibility key + namespace */
    double idle_s;                  /* since the leaf was last taken or put */
    uint32_t n_head;                /* tokens in head */
    int32_t head[KVT_PREFIX_HEAD];  /* the prefix's first tokens */
} kvt_cached_prefix;

#endif
