/* test_sched.c — continuous batching through the engine (engine/sched.h, docs/batching.md):
 * concurrent requests (distinct prompts, shared prefixes, cancelling ones) each produce exactly the
 * tokens they produce alone; a shared-prefix row reuses the sealed blocks of a row still running;
 * a pool too small for all rows queues them and serves every one, in order; a full wait queue is
 * refused with "out of KV memory"; nothing leaks (the pool holds only what the RAM tier holds); the
 * same holds for requests submitted without a waiting thread (kvt_engine_submit). */
#include <pthread.h>
#include <time.h>

#include "testutil.h"

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/gen_model.h"

static char *g_dir;
static char g_model[512];
static const char *g_cur = g_model; /* the model open_engine loads */
static uint32_t g_ubatch = 32;
static const char *g_ssd; /* --ssd-cache dir for open_engine, NULL = none */

#define MAXT 400
#define NP 12

typedef struct job {
    kvt_engine *e;
    int32_t prompt[512];
    uint32_t n_prompt, max_tokens, cancel_after;
    /* out */
    kvt_status st;
    char err[256];
    int32_t tok[MAXT];
    uint32_t n_gen, n_reused, seen;
    kvt_tier from;
    kvt_finish finish;
    int *order_slot; /* first-token order (admission test) */
    bool gate;       /* at its first token, wait (up to 10 s) for g_gate_open (admission test) */
} job;

static pthread_mutex_t g_order_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_order_next;
static int g_gate_open;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool on_tok(void *ctx, int32_t id, const char *t, size_t l) {
    (void)t, (void)l;
    job *j = ctx;
    if (id < 0) return true;
    uint32_t seen = __atomic_add_fetch(&j->seen, 1, __ATOMIC_SEQ_CST);
    if (seen == 1 && j->order_slot) {
        pthread_mutex_lock(&g_order_mu);
        *j->order_slot = g_order_next++;
        pthread_mutex_unlock(&g_order_mu);
    }
    for (int ms = 0; seen == 1 && j->gate && !__atomic_load_n(&g_gate_open, __ATOMIC_SEQ_CST) && ms < 10000; ms++)
        sleep_ms(1); /* keeps this row running (and its memory held) while the others are submitted */
    return !(j->cancel_after && seen >= j->cancel_after);
}

static void *run_job(void *arg) {
    job *j = arg;
    kvt_gen_request r = {.prompt = j->prompt, .n_prompt = j->n_prompt, .max_tokens = j->max_tokens, .ignore_eog = true,
                         .on_token = on_tok, .cb_ctx = j};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    j->st = kvt_engine_generate(j->e, &r, &res, j->err, sizeof j->err);
    if (j->st == KVT_OK) {
        j->n_gen = res.n_gen;
        memcpy(j->tok, res.tokens, sizeof(int32_t) * res.n_gen);
        j->n_reused = res.n_reused;
        j->from = res.reused_from;
        j->finish = res.finish;
    }
    free(res.tokens);
    return NULL;
}

static kvt_engine *open_engine(uint32_t parallel, double pool_gb, double pc_gb, uint32_t queue_max) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = g_cur;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = g_ubatch;
    o.block_tokens = 16;
    o.prompt_cache_gb = pc_gb;
    o.kv_pool_gb = pool_gb;
    o.parallel = parallel;
    o.ssd_dir = g_ssd;
    if (queue_max) o.queue_max = queue_max;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fail_msg("engine: %s", err);
    assert_int_equal(kvt_engine_parallel(e), parallel);
    return e;
}

static void fill(int32_t *ids, uint32_t n, uint32_t nv, uint64_t seed) {
    const uint32_t lo = nv > 1200 ? 300 : 0, span = nv > 1200 ? nv - 600 : nv; /* away from special ids */
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(lo + tu_rand(&seed) % span);
}

/* The tokens of each job's request alone (--parallel 1, no other request, cold). */
static void reference(job *jobs, uint32_t n, job *ref) {
    kvt_engine *e = open_engine(1, 0, 0, 0);
    for (uint32_t i = 0; i < n; i++) {
        ref[i] = jobs[i];
        ref[i].e = e;
        ref[i].cancel_after = 0;
        ref[i].order_slot = NULL;
        ref[i].seen = 0;
        run_job(&ref[i]);
        assert_int_equal(ref[i].st, KVT_OK);
        assert_int_equal(ref[i].n_gen, jobs[i].max_tokens);
    }
    kvt_engine_free(e);
}

static bool g_exact_pool = true; /* recurrent layouts: the RAM tier also counts state snapshots (not pool) */
static void check_pool_is_cache(kvt_engine *e) {
    kvt_engine_stats s;
    kvt_engine_stats_get(e, &s);
    if (g_exact_pool) assert_int_equal(s.pool_used_bytes, s.pc_bytes); /* no live row holds a block any more */
    else assert_true(s.pool_used_bytes <= s.pc_bytes);
    assert_int_equal(s.rows_active, 0);
    assert_int_equal(s.rows_queued, 0);
}

/* 12 concurrent requests over 4 rows: distinct prompts, a shared 64-token prefix, two cancelling. */
static void test_concurrent_identical(void **st) {
    (void)st;
    static job jobs[NP], ref[NP];
    uint32_t nv = 0;
    {
        kvt_engine *e = open_engine(1, 0, 0, 0);
        nv = kvt_engine_n_vocab(e);
        kvt_engine_free(e);
    }
    int32_t prefix[64];
    fill(prefix, 64, nv, 4242);
    for (uint32_t i = 0; i < NP; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].n_prompt = 20 + 7 * i;
        fill(jobs[i].prompt, jobs[i].n_prompt, nv, 100 + i);
        if (i % 3 == 1) memcpy(jobs[i].prompt, prefix, sizeof prefix), jobs[i].n_prompt += 64;
        jobs[i].max_tokens = 10 + 3 * i;
        if (i == 5 || i == 9) jobs[i].cancel_after = 4;
    }
    reference(jobs, NP, ref);
    for (int par = 2; par <= 4; par += 2) {
        kvt_engine *e = open_engine((uint32_t)par, 0, 0.5, 0);
        pthread_t th[NP];
        for (uint32_t i = 0; i < NP; i++) {
            jobs[i].e = e;
            jobs[i].seen = 0;
            assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
        }
        for (uint32_t i = 0; i < NP; i++) pthread_join(th[i], NULL);
        for (uint32_t i = 0; i < NP; i++) {
            if (jobs[i].st) fail_msg("job %u: %s", i, jobs[i].err);
            if (jobs[i].cancel_after) {
                assert_int_equal(jobs[i].finish, KVT_FINISH_CANCELLED);
                assert_int_equal(jobs[i].n_gen, jobs[i].cancel_after);
            } else {
                assert_int_equal(jobs[i].n_gen, ref[i].n_gen);
            }
            if (memcmp(jobs[i].tok, ref[i].tok, sizeof(int32_t) * jobs[i].n_gen))
                fail_msg("parallel %d job %u: tokens differ from the request alone", par, i);
        }
        kvt_engine_stats s;
        kvt_engine_stats_get(e, &s);
        assert_int_equal(s.parallel, (uint64_t)par);
        assert_true(s.batch_steps > 0);
        assert_true(s.batch_tokens_per_step_avg > 1.0); /* rows really shared steps */
        check_pool_is_cache(e);
        kvt_engine_free(e);
    }
}

/* A second request with the donor's prefix reuses the donor's sealed blocks while it still runs. */
static void test_shared_prefix_inflight(void **st) {
    (void)st;
    kvt_engine *e = open_engine(4, 0, 0.5, 0);
    const uint32_t nv = kvt_engine_n_vocab(e);
    static job donor, second, ref[2];
    memset(&donor, 0, sizeof donor);
    memset(&second, 0, sizeof second);
    donor.n_prompt = 100;
    fill(donor.prompt, 100, nv, 77);
    donor.max_tokens = MAXT;
    second.n_prompt = 106;
    memcpy(second.prompt, donor.prompt, 96 * sizeof(int32_t));
    fill(second.prompt + 96, 10, nv, 78);
    second.max_tokens = 8;
    job both[2] = {donor, second};
    reference(both, 2, ref);
    donor.e = second.e = e;
    pthread_t td;
    assert_int_equal(pthread_create(&td, NULL, run_job, &donor), 0);
    while (__atomic_load_n(&donor.seen, __ATOMIC_SEQ_CST) < 1) sleep_ms(1); /* donor's prefill done */
    run_job(&second);
    uint32_t donor_at = __atomic_load_n(&donor.seen, __ATOMIC_SEQ_CST);
    pthread_join(td, NULL);
    assert_int_equal(second.st, KVT_OK);
    assert_true(donor_at < MAXT); /* the donor was still decoding */
    assert_int_equal(second.from, KVT_TIER_RAM);
    assert_true(second.n_reused >= 96);
    assert_int_equal(memcmp(second.tok, ref[1].tok, sizeof(int32_t) * 8), 0);
    assert_int_equal(donor.st, KVT_OK);
    assert_int_equal(donor.n_gen, MAXT);
    assert_int_equal(memcmp(donor.tok, ref[0].tok, sizeof(int32_t) * MAXT), 0);
    check_pool_is_cache(e);
    kvt_engine_free(e);
}

/* A pool with room for one row's reservation: six requests queue, run one at a time in arrival
 * order, each correct; then a full wait queue refuses at once. */
static void test_admission_small_pool(void **st) {
    (void)st;
    kvt_engine *probe = open_engine(1, 0, 0, 0);
    const uint32_t nv = kvt_engine_n_vocab(probe);
    const double bpt = kvt_kv_layout_bytes_per_token(kvt_engine_layout(probe));
    kvt_engine_free(probe);
    enum { N = 6 };
    static job jobs[N], ref[N];
    int order[N];
    for (uint32_t i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].n_prompt = 40;
        fill(jobs[i].prompt, 40, nv, 900 + i);
        jobs[i].max_tokens = 24;
        order[i] = -1;
    }
    reference(jobs, N, ref);
    const double one_row = (40 + 24) * bpt;
    kvt_engine *e = open_engine(4, one_row * 1.5 / 1e9, 0, 0);
    pthread_t th[N];
    g_order_next = 0;
    __atomic_store_n(&g_gate_open, 0, __ATOMIC_SEQ_CST);
    jobs[0].gate = true; /* the first row runs until every request is queued: the others wait for memory */
    for (uint32_t i = 0; i < N; i++) {
        jobs[i].e = e;
        jobs[i].order_slot = &order[i];
        assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
        for (;;) { /* submit in a known order: wait until this one is queued or running */
            kvt_engine_stats s;
            kvt_engine_stats_get(e, &s);
            if (s.rows_active + s.rows_queued + s.requests >= i + 1) break;
            sleep_ms(1);
        }
    }
    __atomic_store_n(&g_gate_open, 1, __ATOMIC_SEQ_CST);
    for (uint32_t i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < N; i++) {
        if (jobs[i].st) fail_msg("job %u: %s", i, jobs[i].err);
        assert_int_equal(jobs[i].n_gen, 24);
        assert_int_equal(memcmp(jobs[i].tok, ref[i].tok, sizeof(int32_t) * 24), 0);
        assert_int_equal(order[i], (int)i);
    }
    kvt_engine_stats s;
    kvt_engine_stats_get(e, &s);
    assert_true(s.batch_memory_waits > 0);
    assert_true(s.pool_peak_bytes <= s.pool_budget_bytes);
    check_pool_is_cache(e);
    kvt_engine_free(e);

    /* queue of 1: a running row, one waiting for memory, the third is refused */
    e = open_engine(4, (40 + MAXT) * bpt * 1.2 / 1e9, 0, 1);
    static job a, b, c;
    memset(&a, 0, sizeof a);
    a.e = e;
    a.n_prompt = 40;
    fill(a.prompt, 40, nv, 1);
    a.max_tokens = MAXT;
    a.cancel_after = 0;
    b = a, c = a;
    c.max_tokens = b.max_tokens = 8;
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, run_job, &a), 0);
    while (__atomic_load_n(&a.seen, __ATOMIC_SEQ_CST) < 1) sleep_ms(1);
    b.max_tokens = MAXT; /* needs as much as a: waits */
    assert_int_equal(pthread_create(&tb, NULL, run_job, &b), 0);
    for (;;) {
        kvt_engine_stats s2;
        kvt_engine_stats_get(e, &s2);
        if (s2.rows_queued == 1) break;
        sleep_ms(1);
    }
    run_job(&c);
    assert_int_equal(c.st, KVT_ERR_POOL_EXHAUSTED);
    assert_non_null(strstr(c.err, "queue full"));
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.st, KVT_OK);
    assert_int_equal(b.st, KVT_OK);
    assert_int_equal(a.n_gen, MAXT);
    assert_int_equal(memcmp(a.tok, b.tok, sizeof(int32_t) * MAXT), 0);
    kvt_engine_free(e);
}

/* A short request arriving during a long prefill gets its prompt into the next step: its first
 * token comes long before the long request's (the prefill budget goes to the fewest tokens left). */
static void test_short_beside_long_prefill(void **st) {
    (void)st;
    g_ubatch = 8; /* the long prompt takes ~60 steps */
    kvt_engine *e = open_engine(4, 0, 0, 0);
    const uint32_t nv = kvt_engine_n_vocab(e);
    static job lng, sht;
    int order[2] = {-1, -1};
    memset(&lng, 0, sizeof lng);
    memset(&sht, 0, sizeof sht);
    lng.e = sht.e = e;
    lng.n_prompt = 480;
    fill(lng.prompt, 256, nv, 61);
    fill(lng.prompt + 256, 224, nv, 62);
    lng.max_tokens = 4;
    sht.n_prompt = 12;
    fill(sht.prompt, 12, nv, 63);
    sht.max_tokens = 4;
    lng.order_slot = &order[0];
    sht.order_slot = &order[1];
    g_order_next = 0;
    pthread_t tl;
    assert_int_equal(pthread_create(&tl, NULL, run_job, &lng), 0);
    for (;;) { /* the long row is admitted and prefilling */
        kvt_engine_stats s;
        kvt_engine_stats_get(e, &s);
        if (s.rows_active == 1 && s.batch_steps >= 1) break;
        sleep_ms(1);
    }
    run_job(&sht);
    pthread_join(tl, NULL);
    assert_int_equal(lng.st, KVT_OK);
    assert_int_equal(sht.st, KVT_OK);
    assert_int_equal(order[1], 0); /* the short request's first token came first */
    assert_int_equal(order[0], 1);
    kvt_engine_free(e);
    g_ubatch = 32;
}

/* Rows restored from the SSD tier (a restarted engine) run beside each other like lone requests. */
static void test_ssd_restore_rows(void **st) {
    (void)st;
    char *dir = tu_tmpdir("sched-ssd");
    assert_non_null(dir);
    g_ssd = dir;
    kvt_engine *e = open_engine(4, 0, 0.5, 0);
    const uint32_t nv = kvt_engine_n_vocab(e);
    enum { N = 4 };
    static job jobs[N], ref[N];
    for (uint32_t i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].n_prompt = 70 + 9 * i;
        fill(jobs[i].prompt, jobs[i].n_prompt, nv, 4000 + i);
        jobs[i].max_tokens = 10;
    }
    for (int round = 0; round < 2; round++) { /* 0: cold, written behind; 1: a new engine restores */
        pthread_t th[N];
        for (uint32_t i = 0; i < N; i++) {
            jobs[i].e = e;
            jobs[i].seen = 0;
            assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
        }
        for (uint32_t i = 0; i < N; i++) pthread_join(th[i], NULL);
        for (uint32_t i = 0; i < N; i++) {
            if (jobs[i].st) fail_msg("round %d job %u: %s", round, i, jobs[i].err);
            if (round == 0) ref[i] = jobs[i];
            else {
                assert_int_equal(jobs[i].from, KVT_TIER_SSD);
                assert_true(jobs[i].n_reused >= 64);
                assert_int_equal(jobs[i].n_gen, ref[i].n_gen);
                assert_int_equal(memcmp(jobs[i].tok, ref[i].tok, sizeof(int32_t) * ref[i].n_gen), 0);
            }
        }
        kvt_flush_result fr;
        kvt_engine_flush(e, 20000, &fr);
        assert_true(fr.durable);
        kvt_engine_free(e);
        if (round == 0) e = open_engine(4, 0, 0.5, 0);
    }
    g_ssd = NULL;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

/* Freeing the engine while rows run ends them cancelled (no hang, no leak). */
static void test_shutdown_cancels(void **st) {
    (void)st;
    kvt_engine *e = open_engine(2, 0, 0.5, 0);
    const uint32_t nv = kvt_engine_n_vocab(e);
    static job a;
    memset(&a, 0, sizeof a);
    a.e = e;
    a.n_prompt = 30;
    fill(a.prompt, 30, nv, 5);
    a.max_tokens = MAXT;
    pthread_t ta;
    assert_int_equal(pthread_create(&ta, NULL, run_job, &a), 0);
    while (__atomic_load_n(&a.seen, __ATOMIC_SEQ_CST) < 1) sleep_ms(1);
    kvt_engine_free(e); /* the scheduler cancels a; generate returns */
    pthread_join(ta, NULL);
    assert_int_equal(a.st, KVT_OK);
    assert_int_equal(a.finish, KVT_FINISH_CANCELLED);
    assert_true(a.n_gen < MAXT);
}

/* The per-row fallback (qwen35: recurrent state, deepseek2: MLA) and a sliding-window model
 * (gemma3: window blocks registered per chunk) through the scheduler: concurrent == alone. */
static void check_model_concurrent(const char *path) {
    g_cur = path;
    kvt_engine *probe = open_engine(1, 0, 0, 0);
    const uint32_t nv = kvt_engine_n_vocab(probe);
    kvt_engine_free(probe);
    enum { N = 5 };
    static job jobs[N], ref[N];
    int32_t prefix[40];
    fill(prefix, 40, nv, 31);
    for (uint32_t i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].n_prompt = 30 + 11 * i;
        fill(jobs[i].prompt, jobs[i].n_prompt, nv, 500 + i);
        if (i % 2) memcpy(jobs[i].prompt, prefix, sizeof prefix);
        jobs[i].max_tokens = 8 + 2 * i;
    }
    reference(jobs, N, ref);
    kvt_engine *e = open_engine(3, 0, 0.5, 0);
    pthread_t th[N];
    for (uint32_t i = 0; i < N; i++) {
        jobs[i].e = e;
        assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
    }
    for (uint32_t i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < N; i++) {
        if (jobs[i].st) fail_msg("%s job %u: %s", path, i, jobs[i].err);
        assert_int_equal(jobs[i].n_gen, ref[i].n_gen);
        if (memcmp(jobs[i].tok, ref[i].tok, sizeof(int32_t) * jobs[i].n_gen))
            fail_msg("%s job %u: tokens differ from the request alone", path, i);
    }
    check_pool_is_cache(e);
    kvt_engine_free(e);
    g_cur = g_model;
}

static void test_fallback_archs(void **st) {
    (void)st;
    g_exact_pool = false;
    check_model_concurrent("tests/fixtures/qwen35-tiny.gguf");
    g_exact_pool = true;
    check_model_concurrent("tests/fixtures/deepseek2-tiny.gguf");
    char gem[600];
    snprintf(gem, sizeof gem, "%s/gemma3.gguf", g_dir);
    kvt_gen_model_opts o = {.arch = "gemma3", .shape = "tiny", .type = "q8_0", .seed = 9};
    char err[256] = "";
    if (kvt_gen_model(&o, gem, err, sizeof err) != KVT_OK) fail_msg("gen_model: %s", err);
    check_model_concurrent(gem);
    unlink(gem);
}

static int setup(void **st) {
    (void)st;
    g_dir = tu_tmpdir("sched");
    snprintf(g_model, sizeof g_model, "%s/llama.gguf", g_dir);
    kvt_gen_model_opts o = {.arch = "llama", .shape = "tiny", .type = "q8_0", .seed = 7};
    char err[256] = "";
    if (kvt_gen_model(&o, g_model, err, sizeof err) != KVT_OK) fail_msg("gen_model: %s", err);
    return 0;
}
static int teardown(void **st) {
    (void)st;
    unlink(g_model);
    rmdir(g_dir);
    free(g_dir);
    return 0;
}

/* kvt_engine_submit (the server's path: no thread waits for a row), at --parallel 1 and 3: every
 * request produces the tokens it produces alone; one cancelled before it was submitted ends
 * cancelled before its lookup; done runs once per request; a follow-up row is served ahead of the
 * rows already waiting (the first row is held in its first token callback while the others are
 * queued, so the order is deterministic at --parallel 1). */
typedef struct sub {
    kvt_gen_request rq;
    kvt_gen_result res;
    char err[256];
    kvt_status st;
    int done_calls, cancel, order;
    uint32_t seen;
    bool hold; /* wait in the first token callback until g_release */
} sub;
static pthread_mutex_t g_sub_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_sub_cv = PTHREAD_COND_INITIALIZER;
static int g_sub_done, g_sub_order, g_release;

static bool sub_tok(void *ctx, int32_t id, const char *t, size_t l) {
    (void)t, (void)l;
    sub *b = ctx;
    if (id < 0) return true;
    if (__atomic_fetch_add(&b->seen, 1, __ATOMIC_SEQ_CST) == 0) {
        pthread_mutex_lock(&g_sub_mu);
        b->order = g_sub_order++;
        while (b->hold && !g_release) pthread_cond_wait(&g_sub_cv, &g_sub_mu);
        pthread_mutex_unlock(&g_sub_mu);
    }
    return true;
}
static void sub_done(void *ctx, kvt_status st) {
    sub *b = ctx;
    pthread_mutex_lock(&g_sub_mu);
    b->st = st;
    b->done_calls++;
    g_sub_done++;
    pthread_cond_broadcast(&g_sub_cv);
    pthread_mutex_unlock(&g_sub_mu);
}

static void check_submit(uint32_t parallel) {
    enum { N = 6, CANCELLED = 2, FOLLOW = 5 };
    static job jobs[N], ref[N];
    static sub subs[N];
    kvt_engine *e = open_engine(parallel, 0, 0.5, 0);
    const uint32_t nv = kvt_engine_n_vocab(e);
    for (uint32_t i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].n_prompt = 20 + 7 * i;
        fill(jobs[i].prompt, jobs[i].n_prompt, nv, 900 + i);
        jobs[i].max_tokens = 6 + i;
    }
    reference(jobs, N, ref);
    g_sub_done = g_sub_order = g_release = 0;
    for (uint32_t i = 0; i < N; i++) {
        sub *b = &subs[i];
        memset(b, 0, sizeof *b);
        b->order = -1;
        b->hold = i == 0 && parallel == 1;
        b->rq = (kvt_gen_request){.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_tokens = jobs[i].max_tokens,
                                  .ignore_eog = true, .on_token = sub_tok, .cb_ctx = b, .cancel = &b->cancel};
        kvt_sampling_default(&b->rq.sampling);
        if (i == CANCELLED) __atomic_store_n(&b->cancel, 1, __ATOMIC_RELAXED);
        if (i == 1 && parallel == 1) /* row 0 holds the only slot: 1..4 wait */
            while (__atomic_load_n(&subs[0].seen, __ATOMIC_SEQ_CST) < 1) sleep_ms(1);
        assert_int_equal(kvt_engine_submit(e, &b->rq, &b->res, b->err, sizeof b->err, i == FOLLOW, sub_done, b), KVT_OK);
    }
    pthread_mutex_lock(&g_sub_mu);
    g_release = 1;
    pthread_cond_broadcast(&g_sub_cv);
    while (g_sub_done < N) pthread_cond_wait(&g_sub_cv, &g_sub_mu);
    pthread_mutex_unlock(&g_sub_mu);
    for (uint32_t i = 0; i < N; i++) {
        sub *b = &subs[i];
        assert_int_equal(b->done_calls, 1);
        if (i == CANCELLED) {
            assert_int_equal(b->st, KVT_ERR_CANCELLED);
            assert_int_equal(b->res.finish, KVT_FINISH_CANCELLED);
            assert_int_equal(b->res.n_gen, 0);
            assert_non_null(strstr(b->err, "before it started"));
            continue;
        }
        if (b->st) fail_msg("submit %u (parallel %u): %s", i, parallel, b->err);
        assert_int_equal(b->res.n_gen, ref[i].n_gen);
        if (memcmp(b->res.tokens, ref[i].tok, sizeof(int32_t) * b->res.n_gen))
            fail_msg("submit %u (parallel %u): tokens differ from the request alone", i, parallel);
        free(b->res.tokens);
    }
    if (parallel == 1) { /* 0 ran first; the follow-up went ahead of 1, 3, 4 (2 never started) */
        assert_int_equal(subs[0].order, 0);
        assert_int_equal(subs[FOLLOW].order, 1);
        assert_int_equal(subs[1].order, 2);
        assert_int_equal(subs[3].order, 3);
        assert_int_equal(subs[4].order, 4);
    }
    check_pool_is_cache(e);
    kvt_engine_free(e);
}

static void test_submit(void **st) {
    (void)st;
    check_submit(1);
    check_submit(3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_identical),
        cmocka_unit_test(test_shared_prefix_inflight),
        cmocka_unit_test(test_admission_small_pool),
        cmocka_unit_test(test_shutdown_cancels),
        cmocka_unit_test(test_short_beside_long_prefill),
        cmocka_unit_test(test_ssd_restore_rows),
        cmocka_unit_test(test_fallback_archs),
        cmocka_unit_test(test_submit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
