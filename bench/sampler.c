// bench/sampler.c — the cost of one sampled draw (kvt_sampler_sample; with --logprobs also the
// log-softmax facts kvt_sampler_sample_lp adds) over a vocabulary of real size, on the calling
// thread (the engine's token loop draws each row's token there, docs/server.md "Sampling").
// Built on demand: `make build/bench/sampler`, then
//   build/bench/sampler [VOCAB=151936] [REPS=200]
// Logits: a normal bulk of standard deviation SD plus 20 leading tokens at TOP, TOP-0.3, ...; for
// each (SD, TOP) row and each setting (temperature, top-k, top-p) it prints the minimum and median
// ms of REPS draws (the logits copied back before each, outside the timing).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "engine/sampler.h"
#include "kernels/quant.h"

int main(int argc, char **argv) {
    const uint32_t nv = argc > 1 ? (uint32_t)atol(argv[1]) : 151936;
    const int reps = argc > 2 ? atoi(argv[2]) : 200;
    if (nv < 64 || reps < 1) {
        fprintf(stderr, "usage: %s [VOCAB >= 64] [REPS >= 1]\n", argv[0]);
        return 2;
    }
    kvt_kernels_init();
    float *l0 = malloc(sizeof(float) * nv), *l = malloc(sizeof(float) * nv);
    double *t = malloc(sizeof(double) * (size_t)reps);
    kvt_sampler *s = kvt_sampler_create(nv);
    if (!l0 || !l || !t || !s) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    const struct { float sd, top; } dist[] = {{1.0f, 5.0f}, {2.0f, 20.0f}, {3.0f, 12.0f}};
    const struct { float temp; int top_k; float top_p; int n_lp; } set[] = {
        {1.0f, 0, 1.0f, 0}, {1.0f, 0, 1.0f, 5}, {0.7f, 0, 0.95f, 0}, {0.7f, 40, 0.95f, 0}, {1.0f, 0, 0.9f, 0}};
    printf("vocab %u, %d draws each: min / median ms\n", nv, reps);
    printf("%-14s %-26s %10s %10s\n", "logits", "settings", "min", "median");
    for (size_t d = 0; d < sizeof dist / sizeof dist[0]; d++) {
        uint64_t x = 1;
        for (uint32_t i = 0; i < nv; i++) { /* Box-Muller from a fixed LCG */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const double u1 = ((double)(x >> 11) + 1.0) / 9007199254740993.0;
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const double u2 = (double)(x >> 11) / 9007199254740992.0;
            l0[i] = (float)(dist[d].sd * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
        for (int h = 0; h < 20; h++) l0[(uint32_t)(h * 7919) % nv] = dist[d].top - 0.3f * (float)h;
        for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
            kvt_sampling p;
            kvt_sampling_default(&p);
            p.temperature = set[k].temp, p.top_k = set[k].top_k, p.top_p = set[k].top_p, p.seed = 1;
            kvt_sampler_reset(s, &p);
            kvt_token_logprobs lp;
            for (int r = 0; r < reps; r++) {
                memcpy(l, l0, sizeof(float) * nv);
                const double t0 = now_ms();
                if (set[k].n_lp) kvt_sampler_sample_lp(s, l, (uint32_t)set[k].n_lp, &lp);
                else kvt_sampler_sample(s, l);
                t[r] = now_ms() - t0;
            }
            qsort(t, (size_t)reps, sizeof(double), cmp_d);
            char dn[32], sn[64];
            snprintf(dn, sizeof dn, "sd %.0f top %.0f", dist[d].sd, dist[d].top);
            snprintf(sn, sizeof sn, "T %.1f k %d p %.2f%s", set[k].temp, set[k].top_k, set[k].top_p,
                     set[k].n_lp ? " +logprobs 5" : "");
            printf("%-14s %-26s %10.3f %10.3f\n", dn, sn, t[0], t[reps / 2]);
        }
    }
    kvt_sampler_free(s);
    free(t), free(l), free(l0);
    return 0;
}
