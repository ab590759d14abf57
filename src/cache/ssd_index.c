/* ssd_index.c — the SSD tier, the in-memory index, the untrusted directory, eviction/supersession,
 * stats and the startup scan. See ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

#include "plan.h"

static uint64_t key_hash(uint64_t chain, uint32_t group, uint32_t kind) {
    uint64_t h = chain ^ ((uint64_t)group * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)kind << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}
uint64_t kvt_ssd_link_hash(uint64_t link) { return key_hash(link, 0x5bd1e995u, 7); }

ssd_entry *kvt_ssd_idx_find(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind) {
    if (!s->n_buckets) return NULL;
    for (ssd_entry *e = s->tab_key[key_hash(chain, group, kind) % s->n_buckets]; e; e = e->next_key)
        if (e->chain == chain && e->group == group && e->kind == kind) return e;
    return NULL;
}

static void tab_insert(kvt_ssd *s, ssd_entry *e) {
    uint64_t k = key_hash(e->chain, e->group, e->kind) % s->n_buckets;
    e->next_key = s->tab_key[k];
    s->tab_key[k] = e;
    uint64_t l = kvt_ssd_link_hash(e->link) % s->n_buckets;
    e->next_link = s->tab_link[l];
    s->tab_link[l] = e;
}

static bool idx_grow(kvt_ssd *s) {
    if (s->n_ents + 1 > s->cap_ents) {
        uint32_t nc = s->cap_ents ? s->cap_ents * 2 : 64;
        ssd_entry **ne = realloc(s->ents, nc * sizeof(*ne));
        if (!ne) return false;
        s->ents = ne;
        s->cap_ents = nc;
    }
    if (s->n_ents + 1 > s->n_buckets) {
        uint32_t nb = s->n_buckets ? s->n_buckets * 4 : 256;
        ssd_entry **tk = calloc(nb, sizeof(*tk)), **tl = calloc(nb, sizeof(*tl));
        if (!tk || !tl) {
            free(tk);
            free(tl);
            return false;
        }
        free(s->tab_key);
        free(s->tab_link);
        s->tab_key = tk;
        s->tab_link = tl;
        s->n_buckets = nb;
        for (uint32_t i = 0; i < s->n_ents; i++) tab_insert(s, s->ents[i]);
    }
    return true;
}

/* Takes ownership of e (and e->tokens). */
bool kvt_ssd_idx_add(kvt_ssd *s, ssd_entry *e) {
    if (!idx_grow(s)) return false;
    e->pos = s->n_ents;
    s->ents[s->n_ents++] = e;
    tab_insert(s, e);
    s->bytes += e->bytes;
    s->gen++;
    return true;
}

void kvt_ssd_idx_remove(kvt_ssd *s, ssd_entry *e) {
    ssd_entry **pp = &s->tab_key[key_hash(e->chain, e->group, e->kind) % s->n_buckets];
    while (*pp && *pp != e) pp = &(*pp)->next_key;
    if (*pp) *pp = e->next_key;
    pp = &s->tab_link[kvt_ssd_link_hash(e->link) % s->n_buckets];
    while (*pp && *pp != e) pp = &(*pp)->next_link;
    if (*pp) *pp = e->next_link;
    s->ents[e->pos] = s->ents[--s->n_ents];
    s->ents[e->pos]->pos = e->pos;
    s->bytes -= e->bytes;
    s->gen++;
    free(e->tokens);
    free(e);
}

/* True if no other entry hangs below e (snapshots are always leaves). */
static bool idx_is_leaf(kvt_ssd *s, const ssd_entry *e) {
    if (e->kind == KVT_SSD_KIND_SNAPSHOT) return true;
    for (ssd_entry *f = s->tab_link[kvt_ssd_link_hash(e->chain) % s->n_buckets]; f; f = f->next_link)
        if (f != e && f->link == e->chain) return false;
    return true;
}

/* ------------------------------------------------------------------ untrusted directory */
/* The cache directory is untrusted input: every cache file is opened through this, which never
 * follows a symlink (O_NOFOLLOW), never blocks on a FIFO or device (O_NONBLOCK, which has no effect
 * on regular-file reads) and refuses anything that is not a regular file (errno = EFTYPE-like
 * EINVAL). Returns the fd or -1. */
int kvt_ssd_open_cache_file(const char *path, int flags) { return kvt_ssd_open_cache_file_at(AT_FDCWD, path, flags); }

int kvt_ssd_open_cache_file_at(int dfd, const char *name, int flags) {
    int fd = openat(dfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* Refuses a directory we must not trust: not a directory, owned by another user, or writable by
 * others (anyone could plant files). Fills err and returns false. */
bool kvt_ssd_dir_trusted(const char *path, bool follow, char *err, size_t errlen) {
    struct stat sb;
    int r = follow ? stat(path, &sb) : lstat(path, &sb);
    if (r != 0) {
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: %s: %s", path, strerror(errno));
        return false;
    }
    return kvt_ssd_stat_trusted(&sb, path, follow, err, errlen);
}

bool kvt_ssd_stat_trusted(const struct stat *st, const char *path, bool follow, char *err, size_t errlen) {
    const struct stat sb = *st;
    if (!S_ISDIR(sb.st_mode)) {
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: %s is not a directory%s", path, follow ? "" : " (symlink?)");
        return false;
    }
    if (sb.st_uid != geteuid()) {
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: refusing %s: owned by uid %u, not by this user (uid %u)", path,
                 (unsigned)sb.st_uid, (unsigned)geteuid());
        return false;
    }
    if (sb.st_mode & S_IWOTH) {
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: refusing %s: writable by every user (mode %04o); chmod o-w it",
                 path, (unsigned)(sb.st_mode & 07777));
        return false;
    }
    return true;
}

int kvt_ssd_dir_open_held(const char *path, struct stat *sb, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot open %s: %s%s", path, strerror(e),
                 e == ENOTDIR || e == ELOOP ? " (a symlink or not a directory)" : "");
        errno = e;
        return -1;
    }
    if (fstat(fd, sb) != 0 || !kvt_ssd_stat_trusted(sb, path, false, err, errlen)) {
        close(fd);
        errno = ENOTDIR;
        return -1;
    }
    return fd;
}

dir_state kvt_ssd_dir_check(const kvt_ssd *s) {
    if (kvt_ssd_io_dir_check_fault(s->io)) return DIR_CHECK_FAILED;
    struct stat sb;
    if (lstat(s->cdir, &sb) != 0) return errno == ENOENT ? DIR_GONE : DIR_CHECK_FAILED;
    if (!S_ISDIR(sb.st_mode) || sb.st_dev != s->dir_dev || sb.st_ino != s->dir_ino) return DIR_REPLACED;
    return DIR_SAME;
}

int kvt_ssd_openat(kvt_ssd *s, const char *name, int flags) {
    pthread_mutex_lock(&s->dir_mu);
    int fd = kvt_ssd_open_cache_file_at(s->dfd, name, flags);
    int e = errno;
    pthread_mutex_unlock(&s->dir_mu);
    errno = e;
    return fd;
}

void kvt_ssd_unlink(kvt_ssd *s, const char *name) {
    pthread_mutex_lock(&s->dir_mu);
    kvt_ssd_io_unlink_at(s->io, s->dfd, s->cdir, name);
    pthread_mutex_unlock(&s->dir_mu);
}

void kvt_ssd_drop_entry(kvt_ssd *s, ssd_entry *e) {
    char name[64];
    kvt_ssd_entry_name(name, sizeof(name), e->chain, e->group, e->kind);
    kvt_ssd_unlink(s, name);
    kvt_ssd_idx_remove(s, e);
}

/* Evicts LRU leaves until the cap holds. Lock held. */
void kvt_ssd_enforce_cap(kvt_ssd *s) {
    if (!s->o.max_bytes) return;
    while (s->bytes > s->o.max_bytes && s->n_ents) {
        ssd_entry *victim = NULL;
        for (uint32_t i = 0; i < s->n_ents; i++) {
            ssd_entry *e = s->ents[i];
            if ((!victim || e->last_use < victim->last_use) && idx_is_leaf(s, e)) victim = e;
        }
        if (!victim) victim = s->ents[0]; /* cannot happen (a finite chain has leaves) */
        kvt_ssd_drop_entry(s, victim);
        s->evictions++;
    }
}

/* Groups holding a file of (chain, kind) with this parent. Lock held. */
uint32_t kvt_ssd_entry_groups(kvt_ssd *s, uint64_t chain, uint32_t kind, uint64_t parent) {
    uint32_t m = 0;
    for (uint32_t g = 0; g < s->n_groups; g++) {
        ssd_entry *e = kvt_ssd_idx_find(s, chain, g, kind);
        if (e && e->link == parent) m |= 1u << g;
    }
    return m;
}

/* Supersession: the shared rule (kvt_plan_supersedes, plan.h): a frozen tail T is redundant once a
 * longer file C at the same position (same parent, same block index) whose tokens start with T's,
 * held in every group that holds T, is published — C serves every prefix T could end. Called after
 * e was published (rename + dir fsync) and indexed; removes every such T (all groups at once: file,
 * index entry, bytes), so a lookup never loses a prefix that the index could serve before. A tail
 * with a snapshot at its chain is pinned: the planner finds a snapshot inside a block through the
 * tail that ends at it. Snapshots themselves are never removed here. Lock held. */
void kvt_ssd_supersede(kvt_ssd *s, const ssd_entry *e) {
    if (e->kind == KVT_SSD_KIND_SNAPSHOT || !s->n_buckets) return;
    const kvt_plan_unit nw = {e->link, e->index, e->n_tokens, e->tokens, kvt_ssd_entry_groups(s, e->chain, e->kind, e->link),
                              e->kind == KVT_SSD_KIND_TAIL, false};
    bool again = true;
    while (again) {
        again = false;
        for (ssd_entry *f = s->tab_link[kvt_ssd_link_hash(e->link) % s->n_buckets]; f; f = f->next_link) {
            if (f == e || f->link != e->link || f->kind != KVT_SSD_KIND_TAIL || f->chain == e->chain) continue;
            const kvt_plan_unit od = {f->link, f->index, f->n_tokens, f->tokens,
                                      kvt_ssd_entry_groups(s, f->chain, KVT_SSD_KIND_TAIL, f->link), true,
                                      kvt_ssd_idx_find(s, f->chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT) != NULL};
            if (!kvt_plan_supersedes(&od, &nw)) continue;
            uint64_t tchain = f->chain;
            for (uint32_t g = 0; g < s->n_groups; g++) {
                ssd_entry *t = kvt_ssd_idx_find(s, tchain, g, KVT_SSD_KIND_TAIL);
                if (t) {
                    kvt_ssd_drop_entry(s, t);
                    s->superseded++;
                }
            }
            again = true; /* the bucket changed: rescan it */
            break;
        }
    }
}

/* ------------------------------------------------------------------ stats */
/* True if e's chain is contiguous back to index 0 on disk (any group per index). Lock held. */
static bool contiguous(kvt_ssd *s, ssd_entry *e) {
    ssd_entry *cur = e;
    uint32_t guard = 0;
    bool ok = false;
    for (;;) {
        if (cur->contig_gen == s->gen) {
            ok = cur->contig_ok;
            break;
        }
        if (cur->index == 0) {
            ok = true;
            break;
        }
        /* parent: the block at index-1 whose chain is cur->link (group 0 or any group) */
        ssd_entry *par = NULL;
        for (uint32_t g = 0; g < s->n_groups && !par; g++) par = kvt_ssd_idx_find(s, cur->link, g, KVT_SSD_KIND_BLOCK);
        if (!par || ++guard > 1u << 24) {
            ok = false;
            break;
        }
        cur = par;
    }
    e->contig_gen = s->gen;
    e->contig_ok = ok;
    return ok;
}

void kvt_ssd_stats_get(kvt_ssd *s, kvt_ssd_stats *out) {
    memset(out, 0, sizeof(*out));
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    out->entries = s->n_ents;
    out->bytes = s->bytes;
    out->max_bytes = s->o.max_bytes;
    out->restores = s->restores;
    out->spills = s->spills;
    out->demotions = s->demotions;
    out->pending_blocks = s->q_count;
    out->pending_bytes = s->q_bytes;
    out->dirty_records = s->d_count;
    out->dirty_bytes = s->d_bytes;
    out->shed = s->shed;
    out->staged = s->staged;
    out->published = s->published;
    out->skipped_nonregular = s->skipped_nonregular;
    out->lost_entries = s->lost_entries;
    out->dir_recreated = s->dir_recreated;
    out->verified = s->verified;
    out->dropped = s->dropped;
    out->failed = s->failed;
    out->evictions = s->evictions;
    out->corrupt_removed = s->corrupt_removed;
    out->superseded = s->superseded;
    out->read_bytes = s->read_bytes;
    out->restore_ms_last = s->restore_ms_last;
    if (s->longest_gen != s->gen || s->gen == 0) {
        uint64_t best = 0;
        for (uint32_t i = 0; i < s->n_ents; i++) {
            ssd_entry *e = s->ents[i];
            uint64_t end = e->kind == KVT_SSD_KIND_SNAPSHOT ? e->n_tokens
                                                            : (uint64_t)e->index * s->bt + e->n_tokens;
            if (end > best && (e->kind == KVT_SSD_KIND_SNAPSHOT || contiguous(s, e))) best = end;
        }
        s->longest = best;
        s->longest_gen = s->gen;
    }
    out->longest_durable_prefix_tokens = s->longest;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ scan */
void kvt_ssd_scan_dir(kvt_ssd *s) {
    int dup_fd = fcntl(s->dfd, F_DUPFD_CLOEXEC, 0); /* fdopendir owns it; the held fd stays open */
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0) close(dup_fd);
        return;
    }
    rewinddir(d);
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (nm[0] == '.') continue;
        snprintf(path, sizeof(path), "%s/%s", s->cdir, nm);
        size_t len = strlen(nm);
        if (len > 4 && !strcmp(nm + len - 4, ".tmp")) {
            struct stat ts;
            if (fstatat(dirfd(d), nm, &ts, AT_SYMLINK_NOFOLLOW) == 0 && kvt_ssd_tmp_is_stale(nm, &ts)) {
                KVT_DEBUG("ssd cache: reaping orphan %s", path);
                kvt_ssd_unlink(s, nm); /* removes a symlink itself, never its target */
            }
            continue;
        }
        uint64_t chain;
        uint32_t group, kind;
        if (!kvt_ssd_parse_name(nm, &chain, &group, &kind)) continue; /* not ours (e.g. KEY) */
        /* The directory is untrusted: never follow a symlink, never block on a FIFO/device. */
        int fd = openat(dirfd(d), nm, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat fs0;
        if (fd < 0 || fstat(fd, &fs0) != 0 || !S_ISREG(fs0.st_mode)) {
            if (fd >= 0) close(fd);
            s->skipped_nonregular++;
            if (!s->warned_nonregular) {
                s->warned_nonregular = true;
                KVT_WARN("ssd cache: skipping %s: not a regular file (symlink, FIFO or device; further ones are "
                         "counted, not logged)", path);
            }
            continue;
        }
        uint8_t *buf = NULL;
        hdr_out h;
        char err[256] = "";
        kvt_status st = kvt_ssd_header_read_fd(fd, &buf, &h, err, sizeof(err));
        if (st == KVT_OK) st = kvt_ssd_header_matches(s, &h, chain, group, kind, err, sizeof(err));
        if (st == KVT_OK && s->o.verify) { /* --ssd-cache-verify: every payload section too */
            kvt_ssd_file_info vi;
            st = kvt_ssd_read_file_info_at(dirfd(d), nm, true, &vi, NULL, 0, err, sizeof(err));
            if (st == KVT_OK) s->verified++;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0) memset(&sb, 0, sizeof(sb));
        close(fd);
        ssd_entry *e = NULL;
        if (st == KVT_OK && !kvt_ssd_idx_find(s, chain, group, kind)) {
            e = calloc(1, sizeof(*e));
            uint32_t nid = kind == KVT_SSD_KIND_SNAPSHOT ? 0 : h.info.n_tokens;
            if (e && nid) {
                e->tokens = malloc((size_t)nid * 4);
                if (!e->tokens) {
                    free(e);
                    e = NULL;
                } else {
                    for (uint32_t i = 0; i < nid; i++) e->tokens[i] = kvt_record_id_at(&h, i);
                }
            }
            if (e) {
                e->chain = chain;
                e->link = kind == KVT_SSD_KIND_SNAPSHOT ? chain : h.info.parent;
                e->kind = kind;
                e->group = group;
                e->index = h.info.block_index;
                e->n_tokens = h.info.n_tokens;
                e->bytes = (uint64_t)sb.st_size;
                e->last_use = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull + (uint64_t)sb.st_mtim.tv_nsec;
                if (!kvt_ssd_idx_add(s, e)) {
                    free(e->tokens);
                    free(e);
                }
            }
        } else if (st != KVT_OK) {
            KVT_WARN("ssd cache: removing %s: %s", path, err);
            kvt_ssd_unlink(s, nm);
            s->corrupt_removed++;
        }
        free(buf);
    }
    closedir(d);
}
