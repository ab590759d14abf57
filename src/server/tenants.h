/*
 * tenants.h — who a request belongs to, and which cache namespace that gives it (docs/server.md,
 * "Tenants and namespaces"):
 *   - the --api-keys file: one key per line, mapping it to a tenant name and an optional admin flag;
 *     parsed as untrusted input (bounded size and line length, errors name the line);
 *   - kvt_tenant_namespace: the one derivation of a request's namespace (kvt_gen_request.ns, the
 *     chain root kvt_root_hash(compat, ns)) from its tenant and its cache_salt;
 *   - the per-namespace counters of /stats, bounded (KVT_NS_STATS_MAX namespaces, then one "other"
 *     bucket) so that random salts cannot grow the server's memory.
 *
 * Ownership / threading: a kvt_keyring is immutable once parsed (read from any thread; entries and
 * their strings live until kvt_keyring_free). A kvt_ns_stats owns copies of the namespace strings it
 * tracks; kvt_ns_stats_add and kvt_ns_stats_json may be called from any thread (one mutex).
 */
#ifndef KVT_TENANTS_H
#define KVT_TENANTS_H

#include <cjson/cJSON.h>

#include "util/common.h"

#define KVT_KEYS_MAX_FILE_BYTES (1u << 20) /* the whole --api-keys file */
#define KVT_KEYS_MAX_LINE 1024             /* one line, without its newline */
#define KVT_KEYS_MIN_KEY 16                /* key length bounds (bytes of printable ASCII) */
#define KVT_KEYS_MAX_KEY 256
#define KVT_TENANT_MAX 64                  /* tenant names: 1..64 of [A-Za-z0-9._-] */
#define KVT_SALT_MAX 256                   /* cache_salt: 1..256 bytes of UTF-8 */
#define KVT_NS_MAX (KVT_TENANT_MAX + 1 + KVT_SALT_MAX + 1) /* a namespace string with its NUL */
#define KVT_NS_SEP '\x1f'                  /* between tenant and salt; never in a tenant name */
#define KVT_NS_STATS_MAX 256               /* namespaces /stats tracks by name */

typedef struct kvt_key_entry {
    char *key;                          /* the bearer secret */
    char tenant[KVT_TENANT_MAX + 1];
    bool admin;                         /* may call /stats, /metrics and /admin/... */
    uint32_t line;                      /* where it was defined */
} kvt_key_entry;

typedef struct kvt_keyring kvt_keyring;

/* Parses the text of an --api-keys file (len bytes; name is used in messages). Format: one entry per
 * line, `KEY TENANT [admin]`, fields separated by spaces or tabs; a line whose first non-blank
 * character is '#' is a comment; blank lines are skipped; a trailing CR is ignored. KEY: 16..256
 * printable ASCII bytes other than '#' at its start; TENANT: 1..64 of [A-Za-z0-9._-]. Errors
 * (KVT_ERR_FORMAT, message "NAME:LINE: why"): a NUL byte, a line over KVT_KEYS_MAX_LINE, a missing
 * or extra field, a bad key or tenant, a third field other than `admin`, a key given twice (naming
 * both lines), a file over KVT_KEYS_MAX_FILE_BYTES, no entry at all. */
kvt_status kvt_keyring_parse(const char *text, size_t len, const char *name, kvt_keyring **out, char *err,
                             size_t errlen);
/* Reads and parses path: a regular file of at most KVT_KEYS_MAX_FILE_BYTES (opened non-blocking, so
 * a FIFO cannot hang start-up). A file that others (not owner or group) can read or write is
 * refused (KVT_ERR_INVALID_ARG: "chmod 600"); a group-readable one gets a warning. */
kvt_status kvt_keyring_load(const char *path, kvt_keyring **out, char *err, size_t errlen);
void kvt_keyring_free(kvt_keyring *k);
size_t kvt_keyring_count(const kvt_keyring *k);
const kvt_key_entry *kvt_keyring_at(const kvt_keyring *k, size_t i);
/* The entry whose key is the bearer value of an Authorization header ("Bearer KEY"), or NULL. Every
 * key is compared in constant time (kvt_ct_equal) and all of them are always compared, so the time
 * does not depend on which key matched or where a guess differs. */
const kvt_key_entry *kvt_keyring_match(const kvt_keyring *k, const char *auth_header);

/* The namespace of a request (the one derivation; server.c parse_request): "" without tenant and
 * salt (the namespace of a server without --api-keys, as before namespaces existed); otherwise
 * TENANT + KVT_NS_SEP + SALT, either part possibly empty. Injective: tenant names cannot contain the
 * separator, and a non-empty result always contains it. tenant: NULL or a validated name; salt: NULL
 * or 1..KVT_SALT_MAX bytes. False (out = "") when the parts do not fit cap. */
bool kvt_tenant_namespace(const char *tenant, const char *salt, char *out, size_t cap);

/* Per-namespace counters for /stats (admins only). */
typedef struct kvt_ns_stats kvt_ns_stats;
kvt_ns_stats *kvt_ns_stats_create(uint32_t max_tracked); /* NULL on OOM */
void kvt_ns_stats_free(kvt_ns_stats *t);
/* Adds to ns's counters; a namespace not yet tracked when max_tracked are is counted in "other". */
void kvt_ns_stats_add(kvt_ns_stats *t, const char *ns, uint64_t requests, uint64_t prompt_tokens,
                      uint64_t cached_tokens);
/* The "namespaces" section: {"tracked", "max", "list": [{"tenant", "salt", "requests",
 * "prompt_tokens", "cached_tokens"}], "other": {...}}. tenant is null for requests without one;
 * salt is null without a cache_salt, else the first 8 hex digits of the salt's XXH3-64 (salts are
 * client secrets: never shown). NULL on OOM. */
cJSON *kvt_ns_stats_json(kvt_ns_stats *t);

#endif
