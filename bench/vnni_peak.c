/* bench/vnni_peak.c — the issue rate of the instructions the nibble kernels (src/kernels/gemm_k16.c,
 * gemm_s16.c) are built from, on one core: 16 independent vpdpbusd zmm chains alone, and next to 16
 * vpandd, 16 vpbroadcastd from memory, 16 vpaddd or 16 vcvtdq2ps (which pipes are free beside it), or
 * 4 vpmulld, vpdpwssd or vfmadd231ps (which share its pipes: a K-quant kernel's per-sub-block scale
 * multiply, its min sums and its float updates each take a vpdpbusd slot). It bounds what a batched decode step can cost:
 * an R-row step of a model with M weights needs R·M/64 vpdpbusd (docs/batching.md).
 *   make build/bench/vnni_peak && build/bench/vnni_peak
 * Prints G instructions/s (best of 5 runs of 50 M loop iterations); x86-64 with AVX-512 VNNI only. */
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
#define N_ITER 50000000L
#define CLOB16 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"
#define CLOB24 CLOB16, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"
#define D(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define A(r) "vpandd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define B(r) "vpbroadcastd %0, %%zmm" #r "\n\t"
#define M(r) "vpmulld %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define W(r) "vpdpwssd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define FM(r) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define AD(r) "vpaddd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define CV(r) "vcvtdq2ps %%zmm30, %%zmm" #r "\n\t"
/* 16 vpdpbusd with 4 (X4) or 16 (X16) other instructions between them */
#define X4(Z) D(0) Z(16) D(1) D(2) D(3) Z(17) D(4) D(5) D(6) D(7) Z(18) D(8) D(9) D(10) D(11) Z(19) D(12) D(13) D(14) D(15)
#define X16(Z)                                                                                                      \
    D(0) Z(16) D(1) Z(17) D(2) Z(18) D(3) Z(19) D(4) Z(20) D(5) Z(21) D(6) Z(22) D(7) Z(23) D(8) Z(16) D(9) Z(17) D(10) \
        Z(18) D(11) Z(19) D(12) Z(20) D(13) Z(21) D(14) Z(22) D(15) Z(23)
#define D16 D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11) D(12) D(13) D(14) D(15)

static int g_mem[16] __attribute__((aligned(64)));

/* Best of 5 timings of N_ITER iterations of the loop body KERNEL, in seconds. */
#define BEST(KERNEL)                                                                               \
    ({                                                                                             \
        double best_ = 1e30;                                                                       \
        for (int rep_ = 0; rep_ < 5; rep_++) {                                                     \
            const double t0_ = now_s();                                                            \
            for (long n_ = 0; n_ < N_ITER; n_++) KERNEL;                                           \
            const double dt_ = now_s() - t0_;                                                      \
            if (dt_ < best_) best_ = dt_;                                                          \
        }                                                                                          \
        best_;                                                                                     \
    })

__attribute__((target("avx512f,avx512vnni"))) static void run(void) {
    double t = BEST(__asm__ volatile(D16 ::: CLOB16));
    printf("vpdpbusd, 16 chains:             %.2f G/s (%.0f GMAC/s)\n", N_ITER * 16 / t / 1e9, N_ITER * 16 * 64 / t / 1e9);
    t = BEST(__asm__ volatile(A(0) A(1) A(2) A(3) A(4) A(5) A(6) A(7) A(8) A(9) A(10) A(11) A(12) A(13) A(14) A(15) ::: CLOB16));
    printf("vpandd alone:                    %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(D(0) A(16) D(1) A(17) D(2) A(18) D(3) A(19) D(4) A(20) D(5) A(21) D(6) A(22) D(7) A(23)
                                  D(8) A(16) D(9) A(17) D(10) A(18) D(11) A(19) D(12) A(20) D(13) A(21) D(14) A(22)
                                      D(15) A(23) ::: CLOB24));
    printf("vpdpbusd next to 16 vpandd:      %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(D(0) B(16) D(1) B(17) D(2) B(18) D(3) B(19) D(4) B(20) D(5) B(21) D(6) B(22) D(7) B(23)
                                  D(8) B(16) D(9) B(17) D(10) B(18) D(11) B(19) D(12) B(20) D(13) B(21) D(14) B(22)
                                      D(15) B(23)::"m"(g_mem[0]) : CLOB24));
    printf("vpdpbusd next to 16 vpbroadcastd: %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(D(0) M(16) D(1) D(2) D(3) M(17) D(4) D(5) D(6) D(7) M(18) D(8) D(9) D(10) D(11) M(19) D(12)
                                  D(13) D(14) D(15) ::: CLOB24));
    printf("vpdpbusd next to 4 vpmulld:      %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(X4(W) ::: CLOB24));
    printf("vpdpbusd next to 4 vpdpwssd:     %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(X4(FM) ::: CLOB24));
    printf("vpdpbusd next to 4 vfmadd231ps:  %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(X16(AD) ::: CLOB24));
    printf("vpdpbusd next to 16 vpaddd:      %.2f G/s\n", N_ITER * 16 / t / 1e9);
    t = BEST(__asm__ volatile(X16(CV) ::: CLOB24));
    printf("vpdpbusd next to 16 vcvtdq2ps:   %.2f G/s\n", N_ITER * 16 / t / 1e9);
}

int main(void) {
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "vnni_peak: this CPU has no AVX-512 VNNI\n");
        return 2;
    }
    run();
    return 0;
}
#else
int main(void) {
    fprintf(stderr, "vnni_peak: x86-64 only\n");
    return 2;
}
#endif
