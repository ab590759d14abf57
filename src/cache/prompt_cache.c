/*
 * prompt_cache.c — the RAM tier (see prompt_cache.h and docs/ram-tier.md): its plan adapter (the
 * index as the shared planner of plan.h sees it), take (a plan executed into a sequence), put
 * (registering a sequence's blocks, tail and snapshot), eviction, demotion and visits. The index it
 * works on (units, map, LRU) and its invariants R1-R7 are in ram_index.c.
 *
 * Locking: one mutex guards the index. Pool allocations (which may call back into
 * kvt_prompt_cache_evict_bytes through the pool pressure hook), spill callbacks and block releases
 * happen with the mutex released (R7): take() retains what it needs under the lock and builds the
 * sequence afterwards; evictions detach units under the lock and dispose of them afterwards.
 * Pins (R8) mark the units of a prefix so that no eviction, demotion or supersession detaches them.
 */
#include "ram_int.h"

#include "block_rows.h"

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
    return kvt_ram_unit_groups(x->pc, x->P[i]);
}

static const void *ram_rows(void *ctx, uint32_t j, uint32_t m) {
    const ram_ix *x = ctx;
    pc_unit *parent = j ? x->P[j - 1] : x->R;
    return kvt_ram_rows_unit(x->pc, parent, x->prompt + (size_t)j * x->pc->bt, m, j < x->k ? x->P[j] : NULL);
}

/* Under the lock: the longest usable prefix of the chain's prompt (kvt_plan_usable_prefix over this
 * tier's index). P must hold n/bt entries. False only when out of memory. */
static _Atomic uint64_t g_plans; /* plan_take calls (kvt_prompt_cache_plan_calls) */

uint64_t kvt_prompt_cache_plan_calls(void) { return g_plans; }

static bool plan_take(const kvt_prompt_cache *pc, pc_unit *R, const kvt_chain *c, pc_unit **P, take_plan *pl) {
    memset(pl, 0, sizeof(*pl));
    g_plans++;
    const uint32_t n = kvt_chain_len(c), bt = pc->bt;
    const int32_t *prompt = kvt_chain_tokens(c);
    if (!R || n < 2) return true;
    uint32_t k = kvt_ram_walk_path(pc, R, c, P);
    pl->k = k;
    ram_ix x = {pc, R, P, k, prompt};
    kvt_plan_index ix = {.ctx = &x, .k = k, .match = kvt_ram_token_match(pc, R, P, k, prompt, n), .held = ram_held, .rows = ram_rows};
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

/* One plan of this tier for one lookup's chain, carried from the peek into the take (the tier
 * manager plans each tier once per lookup). Its unit pointers stay valid while no unit was detached
 * since (pc->epoch unchanged); a plan whose epoch moved is planned again at the take. */
struct kvt_prompt_cache_plan {
    const kvt_chain *c; /* borrowed: the lookup's chain */
    pc_unit **P;        /* [n/bt + 1] the matched full-block path */
    take_plan pl;
    uint64_t epoch;
    bool valid;         /* pl/P describe the index at epoch */
    kvt_prompt_cache_peek_info info;
};

/* Under the lock: (re)plans p against the index now and fills its peek info. False: out of memory. */
static bool plan_locked(kvt_prompt_cache *pc, kvt_prompt_cache_plan *p) {
    const uint32_t n = kvt_chain_len(p->c);
    p->valid = plan_take(pc, kvt_ram_root_find(pc, kvt_chain_root(p->c)), p->c, p->P, &p->pl);
    p->epoch = pc->epoch;
    memset(&p->info, 0, sizeof(p->info));
    if (!p->valid) return false;
    p->info.usable = p->pl.L;
    /* leading full blocks held in every FULL group, below the n-1 cap (a mixed plan's RAM part;
     * take_blocks checks the WINDOW groups once the final length is known) */
    uint32_t lim = n ? KVT_MIN(p->pl.k, (n - 1) / pc->bt) : 0, kb = 0;
    while (kb < lim) {
        uint32_t h = kvt_ram_unit_groups(pc, p->P[kb]);
        if (!h || (h & pc->full_mask) != pc->full_mask) break;
        kb++;
    }
    p->info.full_blocks = kb;
    return true;
}

/* Under the lock: p as it was planned if the index lost no unit since, else planned again. */
static bool plan_fresh(kvt_prompt_cache *pc, kvt_prompt_cache_plan *p) {
    if (p->valid && p->epoch == pc->epoch) return true;
    return plan_locked(pc, p);
}

kvt_status kvt_prompt_cache_plan_create(kvt_prompt_cache *pc, const kvt_chain *c, kvt_prompt_cache_plan **out,
                                 kvt_prompt_cache_peek_info *info) {
    *out = NULL;
    if (info) memset(info, 0, sizeof(*info));
    if (!pc || !c || kvt_chain_block_tokens(c) != pc->bt) return KVT_ERR_INVALID_ARG;
    kvt_prompt_cache_plan *p = calloc(1, sizeof(*p));
    if (p) p->P = malloc(((size_t)kvt_chain_len(c) / pc->bt + 1) * sizeof(*p->P));
    if (!p || !p->P) {
        free(p);
        return KVT_ERR_NOMEM;
    }
    p->c = c;
    pthread_mutex_lock(&pc->mu);
    bool ok = plan_locked(pc, p);
    pthread_mutex_unlock(&pc->mu);
    if (!ok) {
        kvt_prompt_cache_plan_free(p);
        return KVT_ERR_NOMEM;
    }
    if (info) *info = p->info;
    *out = p;
    return KVT_OK;
}

void kvt_prompt_cache_plan_free(kvt_prompt_cache_plan *p) {
    if (!p) return;
    free(p->P);
    free(p);
}

/* ------------------------------------------------------------------ public API */

bool kvt_prompt_cache_check(kvt_prompt_cache *pc) { return pc && kvt_ram_check(pc); }

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
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (!pc->geom.window[g]) pc->full_mask |= 1u << g;
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

/* Drops one pin record: its units' counts and, for those left unpinned, their bytes (R8). Under the lock. */
static void pin_drop(kvt_prompt_cache *pc, pc_pin *p) {
    for (uint32_t i = 0; i < p->n_units; i++)
        if (--p->units[i]->pins == 0) pc->pinned_bytes -= p->units[i]->bytes;
    free(p->units);
    free(p);
}

/* Detaches every unit (leaves first) into uv, pins first dropped (R8). Under the lock. */
static void detach_all(kvt_prompt_cache *pc, unit_vec *uv) {
    while (pc->pins) {
        pc_pin *p = pc->pins;
        pc->pins = p->next;
        pin_drop(pc, p);
    }
    for (;;) {
        pc_unit *v = kvt_ram_pick_victim(pc, PICK_CAP_ANY, UINT64_MAX, 0);
        if (!v) break;
        kvt_ram_unit_detach(pc, v);
        if (!kvt_ram_uv_push(uv, v)) {
            /* out of memory for the list: release right here (no spill on clear/free anyway) */
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            kvt_ram_dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
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
    kvt_block_rows_copy(pc->layout, g, index, m, kvt_block_data(src), kvt_block_data_mut(b));
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

/* Would another root give a real match (>= one block, or the whole capped prompt)? Under the lock.
 * Only the KVT_PC_NS_DIAG_ROOTS most recently created other roots are tried: clients choose
 * namespaces (cache_salt), and a miss must not cost a chain hash per namespace ever seen. */
#define KVT_PC_NS_DIAG_ROOTS 16
static bool other_namespace_match(const kvt_prompt_cache *pc, uint64_t root, const int32_t *prompt, uint32_t n,
                                  pc_unit **P) {
    uint32_t cap = n - 1, need = KVT_MIN(pc->bt, cap), tried = 0;
    for (pc_unit *r = pc->roots; r && tried < KVT_PC_NS_DIAG_ROOTS; r = r->sib_next) {
        if (r->key == root) continue;
        tried++;
        uint32_t k = kvt_ram_walk_path_hashing(pc, r, prompt, n, P);
        if (KVT_MIN(kvt_ram_token_match(pc, r, P, k, prompt, n), cap) >= need) return true;
    }
    return false;
}

kvt_status kvt_prompt_cache_take_plan(kvt_prompt_cache *pc, kvt_prompt_cache_plan *plan, kvt_seq **out,
                                      uint32_t *n_reused) {
    if (!pc || !plan || !out || !n_reused) return KVT_ERR_INVALID_ARG;
    *out = NULL;
    *n_reused = 0;
    const kvt_chain *c = plan->c;
    const uint32_t G = pc->n_groups, n = kvt_chain_len(c);
    const uint64_t root = kvt_chain_root(c);
    const int32_t *prompt = kvt_chain_tokens(c);
    pc_unit **P = plan->P;

    pthread_mutex_lock(&pc->mu);
    if (!plan_fresh(pc, plan)) {
        pthread_mutex_unlock(&pc->mu);
        return KVT_ERR_NOMEM;
    }
    const take_plan pl = plan->pl;
    if (pl.L < pl.match) pc->st.reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE]++;
    if (pl.L == 0) {
        plan->valid = false; /* P is the diagnostics' scratch from here */
        if (n >= 2 && other_namespace_match(pc, root, prompt, n, P))
            pc->st.reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE]++;
        pc->st.misses++;
        pthread_mutex_unlock(&pc->mu);
        return KVT_OK;
    }
    /* retain what the build needs, bump recency root-first so the leaf ends up most recent */
    uint32_t nb = pl.n_full + 1;
    kvt_block **blocks = calloc((size_t)nb * (G ? G : 1), sizeof(*blocks));
    if (!blocks) {
        pthread_mutex_unlock(&pc->mu);
        return KVT_ERR_NOMEM;
    }
    uint64_t now = kvt_ram_now(pc);
    for (uint32_t i = 0; i < pl.n_full; i++) {
        /* a WINDOW block outside the window of L is not needed: leave it out (plan.h) */
        uint32_t need = kvt_plan_need_mask(&pc->geom, pl.L, i, kvt_ram_unit_groups(pc, P[i]));
        for (uint32_t g = 0; g < G; g++) {
            kvt_block *b = (need >> g) & 1u ? P[i]->blocks[g] : NULL;
            if (b) kvt_block_retain(b);
            blocks[(size_t)i * G + g] = b;
        }
        kvt_ram_touch(pc, P[i], now);
    }
    for (uint32_t g = 0; g < G; g++) {
        blocks[(size_t)pl.n_full * G + g] = pl.last_u->blocks[g];
        kvt_block_retain(pl.last_u->blocks[g]);
    }
    kvt_ram_touch(pc, pl.last_u, now);
    uint32_t last_n_tok = pl.last_u->n_tok;
    uint64_t last_parent = pl.n_full ? P[pl.n_full - 1]->key : root;
    kvt_snapshot *snap = NULL;
    if (pl.snap_u) {
        snap = pl.snap_u->snap;
        kvt_snapshot_retain(snap);
        kvt_ram_touch(pc, pl.snap_u, now);
    }
    pthread_mutex_unlock(&pc->mu);

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

kvt_status kvt_prompt_cache_take_blocks(kvt_prompt_cache *pc, kvt_prompt_cache_plan *plan, uint32_t k, uint32_t final_len,
                                        kvt_seq **out) {
    if (!pc || !plan || !out || k > kvt_chain_n_full(plan->c)) return KVT_ERR_INVALID_ARG;
    *out = NULL;
    const uint32_t G = pc->n_groups;
    if (G == 0) return KVT_ERR_INVALID_ARG; /* a recurrent-only layout has no blocks to take */
    if (final_len < k * pc->bt) k = final_len / pc->bt;
    kvt_block **blocks = calloc((size_t)k * G + 1, sizeof(*blocks));
    if (!blocks) return KVT_ERR_NOMEM;
    pthread_mutex_lock(&pc->mu);
    if (!plan_fresh(pc, plan)) {
        pthread_mutex_unlock(&pc->mu);
        free(blocks);
        return KVT_ERR_NOMEM;
    }
    uint32_t got = 0;
    const uint32_t lim = KVT_MIN(k, plan->pl.k);
    uint64_t now = kvt_ram_now(pc);
    while (got < lim) {
        pc_unit *node = plan->P[got];
        /* every group the final length needs here (FULL always, WINDOW inside its window) */
        uint32_t held = kvt_ram_unit_groups(pc, node);
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
        kvt_ram_touch(pc, node, now);
        got++;
    }
    pthread_mutex_unlock(&pc->mu);
    kvt_seq *s = NULL;
    kvt_status st = kvt_seq_create(pc->pool, kvt_chain_root(plan->c), &s);
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

/* Evicts down to the cap, skipping units touched by put `gen`. Under the lock. */
static void evict_to_cap(kvt_prompt_cache *pc, uint64_t gen, unit_vec *uv) {
    while (pc->bytes > pc->max_bytes) {
        pc_unit *v = kvt_ram_pick_victim(pc, PICK_CAP_CLEAN, gen, 0);
        if (!v) v = kvt_ram_pick_victim(pc, PICK_CAP_ANY, gen, 0);
        if (!v) break;
        kvt_ram_unit_detach(pc, v);
        pc->st.evictions++;
        if (!kvt_ram_uv_push(uv, v)) { /* cannot queue for spilling: release without spill */
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            kvt_ram_dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
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
    kvt_ram_dispose_units(uv, pc->n_groups, fb, fs, ctx, spill, res);
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
    uint64_t now = kvt_ram_now(pc);
    st = KVT_OK;
    pc_unit *R = kvt_ram_root_get(pc, root);
    pc_unit *cur = R;
    uint32_t k = 0;
    if (!R) st = KVT_ERR_NOMEM;
    /* full blocks: find or create the node, fill in group blocks it lacks (dedup by identity) */
    for (uint32_t i = 0; i < n_full && st == KVT_OK; i++) {
        const int32_t *t = toks + (size_t)i * bt;
        uint64_t h = kvt_seq_block_chain(seq, i); /* computed when the block was sealed */
        pc_unit *node = kvt_ram_map_find(pc, h, cur, t);
        if (!node) node = kvt_ram_unit_new(pc, U_NODE, cur, i, t, bt, h);
        if (!node) {
            st = KVT_ERR_NOMEM;
            break;
        }
        for (uint32_t g = 0; g < G; g++) {
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (b && !node->blocks[g] && kvt_block_sealed(b)) kvt_ram_unit_add_block(pc, node, g, b);
        }
        kvt_ram_touch(pc, node, now);
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
            tail = kvt_ram_unit_new(pc, U_TAIL, cur, n_full, t, m, th);
        }
        if (!tail) {
            st = KVT_ERR_NOMEM;
        } else {
            for (uint32_t g = 0; g < G; g++) {
                kvt_block *b = kvt_seq_block(seq, g, n_full);
                if (b && !tail->blocks[g] && kvt_block_sealed(b)) kvt_ram_unit_add_block(pc, tail, g, b);
            }
            kvt_ram_touch(pc, tail, now);
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
            su = kvt_ram_unit_new(pc, U_SNAP, cur, n_full, t, m, kvt_snapshot_chain(snap));
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
            kvt_ram_touch(pc, su, now);
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
            kvt_plan_unit nw = {parent->key, j, nu->n_tok, nu->tokens, kvt_ram_unit_groups(pc, nu), nu->kind == U_TAIL, false};
            pc_unit *c = parent->first_child;
            while (c) {
                pc_unit *nx = c->sib_next;
                kvt_plan_unit od = {parent->key, j, c->n_tok, c->tokens, kvt_ram_unit_groups(pc, c), c->kind == U_TAIL, false};
                if (c != nu && c->put_gen != gen && kvt_ram_detachable(c) && kvt_plan_supersedes(&od, &nw)) {
                    kvt_ram_unit_detach(pc, c);
                    if (!kvt_ram_uv_push(&dropped, c)) {
                        unit_vec one = {&c, 1, 1};
                        dispose_result r = {0};
                        kvt_ram_dispose_units(&one, G, NULL, NULL, NULL, false, &r);
                    }
                }
                c = nx;
            }
        }
    }
    if (R) kvt_ram_root_drop_if_empty(pc, R); /* only when nothing could be registered */
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
            pc_unit *v = kvt_ram_pick_victim(pc, PICK_PRESSURE, 0, 0);
            if (!v) break;
            kvt_ram_unit_detach(pc, v);
            pc->st.evictions++;
            if (!v->snap) expect += v->bytes; /* snapshots are not pool memory */
            if (!kvt_ram_uv_push(&uv, v)) {
                unit_vec one = {&v, 1, 1};
                dispose_result r = {0};
                kvt_ram_dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
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
    uint64_t now = kvt_ram_now(pc);
    double ns = seconds > 0 ? seconds * 1e9 : 0;
    /* idle means now - used_ns >= ns; nothing can be idle longer than the clock has run */
    while (ns <= (double)now) {
        pc_unit *v = kvt_ram_pick_victim(pc, PICK_IDLE, 0, now - (uint64_t)ns);
        if (!v) break;
        kvt_ram_unit_detach(pc, v);
        if (!kvt_ram_uv_push(&uv, v)) {
            unit_vec one = {&v, 1, 1};
            dispose_result r = {0};
            kvt_ram_dispose_units(&one, pc->n_groups, NULL, NULL, NULL, false, &r);
        }
    }
    pthread_mutex_unlock(&pc->mu);
    dispose_result res = {0};
    finish_dispose(pc, &uv, true, &res);
    free(uv.v);
    return res.items;
}

/* What a visit hands out: references taken under the lock (visit_take), callbacks run after it
 * (visit_run), so a callback may re-enter the cache or allocate pool blocks (R7). */
typedef struct visit_set {
    kvt_block **bl;
    kvt_snapshot **sn;
    size_t nb, ns, cap;
} visit_set;

static bool visit_alloc(visit_set *v, size_t cap) {
    memset(v, 0, sizeof *v);
    v->cap = cap;
    if (!cap) return true;
    v->bl = malloc(cap * sizeof(*v->bl));
    v->sn = malloc(cap * sizeof(*v->sn));
    if (v->bl && v->sn) return true;
    free(v->bl);
    free(v->sn);
    return false;
}

/* Under the lock: one reference to each block and the snapshot of u (as room allows). */
static void visit_take(kvt_prompt_cache *pc, visit_set *v, pc_unit *u) {
    for (uint32_t g = 0; g < pc->n_groups && v->nb < v->cap; g++)
        if (u->blocks[g]) {
            kvt_block_retain(u->blocks[g]);
            v->bl[v->nb++] = u->blocks[g];
        }
    if (u->snap && v->ns < v->cap) {
        kvt_snapshot_retain(u->snap);
        v->sn[v->ns++] = u->snap;
    }
}

/* Without the lock: the callbacks, then the references go. Returns the objects visited. */
static int64_t visit_run(visit_set *v, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx) {
    for (size_t i = 0; i < v->nb; i++) {
        if (fb) fb(ctx, v->bl[i]);
        kvt_block_release(v->bl[i]);
    }
    for (size_t i = 0; i < v->ns; i++) {
        if (fs) fs(ctx, v->sn[i]);
        kvt_snapshot_release(v->sn[i]);
    }
    free(v->bl);
    free(v->sn);
    return (int64_t)(v->nb + v->ns);
}

int64_t kvt_prompt_cache_visit(kvt_prompt_cache *pc, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs, void *ctx) {
    if (!pc) return 0;
    pthread_mutex_lock(&pc->mu);
    visit_set v;
    if (!visit_alloc(&v, (size_t)pc->n_blocks + (size_t)pc->n_units + 1)) {
        pthread_mutex_unlock(&pc->mu);
        return -1;
    }
    /* oldest first: parents before children is not needed (files are independent) */
    for (pc_unit *u = pc->lru.lru_prev; u && u != &pc->lru; u = u->lru_prev) visit_take(pc, &v, u);
    pthread_mutex_unlock(&pc->mu);
    return visit_run(&v, fb, fs, ctx);
}

void kvt_prompt_cache_clear(kvt_prompt_cache *pc) {
    if (!pc) return;
    unit_vec uv = {0};
    pthread_mutex_lock(&pc->mu);
    detach_all(pc, &uv);
    pthread_mutex_unlock(&pc->mu);
    dispose_result res = {0};
    kvt_ram_dispose_units(&uv, pc->n_groups, NULL, NULL, NULL, false, &res); /* clear never spills */
    free(uv.v);
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

/* A leaf's prefix: its length is where its tokens end; its path is every unit up to the ROOT. */
uint32_t kvt_prompt_cache_prefixes(kvt_prompt_cache *pc, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes) {
    uint32_t n = 0;
    uint64_t leaves = 0;
    if (!pc) goto done;
    pthread_mutex_lock(&pc->mu);
    const uint64_t now = kvt_ram_now(pc);
    for (pc_unit *u = pc->lru.lru_next; u != &pc->lru; u = u->lru_next) {
        if (u->n_children) continue;
        leaves++;
        const uint32_t tokens = u->index * pc->bt + u->n_tok;
        if (!max || (n == max && out[n - 1].tokens >= tokens)) continue;
        kvt_cached_prefix p = {.tokens = tokens, .root = 0};
        p.idle_s = now > u->used_ns ? (double)(now - u->used_ns) / 1e9 : 0.0;
        const pc_unit *first = u;
        for (const pc_unit *a = u; a && a->kind != U_ROOT; a = a->parent) {
            p.units++;
            p.bytes += a->bytes;
            first = a;
        }
        if (first->parent) p.root = first->parent->key;
        p.n_head = KVT_MIN(first->n_tok, (uint32_t)KVT_PREFIX_HEAD);
        if (first->tokens) memcpy(p.head, first->tokens, p.n_head * sizeof *p.head);
        /* insertion into the sorted top-max (longest first; ties keep LRU order: most recent first) */
        uint32_t i = n < max ? n++ : max - 1;
        while (i > 0 && out[i - 1].tokens < tokens) {
            out[i] = out[i - 1];
            i--;
        }
        out[i] = p;
    }
    pthread_mutex_unlock(&pc->mu);
done:
    if (n_prefixes) *n_prefixes = leaves;
    return n;
}

/* ------------------------------------------------------------------ pins (R8) */

void kvt_prompt_cache_set_pin_budget(kvt_prompt_cache *pc, uint64_t bytes) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    pc->pin_budget = bytes;
    pthread_mutex_unlock(&pc->mu);
}

/* Under the lock: the units holding the chain's prompt, in path order: the full-block NODEs along
 * the chain, the longest TAIL under the last of them whose tokens continue the prompt, and every
 * SNAP along the path inside the prompt (recurrent layouts resume only at a snapshot). Fills u
 * (NULL: only counts) and returns the count; *tokens = the prefix the NODEs and the TAIL cover. */
static uint32_t pin_units(kvt_prompt_cache *pc, const kvt_chain *c, pc_unit **P, pc_unit **u, uint32_t *tokens) {
    const uint32_t n = kvt_chain_len(c), bt = pc->bt;
    const int32_t *prompt = kvt_chain_tokens(c);
    *tokens = 0;
    pc_unit *R = kvt_ram_root_find(pc, kvt_chain_root(c));
    if (!R) return 0;
    uint32_t k = kvt_ram_walk_path(pc, R, c, P), m = 0;
    for (uint32_t i = 0; i < k; i++, m++)
        if (u) u[m] = P[i];
    pc_unit *tail = NULL, *last = k ? P[k - 1] : R;
    const uint32_t rest = n - k * bt;
    for (pc_unit *ch = last->first_child; ch; ch = ch->sib_next)
        if (ch->kind == U_TAIL && ch->n_tok <= rest && (!tail || ch->n_tok > tail->n_tok) &&
            memcmp(ch->tokens, prompt + (size_t)k * bt, (size_t)ch->n_tok * sizeof(int32_t)) == 0)
            tail = ch;
    if (tail) {
        if (u) u[m] = tail;
        m++;
    }
    *tokens = k * bt + (tail ? tail->n_tok : 0);
    for (uint32_t j = 0; j <= k && pc->recurrent; j++) {
        pc_unit *parent = j ? P[j - 1] : R;
        for (pc_unit *ch = parent->first_child; ch; ch = ch->sib_next)
            if (ch->kind == U_SNAP && (uint64_t)j * bt + ch->n_tok <= n &&
                (!ch->n_tok || memcmp(ch->tokens, prompt + (size_t)j * bt, (size_t)ch->n_tok * sizeof(int32_t)) == 0)) {
                if (u) u[m] = ch;
                m++;
            }
    }
    return m;
}

kvt_status kvt_prompt_cache_pin(kvt_prompt_cache *pc, const kvt_chain *c, uint64_t *handle, kvt_prompt_cache_pin_info *info) {
    if (info) memset(info, 0, sizeof(*info));
    if (!pc || !c || !handle || kvt_chain_block_tokens(c) != pc->bt) return KVT_ERR_INVALID_ARG;
    const uint32_t n = kvt_chain_len(c);
    pc_unit **P = malloc(((size_t)n / pc->bt + 1) * sizeof(*P));
    pc_pin *p = calloc(1, sizeof(*p));
    if (!P || !p) {
        free(P);
        free(p);
        return KVT_ERR_NOMEM;
    }
    pthread_mutex_lock(&pc->mu);
    const uint32_t cap = pin_units(pc, c, P, NULL, &p->tokens); /* count, then fill (malloc is no pool allocation: R7) */
    p->units = malloc(((size_t)cap + 1) * sizeof(*p->units));
    if (!p->units) {
        pthread_mutex_unlock(&pc->mu);
        free(P);
        free(p);
        return KVT_ERR_NOMEM;
    }
    p->n_units = pin_units(pc, c, P, p->units, &p->tokens);
    uint64_t add = 0, total = 0;
    for (uint32_t i = 0; i < p->n_units; i++) {
        total += p->units[i]->bytes;
        if (!p->units[i]->pins) add += p->units[i]->bytes;
    }
    kvt_status st = KVT_OK;
    if (!p->n_units) st = KVT_ERR_NOT_FOUND;
    else if (pc->pinned_bytes + add > pc->pin_budget) st = KVT_ERR_RANGE;
    if (info) {
        info->tokens = p->tokens;
        info->bytes = total;
        info->new_bytes = add;
        info->pinned_bytes = pc->pinned_bytes + (st == KVT_OK ? add : 0);
        info->budget = pc->pin_budget;
    }
    if (st == KVT_OK) {
        for (uint32_t i = 0; i < p->n_units; i++)
            if (p->units[i]->pins++ == 0) pc->pinned_bytes += p->units[i]->bytes;
        p->handle = ++pc->next_pin;
        p->next = pc->pins;
        pc->pins = p;
        *handle = p->handle;
    }
    pthread_mutex_unlock(&pc->mu);
    free(P);
    if (st != KVT_OK) {
        free(p->units);
        free(p);
    }
    return st;
}

bool kvt_prompt_cache_unpin(kvt_prompt_cache *pc, uint64_t handle) {
    if (!pc || !handle) return false;
    pthread_mutex_lock(&pc->mu);
    pc_pin **pp = &pc->pins;
    while (*pp && (*pp)->handle != handle) pp = &(*pp)->next;
    pc_pin *p = *pp;
    if (p) {
        *pp = p->next;
        pin_drop(pc, p);
    }
    pthread_mutex_unlock(&pc->mu);
    return p != NULL;
}

int64_t kvt_prompt_cache_pin_visit(kvt_prompt_cache *pc, uint64_t handle, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs,
                                   void *ctx) {
    if (!pc) return 0;
    pthread_mutex_lock(&pc->mu);
    pc_pin *p = pc->pins;
    while (p && p->handle != handle) p = p->next;
    visit_set v;
    if (!visit_alloc(&v, p ? (size_t)p->n_units * (pc->n_groups + 1) : 0)) {
        pthread_mutex_unlock(&pc->mu);
        return -1;
    }
    for (uint32_t i = 0; p && i < p->n_units; i++) visit_take(pc, &v, p->units[i]);
    pthread_mutex_unlock(&pc->mu);
    return visit_run(&v, fb, fs, ctx);
}

uint64_t kvt_prompt_cache_pinned_bytes(kvt_prompt_cache *pc) {
    if (!pc) return 0;
    pthread_mutex_lock(&pc->mu);
    uint64_t b = pc->pinned_bytes;
    pthread_mutex_unlock(&pc->mu);
    return b;
}
