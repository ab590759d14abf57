/* test_kv_codec.c — f16/bf16/MLX-affine row codecs (kv-codecs.md §1.2–1.5) and their SIMD decoders
 * (the f32 vector ops attention runs on are tested in test_vec.c). */
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
        float d1 = kvt_vec_dot(x, y, len), d2 = kvt_vec_dot_ref(x, y, len);
        assert_memory_equal(&d1, &d2, 4);
        memcpy(y1, y, sizeof y);
        memcpy(y2, y, sizeof y);
        kvt_vec_axpy(y1, 0.37f, x, len);
        kvt_vec_axpy_ref(y2, 0.37f, x, len);
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

/* kvt_decode_rows_part (split-K attention's V columns) equals the same elements of the scalar whole-row
 * decode of each row: f16/bf16 at every start and width, affine over every group range (every width
 * and group, f16 and bf16 scales), rows at a stride longer than a row, at the native SIMD level and
 * the scalar one. */
static void test_decode_rows_part(void **st) {
    (void)st;
    kvt_kv_cpu_init();
    enum { NR = 3, RB = 400 }; /* rows of at most 384 bytes (256 dims of 8-bit affine + scales) */
    float xr[NR * 256], full[NR * 256], part[NR * 256];
    uint8_t rows[NR * RB];
    uint64_t rng = 11;
    for (int i = 0; i < NR * 256; i++) xr[i] = tu_randf(&rng) * 4;
    const int top = kvt_vec_level();
    for (int lv = top; lv >= 0; lv -= top > 0 ? top : 1) {
        kvt_vec_force_level(lv);
        const kvt_codec half[2] = {{.kind = KVT_CODEC_F16}, {.kind = KVT_CODEC_BF16}};
        for (int k = 0; k < 2; k++) {
            for (int r = 0; r < NR; r++) {
                kvt_codec_encode_row(half[k], xr + r * 40, 40, rows + r * RB);
                kvt_decode_row_scalar(half[k], rows + r * RB, 40, full + r * 40);
            }
            for (uint32_t d0 = 0; d0 < 40; d0++)
                for (uint32_t w = 1; d0 + w <= 40; w++) {
                    memset(part, 0xff, sizeof part);
                    kvt_decode_rows_part(half[k], rows, RB, 40, d0, w, NR, part);
                    for (int r = 0; r < NR; r++) assert_memory_equal(part + r * w, full + r * 40 + d0, w * sizeof(float));
                }
        }
        const uint32_t bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
        for (int b = 0; b < 6; b++)
            for (int gi = 0; gi < 3; gi++)
                for (int sb = 0; sb < 2; sb++) {
                    kvt_codec c = aff(bits[b], groups[gi]);
                    c.scale_bf16 = (uint8_t)sb;
                    const uint32_t G = groups[gi], ng = 256 / G;
                    assert_true(kvt_codec_row_bytes(c, 256) <= RB);
                    for (int r = 0; r < NR; r++) {
                        kvt_codec_encode_row(c, xr + r * 256, 256, rows + r * RB);
                        kvt_decode_row_scalar(c, rows + r * RB, 256, full + r * 256);
                    }
                    for (uint32_t g0 = 0; g0 < ng; g0++)
                        for (uint32_t g1 = g0 + 1; g1 <= ng; g1++) {
                            const uint32_t w = (g1 - g0) * G;
                            memset(part, 0xff, sizeof part);
                            kvt_decode_rows_part(c, rows, RB, 256, g0 * G, w, NR, part);
                            for (int r = 0; r < NR; r++)
                                assert_memory_equal(part + r * w, full + r * 256 + g0 * G, w * sizeof(float));
                        }
                }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_vectors), cmocka_unit_test(test_special_groups),
        cmocka_unit_test(test_roundtrip_all),  cmocka_unit_test(test_validity),
        cmocka_unit_test(test_bf16_f16_rounding), cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_f16_encode_matches), cmocka_unit_test(test_decode_rows_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
