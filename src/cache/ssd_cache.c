/* ssd_cache.c — see ssd_cache.h and docs/cache-format.md.
 *
 * Structure
 * ---------
 * - Index: one ssd_entry per file, in an array (iteration, eviction) plus two chained hash tables:
 *   by key (chain, group, kind) and by link (parent chain for blocks/tails, own chain for
 *   snapshots) so children and candidates at a chain position are found without scanning.
 * - Writer: one thread pops items (retained blocks/snapshots) FIFO and publishes each file with
 *   tmp + fsync + rename + dir fsync; only then is it inserted into the index, and then the tails
 *   it supersedes (shorter prefixes at the same position) are removed. It runs at idle priority.
 * - Restore: plan under the lock (index only), then read files without the lock; any bad file is
 *   removed from disk and index and the plan is recomputed (shorter prefix or miss).
 */
#include "ssd_cache.h"

#include "plan.h"

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
static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static uint64_t now_real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ fault injection */
static uint64_t fault_next(uint64_t *st) { /* splitmix64, for scheduled faults */
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static kvt_ssd_fault fault_from_env(void) {
    const char *e = getenv("KVT_SSD_FAULT");
    if (!e) return KVT_SSD_FAULT_NONE;
    if (!strcmp(e, "enospc")) return KVT_SSD_FAULT_ENOSPC;
    if (!strcmp(e, "short-write")) return KVT_SSD_FAULT_SHORT_WRITE;
    if (!strcmp(e, "eio-read")) return KVT_SSD_FAULT_EIO_READ;
    if (!strcmp(e, "eio-write")) return KVT_SSD_FAULT_EIO_WRITE;
    if (!strcmp(e, "fsync-dir")) return KVT_SSD_FAULT_FSYNC_DIR;
    return KVT_SSD_FAULT_NONE;
}

/* ------------------------------------------------------------------ index */
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
    uint64_t read_bytes;          /* payload bytes restores read from disk (cumulative) */
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

static int mkdir_p(const char *path);
static void write_key_file(const char *cdir, const char *compat);
static void tmp_name(char *buf, size_t n, const char *path);
static int open_cache_file(const char *path, int flags);

static uint64_t key_hash(uint64_t chain, uint32_t group, uint32_t kind) {
    uint64_t h = chain ^ ((uint64_t)group * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)kind << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}
static uint64_t link_hash(uint64_t link) { return key_hash(link, 0x5bd1e995u, 7); }

static ssd_entry *idx_find(kvt_ssd *s, uint64_t chain, uint32_t group, uint32_t kind) {
    if (!s->n_buckets) return NULL;
    for (ssd_entry *e = s->tab_key[key_hash(chain, group, kind) % s->n_buckets]; e; e = e->next_key)
        if (e->chain == chain && e->group == group && e->kind == kind) return e;
    return NULL;
}

/* Groups holding a file of (chain, kind) with this parent. Lock held. */
static uint32_t entry_groups(kvt_ssd *s, uint64_t chain, uint32_t kind, uint64_t parent) {
    uint32_t m = 0;
    for (uint32_t g = 0; g < s->n_groups; g++) {
        ssd_entry *e = idx_find(s, chain, g, kind);
        if (e && e->link == parent) m |= 1u << g;
    }
    return m;
}

static void tab_insert(kvt_ssd *s, ssd_entry *e) {
    uint64_t k = key_hash(e->chain, e->group, e->kind) % s->n_buckets;
    e->next_key = s->tab_key[k];
    s->tab_key[k] = e;
    uint64_t l = link_hash(e->link) % s->n_buckets;
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
static bool idx_add(kvt_ssd *s, ssd_entry *e) {
    if (!idx_grow(s)) return false;
    e->pos = s->n_ents;
    s->ents[s->n_ents++] = e;
    tab_insert(s, e);
    s->bytes += e->bytes;
    s->gen++;
    return true;
}

static void idx_remove(kvt_ssd *s, ssd_entry *e) {
    ssd_entry **pp = &s->tab_key[key_hash(e->chain, e->group, e->kind) % s->n_buckets];
    while (*pp && *pp != e) pp = &(*pp)->next_key;
    if (*pp) *pp = e->next_key;
    pp = &s->tab_link[link_hash(e->link) % s->n_buckets];
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
    for (ssd_entry *f = s->tab_link[link_hash(e->chain) % s->n_buckets]; f; f = f->next_link)
        if (f != e && f->link == e->chain) return false;
    return true;
}

/* ------------------------------------------------------------------ names */
static void entry_name(char *buf, size_t n, uint64_t chain, uint32_t group, uint32_t kind) {
    if (kind == KVT_SSD_KIND_SNAPSHOT)
        snprintf(buf, n, "%016llx.kvs", (unsigned long long)chain);
    else
        snprintf(buf, n, "%016llx-g%u.%s", (unsigned long long)chain, group,
                 kind == KVT_SSD_KIND_BLOCK ? "kvb" : "kvt");
}

/* Parses a file name into (chain, group, kind); false if it is not one of ours. */
static bool parse_name(const char *name, uint64_t *chain, uint32_t *group, uint32_t *kind) {
    size_t len = strlen(name);
    if (len < 20) return false;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    char hex[17];
    memcpy(hex, name, 16);
    hex[16] = 0;
    *chain = strtoull(hex, NULL, 16);
    if (!strcmp(name + 16, ".kvs")) {
        *group = SSD_GROUP_NONE;
        *kind = KVT_SSD_KIND_SNAPSHOT;
        return true;
    }
    if (name[16] != '-' || name[17] != 'g') return false;
    const char *p = name + 18;
    if (*p < '0' || *p > '9') return false;
    uint32_t g = 0;
    while (*p >= '0' && *p <= '9') {
        g = g * 10 + (uint32_t)(*p - '0');
        if (g > 1000) return false;
        p++;
    }
    if (!strcmp(p, ".kvb")) *kind = KVT_SSD_KIND_BLOCK;
    else if (!strcmp(p, ".kvt")) *kind = KVT_SSD_KIND_TAIL;
    else return false;
    *group = g;
    return true;
}

/* ------------------------------------------------------------------ untrusted directory */
/* The cache directory is untrusted input: every cache file is opened through this, which never
 * follows a symlink (O_NOFOLLOW), never blocks on a FIFO or device (O_NONBLOCK, which has no effect
 * on regular-file reads) and refuses anything that is not a regular file (errno = EFTYPE-like
 * EINVAL). Returns the fd or -1. */
static int open_cache_file(const char *path, int flags) {
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
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
static bool dir_trusted(const char *path, bool follow, char *err, size_t errlen) {
    struct stat sb;
    int r = follow ? stat(path, &sb) : lstat(path, &sb);
    if (r != 0) {
        kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: %s: %s", path, strerror(errno));
        return false;
    }
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

/* ------------------------------------------------------------------ header encode / decode */
typedef struct hdr_layer {
    uint32_t layer, kind, window, n_kv_heads, head_dim_k, head_dim_v, state_bytes;
    kvt_codec codec;
} hdr_layer;

typedef struct hdr_section {
    uint64_t offset, length, hash;
} hdr_section;

/* Expected per-layer records of the file for (group, block_index) or the snapshot (group NONE). */
static uint32_t expected_layers(const kvt_kv_layout *l, uint32_t group, uint32_t block_index,
                                hdr_layer *out) {
    uint32_t n = 0, nl = kvt_kv_layout_n_layers(l);
    for (uint32_t i = 0; i < nl; i++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(l, i);
        bool take = group == SSD_GROUP_NONE ? d->kind == KVT_KIND_RECURRENT
                                            : kvt_kv_layout_layer_group(l, i) == group;
        if (!take) continue;
        hdr_layer *h = &out[n++];
        memset(h, 0, sizeof(*h));
        h->layer = i;
        h->kind = (uint32_t)d->kind;
        if (d->kind == KVT_KIND_RECURRENT) {
            h->state_bytes = d->state_bytes;
        } else {
            h->window = d->kind == KVT_KIND_WINDOW ? d->window : 0;
            h->n_kv_heads = d->n_kv_heads;
            h->head_dim_k = d->head_dim_k;
            h->head_dim_v = d->head_dim_v;
            h->codec = kvt_kv_layout_codec_at(l, i, block_index);
        }
    }
    return n;
}

static uint64_t header_size(uint32_t compat_len, uint32_t n_ids, uint32_t n_layers,
                            uint32_t n_sections) {
    return SSD_FIXED_HDR + align_up(compat_len, 8) + align_up((uint64_t)n_ids * 4, 8) +
           (uint64_t)n_layers * SSD_LAYER_REC + (uint64_t)n_sections * SSD_SECTION_REC;
}

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

/* Encodes the header into buf (size header_size(...)), checksum included. */
static void header_encode(const hdr_in *h, uint8_t *buf, uint64_t hsize) {
    memset(buf, 0, hsize);
    uint32_t clen = (uint32_t)strlen(h->compat);
    memcpy(buf, SSD_MAGIC, 8);
    put_u32(buf + 8, KVT_SSD_FORMAT_VERSION);
    put_u32(buf + 12, (uint32_t)hsize);
    put_u32(buf + 24, h->kind);
    put_u32(buf + 28, h->group);
    put_u32(buf + 32, h->block_index);
    put_u32(buf + 36, h->n_tokens);
    put_u32(buf + 40, h->block_tokens);
    put_u32(buf + 44, h->n_layers);
    put_u32(buf + 48, h->n_ids);
    put_u32(buf + 52, h->n_sections);
    put_u32(buf + 56, clen);
    put_u64(buf + 64, h->parent);
    put_u64(buf + 72, h->chain);
    put_u64(buf + 80, h->root);
    put_u64(buf + 88, XXH3_64bits(h->compat, clen));
    put_u64(buf + 96, h->data_offset);
    uint8_t *p = buf + SSD_FIXED_HDR;
    memcpy(p, h->compat, clen);
    p += align_up(clen, 8);
    for (uint32_t i = 0; i < h->n_ids; i++) put_u32(p + 4 * i, (uint32_t)h->ids[i]);
    p += align_up((uint64_t)h->n_ids * 4, 8);
    for (uint32_t i = 0; i < h->n_layers; i++, p += SSD_LAYER_REC) {
        const hdr_layer *L = &h->layers[i];
        put_u32(p, L->layer);
        put_u32(p + 4, L->kind);
        put_u32(p + 8, L->window);
        put_u32(p + 12, L->n_kv_heads);
        put_u32(p + 16, L->head_dim_k);
        put_u32(p + 20, L->head_dim_v);
        put_u32(p + 24, L->state_bytes);
        p[28] = (uint8_t)L->codec.kind;
        p[29] = L->codec.bits;
        put_u16(p + 30, L->codec.group_size);
        p[32] = L->codec.scale_bf16;
    }
    for (uint32_t i = 0; i < h->n_sections; i++, p += SSD_SECTION_REC) {
        put_u64(p, h->sections[i].offset);
        put_u64(p + 8, h->sections[i].length);
        put_u64(p + 16, h->sections[i].hash);
    }
    put_u64(buf + 16, XXH3_64bits(buf, hsize));
}

/* Decoded header; pointers reference the raw buffer. */
typedef struct hdr_out {
    kvt_ssd_file_info info;
    const uint8_t *ids_raw;
    const uint8_t *layers_raw;
    const uint8_t *sections_raw;
} hdr_out;

static hdr_layer hdr_layer_at(const hdr_out *h, uint32_t i) {
    const uint8_t *p = h->layers_raw + (size_t)i * SSD_LAYER_REC;
    hdr_layer L;
    memset(&L, 0, sizeof(L));
    L.layer = get_u32(p);
    L.kind = get_u32(p + 4);
    L.window = get_u32(p + 8);
    L.n_kv_heads = get_u32(p + 12);
    L.head_dim_k = get_u32(p + 16);
    L.head_dim_v = get_u32(p + 20);
    L.state_bytes = get_u32(p + 24);
    L.codec.kind = (kvt_codec_kind)p[28];
    L.codec.bits = p[29];
    L.codec.group_size = get_u16(p + 30);
    L.codec.scale_bf16 = p[32];
    return L;
}
static hdr_section hdr_section_at(const hdr_out *h, uint32_t i) {
    const uint8_t *p = h->sections_raw + (size_t)i * SSD_SECTION_REC;
    hdr_section s = {get_u64(p), get_u64(p + 8), get_u64(p + 16)};
    return s;
}
static int32_t hdr_id_at(const hdr_out *h, uint32_t i) { return (int32_t)get_u32(h->ids_raw + 4 * (size_t)i); }

/* Validates a full header buffer of hsize bytes (already read) against itself (magic, version,
 * checksum, internal consistency, chain hash of the tokens). file_size bounds the sections. */
static kvt_status header_decode(uint8_t *buf, uint64_t hsize, uint64_t file_size, hdr_out *h,
                                char *err, size_t errlen) {
    memset(h, 0, sizeof(*h));
    if (hsize < SSD_FIXED_HDR || memcmp(buf, SSD_MAGIC, 8) != 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "not a kvtier cache file (bad magic)");
    uint32_t ver = get_u32(buf + 8);
    if (ver != KVT_SSD_FORMAT_VERSION)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "cache format version %u unsupported", ver);
    if (get_u32(buf + 12) != hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header length mismatch");
    uint64_t stored = get_u64(buf + 16);
    put_u64(buf + 16, 0);
    uint64_t calc = XXH3_64bits(buf, hsize);
    put_u64(buf + 16, stored);
    if (calc != stored)
        return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "header checksum mismatch (truncated or corrupt)");
    kvt_ssd_file_info *I = &h->info;
    I->version = ver;
    I->kind = get_u32(buf + 24);
    I->group = get_u32(buf + 28);
    I->block_index = get_u32(buf + 32);
    I->n_tokens = get_u32(buf + 36);
    I->block_tokens = get_u32(buf + 40);
    I->n_layers = get_u32(buf + 44);
    uint32_t n_ids = get_u32(buf + 48);
    I->n_sections = get_u32(buf + 52);
    uint32_t clen = get_u32(buf + 56);
    I->parent = get_u64(buf + 64);
    I->chain = get_u64(buf + 72);
    I->root = get_u64(buf + 80);
    I->compat_hash = get_u64(buf + 88);
    uint64_t data_off = get_u64(buf + 96);
    I->file_bytes = file_size;
    if (clen == 0 || clen >= KVT_SSD_COMPAT_KEY_MAX || n_ids > SSD_MAX_TOKEN_IDS ||
        I->n_layers > KVT_MAX_LAYERS || I->n_sections > 2 * KVT_MAX_LAYERS + 1 ||
        I->block_tokens == 0 || I->block_tokens > SSD_MAX_TOKEN_IDS)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header counts out of range");
    if (header_size(clen, n_ids, I->n_layers, I->n_sections) != hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header size inconsistent");
    memcpy(I->compat_key, buf + SSD_FIXED_HDR, clen);
    I->compat_key[clen] = 0;
    if (strlen(I->compat_key) != clen || XXH3_64bits(I->compat_key, clen) != I->compat_hash)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "compat key hash mismatch");
    h->ids_raw = buf + SSD_FIXED_HDR + align_up(clen, 8);
    h->layers_raw = h->ids_raw + align_up((uint64_t)n_ids * 4, 8);
    h->sections_raw = h->layers_raw + (size_t)I->n_layers * SSD_LAYER_REC;
    switch (I->kind) {
    case KVT_SSD_KIND_BLOCK:
        if (I->n_tokens != I->block_tokens || n_ids != I->n_tokens || I->group == SSD_GROUP_NONE)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad block token count");
        break;
    case KVT_SSD_KIND_TAIL:
        if (I->n_tokens == 0 || I->n_tokens >= I->block_tokens || n_ids != I->n_tokens ||
            I->group == SSD_GROUP_NONE)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad tail token count");
        break;
    case KVT_SSD_KIND_SNAPSHOT:
        if (n_ids != 0 || I->group != SSD_GROUP_NONE || I->n_tokens == 0)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad snapshot header");
        break;
    default:
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "unknown entry kind %u", I->kind);
    }
    if (data_off % SSD_PAGE || data_off < hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad data offset");
    uint64_t cursor = data_off;
    for (uint32_t i = 0; i < I->n_sections; i++) {
        hdr_section s = hdr_section_at(h, i);
        uint64_t end;
        if (s.offset % SSD_PAGE || s.offset < cursor || !kvt_add_ok(s.offset, s.length, &end) ||
            end > file_size)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "section %u out of bounds (truncated?)", i);
        cursor = end;
        I->payload_bytes += s.length;
    }
    if (I->kind != KVT_SSD_KIND_SNAPSHOT) {
        int32_t *tmp = malloc((size_t)n_ids * 4 + 4);
        if (!tmp) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < n_ids; i++) tmp[i] = hdr_id_at(h, i);
        uint64_t c = kvt_chain_hash(I->parent, tmp, n_ids);
        free(tmp);
        if (c != I->chain) return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "chain hash does not match tokens");
    }
    return KVT_OK;
}

/* Reads up to len bytes at off; stops early only at end of file. Returns bytes read or -1 (errno). */
static int64_t read_upto(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, dst + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (uint64_t)r;
    }
    return (int64_t)got;
}

/* Reads and decodes the header of an open file. *bufp receives the header buffer (page-aligned,
 * release with free). direct: fd was opened with O_DIRECT, so reads are whole pages (files are padded
 * to a page multiple; a truncated file just reads short). errno_out (may be NULL) receives the errno
 * of a failed read, so a caller can fall back from O_DIRECT on EINVAL. */
static kvt_status header_read_any(int fd, bool direct, uint8_t **bufp, hdr_out *h, int *errno_out, char *err,
                                  size_t errlen) {
    *bufp = NULL;
    if (errno_out) *errno_out = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) return kvt_errf(err, errlen, KVT_ERR_IO, "stat: %s", strerror(errno));
    uint64_t fsz = (uint64_t)st.st_size;
    if (fsz < SSD_FIXED_HDR) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "file too short (%llu bytes)", (unsigned long long)fsz);
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, SSD_PAGE, SSD_PAGE) != 0) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    int64_t r = read_upto(fd, buf, direct ? SSD_PAGE : SSD_FIXED_HDR, 0);
    if (r < (int64_t)SSD_FIXED_HDR) {
        if (r < 0 && errno_out) *errno_out = errno;
        free(buf);
        return kvt_errf(err, errlen, KVT_ERR_IO, "short header read");
    }
    uint64_t got = (uint64_t)r;
    if (memcmp(buf, SSD_MAGIC, 8) != 0) {
        free(buf);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "not a kvtier cache file (bad magic)");
    }
    uint32_t hsize = get_u32(buf + 12);
    if (hsize < SSD_FIXED_HDR || hsize > SSD_MAX_HDR || hsize > fsz) {
        free(buf);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header length out of range (truncated or corrupt)");
    }
    if (hsize > got) {
        uint64_t cap = align_up(hsize, SSD_PAGE);
        uint8_t *nb = NULL;
        if (posix_memalign((void **)&nb, SSD_PAGE, cap) != 0) {
            free(buf);
            return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
        }
        memcpy(nb, buf, got);
        free(buf);
        buf = nb;
        uint64_t want = direct ? cap - got : hsize - got; /* got is a page multiple when direct */
        r = read_upto(fd, buf + got, want, got);
        if (r < 0 || got + (uint64_t)r < hsize) {
            if (r < 0 && errno_out) *errno_out = errno;
            free(buf);
            return kvt_errf(err, errlen, KVT_ERR_IO, "header read failed");
        }
    }
    kvt_status st2 = header_decode(buf, hsize, fsz, h, err, errlen);
    if (st2 != KVT_OK) {
        free(buf);
        return st2;
    }
    *bufp = buf;
    return KVT_OK;
}

static kvt_status header_read_fd(int fd, uint8_t **bufp, hdr_out *h, char *err, size_t errlen) {
    return header_read_any(fd, false, bufp, h, NULL, err, errlen);
}

static kvt_status read_full(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, dst + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return KVT_ERR_IO;
        got += (uint64_t)r;
    }
    return KVT_OK;
}

kvt_status kvt_ssd_read_file_info(const char *path, bool verify_payload, kvt_ssd_file_info *info,
                                  int32_t *tokens, uint32_t max_tokens, char *err, size_t errlen) {
    int fd = open_cache_file(path, O_RDONLY);
    if (fd < 0)
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path,
                        errno == EINVAL || errno == ELOOP ? "not a regular file (symlink, FIFO or device): skipped" : strerror(errno));
    uint8_t *buf;
    hdr_out h;
    kvt_status st = header_read_fd(fd, &buf, &h, err, errlen);
    if (st != KVT_OK) {
        close(fd);
        return st;
    }
    *info = h.info;
    uint32_t n_ids = info->kind == KVT_SSD_KIND_SNAPSHOT ? 0 : info->n_tokens;
    if (tokens)
        for (uint32_t i = 0; i < n_ids && i < max_tokens; i++) tokens[i] = hdr_id_at(&h, i);
    if (verify_payload) {
        for (uint32_t i = 0; i < info->n_sections && st == KVT_OK; i++) {
            hdr_section s = hdr_section_at(&h, i);
            XXH3_state_t *xs = XXH3_createState();
            uint8_t *chunk = malloc(1 << 20);
            if (!xs || !chunk) {
                st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
            } else {
                XXH3_64bits_reset(xs);
                for (uint64_t o = 0; o < s.length && st == KVT_OK;) {
                    uint64_t n = KVT_MIN(s.length - o, (uint64_t)1 << 20);
                    if (read_full(fd, chunk, n, s.offset + o) != KVT_OK)
                        st = kvt_errf(err, errlen, KVT_ERR_IO, "section %u read failed", i);
                    else
                        XXH3_64bits_update(xs, chunk, n);
                    o += n;
                }
                if (st == KVT_OK && XXH3_64bits_digest(xs) != s.hash)
                    st = kvt_errf(err, errlen, KVT_ERR_CORRUPT, "section %u checksum mismatch", i);
            }
            free(chunk);
            if (xs) XXH3_freeState(xs);
        }
    }
    free(buf);
    close(fd);
    return st;
}

/* ------------------------------------------------------------------ compact tails */
/* A tail of m tokens stores, for each layer of its group (increasing), K then V, for each KV head
 * (increasing), only the m rows of that head: m*row_bytes bytes that live at
 * kvt_kv_layout_row_offset(layer, index, kv, 0, head) in the block. Chunks are visited in increasing
 * block offset order. fn(ctx, block_offset, compact_offset, len) per chunk; returns the total. */
typedef void (*tail_chunk_fn)(void *ctx, uint64_t block_off, uint64_t compact_off, uint64_t len);
static uint64_t tail_walk(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, tail_chunk_fn fn, void *ctx) {
    uint64_t c = 0;
    for (uint32_t li = 0; li < kvt_kv_layout_group_n_layers(l, g); li++) {
        uint32_t layer = kvt_kv_layout_group_layer(l, g, li);
        uint32_t nh = kvt_kv_layout_layer(l, layer)->n_kv_heads;
        for (int kv = 0; kv < 2; kv++) {
            uint64_t len = (uint64_t)m * kvt_kv_layout_row_bytes(l, layer, bi, kv);
            if (len == 0) continue; /* MLA: no V section */
            for (uint32_t h = 0; h < nh; h++) {
                if (fn) fn(ctx, kvt_kv_layout_row_offset(l, layer, bi, kv, 0, h), c, len);
                c += len;
            }
        }
    }
    return c;
}
static uint64_t tail_bytes(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m) {
    return tail_walk(l, g, bi, m, NULL, NULL);
}

typedef struct tail_ctx {
    uint8_t *block;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t cursor;
} tail_ctx;
static void tail_pack_chunk(void *ctx, uint64_t bo, uint64_t co, uint64_t len) {
    tail_ctx *t = ctx;
    memcpy(t->dst + co, t->src + bo, len);
}
static void tail_zero_gap(void *ctx, uint64_t bo, uint64_t co, uint64_t len) {
    tail_ctx *t = ctx;
    (void)co;
    if (bo > t->cursor) memset(t->block + t->cursor, 0, bo - t->cursor);
    t->cursor = bo + len;
}
typedef struct tail_move_ctx {
    uint8_t *block;
    uint64_t *chunks; /* 3 entries per chunk: block offset, compact offset, length */
    uint64_t n;
} tail_move_ctx;
static void tail_collect(void *ctx, uint64_t bo, uint64_t co, uint64_t len) {
    tail_move_ctx *t = ctx;
    t->chunks[3 * t->n] = bo;
    t->chunks[3 * t->n + 1] = co;
    t->chunks[3 * t->n + 2] = len;
    t->n++;
}

/* Packs the m-token tail of a block into out (tail_bytes long). */
static void tail_pack(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, const uint8_t *block, uint8_t *out) {
    tail_ctx t = {.src = block, .dst = out};
    tail_walk(l, g, bi, m, tail_pack_chunk, &t);
}

/* Expands a compact tail held at block[0, tail_bytes) in place into the block layout (rows >= m and
 * padding zeroed). In place works back to front: every chunk moves to a higher (or equal) offset,
 * and the source of an earlier chunk ends at or before the destination of a later one. */
static bool tail_unpack_inplace(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, uint8_t *block,
                                uint64_t block_bytes) {
    uint64_t n = 0;
    for (uint32_t li = 0; li < kvt_kv_layout_group_n_layers(l, g); li++)
        n += 2ull * kvt_kv_layout_layer(l, kvt_kv_layout_group_layer(l, g, li))->n_kv_heads;
    tail_move_ctx t = {.block = block, .chunks = malloc((size_t)(n ? n : 1) * 3 * sizeof(uint64_t))};
    if (!t.chunks) return false;
    tail_walk(l, g, bi, m, tail_collect, &t);
    for (uint64_t i = t.n; i-- > 0;) {
        uint64_t bo = t.chunks[3 * i], co = t.chunks[3 * i + 1], len = t.chunks[3 * i + 2];
        assert(bo >= co && bo + len <= block_bytes);
        if (bo != co) memmove(block + bo, block + co, len);
    }
    free(t.chunks);
    tail_ctx z = {.block = block};
    tail_walk(l, g, bi, m, tail_zero_gap, &z);
    if (block_bytes > z.cursor) memset(block + z.cursor, 0, block_bytes - z.cursor);
    return true;
}

/* Checks a decoded header against this tier's key and layout (and against the name it came from). */
static kvt_status header_matches(const kvt_ssd *s, const hdr_out *h, uint64_t chain, uint32_t group,
                                 uint32_t kind, char *err, size_t errlen) {
    const kvt_ssd_file_info *I = &h->info;
    if (I->compat_hash != s->compat_hash || strcmp(I->compat_key, s->compat) != 0)
        return kvt_errf(err, errlen, KVT_ERR_STALE, "compat key mismatch");
    if (I->chain != chain || I->group != group || I->kind != kind)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header disagrees with file name");
    if (I->block_tokens != s->bt) return kvt_errf(err, errlen, KVT_ERR_STALE, "block size mismatch");
    hdr_layer exp[KVT_MAX_LAYERS];
    uint32_t bi = kind == KVT_SSD_KIND_SNAPSHOT ? 0 : I->block_index;
    if (kind != KVT_SSD_KIND_SNAPSHOT) {
        if (group >= s->n_groups) return kvt_errf(err, errlen, KVT_ERR_STALE, "group out of range");
        if (bi == 0 && I->parent != I->root && I->root != 0)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "root/parent mismatch");
    }
    uint32_t ne = expected_layers(s->layout, group, bi, exp);
    if (ne != I->n_layers) return kvt_errf(err, errlen, KVT_ERR_STALE, "layer count mismatch");
    for (uint32_t i = 0; i < ne; i++) {
        hdr_layer L = hdr_layer_at(h, i);
        if (L.layer != exp[i].layer || L.kind != exp[i].kind || L.window != exp[i].window ||
            L.n_kv_heads != exp[i].n_kv_heads || L.head_dim_k != exp[i].head_dim_k ||
            L.head_dim_v != exp[i].head_dim_v || L.state_bytes != exp[i].state_bytes ||
            L.codec.kind != exp[i].codec.kind || L.codec.bits != exp[i].codec.bits ||
            L.codec.group_size != exp[i].codec.group_size || L.codec.scale_bf16 != exp[i].codec.scale_bf16)
            return kvt_errf(err, errlen, KVT_ERR_STALE, "layer %u geometry mismatch", i);
    }
    if (kind == KVT_SSD_KIND_SNAPSHOT) {
        if (I->n_sections != ne) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section count");
        for (uint32_t i = 0; i < ne; i++)
            if (hdr_section_at(h, i).length != exp[i].state_bytes)
                return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section size");
    } else {
        uint64_t want = kind == KVT_SSD_KIND_TAIL ? tail_bytes(s->layout, group, bi, I->n_tokens)
                                                  : kvt_kv_layout_block_bytes(s->layout, group, bi);
        if (I->n_sections != 1 || hdr_section_at(h, 0).length != want)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "block payload size mismatch");
    }
    return KVT_OK;
}

/* ------------------------------------------------------------------ identity */
static void hex_of(const uint8_t *d, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * n] = 0;
}

static kvt_status sha256_file(const char *path, char out_hex[65], char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    uint8_t *buf = malloc(1 << 20);
    kvt_status st = KVT_OK;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "sha256 init failed");
    } else {
        for (;;) {
            ssize_t r = read(fd, buf, 1 << 20);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(errno));
                break;
            }
            if (r == 0) break;
            EVP_DigestUpdate(ctx, buf, (size_t)r);
        }
        if (st == KVT_OK) {
            uint8_t md[32];
            unsigned int mdl = 0;
            EVP_DigestFinal_ex(ctx, md, &mdl);
            hex_of(md, 32, out_hex);
        }
    }
    free(buf);
    EVP_MD_CTX_free(ctx);
    close(fd);
    return st;
}

/* Cheap content check of a model file, computed on every start: XXH3 of its first 16 MiB (the GGUF
 * header, metadata and tensor table in practice) and its last 1 MiB. */
static bool model_quick_hash(const char *path, uint64_t size, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    XXH3_state_t *xs = XXH3_createState();
    uint8_t *buf = malloc(1 << 20);
    bool ok = xs && buf;
    if (ok) XXH3_64bits_reset(xs);
    const uint64_t head = 16ull << 20, tail = 1ull << 20;
    uint64_t spans[2][2] = {{0, KVT_MIN(size, head)}, {size > head + tail ? size - tail : KVT_MIN(size, head), size}};
    for (int i = 0; i < 2 && ok; i++)
        for (uint64_t o = spans[i][0]; o < spans[i][1] && ok;) {
            uint64_t n = KVT_MIN(spans[i][1] - o, (uint64_t)1 << 20);
            ok = read_full(fd, buf, n, o) == KVT_OK;
            if (ok) XXH3_64bits_update(xs, buf, n);
            o += n;
        }
    if (ok) *out = XXH3_64bits_digest(xs);
    free(buf);
    if (xs) XXH3_freeState(xs);
    close(fd);
    return ok;
}

/* The memo key of a model file version: device, inode, size, mtime and ctime (ns), the quick content
 * hash and the real path. ctime changes on every write or metadata change and cannot be set by a
 * user, so a file rewritten in place with restored size and mtime still gets a new key. */
static kvt_status model_memo_key(const char *model_path, char *key, size_t keylen, char *err, size_t errlen) {
    struct stat st;
    if (stat(model_path, &st) != 0)
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", model_path, strerror(errno));
    uint64_t qh = 0;
    if (!model_quick_hash(model_path, (uint64_t)st.st_size, &qh))
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot read: %s", model_path, strerror(errno));
    char rp[PATH_MAX];
    if (!realpath(model_path, rp)) snprintf(rp, sizeof(rp), "%s", model_path);
    snprintf(key, keylen, "%llu %llu %llu %lld.%09ld %lld.%09ld %016llx %s", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
             st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec, (unsigned long long)qh, rp);
    return KVT_OK;
}

kvt_status kvt_ssd_model_id(const char *cache_dir, const char *model_path, char out_hex[65],
                            char *err, size_t errlen) {
    char key[PATH_MAX + 256];
    kvt_status ks = model_memo_key(model_path, key, sizeof key, err, errlen);
    if (ks != KVT_OK) return ks;
    char memo[PATH_MAX];
    FILE *f = NULL;
    if (cache_dir) {
        snprintf(memo, sizeof(memo), "%s/.model-ids", cache_dir);
        int mfd = open_cache_file(memo, O_RDONLY);
        if (mfd >= 0 && !(f = fdopen(mfd, "r"))) close(mfd);
    }
    /* memo line: "<sha256 hex> <ino> <size> <mtime> <realpath>\n" */
    char *line = NULL;
    size_t cap = 0;
    char *old = NULL;
    size_t old_len = 0;
    if (f) {
        ssize_t n;
        while ((n = getline(&line, &cap, f)) > 0) {
            if (line[n - 1] == '\n') line[--n] = 0;
            if (n > 65 && line[64] == ' ' && !strcmp(line + 65, key)) {
                memcpy(out_hex, line, 64);
                out_hex[64] = 0;
                free(line);
                free(old);
                fclose(f);
                return KVT_OK;
            }
            char *no = realloc(old, old_len + (size_t)n + 2);
            if (no) {
                old = no;
                memcpy(old + old_len, line, (size_t)n);
                old_len += (size_t)n;
                old[old_len++] = '\n';
            }
        }
        fclose(f);
    }
    free(line);
    kvt_status s = sha256_file(model_path, out_hex, err, errlen);
    if (s == KVT_OK) { /* re-check: a file rewritten while it was hashed must not be memoized */
        char key2[PATH_MAX + 256];
        if (model_memo_key(model_path, key2, sizeof key2, err, errlen) != KVT_OK || strcmp(key, key2) != 0)
            s = kvt_errf(err, errlen, KVT_ERR_STALE, "%s changed while it was being hashed; try again", model_path);
    }
    if (s == KVT_OK && cache_dir) {
        /* Best effort memo update: tmp + rename so a crash never leaves a half line. */
        mkdir_p(cache_dir);
        char tmp[PATH_MAX + 48];
        tmp_name(tmp, sizeof(tmp), memo);
        int wfd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        FILE *w = wfd >= 0 ? fdopen(wfd, "w") : NULL;
        if (wfd >= 0 && !w) {
            close(wfd);
            unlink(tmp);
        }
        if (w) {
            if (old_len) fwrite(old, 1, old_len, w);
            fprintf(w, "%s %s\n", out_hex, key);
            bool ok = fflush(w) == 0 && fsync(fileno(w)) == 0;
            ok = (fclose(w) == 0) && ok;
            if (!ok || rename(tmp, memo) != 0) unlink(tmp);
        }
    }
    free(old);
    return s;
}

kvt_status kvt_ssd_compat_key(const char *cache_dir, const char *model_path,
                              const kvt_kv_layout *layout, const char *tokenizer_hash,
                              const char *numerics_id, char *out, size_t outlen, char *err, size_t errlen) {
    char mid[65];
    kvt_status st = kvt_ssd_model_id(cache_dir, model_path, mid, err, errlen);
    if (st != KVT_OK) return st;
    char scheme[256];
    kvt_kv_layout_key(layout, scheme, sizeof(scheme));
    int n = snprintf(out, outlen, "kvtier-ssd;model=%s;scheme=%s;tok=%s;bt=%u;num=%d;kern=%s", mid, scheme,
                     tokenizer_hash ? tokenizer_hash : "", kvt_kv_layout_block_tokens(layout),
                     KVT_NUMERICS_VERSION, numerics_id && numerics_id[0] ? numerics_id : "unknown");
    if (n < 0 || (size_t)n >= outlen || (size_t)n >= KVT_SSD_COMPAT_KEY_MAX)
        return kvt_errf(err, errlen, KVT_ERR_RANGE, "compat key too long");
    return KVT_OK;
}

void kvt_ssd_compat_dir(const char *compat_key, char out[33]) {
    uint8_t md[32];
    unsigned int mdl = 0;
    EVP_Digest(compat_key, strlen(compat_key), md, &mdl, EVP_sha256(), NULL);
    hex_of(md, 16, out);
}

/* ------------------------------------------------------------------ writing */
/* fsync of a directory (publishes the entries renamed/created in it). A failure is a failed write:
 * the entry may not survive a power loss, so the record stays dirty. */
static bool fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    int e = errno;
    close(fd);
    errno = e;
    return ok;
}

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
static void tmp_name(char *buf, size_t n, const char *path) {
    snprintf(buf, n, "%s.%d-%016llx.tmp", path, (int)getpid(), (unsigned long long)proc_nonce());
}
/* Orphan rule of the startup scan for a "*.tmp" name: stale (reap) unless it carries the pid of a
 * live process other than ours (another server sharing the directory) and is younger than an hour
 * (a process on another host sharing the directory cannot be probed; an hour-old temporary is
 * abandoned in practice). A temporary with our pid but another nonce is our predecessor's. */
static bool tmp_is_stale(const char *name, const struct stat *sb) {
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

/* pwrite of the whole buffer; honours the injected write faults. */
static bool write_all(kvt_ssd *s, int fd, const void *p, uint64_t len, uint64_t off, bool payload) {
    int f = atomic_load(&s->fault);
    if (s->fault_rate && (fault_next(&s->fault_rng) % 1000) < s->fault_rate) { /* scheduled fault */
        errno = EIO;
        return false;
    }
    if (f == KVT_SSD_FAULT_ENOSPC) {
        errno = ENOSPC;
        return false;
    }
    if (f == KVT_SSD_FAULT_EIO_WRITE) {
        errno = EIO;
        return false;
    }
    if (f == KVT_SSD_FAULT_SHORT_WRITE && payload) len /= 2; /* torn write, reported as success */
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
    return true;
}

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

/* Fills r for a block b (full or frozen tail) or a snapshot sn. Caller frees r->packed. */
static kvt_status record_prepare(const kvt_ssd *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, ssd_record *r) {
    memset(r, 0, sizeof(*r));
    hdr_in *h = &r->h;
    h->compat = s->compat;
    h->block_tokens = s->bt;
    if (b) {
        h->n_tokens = kvt_block_n_tokens(b);
        h->kind = h->n_tokens == s->bt ? KVT_SSD_KIND_BLOCK : KVT_SSD_KIND_TAIL;
        h->group = kvt_block_group(b);
        h->block_index = kvt_block_index(b);
        h->parent = kvt_block_parent(b);
        h->chain = kvt_block_hash(b);
        h->root = h->block_index == 0 ? h->parent : root;
        h->ids = kvt_block_tokens(b);
        h->n_ids = h->n_tokens;
        h->n_layers = expected_layers(s->layout, h->group, h->block_index, r->layers);
        h->n_sections = 1;
        if (h->kind == KVT_SSD_KIND_TAIL) { /* compact: only the n_tokens rows of every head */
            r->secs[0].length = tail_bytes(s->layout, h->group, h->block_index, h->n_tokens);
            r->packed = malloc(r->secs[0].length ? r->secs[0].length : 1);
            if (!r->packed) return KVT_ERR_NOMEM;
            tail_pack(s->layout, h->group, h->block_index, h->n_tokens, kvt_block_data(b), r->packed);
            r->payload[0] = r->packed;
        } else {
            r->secs[0].length = kvt_block_data_bytes(b);
            r->payload[0] = kvt_block_data(b);
        }
    } else {
        h->kind = KVT_SSD_KIND_SNAPSHOT;
        h->group = SSD_GROUP_NONE;
        h->n_tokens = kvt_snapshot_pos(sn);
        h->block_index = h->n_tokens / s->bt;
        h->chain = kvt_snapshot_chain(sn);
        h->root = root;
        h->n_layers = expected_layers(s->layout, SSD_GROUP_NONE, 0, r->layers);
        h->n_sections = h->n_layers;
        const uint8_t *d = kvt_snapshot_data(sn);
        uint64_t off = 0;
        for (uint32_t i = 0; i < h->n_layers; i++) {
            r->secs[i].length = r->layers[i].state_bytes;
            r->payload[i] = d + off;
            off += r->layers[i].state_bytes;
        }
    }
    h->layers = r->layers;
    h->sections = r->secs;
    r->hsize = header_size((uint32_t)strlen(s->compat), h->n_ids, h->n_layers, h->n_sections);
    h->data_offset = align_up(r->hsize, SSD_PAGE);
    uint64_t cur = h->data_offset;
    for (uint32_t i = 0; i < h->n_sections; i++) {
        r->secs[i].offset = cur;
        r->secs[i].hash = XXH3_64bits(r->payload[i], r->secs[i].length);
        cur = align_up(cur + r->secs[i].length, SSD_PAGE);
    }
    r->fsize = cur;
    return KVT_OK;
}

/* Publishes one item as a file. Returns KVT_OK and fills *e (index entry) on success. */
static kvt_status write_item(kvt_ssd *s, const ssd_item *it, ssd_entry **eout) {
    *eout = NULL;
    ssd_record rec;
    kvt_status pst = record_prepare(s, it->b, it->s, it->root, &rec);
    if (pst != KVT_OK) return pst;
    const hdr_in h = rec.h;
    const hdr_section *secs = rec.secs;
    const uint8_t *const *payload = rec.payload;
    uint8_t *packed = rec.packed;
    const uint64_t hsize = rec.hsize, fsize = rec.fsize;
    if (s->o.max_bytes && fsize > s->o.max_bytes) {
        free(packed);
        errno = EFBIG;
        return KVT_ERR_RANGE;
    }
    uint8_t *hbuf = malloc(hsize);
    if (!hbuf) {
        free(packed);
        return KVT_ERR_NOMEM;
    }
    header_encode(&h, hbuf, hsize);

    char name[64], path[PATH_MAX], tmp[PATH_MAX + 48];
    entry_name(name, sizeof(name), h.chain, h.group, h.kind);
    snprintf(path, sizeof(path), "%s/%s", s->cdir, name);
    tmp_name(tmp, sizeof(tmp), path);
    kvt_status st = KVT_ERR_IO;
    /* O_EXCL|O_NOFOLLOW: never opens a planted file or follows a planted symlink. A leftover of our
     * own (a failed earlier attempt of this process) is removed first; unlink never follows. */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        bool ok = fchmod(fd, 0600) == 0; /* regardless of umask */
        ok = ok && write_all(s, fd, hbuf, hsize, 0, false);
        for (uint32_t i = 0; ok && i < h.n_sections; i++)
            ok = write_all(s, fd, payload[i], secs[i].length, secs[i].offset, true);
        /* Pad to the page-aligned end so O_DIRECT reads of the last section stay inside the file. */
        if (ok && ftruncate(fd, (off_t)fsize) != 0) ok = false;
        if (ok && fsync(fd) != 0) ok = false;
        int saved = errno;
        if (close(fd) != 0 && ok) {
            ok = false;
            saved = errno;
        }
        if (ok && rename(tmp, path) == 0) {
            bool synced = atomic_load(&s->fault) != KVT_SSD_FAULT_FSYNC_DIR && fsync_dir(s->cdir);
            if (!synced && atomic_load(&s->fault) == KVT_SSD_FAULT_FSYNC_DIR) errno = EIO;
            /* published under its name but maybe not durable: a failure (the record stays dirty and
             * is rewritten; the next scan indexes the file if it survived) */
            st = synced ? KVT_OK : KVT_ERR_IO;
        } else {
            if (ok) saved = errno;
            unlink(tmp);
            errno = saved;
        }
    }
    free(hbuf);
    free(packed);
    if (st != KVT_OK) return st;

    ssd_entry *e = calloc(1, sizeof(*e));
    if (e && h.n_ids) {
        e->tokens = malloc((size_t)h.n_ids * 4);
        if (e->tokens) memcpy(e->tokens, h.ids, (size_t)h.n_ids * 4);
        else {
            free(e);
            e = NULL;
        }
    }
    if (!e) return KVT_ERR_NOMEM; /* file is valid; the next scan will index it */
    e->chain = h.chain;
    e->link = h.kind == KVT_SSD_KIND_SNAPSHOT ? h.chain : h.parent;
    e->kind = h.kind;
    e->group = h.group;
    e->index = h.block_index;
    e->n_tokens = h.n_tokens;
    e->bytes = fsize;
    e->last_use = now_real_ns();
    *eout = e;
    return KVT_OK;
}

/* ------------------------------------------------------------------ record buffers (shared tier) */
kvt_status kvt_ssd_record_encode(const kvt_ssd *s, kvt_block *b, uint64_t root, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!b || !kvt_block_sealed(b)) return KVT_ERR_INVALID_ARG;
    ssd_record rec;
    kvt_status st = record_prepare(s, b, NULL, root, &rec);
    if (st != KVT_OK) return st;
    uint8_t *buf = calloc(1, rec.fsize); /* zero padding between sections, as in a file */
    if (!buf) {
        free(rec.packed);
        return KVT_ERR_NOMEM;
    }
    header_encode(&rec.h, buf, rec.hsize);
    for (uint32_t i = 0; i < rec.h.n_sections; i++)
        memcpy(buf + rec.secs[i].offset, rec.payload[i], rec.secs[i].length);
    free(rec.packed);
    *out = buf;
    *out_len = rec.fsize;
    return KVT_OK;
}

kvt_status kvt_ssd_record_decode(kvt_ssd *s, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect,
                                 uint32_t group, uint32_t block_index, kvt_block **out, char *err, size_t errlen) {
    *out = NULL;
    if (kind != KVT_SSD_KIND_BLOCK && kind != KVT_SSD_KIND_TAIL)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "only blocks and tails travel as records");
    if (len < SSD_FIXED_HDR) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record shorter than a header");
    uint32_t hsize = get_u32(buf + 12);
    if (hsize < SSD_FIXED_HDR || hsize > SSD_MAX_HDR || hsize > len)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record header length out of range");
    hdr_out h;
    kvt_status st = header_decode(buf, hsize, len, &h, err, errlen);
    if (st != KVT_OK) return st;
    const kvt_ssd_file_info *I = &h.info;
    /* identity first: the name check of header_matches is replaced by the caller's expectation */
    st = header_matches(s, &h, I->chain, group, kind, err, errlen);
    if (st != KVT_OK) return st;
    if (I->block_index != block_index) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record block index mismatch");
    if (kind == KVT_SSD_KIND_BLOCK ? I->chain != expect : I->parent != expect)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record key mismatch");
    hdr_section sc = hdr_section_at(&h, 0);
    if (align_up(sc.offset + sc.length, SSD_PAGE) != len) /* exactly the file image: no trailing bytes */
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record length mismatch");
    if (XXH3_64bits(buf + sc.offset, sc.length) != sc.hash)
        return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "payload checksum mismatch");
    kvt_block *b = NULL;
    st = kvt_block_alloc(s->pool, group, block_index, &b);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "no pool memory for a fetched block");
    if (sc.length > kvt_block_data_bytes(b)) { /* header_matches makes this impossible */
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "payload larger than the block");
    }
    uint8_t *dst = kvt_block_data_mut(b);
    memcpy(dst, buf + sc.offset, sc.length);
    if (kind == KVT_SSD_KIND_TAIL &&
        !tail_unpack_inplace(s->layout, group, block_index, I->n_tokens, dst, kvt_block_data_bytes(b))) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    int32_t *ids = malloc((size_t)I->n_tokens * 4 + 4);
    if (!ids) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    for (uint32_t t = 0; t < I->n_tokens; t++) ids[t] = hdr_id_at(&h, t);
    st = kvt_block_seal(b, I->parent, ids, I->n_tokens, I->chain);
    free(ids);
    if (st != KVT_OK) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, st, "seal failed: %s", kvt_status_str(st));
    }
    *out = b;
    return KVT_OK;
}

/* Removes the file of e and its index entry. Lock held. */
static void drop_entry(kvt_ssd *s, ssd_entry *e) {
    char name[64], path[PATH_MAX];
    entry_name(name, sizeof(name), e->chain, e->group, e->kind);
    snprintf(path, sizeof(path), "%s/%s", s->cdir, name);
    unlink(path);
    idx_remove(s, e);
}

/* Evicts LRU leaves until the cap holds. Lock held. */
static void enforce_cap(kvt_ssd *s) {
    if (!s->o.max_bytes) return;
    while (s->bytes > s->o.max_bytes && s->n_ents) {
        ssd_entry *victim = NULL;
        for (uint32_t i = 0; i < s->n_ents; i++) {
            ssd_entry *e = s->ents[i];
            if ((!victim || e->last_use < victim->last_use) && idx_is_leaf(s, e)) victim = e;
        }
        if (!victim) victim = s->ents[0]; /* cannot happen (a finite chain has leaves) */
        drop_entry(s, victim);
        s->evictions++;
    }
}

/* Supersession: the shared rule (kvt_plan_supersedes, plan.h): a frozen tail T is redundant once a
 * longer file C at the same position (same parent, same block index) whose tokens start with T's,
 * held in every group that holds T, is published — C serves every prefix T could end. Called after
 * e was published (rename + dir fsync) and indexed; removes every such T (all groups at once: file,
 * index entry, bytes), so a lookup never loses a prefix that the index could serve before. A tail
 * with a snapshot at its chain is pinned: the planner finds a snapshot inside a block through the
 * tail that ends at it. Snapshots themselves are never removed here. Lock held. */
static void supersede(kvt_ssd *s, const ssd_entry *e) {
    if (e->kind == KVT_SSD_KIND_SNAPSHOT || !s->n_buckets) return;
    const kvt_plan_unit nw = {e->link, e->index, e->n_tokens, e->tokens, entry_groups(s, e->chain, e->kind, e->link),
                              e->kind == KVT_SSD_KIND_TAIL, false};
    bool again = true;
    while (again) {
        again = false;
        for (ssd_entry *f = s->tab_link[link_hash(e->link) % s->n_buckets]; f; f = f->next_link) {
            if (f == e || f->link != e->link || f->kind != KVT_SSD_KIND_TAIL || f->chain == e->chain) continue;
            const kvt_plan_unit od = {f->link, f->index, f->n_tokens, f->tokens,
                                      entry_groups(s, f->chain, KVT_SSD_KIND_TAIL, f->link), true,
                                      idx_find(s, f->chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT) != NULL};
            if (!kvt_plan_supersedes(&od, &nw)) continue;
            uint64_t tchain = f->chain;
            for (uint32_t g = 0; g < s->n_groups; g++) {
                ssd_entry *t = idx_find(s, tchain, g, KVT_SSD_KIND_TAIL);
                if (t) {
                    drop_entry(s, t);
                    s->superseded++;
                }
            }
            again = true; /* the bucket changed: rescan it */
            break;
        }
    }
}

/* ---- records: the durability state machine ------------------------------------------------
 *
 * Every block, frozen tail and snapshot owed to disk is a record (ssd_item) holding a reference to
 * its object:
 *
 *     QUEUED ──writer──▶ INFLIGHT ──ok──▶ published (file renamed + dir fsynced; record freed)
 *        ▲                   │
 *        │                   └─error──▶ DIRTY(failed)  ──back-off──▶ QUEUED-by-writer (retry)
 *     enqueue ──queue full──────────▶ DIRTY(dropped) ──back-off──▶ (retry)
 *     DIRTY / QUEUED ──memory pressure, object held by nobody else──▶ shed (record freed, counted)
 *     any ──tier freed──▶ released (counted dropped)
 *   published files: ──▶ superseded | evicted (cap) | removed-corrupt (scan or restore)
 *
 * Invariants (enforced in this section):
 *  1. A record reaches "published" only after fsync(file), rename and fsync(dir) all succeeded; a
 *     failed directory fsync is a failed attempt.
 *  2. A record leaves the tier only as published, shed (its object is referenced by nothing but
 *     the record: no tier and no live sequence holds it any more) or at kvt_ssd_free. A drop or a
 *     write failure never forgets it: it stays DIRTY and is retried with exponential back-off
 *     (SSD_RETRY_MIN_MS doubling to SSD_RETRY_MAX_MS); a waiting flush retries at once.
 *  3. flush() answers durable only when no record numbered <= its target (everything created
 *     before the call) is QUEUED, INFLIGHT or DIRTY. It never reports durable over a hole.
 *  4. Nothing on the request path waits for the writer: enqueue never blocks (a full queue makes
 *     the record DIRTY(dropped)); only flush waits, and only up to its timeout.
 *  5. Records hold pool blocks, so their memory is bounded by the pool budget; under pressure
 *     kvt_ssd_shed frees what only records hold (the "free at once" choice: the pressure path never
 *     waits for the disk).
 *  6. The writer handles one record at a time (at most one INFLIGHT), which is never shed.
 *  7. At most one live record per block/snapshot object (rec_tab): registering a sequence whose
 *     blocks are still owed adds no record, so the record count is bounded by the pool's blocks.
 */
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

#define SSD_RETRY_MIN_MS 50u
#define SSD_RETRY_MAX_MS 30000u

static void item_release(ssd_item *it) {
    if (it->b) kvt_block_release(it->b);
    if (it->s) kvt_snapshot_release(it->s);
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
 * priority (SCHED_IDLE, else nice 19) so it only takes otherwise idle CPU. While a flush waits for
 * it, it tries to return to SCHED_OTHER (the flusher is blocked on it); unprivileged processes
 * usually may not leave SCHED_IDLE (EPERM), in which case it stays idle — still never starved
 * forever (CFS gives SCHED_IDLE a small weight), and flush has its timeout. */
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
static bool writer_should_defer(kvt_ssd *s, uint64_t now_ns, uint64_t *wake_ns) {
    if (!s->busy || s->flush_waiters || s->stop || !s->q_head) return false;
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
    if (it->b) {
        uint32_t nt = kvt_block_n_tokens(it->b);
        return idx_find(s, kvt_block_hash(it->b), kvt_block_group(it->b),
                        nt == s->bt ? KVT_SSD_KIND_BLOCK : KVT_SSD_KIND_TAIL) != NULL;
    }
    return idx_find(s, kvt_snapshot_chain(it->s), SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT) != NULL;
}

/* The compat directory was deleted under us (a temporary could not be created: ENOENT). Every
 * index entry is gone with it, so the index is emptied (counted as lost) to keep /stats true, and
 * the directory is recreated (0700, parent fsynced) so the record can be written at once. Returns
 * true if it was recreated. Lock held. */
static bool dir_vanished(kvt_ssd *s) {
    struct stat sb;
    if (lstat(s->cdir, &sb) == 0) return false; /* still there: another cause */
    KVT_WARN("ssd cache: %s disappeared; forgetting %u entries and recreating it", s->cdir, s->n_ents);
    while (s->n_ents) {
        idx_remove(s, s->ents[s->n_ents - 1]);
        s->lost_entries++;
    }
    if (mkdir_p(s->cdir) != 0) return false; /* the record fails and is retried with back-off */
    write_key_file(s->cdir, s->compat);
    s->dir_recreated++;
    return true;
}

static void *writer_main(void *arg) {
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
            } else if (!s->busy || s->flush_waiters) {
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
        if (s->flush_waiters && cur != PRIO_NORMAL && can_raise) {
            if (writer_raise_priority(cur)) cur = PRIO_NORMAL;
            else can_raise = false; /* EPERM: do not retry every item */
        } else if (!s->flush_waiters && cur == PRIO_NORMAL && low != PRIO_NORMAL) {
            cur = writer_lower_priority();
        }
        it->state = REC_INFLIGHT;
        s->inflight = it;
        bool exists = record_exists(s, it);
        kvt_status st = KVT_OK;
        ssd_entry *e = NULL;
        int err_no = 0;
        if (!exists) {
            pthread_mutex_unlock(&s->mu);
            st = write_item(s, it, &e);
            err_no = errno;
            pthread_mutex_lock(&s->mu);
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
            ssd_entry *dup = idx_find(s, e->chain, e->group, e->kind);
            if (dup) { /* raced with a scan-less duplicate: keep one entry */
                s->bytes -= dup->bytes;
                dup->bytes = e->bytes;
                s->bytes += e->bytes;
                free(e->tokens);
                free(e);
                supersede(s, dup);
            } else if (!idx_add(s, e)) {
                free(e->tokens);
                free(e);
            } else {
                supersede(s, e); /* e is durable (renamed, dir fsynced) and indexed */
            }
            enforce_cap(s);
        }
        s->published++;
        rec_remove(s, it);
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
        item_release(it);
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
        item_release(it);
        return false;
    }
    if (rec_find(s, it)) { /* already owed (queued, in flight or dirty): one record per object */
        pthread_mutex_unlock(&s->mu);
        item_release(it);
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
    ssd_entry *e = idx_find(s, chain, group, kind);
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

bool kvt_ssd_enqueue_block(kvt_ssd *s, kvt_block *b, uint64_t root) {
    if (!s || !s->o.writeback) return true;
    return put_block(s, b, root);
}

bool kvt_ssd_enqueue_snapshot(kvt_ssd *s, kvt_snapshot *sn) {
    if (!s || !s->o.writeback) return true;
    return put_snapshot(s, sn, 0);
}

uint32_t kvt_ssd_enqueue_seq(kvt_ssd *s, const kvt_seq *seq, kvt_snapshot *snap) {
    if (!s || !seq || !s->o.writeback) return 0;
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
    uint64_t lost = s->lost_nomem;
    s->lost_nomem = 0;
    out->entries = s->n_ents;
    out->pending_blocks = pending;
    out->dropped = dropped + lost;
    out->failed = failed;
    out->records_written = s->published - published0;
    out->durable = pending + dropped + failed + lost == 0;
    if (!out->durable) {
        if (failed)
            snprintf(out->reason, sizeof out->reason, "%llu record(s) could not be written: %s (retried with back-off)",
                     (unsigned long long)failed, s->last_errno ? strerror(s->last_errno) : "I/O error");
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

/* Memory pressure (invariant 5): frees records whose block nothing else references, DIRTY ones
 * first (they already failed or were dropped), then QUEUED ones; never the INFLIGHT one. Snapshots
 * are not pool memory and are kept. Returns pool bytes freed. */
uint64_t kvt_ssd_shed(kvt_ssd *s, uint64_t bytes) {
    if (!s) return 0;
    ssd_item *victims = NULL;
    uint64_t freed = 0;
    pthread_mutex_lock(&s->mu);
    ssd_item **lists[2] = {&s->d_head, &s->q_head};
    for (int l = 0; l < 2 && freed < bytes; l++) {
        ssd_item *prev = NULL;
        for (ssd_item **pp = lists[l]; *pp && freed < bytes;) {
            ssd_item *it = *pp;
            if (!it->b || kvt_block_refcount(it->b) != 1) {
                prev = it;
                pp = &it->next;
                continue;
            }
            *pp = it->next;
            if (l == 0) {
                s->d_count--;
                s->d_bytes -= it->bytes;
            } else {
                s->q_count--;
                s->q_bytes -= it->bytes;
                if (s->q_tail == it) s->q_tail = prev;
            }
            freed += kvt_block_data_bytes(it->b);
            s->shed++;
            rec_remove(s, it);
            it->next = victims;
            victims = it;
        }
    }
    if (victims) pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    while (victims) {
        ssd_item *n = victims->next;
        item_release(victims);
        victims = n;
    }
    return freed;
}

void kvt_ssd_set_fault_rate(kvt_ssd *s, uint64_t seed, uint32_t permille) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->fault_rng = seed;
    s->fault_rate = permille > 1000 ? 1000 : permille;
    pthread_mutex_unlock(&s->mu);
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
        for (uint32_t g = 0; g < s->n_groups && !par; g++) par = idx_find(s, cur->link, g, KVT_SSD_KIND_BLOCK);
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
static void scan_dir(kvt_ssd *s) {
    DIR *d = opendir(s->cdir);
    if (!d) return;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (nm[0] == '.') continue;
        snprintf(path, sizeof(path), "%s/%s", s->cdir, nm);
        size_t len = strlen(nm);
        if (len > 4 && !strcmp(nm + len - 4, ".tmp")) {
            struct stat ts;
            if (fstatat(dirfd(d), nm, &ts, AT_SYMLINK_NOFOLLOW) == 0 && tmp_is_stale(nm, &ts)) {
                KVT_DEBUG("ssd cache: reaping orphan %s", path);
                unlinkat(dirfd(d), nm, 0); /* removes a symlink itself, never its target */
            }
            continue;
        }
        uint64_t chain;
        uint32_t group, kind;
        if (!parse_name(nm, &chain, &group, &kind)) continue; /* not ours (e.g. KEY) */
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
        kvt_status st = header_read_fd(fd, &buf, &h, err, sizeof(err));
        if (st == KVT_OK) st = header_matches(s, &h, chain, group, kind, err, sizeof(err));
        if (st == KVT_OK && s->o.verify) { /* --ssd-cache-verify: every payload section too */
            kvt_ssd_file_info vi;
            st = kvt_ssd_read_file_info(path, true, &vi, NULL, 0, err, sizeof(err));
            if (st == KVT_OK) s->verified++;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0) memset(&sb, 0, sizeof(sb));
        close(fd);
        ssd_entry *e = NULL;
        if (st == KVT_OK && !idx_find(s, chain, group, kind)) {
            e = calloc(1, sizeof(*e));
            uint32_t nid = kind == KVT_SSD_KIND_SNAPSHOT ? 0 : h.info.n_tokens;
            if (e && nid) {
                e->tokens = malloc((size_t)nid * 4);
                if (!e->tokens) {
                    free(e);
                    e = NULL;
                } else {
                    for (uint32_t i = 0; i < nid; i++) e->tokens[i] = hdr_id_at(&h, i);
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
                if (!idx_add(s, e)) {
                    free(e->tokens);
                    free(e);
                }
            }
        } else if (st != KVT_OK) {
            KVT_WARN("ssd cache: removing %s: %s", path, err);
            unlink(path);
            s->corrupt_removed++;
        }
        free(buf);
    }
    closedir(d);
}

/* ------------------------------------------------------------------ lifecycle */
void kvt_ssd_opts_default(kvt_ssd_opts *o) {
    memset(o, 0, sizeof(*o));
    o->writeback = true;
    o->queue_max_bytes = SSD_DEFAULT_QUEUE;
}

/* mkdir 0700 (then chmod, regardless of umask) and fsync of the parent so the new entry survives
 * a power loss. Returns 0 if it exists or was created. */
static int mkdir_durable(const char *path) {
    if (mkdir(path, 0700) != 0) return errno == EEXIST ? 0 : -1;
    if (chmod(path, 0700) != 0) return -1;
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", path);
    char *sl = strrchr(parent, '/');
    if (sl == parent) sl[1] = 0;
    else if (sl) *sl = 0;
    else snprintf(parent, sizeof(parent), ".");
    return fsync_dir(parent) ? 0 : -1;
}

/* The informational KEY file: created exclusively, never through a planted (even dangling)
 * symlink, mode 0600. An existing KEY is left alone (it is never trusted anyway). */
static void write_key_file(const char *cdir, const char *compat) {
    char kp[PATH_MAX];
    snprintf(kp, sizeof(kp), "%s/KEY", cdir);
    int fd = open(kp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    if (fchmod(fd, 0600) == 0) {
        size_t n = strlen(compat);
        if (write(fd, compat, n) != (ssize_t)n || write(fd, "\n", 1) != 1) { /* best effort */
        }
    }
    close(fd);
}

static int mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir_durable(tmp) != 0) return -1;
            *p = '/';
        }
    }
    return mkdir_durable(tmp);
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
    atomic_store(&s->fault, (int)fault_from_env());
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    if (mkdir_p(s->cdir) != 0) {
        int e = errno;
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot create %s/%s: %s", o->dir, cd, strerror(e));
    }
    /* Untrusted directory: refuse a root or compat dir owned by someone else or writable by all;
     * the compat dir must not be a symlink (the root may be one: the user named it). */
    if (!dir_trusted(o->dir, true, err, errlen) || !dir_trusted(s->cdir, false, err, errlen)) {
        kvt_ssd_free(s);
        return KVT_ERR_IO;
    }
    /* Human-readable key next to the files (best effort; informational only). */
    write_key_file(s->cdir, s->compat);
    DIR *d = opendir(s->cdir);
    if (!d) {
        int e = errno;
        kvt_ssd_free(s);
        return kvt_errf(err, errlen, KVT_ERR_IO, "ssd cache: cannot list %s: %s", o->dir, strerror(e));
    }
    closedir(d);
    pthread_mutex_lock(&s->mu);
    scan_dir(s);
    /* A crash between publishing a longer file and removing the tails it supersedes leaves both:
     * finish that here. Downward, so a swap-remove only moves already-visited entries. */
    for (uint32_t i = s->n_ents; i-- > 0;)
        if (i < s->n_ents) supersede(s, s->ents[i]);
    enforce_cap(s);
    pthread_mutex_unlock(&s->mu);
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
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
            item_release(it);
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
    }
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
    if (s) atomic_store(&s->fault, (int)f);
}

/* ------------------------------------------------------------------ lookup */
/* Planning uses the shared planner (plan.h) over this tier's index, along the request's chain
 * (kvt_chain: no hashing here). Block indices [0, base) may be supplied by the caller (the RAM
 * tier's leading blocks in a mixed plan): the planner treats them as held in every group and the
 * restore reads nothing for them. */
typedef struct plan_idx {
    uint64_t chain, parent;
    uint32_t kind, n_tokens;
} plan_idx;

typedef struct plan {
    uint32_t p;          /* usable length (0 = miss) */
    uint32_t base;       /* block indices [0, base) come from the caller */
    uint32_t n_idx;      /* block indices of the restored sequence: ceil(p / bt) */
    plan_idx *idx;       /* n_idx (entries below base unused) */
    bool *need;          /* n_idx * n_groups: files to read */
    bool snap;           /* restore a snapshot at p */
    uint64_t snap_chain;
    int32_t *child_tokens; /* tokens of the file that supplies the last index (copy) */
} plan;

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
    for (ssd_entry *e = s->tab_link[link_hash(parent) % s->n_buckets]; e; e = e->next_link) {
        if (e->link != parent || e->kind == KVT_SSD_KIND_SNAPSHOT || e->index != j || e->group != 0 || e->n_tokens < m)
            continue;
        if (!tokens_eq(e->tokens, toks, m) || entry_groups(s, e->chain, e->kind, parent) != x->all) continue;
        if (!best || (e->n_tokens == m && best->n_tokens != m) || (best->n_tokens != m && e->n_tokens < best->n_tokens))
            best = e;
    }
    return best;
}

/* Builds the restore plan for the chain's prompt (index only). Lock held. False: out of memory. */
static bool build_plan(kvt_ssd *s, const kvt_chain *c, uint32_t base, plan *pl) {
    memset(pl, 0, sizeof(*pl));
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
        for (ssd_entry *e = s->tab_link[link_hash(hk) % s->n_buckets]; e; e = e->next_link) {
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
            ssd_entry *sn = idx_find(s, kvt_chain_at(c, i), SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
            if (!sn || sn->n_tokens != i * bt) continue;
            spos[ns] = i * bt;
            snaps[ns++] = sn;
        }
        for (uint32_t j = 0; j <= k && s->n_buckets; j++) {
            const uint64_t hj = kvt_chain_at(c, j);
            for (ssd_entry *e = s->tab_link[link_hash(hj) % s->n_buckets]; e; e = e->next_link) {
                if (e->link != hj || e->kind != KVT_SSD_KIND_TAIL || e->index != j || e->group != 0) continue;
                if ((uint64_t)j * bt + e->n_tokens > n || !tokens_eq(e->tokens, prompt + (size_t)j * bt, e->n_tokens)) continue;
                ssd_entry *sn = idx_find(s, e->chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT);
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

uint32_t kvt_ssd_find_from(kvt_ssd *s, const kvt_chain *c, uint32_t base_blocks) {
    if (!s || !c) return 0;
    plan pl;
    pthread_mutex_lock(&s->mu);
    bool ok = build_plan(s, c, base_blocks, &pl);
    pthread_mutex_unlock(&s->mu);
    uint32_t p = ok ? pl.p : 0;
    plan_free(&pl);
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

kvt_status kvt_ssd_restore_from(kvt_ssd *s, const kvt_chain *c, kvt_seq *base, kvt_seq **out, uint32_t *n_restored,
                                kvt_ssd_restore_info *info) {
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
        plan pl;
        pthread_mutex_lock(&s->mu);
        bool ok = build_plan(s, c, base_len / bt, &pl);
        pthread_mutex_unlock(&s->mu);
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
