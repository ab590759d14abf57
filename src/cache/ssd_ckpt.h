/*
 * ssd_ckpt.h — generation checkpoint records on the SSD tier (issue 10 item 4, docs/cache-format.md
 * "Checkpoint records"). A checkpoint says: for the request whose key digest is K, n_emitted tokens
 * were already streamed to the client, `pending` was sampled next (not yet emitted) and the
 * sampler's RNG stood at `rng` after drawing it. The KV of the emitted prefix travels as ordinary
 * block records of the SSD tier; this store holds only the small record, one file per request key:
 *
 *   <compat-dir>/ckpt/<first 32 hex chars of K>.kvc
 *
 * Writes are write-behind on this store's own thread (never the caller's): a newer record for the
 * same key replaces a queued older one, and is published with tmp (O_CREAT|O_EXCL|O_NOFOLLOW, 0600,
 * unique per process) + fsync + rename + directory fsync, so the previous file stays valid until
 * the new one is published. An invalidation is queued behind any write of the same key and removes
 * the file (and cancels the queued write). Loads verify everything (size, magic, version, XXH3
 * checksum, compat key, key digest, bounds); a bad file is removed with a warning, never used.
 *
 * The store never retries a failed publish itself (the record it holds may be stale by then): it
 * reports each queued record's outcome through a watch (kvt_ckpt_watch), and the request that
 * saved it keeps its checkpoint dirty and saves a fresh one with back-off (src/engine/checkpoint.h)
 * while it lives. A failed or dropped record never touches the previous file.
 *
 * Fault injection (tests): kvt_ckpt_store_fail_writes, or env KVT_CKPT_FAIL_WRITES=N read at
 * open: the next N record writes fail with EIO after the temporary was created (it is removed;
 * the published file is untouched).
 *
 * Ownership / threading: kvt_ckpt_store owns its writer thread and queued records (copies of the
 * caller's data). A watch is refcounted: the saver and the queued item each hold one reference;
 * the saver releases its own with kvt_ckpt_watch_release. Every function is thread-safe; reading a
 * watch's state is one atomic load (safe on the token loop). Free drains the queue (bounded wait)
 * first.
 */
#ifndef KVT_SSD_CKPT_H
#define KVT_SSD_CKPT_H

#include "../util/common.h"

#define KVT_CKPT_FORMAT_VERSION 1
#define KVT_CKPT_MAX_EMITTED (1u << 22) /* bounds an untrusted record (4M tokens) */

typedef struct kvt_ckpt_store kvt_ckpt_store;

/* One checkpoint record. emitted is owned by whoever filled it (kvt_ckpt_store_load: malloc'd). */
typedef struct kvt_ckpt_rec {
    uint8_t key[32];     /* request key digest (SHA-256) */
    uint32_t n_prompt;
    uint32_t n_emitted;
    int32_t pending;     /* sampled, not yet emitted */
    uint64_t rng;        /* sampler RNG state after drawing `pending` */
    int32_t *emitted;    /* n_emitted token ids */
} kvt_ckpt_rec;

/* Opens (creating 0700, parent fsynced) <cdir>/ckpt, refusing a symlink, another user's directory
 * or one writable by others; reaps stale temporaries (same rule as the SSD tier: not a live
 * process's, or older than an hour); starts the writer. compat: the SSD tier's compat key. */
kvt_status kvt_ckpt_store_open(const char *cdir, const char *compat, kvt_ckpt_store **out, char *err, size_t errlen);
void kvt_ckpt_store_free(kvt_ckpt_store *s); /* flushes (up to 10 s) then stops; NULL is a no-op */

/* The outcome of one queued record. */
typedef struct kvt_ckpt_watch kvt_ckpt_watch;
typedef enum kvt_ckpt_outcome {
    KVT_CKPT_QUEUED = 0,    /* queued or being written */
    KVT_CKPT_PUBLISHED = 1, /* the file now holds this record */
    KVT_CKPT_FAILED = 2,    /* the write failed (the previous file is untouched), or the store closed first */
    KVT_CKPT_REPLACED = 3,  /* a newer save or an invalidation of the same key took its queue slot */
} kvt_ckpt_outcome;
kvt_ckpt_outcome kvt_ckpt_watch_state(const kvt_ckpt_watch *w);
void kvt_ckpt_watch_release(kvt_ckpt_watch *w); /* NULL is a no-op */

/* Queues rec for publication (copies it). Never waits for the disk. Returns false when not queued
 * (queue over its byte bound, out of memory, closing): counted in stats.dropped. watch (may be
 * NULL): on success receives a new watch of this record (caller releases it), else NULL. */
bool kvt_ckpt_store_save(kvt_ckpt_store *s, const kvt_ckpt_rec *rec, kvt_ckpt_watch **watch);
/* Queues removal of key's record (after any queued write of it, which is cancelled). */
void kvt_ckpt_store_invalidate(kvt_ckpt_store *s, const uint8_t key[32]);
/* Loads key's record: the newest queued one if any, else the file. The file must match the compat
 * key, the key digest and n_prompt, hold ids < n_vocab and n_emitted < max_emitted. A file failing
 * any check is removed (stats.corrupt). Returns true and fills *out (out->emitted malloc'd; caller
 * frees) or false (miss). */
bool kvt_ckpt_store_load(kvt_ckpt_store *s, const uint8_t key[32], uint32_t n_prompt, uint32_t n_vocab,
                         uint32_t max_emitted, kvt_ckpt_rec *out);
/* Waits (up to timeout_ms) until nothing is queued or being written. True if drained. */
bool kvt_ckpt_store_flush(kvt_ckpt_store *s, uint32_t timeout_ms);

typedef struct kvt_ckpt_stats {
    uint64_t written;     /* records published */
    uint64_t invalidated; /* records removed (completed requests) */
    uint64_t resumed;     /* loads that returned a record (kvt_ckpt_store_note_resumed) */
    uint64_t failed;      /* publish attempts that failed (disk error) */
    uint64_t dropped;     /* saves not queued */
    uint64_t retried;     /* saves made early to replace a failed or dropped record (note_retry) */
    uint64_t resume_reused_tokens; /* resumes: tokens of prompt ++ emitted the tiers supplied */
    uint64_t corrupt;     /* bad files removed */
    uint64_t pending;     /* queued now */
} kvt_ckpt_stats;
void kvt_ckpt_store_stats(kvt_ckpt_store *s, kvt_ckpt_stats *out);
void kvt_ckpt_store_note_resumed(kvt_ckpt_store *s);
void kvt_ckpt_store_note_retry(kvt_ckpt_store *s);
void kvt_ckpt_store_note_resume_reused(kvt_ckpt_store *s, uint32_t tokens);
/* Tests: pause/resume the writer (queued items stay queued). */
void kvt_ckpt_store_pause(kvt_ckpt_store *s, bool paused);
/* Tests: the next n record writes fail (EIO). */
void kvt_ckpt_store_fail_writes(kvt_ckpt_store *s, uint32_t n);

/* Offline (kvtier cache verify): reads and fully checks one checkpoint file (everything but the
 * request-specific fields). compat_out (may be NULL, >= 512 bytes) receives its compat key. */
kvt_status kvt_ckpt_file_check(const char *path, kvt_ckpt_rec *info, char *compat_out, size_t compat_len, char *err,
                               size_t errlen);
/* The file name (without directory) for a key: 32 hex chars + ".kvc". */
void kvt_ckpt_file_name(const uint8_t key[32], char out[40]);

#endif
