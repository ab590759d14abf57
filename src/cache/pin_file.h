/*
 * pin_file.h — the pin list file (<compat-dir>/PINS): the pinned prefixes a server keeps warm
 * (docs/tiers.md, "Pinned prefixes"). A pure codec: the tier manager writes it through the SSD tier
 * (kvt_ssd_meta_write: temporary file, fsync, rename, directory fsync, relative to the held compat
 * directory) and reads it back at startup; `kvtier cache ls --pinned` reads it too.
 *
 * Format (little-endian): "KVTPINS1", u32 version (1), u32 count, then per pin: u64 id,
 * i64 created (unix s), i64 expires (unix s, 0 = no ttl), u32 ns_len, u32 n_tokens, ns bytes,
 * n_tokens i32 token ids; then u64 XXH3 of every byte before it. The file is untrusted input:
 * decode checks the magic, version, every length against the limits below and the bytes left, and
 * the checksum, before it allocates anything sized by the file.
 *
 * Ownership: decode returns malloc'd records (kvt_pin_recs_free); encode a malloc'd buffer.
 */
#ifndef KVT_PIN_FILE_H
#define KVT_PIN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "../util/common.h"

#define KVT_PIN_FILE "PINS"
#define KVT_PIN_MAX 4096               /* pins per server */
#define KVT_PIN_MAX_NS 256             /* namespace bytes */
#define KVT_PIN_MAX_TOKENS (1u << 22)  /* tokens of one pinned prefix */
#define KVT_PIN_FILE_MAX (64u << 20)   /* bytes of the whole file */

typedef struct kvt_pin_rec {
    uint64_t id;      /* kvt_pin_id */
    int64_t created;  /* unix seconds */
    int64_t expires;  /* unix seconds; 0 = pinned until unpinned */
    char *ns;         /* namespace, NUL-terminated ("" = none) */
    int32_t *tokens;
    uint32_t n_tokens;
} kvt_pin_rec;

/* The id of a pinned prefix: its tokens under its root (compat key + namespace). */
uint64_t kvt_pin_id(uint64_t root, const int32_t *tokens, uint32_t n);
kvt_status kvt_pin_file_encode(const kvt_pin_rec *v, uint32_t n, uint8_t **out, size_t *len);
/* Errors: KVT_ERR_FORMAT / KVT_ERR_CORRUPT with a message naming the problem; KVT_ERR_NOMEM. */
kvt_status kvt_pin_file_decode(const uint8_t *buf, size_t len, kvt_pin_rec **out, uint32_t *n, char *err, size_t errlen);
void kvt_pin_recs_free(kvt_pin_rec *v, uint32_t n);

#endif
