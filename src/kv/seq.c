/*
 * seq.c — sequences: per-group block lists, committed tokens, chain hashes and recurrent state.
 *
 * A sequence holds one reference to every block it lists. Blocks below len/block_tokens are full
 * and SEALED; the block containing position len (the tail) is either WRITING and owned only by this
 * sequence, or SEALED/shared (after clone, freeze_tail, trim or append_blocks) in which case the
 * next prepare() copies it first. WINDOW groups drop (release and NULL) blocks whose last position
 * is <= len - window: no later query can see them. The chain hashes of dropped blocks are kept, so
 * caches can still identify positions, and can_trim() reports cuts that would need them as
 * untrimmable. See block.c for the block state machine and numbered invariants.
 */
#include <assert.h>
#include <stdlib.h>

#include "kv_int.h"

static uint64_t parent_of(const kvt_seq *s, uint32_t i) { return i == 0 ? s->root : s->chain[i - 1]; }

static bool has_recurrent(const kvt_kv_layout *l) { return l->state_bytes > 0; }

/* Chain hash of full block i (tokens already in s->tokens, parent = parent_of(s, i)): taken from
 * the attached request chain when it covers block i with the same parent and tokens (computed once
 * per request, shared with the tiers' lookups), else hashed here. */
static uint64_t block_chain(const kvt_seq *s, uint32_t i, uint64_t parent) {
    const uint32_t bt = s->layout->block_tokens;
    const int32_t *t = s->tokens + (size_t)i * bt;
    const kvt_chain *c = s->hint;
    if (c && kvt_chain_block_tokens(c) == bt && i < kvt_chain_n_full(c) && kvt_chain_at(c, i) == parent &&
        memcmp(kvt_chain_tokens(c) + (size_t)i * bt, t, (size_t)bt * sizeof(int32_t)) == 0)
        return kvt_chain_at(c, i + 1);
    return kvt_chain_hash(parent, t, bt);
}

void kvt_seq_set_chain(kvt_seq *s, kvt_chain *c) {
    if (c) kvt_chain_retain(c);
    kvt_chain_release(s->hint);
    s->hint = c;
}

/* Invariant (7)/(8) checker: chain links, sealed full blocks, writable tail/prepared blocks. */
static void seq_check(const kvt_seq *s) {
#ifndef NDEBUG
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, n_full = s->len / bt;
    assert(s->len <= s->prepared);
    assert((uint64_t)s->n_slots * bt >= s->prepared);
    for (uint32_t g = 0; g < l->n_groups; g++) {
        for (uint32_t i = 0; i < s->n_slots; i++) {
            const kvt_block *b = s->slots[g][i];
            if (!b) {
                assert(l->groups[g].kind == KVT_KIND_WINDOW && i < n_full);
                continue;
            }
            assert(b->group == g && b->index == i);
            if (i < n_full) {
                assert(kvt_block_sealed(b) && b->n_tokens == bt);
                assert(b->parent == parent_of(s, i) && b->hash == s->chain[i]);
            } else if (!kvt_block_sealed(b)) {
                assert(atomic_load(&((kvt_block *)b)->refcount) == 1);
            } else {
                /* a sealed block at/after len: only the tail, and it must extend our chain */
                assert(i == n_full && b->parent == parent_of(s, i));
            }
        }
    }
#else
    (void)s;
#endif
}

static kvt_status reserve_slots(kvt_seq *s, uint32_t n) {
    if (n <= s->cap_slots) return KVT_OK;
    uint32_t cap = s->cap_slots ? s->cap_slots : 8;
    while (cap < n) cap = cap > UINT32_MAX / 2 ? n : cap * 2;
    for (uint32_t g = 0; g < s->layout->n_groups; g++) {
        kvt_block **p = realloc(s->slots[g], (size_t)cap * sizeof *p);
        if (!p) return KVT_ERR_NOMEM;
        memset(p + s->cap_slots, 0, (size_t)(cap - s->cap_slots) * sizeof *p);
        s->slots[g] = p;
    }
    uint64_t *c = realloc(s->chain, (size_t)cap * sizeof *c);
    if (!c) return KVT_ERR_NOMEM;
    memset(c + s->cap_slots, 0, (size_t)(cap - s->cap_slots) * sizeof *c);
    s->chain = c;
    s->cap_slots = cap;
    return KVT_OK;
}

static kvt_status reserve_tokens(kvt_seq *s, uint32_t n) {
    if (n <= s->cap_tokens) return KVT_OK;
    uint32_t cap = s->cap_tokens ? s->cap_tokens : 256;
    while (cap < n) cap = cap > UINT32_MAX / 2 ? n : cap * 2;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
    if (!t) return KVT_ERR_NOMEM;
    s->tokens = t;
    s->cap_tokens = cap;
    return KVT_OK;
}

kvt_status kvt_seq_create(kvt_block_pool *p, uint64_t root, kvt_seq **out) {
    *out = NULL;
    if (!p) return KVT_ERR_INVALID_ARG;
    kvt_seq *s = calloc(1, sizeof *s);
    if (!s) return KVT_ERR_NOMEM;
    s->pool = p;
    s->layout = p->layout;
    s->root = root;
    if (s->layout->state_bytes) {
        s->state = kvt_aligned_alloc(64, s->layout->state_bytes);
        if (!s->state) {
            free(s);
            return KVT_ERR_NOMEM;
        }
    }
    *out = s;
    return KVT_OK;
}

void kvt_seq_free(kvt_seq *s) {
    if (!s) return;
    for (uint32_t g = 0; g < s->layout->n_groups; g++) {
        for (uint32_t i = 0; i < s->n_slots; i++) kvt_block_release(s->slots[g][i]);
        free(s->slots[g]);
    }
    free(s->chain);
    free(s->tokens);
    free(s->state);
    kvt_chain_release(s->hint);
    free(s);
}

kvt_block_pool *kvt_seq_pool(const kvt_seq *s) { return s->pool; }
uint64_t kvt_seq_root(const kvt_seq *s) { return s->root; }
uint32_t kvt_seq_len(const kvt_seq *s) { return s->len; }
const int32_t *kvt_seq_tokens(const kvt_seq *s) { return s->tokens; }

uint64_t kvt_seq_block_chain(const kvt_seq *s, uint32_t block_index) {
    if (block_index >= s->len / s->layout->block_tokens) return 0;
    return s->chain[block_index];
}

/* Chain hash of all committed tokens (root for an empty sequence; includes a partial tail). */
static uint64_t seq_chain_now(const kvt_seq *s) {
    const uint32_t bt = s->layout->block_tokens, i = s->len / bt, r = s->len % bt;
    if (r == 0) return parent_of(s, i);
    return kvt_chain_hash(parent_of(s, i), s->tokens + (size_t)i * bt, r);
}

/* Release WINDOW blocks that no query at position >= len - rollback can see: last position
 * <= len - rollback - window (kvt_seq_set_rollback; rollback 0: the blocks no later query sees). */
static void window_release(kvt_seq *s) {
    const kvt_kv_layout *l = s->layout;
    const uint64_t bt = l->block_tokens;
    for (uint32_t g = 0; g < l->n_groups; g++) {
        if (l->groups[g].kind != KVT_KIND_WINDOW) continue;
        const uint64_t w = (uint64_t)l->groups[g].window + s->rollback;
        uint32_t i = s->first_held[g];
        while (i < s->n_slots && (i + 1) * bt <= s->len && (i + 1) * bt - 1 + w <= s->len) {
            kvt_block_release(s->slots[g][i]);
            s->slots[g][i] = NULL;
            i++;
        }
        s->first_held[g] = i;
    }
}

/* A private writable copy of block `old` (payload and its first n_tok tokens). */
static kvt_status cow_copy(kvt_seq *s, const kvt_block *old, uint32_t n_tok, kvt_block **out) {
    kvt_status st = kvt_block_alloc(s->pool, old->group, old->index, out);
    if (st != KVT_OK) return st;
    assert((*out)->bytes == old->bytes); /* invariant (5) */
    memcpy((*out)->data, old->data, old->bytes);
    memcpy((*out)->tokens, old->tokens, (size_t)n_tok * sizeof(int32_t));
    (*out)->n_tokens = n_tok;
    return KVT_OK;
}

kvt_status kvt_seq_prepare(kvt_seq *s, uint32_t n_new) {
    if (n_new == 0) return KVT_OK;
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, ng = l->n_groups;
    uint64_t target = (uint64_t)s->len + n_new;
    if (target > UINT32_MAX - bt) return KVT_ERR_RANGE;
    const uint32_t first = s->len / bt, last = (uint32_t)((target - 1) / bt);
    kvt_status st = reserve_slots(s, last + 1);
    if (st == KVT_OK) st = reserve_tokens(s, (uint32_t)target);
    if (st != KVT_OK) return st;
    if (ng == 0) { /* recurrent-only model: nothing to allocate */
        if (target > s->prepared) s->prepared = (uint32_t)target;
        return KVT_OK;
    }
    const uint32_t n_idx = last - first + 1;
    kvt_block **fresh = calloc((size_t)n_idx * ng, sizeof *fresh);
    if (!fresh) return KVT_ERR_NOMEM;
    /* Allocate everything first so a failure leaves the sequence untouched. */
    for (uint32_t i = first; i <= last && st == KVT_OK; i++) {
        uint32_t committed = s->len > (uint64_t)i * bt ? KVT_MIN(bt, s->len - i * bt) : 0;
        for (uint32_t g = 0; g < ng && st == KVT_OK; g++) {
            kvt_block *b = i < s->n_slots ? s->slots[g][i] : NULL;
            kvt_block **dst = &fresh[(size_t)(i - first) * ng + g];
            if (b && !kvt_block_sealed(b) && kvt_block_refcount(b) == 1) continue; /* already ours */
            assert(b || i >= s->n_slots); /* the tail is never dropped */
            if (b) st = cow_copy(s, b, committed, dst); /* invariant (8): never write shared/sealed */
            else st = kvt_block_alloc(s->pool, g, i, dst);
        }
    }
    if (st != KVT_OK) {
        for (size_t k = 0; k < (size_t)n_idx * ng; k++) kvt_block_release(fresh[k]);
        free(fresh);
        return st;
    }
    for (uint32_t i = first; i <= last; i++) {
        for (uint32_t g = 0; g < ng; g++) {
            kvt_block *nb = fresh[(size_t)(i - first) * ng + g];
            if (!nb) continue;
            if (i < s->n_slots) kvt_block_release(s->slots[g][i]);
            s->slots[g][i] = nb;
        }
    }
    free(fresh);
    if (last + 1 > s->n_slots) s->n_slots = last + 1;
    if (target > s->prepared) s->prepared = (uint32_t)target;
    seq_check(s);
    return KVT_OK;
}

void kvt_seq_write_kv(kvt_seq *s, uint32_t layer, uint32_t pos, const float *k, const float *v) {
    assert(layer < s->layout->n_layers);
    kvt_seq_write_kv_heads(s, layer, pos, k, v, 0, s->layout->layers[layer].n_kv_heads);
}

void kvt_seq_write_kv_heads(kvt_seq *s, uint32_t layer, uint32_t pos, const float *k, const float *v, uint32_t h0,
                            uint32_t h1) {
    const kvt_kv_layout *l = s->layout;
    assert(layer < l->n_layers && l->info[layer].group != UINT32_MAX);
    assert(pos >= s->len && pos < s->prepared); /* caller contract: prepare() first */
    const kvt_layer_info *li = &l->info[layer];
    const kvt_layer_desc *d = &l->layers[layer];
    assert(h0 <= h1 && h1 <= d->n_kv_heads);
    const uint32_t bt = l->block_tokens, i = pos / bt, t = pos % bt;
    kvt_block *b = s->slots[li->group][i];
    assert(b && !kvt_block_sealed(b) && kvt_block_refcount(b) == 1); /* invariants (2), (3), (8) */
    const int var = kvt_layout_variant(l, i);
    for (int kv = 0; kv < 2; kv++) {
        const kvt_codec c = kvt_codec_side(li->codec[var], kv);
        const float *src = kv ? v : k;
        const uint32_t hd = kv ? d->head_dim_v : d->head_dim_k;
        const size_t rb = li->row_bytes[var][kv];
        if (rb == 0) continue; /* MLA: no V section */
        /* section layout [kv_head][token]: row (h, t) at (h*bt + t) * rb */
        uint8_t *base = b->data + li->offset[var][kv] + (size_t)t * rb;
        for (uint32_t h = h0; h < h1; h++) {
            const float *x = src + (size_t)h * hd;
            float rot[KVT_TURBO_MAX_DIM];
            if (c.kind == KVT_CODEC_TURBO) { /* TURBO rows hold the rotated vector (turbo.c) */
                kvt_turbo_rotate(layer, kv, h, x, hd, rot);
                x = rot;
            }
            kvt_codec_encode_row(c, x, hd, base + (size_t)h * bt * rb);
        }
    }
}

void kvt_seq_read_rows(const kvt_seq *s, uint32_t layer, int kv, uint32_t head, uint32_t t0, uint32_t t1, float *out,
                       size_t ld) {
    const kvt_kv_layout *l = s->layout;
    assert(layer < l->n_layers && l->info[layer].group != UINT32_MAX);
    assert(t0 <= t1 && t1 <= s->prepared);
    const kvt_layer_info *li = &l->info[layer];
    const kvt_layer_desc *d = &l->layers[layer];
    assert(head < d->n_kv_heads);
    const uint32_t bt = l->block_tokens, hd = kv ? d->head_dim_v : d->head_dim_k;
    for (uint32_t p = t0; p < t1; p++) {
        const uint32_t i = p / bt, t = p % bt;
        const kvt_block *b = s->slots[li->group][i];
        const int var = kvt_layout_variant(l, i);
        const kvt_codec c = kvt_codec_side(li->codec[var], kv);
        const size_t rb = li->row_bytes[var][kv];
        assert(b && rb); /* a held block; not the (absent) V section of an MLA layer */
        float *o = out + (size_t)(p - t0) * ld;
        kvt_codec_decode_row(c, b->data + li->offset[var][kv] + ((size_t)head * bt + t) * rb, hd, o);
        if (c.kind == KVT_CODEC_TURBO) kvt_turbo_unrotate(layer, kv, head, o, hd, o);
    }
}

kvt_status kvt_seq_commit(kvt_seq *s, const int32_t *tokens, uint32_t n) {
    if (n == 0) return KVT_OK;
    if (!tokens || (uint64_t)s->len + n > s->prepared) return KVT_ERR_INVALID_ARG;
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, ng = l->n_groups;
    const uint32_t end = s->len + n;
    memcpy(s->tokens + s->len, tokens, (size_t)n * sizeof(int32_t)); /* reserved by prepare */
    for (uint32_t i = s->len / bt; ng > 0 && i <= (end - 1) / bt; i++) {
        const uint32_t p0 = KVT_MAX(s->len, i * bt), p1 = KVT_MIN(end, (i + 1) * bt);
        for (uint32_t g = 0; g < ng; g++) {
            kvt_block *b = s->slots[g][i];
            assert(b && !kvt_block_sealed(b)); /* invariant (3) */
            memcpy(b->tokens + (p0 - i * bt), s->tokens + p0, (size_t)(p1 - p0) * sizeof(int32_t));
            b->n_tokens = p1 - i * bt;
        }
        if (p1 == (i + 1) * bt) { /* became full: seal every group's block with the same chain hash */
            const uint64_t parent = parent_of(s, i);
            const uint64_t h = block_chain(s, i, parent); /* once for all groups */
            for (uint32_t g = 0; g < ng; g++) kvt_block_seal_hashed(s->slots[g][i], parent, bt, h);
            s->chain[i] = h;
        }
    }
    if (ng == 0) {
        for (uint32_t i = s->len / bt; i < end / bt; i++) s->chain[i] = block_chain(s, i, parent_of(s, i));
    }
    s->len = end;
    window_release(s);
    seq_check(s);
    return KVT_OK;
}

uint32_t kvt_seq_n_blocks(const kvt_seq *s) {
    const uint32_t bt = s->layout->block_tokens;
    return (uint32_t)(((uint64_t)s->len + bt - 1) / bt);
}

kvt_block *kvt_seq_block(const kvt_seq *s, uint32_t group, uint32_t block_index) {
    if (group >= s->layout->n_groups || block_index >= kvt_seq_n_blocks(s) || block_index >= s->n_slots)
        return NULL;
    return s->slots[group][block_index];
}

kvt_status kvt_seq_freeze_tail(kvt_seq *s) {
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, ng = l->n_groups, r = s->len % bt, i = s->len / bt;
    if (r == 0 || ng == 0) return KVT_OK;
    kvt_block *fresh[KVT_MAX_GROUPS] = {0};
    kvt_status st = KVT_OK;
    for (uint32_t g = 0; g < ng && st == KVT_OK; g++) {
        kvt_block *b = s->slots[g][i];
        assert(b); /* the tail is never dropped */
        /* A sealed tail holding more tokens than we committed (after trim) gets a private copy. */
        if (kvt_block_sealed(b) && b->n_tokens != r) st = cow_copy(s, b, r, &fresh[g]);
    }
    if (st != KVT_OK) {
        for (uint32_t g = 0; g < ng; g++) kvt_block_release(fresh[g]);
        return st;
    }
    const uint64_t parent = parent_of(s, i);
    uint64_t h = 0;
    bool hashed = false;
    for (uint32_t g = 0; g < ng; g++) {
        if (fresh[g]) {
            kvt_block_release(s->slots[g][i]);
            s->slots[g][i] = fresh[g];
        }
        kvt_block *b = s->slots[g][i];
        if (kvt_block_sealed(b)) continue;
        assert(memcmp(b->tokens, s->tokens + (size_t)i * bt, (size_t)r * sizeof(int32_t)) == 0);
        if (!hashed) { /* once for all groups (same parent and tokens) */
            h = kvt_chain_hash(parent, s->tokens + (size_t)i * bt, r);
            hashed = true;
        }
        kvt_block_seal_hashed(b, parent, r, h);
    }
    seq_check(s);
    return KVT_OK;
}

kvt_status kvt_seq_clone(kvt_seq *src, kvt_seq **out) {
    *out = NULL;
    kvt_status st = kvt_seq_freeze_tail(src);
    if (st != KVT_OK) return st;
    const kvt_kv_layout *l = src->layout;
    kvt_seq *d;
    st = kvt_seq_create(src->pool, src->root, &d);
    if (st != KVT_OK) return st;
    const uint32_t nb = kvt_seq_n_blocks(src);
    st = reserve_slots(d, nb);
    if (st == KVT_OK) st = reserve_tokens(d, src->len);
    if (st != KVT_OK) {
        kvt_seq_free(d);
        return st;
    }
    if (src->len) memcpy(d->tokens, src->tokens, (size_t)src->len * sizeof(int32_t));
    if (nb) memcpy(d->chain, src->chain, (size_t)nb * sizeof(uint64_t));
    for (uint32_t g = 0; g < l->n_groups; g++) {
        for (uint32_t i = 0; i < nb; i++) {
            kvt_block *b = src->slots[g][i];
            if (b) kvt_block_retain(b); /* asserts sealed: invariant (2) */
            d->slots[g][i] = b;
        }
        d->first_held[g] = KVT_MIN(src->first_held[g], nb);
    }
    if (l->state_bytes) memcpy(d->state, src->state, l->state_bytes);
    d->n_slots = nb;
    d->len = d->prepared = src->len;
    seq_check(d);
    *out = d;
    return KVT_OK;
}

void kvt_seq_set_rollback(kvt_seq *s, uint32_t n) { s->rollback = n; }

bool kvt_seq_can_trim(const kvt_seq *s, uint32_t n) {
    if (n > s->len) return false;
    if (n == s->len) return true;
    const kvt_kv_layout *l = s->layout;
    if (has_recurrent(l)) return false;
    const uint32_t bt = l->block_tokens;
    if (n == 0) return true;
    for (uint32_t g = 0; g < l->n_groups; g++) {
        if (l->groups[g].kind != KVT_KIND_WINDOW) continue;
        /* The next query (at position n) sees keys in (n - window, n): those blocks must be held. */
        const uint64_t w = l->groups[g].window;
        const uint32_t lo = (uint64_t)n + 1 > w ? (uint32_t)(n + 1 - w) : 0;
        for (uint32_t i = lo / bt; i <= (n - 1) / bt; i++)
            if (i >= s->n_slots || !s->slots[g][i]) return false;
    }
    return true;
}

kvt_status kvt_seq_trim(kvt_seq *s, uint32_t n) {
    if (n > s->len) return KVT_ERR_INVALID_ARG;
    if (n == s->len) return KVT_OK;
    if (!kvt_seq_can_trim(s, n)) return KVT_ERR_UNTRIMMABLE;
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, keep = (n + bt - 1) / bt;
    for (uint32_t g = 0; g < l->n_groups; g++) {
        for (uint32_t i = keep; i < s->n_slots; i++) {
            kvt_block_release(s->slots[g][i]);
            s->slots[g][i] = NULL;
        }
        if (n % bt) {
            kvt_block *b = s->slots[g][n / bt];
            /* An own writable tail just forgets the cut tokens; a sealed one is copied by the next
             * prepare()/freeze_tail() (invariant (3)). */
            if (b && !kvt_block_sealed(b)) b->n_tokens = n % bt;
        }
        if (s->first_held[g] > keep) s->first_held[g] = keep;
    }
    s->n_slots = keep;
    s->len = s->prepared = n;
    seq_check(s);
    return KVT_OK;
}

kvt_status kvt_seq_append_blocks(kvt_seq *s, kvt_block *const *blocks) {
    const kvt_kv_layout *l = s->layout;
    const uint32_t bt = l->block_tokens, ng = l->n_groups;
    if (!blocks || ng == 0) return KVT_ERR_INVALID_ARG;
    /* Only after whole blocks (a frozen partial tail may only be the last block appended) and with
     * no prepared-but-uncommitted blocks. */
    if (s->len % bt != 0 || s->n_slots != s->len / bt) return KVT_ERR_INVALID_ARG;
    const uint32_t i = s->len / bt;
    const uint64_t parent = parent_of(s, i);
    const kvt_block *ref = NULL;
    for (uint32_t g = 0; g < ng; g++) {
        const kvt_block *b = blocks[g];
        if (!b) {
            if (l->groups[g].kind != KVT_KIND_WINDOW) return KVT_ERR_INVALID_ARG;
            continue;
        }
        if (!kvt_block_sealed(b) || b->group != g || b->index != i || b->parent != parent ||
            b->pool->layout != l || b->n_tokens == 0 || b->n_tokens > bt)
            return KVT_ERR_INVALID_ARG;
        if (ref && (b->n_tokens != ref->n_tokens || b->hash != ref->hash ||
                    memcmp(b->tokens, ref->tokens, (size_t)b->n_tokens * sizeof(int32_t)) != 0))
            return KVT_ERR_INVALID_ARG;
        if (!ref) ref = b;
    }
    if (!ref) return KVT_ERR_INVALID_ARG; /* tokens unknown */
    const uint32_t n = ref->n_tokens;
    if ((uint64_t)s->len + n > UINT32_MAX - bt) return KVT_ERR_RANGE;
    kvt_status st = reserve_slots(s, i + 1);
    if (st == KVT_OK) st = reserve_tokens(s, s->len + n);
    if (st != KVT_OK) return st;
    for (uint32_t g = 0; g < ng; g++) {
        if (blocks[g]) kvt_block_retain(blocks[g]);
        s->slots[g][i] = blocks[g];
    }
    memcpy(s->tokens + s->len, ref->tokens, (size_t)n * sizeof(int32_t));
    if (n == bt) s->chain[i] = ref->hash;
    s->n_slots = i + 1;
    s->len = s->prepared = s->len + n;
    window_release(s);
    seq_check(s);
    return KVT_OK;
}

/* ------------------------------------------------------------------ recurrent state */
uint8_t *kvt_seq_state(kvt_seq *s, uint32_t layer) {
    const kvt_kv_layout *l = s->layout;
    if (layer >= l->n_layers || l->layers[layer].kind != KVT_KIND_RECURRENT) return NULL;
    return s->state + l->info[layer].state_offset;
}

kvt_status kvt_seq_snapshot(kvt_seq *s, kvt_snapshot **out) {
    *out = NULL;
    const size_t bytes = s->layout->state_bytes;
    kvt_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return KVT_ERR_NOMEM;
    snap->data = malloc(bytes ? bytes : 1);
    if (!snap->data) {
        free(snap);
        return KVT_ERR_NOMEM;
    }
    if (bytes) memcpy(snap->data, s->state, bytes);
    atomic_init(&snap->refcount, 1);
    snap->bytes = bytes;
    snap->pos = s->len;
    snap->chain = seq_chain_now(s);
    *out = snap;
    return KVT_OK;
}

kvt_status kvt_seq_restore_snapshot(kvt_seq *s, const kvt_snapshot *snap) {
    if (!snap || snap->pos != s->len || snap->bytes != s->layout->state_bytes) return KVT_ERR_INVALID_ARG;
    if (snap->chain != seq_chain_now(s)) return KVT_ERR_INVALID_ARG;
    if (snap->bytes) memcpy(s->state, snap->data, snap->bytes);
    return KVT_OK;
}
