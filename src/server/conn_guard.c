/*
 * conn_guard.c — see conn_guard.h for the policy.
 *
 * Connection state machine (one kvt_conn per open connection):
 *
 *   open ──> WAITING ──headers──> BODY ──body done──> BUSY ──answered──> WAITING (keep-alive) ...
 *              │                    │                                       │
 *              └── deadline / evicted (killed) ──┘   deadline (killed)      └── close ──> freed
 *
 *   Any state ──close──> freed. A killed connection stays listed (killed = true) until the HTTP
 *   library reports the close, because its socket is still open until then.
 *
 * Invariants:
 *   1. Every listed entry's fd is open: entries are removed in kvt_conn_guard_close, which the
 *      server calls before the library closes the socket, so kill() never touches a reused fd.
 *   2. n_live == number of listed entries with killed == false; only those count towards the
 *      limits and only those can be killed (each entry is killed at most once).
 *   3. Only WAITING entries are evicted; BUSY entries are never killed by the guard.
 *   4. Admission never leaves more than max_conns live entries once the admitted connection is
 *      opened: it evicts first or refuses.
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

/* Oldest live WAITING entry, of addr when addr != NULL; caller holds mu. */
static kvt_conn *oldest_waiting(kvt_conn_guard *g, const char *addr) {
    kvt_conn *best = NULL;
    for (kvt_conn *c = g->head; c; c = c->next) {
        if (c->killed || c->stage != KVT_CONN_WAITING) continue;
        if (addr && strcmp(c->addr, addr) != 0) continue;
        if (!best || c->since_ms <= best->since_ms) best = c;
    }
    return best;
}

bool kvt_conn_guard_admit(kvt_conn_guard *g, const char *addr, double now_ms) {
    (void)now_ms;
    pthread_mutex_lock(&g->mu);
    uint32_t unfinished = 0;
    for (kvt_conn *c = g->head; c; c = c->next)
        if (!c->killed && c->stage != KVT_CONN_BUSY && !strcmp(c->addr, addr)) unfinished++;
    bool ok = true;
    if (unfinished >= g->o.per_addr) {
        kvt_conn *v = oldest_waiting(g, addr);
        if (v) {
            kill_locked(g, v);
            g->st.evicted++;
        } else {
            ok = false;
        }
    }
    if (ok && g->n_live >= g->o.max_conns) {
        kvt_conn *v = oldest_waiting(g, NULL);
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
        double limit_ms = (c->stage == KVT_CONN_WAITING ? g->o.header_s : g->o.body_s) * 1000.0;
        if (now_ms - c->since_ms <= limit_ms) continue;
        kill_locked(g, c);
        g->st.timed_out++;
        n++;
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
