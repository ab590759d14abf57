/*
 * companion.c — the draft's tier set (see companion.h): the backends a tier manager needs, created
 * over the draft's layout and pool under the companion compatibility key, and freed in the order the
 * engine frees its own (shared publisher, durability, tier manager, RAM tier, SSD tier).
 */
#include "companion.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvt_companion {
    kvt_prompt_cache *pc;
    kvt_ssd *ssd;
    kvt_shared *shared;
    kvt_tiers *tiers;
};

kvt_status kvt_companion_create(const kvt_companion_opts *o, kvt_companion **out, char *err, size_t errlen) {
    *out = NULL;
    if (!o->key || !o->key[0] || !o->layout || !o->pool || o->ram_bytes == 0)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "the draft's state: no key, layout, pool or RAM tier");
    kvt_companion *c = calloc(1, sizeof *c);
    if (!c) return KVT_ERR_NOMEM;
    char e2[400] = "";
    kvt_status st = KVT_OK;
    c->pc = kvt_prompt_cache_create(o->pool, o->ram_bytes);
    if (!c->pc) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    if (o->ssd) {
        kvt_ssd_opts so = *o->ssd;
        so.compat_key = o->key;
        if ((st = kvt_ssd_open(&so, o->layout, o->pool, &c->ssd, e2, sizeof e2))) goto fail;
    }
    if (o->shared) {
        kvt_shared_opts sho = *o->shared;
        sho.layout = o->layout;
        sho.pool = o->pool;
        sho.compat_key = o->key;
        if ((st = kvt_shared_create(&sho, NULL, &c->shared, e2, sizeof e2))) goto fail;
    }
    kvt_tiers_opts to = {.pool = o->pool, .ram = c->pc, .ssd = c->ssd, .shared = c->shared,
                         .writeback = o->writeback, .demote_idle_s = o->demote_idle_s,
                         .admit = o->admit, .admit_ctx = o->admit_ctx};
    c->tiers = kvt_tiers_create(&to);
    if (!c->tiers) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    *out = c;
    return KVT_OK;
fail:
    kvt_errf(err, errlen, st, "the draft's cached state: %s", e2[0] ? e2 : kvt_status_str(st));
    kvt_companion_free(c);
    return st;
}

void kvt_companion_free(kvt_companion *c) {
    if (!c) return;
    if (c->ssd && c->tiers) {
        kvt_tiers_flush_result r;
        kvt_tiers_flush(c->tiers, 30000, &r);
        if (!r.durable) KVT_WARN("the draft's cached state: not all of it reached the disk (%s)", r.reason);
    }
    if (c->shared) kvt_shared_flush(c->shared, 10000); /* bounded: publish what is queued */
    kvt_shared_free(c->shared); /* releases its queued block references before the pool goes */
    kvt_tiers_free(c->tiers);
    if (c->pc) kvt_prompt_cache_free(c->pc);
    if (c->ssd) kvt_ssd_free(c->ssd);
    free(c);
}

kvt_tiers *kvt_companion_tiers(kvt_companion *c) { return c ? c->tiers : NULL; }

bool kvt_companion_shared_flush(kvt_companion *c, uint32_t timeout_ms) {
    return !c || !c->shared || kvt_shared_flush(c->shared, timeout_ms);
}

void kvt_companion_stats_get(kvt_companion *c, kvt_companion_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    kvt_prompt_cache_stats p;
    kvt_prompt_cache_stats_get(c->pc, &p);
    out->ram_entries = p.entries;
    out->ram_bytes = p.bytes;
    if (c->ssd) {
        kvt_ssd_stats s;
        kvt_ssd_stats_get(c->ssd, &s);
        out->ssd_entries = s.entries;
        out->ssd_bytes = s.bytes;
        out->ssd_pending_blocks = s.pending_blocks;
    }
}

void kvt_companion_merge_flush(kvt_tiers_flush_result *t, const kvt_tiers_flush_result *d) {
    if (t->durable && !d->durable) {
        char why[sizeof t->reason];
        snprintf(why, sizeof why, "%s", d->reason);
        snprintf(t->reason, sizeof t->reason, "draft: %.*s", (int)(sizeof t->reason - 8), why);
    }
    t->durable = t->durable && d->durable;
    t->checkpoints_durable = t->checkpoints_durable && d->checkpoints_durable;
    t->blocks.entries += d->blocks.entries;
    t->blocks.pending_blocks += d->blocks.pending_blocks;
    t->blocks.dropped += d->blocks.dropped;
    t->blocks.failed += d->blocks.failed;
    t->blocks.records_written += d->blocks.records_written;
    t->blocks.elapsed_ms += d->blocks.elapsed_ms;
    t->shared_pending += d->shared_pending;
    t->demoted += d->demoted;
}
