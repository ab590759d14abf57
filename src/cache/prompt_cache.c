/*
 * prompt_cache.c — the RAM tier (see prompt_cache.h and docs/ram-tier.md).
 *
 * Structure
 * ---------
 * The cache is a forest of "units", one tree per root (= compatibility key + namespace):
 *   ROOT  a pseudo-node per root hash; holds nothing, lives while it has children.
 *   NODE  one full block position of a chain: key = chain hash of the tokens up to the block's end.
 *         Holds a copy of the block's tokens and one block reference per group (a WINDOW group's
 *         entry may be NULL when every sequence that registered it had dropped that block).
 *   TAIL  a frozen partial block (n_tok < block_tokens) under its parent NODE/ROOT; one block per
 *         group.
 *   SNAP  a recurrent snapshot at position index*block_tokens + n_tok under its parent NODE/ROOT
 *         (n_tok tokens of the partial block it ends in are copied for verification).
 * NODEs are found through a hash map keyed by chain hash (lookups also compare the parent unit and
 * the tokens, so a 64-bit collision can never alias KV); TAIL/SNAP units are found through their
 * parent's child list. Every non-ROOT unit sits on one LRU list; eviction takes the least recently
 * used *leaf* (a unit without children), so a NODE always outlives its descendants.
 *
 * Locking: one mutex guards everything above. Pool allocations (which may call back into
 * kvt_prompt_cache_evict_bytes through the pool pressure hook), spill callbacks and block releases
 * happen with the mutex released: take() retains what it needs under the lock and builds the
 * sequence afterwards; evictions detach units under the lock and dispose of them afterwards.
 */
#include "prompt_cache.h"

#include "plan.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
};

struct kvt_prompt_cache {
    kvt_block_pool *pool;
    const kvt_kv_layout *layout;
    uint32_t bt, n_groups;
    uint32_t window[KVT_MAX_GROUPS]; /* 0 = FULL group */
    bool recurrent;
    bool has_window;
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
    kvt_prompt_cache_stats st; /* counters only; sizes are filled in by stats_get */

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

static bool uv_push(unit_vec *uv, pc_unit *u) {
    if (uv->n == uv->cap) {
        size_t nc = uv->cap ? uv->cap * 2 : 16;
        pc_unit **nv = realloc(uv->v, nc * sizeof(*nv));
        if (!nv) return false;
        uv->v = nv;
        uv->cap = nc;
    }
    uv->v[uv->n++] = u;
    return true;
}

static uint64_t pc_now(kvt_prompt_cache *pc) { return pc->now_fn ? pc->now_fn(pc->now_ctx) : kvt_now_ns(); }

/* ------------------------------------------------------------------ lists */

static void lru_unlink(pc_unit *u) {
    u->lru_prev->lru_next = u->lru_next;
    u->lru_next->lru_prev = u->lru_prev;
    u->lru_prev = u->lru_next = NULL;
}

static void lru_push_front(kvt_prompt_cache *pc, pc_unit *u) {
    u->lru_next = pc->lru.lru_next;
    u->lru_prev = &pc->lru;
    pc->lru.lru_next->lru_prev = u;
    pc->lru.lru_next = u;
}

/* Most-recently-used bump (logical order + idle stamp). */
static void touch(kvt_prompt_cache *pc, pc_unit *u, uint64_t now) {
    if (u->kind == U_ROOT) return;
    lru_unlink(u);
    lru_push_front(pc, u);
    u->used_ns = now;
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (u->blocks[g]) kvt_block_touch(u->blocks[g]);
}

static void child_link(pc_unit *parent, pc_unit *c) {
    c->parent = parent;
    c->sib_prev = NULL;
    c->sib_next = parent->first_child;
    if (parent->first_child) parent->first_child->sib_prev = c;
    parent->first_child = c;
    parent->n_children++;
}

static void child_unlink(pc_unit *c) {
    pc_unit *p = c->parent;
    if (c->sib_prev) c->sib_prev->sib_next = c->sib_next;
    else p->first_child = c->sib_next;
    if (c->sib_next) c->sib_next->sib_prev = c->sib_prev;
    c->sib_prev = c->sib_next = NULL;
    p->n_children--;
}

/* ------------------------------------------------------------------ node hash map */

static size_t bucket_of(const kvt_prompt_cache *pc, uint64_t key) {
    return (size_t)((key ^ (key >> 29)) & (pc->n_buckets - 1));
}

static bool map_grow(kvt_prompt_cache *pc) {
    size_t nb = pc->n_buckets * 2;
    pc_unit **b = calloc(nb, sizeof(*b));
    if (!b) return false;
    size_t old_n = pc->n_buckets;
    pc_unit **old = pc->buckets;
    pc->buckets = b;
    pc->n_buckets = nb;
    for (size_t i = 0; i < old_n; i++) {
        pc_unit *u = old[i];
        while (u) {
            pc_unit *nx = u->hnext;
            size_t k = bucket_of(pc, u->key);
            u->hnext = b[k];
            b[k] = u;
            u = nx;
        }
    }
    free(old);
    return true;
}

static void map_insert(kvt_prompt_cache *pc, pc_unit *u) {
    if (pc->n_nodes + 1 > pc->n_buckets) (void)map_grow(pc); /* a full map only gets slower */
    size_t k = bucket_of(pc, u->key);
    u->hnext = pc->buckets[k];
    pc->buckets[k] = u;
    pc->n_nodes++;
}

static void map_remove(kvt_prompt_cache *pc, pc_unit *u) {
    pc_unit **pp = &pc->buckets[bucket_of(pc, u->key)];
    while (*pp && *pp != u) pp = &(*pp)->hnext;
    if (*pp) {
        *pp = u->hnext;
        pc->n_nodes--;
    }
    u->hnext = NULL;
}

/* The NODE with this chain hash, parent and tokens, or NULL. */
static pc_unit *map_find(const kvt_prompt_cache *pc, uint64_t key, const pc_unit *parent, const int32_t *toks) {
    for (pc_unit *u = pc->buckets[bucket_of(pc, key)]; u; u = u->hnext)
        if (u->key == key && u->parent == parent && memcmp(u->tokens, toks, (size_t)pc->bt * sizeof(int32_t)) == 0)
            return u;
    return NULL;
}

static pc_unit *root_find(const kvt_prompt_cache *pc, uint64_t root) {
    for (pc_unit *r = pc->roots; r; r = r->sib_next)
        if (r->key == root) return r;
    return NULL;
}

static pc_unit *root_get(kvt_prompt_cache *pc, uint64_t root) {
    pc_unit *r = root_find(pc, root);
    if (r) return r;
    r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->kind = U_ROOT;
    r->key = root;
    r->sib_next = pc->roots;
    if (pc->roots) pc->roots->sib_prev = r;
    pc->roots = r;
    return r;
}

static void root_drop_if_empty(kvt_prompt_cache *pc, pc_unit *r) {
    if (r->kind != U_ROOT || r->n_children) return;
    if (r->sib_prev) r->sib_prev->sib_next = r->sib_next;
    else pc->roots = r->sib_next;
    if (r->sib_next) r->sib_next->sib_prev = r->sib_prev;
    free(r);
}

/* ------------------------------------------------------------------ units */

static pc_unit *unit_new(kvt_prompt_cache *pc, uint8_t kind, pc_unit *parent, uint32_t index,
                         const int32_t *toks, uint32_t n_tok, uint64_t key) {
    pc_unit *u = calloc(1, sizeof(*u));
    if (!u) return NULL;
    if (n_tok) {
        u->tokens = malloc((size_t)n_tok * sizeof(int32_t));
        if (!u->tokens) {
            free(u);
            return NULL;
        }
        memcpy(u->tokens, toks, (size_t)n_tok * sizeof(int32_t));
    }
    u->kind = kind;
    u->index = index;
    u->n_tok = n_tok;
    u->key = key;
    child_link(parent, u);
    lru_push_front(pc, u);
    if (kind == U_NODE) map_insert(pc, u);
    pc->n_units++;
    return u;
}

static void unit_add_block(kvt_prompt_cache *pc, pc_unit *u, uint32_t g, kvt_block *b) {
    kvt_block_retain(b);
    u->blocks[g] = b;
    uint64_t nb = kvt_block_data_bytes(b);
    u->bytes += nb;
    u->n_blocks++;
    pc->bytes += nb;
    pc->n_blocks++;
}

/* Removes a leaf unit from every structure (not its references: see dispose). */
static void unit_detach(kvt_prompt_cache *pc, pc_unit *u) {
    pc_unit *parent = u->parent;
    child_unlink(u);
    lru_unlink(u);
    if (u->kind == U_NODE) map_remove(pc, u);
    pc->bytes -= u->bytes;
    pc->n_blocks -= u->n_blocks;
    pc->n_units--;
    u->parent = NULL;
    root_drop_if_empty(pc, parent);
}

static bool unit_cache_only(const kvt_prompt_cache *pc, const pc_unit *u) {
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (u->blocks[g] && kvt_block_refcount(u->blocks[g]) != 1) return false;
    return true; /* snapshots are not pool memory and never shared with live sequences */
}

typedef struct dispose_result {
    uint64_t spilled, freed_bytes, items;
} dispose_result;

/* Spills (optionally) and releases detached units; called WITHOUT the lock. */
static void dispose_units(const unit_vec *uv, uint32_t n_groups, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs,
                          void *ctx, bool spill, dispose_result *res) {
    for (size_t i = 0; i < uv->n; i++) {
        pc_unit *u = uv->v[i];
        for (uint32_t g = 0; g < n_groups; g++) {
            kvt_block *b = u->blocks[g];
            if (!b) continue;
            if (spill && fb && fb(ctx, b)) res->spilled++;
            if (kvt_block_refcount(b) == 1) res->freed_bytes += kvt_block_data_bytes(b);
            kvt_block_release(b);
            res->items++;
        }
        if (u->snap) {
            if (spill && fs && fs(ctx, u->snap)) res->spilled++;
            kvt_snapshot_release(u->snap);
            res->items++;
        }
        free(u->tokens);
        free(u);
    }
}

/* Eviction candidates: the least recently used leaf satisfying the mode. */
enum { PICK_CAP_CLEAN, PICK_CAP_ANY, PICK_PRESSURE, PICK_IDLE };

static pc_unit *pick_victim(kvt_prompt_cache *pc, int mode, uint64_t gen, uint64_t idle_cutoff) {
    for (pc_unit *u = pc->lru.lru_prev; u != &pc->lru; u = u->lru_prev) {
        if (u->n_children) continue; /* leaf-first */
        switch (mode) {
        case PICK_CAP_CLEAN:
            if (u->put_gen == gen || !unit_cache_only(pc, u)) continue;
            return u;
        case PICK_CAP_ANY:
            if (u->put_gen == gen) continue;
            return u;
        case PICK_PRESSURE:
            if (!unit_cache_only(pc, u)) continue;
            return u;
        case PICK_IDLE:
            if (u->used_ns > idle_cutoff) continue;
            return u;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ lookup */

static uint32_t lcp(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    uint32_t n = KVT_MIN(na, nb), i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static bool unit_has_all_groups(const kvt_prompt_cache *pc, const pc_unit *u) {
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (!u->blocks[g]) return false;
    return true;
}

static uint32_t unit_groups(const kvt_prompt_cache *pc, const pc_unit *u) {
    uint32_t m = 0;
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (u->blocks[g]) m |= 1u << g;
    return m;
}

/* A NODE/TAIL child of `parent` whose first m tokens equal toks[0..m) and that holds a block for
 * every group (it supplies the last, possibly partial, block). `prefer` is tried first. */
static pc_unit *rows_unit(const kvt_prompt_cache *pc, pc_unit *parent, const int32_t *toks, uint32_t m,
                          pc_unit *prefer) {
    if (prefer && prefer->n_tok >= m && unit_has_all_groups(pc, prefer) &&
        memcmp(prefer->tokens, toks, (size_t)m * sizeof(int32_t)) == 0)
        return prefer;
    pc_unit *best = NULL;
    for (pc_unit *c = parent->first_child; c; c = c->sib_next) {
        if ((c->kind != U_NODE && c->kind != U_TAIL) || c->n_tok < m) continue;
        if (!unit_has_all_groups(pc, c) || memcmp(c->tokens, toks, (size_t)m * sizeof(int32_t)) != 0) continue;
        /* prefer an exact-length tail (no copy, no trim), else the shortest covering unit */
        if (!best || (c->n_tok == m && best->n_tok != m) || (best->n_tok != m && c->n_tok < best->n_tok)) best = c;
    }
    return best;
}

/* Walks the prompt's full blocks from R along the request chain (no hashing: the chain holds the
 * hashes); fills P (capacity n/bt) and returns k = matched nodes. */
static uint32_t walk_path(const kvt_prompt_cache *pc, pc_unit *R, const kvt_chain *c, pc_unit **P) {
    const uint32_t bt = pc->bt, nf = kvt_chain_n_full(c);
    const int32_t *prompt = kvt_chain_tokens(c);
    uint32_t k = 0;
    pc_unit *cur = R;
    while (k < nf) {
        const int32_t *t = prompt + (size_t)k * bt;
        pc_unit *node = map_find(pc, kvt_chain_at(c, k + 1), cur, t);
        if (!node) break;
        P[k++] = node;
        cur = node;
    }
    return k;
}

/* The same under another root (namespace diagnostics only: those hashes are not the request's). */
static uint32_t walk_path_hashing(const kvt_prompt_cache *pc, pc_unit *R, const int32_t *prompt, uint32_t n, pc_unit **P) {
    uint32_t bt = pc->bt, k = 0;
    pc_unit *cur = R;
    while ((uint64_t)(k + 1) * bt <= n) {
        const int32_t *t = prompt + (size_t)k * bt;
        uint64_t h = kvt_chain_hash(cur->key, t, bt);
        pc_unit *node = map_find(pc, h, cur, t);
        if (!node) break;
        P[k++] = node;
        cur = node;
    }
    return k;
}

/* Token match length under R (full-block path + best partial child), without usability checks. */
static uint32_t token_match(const kvt_prompt_cache *pc, pc_unit *R, pc_unit *const *P, uint32_t k,
                            const int32_t *prompt, uint32_t n) {
    uint32_t base = k * pc->bt, best = 0;
    pc_unit *cur = k ? P[k - 1] : R;
    for (pc_unit *c = cur->first_child; c; c = c->sib_next) {
        if (c->kind != U_NODE && c->kind != U_TAIL) continue;
        uint32_t l = lcp(c->tokens, c->n_tok, prompt + base, n - base);
        if (l > best) best = l;
    }
    return base + best;
}

typedef struct take_plan {
    uint32_t L;           /* usable length (0 = miss) */
    uint32_t n_full;      /* full path blocks appended before the last unit */
    uint32_t match;       /* token match (for UNTRIMMABLE) */
    uint32_t k;           /* matched full-block path length */
    pc_unit *last_u;      /* unit supplying the block that ends at L */
    pc_unit *snap_u;      /* SNAP unit at L (recurrent layouts) */
} take_plan;

/* The RAM tier's index as the shared planner (plan.h) sees it. */
typedef struct ram_ix {
    const kvt_prompt_cache *pc;
    pc_unit *R;
    pc_unit **P;
    uint32_t k;
    const int32_t *prompt;
} ram_ix;

static uint32_t ram_held(void *ctx, uint32_t i) {
    const ram_ix *x = ctx;
    return unit_groups(x->pc, x->P[i]);
}

static const void *ram_rows(void *ctx, uint32_t j, uint32_t m) {
    const ram_ix *x = ctx;
    pc_unit *parent = j ? x->P[j - 1] : x->R;
    return rows_unit(x->pc, parent, x->prompt + (size_t)j * x->pc->bt, m, j < x->k ? x->P[j] : NULL);
}

/* Under the lock: the longest usable prefix of the chain's prompt (kvt_plan_usable_prefix over this
 * tier's index). P must hold n/bt entries. False only when out of memory. */
static bool plan_take(const kvt_prompt_cache *pc, pc_unit *R, const kvt_chain *c, pc_unit **P, take_plan *pl) {
    memset(pl, 0, sizeof(*pl));
    const uint32_t n = kvt_chain_len(c), bt = pc->bt;
    const int32_t *prompt = kvt_chain_tokens(c);
    if (!R || n < 2) return true;
    uint32_t k = walk_path(pc, R, c, P);
    pl->k = k;
    ram_ix x = {pc, R, P, k, prompt};
    kvt_plan_index ix = {.ctx = &x, .k = k, .match = token_match(pc, R, P, k, prompt, n), .held = ram_held, .rows = ram_rows};
    uint32_t *pos = NULL;
    const void **snaps = NULL;
    if (pc->recurrent) {
        /* snapshot units along the path whose tokens equal the prompt's */
        uint32_t cap = 0, ns = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (uint32_t j = 0; j <= k; j++) {
                pc_unit *parent = j ? P[j - 1] : R;
                for (pc_unit *u = parent->first_child; u; u = u->sib_next) {
                    if (u->kind != U_SNAP || (uint64_t)j * bt + u->n_tok > n) continue;
                    if (u->n_tok && memcmp(u->tokens, prompt + (size_t)j * bt, (size_t)u->n_tok * sizeof(int32_t)) != 0)
                        continue;
                    if (pass == 0) {
                        cap++;
                    } else {
                        pos[ns] = j * bt + u->n_tok;
                        snaps[ns++] = u;
                    }
                }
            }
            if (pass == 0) {
                if (!cap) break;
                pos = malloc(cap * sizeof(*pos));
                snaps = malloc(cap * sizeof(*snaps));
                if (!pos || !snaps) {
                    free(pos);
                    free(snaps);
                    return false;
                }
            }
        }
        ix.snap_pos = pos;
        ix.snap = (const void *const *)snaps;
        ix.n_snaps = ns;
    }
    kvt_plan_prefix pp;
    kvt_plan_usable_prefix(&pc->geom, &ix, n, &pp);
    free(pos);
    free(snaps);
    pl->match = pp.match;
    pl->L = pp.len;
    pl->n_full = pp.n_full;
    pl->last_u = (pc_unit *)pp.last;
    pl->snap_u = (pc_unit *)pp.snap;
    return true;
}

/* ------------------------------------------------------------------ public API */

kvt_prompt_cache *kvt_prompt_cache_create(kvt_block_pool *pool, uint64_t max_bytes) {
    if (!pool) return NULL;
    kvt_prompt_cache *pc = calloc(1, sizeof(*pc));
    if (!pc) return NULL;
    pc->pool = pool;
    pc->layout = kvt_block_pool_layout(pool);
    pc->bt = kvt_kv_layout_block_tokens(pc->layout);
    pc->n_groups = kvt_kv_layout_n_groups(pc->layout);
    for (uint32_t g = 0; g < pc->n_groups && g < KVT_MAX_GROUPS; g++)
        pc->window[g] = kvt_kv_layout_group_kind(pc->layout, g) == KVT_KIND_WINDOW ? kvt_kv_layout_group_window(pc->layout, g) : 0;
    for (uint32_t g = 0; g < pc->n_groups && g < KVT_MAX_GROUPS; g++)
        if (pc->window[g]) pc->has_window = true;
    for (uint32_t l = 0; l < kvt_kv_layout_n_layers(pc->layout); l++)
        if (kvt_kv_layout_layer(pc->layout, l)->kind == KVT_KIND_RECURRENT) pc->recurrent = true;
    pc->state_bytes = kvt_kv_layout_state_bytes(pc->layout);
    kvt_plan_geom_init(&pc->geom, pc->layout);
    pc->max_bytes = max_bytes;
    pc->n_buckets = 64;
    pc->buckets = calloc(pc->n_buckets, sizeof(*pc->buckets));
    if (!pc->buckets || pthread_mutex_init(&pc->mu, NULL) != 0) {
        free(pc->buckets);
        free(pc);
        return NULL;
    }
    pc->lru.lru_next = pc->lru.lru_prev = &pc->lru;
    return pc;
}

/* Detaches every unit (leaves first) into uv. Under the lock. */
static void detach_all(kvt_prompt_cache *pc, unit_vec *uv) {
    for (;;) {
        pc_unit *v = pick_victim(pc, PICK_CAP_ANY, UINT64_MAX, 0);
        if (!v) break;
        unit_detach(pc, v);
        if (!uv_push(uv, v)) {
            /* out of memory for the list: release right here (no spill on clear/free anyway) */
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
        }
    }
}

void kvt_prompt_cache_free(kvt_prompt_cache *pc) {
    if (!pc) return;
    kvt_prompt_cache_clear(pc);
    pthread_mutex_destroy(&pc->mu);
    free(pc->buckets);
    free(pc);
}

void kvt_prompt_cache_set_spill(kvt_prompt_cache *pc, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx) {
    pthread_mutex_lock(&pc->mu);
    pc->spill_block = fb;
    pc->spill_snap = fs;
    pc->spill_ctx = ctx;
    pthread_mutex_unlock(&pc->mu);
}

void kvt_prompt_cache_set_clock(kvt_prompt_cache *pc, uint64_t (*now_ns)(void *ctx), void *ctx) {
    pthread_mutex_lock(&pc->mu);
    pc->now_fn = now_ns;
    pc->now_ctx = ctx;
    pthread_mutex_unlock(&pc->mu);
}

/* Copies the first m token rows of every layer section of src into a fresh block and seals it as a
 * private tail (used when the sequence cannot be trimmed: recurrent layouts). No cache lock held. */
static kvt_status copy_partial(kvt_prompt_cache *pc, kvt_block *src, uint32_t g, uint32_t index, uint64_t parent,
                               const int32_t *toks, uint32_t m, kvt_block **out) {
    kvt_block *b = NULL;
    kvt_status st = kvt_block_alloc(pc->pool, g, index, &b);
    if (st != KVT_OK) return st;
    const uint8_t *s = kvt_block_data(src);
    uint8_t *d = kvt_block_data_mut(b);
    for (uint32_t i = 0; i < kvt_kv_layout_group_n_layers(pc->layout, g); i++) {
        uint32_t layer = kvt_kv_layout_group_layer(pc->layout, g, i);
        uint32_t heads = kvt_kv_layout_layer(pc->layout, layer)->n_kv_heads;
        for (int kv = 0; kv < 2; kv++) {
            /* sections are [kv_head][token]: tokens [0, m) are one byte range per head */
            size_t rb = kvt_kv_layout_row_bytes(pc->layout, layer, index, kv);
            for (uint32_t h = 0; h < heads; h++) {
                size_t off = kvt_kv_layout_row_offset(pc->layout, layer, index, kv, 0, h);
                memcpy(d + off, s + off, rb * m);
            }
        }
    }
    st = kvt_block_seal(b, parent, toks, m, 0);
    if (st != KVT_OK) {
        kvt_block_release(b);
        return st;
    }
    *out = b;
    return KVT_OK;
}

/* Builds the sequence described by a plan from retained blocks. No cache lock held.
 * blocks: (n_full + 1) * n_groups retained references; last_n_tok: tokens of the last unit. */
static kvt_status build_seq(kvt_prompt_cache *pc, uint64_t root, const int32_t *prompt, uint32_t L, uint32_t n_full,
                            kvt_block **blocks, uint32_t last_n_tok, uint64_t last_parent, kvt_snapshot *snap,
                            kvt_seq **out) {
    uint32_t G = pc->n_groups, bt = pc->bt;
    uint32_t m = L - n_full * bt;
    kvt_seq *s = NULL;
    kvt_status st = kvt_seq_create(pc->pool, root, &s);
    if (st != KVT_OK) return st;
    for (uint32_t i = 0; i < n_full && st == KVT_OK; i++) st = kvt_seq_append_blocks(s, blocks + (size_t)i * G);
    kvt_block **lb = blocks + (size_t)n_full * G;
    if (st == KVT_OK) {
        if (last_n_tok == m) {
            st = kvt_seq_append_blocks(s, lb);
        } else if (!pc->recurrent && !pc->has_window) {
            /* share the longer block and cut: the next prepare() copies it (copy-on-write) */
            st = kvt_seq_append_blocks(s, lb);
            if (st == KVT_OK) st = kvt_seq_trim(s, L);
        } else {
            /* recurrent state cannot be cut, and appending the longer block would let the sequence
             * release WINDOW blocks the shorter cut still needs: copy the m rows into a private
             * frozen tail instead (the copy prepare() would have made anyway) */
            kvt_block *nb[KVT_MAX_GROUPS] = {0};
            for (uint32_t g = 0; g < G && st == KVT_OK; g++)
                st = copy_partial(pc, lb[g], g, n_full, last_parent, prompt + (size_t)n_full * bt, m, &nb[g]);
            if (st == KVT_OK) st = kvt_seq_append_blocks(s, nb);
            for (uint32_t g = 0; g < G; g++)
                if (nb[g]) kvt_block_release(nb[g]);
        }
    }
    if (st == KVT_OK && snap) st = kvt_seq_restore_snapshot(s, snap);
    if (st == KVT_OK && kvt_seq_len(s) != L) st = KVT_ERR_CORRUPT;
    if (st != KVT_OK) {
        kvt_seq_free(s);
        return st;
    }
    *out = s;
    return KVT_OK;
}

/* Would another root give a real match (>= one block, or the whole capped prompt)? Under the lock. */
static bool other_namespace_match(const kvt_prompt_cache *pc, uint64_t root, const int32_t *prompt, uint32_t n,
                                  pc_unit **P) {
    uint32_t cap = n - 1, need = KVT_MIN(pc->bt, cap);
    for (pc_unit *r = pc->roots; r; r = r->sib_next) {
        if (r->key == root) continue;
        uint32_t k = walk_path_hashing(pc, r, prompt, n, P);
        if (KVT_MIN(token_match(pc, r, P, k, prompt, n), cap) >= need) return true;
    }
    return false;
}

kvt_status kvt_prompt_cache_take_chain(kvt_prompt_cache *pc, const kvt_chain *c, kvt_seq **out, uint32_t *n_reused) {
    if (!pc || !c || !out || !n_reused || kvt_chain_block_tokens(c) != pc->bt) return KVT_ERR_INVALID_ARG;
    *out = NULL;
    *n_reused = 0;
    const uint32_t G = pc->n_groups, bt = pc->bt, n = kvt_chain_len(c);
    const uint64_t root = kvt_chain_root(c);
    const int32_t *prompt = kvt_chain_tokens(c);
    pc_unit **P = malloc(((size_t)n / bt + 1) * sizeof(*P));
    if (!P) return KVT_ERR_NOMEM;

    pthread_mutex_lock(&pc->mu);
    pc_unit *R = root_find(pc, root);
    take_plan pl;
    if (!plan_take(pc, R, c, P, &pl)) {
        pthread_mutex_unlock(&pc->mu);
        free(P);
        return KVT_ERR_NOMEM;
    }
    if (pl.L < pl.match) pc->st.reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE]++;
    if (pl.L == 0) {
        if (n >= 2 && other_namespace_match(pc, root, prompt, n, P))
            pc->st.reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE]++;
        pc->st.misses++;
        pthread_mutex_unlock(&pc->mu);
        free(P);
        return KVT_OK;
    }
    /* retain what the build needs, bump recency root-first so the leaf ends up most recent */
    uint32_t nb = pl.n_full + 1;
    kvt_block **blocks = calloc((size_t)nb * (G ? G : 1), sizeof(*blocks));
    if (!blocks) {
        pthread_mutex_unlock(&pc->mu);
        free(P);
        return KVT_ERR_NOMEM;
    }
    uint64_t now = pc_now(pc);
    for (uint32_t i = 0; i < pl.n_full; i++) {
        /* a WINDOW block outside the window of L is not needed: leave it out (plan.h) */
        uint32_t need = kvt_plan_need_mask(&pc->geom, pl.L, i, unit_groups(pc, P[i]));
        for (uint32_t g = 0; g < G; g++) {
            kvt_block *b = (need >> g) & 1u ? P[i]->blocks[g] : NULL;
            if (b) kvt_block_retain(b);
            blocks[(size_t)i * G + g] = b;
        }
        touch(pc, P[i], now);
    }
    for (uint32_t g = 0; g < G; g++) {
        blocks[(size_t)pl.n_full * G + g] = pl.last_u->blocks[g];
        kvt_block_retain(pl.last_u->blocks[g]);
    }
    touch(pc, pl.last_u, now);
    uint32_t last_n_tok = pl.last_u->n_tok;
    uint64_t last_parent = pl.n_full ? P[pl.n_full - 1]->key : root;
    kvt_snapshot *snap = NULL;
    if (pl.snap_u) {
        snap = pl.snap_u->snap;
        kvt_snapshot_retain(snap);
        touch(pc, pl.snap_u, now);
    }
    pthread_mutex_unlock(&pc->mu);
    free(P);

    kvt_seq *s = NULL;
    kvt_status st = build_seq(pc, root, prompt, pl.L, pl.n_full, blocks, last_n_tok, last_parent, snap, &s);
    for (size_t i = 0; i < (size_t)nb * G; i++)
        if (blocks[i]) kvt_block_release(blocks[i]);
    free(blocks);
    if (snap) kvt_snapshot_release(snap);

    pthread_mutex_lock(&pc->mu);
    if (st == KVT_OK) {
        pc->st.hits++;
        pc->st.reused_tokens += pl.L;
    } else {
        pc->st.misses++;
    }
    pthread_mutex_unlock(&pc->mu);
    if (st != KVT_OK) return st;
    *out = s;
    *n_reused = pl.L;
    return KVT_OK;
}

void kvt_prompt_cache_peek_chain(kvt_prompt_cache *pc, const kvt_chain *c, kvt_prompt_cache_peek_info *out) {
    memset(out, 0, sizeof(*out));
    if (!pc || !c || kvt_chain_block_tokens(c) != pc->bt) return;
    const uint32_t n = kvt_chain_len(c);
    pc_unit **P = malloc(((size_t)n / pc->bt + 1) * sizeof(*P));
    if (!P) return;
    pthread_mutex_lock(&pc->mu);
    take_plan pl;
    if (plan_take(pc, root_find(pc, kvt_chain_root(c)), c, P, &pl)) {
        out->usable = pl.L;
        /* leading full blocks held in every FULL group, below the n-1 cap (a mixed plan's RAM
         * part; take_blocks checks the WINDOW groups once the final length is known) */
        uint32_t full_mask = 0;
        for (uint32_t g = 0; g < pc->n_groups; g++)
            if (!pc->geom.window[g]) full_mask |= 1u << g;
        uint32_t lim = n ? KVT_MIN(pl.k, (n - 1) / pc->bt) : 0, kb = 0;
        while (kb < lim) {
            uint32_t h = unit_groups(pc, P[kb]);
            if (!h || (h & full_mask) != full_mask) break;
            kb++;
        }
        out->full_blocks = kb;
    }
    pthread_mutex_unlock(&pc->mu);
    free(P);
}

kvt_status kvt_prompt_cache_take_blocks(kvt_prompt_cache *pc, const kvt_chain *c, uint32_t k, uint32_t final_len,
                                        kvt_seq **out) {
    if (!pc || !c || !out || kvt_chain_block_tokens(c) != pc->bt || k > kvt_chain_n_full(c)) return KVT_ERR_INVALID_ARG;
    *out = NULL;
    const uint32_t G = pc->n_groups;
    if (G == 0) return KVT_ERR_INVALID_ARG; /* a recurrent-only layout has no blocks to take */
    if (final_len < k * pc->bt) k = final_len / pc->bt;
    pc_unit **P = malloc(((size_t)k + 1) * sizeof(*P));
    kvt_block **blocks = calloc((size_t)k * G + 1, sizeof(*blocks));
    if (!P || !blocks) {
        free(P);
        free(blocks);
        return KVT_ERR_NOMEM;
    }
    pthread_mutex_lock(&pc->mu);
    pc_unit *R = root_find(pc, kvt_chain_root(c));
    uint32_t got = 0;
    if (R) {
        const int32_t *prompt = kvt_chain_tokens(c);
        pc_unit *cur = R;
        uint64_t now = pc_now(pc);
        while (got < k) {
            pc_unit *node = map_find(pc, kvt_chain_at(c, got + 1), cur, prompt + (size_t)got * pc->bt);
            if (!node) break;
            /* every group the final length needs here (FULL always, WINDOW inside its window) */
            uint32_t held = unit_groups(pc, node);
            uint32_t need = kvt_plan_need_mask(&pc->geom, final_len, got, held);
            uint32_t want = 0; /* the groups needed here, held or not */
            for (uint32_t g = 0; g < G; g++)
                if (!pc->geom.window[g] || got >= kvt_plan_window_lo(final_len, pc->geom.window[g], pc->bt))
                    want |= 1u << g;
            if (!need || (want & ~held)) break;
            for (uint32_t g = 0; g < G; g++)
                if ((need >> g) & 1u) {
                    blocks[(size_t)got * G + g] = node->blocks[g];
                    kvt_block_retain(node->blocks[g]);
                }
            touch(pc, node, now);
            P[got++] = node;
            cur = node;
        }
    }
    pthread_mutex_unlock(&pc->mu);
    free(P);
    kvt_seq *s = NULL;
    kvt_status st = kvt_seq_create(pc->pool, kvt_chain_root(c), &s);
    for (uint32_t i = 0; i < got && st == KVT_OK; i++) st = kvt_seq_append_blocks(s, blocks + (size_t)i * G);
    for (size_t i = 0; i < (size_t)got * G; i++)
        if (blocks[i]) kvt_block_release(blocks[i]);
    free(blocks);
    if (st != KVT_OK) {
        kvt_seq_free(s);
        return st;
    }
    *out = s;
    return KVT_OK;
}

void kvt_prompt_cache_count_take(kvt_prompt_cache *pc, uint32_t tokens) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    if (tokens) {
        pc->st.hits++;
        pc->st.reused_tokens += tokens;
    } else {
        pc->st.misses++;
    }
    pthread_mutex_unlock(&pc->mu);
}

kvt_status kvt_prompt_cache_take(kvt_prompt_cache *pc, const int32_t *prompt, uint32_t n, uint64_t root,
                                 kvt_seq **out, uint32_t *n_reused) {
    if (!pc || !out || !n_reused || (!prompt && n)) return KVT_ERR_INVALID_ARG;
    *out = NULL;
    *n_reused = 0;
    kvt_chain *c = NULL;
    kvt_status st = kvt_chain_create(root, prompt, n, pc->bt, &c);
    if (st != KVT_OK) return st;
    st = kvt_prompt_cache_take_chain(pc, c, out, n_reused);
    kvt_chain_release(c);
    return st;
}

uint32_t kvt_prompt_cache_peek(kvt_prompt_cache *pc, const int32_t *prompt, uint32_t n, uint64_t root) {
    if (!pc || (!prompt && n)) return 0;
    kvt_chain *c = NULL;
    if (kvt_chain_create(root, prompt, n, pc->bt, &c) != KVT_OK) return 0;
    kvt_prompt_cache_peek_info pi;
    kvt_prompt_cache_peek_chain(pc, c, &pi);
    kvt_chain_release(c);
    return pi.usable;
}

/* Evicts down to the cap, skipping units touched by put `gen`. Under the lock. */
static void evict_to_cap(kvt_prompt_cache *pc, uint64_t gen, unit_vec *uv) {
    while (pc->bytes > pc->max_bytes) {
        pc_unit *v = pick_victim(pc, PICK_CAP_CLEAN, gen, 0);
        if (!v) v = pick_victim(pc, PICK_CAP_ANY, gen, 0);
        if (!v) break;
        unit_detach(pc, v);
        pc->st.evictions++;
        if (!uv_push(uv, v)) { /* cannot queue for spilling: release without spill */
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
        }
    }
}

static void finish_dispose(kvt_prompt_cache *pc, unit_vec *uv, bool spill, dispose_result *res) {
    if (!uv->n) return;
    pthread_mutex_lock(&pc->mu);
    kvt_spill_block_fn fb = pc->spill_block;
    kvt_spill_snapshot_fn fs = pc->spill_snap;
    void *ctx = pc->spill_ctx;
    pthread_mutex_unlock(&pc->mu);
    dispose_units(uv, pc->n_groups, fb, fs, ctx, spill, res);
    if (res->spilled) {
        pthread_mutex_lock(&pc->mu);
        pc->st.spills += res->spilled;
        pthread_mutex_unlock(&pc->mu);
    }
    uv->n = 0;
}

/* full_only: register only the sealed full blocks (no tail freeze, no snapshot); used while a
 * sliding-window sequence is still growing, so blocks that are about to leave its window stay
 * cached. */
static kvt_status put_impl(kvt_prompt_cache *pc, kvt_seq *seq, bool full_only) {
    if (!pc || !seq || kvt_seq_pool(seq) != pc->pool) return KVT_ERR_INVALID_ARG;
    uint32_t len = kvt_seq_len(seq);
    if (full_only) len -= len % pc->bt;
    if (len == 0) return KVT_OK;
    kvt_status st = full_only ? KVT_OK : kvt_seq_freeze_tail(seq);
    if (st != KVT_OK) return st;
    kvt_snapshot *snap = NULL;
    if (pc->recurrent && !full_only) {
        st = kvt_seq_snapshot(seq, &snap);
        if (st != KVT_OK) return st;
    }
    uint32_t bt = pc->bt, G = pc->n_groups;
    uint32_t n_full = len / bt, m = len % bt, nb = full_only ? n_full : kvt_seq_n_blocks(seq);
    const int32_t *toks = kvt_seq_tokens(seq);
    uint64_t root = kvt_seq_root(seq);

    uint64_t entry_bytes = snap ? pc->state_bytes : 0;
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t g = 0; g < G; g++) {
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (b) entry_bytes += kvt_block_data_bytes(b);
        }

    unit_vec victims = {0}, dropped = {0};
    dispose_result res = {0};
    if (entry_bytes > pc->max_bytes) {
        /* never stored; the cold tier still sees it */
        pthread_mutex_lock(&pc->mu);
        pc->st.reuse_impossible[KVT_REUSE_IMPOSSIBLE_BUDGET]++;
        kvt_spill_block_fn fb = pc->spill_block;
        kvt_spill_snapshot_fn fs = pc->spill_snap;
        void *ctx = pc->spill_ctx;
        pthread_mutex_unlock(&pc->mu);
        uint64_t spilled = 0;
        for (uint32_t i = 0; i < nb && fb; i++)
            for (uint32_t g = 0; g < G; g++) {
                kvt_block *b = kvt_seq_block(seq, g, i);
                if (b && kvt_block_sealed(b) && fb(ctx, b)) spilled++;
            }
        if (snap && fs && fs(ctx, snap)) spilled++;
        if (snap) kvt_snapshot_release(snap);
        if (spilled) {
            pthread_mutex_lock(&pc->mu);
            pc->st.spills += spilled;
            pthread_mutex_unlock(&pc->mu);
        }
        return KVT_OK;
    }

    pc_unit **P = malloc(((size_t)n_full + 1) * sizeof(*P));
    if (!P) {
        if (snap) kvt_snapshot_release(snap);
        return KVT_ERR_NOMEM;
    }
    pthread_mutex_lock(&pc->mu);
    uint64_t gen = ++pc->put_gen;
    uint64_t now = pc_now(pc);
    st = KVT_OK;
    pc_unit *R = root_get(pc, root);
    pc_unit *cur = R;
    uint32_t k = 0;
    if (!R) st = KVT_ERR_NOMEM;
    /* full blocks: find or create the node, fill in group blocks it lacks (dedup by identity) */
    for (uint32_t i = 0; i < n_full && st == KVT_OK; i++) {
        const int32_t *t = toks + (size_t)i * bt;
        uint64_t h = kvt_seq_block_chain(seq, i); /* computed when the block was sealed */
        pc_unit *node = map_find(pc, h, cur, t);
        if (!node) node = unit_new(pc, U_NODE, cur, i, t, bt, h);
        if (!node) {
            st = KVT_ERR_NOMEM;
            break;
        }
        for (uint32_t g = 0; g < G; g++) {
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (b && !node->blocks[g] && kvt_block_sealed(b)) unit_add_block(pc, node, g, b);
        }
        touch(pc, node, now);
        node->put_gen = gen;
        P[k++] = node;
        cur = node;
    }
    /* frozen tail */
    pc_unit *tail = NULL;
    if (st == KVT_OK && m) {
        const int32_t *t = toks + (size_t)n_full * bt;
        for (pc_unit *c = cur->first_child; c; c = c->sib_next)
            if (c->kind == U_TAIL && c->n_tok == m && memcmp(c->tokens, t, (size_t)m * sizeof(int32_t)) == 0) {
                tail = c;
                break;
            }
        if (!tail) {
            /* the frozen tail's blocks carry its chain hash (sealed by freeze_tail) */
            kvt_block *tb = G ? kvt_seq_block(seq, 0, n_full) : NULL;
            uint64_t th = tb && kvt_block_sealed(tb) ? kvt_block_hash(tb) : kvt_chain_hash(cur->key, t, m);
            tail = unit_new(pc, U_TAIL, cur, n_full, t, m, th);
        }
        if (!tail) {
            st = KVT_ERR_NOMEM;
        } else {
            for (uint32_t g = 0; g < G; g++) {
                kvt_block *b = kvt_seq_block(seq, g, n_full);
                if (b && !tail->blocks[g] && kvt_block_sealed(b)) unit_add_block(pc, tail, g, b);
            }
            touch(pc, tail, now);
            tail->put_gen = gen;
        }
    }
    /* recurrent snapshot at len (an existing one at the same tokens is identical: keep it) */
    if (st == KVT_OK && snap) {
        const int32_t *t = toks + (size_t)n_full * bt;
        pc_unit *su = NULL;
        for (pc_unit *c = cur->first_child; c; c = c->sib_next)
            if (c->kind == U_SNAP && c->n_tok == m && (!m || memcmp(c->tokens, t, (size_t)m * sizeof(int32_t)) == 0)) {
                su = c;
                break;
            }
        if (!su) {
            su = unit_new(pc, U_SNAP, cur, n_full, t, m, kvt_snapshot_chain(snap));
            if (su) {
                su->snap = snap;
                su->bytes = pc->state_bytes;
                pc->bytes += su->bytes;
                snap = NULL; /* owned by the unit now */
            } else {
                st = KVT_ERR_NOMEM;
            }
        }
        if (su) {
            touch(pc, su, now);
            su->put_gen = gen;
        }
    }
    /* supersession (plan.h, the rule the SSD tier uses too): older tails at a position of this
     * sequence that this sequence's unit there (its full block or its new tail) supersedes are
     * dropped without spill. Snapshots are never superseded (a longer recurrent state cannot be cut
     * back); a snapshot's own unit is separate from any tail, so dropping a tail never loses one. */
    if (st == KVT_OK) {
        for (uint32_t j = 0; j <= k; j++) {
            pc_unit *parent = j ? P[j - 1] : R;
            pc_unit *nu = j < k ? P[j] : tail;
            if (!nu) continue;
            kvt_plan_unit nw = {parent->key, j, nu->n_tok, nu->tokens, unit_groups(pc, nu), nu->kind == U_TAIL, false};
            pc_unit *c = parent->first_child;
            while (c) {
                pc_unit *nx = c->sib_next;
                kvt_plan_unit od = {parent->key, j, c->n_tok, c->tokens, unit_groups(pc, c), c->kind == U_TAIL, false};
                if (c != nu && c->put_gen != gen && !c->n_children && kvt_plan_supersedes(&od, &nw)) {
                    unit_detach(pc, c);
                    if (!uv_push(&dropped, c)) {
                        unit_vec one = {&c, 1, 1};
                        dispose_result r = {0};
                        dispose_units(&one, G, NULL, NULL, NULL, false, &r);
                    }
                }
                c = nx;
            }
        }
    }
    if (R) root_drop_if_empty(pc, R); /* only when nothing could be registered */
    evict_to_cap(pc, gen, &victims);
    pthread_mutex_unlock(&pc->mu);
    free(P);

    finish_dispose(pc, &victims, true, &res);
    dispose_result r2 = {0};
    finish_dispose(pc, &dropped, false, &r2);
    free(victims.v);
    free(dropped.v);
    if (snap) kvt_snapshot_release(snap);
    return st;
}

kvt_status kvt_prompt_cache_put(kvt_prompt_cache *pc, kvt_seq *seq) { return put_impl(pc, seq, false); }

kvt_status kvt_prompt_cache_put_blocks(kvt_prompt_cache *pc, kvt_seq *seq) { return put_impl(pc, seq, true); }

uint64_t kvt_prompt_cache_evict_bytes(kvt_prompt_cache *pc, uint64_t bytes) {
    if (!pc) return 0;
    uint64_t freed = 0;
    unit_vec uv = {0};
    while (freed < bytes) {
        pthread_mutex_lock(&pc->mu);
        uint64_t expect = freed;
        while (expect < bytes) {
            pc_unit *v = pick_victim(pc, PICK_PRESSURE, 0, 0);
            if (!v) break;
            unit_detach(pc, v);
            pc->st.evictions++;
            if (!v->snap) expect += v->bytes; /* snapshots are not pool memory */
            if (!uv_push(&uv, v)) {
                unit_vec one = {&v, 1, 1};
                dispose_result r = {0};
                dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
                freed += r.freed_bytes;
            }
        }
        pthread_mutex_unlock(&pc->mu);
        if (!uv.n) break;
        dispose_result res = {0};
        finish_dispose(pc, &uv, true, &res);
        freed += res.freed_bytes;
    }
    free(uv.v);
    return freed;
}

bool kvt_prompt_cache_pressure_cb(void *ctx, uint64_t bytes_needed) {
    return kvt_prompt_cache_evict_bytes((kvt_prompt_cache *)ctx, bytes_needed ? bytes_needed : 1) > 0;
}

uint64_t kvt_prompt_cache_demote_idle(kvt_prompt_cache *pc, double seconds) {
    if (!pc) return 0;
    unit_vec uv = {0};
    pthread_mutex_lock(&pc->mu);
    if (!pc->spill_block && !pc->spill_snap) { /* nowhere to demote to: would be data loss */
        pthread_mutex_unlock(&pc->mu);
        return 0;
    }
    uint64_t now = pc_now(pc);
    double ns = seconds > 0 ? seconds * 1e9 : 0;
    /* idle means now - used_ns >= ns; nothing can be idle longer than the clock has run */
    while (ns <= (double)now) {
        pc_unit *v = pick_victim(pc, PICK_IDLE, 0, now - (uint64_t)ns);
        if (!v) break;
        unit_detach(pc, v);
        if (!uv_push(&uv, v)) {
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
        }
    }
    pthread_mutex_unlock(&pc->mu);
    dispose_result res = {0};
    finish_dispose(pc, &uv, true, &res);
    free(uv.v);
    return res.items;
}

int64_t kvt_prompt_cache_visit(kvt_prompt_cache *pc, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx) {
    if (!pc) return 0;
    pthread_mutex_lock(&pc->mu);
    size_t cap = (size_t)pc->n_blocks + (size_t)pc->n_units + 1, nb = 0, ns = 0;
    kvt_block **bl = malloc(cap * sizeof(*bl));
    kvt_snapshot **sn = malloc(cap * sizeof(*sn));
    if (!bl || !sn) {
        pthread_mutex_unlock(&pc->mu);
        free(bl);
        free(sn);
        return -1;
    }
    /* oldest first: parents before children is not needed (files are independent) */
    for (pc_unit *u = pc->lru.lru_prev; u && u != &pc->lru; u = u->lru_prev) {
        for (uint32_t g = 0; g < pc->n_groups && nb < cap; g++)
            if (u->blocks[g]) {
                kvt_block_retain(u->blocks[g]);
                bl[nb++] = u->blocks[g];
            }
        if (u->snap && ns < cap) {
            kvt_snapshot_retain(u->snap);
            sn[ns++] = u->snap;
        }
    }
    pthread_mutex_unlock(&pc->mu);
    for (size_t i = 0; i < nb; i++) {
        if (fb) fb(ctx, bl[i]);
        kvt_block_release(bl[i]);
    }
    for (size_t i = 0; i < ns; i++) {
        if (fs) fs(ctx, sn[i]);
        kvt_snapshot_release(sn[i]);
    }
    free(bl);
    free(sn);
    return (int64_t)(nb + ns);
}

void kvt_prompt_cache_clear(kvt_prompt_cache *pc) {
    if (!pc) return;
    unit_vec uv = {0};
    pthread_mutex_lock(&pc->mu);
    detach_all(pc, &uv);
    pthread_mutex_unlock(&pc->mu);
    dispose_result res = {0};
    dispose_units(&uv, pc->n_groups, NULL, NULL, NULL, false, &res); /* clear never spills */
    free(uv.v);
}

void kvt_prompt_cache_note_impossible(kvt_prompt_cache *pc, kvt_reuse_reason r) {
    if (!pc || (unsigned)r >= KVT_REUSE_IMPOSSIBLE_N) return;
    pthread_mutex_lock(&pc->mu);
    pc->st.reuse_impossible[r]++;
    pthread_mutex_unlock(&pc->mu);
}

void kvt_prompt_cache_stats_get(kvt_prompt_cache *pc, kvt_prompt_cache_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof(*out));
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    *out = pc->st;
    uint64_t entries = 0;
    for (pc_unit *u = pc->lru.lru_next; u != &pc->lru; u = u->lru_next)
        if (u->kind != U_NODE || u->n_children == 0) entries++;
    out->entries = entries;
    out->blocks = pc->n_blocks;
    out->bytes = pc->bytes;
    out->max_bytes = pc->max_bytes;
    pthread_mutex_unlock(&pc->mu);
}
