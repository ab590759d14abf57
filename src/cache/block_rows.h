/*
 * block_rows.h — the row ranges of part of a KV block: where the first m token rows of every
 * layer section of one group's block lie. A block's sections are [layer][k/v][kv_head][token], so
 * tokens [0, m) of one head are one contiguous byte range, at kvt_kv_layout_row_offset(layer, index,
 * kv, 0, head). This is the one walk over those ranges: the RAM tier copies a partial block with it
 * (prompt_cache.c) and a compact tail record packs only those ranges, in this order (record.c).
 *
 * Pure functions over a borrowed layout; no allocation, no locking.
 */
#ifndef KVT_BLOCK_ROWS_H
#define KVT_BLOCK_ROWS_H

#include "../kv/kv.h"

/* One range: block_off = its offset in the block, compact_off = its offset when the ranges are
 * packed back to back in walk order, len = its bytes. */
typedef void (*kvt_block_rows_fn)(void *ctx, uint64_t block_off, uint64_t compact_off, uint64_t len);

/* Visits the ranges of rows [0, m) of group g's block at index bi in increasing block offset order
 * (empty sections, e.g. MLA's missing V, are skipped); fn may be NULL. Returns the packed size. */
uint64_t kvt_block_rows_walk(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, kvt_block_rows_fn fn, void *ctx);

/* Copies rows [0, m) of every section of src into dst (two blocks of the same group and index);
 * the other bytes of dst are left as they are. */
void kvt_block_rows_copy(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, const uint8_t *src, uint8_t *dst);

#endif
