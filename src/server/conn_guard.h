/*
 * conn_guard.h — who may hold an HTTP connection, and for how long (the slowloris defence). Pure
 * bookkeeping, independent of the HTTP library: the server reports each connection's life (admit,
 * open, stage changes, close) and the guard decides which connections to refuse, evict or time out,
 * closing them through a caller-supplied kill function (the server shuts the socket down; the
 * HTTP library then closes it as if the peer had left).
 *
 * Policy (docs/server.md, "Connections"):
 *   - a connection that has not finished sending its request (stage WAITING: request line and
 *     headers, also the idle wait for the next keep-alive request; stage BODY: the body) has a
 *     deadline: header_s from the start of WAITING, body_s from the start of BODY;
 *   - a BODY connection must also keep up a minimum average rate: once body_grace_s have passed
 *     since its headers, fewer than body_min_rate bytes per second (averaged since the headers)
 *     closes it. A body trickled a byte at a time is gone after body_grace_s, not body_s;
 *   - at most per_addr unfinished connections per client address, at most max_conns in all;
 *   - a new connection over either limit evicts the most overdue unfinished connection (of that
 *     address, respectively of any address) instead of being refused: a WAITING connection is
 *     overdue by the time it has waited, a BODY connection by how far its bytes lag behind
 *     KVT_CONN_EVICT_RATE (seconds in BODY - bytes / KVT_CONN_EVICT_RATE); a BODY connection
 *     at or above that rate is never evicted. So neither idle/slow headers
 *     (slowloris) nor stalled bodies can lock out a client that sends its request promptly
 *     (/health, an authenticated request, the server's reserve connections); a new connection is
 *     refused (and counted) only when every slot is BUSY or a body that keeps up;
 *   - BUSY connections (request received, being answered) are never evicted or timed out here.
 *
 * Ownership / threading: the guard owns its entries; kvt_conn handles are valid from
 * kvt_conn_guard_open to kvt_conn_guard_close. Every function may be called from any thread (one
 * internal mutex); the kill function runs under that mutex and must not call back into the guard.
 */
#ifndef KVT_CONN_GUARD_H
#define KVT_CONN_GUARD_H

#include "../util/common.h"

typedef struct kvt_conn_guard kvt_conn_guard;
typedef struct kvt_conn kvt_conn;

typedef enum kvt_conn_stage {
    KVT_CONN_WAITING = 0, /* waiting for / reading the request line and headers */
    KVT_CONN_BODY = 1,    /* headers received, reading the body */
    KVT_CONN_BUSY = 2,    /* request complete, being answered */
} kvt_conn_stage;

typedef struct kvt_conn_guard_opts {
    uint32_t max_conns; /* connections held at once; 0 = 256 */
    uint32_t per_addr;  /* unfinished (WAITING/BODY) connections per client address; 0 = 32 */
    double header_s;    /* WAITING deadline in seconds; <= 0 = 10 */
    double body_s;      /* BODY deadline in seconds; <= 0 = 60 */
    double body_min_rate; /* BODY minimum average rate in bytes/s; <= 0 = no minimum */
    double body_grace_s;  /* time after the headers before the rate applies; <= 0 = 2 */
} kvt_conn_guard_opts;

/* The body rate eviction measures a BODY connection's lag against (bytes/s): a body trickled
 * above the minimum rate (2 KB/s) is still evictable, a real upload (>= 64 KiB/s) is not. */
#define KVT_CONN_EVICT_RATE 65536.0

typedef struct kvt_conn_guard_stats {
    uint64_t open;      /* connections held now (evicted/timed-out ones excluded) */
    uint64_t refused;   /* connections refused at accept */
    uint64_t evicted;   /* WAITING connections closed to make room for a new one */
    uint64_t timed_out; /* connections closed for missing their header/body deadline */
    uint64_t slow;      /* BODY connections closed for falling below body_min_rate */
} kvt_conn_guard_stats;

/* Closes (shuts down) the connection behind fd. */
typedef void (*kvt_conn_kill_fn)(void *ctx, int fd);

kvt_status kvt_conn_guard_create(const kvt_conn_guard_opts *o, kvt_conn_kill_fn kill, void *kill_ctx,
                                 kvt_conn_guard **out);
void kvt_conn_guard_free(kvt_conn_guard *g); /* frees any entries still open */

/* Accept decision for a new connection from addr (a numeric address string). May evict one or two
 * WAITING connections. True = accept (call kvt_conn_guard_open next), false = refused (counted). */
bool kvt_conn_guard_admit(kvt_conn_guard *g, const char *addr, double now_ms);
/* Registers an accepted connection (stage WAITING from now_ms). NULL on allocation failure (the
 * connection is then simply not tracked). */
kvt_conn *kvt_conn_guard_open(kvt_conn_guard *g, const char *addr, int fd, double now_ms);
/* Moves c to stage st; the stage's deadline counts from now_ms (and BODY's byte count from 0).
 * NULL c is ignored. */
void kvt_conn_guard_stage(kvt_conn_guard *g, kvt_conn *c, kvt_conn_stage st, double now_ms);
/* Adds bytes of request body received on c (stage BODY; ignored otherwise, and for NULL c). */
void kvt_conn_guard_progress(kvt_conn_guard *g, kvt_conn *c, uint64_t bytes);
/* The connection is gone (whoever closed it); frees c. NULL c is ignored. */
void kvt_conn_guard_close(kvt_conn_guard *g, kvt_conn *c);
/* Kills every connection past its stage deadline or, in BODY after the grace time, below the
 * minimum rate; returns how many. Call a few times a second. */
uint32_t kvt_conn_guard_sweep(kvt_conn_guard *g, double now_ms);
void kvt_conn_guard_stats_get(kvt_conn_guard *g, kvt_conn_guard_stats *out);

#endif
