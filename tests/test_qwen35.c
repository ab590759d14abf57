/* test_qwen35.c — the qwen35 hybrid architecture: greedy parity with the reference fixture
 * (tests/fixtures/qwen35-tiny.*), the delta-rule kernels (chunked form vs the token recurrence,
 * scalar vs AVX2), and decode == full recompute / chunking and thread invariance. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/deltanet.h"
#include "model/model.h"

#define FIX_GGUF "tests/fixtures/qwen35-tiny.gguf"
#define FIX_REF "tests/fixtures/qwen35-tiny.ref.json"

typedef struct qfx {
    kvt_gguf *g;
    kvt_model *m;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
} qfx;

static void qfx_open(qfx *f, const char *path, uint32_t block_tokens) {
    char err[256];
    memset(f, 0, sizeof *f);
    if (kvt_gguf_open(path, &f->g, err, sizeof err) != KVT_OK) fail_msg("open: %s", err);
    if (kvt_model_load(f->g, &f->m, err, sizeof err) != KVT_OK) fail_msg("load: %s", err);
    const kvt_hparams *hp = kvt_model_hparams(f->m);
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(f->m, codecs, d);
    if (kvt_kv_layout_create(d, hp->n_layer, block_tokens, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &f->layout, err,
                             sizeof err) != KVT_OK)
        fail_msg("layout: %s", err);
    f->pool = kvt_block_pool_create(f->layout, 0);
    assert_non_null(f->pool);
}

static void qfx_close(qfx *f) {
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
    kvt_model_free(f->m);
    kvt_gguf_free(f->g);
}

static char *read_all(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, fp) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(fp);
    return b;
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double log_softmax_at(const float *x, uint32_t n, uint32_t k) {
    double mx = x[0];
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0.0;
    for (uint32_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return (double)x[k] - mx - log(s);
}

/* ------------------------------------------------------------------ fixture parity */

static void test_fixture_parity(void **st) {
    (void)st;
    char *js = read_all(FIX_REF);
    assert_non_null(js);
    cJSON *root = cJSON_Parse(js);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "architecture")->valuestring, "qwen35");
    qfx f;
    qfx_open(&f, FIX_GGUF, 256);
    const kvt_hparams *hp = kvt_model_hparams(f.m);
    assert_int_equal(hp->arch, KVT_ARCH_QWEN35);
    kvt_ctx *c = NULL;
    assert_int_equal(kvt_ctx_create(f.m, 2, 512, &c), KVT_OK);
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    int ncase = cJSON_GetArraySize(cases);
    assert_int_equal(ncase, 3);
    double worst = 0.0;
    for (int ci = 0; ci < ncase; ci++) {
        cJSON *cs = cJSON_GetArrayItem(cases, ci);
        cJSON *pr = cJSON_GetObjectItem(cs, "prompt"), *tk = cJSON_GetObjectItem(cs, "tokens");
        cJSON *top = cJSON_GetObjectItem(cs, "top_logsoftmax");
        uint32_t np = (uint32_t)cJSON_GetArraySize(pr), nt = (uint32_t)cJSON_GetArraySize(tk);
        int32_t *p = malloc(np * sizeof(int32_t));
        for (uint32_t i = 0; i < np; i++) p[i] = cJSON_GetArrayItem(pr, (int)i)->valueint;
        kvt_seq *s = NULL;
        assert_int_equal(kvt_seq_create(f.pool, 7, &s), KVT_OK);
        float *lg = NULL;
        assert_int_equal(kvt_model_forward(c, s, p, np, false, NULL, &lg), KVT_OK);
        for (uint32_t i = 0; i < nt; i++) {
            int32_t want = cJSON_GetArrayItem(tk, (int)i)->valueint;
            uint32_t got = argmax(lg, hp->n_vocab);
            if ((int32_t)got != want) fail_msg("case %d (%u prompt tokens): token %u: got %u, want %d", ci, np, i, got, want);
            cJSON *t0 = cJSON_GetArrayItem(cJSON_GetArrayItem(top, (int)i), 0);
            assert_int_equal(cJSON_GetArrayItem(t0, 0)->valueint, want);
            double dl = fabs(log_softmax_at(lg, hp->n_vocab, got) - cJSON_GetArrayItem(t0, 1)->valuedouble);
            if (dl > worst) worst = dl;
            int32_t t = want;
            assert_int_equal(kvt_model_forward(c, s, &t, 1, false, NULL, &lg), KVT_OK);
        }
        kvt_seq_free(s);
        free(p);
    }
    printf("qwen35 fixture: max |dlogprob| of the chosen token = %.2e\n", worst);
    assert_true(worst < 1e-3);
    kvt_ctx_free(c);
    qfx_close(&f);
    cJSON_Delete(root);
    free(js);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
