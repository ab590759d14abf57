/*
 * tokenizer.h — tokenizers built from GGUF metadata only: byte-level BPE (tokenizer.ggml.model =
 * gpt2, pre-tokenizer from tokenizer.ggml.pre via PCRE2) and SentencePiece-style BPE (llama), plus
 * UTF-8-safe incremental detokenization.
 *
 * Ownership: kvt_tokenizer copies everything it needs out of the kvt_gguf, so the GGUF may be freed
 * after kvt_tokenizer_create. A tokenizer is immutable after creation and safe to use from many
 * threads at once. kvt_detok is a small per-stream state owned by the caller.
 */
#ifndef KVT_TOKENIZER_H
#define KVT_TOKENIZER_H

#include "../gguf/gguf.h"

typedef struct kvt_tokenizer kvt_tokenizer;

kvt_status kvt_tokenizer_create(const kvt_gguf *g, kvt_tokenizer **out, char *err, size_t errlen);
void kvt_tokenizer_free(kvt_tokenizer *t);

uint32_t kvt_tokenizer_n_vocab(const kvt_tokenizer *t);
int32_t kvt_tokenizer_bos(const kvt_tokenizer *t); /* -1 if none */
int32_t kvt_tokenizer_eos(const kvt_tokenizer *t);
bool kvt_tokenizer_add_bos(const kvt_tokenizer *t); /* per metadata flags and defaults */
/* End-of-generation set: eos, eot, eom plus tokens whose text is <|eot_id|>, <|im_end|>, <|end|>,
 * <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>. */
bool kvt_tokenizer_is_eog(const kvt_tokenizer *t, int32_t id);
/* Token id of an exact token text, -1 if absent. */
int32_t kvt_tokenizer_find(const kvt_tokenizer *t, const char *text);
/* Raw token text as stored in the vocabulary (borrowed). */
const char *kvt_tokenizer_token_text(const kvt_tokenizer *t, int32_t id);
/* A stable hash of the vocabulary, merges/scores, pre-type and flags (enters the SSD compat key). */
uint64_t kvt_tokenizer_hash(const kvt_tokenizer *t);
const char *kvt_tokenizer_model_name(const kvt_tokenizer *t); /* "gpt2" / "llama" */
const char *kvt_tokenizer_pre_name(const kvt_tokenizer *t);   /* resolved pre-tokenizer */

/* Encode text (len bytes, may contain invalid UTF-8, which is handled byte-wise, never rejected).
 * add_bos: prepend BOS when the model wants it (caller passes kvt_tokenizer_add_bos(t) normally).
 * parse_special: recognise control tokens written as text (chat templates: true; user text: false).
 * Writes up to cap ids; returns the total number needed (call again with a bigger buffer if > cap),
 * or -1 on allocation failure. */
int64_t kvt_tokenize(const kvt_tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t *ids, int64_t cap);

/* Bytes of one token's text as it appears in output (byte-level mapping undone, ▁ -> space,
 * <0xXX> -> byte). Control tokens render as their text only if render_special. Returns the number
 * of bytes (may exceed cap; then call again). */
int32_t kvt_token_to_bytes(const kvt_tokenizer *t, int32_t id, bool render_special, char *buf, int32_t cap);

/* Whole-sequence decode into a malloc'd NUL-terminated string (caller frees). Applies the SPM
 * leading-space strip when add_space_prefix is set and the first token is not special. */
char *kvt_detokenize(const kvt_tokenizer *t, const int32_t *ids, int64_t n, bool render_special, size_t *out_len);

/* Incremental, UTF-8-safe streaming detokenizer: push ids one at a time; each push returns the
 * bytes that are now complete code points (never half a code point). Flush returns whatever is left
 * (invalid trailing bytes are emitted as U+FFFD). Concatenating all outputs equals kvt_detokenize. */
typedef struct kvt_detok kvt_detok;
kvt_detok *kvt_detok_create(const kvt_tokenizer *t, bool render_special);
void kvt_detok_free(kvt_detok *d);
/* Returns a pointer to the new text (borrowed, valid until next call) and its length in *len. */
const char *kvt_detok_push(kvt_detok *d, int32_t id, size_t *len);
const char *kvt_detok_flush(kvt_detok *d, size_t *len);

/* ---- additions (add-only) ---- */

/* Flags for kvt_tokenize_ex. KVT_TOK_ADD_SPECIAL = kvt_tokenize's add_bos (BOS, and EOS when
 * tokenizer.ggml.add_eos_token is set). KVT_TOK_NO_SPACE_PREFIX: the text continues earlier text
 * (e.g. tokenizing a generated reply on its own), so SPM adds no dummy space before the first
 * fragment (fragments after special tokens still get one). */
enum { KVT_TOK_ADD_SPECIAL = 1, KVT_TOK_PARSE_SPECIAL = 2, KVT_TOK_NO_SPACE_PREFIX = 4 };
int64_t kvt_tokenize_ex(const kvt_tokenizer *t, const char *text, size_t len, uint32_t flags,
                        int32_t *ids, int64_t cap);
/* kvt_tokenize_ex that gives up early: with limit > 0 it stops at the first piece/chunk boundary
 * after more than limit ids were produced and returns that count (> limit, not the full count), so
 * an over-long text costs time and memory for about limit tokens, not for all of it. Untrusted
 * text: reject it first when len / kvt_tokenizer_max_token_bytes(t) already exceeds the limit.
 * limit <= 0: no limit (exactly kvt_tokenize_ex). */
int64_t kvt_tokenize_limit(const kvt_tokenizer *t, const char *text, size_t len, uint32_t flags, int32_t *ids,
                           int64_t cap, int64_t limit);
/* Upper bound on the input bytes a single token can stand for (the longest vocabulary text, at
 * least 4): a text of len bytes needs at least ceil(len / this) tokens. */
uint32_t kvt_tokenizer_max_token_bytes(const kvt_tokenizer *t);
bool kvt_tokenizer_add_eos(const kvt_tokenizer *t);
bool kvt_tokenizer_add_space_prefix(const kvt_tokenizer *t);
/* Token type from tokenizer.ggml.token_type (0 undefined, 1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte); -1 for an out-of-range id. */
int32_t kvt_tokenizer_token_type(const kvt_tokenizer *t, int32_t id);

/* Replaces every ill-formed UTF-8 sequence (maximal subpart rule) by U+FFFD. Malloc'd,
 * NUL-terminated, caller frees. kvt_detok's stream equals kvt_utf8_sanitize(kvt_detokenize(...)):
 * kvt_detokenize itself is byte-exact (it returns whatever bytes the tokens encode). */
char *kvt_utf8_sanitize(const char *s, size_t len, size_t *out_len);
/* Length of the longest prefix of s[0..len) made of whole, valid code points plus ill-formed
 * sequences that can never become valid (for streaming). */
size_t kvt_utf8_complete_prefix(const char *s, size_t len);

#endif
