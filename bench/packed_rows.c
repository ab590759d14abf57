/* bench/packed_rows.c — kvt_matmul_packed with 1, 2, 4 and 8 activation rows on one thread, the
 * weights in cache (a 2048 × 512 matrix by default: what one thread's share of a batched decode step
 * costs in compute once its bytes have arrived). The kernel under test is the one the ISA in use
 * picks (under AVX-512 VNNI: the n16 nibble kernels for Q4_K, Q5_K, Q4_0).
 *   make build/bench/packed_rows && build/bench/packed_rows [TYPE=q4_k|q5_k|q4_0|q6_k|q8_0] [N_IN=2048]
 *        [N_OUT=512] [PASSES=30]
 * Prints GMAC/s (n_in·n_out·rows / time) per row count, best of PASSES passes of ~0.2 G MACs each:
 * the best pass, because a shared VM's other tenants only ever slow a pass down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "kernels/quant.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {{"q4_k", KVT_TYPE_Q4_K}, {"q5_k", KVT_TYPE_Q5_K}, {"q4_0", KVT_TYPE_Q4_0},
                 {"q6_k", KVT_TYPE_Q6_K}, {"q8_0", KVT_TYPE_Q8_0}};
    const char *tn = argc > 1 ? argv[1] : "q4_k";
    uint32_t t = UINT32_MAX;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(tn, types[i].name)) t = types[i].type;
    const long long K = argc > 2 ? atoll(argv[2]) : 2048, N = argc > 3 ? atoll(argv[3]) : 512;
    const int passes = argc > 4 ? atoi(argv[4]) : 30;
    if (t == UINT32_MAX || K <= 0 || K % 256 || N <= 0 || N % 16 || K * N > (1LL << 28) || passes <= 0) {
        fprintf(stderr, "usage: %s [q4_k|q5_k|q4_0|q6_k|q8_0] [N_IN (a multiple of 256)] [N_OUT (of 16)] [PASSES]\n", argv[0]);
        return 2;
    }
    enum { RMAX = 8 };
    float *w = malloc(sizeof(float) * (size_t)(K * N)), *x = malloc(sizeof(float) * (size_t)(K * RMAX));
    const size_t rb = (size_t)kvt_type_row_bytes(t, (uint64_t)K);
    uint8_t *q = malloc(rb * (size_t)N);
    void *act = malloc(kvt_act_bytes(t, K, RMAX));
    float *y = malloc(sizeof(float) * (size_t)(N * RMAX));
    if (!w || !x || !q || !act || !y) return 1;
    srand(1);
    for (long long i = 0; i < K * N; i++) w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (long long i = 0; i < K * RMAX; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (long long o = 0; o < N; o++) kvt_quantize_ref(t, w + o * K, q + (size_t)o * rb, K);
    kvt_packed *p = kvt_packed_create(t, q, K, N);
    if (!p) {
        fprintf(stderr, "%s has no packed layout on this CPU\n", tn);
        return 1;
    }
    kvt_act_quantize(t, x, K, 0, RMAX, act);
    printf("%s %lld x %lld, 1 thread, GMAC/s (best of %d passes)\n", tn, K, N, passes);
    for (int R = 1; R <= RMAX; R *= 2) {
        const int reps = (int)(2e8 / ((double)K * (double)N * R)) + 1;
        double best = 1e30;
        for (int ps = 0; ps < passes; ps++) {
            const double t0 = now_s();
            for (int k = 0; k < reps; k++) kvt_matmul_packed(p, act, R, y, N, 0, N);
            const double dt = (now_s() - t0) / reps;
            if (dt < best) best = dt;
        }
        printf("rows %d  %7.1f\n", R, (double)K * (double)N * R / best / 1e9);
    }
    kvt_packed_free(p);
    free(w), free(x), free(q), free(act), free(y);
    return 0;
}
