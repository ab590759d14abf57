/*
 * server.h — the OpenAI-compatible HTTP server (libmicrohttpd + cJSON) in front of one kvt_engine.
 * The engine flags themselves are parsed by src/cli/engine_flags.h (shared with run/chat).
 *
 * Threading: HTTP connection threads (thread-per-connection) parse and validate requests, tokenize
 * (bounded: see do_generate), and hand each job straight to the engine (kvt_engine_submit): the
 * engine's batching scheduler holds the one queue (docs/batching.md) and no server thread waits for
 * a row. A small sweeper thread enforces the connection deadlines of conn_guard.h and runs the
 * engine's idle maintenance (kvt_engine_tick) once a second. Streaming responses are fed from the
 * token callback (on the engine's scheduler thread) through a per-job buffer guarded by a mutex and
 * condvar: the callback only appends and signals, never waits for the client, so a slow client
 * never stalls the other rows. A client that disconnects sets its job's cancel flag; the engine
 * stops (or, still queued, never starts) and keeps what it computed in the cache.
 *
 * Ownership: kvt_server borrows the engine (the caller creates it before and frees it after
 * kvt_server_free). Strings in kvt_server_opts are borrowed for the server's lifetime. The helpers in
 * the "api" section (api.c) are pure: no engine, no network; cJSON results are owned by the caller.
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <cjson/cJSON.h>

#include "../engine/engine.h"
#include "tenants.h"

/* ---------------------------------------------------------------------------------------------
 * Server
 * ------------------------------------------------------------------------------------------- */
typedef struct kvt_server_opts {
    const char *host;          /* default "127.0.0.1" */
    uint16_t port;             /* default 8080 */
    const char *api_key;       /* the one admin key without a tenant; NULL = none */
    const kvt_keyring *keys;   /* --api-keys (tenants.h), borrowed; NULL = none. With neither key nor
                                  keys there is no auth and every caller is an admin */
    bool insecure;             /* allow a non-loopback bind without a key */
    double shutdown_timeout_s; /* default 120 */
    uint32_t max_body_mb;      /* default 16 */
    const char *model_alias;   /* NULL = engine model name */
    const char *model_path;    /* for the basename match of the `model` field */
    uint32_t max_queue;        /* jobs handed to the engine and not finished before 503, default 256 */
    uint32_t max_connections;  /* connections held at once, default 256 */
    uint32_t max_conns_per_addr; /* connections per client address still sending a request, default 32 */
    uint32_t conn_reserve;     /* connections generations may never take (kept for /health, new
                                  requests), default 16; the queue holds at most max_connections - this */
    double header_timeout_s;   /* request line + headers (and keep-alive idle) deadline, default 10 */
    double body_timeout_s;     /* request body deadline after the headers, default 60 */
    uint32_t tokenize_budget_mb; /* prompt text tokenized at once across requests, default 4 */
    double body_min_rate;      /* bytes/s a body must average once KVT_SRV_BODY_GRACE_S have passed
                                  since its headers, default 1024; 0 = no minimum */
    uint32_t parse_budget_mb;  /* estimated JSON tree memory of the bodies being parsed/held at once
                                  across requests (503 past it), default 64 */
} kvt_server_opts;

/* Body rate grace time, and the JSON value cap per request: one value per KVT_SRV_BODY_BYTES_PER_NODE
 * bytes of --max-body-mb (16 MB: 262144 values), with KVT_SRV_PARSE_NODE_BYTES of tree memory
 * estimated per value (cJSON node, key and string allocations). docs/server.md, Limits. */
#define KVT_SRV_BODY_GRACE_S 2.0
#define KVT_SRV_BODY_BYTES_PER_NODE 64u
#define KVT_SRV_PARSE_NODE_BYTES 160u

void kvt_server_opts_default(kvt_server_opts *o);

typedef struct kvt_server kvt_server;

/* Binds and starts the listener and the sweeper. KVT_ERR_INVALID_ARG for a non-loopback host
 * without key or --insecure (message in err), KVT_ERR_IO when the bind fails. */
kvt_status kvt_server_create(const kvt_server_opts *o, kvt_engine *e, kvt_server **out, char *err, size_t errlen);
/* The bound port (useful with port 0). */
uint16_t kvt_server_port(const kvt_server *s);
/* Graceful shutdown: stop admitting (503), wait for in-flight work up to the shutdown timeout
 * (then cancel it and wait until the engine ended it), stop the listener, flush the engine with the
 * time left. Returns true
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
#define KVT_API_MAX_N 16         /* `n`: choices per request */
#define KVT_API_MAX_TOOLS 128    /* `tools` entries */

typedef enum kvt_api_tool_choice {
    KVT_TOOL_CHOICE_AUTO = 0, KVT_TOOL_CHOICE_NONE = 1, KVT_TOOL_CHOICE_REQUIRED = 2, KVT_TOOL_CHOICE_NAMED = 3
} kvt_api_tool_choice;
typedef enum kvt_api_format { KVT_FMT_TEXT = 0, KVT_FMT_JSON_OBJECT = 1, KVT_FMT_JSON_SCHEMA = 2 } kvt_api_format;

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
    const char *user;           /* the `user` field (logged nowhere; accepted as OpenAI does) */
    const char *cache_salt;     /* NULL when absent; else 1..KVT_SALT_MAX bytes */
    char ns[KVT_NS_MAX];        /* the namespace (kvt_gen_request.ns): set by the server from the
                                 * caller's tenant and cache_salt (kvt_tenant_namespace), "" here */
    uint32_t n_choices;         /* `n`: samples of the same prompt (1..KVT_API_MAX_N) */
    /* tools (chat): docs/server.md "Tools" */
    char *tools_json;           /* malloc'd compact `tools` array, NULL when absent or empty */
    const cJSON *tools;         /* the validated `tools` array in the tree (NULL when absent) */
    kvt_api_tool_choice tool_choice;
    const char *tool_choice_name; /* KVT_TOOL_CHOICE_NAMED: the function */
    bool parallel_tool_calls;   /* default true; false keeps only the first call */
    char *kwargs_json;          /* malloc'd template variables: chat_template_kwargs (+ reasoning_effort) */
    /* structured output */
    kvt_api_format response_format;
    const cJSON *json_schema;   /* KVT_FMT_JSON_SCHEMA: the schema object in the tree */
    /* logprobs */
    bool logprobs;
    uint32_t top_logprobs;      /* 0..20 */
    /* logit_bias (malloc'd arrays, validated against n_vocab) */
    int32_t *bias_ids;
    float *bias_vals;
    uint32_t n_bias;
    uint32_t n_vocab_bound;     /* token ids must be below this (kvt_api_parse's n_vocab) */
    char **owned;               /* other malloc'd strings the messages borrow (tool_calls JSON) */
    size_t n_owned;
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
 * escaped NUL (\u0000: refused rather than silently cutting the string), malformed numbers, a
 * number with a nonzero digit that a double rounds to 0 (1e-400: cJSON would read 0), trailing
 * data and nesting deeper than KVT_JSON_MAX_DEPTH. UTF-8 is checked by kvt_utf8_valid.
 * On failure: false, *off = byte offset of the problem, *why = a message, static or in a
 * thread-local buffer (valid until this thread's next call). */
#define KVT_JSON_MAX_DEPTH 64
bool kvt_json_strict_check(const char *s, size_t n, size_t *off, const char **why);

/* The same check, with the number of values counted (cJSON allocates one node per value: object,
 * array, string, number, literal) and capped, so the server can refuse a body whose tree would be
 * out of proportion to its bytes before cJSON builds it (see server.c, "parse bounds"). */
typedef enum kvt_json_fail {
    KVT_JSON_OK = 0,
    KVT_JSON_SYNTAX,    /* not strict RFC 8259 (or nested too deeply) */
    KVT_JSON_TOO_MANY,  /* more than max_nodes values */
    KVT_JSON_UNDERFLOW, /* a number a double rounds to 0 */
} kvt_json_fail;
typedef struct kvt_json_scan_result {
    size_t nodes;       /* values seen (on KVT_JSON_TOO_MANY: max_nodes) */
    kvt_json_fail fail;
    size_t off;         /* failure: byte offset of the problem; success: n */
    const char *why;    /* failure: a static message */
    const char *key;    /* failure: the innermost object member key enclosing the problem (no quotes,
                           raw JSON string bytes, pointing into the scanned text), NULL if none */
    size_t key_len;
} kvt_json_scan_result;
/* max_nodes = 0: no cap. True when the text is acceptable. */
bool kvt_json_scan(const char *s, size_t n, size_t max_nodes, kvt_json_scan_result *r);
/* Copies a scanned key into out as a label for an error message; false (nothing copied) unless it
 * is 1..cap-1 bytes of printable ASCII without backslash or quote. */
bool kvt_json_key_label(const char *key, size_t len, char *out, size_t cap);

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
    /* what the cache did, sent as the "kvtier" extension object (docs/server.md): the tier the
     * reused prompt tokens came from, time to first token, prefill and decode rates (engine.h
     * kvt_gen_result; 0 while unknown) */
    kvt_tier reused_from;
    double ttft_ms, prefill_tps, decode_tps;
} kvt_api_resp_info;
const char *kvt_api_finish_str(kvt_finish f);

/* The output of one request's choices (api.c): splits each choice's text into reasoning, content
 * and tool calls (text/toolcall.h), records logprobs, and writes the SSE chunks (stream) or the final
 * response body. One per request; used by one thread at a time (the generating thread while it runs,
 * the connection thread after). Functions that take a kvt_strbuf append the SSE events to send now
 * (nothing when not streaming); check sb->oom. */
typedef struct kvt_api_out_opts {
    kvt_api_kind kind;
    bool stream;
    uint32_t n_choices;         /* 1..KVT_API_MAX_N */
    int tool_format;            /* kvt_tool_format (KVT_TOOL_FMT_NONE: no tool-call parsing) */
    bool reasoning, in_think;   /* toolcall.h kvt_tc_opts */
    const char *tools_json;     /* copied */
    bool parallel_tool_calls;   /* false: only each choice's first call is returned */
    bool logprobs;
    uint32_t top_logprobs;
    const kvt_tokenizer *tok;   /* logprob token texts (borrowed; outlives the kvt_api_out) */
    uint64_t id_seed;           /* tool-call ids */
} kvt_api_out_opts;
typedef struct kvt_api_out kvt_api_out;
struct kvt_strbuf;
kvt_status kvt_api_out_create(const kvt_api_out_opts *o, kvt_api_out **out);
void kvt_api_out_free(kvt_api_out *o);
/* Streaming chat: the role chunk of a choice. */
void kvt_api_out_begin(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, struct kvt_strbuf *sb);
void kvt_api_out_text(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, const char *text, size_t len,
                      struct kvt_strbuf *sb);
void kvt_api_out_logprobs(kvt_api_out *o, uint32_t choice, const kvt_token_logprobs *lp);
/* End of a choice: held text, then (stream) the finish chunk. finish_reason is "tool_calls" when the
 * choice made calls and stopped. */
void kvt_api_out_end(kvt_api_out *o, const kvt_api_resp_info *ri, uint32_t choice, kvt_finish finish,
                     struct kvt_strbuf *sb);
uint32_t kvt_api_out_n_calls(const kvt_api_out *o, uint32_t choice);
/* Non-streaming: the whole response body (malloc'd JSON). */
char *kvt_api_out_response(const kvt_api_out *o, const kvt_api_resp_info *ri);
/* Streaming: the include_usage chunk. */
void kvt_api_out_usage(const kvt_api_resp_info *ri, struct kvt_strbuf *sb);

/* Server-side counters added to /stats and /metrics. */
/* The server's own counters: one row each, X(field, section, key, metric, kind, help) as in
 * engine/stats_table.h (they are all uint64_t); the same row makes the field, its /stats key and
 * its /metrics sample. */
#define KVT_SERVER_COUNTERS(X)                                                                                          \
    X(total, "requests", "total", "http_requests_total", counter, "HTTP requests answered")                            \
    X(ok, "requests", "ok", "http_requests_ok_total", counter, "HTTP requests answered with 2xx")                      \
    X(client_errors, "requests", "client_errors", "http_requests_client_errors_total", counter,                        \
      "HTTP requests answered with 4xx")                                                                               \
    X(server_errors, "requests", "server_errors", "http_requests_server_errors_total", counter,                        \
      "HTTP requests answered with 5xx")                                                                               \
    X(cancelled, "requests", "cancelled", "requests_cancelled_total", counter,                                         \
      "Generations cancelled (client gone or shutdown)")                                                               \
    X(rejected_shutdown, "requests", "rejected_shutdown", "requests_rejected_shutdown_total", counter,                 \
      "Requests refused while shutting down")                                                                          \
    X(in_flight, "requests", "in_flight", "requests_in_flight", gauge, "Generation jobs running")                      \
    X(queued, "requests", "queued", "requests_queued", gauge, "Generation jobs waiting")                               \
    X(streamed, "requests", "streamed", "", counter, "Responses streamed as server-sent events")                       \
    X(conn_open, "connections", "open", "http_connections_open", gauge, "HTTP connections held")                      \
    X(conn_refused, "connections", "refused", "http_connections_refused_total", counter,                               \
      "HTTP connections refused at accept (limits)")                                                                   \
    X(conn_evicted, "connections", "evicted", "http_connections_evicted_total", counter,                               \
      "HTTP connections still sending a request closed to make room for a new one")                                    \
    X(conn_timed_out, "connections", "timed_out", "http_connections_timed_out_total", counter,                         \
      "HTTP connections closed for missing the header or body deadline")
#define KVT_SERVER_COUNTER_FIELD_(field, section, key, metric, kind, help) uint64_t field;
typedef struct kvt_server_counters {
    KVT_SERVER_COUNTERS(KVT_SERVER_COUNTER_FIELD_)
} kvt_server_counters;
/* ns: the per-namespace counters added as the "namespaces" section; NULL = no section. */
char *kvt_api_stats_json(const kvt_engine_stats *st, const kvt_server_counters *c, const char *model, kvt_ns_stats *ns);
char *kvt_api_metrics_text(const kvt_engine_stats *st, const kvt_server_counters *c);

#endif
