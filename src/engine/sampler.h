/*
 * sampler.h — token sampling from logits: repetition/presence/frequency penalties over a recent
 * window, then greedy (temperature 0) or temperature + top-k + top-p + min-p with a seeded RNG.
 * Reproducible: the same logits, settings, seed and history give the same token.
 *
 * Ownership: kvt_sampler owns its scratch (allocated once at create, sized by n_vocab) and the
 * history ring; not thread-safe (one per generation).
 */
#ifndef KVT_SAMPLER_H
#define KVT_SAMPLER_H

#include "engine.h"

typedef struct kvt_sampler kvt_sampler;

kvt_sampler *kvt_sampler_create(uint32_t n_vocab);
void kvt_sampler_free(kvt_sampler *s);
/* Start a new generation: settings, seed, empty history. */
void kvt_sampler_reset(kvt_sampler *s, const kvt_sampling *p);
/* Record a token in the penalty history (prompt tail and generated tokens). */
void kvt_sampler_accept(kvt_sampler *s, int32_t id);
/* Pick a token. May modify logits in place (penalties, logit bias). */
int32_t kvt_sampler_sample(kvt_sampler *s, float *logits);
/* The same draw, also filling *lp (when not NULL) with the drawn token's log-probability and the
 * n_top (<= KVT_MAX_TOP_LOGPROBS) most likely tokens: log-softmax of the logits after penalties and
 * bias (temperature 1), which is what the draw restricts and rescales. */
int32_t kvt_sampler_sample_lp(kvt_sampler *s, float *logits, uint32_t n_top, kvt_token_logprobs *lp);
/* Log-softmax facts of a logits row without drawing: *lp for token id (n_top best as above).
 * Pure (no sampler state); exposed for tests and `kvtier run --json`. */
void kvt_logprobs_of(const float *logits, uint32_t n_vocab, int32_t id, uint32_t n_top, kvt_token_logprobs *lp);
/* Whether these settings make every draw the argmax (temperature 0, or top-k 1). */
bool kvt_sampling_greedy(const kvt_sampling *p);
/* Speculative decoding (engine/spec.h): the distribution the next draw from these logits would use,
 * as n_vocab probabilities in probs (0 outside the candidates that top-k, top-p and min-p keep;
 * one-hot on the argmax under greedy settings). Applies the penalties and the logit bias to logits
 * in place first, exactly as kvt_sampler_sample does; draws nothing. */
void kvt_sampler_probs(kvt_sampler *s, float *logits, float *probs);
/* A uniform number in [0, 1) from the sampler's RNG (the draws of speculative verification). */
double kvt_sampler_uniform(kvt_sampler *s);
/* Generation checkpoints (src/engine/checkpoint.h): the RNG position (its whole state) after the
 * last draw, and setting it back. With the same settings (reset) and the same accepted history,
 * a sampler whose RNG is set to a saved state continues exactly as the saved one would have. */
uint64_t kvt_sampler_rng_state(const kvt_sampler *s);
void kvt_sampler_set_rng_state(kvt_sampler *s, uint64_t state);

#endif
