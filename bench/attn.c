// bench/attn.c — benchmark of block-reading attention (kvt_attention, kvt_attention_split).
// Built on demand (not part of `make all`): `make build/bench/attn` (links build/libkvtier.a; the KV
// code runs on the kernels' vector ops, kernels/vec.h):
//   build/bench/attn [SHAPE [CODEC]]   (optional: a shape name, smol-135m or qwen3-0.6b, and a codec name
//                                      as printed, e.g. f16, to run only those)
//   build/bench/attn --split [THREADS [DEPTH [SHAPE [CODEC]]]]   (default 2 threads, depth 16384)
// The default mode is single-threaded; --split times the decode step's attention on a thread pool.
// Reports, per model shape (one layer, block_tokens 256) and codec:
//   - decode: ms per call, one query over a context of 1k/4k/8k tokens, all heads (h0=0, h1=n_head);
//   - prefill: queries/s for 512 queries at positions [0,512) (a fresh prompt) and [3584,4096).
// Times are thread CPU time (CLOCK_THREAD_CPUTIME_ID), so a loaded machine inflates them less than
// wall time would; each figure is the median of 5 repetitions, a repetition averaging enough calls
// to last ~20 ms.
// --split reports, per shape and codec, wall ms per decode row (one query at position DEPTH - 1,
// all heads) of 8 layers taken in turn (96 MiB of f16 KV for smol-135m at 16384, more than a
// last-level cache), split across THREADS threads two ways: "heads", the forward pass's split
// without split-K (KV heads when they divide among the threads, else query heads), and "split-K"
// (kvt_attention_split). Wall time, median of 7 alternated repetitions of ~0.2 s each, and the
// process CPU time per row of the same repetition (all threads; on a shared machine it moves less
// than the wall time, barrier spinning included); the two outputs are checked equal bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "util/threadpool.h"

typedef struct shape {
    const char *name;
    uint32_t n_head, n_kv, hd;
} shape;

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(g_rng >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static double wall_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

/* n_layers identical FULL layers, each with its own random K/V. */
static void ctx_init(ctx *c, shape sh, kvt_codec codec, uint32_t n_ctx, uint32_t n_layers) {
    kvt_layer_desc d[8];
    for (uint32_t il = 0; il < n_layers; il++)
        d[il] = (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = sh.n_kv, .head_dim_k = sh.hd, .head_dim_v = sh.hd,
                                 .codec = codec};
    char err[200];
    kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(d, n_layers, 256, base, 0, &c->l, err, sizeof err) != KVT_OK) {
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
        for (uint32_t il = 0; il < n_layers; il++) {
            for (uint32_t i = 0; i < sh.n_kv * sh.hd; i++) k[i] = frand() * 2, v[i] = frand();
            kvt_seq_write_kv(c->s, il, t, k, v);
        }
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

/* ---- --split ---- */
#define SPLIT_LAYERS 8

typedef struct split_bench {
    ctx *c;
    uint32_t pos, layer;
    int splitk;
    float *out, *shared, **scratch;
    kvt_threadpool *tp;
} split_bench;

/* One decode row's attention on every thread of the pool: split-K, or the forward pass's head split
 * (model.c dense_attention: KV heads when they divide among the threads, else query heads in
 * ceil(n_head / nth) runs). */
static void split_task(void *arg, int ith, int nth) {
    const split_bench *b = arg;
    const shape sh = b->c->sh;
    const uint32_t qd = sh.n_head * sh.hd;
    const float scale = 1.0f / sqrtf((float)sh.hd);
    if (b->splitk) {
        kvt_attention_split(b->c->s, b->layer, b->c->q, b->pos, sh.n_head, scale, b->out, b->shared, b->scratch[ith], b->tp,
                            ith, nth);
        return;
    }
    const bool by_kv = sh.n_kv % (uint32_t)nth == 0;
    const uint32_t n = by_kv ? sh.n_kv : sh.n_head, per = (n + (uint32_t)nth - 1) / (uint32_t)nth, mul = by_kv ? sh.n_head / sh.n_kv : 1;
    const uint32_t h0 = (uint32_t)ith * per < n ? (uint32_t)ith * per : n, h1 = h0 + per < n ? h0 + per : n;
    if (h0 < h1)
        kvt_attention(b->c->s, b->layer, b->c->q, 1, qd, b->pos, sh.n_head, scale, h0 * mul, h1 * mul, b->out, qd,
                      b->scratch[ith]);
}

static double proc_cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall seconds per decode row over ~0.2 s of rows, the layers in turn; *cpu gets the process CPU
 * seconds per row. */
static double split_rep(split_bench *b, double *cpu) {
    const double c0 = proc_cpu_sec(), t0 = wall_sec();
    double t = 0;
    uint32_t calls = 0;
    while ((t = wall_sec() - t0) < 0.2) {
        b->layer = calls++ % SPLIT_LAYERS;
        kvt_threadpool_run(b->tp, split_task, b);
    }
    *cpu = (proc_cpu_sec() - c0) / calls;
    return t / calls;
}

static int split_main(int nth, uint32_t depth, const char *only_shape, const char *only_codec, const shape *shapes,
                      int n_shapes, const kvt_codec *codecs, int n_codecs) {
    kvt_threadpool *tp = kvt_threadpool_create(nth);
    if (!tp) return 1;
    int status = 0;
    for (int si = 0; si < n_shapes; si++) {
        if (only_shape && strcmp(only_shape, shapes[si].name) != 0) continue;
        for (int ci = 0; ci < n_codecs; ci++) {
            char cn[32];
            kvt_codec_name(codecs[ci], cn, sizeof cn);
            if (only_codec ? strcmp(only_codec, cn) != 0 : codecs[ci].kind != KVT_CODEC_F16) continue;
            ctx c;
            ctx_init(&c, shapes[si], codecs[ci], depth, SPLIT_LAYERS);
            if (!kvt_attention_split_ok(c.l, 0, shapes[si].n_head)) {
                printf("%-11s %-10s split-K does not take this codec\n", shapes[si].name, cn);
                ctx_free(&c);
                continue;
            }
            const size_t od = (size_t)shapes[si].n_head * shapes[si].hd;
            float *outs[2] = {malloc(od * sizeof(float)), malloc(od * sizeof(float))};
            float *shared = malloc(kvt_attention_split_floats(shapes[si].n_head, depth) * sizeof(float));
            float **scr = malloc((size_t)nth * sizeof(float *));
            for (int t = 0; t < nth; t++) scr[t] = malloc(kvt_attention_scratch_floats(c.l, depth) * sizeof(float));
            split_bench b[2];
            double r[2][7], cpu[2][7];
            for (int m = 0; m < 2; m++) {
                b[m] = (split_bench){&c, depth - 1, 0, m, outs[m], shared, scr, tp};
                kvt_threadpool_run(tp, split_task, &b[m]); /* layer 0: the outputs compared below */
            }
            const int same = memcmp(outs[0], outs[1], od * sizeof(float)) == 0;
            for (int rep = 0; rep < 7; rep++)
                for (int m = 0; m < 2; m++) r[m][rep] = split_rep(&b[m], &cpu[m][rep]);
            for (int m = 0; m < 2; m++) {
                qsort(r[m], 7, sizeof(double), cmpd);
                qsort(cpu[m], 7, sizeof(double), cmpd);
            }
            printf("%-11s %-10s depth %5u, %d threads: heads %7.3f ms/row (cpu %7.3f), split-K %7.3f ms/row (cpu %7.3f), "
                   "wall %.2fx, outputs %s\n",
                   shapes[si].name, cn, depth, nth, r[0][3] * 1e3, cpu[0][3] * 1e3, r[1][3] * 1e3, cpu[1][3] * 1e3,
                   r[0][3] / r[1][3], same ? "identical" : "DIFFER");
            fflush(stdout);
            for (int t = 0; t < nth; t++) free(scr[t]);
            free(scr), free(shared), free(outs[0]), free(outs[1]);
            ctx_free(&c);
            if (!same) status = 1;
        }
    }
    kvt_threadpool_free(tp);
    return status;
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
    if (argc > 1 && !strcmp(argv[1], "--split")) {
        const int nth = argc > 2 ? atoi(argv[2]) : 2;
        const long depth = argc > 3 ? atol(argv[3]) : 16384;
        if (nth < 1 || nth > 256 || depth < 1 || depth > (1l << 24)) {
            fprintf(stderr, "usage: attn --split [THREADS [DEPTH [SHAPE [CODEC]]]]\n");
            return 2;
        }
        return split_main(nth, (uint32_t)depth, argc > 4 ? argv[4] : NULL, argc > 5 ? argv[5] : NULL, shapes, 2, codecs,
                          n_codecs);
    }
    const uint32_t ctxs[3] = {1024, 4096, 8192};
    for (int si = 0; si < 2; si++) {
        if (argc > 1 && strcmp(argv[1], shapes[si].name) != 0) continue;
        for (int ci = 0; ci < n_codecs; ci++) {
            char cn[32];
            kvt_codec_name(codecs[ci], cn, sizeof cn);
            if (argc > 2 && strcmp(argv[2], cn) != 0) continue;
            for (int xi = 0; xi < 3; xi++) {
                ctx c;
                ctx_init(&c, shapes[si], codecs[ci], ctxs[xi], 1);
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
