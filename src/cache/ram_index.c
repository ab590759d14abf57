/*
 * ram_index.c — the RAM tier's index: a forest of units, a hash map of NODEs and one LRU list
 * (prompt_cache.h is the API, prompt_cache.c the tier's lookup and put, docs/ram-tier.md).
 *
 * Units
 * -----
 * One tree per root (= compatibility key + namespace):
 *   ROOT  a pseudo-node per root hash; holds nothing, lives while it has children.
 *   NODE  one full block position of a chain: key = chain hash of the tokens up to the block's end.
 *         Holds a copy of the block's tokens and one block reference per group (a WINDOW group's
 *         entry may be NULL when every sequence that registered it had dropped that block).
 *   TAIL  a frozen partial block (n_tok < block_tokens) under its parent NODE/ROOT; one block per
 *         group.
 *   SNAP  a recurrent snapshot at position index*block_tokens + n_tok under its parent NODE/ROOT
 *         (n_tok tokens of the partial block it ends in are copied for verification).
 * NODEs are found through the map keyed by chain hash (lookups also compare the parent unit and the
 * tokens, so a 64-bit collision can never alias KV); TAIL/SNAP units through their parent's child
 * list. Eviction takes the least recently used *leaf*.
 *
 * States of a non-ROOT unit
 * -------------------------
 *   ATTACHED --kvt_ram_unit_detach (under the lock)--> DETACHED --kvt_ram_dispose_units (lock
 *   released)--> freed.
 * ATTACHED units are reachable (parent's child list, LRU list, map if NODE); a DETACHED unit is
 * reachable only from the unit_vec of the call that detached it, which disposes of it.
 *
 * Invariants (under pc->mu; kvt_ram_check verifies R1-R4 and R8)
 * ----------
 *   R1. Every ATTACHED unit's parent is an ATTACHED NODE or a ROOT on pc->roots, and the unit is on
 *       its parent's child list exactly once; n_children counts that list. A ROOT lives only while
 *       it has children (the last detach under it frees it).
 *   R2. An ATTACHED NODE has n_tok = block_tokens and is in the map under its key; no other unit is
 *       in the map. A TAIL has 0 < n_tok < block_tokens; a SNAP holds a snapshot and no block.
 *   R3. Every ATTACHED non-ROOT unit is on the LRU list exactly once (most recent first); ROOTs never.
 *   R4. The cache holds one reference to each non-NULL blocks[g] and snap of an ATTACHED unit;
 *       pc->bytes, pc->n_blocks and pc->n_units are the sums over ATTACHED units.
 *   R5. A unit with children is never detached (leaf-first): a NODE outlives its descendants.
 *   R6. Every detach advances pc->epoch: a plan (prompt_cache.c) that saw epoch e may use the unit
 *       pointers it holds while the epoch is still e.
 *   R7. Pool allocations, spill callbacks and block releases never run with pc->mu held (the pool's
 *       pressure hook re-enters the cache); a take retains what it needs under the lock and builds
 *       afterwards, an eviction detaches under the lock and disposes afterwards.
 *   R8. Pins: a unit's pins counts the pin records on pc->pins naming it (each names a unit at most
 *       once), and a unit with pins > 0 is never detached — not by the byte cap, memory pressure,
 *       idle demotion, a drain or supersession — except by kvt_prompt_cache_clear, which drops every
 *       pin record first. Enforced in one place: every other detach picks its unit through
 *       kvt_ram_detachable (R5 and R8). pc->pinned_bytes is the sum of bytes over units with
 *       pins > 0 and never exceeds pc->pin_budget when a pin is added (a pin over it is refused).
 */
#include "ram_int.h"

bool kvt_ram_uv_push(unit_vec *uv, pc_unit *u) {
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

uint64_t kvt_ram_now(kvt_prompt_cache *pc) { return pc->now_fn ? pc->now_fn(pc->now_ctx) : kvt_now_ns(); }

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
void kvt_ram_touch(kvt_prompt_cache *pc, pc_unit *u, uint64_t now) {
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
pc_unit *kvt_ram_map_find(const kvt_prompt_cache *pc, uint64_t key, const pc_unit *parent, const int32_t *toks) {
    for (pc_unit *u = pc->buckets[bucket_of(pc, key)]; u; u = u->hnext)
        if (u->key == key && u->parent == parent && memcmp(u->tokens, toks, (size_t)pc->bt * sizeof(int32_t)) == 0)
            return u;
    return NULL;
}

pc_unit *kvt_ram_root_find(const kvt_prompt_cache *pc, uint64_t root) {
    for (pc_unit *r = pc->roots; r; r = r->sib_next)
        if (r->key == root) return r;
    return NULL;
}

pc_unit *kvt_ram_root_get(kvt_prompt_cache *pc, uint64_t root) {
    pc_unit *r = kvt_ram_root_find(pc, root);
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

void kvt_ram_root_drop_if_empty(kvt_prompt_cache *pc, pc_unit *r) {
    if (r->kind != U_ROOT || r->n_children) return;
    if (r->sib_prev) r->sib_prev->sib_next = r->sib_next;
    else pc->roots = r->sib_next;
    if (r->sib_next) r->sib_next->sib_prev = r->sib_prev;
    free(r);
}

/* ------------------------------------------------------------------ units */

pc_unit *kvt_ram_unit_new(kvt_prompt_cache *pc, uint8_t kind, pc_unit *parent, uint32_t index,
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

void kvt_ram_unit_add_block(kvt_prompt_cache *pc, pc_unit *u, uint32_t g, kvt_block *b) {
    kvt_block_retain(b);
    u->blocks[g] = b;
    uint64_t nb = kvt_block_data_bytes(b);
    u->bytes += nb;
    u->n_blocks++;
    pc->bytes += nb;
    pc->n_blocks++;
    if (u->pins) pc->pinned_bytes += nb; /* R8 */
}

/* Removes a leaf unit from every structure (not its references: see dispose). */
void kvt_ram_unit_detach(kvt_prompt_cache *pc, pc_unit *u) {
    pc_unit *parent = u->parent;
    child_unlink(u);
    lru_unlink(u);
    if (u->kind == U_NODE) map_remove(pc, u);
    pc->bytes -= u->bytes;
    pc->n_blocks -= u->n_blocks;
    pc->n_units--;
    pc->epoch++;
    u->parent = NULL;
    kvt_ram_root_drop_if_empty(pc, parent);
}

static bool unit_cache_only(const kvt_prompt_cache *pc, const pc_unit *u) {
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (u->blocks[g] && kvt_block_refcount(u->blocks[g]) != 1) return false;
    return true; /* snapshots are not pool memory and never shared with live sequences */
}

void kvt_ram_dispose_units(const unit_vec *uv, uint32_t n_groups, kvt_spill_block_fn fb, kvt_spill_snapshot_fn fs,
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

bool kvt_ram_detachable(const pc_unit *u) { return !u->n_children && !u->pins; } /* R5 leaf-first, R8 */

/* Eviction candidates: the least recently used detachable leaf satisfying the mode. */
pc_unit *kvt_ram_pick_victim(kvt_prompt_cache *pc, int mode, uint64_t gen, uint64_t idle_cutoff) {
    for (pc_unit *u = pc->lru.lru_prev; u != &pc->lru; u = u->lru_prev) {
        if (!kvt_ram_detachable(u)) continue;
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

uint32_t kvt_ram_unit_groups(const kvt_prompt_cache *pc, const pc_unit *u) {
    uint32_t m = 0;
    for (uint32_t g = 0; g < pc->n_groups; g++)
        if (u->blocks[g]) m |= 1u << g;
    return m;
}

/* A NODE/TAIL child of `parent` whose first m tokens equal toks[0..m) and that holds a block for
 * every group (it supplies the last, possibly partial, block). `prefer` is tried first. */
pc_unit *kvt_ram_rows_unit(const kvt_prompt_cache *pc, pc_unit *parent, const int32_t *toks, uint32_t m,
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
uint32_t kvt_ram_walk_path(const kvt_prompt_cache *pc, pc_unit *R, const kvt_chain *c, pc_unit **P) {
    const uint32_t bt = pc->bt, nf = kvt_chain_n_full(c);
    const int32_t *prompt = kvt_chain_tokens(c);
    uint32_t k = 0;
    pc_unit *cur = R;
    while (k < nf) {
        const int32_t *t = prompt + (size_t)k * bt;
        pc_unit *node = kvt_ram_map_find(pc, kvt_chain_at(c, k + 1), cur, t);
        if (!node) break;
        P[k++] = node;
        cur = node;
    }
    return k;
}

/* The same under another root (namespace diagnostics only: those hashes are not the request's). */
uint32_t kvt_ram_walk_path_hashing(const kvt_prompt_cache *pc, pc_unit *R, const int32_t *prompt, uint32_t n, pc_unit **P) {
    uint32_t bt = pc->bt, k = 0;
    pc_unit *cur = R;
    while ((uint64_t)(k + 1) * bt <= n) {
        const int32_t *t = prompt + (size_t)k * bt;
        uint64_t h = kvt_chain_hash(cur->key, t, bt);
        pc_unit *node = kvt_ram_map_find(pc, h, cur, t);
        if (!node) break;
        P[k++] = node;
        cur = node;
    }
    return k;
}

/* Token match length under R (full-block path + best partial child), without usability checks. */
uint32_t kvt_ram_token_match(const kvt_prompt_cache *pc, pc_unit *R, pc_unit *const *P, uint32_t k,
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

/* ------------------------------------------------------------------ invariant check */

static bool check_tree(kvt_prompt_cache *pc, pc_unit *p, uint64_t *units, uint64_t *bytes, uint64_t *blocks,
                       uint64_t *pinned, uint64_t *pin_refs) {
    uint32_t n = 0;
    for (pc_unit *c = p->first_child; c; c = c->sib_next) {
        n++;
        if (c->parent != p || c->kind == U_ROOT || !c->lru_prev || !c->lru_next) return false; /* R1, R3 */
        if (c->kind == U_NODE && (c->n_tok != pc->bt || kvt_ram_map_find(pc, c->key, p, c->tokens) != c)) return false;
        if (c->kind == U_TAIL && (c->n_tok == 0 || c->n_tok >= pc->bt)) return false; /* R2 */
        if (c->kind == U_SNAP && !c->snap) return false;
        uint64_t b = 0;
        uint32_t nb = 0;
        for (uint32_t g = 0; g < pc->n_groups; g++)
            if (c->blocks[g]) {
                if (c->kind == U_SNAP) return false;
                b += kvt_block_data_bytes(c->blocks[g]);
                nb++;
            }
        if (nb != c->n_blocks) return false; /* R4 */
        *units += 1;
        *bytes += c->bytes;
        *blocks += nb;
        if (c->pins) *pinned += c->bytes; /* R8 */
        *pin_refs += c->pins;
        if (c->n_children && c->kind != U_NODE) return false;
        if (!check_tree(pc, c, units, bytes, blocks, pinned, pin_refs)) return false;
    }
    return n == p->n_children;
}

bool kvt_ram_check(kvt_prompt_cache *pc) {
    pthread_mutex_lock(&pc->mu);
    bool ok = true;
    uint64_t units = 0, bytes = 0, blocks = 0, lru = 0, pinned = 0, pin_refs = 0, rec_refs = 0;
    for (pc_unit *r = pc->roots; r && ok; r = r->sib_next)
        ok = r->kind == U_ROOT && r->n_children > 0 && check_tree(pc, r, &units, &bytes, &blocks, &pinned, &pin_refs); /* R1 */
    for (pc_pin *p = pc->pins; ok && p; p = p->next) /* R8: every unit a record names is attached and counts it */
        for (uint32_t i = 0; ok && i < p->n_units; i++) {
            ok = p->units[i]->parent && p->units[i]->pins > 0;
            rec_refs++;
        }
    for (pc_unit *u = pc->lru.lru_next; ok && u != &pc->lru; u = u->lru_next) {
        if (u->kind == U_ROOT || u->lru_next->lru_prev != u) ok = false; /* R3 */
        if (++lru > units) ok = false;
    }
    size_t in_map = 0;
    for (size_t i = 0; ok && i < pc->n_buckets; i++)
        for (pc_unit *u = pc->buckets[i]; u; u = u->hnext) {
            if (u->kind != U_NODE || !u->parent) ok = false; /* R2 */
            in_map++;
        }
    ok = ok && lru == units && units == pc->n_units && bytes == pc->bytes && blocks == pc->n_blocks &&
         in_map == pc->n_nodes && pinned == pc->pinned_bytes && pin_refs == rec_refs; /* R3, R4, R8 */
    pthread_mutex_unlock(&pc->mu);
    return ok;
}
