/*
 * test_ref_llama_q5km.c — kvtier against llama.cpp on tests/fixtures/llama-tiny-q5_k_m.gguf, a Q5_K_M
 * mix made by llama.cpp's quantizer (q5_1, q8_0, q5_K, q6_K tensors) whose large logits make the
 * greedy choice sensitive to every rounding step (see tests/fixtures/README.md).
 *
 * What it pins down, on the 8-token case (every generated position's top-5 log-probability gaps):
 *  - attention rounds Q and the normalized softmax weights to f16 as llama.cpp's default CPU
 *    attention does (kv/attention.c). Without those two roundings kvtier picks the runner-up at the
 *    first position (its top-2 gap is 0.108 nats in the reference) and the gaps differ by ~0.1-0.3;
 *  - Q8_0/Q8_1 activations round as ggml's run-time CPU quantizer (id = 127/amax, ties to even;
 *    kernels/quant_ref.c kvt_act_quantize_ref), and the V product sums keys in 16 lanes (cache
 *    position mod 16) reduced as _mm512_reduce_add_ps (kv/attention.c). Before these two the gaps
 *    agreed to < 1e-6 (the reference's float logits, bit for bit) only up to position 6: at position
 *    7 (the token at cache position 14) one element of layer 0's attention output, the input of
 *    attn_output, quantizes to exactly 84.5 in kvtier; llama.cpp rounds the tie to even (84), kvtier
 *    rounded it away from zero (85), and the gaps jumped to 0.15-0.35 nats. kvtier reaches the tie
 *    only when the block's largest element has llama.cpp's bits, which needs a lane order in the V
 *    product (its single ascending accumulator was 1 ulp off). With both, the gaps agree to < 1e-6
 *    at the first 16 positions; the test checks them at 1e-4.
 *
 * The 300- and 700-token cases: kvtier gives all 32 greedy tokens of both, but not the reference's
 * bits. The 300-token case is the issue's: token 13's top-2 margin is 0.097 nats in the reference,
 * and kvtier's gaps were already 0.03-0.57 nats off at position 0 (after the 300-token prefill; one
 * rounding boundary crossed differently moves this model's gaps by ~0.05-0.35 nats, so agreement is
 * bit-exact or not close), so it picked the runner-up there (13 of 32 tokens). Measured by emulating
 * llama.cpp c392e509's CPU operations one at a time in a debug build (bench/ref_gaps.c prints the
 * per-position gaps): the reference ran on an AVX-512 machine, and four operations round differently:
 *  1. K·Q: tinyBLAS's 16 lanes reduced as _mm512_reduce_add_ps, ((t0+t4)+(t2+t6))+((t1+t5)+(t3+t7))
 *     with t_l = lane l + lane l+8; kvtier's dot (kernels/vec.h) pairs ((t0+t4)+(t1+t5))+(...);
 *  2. softmax: ggml_v_expf's AVX-512 form (a polynomial and _mm512_scalef_ps), 16-lane float sums
 *     added in double, weights times (float)(1.0/sum); kvtier: its own exp polynomial, one 16-lane
 *     float sum, 1.0f/sum;
 *  3. the V product's 16 lanes (copied, above);
 *  4. RoPE: angles p * theta_scale^i as float products (theta *= theta_scale), cosf/sinf, and the
 *     rotation with the first product of each output fused, fmaf(x0, cos, -(x1 sin)) and
 *     fmaf(x0, sin, x1 cos) (gcc contracting ggml's C). Copied (model.c): with it the 300-token
 *     case's margin at token 13 is 0.071 (negative before) and all 32 tokens agree; fusing
 *     x1 cos instead of x0 sin in the second output puts the 8-token case off at position 9.
 * With all four (in the same order for a batch and a single token, as kvtier needs) the 300-token
 * case's positions 0 and 1 are the reference's bit for bit and its gap errors at positions 0-13
 * (sum of |error| over the top 2..5) fall from 8.8 to 1.3 (6.1 with 3 and 4 only, as committed), but
 * position 2 still differs, and the 700-token case (ubatches of 512 + 188 in llama.cpp) is off at
 * position 0. 1 and 2 are not copied yet (they need new SIMD twins of the dot's reduction and of the
 * exp). Emulated without effect: rms_norm's float products, SiLU's vector exp, q5_1's fused m·s
 * sum; llama.cpp's AVX2 orders instead of AVX-512 ones leave position 0 off. For a single token
 * llama.cpp also changes its K·Q and V orders (ggml_vec_dot_f16), which kvtier cannot copy: decode
 * must equal a full recompute.
 */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "kernels/quant.h"
#include "kv/kv.h"
#include "model/model.h"

#define FIX_GGUF "tests/fixtures/llama-tiny-q5_k_m.gguf"
#define FIX_JSON "tests/fixtures/llama-tiny-q5_k_m.ref.json"

typedef struct ref_case {
    int32_t *prompt, tokens[64];
    uint32_t n_prompt, n;
    int32_t top_tok[64][5];
    double top_lp[64][5];
} ref_case;

typedef struct fixture {
    kvt_gguf *g;
    kvt_model *m;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
    ref_case cases[3];
    int n_cases;
} fixture;

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void load_cases(fixture *fx) {
    char *txt = read_all(FIX_JSON);
    if (!txt) fail_msg("cannot read %s (run from the repository root)", FIX_JSON);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    assert_non_null(root);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases));
    fx->n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        assert_true(fx->n_cases < 3);
        ref_case *rc = &fx->cases[fx->n_cases++];
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(c, "prompt");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "tokens");
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(c, "top");
        rc->n_prompt = (uint32_t)cJSON_GetArraySize(p);
        rc->n = (uint32_t)cJSON_GetArraySize(t);
        assert_true(rc->n_prompt > 0 && rc->n <= 64 && cJSON_GetArraySize(top) == (int)rc->n);
        rc->prompt = malloc(rc->n_prompt * sizeof(int32_t));
        for (uint32_t i = 0; i < rc->n_prompt; i++) rc->prompt[i] = (int32_t)cJSON_GetArrayItem(p, (int)i)->valuedouble;
        for (uint32_t i = 0; i < rc->n; i++) {
            rc->tokens[i] = (int32_t)cJSON_GetArrayItem(t, (int)i)->valuedouble;
            const cJSON *pos = cJSON_GetArrayItem(top, (int)i);
            for (int k = 0; k < 5; k++) {
                const cJSON *e = cJSON_GetArrayItem(pos, k);
                rc->top_tok[i][k] = (int32_t)cJSON_GetArrayItem(e, 0)->valuedouble;
                rc->top_lp[i][k] = cJSON_GetArrayItem(e, 1)->valuedouble;
            }
        }
    }
    cJSON_Delete(root);
    assert_int_equal(fx->n_cases, 3);
    assert_int_equal(fx->cases[0].n_prompt, 8);
    assert_int_equal(fx->cases[1].n_prompt, 300);
}

static int setup(void **st) {
    fixture *fx = calloc(1, sizeof *fx);
    char err[256];
    if (kvt_gguf_open(FIX_GGUF, &fx->g, err, sizeof err) != KVT_OK) fail_msg("open: %s", err);
    if (kvt_model_load(fx->g, &fx->m, err, sizeof err) != KVT_OK) fail_msg("load: %s", err);
    const kvt_hparams *hp = kvt_model_hparams(fx->m);
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(fx->m, codecs, d);
    if (kvt_kv_layout_create(d, hp->n_layer, 64, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &fx->layout, err,
                             sizeof err) != KVT_OK)
        fail_msg("layout: %s", err);
    fx->pool = kvt_block_pool_create(fx->layout, 0);
    assert_non_null(fx->pool);
    load_cases(fx);
    *st = fx;
    return 0;
}

static int teardown(void **st) {
    fixture *fx = *st;
    for (int i = 0; i < fx->n_cases; i++) free(fx->cases[i].prompt);
    kvt_block_pool_free(fx->pool);
    kvt_kv_layout_free(fx->layout);
    kvt_model_free(fx->m);
    kvt_gguf_free(fx->g);
    free(fx);
    return 0;
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy-decode case rc for n_check tokens; returns how many agree with the reference (stops at the
 * first difference). While they agree, the log-probability gaps lp(top_k) - lp(top_0) of the
 * reference's top 5 at positions < n_gap_check must be within gap_tol of the reference's. */
static uint32_t run_case(fixture *fx, const ref_case *rc, uint32_t n_check, uint32_t n_gap_check, double gap_tol) {
    const uint32_t V = kvt_model_hparams(fx->m)->n_vocab;
    kvt_ctx *c = NULL;
    assert_int_equal(kvt_ctx_create(fx->m, 2, 128, &c), KVT_OK);
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(fx->pool, 1, &s), KVT_OK);
    float *lg = NULL;
    assert_int_equal(kvt_model_forward(c, s, rc->prompt, rc->n_prompt, false, NULL, &lg), KVT_OK);
    uint32_t agree = 0;
    for (uint32_t t = 0; t < n_check; t++) {
        if (t < n_gap_check) {
            double mx = -INFINITY, se = 0.0;
            for (uint32_t i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
            for (uint32_t i = 0; i < V; i++) se += exp((double)lg[i] - mx);
            const double l0 = (double)lg[rc->top_tok[t][0]];
            for (int k = 1; k < 5; k++) {
                const double mine = (double)lg[rc->top_tok[t][k]] - l0, want = rc->top_lp[t][k] - rc->top_lp[t][0];
                if (fabs(mine - want) > gap_tol)
                    fail_msg("position %u, token %d: log-prob gap %.5f, reference %.5f", t, rc->top_tok[t][k], mine, want);
            }
        }
        const int32_t tok = (int32_t)argmax(lg, V);
        if (tok != rc->tokens[t]) break;
        agree++;
        assert_int_equal(kvt_model_forward(c, s, &tok, 1, false, NULL, &lg), KVT_OK);
    }
    kvt_seq_free(s);
    kvt_ctx_free(c);
    return agree;
}

/* The case of the issue: 0.108 nats between the reference's top two at the first position. The
 * gaps of the first 16 positions are the reference's to float precision (header). */
static void test_case8_greedy_and_gaps(void **st) {
    fixture *fx = *st;
    assert_int_equal(run_case(fx, &fx->cases[0], 32, 16, 1e-4), 32);
}

/* The scalar kernels sum each q5_1/q8_0 dot in one float (the SIMD ones, like ggml's AVX2 kernels,
 * in 8 lanes): the gaps then differ by up to ~0.07 nats, but the greedy tokens still agree. */
static void test_case8_scalar_kernels(void **st) {
    fixture *fx = *st;
    const kvt_isa was = kvt_kernels_isa();
    assert_true(kvt_kernels_force_isa(KVT_ISA_SCALAR));
    const uint32_t agree = run_case(fx, &fx->cases[0], 32, 0, 0.0);
    assert_true(kvt_kernels_force_isa(was));
    assert_int_equal(agree, 32);
}

/* All 32 greedy tokens, but not the reference's bits (header): at token 13 kvtier's top-2 margin is
 * 0.071 nats against the reference's 0.097. */
static void test_case300_greedy(void **st) {
    fixture *fx = *st;
    assert_int_equal(run_case(fx, &fx->cases[1], 32, 0, 0.0), 32);
}

static void test_case700_greedy(void **st) {
    fixture *fx = *st;
    assert_int_equal(run_case(fx, &fx->cases[2], 32, 0, 0.0), 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case8_greedy_and_gaps),
        cmocka_unit_test(test_case8_scalar_kernels),
        cmocka_unit_test(test_case300_greedy),
        cmocka_unit_test(test_case700_greedy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
