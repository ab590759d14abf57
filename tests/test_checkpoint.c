/* test_checkpoint.c — generation checkpoints (--generation-checkpoint, issue 10 item 4) in-process:
 * a generation stopped at various token counts (client cancellation, then engine shutdown and a
 * new engine on the same directory) resumes on an identical request, and the whole text equals an
 * uninterrupted run without any cache (greedy and seeded sampling, with a stop string); a changed
 * sampling field does not resume; completion removes the record; a corrupt or planted record is
 * rejected; the store keeps the newest record per key and orders removal after writes. A failed
 * checkpoint write is retried with back-off before the next regular point (fault injection,
 * KVT_CKPT_FAIL_WRITES), and a hybrid (qwen35) generation killed after a checkpoint restores the
 * checkpoint's state snapshot instead of recomputing (forked child, SIGKILL).
 * (The kill -9 version against a real server: tests/e2e/crash_ckpt.sh.) */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/ssd_ckpt.h"
#include "engine/engine.h"
#include "model/gen_model.h"

static char *g_dir;
static char *g_model;
static char *g_draft; /* --draft-model for the speculative cases (NULL: none) */
static uint32_t g_parallel = 4; /* the engine default (scheduler); the _inline tests run with 1 */

static void set_draft(kvt_engine_opts *o) {
    o->draft_model = g_draft;
    o->draft_max = 4;
    o->draft_p_min = 0.0f; /* propose at every position: rounds of 5 tokens, rejections included */
    o->draft_threads = 1;
}

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
    set_draft(&o);
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
    /* kill_child (a forked child only): at kill_at callbacks, flush (what a crash would have
     * found durable), check the child's expectations, then SIGKILL itself */
    kvt_engine *e;
    uint32_t kill_at, wait_failed_at; /* wait_failed_at: wait there until a checkpoint write failed */
    uint64_t want_failed, want_retried; /* checked at kill_at (exit 3 if not) */
} sink;

static bool on_tok(void *ctx, int32_t id, const char *t, size_t len) {
    sink *s = ctx;
    if (len && s->n + len < sizeof s->text) {
        memcpy(s->text + s->n, t, len);
        s->n += len;
    }
    s->calls++;
    kvt_engine_stats st;
    if (s->e && s->calls == s->wait_failed_at) { /* the writer fails asynchronously: make the test deterministic */
        for (int i = 0; i < 2000; i++) {
            kvt_engine_stats_get(s->e, &st);
            if (st.ckpt_failed >= 1) break;
            usleep(5000);
        }
    }
    if (s->e && s->calls == s->kill_at) {
        kvt_flush_result fr;
        kvt_engine_flush(s->e, 20000, &fr);
        kvt_engine_stats_get(s->e, &st);
        if (!fr.durable || st.ckpt_failed != s->want_failed || st.ckpt_retried != s->want_retried) {
            fprintf(stderr, "child: durable %d failed %llu retried %llu\n", fr.durable, (unsigned long long)st.ckpt_failed,
                    (unsigned long long)st.ckpt_retried);
            _exit(3);
        }
        kill(getpid(), SIGKILL);
    }
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
    o.ubatch = 32;
    o.prompt_cache_gb = 0;
    set_draft(&o);
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
    if (g_draft) { /* the draft's state came back with the checkpoint: nothing of it recomputed */
        assert_true(st.spec_rounds > 0);
        assert_int_equal(st.spec_recomputed, 0);
        if (expect) assert_true(st.spec_reused_ssd >= 16);
    }
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

/* With a draft (speculative decoding): a checkpoint falls due inside a round and is saved at the
 * round's end (the target's sequence then holds only accepted tokens); the draft's blocks are saved
 * beside the target's; a resume restores both, forwards the pending token in a round as the
 * uninterrupted run did, and seeds the draft's draws from the recorded RNG: the text equals an
 * uninterrupted run with the same draft, greedy and seeded. Every cut here is past a round that
 * ended after the first checkpoint point (a round emits at most 5 tokens). */
static void resume_draft(const kvt_sampling *sp, uint64_t draft_seed, const uint32_t *cuts, size_t n_cuts) {
    char *d = malloc(strlen(g_dir) + 32);
    sprintf(d, "%s/draft-%llu.gguf", g_dir, (unsigned long long)draft_seed);
    kvt_gen_model_opts mo = {.arch = "llama", .shape = "tiny", .type = "f16", .seed = draft_seed};
    char err[256] = "";
    assert_int_equal(kvt_gen_model(&mo, d, err, sizeof err), KVT_OK);
    g_draft = d;
    sink ref;
    reference(sp, &ref);
    for (size_t i = 0; i < n_cuts; i++) check_resume(sp, &ref, cuts[i], 8);
    g_draft = NULL;
    free(d);
}
/* greedy: another random model, most proposals rejected */
static void test_resume_draft_greedy(void **s) {
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    static const uint32_t cuts[] = {45};
    resume_draft(&sp, 8, cuts, 1);
}
/* seeded: the target's own weights as the draft (q close to p: the draft's draws decide which
 * proposals are accepted, so a resume whose draft drew otherwise would emit another text) */
static void test_resume_draft_seeded(void **s) {
    kvt_sampling sp = seeded();
    static const uint32_t cuts[] = {20, 45, 91};
    resume_draft(&sp, 7, cuts, 3);
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

/* A generation SIGKILLed at `cut` emitted tokens in a forked child (after a flush: what a crash finds
 * durable; no final put, no store drain), with its expectations checked in the child (sink). */
static void kill_child(const char *ssd, uint32_t every, const kvt_sampling *sp, sink *tmpl) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
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
        if (kvt_engine_create(&o, &e, err, sizeof err) != KVT_OK) _exit(2);
        sink *a = calloc(1, sizeof *a);
        if (!a) _exit(2);
        *a = *tmpl;
        a->e = e;
        kvt_gen_request r = request(sp, a);
        kvt_gen_result res;
        kvt_engine_generate(e, &r, &res, err, sizeof err);
        _exit(4); /* not reached: killed at kill_at */
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    if (!WIFSIGNALED(wst)) fprintf(stderr, "child exited with %d\n", WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
}

/* The one checkpoint record's emitted count (-1 if none). */
static int64_t record_emitted(const char *ssd) {
    char path[1024], err[256], compat[512];
    if (count_kvc(ssd) != 1) return -1;
    first_kvc(ssd, path, sizeof path);
    kvt_ckpt_rec info;
    if (kvt_ckpt_file_check(path, &info, compat, sizeof compat, err, sizeof err) != KVT_OK) return -1;
    free(info.emitted);
    return info.n_emitted;
}

/* The store: a failed write is reported through the watch and leaves the published record in place
 * (the newest published one stays valid); a later save publishes. Replacing a queued record
 * settles its watch as REPLACED. */
static void test_store_failed_write(void **s) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/store-fail", g_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    kvt_ckpt_store *st = NULL;
    char err[256];
    assert_int_equal(kvt_ckpt_store_open(dir, "compat-A", &st, err, sizeof err), KVT_OK);
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = i + 3;
    kvt_ckpt_rec r = {.n_prompt = 7, .pending = 5, .rng = 1, .emitted = ids, .n_emitted = 10};
    memset(r.key, 0xcd, 32);
    kvt_ckpt_watch *w = NULL;
    assert_true(kvt_ckpt_store_save(st, &r, &w));
    assert_true(kvt_ckpt_store_flush(st, 5000));
    assert_int_equal(kvt_ckpt_watch_state(w), KVT_CKPT_PUBLISHED);
    kvt_ckpt_watch_release(w);
    kvt_ckpt_store_fail_writes(st, 1);
    r.n_emitted = 20;
    assert_true(kvt_ckpt_store_save(st, &r, &w));
    assert_true(kvt_ckpt_store_flush(st, 5000));
    assert_int_equal(kvt_ckpt_watch_state(w), KVT_CKPT_FAILED);
    kvt_ckpt_watch_release(w);
    kvt_ckpt_stats cs;
    kvt_ckpt_store_stats(st, &cs);
    assert_int_equal(cs.failed, 1);
    assert_int_equal(cs.written, 1);
    kvt_ckpt_rec got;
    assert_true(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got)); /* the previous record, intact */
    assert_int_equal(got.n_emitted, 10);
    free(got.emitted);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "find '%s/ckpt' -name '*.tmp' | grep -q .", dir);
    assert_int_not_equal(system(cmd), 0); /* the failed temporary was removed */
    /* a queued record replaced by a newer one: REPLACED; the newer one publishes */
    kvt_ckpt_store_pause(st, true);
    kvt_ckpt_watch *w2 = NULL;
    r.n_emitted = 30;
    assert_true(kvt_ckpt_store_save(st, &r, &w));
    r.n_emitted = 31;
    assert_true(kvt_ckpt_store_save(st, &r, &w2));
    assert_int_equal(kvt_ckpt_watch_state(w), KVT_CKPT_REPLACED);
    assert_int_equal(kvt_ckpt_watch_state(w2), KVT_CKPT_QUEUED);
    kvt_ckpt_store_pause(st, false);
    assert_true(kvt_ckpt_store_flush(st, 5000));
    assert_int_equal(kvt_ckpt_watch_state(w2), KVT_CKPT_PUBLISHED);
    kvt_ckpt_watch_release(w);
    kvt_ckpt_watch_release(w2);
    assert_true(kvt_ckpt_store_load(st, r.key, 7, 1000, 1000, &got));
    assert_int_equal(got.n_emitted, 31);
    free(got.emitted);
    kvt_ckpt_store_free(st);
}

/* A failed checkpoint write is retried with back-off, not left until the next regular point: the
 * first write (at 16 emitted tokens, every 16) fails; the request sees it at token 17 and saves a
 * fresh record at 18 (back-off 1), published before the regular point at 32. Killed at 30, the
 * generation resumes from that record (18 emitted) byte-identically. (Before retries the record
 * only came at 32: none at the kill.) */
static void retry_case(void) {
    kvt_sampling sp = seeded();
    sink ref;
    reference(&sp, &ref);
    char ssd[512];
    snprintf(ssd, sizeof ssd, "%s/ssd-retry-%d", g_dir, g_case++);
    setenv("KVT_CKPT_FAIL_WRITES", "1", 1);
    sink t = {.kill_at = 30, .wait_failed_at = 17, .want_failed = 1, .want_retried = 1};
    kill_child(ssd, 16, &sp, &t);
    unsetenv("KVT_CKPT_FAIL_WRITES");
    assert_int_equal(record_emitted(ssd), 18);
    kvt_engine *e = open_engine(ssd, 16);
    sink b = {0};
    kvt_gen_result res;
    run(e, &sp, &b, &res);
    assert_int_equal(res.n_gen, 120);
    assert_int_equal(b.n, ref.n);
    assert_memory_equal(b.text, ref.text, ref.n);
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    assert_int_equal(st.ckpt_resumed, 1);
    assert_int_equal(st.ckpt_failed, 0);
    kvt_engine_free(e);
}
static void test_failed_write_retried(void **s) { retry_case(); }
static void test_failed_write_retried_inline(void **s) {
    g_parallel = 1;
    retry_case();
    g_parallel = 4;
}

/* Hybrid (recurrent) model: a checkpoint snapshots the state, so a generation SIGKILLed after
 * its checkpoint at 20 emitted tokens (every 10; 60 = 40 + 20 tokens, inside block 3 of 16)
 * resumes by restoring prompt ++ emitted entirely (the frozen tail and the snapshot at 60),
 * computing only the pending token, and the text equals an uninterrupted run's. (Without the
 * checkpoint snapshot the resume could only restore the prompt-boundary snapshot at 40.) */
static void test_hybrid_resume_restores(void **s) {
    char *llama = g_model;
    g_model = (char *)"tests/fixtures/qwen35-tiny.gguf";
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sink ref;
    reference(&sp, &ref);
    char ssd[512];
    snprintf(ssd, sizeof ssd, "%s/ssd-hybrid", g_dir);
    sink t = {.kill_at = 25};
    kill_child(ssd, 10, &sp, &t);
    assert_int_equal(record_emitted(ssd), 20);
    kvt_engine *e = open_engine(ssd, 10);
    sink b = {0};
    kvt_gen_result res;
    run(e, &sp, &b, &res);
    assert_int_equal(res.n_gen, 120);
    assert_int_equal(b.n, ref.n);
    assert_memory_equal(b.text, ref.text, ref.n);
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    assert_int_equal(st.ckpt_resumed, 1);
    assert_int_equal(st.ckpt_resume_reused_tokens, 40 + 20);
    assert_int_equal(res.reused_from, KVT_TIER_SSD);
    kvt_engine_free(e);
    g_model = llama;
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
        cmocka_unit_test(test_store_failed_write), cmocka_unit_test(test_failed_write_retried),
        cmocka_unit_test(test_failed_write_retried_inline), cmocka_unit_test(test_hybrid_resume_restores),
        cmocka_unit_test(test_resume_draft_greedy), cmocka_unit_test(test_resume_draft_seeded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
