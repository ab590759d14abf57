/*
 * deltanet.h — the gated delta rule (Gated DeltaNet, Qwen3.5 linear-attention layers) and its short
 * causal convolution, over a per-sequence state buffer.
 *
 * Algorithm: chunkwise-parallel with chunks aligned to absolute positions (KVT_DN_CHUNK tokens).
 * Within a chunk that starts at position a, with S_a the state at a and G_t the cumulative log
 * decay of the chunk's rows up to t (G_t <= 0):
 *     U_t = beta_t (v_t - e^{G_t} S_a k_t - sum_{s<t} e^{G_t-G_s} (k_s.k_t) U_s)     (forward substitution)
 *     o_t = (e^{G_t} S_a q_t + sum_{s<=t} e^{G_t-G_s} (k_s.q_t) U_s) / sqrt(d)
 * and at the end of the chunk S_{a+C} = e^{G_last} S_a + sum_s e^{G_last-G_s} U_s k_s^T.
 * This is the same state the token recurrence S_t = a_t S_{t-1}(I - b_t k_t k_t^T) + b_t v_t k_t^T
 * produces (exactly in real arithmetic). Row t only depends on rows <= t of its chunk and on S_a,
 * so the result of every token is the same bits whether it is processed in a prefill batch of any
 * size or alone in decode (every sum is an FMA chain in a fixed order, vectorized across outputs,
 * deltanet.c): decode == full recompute, chunked == unchunked, and a sequence restored
 * from a snapshot at ANY position continues exactly as the cold run did. That is why the chunk
 * rows (k, U, G of the positions since the last chunk boundary) are part of the state.
 *
 * State layout of one layer (f32, kvt_dn_state_bytes): conv[(K-1) * conv_dim] (raw projections of
 * the last K-1 tokens, oldest first), S^T[H_v][d][d] (S transposed: row = k dim, column = v dim),
 * then the rows of the open chunk, per head: kT[H_v][d][C] (k transposed: column s = row s of the
 * chunk), U[H_v][C][d], G[H_v][C] (cumulative log decay). Rows of a closed chunk are dead (U is
 * scaled in place when the chunk closes). A zeroed buffer is the state of an empty sequence.
 * Ownership: the caller owns every buffer; nothing here allocates.
 *
 * Implementations: scalar reference (fmaf), AVX2+FMA and AVX-512 (register-tiled products). They
 * give the same bits (deltanet.c), so the choice (kvt_dn_best_impl: the kernels' ISA, or KVT_ISA)
 * never changes results.
 */
#ifndef KVT_DELTANET_H
#define KVT_DELTANET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels/vec.h" /* the elementwise operations and exp (kvt_vec_*) */

#define KVT_DN_CHUNK 64

typedef struct kvt_dn_dims {
    uint32_t n_k_heads; /* H_k: q/k heads */
    uint32_t n_v_heads; /* H_v: v heads; v head h reads q/k head h % H_k */
    uint32_t d;         /* head dim of q, k and v */
    uint32_t conv_k;    /* causal conv taps K (>= 1) */
} kvt_dn_dims;

typedef enum kvt_dn_impl { KVT_DN_SCALAR = 0, KVT_DN_AVX2 = 1, KVT_DN_AVX512 = 2 } kvt_dn_impl;

/* conv_dim = 2*H_k*d + H_v*d (q, k, v channels in that order). */
uint32_t kvt_dn_conv_dim(const kvt_dn_dims *dm);
size_t kvt_dn_state_bytes(const kvt_dn_dims *dm);
/* Implementation matching the kernels' ISA in use (kvt_kernels_isa(): KVT_ISA or the best the CPU
 * runs; KVT_ISA=scalar gives the scalar reference). */
kvt_dn_impl kvt_dn_best_impl(void);

/* exp of every implementation: kvt_vec_exp_clamped (kernels/vec.h). */
/* y[i] = silu(g[i]) * u[i] = g/(1+exp(-g)) * u (u NULL: y = silu(g)); y may alias g or u. */
void kvt_dn_silu_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n);
/* y[i] = u[i] / (1 + exp(-g[i])) = u * sigmoid(g); y may alias g or u. */
void kvt_dn_sigmoid_mul(kvt_dn_impl impl, float *y, const float *g, const float *u, uint32_t n);

/* Causal depthwise conv + silu for channels [ch0, ch1) of n consecutive tokens. u: n rows of raw
 * projections (row stride conv_dim); w: [K][conv_dim] taps, tap-major (tap K-1 = current token);
 * out: n rows (stride conv_dim); out[ch] = silu(fma chain over taps 0..K-1 from +0). Updates the
 * conv part of `state` for those channels. */
void kvt_dn_conv(const kvt_dn_dims *dm, kvt_dn_impl impl, const float *w, float *state, const float *u, uint32_t n,
                 float *out, uint32_t ch0, uint32_t ch1);

/* Delta rule for v heads [h0, h1) of n consecutive tokens at positions pos0..pos0+n-1 (the state
 * must be the state at pos0). qkv: n rows (stride conv_dim) of conv outputs whose q and k heads
 * are already L2-normalized; beta, g: n rows of H_v values (write strength in (0,1), log decay
 * <= 0); out: n rows (stride H_v*d), head h at h*d. Threads may run disjoint head ranges at once. */
void kvt_dn_rows(const kvt_dn_dims *dm, kvt_dn_impl impl, float *state, const float *qkv, const float *beta,
                 const float *g, uint32_t pos0, uint32_t n, float *out, uint32_t h0, uint32_t h1);

/* The plain token recurrence (README math, one token at a time) on a separate reference state
 * holding only S[H_v][d][d] (NOT transposed: row = v dim), in double-precision sums; for tests.
 * Same argument meaning as kvt_dn_rows, all heads. */
void kvt_dn_recurrence_ref(const kvt_dn_dims *dm, float *S, const float *qkv, const float *beta, const float *g,
                           uint32_t n, float *out);

#endif
