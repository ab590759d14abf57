// bench/mla_prefill.c — MLA prefill attention per chunk: absorbed (what src/model/mla.c runs) vs
// expanded K/V, single thread, at DeepSeek-V2-Lite's attention shape (16 heads, latent 512, rope
// key 64, d_nope 128, d_v 128). Built by hand after `make` (not part of the build):
//   cc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/mla_prefill.c build/libkvtier.a -lxxhash -lm -o /tmp/bench_mla
//   nice /tmp/bench_mla [reps]            (bench/mla.sh runs it and keeps the output)
// For a chunk of n queries at positions [pos0, pos0 + n) over T = pos0 + n cached latent rows:
//   absorbed: q_lat,h = [W_UK,hᵀ q_nope,h | q_pe,h] (f32), kvt_attention over the f16 latent cache
//             (MLA kind), latent output -> value space by W_UV,h (f32) — mla.c steps 5-7;
//   expanded: every cached latent expanded per head (k_nope = W_UK,h c, v = W_UV,h c, k_pe shared)
//             into a FULL-kind f16 K/V sequence of 16 heads x (192, 128), then kvt_attention over it.
// Both use the same f32 dot kernel (kvt_dot_f32) for the projections and kvtier's attention kernel.
// Reported: thread CPU seconds per chunk (median of reps), the MAC counts, and the max |difference|
// between the two outputs relative to the output's max magnitude.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/quant.h"
#include "kv/kv.h"

enum { H = 16, R = 512, DR = 64, DN = 128, DV = 128, DQ = DN + DR, LR = R + DR };

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(g_rng >> 40) / 16777216.0f * 2.0f - 1.0f;
}
static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct kvset {
    kvt_kv_layout *l;
    kvt_block_pool *p;
    kvt_seq *s;
} kvset;

static void kv_open(kvset *k, kvt_layer_desc d, uint32_t n_ctx) {
    char err[200];
    if (kvt_kv_layout_create(&d, 1, 256, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &k->l, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    k->p = kvt_block_pool_create(k->l, 0);
    kvt_seq_create(k->p, 1, &k->s);
    kvt_seq_prepare(k->s, n_ctx);
}
static void kv_close(kvset *k) {
    kvt_seq_free(k->s);
    kvt_block_pool_free(k->p);
    kvt_kv_layout_free(k->l);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const uint32_t cfg[][2] = {{64, 0}, {512, 0}, {64, 4032}, {512, 3584}}; /* (n, pos0) */
    float *ukt = malloc(sizeof(float) * H * R * DN), *uk = malloc(sizeof(float) * H * DN * R);
    float *uv = malloc(sizeof(float) * H * DV * R);
    for (size_t i = 0; i < (size_t)H * R * DN; i++) ukt[i] = 0.05f * frand();
    for (uint32_t h = 0; h < H; h++) /* W_UK,h [DN][R] = transpose of ukt[h] [R][DN] */
        for (uint32_t c = 0; c < R; c++)
            for (uint32_t i = 0; i < DN; i++) uk[((size_t)h * DN + i) * R + c] = ukt[((size_t)h * R + c) * DN + i];
    for (size_t i = 0; i < (size_t)H * DV * R; i++) uv[i] = 0.05f * frand();
    const float scale = 1.0f / sqrtf((float)DQ);
    kvt_kernels_init();
    /* attn_kv_b as a q8_0 model stores it: per head W_UK,h (DN rows) then W_UV,h (DV rows), R wide */
    const int64_t KB = (int64_t)H * (DN + DV);
    float *kvb = malloc(sizeof(float) * KB * R);
    for (uint32_t h = 0; h < H; h++) {
        memcpy(kvb + (size_t)h * (DN + DV) * R, uk + (size_t)h * DN * R, sizeof(float) * DN * R);
        memcpy(kvb + ((size_t)h * (DN + DV) + DN) * R, uv + (size_t)h * DV * R, sizeof(float) * DV * R);
    }
    void *kvb_q8 = malloc(kvt_type_row_bytes(KVT_TYPE_Q8_0, R) * KB);
    kvt_quantize_ref(KVT_TYPE_Q8_0, kvb, kvb_q8, KB * R);
    free(kvb);
    printf("MLA prefill attention per chunk, DeepSeek-V2-Lite shape (H %d, latent %d + rope %d, d_nope %d, d_v %d), "
           "1 thread, median of %d\n", H, R, DR, DN, DV, reps);
    printf("| n | pos0 | T | absorbed s | expanded f32 s (expansion) | expanded q8_0 kv_b s (expansion) | absorbed GMAC | expanded GMAC | rel diff f32 / q8_0 |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
        const uint32_t n = cfg[ci][0], pos0 = cfg[ci][1], T = pos0 + n;
        /* the latent cache and the f16-rounded latents (what the cache returns) */
        kvset lat, ex;
        kv_open(&lat, (kvt_layer_desc){.kind = KVT_KIND_MLA, .n_kv_heads = 1, .head_dim_k = LR, .head_dim_v = R,
                                       .codec = {.kind = KVT_CODEC_F16}}, T);
        float *rows = malloc(sizeof(float) * (size_t)T * LR);
        int32_t *toks = calloc(T, sizeof(int32_t));
        for (size_t i = 0; i < (size_t)T * LR; i++) rows[i] = kvt_f16_to_f32(kvt_f32_to_f16(frand()));
        for (uint32_t t = 0; t < T; t++) kvt_seq_write_kv(lat.s, 0, t, rows + (size_t)t * LR, NULL);
        float *q = malloc(sizeof(float) * n * H * DQ), *qabs = malloc(sizeof(float) * n * H * LR);
        float *olat = malloc(sizeof(float) * n * H * R), *oa = malloc(sizeof(float) * n * H * DV);
        float *oe = malloc(sizeof(float) * n * H * DV);
        for (size_t i = 0; i < (size_t)n * H * DQ; i++) q[i] = frand();
        float *sc_lat = malloc(sizeof(float) * kvt_attention_scratch_floats(lat.l, T));
        double ta[16], te[16], tx[16], tm[16], tmx[16];
        float *om = malloc(sizeof(float) * n * H * DV), *ybuf = malloc(sizeof(float) * (size_t)T * KB);
        void *act = malloc(kvt_act_bytes(KVT_TYPE_Q8_0, R, T));
        float *krow = malloc(sizeof(float) * H * DQ), *vrow = malloc(sizeof(float) * H * DV);
        for (int rep = 0; rep < reps && rep < 16; rep++) {
            /* absorbed */
            double t0 = cpu_sec();
            for (uint32_t pr = 0; pr < n * H; pr++) {
                const uint32_t r = pr / H, h = pr % H;
                const float *qh = q + (size_t)r * H * DQ + (size_t)h * DQ;
                float *qa = qabs + (size_t)r * H * LR + (size_t)h * LR;
                for (uint32_t c = 0; c < R; c++) qa[c] = kvt_dot_f32(ukt + ((size_t)h * R + c) * DN, qh, DN);
                memcpy(qa + R, qh + DN, DR * sizeof(float));
            }
            kvt_attention(lat.s, 0, qabs, n, H * LR, pos0, H, scale, 0, H, olat, H * R, sc_lat);
            for (uint32_t pr = 0; pr < n * H; pr++) {
                const uint32_t r = pr / H, h = pr % H;
                for (uint32_t i = 0; i < DV; i++)
                    oa[(size_t)r * H * DV + h * DV + i] =
                        kvt_dot_f32(uv + ((size_t)h * DV + i) * R, olat + (size_t)r * H * R + (size_t)h * R, R);
            }
            ta[rep] = cpu_sec() - t0;
            /* expanded: a fresh K/V sequence per chunk (nothing expanded is kept between chunks) */
            kv_open(&ex, (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = H, .head_dim_k = DQ, .head_dim_v = DV,
                                          .codec = {.kind = KVT_CODEC_F16}}, T);
            float *sc_ex = malloc(sizeof(float) * kvt_attention_scratch_floats(ex.l, T));
            t0 = cpu_sec();
            for (uint32_t t = 0; t < T; t++) {
                const float *c = rows + (size_t)t * LR;
                for (uint32_t h = 0; h < H; h++) {
                    for (uint32_t i = 0; i < DN; i++) krow[h * DQ + i] = kvt_dot_f32(uk + ((size_t)h * DN + i) * R, c, R);
                    memcpy(krow + h * DQ + DN, c + R, DR * sizeof(float));
                    for (uint32_t i = 0; i < DV; i++) vrow[h * DV + i] = kvt_dot_f32(uv + ((size_t)h * DV + i) * R, c, R);
                }
                kvt_seq_write_kv(ex.s, 0, t, krow, vrow);
            }
            tx[rep] = cpu_sec() - t0;
            kvt_attention(ex.s, 0, q, n, H * DQ, pos0, H, scale, 0, H, oe, H * DV, sc_ex);
            te[rep] = cpu_sec() - t0;
            free(sc_ex);
            kv_close(&ex);
            /* expanded with the model's own kernel: all T latents through the q8_0 attn_kv_b matmul */
            kv_open(&ex, (kvt_layer_desc){.kind = KVT_KIND_FULL, .n_kv_heads = H, .head_dim_k = DQ, .head_dim_v = DV,
                                          .codec = {.kind = KVT_CODEC_F16}}, T);
            sc_ex = malloc(sizeof(float) * kvt_attention_scratch_floats(ex.l, T));
            t0 = cpu_sec();
            float *cs = malloc(sizeof(float) * (size_t)T * R);
            for (uint32_t t = 0; t < T; t++) memcpy(cs + (size_t)t * R, rows + (size_t)t * LR, sizeof(float) * R);
            kvt_act_quantize(KVT_TYPE_Q8_0, cs, R, 0, T, act);
            kvt_matmul_rows(KVT_TYPE_Q8_0, kvb_q8, R, act, T, ybuf, KB, 0, KB);
            for (uint32_t t = 0; t < T; t++) {
                const float *y = ybuf + (size_t)t * KB;
                for (uint32_t h = 0; h < H; h++) {
                    memcpy(krow + h * DQ, y + (size_t)h * (DN + DV), DN * sizeof(float));
                    memcpy(krow + h * DQ + DN, rows + (size_t)t * LR + R, DR * sizeof(float));
                    memcpy(vrow + h * DV, y + (size_t)h * (DN + DV) + DN, DV * sizeof(float));
                }
                kvt_seq_write_kv(ex.s, 0, t, krow, vrow);
            }
            tmx[rep] = cpu_sec() - t0;
            kvt_attention(ex.s, 0, q, n, H * DQ, pos0, H, scale, 0, H, om, H * DV, sc_ex);
            tm[rep] = cpu_sec() - t0;
            free(cs);
            free(sc_ex);
            kv_close(&ex);
        }
        double mx = 0, md = 0;
        for (size_t i = 0; i < (size_t)n * H * DV; i++) {
            mx = fmax(mx, fabs(oa[i]));
            md = fmax(md, fabs(oa[i] - oe[i]));
        }
        const int nr = reps < 16 ? reps : 16;
        qsort(ta, nr, sizeof *ta, cmpd);
        qsort(te, nr, sizeof *te, cmpd);
        qsort(tx, nr, sizeof *tx, cmpd);
        qsort(tm, nr, sizeof *tm, cmpd);
        qsort(tmx, nr, sizeof *tmx, cmpd);
        double mdm = 0;
        for (size_t i = 0; i < (size_t)n * H * DV; i++) mdm = fmax(mdm, fabs(oa[i] - om[i]));
        /* MACs: visible keys summed over the chunk's causal rows */
        const double keys = (double)n * pos0 + (double)n * (n + 1) / 2;
        const double gabs = ((double)n * H * R * DN + keys * H * (LR + R) + (double)n * H * DV * R) / 1e9;
        const double gexp = ((double)T * H * (DN + DV) * R + keys * H * (DQ + DV)) / 1e9;
        printf("| %u | %u | %u | %.3f | %.3f (%.3f) | %.3f (%.3f) | %.2f | %.2f | %.1e / %.1e |\n", n, pos0, T, ta[nr / 2],
               te[nr / 2], tx[nr / 2], tm[nr / 2], tmx[nr / 2], gabs, gexp, md / (mx > 0 ? mx : 1), mdm / (mx > 0 ? mx : 1));
        fflush(stdout);
        free(om), free(ybuf), free(act);
        free(rows), free(toks), free(q), free(qabs), free(olat), free(oa), free(oe), free(sc_lat), free(krow), free(vrow);
        kv_close(&lat);
    }
    free(ukt), free(uk), free(uv), free(kvb_q8);
    return 0;
}
