/*
 * ssd_cache.h — the SSD tier: sealed KV blocks (full blocks and frozen partial tails, one file per
 * (chain hash, layer group)) and recurrent snapshots (one file per chain position) persisted under
 * <dir>/<compat-dir>/, with a write-behind queue, a byte cap (LRU, leaf-first), a startup scan that
 * rebuilds the in-memory index from file headers, and streamed, fully checksummed restore into the
 * block pool. The byte-exact file format and the crash semantics are in docs/cache-format.md.
 *
 * Identity: the compatibility key (model SHA-256 + scheme key + tokenizer hash + block size +
 * KVT_NUMERICS_VERSION, see kvt_ssd_compat_key) selects the directory <dir>/<compat-dir>, where
 * compat-dir = first 32 hex chars of SHA-256(compat key). Directories of other keys are never read
 * nor deleted. The namespace is inside the chain hashes (root = kvt_root_hash(compat, ns)), so it
 * needs no directory. Every file also carries the full compat key, checked on scan and on read.
 *
 * Safety: every checksum (header and payload) is verified on every read; a file that fails any
 * check is removed with a warning and the caller gets a shorter prefix or a miss — never wrong KV.
 * Disk errors (ENOSPC, EIO, read-only dir) never fail serving: they warn once and are counted.
 *
 * Ownership / threading: kvt_ssd borrows the layout and the pool (both must outlive it) and owns a
 * background writer thread. Every function is thread-safe (one internal mutex; file I/O of the
 * writer and of restore runs without it). Enqueue/spill functions create a record that retains the
 * block/snapshot until it is published, staged or shed under memory pressure, or the tier is freed,
 * so the data stays alive even if RAM lets go (a staged record keeps the file image instead); a
 * dropped or failed record stays dirty and is retried. No function but kvt_ssd_flush waits for the
 * writer.
 */
#ifndef KVT_SSD_CACHE_H
#define KVT_SSD_CACHE_H

#include "../kv/kv.h"
#include "record.h"

/* Bump when anything that changes KV numerics (kernels, rope, codecs) changes: old files then land
 * in another compat directory and are never reused. */
#define KVT_NUMERICS_VERSION 8 /* 3: attention rounds Q and softmax weights to f16; 4: qwen35 DeltaNet
                                  * FMA-chain numerics, transposed S/k state layout (deltanet.h); 5: the
                                  * SwiGLU of dense and MoE FFNs uses deltanet.c's vector SiLU; 6: Q8_0/Q8_1
                                  * activations round as ggml's CPU quantizer (kvt_act_quantize_ref),
                                  * attention's V product sums keys in 16 lanes (attention.c),
                                  * RoPE's float angles and fused rotation (model.c); 7: the norms' sums
                                  * of squares in eight running sums (kvt_sum_squares, model.c); 8:
                                  * GELU (gemma3's FFN) by the vector gelu_mul (kernels/vec.h) instead
                                  * of libm tanhf */
/* On-disk format version (docs/cache-format.md). */
#define KVT_SSD_FORMAT_VERSION KVT_RECORD_FORMAT_VERSION
#define KVT_SSD_COMPAT_KEY_MAX KVT_RECORD_COMPAT_KEY_MAX

typedef struct kvt_ssd kvt_ssd;

typedef struct kvt_ssd_opts {
    const char *dir;            /* cache root; created if missing */
    const char *compat_key;     /* from kvt_ssd_compat_key (any non-empty string for tests) */
    uint64_t max_bytes;         /* on-disk cap over this compat dir; 0 = unlimited */
    uint64_t queue_max_bytes;   /* write-behind queue bound in payload bytes; 0 = 256 MiB. When
                                   full, a record is not queued but stays dirty and is retried
                                   later (counted as dropped); enqueue never waits. */
    bool verify;                /* startup scan also checks every payload checksum (reads every
                                   file in full); bad files are removed. Restore always checks. */
    struct kvt_ssd_io *io;      /* file-mutation layer (cache/ssd_io.h), borrowed; NULL = real
                                   syscalls (tests pass a recording one for crash-state replay) */
} kvt_ssd_opts;
void kvt_ssd_opts_default(kvt_ssd_opts *o); /* queue 256 MiB */

/* ---- identity ---- */
/* SHA-256 (lowercase hex, 64 chars + NUL) of the file at model_path, memoized in
 * <cache_dir>/.model-ids keyed by realpath + inode + size + mtime(ns) so it is computed once per
 * file version. cache_dir may be NULL (no memo). */
kvt_status kvt_ssd_model_id(const char *cache_dir, const char *model_path, char out_hex[65],
                            char *err, size_t errlen);
/* Compatibility key string:
 *   "kvtier-ssd;model=<sha256>;scheme=<kvt_kv_layout_key>;tok=<tokenizer_hash>;bt=<block_tokens>;
 *    num=<N>;kern=<numerics_id>"
 * tokenizer_hash: any stable string identifying the tokenizer (e.g. hex hash of the vocab).
 * numerics_id: the kernel numerics actually in use (kvt_kernels_numerics_id(): ISA path and any
 * kernel option that changes results). The kernel paths are not bit-identical (different summation
 * order / FMA), so a directory shared by machines with different kernels never reuses KV computed
 * with other numerics. */
kvt_status kvt_ssd_compat_key(const char *cache_dir, const char *model_path,
                              const kvt_kv_layout *layout, const char *tokenizer_hash,
                              const char *numerics_id, char *out, size_t outlen, char *err, size_t errlen);
/* The directory name for a compat key: 32 lowercase hex chars + NUL. */
void kvt_ssd_compat_dir(const char *compat_key, char out[33]);

/* ---- lifecycle ---- */
/* Creates <dir>/<compat-dir> (0700, parents fsynced), scans it (header-only: rebuilds the index,
 * reaps stale *.tmp, skips non-regular files, removes corrupt or mismatching files with a warning),
 * enforces the cap, starts the writer thread. Fails (KVT_ERR_IO) if the directory cannot be
 * created or listed, or is not trusted: owned by another user or writable by others (the compat
 * dir must also not be a symlink). */
kvt_status kvt_ssd_open(const kvt_ssd_opts *o, const kvt_kv_layout *layout, kvt_block_pool *pool,
                        kvt_ssd **out, char *err, size_t errlen);
/* Stops the writer after its current item; queued-but-unwritten items are released (counted as
 * dropped). Call kvt_ssd_flush first for durability. NULL is a no-op. */
void kvt_ssd_free(kvt_ssd *ssd);
const char *kvt_ssd_dir(const kvt_ssd *ssd);        /* <dir>/<compat-dir> */
const char *kvt_ssd_compat(const kvt_ssd *ssd);     /* the compat key string */
const kvt_kv_layout *kvt_ssd_layout(const kvt_ssd *ssd); /* the borrowed layout */
/* Small metadata files in the compat directory (the pin list, pin_file.h), relative to the held
 * directory fd. write: atomic replace (exclusive temporary, write, fsync, close, rename, directory
 * fsync; an orphaned temporary is reaped by the next startup scan); any thread. read: a regular
 * file (never through a symlink) of at most max bytes into *out (malloc'd); KVT_ERR_NOT_FOUND when
 * absent, KVT_ERR_FORMAT when larger. Names are one path component. */
kvt_status kvt_ssd_meta_write(kvt_ssd *ssd, const char *name, const void *data, size_t len, char *err, size_t errlen);
kvt_status kvt_ssd_meta_read(kvt_ssd *ssd, const char *name, size_t max, uint8_t **out, size_t *len, char *err,
                             size_t errlen);

/* ---- lookup / restore ---- */
/* Longest usable prefix (tokens) of prompt[0..n) under root that the on-disk index can serve, capped
 * at n-1 (index only, no I/O, no side effects). Usability is the shared planner's (plan.h, the RAM
 * tier's too): FULL groups need every block; WINDOW groups need the blocks the final window sees;
 * RECURRENT layers need a snapshot exactly at the returned length. 0 = miss. */
uint32_t kvt_ssd_find(kvt_ssd *ssd, const int32_t *prompt, uint32_t n, uint64_t root);
/* Restores what kvt_ssd_find reports: streams one block at a time from disk into the pool (alloc,
 * read, verify checksums, seal with the expected chain hash), appends to a new sequence, trims to
 * the usable length and restores recurrent state. On a bad file it removes it and retries with the
 * next-best prefix. Result: *out = new sequence of *n_restored tokens (>0) or NULL/0 on a miss.
 * Errors: KVT_ERR_POOL_EXHAUSTED / KVT_ERR_NOMEM (no sequence returned). Bumps LRU, counts
 * restores and restore_ms_last. */
kvt_status kvt_ssd_restore(kvt_ssd *ssd, const int32_t *prompt, uint32_t n, uint64_t root,
                           kvt_seq **out, uint32_t *n_restored);
/* Over the request's chain (its hashes computed once, shared with the RAM tier and sealing), on top
 * of the caller's first base_blocks full blocks (a mixed plan: the RAM tier supplies them, in every
 * group the final length needs). find_from: the usable length the index can serve with those blocks
 * supplied (no I/O, no side effects; 0 = miss, and also when the index adds nothing beyond them).
 * restore_from: base is a sequence of the chain's first k full blocks (k*block_tokens tokens, its
 * tokens the chain's; NULL = none); *out = a new sequence that shares base's blocks and appends the
 * blocks k.. (and the snapshot) read from disk — only those are read. base is not modified (the
 * caller still frees it). A plan that cannot build on base (files removed since find_from) is a
 * miss. info (may be NULL) gets the files and payload bytes read from disk, also on a miss. */
typedef struct kvt_ssd_restore_info {
    uint64_t files_read;   /* block/tail files and snapshot files read */
    uint64_t bytes_read;   /* their payload bytes (headers not counted) */
    bool snapshot;         /* the recurrent state came from a snapshot file */
} kvt_ssd_restore_info;
uint32_t kvt_ssd_find_from(kvt_ssd *ssd, const kvt_chain *c, uint32_t base_blocks);
kvt_status kvt_ssd_restore_from(kvt_ssd *ssd, const kvt_chain *c, kvt_seq *base, kvt_seq **out, uint32_t *n_restored,
                                kvt_ssd_restore_info *info);
/* Plan once, restore with that plan (the tier manager's lookup: each tier is planned once per
 * lookup). kvt_ssd_plan_from is find_from that keeps its plan (*out, caller frees with
 * kvt_ssd_plan_free; NULL when out of memory). kvt_ssd_restore_plan is restore_from that executes
 * *pl (consuming it) when it was planned for base's length; it plans again only when it cannot use
 * *pl (planned for another base, or a file went bad during the restore). pl may be NULL. */
typedef struct kvt_ssd_plan kvt_ssd_plan;
uint32_t kvt_ssd_plan_from(kvt_ssd *ssd, const kvt_chain *c, uint32_t base_blocks, kvt_ssd_plan **out);
void kvt_ssd_plan_free(kvt_ssd_plan *pl); /* NULL is a no-op */
/* Plans built by this process (both tiers' lookups count them: tests check one plan per lookup). */
uint64_t kvt_ssd_plan_calls(void);
kvt_status kvt_ssd_restore_plan(kvt_ssd *ssd, const kvt_chain *c, kvt_seq *base, kvt_ssd_plan *pl, kvt_seq **out,
                                uint32_t *n_restored, kvt_ssd_restore_info *info);

/* ---- writes ---- */
/* Write-behind of one sealed block (full or frozen tail). root may be 0 (unknown). Whether
 * write-behind is on is the tier manager's switch (tier.h): the SSD tier persists what it is handed.
 * No-op returning true when the file already exists (idempotent). Never waits. Returns false if not
 * queued: the queue was full (the record stays dirty, retried later) or the tier is closing. Every
 * record retains its object until it is published, staged, shed or the tier freed (the state
 * machine and its invariants are at the top of ssd_writer.c). */
bool kvt_ssd_enqueue_block(kvt_ssd *ssd, kvt_block *b, uint64_t root);
/* Write-behind of every sealed block of a sequence (frozen tails included; an unfrozen tail is
 * skipped) plus snap if non-NULL. Returns the number of items newly queued. */
uint32_t kvt_ssd_enqueue_seq(kvt_ssd *ssd, const kvt_seq *seq, kvt_snapshot *snap);
/* Spill sinks with the kvt_spill_block_fn / kvt_spill_snapshot_fn signatures (ctx = kvt_ssd*):
 * persist, count `spills`, retain the object until written. */
bool kvt_ssd_spill_block(void *ctx, kvt_block *b);
bool kvt_ssd_spill_snapshot(void *ctx, kvt_snapshot *s);
/* Persist (no spill counted): what a flush with write-behind off uses
 * to write what the RAM tier holds. */
bool kvt_ssd_persist_block(void *ctx, kvt_block *b);
bool kvt_ssd_persist_snapshot(void *ctx, kvt_snapshot *s);
/* Memory pressure: walks the records (dirty first, then queued; never the one being written) until
 * `bytes` pool bytes were freed. A record whose block nothing else references is STAGED: the exact
 * bytes of its file are encoded into a heap buffer the record owns and the block is released at
 * once; the record stays owed (a flush is durable only once it is written) and the writer writes
 * the image later (counted in stats.staged). Staged images stay within the queue cap
 * (opts.queue_max_bytes); past it a record keeps its block. Dropped unwritten (counted in
 * stats.shed, and reported by the next flush as not durable) is only a record whose last 3 writes
 * failed (a failing disk), staged or holding its block alone, or one whose image could not be
 * allocated. Memory copies only: never waits for the disk. Snapshots are kept as they are.
 * Returns pool bytes freed. */
uint64_t kvt_ssd_shed(kvt_ssd *ssd, uint64_t bytes);
/* The engine counts idle demotions (spills caused by demotion) here, for stats. */
void kvt_ssd_note_demotions(kvt_ssd *ssd, uint64_t n);

/* ---- record buffers (the shared tier's values; same bytes as a cache file) ---- */
/* This tier's record model (record.h): its layout, pool and compat key (valid while the tier is). */
void kvt_ssd_record_fmt(const kvt_ssd *ssd, kvt_record_fmt *out);
/* Encodes a sealed block (full, or frozen tail in compact form) exactly as its cache file: header
 * with checksums, page-aligned payload. *out is malloc'd (caller frees). root as for enqueue. */
kvt_status kvt_ssd_record_encode(const kvt_ssd *ssd, kvt_block *b, uint64_t root, uint8_t **out, size_t *out_len);
/* The largest record of a kind (KVT_SSD_KIND_BLOCK or _TAIL: any block or tail of any group;
 * KVT_SSD_KIND_SNAPSHOT) this tier can encode: the shared tier refuses a value longer than this
 * before reading it. */
uint64_t kvt_ssd_record_max_bytes(const kvt_ssd *ssd, uint32_t kind);
/* Decodes and verifies a record of `kind` (KVT_SSD_KIND_BLOCK: expect = its chain hash;
 * KVT_SSD_KIND_TAIL: expect = its parent chain hash) for (group, block_index): header checksum,
 * compat key, geometry, chain hash of the tokens, payload checksum. On success *out is a new sealed
 * block from this tier's pool (caller owns the reference); the caller still compares its tokens
 * with the prompt. buf is modified temporarily (checksum field) and left as it was. Errors:
 * KVT_ERR_FORMAT / CORRUPT / STALE (bad or foreign record), POOL_EXHAUSTED, NOMEM. */
kvt_status kvt_ssd_record_decode(kvt_ssd *ssd, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect,
                                 uint32_t group, uint32_t block_index, kvt_block **out, char *err, size_t errlen);

/* Snapshots likewise (shared tier): encode a snapshot exactly as its file; decode verifies a record
 * for (chain, pos) — header checksum, compat key, layer geometry, position, every section checksum —
 * and only then writes the recurrent state to `state` (kvt_kv_layout_state_bytes bytes: the
 * RECURRENT layers' states in layer order, each at kvt_seq_state's layout). Errors as for
 * kvt_ssd_record_decode. */
kvt_status kvt_ssd_snapshot_record_encode(const kvt_ssd *ssd, kvt_snapshot *s, uint64_t root, uint8_t **out, size_t *out_len);
kvt_status kvt_ssd_snapshot_record_decode(kvt_ssd *ssd, uint8_t *buf, size_t len, uint64_t chain, uint32_t pos,
                                          uint8_t *state, char *err, size_t errlen);

/* ---- durability ---- */
typedef struct kvt_ssd_flush_result {
    bool durable;            /* no record created before the call is still owed (see below) */
    uint64_t entries;        /* files in the index after the flush */
    uint64_t pending_blocks; /* records of the flush's range still queued or in flight */
    uint64_t dropped;        /* records of the range dropped from a full queue, not yet rewritten, plus
                                records dropped unwritten under memory pressure since the last flush */
    uint64_t failed;         /* records of the range whose last write attempt failed */
    uint64_t records_written; /* records published while the flush waited */
    uint64_t longest_durable_prefix_tokens;
    double elapsed_ms;
    char reason[160];        /* why not durable (empty when durable) */
} kvt_ssd_flush_result;
/* Durability boundary. Covers every record created before the call: retries dirty ones at once
 * and waits (up to timeout_ms) until none of them is queued, in flight or dirty — or until every
 * remaining one has failed again during this call (then it answers at once instead of at the
 * timeout). durable = none of them is owed any more: each was published (tmp + fsync + rename +
 * dir fsync), a staged one included (its image written), and no record was dropped unwritten
 * under memory pressure since the previous flush (that flush reports them in `dropped`). A failed
 * record is reported by every flush until a retry publishes it, so a flush is never durable over
 * a hole. */
void kvt_ssd_flush(kvt_ssd *ssd, uint32_t timeout_ms, kvt_ssd_flush_result *out);

/* ---- stats ---- */
typedef struct kvt_ssd_stats {
    uint64_t entries, bytes, max_bytes;   /* files in the index, their on-disk bytes, cap */
    uint64_t restores, spills, demotions; /* restores returning > 0 tokens; spill-callback items */
    uint64_t pending_blocks, pending_bytes;
    uint64_t dropped, failed;             /* cumulative */
    uint64_t evictions, corrupt_removed;  /* cap evictions; bad files removed (scan or read) */
    uint64_t longest_durable_prefix_tokens; /* longest contiguous on-disk chain (tokens) */
    double restore_ms_last;
    uint64_t superseded;                  /* tail files removed because a longer file at the same
                                             position (same parent, extending tokens) was published */
    uint64_t dirty_records, dirty_bytes;  /* dropped/failed records awaiting a retry */
    uint64_t shed;                        /* records dropped unwritten under memory pressure (a
                                             failing disk, or no memory to stage them) */
    uint64_t staged;                      /* records staged under memory pressure: the image copied
                                             to the heap, the pool block released (cumulative) */
    uint64_t published;                   /* records published since open */
    uint64_t skipped_nonregular;          /* scan: cache-file names that were not regular files
                                             (symlinks, FIFOs, devices): never opened through */
    uint64_t lost_entries, dir_recreated; /* the directory was deleted while open: entries
                                             forgotten, directory recreated */
    uint64_t verified;                    /* payloads checked by the startup scan (opts.verify) */
    uint64_t read_bytes;                  /* payload bytes read from disk by restores (cumulative) */
} kvt_ssd_stats;
void kvt_ssd_stats_get(kvt_ssd *ssd, kvt_ssd_stats *out);

/* ---- fault injection (tests) ---- */
typedef enum kvt_ssd_fault {
    KVT_SSD_FAULT_NONE = 0,
    KVT_SSD_FAULT_ENOSPC = 1,      /* every write fails with ENOSPC */
    KVT_SSD_FAULT_SHORT_WRITE = 2, /* payload writes stop halfway but the file is published (torn) */
    KVT_SSD_FAULT_EIO_READ = 3,    /* payload reads during restore fail with EIO */
    KVT_SSD_FAULT_EIO_WRITE = 4,   /* every write fails with EIO (read-only dir as root) */
    KVT_SSD_FAULT_FSYNC_DIR = 5,   /* the directory fsync after rename fails (EIO) */
    KVT_SSD_FAULT_DIR_CHECK = 6,   /* the check that the directory path still names the held directory fails (EIO) */
} kvt_ssd_fault;
/* Overrides the process-wide fault, which defaults to env KVT_SSD_FAULT=
 * enospc|short-write|eio-read|eio-write|fsync-dir|dir-check (read at open). */
void kvt_ssd_set_fault(kvt_ssd *ssd, kvt_ssd_fault f);
/* Scheduled faults (tests): each write attempt fails with EIO with probability permille/1000,
 * drawn from a generator seeded with seed. 0 turns it off. */
void kvt_ssd_set_fault_rate(kvt_ssd *ssd, uint64_t seed, uint32_t permille);
/* The engine marks its decode loop busy: the writer then defers writes (bounded: a waiting flush, a
 * half-full queue or an item older than 2 s ends the deferral) so persistence does not compete with
 * the memory-bandwidth-bound token loop. */
void kvt_ssd_set_busy(kvt_ssd *ssd, bool busy);
/* Restore progress for terminal indicators: kvt_ssd_restore calls fn(ctx, tokens restored so far,
 * tokens being restored) on its calling thread after each restored block. NULL fn = none. Set it
 * while no restore runs. */
typedef void (*kvt_ssd_progress_fn)(void *ctx, uint32_t done, uint32_t total);
void kvt_ssd_set_progress(kvt_ssd *ssd, kvt_ssd_progress_fn fn, void *ctx);
/* Tests: pause/resume the writer thread (items stay queued, so queue bounds can be exercised). */
void kvt_ssd_pause_writer(kvt_ssd *ssd, bool paused);

/* ---- offline helpers (kvtier cache ls|inspect|verify) ---- */
typedef kvt_record_info kvt_ssd_file_info; /* record.h: the header of any cache file */
#define KVT_SSD_KIND_BLOCK KVT_RECORD_BLOCK
#define KVT_SSD_KIND_TAIL KVT_RECORD_TAIL
#define KVT_SSD_KIND_SNAPSHOT KVT_RECORD_SNAPSHOT
/* Reads and validates the header (magic, version, header checksum, internal consistency) of any
 * cache file. If verify_payload, also checks every section checksum (KVT_ERR_CORRUPT on mismatch).
 * tokens (may be NULL): receives up to max_tokens token ids. */
kvt_status kvt_ssd_read_file_info(const char *path, bool verify_payload, kvt_ssd_file_info *info,
                                  int32_t *tokens, uint32_t max_tokens, char *err, size_t errlen);
/* The same for path relative to the open directory dfd (never following a symlink at path). */
kvt_status kvt_ssd_read_file_info_at(int dfd, const char *path, bool verify_payload, kvt_ssd_file_info *info,
                                     int32_t *tokens, uint32_t max_tokens, char *err, size_t errlen);

#endif
