/* shared_tier.c — see shared_tier.h and docs/shared-tier.md.
 *
 * Structure
 * ---------
 * - A connection (rconn) is a blocking hiredis context plus its breaker. It is (re)opened lazily:
 *   connect with the remaining budget as timeout (rediss://: a verified TLS bridge, whose
 *   socketpair end hiredis adopts with redisConnectFd), AUTH (argv: user, password), SELECT db
 *   (TLS without either: one PING, so a refused client certificate is a connect failure). Any I/O,
 *   timeout or protocol error frees the context (the next call reconnects) and counts a breaker
 *   failure; a success closes the breaker.
 * - Fetch (caller's thread): pipelined GETs of the prompt's next full blocks in windows of
 *   `pipeline` keys, each reply verified and appended before the next window is sent; then one GET
 *   of the tail key at the first position without a full block.
 * - Recurrent layouts (extend_recurrent): the same block fetch, but blocks are kept aside; the
 *   snapshot at the longest fetched end that has one decides how much is used, and a new sequence
 *   is built only after it verified (the state cannot be trimmed, so nothing is appended early).
 * - Publisher (own thread): pops up to `pipeline` queued items (blocks, snapshots), encodes each
 *   record, sends SET key value NX for all of them, then reads the replies.
 * - `seen`: a lossy direct-mapped set of (group, chain) this server published or fetched, so the
 *   same block is not sent again on every request (forgetting one only costs a rejected SET NX).
 *
 * Invariants
 *   (1) Only kvt_shared_extend's caller uses `fetch`; only the publisher thread uses `pub`.
 *   (2) A queued item holds one block or snapshot reference, released exactly once (sent, dropped
 *       or freed).
 *   (3) q_blocks <= queue_max_blocks and q_bytes <= queue_max_bytes (checked at enqueue).
 *   (4) Nothing fetched reaches a sequence before kvt_ssd_record_decode verified it and its tokens
 *       equal the prompt's at that position.
 *   (5) Recurrent layouts: a fetched prefix reaches the caller only as a whole sequence whose
 *       length is a verified snapshot's position and whose state is that snapshot's.
 */
#include "shared_tier.h"
#include "tls_bridge.h"

#include <ctype.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARED_SEEN_SLOTS 65536u
#define SHARED_BUSY_MAX_DEFER_MS 2000u
#define SHARED_BREAKER_THRESHOLD 3u
#define SHARED_BREAKER_BASE_MS 1000u
#define SHARED_BREAKER_MAX_MS 30000u
#define SHARED_MAX_PIPELINE 64u
#define SHARED_SNAP_GROUP 0xFFFFFFFFu /* the seen set's "group" of snapshots */

/* ------------------------------------------------------------------ URL */
static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes src[0..n) into out (NUL-terminated, cap bytes). False on bad escapes, NUL or
 * control characters, or overflow. */
static bool pct_decode(const char *src, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)src[i];
        if (c == '%') {
            if (i + 2 >= n) return false;
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi < 0 || lo < 0) return false;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c < 0x20 || c == 0x7f) return false;
        if (o + 1 >= cap) return false;
        out[o++] = (char)c;
    }
    out[o] = 0;
    return true;
}

static bool parse_u32(const char *s, size_t n, uint32_t max, uint32_t *out) {
    if (n == 0 || n > 10) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > max) return false;
    *out = (uint32_t)v;
    return true;
}

kvt_status kvt_shared_url_parse(const char *url, kvt_shared_url *u, char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (!url) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "no shared-cache URL");
    size_t len = strlen(url);
    if (len > 1024) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL too long");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)url[i] <= 0x20 || url[i] == 0x7f)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL contains spaces or control characters");
    const char *p;
    if (!strncmp(url, "redis://", 8)) p = url + 8;
    else if (!strncmp(url, "rediss://", 9)) {
        p = url + 9;
        u->tls = true;
    } else
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL must start with redis:// or rediss://");
    if (strpbrk(p, "?#")) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: query strings and fragments are not supported");
    const char *end = p + strlen(p);
    const char *slash = strchr(p, '/');
    const char *auth_end = NULL;
    for (const char *q = p; q < (slash ? slash : end); q++)
        if (*q == '@') auth_end = q; /* the last '@' before the path ends the userinfo */
    const char *hp = p;
    if (auth_end) {
        const char *colon = memchr(p, ':', (size_t)(auth_end - p));
        if (colon) {
            if (!pct_decode(p, (size_t)(colon - p), u->user, sizeof u->user) ||
                !pct_decode(colon + 1, (size_t)(auth_end - colon - 1), u->password, sizeof u->password))
                return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: bad user or password encoding");
        } else if (!pct_decode(p, (size_t)(auth_end - p), u->user, sizeof u->user)) {
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: bad user encoding");
        }
        if (u->user[0] && !u->password[0])
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: an ACL user needs a password (user:password@)");
        hp = auth_end + 1;
    }
    const char *hend = slash ? slash : end;
    const char *port_at = NULL;
    if (hp < hend && *hp == '[') { /* [ipv6] */
        const char *rb = memchr(hp, ']', (size_t)(hend - hp));
        if (!rb || rb == hp + 1) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: bad [IPv6] host");
        if ((size_t)(rb - hp - 1) >= sizeof u->host) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: host too long");
        memcpy(u->host, hp + 1, (size_t)(rb - hp - 1));
        if (rb + 1 < hend) {
            if (rb[1] != ':') return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: junk after ]");
            port_at = rb + 2;
        }
    } else {
        const char *colon = memchr(hp, ':', (size_t)(hend - hp));
        const char *he = colon ? colon : hend;
        if (he == hp) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: empty host");
        if ((size_t)(he - hp) >= sizeof u->host) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: host too long");
        for (const char *q = hp; q < he; q++)
            if (!isalnum((unsigned char)*q) && *q != '.' && *q != '-' && *q != '_')
                return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: bad character in host");
        memcpy(u->host, hp, (size_t)(he - hp));
        if (colon) port_at = colon + 1;
    }
    if (port_at) {
        uint32_t port;
        if (!parse_u32(port_at, (size_t)(hend - port_at), 65535, &port) || port == 0)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: port must be 1..65535");
        u->port = (uint16_t)port;
    }
    if (slash && slash + 1 < end) {
        if (!parse_u32(slash + 1, (size_t)(end - slash - 1), 65535, &u->db))
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared-cache URL: database must be a number 0..65535");
    }
    return KVT_OK;
}

void kvt_shared_snapshot_key(const char *compat_key, uint64_t chain, char out[KVT_SHARED_KEY_MAX]) {
    char cdir[33];
    kvt_ssd_compat_dir(compat_key, cdir);
    snprintf(out, KVT_SHARED_KEY_MAX, "kvtier:v1:%s:s:%016llx", cdir, (unsigned long long)chain);
}

void kvt_shared_key(const char *compat_key, bool tail, uint32_t group, uint64_t hash, char out[KVT_SHARED_KEY_MAX]) {
    char cdir[33];
    kvt_ssd_compat_dir(compat_key, cdir);
    snprintf(out, KVT_SHARED_KEY_MAX, "kvtier:v1:%s:%c:%u:%016llx", cdir, tail ? 't' : 'b', group,
             (unsigned long long)hash);
}

/* ------------------------------------------------------------------ connections */
typedef struct rconn {
    redisContext *c;
    kvt_tls_bridge *tls; /* rediss://: the TLS bridge behind c's socket (NULL on redis://) */
    kvt_breaker br;
    char last_err[600];  /* last connect failure, logged once per change */
} rconn;

typedef struct pub_item {
    struct pub_item *next;
    kvt_block *b;      /* a block or frozen tail, or NULL for ... */
    kvt_snapshot *snap; /* ... a recurrent-state snapshot */
    uint64_t bytes;
    uint64_t t_enq_ms;
} pub_item;

struct kvt_shared {
    kvt_shared_opts o;
    kvt_shared_url url;
    kvt_ssd *ssd;
    kvt_tls_ctx *tls; /* rediss:// only: verified TLS settings shared by both connections */
    const kvt_kv_layout *layout;
    uint32_t bt;
    bool recurrent; /* the layout has RECURRENT layers: snapshots travel too */

    rconn fetch, pub; /* invariant (1) */

    pthread_mutex_t mu; /* queue, seen, stats, pub breaker snapshot */
    pthread_cond_t cv_work, cv_idle;
    pthread_t thread;
    bool started, stop, busy;
    uint32_t flush_waiters;
    pub_item *q_head, *q_tail;
    uint64_t q_blocks, q_bytes;
    bool in_flight;
    uint64_t *seen;

    kvt_shared_stats st;
};

static struct timeval tv_ms(uint64_t ms) {
    if (ms == 0) ms = 1;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

static void conn_drop(rconn *rc) {
    if (rc->c) redisFree(rc->c); /* closes hiredis's end of the TLS bridge too */
    rc->c = NULL;
    kvt_tls_bridge_close(rc->tls);
    rc->tls = NULL;
}

/* Logs a connect failure when it differs from the previous one on this connection (the breaker
 * bounds how often it is retried; an unchanged cause is not repeated). */
static void conn_note_failure(kvt_shared *sh, rconn *rc, const char *what) {
    pthread_mutex_lock(&sh->mu);
    snprintf(sh->st.last_error, sizeof sh->st.last_error, "%s", what);
    pthread_mutex_unlock(&sh->mu);
    if (!strcmp(rc->last_err, what)) return;
    snprintf(rc->last_err, sizeof rc->last_err, "%s", what);
    KVT_WARN("shared tier: %s", what);
}

/* One argv command and its reply; NULL on an I/O or timeout error (context dropped). */
static redisReply *conn_cmd(rconn *rc, int argc, const char **argv, const size_t *lens) {
    redisReply *r = redisCommandArgv(rc->c, argc, argv, lens);
    if (!r) conn_drop(rc);
    return r;
}

/* One connection-setup command (AUTH, SELECT, PING) that must answer +OK/+PONG; on anything else
 * the reason is noted and the connection dropped. */
static bool setup_cmd(kvt_shared *sh, rconn *rc, const char *what, int argc, const char **argv, const size_t *lens) {
    redisReply *r = redisCommandArgv(rc->c, argc, argv, lens);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok) {
        char why[560];
        if (r) snprintf(why, sizeof why, "%s refused: %.*s", what, (int)KVT_MIN(r->len, (size_t)200), r->str ? r->str : "");
        else snprintf(why, sizeof why, "%s failed: %s%s", what, rc->c->errstr[0] ? rc->c->errstr : "connection lost",
                      sh->tls ? " (over TLS: a refused client certificate looks like this)" : "");
        conn_note_failure(sh, rc, why);
    }
    if (r) freeReplyObject(r);
    if (!ok) conn_drop(rc);
    return ok;
}

/* Connects (if needed) within budget_ms. False = unreachable (context dropped). */
static bool conn_ensure(kvt_shared *sh, rconn *rc, uint64_t budget_ms) {
    if (rc->c) {
        redisSetTimeout(rc->c, tv_ms(budget_ms));
        return true;
    }
    if (sh->tls) { /* rediss://: hiredis speaks RESP into the bridge; same timeouts as below */
        char why[560];
        int fd = -1;
        if (kvt_tls_bridge_open(sh->tls, sh->url.host, sh->url.port, (uint32_t)KVT_MIN(budget_ms, (uint64_t)UINT32_MAX), &rc->tls,
                                &fd, why, sizeof why) != KVT_OK) {
            conn_note_failure(sh, rc, why);
            return false;
        }
        rc->c = redisConnectFd(fd);
        if (!rc->c) close(fd);
    } else {
        rc->c = redisConnectWithTimeout(sh->url.host, sh->url.port, tv_ms(budget_ms));
    }
    if (!rc->c || rc->c->err) {
        char why[560];
        snprintf(why, sizeof why, "cannot connect to %s:%u: %s", sh->url.host, sh->url.port,
                 rc->c && rc->c->errstr[0] ? rc->c->errstr : "out of memory");
        conn_note_failure(sh, rc, why);
        conn_drop(rc);
        return false;
    }
    redisSetTimeout(rc->c, tv_ms(budget_ms));
    if (sh->url.password[0]) {
        const char *argv[3] = {"AUTH", sh->url.user, sh->url.password};
        size_t lens[3] = {4, strlen(sh->url.user), strlen(sh->url.password)};
        int argc = sh->url.user[0] ? 3 : 2;
        if (argc == 2) {
            argv[1] = sh->url.password;
            lens[1] = lens[2];
        }
        if (!setup_cmd(sh, rc, "AUTH", argc, argv, lens)) return false;
    }
    if (sh->url.db) {
        char db[16];
        snprintf(db, sizeof db, "%u", sh->url.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        if (!setup_cmd(sh, rc, "SELECT", 2, argv, lens)) return false;
    }
    if (sh->tls && !sh->url.password[0] && !sh->url.db) {
        /* TLS 1.3 reports a refused client certificate only after the handshake: one PING makes
         * that a connect failure with its reason instead of a silent error on the first GET */
        const char *argv[1] = {"PING"};
        size_t lens[1] = {4};
        if (!setup_cmd(sh, rc, "PING", 1, argv, lens)) return false;
    }
    if (rc->last_err[0]) KVT_INFO("shared tier: connected to %s:%u again", sh->url.host, sh->url.port);
    rc->last_err[0] = 0;
    pthread_mutex_lock(&sh->mu);
    sh->st.last_error[0] = 0;
    pthread_mutex_unlock(&sh->mu);
    return true;
}

static uint64_t now_ms(void) { return kvt_now_ns() / 1000000ull; }

/* ------------------------------------------------------------------ seen set */
static uint64_t seen_tag(uint32_t group, uint64_t chain) { return (chain ^ ((uint64_t)group * 0x9E3779B97F4A7C15ull)) | 1; }
static bool seen_has(kvt_shared *sh, uint32_t group, uint64_t chain) {
    uint64_t t = seen_tag(group, chain);
    return sh->seen[t % SHARED_SEEN_SLOTS] == t;
}
static void seen_add(kvt_shared *sh, uint32_t group, uint64_t chain) {
    uint64_t t = seen_tag(group, chain);
    sh->seen[t % SHARED_SEEN_SLOTS] = t;
}

/* ------------------------------------------------------------------ fetch */
/* Best-effort removal of a value that failed verification, so a healthy server can publish it.
 * Only between round trips (never while pipelined replies are pending). */
static bool drop_bad_key(kvt_shared *sh, const char *key) {
    if (!sh->fetch.c) return false;
    const char *argv[2] = {"DEL", key};
    size_t lens[2] = {3, strlen(key)};
    redisReply *r = conn_cmd(&sh->fetch, 2, argv, lens);
    if (r) freeReplyObject(r);
    return r != NULL; /* false: the connection was dropped */
}

/* Counts one error reply (e.g. a wrong type under our key): a miss. */
static void count_error_reply(kvt_shared *sh) {
    pthread_mutex_lock(&sh->mu);
    sh->st.errors++;
    pthread_mutex_unlock(&sh->mu);
}
static void count_corrupt(kvt_shared *sh, const char *key, const char *why) {
    KVT_WARN("shared tier: value %s failed verification (%s); deleting it", key, why);
    pthread_mutex_lock(&sh->mu);
    sh->st.corrupt++;
    pthread_mutex_unlock(&sh->mu);
}

/* Verifies one reply for (kind, expect, index): the decoded sealed block (caller owns it) or NULL
 * (miss, error reply, no pool memory, or a bad value: then *bad = delete it). */
static kvt_block *decode_reply(kvt_shared *sh, redisReply *r, const char *key, uint32_t kind, uint64_t expect, uint32_t index,
                               bool *bad) {
    *bad = false;
    if (!r || r->type == REDIS_REPLY_NIL) return NULL;
    if (r->type != REDIS_REPLY_STRING) {
        count_error_reply(sh);
        return NULL;
    }
    char why[160] = {0};
    kvt_block *b = NULL;
    kvt_status st = kvt_ssd_record_decode(sh->ssd, (uint8_t *)r->str, r->len, kind, expect, 0, index, &b, why, sizeof why);
    if (st == KVT_ERR_POOL_EXHAUSTED || st == KVT_ERR_NOMEM) return NULL;
    if (st != KVT_OK) {
        count_corrupt(sh, key, why);
        *bad = true;
        return NULL;
    }
    return b;
}

/* Verifies one reply for (kind, expect, index) and appends its block to seq when its tokens match
 * prompt[index*bt ..] (capped at n-1). Returns the tokens appended (0 = miss or bad value; *bad =
 * the value failed verification and should be deleted). */
static uint32_t take_reply(kvt_shared *sh, kvt_seq *seq, redisReply *r, const char *key, uint32_t kind, uint64_t expect,
                           uint32_t index, const int32_t *prompt, uint32_t n, bool *bad) {
    kvt_block *b = decode_reply(sh, r, key, kind, expect, index, bad);
    if (!b) return 0;
    const uint32_t pos = index * sh->bt, m = kvt_block_n_tokens(b);
    const uint32_t avail = n - 1 - pos; /* > 0: callers only ask for positions below n-1 */
    const int32_t *t = kvt_block_tokens(b);
    uint32_t use = 0;
    while (use < m && use < avail && t[use] == prompt[pos + use]) use++;
    if (use > 0) {
        kvt_block *blocks[1] = {b};
        if (kvt_seq_append_blocks(seq, blocks) != KVT_OK || kvt_seq_trim(seq, pos + use) != KVT_OK) {
            kvt_seq_trim(seq, pos); /* FULL groups always trim */
            use = 0;
        }
    }
    if (use > 0) {
        pthread_mutex_lock(&sh->mu);
        sh->st.fetched_blocks++;
        sh->st.fetched_bytes += r->len;
        sh->st.fetched_tokens += use;
        seen_add(sh, 0, kvt_block_hash(b));
        pthread_mutex_unlock(&sh->mu);
    }
    kvt_block_release(b);
    return use;
}

/* Pipelines GETs for the `count` full blocks from block index `first` of the request's chain
 * (their hashes come from the chain: nothing is hashed here): fills chains[], keys[] and clears
 * bad[] for each. Returns how many were queued; a connection that refuses a command clears
 * *io_ok. Callers keep first + count <= kvt_chain_n_full(chain). */
static uint32_t queue_block_gets(kvt_shared *sh, const char *compat, const kvt_chain *chain, uint32_t first, uint32_t count,
                                 uint64_t *chains, char keys[][KVT_SHARED_KEY_MAX], bool *bad, bool *io_ok) {
    for (uint32_t k = 0; k < count; k++) {
        chains[k] = kvt_chain_at(chain, first + k + 1);
        bad[k] = false;
        kvt_shared_key(compat, false, 0, chains[k], keys[k]);
        const char *argv[2] = {"GET", keys[k]};
        size_t lens[2] = {3, strlen(keys[k])};
        if (redisAppendCommandArgv(sh->fetch.c, 2, argv, lens) != REDIS_OK) {
            *io_ok = false;
            return k;
        }
    }
    return count;
}

/* FULL-attention layouts: extends seq in place (FULL groups trim at any position). Returns io_ok. */
static bool extend_full(kvt_shared *sh, kvt_seq *seq, const kvt_chain *chain, uint64_t deadline, bool io_ok) {
    const int32_t *prompt = kvt_chain_tokens(chain);
    const uint32_t bt = sh->bt, L0 = kvt_seq_len(seq), n = kvt_chain_len(chain);
    const char *compat = kvt_ssd_compat(sh->ssd);
    const uint32_t P = sh->o.pipeline;
    char keys[SHARED_MAX_PIPELINE][KVT_SHARED_KEY_MAX];
    uint64_t chains[SHARED_MAX_PIPELINE];
    bool bad[SHARED_MAX_PIPELINE];
    uint32_t idx = L0 / bt;
    bool stop = false, partial = false;
    /* full blocks: positions whose tokens the prompt holds and that start below n-1 */
    while (io_ok && !stop && (idx + 1) * bt <= n && idx * bt + 1 < n) {
        uint64_t now = now_ms();
        if (now >= deadline) break;
        redisSetTimeout(sh->fetch.c, tv_ms(deadline - now));
        uint32_t want = 0;
        while (want < P && (idx + want + 1) * bt <= n && (idx + want) * bt + 1 < n) want++;
        const uint32_t k = queue_block_gets(sh, compat, chain, idx, want, chains, keys, bad, &io_ok);
        for (uint32_t j = 0; j < k && io_ok; j++) {
            void *rv = NULL;
            if (redisGetReply(sh->fetch.c, &rv) != REDIS_OK || !rv) {
                io_ok = false;
                break;
            }
            redisReply *r = rv;
            if (!stop) { /* replies are in key order; after the first miss the rest are drained */
                uint32_t use = take_reply(sh, seq, r, keys[j], KVT_SSD_KIND_BLOCK, chains[j], idx, prompt, n, &bad[j]);
                if (use == bt) idx++;
                else stop = true;
                if (use > 0 && use < bt) partial = true; /* the n-1 cap cut it: nothing follows */
            }
            freeReplyObject(r);
        }
        for (uint32_t j = 0; j < k && io_ok; j++)
            if (bad[j] && !drop_bad_key(sh, keys[j])) io_ok = false;
    }
    /* one frozen tail at the first position without a full block */
    if (io_ok && !partial && idx * bt + 1 < n && kvt_seq_len(seq) == idx * bt) {
        uint64_t now = now_ms();
        if (now < deadline) {
            redisSetTimeout(sh->fetch.c, tv_ms(deadline - now));
            uint64_t parent = idx == 0 ? kvt_seq_root(seq) : kvt_seq_block_chain(seq, idx - 1);
            kvt_shared_key(compat, true, 0, parent, keys[0]);
            const char *argv[2] = {"GET", keys[0]};
            size_t lens[2] = {3, strlen(keys[0])};
            redisReply *r = conn_cmd(&sh->fetch, 2, argv, lens);
            if (!r) io_ok = false;
            else {
                take_reply(sh, seq, r, keys[0], KVT_SSD_KIND_TAIL, parent, idx, prompt, n, &bad[0]);
                freeReplyObject(r);
                if (bad[0] && !drop_bad_key(sh, keys[0])) io_ok = false;
            }
        }
    }
    return io_ok;
}

/* Recurrent layouts: the state has no trim, so a prefix is usable only where a snapshot of it
 * exists. Fetches the prompt's next full blocks and the tail after them (all verified, their tokens
 * equal to the prompt's, ending at or before n-1), then the snapshot at the longest of those ends
 * that has one (the tail's end, then block ends, longest first). Only when one verified, a new
 * sequence is built from seq's blocks, the fetched ones up to that end and the state, and replaces
 * *seqp; otherwise *seqp is untouched. Returns io_ok. */
static bool extend_recurrent(kvt_shared *sh, kvt_seq **seqp, const kvt_chain *chain, uint64_t deadline) {
    kvt_seq *seq = *seqp;
    const int32_t *prompt = kvt_chain_tokens(chain);
    const uint32_t bt = sh->bt, L0 = kvt_seq_len(seq), i0 = L0 / bt, lim = kvt_chain_len(chain) - 1;
    const char *compat = kvt_ssd_compat(sh->ssd);
    const uint32_t P = sh->o.pipeline, cap = lim / bt - i0 + 1;
    const size_t sbytes = kvt_kv_layout_state_bytes(sh->layout);
    kvt_block **got = calloc(cap, sizeof *got);
    size_t *glen = calloc(cap, sizeof *glen);
    uint8_t *state = malloc(sbytes);
    bool io_ok = got && glen && state;
    if (!io_ok) {
        free(got);
        free(glen);
        free(state);
        return true; /* no memory is not Redis's fault */
    }
    char keys[SHARED_MAX_PIPELINE][KVT_SHARED_KEY_MAX];
    uint64_t chains[SHARED_MAX_PIPELINE];
    bool bad[SHARED_MAX_PIPELINE];
    uint32_t k = 0;
    bool stop = false;
    uint64_t parent = i0 == 0 ? kvt_seq_root(seq) : kvt_seq_block_chain(seq, i0 - 1);
    /* full blocks ending at or before n-1 */
    while (io_ok && !stop && (i0 + k + 1) * bt <= lim) {
        uint64_t now = now_ms();
        if (now >= deadline) break;
        redisSetTimeout(sh->fetch.c, tv_ms(deadline - now));
        uint32_t want = 0;
        while (want < P && (i0 + k + want + 1) * bt <= lim) want++;
        const uint32_t w = queue_block_gets(sh, compat, chain, i0 + k, want, chains, keys, bad, &io_ok);
        for (uint32_t j = 0; j < w && io_ok; j++) {
            void *rv = NULL;
            if (redisGetReply(sh->fetch.c, &rv) != REDIS_OK || !rv) {
                io_ok = false;
                break;
            }
            redisReply *r = rv;
            if (!stop) { /* replies in key order; after the first miss the rest are drained */
                kvt_block *b = decode_reply(sh, r, keys[j], KVT_SSD_KIND_BLOCK, chains[j], i0 + k, &bad[j]);
                if (b && !memcmp(kvt_block_tokens(b), prompt + (size_t)(i0 + k) * bt, (size_t)bt * 4)) {
                    got[k] = b;
                    glen[k] = r->len;
                    k++;
                    parent = chains[j];
                } else {
                    if (b) kvt_block_release(b);
                    stop = true;
                }
            }
            freeReplyObject(r);
        }
        for (uint32_t j = 0; j < w && io_ok; j++)
            if (bad[j] && !drop_bad_key(sh, keys[j])) io_ok = false;
    }
    /* the frozen tail after them, used whole only (no trim) */
    kvt_block *tail = NULL;
    size_t tlen = 0;
    if (io_ok && (i0 + k) * bt + 1 <= lim && now_ms() < deadline) {
        redisSetTimeout(sh->fetch.c, tv_ms(deadline - now_ms()));
        kvt_shared_key(compat, true, 0, parent, keys[0]);
        const char *argv[2] = {"GET", keys[0]};
        size_t lens[2] = {3, strlen(keys[0])};
        redisReply *r = conn_cmd(&sh->fetch, 2, argv, lens);
        if (!r) io_ok = false;
        else {
            kvt_block *b = decode_reply(sh, r, keys[0], KVT_SSD_KIND_TAIL, parent, i0 + k, &bad[0]);
            uint32_t m = b ? kvt_block_n_tokens(b) : 0;
            if (b && (i0 + k) * bt + m <= lim && !memcmp(kvt_block_tokens(b), prompt + (size_t)(i0 + k) * bt, (size_t)m * 4)) {
                tail = b;
                tlen = r->len;
            } else if (b) {
                kvt_block_release(b);
            }
            freeReplyObject(r);
            if (bad[0] && !drop_bad_key(sh, keys[0])) io_ok = false;
        }
    }
    /* the snapshot at the longest end that has one: c = -1 the tail's end, c >= 0 block end k-c */
    bool found = false, use_tail = false;
    uint32_t use_blocks = 0;
    size_t slen = 0;
    for (int c = tail ? -1 : 0; io_ok && !found; c++) {
        const uint32_t nblk = c < 0 ? k : k - (uint32_t)c;
        if (c >= 0 && nblk == 0) break;
        const uint64_t chain = c < 0 ? kvt_block_hash(tail) : kvt_block_hash(got[nblk - 1]);
        const uint32_t pos = c < 0 ? (i0 + k) * bt + kvt_block_n_tokens(tail) : (i0 + nblk) * bt;
        uint64_t now = now_ms();
        if (now >= deadline) break;
        redisSetTimeout(sh->fetch.c, tv_ms(deadline - now));
        kvt_shared_snapshot_key(compat, chain, keys[0]);
        const char *argv[2] = {"GET", keys[0]};
        size_t lens[2] = {3, strlen(keys[0])};
        redisReply *r = conn_cmd(&sh->fetch, 2, argv, lens);
        if (!r) {
            io_ok = false;
            break;
        }
        bool drop = false;
        if (r->type == REDIS_REPLY_STRING) {
            char why[160] = {0};
            kvt_status st = kvt_ssd_snapshot_record_decode(sh->ssd, (uint8_t *)r->str, r->len, chain, pos, state, why, sizeof why);
            if (st == KVT_OK) {
                found = true;
                use_blocks = nblk;
                use_tail = c < 0;
                slen = r->len;
            } else if (st != KVT_ERR_NOMEM) {
                count_corrupt(sh, keys[0], why);
                drop = true;
            }
        } else if (r->type != REDIS_REPLY_NIL) {
            count_error_reply(sh);
        }
        freeReplyObject(r);
        if (drop && !drop_bad_key(sh, keys[0])) io_ok = false;
    }
    if (found) { /* a new sequence: seq's blocks, the fetched ones, then the state */
        kvt_seq *ns = NULL;
        bool ok = kvt_seq_create(kvt_seq_pool(seq), kvt_seq_root(seq), &ns) == KVT_OK;
        for (uint32_t i = 0; i < i0 && ok; i++) {
            kvt_block *bl[1] = {kvt_seq_block(seq, 0, i)};
            ok = bl[0] && kvt_seq_append_blocks(ns, bl) == KVT_OK;
        }
        for (uint32_t i = 0; i < use_blocks && ok; i++) ok = kvt_seq_append_blocks(ns, &got[i]) == KVT_OK;
        if (use_tail && ok) ok = kvt_seq_append_blocks(ns, &tail) == KVT_OK;
        if (ok) {
            uint64_t off = 0;
            for (uint32_t l = 0; l < kvt_kv_layout_n_layers(sh->layout); l++) {
                uint8_t *dst = kvt_seq_state(ns, l);
                if (!dst) continue; /* not a RECURRENT layer */
                size_t lb = kvt_kv_layout_layer(sh->layout, l)->state_bytes;
                memcpy(dst, state + off, lb);
                off += lb;
            }
            uint64_t bytes = slen + (use_tail ? tlen : 0);
            for (uint32_t i = 0; i < use_blocks; i++) bytes += glen[i];
            pthread_mutex_lock(&sh->mu);
            sh->st.fetched_blocks += use_blocks + (use_tail ? 1 : 0);
            sh->st.fetched_snapshots++;
            sh->st.fetched_bytes += bytes;
            sh->st.fetched_tokens += kvt_seq_len(ns) - L0;
            for (uint32_t i = 0; i < use_blocks; i++) seen_add(sh, 0, kvt_block_hash(got[i]));
            if (use_tail) seen_add(sh, 0, kvt_block_hash(tail));
            seen_add(sh, SHARED_SNAP_GROUP, use_tail ? kvt_block_hash(tail) : kvt_block_hash(got[use_blocks - 1]));
            pthread_mutex_unlock(&sh->mu);
            kvt_seq_free(seq);
            *seqp = ns;
        } else if (ns) {
            kvt_seq_free(ns); /* seq stays as it was: nothing half-built reaches the caller */
        }
    }
    for (uint32_t i = 0; i < k; i++) kvt_block_release(got[i]);
    if (tail) kvt_block_release(tail);
    free(got);
    free(glen);
    free(state);
    return io_ok;
}

uint32_t kvt_shared_extend(kvt_shared *sh, kvt_seq **seqp, const kvt_chain *chain) {
    if (!sh || !seqp || !*seqp || !chain) return 0;
    kvt_seq *seq = *seqp;
    const uint32_t bt = sh->bt, L0 = kvt_seq_len(seq), n = kvt_chain_len(chain);
    if (L0 % bt || L0 + 1 >= n) return 0;
    /* the chain must be this sequence's: same block size and root, and seq's blocks are its prefix */
    if (kvt_chain_block_tokens(chain) != bt || kvt_chain_root(chain) != kvt_seq_root(seq) ||
        (L0 && kvt_seq_block_chain(seq, L0 / bt - 1) != kvt_chain_at(chain, L0 / bt)))
        return 0;
    const uint64_t t0 = now_ms(), deadline = t0 + sh->o.timeout_ms;
    pthread_mutex_lock(&sh->mu);
    bool allowed = kvt_breaker_allow(&sh->fetch.br, t0);
    if (allowed) sh->st.lookups++;
    else sh->st.skipped++;
    pthread_mutex_unlock(&sh->mu);
    if (!allowed) return 0;
    kvt_sigpipe_guard spg; /* a server that closed the socket must not kill a CLI process */
    kvt_sigpipe_block(&spg);
    bool io_ok = conn_ensure(sh, &sh->fetch, sh->o.timeout_ms);
    if (io_ok) io_ok = sh->recurrent ? extend_recurrent(sh, seqp, chain, deadline) : extend_full(sh, seq, chain, deadline, io_ok);
    seq = *seqp;
    if (!io_ok) conn_drop(&sh->fetch);
    kvt_sigpipe_restore(&spg);
    uint32_t got = kvt_seq_len(seq) - L0;
    pthread_mutex_lock(&sh->mu);
    if (io_ok) kvt_breaker_success(&sh->fetch.br);
    else {
        kvt_breaker_failure(&sh->fetch.br, now_ms());
        sh->st.errors++;
    }
    if (got) sh->st.hits++;
    sh->st.fetch_ms_last = (double)(now_ms() - t0);
    pthread_mutex_unlock(&sh->mu);
    return got;
}

/* ------------------------------------------------------------------ publish */
static void item_free(pub_item *it) {
    if (it->b) kvt_block_release(it->b);
    if (it->snap) kvt_snapshot_release(it->snap);
    free(it);
}
/* The seen-set identity of a queued item. */
static uint64_t item_tag(const pub_item *it) {
    return it->b ? seen_tag(kvt_block_group(it->b), kvt_block_hash(it->b)) : seen_tag(SHARED_SNAP_GROUP, kvt_snapshot_chain(it->snap));
}
static void item_forget(kvt_shared *sh, const pub_item *it) { /* lock held */
    uint64_t t = item_tag(it);
    if (sh->seen[t % SHARED_SEEN_SLOTS] == t) sh->seen[t % SHARED_SEEN_SLOTS] = 0;
}

/* Queues one item (lock held); false = dropped (full queue or no memory), counted. */
static bool enqueue_item(kvt_shared *sh, kvt_block *b, kvt_snapshot *snap, uint64_t bytes) {
    if (sh->q_blocks + 1 > sh->o.queue_max_blocks || sh->q_bytes + bytes > sh->o.queue_max_bytes) {
        sh->st.dropped++;
        return false;
    }
    pub_item *it = calloc(1, sizeof *it);
    if (!it) {
        sh->st.dropped++;
        return false;
    }
    if (b) kvt_block_retain(b);
    if (snap) kvt_snapshot_retain(snap);
    it->b = b;
    it->snap = snap;
    it->bytes = bytes;
    it->t_enq_ms = now_ms();
    if (sh->q_tail) sh->q_tail->next = it;
    else sh->q_head = it;
    sh->q_tail = it;
    sh->q_blocks++;
    sh->q_bytes += bytes;
    uint64_t t = item_tag(it); /* queued once; a failed send forgets it again */
    sh->seen[t % SHARED_SEEN_SLOTS] = t;
    return true;
}

uint32_t kvt_shared_publish_seq(kvt_shared *sh, kvt_seq *seq) {
    if (!sh || !seq) return 0;
    const kvt_kv_layout *l = sh->layout;
    uint32_t nb = kvt_seq_n_blocks(seq), queued = 0;
    /* recurrent layouts: the state at this length too (a copy, taken before the lock) */
    kvt_snapshot *snap = NULL;
    if (sh->recurrent && nb > 0 && kvt_seq_block(seq, 0, nb - 1) && kvt_block_sealed(kvt_seq_block(seq, 0, nb - 1))) {
        pthread_mutex_lock(&sh->mu);
        bool have = seen_has(sh, SHARED_SNAP_GROUP, kvt_seq_block_chain(seq, nb - 1));
        pthread_mutex_unlock(&sh->mu);
        if (!have && kvt_seq_snapshot(seq, &snap) != KVT_OK) snap = NULL;
    }
    pthread_mutex_lock(&sh->mu);
    for (uint32_t i = 0; i < nb && !sh->stop; i++) {
        kvt_block *b = kvt_seq_block(seq, 0, i);
        if (!b || !kvt_block_sealed(b) || seen_has(sh, 0, kvt_block_hash(b))) continue;
        if (enqueue_item(sh, b, NULL, kvt_kv_layout_block_bytes(l, 0, i))) queued++;
    }
    /* after the blocks: a snapshot is only usable once the blocks it covers are there */
    if (snap && !sh->stop && enqueue_item(sh, NULL, snap, kvt_kv_layout_state_bytes(l)))
        queued++;
    if (queued) pthread_cond_signal(&sh->cv_work);
    pthread_mutex_unlock(&sh->mu);
    if (snap) kvt_snapshot_release(snap);
    return queued;
}

/* Sends one batch (lock NOT held). Returns false on an I/O failure; *refused = Redis refused a
 * write (OOM or another error reply), which the caller also feeds to the breaker. */
static bool publish_batch(kvt_shared *sh, pub_item **items, uint32_t k, bool *refused) {
    const char *compat = kvt_ssd_compat(sh->ssd);
    uint8_t *bufs[SHARED_MAX_PIPELINE] = {0};
    size_t blen[SHARED_MAX_PIPELINE] = {0};
    bool stored[SHARED_MAX_PIPELINE] = {0};
    char keys[SHARED_MAX_PIPELINE][KVT_SHARED_KEY_MAX];
    bool io_ok = true;
    uint32_t sent = 0;
    for (uint32_t j = 0; j < k; j++) {
        kvt_block *b = items[j]->b;
        if (!b) {
            kvt_shared_snapshot_key(compat, kvt_snapshot_chain(items[j]->snap), keys[j]);
            if (kvt_ssd_snapshot_record_encode(sh->ssd, items[j]->snap, 0, &bufs[j], &blen[j]) != KVT_OK) bufs[j] = NULL;
            continue;
        }
        bool tail = kvt_block_n_tokens(b) < sh->bt;
        kvt_shared_key(compat, tail, kvt_block_group(b), tail ? kvt_block_parent(b) : kvt_block_hash(b), keys[j]);
        if (kvt_ssd_record_encode(sh->ssd, b, 0, &bufs[j], &blen[j]) != KVT_OK) bufs[j] = NULL;
    }
    for (uint32_t j = 0; j < k && io_ok; j++) {
        if (!bufs[j]) continue;
        const char *argv[4] = {"SET", keys[j], (const char *)bufs[j], "NX"};
        size_t lens[4] = {3, strlen(keys[j]), blen[j], 2};
        if (redisAppendCommandArgv(sh->pub.c, 4, argv, lens) != REDIS_OK) io_ok = false;
        else sent++;
    }
    uint64_t ok = 0, oks = 0, okb = 0, existing = 0, oom = 0, errs = 0, lost = 0;
    for (uint32_t j = 0, got = 0; j < k && io_ok && got < sent; j++) {
        if (!bufs[j]) continue;
        void *rv = NULL;
        if (redisGetReply(sh->pub.c, &rv) != REDIS_OK || !rv) {
            io_ok = false;
            break;
        }
        got++;
        redisReply *r = rv;
        if (r->type == REDIS_REPLY_STATUS) {
            if (items[j]->b) ok++;
            else oks++;
            okb += blen[j];
            stored[j] = true;
        } else if (r->type == REDIS_REPLY_NIL) {
            existing++;
            stored[j] = true;
        } else if (r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, "OOM", 3)) {
            oom++;
        } else {
            errs++;
        }
        freeReplyObject(r);
    }
    for (uint32_t j = 0; j < k; j++) free(bufs[j]);
    pthread_mutex_lock(&sh->mu);
    sh->st.published_blocks += ok;
    sh->st.published_snapshots += oks;
    sh->st.published_bytes += okb;
    sh->st.publish_existing += existing;
    sh->st.oom_errors += oom;
    sh->st.errors += errs + (io_ok ? 0 : 1);
    for (uint32_t j = 0; j < k; j++) { /* not stored: forget it so a later request may retry */
        if (stored[j]) continue;
        lost++;
        item_forget(sh, items[j]);
    }
    sh->st.dropped += lost - oom - errs; /* refused ones are counted as errors already */
    pthread_mutex_unlock(&sh->mu);
    *refused = oom || errs;
    return io_ok;
}

static void *publisher_main(void *arg) {
    kvt_shared *sh = arg;
    sigset_t pipe_set; /* writes to a closed connection fail with EPIPE here instead of killing a CLI */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->stop && !sh->q_head) pthread_cond_wait(&sh->cv_work, &sh->mu);
        if (sh->stop) break;
        uint64_t now = now_ms();
        if (sh->busy && !sh->flush_waiters && now < sh->q_head->t_enq_ms + SHARED_BUSY_MAX_DEFER_MS) { /* bounded deferral */
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            uint64_t wait_ms = sh->q_head->t_enq_ms + SHARED_BUSY_MAX_DEFER_MS - now;
            uint64_t ns = (uint64_t)dl.tv_nsec + wait_ms * 1000000ull;
            dl.tv_sec += (time_t)(ns / 1000000000ull);
            dl.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&sh->cv_work, &sh->mu, &dl);
            continue;
        }
        pub_item *items[SHARED_MAX_PIPELINE];
        uint32_t k = 0;
        while (k < sh->o.pipeline && sh->q_head) {
            pub_item *it = sh->q_head;
            sh->q_head = it->next;
            if (!sh->q_head) sh->q_tail = NULL;
            items[k++] = it;
        }
        sh->in_flight = true;
        bool allowed = kvt_breaker_allow(&sh->pub.br, now);
        pthread_mutex_unlock(&sh->mu);

        bool ok = false, refused = false;
        if (allowed) {
            if (conn_ensure(sh, &sh->pub, sh->o.timeout_ms * 4)) ok = publish_batch(sh, items, k, &refused);
            else {
                pthread_mutex_lock(&sh->mu);
                sh->st.errors++;
                sh->st.dropped += k;
                pthread_mutex_unlock(&sh->mu);
            }
            if (!ok) conn_drop(&sh->pub);
        }
        pthread_mutex_lock(&sh->mu);
        if (!allowed) {
            sh->st.dropped += k; /* breaker open: Redis is down or full; do not pin RAM for it */
            for (uint32_t j = 0; j < k; j++) item_forget(sh, items[j]);
        } else if (ok && !refused) {
            kvt_breaker_success(&sh->pub.br);
        } else {
            kvt_breaker_failure(&sh->pub.br, now_ms());
        }
        sh->st.publish_breaker = sh->pub.br.state;
        for (uint32_t j = 0; j < k; j++) {
            sh->q_blocks--;
            sh->q_bytes -= items[j]->bytes;
        }
        sh->in_flight = false;
        pthread_mutex_unlock(&sh->mu);
        for (uint32_t j = 0; j < k; j++) item_free(items[j]); /* invariant (2) */
        pthread_mutex_lock(&sh->mu);
        pthread_cond_broadcast(&sh->cv_idle);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

void kvt_shared_set_busy(kvt_shared *sh, bool busy) {
    if (!sh) return;
    pthread_mutex_lock(&sh->mu);
    sh->busy = busy;
    pthread_cond_signal(&sh->cv_work);
    pthread_mutex_unlock(&sh->mu);
}

bool kvt_shared_flush(kvt_shared *sh, uint32_t timeout_ms) {
    if (!sh) return true;
    const uint64_t deadline = now_ms() + timeout_ms;
    pthread_mutex_lock(&sh->mu);
    sh->flush_waiters++; /* ends the busy deferral */
    pthread_cond_signal(&sh->cv_work);
    while ((sh->q_head || sh->in_flight) && now_ms() < deadline) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + 20ull * 1000000ull;
        dl.tv_sec += (time_t)(ns / 1000000000ull);
        dl.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&sh->cv_idle, &sh->mu, &dl);
    }
    sh->flush_waiters--;
    bool empty = !sh->q_head && !sh->in_flight;
    pthread_mutex_unlock(&sh->mu);
    return empty;
}

/* ------------------------------------------------------------------ lifecycle, stats */
void kvt_shared_opts_default(kvt_shared_opts *o) {
    memset(o, 0, sizeof *o);
    o->timeout_ms = 1000;
    o->queue_max_bytes = 256ull << 20;
    o->queue_max_blocks = 1024;
    o->pipeline = 4;
}

kvt_status kvt_shared_create(const kvt_shared_opts *o, kvt_ssd *ssd, kvt_shared **out, char *err, size_t errlen) {
    *out = NULL;
    if (!ssd) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--shared-cache needs the SSD tier (--ssd-cache DIR)");
    kvt_shared_url u;
    kvt_status st = kvt_shared_url_parse(o->url, &u, err, errlen);
    if (st != KVT_OK) return st;
    const bool tls_flags = o->tls_ca_file || o->tls_cert_file || o->tls_key_file || o->tls_insecure;
    if (tls_flags && !u.tls)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "--shared-cache-tls-* options need a rediss:// URL (redis:// is plain text)");
    const kvt_kv_layout *layout = kvt_ssd_layout(ssd);
    if (kvt_kv_layout_n_groups(layout) != 1 || kvt_kv_layout_group_kind(layout, 0) != KVT_KIND_FULL)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                        "--shared-cache supports full-attention and hybrid recurrent (qwen35) models; not sliding-window layers yet");
    kvt_shared *sh = calloc(1, sizeof *sh);
    if (!sh) return KVT_ERR_NOMEM;
    sh->o = *o;
    sh->o.url = NULL; /* not kept: it may carry the password */
    if (!sh->o.timeout_ms) sh->o.timeout_ms = 1000;
    if (!sh->o.queue_max_bytes) sh->o.queue_max_bytes = 256ull << 20;
    if (!sh->o.queue_max_blocks) sh->o.queue_max_blocks = 1024;
    if (!sh->o.pipeline) sh->o.pipeline = 4;
    if (sh->o.pipeline > SHARED_MAX_PIPELINE) sh->o.pipeline = SHARED_MAX_PIPELINE;
    sh->o.tls_ca_file = sh->o.tls_cert_file = sh->o.tls_key_file = NULL; /* not kept: borrowed */
    sh->url = u;
    sh->ssd = ssd;
    if (u.tls) {
        kvt_tls_opts to = {.ca_file = o->tls_ca_file, .cert_file = o->tls_cert_file, .key_file = o->tls_key_file,
                           .insecure = o->tls_insecure};
        st = kvt_tls_ctx_create(&to, &sh->tls, err, errlen);
        if (st != KVT_OK) {
            free(sh);
            return st;
        }
        if (o->tls_insecure)
            KVT_WARN("shared tier: TLS certificate verification is OFF (--shared-cache-tls-insecure): "
                     "anyone on the path can read and replace cached KV");
    }
    sh->layout = layout;
    sh->bt = kvt_kv_layout_block_tokens(sh->layout);
    sh->recurrent = kvt_kv_layout_state_bytes(layout) > 0;
    kvt_breaker_init(&sh->fetch.br, SHARED_BREAKER_THRESHOLD, SHARED_BREAKER_BASE_MS, SHARED_BREAKER_MAX_MS);
    kvt_breaker_init(&sh->pub.br, SHARED_BREAKER_THRESHOLD, SHARED_BREAKER_BASE_MS, SHARED_BREAKER_MAX_MS);
    sh->seen = calloc(SHARED_SEEN_SLOTS, sizeof *sh->seen);
    pthread_mutex_init(&sh->mu, NULL);
    pthread_cond_init(&sh->cv_work, NULL);
    pthread_cond_init(&sh->cv_idle, NULL);
    if (!sh->seen || pthread_create(&sh->thread, NULL, publisher_main, sh) != 0) {
        kvt_shared_free(sh);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "cannot start the shared-tier publisher");
    }
    sh->started = true;
    kvt_sigpipe_guard spg;
    kvt_sigpipe_block(&spg);
    bool up = conn_ensure(sh, &sh->fetch, sh->o.timeout_ms);
    kvt_sigpipe_restore(&spg);
    if (!up)
        KVT_WARN("shared tier: %s:%u is not reachable now (cause above); serving from local tiers and retrying later", u.host,
                 u.port);
    else
        KVT_INFO("shared tier: connected to %s:%u db %u%s", u.host, u.port, u.db, u.tls ? " over TLS (verified)" : "");
    *out = sh;
    return KVT_OK;
}

void kvt_shared_free(kvt_shared *sh) {
    if (!sh) return;
    if (sh->started) {
        pthread_mutex_lock(&sh->mu);
        sh->stop = true;
        pthread_cond_broadcast(&sh->cv_work);
        pthread_mutex_unlock(&sh->mu);
        pthread_join(sh->thread, NULL);
    }
    while (sh->q_head) {
        pub_item *it = sh->q_head;
        sh->q_head = it->next;
        item_free(it);
    }
    conn_drop(&sh->fetch);
    conn_drop(&sh->pub);
    pthread_cond_destroy(&sh->cv_work);
    pthread_cond_destroy(&sh->cv_idle);
    pthread_mutex_destroy(&sh->mu);
    free(sh->seen);
    kvt_tls_ctx_free(sh->tls);
    memset(&sh->url, 0, sizeof sh->url); /* the password */
    free(sh);
}

void kvt_shared_stats_get(kvt_shared *sh, kvt_shared_stats *out) {
    memset(out, 0, sizeof *out);
    if (!sh) return;
    pthread_mutex_lock(&sh->mu);
    *out = sh->st;
    out->queue_blocks = sh->q_blocks;
    out->queue_bytes = sh->q_bytes;
    out->publish_breaker = sh->pub.br.state;
    out->fetch_breaker = sh->fetch.br.state;
    out->breaker_opens = sh->fetch.br.opens + sh->pub.br.opens;
    pthread_mutex_unlock(&sh->mu);
}
