/* cmd_run.c — `kvtier run`: one generation from text (-p, optionally through the chat template) or
 * token ids (--tokens), printing the continuation and timings, or one JSON object with --json. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "engine_flags.h"
#include "progress.h"

static void usage(void) {
    printf("usage: kvtier run -m MODEL (-p TEXT | --tokens 1,2,3) [-n N] [options]\n\n"
           "Generates a continuation and prints it with timings (prefill tok/s, decode tok/s, peak KV bytes).\n\n"
           "  -p, --prompt TEXT         prompt text\n"
           "      --tokens IDS          prompt as comma-separated token ids\n"
           "      --chat                apply the model's chat template to the prompt as one user message\n"
           "      --system TEXT         system message for --chat\n"
           "      --special             parse control-token text in -p (off by default)\n"
           "  -n, --n-predict N         tokens to generate (default 64)\n"
           "      --ignore-eos          keep generating past end-of-generation tokens\n"
           "      --no-cache            bypass the RAM/SSD tiers for this run\n"
           "      --repeat N            run the same request N times (shows cache reuse), default 1\n"
           "      --json                print one JSON object per run\n"
           "      --logprobs N          with --json: each generated token's log-probability and the N (0..20)\n"
           "                            most likely tokens (the engine's log-softmax, as the server reports)\n\n%s\n%s",
           kvt_engine_flags_help, kvt_sampling_flags_help);
}

typedef struct out_ctx {
    bool json;
    cJSON *lps; /* --logprobs: one entry per drawn token */
} out_ctx;

static void on_logprobs(void *ctx, const kvt_token_logprobs *lp) {
    out_ctx *o = ctx;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", lp->id);
    cJSON_AddNumberToObject(e, "logprob", lp->logprob);
    cJSON *t = cJSON_AddArrayToObject(e, "top");
    for (uint32_t i = 0; i < lp->n_top; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber(lp->top_ids[i]));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(lp->top_lps[i]));
        cJSON_AddItemToArray(t, p);
    }
    cJSON_AddItemToArray(o->lps, e);
}

static bool on_token(void *ctx, int32_t id, const char *text, size_t len) {
    out_ctx *o = ctx;
    if (!o->json && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return true;
}

static int32_t *parse_ids(const char *s, uint32_t *n_out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = s;
    while (ids && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            free(ids);
            return NULL;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *q = realloc(ids, cap * sizeof *ids);
            if (!q) {
                free(ids);
                return NULL;
            }
            ids = q;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    *n_out = (uint32_t)n;
    return ids;
}

int cmd_run(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    const char *prompt = NULL, *tokens = NULL, *system = NULL;
    bool chat = false, special = false, json = false, ignore_eos = false, no_cache = false;
    uint32_t n_predict = 64, repeat = 1, logprobs = 0;
    bool want_lp = false;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "run", usage);
    while (kvt_args_next(&a)) {
        if (kvt_parse_engine_flag(&a, &eo) || kvt_parse_sampling_flag(&a, &sp)) continue;
        if (kvt_args_is(&a, "-p", "--prompt")) prompt = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--tokens")) tokens = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--chat")) chat = true;
        else if (kvt_args_is(&a, NULL, "--system")) system = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--special")) special = true;
        else if (kvt_args_is(&a, "-n", "--n-predict")) n_predict = kvt_args_u32(&a, 0, 1u << 24);
        else if (kvt_args_flag(&a, NULL, "--ignore-eos")) ignore_eos = true;
        else if (kvt_args_flag(&a, NULL, "--no-cache")) no_cache = true;
        else if (kvt_args_is(&a, NULL, "--repeat")) repeat = kvt_args_u32(&a, 1, 1000);
        else if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else if (kvt_args_is(&a, NULL, "--logprobs")) logprobs = kvt_args_u32(&a, 0, KVT_MAX_TOP_LOGPROBS), want_lp = true;
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (a.n_positional) {
        fprintf(stderr, "kvtier run: unexpected argument '%s' (see kvtier run --help)\n", a.positional[0]);
        return 2;
    }
    if (!prompt == !tokens) {
        fprintf(stderr, "kvtier run: give exactly one of -p TEXT or --tokens IDS (see kvtier run --help)\n");
        return 2;
    }
    if (chat && !prompt) {
        fprintf(stderr, "kvtier run: --chat needs -p TEXT\n");
        return 2;
    }
    if (!kvt_engine_flags_check("run", &eo)) return 2;

    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(&eo, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier run: %s\n", err);
        return 1;
    }
    const kvt_tokenizer *tok = kvt_engine_tokenizer(e);
    int32_t *ids = NULL;
    uint32_t n_ids = 0;
    if (tokens) {
        ids = parse_ids(tokens, &n_ids);
        if (!ids || n_ids == 0) {
            fprintf(stderr, "kvtier run: --tokens must be a comma-separated list of non-negative integers\n");
            kvt_engine_free(e);
            return 2;
        }
    } else if (chat) {
        kvt_chat_msg msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (kvt_chat_msg){.role = "system", .content = system, .content_len = strlen(system)};
        msgs[nm++] = (kvt_chat_msg){.role = "user", .content = prompt, .content_len = strlen(prompt)};
        int64_t n64 = 0;
        if (kvt_chat_tokenize(kvt_engine_chat(e), tok, msgs, nm, true, &ids, &n64, err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier run: %s\n", err);
            kvt_engine_free(e);
            return 1;
        }
        n_ids = (uint32_t)n64;
    } else {
        size_t len = strlen(prompt);
        int64_t need = kvt_tokenize(tok, prompt, len, kvt_tokenizer_add_bos(tok), special, NULL, 0);
        ids = malloc(sizeof(int32_t) * (size_t)(need > 0 ? need : 1));
        if (need < 0 || !ids) {
            fprintf(stderr, "kvtier run: out of memory while tokenizing\n");
            kvt_engine_free(e);
            return 1;
        }
        n_ids = (uint32_t)kvt_tokenize(tok, prompt, len, kvt_tokenizer_add_bos(tok), special, ids, need);
    }

    int rc = 0;
    kvt_progress *prog = kvt_progress_create(stderr, json); /* NULL unless on a terminal */
    kvt_progress_attach(prog, e);
    for (uint32_t r = 0; r < repeat; r++) {
        out_ctx oc = {.json = json, .lps = want_lp && json ? cJSON_CreateArray() : NULL};
        kvt_gen_request req = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_predict, .sampling = sp,
                               .ignore_eog = ignore_eos, .no_cache = no_cache, .on_token = on_token, .cb_ctx = &oc,
                               .n_logprobs = oc.lps ? 1 + logprobs : 0, .on_logprobs = oc.lps ? on_logprobs : NULL};
        kvt_gen_result res;
        err[0] = 0;
        if (n_predict == 0) req.max_tokens = 1;
        kvt_status st = kvt_engine_generate(e, &req, &res, err, sizeof err);
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier run: %s\n", err[0] ? err : kvt_status_str(st));
            cJSON_Delete(oc.lps);
            rc = 1;
            break;
        }
        static const char *tiers[] = {"none", "ram", "ssd", "shared"};
        static const char *fin[] = {"length", "stop", "cancelled", "error"};
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON *pa = cJSON_AddArrayToObject(o, "prompt_tokens");
            for (uint32_t i = 0; i < n_ids; i++) cJSON_AddItemToArray(pa, cJSON_CreateNumber(ids[i]));
            cJSON *ga = cJSON_AddArrayToObject(o, "tokens");
            for (uint32_t i = 0; i < res.n_gen; i++) cJSON_AddItemToArray(ga, cJSON_CreateNumber(res.tokens[i]));
            size_t tl = 0;
            char *raw = kvt_detokenize(tok, res.tokens, res.n_gen, false, &tl);
            /* a token may end inside a UTF-8 character: JSON must hold valid UTF-8 (U+FFFD) */
            char *text = raw ? kvt_utf8_sanitize(raw, tl, &tl) : NULL;
            cJSON_AddStringToObject(o, "text", text ? text : "");
            free(raw);
            free(text);
            cJSON_AddStringToObject(o, "finish_reason", fin[res.finish]);
            if (oc.lps) cJSON_AddItemToObject(o, "logprobs", oc.lps);
            cJSON_AddNumberToObject(o, "n_prompt", res.n_prompt);
            cJSON_AddNumberToObject(o, "n_reused", res.n_reused);
            cJSON_AddStringToObject(o, "reused_from", tiers[res.reused_from]);
            cJSON *t = cJSON_AddObjectToObject(o, "timings");
            cJSON_AddNumberToObject(t, "ttft_ms", res.ttft_ms);
            cJSON_AddNumberToObject(t, "prefill_ms", res.prefill_ms);
            cJSON_AddNumberToObject(t, "restore_ms", res.restore_ms);
            cJSON_AddNumberToObject(t, "decode_ms", res.decode_ms);
            cJSON_AddNumberToObject(t, "prefill_tps", res.prefill_tps);
            cJSON_AddNumberToObject(t, "decode_tps", res.decode_tps);
            cJSON_AddNumberToObject(t, "peak_kv_bytes", (double)res.peak_kv_bytes);
            kvt_engine_stats es;
            kvt_engine_stats_get(e, &es);
            if (es.spec_enabled) { /* --draft-model: this process's rounds so far (docs/speculative.md) */
                cJSON *sp = cJSON_AddObjectToObject(o, "speculative");
                cJSON_AddNumberToObject(sp, "rounds", (double)es.spec_rounds);
                cJSON_AddNumberToObject(sp, "proposed", (double)es.spec_proposed);
                cJSON_AddNumberToObject(sp, "accepted", (double)es.spec_accepted);
            }
            char *s = cJSON_PrintUnformatted(o);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        } else {
            printf("\n\n[prompt %u tokens, reused %u (%s), generated %u (%s)] prefill %.1f tok/s, decode %.1f tok/s, "
                   "TTFT %.1f ms, peak KV %.2f MB\n",
                   res.n_prompt, res.n_reused, tiers[res.reused_from], res.n_gen, fin[res.finish], res.prefill_tps,
                   res.decode_tps, res.ttft_ms, (double)res.peak_kv_bytes / 1e6);
        }
        fflush(stdout);
        free(res.tokens);
    }
    free(ids);
    kvt_engine_free(e);
    kvt_progress_free(prog);
    return rc;
}
