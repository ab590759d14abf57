/* tier.c — see tier.h and docs/tiers.md. */
#include "tier.h"

#include <stdio.h>
#include <stdlib.h>

struct kvt_tiers {
    kvt_tiers_opts o;
};

kvt_tiers *kvt_tiers_create(const kvt_tiers_opts *o) {
    if (!o || !o->pool || !o->ram) return NULL;
    kvt_tiers *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->o = *o;
    kvt_block_pool_set_pressure(o->pool, kvt_tiers_pressure_cb, t);
    if (o->ssd) kvt_prompt_cache_set_spill(o->ram, kvt_ssd_spill_block, kvt_ssd_spill_snapshot, o->ssd);
    return t;
}

void kvt_tiers_free(kvt_tiers *t) {
    if (!t) return;
    kvt_block_pool_set_pressure(t->o.pool, NULL, NULL);
    if (t->o.ssd) kvt_prompt_cache_set_spill(t->o.ram, NULL, NULL, NULL);
    free(t);
}

/* RAM eviction first (LRU, leaf-first; what it evicts is spilled into the SSD tier, whose record
 * then holds the block). The SSD tier then gives up records that nothing else holds, so the spilled
 * memory is freed at once instead of waiting for the writer: the pressure path never waits for the
 * disk. Those blocks are then held by no tier, so no flush owes them. */
bool kvt_tiers_pressure_cb(void *ctx, uint64_t bytes_needed) {
    kvt_tiers *t = ctx;
    uint64_t want = bytes_needed ? bytes_needed : 1;
    uint64_t freed = kvt_prompt_cache_evict_bytes(t->o.ram, want);
    if (freed < want && t->o.ssd) freed += kvt_ssd_shed(t->o.ssd, want - freed);
    return freed > 0;
}

kvt_tiers_source kvt_tiers_block_source(const kvt_tiers_hit *h, uint32_t i) {
    if (!h || i >= h->n_blocks) return KVT_TIERS_NONE;
    return i < h->ram_blocks ? KVT_TIERS_RAM : KVT_TIERS_SSD;
}

/* The RAM tier serves alone (its own plan, counted by take). */
static kvt_status ram_only(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out) {
    kvt_status st = kvt_prompt_cache_take_chain(t->o.ram, c, &out->seq, &out->n_reused);
    if (st != KVT_OK || !out->seq) return st;
    const uint32_t bt = kvt_chain_block_tokens(c);
    out->from = KVT_TIERS_RAM;
    out->n_blocks = out->ram_blocks = (out->n_reused + bt - 1) / bt;
    if (kvt_kv_layout_state_bytes(kvt_block_pool_layout(t->o.pool)) > 0) out->state_from = KVT_TIERS_RAM;
    return KVT_OK;
}

kvt_status kvt_tiers_lookup(kvt_tiers *t, const kvt_chain *c, kvt_tiers_hit *out) {
    memset(out, 0, sizeof(*out));
    if (!t || !c) return KVT_ERR_INVALID_ARG;
    kvt_prompt_cache_peek_info ram;
    kvt_prompt_cache_peek_chain(t->o.ram, c, &ram);
    if (!t->o.ssd) return ram_only(t, c, out);
    /* the SSD tier plans on top of RAM's leading full blocks (they need no disk read) */
    uint32_t on_disk = kvt_ssd_find_from(t->o.ssd, c, ram.full_blocks);
    if (on_disk <= ram.usable) return ram_only(t, c, out);

    const uint32_t bt = kvt_chain_block_tokens(c);
    uint32_t k = KVT_MIN(ram.full_blocks, on_disk / bt);
    kvt_seq *base = NULL;
    if (k) {
        /* RAM's blocks [0, k') with what the final length needs; k' < k when some went away since
         * the peek (the SSD tier then restores from block k') */
        kvt_status st = kvt_prompt_cache_take_blocks(t->o.ram, c, k, on_disk, &base);
        if (st != KVT_OK) return st;
        k = kvt_seq_len(base) / bt;
    }
    double r0 = kvt_now_ms();
    kvt_seq *rs = NULL;
    uint32_t got = 0;
    kvt_ssd_restore_info info;
    kvt_status st = kvt_ssd_restore_from(t->o.ssd, c, base, &rs, &got, &info);
    out->restore_ms = kvt_now_ms() - r0;
    out->ssd_files_read = info.files_read;
    out->ssd_bytes_read = info.bytes_read;
    if (base) kvt_seq_free(base); /* rs shares its blocks */
    if (st == KVT_OK && rs && got > ram.usable) {
        if (k) kvt_prompt_cache_count_take(t->o.ram, k * bt); /* RAM served blocks [0, k) */
        out->seq = rs;
        out->n_reused = got;
        out->from = KVT_TIERS_SSD;
        out->n_blocks = (got + bt - 1) / bt;
        out->ram_blocks = k;
        out->ssd_blocks = out->n_blocks - k;
        if (info.snapshot) out->state_from = KVT_TIERS_SSD;
        return KVT_OK;
    }
    /* shorter than RAM after all (a file went bad), or no memory for the restore (RAM's own plan
     * shares blocks instead of allocating them): RAM serves */
    if (rs) kvt_seq_free(rs);
    double ms = out->restore_ms;
    uint64_t fr = out->ssd_files_read, br = out->ssd_bytes_read;
    st = ram_only(t, c, out);
    out->restore_ms = ms;
    out->ssd_files_read = fr;
    out->ssd_bytes_read = br;
    return st;
}

kvt_status kvt_tiers_put(kvt_tiers *t, kvt_seq *seq) {
    kvt_status st = kvt_prompt_cache_put(t->o.ram, seq);
    if (st != KVT_OK || !t->o.ssd || !t->o.writeback) return st;
    kvt_snapshot *snap = NULL;
    /* the tail is frozen by the put; a failed snapshot only loses the SSD copy of the state */
    if (kvt_kv_layout_state_bytes(kvt_block_pool_layout(kvt_seq_pool(seq))) > 0 && kvt_seq_snapshot(seq, &snap) != KVT_OK)
        snap = NULL;
    kvt_ssd_enqueue_seq(t->o.ssd, seq, snap);
    if (snap) kvt_snapshot_release(snap);
    return KVT_OK;
}

kvt_status kvt_tiers_put_blocks(kvt_tiers *t, kvt_seq *seq) {
    kvt_status st = kvt_prompt_cache_put_blocks(t->o.ram, seq);
    if (st == KVT_OK && t->o.ssd && t->o.writeback) kvt_ssd_enqueue_seq(t->o.ssd, seq, NULL);
    return st;
}

void kvt_tiers_flush(kvt_tiers *t, uint32_t timeout_ms, kvt_ssd_flush_result *out) {
    if (!t || !t->o.ssd) {
        memset(out, 0, sizeof(*out));
        out->durable = true;
        return;
    }
    /* write-behind off: nothing was queued as it filled, so write what the RAM tier holds now */
    if (!t->o.writeback &&
        kvt_prompt_cache_visit(t->o.ram, kvt_ssd_persist_block, kvt_ssd_persist_snapshot, t->o.ssd) < 0) {
        kvt_ssd_flush(t->o.ssd, 0, out);
        out->durable = false;
        snprintf(out->reason, sizeof out->reason, "out of memory listing the RAM tier's blocks to write");
        return;
    }
    kvt_ssd_flush(t->o.ssd, timeout_ms, out);
}
