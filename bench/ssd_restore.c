// bench/ssd_restore.c — SSD-tier restore bandwidth and tail file sizes, without a model.
// Built by hand (not part of `make`):
//   gcc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/ssd_restore.c src/util/common.c src/kv/*.c
//     + src/cache/ssd_cache.c -lxxhash -lssl -lcrypto -lm -o /tmp/bench_ssd_restore
//   /tmp/bench_ssd_restore [dir] [n_blocks] [reps]      (defaults: a fresh /tmp dir, 28, 3)
// Layout: SmolLM2-135M shape (30 FULL layers, 3 KV heads, head_dim 64, f16, block 256 tokens).
// Writes n_blocks full blocks plus a 17-token tail through kvt_ssd_enqueue_block + flush, then per
// repetition: closes the tier, drops the page cache (needs root; reported), reopens (scan) and times
// kvt_ssd_restore of the whole chain. Prints restore MB/s (payload bytes / restore wall time) for
// each repetition and the median, then dd's O_DIRECT sequential read rate of a same-size file, and
// the on-disk size of tail files with 1, 17 and 255 tokens against a full block file.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cache/ssd_cache.h"

static bool drop_caches(void) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f) return false;
    bool ok = fputs("3\n", f) >= 0;
    return (fclose(f) == 0) && ok;
}

static uint64_t file_size_of(const char *dir, uint64_t chain, uint32_t kind) {
    char p[8192];
    snprintf(p, sizeof(p), "%s/%016llx-g0.%s", dir, (unsigned long long)chain, kind == 1 ? "kvb" : "kvt");
    struct stat st;
    return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

int main(int argc, char **argv) {
    char tmpl[] = "/tmp/kvt-ssd-restore.XXXXXX";
    const char *dir = argc > 1 ? argv[1] : mkdtemp(tmpl);
    uint32_t nb = argc > 2 ? (uint32_t)atoi(argv[2]) : 28, reps = argc > 3 ? (uint32_t)atoi(argv[3]) : 3;
    if (!dir || nb == 0 || reps == 0) return 2;
    kvt_layer_desc d[30];
    memset(d, 0, sizeof(d));
    for (int i = 0; i < 30; i++) {
        d[i].kind = KVT_KIND_FULL;
        d[i].n_kv_heads = 3;
        d[i].head_dim_k = d[i].head_dim_v = 64;
        d[i].codec.kind = KVT_CODEC_F16;
    }
    kvt_codec base = {.kind = KVT_CODEC_F16};
    kvt_kv_layout *l = NULL;
    char err[256];
    if (kvt_kv_layout_create(d, 30, 256, base, 0, &l, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "layout: %s\n", err);
        return 1;
    }
    const uint32_t bt = 256;
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_ssd_opts o;
    kvt_ssd_opts_default(&o);
    o.dir = dir;
    o.compat_key = "bench-ssd-restore";
    kvt_ssd *s = NULL;
    if (kvt_ssd_open(&o, l, pool, &s, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    uint32_t n = nb * bt + 1;
    int32_t *toks = malloc((size_t)(n + bt) * 4);
    uint64_t seed = 12345;
    for (uint32_t i = 0; i < n + bt; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(seed >> 40) % 49152;
    }
    uint64_t root = kvt_root_hash(o.compat_key, ""), parent = root;
    uint64_t payload = 0;
    for (uint32_t i = 0; i < nb; i++) {
        kvt_block *b = NULL;
        if (kvt_block_alloc(pool, 0, i, &b) != KVT_OK) return 1;
        uint8_t *p = kvt_block_data_mut(b);
        for (size_t k = 0; k < kvt_block_data_bytes(b); k++) p[k] = (uint8_t)(k * 131 + i * 7);
        kvt_block_seal(b, parent, toks + (size_t)i * bt, bt, 0);
        parent = kvt_block_hash(b);
        payload += kvt_block_data_bytes(b);
        kvt_ssd_enqueue_block(s, b, root);
        kvt_block_release(b);
    }
    /* tails of 1, 17, 255 tokens hanging below the last full block */
    uint32_t tail_m[3] = {1, 17, 255};
    uint64_t tail_chain[3];
    for (int t = 0; t < 3; t++) {
        kvt_block *b = NULL;
        if (kvt_block_alloc(pool, 0, nb, &b) != KVT_OK) return 1;
        uint8_t *p = kvt_block_data_mut(b);
        for (size_t k = 0; k < kvt_block_data_bytes(b); k++) p[k] = (uint8_t)(k * 17 + (size_t)t);
        int32_t tt[256];
        memcpy(tt, toks + (size_t)nb * bt, sizeof(tt));
        tt[0] = 50000 + t; /* distinct chains */
        kvt_block_seal(b, parent, tt, tail_m[t], 0);
        tail_chain[t] = kvt_block_hash(b);
        kvt_ssd_enqueue_block(s, b, root);
        kvt_block_release(b);
    }
    kvt_ssd_flush_result fr;
    kvt_ssd_flush(s, 120000, &fr);
    if (!fr.durable) {
        fprintf(stderr, "flush not durable\n");
        return 1;
    }
    char cdir[4096];
    snprintf(cdir, sizeof(cdir), "%s", kvt_ssd_dir(s));
    kvt_ssd_free(s);

    double mbs[64];
    bool dropped = false;
    for (uint32_t r = 0; r < reps && r < 64; r++) {
        dropped = drop_caches();
        if (kvt_ssd_open(&o, l, pool, &s, err, sizeof(err)) != KVT_OK) return 1;
        kvt_seq *seq = NULL;
        uint32_t got = 0;
        double t0 = now_ms();
        kvt_status st = kvt_ssd_restore(s, toks, n, root, &seq, &got);
        double ms = now_ms() - t0;
        if (st != KVT_OK || got != nb * bt) {
            fprintf(stderr, "restore: %s, %u tokens\n", kvt_status_str(st), got);
            return 1;
        }
        mbs[r] = payload / 1e6 / (ms / 1e3);
        printf("restore %u: %.1f ms, %.0f MB/s (page cache dropped: %s)\n", r, ms, mbs[r], dropped ? "yes" : "no");
        kvt_seq_free(seq);
        kvt_ssd_free(s);
    }
    qsort(mbs, reps, sizeof(double), cmp_d);
    printf("restore median: %.0f MB/s over %.1f MB payload\n", mbs[reps / 2], payload / 1e6);

    /* dd of a same-size file, O_DIRECT */
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "f=%s/ddfile; dd if=/dev/urandom of=$f bs=1M count=%llu conv=fsync status=none; sync; "
             "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; for i in 1 2 3; do "
             "LC_ALL=C dd if=$f of=/dev/null bs=4M iflag=direct 2>&1 | grep copied; done; rm -f $f",
             dir, (unsigned long long)(payload >> 20) + 1);
    if (system(cmd) != 0) fprintf(stderr, "dd failed\n");

    uint64_t full = file_size_of(cdir, parent, 1);
    printf("file sizes: full block %llu B", (unsigned long long)full);
    for (int t = 0; t < 3; t++)
        printf(", tail m=%u %llu B", tail_m[t], (unsigned long long)file_size_of(cdir, tail_chain[t], 2));
    printf("\n");
    free(toks);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
    if (argc <= 1) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) return 1;
    }
    return 0;
}
