// bench/gemv.c — decode GEMV against the memory-bandwidth limit: single-row kvt_matmul_rows over a
// set of weight matrices much larger than the last-level cache (cold weights, as in decode), per
// weight type and layout (rows: the GGUF's row-major rows, as read through the file mapping;
// interleaved: kvt_packed's single-row copy, 4 rows interleaved by block, what decode reads; packed:
// a kvt_packed without that copy, e.g. Q8_0/Q4_0/Q5_0's 16-row layout under AVX-512 VNNI), on a
// thread pool with each thread taking its 16-aligned output columns of every
// matrix in one parallel region (the forward pass's split), then the read bandwidth of the same
// thread count (kernels/membw.h). Prints GB/s of weights streamed and the fraction of bandwidth.
//   make build/bench/gemv && [GEMV_HUGE=1] build/bench/gemv [THREADS=1] [TYPES="q4_k q5_k q6_k q8_0 q4_0 f16 bf16x"; also q5_0 q4_1 q5_1 f16x] [MIB=256] [PASSES=15]
// Shape: n_in 2048 x n_out 8192 (llama-1b ffn_gate; GEMV_NIN / GEMV_NOUT set others) replicated to MIB of weights.
// GEMV_ROWS=R (1-64, default 1): R activation rows a product (a batched decode step's), GB/s still the weights'. bf16x = F16
// weights packed for the bf16 pair dot (what the loader uses for F16/BF16 files on AVX-512 BF16); f16x = F16 weights in
// 16-output groups (what it uses for the other F16 matrices on AVX-512).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_util.h"
#include "kernels/membw.h"
#include "kernels/quant.h"
#include "util/threadpool.h"

typedef struct job {
    uint32_t type;
    int64_t n_in, n_out;
    int n_mat, n_rows;
    const uint8_t *w;
    size_t mat_bytes;
    const void *act;
    float *y;
    kvt_packed **P; /* per matrix (interleaved layout), or NULL (rows) */
} job;

static void run(void *arg, int ith, int nth) {
    job *j = arg;
    int64_t per = (j->n_out + nth - 1) / nth;
    per = (per + 15) & ~(int64_t)15;
    int64_t o0 = ith * per, o1 = o0 + per;
    if (o1 > j->n_out) o1 = j->n_out;
    if (o0 >= o1) return;
    for (int m = 0; m < j->n_mat; m++)
        if (j->P)
            kvt_matmul_packed(j->P[m], j->act, j->n_rows, j->y + (size_t)m * j->n_out * j->n_rows, j->n_out, o0, o1);
        else
            kvt_matmul_rows(j->type, j->w + (size_t)m * j->mat_bytes, j->n_in, j->act, j->n_rows,
                            j->y + (size_t)m * j->n_out * j->n_rows, j->n_out, o0, o1);
}

/* process CPU time (all threads), ms: on a machine shared with other work, bytes per CPU-second
 * is far less noisy than wall time (descheduled time does not count) */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint32_t type_of(const char *s) {
    if (!strcmp(s, "q4_k")) return KVT_TYPE_Q4_K;
    if (!strcmp(s, "q5_k")) return KVT_TYPE_Q5_K;
    if (!strcmp(s, "q6_k")) return KVT_TYPE_Q6_K;
    if (!strcmp(s, "q8_0")) return KVT_TYPE_Q8_0;
    if (!strcmp(s, "q4_0")) return KVT_TYPE_Q4_0;
    if (!strcmp(s, "q5_0")) return KVT_TYPE_Q5_0;
    if (!strcmp(s, "q4_1")) return KVT_TYPE_Q4_1;
    if (!strcmp(s, "q5_1")) return KVT_TYPE_Q5_1;
    if (!strcmp(s, "f16")) return KVT_TYPE_F16;
    if (!strcmp(s, "bf16")) return KVT_TYPE_BF16;
    if (!strcmp(s, "bf16x")) return KVT_TYPE_BF16X;
    if (!strcmp(s, "f16x")) return KVT_TYPE_F16X;
    return UINT32_MAX;
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 1;
    const char *types = argc > 2 ? argv[2] : "q4_k q5_k q6_k q8_0 q4_0 f16 bf16x";
    const long mib = argc > 3 ? atol(argv[3]) : 256;
    const int passes = argc > 4 ? atoi(argv[4]) : 15;
    kvt_kernels_init();
    kvt_threadpool *tp = kvt_threadpool_create(nth);
    const int64_t n_in = getenv("GEMV_NIN") ? atoll(getenv("GEMV_NIN")) : 2048,
                  n_out = getenv("GEMV_NOUT") ? atoll(getenv("GEMV_NOUT")) : 8192;
    const int n_rows = getenv("GEMV_ROWS") ? atoi(getenv("GEMV_ROWS")) : 1;
    if (n_rows < 1 || n_rows > 64) {
        fprintf(stderr, "GEMV_ROWS: 1..64\n");
        return 2;
    }
    float *src = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_in * n_rows);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n_in * n_out; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        src[i] = kvt_bf16_to_f32((uint16_t)(kvt_f32_to_bf16((float)((int64_t)(s % 2001) - 1000) / 1000.0f)));
    }
    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (float)((int64_t)(i * 7919 % 201) - 100) / 100.0f;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", types);
    printf("| type | layout | threads | GB/s weights (median) | best | read bandwidth GB/s | fraction | GB/s per CPU-s x threads (median) |\n|---|---|---|---|---|---|---|---|\n");
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        const uint32_t t = type_of(tok);
        if (t == UINT32_MAX) continue;
        uint8_t *one = NULL;
        size_t mb = 0;
        uint32_t wt = t;
        if (t == KVT_TYPE_BF16X || t == KVT_TYPE_F16X) {
            uint16_t *h = malloc(2 * (size_t)n_in * n_out);
            kvt_quantize_ref(KVT_TYPE_F16, src, h, n_in * n_out);
            one = t == KVT_TYPE_F16X ? kvt_f16x_pack(KVT_TYPE_F16, h, n_in, n_out, &mb) : kvt_bf16x_pack(KVT_TYPE_F16, h, n_in, n_out, false, &mb);
            free(h);
            if (!one) continue;
        } else {
            mb = (size_t)kvt_type_row_bytes(t, (uint64_t)n_in) * n_out;
            one = malloc(mb);
            for (int64_t r = 0; r < n_out; r++)
                kvt_quantize_ref(t, src + r * n_in, one + (size_t)r * (mb / n_out), n_in);
        }
        const int n_mat = (int)(((size_t)mib << 20) / mb) + 1;
        uint8_t *w = NULL;
        if (posix_memalign((void **)&w, 1 << 21, (size_t)n_mat * mb)) return 1;
        /* GEMV_HUGE=1: transparent huge pages for the weights (as the packed copies get); default 4 KiB
         * pages, like the GGUF file mapping single-row decode reads */
        const char *hp = getenv("GEMV_HUGE");
        if (hp && !strcmp(hp, "1")) madvise(w, (size_t)n_mat * mb, MADV_HUGEPAGE);
        for (int m = 0; m < n_mat; m++) memcpy(w + (size_t)m * mb, one, mb);
        free(one);
        void *act = malloc(kvt_act_bytes(wt, n_in, n_rows));
        kvt_act_quantize(wt, x, n_in, 0, n_rows, act);
        float *y = malloc(sizeof(float) * n_out * n_mat * n_rows);
        /* the packed copies (the GEMV copy with the GEMM copies kvt_packed_create makes beside it) */
        kvt_packed **P = t == KVT_TYPE_BF16X || t == KVT_TYPE_F16X ? NULL : calloc((size_t)n_mat, sizeof *P);
        for (int m = 0; P && m < n_mat; m++)
            if (!(P[m] = kvt_packed_create(wt, w + (size_t)m * mb, n_in, n_out))) {
                for (int k = 0; k <= m; k++) kvt_packed_free(P[k]);
                free(P);
                P = NULL;
            }
        for (int layout = 0; layout < (P ? 2 : 1); layout++) {
            job j = {wt, n_in, n_out, n_mat, n_rows, w, mb, act, y, layout ? P : NULL};
            double *gbs = malloc(sizeof(double) * passes), *cgbs = malloc(sizeof(double) * passes);
            kvt_threadpool_run(tp, run, &j); /* warm-up (page faults) */
            for (int p = 0; p < passes; p++) {
                const double t0 = kvt_now_ms(), c0 = cpu_ms();
                kvt_threadpool_run(tp, run, &j);
                gbs[p] = (double)n_mat * mb / ((kvt_now_ms() - t0) * 1e6);
                cgbs[p] = (double)n_mat * mb * nth / ((cpu_ms() - c0) * 1e6);
            }
            qsort(gbs, passes, sizeof(double), cmp_d);
            qsort(cgbs, passes, sizeof(double), cmp_d);
            kvt_membw_result r;
            char err[128];
            double bw = kvt_membw_measure(nth, 512, 5, &r, err, sizeof err) == KVT_OK ? r.read_gbs : 0;
            const char *lname = !layout ? "rows" : kvt_packed_gemv_layout(P[0]) ? kvt_packed_gemv_layout(P[0]) : "packed";
            printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", tok, lname, nth,
                   gbs[passes / 2], gbs[passes - 1], bw, bw > 0 ? gbs[passes / 2] / bw : 0, cgbs[passes / 2]);
            fflush(stdout);
            free(gbs);
            free(cgbs);
        }
        for (int m = 0; P && m < n_mat; m++) kvt_packed_free(P[m]);
        free(P);
        free(y);
        free(act);
        free(w);
    }
    free(src);
    free(x);
    kvt_threadpool_free(tp);
    return 0;
}
