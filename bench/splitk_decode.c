// bench/splitk_decode.c — whole-model decode speed at a long context, split-K attention on and off
// in one process (issue 27). Built on demand: `make build/bench/splitk_decode`.
//   build/bench/splitk_decode MODEL.gguf [THREADS=2] [DEPTH=16384] [TOKENS=64] [ROUNDS=3]
// A cold prefill of DEPTH tokens costs minutes on a small machine (its attention is quadratic), and
// KVT_SPLITK is read when a context is created, so instead of two `kvtier bench --decode-at` runs
// this fills one sequence's f16 KV with random K/V rows for DEPTH positions (decode speed does not
// depend on the values), then alternates two contexts over clones of it: one created with
// KVT_SPLITK=0 (the query-head split) and one with it unset (split-K where it pays). Each round
// decodes TOKENS greedy tokens per context; prints wall tok/s per round and the median, and
// whether the two contexts produced the same logits (they must: split-K is bit-identical).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [THREADS] [DEPTH] [TOKENS] [ROUNDS]\n", argv[0]);
        return 2;
    }
    const int nth = argc > 2 ? atoi(argv[2]) : 2;
    const uint32_t depth = argc > 3 ? (uint32_t)atoi(argv[3]) : 16384;
    const uint32_t n_tok = argc > 4 ? (uint32_t)atoi(argv[4]) : 64;
    const int rounds = argc > 5 ? atoi(argv[5]) : 3;
    if (nth < 1 || depth < 1 || n_tok < 1 || rounds < 1 || rounds > 64) return 2;
    char err[256];
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    if (kvt_gguf_open(argv[1], &g, err, sizeof err) != KVT_OK || kvt_model_load(g, &m, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    const kvt_hparams *hp = kvt_model_hparams(m);
    const uint32_t V = hp->n_vocab, KD = hp->n_head_kv * hp->head_dim;
    kvt_codec *codecs = calloc(hp->n_layer, sizeof(kvt_codec));
    kvt_layer_desc *d = calloc(hp->n_layer, sizeof(kvt_layer_desc));
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i].kind = KVT_CODEC_F16;
    kvt_model_layer_descs(m, codecs, d);
    kvt_kv_layout *l = NULL;
    const kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(d, hp->n_layer, 256, base, 0, &l, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "layout: %s\n", err);
        return 1;
    }
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_ctx *c[2] = {NULL, NULL}; /* 0: KVT_SPLITK=0, 1: default */
    for (int k = 0; k < 2; k++) {
        if (k == 0) setenv("KVT_SPLITK", "0", 1);
        else unsetenv("KVT_SPLITK");
        if (kvt_ctx_create(m, nth, 512, &c[k]) != KVT_OK || kvt_ctx_reserve(c[k], l, depth + n_tok + 16) != KVT_OK) {
            fprintf(stderr, "ctx\n");
            return 1;
        }
    }
    /* the context: DEPTH positions of random K/V in every layer, tokens 1, 2, 3, ... */
    kvt_seq *s0 = NULL;
    float *kv = malloc(sizeof(float) * KD);
    int32_t *toks = malloc(sizeof(int32_t) * depth);
    uint64_t rng = 88172645463325252ull;
    if (!kv || !toks || kvt_seq_create(pool, 1, &s0) != KVT_OK || kvt_seq_prepare(s0, depth) != KVT_OK) return 1;
    for (uint32_t t = 0; t < depth; t++) {
        for (uint32_t il = 0; il < hp->n_layer; il++) {
            for (uint32_t i = 0; i < KD; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                kv[i] = (float)(rng >> 40) / 16777216.0f * 2.0f - 1.0f;
            }
            kvt_seq_write_kv(s0, il, t, kv, kv);
        }
        toks[t] = (int32_t)(1 + t % (V - 1));
    }
    if (kvt_seq_commit(s0, toks, depth) != KVT_OK) return 1;
    float *first[2] = {malloc(sizeof(float) * V), malloc(sizeof(float) * V)};
    double tps[2][64];
    printf("decode at depth %u, %d threads, %u tokens per round (wall tok/s):\n", depth, nth, n_tok);
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            kvt_seq *s = NULL;
            if (kvt_seq_clone(s0, &s) != KVT_OK) return 1;
            int32_t tok = 1;
            float *lg = NULL;
            const double t0 = now_s();
            for (uint32_t i = 0; i < n_tok; i++) {
                if (kvt_model_forward(c[k], s, &tok, 1, false, NULL, &lg) != KVT_OK) return 1;
                if (i == 0 && r == 0) memcpy(first[k], lg, sizeof(float) * V);
                tok = (int32_t)argmax(lg, V);
            }
            tps[k][r] = n_tok / (now_s() - t0);
            printf("  round %d %-26s %7.2f tok/s\n", r + 1, k ? "split-K (default)" : "query heads (KVT_SPLITK=0)",
                   tps[k][r]);
            fflush(stdout);
            kvt_seq_free(s);
        }
    for (int k = 0; k < 2; k++) qsort(tps[k], (size_t)rounds, sizeof(double), cmp_d);
    printf("median: query heads %.2f tok/s, split-K %.2f tok/s (%.2fx); first-step logits %s\n", tps[0][rounds / 2],
           tps[1][rounds / 2], tps[1][rounds / 2] / tps[0][rounds / 2],
           memcmp(first[0], first[1], sizeof(float) * V) ? "DIFFER" : "identical");
    kvt_seq_free(s0);
    for (int k = 0; k < 2; k++) kvt_ctx_free(c[k]), free(first[k]);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
    kvt_model_free(m);
    kvt_gguf_free(g);
    free(codecs), free(d), free(kv), free(toks);
    return 0;
}
