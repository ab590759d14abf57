/* test_spec.c — speculative decoding (engine/spec.h, engine/spec_verify.h, docs/speculative.md):
 * the acceptance rule keeps the target's distribution (chi-square over 10^4 draws on synthetic p
 * and q, with a check that the same statistic rejects a wrong rule); the sampler's distribution
 * for verification is the one its draws follow; greedy output with a draft equals plain decoding
 * bit for bit on llama, qwen3 and gemma3 (sliding window: rollback across dropped blocks), alone
 * and in batched rows, with a random draft (rejections) and with the target as its own draft
 * (every proposal accepted, also under sampling: p == q); a logits processor and logprobs see a
 * round as plain steps; the vocabulary check names the first differing token; bad option values
 * are refused with their names. */
#include <math.h>
#include <pthread.h>

#include "testutil.h"

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "model/gen_model.h"

static char *g_dir;

/* A tiny random-weight model (GPT-2 vocabulary unless byte_vocab) in the test folder. */
static char *model_path(const char *arch, uint64_t seed, bool byte_vocab) {
    char *path = malloc(strlen(g_dir) + 96);
    sprintf(path, "%s/%s-%llu%s.gguf", g_dir, arch, (unsigned long long)seed, byte_vocab ? "-bytes" : "");
    if (access(path, R_OK) == 0) return path;
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = "f16", .seed = seed, .byte_vocab = byte_vocab};
    char err[256] = "";
    if (kvt_gen_model(&o, path, err, sizeof err) != KVT_OK) fail_msg("gen_model %s: %s", arch, err);
    return path;
}

/* ---- the acceptance rule ---------------------------------------------------------------------- */

/* chi-square critical values at p = 0.001 for 1..7 degrees of freedom */
static const double k_chi2_001[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

static double uni(uint64_t *s) { return (double)(tu_rand(s) >> 11) / 9007199254740992.0; }

/* Chi-square of the counts against N * p over p's support (cells where p is 0 must stay empty:
 * returns INFINITY otherwise); *df its degrees of freedom. */
static double chi2(const uint32_t *count, const float *p, uint32_t n, uint32_t N, uint32_t *df) {
    double x = 0;
    uint32_t cells = 0;
    *df = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p[i] <= 0) {
            if (count[i]) return INFINITY;
            continue;
        }
        const double e = (double)N * p[i];
        x += ((double)count[i] - e) * ((double)count[i] - e) / e;
        cells++;
    }
    *df = cells ? cells - 1 : 0;
    return x;
}

enum { NV = 8, DRAWS = 10000 };

/* DRAWS rounds: x ~ q, then the rule against p. Returns the chi-square of the outputs against p
 * (df set) and the accepted fraction. */
static double run_rule(const float *p, const float *q, uint64_t seed, uint32_t *df, double *acc_rate) {
    uint32_t count[NV] = {0}, acc = 0;
    uint64_t s = seed;
    for (uint32_t i = 0; i < DRAWS; i++) {
        const int32_t x = kvt_spec_draw(q, NV, uni(&s));
        assert_true(x >= 0 && x < NV);
        assert_true(q[x] > 0);
        bool a = false;
        const double u1 = uni(&s), u2 = uni(&s);
        const int32_t t = kvt_spec_verify(p, q, NV, x, u1, u2, &a);
        assert_true(t >= 0 && t < NV);
        if (a) assert_int_equal(t, x);
        else assert_int_not_equal(t, x); /* a rejected token is never drawn again from the residual */
        acc += a;
        count[t]++;
    }
    *acc_rate = (double)acc / DRAWS;
    return chi2(count, p, NV, DRAWS, df);
}

static void normalise(float *w, uint32_t n) {
    double t = 0;
    for (uint32_t i = 0; i < n; i++) t += w[i];
    for (uint32_t i = 0; i < n; i++) w[i] = (float)(w[i] / t);
}

static void check_rule(const float *p, const float *q, uint64_t seed) {
    uint32_t df = 0;
    double acc = 0;
    const double x = run_rule(p, q, seed, &df, &acc);
    assert_true(df < 8);
    if (!isfinite(x) || (df > 0 && !(x < k_chi2_001[df]))) fail_msg("chi-square %.2f >= %.2f (df %u): the output is not distributed as p", x, k_chi2_001[df], df);
    /* the expected acceptance rate is sum_i min(p_i, q_i); 5 binomial standard deviations */
    double want = 0;
    for (uint32_t i = 0; i < NV; i++) want += p[i] < q[i] ? p[i] : q[i];
    const double sd = sqrt(want * (1 - want) / DRAWS);
    if (fabs(acc - want) > 5 * sd + 1e-9) fail_msg("acceptance %.4f, expected %.4f", acc, want);
}

static void test_rule_preserves_p(void **st) {
    (void)st;
    uint64_t s = 42;
    float p[NV], q[NV];
    /* full supports, unrelated */
    for (uint32_t i = 0; i < NV; i++) p[i] = (float)(0.05 + uni(&s)), q[i] = (float)(0.05 + uni(&s));
    normalise(p, NV);
    normalise(q, NV);
    check_rule(p, q, 1);
    /* the target cut to 5 candidates (top-k), the draft with mass where p has none and missing
     * one token p likes */
    const float p2[NV] = {0.4f, 0.25f, 0.15f, 0.12f, 0.08f, 0, 0, 0};
    const float q2[NV] = {0.1f, 0.3f, 0, 0.2f, 0.1f, 0.2f, 0.1f, 0};
    check_rule(p2, q2, 2);
    /* the same distribution: everything accepted */
    check_rule(p, p, 3);
    uint32_t df = 0;
    double acc = 0;
    run_rule(p, p, 4, &df, &acc);
    assert_true(acc == 1.0);
    /* a one-hot target (greedy settings): the rule gives its token every time */
    const float p3[NV] = {0, 0, 0, 1, 0, 0, 0, 0};
    check_rule(p3, q, 5);
    /* the statistic has power: the draft's own tokens (no rule) fail it */
    uint32_t count[NV] = {0};
    s = 6;
    for (uint32_t i = 0; i < DRAWS; i++) count[kvt_spec_draw(q, NV, uni(&s))]++;
    const double x = chi2(count, p, NV, DRAWS, &df);
    assert_int_equal(df, NV - 1);
    if (x < k_chi2_001[df]) fail_msg("chi-square %.2f does not tell q from p", x);
}

static void test_draw_edges(void **st) {
    (void)st;
    const float z[4] = {0, 0, 0, 0}, w[4] = {0, 2, 0, 2};
    assert_int_equal(kvt_spec_draw(z, 4, 0.5), -1);
    assert_int_equal(kvt_spec_draw(w, 0, 0.5), -1);
    assert_int_equal(kvt_spec_draw(w, 4, 0.0), 1);
    assert_int_equal(kvt_spec_draw(w, 4, 0.49), 1);
    assert_int_equal(kvt_spec_draw(w, 4, 0.51), 3);
    assert_int_equal(kvt_spec_draw(w, 4, 0.999999999), 3);
    bool a = true;
    assert_int_equal(kvt_spec_verify(w, w, 4, 4, 0.5, 0.5, &a), -1);
    assert_false(a);
    assert_int_equal(kvt_spec_verify(w, w, 4, -1, 0.5, 0.5, &a), -1);
}

/* kvt_sampler_probs is the distribution kvt_sampler_sample draws from (the p of verification):
 * chi-square of 10^4 draws against it, under temperature, top-k, top-p, min-p and penalties. */
static void test_sampler_probs(void **st) {
    (void)st;
    enum { V = 16 };
    kvt_sampler *sm = kvt_sampler_create(V);
    assert_non_null(sm);
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sp.temperature = 0.9f;
    sp.top_k = 7;
    sp.top_p = 0.95f;
    sp.min_p = 0.02f;
    sp.repeat_penalty = 1.5f;
    sp.seed = 11;
    float logits[V], work[V], probs[V];
    uint64_t s = 77;
    for (uint32_t i = 0; i < V; i++) logits[i] = 3.0f * tu_randf(&s);
    kvt_sampler_reset(sm, &sp);
    kvt_sampler_accept(sm, 3); /* a penalised token */
    memcpy(work, logits, sizeof work);
    kvt_sampler_probs(sm, work, probs);
    double tot = 0;
    uint32_t support = 0;
    for (uint32_t i = 0; i < V; i++) tot += probs[i], support += probs[i] > 0;
    assert_true(fabs(tot - 1.0) < 1e-5);
    assert_true(support >= 2 && support <= 7);
    uint32_t count[V] = {0};
    for (uint32_t i = 0; i < DRAWS; i++) {
        memcpy(work, logits, sizeof work);
        count[kvt_sampler_sample(sm, work)]++; /* same history: the penalty applies every time */
    }
    uint32_t df = 0;
    const double x = chi2(count, probs, V, DRAWS, &df);
    if (!(x < k_chi2_001[df])) fail_msg("sampler draws vs kvt_sampler_probs: chi-square %.2f (df %u)", x, df);
    /* greedy settings: one-hot on the argmax */
    sp.temperature = 0;
    kvt_sampler_reset(sm, &sp);
    memcpy(work, logits, sizeof work);
    kvt_sampler_probs(sm, work, probs);
    memcpy(work, logits, sizeof work);
    const int32_t g = kvt_sampler_sample(sm, work);
    assert_true(probs[g] == 1.0f);
    kvt_sampler_free(sm);
}

/* ---- the engine ------------------------------------------------------------------------------- */

static kvt_status open_engine(const char *target, const char *draft, uint32_t parallel, uint32_t draft_max, kvt_engine **e,
                              char *err, size_t errlen) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = target;
    o.n_threads = 2;
    o.n_ctx = 256;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.prompt_cache_gb = 0.1;
    o.parallel = parallel;
    o.draft_model = draft;
    o.draft_max = draft_max;
    o.draft_p_min = 0; /* random drafts are unsure of everything: propose anyway */
    return kvt_engine_create(&o, e, err, errlen);
}

static kvt_engine *must_open(const char *target, const char *draft, uint32_t parallel, uint32_t draft_max) {
    kvt_engine *e = NULL;
    char err[512] = "";
    if (open_engine(target, draft, parallel, draft_max, &e, err, sizeof err) != KVT_OK) fail_msg("engine: %s", err);
    return e;
}

static void fill(int32_t *ids, uint32_t n, uint32_t nv, uint64_t seed) {
    uint64_t s = seed;
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(300 + tu_rand(&s) % (nv - 600));
}

enum { ROWS = 3, N_PROMPT = 37, N_GEN = 45 };

typedef struct job {
    int32_t prompt[N_PROMPT];
    kvt_gen_request rq;
    kvt_gen_result res;
    char err[256];
    kvt_status st;
} job;

static void make_jobs(job *j, uint32_t nv, const kvt_sampling *sp) {
    for (uint32_t i = 0; i < ROWS; i++) {
        memset(&j[i], 0, sizeof j[i]);
        fill(j[i].prompt, N_PROMPT, nv, 500 + i);
        j[i].rq = (kvt_gen_request){.prompt = j[i].prompt, .n_prompt = N_PROMPT - 5 * i, .max_tokens = N_GEN - 4 * i,
                                    .ignore_eog = true, .sampling = *sp};
    }
}

/* Each job alone (kvt_engine_generate; at --parallel > 1 through the scheduler, one row at a time). */
static void run_alone(kvt_engine *e, job *j) {
    for (uint32_t i = 0; i < ROWS; i++) {
        j[i].st = kvt_engine_generate(e, &j[i].rq, &j[i].res, j[i].err, sizeof j[i].err);
        if (j[i].st) fail_msg("generate %u: %s", i, j[i].err);
        assert_int_equal(j[i].res.n_gen, j[i].rq.max_tokens);
    }
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done;
static void job_done(void *ctx, kvt_status st) {
    job *j = ctx;
    pthread_mutex_lock(&g_mu);
    j->st = st;
    g_done++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* All jobs at once (kvt_engine_submit): batched rows, each with its own draft row. */
static void run_batched(kvt_engine *e, job *j) {
    g_done = 0;
    for (uint32_t i = 0; i < ROWS; i++)
        assert_int_equal(kvt_engine_submit(e, &j[i].rq, &j[i].res, j[i].err, sizeof j[i].err, false, job_done, &j[i]), KVT_OK);
    pthread_mutex_lock(&g_mu);
    while (g_done < ROWS) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    for (uint32_t i = 0; i < ROWS; i++) {
        if (j[i].st) fail_msg("submit %u: %s", i, j[i].err);
        assert_int_equal(j[i].res.n_gen, j[i].rq.max_tokens);
    }
}

static void same_tokens(const job *a, const job *b, const char *what) {
    for (uint32_t i = 0; i < ROWS; i++)
        for (uint32_t t = 0; t < a[i].res.n_gen; t++)
            if (a[i].res.tokens[t] != b[i].res.tokens[t])
                fail_msg("%s: row %u differs at token %u (%d vs %d)", what, i, t, a[i].res.tokens[t], b[i].res.tokens[t]);
}

static void free_jobs(job *j) {
    for (uint32_t i = 0; i < ROWS; i++) free(j[i].res.tokens);
}

static kvt_engine_stats stats_of(kvt_engine *e) {
    kvt_engine_stats s;
    kvt_engine_stats_get(e, &s);
    return s;
}

/* Greedy output with a draft == plain greedy output, alone and batched; a random draft is
 * rejected often (the rollback path), the target as its own draft never. penalty: with a repeat
 * penalty (the sampler's history must follow every accepted token). */
static void check_greedy(const char *arch, bool penalty) {
    char *target = model_path(arch, 7, false);
    char *other = model_path(!strcmp(arch, "llama") ? "qwen3" : "llama", 8, false); /* another arch: only the vocab must match */
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    if (penalty) sp.repeat_penalty = 1.3f;
    static job plain[ROWS], spec[ROWS];
    kvt_engine *e = must_open(target, NULL, 1, 4);
    const uint32_t nv = kvt_engine_n_vocab(e);
    make_jobs(plain, nv, &sp);
    run_alone(e, plain);
    kvt_engine_free(e);

    /* the target as its own draft proposes the target's argmax, so every proposal is accepted
     * unless a penalty moves the target's choice */
    const struct { const char *draft; uint32_t parallel, draft_max; bool batched, all_accepted; } runs[] = {
        {other, 1, 4, false, false}, {target, 1, 5, false, !penalty}, {other, 3, 3, true, false}, {target, 3, 6, true, !penalty},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        e = must_open(target, runs[r].draft, runs[r].parallel, runs[r].draft_max);
        make_jobs(spec, nv, &sp);
        if (runs[r].batched) run_batched(e, spec);
        else run_alone(e, spec);
        char what[160];
        snprintf(what, sizeof what, "%s greedy%s, draft %s, parallel %u, draft-max %u", arch, penalty ? " + penalty" : "",
                 runs[r].draft == target ? "= target" : "random", runs[r].parallel, runs[r].draft_max);
        same_tokens(plain, spec, what);
        const kvt_engine_stats s = stats_of(e);
        assert_true(s.spec_enabled);
        assert_true(s.spec_rounds > 0);
        assert_true(s.spec_proposed >= s.spec_rounds);
        assert_true(s.spec_accepted <= s.spec_proposed);
        assert_int_equal(s.spec_off_rows, 0);
        if (runs[r].all_accepted) { /* the target proposes its own argmax: bit-identical logits accept it */
            if (s.spec_accepted != s.spec_proposed)
                fail_msg("%s: %llu of %llu accepted", what, (unsigned long long)s.spec_accepted,
                         (unsigned long long)s.spec_proposed);
            /* fewer verify passes than tokens: several tokens per target pass */
            assert_true(s.spec_rounds * 2 < s.generated_tokens);
        } else if (runs[r].draft == other) {
            assert_true(s.spec_accepted < s.spec_proposed); /* rejections happened: rollbacks ran */
        }
        assert_true(s.spec_draft_time_share > 0 && s.spec_draft_time_share <= 1);
        free_jobs(spec);
        kvt_engine_free(e);
    }
    /* the next turn reuses the prompt and the reply from the RAM tier (the row put back exactly
     * its tokens, no rejected draft) and continues as plain decoding does */
    e = must_open(target, other, 1, 4);
    int32_t turn[N_PROMPT + N_GEN + 8];
    memcpy(turn, plain[0].prompt, sizeof(int32_t) * N_PROMPT);
    job first = {0};
    first.rq = plain[0].rq;
    first.st = kvt_engine_generate(e, &first.rq, &first.res, first.err, sizeof first.err);
    assert_int_equal(first.st, KVT_OK);
    memcpy(turn + N_PROMPT, first.res.tokens, sizeof(int32_t) * (N_GEN - 1));
    fill(turn + N_PROMPT + N_GEN - 1, 5, nv, 9);
    kvt_gen_request rq2 = {.prompt = turn, .n_prompt = N_PROMPT + N_GEN + 4, .max_tokens = 10, .ignore_eog = true, .sampling = sp};
    kvt_gen_result hot, cold;
    char err[256] = "";
    assert_int_equal(kvt_engine_generate(e, &rq2, &hot, err, sizeof err), KVT_OK);
    assert_true(hot.n_reused >= N_PROMPT + N_GEN - 2);
    kvt_engine_free(e);
    e = must_open(target, NULL, 1, 4);
    rq2.no_cache = true;
    assert_int_equal(kvt_engine_generate(e, &rq2, &cold, err, sizeof err), KVT_OK);
    assert_int_equal(hot.n_gen, cold.n_gen);
    assert_memory_equal(hot.tokens, cold.tokens, sizeof(int32_t) * hot.n_gen);
    kvt_engine_free(e);
    free(hot.tokens);
    free(cold.tokens);
    free(first.res.tokens);
    free_jobs(plain);
    free(target);
    free(other);
}

static void test_greedy_llama(void **st) { (void)st, check_greedy("llama", false); }
static void test_greedy_qwen3(void **st) { (void)st, check_greedy("qwen3", true); }
static void test_greedy_gemma3(void **st) { (void)st, check_greedy("gemma3", false); }

/* A logits processor (here: only even token ids) and logprobs go through a round exactly as
 * through plain steps: the same tokens, and the same log-probabilities reported for each. */
typedef struct lp_log {
    kvt_token_logprobs lp[N_GEN];
    uint32_t n, accepted;
} lp_log;
static void even_apply(void *ctx, float *logits, uint32_t n) {
    (void)ctx;
    for (uint32_t i = 1; i < n; i += 2) logits[i] = -INFINITY;
}
static void even_accept(void *ctx, int32_t id) {
    lp_log *l = ctx;
    assert_true(id % 2 == 0);
    l->accepted++;
}
static void on_lp(void *ctx, const kvt_token_logprobs *lp) {
    lp_log *l = ctx;
    if (l->n < N_GEN) l->lp[l->n++] = *lp;
}
static void test_processor_logprobs(void **st) {
    (void)st;
    char *target = model_path("llama", 7, false), *other = model_path("qwen3", 8, false);
    static lp_log logs[2];
    int32_t *out[2];
    for (int pass = 0; pass < 2; pass++) {
        kvt_engine *e = must_open(target, pass ? other : NULL, 1, 4);
        int32_t prompt[N_PROMPT];
        fill(prompt, N_PROMPT, kvt_engine_n_vocab(e), 31);
        lp_log *l = &logs[pass];
        memset(l, 0, sizeof *l);
        kvt_gen_request rq = {.prompt = prompt, .n_prompt = N_PROMPT, .max_tokens = N_GEN, .ignore_eog = true,
                              .n_logprobs = 3, .on_logprobs = on_lp, .cb_ctx = l,
                              .proc = {.apply = even_apply, .accept = even_accept, .ctx = l}};
        kvt_sampling_default(&rq.sampling);
        kvt_gen_result res;
        char err[256] = "";
        if (kvt_engine_generate(e, &rq, &res, err, sizeof err) != KVT_OK) fail_msg("generate: %s", err);
        assert_int_equal(res.n_gen, N_GEN);
        assert_int_equal(l->n, N_GEN);
        assert_int_equal(l->accepted, N_GEN);
        out[pass] = res.tokens;
        if (pass) assert_true(stats_of(e).spec_rounds > 0);
        kvt_engine_free(e);
    }
    assert_memory_equal(out[0], out[1], sizeof(int32_t) * N_GEN);
    for (uint32_t i = 0; i < N_GEN; i++) {
        assert_int_equal(logs[0].lp[i].id, logs[1].lp[i].id);
        assert_true(logs[0].lp[i].logprob == logs[1].lp[i].logprob);
        assert_int_equal(logs[0].lp[i].n_top, logs[1].lp[i].n_top);
        assert_memory_equal(logs[0].lp[i].top_ids, logs[1].lp[i].top_ids, sizeof(int32_t) * logs[0].lp[i].n_top);
    }
    free(out[0]);
    free(out[1]);
    free(target);
    free(other);
}

/* Sampling with the target as its own draft: q == p at every position, so every proposal is
 * accepted (the draft's q and the target's p are computed alike); with a random draft the rows
 * still emit max_tokens tokens from the target's candidates. */
static void test_sampled(void **st) {
    (void)st;
    char *target = model_path("llama", 7, false), *other = model_path("qwen3", 8, false);
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.seed = 3;
    static job j[ROWS];
    for (int pass = 0; pass < 2; pass++) {
        kvt_engine *e = must_open(target, pass ? other : target, pass ? 3 : 1, 4);
        make_jobs(j, kvt_engine_n_vocab(e), &sp);
        if (pass) run_batched(e, j);
        else run_alone(e, j);
        const kvt_engine_stats s = stats_of(e);
        assert_true(s.spec_rounds > 0);
        if (!pass && s.spec_accepted != s.spec_proposed)
            fail_msg("own draft, sampled: %llu of %llu accepted", (unsigned long long)s.spec_accepted,
                     (unsigned long long)s.spec_proposed);
        if (pass) assert_true(s.spec_accepted < s.spec_proposed);
        free_jobs(j);
        kvt_engine_free(e);
    }
    free(target);
    free(other);
}

static int g_draft_threads = 1; /* expect_refused's --draft-threads */

static void expect_refused(const char *target, const char *draft, uint32_t draft_max, uint32_t draft_min, float p_min,
                           uint32_t ubatch, uint32_t ckpt, kvt_status want, const char *msg) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = target;
    o.n_threads = 1;
    o.n_ctx = 128;
    o.ubatch = ubatch;
    o.block_tokens = 16;
    o.draft_model = draft;
    o.draft_max = draft_max;
    o.draft_min = draft_min;
    o.draft_p_min = p_min;
    o.generation_checkpoint = ckpt;
    o.draft_threads = g_draft_threads;
    kvt_engine *e = NULL;
    char err[512] = "";
    const kvt_status s = kvt_engine_create(&o, &e, err, sizeof err);
    assert_null(e);
    if (s != want || !strstr(err, msg)) fail_msg("want %d '%s', got %d '%s'", want, msg, s, err);
}

/* A draft with another vocabulary is a startup error naming the first differing token; bad option
 * values and unsupported combinations are refused with the option's name. */
static void test_refusals(void **st) {
    (void)st;
    char *t = model_path("llama", 7, false), *bytes = model_path("llama", 9, true), *rec = model_path("qwen35", 7, false);
    expect_refused(t, bytes, 4, 0, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "vocabulary differs from the target's at token ");
    expect_refused(bytes, t, 4, 0, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "vocabulary differs from the target's at token ");
    expect_refused(t, t, 0, 0, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-max must be in [1, 64] (got 0)");
    expect_refused(t, t, 65, 0, 0.5f, 512, 0, KVT_ERR_INVALID_ARG, "--draft-max must be in [1, 64] (got 65)");
    expect_refused(t, t, 4, 5, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-min 5 is more than --draft-max 4");
    expect_refused(t, t, 4, 0, -0.1f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-p-min must be in [0, 1]");
    expect_refused(t, t, 4, 0, 1.5f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-p-min must be in [0, 1]");
    expect_refused(t, t, 16, 0, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-max 16 needs --ubatch of at least 34");
    expect_refused(t, t, 4, 0, 0.5f, 32, 8, KVT_ERR_INVALID_ARG, "--generation-checkpoint needs the SSD tier");
    g_draft_threads = 0;
    expect_refused(t, t, 4, 0, 0.5f, 32, 0, KVT_ERR_INVALID_ARG, "--draft-threads must be in [1, 512] (got 0)");
    g_draft_threads = 1;
    expect_refused(t, "/nonexistent/draft.gguf", 4, 0, 0.5f, 32, 0, KVT_ERR_IO, "--draft-model /nonexistent/draft.gguf");
    expect_refused(rec, t, 4, 0, 0.5f, 32, 0, KVT_ERR_UNSUPPORTED, "recurrent layers");
    expect_refused(t, rec, 4, 0, 0.5f, 32, 0, KVT_ERR_UNSUPPORTED, "recurrent layers");
    free(t);
    free(bytes);
    free(rec);
}

static int setup(void **st) {
    (void)st;
    g_dir = tu_tmpdir("spec");
    return g_dir ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_preserves_p), cmocka_unit_test(test_draw_edges), cmocka_unit_test(test_sampler_probs),
        cmocka_unit_test(test_greedy_llama),     cmocka_unit_test(test_greedy_qwen3), cmocka_unit_test(test_greedy_gemma3),
        cmocka_unit_test(test_processor_logprobs), cmocka_unit_test(test_sampled), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
