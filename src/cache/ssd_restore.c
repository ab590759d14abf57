/* ssd_restore.c — the SSD tier, lookup (restore planning) and streamed, checksummed restore. See
 * ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

#include "plan.h"

/* ------------------------------------------------------------------ lookup */
/* Planning uses the shared planner (plan.h) over this tier's index, along the request's chain
 * (kvt_chain: no hashing here). Block indices [0, base) may be supplied by the caller (the RAM
 * tier's leading blocks in a mixed plan): the planner treats them as held in every group and the
 * restore reads nothing for them. */
static _Atomic uint64_t g_plans; /* build_plan calls (kvt_ssd_plan_calls) */

uint64_t kvt_ssd_plan_calls(void) { return g_plans; }

static void plan_free(kvt_ssd_plan *pl) {
    free(pl->idx);
    free(pl->need);
    free(pl->child_tokens);
    memset(pl, 0, sizeof(*pl));
}

static bool tokens_eq(const int32_t *a, const int32_t *b, uint32_t n) { return memcmp(a, b, (size_t)n * 4) == 0; }

/* Entry of group g, kind, chain whose parent and tokens match. Lock held. */
static ssd_entry *match_entry(kvt_ssd *s, uint64_t chain, uint32_t g, uint32_t kind, uint64_t parent,
                              const int32_t *toks, uint32_t nt) {
    ssd_entry *e = kvt_ssd_idx_find(s, chain, g, kind);
    if (!e || e->link != parent || e->n_tokens != nt || !tokens_eq(e->tokens, toks, nt)) return NULL;
    return e;
}

/* This tier's index as the shared planner sees it. */
typedef struct ssd_ix {
    kvt_ssd *s;
    const kvt_chain *c;
    const int32_t *prompt;
    uint32_t n, base, k, all;
    uint32_t *held;        /* [k] group masks of the path blocks (all groups below base) */
    ssd_entry **path;      /* [k] the lowest-group entry of each path block (NULL below base) */
    ssd_entry given;       /* handle for "supplied by the caller" */
} ssd_ix;

static uint32_t ssd_held(void *ctx, uint32_t i) { return ((ssd_ix *)ctx)->held[i]; }

/* The unit supplying the last block at index j with m tokens: below base the caller's block; else
 * the path block if it is held in every group, else the sibling file (block or tail) at index j whose
 * first m tokens match and that every group holds (exact length preferred, then the shortest). */
static const void *ssd_rows(void *ctx, uint32_t j, uint32_t m) {
    ssd_ix *x = ctx;
    kvt_ssd *s = x->s;
    if (j < x->base) return &x->given;
    if (j < x->k && x->held[j] == x->all) return x->path[j];
    if (!s->n_buckets) return NULL;
    const uint64_t parent = kvt_chain_at(x->c, j);
    const int32_t *toks = x->prompt + (size_t)j * s->bt;
    ssd_entry *best = NULL;
    for (ssd_entry *e = s->tab_link[kvt_ssd_link_hash(parent) % s->n_buckets]; e; e = e->next_link) {
        if (e->link != parent || e->kind == KVT_SSD_KIND_SNAPSHOT || e->index != j || e->group != 0 || e->n_tokens < m)
            continue;
        if (!tokens_eq(e->tokens, toks, m) || kvt_ssd_entry_groups(s, e->chain, e->kind, parent) != x->all) continue;
        if (!best || (e->n_tokens == m && best->n_tokens != m) || (best->n_tokens != m && e->n_tokens < best->n_tokens))
            best = e;
    }
    return best;
}

/* Builds the restore plan for the chain's prompt (index only). Lock held. False: out of memory. */
static bool build_plan(kvt_ssd *s, const kvt_chain *c, uint32_t base, kvt_ssd_plan *pl) {
    memset(pl, 0, sizeof(*pl));
    g_plans++;
    const uint32_t n = kvt_chain_len(c), bt = s->bt, G = s->n_groups;
    if (n < 2 || kvt_chain_block_tokens(c) != bt || G == 0) return true;
    const int32_t *prompt = kvt_chain_tokens(c);
    const uint32_t nfull = kvt_chain_n_full(c);
    if (base > nfull) base = nfull;
    const uint32_t max_idx = nfull + 1;
    kvt_plan_geom geom;
    kvt_plan_geom_init(&geom, s->layout);
    ssd_ix x = {.s = s, .c = c, .prompt = prompt, .n = n, .base = base, .all = (1u << G) - 1u};
    x.held = calloc(max_idx, sizeof(*x.held));
    x.path = calloc(max_idx, sizeof(*x.path));
    uint32_t *spos = NULL;
    const void **snaps = NULL;
    if (!x.held || !x.path) goto oom;
    /* the path: block indices whose tokens are on disk in some group (or supplied below base) */
    uint32_t k = 0;
    for (; k < nfull; k++) {
        if (k < base) {
            x.held[k] = x.all;
            continue;
        }
        const int32_t *tk = prompt + (size_t)k * bt;
        uint32_t m = 0;
        for (uint32_t g = 0; g < G; g++) {
            ssd_entry *e = match_entry(s, kvt_chain_at(c, k + 1), g, KVT_SSD_KIND_BLOCK, kvt_chain_at(c, k), tk, bt);
            if (!e) continue;
            m |= 1u << g;
            if (!x.path[k]) x.path[k] = e;
        }
        if (!m) break;
        x.held[k] = m;
    }
    x.k = k;
    /* token match: the path plus the longest common prefix of a file at index k */
    uint32_t best_lcp = 0;
    const uint32_t rem = n - k * bt;
    if (s->n_buckets) {
        const uint64_t hk = kvt_chain_at(c, k);
        for (ssd_entry *e = s->tab_link[kvt_ssd_link_hash(hk) % s->n_buckets]; e; e = e->next_link) {
            if (e->link != hk || e->kind == KVT_SSD_KIND_SNAPSHOT || e->index != k) continue;
            uint32_t mm = KVT_MIN(e->n_tokens, rem), l = 0;
            while (l < mm && e->tokens[l] == prompt[(size_t)k * bt + l]) l++;
            if (l > best_lcp) best_lcp = l;
        }
    }
    kvt_plan_index ix = {.ctx = &x, .k = k, .match = k * bt + best_lcp, .held = ssd_held, .rows = ssd_rows};
    if (geom.recurrent) {
        /* snapshots: at block boundaries of the path (their chain is the chain's), and inside a
         * block at the end of a tail whose tokens match (found through that tail: such tails are
         * pinned against supersession) */
        uint32_t cap = k + 1 + 16, ns = 0;
        spos = malloc(cap * sizeof(*spos));
        snaps = malloc(cap * sizeof(*snaps));
        if (!spos || !snaps) goto oom;
        for (uint32_t i = 1; i <= k; i++) {
            ssd_entry *sn = kvt_ssd_idx_find(s, kvt_chain_at(c, i), SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
            if (!sn || sn->n_tokens != i * bt) continue;
            spos[ns] = i * bt;
            snaps[ns++] = sn;
        }
        for (uint32_t j = 0; j <= k && s->n_buckets; j++) {
            const uint64_t hj = kvt_chain_at(c, j);
            for (ssd_entry *e = s->tab_link[kvt_ssd_link_hash(hj) % s->n_buckets]; e; e = e->next_link) {
                if (e->link != hj || e->kind != KVT_SSD_KIND_TAIL || e->index != j || e->group != 0) continue;
                if ((uint64_t)j * bt + e->n_tokens > n || !tokens_eq(e->tokens, prompt + (size_t)j * bt, e->n_tokens)) continue;
                ssd_entry *sn = kvt_ssd_idx_find(s, e->chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
                if (!sn || sn->n_tokens != j * bt + e->n_tokens) continue;
                if (ns == cap) {
                    uint32_t nc = cap * 2;
                    uint32_t *np = realloc(spos, nc * sizeof(*np));
                    if (!np) goto oom;
                    spos = np;
                    const void **nq = realloc(snaps, nc * sizeof(*nq));
                    if (!nq) goto oom;
                    snaps = nq;
                    cap = nc;
                }
                spos[ns] = sn->n_tokens;
                snaps[ns++] = sn;
            }
        }
        ix.snap_pos = spos;
        ix.snap = (const void *const *)snaps;
        ix.n_snaps = ns;
    }
    kvt_plan_prefix pp;
    kvt_plan_usable_prefix(&geom, &ix, n, &pp);
    if (pp.len > 0 && pp.len >= base * bt) {
        pl->p = pp.len;
        pl->base = base;
        pl->n_idx = pp.n_full + 1;
        pl->idx = calloc(pl->n_idx, sizeof(*pl->idx));
        pl->need = calloc((size_t)pl->n_idx * G, sizeof(bool));
        if (!pl->idx || !pl->need) goto oom;
        if (pp.snap) {
            pl->snap = true;
            pl->snap_chain = ((const ssd_entry *)pp.snap)->chain;
        }
        for (uint32_t j = base; j < pp.n_full; j++) { /* path blocks */
            pl->idx[j] = (plan_idx){kvt_chain_at(c, j + 1), kvt_chain_at(c, j), KVT_SSD_KIND_BLOCK, bt};
            uint32_t need = kvt_plan_need_mask(&geom, pl->p, j, x.held[j]);
            for (uint32_t g = 0; g < G; g++) pl->need[(size_t)j * G + g] = (need >> g) & 1u;
        }
        if (pp.last != &x.given) { /* the last index: one file in every group */
            const ssd_entry *e = pp.last;
            pl->idx[pp.n_full] = (plan_idx){e->chain, e->link, e->kind, e->n_tokens};
            pl->child_tokens = malloc((size_t)e->n_tokens * 4 + 4);
            if (!pl->child_tokens) goto oom;
            memcpy(pl->child_tokens, e->tokens, (size_t)e->n_tokens * 4);
            for (uint32_t g = 0; g < G; g++) pl->need[(size_t)pp.n_full * G + g] = true;
        } else if (!pl->snap) {
            plan_free(pl); /* the caller's blocks alone: nothing to restore from here */
        }
    }
    free(x.held);
    free(x.path);
    free(spos);
    free(snaps);
    return true;
oom:
    free(x.held);
    free(x.path);
    free(spos);
    free(snaps);
    plan_free(pl);
    return false;
}

uint32_t kvt_ssd_plan_from(kvt_ssd *s, const kvt_chain *c, uint32_t base_blocks, kvt_ssd_plan **out) {
    *out = NULL;
    if (!s || !c) return 0;
    kvt_ssd_plan *pl = malloc(sizeof(*pl));
    if (!pl) return 0;
    pthread_mutex_lock(&s->mu);
    bool ok = build_plan(s, c, base_blocks, pl);
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        free(pl);
        return 0;
    }
    *out = pl;
    return pl->p;
}

void kvt_ssd_plan_free(kvt_ssd_plan *pl) {
    if (!pl) return;
    plan_free(pl);
    free(pl);
}

uint32_t kvt_ssd_find_from(kvt_ssd *s, const kvt_chain *c, uint32_t base_blocks) {
    kvt_ssd_plan *pl = NULL;
    uint32_t p = kvt_ssd_plan_from(s, c, base_blocks, &pl);
    kvt_ssd_plan_free(pl);
    return p;
}

uint32_t kvt_ssd_find(kvt_ssd *s, const int32_t *prompt, uint32_t n, uint64_t root) {
    if (!s || (!prompt && n)) return 0;
    kvt_chain *c = NULL;
    if (kvt_chain_create(root, prompt, n, s->bt, &c) != KVT_OK) return 0;
    uint32_t p = kvt_ssd_find_from(s, c, 0);
    kvt_chain_release(c);
    return p;
}

/* ------------------------------------------------------------------ restore */
/* Reads section `sec` of an open file into dst (exact length), verifying its checksum. Tries
 * O_DIRECT when dst and len are page-aligned; falls back to buffered reads. */
static kvt_status read_section(kvt_ssd *s, int fd, const char *path, const hdr_out *h, uint32_t sec,
                               uint8_t *dst, uint64_t len) {
    hdr_section sc = kvt_record_section_at(h, sec);
    if (sc.length != len) return KVT_ERR_FORMAT;
    if (kvt_ssd_io_read_fault(s->io)) return KVT_ERR_IO;
    bool done = false;
#ifdef O_DIRECT
    if (((uintptr_t)dst % SSD_PAGE) == 0 && len % SSD_PAGE == 0 && len > 0) {
        int dfd = kvt_ssd_openat(s, path, O_RDONLY | O_DIRECT);
        if (dfd >= 0) {
            done = kvt_ssd_read_full(dfd, dst, len, sc.offset) == KVT_OK;
            close(dfd);
        }
    }
#endif
    (void)path;
    if (!done && kvt_ssd_read_full(fd, dst, len, sc.offset) != KVT_OK) return KVT_ERR_IO;
    if (XXH3_64bits(dst, len) != sc.hash) return KVT_ERR_CORRUPT;
    return KVT_OK;
}

/* Opens a file and validates its header against expectations. */
static kvt_status open_checked(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind, char *path,
                               size_t plen, int *fdp, uint8_t **bufp, hdr_out *h, char *err, size_t errlen) {
    char name[64];
    kvt_ssd_entry_name(name, sizeof(name), chain, group, kind);
    snprintf(path, plen, "%s", name); /* relative to the held directory */
    *bufp = NULL;
    *fdp = kvt_ssd_openat(s, path, O_RDONLY);
    if (*fdp < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "open: %s", strerror(errno));
    kvt_status st = kvt_ssd_header_read_fd(*fdp, bufp, h, err, errlen);
    if (st == KVT_OK) st = kvt_ssd_header_matches(s, h, chain, group, kind, err, errlen);
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
    kvt_ssd_entry_name(name, sizeof(name), chain, group, kind);
    pthread_mutex_lock(&s->mu);
    ssd_entry *e = kvt_ssd_idx_find(s, chain, group, kind);
    if (!e) { /* left the index after the plan was made (superseded or evicted): benign, just retry */
        pthread_mutex_unlock(&s->mu);
        return;
    }
    KVT_WARN("ssd cache: dropping %s/%s: %s (falling back)", s->cdir, name, why);
    kvt_ssd_drop_entry(s, e);
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
    const kvt_ssd_plan *pl;
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
    if (kvt_ssd_io_read_fault(s->io)) return KVT_ERR_IO;
    if (!direct) return kvt_ssd_read_full(fd, dst, len, off);
    uint64_t whole = len / SSD_PAGE * SSD_PAGE;
    if (whole && kvt_ssd_read_upto(fd, dst, whole, off) != (int64_t)whole) return KVT_ERR_IO;
    if (len > whole) {
        if (kvt_ssd_read_upto(fd, bounce, SSD_PAGE, off + whole) < (int64_t)(len - whole)) return KVT_ERR_IO;
        memcpy(dst + whole, bounce, len - whole);
    }
    return KVT_OK;
}

/* Opens a file for restore: O_DIRECT when possible, else buffered + sequential readahead. */
static int open_restore(kvt_ssd *s, const char *name, bool *direct) {
    int fd = -1;
#ifdef O_DIRECT
    fd = kvt_ssd_openat(s, name, O_RDONLY | O_DIRECT);
#endif
    *direct = fd >= 0;
    if (fd < 0) {
        fd = kvt_ssd_openat(s, name, O_RDONLY);
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
    char name[64];
    kvt_ssd_entry_name(name, sizeof(name), pi->chain, jb->g, pi->kind);
    bool direct;
    int fd = open_restore(s, name, &direct);
    if (fd < 0) {
        L->st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_IO, "open: %s", strerror(errno));
        return;
    }
    uint8_t *buf = NULL;
    hdr_out h;
    int rerr = 0;
    kvt_status st = kvt_ssd_header_read_any(fd, direct, &buf, &h, &rerr, L->err, sizeof(L->err));
    if (st == KVT_ERR_IO && direct && rerr == EINVAL) { /* O_DIRECT accepted at open, refused at read */
        close(fd);
        direct = false;
        fd = kvt_ssd_openat(s, name, O_RDONLY);
        if (fd < 0) {
            L->st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_IO, "open: %s", strerror(errno));
            return;
        }
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        L->err[0] = 0;
        st = kvt_ssd_header_read_any(fd, false, &buf, &h, NULL, L->err, sizeof(L->err));
    }
    if (st == KVT_OK) st = kvt_ssd_header_matches(s, &h, pi->chain, jb->g, pi->kind, L->err, sizeof(L->err));
    if (st == KVT_OK && (h.info.block_index != jb->j || h.info.parent != pi->parent || h.info.n_tokens != pi->n_tokens))
        st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_FORMAT, "header position mismatch");
    for (uint32_t t = 0; st == KVT_OK && t < pi->n_tokens; t++)
        if (kvt_record_id_at(&h, t) != jb->toks[t]) st = kvt_errf(L->err, sizeof(L->err), KVT_ERR_FORMAT, "token mismatch");
    if (st == KVT_OK) {
        hdr_section sc = kvt_record_section_at(&h, 0);
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
                fd = kvt_ssd_openat(s, name, O_RDONLY);
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
        !kvt_record_tail_unpack(s->layout, jb->g, jb->j, pi->n_tokens, kvt_block_data_mut(L->b), kvt_block_data_bytes(L->b)))
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
static void bump_lru(kvt_ssd *s, const kvt_ssd_plan *pl) {
    uint64_t now = now_real_ns();
    /* the file's mtime is the persisted LRU stamp: set it to the index's fine-grained `now`, not to
     * the kernel's coarse current time (a tie with a file written a few ms earlier would make the
     * eviction order after a restart arbitrary) */
    const struct timespec tv[2] = {{.tv_sec = (time_t)(now / 1000000000ull), .tv_nsec = (long)(now % 1000000000ull)},
                                   {.tv_sec = (time_t)(now / 1000000000ull), .tv_nsec = (long)(now % 1000000000ull)}};
    char name[64];
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&s->dir_mu); /* mtimes are set relative to the held directory */
    for (uint32_t j = 0; j < pl->n_idx; j++)
        for (uint32_t g = 0; g < s->n_groups; g++) {
            if (!pl->need[(size_t)j * s->n_groups + g]) continue;
            ssd_entry *e = kvt_ssd_idx_find(s, pl->idx[j].chain, g, pl->idx[j].kind);
            if (e) e->last_use = now;
            kvt_ssd_entry_name(name, sizeof(name), pl->idx[j].chain, g, pl->idx[j].kind);
            utimensat(s->dfd, name, tv, AT_SYMLINK_NOFOLLOW);
        }
    if (pl->snap) {
        ssd_entry *e = kvt_ssd_idx_find(s, pl->snap_chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
        if (e) e->last_use = now;
        kvt_ssd_entry_name(name, sizeof(name), pl->snap_chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
        utimensat(s->dfd, name, tv, AT_SYMLINK_NOFOLLOW);
    }
    pthread_mutex_unlock(&s->dir_mu);
    pthread_mutex_unlock(&s->mu);
}

kvt_status kvt_ssd_restore_from(kvt_ssd *s, const kvt_chain *c, kvt_seq *base, kvt_seq **out, uint32_t *n_restored,
                                kvt_ssd_restore_info *info) {
    return kvt_ssd_restore_plan(s, c, base, NULL, out, n_restored, info);
}

kvt_status kvt_ssd_restore_plan(kvt_ssd *s, const kvt_chain *c, kvt_seq *base, kvt_ssd_plan *given, kvt_seq **out,
                                uint32_t *n_restored, kvt_ssd_restore_info *info) {
    *out = NULL;
    *n_restored = 0;
    kvt_ssd_restore_info inf = {0};
    if (info) *info = inf;
    if (!s || !c) return KVT_OK;
    double t0 = kvt_now_ms();
    const uint32_t G = s->n_groups, bt = s->bt;
    const int32_t *prompt = kvt_chain_tokens(c);
    const uint32_t base_len = base ? kvt_seq_len(base) : 0;
    if (base && (base_len % bt || kvt_seq_root(base) != kvt_chain_root(c) || base_len > kvt_chain_len(c) ||
                 memcmp(kvt_seq_tokens(base), prompt, (size_t)base_len * sizeof(int32_t)) != 0))
        return KVT_ERR_INVALID_ARG;
    kvt_status ret = KVT_OK;
    for (int attempt = 0; attempt < 64; attempt++) {
        kvt_ssd_plan pl;
        bool ok = true;
        if (given && given->base == KVT_MIN(base_len / bt, kvt_chain_n_full(c))) {
            pl = *given; /* the lookup's plan, executed as it was planned (consumed) */
            memset(given, 0, sizeof(*given));
        } else {
            pthread_mutex_lock(&s->mu);
            ok = build_plan(s, c, base_len / bt, &pl);
            pthread_mutex_unlock(&s->mu);
        }
        given = NULL; /* a retry plans again: the index changed */
        if (!ok) {
            ret = KVT_ERR_NOMEM;
            break;
        }
        if (pl.p == 0 || pl.base != base_len / bt) { /* a miss, or the plan cannot use the caller's blocks */
            plan_free(&pl);
            break;
        }
        kvt_seq *seq = NULL;
        kvt_status st = base_len ? kvt_seq_clone(base, &seq) : kvt_seq_create(s->pool, kvt_chain_root(c), &seq);
        if (st != KVT_OK) {
            plan_free(&pl);
            ret = st;
            break;
        }
        bool retry = false;
        /* jobs: every needed (index, group) file from the first index not supplied, in index then
         * group order */
        uint32_t n_jobs = 0;
        rjob *jobs = malloc((size_t)pl.n_idx * G * sizeof(*jobs) + sizeof(*jobs));
        if (!jobs) {
            kvt_seq_free(seq);
            plan_free(&pl);
            ret = KVT_ERR_NOMEM;
            break;
        }
        for (uint32_t j = pl.base; j < pl.n_idx; j++)
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
            ret = KVT_ERR_NOMEM;
            break;
        }
        kvt_block *blocks[KVT_MAX_GROUPS];
        memset(blocks, 0, sizeof(blocks));
        for (uint32_t k = 0; k < n_jobs && st == KVT_OK && !retry; k++) {
            const rjob *jb = &jobs[k];
            const plan_idx *pi = &pl.idx[jb->j];
            rload L;
            pipe_take(&P, k, &L);
            kvt_status ls = L.st;
            if (ls == KVT_OK) {
                inf.files_read++;
                inf.bytes_read += L.len;
                ls = finish_job(s, pi, jb, &L);
            }
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
            } else {
                inf.files_read++;
                for (uint32_t l = 0; l < kvt_kv_layout_n_layers(s->layout); l++) /* the sections read */
                    if (kvt_kv_layout_layer(s->layout, l)->kind == KVT_KIND_RECURRENT)
                        inf.bytes_read += kvt_kv_layout_layer(s->layout, l)->state_bytes;
                inf.snapshot = true;
            }
        }
        if (st == KVT_OK && !retry && kvt_seq_len(seq) != pl.p) st = KVT_ERR_FORMAT;
        if (st != KVT_OK || retry) {
            kvt_seq_free(seq);
            plan_free(&pl);
            inf.snapshot = false;
            if (retry) continue;
            if (st == KVT_ERR_POOL_EXHAUSTED || st == KVT_ERR_NOMEM) ret = st;
            break; /* unusable plan (should not happen): treat as a miss */
        }
        bump_lru(s, &pl);
        pthread_mutex_lock(&s->mu);
        s->restores++;
        s->restore_ms_last = kvt_now_ms() - t0;
        s->read_bytes += inf.bytes_read;
        pthread_mutex_unlock(&s->mu);
        if (info) *info = inf;
        *out = seq;
        *n_restored = pl.p;
        plan_free(&pl);
        return KVT_OK;
    }
    pthread_mutex_lock(&s->mu);
    s->read_bytes += inf.bytes_read;
    pthread_mutex_unlock(&s->mu);
    if (info) *info = inf;
    return ret;
}

kvt_status kvt_ssd_restore(kvt_ssd *s, const int32_t *prompt, uint32_t n, uint64_t root, kvt_seq **out,
                           uint32_t *n_restored) {
    *out = NULL;
    *n_restored = 0;
    if (!s || (!prompt && n)) return KVT_OK;
    kvt_chain *c = NULL;
    kvt_status st = kvt_chain_create(root, prompt, n, s->bt, &c);
    if (st != KVT_OK) return st;
    st = kvt_ssd_restore_from(s, c, NULL, out, n_restored, NULL);
    kvt_chain_release(c);
    return st;
}
