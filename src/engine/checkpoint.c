/* checkpoint.c — see checkpoint.h. */
#include "checkpoint.h"

#include <openssl/evp.h>
#include <stdlib.h>

static void md_u32(EVP_MD_CTX *m, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    EVP_DigestUpdate(m, b, 4);
}
static void md_u64(EVP_MD_CTX *m, uint64_t v) {
    md_u32(m, (uint32_t)v);
    md_u32(m, (uint32_t)(v >> 32));
}
static void md_f32(EVP_MD_CTX *m, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    md_u32(m, u);
}
static void md_str(EVP_MD_CTX *m, const char *s) { /* length-prefixed: no two lists collide */
    size_t n = s ? strlen(s) : 0;
    md_u64(m, n);
    if (n) EVP_DigestUpdate(m, s, n);
}

void kvt_ckpt_request_key(const char *compat, const kvt_gen_request *req, uint32_t max_new, uint8_t out[32]) {
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    unsigned int len = 0;
    if (!m || EVP_DigestInit_ex(m, EVP_sha256(), NULL) != 1) {
        memset(out, 0, 32); /* cannot hash: a key no record is ever saved under (begin turns off) */
        EVP_MD_CTX_free(m);
        return;
    }
    md_str(m, "kvtier-ckpt-key-1");
    md_str(m, compat);
    md_str(m, req->ns ? req->ns : "");
    const kvt_sampling *s = &req->sampling;
    md_f32(m, s->temperature);
    md_u32(m, (uint32_t)s->top_k);
    md_f32(m, s->top_p);
    md_f32(m, s->min_p);
    md_f32(m, s->repeat_penalty);
    md_f32(m, s->presence_penalty);
    md_f32(m, s->frequency_penalty);
    md_u32(m, (uint32_t)s->penalty_last_n);
    md_u64(m, s->seed);
    md_u32(m, max_new);
    md_u32(m, req->ignore_eog ? 1u : 0u);
    md_u32(m, req->n_stop);
    for (uint32_t i = 0; i < req->n_stop; i++) md_str(m, req->stop[i]);
    md_u32(m, req->n_prompt);
    for (uint32_t i = 0; i < req->n_prompt; i++) md_u32(m, (uint32_t)req->prompt[i]);
    if (EVP_DigestFinal_ex(m, out, &len) != 1 || len != 32) memset(out, 0, 32);
    EVP_MD_CTX_free(m);
}

static bool key_zero(const uint8_t k[32]) {
    for (int i = 0; i < 32; i++)
        if (k[i]) return false;
    return true;
}

void kvt_ckpt_begin(kvt_ckpt_run *r, kvt_tiers *tiers, uint32_t every, const char *compat, const kvt_gen_request *req,
                    uint32_t max_new, uint32_t n_vocab) {
    memset(r, 0, sizeof *r);
    if (!kvt_tiers_checkpoints(tiers) || !every || req->no_cache) return;
    kvt_ckpt_request_key(compat, req, max_new, r->key);
    if (key_zero(r->key)) return;
    r->on = true;
    r->every = every;
    if (!kvt_tiers_checkpoint_get(tiers, r->key, req->n_prompt, n_vocab, max_new, &r->rec)) return;
    /* the pending token too: the lookup's n-1 cap then allows prompt ++ emitted (where a recurrent
     * checkpoint's snapshot is), and the prefill computes pending's KV and the next logits */
    r->n_look = req->n_prompt + r->rec.n_emitted + 1;
    r->look = malloc(sizeof(int32_t) * r->n_look);
    if (!r->look) { /* resume is an optimisation: start normally */
        free(r->rec.emitted);
        memset(&r->rec, 0, sizeof r->rec);
        r->n_look = 0;
        return;
    }
    memcpy(r->look, req->prompt, sizeof(int32_t) * req->n_prompt);
    memcpy(r->look + req->n_prompt, r->rec.emitted, sizeof(int32_t) * r->rec.n_emitted);
    r->look[r->n_look - 1] = r->rec.pending;
    r->resumed = true;
    kvt_tiers_checkpoint_note(tiers, KVT_TIERS_CKPT_RESUMED, 0);
    KVT_INFO("checkpoint: resuming a generation at %u emitted tokens", r->rec.n_emitted);
}

kvt_ckpt_src kvt_ckpt_next(kvt_ckpt_run *r, int32_t *id) {
    if (!r->resumed || r->replay_i > r->rec.n_emitted) return KVT_CKPT_SAMPLE;
    *id = r->replay_i < r->rec.n_emitted ? r->rec.emitted[r->replay_i] : r->rec.pending;
    r->replay_i++;
    return KVT_CKPT_REPLAYED;
}

void kvt_ckpt_note_reused(const kvt_ckpt_run *r, kvt_tiers *tiers, uint32_t reused) {
    if (r->resumed) kvt_tiers_checkpoint_note(tiers, KVT_TIERS_CKPT_RESUME_REUSED, reused);
}

/* C2: the record failed or was dropped at n_gen: retry `backoff` tokens later. */
static void mark_dirty(kvt_ckpt_run *r, uint32_t n_gen) {
    r->dirty = true;
    r->backoff = r->backoff ? KVT_MIN(r->backoff * 2, r->every) : 1;
    r->retry_at = n_gen + r->backoff;
}

bool kvt_ckpt_due(kvt_ckpt_run *r, kvt_ckpt_src src, uint32_t n_gen) {
    if (!r->on || src != KVT_CKPT_SAMPLE || n_gen == 0) return false;
    if (r->watch) { /* C3: one atomic load */
        const kvt_ckpt_outcome o = kvt_ckpt_watch_state(r->watch);
        if (o != KVT_CKPT_QUEUED) {
            kvt_ckpt_watch_release(r->watch);
            r->watch = NULL;
            if (o == KVT_CKPT_FAILED) {
                mark_dirty(r, n_gen);
            } else { /* published, or replaced by a newer record of the key */
                r->dirty = false;
                r->backoff = 0;
            }
        }
    }
    if (n_gen % r->every == 0) return true;
    return r->dirty && !r->watch && n_gen >= r->retry_at; /* C1 */
}

void kvt_ckpt_save(kvt_ckpt_run *r, kvt_tiers *tiers, kvt_seq *seq, uint32_t n_prompt, const int32_t *gen, uint32_t n_gen,
                   int32_t pending, uint64_t rng, bool regular) {
    if (!r->on) return;
    if (!regular) kvt_tiers_checkpoint_note(tiers, KVT_TIERS_CKPT_RETRY, 0); /* off the regular points (C2) */
    kvt_ckpt_rec rec = {.n_prompt = n_prompt, .n_emitted = n_gen, .pending = pending, .rng = rng, .emitted = (int32_t *)gen};
    memcpy(rec.key, r->key, 32);
    kvt_ckpt_watch_release(r->watch); /* a regular point while one is in flight: follow the newest */
    r->watch = NULL;
    /* the prefix's blocks (and recurrent state) and the record: the tier manager persists them */
    if (kvt_tiers_checkpoint_put(tiers, seq, &rec, &r->watch)) r->saved = true;
    else mark_dirty(r, n_gen); /* dropped (C2) */
}

void kvt_ckpt_end(kvt_ckpt_run *r, kvt_tiers *tiers, bool completed) {
    if (r->on && completed && (r->saved || r->resumed)) kvt_tiers_checkpoint_drop(tiers, r->key);
}
void kvt_ckpt_run_free(kvt_ckpt_run *r) {
    kvt_ckpt_watch_release(r->watch); /* C4 */
    free(r->look);
    free(r->rec.emitted);
    memset(r, 0, sizeof *r);
}
