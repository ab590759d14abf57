/* tier.c — see tier.h and docs/tiers.md. */
#include "tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One pinned prefix: its record (as in the pin list file) and its RAM-tier pin. */
typedef struct tier_pin {
    kvt_pin_rec rec;        /* owns ns and tokens */
    uint64_t handle;        /* kvt_prompt_cache_pin's; 0 = not warm yet (loaded from the file) */
    uint32_t tokens_in_ram;
    uint64_t bytes;
} tier_pin;

struct kvt_tiers {
    kvt_tiers_opts o;
    bool recurrent;      /* the layout has recurrent state: puts carry a snapshot */
    double last_tick_ms; /* the demotion clock (kvt_tiers_tick's thread only) */
    uint64_t pressure_events, pressure_freed, pressure_failed; /* kvt_tiers_pressure_stats (atomics) */
    double last_pin_tick_ms;
    pthread_mutex_t pin_mu; /* the pin list and its file */
    tier_pin *pins;
    uint32_t n_pins;
};

static void pins_load(kvt_tiers *t);

kvt_tiers *kvt_tiers_create(const kvt_tiers_opts *o) {
    if (!o || !o->pool || !o->ram) return NULL;
    kvt_tiers *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->o = *o;
    t->recurrent = kvt_kv_layout_state_bytes(kvt_block_pool_layout(o->pool)) > 0;
    t->last_tick_ms = t->last_pin_tick_ms = kvt_now_ms();
    if (pthread_mutex_init(&t->pin_mu, NULL) != 0) {
        free(t);
        return NULL;
    }
    kvt_prompt_cache_set_pin_budget(o->ram, o->pin_budget);
    kvt_block_pool_set_pressure(o->pool, kvt_tiers_pressure_cb, t);
    if (o->ssd) kvt_prompt_cache_set_spill(o->ram, kvt_ssd_spill_block, kvt_ssd_spill_snapshot, o->ssd);
    if (o->ssd) pins_load(t);
    return t;
}

void kvt_tiers_free(kvt_tiers *t) {
    if (!t) return;
    kvt_block_pool_set_pressure(t->o.pool, NULL, NULL);
    if (t->o.ssd) kvt_prompt_cache_set_spill(t->o.ram, NULL, NULL, NULL);
    for (uint32_t i = 0; i < t->n_pins; i++) {
        kvt_prompt_cache_unpin(t->o.ram, t->pins[i].handle);
        free(t->pins[i].rec.ns);
        free(t->pins[i].rec.tokens);
    }
    free(t->pins);
    pthread_mutex_destroy(&t->pin_mu);
    free(t);
}

/* RAM eviction first (LRU, leaf-first; what it evicts is spilled into the SSD tier, whose record
 * then holds the block). The SSD tier then stages the records that alone hold their blocks (the
 * file image to the heap, the block released), so the spilled pool memory is freed at once
 * instead of waiting for the writer, and the writer still persists every one of them: the
 * pressure path never waits for the disk and loses nothing (only a failing disk's records are
 * dropped, counted in ssd_cache.shed; kvt_ssd_shed). */
bool kvt_tiers_pressure_cb(void *ctx, uint64_t bytes_needed) {
    kvt_tiers *t = ctx;
    uint64_t want = bytes_needed ? bytes_needed : 1;
    uint64_t freed = kvt_prompt_cache_evict_bytes(t->o.ram, want);
    if (freed < want && t->o.ssd) freed += kvt_ssd_shed(t->o.ssd, want - freed);
    __atomic_add_fetch(&t->pressure_events, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->pressure_freed, freed, __ATOMIC_RELAXED);
    if (!freed) __atomic_add_fetch(&t->pressure_failed, 1, __ATOMIC_RELAXED);
    return freed > 0;
}

void kvt_tiers_pressure_stats(const kvt_tiers *t, uint64_t *events, uint64_t *freed_bytes, uint64_t *failed) {
    *events = t ? __atomic_load_n(&t->pressure_events, __ATOMIC_RELAXED) : 0;
    *freed_bytes = t ? __atomic_load_n(&t->pressure_freed, __ATOMIC_RELAXED) : 0;
    *failed = t ? __atomic_load_n(&t->pressure_failed, __ATOMIC_RELAXED) : 0;
}

kvt_tier kvt_tiers_block_source(const kvt_tiers_hit *h, uint32_t i) {
    if (!h || i >= h->n_blocks) return KVT_TIER_NONE;
    if (i < h->ram_blocks) return KVT_TIER_RAM;
    return i < h->ram_blocks + h->ssd_blocks ? KVT_TIER_SSD : KVT_TIER_SHARED;
}

/* ---- the one put path ---- */

typedef enum put_reason {
    PUT_SEQ,     /* a finished or boundary sequence: RAM put (tail frozen), write-behind + snapshot, publish */
    PUT_BLOCKS,  /* a growing sequence's sealed full blocks: RAM, write-behind */
    PUT_FETCHED, /* what a lookup fetched from the shared tier: RAM blocks, write-behind + snapshot */
    PUT_LOCAL,   /* a mid-prompt state snapshot (recurrent n-1): as PUT_SEQ without the publish */
} put_reason;

/* The write-behind switch, checked here only: with it off, the SSD tier receives spills, demotions,
 * checkpoints and what a flush hands it, never a put. */
static void write_behind(kvt_tiers *t, kvt_seq *seq, bool with_state) {
    if (!t->o.ssd || !t->o.writeback) return;
    kvt_snapshot *snap = NULL;
    /* the tail is frozen by the put; a failed snapshot only loses the SSD copy of the state */
    if (with_state && t->recurrent && kvt_seq_snapshot(seq, &snap) != KVT_OK) snap = NULL;
    kvt_ssd_enqueue_seq(t->o.ssd, seq, snap);
    if (snap) kvt_snapshot_release(snap);
}

static kvt_status put(kvt_tiers *t, kvt_seq *seq, put_reason why) {
    if (!t || (t->o.admit && !t->o.admit(t->o.admit_ctx))) return KVT_OK;
    kvt_status st = KVT_OK;
    switch (why) {
    case PUT_SEQ:
    case PUT_LOCAL:
        st = kvt_prompt_cache_put(t->o.ram, seq);
        if (st == KVT_OK) write_behind(t, seq, true);
        if (t->o.shared && why == PUT_SEQ) kvt_shared_publish_seq(t->o.shared, seq);
        break;
    case PUT_BLOCKS:
        st = kvt_prompt_cache_put_blocks(t->o.ram, seq);
        if (st == KVT_OK) write_behind(t, seq, false);
        break;
    case PUT_FETCHED:
        kvt_prompt_cache_put_blocks(t->o.ram, seq); /* best effort: the request has its blocks */
        write_behind(t, seq, true);
        break;
    }
    return st;
}

kvt_status kvt_tiers_put(kvt_tiers *t, kvt_seq *seq) { return put(t, seq, PUT_SEQ); }
kvt_status kvt_tiers_put_blocks(kvt_tiers *t, kvt_seq *seq) { return put(t, seq, PUT_BLOCKS); }
kvt_status kvt_tiers_put_local(kvt_tiers *t, kvt_seq *seq) { return put(t, seq, PUT_LOCAL); }

/* ---- lookup ---- */

/* The RAM tier serves alone (its plan, counted by the take). */
static kvt_status ram_only(kvt_tiers *t, kvt_prompt_cache_plan *rp, uint32_t bt, kvt_tiers_hit *out) {
    kvt_status st = kvt_prompt_cache_take_plan(t->o.ram, rp, &out->seq, &out->n_reused);
    if (st != KVT_OK || !out->seq) return st;
    out->from = KVT_TIER_RAM;
    out->n_blocks = out->ram_blocks = (out->n_reused + bt - 1) / bt;
    if (t->recurrent) out->state_from = KVT_TIER_RAM;
    return KVT_OK;
}

/* RAM and SSD: one plan over both local tiers; each tier is planned once and its plan is carried
 * into its take / restore (a tier plans again only when its index lost what the plan named). */
static kvt_status local_lookup(kvt_tiers *t, const kvt_chain *c, kvt_prompt_cache_plan *rp,
                               const kvt_prompt_cache_peek_info *ram, kvt_tiers_hit *out) {
    const uint32_t bt = kvt_chain_block_tokens(c);
    if (!t->o.ssd) return ram_only(t, rp, bt, out);
    /* the SSD tier plans on top of RAM's leading full blocks (they need no disk read) */
    kvt_ssd_plan *sp = NULL;
    uint32_t on_disk = kvt_ssd_plan_from(t->o.ssd, c, ram->full_blocks, &sp);
    if (on_disk <= ram->usable) {
        kvt_ssd_plan_free(sp);
        return ram_only(t, rp, bt, out);
    }
    uint32_t k = KVT_MIN(ram->full_blocks, on_disk / bt);
    kvt_seq *base = NULL;
    if (k) {
        /* RAM's blocks [0, k') with what the final length needs; k' < k when some went away since
         * the plan (the SSD tier then plans again and restores from block k') */
        kvt_status st = kvt_prompt_cache_take_blocks(t->o.ram, rp, k, on_disk, &base);
        if (st != KVT_OK) {
            kvt_ssd_plan_free(sp);
            return st;
        }
        k = kvt_seq_len(base) / bt;
    }
    double r0 = kvt_now_ms();
    kvt_seq *rs = NULL;
    uint32_t got = 0;
    kvt_ssd_restore_info info;
    kvt_status st = kvt_ssd_restore_plan(t->o.ssd, c, base, sp, &rs, &got, &info);
    kvt_ssd_plan_free(sp);
    out->restore_ms = kvt_now_ms() - r0;
    out->ssd_files_read = info.files_read;
    out->ssd_bytes_read = info.bytes_read;
    if (base) kvt_seq_free(base); /* rs shares its blocks */
    if (st == KVT_OK && rs && got > ram->usable) {
        kvt_prompt_cache_count_take(t->o.ram, k * bt); /* RAM served blocks [0, k): a hit, or (k = 0) a miss */
        out->seq = rs;
        out->n_reused = got;
        out->from = KVT_TIER_SSD;
        out->n_blocks = (got + bt - 1) / bt;
        out->ram_blocks = k;
        out->ssd_blocks = out->n_blocks - k;
        if (info.snapshot) out->state_from = KVT_TIER_SSD;
        return KVT_OK;
    }
    /* shorter than RAM after all (a file went bad), or no memory for the restore (RAM's own plan
     * shares blocks instead of allocating them): RAM serves */
    if (rs) kvt_seq_free(rs);
    double ms = out->restore_ms;
    uint64_t fr = out->ssd_files_read, br = out->ssd_bytes_read;
    st = ram_only(t, rp, bt, out);
    out->restore_ms = ms;
    out->ssd_files_read = fr;
    out->ssd_bytes_read = br;
    return st;
}

/* After the local tiers: extend the reused prefix with blocks no local tier had, fetched and
 * verified by the shared tier; they enter RAM (and SSD) through the put path like a restore. The
 * shared tier walks the request's chain (nothing is hashed again). */
static void shared_lookup(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out) {
    const uint32_t bt = kvt_chain_block_tokens(c);
    if (out->n_reused % bt) return; /* a local partial block: the shared tier adds < 1 block */
    if (!out->seq && kvt_seq_create(t->o.pool, kvt_chain_root(c), &out->seq) != KVT_OK) return;
    double r0 = kvt_now_ms();
    uint32_t got = kvt_shared_extend(t->o.shared, &out->seq, c); /* recurrent: may replace seq */
    out->restore_ms += kvt_now_ms() - r0;
    if (!got) {
        if (out->n_reused == 0) { /* keep the miss path identical to a server without the tier */
            kvt_seq_free(out->seq);
            out->seq = NULL;
        }
        return;
    }
    out->n_reused = kvt_seq_len(out->seq);
    out->from = KVT_TIER_SHARED;
    const uint32_t nb = (out->n_reused + bt - 1) / bt;
    out->shared_blocks = nb - out->n_blocks;
    out->n_blocks = nb;
    if (t->recurrent) out->state_from = KVT_TIER_SHARED;
    put(t, out->seq, PUT_FETCHED);
}

kvt_status kvt_tiers_lookup(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out) {
    memset(out, 0, sizeof(*out));
    if (!t || !c) return KVT_ERR_INVALID_ARG;
    kvt_prompt_cache_plan *rp = NULL;
    kvt_prompt_cache_peek_info ram;
    kvt_status st = kvt_prompt_cache_plan_create(t->o.ram, c, &rp, &ram);
    if (st == KVT_OK) st = local_lookup(t, c, rp, &ram, out);
    kvt_prompt_cache_plan_free(rp);
    if (st == KVT_OK && t->o.shared) shared_lookup(t, c, out);
    return st;
}

/* ---- clock, busy ---- */

void kvt_tiers_set_busy(kvt_tiers *t, bool busy) {
    if (!t) return;
    if (t->o.ssd) kvt_ssd_set_busy(t->o.ssd, busy);
    if (t->o.shared) kvt_shared_set_busy(t->o.shared, busy);
}

static void pins_expire(kvt_tiers *t);

void kvt_tiers_tick(kvt_tiers *t, pthread_mutex_t *quiet) {
    if (!t) return;
    if (kvt_now_ms() - t->last_pin_tick_ms >= 1000.0) { /* ttl: needs no quiet engine */
        t->last_pin_tick_ms = kvt_now_ms();
        pins_expire(t);
    }
    if (!t->o.ssd || t->o.demote_idle_s <= 0) return; /* 0 or negative: demotion off */
    if (quiet && pthread_mutex_trylock(quiet) != 0) return;
    double now = kvt_now_ms();
    if (now - t->last_tick_ms >= 1000.0) {
        t->last_tick_ms = now;
        uint64_t n = kvt_prompt_cache_demote_idle(t->o.ram, t->o.demote_idle_s);
        if (n) kvt_ssd_note_demotions(t->o.ssd, n);
    }
    if (quiet) pthread_mutex_unlock(quiet);
}

/* ---- pinned prefixes ---- */

/* Rewrites the pin list file (pin_mu held). Without the SSD tier pins live in RAM only. */
static void pins_save(kvt_tiers *t) {
    if (!t->o.ssd) return;
    kvt_pin_rec *v = malloc(((size_t)t->n_pins + 1) * sizeof(*v));
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[256] = "";
    kvt_status st = v ? KVT_OK : KVT_ERR_NOMEM;
    for (uint32_t i = 0; v && i < t->n_pins; i++) v[i] = t->pins[i].rec;
    if (st == KVT_OK) st = kvt_pin_file_encode(v, t->n_pins, &buf, &len);
    if (st == KVT_OK) st = kvt_ssd_meta_write(t->o.ssd, KVT_PIN_FILE, buf, len, err, sizeof err);
    if (st != KVT_OK) KVT_WARN("pinned prefixes: cannot write the pin list: %s", err[0] ? err : kvt_status_str(st));
    free(buf);
    free(v);
}

/* At create: the pin list of the compat directory, validated (pin_file.c); expired pins are left
 * out. A list that cannot be read is reported and replaced at the next change. */
static void pins_load(kvt_tiers *t) {
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[256] = "";
    kvt_status st = kvt_ssd_meta_read(t->o.ssd, KVT_PIN_FILE, KVT_PIN_FILE_MAX, &buf, &len, err, sizeof err);
    kvt_pin_rec *v = NULL;
    uint32_t n = 0;
    if (st == KVT_OK) st = kvt_pin_file_decode(buf, len, &v, &n, err, sizeof err);
    free(buf);
    if (st == KVT_ERR_NOT_FOUND) return;
    if (st != KVT_OK) {
        KVT_WARN("pinned prefixes: ignoring the pin list of %s: %s", kvt_ssd_dir(t->o.ssd), err);
        return;
    }
    t->pins = calloc(n ? n : 1, sizeof(*t->pins));
    const int64_t now = (int64_t)time(NULL);
    for (uint32_t i = 0; t->pins && i < n; i++) {
        if (v[i].expires && v[i].expires <= now) continue;
        t->pins[t->n_pins++].rec = v[i];
        v[i].ns = NULL;
        v[i].tokens = NULL;
    }
    kvt_pin_recs_free(v, n);
    if (t->n_pins) KVT_INFO("pinned prefixes: %u in the pin list, warming them from the SSD tier", t->n_pins);
}

static void pin_info(const tier_pin *p, kvt_tiers_pin_info *o) {
    memset(o, 0, sizeof(*o));
    o->id = p->rec.id;
    o->n_tokens = p->rec.n_tokens;
    o->tokens_in_ram = p->tokens_in_ram;
    o->bytes = p->bytes;
    o->created = p->rec.created;
    o->expires = p->rec.expires;
    o->warm = p->handle != 0;
}

static int32_t pin_find(const kvt_tiers *t, uint64_t id) {
    for (uint32_t i = 0; i < t->n_pins; i++)
        if (t->pins[i].rec.id == id) return (int32_t)i;
    return -1;
}

/* Removes entry i (pin_mu held): its RAM pin, its record. */
static void pin_remove_at(kvt_tiers *t, uint32_t i) {
    kvt_prompt_cache_unpin(t->o.ram, t->pins[i].handle);
    free(t->pins[i].rec.ns);
    free(t->pins[i].rec.tokens);
    t->pins[i] = t->pins[--t->n_pins];
}

uint64_t kvt_tiers_pin_budget(const kvt_tiers *t) { return t ? t->o.pin_budget : 0; }

kvt_status kvt_tiers_pin(kvt_tiers *t, const kvt_chain *c, const char *ns, int64_t created, int64_t expires,
                         kvt_tiers_pin_info *out) {
    memset(out, 0, sizeof(*out));
    if (!t) return KVT_ERR_UNSUPPORTED;
    const uint32_t n = kvt_chain_len(c);
    const uint64_t id = kvt_pin_id(kvt_chain_root(c), kvt_chain_tokens(c), n);
    if (!ns) ns = "";
    if (strlen(ns) > KVT_PIN_MAX_NS || n > KVT_PIN_MAX_TOKENS) return KVT_ERR_RANGE;
    tier_pin np = {.rec = {.id = id, .created = created ? created : (int64_t)time(NULL), .expires = expires,
                           .n_tokens = n}};
    np.rec.ns = strdup(ns);
    np.rec.tokens = malloc((size_t)n * sizeof(int32_t));
    if (!np.rec.ns || !np.rec.tokens) {
        free(np.rec.ns);
        free(np.rec.tokens);
        return KVT_ERR_NOMEM;
    }
    memcpy(np.rec.tokens, kvt_chain_tokens(c), (size_t)n * sizeof(int32_t));
    pthread_mutex_lock(&t->pin_mu);
    int32_t old = pin_find(t, id);
    kvt_status st = KVT_OK;
    if (old < 0 && t->n_pins >= KVT_PIN_MAX) st = KVT_ERR_RANGE;
    kvt_prompt_cache_pin_info pi;
    memset(&pi, 0, sizeof pi);
    if (st == KVT_OK) st = kvt_prompt_cache_pin(t->o.ram, c, &np.handle, &pi);
    np.tokens_in_ram = pi.tokens;
    np.bytes = pi.bytes;
    if (st == KVT_OK && old < 0) {
        tier_pin *nv = realloc(t->pins, ((size_t)t->n_pins + 1) * sizeof(*nv));
        if (!nv) {
            kvt_prompt_cache_unpin(t->o.ram, np.handle);
            st = KVT_ERR_NOMEM;
        } else {
            t->pins = nv;
            old = (int32_t)t->n_pins++;
            t->pins[old] = (tier_pin){0};
        }
    }
    if (st == KVT_OK) {
        tier_pin *p = &t->pins[old];
        kvt_prompt_cache_unpin(t->o.ram, p->handle); /* the new pin holds the units now */
        free(p->rec.ns);
        free(p->rec.tokens);
        *p = np;
        pin_info(p, out);
        if (t->o.ssd) /* pinned means persisted: the blocks go to the SSD tier whatever write-behind says */
            kvt_prompt_cache_pin_visit(t->o.ram, p->handle, kvt_ssd_persist_block, kvt_ssd_persist_snapshot, t->o.ssd);
        pins_save(t);
    } else {
        out->id = id;
        out->n_tokens = n;
        out->tokens_in_ram = pi.tokens;
        out->bytes = pi.bytes;
        free(np.rec.ns);
        free(np.rec.tokens);
    }
    pthread_mutex_unlock(&t->pin_mu);
    return st;
}

kvt_status kvt_tiers_unpin(kvt_tiers *t, uint64_t id) {
    if (!t) return KVT_ERR_NOT_FOUND;
    pthread_mutex_lock(&t->pin_mu);
    int32_t i = pin_find(t, id);
    if (i >= 0) {
        pin_remove_at(t, (uint32_t)i);
        pins_save(t);
    }
    pthread_mutex_unlock(&t->pin_mu);
    return i >= 0 ? KVT_OK : KVT_ERR_NOT_FOUND;
}

static void pins_expire(kvt_tiers *t) {
    const int64_t now = (int64_t)time(NULL);
    pthread_mutex_lock(&t->pin_mu);
    bool changed = false;
    for (uint32_t i = 0; i < t->n_pins;) {
        if (t->pins[i].rec.expires && t->pins[i].rec.expires <= now) {
            KVT_INFO("pinned prefixes: pin %016llx expired (ttl)", (unsigned long long)t->pins[i].rec.id);
            pin_remove_at(t, i);
            changed = true;
        } else {
            i++;
        }
    }
    if (changed) pins_save(t);
    pthread_mutex_unlock(&t->pin_mu);
}

kvt_status kvt_tiers_pins(kvt_tiers *t, kvt_tiers_pin_info **out, uint32_t *n) {
    *out = NULL;
    *n = 0;
    if (!t) return KVT_OK;
    pthread_mutex_lock(&t->pin_mu);
    kvt_tiers_pin_info *v = malloc(((size_t)t->n_pins + 1) * sizeof(*v));
    for (uint32_t i = 0; v && i < t->n_pins; i++) pin_info(&t->pins[i], &v[i]);
    *n = v ? t->n_pins : 0;
    pthread_mutex_unlock(&t->pin_mu);
    *out = v;
    return v ? KVT_OK : KVT_ERR_NOMEM;
}

kvt_status kvt_tiers_pins_cold(kvt_tiers *t, kvt_pin_rec **out, uint32_t *n) {
    *out = NULL;
    *n = 0;
    if (!t) return KVT_OK;
    pthread_mutex_lock(&t->pin_mu);
    kvt_pin_rec *v = calloc((size_t)t->n_pins + 1, sizeof(*v));
    uint32_t m = 0;
    kvt_status st = v ? KVT_OK : KVT_ERR_NOMEM;
    for (uint32_t i = 0; st == KVT_OK && i < t->n_pins; i++) {
        if (t->pins[i].handle) continue;
        kvt_pin_rec *r = &v[m++];
        *r = t->pins[i].rec;
        r->ns = strdup(t->pins[i].rec.ns);
        r->tokens = malloc((size_t)r->n_tokens * sizeof(int32_t));
        if (!r->ns || !r->tokens) st = KVT_ERR_NOMEM;
        else memcpy(r->tokens, t->pins[i].rec.tokens, (size_t)r->n_tokens * sizeof(int32_t));
    }
    pthread_mutex_unlock(&t->pin_mu);
    if (st != KVT_OK) {
        kvt_pin_recs_free(v, m);
        return st;
    }
    *out = v;
    *n = m;
    return KVT_OK;
}

/* ---- generation checkpoints ---- */

bool kvt_tiers_checkpoints(const kvt_tiers *t) { return t && t->o.ckpt; }

bool kvt_tiers_checkpoint_get(kvt_tiers *t, const uint8_t key[32], uint32_t n_prompt, uint32_t n_vocab, uint32_t max_new,
                              kvt_ckpt_rec *out) {
    return kvt_tiers_checkpoints(t) && kvt_ckpt_store_load(t->o.ckpt, key, n_prompt, n_vocab, max_new, out);
}

/* Every sealed block of seq, written regardless of write-behind (the flush's own path). */
static void persist_blocks(kvt_tiers *t, kvt_seq *seq) {
    const uint32_t ng = kvt_kv_layout_n_groups(kvt_ssd_layout(t->o.ssd)), nb = kvt_seq_n_blocks(seq);
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t g = 0; g < ng; g++) {
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (b && kvt_block_sealed(b)) kvt_ssd_persist_block(t->o.ssd, b);
        }
}

bool kvt_tiers_checkpoint_put(kvt_tiers *t, kvt_seq *seq, const kvt_ckpt_rec *rec, kvt_ckpt_watch **watch) {
    if (!kvt_tiers_checkpoints(t)) return false;
    /* the emitted prefix's KV: sealed blocks go to the SSD tier like any write-behind record. The
     * growing tail is not sealed and is recomputed on resume, except for recurrent layouts: their
     * state is snapshotted here, and the planner needs a unit ending at the snapshot's position,
     * so the tail is frozen (the next decode step copies it, at most one block per checkpoint). */
    kvt_snapshot *snap = NULL;
    if (t->o.ssd && t->recurrent) {
        const uint32_t bt = kvt_kv_layout_block_tokens(kvt_ssd_layout(t->o.ssd));
        if ((kvt_seq_len(seq) % bt == 0 || kvt_seq_freeze_tail(seq) == KVT_OK) && kvt_seq_snapshot(seq, &snap) != KVT_OK)
            snap = NULL; /* no memory: this checkpoint resumes by recomputing, as without a snapshot */
    }
    if (t->o.ssd && t->o.writeback) {
        kvt_ssd_enqueue_seq(t->o.ssd, seq, snap);
    } else if (t->o.ssd) {
        persist_blocks(t, seq);
        if (snap) kvt_ssd_persist_snapshot(t->o.ssd, snap);
    }
    if (snap) kvt_snapshot_release(snap);
    return kvt_ckpt_store_save(t->o.ckpt, rec, watch);
}

void kvt_tiers_checkpoint_drop(kvt_tiers *t, const uint8_t key[32]) {
    if (kvt_tiers_checkpoints(t)) kvt_ckpt_store_invalidate(t->o.ckpt, key);
}

void kvt_tiers_checkpoint_note(kvt_tiers *t, kvt_tiers_ckpt_event ev, uint32_t n) {
    if (!kvt_tiers_checkpoints(t)) return;
    switch (ev) {
    case KVT_TIERS_CKPT_RESUMED: kvt_ckpt_store_note_resumed(t->o.ckpt); break;
    case KVT_TIERS_CKPT_RETRY: kvt_ckpt_store_note_retry(t->o.ckpt); break;
    case KVT_TIERS_CKPT_RESUME_REUSED: kvt_ckpt_store_note_resume_reused(t->o.ckpt, n); break;
    }
}

/* ---- durability ---- */

/* The durability boundary. visit_ram: first hand every block and snapshot the RAM tier holds to the
 * SSD tier (write-behind off: nothing was queued as it filled; a drain: the entries that stay). */
static void flush_impl(kvt_tiers *t, uint32_t timeout_ms, bool visit_ram, kvt_tiers_flush_result *out) {
    out->durable = out->blocks.durable = out->checkpoints_durable = true;
    if (t && t->o.shared) {
        kvt_shared_stats ss;
        kvt_shared_stats_get(t->o.shared, &ss);
        out->shared_pending = ss.queue_blocks;
    }
    if (!t || !t->o.ssd) return;
    if (visit_ram && kvt_prompt_cache_visit(t->o.ram, kvt_ssd_persist_block, kvt_ssd_persist_snapshot, t->o.ssd) < 0) {
        kvt_ssd_flush(t->o.ssd, 0, &out->blocks);
        out->blocks.durable = false;
        snprintf(out->blocks.reason, sizeof out->blocks.reason, "out of memory listing the RAM tier's blocks to write");
    } else {
        kvt_ssd_flush(t->o.ssd, timeout_ms, &out->blocks);
    }
    out->durable = out->blocks.durable;
    snprintf(out->reason, sizeof out->reason, "%s", out->blocks.reason);
    /* queued checkpoint records are owed to disk too */
    if (t->o.ckpt && !kvt_ckpt_store_flush(t->o.ckpt, timeout_ms)) {
        out->checkpoints_durable = false;
        if (out->durable) {
            out->durable = false;
            snprintf(out->reason, sizeof out->reason, "generation checkpoint records are still being written");
        }
    }
}

uint32_t kvt_tiers_prefixes(kvt_tiers *t, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes) {
    return kvt_prompt_cache_prefixes(t ? t->o.ram : NULL, out, max, n_prefixes);
}

void kvt_tiers_flush(kvt_tiers *t, uint32_t timeout_ms, kvt_tiers_flush_result *out) {
    memset(out, 0, sizeof(*out));
    flush_impl(t, timeout_ms, t && !t->o.writeback, out);
}

kvt_status kvt_tiers_drain(kvt_tiers *t, uint32_t timeout_ms, kvt_tiers_flush_result *out) {
    memset(out, 0, sizeof(*out));
    if (!t || !t->o.ssd) return KVT_ERR_UNSUPPORTED;
    /* idle for >= 0 s: every entry the RAM tier may give up goes through the spill sink (the SSD
     * tier's record retains it until written), leaves first */
    out->demoted = kvt_prompt_cache_demote_idle(t->o.ram, 0);
    if (out->demoted) kvt_ssd_note_demotions(t->o.ssd, out->demoted);
    flush_impl(t, timeout_ms, true, out);
    return KVT_OK;
}
