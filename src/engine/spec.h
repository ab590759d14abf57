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
 * Ownership / threading: the engine creates kvt_spec after its own model and frees it after the
 * scheduler stopped (no row left). A kvt_spec_row is owned by its row (row.h) and used by the one
 * thread that drives the row at a time; kvt_spec_propose serialises the rows' use of the draft's
 * compute context with a mutex of kvt_spec (rows of the scheduler and an inline --parallel 1
 * generation may propose at the same time). Stats may be read from any thread.
 */
#ifndef KVT_SPEC_H
#define KVT_SPEC_H

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

/* Loads the draft and checks it against the target: the same vocabulary (every token's text and
 * type, and the number of logits), else KVT_ERR_INVALID_ARG naming the first differing token; a
 * draft with recurrent layers (its state cannot be cut back) is KVT_ERR_UNSUPPORTED. */
kvt_status kvt_spec_create(const kvt_spec_opts *o, const kvt_tokenizer *target_tok, uint32_t target_n_vocab,
                           kvt_spec **out, char *err, size_t errlen);
void kvt_spec_free(kvt_spec *s);
uint32_t kvt_spec_draft_max(const kvt_spec *s);

typedef struct kvt_spec_stats {
    uint64_t rounds;   /* verify passes of the target */
    uint64_t proposed; /* draft tokens they checked */
    uint64_t accepted; /* draft tokens the target accepted */
    uint64_t off_rows; /* rows that stopped speculating (the draft's KV pool was full) */
    double draft_ms;   /* time in the draft's forward passes and draws */
    double decode_ms;  /* decode time of the rows that speculated (draft + target) */
} kvt_spec_stats;
void kvt_spec_stats_get(kvt_spec *s, kvt_spec_stats *out);

/* A row's draft state for a request of prompt[0..n_prompt) and at most max_new new tokens, with the
 * request's sampling settings (the draft draws with its temperature, top-k, top-p and min-p; greedy
 * settings make it propose its argmax). NULL when out of memory (the row then decodes plainly). */
kvt_spec_row *kvt_spec_row_create(kvt_spec *s, const kvt_sampling *sp, const int32_t *prompt, uint32_t n_prompt,
                                  uint32_t max_new);
/* Frees the row's draft state; decode_ms (the row's decode time) enters the stats. NULL is a no-op. */
void kvt_spec_row_free(kvt_spec_row *r, double decode_ms);
/* The row emitted token id (appended to the tokens the draft follows). */
void kvt_spec_row_push(kvt_spec_row *r, int32_t id);
/* One round's proposal after the row's tokens so far (the last one emitted but not yet forwarded
 * by the target): the draft catches up with the tokens it has not seen, then proposes up to k_max
 * tokens, stopping where its top probability is below p_min; a proposal shorter than draft_min is
 * dropped. Returns the number k of proposed tokens (0: decode plainly this round) and points
 * *verify at the k + 1 tokens the target forwards: the last emitted token, then the proposal. A
 * draft failure (out of its KV memory) turns the row's speculation off for good (0 from then on). */
uint32_t kvt_spec_propose(kvt_spec_row *r, uint32_t k_max, const int32_t **verify);
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
