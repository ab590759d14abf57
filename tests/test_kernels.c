/* test_kernels.c — block layouts, reference (de)quantization, dispatched SIMD kernels vs scalar
 * reference for every ISA this CPU has, batch invariance of kvt_matmul_rows. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>

#include "kernels/quant.h"
#include "kernels/kernels_internal.h" /* kvt_packed fields: which layout was built (k16 / data) */

static const uint32_t k_types[] = {KVT_TYPE_F32,  KVT_TYPE_F16,  KVT_TYPE_BF16, KVT_TYPE_Q8_0,
                                   KVT_TYPE_Q4_0, KVT_TYPE_Q4_1, KVT_TYPE_Q5_0, KVT_TYPE_Q5_1,
                                   KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static bool is_kquant(uint32_t t) { return t == KVT_TYPE_Q4_K || t == KVT_TYPE_Q5_K || t == KVT_TYPE_Q6_K; }
static bool is_float(uint32_t t) { return t == KVT_TYPE_F32 || t == KVT_TYPE_F16 || t == KVT_TYPE_BF16; }

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* random data with a few outliers so blocks have varied scales */
static void fill_rand(float *x, int64_t n, uint64_t *s, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float v = tu_randf(s) * scale;
        if ((tu_rand(s) & 63) == 0) v *= 4.0f;
        x[i] = v;
    }
}

/* every ISA this CPU supports up to AVX-512, scalar first (AMX, whose prefill GEMM has its own float
 * order, is tested by the amx tests below) */
static int isa_list(kvt_isa out[3]) {
    int n = 0;
    for (int i = KVT_ISA_SCALAR; i <= (int)kvt_kernels_best_isa() && i <= KVT_ISA_AVX512; i++) out[n++] = (kvt_isa)i;
    return n;
}

/* ---------------- type table ---------------- */
static void test_type_table(void **st) {
    (void)st;
    assert_string_equal(kvt_type_name(KVT_TYPE_Q4_K), "q4_K");
    assert_string_equal(kvt_type_name(KVT_TYPE_F16), "f16");
    assert_string_equal(kvt_type_name(4), "?");
    assert_int_equal(kvt_type_from_name("q8_0"), KVT_TYPE_Q8_0);
    assert_int_equal(kvt_type_from_name("Q4_K"), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_type_from_name("bf16"), KVT_TYPE_BF16);
    assert_int_equal(kvt_type_from_name("q4_k_m"), -1);
    assert_true(kvt_type_known(KVT_TYPE_Q2_K));
    assert_false(kvt_type_supported(KVT_TYPE_Q2_K));
    assert_false(kvt_type_known(4));
    assert_false(kvt_type_known(31));
    assert_false(kvt_type_known(1000));
    for (size_t i = 0; i < N_TYPES; i++) assert_true(kvt_type_supported(k_types[i]));
    assert_int_equal(kvt_type_block_bytes(KVT_TYPE_Q6_K), 210);
    assert_int_equal(kvt_type_block_bytes(KVT_TYPE_Q8_K), 292);
    assert_int_equal(kvt_type_block_elems(KVT_TYPE_Q5_K), 256);
    assert_int_equal(kvt_type_row_bytes(KVT_TYPE_Q8_0, 576), 18 * 34);
    assert_int_equal(kvt_type_row_bytes(KVT_TYPE_Q8_0, 577), 0);
    assert_int_equal(kvt_type_row_bytes(KVT_TYPE_F16, 7), 14);
    assert_int_equal(kvt_type_row_bytes(99, 256), 0);
    assert_int_equal(kvt_vec_dot_type(KVT_TYPE_Q4_1), KVT_TYPE_Q8_1);
    assert_int_equal(kvt_vec_dot_type(KVT_TYPE_Q6_K), KVT_TYPE_Q8_K);
    assert_int_equal(kvt_vec_dot_type(KVT_TYPE_Q5_0), KVT_TYPE_Q8_0);
    assert_int_equal(kvt_vec_dot_type(KVT_TYPE_F16), KVT_TYPE_F32);
    assert_int_equal(kvt_act_bytes(KVT_TYPE_Q4_K, 512, 3), 3 * 2 * 292);
}

/* ---------------- hand-built blocks ---------------- */
static void test_hand_small_blocks(void **st) {
    (void)st;
    uint8_t b[64];
    float y[32];
    /* Q8_0: d = 0.5, qs[j] = j - 16 */
    put16(b, 0x3800);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    kvt_dequant_ref(KVT_TYPE_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.5f * (float)(j - 16));
    /* Q4_0: d = 1, byte j = (j) | (15-j)<<4: element j = j-8, element j+16 = 7-j */
    put16(b, 0x3C00);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    kvt_dequant_ref(KVT_TYPE_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j - 8));
        assert_true(y[j + 16] == (float)(7 - j));
    }
    /* Q4_1: d = 2, m = -1 */
    put16(b, 0x4000);
    put16(b + 2, 0xBC00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    kvt_dequant_ref(KVT_TYPE_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)j - 1.0f);
        assert_true(y[j + 16] == 2.0f * (float)(15 - j) - 1.0f);
    }
    /* Q5_0: d = 1, qh = bits 0, 3 and 31 (LE bytes 09 00 00 80) */
    put16(b, 0x3C00);
    b[2] = 0x09, b[3] = 0x00, b[4] = 0x00, b[5] = 0x80;
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    kvt_dequant_ref(KVT_TYPE_Q5_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        int hi0 = (j == 0 || j == 3) ? 16 : 0, hi1 = (j == 15) ? 16 : 0;
        assert_true(y[j] == (float)((j | hi0) - 16));
        assert_true(y[j + 16] == (float)(((15 - j) | hi1) - 16));
    }
    /* Q5_1: d = 0.5, m = 2, same bits */
    put16(b, 0x3800);
    put16(b + 2, 0x4000);
    b[4] = 0x09, b[5] = 0x00, b[6] = 0x00, b[7] = 0x80;
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    kvt_dequant_ref(KVT_TYPE_Q5_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        int hi0 = (j == 0 || j == 3) ? 16 : 0, hi1 = (j == 15) ? 16 : 0;
        assert_true(y[j] == 0.5f * (float)(j | hi0) + 2.0f);
        assert_true(y[j + 16] == 0.5f * (float)((15 - j) | hi1) + 2.0f);
    }
    /* F16 / BF16 */
    uint16_t h[4] = {0x3C00, 0xC000, 0x3555, 0x0001};
    kvt_dequant_ref(KVT_TYPE_F16, h, y, 4);
    assert_true(y[0] == 1.0f && y[1] == -2.0f && fabsf(y[2] - 0.33325195f) < 1e-7f && y[3] == ldexpf(1.0f, -24));
    uint16_t bf[2] = {0x3F80, 0xC040};
    kvt_dequant_ref(KVT_TYPE_BF16, bf, y, 2);
    assert_true(y[0] == 1.0f && y[1] == -3.0f);
}

/* Q4_K / Q5_K scales: sc_j = 10 + 7j, m_j = 3j + 1 (j >= 4 exercise the high 2 bits) */
static void pack_k_scales(uint8_t s[12], const int sc[8], const int m[8]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}
static void test_hand_k_blocks(void **st) {
    (void)st;
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) sc[j] = 10 + 7 * j, m[j] = 3 * j + 1;
    float y[256];
    /* Q4_K: d = 1, dmin = 0.5; qs[32c+l] = (l&15) | ((l+c)&15)<<4 */
    uint8_t b4[144];
    put16(b4, 0x3C00);
    put16(b4 + 2, 0x3800);
    pack_k_scales(b4 + 4, sc, m);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) b4[16 + 32 * c + l] = (uint8_t)((l & 15) | (((l + c) & 15) << 4));
    kvt_dequant_ref(KVT_TYPE_Q4_K, b4, y, 256);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            assert_true(y[64 * c + l] == (float)(sc[2 * c] * (l & 15)) - 0.5f * (float)m[2 * c]);
            assert_true(y[64 * c + 32 + l] == (float)(sc[2 * c + 1] * ((l + c) & 15)) - 0.5f * (float)m[2 * c + 1]);
        }
    /* Q5_K: same plus qh[l] = l*37: bit 2c → +16 for the low half, bit 2c+1 for the high half */
    uint8_t b5[176];
    put16(b5, 0x3C00);
    put16(b5 + 2, 0x3800);
    pack_k_scales(b5 + 4, sc, m);
    for (int l = 0; l < 32; l++) b5[16 + l] = (uint8_t)(l * 37);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) b5[48 + 32 * c + l] = (uint8_t)((l & 15) | (((l + c) & 15) << 4));
    kvt_dequant_ref(KVT_TYPE_Q5_K, b5, y, 256);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t qh = (uint8_t)(l * 37);
            int q0 = (l & 15) + (((qh >> (2 * c)) & 1) << 4), q1 = ((l + c) & 15) + (((qh >> (2 * c + 1)) & 1) << 4);
            assert_true(y[64 * c + l] == (float)(sc[2 * c] * q0) - 0.5f * (float)m[2 * c]);
            assert_true(y[64 * c + 32 + l] == (float)(sc[2 * c + 1] * q1) - 0.5f * (float)m[2 * c + 1]);
        }
    /* Q6_K: element e = 128h + 32k + l has low 4 bits in ql[64h + 32(k&1) + l] (low nibble if k<2),
     * high 2 bits at qh[32h + l] >> 2k; scale scales[e/16]; d = 0.25 */
    uint8_t b6[210];
    int q6[256];
    for (int e = 0; e < 256; e++) q6[e] = (e * 29 + 7) & 63;
    memset(b6, 0, sizeof b6);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        uint8_t *ql = &b6[64 * h + 32 * (k & 1) + l];
        *ql |= (uint8_t)((q6[e] & 15) << (k < 2 ? 0 : 4));
        b6[128 + 32 * h + l] |= (uint8_t)((q6[e] >> 4) << (2 * k));
    }
    for (int i = 0; i < 16; i++) b6[192 + i] = (uint8_t)(int8_t)(i - 8);
    put16(b6 + 208, 0x3400);
    kvt_dequant_ref(KVT_TYPE_Q6_K, b6, y, 256);
    for (int e = 0; e < 256; e++) assert_true(y[e] == 0.25f * (float)(e / 16 - 8) * (float)(q6[e] - 32));
}

/* ---------------- reference quantizers ---------------- */
static double type_tol(uint32_t t) { /* max |err| / block amax */
    switch (t) {
    case KVT_TYPE_F32: return 0.0;
    case KVT_TYPE_F16: return 1e-3;
    case KVT_TYPE_BF16: return 8e-3;
    case KVT_TYPE_Q8_0: return 0.0045;
    case KVT_TYPE_Q4_0: case KVT_TYPE_Q4_1: return 0.13;
    case KVT_TYPE_Q5_0: case KVT_TYPE_Q5_1: return 0.065;
    case KVT_TYPE_Q4_K: return 0.15;
    case KVT_TYPE_Q5_K: return 0.08;
    default: return 0.06; /* Q6_K */
    }
}
static void test_quantize_roundtrip(void **st) {
    (void)st;
    uint64_t s = 42;
    const int64_t n = 1024;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc(4096 * 2);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        fill_rand(x, n, &s, 1.0f);
        for (int i = 0; i < 32; i++) x[256 + i] = 0.0f; /* an all-zero block */
        for (int i = 0; i < 32; i++) x[512 + i] = 0.3f + 0.01f * (float)i; /* all-positive block */
        kvt_quantize_ref(t, x, q, n);
        kvt_dequant_ref(t, q, y, n);
        const int64_t be = kvt_type_block_elems(t) < 32 ? 32 : kvt_type_block_elems(t);
        for (int64_t b0 = 0; b0 < n; b0 += be) {
            float amax = 0.0f;
            for (int64_t i = b0; i < b0 + be; i++) amax = fmaxf(amax, fabsf(x[i]));
            for (int64_t i = b0; i < b0 + be; i++) {
                const double err = fabs((double)y[i] - (double)x[i]);
                if (err > type_tol(t) * amax + 1e-7) {
                    fprintf(stderr, "%s: i=%lld x=%g y=%g amax=%g\n", kvt_type_name(t), (long long)i, x[i], y[i], amax);
                    fail();
                }
            }
        }
    }
    free(x), free(y), free(q);
}

/* ---------------- activation quantization ---------------- */
static void test_act_quantize(void **st) {
    (void)st;
    float x[512];
    for (int i = 0; i < 512; i++) x[i] = (float)((i % 32) - 16) * 0.125f;
    /* Q8_0: block amax 2 → d = 2/127, qs = round(x*127/2) */
    uint8_t buf[4 * 292];
    kvt_act_quantize(KVT_TYPE_Q8_0, x, 32, 0, 1, buf);
    uint16_t h;
    memcpy(&h, buf, 2);
    assert_int_equal(h, kvt_f32_to_f16(2.0f / 127.0f));
    for (int j = 0; j < 32; j++) assert_int_equal((int8_t)buf[2 + j], (int)roundf(x[j] * 63.5f));
    /* Q8_1: s = d * sum(q) */
    kvt_act_quantize(KVT_TYPE_Q4_1, x, 32, 0, 1, buf);
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += (int8_t)buf[4 + j];
    memcpy(&h, buf + 2, 2);
    assert_int_equal(h, kvt_f32_to_f16((float)sum * (2.0f / 127.0f)));
    /* Q8_K: f32 d, bsums are sums of 16 qs */
    kvt_act_quantize(KVT_TYPE_Q4_K, x, 256, 0, 1, buf);
    float d;
    memcpy(&d, buf, 4);
    assert_true(fabsf(d - 2.0f / 127.0f) < 1e-7f);
    for (int g = 0; g < 16; g++) {
        int bs = 0;
        for (int l = 0; l < 16; l++) bs += (int8_t)buf[4 + 16 * g + l];
        int16_t got;
        memcpy(&got, buf + 260 + 2 * g, 2);
        assert_int_equal(got, bs);
    }
    /* Q8_0/Q8_1 activations round as ggml's CPU quantizer: id = 127/amax and ties to even
     * (84.5 -> 84, -2.5 -> -2, 3.5 -> 4), where the weight quantizer (kvt_quantize_ref, ggml's
     * _ref) rounds them away from zero */
    float tx[32] = {127.0f, 84.5f, -2.5f, 3.5f};
    for (int t = 0; t < 2; t++) {
        kvt_act_quantize(t ? KVT_TYPE_Q5_1 : KVT_TYPE_Q8_0, tx, 32, 0, 1, buf);
        const int8_t *qs = (const int8_t *)(buf + (t ? 4 : 2));
        assert_int_equal(qs[0], 127);
        assert_int_equal(qs[1], 84);
        assert_int_equal(qs[2], -2);
        assert_int_equal(qs[3], 4);
    }
    uint8_t wq[34];
    kvt_quantize_ref(KVT_TYPE_Q8_0, tx, wq, 32);
    assert_int_equal((int8_t)wq[2 + 1], 85);
    assert_int_equal((int8_t)wq[2 + 2], -3);
    /* disjoint row ranges give the same buffer as one call */
    uint8_t a1[2 * 292], a2[2 * 292];
    kvt_act_quantize(KVT_TYPE_Q6_K, x, 256, 0, 2, a1);
    kvt_act_quantize(KVT_TYPE_Q6_K, x, 256, 0, 1, a2);
    kvt_act_quantize(KVT_TYPE_Q6_K, x, 256, 1, 2, a2);
    assert_memory_equal(a1, a2, sizeof a1);
}

/* Dispatched (SIMD) activation quantization writes the same bytes as kvt_act_quantize_ref of the
 * vec-dot type, including exact .5 ties (Q8_0/Q8_1 and Q8_K round them to even). */
static void test_act_quantize_dispatch(void **st) {
    (void)st;
    const int64_t n = 1024, nr = 3;
    float *x = malloc(n * nr * 4);
    uint64_t s = 11;
    fill_rand(x, n * nr, &s, 5.0f);
    for (int j = 0; j < 32; j++) x[j] = (float)j - 15.5f; /* amax 16.5 → not a tie, but ... */
    for (int j = 0; j < 32; j++) x[32 + j] = (j == 0) ? 127.0f : (float)(j - 16) + 0.5f; /* d=1: ties */
    for (int j = 0; j < 256; j++) x[256 + j] = (j == 3) ? -127.0f : (float)(j % 64 - 32) + 0.5f;
    for (int j = 0; j < 256; j++) x[512 + j] = 0.0f;
    x[600] = 2.0f, x[601] = -2.0f; /* magnitude tie: the first one sets the sign */
    /* row 1 (values within ±20): the largest magnitude as a 256-block's last element, and a
     * magnitude tie 16-element chunks apart (the SIMD Q8_K finds the first by vector compare) */
    x[1024 + 255] = 99.0f;
    x[1280 + 17] = -98.5f, x[1280 + 250] = 98.5f;
    /* row 2: 32-blocks from 2^-32 to 2^18 times the values, so the f16 scales (F16C conversion in
     * the SIMD paths) cover zero, subnormal, normal and overflow-to-inf */
    for (int64_t j = 2 * n; j < 3 * n; j++) x[j] *= ldexpf(1.0f, (int)((j - 2 * n) / 32 * 50 / 31) - 32);
    const uint32_t wts[] = {KVT_TYPE_Q8_0, KVT_TYPE_Q4_1, KVT_TYPE_Q4_K};
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (int w = 0; w < 3; w++) {
        const uint32_t vt = kvt_vec_dot_type(wts[w]);
        const size_t rb = kvt_act_bytes(wts[w], n, 1);
        uint8_t *ref = malloc(rb * nr), *got = malloc(rb * nr);
        for (int64_t r = 0; r < nr; r++) kvt_act_quantize_ref(vt, x + r * n, ref + r * rb, n);
        for (int k = 0; k < ni; k++) {
            assert_true(kvt_kernels_force_isa(isas[k]));
            memset(got, 0xAA, rb * nr);
            kvt_act_quantize(wts[w], x, n, 0, nr, got);
            assert_memory_equal(ref, got, rb * nr);
        }
        free(ref), free(got);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(x);
}

/* ---------------- dispatch ---------------- */
static void test_isa_force(void **st) {
    (void)st;
    kvt_kernels_init();
    const kvt_isa best = kvt_kernels_best_isa();
    assert_true(kvt_kernels_force_isa(KVT_ISA_SCALAR));
    assert_int_equal(kvt_kernels_isa(), KVT_ISA_SCALAR);
    assert_true(kvt_kernels_force_isa(best));
    assert_int_equal(kvt_kernels_isa(), best);
    if (best < KVT_ISA_AVX512) assert_false(kvt_kernels_force_isa(KVT_ISA_AVX512));
    assert_string_equal(kvt_isa_name(KVT_ISA_AVX2), "avx2");
    fprintf(stderr, "best ISA: %s\n", kvt_isa_name(best));
}

static void test_dequant_dispatch(void **st) {
    (void)st;
    uint64_t s = 7;
    const int64_t n = 512 + 256;
    float *x = malloc(n * 4), *r = malloc(n * 4), *d = malloc(n * 4);
    uint8_t *q = malloc(n * 4);
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        fill_rand(x, n, &s, 3.0f);
        kvt_quantize_ref(t, x, q, n);
        kvt_dequant_ref(t, q, r, n);
        for (int k = 0; k < ni; k++) {
            assert_true(kvt_kernels_force_isa(isas[k]));
            memset(d, 0xff, n * 4);
            kvt_dequant_row(t, q, d, n);
            assert_memory_equal(r, d, n * 4);
        }
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(x), free(r), free(d), free(q);
}

/* ---------------- matmul ---------------- */
typedef struct {
    uint32_t t;
    int64_t n_in, n_out, n_rows;
    float *xf;   /* [n_rows][n_in] original activations */
    float *wf;   /* [n_out][n_in] dequantized weights */
    uint8_t *w;  /* quantized weights */
    uint8_t *a;  /* quantized activations */
} mm_case;

static void mm_setup(mm_case *c, uint32_t t, int64_t n_in, int64_t n_out, int64_t n_rows, uint64_t seed) {
    uint64_t s = seed;
    c->t = t, c->n_in = n_in, c->n_out = n_out, c->n_rows = n_rows;
    c->xf = malloc((size_t)(n_rows * n_in) * 4);
    c->wf = malloc((size_t)(n_out * n_in) * 4);
    float *wsrc = malloc((size_t)(n_out * n_in) * 4);
    fill_rand(wsrc, n_out * n_in, &s, 0.5f);
    fill_rand(c->xf, n_rows * n_in, &s, 2.0f);
    c->w = malloc(kvt_type_row_bytes(t, n_in) * n_out);
    kvt_quantize_ref(t, wsrc, c->w, n_out * n_in);
    kvt_dequant_ref(t, c->w, c->wf, n_out * n_in);
    c->a = malloc(kvt_act_bytes(t, n_in, n_rows));
    kvt_act_quantize(t, c->xf, n_in, 0, n_rows, c->a);
    free(wsrc);
}
static void mm_free(mm_case *c) { free(c->xf), free(c->wf), free(c->w), free(c->a); }

/* Σ|w·x| over the dot of (o, r), with x the dequantized activation, for tolerances */
static double abs_dot(const mm_case *c, const float *xq, int64_t o, int64_t r) {
    double s = 0;
    for (int64_t k = 0; k < c->n_in; k++) s += fabs((double)c->wf[o * c->n_in + k] * xq[r * c->n_in + k]);
    return s;
}

/* Dispatched vs reference for every ISA. K-quants: bit-exact (same integers, same float
 * expression). Other types: the block integer dots are exact in both, only the float summation
 * order differs (lane-parallel vs sequential), so |diff| <= 1e-5 · Σ|w·x| (a few ulps per block
 * term, with a wide margin). */
static void check_vs_ref(const mm_case *c) {
    const int64_t no = c->n_out, nr = c->n_rows;
    float *yr = malloc((size_t)(no * nr) * 4), *ys = malloc((size_t)(no * nr) * 4);
    float *xq = malloc((size_t)(nr * c->n_in) * 4);
    kvt_dequant_ref(kvt_vec_dot_type(c->t), c->a, xq, nr * c->n_in);
    kvt_matmul_rows_ref(c->t, c->w, c->n_in, c->a, nr, yr, no, 0, no);
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (int k = 0; k < ni; k++) {
        assert_true(kvt_kernels_force_isa(isas[k]));
        memset(ys, 0xff, (size_t)(no * nr) * 4);
        kvt_matmul_rows(c->t, c->w, c->n_in, c->a, nr, ys, no, 0, no);
        if (is_kquant(c->t) || isas[k] == KVT_ISA_SCALAR) {
            assert_memory_equal(yr, ys, (size_t)(no * nr) * 4);
            continue;
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t o = 0; o < no; o++) {
                const double tol = 1e-5 * abs_dot(c, xq, o, r) + 1e-30;
                const double diff = fabs((double)yr[r * no + o] - (double)ys[r * no + o]);
                if (!(diff <= tol)) {
                    fprintf(stderr, "%s isa=%s o=%lld r=%lld ref=%.9g simd=%.9g tol=%g\n", kvt_type_name(c->t),
                            kvt_isa_name(isas[k]), (long long)o, (long long)r, yr[r * no + o], ys[r * no + o], tol);
                    fail();
                }
            }
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(yr), free(ys), free(xq);
}

/* Against a double-precision dot of dequantized W × ORIGINAL activations: catches layout bugs that
 * a self-consistent ref/SIMD pair would share. Bound: activation quantization moves each x by at
 * most half a step (step = block amax/127), so |err| <= Σ_k |w_k|·step_k/2 (+ f16 rounding of Q8_1's
 * s, covered by a 2e-3·Σ|w·x| term; f32-family types only have float rounding). */
static void check_vs_double(const mm_case *c) {
    const int64_t no = c->n_out, nr = c->n_rows, n = c->n_in;
    float *y = malloc((size_t)(no * nr) * 4);
    kvt_matmul_rows(c->t, c->w, n, c->a, nr, y, no, 0, no);
    const int64_t qb = kvt_vec_dot_type(c->t) == KVT_TYPE_Q8_K ? 256 : 32;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t o = 0; o < no; o++) {
            double exact = 0, absd = 0, bound = 0;
            const float *x = c->xf + r * n, *w = c->wf + o * n;
            for (int64_t b0 = 0; b0 < n; b0 += qb) {
                double amax = 0;
                for (int64_t k = b0; k < b0 + qb && k < n; k++) amax = fmax(amax, fabs(x[k]));
                for (int64_t k = b0; k < b0 + qb && k < n; k++) {
                    exact += (double)w[k] * x[k];
                    absd += fabs((double)w[k] * x[k]);
                    bound += fabs(w[k]) * amax / 127.0 * 0.5;
                }
            }
            const double tol = is_float(c->t) ? 1e-5 * absd + 1e-6 : bound * 1.01 + 2e-3 * absd + 1e-6;
            if (!(fabs(exact - y[r * no + o]) <= tol)) {
                fprintf(stderr, "%s o=%lld r=%lld exact=%.9g got=%.9g tol=%g\n", kvt_type_name(c->t), (long long)o,
                        (long long)r, exact, y[r * no + o], tol);
                fail();
            }
        }
    free(y);
}

/* Batch invariance for the active ISA: each row computed alone == rows computed together;
 * split output ranges == the whole range. memcmp, not tolerance. */
static void check_invariance(const mm_case *c) {
    const int64_t no = c->n_out, nr = c->n_rows, n = c->n_in;
    const size_t arb = kvt_act_bytes(c->t, n, 1);
    float *all = malloc((size_t)(no * nr) * 4), *one = malloc((size_t)(no * nr) * 4);
    float *split = malloc((size_t)(no * nr) * 4);
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (int k = 0; k < ni; k++) {
        assert_true(kvt_kernels_force_isa(isas[k]));
        kvt_matmul_rows(c->t, c->w, n, c->a, nr, all, no, 0, no);
        for (int64_t r = 0; r < nr; r++)
            kvt_matmul_rows(c->t, c->w, n, c->a + (size_t)r * arb, 1, one + r * no, no, 0, no);
        assert_memory_equal(all, one, (size_t)(no * nr) * 4);
        /* uneven splits: [0,1) [1,s) [s,no) with s = min(6, no) */
        const int64_t s6 = no < 6 ? no : 6;
        memset(split, 0xff, (size_t)(no * nr) * 4);
        kvt_matmul_rows(c->t, c->w, n, c->a, nr, split, no, 0, 1);
        kvt_matmul_rows(c->t, c->w, n, c->a, nr, split, no, 1, s6);
        kvt_matmul_rows(c->t, c->w, n, c->a, nr, split, no, s6, no);
        assert_memory_equal(all, split, (size_t)(no * nr) * 4);
        /* rows in chunks of 3 (+ remainder) */
        for (int64_t r0 = 0; r0 < nr; r0 += 3) {
            const int64_t r1 = r0 + 3 < nr ? r0 + 3 : nr;
            kvt_matmul_rows(c->t, c->w, n, c->a + (size_t)r0 * arb, r1 - r0, split + r0 * no, no, 0, no);
        }
        assert_memory_equal(all, split, (size_t)(no * nr) * 4);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(all), free(one), free(split);
}

static int64_t n_in_for(uint32_t t) {
    if (is_kquant(t)) return 512;
    if (is_float(t)) return 531; /* odd: exercises the vector tails */
    return 576;
}

static void test_matmul_vs_ref(void **st) {
    (void)st;
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (int64_t nr = 1; nr <= 9; nr += 4) {
            mm_case c;
            mm_setup(&c, k_types[ti], n_in_for(k_types[ti]), 13, nr, 100 + ti * 10 + (uint64_t)nr);
            check_vs_ref(&c);
            mm_free(&c);
        }
}
static void test_matmul_vs_double(void **st) {
    (void)st;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        mm_case c;
        mm_setup(&c, k_types[ti], n_in_for(k_types[ti]), 9, 3, 200 + ti);
        check_vs_double(&c);
        mm_free(&c);
    }
}
static void test_matmul_batch_invariance(void **st) {
    (void)st;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        mm_case c;
        mm_setup(&c, k_types[ti], n_in_for(k_types[ti]), 13, 7, 300 + ti);
        check_invariance(&c);
        mm_free(&c);
    }
    /* F32/F16/BF16: AVX2 takes one weight row x up to 8 activation rows for 2..16 rows: 2 to 5 rows
     * one tile each (7 outputs, and the splits of check_invariance start off the 4-row groups), 11
     * rows = a tile of 8 and one of 3 (chunks of 3: tiles of 3, then one of 2), 16 = two of 8, 17
     * the 4 x 2 tiles of prefill; all equal one row at a time */
    const uint32_t fts[] = {KVT_TYPE_F32, KVT_TYPE_F16, KVT_TYPE_BF16};
    const int64_t frows[] = {2, 3, 4, 5, 11, 16, 17};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < sizeof frows / sizeof frows[0]; ri++) {
            mm_case c;
            mm_setup(&c, fts[ti], 531, 7, frows[ri], 340 + ti * 8 + ri);
            check_invariance(&c);
            mm_free(&c);
        }
}
/* Single-row K-quant products (decode GEMV: the 4-row kernels on 512-bit and 256-bit vectors,
 * gemv_k4 in kernels_x86_tmpl.h) equal the scalar reference bit for bit over many super-blocks, for
 * column ranges that start and end off the 4-row tiles (the remainder rows take the 4x1 tile), and
 * with extreme super-block scales (f16 max and tiny d / dmin: the float expression must be the
 * reference's, not merely close to it). */
static void test_gemv_kquant_vs_ref(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};
    const int64_t ranges[][2] = {{0, 37}, {3, 30}, {1, 2}, {8, 24}, {33, 37}};
    for (size_t ti = 0; ti < 3; ti++) {
        mm_case c;
        mm_setup(&c, ts[ti], 2048, 37, 1, 900 + ti);
        /* rows 5 and 6: extreme d (f16 max 0x7bff, smallest normal 0x0400) in every super-block */
        const size_t rb = kvt_type_row_bytes(ts[ti], 2048), bb = kvt_type_block_bytes(ts[ti]);
        const size_t doff = ts[ti] == KVT_TYPE_Q6_K ? 208 : 0;
        for (int64_t b = 0; b < 8; b++) {
            const uint16_t big = 0x7bff, tiny = 0x0400;
            memcpy(c.w + 5 * rb + (size_t)b * bb + doff, &big, 2);
            memcpy(c.w + 6 * rb + (size_t)b * bb + doff, &tiny, 2);
            if (ts[ti] != KVT_TYPE_Q6_K) memcpy(c.w + 6 * rb + (size_t)b * bb + 2, &big, 2); /* dmin */
        }
        float *yr = malloc(37 * 4), *ys = malloc(37 * 4);
        kvt_matmul_rows_ref(c.t, c.w, c.n_in, c.a, 1, yr, 37, 0, 37);
        kvt_isa isas[3];
        const int ni = isa_list(isas);
        for (int k = 0; k < ni; k++) {
            assert_true(kvt_kernels_force_isa(isas[k]));
            for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                const int64_t o0 = ranges[ri][0], o1 = ranges[ri][1];
                memset(ys, 0xff, 37 * 4);
                kvt_matmul_rows(c.t, c.w, c.n_in, c.a, 1, ys, 37, o0, o1);
                assert_memory_equal(yr + o0, ys + o0, (size_t)(o1 - o0) * 4);
            }
        }
        kvt_kernels_force_isa(kvt_kernels_best_isa());
        free(yr), free(ys);
        mm_free(&c);
    }
}

static void test_matmul_odd_shapes(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q8_0, KVT_TYPE_F16, KVT_TYPE_Q4_K, KVT_TYPE_F32};
    for (size_t ti = 0; ti < 4; ti++)
        for (int64_t nr = 1; nr <= 9; nr++) {
            const int64_t no = 1 + (nr * 5) % 11; /* 6, 11, 5, 10, 4, 9, 3, 8, 2 */
            const int64_t n_in = ts[ti] == KVT_TYPE_Q4_K ? 256 : ts[ti] == KVT_TYPE_Q8_0 ? 32 * nr : 7 + 16 * nr;
            mm_case c;
            mm_setup(&c, ts[ti], n_in, no, nr, 400 + ti * 16 + (uint64_t)nr);
            check_vs_ref(&c);
            check_invariance(&c);
            mm_free(&c);
        }
}

static void test_f32_helpers(void **st) {
    (void)st;
    uint64_t s = 9;
    float a[103], b[103], y1[103], y2[103];
    fill_rand(a, 103, &s, 1.0f);
    fill_rand(b, 103, &s, 1.0f);
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (int k = 0; k < ni; k++) {
        assert_true(kvt_kernels_force_isa(isas[k]));
        for (int n = 0; n <= 103; n += 17) {
            double ref = 0, absd = 0;
            for (int i = 0; i < n; i++) ref += (double)a[i] * b[i], absd += fabs((double)a[i] * b[i]);
            assert_true(fabs(kvt_dot_f32(a, b, n) - ref) <= 1e-5 * absd + 1e-7);
            memcpy(y1, b, sizeof b);
            memcpy(y2, b, sizeof b);
            kvt_axpy_f32(y1, 0.75f, a, n);
            for (int i = 0; i < n; i++) y2[i] = b[i] + 0.75f * a[i];
            for (int i = 0; i < 103; i++) assert_true(fabsf(y1[i] - y2[i]) <= 1e-6f * (1.0f + fabsf(y2[i])));
        }
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
}

/* kvt_kernels_numerics_id names the active kernel table and follows kvt_kernels_force_isa. */
static void test_numerics_id(void **st) {
    (void)st;
    const kvt_isa was = kvt_kernels_isa();
    assert_true(kvt_kernels_force_isa(KVT_ISA_SCALAR));
    assert_string_equal(kvt_kernels_numerics_id(), "scalar");
    if (kvt_kernels_best_isa() >= KVT_ISA_AVX2) {
        assert_true(kvt_kernels_force_isa(KVT_ISA_AVX2));
        assert_string_equal(kvt_kernels_numerics_id(), "avx2");
    }
    if (kvt_kernels_best_isa() >= KVT_ISA_AVX512) {
        assert_true(kvt_kernels_force_isa(KVT_ISA_AVX512));
        const char *id = kvt_kernels_numerics_id();
        assert_true(!strcmp(id, "int8-block") || !strcmp(id, "avx2"));
    }
    assert_true(kvt_kernels_force_isa(was));
}

/* ---------------- repacked prefill GEMM ---------------- */

/* kvt_matmul_packed must equal kvt_matmul_rows bit for bit on every ISA (the numerics id and decode
 * batch invariance rest on it), for any row count and column range; kvt_matmul_packed_ref (scalar,
 * reading the packed layout) equals the SIMD paths, and for K-quants the scalar reference. */
/* One packed matrix P (made under whatever ISA): every ISA's kvt_matmul_packed equals its
 * kvt_matmul_rows bit for bit, full range and column cuts, nothing outside [o0,o1) written. */
/* Single-row products of P's n16 layout (K-quants, Q4_0/Q5_0/Q4_1/Q5_1 under AVX-512 VNNI) against yr (the reference,
 * n_rows rows): kq_n16_ref for all columns, and kvt_matmul_packed under `made` for column cuts at
 * and inside the 16-row groups and the 64-row tiles (nothing outside a cut is written). */
static void check_n16_rows(const mm_case *c, const kvt_packed *P, kvt_isa made, const float *yr) {
    const int64_t no = c->n_out;
    const size_t arb = kvt_act_bytes(c->t, c->n_in, 1);
    float *y = malloc((size_t)no * 4);
    const int64_t cuts[][2] = {{0, no}, {16, no}, {1, no}, {0, 63}, {64, no}, {40, 120}, {no - 5, no}, {no / 2, no / 2 + 1}};
    for (int64_t r = 0; r < c->n_rows; r++) {
        const void *a = (const uint8_t *)c->a + (size_t)r * arb;
        memset(y, 0xff, (size_t)no * 4);
        kq_n16_ref(P, a, y, 0, no);
        assert_memory_equal(yr + r * no, y, (size_t)no * 4);
        if (made == KVT_ISA_SCALAR) continue;
        assert_true(kvt_kernels_force_isa(made));
        for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
            const int64_t o0 = cuts[ci][0], o1 = cuts[ci][1] < no ? cuts[ci][1] : no;
            if (o0 < 0 || o0 >= o1) continue;
            memset(y, 0xff, (size_t)no * 4);
            kvt_matmul_packed(P, a, 1, y, no, o0, o1);
            for (int64_t o = 0; o < no; o++)
                if (o >= o0 && o < o1) assert_memory_equal(yr + r * no + o, y + o, 4);
                else assert_true(((uint32_t *)y)[o] == 0xffffffffu);
        }
    }
    free(y);
}

static void check_packed_one(const mm_case *c, const kvt_packed *P, kvt_isa made) {
    const int64_t no = c->n_out, nr = c->n_rows, n = c->n_in;
    const size_t bytes = (size_t)(no * nr) * 4;
    float *yr = malloc(bytes), *yp = malloc(bytes), *yq = malloc(bytes);
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    const int64_t cuts[][2] = {{0, no}, {0, 1}, {1, no < 6 ? no : 6}, {no < 6 ? no : 6, no}, {no / 2, no}, {no - 1, no},
                               {no < 16 ? 0 : 16, no}, {no < 17 ? 0 : 3, no < 17 ? no : 17}};
    for (int k = 0; k < ni; k++) {
        assert_true(kvt_kernels_force_isa(isas[k]));
        kvt_matmul_rows(c->t, c->w, n, c->a, nr, yr, no, 0, no);
        memset(yp, 0xff, bytes);
        for (size_t ci = 1; ci < 4; ci++) kvt_matmul_packed(P, c->a, nr, yp, no, cuts[ci][0], cuts[ci][1]);
        if (memcmp(yr, yp, bytes)) {
            for (int64_t i = 0; i < no * nr; i++)
                if (memcmp(&yr[i], &yp[i], 4)) {
                    fprintf(stderr, "%s made=%s isa=%s n_in=%lld rows=%lld: o=%lld r=%lld rows=%.9g packed=%.9g\n",
                            kvt_type_name(c->t), kvt_isa_name(made), kvt_isa_name(isas[k]), (long long)n,
                            (long long)nr, (long long)(i % no), (long long)(i / no), yr[i], yp[i]);
                    break;
                }
            fail();
        }
        for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
            if (cuts[ci][0] >= cuts[ci][1]) continue;
            memset(yp, 0xff, bytes);
            kvt_matmul_packed(P, c->a, nr, yp, no, cuts[ci][0], cuts[ci][1]);
            for (int64_t r = 0; r < nr; r++) {
                assert_memory_equal(yr + r * no + cuts[ci][0], yp + r * no + cuts[ci][0],
                                    (size_t)(cuts[ci][1] - cuts[ci][0]) * 4);
                for (int64_t o = 0; o < no; o++) /* nothing outside [o0,o1) is written */
                    if (o < cuts[ci][0] || o >= cuts[ci][1]) assert_true(((uint32_t *)yp)[r * no + o] == 0xffffffffu);
            }
        }
        if (isas[k] == made && isas[k] != KVT_ISA_SCALAR) { /* the scalar emulation of the layout's lane
                                                               * order matches the SIMD path it was built for */
            kvt_matmul_packed_ref(P, c->a, nr, yq, no, 0, no);
            assert_memory_equal(yr, yq, bytes);
        }
    }
    if (is_kquant(c->t)) {
        kvt_matmul_rows_ref(c->t, c->w, n, c->a, nr, yr, no, 0, no);
        kvt_matmul_packed_ref(P, c->a, nr, yq, no, 0, no);
        assert_memory_equal(yr, yq, bytes);
        if (P->k16) { /* the 16-row layout's scalar reference (gemm_k16.c) == the kernel == the reference */
            memset(yq, 0xff, bytes);
            kq_k16_ref(P, c->a, nr, yq, no, 0, no);
            assert_memory_equal(yr, yq, bytes);
        }
    }
    if (P->n16) { /* the decode layout: its scalar reference and, under the ISA it was made for, the
                   * kernel on every activation row alone, cut anywhere */
        kvt_matmul_rows_ref(c->t, c->w, n, c->a, nr, yr, no, 0, no);
        if (!is_kquant(c->t)) { /* int8-block order (Q4_0/Q5_0) or the 8 lanes of Q4_1/Q5_1: the row-major
                                 * kernel of the ISA it was made under */
            assert_true(kvt_kernels_force_isa(made));
            kvt_matmul_rows(c->t, c->w, n, c->a, nr, yr, no, 0, no);
        }
        check_n16_rows(c, P, made, yr);
    }
    free(yr), free(yp), free(yq);
}

/* kvt_matmul_packed must equal kvt_matmul_rows bit for bit on every ISA (the numerics id and decode
 * batch invariance rest on it), for any row count and column range; kvt_matmul_packed_ref (scalar,
 * reading the packed layout) equals the SIMD path it was built for, and for K-quants the scalar
 * reference. The packed matrix is made under each ISA in turn (the layout depends on it: under
 * AVX-512 VNNI the 16-row layouts of gemm_s16.c / gemm_k16.c, otherwise the 4-row one) and run
 * under every ISA (a layout for another ISA falls back to the row-major kernel). */
static void check_packed(const mm_case *c) {
    const int64_t no = c->n_out, n = c->n_in;
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (int m = 0; m < ni; m++) {
        assert_true(kvt_kernels_force_isa(isas[m]));
        kvt_packed *P = kvt_packed_create(c->t, c->w, n, no);
        assert_non_null(P);
        assert_true(kvt_packed_bytes(P) >= (size_t)((no + 3) / 4) * 4 * (size_t)n);
        const bool vnni512 = isas[m] == KVT_ISA_AVX512 && strcmp(kvt_kernels_numerics_id(), "avx2") != 0;
        const bool want16 = is_kquant(c->t) && vnni512;
        assert_true(want16 == (P->k16 != NULL));
        /* K-quants, Q4_0/Q5_0/Q4_1/Q5_1: the nibble decode layout instead of the 4-row GEMV copy (the
         * 32-weight types: pairs of blocks) */
        const bool wantn = want16 || (vnni512 && c->t != KVT_TYPE_Q8_0 && n % 64 == 0);
        assert_true(wantn == (P->n16 != NULL));
        if (wantn) assert_false(kvt_packed_has_ilv(P));
        if (is_kquant(c->t)) assert_true(want16 == (P->data == NULL)); /* never both layouts */
        check_packed_one(c, P, isas[m]);
        kvt_packed_free(P);
    }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
}

static const uint32_t k_packed_types[] = {KVT_TYPE_Q8_0, KVT_TYPE_Q4_0, KVT_TYPE_Q4_1, KVT_TYPE_Q5_0,
                                          KVT_TYPE_Q5_1, KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};

static void test_packed_matches_rows(void **st) {
    (void)st;
    /* every tile mix: 8-row tiles (512-bit path), 4-row tiles, 1-3 leftover rows (batched decode
     * steps use the GEMM tiles, one row the interleaved GEMV copy) */
    const int64_t rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16, 19};
    const int64_t outs[] = {13, 16, 3};
    for (size_t ti = 0; ti < sizeof k_packed_types / sizeof k_packed_types[0]; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                const uint32_t t = k_packed_types[ti];
                mm_case c;
                mm_setup(&c, t, n_in_for(t), outs[oi], rows[ri], 500 + ti * 64 + ri * 4 + oi);
                check_packed(&c);
                mm_free(&c);
            }
}

/* The single-row GEMV copy (4 rows interleaved by block): built under every SIMD ISA (not under AMX
 * or AVX-512 VNNI for Q8_0/Q4_0/Q5_0, whose row-major kernels have the int8-block order; under AVX-512
 * VNNI Q8_0's 16-row layout serves one row instead, made with KVT_REPACK=gemv too), not under scalar nor with
 * KVT_GEMV_ILV=0, alone with KVT_REPACK=gemv; one activation row on it equals kvt_matmul_rows bit for bit for ranges that start
 * on a 4-row group (the copy), inside one (the original rows) and end in the rows past the last full
 * group, with nothing outside the range written. */
static void test_gemv_interleaved(void **st) {
    (void)st;
    const int64_t outs[] = {4, 7, 67};
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (size_t ti = 0; ti < sizeof k_packed_types / sizeof k_packed_types[0]; ti++)
        for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
            const uint32_t t = k_packed_types[ti];
            const int64_t no = outs[oi], n = is_kquant(t) ? 2048 : 1024;
            const bool small_s = t == KVT_TYPE_Q8_0 || t == KVT_TYPE_Q4_0 || t == KVT_TYPE_Q5_0;
            mm_case c;
            mm_setup(&c, t, n, no, 1, 2100 + ti * 8 + oi);
            float *yr = malloc((size_t)no * 4), *yp = malloc((size_t)no * 4);
            const int64_t cuts[][2] = {{0, no}, {4, no}, {1, no}, {0, 4}, {no - 3, no}, {no > 8 ? 8 : 0, no > 12 ? 12 : no}};
            for (int m = 0; m < ni; m++) {
                assert_true(kvt_kernels_force_isa(isas[m]));
                kvt_packed *P = kvt_packed_create(t, c.w, n, no);
                assert_non_null(P);
                /* AVX-512 VNNI: Q8_0/Q4_0/Q5_0 row-major products take the int8-block order (no copy) */
                const bool int8_block = isas[m] == KVT_ISA_AVX512 && !strcmp(kvt_kernels_numerics_id(), "int8-block");
                /* and all but Q8_0 read a 16-row nibble layout instead of the 4-row copy */
                const bool n16 = t != KVT_TYPE_Q8_0 && int8_block;
                assert_int_equal(kvt_packed_has_ilv(P), isas[m] != KVT_ISA_SCALAR && !(small_s && int8_block) && !n16);
                const char *lay = kvt_packed_gemv_layout(P);
                assert_string_equal(lay ? lay : "rows", isas[m] == KVT_ISA_SCALAR ? "rows"
                                                        : (n16 || (small_s && int8_block)) ? "16-row" : "interleaved");
                kvt_matmul_rows(t, c.w, n, c.a, 1, yr, no, 0, no);
                for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
                    if (cuts[ci][0] >= cuts[ci][1] || cuts[ci][0] < 0) continue;
                    memset(yp, 0xff, (size_t)no * 4);
                    kvt_matmul_packed(P, c.a, 1, yp, no, cuts[ci][0], cuts[ci][1]);
                    for (int64_t o = 0; o < no; o++)
                        if (o >= cuts[ci][0] && o < cuts[ci][1]) assert_memory_equal(yr + o, yp + o, 4);
                        else assert_true(((uint32_t *)yp)[o] == 0xffffffffu);
                }
                kvt_packed_free(P);
            }
            setenv("KVT_GEMV_ILV", "0", 1);
            kvt_packed *P = kvt_packed_create(t, c.w, n, no);
            assert_non_null(P);
            assert_false(kvt_packed_has_ilv(P));
            kvt_packed_free(P);
            unsetenv("KVT_GEMV_ILV");
            /* KVT_REPACK=gemv: the GEMV copy alone; more rows take the original rows, same bits */
            setenv("KVT_REPACK", "gemv", 1);
            P = kvt_packed_create(t, c.w, n, no);
            unsetenv("KVT_REPACK");
            /* under AVX-512 VNNI Q8_0's 16-row layout (gemm_s16.c) is its GEMV copy, and the others
             * have their nibble layouts */
            const bool int8 = small_s && !strcmp(kvt_kernels_numerics_id(), "int8-block");
            assert_non_null(P);
            const bool n16 = t != KVT_TYPE_Q8_0 && !strcmp(kvt_kernels_numerics_id(), "int8-block");
            assert_int_equal(kvt_packed_has_ilv(P), !int8 && !n16);
            assert_non_null(kvt_packed_gemv_layout(P));
            memset(yp, 0xff, (size_t)no * 4);
            kvt_matmul_packed(P, c.a, 1, yp, no, 0, no);
            assert_memory_equal(yr, yp, (size_t)no * 4);
            kvt_packed_free(P);
            free(yr);
            free(yp);
            mm_free(&c);
        }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
}

/* F16/BF16 rows of up to 2 KiB: on AVX2 a single-row GEMV copy alone (kvt_packed kind KQP_F), whose
 * products equal the row-major ones bit for bit for every column cut (on and off the 4-row groups)
 * and every row count (more than one row reads the original rows); no copy under another ISA (its
 * vectors take another lane order), with KVT_GEMV_ILV=0 or KVT_REPACK=0. */
static void test_gemv_interleaved_float(void **st) {
    (void)st;
    const uint32_t types[] = {KVT_TYPE_F16, KVT_TYPE_BF16};
    const int64_t ins[] = {1024, 520}, outs[] = {4, 7, 67};
    kvt_isa isas[3];
    const int ni = isa_list(isas);
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ii = 0; ii < 2; ii++)
            for (size_t oi = 0; oi < 3; oi++) {
                const uint32_t t = types[ti];
                const int64_t n = ins[ii], no = outs[oi];
                mm_case c;
                mm_setup(&c, t, n, no, 3, 2400 + ti * 16 + ii * 4 + oi);
                const size_t ab = kvt_act_bytes(t, n, 1);
                float *yr = malloc((size_t)(3 * no) * 4), *yp = malloc((size_t)(3 * no) * 4);
                const int64_t cuts[][2] = {{0, no}, {4, no}, {1, no}, {0, 4}, {no - 3, no}, {no > 8 ? 8 : 0, no > 12 ? 12 : no}};
                for (int m = 0; m < ni; m++) {
                    assert_true(kvt_kernels_force_isa(isas[m]));
                    kvt_packed *P = kvt_packed_create(t, c.w, n, no);
                    if (isas[m] != KVT_ISA_AVX2) {
                        assert_null(P);
                        continue;
                    }
                    assert_non_null(P);
                    assert_true(kvt_packed_has_ilv(P));
                    kvt_matmul_rows(t, c.w, n, c.a, 3, yr, no, 0, no);
                    for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
                        if (cuts[ci][0] >= cuts[ci][1] || cuts[ci][0] < 0) continue;
                        for (int64_t r = 0; r < 3; r++) { /* each row alone: the GEMV */
                            memset(yp, 0xff, (size_t)no * 4);
                            kvt_matmul_packed(P, c.a + (size_t)r * ab, 1, yp, no, cuts[ci][0], cuts[ci][1]);
                            for (int64_t o = 0; o < no; o++)
                                if (o >= cuts[ci][0] && o < cuts[ci][1]) assert_memory_equal(yr + r * no + o, yp + o, 4);
                                else assert_true(((uint32_t *)yp)[o] == 0xffffffffu);
                        }
                    }
                    memset(yp, 0xff, (size_t)(3 * no) * 4); /* 3 rows at once: the original rows */
                    kvt_matmul_packed(P, c.a, 3, yp, no, 0, no);
                    assert_memory_equal(yr, yp, (size_t)(3 * no) * 4);
                    kvt_matmul_packed_ref(P, c.a, 3, yp, no, 0, no);
                    kvt_matmul_rows_ref(t, c.w, n, c.a, 3, yr, no, 0, no);
                    assert_memory_equal(yr, yp, (size_t)(3 * no) * 4);
                    kvt_packed_free(P);
                }
                kvt_kernels_force_isa(kvt_kernels_best_isa());
                const bool avx2 = kvt_kernels_isa() == KVT_ISA_AVX2;
                setenv("KVT_GEMV_ILV", "0", 1);
                assert_null(kvt_packed_create(t, c.w, n, no));
                unsetenv("KVT_GEMV_ILV");
                setenv("KVT_REPACK", "0", 1);
                assert_null(kvt_packed_create(t, c.w, n, no));
                setenv("KVT_REPACK", "gemv", 1);
                kvt_packed *P = kvt_packed_create(t, c.w, n, no);
                assert_int_equal(P != NULL, avx2);
                kvt_packed_free(P);
                unsetenv("KVT_REPACK");
                free(yr);
                free(yp);
                mm_free(&c);
            }
    kvt_kernels_force_isa(kvt_kernels_best_isa());
}

/* K-quants on the 16-row layout: odd output counts (partial 16-row groups), n_in 256..2048, row
 * counts through every register tile mix (8, 4, 2, 1 rows) and column cuts inside a group. */
static void test_packed_k16_shapes(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};
    const int64_t rows[] = {1, 2, 3, 5, 8, 13, 17, 40};
    const int64_t outs[] = {1, 15, 17, 33};
    const int64_t ins[] = {256, 512, 1280, 2048};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                mm_case c;
                mm_setup(&c, ts[ti], ins[(ri + oi) % 4], outs[oi], rows[ri], 1000 + ti * 64 + ri * 4 + oi);
                check_packed(&c);
                mm_free(&c);
            }
}

/* The nibble decode layouts (K-quants, Q4_0/Q5_0/Q4_1/Q5_1) across 64-row tiles: 10 groups (2 whole tiles and one of 2 groups), a
 * tile alone, every activation row alone (check_n16_rows through check_packed); 3 activation rows
 * (kq_n16_drive's chunks of 2 and 1), 7 (4, 2, 1) and 8 (4, 4: the second chunk reads the tile from L2). */
static void test_packed_n16_tiles(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q4_0, KVT_TYPE_Q6_K, KVT_TYPE_Q5_0, KVT_TYPE_Q4_1, KVT_TYPE_Q5_1};
    const int64_t outs[] = {149, 64, 80}, rows[] = {3, 7, 8};
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
        for (size_t oi = 0; oi < 3; oi++)
            for (size_t ri = 0; ri < 3; ri++) {
                mm_case c;
                mm_setup(&c, ts[ti], oi == 1 ? 2048 : 512, outs[oi], rows[ri], 1400 + ti * 8 + oi + 100 * ri);
                check_packed(&c);
                mm_free(&c);
            }
    /* rows of an odd block count: no nibble layout (it holds pairs of blocks); Q4_1/Q5_1 then get the
     * 4-row GEMV copy */
    const uint32_t odd[] = {KVT_TYPE_Q4_0, KVT_TYPE_Q5_0, KVT_TYPE_Q4_1, KVT_TYPE_Q5_1};
    for (int k = 0; k < 4; k++) {
        mm_case c;
        mm_setup(&c, odd[k], 96, 40, 2, 1450 + k);
        check_packed(&c);
        mm_free(&c);
    }
}

/* K-quant blocks with extreme contents: f16 max / -0 / tiny super-block scales, all 6-bit scales and
 * mins 63, all quants at their maximum (Q6_K: scales -128 / 127), activations at ±127. */
static void test_packed_k16_extreme(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};
    for (size_t ti = 0; ti < 3; ti++) {
        const uint32_t t = ts[ti];
        mm_case c;
        mm_setup(&c, t, 1024, 19, 11, 1300 + ti);
        const size_t rb = kvt_type_row_bytes(t, 1024), bb = kvt_type_block_bytes(t);
        for (int64_t o = 0; o < 19; o++)
            for (int b = 0; b < 4; b++) {
                uint8_t *blk = c.w + (size_t)o * rb + (size_t)b * bb;
                const int sel = (int)((o + b) % 5);
                if (t == KVT_TYPE_Q6_K) {
                    if (sel == 0) memset(blk, 0xff, 192);                             /* ql, qh: q = 63 */
                    if (sel == 1) memset(blk + 192, 0x80, 16);                        /* scales -128 */
                    if (sel == 2) memset(blk + 192, 0x7f, 16), memset(blk, 0xff, 192); /* 127, q = 63 */
                    if (sel == 3) put16(blk + 208, 0x7bff);                           /* f16 max */
                    if (sel == 4) put16(blk + 208, 0x8000);                           /* -0 */
                } else {
                    if (sel == 0) memset(blk + 4, 0xff, bb - 4);      /* scales/mins 63, q at max */
                    if (sel == 1) put16(blk, 0x7bff), put16(blk + 2, 0x7bff);
                    if (sel == 2) put16(blk, 0x8000), put16(blk + 2, 0x0001);
                    if (sel == 3) memset(blk + 4, 0xff, 12);         /* scales/mins 63 */
                }
            }
        /* some activation rows at ±127 (bsums kept consistent) */
        const size_t arb = kvt_act_bytes(t, 1024, 1);
        for (int64_t r = 0; r < 11; r += 3)
            for (int b = 0; b < 4; b++) {
                uint8_t *blk = c.a + (size_t)r * arb + (size_t)b * 292;
                int8_t *qs = (int8_t *)(blk + 4);
                for (int e = 0; e < 256; e++) qs[e] = (int8_t)(((e + r) & 1) ? 127 : -127);
                if (r % 2) memset(qs, 127, 256);
                for (int k = 0; k < 16; k++) {
                    int16_t sum = 0;
                    for (int e = 0; e < 16; e++) sum = (int16_t)(sum + qs[16 * k + e]);
                    memcpy(blk + 4 + 256 + 2 * k, &sum, 2);
                }
            }
        check_packed(&c);
        mm_free(&c);
    }
}

/* Untrusted GGUFs may hold Q8_0 weights of -128 (the reference quantizer never writes them) and
 * extreme scales: the packed path still matches. */
static void test_packed_extreme_weights(void **st) {
    (void)st;
    mm_case c;
    mm_setup(&c, KVT_TYPE_Q8_0, 256, 9, 6, 77);
    const size_t rb = kvt_type_row_bytes(KVT_TYPE_Q8_0, 256);
    for (int64_t o = 0; o < 9; o++)
        for (int b = 0; b < 8; b++) {
            uint8_t *blk = c.w + (size_t)o * rb + (size_t)b * 34;
            if ((o + b) % 3 == 0) memset(blk + 2, 0x80, 32);           /* all -128 */
            if ((o + b) % 5 == 1) put16(blk, 0x7bff);                   /* f16 max scale */
            if ((o + b) % 7 == 2) put16(blk, 0x8000);                   /* -0 scale */
        }
    check_packed(&c);
    mm_free(&c);
}

/* Long rows and many activation rows: exercises the activation row blocks (cache blocking). */
static void test_packed_row_blocks(void **st) {
    (void)st;
    const uint32_t ts[] = {KVT_TYPE_Q8_0, KVT_TYPE_Q4_K, KVT_TYPE_Q5_1};
    for (size_t ti = 0; ti < 3; ti++) {
        mm_case c;
        mm_setup(&c, ts[ti], 8192, 6, 131, 900 + ti);
        check_packed(&c);
        mm_free(&c);
    }
}

static void test_packed_unsupported(void **st) {
    (void)st;
    uint8_t w[64 * 2 * 4] = {0};
    static uint16_t wl[2048 * 4];
    assert_null(kvt_packed_create(KVT_TYPE_F16, wl, 2048, 4)); /* rows of 4 KiB: no GEMV copy */
    assert_null(kvt_packed_create(KVT_TYPE_BF16, w, 60, 4));   /* not a whole number of 8-element blocks */
    assert_null(kvt_packed_create(KVT_TYPE_F32, w, 32, 4));
    assert_null(kvt_packed_create(KVT_TYPE_Q8_0, w, 33, 4)); /* not a whole number of blocks */
    assert_null(kvt_packed_create(KVT_TYPE_Q8_0, w, 32, 0));
    assert_null(kvt_packed_create(KVT_TYPE_Q8_0, NULL, 32, 4));
    setenv("KVT_REPACK", "0", 1);
    assert_null(kvt_packed_create(KVT_TYPE_Q8_0, w, 32, 4));
    unsetenv("KVT_REPACK");
    kvt_packed *P = kvt_packed_create(KVT_TYPE_Q8_0, w, 32, 4);
    assert_non_null(P);
    kvt_packed_free(P);
    kvt_packed_free(NULL);
}

/* ---------------- AMX int8 prefill GEMM ---------------- */

static bool have_amx(void) { return kvt_kernels_best_isa() >= KVT_ISA_AMX; }

/* For one case under KVT_ISA_AMX: (1) kvt_matmul_packed equals kvt_matmul_packed_amx_ref bit for bit
 * for n_rows >= KVT_AMX_MIN_ROWS and every column cut (nothing outside [o0,o1) written); (2) within
 * 1e-5 · Σ|w·x| of kvt_matmul_rows_ref (exact block integers, only the float summation order
 * differs: per block, not per 4-lane group); (3) each row's result does not depend on n_rows (rows
 * [0,16) of the full run equal a 16-row run on the same data, and a run starting at row 16);
 * (4) fewer rows (below KVT_AMX_MIN_ROWS: the row-major AMX-order kernel) and kvt_matmul_rows give
 * the same numbers (decode == full recompute); under KVT_ISA_AVX512 the AVX-512 kvt_matmul_rows ones. */
static void check_amx(const mm_case *c) {
    const int64_t no = c->n_out, nr = c->n_rows, n = c->n_in;
    assert_true(kvt_kernels_force_isa(KVT_ISA_AMX));
    assert_string_equal(kvt_kernels_numerics_id(), "int8-block");
    kvt_packed *P = kvt_packed_create(c->t, c->w, n, no);
    assert_non_null(P);
    assert_true(kvt_packed_has_amx(P));
    const size_t bytes = (size_t)(no * nr) * 4;
    float *ya = malloc(bytes), *yq = malloc(bytes), *yr = malloc(bytes), *xq = malloc((size_t)(nr * n) * 4);
    kvt_matmul_packed_amx_ref(P, c->a, nr, yq, no, 0, no);
    const int64_t cuts[][2] = {{0, no}, {0, 1}, {1, no < 17 ? no : 17}, {no / 2, no}, {no - 1, no}, {no / 3, no / 3 + 1}};
    for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
        if (cuts[ci][0] >= cuts[ci][1]) continue;
        memset(ya, 0xff, bytes);
        kvt_matmul_packed(P, c->a, nr, ya, no, cuts[ci][0], cuts[ci][1]);
        for (int64_t r = 0; r < nr; r++)
            for (int64_t o = 0; o < no; o++) {
                const bool in = o >= cuts[ci][0] && o < cuts[ci][1];
                if (in && memcmp(&ya[r * no + o], &yq[r * no + o], 4)) {
                    fprintf(stderr, "amx %s n_in=%lld n_out=%lld rows=%lld cut=%lld..%lld: o=%lld r=%lld amx=%.9g ref=%.9g\n",
                            kvt_type_name(c->t), (long long)n, (long long)no, (long long)nr, (long long)cuts[ci][0],
                            (long long)cuts[ci][1], (long long)o, (long long)r, ya[r * no + o], yq[r * no + o]);
                    fail();
                }
                if (!in) assert_true(((uint32_t *)ya)[r * no + o] == 0xffffffffu);
            }
    }
    /* (2) tolerance against the scalar reference */
    kvt_dequant_ref(kvt_vec_dot_type(c->t), c->a, xq, nr * n);
    kvt_matmul_rows_ref(c->t, c->w, n, c->a, nr, yr, no, 0, no);
    for (int64_t r = 0; r < nr; r++)
        for (int64_t o = 0; o < no; o++) {
            const double tol = 1e-5 * abs_dot(c, xq, o, r) + 1e-30;
            if (!(fabs((double)yr[r * no + o] - (double)yq[r * no + o]) <= tol)) {
                fprintf(stderr, "amx %s o=%lld r=%lld ref=%.9g amx=%.9g tol=%g\n", kvt_type_name(c->t), (long long)o,
                        (long long)r, yr[r * no + o], yq[r * no + o], tol);
                fail();
            }
        }
    /* (3) row independence: 16 rows from the start, and 16 rows from row 16 (if there are 32) */
    const size_t arb = (size_t)kvt_act_bytes(c->t, n, 1);
    for (int64_t s0 = 0; s0 + KVT_AMX_MIN_ROWS <= nr && s0 <= 16; s0 += 16) {
        memset(ya, 0xff, bytes);
        kvt_matmul_packed(P, c->a + (size_t)s0 * arb, KVT_AMX_MIN_ROWS, ya, no, 0, no);
        assert_memory_equal(ya, yq + s0 * no, (size_t)(KVT_AMX_MIN_ROWS * no) * 4);
    }
    /* (4) fewer rows (decode, small batches) and the row-major path: the same numbers under AMX, for
     * any row count; under KVT_ISA_AVX512 the AMX layout is unused (the AVX-512 numbers) */
    for (int64_t fr = 1; fr <= nr; fr = fr < 8 ? fr + 1 : fr * 2) {
        const int64_t few = fr; /* 1..8, 16, 32, 64: both sides of the tile threshold */
        memset(ya, 0xff, bytes);
        kvt_matmul_packed(P, c->a, few, ya, no, 0, no);
        assert_memory_equal(ya, yq, (size_t)(few * no) * 4);
        memset(ya, 0xff, bytes);
        kvt_matmul_rows(c->t, c->w, n, c->a, few, ya, no, 0, no);
        assert_memory_equal(ya, yq, (size_t)(few * no) * 4);
        memset(ya, 0xff, bytes); /* a ragged column range of the row-major kernel */
        kvt_matmul_rows(c->t, c->w, n, c->a, few, ya, no, no / 3, no);
        for (int64_t r = 0; r < few; r++)
            assert_memory_equal(ya + r * no + no / 3, yq + r * no + no / 3, (size_t)(no - no / 3) * 4);
    }
    assert_true(kvt_kernels_force_isa(KVT_ISA_AVX512));
    kvt_matmul_rows(c->t, c->w, n, c->a, nr, yr, no, 0, no);
    memset(ya, 0xff, bytes);
    kvt_matmul_packed(P, c->a, nr, ya, no, 0, no);
    assert_memory_equal(ya, yr, bytes);
    kvt_packed_free(P);
    kvt_kernels_force_isa(kvt_kernels_best_isa());
    free(ya), free(yq), free(yr), free(xq);
}

static void test_amx_packed(void **st) {
    (void)st;
    if (!have_amx()) { /* no AMX: the ISA cannot be chosen and no AMX layout is built */
        assert_false(kvt_kernels_force_isa(KVT_ISA_AMX));
        mm_case c;
        mm_setup(&c, KVT_TYPE_Q8_0, 64, 8, 16, 1);
        kvt_packed *P = kvt_packed_create(c.t, c.w, 64, 8);
        assert_false(kvt_packed_has_amx(P));
        kvt_packed_free(P);
        mm_free(&c);
        return;
    }
    { /* types without an AMX kernel: no AMX layout, the AVX-512 numbers under KVT_ISA_AMX */
        const uint32_t others[] = {KVT_TYPE_Q4_1, KVT_TYPE_Q5_1, KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q6_K};
        for (size_t k = 0; k < sizeof others / sizeof others[0]; k++) {
            mm_case c;
            mm_setup(&c, others[k], 512, 20, 33, 3 + k);
            assert_true(kvt_kernels_force_isa(KVT_ISA_AVX512));
            float *y5 = malloc(20 * 33 * 4), *ya = malloc(20 * 33 * 4);
            kvt_matmul_rows(c.t, c.w, 512, c.a, 33, y5, 20, 0, 20);
            assert_true(kvt_kernels_force_isa(KVT_ISA_AMX));
            kvt_packed *P = kvt_packed_create(c.t, c.w, 512, 20);
            assert_false(kvt_packed_has_amx(P));
            kvt_matmul_packed(P, c.a, 33, ya, 20, 0, 20);
            assert_memory_equal(y5, ya, 20 * 33 * 4);
            kvt_matmul_rows(c.t, c.w, 512, c.a, 33, ya, 20, 0, 20);
            assert_memory_equal(y5, ya, 20 * 33 * 4);
            kvt_packed_free(P);
            free(y5), free(ya);
            mm_free(&c);
        }
        kvt_kernels_force_isa(kvt_kernels_best_isa());
    }
    const uint32_t types[] = {KVT_TYPE_Q8_0, KVT_TYPE_Q4_0, KVT_TYPE_Q5_0};
    const int64_t n_ins[] = {32, 64, 96, 256, 1024};
    const int64_t n_outs[] = {1, 5, 16, 17, 31, 32, 33, 100};
    const int64_t rows[] = {16, 17, 31, 32, 33, 47, 64, 100};
    uint64_t seed = 77;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ii = 0; ii < sizeof n_ins / sizeof n_ins[0]; ii++)
            for (size_t oi = 0; oi < sizeof n_outs / sizeof n_outs[0]; oi++) {
                const int64_t nr = rows[(ii + oi + ti) % (sizeof rows / sizeof rows[0])];
                mm_case c;
                mm_setup(&c, types[ti], n_ins[ii], n_outs[oi], nr, seed++);
                check_amx(&c);
                mm_free(&c);
            }
    /* a long row count spanning several 32-row blocks with a ragged tail, wide n_in */
    mm_case c;
    mm_setup(&c, KVT_TYPE_Q8_0, 4096, 70, 77, 5);
    check_amx(&c);
    mm_free(&c);
}

/* Extreme weights/activations (|q| = 127/-128, large scales): int32 block dots and the float path
 * stay exact vs the AMX reference. */
static void test_amx_extreme(void **st) {
    (void)st;
    if (!have_amx()) return; /* covered by test_amx_packed's no-AMX branch */
    mm_case c;
    mm_setup(&c, KVT_TYPE_Q8_0, 256, 33, 40, 9);
    const size_t wrb = kvt_type_row_bytes(KVT_TYPE_Q8_0, 256);
    for (int64_t o = 0; o < 33; o++)
        for (int b = 0; b < 8; b++) {
            uint8_t *p = c.w + (size_t)o * wrb + (size_t)b * 34;
            for (int k = 0; k < 32; k++) p[2 + k] = (uint8_t)((o + k + b) % 3 == 0 ? 0x80 : 0x7f);
        }
    kvt_dequant_ref(KVT_TYPE_Q8_0, c.w, c.wf, 33 * 256);
    check_amx(&c);
    mm_free(&c);
}

/* Tile state is per thread: several threads running the AMX kernel at once (each with its own
 * ldtilecfg, different row counts so their tile configs differ) get the single-thread bits. */
typedef struct {
    const kvt_packed *P;
    const uint8_t *a;
    int64_t nr, no;
    float *y;
} amx_job;
static void *amx_thread(void *v) {
    amx_job *j = v;
    for (int it = 0; it < 20; it++) kvt_matmul_packed(j->P, j->a, j->nr, j->y, j->no, 0, j->no);
    return NULL;
}
static void test_amx_threads(void **st) {
    (void)st;
    if (!have_amx()) return; /* covered by test_amx_packed's no-AMX branch */
    assert_true(kvt_kernels_force_isa(KVT_ISA_AMX));
    mm_case c;
    mm_setup(&c, KVT_TYPE_Q8_0, 512, 48, 45, 21);
    kvt_packed *P = kvt_packed_create(c.t, c.w, 512, 48);
    assert_true(kvt_packed_has_amx(P));
    float *yq = malloc(48 * 45 * 4);
    kvt_matmul_packed_amx_ref(P, c.a, 45, yq, 48, 0, 48);
    pthread_t th[4];
    amx_job jobs[4];
    const int64_t nrs[4] = {45, 17, 32, 16};
    for (int i = 0; i < 4; i++) {
        jobs[i] = (amx_job){P, c.a, nrs[i], 48, malloc(48 * 45 * 4)};
        assert_int_equal(pthread_create(&th[i], NULL, amx_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_memory_equal(jobs[i].y, yq, (size_t)(nrs[i] * 48) * 4);
        free(jobs[i].y);
    }
    kvt_packed_free(P);
    free(yq);
    mm_free(&c);
    kvt_kernels_force_isa(kvt_kernels_best_isa());
}

/* KVT_ISA in the environment (read once at init): run this binary as a child that prints its ISA
 * and numerics id. amx selects AMX (when present); avx512 / avx2 / scalar disable it; a refused
 * permission (KVT_AMX_DENY=1) falls back to AVX-512 with a warning. */
static void test_amx_env_override(void **st) {
    (void)st;
    char got[128], self[4096];
    const ssize_t ln = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(ln > 0);
    self[ln] = 0;
    static const char *const envs[5] = {"KVT_ISA=avx512", "KVT_ISA=avx2", "KVT_ISA=scalar", "KVT_ISA=amx",
                                        "KVT_ISA=amx KVT_AMX_DENY=1"};
    for (int i = 0; i < 5; i++) {
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "env %s %s --print-isa 2>/dev/null", envs[i], self);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        got[0] = 0;
        if (!fgets(got, sizeof got, f)) got[0] = 0;
        assert_int_equal(pclose(f), 0);
        got[strcspn(got, "\n")] = 0;
        const kvt_isa best = kvt_kernels_best_isa();
        const char *want;
        if (i == 0) want = best >= KVT_ISA_AVX512 ? "avx512" : kvt_isa_name(best);
        else if (i == 1) want = best >= KVT_ISA_AVX2 ? "avx2" : "scalar";
        else if (i == 2) want = "scalar";
        else if (i == 3) want = kvt_isa_name(best);
        else want = kvt_isa_name(best >= KVT_ISA_AMX ? KVT_ISA_AVX512 : best);
        fprintf(stderr, "%s -> %s\n", envs[i], got);
        assert_true(!strncmp(got, want, strlen(want)) && got[strlen(want)] == ' ');
        const char *best_at = strstr(got, " best=");
        assert_non_null(best_at); /* the active ISA and numerics id come before it */
        if (!strcmp(want, "amx")) assert_true(!strncmp(got, "amx int8-block ", 15));
        else assert_true(strstr(got, "amx") == NULL || strstr(got, "amx") > best_at);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--print-isa")) { /* child of test_amx_env_override */
        printf("%s %s best=%s\n", kvt_isa_name(kvt_kernels_isa()), kvt_kernels_numerics_id(),
               kvt_isa_name(kvt_kernels_best_isa()));
        return 0;
    }
    kvt_kernels_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_table),       cmocka_unit_test(test_hand_small_blocks),
        cmocka_unit_test(test_hand_k_blocks),    cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_act_quantize),     cmocka_unit_test(test_act_quantize_dispatch),
        cmocka_unit_test(test_isa_force),        cmocka_unit_test(test_numerics_id),
        cmocka_unit_test(test_dequant_dispatch), cmocka_unit_test(test_matmul_vs_ref),
        cmocka_unit_test(test_matmul_vs_double), cmocka_unit_test(test_matmul_batch_invariance),
        cmocka_unit_test(test_matmul_odd_shapes), cmocka_unit_test(test_gemv_kquant_vs_ref), cmocka_unit_test(test_f32_helpers),
        cmocka_unit_test(test_packed_matches_rows), cmocka_unit_test(test_gemv_interleaved), cmocka_unit_test(test_gemv_interleaved_float), cmocka_unit_test(test_packed_extreme_weights),
        cmocka_unit_test(test_packed_row_blocks),   cmocka_unit_test(test_packed_unsupported),
        cmocka_unit_test(test_packed_k16_shapes),   cmocka_unit_test(test_packed_k16_extreme),
        cmocka_unit_test(test_packed_n16_tiles),
        cmocka_unit_test(test_amx_packed),          cmocka_unit_test(test_amx_extreme),
        cmocka_unit_test(test_amx_threads),         cmocka_unit_test(test_amx_env_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
