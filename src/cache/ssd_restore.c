/* ssd_restore.c — the SSD tier, lookup (restore planning) and streamed, checksummed restore. See
 * ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

/* ------------------------------------------------------------------ lookup */

static void plan_free(plan *pl) {
    free(pl->idx);
    free(pl->need);
    free(pl->child_tokens);
    memset(pl, 0, sizeof(*pl));
}

static bool tokens_eq(const int32_t *a, const int32_t *b, uint32_t n) { return memcmp(a, b, (size_t)n * 4) == 0; }

/* Entry of group g, kind, chain whose parent and tokens match. Lock held. */
static ssd_entry *match_entry(kvt_ssd *s, uint64_t chain, uint32_t g, uint32_t kind, uint64_t parent,
                              const int32_t *toks, uint32_t nt) {
    ssd_entry *e = idx_find(s, chain, g, kind);
    if (!e || e->link != parent || e->n_tokens != nt || !tokens_eq(e->tokens, toks, nt)) return NULL;
    return e;
}

/* First block index a WINDOW group needs at final length p (conservative: covers key p-W). */
static uint32_t window_lo(uint32_t p, uint32_t w, uint32_t bt) { return p > w ? (p - w) / bt : 0; }

/* True if, for every WINDOW group, the blocks [window_lo(pos), upto) the window at pos needs are on
 * disk (present[] covers block indexes < K). */
static bool windows_held(kvt_ssd *s, const bool *present, uint32_t K, uint32_t pos, uint32_t upto) {
    uint32_t G = s->n_groups, bt = s->bt;
    for (uint32_t g = 0; g < G; g++) {
        if (kvt_kv_layout_group_kind(s->layout, g) != KVT_KIND_WINDOW) continue;
        for (uint32_t j = window_lo(pos, kvt_kv_layout_group_window(s->layout, g), bt); j < upto && j < K; j++)
            if (!present[(size_t)j * G + g]) return false;
    }
    return true;
}

/* Recurrent layouts: the longest block boundary i*bt (<= n-1, i <= K) with a snapshot file whose
 * window groups are held; 0 if none. */
static uint32_t boundary_snapshot(kvt_ssd *s, const uint64_t *h, const bool *present, uint32_t K, uint32_t n,
                                  uint64_t *snap_chain) {
    for (uint32_t i = K; i >= 1; i--) {
        uint32_t pos = i * s->bt;
        if (pos > n - 1) continue;
        ssd_entry *sn = idx_find(s, h[i], SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
        if (!sn || sn->n_tokens != pos || !windows_held(s, present, K, pos, i)) continue;
        *snap_chain = h[i];
        return pos;
    }
    return 0;
}

/* Builds the restore plan (index only). Lock held. */
static bool build_plan(kvt_ssd *s, const int32_t *prompt, uint32_t n, uint64_t root, plan *pl) {
    memset(pl, 0, sizeof(*pl));
    if (!prompt || n < 2) return true;
    const uint32_t bt = s->bt, G = s->n_groups;
    const bool recurrent = kvt_kv_layout_state_bytes(s->layout) > 0;
    const uint32_t nfull = n / bt;
    const uint32_t max_idx = nfull + 1;
    pl->idx = calloc(max_idx, sizeof(*pl->idx));
    pl->need = calloc((size_t)max_idx * (G ? G : 1), sizeof(bool));
    uint64_t *h = malloc(((size_t)max_idx + 1) * sizeof(uint64_t));
    bool *present = calloc((size_t)max_idx * (G ? G : 1), sizeof(bool));
    if (!pl->idx || !pl->need || !h || !present) {
        free(h);
        free(present);
        plan_free(pl);
        return false;
    }
    /* Walk full blocks of the prompt: K = leading indices present for every FULL group. */
    h[0] = root;
    uint32_t K = 0;
    bool full_ok = true;
    for (uint32_t i = 0; i < nfull; i++) {
        const int32_t *tk = prompt + (size_t)i * bt;
        h[i + 1] = kvt_chain_hash(h[i], tk, bt);
        bool any = false;
        for (uint32_t g = 0; g < G; g++) {
            present[(size_t)i * G + g] = match_entry(s, h[i + 1], g, KVT_SSD_KIND_BLOCK, h[i], tk, bt) != NULL;
            any |= present[(size_t)i * G + g];
            if (kvt_kv_layout_group_kind(s->layout, g) != KVT_KIND_WINDOW && !present[(size_t)i * G + g]) full_ok = false;
        }
        if (!full_ok) break;
        (void)any;
        pl->idx[i] = (plan_idx){h[i + 1], h[i], KVT_SSD_KIND_BLOCK, bt};
        K = i + 1;
    }
    /* Child at index K (block or tail) with the longest common prefix, present in every group. */
    uint32_t best_lcp = 0;
    ssd_entry *best = NULL;
    const uint32_t rem = n - K * bt;
    if (G > 0 && s->n_buckets > 0) {
        for (ssd_entry *e = s->tab_link[link_hash(h[K]) % s->n_buckets]; e; e = e->next_link) {
            if (e->link != h[K] || e->kind == KVT_SSD_KIND_SNAPSHOT || e->group != 0 || e->index != K) continue;
            uint32_t m = KVT_MIN(e->n_tokens, rem), l = 0;
            while (l < m && e->tokens[l] == prompt[(size_t)K * bt + l]) l++;
            if (l == 0 || l <= best_lcp) continue;
            if (recurrent && l != e->n_tokens) continue; /* recurrent: exact boundaries only */
            bool all = true;
            for (uint32_t g = 1; g < G && all; g++) all = idx_find(s, e->chain, g, e->kind) != NULL;
            if (!all) continue;
            best = e;
            best_lcp = l;
        }
    }
    uint32_t p = 0;
    if (!recurrent) {
        uint32_t covered = K * bt + best_lcp;
        p = KVT_MIN(covered, n - 1);
        /* WINDOW groups: every block the final window sees must be on disk. */
        bool changed = true;
        while (p > 0 && changed) {
            changed = false;
            for (uint32_t g = 0; g < G && !changed; g++) {
                if (kvt_kv_layout_group_kind(s->layout, g) != KVT_KIND_WINDOW) continue;
                uint32_t lo = window_lo(p, kvt_kv_layout_group_window(s->layout, g), bt);
                uint32_t hi = (p + bt - 1) / bt; /* exclusive */
                for (uint32_t j = lo; j < hi; j++) {
                    bool ok = j < K ? present[(size_t)j * G + g] : true; /* j == K: best child */
                    if (!ok) {
                        p = j * bt;
                        changed = true;
                        break;
                    }
                }
            }
        }
    } else {
        /* Recurrent: exact snapshot positions only (no trim). Candidates, longest first: the best
         * child's end, then block boundaries K*bt .. bt. */
        uint32_t cand_child = best ? K * bt + best->n_tokens : 0;
        if (cand_child && cand_child <= n - 1) {
            ssd_entry *sn = idx_find(s, best->chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
            if (sn && sn->n_tokens == cand_child) {
                p = cand_child;
                pl->snap_chain = best->chain;
            }
        }
        if (p == 0) p = boundary_snapshot(s, h, present, K, n, &pl->snap_chain);
        if (p && p == cand_child && !windows_held(s, present, K, p, K)) {
            /* the child's window is incomplete: fall back to a boundary snapshot */
            p = boundary_snapshot(s, h, present, K, n, &pl->snap_chain);
        }
        pl->snap = p > 0;
    }
    if (p > 0) {
        pl->p = p;
        pl->n_idx = (p + bt - 1) / bt;
        if (pl->n_idx > K) { /* the last index is the best child */
            pl->idx[K] = (plan_idx){best->chain, best->link, best->kind, best->n_tokens};
            pl->child_tokens = malloc((size_t)best->n_tokens * 4);
            if (!pl->child_tokens) {
                free(h);
                free(present);
                plan_free(pl);
                return false;
            }
            memcpy(pl->child_tokens, best->tokens, (size_t)best->n_tokens * 4);
        }
        for (uint32_t j = 0; j < pl->n_idx && pl->p; j++) {
            bool any = false;
            for (uint32_t g = 0; g < G; g++) {
                bool need = true;
                if (kvt_kv_layout_group_kind(s->layout, g) == KVT_KIND_WINDOW)
                    need = j >= window_lo(p, kvt_kv_layout_group_window(s->layout, g), bt);
                if (need && j < K && !present[(size_t)j * G + g]) need = false; /* outside window */
                pl->need[(size_t)j * G + g] = need;
                any |= need;
            }
            /* A sequence learns its tokens from the blocks: an index outside every window still
             * needs one block (released again right after appending). */
            for (uint32_t g = 0; g < G && !any; g++)
                if (j < K && present[(size_t)j * G + g]) pl->need[(size_t)j * G + g] = any = true;
            if (!any) { /* tokens of this index are on disk in no group: give up (miss) */
                free(h);
                free(present);
                plan_free(pl);
                return true;
            }
        }
    }
    free(h);
    free(present);
    return true;
}

uint32_t kvt_ssd_find(kvt_ssd *s, const int32_t *prompt, uint32_t n, uint64_t root) {
    if (!s) return 0;
    plan pl;
    pthread_mutex_lock(&s->mu);
    bool ok = build_plan(s, prompt, n, root, &pl);
    pthread_mutex_unlock(&s->mu);
    uint32_t p = ok ? pl.p : 0;
    plan_free(&pl);
    return p;
}

/* ------------------------------------------------------------------ restore */
/* Reads section `sec` of an open file into dst (exact length), verifying its checksum. Tries
 * O_DIRECT when dst and len are page-aligned; falls back to buffered reads. */
static kvt_status read_section(kvt_ssd *s, int fd, const char *path, const hdr_out *h, uint32_t sec,
                               uint8_t *dst, uint64_t len) {
    hdr_section sc = hdr_section_at(h, sec);
    if (sc.length != len) return KVT_ERR_FORMAT;
    if (atomic_load(&s->fault) == KVT_SSD_FAULT_EIO_READ) {
        errno = EIO;
        return KVT_ERR_IO;
    }
    bool done = false;
#ifdef O_DIRECT
    if (((uintptr_t)dst % SSD_PAGE) == 0 && len % SSD_PAGE == 0 && len > 0) {
        int dfd = open_cache_file(path, O_RDONLY | O_DIRECT);
        if (dfd >= 0) {
            done = read_full(dfd, dst, len, sc.offset) == KVT_OK;
            close(dfd);
        }
    }
#endif
    (void)path;
    if (!done && read_full(fd, dst, len, sc.offset) != KVT_OK) return KVT_ERR_IO;
    if (XXH3_64bits(dst, len) != sc.hash) return KVT_ERR_CORRUPT;
    return KVT_OK;
}

/* Opens a file and validates its header against expectations. */
static kvt_status open_checked(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind, char *path,
                               size_t plen, int *fdp, uint8_t **bufp, hdr_out *h, char *err, size_t errlen) {
    char name[64];
    entry_name(name, sizeof(name), chain, group, kind);
    snprintf(path, plen, "%s/%s", s->cdir, name);
    *bufp = NULL;
    *fdp = open_cache_file(path, O_RDONLY);
    if (*fdp < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "open: %s", strerror(errno));
    kvt_status st = header_read_fd(*fdp, bufp, h, err, errlen);
    if (st == KVT_OK) st = header_matches(s, h, chain, group, kind, err, errlen);
    if (st != KVT_OK) {
        close(*fdp);
        *fdp = -1;
        free(*bufp);
        *bufp = NULL;
    }
    return st;
}

/* Removes a bad file found during restore (warns). */
static void drop_bad(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind, const char *why) {
    char name[64];
    entry_name(name, sizeof(name), chain, group, kind);
    pthread_mutex_lock(&s->mu);
    ssd_entry *e = idx_find(s, chain, group, kind);
    if (!e) { /* left the index after the plan was made (superseded or evicted): benign, just retry */
        pthread_mutex_unlock(&s->mu);
        return;
    }
    KVT_WARN("ssd cache: dropping %s/%s: %s (falling back)", s->cdir, name, why);
    drop_entry(s, e);
    s->corrupt_removed++;
    pthread_mutex_unlock(&s->mu);
}

/* ---- streamed block restore: a reader thread loads block k+1 while the caller verifies block k.
 *
 * A job is one (index j, group g) file. The reader opens it (O_DIRECT when the filesystem allows,
 * else buffered with POSIX_FADV_SEQUENTIAL), reads and checks the header against the plan, allocates
 * the pool block and reads the whole payload straight into block memory with one large request
 * (a compact tail lands at the start of the block; a final partial page goes through a one-page
 * bounce buffer). The caller verifies the XXH3 of the payload in block memory (once), expands a
 * compact tail in place, seals and appends. The reader starts job k+1 only after the caller took job
 * k, so at most one block beyond those being restored is in memory. */
typedef struct rjob {
    uint32_t j, g, use;   /* index, group, tokens the sequence keeps from this file */
    const int32_t *toks;  /* the file's expected token ids (plan idx n_tokens of them) */
} rjob;

typedef struct rload {
    kvt_status st;
    char err[200];
    kvt_block *b;
    uint64_t len, hash;   /* payload section length and checksum (from the checked header) */
} rload;

typedef struct rpipe {
    kvt_ssd *s;
    const plan *pl;
    const rjob *jobs;
    uint32_t n_jobs;
    uint8_t *bounce;      /* one page, for the last partial page of an O_DIRECT read */
    pthread_t th;
    bool threaded;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool full, stop, done;
    rload slot;
} rpipe;

/* Reads len payload bytes at file offset off into dst. direct: fd has O_DIRECT, dst is page-aligned
 * and off is a page multiple (the format guarantees it); the file is padded to a page multiple. */
static kvt_status read_payload(kvt_ssd *s, int fd, bool direct, uint8_t *dst, uint64_t len, uint64_t off,
                               uint8_t *bounce) {
    if (atomic_load(&s->fault) == KVT_SSD_FAULT_EIO_READ) {
        errno = EIO;
        return KVT_ERR_IO;
    }
    if (!direct) return read_full(fd, dst, len, off);
    uint64_t whole = len / SSD_PAGE * SSD_PAGE;
    if (whole && read_upto(fd, dst, whole, off) != (int64_t)whole) return KVT_ERR_IO;
    if (len > whole) {
        if (read_upto(fd, bounce, SSD_PAGE, off + whole) < (int64_t)(len - whole)) return KVT_ERR_IO;
        memcpy(dst + whole, bounce, len - whole);
    }
    return KVT_OK;
}

/* Opens a file for restore: O_DIRECT when possible, else buffered + sequential readahead. */
static int open_restore(const char *path, bool *direct) {
    int fd = -1;
#ifdef O_DIRECT
    fd = open_cache_file(path, O_RDONLY | O_DIRECT);
#endif
    *direct = fd >= 0;
    if (fd < 0) {
        fd = open_cache_file(path, O_RDONLY);
        if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    return fd;
}

/* Loads job k: everything but the payload checksum, tail expansion and seal. */
static void load_job(rpipe *P, uint32_t k, rload *L) {
    kvt_ssd *s = P->s;
    const rjob *jb = &P->jobs[k];
    const plan_idx *pi = &P->pl->idx[jb->j];
    memset(L, 0, sizeof(*L));
    char name[64], path[PATH_MAX];
    entry_name(name, sizeof(name), pi->chain, jb->g, pi->kind);
    snprintf(path, sizeof(path), "%s/%s", s->cdir, name);
    bool direct;
    int fd = open_restore(path, &direct);
    if (fd < 0) {
        L->st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_IO, "open: %s", strerror(errno));
        return;
    }
    uint8_t *buf = NULL;
    hdr_out h;
    int rerr = 0;
    kvt_status st = header_read_any(fd, direct, &buf, &h, &rerr, L->err, sizeof(L->err));
    if (st == KVT_ERR_IO && direct && rerr == EINVAL) { /* O_DIRECT accepted at open, refused at read */
        close(fd);
        direct = false;
        fd = open_cache_file(path, O_RDONLY);
        if (fd < 0) {
            L->st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_IO, "open: %s", strerror(errno));
            return;
        }
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        L->err[0] = 0;
        st = header_read_any(fd, false, &buf, &h, NULL, L->err, sizeof(L->err));
    }
    if (st == KVT_OK) st = header_matches(s, &h, pi->chain, jb->g, pi->kind, L->err, sizeof(L->err));
    if (st == KVT_OK && (h.info.block_index != jb->j || h.info.parent != pi->parent || h.info.n_tokens != pi->n_tokens))
        st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_FORMAT, "header position mismatch");
    for (uint32_t t = 0; st == KVT_OK && t < pi->n_tokens; t++)
        if (hdr_id_at(&h, t) != jb->toks[t]) st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_FORMAT, "token mismatch");
    if (st == KVT_OK) {
        hdr_section sc = hdr_section_at(&h, 0);
        L->len = sc.length;
        L->hash = sc.hash;
        kvt_status ast = kvt_block_alloc(s->pool, jb->g, jb->j, &L->b);
        if (ast != KVT_OK) {
            st = ast == KVT_ERR_POOL_EXHAUSTED ? ast : KVT_ERR_NOMEM;
        } else if (sc.length > kvt_block_data_bytes(L->b)) { /* header_matches makes this impossible */
            st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_FORMAT, "payload larger than the block");
        } else {
            uint8_t *dst = kvt_block_data_mut(L->b);
            if (direct && (uintptr_t)dst % SSD_PAGE != 0) { /* small block: not page-aligned */
                close(fd);
                direct = false;
                fd = open_cache_file(path, O_RDONLY);
            }
            st = fd < 0 ? KVT_ERR_IO : read_payload(s, fd, direct, dst, sc.length, sc.offset, P->bounce);
            if (st != KVT_OK) kvt_errf(L->err, sizeof(L->err), st, "payload read failed");
        }
    }
    if (fd >= 0) close(fd);
    free(buf);
    if (st != KVT_OK && L->b) {
        kvt_block_release(L->b);
        L->b = NULL;
    }
    L->st = st;
}

static void *reader_main(void *arg) {
    rpipe *P = arg;
    for (uint32_t k = 0; k < P->n_jobs; k++) {
        pthread_mutex_lock(&P->mu);
        while (P->full && !P->stop) pthread_cond_wait(&P->cv, &P->mu); /* caller took job k-1 */
        bool stop = P->stop;
        pthread_mutex_unlock(&P->mu);
        if (stop) break;
        rload L;
        load_job(P, k, &L);
        pthread_mutex_lock(&P->mu);
        if (P->stop) {
            pthread_mutex_unlock(&P->mu);
            if (L.b) kvt_block_release(L.b);
            break;
        }
        P->slot = L;
        P->full = true;
        pthread_cond_broadcast(&P->cv);
        pthread_mutex_unlock(&P->mu);
        if (L.st != KVT_OK) break;
    }
    pthread_mutex_lock(&P->mu);
    P->done = true;
    pthread_cond_broadcast(&P->cv);
    pthread_mutex_unlock(&P->mu);
    return NULL;
}

static bool pipe_start(rpipe *P) {
    if (posix_memalign((void **)&P->bounce, SSD_PAGE, SSD_PAGE) != 0) return false;
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->cv, NULL);
    P->threaded = pthread_create(&P->th, NULL, reader_main, P) == 0; /* else: load inline */
    return true;
}

/* Result of job k (in order). */
static void pipe_take(rpipe *P, uint32_t k, rload *L) {
    if (!P->threaded) {
        load_job(P, k, L);
        return;
    }
    pthread_mutex_lock(&P->mu);
    while (!P->full && !P->done) pthread_cond_wait(&P->cv, &P->mu);
    if (P->full) {
        *L = P->slot;
        P->full = false;
        pthread_cond_broadcast(&P->cv);
    } else { /* cannot happen: the reader stops only after handing over an error */
        memset(L, 0, sizeof(*L));
        L->st = KVT_ERR_IO;
    }
    pthread_mutex_unlock(&P->mu);
}

static void pipe_stop(rpipe *P) {
    if (P->threaded) {
        pthread_mutex_lock(&P->mu);
        P->stop = true;
        pthread_cond_broadcast(&P->cv);
        pthread_mutex_unlock(&P->mu);
        pthread_join(P->th, NULL);
        if (P->full && P->slot.b) kvt_block_release(P->slot.b);
        P->full = false;
    }
    pthread_mutex_destroy(&P->mu);
    pthread_cond_destroy(&P->cv);
    free(P->bounce);
    P->bounce = NULL;
}

/* Caller side of job k: payload checksum (once, over block memory), tail expansion, seal. On
 * failure releases the block and returns the error (err filled). */
static kvt_status finish_job(kvt_ssd *s, const plan_idx *pi, const rjob *jb, rload *L) {
    if (XXH3_64bits(kvt_block_data(L->b), L->len) != L->hash) {
        snprintf(L->err, sizeof(L->err), "payload checksum mismatch");
        kvt_block_release(L->b);
        L->b = NULL;
        return KVT_ERR_CORRUPT;
    }
    kvt_status st = KVT_OK;
    if (pi->kind == KVT_SSD_KIND_TAIL &&
        !tail_unpack_inplace(s->layout, jb->g, jb->j, pi->n_tokens, kvt_block_data_mut(L->b), kvt_block_data_bytes(L->b)))
        st = KVT_ERR_NOMEM;
    if (st == KVT_OK) {
        st = kvt_block_seal(L->b, pi->parent, jb->toks, jb->use, jb->use == pi->n_tokens ? pi->chain : 0);
        if (st != KVT_OK) snprintf(L->err, sizeof(L->err), "seal failed: %s", kvt_status_str(st));
    }
    if (st != KVT_OK) {
        kvt_block_release(L->b);
        L->b = NULL;
    }
    return st;
}

static kvt_status load_snapshot(kvt_ssd *s, uint64_t chain, uint32_t pos, kvt_seq *seq, char *err, size_t errlen) {
    char path[PATH_MAX];
    int fd;
    uint8_t *buf;
    hdr_out h;
    kvt_status st = open_checked(s, chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT, path, sizeof(path), &fd, &buf,
                                 &h, err, errlen);
    if (st != KVT_OK) return st;
    if (h.info.n_tokens != pos) st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot position mismatch");
    uint32_t sec = 0, nl = kvt_kv_layout_n_layers(s->layout);
    for (uint32_t l = 0; l < nl && st == KVT_OK; l++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(s->layout, l);
        if (d->kind != KVT_KIND_RECURRENT) continue;
        st = read_section(s, fd, path, &h, sec++, kvt_seq_state(seq, l), d->state_bytes);
        if (st != KVT_OK) kvt_errf(err, errlen, st, "snapshot section %s", st == KVT_ERR_CORRUPT ? "checksum mismatch" : "read failed");
    }
    close(fd);
    free(buf);
    return st;
}

/* Touches the files and index entries of a successful restore (LRU bump). */
static void bump_lru(kvt_ssd *s, const plan *pl) {
    uint64_t now = now_real_ns();
    /* the file's mtime is the persisted LRU stamp: set it to the index's fine-grained `now`, not to
     * the kernel's coarse current time (a tie with a file written a few ms earlier would make the
     * eviction order after a restart arbitrary) */
    const struct timespec tv[2] = {{.tv_sec = (time_t)(now / 1000000000ull), .tv_nsec = (long)(now % 1000000000ull)},
                                   {.tv_sec = (time_t)(now / 1000000000ull), .tv_nsec = (long)(now % 1000000000ull)}};
    char name[64], path[PATH_MAX];
    pthread_mutex_lock(&s->mu);
    for (uint32_t j = 0; j < pl->n_idx; j++)
        for (uint32_t g = 0; g < s->n_groups; g++) {
            if (!pl->need[(size_t)j * s->n_groups + g]) continue;
            ssd_entry *e = idx_find(s, pl->idx[j].chain, g, pl->idx[j].kind);
            if (e) e->last_use = now;
            entry_name(name, sizeof(name), pl->idx[j].chain, g, pl->idx[j].kind);
            snprintf(path, sizeof(path), "%s/%s", s->cdir, name);
            utimensat(AT_FDCWD, path, tv, AT_SYMLINK_NOFOLLOW);
        }
    if (pl->snap) {
        ssd_entry *e = idx_find(s, pl->snap_chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
        if (e) e->last_use = now;
        entry_name(name, sizeof(name), pl->snap_chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
        snprintf(path, sizeof(path), "%s/%s", s->cdir, name);
        utimensat(AT_FDCWD, path, tv, AT_SYMLINK_NOFOLLOW);
    }
    pthread_mutex_unlock(&s->mu);
}

kvt_status kvt_ssd_restore(kvt_ssd *s, const int32_t *prompt, uint32_t n, uint64_t root, kvt_seq **out,
                           uint32_t *n_restored) {
    *out = NULL;
    *n_restored = 0;
    if (!s) return KVT_OK;
    double t0 = kvt_now_ms();
    const uint32_t G = s->n_groups, bt = s->bt;
    for (int attempt = 0; attempt < 64; attempt++) {
        plan pl;
        pthread_mutex_lock(&s->mu);
        bool ok = build_plan(s, prompt, n, root, &pl);
        pthread_mutex_unlock(&s->mu);
        if (!ok) return KVT_ERR_NOMEM;
        if (pl.p == 0) {
            plan_free(&pl);
            return KVT_OK;
        }
        kvt_seq *seq = NULL;
        kvt_status st = kvt_seq_create(s->pool, root, &seq);
        if (st != KVT_OK) {
            plan_free(&pl);
            return st;
        }
        bool retry = false;
        /* jobs: every needed (index, group) file, in index then group order */
        uint32_t n_jobs = 0;
        rjob *jobs = malloc((size_t)pl.n_idx * G * sizeof(*jobs) + sizeof(*jobs));
        if (!jobs) {
            kvt_seq_free(seq);
            plan_free(&pl);
            return KVT_ERR_NOMEM;
        }
        for (uint32_t j = 0; j < pl.n_idx; j++)
            for (uint32_t g = 0; g < G; g++) {
                if (!pl.need[(size_t)j * G + g]) continue;
                rjob *jb = &jobs[n_jobs++];
                jb->j = j;
                jb->g = g;
                jb->toks = (j == pl.n_idx - 1 && pl.child_tokens) ? pl.child_tokens : prompt + (size_t)j * bt;
                jb->use = KVT_MIN(pl.idx[j].n_tokens, pl.p - j * bt);
            }
        rpipe P;
        memset(&P, 0, sizeof(P));
        P.s = s;
        P.pl = &pl;
        P.jobs = jobs;
        P.n_jobs = n_jobs;
        if (!pipe_start(&P)) {
            free(jobs);
            kvt_seq_free(seq);
            plan_free(&pl);
            return KVT_ERR_NOMEM;
        }
        kvt_block *blocks[KVT_MAX_GROUPS];
        memset(blocks, 0, sizeof(blocks));
        for (uint32_t k = 0; k < n_jobs && st == KVT_OK && !retry; k++) {
            const rjob *jb = &jobs[k];
            const plan_idx *pi = &pl.idx[jb->j];
            rload L;
            pipe_take(&P, k, &L);
            kvt_status ls = L.st;
            if (ls == KVT_OK) ls = finish_job(s, pi, jb, &L);
            if (ls == KVT_ERR_POOL_EXHAUSTED || ls == KVT_ERR_NOMEM) {
                st = ls;
            } else if (ls != KVT_OK) {
                drop_bad(s, pi->chain, jb->g, pi->kind, L.err[0] ? L.err : kvt_status_str(ls));
                retry = true;
            } else {
                blocks[jb->g] = L.b;
                if (k + 1 == n_jobs || jobs[k + 1].j != jb->j) {
                    kvt_status as = kvt_seq_append_blocks(seq, blocks);
                    if (as != KVT_OK) {
                        KVT_WARN("ssd cache: cannot append restored block %u: %s", jb->j, kvt_status_str(as));
                        st = as;
                    }
                    for (uint32_t g = 0; g < G; g++)
                        if (blocks[g]) kvt_block_release(blocks[g]);
                    memset(blocks, 0, sizeof(blocks));
                    if (as == KVT_OK && s->progress) s->progress(s->progress_ctx, KVT_MIN((jb->j + 1) * bt, pl.p), pl.p);
                }
            }
        }
        for (uint32_t g = 0; g < G; g++)
            if (blocks[g]) kvt_block_release(blocks[g]);
        pipe_stop(&P);
        free(jobs);
        if (st == KVT_OK && !retry && pl.snap) {
            char err[256] = "";
            kvt_status ss = load_snapshot(s, pl.snap_chain, pl.p, seq, err, sizeof(err));
            if (ss != KVT_OK) {
                drop_bad(s, pl.snap_chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT, err[0] ? err : kvt_status_str(ss));
                retry = true;
            }
        }
        if (st == KVT_OK && !retry && kvt_seq_len(seq) != pl.p) st = KVT_ERR_FORMAT;
        if (st != KVT_OK || retry) {
            kvt_seq_free(seq);
            plan_free(&pl);
            if (retry) continue;
            if (st == KVT_ERR_POOL_EXHAUSTED || st == KVT_ERR_NOMEM) return st;
            return KVT_OK; /* unusable plan (should not happen): treat as a miss */
        }
        bump_lru(s, &pl);
        pthread_mutex_lock(&s->mu);
        s->restores++;
        s->restore_ms_last = kvt_now_ms() - t0;
        pthread_mutex_unlock(&s->mu);
        *out = seq;
        *n_restored = pl.p;
        plan_free(&pl);
        return KVT_OK;
    }
    return KVT_OK;
}
