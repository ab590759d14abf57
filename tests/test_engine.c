/* test_engine.c — end-to-end behaviour of the engine on tiny generated models: a cache hit gives the
 * same greedy tokens as a cold run (full attention, sliding window, quantized KV), exact repeats
 * reuse n-1 tokens, SSD restart round trip, namespaces, stop strings, context/pool errors. */
#include "testutil.h"

#include "engine/engine.h"
#include "model/gen_model.h"
#include "kv/kv.h"

static char *g_dir;

/* A tiny model with the repository's GPT-2 vocabulary, or the 256-token byte vocabulary. */
static char *make_model_vocab(const char *arch, const char *type, bool byte_vocab) {
    char *path = malloc(strlen(g_dir) + 64);
    sprintf(path, "%s/%s-%s%s.gguf", g_dir, arch, type, byte_vocab ? "-bytes" : "");
    if (access(path, R_OK) == 0) return path;
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = type, .seed = 7, .byte_vocab = byte_vocab};
    char err[256] = "";
    kvt_status st = kvt_gen_model(&o, path, err, sizeof err);
    if (st != KVT_OK) fprintf(stderr, "gen_model: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return path;
}
static char *make_model(const char *arch, const char *type) { return make_model_vocab(arch, type, false); }

static kvt_engine *open_engine(const char *model, const char *kv_quant, double pc_gb, const char *ssd) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.kv_quant = kv_quant;
    o.kv_quant_group = 32;
    o.prompt_cache_gb = pc_gb;
    o.snapshot_min_tokens = 64;
    o.ssd_dir = ssd;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return e;
}

/* Random prompt ids away from both ends of the vocabulary (byte/special tokens sit low, the GPT-2
 * <|endoftext|> at the top): a margin of min(300, nv / 4) each side, so any vocabulary size with
 * at least 2 tokens gives ids in [margin, nv - margin) and one more still fits below nv. */
static void fill(int32_t *ids, uint32_t n, uint32_t nv, uint64_t seed) {
    assert_true(nv >= 2);
    uint32_t margin = nv / 4 < 300 ? nv / 4 : 300;
    uint64_t s = seed;
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(margin + tu_rand(&s) % (nv - 2 * margin));
}

typedef struct run_out {
    int32_t tok[64];
    uint32_t n;
    uint32_t reused;
    kvt_tier tier;
} run_out;

static void gen(kvt_engine *e, const int32_t *ids, uint32_t n, uint32_t max, bool no_cache, const char *ns, run_out *out) {
    kvt_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = max, .ignore_eog = true, .no_cache = no_cache, .ns = ns};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256] = "";
    kvt_status st = kvt_engine_generate(e, &r, &res, err, sizeof err);
    if (st) fprintf(stderr, "generate: %s\n", err);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(res.n_gen, max);
    memcpy(out->tok, res.tokens, sizeof(int32_t) * res.n_gen);
    out->n = res.n_gen;
    out->reused = res.n_reused;
    out->tier = res.reused_from;
    free(res.tokens);
}

/* cold (no cache) == first cached run == exact repeat (reuses n-1) == extension of the prompt */
static void check_hit_equals_cold_model(const char *m, const char *kvq) {
    kvt_engine *e = open_engine(m, kvq, 1.0, NULL);
    uint32_t nv = kvt_engine_n_vocab(e);
    enum { N = 150, G = 12 };
    int32_t ids[N + G + 40];
    fill(ids, N, nv, 11);
    run_out cold, first, rep, nc;
    gen(e, ids, N, G, true, NULL, &cold);
    gen(e, ids, N, G, false, NULL, &first);
    assert_int_equal(first.reused, 0);
    assert_memory_equal(cold.tok, first.tok, sizeof(int32_t) * G);
    gen(e, ids, N, G, false, NULL, &rep);
    assert_int_equal(rep.reused, N - 1);
    assert_int_equal(rep.tier, KVT_TIER_RAM);
    assert_memory_equal(cold.tok, rep.tok, sizeof(int32_t) * G);
    /* next turn: prompt + reply + new tokens shares the whole first prompt and reply */
    memcpy(ids + N, first.tok, sizeof(int32_t) * (G - 1));
    fill(ids + N + G - 1, 30, nv, 99);
    uint32_t n2 = N + G - 1 + 30;
    run_out t2c, t2;
    gen(e, ids, n2, G, true, NULL, &t2c);
    gen(e, ids, n2, G, false, NULL, &t2);
    assert_true(t2.reused >= N + G - 2);
    assert_memory_equal(t2c.tok, t2.tok, sizeof(int32_t) * G);
    /* a diverging prompt (edit in the middle) reuses only the common prefix and stays correct */
    ids[70] = ids[70] + 1;
    gen(e, ids, N, G, true, NULL, &nc);
    gen(e, ids, N, G, false, NULL, &rep);
    assert_int_equal(rep.reused, 70); /* window layouts too: blocks that left the window stayed cached */
    assert_memory_equal(nc.tok, rep.tok, sizeof(int32_t) * G);
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    assert_true(st.pc_hits >= 2);
    assert_true(st.pc_blocks > 0);
    kvt_engine_free(e);
}

static void check_hit_equals_cold(const char *arch, const char *type, const char *kvq) {
    char *m = make_model(arch, type);
    check_hit_equals_cold_model(m, kvq);
    free(m);
}

/* The latent (MLA) cache of deepseek2 (reference fixture): hits, extensions and edits == cold. */
#define DS2_FIXTURE "tests/fixtures/deepseek2-tiny.gguf"
static void test_hit_deepseek2_mla(void **s) { check_hit_equals_cold_model(DS2_FIXTURE, "off"); }

/* Takes ownership of the model path m. */
static void check_hit_on(char *m, const char *kvq) {
    check_hit_equals_cold_model(m, kvq);
    free(m);
}

static void test_hit_llama_f16(void **s) { check_hit_equals_cold("llama", "f16", "off"); }
/* the prompt helper and the cache work for a vocabulary far smaller than GPT-2's */
static void test_hit_byte_vocab(void **s) { check_hit_on(make_model_vocab("llama", "f16", true), "off"); }
static void test_hit_qwen3_q8(void **s) { check_hit_equals_cold("qwen3", "q8_0", "off"); }
static void test_hit_gemma3_window(void **s) { check_hit_equals_cold("gemma3", "f16", "off"); }
static void test_hit_qwen3_kv8(void **s) { check_hit_equals_cold("qwen3", "f16", "8"); }
static void test_hit_gemma3_kv4(void **s) { check_hit_equals_cold("gemma3", "f16", "4"); }

static void test_namespaces(void **s) {
    char *m = make_model("llama", "f16");
    kvt_engine *e = open_engine(m, "off", 1.0, NULL);
    int32_t ids[100];
    fill(ids, 100, kvt_engine_n_vocab(e), 5);
    run_out a, b, c;
    gen(e, ids, 100, 4, false, "tenant-a", &a);
    gen(e, ids, 100, 4, false, "tenant-b", &b);
    assert_int_equal(b.reused, 0);
    gen(e, ids, 100, 4, false, "tenant-a", &c);
    assert_int_equal(c.reused, 99);
    assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 4);
    kvt_engine_free(e);
    free(m);
}

static void check_ssd_restart(const char *m) {
    char *dir = tu_tmpdir("eng-ssd");
    int32_t ids[200];
    run_out a, b;
    {
        kvt_engine *e = open_engine(m, "off", 1.0, dir);
        fill(ids, 200, kvt_engine_n_vocab(e), 21);
        gen(e, ids, 200, 8, false, NULL, &a);
        kvt_flush_result fr;
        kvt_engine_flush(e, 10000, &fr);
        assert_true(fr.durable);
        assert_true(fr.entries > 0);
        kvt_engine_free(e);
    }
    {
        kvt_engine *e = open_engine(m, "off", 1.0, dir);
        gen(e, ids, 200, 8, false, NULL, &b);
        assert_int_equal(b.tier, KVT_TIER_SSD);
        assert_true(b.reused >= 192); /* at least every full block */
        assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 8);
        kvt_engine_stats st;
        kvt_engine_stats_get(e, &st);
        assert_true(st.ssd_restores >= 1);
        kvt_engine_free(e);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static void test_ssd_restart(void **s) {
    char *m = make_model("llama", "f16");
    check_ssd_restart(m);
    free(m);
}

/* --kv-quant on a latent cache is refused with a message, never silently applied. */
static void test_kv_quant_mla_refused(void **s) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = DS2_FIXTURE;
    o.kv_quant = "8";
    kvt_engine *e = NULL;
    char err[512] = "";
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(err, "latent"));
}

/* Latent blocks persist and restore from SSD like any other: restored == cold. */
static void test_ssd_restart_deepseek2_mla(void **s) { check_ssd_restart(DS2_FIXTURE); }

typedef struct collect {
    char text[4096];
    size_t n;
} collect;
static bool collect_cb(void *ctx, int32_t id, const char *t, size_t len) {
    collect *c = ctx;
    if (c->n + len < sizeof c->text) {
        memcpy(c->text + c->n, t, len);
        c->n += len;
        c->text[c->n] = 0;
    }
    return true;
}

static void test_stop_strings(void **s) {
    char *m = make_model("llama", "f16");
    kvt_engine *e = open_engine(m, "off", 0.0, NULL);
    int32_t ids[40];
    fill(ids, 40, kvt_engine_n_vocab(e), 3);
    collect full = {0}, cut = {0};
    kvt_gen_request r = {.prompt = ids, .n_prompt = 40, .max_tokens = 24, .ignore_eog = true, .on_token = collect_cb, .cb_ctx = &full};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256];
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_OK);
    free(res.tokens);
    assert_true(full.n > 8);
    /* stop on a 3-byte piece from the middle of the text */
    char stop[4];
    memcpy(stop, full.text + full.n / 2, 3);
    stop[3] = 0;
    const char *stops[] = {stop};
    const char *first = strstr(full.text, stop);
    assert_non_null(first);
    r.cb_ctx = &cut;
    r.stop = stops;
    r.n_stop = 1;
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_OK);
    free(res.tokens);
    assert_int_equal(res.finish, KVT_FINISH_STOP);
    assert_int_equal(cut.n, (size_t)(first - full.text));
    assert_memory_equal(cut.text, full.text, cut.n);
    kvt_engine_free(e);
    free(m);
}

static void test_errors(void **s) {
    char *m = make_model("llama", "f16");
    kvt_engine *e = open_engine(m, "off", 0.0, NULL);
    int32_t ids[600];
    fill(ids, 600, kvt_engine_n_vocab(e), 1);
    kvt_gen_request r = {.prompt = ids, .n_prompt = 600, .max_tokens = 4};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256] = "";
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_ERR_RANGE);
    assert_non_null(strstr(err, "context"));
    r.n_prompt = 0;
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_ERR_RANGE);
    r.n_prompt = 10;
    ids[3] = (int32_t)kvt_engine_n_vocab(e);
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_ERR_INVALID_ARG);
    ids[3] = -1;
    assert_int_equal(kvt_engine_generate(e, &r, &res, err, sizeof err), KVT_ERR_INVALID_ARG);
    kvt_engine_free(e);

    /* a pool too small for the request: typed "out of KV memory", never a crash */
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = m;
    o.n_ctx = 512;
    o.block_tokens = 16;
    o.prompt_cache_gb = 0;
    o.kv_pool_gb = 1e-5; /* 10 kB */
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    fill(ids, 300, kvt_engine_n_vocab(e), 1);
    r.n_prompt = 300;
    kvt_status st = kvt_engine_generate(e, &r, &res, err, sizeof err);
    assert_int_equal(st, KVT_ERR_POOL_EXHAUSTED);
    assert_non_null(strstr(err, "out of KV memory"));
    kvt_engine_free(e);

    /* bad options */
    o.kv_pool_gb = 0;
    o.kv_quant = "7";
    assert_int_not_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    o.kv_quant = "off";
    o.model_path = "/nonexistent/model.gguf";
    assert_int_not_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    assert_true(strlen(err) > 0);
    free(m);
}


/* --kv-quant config: kv_config.json beside the model puts exactly the configured codec on each
 * listed layer, f16 elsewhere; --kv-quant-start keeps early blocks in f16. */
static void test_kv_config(void **s) {
    char *m = make_model("qwen3", "f16");
    char path[1024];
    snprintf(path, sizeof path, "%s/kv_config.json", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[{\"layer_idx\": 0, \"bits\": 8, \"group_size\": 32}, {\"layer_idx\": 1, \"bits\": 4, \"group_size\": 32}]");
    fclose(f);
    kvt_engine *e = open_engine(m, "config", 1.0, NULL);
    const kvt_kv_layout *l = kvt_engine_layout(e);
    uint32_t nl = kvt_kv_layout_n_layers(l);
    assert_true(nl >= 2);
    kvt_codec c0 = kvt_kv_layout_codec_at(l, 0, 0), c1 = kvt_kv_layout_codec_at(l, 1, 0);
    assert_int_equal(c0.kind, KVT_CODEC_AFFINE);
    assert_int_equal(c0.bits, 8);
    assert_int_equal(c0.group_size, 32);
    assert_int_equal(c1.kind, KVT_CODEC_AFFINE);
    assert_int_equal(c1.bits, 4);
    for (uint32_t i = 2; i < nl; i++) assert_int_equal(kvt_kv_layout_codec_at(l, i, 0).kind, KVT_CODEC_F16);
    assert_non_null(strstr(kvt_engine_scheme_key(e), "cfg"));
    /* a cache hit with mixed codecs still equals the cold run */
    int32_t ids[80];
    fill(ids, 80, kvt_engine_n_vocab(e), 8);
    run_out a, b;
    gen(e, ids, 80, 6, true, NULL, &a);
    gen(e, ids, 80, 6, false, NULL, &b);
    gen(e, ids, 80, 6, false, NULL, &b);
    assert_int_equal(b.reused, 79);
    assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 6);
    kvt_engine_free(e);
    /* a bad config is a clear error */
    f = fopen(path, "w");
    fprintf(f, "[{\"layer_idx\": 99, \"bits\": 8}]");
    fclose(f);
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = m;
    o.kv_quant = "config";
    char err[512] = "";
    kvt_engine *e2 = NULL;
    assert_int_not_equal(kvt_engine_create(&o, &e2, err, sizeof err), KVT_OK);
    assert_non_null(strstr(err, "layer_idx 99"));
    unlink(path);
    /* quant start: blocks before the start stay f16 */
    o.kv_quant = "8";
    o.kv_quant_group = 32;
    o.block_tokens = 16;
    o.kv_quant_start = 40;
    assert_int_equal(kvt_engine_create(&o, &e2, err, sizeof err), KVT_OK);
    l = kvt_engine_layout(e2);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 0).kind, KVT_CODEC_F16);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 2).kind, KVT_CODEC_F16);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 3).kind, KVT_CODEC_AFFINE);
    kvt_engine_free(e2);
    free(m);
}

/* Idle demotion: with write-behind off, entries idle past --ssd-demote-idle move to the SSD tier on
 * the next tick (nothing is lost), and a new process restores them. */
static void test_demote_idle(void **s) {
    char *m = make_model("llama", "f16");
    char *dir = tu_tmpdir("eng-demote");
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = m;
    o.n_ctx = 512;
    o.block_tokens = 16;
    o.prompt_cache_gb = 1.0;
    o.ssd_dir = dir;
    o.ssd_writeback = false;
    o.ssd_demote_idle_s = 0.5;
    kvt_engine *e = NULL;
    char err[512] = "";
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    int32_t ids[100];
    fill(ids, 100, kvt_engine_n_vocab(e), 77);
    run_out a, b;
    gen(e, ids, 100, 4, false, NULL, &a);
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    assert_true(st.pc_blocks > 0);
    kvt_flush_result fr;
    /* write-behind is off: a flush writes what the RAM tier holds (never durable over nothing) */
    kvt_engine_flush(e, 10000, &fr);
    assert_true(fr.durable);
    assert_true(fr.entries > 0);
    assert_true(fr.records_written > 0);
    assert_true(fr.longest_durable_prefix_tokens >= 96);
    usleep(1200 * 1000);
    kvt_engine_tick(e);
    kvt_engine_flush(e, 10000, &fr);
    assert_true(fr.durable);
    assert_true(fr.entries > 0);
    kvt_engine_stats_get(e, &st);
    assert_true(st.ssd_demotions > 0);
    assert_int_equal(st.pc_blocks, 0);
    kvt_engine_free(e);
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    gen(e, ids, 100, 4, false, NULL, &b);
    assert_int_equal(b.tier, KVT_TIER_SSD);
    assert_true(b.reused >= 96);
    assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 4);
    kvt_engine_free(e);
    /* --ssd-demote-idle 0 disables demotion (it does not mean "demote everything at once") */
    o.ssd_demote_idle_s = 0;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    gen(e, ids, 100, 4, false, NULL, &b);
    usleep(1100 * 1000);
    kvt_engine_tick(e);
    kvt_engine_stats_get(e, &st);
    assert_int_equal(st.ssd_demotions, 0);
    assert_true(st.pc_blocks > 0);
    kvt_engine_free(e);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(m);
}

/* Memory pressure with an SSD tier attached (8-block pool, write-behind off, spill sink on): the
 * RAM tier's evictions are spilled into SSD records, which the pressure path then frees at once,
 * so a new prompt still fits. Output equals an uncached run. */
static void test_pressure_with_ssd(void **s) {
    (void)s;
    char *m = make_model("llama", "f16");
    char *dir = tu_tmpdir("eng-pressure");
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = m;
    o.n_ctx = 512;
    o.block_tokens = 16;
    o.prompt_cache_gb = 1.0;
    o.ssd_dir = dir;
    o.ssd_writeback = false;
    kvt_engine *e = NULL;
    char err[512] = "";
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    double block_bytes = kvt_kv_layout_bytes_per_token(kvt_engine_layout(e)) * 16;
    kvt_engine_free(e);
    o.kv_pool_gb = 8 * block_bytes / 1e9;
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    int32_t a_ids[100], b_ids[100];
    fill(a_ids, 100, kvt_engine_n_vocab(e), 5);
    fill(b_ids, 100, kvt_engine_n_vocab(e), 6);
    run_out a, b, bc;
    gen(e, a_ids, 100, 4, false, NULL, &a); /* 7 blocks stay in the RAM tier */
    gen(e, b_ids, 100, 4, false, NULL, &b); /* needs them back */
    gen(e, b_ids, 100, 4, true, NULL, &bc);
    assert_memory_equal(b.tok, bc.tok, sizeof(int32_t) * 4);
    kvt_engine_free(e);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(m);
}

/* One lookup over both tiers, one plan: when the SSD tier holds a longer prefix than RAM, RAM's
 * leading full blocks are shared and the SSD restore reads only the rest; the RAM tier counts one
 * hit for the blocks it served (no take is built and thrown away). */
static void test_lookup_prefers_longer_tier(void **s) {
    (void)s;
    char *m = make_model("llama", "f16");
    char *dir = tu_tmpdir("eng-lookup");
    kvt_engine *e = open_engine(m, "off", 1.0, dir);
    int32_t ids[100];
    fill(ids, 100, kvt_engine_n_vocab(e), 91);
    run_out a, b, c;
    gen(e, ids, 100, 4, false, NULL, &a);
    kvt_flush_result fr;
    kvt_engine_flush(e, 10000, &fr);
    assert_true(fr.durable);
    kvt_engine_free(e);
    e = open_engine(m, "off", 1.0, dir);
    gen(e, ids, 40, 4, false, NULL, &b); /* RAM now holds a 40-token prefix */
    kvt_engine_stats st0, st1;
    kvt_engine_stats_get(e, &st0);
    gen(e, ids, 100, 4, false, NULL, &c);
    kvt_engine_stats_get(e, &st1);
    assert_int_equal(c.tier, KVT_TIER_SSD);
    assert_int_equal(c.reused, 99);
    assert_int_equal(st1.pc_hits, st0.pc_hits + 1);                   /* blocks 0-1 from RAM */
    assert_int_equal(st1.pc_reused_tokens, st0.pc_reused_tokens + 32); /* (the 40-token RAM prefix, cut to blocks) */
    assert_int_equal(st1.ssd_restores, st0.ssd_restores + 1);
    assert_memory_equal(a.tok, c.tok, sizeof(int32_t) * 4);
    kvt_engine_free(e);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(m);
}

/* Window blocks registered while a sliding-window sequence grows enter write-behind: after a
 * restart, a prompt that diverges early (its window blocks had left the live window) is served
 * from the SSD tier. */
static void test_window_blocks_written_behind(void **s) {
    (void)s;
    char *m = make_model("gemma3", "f16");
    char *dir = tu_tmpdir("eng-winwb");
    kvt_engine *e = open_engine(m, "off", 1.0, dir);
    enum { N = 200 };
    int32_t ids[N];
    fill(ids, N, kvt_engine_n_vocab(e), 17);
    run_out a, b, bc;
    gen(e, ids, N, 4, false, NULL, &a);
    kvt_flush_result fr;
    kvt_engine_flush(e, 10000, &fr);
    assert_true(fr.durable);
    kvt_engine_free(e);
    e = open_engine(m, "off", 1.0, dir);
    ids[90] = ids[90] + 1; /* diverges long after position 90 left the 32-token window */
    gen(e, ids, 100, 4, false, NULL, &b);
    assert_int_equal(b.tier, KVT_TIER_SSD);
    assert_int_equal(b.reused, 90);
    gen(e, ids, 100, 4, true, NULL, &bc);
    assert_memory_equal(b.tok, bc.tok, sizeof(int32_t) * 4);
    kvt_engine_free(e);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(m);
}

int main(void) {
    g_dir = tu_tmpdir("engine");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_llama_f16),  cmocka_unit_test(test_hit_byte_vocab), cmocka_unit_test(test_hit_qwen3_q8), cmocka_unit_test(test_hit_gemma3_window),
        cmocka_unit_test(test_hit_qwen3_kv8),  cmocka_unit_test(test_hit_gemma3_kv4), cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_ssd_restart),    cmocka_unit_test(test_hit_deepseek2_mla), cmocka_unit_test(test_ssd_restart_deepseek2_mla),
        cmocka_unit_test(test_kv_quant_mla_refused),    cmocka_unit_test(test_stop_strings), cmocka_unit_test(test_errors), cmocka_unit_test(test_kv_config), cmocka_unit_test(test_demote_idle), cmocka_unit_test(test_pressure_with_ssd), cmocka_unit_test(test_lookup_prefers_longer_tier), cmocka_unit_test(test_window_blocks_written_behind),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) rc = 1;
    free(g_dir);
    return rc;
}
