/* server.c — HTTP plumbing (libmicrohttpd, thread per connection) and the jobs it hands to the
 * engine's batching scheduler (the one queue; no server thread waits for a row). See server.h for
 * the threading model.
 *
 * Abuse limits enforced here (docs/server.md, "Limits"):
 *   - connections: admission, eviction, header/body deadlines and the minimum body rate are decided
 *     by conn_guard.c; this file feeds it the library's connection events and body bytes and shuts
 *     down the sockets it picks;
 *   - request line / headers: longer URLs and more or larger headers than the KVT_MAX_* limits get
 *     a JSON 414/431 here (what exceeds libmicrohttpd's own buffer gets the library's answer);
 *   - prompts: a text that cannot fit the context even at the vocabulary's longest token is refused
 *     before tokenizing; tokenizing stops once the count passes the context; the text bytes being
 *     tokenized at once across all requests are bounded by the tokenize budget;
 *   - JSON bodies (generate_bounded): before cJSON builds a tree, the body is scanned (json_strict.c)
 *     and refused with 413 past max_body_mb * 1 MiB / KVT_SRV_BODY_BYTES_PER_NODE values; the
 *     estimated tree memory (body bytes + KVT_SRV_PARSE_NODE_BYTES per value) of the requests
 *     holding a tree at once is capped by the parse budget (503 server_busy past it; small bodies,
 *     up to KVT_SRV_PARSE_SMALL_BYTES, are not counted so they always get through); after a
 *     request with a large body or tree the freed heap is handed back to the OS (malloc_trim). */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "conn_guard.h"
#include "server.h"
#include "text/json_schema.h"
#include "text/toolcall.h"
#include "util/strbuf.h"
#include "web.h"

/* Request-line and header limits answered with JSON (below the library's own buffer, see
 * KVT_MHD_MEMORY_LIMIT, past which libmicrohttpd answers by itself). */
#define KVT_MAX_URL_BYTES 4096
#define KVT_MAX_HEADERS 64
#define KVT_MAX_HEADER_BYTES 16384
#define KVT_MHD_MEMORY_LIMIT (64u * 1024u)
/* Parse-budget exemption, and the size from which a request's freed memory is trimmed back. */
#define KVT_SRV_PARSE_SMALL_BYTES (64u * 1024u)
#define KVT_SRV_TRIM_BYTES (1u << 20)
/* Whether malloc_trim runs at all: not under ASan or TSan, whose allocators own the heap. glibc's
 * arenas then stay unused, and concurrent malloc_trim calls race glibc's lazy set-up of them (the
 * sanitize build's server_abuse e2e crashed reading an arena's unset bins). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVT_SRV_MALLOC_TRIM 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVT_SRV_MALLOC_TRIM 0
#endif
#endif
#ifndef KVT_SRV_MALLOC_TRIM
#define KVT_SRV_MALLOC_TRIM 1
#endif

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------- */
typedef enum job_state { JOB_PENDING = 0 /* queued or generating: the engine knows which */, JOB_DONE = 1 } job_state;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* owners: connection ctx, the engine (submitted until done), streaming response */
    struct job *prev, *next;  /* the server's jobs handed to the engine and not done (qmu) */
    kvt_server *srv;
    kvt_api_kind kind;
    bool stream, include_usage;
    int32_t *prompt;
    uint32_t n_prompt, max_tokens;
    kvt_sampling sampling;
    char *stop[KVT_API_MAX_STOP];
    uint32_t n_stop;
    char id[48];
    int64_t created;
    const char *model;        /* server-owned string */
    char ns[KVT_NS_MAX];      /* the request's namespace (kvt_gen_request.ns; tenants.h) */
    /* choices (n), output shaping (reasoning, tool calls, logprobs) and constraint: set before the
     * job is queued; out is used under mu */
    uint32_t n_choices, cur_choice;
    bool choice_started;
    uint32_t gen_done, cached0; /* generated tokens of finished choices; choice 0's cached tokens */
    bool render_special;
    uint32_t n_logprobs;      /* kvt_gen_request.n_logprobs */
    int32_t *bias_ids;        /* logit_bias (owned) */
    float *bias_vals;
    kvt_api_out *out;
    kvt_json_constraint *jc;  /* constrained decoding (owned), NULL when off */
    int fd;                   /* client socket, for disconnect polling */
    /* state (mu) */
    job_state state;
    bool started;             /* first token produced */
    bool shutdown_cancel;     /* cancelled by the shutdown timeout rather than by the client */
    volatile int cancel;
    char *buf;                /* stream: SSE bytes; otherwise: the generated text */
    size_t len, cap, rd;
    bool oom;
    kvt_status st;
    char err[256];
    kvt_gen_result res;
    /* the choice being generated: the engine borrows these until its done callback (choice_done) */
    uint32_t ci;
    kvt_gen_request rq;
    kvt_gen_result cres;
    char cerr[256];
} job;

/* The cancel flag is set by connection threads and the shutdown path and polled by the engine
 * (its scheduler and begin threads): relaxed atomic accesses, so the flag is race-free (ThreadSanitizer). */
static void job_cancel(job *j) { __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED); }
static bool job_cancelled(job *j) { return __atomic_load_n(&j->cancel, __ATOMIC_RELAXED) != 0; }

struct kvt_server {
    kvt_server_opts o;
    kvt_engine *e;
    struct MHD_Daemon *mhd;
    uint16_t port;
    char model_name[256];
    int64_t started_at;
    /* jobs handed to the engine (the queue itself is the engine's scheduler's) */
    pthread_mutex_t qmu;
    pthread_cond_t idle_cv;   /* a job finished (shutdown waits for none left) */
    job *jobs;                /* not yet done, for the shutdown's cancel */
    uint32_t n_jobs;
    /* idle maintenance (kvt_engine_tick from the sweeper; shutdown stops it before the flush) */
    pthread_mutex_t tick_mu;
    double last_tick;
    /* lifecycle */
    volatile int shutting_down;
    bool shut_done, flush_ok;
    pthread_mutex_t shut_mu;
    /* counters */
    pthread_mutex_t cmu;
    kvt_server_counters c;
    kvt_ns_stats *ns_stats;   /* per-namespace counters (admins' /stats) */
    uint64_t id_counter;
    uint32_t n_active;        /* HTTP requests between first callback and completion (cmu) */
    uint32_t pins_running;    /* pin requests computing their prefix (cmu; at most KVT_SRV_MAX_PINS) */
    /* connections */
    kvt_conn_guard *guard;
    pthread_t sweeper;
    bool sweeper_started, stop_sweeper;
    pthread_mutex_t swmu;
    pthread_cond_t swcv;
    /* tokenize budget: prompt text bytes being tokenized right now (tmu) */
    pthread_mutex_t tmu;
    pthread_cond_t tcv;
    uint64_t tok_in_use;
    /* parse budget: estimated tree bytes of the requests holding a parsed body right now (pmu) */
    pthread_mutex_t pmu;
    uint64_t parse_in_use;
};

/* shutting_down is set once by kvt_server_shutdown and read by connection threads: atomic. */
static bool server_stopping(kvt_server *s) { return __atomic_load_n(&s->shutting_down, __ATOMIC_RELAXED) != 0; }

/* Per-HTTP-request state (MHD con_cls). */
typedef struct conn_ctx {
    kvt_server *s;
    char *body;
    size_t len, cap;
    bool too_large, responded;
    int route;
    int status;
    double t0;
    char method[16];
    char path[160];
    job *j;
    bool streamed;
    const char *tenant;   /* the caller's tenant (--api-keys; borrowed from the keyring), NULL if none */
    bool admin;           /* may call /stats, /metrics and /admin/... */
    uint64_t expect_len;  /* Content-Length (0 when absent), checked against max_body_mb */
    bool trim;            /* a large body or tree was freed: hand the heap back (on_completed) */
} conn_ctx;

enum { R_NONE = 0, R_CHAT, R_COMPL, R_MODELS, R_MODEL_ONE, R_HEALTH, R_STATS, R_METRICS, R_FLUSH, R_PREFIXES, R_DRAIN, R_PIN, R_PINS };

/* ---------------------------------------------------------------------------------------------
 * Jobs
 * ------------------------------------------------------------------------------------------- */
static void job_unref(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r > 0) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->prompt);
    for (uint32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->buf);
    free(j->res.tokens);
    free(j->cres.tokens);
    free(j->bias_ids);
    free(j->bias_vals);
    kvt_api_out_free(j->out);
    kvt_json_constraint_free(j->jc);
    free(j);
}

/* Appends bytes to the job buffer; caller holds j->mu. */
static void job_append(job *j, const char *p, size_t n) {
    if (j->oom || n == 0) return;
    if (j->len + n + 1 > j->cap) {
        size_t nc = j->cap ? j->cap * 2 : 1024;
        while (nc < j->len + n + 1) nc *= 2;
        char *nb = realloc(j->buf, nc);
        if (!nb) {
            j->oom = true;
            return;
        }
        j->buf = nb;
        j->cap = nc;
    }
    memcpy(j->buf + j->len, p, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static kvt_api_resp_info job_info(const job *j) {
    kvt_api_resp_info ri = {.kind = j->kind, .id = j->id, .created = j->created, .model = j->model,
                            .n_prompt = j->n_prompt, .n_gen = j->gen_done,
                            .n_cached = j->cur_choice ? j->cached0 : j->res.n_reused, .finish = j->res.finish,
                            .reused_from = j->res.reused_from, .ttft_ms = j->res.ttft_ms,
                            .prefill_tps = j->res.prefill_tps, .decode_tps = j->res.decode_tps};
    return ri;
}

/* Appends the SSE bytes an output call produced (streaming); an allocation failure marks the job. */
static void job_append_sb(job *j, kvt_strbuf *sb) {
    if (sb->oom) j->oom = true;
    else if (sb->n) job_append(j, sb->p, sb->n);
    kvt_strbuf_free(sb);
}

static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---------------------------------------------------------------------------------------------
 * Jobs in the engine (callbacks on its scheduler thread)
 * ------------------------------------------------------------------------------------------- */
static bool on_token(void *ctx, int32_t id, const char *text, size_t len) {
    (void)id;
    job *j = ctx;
    pthread_mutex_lock(&j->mu);
    j->started = true;
    kvt_api_resp_info ri = job_info(j);
    kvt_strbuf sb = {0};
    if (!j->choice_started) {
        j->choice_started = true;
        kvt_api_out_begin(j->out, &ri, j->cur_choice, &sb);
    }
    kvt_api_out_text(j->out, &ri, j->cur_choice, text, len, &sb);
    job_append_sb(j, &sb);
    pthread_cond_broadcast(&j->cv);
    bool go = !job_cancelled(j) && !j->oom;
    pthread_mutex_unlock(&j->mu);
    return go;
}

static void on_logprobs(void *ctx, const kvt_token_logprobs *lp) {
    job *j = ctx;
    pthread_mutex_lock(&j->mu);
    kvt_api_out_logprobs(j->out, j->cur_choice, lp);
    pthread_mutex_unlock(&j->mu);
}

static void append_sse_error(job *j, int http, const char *type, const char *code, const char *msg) {
    kvt_api_err e;
    kvt_api_set_err(&e, http, type, NULL, code, "%s", msg);
    char *js = kvt_api_error_json(&e);
    if (!js) return;
    job_append(j, "data: ", 6);
    job_append(j, js, strlen(js));
    job_append(j, "\n\n", 2);
    free(js);
}

static void choice_done(void *ctx, kvt_status st);

/* Hands choice ci of j to the engine (follow_up: ahead of the waiting requests, so the choices of an
 * n > 1 request run back to back). On an error the engine did not take it (choice_done not called). */
static kvt_status submit_choice(job *j, uint32_t ci, bool follow_up) {
    kvt_gen_request *rq = &j->rq;
    memset(rq, 0, sizeof *rq);
    rq->prompt = j->prompt;
    rq->n_prompt = j->n_prompt;
    rq->max_tokens = j->max_tokens;
    rq->sampling = j->sampling;
    rq->sampling.seed = j->sampling.seed + ci;
    rq->ns = j->ns;
    rq->stop = (const char *const *)j->stop;
    rq->n_stop = j->n_stop;
    rq->render_special = j->render_special;
    rq->n_logprobs = j->n_logprobs;
    rq->on_logprobs = j->n_logprobs ? on_logprobs : NULL;
    if (j->jc) {
        kvt_json_constraint_reset(j->jc);
        rq->proc.apply = kvt_json_constraint_apply;
        rq->proc.accept = kvt_json_constraint_accept;
        rq->proc.ctx = j->jc;
    }
    rq->on_token = on_token;
    rq->cb_ctx = j;
    rq->cancel = &j->cancel;
    pthread_mutex_lock(&j->mu);
    j->ci = ci;
    j->cur_choice = ci;
    j->choice_started = false;
    pthread_mutex_unlock(&j->mu);
    free(j->cres.tokens);
    memset(&j->cres, 0, sizeof j->cres);
    j->cerr[0] = 0;
    return kvt_engine_submit(j->srv->e, rq, &j->cres, j->cerr, sizeof j->cerr, follow_up, choice_done, j);
}

/* The job ended (st: its last choice's status, err its message): the response's tail, JOB_DONE, and
 * the engine's reference and place among the server's jobs given up. */
static void job_finish(job *j, kvt_status st, const char *err) {
    kvt_server *s = j->srv;
    pthread_mutex_lock(&j->mu);
    j->st = st;
    snprintf(j->err, sizeof j->err, "%s", err[0] ? err : kvt_status_str(st));
    free(j->res.tokens);
    j->res = j->cres;
    j->cres.tokens = NULL;
    if (j->stream) {
        kvt_api_resp_info ri = job_info(j);
        if (st == KVT_OK && !j->oom) {
            if (j->include_usage) {
                kvt_strbuf sb = {0};
                kvt_api_out_usage(&ri, &sb);
                job_append_sb(j, &sb);
            }
        } else if (j->started) {
            if (st == KVT_ERR_CANCELLED)
                append_sse_error(j, 503, "server_error", "shutting_down", "generation cancelled");
            else if (st == KVT_ERR_POOL_EXHAUSTED)
                append_sse_error(j, 503, "server_error", "out_of_memory", j->err);
            else if (st == KVT_ERR_STALE) /* the model file changed (engine.h) */
                append_sse_error(j, 503, "server_error", "model_changed", j->err);
            else
                append_sse_error(j, 500, "server_error", NULL, j->err);
        }
        job_append(j, "data: [DONE]\n\n", 14);
    }
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);

    kvt_ns_stats_add(s->ns_stats, j->ns, 1, 0, 0);
    if (st == KVT_ERR_CANCELLED) {
        pthread_mutex_lock(&s->cmu);
        s->c.cancelled++;
        pthread_mutex_unlock(&s->cmu);
    }
    pthread_mutex_lock(&s->qmu);
    if (j->prev) j->prev->next = j->next;
    else s->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    j->prev = j->next = NULL;
    s->n_jobs--;
    /* after s->jobs no longer holds it (the shutdown path cancels s->jobs under qmu): qmu then
     * j->mu is the order start_job uses too */
    job_unref(j);
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->qmu);
}

/* The engine's done callback for one choice (on its scheduler thread): the choice's end, then the
 * next choice (n choices: one generation each over the same prompt; the second and later reuse the
 * first's prompt KV from the RAM tier, the prompt-boundary snapshot, so only the first prefills) or
 * the job's end. */
static void choice_done(void *ctx, kvt_status st) {
    job *j = ctx;
    const uint32_t ci = j->ci;
    /* the namespace's tokens, as the engine counts them: every choice that began */
    if (j->cres.n_prompt) kvt_ns_stats_add(j->srv->ns_stats, j->ns, 0, j->cres.n_prompt, j->cres.n_reused);
    if (st == KVT_OK && j->cres.finish == KVT_FINISH_CANCELLED) st = KVT_ERR_CANCELLED;
    if (st == KVT_OK) {
        pthread_mutex_lock(&j->mu);
        if (ci == 0) j->cached0 = j->cres.n_reused;
        j->gen_done += j->cres.n_gen;
        kvt_api_resp_info ri = job_info(j);
        ri.finish = j->cres.finish;
        kvt_strbuf sb = {0};
        if (!j->choice_started) kvt_api_out_begin(j->out, &ri, ci, &sb);
        j->choice_started = true;
        kvt_api_out_end(j->out, &ri, ci, j->cres.finish, &sb);
        job_append_sb(j, &sb);
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        if (ci + 1 < j->n_choices) {
            st = submit_choice(j, ci + 1, true);
            if (st == KVT_OK) return;
        }
    }
    job_finish(j, st, j->cerr);
}

/* Hands j to the engine (taking one reference for it until job_finish). False when the server is
 * full (*full) or shutting down. */
static bool start_job(kvt_server *s, job *j, bool *full) {
    *full = false;
    pthread_mutex_lock(&s->qmu);
    if (s->shutting_down) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    /* generations never take the last conn_reserve connections (kept for /health and new requests) */
    uint32_t cap = s->o.max_queue;
    uint32_t by_conns = s->o.max_connections > s->o.conn_reserve ? s->o.max_connections - s->o.conn_reserve : 1;
    if (cap > by_conns) cap = by_conns;
    if (s->n_jobs >= cap) {
        pthread_mutex_unlock(&s->qmu);
        *full = true;
        return false;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->srv = s;
    j->next = s->jobs;
    if (s->jobs) s->jobs->prev = j;
    s->jobs = j;
    s->n_jobs++;
    pthread_mutex_unlock(&s->qmu);
    /* refused at once (the model file changed, the engine is stopping): the job ends here */
    kvt_status st = submit_choice(j, 0, false);
    if (st != KVT_OK) job_finish(j, st, j->cerr);
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * HTTP helpers
 * ------------------------------------------------------------------------------------------- */
static const char *route_allow(int route);
static MHD_Result_t send_body(struct MHD_Connection *c, conn_ctx *x, int status, char *body, const char *ctype) {
    if (!body) {
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 405) MHD_add_response_header(r, "Allow", route_allow(x->route));
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    MHD_Result_t ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    x->status = status;
    x->responded = true;
    return ret;
}

static MHD_Result_t send_json(struct MHD_Connection *c, conn_ctx *x, int status, char *body) {
    return send_body(c, x, status, body, "application/json");
}

static MHD_Result_t send_err(struct MHD_Connection *c, conn_ctx *x, int http, const char *type, const char *param,
                             const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static MHD_Result_t send_err(struct MHD_Connection *c, conn_ctx *x, int http, const char *type, const char *param,
                             const char *code, const char *fmt, ...) {
    kvt_api_err e;
    memset(&e, 0, sizeof e);
    e.http = http;
    e.type = type;
    e.param = param;
    e.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_json(c, x, http, kvt_api_error_json(&e));
}

static MHD_Result_t send_api_err(struct MHD_Connection *c, conn_ctx *x, const kvt_api_err *e) {
    return send_json(c, x, e->http, kvt_api_error_json(e));
}

/* The methods a route answers (the Allow header of its 405). */
static const char *route_allow(int route) {
    switch (route) {
    case R_CHAT:
    case R_COMPL:
    case R_FLUSH:
    case R_DRAIN: return "POST";
    case R_PIN: return "POST, DELETE";
    default: return "GET";
    }
}

static int route_of(const char *path, const char *method, bool *method_ok) {
    int r = R_NONE;
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/chat/completions")) r = R_CHAT;
    else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/completions")) r = R_COMPL;
    else if (!strcmp(path, "/v1/models") || !strcmp(path, "/models")) r = R_MODELS;
    else if (!strncmp(path, "/v1/models/", 11) && path[11]) r = R_MODEL_ONE;
    else if (!strcmp(path, "/health")) r = R_HEALTH;
    else if (!strcmp(path, "/stats")) r = R_STATS;
    else if (!strcmp(path, "/metrics")) r = R_METRICS;
    else if (!strcmp(path, "/admin/cache/flush")) r = R_FLUSH;
    else if (!strcmp(path, "/admin/cache/prefixes")) r = R_PREFIXES;
    else if (!strcmp(path, "/admin/drain")) r = R_DRAIN;
    else if (!strcmp(path, "/v1/cache/pin")) r = R_PIN;
    else if (!strcmp(path, "/v1/cache/pins")) r = R_PINS;
    /* the method must be one of route_allow's list (", "-separated; GET admits HEAD) */
    const char *allow = route_allow(r);
    const size_t ml = strlen(method);
    *method_ok = false;
    for (const char *a = allow; *a && !*method_ok; a += strspn(a, ", ")) {
        const size_t al = strcspn(a, ",");
        *method_ok = (al == ml && !strncmp(a, method, ml)) || (al == 3 && !strncmp(a, "GET", 3) && !strcmp(method, "HEAD"));
        a += al;
    }
    return r;
}

/* The counters for /stats and /metrics, each read under the lock that owns it. The queue is the
 * engine's: queued is its depth (st->rows_queued), in_flight the server's other unfinished jobs. */
static void counters_snapshot(kvt_server *s, const kvt_engine_stats *st, kvt_server_counters *cs) {
    pthread_mutex_lock(&s->cmu);
    *cs = s->c;
    pthread_mutex_unlock(&s->cmu);
    pthread_mutex_lock(&s->qmu);
    const uint64_t jobs = s->n_jobs;
    pthread_mutex_unlock(&s->qmu);
    cs->queued = st->rows_queued;
    cs->in_flight = jobs > cs->queued ? jobs - cs->queued : 0;
    kvt_conn_guard_stats gs;
    kvt_conn_guard_stats_get(s->guard, &gs);
    cs->conn_open = gs.open;
    cs->conn_refused = gs.refused;
    cs->conn_evicted = gs.evicted;
    cs->conn_timed_out = gs.timed_out + gs.slow; /* the rate is the body's other deadline */
}

static void count_status(kvt_server *s, int status) {
    pthread_mutex_lock(&s->cmu);
    s->c.total++;
    if (status >= 200 && status < 300) s->c.ok++;
    else if (status >= 400 && status < 500) s->c.client_errors++;
    else if (status >= 500) s->c.server_errors++;
    if (status == 503 && server_stopping(s)) s->c.rejected_shutdown++;
    pthread_mutex_unlock(&s->cmu);
}

/* ---------------------------------------------------------------------------------------------
 * Endpoints
 * ------------------------------------------------------------------------------------------- */
static MHD_Result_t do_models(struct MHD_Connection *c, conn_ctx *x, const char *one) {
    kvt_server *s = x->s;
    if (one && !kvt_api_model_matches(one, s->o.model_alias, kvt_engine_model_name(s->e), s->o.model_path))
        return send_err(c, x, 404, "invalid_request_error", "model", "model_not_found",
                        "The model '%.100s' does not exist", one);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started_at);
    cJSON_AddStringToObject(m, "owned_by", "kvtier");
    cJSON_AddNumberToObject(m, "context_length", kvt_engine_n_ctx(s->e));
    cJSON *root = m;
    if (!one) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(root, "data");
        cJSON_AddItemToArray(d, m);
    }
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, x, 200, body);
}

/* POST /admin/cache/flush[?wait=shared]: the SSD tier's durability boundary, and the shared tier's
 * pending publishes ("shared": pending, lost, error); with wait=shared it also waits until those
 * reached Redis (503 when some did not). Both waits together are bounded by the flush timeout.
 * POST /admin/drain[?wait=shared] (drain): the same answer after every RAM-tier entry moved to the
 * SSD tier (kvt_engine_drain; "demoted" counts them); 409 without the SSD tier. */
static MHD_Result_t do_flush(struct MHD_Connection *c, conn_ctx *x, bool drain) {
    const char *wait = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
    if (wait && strcmp(wait, "shared") != 0)
        return send_err(c, x, 400, "invalid_request_error", "wait", NULL, "wait must be \"shared\"");
    const bool wait_shared = wait != NULL;
    kvt_flush_result fr;
    memset(&fr, 0, sizeof fr);
    double t = x->s->o.shutdown_timeout_s;
    if (t > 60) t = 60;
    if (t < 1) t = 1;
    const double t0 = kvt_now_ms();
    if (!drain) kvt_engine_flush(x->s->e, (uint32_t)(t * 1000.0), &fr);
    else if (kvt_engine_drain(x->s->e, (uint32_t)(t * 1000.0), &fr) == KVT_ERR_UNSUPPORTED)
        return send_err(c, x, 409, "invalid_request_error", NULL, "ssd_tier_off",
                        "drain needs the SSD tier: this server runs without --ssd-cache, so RAM entries have nowhere to go");
    kvt_engine_stats *st = calloc(2, sizeof *st); /* before / after the shared wait */
    if (!st) return send_err(c, x, 503, "server_error", NULL, "out_of_memory", "out of memory");
    kvt_engine_stats_get(x->s->e, &st[0]);
    bool shared_ok = true;
    if (st[0].shared_enabled && wait_shared) {
        const double left = t * 1000.0 - (kvt_now_ms() - t0);
        kvt_engine_shared_flush(x->s->e, left > 1 ? (uint32_t)left : 1);
    }
    kvt_engine_stats_get(x->s->e, &st[1]);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddBoolToObject(root, "durable", fr.durable);
    cJSON_AddNumberToObject(root, "entries", (double)fr.entries);
    if (drain) cJSON_AddNumberToObject(root, "demoted", (double)fr.demoted);
    if (fr.durable) {
        cJSON_AddNumberToObject(root, "records_written", (double)fr.records_written);
        cJSON_AddNumberToObject(root, "elapsed_ms", fr.elapsed_ms);
        cJSON_AddNumberToObject(root, "longest_durable_prefix_tokens", (double)fr.longest_durable_prefix_tokens);
    } else {
        cJSON_AddNumberToObject(root, "pending", (double)fr.pending_blocks);
        cJSON_AddNumberToObject(root, "failed", (double)fr.failed);
        cJSON_AddNumberToObject(root, "dropped", (double)fr.dropped);
        cJSON_AddStringToObject(root, "reason", fr.reason);
    }
    if (st[1].shared_enabled) {
        const uint64_t lost = (st[1].shared_dropped + st[1].shared_oom_errors) - (st[0].shared_dropped + st[0].shared_oom_errors);
        cJSON *sh = cJSON_AddObjectToObject(root, "shared");
        cJSON_AddNumberToObject(sh, "pending", (double)st[1].shared_queue_blocks);
        cJSON_AddNumberToObject(sh, "lost", (double)lost);
        cJSON_AddBoolToObject(sh, "waited", wait_shared);
        const char *why = st[1].shared_last_error[0] ? st[1].shared_last_error
                          : st[1].shared_queue_blocks        ? "publishes still pending"
                          : lost                              ? "Redis refused or dropped publishes"
                                                              : "";
        cJSON_AddStringToObject(sh, "error", wait_shared && (st[1].shared_queue_blocks || lost) ? why : "");
        shared_ok = !wait_shared || (st[1].shared_queue_blocks == 0 && lost == 0);
    }
    free(st);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, x, fr.durable && shared_ok ? 200 : 503, body);
}

/* GET /admin/cache/prefixes[?limit=N]: the N (1-100, default 20) longest prefixes the RAM tier
 * holds, longest first, each with its first tokens as text (the dashboard's admin table). */
#define PREFIXES_MAX 100
static MHD_Result_t do_prefixes(struct MHD_Connection *c, conn_ctx *x) {
    const char *ls = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    long limit = 20;
    if (ls) {
        char *end = NULL;
        errno = 0;
        limit = strtol(ls, &end, 10);
        if (errno || end == ls || *end || limit < 1 || limit > PREFIXES_MAX)
            return send_err(c, x, 400, "invalid_request_error", "limit", NULL, "limit must be an integer from 1 to %d",
                            PREFIXES_MAX);
    }
    kvt_cached_prefix *p = calloc((size_t)limit, sizeof *p);
    if (!p) return send_err(c, x, 503, "server_error", NULL, "out_of_memory", "out of memory");
    uint64_t total = 0;
    const uint32_t n = kvt_engine_cache_prefixes(x->s->e, p, (uint32_t)limit, &total);
    const kvt_tokenizer *tok = kvt_engine_tokenizer(x->s->e);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddNumberToObject(root, "total", (double)total);
    cJSON *d = cJSON_AddArrayToObject(root, "data");
    for (uint32_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)p[i].root);
        cJSON_AddNumberToObject(o, "tokens", p[i].tokens);
        cJSON_AddNumberToObject(o, "bytes", (double)p[i].bytes);
        cJSON_AddNumberToObject(o, "units", p[i].units);
        cJSON_AddNumberToObject(o, "idle_s", p[i].idle_s);
        cJSON_AddStringToObject(o, "root", hex);
        /* the ids are the cache's own, yet detokenize defensively: valid UTF-8 only (U+FFFD) */
        size_t rl = 0, sl = 0;
        char *raw = kvt_detokenize(tok, p[i].head, p[i].n_head, true, &rl);
        char *text = raw ? kvt_utf8_sanitize(raw, rl, &sl) : NULL;
        cJSON_AddStringToObject(o, "head", text ? text : "");
        free(text);
        free(raw);
        cJSON_AddItemToArray(d, o);
    }
    free(p);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, x, 200, body);
}

/* Streaming body reader: runs on the connection thread, fed by the engine's token callback. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->rd == j->len && j->state != JOB_DONE) {
        timed_wait(&j->cv, &j->mu, 100);
        if (j->rd == j->len && j->state != JOB_DONE && client_gone(j->fd)) {
            job_cancel(j);
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    if (j->rd == j->len) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = j->len - j->rd;
    if (n > max) n = max;
    memcpy(buf, j->buf + j->rd, n);
    j->rd += n;
    pthread_mutex_unlock(&j->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (j->state != JOB_DONE) job_cancel(j); /* response torn down early: the client is gone */
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

static MHD_Result_t job_error_response(struct MHD_Connection *c, conn_ctx *x, job *j) {
    switch (j->st) {
    case KVT_ERR_RANGE:
        return send_err(c, x, 400, "invalid_request_error", "messages", "context_length_exceeded", "%s", j->err);
    case KVT_ERR_INVALID_ARG:
        return send_err(c, x, 400, "invalid_request_error", NULL, NULL, "%s", j->err);
    case KVT_ERR_POOL_EXHAUSTED:
        return send_err(c, x, 503, "server_error", NULL, "out_of_memory", "%s", j->err);
    case KVT_ERR_STALE: /* the model file changed after it was loaded (engine.h) */
        return send_err(c, x, 503, "server_error", NULL, "model_changed", "%s", j->err);
    case KVT_ERR_CANCELLED:
        return send_err(c, x, 503, "server_error", NULL, "shutting_down", "generation cancelled (%s)",
                        server_stopping(x->s) ? "server shutting down" : "client gone");
    default:
        return send_err(c, x, 500, "server_error", NULL, NULL, "generation failed: %s", j->err);
    }
}

/* True unless a text of len bytes needs more than room tokens even if every token were the
 * vocabulary's longest (the cheap refusal before tokenizing). */
static bool prompt_can_fit(const kvt_tokenizer *tok, size_t len, int64_t room) {
    if (room <= 0) return false;
    uint64_t maxb = kvt_tokenizer_max_token_bytes(tok);
    return (len + maxb - 1) / maxb <= (uint64_t)room;
}

/* 400 context_length_exceeded. n_prompt: the prompt's token count, or with more_than the room it
 * exceeded (tokenizing stopped there), or -1 when refused before tokenizing (text_len bytes). */
static MHD_Result_t send_ctx_err(struct MHD_Connection *c, conn_ctx *x, const char *param, uint32_t n_ctx,
                                 int64_t max_tokens, size_t text_len, int64_t n_prompt, bool more_than) {
    char comp[96] = "";
    if (max_tokens > 0) snprintf(comp, sizeof comp, " with %lld tokens for the completion", (long long)max_tokens);
    if (n_prompt < 0)
        return send_err(c, x, 400, "invalid_request_error", param, "context_length_exceeded",
                        "This model's maximum context length is %u tokens. However, your prompt of %zu bytes needs "
                        "more tokens than fit%s.", n_ctx, text_len, comp);
    return send_err(c, x, 400, "invalid_request_error", param, "context_length_exceeded",
                    "This model's maximum context length is %u tokens. However, your prompt has %s%lld tokens%s.",
                    n_ctx, more_than ? "more than " : "", (long long)n_prompt, comp);
}

/* The tokenize budget: waits until len more text bytes fit in tokenize_budget_mb (a text larger
 * than the whole budget runs alone). Bounded: every holder tokenizes at most a context's worth. */
static void tok_budget_acquire(kvt_server *s, size_t len) {
    uint64_t budget = (uint64_t)s->o.tokenize_budget_mb << 20;
    pthread_mutex_lock(&s->tmu);
    while (s->tok_in_use > 0 && s->tok_in_use + len > budget) pthread_cond_wait(&s->tcv, &s->tmu);
    s->tok_in_use += len;
    pthread_mutex_unlock(&s->tmu);
}

static void tok_budget_release(kvt_server *s, size_t len) {
    pthread_mutex_lock(&s->tmu);
    s->tok_in_use -= len;
    pthread_cond_broadcast(&s->tcv);
    pthread_mutex_unlock(&s->tmu);
}

/* The tool-call syntax a constrained tool choice must produce: a JSON call object wrapped in the
 * format's markers. tool_schema: anyOf over the allowed functions of
 * {"name": const NAME, <args_key>: PARAMETERS}. */
static cJSON *tool_call_schema(const kvt_api_req *rq, const char *args_key) {
    cJSON *any = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, rq->tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        if (rq->tool_choice == KVT_TOOL_CHOICE_NAMED && strcmp(name, rq->tool_choice_name)) continue;
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "object");
        cJSON *pr = cJSON_AddObjectToObject(o, "properties");
        cJSON *nm = cJSON_AddObjectToObject(pr, "name");
        cJSON_AddStringToObject(nm, "const", name);
        if (cJSON_IsObject(pa)) cJSON_AddItemToObject(pr, args_key, cJSON_Duplicate(pa, true));
        else cJSON_AddItemToObject(pr, args_key, cJSON_Parse("{\"type\":\"object\"}"));
        cJSON *req = cJSON_AddArrayToObject(o, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
        cJSON_AddBoolToObject(o, "additionalProperties", false);
        cJSON_AddItemToArray(any, o);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "anyOf", any);
    return root;
}

/* The job's output shaping (reasoning, tool-call format, logprobs, n) and constraint. Sends a 400
 * (x->responded) for a schema that cannot be compiled. */
static MHD_Result_t setup_output(struct MHD_Connection *c, conn_ctx *x, job *j, const kvt_api_req *rq,
                                 const char *rendered, size_t rendered_len) {
    kvt_server *s = x->s;
    const char *src = rq->kind == KVT_API_CHAT ? kvt_chat_template_source(kvt_engine_chat(s->e)) : NULL;
    kvt_tool_format fmt = rq->tools && rq->tool_choice != KVT_TOOL_CHOICE_NONE ? kvt_tool_format_detect(src) : KVT_TOOL_FMT_NONE;
    bool reasoning = rq->kind == KVT_API_CHAT && kvt_tool_reasoning_detect(src);
    bool in_think = reasoning && rendered && kvt_tool_prompt_opens_think(rendered, rendered_len);
    pthread_mutex_lock(&s->cmu);
    uint64_t seed = kvt_now_ns() ^ (++s->id_counter * 0xd1b54a32d192ed03ull);
    pthread_mutex_unlock(&s->cmu);
    kvt_api_out_opts oo = {.kind = rq->kind, .stream = rq->stream, .n_choices = rq->n_choices, .tool_format = fmt,
                           .reasoning = reasoning, .in_think = in_think, .tools_json = rq->tools_json,
                           .parallel_tool_calls = rq->parallel_tool_calls, .logprobs = rq->logprobs,
                           .top_logprobs = rq->top_logprobs, .tok = kvt_engine_tokenizer(s->e), .id_seed = seed};
    if (kvt_api_out_create(&oo, &j->out) != KVT_OK) return send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
    j->n_choices = rq->n_choices;
    j->n_logprobs = rq->logprobs ? 1 + rq->top_logprobs : 0;
    j->render_special = fmt != KVT_TOOL_FMT_NONE;
    if (rq->n_bias) {
        j->bias_ids = malloc(rq->n_bias * sizeof *j->bias_ids);
        j->bias_vals = malloc(rq->n_bias * sizeof *j->bias_vals);
        if (!j->bias_ids || !j->bias_vals) return send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(j->bias_ids, rq->bias_ids, rq->n_bias * sizeof *j->bias_ids);
        memcpy(j->bias_vals, rq->bias_vals, rq->n_bias * sizeof *j->bias_vals);
    }
    /* constrained decoding: response_format, or a required / named tool choice */
    bool tool_forced = fmt != KVT_TOOL_FMT_NONE &&
                       (rq->tool_choice == KVT_TOOL_CHOICE_REQUIRED || rq->tool_choice == KVT_TOOL_CHOICE_NAMED);
    if (rq->tools && !tool_forced && rq->tool_choice >= KVT_TOOL_CHOICE_REQUIRED && fmt == KVT_TOOL_FMT_NONE)
        return send_err(c, x, 400, "invalid_request_error", "tool_choice", NULL,
                        "tool_choice needs a chat template with a known tool-call format (this model's has none)");
    if (!tool_forced && rq->response_format == KVT_FMT_TEXT) return MHD_YES;
    char err[256] = "";
    kvt_json_schema *sc = NULL;
    kvt_status st;
    const char *param;
    if (tool_forced) {
        const char *pre = "", *suf = "", *args_key = "arguments";
        if (!kvt_toolcall_syntax(fmt, &pre, &suf, &args_key))
            return send_err(c, x, 400, "invalid_request_error", "tool_choice", NULL,
                            "tool_choice '%s' cannot be enforced for the %s tool-call format (use auto)",
                            rq->tool_choice == KVT_TOOL_CHOICE_NAMED ? "{function}" : "required", kvt_tool_format_name(fmt));
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s%s", in_think ? "</think>\n\n" : "", pre);
        cJSON *ts = tool_call_schema(rq, args_key);
        st = ts ? kvt_json_schema_get(ts, prefix, suf, &sc, err, sizeof err) : KVT_ERR_NOMEM;
        cJSON_Delete(ts);
        param = "tools";
    } else {
        const char *prefix = in_think ? "</think>\n\n" : NULL;
        st = kvt_json_schema_get(rq->response_format == KVT_FMT_JSON_SCHEMA ? rq->json_schema : NULL, prefix, NULL, &sc,
                                 err, sizeof err);
        param = "response_format";
    }
    if (st == KVT_OK) st = kvt_json_constraint_create(kvt_engine_tokenizer(s->e), sc, &j->jc);
    kvt_json_schema_release(sc);
    if (st == KVT_ERR_NOMEM) return send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
    if (st != KVT_OK)
        return send_err(c, x, 400, "invalid_request_error", param, "invalid_schema", "%s", err[0] ? err : kvt_status_str(st));
    j->render_special = true; /* the constrained bytes are exactly the streamed text */
    return MHD_YES;
}

/* The one request parser of every endpoint that builds a prompt: kvt_api_parse, then the request's
 * namespace from the caller's tenant (authentication, handle_first) and its cache_salt
 * (kvt_tenant_namespace; docs/server.md "Tenants and namespaces"). False with *ae set. */
static bool parse_request(conn_ctx *x, kvt_api_kind kind, cJSON **root, kvt_api_req *rq, kvt_api_err *ae) {
    if (!kvt_api_parse(kind, x->body, x->len, kvt_engine_n_vocab(x->s->e), root, rq, ae)) return false;
    if (kvt_tenant_namespace(x->tenant, rq->cache_salt, rq->ns, sizeof rq->ns)) return true;
    kvt_api_set_err(ae, 400, "invalid_request_error", "cache_salt", NULL, "'cache_salt' is too long");
    kvt_api_req_free(rq);
    cJSON_Delete(*root);
    *root = NULL;
    return false;
}

/* The prompt of a parsed request as token ids, the one path of the completion, chat and pin
 * endpoints (any request field they honour applies to all three): chat messages (with tools,
 * template variables) through the model's template, text through the tokenizer, or the ids as
 * given. Bounded: at most `room` tokens; a text that needs more even if every token were the longest
 * one in the vocabulary is refused before tokenizing; otherwise tokenizing stops as soon as the
 * count passes `room`, and the text bytes tokenized at once are capped by the tokenize budget. On
 * success *ids (malloc'd, caller frees) holds *n_ids >= 1 ids, *rendered (malloc'd or NULL) the
 * rendered chat text and *text_len its length; otherwise the error was sent (x->responded). */
static MHD_Result_t build_prompt(struct MHD_Connection *c, conn_ctx *x, kvt_api_req *rq, int64_t room, int32_t **ids_out,
                                 int64_t *n_out, char **rendered_out, size_t *text_len_out) {
    kvt_server *s = x->s;
    const kvt_api_kind kind = rq->kind;
    const kvt_tokenizer *tok = kvt_engine_tokenizer(s->e);
    const uint32_t n_ctx = kvt_engine_n_ctx(s->e);
    MHD_Result_t ret = MHD_YES;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    char *rendered = NULL;
    const char *param = kind == KVT_API_CHAT ? "messages" : "prompt";
    const char *text = NULL;
    size_t text_len = 0;
    uint32_t tflags = KVT_TOK_PARSE_SPECIAL;
    if (kind == KVT_API_CHAT) {
        for (size_t i = 0; i < rq->n_msgs; i++) text_len += rq->msgs[i].content_len;
        if (rq->tools_json) text_len += strlen(rq->tools_json);
        if (!prompt_can_fit(tok, text_len, room)) {
            ret = send_ctx_err(c, x, param, n_ctx, rq->max_tokens, text_len, -1, false);
            goto out;
        }
        char err[256] = "";
        /* the template renders tools, tool calls, tool results and its variables (kvt_chat_render_ex;
         * a template that raises is the client's 400 with the template's message) */
        kvt_chat_opts co = {.add_generation_prompt = true, .tools_json = rq->tools_json, .kwargs_json = rq->kwargs_json};
        kvt_status st = kvt_chat_render_ex(kvt_engine_chat(s->e), rq->msgs, rq->n_msgs, &co, &rendered, &text_len, err,
                                           sizeof err);
        if (st != KVT_OK) {
            ret = send_err(c, x, st == KVT_ERR_NOMEM ? 500 : 400, st == KVT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                           rq->tools_json && strstr(err, "tool") ? "tools" : "messages", NULL, "cannot render messages: %s",
                           err[0] ? err : kvt_status_str(st));
            goto out;
        }
        text = rendered;
    } else if (rq->prompt_ids) {
        ids = rq->prompt_ids;
        n_ids = rq->n_prompt_ids;
        rq->prompt_ids = NULL; /* ours now */
        if (n_ids > room) {
            ret = send_ctx_err(c, x, param, n_ctx, rq->max_tokens, 0, n_ids, false);
            goto out;
        }
    } else {
        text = rq->prompt_text;
        text_len = rq->prompt_text_len;
        if (kvt_tokenizer_add_bos(tok)) tflags |= KVT_TOK_ADD_SPECIAL;
    }
    if (text) {
        if (!prompt_can_fit(tok, text_len, room)) {
            ret = send_ctx_err(c, x, param, n_ctx, rq->max_tokens, text_len, -1, false);
            goto out;
        }
        ids = malloc((size_t)(room + 1) * sizeof *ids);
        if (!ids) {
            ret = send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
        tok_budget_acquire(s, text_len);
        n_ids = kvt_tokenize_limit(tok, text, text_len, tflags, ids, room + 1, room);
        tok_budget_release(s, text_len);
        if (n_ids < 0) {
            ret = send_err(c, x, 500, "server_error", NULL, NULL, "tokenization failed (out of memory)");
            goto out;
        }
        if (n_ids > room) {
            ret = send_ctx_err(c, x, param, n_ctx, rq->max_tokens, text_len, room, true);
            goto out;
        }
    }
    if (n_ids <= 0) {
        ret = send_err(c, x, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty after tokenization");
        goto out;
    }
    *ids_out = ids;
    *n_out = n_ids;
    *rendered_out = rendered;
    *text_len_out = text_len;
    return MHD_YES;
out:
    free(ids);
    free(rendered);
    return ret;
}

static MHD_Result_t do_generate(struct MHD_Connection *c, conn_ctx *x) {
    kvt_server *s = x->s;
    kvt_api_kind kind = x->route == R_CHAT ? KVT_API_CHAT : KVT_API_COMPLETION;
    uint32_t n_ctx = kvt_engine_n_ctx(s->e);
    cJSON *root = NULL;
    kvt_api_req rq;
    kvt_api_err ae;
    memset(&ae, 0, sizeof ae);
    if (!parse_request(x, kind, &root, &rq, &ae)) return send_api_err(c, x, &ae);
    MHD_Result_t ret;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    char *rendered = NULL; /* chat: the rendered template text */
    job *j = NULL;
    if (!kvt_api_model_matches(rq.model, s->o.model_alias, kvt_engine_model_name(s->e), s->o.model_path)) {
        ret = send_err(c, x, 404, "invalid_request_error", "model", "model_not_found",
                       "The model '%.100s' does not exist (this server serves '%.100s')", rq.model, s->model_name);
        goto out;
    }
    /* the prompt may take at most `room` tokens: the context less max_tokens (or less one generated token) */
    const int64_t room = rq.max_tokens > 0 ? (int64_t)n_ctx - rq.max_tokens : (int64_t)n_ctx - 1;
    size_t text_len = 0;
    if ((ret = build_prompt(c, x, &rq, room, &ids, &n_ids, &rendered, &text_len)) != MHD_YES || x->responded) goto out;
    uint64_t max_tokens = rq.max_tokens > 0 ? (uint64_t)rq.max_tokens : n_ctx - (uint64_t)n_ids;

    j = calloc(1, sizeof *j);
    if (!j) {
        ret = send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    x->j = j;
    if ((ret = setup_output(c, x, j, &rq, rendered, text_len)) != MHD_YES || x->responded) goto out;
    j->kind = kind;
    j->stream = rq.stream;
    j->include_usage = rq.stream && rq.include_usage;
    j->prompt = ids;
    ids = NULL;
    j->n_prompt = (uint32_t)n_ids;
    j->max_tokens = (uint32_t)max_tokens;
    j->sampling = rq.sampling;
    j->sampling.bias_ids = j->bias_ids; /* the request's arrays die with it: the job's copies */
    j->sampling.bias_vals = j->bias_vals;
    pthread_mutex_lock(&s->cmu);
    uint64_t ctr = ++s->id_counter;
    pthread_mutex_unlock(&s->cmu);
    if (!rq.seed_given) j->sampling.seed = kvt_now_ns() ^ (ctr * 0x9e3779b97f4a7c15ull);
    for (uint32_t i = 0; i < rq.n_stop; i++) {
        j->stop[i] = strdup(rq.stop[i]);
        if (!j->stop[i]) break;
        j->n_stop++;
    }
    j->created = (int64_t)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == KVT_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)((uint64_t)j->created * 0x100000001b3ull ^ ctr * 0x9e3779b97f4a7c15ull));
    j->model = s->model_name;
    memcpy(j->ns, rq.ns, sizeof j->ns);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;

    bool full;
    if (!start_job(s, j, &full)) {
        ret = full ? send_err(c, x, 503, "server_error", NULL, "server_busy", "too many queued requests")
                   : send_err(c, x, 503, "server_error", NULL, "shutting_down", "server is shutting down");
        goto out;
    }
    /* Wait until the job is done (or, streaming, until its first token), watching the client. */
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE && !(j->stream && j->started)) {
        timed_wait(&j->cv, &j->mu, 100);
        if (!job_cancelled(j) && client_gone(j->fd)) job_cancel(j);
    }
    bool done = j->state == JOB_DONE;
    kvt_status st = j->st;
    pthread_mutex_unlock(&j->mu);

    if (done && st != KVT_OK) {
        ret = job_error_response(c, x, j);
    } else if (j->stream) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
        if (!r) {
            job_unref(j);
            ret = MHD_NO;
            goto out;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        x->status = 200;
        x->responded = true;
        x->streamed = true;
    } else {
        pthread_mutex_lock(&j->mu);
        kvt_api_resp_info ri = job_info(j);
        char *body = j->oom ? NULL : kvt_api_out_response(j->out, &ri);
        pthread_mutex_unlock(&j->mu);
        ret = send_json(c, x, 200, body);
    }
out:
    free(ids);
    free(rendered);
    kvt_api_req_free(&rq);
    cJSON_Delete(root);
    return ret;
}

/* ---------------------------------------------------------------------------------------------
 * Pinned prefixes (docs/server.md, "Pinned prefixes")
 * ------------------------------------------------------------------------------------------- */
static cJSON *pin_json(const kvt_pin_info *p) {
    cJSON *o = cJSON_CreateObject();
    char id[24];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)p->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "cache.pin");
    cJSON_AddNumberToObject(o, "tokens", p->n_tokens);
    cJSON_AddNumberToObject(o, "tokens_in_ram", p->tokens_in_ram);
    cJSON_AddNumberToObject(o, "bytes", (double)p->bytes);
    cJSON_AddBoolToObject(o, "warm", p->warm);
    cJSON_AddNumberToObject(o, "created", (double)p->created);
    if (p->expires) {
        cJSON_AddNumberToObject(o, "ttl", (double)(p->expires - p->created));
        cJSON_AddNumberToObject(o, "expires_at", (double)p->expires);
    } else {
        cJSON_AddNullToObject(o, "ttl");
        cJSON_AddNullToObject(o, "expires_at");
    }
    return o;
}

/* GET /v1/cache/pins */
static MHD_Result_t do_pins(struct MHD_Connection *c, conn_ctx *x) {
    kvt_pin_info *v = NULL;
    uint32_t n = 0;
    if (kvt_engine_pins(x->s->e, &v, &n) != KVT_OK) return send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    uint64_t pinned = 0;
    cJSON *d = cJSON_AddArrayToObject(root, "data");
    for (uint32_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(d, pin_json(&v[i]));
        pinned += v[i].bytes;
    }
    cJSON_AddNumberToObject(root, "pinned_bytes", (double)pinned);
    free(v);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, x, 200, body);
}

/* The pin id of a DELETE by id: 16 hex digits. */
static bool parse_pin_id(const char *s, uint64_t *id) {
    if (!s || strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *id = v;
    return true;
}

#define KVT_PIN_MAX_TTL_S 315360000.0 /* ten years */
/* Pins computing at once: each holds a connection thread and one engine row while it waits, and
 * --max-queue does not count them, so they get their own small bound (503 server_busy past it). */
#define KVT_SRV_MAX_PINS 4

/* POST /v1/cache/pin: pin a prompt (`prompt`: text or token ids, or `messages` + `tools`: the
 * completion and chat endpoints' own parsing and templating, build_prompt), optional `ttl` seconds.
 * DELETE /v1/cache/pin: the same body, or {"id": ...} / ?id=, unpins. */
static MHD_Result_t do_pin(struct MHD_Connection *c, conn_ctx *x) {
    kvt_server *s = x->s;
    const bool del = !strcmp(x->method, "DELETE");
    uint64_t id = 0;
    const char *qid = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
    if (del && qid) {
        if (!parse_pin_id(qid, &id)) return send_err(c, x, 400, "invalid_request_error", "id", NULL, "id must be 16 hex digits");
        goto unpin;
    }
    /* which request shape: `messages` (chat) or `prompt` (completion); the parser words any syntax error */
    cJSON *peek = x->body ? cJSON_ParseWithLength(x->body, x->len) : NULL;
    const bool chat = cJSON_GetObjectItemCaseSensitive(peek, "messages") != NULL;
    const bool has_prompt = cJSON_GetObjectItemCaseSensitive(peek, "prompt") != NULL;
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(peek, "id");
    bool by_id = del && jid && !chat && !has_prompt;
    bool id_ok = by_id && cJSON_IsString(jid) && parse_pin_id(jid->valuestring, &id);
    bool neither = peek && cJSON_IsObject(peek) && !chat && !has_prompt && !by_id;
    cJSON_Delete(peek);
    if (by_id) {
        if (!id_ok) return send_err(c, x, 400, "invalid_request_error", "id", NULL, "id must be a string of 16 hex digits");
        goto unpin;
    }
    if (neither)
        return send_err(c, x, 400, "invalid_request_error", "prompt", NULL,
                        "a pin needs 'prompt' (text or token ids) or 'messages' (with optional 'tools')%s",
                        del ? ", or the pin's 'id'" : "");
    cJSON *root = NULL;
    kvt_api_req rq;
    kvt_api_err ae;
    memset(&ae, 0, sizeof ae);
    if (!parse_request(x, chat ? KVT_API_CHAT : KVT_API_COMPLETION, &root, &rq, &ae)) return send_api_err(c, x, &ae);
    MHD_Result_t ret = MHD_YES;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    char *rendered = NULL;
    size_t text_len = 0;
    double ttl = 0;
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "ttl");
    if (jt && !cJSON_IsNull(jt)) {
        if (del || !cJSON_IsNumber(jt) || !(jt->valuedouble >= 1 && jt->valuedouble <= KVT_PIN_MAX_TTL_S)) {
            ret = send_err(c, x, 400, "invalid_request_error", "ttl", NULL,
                           del ? "ttl belongs to a pin, not to an unpin" : "ttl must be a number of seconds in [1, %.0f]",
                           KVT_PIN_MAX_TTL_S);
            goto out;
        }
        ttl = jt->valuedouble;
    }
    if (!kvt_api_model_matches(rq.model, s->o.model_alias, kvt_engine_model_name(s->e), s->o.model_path)) {
        ret = send_err(c, x, 404, "invalid_request_error", "model", "model_not_found",
                       "The model '%.100s' does not exist (this server serves '%.100s')", rq.model, s->model_name);
        goto out;
    }
    if ((ret = build_prompt(c, x, &rq, (int64_t)kvt_engine_n_ctx(s->e) - 1, &ids, &n_ids, &rendered, &text_len)) != MHD_YES ||
        x->responded)
        goto out;
    /* the namespace: the one a completion of this body gets (the caller's tenant and cache_salt) */
    const char *ns = rq.ns;
    if (del) {
        id = kvt_engine_pin_id(s->e, ids, (uint32_t)n_ids, ns);
    } else {
        kvt_pin_info pi;
        char err[256] = "";
        const int64_t expires = ttl > 0 ? (int64_t)time(NULL) + (int64_t)ttl : 0;
        pthread_mutex_lock(&s->cmu);
        const bool room_left = s->pins_running < KVT_SRV_MAX_PINS;
        if (room_left) s->pins_running++;
        pthread_mutex_unlock(&s->cmu);
        if (!room_left) {
            ret = send_err(c, x, 503, "server_error", NULL, "server_busy", "%d pins are being computed; retry",
                           KVT_SRV_MAX_PINS);
            goto out;
        }
        kvt_status st = kvt_engine_pin(s->e, ids, (uint32_t)n_ids, ns, expires, &pi, err, sizeof err);
        pthread_mutex_lock(&s->cmu);
        s->pins_running--;
        pthread_mutex_unlock(&s->cmu);
        switch (st) {
        case KVT_OK: {
            /* the pin's row ran in the caller's namespace: its prompt counts there like a request's */
            kvt_ns_stats_add(s->ns_stats, ns, 1, (uint64_t)n_ids, pi.cached_tokens);
            cJSON *o = pin_json(&pi);
            cJSON_AddNumberToObject(o, "cached_tokens", pi.cached_tokens);
            cJSON_AddNumberToObject(o, "pin_budget_bytes", (double)pi.budget);
            char *body = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            ret = send_json(c, x, 200, body);
            break;
        }
        case KVT_ERR_RANGE: ret = send_err(c, x, 409, "invalid_request_error", "prompt", "pin_budget_exceeded", "%s", err); break;
        case KVT_ERR_UNSUPPORTED: ret = send_err(c, x, 409, "invalid_request_error", NULL, "ram_tier_off", "%s", err); break;
        case KVT_ERR_INVALID_ARG: ret = send_err(c, x, 400, "invalid_request_error", "prompt", NULL, "%s", err); break;
        case KVT_ERR_STALE: ret = send_err(c, x, 503, "server_error", NULL, "model_changed", "%s", err); break;
        case KVT_ERR_CANCELLED:
            ret = send_err(c, x, 503, "server_error", NULL, "shutting_down", "pin cancelled (server shutting down)");
            break;
        case KVT_ERR_POOL_EXHAUSTED:
        case KVT_ERR_NOT_FOUND: ret = send_err(c, x, 503, "server_error", NULL, "server_busy", "%s", err); break;
        default: ret = send_err(c, x, 500, "server_error", NULL, NULL, "pin failed: %s", err); break;
        }
        goto out;
    }
out:
    free(ids);
    free(rendered);
    kvt_api_req_free(&rq);
    cJSON_Delete(root);
    if (!del || x->responded) return ret;
unpin:
    if (kvt_engine_unpin(s->e, id) != KVT_OK)
        return send_err(c, x, 404, "invalid_request_error", "id", "pin_not_found", "no pin %016llx", (unsigned long long)id);
    char body[96];
    snprintf(body, sizeof body, "{\"id\":\"%016llx\",\"object\":\"cache.pin\",\"deleted\":true}", (unsigned long long)id);
    return send_json(c, x, 200, strdup(body));
}

/* ---------------------------------------------------------------------------------------------
 * MHD callbacks
 * ------------------------------------------------------------------------------------------- */
/* The conn_guard entry of a connection (NULL once closed or when untracked). Always read fresh from
 * the library: the notify callback clears it when the connection closes. */
static kvt_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (kvt_conn *)ci->socket_context : NULL;
}

static void addr_key(const struct sockaddr *sa, char *out, size_t n) {
    snprintf(out, n, "?");
    if (!sa) return;
    if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)n);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)n);
}

/* libmicrohttpd's own messages (one per dropped connection under attack) go to the debug log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    KVT_DEBUG("http: %s", msg);
}

static MHD_Result_t on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    (void)addrlen;
    kvt_server *s = cls;
    char key[64];
    addr_key(addr, key, sizeof key);
    if (kvt_conn_guard_admit(s->guard, key, kvt_now_ms())) return MHD_YES;
    KVT_DEBUG("refused a connection from %s (connection limits)", key);
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    kvt_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        char key[64];
        addr_key(ai ? ai->client_addr : NULL, key, sizeof key);
        *socket_context = kvt_conn_guard_open(s->guard, key, fi ? fi->connect_fd : -1, kvt_now_ms());
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        kvt_conn_guard_close(s->guard, *socket_context);
        *socket_context = NULL;
    }
}

/* The guard's kill function: a shutdown makes the connection's thread see end-of-stream and close
 * the socket itself (the fd stays valid until then, see conn_guard.c invariant 1). */
static void kill_conn(void *ctx, int fd) {
    (void)ctx;
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

/* Counts request headers and their bytes (MHD_KeyValueIterator). */
typedef struct hdr_acc {
    unsigned n;
    size_t bytes;
} hdr_acc;
static MHD_Result_t count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    hdr_acc *a = cls;
    a->n++;
    a->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}
static MHD_Result_t handle_first(struct MHD_Connection *c, conn_ctx *x, const char *url, const char *method) {
    kvt_server *s = x->s;
    hdr_acc qa = {0, 0}; /* the library hands the path and the query arguments over separately */
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, count_header, &qa);
    if (strlen(url) + qa.bytes > KVT_MAX_URL_BYTES)
        return send_err(c, x, 414, "invalid_request_error", NULL, "uri_too_long", "request URI exceeds %d bytes",
                        KVT_MAX_URL_BYTES);
    hdr_acc ha = {0, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &ha);
    if (ha.n > KVT_MAX_HEADERS || ha.bytes > KVT_MAX_HEADER_BYTES)
        return send_err(c, x, 431, "invalid_request_error", NULL, "request_header_fields_too_large",
                        "request has %u headers / %zu header bytes (limits %d / %d)", ha.n, ha.bytes, KVT_MAX_HEADERS,
                        KVT_MAX_HEADER_BYTES);
    int web = kvt_web_answer(c, method, x->path); /* the pages (web.h): static, served without the key */
    if (web) {
        x->status = web > 0 ? web : 500;
        x->responded = true;
        return web > 0 ? MHD_YES : MHD_NO;
    }
    /* Who is calling: --api-key is the one admin key without a tenant; an --api-keys entry gives its
     * tenant and admin flag. Both are compared in constant time, always both. Without either, every
     * caller is an admin without a tenant (as before keys existed). */
    x->admin = true;
    if (s->o.api_key || s->o.keys) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        const bool master = s->o.api_key && kvt_api_check_bearer(auth, s->o.api_key);
        const kvt_key_entry *ke = kvt_keyring_match(s->o.keys, auth);
        if (!master && !ke)
            return send_err(c, x, 401, "invalid_request_error", NULL, "invalid_api_key",
                            auth ? "Incorrect API key provided" : "Missing API key (Authorization: Bearer KEY)");
        x->admin = master || ke->admin;
        x->tenant = master ? NULL : ke->tenant;
    }
    /* Admins only: /admin/..., the pins (/v1/cache/...: they spend the server's RAM for everyone) and
     * the server-wide counters (their cache figures would show other tenants' activity: a side
     * channel, docs/server.md "Tenants and namespaces"). */
    if (!x->admin && (!strncmp(x->path, "/admin/", 7) || !strncmp(x->path, "/v1/cache/", 10) || !strcmp(x->path, "/stats") ||
                      !strcmp(x->path, "/metrics")))
        return send_err(c, x, 403, "permission_error", NULL, "admin_required", "%.100s needs an admin API key",
                        x->path);
    if (server_stopping(s))
        return send_err(c, x, 503, "server_error", NULL, "shutting_down", "server is shutting down");
    bool method_ok;
    x->route = route_of(x->path, method, &method_ok);
    if (x->route == R_NONE)
        return send_err(c, x, 404, "invalid_request_error", NULL, "not_found", "unknown path %.100s", x->path);
    if (!method_ok)
        return send_err(c, x, 405, "invalid_request_error", NULL, "method_not_allowed",
                        "method %.16s is not allowed on %.100s", method, x->path);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    uint64_t max = (uint64_t)s->o.max_body_mb << 20;
    if (cl && strtoull(cl, NULL, 10) > max)
        return send_err(c, x, 413, "invalid_request_error", NULL, "request_too_large",
                        "request body exceeds %u MB", s->o.max_body_mb);
    if (cl) x->expect_len = strtoull(cl, NULL, 10);
    return MHD_YES;
}

/* Parse bounds (see the top of this file): counts the body's JSON values without allocating,
 * refuses a body over the value cap (413) or with a number that underflows (400, naming its
 * field), takes the body's estimated tree memory from the parse budget (503 when exhausted; a body
 * larger than the whole budget still runs when nothing else holds any) for as long as
 * do_generate (or do_pin) holds the tree, and marks a large request for malloc_trim. Other syntax errors are
 * left to kvt_api_parse, which words them. */
/* The route that takes the JSON body: generation, or a pin. */
static MHD_Result_t body_handler(struct MHD_Connection *c, conn_ctx *x) {
    return x->route == R_PIN ? do_pin(c, x) : do_generate(c, x);
}

static MHD_Result_t generate_bounded(struct MHD_Connection *c, conn_ctx *x) {
    kvt_server *s = x->s;
    uint64_t max_nodes = ((uint64_t)s->o.max_body_mb << 20) / KVT_SRV_BODY_BYTES_PER_NODE;
    kvt_json_scan_result sr;
    if (x->len >= KVT_SRV_TRIM_BYTES) x->trim = true;
    if (!kvt_json_scan(x->body ? x->body : "", x->len, (size_t)max_nodes, &sr)) {
        if (sr.fail == KVT_JSON_TOO_MANY)
            return send_err(c, x, 413, "invalid_request_error", NULL, "request_too_large",
                            "request body has more than %llu JSON values (one per %u bytes of the %u MB body "
                            "limit)", (unsigned long long)max_nodes, KVT_SRV_BODY_BYTES_PER_NODE, s->o.max_body_mb);
        if (sr.fail == KVT_JSON_UNDERFLOW) {
            char key[72];
            bool named = kvt_json_key_label(sr.key, sr.key_len, key, sizeof key);
            return send_err(c, x, 400, "invalid_request_error", named ? key : NULL, NULL,
                            "%s%s%sthe number at byte %zu is too small for a double (it would be read as 0)",
                            named ? "'" : "", named ? key : "", named ? "': " : "", sr.off);
        }
        return body_handler(c, x); /* kvt_api_parse words the syntax error */
    }
    uint64_t est = (uint64_t)x->len + (uint64_t)sr.nodes * KVT_SRV_PARSE_NODE_BYTES;
    if (est <= KVT_SRV_PARSE_SMALL_BYTES) return body_handler(c, x);
    uint64_t budget = (uint64_t)s->o.parse_budget_mb << 20;
    pthread_mutex_lock(&s->pmu);
    bool fits = s->parse_in_use == 0 || s->parse_in_use + est <= budget;
    if (fits) s->parse_in_use += est;
    pthread_mutex_unlock(&s->pmu);
    if (!fits)
        return send_err(c, x, 503, "server_error", NULL, "server_busy",
                        "too many large request bodies are being parsed; retry (parse budget %u MB)",
                        s->o.parse_budget_mb);
    if (est >= KVT_SRV_TRIM_BYTES) x->trim = true;
    MHD_Result_t ret = body_handler(c, x);
    pthread_mutex_lock(&s->pmu);
    s->parse_in_use -= est;
    pthread_mutex_unlock(&s->pmu);
    return ret;
}

static MHD_Result_t on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    kvt_server *s = cls;
    conn_ctx *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        x->s = s;
        x->t0 = kvt_now_ms();
        snprintf(x->method, sizeof x->method, "%s", method);
        snprintf(x->path, sizeof x->path, "%s", url);
        *con_cls = x;
        pthread_mutex_lock(&s->cmu);
        s->n_active++;
        pthread_mutex_unlock(&s->cmu);
        kvt_conn_guard_stage(s->guard, conn_of(c), KVT_CONN_BODY, x->t0); /* headers are in */
        return handle_first(c, x, url, method);
    }
    if (*upload_size == 0) kvt_conn_guard_stage(s->guard, conn_of(c), KVT_CONN_BUSY, kvt_now_ms()); /* body is in */
    else kvt_conn_guard_progress(s->guard, conn_of(c), *upload_size); /* the minimum body rate */
    if (x->responded) { /* early error answered; drop any body */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        uint64_t max = (uint64_t)s->o.max_body_mb << 20;
        if (x->too_large || x->len + n > max) {
            x->too_large = true;
        } else {
            if (x->len + n + 1 > x->cap) {
                /* sized by Content-Length (checked against the limit) at once: no doubling copies */
                size_t nc = x->cap ? x->cap * 2 : x->expect_len >= x->len + n ? (size_t)x->expect_len + 1 : 4096;
                while (nc < x->len + n + 1) nc *= 2;
                char *nb = realloc(x->body, nc);
                if (!nb) return MHD_NO;
                x->body = nb;
                x->cap = nc;
            }
            memcpy(x->body + x->len, upload_data, n);
            x->len += n;
            x->body[x->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->too_large)
        return send_err(c, x, 413, "invalid_request_error", NULL, "request_too_large", "request body exceeds %u MB",
                        s->o.max_body_mb);
    switch (x->route) {
    case R_CHAT:
    case R_COMPL: return generate_bounded(c, x);
    case R_MODELS: return do_models(c, x, NULL);
    case R_MODEL_ONE: return do_models(c, x, x->path + 11);
    case R_HEALTH: {
        char why[256];
        if (kvt_engine_model_changed(s->e, why, sizeof why)) /* every request would fail: not healthy */
            return send_err(c, x, 503, "server_error", NULL, "model_changed", "the model file changed after it was loaded (%s)", why);
        return send_json(c, x, 200, strdup("{\"status\":\"ok\"}"));
    }
    case R_STATS:
    case R_METRICS: {
        kvt_engine_stats st;
        memset(&st, 0, sizeof st);
        kvt_engine_stats_get(s->e, &st);
        kvt_server_counters cs;
        counters_snapshot(s, &st, &cs);
        if (x->route == R_STATS) return send_json(c, x, 200, kvt_api_stats_json(&st, &cs, s->model_name, s->ns_stats));
        return send_body(c, x, 200, kvt_api_metrics_text(&st, &cs), "text/plain; version=0.0.4; charset=utf-8");
    }
    case R_FLUSH: return do_flush(c, x, false);
    case R_PREFIXES: return do_prefixes(c, x);
    case R_DRAIN: return do_flush(c, x, true);
    case R_PIN: /* DELETE ?id= needs no body */
        if (!x->len && MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id")) return do_pin(c, x);
        return generate_bounded(c, x);
    case R_PINS: return do_pins(c, x);
    default: return send_err(c, x, 404, "invalid_request_error", NULL, "not_found", "unknown path");
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    kvt_server *s = cls;
    /* keep-alive: the next request's headers are due within the header deadline */
    if (c) kvt_conn_guard_stage(s->guard, conn_of(c), KVT_CONN_WAITING, kvt_now_ms());
    conn_ctx *x = *con_cls;
    if (!x) return;
    *con_cls = NULL;
    if (x->status) count_status(s, x->status);
    pthread_mutex_lock(&s->cmu);
    s->n_active--;
    pthread_mutex_unlock(&s->cmu);
    if (x->streamed) {
        pthread_mutex_lock(&s->cmu);
        s->c.streamed++;
        pthread_mutex_unlock(&s->cmu);
    }
    job *j = x->j;
    double ms = kvt_now_ms() - x->t0;
    if (j) {
        pthread_mutex_lock(&j->mu);
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && j->state != JOB_DONE) job_cancel(j);
        kvt_gen_result r = j->res;
        bool done = j->state == JOB_DONE;
        pthread_mutex_unlock(&j->mu);
        const char *tier = r.reused_from == KVT_TIER_RAM ? "ram" : r.reused_from == KVT_TIER_SSD ? "ssd" : r.reused_from == KVT_TIER_SHARED ? "shared" : "none";
        KVT_INFO("%s %s %d %s%s%sprompt=%u reused=%u(%s) gen=%u ttft=%.1fms prefill=%.1f tok/s decode=%.1f tok/s "
                 "total=%.0fms%s%s",
                 x->method, x->path, x->status, x->tenant ? "tenant=" : "", x->tenant ? x->tenant : "",
                 x->tenant ? " " : "", j->n_prompt, r.n_reused, tier, r.n_gen, r.ttft_ms, r.prefill_tps,
                 r.decode_tps, ms,
                 done ? "" : " (client gone)", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " [aborted]");
        job_unref(j);
    } else {
        KVT_INFO("%s %s %d %.1fms", x->method, x->path, x->status, ms);
    }
    bool trim = KVT_SRV_MALLOC_TRIM && (x->trim || x->cap >= KVT_SRV_TRIM_BYTES);
    free(x->body);
    free(x);
    /* glibc keeps freed heap (per-thread arenas) resident; a large body or tree is handed back */
    if (trim) malloc_trim(0);
}

/* ---------------------------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------------------------- */
void kvt_server_opts_default(kvt_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->shutdown_timeout_s = 120;
    o->max_body_mb = 16;
    o->max_queue = 256;
    o->max_connections = 256;
    o->max_conns_per_addr = 32;
    o->conn_reserve = 16;
    o->header_timeout_s = 10;
    o->body_timeout_s = 60;
    o->tokenize_budget_mb = 4;
    o->body_min_rate = 1024;
    o->parse_budget_mb = 64;
}

static void *sweeper_main(void *arg) {
    kvt_server *s = arg;
    pthread_mutex_lock(&s->swmu);
    while (!s->stop_sweeper) {
        timed_wait(&s->swcv, &s->swmu, 250);
        if (s->stop_sweeper) break;
        pthread_mutex_unlock(&s->swmu);
        uint32_t n = kvt_conn_guard_sweep(s->guard, kvt_now_ms());
        if (n) KVT_DEBUG("closed %u connection(s) past their header/body deadline", n);
        pthread_mutex_lock(&s->tick_mu); /* idle demotion once a second (the engine skips while busy) */
        if (!server_stopping(s) && kvt_now_ms() - s->last_tick >= 1000.0) {
            kvt_engine_tick(s->e);
            s->last_tick = kvt_now_ms();
        }
        pthread_mutex_unlock(&s->tick_mu);
        pthread_mutex_lock(&s->swmu);
    }
    pthread_mutex_unlock(&s->swmu);
    return NULL;
}

static bool is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
    }
    return false;
}

kvt_status kvt_server_create(const kvt_server_opts *o, kvt_engine *e, kvt_server **out, char *err, size_t errlen) {
    *out = NULL;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%u", (unsigned)o->port);
    int gai = getaddrinfo(o->host, portstr, &hints, &ai);
    if (gai != 0 || !ai)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "cannot resolve host '%s': %s", o->host, gai_strerror(gai));
    if (!is_loopback(ai->ai_addr) && !o->api_key && !o->keys && !o->insecure) {
        freeaddrinfo(ai);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "refusing to bind non-loopback address '%s' without --api-key (pass --insecure to allow)",
                        o->host);
    }
    kvt_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return KVT_ERR_NOMEM;
    }
    s->o = *o;
    if (!s->o.max_queue) s->o.max_queue = 256;
    if (!s->o.max_connections) s->o.max_connections = 256;
    if (!s->o.max_body_mb) s->o.max_body_mb = 16;
    if (!s->o.max_conns_per_addr) s->o.max_conns_per_addr = 32;
    if (s->o.conn_reserve >= s->o.max_connections) s->o.conn_reserve = s->o.max_connections - 1;
    if (s->o.header_timeout_s <= 0) s->o.header_timeout_s = 10;
    if (s->o.body_timeout_s <= 0) s->o.body_timeout_s = 60;
    if (!s->o.tokenize_budget_mb) s->o.tokenize_budget_mb = 4;
    if (!s->o.parse_budget_mb) s->o.parse_budget_mb = 64;
    if (s->o.body_min_rate < 0) s->o.body_min_rate = 0;
    s->e = e;
    s->started_at = (int64_t)time(NULL);
    const char *mn = o->model_alias ? o->model_alias : kvt_engine_model_name(e);
    snprintf(s->model_name, sizeof s->model_name, "%s", mn ? mn : "model");
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_mutex_init(&s->tick_mu, NULL);
    s->last_tick = kvt_now_ms();
    pthread_mutex_init(&s->cmu, NULL);
    pthread_mutex_init(&s->shut_mu, NULL);
    pthread_mutex_init(&s->swmu, NULL);
    pthread_cond_init(&s->swcv, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_cond_init(&s->tcv, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    if (!(s->ns_stats = kvt_ns_stats_create(KVT_NS_STATS_MAX))) {
        freeaddrinfo(ai);
        kvt_server_free(s);
        return KVT_ERR_NOMEM;
    }
    kvt_conn_guard_opts go = {.max_conns = s->o.max_connections, .per_addr = s->o.max_conns_per_addr,
                              .header_s = s->o.header_timeout_s, .body_s = s->o.body_timeout_s,
                              .body_min_rate = s->o.body_min_rate, .body_grace_s = KVT_SRV_BODY_GRACE_S};
    if (kvt_conn_guard_create(&go, kill_conn, s, &s->guard) != KVT_OK) {
        freeaddrinfo(ai);
        kvt_server_free(s);
        return KVT_ERR_NOMEM;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* The library's own connection limit only backstops conn_guard's (which admits at most
     * max_connections): evicted connections still count there until their thread has closed them.
     * Its inactivity timeout stays long (a generation may be silent for minutes); the header/body
     * deadlines are conn_guard's. */
    s->mhd = MHD_start_daemon(flags, o->port, on_accept, s, (MHD_AccessHandlerCallback)on_access, s,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)s->o.max_connections * 2 + 16, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KVT_MHD_MEMORY_LIMIT,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_NOTIFY_COMPLETED,
                              on_completed, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        int en = errno;
        kvt_server_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "cannot listen on %s:%u: %s", o->host, (unsigned)o->port,
                        strerror(en));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) == 0) s->sweeper_started = true;
    else KVT_WARN("cannot start the connection sweeper: header/body deadlines are not enforced");
    *out = s;
    return KVT_OK;
}

uint16_t kvt_server_port(const kvt_server *s) { return s->port; }

bool kvt_server_shutdown(kvt_server *s) {
    pthread_mutex_lock(&s->shut_mu);
    if (s->shut_done) {
        pthread_mutex_unlock(&s->shut_mu);
        return s->flush_ok;
    }
    double t0 = kvt_now_ms();
    double budget = s->o.shutdown_timeout_s * 1000.0;
    double drain_until = t0 + budget * 0.75; /* leave a quarter of the budget for the flush */

    pthread_mutex_lock(&s->qmu);
    __atomic_store_n(&s->shutting_down, 1, __ATOMIC_RELAXED); /* read by connection threads */
    if (s->n_jobs) KVT_INFO("shutdown: draining %u request(s)", s->n_jobs);
    while (s->n_jobs && kvt_now_ms() < drain_until) timed_wait(&s->idle_cv, &s->qmu, 100);
    if (s->n_jobs) {
        KVT_WARN("shutdown: timeout reached, cancelling in-flight requests");
        for (job *j = s->jobs; j; j = j->next) job_cancel(j);
    }
    while (s->n_jobs) timed_wait(&s->idle_cv, &s->qmu, 100); /* cancelled rows end within a step */
    pthread_mutex_unlock(&s->qmu);
    pthread_mutex_lock(&s->tick_mu); /* no idle demotion from here on (server_stopping) */
    pthread_mutex_unlock(&s->tick_mu);
    /* Let the connection threads deliver the last responses (drained or cancelled) before the
     * listener and its connections are torn down. */
    for (;;) {
        pthread_mutex_lock(&s->cmu);
        uint32_t act = s->n_active;
        pthread_mutex_unlock(&s->cmu);
        if (act == 0 || kvt_now_ms() - t0 > budget * 0.9) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->mhd) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
    }
    double left = budget - (kvt_now_ms() - t0);
    if (left < 1000) left = 1000;
    kvt_flush_result fr;
    memset(&fr, 0, sizeof fr);
    const double t_flush = kvt_now_ms();
    kvt_engine_flush(s->e, (uint32_t)left, &fr);
    s->flush_ok = fr.durable;
    KVT_INFO("shutdown: flush %s (entries %llu, pending blocks %llu, dropped %llu, failed %llu)",
             fr.durable ? "durable" : "NOT durable", (unsigned long long)fr.entries,
             (unsigned long long)fr.pending_blocks, (unsigned long long)fr.dropped, (unsigned long long)fr.failed);
    /* the shared tier's queued publishes, within what is left of --shutdown-timeout */
    left -= kvt_now_ms() - t_flush;
    if (!kvt_engine_shared_flush(s->e, left > 200 ? (uint32_t)left : 200)) {
        kvt_engine_stats *st = calloc(1, sizeof *st);
        if (st) kvt_engine_stats_get(s->e, st);
        KVT_WARN("shutdown: %llu shared-tier publishes could not be sent within --shutdown-timeout%s%s",
                 st ? (unsigned long long)st->shared_queue_blocks : 0ull, st && st->shared_last_error[0] ? ": " : "",
                 st ? st->shared_last_error : "");
        free(st);
    }
    s->shut_done = true;
    pthread_mutex_unlock(&s->shut_mu);
    return s->flush_ok;
}

void kvt_server_free(kvt_server *s) {
    if (!s) return;
    if (s->mhd) kvt_server_shutdown(s); /* not yet shut down (without a listener no job ever started) */
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->idle_cv);
    if (s->sweeper_started) {
        pthread_mutex_lock(&s->swmu);
        s->stop_sweeper = true;
        pthread_cond_broadcast(&s->swcv);
        pthread_mutex_unlock(&s->swmu);
        pthread_join(s->sweeper, NULL);
    }
    kvt_conn_guard_free(s->guard); /* after the listener: its close notifications use the guard */
    pthread_mutex_destroy(&s->cmu);
    pthread_mutex_destroy(&s->shut_mu);
    pthread_mutex_destroy(&s->swmu);
    pthread_cond_destroy(&s->swcv);
    pthread_mutex_destroy(&s->tmu);
    pthread_cond_destroy(&s->tcv);
    pthread_mutex_destroy(&s->pmu);
    pthread_mutex_destroy(&s->tick_mu);
    kvt_ns_stats_free(s->ns_stats);
    free(s);
}

void kvt_server_block_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int kvt_server_wait_signal(volatile int *stop_flag) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    for (;;) {
        if (stop_flag && *stop_flag) return 0;
        struct timespec ts = {0, 250 * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0) return sig;
        if (sig < 0 && errno != EAGAIN && errno != EINTR) return 0;
    }
}
