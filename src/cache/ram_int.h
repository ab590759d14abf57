/*
 * ram_int.h — private to the RAM tier (src/cache/ram_index.c, src/cache/prompt_cache.c): the unit
 * forest, the node map and the LRU list (the index, ram_index.c: its states and numbered invariants
 * are at the top of that file), shared with the tier's lookup and put (prompt_cache.c). Everything
 * here is called with the cache's mutex held unless its comment says otherwise.
 */
#ifndef KVT_RAM_INT_H
#define KVT_RAM_INT_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "prompt_cache.h"

enum { U_ROOT = 0, U_NODE = 1, U_TAIL = 2, U_SNAP = 3 };

typedef struct pc_unit pc_unit;
struct pc_unit {
    uint8_t kind;
    pc_unit *parent;                  /* NODE/TAIL/SNAP: parent NODE or ROOT */
    pc_unit *first_child;             /* NODE/ROOT: children (any kind) */
    pc_unit *sib_prev, *sib_next;     /* sibling list (for ROOTs: the cache's root list) */
    uint32_t n_children;
    pc_unit *hnext;                   /* NODE: hash bucket chain */
    pc_unit *lru_prev, *lru_next;     /* non-ROOT: LRU list (next = older) */
    uint64_t key;                     /* NODE: chain hash; ROOT: root hash; TAIL/SNAP: chain at end */
    uint32_t index;                   /* block index where this unit's tokens start */
    uint32_t n_tok;                   /* NODE: block_tokens; TAIL: < block_tokens; SNAP: pos % bt */
    int32_t *tokens;                  /* [n_tok] */
    kvt_block *blocks[KVT_MAX_GROUPS];
    kvt_snapshot *snap;
    uint64_t bytes;                   /* bytes this unit accounts for */
    uint32_t n_blocks;
    uint64_t used_ns;                 /* last take/put (clock of the cache) */
    uint64_t put_gen;                 /* last put that touched it (protects the fresh entry) */
    uint32_t pins;                    /* pin records naming this unit (R8: never detached while > 0) */
};

/* One pin (kvt_prompt_cache_pin): the units holding a pinned prefix, each counted in its pins. */
typedef struct pc_pin {
    uint64_t handle;
    pc_unit **units;
    uint32_t n_units;
    uint32_t tokens; /* the prefix the units cover */
    struct pc_pin *next;
} pc_pin;

struct kvt_prompt_cache {
    kvt_block_pool *pool;
    const kvt_kv_layout *layout;
    uint32_t bt, n_groups;
    uint32_t window[KVT_MAX_GROUPS]; /* 0 = FULL group */
    bool recurrent;
    bool has_window;
    uint32_t full_mask; /* the FULL groups (no window) */
    kvt_plan_geom geom; /* what the shared planner and supersession rule need (plan.h) */
    size_t state_bytes;
    uint64_t max_bytes;

    pthread_mutex_t mu;
    pc_unit **buckets;
    size_t n_buckets, n_nodes;
    pc_unit *roots;
    pc_unit lru; /* sentinel: lru.lru_next = most recent, lru.lru_prev = least recent */
    uint64_t n_units;
    uint64_t bytes, n_blocks;
    uint64_t put_gen;
    uint64_t epoch; /* units detached so far: a plan's unit pointers are valid while it is unchanged */
    kvt_prompt_cache_stats st; /* counters only; sizes are filled in by stats_get */
    pc_pin *pins;          /* pin records (R8) */
    uint64_t next_pin;     /* the next pin handle */
    uint64_t pinned_bytes; /* bytes of the units with pins > 0 */
    uint64_t pin_budget;   /* pinned_bytes may not exceed it (a pin that would is refused) */

    kvt_spill_block_fn spill_block;
    kvt_spill_snapshot_fn spill_snap;
    void *spill_ctx;
    uint64_t (*now_fn)(void *);
    void *now_ctx;
};

/* A growable list of detached units waiting to be disposed outside the lock. */
typedef struct unit_vec {
    pc_unit **v;
    size_t n, cap;
} unit_vec;


typedef struct dispose_result {
    uint64_t spilled, freed_bytes, items;
} dispose_result;

/* Spills (optionally) and releases detached units; called WITHOUT the lock. */
enum { PICK_CAP_CLEAN, PICK_CAP_ANY, PICK_PRESSURE, PICK_IDLE };


/* ---- the index (ram_index.c) ---- */
bool kvt_ram_uv_push(unit_vec *uv, pc_unit *u);
uint64_t kvt_ram_now(kvt_prompt_cache *pc);
void kvt_ram_touch(kvt_prompt_cache *pc, pc_unit *u, uint64_t now);
pc_unit *kvt_ram_map_find(const kvt_prompt_cache *pc, uint64_t key, const pc_unit *parent, const int32_t *toks);
pc_unit *kvt_ram_root_find(const kvt_prompt_cache *pc, uint64_t root);
pc_unit *kvt_ram_root_get(kvt_prompt_cache *pc, uint64_t root);
void kvt_ram_root_drop_if_empty(kvt_prompt_cache *pc, pc_unit *r);
pc_unit *kvt_ram_unit_new(kvt_prompt_cache *pc, uint8_t kind, pc_unit *parent, uint32_t index,
                         const int32_t *toks, uint32_t n_tok, uint64_t key);
void kvt_ram_unit_add_block(kvt_prompt_cache *pc, pc_unit *u, uint32_t g, kvt_block *b);
void kvt_ram_unit_detach(kvt_prompt_cache *pc, pc_unit *u);
void kvt_ram_dispose_units(const unit_vec *uv, uint32_t n_groups, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs,
                          void *ctx, bool spill, dispose_result *res);
/* R5 and R8 in one place: the unit may leave the index (a leaf, and no pin names it). Every detach
 * but kvt_prompt_cache_clear's (which drops the pin records first) picks its unit through it. */
bool kvt_ram_detachable(const pc_unit *u);
pc_unit *kvt_ram_pick_victim(kvt_prompt_cache *pc, int mode, uint64_t gen, uint64_t idle_cutoff);
uint32_t kvt_ram_unit_groups(const kvt_prompt_cache *pc, const pc_unit *u);
pc_unit *kvt_ram_rows_unit(const kvt_prompt_cache *pc, pc_unit *parent, const int32_t *toks, uint32_t m,
                          pc_unit *prefer);
uint32_t kvt_ram_walk_path(const kvt_prompt_cache *pc, pc_unit *R, const kvt_chain *c, pc_unit **P);
uint32_t kvt_ram_walk_path_hashing(const kvt_prompt_cache *pc, pc_unit *R, const int32_t *prompt, uint32_t n, pc_unit **P);
uint32_t kvt_ram_token_match(const kvt_prompt_cache *pc, pc_unit *R, pc_unit *const *P, uint32_t k,
                            const int32_t *prompt, uint32_t n);
/* Every checkable invariant of ram_index.c (R1-R4, R8) holds. Takes the lock. (tests: kvt_prompt_cache_check) */
bool kvt_ram_check(kvt_prompt_cache *pc);

#endif
