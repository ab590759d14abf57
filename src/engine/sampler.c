/* sampler.c — see sampler.h.
 *
 * Order of operations (as llama.cpp's common sampler chain): penalties -> logit bias -> (greedy: argmax) ->
 * top-k -> temperature softmax -> top-p -> min-p -> draw. Candidates whose logit is more than
 * KVT_CAND_RANGE below the maximum (after temperature) are dropped first: their probability is
 * below e^-30 relative to the best token, so they can never be drawn in practice. Nothing sorts the
 * candidates: top-k and top-p are selections in place that keep the sets a sorted list's cuts keep
 * (top-k: a heap of the k best when k is a few of many, else a quickselect; top-p: the best 256 by
 * a heap, else logit buckets and a quickselect on mass inside one; min-p: a filter; see
 * `candidates`), and the draw walks the kept ones in the order the selections leave them (the same
 * distribution; a seed gives the same draws for the same logits). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/vec.h"

#define KVT_CAND_RANGE 30.0f

typedef struct cand {
    float logit;
    float p;
    int32_t id;
} cand;

struct kvt_sampler {
    uint32_t n_vocab;
    kvt_sampling p;
    uint64_t rng;
    int32_t *hist; /* ring of the last penalty_last_n tokens */
    uint32_t hist_cap, hist_n, hist_pos;
    uint32_t *counts; /* per-id count within the window (maintained lazily per sample) */
    cand *c;
    float *w; /* the candidates' logits/T, then their weights, beside c (candidates) */
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

kvt_sampler *kvt_sampler_create(uint32_t n_vocab) {
    kvt_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->c = malloc(sizeof(cand) * n_vocab);
    s->w = malloc(sizeof(float) * n_vocab);
    s->counts = calloc(n_vocab, sizeof(uint32_t));
    s->hist_cap = 4096;
    s->hist = malloc(sizeof(int32_t) * s->hist_cap);
    if (!s->c || !s->w || !s->counts || !s->hist) {
        kvt_sampler_free(s);
        return NULL;
    }
    kvt_sampling d;
    kvt_sampling_default(&d);
    kvt_sampler_reset(s, &d);
    return s;
}

void kvt_sampler_free(kvt_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->w);
    free(s->counts);
    free(s->hist);
    free(s);
}

void kvt_sampler_reset(kvt_sampler *s, const kvt_sampling *p) {
    s->p = *p;
    if (s->p.penalty_last_n < 0) s->p.penalty_last_n = 0;
    if ((uint32_t)s->p.penalty_last_n > s->hist_cap) s->p.penalty_last_n = (int32_t)s->hist_cap;
    s->rng = p->seed ^ 0x5eed5eed5eed5eedull;
    s->hist_n = 0;
    s->hist_pos = 0;
}

void kvt_sampler_accept(kvt_sampler *s, int32_t id) {
    if (id < 0 || (uint32_t)id >= s->n_vocab) return;
    s->hist[s->hist_pos] = id;
    s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
    if (s->hist_n < s->hist_cap) s->hist_n++;
}

static bool penalties_active(const kvt_sampling *p) {
    return p->penalty_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

static void apply_penalties(kvt_sampler *s, float *logits) {
    uint32_t n = KVT_MIN(s->hist_n, (uint32_t)s->p.penalty_last_n);
    /* count occurrences within the window */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = (s->hist_pos + s->hist_cap - 1 - i) % s->hist_cap;
        s->counts[s->hist[idx]]++;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = (s->hist_pos + s->hist_cap - 1 - i) % s->hist_cap;
        int32_t id = s->hist[idx];
        uint32_t cnt = s->counts[id];
        if (cnt == 0) continue; /* already applied for this id */
        float l = logits[id];
        if (s->p.repeat_penalty != 1.0f && s->p.repeat_penalty > 0.0f)
            l = l > 0 ? l / s->p.repeat_penalty : l * s->p.repeat_penalty;
        l -= (float)cnt * s->p.frequency_penalty + s->p.presence_penalty;
        logits[id] = l;
        s->counts[id] = 0;
    }
}

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* The largest non-NaN logit (-inf when there is none): the vector argmax from the first non-NaN
 * entry on (its contract: NaN is never chosen unless it is the first element). */
static float max_logit(const float *logits, uint32_t nv) {
    uint32_t i0 = 0;
    while (i0 < nv && logits[i0] != logits[i0]) i0++;
    return i0 < nv ? logits[i0 + kvt_vec_argmax(logits + i0, nv - i0)] : -INFINITY;
}

/* log Σ exp(logits[i] − m): kvt_vec_exp_sum over chunks copied to a stack buffer (the logits stay
 * as they are), the chunk sums added in double. A NaN logit makes it NaN. */
#define LSE_CHUNK 2048
static double log_sum_exp_shifted(const float *logits, uint32_t nv, float m) {
    float buf[LSE_CHUNK];
    double sum = 0;
    for (uint32_t i = 0; i < nv; i += LSE_CHUNK) {
        const uint32_t n = nv - i < LSE_CHUNK ? nv - i : LSE_CHUNK;
        memcpy(buf, logits + i, sizeof(float) * n);
        sum += kvt_vec_exp_sum(buf, n, m);
    }
    return log(sum);
}

void kvt_logprobs_of(const float *logits, uint32_t nv, int32_t id, uint32_t n_top, kvt_token_logprobs *lp) {
    if (n_top > KVT_MAX_TOP_LOGPROBS) n_top = KVT_MAX_TOP_LOGPROBS;
    const float maxl = max_logit(logits, nv);
    const double lse = isfinite(maxl) ? maxl + log_sum_exp_shifted(logits, nv, maxl) : 0.0;
    lp->id = id;
    lp->logprob = (id >= 0 && (uint32_t)id < nv) ? (float)(logits[id] - lse) : -INFINITY;
    /* top n_top by insertion into a sorted list (n_top <= 20: one pass over the vocabulary; floor
     * is the smallest kept logit once the list is full) */
    uint32_t k = 0;
    float floor = -INFINITY;
    for (uint32_t i = 0; i < nv && n_top; i++) {
        const float l = logits[i];
        if (!(l > floor)) continue;
        uint32_t at = k < n_top ? k++ : n_top - 1;
        while (at > 0 && l > logits[lp->top_ids[at - 1]]) {
            lp->top_ids[at] = lp->top_ids[at - 1];
            at--;
        }
        lp->top_ids[at] = (int32_t)i;
        if (k == n_top) floor = logits[lp->top_ids[k - 1]];
    }
    lp->n_top = k;
    for (uint32_t j = 0; j < k; j++) lp->top_lps[j] = (float)(logits[lp->top_ids[j]] - lse);
}

static void apply_bias(const kvt_sampling *p, uint32_t nv, float *logits) {
    for (uint32_t i = 0; i < p->n_bias; i++) {
        int32_t id = p->bias_ids[i];
        if (id >= 0 && (uint32_t)id < nv) logits[id] += p->bias_vals[i];
    }
}

int32_t kvt_sampler_sample(kvt_sampler *s, float *logits) { return kvt_sampler_sample_lp(s, logits, 0, NULL); }

static int32_t sample_processed(kvt_sampler *s, float *logits);

int32_t kvt_sampler_sample_lp(kvt_sampler *s, float *logits, uint32_t n_top, kvt_token_logprobs *lp) {
    if (penalties_active(&s->p)) apply_penalties(s, logits);
    if (s->p.n_bias && s->p.bias_ids && s->p.bias_vals) apply_bias(&s->p, s->n_vocab, logits);
    int32_t id = sample_processed(s, logits);
    if (lp) kvt_logprobs_of(logits, s->n_vocab, id, n_top, lp);
    return id;
}

bool kvt_sampling_greedy(const kvt_sampling *p) { return !(p->temperature > 0.0f) || p->top_k == 1; }

/* lowest id wins ties, NaN never wins (kernels/vec.h: vector max, then the first equal) */
static uint32_t argmax(const float *logits, uint32_t nv) { return kvt_vec_argmax(logits, nv); }

static void swap_cand(cand *c, uint32_t i, uint32_t j) {
    const cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Partitions c[lo..hi) (hi - lo >= 1) around a median-of-three pivot in cmp_cand order (a total
 * order): returns st with the candidates ranked before the pivot in [lo, st), the pivot at st, the
 * rest after it. *mass (when not NULL) gets Σ p over [lo, st). */
static uint32_t partition(cand *c, uint32_t lo, uint32_t hi, double *mass) {
    const uint32_t a = lo, b = lo + (hi - lo) / 2, z = hi - 1;
    if (cmp_cand(&c[b], &c[a]) < 0) swap_cand(c, a, b);
    if (cmp_cand(&c[z], &c[b]) < 0) {
        swap_cand(c, b, z);
        if (cmp_cand(&c[b], &c[a]) < 0) swap_cand(c, a, b);
    }
    swap_cand(c, b, z); /* the median is the pivot, at z */
    uint32_t st = lo;
    double m = 0;
    for (uint32_t i = lo; i < z; i++)
        if (cmp_cand(&c[i], &c[z]) < 0) {
            if (mass) m += c[i].p;
            swap_cand(c, i, st++);
        }
    swap_cand(c, st, z);
    if (mass) *mass = m;
    return st;
}

/* Rounds of partitioning a selection over n candidates takes before it sorts what is left instead
 * (inputs built against the pivot rule): the time stays O(n log n). */
static uint32_t select_rounds(uint32_t n) {
    uint32_t lim = 2;
    for (uint32_t m = n; m > 1; m >>= 1) lim += 2;
    return lim;
}

/* c[0..k) as a heap with the worst of them (cmp_cand) at c[0]: sift c[i] down. */
static void heap_down(cand *c, uint32_t k, uint32_t i) {
    for (;;) {
        uint32_t w = i;
        const uint32_t a = 2 * i + 1, b = a + 1;
        if (a < k && cmp_cand(&c[a], &c[w]) > 0) w = a;
        if (b < k && cmp_cand(&c[b], &c[w]) > 0) w = b;
        if (w == i) return;
        swap_cand(c, i, w);
        i = w;
    }
}

/* A few best of many (k·8 <= n): a heap of the k best so far, each later candidate compared with
 * its worst (a branch that is almost always "not better", unlike a partition's). */
static void select_best_heap(cand *c, uint32_t n, uint32_t k) {
    for (uint32_t i = k / 2; i-- > 0;) heap_down(c, k, i);
    for (uint32_t i = k; i < n; i++)
        if (cmp_cand(&c[i], &c[0]) < 0) { /* a swap, not a copy: c stays a permutation */
            swap_cand(c, 0, i);
            heap_down(c, k, 0);
        }
}

/* Moves the k best of c[0..n) (1 <= k < n) to c[0..k), in no particular order (a heap for a few of
 * many, else quickselect). */
static void select_best(cand *c, uint32_t n, uint32_t k) {
    if ((uint64_t)k * 8 <= n) {
        select_best_heap(c, n, k);
        return;
    }
    uint32_t lo = 0, hi = n, rounds = 0;
    const uint32_t lim = select_rounds(n);
    while (hi - lo > 1) {
        if (++rounds > lim) {
            qsort(c + lo, hi - lo, sizeof(cand), cmp_cand);
            return;
        }
        const uint32_t st = partition(c, lo, hi, NULL);
        if (st == k || st + 1 == k) return;
        if (st > k) hi = st;
        else lo = st + 1;
    }
}

/* The quickselect on mass: moves to c[0..keep) the shortest run of best candidates of c[0..n) (cmp_cand
 * order) whose weights add up to at least want, in no particular order; keep is n when all of them
 * fall short. O(n) expected. */
static uint32_t select_mass_qs(cand *c, uint32_t n, double want) {
    uint32_t lo = 0, hi = n, rounds = 0;
    const uint32_t lim = select_rounds(n);
    double acc = 0; /* the weight of c[0..lo), all kept */
    while (lo < hi) {
        if (++rounds > lim) {
            qsort(c + lo, hi - lo, sizeof(cand), cmp_cand);
            for (uint32_t i = lo; i < hi; i++)
                if ((acc += c[i].p) >= want) return i + 1;
            return hi;
        }
        double m;
        const uint32_t st = partition(c, lo, hi, &m);
        if (acc + m >= want) hi = st; /* reached before the pivot */
        else if (acc + m + c[st].p >= want) return st + 1;
        else acc += m + c[st].p, lo = st + 1;
    }
    return lo ? lo : 1; /* the sums of a range's parts fell short of the range's sum by rounding */
}

/* Top-p's cut without sorting: select_mass_qs's result for the candidates of c[0..n), all within
 * KVT_CAND_RANGE of maxl. Many candidates first try the best TOP_P_FEW (a heap, then a sort of
 * them: most rows reach top-p's mass within them), then TOP_P_BUCKETS buckets of equal logit width
 * (maxl − logit)·TOP_P_BUCKETS/KVT_CAND_RANGE: a bucket's index never decreases along cmp_cand
 * order, so the buckets before the one where the mass reaches want are kept whole, and only that one
 * is selected in; two predictable passes, where a quickselect over a nearly flat row partitions most
 * of it several times. */
#define TOP_P_FEW 256
#define TOP_P_BUCKETS 1024
static uint32_t bucket_of(float l, float maxl) {
    const float x = (maxl - l) * ((float)TOP_P_BUCKETS / KVT_CAND_RANGE);
    return x < (float)(TOP_P_BUCKETS - 1) ? (uint32_t)x : TOP_P_BUCKETS - 1;
}
static uint32_t select_mass(cand *c, uint32_t n, double want, float maxl) {
    if ((uint64_t)TOP_P_FEW * 8 > n) return select_mass_qs(c, n, want);
    select_best_heap(c, n, TOP_P_FEW);
    qsort(c, TOP_P_FEW, sizeof(cand), cmp_cand);
    double acc = 0;
    for (uint32_t i = 0; i < TOP_P_FEW; i++)
        if ((acc += c[i].p) >= want) return i + 1;
    double mass[TOP_P_BUCKETS] = {0};
    for (uint32_t i = 0; i < n; i++) mass[bucket_of(c[i].logit, maxl)] += c[i].p;
    uint32_t bk = 0;
    for (acc = 0; bk < TOP_P_BUCKETS && acc + mass[bk] < want; bk++) acc += mass[bk];
    if (bk == TOP_P_BUCKETS) return n; /* short of want by rounding: all */
    /* buckets before bk to c[0..k1), then bucket bk to c[k1..k2): branchless (every candidate swaps
     * with c[k], k moves on when it belongs there; c[k..i) never does), as the outcome is about as
     * random as the row's order */
    uint32_t k1 = 0;
    for (uint32_t i = 0; i < n; i++) {
        const cand t = c[i];
        const uint32_t in = bucket_of(t.logit, maxl) < bk;
        c[i] = c[k1];
        c[k1] = t;
        k1 += in;
    }
    uint32_t k2 = k1;
    for (uint32_t i = k1; i < n; i++) {
        const cand t = c[i];
        const uint32_t in = bucket_of(t.logit, maxl) == bk;
        c[i] = c[k2];
        c[k2] = t;
        k2 += in;
    }
    return k1 + select_mass_qs(c + k1, k2 - k1, want - acc);
}

/* Σ c[i].p in four double accumulators (candidate i into i mod 4, added in a fixed order): no
 * serial chain of adds over a vocabulary of candidates (candidates() sums all of them the same way). */
static double sum_weights(const cand *c, uint32_t n) {
    double acc[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < n; i++) acc[i & 3] += c[i].p;
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#define WEIGHT_CHUNK 2048 /* candidates a kvt_vec_exp_sum call weighs */

/* The candidates a non-greedy draw keeps (best: the argmax): s->c[0..n), in no particular order, with
 * their weights exp(logit/T − max) (kvt_vec_exp) after top-k, temperature softmax, top-p and min-p (never
 * normalised: the cuts and the draw compare sums of the same weights); *tot gets their sum. The
 * cuts keep the same sets as cutting a sorted list (the best is always kept, with weight 1); nothing
 * sorts the vocabulary (a draw at a 152k vocabulary with a flat distribution spent 15-22 ms in
 * qsort). */
static uint32_t candidates(kvt_sampler *s, const float *logits, uint32_t best, double *tot) {
    const uint32_t nv = s->n_vocab;
    const float inv_t = 1.0f / s->p.temperature;
    const float maxl = logits[best] * inv_t;
    const float floor_l = maxl - KVT_CAND_RANGE;
    uint32_t n = 0;
    for (uint32_t i = 0; i < nv; i++) { /* branchless: whether a token is that close is often a coin flip */
        const float l = logits[i] * inv_t;
        s->c[n].logit = s->w[n] = l;
        s->c[n].id = (int32_t)i;
        n += l >= floor_l;
    }
    if (s->p.top_k > 0 && (uint32_t)s->p.top_k < n) {
        select_best(s->c, n, (uint32_t)s->p.top_k);
        n = (uint32_t)s->p.top_k;
        for (uint32_t i = 0; i < n; i++) s->w[i] = s->c[i].logit;
    }
    /* the weights on vectors (kvt_vec_exp_sum in chunks); their sum as sum_weights adds them, in
     * double: a float sum's error (~1e-7) could leave the draw's walk short of r = U·tot */
    for (uint32_t i = 0; i < n; i += WEIGHT_CHUNK)
        (void)kvt_vec_exp_sum(s->w + i, n - i < WEIGHT_CHUNK ? n - i : WEIGHT_CHUNK, maxl);
    double acc[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        s->c[i].p = s->w[i];
        acc[i & 3] += s->w[i];
    }
    const double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    const uint32_t n_all = n;
    if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) n = select_mass(s->c, n, (double)s->p.top_p * sum, maxl);
    if (s->p.min_p > 0.0f) { /* relative to the best's weight, exp(0) = 1: a set, not a position */
        const float thr = s->p.min_p < 1.0f ? s->p.min_p : 1.0f;
        uint32_t keep = 0;
        for (uint32_t i = 0; i < n; i++)
            if (s->c[i].p >= thr) swap_cand(s->c, i, keep++);
        n = keep;
    }
    *tot = n == n_all ? sum : sum_weights(s->c, n);
    return n;
}

/* The draw from logits whose penalties and bias are applied. */
static int32_t sample_processed(kvt_sampler *s, float *logits) {
    const uint32_t best = argmax(logits, s->n_vocab);
    if (kvt_sampling_greedy(&s->p)) return (int32_t)best;
    double tot = 0;
    const uint32_t n = candidates(s, logits, best, &tot);
    double r = kvt_sampler_uniform(s) * tot;
    double acc = 0;
    for (uint32_t i = 0; i < n; i++) {
        acc += s->c[i].p;
        if (r < acc) return s->c[i].id;
    }
    return s->c[n - 1].id;
}

void kvt_sampler_probs(kvt_sampler *s, float *logits, float *probs) {
    if (penalties_active(&s->p)) apply_penalties(s, logits);
    if (s->p.n_bias && s->p.bias_ids && s->p.bias_vals) apply_bias(&s->p, s->n_vocab, logits);
    memset(probs, 0, sizeof(float) * s->n_vocab);
    const uint32_t best = argmax(logits, s->n_vocab);
    if (kvt_sampling_greedy(&s->p)) {
        probs[best] = 1.0f;
        return;
    }
    double tot = 0;
    const uint32_t n = candidates(s, logits, best, &tot);
    for (uint32_t i = 0; i < n; i++) probs[s->c[i].id] = (float)(s->c[i].p / tot);
}

double kvt_sampler_uniform(kvt_sampler *s) { return (double)(rng_next(&s->rng) >> 11) / 9007199254740992.0; }

uint64_t kvt_sampler_rng_state(const kvt_sampler *s) { return s->rng; }
void kvt_sampler_set_rng_state(kvt_sampler *s, uint64_t state) { s->rng = state; }
