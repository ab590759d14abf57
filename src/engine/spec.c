/*
 * spec.c — the draft side of speculative decoding (see spec.h, docs/speculative.md).
 *
 * A row's draft state:
 *
 *   hist[0..n_hist)  every token of the row so far: the prompt, then each emitted token (pushed by
 *                    the row); hist[n_hist-1] is the token the target forwards next.
 *   seq              the draft's KV: always a prefix of hist, then possibly proposals of the last
 *                    round (cut back when the round is verified).
 *   vt[0..1+k)       the round's verify tokens: hist[n_hist-1], then the k proposals.
 *   q[i]             sampled settings: the draft distribution proposal i was drawn from.
 *
 * Invariants:
 *   1. Outside a round the draft sequence is a prefix of hist: kvt_spec_propose extends it with
 *      the proposals, and cuts it back to hist at once when it drops them (shorter than
 *      draft_min); kvt_spec_row_verified cuts it back to at most n_hist - 1 tokens (those before
 *      the row's new next). The draft never keeps a token the row did not emit past its round.
 *   2. A proposal is decided by the draft state alone: whether to propose at position i (top
 *      probability >= p_min) is fixed before token i is drawn, so the target's acceptance rule
 *      (spec_verify.h) sees a token drawn from exactly q[i] and the output stays the target's
 *      distribution.
 *   3. The draft's compute context is used under s->mu only; a row's other state only by the thread
 *      driving the row.
 *   4. Only tokens the row emitted reach the draft's tiers: a row ending inside a round (between
 *      propose and verified) cuts its draft sequence back to the round's start before the put, and
 *      nothing is put while the draft file differs from the one loaded (kvt_spec_weights_ok).
 */
#include "spec.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/quant.h"
#include "../kernels/vec.h"
#include "../model/file_watch.h"
#include "../model/model.h"
#include "budget.h"
#include "scheme.h"
#include "spec_verify.h"

struct kvt_spec {
    kvt_spec_opts o;
    char *path;
    kvt_file_watch *watch; /* the draft file, held open from before it was mapped */
    kvt_gguf *gguf;
    kvt_model *model;
    kvt_tokenizer *tok;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
    kvt_ctx *ctx;
    uint32_t n_vocab;
    uint64_t root;            /* of a draft sequence without tiers */
    uint64_t cache_bytes;     /* the RAM tier's share of the pool */
    kvt_tiers *tiers;         /* the companion tiers (companion.h), borrowed; NULL: none */
    char key[KVT_SSD_COMPAT_KEY_MAX]; /* their compatibility key */
    pthread_mutex_t lookup_mu; /* one companion lookup at a time (the shared tier's connection) */
    pthread_mutex_t mu;       /* the compute context (invariant 3) */
    pthread_mutex_t stats_mu; /* st */
    kvt_spec_stats st;
};

struct kvt_spec_row {
    kvt_spec *s;
    kvt_seq *seq;
    kvt_chain *chain;     /* the prompt's chain under the companion key (tiers on), else NULL */
    uint64_t root;        /* of its sequence: the companion key and namespace, or the draft's own */
    bool cache;           /* the sequence enters the companion tiers at the prompt's end and the row's */
    uint32_t n_prompt;    /* hist[0..n_prompt) is the prompt */
    uint32_t round_base;  /* n_hist when the current round's proposal was made (invariant 4) */
    kvt_sampler *sampler; /* the draft's draws under sampled settings */
    bool greedy, off;
    int32_t *hist;
    uint32_t n_hist, cap_hist;
    int32_t *vt; /* [1 + draft_max] */
    uint32_t k;
    float *q; /* [draft_max][n_vocab], sampled settings only */
    float *p; /* [n_vocab] the target's distribution (row.c's verification) */
};

/* A token's text for an error message: control bytes and quotes escaped, cut at 48 bytes. */
static void token_desc(const kvt_tokenizer *t, int32_t id, char *buf, size_t n) {
    const char *s = kvt_tokenizer_token_text(t, id);
    size_t o = 0;
    if (!s) s = "";
    for (; *s && o + 5 < n && o < 48; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == '\'' || c == '\\' || c == 0x7f) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o < n ? o : n - 1] = 0;
}

/* The same vocabulary: every token's text and type, and as many logits per token. */
static kvt_status vocab_check(const kvt_tokenizer *target, uint32_t target_n_vocab, const kvt_tokenizer *draft,
                              uint32_t draft_n_vocab, char *err, size_t errlen) {
    const uint32_t nt = kvt_tokenizer_n_vocab(target), nd = kvt_tokenizer_n_vocab(draft);
    char a[256], b[256];
    for (uint32_t i = 0; i < nt && i < nd; i++) {
        const char *x = kvt_tokenizer_token_text(target, (int32_t)i), *y = kvt_tokenizer_token_text(draft, (int32_t)i);
        const int32_t tx = kvt_tokenizer_token_type(target, (int32_t)i), ty = kvt_tokenizer_token_type(draft, (int32_t)i);
        if (strcmp(x ? x : "", y ? y : "") == 0 && tx == ty) continue;
        token_desc(target, (int32_t)i, a, sizeof a);
        token_desc(draft, (int32_t)i, b, sizeof b);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "the draft model's vocabulary differs from the target's at token %u: target '%s' (type %d), "
                        "draft '%s' (type %d)", i, a, tx, b, ty);
    }
    if (nt != nd) {
        const bool t_longer = nt > nd;
        token_desc(t_longer ? target : draft, (int32_t)(t_longer ? nd : nt), a, sizeof a);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "the draft model's vocabulary differs from the target's at token %u: the %s has %u tokens, "
                        "the %s %u ('%s' has no counterpart)", t_longer ? nd : nt, t_longer ? "target" : "draft",
                        t_longer ? nt : nd, t_longer ? "draft" : "target", t_longer ? nd : nt, a);
    }
    if (target_n_vocab != draft_n_vocab)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "the draft model gives %u logits per token but the target %u (the vocabularies' %u tokens match)",
                        draft_n_vocab, target_n_vocab, nt);
    return KVT_OK;
}

kvt_status kvt_spec_create(const kvt_spec_opts *o, const kvt_tokenizer *target_tok, uint32_t target_n_vocab,
                           kvt_spec **out, char *err, size_t errlen) {
    *out = NULL;
    kvt_spec *s = calloc(1, sizeof *s);
    if (!s) return KVT_ERR_NOMEM;
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->lookup_mu, NULL);
    pthread_mutex_init(&s->stats_mu, NULL);
    s->path = strdup(o->model_path);
    s->o.model_path = s->path;
    char e2[400] = "";
    kvt_status st = s->path ? KVT_OK : KVT_ERR_NOMEM;
    if (st == KVT_OK) st = kvt_file_watch_open(o->model_path, &s->watch, e2, sizeof e2);
    if (st == KVT_OK) st = kvt_gguf_open(o->model_path, &s->gguf, e2, sizeof e2);
    if (st == KVT_OK) st = kvt_model_load(s->gguf, &s->model, e2, sizeof e2);
    if (st == KVT_OK) st = kvt_tokenizer_create(s->gguf, &s->tok, e2, sizeof e2);
    if (st) {
        kvt_errf(err, errlen, st, "--draft-model %s: %s", o->model_path, e2[0] ? e2 : kvt_status_str(st));
        goto fail;
    }
    const kvt_hparams *hp = kvt_model_hparams(s->model);
    s->n_vocab = hp->n_vocab;
    if ((st = vocab_check(target_tok, target_n_vocab, s->tok, s->n_vocab, e2, sizeof e2))) {
        kvt_errf(err, errlen, st, "--draft-model %s: %s", o->model_path, e2);
        goto fail;
    }
    /* the draft's KV: f16 blocks of every layer, whatever --kv-quant says for the target */
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    if (hp->n_layer > KVT_MAX_LAYERS) {
        st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "--draft-model %s: %u layers (at most %u)", o->model_path,
                      hp->n_layer, KVT_MAX_LAYERS);
        goto fail;
    }
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(s->model, codecs, d);
    st = kvt_kv_layout_create(d, hp->n_layer, o->block_tokens, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &s->layout, e2,
                              sizeof e2);
    if (st) {
        kvt_errf(err, errlen, st, "--draft-model %s: KV layout: %s", o->model_path, e2);
        goto fail;
    }
    if (kvt_kv_layout_state_bytes(s->layout) > 0) {
        st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                      "--draft-model %s: a %s draft has recurrent layers, whose state cannot be cut back to the "
                      "accepted tokens; use a draft with attention layers only", o->model_path, kvt_arch_name(hp->arch));
        goto fail;
    }
    if ((st = kvt_ctx_create(s->model, o->n_threads, o->ubatch, &s->ctx))) {
        kvt_errf(err, errlen, st, "--draft-model %s: cannot create its compute context", o->model_path);
        goto fail;
    }
    if ((st = kvt_ctx_reserve(s->ctx, s->layout, o->n_ctx))) {
        kvt_errf(err, errlen, st, "--draft-model %s: cannot reserve attention scratch for %u tokens", o->model_path,
                 o->n_ctx);
        goto fail;
    }
    s->root = kvt_root_hash("kvtier-draft", o->model_path);
    *out = s;
    return KVT_OK;
fail:
    if (err && !err[0]) kvt_errf(err, errlen, st, "--draft-model %s: %s", o->model_path, kvt_status_str(st));
    kvt_spec_free(s);
    return st;
}

void kvt_spec_free(kvt_spec *s) {
    if (!s) return;
    kvt_ctx_free(s->ctx);
    kvt_block_pool_free(s->pool);
    kvt_kv_layout_free(s->layout);
    kvt_tokenizer_free(s->tok);
    kvt_model_free(s->model);
    kvt_gguf_free(s->gguf);
    kvt_file_watch_free(s->watch);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->lookup_mu);
    pthread_mutex_destroy(&s->stats_mu);
    free(s->path);
    free(s);
}

uint32_t kvt_spec_draft_max(const kvt_spec *s) { return s->o.draft_max; }

/* ---- the draft's state in the tiers ---------------------------------------------------------- */

const kvt_kv_layout *kvt_spec_layout(const kvt_spec *s) { return s->layout; }
kvt_block_pool *kvt_spec_pool(kvt_spec *s) { return s->pool; }
uint64_t kvt_spec_cache_bytes(const kvt_spec *s) { return s->cache_bytes; }
double kvt_spec_bytes_per_token(const kvt_spec *s) { return kvt_kv_layout_bytes_per_token(s->layout); }

/* The live rows' KV: one full context (one ubatch of slack) per row. */
static uint64_t rows_bytes(const kvt_spec *s) {
    return kvt_row_kv_bytes(s->layout, s->o.n_ctx, s->o.ubatch) * (s->o.rows ? s->o.rows : 1);
}

uint64_t kvt_spec_fixed_bytes(const kvt_spec *s) {
    return kvt_gguf_file_size(s->gguf) + kvt_model_private_bytes(s->model) + kvt_ctx_bytes(s->ctx) + rows_bytes(s);
}

kvt_status kvt_spec_open_pool(kvt_spec *s, uint64_t cache_bytes) {
    if (s->pool) return KVT_ERR_INVALID_ARG;
    s->cache_bytes = cache_bytes;
    s->pool = kvt_block_pool_create(s->layout, rows_bytes(s) + cache_bytes);
    return s->pool ? KVT_OK : KVT_ERR_NOMEM;
}
const char *kvt_spec_key(const kvt_spec *s) { return s->key; }
bool kvt_spec_weights_ok(kvt_spec *s) { return kvt_file_watch_ok(s->watch); }

kvt_status kvt_spec_companion_key(kvt_spec *s, const char *target_key, const char *cache_dir, bool persist, char *out,
                                  size_t outlen, char *err, size_t errlen) {
    char num[96], dkey[KVT_SSD_COMPAT_KEY_MAX];
    snprintf(num, sizeof num, "%s%s", kvt_kernels_numerics_id(), kvt_model_numerics_tag(s->model));
    const kvt_status st = kvt_scheme_compat_key(s->path, s->watch, s->layout, kvt_tokenizer_hash(s->tok), num, cache_dir,
                                                persist, dkey, sizeof dkey, err, errlen);
    if (st) return st;
    char tdir[33]; /* the target's compat directory name */
    kvt_ssd_compat_dir(target_key, tdir);
    const int n = snprintf(out, outlen, "kvtier-companion;target=%s;draft=%s", tdir, dkey);
    if (n < 0 || (size_t)n >= outlen || (size_t)n >= KVT_SSD_COMPAT_KEY_MAX)
        return kvt_errf(err, errlen, KVT_ERR_RANGE, "--draft-model %s: its cache key is too long", s->path);
    return KVT_OK;
}

void kvt_spec_set_tiers(kvt_spec *s, kvt_tiers *t, const char *key) {
    s->tiers = t;
    snprintf(s->key, sizeof s->key, "%s", key ? key : "");
}

void kvt_spec_stats_get(kvt_spec *s, kvt_spec_stats *out) {
    pthread_mutex_lock(&s->stats_mu);
    *out = s->st;
    pthread_mutex_unlock(&s->stats_mu);
}

/* ---- a row's draft state --------------------------------------------------------------------- */

/* The draft sequence from the companion tiers' longest prefix of the prompt (a miss: NULL), counted
 * by source and against the target's reuse. */
static void row_lookup(kvt_spec_row *r, const int32_t *prompt, uint32_t n_prompt, const char *ns,
                       uint32_t target_reused) {
    kvt_spec *s = r->s;
    const uint64_t root = kvt_root_hash(s->key, ns ? ns : "");
    if (kvt_chain_create(root, prompt, n_prompt, s->o.block_tokens, &r->chain) != KVT_OK) return;
    kvt_tiers_hit hit = {0};
    pthread_mutex_lock(&s->lookup_mu);
    const kvt_status st = kvt_tiers_lookup(s->tiers, r->chain, &hit);
    pthread_mutex_unlock(&s->lookup_mu);
    if (st == KVT_OK && hit.seq) r->seq = hit.seq;
    const uint32_t got = r->seq ? hit.n_reused : 0;
    uint64_t by[4] = {0};
    for (uint32_t i = 0; i < hit.n_blocks && r->seq; i++) {
        const uint32_t a = i * s->o.block_tokens, b = KVT_MIN(got, a + s->o.block_tokens);
        if (b > a) by[kvt_tiers_block_source(&hit, i) & 3] += b - a;
    }
    pthread_mutex_lock(&s->stats_mu);
    for (int i = 1; i < 4; i++) s->st.reused[i] += by[i];
    if (target_reused > got) {
        s->st.recomputed += target_reused - got;
        s->st.recompute_rows++;
    }
    pthread_mutex_unlock(&s->stats_mu);
}

kvt_spec_row *kvt_spec_row_create(kvt_spec *s, const kvt_sampling *sp, const int32_t *prompt, uint32_t n_prompt,
                                  uint32_t max_new, bool use_cache, const char *ns, const int32_t *look, uint32_t n_look,
                                  uint32_t target_reused) {
    kvt_spec_row *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->s = s;
    r->greedy = kvt_sampling_greedy(sp);
    r->cap_hist = n_prompt + max_new;
    r->hist = malloc(sizeof(int32_t) * r->cap_hist);
    r->vt = malloc(sizeof(int32_t) * (1 + s->o.draft_max));
    r->p = malloc(sizeof(float) * s->n_vocab);
    r->cache = use_cache && s->tiers;
    if (r->cache && r->hist && r->vt && r->p) row_lookup(r, look, n_look, ns, target_reused);
    r->root = r->cache ? kvt_root_hash(s->key, ns ? ns : "") : s->root;
    if (!r->seq && r->hist && r->vt && r->p) (void)kvt_seq_create(s->pool, r->root, &r->seq);
    if (r->seq && r->chain) kvt_seq_set_chain(r->seq, r->chain);
    bool ok = r->hist && r->vt && r->p && r->seq;
    if (ok && !r->greedy) {
        r->q = malloc(sizeof(float) * s->n_vocab * s->o.draft_max);
        r->sampler = kvt_sampler_create(s->n_vocab);
        ok = r->q && r->sampler;
        if (ok) { /* the request's draw settings; no penalties or bias: q is whatever the draft proposes from */
            kvt_sampling d = *sp;
            d.repeat_penalty = 1.0f;
            d.presence_penalty = d.frequency_penalty = 0.0f;
            d.n_bias = 0;
            d.seed = sp->seed ^ 0x64726166742d7267ull; /* its own stream: the target's draws stay the target's */
            kvt_sampler_reset(r->sampler, &d);
        }
    }
    if (!ok) {
        kvt_spec_row_free(r, 0);
        return NULL;
    }
    kvt_seq_set_rollback(r->seq, s->o.draft_max);
    memcpy(r->hist, prompt, sizeof(int32_t) * n_prompt);
    r->n_hist = n_prompt;
    r->n_prompt = n_prompt;
    return r;
}

void kvt_spec_row_checkpoint(kvt_spec_row *r) {
    if (r && r->cache && !r->off && r->k == 0 && kvt_seq_len(r->seq) <= r->n_hist && kvt_spec_weights_ok(r->s))
        (void)kvt_tiers_put_blocks(r->s->tiers, r->seq);
}

void kvt_spec_row_free(kvt_spec_row *r, double decode_ms) {
    if (!r) return;
    pthread_mutex_lock(&r->s->stats_mu);
    r->s->st.decode_ms += decode_ms;
    pthread_mutex_unlock(&r->s->stats_mu);
    if (r->seq && r->cache && !r->off) {
        /* invariant 4: a round not verified leaves only the tokens before it */
        if (r->k > 0 && kvt_seq_len(r->seq) > r->round_base) (void)kvt_seq_trim(r->seq, r->round_base);
        if (kvt_seq_len(r->seq) > 0 && kvt_seq_len(r->seq) <= r->n_hist && kvt_spec_weights_ok(r->s))
            (void)kvt_tiers_put(r->s->tiers, r->seq);
    }
    if (r->seq) kvt_seq_free(r->seq);
    kvt_chain_release(r->chain);
    kvt_sampler_free(r->sampler);
    free(r->hist);
    free(r->vt);
    free(r->q);
    free(r->p);
    free(r);
}

/* This row decodes plainly from now on; counted once. */
static void turn_off(kvt_spec_row *r) {
    if (r->off) return;
    r->off = true;
    pthread_mutex_lock(&r->s->stats_mu);
    r->s->st.off_rows++;
    pthread_mutex_unlock(&r->s->stats_mu);
}

void kvt_spec_row_push(kvt_spec_row *r, int32_t id) {
    /* the row emits at most max_new tokens, the capacity's share beyond the prompt; the bound
     * keeps a caller's mistake from writing past hist (the row then stops speculating) */
    if (r->n_hist < r->cap_hist) r->hist[r->n_hist++] = id;
    else turn_off(r);
}

/* The draft's choice from logits at proposal i: the token and its top probability (under greedy
 * settings the softmax at temperature 1 of its argmax; else the largest of q[i], written here). */
static int32_t choose(kvt_spec_row *r, float *logits, uint32_t i, float *top) {
    const uint32_t nv = r->s->n_vocab;
    if (r->greedy) {
        uint32_t best = 0;
        for (uint32_t v = 1; v < nv; v++)
            if (logits[v] > logits[best]) best = v;
        /* the softmax's top probability with the vector exp (in place: the draft's logits are not
         * read again after its choice); it only decides whether to propose, never what is emitted */
        *top = 1.0f / kvt_vec_exp_sum(logits, nv, logits[best]);
        return (int32_t)best;
    }
    float *q = r->q + (size_t)i * nv;
    kvt_sampler_probs(r->sampler, logits, q);
    float m = 0;
    for (uint32_t v = 0; v < nv; v++)
        if (q[v] > m) m = q[v];
    *top = m;
    return -1; /* drawn by the caller once the top probability passed (invariant 2) */
}

/* The draft's stream for a round: splitmix64 of the seed, apart from the target's own stream. */
static uint64_t round_stream(uint64_t seed) {
    uint64_t z = seed ^ 0x64726166742d7267ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t kvt_spec_propose(kvt_spec_row *r, uint32_t k_max, uint64_t seed, const int32_t **verify) {
    kvt_spec *s = r->s;
    r->k = 0;
    if (r->off || r->n_hist == 0 || k_max < 1 || k_max < s->o.draft_min) return 0;
    if (r->sampler) kvt_sampler_set_rng_state(r->sampler, round_stream(seed));
    if (k_max > s->o.draft_max) k_max = s->o.draft_max;
    pthread_mutex_lock(&s->mu);
    const double t0 = kvt_now_ms();
    /* the draft needs the logits after hist[n_hist-1]: it forwards at least that token */
    kvt_status st = KVT_OK;
    if (kvt_seq_len(r->seq) >= r->n_hist) st = kvt_seq_trim(r->seq, r->n_hist - 1);
    uint32_t have = kvt_seq_len(r->seq);
    float *logits = NULL;
    if (st == KVT_OK && r->cache && have < r->n_prompt && r->n_hist > r->n_prompt) {
        /* the prompt's end is a put of its own, as for the target (the tiers key one tail per
         * position: the next identical prompt finds its partial last block there) */
        st = kvt_model_forward(s->ctx, r->seq, r->hist + have, r->n_prompt - have, false, NULL, &logits);
        if (st == KVT_OK && kvt_spec_weights_ok(s)) (void)kvt_tiers_put(s->tiers, r->seq);
        have = kvt_seq_len(r->seq);
    }
    if (st == KVT_OK) st = kvt_model_forward(s->ctx, r->seq, r->hist + have, r->n_hist - have, false, NULL, &logits);
    uint32_t k = 0;
    while (st == KVT_OK) {
        float top = 0;
        int32_t d = choose(r, logits, k, &top);
        if (top < s->o.p_min) break; /* decided before the draw (invariant 2) */
        if (d < 0) d = kvt_spec_draw(r->q + (size_t)k * s->n_vocab, s->n_vocab, kvt_sampler_uniform(r->sampler));
        r->vt[1 + k++] = d;
        if (k == k_max) break;
        st = kvt_model_forward(s->ctx, r->seq, &r->vt[k], 1, false, NULL, &logits);
    }
    const double dt = kvt_now_ms() - t0;
    pthread_mutex_unlock(&s->mu);
    if (st != KVT_OK) { /* the draft's pool is full: this row decodes plainly from now on */
        KVT_WARN("speculative decoding: the draft failed (%s); the row continues without it",
                 kvt_status_str(st));
        turn_off(r);
        k = 0;
    }
    if (k < s->o.draft_min) { /* dropped: the draft keeps only the row's tokens (invariant 1) */
        k = 0;
        if (!r->off && kvt_seq_len(r->seq) > r->n_hist && kvt_seq_trim(r->seq, r->n_hist) != KVT_OK) turn_off(r);
    }
    pthread_mutex_lock(&s->stats_mu);
    s->st.draft_ms += dt;
    pthread_mutex_unlock(&s->stats_mu);
    r->k = k;
    r->round_base = r->n_hist;
    r->vt[0] = r->hist[r->n_hist - 1];
    *verify = r->vt;
    return k;
}

int32_t kvt_spec_row_token(const kvt_spec_row *r, uint32_t i) { return i < r->k ? r->vt[1 + i] : -1; }
const float *kvt_spec_row_q(const kvt_spec_row *r, uint32_t i) {
    return r->greedy || i >= r->k ? NULL : r->q + (size_t)i * r->s->n_vocab;
}
float *kvt_spec_row_p(kvt_spec_row *r) { return r->p; }

void kvt_spec_row_verified(kvt_spec_row *r, uint32_t proposed, uint32_t accepted) {
    kvt_spec *s = r->s;
    const uint32_t keep = r->n_hist - 1;
    if (kvt_seq_len(r->seq) > keep && kvt_seq_trim(r->seq, keep) != KVT_OK) {
        /* invariant 1 by starting over: the next round recomputes the draft's KV from the tokens */
        kvt_seq *fresh = NULL;
        if (kvt_seq_create(s->pool, r->root, &fresh) == KVT_OK) {
            kvt_seq_set_rollback(fresh, s->o.draft_max);
            kvt_seq_free(r->seq);
            r->seq = fresh;
        } else {
            turn_off(r);
        }
    }
    r->k = 0;
    pthread_mutex_lock(&s->stats_mu);
    s->st.rounds++;
    s->st.proposed += proposed;
    s->st.accepted += accepted;
    pthread_mutex_unlock(&s->stats_mu);
}
