/* ssd_cache.c — the SSD tier's lifecycle: open (directory checks, scan, writer start), free,
 * accessors. See ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

/* ------------------------------------------------------------------ lifecycle */
void kvt_ssd_opts_default(kvt_ssd_opts *o) {
    memset(o, 0, sizeof(*o));
    o->writeback = true;
    o->queue_max_bytes = SSD_DEFAULT_QUEUE;
}


kvt_status kvt_ssd_open(const kvt_ssd_opts *o, const kvt_kv_layout *layout, kvt_block_pool *pool,
                        kvt_ssd **out, char *err, size_t errlen) {
    *out = NULL;
    if (!o || !o->dir || !o->dir[0] || !o->compat_key || !o->compat_key[0] || !layout || !pool)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "ssd cache: dir, compat key, layout and pool required");
    if (strlen(o->compat_key) >= KVT_SSD_COMPAT_KEY_MAX)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "ssd cache: compat key too long");
    kvt_ssd *s = calloc(1, sizeof(*s));
    if (!s) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    s->o = *o;
    s->layout = layout;
    s->pool = pool;
    s->bt = kvt_kv_layout_block_tokens(layout);
    s->n_groups = kvt_kv_layout_n_groups(layout);
    s->root_dir = strdup(o->dir);
    s->compat = strdup(o->compat_key);
    s->o.dir = s->root_dir;
    s->o.compat_key = s->compat;
    s->compat_hash = XXH3_64bits(s->compat, strlen(s->compat));
    char cd[33];
    kvt_ssd_compat_dir(s->compat, cd);
    size_t cl = strlen(o->dir) + 40;
    s->cdir = malloc(cl);
    if (!s->root_dir || !s->compat || !s->cdir) {
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    snprintf(s->cdir, cl, "%s/%s", o->dir, cd);
    atomic_store(&s->fault, (int)fault_from_env());
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    if (mkdir_p(s->cdir) != 0) {
        int e = errno;
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot create %s/%s: %s", o->dir, cd, strerror(e));
    }
    /* Untrusted directory: refuse a root or compat dir owned by someone else or writable by all;
     * the compat dir must not be a symlink (the root may be one: the user named it). */
    if (!dir_trusted(o->dir, true, err, errlen) || !dir_trusted(s->cdir, false, err, errlen)) {
        kvt_ssd_free(s);
        return KVT_ERR_IO;
    }
    /* Human-readable key next to the files (best effort; informational only). */
    write_key_file(s->cdir, s->compat);
    DIR *d = opendir(s->cdir);
    if (!d) {
        int e = errno;
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot list %s: %s", o->dir, strerror(e));
    }
    closedir(d);
    pthread_mutex_lock(&s->mu);
    scan_dir(s);
    /* A crash between publishing a longer file and removing the tails it supersedes leaves both:
     * finish that here. Downward, so a swap-remove only moves already-visited entries. */
    for (uint32_t i = s->n_ents; i-- > 0;)
        if (i < s->n_ents) supersede(s, s->ents[i]);
    enforce_cap(s);
    pthread_mutex_unlock(&s->mu);
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "ssd cache: cannot start writer thread");
    }
    s->writer_started = true;
    KVT_INFO("ssd cache: %s: %u entries, %.1f MB", s->cdir, s->n_ents, (double)s->bytes / 1e6);
    *out = s;
    return KVT_OK;
}

void kvt_ssd_free(kvt_ssd *s) {
    if (!s) return;
    if (s->writer_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv_work);
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
    }
    ssd_item *lists[2] = {s->q_head, s->d_head};
    for (int l = 0; l < 2; l++)
        while (lists[l]) {
            ssd_item *it = lists[l];
            lists[l] = it->next;
            s->dropped++;
            item_release(it);
        }
    for (uint32_t i = 0; i < s->n_ents; i++) {
        free(s->ents[i]->tokens);
        free(s->ents[i]);
    }
    free(s->ents);
    free(s->tab_key);
    free(s->tab_link);
    if (s->cdir) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv_work);
        pthread_cond_destroy(&s->cv_done);
    }
    free(s->root_dir);
    free(s->compat);
    free(s->cdir);
    free(s);
}

const char *kvt_ssd_dir(const kvt_ssd *s) { return s ? s->cdir : NULL; }
const char *kvt_ssd_compat(const kvt_ssd *s) { return s ? s->compat : NULL; }
const kvt_kv_layout *kvt_ssd_layout(const kvt_ssd *s) { return s ? s->layout : NULL; }
void kvt_ssd_pause_writer(kvt_ssd *s, bool paused) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->paused = paused;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}
void kvt_ssd_set_fault(kvt_ssd *s, kvt_ssd_fault f) {
    if (s) atomic_store(&s->fault, (int)f);
}
