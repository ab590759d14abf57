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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),     cmocka_unit_test(test_seeded_reproducible), cmocka_unit_test(test_top_k_top_p_min_p),
        cmocka_unit_test(test_penalties),  cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
