/* server.c — HTTP plumbing (libmicrohttpd, thread per connection), the FIFO job queue and the single
 * generation worker. See server.h for the threading model.
 *
 * Abuse limits enforced here (docs/server.md, "Limits"):
 *   - connections: admission, eviction and header/body deadlines are decided by conn_guard.c; this
 *     file feeds it the library's connection events and shuts down the sockets it picks;
 *   - request line / headers: longer URLs and more or larger headers than the KVT_MAX_* limits get
 *     a JSON 414/431 here (what exceeds libmicrohttpd's own buffer gets the library's answer);
 *   - prompts: a text that cannot fit the context even at the vocabulary's longest token is refused
 *     before tokenizing; tokenizing stops once the count passes the context; the text bytes being
 *     tokenized at once across all requests are bounded by the tokenize budget. */
#include <arpa/inet.h>
#include <errno.h>
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

/* Request-line and header limits answered with JSON (below the library's own buffer, see
 * KVT_MHD_MEMORY_LIMIT, past which libmicrohttpd answers by itself). */
#define KVT_MAX_URL_BYTES 4096
#define KVT_MAX_HEADERS 64
#define KVT_MAX_HEADER_BYTES 16384
#define KVT_MHD_MEMORY_LIMIT (64u * 1024u)

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------- */
#define KVT_SRV_MAX_WORKERS 256

typedef enum job_state { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 } job_state;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* owners: connection ctx, queue/worker, streaming response */
    struct job *next;         /* FIFO link (server qmu) */
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
} job;

/* The cancel flag is set by connection threads and the shutdown path and polled by the worker
 * (engine/model forward): relaxed atomic accesses, so the flag is race-free (ThreadSanitizer). */
static void job_cancel(job *j) { __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED); }
static bool job_cancelled(job *j) { return __atomic_load_n(&j->cancel, __ATOMIC_RELAXED) != 0; }

struct kvt_server {
    kvt_server_opts o;
    kvt_engine *e;
    struct MHD_Daemon *mhd;
    uint16_t port;
    char model_name[256];
    int64_t started_at;
    /* queue */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;       /* new job / stop */
    pthread_cond_t idle_cv;   /* queue empty and worker idle */
    job *q_head, *q_tail;
    job *running[KVT_SRV_MAX_WORKERS]; /* jobs the workers run now (NULL = free slot) */
    uint32_t n_running;
    uint32_t n_queued;
    bool stop_worker;
    pthread_t workers[KVT_SRV_MAX_WORKERS]; /* one per engine row (kvt_engine_parallel) */
    uint32_t n_workers;
    bool worker_started;
    /* lifecycle */
    volatile int shutting_down;
    bool shut_done, flush_ok;
    pthread_mutex_t shut_mu;
    /* counters */
    pthread_mutex_t cmu;
    kvt_server_counters c;
    uint64_t id_counter;
    uint32_t n_active;        /* HTTP requests between first callback and completion (cmu) */
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
} conn_ctx;

enum { R_NONE = 0, R_CHAT, R_COMPL, R_MODELS, R_MODEL_ONE, R_HEALTH, R_STATS, R_METRICS, R_FLUSH };

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

static void job_append_owned(job *j, char *s) {
    if (!s) {
        j->oom = true;
        return;
    }
    job_append(j, s, strlen(s));
    free(s);
}

static kvt_api_resp_info job_info(const job *j) {
    kvt_api_resp_info ri = {.kind = j->kind, .id = j->id, .created = j->created, .model = j->model,
                            .n_prompt = j->res.n_prompt ? j->res.n_prompt : j->n_prompt,
                            .n_gen = j->res.n_gen, .n_cached = j->res.n_reused, .finish = j->res.finish};
    return ri;
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
 * Worker
 * ------------------------------------------------------------------------------------------- */
static bool on_token(void *ctx, int32_t id, const char *text, size_t len) {
    (void)id;
    job *j = ctx;
    pthread_mutex_lock(&j->mu);
    if (!j->started) {
        j->started = true;
        if (j->stream && j->kind == KVT_API_CHAT) {
            kvt_api_resp_info ri = job_info(j);
            job_append_owned(j, kvt_api_chunk_sse(&ri, NULL, 0, true, false, false));
        }
    }
    if (len > 0) {
        if (j->stream) {
            kvt_api_resp_info ri = job_info(j);
            job_append_owned(j, kvt_api_chunk_sse(&ri, text, len, false, false, false));
        } else {
            job_append(j, text, len);
        }
    }
    pthread_cond_broadcast(&j->cv);
    bool go = !job_cancelled(j) && !j->oom;
    pthread_mutex_unlock(&j->mu);
    return go;
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

static void run_job(kvt_server *s, job *j) {
    pthread_mutex_lock(&j->mu);
    bool skip = job_cancelled(j);
    j->state = JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);

    kvt_gen_result res;
    memset(&res, 0, sizeof res);
    char err[256] = "";
    kvt_status st;
    if (skip) {
        st = KVT_ERR_CANCELLED;
        snprintf(err, sizeof err, "request cancelled before it started");
        res.finish = KVT_FINISH_CANCELLED;
    } else {
        kvt_gen_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = j->prompt;
        rq.n_prompt = j->n_prompt;
        rq.max_tokens = j->max_tokens;
        rq.sampling = j->sampling;
        rq.stop = (const char *const *)j->stop;
        rq.n_stop = j->n_stop;
        rq.on_token = on_token;
        rq.cb_ctx = j;
        rq.cancel = &j->cancel;
        st = kvt_engine_generate(s->e, &rq, &res, err, sizeof err);
        if (st == KVT_OK && res.finish == KVT_FINISH_CANCELLED) st = KVT_ERR_CANCELLED;
    }

    pthread_mutex_lock(&j->mu);
    j->st = st;
    snprintf(j->err, sizeof j->err, "%s", err[0] ? err : kvt_status_str(st));
    free(j->res.tokens);
    j->res = res;
    if (j->stream) {
        kvt_api_resp_info ri = job_info(j);
        if (st == KVT_OK && !j->oom) {
            if (!j->started && j->kind == KVT_API_CHAT)
                job_append_owned(j, kvt_api_chunk_sse(&ri, NULL, 0, true, false, false));
            job_append_owned(j, kvt_api_chunk_sse(&ri, NULL, 0, false, true, false));
            if (j->include_usage) job_append_owned(j, kvt_api_chunk_sse(&ri, NULL, 0, false, false, true));
        } else if (j->started) {
            if (st == KVT_ERR_CANCELLED)
                append_sse_error(j, 503, "server_error", "shutting_down", "generation cancelled");
            else if (st == KVT_ERR_POOL_EXHAUSTED)
                append_sse_error(j, 503, "server_error", "out_of_memory", j->err);
            else
                append_sse_error(j, 500, "server_error", NULL, j->err);
        }
        job_append(j, "data: [DONE]\n\n", 14);
    }
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void *worker_main(void *arg) {
    kvt_server *s = arg;
    double last_tick = kvt_now_ms();
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (!s->q_head && !s->stop_worker) {
            timed_wait(&s->qcv, &s->qmu, 1000);
            if (!s->q_head && kvt_now_ms() - last_tick >= 1000.0) {
                pthread_mutex_unlock(&s->qmu);
                kvt_engine_tick(s->e); /* idle demotion (the engine runs it between steps) */
                last_tick = kvt_now_ms();
                pthread_mutex_lock(&s->qmu);
            }
        }
        if (!s->q_head) break; /* stop_worker and nothing left */
        job *j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        j->next = NULL;
        s->n_queued--; /* n_queued is qmu's; /stats reads it under qmu (counters_snapshot) */
        uint32_t slot = 0;
        while (s->running[slot]) slot++; /* n_running < n_workers <= KVT_SRV_MAX_WORKERS */
        s->running[slot] = j;
        s->n_running++;
        pthread_mutex_unlock(&s->qmu);

        pthread_mutex_lock(&s->cmu);
        s->c.in_flight++;
        pthread_mutex_unlock(&s->cmu);

        run_job(s, j);

        pthread_mutex_lock(&s->cmu);
        s->c.in_flight--;
        if (j->st == KVT_ERR_CANCELLED) s->c.cancelled++;
        pthread_mutex_unlock(&s->cmu);

        pthread_mutex_lock(&s->qmu);
        s->running[slot] = NULL;
        s->n_running--;
        /* only after s->running no longer points at it (the shutdown path cancels s->running under
         * qmu): qmu then j->mu is the order enqueue() uses too */
        job_unref(j);
        pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

/* Enqueues j (taking one extra reference for the worker). False when full or shutting down. */
static bool enqueue(kvt_server *s, job *j, bool *full) {
    *full = false;
    pthread_mutex_lock(&s->qmu);
    if (s->shutting_down || s->stop_worker) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    /* generations never take the last conn_reserve connections (kept for /health and new requests) */
    uint32_t cap = s->o.max_queue;
    uint32_t by_conns = s->o.max_connections > s->o.conn_reserve ? s->o.max_connections - s->o.conn_reserve : 1;
    if (cap > by_conns) cap = by_conns;
    if (s->n_queued + s->n_running >= cap) {
        pthread_mutex_unlock(&s->qmu);
        *full = true;
        return false;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * HTTP helpers
 * ------------------------------------------------------------------------------------------- */
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
    if (status == 405) {
        const char *allow = (x->route == R_CHAT || x->route == R_COMPL || x->route == R_FLUSH) ? "POST" : "GET";
        MHD_add_response_header(r, "Allow", allow);
    }
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

static int route_of(const char *path, const char *method, bool *method_ok) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    int r = R_NONE;
    bool want_post = false;
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/chat/completions")) r = R_CHAT, want_post = true;
    else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/completions")) r = R_COMPL, want_post = true;
    else if (!strcmp(path, "/v1/models") || !strcmp(path, "/models")) r = R_MODELS;
    else if (!strncmp(path, "/v1/models/", 11) && path[11]) r = R_MODEL_ONE;
    else if (!strcmp(path, "/health")) r = R_HEALTH;
    else if (!strcmp(path, "/stats")) r = R_STATS;
    else if (!strcmp(path, "/metrics")) r = R_METRICS;
    else if (!strcmp(path, "/admin/cache/flush")) r = R_FLUSH, want_post = true;
    *method_ok = want_post ? post : get;
    return r;
}

/* The counters for /stats and /metrics, each read under the lock that owns it. */
static void counters_snapshot(kvt_server *s, kvt_server_counters *cs) {
    pthread_mutex_lock(&s->cmu);
    *cs = s->c;
    pthread_mutex_unlock(&s->cmu);
    pthread_mutex_lock(&s->qmu);
    cs->queued = s->n_queued;
    pthread_mutex_unlock(&s->qmu);
    kvt_conn_guard_stats gs;
    kvt_conn_guard_stats_get(s->guard, &gs);
    cs->conn_open = gs.open;
    cs->conn_refused = gs.refused;
    cs->conn_evicted = gs.evicted;
    cs->conn_timed_out = gs.timed_out;
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

static MHD_Result_t do_flush(struct MHD_Connection *c, conn_ctx *x) {
    kvt_flush_result fr;
    memset(&fr, 0, sizeof fr);
    double t = x->s->o.shutdown_timeout_s;
    if (t > 60) t = 60;
    if (t < 1) t = 1;
    kvt_engine_flush(x->s->e, (uint32_t)(t * 1000.0), &fr);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddBoolToObject(root, "durable", fr.durable);
    cJSON_AddNumberToObject(root, "entries", (double)fr.entries);
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
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, x, fr.durable ? 200 : 503, body);
}

/* Streaming body reader: runs on the connection thread, fed by the worker. */
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

static MHD_Result_t do_generate(struct MHD_Connection *c, conn_ctx *x) {
    kvt_server *s = x->s;
    kvt_api_kind kind = x->route == R_CHAT ? KVT_API_CHAT : KVT_API_COMPLETION;
    const kvt_tokenizer *tok = kvt_engine_tokenizer(s->e);
    uint32_t n_ctx = kvt_engine_n_ctx(s->e);
    cJSON *root = NULL;
    kvt_api_req rq;
    kvt_api_err ae;
    memset(&ae, 0, sizeof ae);
    if (!kvt_api_parse(kind, x->body, x->len, kvt_engine_n_vocab(s->e), &root, &rq, &ae))
        return send_api_err(c, x, &ae);
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
    /* Tokenize, bounded. The prompt may take at most `room` tokens: the context less max_tokens
     * (or less one generated token). A text that needs more even if every token were the longest
     * one in the vocabulary is refused before tokenizing; otherwise tokenizing stops as soon as the
     * count passes `room`, and the text bytes tokenized at once are capped by the tokenize budget. */
    const char *param = kind == KVT_API_CHAT ? "messages" : "prompt";
    int64_t room = rq.max_tokens > 0 ? (int64_t)n_ctx - rq.max_tokens : (int64_t)n_ctx - 1;
    const char *text = NULL;
    size_t text_len = 0;
    uint32_t tflags = KVT_TOK_PARSE_SPECIAL;
    if (kind == KVT_API_CHAT) {
        for (size_t i = 0; i < rq.n_msgs; i++) text_len += rq.msgs[i].content_len;
        if (!prompt_can_fit(tok, text_len, room)) {
            ret = send_ctx_err(c, x, param, n_ctx, rq.max_tokens, text_len, -1, false);
            goto out;
        }
        char err[256] = "";
        kvt_status st = kvt_chat_render(kvt_engine_chat(s->e), rq.msgs, rq.n_msgs, true, &rendered, &text_len, err,
                                        sizeof err);
        if (st != KVT_OK) {
            ret = send_err(c, x, st == KVT_ERR_NOMEM ? 500 : 400, st == KVT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                           "messages", NULL, "cannot render messages: %s", err[0] ? err : kvt_status_str(st));
            goto out;
        }
        text = rendered;
    } else if (rq.prompt_ids) {
        ids = rq.prompt_ids;
        n_ids = rq.n_prompt_ids;
        rq.prompt_ids = NULL;
        if (n_ids > room) {
            ret = send_ctx_err(c, x, param, n_ctx, rq.max_tokens, 0, n_ids, false);
            goto out;
        }
    } else {
        text = rq.prompt_text;
        text_len = rq.prompt_text_len;
        if (kvt_tokenizer_add_bos(tok)) tflags |= KVT_TOK_ADD_SPECIAL;
    }
    if (text) {
        if (!prompt_can_fit(tok, text_len, room)) {
            ret = send_ctx_err(c, x, param, n_ctx, rq.max_tokens, text_len, -1, false);
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
            ret = send_ctx_err(c, x, param, n_ctx, rq.max_tokens, text_len, room, true);
            goto out;
        }
    }
    if (n_ids <= 0) {
        ret = send_err(c, x, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty after tokenization");
        goto out;
    }
    uint64_t max_tokens = rq.max_tokens > 0 ? (uint64_t)rq.max_tokens : n_ctx - (uint64_t)n_ids;

    j = calloc(1, sizeof *j);
    if (!j) {
        ret = send_err(c, x, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->kind = kind;
    j->stream = rq.stream;
    j->include_usage = rq.stream && rq.include_usage;
    j->prompt = ids;
    ids = NULL;
    j->n_prompt = (uint32_t)n_ids;
    j->max_tokens = (uint32_t)max_tokens;
    j->sampling = rq.sampling;
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
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    x->j = j;

    bool full;
    if (!enqueue(s, j, &full)) {
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
        char *body = j->oom ? NULL : kvt_api_response_json(&ri, j->buf ? j->buf : "", j->len);
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
    if (s->o.api_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (!kvt_api_check_bearer(auth, s->o.api_key))
            return send_err(c, x, 401, "invalid_request_error", NULL, "invalid_api_key",
                            auth ? "Incorrect API key provided" : "Missing API key (Authorization: Bearer KEY)");
    }
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
    return MHD_YES;
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
                size_t nc = x->cap ? x->cap * 2 : 4096;
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
    case R_COMPL: return do_generate(c, x);
    case R_MODELS: return do_models(c, x, NULL);
    case R_MODEL_ONE: return do_models(c, x, x->path + 11);
    case R_HEALTH: return send_json(c, x, 200, strdup("{\"status\":\"ok\"}"));
    case R_STATS:
    case R_METRICS: {
        kvt_engine_stats st;
        memset(&st, 0, sizeof st);
        kvt_engine_stats_get(s->e, &st);
        kvt_server_counters cs;
        counters_snapshot(s, &cs);
        if (x->route == R_STATS) return send_json(c, x, 200, kvt_api_stats_json(&st, &cs, s->model_name));
        return send_body(c, x, 200, kvt_api_metrics_text(&st, &cs), "text/plain; version=0.0.4; charset=utf-8");
    }
    case R_FLUSH: return do_flush(c, x);
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
        KVT_INFO("%s %s %d prompt=%u reused=%u(%s) gen=%u ttft=%.1fms prefill=%.1f tok/s decode=%.1f tok/s "
                 "total=%.0fms%s%s",
                 x->method, x->path, x->status, j->n_prompt, r.n_reused, tier, r.n_gen, r.ttft_ms, r.prefill_tps,
                 r.decode_tps, ms,
                 done ? "" : " (client gone)", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " [aborted]");
        job_unref(j);
    } else {
        KVT_INFO("%s %s %d %.1fms", x->method, x->path, x->status, ms);
    }
    free(x->body);
    free(x);
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
    if (!is_loopback(ai->ai_addr) && !o->api_key && !o->insecure) {
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
    s->e = e;
    s->started_at = (int64_t)time(NULL);
    const char *mn = o->model_alias ? o->model_alias : kvt_engine_model_name(e);
    snprintf(s->model_name, sizeof s->model_name, "%s", mn ? mn : "model");
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_mutex_init(&s->shut_mu, NULL);
    pthread_mutex_init(&s->swmu, NULL);
    pthread_cond_init(&s->swcv, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_cond_init(&s->tcv, NULL);
    kvt_conn_guard_opts go = {.max_conns = s->o.max_connections, .per_addr = s->o.max_conns_per_addr,
                              .header_s = s->o.header_timeout_s, .body_s = s->o.body_timeout_s};
    if (kvt_conn_guard_create(&go, kill_conn, s, &s->guard) != KVT_OK) {
        freeaddrinfo(ai);
        kvt_server_free(s);
        return KVT_ERR_NOMEM;
    }
    /* one worker per engine row: each blocks in kvt_engine_generate while its row runs */
    uint32_t nw = kvt_engine_parallel(e);
    if (nw < 1) nw = 1;
    if (nw > KVT_SRV_MAX_WORKERS) nw = KVT_SRV_MAX_WORKERS;
    for (uint32_t i = 0; i < nw; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) {
            freeaddrinfo(ai);
            s->worker_started = s->n_workers > 0;
            kvt_server_free(s);
            return kvt_errf(err, errlen, KVT_ERR_NOMEM, "cannot start the worker threads");
        }
        s->n_workers++;
    }
    s->worker_started = true;
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
    uint32_t waiting = s->n_queued + s->n_running;
    if (waiting) KVT_INFO("shutdown: draining %u request(s)", waiting);
    while ((s->q_head || s->n_running) && kvt_now_ms() < drain_until) timed_wait(&s->idle_cv, &s->qmu, 100);
    if (s->q_head || s->n_running) {
        KVT_WARN("shutdown: timeout reached, cancelling in-flight requests");
        for (job *j = s->q_head; j; j = j->next) job_cancel(j);
        for (uint32_t i = 0; i < KVT_SRV_MAX_WORKERS; i++)
            if (s->running[i]) job_cancel(s->running[i]);
    }
    s->stop_worker = true;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (s->worker_started) {
        for (uint32_t i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
        s->worker_started = false;
    }
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
    kvt_engine_flush(s->e, (uint32_t)left, &fr);
    s->flush_ok = fr.durable;
    KVT_INFO("shutdown: flush %s (entries %llu, pending blocks %llu, dropped %llu, failed %llu)",
             fr.durable ? "durable" : "NOT durable", (unsigned long long)fr.entries,
             (unsigned long long)fr.pending_blocks, (unsigned long long)fr.dropped, (unsigned long long)fr.failed);
    s->shut_done = true;
    pthread_mutex_unlock(&s->shut_mu);
    return s->flush_ok;
}

void kvt_server_free(kvt_server *s) {
    if (!s) return;
    if (s->worker_started || s->mhd) {
        /* Not yet shut down: stop without the drain wait if creation failed half-way. */
        if (s->mhd) kvt_server_shutdown(s);
        else {
            pthread_mutex_lock(&s->qmu);
            s->stop_worker = true;
            pthread_cond_broadcast(&s->qcv);
            pthread_mutex_unlock(&s->qmu);
            for (uint32_t i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
            s->worker_started = false;
        }
    }
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
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
