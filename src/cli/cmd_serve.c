/* cmd_serve.c — `kvtier serve`: load the model, start the HTTP server (src/server), wait for
 * SIGINT/SIGTERM, then shut down gracefully (drain, flush) and exit 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/server.h"
#include "args.h"
#include "cmds.h"
#include "engine_flags.h"

static void usage(void) {
    printf("usage: kvtier serve -m MODEL.gguf [options]\n\n"
           "OpenAI-compatible HTTP server: POST /v1/chat/completions, /v1/completions (stream: true for SSE),\n"
           "GET /v1/models, /health, /stats, /metrics, POST /admin/cache/flush. See docs/server.md.\n\n"
           "server options:\n"
           "      --host ADDR           bind address (default 127.0.0.1; non-loopback needs --api-key(s) or --insecure)\n"
           "      --port N              TCP port (default 8080)\n"
           "      --api-key KEY         require 'Authorization: Bearer KEY' on every endpoint (env KVTIER_API_KEY);\n"
           "                            an admin key without a tenant\n"
           "      --api-keys FILE       tenant keys, one 'KEY TENANT [admin]' per line ('#' comments; mode 600):\n"
           "                            a request belongs to its key's tenant and reuses only that tenant's KV;\n"
           "                            /stats, /metrics and /admin/* need an admin key (docs/server.md)\n"
           "      --insecure            allow a non-loopback bind without an API key\n"
           "      --shutdown-timeout S  seconds to drain and flush on SIGINT/SIGTERM (default 120)\n"
           "      --max-body-mb N       largest accepted request body (default 16)\n"
           "      --max-queue N         queued + running requests before 503 (default 256)\n"
           "      --model-alias NAME    model id reported and accepted in the 'model' field\n\n"
           "abuse limits (see docs/server.md, Limits):\n"
           "      --max-connections N   connections held at once (default 256)\n"
           "      --max-conns-per-addr N  connections per client address still sending a request (default 32)\n"
           "      --conn-reserve N      connections generations never take, kept for /health and new requests\n"
           "                            (default 16; the queue holds at most max-connections - N)\n"
           "      --header-timeout S    seconds to send the request line and headers, also the keep-alive idle\n"
           "                            limit (default 10)\n"
           "      --body-timeout S      seconds to send the body once the headers are in (default 60)\n"
           "      --tokenize-budget-mb N  prompt text tokenized at once across requests (default 4)\n"
           "      --body-min-rate B     bytes/s a body must average 2 s after its headers, else it is closed\n"
           "                            (default 1024; 0 = no minimum, --body-timeout only)\n"
           "      --parse-budget-mb N   estimated JSON tree memory of large bodies parsed at once (default 64;\n"
           "                            503 past it)\n"
           "  -v, --verbose             debug logging\n\n"
           "%s",
           kvt_engine_flags_help);
}

int cmd_serve(int argc, char **argv) {
    kvt_engine_opts eo;
    kvt_engine_opts_default(&eo);
    eo.parallel = 4; /* serve batches concurrent requests (docs/batching.md) */
    kvt_server_opts so;
    kvt_server_opts_default(&so);
    const char *key = getenv("KVTIER_API_KEY"), *keys_file = NULL;
    if (key && !*key) key = NULL;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "serve", usage);
    while (kvt_args_next(&a)) {
        if (kvt_parse_engine_flag(&a, &eo)) continue;
        if (kvt_args_is(&a, NULL, "--host")) so.host = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--port")) so.port = (uint16_t)kvt_args_u32(&a, 0, 65535);
        else if (kvt_args_is(&a, NULL, "--api-key")) key = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--api-keys")) keys_file = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--insecure")) so.insecure = true;
        else if (kvt_args_is(&a, NULL, "--shutdown-timeout")) so.shutdown_timeout_s = kvt_args_f64(&a, 1, 86400);
        else if (kvt_args_is(&a, NULL, "--max-body-mb")) so.max_body_mb = kvt_args_u32(&a, 1, 4096);
        else if (kvt_args_is(&a, NULL, "--max-queue")) so.max_queue = kvt_args_u32(&a, 1, 1u << 20);
        else if (kvt_args_is(&a, NULL, "--model-alias")) so.model_alias = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--max-connections")) so.max_connections = kvt_args_u32(&a, 2, 65536);
        else if (kvt_args_is(&a, NULL, "--max-conns-per-addr")) so.max_conns_per_addr = kvt_args_u32(&a, 1, 65536);
        else if (kvt_args_is(&a, NULL, "--conn-reserve")) so.conn_reserve = kvt_args_u32(&a, 1, 65535);
        else if (kvt_args_is(&a, NULL, "--header-timeout")) so.header_timeout_s = kvt_args_f64(&a, 0.1, 3600);
        else if (kvt_args_is(&a, NULL, "--body-timeout")) so.body_timeout_s = kvt_args_f64(&a, 0.1, 3600);
        else if (kvt_args_is(&a, NULL, "--tokenize-budget-mb")) so.tokenize_budget_mb = kvt_args_u32(&a, 1, 65536);
        else if (kvt_args_is(&a, NULL, "--body-min-rate")) so.body_min_rate = kvt_args_f64(&a, 0, 1e9);
        else if (kvt_args_is(&a, NULL, "--parse-budget-mb")) so.parse_budget_mb = kvt_args_u32(&a, 1, 65536);
        else if (kvt_args_flag(&a, "-v", "--verbose")) kvt_log_set_level(KVT_LOG_DEBUG);
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (a.n_positional > 0) {
        fprintf(stderr, "kvtier serve: unexpected argument '%s' (see kvtier serve --help)\n", a.positional[0]);
        return 2;
    }
    if (!kvt_engine_flags_check("serve", &eo)) return 2;
    if (so.conn_reserve >= so.max_connections) {
        fprintf(stderr, "kvtier serve: --conn-reserve must be smaller than --max-connections\n");
        return 2;
    }
    if (key && !*key) {
        fprintf(stderr, "kvtier serve: --api-key must not be empty\n");
        return 2;
    }
    so.api_key = key;
    kvt_keyring *keys = NULL;
    if (keys_file) { /* before the model loads: a bad file is a quick, clear error */
        char kerr[512] = "";
        kvt_status kst = kvt_keyring_load(keys_file, &keys, kerr, sizeof kerr);
        if (kst != KVT_OK) {
            fprintf(stderr, "kvtier serve: --api-keys %s\n", kerr[0] ? kerr : kvt_status_str(kst));
            return 2;
        }
        if (key) { /* the admin key must not also be a tenant's: which one would it be? */
            char hdr[KVT_KEYS_MAX_KEY + 16];
            snprintf(hdr, sizeof hdr, "Bearer %s", key);
            const kvt_key_entry *dup = kvt_keyring_match(keys, hdr);
            if (dup) {
                fprintf(stderr, "kvtier serve: --api-key is also the key on line %u of %s\n", dup->line, keys_file);
                kvt_keyring_free(keys);
                return 2;
            }
        }
        size_t na = 0;
        for (size_t i = 0; i < kvt_keyring_count(keys); i++) na += kvt_keyring_at(keys, i)->admin;
        KVT_INFO("kvtier serve: %zu API keys from %s (%zu admin)", kvt_keyring_count(keys), keys_file, na);
    }
    so.keys = keys;
    so.model_path = eo.model_path;
    /* the memory budget's part for request text: the bodies parsed and the text tokenized at once */
    eo.text_buffers_mb = so.parse_budget_mb + so.tokenize_budget_mb;
    if (!so.host || !*so.host) so.host = "127.0.0.1";

    /* Refuse an unsafe bind before loading a (possibly large) model. */
    {
        bool loop = !strcmp(so.host, "localhost") || !strncmp(so.host, "127.", 4) || !strcmp(so.host, "::1");
        if (!loop && !so.api_key && !so.keys && !so.insecure) {
            fprintf(stderr,
                    "kvtier serve: refusing to bind non-loopback address '%s' without --api-key "
                    "(or KVTIER_API_KEY) or --api-keys; pass --insecure to allow\n",
                    so.host);
            return 2;
        }
    }

    /* Signals are blocked before any thread exists so that only sigtimedwait below sees them. */
    kvt_server_block_signals();

    char err[512] = "";
    kvt_engine *e = NULL;
    kvt_status st = kvt_engine_create(&eo, &e, err, sizeof err);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier serve: cannot load model: %s\n", err[0] ? err : kvt_status_str(st));
        kvt_keyring_free(keys);
        return 1;
    }
    kvt_server *s = NULL;
    st = kvt_server_create(&so, e, &s, err, sizeof err);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier serve: %s\n", err[0] ? err : kvt_status_str(st));
        kvt_engine_free(e);
        kvt_keyring_free(keys);
        return st == KVT_ERR_INVALID_ARG ? 2 : 1;
    }
    KVT_INFO("kvtier serve: model %s (ctx %u, kv %s) listening on http://%s:%u%s", kvt_engine_model_name(e),
             kvt_engine_n_ctx(e), kvt_engine_scheme_key(e), so.host, (unsigned)kvt_server_port(s),
             so.api_key || so.keys ? " (API key required)" : "");
    /* A plain line on stdout too, for scripts waiting for readiness. */
    printf("listening on %s:%u\n", so.host, (unsigned)kvt_server_port(s));
    fflush(stdout);

    int sig = kvt_server_wait_signal(NULL);
    KVT_INFO("kvtier serve: signal %d, shutting down (timeout %.0f s)", sig, so.shutdown_timeout_s);
    bool durable = kvt_server_shutdown(s);
    kvt_server_free(s);
    kvt_engine_free(e);
    kvt_keyring_free(keys);
    KVT_INFO("kvtier serve: stopped%s", durable ? "" : " (SSD tier not fully durable)");
    return 0;
}
