/* tier_mixed.c — one lookup plan over both tiers (docs/tiers.md): bytes read from disk and lookup time
 * for a 7,000-token prompt (8 layers, 4 KV heads x 64, f16, 256-token blocks) restored from the SSD
 * tier alone vs with its first half already in the RAM tier (only the SSD half is read).
 *   cc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/tier_mixed.c build/libkvtier.a \
 *      -lmicrohttpd -lcjson -lpcre2-8 -lxxhash -lhiredis -lssl -lcrypto -lm -o build/bench-tier-mixed
 *   mkdir -m 700 /tmp/tm && build/bench-tier-mixed /tmp/tm
 * The directory must be new (0700, owned by the caller). Times include the page cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cache/prompt_cache.h"
#include "cache/ssd_cache.h"
#include "cache/tier.h"
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    kvt_layer_desc d[8]; memset(d, 0, sizeof d);
    for (int i = 0; i < 8; i++) { d[i].kind = KVT_KIND_FULL; d[i].n_kv_heads = 4; d[i].head_dim_k = d[i].head_dim_v = 64; d[i].codec.kind = KVT_CODEC_F16; }
    kvt_codec base = {.kind = KVT_CODEC_F16}; char err[256];
    kvt_kv_layout *l; if (kvt_kv_layout_create(d, 8, 256, base, 0, &l, err, sizeof err)) return 1;
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_prompt_cache *pc = kvt_prompt_cache_create(pool, 1ull << 34);
    kvt_ssd_opts o; kvt_ssd_opts_default(&o); o.dir = dir; o.compat_key = "bench-mixed";
    kvt_ssd *ssd; if (kvt_ssd_open(&o, l, pool, &ssd, err, sizeof err)) return 2;
    kvt_tiers_opts to = {.pool = pool, .ram = pc, .ssd = ssd, .writeback = true};
    kvt_tiers *t = kvt_tiers_create(&to);
    enum { N = 7000 }; static int32_t toks[N + 1];
    for (int i = 0; i <= N; i++) toks[i] = (i * 7919) % 30000;
    uint64_t root = kvt_root_hash("bench-mixed", "");
    kvt_seq *s; kvt_seq_create(pool, root, &s);
    kvt_seq_prepare(s, N); kvt_seq_commit(s, toks, N);
    kvt_tiers_put(t, s);
    kvt_tiers_flush_result fr; kvt_tiers_flush(t, 60000, &fr);
    kvt_seq_free(s);
    for (int half = 0; half < 2; half++) {
        for (int rep = 0; rep < 3; rep++) {
            kvt_prompt_cache_clear(pc);
            if (half) { kvt_seq_create(pool, root, &s); kvt_seq_prepare(s, N / 2); kvt_seq_commit(s, toks, N / 2); kvt_prompt_cache_put(pc, s); kvt_seq_free(s); }
            kvt_chain *c; kvt_chain_create(root, toks, N + 1, 256, &c);
            kvt_ssd_stats a, b; kvt_ssd_stats_get(ssd, &a);
            double t0 = kvt_now_ms();
            kvt_tiers_hit h; kvt_tiers_lookup(t, c, &h);
            double ms = kvt_now_ms() - t0;
            kvt_ssd_stats_get(ssd, &b);
            printf("%s: reused %u tokens, ram_blocks %u ssd_blocks %u, read %.1f MB, lookup %.1f ms\n", half ? "RAM half + SSD" : "SSD only", h.n_reused, h.ram_blocks, h.ssd_blocks, (b.read_bytes - a.read_bytes) / 1e6, ms);
            kvt_seq_free(h.seq); kvt_chain_release(c);
        }
    }
    kvt_tiers_free(t); kvt_ssd_free(ssd); kvt_prompt_cache_free(pc); kvt_block_pool_free(pool); kvt_kv_layout_free(l);
    return 0;
}
