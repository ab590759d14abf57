/* ssd_identity.c — the SSD tier, model identity and the compatibility key. See ssd_int.h for the
 * file map and ssd_cache.h for the API. */
#include "ssd_int.h"

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
            ok = kvt_ssd_read_full(fd, buf, n, o) == KVT_OK;
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
        int mfd = kvt_ssd_open_cache_file(memo, O_RDONLY);
        if (mfd >= 0 && !(f = fdopen(mfd, "r"))) close(mfd);
    }
    /* memo line: "<sha256 hex> <memo key>\n" (model_memo_key: dev ino size mtime ctime quick-hash realpath) */
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
        kvt_ssd_io *io = kvt_ssd_io_plain();
        kvt_ssd_mkdir_p(io, cache_dir);
        char tmp[PATH_MAX + 48];
        kvt_ssd_tmp_name(tmp, sizeof(tmp), memo);
        int wfd = kvt_ssd_io_create_excl(io, tmp);
        if (wfd >= 0) {
            size_t ll = strlen(out_hex) + 1 + strlen(key) + 1;
            char *nl = malloc(ll + 1);
            bool ok = nl != NULL;
            if (ok) snprintf(nl, ll + 1, "%s %s\n", out_hex, key);
            ok = ok && (!old_len || kvt_ssd_io_pwrite(io, wfd, old, old_len, 0, false));
            ok = ok && kvt_ssd_io_pwrite(io, wfd, nl, ll, old_len, false) && kvt_ssd_io_fsync(io, wfd);
            free(nl);
            ok = kvt_ssd_io_close(io, wfd) && ok;
            if (!ok || !kvt_ssd_io_rename(io, tmp, memo)) kvt_ssd_io_unlink(io, tmp);
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
