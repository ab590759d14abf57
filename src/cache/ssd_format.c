/* ssd_format.c — the SSD tier's side of the file format: file names, reading and validating a
 * file's header (the image codec itself is record.c), offline file info, and the tier's record
 * calls bound to its model. See ssd_int.h for the file map and ssd_cache.h for the API. */
#include "ssd_int.h"

/* ------------------------------------------------------------------ names */
void kvt_ssd_entry_name(char *buf, size_t n, uint64_t chain, uint32_t group, uint32_t kind) {
    if (kind == KVT_SSD_KIND_SNAPSHOT)
        snprintf(buf, n, "%016llx.kvs", (unsigned long long)chain);
    else
        snprintf(buf, n, "%016llx-g%u.%s", (unsigned long long)chain, group,
                 kind == KVT_SSD_KIND_BLOCK ? "kvb" : "kvt");
}

/* Parses a file name into (chain, group, kind); false if it is not one of ours. */
bool kvt_ssd_parse_name(const char *name, uint64_t *chain, uint32_t *group, uint32_t *kind) {
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

/* Reads up to len bytes at off; stops early only at end of file. Returns bytes read or -1 (errno). */
int64_t kvt_ssd_read_upto(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
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
kvt_status kvt_ssd_header_read_any(int fd, bool direct, uint8_t **bufp, hdr_out *h, int *errno_out, char *err,
                                  size_t errlen) {
    *bufp = NULL;
    if (errno_out) *errno_out = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) return kvt_errf(err, errlen, KVT_ERR_IO, "stat: %s", strerror(errno));
    uint64_t fsz = (uint64_t)st.st_size;
    if (fsz < SSD_FIXED_HDR) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "file too short (%llu bytes)", (unsigned long long)fsz);
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, SSD_PAGE, SSD_PAGE) != 0) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    int64_t r = kvt_ssd_read_upto(fd, buf, direct ? SSD_PAGE : SSD_FIXED_HDR, 0);
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
        r = kvt_ssd_read_upto(fd, buf + got, want, got);
        if (r < 0 || got + (uint64_t)r < hsize) {
            if (r < 0 && errno_out) *errno_out = errno;
            free(buf);
            return kvt_errf(err, errlen, KVT_ERR_IO, "header read failed");
        }
    }
    kvt_status st2 = kvt_record_header_decode(buf, hsize, fsz, h, err, errlen);
    if (st2 != KVT_OK) {
        free(buf);
        return st2;
    }
    *bufp = buf;
    return KVT_OK;
}

kvt_status kvt_ssd_header_read_fd(int fd, uint8_t **bufp, hdr_out *h, char *err, size_t errlen) {
    return kvt_ssd_header_read_any(fd, false, bufp, h, NULL, err, errlen);
}

kvt_status kvt_ssd_read_full(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
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
    return kvt_ssd_read_file_info_at(AT_FDCWD, path, verify_payload, info, tokens, max_tokens, err, errlen);
}

kvt_status kvt_ssd_read_file_info_at(int dfd, const char *path, bool verify_payload, kvt_ssd_file_info *info,
                                     int32_t *tokens, uint32_t max_tokens, char *err, size_t errlen) {
    int fd = kvt_ssd_open_cache_file_at(dfd, path, O_RDONLY);
    if (fd < 0)
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path,
                        errno == EINVAL || errno == ELOOP ? "not a regular file (symlink, FIFO or device): skipped" : strerror(errno));
    uint8_t *buf;
    hdr_out h;
    kvt_status st = kvt_ssd_header_read_fd(fd, &buf, &h, err, errlen);
    if (st != KVT_OK) {
        close(fd);
        return st;
    }
    *info = h.info;
    uint32_t n_ids = info->kind == KVT_SSD_KIND_SNAPSHOT ? 0 : info->n_tokens;
    if (tokens)
        for (uint32_t i = 0; i < n_ids && i < max_tokens; i++) tokens[i] = kvt_record_id_at(&h, i);
    if (verify_payload) {
        for (uint32_t i = 0; i < info->n_sections && st == KVT_OK; i++) {
            hdr_section s = kvt_record_section_at(&h, i);
            XXH3_state_t *xs = XXH3_createState();
            uint8_t *chunk = malloc(1 << 20);
            if (!xs || !chunk) {
                st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
            } else {
                XXH3_64bits_reset(xs);
                for (uint64_t o = 0; o < s.length && st == KVT_OK;) {
                    uint64_t n = KVT_MIN(s.length - o, (uint64_t)1 << 20);
                    if (kvt_ssd_read_full(fd, chunk, n, s.offset + o) != KVT_OK)
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

/* ------------------------------------------------------------------ records of this tier's model */
static kvt_record_fmt ssd_fmt(const kvt_ssd *s) {
    kvt_record_fmt f = {.layout = s->layout, .pool = s->pool, .compat = s->compat, .compat_hash = s->compat_hash,
                        .bt = s->bt, .n_groups = s->n_groups};
    return f;
}

void kvt_ssd_record_fmt(const kvt_ssd *s, kvt_record_fmt *out) { *out = ssd_fmt(s); }

kvt_status kvt_ssd_header_matches(const kvt_ssd *s, const hdr_out *h, uint64_t chain, uint32_t group, uint32_t kind, char *err,
                          size_t errlen) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_check(&f, h, chain, group, kind, err, errlen);
}

kvt_status kvt_ssd_record_prepare(const kvt_ssd *s, kvt_block *b, kvt_snapshot *sn, uint64_t root, ssd_record *r) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_prepare(&f, b, sn, root, r);
}

uint64_t kvt_ssd_record_max_bytes(const kvt_ssd *s, uint32_t kind) {
    if (!s) return 0;
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_max_bytes(&f, kind);
}

kvt_status kvt_ssd_record_encode(const kvt_ssd *s, kvt_block *b, uint64_t root, uint8_t **out, size_t *out_len) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_encode(&f, b, root, out, out_len);
}

kvt_status kvt_ssd_record_decode(kvt_ssd *s, uint8_t *buf, size_t len, uint32_t kind, uint64_t expect, uint32_t group,
                                 uint32_t block_index, kvt_block **out, char *err, size_t errlen) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_decode(&f, buf, len, kind, expect, group, block_index, out, err, errlen);
}

kvt_status kvt_ssd_snapshot_record_encode(const kvt_ssd *s, kvt_snapshot *sn, uint64_t root, uint8_t **out, size_t *out_len) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_snapshot_encode(&f, sn, root, out, out_len);
}

kvt_status kvt_ssd_snapshot_record_decode(kvt_ssd *s, uint8_t *buf, size_t len, uint64_t chain, uint32_t pos, uint8_t *state,
                                          char *err, size_t errlen) {
    const kvt_record_fmt f = ssd_fmt(s);
    return kvt_record_snapshot_decode(&f, buf, len, chain, pos, state, err, errlen);
}
