/*
 * ssd_writer.c — the SSD tier's writer: records (everything owed to disk), publishing files
 * (tmp + fsync + rename + dir fsync), flush, staging and shedding under memory pressure, and the
 * directory helpers the writer needs. See ssd_int.h for the file map and ssd_cache.h for the API.
 *
 * Record / file state machine
 * ---------------------------
 * Every block, frozen tail and snapshot owed to disk is a record (ssd_item) that holds a reference
 * to its object until it reaches a final state. Once published, the file is an index entry
 * (ssd_entry, ssd_index.c) until it leaves the disk.
 *
 *   enqueue ──▶ QUEUED ──writer──▶ IN-FLIGHT ──write+fsync+rename+dir fsync ok──▶ PUBLISHED
 *      │           ▲                   │                                      (record freed)
 *      │           │                   └──any step fails──▶ FAILED  (dirty) ──┐
 *      └─queue full┼──────────────────────────────────────▶ DROPPED (dirty) ──┤ back-off elapsed or
 *                  │                                                          │ a flush waits
 *                  └────────── writer takes it again (IN-FLIGHT) ◀────────────┘
 *   QUEUED | FAILED | DROPPED ──memory pressure, block referenced only by the record──▶ the same
 *        state, STAGED: its file image encoded into a heap buffer the record owns, the block released
 *        (pool memory freed at once); it moves on as above and is written from the image
 *   QUEUED | FAILED | DROPPED (STAGED or not) ──memory pressure, and a failing disk (its last
 *        SSD_SHED_FAILED_ATTEMPTS writes failed; not staged: the block held only by the record) or no
 *        memory for the image──▶ SHED (dropped unwritten: counted in `shed`, reported by the next flush)
 *   QUEUED | FAILED | DROPPED ──kvt_ssd_free──▶ RELEASED (counted as dropped)
 *
 *   PUBLISHED (file + index entry) ──a longer file at the same position covers it──▶ SUPERSEDED
 *                                  ──byte cap, LRU leaf first──────────────────────▶ EVICTED
 *                                  ──fails a check on scan or restore──────────────▶ REMOVED-CORRUPT
 *                                  ──the directory was deleted under us────────────▶ LOST
 *   (each of these unlinks the file, or finds it gone, and removes the index entry; counted)
 *
 *   In the code: QUEUED = REC_QUEUED on the q_head list; IN-FLIGHT = REC_INFLIGHT in s->inflight;
 *   FAILED / DROPPED = REC_DIRTY with why WHY_FAILED / WHY_DROPPED on the d_head list; STAGED =
 *   it->image set (it->b NULL), in any of those.
 *
 * Invariants (numbered; where each is enforced)
 * ----------
 *   (1) A record becomes PUBLISHED only after the compat path was found to name the held directory
 *       and the whole image was written, fsync(file), rename and fsync(dir) all succeeded, each
 *       relative to the held directory fd; any failure, a replaced directory or a failed directory
 *       fsync included, is FAILED (write_item; the only `s->published++` is in kvt_ssd_writer_main after
 *       write_item returned OK).
 *   (2) A dirty record is never forgotten: a record leaves the tier only as PUBLISHED, SHED or
 *       RELEASED. FAILED and DROPPED stay on the dirty list and are retried with exponential
 *       back-off (SSD_RETRY_MIN_MS doubling to SSD_RETRY_MAX_MS); a waiting flush retries at once
 *       (make_dirty, take_retry). Staging changes where the bytes live, not the state.
 *   (3) flush() answers durable only when no record numbered <= its target (every record created
 *       before the call) is QUEUED, IN-FLIGHT, FAILED or DROPPED (STAGED ones included: durable
 *       only once their image is written), no record failed to even be allocated (lost_nomem) and
 *       none was SHED since the last flush (lost_shed), and the compat path still names the held
 *       directory — never durable over a hole, nor over records a restart would not find
 *       (count_owed, kvt_ssd_dir_check, kvt_ssd_flush).
 *   (4) Nothing on the request path waits for the disk: enqueue never blocks (a full queue makes the
 *       record DROPPED); only flush waits, and only up to its timeout (enqueue, kvt_ssd_flush).
 *   (5) Records hold pool blocks, so their memory is bounded by the pool budget; under pressure
 *       kvt_ssd_shed frees the pool blocks that only a record references at once, by staging the
 *       record ("free at once": the pressure path copies memory and never waits for the disk). A
 *       record that could still be written is never dropped: only a failing disk (the last
 *       SSD_SHED_FAILED_ATTEMPTS writes of the record failed) or a failed image allocation drops
 *       one, counted in `shed` (kvt_ssd_shed).
 *   (6) At most one record is IN-FLIGHT (one writer) and it is never staged, shed nor released: it
 *       is on no list while the lock is dropped (asserted in kvt_ssd_writer_main).
 *   (7) At most one live record per block/snapshot object (rec_tab), so re-registering a sequence
 *       whose blocks are still owed adds nothing and the record count is bounded by the pool. A
 *       STAGED record holds no object and is in no rec_tab chain (the released block's address may
 *       be reused); a new record of the same block content is written once: the writer skips a
 *       file already in the index (record_exists).
 *   (8) Accounting is exact: q_count/q_bytes count the QUEUED and IN-FLIGHT records, d_count/
 *       d_bytes the dirty ones (a STAGED record counts its image's bytes); every live record that
 *       holds an object is in rec_tab exactly once and on exactly one of q_head, s->inflight,
 *       d_head, in the state that list means (checked by kvt_ssd_records_check, asserted after
 *       every flush and exercised by tests/test_ssd_cache.c under fault schedules).
 *   (9) An index entry exists only for a file that this process PUBLISHED (1) or that the startup
 *       scan found complete (header checks passed); the file is unlinked when its entry is removed
 *       (kvt_ssd_drop_entry), and every removal is counted (superseded, evictions, corrupt_removed,
 *       lost_entries).
 *  (10) A tail is SUPERSEDED only after the file covering it is PUBLISHED and indexed, and only when
 *       the cover exists in every group that holds the tail, so a lookup never loses a prefix the
 *       index could serve before (kvt_ssd_supersede in ssd_index.c, called after kvt_ssd_idx_add).
 *  (11) A STAGED record holds exactly the bytes write_item would write for its block (encoded
 *       through the same kvt_record_prepare / kvt_record_header_encode; write_item decodes and
 *       checks the header of either before writing), holds no object, and g_count/g_bytes count the
 *       staged images, which never exceed the queue cap (opts.queue_max_bytes, --ssd-spill-queue-mb;
 *       a lone image excepted, as for the queue), so the memory budget's spill-queue part covers
 *       them (kvt_ssd_shed checks the cap with the largest image before staging;
 *       kvt_ssd_records_check checks the records, the counts and the cap).
 */
#include "ssd_int.h"

/* ------------------------------------------------------------------ writing */
/* Temporary names are unique per process: "<name>.<pid>-<nonce>.tmp". The nonce is drawn once per
 * process, so a restarted server that got the same pid (containers) still has a different name, and
 * the startup scan can tell its own predecessor's orphans (reap) from a live neighbour's (keep). */
static uint64_t proc_nonce(void) {
    static _Atomic uint64_t nonce;
    uint64_t n = atomic_load(&nonce);
    if (n) return n;
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
        close(fd);
    }
    r ^= now_real_ns() ^ ((uint64_t)getpid() << 32);
    r |= 1; /* never 0 */
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&nonce, &zero, r);
    return atomic_load(&nonce);
}
void kvt_ssd_tmp_name(char *buf, size_t n, const char *path) {
    snprintf(buf, n, "%s.%d-%016llx.tmp", path, (int)getpid(), (unsigned long long)proc_nonce());
}
/* Orphan rule of the startup scan for a "*.tmp" name: stale (reap) unless it carries the pid of a
 * live process other than ours (another server sharing the directory) and is younger than an hour
 * (a process on another host sharing the directory cannot be probed; an hour-old temporary is
 * abandoned in practice). A temporary with our pid but another nonce is our predecessor's. */
bool kvt_ssd_tmp_is_stale(const char *name, const struct stat *sb) {
    const char *dot = strrchr(name, '.'); /* ".tmp" */
    const char *p = dot;
    while (p > name && p[-1] != '.') p--;
    int pid = 0;
    unsigned long long nonce = 0;
    if (p <= name || sscanf(p, "%d-%16llx.tmp", &pid, &nonce) != 2 || pid <= 0) return true;
    if ((uint64_t)now_real_ns() / 1000000000ull > (uint64_t)sb->st_mtim.tv_sec + 3600) return true;
    if (pid == (int)getpid()) return nonce != proc_nonce();
    return kill(pid, 0) != 0 && errno == ESRCH;
}

/* Publishes one item as a file in the held directory. Returns KVT_OK and fills *e (index entry)
 * on success. Writer thread only (it alone replaces s->dfd). First checks that s->cdir still names
 * the held directory (*dir: DIR_SAME or why not; nothing is written unless it does): a directory
 * moved away and replaced (by a symlink or another directory) would otherwise receive records
 * that no restart can find.
 * The image: a record that holds its object is prepared here (header encoded, payload sections
 * read from the block or snapshot, a tail packed); a STAGED record brings its image, which
 * kvt_ssd_shed encoded through the same kvt_record_prepare / kvt_record_header_encode (record.c:
 * kvt_record_encode), so both are the same bytes. Either way the header is decoded back (its
 * checksum, bounds and chain hash checked), and the file name, the sections written and the index
 * entry come from that decoded header: one path for both. */
static kvt_status write_item(kvt_ssd *s, ssd_item *it, ssd_entry **eout, dir_state *dir) {
    *eout = NULL;
    *dir = kvt_ssd_dir_check(s);
    if (*dir != DIR_SAME) {
        errno = *dir == DIR_GONE ? ENOENT : *dir == DIR_REPLACED ? ENOTDIR : errno;
        return KVT_ERR_IO;
    }
    ssd_record rec;
    memset(&rec, 0, sizeof rec);
    uint8_t *hbuf = NULL; /* the encoded header of a prepared record (owned) */
    uint8_t *hdr;
    uint64_t hsize, fsize;
    if (it->image) {
        hdr = it->image;
        hsize = it->image_len >= SSD_FIXED_HDR ? get_u32(it->image + 12) : 0;
        fsize = it->image_len;
        if (hsize < SSD_FIXED_HDR || hsize > fsize) {
            errno = EINVAL;
            return KVT_ERR_CORRUPT; /* cannot happen: kvt_record_encode wrote it */
        }
    } else {
        kvt_status pst = kvt_ssd_record_prepare(s, it->b, it->s, it->root, &rec);
        if (pst != KVT_OK) return pst;
        hsize = rec.hsize;
        fsize = rec.fsize;
        hbuf = malloc(hsize);
        if (!hbuf) {
            free(rec.packed);
            return KVT_ERR_NOMEM;
        }
        kvt_record_header_encode(&rec.h, hbuf, hsize);
        hdr = hbuf;
    }
    if (s->o.max_bytes && fsize > s->o.max_bytes) {
        free(hbuf);
        free(rec.packed);
        errno = EFBIG;
        return KVT_ERR_RANGE;
    }
    hdr_out h;
    char herr[128];
    kvt_status hst = kvt_record_header_decode(hdr, hsize, fsize, &h, herr, sizeof herr);
    if (hst != KVT_OK) { /* a bug, never a file: the record fails and stays dirty */
        free(hbuf);
        free(rec.packed);
        errno = hst == KVT_ERR_NOMEM ? ENOMEM : EINVAL;
        return hst;
    }
    const kvt_record_info *I = &h.info;

    char name[64], tmp[128];
    kvt_ssd_entry_name(name, sizeof(name), I->chain, I->group, I->kind);
    kvt_ssd_tmp_name(tmp, sizeof(tmp), name);
    kvt_status st = KVT_ERR_IO;
    /* O_EXCL|O_NOFOLLOW: never opens a planted file or follows a planted symlink. A leftover of our
     * own (a failed earlier attempt of this process) is removed first; unlink never follows. All
     * relative to the held directory. */
    kvt_ssd_io *io = s->io;
    const int dfd = s->dfd;
    kvt_ssd_io_unlink_at(io, dfd, s->cdir, tmp);
    int fd = kvt_ssd_io_create_excl_at(io, dfd, s->cdir, tmp); /* O_EXCL|O_NOFOLLOW, 0600 regardless of umask */
    if (fd >= 0) {
        bool ok = kvt_ssd_io_pwrite(io, fd, hdr, hsize, 0, false);
        for (uint32_t i = 0; ok && i < I->n_sections; i++) {
            const kvt_record_section sc = kvt_record_section_at(&h, i);
            const uint8_t *p = it->image ? it->image + sc.offset : rec.payload[i];
            ok = kvt_ssd_io_pwrite(io, fd, p, sc.length, sc.offset, true);
        }
        /* Pad to the page-aligned end so O_DIRECT reads of the last section stay inside the file. */
        if (ok && !kvt_ssd_io_truncate(io, fd, fsize)) ok = false;
        if (ok && !kvt_ssd_io_fsync(io, fd)) ok = false;
        int saved = errno;
        if (!kvt_ssd_io_close(io, fd) && ok) {
            ok = false;
            saved = errno;
        }
        if (ok && kvt_ssd_io_rename_at(io, dfd, s->cdir, tmp, name)) {
            bool synced = kvt_ssd_io_fsync_dirfd(io, dfd, s->cdir);
            /* published under its name but maybe not durable: a failure (the record stays dirty and
             * is rewritten; the next scan indexes the file if it survived) */
            st = synced ? KVT_OK : KVT_ERR_IO;
        } else {
            if (ok) saved = errno;
            kvt_ssd_io_unlink_at(io, dfd, s->cdir, tmp);
            errno = saved;
        }
    }
    ssd_entry *e = NULL;
    if (st == KVT_OK) {
        const uint32_t n_ids = I->kind == KVT_SSD_KIND_SNAPSHOT ? 0 : I->n_tokens;
        e = calloc(1, sizeof(*e));
        if (e && n_ids) {
            e->tokens = malloc((size_t)n_ids * 4);
            if (e->tokens) {
                for (uint32_t i = 0; i < n_ids; i++) e->tokens[i] = kvt_record_id_at(&h, i);
            } else {
                free(e);
                e = NULL;
            }
        }
        if (e) {
            e->chain = I->chain;
            e->link = I->kind == KVT_SSD_KIND_SNAPSHOT ? I->chain : I->parent;
            e->kind = I->kind;
            e->group = I->group;
            e->index = I->block_index;
            e->n_tokens = I->n_tokens;
            e->bytes = fsize;
            e->last_use = now_real_ns();
        }
    }
    free(hbuf); /* h points into hdr: freed only now */
    free(rec.packed);
    if (st != KVT_OK) return st;
    if (!e) return KVT_ERR_NOMEM; /* file is valid; the next scan will index it */
    *eout = e;
    return KVT_OK;
}

/* ---- records: the durability state machine (see the top of this file) ---------------------- */
/* Record table: at most one record per block/snapshot object, so re-registering a sequence whose
 * blocks are still owed (every request end does) adds nothing. Lock held. */
static uint32_t rec_bucket(const ssd_item *it) {
    uint64_t h = (uint64_t)(uintptr_t)(it->b ? (const void *)it->b : (const void *)it->s);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(h >> 40) % SSD_REC_BUCKETS;
}
static ssd_item *rec_find(kvt_ssd *s, const ssd_item *it) {
    for (ssd_item *r = s->rec_tab[rec_bucket(it)]; r; r = r->hnext)
        if (r->b == it->b && r->s == it->s) return r;
    return NULL;
}
static void rec_insert(kvt_ssd *s, ssd_item *it) {
    uint32_t k = rec_bucket(it);
    it->hnext = s->rec_tab[k];
    s->rec_tab[k] = it;
}
static void rec_remove(kvt_ssd *s, ssd_item *it) {
    for (ssd_item **pp = &s->rec_tab[rec_bucket(it)]; *pp; pp = &(*pp)->hnext)
        if (*pp == it) {
            *pp = it->hnext;
            return;
        }
}

/* One listed record against invariants (8) and (11): an object record is in rec_tab; a staged one
 * holds no object, is in no chain and carries its image (counted in *gn / *gb). Lock held. */
static bool record_ok(kvt_ssd *s, ssd_item *it, uint64_t *gn, uint64_t *gb) {
    if (!it->image) return (it->b != NULL) != (it->s != NULL) && rec_find(s, it) == it;
    for (ssd_item *r = s->rec_tab[rec_bucket(it)]; r; r = r->hnext)
        if (r == it) return false;
    if (it->b || it->s || it->bytes != it->image_len || it->image_len < SSD_FIXED_HDR) return false;
    (*gn)++;
    *gb += it->image_len;
    return true;
}

/* Invariants (8) and (11): the record lists, states, counters and rec_tab agree, and the staged
 * images fit the queue cap. Returns true if they do. O(records); lock held. */
bool kvt_ssd_records_check(kvt_ssd *s) {
    uint64_t qn = 0, qb = 0, dn = 0, db = 0, gn = 0, gb = 0, live = 0;
    for (ssd_item *it = s->q_head; it; it = it->next) {
        if (it->state != REC_QUEUED || !record_ok(s, it, &gn, &gb) || (!it->next && s->q_tail != it)) return false;
        qn++;
        qb += it->bytes;
    }
    if (s->inflight) {
        if (s->inflight->state != REC_INFLIGHT || !record_ok(s, s->inflight, &gn, &gb)) return false;
        qn++;
        qb += s->inflight->bytes;
    }
    for (ssd_item *it = s->d_head; it; it = it->next) {
        if (it->state != REC_DIRTY || (it->why != WHY_FAILED && it->why != WHY_DROPPED) || !record_ok(s, it, &gn, &gb))
            return false;
        dn++;
        db += it->bytes;
    }
    for (uint32_t k = 0; k < SSD_REC_BUCKETS; k++)
        for (ssd_item *it = s->rec_tab[k]; it; it = it->hnext) live++;
    if (!s->q_head && s->q_tail) return false;
    const uint64_t qmax = s->o.queue_max_bytes ? s->o.queue_max_bytes : SSD_DEFAULT_QUEUE;
    if (gn != s->g_count || gb != s->g_bytes || (gb > qmax && gn > 1)) return false; /* (11) */
    /* every live object record is on exactly one list: the table holds as many as the lists less
     * the staged ones; record_ok found each listed one in the table, so none is listed twice
     * unless one is missing */
    return qn == s->q_count && qb == s->q_bytes && dn == s->d_count && db == s->d_bytes && live == qn + dn - gn;
}

#define SSD_RETRY_MIN_MS 50u
#define SSD_RETRY_MAX_MS 30000u

void kvt_ssd_item_release(ssd_item *it) {
    if (it->b) kvt_block_release(it->b);
    if (it->s) kvt_snapshot_release(it->s);
    free(it->image);
    free(it);
}

/* Moves a record to DIRTY (lock held). failed: a write attempt failed (back-off grows). */
static void make_dirty(kvt_ssd *s, ssd_item *it, rec_why why) {
    uint64_t now = kvt_now_ns();
    it->state = REC_DIRTY;
    it->why = why;
    uint64_t ms = SSD_RETRY_MIN_MS;
    if (why == WHY_FAILED) {
        it->attempts++;
        it->fail_ns = now;
        for (uint32_t i = 1; i < it->attempts && ms < SSD_RETRY_MAX_MS; i++) ms *= 2;
        if (ms > SSD_RETRY_MAX_MS) ms = SSD_RETRY_MAX_MS;
    }
    it->retry_at_ns = now + ms * 1000000ull;
    it->next = s->d_head;
    s->d_head = it;
    s->d_count++;
    s->d_bytes += it->bytes;
}

/* The DIRTY record to retry now (removed from the list), or NULL; *wake_ns = earliest retry time
 * (0 if none). A waiting flush retries every dirty record of its range at once. Lock held. */
static ssd_item *take_retry(kvt_ssd *s, uint64_t now, uint64_t *wake_ns) {
    *wake_ns = 0;
    ssd_item **best = NULL;
    for (ssd_item **pp = &s->d_head; *pp; pp = &(*pp)->next) {
        ssd_item *it = *pp;
        bool due = it->retry_at_ns <= now || (s->flush_waiters && it->seq_no <= s->flush_target &&
                                              it->fail_ns < s->flush_start_ns);
        if (due) {
            if (!best || it->seq_no < (*best)->seq_no) best = pp;
        } else if (!*wake_ns || it->retry_at_ns < *wake_ns) {
            *wake_ns = it->retry_at_ns;
        }
    }
    if (!best) return NULL;
    ssd_item *it = *best;
    *best = it->next;
    s->d_count--;
    s->d_bytes -= it->bytes;
    return it;
}

/* Writer priority. The writer checksums and writes in the background; at normal priority it
 * competes with the compute threads (decode measured ~6% slower on 2 cores). It runs at idle
 * priority (SCHED_IDLE, else nice 19) so it only takes otherwise idle CPU. While it is urgent (a
 * flush is blocked on it, or staged images fill half the queue cap: writer_urgent), it tries to
 * return to SCHED_OTHER; unprivileged processes usually may not leave SCHED_IDLE (EPERM), in which
 * case it stays idle — still never starved forever (CFS gives SCHED_IDLE a small weight), and
 * flush has its timeout. */
typedef enum { PRIO_NORMAL = 0, PRIO_IDLE = 1, PRIO_NICE = 2 } writer_prio;

static writer_prio writer_lower_priority(void) {
#ifdef __linux__
    struct sched_param sp = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) == 0) return PRIO_IDLE;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) == 0) return PRIO_NICE;
#endif
    return PRIO_NORMAL;
}

/* Back to SCHED_OTHER (nice 0) for a waiting flush; true on success. */
static bool writer_raise_priority(writer_prio cur) {
#ifdef __linux__
    if (cur == PRIO_IDLE) {
        struct sched_param sp = {0};
        return pthread_setschedparam(pthread_self(), SCHED_OTHER, &sp) == 0;
    }
    if (cur == PRIO_NICE) return setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 0) == 0;
#endif
    (void)cur;
    return false;
}

/* While the engine decodes (busy), the writer defers so that checksumming and page-cache copies
 * do not compete with the memory-bandwidth-bound token loop. The deferral is bounded: it ends when
 * a flush waits, the queue is half full, or the oldest item has waited SSD_BUSY_MAX_DEFER_MS. The
 * crash guarantee is unchanged (what is not yet durable may be lost; nothing wrong is reused). */
#define SSD_BUSY_MAX_DEFER_MS 2000u
/* The writer is urgent while a flush waits for it, or while staged images (memory pressure) hold
 * half the queue cap or more: past the cap, pressure can no longer stage and allocations fail, so
 * the images must reach the disk at normal priority, without the busy deferral. Under s->mu. */
static bool writer_urgent(const kvt_ssd *s) {
    const uint64_t qmax = s->o.queue_max_bytes ? s->o.queue_max_bytes : SSD_DEFAULT_QUEUE;
    return s->flush_waiters || s->g_bytes >= qmax / 2;
}

static bool writer_should_defer(kvt_ssd *s, uint64_t now_ns, uint64_t *wake_ns) {
    if (!s->busy || writer_urgent(s) || s->stop || !s->q_head) return false;
    uint64_t qmax = s->o.queue_max_bytes ? s->o.queue_max_bytes : SSD_DEFAULT_QUEUE;
    if (s->q_bytes >= qmax / 2) return false;
    uint64_t deadline = s->q_head->t_enq_ns + (uint64_t)SSD_BUSY_MAX_DEFER_MS * 1000000ull;
    if (now_ns >= deadline) return false;
    *wake_ns = deadline;
    return true;
}

void kvt_ssd_set_progress(kvt_ssd *s, kvt_ssd_progress_fn fn, void *ctx) {
    if (!s) return;
    s->progress = fn;
    s->progress_ctx = ctx;
}

void kvt_ssd_set_busy(kvt_ssd *s, bool busy) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->busy = busy;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}

static void timed_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t wait_ns) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + wait_ns;
    dl.tv_sec += (time_t)(ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(cv, mu, &dl);
}

static bool record_exists(kvt_ssd *s, const ssd_item *it) {
    if (it->image) return kvt_ssd_idx_find(s, it->chain, it->group, it->kind) != NULL;
    if (it->b) {
        uint32_t nt = kvt_block_n_tokens(it->b);
        return kvt_ssd_idx_find(s, kvt_block_hash(it->b), kvt_block_group(it->b),
                        nt == s->bt ? KVT_SSD_KIND_BLOCK : KVT_SSD_KIND_TAIL) != NULL;
    }
    return kvt_ssd_idx_find(s, kvt_snapshot_chain(it->s), SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT) != NULL;
}

/* The compat directory path is gone (deleted or moved away; a temporary could not be created:
 * ENOENT). Every index entry is gone with it, so the index is emptied (counted as lost) to keep
 * /stats true, and the directory is recreated (0700, parent fsynced) and held in place of the old
 * one (opened without following a symlink, trust-checked), so the record can be written at once.
 * Returns true if it was recreated. Lock held; writer thread. */
static bool dir_vanished(kvt_ssd *s) {
    struct stat sb;
    if (lstat(s->cdir, &sb) == 0) return false; /* still there: another cause (kvt_ssd_dir_check decides) */
    KVT_WARN("ssd cache: %s disappeared; forgetting %u entries and recreating it", s->cdir, s->n_ents);
    while (s->n_ents) {
        kvt_ssd_idx_remove(s, s->ents[s->n_ents - 1]);
        s->lost_entries++;
    }
    if (kvt_ssd_mkdir_p(s->io, s->cdir) != 0) return false; /* the record fails and is retried with back-off */
    char err[256];
    int fd = kvt_ssd_dir_open_held(s->cdir, &sb, err, sizeof err);
    if (fd < 0) {
        KVT_WARN("%s", err);
        return false;
    }
    pthread_mutex_lock(&s->dir_mu);
    close(s->dfd);
    s->dfd = fd;
    s->dir_dev = sb.st_dev;
    s->dir_ino = sb.st_ino;
    pthread_mutex_unlock(&s->dir_mu);
    kvt_ssd_write_key_file(s->io, s->dfd, s->cdir, s->compat);
    s->dir_recreated++;
    return true;
}

void *kvt_ssd_writer_main(void *arg) {
    kvt_ssd *s = arg;
    writer_prio low = writer_lower_priority(), cur = low;
    bool can_raise = low != PRIO_NORMAL;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stop) break;
        uint64_t now = kvt_now_ns(), wake_ns = 0;
        ssd_item *it = NULL;
        if (!s->paused) {
            uint64_t defer_ns;
            if (s->q_head && writer_should_defer(s, now, &defer_ns)) {
                timed_wait_ns(&s->cv_work, &s->mu, defer_ns > now ? defer_ns - now : 0);
                continue;
            }
            if (s->q_head) {
                it = s->q_head;
                s->q_head = it->next;
                if (!s->q_head) s->q_tail = NULL;
            } else if (!s->busy || writer_urgent(s)) {
                it = take_retry(s, now, &wake_ns);
                if (it) { /* back into the queue accounting while in flight */
                    s->q_bytes += it->bytes;
                    s->q_count++;
                }
            } else if (s->d_head) {
                wake_ns = now + (uint64_t)SSD_BUSY_MAX_DEFER_MS * 1000000ull;
            }
        }
        if (!it) {
            if (wake_ns) timed_wait_ns(&s->cv_work, &s->mu, wake_ns > now ? wake_ns - now : 0);
            else pthread_cond_wait(&s->cv_work, &s->mu);
            continue;
        }
        const bool urgent = writer_urgent(s);
        if (urgent && cur != PRIO_NORMAL && can_raise) {
            if (writer_raise_priority(cur)) cur = PRIO_NORMAL;
            else can_raise = false; /* EPERM: do not retry every item */
        } else if (!urgent && cur == PRIO_NORMAL && low != PRIO_NORMAL) {
            cur = writer_lower_priority();
        }
        assert(!s->inflight); /* invariant (6): one writer, one record in flight */
        it->state = REC_INFLIGHT;
        s->inflight = it;
        bool exists = record_exists(s, it);
        kvt_status st = KVT_OK;
        ssd_entry *e = NULL;
        int err_no = 0;
        if (!exists) {
            pthread_mutex_unlock(&s->mu);
            dir_state ds;
            st = write_item(s, it, &e, &ds);
            err_no = errno;
            pthread_mutex_lock(&s->mu);
            if ((ds == DIR_REPLACED || ds == DIR_CHECK_FAILED) && !s->dir_replaced && !s->dir_check_failed)
                KVT_WARN("ssd cache: %s %s; nothing is written until it names the directory opened at startup again "
                         "(restore it, or restart)", s->cdir,
                         ds == DIR_REPLACED ? "was replaced (moved away, swapped for a symlink or another directory)"
                                            : "could not be checked");
            s->dir_replaced = ds == DIR_REPLACED;
            s->dir_check_failed = ds == DIR_CHECK_FAILED;
        }
        s->inflight = NULL;
        s->q_bytes -= it->bytes;
        s->q_count--;
        if (st != KVT_OK && err_no == ENOENT && dir_vanished(s)) { /* recreated: retry at once */
            it->state = REC_QUEUED;
            it->next = s->q_head;
            s->q_head = it;
            if (!s->q_tail) s->q_tail = it;
            s->q_bytes += it->bytes;
            s->q_count++;
            continue;
        }
        if (st != KVT_OK) {
            s->failed++;
            s->last_errno = err_no;
            if (!s->warned_write) {
                s->warned_write = true;
                KVT_WARN("ssd cache: write to %s failed (%s%s%s); serving continues, the record stays dirty "
                         "and is retried (further failures are counted, not logged)",
                         s->cdir, kvt_status_str(st), err_no ? ": " : "", err_no ? strerror(err_no) : "");
            }
            make_dirty(s, it, WHY_FAILED); /* invariant 2 */
            pthread_cond_broadcast(&s->cv_done);
            continue;
        }
        if (e) {
            ssd_entry *dup = kvt_ssd_idx_find(s, e->chain, e->group, e->kind);
            if (dup) { /* raced with a scan-less duplicate: keep one entry */
                s->bytes -= dup->bytes;
                dup->bytes = e->bytes;
                s->bytes += e->bytes;
                free(e->tokens);
                free(e);
                kvt_ssd_supersede(s, dup);
            } else if (!kvt_ssd_idx_add(s, e)) {
                free(e->tokens);
                free(e);
            } else {
                kvt_ssd_supersede(s, e); /* e is durable (renamed, dir fsynced) and indexed */
            }
            kvt_ssd_enforce_cap(s);
        }
        s->published++;
        if (it->image) { /* a staged record is in no chain; its image leaves the staged bytes */
            s->g_count--;
            s->g_bytes -= it->image_len;
        } else {
            rec_remove(s, it);
        }
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
        kvt_ssd_item_release(it);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Queues a record (reference already taken by the caller). Never waits (invariant 4): when the
 * queue is full the record becomes DIRTY(dropped) and the writer retries it later. Returns false
 * if it was not queued (dropped: still owed; or the tier is closing: released). */
static bool enqueue(kvt_ssd *s, ssd_item *it) {
    pthread_mutex_lock(&s->mu);
    uint64_t qmax = s->o.queue_max_bytes ? s->o.queue_max_bytes : SSD_DEFAULT_QUEUE;
    it->next = NULL;
    it->t_enq_ns = kvt_now_ns();
    it->seq_no = ++s->next_seq_no;
    if (s->stop) {
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        kvt_ssd_item_release(it);
        return false;
    }
    if (rec_find(s, it)) { /* already owed (queued, in flight or dirty): one record per object */
        pthread_mutex_unlock(&s->mu);
        kvt_ssd_item_release(it);
        return true;
    }
    rec_insert(s, it);
    /* Soft cap: a lone record larger than the bound is still accepted. */
    if (s->q_count > 0 && s->q_bytes + it->bytes > qmax) {
        s->dropped++;
        make_dirty(s, it, WHY_DROPPED);
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    it->state = REC_QUEUED;
    if (s->q_tail) s->q_tail->next = it;
    else s->q_head = it;
    s->q_tail = it;
    s->q_bytes += it->bytes;
    s->q_count++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return true;
}

static bool on_disk(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind) {
    pthread_mutex_lock(&s->mu);
    ssd_entry *e = kvt_ssd_idx_find(s, chain, group, kind);
    if (e) e->last_use = now_real_ns();
    pthread_mutex_unlock(&s->mu);
    return e != NULL;
}

/* A zeroed record; an allocation failure counts as a dropped write (never silent). */
static ssd_item *item_new(kvt_ssd *s) {
    ssd_item *it = calloc(1, sizeof(*it));
    if (!it) {
        pthread_mutex_lock(&s->mu);
        s->dropped++;
        s->lost_nomem++; /* owed but cannot be tracked: flush reports it once per occurrence */
        pthread_mutex_unlock(&s->mu);
    }
    return it;
}

static bool put_block(kvt_ssd *s, kvt_block *b, uint64_t root) {
    if (!b || !kvt_block_sealed(b) || kvt_block_n_tokens(b) == 0) return false;
    uint32_t nt = kvt_block_n_tokens(b);
    if (on_disk(s, kvt_block_hash(b), kvt_block_group(b), nt == s->bt ? KVT_SSD_KIND_BLOCK : KVT_SSD_KIND_TAIL))
        return true;
    ssd_item *it = item_new(s);
    if (!it) return false;
    kvt_block_retain(b);
    it->b = b;
    it->root = root;
    it->bytes = kvt_block_data_bytes(b);
    return enqueue(s, it);
}

static bool put_snapshot(kvt_ssd *s, kvt_snapshot *sn, uint64_t root) {
    if (!sn || kvt_snapshot_pos(sn) == 0 || kvt_kv_layout_state_bytes(s->layout) == 0) return false;
    if (on_disk(s, kvt_snapshot_chain(sn), SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT)) return true;
    ssd_item *it = item_new(s);
    if (!it) return false;
    kvt_snapshot_retain(sn);
    it->s = sn;
    it->root = root;
    it->bytes = kvt_kv_layout_state_bytes(s->layout);
    return enqueue(s, it);
}

bool kvt_ssd_enqueue_block(kvt_ssd *s, kvt_block *b, uint64_t root) { return !s || put_block(s, b, root); }

uint32_t kvt_ssd_enqueue_seq(kvt_ssd *s, const kvt_seq *seq, kvt_snapshot *snap) {
    if (!s || !seq) return 0;
    uint32_t n = 0, nb = kvt_seq_n_blocks(seq);
    uint64_t root = kvt_seq_root(seq);
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t g = 0; g < s->n_groups; g++) {
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (b && kvt_block_sealed(b) && put_block(s, b, root)) n++;
        }
    if (snap && put_snapshot(s, snap, root)) n++;
    return n;
}

bool kvt_ssd_spill_block(void *ctx, kvt_block *b) {
    kvt_ssd *s = ctx;
    if (!s) return false;
    pthread_mutex_lock(&s->mu);
    s->spills++;
    pthread_mutex_unlock(&s->mu);
    return put_block(s, b, 0);
}

bool kvt_ssd_spill_snapshot(void *ctx, kvt_snapshot *sn) {
    kvt_ssd *s = ctx;
    if (!s) return false;
    pthread_mutex_lock(&s->mu);
    s->spills++;
    pthread_mutex_unlock(&s->mu);
    return put_snapshot(s, sn, 0);
}

bool kvt_ssd_persist_block(void *ctx, kvt_block *b) { return ctx && put_block((kvt_ssd *)ctx, b, 0); }
bool kvt_ssd_persist_snapshot(void *ctx, kvt_snapshot *sn) { return ctx && put_snapshot((kvt_ssd *)ctx, sn, 0); }

void kvt_ssd_note_demotions(kvt_ssd *s, uint64_t n) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->demotions += n;
    pthread_mutex_unlock(&s->mu);
}

/* Counts the records numbered <= target by state. Lock held. */
static void count_owed(kvt_ssd *s, uint64_t target, uint64_t *pending, uint64_t *dropped, uint64_t *failed,
                       bool *all_tried_since, uint64_t since_ns) {
    *pending = *dropped = *failed = 0;
    *all_tried_since = true;
    for (ssd_item *it = s->q_head; it; it = it->next)
        if (it->seq_no <= target) (*pending)++;
    if (s->inflight && s->inflight->seq_no <= target) (*pending)++;
    for (ssd_item *it = s->d_head; it; it = it->next) {
        if (it->seq_no > target) continue;
        if (it->why == WHY_FAILED) (*failed)++;
        else (*dropped)++;
        if (it->why != WHY_FAILED || it->fail_ns < since_ns) *all_tried_since = false;
    }
}

void kvt_ssd_flush(kvt_ssd *s, uint32_t timeout_ms, kvt_ssd_flush_result *out) {
    memset(out, 0, sizeof(*out));
    if (!s) {
        out->durable = true;
        return;
    }
    const uint64_t t0 = kvt_now_ns();
    pthread_mutex_lock(&s->mu);
    const uint64_t target = s->next_seq_no, published0 = s->published;
    uint64_t pending, dropped, failed;
    bool tried;
    /* One flush at a time owns the retry window (a second waits behind it, under the same rule). */
    s->flush_waiters++;
    if (s->flush_target < target) s->flush_target = target;
    s->flush_start_ns = t0;
    pthread_cond_broadcast(&s->cv_work);
    const uint64_t deadline = t0 + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        count_owed(s, target, &pending, &dropped, &failed, &tried, t0);
        /* done: nothing owed; or nothing in flight and every dirty record failed again since t0
         * (retrying sooner would fail the same way: answer now rather than at the timeout) */
        if (pending + dropped + failed == 0 || (pending == 0 && dropped == 0 && tried)) break;
        uint64_t now = kvt_now_ns();
        if (now >= deadline || s->stop) break;
        timed_wait_ns(&s->cv_done, &s->mu, KVT_MIN(deadline - now, 50ull * 1000000ull));
    }
    s->flush_waiters--;
    assert(kvt_ssd_records_check(s)); /* invariant (8) */
    /* What was published is durable only where a restart finds it: cdir must still name the held
     * directory (records written before a swap went into the directory that was moved away). */
    const dir_state ds = kvt_ssd_dir_check(s);
    uint64_t lost = s->lost_nomem, shed = s->lost_shed;
    s->lost_nomem = s->lost_shed = 0;
    out->entries = s->n_ents;
    out->pending_blocks = pending;
    out->dropped = dropped + lost + shed;
    out->failed = failed;
    out->records_written = s->published - published0;
    out->durable = pending + dropped + failed + lost + shed == 0 && ds == DIR_SAME;
    if (!out->durable) {
        if (ds == DIR_REPLACED || ds == DIR_GONE) /* the path is in the log (writer warning) */
            snprintf(out->reason, sizeof out->reason,
                     "cache directory %s since startup (moved, or swapped for a symlink): nothing is written "
                     "through the new path", ds == DIR_GONE ? "gone" : "replaced");
        else if (ds == DIR_CHECK_FAILED)
            snprintf(out->reason, sizeof out->reason, "cache directory could not be checked: %s", strerror(errno));
        else if (failed)
            snprintf(out->reason, sizeof out->reason, "%llu record(s) could not be written: %s (retried with back-off)",
                     (unsigned long long)failed, s->last_errno ? strerror(s->last_errno) : "I/O error");
        else if (shed)
            snprintf(out->reason, sizeof out->reason,
                     "%llu record(s) were dropped unwritten under memory pressure (a failing disk, or no memory to stage them)",
                     (unsigned long long)shed);
        else if (dropped || lost)
            snprintf(out->reason, sizeof out->reason, "%llu record(s) dropped from the write queue are not yet rewritten",
                     (unsigned long long)(dropped + lost));
        else
            snprintf(out->reason, sizeof out->reason, "timed out after %u ms with %llu record(s) still being written",
                     timeout_ms, (unsigned long long)pending);
    }
    pthread_mutex_unlock(&s->mu);
    kvt_ssd_stats st;
    kvt_ssd_stats_get(s, &st);
    out->longest_durable_prefix_tokens = st.longest_durable_prefix_tokens;
    out->elapsed_ms = (double)(kvt_now_ns() - t0) / 1e6;
}

/* Memory pressure (invariants 5 and 11). Walks the DIRTY records, then the QUEUED ones (never the
 * one IN-FLIGHT), until `bytes` pool bytes were freed:
 *   - a record past SSD_SHED_FAILED_ATTEMPTS failed writes (a failing disk) whose object nothing
 *     else holds, or that is staged, is dropped unwritten (SHED: counted, the next flush reports it);
 *   - a record whose block nothing else holds is STAGED: its file image is encoded into a heap
 *     buffer the record owns (the bytes write_item would write) and the block is released, while
 *     the staged images fit the queue cap; if the image cannot be allocated it is dropped (SHED);
 *     past the cap it keeps its block (it is written as it is; the allocation that pressed may
 *     fail: a clean 503, never a lost record).
 * Memory copies only, under the lock the writer never holds across I/O: nothing waits for the disk.
 * Snapshots are not pool memory and are kept. Returns pool bytes freed. */
#define SSD_SHED_FAILED_ATTEMPTS 3u

/* Unlinks *pp (on list l: 0 = dirty, 1 = queued; prev = its predecessor) from its list. Lock held. */
static ssd_item *shed_unlink(kvt_ssd *s, ssd_item **pp, ssd_item *prev, int l) {
    ssd_item *it = *pp;
    *pp = it->next;
    if (l == 0) {
        s->d_count--;
        s->d_bytes -= it->bytes;
    } else {
        s->q_count--;
        s->q_bytes -= it->bytes;
        if (s->q_tail == it) s->q_tail = prev;
    }
    return it;
}

/* Stages it (its block held only by it): the image to the heap, the block released. Returns the
 * pool bytes freed, 0 when it was not staged (*nomem: the image could not be allocated). Lock
 * held; the pool lock, taken by the release, is a leaf (the pool never calls into this tier while
 * holding it). */
static uint64_t stage(kvt_ssd *s, ssd_item *it, int l, bool *nomem) {
    *nomem = false;
    kvt_block *b = it->b;
    uint8_t *img = NULL;
    size_t len = 0;
    kvt_status st = KVT_ERR_NOMEM;
    if (s->stage_nomem) s->stage_nomem--; /* tests: this allocation fails */
    else st = kvt_ssd_record_encode(s, b, it->root, &img, &len);
    if (st != KVT_OK) {
        *nomem = true;
        return 0;
    }
    const uint64_t freed = kvt_block_data_bytes(b);
    rec_remove(s, it); /* keyed by the block, which may be reused once released */
    it->chain = kvt_block_hash(b);
    it->group = kvt_block_group(b);
    it->kind = kvt_block_n_tokens(b) == s->bt ? KVT_SSD_KIND_BLOCK : KVT_SSD_KIND_TAIL;
    it->image = img;
    it->image_len = len;
    it->b = NULL;
    if (l == 0) s->d_bytes = s->d_bytes - it->bytes + len;
    else s->q_bytes = s->q_bytes - it->bytes + len;
    it->bytes = len;
    s->g_count++;
    s->g_bytes += len;
    s->staged++;
    kvt_block_release(b);
    return freed;
}

uint64_t kvt_ssd_shed(kvt_ssd *s, uint64_t bytes) {
    if (!s) return 0;
    ssd_item *victims = NULL;
    uint64_t freed = 0;
    pthread_mutex_lock(&s->mu);
    const uint64_t qmax = s->o.queue_max_bytes ? s->o.queue_max_bytes : SSD_DEFAULT_QUEUE;
    /* an upper bound of any block's or tail's image, so the staged images never pass the cap */
    const uint64_t max_image = kvt_ssd_record_max_bytes(s, KVT_SSD_KIND_BLOCK);
    ssd_item **lists[2] = {&s->d_head, &s->q_head};
    for (int l = 0; l < 2 && freed < bytes; l++) {
        ssd_item *prev = NULL;
        for (ssd_item **pp = lists[l]; *pp && freed < bytes;) {
            ssd_item *it = *pp;
            const bool alone = it->b && kvt_block_refcount(it->b) == 1;
            const bool failing = it->state == REC_DIRTY && it->why == WHY_FAILED && it->attempts >= SSD_SHED_FAILED_ATTEMPTS;
            bool drop = failing && (alone || it->image);
            if (!drop && alone) {
                if (s->g_count && s->g_bytes + max_image > qmax) { /* (11): past the cap it keeps its block */
                    prev = it;
                    pp = &it->next;
                    continue;
                }
                bool nomem;
                freed += stage(s, it, l, &nomem);
                drop = nomem;
            }
            if (!drop) {
                prev = it;
                pp = &it->next;
                continue;
            }
            shed_unlink(s, pp, prev, l);
            if (it->b) freed += kvt_block_data_bytes(it->b);
            if (it->image) {
                s->g_count--;
                s->g_bytes -= it->image_len;
            } else {
                rec_remove(s, it);
            }
            s->shed++;
            s->lost_shed++;
            it->next = victims;
            victims = it;
        }
    }
    if (victims) pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    while (victims) {
        ssd_item *n = victims->next;
        kvt_ssd_item_release(victims);
        victims = n;
    }
    return freed;
}

void kvt_ssd_set_fault_rate(kvt_ssd *s, uint64_t seed, uint32_t permille) {
    if (!s) return;
    kvt_ssd_io_set_fault_rate(s->io, seed, permille);
}

/* mkdir 0700 (then chmod, regardless of umask) and fsync of the parent so the new entry survives
 * a power loss. Returns 0 if it exists or was created. */
static int mkdir_durable(kvt_ssd_io *io, const char *path) {
    int r = kvt_ssd_io_mkdir(io, path);
    if (r != 0) return r == 1 ? 0 : -1;
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", path);
    char *sl = strrchr(parent, '/');
    if (sl == parent) sl[1] = 0;
    else if (sl) *sl = 0;
    else snprintf(parent, sizeof(parent), ".");
    return kvt_ssd_io_fsync_dir(io, parent) ? 0 : -1;
}

/* The informational KEY file: created exclusively, never through a planted (even dangling)
 * symlink, mode 0600. An existing KEY is left alone (it is never trusted anyway). */
void kvt_ssd_write_key_file(kvt_ssd_io *io, int dfd, const char *cdir, const char *compat) {
    int fd = kvt_ssd_io_create_excl_at(io, dfd, cdir, "KEY");
    if (fd < 0) return;
    size_t n = strlen(compat);
    if (kvt_ssd_io_pwrite(io, fd, compat, n, 0, false)) kvt_ssd_io_pwrite(io, fd, "\n", 1, n, false); /* best effort */
    kvt_ssd_io_close(io, fd);
}

int kvt_ssd_mkdir_p(kvt_ssd_io *io, const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir_durable(io, tmp) != 0) return -1;
            *p = '/';
        }
    }
    return mkdir_durable(io, tmp);
}
