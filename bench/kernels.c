/* bench/kernels.c — single-thread micro-benchmark of kvt_matmul_rows (GEMV n_rows=1, GEMM n_rows=64
 * and 512) and of kvt_matmul_packed on the repacked weights (GEMM columns "packed"; 0 = the type has
 * no packed layout) per weight type and ISA. Built by hand (not part of `make`):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/kernels.c src/util/common.c src/kernels/[a-z]*.c -lm -o /tmp/bench_kernels
 *   /tmp/bench_kernels
 * Shapes: 576 in × 1536 out (SmolLM2-135M ffn_up); K-quants need n_in % 256 == 0, so they run the
 * 1536 in × 576 out ffn_down shape (same FLOPs). ISA "amx" = the AVX-512 table plus the AMX int8
 * kernels for Q8_0 (all columns; `/tmp/bench_kernels 2` runs avx512 and amx only). For F16 the
 * "packed" columns are the bf16 pair dot (KVT_TYPE_BF16X, weights rounded to bf16 for the bench)
 * where the ISA has it; GEMV of that kernel is printed at the end of the line.
 * GFLOP/s = 2·n_in·n_out·n_rows / time, matmul only (activation quantization is timed separately). */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "kernels/quant.h"

/* best-of timing of CALL over about 300 ms (after one warm-up call), GFLOP/s */
#define BEST_GFLOPS(CALL, OUT)                                                                        \
    do {                                                                                              \
        double ms_;                                                                                   \
        CALL;                                                                                         \
        BENCH_BEST_MS(ms_, 300, CALL);                                                                \
        OUT = 2.0 * (double)n_in * (double)n_out * (double)n_rows / (ms_ * 1e6);                     \
    } while (0)

static double bench_one(uint32_t t, int64_t n_in, int64_t n_out, int64_t n_rows, double *act_us, double *packed) {
    float *w = malloc((size_t)(n_in * n_out) * 4), *x = malloc((size_t)(n_in * n_rows) * 4);
    float *y = malloc((size_t)(n_out * n_rows) * 4);
    uint64_t s = 1;
    for (int64_t i = 0; i < n_in * n_out; i++) w[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    void *wq = malloc(kvt_type_row_bytes(t, n_in) * n_out);
    kvt_quantize_ref(t, w, wq, n_in * n_out);
    void *a = malloc(kvt_act_bytes(t, n_in, n_rows));
    BENCH_BEST_MS(*act_us, 50, kvt_act_quantize(t, x, n_in, 0, n_rows, a));
    *act_us *= 1000.0;
    kvt_matmul_rows(t, wq, n_in, a, n_rows, y, n_out, 0, n_out); /* warm */
    double ms;
    BENCH_BEST_MS(ms, 300, kvt_matmul_rows(t, wq, n_in, a, n_rows, y, n_out, 0, n_out));
    *packed = 0;
    kvt_packed *P = kvt_packed_create(t, wq, n_in, n_out);
    if (P) {
        double pms;
        kvt_matmul_packed(P, a, n_rows, y, n_out, 0, n_out);
        BENCH_BEST_MS(pms, 300, kvt_matmul_packed(P, a, n_rows, y, n_out, 0, n_out));
        *packed = 2.0 * (double)n_in * (double)n_out * (double)n_rows / (pms * 1e6);
        kvt_packed_free(P);
    }
    uint8_t *B = (t == KVT_TYPE_F16 && kvt_bf16x_enabled()) ? kvt_bf16x_pack(t, wq, n_in, n_out, true, NULL) : NULL;
    if (B) {
        void *ab = malloc(kvt_act_bytes(KVT_TYPE_BF16X, n_in, n_rows));
        kvt_act_quantize(KVT_TYPE_BF16X, x, n_in, 0, n_rows, ab);
        BEST_GFLOPS(kvt_matmul_rows(KVT_TYPE_BF16X, B, n_in, ab, n_rows, y, n_out, 0, n_out), *packed);
        free(ab), free(B);
    }
    free(w), free(x), free(y), free(wq), free(a);
    return 2.0 * (double)n_in * (double)n_out * (double)n_rows / (ms * 1e6);
}

int main(int argc, char **argv) {
    kvt_kernels_init();
    const int isa_from = argc > 1 ? atoi(argv[1]) : KVT_ISA_SCALAR;
    const uint32_t types[] = {KVT_TYPE_Q8_0, KVT_TYPE_F16, KVT_TYPE_Q4_K, KVT_TYPE_Q5_K, KVT_TYPE_Q4_0, KVT_TYPE_Q5_0, KVT_TYPE_Q6_K, KVT_TYPE_Q4_1, KVT_TYPE_F32};
    for (int isa = isa_from; isa <= (int)kvt_kernels_best_isa(); isa++) {
        kvt_kernels_force_isa((kvt_isa)isa);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            const uint32_t t = types[i];
            const bool k = t == KVT_TYPE_Q4_K || t == KVT_TYPE_Q5_K || t == KVT_TYPE_Q6_K;
            const int64_t n_in = k ? 1536 : 576, n_out = k ? 576 : 1536;
            double au1, au64, p1, p64, p512, au512;
            const double g1 = bench_one(t, n_in, n_out, 1, &au1, &p1);
            const double g64 = bench_one(t, n_in, n_out, 64, &au64, &p64);
            const double g512 = bench_one(t, n_in, n_out, 512, &au512, &p512);
            printf("%-7s %-5s %4lldx%-4lld GEMV %6.1f  GEMM(64) %6.1f packed %6.1f  GEMM(512) %6.1f packed %6.1f "
                   "GFLOP/s  act-quant(64 rows) %.1f us",
                   kvt_isa_name((kvt_isa)isa), kvt_type_name(t), (long long)n_in, (long long)n_out, g1, g64, p64,
                   g512, p512, au64);
            if (t == KVT_TYPE_F16 && p1 > 0) printf("  bf16x GEMV %.1f", p1);
            printf("\n");
        }
    }
    return 0;
}
