/* ssd_ckpt.c — see ssd_ckpt.h and docs/cache-format.md ("Checkpoint records").
 *
 * Queue items: the state machine this file enforces.
 *
 *   save(K)        -> QUEUED_WRITE(K)            (a queued item of K is overwritten in place)
 *   invalidate(K)  -> QUEUED_REMOVE(K)           (a queued item of K is turned into a removal)
 *   writer pops    -> IN_FLIGHT -> published | failed | removed   (then freed)
 *
 * Invariants:
 *   I1. At most one QUEUED item per key; at most one item in flight (one writer thread).
 *   I2. Items are processed FIFO, so an operation on K never overtakes an earlier one on K: an
 *       invalidation queued while K's write is in flight becomes a new item behind it.
 *   I3. A file is only ever replaced by rename of a fully written, fsynced temporary: the newest
 *       published record of K stays valid until its successor is published (a failed write leaves
 *       the old file in place and is counted in `failed`).
 *   I4. Loads see the newest state of K: the QUEUED item if any (a removal = miss), else the
 *       in-flight item, else the file.
 *   I5. Queued bytes never exceed CKPT_QUEUE_MAX; a save beyond it is dropped (counted), never
 *       waited for: the token loop never waits for the disk.
 *   I6. Every queued write's watch reaches exactly one final outcome (PUBLISHED, FAILED or
 *       REPLACED), set before the item drops its reference; the store never re-queues a failed
 *       write (the saver retries with a fresh record: src/engine/checkpoint.c).
 */
#include "ssd_ckpt.h"
#include "ssd_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define CKPT_MAGIC "KVTCKPT1"
#define CKPT_FIXED 80u
#define CKPT_COMPAT_MAX 512u
#define CKPT_QUEUE_MAX (64ull << 20)

typedef enum { CK_WRITE = 1, CK_REMOVE = 2 } ck_op;

struct kvt_ckpt_watch {
    atomic_uint refs;
    atomic_int state; /* kvt_ckpt_outcome */
};

typedef struct ck_item {
    struct ck_item *next;
    ck_op op;
    kvt_ckpt_rec rec; /* rec.emitted owned (CK_WRITE) */
    kvt_ckpt_watch *w; /* CK_WRITE: one reference, NULL after its outcome is set (I6) */
} ck_item;

struct kvt_ckpt_store {
    char dir[PATH_MAX];
    /* <cdir>/ckpt held open from open on: every create, rename, unlink, fsync, scan and read is
     * relative to dfd, and a publish first checks that dir still names it (dev/ino): a directory
     * swapped for a symlink cannot redirect a write (see ssd_int.h, kvt_ssd.dfd). */
    int dfd;
    dev_t dev;
    ino_t ino;
    char compat[CKPT_COMPAT_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    pthread_t th;
    bool started, stop, paused;
    ck_item *head, *tail;
    ck_item *inflight;
    uint64_t queued_bytes;
    uint64_t written, invalidated, resumed, failed, dropped, corrupt, retried, resume_reused_tokens;
    uint32_t fail_writes; /* fault injection: the next N writes fail */
    bool warned_io;
};

/* ------------------------------------------------------------------ watches */
kvt_ckpt_outcome kvt_ckpt_watch_state(const kvt_ckpt_watch *w) {
    return w ? (kvt_ckpt_outcome)atomic_load_explicit(&w->state, memory_order_acquire) : KVT_CKPT_FAILED;
}
void kvt_ckpt_watch_release(kvt_ckpt_watch *w) {
    if (w && atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) == 1) free(w);
}
/* Sets the item's final outcome and drops its reference (I6). */
static void item_settle(ck_item *it, kvt_ckpt_outcome o) {
    if (!it->w) return;
    atomic_store_explicit(&it->w->state, (int)o, memory_order_release);
    kvt_ckpt_watch_release(it->w);
    it->w = NULL;
}

/* ------------------------------------------------------------------ encoding */
/* little-endian put_u32/put_u64/get_u32/get_u64: ssd_int.h */
static uint64_t file_size_for(uint32_t compat_len, uint32_t n_emitted) {
    return (uint64_t)CKPT_FIXED + compat_len + 4ull * n_emitted + 8;
}

/* Layout (little-endian): magic[8] version u32, compat_len u32, key[32], n_prompt u32,
 * n_emitted u32, pending i32, flags u32 (0), rng u64, created_ns u64, compat bytes, emitted i32 x n,
 * XXH3-64 of everything before it. */
static uint8_t *encode(const char *compat, const kvt_ckpt_rec *r, size_t *len) {
    const uint32_t cl = (uint32_t)strlen(compat);
    const uint64_t n = file_size_for(cl, r->n_emitted);
    uint8_t *b = malloc(n);
    if (!b) return NULL;
    memcpy(b, CKPT_MAGIC, 8);
    put_u32(b + 8, KVT_CKPT_FORMAT_VERSION);
    put_u32(b + 12, cl);
    memcpy(b + 16, r->key, 32);
    put_u32(b + 48, r->n_prompt);
    put_u32(b + 52, r->n_emitted);
    put_u32(b + 56, (uint32_t)r->pending);
    put_u32(b + 60, 0);
    put_u64(b + 64, r->rng);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    put_u64(b + 72, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    memcpy(b + CKPT_FIXED, compat, cl);
    uint8_t *ids = b + CKPT_FIXED + cl;
    for (uint32_t i = 0; i < r->n_emitted; i++) put_u32(ids + 4 * (size_t)i, (uint32_t)r->emitted[i]);
    put_u64(b + n - 8, XXH3_64bits(b, n - 8));
    *len = (size_t)n;
    return b;
}

/* Decodes and checks a whole file image (untrusted). out->emitted is malloc'd on success. */
static kvt_status decode(const uint8_t *b, uint64_t n, kvt_ckpt_rec *out, char *compat_out, size_t compat_len, char *err,
                         size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n < CKPT_FIXED + 8) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: too short (%llu bytes)", (unsigned long long)n);
    if (memcmp(b, CKPT_MAGIC, 8)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: bad magic");
    if (get_u32(b + 8) != KVT_CKPT_FORMAT_VERSION)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "checkpoint: version %u", get_u32(b + 8));
    const uint32_t cl = get_u32(b + 12), ne = get_u32(b + 52);
    if (cl == 0 || cl >= CKPT_COMPAT_MAX || ne > KVT_CKPT_MAX_EMITTED)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: compat length %u / %u emitted out of range", cl, ne);
    if (file_size_for(cl, ne) != n)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: size %llu does not match its header (truncated?)",
                        (unsigned long long)n);
    if (XXH3_64bits(b, n - 8) != get_u64(b + n - 8)) return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "checkpoint: checksum mismatch");
    if (get_u32(b + 60) != 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: unknown flags");
    memcpy(out->key, b + 16, 32);
    out->n_prompt = get_u32(b + 48);
    out->n_emitted = ne;
    out->pending = (int32_t)get_u32(b + 56);
    out->rng = get_u64(b + 64);
    if (compat_out && compat_len) snprintf(compat_out, compat_len, "%.*s", (int)cl, (const char *)b + CKPT_FIXED);
    out->emitted = malloc(4 * (size_t)ne + 4);
    if (!out->emitted) return KVT_ERR_NOMEM;
    const uint8_t *ids = b + CKPT_FIXED + cl;
    for (uint32_t i = 0; i < ne; i++) out->emitted[i] = (int32_t)get_u32(ids + 4 * (size_t)i);
    return KVT_OK;
}

/* Reads a whole checkpoint file: never follows a symlink, never blocks on a FIFO, regular files
 * of bounded size only. *buf malloc'd. */
static kvt_status read_file(int dfd, const char *path, uint8_t **buf, uint64_t *len, char *err, size_t errlen) {
    *buf = NULL;
    int fd = kvt_ssd_open_cache_file_at(dfd, path, O_RDONLY); /* O_NOFOLLOW|O_NONBLOCK, regular files only */
    if (fd < 0) return kvt_errf(err, errlen, errno == ENOENT ? KVT_ERR_NOT_FOUND : KVT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    const uint64_t n = (uint64_t)sb.st_size;
    if (n > file_size_for(CKPT_COMPAT_MAX, KVT_CKPT_MAX_EMITTED)) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: too large for a checkpoint", path);
    }
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        close(fd);
        return KVT_ERR_NOMEM;
    }
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    close(fd);
    if (got != n) {
        free(b);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: short read", path);
    }
    *buf = b;
    *len = n;
    return KVT_OK;
}

void kvt_ckpt_file_name(const uint8_t key[32], char out[40]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[key[i] >> 4];
        out[2 * i + 1] = hx[key[i] & 15];
    }
    memcpy(out + 32, ".kvc", 5);
}

kvt_status kvt_ckpt_file_check(const char *path, kvt_ckpt_rec *info, char *compat_out, size_t compat_len, char *err,
                               size_t errlen) {
    uint8_t *b;
    uint64_t n;
    kvt_status st = read_file(AT_FDCWD, path, &b, &n, err, errlen);
    if (st) return st;
    st = decode(b, n, info, compat_out, compat_len, err, errlen);
    free(b);
    if (st == KVT_OK) {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        char want[40];
        kvt_ckpt_file_name(info->key, want);
        if (strcmp(base, want)) st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "checkpoint: key does not match the file name");
    }
    if (st) {
        free(info->emitted);
        info->emitted = NULL;
    }
    return st;
}

/* ------------------------------------------------------------------ directory and temporaries */
/* Does s->dir still name the held directory? False (errno = ENOTDIR) when it was replaced. */
static bool dir_same(const kvt_ckpt_store *s) {
    struct stat sb;
    if (lstat(s->dir, &sb) != 0) return false;
    if (!S_ISDIR(sb.st_mode) || sb.st_dev != s->dev || sb.st_ino != s->ino) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

/* Temporary names, the orphan rule and the trust rule are the SSD tier's (ssd_int.h): one
 * implementation of each. */
static void reap_tmps(kvt_ckpt_store *s) {
    int fd = fcntl(s->dfd, F_DUPFD_CLOEXEC, 0); /* fdopendir owns the duplicate */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        if (len <= 4 || strcmp(nm + len - 4, ".tmp")) continue;
        struct stat ts;
        if (fstatat(dirfd(d), nm, &ts, AT_SYMLINK_NOFOLLOW) == 0 && kvt_ssd_tmp_is_stale(nm, &ts)) unlinkat(dirfd(d), nm, 0);
    }
    closedir(d);
}

/* Publishes one record: tmp + fsync + rename + directory fsync (I3). inject: fail the write (EIO). */
static bool publish(kvt_ckpt_store *s, const kvt_ckpt_rec *r, bool inject) {
    size_t len;
    uint8_t *b = encode(s->compat, r, &len);
    if (!b) return false;
    char name[40], tmp[128];
    kvt_ckpt_file_name(r->key, name);
    kvt_ssd_tmp_name(tmp, sizeof tmp, name);
    if (!dir_same(s)) { /* moved away or swapped: a restart would not find the record */
        free(b);
        return false;
    }
    int fd = openat(s->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) { /* our own leftover of a failed attempt (never a neighbour's) */
        unlinkat(s->dfd, tmp, 0);
        fd = openat(s->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    }
    bool ok = fd >= 0 && fchmod(fd, 0600) == 0;
    if (ok && inject) {
        errno = EIO;
        ok = false;
    }
    size_t done = 0;
    while (ok && done < len) {
        ssize_t w = write(fd, b + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) ok = false;
        else done += (size_t)w;
    }
    if (ok) ok = fsync(fd) == 0;
    const int saved = errno;
    if (fd >= 0) close(fd);
    errno = saved;
    free(b);
    if (ok) ok = renameat(s->dfd, tmp, s->dfd, name) == 0;
    if (!ok) {
        const int e = errno;
        unlinkat(s->dfd, tmp, 0);
        errno = e;
    }
    if (ok) ok = fsync(s->dfd) == 0;
    return ok;
}

/* 1 removed, 0 there was none, -1 failed. */
static int remove_file(kvt_ckpt_store *s, const uint8_t key[32]) {
    char name[40];
    kvt_ckpt_file_name(key, name);
    if (unlinkat(s->dfd, name, 0) != 0) return errno == ENOENT ? 0 : -1;
    return fsync(s->dfd) == 0 ? 1 : -1;
}

/* ------------------------------------------------------------------ queue */
static uint64_t item_bytes(const ck_item *it) { return 64 + 4ull * it->rec.n_emitted; }
static void item_free(ck_item *it) {
    if (!it) return;
    item_settle(it, KVT_CKPT_FAILED); /* never written (store closing) */
    free(it->rec.emitted);
    free(it);
}

static ck_item *queued_of(kvt_ckpt_store *s, const uint8_t key[32]) {
    for (ck_item *it = s->head; it; it = it->next)
        if (!memcmp(it->rec.key, key, 32)) return it;
    return NULL;
}

static void push(kvt_ckpt_store *s, ck_item *it) {
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    s->queued_bytes += item_bytes(it);
    pthread_cond_signal(&s->cv);
}

static void *ck_writer_main(void *arg) {
    kvt_ckpt_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && (!s->head || s->paused)) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break; /* stop and drained */
        if (s->paused && !s->stop) continue;
        ck_item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->queued_bytes -= item_bytes(it);
        s->inflight = it;
        const bool inject = it->op == CK_WRITE && s->fail_writes > 0;
        if (inject) s->fail_writes--;
        pthread_mutex_unlock(&s->mu);
        const int rm = it->op == CK_REMOVE ? remove_file(s, it->rec.key) : 0;
        const bool ok = it->op == CK_WRITE ? publish(s, &it->rec, inject) : rm >= 0;
        item_settle(it, ok ? KVT_CKPT_PUBLISHED : KVT_CKPT_FAILED);
        pthread_mutex_lock(&s->mu);
        if (!ok) {
            s->failed++;
            if (!s->warned_io) {
                s->warned_io = true;
                KVT_WARN("checkpoints: cannot %s a record in %s: %s (further failures are counted)",
                         it->op == CK_WRITE ? "write" : "remove", s->dir, strerror(errno));
            }
        } else if (it->op == CK_WRITE) {
            s->written++;
        } else if (rm > 0) {
            s->invalidated++;
        }
        s->inflight = NULL;
        item_free(it);
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

kvt_status kvt_ckpt_store_open(const char *cdir, const char *compat, kvt_ckpt_store **out, char *err, size_t errlen) {
    *out = NULL;
    if (!cdir || !compat || !compat[0] || strlen(compat) >= CKPT_COMPAT_MAX)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "checkpoints: directory and compat key required");
    kvt_ckpt_store *s = calloc(1, sizeof *s);
    if (!s) return KVT_ERR_NOMEM;
    snprintf(s->dir, sizeof s->dir, "%s/ckpt", cdir);
    snprintf(s->compat, sizeof s->compat, "%s", compat);
    /* created and opened relative to the compat directory, neither through a symlink */
    int cfd = open(cdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    bool created = cfd >= 0 && mkdirat(cfd, "ckpt", 0700) == 0;
    if (cfd < 0 || (!created && errno != EEXIST)) {
        kvt_errf(err, errlen, KVT_ERR_IO, "checkpoints: cannot create %s: %s", s->dir, strerror(errno));
        if (cfd >= 0) close(cfd);
        free(s);
        return KVT_ERR_IO;
    }
    s->dfd = openat(cfd, "ckpt", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    bool ok = s->dfd >= 0 && fstat(s->dfd, &sb) == 0;
    if (ok && created && (fchmod(s->dfd, 0700) != 0 || fsync(cfd) != 0 || fstat(s->dfd, &sb) != 0)) ok = false;
    if (!ok) kvt_errf(err, errlen, KVT_ERR_IO, "checkpoints: cannot open %s: %s", s->dir, strerror(errno));
    close(cfd);
    if (!ok || !kvt_ssd_stat_trusted(&sb, s->dir, false, err, errlen)) {
        if (s->dfd >= 0) close(s->dfd);
        free(s);
        return KVT_ERR_IO;
    }
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    reap_tmps(s);
    const char *fw = getenv("KVT_CKPT_FAIL_WRITES"); /* fault injection (tests) */
    if (fw && *fw) s->fail_writes = (uint32_t)strtoul(fw, NULL, 10);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (pthread_create(&s->th, NULL, ck_writer_main, s) != 0) {
        kvt_ckpt_store_free(s);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "checkpoints: cannot start the writer thread");
    }
    s->started = true;
    *out = s;
    return KVT_OK;
}

bool kvt_ckpt_store_flush(kvt_ckpt_store *s, uint32_t timeout_ms) {
    if (!s) return true;
    const double t_end = kvt_now_ms() + timeout_ms;
    pthread_mutex_lock(&s->mu);
    while ((s->head || s->inflight) && s->started) {
        double left = t_end - kvt_now_ms();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(KVT_MIN(left, 100.0) * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&s->done_cv, &s->mu, &ts);
    }
    bool ok = !s->head && !s->inflight;
    pthread_mutex_unlock(&s->mu);
    return ok && dir_same(s); /* published where a restart looks */
}

void kvt_ckpt_store_free(kvt_ckpt_store *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->paused = false;
        pthread_mutex_unlock(&s->mu);
        kvt_ckpt_store_flush(s, 10000);
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        /* what is still queued after the bounded wait is given up (the old files stay valid) */
        while (s->head) {
            ck_item *it = s->head;
            s->head = it->next;
            item_free(it);
        }
        s->tail = NULL;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->done_cv);
    close(s->dfd);
    free(s);
}

bool kvt_ckpt_store_save(kvt_ckpt_store *s, const kvt_ckpt_rec *rec, kvt_ckpt_watch **watch) {
    if (watch) *watch = NULL;
    if (!s || rec->n_emitted > KVT_CKPT_MAX_EMITTED) return false;
    int32_t *ids = malloc(4 * (size_t)rec->n_emitted + 4);
    kvt_ckpt_watch *w = watch ? calloc(1, sizeof *w) : NULL;
    if (w) {
        atomic_init(&w->refs, 2); /* the item's and the caller's */
        atomic_init(&w->state, (int)KVT_CKPT_QUEUED);
    }
    if (!ids || (watch && !w)) {
        free(ids);
        free(w);
        pthread_mutex_lock(&s->mu);
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    memcpy(ids, rec->emitted, 4 * (size_t)rec->n_emitted);
    pthread_mutex_lock(&s->mu);
    ck_item *it = queued_of(s, rec->key);
    const uint64_t add = 64 + 4ull * rec->n_emitted;
    const uint64_t sub = it ? item_bytes(it) : 0;
    if (s->stop || s->queued_bytes - sub + add > CKPT_QUEUE_MAX) { /* I5 */
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        free(ids);
        free(w);
        return false;
    }
    if (it) { /* I1: the newer record replaces the queued one in place (same FIFO slot) */
        s->queued_bytes -= sub;
        free(it->rec.emitted);
        item_settle(it, KVT_CKPT_REPLACED);
        it->rec = *rec;
        it->rec.emitted = ids;
        it->op = CK_WRITE;
        it->w = w;
        s->queued_bytes += item_bytes(it);
        pthread_mutex_unlock(&s->mu);
        if (watch) *watch = w;
        return true;
    }
    it = calloc(1, sizeof *it);
    if (!it) {
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        free(ids);
        free(w);
        return false;
    }
    it->op = CK_WRITE;
    it->rec = *rec;
    it->rec.emitted = ids;
    it->w = w;
    push(s, it);
    pthread_mutex_unlock(&s->mu);
    if (watch) *watch = w;
    return true;
}

void kvt_ckpt_store_invalidate(kvt_ckpt_store *s, const uint8_t key[32]) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    ck_item *it = queued_of(s, key);
    if (it) { /* the queued write never happens; the removal takes its slot */
        s->queued_bytes -= item_bytes(it);
        item_settle(it, KVT_CKPT_REPLACED);
        free(it->rec.emitted);
        it->rec.emitted = NULL;
        it->rec.n_emitted = 0;
        it->op = CK_REMOVE;
        s->queued_bytes += item_bytes(it);
    } else if (!s->stop && (it = calloc(1, sizeof *it))) {
        memcpy(it->rec.key, key, 32);
        it->op = CK_REMOVE;
        push(s, it); /* I2: behind an in-flight write of the same key */
    }
    pthread_mutex_unlock(&s->mu);
}

static bool copy_rec(const kvt_ckpt_rec *src, kvt_ckpt_rec *dst) {
    *dst = *src;
    dst->emitted = malloc(4 * (size_t)src->n_emitted + 4);
    if (!dst->emitted) return false;
    memcpy(dst->emitted, src->emitted, 4 * (size_t)src->n_emitted);
    return true;
}

static bool rec_usable(const kvt_ckpt_rec *r, const uint8_t key[32], uint32_t n_prompt, uint32_t n_vocab, uint32_t max_emitted,
                       char *why, size_t whylen) {
    if (memcmp(r->key, key, 32)) return snprintf(why, whylen, "request key mismatch"), false;
    if (r->n_prompt != n_prompt) return snprintf(why, whylen, "prompt length %u, expected %u", r->n_prompt, n_prompt), false;
    if (r->n_emitted == 0 || r->n_emitted >= max_emitted)
        return snprintf(why, whylen, "%u emitted tokens out of range (max %u)", r->n_emitted, max_emitted), false;
    if (r->pending < 0 || (uint32_t)r->pending >= n_vocab) return snprintf(why, whylen, "pending token out of range"), false;
    for (uint32_t i = 0; i < r->n_emitted; i++)
        if (r->emitted[i] < 0 || (uint32_t)r->emitted[i] >= n_vocab)
            return snprintf(why, whylen, "token id %d outside the vocabulary", r->emitted[i]), false;
    return true;
}

bool kvt_ckpt_store_load(kvt_ckpt_store *s, const uint8_t key[32], uint32_t n_prompt, uint32_t n_vocab, uint32_t max_emitted,
                         kvt_ckpt_rec *out) {
    memset(out, 0, sizeof *out);
    if (!s) return false;
    char why[160] = "";
    pthread_mutex_lock(&s->mu); /* I4 */
    ck_item *it = queued_of(s, key);
    if (!it && s->inflight && !memcmp(s->inflight->rec.key, key, 32)) it = s->inflight;
    if (it) {
        bool ok = it->op == CK_WRITE && copy_rec(&it->rec, out);
        pthread_mutex_unlock(&s->mu);
        if (ok && rec_usable(out, key, n_prompt, n_vocab, max_emitted, why, sizeof why)) return true;
        free(out->emitted);
        memset(out, 0, sizeof *out);
        return false;
    }
    pthread_mutex_unlock(&s->mu);
    char name[40], path[PATH_MAX + 48], err[256] = "", compat[CKPT_COMPAT_MAX];
    kvt_ckpt_file_name(key, name);
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    uint8_t *b;
    uint64_t n;
    kvt_status st = read_file(s->dfd, name, &b, &n, err, sizeof err);
    if (st == KVT_ERR_NOT_FOUND) return false;
    if (st == KVT_OK) {
        st = decode(b, n, out, compat, sizeof compat, err, sizeof err);
        free(b);
    }
    bool bad = st != KVT_OK;
    if (!bad && strcmp(compat, s->compat)) {
        bad = true;
        snprintf(err, sizeof err, "compat key mismatch");
    }
    if (!bad && !rec_usable(out, key, n_prompt, n_vocab, max_emitted, why, sizeof why)) {
        bad = true;
        snprintf(err, sizeof err, "%s", why);
    }
    if (!bad) return true;
    free(out->emitted);
    memset(out, 0, sizeof *out);
    if (st == KVT_ERR_NOMEM) return false;
    KVT_WARN("checkpoints: removing %s: %s", path, err);
    pthread_mutex_lock(&s->mu);
    s->corrupt++;
    /* removed only if no newer write of this key raced in meanwhile (it would replace the file) */
    if (!queued_of(s, key) && !(s->inflight && !memcmp(s->inflight->rec.key, key, 32))) unlinkat(s->dfd, name, 0);
    pthread_mutex_unlock(&s->mu);
    return false;
}

void kvt_ckpt_store_stats(kvt_ckpt_store *s, kvt_ckpt_stats *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    out->written = s->written;
    out->invalidated = s->invalidated;
    out->resumed = s->resumed;
    out->failed = s->failed;
    out->dropped = s->dropped;
    out->corrupt = s->corrupt;
    out->retried = s->retried;
    out->resume_reused_tokens = s->resume_reused_tokens;
    for (ck_item *it = s->head; it; it = it->next) out->pending++;
    if (s->inflight) out->pending++;
    pthread_mutex_unlock(&s->mu);
}

void kvt_ckpt_store_note_resumed(kvt_ckpt_store *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->resumed++;
    pthread_mutex_unlock(&s->mu);
}

void kvt_ckpt_store_pause(kvt_ckpt_store *s, bool paused) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->paused = paused;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void kvt_ckpt_store_note_retry(kvt_ckpt_store *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->retried++;
    pthread_mutex_unlock(&s->mu);
}

void kvt_ckpt_store_note_resume_reused(kvt_ckpt_store *s, uint32_t tokens) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->resume_reused_tokens += tokens;
    pthread_mutex_unlock(&s->mu);
}

void kvt_ckpt_store_fail_writes(kvt_ckpt_store *s, uint32_t n) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->fail_writes = n;
    pthread_mutex_unlock(&s->mu);
}
