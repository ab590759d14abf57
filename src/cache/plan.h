/*
 * plan.h — the one usable-prefix planner and the one supersession rule of the KV tiers.
 *
 * Both the RAM tier (prompt_cache.c) and the SSD tier (ssd_cache.c) index sealed blocks by chain
 * hash. What differs is only how they store them; the rules of what a cached prefix can serve are
 * the same and live here, as pure functions over a small description of what a tier's index holds
 * (callbacks onto the tier's own structure, called under the tier's lock):
 *
 *   usable prefix  the longest length L <= n-1 of a prompt of n tokens that can be rebuilt from the
 *                  index: every FULL group needs every block below L; a WINDOW(w) group needs the
 *                  blocks from kvt_plan_window_lo(L, w) on (what the next query can see); the block
 *                  that ends at L must be supplied, in every group, by one unit whose first tokens
 *                  equal the prompt's; every index needs at least one held block (a sequence learns
 *                  its tokens from its blocks); a layout with recurrent layers can only resume at a
 *                  position where a snapshot of the recurrent state exists (state cannot be cut
 *                  back). The n-1 cap leaves at least one prompt token to compute the logits from.
 *   supersession   a frozen tail T is redundant once a longer unit C at the same position (same
 *                  parent chain, same block index) whose tokens start with T's and that holds every
 *                  group T holds is present: every usable prefix that T could end is then served by
 *                  cutting C (the planner's last unit may be longer than the cut). A pinned T (the
 *                  tier's index reaches something else through it) is kept.
 *
 * No state, no allocation, no locking: thread-safe as long as the callbacks are.
 */
#ifndef KVT_PLAN_H
#define KVT_PLAN_H

#include "../kv/kv.h"

/* The geometry the rules need, taken from a layout. */
typedef struct kvt_plan_geom {
    uint32_t bt;                      /* tokens per block */
    uint32_t n_groups;
    uint32_t window[KVT_MAX_GROUPS];  /* 0: FULL group; else the WINDOW group's window (tokens) */
    bool recurrent;                   /* the layout has recurrent layers (resume at snapshots only) */
} kvt_plan_geom;
void kvt_plan_geom_init(kvt_plan_geom *g, const kvt_kv_layout *l);

/* First block index a WINDOW(w) group needs at final length L (conservative: covers key L-w). */
uint32_t kvt_plan_window_lo(uint32_t L, uint32_t w, uint32_t bt);
/* Groups whose block at index i (below the last block) a sequence of length L needs, out of
 * held_mask (bit g = group g's block is held): FULL groups always, WINDOW groups inside their
 * window. When no group needs it but some group holds it, the lowest held group is kept to carry
 * the index's tokens. 0 = the index cannot be built (nothing held). */
uint32_t kvt_plan_need_mask(const kvt_plan_geom *g, uint32_t L, uint32_t i, uint32_t held_mask);

/* What a tier's index offers for one prompt, as seen by the planner. */
typedef struct kvt_plan_index {
    void *ctx;
    /* Matched full-block path: for block indices [0, k) the index holds a unit whose tokens equal
     * the prompt's block (in at least one group). */
    uint32_t k;
    /* Token match length before the cap: k*bt plus the longest common prefix of a unit at index k
     * (any group) with the prompt's remaining tokens. */
    uint32_t match;
    /* Bitmask of the groups whose block at path index i (< k) is held. */
    uint32_t (*held)(void *ctx, uint32_t i);
    /* A unit at index j (<= k; for j < k on the path or a sibling) whose first m tokens (1..bt)
     * equal the prompt's tokens [j*bt, j*bt+m) and that holds a block in every group; NULL if none.
     * The handle is opaque to the planner and returned in kvt_plan_prefix.last. */
    const void *(*rows)(void *ctx, uint32_t j, uint32_t m);
    /* Recurrent layouts: snapshot positions whose tokens equal the prompt's prefix (any order,
     * duplicates allowed) and an opaque handle for each. */
    const uint32_t *snap_pos;
    const void *const *snap;
    uint32_t n_snaps;
} kvt_plan_index;

typedef struct kvt_plan_prefix {
    uint32_t len;        /* usable tokens, 0 = miss */
    uint32_t match;      /* token match capped at n-1 (len < match: a longer match was unusable) */
    uint32_t n_full;     /* blocks before the last one: ceil(len/bt) - 1 */
    uint32_t last_m;     /* tokens of the last block that the sequence keeps: len - n_full*bt */
    const void *last;    /* rows(n_full, last_m) */
    const void *snap;    /* recurrent: the snapshot handle at len (NULL otherwise) */
} kvt_plan_prefix;

/* The longest usable prefix (see the top of this file) of a prompt of n tokens. Non-recurrent
 * layouts try the capped match first, then block boundaries below it (a shorter cut needs fewer old
 * window blocks); recurrent layouts try the snapshot positions, longest first. */
void kvt_plan_usable_prefix(const kvt_plan_geom *g, const kvt_plan_index *ix, uint32_t n, kvt_plan_prefix *out);

/* One cached unit, as the supersession rule sees it. */
typedef struct kvt_plan_unit {
    uint64_t parent;        /* chain hash of everything before the unit */
    uint32_t index;         /* block index */
    uint32_t n_tokens;      /* tokens in the unit (< bt for a frozen tail) */
    const int32_t *tokens;  /* [n_tokens] */
    uint32_t groups;        /* bitmask of the groups the tier holds the unit in */
    bool tail;              /* a frozen partial tail (only tails are ever superseded) */
    bool pinned;            /* the tier finds something else through this unit: the SSD tier finds
                               a snapshot inside a block through the tail that ends at it (the RAM
                               tier hangs its snapshots off the parent, so it never pins) */
} kvt_plan_unit;
/* True when `older` is redundant because `newer` is held (see the top of this file). */
bool kvt_plan_supersedes(const kvt_plan_unit *older, const kvt_plan_unit *newer);

#endif
