/* test_batch.c — kvt_model_forward_batch (continuous batching, docs/batching.md): several
 * sequences in one pass give each sequence bit-identical logits to running it alone, whatever the
 * mix of prefill chunks and decode rows, the thread count (head split / row split / split-K /
 * replicated mode), or the other rows beside it; a sequence the pool cannot grow fails alone; malformed calls
 * are refused before anything runs. */
#include "testutil.h"

#include "kv/kv.h"
#include "model/gen_model.h"
#include "model/model.h"

typedef struct fx {
    char *dir;
    char path[512];
    kvt_gguf *g;
    kvt_model *m;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
} fx;

static void fx_open(fx *f, const char *arch, const char *type, uint64_t budget) {
    memset(f, 0, sizeof *f);
    f->dir = tu_tmpdir("batch");
    assert_non_null(f->dir);
    snprintf(f->path, sizeof f->path, "%s/m.gguf", f->dir);
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = type, .seed = 5};
    char err[256];
    if (kvt_gen_model(&o, f->path, err, sizeof err) != KVT_OK) fail_msg("gen-model %s: %s", arch, err);
    if (kvt_gguf_open(f->path, &f->g, err, sizeof err) != KVT_OK) fail_msg("open: %s", err);
    if (kvt_model_load(f->g, &f->m, err, sizeof err) != KVT_OK) fail_msg("load: %s", err);
    const kvt_hparams *hp = kvt_model_hparams(f->m);
    kvt_codec *codecs = calloc(hp->n_layer, sizeof(kvt_codec));
    kvt_layer_desc *d = calloc(hp->n_layer, sizeof(kvt_layer_desc));
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i].kind = KVT_CODEC_F16;
    kvt_model_layer_descs(f->m, codecs, d);
    kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(d, hp->n_layer, 16, base, 0, &f->layout, err, sizeof err) != KVT_OK) fail_msg("layout: %s", err);
    free(codecs);
    free(d);
    f->pool = kvt_block_pool_create(f->layout, budget);
    assert_non_null(f->pool);
}

static void fx_close(fx *f) {
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
    kvt_model_free(f->m);
    kvt_gguf_free(f->g);
    unlink(f->path);
    rmdir(f->dir);
    free(f->dir);
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#define NS 5       /* sequences */
#define NGEN 12    /* decode steps each */
#define MAXP 90

typedef struct ref {
    uint32_t n_prompt;
    int32_t prompt[MAXP];
    int32_t gen[NGEN + 1];
    float *logits; /* [(NGEN + 1) * V]: after the prompt, then after each decoded token */
} ref;

/* Alone: the prompt in one call, then greedy decode one token at a time. */
static void run_alone(fx *f, kvt_ctx *c, ref *r, uint32_t V) {
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f->pool, 77, &s), KVT_OK);
    float *lg = NULL;
    assert_int_equal(kvt_model_forward(c, s, r->prompt, r->n_prompt, false, NULL, &lg), KVT_OK);
    for (uint32_t k = 0; k <= NGEN; k++) {
        memcpy(r->logits + (size_t)k * V, lg, sizeof(float) * V);
        r->gen[k] = (int32_t)argmax(lg, V);
        if (k == NGEN) break;
        assert_int_equal(kvt_model_forward(c, s, &r->gen[k], 1, false, NULL, &lg), KVT_OK);
    }
    kvt_seq_free(s);
}

/* Batched: sequence i joins at step i*start_gap; every step takes each decoding sequence's token
 * and fills the rest of the ubatch with prefill chunks (at most `chunk` tokens each). */
static void run_batched(fx *f, kvt_ctx *c, ref *refs, uint32_t V, uint32_t ubatch, uint32_t chunk, uint32_t start_gap,
                        const char *what) {
    kvt_seq *s[NS] = {0};
    uint32_t done[NS] = {0}, k[NS] = {0};
    int32_t tok[NS];
    bool fin[NS] = {0};
    for (uint32_t step = 0; step < 1000; step++) {
        kvt_batch_item it[NS];
        uint32_t idx[NS], ni = 0, budget = ubatch;
        for (uint32_t i = 0; i < NS; i++) { /* decode rows first */
            if (fin[i] || step < i * start_gap || done[i] < refs[i].n_prompt) continue;
            it[ni] = (kvt_batch_item){s[i], &tok[i], 1, KVT_OK};
            idx[ni++] = i;
            budget--;
        }
        for (uint32_t i = 0; i < NS && budget; i++) {
            if (fin[i] || step < i * start_gap || done[i] >= refs[i].n_prompt) continue;
            if (!s[i]) assert_int_equal(kvt_seq_create(f->pool, 77, &s[i]), KVT_OK);
            uint32_t m = KVT_MIN(KVT_MIN(chunk, budget), refs[i].n_prompt - done[i]);
            it[ni] = (kvt_batch_item){s[i], refs[i].prompt + done[i], m, KVT_OK};
            idx[ni++] = i;
            budget -= m;
        }
        bool all = true;
        for (uint32_t i = 0; i < NS; i++) all = all && fin[i];
        if (all) break;
        if (!ni) continue;
        float *lg = NULL;
        assert_int_equal(kvt_model_forward_batch(c, it, ni, &lg), KVT_OK);
        for (uint32_t j = 0; j < ni; j++) {
            uint32_t i = idx[j];
            assert_int_equal(it[j].st, KVT_OK);
            if (done[i] < refs[i].n_prompt) {
                done[i] += it[j].n;
                if (done[i] < refs[i].n_prompt) continue;
            } else {
                k[i]++;
            }
            const float *row = lg + (size_t)j * V;
            if (memcmp(row, refs[i].logits + (size_t)k[i] * V, sizeof(float) * V))
                fail_msg("%s: sequence %u step %u: batched logits differ from the sequence alone", what, i, k[i]);
            tok[i] = refs[i].gen[k[i]];
            if (k[i] == NGEN) fin[i] = true;
        }
    }
    for (uint32_t i = 0; i < NS; i++) {
        assert_true(fin[i]);
        assert_int_equal(kvt_seq_len(s[i]), refs[i].n_prompt + NGEN);
        kvt_seq_free(s[i]);
    }
}

static void check_arch(const char *arch, const char *type) {
    fx f;
    fx_open(&f, arch, type, 0);
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
    assert_true(kvt_model_batches(f.m));
    ref refs[NS];
    uint64_t seed = 99;
    for (uint32_t i = 0; i < NS; i++) {
        refs[i].n_prompt = 5 + (uint32_t)(tu_rand(&seed) % (MAXP - 5));
        for (uint32_t t = 0; t < refs[i].n_prompt; t++) refs[i].prompt[t] = (int32_t)(tu_rand(&seed) % V);
        refs[i].logits = malloc(sizeof(float) * V * (NGEN + 1));
        assert_non_null(refs[i].logits);
    }
    const int threads[] = {1, 2, 3};
    for (size_t ti = 0; ti < KVT_ARRAY_LEN(threads); ti++) {
        kvt_ctx *c = NULL;
        assert_int_equal(kvt_ctx_create(f.m, threads[ti], 64, &c), KVT_OK);
        for (uint32_t i = 0; i < NS; i++) run_alone(&f, c, &refs[i], V);
        char what[96];
        snprintf(what, sizeof what, "%s/%s %d threads", arch, type, threads[ti]);
        run_batched(&f, c, refs, V, 64, 64, 0, what); /* all start together */
        run_batched(&f, c, refs, V, 64, 13, 3, what); /* staggered, small chunks */
        run_batched(&f, c, refs, V, 8, 3, 1, what);   /* tiny steps: replicated mode mixes */
        kvt_ctx_free(c);
    }
    for (uint32_t i = 0; i < NS; i++) free(refs[i].logits);
    fx_close(&f);
}

static void test_batch_llama_q8_0(void **st) { (void)st; check_arch("llama", "q8_0"); }
static void test_batch_qwen2(void **st) { (void)st; check_arch("qwen2", "f16"); }
static void test_batch_qwen3(void **st) { (void)st; check_arch("qwen3", "bf16"); }
static void test_batch_gemma3(void **st) { (void)st; check_arch("gemma3", "q8_0"); }

/* Split-K forced on every decode row (KVT_SPLITK=1): a step's decode rows each run
 * kvt_attention_split in turn over the shared buffer, beside prefill chunks, and still give the
 * logits of the sequence alone (itself split-K). */
static void test_batch_splitk(void **st) {
    (void)st;
    setenv("KVT_SPLITK", "1", 1);
    const uint64_t calls = kvt_attention_split_calls();
    check_arch("llama", "f16");
    check_arch("gemma3", "q8_0");
    assert_true(kvt_attention_split_calls() > calls);
    unsetenv("KVT_SPLITK");
}

/* Malformed calls are refused before anything runs; a sequence the pool cannot grow fails alone. */
static void test_batch_errors(void **st) {
    (void)st;
    fx f;
    fx_open(&f, "llama", "f16", 0);
    kvt_ctx *c = NULL;
    assert_int_equal(kvt_ctx_create(f.m, 2, 16, &c), KVT_OK);
    kvt_seq *a = NULL, *b = NULL;
    assert_int_equal(kvt_seq_create(f.pool, 1, &a), KVT_OK);
    assert_int_equal(kvt_seq_create(f.pool, 1, &b), KVT_OK);
    int32_t t[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    float *lg = (float *)1;
    kvt_batch_item same[2] = {{a, t, 2, KVT_OK}, {a, t, 2, KVT_OK}};
    assert_int_equal(kvt_model_forward_batch(c, same, 2, &lg), KVT_ERR_INVALID_ARG);
    assert_null(lg);
    kvt_batch_item big[2] = {{a, t, 10, KVT_OK}, {b, t, 10, KVT_OK}}; /* 20 > ubatch 16 */
    assert_int_equal(kvt_model_forward_batch(c, big, 2, &lg), KVT_ERR_INVALID_ARG);
    kvt_batch_item empty[1] = {{a, t, 0, KVT_OK}};
    assert_int_equal(kvt_model_forward_batch(c, empty, 1, &lg), KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_model_forward_batch(c, NULL, 0, &lg), KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_seq_len(a), 0);
    assert_int_equal(kvt_seq_len(b), 0);
    /* a bad token id fails that item only */
    int32_t bad[2] = {1, 1 << 30};
    kvt_batch_item mix[2] = {{a, t, 3, KVT_OK}, {b, bad, 2, KVT_OK}};
    assert_int_equal(kvt_model_forward_batch(c, mix, 2, &lg), KVT_OK);
    assert_int_equal(mix[0].st, KVT_OK);
    assert_int_equal(mix[1].st, KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_seq_len(a), 3);
    assert_int_equal(kvt_seq_len(b), 0);
    kvt_seq_free(a);
    kvt_seq_free(b);
    kvt_ctx_free(c);
    fx_close(&f);

    /* pool of 2 blocks of 16 tokens: the item needing a third block fails, the other runs */
    fx_open(&f, "llama", "f16", 0);
    uint64_t blk = (uint64_t)(kvt_kv_layout_bytes_per_token(f.layout) * 16);
    kvt_block_pool_free(f.pool);
    f.pool = kvt_block_pool_create(f.layout, 2 * blk);
    assert_non_null(f.pool);
    assert_int_equal(kvt_ctx_create(f.m, 2, 64, &c), KVT_OK);
    assert_int_equal(kvt_seq_create(f.pool, 1, &a), KVT_OK);
    assert_int_equal(kvt_seq_create(f.pool, 1, &b), KVT_OK);
    int32_t t40[40];
    for (int i = 0; i < 40; i++) t40[i] = i + 1;
    kvt_batch_item ex[2] = {{a, t40, 8, KVT_OK}, {b, t40, 40, KVT_OK}};
    assert_int_equal(kvt_model_forward_batch(c, ex, 2, &lg), KVT_OK);
    assert_int_equal(ex[0].st, KVT_OK);
    assert_int_equal(ex[1].st, KVT_ERR_POOL_EXHAUSTED);
    assert_int_equal(kvt_seq_len(a), 8);
    assert_int_equal(kvt_seq_len(b), 0);
    kvt_seq_free(a);
    kvt_seq_free(b);
    kvt_ctx_free(c);
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_llama_q8_0), cmocka_unit_test(test_batch_qwen2), cmocka_unit_test(test_batch_qwen3),
        cmocka_unit_test(test_batch_gemma3),     cmocka_unit_test(test_batch_splitk), cmocka_unit_test(test_batch_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
