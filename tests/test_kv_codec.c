/* test_kv_codec.c — f16/bf16/MLX-affine row codecs (kv-codecs.md §1.2–1.5) and the SIMD helpers. */
#include <float.h>
#include <math.h>

#include "testutil.h"
#include "kv/kv.h"
#include "kv/kv_int.h"

static kvt_codec aff(uint32_t bits, uint32_t g) {
    return (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)bits, .group_size = (uint16_t)g};
}

/* Independent code extraction: element j of the row's u32 word stream (LSB first). */
static uint32_t stream_code(const uint8_t *row, uint32_t j, uint32_t b) {
    uint32_t code = 0;
    for (uint32_t k = 0; k < b; k++) {
        uint32_t bit = j * b + k, w;
        memcpy(&w, row + 4 * (bit / 32), 4);
        code |= ((w >> (bit % 32)) & 1u) << k;
    }
    return code;
}

static uint32_t word_at(const uint8_t *row, uint32_t w) {
    uint32_t v;
    memcpy(&v, row + 4 * w, 4);
    return v;
}

/* §1.5 worked vectors: w[j] = j - 10, G = 32. */
static void test_worked_vectors(void **st) {
    (void)st;
    float w[32];
    for (int j = 0; j < 32; j++) w[j] = (float)(j - 10);
    uint32_t codes[32];
    float s, b;
    kvt_affine_quantize_group(w, 32, 4, codes, &s, &b);
    assert_true(fabsf(s - -2.0999999f) < 1e-6f);
    assert_true(b == 21.0f);
    static const uint32_t c4[32] = {15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 10, 9, 9, 8, 8,
                                    7,  7,  6,  6,  5,  5,  4,  4,  3,  3,  2,  2,  1, 1, 0, 0};
    for (int j = 0; j < 32; j++) assert_int_equal(codes[j], c4[j]);

    uint8_t row[64];
    float out[32];
    kvt_codec_encode_row(aff(4, 32), w, 32, row);
    assert_int_equal(kvt_codec_row_bytes(aff(4, 32), 32), 16 + 4);
    assert_int_equal(word_at(row, 0), 0xbccddeefu);
    assert_int_equal(word_at(row, 1), 0x8899aaabu);
    assert_int_equal(word_at(row, 2), 0x44556677u);
    assert_int_equal(word_at(row, 3), 0x00112233u);
    uint16_t hs, hb;
    memcpy(&hs, row + 16, 2);
    memcpy(&hb, row + 18, 2);
    assert_true(kvt_f16_to_f32(hs) == -2.0996094f);
    assert_true(kvt_f16_to_f32(hb) == 21.0f);
    kvt_codec_decode_row(aff(4, 32), row, 32, out);
    assert_true(out[10] == -2.0996094f * 10.0f + 21.0f); /* zero decodes to 0.0039 after fp16 scale */
    assert_true(fabsf(out[10] - 0.0039f) < 1e-4f);

    kvt_codec_encode_row(aff(3, 32), w, 32, row);
    assert_int_equal(word_at(row, 0), 0x6ddb6fffu);
    assert_int_equal(word_at(row, 1), 0x36dc925bu);
    assert_int_equal(word_at(row, 2), 0x00124a49u);
    kvt_codec_encode_row(aff(2, 32), w, 32, row);
    assert_int_equal(word_at(row, 0), 0xaaaaabffu);
    assert_int_equal(word_at(row, 1), 0x00055555u);
    kvt_affine_quantize_group(w, 32, 2, codes, &s, &b);
    assert_true(s == -10.5f && b == 21.0f);
    kvt_codec_encode_row(aff(8, 32), w, 32, row);
    assert_int_equal(word_at(row, 0), 0xe7eff7ffu);
    assert_int_equal(word_at(row, 1), 0xc6ced6deu);
    assert_int_equal(word_at(row, 7), 0x00081019u);
    kvt_affine_quantize_group(w, 32, 8, codes, &s, &b);
    assert_true(fabsf(s - -0.12138728f) < 1e-7f);
}

static void test_special_groups(void **st) {
    (void)st;
    float w[32];
    uint32_t codes[32];
    float s, b, out[32];
    uint8_t row[64];
    /* constant group: s = -1e-7 adjusted to c/q0, bias c, all codes 0, decodes exactly to c */
    for (int j = 0; j < 32; j++) w[j] = 3.0f;
    kvt_affine_quantize_group(w, 32, 4, codes, &s, &b);
    assert_true(b == 3.0f && s < 0 && s > -2e-7f);
    for (int j = 0; j < 32; j++) assert_int_equal(codes[j], 0);
    kvt_codec_encode_row(aff(4, 32), w, 32, row);
    kvt_codec_decode_row(aff(4, 32), row, 32, out);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 3.0f);
    /* all-zero group: q0 == 0 so bias 0 and scale stays -1e-7 */
    memset(w, 0, sizeof w);
    kvt_affine_quantize_group(w, 32, 8, codes, &s, &b);
    assert_true(b == 0.0f && s == -1e-7f);
    for (int j = 0; j < 32; j++) assert_int_equal(codes[j], 0);
    kvt_codec_encode_row(aff(8, 32), w, 32, row);
    kvt_codec_decode_row(aff(8, 32), row, 32, out);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 0.0f);
    /* all-negative group w[j] = -(j+1): |min| > |max| so the scale is POSITIVE, bias = min = -32.
     * 4-bit: s0 = 31/15, q0 = rint(-32/s0) = rint(-15.48) = -15, s = -32/-15 = 2.1333, codes
     * rint((w+32)/2.1333): w=-32 -> 0, w=-17 -> rint(7.03) = 7, w=-1 -> rint(14.53) = 15. */
    for (int j = 0; j < 32; j++) w[j] = (float)-(j + 1);
    kvt_affine_quantize_group(w, 32, 4, codes, &s, &b);
    assert_true(s > 0 && fabsf(s - 32.0f / 15.0f) < 1e-6f && b == -32.0f);
    assert_int_equal(codes[31], 0);
    assert_int_equal(codes[16], 7);
    assert_int_equal(codes[0], 15);
    /* extreme: one outlier near the f16 maximum, tiny values elsewhere */
    for (int j = 0; j < 32; j++) w[j] = 1e-6f * (float)j;
    w[5] = 60000.0f;
    kvt_affine_quantize_group(w, 32, 8, codes, &s, &b);
    assert_true(b == 60000.0f && s < 0);
    assert_int_equal(codes[5], 0);
    kvt_codec_encode_row(aff(8, 32), w, 32, row);
    kvt_codec_decode_row(aff(8, 32), row, 32, out);
    assert_true(out[5] == 60000.0f);
    for (int j = 0; j < 32; j++) assert_true(fabsf(out[j] - w[j]) <= fabsf(s) * 0.5f + 60000.0f * 2e-3f);
}

/* Round trip for every bits x group: codes match the reference quantizer through an independent
 * unpacker, stored scale/bias are the rounded fp32 values, and per-element error is bounded.
 * Bound: unclipped elements |x - x^| <= |s|/2 + slack, clipped far extreme <= |s| + slack, with
 * slack = u*(n_bins*|s| + |b|) (16-bit rounding of scale and bias: |s'-s| <= u|s| per code step, at
 * most n_bins steps; |b'-b| <= u|b|) + n_bins*2^-25 (f16 subnormal scales have absolute spacing
 * 2^-24) + 8*FLT_EPSILON*(n_bins*|s| + |b|) (fp32 rounding of the divisions and of decode). */
static void check_roundtrip(kvt_codec c, uint64_t *rng) {
    const uint32_t dim = 256, G = c.group_size, b = c.bits, n_bins = (1u << b) - 1;
    float x[256], y[256];
    uint8_t row[1024];
    const double u = c.scale_bf16 ? 1.0 / 256 : 1.0 / 2048;
    for (int trial = 0; trial < 20; trial++) {
        float amp = trial % 4 == 0 ? 100.0f : trial % 4 == 1 ? 0.01f : 1.0f;
        for (uint32_t i = 0; i < dim; i++) x[i] = tu_randf(rng) * amp + (trial % 3 == 0 ? amp : 0.0f);
        if (trial % 5 == 1) x[3] = amp * 8; /* outlier channel */
        kvt_codec_encode_row(c, x, dim, row);
        kvt_codec_decode_row(c, row, dim, y);
        const uint8_t *sc = row + dim * b / 8, *bi = sc + 2 * (dim / G);
        for (uint32_t g = 0; g < dim / G; g++) {
            uint32_t codes[128];
            float s, bias;
            kvt_affine_quantize_group(x + g * G, G, b, codes, &s, &bias);
            uint16_t hs, hb;
            memcpy(&hs, sc + 2 * g, 2);
            memcpy(&hb, bi + 2 * g, 2);
            assert_int_equal(hs, c.scale_bf16 ? kvt_f32_to_bf16(s) : kvt_f32_to_f16(s));
            assert_int_equal(hb, c.scale_bf16 ? kvt_f32_to_bf16(bias) : kvt_f32_to_f16(bias));
            const double slack = u * (n_bins * fabs(s) + fabs(bias)) + n_bins * ldexp(1, -25) +
                                 8 * FLT_EPSILON * (n_bins * fabs(s) + fabs(bias));
            for (uint32_t i = 0; i < G; i++) {
                uint32_t j = g * G + i;
                assert_int_equal(stream_code(row, j, b), codes[i]);
                float raw = rintf((x[j] - bias) / s);
                bool clipped = raw > (float)n_bins;
                double err = fabs((double)x[j] - (double)y[j]);
                double bound = (clipped ? 1.0 : 0.5) * fabs(s) + slack;
                if (err > bound) fail_msg("b%u g%u j%u x=%g y=%g s=%g err=%g bound=%g", b, G, j, x[j], y[j], s, err, bound);
            }
        }
    }
}

static void test_roundtrip_all(void **st) {
    (void)st;
    uint64_t rng = 42;
    const uint32_t bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    for (int bf = 0; bf < 2; bf++)
        for (size_t i = 0; i < 6; i++)
            for (size_t k = 0; k < 3; k++) {
                kvt_codec c = aff(bits[i], groups[k]);
                c.scale_bf16 = (uint8_t)bf;
                assert_true(kvt_codec_valid(c, 256));
                assert_int_equal(kvt_codec_row_bytes(c, 256), 256 * bits[i] / 8 + 4 * (256 / groups[k]));
                check_roundtrip(c, &rng);
            }
}

static void test_validity(void **st) {
    (void)st;
    assert_false(kvt_codec_valid(aff(7, 32), 64));
    assert_false(kvt_codec_valid(aff(1, 32), 64));
    assert_false(kvt_codec_valid(aff(4, 48), 96));
    assert_false(kvt_codec_valid(aff(4, 64), 96)); /* 96 % 64 != 0 */
    assert_true(kvt_codec_valid(aff(4, 32), 96));
    assert_false(kvt_codec_valid((kvt_codec){.kind = KVT_CODEC_F16}, 0));
    assert_false(kvt_codec_valid((kvt_codec){.kind = (kvt_codec_kind)9}, 64));
    char name[32];
    kvt_codec_name(aff(8, 64), name, sizeof name);
    assert_string_equal(name, "q8g64");
    kvt_codec_name((kvt_codec){.kind = KVT_CODEC_BF16}, name, sizeof name);
    assert_string_equal(name, "bf16");
}

static void test_bf16_f16_rounding(void **st) {
    (void)st;
    const float xs[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, INFINITY};
    const uint16_t bf[] = {0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80};
    uint8_t row[16];
    kvt_codec_encode_row((kvt_codec){.kind = KVT_CODEC_BF16}, xs, 5, row);
    for (int i = 0; i < 5; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        assert_int_equal(h, bf[i]);
    }
    /* NaN (signalling payload) becomes a quiet NaN */
    uint32_t snan = 0x7f800001u;
    float fn;
    memcpy(&fn, &snan, 4);
    kvt_codec_encode_row((kvt_codec){.kind = KVT_CODEC_BF16}, &fn, 1, row);
    uint16_t h;
    memcpy(&h, row, 2);
    assert_true((h & 0x7f80) == 0x7f80 && (h & 0x0040));
    float back;
    kvt_codec_decode_row((kvt_codec){.kind = KVT_CODEC_BF16}, row, 1, &back);
    assert_true(isnan(back));
    /* f16: tie to even at 1 + 2^-11, overflow to inf at 65520, subnormal 2^-24 */
    const float fx[] = {1.0f + 0x1p-11f, 65520.0f, 0x1p-24f, 1.0f + 0x1p-11f + 0x1p-12f};
    const uint16_t fh[] = {0x3c00, 0x7c00, 0x0001, 0x3c01};
    kvt_codec_encode_row((kvt_codec){.kind = KVT_CODEC_F16}, fx, 4, row);
    for (int i = 0; i < 4; i++) {
        memcpy(&h, row + 2 * i, 2);
        assert_int_equal(h, fh[i]);
    }
}

/* f16 encode (F16C groups of 8 where the CPU has it) equals kvt_f32_to_f16 for every element:
 * random values over 2^-30..2^20 (zero, subnormal, normal, overflow), ±inf, -0, NaNs with payloads
 * (a NaN sends its group to the scalar path), at every length 1..40 and offset. */
static void test_f16_encode_matches(void **st) {
    (void)st;
    kvt_kv_cpu_init();
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x);
    uint8_t *row = malloc(2 * N);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const float m = (float)((r >> 40) & 0xffffff) / 16777216.0f;
        x[i] = ldexpf(m, (int)((r >> 20) % 51) - 30) * ((r >> 19) & 1 ? -1.0f : 1.0f);
    }
    x[5] = INFINITY, x[6] = -INFINITY, x[7] = -0.0f, x[8] = 65519.0f, x[9] = 65520.0f;
    const uint32_t nans[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu};
    for (int k = 0; k < 4; k++) memcpy(&x[100 + 37 * k], &nans[k], 4);
    kvt_codec_encode_row((kvt_codec){.kind = KVT_CODEC_F16}, x, N, row);
    for (int i = 0; i < N; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        assert_int_equal(h, kvt_f32_to_f16(x[i]));
    }
    for (uint32_t len = 1; len <= 40; len++)
        for (uint32_t off = 0; off < 3; off++) {
            kvt_codec_encode_row((kvt_codec){.kind = KVT_CODEC_F16}, x + 95 + off, len, row);
            for (uint32_t i = 0; i < len; i++) {
                uint16_t h;
                memcpy(&h, row + 2 * i, 2);
                assert_int_equal(h, kvt_f32_to_f16(x[95 + off + i]));
            }
        }
    free(x), free(row);
}

/* SIMD vs scalar references: F16C decode, dot and axpy must give identical bits. */
static void test_simd_vs_scalar(void **st) {
    (void)st;
    kvt_kv_cpu_init();
    if (!kvt_kv_cpu_has_avx2()) { /* the fast paths would be the scalar code: nothing to compare */
        print_message("skipped: this CPU has no AVX2/F16C, the fast paths are the scalar ones\n");
        skip();
    }
    static uint16_t all[65536];
    static float a[65536], b[65536];
    uint32_t n = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        bool snan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) && !(i & 0x200);
        if (!snan) all[n++] = (uint16_t)i; /* F16C quiets signalling NaNs; the encoder never makes them */
    }
    kvt_codec f16 = {.kind = KVT_CODEC_F16};
    kvt_decode_row_fast(f16, (const uint8_t *)all, n, a);
    kvt_decode_row_scalar(f16, (const uint8_t *)all, n, b);
    assert_memory_equal(a, b, n * sizeof(float));
    uint64_t rng = 7;
    float x[80], y[80], y1[80], y2[80];
    for (uint32_t len = 1; len <= 80; len++) {
        for (uint32_t i = 0; i < len; i++) x[i] = tu_randf(&rng), y[i] = tu_randf(&rng) * 3;
        float d1 = kvt_kv_dot(x, y, len), d2 = kvt_kv_dot_scalar(x, y, len);
        assert_memory_equal(&d1, &d2, 4);
        memcpy(y1, y, sizeof y);
        memcpy(y2, y, sizeof y);
        kvt_kv_axpy(y1, 0.37f, x, len);
        kvt_kv_axpy_scalar(y2, 0.37f, x, len);
        assert_memory_equal(y1, y2, len * sizeof(float));
    }
    /* affine fast path == scalar */
    float xr[256], o1[256], o2[256];
    uint8_t row[1024];
    for (int i = 0; i < 256; i++) xr[i] = tu_randf(&rng);
    const uint32_t bits[] = {2, 3, 4, 5, 6, 8};
    const uint32_t groups[] = {32, 64, 128};
    for (int k = 0; k < 6; k++)
        for (int gi = 0; gi < 3; gi++)
            for (int sb = 0; sb < 2; sb++) {
                kvt_codec c = aff(bits[k], groups[gi]);
                c.scale_bf16 = (uint8_t)sb;
                kvt_codec_encode_row(c, xr, 256, row);
                kvt_decode_row_fast(c, row, 256, o1);
                kvt_decode_row_scalar(c, row, 256, o2);
                assert_memory_equal(o1, o2, sizeof o1);
            }
    /* bf16 rows (AVX2 widening vs scalar), including a tail */
    kvt_codec bf = {.kind = KVT_CODEC_BF16};
    kvt_codec_encode_row(bf, xr, 253, row);
    kvt_decode_row_fast(bf, row, 253, o1);
    kvt_decode_row_scalar(bf, row, 253, o2);
    assert_memory_equal(o1, o2, 253 * sizeof(float));
}

/* Multi-row dot / axpy used by attention == looping the scalar single-row helpers, bit for bit,
 * for row counts around the 8-row block and dims with and without an 8-multiple. */
static void test_rows_vs_scalar(void **st) {
    (void)st;
    kvt_kv_cpu_init();
    uint64_t rng = 11;
    static float k[40 * 136], q[136], s1[40], s2[40], y1[136], y2[136], w[40];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = tu_randf(&rng) * 2;
    for (int i = 0; i < 136; i++) q[i] = tu_randf(&rng);
    for (int i = 0; i < 40; i++) w[i] = tu_randf(&rng) + 0.5f;
    const uint32_t dims[] = {8, 32, 64, 128, 136, 20, 3};
    for (int di = 0; di < 7; di++) {
        const uint32_t n = dims[di];
        for (uint32_t nr = 0; nr <= 40; nr++) {
            kvt_kv_dot_rows(q, k, n, nr, n, 0.125f, s1);
            kvt_kv_dot_rows_scalar(q, k, n, nr, n, 0.125f, s2);
            assert_memory_equal(s1, s2, nr * sizeof(float));
            for (uint32_t r = 0; r < nr; r++) { /* and each equals the single-row helper */
                float one = kvt_kv_dot(q, k + (size_t)r * n, n) * 0.125f;
                assert_memory_equal(&one, &s1[r], 4);
            }
            for (uint32_t i = 0; i < n; i++) y1[i] = y2[i] = tu_randf(&rng);
            kvt_kv_axpy_rows(y1, w, k, n, nr, n);
            kvt_kv_axpy_rows_scalar(y2, w, k, n, nr, n);
            assert_memory_equal(y1, y2, n * sizeof(float));
        }
    }
    /* the scalar forms are not trivially equal to something else: a different order differs */
    float a = kvt_kv_dot_scalar(q, k, 128), b = 0.0f;
    for (int i = 0; i < 128; i++) b += q[i] * k[i];
    assert_true(fabsf(a - b) < 1e-3f);
}

/* dot/axpy/exp numerics v2: every SIMD level (AVX-512, AVX2+FMA, scalar) and the 4-query kernels give
 * the bits of the scalar definitions; exp is accurate and maps -inf to 0 and NaN to NaN. Runs last:
 * it lowers the process-wide SIMD level. */
/* kvt_kv_round_f16 (attention's f16 rounding of Q and of the softmax weights): every SIMD level
 * equals the scalar definition and the kvt_f32_to_f16 round trip, for normals, subnormals, ties,
 * overflow and zeros, with and without a multiplier, in place and out of place. */
/* kvt_kv_round_f16 at the current SIMD level equals the scalar rounding and f16(x*mul). */
static void round_f16_check(void) {
    enum { N = 77 };
    static float x[N], a[N], b[N];
    uint64_t rng = 7;
    for (int i = 0; i < N; i++) x[i] = ((float)(tu_rand(&rng) % 200001) / 1000.0f - 100.0f) * (i % 3 ? 1.0f : 1e-6f);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 65519.0f, x[3] = 70000.0f, x[4] = 1.0f + 1.0f / 2048.0f; /* tie to even */
    x[5] = 3e-8f, x[6] = -5.96046448e-8f, x[7] = 2.98023224e-8f; /* subnormal half range, tie to 0 */
    const float muls[3] = {1.0f, 0.0123f, 3.5f};
    for (int mi = 0; mi < 3; mi++)
        for (uint32_t n = 1; n <= N; n += (n < 20 ? 1 : 11)) {
            kvt_kv_round_f16(x, a, n, muls[mi]);
            kvt_kv_round_f16_scalar(x, b, n, muls[mi]);
            assert_memory_equal(a, b, n * sizeof(float));
            for (uint32_t i = 0; i < n; i++) {
                const float want = kvt_f16_to_f32(kvt_f32_to_f16(x[i] * muls[mi]));
                assert_memory_equal(&a[i], &want, sizeof(float));
            }
            memcpy(b, x, n * sizeof(float));
            kvt_kv_round_f16(b, b, n, muls[mi]); /* in place */
            assert_memory_equal(a, b, n * sizeof(float));
        }
}

/* Every level (test_fma_levels also checks each level it visits: this test runs after it, when
 * forcing has left the level at scalar). */
static void test_round_f16_levels(void **st) {
    (void)st;
    for (int level = kvt_kv_simd_level(); level >= 0; level--) {
        kvt_kv_force_simd_level(level);
        round_f16_check();
    }
    /* the rounding really happens: 1 + 2^-12 is not an f16 */
    float v = 1.0f + 1.0f / 4096.0f, r;
    kvt_kv_round_f16(&v, &r, 1, 1.0f);
    assert_true(r == 1.0f);
}

/* Transposed-key scores (attention pass 1 on AVX-512) equal the scalar dot bit for bit at every
 * level, for every key count (masked tails, zero padding) and head dim (16-multiples take the SIMD
 * path, others the scalar twin); the transposes (from f32 rows, and from f16 rows as decoded) are
 * exact and zero-pad to 16 columns. test_fma_levels runs it at each level. */
static void dot_kt_check(void) {
    uint64_t rng = 7;
    enum { N = 256, R = 70, LDK = 80 };
    static float q[4][N], k[R * N], kt[N * LDK], kt_s[N * LDK], out[4][R], ref[4][R];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < N; i++) q[j][i] = (float)(tu_rand(&rng) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < R * N; i++) k[i] = (float)(tu_rand(&rng) % 2001) / 700.0f - 1.4f;
    k[3 * N + 5] = -0.0f, q[1][5] = 0.0f; /* a signed-zero product in one lane */
    {
        static const uint32_t dims[] = {16, 32, 48, 64, 80, 128, 256, 40, 7};
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const uint32_t n = dims[di];
            for (uint32_t nk = 1; nk <= 64; nk += (nk < 18 ? 1 : 7)) {
                const uint32_t r0 = nk % 5; /* keys r0..r0+nk-1 of k */
                memset(kt, 0x7f, sizeof kt), memset(kt_s, 0x7f, sizeof kt_s);
                kvt_kv_transpose_rows(k + (size_t)r0 * N, N, nk, n, kt, LDK);
                kvt_kv_transpose_rows_scalar(k + (size_t)r0 * N, N, nk, n, kt_s, LDK);
                const uint32_t np = (nk + 15) & ~15u;
                for (uint32_t d = 0; d < n; d++) {
                    assert_memory_equal(kt + (size_t)d * LDK, kt_s + (size_t)d * LDK, np * sizeof(float));
                    for (uint32_t r = 0; r < np; r++)
                        assert_true(kt[(size_t)d * LDK + r] == (r < nk ? k[(size_t)(r0 + r) * N + d] : 0.0f));
                }
                { /* from f16 rows (row stride 2n + 6 bytes): equal to decoding, then transposing */
                    static uint8_t h16[R * (2 * N + 6)];
                    static float dec[R * N];
                    const size_t rb = 2 * (size_t)n + 6;
                    for (size_t i = 0; i < sizeof h16; i += 2) {
                        uint16_t h = (uint16_t)tu_rand(&rng);
                        if ((h & 0x7c00) == 0x7c00) h &= 0x83ff; /* no inf/NaN: finite, subnormals kept */
                        memcpy(h16 + i, &h, 2);
                    }
                    for (uint32_t r = 0; r < nk; r++)
                        kvt_decode_row_scalar((kvt_codec){.kind = KVT_CODEC_F16}, h16 + r * rb, n, dec + (size_t)r * N);
                    kvt_kv_transpose_rows_scalar(dec, N, nk, n, kt_s, LDK);
                    kvt_kv_transpose_f16_rows(h16, rb, nk, n, kt, LDK);
                    for (uint32_t d = 0; d < n; d++)
                        assert_memory_equal(kt + (size_t)d * LDK, kt_s + (size_t)d * LDK, np * sizeof(float));
                    kvt_kv_transpose_f16_rows_scalar(h16, rb, nk, n, kt, LDK);
                    for (uint32_t d = 0; d < n; d++)
                        assert_memory_equal(kt + (size_t)d * LDK, kt_s + (size_t)d * LDK, np * sizeof(float));
                    kvt_kv_transpose_rows(k + (size_t)r0 * N, N, nk, n, kt, LDK); /* back to the f32 keys */
                }
                for (int rep = 0; rep < 2; rep++) { /* distinct queries, then one query repeated */
                    const float *qq[4] = {q[0], q[rep ? 0 : 1], q[rep ? 0 : 2], q[rep ? 0 : 3]};
                    float *oo[4] = {out[0], out[1], out[2], out[3]};
                    for (int j = 0; j < 4; j++) out[j][nk] = 12345.0f; /* must stay: the masked tail */
                    kvt_kv_dot_kt_q4(qq, kt, LDK, nk, n, 0.125f, oo);
                    for (int j = 0; j < 4; j++) {
                        kvt_kv_dot_rows_scalar(qq[j], k + (size_t)r0 * N, N, nk, n, 0.125f, ref[j]);
                        assert_memory_equal(out[j], ref[j], nk * sizeof(float));
                        if (nk < R) assert_true(out[j][nk] == 12345.0f);
                    }
                    kvt_kv_dot_kt_q4_scalar(qq, kt, LDK, nk, n, 0.125f, oo);
                    for (int j = 0; j < 4; j++) assert_memory_equal(out[j], ref[j], nk * sizeof(float));
                }
            }
        }
    }
}

/* kvt_kv_exp_sum at the current level equals the scalar one bit for bit over a sweep of float bit
 * patterns covering every exp argument range (below EXP_LO, the polynomial range, above EXP_HI,
 * ±0, ±inf, NaN), for several maxima m. */
static void exp_sum_check(void) {
    enum { B = 4096 };
    static float a[B], b[B];
    const float ms[3] = {0.0f, 2.5f, -30.0f};
    uint32_t fill = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 9973) {
        uint32_t u = (uint32_t)bits;
        float f;
        memcpy(&f, &u, 4);
        if (fabsf(f) > 200.0f && f == f && !isinf(f)) f = fmodf(f, 200.0f); /* keep most in range */
        a[fill++] = f;
        if (fill == B || bits + 9973 > 0xffffffffull) {
            if (fill < B) a[fill++] = NAN, a[fill++] = -INFINITY, a[fill++] = INFINITY, a[fill++] = -0.0f;
            for (int mi = 0; mi < 3; mi++)
                for (uint32_t n = fill; n + 16 > fill && n > 0; n -= 5) { /* full vectors and tails */
                    static float r[B];
                    memcpy(b, a, n * sizeof(float)), memcpy(r, a, n * sizeof(float));
                    const float s1 = kvt_kv_exp_sum(b, n, ms[mi]), s0 = kvt_kv_exp_sum_scalar(r, n, ms[mi]);
                    assert_memory_equal(b, r, n * sizeof(float));
                    assert_true(memcmp(&s0, &s1, 4) == 0 || (s0 != s0 && s1 != s1));
                }
            fill = 0;
        }
    }
}

static void test_fma_levels(void **st) {
    (void)st;
    uint64_t rng = 99;
    enum { N = 128, R = 37 };
    static float q[4][N], k[R * N], w[4][R], ref_s[4][R], y0[4][N], y1[4][N], e0[R + 20], e1[R + 20];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < N; i++) q[j][i] = (float)(tu_rand(&rng) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < R * N; i++) k[i] = (float)(tu_rand(&rng) % 2001) / 700.0f - 1.4f;
    for (int j = 0; j < 4; j++)
        for (int r = 0; r < R; r++) w[j][r] = (float)(tu_rand(&rng) % 1000) / 999.0f;
    for (int level = kvt_kv_simd_level(); level >= 0; level--) {
        kvt_kv_force_simd_level(level);
        round_f16_check();
        dot_kt_check();
        exp_sum_check();
        for (uint32_t n = 1; n <= N; n += (n < 20 ? 1 : 13)) {
            for (int j = 0; j < 4; j++)
                for (int r = 0; r < R; r++) {
                    float d = kvt_kv_dot(q[j], k + r * N, n), s = kvt_kv_dot_scalar(q[j], k + r * N, n);
                    assert_memory_equal(&d, &s, 4);
                }
            const float *qq[4] = {q[0], q[1], q[2], q[3]};
            float out[4][R], *oo[4] = {out[0], out[1], out[2], out[3]};
            kvt_kv_dot_q4(qq, k, N, R, n, 0.125f, oo);
            for (int j = 0; j < 4; j++) {
                kvt_kv_dot_rows_scalar(q[j], k, N, R, n, 0.125f, ref_s[j]);
                assert_memory_equal(out[j], ref_s[j], sizeof(float) * R);
                kvt_kv_dot_rows(q[j], k, N, R, n, 0.125f, out[j]);
                assert_memory_equal(out[j], ref_s[j], sizeof(float) * R);
            }
            memset(y0, 0, sizeof y0), memset(y1, 0, sizeof y1);
            float *yy[4] = {y1[0], y1[1], y1[2], y1[3]};
            const float *ww[4] = {w[0], w[1], w[2], w[3]};
            kvt_kv_axpy_q4(yy, ww, k, N, R, n);
            for (int j = 0; j < 4; j++) {
                kvt_kv_axpy_rows_scalar(y0[j], w[j], k, N, R, n);
                assert_memory_equal(y0[j], y1[j], sizeof(float) * n);
            }
        }
        for (int n = 0; n < R + 20; n++) e0[n] = e1[n] = (float)(n % 11) * -3.7f + (n == 5 ? -INFINITY : 0.0f);
        float s0 = kvt_kv_exp_sum_scalar(e0, R + 20, 0.5f), s1 = kvt_kv_exp_sum(e1, R + 20, 0.5f);
        assert_memory_equal(&s0, &s1, 4);
        assert_memory_equal(e0, e1, sizeof e0);
        assert_true(e0[5] == 0.0f);
    }
    for (float x = -87.0f; x <= 0.0f; x += 0.37f) {
        double ref = exp((double)x), got = kvt_kv_exp(x);
        assert_true(fabs(got - ref) <= 4e-7 * ref);
    }
    assert_true(kvt_kv_exp(-INFINITY) == 0.0f && kvt_kv_exp(0.0f) == 1.0f && isnan(kvt_kv_exp(NAN)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_vectors), cmocka_unit_test(test_special_groups),
        cmocka_unit_test(test_roundtrip_all),  cmocka_unit_test(test_validity),
        cmocka_unit_test(test_bf16_f16_rounding), cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_rows_vs_scalar), cmocka_unit_test(test_fma_levels),
        cmocka_unit_test(test_round_f16_levels), cmocka_unit_test(test_f16_encode_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
