/* ssd_format.c — the SSD tier, file format: names, header encode/decode, compact tails, record
 * images. See ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

/* ------------------------------------------------------------------ names */
void entry_name(char *buf, size_t n, uint64_t chain, uint32_t group, uint32_t kind) {
    if (kind == KVT_SSD_KIND_SNAPSHOT)
        snprintf(buf, n, "%016llx.kvs", (unsigned long long)chain);
    else
        snprintf(buf, n, "%016llx-g%u.%s", (unsigned long long)chain, group,
                 kind == KVT_SSD_KIND_BLOCK ? "kvb" : "kvt");
}

/* Parses a file name into (chain, group, kind); false if it is not one of ours. */
bool parse_name(const char *name, uint64_t *chain, uint32_t *group, uint32_t *kind) {
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

/* Encodes the header into buf (size header_size(...)), checksum included. */
void header_encode(const hdr_in *h, uint8_t *buf, uint64_t hsize) {
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
hdr_section hdr_section_at(const hdr_out *h, uint32_t i) {
    const uint8_t *p = h->sections_raw + (size_t)i * SSD_SECTION_REC;
    hdr_section s = {get_u64(p), get_u64(p + 8), get_u64(p + 16)};
    return s;
}
int32_t hdr_id_at(const hdr_out *h, uint32_t i) { return (int32_t)get_u32(h->ids_raw + 4 * (size_t)i); }

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
int64_t read_upto(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
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
kvt_status header_read_any(int fd, bool direct, uint8_t **bufp, hdr_out *h, int *errno_out, char *err,
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

kvt_status header_read_fd(int fd, uint8_t **bufp, hdr_out *h, char *err, size_t errlen) {
    return header_read_any(fd, false, bufp, h, NULL, err, errlen);
}

kvt_status read_full(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
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
bool tail_unpack_inplace(const kvt_kv_layout *l, uint32_t g, uint32_t bi, uint32_t m, uint8_t *block,
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
kvt_status header_matches(const kvt_ssd *s, const hdr_out *h, uint64_t chain, uint32_t group,
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

/* Fills r for a block b (full or frozen tail) or a snapshot sn. Caller frees r->packed. */
kvt_status record_prepare(const kvt_ssd *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, ssd_record *r) {
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

/* The header of a record buffer (shared tier): bounded header length, then header_decode. */
static kvt_status record_header(uint8_t *buf, size_t len, hdr_out *h, char *err, size_t errlen) {
    if (len < SSD_FIXED_HDR) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record shorter than a header");
    uint32_t hsize = get_u32(buf + 12);
    if (hsize < SSD_FIXED_HDR || hsize > SSD_MAX_HDR || hsize > len)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record header length out of range");
    return header_decode(buf, hsize, len, h, err, errlen);
}

kvt_status kvt_ssd_record_decode(kvt_ssd *s, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect,
                                 uint32_t group, uint32_t block_index, kvt_block **out, char *err, size_t errlen) {
    *out = NULL;
    if (kind != KVT_SSD_KIND_BLOCK && kind != KVT_SSD_KIND_TAIL)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "only blocks and tails travel as records");
    hdr_out h;
    kvt_status st = record_header(buf, len, &h, err, errlen);
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

/* ---- shared tier (issue 17): recurrent-state snapshots as record buffers -------------------
 * Same bytes as a snapshot file; the same header checks as load_snapshot, every section checksum
 * verified before any byte reaches the sequence. */
kvt_status kvt_ssd_snapshot_record_encode(const kvt_ssd *s, kvt_snapshot *sn, uint64_t root, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!sn || kvt_snapshot_pos(sn) == 0 || kvt_kv_layout_state_bytes(s->layout) == 0) return KVT_ERR_INVALID_ARG;
    ssd_record rec;
    kvt_status st = record_prepare(s, NULL, sn, root, &rec);
    if (st != KVT_OK) return st;
    uint8_t *buf = calloc(1, rec.fsize);
    if (!buf) {
        free(rec.packed);
        return KVT_ERR_NOMEM;
    }
    header_encode(&rec.h, buf, rec.hsize);
    for (uint32_t i = 0; i < rec.h.n_sections; i++) memcpy(buf + rec.secs[i].offset, rec.payload[i], rec.secs[i].length);
    free(rec.packed);
    *out = buf;
    *out_len = rec.fsize;
    return KVT_OK;
}

kvt_status kvt_ssd_snapshot_record_decode(kvt_ssd *s, uint8_t *buf, size_t len, uint64_t chain, uint32_t pos,
                                          uint8_t *state, char *err, size_t errlen) {
    if (kvt_kv_layout_state_bytes(s->layout) == 0) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "no recurrent layers");
    hdr_out h;
    kvt_status st = record_header(buf, len, &h, err, errlen);
    if (st != KVT_OK) return st;
    st = header_matches(s, &h, chain, SSD_GROUP_NONE, KVT_SSD_KIND_SNAPSHOT, err, errlen);
    if (st != KVT_OK) return st;
    if (h.info.n_tokens != pos) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot position mismatch");
    const uint32_t ns = h.info.n_sections;
    if (ns == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot without sections");
    hdr_section last = hdr_section_at(&h, ns - 1);
    if (align_up(last.offset + last.length, SSD_PAGE) != len) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "record length mismatch");
    for (uint32_t i = 0; i < ns; i++) {
        hdr_section sc = hdr_section_at(&h, i);
        if (XXH3_64bits(buf + sc.offset, sc.length) != sc.hash)
            return kvt_errf(err, errlen, KVT_ERR_CORRUPT, "snapshot section %u checksum mismatch", i);
    }
    uint32_t sec = 0, nl = kvt_kv_layout_n_layers(s->layout);
    for (uint32_t l = 0; l < nl; l++) { /* sections in layer order, as load_snapshot reads them */
        const kvt_layer_desc *d = kvt_kv_layout_layer(s->layout, l);
        if (d->kind != KVT_KIND_RECURRENT) continue;
        if (sec >= ns) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section count");
        hdr_section sc = hdr_section_at(&h, sec++);
        const size_t off = kvt_kv_layout_state_offset(s->layout, l); /* the layer's aligned slot */
        if (sc.length != d->state_bytes || off + sc.length > kvt_kv_layout_state_bytes(s->layout))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "snapshot section size");
        memcpy(state + off, buf + sc.offset, sc.length);
    }
    return KVT_OK;
}

/* Removes the file of e and its index entry. Lock held. */
