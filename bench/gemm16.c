// bench/gemm16.c — single-thread GFLOP/s of F16 products: the row-major f32 tiles (KVT_TYPE_F16, what
// runs with KVT_F16X=0) against the 16-output groups (KVT_TYPE_F16X, gemm_f16x.c), best of 600 ms each,
// on the ISA in use (KVT_ISA=avx2 for the AVX2 kernels).
//   make build/bench/gemm16 && build/bench/gemm16 N_IN N_OUT ROWS     (e.g. 1024 3072 512)
// GFLOP/s = 2·n_in·n_out·rows / time.
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "kernels/quant.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s N_IN N_OUT ROWS\n", argv[0]);
        return 2;
    }
    const int64_t n_in = atoll(argv[1]), n_out = atoll(argv[2]), n_rows = atoll(argv[3]);
    if (n_in < 1 || n_out < 1 || n_rows < 1 || n_in > 65536 || n_out > 262144 || n_rows > 4096) {
        fprintf(stderr, "sizes out of range\n");
        return 2;
    }
    uint16_t *w = malloc(2 * (size_t)(n_in * n_out));
    float *x = malloc(4 * (size_t)(n_in * n_rows)), *y = malloc(4 * (size_t)(n_out * n_rows));
    if (!w || !x || !y) return 1;
    for (int64_t i = 0; i < n_in * n_out; i++) w[i] = kvt_f32_to_f16((float)((i * 7919) % 2001 - 1000) / 1e4f);
    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (float)((i * 31) % 201 - 100) / 100.f;
    uint8_t *W = kvt_f16x_pack(KVT_TYPE_F16, w, n_in, n_out, NULL);
    if (!W) return 1;
    for (int t = 0; t < 2; t++) {
        const uint32_t ty = t ? KVT_TYPE_F16X : KVT_TYPE_F16;
        const void *M = t ? (const void *)W : (const void *)w;
        double best;
        BENCH_BEST_MS(best, 600, kvt_matmul_rows(ty, M, n_in, x, n_rows, y, n_out, 0, n_out));
        printf("%-5s %lld x %lld, %lld rows: %.1f GFLOP/s\n", t ? "f16x" : "f16", (long long)n_in, (long long)n_out,
               (long long)n_rows, 2.0 * (double)n_in * (double)n_out * (double)n_rows / (best * 1e6));
    }
    free(W), free(w), free(x), free(y);
    return 0;
}
