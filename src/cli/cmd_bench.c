/* cmd_bench.c — `kvtier bench`: the measurement modes behind bench/run-all and docs/benchmarks.md.
 *
 *   (default)        throughput: prefill pp and decode tg, median of -r runs, like llama-bench;
 *                    decode also as bytes read per token (weights + KV + recurrent state) and the
 *                    fraction of the machine's memory bandwidth they use (kernels/membw.h, measured
 *                    after every repetition with the same thread count; --membw-mib 0 skips it);
 *   --membw          the memory bandwidth alone (read and triad, -t threads, median of -r runs);
 *   --cache          TTFT cold vs exact repeat vs shared prefix + new suffix (RAM tier), side by side;
 *   --decode-at N    prefill N tokens once, then decode -n tokens -r times at that depth (exact-repeat
 *                    prompts reuse the prefix from the RAM tier; with --prompt-cache 0 or --cold every
 *                    repetition is a fresh cold prefill) + KV bytes/token from the layout and the pool;
 *   --agreement N    top-1 agreement (and KL) of the configured KV codec (or kv8 and kv4) vs f16 KV
 *                    over N greedy tokens, teacher-forced (kvt_engine_score);
 *   --kv-quality N   the same for a list of codecs (--kv-codecs; default kv8, kv4 g32/g64, turbo
 *                    k8v3/k4v4/k4v3/k4v2) plus bytes/token and decode t/s at --kv-quality-ctx;
 *                    with --kv-quality-text FILE both run on a text's tokens instead of random ones;
 *   --once           one cached request (for multi-process SSD runs), then flush the SSD tier;
 *   --turns K        a K-turn conversation (each turn = previous prompt + answer + --suffix new
 *                    tokens), then flush; reports reuse per turn and the sum of prompt tokens.
 *
 * Prompts are seeded random token ids (no tokenizer involved), so runs are reproducible. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/membw.h"
#include "../kernels/vec.h"
#include "../model/model.h"
#include "cmds.h"
#include "engine_flags.h"
#include "progress.h"

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
           "      --membw         measure the memory bandwidth (read, triad) with -t threads, median of -r runs\n"
           "      --membw-mib N   buffer size of the bandwidth measurement (default 512; 0: no bandwidth\n"
           "                      fraction beside the decode figures)\n"
           "      --agreement N   top-1 agreement and KL vs f16 KV over N greedy tokens (teacher-forced)\n"
           "      --kv-quality N  per KV codec vs f16 KV over N teacher-forced tokens (prompt of -p, default\n"
           "                      1024, random tokens): top-1 agreement, mean/p99 KL, bytes/token, decode t/s\n"
           "      --kv-quality-ctx N  depth for the decode timing (default 4096; 0 skips it): every codec and f16\n"
           "                      prefill once, then -r rounds of -n decoded tokens run side by side (median)\n"
           "      --kv-quality-text FILE  --kv-quality/--agreement on text: the prompt is the first -p tokens of\n"
           "                      FILE and every step is fed FILE's next token (agreement: top-1 equal to f16's)\n"
           "      --kv-codecs LIST    codecs for --agreement/--kv-quality, e.g. 8,4:g32,turbo,turbo:k4v2\n"
           "                      (default: the --kv-quant given, else kv8/kv4 resp. all of issue 14's set)\n"
           "      --once          one cached request of -p tokens (--prompt-seed), then flush the SSD tier\n"
           "      --turns K       K-turn conversation: -p first prompt, -n answer, --suffix new tokens a turn\n"
           "      --restart-after K  with --turns: flush, close and reopen the engine after turn K\n"
           "      --prompt-seed S seed of the random prompt (default 1)\n"
           "      --prompt-text FILE  throughput run on text: repetition r's prompt is tokens [r*p, (r+1)*p) of\n"
           "                      FILE instead of random tokens (a draft model's acceptance needs real text)\n"
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

static const char *tier_name(kvt_tier t) { return t == KVT_TIER_RAM ? "ram" : t == KVT_TIER_SSD ? "ssd" : t == KVT_TIER_SHARED ? "shared" : "none"; }

/* Steady-state KV bytes per token of the layout the engine builds for these options, computed from
 * the model's layer descriptions (the weights are mmapped, so loading a second kvt_model is cheap).
 * force_full turns every sliding-window layer into a full-attention one: the "same model with a
 * full cache" figure. state_bytes (optional): the recurrent state of one sequence (0 without
 * recurrent layers). --kv-quant config is not resolved here (returns 0). */
static double layout_bytes_per_token(const kvt_engine_opts *o, bool force_full, uint32_t *n_window_layers,
                                     double *state_bytes) {
    char err[256];
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    kvt_kv_layout *l = NULL;
    double bpt = 0;
    if (n_window_layers) *n_window_layers = 0;
    if (state_bytes) *state_bytes = 0;
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
        if (strcmp(q, "off") && kvt_engine_uniform_codec(q, o->kv_quant_group, hp->head_dim, &c, err, sizeof err) != KVT_OK)
            c = base;
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
        if (kvt_kv_layout_create(descs, hp->n_layer, o->block_tokens ? o->block_tokens : 256, base, 0, &l, err, sizeof err) ==
            KVT_OK) {
            bpt = kvt_kv_layout_bytes_per_token(l);
            if (state_bytes) *state_bytes = (double)kvt_kv_layout_state_bytes(l);
        }
    }
    free(codecs);
    free(descs);
out:
    kvt_kv_layout_free(l);
    kvt_model_free(m);
    kvt_gguf_free(g);
    return bpt;
}

/* Terminal progress for every engine a mode opens: NULL unless on a terminal without --json; set
 * once the flags are parsed (bench_cmd), freed by cmd_bench. */
static kvt_progress *g_progress;

static kvt_engine *open_engine(const kvt_engine_opts *o) {
    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(o, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return NULL;
    }
    kvt_progress_attach(g_progress, e);
    return e;
}

/* ---- decode against the memory-bandwidth limit ------------------------------------------------
 *
 * A single-row decode step reads every weight once (kvt_model_decode_bytes), the KV of every cached
 * position (layout bytes/token x depth) and the recurrent layers' state, counted whole (an upper
 * bound: a DeltaNet step reads its conv window and state matrices and on average about half of its
 * chunk buffers; the writes back are not counted); bytes/token x tok/s over the measured read bandwidth
 * is the fraction of the physical limit decode reaches. The bandwidth is measured with the same
 * thread count right after each decode repetition (so load from other processes falls on both
 * alike); the fraction is the median of the per-repetition fractions. */

static int bench_threads(const kvt_engine_opts *o) {
    int t = o->n_threads > 0 ? o->n_threads : kvt_n_cpus();
    return t < 1 ? 1 : t > 256 ? 256 : t;
}

/* Weight bytes a single-row decode step reads, from the GGUF's tensor table: every tensor once except
 * the token embedding, of which one row (a model without output.weight reads it in full as the tied
 * output). MoE experts all count (an upper bound). 0 if the file cannot be opened. */
static double decode_weight_bytes(const kvt_engine_opts *o) {
    char err[256];
    kvt_gguf *g = NULL;
    if (kvt_gguf_open(o->model_path, &g, err, sizeof err) != KVT_OK) return 0;
    double b = 0;
    for (int64_t i = 0; i < kvt_gguf_n_tensors(g); i++) b += (double)kvt_gguf_tensor_at(g, i)->nbytes;
    const kvt_gguf_tensor *emb = kvt_gguf_find_tensor(g, "token_embd.weight");
    if (emb && !kvt_gguf_find_tensor(g, "output.weight")) b += (double)emb->nbytes;
    if (emb && emb->ne[1] > 0) b -= (double)emb->nbytes - (double)emb->nbytes / (double)emb->ne[1];
    kvt_gguf_free(g);
    return b;
}

/* One read-bandwidth measurement (GB/s, median of 3 passes), 0 when disabled or failing. */
static double membw_read_gbs(int threads, uint32_t mib) {
    if (!mib) return 0;
    kvt_membw_result r;
    char err[256];
    if (kvt_membw_measure(threads, mib, 3, &r, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return 0;
    }
    return r.read_gbs;
}

static int bench_membw(const kvt_engine_opts *o, uint32_t mib, uint32_t reps, bool json) {
    kvt_membw_result r;
    char err[256];
    if (kvt_membw_measure(bench_threads(o), mib ? mib : 512, (int)(reps < 100 ? reps : 100), &r, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return 1;
    }
    if (json)
        printf("{\"mode\":\"membw\",\"threads\":%d,\"read_bytes\":%llu,\"runs\":%d,\"read_gbs\":%.2f,\"triad_gbs\":%.2f,"
               "\"read_best_gbs\":%.2f,\"triad_best_gbs\":%.2f}\n",
               r.n_threads, (unsigned long long)r.read_bytes, r.runs, r.read_gbs, r.triad_gbs, r.read_best_gbs, r.triad_best_gbs);
    else
        printf("memory bandwidth, %d thread(s), %llu MiB buffer, median of %d: read %.2f GB/s (best %.2f), triad %.2f GB/s "
               "(best %.2f)\n",
               r.n_threads, (unsigned long long)(r.read_bytes >> 20), r.runs, r.read_gbs, r.read_best_gbs, r.triad_gbs,
               r.triad_best_gbs);
    return 0;
}

/* The text line of a decode's bytes per step (weights, KV, recurrent state when there is any) at tps
 * steps a second, against the measured read bandwidth bw_gbs (threads > 0: named in the line). */
static void print_decode_bytes(double wbytes, double kvbytes, double sbytes, double tps, double frac, double bw_gbs,
                               int threads) {
    const double step = wbytes + kvbytes + sbytes;
    printf("decode reads %.1f MB/token (weights %.1f + KV %.1f", step / 1e6, wbytes / 1e6, kvbytes / 1e6);
    if (sbytes > 0) printf(" + recurrent state %.1f", sbytes / 1e6);
    printf(") = %.2f GB/s at the median, %.1f%% of the measured read bandwidth %.2f GB/s (", step * tps / 1e9,
           100 * frac, bw_gbs);
    if (threads > 0) printf("%d threads; ", threads);
    printf("median of per-repetition fractions)\n");
}

/* ---- --decode-at: decode speed and KV footprint at a given depth -------------------------------- */

static int bench_decode_at(const kvt_engine_opts *o_in, uint32_t depth, uint32_t n_g, uint32_t reps, bool cold, uint32_t bw_mib,
                           bool json) {
    kvt_engine_opts o = *o_in;
    if (n_g < 2) n_g = 2;
    if (!o.n_ctx) o.n_ctx = depth + n_g + 16;
    /* bytes one decode step reads: the weights, the KV of depth + n_g / 2 positions on average and
     * the recurrent state (computed before the engine opens: the layout needs a loaded model, and
     * two at once would double the peak memory) */
    uint32_t n_win = 0;
    double sbytes = 0;
    const double bpt = layout_bytes_per_token(&o, false, &n_win, &sbytes);
    const double wbytes = decode_weight_bytes(&o), step_bytes = wbytes + sbytes + bpt * (depth + n_g / 2.0);
    kvt_engine *e = open_engine(&o);
    if (!e) return 1;
    const bool cache_on = o.prompt_cache_gb > 0;
    const uint32_t nv = kvt_engine_n_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * depth);
    double *dec = calloc(reps, sizeof(double)), *bw = calloc(reps, sizeof(double)), *frac = calloc(reps, sizeof(double));
    int rc = 0;
    char err[512] = "";
    double prefill_tps = 0, ttft0 = 0, dec0 = 0;
    uint32_t n_bw = 0;
    uint64_t peak0 = 0;
    uint32_t reused_last = 0;
    if (!ids || !dec || !bw || !frac) {
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
        const double g = membw_read_gbs(bench_threads(&o), bw_mib);
        if (g > 0) {
            bw[n_bw] = g;
            frac[n_bw++] = step_bytes * res.decode_tps / (g * 1e9);
        }
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
    const double bpt_full = n_win ? layout_bytes_per_token(&o, true, NULL, NULL) : bpt;
    const double toks = (double)depth + n_g - 1; /* the last sampled token is never forwarded */
    const double dmed = median(dec, reps);
    const double bw_med = n_bw ? median(bw, n_bw) : 0, frac_med = n_bw ? median(frac, n_bw) : 0;
    if (json) {
        printf("{\"mode\":\"decode_at\",\"model\":");
        json_str(kvt_engine_model_name(e));
        printf(",\"kv\":");
        json_str(st.scheme);
        printf(",\"threads\":%d,\"depth\":%u,\"n_gen\":%u,\"reps\":%u,\"cold_reps\":%s,\"prompt_cache\":%s,"
               "\"prefill_tps\":%.2f,\"ttft_cold_ms\":%.1f,\"decode_tps_first\":%.3f,\"decode_tps\":%.3f,"
               "\"reused_last\":%u,\"kv_bytes_per_token_layout\":%.1f,\"peak_kv_bytes\":%llu,"
               "\"kv_bytes_per_token_measured\":%.1f,\"window_layers\":%u,\"kv_bytes_per_token_full_attention\":%.1f,"
               "\"full_cache_bytes_computed\":%.0f,\"pool_peak_bytes\":%llu,\"ssd_bytes\":%llu",
               o.n_threads, depth, n_g, reps, cold ? "true" : "false", cache_on ? "true" : "false", prefill_tps, ttft0,
               dec0, dmed, reused_last, bpt, (unsigned long long)peak0, peak0 / toks, n_win, bpt_full, bpt_full * toks,
               (unsigned long long)st.pool_peak_bytes, (unsigned long long)st.ssd_bytes);
        printf(",\"decode_weight_bytes\":%.0f,\"decode_kv_bytes_per_token\":%.0f,\"decode_state_bytes\":%.0f,"
               "\"membw_read_gbs\":%.2f,\"decode_bw_fraction\":%.4f}\n",
               wbytes, bpt * (depth + n_g / 2.0), sbytes, bw_med, frac_med);
    } else {
        printf("decode at depth %u (%s, %d threads): prefill %.1f t/s, decode %.2f t/s (median of %u; first %.2f)\n", depth,
               st.scheme, o.n_threads, prefill_tps, dmed, reps, dec0);
        printf("KV: %.1f bytes/token (layout), peak pool %.2f MiB = %.1f bytes/token measured", bpt, peak0 / 1048576.0, peak0 / toks);
        if (n_win)
            printf("; %u sliding-window layers: a full cache would be %.1f bytes/token = %.2f MiB (computed)", n_win, bpt_full,
                   bpt_full * toks / 1048576.0);
        printf("\n");
        if (n_bw) print_decode_bytes(wbytes, step_bytes - wbytes - sbytes, sbytes, dmed, frac_med, bw_med, 0);
    }
out:
    free(ids);
    free(dec);
    free(bw);
    free(frac);
    kvt_engine_free(e);
    return rc;
}

/* ---- --agreement / --kv-quality: every KV codec against f16 KV ---------------------------------
 *
 * One pass per codec through kvt_engine_score over the same tokens: a seeded random prompt of plen
 * tokens, then n steps. The f16 pass runs free (each step feeds its own argmax: the f16 run's greedy
 * continuation) and keeps every step's log-softmax; each codec's pass is teacher-forced on that
 * continuation and reports top-1 agreement with it, KL(p_f16 || p_codec) per step (mean and p99),
 * and the layout's bytes/token. --kv-quality also times decode at a depth (--kv-quality-ctx, default
 * 4096; 0 skips it) for f16 and every codec side by side (decode_tps_side_by_side): each engine
 * prefills a prompt of that many random tokens once, then -r rounds run every codec in turn (prompt
 * reused from the RAM tier, -n decoded tokens); the median round is reported. */

typedef struct quality_pass {
    uint32_t nv, n;
    float *ref_lp;       /* [n][nv] f16 log-probabilities (filled by the reference pass) */
    int32_t *ref_tok;    /* [n] the tokens fed after each step (f16 greedy, or the text's) */
    int32_t *ref_top;    /* [n] f16 top-1 of each step */
    const int32_t *forced; /* [n] --kv-quality-text: the text's next tokens, fed instead of the greedy ones */
    bool reference;
    uint32_t match, first_miss;
    double *kl;          /* [n] */
} quality_pass;

/* log-softmax of logits into lp (double accumulation) */
static void log_softmax(const float *x, uint32_t n, float *lp) {
    float m = x[0];
    for (uint32_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double z = 0;
    for (uint32_t i = 0; i < n; i++) z += exp((double)x[i] - m);
    const double lz = m + log(z);
    for (uint32_t i = 0; i < n; i++) lp[i] = (float)((double)x[i] - lz);
}

static int32_t quality_step(void *vctx, uint32_t step, const float *logits) {
    quality_pass *q = vctx;
    const uint32_t top = kvt_vec_argmax(logits, q->nv);
    if (q->reference) {
        log_softmax(logits, q->nv, q->ref_lp + (size_t)step * q->nv);
        q->ref_top[step] = (int32_t)top;
        q->ref_tok[step] = q->forced ? q->forced[step] : (int32_t)top;
        return q->ref_tok[step];
    }
    const float *rp = q->ref_lp + (size_t)step * q->nv;
    double lz, z = 0, kl = 0;
    float m = logits[0];
    for (uint32_t i = 1; i < q->nv; i++) m = logits[i] > m ? logits[i] : m;
    for (uint32_t i = 0; i < q->nv; i++) z += exp((double)logits[i] - m);
    lz = m + log(z);
    for (uint32_t i = 0; i < q->nv; i++) {
        const double lp = rp[i];
        if (lp > -80) kl += exp(lp) * (lp - ((double)logits[i] - lz));
    }
    q->kl[step] = kl > 0 ? kl : 0;
    if ((int32_t)top == q->ref_top[step]) q->match++;
    else if (q->first_miss == UINT32_MAX) q->first_miss = step;
    return q->ref_tok[step];
}

/* "8", "4", "4:g32", "turbo", "turbo:k4v2": the --kv-quant value and an optional affine group. */
static void split_codec(const char *spec, char *mode, size_t n, uint32_t *group) {
    snprintf(mode, n, "%s", spec);
    *group = 0;
    char *g = strstr(mode, ":g");
    if (g && mode[0] != 't') {
        *group = (uint32_t)atoi(g + 2);
        *g = 0;
    }
}

/* Decode tok/s at a depth for several codecs, side by side: one engine per codec (RAM tier on),
 * each prefilled once with the same random prompt of `depth` tokens; then `reps` rounds, each
 * round running every codec once in turn (the same prompt, reused from the RAM tier, then n_g
 * decoded tokens), so load from other processes falls on all codecs alike. tps[i] is the median
 * over the rounds, -1 for a codec that failed (its error goes to stderr). */
static double process_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* cpu_ms[i] (may be NULL): median process CPU time per request / n_g — all threads' CPU for the
 * prefix restore and the n_g decode steps; less sensitive than wall time to other processes
 * sharing the cores (not to cache and memory-bandwidth contention). */
static void decode_tps_side_by_side(const kvt_engine_opts *opts, uint32_t n, uint32_t depth, uint32_t n_g, uint32_t reps,
                                    double *tps, double *cpu_ms) {
    kvt_engine **e = calloc(n, sizeof *e);
    double *t = calloc((size_t)n * reps, sizeof(double));
    double *c = calloc((size_t)n * reps, sizeof(double));
    int32_t *ids = malloc(sizeof(int32_t) * depth);
    char err[512];
    for (uint32_t i = 0; i < n; i++) {
        tps[i] = -1;
        if (cpu_ms) cpu_ms[i] = -1;
    }
    if (!e || !t || !c || !ids) goto out;
    for (uint32_t i = 0; i < n; i++) {
        kvt_engine_opts so = opts[i];
        so.n_ctx = depth + n_g + 16;
        so.prompt_cache_gb = 4;
        so.ssd_dir = NULL;
        err[0] = 0;
        if (kvt_engine_create(&so, &e[i], err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier bench: decode timing: %s\n", err);
            e[i] = NULL;
        }
    }
    for (uint32_t r = 0; r <= reps; r++) /* round 0 prefills and warms up; not timed */
        for (uint32_t i = 0; i < n; i++) {
            if (!e[i]) continue;
            fill_prompt(ids, depth, kvt_engine_n_vocab(e[i]), 7);
            kvt_gen_request req = {.prompt = ids, .n_prompt = depth, .max_tokens = n_g, .ignore_eog = true};
            kvt_sampling_default(&req.sampling);
            kvt_gen_result res;
            const double c0 = process_cpu_ms();
            if (kvt_engine_generate(e[i], &req, &res, err, sizeof err) != KVT_OK) {
                fprintf(stderr, "kvtier bench: decode timing: %s\n", err);
                kvt_engine_free(e[i]);
                e[i] = NULL;
                continue;
            }
            if (r > 0) {
                t[(size_t)i * reps + r - 1] = res.decode_tps;
                c[(size_t)i * reps + r - 1] = (process_cpu_ms() - c0) / n_g;
            }
            free(res.tokens);
        }
    for (uint32_t i = 0; i < n; i++)
        if (e[i]) {
            tps[i] = median(t + (size_t)i * reps, reps);
            if (cpu_ms) cpu_ms[i] = median(c + (size_t)i * reps, reps);
        }
out:
    for (uint32_t i = 0; e && i < n; i++) kvt_engine_free(e[i]);
    free(e);
    free(t);
    free(c);
    free(ids);
}

#define QUALITY_MAX_CODECS 16

typedef struct quality_row {
    char spec[64], mode[64], scheme[128], error[512];
    kvt_engine_opts o;
    double bpt, rate, kl_mean, kl_p99, secs, tps, cpu_ms;
    uint32_t match;
    int first_miss;
    bool ok;
} quality_row;

/* --kv-quality-text: the first plen + n tokens of FILE (with BOS if the model adds it); bounded read */
static int32_t *text_tokens(kvt_engine *e, const char *path, uint32_t need, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return NULL;
    }
    /* a token is at least one byte: 64 bytes per token needed is plenty for any text */
    const size_t cap = (size_t)need * 64 + 64;
    char *buf = malloc(cap);
    size_t len = buf ? fread(buf, 1, cap, f) : 0;
    fclose(f);
    int32_t *ids = buf ? malloc(sizeof(int32_t) * (len + 2)) : NULL;
    int64_t nt = ids ? kvt_tokenize_ex(kvt_engine_tokenizer(e), buf, len, KVT_TOK_ADD_SPECIAL, ids, (int64_t)len + 2) : -1;
    free(buf);
    if (nt < (int64_t)need) {
        snprintf(err, errlen, "%s: %lld tokens, --kv-quality-text needs -p + N = %u", path, (long long)nt, need);
        free(ids);
        return NULL;
    }
    return ids;
}

static int bench_quality(const kvt_engine_opts *o_in, uint32_t n, uint32_t plen, uint64_t seed, const char *codecs,
                         uint32_t speed_ctx, uint32_t n_g, uint32_t reps, bool quality_mode, const char *text,
                         bool json) {
    kvt_engine_opts o = *o_in;
    o.n_ctx = plen + n + 16;
    o.prompt_cache_gb = 0; /* the scoring pass uses a private sequence; no tiers needed */
    o.ssd_dir = NULL;
    const char *q = o.kv_quant ? o.kv_quant : "off";
    char list[512];
    if (codecs) snprintf(list, sizeof list, "%s", codecs);
    else if (strcmp(q, "off")) snprintf(list, sizeof list, "%s", q);
    else snprintf(list, sizeof list, "%s", quality_mode ? "8,4:g32,4:g64,turbo,turbo:k4v4,turbo:k4v3,turbo:k4v2" : "8,4");
    char err[512] = "";
    quality_pass qp = {.first_miss = UINT32_MAX, .reference = true, .n = n};
    int32_t *prompt = malloc(sizeof(int32_t) * plen);
    /* rows[0] is the f16 reference, rows[1..nr) the codecs of the list */
    quality_row *rows = calloc(QUALITY_MAX_CODECS + 1, sizeof *rows);
    kvt_engine_opts ro = o;
    ro.kv_quant = "off";
    kvt_engine *e = prompt && rows ? open_engine(&ro) : NULL;
    if (!e) {
        free(prompt);
        free(rows);
        return 1;
    }
    uint32_t nr = 1;
    qp.nv = kvt_engine_n_vocab(e);
    qp.ref_lp = malloc(sizeof(float) * qp.nv * (size_t)n);
    qp.ref_tok = malloc(sizeof(int32_t) * n);
    qp.ref_top = malloc(sizeof(int32_t) * n);
    qp.kl = malloc(sizeof(double) * n);
    int32_t *text_ids = NULL;
    int rc = 0;
    if (!qp.ref_lp || !qp.ref_tok || !qp.ref_top || !qp.kl) {
        fprintf(stderr, "kvtier bench: out of memory (%u steps x %u vocab)\n", n, qp.nv);
        rc = 1;
        goto out;
    }
    if (text) {
        if (!(text_ids = text_tokens(e, text, plen + n, err, sizeof err))) {
            fprintf(stderr, "kvtier bench: %s\n", err);
            rc = 1;
            goto out;
        }
        memcpy(prompt, text_ids, sizeof(int32_t) * plen);
        qp.forced = text_ids + plen;
    } else
        fill_prompt(prompt, plen, qp.nv, seed);
    double t0 = kvt_now_ms();
    if (kvt_engine_score(e, prompt, plen, n, quality_step, &qp, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: reference run: %s\n", err);
        rc = 1;
        goto out;
    }
    rows[0] = (quality_row){.o = ro, .ok = true, .rate = 1, .match = n, .first_miss = -1, .tps = -1};
    rows[0].secs = (kvt_now_ms() - t0) / 1000.0;
    snprintf(rows[0].spec, sizeof rows[0].spec, "off");
    snprintf(rows[0].scheme, sizeof rows[0].scheme, "%s", kvt_engine_scheme_key(e));
    rows[0].bpt = kvt_kv_layout_bytes_per_token(kvt_engine_layout(e));
    kvt_engine_free(e);
    e = NULL;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (nr > QUALITY_MAX_CODECS) {
            fprintf(stderr, "kvtier bench: at most %u codecs in --kv-codecs\n", QUALITY_MAX_CODECS);
            rc = 1;
            goto out;
        }
        quality_row *w = &rows[nr++];
        snprintf(w->spec, sizeof w->spec, "%s", tok);
        w->o = o;
        split_codec(tok, w->mode, sizeof w->mode, &w->o.kv_quant_group);
        w->o.kv_quant = w->mode;
        w->tps = -1;
        err[0] = 0;
        if (kvt_engine_create(&w->o, &e, err, sizeof err) != KVT_OK) {
            /* a codec the model cannot take (e.g. a group that does not divide head_dim) is reported, not fatal */
            snprintf(w->error, sizeof w->error, "%s", err);
            e = NULL;
            continue;
        }
        qp.reference = false;
        qp.match = 0;
        qp.first_miss = UINT32_MAX;
        t0 = kvt_now_ms();
        if (kvt_engine_score(e, prompt, plen, n, quality_step, &qp, err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier bench: %s: %s\n", tok, err);
            rc = 1;
            goto out;
        }
        w->secs = (kvt_now_ms() - t0) / 1000.0;
        snprintf(w->scheme, sizeof w->scheme, "%s", kvt_engine_scheme_key(e));
        w->bpt = kvt_kv_layout_bytes_per_token(kvt_engine_layout(e));
        kvt_engine_free(e);
        e = NULL;
        double klm = 0;
        for (uint32_t i = 0; i < n; i++) klm += qp.kl[i];
        w->kl_mean = klm / n;
        qsort(qp.kl, n, sizeof(double), cmp_d);
        w->kl_p99 = qp.kl[(uint32_t)((n - 1) * 0.99)];
        w->match = qp.match;
        w->rate = (double)qp.match / n;
        w->first_miss = qp.first_miss == UINT32_MAX ? -1 : (int)qp.first_miss;
        w->ok = true;
    }
    if (speed_ctx) { /* all codecs (and f16) timed side by side */
        kvt_engine_opts so[QUALITY_MAX_CODECS + 1];
        uint32_t map[QUALITY_MAX_CODECS + 1], ns = 0;
        double tps[QUALITY_MAX_CODECS + 1], cms[QUALITY_MAX_CODECS + 1];
        for (uint32_t i = 0; i < nr; i++)
            if (rows[i].ok) so[ns] = rows[i].o, map[ns++] = i;
        decode_tps_side_by_side(so, ns, speed_ctx, n_g, reps, tps, cms);
        for (uint32_t i = 0; i < ns; i++) rows[map[i]].tps = tps[i], rows[map[i]].cpu_ms = cms[i];
    }
    const quality_row *r0 = &rows[0];
    if (json) {
        printf("{\"mode\":\"%s\",\"model\":", quality_mode ? "kv_quality" : "agreement");
        json_str(o.model_path);
        printf(",\"text\":");
        if (text) json_str(text);
        else printf("null");
        printf(",\"n\":%u,\"prompt\":%u,\"reference\":\"%s\",\"reference_s\":%.1f,\"reference_bytes_per_token\":%.1f,"
               "\"speed_ctx\":%u,\"speed_reps\":%u,\"speed_n\":%u,\"reference_decode_tps\":%.3f,"
               "\"reference_decode_cpu_ms_per_token\":%.3f,\"results\":[",
               n, plen, r0->scheme, r0->secs, r0->bpt, speed_ctx, reps, n_g, r0->tps, r0->cpu_ms);
        for (uint32_t i = 1; i < nr; i++) {
            const quality_row *w = &rows[i];
            printf("%s{\"kv_quant\":", i > 1 ? "," : "");
            json_str(w->spec);
            if (!w->ok) {
                printf(",\"error\":");
                json_str(w->error);
                printf("}");
                continue;
            }
            printf(",\"scheme\":");
            json_str(w->scheme);
            printf(",\"bytes_per_token\":%.1f,\"bytes_ratio\":%.4f,\"match\":%u,\"rate\":%.4f,\"first_mismatch\":%d,"
                   "\"kl_mean\":%.6g,\"kl_p99\":%.6g,\"decode_tps\":%.3f,\"decode_ratio\":%.4f,"
                   "\"decode_cpu_ms_per_token\":%.3f,\"cpu_ratio\":%.4f,\"seconds\":%.1f}",
                   w->bpt, w->bpt / r0->bpt, w->match, w->rate, w->first_miss, w->kl_mean, w->kl_p99, w->tps,
                   r0->tps > 0 && w->tps > 0 ? w->tps / r0->tps : -1, w->cpu_ms,
                   r0->cpu_ms > 0 && w->cpu_ms > 0 ? w->cpu_ms / r0->cpu_ms : -1, w->secs);
        }
        printf("]}\n");
    } else {
        if (text)
            printf("KV codecs vs %s over %u tokens of %s (prompt: its first %u tokens; every step fed the text's next "
                   "token)\n", r0->scheme, n, text, plen);
        else
            printf("KV codecs vs %s over %u tokens (prompt %u random tokens, then the f16 run's greedy continuation)\n",
                   r0->scheme, n, plen);
        if (speed_ctx)
            printf("decode t/s at depth %u: %u tokens, median of %u side-by-side rounds\n", speed_ctx, n_g, reps);
        printf("| scheme | bytes/token | x f16 | top-1 agreement | mean KL | p99 KL |%s\n|---|---|---|---|---|---|%s\n",
               speed_ctx ? " decode t/s | x f16 | CPU ms/token | x f16 |" : "", speed_ctx ? "---|---|---|---|" : "");
        printf("| %s | %.0f | 1.000 | 100%% | 0 | 0 |", r0->scheme, r0->bpt);
        if (speed_ctx) printf(" %.2f | 1.000 | %.1f | 1.000 |", r0->tps, r0->cpu_ms);
        printf("\n");
        for (uint32_t i = 1; i < nr; i++) {
            const quality_row *w = &rows[i];
            if (!w->ok) {
                printf("| %s | skipped: %s |\n", w->spec, w->error);
                continue;
            }
            printf("| %s | %.0f | %.3f | %.1f%% (first miss %d) | %.4g | %.4g |", w->scheme, w->bpt, w->bpt / r0->bpt,
                   100.0 * w->rate, w->first_miss, w->kl_mean, w->kl_p99);
            if (speed_ctx)
                printf(" %.2f | %.3f | %.1f | %.3f |", w->tps, r0->tps > 0 ? w->tps / r0->tps : -1, w->cpu_ms,
                       r0->cpu_ms > 0 ? w->cpu_ms / r0->cpu_ms : -1);
            printf("\n");
        }
    }
    fflush(stdout);
out:
    kvt_engine_free(e);
    free(prompt);
    free(rows);
    free(qp.ref_lp);
    free(qp.ref_tok);
    free(qp.ref_top);
    free(qp.kl);
    free(text_ids);
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
    if (json && st.shared_enabled) /* shared tier (issue 17) */
        printf(",\"shared_fetched_bytes\":%llu,\"shared_fetched_blocks\":%llu,\"shared_errors\":%llu",
               (unsigned long long)st.shared_fetched_bytes, (unsigned long long)st.shared_fetched_blocks,
               (unsigned long long)st.shared_errors);
    if (json)
        printf(",\"create_ms\":%.1f,\"flush_ms\":%.1f,\"durable\":%s,\"ssd_entries\":%llu,\"ssd_bytes\":%llu,\"ssd_dropped\":%llu,"
               "\"ssd_failed\":%llu,\"kv_bytes_per_token_layout\":%.1f,\"pool_peak_bytes\":%llu}\n",
               create_ms, flush_ms, fr.durable ? "true" : "false", (unsigned long long)st.ssd_entries,
               (unsigned long long)st.ssd_bytes, (unsigned long long)st.ssd_dropped, (unsigned long long)st.ssd_failed,
               layout_bytes_per_token(o, false, NULL, NULL), (unsigned long long)st.pool_peak_bytes);
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
        const double bpt = layout_bytes_per_token(&o, false, NULL, NULL);
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
        const double bpt = layout_bytes_per_token(&o, false, NULL, NULL);
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

static int bench_cmd(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    uint32_t n_p = 512, n_g = 128, reps = 3, suffix = 100;
    bool json = false, cache = false, cold = false, once = false;
    uint32_t decode_at = 0, agreement = 0, turns = 0, restart_after = 0, quality = 0, quality_ctx = 4096, bw_mib = 512;
    bool membw = false;
    const char *codecs = NULL, *qtext = NULL, *ptext = NULL;
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
        else if (kvt_args_flag(&a, NULL, "--membw")) membw = true;
        else if (kvt_args_is(&a, NULL, "--membw-mib")) {
            bw_mib = kvt_args_u32(&a, 0, 16384);
            if (bw_mib && bw_mib < 64) bw_mib = 64;
        }
        else if (kvt_args_is(&a, NULL, "--agreement")) agreement = kvt_args_u32(&a, 1, 1u << 16);
        else if (kvt_args_is(&a, NULL, "--kv-quality")) quality = kvt_args_u32(&a, 1, 1u << 16);
        else if (kvt_args_is(&a, NULL, "--kv-quality-ctx")) quality_ctx = kvt_args_u32(&a, 0, 1u << 20);
        else if (kvt_args_is(&a, NULL, "--kv-codecs")) codecs = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--kv-quality-text")) qtext = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--prompt-text")) ptext = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--once")) once = true;
        else if (kvt_args_is(&a, NULL, "--turns")) turns = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--restart-after")) restart_after = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_is(&a, NULL, "--prompt-seed")) pseed = (uint64_t)kvt_args_i64(&a, 0, INT64_MAX);
        else if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (membw && !cache && !decode_at && !agreement && !once && !turns && !quality) return bench_membw(&eo, bw_mib, reps, json);
    if (!kvt_engine_flags_check("bench", &eo)) return 2;
    if ((cache ? 1 : 0) + (decode_at ? 1 : 0) + (agreement ? 1 : 0) + (once ? 1 : 0) + (turns ? 1 : 0) + (quality ? 1 : 0) +
            (membw ? 1 : 0) >
        1) {
        fprintf(stderr, "kvtier bench: --cache, --decode-at, --agreement, --kv-quality, --once, --turns and --membw are exclusive\n");
        return 2;
    }
    if (membw) return bench_membw(&eo, bw_mib, reps, json);
    g_progress = kvt_progress_create(stderr, json);
    if (ptext && (cache || decode_at || agreement || quality || once || turns)) {
        fprintf(stderr, "kvtier bench: --prompt-text goes with the throughput run only\n");
        return 2;
    }
    if (qtext && !quality && !agreement) {
        fprintf(stderr, "kvtier bench: --kv-quality-text goes with --kv-quality or --agreement\n");
        return 2;
    }
    if (agreement) return bench_quality(&eo, agreement, n_p == 512 ? 32 : n_p, pseed, codecs, 0, 0, 1, false, qtext, json);
    if (quality)
        return bench_quality(&eo, quality, n_p == 512 ? 1024 : n_p, pseed, codecs, quality_ctx, n_g == 128 ? 32 : n_g, reps,
                             true, qtext, json);
    if (decode_at) return bench_decode_at(&eo, decode_at, n_g, reps, cold, bw_mib, json);
    if (once) return bench_once(&eo, n_p, n_g, pseed, json);
    if (turns) return bench_turns(&eo, turns, n_p, n_g, suffix, pseed, restart_after, json);
    if (!eo.n_ctx) eo.n_ctx = n_p + n_g + suffix + 16;
    /* decode bytes per token: the weights, the KV of n_p + n_g / 2 positions on average and the
     * recurrent state (the layout needs a loaded model: computed before the engine opens, so the two
     * never coexist) */
    const bool bw_on = !cache && n_g > 0 && bw_mib > 0;
    double sbytes = 0;
    const double wbytes = bw_on ? decode_weight_bytes(&eo) : 0;
    const double kv_bpt = bw_on ? layout_bytes_per_token(&eo, false, NULL, &sbytes) : 0;
    const double kvb = kv_bpt * (n_p + n_g / 2.0), step_bytes = wbytes + kvb + sbytes;
    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(&eo, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier bench: %s\n", err);
        return 1;
    }
    kvt_progress_attach(g_progress, e);
    uint32_t nv = kvt_engine_n_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * (n_p + suffix + 1)), *text = NULL;
    double *pp = calloc(reps, sizeof(double)), *tg = calloc(reps, sizeof(double)), *t3 = calloc(reps, sizeof(double));
    double *bw = calloc(reps, sizeof(double)), *frac = calloc(reps, sizeof(double));
    int rc = 0;
    if (!ids || !pp || !tg || !t3 || !bw || !frac) {
        fprintf(stderr, "kvtier bench: out of memory\n");
        rc = 1;
        goto out;
    }
    if (!cache) {
        uint32_t n_bw = 0;
        /* --prompt-text: repetition r's prompt is the text's tokens [r*p, (r+1)*p) */
        if (ptext && !(text = text_tokens(e, ptext, n_p * reps, err, sizeof err))) {
            fprintf(stderr, "kvtier bench: --prompt-text: %s\n", err);
            rc = 1;
            goto out;
        }
        for (uint32_t r = 0; r < reps; r++) {
            if (text) memcpy(ids, text + (size_t)r * n_p, sizeof(int32_t) * n_p);
            else fill_prompt(ids, n_p, nv, r + 1);
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
            const double g = bw_on ? membw_read_gbs(bench_threads(&eo), bw_mib) : 0;
            if (g > 0) {
                bw[n_bw] = g;
                frac[n_bw++] = step_bytes * tg[r] / (g * 1e9);
            }
        }
        double mpp = median(pp, reps), mtg = median(tg, reps);
        const double bw_med = n_bw ? median(bw, n_bw) : 0, frac_med = n_bw ? median(frac, n_bw) : 0;
        kvt_engine_stats st;
        kvt_engine_stats_get(e, &st);
        if (json) {
            printf("{\"model\":\"%s\",\"threads\":%d,\"kv\":\"%s\",\"n_prompt\":%u,\"n_gen\":%u,\"reps\":%u,"
                   "\"prefill_tps\":%.2f,\"decode_tps\":%.2f,\"decode_weight_bytes\":%.0f,\"decode_kv_bytes_per_token\":%.0f,"
                   "\"decode_state_bytes\":%.0f,\"membw_read_gbs\":%.2f,\"decode_bw_fraction\":%.4f",
                   kvt_engine_model_name(e), eo.n_threads, st.scheme, n_p, n_g, reps, mpp, mtg, wbytes, kvb, sbytes, bw_med,
                   frac_med);
            if (st.spec_enabled)
                printf(",\"draft_max\":%u,\"spec_proposed\":%llu,\"spec_accepted\":%llu,\"spec_acceptance_rate\":%.4f,"
                       "\"spec_draft_time_share\":%.4f",
                       eo.draft_max, (unsigned long long)st.spec_proposed, (unsigned long long)st.spec_accepted,
                       st.spec_acceptance_rate, st.spec_draft_time_share);
            printf("}\n");
        } else {
            printf("| model | threads | kv | test | t/s (median of %u) |\n|---|---|---|---|---|\n", reps);
            printf("| %s | %d | %s | pp%u | %.2f |\n", kvt_engine_model_name(e), eo.n_threads, st.scheme, n_p, mpp);
            printf("| %s | %d | %s | tg%u | %.2f |\n", kvt_engine_model_name(e), eo.n_threads, st.scheme, n_g, mtg);
            if (n_bw) print_decode_bytes(wbytes, kvb, sbytes, mtg, frac_med, bw_med, bench_threads(&eo));
            if (st.spec_enabled)
                printf("speculative (--draft-max %u): %llu of %llu draft tokens accepted (%.1f%%), %.1f%% of decode time in "
                       "the draft\n",
                       eo.draft_max, (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_proposed,
                       100 * st.spec_acceptance_rate, 100 * st.spec_draft_time_share);
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
    free(text);
    free(pp);
    free(tg);
    free(t3);
    free(bw);
    free(frac);
    kvt_engine_free(e);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    int rc = bench_cmd(argc, argv);
    kvt_progress_free(g_progress);
    g_progress = NULL;
    return rc;
}
