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
 * size or alone in decode: decode == full recompute, chunked == unchunked, and a sequence restored
 * from a snapshot at ANY position continues exactly as the cold run did. That is why the chunk
 * rows (k, U, G of the positions since the last chunk boundary) are part of the state.
 *
 * State layout of one layer (f32, kvt_dn_state_bytes): conv[(K-1) * conv_dim] (raw projections of
 * the last K-1 tokens, oldest first), S[H_v][d][d] (row = v dim, column = k dim), then the rows of
 * the open chunk: kbuf[C][H_v][d], ubuf[C][H_v][d], gbuf[C][H_v]. A zeroed buffer is the state
 * of an empty sequence. Ownership: the caller owns every buffer; nothing here allocates.
 */
#ifndef KVT_DELTANET_H
#define KVT_DELTANET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_DN_CHUNK 64

typedef struct kvt_dn_dims {
    uint32_t n_k_heads; /* H_k: q/k heads */
    uint32_t n_v_heads; /* H_v: v heads; v head h reads q/k head h % H_k */
    uint32_t d;         /* head dim of q, k and v */
    uint32_t conv_k;    /* causal conv taps K (>= 1) */
} kvt_dn_dims;

typedef enum kvt_dn_impl { KVT_DN_SCALAR = 0, KVT_DN_AVX2 = 1 } kvt_dn_impl;

/* conv_dim = 2*H_k*d + H_v*d (q, k, v channels in that order). */
uint32_t kvt_dn_conv_dim(const kvt_dn_dims *dm);
size_t kvt_dn_state_bytes(const kvt_dn_dims *dm);
/* Best implementation this CPU runs (AVX2+FMA if present, unless KVT_NO_SIMD=1). */
kvt_dn_impl kvt_dn_best_impl(void);

/* Causal depthwise conv + silu for channels [ch0, ch1) of n consecutive tokens. u: n rows of raw
 * projections (row stride conv_dim); w: [conv_dim][K] taps (tap K-1 = current token); out: n rows
 * (stride conv_dim). Updates the conv part of `state` for those channels. */
void kvt_dn_conv(const kvt_dn_dims *dm, const float *w, float *state, const float *u, uint32_t n, float *out,
                 uint32_t ch0, uint32_t ch1);

/* Delta rule for v heads [h0, h1) of n consecutive tokens at positions pos0..pos0+n-1 (the state
 * must be the state at pos0). qkv: n rows (stride conv_dim) of conv outputs whose q and k heads
 * are already L2-normalized; beta, g: n rows of H_v values (write strength in (0,1), log decay
 * <= 0); out: n rows (stride H_v*d), head h at h*d. Threads may run disjoint head ranges at once. */
void kvt_dn_rows(const kvt_dn_dims *dm, kvt_dn_impl impl, float *state, const float *qkv, const float *beta,
                 const float *g, uint32_t pos0, uint32_t n, float *out, uint32_t h0, uint32_t h1);

/* The plain token recurrence (README math, one token at a time) on a separate reference state
 * holding only S[H_v][d][d]; for tests. Same argument meaning as kvt_dn_rows, all heads. */
void kvt_dn_recurrence_ref(const kvt_dn_dims *dm, float *S, const float *qkv, const float *beta, const float *g,
                           uint32_t n, float *out);

#endif
