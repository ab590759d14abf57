/*
 * conn_guard.c — see conn_guard.h for the policy.
 *
 * Connection state machine (one kvt_conn per open connection):
 *
 *   open ──> WAITING ──headers──> BODY ──body done──> BUSY ──answered──> WAITING (keep-alive) ...
 *              │                    │                                       │
 *              └── deadline / evicted (killed)       deadline / too slow /  └── close ──> freed
 *                                                    evicted (killed)
 *
 *   Any state ──close──> freed. A killed connection stays listed (killed = true) until the HTTP
 *   library reports the close, because its socket is still open until then.
 *
 * Invariants:
 *   1. Every listed entry's fd is open: entries are removed in kvt_conn_guard_close, which the
 *      server calls before the library closes the socket, so kill() never touches a reused fd.
 *   2. n_live == number of listed entries with killed == false; only those count towards the
 *      limits and only those can be killed (each entry is killed at most once).
 *   3. Only WAITING entries and BODY entries whose bytes lag behind KVT_CONN_EVICT_RATE
 *      (eviction_score > 0) are evicted; BUSY entries are never killed by the guard.
 *   4. Admission never leaves more than max_conns live entries once the admitted connection is
 *      opened: it evicts first or refuses.
 *   5. body_bytes counts the body bytes received since the entry last entered BODY.
 */
#include "conn_guard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvt_conn {
    struct kvt_conn *prev, *next;
    char addr[64];
    int fd;
    kvt_conn_stage stage;
    double since_ms; /* start of the current stage */
    uint64_t body_bytes; /* invariant 5 */
    bool killed;
};

struct kvt_conn_guard {
    kvt_conn_guard_opts o;
    kvt_conn_kill_fn kill;
    void *kill_ctx;
    pthread_mutex_t mu;
    kvt_conn *head; /* most recently opened first */
    uint32_t n_live;
    kvt_conn_guard_stats st;
};

kvt_status kvt_conn_guard_create(const kvt_conn_guard_opts *o, kvt_conn_kill_fn kill, void *kill_ctx,
                                 kvt_conn_guard **out) {
    *out = NULL;
    kvt_conn_guard *g = calloc(1, sizeof *g);
    if (!g) return KVT_ERR_NOMEM;
    g->o = *o;
    if (!g->o.max_conns) g->o.max_conns = 256;
    if (!g->o.per_addr) g->o.per_addr = 32;
    if (g->o.header_s <= 0) g->o.header_s = 10;
    if (g->o.body_s <= 0) g->o.body_s = 60;
    if (g->o.body_min_rate < 0) g->o.body_min_rate = 0;
    if (g->o.body_grace_s <= 0) g->o.body_grace_s = 2;
    g->kill = kill;
    g->kill_ctx = kill_ctx;
    pthread_mutex_init(&g->mu, NULL);
    *out = g;
    return KVT_OK;
}

void kvt_conn_guard_free(kvt_conn_guard *g) {
    if (!g) return;
    for (kvt_conn *c = g->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Kills a live entry (invariant 2); caller holds mu. */
static void kill_locked(kvt_conn_guard *g, kvt_conn *c) {
    c->killed = true;
    g->n_live--;
    if (g->kill) g->kill(g->kill_ctx, c->fd);
}

/* How overdue an unfinished entry is, in seconds: a WAITING entry by the time it has waited, a
 * BODY entry by how far its bytes lag behind KVT_CONN_EVICT_RATE (seconds in BODY less the
 * seconds its bytes take at that rate). Only WAITING entries and those with a score > 0 may be
 * evicted. */
static double eviction_score(const kvt_conn *c, double now_ms) {
    double waited = (now_ms - c->since_ms) / 1000.0;
    if (c->stage == KVT_CONN_WAITING) return waited;
    return waited - (double)c->body_bytes / KVT_CONN_EVICT_RATE;
}

/* The most overdue evictable entry (invariant 3), of addr when addr != NULL; ties go to the
 * oldest. Caller holds mu. */
static kvt_conn *pick_victim(kvt_conn_guard *g, const char *addr, double now_ms) {
    kvt_conn *best = NULL;
    double best_score = 0;
    for (kvt_conn *c = g->head; c; c = c->next) {
        if (c->killed || c->stage == KVT_CONN_BUSY) continue;
        if (addr && strcmp(c->addr, addr) != 0) continue;
        double sc = eviction_score(c, now_ms);
        if (c->stage == KVT_CONN_BODY && sc <= 0) continue; /* a body that keeps up */
        if (!best || sc > best_score || (sc == best_score && c->since_ms <= best->since_ms)) {
            best = c;
            best_score = sc;
        }
    }
    return best;
}

bool kvt_conn_guard_admit(kvt_conn_guard *g, const char *addr, double now_ms) {
    pthread_mutex_lock(&g->mu);
    uint32_t unfinished = 0;
    for (kvt_conn *c = g->head; c; c = c->next)
        if (!c->killed && c->stage != KVT_CONN_BUSY && !strcmp(c->addr, addr)) unfinished++;
    bool ok = true;
    if (unfinished >= g->o.per_addr) {
        kvt_conn *v = pick_victim(g, addr, now_ms);
        if (v) {
            kill_locked(g, v);
            g->st.evicted++;
        } else {
            ok = false;
        }
    }
    if (ok && g->n_live >= g->o.max_conns) {
        kvt_conn *v = pick_victim(g, NULL, now_ms);
        if (v) {
            kill_locked(g, v);
            g->st.evicted++;
        } else {
            ok = false;
        }
    }
    if (!ok) g->st.refused++;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

kvt_conn *kvt_conn_guard_open(kvt_conn_guard *g, const char *addr, int fd, double now_ms) {
    kvt_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    snprintf(c->addr, sizeof c->addr, "%s", addr ? addr : "");
    c->fd = fd;
    c->stage = KVT_CONN_WAITING;
    c->since_ms = now_ms;
    pthread_mutex_lock(&g->mu);
    c->next = g->head;
    if (g->head) g->head->prev = c;
    g->head = c;
    g->n_live++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void kvt_conn_guard_stage(kvt_conn_guard *g, kvt_conn *c, kvt_conn_stage st, double now_ms) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    c->stage = st;
    c->since_ms = now_ms;
    c->body_bytes = 0;
    pthread_mutex_unlock(&g->mu);
}

void kvt_conn_guard_progress(kvt_conn_guard *g, kvt_conn *c, uint64_t bytes) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->stage == KVT_CONN_BODY) c->body_bytes += bytes;
    pthread_mutex_unlock(&g->mu);
}

void kvt_conn_guard_close(kvt_conn_guard *g, kvt_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->prev) c->prev->next = c->next;
    else g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    if (!c->killed) g->n_live--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

uint32_t kvt_conn_guard_sweep(kvt_conn_guard *g, double now_ms) {
    uint32_t n = 0;
    pthread_mutex_lock(&g->mu);
    for (kvt_conn *c = g->head; c; c = c->next) {
        if (c->killed || c->stage == KVT_CONN_BUSY) continue;
        double el_ms = now_ms - c->since_ms;
        double limit_ms = (c->stage == KVT_CONN_WAITING ? g->o.header_s : g->o.body_s) * 1000.0;
        if (el_ms > limit_ms) {
            kill_locked(g, c);
            g->st.timed_out++;
            n++;
        } else if (c->stage == KVT_CONN_BODY && g->o.body_min_rate > 0 && el_ms >= g->o.body_grace_s * 1000.0 &&
                   (double)c->body_bytes < g->o.body_min_rate * el_ms / 1000.0) {
            kill_locked(g, c);
            g->st.slow++;
            n++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}

void kvt_conn_guard_stats_get(kvt_conn_guard *g, kvt_conn_guard_stats *out) {
    pthread_mutex_lock(&g->mu);
    *out = g->st;
    out->open = g->n_live;
    pthread_mutex_unlock(&g->mu);
}
