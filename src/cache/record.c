/* record.c — the self-checking record codec (see record.h and docs/cache-format.md). */
#include "record.h"
#include "block_rows.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void kvt_record_fmt_init(kvt_record_fmt *f, const kvt_kv_layout *layout, kvt_block_pool *pool, const char *compat) {
    memset(f, 0, sizeof *f);
    f->layout = layout;
    f->pool = pool;
    f->compat = compat;
    f->compat_hash = compat ? XXH3_64bits(compat, strlen(compat)) : 0;
    f->bt = kvt_kv_layout_block_tokens(layout);
    f->n_groups = kvt_kv_layout_n_groups(layout);
}

/* Expected per-layer records of the file for (group, block_index) or the snapshot (group NONE). */
static uint32_t expected_layers(const kvt_kv_layout *l, uint32_t group, uint32_t block_index,
                                kvt_record_layer *out) {
    uint32_t n = 0, nl = kvt_kv_layout_n_layers(l);
    for (uint32_t i = 0; i < nl; i++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(l, i);
        bool take = group == KVT_RECORD_GROUP_NONE ? d->kind == KVT_KIND_RECURRENT
                                            : kvt_kv_layout_layer_group(l, i) == group;
        if (!take) continue;
        kvt_record_layer *h = &out[n++];
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
    return KVT_RECORD_FIXED_HDR + align_up(compat_len, 8) + align_up((uint64_t)n_ids * 4, 8) +
           (uint64_t)n_layers * KVT_RECORD_LAYER_REC + (uint64_t)n_sections * KVT_RECORD_SECTION_REC;
}

/* Encodes the header into buf (size header_size(...)), checksum included. */
void kvt_record_header_encode(const kvt_record_hdr_in *h, uint8_t *buf, uint64_t hsize) {
    memset(buf, 0, hsize);
    uint32_t clen = (uint32_t)strlen(h->compat);
    memcpy(buf, KVT_RECORD_MAGIC, 8);
    put_u32(buf + 8, KVT_RECORD_FORMAT_VERSION);
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
    uint8_t *p = buf + KVT_RECORD_FIXED_HDR;
    memcpy(p, h->compat, clen);
    p += align_up(clen, 8);
    for (uint32_t i = 0; i < h->n_ids; i++) put_u32(p + 4 * i, (uint32_t)h->ids[i]);
    p += align_up((uint64_t)h->n_ids * 4, 8);
    for (uint32_t i = 0; i < h->n_layers; i++, p += KVT_RECORD_LAYER_REC) {
        const kvt_record_layer *L = &h->layers[i];
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
    for (uint32_t i = 0; i < h->n_sections; i++, p += KVT_RECORD_SECTION_REC) {
        put_u64(p, h->sections[i].offset);
        put_u64(p + 8, h->sections[i].length);
        put_u64(p + 16, h->sections[i].hash);
    }
    put_u64(buf + 16, XXH3_64bits(buf, hsize));
}

static kvt_record_layer layer_at(const kvt_record_hdr *h, uint32_t i) {
    const uint8_t *p = h->layers_raw + (size_t)i * KVT_RECORD_LAYER_REC;
    kvt_record_layer L;
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
kvt_record_section kvt_record_section_at(const kvt_record_hdr *h, uint32_t i) {
    const uint8_t *p = h->sections_raw + (size_t)i * KVT_RECORD_SECTION_REC;
    kvt_record_section s = {get_u64(p), get_u64(p + 8), get_u64(p + 16)};
    return s;
}
int32_t kvt_record_id_at(const kvt_record_hdr *h, uint32_t i) { return (int32_t)get_u32(h->ids_raw + 4 * (size_t)i); }

/* Validates a full header buffer of hsize bytes (already read) against itself (magic, version,
 * checksum, internal consistency, chain hash of the tokens). file_size bounds the sections. */
kvt_status kvt_record_header_decode(uint8_t *buf, uint64_t hsize, uint64_t file_size, kvt_record_hdr *h,
                                char *err, size_t errlen) {
    memset(h, 0, sizeof(*h));
    if (hsize < KVT_RECORD_FIXED_HDR || memcmp(buf, KVT_RECORD_MAGIC, 8) != 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "not a kvtier cache file (bad magic)");
    uint32_t ver = get_u32(buf + 8);
    if (ver != KVT_RECORD_FORMAT_VERSION)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "cache format version %u unsupported", ver);
    if (get_u32(buf + 12) != hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header length mismatch");
    uint64_t stored = get_u64(buf + 16);
    put_u64(buf + 16, 0);
    uint64_t calc = XXH3_64bits(buf, hsize);
    put_u64(buf + 16, stored);
    if (calc != stored)
        return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "header checksum mismatch (truncated or corrupt)");
    kvt_record_info *I = &h->info;
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
    if (clen == 0 || clen >= KVT_RECORD_COMPAT_KEY_MAX || n_ids > KVT_RECORD_MAX_TOKEN_IDS ||
        I->n_layers > KVT_MAX_LAYERS || I->n_sections > 2 * KVT_MAX_LAYERS + 1 ||
        I->block_tokens == 0 || I->block_tokens > KVT_RECORD_MAX_TOKEN_IDS)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header counts out of range");
    if (header_size(clen, n_ids, I->n_layers, I->n_sections) != hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header size inconsistent");
    memcpy(I->compat_key, buf + KVT_RECORD_FIXED_HDR, clen);
    I->compat_key[clen] = 0;
    if (strlen(I->compat_key) != clen || XXH3_64bits(I->compat_key, clen) != I->compat_hash)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "compat key hash mismatch");
    h->ids_raw = buf + KVT_RECORD_FIXED_HDR + align_up(clen, 8);
    h->layers_raw = h->ids_raw + align_up((uint64_t)n_ids * 4, 8);
    h->sections_raw = h->layers_raw + (size_t)I->n_layers * KVT_RECORD_LAYER_REC;
    switch (I->kind) {
    case KVT_RECORD_BLOCK:
        if (I->n_tokens != I->block_tokens || n_ids != I->n_tokens || I->group == KVT_RECORD_GROUP_NONE)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad block token count");
        break;
    case KVT_RECORD_TAIL:
        if (I->n_tokens == 0 || I->n_tokens >= I->block_tokens || n_ids != I->n_tokens ||
            I->group == KVT_RECORD_GROUP_NONE)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad tail token count");
        break;
    case KVT_RECORD_SNAPSHOT:
        if (n_ids != 0 || I->group != KVT_RECORD_GROUP_NONE || I->n_tokens == 0)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad snapshot header");
        break;
    default:
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "unknown entry kind %u", I->kind);
    }
    if (data_off % KVT_RECORD_PAGE || data_off < hsize)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "bad data offset");
    uint64_t cursor = data_off;
    for (uint32_t i = 0; i < I->n_sections; i++) {
        kvt_record_section s = kvt_record_section_at(h, i);
        uint64_t end;
        if (s.offset % KVT_RECORD_PAGE || s.offset < cursor || !kvt_add_ok(s.offset, s.length, &end) ||
            end > file_size)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "section %u out of bounds (truncated?)", i);
        cursor = end;
        I->payload_bytes += s.length;
    }
    if (I->kind != KVT_RECORD_SNAPSHOT) {
        int32_t *tmp = malloc((size_t)n_ids * 4 + 4);
        if (!tmp) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < n_ids; i++) tmp[i] = kvt_record_id_at(h, i);
        uint64_t c = kvt_chain_hash(I->parent, tmp, n_ids);
        free(tmp);
        if (c != I->chain) return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "chain hash does not match tokens");
    }
    return KVT_OK;
}

/* ------------------------------------------------------------------ compact tails */
/* A tail of m tokens stores only rows [0, m) of every section of its group's block, packed back to
 * back in the order of cache/block_rows.h (the walk the RAM tier copies partial blocks with). */
static uint64_t tail_bytes(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m) {
    return kvt_block_rows_walk(l, g, bi, m, NULL, NULL);
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
    kvt_block_rows_walk(l, g, bi, m, tail_pack_chunk, &t);
}

/* Expands a compact tail held at block[0, tail_bytes) in place into the block layout (rows >= m and
 * padding zeroed). In place works back to front: every chunk moves to a higher (or equal) offset,
 * and the source of an earlier chunk ends at or before the destination of a later one. */
bool kvt_record_tail_unpack(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, uint8_t *block,
                                uint64_t block_bytes) {
    uint64_t n = 0;
    for (uint32_t li = 0; li < kvt_kv_layout_group_n_layers(l, g); li++)
        n += 2ull * kvt_kv_layout_layer(l, kvt_kv_layout_group_layer(l, g, li))->n_kv_heads;
    tail_move_ctx t = {.block = block, .chunks = malloc((size_t)(n ? n : 1) * 3 * sizeof(uint64_t))};
    if (!t.chunks) return false;
    kvt_block_rows_walk(l, g, bi, m, tail_collect, &t);
    for (uint64_t i = t.n; i-- > 0;) {
        uint64_t bo = t.chunks[3 * i], co = t.chunks[3 * i + 1], len = t.chunks[3 * i + 2];
        if (bo < co || bo + len > block_bytes) { /* m beyond the block: a caller's bug, never a write */
            free(t.chunks);
            return false;
        }
        if (bo != co) memmove(block + bo, block + co, len);
    }
    free(t.chunks);
    tail_ctx z = {.block = block};
    kvt_block_rows_walk(l, g, bi, m, tail_zero_gap, &z);
    if (block_bytes > z.cursor) memset(block + z.cursor, 0, block_bytes - z.cursor);
    return true;
}

/* Checks a decoded header against this tier's key and layout (and against the name it came from). */
kvt_status kvt_record_check(const kvt_record_fmt *s, const kvt_record_hdr *h, uint64_t chain, uint32_t group,
                                 uint32_t kind, char *err, size_t errlen) {
    const kvt_record_info *I = &h->info;
    if (I->compat_hash != s->compat_hash || strcmp(I->compat_key, s->compat) != 0)
        return kvt_errf(err, errlen, KVT_ERR_STALE, "compat key mismatch");
    if (I->chain != chain || I->group != group || I->kind != kind)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "header disagrees with file name");
    if (I->block_tokens != s->bt) return kvt_errf(err, errlen, KVT_ERR_STALE, "block size mismatch");
    kvt_record_layer exp[KVT_MAX_LAYERS];
    uint32_t bi = kind == KVT_RECORD_SNAPSHOT ? 0 : I->block_index;
    if (kind != KVT_RECORD_SNAPSHOT) {
        if (group >= s->n_groups) return kvt_errf(err, errlen, KVT_ERR_STALE, "group out of range");
        if (bi == 0 && I->parent != I->root && I->root != 0)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "root/parent mismatch");
    }
    uint32_t ne = expected_layers(s->layout, group, bi, exp);
    if (ne != I->n_layers) return kvt_errf(err, errlen, KVT_ERR_STALE, "layer count mismatch");
    for (uint32_t i = 0; i < ne; i++) {
        kvt_record_layer L = layer_at(h, i);
        if (L.layer != exp[i].layer || L.kind != exp[i].kind || L.window != exp[i].window ||
            L.n_kv_heads != exp[i].n_kv_heads || L.head_dim_k != exp[i].head_dim_k ||
            L.head_dim_v != exp[i].head_dim_v || L.state_bytes != exp[i].state_bytes ||
            L.codec.kind != exp[i].codec.kind || L.codec.bits != exp[i].codec.bits ||
            L.codec.group_size != exp[i].codec.group_size || L.codec.scale_bf16 != exp[i].codec.scale_bf16)
            return kvt_errf(err, errlen, KVT_ERR_STALE, "layer %u geometry mismatch", i);
    }
    if (kind == KVT_RECORD_SNAPSHOT) {
        if (I->n_sections != ne) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section count");
        for (uint32_t i = 0; i < ne; i++)
            if (kvt_record_section_at(h, i).length != exp[i].state_bytes)
                return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section size");
    } else {
        uint64_t want = kind == KVT_RECORD_TAIL ? tail_bytes(s->layout, group, bi, I->n_tokens)
                                                  : kvt_kv_layout_block_bytes(s->layout, group, bi);
        if (I->n_sections != 1 || kvt_record_section_at(h, 0).length != want)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "block payload size mismatch");
    }
    return KVT_OK;
}

/* Fills r for a block b (full or frozen tail) or a snapshot sn. Caller frees r->packed. */
kvt_status kvt_record_prepare(const kvt_record_fmt *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, kvt_record_image *r) {
    memset(r, 0, sizeof(*r));
    kvt_record_hdr_in *h = &r->h;
    h->compat = s->compat;
    h->block_tokens = s->bt;
    if (b) {
        h->n_tokens = kvt_block_n_tokens(b);
        h->kind = h->n_tokens == s->bt ? KVT_RECORD_BLOCK : KVT_RECORD_TAIL;
        h->group = kvt_block_group(b);
        h->block_index = kvt_block_index(b);
        h->parent = kvt_block_parent(b);
        h->chain = kvt_block_hash(b);
        h->root = h->block_index == 0 ? h->parent : root;
        h->ids = kvt_block_tokens(b);
        h->n_ids = h->n_tokens;
        h->n_layers = expected_layers(s->layout, h->group, h->block_index, r->layers);
        h->n_sections = 1;
        if (h->kind == KVT_RECORD_TAIL) { /* compact: only the n_tokens rows of every head */
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
        h->kind = KVT_RECORD_SNAPSHOT;
        h->group = KVT_RECORD_GROUP_NONE;
        h->n_tokens = kvt_snapshot_pos(sn);
        h->block_index = h->n_tokens / s->bt;
        h->chain = kvt_snapshot_chain(sn);
        h->root = root;
        h->n_layers = expected_layers(s->layout, KVT_RECORD_GROUP_NONE, 0, r->layers);
        h->n_sections = h->n_layers;
        /* each layer's state sits at its layout offset (64-byte aligned), as restore reads it back
         * through kvt_seq_state: the sections are the layers' states, not a packed run */
        const uint8_t *d = kvt_snapshot_data(sn);
        for (uint32_t i = 0; i < h->n_layers; i++) {
            r->secs[i].length = r->layers[i].state_bytes;
            r->payload[i] = d + kvt_kv_layout_state_offset(s->layout, r->layers[i].layer);
        }
    }
    h->layers = r->layers;
    h->sections = r->secs;
    r->hsize = header_size((uint32_t)strlen(s->compat), h->n_ids, h->n_layers, h->n_sections);
    h->data_offset = align_up(r->hsize, KVT_RECORD_PAGE);
    uint64_t cur = h->data_offset;
    for (uint32_t i = 0; i < h->n_sections; i++) {
        r->secs[i].offset = cur;
        r->secs[i].hash = XXH3_64bits(r->payload[i], r->secs[i].length);
        cur = align_up(cur + r->secs[i].length, KVT_RECORD_PAGE);
    }
    r->fsize = cur;
    return KVT_OK;
}

/* ------------------------------------------------------------------ record buffers (shared tier) */
uint64_t kvt_record_max_bytes(const kvt_record_fmt *s, uint32_t kind) {
    if (!s) return 0;
    const uint32_t cl = (uint32_t)strlen(s->compat);
    kvt_record_layer ls[KVT_MAX_LAYERS];
    if (kind == KVT_RECORD_SNAPSHOT) {
        uint32_t n = expected_layers(s->layout, KVT_RECORD_GROUP_NONE, 0, ls);
        uint64_t sz = align_up(header_size(cl, 0, n, n), KVT_RECORD_PAGE);
        for (uint32_t i = 0; i < n; i++) sz += align_up(ls[i].state_bytes, KVT_RECORD_PAGE);
        return sz;
    }
    /* blocks and tails (a tail's compact payload is smaller than its block's): the largest over the
     * groups and both codec variants (before and after quant_start) */
    uint64_t best = 0;
    for (uint32_t g = 0; g < s->n_groups; g++) {
        uint32_t n = expected_layers(s->layout, g, 0, ls);
        uint64_t pay = KVT_MAX(kvt_kv_layout_block_bytes(s->layout, g, 0), kvt_kv_layout_block_bytes(s->layout, g, UINT32_MAX - 1));
        best = KVT_MAX(best, align_up(header_size(cl, s->bt, n, 1), KVT_RECORD_PAGE) + align_up(pay, KVT_RECORD_PAGE));
    }
    return best;
}

kvt_status kvt_record_encode(const kvt_record_fmt *s, kvt_block *b, uint64_t root, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!b || !kvt_block_sealed(b)) return KVT_ERR_INVALID_ARG;
    kvt_record_image rec;
    kvt_status st = kvt_record_prepare(s, b, NULL, root, &rec);
    if (st != KVT_OK) return st;
    uint8_t *buf = calloc(1, rec.fsize); /* zero padding between sections, as in a file */
    if (!buf) {
        free(rec.packed);
        return KVT_ERR_NOMEM;
    }
    kvt_record_header_encode(&rec.h, buf, rec.hsize);
    for (uint32_t i = 0; i < rec.h.n_sections; i++)
        memcpy(buf + rec.secs[i].offset, rec.payload[i], rec.secs[i].length);
    free(rec.packed);
    *out = buf;
    *out_len = rec.fsize;
    return KVT_OK;
}

/* The header of a record buffer (shared tier): bounded header length, then kvt_record_header_decode. */
static kvt_status record_header(uint8_t *buf, size_t len, kvt_record_hdr *h, char *err, size_t errlen) {
    if (len < KVT_RECORD_FIXED_HDR) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record shorter than a header");
    uint32_t hsize = get_u32(buf + 12);
    if (hsize < KVT_RECORD_FIXED_HDR || hsize > KVT_RECORD_MAX_HDR || hsize > len)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record header length out of range");
    return kvt_record_header_decode(buf, hsize, len, h, err, errlen);
}

kvt_status kvt_record_decode(const kvt_record_fmt *s, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect,
                                 uint32_t group, uint32_t block_index, kvt_block **out, char *err, size_t errlen) {
    *out = NULL;
    if (kind != KVT_RECORD_BLOCK && kind != KVT_RECORD_TAIL)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "only blocks and tails travel as records");
    kvt_record_hdr h;
    kvt_status st = record_header(buf, len, &h, err, errlen);
    if (st != KVT_OK) return st;
    const kvt_record_info *I = &h.info;
    /* identity first: the name check of kvt_record_check is replaced by the caller's expectation */
    st = kvt_record_check(s, &h, I->chain, group, kind, err, errlen);
    if (st != KVT_OK) return st;
    if (I->block_index != block_index) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record block index mismatch");
    if (kind == KVT_RECORD_BLOCK ? I->chain != expect : I->parent != expect)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record key mismatch");
    kvt_record_section sc = kvt_record_section_at(&h, 0);
    if (align_up(sc.offset + sc.length, KVT_RECORD_PAGE) != len) /* exactly the file image: no trailing bytes */
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record length mismatch");
    if (XXH3_64bits(buf + sc.offset, sc.length) != sc.hash)
        return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "payload checksum mismatch");
    kvt_block *b = NULL;
    st = kvt_block_alloc(s->pool, group, block_index, &b);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "no pool memory for a fetched block");
    if (sc.length > kvt_block_data_bytes(b)) { /* kvt_record_check makes this impossible */
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "payload larger than the block");
    }
    uint8_t *dst = kvt_block_data_mut(b);
    memcpy(dst, buf + sc.offset, sc.length);
    if (kind == KVT_RECORD_TAIL &&
        !kvt_record_tail_unpack(s->layout, group, block_index, I->n_tokens, dst, kvt_block_data_bytes(b))) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    int32_t *ids = malloc((size_t)I->n_tokens * 4 + 4);
    if (!ids) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    for (uint32_t t = 0; t < I->n_tokens; t++) ids[t] = kvt_record_id_at(&h, t);
    st = kvt_block_seal(b, I->parent, ids, I->n_tokens, I->chain);
    free(ids);
    if (st != KVT_OK) {
        kvt_block_release(b);
        return kvt_errf(err, errlen, st, "seal failed: %s", kvt_status_str(st));
    }
    *out = b;
    return KVT_OK;
}

/* ---- shared tier (issue 17): recurrent-state snapshots as record buffers -------------------
 * Same bytes as a snapshot file; the same header checks as load_snapshot, every section checksum
 * verified before any byte reaches the sequence. */
kvt_status kvt_record_snapshot_encode(const kvt_record_fmt *s, kvt_snapshot *sn, uint64_t root, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!sn || kvt_snapshot_pos(sn) == 0 || kvt_kv_layout_state_bytes(s->layout) == 0) return KVT_ERR_INVALID_ARG;
    kvt_record_image rec;
    kvt_status st = kvt_record_prepare(s, NULL, sn, root, &rec);
    if (st != KVT_OK) return st;
    uint8_t *buf = calloc(1, rec.fsize);
    if (!buf) {
        free(rec.packed);
        return KVT_ERR_NOMEM;
    }
    kvt_record_header_encode(&rec.h, buf, rec.hsize);
    for (uint32_t i = 0; i < rec.h.n_sections; i++) memcpy(buf + rec.secs[i].offset, rec.payload[i], rec.secs[i].length);
    free(rec.packed);
    *out = buf;
    *out_len = rec.fsize;
    return KVT_OK;
}

kvt_status kvt_record_snapshot_decode(const kvt_record_fmt *s, uint8_t *buf, size_t len, uint64_t chain, uint32_t pos,
                                          uint8_t *state, char *err, size_t errlen) {
    if (kvt_kv_layout_state_bytes(s->layout) == 0) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "no recurrent layers");
    kvt_record_hdr h;
    kvt_status st = record_header(buf, len, &h, err, errlen);
    if (st != KVT_OK) return st;
    st = kvt_record_check(s, &h, chain, KVT_RECORD_GROUP_NONE, KVT_RECORD_SNAPSHOT, err, errlen);
    if (st != KVT_OK) return st;
    if (h.info.n_tokens != pos) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot position mismatch");
    const uint32_t ns = h.info.n_sections;
    if (ns == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot without sections");
    kvt_record_section last = kvt_record_section_at(&h, ns - 1);
    if (align_up(last.offset + last.length, KVT_RECORD_PAGE) != len) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record length mismatch");
    for (uint32_t i = 0; i < ns; i++) {
        kvt_record_section sc = kvt_record_section_at(&h, i);
        if (XXH3_64bits(buf + sc.offset, sc.length) != sc.hash)
            return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "snapshot section %u checksum mismatch", i);
    }
    uint32_t sec = 0, nl = kvt_kv_layout_n_layers(s->layout);
    for (uint32_t l = 0; l < nl; l++) { /* sections in layer order, as load_snapshot reads them */
        const kvt_layer_desc *d = kvt_kv_layout_layer(s->layout, l);
        if (d->kind != KVT_KIND_RECURRENT) continue;
        if (sec >= ns) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section count");
        kvt_record_section sc = kvt_record_section_at(&h, sec++);
        const size_t off = kvt_kv_layout_state_offset(s->layout, l); /* the layer's aligned slot */
        if (sc.length != d->state_bytes || off + sc.length > kvt_kv_layout_state_bytes(s->layout))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section size");
        memcpy(state + off, buf + sc.offset, sc.length);
    }
    return KVT_OK;
}
