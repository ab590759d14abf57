/* test_sampler.c — sampling: greedy argmax (lowest id on ties), seeded reproducibility, top-k,
 * top-p, min-p restrict the candidate set, penalties over the recent window, distribution sanity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "engine/sampler.h"
#include "kernels/quant.h"

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

/* The cuts without a sort (sampler.c selects in place) keep exactly the sets a sorted list's cuts
 * keep: a reference here sorts (logit/T descending, lower id first on ties), cuts top-k, then
 * top-p's shortest prefix reaching top_p of the mass, then min-p's prefix with p >= min_p·p(best),
 * and kvt_sampler_probs must put mass on exactly those ids, in proportion to exp(l/T). Rows with
 * ties across every cut (logits on a coarse grid) and a flat row over 152k ids. */
typedef struct ref_c {
    float l;
    int32_t id;
} ref_c;
static int cmp_ref(const void *a, const void *b) {
    const ref_c *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}
static void check_cuts(const float *base, uint32_t nv, float temp, int top_k, float top_p, float min_p) {
    kvt_sampler *s = kvt_sampler_create(nv);
    assert_non_null(s);
    kvt_sampling p;
    kvt_sampling_default(&p);
    p.temperature = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
    kvt_sampler_reset(s, &p);
    float *l = malloc(sizeof(float) * nv), *probs = malloc(sizeof(float) * nv);
    ref_c *r = malloc(sizeof(ref_c) * nv);
    bool *in = calloc(nv, sizeof(bool));
    assert_true(l && probs && r && in);
    memcpy(l, base, sizeof(float) * nv);
    kvt_sampler_probs(s, l, probs);
    const float inv_t = 1.0f / temp;
    uint32_t n = 0;
    float maxl = -INFINITY;
    for (uint32_t i = 0; i < nv; i++) maxl = fmaxf(maxl, base[i] * inv_t);
    for (uint32_t i = 0; i < nv; i++)
        if (base[i] * inv_t >= maxl - 30.0f) r[n].l = base[i] * inv_t, r[n].id = (int32_t)i, n++;
    qsort(r, n, sizeof *r, cmp_ref);
    if (top_k > 0 && (uint32_t)top_k < n) n = (uint32_t)top_k;
    double sum = 0, cum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)r[i].l - maxl);
    uint32_t keep = n;
    if (top_p > 0.0f && top_p < 1.0f)
        for (uint32_t i = 0; i < n; i++)
            if ((cum += exp((double)r[i].l - maxl)) >= top_p * sum * (1 - 1e-12)) {
                keep = i + 1;
                break;
            }
    if (min_p > 0.0f) {
        uint32_t k2 = 1;
        while (k2 < keep && exp((double)r[k2].l - maxl) >= min_p * (1 - 1e-6)) k2++;
        keep = k2;
    }
    double tot = 0;
    for (uint32_t i = 0; i < keep; i++) in[r[i].id] = true, tot += exp((double)r[i].l - maxl);
    for (uint32_t i = 0; i < nv; i++) {
        if (!in[i]) {
            if (probs[i] != 0.0f) fail_msg("T %.2f k %d p %.3f min-p %.3f: id %u outside the cut has p %g", temp, top_k, top_p, min_p, i, probs[i]);
            continue;
        }
        const double want = exp((double)base[i] * inv_t - maxl) / tot;
        if (!(fabs(probs[i] - want) <= 1e-5 * want + 1e-9))
            fail_msg("T %.2f k %d p %.3f min-p %.3f: id %u p %g, want %g", temp, top_k, top_p, min_p, i, probs[i], want);
    }
    free(in), free(r), free(probs), free(l);
    kvt_sampler_free(s);
}

static void test_cuts_match_sorted(void **st) {
    float base[NV];
    for (int seed = 0; seed < 6; seed++) {
        make_logits(base, 40 + seed);
        if (seed & 1) /* a coarse grid: ties inside and at every cut */
            for (int i = 0; i < NV; i++) base[i] = roundf(base[i] * 2.0f) / 2.0f;
        check_cuts(base, NV, 1.0f, 0, 0.9f, 0.0f);
        check_cuts(base, NV, 0.7f, 40, 0.95f, 0.0f);
        check_cuts(base, NV, 1.3f, 7, 1.0f, 0.0f);
        check_cuts(base, NV, 1.0f, 0, 1.0f, 0.05f);
        check_cuts(base, NV, 0.8f, 50, 0.5f, 0.1f);
        check_cuts(base, NV, 2.0f, 0, 0.3f, 0.0f);
        check_cuts(base, NV, 1.0f, NV - 1, 0.99f, 0.0f);
    }
    for (int k = 2; k < 200; k += 3) { /* every way a selection can end */
        make_logits(base, 77);
        check_cuts(base, NV, 1.0f, k, 1.0f, 0.0f);
        check_cuts(base, NV, 1.0f, 0, (float)k / 200.0f, 0.0f);
    }
    /* all equal: the lowest ids win every cut */
    for (int i = 0; i < NV; i++) base[i] = 1.0f;
    check_cuts(base, NV, 1.0f, 10, 1.0f, 0.0f);
    check_cuts(base, NV, 1.0f, 0, 0.25f, 0.0f);
    /* 152k ids, nearly flat: top-p keeps most of them */
    const uint32_t big = 151936;
    float *b = malloc(sizeof(float) * big);
    assert_non_null(b);
    uint64_t x = 7;
    for (uint32_t i = 0; i < big; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (float)((x >> 33) % 1000) / 500.0f;
    }
    check_cuts(b, big, 1.0f, 0, 0.95f, 0.0f);
    check_cuts(b, big, 0.9f, 5000, 0.9f, 0.2f);
    /* a peaked row: top-p's mass within the best 256 (sampler.c's first try), and one just past them */
    for (uint32_t h = 0; h < 300; h++) b[(h * 7919u) % big] = 14.0f - 0.01f * (float)h;
    check_cuts(b, big, 0.7f, 0, 0.95f, 0.0f);
    check_cuts(b, big, 1.0f, 0, 0.5f, 0.0f);
    check_cuts(b, big, 1.0f, 0, 0.99f, 0.0f);
    check_cuts(b, big, 1.0f, 1000, 0.9f, 0.01f);
    free(b);
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

/* logprobs over a real vocabulary size at every vector level: the log-sum-exp on vectors (in
 * chunks, summed in double) against a double reference over 151,936 logits spread over 60 nats,
 * some masked (-inf), a length with a tail after the last whole chunk and vector; the top 20 in
 * the scan's order (equal logits: the lower id first); a NaN as the first logit does not hide the
 * finite maximum behind it (the row's log-sum-exp is NaN, as with any NaN logit). */
static void test_logprobs_vocab(void **st) {
    const uint32_t nv = 151936 + 7;
    float *l = malloc(sizeof(float) * nv);
    assert_non_null(l);
    uint64_t x = 12345;
    for (uint32_t i = 0; i < nv; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 33) % 600001) / 10000.0f - 40.0f;
        if (i % 97 == 5) l[i] = -INFINITY;
    }
    l[77777] = 31.0f, l[1234] = 31.0f, l[150000] = 30.5f; /* a tie at the top: id 1234 first */
    double m = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < nv; i++) m = fmax(m, l[i]);
    for (uint32_t i = 0; i < nv; i++) sum += exp((double)l[i] - m);
    const double lse = m + log(sum);
    const kvt_isa best = kvt_kernels_best_isa();
    for (int isa = KVT_ISA_SCALAR; isa <= (int)best && isa <= KVT_ISA_AVX512; isa++) {
        assert_true(kvt_kernels_force_isa((kvt_isa)isa));
        kvt_token_logprobs lp;
        kvt_logprobs_of(l, nv, 150000, 20, &lp);
        assert_int_equal(lp.id, 150000);
        assert_true(fabs(lp.logprob - (l[150000] - lse)) < 1e-5);
        assert_int_equal(lp.n_top, 20);
        assert_int_equal(lp.top_ids[0], 1234);
        assert_int_equal(lp.top_ids[1], 77777);
        assert_int_equal(lp.top_ids[2], 150000);
        for (uint32_t k = 0; k < lp.n_top; k++) {
            assert_true(fabs(lp.top_lps[k] - (l[lp.top_ids[k]] - lse)) < 1e-5);
            if (k) assert_true(l[lp.top_ids[k]] <= l[lp.top_ids[k - 1]]);
        }
        /* the 20th best: no logit outside the list is larger */
        const float floor = l[lp.top_ids[19]];
        uint32_t above = 0;
        for (uint32_t i = 0; i < nv; i++) above += l[i] > floor;
        assert_true(above <= 19);
        kvt_logprobs_of(l, nv, (int32_t)nv, 0, &lp); /* an id outside the vocabulary */
        assert_true(isinf(lp.logprob) && lp.logprob < 0);
        const float keep = l[0];
        l[0] = NAN;
        kvt_logprobs_of(l, nv, 1234, 3, &lp);
        assert_true(isnan(lp.logprob));
        assert_int_equal(lp.top_ids[0], 1234);
        l[0] = keep;
    }
    assert_true(kvt_kernels_force_isa(best));
    free(l);
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
        cmocka_unit_test(test_penalties),  cmocka_unit_test(test_distribution), cmocka_unit_test(test_logprobs), cmocka_unit_test(test_logprobs_vocab),
        cmocka_unit_test(test_cuts_match_sorted),
        cmocka_unit_test(test_logit_bias), cmocka_unit_test(test_presence_frequency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
