/* pins.c — pinned prefixes (engine.h, docs/tiers.md "Pinned prefixes"): a pin computes its prompt
 * through the normal path (one submitted row that generates one token, so its blocks enter the
 * tiers by the one put path and a prefix already cached costs one token), then asks the tier
 * manager to pin what the RAM tier holds of it (kvt_tiers_pin). At startup the pins of the pin list
 * are warmed the same way on one background thread: each row's lookup restores the prefix from the
 * SSD tier, its put brings it into RAM, and the pin holds it there. Startup and the token loop never
 * wait for it (the rows are batched like any other). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_int.h"

/* Tries before giving up when the prefix left RAM between its row's put and the pin. */
#define PIN_TRIES 3

/* One submitted row, waited for (kvt_engine_submit's done callback). */
typedef struct pin_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    kvt_status st;
} pin_wait;

static void pin_done(void *ctx, kvt_status st) {
    pin_wait *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->done = true;
    w->st = st;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Runs the prompt through the engine (one generated token); *cached = the tokens it reused. */
static kvt_status pin_pass(kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns, volatile int *cancel,
                           uint32_t *cached, char *err, size_t errlen) {
    kvt_gen_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = prompt;
    rq.n_prompt = n;
    rq.max_tokens = 1;
    kvt_sampling_default(&rq.sampling); /* greedy: the token is thrown away */
    rq.ns = ns;
    rq.ignore_eog = true;
    rq.cancel = cancel;
    kvt_gen_result res;
    pin_wait w = {.done = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    kvt_status st = kvt_engine_submit(e, &rq, &res, err, errlen, false, pin_done, &w);
    if (st == KVT_OK) {
        pthread_mutex_lock(&w.mu);
        while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
        st = w.st;
        pthread_mutex_unlock(&w.mu);
        *cached = res.n_reused;
        free(res.tokens);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return st;
}

static void info_of(const kvt_tiers_pin_info *ti, uint64_t budget, kvt_pin_info *o) {
    memset(o, 0, sizeof *o);
    o->id = ti->id;
    o->n_tokens = ti->n_tokens;
    o->tokens_in_ram = ti->tokens_in_ram;
    o->bytes = ti->bytes;
    o->budget = budget;
    o->created = ti->created;
    o->expires = ti->expires;
    o->warm = ti->warm;
}

/* kvt_engine_pin with the pin's creation time (0 = now): the warm-up keeps the pin list's. */
static kvt_status pin_impl(kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns, int64_t created,
                           int64_t expires, volatile int *cancel, kvt_pin_info *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!e->tier) return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "pins need the RAM tier (--prompt-cache > 0)");
    const uint64_t budget = kvt_tiers_pin_budget(e->tier);
    out->budget = budget;
    out->n_tokens = n;
    /* refused before computing anything: the prefix's KV alone would exceed the budget */
    const double need = (double)n * kvt_kv_layout_bytes_per_token(e->layout);
    if (need > (double)budget) {
        out->bytes = (uint64_t)need;
        return kvt_errf(err, errlen, KVT_ERR_RANGE,
                        "the prefix of %u tokens needs about %.1f MiB of KV, over the pin budget of %.1f MiB (--pin-budget-mb)",
                        n, need / 1048576.0, (double)budget / 1048576.0);
    }
    uint64_t root = kvt_root_hash(e->compat, ns ? ns : "");
    kvt_chain *c = NULL;
    kvt_status st = kvt_chain_create(root, prompt, n, e->o.block_tokens, &c);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "out of memory");
    kvt_tiers_pin_info ti;
    for (int tries = 0; tries < PIN_TRIES; tries++) {
        uint32_t cached = 0;
        st = pin_pass(e, prompt, n, ns, cancel, &cached, err, errlen);
        if (st != KVT_OK) break;
        if (tries == 0) out->cached_tokens = cached;
        st = kvt_tiers_pin(e->tier, c, ns, created, expires, &ti);
        /* the whole prompt must be held (other rows' puts may have evicted part of it meanwhile) */
        if (st == KVT_OK && ti.tokens_in_ram < n && tries + 1 < PIN_TRIES) {
            kvt_tiers_unpin(e->tier, ti.id);
            continue;
        }
        if (st != KVT_ERR_NOT_FOUND) break;
    }
    kvt_chain_release(c);
    if (st == KVT_OK) {
        const uint32_t cached = out->cached_tokens;
        info_of(&ti, budget, out);
        out->cached_tokens = cached;
        return KVT_OK;
    }
    if (st == KVT_ERR_RANGE) {
        out->bytes = ti.bytes;
        return kvt_errf(err, errlen, KVT_ERR_RANGE,
                        "pinning %u tokens (%.1f MiB) would exceed the pin budget of %.1f MiB (--pin-budget-mb)", n,
                        (double)ti.bytes / 1048576.0, (double)budget / 1048576.0);
    }
    if (st == KVT_ERR_NOT_FOUND)
        return kvt_errf(err, errlen, st, "the prefix left the RAM tier before it could be pinned (memory pressure); retry");
    if (err && !err[0]) kvt_errf(err, errlen, st, "%s", kvt_status_str(st));
    return st;
}

kvt_status kvt_engine_pin(kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns, int64_t expires,
                          kvt_pin_info *out, char *err, size_t errlen) {
    return pin_impl(e, prompt, n, ns, 0, expires, NULL, out, err, errlen);
}

uint64_t kvt_engine_pin_id(const kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns) {
    return kvt_pin_id(kvt_root_hash(e->compat, ns ? ns : ""), prompt, n);
}

kvt_status kvt_engine_unpin(kvt_engine *e, uint64_t id) { return kvt_tiers_unpin(e->tier, id); }

kvt_status kvt_engine_pins(kvt_engine *e, kvt_pin_info **out, uint32_t *n) {
    *out = NULL;
    *n = 0;
    kvt_tiers_pin_info *v = NULL;
    uint32_t m = 0;
    kvt_status st = kvt_tiers_pins(e->tier, &v, &m);
    if (st != KVT_OK) return st;
    kvt_pin_info *o = malloc(((size_t)m + 1) * sizeof(*o));
    if (!o) {
        free(v);
        return KVT_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < m; i++) info_of(&v[i], kvt_tiers_pin_budget(e->tier), &o[i]);
    free(v);
    *out = o;
    *n = m;
    return KVT_OK;
}

/* ---- the restart's warm-up ---- */

static void *warm_main(void *arg) {
    kvt_engine *e = arg;
    kvt_pin_rec *v = NULL;
    uint32_t n = 0;
    if (kvt_tiers_pins_cold(e->tier, &v, &n) != KVT_OK) {
        KVT_WARN("pinned prefixes: out of memory listing the pins to warm");
        return NULL;
    }
    uint32_t warmed = 0;
    for (uint32_t i = 0; i < n && !__atomic_load_n(&e->warm_stop, __ATOMIC_RELAXED); i++) {
        kvt_pin_info pi;
        char err[256] = "";
        const double t0 = kvt_now_ms();
        /* the file is untrusted: the row's validation refuses ids outside the vocabulary */
        kvt_status st = pin_impl(e, v[i].tokens, v[i].n_tokens, v[i].ns, v[i].created, v[i].expires, &e->warm_stop, &pi,
                                 err, sizeof err);
        if (st == KVT_OK) {
            warmed++;
            KVT_INFO("pinned prefixes: %016llx warm (%u tokens, %u from the tiers, %.0f ms)", (unsigned long long)pi.id,
                     pi.n_tokens, pi.cached_tokens, kvt_now_ms() - t0);
        } else if (st != KVT_ERR_CANCELLED) {
            KVT_WARN("pinned prefixes: cannot warm %016llx: %s", (unsigned long long)v[i].id, err);
        }
    }
    if (n) KVT_INFO("pinned prefixes: %u of %u warm", warmed, n);
    kvt_pin_recs_free(v, n);
    return NULL;
}

void kvt_engine_pins_warm_start(kvt_engine *e) {
    kvt_pin_rec *v = NULL;
    uint32_t n = 0;
    if (!e->tier || kvt_tiers_pins_cold(e->tier, &v, &n) != KVT_OK) return;
    kvt_pin_recs_free(v, n);
    if (!n) return;
    if (pthread_create(&e->warm_th, NULL, warm_main, e) == 0) e->warm_started = true;
    else KVT_WARN("pinned prefixes: cannot start the warm-up thread; the pins warm on their next use");
}

void kvt_engine_pins_warm_stop(kvt_engine *e) {
    if (!e->warm_started) return;
    __atomic_store_n(&e->warm_stop, 1, __ATOMIC_RELAXED);
    pthread_join(e->warm_th, NULL);
    e->warm_started = false;
}
