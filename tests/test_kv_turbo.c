/* test_kv_turbo.c — the TurboQuant codec (turbo.c): Lloyd–Max codebooks against the published
 * Gaussian table, rotation orthogonality, encode→decode MSE within the paper's bound per bit width,
 * AVX2 decode == scalar decode, QJL inner products unbiased (and MSE-only ones measurably biased),
 * row sizes / scheme keys / parsing, and block attention over TURBO blocks bit-equal to a contiguous
 * reference that uses the same decode (rotated query, rotated rows, one inverse rotation). */
#include <math.h>

#include "testutil.h"
#include "kv/kv.h"
#include "kv/kv_int.h"

static kvt_codec side(uint32_t bits) { return (kvt_codec){.kind = KVT_CODEC_TURBO, .bits = (uint8_t)bits, .vbits = (uint8_t)bits}; }

static double gauss(uint64_t *s) { /* Box–Muller */
    double u1 = ((double)(tu_rand(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(tu_rand(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void unit_vector(uint64_t *s, float *x, uint32_t d) {
    double n = 0;
    for (uint32_t i = 0; i < d; i++) x[i] = (float)gauss(s), n += (double)x[i] * x[i];
    for (uint32_t i = 0; i < d; i++) x[i] = (float)(x[i] / sqrt(n));
}

/* kv-codecs.md §3.3: Max (1960) N(0,1) Lloyd–Max centroids, positive half. */
static void test_codebook_published(void **st) {
    (void)st;
    static const double pub[5][8] = {
        {0},
        {0.797885},
        {0.452780, 1.510418},
        {0.245094, 0.756005, 1.343909, 2.151946},
        {0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590},
    };
    for (uint32_t b = 1; b <= 4; b++) {
        const uint32_t n = 1u << b;
        const float *cb = kvt_turbo_codebook(b);
        assert_non_null(cb);
        for (uint32_t i = 0; i < n / 2; i++) {
            if (fabs(cb[n / 2 + i] - pub[b][i]) > 1e-4) fail_msg("bits %u centroid %u: %.7f vs %.6f", b, i, cb[n / 2 + i], pub[b][i]);
            assert_true(fabs(cb[n / 2 - 1 - i] + pub[b][i]) <= 1e-4); /* symmetric */
        }
    }
    /* every width is a Lloyd fixed point: each centroid is the conditional mean of its cell (checked
     * by an independent midpoint-rule integration, not the closed form the generator uses) */
    for (uint32_t b = 1; b <= 8; b++) {
        const uint32_t n = 1u << b;
        const float *cb = kvt_turbo_codebook(b);
        for (uint32_t i = 1; i < n; i++) assert_true(cb[i - 1] < cb[i]);
        for (uint32_t i = 0; i < n; i += (n > 16 ? 37 : 1)) {
            const double a = i ? 0.5 * ((double)cb[i - 1] + cb[i]) : -12.0, z = i + 1 < n ? 0.5 * ((double)cb[i] + cb[i + 1]) : 12.0;
            double m = 0, w = 0;
            const int steps = 20000;
            for (int k = 0; k < steps; k++) {
                const double t = a + (z - a) * (k + 0.5) / steps, p = exp(-0.5 * t * t);
                m += t * p, w += p;
            }
            if (fabs(m / w - cb[i]) > 1e-4) fail_msg("bits %u centroid %u not a conditional mean: %.7f vs %.7f", b, i, m / w, cb[i]);
        }
    }
    assert_null(kvt_turbo_codebook(0));
    assert_null(kvt_turbo_codebook(9));
}

static void test_rotation_orthogonal(void **st) {
    (void)st;
    uint64_t s = 3;
    float x[1024], y[1024], z[1024];
    for (uint32_t d = 8; d <= 1024; d *= 2) {
        for (uint32_t i = 0; i < d; i++) x[i] = tu_randf(&s);
        kvt_turbo_rotate(3, 1, 2, x, d, y);
        double nx = 0, ny = 0, e = 0;
        for (uint32_t i = 0; i < d; i++) nx += (double)x[i] * x[i], ny += (double)y[i] * y[i];
        assert_true(fabs(sqrt(ny) / sqrt(nx) - 1) < 1e-6);
        kvt_turbo_unrotate(3, 1, 2, y, d, z);
        for (uint32_t i = 0; i < d; i++) e += ((double)z[i] - x[i]) * ((double)z[i] - x[i]);
        assert_true(sqrt(e / nx) < 1e-6);
        /* another (layer, kv, head) is another rotation */
        kvt_turbo_rotate(3, 0, 2, x, d, z);
        assert_true(memcmp(y, z, d * sizeof(float)) != 0);
        kvt_turbo_rotate(4, 1, 2, x, d, z);
        assert_true(memcmp(y, z, d * sizeof(float)) != 0);
    }
}

/* Theorem 1: D_mse = E||x - x̂||² <= (√3·π/2)·4^-b for unit x; measured through the whole path
 * (rotate, encode, decode, unrotate). Also within 6 % of the exact-sphere table where it exists. */
static void test_mse_bound(void **st) {
    (void)st;
    static const uint32_t bits[5] = {2, 3, 4, 5, 8};
    static const double table128[5] = {0.1160, 0.03397, 0.009315, 0, 0};
    uint64_t s = 11;
    float x[128], y[128], yh[128], xh[128];
    uint8_t row[256];
    for (uint32_t d = 64; d <= 128; d *= 2) {
        for (int k = 0; k < 5; k++) {
            const uint32_t b = bits[k];
            double mse = 0;
            const int n = 2000;
            for (int t = 0; t < n; t++) {
                unit_vector(&s, x, d);
                kvt_turbo_rotate(0, 0, (uint32_t)t % 7, x, d, y);
                kvt_codec_encode_row(side(b), y, d, row);
                kvt_codec_decode_row(side(b), row, d, yh);
                kvt_turbo_unrotate(0, 0, (uint32_t)t % 7, yh, d, xh);
                for (uint32_t i = 0; i < d; i++) mse += ((double)xh[i] - x[i]) * ((double)xh[i] - x[i]);
            }
            mse /= n;
            const double bound = sqrt(3.0) * M_PI / 2 * pow(4.0, -(double)b);
            if (mse > bound) fail_msg("d %u bits %u: D_mse %.5f above the bound %.5f", d, b, mse, bound);
            if (d == 128 && table128[k] > 0 && fabs(mse / table128[k] - 1) > 0.06)
                fail_msg("d 128 bits %u: D_mse %.5f vs table %.5f", b, mse, table128[k]);
            print_message("turbo d=%u b=%u: D_mse %.4g (bound %.4g)\n", d, b, mse, bound);
        }
    }
}

/* Every decode path the CPU has (scalar, AVX2, AVX-512 VBMI for 8-bit rows: kvt_kv_turbo_level and
 * below) equals the scalar decode bit for bit, single rows and multi-row calls. */
static void test_decode_simd_equals_scalar(void **st) {
    (void)st;
    static const uint32_t bits[5] = {2, 3, 4, 5, 8};
    uint64_t s = 5;
    float y[1024], a[3 * 1024], b2[3 * 1024];
    uint8_t row[1100];
    assert_true(kvt_kv_cpu_has_avx2()); /* this project's machines have AVX2: the SIMD path runs */
    const int top = kvt_kv_turbo_level();
    print_message("turbo decode levels 0..%d (2 = AVX-512 VBMI 8-bit lookup)\n", top);
    for (int level = 0; level <= top; level++)
        for (uint32_t d = 8; d <= 1024; d *= 2)
            for (int k = 0; k < 5; k++) {
                /* the SIMD decode reads each code group with one wide load that may cover bytes of the
                 * next group or the scale, never past the rows: decode from a heap copy of exactly the
                 * rows' bytes (the sanitizer build catches an over-read) */
                const size_t rb = kvt_codec_row_bytes(side(bits[k]), d);
                uint8_t *exact = malloc(3 * rb);
                for (int r = 0; r < 3; r++) {
                    for (uint32_t i = 0; i < d; i++) y[i] = tu_randf(&s) * 3;
                    kvt_codec_encode_row(side(bits[k]), y, d, row);
                    memcpy(exact + r * rb, row, rb);
                }
                kvt_turbo_decode_row(bits[k], exact + rb, d, a, level);
                kvt_turbo_decode_row_scalar(bits[k], exact + rb, d, b2);
                assert_memory_equal(a, b2, d * sizeof(float));
                kvt_turbo_decode_rows(bits[k], exact, rb, d, 3, a, level);
                for (int r = 0; r < 3; r++) kvt_turbo_decode_row_scalar(bits[k], exact + r * rb, d, b2 + r * d);
                free(exact);
                assert_memory_equal(a, b2, 3 * d * sizeof(float));
            }
}

/* 8-bit rows holding every code 0..255 at every position class of the lookup (codes 0-127 and
 * 128-255 come from different table halves, and element order is restored by a dword transpose):
 * each level's decode equals s * cb[idx] exactly, for a scale of 1 (the centroids' own bits) and a
 * generic scale, at every d. */
static void test_decode8_every_code(void **st) {
    (void)st;
    const float *cb = kvt_turbo_codebook(8);
    const int top = kvt_kv_turbo_level();
    float out[1024], want[1024];
    uint8_t row[1024 + 4];
    const float scales[2] = {1.0f, 0.3712f};
    for (int level = 0; level <= top; level++)
        for (int sym = 0; sym < 2; sym++) /* VBMI: both codebook halves, or the antisymmetric half */
        for (uint32_t d = 8; d <= 1024; d *= 2)
            for (int si = 0; si < 2; si++)
                for (uint32_t rot = 0; rot < 256; rot += d < 256 ? d : 256) {
                    /* codes rot + 37i (mod 256): 37 is odd, so one row of d >= 256 holds every code, and the rows of a smaller d (rot a multiple of d) cover all 256 between them */
                    for (uint32_t i = 0; i < d; i++) row[i] = (uint8_t)((rot + i * 37u) & 255);
                    memcpy(row + d, &scales[si], 4);
                    const bool was = kvt_turbo_test_vbmi8_sym(sym);
                    kvt_turbo_decode_row(8, row, d, out, level);
                    kvt_turbo_test_vbmi8_sym(was);
                    for (uint32_t i = 0; i < d; i++) want[i] = scales[si] * cb[row[i]];
                    if (memcmp(out, want, d * sizeof(float)) != 0)
                        fail_msg("level %d sym %d d %u scale %g: 8-bit decode differs from s*cb[idx]", level,
                                 sym, d, (double)scales[si]);
                }
}

static void test_zero_and_nonfinite(void **st) {
    (void)st;
    float y[64] = {0}, o[64];
    uint8_t row[80];
    memset(row, 0xff, sizeof row);
    kvt_codec_encode_row(side(4), y, 64, row);
    kvt_codec_decode_row(side(4), row, 64, o);
    for (int i = 0; i < 64; i++) assert_true(o[i] == 0.0f);
    y[3] = NAN;
    kvt_codec_encode_row(side(8), y, 64, row);
    kvt_codec_decode_row(side(8), row, 64, o);
    for (int i = 0; i < 64; i++) assert_true(o[i] == 0.0f);
    y[3] = INFINITY;
    kvt_codec_encode_row(side(3), y, 64, row);
    kvt_codec_decode_row(side(3), row, 64, o);
    for (int i = 0; i < 64; i++) assert_true(o[i] == 0.0f);
}

/* QJL: mean of est - <q, y> over 1e5 positively correlated pairs within 3 standard errors of 0; the
 * MSE-only estimate at the same bits_mse is biased (shrinks toward 0) by many standard errors, so
 * the test has power. Also prints the RMS error of prod (b-1 + 1 bits) vs MSE-only b bits. */
static void test_qjl_unbiased(void **st) {
    (void)st;
    enum { D = 64, N = 100000 };
    uint64_t s = 77;
    float x[D], q[D], yr[D], qr[D];
    uint8_t mse[D + 8], signs[D / 8], full[D + 8];
    static float S[D * D];
    for (uint32_t bm = 1; bm <= 2; bm++) {
        double sum = 0, sum2 = 0, msum = 0, msum2 = 0, fsum2 = 0;
        for (int t = 0; t < N; t++) {
            unit_vector(&s, x, D);
            for (int i = 0; i < D; i++) q[i] = x[i] + (float)(gauss(&s) / sqrt(D));
            kvt_turbo_rotate(0, 0, 0, x, D, yr);
            kvt_turbo_rotate(0, 0, 0, q, D, qr);
            double ip = 0;
            for (int i = 0; i < D; i++) ip += (double)q[i] * x[i];
            if (t % 100 == 0) kvt_turbo_qjl_matrix(1000 * bm + (uint64_t)t, D, S); /* average over S too */
            float rho;
            kvt_turbo_qjl_encode(S, bm, yr, D, mse, signs, &rho);
            const double e = kvt_turbo_qjl_dot(S, bm, qr, D, mse, signs, rho) - ip;
            /* MSE-only at bm bits (the prod's first stage alone) */
            double a = 0;
            float dec[D];
            kvt_turbo_decode_row_scalar(bm, mse, D, dec);
            for (int i = 0; i < D; i++) a += (double)qr[i] * dec[i];
            /* MSE-only at the same total bits (bm + 1) */
            double f = 0;
            kvt_turbo_encode_row(bm + 1, yr, D, full);
            kvt_turbo_decode_row_scalar(bm + 1, full, D, dec);
            for (int i = 0; i < D; i++) f += (double)qr[i] * dec[i];
            sum += e, sum2 += e * e;
            msum += a - ip, msum2 += (a - ip) * (a - ip);
            fsum2 += (f - ip) * (f - ip);
        }
        const double mean = sum / N, se = sqrt((sum2 / N - mean * mean) / N);
        const double mmean = msum / N, mse_se = sqrt((msum2 / N - mmean * mmean) / N);
        print_message("qjl bits_mse %u: prod mean err %.2e (se %.1e) rms %.4f | mse-only %u bits mean err %.2e rms %.4f | "
                      "mse-only %u bits rms %.4f\n",
                      bm, mean, se, sqrt(sum2 / N), bm, mmean, sqrt(msum2 / N), bm + 1, sqrt(fsum2 / N));
        if (fabs(mean) > 3 * se) fail_msg("QJL biased at bits_mse %u: mean %.3e, 3 se %.3e", bm, mean, 3 * se);
        assert_true(mmean < -10 * mse_se); /* the MSE stage alone shrinks inner products */
    }
}

static void test_codec_sizes_keys_parse(void **st) {
    (void)st;
    kvt_codec c;
    char err[200];
    assert_int_equal(kvt_turbo_parse("turbo", &c, err, sizeof err), KVT_OK);
    assert_int_equal(c.kind, KVT_CODEC_TURBO);
    assert_int_equal(c.bits, 8);
    assert_int_equal(c.vbits, 3);
    assert_int_equal(kvt_turbo_parse("turbo:k4v2", &c, err, sizeof err), KVT_OK);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.vbits, 2);
    static const char *bad[] = {"turbo:k3v3", "turbo:k8v6", "turbo:k8v3x", "turbo:", "turbox", "turbo:v3k8", "turbo:k99999999999v3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_not_equal(kvt_turbo_parse(bad[i], &c, err, sizeof err), KVT_OK);
    /* row bytes: d*b/8 codes + 4-byte scale; side codecs split K/V */
    assert_int_equal(kvt_turbo_parse("turbo", &c, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_codec_row_bytes(kvt_codec_side(c, 0), 64), 64 + 4);
    assert_int_equal(kvt_codec_row_bytes(kvt_codec_side(c, 1), 64), 24 + 4);
    assert_int_equal(kvt_codec_row_bytes(c, 64), 0); /* a layer codec is not a row codec */
    assert_false(kvt_codec_valid(c, 96));  /* not a power of two */
    assert_false(kvt_codec_valid(c, 4));
    assert_false(kvt_codec_valid(c, 2048));
    assert_true(kvt_codec_valid(c, 256));
    char name[32];
    kvt_codec_name(c, name, sizeof name);
    assert_string_equal(name, "turbo-k8v3");
    /* layout: exact bytes per token, scheme key names the codec and the seed, rejects head_dim 96 */
    kvt_layer_desc d[3];
    for (int i = 0; i < 3; i++)
        d[i] = (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = 3, .head_dim_k = 64, .head_dim_v = 64, .codec = c};
    d[2].kind = KVT_KIND_WINDOW, d[2].window = 64;
    kvt_kv_layout *l = NULL, *l2 = NULL;
    assert_int_equal(kvt_kv_layout_create(d, 3, 32, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &l, err, sizeof err), KVT_OK);
    assert_true(kvt_kv_layout_bytes_per_token(l) == 3.0 * 3 * (68 + 28));
    char key[128], key2[128];
    kvt_kv_layout_key(l, key, sizeof key);
    assert_non_null(strstr(key, "turbo-k8v3-r"));
    assert_true(kvt_kv_layout_block_bytes(l, 0, 0) >= 2 * 3 * 32 * (68 + 28));
    for (int i = 0; i < 3; i++) d[i].codec.vbits = 4;
    assert_int_equal(kvt_kv_layout_create(d, 3, 32, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &l2, err, sizeof err), KVT_OK);
    kvt_kv_layout_key(l2, key2, sizeof key2);
    assert_string_not_equal(key, key2);
    assert_true(kvt_root_hash(key, "") != kvt_root_hash(key2, "")); /* mismatched schemes never share blocks */
    kvt_kv_layout_free(l2);
    kvt_kv_layout_free(l);
    d[0].head_dim_k = d[0].head_dim_v = 96;
    assert_int_not_equal(kvt_kv_layout_create(d, 3, 32, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &l, err, sizeof err), KVT_OK);
    assert_non_null(strstr(err, "power-of-two"));
    assert_int_equal(kvt_affine_auto_group(64), 64);
    assert_int_equal(kvt_affine_auto_group(32), 32);
    assert_int_equal(kvt_affine_auto_group(256), 128);
    assert_int_equal(kvt_affine_auto_group(96), 32);
    assert_int_equal(kvt_affine_auto_group(16), 0);
}

/* ---- block attention over TURBO blocks vs the contiguous reference ------------------------------ */
enum { NKV = 2, HD = 32, NHEAD = 6, MAXP = 140, BT = 16 };

/* Writes n positions of random K/V for both layers (not committed: attention runs before the commit,
 * as in the forward pass, since a commit may drop window blocks the chunk's queries still see); kr/vr get the decoded rotated rows exactly as
 * attention sees them (encode the rotated vector, decode). */
static void write_tokens(kvt_seq *s, const kvt_kv_layout *l, uint32_t n, uint64_t *rng, float *kr, float *vr) {
    assert_int_equal(kvt_seq_prepare(s, n), KVT_OK);
    float k[NKV * HD], v[NKV * HD], rot[HD];
    uint8_t row[HD + 8];
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t pos = kvt_seq_len(s) + t;
        for (uint32_t li = 0; li < 2; li++) {
            for (int i = 0; i < NKV * HD; i++) k[i] = tu_randf(rng) * 2, v[i] = tu_randf(rng);
            kvt_seq_write_kv(s, li, pos, k, v);
            const kvt_codec c = kvt_kv_layout_codec_at(l, li, pos / BT);
            for (uint32_t h = 0; h < NKV; h++)
                for (int kv = 0; kv < 2; kv++) {
                    kvt_turbo_rotate(li, kv, h, (kv ? v : k) + h * HD, HD, rot);
                    kvt_codec_encode_row(kvt_codec_side(c, kv), rot, HD, row);
                    float *dst = (kv ? vr : kr) + (((size_t)li * MAXP + pos) * NKV + h) * HD;
                    kvt_codec_decode_row(kvt_codec_side(c, kv), row, HD, dst);
                }
        }
    }
}

static void check_turbo_attention(const char *spec, uint32_t window) {
    kvt_codec c;
    char err[200];
    assert_int_equal(kvt_turbo_parse(spec, &c, err, sizeof err), KVT_OK);
    kvt_layer_desc d[2];
    for (int i = 0; i < 2; i++)
        d[i] = (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = NKV, .head_dim_k = HD, .head_dim_v = HD, .codec = c};
    if (window) d[1].kind = KVT_KIND_WINDOW, d[1].window = window;
    kvt_kv_layout *l;
    assert_int_equal(kvt_kv_layout_create(d, 2, BT, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &l, err, sizeof err), KVT_OK);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    float *kr = calloc(2 * MAXP * NKV * HD, sizeof(float)), *vr = calloc(2 * MAXP * NKV * HD, sizeof(float));
    float *scratch = malloc(kvt_attention_scratch_floats(l, MAXP) * sizeof(float));
    static float q[MAXP * NHEAD * HD], qr[MAXP * NHEAD * HD], o1[MAXP * NHEAD * HD], o2[MAXP * NHEAD * HD];
    uint64_t rng = 99;
    static const uint32_t chunks[] = {37, 20, 1, 1, 40, 1, 1};
    const float scale = 1.0f / sqrtf((float)HD);
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
        const uint32_t pos0 = kvt_seq_len(s), n_q = chunks[ci];
        write_tokens(s, l, n_q, &rng, kr, vr);
        for (uint32_t i = 0; i < n_q * NHEAD * HD; i++) q[i] = tu_randf(&rng) * 3;
        for (uint32_t li = 0; li < 2; li++) {
            /* reference: rotated queries (query head h uses KV head h / rep), contiguous rotated rows,
             * then Π_V^T of each output head */
            for (uint32_t i = 0; i < n_q; i++)
                for (uint32_t h = 0; h < NHEAD; h++)
                    kvt_turbo_rotate(li, 0, h / (NHEAD / NKV), q + ((size_t)i * NHEAD + h) * HD, HD, qr + ((size_t)i * NHEAD + h) * HD);
            kvt_attention_ref(kr + (size_t)li * MAXP * NKV * HD, vr + (size_t)li * MAXP * NKV * HD, pos0 + n_q, NKV, HD, HD, qr,
                              n_q, NHEAD * HD, pos0, NHEAD, scale, d[li].kind == KVT_KIND_WINDOW ? window : 0, o2, NHEAD * HD);
            for (uint32_t i = 0; i < n_q; i++)
                for (uint32_t h = 0; h < NHEAD; h++) {
                    float *o = o2 + ((size_t)i * NHEAD + h) * HD;
                    kvt_turbo_unrotate(li, 1, h / (NHEAD / NKV), o, HD, o);
                }
            memset(o1, 0xff, sizeof(float) * n_q * NHEAD * HD);
            kvt_attention(s, li, q, n_q, NHEAD * HD, pos0, NHEAD, scale, 0, NHEAD, o1, NHEAD * HD, scratch);
            if (memcmp(o1, o2, sizeof(float) * n_q * NHEAD * HD) != 0)
                for (uint32_t i = 0; i < n_q * NHEAD * HD; i++)
                    if (memcmp(&o1[i], &o2[i], 4)) fail_msg("%s layer %u pos0 %u: elem %u %.9g vs %.9g", spec, li, pos0, i, o1[i], o2[i]);
        }
        int32_t toks[MAXP];
        for (uint32_t i = 0; i < n_q; i++) toks[i] = (int32_t)(pos0 + i);
        assert_int_equal(kvt_seq_commit(s, toks, n_q), KVT_OK);
    }
    kvt_seq_free(s);
    assert_int_equal(kvt_block_pool_used_bytes(p), 0);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
    free(kr), free(vr), free(scratch);
}

static void test_attention_k8v3(void **st) { (void)st; check_turbo_attention("turbo", 0); }
static void test_attention_k4v2_window(void **st) { (void)st; check_turbo_attention("turbo:k4v2", 24); }
static void test_attention_k5v5_simd_off(void **st) {
    (void)st;
    kvt_vec_force_level(0);
    check_turbo_attention("turbo:k5v5", 0);
}

/* quant_start > 0: base f16 blocks (unrotated) then TURBO blocks in one softmax. Compared with float
 * attention over the fully decoded (un-rotated) K/V within the fp32 rounding of the rotations. */
static void test_attention_mixed_variants(void **st) {
    (void)st;
    kvt_codec c;
    char err[200];
    assert_int_equal(kvt_turbo_parse("turbo:k8v8", &c, err, sizeof err), KVT_OK);
    kvt_layer_desc d = {.kind = KVT_KIND_FULL, .n_kv_heads = NKV, .head_dim_k = HD, .head_dim_v = HD, .codec = c};
    kvt_kv_layout *l;
    assert_int_equal(kvt_kv_layout_create(&d, 1, BT, (kvt_codec){.kind = KVT_CODEC_F16}, 20, &l, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 0).kind, KVT_CODEC_F16);
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 1).kind, KVT_CODEC_F16); /* 20 rounds up to block 2 */
    assert_int_equal(kvt_kv_layout_codec_at(l, 0, 2).kind, KVT_CODEC_TURBO);
    kvt_block_pool *p = kvt_block_pool_create(l, 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(p, 1, &s), KVT_OK);
    enum { N = 70 };
    static float k[N][NKV * HD], v[N][NKV * HD], kd[N * NKV * HD], vd[N * NKV * HD];
    uint64_t rng = 5;
    assert_int_equal(kvt_seq_prepare(s, N), KVT_OK);
    for (uint32_t pos = 0; pos < N; pos++) {
        for (int i = 0; i < NKV * HD; i++) k[pos][i] = tu_randf(&rng) * 2, v[pos][i] = tu_randf(&rng);
        kvt_seq_write_kv(s, 0, pos, k[pos], v[pos]);
        memcpy(kd + pos * NKV * HD, k[pos], sizeof k[pos]); /* k8v8 + f16: compare against the exact K/V */
        memcpy(vd + pos * NKV * HD, v[pos], sizeof v[pos]);
    }
    float *scratch = malloc(kvt_attention_scratch_floats(l, N) * sizeof(float));
    static float q[NHEAD * HD], o1[NHEAD * HD], o2[NHEAD * HD];
    for (int i = 0; i < NHEAD * HD; i++) q[i] = tu_randf(&rng) * 3;
    kvt_attention(s, 0, q, 1, NHEAD * HD, N - 1, NHEAD, 0.2f, 0, NHEAD, o1, NHEAD * HD, scratch);
    kvt_attention_ref(kd, vd, N, NKV, HD, HD, q, 1, NHEAD * HD, N - 1, NHEAD, 0.2f, 0, o2, NHEAD * HD);
    for (int i = 0; i < NHEAD * HD; i++)
        if (fabsf(o1[i] - o2[i]) > 0.03f) fail_msg("elem %d: %.6f vs %.6f", i, o1[i], o2[i]);
    int32_t toks[N] = {0};
    assert_int_equal(kvt_seq_commit(s, toks, N), KVT_OK);
    kvt_seq_free(s);
    kvt_block_pool_free(p);
    kvt_kv_layout_free(l);
    free(scratch);
}

/* ---- end-to-end error of attention over TURBO blocks vs exact f32 attention --------------------
 * The bit-equality tests above compare attention against a reference that uses the SAME decode, so
 * a wrong codebook scale, norm, bit packing or tile read shared by both would pass them. These two
 * tests instead predict the error of attention over TURBO blocks from the codec's D_mse and compare
 * with the error measured against exact attention over the unquantized K/V (kvt_attention_ref):
 *  - values (keys at 8 bits): o - o_exact = Σ_t p_t e_t with independent errors e_t, E||e_t||² =
 *    D_v ||v_t||², so E||o - o_exact||² = D_v Σ_t p_t² ||v_t||² (p the exact weights);
 *  - keys (values at 8 bits, one-hot values so the output IS the weight vector): the score errors
 *    δ_t = scale·<q, e_t> have variance scale² D_k ||q||² ||k_t||² / d, measured as the variance of
 *    log p̂_t − log p_t after removing its mean (softmax is shift invariant).
 * Gaussian K/V with head_dim 64 (smol-135m's), so the Gaussian-limit Lloyd–Max D_mse applies. */
enum { EH = 64, EN = 48, EBT = 16 };
static const double dmse_gauss[9] = {0, 0.3634, 0.1175, 0.03454, 0.009497, 0.002499, 0, 0, 0};

typedef struct err_ctx {
    kvt_kv_layout *l;
    kvt_block_pool *p;
    kvt_seq *s;
    float *scratch;
} err_ctx;

static void err_open(err_ctx *c, uint32_t kb, uint32_t vb) {
    char err[200];
    kvt_layer_desc d = {.kind = KVT_KIND_FULL, .n_kv_heads = 1, .head_dim_k = EH, .head_dim_v = EH,
                        .codec = {.kind = KVT_CODEC_TURBO, .bits = (uint8_t)kb, .vbits = (uint8_t)vb}};
    assert_int_equal(kvt_kv_layout_create(&d, 1, EBT, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &c->l, err, sizeof err), KVT_OK);
    c->p = kvt_block_pool_create(c->l, 0);
    assert_int_equal(kvt_seq_create(c->p, 1, &c->s), KVT_OK);
    assert_int_equal(kvt_seq_prepare(c->s, EN), KVT_OK);
    c->scratch = malloc(kvt_attention_scratch_floats(c->l, EN) * sizeof(float));
}
static void err_close(err_ctx *c) {
    kvt_seq_free(c->s);
    kvt_block_pool_free(c->p);
    kvt_kv_layout_free(c->l);
    free(c->scratch);
}

static void test_attention_value_error_matches_dmse(void **st) {
    (void)st;
    static const uint32_t vbits[4] = {2, 3, 4, 5};
    static float k[EN * EH], v[EN * EH], q[EH], o[EH], oe[EH], w[EN];
    const float scale = 1.0f / 8;
    for (int bi = 0; bi < 4; bi++) {
        double meas = 0, pred = 0;
        for (int trial = 0; trial < 40; trial++) {
            uint64_t rng = 1000 + 77 * (uint64_t)trial;
            err_ctx c;
            err_open(&c, 8, vbits[bi]);
            for (uint32_t i = 0; i < EN * EH; i++) k[i] = (float)gauss(&rng), v[i] = (float)gauss(&rng);
            for (uint32_t t = 0; t < EN; t++) kvt_seq_write_kv(c.s, 0, t, k + t * EH, v + t * EH);
            for (uint32_t i = 0; i < EH; i++) q[i] = (float)gauss(&rng);
            kvt_attention(c.s, 0, q, 1, EH, EN - 1, 1, scale, 0, 1, o, EH, c.scratch);
            kvt_attention_ref(k, v, EN, 1, EH, EH, q, 1, EH, EN - 1, 1, scale, 0, oe, EH);
            /* exact weights (double) for the prediction */
            double m = -INFINITY, z = 0;
            for (uint32_t t = 0; t < EN; t++) {
                double sdot = 0;
                for (uint32_t i = 0; i < EH; i++) sdot += (double)q[i] * k[t * EH + i];
                w[t] = (float)(sdot * scale);
                m = fmax(m, w[t]);
            }
            for (uint32_t t = 0; t < EN; t++) z += exp(w[t] - m);
            for (uint32_t t = 0; t < EN; t++) {
                const double pt = exp(w[t] - m) / z;
                double vn = 0;
                for (uint32_t i = 0; i < EH; i++) vn += (double)v[t * EH + i] * v[t * EH + i];
                pred += dmse_gauss[vbits[bi]] * pt * pt * vn;
            }
            for (uint32_t i = 0; i < EH; i++) meas += ((double)o[i] - oe[i]) * ((double)o[i] - oe[i]);
            int32_t toks[EN] = {0};
            assert_int_equal(kvt_seq_commit(c.s, toks, EN), KVT_OK);
            err_close(&c);
        }
        const double ratio = meas / pred;
        print_message("turbo v%u: attention output error %.4g, predicted from D_mse %.4g (ratio %.3f)\n", vbits[bi], meas,
                      pred, ratio);
        if (ratio < 0.75 || ratio > 1.3) fail_msg("v%u: measured/predicted value error %.3f outside [0.75, 1.3]", vbits[bi], ratio);
    }
}

static void test_attention_key_error_matches_dmse(void **st) {
    (void)st;
    static const uint32_t kbits[3] = {2, 4, 5};
    static float k[EN * EH], v[EN * EH], q[EH], o[EH], oe[EH];
    const float scale = 1.0f / 8;
    for (int bi = 0; bi < 3; bi++) {
        double meas = 0, pred = 0;
        for (int trial = 0; trial < 40; trial++) {
            uint64_t rng = 5000 + 31 * (uint64_t)trial;
            err_ctx c;
            err_open(&c, kbits[bi], 8);
            memset(v, 0, sizeof v);
            for (uint32_t t = 0; t < EN; t++) v[t * EH + t] = 1.0f; /* one-hot: output element t = weight of key t */
            for (uint32_t i = 0; i < EN * EH; i++) k[i] = (float)gauss(&rng);
            for (uint32_t t = 0; t < EN; t++) kvt_seq_write_kv(c.s, 0, t, k + t * EH, v + t * EH);
            for (uint32_t i = 0; i < EH; i++) q[i] = (float)gauss(&rng) * 0.5f;
            kvt_attention(c.s, 0, q, 1, EH, EN - 1, 1, scale, 0, 1, o, EH, c.scratch);
            kvt_attention_ref(k, v, EN, 1, EH, EH, q, 1, EH, EN - 1, 1, scale, 0, oe, EH);
            double qn = 0, dsum = 0, d2 = 0;
            for (uint32_t i = 0; i < EH; i++) qn += (double)q[i] * q[i];
            for (uint32_t t = 0; t < EN; t++) {
                assert_true(o[t] > 0 && oe[t] > 0);
                const double dl = log((double)o[t]) - log((double)oe[t]);
                dsum += dl, d2 += dl * dl;
                double kn = 0;
                for (uint32_t i = 0; i < EH; i++) kn += (double)k[t * EH + i] * k[t * EH + i];
                pred += (double)scale * scale * dmse_gauss[kbits[bi]] * qn * kn / EH;
            }
            meas += d2 - dsum * dsum / EN; /* Σ (δ_t − mean δ)² */
            int32_t toks[EN] = {0};
            assert_int_equal(kvt_seq_commit(c.s, toks, EN), KVT_OK);
            err_close(&c);
        }
        pred *= (double)(EN - 1) / EN; /* the removed mean takes one degree of freedom */
        const double ratio = meas / pred;
        print_message("turbo k%u: score error variance %.4g, predicted from D_mse %.4g (ratio %.3f)\n", kbits[bi], meas, pred, ratio);
        if (ratio < 0.75 || ratio > 1.3) fail_msg("k%u: measured/predicted score error %.3f outside [0.75, 1.3]", kbits[bi], ratio);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codebook_published),     cmocka_unit_test(test_rotation_orthogonal),
        cmocka_unit_test(test_mse_bound),              cmocka_unit_test(test_decode_simd_equals_scalar),
        cmocka_unit_test(test_decode8_every_code),
        cmocka_unit_test(test_zero_and_nonfinite),     cmocka_unit_test(test_qjl_unbiased),
        cmocka_unit_test(test_codec_sizes_keys_parse), cmocka_unit_test(test_attention_k8v3),
        cmocka_unit_test(test_attention_k4v2_window),  cmocka_unit_test(test_attention_mixed_variants),
        cmocka_unit_test(test_attention_k5v5_simd_off),
        cmocka_unit_test(test_attention_value_error_matches_dmse),
        cmocka_unit_test(test_attention_key_error_matches_dmse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
