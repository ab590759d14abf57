// bench/ref_gaps.c — per-position agreement of kvtier with a reference fixture's log-probabilities.
// Built on demand: `make build/bench/ref_gaps`, run from the repository root:
//   build/bench/ref_gaps [CASE [GGUF JSON]]   (CASE: index into cases[], default 1; default files:
//                                             tests/fixtures/llama-tiny-q5_k_m.gguf / .ref.json)
// Teacher-forced on the reference's tokens (so every position is compared, also past a greedy
// divergence): the prompt is prefilled, then each reference token is decoded. Per position it prints
// kvtier's log-probability gap lp(top_k) - lp(top_0) minus the reference's, for the reference's
// top 2..5 (0 when kvtier has the reference's float logits), a mark where kvtier's argmax differs,
// and both top-2 margins; then the sum of |errors| over positions 0..13 and over all, and the first
// position with an error above 1e-5. Env KVT_ISA (kernels/dispatch.c) selects the kernels.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "model/model.h"

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    const int ci = argc > 1 ? atoi(argv[1]) : 1;
    const char *gguf = argc > 3 ? argv[2] : "tests/fixtures/llama-tiny-q5_k_m.gguf";
    const char *json = argc > 3 ? argv[3] : "tests/fixtures/llama-tiny-q5_k_m.ref.json";
    char err[256];
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    kvt_kv_layout *layout = NULL;
    if (kvt_gguf_open(gguf, &g, err, sizeof err) != KVT_OK || kvt_model_load(g, &m, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "ref_gaps: %s\n", err);
        return 1;
    }
    const kvt_hparams *hp = kvt_model_hparams(m);
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(m, codecs, d);
    if (kvt_kv_layout_create(d, hp->n_layer, 64, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &layout, err, sizeof err) !=
        KVT_OK) {
        fprintf(stderr, "ref_gaps: %s\n", err);
        return 1;
    }
    kvt_block_pool *pool = kvt_block_pool_create(layout, 0);
    char *txt = read_all(json);
    cJSON *root = txt ? cJSON_Parse(txt) : NULL;
    const cJSON *c = root ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "cases"), ci) : NULL;
    const cJSON *p = c ? cJSON_GetObjectItemCaseSensitive(c, "prompt") : NULL;
    const cJSON *t = c ? cJSON_GetObjectItemCaseSensitive(c, "tokens") : NULL;
    const cJSON *top = c ? cJSON_GetObjectItemCaseSensitive(c, "top") : NULL;
    if (!pool || !p || !t || !top) {
        fprintf(stderr, "ref_gaps: cannot read case %d of %s\n", ci, json);
        return 1;
    }
    const int np = cJSON_GetArraySize(p), nt = cJSON_GetArraySize(t);
    int32_t *toks = malloc((size_t)(np + nt) * sizeof(int32_t));
    for (int i = 0; i < np; i++) toks[i] = (int32_t)cJSON_GetArrayItem(p, i)->valuedouble;
    for (int i = 0; i < nt; i++) toks[np + i] = (int32_t)cJSON_GetArrayItem(t, i)->valuedouble;
    kvt_ctx *cx = NULL;
    kvt_seq *s = NULL;
    float *lg = NULL;
    if (kvt_ctx_create(m, 2, 128, &cx) != KVT_OK || kvt_seq_create(pool, 1, &s) != KVT_OK ||
        kvt_model_forward(cx, s, toks, (uint32_t)np, false, NULL, &lg) != KVT_OK) {
        fprintf(stderr, "ref_gaps: forward failed\n");
        return 1;
    }
    double sum13 = 0.0, sum_all = 0.0;
    int first_err = -1;
    printf("pos     gap errors (reference's top 2..5)         margin ref / kvtier\n");
    for (int pos = 0; pos < nt; pos++) {
        if (pos > 0 && kvt_model_forward(cx, s, &toks[np + pos - 1], 1, false, NULL, &lg) != KVT_OK) {
            fprintf(stderr, "ref_gaps: forward failed\n");
            return 1;
        }
        const cJSON *tp = cJSON_GetArrayItem(top, pos);
        int rt[5];
        double rl[5];
        for (int k = 0; k < 5; k++) {
            const cJSON *e = cJSON_GetArrayItem(tp, k);
            rt[k] = (int)cJSON_GetArrayItem(e, 0)->valuedouble;
            rl[k] = cJSON_GetArrayItem(e, 1)->valuedouble;
        }
        uint32_t am = 0;
        for (uint32_t i = 1; i < hp->n_vocab; i++)
            if (lg[i] > lg[am]) am = i;
        const double l0 = lg[rt[0]];
        double e = 0.0;
        printf("%3d %s", pos, (int)am == rt[0] ? "  " : "XX");
        for (int k = 1; k < 5; k++) {
            const double err_k = (lg[rt[k]] - l0) - (rl[k] - rl[0]);
            e += fabs(err_k);
            if (fabs(err_k) > 1e-5 && first_err < 0) first_err = pos;
            printf(" %+.6f", err_k);
        }
        printf("   %.4f / %.4f\n", rl[0] - rl[1], l0 - lg[rt[1]]);
        sum_all += e;
        if (pos <= 13) sum13 += e;
    }
    printf("sum |gap error|: positions 0..13 %.4f, all %.4f; first position off by > 1e-5: %d\n", sum13, sum_all,
           first_err);
    kvt_seq_free(s);
    kvt_ctx_free(cx);
    cJSON_Delete(root);
    free(txt);
    free(toks);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(layout);
    kvt_model_free(m);
    kvt_gguf_free(g);
    return 0;
}
