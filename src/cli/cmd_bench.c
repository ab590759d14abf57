/* cmd_bench.c — `kvtier bench`: throughput (prefill pp and decode tg, median of -r runs, like
 * llama-bench) and, with --cache, time to first token cold vs exact repeat vs shared prefix + new
 * suffix (RAM tier) measured side by side in one process. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "engine_flags.h"

static void usage(void) {
    printf("usage: kvtier bench -m MODEL [-p 512] [-n 128] [-r 3] [--cache] [--json] [options]\n\n"
           "Throughput: prefill of -p random tokens and decode of -n tokens, -r repetitions, median\n"
           "reported (no cache reuse). With --cache: TTFT for a -p token prompt cold, exact repeat, and\n"
           "shared prefix (p - suffix) + --suffix new tokens, each -r times.\n\n"
           "  -p N          prompt tokens (default 512)\n"
           "  -n N          generated tokens (default 128)\n"
           "  -r N          repetitions (default 3)\n"
           "      --cache   measure cache reuse TTFT instead of throughput\n"
           "      --suffix N new tokens after the shared prefix in --cache mode (default 100)\n"
           "      --json    machine-readable output\n\n%s",
           kvt_engine_flags_help);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, uint32_t n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill_prompt(int32_t *ids, uint32_t n, uint32_t n_vocab, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
    for (uint32_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        /* stay clear of the low ids (often control tokens) */
        ids[i] = (int32_t)(256 + s % (n_vocab > 512 ? n_vocab - 512 : 1));
        if ((uint32_t)ids[i] >= n_vocab) ids[i] = (int32_t)(s % n_vocab);
    }
}

int cmd_bench(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    uint32_t n_p = 512, n_g = 128, reps = 3, suffix = 100;
    bool json = false, cache = false;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "bench", usage);
    while (kvt_args_next(&a)) {
        if (kvt_parse_engine_flag(&a, &eo)) continue;
        if (kvt_args_is(&a, "-p", "--n-prompt")) n_p = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_is(&a, "-n", "--n-gen")) n_g = kvt_args_u32(&a, 0, 1u << 20);
        else if (kvt_args_is(&a, "-r", "--repetitions")) reps = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--suffix")) suffix = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_flag(&a, NULL, "--cache")) cache = true;
        else if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (!kvt_engine_flags_check("bench", &eo)) return 2;
    if (!eo.n_ctx) eo.n_ctx = n_p + n_g + suffix + 16;
    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(&eo, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return 1;
    }
    uint32_t nv = kvt_engine_n_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * (n_p + suffix + 1));
    double *pp = calloc(reps, sizeof(double)), *tg = calloc(reps, sizeof(double)), *t3 = calloc(reps, sizeof(double));
    int rc = 0;
    if (!ids || !pp || !tg || !t3) {
        fprintf(stderr, "kvtier bench: out of memory\n");
        rc = 1;
        goto out;
    }
    if (!cache) {
        for (uint32_t r = 0; r < reps; r++) {
            fill_prompt(ids, n_p, nv, r + 1);
            kvt_gen_request req = {.prompt = ids, .n_prompt = n_p, .max_tokens = n_g + 1, .ignore_eog = true, .no_cache = true};
            kvt_sampling_default(&req.sampling);
            kvt_gen_result res;
            if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) {
                fprintf(stderr, "kvtier bench: %s\n", err);
                rc = 1;
                goto out;
            }
            pp[r] = res.prefill_tps;
            tg[r] = res.decode_tps;
            free(res.tokens);
        }
        double mpp = median(pp, reps), mtg = median(tg, reps);
        kvt_engine_stats st;
        kvt_engine_stats_get(e, &st);
        if (json) {
            printf("{\"model\":\"%s\",\"threads\":%d,\"kv\":\"%s\",\"n_prompt\":%u,\"n_gen\":%u,\"reps\":%u,"
                   "\"prefill_tps\":%.2f,\"decode_tps\":%.2f}\n",
                   kvt_engine_model_name(e), eo.n_threads, st.scheme, n_p, n_g, reps, mpp, mtg);
        } else {
            printf("| model | threads | kv | test | t/s (median of %u) |\n|---|---|---|---|---|\n", reps);
            printf("| %s | %d | %s | pp%u | %.2f |\n", kvt_engine_model_name(e), eo.n_threads, st.scheme, n_p, mpp);
            printf("| %s | %d | %s | tg%u | %.2f |\n", kvt_engine_model_name(e), eo.n_threads, st.scheme, n_g, mtg);
        }
    } else {
        if (suffix >= n_p) suffix = n_p / 2;
        for (uint32_t r = 0; r < reps; r++) {
            fill_prompt(ids, n_p, nv, 1000 + r);
            kvt_gen_request req = {.prompt = ids, .n_prompt = n_p, .max_tokens = 1};
            kvt_sampling_default(&req.sampling);
            kvt_gen_result res;
            /* cold */
            if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) goto gen_fail;
            pp[r] = res.ttft_ms;
            free(res.tokens);
            /* exact repeat */
            if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) goto gen_fail;
            tg[r] = res.ttft_ms;
            free(res.tokens);
            /* shared prefix + new suffix */
            fill_prompt(ids + (n_p - suffix), suffix, nv, 5000 + r);
            if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) goto gen_fail;
            t3[r] = res.ttft_ms;
            free(res.tokens);
        }
        double c = median(pp, reps), x = median(tg, reps), s = median(t3, reps);
        if (json)
            printf("{\"model\":\"%s\",\"n_prompt\":%u,\"suffix\":%u,\"ttft_cold_ms\":%.2f,\"ttft_repeat_ms\":%.2f,"
                   "\"ttft_prefix_suffix_ms\":%.2f,\"speedup_repeat\":%.1f,\"speedup_prefix\":%.1f}\n",
                   kvt_engine_model_name(e), n_p, suffix, c, x, s, c / x, c / s);
        else
            printf("TTFT (median of %u): cold %.1f ms | exact repeat %.1f ms (%.1fx) | %u shared + %u new %.1f ms (%.1fx)\n",
                   reps, c, x, c / x, n_p - suffix, suffix, s, c / s);
    }
    goto out;
gen_fail:
    fprintf(stderr, "kvtier bench: %s\n", err);
    rc = 1;
out:
    free(ids);
    free(pp);
    free(tg);
    free(t3);
    kvt_engine_free(e);
    return rc;
}
