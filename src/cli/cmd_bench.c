/* cmd_bench.c — `kvtier bench`: the measurement modes behind bench/run-all and docs/benchmarks.md.
 *
 *   (default)        throughput: prefill pp and decode tg, median of -r runs, like llama-bench;
 *   --cache          TTFT cold vs exact repeat vs shared prefix + new suffix (RAM tier), side by side;
 *   --decode-at N    prefill N tokens once, then decode -n tokens -r times at that depth (exact-repeat
 *                    prompts reuse the prefix from the RAM tier; with --prompt-cache 0 or --cold every
 *                    repetition is a fresh cold prefill) + KV bytes/token from the layout and the pool;
 *   --agreement N    top-1 agreement of the configured KV codec (or kv8 and kv4) vs f16 KV over N
 *                    greedy tokens, teacher-forced through the engine with the prompt cache on;
 *   --once           one cached request (for multi-process SSD runs), then flush the SSD tier;
 *   --turns K        a K-turn conversation (each turn = previous prompt + answer + --suffix new
 *                    tokens), then flush; reports reuse per turn and the sum of prompt tokens.
 *
 * Prompts are seeded random token ids (no tokenizer involved), so runs are reproducible. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"
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
           "      --decode-at N   prefill N tokens, then decode -n tokens -r times at that depth\n"
           "      --cold          with --decode-at: a fresh cold prefill for every repetition\n"
           "      --agreement N   top-1 agreement vs f16 KV over N greedy tokens (teacher-forced)\n"
           "      --once          one cached request of -p tokens (--prompt-seed), then flush the SSD tier\n"
           "      --turns K       K-turn conversation: -p first prompt, -n answer, --suffix new tokens a turn\n"
           "      --restart-after K  with --turns: flush, close and reopen the engine after turn K\n"
           "      --prompt-seed S seed of the random prompt (default 1)\n"
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

/* ---- shared helpers for the extra modes -------------------------------------------------------- */

static void json_str(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static const char *tier_name(kvt_tier t) { return t == KVT_TIER_RAM ? "ram" : t == KVT_TIER_SSD ? "ssd" : "none"; }

/* Steady-state KV bytes per token of the layout the engine builds for these options, computed from
 * the model's layer descriptions (the weights are mmapped, so loading a second kvt_model is cheap).
 * force_full turns every sliding-window layer into a full-attention one: the "same model with a
 * full cache" figure. --kv-quant config is not resolved here (returns 0). */
static double layout_bytes_per_token(const kvt_engine_opts *o, bool force_full, uint32_t *n_window_layers) {
    char err[256];
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    kvt_kv_layout *l = NULL;
    double bpt = 0;
    if (n_window_layers) *n_window_layers = 0;
    const char *q = o->kv_quant ? o->kv_quant : "off";
    if (!strcmp(q, "config")) return 0;
    if (kvt_gguf_open(o->model_path, &g, err, sizeof err) != KVT_OK) return 0;
    if (kvt_model_load(g, &m, err, sizeof err) != KVT_OK) goto out;
    const kvt_hparams *hp = kvt_model_hparams(m);
    kvt_codec base = {.kind = o->kv_bf16 ? KVT_CODEC_BF16 : KVT_CODEC_F16};
    kvt_codec *codecs = calloc(hp->n_layer, sizeof *codecs);
    kvt_layer_desc *descs = calloc(hp->n_layer, sizeof *descs);
    if (codecs && descs) {
        kvt_codec c = base;
        if (!strcmp(q, "8") || !strcmp(q, "4"))
            c = (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)atoi(q), .group_size = (uint16_t)(o->kv_quant_group ? o->kv_quant_group : 64)};
        for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = c;
        kvt_model_layer_descs(m, codecs, descs);
        for (uint32_t i = 0; i < hp->n_layer; i++) {
            if (descs[i].kind != KVT_KIND_WINDOW) continue;
            if (n_window_layers) (*n_window_layers)++;
            if (force_full) {
                descs[i].kind = KVT_KIND_FULL;
                descs[i].window = 0;
            }
        }
        if (kvt_kv_layout_create(descs, hp->n_layer, o->block_tokens ? o->block_tokens : 256, base, 0, &l, err, sizeof err) == KVT_OK)
            bpt = kvt_kv_layout_bytes_per_token(l);
    }
    free(codecs);
    free(descs);
out:
    kvt_kv_layout_free(l);
    kvt_model_free(m);
    kvt_gguf_free(g);
    return bpt;
}

static kvt_engine *open_engine(const kvt_engine_opts *o) {
    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(o, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return NULL;
    }
    return e;
}

/* ---- --decode-at: decode speed and KV footprint at a given depth -------------------------------- */

static int bench_decode_at(const kvt_engine_opts *o_in, uint32_t depth, uint32_t n_g, uint32_t reps, bool cold, bool json) {
    kvt_engine_opts o = *o_in;
    if (n_g < 2) n_g = 2;
    if (!o.n_ctx) o.n_ctx = depth + n_g + 16;
    kvt_engine *e = open_engine(&o);
    if (!e) return 1;
    const bool cache_on = o.prompt_cache_gb > 0;
    const uint32_t nv = kvt_engine_n_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * depth);
    double *dec = calloc(reps, sizeof(double));
    int rc = 0;
    char err[512] = "";
    double prefill_tps = 0, ttft0 = 0, dec0 = 0;
    uint64_t peak0 = 0;
    uint32_t reused_last = 0;
    if (!ids || !dec) {
        rc = 1;
        goto out;
    }
    fill_prompt(ids, depth, nv, 1);
    for (uint32_t r = 0; r < reps; r++) {
        if (r > 0 && (cold || !cache_on)) fill_prompt(ids, depth, nv, r + 1);
        kvt_gen_request req = {.prompt = ids, .n_prompt = depth, .max_tokens = n_g, .ignore_eog = true, .no_cache = !cache_on};
        kvt_sampling_default(&req.sampling);
        kvt_gen_result res;
        if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier bench: %s\n", err);
            rc = 1;
            goto out;
        }
        dec[r] = res.decode_tps;
        reused_last = res.n_reused;
        if (r == 0) {
            prefill_tps = res.prefill_tps;
            ttft0 = res.ttft_ms;
            dec0 = res.decode_tps;
            peak0 = res.peak_kv_bytes;
        }
        free(res.tokens);
    }
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    uint32_t n_win = 0;
    const double bpt = layout_bytes_per_token(&o, false, &n_win);
    const double bpt_full = n_win ? layout_bytes_per_token(&o, true, NULL) : bpt;
    const double toks = (double)depth + n_g - 1; /* the last sampled token is never forwarded */
    const double dmed = median(dec, reps);
    if (json) {
        printf("{\"mode\":\"decode_at\",\"model\":");
        json_str(kvt_engine_model_name(e));
        printf(",\"kv\":");
        json_str(st.scheme);
        printf(",\"threads\":%d,\"depth\":%u,\"n_gen\":%u,\"reps\":%u,\"cold_reps\":%s,\"prompt_cache\":%s,"
               "\"prefill_tps\":%.2f,\"ttft_cold_ms\":%.1f,\"decode_tps_first\":%.3f,\"decode_tps\":%.3f,"
               "\"reused_last\":%u,\"kv_bytes_per_token_layout\":%.1f,\"peak_kv_bytes\":%llu,"
               "\"kv_bytes_per_token_measured\":%.1f,\"window_layers\":%u,\"kv_bytes_per_token_full_attention\":%.1f,"
               "\"full_cache_bytes_computed\":%.0f,\"pool_peak_bytes\":%llu,\"ssd_bytes\":%llu}\n",
               o.n_threads, depth, n_g, reps, cold ? "true" : "false", cache_on ? "true" : "false", prefill_tps, ttft0,
               dec0, dmed, reused_last, bpt, (unsigned long long)peak0, peak0 / toks, n_win, bpt_full, bpt_full * toks,
               (unsigned long long)st.pool_peak_bytes, (unsigned long long)st.ssd_bytes);
    } else {
        printf("decode at depth %u (%s, %d threads): prefill %.1f t/s, decode %.2f t/s (median of %u; first %.2f)\n", depth,
               st.scheme, o.n_threads, prefill_tps, dmed, reps, dec0);
        printf("KV: %.1f bytes/token (layout), peak pool %.2f MiB = %.1f bytes/token measured", bpt, peak0 / 1048576.0, peak0 / toks);
        if (n_win)
            printf("; %u sliding-window layers: a full cache would be %.1f bytes/token = %.2f MiB (computed)", n_win, bpt_full,
                   bpt_full * toks / 1048576.0);
        printf("\n");
    }
out:
    free(ids);
    free(dec);
    kvt_engine_free(e);
    return rc;
}

/* ---- --agreement: top-1 agreement of quantized KV vs f16 KV ------------------------------------- */

static int bench_agreement(const kvt_engine_opts *o_in, uint32_t n, uint32_t plen, uint64_t seed, bool json) {
    kvt_engine_opts o = *o_in;
    if (!o.n_ctx) o.n_ctx = plen + n + 16;
    const char *q = o.kv_quant ? o.kv_quant : "off";
    const char *list2[2] = {"8", "4"};
    const char *list1[1] = {q};
    const char *const *list = strcmp(q, "off") ? list1 : list2;
    const uint32_t n_list = strcmp(q, "off") ? 1 : 2;
    char err[512] = "";
    int rc = 0;
    int32_t *buf = malloc(sizeof(int32_t) * (plen + n));
    if (!buf) return 1;
    /* reference: free-running greedy decode with f16 KV */
    kvt_engine_opts ro = o;
    ro.kv_quant = "off";
    kvt_engine *e = open_engine(&ro);
    if (!e) {
        free(buf);
        return 1;
    }
    fill_prompt(buf, plen, kvt_engine_n_vocab(e), seed);
    kvt_gen_request req = {.prompt = buf, .n_prompt = plen, .max_tokens = n, .ignore_eog = true, .no_cache = true};
    kvt_sampling_default(&req.sampling);
    kvt_gen_result res;
    double t0 = kvt_now_ms();
    if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK || res.n_gen != n) {
        fprintf(stderr, "kvtier bench: reference run: %s (generated %u of %u)\n", err, res.n_gen, n);
        free(res.tokens);
        kvt_engine_free(e);
        free(buf);
        return 1;
    }
    memcpy(buf + plen, res.tokens, sizeof(int32_t) * n);
    free(res.tokens);
    const double ref_s = (kvt_now_ms() - t0) / 1000.0;
    char ref_scheme[128];
    snprintf(ref_scheme, sizeof ref_scheme, "%s", kvt_engine_scheme_key(e));
    kvt_engine_free(e);
    if (json) printf("{\"mode\":\"agreement\",\"n\":%u,\"prompt\":%u,\"reference\":\"%s\",\"reference_s\":%.1f,\"results\":[", n, plen, ref_scheme, ref_s);
    else printf("top-1 agreement vs %s over %u greedy tokens (teacher-forced, prompt %u random tokens)\n", ref_scheme, n, plen);
    for (uint32_t k = 0; k < n_list && rc == 0; k++) {
        kvt_engine_opts to = o;
        to.kv_quant = list[k];
        if (to.prompt_cache_gb <= 0) to.prompt_cache_gb = 1;
        e = open_engine(&to);
        if (!e) {
            rc = 1;
            break;
        }
        uint32_t match = 0, first_miss = UINT32_MAX;
        uint64_t reused = 0;
        t0 = kvt_now_ms();
        for (uint32_t i = 0; i < n; i++) {
            /* prompt = prefix + the f16 tokens before i; the cache holds the previous step's prefix */
            kvt_gen_request rq = {.prompt = buf, .n_prompt = plen + i, .max_tokens = 1, .ignore_eog = true};
            kvt_sampling_default(&rq.sampling);
            kvt_gen_result rr;
            if (kvt_engine_generate(e, &rq, &rr, err, sizeof err) != KVT_OK || rr.n_gen != 1) {
                fprintf(stderr, "kvtier bench: agreement step %u: %s\n", i, err);
                free(rr.tokens);
                rc = 1;
                break;
            }
            if (rr.tokens[0] == buf[plen + i]) match++;
            else if (first_miss == UINT32_MAX) first_miss = i;
            reused += rr.n_reused;
            free(rr.tokens);
        }
        const double secs = (kvt_now_ms() - t0) / 1000.0;
        const double avg_new = n ? ((double)n * plen + (double)n * (n - 1) / 2 - (double)reused) / n : 0;
        if (rc == 0) {
            if (json) {
                printf("%s{\"kv_quant\":\"%s\",\"scheme\":", k ? "," : "", list[k]);
                json_str(kvt_engine_scheme_key(e));
                printf(",\"match\":%u,\"rate\":%.4f,\"first_mismatch\":%d,\"avg_recomputed_tokens\":%.2f,\"seconds\":%.1f}", match,
                       (double)match / n, first_miss == UINT32_MAX ? -1 : (int)first_miss, avg_new, secs);
            } else {
                printf("  %-24s %u/%u = %.1f%% (first mismatch at %d; %.2f tokens recomputed per step; %.1f s)\n",
                       kvt_engine_scheme_key(e), match, n, 100.0 * match / n, first_miss == UINT32_MAX ? -1 : (int)first_miss,
                       avg_new, secs);
            }
        }
        kvt_engine_free(e);
    }
    if (json) printf("]}\n");
    free(buf);
    return rc;
}

/* ---- --once / --turns: requests for multi-process SSD-tier runs -------------------------------- */

static void print_flush(kvt_engine *e, const kvt_engine_opts *o, double create_ms, bool json) {
    kvt_flush_result fr;
    double f0 = kvt_now_ms();
    kvt_engine_flush(e, 120000, &fr);
    double flush_ms = kvt_now_ms() - f0;
    kvt_engine_stats st;
    kvt_engine_stats_get(e, &st);
    if (json)
        printf(",\"create_ms\":%.1f,\"flush_ms\":%.1f,\"durable\":%s,\"ssd_entries\":%llu,\"ssd_bytes\":%llu,\"ssd_dropped\":%llu,"
               "\"ssd_failed\":%llu,\"kv_bytes_per_token_layout\":%.1f,\"pool_peak_bytes\":%llu}\n",
               create_ms, flush_ms, fr.durable ? "true" : "false", (unsigned long long)st.ssd_entries,
               (unsigned long long)st.ssd_bytes, (unsigned long long)st.ssd_dropped, (unsigned long long)st.ssd_failed,
               layout_bytes_per_token(o, false, NULL), (unsigned long long)st.pool_peak_bytes);
    else
        printf("engine create %.1f ms; flush %.1f ms (durable %s); SSD %llu entries, %.2f MiB\n", create_ms, flush_ms,
               fr.durable ? "yes" : "no", (unsigned long long)st.ssd_entries, st.ssd_bytes / 1048576.0);
}

static int bench_once(const kvt_engine_opts *o_in, uint32_t n_p, uint32_t n_g, uint64_t seed, bool json) {
    kvt_engine_opts o = *o_in;
    if (n_g < 1) n_g = 1;
    if (!o.n_ctx) o.n_ctx = n_p + n_g + 16;
    double c0 = kvt_now_ms();
    kvt_engine *e = open_engine(&o);
    if (!e) return 1;
    double create_ms = kvt_now_ms() - c0;
    int32_t *ids = malloc(sizeof(int32_t) * n_p);
    if (!ids) {
        kvt_engine_free(e);
        return 1;
    }
    fill_prompt(ids, n_p, kvt_engine_n_vocab(e), seed);
    kvt_gen_request req = {.prompt = ids, .n_prompt = n_p, .max_tokens = n_g, .ignore_eog = true};
    kvt_sampling_default(&req.sampling);
    kvt_gen_result res;
    char err[512] = "";
    int rc = 0;
    if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        rc = 1;
    } else {
        const double bpt = layout_bytes_per_token(&o, false, NULL);
        const double mb = res.n_reused * bpt / 1e6;
        if (json)
            printf("{\"mode\":\"once\",\"n_prompt\":%u,\"n_gen\":%u,\"ttft_ms\":%.2f,\"n_reused\":%u,\"reused_from\":\"%s\","
                   "\"restore_ms\":%.2f,\"restored_mb\":%.2f,\"restore_mb_s\":%.1f,\"prefill_ms\":%.1f,\"decode_tps\":%.2f",
                   n_p, res.n_gen, res.ttft_ms, res.n_reused, tier_name(res.reused_from), res.restore_ms, mb,
                   res.restore_ms > 0 ? mb / (res.restore_ms / 1000.0) : 0, res.prefill_ms, res.decode_tps);
        else
            printf("TTFT %.1f ms (%u of %u prompt tokens reused from %s; restore %.1f ms = %.1f MB)\n", res.ttft_ms, res.n_reused,
                   n_p, tier_name(res.reused_from), res.restore_ms, mb);
        free(res.tokens);
        print_flush(e, &o, create_ms, json);
    }
    free(ids);
    kvt_engine_free(e);
    return rc;
}

static int bench_turns(const kvt_engine_opts *o_in, uint32_t turns, uint32_t n_p, uint32_t n_g, uint32_t suffix, uint64_t seed,
                       uint32_t restart_after, bool json) {
    kvt_engine_opts o = *o_in;
    if (n_g < 1) n_g = 1;
    const uint32_t cap = n_p + turns * (n_g + suffix) + 16;
    if (!o.n_ctx) o.n_ctx = cap;
    double c0 = kvt_now_ms();
    kvt_engine *e = open_engine(&o);
    if (!e) return 1;
    double create_ms = kvt_now_ms() - c0;
    const uint32_t nv = kvt_engine_n_vocab(e);
    int32_t *buf = malloc(sizeof(int32_t) * cap);
    if (!buf) {
        kvt_engine_free(e);
        return 1;
    }
    uint32_t len = n_p;
    fill_prompt(buf, len, nv, seed);
    uint64_t sum_prompt = 0, sum_reused = 0;
    double sum_ttft = 0, dec_sum = 0;
    char err[512] = "";
    int rc = 0;
    if (json) printf("{\"mode\":\"turns\",\"turns\":[");
    double cold_ms_per_tok = 0; /* turn 1 is cold: its TTFT per prompt token estimates later cold turns */
    for (uint32_t k = 0; k < turns; k++) {
        if (restart_after && k == restart_after) { /* a process restart: flush, close, reopen (SSD tier) */
            kvt_flush_result fr;
            kvt_engine_flush(e, 600000, &fr);
            kvt_engine_free(e);
            if (!(e = open_engine(&o))) {
                free(buf);
                return 1;
            }
            if (!json) printf("-- restart (flushed %llu entries, durable %d) --\n", (unsigned long long)fr.entries, fr.durable);
        }
        kvt_gen_request req = {.prompt = buf, .n_prompt = len, .max_tokens = n_g, .ignore_eog = true};
        kvt_sampling_default(&req.sampling);
        kvt_gen_result res;
        if (kvt_engine_generate(e, &req, &res, err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier bench: turn %u: %s\n", k, err);
            rc = 1;
            break;
        }
        sum_prompt += len;
        sum_reused += res.n_reused;
        sum_ttft += res.ttft_ms;
        dec_sum += res.decode_tps;
        if (json) printf("%s{\"n_prompt\":%u,\"n_reused\":%u,\"from\":\"%s\",\"ttft_ms\":%.1f}", k ? "," : "", len, res.n_reused,
                         tier_name(res.reused_from), res.ttft_ms);
        else {
            if (k == 0) cold_ms_per_tok = res.ttft_ms / len;
            printf("turn %u: prompt %u, reused %u (%s), TTFT %.1f ms (cold estimate %.0f ms, %.1fx)\n", k + 1, len,
                   res.n_reused, tier_name(res.reused_from), res.ttft_ms, cold_ms_per_tok * len,
                   res.ttft_ms > 0 ? cold_ms_per_tok * len / res.ttft_ms : 0.0);
        }
        for (uint32_t i = 0; i < res.n_gen && len < cap; i++) buf[len++] = res.tokens[i];
        free(res.tokens);
        uint32_t add = KVT_MIN(suffix, cap - len);
        fill_prompt(buf + len, add, nv, seed * 1000 + k + 7);
        len += add;
    }
    if (rc == 0) {
        const double bpt = layout_bytes_per_token(&o, false, NULL);
        if (json)
            printf("],\"sum_prompt_tokens\":%llu,\"sum_reused_tokens\":%llu,\"sum_prompt_kv_bytes\":%.0f,\"final_tokens\":%u,"
                   "\"mean_decode_tps\":%.2f,\"mean_ttft_ms\":%.1f",
                   (unsigned long long)sum_prompt, (unsigned long long)sum_reused, sum_prompt * bpt, len, dec_sum / turns,
                   sum_ttft / turns);
        else
            printf("sum of prompt tokens %llu (%.2f MiB of KV at %.1f bytes/token)\n", (unsigned long long)sum_prompt,
                   sum_prompt * bpt / 1048576.0, bpt);
        print_flush(e, &o, create_ms, json);
    } else if (json) {
        printf("]}\n");
    }
    free(buf);
    kvt_engine_free(e);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    uint32_t n_p = 512, n_g = 128, reps = 3, suffix = 100;
    bool json = false, cache = false, cold = false, once = false;
    uint32_t decode_at = 0, agreement = 0, turns = 0, restart_after = 0;
    uint64_t pseed = 1;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "bench", usage);
    while (kvt_args_next(&a)) {
        if (kvt_parse_engine_flag(&a, &eo)) continue;
        if (kvt_args_is(&a, "-p", "--n-prompt")) n_p = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_is(&a, "-n", "--n-gen")) n_g = kvt_args_u32(&a, 0, 1u << 20);
        else if (kvt_args_is(&a, "-r", "--repetitions")) reps = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--suffix")) suffix = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_flag(&a, NULL, "--cache")) cache = true;
        else if (kvt_args_is(&a, NULL, "--decode-at")) decode_at = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_flag(&a, NULL, "--cold")) cold = true;
        else if (kvt_args_is(&a, NULL, "--agreement")) agreement = kvt_args_u32(&a, 1, 1u << 16);
        else if (kvt_args_flag(&a, NULL, "--once")) once = true;
        else if (kvt_args_is(&a, NULL, "--turns")) turns = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--restart-after")) restart_after = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--prompt-seed")) pseed = (uint64_t)kvt_args_i64(&a, 0, INT64_MAX);
        else if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (!kvt_engine_flags_check("bench", &eo)) return 2;
    if ((cache ? 1 : 0) + (decode_at ? 1 : 0) + (agreement ? 1 : 0) + (once ? 1 : 0) + (turns ? 1 : 0) > 1) {
        fprintf(stderr, "kvtier bench: --cache, --decode-at, --agreement, --once and --turns are exclusive\n");
        return 2;
    }
    if (agreement) return bench_agreement(&eo, agreement, n_p == 512 ? 32 : n_p, pseed, json);
    if (decode_at) return bench_decode_at(&eo, decode_at, n_g, reps, cold, json);
    if (once) return bench_once(&eo, n_p, n_g, pseed, json);
    if (turns) return bench_turns(&eo, turns, n_p, n_g, suffix, pseed, restart_after, json);
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
