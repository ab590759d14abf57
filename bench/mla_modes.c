// bench/mla_modes.c — deepseek2 prefill under --mla-prefill absorbed | expanded | auto, through the
// real forward pass (kvt_model_forward), on a gen-model file (docs/models.md "MLA prefill").
// Built by hand after `make` (not part of the build):
//   cc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/mla_modes.c build/libkvtier.a -lxxhash -lm -o /tmp/bench_mla_modes
//   nice /tmp/bench_mla_modes MODEL.gguf [threads=2] [reps=3] [ctx=4096] [chunk=512] [short=64]
// Workloads (random tokens; each timed in all three modes, alternating mode order every repetition,
// median of reps; wall seconds and process CPU seconds, which are less sensitive to a shared box):
//   pp<chunk>      a <chunk>-token prompt from position 0, one chunk;
//   pp<ctx>        a <ctx>-token prompt in <chunk>-token chunks (the whole chunked prefill);
//   last chunk     the final <chunk> tokens over <ctx> keys, after an absorbed prefill of the rest
//                  (the prefix is computed once and shared through kvt_seq_clone);
//   short chunk    the final <short> tokens over <ctx> keys, likewise.
// The prefix under "last/short chunk" was computed absorbed in every mode: only the timed chunk
// differs, which is what the per-chunk choice decides.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"

static double now(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static void die(const char *what, const char *err) {
    fprintf(stderr, "%s: %s\n", what, err);
    exit(1);
}

enum { MAXREP = 32 };

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [threads=2] [reps=3] [ctx=4096] [chunk=512] [short=64]\n", argv[0]);
        return 2;
    }
    const int nth = argc > 2 ? atoi(argv[2]) : 2;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    const uint32_t ctx = argc > 4 ? (uint32_t)atoi(argv[4]) : 4096, chunk = argc > 5 ? (uint32_t)atoi(argv[5]) : 512;
    const uint32_t shrt = argc > 6 ? (uint32_t)atoi(argv[6]) : 64;
    if (reps < 1) reps = 1;
    if (reps > MAXREP) reps = MAXREP;
    if (chunk < 2 || shrt < 2 || chunk > ctx || shrt > ctx) die("args", "need 2 <= chunk, short <= ctx");
    char err[256];
    kvt_gguf *g;
    kvt_model *m;
    if (kvt_gguf_open(argv[1], &g, err, sizeof err) != KVT_OK) die(argv[1], err);
    if (kvt_model_load(g, &m, err, sizeof err) != KVT_OK) die(argv[1], err);
    const kvt_hparams *hp = kvt_model_hparams(m);
    if (!hp->mla.kv_lora_rank) die(argv[1], "not an MLA (deepseek2) model");
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(m, codecs, d);
    kvt_kv_layout *l;
    if (kvt_kv_layout_create(d, hp->n_layer, 256, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &l, err, sizeof err)) die("layout", err);
    kvt_block_pool *pool = kvt_block_pool_create(l, 0);
    kvt_ctx *c[3], *cs; /* one context per mode (each keeps its scratch), one for short chunks */
    for (int k = 0; k < 3; k++) {
        if (kvt_ctx_create(m, nth, chunk, &c[k]) != KVT_OK || kvt_ctx_reserve(c[k], l, ctx) != KVT_OK) die("ctx", "");
        kvt_ctx_set_mla_prefill(c[k], (kvt_mla_prefill)k);
    }
    if (kvt_ctx_create(m, nth, shrt, &cs) != KVT_OK || kvt_ctx_reserve(cs, l, ctx) != KVT_OK) die("ctx", "");
    int32_t *tok = malloc(sizeof(int32_t) * ctx);
    uint64_t s = 42;
    for (uint32_t i = 0; i < ctx; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)(1000 + (s >> 33) % (hp->n_vocab - 2000));
    }
    /* shared absorbed prefixes for the last-chunk workloads */
    kvt_seq *pre_long, *pre_short;
    float *lg;
    kvt_seq_create(pool, 1, &pre_long);
    kvt_seq_create(pool, 1, &pre_short);
    kvt_ctx_set_mla_prefill(cs, KVT_MLA_PREFILL_ABSORBED);
    if (kvt_model_forward(c[0], pre_long, tok, ctx - chunk, false, NULL, &lg) != KVT_OK ||
        kvt_model_forward(c[0], pre_short, tok, ctx - shrt, false, NULL, &lg) != KVT_OK)
        die("prefix", "forward failed");
    char names[4][48];
    snprintf(names[0], sizeof names[0], "pp%u (one chunk from 0)", chunk);
    snprintf(names[1], sizeof names[1], "pp%u (chunks of %u)", ctx, chunk);
    snprintf(names[2], sizeof names[2], "%u tokens at %u (last chunk)", chunk, ctx - chunk);
    snprintf(names[3], sizeof names[3], "%u tokens at %u (short chunk)", shrt, ctx - shrt);
    static double wall[4][3][MAXREP], cpu[4][3][MAXREP];
    printf("deepseek2 MLA prefill modes: %s, %d threads, median of %d (wall s / process CPU s)\n", argv[1], nth, reps);
    fflush(stdout);
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < 4; w++)
            for (int j = 0; j < 3; j++) {
                const int k = (j + r + w) % 3; /* rotate the mode order */
                kvt_seq *sq;
                uint32_t n0 = 0, n = chunk;
                kvt_ctx *cc = c[k];
                if (w == 1) n = ctx;
                if (w == 2) {
                    kvt_seq_clone(pre_long, &sq);
                    n0 = ctx - chunk;
                } else if (w == 3) {
                    kvt_seq_clone(pre_short, &sq);
                    n0 = ctx - shrt, n = shrt, cc = cs;
                    kvt_ctx_set_mla_prefill(cs, (kvt_mla_prefill)k);
                } else {
                    kvt_seq_create(pool, 1, &sq);
                }
                const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
                if (kvt_model_forward(cc, sq, tok + n0, n, false, NULL, &lg) != KVT_OK) die("forward", "failed");
                wall[w][k][r] = now(CLOCK_MONOTONIC) - t0;
                cpu[w][k][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
                kvt_seq_free(sq);
                fprintf(stderr, "rep %d %-36s %-8s %.3f s wall %.3f s cpu\n", r, names[w],
                        kvt_mla_prefill_name((kvt_mla_prefill)k), wall[w][k][r], cpu[w][k][r]);
            }
    printf("| workload | absorbed | expanded | auto | expanded speedup (wall / CPU) |\n|---|---|---|---|---|\n");
    for (int w = 0; w < 4; w++) {
        double mw[3], mc[3];
        for (int k = 0; k < 3; k++) mw[k] = median(wall[w][k], reps), mc[k] = median(cpu[w][k], reps);
        printf("| %s | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2fx / %.2fx |\n", names[w], mw[0], mc[0], mw[1], mc[1],
               mw[2], mc[2], mw[0] / mw[1], mc[0] / mc[1]);
    }
    kvt_seq_free(pre_long);
    kvt_seq_free(pre_short);
    for (int k = 0; k < 3; k++) kvt_ctx_free(c[k]);
    kvt_ctx_free(cs);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
    kvt_model_free(m);
    kvt_gguf_free(g);
    free(tok);
    return 0;
}
