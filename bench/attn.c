// bench/attn.c — single-thread benchmark of block-reading attention (kvt_attention).
// Built on demand (not part of `make all`): `make build/bench/attn` (links build/libkvtier.a; the KV
// code runs on the kernels' vector ops, kernels/vec.h):
//   build/bench/attn [SHAPE [CODEC]]   (optional: a shape name, smol-135m or qwen3-0.6b, and a codec name
//                                      as printed, e.g. f16, to run only those)
// Reports, per model shape (one layer, block_tokens 256) and codec:
//   - decode: ms per call, one query over a context of 1k/4k/8k tokens, all heads (h0=0, h1=n_head);
//   - prefill: queries/s for 512 queries at positions [0,512) (a fresh prompt) and [3584,4096).
// Times are thread CPU time (CLOCK_THREAD_CPUTIME_ID), so a loaded machine inflates them less than
// wall time would; each figure is the median of 5 repetitions, a repetition averaging enough calls
// to last ~20 ms.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"

typedef struct shape {
    const char *name;
    uint32_t n_head, n_kv, hd;
} shape;

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(g_rng >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct ctx {
    kvt_kv_layout *l;
    kvt_block_pool *p;
    kvt_seq *s;
    float *q, *o, *scratch;
    shape sh;
} ctx;

static void ctx_init(ctx *c, shape sh, kvt_codec codec, uint32_t n_ctx) {
    kvt_layer_desc d = {.kind = KVT_KIND_FULL, .n_kv_heads = sh.n_kv, .head_dim_k = sh.hd, .head_dim_v = sh.hd,
                        .codec = codec};
    char err[200];
    kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(&d, 1, 256, base, 0, &c->l, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    c->sh = sh;
    c->p = kvt_block_pool_create(c->l, 0);
    kvt_seq_create(c->p, 1, &c->s);
    kvt_seq_prepare(c->s, n_ctx);
    float *k = malloc(sizeof(float) * sh.n_kv * sh.hd), *v = malloc(sizeof(float) * sh.n_kv * sh.hd);
    int32_t *toks = malloc(sizeof(int32_t) * n_ctx);
    for (uint32_t t = 0; t < n_ctx; t++) {
        for (uint32_t i = 0; i < sh.n_kv * sh.hd; i++) k[i] = frand() * 2, v[i] = frand();
        kvt_seq_write_kv(c->s, 0, t, k, v);
        toks[t] = (int32_t)t;
    }
    kvt_seq_commit(c->s, toks, n_ctx);
    free(k), free(v), free(toks);
    c->q = malloc(sizeof(float) * 512 * sh.n_head * sh.hd);
    c->o = malloc(sizeof(float) * 512 * sh.n_head * sh.hd);
    for (uint32_t i = 0; i < 512 * sh.n_head * sh.hd; i++) c->q[i] = frand();
    c->scratch = malloc(sizeof(float) * kvt_attention_scratch_floats(c->l, n_ctx));
}

static void ctx_free(ctx *c) {
    kvt_seq_free(c->s);
    kvt_block_pool_free(c->p);
    kvt_kv_layout_free(c->l);
    free(c->q), free(c->o), free(c->scratch);
}

/* median over 5 reps of seconds per call */
static double time_calls(ctx *c, uint32_t pos0, uint32_t n_q) {
    const uint32_t qd = c->sh.n_head * c->sh.hd;
    const float scale = 1.0f / sqrtf((float)c->sh.hd);
    kvt_attention(c->s, 0, c->q, n_q, qd, pos0, c->sh.n_head, scale, 0, c->sh.n_head, c->o, qd, c->scratch);
    double t0 = cpu_sec();
    kvt_attention(c->s, 0, c->q, n_q, qd, pos0, c->sh.n_head, scale, 0, c->sh.n_head, c->o, qd, c->scratch);
    double one = cpu_sec() - t0;
    uint32_t iters = one > 0.02 ? 1 : (uint32_t)(0.02 / (one + 1e-9)) + 1;
    double r[5];
    for (int rep = 0; rep < 5; rep++) {
        t0 = cpu_sec();
        for (uint32_t it = 0; it < iters; it++)
            kvt_attention(c->s, 0, c->q, n_q, qd, pos0, c->sh.n_head, scale, 0, c->sh.n_head, c->o, qd,
                          c->scratch);
        r[rep] = (cpu_sec() - t0) / iters;
    }
    qsort(r, 5, sizeof r[0], cmpd);
    return r[2];
}

int main(int argc, char **argv) {
    const shape shapes[] = {{"smol-135m", 9, 3, 64}, {"qwen3-0.6b", 16, 8, 128}};
    const kvt_codec codecs[] = {{.kind = KVT_CODEC_F16},
                                {.kind = KVT_CODEC_AFFINE, .bits = 8, .group_size = 64},
                                {.kind = KVT_CODEC_AFFINE, .bits = 4, .group_size = 64},
                                {.kind = KVT_CODEC_TURBO, .bits = 8, .vbits = 3},
                                {.kind = KVT_CODEC_TURBO, .bits = 4, .vbits = 4},
                                {.kind = KVT_CODEC_TURBO, .bits = 4, .vbits = 3}};
    const int n_codecs = (int)(sizeof codecs / sizeof *codecs);
    const uint32_t ctxs[3] = {1024, 4096, 8192};
    for (int si = 0; si < 2; si++) {
        if (argc > 1 && strcmp(argv[1], shapes[si].name) != 0) continue;
        for (int ci = 0; ci < n_codecs; ci++) {
            char cn[32];
            kvt_codec_name(codecs[ci], cn, sizeof cn);
            if (argc > 2 && strcmp(argv[2], cn) != 0) continue;
            for (int xi = 0; xi < 3; xi++) {
                ctx c;
                ctx_init(&c, shapes[si], codecs[ci], ctxs[xi]);
                double t = time_calls(&c, ctxs[xi] - 1, 1);
                printf("%-11s %-10s decode ctx %5u: %8.3f ms/call\n", shapes[si].name, cn, ctxs[xi], t * 1e3);
                if (xi == 1) {
                    double tp0 = time_calls(&c, 0, 512), tp1 = time_calls(&c, 4096 - 512, 512);
                    printf("%-11s %-10s prefill 512 q @0:    %8.0f q/s (%.2f ms)   @3584: %8.0f q/s (%.2f ms)\n",
                           shapes[si].name, cn, 512 / tp0, tp0 * 1e3, 512 / tp1, tp1 * 1e3);
                }
                fflush(stdout);
                ctx_free(&c);
            }
        }
    }
    return 0;
}
