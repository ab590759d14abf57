/* ssd_int.h — private to src/cache/ssd_*.c (and white-box tests): the shared state of the SSD tier
 * (struct kvt_ssd), its index entries and records, the on-disk header types, and the functions the
 * ssd_*.c files share. The API is ssd_cache.h; the byte format is docs/cache-format.md.
 *
 * Files (one concern each):
 *   ssd_format.c    file names, header reads from files, file info; the image codec is record.c
 *   ssd_identity.c  model identity (SHA-256 memo) and the compatibility key
 *   ssd_index.c     the in-memory index, the untrusted directory, eviction and supersession,
 *                   stats and the startup scan
 *   ssd_writer.c    the writer: records (the durability state machine, at its top), publishing
 *                   files, flush, shed
 *   ssd_restore.c   lookup (restore planning, index only) and streamed, checksummed restore
 *   ssd_cache.c     lifecycle: open, free, accessors
 *
 * Structure
 * - Index: one ssd_entry per file, in an array (iteration, eviction) plus two chained hash tables:
 *   by key (chain, group, kind) and by link (parent chain for blocks/tails, own chain for
 *   snapshots) so children and candidates at a chain position are found without scanning.
 * - Writer: one thread pops records FIFO and publishes each file with tmp + fsync + rename + dir
 *   fsync; only then is it inserted into the index, and then the tails it supersedes (shorter
 *   prefixes at the same position) are removed. It runs at idle priority.
 * - Restore: plan under the lock (index only), then read files without the lock; any bad file is
 *   removed from disk and index and the plan is recomputed (shorter prefix or miss).
 *
 * Locking: one mutex (kvt_ssd.mu) guards every mutable field of kvt_ssd; "Lock
 * held" on a function means the caller holds it. File I/O of the writer and of restore runs
 * without it. */
#ifndef KVT_SSD_INT_H
#define KVT_SSD_INT_H

#include "ssd_cache.h"
#include "ssd_io.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* the record format's constants (record.h) under the SSD tier's names */
#define SSD_MAGIC KVT_RECORD_MAGIC
#define SSD_PAGE KVT_RECORD_PAGE
#define SSD_FIXED_HDR KVT_RECORD_FIXED_HDR
#define SSD_MAX_HDR KVT_RECORD_MAX_HDR
#define SSD_GROUP_NONE KVT_RECORD_GROUP_NONE
#define SSD_DEFAULT_QUEUE (256ull << 20)

static inline uint64_t now_real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct ssd_entry {
    uint64_t chain, link;      /* link: parent (block/tail) or own chain (snapshot) */
    uint32_t kind, group, index, n_tokens;
    int32_t *tokens;           /* block/tail: n_tokens ids; snapshot: NULL */
    uint64_t bytes;            /* file size */
    uint64_t last_use;         /* CLOCK_REALTIME ns (persisted as the file mtime) */
    uint32_t pos;              /* position in ssd->ents */
    struct ssd_entry *next_key, *next_link;
    uint64_t contig_gen;       /* memo for longest_durable_prefix */
    bool contig_ok;
} ssd_entry;

/* A record: one block/tail/snapshot owed to disk (see the state machine at the top of
 * ssd_writer.c). It holds a reference to its object until it reaches a final state, or until memory
 * pressure stages it: its file image is then copied to the heap (image) and the object released. */
typedef enum { REC_QUEUED = 0, REC_INFLIGHT = 1, REC_DIRTY = 2 } rec_state;
typedef enum { WHY_NONE = 0, WHY_DROPPED = 1, WHY_FAILED = 2 } rec_why;

typedef struct ssd_item {
    struct ssd_item *next;
    kvt_block *b;
    kvt_snapshot *s;
    uint64_t root;
    uint64_t bytes;
    uint64_t t_enq_ns;     /* enqueue time (monotonic), for the busy deferral bound */
    uint64_t seq_no;       /* creation order: a flush covers the records numbered <= its target */
    rec_state state;
    rec_why why;           /* DIRTY: dropped (never attempted since) or failed (last attempt) */
    uint32_t attempts;     /* failed write attempts */
    uint64_t retry_at_ns;  /* DIRTY: not retried before this (monotonic), back-off */
    uint64_t fail_ns;      /* monotonic time of the last failed attempt */
    struct ssd_item *hnext; /* record table chain (by object; a staged record is in no chain) */
    /* STAGED (kvt_ssd_shed): b and s are NULL; image holds the exact bytes of the file (malloc'd,
     * owned, freed with the record; bytes == image_len) and chain/group/kind name that file. */
    uint8_t *image;
    uint64_t image_len;
    uint64_t chain;
    uint32_t group, kind;
} ssd_item;
#define SSD_REC_BUCKETS 4096u

struct kvt_ssd {
    char *root_dir, *cdir, *compat;
    /* The compat directory, held open from startup: every file operation is relative to dfd
     * (openat/renameat/unlinkat, never following a symlink), so a path swapped for a symlink or
     * another directory cannot redirect a write. dir_dev/dir_ino identify it: before every publish
     * (and at flush) the writer checks that cdir still names it. dfd changes only when the writer
     * recreates a deleted directory, under dir_mu and mu; readers outside the writer use it under
     * dir_mu (ssd_openat, ssd_unlink). */
    int dfd;
    dev_t dir_dev;
    ino_t dir_ino;
    pthread_mutex_t dir_mu;
    bool dir_replaced;            /* the last publish attempt found cdir replaced (lock held) */
    bool dir_check_failed;        /* ... or could not check it */
    uint64_t compat_hash;
    const kvt_kv_layout *layout;
    kvt_block_pool *pool;
    kvt_ssd_opts o;
    uint32_t bt, n_groups;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t writer;
    bool writer_started, stop, paused;
    bool busy; /* the engine is decoding: defer writes (bounded), see writer_should_defer */
    kvt_ssd_progress_fn progress; /* restore progress (kvt_ssd_set_progress), restore thread only */
    void *progress_ctx;

    /* index */
    ssd_entry **ents;
    uint32_t n_ents, cap_ents;
    ssd_entry **tab_key, **tab_link;
    uint32_t n_buckets;
    uint64_t bytes;
    uint64_t gen;                 /* bumps on every index change */
    uint64_t longest_gen, longest; /* memo */

    /* records (see the writer section) */
    ssd_item *q_head, *q_tail;    /* QUEUED, FIFO */
    ssd_item *inflight;           /* INFLIGHT (at most one: one writer) */
    ssd_item *d_head;             /* DIRTY (dropped or failed), retried with back-off */
    ssd_item *rec_tab[SSD_REC_BUCKETS]; /* every live record by its object: one record per object */
    uint64_t q_bytes, q_count;    /* QUEUED + INFLIGHT */
    uint64_t d_count, d_bytes;    /* DIRTY */
    uint64_t g_count, g_bytes;    /* STAGED (on any of the lists above): heap images, <= the queue cap */
    uint64_t next_seq_no;
    uint64_t published;           /* records that reached a published file (cumulative) */
    int last_errno;               /* errno of the last failed write, for flush reasons */

    /* stats */
    uint64_t restores, spills, demotions, dropped, failed, evictions, corrupt_removed, superseded;
    uint64_t read_bytes;          /* payload bytes restores read from disk (cumulative) */
    uint64_t shed;                /* records dropped unwritten under memory pressure (failing disk, no memory) */
    uint64_t staged;              /* records staged under memory pressure (image to the heap, cumulative) */
    uint64_t lost_shed;           /* records shed since the last flush: that flush reports them */
    uint32_t stage_nomem;         /* tests (white-box): the next N image allocations of staging fail */
    uint64_t skipped_nonregular;  /* scan: names of ours that are not regular files */
    uint64_t lost_entries, dir_recreated; /* the directory was deleted under us */
    uint64_t verified;            /* files whose payload the startup scan verified (--ssd-cache-verify) */
    bool warned_nonregular;
    double restore_ms_last;
    bool warned_write;

    kvt_ssd_io *io;               /* every file mutation and the injected faults (ssd_io.h) */
    bool own_io;                  /* io was created by kvt_ssd_open (else the caller's, opts.io) */
    uint32_t flush_waiters;       /* flush calls currently waiting (lock held) */
    uint64_t flush_target;        /* newest record number a waiting flush covers */
    uint64_t flush_start_ns;      /* when the newest waiting flush started (retry window) */
    uint64_t lost_nomem;          /* records that could not even be allocated since the last flush */
};
/* ------------------------------------------------------------------ record images (record.h) */
typedef kvt_record_layer hdr_layer;
typedef kvt_record_section hdr_section;
typedef kvt_record_hdr_in hdr_in;
typedef kvt_record_hdr hdr_out;
typedef kvt_record_image ssd_record;
typedef struct plan_idx {
    uint64_t chain, parent;
    uint32_t kind, n_tokens;
} plan_idx;

/* A restore plan (ssd_restore.c: build_plan, over the shared planner of plan.h); the opaque
 * kvt_ssd_plan of ssd_cache.h. */
struct kvt_ssd_plan {
    uint32_t p;          /* usable length (0 = miss) */
    uint32_t base;       /* block indices [0, base) come from the caller (a mixed RAM+SSD plan) */
    uint32_t n_idx;      /* block indices of the restored sequence: ceil(p / bt) */
    plan_idx *idx;       /* n_idx (entries below base unused) */
    bool *need;          /* n_idx * n_groups: files to read */
    bool snap;           /* restore a snapshot at p */
    uint64_t snap_chain;
    int32_t *child_tokens; /* tokens of the file that supplies the last index (copy) */
};

/* ---- shared functions (defined in the file named above each group) ---- */
/* ssd_format.c */
void kvt_ssd_entry_name(char *buf, size_t n, uint64_t chain, uint32_t group, uint32_t kind);
bool kvt_ssd_parse_name(const char *name, uint64_t *chain, uint32_t *group, uint32_t *kind);
int64_t kvt_ssd_read_upto(int fd, uint8_t *dst, uint64_t len, uint64_t off);
kvt_status kvt_ssd_header_read_any(int fd, bool direct, uint8_t **bufp, hdr_out *h, int *errno_out, char *err, size_t errlen);
kvt_status kvt_ssd_header_read_fd(int fd, uint8_t **bufp, hdr_out *h, char *err, size_t errlen);
kvt_status kvt_ssd_read_full(int fd, uint8_t *dst, uint64_t len, uint64_t off);
kvt_status kvt_ssd_header_matches(const kvt_ssd *s, const hdr_out *h, uint64_t chain, uint32_t group, uint32_t kind, char *err, size_t errlen);
kvt_status kvt_ssd_record_prepare(const kvt_ssd *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, ssd_record *r);
/* ssd_index.c */
uint64_t kvt_ssd_link_hash(uint64_t link);
ssd_entry *kvt_ssd_idx_find(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind);
bool kvt_ssd_idx_add(kvt_ssd *s, ssd_entry *e);
void kvt_ssd_idx_remove(kvt_ssd *s, ssd_entry *e);
int kvt_ssd_open_cache_file(const char *path, int flags);
int kvt_ssd_open_cache_file_at(int dfd, const char *name, int flags); /* name relative to dfd, same rules */
bool kvt_ssd_dir_trusted(const char *path, bool follow, char *err, size_t errlen);
bool kvt_ssd_stat_trusted(const struct stat *sb, const char *path, bool follow, char *err, size_t errlen);
/* Opens path as the held directory: O_DIRECTORY|O_NOFOLLOW (never through a symlink), then the
 * trust rule on the open fd (sb receives its stat). -1 with err filled. */
int kvt_ssd_dir_open_held(const char *path, struct stat *sb, char *err, size_t errlen);
/* Does s->cdir still name the held directory (same dev/ino, not a symlink)? Without any lock. */
typedef enum { DIR_SAME = 0, DIR_GONE = 1, DIR_REPLACED = 2, DIR_CHECK_FAILED = 3 } dir_state;
dir_state kvt_ssd_dir_check(const kvt_ssd *s);
/* openat / unlinkat relative to the held directory (takes dir_mu; any thread, any lock). */
int kvt_ssd_openat(kvt_ssd *s, const char *name, int flags);
void kvt_ssd_unlink(kvt_ssd *s, const char *name);
void kvt_ssd_drop_entry(kvt_ssd *s, ssd_entry *e);
void kvt_ssd_enforce_cap(kvt_ssd *s);
void kvt_ssd_supersede(kvt_ssd *s, const ssd_entry *e);
/* Groups holding a file of (chain, kind) with this parent. Lock held. */
uint32_t kvt_ssd_entry_groups(kvt_ssd *s, uint64_t chain, uint32_t kind, uint64_t parent);
void kvt_ssd_scan_dir(kvt_ssd *s);
/* ssd_writer.c */
void kvt_ssd_tmp_name(char *buf, size_t n, const char *path);
bool kvt_ssd_tmp_is_stale(const char *name, const struct stat *sb);
void kvt_ssd_item_release(ssd_item *it);
void *kvt_ssd_writer_main(void *arg);
void kvt_ssd_write_key_file(kvt_ssd_io *io, int dfd, const char *cdir, const char *compat);
int kvt_ssd_mkdir_p(kvt_ssd_io *io, const char *path);
bool kvt_ssd_records_check(kvt_ssd *s); /* invariant (8) of ssd_writer.c; lock held (tests call it too) */

#endif
