// bench/batch_step.c — cost of one batched decode step (kvt_model_forward_batch) with R rows, each
// row one token of its own sequence (continuous batching, docs/batching.md).
// Built on demand (not part of `make all`): `make build/bench/batch_step`, then
//   build/bench/batch_step MODEL.gguf [THREADS=2] [ROWS="1 2 4 8 16"] [DEPTH=200] [STEPS=32]
// For each R: R sequences are prefilled with DEPTH distinct tokens (not timed), then STEPS decode
// steps of R rows run (greedy: each row feeds back its argmax). Prints the median and minimum
// wall ms per step, the aggregate rows/s it implies (R / median step) and, against R = 1, that
// throughput ratio and the step-time ratio.
// Wall time, so run it a few times on a loaded machine and compare medians.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gguf/gguf.h"
#include "kernels/vec.h"
#include "kv/kv.h"
#include "model/model.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [THREADS] [ROWS] [DEPTH] [STEPS]\n", argv[0]);
        return 2;
    }
    const int nth = argc > 2 ? atoi(argv[2]) : 2;
    const char *rows_s = argc > 3 ? argv[3] : "1 2 4 8 16";
    const uint32_t depth = argc > 4 ? (uint32_t)atoi(argv[4]) : 200;
    const uint32_t steps = argc > 5 ? (uint32_t)atoi(argv[5]) : 32;
    char err[256];
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    if (kvt_gguf_open(argv[1], &g, err, sizeof err) != KVT_OK || kvt_model_load(g, &m, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    const kvt_hparams *hp = kvt_model_hparams(m);
    const uint32_t V = hp->n_vocab;
    kvt_codec *codecs = calloc(hp->n_layer, sizeof(kvt_codec));
    kvt_layer_desc *d = calloc(hp->n_layer, sizeof(kvt_layer_desc));
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i].kind = KVT_CODEC_F16;
    kvt_model_layer_descs(m, codecs, d);
    kvt_kv_layout *l = NULL;
    kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(d, hp->n_layer, 256, base, 0, &l, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "layout: %s\n", err);
        return 1;
    }
    kvt_block_pool *pool = kvt_block_pool_create(l, 4ull << 30);
    kvt_ctx *c = NULL;
    if (kvt_ctx_create(m, nth, 512, &c) != KVT_OK || kvt_ctx_reserve(c, l, depth + steps + 16) != KVT_OK) {
        fprintf(stderr, "ctx\n");
        return 1;
    }
    double base_tps = 0, base_med = 0;
    /* the last two columns: rows/s and the step's time, each against R = 1 (an 8-row step that
     * costs 2x a 1-row step shows 4.00 and 2.00) */
    printf("%4s %10s %10s %11s %11s %11s\n", "rows", "med ms", "min ms", "rows/s", "rows/s/R1", "step/R1");
    for (const char *p = rows_s; *p;) {
        char *end;
        long R = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        if (R < 1 || R > KVT_MAX_BATCH_ITEMS) continue;
        kvt_seq **seqs = calloc((size_t)R, sizeof *seqs);
        kvt_batch_item *items = calloc((size_t)R, sizeof *items);
        int32_t *tok = calloc((size_t)R, sizeof *tok);
        int32_t *prompt = calloc(depth, sizeof *prompt);
        for (long r = 0; r < R; r++) {
            kvt_seq_create(pool, 1000 + (uint64_t)r, &seqs[r]);
            for (uint32_t k = 0; k < depth; k++) prompt[k] = (int32_t)((r * 7919 + k * 104729 + 17) % (V - 10) + 5);
            float *lg = NULL;
            if (kvt_model_forward(c, seqs[r], prompt, depth, false, NULL, &lg) != KVT_OK) {
                fprintf(stderr, "prefill failed\n");
                return 1;
            }
            tok[r] = (int32_t)kvt_vec_argmax(lg, V);
        }
        double *ms = calloc(steps, sizeof *ms);
        for (uint32_t s = 0; s < steps; s++) {
            for (long r = 0; r < R; r++) items[r] = (kvt_batch_item){seqs[r], &tok[r], 1, KVT_OK};
            float *lg = NULL;
            double t0 = now_ms();
            kvt_model_forward_batch(c, items, (uint32_t)R, &lg);
            ms[s] = now_ms() - t0;
            for (long r = 0; r < R; r++) tok[r] = (int32_t)kvt_vec_argmax(lg + (size_t)r * V, V);
        }
        qsort(ms, steps, sizeof *ms, cmp_d);
        double med = ms[steps / 2], tps = R * 1e3 / med;
        if (R == 1) base_tps = tps, base_med = med;
        printf("%4ld %10.2f %10.2f %11.1f %11.2f %11.2f\n", R, med, ms[0], tps, base_tps > 0 ? tps / base_tps : 0.0,
               base_med > 0 ? med / base_med : 0.0);
        fflush(stdout);
        for (long r = 0; r < R; r++) kvt_seq_free(seqs[r]);
        free(seqs), free(items), free(tok), free(prompt), free(ms);
    }
    kvt_ctx_free(c);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(l);
    kvt_model_free(m);
    kvt_gguf_free(g);
    free(codecs), free(d);
    return 0;
}
