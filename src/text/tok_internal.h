/*
 * tok_internal.h — private structures shared by the tokenizer sources in src/text (tokenizer.c,
 * bpe.c, spm.c, unicode.c). Not part of the public contract; only the src/text sources include it.
 *
 * Ownership: everything hangs off kvt_tokenizer and is freed by kvt_tokenizer_free. All tables are
 * built once in kvt_tokenizer_create and read-only afterwards (thread-safe encode/decode).
 */
#ifndef KVT_TOK_INTERNAL_H
#define KVT_TOK_INTERNAL_H

#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

enum {
    KVT_TT_UNDEFINED = 0, KVT_TT_NORMAL = 1, KVT_TT_UNKNOWN = 2, KVT_TT_CONTROL = 3,
    KVT_TT_USER = 4, KVT_TT_UNUSED = 5, KVT_TT_BYTE = 6,
};

typedef enum { KVT_TOKM_SPM = 1, KVT_TOKM_BPE = 2 } kvt_tok_model;

/* Open-addressing string -> int32 map. Keys are (offset,len) into an external blob that the
 * caller passes to every call. Capacity is a power of two, load <= 1/2. */
typedef struct kvt_strmap {
    int32_t *slots; /* -1 empty, else value index into the key arrays */
    uint32_t mask;
} kvt_strmap;

/* Open-addressing (u64 key -> u64 value) map for BPE merge pairs. */
typedef struct kvt_u64map {
    uint64_t *keys; /* key+1 stored; 0 = empty */
    uint64_t *vals;
    uint64_t mask;
} kvt_u64map;

typedef struct kvt_special {
    int32_t id;
    uint32_t len;
    uint64_t off; /* into text blob */
    uint8_t type;
} kvt_special;

struct kvt_tokenizer {
    kvt_tok_model model;
    char model_name[16];
    char pre_name[32];
    uint32_t n_vocab;
    /* token texts: blob + offsets (n_vocab + n_extra + 1 entries) */
    char *blob;
    uint64_t blob_len, blob_cap;
    uint64_t *off;     /* start of each symbol's text in blob (NUL-terminated there) */
    uint32_t *lens;    /* text length of each symbol */
    uint32_t n_sym;    /* n_vocab + extra BPE symbols (merge parts/results not in the vocab) */
    uint32_t cap_sym;
    uint8_t *type;     /* per vocab id */
    float *scores;     /* SPM; NULL for BPE */
    kvt_strmap map;    /* text -> symbol id (vocab ids first, extra ids >= n_vocab) */

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    uint8_t *eog;      /* per vocab id, 1 if end-of-generation */

    kvt_special *specials; /* sorted by length desc, then id */
    uint32_t n_specials;
    /* buckets by first byte: indices into specials (in specials order) */
    uint32_t *sp_bucket_start; /* 257 entries */
    uint32_t *sp_bucket;

    /* BPE */
    kvt_u64map merges;      /* (left<<32|right) -> (rank<<32 | result) */
    int32_t byte_sym[256];  /* symbol id of the byte-mapped char of each byte, -1 if absent */
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324]; /* inverse map for code points < 324, -1 otherwise */
    pcre2_code *re[3];      /* pre-tokenizer stages, applied in order (llama.cpp semantics) */
    uint32_t n_re;

    /* SPM */
    int32_t byte_tok[256];  /* <0xXX> token (or single-byte token), -1 if absent */
    bool spm_split_ws;      /* text may be cut before each U+2581 run (see spm.c) */

    uint32_t max_token_len; /* longest vocabulary token text in bytes (kvt_tokenizer_max_token_bytes) */
    uint64_t hash;
};

/* string map helpers (tokenizer.c) */
int32_t kvt_tok_lookup(const kvt_tokenizer *t, const char *s, size_t len);
static inline const char *kvt_tok_text(const kvt_tokenizer *t, int32_t id, uint32_t *len) {
    *len = t->lens[id];
    return t->blob + t->off[id];
}
/* Appends a symbol that is not a vocab token (BPE merge parts); returns its id or -1. */
int32_t kvt_tok_add_extra(kvt_tokenizer *t, const char *s, size_t len);

/* growable id vector; with limit > 0, `over` is set once more than limit ids were pushed and the
 * encoders stop at their next piece/chunk boundary (kvt_tokenize_limit) */
typedef struct kvt_idvec {
    int32_t *v;
    int64_t n, cap;
    int64_t limit;
    bool oom, over;
} kvt_idvec;
void kvt_idvec_push(kvt_idvec *v, int32_t id);

/* unicode.c */
uint32_t kvt_utf8_seq_len(const unsigned char *s, size_t len); /* length of a valid sequence at s, 0 if invalid/incomplete */
size_t kvt_utf8_encode(uint32_t cp, char *out);                 /* 1..4 bytes */
uint32_t kvt_utf8_decode(const unsigned char *s, size_t len, uint32_t *n); /* valid only */
void kvt_bytes_to_unicode(uint32_t byte_to_cp[256]);

/* bpe.c */
kvt_status kvt_bpe_init(kvt_tokenizer *t, const kvt_gguf *g, char *err, size_t errlen);
void kvt_bpe_free(kvt_tokenizer *t);
/* encodes one raw fragment (no specials inside) */
void kvt_bpe_encode(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out,
                    pcre2_match_data *md);
/* decodes a byte-mapped token text into raw bytes; returns the number of bytes written (<= len) */
size_t kvt_bpe_unmap(const kvt_tokenizer *t, const char *s, size_t len, char *out);

/* spm.c */
void kvt_spm_init(kvt_tokenizer *t);
/* encodes one fragment already escaped (spaces as U+2581, dummy prefix added) */
void kvt_spm_encode(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out);
/* allow_split = false: never cut at U+2581 runs (reference path for tests) */
void kvt_spm_encode_opt(const kvt_tokenizer *t, const char *text, size_t len, kvt_idvec *out, bool allow_split);

#endif
