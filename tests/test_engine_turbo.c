/* test_engine_turbo.c — the TurboQuant KV scheme through the whole engine on tiny generated models:
 * a RAM-tier hit gives the same greedy tokens as a cold run (full and window layers, with a
 * --kv-quant-start prefix), the SSD tier round-trips turbo blocks across a restart, a different
 * turbo scheme on the same SSD directory gets nothing back, kv_config.json can name turbo per
 * layer, and the affine default group adapts to head_dim (kvtier issue 14). */
#include "testutil.h"

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/gen_model.h"

static char *g_dir;

static char *model_path(const char *arch) {
    char *path = malloc(strlen(g_dir) + 64);
    sprintf(path, "%s/%s.gguf", g_dir, arch);
    if (access(path, R_OK) == 0) return path;
    /* the repository vocabulary (a real BPE vocab, ids above 600 exist) */
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = "f16", .seed = 9,
                            .vocab_path = "data/vocab/ggml-vocab-gpt-2.gguf"};
    char err[256] = "";
    assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
    return path;
}

static kvt_status try_engine(const char *model, const char *kvq, uint32_t group, uint32_t qstart, const char *ssd,
                             kvt_engine **e, char *err, size_t errlen) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.kv_quant = kvq;
    o.kv_quant_group = group;
    o.kv_quant_start = qstart;
    o.prompt_cache_gb = 1.0;
    o.ssd_dir = ssd;
    return kvt_engine_create(&o, e, err, errlen);
}

static kvt_engine *engine(const char *model, const char *kvq, uint32_t qstart, const char *ssd) {
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = try_engine(model, kvq, 0, qstart, ssd, &e, err, sizeof err);
    if (st) fail_msg("engine %s: %s", kvq, err);
    return e;
}

typedef struct out {
    int32_t tok[16];
    uint32_t reused;
    kvt_tier tier;
} out;

static void gen(kvt_engine *e, const int32_t *ids, uint32_t n, uint32_t g, bool no_cache, out *o) {
    kvt_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = g, .ignore_eog = true, .no_cache = no_cache};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256] = "";
    kvt_status st = kvt_engine_generate(e, &r, &res, err, sizeof err);
    if (st) fail_msg("generate: %s", err);
    assert_int_equal(res.n_gen, g);
    memcpy(o->tok, res.tokens, sizeof(int32_t) * g);
    o->reused = res.n_reused;
    o->tier = res.reused_from;
    free(res.tokens);
}

static void fill(int32_t *ids, uint32_t n, uint32_t nv, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(300 + tu_rand(&seed) % (nv - 600));
}

/* cold == first cached run == exact repeat (reuses n-1) == a longer prompt sharing the prefix */
static void hit_equals_cold(const char *arch, const char *kvq, uint32_t qstart) {
    char *m = model_path(arch);
    kvt_engine *e = engine(m, kvq, qstart, NULL);
    assert_non_null(strstr(kvt_engine_scheme_key(e), "turbo-k"));
    enum { N = 120, G = 10 };
    int32_t ids[N + 40];
    fill(ids, N + 40, kvt_engine_n_vocab(e), 3);
    out cold, first, rep, c2, h2;
    gen(e, ids, N, G, true, &cold);
    gen(e, ids, N, G, false, &first);
    assert_int_equal(first.reused, 0);
    assert_memory_equal(cold.tok, first.tok, sizeof(int32_t) * G);
    gen(e, ids, N, G, false, &rep);
    assert_int_equal(rep.reused, N - 1);
    assert_int_equal(rep.tier, KVT_TIER_RAM);
    assert_memory_equal(cold.tok, rep.tok, sizeof(int32_t) * G);
    gen(e, ids, N + 40, G, true, &c2);
    gen(e, ids, N + 40, G, false, &h2);
    assert_true(h2.reused >= N - 1);
    assert_memory_equal(c2.tok, h2.tok, sizeof(int32_t) * G);
    kvt_engine_free(e);
    free(m);
}

static void test_hit_qwen3_turbo(void **s) { hit_equals_cold("qwen3", "turbo", 0); }
static void test_hit_gemma3_window_turbo(void **s) { hit_equals_cold("gemma3", "turbo:k4v2", 0); }
static void test_hit_llama_turbo_start(void **s) { hit_equals_cold("llama", "turbo:k5v4", 40); }

static void rm_rf(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Restart round trip through the SSD tier, then a different turbo scheme on the same directory. */
static void test_ssd_round_trip_and_mismatch(void **s) {
    char *m = model_path("qwen3");
    char *dir = tu_tmpdir("turbo-ssd");
    int32_t ids[200];
    out a, b, c, d;
    kvt_engine *e = engine(m, "turbo", 0, dir);
    fill(ids, 200, kvt_engine_n_vocab(e), 17);
    gen(e, ids, 200, 8, false, &a);
    kvt_flush_result fr;
    kvt_engine_flush(e, 10000, &fr);
    assert_true(fr.durable);
    assert_true(fr.entries > 0);
    kvt_engine_free(e);

    e = engine(m, "turbo", 0, dir);
    gen(e, ids, 200, 8, false, &b);
    assert_int_equal(b.tier, KVT_TIER_SSD);
    assert_true(b.reused >= 192);
    assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 8);
    kvt_engine_free(e);

    /* same model, other bits: another scheme key, so the stored turbo-k8v3 blocks are not usable */
    e = engine(m, "turbo:k4v4", 0, dir);
    gen(e, ids, 200, 8, false, &c);
    assert_int_equal(c.reused, 0);
    gen(e, ids, 200, 8, true, &d);
    assert_memory_equal(c.tok, d.tok, sizeof(int32_t) * 8);
    kvt_engine_free(e);
    /* nor for affine kv8 */
    e = engine(m, "8", 0, dir);
    gen(e, ids, 200, 8, false, &c);
    assert_int_equal(c.reused, 0);
    kvt_engine_free(e);
    rm_rf(dir);
    free(dir);
    free(m);
}

/* kv_config.json names turbo for one layer; the rest mixes affine and f16. */
static void test_kv_config_turbo(void **s) {
    char *m = model_path("qwen3");
    char path[1024];
    snprintf(path, sizeof path, "%s/kv_config.json", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[{\"layer_idx\": 0, \"codec\": \"turbo:k4v3\"}, {\"layer_idx\": 1, \"bits\": 8, \"group_size\": 32}]");
    fclose(f);
    kvt_engine *e = engine(m, "config", 0, NULL);
    const kvt_kv_layout *l = kvt_engine_layout(e);
    kvt_codec c0 = kvt_kv_layout_codec_at(l, 0, 0), c1 = kvt_kv_layout_codec_at(l, 1, 0);
    assert_int_equal(c0.kind, KVT_CODEC_TURBO);
    assert_int_equal(c0.bits, 4);
    assert_int_equal(c0.vbits, 3);
    assert_int_equal(c1.kind, KVT_CODEC_AFFINE);
    int32_t ids[80];
    fill(ids, 80, kvt_engine_n_vocab(e), 4);
    out a, b;
    gen(e, ids, 80, 6, true, &a);
    gen(e, ids, 80, 6, false, &b);
    gen(e, ids, 80, 6, false, &b);
    assert_int_equal(b.reused, 79);
    assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 6);
    kvt_engine_free(e);
    /* invalid turbo entries are clear errors */
    static const char *bad[] = {"[{\"layer_idx\": 0, \"codec\": \"turbo:k3v3\"}]", "[{\"layer_idx\": 0, \"codec\": \"8\"}]",
                                "[{\"layer_idx\": 7, \"codec\": \"turbo\"}]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        kvt_engine *e2 = NULL;
        char err[512] = "";
        assert_int_not_equal(try_engine(m, "config", 0, 0, NULL, &e2, err, sizeof err), KVT_OK);
        assert_true(strlen(err) > 0);
    }
    unlink(path);
    free(m);
}

/* Affine default group: the largest of 128/64/32 dividing head_dim unless set; turbo and affine
 * options fail clearly where the model cannot take them. */
static void test_group_auto_pick(void **s) {
    char *qwen = model_path("qwen3"), *llama = model_path("llama"); /* head_dim 32 and 16 */
    kvt_engine *e = NULL;
    char err[512] = "";
    assert_int_equal(try_engine(qwen, "8", 0, 0, NULL, &e, err, sizeof err), KVT_OK);
    assert_non_null(strstr(kvt_engine_scheme_key(e), "kv8g32"));
    kvt_engine_free(e);
    assert_int_not_equal(try_engine(qwen, "8", 64, 0, NULL, &e, err, sizeof err), KVT_OK); /* explicit: honoured */
    assert_non_null(strstr(err, "does not divide head_dim 32"));
    assert_int_not_equal(try_engine(llama, "4", 0, 0, NULL, &e, err, sizeof err), KVT_OK);
    assert_non_null(strstr(err, "head_dim 16"));
    assert_int_equal(try_engine(llama, "turbo:k2v2", 0, 0, NULL, &e, err, sizeof err), KVT_OK); /* 16 is a power of two */
    kvt_engine_free(e);
    assert_int_not_equal(try_engine(llama, "turbo:k8v7", 0, 0, NULL, &e, err, sizeof err), KVT_OK);
    assert_non_null(strstr(err, "value bits"));
    free(qwen);
    free(llama);
}

int main(void) {
    g_dir = tu_tmpdir("engine-turbo");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_qwen3_turbo),   cmocka_unit_test(test_hit_gemma3_window_turbo),
        cmocka_unit_test(test_hit_llama_turbo_start), cmocka_unit_test(test_ssd_round_trip_and_mismatch),
        cmocka_unit_test(test_kv_config_turbo),   cmocka_unit_test(test_group_auto_pick),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rm_rf(g_dir);
    free(g_dir);
    return rc;
}
