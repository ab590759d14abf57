/*
 * spec_verify.h — the acceptance rule of speculative sampling (docs/speculative.md; Leviathan et al.
 * 2023, Chen et al. 2023) as pure functions over dense distributions, so it can be tested alone.
 *
 * A draft proposed token x drawn from its distribution q; the target's distribution at the same
 * position is p. x is accepted with probability min(1, p[x] / q[x]); otherwise the token is drawn
 * from norm(max(0, p - q)). The token this gives is distributed exactly as p, whatever q is (as
 * long as x really was drawn from q).
 *
 * Ownership: nothing is allocated or kept; the arrays are borrowed for the call. Thread-safe.
 */
#ifndef KVT_SPEC_VERIFY_H
#define KVT_SPEC_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

/* A draw from the weights w[0..n) (non-negative, need not sum to 1) with u uniform in [0, 1):
 * the first i whose running sum exceeds u * sum(w). -1 when every weight is 0 (or n is 0). */
int32_t kvt_spec_draw(const float *w, uint32_t n, double u);

/* One verification: p and q are distributions over n tokens, x (in [0, n)) the draft's token,
 * drawn from q; u_accept and u_resample independent uniforms in [0, 1). Returns the token and sets
 * *accepted (true: the token is x). When the residual max(0, p - q) is zero everywhere (p equal to
 * q within rounding) the resample draws from p itself. -1 for x outside [0, n) or a p of zeros. */
int32_t kvt_spec_verify(const float *p, const float *q, uint32_t n, int32_t x, double u_accept, double u_resample,
                        bool *accepted);

#endif
