/* test_bf16x.c — bf16 pair-dot weights (KVT_TYPE_BF16X, src/kernels/gemm_bf16.c): the reference
 * model of vdpbf16ps against the instruction, the lossless pack, the AVX-512 BF16 GEMM/GEMV against
 * the scalar reference bit for bit (any shape, row count and output range), the bf16 activation
 * conversion, and the model loader's use of it (which matrices, numerics tag, logits close to the
 * f32 path, KVT_BF16X=0). Tests that need the instruction skip where the CPU lacks AVX-512 BF16. */
#include "testutil.h"

#include <math.h>

#include "fixture_model.h"
#include "kernels/kernels_internal.h"
#include "kernels/quant.h"
#include "model/model_int.h"

static bool has_bf16_kernel(void) {
#if KVT_X86
    kvt_kernels_init();
    return __builtin_cpu_supports("avx512bf16") && kvt_kernels_best_isa() >= KVT_ISA_AVX512;
#else
    return false;
#endif
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || fbits(a) == fbits(b); }

/* a bf16 with a random sign and mantissa and an exponent field in [e_lo, e_hi] (e_lo 0: zero and
 * denormals included) */
static uint16_t rand_bf16(uint64_t *s, int e_lo, int e_hi) {
    const uint32_t r = (uint32_t)tu_rand(s);
    const int e = e_lo + (int)(r % (uint32_t)(e_hi - e_lo + 1));
    return (uint16_t)((r >> 8 & 0x807Fu) | (uint32_t)e << 7);
}

/* ---------------- the type ---------------- */
static void test_type(void **st) {
    (void)st;
    assert_false(kvt_type_known(KVT_TYPE_BF16X)); /* not a GGUF id: a file cannot name it */
    assert_false(kvt_type_supported(KVT_TYPE_BF16X));
    assert_int_equal(kvt_type_from_name("bf16x"), -1);
    assert_string_equal(kvt_type_name(KVT_TYPE_BF16X), "bf16x");
    assert_int_equal(kvt_vec_dot_type(KVT_TYPE_BF16X), KVT_TYPE_BF16);
    assert_int_equal(kvt_type_row_bytes(KVT_TYPE_BF16X, 576), 1152);
    assert_int_equal(kvt_type_row_bytes(KVT_TYPE_BF16X, 7), 0);
    assert_int_equal(kvt_act_bytes(KVT_TYPE_BF16X, 64, 3), 3 * 128);
}

/* ---------------- the instruction vs the reference model ---------------- */

/* one operand for the instruction test: 1 in 16 a zero or denormal (DAZ), else a normal bf16 */
static uint16_t op_bf16(uint64_t *s, int e_lo, int e_hi) {
    return (tu_rand(s) & 15) == 0 ? rand_bf16(s, 0, 0) : rand_bf16(s, e_lo, e_hi);
}

static void test_instruction_model(void **st) {
    (void)st;
    if (!has_bf16_kernel()) skip();
#if KVT_X86
    uint64_t s = 99;
    long n = 0;
    /* Regimes: 0 any magnitudes (overflow to inf included); 1 small operands, whose products and
     * sums lie between 2^-100 and 2^-40 (FTZ/DAZ inputs); 2 cancellation (accumulator ≈ −product,
     * rounding on a long carry). Lanes whose exact sums come within 2^-100 of zero are redrawn:
     * the model does not claim the instruction's flush at the underflow threshold (gemm_bf16.c). */
    for (int it = 0; it < 60000; it++) {
        const int regime = it % 3;
        float acc[16], hw[16];
        uint32_t w2[16], x2[16];
        for (int l = 0; l < 16; l++) {
            for (;;) {
                const int lo = regime == 1 ? 80 : 1, hi = regime == 1 ? 110 : 254;
                const uint16_t a0 = op_bf16(&s, lo, hi), a1 = op_bf16(&s, lo, hi);
                const uint16_t b0 = op_bf16(&s, lo, hi), b1 = op_bf16(&s, lo, hi);
                uint32_t u = ((uint32_t)tu_rand(&s) & 0x807FFFFFu) |
                             (uint32_t)(regime == 1 ? 27 + tu_rand(&s) % 60 : 1 + tu_rand(&s) % 253) << 23;
                memcpy(&acc[l], &u, 4);
                const double p1 = (double)kvt_bf16_to_f32(a1) * kvt_bf16_to_f32(b1);
                const double p0 = (double)kvt_bf16_to_f32(a0) * kvt_bf16_to_f32(b0);
                if (regime == 2 && fabs(p1) > 0x1p-60 && fabs(p1) < 0x1p100) acc[l] = (float)(-p1 * (1.0 + 0x1p-20));
                const double e1 = (double)acc[l] + p1, e2 = e1 + p0;
                const bool near0 = (p1 != 0 && fabs(p1) < 0x1p-100) || (p0 != 0 && fabs(p0) < 0x1p-100) ||
                                   fabs(e1) < 0x1p-100 || fabs(e2) < 0x1p-100;
                w2[l] = a0 | (uint32_t)a1 << 16;
                x2[l] = b0 | (uint32_t)b1 << 16;
                if (!near0) break;
            }
        }
        memcpy(hw, acc, sizeof hw);
        kq_bf16x_dp_hw(hw, w2, x2);
        for (int l = 0; l < 16; l++, n++) {
            const float ref = kq_bf16x_step_ref(acc[l], w2[l], x2[l]);
            if (!same_float(hw[l], ref))
                fail_msg("vdpbf16ps %a + (%08x . %08x) = %a, reference model %a", acc[l], w2[l], x2[l], hw[l], ref);
        }
    }
    fprintf(stderr, "vdpbf16ps == reference model on %ld lanes\n", n);
#endif
}

/* ---------------- pack ---------------- */
static void test_pack(void **st) {
    (void)st;
    kvt_f16_table_init();
    const int64_t n_in = 6, n_out = 19;
    uint16_t f16[6 * 19], b16[6 * 19];
    uint64_t s = 5;
    for (int i = 0; i < n_in * n_out; i++) {
        const float v = kvt_bf16_to_f32(kvt_f32_to_bf16(tu_randf(&s)));
        f16[i] = kvt_f32_to_f16(v); /* exactly v: a bf16 in f16 range with <= 8 significant bits */
        b16[i] = kvt_f32_to_bf16(v);
    }
    size_t bytes = 0;
    uint8_t *a = kvt_bf16x_pack(KVT_TYPE_F16, f16, n_in, n_out, false, &bytes);
    uint8_t *b = kvt_bf16x_pack(KVT_TYPE_BF16, b16, n_in, n_out, false, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(bytes, 2 * 3 * 64); /* 2 groups x 3 pairs x 64 bytes */
    assert_memory_equal(a, b, bytes);                   /* F16 of bf16 values == the BF16 file */
    assert_int_equal((uintptr_t)a % 64, 0);
    /* weight (o, k) at group o/16, pair k/2, dword o%16, half k%2 */
    for (int64_t o = 0; o < 32; o++)
        for (int64_t k = 0; k < n_in; k++) {
            uint16_t got;
            memcpy(&got, a + (size_t)(o / 16) * 3 * 64 + (size_t)(k / 2) * 64 + 4 * (size_t)(o % 16) + 2 * (size_t)(k % 2), 2);
            assert_int_equal(got, o < n_out ? b16[o * n_in + k] : 0); /* padding rows are +0 */
        }
    free(a), free(b);
    /* lossless only: one F16 value that is not a bf16 refuses the whole matrix */
    f16[37] = kvt_f32_to_f16(1.0f + 0x1p-10f);
    assert_null(kvt_bf16x_pack(KVT_TYPE_F16, f16, n_in, n_out, false, &bytes));
    assert_int_equal(bytes, 0);
    /* KVT_BF16X=round: inexact F16 values are rounded to nearest even bf16; exact ones unchanged */
    uint16_t wide[64 * 16];
    for (int i = 0; i < 64 * 16; i++) wide[i] = (uint16_t)tu_rand(&s); /* any f16: inf/NaN/subnormal too */
    wide[0] = kvt_f32_to_f16(1.0f + 0x1p-8f), wide[1] = kvt_f32_to_f16(1.0f + 3 * 0x1p-8f); /* ties */
    uint8_t *r = kvt_bf16x_pack(KVT_TYPE_F16, wide, 64, 16, true, &bytes);
    assert_non_null(r);
    for (int o = 0; o < 16; o++)
        for (int k = 0; k < 64; k++) {
            uint16_t got;
            memcpy(&got, r + (size_t)(k / 2) * 64 + 4 * (size_t)o + 2 * (size_t)(k % 2), 2);
            const uint16_t want = kvt_f32_to_bf16(kvt_f16_to_f32(wide[o * 64 + k]));
            if (isnan(kvt_f16_to_f32(wide[o * 64 + k]))) assert_true((got & 0x7FC0) == 0x7FC0);
            else assert_int_equal(got, want);
        }
    uint16_t t01[2];
    memcpy(t01, r, 4);
    assert_int_equal(t01[0], 0x3F80); /* tie to even: down */
    assert_int_equal(t01[1], 0x3F82); /* tie to even: up */
    free(r);
    /* other types and shapes */
    assert_null(kvt_bf16x_pack(KVT_TYPE_F32, f16, n_in, n_out, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_Q8_0, f16, n_in, n_out, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_BF16, b16, 5, 2, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_BF16, b16, 0, 2, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_BF16, b16, 6, 0, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_BF16, NULL, 6, 2, false, NULL));
    assert_null(kvt_bf16x_pack(KVT_TYPE_BF16, b16, INT64_MAX - 1, INT64_MAX / 2, false, NULL)); /* overflow */
}

/* A matrix large enough to be packed by several threads: the same layout, and a non-bf16 F16
 * value in the last group (another thread's part) still refuses the matrix. */
static void test_pack_large(void **st) {
    (void)st;
    const int64_t n_in = 2048, n_out = 2050; /* 4.2M values: the threaded path; 2 padding rows */
    uint16_t *f16 = malloc((size_t)(n_in * n_out) * 2);
    uint64_t s = 17;
    for (int64_t i = 0; i < n_in * n_out; i++) f16[i] = kvt_f32_to_f16(kvt_bf16_to_f32(kvt_f32_to_bf16(tu_randf(&s))));
    size_t bytes = 0;
    uint8_t *a = kvt_bf16x_pack(KVT_TYPE_F16, f16, n_in, n_out, false, &bytes);
    assert_non_null(a);
    assert_int_equal(bytes, (size_t)129 * 16 * 1024 * 4);
    for (int k = 0; k < 20000; k++) {
        const int64_t o = (int64_t)(tu_rand(&s) % 2064), i = (int64_t)(tu_rand(&s) % (uint64_t)n_in);
        uint16_t got;
        memcpy(&got, a + (size_t)(o / 16) * 1024 * 64 + (size_t)(i / 2) * 64 + 4 * (size_t)(o % 16) + 2 * (size_t)(i % 2), 2);
        const uint16_t want = o < n_out ? (uint16_t)(fbits(kvt_f16_to_f32(f16[o * n_in + i])) >> 16) : 0;
        assert_int_equal(got, want);
    }
    free(a);
    f16[(n_out - 1) * n_in + 5] = kvt_f32_to_f16(1.0f + 0x1p-9f);
    assert_null(kvt_bf16x_pack(KVT_TYPE_F16, f16, n_in, n_out, false, &bytes));
    assert_int_equal(bytes, 0);
    free(f16);
}

/* ---------------- GEMM / GEMV ---------------- */

/* Random BF16 matrix packed, random f32 activations converted; specials: denormal weights and
 * activations, zeros, a huge pair (overflow to inf in some outputs). */
typedef struct mm_case {
    int64_t n_in, n_out, n_rows;
    uint8_t *W;
    uint16_t *wrow; /* row-major bf16, n_out x n_in */
    float *x;       /* n_rows x n_in */
    uint8_t *act;   /* bf16 rows */
} mm_case;

static void mm_make(mm_case *c, int64_t n_in, int64_t n_out, int64_t n_rows, uint64_t seed, bool specials) {
    c->n_in = n_in, c->n_out = n_out, c->n_rows = n_rows;
    c->wrow = malloc((size_t)(n_in * n_out) * 2);
    c->x = malloc((size_t)(n_in * n_rows) * 4);
    c->act = malloc(kvt_act_bytes(KVT_TYPE_BF16X, n_in, n_rows));
    uint64_t s = seed;
    for (int64_t i = 0; i < n_in * n_out; i++) c->wrow[i] = kvt_f32_to_bf16(tu_randf(&s) * 0.1f);
    for (int64_t i = 0; i < n_in * n_rows; i++) c->x[i] = tu_randf(&s) * 3.0f;
    if (specials) {
        for (int64_t i = 0; i < n_in * n_out; i += 7) c->wrow[i] = (uint16_t)(tu_rand(&s) & 0x807F); /* zero/denormal */
        for (int64_t i = 3; i < n_in * n_rows; i += 11) c->x[i] = ldexpf(tu_randf(&s), -130);          /* denormal */
        c->wrow[0] = 0x7F00, c->x[0] = 3e38f; /* inf products in the first output */
    }
    c->W = kvt_bf16x_pack(KVT_TYPE_BF16, c->wrow, n_in, n_out, false, NULL);
    assert_non_null(c->W);
    kvt_act_quantize(KVT_TYPE_BF16X, c->x, n_in, 0, n_rows, c->act);
}
static void mm_free(mm_case *c) { free(c->W), free(c->wrow), free(c->x), free(c->act); }

/* dispatched over [o0, o1) == reference; nothing outside [o0, o1) written */
static void mm_check(const mm_case *c, int64_t o0, int64_t o1) {
    const int64_t ldy = c->n_out + 3;
    float *ref = malloc((size_t)(c->n_rows * ldy) * 4), *got = malloc((size_t)(c->n_rows * ldy) * 4);
    for (int64_t i = 0; i < c->n_rows * ldy; i++) ref[i] = got[i] = -777.0f;
    kvt_matmul_rows_ref(KVT_TYPE_BF16X, c->W, c->n_in, c->act, c->n_rows, ref, ldy, o0, o1);
    kvt_matmul_rows(KVT_TYPE_BF16X, c->W, c->n_in, c->act, c->n_rows, got, ldy, o0, o1);
    for (int64_t r = 0; r < c->n_rows; r++)
        for (int64_t o = 0; o < ldy; o++) {
            const float a = ref[r * ldy + o], b = got[r * ldy + o];
            if (!same_float(a, b))
                fail_msg("n_in %lld n_out %lld rows %lld [%lld,%lld): y[%lld][%lld] = %a, reference %a", (long long)c->n_in,
                         (long long)c->n_out, (long long)c->n_rows, (long long)o0, (long long)o1, (long long)r,
                         (long long)o, b, a);
            if (o < o0 || o >= o1) assert_true(b == -777.0f);
        }
    free(ref), free(got);
}

static void test_matmul_vs_ref(void **st) {
    (void)st;
    const int64_t ins[] = {2, 6, 64, 578};
    const int64_t outs[] = {1, 15, 16, 17, 33, 70};
    const int64_t rows[] = {1, 2, 3, 4, 5, 12, 13, 25, 61, 75};
    for (size_t a = 0; a < KVT_ARRAY_LEN(ins); a++)
        for (size_t b = 0; b < KVT_ARRAY_LEN(outs); b++)
            for (size_t r = 0; r < KVT_ARRAY_LEN(rows); r++) {
                if (ins[a] == 578 && rows[r] > 13 && outs[b] > 17) continue; /* keep the scalar reference quick */
                mm_case c;
                mm_make(&c, ins[a], outs[b], rows[r], 1000 * a + 10 * b + r, (a + b + r) % 2 == 0);
                mm_check(&c, 0, c.n_out);
                if (c.n_out > 3) mm_check(&c, 1, c.n_out - 2);   /* ranges not on group boundaries */
                if (c.n_out > 20) mm_check(&c, 16, c.n_out);
                if (c.n_out > 20) mm_check(&c, 5, 21);
                mm_free(&c);
            }
}

/* Each output is one sequential chain: a row computed alone, in any batch, on any ISA (the others
 * fall back to the reference) and in any column split gives the same bits. */
static void test_batch_and_isa_invariance(void **st) {
    (void)st;
    mm_case c;
    mm_make(&c, 576, 100, 37, 77, false);
    const int64_t N = c.n_out;
    float *all = malloc((size_t)(c.n_rows * N) * 4), *one = malloc((size_t)N * 4), *split = malloc((size_t)(c.n_rows * N) * 4);
    kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act, c.n_rows, all, N, 0, N);
    for (int64_t r = 0; r < c.n_rows; r++) {
        kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act + (size_t)r * 2 * (size_t)c.n_in, 1, one, N, 0, N);
        assert_memory_equal(one, all + r * N, (size_t)N * 4);
    }
    kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act, c.n_rows, split, N, 0, 48);
    kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act, c.n_rows, split, N, 48, N);
    assert_memory_equal(split, all, (size_t)(c.n_rows * N) * 4);
    for (int i = KVT_ISA_SCALAR; i <= (int)kvt_kernels_best_isa(); i++) {
        assert_true(kvt_kernels_force_isa((kvt_isa)i));
        memset(split, 0, (size_t)(c.n_rows * N) * 4);
        kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act, c.n_rows, split, N, 0, N);
        assert_memory_equal(split, all, (size_t)(c.n_rows * N) * 4);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(all), free(one), free(split);
    mm_free(&c);
}

/* The arithmetic is a dot product of the weights with the bf16-rounded activations: within f32
 * rounding of the exact (double) sum, and within bf16 rounding (2^-8 relative per activation) of
 * the f32 activations' dot. Catches a layout that the kernel and the reference misread alike. */
static void test_matmul_is_the_dot(void **st) {
    (void)st;
    mm_case c;
    mm_make(&c, 1536, 40, 9, 4242, false);
    float *y = malloc((size_t)(c.n_rows * c.n_out) * 4);
    kvt_matmul_rows(KVT_TYPE_BF16X, c.W, c.n_in, c.act, c.n_rows, y, c.n_out, 0, c.n_out);
    const uint16_t *xb = (const uint16_t *)c.act;
    for (int64_t r = 0; r < c.n_rows; r++)
        for (int64_t o = 0; o < c.n_out; o++) {
            double exact = 0, absx = 0, f32dot = 0;
            for (int64_t k = 0; k < c.n_in; k++) {
                const double w = kvt_bf16_to_f32(c.wrow[o * c.n_in + k]);
                exact += w * kvt_bf16_to_f32(xb[r * c.n_in + k]);
                f32dot += w * c.x[r * c.n_in + k];
                absx += fabs(w * c.x[r * c.n_in + k]);
            }
            const double got = y[r * c.n_out + o];
            assert_true(fabs(got - exact) <= 1e-6 * absx);
            assert_true(fabs(got - f32dot) <= 0x1p-8 * absx);
        }
    free(y);
    mm_free(&c);
}

/* ---------------- activation conversion ---------------- */
static void test_act_convert(void **st) {
    (void)st;
    const int64_t n = 333;
    float x[333];
    uint64_t s = 8;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)tu_rand(&s);
        memcpy(&x[i], &u, 4); /* any bit pattern: NaNs, infs, denormals included */
    }
    x[0] = 1.0f + 0x1p-8f;                /* tie, even below: rounds down */
    x[1] = 1.0f + 3 * 0x1p-8f;            /* tie, odd below: rounds up */
    x[2] = 3.4028235e38f;                 /* FLT_MAX: rounds to inf */
    x[3] = -0.0f, x[4] = NAN, x[5] = -INFINITY, x[6] = 0x1p-140f;
    uint16_t ref[333], got[333];
    kvt_quantize_ref(KVT_TYPE_BF16, x, ref, n);
    for (int i = KVT_ISA_SCALAR; i <= (int)kvt_kernels_best_isa(); i++) {
        assert_true(kvt_kernels_force_isa((kvt_isa)i));
        memset(got, 0xAA, sizeof got);
        kvt_act_quantize(KVT_TYPE_BF16X, x, n, 0, 1, got);
        assert_memory_equal(got, ref, sizeof ref);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    assert_int_equal(ref[0], 0x3F80);
    assert_int_equal(ref[1], 0x3F82);
    assert_int_equal(ref[2], 0x7F80);
    assert_true((ref[4] & 0x7FC0) == 0x7FC0); /* quiet NaN */
}

/* ---------------- the model loader ---------------- */

static void test_model_loader(void **st) {
    (void)st;
    if (!has_bf16_kernel()) skip();
    char *dir = tu_tmpdir("bf16x");
    char *p16 = tu_gen_tiny(dir, "f16.gguf", "f16", false), *pfull = tu_gen_tiny(dir, "full.gguf", "f16", true);
    char *pq8 = tu_gen_tiny(dir, "q8.gguf", "q8_0", false);
    assert_true(kvt_bf16x_enabled());
    tu_fx a, b, q;
    tu_fx_open(&a, p16, 16);
    tu_fx_open(&b, pfull, 16);
    tu_fx_open(&q, pq8, 16);
    /* bf16-valued F16 matrices are packed; full-precision F16 ones go to the f16 groups
     * (test_f16x), Q8_0 ones stay */
    assert_int_equal(kvt_model_output(a.m)->type, KVT_TYPE_BF16X);
    assert_int_equal(kvt_model_output(b.m)->type, KVT_TYPE_F16X);
    assert_int_equal(kvt_model_tok_embd(a.m)->type, KVT_TYPE_F16); /* the tied embedding is untouched */
    assert_string_equal(kvt_model_numerics_tag(a.m), "+bf16x");
    assert_string_equal(kvt_model_numerics_tag(b.m), "+f16x");
    assert_string_equal(kvt_model_numerics_tag(q.m), "");
    /* the same file on the f32 path (AVX2 at load time: no bf16 kernel, the f16 groups) gives close logits */
    const kvt_isa best = kvt_kernels_best_isa();
    assert_true(kvt_kernels_force_isa(KVT_ISA_AVX2));
    assert_false(kvt_bf16x_enabled());
    tu_fx c;
    tu_fx_open(&c, p16, 16);
    assert_int_equal(kvt_model_output(c.m)->type, KVT_TYPE_F16X); /* the f32 activations of the groups */
    assert_string_equal(kvt_model_numerics_tag(c.m), "+f16x");
    assert_true(kvt_kernels_force_isa(best));
    const uint32_t V = kvt_model_hparams(a.m)->n_vocab;
    int32_t tok[24];
    uint64_t s = 3;
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)(tu_rand(&s) % V);
    float *la = malloc(V * 4), *lc = malloc(V * 4);
    tu_last_logits(&a, tok, 24, 24, la);
    tu_last_logits(&c, tok, 24, 24, lc);
    double maxd = 0, maxa = 0;
    for (uint32_t i = 0; i < V; i++) {
        maxd = fmax(maxd, fabs((double)la[i] - lc[i]));
        maxa = fmax(maxa, fabs((double)lc[i]));
    }
    fprintf(stderr, "tiny llama f16: bf16x vs f32 path logits max |diff| %.3g (max |logit| %.3g)\n", maxd, maxa);
    assert_true(maxd > 0);           /* the paths really differ (activations rounded) ... */
    assert_true(maxd < 0.02 * maxa); /* ... by bf16 rounding, not more */
    free(la), free(lc);
    tu_fx_close(&a), tu_fx_close(&b), tu_fx_close(&c), tu_fx_close(&q);
    unlink(p16), unlink(pfull), unlink(pq8);
    rmdir(dir);
    free(p16), free(pfull), free(pq8), free(dir);
}

/* KVT_BF16X (read once at kernel init: checked in child processes): 0/off keeps the f32 path,
 * round also packs F16 matrices that are not bf16-valued, anything else keeps the default. The
 * children run with KVT_F16X=0, so what the bf16 kernel does not take stays F16 (test_f16x checks
 * the two together). */
static char g_self[512];
/* the child's "policy output-type tag" for env value `env` and model `path` */
static void child_says(const char *env, const char *path, char *out, size_t len) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "KVT_F16X=0 KVT_BF16X='%s' '%s' --print-bf16x '%s' 2>/dev/null", env, g_self, path);
    tu_child_line(cmd, out, len);
}

static void test_env(void **st) {
    (void)st;
    if (!has_bf16_kernel()) skip();
    char *dir = tu_tmpdir("bf16xenv");
    char *p16 = tu_gen_tiny(dir, "f16.gguf", "f16", false), *pfull = tu_gen_tiny(dir, "full.gguf", "f16", true);
    char out[128];
    child_says("0", p16, out, sizeof out);
    assert_string_equal(out, "0 f16 -");
    child_says("off", pfull, out, sizeof out);
    assert_string_equal(out, "0 f16 -");
    child_says("1", p16, out, sizeof out);
    assert_string_equal(out, "1 bf16x +bf16x");
    child_says("1", pfull, out, sizeof out);
    assert_string_equal(out, "1 f16 -");
    child_says("round", pfull, out, sizeof out); /* opt-in: full-precision F16 rounded to bf16 */
    assert_string_equal(out, "2 bf16x +bf16x");
    child_says("bogus", p16, out, sizeof out); /* warns, keeps the default */
    assert_string_equal(out, "1 bf16x +bf16x");
    unlink(p16), unlink(pfull);
    rmdir(dir);
    free(p16), free(pfull), free(dir);
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--print-bf16x")) { /* child of test_env */
        char err[256];
        kvt_gguf *g = NULL;
        kvt_model *m = NULL;
        if (kvt_gguf_open(argv[2], &g, err, sizeof err) || kvt_model_load(g, &m, err, sizeof err)) return 1;
        const char *tag = kvt_model_numerics_tag(m);
        printf("%d %s %s\n", (int)kvt_bf16x_policy(), kvt_type_name(kvt_model_output(m)->type), *tag ? tag : "-");
        kvt_model_free(m);
        kvt_gguf_free(g);
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    g_self[n > 0 ? n : 0] = 0;
    kvt_kernels_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type),          cmocka_unit_test(test_instruction_model),
        cmocka_unit_test(test_pack),          cmocka_unit_test(test_pack_large),
        cmocka_unit_test(test_matmul_vs_ref),
        cmocka_unit_test(test_batch_and_isa_invariance), cmocka_unit_test(test_matmul_is_the_dot),
        cmocka_unit_test(test_act_convert),   cmocka_unit_test(test_model_loader),
        cmocka_unit_test(test_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
