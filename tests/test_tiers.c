/* test_tiers.c — the tier manager (src/cache/tier.c) over a real RAM tier and a real SSD tier in a
 * temporary directory: one plan per lookup (RAM's leading blocks + only the SSD blocks RAM lacks,
 * counted in bytes read from disk), honest counters, request chain hashes computed once (lookup and
 * sealing), write-behind of window blocks and boundary snapshots, memory pressure with an SSD tier
 * attached (8-block pool, write-behind off, spill sink on). */
#include "testutil.h"

#include <math.h>

#include "cache/prompt_cache.h"
#include "cache/ssd_cache.h"
#include "cache/tier.h"
#include "engine/engine.h"
#include "model/gen_model.h"

enum { LAY_FULL, LAY_WINDOW, LAY_RECURRENT };
#define BT 4
#define WIN 8
#define HEADS 2
#define HD 8
#define STATE_BYTES 48

typedef struct fx {
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
    kvt_prompt_cache *pc;
    kvt_ssd *ssd;
    kvt_tiers *t;
    char *dir;
    uint64_t root;
    int kind;
    bool writeback;
} fx;

static void open_tiers(fx *f) {
    kvt_ssd_opts o;
    kvt_ssd_opts_default(&o);
    o.dir = f->dir;
    o.compat_key = "test-tiers";
    char err[256];
    assert_int_equal(kvt_ssd_open(&o, f->layout, f->pool, &f->ssd, err, sizeof err), KVT_OK);
    kvt_tiers_opts to = {.pool = f->pool, .ram = f->pc, .ssd = f->ssd, .writeback = f->writeback};
    f->t = kvt_tiers_create(&to);
    assert_non_null(f->t);
}

static void close_tiers(fx *f) {
    kvt_tiers_free(f->t);
    kvt_ssd_free(f->ssd);
    f->t = NULL;
    f->ssd = NULL;
}

static void fx_init(fx *f, int kind, uint64_t budget_blocks, bool writeback) {
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
    uint64_t bb = kvt_kv_layout_block_bytes(f->layout, 0, 0);
    f->pool = kvt_block_pool_create(f->layout, budget_blocks * bb);
    assert_non_null(f->pool);
    f->pc = kvt_prompt_cache_create(f->pool, 1u << 30);
    assert_non_null(f->pc);
    f->dir = tu_tmpdir("tiers");
    assert_non_null(f->dir);
    f->root = kvt_root_hash("test-tiers", "");
    f->kind = kind;
    f->writeback = writeback;
    open_tiers(f);
}

static void fx_free(fx *f) {
    close_tiers(f);
    assert_true(kvt_prompt_cache_check(f->pc)); /* ram_index.c R1-R5 */
    kvt_prompt_cache_free(f->pc);
    assert_int_equal(kvt_block_pool_used_bytes(f->pool), 0); /* every block released exactly once */
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f->dir);
}

/* Deterministic K/V value of one element: a function of (token, position, layer, k/v, head, dim). */
static float kv_val(int32_t tok, uint32_t pos, uint32_t layer, int kv, uint32_t h, uint32_t i) {
    return sinf((float)tok * 0.37f + (float)pos * 0.11f + (float)layer * 1.3f + (float)kv * 0.7f + (float)h * 0.5f +
                (float)i * 0.05f);
}

static void state_expect(const int32_t *toks, uint32_t n, uint8_t *out) {
    uint64_t h = kvt_chain_hash(12345, toks, n);
    for (uint32_t j = 0; j < STATE_BYTES; j++) out[j] = (uint8_t)((h >> ((j % 8) * 8)) ^ j);
}

static bool layer_has_kv(const fx *f, uint32_t layer) {
    return kvt_kv_layout_layer(f->layout, layer)->kind != KVT_KIND_RECURRENT;
}

/* Appends toks[0..n) to s in chunks of `step` tokens (like a prefill). */
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

static kvt_seq *mk_seq(fx *f, const int32_t *toks, uint32_t n, uint32_t step) {
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f->pool, f->root, &s), KVT_OK);
    seq_feed(f, s, toks, n, step);
    return s;
}

/* s holds exactly toks[0..L) with the right K/V rows (WINDOW layers: the rows a query at L sees) and,
 * for recurrent layouts, the right state. */
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

static void toks_range(int32_t *t, uint32_t n, int32_t first) {
    for (uint32_t i = 0; i < n; i++) t[i] = first + (int32_t)(i * 7 % 101);
}

static kvt_chain *chain_of(fx *f, const int32_t *toks, uint32_t n) {
    kvt_chain *c = NULL;
    assert_int_equal(kvt_chain_create(f->root, toks, n, BT, &c), KVT_OK);
    return c;
}

static void flush_ok(fx *f) {
    kvt_tiers_flush_result r;
    kvt_tiers_flush(f->t, 10000, &r);
    assert_true(r.durable);
}

/* Puts toks[0..n) through the tiers (RAM + write-behind) and flushes. */
static void put_flush(fx *f, const int32_t *toks, uint32_t n) {
    kvt_seq *s = mk_seq(f, toks, n, n);
    assert_int_equal(kvt_tiers_put(f->t, s), KVT_OK);
    kvt_seq_free(s);
    flush_ok(f);
}

static kvt_ssd_stats ssd_stats(fx *f) {
    kvt_ssd_stats s;
    kvt_ssd_stats_get(f->ssd, &s);
    return s;
}

static kvt_prompt_cache_stats ram_stats(fx *f) {
    kvt_prompt_cache_stats s;
    kvt_prompt_cache_stats_get(f->pc, &s);
    return s;
}

/* Payload bytes (and files) of the SSD files of blocks [from, to) that a sequence of length L needs:
 * FULL groups always, the WINDOW group inside its window (what a restore reads). */
static uint64_t ssd_need(fx *f, uint32_t from, uint32_t to, uint32_t L, uint64_t *files) {
    uint64_t b = 0;
    *files = 0;
    for (uint32_t i = from; i < to; i++)
        for (uint32_t g = 0; g < kvt_kv_layout_n_groups(f->layout); g++) {
            bool win = kvt_kv_layout_group_kind(f->layout, g) == KVT_KIND_WINDOW;
            if (win && i < (L > WIN ? (L - WIN) / BT : 0)) continue;
            b += kvt_kv_layout_block_bytes(f->layout, g, i);
            (*files)++;
        }
    return b;
}

/* The prompt's first 32 tokens are on disk; RAM holds only its first `in_ram` tokens. A lookup of
 * the 33-token prompt restores blocks [in_ram/BT, 8) from SSD and shares RAM's blocks: the bytes
 * read from disk are exactly the SSD half. */
static void mixed_case(int kind, uint32_t in_ram) {
    fx f;
    fx_init(&f, kind, 0, true);
    int32_t toks[33];
    toks_range(toks, 33, 11);
    put_flush(&f, toks, 32);
    /* a restart: RAM empty, the SSD index rebuilt from the files */
    close_tiers(&f);
    kvt_prompt_cache_clear(f.pc);
    open_tiers(&f);
    kvt_seq *r = mk_seq(&f, toks, in_ram, in_ram);
    assert_int_equal(kvt_prompt_cache_put(f.pc, r), KVT_OK);
    kvt_chain *c = chain_of(&f, toks, 33);
    kvt_ssd_stats s0 = ssd_stats(&f);
    kvt_prompt_cache_stats p0 = ram_stats(&f);
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    kvt_ssd_stats s1 = ssd_stats(&f);
    kvt_prompt_cache_stats p1 = ram_stats(&f);
    const uint32_t k = in_ram / BT;
    assert_non_null(hit.seq);
    assert_int_equal(hit.n_reused, 32);
    assert_int_equal(hit.from, KVT_TIER_SSD);
    assert_int_equal(hit.n_blocks, 8);
    assert_int_equal(hit.ram_blocks, k);
    assert_int_equal(hit.ssd_blocks, 8 - k);
    for (uint32_t i = 0; i < 8; i++) assert_int_equal(kvt_tiers_block_source(&hit, i), i < k ? KVT_TIER_RAM : KVT_TIER_SSD);
    assert_int_equal(kvt_tiers_block_source(&hit, 8), KVT_TIER_NONE);
    /* the RAM half is RAM's very blocks (shared, not read) */
    for (uint32_t i = 0; i < k; i++) assert_ptr_equal(kvt_seq_block(hit.seq, 0, i), kvt_seq_block(r, 0, i));
    /* only the SSD half was read from disk (plus the snapshot of recurrent layouts) */
    uint64_t files = 0;
    uint64_t want = ssd_need(&f, k, 8, 32, &files) + (kind == LAY_RECURRENT ? STATE_BYTES : 0);
    assert_int_equal(hit.ssd_bytes_read, want);
    assert_int_equal(s1.read_bytes - s0.read_bytes, want);
    assert_int_equal(hit.ssd_files_read, files + (kind == LAY_RECURRENT));
    if (kind == LAY_RECURRENT) assert_int_equal(hit.state_from, KVT_TIER_SSD);
    assert_int_equal(s1.restores, s0.restores + 1);
    /* RAM served blocks [0, k): one hit of k*BT tokens, or (k = 0) one RAM miss */
    assert_int_equal(p1.hits, p0.hits + (k ? 1 : 0));
    assert_int_equal(p1.misses, p0.misses + (k ? 0 : 1));
    assert_int_equal(p1.reused_tokens, p0.reused_tokens + k * BT);
    check_seq(&f, hit.seq, toks, 32);
    kvt_seq_free(hit.seq);
    kvt_seq_free(r);

    /* the same lookup with RAM empty reads everything from disk: a RAM miss, counted */
    kvt_prompt_cache_clear(f.pc);
    s0 = ssd_stats(&f);
    p0 = ram_stats(&f);
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    s1 = ssd_stats(&f);
    p1 = ram_stats(&f);
    assert_int_equal(p1.misses, p0.misses + 1);
    assert_int_equal(p1.hits, p0.hits);
    assert_int_equal(hit.n_reused, 32);
    assert_int_equal(hit.ram_blocks, 0);
    assert_int_equal(s1.read_bytes - s0.read_bytes, ssd_need(&f, 0, 8, 32, &files) + (kind == LAY_RECURRENT ? STATE_BYTES : 0));
    check_seq(&f, hit.seq, toks, 32);
    kvt_seq_free(hit.seq);
    kvt_chain_release(c);
    fx_free(&f);
}

static void test_mixed_full(void **st) {
    (void)st;
    mixed_case(LAY_FULL, 16);
    mixed_case(LAY_FULL, 18); /* a partial RAM tail: its full blocks still count */
    mixed_case(LAY_FULL, 4);
}
static void test_mixed_window(void **st) {
    (void)st;
    /* RAM's sequence was fed in one chunk: its window blocks 0-1 left the window, but a prefix of
     * 32 does not need them, so RAM still supplies blocks 0-3 (FULL group + window blocks 2-3) */
    mixed_case(LAY_WINDOW, 16);
}
static void test_mixed_recurrent(void **st) {
    (void)st;
    mixed_case(LAY_RECURRENT, 16); /* RAM's snapshot at 16 is not the SSD one at 32: state from SSD */
}

/* RAM alone: the SSD tier is not touched when it adds nothing (ties go to RAM). */
static void test_ram_wins_ties(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0, true);
    int32_t toks[33];
    toks_range(toks, 33, 5);
    put_flush(&f, toks, 32); /* RAM and SSD both hold 32 */
    kvt_chain *c = chain_of(&f, toks, 33);
    kvt_ssd_stats s0 = ssd_stats(&f);
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    kvt_ssd_stats s1 = ssd_stats(&f);
    assert_int_equal(hit.from, KVT_TIER_RAM);
    assert_int_equal(hit.n_reused, 32);
    assert_int_equal(hit.ram_blocks, 8);
    assert_int_equal(hit.ssd_blocks, 0);
    assert_int_equal(s1.read_bytes, s0.read_bytes);
    assert_int_equal(s1.restores, s0.restores);
    check_seq(&f, hit.seq, toks, 32);
    kvt_seq_free(hit.seq);
    kvt_chain_release(c);
    fx_free(&f);
}

/* A discarded RAM take is not a hit: when the SSD restore fails after RAM's blocks were taken, RAM
 * serves its own plan and the RAM tier counts exactly that one take. */
static void test_honest_counters(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0, true);
    int32_t toks[33];
    toks_range(toks, 33, 21);
    put_flush(&f, toks, 32);
    close_tiers(&f);
    kvt_prompt_cache_clear(f.pc);
    open_tiers(&f);
    kvt_seq *r = mk_seq(&f, toks, 16, 16);
    assert_int_equal(kvt_prompt_cache_put(f.pc, r), KVT_OK);
    kvt_seq_free(r);
    kvt_ssd_set_fault(f.ssd, KVT_SSD_FAULT_EIO_READ);
    kvt_chain *c = chain_of(&f, toks, 33);
    kvt_prompt_cache_stats p0 = ram_stats(&f);
    kvt_ssd_stats s0 = ssd_stats(&f);
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    kvt_prompt_cache_stats p1 = ram_stats(&f);
    kvt_ssd_stats s1 = ssd_stats(&f);
    assert_int_equal(hit.from, KVT_TIER_RAM);
    assert_int_equal(hit.n_reused, 16);
    assert_int_equal(hit.ssd_blocks, 0);
    assert_int_equal(p1.hits, p0.hits + 1);
    assert_int_equal(p1.reused_tokens, p0.reused_tokens + 16);
    assert_int_equal(p1.misses, p0.misses);
    assert_int_equal(s1.restores, s0.restores);
    check_seq(&f, hit.seq, toks, 16);
    kvt_seq_free(hit.seq);
    kvt_ssd_set_fault(f.ssd, KVT_SSD_FAULT_NONE);
    kvt_chain_release(c);
    fx_free(&f);
}

/* The request chain is hashed once: creating it hashes each full block; both tiers' lookups and the
 * sealing of the prompt's blocks (and the RAM put) hash nothing more, and give the same hashes as
 * hashing from scratch. */
static void test_chain_hashed_once(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_WINDOW, 0, true);
    enum { N = 41 };
    int32_t toks[N];
    toks_range(toks, N, 3);
    put_flush(&f, toks, 24);
    uint64_t h0 = kvt_chain_hash_calls();
    kvt_chain *c = chain_of(&f, toks, N);
    assert_int_equal(kvt_chain_hash_calls() - h0, N / BT); /* once per full block */
    uint64_t want[N / BT + 1];
    want[0] = f.root;
    for (uint32_t i = 0; i < N / BT; i++) want[i + 1] = kvt_chain_hash(want[i], toks + i * BT, BT);
    for (uint32_t i = 0; i <= N / BT; i++) assert_true(kvt_chain_at(c, i) == want[i]);

    h0 = kvt_chain_hash_calls();
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK); /* RAM peek + take, SSD find */
    assert_int_equal(hit.n_reused, 24);
    assert_int_equal(kvt_chain_hash_calls() - h0, 0);
    /* prefill the rest with the chain attached: sealing full blocks hashes nothing */
    kvt_seq_set_chain(hit.seq, c);
    h0 = kvt_chain_hash_calls();
    seq_feed(&f, hit.seq, toks + 24, N - 24, 3);
    assert_int_equal(kvt_chain_hash_calls() - h0, 0);
    for (uint32_t i = 0; i < N / BT; i++) {
        assert_true(kvt_seq_block_chain(hit.seq, i) == want[i + 1]);
        assert_true(kvt_block_hash(kvt_seq_block(hit.seq, 0, i)) == want[i + 1]);
    }
    /* registering it: full blocks reuse the sealed hashes; only the 1-token tail is hashed */
    h0 = kvt_chain_hash_calls();
    assert_int_equal(kvt_prompt_cache_put(f.pc, hit.seq), KVT_OK);
    assert_int_equal(kvt_chain_hash_calls() - h0, 1);
    kvt_seq_free(hit.seq);
    /* a sequence whose tokens differ from the chain's is hashed as usual (and correctly) */
    int32_t other[N];
    toks_range(other, N, 50);
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f.pool, f.root, &s), KVT_OK);
    kvt_seq_set_chain(s, c);
    h0 = kvt_chain_hash_calls();
    seq_feed(&f, s, other, 16, 16);
    assert_int_equal(kvt_chain_hash_calls() - h0, 4);
    uint64_t p = f.root;
    for (uint32_t i = 0; i < 4; i++) {
        p = kvt_chain_hash(p, other + i * BT, BT);
        assert_true(kvt_seq_block_chain(s, i) == p);
    }
    kvt_seq_free(s);
    /* the same prompt without the chain costs one hash per block again (what the chain saves) */
    assert_int_equal(kvt_seq_create(f.pool, f.root, &s), KVT_OK);
    h0 = kvt_chain_hash_calls();
    seq_feed(&f, s, toks, 16, 16);
    assert_int_equal(kvt_chain_hash_calls() - h0, 4);
    kvt_seq_free(s);
    kvt_chain_release(c);
    fx_free(&f);
}

/* Window blocks registered while a window sequence grows (put_blocks) and boundary snapshots
 * (put of a recurrent sequence) enter write-behind like any other block: after a restart with RAM
 * empty, the SSD tier serves them. */
static void test_window_and_snapshot_write_behind(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_WINDOW, 0, true);
    enum { N = 40 };
    int32_t toks[N + 1];
    toks_range(toks, N + 1, 9);
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f.pool, f.root, &s), KVT_OK);
    for (uint32_t done = 0; done < N; done += 4) { /* chunks of one block, like the engine's prefill */
        seq_feed(&f, s, toks + done, 4, 4);
        assert_int_equal(kvt_tiers_put_blocks(f.t, s), KVT_OK);
    }
    assert_null(kvt_seq_block(s, 1, 0)); /* the window group's first block left the live window */
    flush_ok(&f);
    kvt_seq_free(s);
    close_tiers(&f);
    kvt_prompt_cache_clear(f.pc);
    open_tiers(&f);
    int32_t div[N + 1];
    memcpy(div, toks, sizeof div);
    div[10] += 1; /* diverges at 10: needs window blocks 0..1, which had left the window */
    kvt_chain *c = chain_of(&f, div, N + 1);
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    assert_int_equal(hit.from, KVT_TIER_SSD);
    assert_int_equal(hit.n_reused, 10);
    check_seq(&f, hit.seq, div, 10);
    kvt_seq_free(hit.seq);
    kvt_chain_release(c);
    fx_free(&f);

    fx_init(&f, LAY_RECURRENT, 0, true);
    s = mk_seq(&f, toks, 22, 22); /* a prompt boundary inside block 5 */
    assert_int_equal(kvt_tiers_put(f.t, s), KVT_OK);
    flush_ok(&f);
    kvt_seq_free(s);
    close_tiers(&f);
    kvt_prompt_cache_clear(f.pc);
    open_tiers(&f);
    c = chain_of(&f, toks, 30);
    assert_int_equal(kvt_tiers_lookup(f.t, c, &hit), KVT_OK);
    assert_int_equal(hit.from, KVT_TIER_SSD);
    assert_int_equal(hit.n_reused, 22); /* only at the snapshot: the state was written behind */
    assert_int_equal(hit.state_from, KVT_TIER_SSD);
    check_seq(&f, hit.seq, toks, 22);
    kvt_seq_free(hit.seq);
    kvt_chain_release(c);
    fx_free(&f);
}

/* Memory pressure with an SSD tier attached: an 8-block pool, write-behind off, spill sink on. The
 * RAM tier holds 8 cache-only blocks; a new 8-block sequence evicts them (spilled into SSD records
 * that retain them) and the pressure path stages those records at once (their images to the heap,
 * the blocks released), so every allocation succeeds, and the writer then persists every evicted
 * block: nothing is dropped. Without the tier's SSD staging the spilled blocks stay referenced and
 * the allocation fails (checked with the RAM tier's own pressure callback). */
static void test_pressure_8_blocks(void **st) {
    (void)st;
    for (int with_tiers = 1; with_tiers >= 0; with_tiers--) {
        fx f;
        fx_init(&f, LAY_FULL, 8, false);
        if (!with_tiers) kvt_block_pool_set_pressure(f.pool, kvt_prompt_cache_pressure_cb, f.pc);
        kvt_ssd_pause_writer(f.ssd, true); /* the records cannot be published in the meantime */
        int32_t a[33], b[33];
        toks_range(a, 33, 1);
        toks_range(b, 33, 200);
        kvt_seq *s = mk_seq(&f, a, 32, 32);
        assert_int_equal(kvt_tiers_put(f.t, s), KVT_OK);
        kvt_seq_free(s);
        assert_int_equal(ram_stats(&f).blocks, 8);
        assert_int_equal(kvt_block_pool_used_bytes(f.pool), 8 * kvt_kv_layout_block_bytes(f.layout, 0, 0));
        assert_int_equal(kvt_seq_create(f.pool, f.root, &s), KVT_OK);
        kvt_status ps = KVT_OK;
        uint32_t done = 0;
        for (; done < 32 && ps == KVT_OK; done += 4) {
            ps = kvt_seq_prepare(s, 4);
            if (ps == KVT_OK) assert_int_equal(kvt_seq_commit(s, b + done, 4), KVT_OK);
        }
        kvt_ssd_stats ss = ssd_stats(&f);
        if (with_tiers) {
            assert_int_equal(ps, KVT_OK);
            assert_int_equal(kvt_seq_len(s), 32);
            assert_true(ram_stats(&f).evictions >= 8);
            assert_true(ss.spills >= 8); /* spilled to the SSD tier ... */
            assert_true(ss.staged >= 8); /* ... and their pool blocks freed at once under pressure */
            assert_int_equal(ss.shed, 0); /* nothing dropped unwritten */
        } else {
            assert_int_equal(ps, KVT_ERR_POOL_EXHAUSTED); /* spilled blocks stay held by the records */
        }
        kvt_seq_free(s);
        kvt_ssd_pause_writer(f.ssd, false);
        if (with_tiers) { /* the evicted prompt is persisted: a flush is durable and the disk serves it */
            kvt_ssd_flush_result fr;
            kvt_ssd_flush(f.ssd, 10000, &fr);
            assert_true(fr.durable);
            assert_int_equal(kvt_ssd_find(f.ssd, a, 33, f.root), 32);
        }
        fx_free(&f);
    }
}

/* kvt_ssd_restore_from refuses a base that is not the chain's first blocks (other tokens, another
 * root, a partial block) instead of building on it; a base the plan cannot extend is a miss. */
static void test_restore_from_base_checked(void **st) {
    (void)st;
    fx f;
    fx_init(&f, LAY_FULL, 0, true);
    int32_t toks[33], other[33];
    toks_range(toks, 33, 31);
    toks_range(other, 33, 77);
    put_flush(&f, toks, 32);
    kvt_chain *c = chain_of(&f, toks, 33);
    kvt_seq *out = NULL;
    uint32_t got = 7;
    kvt_ssd_restore_info info;
    kvt_seq *bad = mk_seq(&f, other, 8, 8); /* other tokens */
    assert_int_equal(kvt_ssd_restore_from(f.ssd, c, bad, &out, &got, &info), KVT_ERR_INVALID_ARG);
    assert_null(out);
    assert_int_equal(got, 0);
    kvt_seq_free(bad);
    bad = mk_seq(&f, toks, 6, 6); /* not whole blocks */
    assert_int_equal(kvt_ssd_restore_from(f.ssd, c, bad, &out, &got, &info), KVT_ERR_INVALID_ARG);
    kvt_seq_free(bad);
    kvt_seq *good = mk_seq(&f, toks, 8, 8);
    assert_int_equal(kvt_ssd_restore_from(f.ssd, c, good, &out, &got, &info), KVT_OK);
    assert_int_equal(got, 32);
    assert_int_equal(info.files_read, 6); /* blocks 2..7 only */
    assert_ptr_equal(kvt_seq_block(out, 0, 0), kvt_seq_block(good, 0, 0));
    check_seq(&f, out, toks, 32);
    kvt_seq_free(out);
    kvt_seq_free(good);
    /* a base covering everything the index could add: nothing to restore, a miss */
    good = mk_seq(&f, toks, 32, 32);
    assert_int_equal(kvt_ssd_find_from(f.ssd, c, 8), 0);
    assert_int_equal(kvt_ssd_restore_from(f.ssd, c, good, &out, &got, &info), KVT_OK);
    assert_null(out);
    assert_int_equal(info.files_read, 0);
    kvt_seq_free(good);
    kvt_chain_release(c);
    fx_free(&f);
}

/* The engine computes a request's chain once: a cold 100-token prompt (6 full blocks of 16) with
 * the RAM and SSD tiers attached hashes each prompt block once (chain), plus one hash per frozen
 * tail put (the prompt-boundary put and the final put); the lookups of both tiers and the sealing
 * of the prompt's blocks hash nothing. (Without the shared chain the RAM walk, the SSD walk,
 * sealing and each put's walk hashed the blocks again: >= 4x.) */
static void test_engine_hashes_prompt_once(void **st) {
    (void)st;
    char *dir = tu_tmpdir("tiers-eng");
    assert_non_null(dir);
    char model[600], ssd[600];
    snprintf(model, sizeof model, "%s/llama.gguf", dir);
    snprintf(ssd, sizeof ssd, "%s/ssd", dir);
    kvt_gen_model_opts mo = {.arch = "llama", .shape = "tiny", .type = "f16", .seed = 7};
    char err[512] = "";
    assert_int_equal(kvt_gen_model(&mo, model, err, sizeof err), KVT_OK);
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.prompt_cache_gb = 1.0;
    o.snapshot_min_tokens = 64;
    o.ssd_dir = ssd;
    /* the SSD writer re-checks each record header it encodes (one chain hash) on its own thread;
     * with write-behind it would hash beside the generation and the process-wide count would race */
    o.ssd_writeback = false;
    kvt_engine *e = NULL;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    int32_t ids[100];
    uint64_t seed = 3;
    for (int i = 0; i < 100; i++) ids[i] = (int32_t)(300 + tu_rand(&seed) % 2000);
    kvt_gen_request r = {.prompt = ids, .n_prompt = 100, .max_tokens = 4, .ignore_eog = true};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    uint64_t h0 = kvt_chain_hash_calls();
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_OK);
    uint64_t used = kvt_chain_hash_calls() - h0;
    free(res.tokens);
    assert_int_equal(res.n_reused, 0);
    assert_int_equal(used, 6 + 2);
    /* a warm repeat: the chain again (6), RAM serves 99 tokens, nothing else is hashed but the tail put */
    h0 = kvt_chain_hash_calls();
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_OK);
    used = kvt_chain_hash_calls() - h0;
    free(res.tokens);
    assert_int_equal(res.n_reused, 99);
    assert_true(used <= 6 + 2);
    kvt_engine_free(e);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

/* The write-behind switch is the tier manager's alone: with it off, a put queues nothing for the
 * SSD tier (the SSD tier's own flush finds nothing owed and writes nothing), and the manager's
 * flush writes what the RAM tier holds. (Moved from test_ssd_cache.c when the switch left the SSD
 * tier.) */
static void test_writeback_off(void **state) {
    (void)state;
    fx f;
    fx_init(&f, LAY_FULL, 256, false);
    int32_t toks[16];
    toks_range(toks, 16, 3);
    kvt_seq *s = mk_seq(&f, toks, 16, 16);
    assert_int_equal(kvt_tiers_put(f.t, s), KVT_OK);
    kvt_seq_free(s);
    kvt_ssd_flush_result sr;
    kvt_ssd_flush(f.ssd, 10000, &sr);
    assert_true(sr.durable);
    assert_int_equal(sr.entries, 0);
    assert_int_equal(ssd_stats(&f).published, 0);
    kvt_tiers_flush_result r;
    kvt_tiers_flush(f.t, 10000, &r);
    assert_true(r.durable);
    assert_true(r.checkpoints_durable);
    assert_int_equal(r.shared_pending, 0);
    assert_true(r.blocks.entries >= 4); /* 4 full blocks per group */
    assert_true(ssd_stats(&f).published >= 4);
    fx_free(&f);
}

/* One lookup plans each tier exactly once and carries the plan into the take / restore
 * (kvt_prompt_cache_plan_calls, kvt_ssd_plan_calls): a RAM hit, an SSD hit and a mixed RAM+SSD
 * hit, for every layout kind. */
static uint32_t lookup_plans(fx *f, const kvt_chain *c, uint32_t want_reused, kvt_tier want_from, uint64_t *ssd_plans) {
    const uint64_t r0 = kvt_prompt_cache_plan_calls(), s0 = kvt_ssd_plan_calls();
    kvt_tiers_hit hit;
    assert_int_equal(kvt_tiers_lookup(f->t, c, &hit), KVT_OK);
    const uint64_t r1 = kvt_prompt_cache_plan_calls(), s1 = kvt_ssd_plan_calls();
    assert_non_null(hit.seq);
    assert_int_equal(hit.n_reused, want_reused);
    assert_int_equal(hit.from, want_from);
    kvt_seq_free(hit.seq);
    *ssd_plans = s1 - s0;
    return (uint32_t)(r1 - r0);
}

static void test_lookup_plans_each_tier_once(void **state) {
    (void)state;
    const int kinds[] = {LAY_FULL, LAY_WINDOW, LAY_RECURRENT};
    for (size_t ki = 0; ki < 3; ki++) {
        fx f;
        fx_init(&f, kinds[ki], 0, true);
        int32_t toks[33];
        toks_range(toks, 33, 11);
        put_flush(&f, toks, 32);
        kvt_chain *c = chain_of(&f, toks, 33);
        uint64_t sp = 0;
        /* RAM hit: RAM holds all 32 tokens, the SSD tier ties (ties go to RAM) */
        assert_int_equal(lookup_plans(&f, c, 32, KVT_TIER_RAM, &sp), 1);
        assert_int_equal(sp, 1);
        /* SSD hit: RAM empty */
        kvt_prompt_cache_clear(f.pc);
        assert_int_equal(lookup_plans(&f, c, 32, KVT_TIER_SSD, &sp), 1);
        assert_int_equal(sp, 1);
        /* mixed: RAM holds the first 16 tokens, the SSD tier the rest */
        kvt_prompt_cache_clear(f.pc);
        kvt_seq *r = mk_seq(&f, toks, 16, 16);
        assert_int_equal(kvt_prompt_cache_put(f.pc, r), KVT_OK);
        assert_int_equal(lookup_plans(&f, c, 32, KVT_TIER_SSD, &sp), 1);
        assert_int_equal(sp, 1);
        kvt_seq_free(r);
        kvt_chain_release(c);
        fx_free(&f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_full),        cmocka_unit_test(test_mixed_window),
        cmocka_unit_test(test_mixed_recurrent),   cmocka_unit_test(test_ram_wins_ties),
        cmocka_unit_test(test_honest_counters),   cmocka_unit_test(test_chain_hashed_once),
        cmocka_unit_test(test_window_and_snapshot_write_behind), cmocka_unit_test(test_pressure_8_blocks),
        cmocka_unit_test(test_restore_from_base_checked), cmocka_unit_test(test_engine_hashes_prompt_once), cmocka_unit_test(test_writeback_off),
        cmocka_unit_test(test_lookup_plans_each_tier_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
