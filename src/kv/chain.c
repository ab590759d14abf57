/* chain.c — a request's chain hashes, computed once (see kv.h, "A request's chain"). */
#include <stdatomic.h>
#include <stdlib.h>

#include "kv_int.h"

struct kvt_chain {
    atomic_uint refcount;
    uint32_t n, bt, n_full;
    int32_t *tokens; /* [n] */
    uint64_t h[];    /* [n_full + 1]: h[0] = root */
};

kvt_status kvt_chain_create(uint64_t root, const int32_t *tokens, uint32_t n, uint32_t block_tokens, kvt_chain **out) {
    *out = NULL;
    if (block_tokens == 0 || (!tokens && n)) return KVT_ERR_INVALID_ARG;
    const uint32_t n_full = n / block_tokens;
    kvt_chain *c = malloc(sizeof(*c) + ((size_t)n_full + 1) * sizeof(uint64_t));
    if (!c) return KVT_ERR_NOMEM;
    c->tokens = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!c->tokens) {
        free(c);
        return KVT_ERR_NOMEM;
    }
    if (n) memcpy(c->tokens, tokens, (size_t)n * sizeof(int32_t));
    atomic_init(&c->refcount, 1);
    c->n = n;
    c->bt = block_tokens;
    c->n_full = n_full;
    c->h[0] = root;
    for (uint32_t i = 0; i < n_full; i++) c->h[i + 1] = kvt_chain_hash(c->h[i], c->tokens + (size_t)i * block_tokens, block_tokens);
    *out = c;
    return KVT_OK;
}

void kvt_chain_retain(kvt_chain *c) { atomic_fetch_add_explicit(&c->refcount, 1, memory_order_relaxed); }

void kvt_chain_release(kvt_chain *c) {
    if (!c || atomic_fetch_sub_explicit(&c->refcount, 1, memory_order_acq_rel) != 1) return;
    free(c->tokens);
    free(c);
}

uint64_t kvt_chain_root(const kvt_chain *c) { return c->h[0]; }
uint32_t kvt_chain_len(const kvt_chain *c) { return c->n; }
uint32_t kvt_chain_block_tokens(const kvt_chain *c) { return c->bt; }
uint32_t kvt_chain_n_full(const kvt_chain *c) { return c->n_full; }
const int32_t *kvt_chain_tokens(const kvt_chain *c) { return c->tokens; }
uint64_t kvt_chain_at(const kvt_chain *c, uint32_t i) { return i <= c->n_full ? c->h[i] : 0; }
