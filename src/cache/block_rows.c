/* block_rows.c — see block_rows.h. */
#include "block_rows.h"

#include <string.h>

uint64_t kvt_block_rows_walk(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, kvt_block_rows_fn fn, void *ctx) {
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

typedef struct copy_ctx {
    const uint8_t *src;
    uint8_t *dst;
} copy_ctx;

static void copy_range(void *ctx, uint64_t block_off, uint64_t compact_off, uint64_t len) {
    copy_ctx *c = ctx;
    (void)compact_off;
    memcpy(c->dst + block_off, c->src + block_off, len);
}

void kvt_block_rows_copy(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, const uint8_t *src, uint8_t *dst) {
    copy_ctx c = {src, dst};
    kvt_block_rows_walk(l, g, bi, m, copy_range, &c);
}
