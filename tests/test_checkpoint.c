/* test_checkpoint.c — generation checkpoints (--generation-checkpoint, issue 10 item 4) in-process:
 * a generation stopped at various token counts (client cancellation, then engine shutdown and a
 * new engine on the same directory) resumes on an identical request, and the whole text equals an
 * uninterrupted run without any cache (greedy and seeded sampling, with a stop string); a changed
 * sampling field does not resume; completion removes the record; a corrupt or planted record is
 * rejected; the store keeps the newest record per key and orders removal after writes.
 * (The kill -9 version against a real server: tests/e2e/crash_ckpt.sh.) */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "cache/ssd_ckpt.h"
#include "engine/engine.h"
#include "model/gen_model.h"

static char *g_dir;
static char *g_model;
static uint32_t g_parallel = 4; /* the engine default (scheduler); the _inline tests run with 1 */

static kvt_engine *open_engine(const char *ssd, uint32_t every) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = g_model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.prompt_cache_gb = 0.05;
    o.snapshot_min_tokens = 64;
    o.ssd_dir = ssd;
    o.generation_checkpoint = every;
    o.parallel = g_parallel;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return e;
}

typedef struct sink {
    char text[16384];
    size_t n;
    uint32_t calls, stop_after; /* stop_after: return false at that many callbacks (0 = never) */
} sink;

static bool on_tok(void *ctx, int32_t id, const char *t, size_t len) {
    sink *s = ctx;
    if (len && s->n + len < sizeof s->text) {
        memcpy(s->text + s->n, t, len);
        s->n += len;
    }
    s->calls++;
    return !(s->stop_after && s->calls >= s->stop_after);
}

static int32_t g_prompt[40];
static const char *g_stop[] = {"zzzq"}; /* held-back text exercises the stop-string path */

static kvt_gen_request request(const kvt_sampling *sp, sink *s) {
    kvt_gen_request r = {.prompt = g_prompt, .n_prompt = 40, .max_tokens = 120, .ignore_eog = true, .stop = g_stop,
                         .n_stop = 1, .on_token = on_tok, .cb_ctx = s};
    r.sampling = *sp;
    return r;
}

static void run(kvt_engine *e, const kvt_sampling *sp, sink *s, kvt_gen_result *res) {
    kvt_gen_request r = request(sp, s);
    char err[256] = "";
    assert_int_equal(kvt_engine_generate(e, &r, res, err, sizeof err), KVT_OK);
    free(res->tokens);
    res->tokens = NULL;
}

static int count_kvc(const char *ssd) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.kvc' | wc -l", ssd);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

static void first_kvc(const char *ssd, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.kvc' | head -1", ssd);
    FILE *p = popen(cmd, "r");
    out[0] = 0;
    if (p) {
        if (!fgets(out, (int)n, p)) out[0] = 0;
        pclose(p);
    }
    out[strcspn(out, "\n")] = 0;
}

/* The uninterrupted reference: no cache at all. */
static void reference(const kvt_sampling *sp, sink *ref) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = g_model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.block_tokens = 16;
    o.prompt_cache_gb = 0;
    kvt_engine *e = NULL;
    char err[256];
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_OK);
    kvt_gen_result res;
    memset(ref, 0, sizeof *ref);
    run(e, sp, ref, &res);
    assert_int_equal(res.n_gen, 120);
    kvt_engine_free(e);
}

static int g_case;
/* Stop at `cut` emitted tokens, shut down, resume with a new engine: same text as ref. */
static void check_resume(const kvt_sampling *sp, const sink *ref, uint32_t cut, uint32_t every) {
    char ssd[512];
    snprintf(ssd, sizeof ssd, "%s/ssd-%d", g_dir, g_case++);
    kvt_engine *e = open_engine(ssd, every);
    sink a = {.stop_after = cut};
    kvt_gen_result res;
    run(e, sp, &a, &res);
    assert_int_equal(res.finish, KVT_FINISH_CANCELLED);
    kvt_engine_free(e); /* flushes: the records are on disk */
    const bool expect = cut > every;
    assert_int_equal(count_kvc(ssd), expect ? 1 : 0);

    e = open_engine(ssd, every);
    sink b = {0};
    run(e, sp, &b, &res);
    assert_int_equal(res.n_gen, 120);
    assert_int_equal(b.n, ref->n);
    assert_memory_equal(b.text, ref->text, ref->n);
    kvt_engine_stats st;
    kvt_engine_flush(e, 10000, &(kvt_flush_result){0});
    kvt_engine_stats_get(e, &st);
    assert_true(st.ckpt_enabled);
    assert_int_equal(st.ckpt_resumed, expect ? 1 : 0);
    assert_int_equal(st.ckpt_invalidated, 1); /* completion removes the record (written anew by this run too) */
    assert_int_equal(count_kvc(ssd), 0);
    kvt_engine_free(e);
}

static void test_resume_greedy(void **s) {
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sink ref;
    reference(&sp, &ref);
    uint32_t cuts[] = {5, 9, 17, 33, 64, 100, 119};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) check_resume(&sp, &ref, cuts[i], 8);
    check_resume(&sp, &ref, 70, 16);
}

static kvt_sampling seeded(void) {
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sp.temperature = 0.9f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.repeat_penalty = 1.1f;
    sp.seed = 1234;
    return sp;
}

static void test_resume_seeded(void **s) {
    kvt_sampling sp = seeded();
    sink ref;
    reference(&sp, &ref);
    uint32_t cuts[] = {10, 27, 50, 88, 118};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) check_resume(&sp, &ref, cuts[i], 8);
}

/* A changed sampling field (or prompt) starts normally: no resume, and its own text. */
static void test_changed_field_no_resume(void **s) {
    char ssd[512];
    snprintf(ssd, sizeof ssd, "%s/ssd-changed", g_dir);
    kvt_sampling sp = seeded();
    kvt_engine *e = open_engine(ssd, 8);
    sink a = {.stop_after = 40};
    kvt_gen_result res;
    run(e, &sp, &a, &res);
    kvt_engine_free(e);
    assert_int_equal(count_kvc(ssd), 1);
    kvt_sampling sp2 = sp;
    sp2.seed = 1235;
    sink ref2;
    reference(&sp2, &ref2);
    e = open_engine(ssd, 8);
    sink b = {0};
    run(e, &sp2, &b, &res);
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    assert_int_equal(st.ckpt_resumed, 0);
    assert_int_equal(b.n, ref2.n);
    assert_memory_equal(b.text, ref2.text, ref2.n);
    sp2 = sp;
    sp2.top_p = 0.9f;
    sink c = {0};
    run(e, &sp2, &c, &res);
    kvt_engine_stats_get(e, &st);
    assert_int_equal(st.ckpt_resumed, 0);
    kvt_engine_free(e);
    assert_int_equal(count_kvc(ssd), 1); /* the original request's record is untouched */
}

/* A corrupt record is removed with a warning and the request starts normally (same text). */
static void test_corrupt_rejected(void **s) {
    char ssd[512], path[1024];
    snprintf(ssd, sizeof ssd, "%s/ssd-corrupt", g_dir);
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sink ref;
    reference(&sp, &ref);
    for (int mode = 0; mode < 3; mode++) {
        kvt_engine *e = open_engine(ssd, 8);
        sink a = {.stop_after = 50};
        kvt_gen_result res;
        run(e, &sp, &a, &res);
        kvt_engine_free(e);
        first_kvc(ssd, path, sizeof path);
        assert_true(path[0]);
        if (mode == 0) { /* flip one byte of an emitted token id */
            int fd = open(path, O_RDWR);
            assert_true(fd >= 0);
            struct stat sb;
            fstat(fd, &sb);
            uint8_t c;
            assert_int_equal(pread(fd, &c, 1, sb.st_size - 12), 1);
            c ^= 0x10;
            assert_int_equal(pwrite(fd, &c, 1, sb.st_size - 12), 1);
            close(fd);
        } else if (mode == 1) { /* truncated */
            assert_int_equal(truncate(path, 60), 0);
        } else { /* a symlink planted in its place is never followed */
            char tgt[1100];
            snprintf(tgt, sizeof tgt, "%s.real", path);
            assert_int_equal(rename(path, tgt), 0);
            assert_int_equal(symlink(tgt, path), 0);
        }
        e = open_engine(ssd, 8);
        sink b = {0};
        run(e, &sp, &b, &res);
        kvt_engine_stats st;
        kvt_engine_stats_get(e, &st);
        assert_int_equal(st.ckpt_resumed, 0);
        assert_int_equal(st.ckpt_corrupt, 1);
        assert_int_equal(b.n, ref.n);
        assert_memory_equal(b.text, ref.text, ref.n);
        kvt_engine_free(e);
        if (mode == 2) {
            char tgt[1100];
            snprintf(tgt, sizeof tgt, "%s.real", path);
            struct stat sb;
            assert_int_equal(lstat(tgt, &sb), 0); /* the target was not touched */
            unlink(tgt);
        }
    }
}

/* The store: newest record per key wins; invalidation after a queued write removes it; records
 * survive reopening; the file is 0600. */
static void test_store_order(void **s) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/store", g_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    kvt_ckpt_store *st = NULL;
    char err[256];
    assert_int_equal(kvt_ckpt_store_open(dir, "compat-A", &st, err, sizeof err), KVT_OK);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = i + 1;
    kvt_ckpt_rec r = {.n_prompt = 7, .pending = 5, .rng = 99, .emitted = ids};
    memset(r.key, 0xab, 32);
    kvt_ckpt_store_pause(st, true);
    r.n_emitted = 10;
    assert_true(kvt_ckpt_store_save(st, &r, NULL));
    r.n_emitted = 20;
    r.rng = 100;
    assert_true(kvt_ckpt_store_save(st, &r, NULL));
    kvt_ckpt_stats cs;
    kvt_ckpt_store_stats(st, &cs);
    assert_int_equal(cs.pending, 1); /* replaced in place */
    kvt_ckpt_rec got;
    assert_true(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got)); /* the queued one is visible */
    assert_int_equal(got.n_emitted, 20);
    free(got.emitted);
    kvt_ckpt_store_pause(st, false);
    assert_true(kvt_ckpt_store_flush(st, 5000));
    kvt_ckpt_store_free(st);
    assert_int_equal(kvt_ckpt_store_open(dir, "compat-A", &st, err, sizeof err), KVT_OK);
    assert_true(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got));
    assert_int_equal(got.n_emitted, 20);
    assert_int_equal(got.rng, 100);
    assert_int_equal(got.pending, 5);
    assert_memory_equal(got.emitted, ids, 80);
    free(got.emitted);
    assert_false(kvt_ckpt_store_load(st, r.key, 8, 1000, 1000, &got)); /* another prompt length */
    assert_false(kvt_ckpt_store_load(st, r.key, 7, 50, 1000, &got));   /* ids outside the vocabulary */
    char name[40], path[1024];
    kvt_ckpt_file_name(r.key, name);
    snprintf(path, sizeof path, "%s/ckpt/%s", dir, name);
    struct stat sb;
    /* the two failed loads above removed it as unusable */
    assert_int_not_equal(stat(path, &sb), 0);
    r.n_emitted = 30;
    assert_true(kvt_ckpt_store_save(st, &r, NULL));
    assert_true(kvt_ckpt_store_flush(st, 5000));
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    kvt_ckpt_store_pause(st, true);
    r.n_emitted = 40;
    assert_true(kvt_ckpt_store_save(st, &r, NULL));
    kvt_ckpt_store_invalidate(st, r.key);
    assert_false(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got)); /* removal is the newest state */
    kvt_ckpt_store_pause(st, false);
    assert_true(kvt_ckpt_store_flush(st, 5000));
    assert_int_not_equal(stat(path, &sb), 0);
    kvt_ckpt_store_free(st);
    /* another compat key never uses this record */
    assert_int_equal(kvt_ckpt_store_open(dir, "compat-A", &st, err, sizeof err), KVT_OK);
    r.n_emitted = 10;
    assert_true(kvt_ckpt_store_save(st, &r, NULL));
    kvt_ckpt_store_free(st);
    assert_int_equal(kvt_ckpt_store_open(dir, "compat-B", &st, err, sizeof err), KVT_OK);
    assert_false(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got));
    kvt_ckpt_store_stats(st, &cs);
    assert_int_equal(cs.corrupt, 1);
    kvt_ckpt_store_free(st);
}

static void test_needs_ssd(void **s) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = g_model;
    o.generation_checkpoint = 64;
    kvt_engine *e = NULL;
    char err[256] = "";
    assert_int_equal(kvt_engine_create(&o, &e, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--ssd-cache"));
}

/* The same with --parallel 1: the row is driven inline by the generating thread. */
static void test_resume_greedy_inline(void **s) {
    g_parallel = 1;
    test_resume_greedy(s);
    g_parallel = 4;
}
static void test_resume_seeded_inline(void **s) {
    g_parallel = 1;
    test_resume_seeded(s);
    g_parallel = 4;
}

int main(void) {
    g_dir = tu_tmpdir("ckpt");
    g_model = malloc(strlen(g_dir) + 32);
    sprintf(g_model, "%s/llama.gguf", g_dir);
    kvt_gen_model_opts mo = {.arch = "llama", .shape = "tiny", .type = "f16", .seed = 7};
    char err[256] = "";
    if (kvt_gen_model(&mo, g_model, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "gen_model: %s\n", err);
        return 1;
    }
    uint64_t seed = 11;
    for (int i = 0; i < 40; i++) g_prompt[i] = (int32_t)(300 + tu_rand(&seed) % 2000);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_order),    cmocka_unit_test(test_needs_ssd),
        cmocka_unit_test(test_resume_greedy),  cmocka_unit_test(test_resume_seeded),
        cmocka_unit_test(test_resume_greedy_inline), cmocka_unit_test(test_resume_seeded_inline),
        cmocka_unit_test(test_changed_field_no_resume), cmocka_unit_test(test_corrupt_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
