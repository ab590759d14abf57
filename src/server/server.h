/*
 * server.h — the OpenAI-compatible HTTP server (libmicrohttpd + cJSON) in front of one kvt_engine.
 * The engine flags themselves are parsed by src/cli/engine_flags.h (shared with run/chat).
 *
 * Threading: HTTP connection threads (thread-per-connection) parse and validate requests, tokenize
 * (bounded: see do_generate), and put a job on a FIFO queue; a small sweeper thread enforces the
 * connection deadlines of conn_guard.h; kvt_engine_parallel(e) worker threads (one per engine row,
 * docs/batching.md) each take a job from the queue and run kvt_engine_generate for it. Streaming
 * responses are fed from the token callback (on the engine's scheduler thread when parallel > 1)
 * through a per-job buffer guarded by a mutex and condvar: the callback only appends and signals,
 * never waits for the client, so a slow client never stalls the other rows. A client that disconnects sets its job's cancel flag; the engine stops and keeps what it
 * computed in the cache.
 *
 * Ownership: kvt_server borrows the engine (the caller creates it before and frees it after
 * kvt_server_free). Strings in kvt_server_opts are borrowed for the server's lifetime. The helpers in
 * the "api" section (api.c) are pure: no engine, no network; cJSON results are owned by the caller.
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <cjson/cJSON.h>

#include "../engine/engine.h"

/* ---------------------------------------------------------------------------------------------
 * Server
 * ------------------------------------------------------------------------------------------- */
typedef struct kvt_server_opts {
    const char *host;          /* default "127.0.0.1" */
    uint16_t port;             /* default 8080 */
    const char *api_key;       /* NULL = no auth */
    bool insecure;             /* allow a non-loopback bind without a key */
    double shutdown_timeout_s; /* default 120 */
    uint32_t max_body_mb;      /* default 16 */
    const char *model_alias;   /* NULL = engine model name */
    const char *model_path;    /* for the basename match of the `model` field */
    uint32_t max_queue;        /* queued + running jobs before 503, default 256 */
    uint32_t max_connections;  /* connections held at once, default 256 */
    uint32_t max_conns_per_addr; /* connections per client address still sending a request, default 32 */
    uint32_t conn_reserve;     /* connections generations may never take (kept for /health, new
                                  requests), default 16; the queue holds at most max_connections - this */
    double header_timeout_s;   /* request line + headers (and keep-alive idle) deadline, default 10 */
    double body_timeout_s;     /* request body deadline after the headers, default 60 */
    uint32_t tokenize_budget_mb; /* prompt text tokenized at once across requests, default 4 */
} kvt_server_opts;

void kvt_server_opts_default(kvt_server_opts *o);

typedef struct kvt_server kvt_server;

/* Binds and starts the listener and the worker. KVT_ERR_INVALID_ARG for a non-loopback host
 * without key or --insecure (message in err), KVT_ERR_IO when the bind fails. */
kvt_status kvt_server_create(const kvt_server_opts *o, kvt_engine *e, kvt_server **out, char *err, size_t errlen);
/* The bound port (useful with port 0). */
uint16_t kvt_server_port(const kvt_server *s);
/* Graceful shutdown: stop admitting (503), wait for in-flight work up to the shutdown timeout
 * (then cancel), stop the listener and worker, flush the engine with the time left. Returns true
 * if the flush reported everything durable. Idempotent. */
bool kvt_server_shutdown(kvt_server *s);
void kvt_server_free(kvt_server *s); /* shuts down first if needed */
/* Blocks SIGINT/SIGTERM in the calling thread (and every thread created after it: call before
 * kvt_engine_create) and ignores SIGPIPE. */
void kvt_server_block_signals(void);
/* Waits (sigtimedwait) for SIGINT/SIGTERM. Returns the signal number, or 0 when *stop_flag became
 * non-zero. */
int kvt_server_wait_signal(volatile int *stop_flag);

/* ---------------------------------------------------------------------------------------------
 * API helpers (api.c) — pure functions, unit-tested without an engine.
 * ------------------------------------------------------------------------------------------- */
typedef enum kvt_api_kind { KVT_API_CHAT = 1, KVT_API_COMPLETION = 2 } kvt_api_kind;

#define KVT_API_MAX_STOP 16

/* A validated /v1/chat/completions or /v1/completions request (before tokenization). All strings
 * point into the cJSON tree the request was parsed from, which must outlive this struct. */
typedef struct kvt_api_req {
    kvt_api_kind kind;
    const char *model;          /* NULL when absent */
    bool stream, include_usage;
    kvt_sampling sampling;
    bool seed_given;
    int64_t max_tokens;         /* -1 = not given */
    const char *stop[KVT_API_MAX_STOP];
    uint32_t n_stop;
    /* chat */
    kvt_chat_msg *msgs;         /* malloc'd array (kvt_api_req_free); content may be malloc'd too */
    size_t n_msgs;
    bool *msg_owned;            /* msgs[i].content was malloc'd (joined parts) */
    /* completion: either text or ids */
    const char *prompt_text;
    size_t prompt_text_len;
    int32_t *prompt_ids;        /* malloc'd */
    uint32_t n_prompt_ids;
} kvt_api_req;

/* Error produced by validation: HTTP status plus OpenAI error fields. */
typedef struct kvt_api_err {
    int http;
    char message[256];
    const char *type;  /* "invalid_request_error", ... */
    const char *param; /* may be NULL */
    const char *code;  /* may be NULL */
} kvt_api_err;

/* Validates UTF-8 (rejects overlongs, surrogates, > U+10FFFF, truncated sequences). */
bool kvt_utf8_valid(const char *s, size_t n);
/* Constant-time comparison of a presented secret with the expected one (time independent of
 * where they differ; length mismatch still compares all bytes of the expected key). */
bool kvt_ct_equal(const char *given, size_t given_len, const char *expected);
/* Checks an Authorization header value "Bearer KEY" against key in constant time. */
bool kvt_api_check_bearer(const char *header, const char *key);

/* Strict RFC 8259 syntax check (json_strict.c), run by kvt_api_parse before cJSON, which is lenient:
 * rejects a leading BOM, raw control characters in strings, bad escapes and lone surrogates, an
 * escaped NUL (\u0000: refused rather than silently cutting the string), malformed numbers,
 * trailing data and nesting deeper than KVT_JSON_MAX_DEPTH. UTF-8 is checked by kvt_utf8_valid.
 * On failure: false, *off = byte offset of the problem, *why = a static message. */
#define KVT_JSON_MAX_DEPTH 64
bool kvt_json_strict_check(const char *s, size_t n, size_t *off, const char **why);

/* Parses body (len bytes) into a cJSON tree and a request. n_vocab bounds token ids. On failure
 * fills *err and returns false (the tree, if any, is freed). On success *root must be freed with
 * cJSON_Delete after kvt_api_req_free. */
bool kvt_api_parse(kvt_api_kind kind, const char *body, size_t len, uint32_t n_vocab, cJSON **root,
                   kvt_api_req *req, kvt_api_err *err);
void kvt_api_req_free(kvt_api_req *req);
/* True when the `model` field names this server's model (alias, engine name, file basename with or
 * without .gguf); a NULL/empty field matches. */
bool kvt_api_model_matches(const char *requested, const char *alias, const char *engine_name, const char *path);

/* Error JSON {"error": {...}} as a malloc'd string. */
char *kvt_api_error_json(const kvt_api_err *e);
void kvt_api_set_err(kvt_api_err *e, int http, const char *type, const char *param, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Response bodies (malloc'd JSON strings). */
typedef struct kvt_api_resp_info {
    kvt_api_kind kind;
    const char *id;
    int64_t created;
    const char *model;
    uint32_t n_prompt, n_gen, n_cached;
    kvt_finish finish;
} kvt_api_resp_info;
char *kvt_api_response_json(const kvt_api_resp_info *ri, const char *text, size_t text_len);
/* One SSE event "data: {...}\n\n" for a content delta (text may be NULL for the role/finish chunks).
 * first: chat role chunk; final: carries finish_reason. usage_only: the include_usage chunk. */
char *kvt_api_chunk_sse(const kvt_api_resp_info *ri, const char *text, size_t text_len, bool first, bool final,
                        bool usage_only);
const char *kvt_api_finish_str(kvt_finish f);

/* Server-side counters added to /stats and /metrics. */
typedef struct kvt_server_counters {
    uint64_t total, ok, client_errors, server_errors, cancelled, rejected_shutdown, in_flight, queued,
        streamed;
    /* connections (conn_guard.h): held now, refused at accept, evicted, timed out */
    uint64_t conn_open, conn_refused, conn_evicted, conn_timed_out;
} kvt_server_counters;
char *kvt_api_stats_json(const kvt_engine_stats *st, const kvt_server_counters *c, const char *model);
char *kvt_api_metrics_text(const kvt_engine_stats *st, const kvt_server_counters *c);

#endif
