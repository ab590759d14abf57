/* test_vec.c — kernels/vec.h: every table the CPU runs (AVX2, AVX-512) against the scalar
 * references bit for bit, over lengths with tails, shapes the blocked kernels refuse, and special
 * values (±0, ±inf, NaN, subnormals, the exp edges); exp's accuracy and edges; the dispatcher
 * following kvt_kernels_force_isa (and KVT_ISA) and kvt_vec_force_level lowering only. */
#include "testutil.h"

#include <math.h>

#include "kernels/vec.h"

/* ISAs whose vector table differs (AMX runs the AVX-512 one). */
static int vec_isas(kvt_isa *out) {
    int n = 0;
    const kvt_isa best = kvt_kernels_best_isa();
    for (int i = KVT_ISA_SCALAR; i <= (int)best && i <= KVT_ISA_AVX512; i++) out[n++] = (kvt_isa)i;
    return n;
}

static float special(uint64_t *s) {
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-41f, 88.0f, 88.5f, -87.0f,
                               -87.2f, -87.33654f, -87.4f, -103.0f, 3.4e38f};
    const uint64_t r = tu_rand(s);
    return r % 8 == 0 ? sp[(r >> 8) % (sizeof sp / sizeof sp[0])] : 40.0f * tu_randf(s);
}

static void fill(float *x, size_t n, uint64_t *s, bool specials) {
    for (size_t i = 0; i < n; i++) x[i] = specials ? special(s) : tu_randf(s);
}

/* argmax (greedy sampling) at every level against the scalar scan: lengths with tails, every
 * special value mixed in (NaN must never win, except at index 0), ties of the maximum far apart
 * and within one vector, +0/-0 ties, all -inf, all NaN. */
static void test_argmax_equal_ref(void **st) {
    (void)st;
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    const kvt_vec_ops *ref = kvt_vec_ops_for(KVT_ISA_SCALAR);
    enum { N = 300 };
    static float x[N];
    uint64_t s = 5;
    assert_int_equal(ref->argmax(x, 0), 0);
    for (int k = 0; k < ni; k++) {
        const kvt_vec_ops *op = kvt_vec_ops_for(isas[k]);
        for (int rep = 0; rep < 60; rep++)
            for (uint32_t n = 0; n <= N; n += n < 40 ? 1 : 37) {
                fill(x, N, &s, rep % 2 == 0);
                if (rep % 5 == 1 && n > 3) x[tu_rand(&s) % n] = x[tu_rand(&s) % n] = 1e30f; /* a tie */
                if (rep % 5 == 2 && n > 0) x[0] = NAN;
                if (rep % 5 == 3)
                    for (uint32_t i = 0; i < n; i++) x[i] = i % 3 ? -INFINITY : NAN;
                if (rep % 5 == 4)
                    for (uint32_t i = 0; i < n; i++) x[i] = i % 2 ? 0.0f : -0.0f;
                assert_int_equal(op->argmax(x, n), ref->argmax(x, n));
            }
        for (uint32_t i = 0; i < N; i++) x[i] = -INFINITY;
        assert_int_equal(op->argmax(x, N), 0);
        for (uint32_t i = 0; i < N; i++) x[i] = NAN;
        assert_int_equal(op->argmax(x, N), 0);
        x[N - 1] = -1.0f; /* a NaN at index 0 stays the answer (the scan compares against it) */
        assert_int_equal(op->argmax(x, N), 0);
        x[0] = -7.0f; /* the largest number wins over every NaN */
        assert_int_equal(op->argmax(x, N), N - 1);
        x[5] = 2.0f, x[17] = 2.0f; /* first of equal maxima, in different vectors */
        assert_int_equal(op->argmax(x, N), 5);
    }
    assert_int_equal(kvt_vec_argmax(x, N), 5);
}

/* The elementwise operations, exp_sum and lanes_reduce, on random values with every special value
 * mixed in. */
static void test_elementwise_equal_ref(void **st) {
    (void)st;
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    const kvt_vec_ops *ref = kvt_vec_ops_for(KVT_ISA_SCALAR);
    assert_int_equal(ref->level, 0);
    enum { N = 261 };
    static float x[N], g[N], u[N], a[N], b[N], a2[N], b2[N];
    uint64_t s = 11;
    for (int k = 1; k < ni; k++) {
        const kvt_vec_ops *op = kvt_vec_ops_for(isas[k]);
        assert_int_equal(op->level, isas[k] == KVT_ISA_AVX2 ? 1 : 2);
        for (uint32_t n = 0; n <= N; n += n < 40 ? 1 : 29) {
            fill(x, N, &s, true), fill(g, N, &s, true), fill(u, N, &s, false);
            ref->exp_clamped(a, x, n), op->exp_clamped(b, x, n);
            assert_memory_equal(a, b, n * sizeof(float));
            ref->silu_mul(a, g, u, n), op->silu_mul(b, g, u, n);
            assert_memory_equal(a, b, n * sizeof(float));
            ref->silu_mul(a, g, NULL, n), op->silu_mul(b, g, NULL, n);
            assert_memory_equal(a, b, n * sizeof(float));
            ref->sigmoid_mul(a, g, u, n), op->sigmoid_mul(b, g, u, n);
            assert_memory_equal(a, b, n * sizeof(float));
            ref->gelu_mul(a, g, u, n), op->gelu_mul(b, g, u, n);
            for (uint32_t i = 0; i < n; i++) /* a NaN (inf · 0): any payload */
                assert_true(memcmp(&a[i], &b[i], 4) == 0 || (a[i] != a[i] && b[i] != b[i]));
            /* finite operands for the FMA forms (a NaN's payload is not part of their contract) */
            fill(x, N, &s, false), fill(g, N, &s, false);
            memcpy(a, u, sizeof u), memcpy(b, u, sizeof u);
            ref->axpy(a, 0.37f, g, n), op->axpy(b, 0.37f, g, n);
            ref->vfma(a, x, g, n), op->vfma(b, x, g, n);
            ref->scale(a, -1.5f, n), op->scale(b, -1.5f, n);
            assert_memory_equal(a, b, N * sizeof(float));
            const float d0 = ref->dot(u, g, n), d1 = op->dot(u, g, n);
            assert_memory_equal(&d0, &d1, 4);
            /* softmax: scores around a maximum, some masked, some NaN */
            for (uint32_t i = 0; i < n; i++) {
                a[i] = b[i] = special(&s);
                a2[i] = b2[i] = isnan(a[i]) ? 1.0f : a[i]; /* round_f16: every non-NaN input */
            }
            const float s0 = ref->exp_sum(a, n, 0.5f), s1 = op->exp_sum(b, n, 0.5f);
            assert_true(memcmp(&s0, &s1, 4) == 0 || (s0 != s0 && s1 != s1)); /* a NaN sum: any payload */
            assert_memory_equal(a, b, n * sizeof(float));
            ref->round_f16(a2, a2, n, 0.25f), op->round_f16(b2, b2, n, 0.25f);
            assert_memory_equal(a2, b2, n * sizeof(float));
            /* the V lanes' reduction: 16 lanes ld apart (ld > n: padding between lanes), every
             * special value; the tree written out for column 0 */
            static float lanes[16 * (N + 3)];
            fill(lanes, 16 * (N + 3), &s, true);
            ref->lanes_reduce(a, lanes, N + 3, n), op->lanes_reduce(b, lanes, N + 3, n);
            for (uint32_t i = 0; i < n; i++) /* a NaN: any payload */
                assert_true(memcmp(&a[i], &b[i], 4) == 0 || (a[i] != a[i] && b[i] != b[i]));
            if (n > 0) {
                const float *c = lanes;
                const size_t ld = N + 3;
                float t[8];
                for (int l = 0; l < 8; l++) t[l] = c[l * ld] + c[(l + 8) * ld];
                const float want = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
                assert_true(memcmp(&want, a, 4) == 0 || (want != want && a[0] != a[0]));
            }
        }
    }
}

/* The attention products, including shapes the blocked AVX-512 kernels refuse (n % 16 != 0,
 * ldk % 16 != 0, key counts that are not a multiple of 4 or 16). */
static void test_attention_products_equal_ref(void **st) {
    (void)st;
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    const kvt_vec_ops *ref = kvt_vec_ops_for(KVT_ISA_SCALAR);
    enum { D = 136, R = 37, LDK = 64 };
    static float q[4][D], k[R * D], w[4][R], kt0[D * LDK], kt1[D * LDK], o0[4][R], o1[4][R], y0[4][D], y1[4][D];
    static uint16_t k16[R * D];
    uint64_t s = 5;
    for (int j = 0; j < 4; j++) fill(q[j], D, &s, false), fill(w[j], R, &s, false);
    fill(k, R * D, &s, false);
    for (int i = 0; i < R * D; i++) k16[i] = kvt_f32_to_f16(k[i]);
    const float *qq[4] = {q[0], q[1], q[2], q[3]}, *ww[4] = {w[0], w[1], w[2], w[3]};
    float *oo0[4] = {o0[0], o0[1], o0[2], o0[3]}, *oo1[4] = {o1[0], o1[1], o1[2], o1[3]};
    float *yy0[4] = {y0[0], y0[1], y0[2], y0[3]}, *yy1[4] = {y1[0], y1[1], y1[2], y1[3]};
    static const uint32_t dims[] = {16, 24, 64, 128, 136};
    for (int kk = 1; kk < ni; kk++) {
        const kvt_vec_ops *op = kvt_vec_ops_for(isas[kk]);
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (uint32_t nr = 1; nr <= R; nr += 6) {
                const uint32_t n = dims[di];
                ref->dot_rows(q[0], k, D, nr, n, 0.125f, o0[0]), op->dot_rows(q[0], k, D, nr, n, 0.125f, o1[0]);
                assert_memory_equal(o0[0], o1[0], nr * sizeof(float));
                ref->dot_q4(qq, k, D, nr, n, 0.125f, oo0), op->dot_q4(qq, k, D, nr, n, 0.125f, oo1);
                for (int j = 0; j < 4; j++) assert_memory_equal(o0[j], o1[j], nr * sizeof(float));
                memset(y0, 0, sizeof y0), memset(y1, 0, sizeof y1);
                ref->axpy_rows(y0[0], w[0], k, D, nr, n), op->axpy_rows(y1[0], w[0], k, D, nr, n);
                ref->axpy_q4(yy0, ww, k, D, nr, n), op->axpy_q4(yy1, ww, k, D, nr, n);
                assert_memory_equal(y0, y1, sizeof y0);
                for (size_t ldk = LDK - 8; ldk <= LDK; ldk += 8) { /* 56: the refused stride */
                    memset(kt0, 0x7f, sizeof kt0), memset(kt1, 0x7f, sizeof kt1);
                    ref->transpose_rows(k, D, nr, n, kt0, ldk), op->transpose_rows(k, D, nr, n, kt1, ldk);
                    assert_memory_equal(kt0, kt1, sizeof kt0);
                    ref->dot_kt_q4(qq, kt0, ldk, nr, n, 0.125f, oo0), op->dot_kt_q4(qq, kt0, ldk, nr, n, 0.125f, oo1);
                    for (int j = 0; j < 4; j++) {
                        assert_memory_equal(o0[j], o1[j], nr * sizeof(float));
                        for (uint32_t r = 0; r < nr; r++) { /* == the row dot */
                            const float e = ref->dot(q[j], k + (size_t)r * D, n) * 0.125f;
                            assert_memory_equal(&o0[j][r], &e, 4);
                        }
                    }
                    memset(kt0, 0x7f, sizeof kt0), memset(kt1, 0x7f, sizeof kt1);
                    ref->transpose_f16_rows((const uint8_t *)k16, 2 * D, nr, n, kt0, ldk);
                    op->transpose_f16_rows((const uint8_t *)k16, 2 * D, nr, n, kt1, ldk);
                    assert_memory_equal(kt0, kt1, sizeof kt0);
                }
            }
    }
}

/* The test's own decode of element i of an encoded row (vec.h kvt_vec_rowfmt's layout). */
static float enc_elem(const kvt_vec_rowfmt *f, const uint8_t *row, uint32_t i) {
    uint16_t h;
    if (f->kind == KVT_ROWS_F16) {
        memcpy(&h, row + 2 * i, 2);
        return kvt_f16_to_f32(h);
    }
    const uint32_t bits = f->kind == KVT_ROWS_A8 ? 8 : 4, ng = f->dim / f->group, g = i / f->group;
    const uint8_t *sc = row + f->dim * bits / 8;
    const uint32_t code = bits == 8 ? row[i] : (i & 1 ? row[i / 2] >> 4 : row[i / 2] & 15u);
    float s, b;
    memcpy(&h, sc + 2 * g, 2);
    s = f->scale_bf16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32(h);
    memcpy(&h, sc + 2 * (ng + g), 2);
    b = f->scale_bf16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32(h);
    return s * (float)code + b;
}

/* The encoded-row forms (dot_enc_qn, axpy_enc_qn) at every level, for f16 rows and 8- and 4-bit
 * affine rows (groups 32/64/128, f16 and bf16 scales): equal to the scalar references, and those
 * equal to decoding the rows and running the f32 forms per query. 1-4 queries, row counts around
 * the groups of 8, widths with and without the 16-column steps (the SIMD forms take whole steps;
 * the dispatch runs the references otherwise), column ranges of the V product (d0, n), padded
 * rows, rows every 16th (the attention's lanes), f16 values of every exponent (subnormals and
 * zeros included) in rows and scales, and with a continuation (run_end / run_next: where the fetches
 * ahead go past the rows, never what is read) inside the rows, at their end and pointing at an
 * unrelated buffer, or marked cached (no fetches ahead). A table without them (NULL) runs the
 * references through kvt_vec_*. */
#define RF(k, b, g, d) {.kind = (k), .scale_bf16 = (b), .group = (g), .dim = (d)}
static void test_enc_rows_equal_ref(void **st) {
    (void)st;
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    const kvt_vec_ops *ref = kvt_vec_ops_for(KVT_ISA_SCALAR);
    enum { D = 256, R = 41, RB = 2 * D + 16 };
    static uint8_t k16[R * 16 * RB];
    static float q[4][D], w[4][R], dec[R][D], o0[4][R], o1[4][R], o2[4][R];
    static float yl0[4][16][D], yl1[4][16][D], yl2[4][16][D]; /* query j's lane l at [j][l] */
    uint64_t s = 29;
    for (size_t i = 0; i < sizeof k16 / 2; i++) { /* f16 bit patterns: codes and scales alike */
        const float v = (tu_rand(&s) % 16 == 0) ? ldexpf(tu_randf(&s), -(int)(tu_rand(&s) % 30)) : 8.0f * tu_randf(&s);
        const uint16_t h = (tu_rand(&s) % 64 == 0) ? 0x8000 : kvt_f32_to_f16(v);
        memcpy(k16 + 2 * i, &h, 2);
    }
    for (int j = 0; j < 4; j++) fill(q[j], D, &s, false), fill(w[j], R, &s, false);
    const float *qq[4] = {q[0], q[1], q[2], q[3]}, *ww[4] = {w[0], w[1], w[2], w[3]};
    float *oo0[4] = {o0[0], o0[1], o0[2], o0[3]}, *oo1[4] = {o1[0], o1[1], o1[2], o1[3]};
    static const kvt_vec_rowfmt fmts[] = {
        RF(KVT_ROWS_F16, 0, 0, 8),   RF(KVT_ROWS_F16, 0, 0, 40),  RF(KVT_ROWS_F16, 0, 0, 64),  RF(KVT_ROWS_F16, 0, 0, 72),
        RF(KVT_ROWS_F16, 0, 0, 128), RF(KVT_ROWS_F16, 0, 0, 144), RF(KVT_ROWS_A8, 0, 32, 64),  RF(KVT_ROWS_A8, 1, 64, 64),
        RF(KVT_ROWS_A8, 0, 128, 256), RF(KVT_ROWS_A8, 0, 32, 96), RF(KVT_ROWS_A4, 0, 64, 64),  RF(KVT_ROWS_A4, 1, 32, 128),
        RF(KVT_ROWS_A4, 0, 128, 128), RF(KVT_ROWS_A8, 0, 32, 40), RF(KVT_ROWS_A4, 1, 32, 160),
    };
    bool fused_seen = false;
    for (int kk = 0; kk < ni; kk++) {
        const kvt_vec_ops *op = kvt_vec_ops_for(isas[kk]);
        if (!op->dot_enc_qn) continue;
        fused_seen = true;
        assert_non_null(op->axpy_enc_qn);
        for (size_t fi = 0; fi < 4 * (sizeof fmts / sizeof fmts[0]); fi++) {
            kvt_vec_rowfmt fc = fmts[fi / 4];
            static uint8_t other[4096];
            if (fi % 4 == 1) fc.run_end = k16 + 3 * RB, fc.run_next = other; /* inside the rows */
            if (fi % 4 == 2) fc.run_end = k16 + sizeof k16, fc.run_next = k16; /* at their end: wraps */
            if (fi % 4 == 3) fc.cached = 1;                                      /* no fetches ahead */
            const kvt_vec_rowfmt *f = &fc;
            const uint32_t n = f->dim;
            const size_t nat = f->kind == KVT_ROWS_F16 ? 2 * (size_t)n
                                                       : n * (f->kind == KVT_ROWS_A8 ? 8 : 4) / 8 + 4 * (size_t)(n / f->group);
            const size_t rbs[] = {nat, RB, 16 * RB}; /* unpadded, padded, every 16th row */
            const uint32_t cols[][2] = {{0, n}, {16, n >= 48 ? 32 : 0}, {n >= 32 ? n - 16 : 0, n >= 32 ? 16 : 0}};
            for (size_t ri = 0; ri < 3; ri++)
                for (uint32_t nr = 1; nr <= R; nr += nr < 10 ? 1 : 7)
                    for (uint32_t nq = 1; nq <= KVT_VEC_QN; nq++) {
                        const size_t rb = rbs[ri];
                        kvt_vec_dot_enc_qn_ref(f, qq, nq, k16, rb, nr, 0.125f, oo0);
                        op->dot_enc_qn(f, qq, nq, k16, rb, nr, 0.125f, oo1);
                        for (uint32_t r = 0; r < nr; r++) /* the decoded rows */
                            for (uint32_t i = 0; i < n; i++) dec[r][i] = enc_elem(f, k16 + r * rb, i);
                        for (uint32_t j = 0; j < nq; j++) {
                            assert_memory_equal(o0[j], o1[j], nr * sizeof(float));
                            ref->dot_rows(q[j], dec[0], D, nr, n, 0.125f, o2[j]);
                            assert_memory_equal(o0[j], o2[j], nr * sizeof(float));
                        }
                        for (size_t ci = 0; ci < 3 * 4; ci++) {
                            const uint32_t d0 = cols[ci / 4][0], nc = cols[ci / 4][1];
                            /* lanes: one (a plain axpy), the attention's 16 from lanes 0 and 5, 3 from 2 */
                            static const uint32_t lanes[4][2] = {{1, 0}, {16, 0}, {16, 5}, {3, 2}};
                            const uint32_t nl = lanes[ci % 4][0], l0 = lanes[ci % 4][1];
                            if (nc == 0 || (nl > 1 && fi % 3 != 0)) continue; /* lanes without a continuation */
                            for (int j = 0; j < 4; j++) fill(yl0[j][0], 16 * D, &s, false);
                            memcpy(yl1, yl0, sizeof yl0), memcpy(yl2, yl0, sizeof yl0);
                            float *ly0[4] = {yl0[0][0], yl0[1][0], yl0[2][0], yl0[3][0]};
                            float *ly1[4] = {yl1[0][0], yl1[1][0], yl1[2][0], yl1[3][0]};
                            kvt_vec_axpy_enc_qn_ref(f, ly0, D, nl, l0, ww, nq, k16, rb, nr, d0, nc);
                            op->axpy_enc_qn(f, ly1, D, nl, l0, ww, nq, k16, rb, nr, d0, nc);
                            for (uint32_t r = 0; r < nr; r++) /* row by row: each lane's chain ascending */
                                for (uint32_t j = 0; j < nq; j++)
                                    ref->axpy_rows(yl2[j][(l0 + r) % nl], &w[j][r], dec[r] + d0, D, 1, nc);
                            assert_memory_equal(yl0, yl1, sizeof yl0); /* queries past nq untouched too */
                            assert_memory_equal(yl0, yl2, sizeof yl0);
                        }
                    }
        }
    }
    /* the AVX2 and AVX-512 tables have them; whatever the table in use, the kvt_vec_* calls give the
     * references' bits */
    if (kvt_kernels_best_isa() >= KVT_ISA_AVX2) assert_true(fused_seen);
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi += 5) {
        const kvt_vec_rowfmt *f = &fmts[fi];
        kvt_vec_dot_enc_qn(f, qq, 3, k16, RB, 17, 0.5f, oo0);
        kvt_vec_dot_enc_qn_ref(f, qq, 3, k16, RB, 17, 0.5f, oo1);
        for (int j = 0; j < 3; j++) assert_memory_equal(o0[j], o1[j], 17 * sizeof(float));
        memset(yl0, 0, sizeof yl0), memset(yl1, 0, sizeof yl1);
        float *ly0[4] = {yl0[0][0], yl0[1][0], yl0[2][0], yl0[3][0]};
        float *ly1[4] = {yl1[0][0], yl1[1][0], yl1[2][0], yl1[3][0]};
        kvt_vec_axpy_enc_qn(f, ly0, D, 16, 7, ww, 3, k16, RB, 17, 0, f->dim);
        kvt_vec_axpy_enc_qn_ref(f, ly1, D, 16, 7, ww, 3, k16, RB, 17, 0, f->dim);
        assert_memory_equal(yl0, yl1, sizeof yl0);
    }
    /* the SIMD domain: whole 16-element steps within the row, affine groups of 32-128 */
    const kvt_vec_rowfmt bad[] = {RF(KVT_ROWS_F16, 0, 0, 72), RF(KVT_ROWS_A8, 0, 16, 64), RF(KVT_ROWS_A4, 0, 64, 96)};
    for (size_t i = 0; i < 3; i++) assert_false(kvt_vec_rows_fused(&bad[i], 0, bad[i].dim));
    const kvt_vec_rowfmt ok = RF(KVT_ROWS_A8, 0, 64, 128);
    assert_false(kvt_vec_rows_fused(&ok, 8, 16));
    assert_false(kvt_vec_rows_fused(&ok, 112, 32));
    assert_int_equal(kvt_vec_rows_fused(&ok, 16, 32), kvt_vec_level() >= 1); /* the AVX2 and AVX-512 forms */
}

/* exp over a sweep of float bit patterns (every 97th, all signs and exponents): the 8- and
 * 16-lane copies equal the scalar exp (exp_clamped, and exp_sum with its values and sum);
 * kvt_vec_exp and kvt_vec_exp_clamped keep their edges. */
static void test_exp_sweep_and_edges(void **st) {
    (void)st;
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    enum { B = 4096 };
    static float x[B], ea[B], es[B], b[B];
    uint32_t m = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 97) {
        const uint32_t u = (uint32_t)bits;
        memcpy(&x[m++], &u, 4);
        if (m < B && bits + 97 <= 0xffffffffull) continue;
        kvt_vec_ops_for(KVT_ISA_SCALAR)->exp_clamped(ea, x, m);
        memcpy(es, x, m * sizeof(float));
        const float s0 = kvt_vec_exp_sum_ref(es, m, 0.0f);
        for (int k = 1; k < ni; k++) {
            const kvt_vec_ops *op = kvt_vec_ops_for(isas[k]);
            op->exp_clamped(b, x, m);
            assert_memory_equal(ea, b, m * sizeof(float));
            memcpy(b, x, m * sizeof(float));
            const float s1 = op->exp_sum(b, m, 0.0f);
            assert_true(memcmp(&s0, &s1, 4) == 0 || (s0 != s0 && s1 != s1)); /* a NaN sum: any payload */
            assert_memory_equal(es, b, m * sizeof(float));
        }
        m = 0;
    }
    double worst = 0;
    for (float v = -87.0f; v <= 88.0f; v += 0.0371f) {
        const double want = exp((double)v);
        const double e1 = fabs(kvt_vec_exp(v) - want) / want, e2 = fabs(kvt_vec_exp_clamped(v) - want) / want;
        worst = fmax(worst, fmax(e1, e2));
        assert_true(kvt_vec_exp(v) == kvt_vec_exp_clamped(v)); /* one polynomial */
    }
    print_message("exp: max relative error %.2e on [-87, 88]\n", worst);
    assert_true(worst < 3e-7);
    assert_true(kvt_vec_exp(-87.2f) == 0.0f && kvt_vec_exp_clamped(-87.2f) > 0.0f);
    assert_true(kvt_vec_exp_clamped(-87.4f) == 0.0f && kvt_vec_exp(-INFINITY) == 0.0f);
    assert_true(isnan(kvt_vec_exp(NAN)) && kvt_vec_exp_clamped(NAN) == kvt_vec_exp_clamped(88.0f));
    assert_true(kvt_vec_exp(1000.0f) == kvt_vec_exp(88.0f) && kvt_vec_exp(0.0f) == 1.0f);
}

/* The table in use follows the kernels' ISA; kvt_vec_force_level only lowers (restored after). */
/* gelu_mul against GELU's tanh form in double over [-12, 12] (as g·σ(2z)): the relative error within a
 * few float roundings of z2 (whose error σ(2z) scales by |2z| where σ is small); the float tanh form
 * loses all of it for negative g to the cancellation in 1 + tanh(z). */
static void test_gelu_accuracy(void **st) {
    (void)st;
    float worst = 0.0f;
    for (int i = -120000; i <= 120000; i++) {
        const float g = (float)i * 1e-4f, u = 1.0f;
        float y;
        kvt_vec_ops_for(KVT_ISA_SCALAR)->gelu_mul(&y, &g, &u, 1);
        const double z = 0.7978845608028654 * (double)g * (1.0 + 0.044715 * (double)g * (double)g);
        const double gd = (double)g / (1.0 + exp(-2.0 * z)); /* = 0.5·g·(1 + tanh(z)), no cancellation in double */
        const double err = fabs((double)y - gd), bound = 1.2e-6 * (1.0 + 2.0 * fabs(z)) * fabs(gd) + 1e-30;
        if (err > bound) fprintf(stderr, "gelu(%.9g) = %.9g, double %.17g\n", g, y, gd);
        assert_true(err <= bound);
        if (fabs(gd) > 1e-30 && err / fabs(gd) > worst) worst = (float)(err / fabs(gd));
    }
    fprintf(stderr, "gelu_mul: worst relative error %.3g (results above 1e-30)\n", worst);
}

static void test_dispatch_follows_kernels(void **st) {
    (void)st;
    kvt_kernels_init();
    const char *env = getenv("KVT_ISA");
    const kvt_isa isa = kvt_kernels_isa();
    assert_ptr_equal(kvt_vec(), kvt_vec_ops_for(isa));
    if (env && !strcmp(env, "scalar")) assert_int_equal(kvt_vec_level(), 0);
    if (env && !strcmp(env, "avx2") && kvt_kernels_best_isa() >= KVT_ISA_AVX2) assert_int_equal(kvt_vec_level(), 1);
    kvt_isa isas[4];
    const int ni = vec_isas(isas);
    for (int k = ni - 1; k >= 0; k--) {
        assert_true(kvt_kernels_force_isa(isas[k]));
        assert_int_equal(kvt_vec_level(), k);
    }
    assert_true(kvt_kernels_force_isa(kvt_kernels_best_isa()));
    const int top = kvt_vec_level();
    kvt_vec_force_level(top + 1);
    assert_int_equal(kvt_vec_level(), top);
    kvt_vec_force_level(0);
    assert_int_equal(kvt_vec_level(), 0);
    assert_ptr_equal(kvt_vec(), kvt_vec_ops_for(KVT_ISA_SCALAR));
    assert_true(kvt_kernels_force_isa(isa));
}

/* ---- moved from test_kv_codec.c with the operations (kv/codec.c -> kernels/vec.c) ---- */

/* Multi-row dot / axpy used by attention == looping the scalar single-row helpers, bit for bit,
 * for row counts around the 8-row block and dims with and without an 8-multiple. */
static void test_rows_vs_scalar(void **st) {
    (void)st;
    kvt_kernels_init();
    uint64_t rng = 11;
    static float k[40 * 136], q[136], s1[40], s2[40], y1[136], y2[136], w[40];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = tu_randf(&rng) * 2;
    for (int i = 0; i < 136; i++) q[i] = tu_randf(&rng);
    for (int i = 0; i < 40; i++) w[i] = tu_randf(&rng) + 0.5f;
    const uint32_t dims[] = {8, 32, 64, 128, 136, 20, 3};
    for (int di = 0; di < 7; di++) {
        const uint32_t n = dims[di];
        for (uint32_t nr = 0; nr <= 40; nr++) {
            kvt_vec_dot_rows(q, k, n, nr, n, 0.125f, s1);
            kvt_vec_dot_rows_ref(q, k, n, nr, n, 0.125f, s2);
            assert_memory_equal(s1, s2, nr * sizeof(float));
            for (uint32_t r = 0; r < nr; r++) { /* and each equals the single-row helper */
                float one = kvt_vec_dot(q, k + (size_t)r * n, n) * 0.125f;
                assert_memory_equal(&one, &s1[r], 4);
            }
            for (uint32_t i = 0; i < n; i++) y1[i] = y2[i] = tu_randf(&rng);
            kvt_vec_axpy_rows(y1, w, k, n, nr, n);
            kvt_vec_axpy_rows_ref(y2, w, k, n, nr, n);
            assert_memory_equal(y1, y2, n * sizeof(float));
        }
    }
    /* the scalar forms are not trivially equal to something else: a different order differs */
    float a = kvt_vec_dot_ref(q, k, 128), b = 0.0f;
    for (int i = 0; i < 128; i++) b += q[i] * k[i];
    assert_true(fabsf(a - b) < 1e-3f);
}

/* dot/axpy/exp numerics v2: every SIMD level (AVX-512, AVX2+FMA, scalar) and the 4-query kernels give
 * the bits of the scalar definitions; exp is accurate and maps -inf to 0 and NaN to NaN. Runs last:
 * it lowers the process-wide SIMD level. */
/* kvt_vec_round_f16 (attention's f16 rounding of Q and of the softmax weights): every SIMD level
 * equals the scalar definition and the kvt_f32_to_f16 round trip, for normals, subnormals, ties,
 * overflow and zeros, with and without a multiplier, in place and out of place. */
/* kvt_vec_round_f16 at the current SIMD level equals the scalar rounding and f16(x*mul). */
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
            kvt_vec_round_f16(x, a, n, muls[mi]);
            kvt_vec_round_f16_ref(x, b, n, muls[mi]);
            assert_memory_equal(a, b, n * sizeof(float));
            for (uint32_t i = 0; i < n; i++) {
                const float want = kvt_f16_to_f32(kvt_f32_to_f16(x[i] * muls[mi]));
                assert_memory_equal(&a[i], &want, sizeof(float));
            }
            memcpy(b, x, n * sizeof(float));
            kvt_vec_round_f16(b, b, n, muls[mi]); /* in place */
            assert_memory_equal(a, b, n * sizeof(float));
        }
}

/* Every level (test_fma_levels also checks each level it visits: this test runs after it, when
 * forcing has left the level at scalar). */
static void test_round_f16_levels(void **st) {
    (void)st;
    for (int level = kvt_vec_level(); level >= 0; level--) {
        kvt_vec_force_level(level);
        round_f16_check();
    }
    /* the rounding really happens: 1 + 2^-12 is not an f16 */
    float v = 1.0f + 1.0f / 4096.0f, r;
    kvt_vec_round_f16(&v, &r, 1, 1.0f);
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
                kvt_vec_transpose_rows(k + (size_t)r0 * N, N, nk, n, kt, LDK);
                kvt_vec_transpose_rows_ref(k + (size_t)r0 * N, N, nk, n, kt_s, LDK);
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
                    for (uint32_t r = 0; r < nk; r++) /* the exact f16 decode (the KV f16 codec's) */
                        for (uint32_t d = 0; d < n; d++) {
                            uint16_t h;
                            memcpy(&h, h16 + r * rb + 2 * (size_t)d, 2);
                            dec[(size_t)r * N + d] = kvt_f16_to_f32(h);
                        }
                    kvt_vec_transpose_rows_ref(dec, N, nk, n, kt_s, LDK);
                    kvt_vec_transpose_f16_rows(h16, rb, nk, n, kt, LDK);
                    for (uint32_t d = 0; d < n; d++)
                        assert_memory_equal(kt + (size_t)d * LDK, kt_s + (size_t)d * LDK, np * sizeof(float));
                    kvt_vec_transpose_f16_rows_ref(h16, rb, nk, n, kt, LDK);
                    for (uint32_t d = 0; d < n; d++)
                        assert_memory_equal(kt + (size_t)d * LDK, kt_s + (size_t)d * LDK, np * sizeof(float));
                    kvt_vec_transpose_rows(k + (size_t)r0 * N, N, nk, n, kt, LDK); /* back to the f32 keys */
                }
                for (int rep = 0; rep < 2; rep++) { /* distinct queries, then one query repeated */
                    const float *qq[4] = {q[0], q[rep ? 0 : 1], q[rep ? 0 : 2], q[rep ? 0 : 3]};
                    float *oo[4] = {out[0], out[1], out[2], out[3]};
                    for (int j = 0; j < 4; j++) out[j][nk] = 12345.0f; /* must stay: the masked tail */
                    kvt_vec_dot_kt_q4(qq, kt, LDK, nk, n, 0.125f, oo);
                    for (int j = 0; j < 4; j++) {
                        kvt_vec_dot_rows_ref(qq[j], k + (size_t)r0 * N, N, nk, n, 0.125f, ref[j]);
                        assert_memory_equal(out[j], ref[j], nk * sizeof(float));
                        if (nk < R) assert_true(out[j][nk] == 12345.0f);
                    }
                    kvt_vec_dot_kt_q4_ref(qq, kt, LDK, nk, n, 0.125f, oo);
                    for (int j = 0; j < 4; j++) assert_memory_equal(out[j], ref[j], nk * sizeof(float));
                }
            }
        }
    }
}

/* kvt_vec_exp_sum at the current level equals the scalar one bit for bit over a sweep of float bit
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
                    const float s1 = kvt_vec_exp_sum(b, n, ms[mi]), s0 = kvt_vec_exp_sum_ref(r, n, ms[mi]);
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
    for (int level = kvt_vec_level(); level >= 0; level--) {
        kvt_vec_force_level(level);
        round_f16_check();
        dot_kt_check();
        exp_sum_check();
        for (uint32_t n = 1; n <= N; n += (n < 20 ? 1 : 13)) {
            for (int j = 0; j < 4; j++)
                for (int r = 0; r < R; r++) {
                    float d = kvt_vec_dot(q[j], k + r * N, n), s = kvt_vec_dot_ref(q[j], k + r * N, n);
                    assert_memory_equal(&d, &s, 4);
                }
            const float *qq[4] = {q[0], q[1], q[2], q[3]};
            float out[4][R], *oo[4] = {out[0], out[1], out[2], out[3]};
            kvt_vec_dot_q4(qq, k, N, R, n, 0.125f, oo);
            for (int j = 0; j < 4; j++) {
                kvt_vec_dot_rows_ref(q[j], k, N, R, n, 0.125f, ref_s[j]);
                assert_memory_equal(out[j], ref_s[j], sizeof(float) * R);
                kvt_vec_dot_rows(q[j], k, N, R, n, 0.125f, out[j]);
                assert_memory_equal(out[j], ref_s[j], sizeof(float) * R);
            }
            memset(y0, 0, sizeof y0), memset(y1, 0, sizeof y1);
            float *yy[4] = {y1[0], y1[1], y1[2], y1[3]};
            const float *ww[4] = {w[0], w[1], w[2], w[3]};
            kvt_vec_axpy_q4(yy, ww, k, N, R, n);
            for (int j = 0; j < 4; j++) {
                kvt_vec_axpy_rows_ref(y0[j], w[j], k, N, R, n);
                assert_memory_equal(y0[j], y1[j], sizeof(float) * n);
            }
        }
        for (int n = 0; n < R + 20; n++) e0[n] = e1[n] = (float)(n % 11) * -3.7f + (n == 5 ? -INFINITY : 0.0f);
        float s0 = kvt_vec_exp_sum_ref(e0, R + 20, 0.5f), s1 = kvt_vec_exp_sum(e1, R + 20, 0.5f);
        assert_memory_equal(&s0, &s1, 4);
        assert_memory_equal(e0, e1, sizeof e0);
        assert_true(e0[5] == 0.0f);
    }
    for (float x = -87.0f; x <= 0.0f; x += 0.37f) {
        double ref = exp((double)x), got = kvt_vec_exp(x);
        assert_true(fabs(got - ref) <= 4e-7 * ref);
    }
    assert_true(kvt_vec_exp(-INFINITY) == 0.0f && kvt_vec_exp(0.0f) == 1.0f && isnan(kvt_vec_exp(NAN)));
}

int main(void) {
    kvt_kernels_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_equal_ref),
        cmocka_unit_test(test_argmax_equal_ref),
        cmocka_unit_test(test_attention_products_equal_ref),
        cmocka_unit_test(test_enc_rows_equal_ref),
        cmocka_unit_test(test_exp_sweep_and_edges),
        cmocka_unit_test(test_gelu_accuracy),
        cmocka_unit_test(test_dispatch_follows_kernels),
        /* these lower the level for the rest of the process: last, in this order */
        cmocka_unit_test(test_rows_vs_scalar),
        cmocka_unit_test(test_fma_levels),
        cmocka_unit_test(test_round_f16_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
