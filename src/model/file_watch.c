/* file_watch.c — see file_watch.h (the argument, the state machine and its invariants). */
#include "file_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { WATCH_CLEAN = 0, WATCH_CHANGED = 1 };

struct kvt_file_watch {
    int fd;
    char *path;
    struct stat st0;      /* the identity at open (invariant 1) */
    int state;            /* WATCH_CLEAN / WATCH_CHANGED (atomic; release after `what` is written) */
    pthread_mutex_t mu;   /* the one CLEAN -> CHANGED transition */
    char what[256];       /* written once, before state becomes CHANGED (invariant 2) */
};

static bool ts_eq(struct timespec a, struct timespec b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }
static bool ts_lt(struct timespec a, struct timespec b) {
    return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* Waits until a write made from now on gets a ctime different from the one recorded: the kernel
 * stamps with the coarse clock (truncated to the filesystem's granularity) and skips the update
 * when the stamp equals the stored one. A ctime with zero nanoseconds may come from a filesystem
 * with 1 s granularity: then the clock must reach the next second. Bounded (a ctime in the future,
 * e.g. after the clock was stepped back, is not waited for beyond ~1.1 s). */
static void settle(const struct stat *st) {
    struct timespec lim = st->st_ctim;
    if (lim.tv_nsec == 0) lim.tv_nsec = 999999999;
    for (int i = 0; i < 110; i++) {
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME_COARSE, &now) != 0) return;
        if (ts_lt(lim, now)) return;
        struct timespec d = {0, 10 * 1000 * 1000};
        nanosleep(&d, NULL);
    }
}

kvt_status kvt_file_watch_open(const char *path, kvt_file_watch **out, char *err, size_t errlen) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    kvt_file_watch *w = calloc(1, sizeof *w);
    char *p = strdup(path);
    if (!w || !p) {
        free(w);
        free(p);
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    w->fd = fd;
    w->path = p;
    pthread_mutex_init(&w->mu, NULL);
    kvt_status st = KVT_OK;
    if (fstat(fd, &w->st0) != 0)
        st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(w->st0.st_mode))
        st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: not a regular file", path);
    if (st != KVT_OK) {
        kvt_file_watch_free(w);
        return st;
    }
    settle(&w->st0);
    *out = w;
    return KVT_OK;
}

void kvt_file_watch_free(kvt_file_watch *w) {
    if (!w) return;
    close(w->fd);
    pthread_mutex_destroy(&w->mu);
    free(w->path);
    free(w);
}

int kvt_file_watch_fd(const kvt_file_watch *w) { return w->fd; }

/* CLEAN -> CHANGED with a description (invariant 2): only the first caller writes and logs. */
static void latch(kvt_file_watch *w, const char *what) {
    pthread_mutex_lock(&w->mu);
    if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == WATCH_CLEAN) {
        snprintf(w->what, sizeof w->what, "%s", what);
        __atomic_store_n(&w->state, WATCH_CHANGED, __ATOMIC_RELEASE);
        KVT_ERROR("the model file %s changed while it was in use (%s): nothing computed from now on is "
                  "cached or served; restart kvtier to load the file as it is now",
                  w->path, what);
    }
    pthread_mutex_unlock(&w->mu);
}

/* What differs between the identity at open and now ("" if nothing does). */
static void describe(const struct stat *a, const struct stat *b, char *out, size_t len) {
    size_t n = 0;
    out[0] = 0;
#define ADD(...)                                                                                                       \
    do {                                                                                                               \
        if (n < len) {                                                                                                 \
            int k = snprintf(out + n, len - n, "%s", n ? ", " : "");                                                  \
            n += k > 0 ? (size_t)k : 0;                                                                                \
            if (n < len) {                                                                                             \
                k = snprintf(out + n, len - n, __VA_ARGS__);                                                           \
                n += k > 0 ? (size_t)k : 0;                                                                            \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)
    if (a->st_dev != b->st_dev || a->st_ino != b->st_ino) ADD("another file (inode %llu -> %llu)",
                                                              (unsigned long long)a->st_ino, (unsigned long long)b->st_ino);
    if (a->st_size != b->st_size) ADD("size %lld -> %lld", (long long)a->st_size, (long long)b->st_size);
    if (b->st_nlink == 0 && a->st_nlink != 0) ADD("deleted or replaced by a rename");
    else if (a->st_nlink != b->st_nlink) ADD("link count %llu -> %llu", (unsigned long long)a->st_nlink,
                                             (unsigned long long)b->st_nlink);
    if (!ts_eq(a->st_mtim, b->st_mtim)) ADD("contents modified (mtime changed)");
    else if (!ts_eq(a->st_ctim, b->st_ctim)) ADD("ctime changed: attributes changed, or written with the mtime put back");
#undef ADD
}

bool kvt_file_watch_ok(kvt_file_watch *w) {
    if (!w) return true;
    if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != WATCH_CLEAN) return false;
    struct stat now;
    char what[200];
    if (fstat(w->fd, &now) != 0) {
        snprintf(what, sizeof what, "cannot stat it: %s", strerror(errno));
        latch(w, what);
        return false;
    }
    describe(&w->st0, &now, what, sizeof what);
    if (!what[0]) return true;
    latch(w, what);
    return false;
}

bool kvt_file_watch_path_ok(kvt_file_watch *w) {
    if (!w) return true;
    if (!kvt_file_watch_ok(w)) return false;
    struct stat now;
    char what[200];
    if (stat(w->path, &now) != 0) {
        snprintf(what, sizeof what, "the path no longer opens: %s", strerror(errno));
        latch(w, what);
        return false;
    }
    if (now.st_dev != w->st0.st_dev || now.st_ino != w->st0.st_ino) {
        snprintf(what, sizeof what, "the path names another file now (inode %llu -> %llu)",
                 (unsigned long long)w->st0.st_ino, (unsigned long long)now.st_ino);
        latch(w, what);
        return false;
    }
    return kvt_file_watch_ok(w);
}

bool kvt_file_watch_changed(kvt_file_watch *w, char *what, size_t len) {
    if (!w || __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == WATCH_CLEAN) return false;
    if (what && len) snprintf(what, len, "%s", w->what);
    return true;
}
