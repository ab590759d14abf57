/*
 * tokenizer.c — tokenizer construction from GGUF metadata, the shared token-text hash map,
 * special-token splitting, BOS/EOS/EOG handling, and (incremental) detokenization. The
 * model-specific merge loops live in bpe.c (byte-level BPE) and spm.c (SentencePiece BPE).
 */
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#include "tok_internal.h"
#include "util/strbuf.h"

/* ------------------------------------------------------------------ id vector */

void kvt_idvec_push(kvt_idvec *v, int32_t id) {
    if (v->oom) return;
    if (v->n == v->cap) {
        int64_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *nv = realloc(v->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            v->oom = true;
            return;
        }
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = id;
    if (v->limit > 0 && v->n > v->limit) v->over = true;
}

/* ------------------------------------------------------------------ string map */

static uint64_t str_hash(const char *s, size_t len) { return XXH3_64bits(s, len); }

static bool map_rehash(kvt_tokenizer *t, uint32_t need) {
    uint64_t cap = 64;
    while (cap < (uint64_t)need * 2) cap <<= 1;
    if (cap > (1ull << 31)) return false;
    int32_t *slots = malloc(cap * sizeof *slots);
    if (!slots) return false;
    memset(slots, 0xff, cap * sizeof *slots);
    uint32_t mask = (uint32_t)(cap - 1);
    /* re-insert in id order; a later duplicate text overwrites the earlier id (llama.cpp keeps the
     * last occurrence) */
    for (uint32_t id = 0; id < t->n_sym; id++) {
        uint32_t len;
        const char *s = kvt_tok_text(t, (int32_t)id, &len);
        uint32_t h = (uint32_t)str_hash(s, len) & mask;
        for (;;) {
            int32_t cur = slots[h];
            if (cur < 0) {
                slots[h] = (int32_t)id;
                break;
            }
            uint32_t cl;
            const char *cs = kvt_tok_text(t, cur, &cl);
            if (cl == len && !memcmp(cs, s, len)) {
                if ((uint32_t)cur < t->n_vocab || id >= t->n_vocab) slots[h] = (int32_t)id;
                break;
            }
            h = (h + 1) & mask;
        }
    }
    free(t->map.slots);
    t->map.slots = slots;
    t->map.mask = mask;
    return true;
}

int32_t kvt_tok_lookup(const kvt_tokenizer *t, const char *s, size_t len) {
    if (!t->map.slots) return -1;
    uint32_t h = (uint32_t)str_hash(s, len) & t->map.mask;
    for (;;) {
        int32_t cur = t->map.slots[h];
        if (cur < 0) return -1;
        uint32_t cl;
        const char *cs = kvt_tok_text(t, cur, &cl);
        if (cl == len && !memcmp(cs, s, len)) return cur;
        h = (h + 1) & t->map.mask;
    }
}

static bool blob_append(kvt_tokenizer *t, const char *s, size_t len) {
    if (t->n_sym >= t->cap_sym) {
        uint32_t nc = t->cap_sym ? t->cap_sym * 2 : 1024;
        uint64_t *no = realloc(t->off, (size_t)nc * sizeof *no);
        if (!no) return false;
        t->off = no;
        uint32_t *nl = realloc(t->lens, (size_t)nc * sizeof *nl);
        if (!nl) return false;
        t->lens = nl;
        t->cap_sym = nc;
    }
    if (t->blob_len + len + 1 > t->blob_cap) {
        uint64_t nc = t->blob_cap ? t->blob_cap : 4096;
        while (nc < t->blob_len + len + 1) nc *= 2;
        char *nb = realloc(t->blob, nc);
        if (!nb) return false;
        t->blob = nb;
        t->blob_cap = nc;
    }
    t->off[t->n_sym] = t->blob_len;
    t->lens[t->n_sym] = (uint32_t)len;
    memcpy(t->blob + t->blob_len, s, len);
    t->blob_len += len;
    t->blob[t->blob_len++] = 0; /* NUL after each text for kvt_tokenizer_token_text */
    t->n_sym++;
    return true;
}

int32_t kvt_tok_add_extra(kvt_tokenizer *t, const char *s, size_t len) {
    int32_t id = kvt_tok_lookup(t, s, len);
    if (id >= 0) return id;
    if (t->n_sym >= (1u << 30)) return -1;
    if (!blob_append(t, s, len)) return -1;
    if ((uint64_t)t->n_sym * 2 > (uint64_t)t->map.mask + 1) {
        if (!map_rehash(t, t->n_sym)) return -1;
        return (int32_t)(t->n_sym - 1);
    }
    uint32_t h = (uint32_t)str_hash(s, len) & t->map.mask;
    while (t->map.slots[h] >= 0) h = (h + 1) & t->map.mask;
    t->map.slots[h] = (int32_t)(t->n_sym - 1);
    return (int32_t)(t->n_sym - 1);
}

/* ------------------------------------------------------------------ create / free */

static int32_t get_id(const kvt_gguf *g, const char *key, int32_t dflt, uint32_t n_vocab) {
    uint32_t v;
    if (kvt_gguf_get_u32(g, key, &v)) {
        if (v < n_vocab) return (int32_t)v;
        KVT_WARN("tokenizer: %s = %u is outside the vocabulary (%u tokens); ignored", key, v, n_vocab);
        return -1;
    }
    if (dflt >= 0 && (uint32_t)dflt < n_vocab) return dflt;
    return -1;
}

static int cmp_special(const void *a, const void *b) {
    const kvt_special *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static const char *const k_eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                          "<|endoftext|>", "<|eom_id|>", "<EOT>"};

kvt_status kvt_tokenizer_create(const kvt_gguf *g, kvt_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    const char *ms;
    uint64_t ml;
    if (!kvt_gguf_get_str(g, "tokenizer.ggml.model", &ms, &ml))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tokenizer: tokenizer.ggml.model is missing");
    kvt_tok_model model;
    if (ml == 4 && !memcmp(ms, "gpt2", 4)) model = KVT_TOKM_BPE;
    else if (ml == 5 && !memcmp(ms, "llama", 5)) model = KVT_TOKM_SPM;
    else
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "tokenizer: unsupported tokenizer.ggml.model '%.*s'",
                        (int)KVT_MIN(ml, 32), ms);
    kvt_gguf_vtype elem;
    uint64_t n;
    const void *data;
    if (!kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", &elem, &n, &data) || elem != KVT_GGUF_STRING)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens missing or not a string array");
    if (n == 0 || n > (1u << 24))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tokenizer: bad vocabulary size %llu", (unsigned long long)n);

    kvt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return KVT_ERR_NOMEM;
    kvt_status st = KVT_ERR_NOMEM;
    t->model = model;
    snprintf(t->model_name, sizeof t->model_name, "%s", model == KVT_TOKM_BPE ? "gpt2" : "llama");
    t->n_vocab = (uint32_t)n;
    t->cap_sym = (uint32_t)n + 1024;
    t->off = malloc((size_t)t->cap_sym * sizeof *t->off);
    t->lens = malloc((size_t)t->cap_sym * sizeof *t->lens);
    t->type = malloc(n);
    t->eog = calloc(n, 1);
    if (!t->off || !t->lens || !t->type || !t->eog) goto fail;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        uint64_t l;
        if (!kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &l) || l > (1u << 20)) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "tokenizer: token %llu unreadable", (unsigned long long)i);
            goto fail;
        }
        if (!blob_append(t, s, l)) goto fail;
    }

    /* token types */
    {
        kvt_gguf_vtype te;
        uint64_t tn;
        const void *td;
        bool have = kvt_gguf_get_arr(g, "tokenizer.ggml.token_type", &te, &tn, &td);
        if (have && tn != n) {
            KVT_WARN("tokenizer: token_type has %llu entries for %llu tokens; ignored", (unsigned long long)tn,
                     (unsigned long long)n);
            have = false;
        }
        for (uint64_t i = 0; i < n; i++) {
            int64_t v = KVT_TT_NORMAL;
            if (have && !kvt_gguf_get_arr_i64(g, "tokenizer.ggml.token_type", i, &v)) v = KVT_TT_NORMAL;
            t->type[i] = (v >= 0 && v <= 6) ? (uint8_t)v : KVT_TT_NORMAL;
        }
    }
    if (!map_rehash(t, t->n_vocab + 1024)) goto fail;

    /* special ids and flags */
    bool spm = model == KVT_TOKM_SPM;
    t->bos = get_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : 11, t->n_vocab);
    t->eos = get_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : 11, t->n_vocab);
    t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab);
    t->eot = get_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab);
    t->eom = get_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab);
    t->pad = get_id(g, "tokenizer.ggml.padding_token_id", -1, t->n_vocab);
    t->add_bos = spm;
    t->add_eos = false;
    t->add_space_prefix = spm;

    const char *ps = NULL;
    uint64_t pl = 0;
    if (!spm) {
        if (!kvt_gguf_get_str(g, "tokenizer.ggml.pre", &ps, &pl)) {
            KVT_WARN("tokenizer: tokenizer.ggml.pre is missing; using the default (gpt2) pre-tokenizer; "
                     "generation quality may be degraded");
            ps = "default";
            pl = 7;
        }
        snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)KVT_MIN(pl, 31), ps);
    } else {
        snprintf(t->pre_name, sizeof t->pre_name, "spm");
    }
    if (!spm) {
        st = kvt_bpe_init(t, g, err, errlen); /* resolves pre-type, may force add_bos/ignore_merges */
        if (st != KVT_OK) goto fail;
        st = KVT_ERR_NOMEM;
    }
    bool b;
    if (kvt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) t->add_bos = b;
    if (kvt_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b)) t->add_eos = b;
    if (spm && kvt_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) t->add_space_prefix = b;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if (t->add_eos && t->eos < 0) t->add_eos = false;

    if (spm) {
        t->scores = calloc(n, sizeof *t->scores);
        if (!t->scores) goto fail;
        kvt_gguf_vtype se;
        uint64_t sn;
        const void *sd;
        if (kvt_gguf_get_arr(g, "tokenizer.ggml.scores", &se, &sn, &sd) && sn == n) {
            for (uint64_t i = 0; i < n; i++) {
                float f;
                if (kvt_gguf_get_arr_f32(g, "tokenizer.ggml.scores", i, &f)) t->scores[i] = f;
            }
        } else {
            KVT_WARN("tokenizer: tokenizer.ggml.scores missing or wrong length; all scores are 0");
        }
        kvt_spm_init(t);
    }

    /* end-of-generation set; such tokens are forced to CONTROL */
    int32_t eogs[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (eogs[i] >= 0) t->eog[eogs[i]] = 1;
    for (size_t i = 0; i < KVT_ARRAY_LEN(k_eog_texts); i++) {
        int32_t id = kvt_tok_lookup(t, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            t->eog[id] = 1;
            t->type[id] = KVT_TT_CONTROL;
        }
    }

    /* special tokens for text splitting: control, user-defined and unknown with non-empty text */
    uint32_t ns = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if ((ty == KVT_TT_CONTROL || ty == KVT_TT_USER || ty == KVT_TT_UNKNOWN) && t->lens[i] > 0) ns++;
    }
    t->specials = calloc(ns ? ns : 1, sizeof *t->specials);
    t->sp_bucket_start = calloc(257, sizeof *t->sp_bucket_start);
    t->sp_bucket = calloc(ns ? ns : 1, sizeof *t->sp_bucket);
    if (!t->specials || !t->sp_bucket_start || !t->sp_bucket) goto fail;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        uint32_t len;
        kvt_tok_text(t, (int32_t)i, &len);
        if ((ty == KVT_TT_CONTROL || ty == KVT_TT_USER || ty == KVT_TT_UNKNOWN) && len > 0) {
            kvt_special *sp = &t->specials[t->n_specials++];
            sp->id = (int32_t)i;
            sp->len = len;
            sp->off = (uint32_t)t->off[i];
            sp->type = ty;
        }
    }
    qsort(t->specials, t->n_specials, sizeof *t->specials, cmp_special);
    {
        uint32_t cnt[256] = {0};
        for (uint32_t i = 0; i < t->n_specials; i++) cnt[(unsigned char)t->blob[t->specials[i].off]]++;
        t->sp_bucket_start[0] = 0;
        for (int c = 0; c < 256; c++) t->sp_bucket_start[c + 1] = t->sp_bucket_start[c] + cnt[c];
        uint32_t fill[256];
        for (int c = 0; c < 256; c++) fill[c] = t->sp_bucket_start[c];
        for (uint32_t i = 0; i < t->n_specials; i++) t->sp_bucket[fill[(unsigned char)t->blob[t->specials[i].off]]++] = i;
    }

    /* Upper bound on the input bytes one emitted token can cover: token texts are stored escaped
     * (byte-level BPE maps a byte to 1-2 UTF-8 bytes, SPM writes a space as the 3-byte U+2581), so
     * the stored length never undercounts; 4 covers an unk standing for one 4-byte character. */
    t->max_token_len = 4;
    for (uint32_t i = 0; i < t->n_vocab; i++) t->max_token_len = KVT_MAX(t->max_token_len, t->lens[i]);

    /* stable hash of everything that changes tokenization */
    {
        XXH3_state_t *hs = XXH3_createState();
        if (!hs) goto fail;
        XXH3_64bits_reset(hs);
        XXH3_64bits_update(hs, t->model_name, strlen(t->model_name));
        XXH3_64bits_update(hs, t->pre_name, strlen(t->pre_name));
        XXH3_64bits_update(hs, &t->n_vocab, sizeof t->n_vocab);
        XXH3_64bits_update(hs, t->blob, t->off[t->n_vocab - 1] + t->lens[t->n_vocab - 1]);
        XXH3_64bits_update(hs, t->type, t->n_vocab);
        if (t->scores) XXH3_64bits_update(hs, t->scores, (size_t)t->n_vocab * sizeof(float));
        if (t->merges.keys) {
            XXH3_64bits_update(hs, t->merges.keys, (size_t)(t->merges.mask + 1) * 8);
            XXH3_64bits_update(hs, t->merges.vals, (size_t)(t->merges.mask + 1) * 8);
        }
        uint8_t flags[4] = {t->add_bos, t->add_eos, t->add_space_prefix, t->ignore_merges};
        int32_t ids[6] = {t->bos, t->eos, t->eot, t->eom, t->unk, t->pad};
        XXH3_64bits_update(hs, flags, sizeof flags);
        XXH3_64bits_update(hs, ids, sizeof ids);
        t->hash = XXH3_64bits_digest(hs);
        XXH3_freeState(hs);
    }
    *out = t;
    return KVT_OK;
fail:
    if (st == KVT_ERR_NOMEM && err && errlen) kvt_errf(err, errlen, st, "tokenizer: out of memory");
    kvt_tokenizer_free(t);
    return st;
}

void kvt_tokenizer_free(kvt_tokenizer *t) {
    if (!t) return;
    kvt_bpe_free(t);
    free(t->blob);
    free(t->off);
    free(t->lens);
    free(t->type);
    free(t->scores);
    free(t->map.slots);
    free(t->eog);
    free(t->specials);
    free(t->sp_bucket_start);
    free(t->sp_bucket);
    free(t);
}

/* ------------------------------------------------------------------ accessors */

uint32_t kvt_tokenizer_n_vocab(const kvt_tokenizer *t) { return t->n_vocab; }
int32_t kvt_tokenizer_bos(const kvt_tokenizer *t) { return t->bos; }
int32_t kvt_tokenizer_eos(const kvt_tokenizer *t) { return t->eos; }
bool kvt_tokenizer_add_bos(const kvt_tokenizer *t) { return t->add_bos; }
bool kvt_tokenizer_add_eos(const kvt_tokenizer *t) { return t->add_eos; }
bool kvt_tokenizer_add_space_prefix(const kvt_tokenizer *t) { return t->add_space_prefix; }
bool kvt_tokenizer_is_eog(const kvt_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_vocab && t->eog[id];
}
int32_t kvt_tokenizer_find(const kvt_tokenizer *t, const char *text) {
    int32_t id = kvt_tok_lookup(t, text, strlen(text));
    return (id >= 0 && (uint32_t)id < t->n_vocab) ? id : -1;
}
const char *kvt_tokenizer_token_text(const kvt_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return NULL;
    return t->blob + t->off[id];
}
int32_t kvt_tokenizer_token_type(const kvt_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return -1;
    return t->type[id];
}
uint64_t kvt_tokenizer_hash(const kvt_tokenizer *t) { return t->hash; }
const char *kvt_tokenizer_model_name(const kvt_tokenizer *t) { return t->model_name; }
const char *kvt_tokenizer_pre_name(const kvt_tokenizer *t) { return t->pre_name; }

/* ------------------------------------------------------------------ encode */

typedef struct occ {
    uint32_t sp;  /* index into specials (length-descending order) */
    uint32_t pos;
} occ;

static int cmp_occ(const void *a, const void *b) {
    const occ *x = a, *y = b;
    if (x->sp != y->sp) return x->sp < y->sp ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}
static int cmp_occ_pos(const void *a, const void *b) {
    const occ *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Finds the special tokens to split out, with llama.cpp's semantics: the longest special token is
 * matched first everywhere (left to right, non-overlapping), then the next longest in the remaining
 * raw text, and so on. Returns the accepted matches sorted by position (malloc'd) or NULL with
 * *n = 0; *oom on allocation failure. */
static occ *find_specials(const kvt_tokenizer *t, const char *text, size_t len, bool parse_special, uint32_t *n,
                          bool *oom) {
    *n = 0;
    *oom = false;
    if (!t->n_specials || len == 0 || len > UINT32_MAX) return NULL;
    occ *v = NULL;
    uint32_t nv = 0, cap = 0;
    for (size_t p = 0; p < len; p++) {
        unsigned char c = (unsigned char)text[p];
        for (uint32_t k = t->sp_bucket_start[c]; k < t->sp_bucket_start[c + 1]; k++) {
            uint32_t si = t->sp_bucket[k];
            const kvt_special *sp = &t->specials[si];
            if (!parse_special && sp->type != KVT_TT_USER) continue;
            if (sp->len > len - p || memcmp(text + p, t->blob + sp->off, sp->len)) continue;
            if (nv == cap) {
                uint32_t nc = cap ? cap * 2 : 16;
                occ *nvv = realloc(v, nc * sizeof *v);
                if (!nvv) {
                    free(v);
                    *oom = true;
                    return NULL;
                }
                v = nvv;
                cap = nc;
            }
            v[nv++] = (occ){si, (uint32_t)p};
        }
    }
    if (!nv) return v;
    qsort(v, nv, sizeof *v, cmp_occ);
    uint8_t *claimed = calloc(len, 1);
    if (!claimed) {
        free(v);
        *oom = true;
        return NULL;
    }
    uint32_t na = 0;
    for (uint32_t i = 0; i < nv; i++) {
        uint32_t l = t->specials[v[i].sp].len;
        bool free_ = true;
        for (uint32_t j = 0; j < l && free_; j++) free_ = !claimed[v[i].pos + j];
        if (!free_) continue;
        memset(claimed + v[i].pos, 1, l);
        v[na++] = v[i];
    }
    free(claimed);
    qsort(v, na, sizeof *v, cmp_occ_pos);
    *n = na;
    return v;
}

static void spm_fragment(const kvt_tokenizer *t, const char *text, size_t len, bool prefix, kvt_idvec *out) {
    /* escape: optional dummy space, then ' ' -> U+2581 */
    size_t nsp = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) nsp += text[i] == ' ';
    size_t blen = len + (prefix ? 1 : 0) + nsp * 2;
    char stackbuf[1024];
    char *buf = blen <= sizeof stackbuf ? stackbuf : malloc(blen);
    if (!buf) {
        out->oom = true;
        return;
    }
    size_t o = 0;
    if (prefix) {
        memcpy(buf, "\xE2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + o, "\xE2\x96\x81", 3);
            o += 3;
        } else
            buf[o++] = text[i];
    }
    kvt_spm_encode(t, buf, o, out);
    if (buf != stackbuf) free(buf);
}

int64_t kvt_tokenize_limit(const kvt_tokenizer *t, const char *text, size_t len, uint32_t flags, int32_t *ids,
                           int64_t cap, int64_t limit) {
    kvt_idvec out = {.limit = limit > 0 ? limit : 0};
    bool add_special = flags & KVT_TOK_ADD_SPECIAL;
    if (add_special && t->add_bos && t->bos >= 0) kvt_idvec_push(&out, t->bos);
    uint32_t nocc = 0;
    bool oom = false;
    occ *oc = find_specials(t, text, len, flags & KVT_TOK_PARSE_SPECIAL, &nocc, &oom);
    if (oom) return -1;
    pcre2_match_data *md = NULL;
    if (t->model == KVT_TOKM_BPE) {
        md = pcre2_match_data_create(4, NULL);
        if (!md) {
            free(oc);
            return -1;
        }
    }
    bool prev_special = !(flags & KVT_TOK_NO_SPACE_PREFIX);
    size_t pos = 0;
    for (uint32_t i = 0; i <= nocc && !out.over; i++) {
        size_t end = i < nocc ? oc[i].pos : len;
        if (end > pos) {
            if (t->model == KVT_TOKM_BPE) kvt_bpe_encode(t, text + pos, end - pos, &out, md);
            else spm_fragment(t, text + pos, end - pos, prev_special && t->add_space_prefix, &out);
            prev_special = false;
        }
        if (out.over) break; /* the fragment may have stopped early: nothing after it may follow */
        if (i < nocc) {
            const kvt_special *sp = &t->specials[oc[i].sp];
            kvt_idvec_push(&out, sp->id);
            pos = oc[i].pos + sp->len;
            prev_special = true;
        }
    }
    if (add_special && t->add_eos && t->eos >= 0 && !out.over) kvt_idvec_push(&out, t->eos);
    free(oc);
    if (md) pcre2_match_data_free(md);
    if (out.oom) {
        free(out.v);
        return -1;
    }
    if (ids && cap > 0 && out.n > 0) memcpy(ids, out.v, (size_t)KVT_MIN(cap, out.n) * sizeof *ids); /* out.v is NULL when empty */
    int64_t n = out.n;
    free(out.v);
    return n;
}

int64_t kvt_tokenize_ex(const kvt_tokenizer *t, const char *text, size_t len, uint32_t flags, int32_t *ids,
                        int64_t cap) {
    return kvt_tokenize_limit(t, text, len, flags, ids, cap, 0);
}

uint32_t kvt_tokenizer_max_token_bytes(const kvt_tokenizer *t) { return t->max_token_len; }

int64_t kvt_tokenize(const kvt_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                     int32_t *ids, int64_t cap) {
    uint32_t f = (add_bos ? KVT_TOK_ADD_SPECIAL : 0) | (parse_special ? KVT_TOK_PARSE_SPECIAL : 0);
    return kvt_tokenize_ex(t, text, len, f, ids, cap);
}

/* ------------------------------------------------------------------ decode */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Writes the bytes of token id into buf (up to cap) and returns the full count. */
int32_t kvt_token_to_bytes(const kvt_tokenizer *t, int32_t id, bool render_special, char *buf, int32_t cap) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return 0;
    uint32_t len;
    const char *s = kvt_tok_text(t, id, &len);
    uint8_t ty = t->type[id];
    char tmp[8];
    const char *src = s;
    size_t n = len;
    char *heap = NULL;
    if (ty == KVT_TT_CONTROL) {
        if (!render_special) return 0;
    } else if (ty == KVT_TT_UNKNOWN) {
        if (t->model == KVT_TOKM_SPM) {
            src = "\xE2\x96\x85";
            n = 3;
        } else if (!render_special)
            return 0;
    } else if (ty == KVT_TT_USER && t->model == KVT_TOKM_BPE) {
        /* user-defined BPE tokens are stored as plain text */
    } else if (t->model == KVT_TOKM_SPM && ty == KVT_TT_BYTE && len == 6 && s[0] == '<' && s[1] == '0' &&
               s[2] == 'x' && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
        tmp[0] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
        src = tmp;
        n = 1;
    } else if (t->model == KVT_TOKM_SPM) {
        /* U+2581 -> space */
        heap = malloc(len + 1);
        if (!heap) return 0;
        size_t o = 0;
        for (uint32_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(s + i, "\xE2\x96\x81", 3)) {
                heap[o++] = ' ';
                i += 3;
            } else
                heap[o++] = s[i++];
        }
        src = heap;
        n = o;
    } else {
        heap = malloc(len + 1);
        if (!heap) return 0;
        n = kvt_bpe_unmap(t, s, len, heap);
        src = heap;
    }
    if (buf && cap > 0) memcpy(buf, src, KVT_MIN((size_t)cap, n));
    free(heap);
    return (int32_t)n;
}

/* Appends token id's bytes, applying the leading-space strip for the first token. */
static void append_token(const kvt_tokenizer *t, kvt_strbuf *b, int32_t id, bool render_special, bool first) {
    char small[256];
    int32_t n = kvt_token_to_bytes(t, id, render_special, small, sizeof small);
    char *src = small;
    char *heap = NULL;
    if (n > (int32_t)sizeof small) {
        heap = malloc((size_t)n);
        if (!heap) {
            b->oom = true;
            return;
        }
        kvt_token_to_bytes(t, id, render_special, heap, n);
        src = heap;
    }
    if (first && t->model == KVT_TOKM_SPM && t->add_space_prefix && t->type[id] != KVT_TT_CONTROL && n > 0 &&
        src[0] == ' ') {
        src++;
        n--;
    }
    kvt_strbuf_add(b, src, (size_t)n);
    free(heap);
}

char *kvt_detokenize(const kvt_tokenizer *t, const int32_t *ids, int64_t n, bool render_special, size_t *out_len) {
    kvt_strbuf b = {0};
    bool first = true;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab) continue; /* untrusted ids: skipped */
        append_token(t, &b, ids[i], render_special, first);
        first = false;
    }
    size_t len;
    char *text = kvt_strbuf_take(&b, &len);
    if (text && out_len) *out_len = len;
    return text;
}

/* ------------------------------------------------------------------ streaming detok */

struct kvt_detok {
    const kvt_tokenizer *t;
    bool render_special;
    bool first;
    kvt_strbuf pending; /* bytes not yet emitted (an incomplete code point at most) */
    char *out;       /* last returned text */
};

kvt_detok *kvt_detok_create(const kvt_tokenizer *t, bool render_special) {
    kvt_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->render_special = render_special;
    d->first = true;
    return d;
}

void kvt_detok_free(kvt_detok *d) {
    if (!d) return;
    kvt_strbuf_free(&d->pending);
    free(d->out);
    free(d);
}

static const char *detok_emit(kvt_detok *d, size_t upto, size_t *len) {
    free(d->out);
    d->out = kvt_utf8_sanitize(d->pending.p ? d->pending.p : "", upto, len);
    if (!d->out) {
        *len = 0;
        return "";
    }
    if (upto) {
        memmove(d->pending.p, d->pending.p + upto, d->pending.n - upto);
        d->pending.n -= upto;
        d->pending.p[d->pending.n] = 0;
    }
    return d->out;
}

const char *kvt_detok_push(kvt_detok *d, int32_t id, size_t *len) {
    /* ids outside the vocabulary are skipped, exactly as kvt_detokenize does */
    if (id >= 0 && (uint32_t)id < d->t->n_vocab) {
        append_token(d->t, &d->pending, id, d->render_special, d->first);
        d->first = false;
    }
    if (d->pending.oom) {
        *len = 0;
        return "";
    }
    size_t upto = d->pending.p ? kvt_utf8_complete_prefix(d->pending.p, d->pending.n) : 0;
    return detok_emit(d, upto, len);
}

const char *kvt_detok_flush(kvt_detok *d, size_t *len) { return detok_emit(d, d->pending.n, len); }
