/* test_f16x.c — 16-bit weights in 16-output groups (KVT_TYPE_F16X for F16, KVT_TYPE_BF16G for
 * BF16; src/kernels/gemm_f16x.c): the pack's layout (both of its paths, in parallel parts), the
 * reference as the FMA chain it defines,
 * the AVX-512 GEMM/GEMV against the reference bit for bit (shapes, row counts, output ranges,
 * denormal/inf/NaN operands), batch, split and ISA invariance, the dot-product accuracy, and the
 * model loader's use of it (which matrices, numerics tag, decode == prefill, logits close to the
 * row-major path, KVT_F16X). The kernels are AVX-512 and AVX2; where the CPU has neither the
 * dispatched product is the reference (still checked) and the loader tests check that nothing is
 * packed. */
#include "testutil.h"

#include <math.h>

#include "fixture_model.h"
#include "kernels/kernels_internal.h"
#include "kernels/quant.h"
#include "model/model_int.h"

static bool has_kernel(void) {
    kvt_kernels_init();
    return kvt_kernels_best_isa() >= KVT_ISA_AVX2;
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || fbits(a) == fbits(b); }

/* ---------------- the type ---------------- */
static void test_type(void **st) {
    (void)st;
    const uint32_t ts[2] = {KVT_TYPE_F16X, KVT_TYPE_BF16G};
    for (int i = 0; i < 2; i++) {
        assert_false(kvt_type_known(ts[i])); /* not a GGUF id: a file cannot name it */
        assert_false(kvt_type_supported(ts[i]));
        assert_int_equal(kvt_vec_dot_type(ts[i]), KVT_TYPE_F32);
        assert_int_equal(kvt_type_row_bytes(ts[i], 7), 14);
        assert_int_equal(kvt_act_bytes(ts[i], 64, 3), 3 * 256);
    }
    assert_int_equal(kvt_type_from_name("f16x"), -1);
    assert_int_equal(kvt_type_from_name("bf16g"), -1);
    assert_string_equal(kvt_type_name(KVT_TYPE_F16X), "f16x");
    assert_string_equal(kvt_type_name(KVT_TYPE_BF16G), "bf16g");
}

/* ---------------- the pack ---------------- */

/* any f16 with a random sign and mantissa, exponent field in [0, 30] (zero and denormals included) */
static uint16_t rand_f16(uint64_t *s) {
    const uint32_t r = (uint32_t)tu_rand(s);
    return (uint16_t)((r & 0x83FFu) | ((r >> 16) % 31u) << 10);
}

/* line k of group g, lane l == w[16g + l][k]; padding lanes +0 */
static void check_layout(const uint16_t *w, int64_t n_in, int64_t n_out, const uint8_t *L) {
    const int64_t ng = (n_out + 15) / 16;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t k = 0; k < n_in; k++)
            for (int l = 0; l < 16; l++) {
                uint16_t v;
                memcpy(&v, L + ((size_t)g * (size_t)n_in + (size_t)k) * 32 + 2 * (size_t)l, 2);
                const int64_t o = 16 * g + l;
                const uint16_t want = o < n_out ? w[o * n_in + k] : 0;
                if (v != want)
                    fail_msg("n_in %lld n_out %lld: group %lld input %lld lane %d = %04x, want %04x", (long long)n_in,
                             (long long)n_out, (long long)g, (long long)k, l, v, want);
            }
}

static void test_pack(void **st) {
    (void)st;
    /* odd n_in takes the scalar transpose, even the gather one (where AVX-512 is present) */
    const int64_t ins[] = {1, 2, 7, 64, 577, 578};
    const int64_t outs[] = {1, 15, 16, 17, 40};
    uint64_t s = 5;
    for (size_t a = 0; a < KVT_ARRAY_LEN(ins); a++)
        for (size_t b = 0; b < KVT_ARRAY_LEN(outs); b++) {
            const int64_t n_in = ins[a], n_out = outs[b];
            uint16_t *w = malloc((size_t)(n_in * n_out) * 2);
            for (int64_t i = 0; i < n_in * n_out; i++) w[i] = rand_f16(&s);
            size_t bytes = 0;
            uint8_t *L = kvt_f16x_pack((a + b) % 2 ? KVT_TYPE_BF16 : KVT_TYPE_F16, w, n_in, n_out, &bytes); /* same bits */
            assert_non_null(L);
            assert_int_equal(bytes, (size_t)((n_out + 15) / 16) * 16 * (size_t)n_in * 2);
            assert_true(((uintptr_t)L & 63) == 0);
            check_layout(w, n_in, n_out, L);
            free(L), free(w);
        }
    assert_null(kvt_f16x_pack(KVT_TYPE_F16, NULL, 4, 4, NULL));
    uint16_t w[8] = {0};
    assert_null(kvt_f16x_pack(KVT_TYPE_F16, w, 0, 4, NULL));
    assert_null(kvt_f16x_pack(KVT_TYPE_F16, w, 4, 0, NULL));
    assert_null(kvt_f16x_pack(KVT_TYPE_F32, w, 2, 2, NULL));
    assert_null(kvt_f16x_pack(KVT_TYPE_Q8_0, w, 2, 2, NULL));
    assert_null(kvt_f16x_pack(KVT_TYPE_F16X, w, 2, 2, NULL));
    assert_null(kvt_f16x_pack(KVT_TYPE_F16, w, INT64_MAX / 2, INT64_MAX / 2, NULL)); /* overflow */
}

/* a matrix with 2^22 elements or more is packed in parallel parts: the same layout, padding too */
static void test_pack_large(void **st) {
    (void)st;
    const int64_t n_in = 2048, n_out = 2049; /* 129 groups, the last with one row */
    uint16_t *w = malloc((size_t)(n_in * n_out) * 2);
    uint64_t s = 17;
    for (int64_t i = 0; i < n_in * n_out; i++) w[i] = rand_f16(&s);
    uint8_t *L = kvt_f16x_pack(KVT_TYPE_F16, w, n_in, n_out, NULL);
    assert_non_null(L);
    check_layout(w, n_in, n_out, L);
    free(L), free(w);
}

/* ---------------- products ---------------- */

typedef struct mm_case {
    uint32_t ft;  /* KVT_TYPE_F16 or KVT_TYPE_BF16: the file's type */
    uint32_t pt;  /* the packed type: KVT_TYPE_F16X or KVT_TYPE_BF16G */
    int64_t n_in, n_out, n_rows;
    uint16_t *w; /* row-major, n_out x n_in */
    float *x;    /* n_rows x n_in */
    uint8_t *W;
} mm_case;

static float widen(uint32_t ft, uint16_t h) { return ft == KVT_TYPE_BF16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32(h); }

static void mm_make(mm_case *c, uint32_t ft, int64_t n_in, int64_t n_out, int64_t n_rows, uint64_t seed, bool specials) {
    const bool bf = ft == KVT_TYPE_BF16;
    c->ft = ft, c->pt = bf ? KVT_TYPE_BF16G : KVT_TYPE_F16X;
    c->n_in = n_in, c->n_out = n_out, c->n_rows = n_rows;
    c->w = malloc((size_t)(n_in * n_out) * 2);
    c->x = malloc((size_t)(n_in * n_rows) * 4);
    uint64_t s = seed;
    for (int64_t i = 0; i < n_in * n_out; i++)
        c->w[i] = bf ? kvt_f32_to_bf16(tu_randf(&s) * 0.1f) : kvt_f32_to_f16(tu_randf(&s) * 0.1f);
    for (int64_t i = 0; i < n_in * n_rows; i++) c->x[i] = tu_randf(&s) * 3.0f;
    if (specials) {
        for (int64_t i = 0; i < n_in * n_out; i += 7) /* zeros and denormals */
            c->w[i] = (uint16_t)(tu_rand(&s) & (bf ? 0x807F : 0x83FF));
        for (int64_t i = 3; i < n_in * n_rows; i += 11) c->x[i] = ldexpf(tu_randf(&s), -130); /* denormal */
        c->w[0] = bf ? 0x7F7F : 0x7BFF, c->x[0] = 3e38f;           /* the largest weight: an inf product */
        if (n_out > 1) c->w[n_in] = bf ? 0x7F80 : 0x7C00;          /* an inf weight */
        if (n_out > 2) c->w[2 * n_in] = bf ? 0x7FC0 : 0x7E00;      /* a NaN weight */
        if (n_out > 3 && n_rows > 1) c->x[n_in] = -0.0f, c->w[3 * n_in] = 0x8000; /* signed zeros */
    }
    c->W = kvt_f16x_pack(ft, c->w, n_in, n_out, NULL);
    assert_non_null(c->W);
}
static void mm_free(mm_case *c) { free(c->W), free(c->w), free(c->x); }

/* The definition, straight from the row-major matrix: one fma chain per output. */
static float chain(const mm_case *c, int64_t r, int64_t o) {
    float s = 0.0f;
    for (int64_t k = 0; k < c->n_in; k++) s = fmaf(widen(c->ft, c->w[o * c->n_in + k]), c->x[r * c->n_in + k], s);
    return s;
}

static void test_ref_is_the_chain(void **st) {
    (void)st;
    for (int t = 0; t < 2; t++) {
        mm_case c;
        mm_make(&c, t ? KVT_TYPE_BF16 : KVT_TYPE_F16, 77, 35, 3, 99, true);
        float *y = malloc((size_t)(c.n_rows * c.n_out) * 4);
        kvt_matmul_rows_ref(c.pt, c.W, c.n_in, c.x, c.n_rows, y, c.n_out, 0, c.n_out);
        for (int64_t r = 0; r < c.n_rows; r++)
            for (int64_t o = 0; o < c.n_out; o++) assert_true(same_float(y[r * c.n_out + o], chain(&c, r, o)));
        assert_true(isinf(y[0])); /* the specials got there */
        assert_true(isnan(y[2]));
        free(y);
        mm_free(&c);
    }
}

/* dispatched over [o0, o1) == reference; nothing outside [o0, o1) written */
static void mm_check(const mm_case *c, int64_t o0, int64_t o1) {
    const int64_t ldy = c->n_out + 3;
    float *ref = malloc((size_t)(c->n_rows * ldy) * 4), *got = malloc((size_t)(c->n_rows * ldy) * 4);
    for (int64_t i = 0; i < c->n_rows * ldy; i++) ref[i] = got[i] = -777.0f;
    kvt_matmul_rows_ref(c->pt, c->W, c->n_in, c->x, c->n_rows, ref, ldy, o0, o1);
    kvt_matmul_rows(c->pt, c->W, c->n_in, c->x, c->n_rows, got, ldy, o0, o1);
    for (int64_t r = 0; r < c->n_rows; r++)
        for (int64_t o = 0; o < ldy; o++) {
            const float a = ref[r * ldy + o], b = got[r * ldy + o];
            if (!same_float(a, b))
                fail_msg("%s n_in %lld n_out %lld rows %lld [%lld,%lld): y[%lld][%lld] = %a, reference %a", kvt_type_name(c->pt), (long long)c->n_in,
                         (long long)c->n_out, (long long)c->n_rows, (long long)o0, (long long)o1, (long long)r,
                         (long long)o, b, a);
            if (o < o0 || o >= o1) assert_true(b == -777.0f);
        }
    free(ref), free(got);
}

static void matmul_vs_ref_cases(void) {
    const int64_t ins[] = {1, 6, 64, 577};
    const int64_t outs[] = {1, 15, 16, 17, 33, 70};
    const int64_t rows[] = {1, 2, 3, 4, 5, 12, 13, 25, 37, 40};
    for (size_t a = 0; a < KVT_ARRAY_LEN(ins); a++)
        for (size_t b = 0; b < KVT_ARRAY_LEN(outs); b++)
            for (size_t r = 0; r < KVT_ARRAY_LEN(rows); r++) {
                if (ins[a] == 577 && rows[r] > 13 && outs[b] > 17) continue; /* keep the scalar reference quick */
                mm_case c;
                mm_make(&c, r % 3 == 1 ? KVT_TYPE_BF16 : KVT_TYPE_F16, ins[a], outs[b], rows[r], 1000 * a + 10 * b + r,
                        (a + b + r) % 2 == 0);
                mm_check(&c, 0, c.n_out);
                if (c.n_out > 3) mm_check(&c, 1, c.n_out - 2); /* ranges not on group boundaries */
                if (c.n_out > 20) mm_check(&c, 16, c.n_out);
                if (c.n_out > 20) mm_check(&c, 5, 21);
                mm_free(&c);
            }
}
static void test_matmul_vs_ref(void **st) {
    (void)st;
    const kvt_isa best = kvt_kernels_best_isa();
    const kvt_isa isas[2] = {best, KVT_ISA_AVX2}; /* the best ISA's kernel, then (AVX-512 machines) AVX2's */
    for (int i = 0; i < (best >= KVT_ISA_AVX512 ? 2 : 1); i++) {
        assert_true(kvt_kernels_force_isa(isas[i]));
        matmul_vs_ref_cases();
    }
    kvt_kernels_force_isa(best);
}

/* Each output is one sequential chain: a row computed alone, in any batch (row blocks of 36 and
 * tiles of 12 or, on AVX2, 6 included), on any ISA (AVX-512, AVX2, the scalar reference) and in any
 * column split gives the same bits. */
static void invariance_of(uint32_t ft) {
    mm_case c;
    mm_make(&c, ft, 576, 100, 75, 77, false);
    const int64_t N = c.n_out;
    float *all = malloc((size_t)(c.n_rows * N) * 4), *one = malloc((size_t)N * 4), *split = malloc((size_t)(c.n_rows * N) * 4);
    kvt_matmul_rows(c.pt, c.W, c.n_in, c.x, c.n_rows, all, N, 0, N);
    for (int64_t r = 0; r < c.n_rows; r++) {
        kvt_matmul_rows(c.pt, c.W, c.n_in, c.x + (size_t)r * (size_t)c.n_in, 1, one, N, 0, N);
        assert_memory_equal(one, all + r * N, (size_t)N * 4);
    }
    kvt_matmul_rows(c.pt, c.W, c.n_in, c.x, c.n_rows, split, N, 0, 48);
    kvt_matmul_rows(c.pt, c.W, c.n_in, c.x, c.n_rows, split, N, 48, N);
    assert_memory_equal(split, all, (size_t)(c.n_rows * N) * 4);
    bool same = true;
    for (int i = KVT_ISA_SCALAR; i <= (int)kvt_kernels_best_isa(); i++) {
        assert_true(kvt_kernels_force_isa((kvt_isa)i));
        memset(split, 0, (size_t)(c.n_rows * N) * 4);
        kvt_matmul_rows(c.pt, c.W, c.n_in, c.x, c.n_rows, split, N, 0, N);
        same = same && !memcmp(split, all, (size_t)(c.n_rows * N) * 4);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa()); /* before asserting: later tests need the ISA back */
    assert_true(same);
    free(all), free(one), free(split);
    mm_free(&c);
}
static void test_batch_and_isa_invariance(void **st) {
    (void)st;
    invariance_of(KVT_TYPE_F16);
    invariance_of(KVT_TYPE_BF16);
}

/* The arithmetic is the dot product of the 16-bit weights with the f32 activations: a sequential f32
 * sum is within (n_in)·2^-24 of Σ|w·x| of the exact (double) dot. Catches a layout that the kernel
 * and the reference misread alike. */
static void test_matmul_is_the_dot(void **st) {
    (void)st;
    for (int t = 0; t < 2; t++) {
        mm_case c;
        mm_make(&c, t ? KVT_TYPE_BF16 : KVT_TYPE_F16, 1536, 40, 9, 4242, false);
        float *y = malloc((size_t)(c.n_rows * c.n_out) * 4);
        kvt_matmul_rows(c.pt, c.W, c.n_in, c.x, c.n_rows, y, c.n_out, 0, c.n_out);
        for (int64_t r = 0; r < c.n_rows; r++)
            for (int64_t o = 0; o < c.n_out; o++) {
                double exact = 0, absx = 0;
                for (int64_t k = 0; k < c.n_in; k++) {
                    const double p = (double)widen(c.ft, c.w[o * c.n_in + k]) * c.x[r * c.n_in + k];
                    exact += p, absx += fabs(p);
                }
                assert_true(fabs(y[r * c.n_out + o] - exact) <= (double)c.n_in * 0x1p-24 * absx);
            }
        free(y);
        mm_free(&c);
    }
}

/* ---------------- the model loader ---------------- */

static void test_model_loader(void **st) {
    (void)st;
    char *dir = tu_tmpdir("f16x");
    char *pfull = tu_gen_tiny(dir, "full.gguf", "f16", true), *pq8 = tu_gen_tiny(dir, "q8.gguf", "q8_0", false);
    tu_fx a, q;
    tu_fx_open(&a, pfull, 16);
    tu_fx_open(&q, pq8, 16);
    if (!has_kernel()) { /* nothing to pack with: the row-major path, no tag */
        assert_false(kvt_f16x_enabled());
        assert_int_equal(kvt_model_output(a.m)->type, KVT_TYPE_F16);
        assert_string_equal(kvt_model_numerics_tag(a.m), "");
        tu_fx_close(&a), tu_fx_close(&q);
        unlink(pfull), unlink(pq8), rmdir(dir);
        free(pfull), free(pq8), free(dir);
        return;
    }
    assert_true(kvt_f16x_enabled());
    /* full-precision F16 matrices are packed (the bf16 kernel refuses them); Q8_0 ones are not */
    assert_int_equal(kvt_model_output(a.m)->type, KVT_TYPE_F16X);
    assert_int_equal(kvt_model_tok_embd(a.m)->type, KVT_TYPE_F16); /* the tied embedding is untouched */
    assert_string_equal(kvt_model_numerics_tag(a.m), "+f16x");
    assert_string_equal(kvt_model_numerics_tag(q.m), "");
    /* the same file on the row-major path (the scalar kernels at load time: no groups kernel) */
    assert_true(kvt_kernels_force_isa(KVT_ISA_SCALAR));
    const bool scalar_packs = kvt_f16x_enabled();
    tu_fx c;
    tu_fx_open(&c, pfull, 16);
    assert_true(kvt_kernels_force_isa(kvt_kernels_best_isa())); /* before asserting: later tests need it */
    assert_false(scalar_packs);
    assert_int_equal(kvt_model_output(c.m)->type, KVT_TYPE_F16);
    assert_string_equal(kvt_model_numerics_tag(c.m), "");
    const uint32_t V = kvt_model_hparams(a.m)->n_vocab;
    int32_t tok[24];
    uint64_t s = 3;
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)(tu_rand(&s) % V);
    float *la = malloc(V * 4), *ld = malloc(V * 4), *l7 = malloc(V * 4), *lc = malloc(V * 4);
    tu_last_logits(&a, tok, 24, 24, la);
    tu_last_logits(&a, tok, 24, 1, ld);  /* decode steps */
    tu_last_logits(&a, tok, 24, 7, l7);  /* uneven chunks */
    assert_memory_equal(la, ld, V * 4); /* decode == full recompute, bit for bit */
    assert_memory_equal(la, l7, V * 4);
    tu_last_logits(&c, tok, 24, 24, lc);
    double maxd = 0, maxa = 0;
    for (uint32_t i = 0; i < V; i++) {
        maxd = fmax(maxd, fabs((double)la[i] - lc[i]));
        maxa = fmax(maxa, fabs((double)lc[i]));
    }
    fprintf(stderr, "tiny llama f16 (full): f16x vs row-major logits max |diff| %.3g (max |logit| %.3g)\n", maxd, maxa);
    assert_true(maxd < 1e-4 * maxa); /* another summation order of the same f32 products */
    free(la), free(ld), free(l7), free(lc);
    tu_fx_close(&a), tu_fx_close(&c), tu_fx_close(&q);
    unlink(pfull), unlink(pq8);
    rmdir(dir);
    free(pfull), free(pq8), free(dir);
}

/* KVT_F16X and KVT_BF16X (read once at kernel init: checked in child processes) */
static char g_self[512];
/* the child's "f16x-enabled output-type tag decode==prefill" for the environment `env` and model
 * `path` */
static void child_says(const char *env, const char *path, char *out, size_t len) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "env %s '%s' --print-f16x '%s' 2>/dev/null", env, g_self, path);
    tu_child_line(cmd, out, len);
}

static void test_env(void **st) {
    (void)st;
    if (!has_kernel()) skip();
    const bool bf16 = kvt_bf16x_enabled();
    char *dir = tu_tmpdir("f16xenv");
    char *p16 = tu_gen_tiny(dir, "f16.gguf", "f16", false), *pfull = tu_gen_tiny(dir, "full.gguf", "f16", true);
    char *pbf = tu_gen_tiny(dir, "bf16.gguf", "bf16", false);
    char out[128];
    child_says("KVT_F16X=0", pfull, out, sizeof out);
    assert_string_equal(out, "0 f16 - same");
    child_says("KVT_F16X=off", pfull, out, sizeof out);
    assert_string_equal(out, "0 f16 - same");
    child_says("KVT_F16X=1", pfull, out, sizeof out);
    assert_string_equal(out, "1 f16x +f16x same");
    child_says("KVT_F16X=bogus", pfull, out, sizeof out); /* warns, keeps the default */
    assert_string_equal(out, "1 f16x +f16x same");
    /* bf16-valued F16 and BF16 take the bf16 pair dot where it runs, else these groups */
    child_says("KVT_F16X=1", p16, out, sizeof out);
    assert_string_equal(out, bf16 ? "1 bf16x +bf16x same" : "1 f16x +f16x same");
    child_says("KVT_BF16X=0", p16, out, sizeof out);
    assert_string_equal(out, "1 f16x +f16x same");
    child_says("KVT_F16X=1", pbf, out, sizeof out);
    assert_string_equal(out, bf16 ? "1 bf16x +bf16x same" : "1 bf16g +f16x same");
    child_says("KVT_BF16X=0", pbf, out, sizeof out); /* BF16 weights in the groups: decode == prefill */
    assert_string_equal(out, "1 bf16g +f16x same");
    child_says("KVT_BF16X=0 KVT_F16X=0", pbf, out, sizeof out);
    assert_string_equal(out, "0 bf16 - same");
    if (bf16) { /* KVT_BF16X=round takes the full-precision matrices too */
        child_says("KVT_BF16X=round", pfull, out, sizeof out);
        assert_string_equal(out, "1 bf16x +bf16x same");
    }
    unlink(p16), unlink(pfull), unlink(pbf);
    rmdir(dir);
    free(p16), free(pfull), free(pbf), free(dir);
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--print-f16x")) { /* child of test_env */
        tu_fx f;
        tu_fx_open(&f, argv[2], 16);
        const char *tag = kvt_model_numerics_tag(f.m);
        const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
        int32_t tok[12];
        for (int i = 0; i < 12; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
        float *a = malloc(V * 4), *b = malloc(V * 4);
        tu_last_logits(&f, tok, 12, 12, a);
        tu_last_logits(&f, tok, 12, 1, b);
        printf("%d %s %s %s\n", (int)kvt_f16x_enabled(), kvt_type_name(kvt_model_output(f.m)->type), *tag ? tag : "-",
               memcmp(a, b, V * 4) ? "differ" : "same");
        free(a), free(b);
        tu_fx_close(&f);
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    g_self[n > 0 ? n : 0] = 0;
    kvt_kernels_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_pack_large),
        cmocka_unit_test(test_ref_is_the_chain),
        cmocka_unit_test(test_matmul_vs_ref),
        cmocka_unit_test(test_batch_and_isa_invariance),
        cmocka_unit_test(test_matmul_is_the_dot),
        cmocka_unit_test(test_model_loader),
        cmocka_unit_test(test_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
