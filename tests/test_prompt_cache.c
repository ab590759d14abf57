/* test_prompt_cache.c — the RAM tier over real KV blocks (small layouts, deterministic data). */
#include "testutil.h"

#include <math.h>
#include <pthread.h>

#include "cache/prompt_cache.h"
#include "cache/ram_int.h"

/* ------------------------------------------------------------------ fixtures */

enum { LAY_FULL, LAY_WINDOW, LAY_RECURRENT };
#define BT 4
#define WIN 8
#define HEADS 2
#define HD 8
#define STATE_BYTES 48

/* The RAM tier's one lookup flavour over a prompt's chain: plan, then take the plan (or just read
 * the plan's usable length: no side effects). */
static kvt_status take_toks(kvt_prompt_cache *pc, const int32_t *prompt, uint32_t n, uint64_t root, kvt_seq **out,
                            uint32_t *n_reused) {
    kvt_chain *c = NULL;
    kvt_prompt_cache_plan *p = NULL;
    *out = NULL;
    *n_reused = 0;
    kvt_status st = kvt_chain_create(root, prompt, n, BT, &c);
    if (st == KVT_OK) st = kvt_prompt_cache_plan_create(pc, c, &p, NULL);
    if (st == KVT_OK) st = kvt_prompt_cache_take_plan(pc, p, out, n_reused);
    kvt_prompt_cache_plan_free(p);
    kvt_chain_release(c);
    assert_true(kvt_prompt_cache_check(pc));
    return st;
}

static uint32_t peek_toks(kvt_prompt_cache *pc, const int32_t *prompt, uint32_t n, uint64_t root) {
    kvt_chain *c = NULL;
    kvt_prompt_cache_plan *p = NULL;
    kvt_prompt_cache_peek_info pi = {0};
    if (kvt_chain_create(root, prompt, n, BT, &c) == KVT_OK && kvt_prompt_cache_plan_create(pc, c, &p, &pi) == KVT_OK)
        kvt_prompt_cache_plan_free(p);
    kvt_chain_release(c);
    return pi.usable;
}

typedef struct fx {
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
    kvt_prompt_cache *pc;
    uint64_t root;
    int kind;
} fx;

static void fx_init(fx *f, int kind, uint64_t max_bytes) {
    memset(f, 0, sizeof(*f));
    kvt_layer_desc d[2];
    memset(d, 0, sizeof(d));
    for (int i = 0; i < 2; i++) {
        d[i].kind = KVT_KIND_FULL;
        d[i].n_kv_heads = HEADS;
        d[i].head_dim_k = HD;
        d[i].head_dim_v = HD;
        d[i].codec.kind = KVT_CODEC_F16;
    }
    if (kind == LAY_WINDOW) {
        d[1].kind = KVT_KIND_WINDOW;
        d[1].window = WIN;
    } else if (kind == LAY_RECURRENT) {
        memset(&d[1], 0, sizeof(d[1]));
        d[1].kind = KVT_KIND_RECURRENT;
        d[1].state_bytes = STATE_BYTES;
    }
    kvt_codec base = {.kind = KVT_CODEC_F16};
    char err[128];
    assert_int_equal(kvt_kv_layout_create(d, 2, BT, base, 0, &f->layout, err, sizeof(err)), KVT_OK);
    f->pool = kvt_block_pool_create(f->layout, 0);
    assert_non_null(f->pool);
    f->pc = kvt_prompt_cache_create(f->pool, max_bytes);
    assert_non_null(f->pc);
    f->root = kvt_root_hash("test-compat", "");
    f->kind = kind;
}

static void fx_free(fx *f) {
    assert_true(kvt_prompt_cache_check(f->pc)); /* ram_index.c R1-R4, R8 */
    kvt_prompt_cache_free(f->pc);
    assert_int_equal(kvt_block_pool_used_bytes(f->pool), 0); /* every block released exactly once */
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
}

/* Deterministic K/V value of one element: a function of (token, position, layer, k/v, head, dim). */
static float kv_val(int32_t tok, uint32_t pos, uint32_t layer, int kv, uint32_t h, uint32_t i) {
    return sinf((float)tok * 0.37f + (float)pos * 0.11f + (float)layer * 1.3f + (float)kv * 0.7f + (float)h * 0.5f +
                (float)i * 0.05f);
}

/* Expected recurrent state after tokens[0..n). */
static void state_expect(const int32_t *toks, uint32_t n, uint8_t *out) {
    uint64_t h = kvt_chain_hash(12345, toks, n);
    for (uint32_t j = 0; j < STATE_BYTES; j++) out[j] = (uint8_t)((h >> ((j % 8) * 8)) ^ j);
}

static bool layer_has_kv(const fx *f, uint32_t layer) {
    return kvt_kv_layout_layer(f->layout, layer)->kind != KVT_KIND_RECURRENT;
}

/* Appends toks[0..n) to s (written at positions len..len+n), in chunks of `step` tokens. */
static void seq_feed(fx *f, kvt_seq *s, const int32_t *toks, uint32_t n, uint32_t step) {
    float k[HEADS * HD], v[HEADS * HD];
    uint32_t done = 0;
    while (done < n) {
        uint32_t c = KVT_MIN(step, n - done);
        uint32_t len = kvt_seq_len(s);
        assert_int_equal(kvt_seq_prepare(s, c), KVT_OK);
        for (uint32_t t = 0; t < c; t++) {
            uint32_t pos = len + t;
            for (uint32_t layer = 0; layer < 2; layer++) {
                if (!layer_has_kv(f, layer)) continue;
                for (uint32_t h = 0; h < HEADS; h++)
                    for (uint32_t i = 0; i < HD; i++) {
                        k[h * HD + i] = kv_val(toks[done + t], pos, layer, 0, h, i);
                        v[h * HD + i] = kv_val(toks[done + t], pos, layer, 1, h, i);
                    }
                kvt_seq_write_kv(s, layer, pos, k, v);
            }
        }
        assert_int_equal(kvt_seq_commit(s, toks + done, c), KVT_OK);
        done += c;
        if (f->kind == LAY_RECURRENT) state_expect(kvt_seq_tokens(s), kvt_seq_len(s), kvt_seq_state(s, 1));
    }
}

static kvt_seq *mk_seq(fx *f, uint64_t root, const int32_t *toks, uint32_t n) {
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f->pool, root, &s), KVT_OK);
    seq_feed(f, s, toks, n, n);
    return s;
}

static void put_seq(fx *f, uint64_t root, const int32_t *toks, uint32_t n) {
    kvt_seq *s = mk_seq(f, root, toks, n);
    assert_int_equal(kvt_prompt_cache_put(f->pc, s), KVT_OK);
    kvt_seq_free(s);
}

/* Checks that s holds exactly toks[0..L) with the right K/V rows (WINDOW layers: the rows a query at
 * L can still see) and, for recurrent layouts, the right state. */
static void check_seq(fx *f, kvt_seq *s, const int32_t *toks, uint32_t L) {
    assert_int_equal(kvt_seq_len(s), L);
    assert_memory_equal(kvt_seq_tokens(s), toks, (size_t)L * sizeof(int32_t));
    float x[HD];
    uint8_t want[64], st[STATE_BYTES];
    for (uint32_t layer = 0; layer < 2; layer++) {
        if (!layer_has_kv(f, layer)) continue;
        const kvt_layer_desc *d = kvt_kv_layout_layer(f->layout, layer);
        uint32_t g = kvt_kv_layout_layer_group(f->layout, layer);
        uint32_t p0 = (d->kind == KVT_KIND_WINDOW && L > d->window) ? L - d->window + 1 : 0;
        for (uint32_t pos = p0; pos < L; pos++) {
            uint32_t bi = pos / BT;
            kvt_block *b = kvt_seq_block(s, g, bi);
            assert_non_null(b);
            for (int kv = 0; kv < 2; kv++) {
                size_t rb = kvt_kv_layout_row_bytes(f->layout, layer, bi, kv);
                size_t off = kvt_kv_layout_section_offset(f->layout, layer, bi, kv);
                for (uint32_t h = 0; h < HEADS; h++) {
                    for (uint32_t i = 0; i < HD; i++) x[i] = kv_val(toks[pos], pos, layer, kv, h, i);
                    kvt_codec_encode_row(d->codec, x, HD, want);
                    const uint8_t *row = kvt_block_data(b) + off + ((size_t)h * BT + pos % BT) * rb;
                    assert_memory_equal(row, want, rb);
                }
            }
        }
    }
    if (f->kind == LAY_RECURRENT) {
        state_expect(toks, L, st);
        assert_memory_equal(kvt_seq_state(s, 1), st, STATE_BYTES);
    }
}

/* take + check + free; returns the reused length. */
static uint32_t take_check(fx *f, uint64_t root, const int32_t *prompt, uint32_t n) {
    kvt_seq *s = NULL;
    uint32_t L = 99999;
    assert_int_equal(take_toks(f->pc, prompt, n, root, &s, &L), KVT_OK);
    assert_int_equal(L, peek_toks(f->pc, prompt, n, root));
    if (L == 0) {
        assert_null(s);
        return 0;
    }
    assert_non_null(s);
    assert_true(L < n);
    check_seq(f, s, prompt, L);
    kvt_seq_free(s);
    return L;
}

static void seq_range(int32_t *t, uint32_t n, int32_t first) {
    for (uint32_t i = 0; i < n; i++) t[i] = first + (int32_t)i;
}

/* Bytes of one full block of every group (FULL layout: one group). */
static uint64_t block_bytes(fx *f) { return kvt_kv_layout_block_bytes(f->layout, 0, 0); }

static kvt_prompt_cache_stats stats(fx *f) {
    kvt_prompt_cache_stats s;
    kvt_prompt_cache_stats_get(f->pc, &s);
    return s;
}

/* Counting spill sink; optionally keeps what it is handed (retains) until released. */
typedef struct sink {
    pthread_mutex_t mu;
    uint32_t n_blocks, n_snaps;
    bool keep, reject;
    kvt_block *kept[256];
    uint32_t n_kept;
} sink;

static bool sink_block(void *ctx, kvt_block *b) {
    sink *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->n_blocks++;
    if (s->reject) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    if (s->keep && s->n_kept < 256) {
        kvt_block_retain(b);
        s->kept[s->n_kept++] = b;
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}
static bool sink_snap(void *ctx, kvt_snapshot *sn) {
    (void)sn;
    sink *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->n_snaps++;
    pthread_mutex_unlock(&s->mu);
    return true;
}
static void sink_init(sink *s, bool keep) {
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->keep = keep;
}
static void sink_release(sink *s) {
    for (uint32_t i = 0; i < s->n_kept; i++) kvt_block_release(s->kept[i]);
    s->n_kept = 0;
    pthread_mutex_destroy(&s->mu);
}

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx) {
    (void)ctx;
    return fake_now;
}

/* ------------------------------------------------------------------ core behaviour */

/* [S]1/[M]1: longest usable prefix wins; a full-prefix hit needs no trim; the donor stays cached;
 * a strict-prefix tail is superseded by the longer trimmable entry; zero overlap is a miss. */
static void test_longest_prefix_wins(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[10], c[3] = {9, 9, 9}, p[12], q[2] = {7, 8};
    seq_range(a, 10, 1);
    seq_range(p, 12, 1);
    put_seq(&f, f.root, a, 5);  /* [1..5]: node + tail */
    put_seq(&f, f.root, c, 3);  /* [9,9,9] */
    assert_int_equal(stats(&f).entries, 2);
    put_seq(&f, f.root, a, 10); /* [1..10] supersedes [1..5] */
    assert_int_equal(stats(&f).entries, 2);
    assert_int_equal(stats(&f).blocks, 4); /* 2 nodes + tail [9,10] + tail [9,9,9] */
    assert_int_equal(take_check(&f, f.root, p, 12), 10);
    assert_int_equal(take_check(&f, f.root, p, 12), 10); /* non-consuming */
    assert_int_equal(take_check(&f, f.root, q, 2), 0);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.reused_tokens, 20);
    assert_int_equal(s.entries, 2);
    fx_free(&f);
}

/* [S]2/[M]2/unit 35: a diverging entry is cut on the CLONE; the donor (bytes and tokens) is
 * untouched, also after the clone is extended; a later take still gets the donor's full length. */
static void test_divergent_cut_donor_intact(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[10], p[8] = {1, 2, 3, 4, 5, 6, 99, 98}, ext[5] = {50, 51, 52, 53, 54}, full[11];
    seq_range(a, 10, 1);
    seq_range(full, 11, 1);
    kvt_seq *donor = mk_seq(&f, f.root, a, 10);
    assert_int_equal(kvt_prompt_cache_put(f.pc, donor), KVT_OK);
    uint64_t before[4];
    for (uint32_t i = 0; i < 3; i++) {
        kvt_block *b = kvt_seq_block(donor, 0, i);
        before[i] = kvt_chain_hash(0, (const int32_t *)kvt_block_data(b), (uint32_t)(kvt_block_data_bytes(b) / 4));
    }
    kvt_seq *s = NULL;
    uint32_t L = 0;
    assert_int_equal(take_toks(f.pc, p, 8, f.root, &s, &L), KVT_OK);
    assert_int_equal(L, 6);
    check_seq(&f, s, p, 6);
    seq_feed(&f, s, ext, 5, 1); /* extend the clone token by token: copy-on-write of the shared block */
    assert_int_equal(kvt_seq_len(s), 11);
    for (uint32_t i = 0; i < 3; i++) {
        kvt_block *b = kvt_seq_block(donor, 0, i);
        uint64_t h = kvt_chain_hash(0, (const int32_t *)kvt_block_data(b), (uint32_t)(kvt_block_data_bytes(b) / 4));
        assert_true(h == before[i]);
    }
    assert_int_equal(kvt_seq_len(donor), 10);
    assert_memory_equal(kvt_seq_tokens(donor), a, sizeof(a));
    check_seq(&f, donor, a, 10);
    kvt_seq_free(s);
    assert_int_equal(take_check(&f, f.root, full, 11), 10);
    kvt_seq_free(donor);
    fx_free(&f);
}

/* [S]3/[M]3: an exact repeat reuses len-1 tokens (one token is forwarded for logits). */
static void test_exact_repeat(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[9];
    seq_range(a, 9, 1);
    put_seq(&f, f.root, a, 8); /* block boundary */
    assert_int_equal(take_check(&f, f.root, a, 8), 7);
    put_seq(&f, f.root, a, 9); /* mid-block */
    assert_int_equal(take_check(&f, f.root, a, 9), 8);
    assert_int_equal(take_check(&f, f.root, a, 1), 0); /* one token: nothing can be reused */
    fx_free(&f);
}

/* [S]4/[M]4/[M]22/[M]24: a recurrent layer makes an entry untrimmable: it serves only exact
 * snapshot positions; UNTRIMMABLE is counted; the boundary snapshot survives a longer put and
 * serves an exact repeat of the prompt without any trim. */
static void test_untrimmable_recurrent(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_RECURRENT, UINT64_MAX);
    int32_t a[12], div[6] = {1, 2, 3, 9, 9, 9};
    seq_range(a, 12, 1);
    put_seq(&f, f.root, a, 10);
    assert_int_equal(take_check(&f, f.root, div, 6), 0);
    assert_int_equal(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE], 1);
    assert_int_equal(take_check(&f, f.root, a, 12), 10); /* full match: no cut needed */
    assert_int_equal(take_check(&f, f.root, a, 10), 0);  /* exact repeat would need a cut at 9 */
    assert_int_equal(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE], 2);

    /* prompt-boundary snapshot: the prompt is a[0..7) and the reply extends it */
    put_seq(&f, f.root, a, 6);                           /* boundary entry at 6 (mid-block) */
    put_seq(&f, f.root, a, 11);                          /* longer, untrimmable */
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 70, 71};
    assert_int_equal(take_check(&f, f.root, p, 8), 6);   /* snapshot at 6, rows copied from block 1 */
    assert_int_equal(take_check(&f, f.root, a, 7), 6);   /* exact repeat of prompt[0..7) */
    assert_int_equal(take_check(&f, f.root, a, 12), 11);
    assert_int_equal(take_check(&f, f.root, a, 11), 10); /* snapshot at 10 still there */
    fx_free(&f);
}

/* [S]5/[M]5: the byte cap evicts least-recently-used entries, never the fresh insert. */
static void test_byte_cap_lru(void **st) {
    (void)st;
    fx f;
    uint64_t bb;
    {
        fx t;
        fx_init(&t, LAY_FULL, 0);
        bb = block_bytes(&t);
        fx_free(&t);
    }
    fx_init(&f, LAY_FULL, bb * 4 + bb / 2); /* two 2-block entries fit, three don't */
    int32_t a[9], b[9], c[9];
    seq_range(a, 9, 100);
    seq_range(b, 9, 200);
    seq_range(c, 9, 300);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    put_seq(&f, f.root, c, 8);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.bytes, bb * 4);
    assert_int_equal(s.blocks, 4);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 0);
    assert_int_equal(peek_toks(f.pc, b, 9, f.root), 8);
    assert_int_equal(peek_toks(f.pc, c, 9, f.root), 8);
    /* cap smaller than two entries: the fresh one still stays */
    fx_free(&f);
    fx_init(&f, LAY_FULL, bb * 2 + bb / 2);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    assert_int_equal(peek_toks(f.pc, b, 9, f.root), 8);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 0);
    assert_true(stats(&f).bytes <= bb * 2 + bb / 2);
    fx_free(&f);
}

/* [S]7/[M]9: an entry larger than the cap is never stored (BUDGET counted; the cold tier sees it). */
static void test_oversize_not_stored(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 1);
    sink sk;
    sink_init(&sk, false);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    int32_t a[9];
    seq_range(a, 9, 1);
    put_seq(&f, f.root, a, 8);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.bytes, 0);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.reuse_impossible[KVT_REUSE_IMPOSSIBLE_BUDGET], 1);
    assert_int_equal(sk.n_blocks, 2);
    assert_int_equal(take_check(&f, f.root, a, 9), 0);
    sink_release(&sk);
    fx_free(&f);
}

/* [S]6/[M]6: a take bumps the donor's recency, changing the eviction order. */
static void test_recency_bump_on_take(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0);
    uint64_t bb = block_bytes(&f);
    fx_free(&f);
    fx_init(&f, LAY_FULL, bb * 4 + bb / 2);
    int32_t a[9], b[9], c[9];
    seq_range(a, 9, 100);
    seq_range(b, 9, 200);
    seq_range(c, 9, 300);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    assert_int_equal(take_check(&f, f.root, a, 9), 8); /* a is now the most recent */
    put_seq(&f, f.root, c, 8);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 8);
    assert_int_equal(peek_toks(f.pc, b, 9, f.root), 0);
    assert_int_equal(peek_toks(f.pc, c, 9, f.root), 8);
    fx_free(&f);
}

/* Leaf-first: a node with cached children is evicted after them (its parent was used earlier, so
 * plain LRU would have removed the parent first and orphaned the child). */
static void test_leaf_first(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0);
    uint64_t bb = block_bytes(&f);
    fx_free(&f);
    fx_init(&f, LAY_FULL, bb * 5 / 2);
    int32_t a[9], b[5];
    seq_range(a, 9, 1);
    seq_range(b, 5, 500);
    put_seq(&f, f.root, a, 8); /* node0 (older), node1 (leaf) */
    put_seq(&f, f.root, b, 4); /* over the cap by one block */
    assert_int_equal(stats(&f).evictions, 1);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 4); /* node0 kept */
    assert_int_equal(peek_toks(f.pc, b, 5, f.root), 4);
    fx_free(&f);
}

/* [M]7/[M]23: supersession only by trimmable descendants: a FULL-only tail is dropped by a longer
 * put (and still served through the longer block); duplicates dedup; tails of recurrent layouts
 * may go but their snapshot stays. */
static void test_supersession(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[11], p[7] = {1, 2, 3, 4, 5, 6, 77};
    seq_range(a, 11, 1);
    put_seq(&f, f.root, a, 6);
    assert_int_equal(stats(&f).blocks, 2);
    put_seq(&f, f.root, a, 6); /* exact duplicate: dedup, nothing added */
    assert_int_equal(stats(&f).blocks, 2);
    assert_int_equal(stats(&f).entries, 1);
    put_seq(&f, f.root, a, 10);
    assert_int_equal(stats(&f).blocks, 3); /* tail [5,6] superseded by node [5..8] */
    assert_int_equal(stats(&f).entries, 1);
    assert_int_equal(take_check(&f, f.root, p, 7), 6);
    fx_free(&f);

    fx_init(&f, LAY_RECURRENT, UINT64_MAX);
    put_seq(&f, f.root, a, 6);
    put_seq(&f, f.root, a, 10);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.entries, 3); /* snapshot@6, snapshot@10, tail [9,10] */
    assert_int_equal(s.blocks, 3);
    assert_int_equal(take_check(&f, f.root, p, 7), 6);
    fx_free(&f);
}

/* [M]8: entries never cross namespaces (roots); a miss whose tokens exist under another root
 * counts NAMESPACE; supersession never crosses roots either. */
static void test_namespaces(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    uint64_t ra = kvt_root_hash("test-compat", "A"), rb = kvt_root_hash("test-compat", "B");
    int32_t a[12];
    seq_range(a, 12, 1);
    put_seq(&f, ra, a, 8);
    assert_int_equal(take_check(&f, rb, a, 12), 0);
    assert_int_equal(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE], 1);
    assert_int_equal(take_check(&f, ra, a, 12), 8);
    put_seq(&f, rb, a, 6);
    put_seq(&f, ra, a, 10); /* must not supersede B's [1..6] */
    assert_int_equal(peek_toks(f.pc, a, 7, rb), 6);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.blocks, 3 + 2);
    assert_int_equal(s.reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE], 1);
    int32_t other[6] = {40, 41, 42, 43, 44, 45};
    assert_int_equal(take_check(&f, rb, other, 6), 0); /* plain miss: no NAMESPACE */
    assert_int_equal(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE], 1);
    fx_free(&f);
}

/* The NAMESPACE diagnostic tries only the 16 most recently created other roots: clients choose
 * namespaces (cache_salt), so a miss must not hash once per namespace ever seen. */
static void test_namespace_diag_bounded(void **st) {
    (void)st;
    for (int newer = 15; newer <= 16; newer++) {
        fx f;
        fx_init(&f, LAY_FULL, UINT64_MAX);
        int32_t a[12], o[12];
        seq_range(a, 12, 1);
        seq_range(o, 12, 100);
        put_seq(&f, kvt_root_hash("test-compat", "A"), a, 8);
        for (int i = 0; i < newer; i++) { /* roots created after A's, holding another prompt */
            char ns[16];
            snprintf(ns, sizeof ns, "salt-%d", i);
            put_seq(&f, kvt_root_hash("test-compat", ns), o, 8);
        }
        assert_int_equal(take_check(&f, kvt_root_hash("test-compat", "B"), a, 12), 0);
        /* A is among the 16 most recent other roots with 15 newer ones, not with 16 */
        assert_int_equal(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE], newer == 15 ? 1 : 0);
        fx_free(&f);
    }
}

/* [M]11: one donor serves many takes concurrently; refcounts return to cache-only afterwards. */
typedef struct thr_arg {
    fx *f;
    int id;
    uint32_t ok;
} thr_arg;

static void *take_thread(void *p) {
    thr_arg *a = p;
    int32_t prompt[19];
    seq_range(prompt, 16, 1);
    for (int i = 0; i < 40; i++) {
        prompt[16] = 1000 + a->id;
        prompt[17] = 2000 + i;
        prompt[18] = 3;
        kvt_seq *s = NULL;
        uint32_t L = 0;
        if (take_toks(a->f->pc, prompt, 19, a->f->root, &s, &L) != KVT_OK || !s) continue;
        if (L == 16 && kvt_seq_len(s) == 16 && memcmp(kvt_seq_tokens(s), prompt, 16 * 4) == 0) {
            /* extend privately: must never disturb the donor or other threads */
            if (kvt_seq_prepare(s, 1) == KVT_OK && kvt_seq_commit(s, prompt + 16, 1) == KVT_OK) a->ok++;
        }
        kvt_seq_free(s);
    }
    return NULL;
}

static void test_concurrent_takes(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[16];
    seq_range(a, 16, 1);
    put_seq(&f, f.root, a, 16);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){&f, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, take_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(args[i].ok, 40);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.hits, 160);
    assert_int_equal(s.reused_tokens, 160 * 16);
    assert_int_equal(s.blocks, 4);
    /* only the cache holds the donor's blocks now */
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), s.bytes);
    kvt_seq *d = NULL;
    uint32_t L = 0;
    int32_t p[17];
    seq_range(p, 17, 1);
    assert_int_equal(take_toks(f.pc, p, 17, f.root, &d, &L), KVT_OK);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(kvt_block_refcount(kvt_seq_block(d, 0, i)), 2);
    kvt_seq_free(d);
    fx_free(&f);
}

/* [M]12/[M]13: ref-counted release runs once: memory goes back to the pool only after the cache AND
 * every sequence sharing the blocks released them, in either order; retain flows through a put of
 * an extended clone without early release. */
static void test_refcounted_release(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[12];
    seq_range(a, 12, 1);
    kvt_seq *donor = mk_seq(&f, f.root, a, 8);
    uint64_t used = kvt_block_pool_used_bytes(f.pool);
    assert_int_equal(kvt_prompt_cache_put(f.pc, donor), KVT_OK);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), used); /* shared, not copied */
    kvt_seq *c = NULL;
    uint32_t L = 0;
    assert_int_equal(take_toks(f.pc, a, 12, f.root, &c, &L), KVT_OK);
    assert_int_equal(L, 8);
    seq_feed(&f, c, a + 8, 3, 3);
    assert_int_equal(kvt_prompt_cache_put(f.pc, c), KVT_OK); /* extended clone */
    kvt_prompt_cache_clear(f.pc);
    assert_int_equal(stats(&f).blocks, 0);
    assert_true(kvt_block_pool_used_bytes(f.pool) > 0); /* still held by donor and clone */
    check_seq(&f, c, a, 11);
    kvt_seq_free(donor);
    check_seq(&f, c, a, 11);
    kvt_seq_free(c);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), 0);
    /* other order: sequences first, cache last */
    put_seq(&f, f.root, a, 11);
    assert_true(kvt_block_pool_used_bytes(f.pool) > 0);
    fx_free(&f); /* asserts used == 0 after the cache is freed */
}

/* [S]8/[M]10/[M]25/[M]31: clear() drops everything and never spills. */
static void test_clear_never_spills(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_RECURRENT, UINT64_MAX);
    sink sk;
    sink_init(&sk, false);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    int32_t a[9];
    seq_range(a, 9, 1);
    put_seq(&f, f.root, a, 9);
    assert_true(stats(&f).bytes > 0);
    kvt_prompt_cache_clear(f.pc);
    assert_int_equal(sk.n_blocks + sk.n_snaps, 0);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.entries + s.blocks + s.bytes, 0);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), 0);
    assert_int_equal(take_check(&f, f.root, a, 9), 0);
    sink_release(&sk);
    fx_free(&f);
}

/* [M]19-21: demote_idle is a no-op without a sink; with one it spills and drops idle entries only,
 * and a recent take keeps a donor in RAM. */
static void test_demote_idle(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    kvt_prompt_cache_set_clock(f.pc, fake_clock, NULL);
    int32_t a[9], b[9], c[9];
    seq_range(a, 9, 100);
    seq_range(b, 9, 200);
    seq_range(c, 9, 300);
    fake_now = 1000000000ull;
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    put_seq(&f, f.root, c, 8);
    fake_now += 120 * 1000000000ull;
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 60), 0); /* no sink: never data loss */
    assert_int_equal(stats(&f).blocks, 6);
    sink sk;
    sink_init(&sk, false);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    assert_int_equal(take_check(&f, f.root, b, 9), 8); /* recent take on b */
    fake_now += 30 * 1000000000ull;
    put_seq(&f, f.root, c, 8); /* re-put refreshes c */
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 200), 0); /* nothing idle that long */
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 60), 2);  /* only a */
    assert_int_equal(sk.n_blocks, 2);
    assert_int_equal(stats(&f).spills, 2);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 0);
    assert_int_equal(peek_toks(f.pc, b, 9, f.root), 8);
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 0), 4); /* drain: everything */
    assert_int_equal(stats(&f).blocks, 0);
    assert_int_equal(sk.n_blocks, 6);
    sink_release(&sk);
    fx_free(&f);
}

/* Eviction spills each evictee before releasing it; a sink that keeps a block keeps it alive. */
static void test_eviction_spills(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0);
    uint64_t bb = block_bytes(&f);
    fx_free(&f);
    fx_init(&f, LAY_FULL, bb * 2);
    sink sk;
    sink_init(&sk, true);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    int32_t a[9], b[9];
    seq_range(a, 9, 100);
    seq_range(b, 9, 200);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    assert_int_equal(sk.n_blocks, 2);
    assert_int_equal(stats(&f).spills, 2);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 4); /* sink holds a's blocks */
    for (uint32_t i = 0; i < sk.n_kept; i++) assert_int_equal(kvt_block_refcount(sk.kept[i]), 1);
    sink_release(&sk);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 2);
    /* a sink that refuses: eviction still proceeds, nothing counted as spilled */
    sink_init(&sk, true);
    sk.reject = true;
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    put_seq(&f, f.root, a, 8);
    assert_int_equal(sk.n_blocks, 2);
    assert_int_equal(sk.n_kept, 0);
    assert_int_equal(stats(&f).spills, 2);
    assert_int_equal(stats(&f).evictions, 4);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 2);
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 8);
    sink_release(&sk);
    fx_free(&f);
}

/* evict_bytes (pool pressure) frees only cache-only blocks and reports bytes actually freed; as the
 * pool's pressure callback it lets an over-budget allocation succeed. */
static void test_evict_bytes(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    uint64_t bb = block_bytes(&f);
    int32_t a[9], b[9], c[9];
    seq_range(a, 9, 100);
    seq_range(b, 9, 200);
    seq_range(c, 9, 300);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    kvt_seq *live = mk_seq(&f, f.root, c, 8);
    assert_int_equal(kvt_prompt_cache_put(f.pc, live), KVT_OK);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 6);
    assert_int_equal(kvt_prompt_cache_evict_bytes(f.pc, bb), bb); /* LRU leaf of a */
    assert_int_equal(kvt_prompt_cache_evict_bytes(f.pc, UINT64_MAX), bb * 3);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 2);
    assert_int_equal(stats(&f).blocks, 2); /* the live sequence's blocks stay indexed */
    assert_int_equal(peek_toks(f.pc, c, 9, f.root), 8);
    assert_int_equal(kvt_prompt_cache_evict_bytes(f.pc, UINT64_MAX), 0);
    kvt_seq_free(live);
    fx_free(&f);

    /* as pressure callback: budget of 4 blocks, the cache holds 4 cache-only blocks */
    fx_init(&f, LAY_FULL, UINT64_MAX);
    kvt_prompt_cache_free(f.pc);
    kvt_block_pool_free(f.pool);
    f.pool = kvt_block_pool_create(f.layout, bb * 4);
    f.pc = kvt_prompt_cache_create(f.pool, UINT64_MAX);
    kvt_block_pool_set_pressure(f.pool, kvt_prompt_cache_pressure_cb, f.pc);
    put_seq(&f, f.root, a, 8);
    put_seq(&f, f.root, b, 8);
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 4);
    kvt_seq *s = mk_seq(&f, f.root, c, 8); /* needs 2 blocks: the cache gives them up */
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), bb * 4);
    assert_int_equal(peek_toks(f.pc, b, 9, f.root), 8); /* LRU (a) went first */
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 0);
    kvt_seq_free(s);
    fx_free(&f);
}

/* Window layouts: reuse after the window wrapped works when the blocks covering [L-W, L) are held,
 * and falls back to a shorter usable prefix (or a miss) when they were dropped. */
static void test_window(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_WINDOW, UINT64_MAX);
    int32_t a[30];
    seq_range(a, 30, 1);
    put_seq(&f, f.root, a, 24); /* wrapped: early window blocks were dropped */
    assert_int_equal(take_check(&f, f.root, a, 26), 24); /* full match: recent blocks held */
    int32_t p[16];
    memcpy(p, a, 14 * 4);
    p[14] = 900;
    p[15] = 901;
    assert_int_equal(take_check(&f, f.root, p, 16), 0); /* needs dropped blocks */
    assert_true(stats(&f).reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE] >= 1);
    put_seq(&f, f.root, a, 8);                            /* a short entry holds blocks 0,1 */
    assert_int_equal(take_check(&f, f.root, p, 16), 8);   /* shorter usable prefix */
    put_seq(&f, f.root, a, 14);                           /* now [6,14) is held too */
    assert_int_equal(take_check(&f, f.root, p, 16), 14);
    assert_int_equal(take_check(&f, f.root, a, 26), 24);
    /* last block held but a block inside the window ([14,22) needs block 3) was dropped by every
     * registering sequence: fall back to 12, whose window [4,12) is fully held */
    int32_t q[23];
    memcpy(q, a, 22 * 4);
    q[22] = 900;
    assert_int_equal(take_check(&f, f.root, q, 23), 12);
    put_seq(&f, f.root, a, 18); /* holds blocks 2..4: block 3 is now held */
    assert_int_equal(take_check(&f, f.root, q, 23), 22);
    fx_free(&f);
}

/* peek has no side effects; put of a taken-and-extended clone adds only the new blocks. */
static void test_peek_and_dedup(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[14];
    seq_range(a, 14, 1);
    put_seq(&f, f.root, a, 8);
    assert_int_equal(peek_toks(f.pc, a, 14, f.root), 8);
    kvt_prompt_cache_stats s = stats(&f);
    assert_int_equal(s.hits + s.misses, 0);
    kvt_seq *c = NULL;
    uint32_t L = 0;
    assert_int_equal(take_toks(f.pc, a, 14, f.root, &c, &L), KVT_OK);
    seq_feed(&f, c, a + 8, 5, 2);
    assert_int_equal(kvt_prompt_cache_put(f.pc, c), KVT_OK);
    assert_int_equal(stats(&f).blocks, 4); /* 2 shared + node [9..12] + tail [13] */
    assert_int_equal(kvt_block_pool_used_bytes(f.pool), 4 * block_bytes(&f));
    kvt_seq_free(c);
    assert_int_equal(take_check(&f, f.root, a, 14), 13);
    fx_free(&f);
}

/* The index checker (ram_index.c R1-R4, R8) is not vacuous: it notices a count, a map entry, a
 * child list or a pin count that disagrees with the forest. */
static void test_index_check_detects(void **state) {
    (void)state;
    fx f;
    fx_init(&f, LAY_FULL, 1u << 30);
    int32_t p[12];
    for (int i = 0; i < 12; i++) p[i] = 100 + i;
    kvt_seq *s = mk_seq(&f, f.root, p, 10);
    assert_int_equal(kvt_prompt_cache_put(f.pc, s), KVT_OK);
    kvt_seq_free(s);
    kvt_prompt_cache *pc = f.pc;
    assert_true(kvt_prompt_cache_check(pc));
    pc->n_units++; /* R4 */
    assert_false(kvt_prompt_cache_check(pc));
    pc->n_units--;
    pc->bytes += 1; /* R4 */
    assert_false(kvt_prompt_cache_check(pc));
    pc->bytes -= 1;
    pc->roots->n_children++; /* R1 */
    assert_false(kvt_prompt_cache_check(pc));
    pc->roots->n_children--;
    pc_unit *node = pc->roots->first_child;
    while (node && node->kind != U_NODE) node = node->sib_next;
    assert_non_null(node);
    node->key ^= 1; /* R2: no longer found in the map under its key */
    assert_false(kvt_prompt_cache_check(pc));
    node->key ^= 1;
    assert_true(kvt_prompt_cache_check(pc));
    node->pins++; /* R8: a count no pin record explains, and bytes not in pinned_bytes */
    assert_false(kvt_prompt_cache_check(pc));
    pc->pinned_bytes += node->bytes; /* the bytes agree now, the records still do not */
    assert_false(kvt_prompt_cache_check(pc));
    node->pins--;
    pc->pinned_bytes -= node->bytes;
    assert_true(kvt_prompt_cache_check(pc));
    fx_free(&f);
}

/* ---- pins (ram_index.c R8) ---- */

static kvt_status pin_toks(fx *f, const int32_t *toks, uint32_t n, uint64_t *h, kvt_prompt_cache_pin_info *info) {
    kvt_chain *c = NULL;
    assert_int_equal(kvt_chain_create(f->root, toks, n, BT, &c), KVT_OK);
    kvt_status st = kvt_prompt_cache_pin(f->pc, c, h, info);
    kvt_chain_release(c);
    assert_true(kvt_prompt_cache_check(f->pc));
    return st;
}

/* A pinned prefix survives the byte cap (LRU), idle demotion / drain and memory pressure while
 * distinct prompts churn through; unpinned it is the LRU victim again. */
static void test_pin_never_evicted(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0);
    uint64_t bb = block_bytes(&f);
    fx_free(&f);
    fx_init(&f, LAY_FULL, bb * 4 + bb / 2); /* two 2-block entries fit */
    kvt_prompt_cache_set_pin_budget(f.pc, bb * 3);
    int32_t a[10], o[10];
    seq_range(a, 10, 100);
    put_seq(&f, f.root, a, 10); /* 2 full blocks + a 2-token tail */
    uint64_t h = 0;
    kvt_prompt_cache_pin_info pi;
    assert_int_equal(pin_toks(&f, a, 10, &h, &pi), KVT_OK);
    assert_int_equal(pi.tokens, 10);
    assert_int_equal(pi.bytes, 3 * bb);
    assert_int_equal(pi.new_bytes, 3 * bb);
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 3 * bb);
    /* the byte cap: 20 distinct prompts, each would push the LRU entry (a) out */
    for (int32_t i = 0; i < 20; i++) {
        seq_range(o, 10, 1000 + 50 * i);
        put_seq(&f, f.root, o, 8);
    }
    assert_true(stats(&f).evictions >= 19);
    assert_int_equal(peek_toks(f.pc, a, 10, f.root), 9); /* the whole prompt but the n-1 cap */
    /* idle demotion and a drain (idle >= 0 s) leave it; pressure does too */
    sink sk;
    sink_init(&sk, false);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    assert_true(kvt_prompt_cache_demote_idle(f.pc, 0) > 0);
    assert_int_equal(stats(&f).blocks, 3);
    assert_int_equal(kvt_prompt_cache_evict_bytes(f.pc, UINT64_MAX), 0);
    assert_int_equal(take_check(&f, f.root, a, 10), 9);
    /* supersession: a longer put at the tail's position keeps the pinned tail */
    put_seq(&f, f.root, a, 10);
    int32_t longer[13];
    seq_range(longer, 13, 100);
    put_seq(&f, f.root, longer, 12); /* node [9..12] would supersede the pinned tail [9,10] */
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 0), 1); /* the new node goes, the tail stays */
    assert_int_equal(take_check(&f, f.root, a, 10), 9);
    /* unpinned: evictable again */
    assert_true(kvt_prompt_cache_unpin(f.pc, h));
    assert_false(kvt_prompt_cache_unpin(f.pc, h));
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 0);
    assert_true(kvt_prompt_cache_check(f.pc));
    assert_int_equal(kvt_prompt_cache_demote_idle(f.pc, 0), 3);
    assert_int_equal(peek_toks(f.pc, a, 10, f.root), 0);
    sink_release(&sk);
    fx_free(&f);
}

/* The budget: a pin that would push the pinned bytes past it is refused and pins nothing; overlapping
 * pins charge shared units once; a prefix the tier does not hold is NOT_FOUND; clear drops pins. */
static void test_pin_budget(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    uint64_t bb = block_bytes(&f);
    int32_t a[13], b[9];
    seq_range(a, 13, 100);
    seq_range(b, 9, 500);
    put_seq(&f, f.root, a, 12); /* 3 blocks */
    put_seq(&f, f.root, b, 8);  /* 2 blocks */
    uint64_t h1 = 0, h2 = 0, h3 = 0;
    kvt_prompt_cache_pin_info pi;
    assert_int_equal(pin_toks(&f, a, 12, &h1, &pi), KVT_ERR_RANGE); /* default budget 0 */
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 0);
    kvt_prompt_cache_set_pin_budget(f.pc, bb * 4);
    assert_int_equal(pin_toks(&f, a, 8, &h1, &pi), KVT_OK); /* 2 blocks */
    assert_int_equal(pin_toks(&f, a, 12, &h2, &pi), KVT_OK); /* overlaps: adds 1 block */
    assert_int_equal(pi.new_bytes, bb);
    assert_int_equal(pi.pinned_bytes, 3 * bb);
    assert_int_equal(pin_toks(&f, b, 8, &h3, &pi), KVT_ERR_RANGE); /* 3 + 2 > 4 blocks */
    assert_int_equal(pi.pinned_bytes, 3 * bb);
    assert_int_equal(pi.budget, 4 * bb);
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 3 * bb);
    int32_t z[8];
    seq_range(z, 8, 9000);
    assert_int_equal(pin_toks(&f, z, 8, &h3, &pi), KVT_ERR_NOT_FOUND);
    assert_true(kvt_prompt_cache_unpin(f.pc, h2)); /* the shared blocks stay pinned by h1 */
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 2 * bb);
    assert_int_equal(kvt_prompt_cache_evict_bytes(f.pc, UINT64_MAX), 3 * bb); /* a's third block and b */
    assert_int_equal(peek_toks(f.pc, a, 9, f.root), 8);
    kvt_prompt_cache_clear(f.pc); /* pins go with everything */
    assert_int_equal(kvt_prompt_cache_pinned_bytes(f.pc), 0);
    assert_false(kvt_prompt_cache_unpin(f.pc, h1));
    fx_free(&f);
}

/* Recurrent layouts: the pin holds the snapshots inside the prefix, so the pinned prompt still
 * resumes after everything else went. */
static void test_pin_recurrent(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_RECURRENT, UINT64_MAX);
    kvt_prompt_cache_set_pin_budget(f.pc, UINT64_MAX);
    int32_t a[11];
    seq_range(a, 11, 1);
    put_seq(&f, f.root, a, 6);
    put_seq(&f, f.root, a, 10);
    uint64_t h = 0;
    assert_int_equal(pin_toks(&f, a, 10, &h, NULL), KVT_OK);
    sink sk;
    sink_init(&sk, false);
    kvt_prompt_cache_set_spill(f.pc, sink_block, sink_snap, &sk);
    kvt_prompt_cache_demote_idle(f.pc, 0);
    assert_int_equal(take_check(&f, f.root, a, 11), 10);
    sink_release(&sk);
    fx_free(&f);
}

/* The admin listing: one entry per leaf (a supersession leaves one), longest first, the path's
 * units and bytes, the first unit's tokens, the root, and a top-N that keeps only the longest. */
static void test_prefixes_listing(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, UINT64_MAX);
    int32_t a[10], c[3] = {9, 9, 9}, d[6] = {5, 5, 5, 5, 5, 5};
    seq_range(a, 10, 1);
    const uint64_t other = kvt_root_hash("test-compat", "tenant-b");
    put_seq(&f, f.root, a, 5);  /* [1..5]: node + tail */
    put_seq(&f, f.root, a, 10); /* supersedes it: 2 nodes + tail [9,10] */
    put_seq(&f, f.root, c, 3);  /* a tail under the root */
    put_seq(&f, other, d, 6);   /* node + tail under another root */
    kvt_cached_prefix p[4];
    uint64_t total = 0;
    assert_int_equal(kvt_prompt_cache_prefixes(f.pc, p, 4, &total), 3);
    assert_int_equal(total, 3);
    assert_int_equal(p[0].tokens, 10);
    assert_int_equal(p[0].units, 3);
    assert_int_equal(p[0].root, f.root);
    assert_int_equal(p[0].n_head, BT);
    assert_memory_equal(p[0].head, a, BT * sizeof(int32_t));
    assert_int_equal(p[1].tokens, 6);
    assert_int_equal(p[1].root, other);
    assert_int_equal(p[2].tokens, 3);
    assert_int_equal(p[2].units, 1);
    assert_int_equal(p[2].n_head, 3);
    assert_true(p[0].bytes > p[1].bytes && p[1].bytes > p[2].bytes && p[2].bytes > 0);
    assert_true(p[0].idle_s >= 0);
    /* top 2 of 3: the shortest goes, however the LRU orders them */
    assert_int_equal(kvt_prompt_cache_prefixes(f.pc, p, 2, &total), 2);
    assert_int_equal(total, 3);
    assert_int_equal(p[0].tokens, 10);
    assert_int_equal(p[1].tokens, 6);
    assert_int_equal(kvt_prompt_cache_prefixes(f.pc, p, 0, &total), 0);
    assert_int_equal(total, 3);
    assert_int_equal(kvt_prompt_cache_prefixes(NULL, p, 4, &total), 0);
    assert_int_equal(total, 0);
    fx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_check_detects),
        cmocka_unit_test(test_longest_prefix_wins),
        cmocka_unit_test(test_prefixes_listing),
        cmocka_unit_test(test_divergent_cut_donor_intact),
        cmocka_unit_test(test_exact_repeat),
        cmocka_unit_test(test_untrimmable_recurrent),
        cmocka_unit_test(test_byte_cap_lru),
        cmocka_unit_test(test_oversize_not_stored),
        cmocka_unit_test(test_recency_bump_on_take),
        cmocka_unit_test(test_leaf_first),
        cmocka_unit_test(test_supersession),
        cmocka_unit_test(test_namespaces), cmocka_unit_test(test_namespace_diag_bounded),
        cmocka_unit_test(test_concurrent_takes),
        cmocka_unit_test(test_refcounted_release),
        cmocka_unit_test(test_clear_never_spills),
        cmocka_unit_test(test_demote_idle),
        cmocka_unit_test(test_eviction_spills),
        cmocka_unit_test(test_evict_bytes),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_peek_and_dedup),
        cmocka_unit_test(test_pin_never_evicted),
        cmocka_unit_test(test_pin_budget),
        cmocka_unit_test(test_pin_recurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
