/* test_qwen35.c — the qwen35 hybrid architecture: greedy parity with the reference fixture
 * (tests/fixtures/qwen35-tiny.*), the delta-rule kernels (chunked form vs the token recurrence,
 * scalar vs AVX2), and decode == full recompute / chunking and thread invariance. */
#include "testutil.h"
#include "fixture_model.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "kernels/vec.h"
#include "kv/kv.h"
#include "model/deltanet.h"
#include "model/gen_model.h"
#include "model/model.h"
#include "model/model_int.h"

#define FIX_GGUF "tests/fixtures/qwen35-tiny.gguf"
#define FIX_REF "tests/fixtures/qwen35-tiny.ref.json"


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
    char *js = tu_read_file(FIX_REF);
    assert_non_null(js);
    cJSON *root = cJSON_Parse(js);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "architecture")->valuestring, "qwen35");
    tu_fx f;
    tu_fx_open(&f, FIX_GGUF, 256);
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
    tu_fx_close(&f);
    cJSON_Delete(root);
    free(js);
}

/* ------------------------------------------------------------------ delta-rule kernels */

typedef struct dn_in {
    kvt_dn_dims dm;
    uint32_t n, cd, hv;
    float *qkv, *beta, *g;
} dn_in;

/* Random normalized q/k, v, beta in (0,1), log decays in [-2, 0] (some rows near 0: slow decay). */
static dn_in dn_make(uint32_t hk, uint32_t hv, uint32_t d, uint32_t n, uint64_t seed) {
    dn_in in = {{hk, hv, d, 4}, n, 0, hv, NULL, NULL, NULL};
    in.cd = kvt_dn_conv_dim(&in.dm);
    in.qkv = malloc((size_t)n * in.cd * sizeof(float));
    in.beta = malloc((size_t)n * hv * sizeof(float));
    in.g = malloc((size_t)n * hv * sizeof(float));
    for (uint32_t r = 0; r < n; r++) {
        float *row = in.qkv + (size_t)r * in.cd;
        for (uint32_t i = 0; i < in.cd; i++) row[i] = tu_randf(&seed);
        for (uint32_t h = 0; h < 2 * hk; h++) {
            double s = 0;
            for (uint32_t i = 0; i < d; i++) s += (double)row[h * d + i] * row[h * d + i];
            for (uint32_t i = 0; i < d; i++) row[h * d + i] /= (float)sqrt(s);
        }
        for (uint32_t h = 0; h < hv; h++) {
            in.beta[r * hv + h] = 0.5f + 0.49f * tu_randf(&seed);
            in.g[r * hv + h] = r % 7 == 0 ? -1e-4f : -1.0f - tu_randf(&seed);
        }
    }
    return in;
}

static void dn_free(dn_in *in) {
    free(in->qkv);
    free(in->beta);
    free(in->g);
}

/* Runs the chunked kernel over all rows, split into calls of the given sizes (cycled), heads split
 * into two ranges as two threads would. */
static float *dn_run(const dn_in *in, kvt_dn_impl impl, const uint32_t *sizes, int n_sizes, float **state_out) {
    const size_t sb = kvt_dn_state_bytes(&in->dm);
    float *state = calloc(1, sb);
    float *out = calloc((size_t)in->n * in->hv * in->dm.d, sizeof(float));
    uint32_t pos = 0;
    for (int k = 0; pos < in->n; k++) {
        uint32_t m = sizes[k % n_sizes];
        if (m > in->n - pos) m = in->n - pos;
        const uint32_t hm = in->hv / 2;
        for (int part = 0; part < 2; part++)
            kvt_dn_rows(&in->dm, impl, state, in->qkv + (size_t)pos * in->cd, in->beta + (size_t)pos * in->hv,
                        in->g + (size_t)pos * in->hv, pos, m, out + (size_t)pos * in->hv * in->dm.d,
                        part ? hm : 0, part ? in->hv : hm);
        pos += m;
    }
    if (state_out) *state_out = state;
    else free(state);
    return out;
}

static double max_rel(const float *a, const float *b, size_t n) {
    double mx = 0, scale = 1e-6;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx / scale;
}

/* Chunked form (both implementations) == the plain token recurrence within float tolerance, and
 * the recurrent state S agrees after the last full chunk. */
static void test_dn_chunked_vs_recurrence(void **st) {
    (void)st;
    dn_in in = dn_make(2, 4, 32, 200, 11);
    const size_t no = (size_t)in.n * in.hv * in.dm.d;
    float *S = calloc((size_t)in.hv * in.dm.d * in.dm.d, sizeof(float));
    float *ref = calloc(no, sizeof(float));
    kvt_dn_recurrence_ref(&in.dm, S, in.qkv, in.beta, in.g, 192, ref); /* 3 full chunks */
    const uint32_t all[] = {192};
    for (int impl = 0; impl <= (int)kvt_dn_best_impl(); impl++) {
        float *state;
        float *out = dn_run(&in, (kvt_dn_impl)impl, all, 1, &state);
        double e = max_rel(out, ref, (size_t)192 * in.hv * in.dm.d);
        const float *S_chunk = state + (size_t)3 * in.cd; /* stored transposed per head */
        const uint32_t d = in.dm.d;
        float *St = malloc((size_t)in.hv * d * d * sizeof(float));
        for (uint32_t h = 0; h < in.hv; h++)
            for (uint32_t i = 0; i < d; i++)
                for (uint32_t c = 0; c < d; c++) St[((size_t)h * d + i) * d + c] = S_chunk[((size_t)h * d + c) * d + i];
        double es = max_rel(St, S, (size_t)in.hv * d * d);
        free(St);
        printf("impl %d: chunked vs recurrence: out %.2e, state %.2e\n", impl, e, es);
        assert_true(e < 1e-4);
        assert_true(es < 1e-4);
        free(out);
        free(state);
    }
    free(S);
    free(ref);
    dn_free(&in);
}

/* Any split of the tokens into calls (1 = decode, 64, odd sizes crossing chunk boundaries) gives
 * the same bits as one call; scalar and AVX2 agree within tolerance. */
static void check_split_invariance_and_simd(uint32_t hd, uint32_t n) {
    dn_in in = dn_make(2, 4, hd, n, 12);
    const size_t no = (size_t)in.n * in.hv * in.dm.d;
    const uint32_t one[] = {300}, dec[] = {1}, odd[] = {37, 5, 64, 1, 100}, c64[] = {64};
    for (int impl = 0; impl <= (int)kvt_dn_best_impl(); impl++) {
        float *s0, *s1, *s2, *s3;
        float *a = dn_run(&in, (kvt_dn_impl)impl, one, 1, &s0);
        float *b = dn_run(&in, (kvt_dn_impl)impl, dec, 1, &s1);
        float *c = dn_run(&in, (kvt_dn_impl)impl, odd, 5, &s2);
        float *d = dn_run(&in, (kvt_dn_impl)impl, c64, 1, &s3);
        const size_t sb = kvt_dn_state_bytes(&in.dm);
        assert_memory_equal(a, b, no * sizeof(float));
        assert_memory_equal(a, c, no * sizeof(float));
        assert_memory_equal(a, d, no * sizeof(float));
        assert_memory_equal(s0, s1, sb);
        assert_memory_equal(s0, s2, sb);
        assert_memory_equal(s0, s3, sb);
        free(a), free(b), free(c), free(d), free(s0), free(s1), free(s2), free(s3);
    }
    /* every SIMD implementation gives the scalar reference's bits (outputs and state) */
    float *s_ref, *s_simd;
    float *a = dn_run(&in, KVT_DN_SCALAR, odd, 5, &s_ref);
    for (int impl = 1; impl <= (int)kvt_dn_best_impl(); impl++) {
        float *b = dn_run(&in, (kvt_dn_impl)impl, odd, 5, &s_simd);
        assert_memory_equal(a, b, no * sizeof(float));
        assert_memory_equal(s_ref, s_simd, kvt_dn_state_bytes(&in.dm));
        free(b), free(s_simd);
    }
    printf("scalar == SIMD for impls 1..%d\n", (int)kvt_dn_best_impl());
    free(a), free(s_ref);
    dn_free(&in);
}

/* d = 64: the generic paths; d = 128: also the AVX-512 tiles of 128 columns (decode S·k, chunk close) */
static void test_dn_split_invariance_and_simd(void **st) {
    (void)st;
    check_split_invariance_and_simd(64, 300);
    check_split_invariance_and_simd(128, 140);
}

/* The conv keeps the last K-1 raw inputs: one call == token by token, and the first outputs see
 * zeros before the sequence start. */
static void test_dn_conv(void **st) {
    (void)st;
    kvt_dn_dims dm = {1, 1, 8, 4};
    const uint32_t cd = kvt_dn_conv_dim(&dm), n = 10;
    uint64_t seed = 5;
    float w[24 * 4], u[10 * 24], o1[10 * 24], o2[10 * 24];
    for (size_t i = 0; i < KVT_ARRAY_LEN(w); i++) w[i] = tu_randf(&seed);
    for (size_t i = 0; i < KVT_ARRAY_LEN(u); i++) u[i] = tu_randf(&seed);
    float *s1 = calloc(1, kvt_dn_state_bytes(&dm)), *s2 = calloc(1, kvt_dn_state_bytes(&dm));
    kvt_dn_conv(&dm, KVT_DN_SCALAR, w, s1, u, n, o1, 0, cd);
    for (uint32_t r = 0; r < n; r++) kvt_dn_conv(&dm, KVT_DN_SCALAR, w, s2, u + r * cd, 1, o2 + r * cd, 0, cd);
    assert_memory_equal(o1, o2, sizeof o1);
    /* SIMD == scalar, in uneven calls and channel ranges (masked / scalar tails) */
    for (int impl = 1; impl <= (int)kvt_dn_best_impl(); impl++) {
        float o3[10 * 24];
        float *s3 = calloc(1, kvt_dn_state_bytes(&dm));
        const uint32_t cuts[] = {0, 3, 4, 10};
        for (int k = 0; k < 3; k++) {
            kvt_dn_conv(&dm, (kvt_dn_impl)impl, w, s3, u + cuts[k] * cd, cuts[k + 1] - cuts[k], o3 + cuts[k] * cd, 0, 7);
            kvt_dn_conv(&dm, (kvt_dn_impl)impl, w, s3, u + cuts[k] * cd, cuts[k + 1] - cuts[k], o3 + cuts[k] * cd, 7, cd);
        }
        assert_memory_equal(o1, o3, sizeof o1);
        assert_memory_equal(s1, s3, kvt_dn_state_bytes(&dm));
        free(s3);
    }
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t ch = 0; ch < cd; ch++) {
            double s = 0;
            for (uint32_t j = 0; j < 4; j++) {
                int t = (int)r - 3 + (int)j;
                if (t >= 0) s += (double)w[j * cd + ch] * u[t * cd + ch]; /* tap-major */
            }
            double want = s / (1 + exp(-s));
            assert_true(fabs(want - o1[r * cd + ch]) < 1e-5);
        }
    free(s1);
    free(s2);
}

/* kvt_vec_exp_clamped against libm's double exp (relative error, 0 below the range), and the vector gates
 * against the scalar reference bit for bit, lengths with tails. */
static void test_dn_exp_and_gates(void **st) {
    (void)st;
    double worst = 0.0;
    for (int i = -880000; i <= 880000; i++) {
        const float x = (float)i * 1e-4f;
        const float y = kvt_vec_exp_clamped(x);
        if (x < -87.33654f) {
            assert_true(y == 0.0f);
            continue;
        }
        const double want = exp((double)x), e = fabs((double)y - want) / want;
        if (e > worst) worst = e;
    }
    printf("kvt_vec_exp_clamped: max relative error %.2e on [-87.3, 88]\n", worst);
    assert_true(worst < 3e-7);
    assert_true(kvt_vec_exp_clamped(-1000.0f) == 0.0f && isfinite(kvt_vec_exp_clamped(1000.0f)));
    enum { N = 203 };
    float g[N], u[N], y0[N], y1[N];
    uint64_t seed = 17;
    for (int i = 0; i < N; i++) g[i] = 30.0f * tu_randf(&seed), u[i] = tu_randf(&seed);
    g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f;
    for (int impl = 1; impl <= (int)kvt_dn_best_impl(); impl++)
        for (uint32_t n = 1; n <= N; n += 13) {
            kvt_dn_silu_mul(KVT_DN_SCALAR, y0, g, u, n);
            kvt_dn_silu_mul((kvt_dn_impl)impl, y1, g, u, n);
            assert_memory_equal(y0, y1, n * sizeof(float));
            kvt_dn_silu_mul(KVT_DN_SCALAR, y0, g, NULL, n);
            kvt_dn_silu_mul((kvt_dn_impl)impl, y1, g, NULL, n);
            assert_memory_equal(y0, y1, n * sizeof(float));
            kvt_dn_sigmoid_mul(KVT_DN_SCALAR, y0, g, u, n);
            kvt_dn_sigmoid_mul((kvt_dn_impl)impl, y1, g, u, n);
            assert_memory_equal(y0, y1, n * sizeof(float));
        }
    kvt_dn_silu_mul(KVT_DN_SCALAR, y0, g, u, N);
    for (int i = 0; i < N; i++) assert_true(fabs(y0[i] - g[i] / (1.0 + exp(-(double)g[i])) * u[i]) < 1e-5 * (1 + fabs(g[i])));
    /* NaN (e.g. from a GGUF's weights): the scalar exp clamps it like the vector min(x, 88), so
     * every implementation still gives the same bits (and no NaN reaches a float -> int cast) */
    assert_true(kvt_vec_exp_clamped(NAN) == kvt_vec_exp_clamped(88.0f));
    for (int i = 0; i < 20; i++) g[i] = (i % 3) ? NAN : -NAN;
    for (int impl = 1; impl <= (int)kvt_dn_best_impl(); impl++) {
        kvt_dn_sigmoid_mul(KVT_DN_SCALAR, y0, g, u, 20);
        kvt_dn_sigmoid_mul((kvt_dn_impl)impl, y1, g, u, 20);
        assert_memory_equal(y0, y1, 20 * sizeof(float));
    }
}

/* ------------------------------------------------------------------ model invariances */

/* Logits of every position: one prefill, token-by-token decode, odd ubatch, 1, 2 and 3 threads;
 * chunks of up to 16 rows on several threads run replicated (arch_qwen35.c), longer ones split. */
static void check_decode_eq_full(const char *path) {
    tu_fx f;
    tu_fx_open(&f, path, 16);
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab, n = 150;
    int32_t tok[150];
    uint64_t seed = 99;
    for (uint32_t i = 0; i < n; i++) tok[i] = (int32_t)(tu_rand(&seed) % V);
    float *want = malloc((size_t)n * V * sizeof(float));
    kvt_ctx *c = NULL;
    assert_int_equal(kvt_ctx_create(f.m, 2, 256, &c), KVT_OK);
    kvt_seq *s = NULL;
    float *lg;
    assert_int_equal(kvt_seq_create(f.pool, 1, &s), KVT_OK);
    assert_int_equal(kvt_model_forward(c, s, tok, n, true, NULL, &lg), KVT_OK);
    memcpy(want, lg, (size_t)n * V * sizeof(float));
    kvt_seq_free(s);
    kvt_ctx_free(c);
    const struct { int nth; uint32_t ub; uint32_t step; } runs[] = {{1, 256, 1}, {2, 37, 1}, {2, 37, 23}, {1, 64, 150},
                                                                   {2, 37, 5}, {3, 37, 1}, {3, 37, 16}};
    for (size_t ri = 0; ri < KVT_ARRAY_LEN(runs); ri++) {
        assert_int_equal(kvt_ctx_create(f.m, runs[ri].nth, runs[ri].ub, &c), KVT_OK);
        assert_int_equal(kvt_seq_create(f.pool, 1, &s), KVT_OK);
        for (uint32_t p = 0; p < n;) {
            uint32_t m = runs[ri].step < n - p ? runs[ri].step : n - p;
            assert_int_equal(kvt_model_forward(c, s, tok + p, m, false, NULL, &lg), KVT_OK);
            p += m;
            if (memcmp(lg, want + (size_t)(p - 1) * V, V * sizeof(float)))
                fail_msg("run %zu: logits at position %u differ from the full prefill", ri, p - 1);
        }
        kvt_seq_free(s);
        kvt_ctx_free(c);
    }
    free(want);
    tu_fx_close(&f);
}

static void test_decode_eq_full(void **st) {
    (void)st;
    check_decode_eq_full(FIX_GGUF);
}

/* H_v == H_k (the qwen35-0.8b shape, 4 layers: 3 DeltaNet + 1 attention): the head-local DeltaNet core of
 * arch_qwen35.c (no barriers between conv and gated norm) keeps decode == full recompute, across
 * ubatches and 1 vs 2 threads. (The tiny fixture has H_v = 2 H_k: the row-split path.) */
static void test_decode_eq_full_hv_eq_hk(void **st) {
    (void)st;
    char *dir = tu_tmpdir("q35hk"), path[512], err[256];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    kvt_gen_model_opts o = {.arch = "qwen35", .shape = "qwen35-0.8b", .type = "q8_0", .n_layers = 4, .seed = 5,
                            .byte_vocab = true};
    if (kvt_gen_model(&o, path, err, sizeof err) != KVT_OK) fail_msg("gen-model: %s", err);
    check_decode_eq_full(path);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* gen-model writes qwen35 files (every weight type) that load with the expected layer kinds and
 * keep the decode == full recompute property. */
static void test_gen_model_qwen35(void **st) {
    (void)st;
    char *dir = tu_tmpdir("q35gen");
    const char *types[] = {"f16", "q8_0", "q4_k"};
    for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++) {
        char path[512], err[256];
        snprintf(path, sizeof path, "%s/m.gguf", dir);
        kvt_gen_model_opts o = {.arch = "qwen35", .shape = "tiny", .type = types[i], .seed = 3, .byte_vocab = true};
        if (kvt_gen_model(&o, path, err, sizeof err) != KVT_OK) fail_msg("gen-model %s: %s", types[i], err);
        tu_fx f;
        tu_fx_open(&f, path, 16);
        assert_int_equal(kvt_model_hparams(f.m)->arch, KVT_ARCH_QWEN35);
        for (uint32_t il = 0; il < 4; il++)
            assert_int_equal(kvt_kv_layout_layer(f.layout, il)->kind, il == 3 ? KVT_KIND_FULL : KVT_KIND_RECURRENT);
        /* the output matrix gets its load-time copy as the dense architectures' does (decode
         * streams it from there): for Q8_0, wherever a copy can be made */
        const kvt_wmat *ow = kvt_model_output(f.m);
        if (ow->type == KVT_TYPE_Q8_0) {
            kvt_packed *p = kvt_packed_create(ow->type, ow->data, ow->n_in, ow->n_out);
            assert_true((p != NULL) == (ow->packed != NULL));
            kvt_packed_free(p);
        }
        tu_fx_close(&f);
        if (i == 0) check_decode_eq_full(path);
        unlink(path);
    }
    rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------ hostile files */

typedef struct mutation {
    const char *drop_key, *set_key;
    uint32_t set_val;
    const char *drop_tensor, *positive_tensor;
} mutation;

/* Copy of the fixture with one mutation applied. */
static void write_mutated(const kvt_gguf *g, const mutation *mu, const char *path) {
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    for (int64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
        const char *k = kvt_gguf_key_name(g, i);
        if ((mu->drop_key && !strcmp(k, mu->drop_key)) || (mu->set_key && !strcmp(k, mu->set_key))) continue;
        assert_true(kvt_gguf_w_copy_kv(w, g, k));
    }
    if (mu->set_key) kvt_gguf_w_u32(w, mu->set_key, mu->set_val);
    for (int64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
        const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
        if (mu->drop_tensor && !strcmp(t->name, mu->drop_tensor)) continue;
        void *d = malloc(t->nbytes);
        memcpy(d, t->data, t->nbytes);
        if (mu->positive_tensor && !strcmp(t->name, mu->positive_tensor))
            for (uint64_t j = 0; j < t->nbytes / 4; j++) ((float *)d)[j] = 0.5f;
        assert_int_equal(kvt_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, d, t->nbytes), KVT_OK);
        free(d);
    }
    char err[256];
    assert_int_equal(kvt_gguf_writer_finish(w, path, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);
}

/* Every malformed qwen35 file is rejected with an error (no crash, no unbounded allocation). */
static void test_hostile_qwen35_files(void **st) {
    (void)st;
    char err[256];
    kvt_gguf *g = NULL;
    assert_int_equal(kvt_gguf_open(FIX_GGUF, &g, err, sizeof err), KVT_OK);
    const mutation ms[] = {
        {.drop_key = "qwen35.ssm.state_size"},
        {.drop_key = "qwen35.rope.dimension_sections"},
        {.set_key = "qwen35.ssm.inner_size", .set_val = 255},
        {.set_key = "qwen35.ssm.conv_kernel", .set_val = 100},
        {.set_key = "qwen35.ssm.conv_kernel", .set_val = 0},
        {.set_key = "qwen35.ssm.state_size", .set_val = 4096},
        {.set_key = "qwen35.ssm.group_count", .set_val = 3},
        {.set_key = "qwen35.ssm.time_step_rank", .set_val = 100000},
        {.set_key = "qwen35.full_attention_interval", .set_val = 0},
        {.set_key = "qwen35.nextn_predict_layers", .set_val = 1},
        {.drop_tensor = "blk.1.ssm_conv1d.weight"},
        {.drop_tensor = "blk.2.attn_q_norm.weight"},
        {.drop_tensor = "blk.4.ssm_a"},
        {.positive_tensor = "blk.0.ssm_a"},
    };
    char *dir = tu_tmpdir("q35bad");
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    for (size_t i = 0; i < KVT_ARRAY_LEN(ms); i++) {
        write_mutated(g, &ms[i], path);
        kvt_gguf *b = NULL;
        assert_int_equal(kvt_gguf_open(path, &b, err, sizeof err), KVT_OK);
        kvt_model *m = NULL;
        err[0] = 0;
        kvt_status stl = kvt_model_load(b, &m, err, sizeof err);
        if (stl == KVT_OK) fail_msg("mutation %zu was accepted", i);
        assert_null(m);
        assert_true(err[0] != 0);
        kvt_gguf_free(b);
    }
    /* the unmutated copy loads */
    write_mutated(g, &(mutation){0}, path);
    kvt_gguf *b = NULL;
    kvt_model *m = NULL;
    assert_int_equal(kvt_gguf_open(path, &b, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_model_load(b, &m, err, sizeof err), KVT_OK);
    kvt_model_free(m);
    kvt_gguf_free(b);
    unlink(path);
    rmdir(dir);
    free(dir);
    kvt_gguf_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dn_conv),
        cmocka_unit_test(test_dn_chunked_vs_recurrence),
        cmocka_unit_test(test_dn_split_invariance_and_simd),
        cmocka_unit_test(test_decode_eq_full),
        cmocka_unit_test(test_gen_model_qwen35),
        cmocka_unit_test(test_dn_exp_and_gates),
        cmocka_unit_test(test_decode_eq_full_hv_eq_hk),
        cmocka_unit_test(test_fixture_parity),
        cmocka_unit_test(test_hostile_qwen35_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
