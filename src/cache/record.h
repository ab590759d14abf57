/*
 * record.h — the self-checking record codec of the KV tiers: one sealed block (a full block, or a
 * frozen tail in compact form) or one recurrent-state snapshot as a self-describing byte image.
 * The SSD tier writes an image as one file (ssd_writer.c) and reads it back section by section
 * (ssd_restore.c); the shared tier stores it as one Redis value (shared_tier.c). The byte-exact
 * layout is docs/cache-format.md:
 *
 *   header   magic, version, header length, header checksum (XXH3 over the header with the field
 *            zeroed), kind, group, block index, token count, block size, parent / chain / root
 *            hashes, the compat key and its hash, the token ids, one record per layer (geometry and
 *            codec) and one per payload section (offset, length, XXH3);
 *   payload  page-aligned sections: a block's (or compact tail's) bytes, or one section per
 *            RECURRENT layer's state.
 *
 * Checks on decode, all before a byte of payload reaches a block or a state: header checksum and
 * internal consistency, chain hash of the token ids, compat key, the layer geometry this layout
 * expects (kvt_record_check), the caller's expected identity, exact length, payload checksums.
 *
 * A kvt_record_fmt describes one model's records: it borrows the layout, the pool (decoded blocks
 * are allocated from it) and the compat key string, which must outlive every call that is given
 * the fmt. Every function is pure apart from the pool allocation: thread-safe.
 */
#ifndef KVT_RECORD_H
#define KVT_RECORD_H

#include "../kv/kv.h"

#include <time.h>

#define KVT_RECORD_FORMAT_VERSION 2 /* 2: tails store only their rows (compact) */
#define KVT_RECORD_COMPAT_KEY_MAX 512
#define KVT_RECORD_BLOCK 1u    /* kinds */
#define KVT_RECORD_TAIL 2u
#define KVT_RECORD_SNAPSHOT 3u
#define KVT_RECORD_MAGIC "KVTIERKV"
#define KVT_RECORD_PAGE 4096u
#define KVT_RECORD_FIXED_HDR 112u
#define KVT_RECORD_LAYER_REC 40u
#define KVT_RECORD_SECTION_REC 32u
#define KVT_RECORD_MAX_HDR (4u << 20)
#define KVT_RECORD_MAX_TOKEN_IDS (1u << 20)
#define KVT_RECORD_GROUP_NONE 0xFFFFFFFFu /* a snapshot's group */

/* ---- little-endian helpers (the format is little-endian on every host) ---- */
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

/* ---- the model a record belongs to ---- */
typedef struct kvt_record_fmt {
    const kvt_kv_layout *layout; /* borrowed */
    kvt_block_pool *pool;        /* borrowed: decoded blocks come from it (NULL: encode only) */
    const char *compat;          /* borrowed compat key string */
    uint64_t compat_hash;        /* XXH3 of compat */
    uint32_t bt, n_groups;
} kvt_record_fmt;
void kvt_record_fmt_init(kvt_record_fmt *f, const kvt_kv_layout *layout, kvt_block_pool *pool, const char *compat);

/* ---- whole images (the shared tier's values; same bytes as a cache file) ---- */
/* The largest image of a kind (KVT_RECORD_BLOCK or _TAIL: any block or tail of any group;
 * KVT_RECORD_SNAPSHOT) this model can produce: a reader refuses a longer value before reading it. */
uint64_t kvt_record_max_bytes(const kvt_record_fmt *f, uint32_t kind);
/* Encodes a sealed block (full, or frozen tail in compact form) exactly as its cache file. *out is
 * malloc'd (caller frees). root: the namespace root hash (block index 0 carries its parent). */
kvt_status kvt_record_encode(const kvt_record_fmt *f, kvt_block *b, uint64_t root, uint8_t **out, size_t *out_len);
/* Decodes and verifies an image of `kind` (KVT_RECORD_BLOCK: expect = its chain hash;
 * KVT_RECORD_TAIL: expect = its parent chain hash) for (group, block_index). On success *out is a
 * new sealed block from f->pool (caller owns the reference); the caller still compares its tokens
 * with the prompt. buf is modified temporarily (checksum field) and left as it was. Errors:
 * KVT_ERR_FORMAT / CORRUPT / STALE (bad or foreign record), POOL_EXHAUSTED, NOMEM. */
kvt_status kvt_record_decode(const kvt_record_fmt *f, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect,
                             uint32_t group, uint32_t block_index, kvt_block **out, char *err, size_t errlen);
/* Snapshots likewise: decode verifies an image for (chain, pos) and only then writes the recurrent
 * state to `state` (kvt_kv_layout_state_bytes bytes, each RECURRENT layer's state at its
 * kvt_kv_layout_state_offset, as kvt_seq_state lays it out). */
kvt_status kvt_record_snapshot_encode(const kvt_record_fmt *f, kvt_snapshot *s, uint64_t root, uint8_t **out, size_t *out_len);
kvt_status kvt_record_snapshot_decode(const kvt_record_fmt *f, uint8_t *buf, size_t len, uint64_t chain, uint32_t pos,
                                      uint8_t *state, char *err, size_t errlen);

/* ---- the parts, for the SSD tier (which writes and reads an image section by section) ---- */
/* Header fields as decoded (kvtier cache ls|inspect|verify print them). */
typedef struct kvt_record_info {
    uint32_t version;
    uint32_t kind;          /* KVT_RECORD_BLOCK / _TAIL / _SNAPSHOT */
    uint32_t group, block_index, n_tokens, block_tokens, n_layers, n_sections;
    uint64_t parent, chain, root, compat_hash;
    char compat_key[KVT_RECORD_COMPAT_KEY_MAX];
    uint64_t payload_bytes; /* sum of section lengths */
    uint64_t file_bytes;
} kvt_record_info;

typedef struct kvt_record_layer {
    uint32_t layer, kind, window, n_kv_heads, head_dim_k, head_dim_v, state_bytes;
    kvt_codec codec;
} kvt_record_layer;

typedef struct kvt_record_section {
    uint64_t offset, length, hash;
} kvt_record_section;

/* A header to encode; the pointers are borrowed for the call. */
typedef struct kvt_record_hdr_in {
    uint32_t kind, group, block_index, n_tokens, block_tokens;
    uint64_t parent, chain, root;
    const char *compat;
    const int32_t *ids;
    uint32_t n_ids;
    const kvt_record_layer *layers;
    uint32_t n_layers;
    const kvt_record_section *sections;
    uint32_t n_sections;
    uint64_t data_offset;
} kvt_record_hdr_in;

/* A decoded header; the pointers reference the buffer it was decoded from. */
typedef struct kvt_record_hdr {
    kvt_record_info info;
    const uint8_t *ids_raw;
    const uint8_t *layers_raw;
    const uint8_t *sections_raw;
} kvt_record_hdr;

/* One image being encoded: header fields, payload pointers (borrowed from the block or snapshot,
 * or `packed`) and its byte sizes (hsize header, fsize whole image). */
typedef struct kvt_record_image {
    kvt_record_hdr_in h;
    kvt_record_layer layers[KVT_MAX_LAYERS];
    kvt_record_section secs[KVT_MAX_LAYERS];
    const uint8_t *payload[KVT_MAX_LAYERS];
    uint8_t *packed; /* compact tail payload (owned), or NULL */
    uint64_t hsize, fsize;
} kvt_record_image;

/* Fills r for a block b (full or frozen tail) or a snapshot sn. Caller frees r->packed. */
kvt_status kvt_record_prepare(const kvt_record_fmt *f, kvt_block *b, kvt_snapshot *sn, uint64_t root, kvt_record_image *r);
/* Encodes the header into buf (hsize bytes), checksum included. */
void kvt_record_header_encode(const kvt_record_hdr_in *h, uint8_t *buf, uint64_t hsize);
/* Validates a whole header buffer of hsize bytes against itself (magic, version, checksum, internal
 * consistency, chain hash of the tokens); file_size bounds the sections. */
kvt_status kvt_record_header_decode(uint8_t *buf, uint64_t hsize, uint64_t file_size, kvt_record_hdr *h, char *err,
                                    size_t errlen);
/* Checks a decoded header against this model (compat key, block size, layer geometry, payload
 * sizes) and against the identity the caller expects (chain, group, kind). */
kvt_status kvt_record_check(const kvt_record_fmt *f, const kvt_record_hdr *h, uint64_t chain, uint32_t group, uint32_t kind,
                            char *err, size_t errlen);
kvt_record_section kvt_record_section_at(const kvt_record_hdr *h, uint32_t i);
int32_t kvt_record_id_at(const kvt_record_hdr *h, uint32_t i);
/* Expands a compact tail of m tokens held at block[0, compact bytes) in place into the block layout
 * (rows >= m and padding zeroed). False: no memory. */
bool kvt_record_tail_unpack(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, uint8_t *block, uint64_t block_bytes);

#endif
