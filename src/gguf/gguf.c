/*
 * gguf.c — GGUF v2/v3 reader (mmap or caller buffer, fully validated at open) and v3 writer.
 *
 * Reader: kvt_gguf_open parses the whole header in one pass with a bounds-checked cursor. Every
 * count is checked against the bytes that remain before anything is allocated from it, so the
 * allocations are bounded by the file size. Keys and tensor names are copied (NUL-terminated) and
 * indexed in small open-addressing hash tables; string arrays get an offset table so element i is
 * O(1). After a successful open nothing is ever re-validated: accessors trust the index.
 *
 * Writer: metadata is serialized into a growing byte buffer as it is added; tensors are kept as
 * (info, data copy) or (info, fill callback) and written at finish in declaration order with
 * offsets = running sums of sizes padded to the alignment (the layout ggml's reader insists on).
 * The file is written to PATH.tmp.PID, fsynced, then renamed over PATH.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as LE u32 */
#define GGUF_DEFAULT_ALIGN 32u
#define GGUF_MAX_KEY 65535u
#define GGUF_MAX_NAME 63u /* ggml: GGML_MAX_NAME 64 including the NUL */

/* ------------------------------------------------------------------ reader structures */

typedef struct gkv {
    char *key;
    uint32_t type;
    uint32_t elem;        /* arrays: element type */
    uint64_t n;           /* arrays: element count */
    const uint8_t *val;   /* scalars: the value; strings: the u64 length; arrays: first element */
    uint64_t *str_off;    /* string arrays: offset (from base) of each element's u64 length */
} gkv;

struct kvt_gguf {
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    int64_t n_kv;
    gkv *kv;
    int64_t n_tensors;
    kvt_gguf_tensor *tensors;
    /* hash tables of indices (+1; 0 = empty), power-of-two sized */
    uint32_t *kv_hash;
    uint64_t kv_hash_n;
    uint32_t *t_hash;
    uint64_t t_hash_n;
};

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static uint64_t hash_size_for(uint64_t n) {
    uint64_t m = 16;
    while (m < n * 2) m <<= 1;
    return m;
}

/* cursor over the untrusted bytes */
typedef struct cur {
    const uint8_t *p;
    uint64_t off, size;
} cur;

static bool rd(cur *c, void *dst, uint64_t n) {
    if (n > c->size - c->off) return false;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return true;
}
static bool skip(cur *c, uint64_t n) {
    if (n > c->size - c->off) return false;
    c->off += n;
    return true;
}
static uint64_t left(const cur *c) { return c->size - c->off; }

static uint64_t vtype_size(uint32_t t) {
    switch (t) {
    case KVT_GGUF_U8: case KVT_GGUF_I8: case KVT_GGUF_BOOL: return 1;
    case KVT_GGUF_U16: case KVT_GGUF_I16: return 2;
    case KVT_GGUF_U32: case KVT_GGUF_I32: case KVT_GGUF_F32: return 4;
    case KVT_GGUF_U64: case KVT_GGUF_I64: case KVT_GGUF_F64: return 8;
    default: return 0; /* string, array, invalid */
    }
}

static bool vtype_valid(uint32_t t) { return t <= KVT_GGUF_F64; }

static const char *vtype_name(uint32_t t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    return t <= KVT_GGUF_F64 ? names[t] : "?";
}

void kvt_gguf_free(kvt_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_off);
        }
    if (g->tensors)
        for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_hash);
    free(g->t_hash);
    if (g->mapped && g->base) munmap((void *)g->base, g->size);
    free(g);
}

/* Reads a string: returns its bytes (inside the buffer) and length. */
static bool rd_str(cur *c, const uint8_t **s, uint64_t *len) {
    uint64_t n;
    if (!rd(c, &n, 8)) return false;
    if (n > left(c)) return false;
    *s = c->p + c->off;
    *len = n;
    c->off += n;
    return true;
}

static int64_t kv_lookup(const kvt_gguf *g, const char *key) {
    if (!g->kv_hash) return -1;
    uint64_t m = g->kv_hash_n - 1;
    for (uint64_t h = str_hash(key) & m;; h = (h + 1) & m) {
        uint32_t e = g->kv_hash[h];
        if (!e) return -1;
        if (!strcmp(g->kv[e - 1].key, key)) return e - 1;
    }
}

static int64_t t_lookup(const kvt_gguf *g, const char *name) {
    if (!g->t_hash) return -1;
    uint64_t m = g->t_hash_n - 1;
    for (uint64_t h = str_hash(name) & m;; h = (h + 1) & m) {
        uint32_t e = g->t_hash[h];
        if (!e) return -1;
        if (!strcmp(g->tensors[e - 1].name, name)) return e - 1;
    }
}

static int cmp_tensor_off(const void *a, const void *b) {
    const kvt_gguf_tensor *x = *(const kvt_gguf_tensor *const *)a, *y = *(const kvt_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

#define FAIL(st, ...) do { kvt_errf(err, errlen, st, __VA_ARGS__); status = st; goto fail; } while (0)

static kvt_status parse(kvt_gguf *g, const char *who, char *err, size_t errlen) {
    kvt_status status = KVT_ERR_FORMAT;
    cur c = {g->base, 0, g->size};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;

    if (!rd(&c, &magic, 4)) FAIL(KVT_ERR_FORMAT, "%s: truncated header (file is %llu bytes)", who,
                                 (unsigned long long)g->size);
    if (magic != GGUF_MAGIC) FAIL(KVT_ERR_FORMAT, "%s: bad magic (not a GGUF file)", who);
    if (!rd(&c, &version, 4)) FAIL(KVT_ERR_FORMAT, "%s: truncated header (file is %llu bytes)", who,
                                   (unsigned long long)g->size);
    if ((version & 0xFFFFu) == 0 && version != 0)
        FAIL(KVT_ERR_UNSUPPORTED, "%s: big-endian GGUF not supported", who);
    if (version == 1) FAIL(KVT_ERR_UNSUPPORTED, "%s: GGUF version 1 not supported (re-convert the model)", who);
    if (version < 2 || version > 3) FAIL(KVT_ERR_UNSUPPORTED, "%s: GGUF version %u not supported", who, version);
    g->version = version;
    if (!rd(&c, &n_tensors, 8) || !rd(&c, &n_kv, 8))
        FAIL(KVT_ERR_FORMAT, "%s: truncated header (file is %llu bytes)", who, (unsigned long long)g->size);
    /* every KV needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
     * 8 + 4 + 4 + 8; reject counts that cannot fit before allocating anything from them */
    if (n_kv > left(&c) / 13)
        FAIL(KVT_ERR_FORMAT, "%s: KV count %llu exceeds what the file can hold", who, (unsigned long long)n_kv);
    if (n_tensors > left(&c) / 24)
        FAIL(KVT_ERR_FORMAT, "%s: tensor count %llu exceeds what the file can hold", who,
             (unsigned long long)n_tensors);
    if (n_kv + n_tensors >= UINT32_MAX)
        FAIL(KVT_ERR_FORMAT, "%s: too many entries", who);

    g->kv = calloc(n_kv ? n_kv : 1, sizeof(gkv));
    g->kv_hash_n = hash_size_for(n_kv);
    g->kv_hash = calloc(g->kv_hash_n, sizeof(uint32_t));
    if (!g->kv || !g->kv_hash) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
    g->n_kv = 0;

    /* ---- metadata ---- */
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t at = c.off;
        const uint8_t *ks;
        uint64_t klen;
        uint32_t type;
        uint64_t kl;
        if (!rd(&c, &kl, 8)) goto trunc_kv;
        if (kl > GGUF_MAX_KEY)
            FAIL(KVT_ERR_FORMAT, "%s: KV %llu key length %llu exceeds 65535 (offset %llu)", who,
                 (unsigned long long)i, (unsigned long long)kl, (unsigned long long)at);
        c.off = at;
        if (!rd_str(&c, &ks, &klen)) goto trunc_kv;
        if (klen == 0) FAIL(KVT_ERR_FORMAT, "%s: KV %llu has an empty key (offset %llu)", who,
                            (unsigned long long)i, (unsigned long long)at);
        if (memchr(ks, 0, klen))
            FAIL(KVT_ERR_FORMAT, "%s: KV %llu key contains a NUL byte (offset %llu)", who,
                 (unsigned long long)i, (unsigned long long)at);
        gkv *e = &g->kv[g->n_kv];
        e->key = malloc(klen + 1);
        if (!e->key) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
        memcpy(e->key, ks, klen);
        e->key[klen] = 0;
        g->n_kv++;
        if (kv_lookup(g, e->key) >= 0) FAIL(KVT_ERR_FORMAT, "%s: duplicate key '%s'", who, e->key);
        if (!rd(&c, &type, 4)) goto trunc_kv;
        if (!vtype_valid(type))
            FAIL(KVT_ERR_FORMAT, "%s: key '%s' has invalid value type %u", who, e->key, type);
        e->type = type;
        e->val = c.p + c.off;
        if (type == KVT_GGUF_STRING) {
            const uint8_t *s;
            uint64_t sl;
            if (!rd_str(&c, &s, &sl)) goto trunc_kv;
        } else if (type == KVT_GGUF_ARRAY) {
            uint32_t et;
            uint64_t n;
            if (!rd(&c, &et, 4) || !rd(&c, &n, 8)) goto trunc_kv;
            if (et == KVT_GGUF_ARRAY)
                FAIL(KVT_ERR_FORMAT, "%s: key '%s': nested arrays not supported", who, e->key);
            if (!vtype_valid(et))
                FAIL(KVT_ERR_FORMAT, "%s: key '%s' has invalid array element type %u", who, e->key, et);
            e->elem = et;
            e->val = c.p + c.off;
            if (et == KVT_GGUF_STRING) {
                /* each string needs at least its 8-byte length: bounds the offset table */
                if (n > left(&c) / 8)
                    FAIL(KVT_ERR_FORMAT, "%s: truncated at KV %llu (offset %llu): key '%s' array of %llu strings exceeds file size",
                         who, (unsigned long long)i, (unsigned long long)at, e->key, (unsigned long long)n);
                e->str_off = malloc((n ? n : 1) * sizeof(uint64_t));
                if (!e->str_off) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
                for (uint64_t j = 0; j < n; j++) {
                    const uint8_t *s;
                    uint64_t sl;
                    e->str_off[j] = c.off;
                    if (!rd_str(&c, &s, &sl)) goto trunc_kv;
                }
            } else {
                uint64_t es = vtype_size(et), bytes;
                if (!kvt_mul_ok(n, es, &bytes) || bytes > left(&c))
                    FAIL(KVT_ERR_FORMAT, "%s: truncated at KV %llu (offset %llu): key '%s' array of %llu %s exceeds file size",
                         who, (unsigned long long)i, (unsigned long long)at, e->key, (unsigned long long)n, vtype_name(et));
                if (et == KVT_GGUF_BOOL)
                    for (uint64_t j = 0; j < n; j++)
                        if (c.p[c.off + j] > 1)
                            FAIL(KVT_ERR_FORMAT, "%s: key '%s': invalid bool value %u", who, e->key,
                                 c.p[c.off + j]);
                c.off += bytes;
            }
            e->n = n;
        } else {
            if (!skip(&c, vtype_size(type))) goto trunc_kv;
            if (type == KVT_GGUF_BOOL && *e->val > 1)
                FAIL(KVT_ERR_FORMAT, "%s: key '%s': invalid bool value %u", who, e->key, *e->val);
        }
        /* index it */
        uint64_t m = g->kv_hash_n - 1, h = str_hash(e->key) & m;
        while (g->kv_hash[h]) h = (h + 1) & m;
        g->kv_hash[h] = (uint32_t)g->n_kv;
        continue;
    trunc_kv:
        FAIL(KVT_ERR_FORMAT, "%s: truncated at KV %llu (offset %llu)", who, (unsigned long long)i,
             (unsigned long long)at);
    }

    /* alignment */
    g->alignment = GGUF_DEFAULT_ALIGN;
    int64_t ai = kv_lookup(g, "general.alignment");
    if (ai >= 0) {
        uint32_t a;
        if (g->kv[ai].type != KVT_GGUF_U32)
            FAIL(KVT_ERR_FORMAT, "%s: general.alignment must be u32, not %s", who, vtype_name(g->kv[ai].type));
        memcpy(&a, g->kv[ai].val, 4);
        if (a == 0 || (a & (a - 1)))
            FAIL(KVT_ERR_FORMAT, "%s: alignment %u is not a power of two", who, a);
        g->alignment = a;
    }

    /* ---- tensor infos ---- */
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(kvt_gguf_tensor));
    g->t_hash_n = hash_size_for(n_tensors);
    g->t_hash = calloc(g->t_hash_n, sizeof(uint32_t));
    if (!g->tensors || !g->t_hash) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
    g->n_tensors = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        uint64_t at = c.off;
        const uint8_t *ns;
        uint64_t nl;
        uint32_t n_dims, type;
        if (!rd_str(&c, &ns, &nl)) goto trunc_t;
        if (nl == 0) FAIL(KVT_ERR_FORMAT, "%s: tensor %llu has an empty name", who, (unsigned long long)i);
        if (nl > GGUF_MAX_NAME)
            FAIL(KVT_ERR_FORMAT, "%s: tensor %llu name is %llu bytes (max %u)", who, (unsigned long long)i,
                 (unsigned long long)nl, GGUF_MAX_NAME);
        if (memchr(ns, 0, nl))
            FAIL(KVT_ERR_FORMAT, "%s: tensor %llu name contains a NUL byte", who, (unsigned long long)i);
        kvt_gguf_tensor *t = &g->tensors[g->n_tensors];
        char *name = malloc(nl + 1);
        if (!name) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
        memcpy(name, ns, nl);
        name[nl] = 0;
        t->name = name;
        g->n_tensors++;
        if (t_lookup(g, name) >= 0) FAIL(KVT_ERR_FORMAT, "%s: duplicate tensor '%s'", who, name);
        if (!rd(&c, &n_dims, 4)) goto trunc_t;
        if (n_dims == 0 || n_dims > 4)
            FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': n_dims %u (must be 1..4)", who, name, n_dims);
        t->n_dims = n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            int64_t v;
            if (!rd(&c, &v, 8)) goto trunc_t;
            if (v < 0) FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': negative dimension ne[%u]", who, name, d);
            t->ne[d] = v;
        }
        if (!rd(&c, &type, 4)) goto trunc_t;
        if (!rd(&c, &t->offset, 8)) goto trunc_t;
        uint32_t be = kvt_type_block_elems(type), bb = kvt_type_block_bytes(type);
        if (!kvt_type_known(type) || be == 0 || bb == 0) /* known: ggml's ids only, not kvtier's internal BF16X */
            FAIL(KVT_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported tensor type %u", who, name, type);
        t->type = type;
        uint64_t nel = 1;
        for (int d = 0; d < 4; d++)
            if (!kvt_mul_ok(nel, (uint64_t)t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
                FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': element count overflows", who, name);
        if (t->ne[0] % be)
            FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': ne[0]=%lld is not a multiple of the %s block size %u", who,
                 name, (long long)t->ne[0], kvt_type_name(type), be);
        if (!kvt_mul_ok(nel / be, bb, &t->nbytes))
            FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': byte size overflows", who, name);
        if (t->offset % g->alignment)
            FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': offset %llu is not aligned to %u", who, name,
                 (unsigned long long)t->offset, g->alignment);
        uint64_t m = g->t_hash_n - 1, h = str_hash(name) & m;
        while (g->t_hash[h]) h = (h + 1) & m;
        g->t_hash[h] = (uint32_t)g->n_tensors;
        continue;
    trunc_t:
        FAIL(KVT_ERR_FORMAT, "%s: truncated at tensor info %llu (offset %llu)", who, (unsigned long long)i,
             (unsigned long long)at);
    }

    /* ---- data section ---- */
    uint64_t data_off = c.off;
    if (data_off % g->alignment) data_off += g->alignment - data_off % g->alignment;
    g->data_off = data_off;
    if (n_tensors > 0 && data_off > g->size)
        FAIL(KVT_ERR_FORMAT, "%s: truncated before the data section (offset %llu, file %llu bytes)", who,
             (unsigned long long)data_off, (unsigned long long)g->size);
    uint64_t data_size = n_tensors > 0 ? g->size - data_off : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kvt_gguf_tensor *t = &g->tensors[i];
        uint64_t end;
        if (!kvt_add_ok(t->offset, t->nbytes, &end) || end > data_size)
            FAIL(KVT_ERR_FORMAT, "%s: tensor '%s': data [%llu, +%llu) beyond end of file (data section is %llu bytes)",
                 who, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                 (unsigned long long)data_size);
        t->data = g->base + data_off + t->offset;
    }
    if (g->n_tensors > 1) {
        kvt_gguf_tensor **order = malloc((size_t)g->n_tensors * sizeof(*order));
        if (!order) FAIL(KVT_ERR_NOMEM, "%s: out of memory", who);
        for (int64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
        qsort(order, (size_t)g->n_tensors, sizeof(*order), cmp_tensor_off);
        for (int64_t i = 0; i + 1 < g->n_tensors; i++) {
            if (order[i]->nbytes && order[i + 1]->nbytes && order[i]->offset + order[i]->nbytes > order[i + 1]->offset) {
                kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", who, order[i]->name,
                         order[i + 1]->name);
                free(order);
                return KVT_ERR_FORMAT;
            }
        }
        free(order);
    }
    return KVT_OK;
fail:
    return status;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

kvt_status kvt_gguf_open_buffer(const void *buf, size_t len, kvt_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    kvt_gguf *g = calloc(1, sizeof(*g));
    if (!g) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    g->base = buf;
    g->size = len;
    kvt_status st = parse(g, "<buffer>", err, errlen);
    if (st != KVT_OK) {
        kvt_gguf_free(g);
        return st;
    }
    *out = g;
    return KVT_OK;
}

kvt_status kvt_gguf_open(const char *path, kvt_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    const char *who = base_name(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: truncated header (file is %lld bytes)", who,
                        (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) (void)madvise(p, (size_t)st.st_size, MADV_WILLNEED); /* start readahead of the weights */
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return kvt_errf(err, errlen, KVT_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    kvt_gguf *g = calloc(1, sizeof(*g));
    if (!g) {
        munmap(p, (size_t)st.st_size);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    g->base = p;
    g->size = (uint64_t)st.st_size;
    g->mapped = true;
    kvt_status s = parse(g, who, err, errlen);
    if (s != KVT_OK) {
        kvt_gguf_free(g);
        return s;
    }
    *out = g;
    return KVT_OK;
}

/* ------------------------------------------------------------------ accessors */

uint32_t kvt_gguf_version(const kvt_gguf *g) { return g->version; }
uint64_t kvt_gguf_file_size(const kvt_gguf *g) { return g->size; }
uint32_t kvt_gguf_alignment(const kvt_gguf *g) { return g->alignment; }
uint64_t kvt_gguf_data_offset(const kvt_gguf *g) { return g->data_off; }
int64_t kvt_gguf_n_kv(const kvt_gguf *g) { return g->n_kv; }
int64_t kvt_gguf_find_key(const kvt_gguf *g, const char *key) { return kv_lookup(g, key); }
const char *kvt_gguf_key_name(const kvt_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}
kvt_gguf_vtype kvt_gguf_key_type(const kvt_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? (kvt_gguf_vtype)g->kv[i].type : (kvt_gguf_vtype)-1;
}
kvt_gguf_vtype kvt_gguf_arr_type(const kvt_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv && g->kv[i].type == KVT_GGUF_ARRAY ? (kvt_gguf_vtype)g->kv[i].elem
                                                                   : (kvt_gguf_vtype)-1;
}

/* Integer value of type t at p; false for non-integer types. Signed values in *s, unsigned in *u. */
static bool int_at(uint32_t t, const uint8_t *p, int64_t *s, uint64_t *u, bool *is_signed) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; } v;
    uint64_t sz = vtype_size(t);
    if (!sz || t == KVT_GGUF_F32 || t == KVT_GGUF_F64 || t == KVT_GGUF_BOOL) return false;
    memcpy(&v, p, sz);
    *is_signed = false;
    switch (t) {
    case KVT_GGUF_U8: *u = v.u8; break;
    case KVT_GGUF_U16: *u = v.u16; break;
    case KVT_GGUF_U32: *u = v.u32; break;
    case KVT_GGUF_U64: *u = v.u64; break;
    case KVT_GGUF_I8: *s = v.i8; *is_signed = true; break;
    case KVT_GGUF_I16: *s = v.i16; *is_signed = true; break;
    case KVT_GGUF_I32: *s = v.i32; *is_signed = true; break;
    case KVT_GGUF_I64: *s = v.i64; *is_signed = true; break;
    default: return false;
    }
    return true;
}

static bool as_i64(uint32_t t, const uint8_t *p, int64_t *out) {
    int64_t s = 0;
    uint64_t u = 0;
    bool sg;
    if (!int_at(t, p, &s, &u, &sg)) return false;
    if (sg) { *out = s; return true; }
    if (u > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)u;
    return true;
}

static const gkv *get(const kvt_gguf *g, const char *key) {
    int64_t i = kv_lookup(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

bool kvt_gguf_get_i64(const kvt_gguf *g, const char *key, int64_t *out) {
    const gkv *e = get(g, key);
    return e && as_i64(e->type, e->val, out);
}

bool kvt_gguf_get_u32(const kvt_gguf *g, const char *key, uint32_t *out) {
    const gkv *e = get(g, key);
    int64_t v;
    if (!e) return false;
    if (e->type == KVT_GGUF_U64) { /* may exceed INT64_MAX: check directly */
        uint64_t u;
        memcpy(&u, e->val, 8);
        if (u > UINT32_MAX) return false;
        *out = (uint32_t)u;
        return true;
    }
    if (!as_i64(e->type, e->val, &v) || v < 0 || v > (int64_t)UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool kvt_gguf_get_f32(const kvt_gguf *g, const char *key, float *out) {
    const gkv *e = get(g, key);
    if (!e) return false;
    if (e->type == KVT_GGUF_F32) { memcpy(out, e->val, 4); return true; }
    if (e->type == KVT_GGUF_F64) { double d; memcpy(&d, e->val, 8); *out = (float)d; return true; }
    return false;
}

bool kvt_gguf_get_bool(const kvt_gguf *g, const char *key, bool *out) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_BOOL) return false;
    *out = *e->val != 0;
    return true;
}

bool kvt_gguf_get_str(const kvt_gguf *g, const char *key, const char **s, uint64_t *len) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_STRING) return false;
    uint64_t n;
    memcpy(&n, e->val, 8);
    *s = (const char *)e->val + 8;
    *len = n;
    return true;
}

bool kvt_gguf_get_arr(const kvt_gguf *g, const char *key, kvt_gguf_vtype *elem, uint64_t *n, const void **data) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_ARRAY) return false;
    if (elem) *elem = (kvt_gguf_vtype)e->elem;
    if (n) *n = e->n;
    if (data) *data = e->elem == KVT_GGUF_STRING ? NULL : (const void *)e->val;
    return true;
}

bool kvt_gguf_get_arr_str(const kvt_gguf *g, const char *key, uint64_t i, const char **s, uint64_t *len) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_ARRAY || e->elem != KVT_GGUF_STRING || i >= e->n) return false;
    uint64_t n;
    memcpy(&n, g->base + e->str_off[i], 8);
    *s = (const char *)g->base + e->str_off[i] + 8;
    *len = n;
    return true;
}

bool kvt_gguf_get_arr_i64(const kvt_gguf *g, const char *key, uint64_t i, int64_t *out) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_ARRAY || i >= e->n) return false;
    uint64_t es = vtype_size(e->elem);
    if (!es) return false;
    return as_i64(e->elem, e->val + i * es, out);
}

bool kvt_gguf_get_arr_f32(const kvt_gguf *g, const char *key, uint64_t i, float *out) {
    const gkv *e = get(g, key);
    if (!e || e->type != KVT_GGUF_ARRAY || i >= e->n) return false;
    if (e->elem == KVT_GGUF_F32) { memcpy(out, e->val + i * 4, 4); return true; }
    if (e->elem == KVT_GGUF_F64) { double d; memcpy(&d, e->val + i * 8, 8); *out = (float)d; return true; }
    return false;
}

int64_t kvt_gguf_n_tensors(const kvt_gguf *g) { return g->n_tensors; }
const kvt_gguf_tensor *kvt_gguf_tensor_at(const kvt_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}
const kvt_gguf_tensor *kvt_gguf_find_tensor(const kvt_gguf *g, const char *name) {
    int64_t i = t_lookup(g, name);
    return i < 0 ? NULL : &g->tensors[i];
}

/* ------------------------------------------------------------------ writer */

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    void *data;                  /* owned copy, or NULL when fill is used */
    kvt_gguf_fill_fn fill;
    void *fill_ctx;
} wtensor;

struct kvt_gguf_writer {
    uint8_t *kv;                 /* serialized KV pairs */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;                 /* for duplicate detection */
    size_t n_keys, keys_cap;
    wtensor *t;
    size_t n_t, t_cap;
    uint32_t alignment;
    char err[256];               /* first error recorded while adding; reported by finish */
};

static int64_t g_fail_write_after = -1; /* fault injection (tests) */
void kvt_gguf_test_fail_write_after(int64_t nbytes) { g_fail_write_after = nbytes; }

kvt_gguf_writer *kvt_gguf_writer_create(void) {
    kvt_gguf_writer *w = calloc(1, sizeof(*w));
    if (w) w->alignment = GGUF_DEFAULT_ALIGN;
    return w;
}

void kvt_gguf_writer_free(kvt_gguf_writer *w) {
    if (!w) return;
    free(w->kv);
    for (size_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}

static void w_fail(kvt_gguf_writer *w, const char *fmt, const char *arg) {
    char a[128]; /* keys can be 64 KiB: keep the message one short line */
    size_t n = strnlen(arg, sizeof a - 1);
    memcpy(a, arg, n);
    a[n] = 0;
    if (!w->err[0]) snprintf(w->err, sizeof w->err, fmt, a);
}

static bool w_put(kvt_gguf_writer *w, const void *p, size_t n) {
    if (w->err[0]) return false;
    if (n == 0) return true;
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *q = realloc(w->kv, cap);
        if (!q) { w_fail(w, "out of memory%s", ""); return false; }
        w->kv = q;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return true;
}

/* Starts a KV pair: checks the key and writes key + type. */
static bool w_key(kvt_gguf_writer *w, const char *key, uint32_t type) {
    if (w->err[0]) return false;
    size_t kl = strlen(key);
    if (kl == 0 || kl > GGUF_MAX_KEY) { w_fail(w, "invalid key '%s'", key); return false; }
    for (size_t i = 0; i < w->n_keys; i++)
        if (!strcmp(w->keys[i], key)) { w_fail(w, "duplicate key '%s'", key); return false; }
    if (w->n_keys == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 32;
        char **k = realloc(w->keys, cap * sizeof(char *));
        if (!k) { w_fail(w, "out of memory%s", ""); return false; }
        w->keys = k;
        w->keys_cap = cap;
    }
    char *dup = strdup(key);
    if (!dup) { w_fail(w, "out of memory%s", ""); return false; }
    w->keys[w->n_keys++] = dup;
    uint64_t l = kl;
    w->n_kv++;
    return w_put(w, &l, 8) && w_put(w, key, kl) && w_put(w, &type, 4);
}

static void w_scalar(kvt_gguf_writer *w, const char *key, uint32_t type, const void *v) {
    if (w_key(w, key, type)) w_put(w, v, vtype_size(type));
}

void kvt_gguf_w_u32(kvt_gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1)) || v % 8) { w_fail(w, "alignment must be a power of two multiple of 8%s", ""); return; }
        w->alignment = v;
    }
    w_scalar(w, key, KVT_GGUF_U32, &v);
}
void kvt_gguf_w_i32(kvt_gguf_writer *w, const char *key, int32_t v) { w_scalar(w, key, KVT_GGUF_I32, &v); }
void kvt_gguf_w_f32(kvt_gguf_writer *w, const char *key, float v) { w_scalar(w, key, KVT_GGUF_F32, &v); }
void kvt_gguf_w_bool(kvt_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    w_scalar(w, key, KVT_GGUF_BOOL, &b);
}
void kvt_gguf_w_u64(kvt_gguf_writer *w, const char *key, uint64_t v) { w_scalar(w, key, KVT_GGUF_U64, &v); }
void kvt_gguf_w_scalar(kvt_gguf_writer *w, const char *key, kvt_gguf_vtype type, const void *v) {
    if (!vtype_size(type)) { w_fail(w, "key '%s': not a fixed-size type", key); return; }
    if (type == KVT_GGUF_BOOL && *(const uint8_t *)v > 1) { w_fail(w, "key '%s': bool must be 0/1", key); return; }
    w_scalar(w, key, type, v);
}

void kvt_gguf_w_str(kvt_gguf_writer *w, const char *key, const char *s, uint64_t len) {
    if (w_key(w, key, KVT_GGUF_STRING)) {
        w_put(w, &len, 8);
        w_put(w, s, len);
    }
}

void kvt_gguf_w_arr(kvt_gguf_writer *w, const char *key, kvt_gguf_vtype elem, const void *data, uint64_t n) {
    uint64_t es = vtype_size(elem);
    if (!es) { w_fail(w, "key '%s': array element type must be fixed-size", key); return; }
    if (w_key(w, key, KVT_GGUF_ARRAY)) {
        uint32_t et = elem;
        w_put(w, &et, 4);
        w_put(w, &n, 8);
        w_put(w, data, n * es);
    }
}

void kvt_gguf_w_arr_str(kvt_gguf_writer *w, const char *key, const char *const *s, const uint64_t *lens, uint64_t n) {
    if (w_key(w, key, KVT_GGUF_ARRAY)) {
        uint32_t et = KVT_GGUF_STRING;
        w_put(w, &et, 4);
        w_put(w, &n, 8);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t l = lens ? lens[i] : strlen(s[i]);
            w_put(w, &l, 8);
            w_put(w, s[i], l);
        }
    }
}

bool kvt_gguf_w_copy_kv(kvt_gguf_writer *w, const kvt_gguf *src, const char *key) {
    int64_t i = kv_lookup(src, key);
    if (i < 0) return false;
    const gkv *e = &src->kv[i];
    /* the value's extent in the source: from e->val (or the array header) to its end */
    const uint8_t *start, *end;
    if (e->type == KVT_GGUF_STRING) {
        uint64_t n;
        memcpy(&n, e->val, 8);
        start = e->val;
        end = e->val + 8 + n;
    } else if (e->type == KVT_GGUF_ARRAY) {
        start = e->val - 12;
        if (e->elem == KVT_GGUF_STRING) {
            if (e->n == 0) end = e->val;
            else {
                uint64_t last = e->str_off[e->n - 1], n;
                memcpy(&n, src->base + last, 8);
                end = src->base + last + 8 + n;
            }
        } else {
            end = e->val + e->n * vtype_size(e->elem);
        }
    } else {
        start = e->val;
        end = e->val + vtype_size(e->type);
    }
    if (e->type == KVT_GGUF_U32 && !strcmp(key, "general.alignment")) {
        uint32_t a;
        memcpy(&a, e->val, 4);
        kvt_gguf_w_u32(w, key, a);
        return !w->err[0];
    }
    if (!w_key(w, key, e->type)) return false;
    return w_put(w, start, (size_t)(end - start));
}

static kvt_status w_tensor_common(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, uint64_t *nbytes_out) {
    if (w->err[0]) return KVT_ERR_INVALID_ARG;
    size_t nl = strlen(name);
    if (nl == 0 || nl > GGUF_MAX_NAME) return KVT_ERR_INVALID_ARG;
    if (n_dims == 0 || n_dims > 4) return KVT_ERR_INVALID_ARG;
    uint32_t be = kvt_type_block_elems(type), bb = kvt_type_block_bytes(type);
    if (!kvt_type_known(type) || !be || !bb) return KVT_ERR_UNSUPPORTED;
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 0 || !kvt_mul_ok(nel, (uint64_t)ne[d], &nel)) return KVT_ERR_INVALID_ARG;
    if (ne[0] % be) return KVT_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return KVT_ERR_INVALID_ARG;
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t) return KVT_ERR_NOMEM;
        w->t = t;
        w->t_cap = cap;
    }
    *nbytes_out = nel / be * bb;
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (!t->name) return KVT_ERR_NOMEM;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->nbytes = *nbytes_out;
    return KVT_OK;
}

kvt_status kvt_gguf_w_tensor(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                             const int64_t *ne, const void *data, uint64_t nbytes) {
    uint64_t want;
    kvt_status st = w_tensor_common(w, name, type, n_dims, ne, &want);
    if (st != KVT_OK) return st;
    wtensor *t = &w->t[w->n_t];
    if (nbytes != want) {
        free(t->name);
        return KVT_ERR_INVALID_ARG;
    }
    t->data = malloc(want ? want : 1);
    if (!t->data) {
        free(t->name);
        return KVT_ERR_NOMEM;
    }
    if (want) memcpy(t->data, data, want);
    w->n_t++;
    return KVT_OK;
}

kvt_status kvt_gguf_w_tensor_fill(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, kvt_gguf_fill_fn fill, void *ctx) {
    uint64_t want;
    kvt_status st = w_tensor_common(w, name, type, n_dims, ne, &want);
    if (st != KVT_OK) return st;
    w->t[w->n_t].fill = fill;
    w->t[w->n_t].fill_ctx = ctx;
    w->n_t++;
    return KVT_OK;
}

/* buffered file output with fault injection */
typedef struct wout {
    int fd;
    uint8_t buf[1 << 16];
    size_t n;
    uint64_t total;
    bool failed;
    int err;
} wout;

static void wo_flush(wout *o) {
    size_t done = 0;
    while (!o->failed && done < o->n) {
        size_t n = o->n - done;
        if (g_fail_write_after >= 0) {
            if (o->total >= (uint64_t)g_fail_write_after) { o->failed = true; o->err = ENOSPC; break; }
            n = KVT_MIN(n, (size_t)((uint64_t)g_fail_write_after - o->total));
        }
        ssize_t r = write(o->fd, o->buf + done, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            o->failed = true;
            o->err = errno;
            break;
        }
        done += (size_t)r;
        o->total += (uint64_t)r;
    }
    o->n = 0;
}

static void wo_put(wout *o, const void *p, size_t n) {
    const uint8_t *s = p;
    while (n && !o->failed) {
        size_t k = KVT_MIN(n, sizeof o->buf - o->n);
        memcpy(o->buf + o->n, s, k);
        o->n += k;
        s += k;
        n -= k;
        if (o->n == sizeof o->buf) wo_flush(o);
    }
}

static void wo_zeros(wout *o, uint64_t n) {
    static const uint8_t z[64];
    while (n) {
        size_t k = (size_t)KVT_MIN(n, (uint64_t)sizeof z);
        wo_put(o, z, k);
        n -= k;
    }
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

kvt_status kvt_gguf_writer_finish(kvt_gguf_writer *w, const char *path, char *err, size_t errlen) {
    if (w->err[0]) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "%s: %s", path, w->err);
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 32);
    if (!tmp) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
    wout *o = calloc(1, sizeof(*o));
    if (!o) {
        free(tmp);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    o->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (o->fd < 0) {
        kvt_status st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        free(o);
        return st;
    }
    kvt_status st = KVT_OK;
    uint32_t magic = GGUF_MAGIC, version = 3;
    uint64_t n_t = w->n_t, n_kv = w->n_kv;
    wo_put(o, &magic, 4);
    wo_put(o, &version, 4);
    wo_put(o, &n_t, 8);
    wo_put(o, &n_kv, 8);
    wo_put(o, w->kv, w->kv_len);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        wo_put(o, &nl, 8);
        wo_put(o, t->name, nl);
        wo_put(o, &t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) wo_put(o, &t->ne[d], 8);
        wo_put(o, &t->type, 4);
        wo_put(o, &off, 8);
        off = pad_to(off + t->nbytes, w->alignment);
    }
    uint64_t pos = o->total + o->n;
    wo_zeros(o, pad_to(pos, w->alignment) - pos);
    void *scratch = NULL;
    for (size_t i = 0; i < w->n_t && !o->failed && st == KVT_OK; i++) {
        const wtensor *t = &w->t[i];
        if (t->data) {
            wo_put(o, t->data, t->nbytes);
        } else {
            free(scratch);
            scratch = malloc(t->nbytes ? t->nbytes : 1);
            if (!scratch) { st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "%s: out of memory for tensor '%s'", path, t->name); break; }
            st = t->fill(t->fill_ctx, t->name, t->type, t->n_dims, t->ne, scratch, t->nbytes);
            if (st != KVT_OK) { kvt_errf(err, errlen, st, "%s: generating tensor '%s' failed", path, t->name); break; }
            wo_put(o, scratch, t->nbytes);
        }
        /* pad every tensor (the last too) so the file ends on the alignment, like ggml */
        wo_zeros(o, pad_to(t->nbytes, w->alignment) - t->nbytes);
    }
    free(scratch);
    if (st == KVT_OK) {
        wo_flush(o);
        if (!o->failed && fsync(o->fd) != 0) { o->failed = true; o->err = errno; }
        if (o->failed) st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: write failed: %s", path, strerror(o->err));
    }
    if (close(o->fd) != 0 && st == KVT_OK) st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (st == KVT_OK && rename(tmp, path) != 0)
        st = kvt_errf(err, errlen, KVT_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    if (st != KVT_OK) unlink(tmp);
    free(tmp);
    free(o);
    return st;
}
