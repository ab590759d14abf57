/* tenants.c — the --api-keys file, the namespace derivation and the per-namespace counters
 * (tenants.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "server.h"
#include "tenants.h"

/* ---------------------------------------------------------------------------------------------
 * The keys file
 * ------------------------------------------------------------------------------------------- */
struct kvt_keyring {
    kvt_key_entry *v;
    size_t n, cap;
};

void kvt_keyring_free(kvt_keyring *k) {
    if (!k) return;
    for (size_t i = 0; i < k->n; i++) {
        /* the secrets do not outlive the ring in freed heap */
        volatile char *p = k->v[i].key;
        for (size_t j = 0; p[j]; j++) p[j] = 0;
        free(k->v[i].key);
    }
    free(k->v);
    free(k);
}

size_t kvt_keyring_count(const kvt_keyring *k) { return k ? k->n : 0; }
const kvt_key_entry *kvt_keyring_at(const kvt_keyring *k, size_t i) { return k && i < k->n ? &k->v[i] : NULL; }

static bool is_blank(char c) { return c == ' ' || c == '\t'; }
static bool tenant_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/* The next blank-separated field of [*p, end): its start and length (0 at the end of the line). */
static size_t next_field(const char **p, const char *end, const char **f) {
    const char *q = *p;
    while (q < end && is_blank(*q)) q++;
    *f = q;
    while (q < end && !is_blank(*q)) q++;
    *p = q;
    return (size_t)(q - *f);
}

/* One non-comment line: KEY TENANT [admin]. */
static kvt_status parse_line(kvt_keyring *k, const char *s, const char *end, const char *name, uint32_t ln,
                             char *err, size_t errlen) {
    const char *p = s, *key, *ten, *flag, *extra;
    size_t nk = next_field(&p, end, &key), nt = next_field(&p, end, &ten), nf = next_field(&p, end, &flag);
    size_t nx = next_field(&p, end, &extra);
    if (nt == 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: expected 'KEY TENANT [admin]', found one field", name, ln);
    if (nx)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: expected 'KEY TENANT [admin]', found more than three fields",
                        name, ln);
    if (nk < KVT_KEYS_MIN_KEY || nk > KVT_KEYS_MAX_KEY)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: the key has %zu characters (%u..%u needed)", name, ln, nk,
                        KVT_KEYS_MIN_KEY, KVT_KEYS_MAX_KEY);
    for (size_t i = 0; i < nk; i++)
        if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: the key has a byte that is not printable ASCII (0x%02x)",
                            name, ln, (unsigned char)key[i]);
    if (nt > KVT_TENANT_MAX)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: the tenant name has %zu characters (at most %u)", name, ln,
                        nt, KVT_TENANT_MAX);
    for (size_t i = 0; i < nt; i++)
        if (!tenant_char(ten[i]))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT,
                            "%s:%u: the tenant name may only hold letters, digits, '.', '_' and '-'", name, ln);
    if (nf && !(nf == 5 && !memcmp(flag, "admin", 5)))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: the third field must be 'admin' (found '%.*s')", name, ln,
                        (int)KVT_MIN(nf, (size_t)32), flag);
    for (size_t i = 0; i < k->n; i++)
        if (strlen(k->v[i].key) == nk && !memcmp(k->v[i].key, key, nk))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: this key was already given on line %u", name, ln,
                            k->v[i].line);
    if (k->n == k->cap) {
        size_t nc = k->cap ? k->cap * 2 : 16;
        kvt_key_entry *nv = realloc(k->v, nc * sizeof *nv);
        if (!nv) return KVT_ERR_NOMEM;
        k->v = nv;
        k->cap = nc;
    }
    kvt_key_entry *e = &k->v[k->n];
    memset(e, 0, sizeof *e);
    if (!(e->key = strndup(key, nk))) return KVT_ERR_NOMEM;
    memcpy(e->tenant, ten, nt);
    e->admin = nf != 0;
    e->line = ln;
    k->n++;
    return KVT_OK;
}

kvt_status kvt_keyring_parse(const char *text, size_t len, const char *name, kvt_keyring **out, char *err,
                             size_t errlen) {
    *out = NULL;
    if (!name) name = "api-keys";
    if (len > KVT_KEYS_MAX_FILE_BYTES)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: %zu bytes (at most %u)", name, len, KVT_KEYS_MAX_FILE_BYTES);
    if (len && memchr(text, '\0', len)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: contains a NUL byte", name);
    kvt_keyring *k = calloc(1, sizeof *k);
    if (!k) return KVT_ERR_NOMEM;
    const char *p = text, *end = text + len;
    uint32_t ln = 0;
    kvt_status st = KVT_OK;
    while (p < end && st == KVT_OK) {
        ln++;
        const char *nl = memchr(p, '\n', (size_t)(end - p)), *le = nl ? nl : end;
        if ((size_t)(le - p) > KVT_KEYS_MAX_LINE) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u: line longer than %u bytes", name, ln, KVT_KEYS_MAX_LINE);
            break;
        }
        const char *e = le;
        if (e > p && e[-1] == '\r') e--;
        const char *q = p;
        while (q < e && is_blank(*q)) q++;
        if (q < e && *q != '#') st = parse_line(k, q, e, name, ln, err, errlen);
        p = nl ? nl + 1 : end;
    }
    if (st == KVT_OK && k->n == 0) st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: no keys (expected 'KEY TENANT [admin]' lines)", name);
    if (st == KVT_ERR_NOMEM) kvt_errf(err, errlen, st, "%s: out of memory", name);
    if (st != KVT_OK) {
        kvt_keyring_free(k);
        return st;
    }
    *out = k;
    return KVT_OK;
}

kvt_status kvt_keyring_load(const char *path, kvt_keyring **out, char *err, size_t errlen) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int en = errno;
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(en));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "%s: not a regular file", path);
    }
    if (sb.st_mode & (S_IROTH | S_IWOTH)) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "%s: other users can %s it (mode %03o); it holds secrets: chmod 600 %s", path,
                        (sb.st_mode & S_IWOTH) ? "write" : "read", (unsigned)(sb.st_mode & 0777), path);
    }
    if (sb.st_mode & (S_IRGRP | S_IWGRP))
        KVT_WARN("%s: the file's group can read or write it (mode %03o); consider chmod 600", path,
                 (unsigned)(sb.st_mode & 0777));
    if (sb.st_size > (off_t)KVT_KEYS_MAX_FILE_BYTES) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: %lld bytes (at most %u)", path, (long long)sb.st_size,
                        KVT_KEYS_MAX_FILE_BYTES);
    }
    /* read at most the cap + 1 bytes whatever the size said (the file may grow meanwhile) */
    char *buf = malloc((size_t)KVT_KEYS_MAX_FILE_BYTES + 1);
    if (!buf) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    while (n <= KVT_KEYS_MAX_FILE_BYTES) {
        ssize_t r = read(fd, buf + n, (size_t)KVT_KEYS_MAX_FILE_BYTES + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int en = errno;
            free(buf);
            close(fd);
            return kvt_errf(err, errlen, KVT_ERR_IO, "%s: %s", path, strerror(en));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    kvt_status st = kvt_keyring_parse(buf, n, path, out, err, errlen);
    memset(buf, 0, n); /* the secrets do not stay in freed heap */
    free(buf);
    return st;
}

const kvt_key_entry *kvt_keyring_match(const kvt_keyring *k, const char *auth_header) {
    if (!k || !auth_header || strncasecmp(auth_header, "Bearer ", 7) != 0) return NULL;
    const char *v = auth_header + 7;
    while (*v == ' ') v++;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    const kvt_key_entry *found = NULL;
    for (size_t i = 0; i < k->n; i++) /* no early exit: every key is compared */
        if (kvt_ct_equal(v, n, k->v[i].key)) found = &k->v[i];
    return found;
}

/* ---------------------------------------------------------------------------------------------
 * The namespace
 * ------------------------------------------------------------------------------------------- */
bool kvt_tenant_namespace(const char *tenant, const char *salt, char *out, size_t cap) {
    if (!cap) return false;
    out[0] = 0;
    const size_t nt = tenant ? strlen(tenant) : 0, ns = salt ? strlen(salt) : 0;
    if (!tenant && !salt) return true;
    if (nt > KVT_TENANT_MAX || ns > KVT_SALT_MAX || nt + 1 + ns + 1 > cap) return false;
    memcpy(out, tenant ? tenant : "", nt);
    out[nt] = KVT_NS_SEP;
    memcpy(out + nt + 1, salt ? salt : "", ns);
    out[nt + 1 + ns] = 0;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Per-namespace counters
 * ------------------------------------------------------------------------------------------- */
typedef struct ns_row {
    char *ns;
    uint64_t requests, prompt_tokens, cached_tokens;
} ns_row;

struct kvt_ns_stats {
    pthread_mutex_t mu;
    ns_row *rows;
    uint32_t n, max;
    ns_row other;
};

kvt_ns_stats *kvt_ns_stats_create(uint32_t max_tracked) {
    kvt_ns_stats *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->max = max_tracked;
    if (max_tracked && !(t->rows = calloc(max_tracked, sizeof *t->rows))) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void kvt_ns_stats_free(kvt_ns_stats *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->n; i++) free(t->rows[i].ns);
    free(t->rows);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void kvt_ns_stats_add(kvt_ns_stats *t, const char *ns, uint64_t requests, uint64_t prompt_tokens,
                      uint64_t cached_tokens) {
    if (!t) return;
    if (!ns) ns = "";
    pthread_mutex_lock(&t->mu);
    ns_row *r = NULL;
    for (uint32_t i = 0; i < t->n && !r; i++)
        if (!strcmp(t->rows[i].ns, ns)) r = &t->rows[i];
    if (!r && t->n < t->max && (t->rows[t->n].ns = strdup(ns))) r = &t->rows[t->n++];
    if (!r) r = &t->other; /* full (or out of memory): counted, not named */
    r->requests += requests;
    r->prompt_tokens += prompt_tokens;
    r->cached_tokens += cached_tokens;
    pthread_mutex_unlock(&t->mu);
}

static void add_counts(cJSON *o, const ns_row *r) {
    cJSON_AddNumberToObject(o, "requests", (double)r->requests);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", (double)r->cached_tokens);
}

cJSON *kvt_ns_stats_json(kvt_ns_stats *t) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !t) return o;
    pthread_mutex_lock(&t->mu);
    cJSON_AddNumberToObject(o, "tracked", t->n);
    cJSON_AddNumberToObject(o, "max", t->max);
    cJSON *list = cJSON_AddArrayToObject(o, "list");
    for (uint32_t i = 0; i < t->n && list; i++) {
        const char *ns = t->rows[i].ns, *sep = strchr(ns, KVT_NS_SEP);
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        if (sep && sep > ns) { /* "" has neither part; "T<sep>" a tenant; "<sep>S" a salt */
            char ten[KVT_TENANT_MAX + 1];
            snprintf(ten, sizeof ten, "%.*s", (int)(sep - ns), ns);
            cJSON_AddStringToObject(e, "tenant", ten);
        } else {
            cJSON_AddNullToObject(e, "tenant");
        }
        if (sep && sep[1]) {
            char h[9];
            snprintf(h, sizeof h, "%08llx", (unsigned long long)(XXH3_64bits(sep + 1, strlen(sep + 1)) >> 32));
            cJSON_AddStringToObject(e, "salt", h);
        } else {
            cJSON_AddNullToObject(e, "salt");
        }
        add_counts(e, &t->rows[i]);
        cJSON_AddItemToArray(list, e);
    }
    add_counts(cJSON_AddObjectToObject(o, "other"), &t->other);
    pthread_mutex_unlock(&t->mu);
    return o;
}
