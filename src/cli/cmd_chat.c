/* cmd_chat.c — `kvtier chat`: interactive multi-turn chat in the terminal. Streams the reply and,
 * after each turn, shows prompt tokens, tokens reused from the cache (and which tier), time to first
 * token and decode speed. Lines starting with '/' are commands (/quit, /reset, /stats). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "engine_flags.h"
#include "progress.h"
#include "util/strbuf.h"

static void usage(void) {
    printf("usage: kvtier chat -m MODEL [--system TEXT] [-n N] [options]\n\n"
           "Interactive chat. Type a message and press Enter; /reset starts over, /stats shows cache\n"
           "statistics, /quit (or end of input) exits.\n\n"
           "      --system TEXT   system message\n"
           "  -n, --n-predict N   max tokens per reply (default 512)\n\n%s\n%s",
           kvt_engine_flags_help, kvt_sampling_flags_help);
}

/* Streams the reply to stdout and collects it in the kvt_strbuf at ctx; stops the generation when
 * the reply can no longer be stored. */
static bool on_token(void *ctx, int32_t id, const char *text, size_t len) {
    kvt_strbuf *r = ctx;
    if (!len) return true;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    kvt_strbuf_add(r, text, len);
    return !r->oom;
}

int cmd_chat(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    kvt_sampling sp;
    kvt_sampling_default(&sp);
    sp.temperature = 0.7f;
    sp.top_p = 0.95f;
    const char *system = NULL;
    uint32_t n_predict = 512;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "chat", usage);
    while (kvt_args_next(&a)) {
        if (kvt_parse_engine_flag(&a, &eo) || kvt_parse_sampling_flag(&a, &sp)) continue;
        if (kvt_args_is(&a, NULL, "--system")) system = kvt_args_str(&a);
        else if (kvt_args_is(&a, "-n", "--n-predict")) n_predict = kvt_args_u32(&a, 1, 1u << 20);
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (!kvt_engine_flags_check("chat", &eo)) return 2;
    char err[512] = "";
    kvt_engine *e = NULL;
    if (kvt_engine_create(&eo, &e, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier chat: %s\n", err);
        return 1;
    }
    kvt_progress *prog = kvt_progress_create(stderr, false); /* NULL unless on a terminal */
    kvt_progress_attach(prog, e);
    size_t cap = 64, nm = 0;
    kvt_chat_msg *msgs = calloc(cap, sizeof *msgs);
    char **owned = calloc(cap, sizeof *owned);
    if (system) msgs[nm++] = (kvt_chat_msg){.role = "system", .content = system, .content_len = strlen(system)};
    size_t n_fixed = nm;
    fprintf(stderr, "kvtier chat: %s (%s); /quit to exit\n", kvt_engine_model_name(e), kvt_chat_family_name(kvt_chat_family_of(kvt_engine_chat(e))));
    char line[16384];
    int rc = 0;
    for (;;) {
        printf("\n> ");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            for (size_t i = n_fixed; i < nm; i++) free(owned[i]);
            nm = n_fixed;
            printf("(conversation reset)\n");
            continue;
        }
        if (!strcmp(line, "/stats")) {
            kvt_engine_stats s;
            kvt_engine_stats_get(e, &s);
            printf("prompt cache: %llu blocks, %.1f MB, hits %llu, misses %llu, reused %llu tokens; pool %.1f MB\n",
                   (unsigned long long)s.pc_blocks, s.pc_bytes / 1e6, (unsigned long long)s.pc_hits,
                   (unsigned long long)s.pc_misses, (unsigned long long)s.pc_reused_tokens, s.pool_used_bytes / 1e6);
            continue;
        }
        if (nm + 2 > cap) {
            cap *= 2;
            kvt_chat_msg *m2 = realloc(msgs, cap * sizeof *msgs);
            char **o2 = realloc(owned, cap * sizeof *owned);
            if (!m2 || !o2) {
                rc = 1;
                break;
            }
            msgs = m2;
            owned = o2;
        }
        owned[nm] = strdup(line);
        msgs[nm] = (kvt_chat_msg){.role = "user", .content = owned[nm], .content_len = L};
        nm++;
        int32_t *ids = NULL;
        int64_t n_ids = 0;
        if (kvt_chat_tokenize(kvt_engine_chat(e), kvt_engine_tokenizer(e), msgs, nm, true, &ids, &n_ids, err, sizeof err) != KVT_OK) {
            fprintf(stderr, "kvtier chat: %s\n", err);
            free(owned[--nm]);
            continue;
        }
        kvt_strbuf r = {0};
        kvt_gen_request req = {.prompt = ids, .n_prompt = (uint32_t)n_ids, .max_tokens = n_predict, .sampling = sp,
                               .on_token = on_token, .cb_ctx = &r};
        kvt_gen_result res;
        kvt_status st = kvt_engine_generate(e, &req, &res, err, sizeof err);
        free(ids);
        if (st != KVT_OK) {
            fprintf(stderr, "\nkvtier chat: %s\n", err);
            free(owned[--nm]);
            kvt_strbuf_free(&r);
            continue;
        }
        static const char *tiers[] = {"none", "RAM", "SSD", "shared"};
        fprintf(stderr, "\n[prompt %u tokens, reused %u from %s, TTFT %.0f ms, %.1f tok/s, %u tokens]\n", res.n_prompt,
                res.n_reused, tiers[res.reused_from], res.ttft_ms, res.decode_tps, res.n_gen);
        free(res.tokens);
        /* on a failed allocation the reply was cut short; keep what was stored of it */
        r.oom = false;
        owned[nm] = kvt_strbuf_take(&r, NULL);
        if (!owned[nm]) {
            fprintf(stderr, "kvtier chat: out of memory\n");
            rc = 1;
            break;
        }
        msgs[nm] = (kvt_chat_msg){.role = "assistant", .content = owned[nm], .content_len = strlen(owned[nm])};
        nm++;
    }
    for (size_t i = n_fixed; i < nm; i++) free(owned[i]);
    free(owned);
    free(msgs);
    kvt_engine_free(e);
    kvt_progress_free(prog);
    return rc;
}
