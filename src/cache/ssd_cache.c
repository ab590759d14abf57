/* ssd_cache.c — the SSD tier's lifecycle: open (directory checks, scan, writer start), free,
 * accessors. See ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

/* ------------------------------------------------------------------ lifecycle */
void kvt_ssd_opts_default(kvt_ssd_opts *o) {
    memset(o, 0, sizeof(*o));
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
    s->dfd = -1;
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
    s->io = o->io;
    if (!s->io) {
        s->io = kvt_ssd_io_create(NULL);
        s->own_io = true;
        if (!s->io) {
            kvt_ssd_free(s);
            return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_mutex_init(&s->dir_mu, NULL);
    if (kvt_ssd_mkdir_p(s->io, s->cdir) != 0) {
        int e = errno;
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot create %s/%s: %s", o->dir, cd, strerror(e));
    }
    /* Untrusted directory: refuse a root or compat dir owned by someone else or writable by all;
     * the compat dir must not be a symlink (the root may be one: the user named it). The compat
     * dir is held open from here on (see kvt_ssd.dfd). */
    struct stat dsb;
    if (!kvt_ssd_dir_trusted(o->dir, true, err, errlen) || (s->dfd = kvt_ssd_dir_open_held(s->cdir, &dsb, err, errlen)) < 0) {
        kvt_ssd_free(s);
        return KVT_ERR_IO;
    }
    s->dir_dev = dsb.st_dev;
    s->dir_ino = dsb.st_ino;
    /* Human-readable key next to the files (best effort; informational only). */
    kvt_ssd_write_key_file(s->io, s->dfd, s->cdir, s->compat);
    pthread_mutex_lock(&s->mu);
    kvt_ssd_scan_dir(s);
    /* A crash between publishing a longer file and removing the tails it supersedes leaves both:
     * finish that here. Downward, so a swap-remove only moves already-visited entries. */
    for (uint32_t i = s->n_ents; i-- > 0;)
        if (i < s->n_ents) kvt_ssd_supersede(s, s->ents[i]);
    kvt_ssd_enforce_cap(s);
    pthread_mutex_unlock(&s->mu);
    if (pthread_create(&s->writer, NULL, kvt_ssd_writer_main, s) != 0) {
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
            kvt_ssd_item_release(it);
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
        pthread_mutex_destroy(&s->dir_mu);
    }
    if (s->dfd >= 0) close(s->dfd);
    if (s->own_io) kvt_ssd_io_free(s->io);
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
    if (s) kvt_ssd_io_set_fault(s->io, f);
}

/* ------------------------------------------------------------------ small metadata files */

kvt_status kvt_ssd_meta_write(kvt_ssd *s, const char *name, const void *data, size_t len, char *err, size_t errlen) {
    if (!s || !name || strchr(name, '/') || !name[0]) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "bad file name");
    char tmp[96];
    kvt_ssd_tmp_name(tmp, sizeof tmp, name); /* "NAME.<pid>-<nonce>.tmp": the startup scan reaps it if orphaned */
    pthread_mutex_lock(&s->dir_mu); /* the writer may replace dfd (a recreated directory) */
    int fd = kvt_ssd_io_create_excl_at(s->io, s->dfd, s->cdir, tmp);
    bool ok = fd >= 0 && kvt_ssd_io_pwrite(s->io, fd, data, len, 0, false) && kvt_ssd_io_fsync(s->io, fd);
    int e = errno;
    if (fd >= 0 && !kvt_ssd_io_close(s->io, fd) && ok) {
        ok = false;
        e = errno;
    }
    if (ok) ok = kvt_ssd_io_rename_at(s->io, s->dfd, s->cdir, tmp, name) && kvt_ssd_io_fsync_dirfd(s->io, s->dfd, s->cdir);
    if (!ok) {
        e = e ? e : errno;
        if (fd >= 0) kvt_ssd_io_unlink_at(s->io, s->dfd, s->cdir, tmp);
    }
    pthread_mutex_unlock(&s->dir_mu);
    if (!ok) return kvt_errf(err, errlen, KVT_ERR_IO, "cannot write %s/%s: %s", s->cdir, name, strerror(e ? e : EIO));
    return KVT_OK;
}

kvt_status kvt_ssd_meta_read(kvt_ssd *s, const char *name, size_t max, uint8_t **out, size_t *len, char *err,
                             size_t errlen) {
    *out = NULL;
    *len = 0;
    int fd = kvt_ssd_openat(s, name, O_RDONLY); /* a regular file, never through a symlink */
    if (fd < 0) {
        if (errno == ENOENT) return KVT_ERR_NOT_FOUND;
        return kvt_errf(err, errlen, KVT_ERR_IO, "cannot open %s/%s: %s", s->cdir, name, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size > max) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s/%s: larger than %zu bytes", s->cdir, name, max);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(b);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s/%s: short read", s->cdir, name);
    }
    *out = b;
    *len = n;
    return KVT_OK;
}
