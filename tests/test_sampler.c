/* test_sampler.c — sampling: greedy argmax (lowest id on ties), seeded reproducibility, top-k,
 * top-p, min-p restrict the candidate set, penalties over the recent window, distribution sanity. */
#include <math.h>

#include "testutil.h"

#include "engine/sampler.h"

enum { NV = 1000 };

static void make_logits(float *l, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < NV; i++) l[i] = tu_randf(&s) * 4.0f;
}

static int32_t argmax(const float *l) {
    int32_t b = 0;
    for (int i = 1; i < NV; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void test_greedy(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    kvt_sampler_reset(s, &p);
    float l[NV];
    make_logits(l, 1);
    int32_t want = argmax(l);
    assert_int_equal(kvt_sampler_sample(s, l), want);
    /* ties go to the lowest id */
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[7] = l[500] = 3.0f;
    assert_int_equal(kvt_sampler_sample(s, l), 7);
    kvt_sampler_free(s);
}

static void test_seeded_reproducible(void **st) {
    kvt_sampler *a = kvt_sampler_create(NV), *b = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.0f;
    p.seed = 42;
    kvt_sampler_reset(a, &p);
    kvt_sampler_reset(b, &p);
    float l[NV], l2[NV];
    int same = 0, diff_seed_same = 0;
    int32_t seq_a[64];
    for (int t = 0; t < 64; t++) {
        make_logits(l, 100 + t);
        memcpy(l2, l, sizeof l);
        int32_t x = kvt_sampler_sample(a, l), y = kvt_sampler_sample(b, l2);
        seq_a[t] = x;
        same += x == y;
    }
    assert_int_equal(same, 64);
    p.seed = 43;
    kvt_sampler_reset(b, &p);
    for (int t = 0; t < 64; t++) {
        make_logits(l, 100 + t);
        diff_seed_same += kvt_sampler_sample(b, l) == seq_a[t];
    }
    assert_true(diff_seed_same < 64); /* another seed gives another sequence */
    kvt_sampler_free(a);
    kvt_sampler_free(b);
}

static void test_top_k_top_p_min_p(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.5f;
    float base[NV], l[NV];
    make_logits(base, 9);
    /* top-k = 3: every draw is one of the 3 best */
    int32_t best[3];
    memcpy(l, base, sizeof l);
    for (int k = 0; k < 3; k++) {
        best[k] = argmax(l);
        l[best[k]] = -1e30f;
    }
    p.top_k = 3;
    kvt_sampler_reset(s, &p);
    for (int t = 0; t < 200; t++) {
        memcpy(l, base, sizeof l);
        int32_t x = kvt_sampler_sample(s, l);
        assert_true(x == best[0] || x == best[1] || x == best[2]);
    }
    /* top-k = 1 is greedy */
    p.top_k = 1;
    kvt_sampler_reset(s, &p);
    memcpy(l, base, sizeof l);
    assert_int_equal(kvt_sampler_sample(s, l), best[0]);
    /* one dominant token: top-p 0.5 and min-p 0.5 both keep only it */
    p.top_k = 0;
    for (int i = 0; i < NV; i++) base[i] = 0.0f;
    base[123] = 20.0f;
    p.top_p = 0.5f;
    kvt_sampler_reset(s, &p);
    for (int t = 0; t < 50; t++) {
        memcpy(l, base, sizeof l);
        assert_int_equal(kvt_sampler_sample(s, l), 123);
    }
    p.top_p = 1.0f;
    base[123] = 2.0f; /* now p(123) ~ e^2 / (e^2 + 999): others are drawn without min-p */
    kvt_sampler_reset(s, &p);
    int other = 0;
    for (int t = 0; t < 100; t++) {
        memcpy(l, base, sizeof l);
        other += kvt_sampler_sample(s, l) != 123;
    }
    assert_true(other > 50);
    p.min_p = 0.5f; /* every other token has p < 0.5 * p(123) */
    kvt_sampler_reset(s, &p);
    for (int t = 0; t < 100; t++) {
        memcpy(l, base, sizeof l);
        assert_int_equal(kvt_sampler_sample(s, l), 123);
    }
    kvt_sampler_free(s);
}

static void test_penalties(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.9f;
    /* repeat penalty: a token seen recently is divided down below the runner-up */
    p.repeat_penalty = 1.5f;
    kvt_sampler_reset(s, &p);
    kvt_sampler_accept(s, 10);
    assert_int_equal(kvt_sampler_sample(s, l), 11);
    /* presence/frequency penalties */
    kvt_sampling_default(&p);
    p.frequency_penalty = 0.06f;
    kvt_sampler_reset(s, &p);
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.9f;
    kvt_sampler_accept(s, 10);
    assert_int_equal(kvt_sampler_sample(s, l), 10); /* 2.0 - 0.06 > 1.9 */
    kvt_sampler_reset(s, &p);
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.9f;
    kvt_sampler_accept(s, 10);
    kvt_sampler_accept(s, 10);
    assert_int_equal(kvt_sampler_sample(s, l), 11); /* 2.0 - 0.12 < 1.9 */
    /* the window: a token older than penalty_last_n is not penalised */
    kvt_sampling_default(&p);
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 4;
    kvt_sampler_reset(s, &p);
    kvt_sampler_accept(s, 10);
    for (int i = 0; i < 4; i++) kvt_sampler_accept(s, 500 + i);
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.9f;
    assert_int_equal(kvt_sampler_sample(s, l), 10);
    kvt_sampler_free(s);
}

static void test_distribution(void **st) {
    /* two tokens with logits differing by ln(3): at temperature 1 about 75% / 25% */
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.0f;
    p.seed = 5;
    kvt_sampler_reset(s, &p);
    float base[NV], l[NV];
    for (int i = 0; i < NV; i++) base[i] = -100.0f;
    base[1] = logf(3.0f);
    base[2] = 0.0f;
    int c1 = 0;
    for (int t = 0; t < 4000; t++) {
        memcpy(l, base, sizeof l);
        c1 += kvt_sampler_sample(s, l) == 1;
    }
    assert_true(c1 > 2800 && c1 < 3200);
    kvt_sampler_free(s);
}


/* logprobs: log-softmax of the logits drawn from (after penalties and bias), the drawn token's
 * value and the best n_top in descending order; they sum (as probabilities) to at most 1. */
static void test_logprobs(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    kvt_sampler_reset(s, &p);
    float l[NV], ref[NV];
    make_logits(l, 9);
    memcpy(ref, l, sizeof l);
    kvt_token_logprobs lp;
    int32_t id = kvt_sampler_sample_lp(s, l, 5, &lp);
    assert_int_equal(id, argmax(ref));
    double m = ref[0];
    for (int i = 1; i < NV; i++) m = fmax(m, ref[i]);
    double sum = 0;
    for (int i = 0; i < NV; i++) sum += exp(ref[i] - m);
    double lse = m + log(sum);
    assert_int_equal(lp.id, id);
    assert_true(fabs(lp.logprob - (ref[id] - lse)) < 1e-5);
    assert_int_equal(lp.n_top, 5);
    assert_int_equal(lp.top_ids[0], id);
    double psum = 0;
    for (uint32_t k = 0; k < lp.n_top; k++) {
        assert_true(fabs(lp.top_lps[k] - (ref[lp.top_ids[k]] - lse)) < 1e-5);
        if (k) assert_true(lp.top_lps[k] <= lp.top_lps[k - 1]);
        psum += exp(lp.top_lps[k]);
    }
    assert_true(psum <= 1.0 + 1e-6);
    /* more than KVT_MAX_TOP_LOGPROBS asked: capped */
    make_logits(l, 9);
    kvt_sampler_sample_lp(s, l, 1000, &lp);
    assert_int_equal(lp.n_top, KVT_MAX_TOP_LOGPROBS);
    /* masked (-inf) tokens never appear among the top ones; a uniform row gives -log(n) */
    for (int i = 0; i < NV; i++) l[i] = i < 4 ? 0.0f : -INFINITY;
    id = kvt_sampler_sample_lp(s, l, 10, &lp);
    assert_true(id < 4);
    assert_int_equal(lp.n_top, 4);
    assert_true(fabs(lp.logprob - (float)-log(4.0)) < 1e-6);
    kvt_sampler_free(s);
}

/* logit_bias shifts the named ids after the penalties: +100 forces a token, -100 bans one; the
 * logprobs describe the biased distribution; out-of-range ids are ignored. */
static void test_logit_bias(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = 1.0f;
    p.seed = 3;
    int32_t ids[3] = {17, -5, NV + 3};
    float vals[3] = {100.0f, 100.0f, 100.0f};
    p.bias_ids = ids;
    p.bias_vals = vals;
    p.n_bias = 3;
    kvt_sampler_reset(s, &p);
    float l[NV];
    for (int t = 0; t < 50; t++) {
        make_logits(l, 300 + t);
        kvt_token_logprobs lp;
        assert_int_equal(kvt_sampler_sample_lp(s, l, 1, &lp), 17);
        assert_true(lp.logprob > -1e-3f);
    }
    /* a ban: the greedy choice moves to the second best */
    make_logits(l, 5);
    int32_t best = argmax(l);
    float l2[NV];
    memcpy(l2, l, sizeof l);
    l2[best] = -1e30f;
    int32_t second = argmax(l2);
    kvt_sampling_default(&p);
    int32_t ban = best;
    float minus = -100.0f;
    p.bias_ids = &ban;
    p.bias_vals = &minus;
    p.n_bias = 1;
    kvt_sampler_reset(s, &p);
    assert_int_equal(kvt_sampler_sample(s, l), second);
    kvt_sampler_free(s);
}

/* presence / frequency penalties as OpenAI defines them: logit - count * frequency - presence for
 * every token in the window (seen once: both; seen twice: frequency twice). */
static void test_presence_frequency(void **st) {
    kvt_sampler *s = kvt_sampler_create(NV);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    kvt_sampler_reset(s, &p);
    kvt_sampler_accept(s, 3);
    kvt_sampler_accept(s, 3);
    kvt_sampler_accept(s, 9);
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[3] = 2.0f;
    l[9] = 2.0f;
    kvt_token_logprobs lp;
    kvt_sampler_sample_lp(s, l, 0, &lp);
    assert_true(fabsf(l[3] - (2.0f - 2 * 0.25f - 0.5f)) < 1e-6f);
    assert_true(fabsf(l[9] - (2.0f - 0.25f - 0.5f)) < 1e-6f);
    assert_true(fabsf(l[4]) < 1e-6f);
    assert_int_equal(lp.id, 9); /* 1.25 beats 1.0 */
    kvt_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),     cmocka_unit_test(test_seeded_reproducible), cmocka_unit_test(test_top_k_top_p_min_p),
        cmocka_unit_test(test_penalties),  cmocka_unit_test(test_distribution), cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_logit_bias), cmocka_unit_test(test_presence_frequency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
