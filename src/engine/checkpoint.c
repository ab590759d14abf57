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

void kvt_ckpt_begin(kvt_ckpt_run *r, kvt_ckpt_store *store, uint32_t every, const char *compat, const kvt_gen_request *req,
                    uint32_t max_new, uint32_t n_vocab) {
    memset(r, 0, sizeof *r);
    if (!store || !every || req->no_cache) return;
    kvt_ckpt_request_key(compat, req, max_new, r->key);
    if (key_zero(r->key)) return;
    r->on = true;
    r->every = every;
    if (!kvt_ckpt_store_load(store, r->key, req->n_prompt, n_vocab, max_new, &r->rec)) return;
    r->n_look = req->n_prompt + r->rec.n_emitted;
    r->look = malloc(sizeof(int32_t) * r->n_look);
    if (!r->look) { /* resume is an optimisation: start normally */
        free(r->rec.emitted);
        memset(&r->rec, 0, sizeof r->rec);
        r->n_look = 0;
        return;
    }
    memcpy(r->look, req->prompt, sizeof(int32_t) * req->n_prompt);
    memcpy(r->look + req->n_prompt, r->rec.emitted, sizeof(int32_t) * r->rec.n_emitted);
    r->resumed = true;
    kvt_ckpt_store_note_resumed(store);
    KVT_INFO("checkpoint: resuming a generation at %u emitted tokens", r->rec.n_emitted);
}

kvt_ckpt_src kvt_ckpt_next(kvt_ckpt_run *r, int32_t *id) {
    if (!r->resumed || r->pending_done) return KVT_CKPT_SAMPLE;
    if (r->replay_i < r->rec.n_emitted) {
        *id = r->rec.emitted[r->replay_i++];
        return KVT_CKPT_REPLAYED;
    }
    r->pending_done = true;
    *id = r->rec.pending;
    return KVT_CKPT_PENDING;
}

void kvt_ckpt_save(kvt_ckpt_run *r, kvt_ckpt_store *store, kvt_ssd *ssd, bool writeback, const kvt_seq *seq,
                   uint32_t n_prompt, const int32_t *gen, uint32_t n_gen, int32_t pending, uint64_t rng) {
    if (!r->on) return;
    /* the emitted prefix's KV: sealed blocks go to the SSD tier like any write-behind record (the
     * growing tail is not sealed and is recomputed on resume) */
    if (ssd && writeback) {
        kvt_ssd_enqueue_seq(ssd, seq, NULL);
    } else if (ssd) {
        const uint32_t ng = kvt_kv_layout_n_groups(kvt_ssd_layout(ssd)), nb = kvt_seq_n_blocks(seq);
        for (uint32_t i = 0; i < nb; i++)
            for (uint32_t g = 0; g < ng; g++) {
                kvt_block *b = kvt_seq_block(seq, g, i);
                if (b && kvt_block_sealed(b)) kvt_ssd_persist_block(ssd, b);
            }
    }
    kvt_ckpt_rec rec = {.n_prompt = n_prompt, .n_emitted = n_gen, .pending = pending, .rng = rng, .emitted = (int32_t *)gen};
    memcpy(rec.key, r->key, 32);
    if (kvt_ckpt_store_save(store, &rec)) r->saved = true;
}

void kvt_ckpt_end(kvt_ckpt_run *r, kvt_ckpt_store *store, bool completed) {
    if (r->on && completed && (r->saved || r->resumed)) kvt_ckpt_store_invalidate(store, r->key);
}

void kvt_ckpt_run_free(kvt_ckpt_run *r) {
    free(r->look);
    free(r->rec.emitted);
    memset(r, 0, sizeof *r);
}
