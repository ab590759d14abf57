/*
 * spec.h — speculative decoding with a draft model (issue 29, docs/speculative.md): a second, small
 * model with the target's vocabulary proposes up to draft_max tokens per round, the target checks
 * them all in one forward pass (the logits of every position) and keeps the longest accepted
 * prefix plus one token of its own, so one target pass can emit several tokens.
 *
 * This header is the draft side: kvt_spec (one per engine) holds the draft model, its KV layout
 * (always f16, its own block pool) and its compute context; kvt_spec_row (one per speculating row)
 * holds the row's draft sequence, the row's tokens so far, and the proposal of the current round.
 * The target side (verify pass, acceptance, rollback of the target's sequence) is in row.c; the
 * acceptance rule itself in spec_verify.h.
 *
 * The draft's state in the tiers (companion.h): with a tier manager attached (kvt_spec_set_tiers), a
 * row's draft sequence starts from the longest prefix of the prompt the draft's tiers hold (RAM,
 * SSD, shared) and enters them when the row ends, so a restored conversation pays no draft prefill.
 *
 * Ownership / threading: the engine creates kvt_spec after its own model and frees it after the
 * scheduler stopped (no row left) and after the companion tiers (they borrow the draft's pool). A kvt_spec_row is owned by its row (row.h) and used by the one
 * thread that drives the row at a time; kvt_spec_propose serialises the rows' use of the draft's
 * compute context with a mutex of kvt_spec (rows of the scheduler and an inline --parallel 1
 * generation may propose at the same time). Stats may be read from any thread.
 */
#ifndef KVT_SPEC_H
#define KVT_SPEC_H

#include "../cache/tier.h"
#include "../text/tokenizer.h"
#include "sampler.h"

typedef struct kvt_spec kvt_spec;
typedef struct kvt_spec_row kvt_spec_row;

typedef struct kvt_spec_opts {
    const char *model_path; /* --draft-model */
    uint32_t draft_max;     /* tokens proposed per round at most, 1..KVT_SPEC_MAX_DRAFT */
    uint32_t draft_min;     /* a shorter proposal is dropped (the row decodes one token plainly) */
    float p_min;            /* the draft stops proposing where its top probability is below this */
    int n_threads;          /* the draft's compute threads (--draft-threads) */
    uint32_t ubatch;        /* its forward chunk (the target's) */
    uint32_t n_ctx;         /* the target's context: the longest a draft sequence gets */
    uint32_t block_tokens;  /* KV block size of the draft's layout */
    uint32_t rows;          /* draft sequences alive at once at most (sizes the draft's block pool) */
} kvt_spec_opts;

/* Loads the draft (its file held open and watched from before it is mapped, file_watch.h) and checks it against the target: the same vocabulary (every token's text and
 * type, and the number of logits), else KVT_ERR_INVALID_ARG naming the first differing token; a
 * draft with recurrent layers (its state cannot be cut back) is KVT_ERR_UNSUPPORTED. */
kvt_status kvt_spec_create(const kvt_spec_opts *o, const kvt_tokenizer *target_tok, uint32_t target_n_vocab,
                           kvt_spec **out, char *err, size_t errlen);
/* The memory the draft needs beside its RAM tier (the memory budget's "draft model" part): its
 * file's mapping, its weight copies, its compute context and the KV of opts.rows full contexts. */
uint64_t kvt_spec_fixed_bytes(const kvt_spec *s);
double kvt_spec_bytes_per_token(const kvt_spec *s);
/* Creates the draft's block pool: the rows' KV plus cache_bytes for its RAM tier (companion.h).
 * Once, after create and before any row (KVT_ERR_NOMEM). */
kvt_status kvt_spec_open_pool(kvt_spec *s, uint64_t cache_bytes);
void kvt_spec_free(kvt_spec *s);
uint32_t kvt_spec_draft_max(const kvt_spec *s);

typedef struct kvt_spec_stats {
    uint64_t reused[4];         /* prompt tokens of draft state the tiers supplied, by kvt_tier (RAM, SSD,
                                 * shared; [0] unused) */
    uint64_t recomputed;        /* prompt tokens the draft computed although the target's tiers had them */
    uint64_t recompute_rows;    /* rows whose draft recomputed such tokens */
    uint64_t rounds;   /* verify passes of the target */
    uint64_t proposed; /* draft tokens they checked */
    uint64_t accepted; /* draft tokens the target accepted */
    uint64_t off_rows; /* rows that stopped speculating (the draft's KV pool was full) */
    double draft_ms;   /* time in the draft's forward passes and draws */
    double decode_ms;  /* decode time of the rows that speculated (draft + target) */
} kvt_spec_stats;
void kvt_spec_stats_get(kvt_spec *s, kvt_spec_stats *out);

/* ---- the draft's state in the tiers (companion.h) ---- */
/* The draft's KV layout and block pool (owned by kvt_spec: valid until kvt_spec_free). */
const kvt_kv_layout *kvt_spec_layout(const kvt_spec *s);
kvt_block_pool *kvt_spec_pool(kvt_spec *s);
/* Bytes the draft's RAM tier may hold (kvt_spec_open_pool). */
uint64_t kvt_spec_cache_bytes(const kvt_spec *s);
/* The companion compatibility key, "kvtier-companion;target=<first 32 hex of SHA-256(target_key)>;
 * draft=<draft key>": with persist, the draft key is kvt_ssd_compat_key of the held draft file (its
 * content SHA-256, memoized under cache_dir; its KV layout key, so its block size and KV codec;
 * its tokenizer hash; the kernel numerics and the draft model's numerics tag); without, the path,
 * size and mtime with the same scheme and numerics (keys that never leave the process). */
kvt_status kvt_spec_companion_key(kvt_spec *s, const char *target_key, const char *cache_dir, bool persist, char *out,
                                  size_t outlen, char *err, size_t errlen);
/* The companion key given to kvt_spec_set_tiers ("" without tiers); valid until kvt_spec_free. */
const char *kvt_spec_key(const kvt_spec *s);
/* True when the draft file is unchanged since it was loaded (what it computes may enter a tier). */
bool kvt_spec_weights_ok(kvt_spec *s);
/* Attaches the companion tiers (borrowed: they outlive every row) under the companion key. Call once,
 * before any row is created. */
void kvt_spec_set_tiers(kvt_spec *s, kvt_tiers *t, const char *key);

/* A row's draft state for a request of prompt[0..n_prompt) and at most max_new new tokens, with the
 * request's sampling settings (the draft draws with its temperature, top-k, top-p and min-p; greedy
 * settings make it propose its argmax). With tiers attached and use_cache, the draft sequence starts
 * from the longest prefix of look[0..n_look) they hold under namespace ns (one lookup, on the
 * caller's thread; counted in the stats by source, and against target_reused, the tokens of look the
 * target's tiers supplied). look is the prompt, or for a resumed generation checkpoint prompt ++
 * emitted ++ pending (the row's tokens still start from the prompt: the replay pushes the rest). NULL when out of memory (the row then decodes plainly). */
kvt_spec_row *kvt_spec_row_create(kvt_spec *s, const kvt_sampling *sp, const int32_t *prompt, uint32_t n_prompt,
                                  uint32_t max_new, bool use_cache, const char *ns, const int32_t *look, uint32_t n_look,
                                  uint32_t target_reused);
/* A generation checkpoint is being saved at a round boundary: the draft's sealed blocks enter the
 * companion tiers (write-behind), so a resume restores them instead of recomputing the draft. */
void kvt_spec_row_checkpoint(kvt_spec_row *r);
/* Frees the row's draft state; with tiers and use_cache its sequence (its tokens emitted by the row,
 * never a proposal that was not verified) enters the companion tiers first (kvt_tiers_put: never
 * waits for the disk). decode_ms (the row's decode time) enters the stats. NULL is a no-op. */
void kvt_spec_row_free(kvt_spec_row *r, double decode_ms);
/* The row emitted token id (appended to the tokens the draft follows). */
void kvt_spec_row_push(kvt_spec_row *r, int32_t id);
/* One round's proposal after the row's tokens so far (the last one emitted but not yet forwarded
 * by the target): the draft catches up with the tokens it has not seen, then proposes up to k_max
 * tokens, stopping where its top probability is below p_min; a proposal shorter than draft_min is
 * dropped. Returns the number k of proposed tokens (0: decode plainly this round) and points
 * *verify at the k + 1 tokens the target forwards: the last emitted token, then the proposal. A
 * draft failure (out of its KV memory) turns the row's speculation off for good (0 from then on). */
/* seed: the draft's draws of this round (sampled settings) come from a stream seeded by it; the row
 * passes its own sampler's RNG state, so the proposals are a function of state a generation
 * checkpoint records, and a resume proposes what the uninterrupted run did. */
uint32_t kvt_spec_propose(kvt_spec_row *r, uint32_t k_max, uint64_t seed, const int32_t **verify);
/* Proposal i of the current round, and (sampled settings) the draft distribution it was drawn from
 * (n_vocab floats; NULL under greedy settings). */
int32_t kvt_spec_row_token(const kvt_spec_row *r, uint32_t i);
const float *kvt_spec_row_q(const kvt_spec_row *r, uint32_t i);
/* Scratch of n_vocab floats for the target's distribution during verification. */
float *kvt_spec_row_p(kvt_spec_row *r);
/* The round was verified: `accepted` of its `proposed` tokens were accepted (the row has pushed the
 * tokens it emitted). The draft's sequence is cut back to the tokens the row kept; counts stats. */
void kvt_spec_row_verified(kvt_spec_row *r, uint32_t proposed, uint32_t accepted);

#endif
