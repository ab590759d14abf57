/* ssd_int.h — private to src/cache/ssd_*.c (and white-box tests): the shared state of the SSD tier
 * (struct kvt_ssd), its index entries and records, the on-disk header types, and the functions the
 * ssd_*.c files share. The API is ssd_cache.h; the byte format is docs/cache-format.md.
 *
 * Files (one concern each):
 *   ssd_format.c    file format: names, header encode/decode/validate, compact tails, record images
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
 * Locking: one mutex (kvt_ssd.mu) guards every mutable field of kvt_ssd (fault is atomic); "Lock
 * held" on a function means the caller holds it. File I/O of the writer and of restore runs
 * without it. */
#ifndef KVT_SSD_INT_H
#define KVT_SSD_INT_H

#include "ssd_cache.h"

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

#define SSD_MAGIC "KVTIERKV"
#define SSD_PAGE 4096u
#define SSD_FIXED_HDR 112u
#define SSD_LAYER_REC 40u
#define SSD_SECTION_REC 32u
#define SSD_MAX_HDR (4u << 20)
#define SSD_MAX_TOKEN_IDS (1u << 20)
#define SSD_GROUP_NONE 0xFFFFFFFFu
#define SSD_DEFAULT_QUEUE (256ull << 20)

/* ------------------------------------------------------------------ little-endian helpers */
static inline void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
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

/* A record: one block/tail/snapshot owed to disk (see the state machine at the top of the writer
 * section). It holds a reference to its object until it reaches a final state. */
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
    struct ssd_item *hnext; /* record table chain (by object) */
} ssd_item;
#define SSD_REC_BUCKETS 4096u

struct kvt_ssd {
    char *root_dir, *cdir, *compat;
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
    uint64_t next_seq_no;
    uint64_t published;           /* records that reached a published file (cumulative) */
    int last_errno;               /* errno of the last failed write, for flush reasons */

    /* stats */
    uint64_t restores, spills, demotions, dropped, failed, evictions, corrupt_removed, superseded;
    uint64_t shed;                /* records released under memory pressure (not written) */
    uint64_t skipped_nonregular;  /* scan: names of ours that are not regular files */
    uint64_t lost_entries, dir_recreated; /* the directory was deleted under us */
    uint64_t verified;            /* files whose payload the startup scan verified (--ssd-cache-verify) */
    bool warned_nonregular;
    double restore_ms_last;
    bool warned_write;

    _Atomic int fault;
    uint32_t fault_rate;          /* scheduled faults: per-mille of write attempts that fail */
    uint64_t fault_rng;
    uint32_t flush_waiters;       /* flush calls currently waiting (lock held) */
    uint64_t flush_target;        /* newest record number a waiting flush covers */
    uint64_t flush_start_ns;      /* when the newest waiting flush started (retry window) */
    uint64_t lost_nomem;          /* records that could not even be allocated since the last flush */
};
/* ------------------------------------------------------------------ header encode / decode */
typedef struct hdr_layer {
    uint32_t layer, kind, window, n_kv_heads, head_dim_k, head_dim_v, state_bytes;
    kvt_codec codec;
} hdr_layer;

typedef struct hdr_section {
    uint64_t offset, length, hash;
} hdr_section;
typedef struct hdr_in {
    uint32_t kind, group, block_index, n_tokens, block_tokens;
    uint64_t parent, chain, root;
    const char *compat;
    const int32_t *ids;
    uint32_t n_ids;
    const hdr_layer *layers;
    uint32_t n_layers;
    const hdr_section *sections;
    uint32_t n_sections;
    uint64_t data_offset;
} hdr_in;

/* Decoded header; pointers reference the raw buffer. */
typedef struct hdr_out {
    kvt_ssd_file_info info;
    const uint8_t *ids_raw;
    const uint8_t *layers_raw;
    const uint8_t *sections_raw;
} hdr_out;
/* One record (file image) being encoded: header fields, payload pointers and its byte sizes. The
 * SSD writer writes it as a file; kvt_ssd_record_encode (shared tier) packs it into one buffer. */
typedef struct ssd_record {
    hdr_in h;
    hdr_layer layers[KVT_MAX_LAYERS];
    hdr_section secs[KVT_MAX_LAYERS];
    const uint8_t *payload[KVT_MAX_LAYERS];
    uint8_t *packed; /* compact tail payload (owned), or NULL */
    uint64_t hsize, fsize;
} ssd_record;
typedef struct plan_idx {
    uint64_t chain, parent;
    uint32_t kind, n_tokens;
} plan_idx;

typedef struct plan {
    uint32_t p;          /* usable length (0 = miss) */
    uint32_t n_idx;      /* block indices to restore */
    plan_idx *idx;       /* n_idx */
    bool *need;          /* n_idx * n_groups */
    bool snap;           /* restore a snapshot at p */
    uint64_t snap_chain;
    int32_t *child_tokens; /* tokens of the file at index K when it is the last index (copy) */
} plan;

/* ---- shared functions (defined in the file named above each group) ---- */
/* ssd_format.c */
void entry_name(char *buf, size_t n, uint64_t chain, uint32_t group, uint32_t kind);
bool parse_name(const char *name, uint64_t *chain, uint32_t *group, uint32_t *kind);
void header_encode(const hdr_in *h, uint8_t *buf, uint64_t hsize);
hdr_section hdr_section_at(const hdr_out *h, uint32_t i);
int32_t hdr_id_at(const hdr_out *h, uint32_t i);
int64_t read_upto(int fd, uint8_t *dst, uint64_t len, uint64_t off);
kvt_status header_read_any(int fd, bool direct, uint8_t **bufp, hdr_out *h, int *errno_out, char *err, size_t errlen);
kvt_status header_read_fd(int fd, uint8_t **bufp, hdr_out *h, char *err, size_t errlen);
kvt_status read_full(int fd, uint8_t *dst, uint64_t len, uint64_t off);
bool tail_unpack_inplace(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, uint8_t *block, uint64_t block_bytes);
kvt_status header_matches(const kvt_ssd *s, const hdr_out *h, uint64_t chain, uint32_t group, uint32_t kind, char *err, size_t errlen);
kvt_status record_prepare(const kvt_ssd *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, ssd_record *r);
/* ssd_index.c */
uint64_t link_hash(uint64_t link);
ssd_entry *idx_find(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind);
bool idx_add(kvt_ssd *s, ssd_entry *e);
void idx_remove(kvt_ssd *s, ssd_entry *e);
int open_cache_file(const char *path, int flags);
bool dir_trusted(const char *path, bool follow, char *err, size_t errlen);
void drop_entry(kvt_ssd *s, ssd_entry *e);
void enforce_cap(kvt_ssd *s);
void supersede(kvt_ssd *s, const ssd_entry *e);
void scan_dir(kvt_ssd *s);
/* ssd_writer.c */
kvt_ssd_fault fault_from_env(void);
void tmp_name(char *buf, size_t n, const char *path);
bool tmp_is_stale(const char *name, const struct stat *sb);
void item_release(ssd_item *it);
void *writer_main(void *arg);
void write_key_file(const char *cdir, const char *compat);
int mkdir_p(const char *path);
bool ssd_records_check(kvt_ssd *s); /* invariant (8) of ssd_writer.c; lock held (tests call it too) */

#endif
