/*
 * spm.c — SentencePiece-style BPE (tokenizer.ggml.model = llama): start from UTF-8 characters,
 * repeatedly merge the adjacent pair whose concatenation is the vocabulary token with the highest
 * score (ties: leftmost), using a binary heap with lazy invalidation. Final symbols that are not
 * tokens fall back to <0xXX> byte tokens (then the single-byte token, then unk).
 *
 * Every merge product is a vocabulary token (a pair is only queued when its concatenation is one),
 * so "resegmenting" a final symbol reduces to: token -> emit it, otherwise (an unmerged character
 * that is not a token) -> byte fallback.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tok_internal.h"

void kvt_spm_init(kvt_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t id = kvt_tok_lookup(t, name, 6);
        if (id < 0) {
            char c = (char)b;
            id = kvt_tok_lookup(t, &c, 1);
        }
        t->byte_tok[b] = id >= 0 && (uint32_t)id < t->n_vocab ? id : -1;
    }
    /* Chunking is exact when no token has U+2581 right after a character other than U+2581: then
     * no token (hence no merge) can span the start of a U+2581 run, and the text splits there. */
    t->spm_split_ws = true;
    for (uint32_t i = 0; i < t->n_vocab && t->spm_split_ws; i++) {
        uint32_t len;
        const char *s = kvt_tok_text(t, (int32_t)i, &len);
        for (uint32_t k = 1; k + 3 <= len; k++)
            if (!memcmp(s + k, "\xE2\x96\x81", 3) && (k < 3 || memcmp(s + k - 3, "\xE2\x96\x81", 3))) {
                t->spm_split_ws = false;
                break;
            }
    }
}

typedef struct ssym {
    uint32_t start, n; /* n == 0: merged away */
    int32_t prev, next;
} ssym;

typedef struct sbig {
    float score;
    uint32_t left;
    uint32_t size;
} sbig;

static inline bool big_better(const sbig *a, const sbig *b) {
    return a->score != b->score ? a->score > b->score : a->left < b->left;
}

typedef struct sheap {
    sbig *v;
    uint32_t n, cap;
} sheap;

static void sh_push(sheap *h, sbig c) {
    if (h->n == h->cap) return; /* sized for the worst case by the caller */
    uint32_t i = h->n++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!big_better(&c, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static sbig sh_pop(sheap *h) {
    sbig top = h->v[0];
    sbig last = h->v[--h->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        const sbig *best = &last;
        if (l < h->n && big_better(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && big_better(&h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void try_bigram(const kvt_tokenizer *t, const char *text, const ssym *s, sheap *h, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = s[l].n + s[r].n;
    int32_t id = kvt_tok_lookup(t, text + s[l].start, size);
    if (id < 0 || (uint32_t)id >= t->n_vocab) return;
    sh_push(h, (sbig){t->scores[id], (uint32_t)l, size});
}

static void encode_chunk(const kvt_tokenizer *t, const char *text, size_t len, ssym *s, sheap *hp,
                         kvt_idvec *out);

void kvt_spm_encode(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out) {
    kvt_spm_encode_opt(t, text, len, out, true);
}

void kvt_spm_encode_opt(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out, bool allow_split) {
    if (len == 0) return;
    if (len > (1u << 30)) {
        out->oom = true;
        return;
    }
    ssym *s = malloc(len * sizeof *s);
    uint32_t hcap = (uint32_t)(3 * len + 1);
    sheap h = {malloc(hcap * sizeof(sbig)), 0, hcap};
    if (!s || !h.v) {
        free(s);
        free(h.v);
        out->oom = true;
        return;
    }
    size_t start = 0;
    for (size_t i = 1; allow_split && t->spm_split_ws && i + 3 <= len && !out->over; i++) {
        /* split before a U+2581 that follows something else */
        if (text[i] == '\xE2' && !memcmp(text + i, "\xE2\x96\x81", 3) &&
            !(i >= 3 && !memcmp(text + i - 3, "\xE2\x96\x81", 3))) {
            if (i > start) encode_chunk(t, text + start, i - start, s, &h, out);
            start = i;
        }
    }
    if (!out->over) encode_chunk(t, text + start, len - start, s, &h, out);
    free(s);
    free(h.v);
}

static void encode_chunk(const kvt_tokenizer *t, const char *text, size_t len, ssym *s, sheap *hp,
                         kvt_idvec *out) {
    sheap h = *hp;
    h.n = 0;
    uint32_t ns = 0;
    for (size_t i = 0; i < len;) {
        /* a well-formed code point is one symbol; each byte of an ill-formed sequence is its own
         * symbol (llama.cpp takes the lead byte's length blindly, which can swallow the first bytes
         * of a following U+2581 and break the round trip) */
        uint32_t n = kvt_utf8_seq_len((const unsigned char *)text + i, len - i);
        if (n == 0) n = 1;
        s[ns] = (ssym){(uint32_t)i, n, (int32_t)ns - 1, -1};
        if (ns) s[ns - 1].next = (int32_t)ns;
        ns++;
        i += n;
    }
    for (uint32_t i = 1; i < ns; i++) try_bigram(t, text, s, &h, (int32_t)i - 1, (int32_t)i);
    while (h.n) {
        sbig b = sh_pop(&h);
        ssym *l = &s[b.left];
        if (l->n == 0 || l->next < 0) continue;
        ssym *r = &s[l->next];
        if (r->n == 0 || l->n + r->n != b.size) continue; /* stale entry */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = (int32_t)b.left;
        try_bigram(t, text, s, &h, l->prev, (int32_t)b.left);
        try_bigram(t, text, s, &h, (int32_t)b.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        int32_t id = kvt_tok_lookup(t, text + s[i].start, s[i].n);
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            kvt_idvec_push(out, id);
            continue;
        }
        for (uint32_t k = 0; k < s[i].n; k++) {
            int32_t bt = t->byte_tok[(unsigned char)text[s[i].start + k]];
            if (bt >= 0) kvt_idvec_push(out, bt);
            else if (t->unk >= 0) kvt_idvec_push(out, t->unk);
        }
    }
}
