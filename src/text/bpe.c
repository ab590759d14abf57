/*
 * bpe.c — GPT-2 style byte-level BPE: pre-tokenizer selection (tokenizer.ggml.pre -> PCRE2 regex
 * stages), the byte<->unicode map, the merge table (pair of symbol ids -> rank and result) and the
 * lowest-rank-first merge loop (binary heap over a linked list of symbols, O(n log n) per piece).
 *
 * Pre-tokenizer semantics follow llama.cpp's unicode_regex_split: each regex stage splits every
 * current segment into its matches AND the unmatched gaps between them (gaps stay pieces). With
 * PCRE2_MATCH_INVALID_UTF, ill-formed UTF-8 bytes are never matched, so they end up in gap pieces
 * of their own and are encoded byte-wise (byte-exact round trip for any input).
 */
#include <stdio.h>
#include <stdlib.h>

#include "tok_internal.h"

/* ---- pre-tokenizer regexes (engine-facts §3.3; exact strings) ---- */
static const char k_re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* llama.cpp stores the gpt2 string without the final "|\\s+" and relies on its splitter keeping
 * unmatched gaps as pieces; we keep gaps too, so including "|\\s+" gives identical pieces. */
static const char k_re_llama3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* First stage of the starcoder/smollm group: every digit is its own segment. */
static const char k_re_digit[] = "\\p{N}";

typedef struct pre_map {
    const char *name;
    const char *canon; /* resolved name reported by kvt_tokenizer_pre_name */
    int kind;          /* 0 gpt2, 1 llama3 (+add_bos, ignore_merges), 2 llama3 regex only, 3 qwen2,
                          4 digits then gpt2 */
} pre_map;

/* Resolution table. Regexes for deepseek-llm/-coder/-v3 and falcon are not in engine-facts; they
 * map to the closest documented splitter (documented in docs/chat-templates.md §Tokenizers). The
 * starcoder/smollm group uses llama.cpp's two-stage split (single digits, then gpt2). */
static const pre_map k_pre[] = {
    {"default", "gpt2", 0},         {"gpt2", "gpt2", 0},           {"gpt-2", "gpt2", 0},
    {"mpt", "gpt2", 0},             {"olmo", "gpt2", 0},           {"jais", "gpt2", 0},
    {"phi-2", "gpt2", 0},           {"roberta-bpe", "gpt2", 0},    {"falcon", "gpt2", 0},
    {"llama3", "llama3", 1},        {"llama-v3", "llama3", 1},     {"llama-bpe", "llama3", 1},
    {"falcon3", "llama3", 1},       {"dbrx", "llama3", 2},         {"smaug-bpe", "llama3", 2},
    {"deepseek-llm", "llama3", 2},  {"deepseek-coder", "llama3", 2}, {"deepseek-v3", "llama3", 2},
    {"qwen2", "qwen2", 3},          {"deepseek-r1-qwen", "qwen2", 3}, {"stablelm2", "qwen2", 3},
    {"smollm", "smollm", 4},        {"starcoder", "starcoder", 4}, {"refact", "starcoder", 4},
    {"command-r", "starcoder", 4},
};

static pcre2_code *compile_re(const char *pat, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "tokenizer: regex compile failed at %zu: %s", (size_t)eo,
                 (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up; interpreter if unavailable */
    return re;
}

/* ---- u64 map for merges ---- */
static bool u64map_init(kvt_u64map *m, uint64_t n) {
    uint64_t cap = 64;
    while (cap < n * 2) cap <<= 1;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->mask = cap - 1;
    return m->keys && m->vals;
}
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}
/* inserts unless present (first insertion = lowest rank wins) */
static void u64map_put(kvt_u64map *m, uint64_t k, uint64_t v) {
    uint64_t h = mix64(k) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == k + 1) return;
        h = (h + 1) & m->mask;
    }
    m->keys[h] = k + 1;
    m->vals[h] = v;
}
static inline bool u64map_get(const kvt_u64map *m, uint64_t k, uint64_t *v) {
    uint64_t h = mix64(k) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == k + 1) {
            *v = m->vals[h];
            return true;
        }
        h = (h + 1) & m->mask;
    }
    return false;
}

kvt_status kvt_bpe_init(kvt_tokenizer *t, const kvt_gguf *g, char *err, size_t errlen) {
    /* pre-tokenizer */
    const pre_map *pm = NULL;
    for (size_t i = 0; i < KVT_ARRAY_LEN(k_pre); i++)
        if (!strcmp(t->pre_name, k_pre[i].name)) pm = &k_pre[i];
    if (!pm) {
        KVT_WARN("tokenizer: unknown pre-tokenizer '%s'; using gpt2", t->pre_name);
        pm = &k_pre[0];
    }
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pm->canon);
    const char *stages[2] = {NULL, NULL};
    switch (pm->kind) {
    case 0: stages[0] = k_re_gpt2; break;
    case 1:
        stages[0] = k_re_llama3;
        t->add_bos = true;
        t->ignore_merges = true;
        break;
    case 2: stages[0] = k_re_llama3; break;
    case 3: stages[0] = k_re_qwen2; break;
    default:
        stages[0] = k_re_digit;
        stages[1] = k_re_gpt2;
        break;
    }
    for (int i = 0; i < 2 && stages[i]; i++) {
        t->re[i] = compile_re(stages[i], err, errlen);
        if (!t->re[i]) return KVT_ERR_UNSUPPORTED;
        t->n_re++;
    }

    /* byte map; every mapped char gets a symbol id (an extra one if the vocab lacks it) */
    kvt_bytes_to_unicode(t->byte_to_cp);
    for (int i = 0; i < 324; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
        char u[4];
        size_t n = kvt_utf8_encode(t->byte_to_cp[b], u);
        t->byte_sym[b] = kvt_tok_add_extra(t, u, n);
        if (t->byte_sym[b] < 0) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "tokenizer: out of memory");
    }

    /* merges */
    kvt_gguf_vtype elem;
    uint64_t nm = 0;
    const void *data;
    if (!kvt_gguf_get_arr(g, "tokenizer.ggml.merges", &elem, &nm, &data) || elem != KVT_GGUF_STRING) {
        KVT_WARN("tokenizer: tokenizer.ggml.merges missing; BPE will emit byte tokens only");
        nm = 0;
    }
    if (nm > (1u << 24)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tokenizer: too many merges");
    if (!u64map_init(&t->merges, nm ? nm : 1)) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "tokenizer: out of memory");
    char *cat = NULL;
    size_t catcap = 0;
    for (uint64_t r = 0; r < nm; r++) {
        const char *s;
        uint64_t l;
        if (!kvt_gguf_get_arr_str(g, "tokenizer.ggml.merges", r, &s, &l)) continue;
        uint64_t sp = 1;
        while (sp < l && s[sp] != ' ') sp++;
        if (l < 3 || sp >= l - 1) {
            KVT_WARN("tokenizer: malformed merge %llu ignored", (unsigned long long)r);
            continue;
        }
        int32_t a = kvt_tok_add_extra(t, s, sp);
        int32_t b = kvt_tok_add_extra(t, s + sp + 1, l - sp - 1);
        if (l > catcap) {
            free(cat);
            catcap = l * 2;
            cat = malloc(catcap);
            if (!cat) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "tokenizer: out of memory");
        }
        memcpy(cat, s, sp);
        memcpy(cat + sp, s + sp + 1, l - sp - 1);
        int32_t c = kvt_tok_add_extra(t, cat, l - 1);
        if (a < 0 || b < 0 || c < 0) {
            free(cat);
            return kvt_errf(err, errlen, KVT_ERR_NOMEM, "tokenizer: out of memory");
        }
        u64map_put(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, (r << 32) | (uint32_t)c);
    }
    free(cat);
    return KVT_OK;
}

void kvt_bpe_free(kvt_tokenizer *t) {
    for (uint32_t i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    t->n_re = 0;
    free(t->merges.keys);
    free(t->merges.vals);
    t->merges.keys = NULL;
    t->merges.vals = NULL;
}

size_t kvt_bpe_unmap(const kvt_tokenizer *t, const char *s, size_t len, char *out) {
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        uint32_t n;
        uint32_t cp = kvt_utf8_decode(u + i, len - i, &n);
        if (n == 0) { /* ill-formed token text: copy the byte */
            out[o++] = s[i++];
            continue;
        }
        if (cp < 324 && t->cp_to_byte[cp] >= 0) out[o++] = (char)t->cp_to_byte[cp];
        else {
            memcpy(out + o, s + i, n); /* not in the byte alphabet: keep the character */
            o += n;
        }
        i += n;
    }
    return o;
}

/* ---- merge loop ---- */

typedef struct bsym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t start, end; /* raw byte range in the piece */
} bsym;

typedef struct bcand {
    uint32_t rank;
    uint32_t left; /* index of the left symbol (its start orders ties leftmost-first) */
    int32_t lid, rid, result;
} bcand;

static inline bool cand_less(const bcand *a, const bcand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

typedef struct bheap {
    bcand *v;
    uint32_t n, cap;
} bheap;

static void heap_push(bheap *h, bcand c) {
    if (h->n == h->cap) return; /* cannot happen: the caller sizes the heap for the worst case */
    uint32_t i = h->n++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!cand_less(&c, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static bcand heap_pop(bheap *h) {
    bcand top = h->v[0];
    bcand last = h->v[--h->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        const bcand *best = &last;
        if (l < h->n && cand_less(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && cand_less(&h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void try_pair(const kvt_tokenizer *t, bheap *h, const bsym *s, int32_t li) {
    if (li < 0 || s[li].next < 0) return;
    int32_t ri = s[li].next;
    uint64_t v;
    if (!u64map_get(&t->merges, ((uint64_t)(uint32_t)s[li].id << 32) | (uint32_t)s[ri].id, &v)) return;
    bcand c = {(uint32_t)(v >> 32), (uint32_t)li, s[li].id, s[ri].id, (int32_t)(uint32_t)v};
    heap_push(h, c);
}

static void emit_piece(const kvt_tokenizer *t, const unsigned char *p, size_t n, kvt_idvec *out) {
    char sb[256];
    bsym ssb[64];
    bcand hsb[192];
    if (n == 0) return;
    sb[0] = 0;
    /* ignore_merges: the whole mapped piece may already be a token */
    if (t->ignore_merges) {
        char *m = n * 2 <= sizeof sb ? sb : malloc(n * 2);
        if (!m) {
            out->oom = true;
            return;
        }
        size_t o = 0;
        for (size_t i = 0; i < n; i++) o += kvt_utf8_encode(t->byte_to_cp[p[i]], m + o);
        int32_t id = kvt_tok_lookup(t, m, o);
        if (m != sb) free(m);
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            kvt_idvec_push(out, id);
            return;
        }
    }
    if (n == 1 && (uint32_t)t->byte_sym[p[0]] < t->n_vocab) {
        kvt_idvec_push(out, t->byte_sym[p[0]]);
        return;
    }
    bsym *s = n <= KVT_ARRAY_LEN(ssb) ? ssb : malloc(n * sizeof *s);
    /* each merge pushes at most 2 candidates: n-1 initial + 2(n-1) */
    uint32_t hcap = (uint32_t)(3 * n + 1);
    bheap h = {hcap <= KVT_ARRAY_LEN(hsb) ? hsb : malloc(hcap * sizeof(bcand)), 0, hcap};
    if (!s || !h.v) {
        if (s != ssb) free(s);
        if (h.v != hsb) free(h.v);
        out->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++)
        s[i] = (bsym){t->byte_sym[p[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i, (uint32_t)i + 1};
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, &h, s, (int32_t)i);
    while (h.n) {
        bcand c = heap_pop(&h);
        bsym *l = &s[c.left];
        if (l->id != c.lid || l->next < 0) continue; /* stale */
        bsym *r = &s[l->next];
        if (r->id != c.rid) continue;
        l->id = c.result;
        l->end = r->end;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = (int32_t)c.left;
        r->id = -1;
        try_pair(t, &h, s, l->prev);
        try_pair(t, &h, s, (int32_t)c.left);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if ((uint32_t)s[i].id < t->n_vocab) kvt_idvec_push(out, s[i].id);
        else /* symbol is not a vocabulary token: its byte-chars one by one */
            for (uint32_t b = s[i].start; b < s[i].end; b++) {
                int32_t id = t->byte_sym[p[b]];
                if ((uint32_t)id < t->n_vocab) kvt_idvec_push(out, id);
                else if (t->unk >= 0) kvt_idvec_push(out, t->unk);
            }
    }
    if (s != ssb) free(s);
    if (h.v != hsb) free(h.v);
}

/* Splits [0,len) of text with regex stage k and recurses into later stages; matches and gaps are
 * both pieces. */
static void split_stage(const kvt_tokenizer *t, uint32_t k, const char *text, size_t len, kvt_idvec *out,
                        pcre2_match_data *md) {
    if (len == 0) return;
    if (k >= t->n_re) {
        emit_piece(t, (const unsigned char *)text, len, out);
        return;
    }
    size_t pos = 0;
    while (pos < len && !out->over) {
        int rc = pcre2_match(t->re[k], (PCRE2_SPTR)text, len, pos, 0, md, NULL);
        if (rc < 0) { /* no match (or a match error): the rest is one gap piece */
            split_stage(t, k + 1, text + pos, len - pos, out, md);
            return;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match cannot happen with these patterns; be safe */
            split_stage(t, k + 1, text + pos, len - pos, out, md);
            return;
        }
        if (ms > pos) split_stage(t, k + 1, text + pos, ms - pos, out, md);
        split_stage(t, k + 1, text + ms, me - ms, out, md);
        pos = me;
    }
}

void kvt_bpe_encode(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out, pcre2_match_data *md) {
    split_stage(t, 0, text, len, out, md);
}
