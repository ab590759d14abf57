/*
 * block.c — the block pool and refcounted KV blocks (and recurrent snapshots' refcounting).
 *
 * Block state machine
 * -------------------
 *
 *     FREE ──kvt_block_alloc──▶ WRITING ──seal──▶ SEALED ──last kvt_block_release──▶ FREE
 *                                  │                                  ▲
 *                                  └──────last kvt_block_release──────┘
 *
 *   FREE     no memory; the pool budget does not count it.
 *   WRITING  refcount == 1, one owner (the sequence that allocated it, or an SSD restorer). The
 *            payload and n_tokens may change (kvt_block_data_mut, kvt_seq_write_kv, commit).
 *            hash/parent are not valid.
 *   SEALED   immutable: payload, tokens, n_tokens, parent and hash never change again. Full
 *            (n_tokens == block_tokens) or a frozen tail (0 < n_tokens < block_tokens). May be
 *            shared by any number of sequences and caches.
 *
 *   Transitions: alloc (kvt_block_alloc); seal (kvt_seq_commit for blocks that became full,
 *   kvt_seq_freeze_tail for partial tails, kvt_block_seal for blocks filled from outside); release
 *   (kvt_block_release when refcount drops to 0, from either state).
 *
 * Invariants (numbered; asserted where noted)
 * ----------
 *   (1) refcount >= 1 for every reachable block; releasing a block whose refcount is 0 is a bug
 *       (assert in kvt_block_release). The last release returns the bytes to the pool exactly once.
 *   (2) A block with refcount > 1 is never mutable: kvt_block_retain asserts SEALED, so a WRITING
 *       block always has exactly one reference (assert in retain and data_mut).
 *   (3) A SEALED block is never written and never un-sealed (asserts in data_mut, seal, and
 *       kvt_seq_write_kv / commit in seq.c).
 *   (4) For a SEALED block, hash == kvt_chain_hash(parent, tokens, n_tokens) and
 *       0 < n_tokens <= block_tokens (assert at seal time).
 *   (5) Payload bytes and codecs are a pure function of (group, index): bytes ==
 *       kvt_kv_layout_block_bytes(layout, group, index) (set at alloc, never changed).
 *   (6) pool.used == sum of bytes of all live blocks; with a budget, an allocation never takes
 *       used above budget; peak >= used (maintained under the pool mutex).
 *   (7) In a sequence (seq.c), the block at index i of every group has parent == chain(i-1) (root
 *       for i = 0) once sealed, full blocks have hash == chain(i), and a frozen (partial) tail is
 *       only ever the last block (asserted by the sequence checker in seq.c).
 *   (8) The next write of a sequence never touches a shared or sealed block: prepare() copies such
 *       a tail first (copy-on-write), so writes only see WRITING blocks with refcount 1 (3)+(2).
 */
#include <assert.h>
#include <stdlib.h>

#include "kv_int.h"

#include <sys/mman.h>

/* Payloads of at least this many bytes are anonymous mappings (page-aligned, zero-filled by the
 * kernel on first touch, transparent huge pages); smaller ones come from kvt_aligned_alloc. */
#define KVT_BLOCK_MMAP_MIN (1u << 20)
static void payload_free(uint8_t *data, size_t bytes) {
    if (!data) return;
    if (bytes >= KVT_BLOCK_MMAP_MIN) munmap(data, bytes);
    else free(data);
}

/* ------------------------------------------------------------------ pool */
kvt_block_pool *kvt_block_pool_create(const kvt_kv_layout *layout, uint64_t budget_bytes) {
    if (!layout) return NULL;
    kvt_kv_cpu_init(); /* f16 table + SIMD detection for the attention hot path */
    kvt_block_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->layout = layout;
    p->budget = budget_bytes;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

void kvt_block_pool_free(kvt_block_pool *p) {
    if (!p) return;
    if (p->n_blocks != 0)
        KVT_WARN("kv pool freed with %llu live blocks (%llu bytes)", (unsigned long long)p->n_blocks,
                 (unsigned long long)p->used);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

const kvt_kv_layout *kvt_block_pool_layout(const kvt_block_pool *p) { return p->layout; }

#define POOL_GET(field)                                                                                      \
    uint64_t v;                                                                                              \
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);                                                           \
    v = p->field;                                                                                            \
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);                                                         \
    return v

uint64_t kvt_block_pool_used_bytes(const kvt_block_pool *p) { POOL_GET(used); }
uint64_t kvt_block_pool_peak_bytes(const kvt_block_pool *p) { POOL_GET(peak); }
uint64_t kvt_block_pool_n_blocks(const kvt_block_pool *p) { POOL_GET(n_blocks); }
uint64_t kvt_block_pool_budget(const kvt_block_pool *p) { return p->budget; }

void kvt_block_pool_set_pressure(kvt_block_pool *p, kvt_pressure_fn fn, void *ctx) {
    pthread_mutex_lock(&p->mu);
    p->pressure = fn;
    p->pressure_ctx = ctx;
    pthread_mutex_unlock(&p->mu);
}

/* Reserve `bytes` of budget; calls the pressure callback outside the lock and retries while it
 * reports progress. */
static kvt_status pool_reserve(kvt_block_pool *p, uint64_t bytes) {
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->budget == 0 || p->used + bytes <= p->budget) {
            p->used += bytes;
            p->n_blocks++;
            if (p->used > p->peak) p->peak = p->used;
            pthread_mutex_unlock(&p->mu);
            return KVT_OK;
        }
        kvt_pressure_fn fn = p->pressure;
        void *ctx = p->pressure_ctx;
        uint64_t need = p->used + bytes - p->budget;
        pthread_mutex_unlock(&p->mu);
        if (!fn || !fn(ctx, need)) return KVT_ERR_POOL_EXHAUSTED;
    }
}

static void pool_unreserve(kvt_block_pool *p, uint64_t bytes) {
    pthread_mutex_lock(&p->mu);
    assert(p->used >= bytes && p->n_blocks > 0); /* invariant (6) */
    p->used -= bytes;
    p->n_blocks--;
    pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------------------ blocks */
kvt_status kvt_block_alloc(kvt_block_pool *p, uint32_t group, uint32_t block_index, kvt_block **out) {
    *out = NULL;
    const kvt_kv_layout *l = p->layout;
    if (group >= l->n_groups) return KVT_ERR_INVALID_ARG;
    size_t bytes = kvt_kv_layout_block_bytes(l, group, block_index);
    kvt_status st = pool_reserve(p, bytes);
    if (st != KVT_OK) return st;
    kvt_block *b = calloc(1, sizeof *b);
    int32_t *tokens = calloc(l->block_tokens, sizeof(int32_t));
    /* page-aligned payloads let the SSD tier restore with O_DIRECT straight into block memory */
    uint8_t *data = NULL;
    if (bytes >= KVT_BLOCK_MMAP_MIN) { /* zero-filled lazily by the kernel: no memset, no upfront faults */
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            data = m;
#ifdef MADV_HUGEPAGE
            madvise(data, bytes, MADV_HUGEPAGE); /* 2 MiB pages: 512x fewer page faults */
#endif
        }
    } else {
        data = kvt_aligned_alloc(bytes >= 4096 ? 4096 : 64, bytes);
    }
    if (!b || !tokens || !data) {
        free(b);
        free(tokens);
        payload_free(data, bytes);
        pool_unreserve(p, bytes);
        return KVT_ERR_NOMEM;
    }
    b->pool = p;
    atomic_init(&b->refcount, 1);
    atomic_init(&b->state, KVT_BLOCK_WRITING);
    atomic_init(&b->last_use, kvt_now_ns());
    b->group = group;
    b->index = block_index;
    b->bytes = bytes;
    b->data = data;
    b->tokens = tokens;
    *out = b;
    return KVT_OK;
}

void kvt_block_retain(kvt_block *b) {
    assert(atomic_load(&b->state) == KVT_BLOCK_SEALED); /* invariant (2) */
    uint32_t old = atomic_fetch_add_explicit(&b->refcount, 1, memory_order_relaxed);
    assert(old >= 1); /* invariant (1) */
    (void)old;
}

void kvt_block_release(kvt_block *b) {
    if (!b) return;
    uint32_t old = atomic_fetch_sub_explicit(&b->refcount, 1, memory_order_acq_rel);
    assert(old >= 1); /* invariant (1) */
    if (old != 1) return;
    kvt_block_pool *p = b->pool;
    size_t bytes = b->bytes;
    payload_free(b->data, bytes);
    free(b->tokens);
    free(b);
    pool_unreserve(p, bytes);
}

uint32_t kvt_block_refcount(const kvt_block *b) { return atomic_load(&((kvt_block *)b)->refcount); }
bool kvt_block_sealed(const kvt_block *b) {
    return atomic_load_explicit(&((kvt_block *)b)->state, memory_order_acquire) == KVT_BLOCK_SEALED;
}
uint32_t kvt_block_group(const kvt_block *b) { return b->group; }
uint32_t kvt_block_index(const kvt_block *b) { return b->index; }
uint32_t kvt_block_n_tokens(const kvt_block *b) { return b->n_tokens; }
const int32_t *kvt_block_tokens(const kvt_block *b) { return b->tokens; }
uint64_t kvt_block_hash(const kvt_block *b) { return b->hash; }
uint64_t kvt_block_parent(const kvt_block *b) { return b->parent; }
const uint8_t *kvt_block_data(const kvt_block *b) { return b->data; }
size_t kvt_block_data_bytes(const kvt_block *b) { return b->bytes; }
kvt_block_pool *kvt_block_pool_of(const kvt_block *b) { return b->pool; }

uint8_t *kvt_block_data_mut(kvt_block *b) {
    assert(!kvt_block_sealed(b));              /* invariant (3) */
    assert(atomic_load(&b->refcount) == 1);    /* invariant (2) */
    return b->data;
}

/* Seal with the tokens already stored in b->tokens[0..n_tokens). */
void kvt_block_seal_hashed(kvt_block *b, uint64_t parent, uint32_t n_tokens, uint64_t hash) {
    assert(!kvt_block_sealed(b));                                            /* invariant (3) */
    assert(n_tokens > 0 && n_tokens <= b->pool->layout->block_tokens);       /* invariant (4) */
    b->n_tokens = n_tokens;
    b->parent = parent;
    b->hash = hash; /* invariant (4): the caller computed it from this parent and these tokens */
    atomic_store_explicit(&b->state, KVT_BLOCK_SEALED, memory_order_release);
}

void kvt_block_seal_internal(kvt_block *b, uint64_t parent, uint32_t n_tokens) {
    kvt_block_seal_hashed(b, parent, n_tokens, kvt_chain_hash(parent, b->tokens, n_tokens));
}

kvt_status kvt_block_seal(kvt_block *b, uint64_t parent, const int32_t *tokens, uint32_t n_tokens,
                          uint64_t expect_hash) {
    if (kvt_block_sealed(b)) return KVT_ERR_INVALID_ARG;
    if (n_tokens == 0 || n_tokens > b->pool->layout->block_tokens || !tokens) return KVT_ERR_INVALID_ARG;
    uint64_t h = kvt_chain_hash(parent, tokens, n_tokens);
    if (expect_hash != 0 && h != expect_hash) return KVT_ERR_CORRUPT;
    memcpy(b->tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    kvt_block_seal_internal(b, parent, n_tokens);
    return KVT_OK;
}

void kvt_block_touch(kvt_block *b) { atomic_store_explicit(&b->last_use, kvt_now_ns(), memory_order_relaxed); }
uint64_t kvt_block_last_use(const kvt_block *b) {
    return atomic_load_explicit(&((kvt_block *)b)->last_use, memory_order_relaxed);
}

/* ------------------------------------------------------------------ snapshots */
uint32_t kvt_snapshot_pos(const kvt_snapshot *s) { return s->pos; }
uint64_t kvt_snapshot_chain(const kvt_snapshot *s) { return s->chain; }
const uint8_t *kvt_snapshot_data(const kvt_snapshot *s) { return s->data; }

void kvt_snapshot_retain(kvt_snapshot *s) {
    uint32_t old = atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
    assert(old >= 1);
    (void)old;
}

void kvt_snapshot_release(kvt_snapshot *s) {
    if (!s) return;
    uint32_t old = atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel);
    assert(old >= 1);
    if (old != 1) return;
    free(s->data);
    free(s);
}
