/* ssd_io.c — the SSD tier's file-mutation layer: real syscalls, fault injection, the write throttle
 * and recording mode with crash-state enumeration. See ssd_io.h. */
#include "ssd_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ trace */
typedef enum { OP_CREATE, OP_WRITE, OP_TRUNC, OP_FSYNC, OP_RENAME, OP_FSYNC_DIR, OP_UNLINK, OP_MKDIR } op_kind;

typedef struct io_op {
    op_kind kind;
    uint32_t file;       /* CREATE, WRITE, TRUNC, FSYNC: the file (inode) id */
    char *path, *path2;  /* CREATE/UNLINK/MKDIR/FSYNC_DIR: path; RENAME: path -> path2 */
    uint64_t off, len;   /* WRITE: range; TRUNC: len = new size */
    uint8_t *data;       /* WRITE: copy of the bytes */
} io_op;

struct kvt_ssd_io_trace {
    pthread_mutex_t mu;
    io_op *ops;
    uint32_t n, cap;
    uint32_t n_files;
    struct { int fd; uint32_t file; } *fds; /* open traced files */
    uint32_t n_fds, cap_fds;
};

struct kvt_ssd_io {
    kvt_ssd_io_trace *rec;
    _Atomic int fault;
    pthread_mutex_t mu; /* fault_rng */
    _Atomic uint32_t fault_rate;
    uint64_t fault_rng;
    _Atomic bool lie;
};

kvt_ssd_io_trace *kvt_ssd_io_trace_create(void) {
    kvt_ssd_io_trace *t = calloc(1, sizeof(*t));
    if (t) pthread_mutex_init(&t->mu, NULL);
    return t;
}

void kvt_ssd_io_trace_free(kvt_ssd_io_trace *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->n; i++) {
        free(t->ops[i].path);
        free(t->ops[i].path2);
        free(t->ops[i].data);
    }
    free(t->ops);
    free(t->fds);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

uint32_t kvt_ssd_io_trace_len(kvt_ssd_io_trace *t) {
    pthread_mutex_lock(&t->mu);
    uint32_t n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Appends an op (takes ownership of its strings and data). A failed allocation aborts the test
 * process's recording only: the trace is test machinery, never used in serving. Lock held. */
static void trace_push(kvt_ssd_io_trace *t, io_op op) {
    if (t->n == t->cap) {
        uint32_t nc = t->cap ? t->cap * 2 : 256;
        io_op *no = realloc(t->ops, nc * sizeof(*no));
        if (!no) {
            free(op.path);
            free(op.path2);
            free(op.data);
            return;
        }
        t->ops = no;
        t->cap = nc;
    }
    t->ops[t->n++] = op;
}

static int32_t trace_file_of(kvt_ssd_io_trace *t, int fd) { /* lock held; -1 if untraced */
    for (uint32_t i = 0; i < t->n_fds; i++)
        if (t->fds[i].fd == fd) return (int32_t)t->fds[i].file;
    return -1;
}

/* ------------------------------------------------------------------ handle */
static kvt_ssd_fault fault_from_env(void) {
    const char *e = getenv("KVT_SSD_FAULT");
    if (!e) return KVT_SSD_FAULT_NONE;
    if (!strcmp(e, "enospc")) return KVT_SSD_FAULT_ENOSPC;
    if (!strcmp(e, "short-write")) return KVT_SSD_FAULT_SHORT_WRITE;
    if (!strcmp(e, "eio-read")) return KVT_SSD_FAULT_EIO_READ;
    if (!strcmp(e, "eio-write")) return KVT_SSD_FAULT_EIO_WRITE;
    if (!strcmp(e, "fsync-dir")) return KVT_SSD_FAULT_FSYNC_DIR;
    if (!strcmp(e, "dir-check")) return KVT_SSD_FAULT_DIR_CHECK;
    return KVT_SSD_FAULT_NONE;
}

kvt_ssd_io *kvt_ssd_io_create(kvt_ssd_io_trace *rec) {
    kvt_ssd_io *io = calloc(1, sizeof(*io));
    if (!io) return NULL;
    io->rec = rec;
    atomic_store(&io->fault, (int)fault_from_env());
    pthread_mutex_init(&io->mu, NULL);
    return io;
}

void kvt_ssd_io_free(kvt_ssd_io *io) {
    if (!io || io == kvt_ssd_io_plain()) return;
    pthread_mutex_destroy(&io->mu);
    free(io);
}

kvt_ssd_io *kvt_ssd_io_plain(void) {
    static kvt_ssd_io plain = {.mu = PTHREAD_MUTEX_INITIALIZER};
    return &plain;
}

void kvt_ssd_io_set_fault(kvt_ssd_io *io, kvt_ssd_fault f) { atomic_store(&io->fault, (int)f); }
void kvt_ssd_io_set_fault_rate(kvt_ssd_io *io, uint64_t seed, uint32_t permille) {
    pthread_mutex_lock(&io->mu);
    io->fault_rng = seed;
    atomic_store(&io->fault_rate, permille > 1000 ? 1000 : permille);
    pthread_mutex_unlock(&io->mu);
}
void kvt_ssd_io_set_lying_fsync(kvt_ssd_io *io, bool lie) { atomic_store(&io->lie, lie); }

bool kvt_ssd_io_read_fault(kvt_ssd_io *io) {
    if (atomic_load(&io->fault) != KVT_SSD_FAULT_EIO_READ) return false;
    errno = EIO;
    return true;
}

static uint64_t fault_next(uint64_t *st) { /* splitmix64, for scheduled faults */
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------------ throttle */
/* KVT_IO_THROTTLE_MBPS=N: every write through this layer is paced so that the process writes at
 * most N*10^6 bytes per second (one budget for the whole process, as one disk would be). */
static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double throttle_rate(void) { /* bytes/s; 0 = off. Read once. */
    static _Atomic int64_t rate = -1;
    int64_t r = atomic_load(&rate);
    if (r < 0) {
        const char *e = getenv("KVT_IO_THROTTLE_MBPS");
        double mb = e ? strtod(e, NULL) : 0;
        r = mb > 0 && mb < 1e7 ? (int64_t)(mb * 1e6) : 0;
        atomic_store(&rate, r);
    }
    return (double)r;
}

static void throttle(uint64_t len) {
    double rate = throttle_rate();
    if (rate <= 0 || !len) return;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t next_free_ns;
    pthread_mutex_lock(&mu);
    uint64_t now = mono_ns(), start = next_free_ns > now ? next_free_ns : now;
    uint64_t done = start + (uint64_t)((double)len * 1e9 / rate);
    next_free_ns = done;
    pthread_mutex_unlock(&mu);
    while ((now = mono_ns()) < done) {
        uint64_t w = done - now;
        struct timespec ts = {.tv_sec = (time_t)(w / 1000000000ull), .tv_nsec = (long)(w % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

/* ------------------------------------------------------------------ operations */
/* The path a trace records for name in dir (dir NULL: name is the whole path). */
static char *trace_path(const char *dir, const char *name) {
    if (!dir) return strdup(name);
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int kvt_ssd_io_create_excl_at(kvt_ssd_io *io, int dfd, const char *dir, const char *name) {
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    if (fchmod(fd, 0600) != 0) { /* regardless of umask */
        int e = errno;
        close(fd);
        unlinkat(dfd, name, 0);
        errno = e;
        return -1;
    }
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        uint32_t id = t->n_files++;
        if (t->n_fds == t->cap_fds) {
            uint32_t nc = t->cap_fds ? t->cap_fds * 2 : 16;
            void *nf = realloc(t->fds, nc * sizeof(*t->fds));
            if (nf) {
                t->fds = nf;
                t->cap_fds = nc;
            }
        }
        if (t->n_fds < t->cap_fds) {
            t->fds[t->n_fds].fd = fd;
            t->fds[t->n_fds++].file = id;
        }
        trace_push(t, (io_op){.kind = OP_CREATE, .file = id, .path = trace_path(dir, name)});
        pthread_mutex_unlock(&t->mu);
    }
    return fd;
}

int kvt_ssd_io_create_excl(kvt_ssd_io *io, const char *path) { return kvt_ssd_io_create_excl_at(io, AT_FDCWD, NULL, path); }

bool kvt_ssd_io_pwrite(kvt_ssd_io *io, int fd, const void *p, uint64_t len, uint64_t off, bool payload) {
    uint32_t rate = atomic_load(&io->fault_rate);
    if (rate) { /* scheduled fault */
        pthread_mutex_lock(&io->mu);
        bool hit = fault_next(&io->fault_rng) % 1000 < rate;
        pthread_mutex_unlock(&io->mu);
        if (hit) {
            errno = EIO;
            return false;
        }
    }
    int f = atomic_load(&io->fault);
    if (f == KVT_SSD_FAULT_ENOSPC) {
        errno = ENOSPC;
        return false;
    }
    if (f == KVT_SSD_FAULT_EIO_WRITE) {
        errno = EIO;
        return false;
    }
    if (f == KVT_SSD_FAULT_SHORT_WRITE && payload) len /= 2; /* torn write, reported as success */
    throttle(len);
    const uint8_t *b = p;
    uint64_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, b + done, len - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return false;
        }
        done += (uint64_t)w;
    }
    kvt_ssd_io_trace *t = io->rec;
    if (t && len) {
        pthread_mutex_lock(&t->mu);
        int32_t id = trace_file_of(t, fd);
        uint8_t *copy = id >= 0 ? malloc(len) : NULL;
        if (copy) {
            memcpy(copy, p, len);
            trace_push(t, (io_op){.kind = OP_WRITE, .file = (uint32_t)id, .off = off, .len = len, .data = copy});
        }
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

bool kvt_ssd_io_truncate(kvt_ssd_io *io, int fd, uint64_t size) {
    if (ftruncate(fd, (off_t)size) != 0) return false;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        int32_t id = trace_file_of(t, fd);
        if (id >= 0) trace_push(t, (io_op){.kind = OP_TRUNC, .file = (uint32_t)id, .len = size});
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

bool kvt_ssd_io_fsync(kvt_ssd_io *io, int fd) {
    if (atomic_load(&io->lie)) return true; /* negative control: claims durability it never had */
    if (fsync(fd) != 0) return false;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        int32_t id = trace_file_of(t, fd);
        if (id >= 0) trace_push(t, (io_op){.kind = OP_FSYNC, .file = (uint32_t)id});
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

bool kvt_ssd_io_close(kvt_ssd_io *io, int fd) {
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        for (uint32_t i = 0; i < t->n_fds; i++)
            if (t->fds[i].fd == fd) {
                t->fds[i] = t->fds[--t->n_fds];
                break;
            }
        pthread_mutex_unlock(&t->mu);
    }
    return close(fd) == 0;
}

bool kvt_ssd_io_rename_at(kvt_ssd_io *io, int dfd, const char *dir, const char *from, const char *to) {
    if (renameat(dfd, from, dfd, to) != 0) return false;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        trace_push(t, (io_op){.kind = OP_RENAME, .path = trace_path(dir, from), .path2 = trace_path(dir, to)});
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

bool kvt_ssd_io_rename(kvt_ssd_io *io, const char *from, const char *to) {
    if (rename(from, to) != 0) return false;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        trace_push(t, (io_op){.kind = OP_RENAME, .path = strdup(from), .path2 = strdup(to)});
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

/* The real directory fsync (of fd when fd >= 0, else of dir opened without following a symlink),
 * recorded as a durability point for the entries of dir. */
static bool dir_sync(kvt_ssd_io *io, int fd, const char *dir) {
    if (atomic_load(&io->lie)) return true;
    bool own = fd < 0;
    if (own) fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    int e = errno;
    if (own) close(fd);
    errno = e;
    kvt_ssd_io_trace *t = io->rec;
    if (ok && t) {
        pthread_mutex_lock(&t->mu);
        trace_push(t, (io_op){.kind = OP_FSYNC_DIR, .path = strdup(dir)});
        pthread_mutex_unlock(&t->mu);
    }
    return ok;
}

bool kvt_ssd_io_fsync_dir(kvt_ssd_io *io, const char *dir) {
    if (atomic_load(&io->fault) == KVT_SSD_FAULT_FSYNC_DIR) {
        errno = EIO;
        return false;
    }
    return dir_sync(io, -1, dir);
}

bool kvt_ssd_io_fsync_dirfd(kvt_ssd_io *io, int dfd, const char *dir) {
    if (atomic_load(&io->fault) == KVT_SSD_FAULT_FSYNC_DIR) {
        errno = EIO;
        return false;
    }
    return dir_sync(io, dfd, dir);
}

bool kvt_ssd_io_unlink_at(kvt_ssd_io *io, int dfd, const char *dir, const char *name) {
    if (unlinkat(dfd, name, 0) != 0) return false;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        trace_push(t, (io_op){.kind = OP_UNLINK, .path = trace_path(dir, name)});
        pthread_mutex_unlock(&t->mu);
    }
    return true;
}

bool kvt_ssd_io_unlink(kvt_ssd_io *io, const char *path) { return kvt_ssd_io_unlink_at(io, AT_FDCWD, NULL, path); }

bool kvt_ssd_io_dir_check_fault(kvt_ssd_io *io) {
    if (atomic_load(&io->fault) != KVT_SSD_FAULT_DIR_CHECK) return false;
    errno = EIO;
    return true;
}

int kvt_ssd_io_mkdir(kvt_ssd_io *io, const char *path) {
    if (mkdir(path, 0700) != 0) return errno == EEXIST ? 1 : -1;
    if (chmod(path, 0700) != 0) return -1;
    kvt_ssd_io_trace *t = io->rec;
    if (t) {
        pthread_mutex_lock(&t->mu);
        trace_push(t, (io_op){.kind = OP_MKDIR, .path = strdup(path)});
        pthread_mutex_unlock(&t->mu);
    }
    return 0;
}

/* ------------------------------------------------------------------ crash states */
/* Parent directory of a path (a new string). */
static char *parent_of(const char *p) {
    const char *sl = strrchr(p, '/');
    if (!sl) return strdup(".");
    if (sl == p) return strdup("/");
    return strndup(p, (size_t)(sl - p));
}

static bool is_dir_op(op_kind k) { return k == OP_CREATE || k == OP_RENAME || k == OP_UNLINK || k == OP_MKDIR; }
static bool is_data_op(op_kind k) { return k == OP_WRITE || k == OP_TRUNC; }

/* Is op i (< k) durable at a crash at k? Data: a later fsync of its file. Names: a later fsync of
 * the directory holding the name (both directories for a rename). Lock held. */
static bool op_durable(kvt_ssd_io_trace *t, uint32_t i, uint32_t k) {
    const io_op *o = &t->ops[i];
    if (is_data_op(o->kind)) {
        for (uint32_t j = i + 1; j < k; j++)
            if (t->ops[j].kind == OP_FSYNC && t->ops[j].file == o->file) return true;
        return false;
    }
    if (!is_dir_op(o->kind)) return true;
    char *d1 = parent_of(o->path), *d2 = o->path2 ? parent_of(o->path2) : NULL;
    bool s1 = false, s2 = d2 == NULL;
    for (uint32_t j = i + 1; j < k && !(s1 && s2); j++) {
        if (t->ops[j].kind != OP_FSYNC_DIR) continue;
        if (!strcmp(t->ops[j].path, d1)) s1 = true;
        if (d2 && !strcmp(t->ops[j].path, d2)) s2 = true;
    }
    free(d1);
    free(d2);
    return s1 && s2;
}

/* The pending (not durable) ops of a crash at k, split into name ops and data ops. Lock held. */
typedef struct pend {
    uint32_t *dir, nd, *dat, nw;
} pend;
static bool pending_of(kvt_ssd_io_trace *t, uint32_t k, pend *p) {
    memset(p, 0, sizeof(*p));
    p->dir = malloc((k + 1) * sizeof(uint32_t));
    p->dat = malloc((k + 1) * sizeof(uint32_t));
    if (!p->dir || !p->dat) {
        free(p->dir);
        free(p->dat);
        return false;
    }
    for (uint32_t i = 0; i < k; i++) {
        if (op_durable(t, i, k)) continue;
        if (is_dir_op(t->ops[i].kind)) p->dir[p->nd++] = i;
        else if (is_data_op(t->ops[i].kind)) p->dat[p->nw++] = i;
    }
    return true;
}

#define SUBSET_MAX 6u /* up to this many pending name ops: every subset; beyond: drops and prefixes */
static uint32_t dir_variants(uint32_t nd) {
    if (nd == 0) return 1;
    if (nd <= SUBSET_MAX) return 1u << nd;
    return 2 + nd + (nd - 1); /* all, none, drop one, ordered prefixes 1..nd-1 */
}
/* Applied flag of pending name op j (0..nd-1) in name variant v. Variant 0 applies all, 1 none. */
static bool dir_applied(uint32_t nd, uint32_t v, uint32_t j) {
    if (nd <= SUBSET_MAX) { /* v as a bit mask of the dropped ops: 0 = none dropped; 1 <-> all dropped */
        uint32_t all = (1u << nd) - 1, mask = v == 1 ? all : v == all ? 1u : v;
        return !(mask >> j & 1u);
    }
    if (v == 0) return true;
    if (v == 1) return false;
    if (v < 2 + nd) return j != v - 2;
    return j < v - (2 + nd) + 1;
}
static uint32_t data_variants(uint32_t nw) { return nw ? 2 + 3 * nw : 1; }
/* How pending data op j is applied in data variant v: 0 dropped, 1 whole, 2 torn (first half),
 * 3 garbage (the range holds other bytes). Variant 0 applies all, 1 none, then per op: drop it
 * alone, tear it alone, garble it alone. */
static int data_mode(uint32_t v, uint32_t j) {
    if (v == 0) return 1;
    if (v == 1) return 0;
    uint32_t op = (v - 2) / 3, m = (v - 2) % 3;
    if (op != j) return 1;
    return m == 0 ? 0 : m == 1 ? 2 : 3;
}

/* States: every name variant with all/no pending data, then every other data variant with all/no
 * pending names. */
static void state_split(uint32_t nd, uint32_t nw, uint32_t s, uint32_t *dv, uint32_t *wv) {
    uint32_t D = dir_variants(nd), W = data_variants(nw), W2 = W < 2 ? W : 2, D2 = D < 2 ? D : 2;
    if (s < D * W2) {
        *dv = s / W2;
        *wv = s % W2;
        return;
    }
    s -= D * W2;
    *wv = 2 + s / D2;
    *dv = s % D2;
}

uint32_t kvt_ssd_io_crash_states(kvt_ssd_io_trace *t, uint32_t k) {
    pthread_mutex_lock(&t->mu);
    if (k > t->n) k = t->n;
    pend p;
    uint32_t n = 1;
    if (pending_of(t, k, &p)) {
        uint32_t D = dir_variants(p.nd), W = data_variants(p.nw);
        n = D * (W < 2 ? W : 2) + (W > 2 ? (W - 2) * (D < 2 ? D : 2) : 0);
        free(p.dir);
        free(p.dat);
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

typedef struct mfile {
    uint8_t *d;
    uint64_t n;
} mfile;
typedef struct mname {
    char *path;
    int64_t file; /* -1: a directory */
} mname;

static bool mfile_write(mfile *f, uint64_t off, const uint8_t *src, uint64_t len, int mode) {
    if (off + len > f->n) {
        uint8_t *nd = realloc(f->d, off + len ? off + len : 1);
        if (!nd) return false;
        memset(nd + f->n, 0, off + len - f->n);
        f->d = nd;
        f->n = off + len;
    }
    if (mode == 1) memcpy(f->d + off, src, len);
    else if (mode == 2) memcpy(f->d + off, src, len / 2); /* the rest keeps what was there */
    else if (mode == 3)
        for (uint64_t i = 0; i < len; i++) f->d[off + i] = (uint8_t)(0xA5 ^ i);
    return true;
}

static mname *name_find(mname *v, uint32_t n, const char *p) {
    for (uint32_t i = 0; i < n; i++)
        if (v[i].path && !strcmp(v[i].path, p)) return &v[i];
    return NULL;
}

static bool write_out(const char *path, const mfile *f) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    bool ok = true;
    for (uint64_t o = 0; ok && o < f->n;) {
        ssize_t w = write(fd, f->d + o, f->n - o);
        if (w <= 0) ok = false;
        else o += (uint64_t)w;
    }
    return close(fd) == 0 && ok;
}

static int cmp_len(const void *a, const void *b) {
    size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
    return la < lb ? -1 : la > lb;
}

bool kvt_ssd_io_crash_materialize(kvt_ssd_io_trace *t, uint32_t k, uint32_t state, const char *src_root,
                                  const char *dst) {
    pthread_mutex_lock(&t->mu);
    if (k > t->n) k = t->n;
    pend p;
    bool ok = pending_of(t, k, &p);
    mfile *files = ok ? calloc(t->n_files + 1, sizeof(*files)) : NULL;
    mname *names = ok ? calloc(k + 1, sizeof(*names)) : NULL;
    uint32_t n_names = 0;
    ok = ok && files && names;
    uint32_t dv = 0, wv = 0;
    if (ok) state_split(p.nd, p.nw, state, &dv, &wv);
    uint32_t di = 0, wi = 0; /* cursors into p.dir / p.dat (both in op order) */
    for (uint32_t i = 0; ok && i < k; i++) {
        const io_op *o = &t->ops[i];
        int mode = 1; /* applied whole */
        if (di < p.nd && p.dir[di] == i) {
            mode = dir_applied(p.nd, dv, di) ? 1 : 0;
            di++;
        } else if (wi < p.nw && p.dat[wi] == i) {
            mode = data_mode(wv, wi);
            wi++;
        }
        if (mode == 0) continue;
        switch (o->kind) {
        case OP_CREATE: {
            mname *m = name_find(names, n_names, o->path);
            if (!m) m = &names[n_names++];
            else free(m->path);
            m->path = strdup(o->path);
            m->file = o->file;
            ok = m->path != NULL;
            break;
        }
        case OP_MKDIR:
            if (!name_find(names, n_names, o->path)) {
                names[n_names].path = strdup(o->path);
                names[n_names++].file = -1;
            }
            break;
        case OP_WRITE: ok = mfile_write(&files[o->file], o->off, o->data, o->len, mode); break;
        case OP_TRUNC: {
            mfile *f = &files[o->file];
            if (o->len > f->n) ok = mfile_write(f, o->len, NULL, 0, 0);
            else f->n = o->len;
            break;
        }
        case OP_RENAME: {
            mname *from = name_find(names, n_names, o->path);
            if (!from) break; /* its creation did not reach the disk */
            mname *to = name_find(names, n_names, o->path2);
            if (to) {
                free(to->path);
                to->path = NULL;
            }
            free(from->path);
            from->path = strdup(o->path2);
            ok = from->path != NULL;
            break;
        }
        case OP_UNLINK: {
            mname *m = name_find(names, n_names, o->path);
            if (m) {
                free(m->path);
                m->path = NULL;
            }
            break;
        }
        default: break;
        }
    }
    /* write the namespace under dst: directories (shortest first), then files whose directory
     * exists in this state */
    size_t rl = strlen(src_root);
    char **dirs = ok ? calloc(n_names + 1, sizeof(char *)) : NULL;
    uint32_t n_dirs = 0;
    ok = ok && dirs;
    for (uint32_t i = 0; ok && i < n_names; i++)
        if (names[i].path && names[i].file < 0 && !strncmp(names[i].path, src_root, rl) && names[i].path[rl] == '/')
            dirs[n_dirs++] = names[i].path;
    if (ok) qsort(dirs, n_dirs, sizeof(char *), cmp_len);
    char out[PATH_MAX];
    for (uint32_t i = 0; ok && i < n_dirs; i++) {
        char *par = parent_of(dirs[i]);
        bool reachable = par && (!strcmp(par, src_root) || name_find(names, n_names, par));
        free(par);
        if (!reachable) continue;
        snprintf(out, sizeof out, "%s%s", dst, dirs[i] + rl);
        if (mkdir(out, 0700) != 0 && errno != EEXIST) ok = false;
    }
    for (uint32_t i = 0; ok && i < n_names; i++) {
        if (!names[i].path || names[i].file < 0 || strncmp(names[i].path, src_root, rl) || names[i].path[rl] != '/')
            continue;
        char *par = parent_of(names[i].path);
        bool reachable = false;
        if (par) {
            snprintf(out, sizeof out, "%s%s", dst, par + rl);
            struct stat sb;
            reachable = stat(out, &sb) == 0 && S_ISDIR(sb.st_mode);
        }
        free(par);
        if (!reachable) continue;
        snprintf(out, sizeof out, "%s%s", dst, names[i].path + rl);
        ok = write_out(out, &files[names[i].file]);
    }
    free(dirs);
    if (files)
        for (uint32_t i = 0; i < t->n_files; i++) free(files[i].d);
    if (names)
        for (uint32_t i = 0; i < n_names; i++) free(names[i].path);
    free(files);
    free(names);
    if (p.dir || p.dat) {
        free(p.dir);
        free(p.dat);
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}
