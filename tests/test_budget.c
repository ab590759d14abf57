/* test_budget.c — the memory budget (engine/budget.h): per-kind row reservations against
 * hand-computed figures, the size parser, the auto probe over fake /proc/meminfo and cgroup files,
 * the split and its errors, and an engine under a budget. */
#include "testutil.h"

#include <sys/stat.h>

#include "engine/budget.h"
#include "engine/engine.h"

#define F16 ((kvt_codec){.kind = KVT_CODEC_F16})

static kvt_kv_layout *mk(const kvt_layer_desc *d, uint32_t n, uint32_t bt) {
    kvt_kv_layout *l = NULL;
    char err[256];
    if (kvt_kv_layout_create(d, n, bt, F16, 0, &l, err, sizeof err) != KVT_OK) fail_msg("layout: %s", err);
    return l;
}

/* 2 KV heads x 16 dims, f16: a K or V row is 32 B, so a layer holds 2*2*32 = 128 B per token and a
 * 16-token block 2048 B per layer. */
static kvt_layer_desc attn(kvt_layer_kind k, uint32_t window) {
    return (kvt_layer_desc){.kind = k, .window = window, .n_kv_heads = 2, .head_dim_k = 16, .head_dim_v = 16, .codec = F16};
}

/* gemma3-like: 2 FULL layers and 4 WINDOW(64) layers, 16-token blocks. */
static void test_reserve_window(void **st) {
    kvt_layer_desc d[6] = {attn(KVT_KIND_WINDOW, 64), attn(KVT_KIND_WINDOW, 64), attn(KVT_KIND_FULL, 0),
                           attn(KVT_KIND_WINDOW, 64), attn(KVT_KIND_WINDOW, 64), attn(KVT_KIND_FULL, 0)};
    kvt_kv_layout *l = mk(d, 6, 16);
    /* 200 tokens in chunks of 32: FULL 13 blocks x 2 layers x 2048 = 53,248; WINDOW at most
     * (32 + 64 - 2) / 16 + 2 = 7 blocks x 4 layers x 2048 = 57,344 */
    assert_int_equal(kvt_row_kv_bytes(l, 200, 32), 53248 + 57344);
    /* the uniform formula billed every layer for every token: 200 x 6 x 128 = 153,600 */
    assert_int_equal((uint64_t)(200 * kvt_kv_layout_bytes_per_token(l)), 153600);
    /* a short row: the window never bills more blocks than the tokens need (3 blocks each) */
    assert_int_equal(kvt_row_kv_bytes(l, 40, 32), 3 * 2 * 2048 + 3 * 4 * 2048);
    /* chunk 0 = all at once: 200 tokens, (200 + 62) / 16 + 2 = 18 > 13 blocks: all 13 */
    assert_int_equal(kvt_row_kv_bytes(l, 200, 0), 13 * 6 * 2048);
    kvt_kv_layout_free(l);
}

/* qwen35-like: 3 RECURRENT layers (state 1000 B each, 64-aligned: 1024) and 1 FULL layer. */
static void test_reserve_recurrent(void **st) {
    kvt_layer_desc d[4] = {{.kind = KVT_KIND_RECURRENT, .state_bytes = 1000}, {.kind = KVT_KIND_RECURRENT, .state_bytes = 1000},
                           {.kind = KVT_KIND_RECURRENT, .state_bytes = 1000}, attn(KVT_KIND_FULL, 0)};
    kvt_kv_layout *l = mk(d, 4, 16);
    assert_int_equal(kvt_kv_layout_state_bytes(l), 3 * 1024);
    /* 100 tokens: 7 blocks x 2048 of the FULL layer + the state once (not per token) */
    assert_int_equal(kvt_row_kv_bytes(l, 100, 512), 7 * 2048 + 3072);
    assert_int_equal(kvt_row_kv_bytes(l, 1000, 512), 63 * 2048 + 3072);
    kvt_kv_layout_free(l);
}

/* deepseek2-like: 3 MLA layers with a 32-dim latent + 16 RoPE dims: one 48-dim f16 row (96 B) per
 * token and layer, no V section; a 16-token block holds 1,536 B per layer. */
static void test_reserve_mla(void **st) {
    kvt_layer_desc m = {.kind = KVT_KIND_MLA, .n_kv_heads = 1, .head_dim_k = 48, .head_dim_v = 32, .codec = F16};
    kvt_layer_desc d[3] = {m, m, m};
    kvt_kv_layout *l = mk(d, 3, 16);
    assert_int_equal((uint64_t)kvt_kv_layout_bytes_per_token(l), 3 * 96);
    assert_int_equal(kvt_row_kv_bytes(l, 64, 16), 4 * 3 * 1536);
    assert_int_equal(kvt_row_kv_bytes(l, 65, 16), 5 * 3 * 1536);
    kvt_kv_layout_free(l);
}

/* Base-codec blocks before quant_start are billed at their (larger) size. */
static void test_reserve_quant_start(void **st) {
    kvt_layer_desc d[1] = {attn(KVT_KIND_FULL, 0)};
    d[0].head_dim_k = d[0].head_dim_v = 32;
    d[0].codec = (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = 8, .group_size = 32};
    kvt_kv_layout *l = NULL;
    char err[256];
    assert_int_equal(kvt_kv_layout_create(d, 1, 16, F16, 32, &l, err, sizeof err), KVT_OK);
    const uint64_t b0 = kvt_kv_layout_block_bytes(l, 0, 0), b2 = kvt_kv_layout_block_bytes(l, 0, 2);
    assert_true(b0 > b2);
    assert_int_equal(kvt_row_kv_bytes(l, 64, 16), 2 * b0 + 2 * b2);
    kvt_kv_layout_free(l);
}

static void test_size_parse(void **st) {
    uint64_t v;
    char err[256];
    static const struct { const char *s; uint64_t v; } good[] = {
        {"8G", 8ull << 30}, {"512M", 512ull << 20}, {"512m", 512ull << 20}, {"1.5GiB", 3ull << 29}, {"4096k", 4ull << 20},
        {"1073741824", 1ull << 30}, {"2T", 2ull << 40}, {"100MB", 100ull << 20}, {"1", 1}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(kvt_size_parse(good[i].s, &v, err, sizeof err), KVT_OK);
        assert_int_equal(v, good[i].v);
    }
    static const char *const bad[] = {"", "G", "-1G", "+1G", " 8G", "8G ", "8X", "8GG", "0", "0.0G", "1.5", "8Gi",
                                      "1e9", "99999999999999999999999", "16777216T", "8 G", "0x10", ".", "1..5G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (kvt_size_parse(bad[i], &v, err, sizeof err) == KVT_OK) fail_msg("'%s' parsed as %llu", bad[i], (unsigned long long)v);
        assert_true(err[0] != 0);
    }
    assert_int_equal(kvt_size_parse(NULL, &v, err, sizeof err), KVT_ERR_INVALID_ARG);
}

/* ---- the auto probe over fake files ---- */

static char *g_dir;

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}
static void rm(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    unlink(p);
}

#define MEMINFO "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8388608 kB\nBuffers: 1 kB\n"

static void setup_probe(void) {
    g_dir = tu_tmpdir("budget");
    char p[512];
    snprintf(p, sizeof p, "%s/cg", g_dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/cg/memory", g_dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/meminfo", g_dir);
    setenv("KVT_MEMINFO_PATH", p, 1);
    snprintf(p, sizeof p, "%s/cg", g_dir);
    setenv("KVT_CGROUP_DIR", p, 1);
}

static void test_probe(void **st) {
    setup_probe();
    kvt_mem_probe pr;
    char err[512];
    /* no cgroup files: MemAvailable 8 GiB, margin 10% (above 256 MiB) */
    put("meminfo", MEMINFO);
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_OK);
    assert_int_equal(pr.mem_available, 8ull << 30);
    assert_int_equal(pr.cgroup_version, 0);
    assert_int_equal(pr.margin, (8ull << 30) / 10);
    assert_int_equal(pr.budget, (8ull << 30) - (8ull << 30) / 10);
    /* cgroup v2 limit 3 GiB, 1 GiB used: 2 GiB available, margin 256 MiB (10% is less) */
    put("cg/memory.max", "3221225472\n");
    put("cg/memory.current", "1073741824\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_OK);
    assert_int_equal(pr.cgroup_version, 2);
    assert_int_equal(pr.cgroup_limit, 3ull << 30);
    assert_int_equal(pr.available, 2ull << 30);
    assert_int_equal(pr.margin, 256ull << 20);
    assert_int_equal(pr.budget, (2ull << 30) - (256ull << 20));
    /* "max": no limit */
    put("cg/memory.max", "max\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_OK);
    assert_int_equal(pr.cgroup_limit, 0);
    assert_int_equal(pr.available, 8ull << 30);
    /* malformed v2 file: a clear error */
    put("cg/memory.max", "lots\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "memory.max"));
    rm("cg/memory.max");
    rm("cg/memory.current");
    /* cgroup v1: "unlimited" is a huge number; a real limit counts */
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("cg/memory/memory.usage_in_bytes", "1000\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_OK);
    assert_int_equal(pr.cgroup_version, 1);
    assert_int_equal(pr.cgroup_limit, 0);
    put("cg/memory/memory.limit_in_bytes", "1073741824\n");
    put("cg/memory/memory.usage_in_bytes", "536870912\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_OK);
    assert_int_equal(pr.available, 512ull << 20);
    assert_int_equal(pr.budget, 256ull << 20);
    /* usage above the limit: nothing available -> error that says to give a size */
    put("cg/memory/memory.usage_in_bytes", "2147483648\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--memory-budget SIZE"));
    rm("cg/memory/memory.limit_in_bytes");
    rm("cg/memory/memory.usage_in_bytes");
    /* bad meminfo: missing line, garbage, absurd, zero, a lookalike key, unreadable */
    static const char *const badmi[] = {"MemTotal: 100 kB\n", "MemAvailable: lots kB\n", "MemAvailable: 99999999999999999999 kB\n",
                                        "MemAvailable: 0 kB\n", "XMemAvailable: 100 kB\n", "MemAvailable: 100 MB\n", ""};
    for (size_t i = 0; i < sizeof badmi / sizeof badmi[0]; i++) {
        put("meminfo", badmi[i]);
        assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_FORMAT);
        assert_non_null(strstr(err, "MemAvailable"));
    }
    /* a huge file is read only up to a bound (the line beyond it is not seen) */
    {
        char p[512];
        snprintf(p, sizeof p, "%s/meminfo", g_dir);
        FILE *f = fopen(p, "w");
        for (int i = 0; i < 100000; i++) fputs("Junk:  1 kB\n", f);
        fputs("MemAvailable: 8388608 kB\n", f);
        fclose(f);
        assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_FORMAT);
    }
    rm("meminfo");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_IO);
    /* little memory: not more than the margin */
    put("meminfo", "MemAvailable: 200000 kB\n");
    assert_int_equal(kvt_mem_probe_auto(&pr, err, sizeof err), KVT_ERR_INVALID_ARG);
    unsetenv("KVT_MEMINFO_PATH");
    unsetenv("KVT_CGROUP_DIR");
}

/* ---- the split ---- */

static kvt_mem_split_in split_in(void) {
    kvt_mem_split_in in = {.budget = 1000ull << 20,
                           .parts = {.weights = 100ull << 20, .weight_copies = 50ull << 20, .compute = 20ull << 20,
                                     .spill_queue = 256ull << 20, .text = 68ull << 20},
                           .row_bytes = 64ull << 20, .parallel = 4, .ram_tier = 8000000000ull};
    return in;
}

static void test_split(void **st) {
    char err[1024];
    kvt_mem_split sp;
    kvt_mem_split_in in = split_in();
    /* fixed 494 MiB, 506 MiB left for KV: RAM tier = 506 - one row 64 = 442 MiB; pool = min(506,
     * 4 rows + 442) = 506 MiB */
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.fixed, 494ull << 20);
    assert_int_equal(sp.ram_tier, 442ull << 20);
    assert_int_equal(sp.kv_pool, 506ull << 20);
    assert_int_equal(sp.live_rows, 256ull << 20);
    char line[1024];
    kvt_mem_split_describe(&in, &sp, "test", line, sizeof line);
    assert_non_null(strstr(line, "KV pool"));
    assert_non_null(strstr(line, "RAM tier"));
    assert_non_null(strstr(line, "SSD spill queue"));
    /* plenty of memory: the default RAM tier cap holds and the pool is rows + RAM tier */
    in.budget = 100ull << 30;
    in.ram_tier = 1ull << 30;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.ram_tier, 1ull << 30);
    assert_int_equal(sp.kv_pool, (1ull << 30) + (256ull << 20));
    /* an explicit pool is honoured when it fits, an error when it does not */
    in = split_in();
    in.kv_pool = 300ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.kv_pool, 300ull << 20);
    assert_int_equal(sp.ram_tier, 236ull << 20);
    in.kv_pool = 600ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--kv-pool-gb"));
    /* an explicit RAM tier must leave one row in the pool; 0 (off) is honoured */
    in = split_in();
    in.ram_tier_set = true;
    in.ram_tier = 400ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.ram_tier, 400ull << 20);
    in.ram_tier = 450ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--prompt-cache"));
    in.ram_tier = 0;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.ram_tier, 0);
    /* too small: the error names every part and its size */
    in = split_in();
    in.budget = 500ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_ERR_INVALID_ARG);
    static const char *const names[] = {"too small", "model weights 105 MB", "weight copies 52.4 MB", "compute buffers 21.0 MB",
                                        "SSD spill queue 268 MB", "text buffers 71.3 MB", "KV of one full context 67.1 MB"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strstr(err, names[i])) fail_msg("'%s' not in: %s", names[i], err);
    assert_null(strstr(err, "draft model")); /* named only with a draft */
    /* a draft model (speculative decoding) is a part of its own: counted in fixed and named */
    in = split_in();
    in.parts.draft = 20ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_OK);
    assert_int_equal(sp.fixed, 514ull << 20);
    assert_int_equal(sp.ram_tier, 422ull << 20);
    kvt_mem_split_describe(&in, &sp, "test", line, sizeof line);
    assert_non_null(strstr(line, "draft model 21.0 MB"));
    in.budget = 560ull << 20;
    assert_int_equal(kvt_mem_split_plan(&in, &sp, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft model 21.0 MB"));
}

/* ---- an engine under a budget ---- */

static char *make_model(const char *arch) {
    char *dir = tu_tmpdir("budget-model");
    char *path = malloc(strlen(dir) + 32);
    sprintf(path, "%s/m.gguf", dir);
    free(dir);
    char err[256];
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = "f16", .seed = 7, .byte_vocab = true};
    if (kvt_gen_model(&o, path, err, sizeof err) != KVT_OK) fail_msg("gen_model: %s", err);
    return path;
}

static void test_engine_budget(void **st) {
    char *path = make_model("gemma3");
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = path;
    o.n_ctx = 512;
    o.block_tokens = 16;
    o.ubatch = 32;
    o.memory_budget = 1ull << 20; /* far too small */
    kvt_engine *e = NULL;
    char err[1024] = "";
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(err, "too small"));
    assert_non_null(strstr(err, "model weights"));
    assert_non_null(strstr(err, "KV of one full context"));
    /* a budget that fits: the pool and the RAM tier come from the split; a generation's pool peak
     * stays within the row's reservation (the window bound holds in practice) */
    o.memory_budget = 256ull << 20;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    kvt_engine_stats s;
    kvt_engine_stats_get(e, &s);
    assert_int_equal(s.mem_budget_bytes, 256ull << 20);
    assert_true(s.mem_weights_bytes > 0 && s.mem_compute_bytes > 0 && s.mem_text_bytes == 16ull << 20);
    assert_int_equal(s.mem_spill_queue_bytes, 0);
    assert_true(s.mem_kv_pool_bytes == s.pool_budget_bytes && s.mem_kv_pool_bytes > 0);
    assert_true(s.mem_ram_tier_bytes > 0 && s.mem_ram_tier_bytes < s.mem_kv_pool_bytes);
    assert_true(s.mem_weights_bytes + s.mem_weight_copies_bytes + s.mem_compute_bytes + s.mem_text_bytes +
                    s.mem_kv_pool_bytes <= s.mem_budget_bytes);
    assert_true(s.mem_rss_bytes > 0 && s.mem_rss_peak_bytes >= s.mem_rss_bytes);
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = 1 + (i * 7) % 200;
    kvt_gen_request req = {.prompt = prompt, .n_prompt = 300, .max_tokens = 100};
    kvt_sampling_default(&req.sampling);
    kvt_gen_result res;
    /* no RAM tier in the peak: measure with the prompt cache off */
    kvt_engine_free(e);
    o.prompt_cache_set = true;
    o.prompt_cache_gb = 0;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) fail_msg("generate: %s", err);
    free(res.tokens);
    kvt_engine_stats_get(e, &s);
    const uint64_t reserve = kvt_row_kv_bytes(kvt_engine_layout(e), 400, 32);
    const uint64_t uniform = (uint64_t)(400 * kvt_kv_layout_bytes_per_token(kvt_engine_layout(e)));
    assert_true(s.pool_peak_bytes > 0);
    if (s.pool_peak_bytes > reserve)
        fail_msg("pool peak %llu above the reservation %llu", (unsigned long long)s.pool_peak_bytes, (unsigned long long)reserve);
    assert_true(reserve < uniform); /* the window layers are billed their window, not the whole row */
    kvt_engine_free(e);
    /* an explicit pool larger than the budget allows: a startup error */
    o.kv_pool_gb = 1.0;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--kv-pool-gb"));
    unlink(path);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_window), cmocka_unit_test(test_reserve_recurrent), cmocka_unit_test(test_reserve_mla),
        cmocka_unit_test(test_reserve_quant_start), cmocka_unit_test(test_size_parse), cmocka_unit_test(test_probe),
        cmocka_unit_test(test_split), cmocka_unit_test(test_engine_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
