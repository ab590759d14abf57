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
 * - Fetch (caller's thread): pipelined GETRANGEs of every group's block along the request's chain
 *   in windows of `pipeline` commands, each reply read by fetch_value (the value straight into one
 *   reused buffer) and verified before the next is read; then the tails at the first position
 *   without full blocks; then plan.h's planner over the sequence's blocks plus the fetched ones
 *   (extend_planned; recurrent layouts: each fetched end is a snapshot candidate, fetched and
 *   verified before it counts), and the planned sequence replaces the caller's (build_seq).
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
 *   (4) Nothing fetched reaches a sequence before kvt_record_decode verified it and its tokens
 *       equal the prompt's at that position, and only as far as kvt_plan_usable_prefix allows.
 *   (5) Recurrent layouts: a fetched prefix reaches the caller only as a whole sequence whose
 *       length is a verified snapshot's position and whose state is that snapshot's.
 */
#include "shared_tier.h"
#include "plan.h"
#include "tls_bridge.h"

#include <ctype.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARED_SEEN_SLOTS 65536u
/* While the engine decodes, a queued item waits at most this long before it is sent (so a publish
 * does not compete with every token), which keeps a sealed block visible in Redis within about a
 * second of its queueing even when the busy flag is stale (set, and the last row has ended). */
#define SHARED_BUSY_MAX_DEFER_MS 300u
#define SHARED_BREAKER_THRESHOLD 3u
#define SHARED_BREAKER_BASE_MS 1000u
#define SHARED_BREAKER_MAX_MS 30000u
#define SHARED_MAX_PIPELINE 64u
#define SHARED_SNAP_GROUP 0xFFFFFFFFu /* the seen set's "group" of snapshots */
#define SHARED_MAX_FETCH_SNAPS 64u    /* recurrent: snapshot positions a lookup tries, longest first */

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
    /* Fetch connection: bytes read from c's socket past the reply lines fetch_value consumed
     * (in[in_pos, in_len)); empty whenever hiredis's own reader is used on c. */
    uint8_t *in;
    size_t in_pos, in_len;
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
    kvt_record_fmt fmt; /* the model's records: layout, pool, compat (owned copy below) */
    char *compat;
    kvt_tls_ctx *tls; /* rediss:// only: verified TLS settings shared by both connections */
    const kvt_kv_layout *layout;
    uint32_t bt;
    bool recurrent; /* the layout has RECURRENT layers: snapshots travel too */
    /* The largest value a fetch accepts: the longest record of a block/tail and of a snapshot this
     * model can produce (kvt_record_max_bytes). Fetches ask for at most one byte more
     * (GETRANGE, append_get), and the reader (fetch_value) refuses a reply whose announced length
     * is longer before reading it, so no value makes a fetch read, hold or wait for more. */
    uint64_t max_block_rec, max_snap_rec;
    char fetch_bad_key[KVT_SHARED_KEY_MAX]; /* an oversized value refused unread: deleted next */
    bool fetch_get_only; /* the ACL refused GETRANGE: fetch with GET (append_get) */

    rconn fetch, pub; /* invariant (1) */
    uint8_t *vbuf;    /* the fetch connection's value buffer (fetch_value), reused */
    size_t vcap;

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

static uint64_t now_ms(void) { return kvt_now_ns() / 1000000ull; }

/* ------------------------------------------------------------------ bounded replies */
typedef enum { REPLY_OK = 1, REPLY_IO = 0, REPLY_OVERSIZED = -1 } reply_rc;

/* Sends what hiredis has buffered and reads one reply, never waiting past `deadline` (absolute,
 * now_ms clock) and never buffering more than `cap` unconsumed bytes of it: hiredis's own
 * redisGetReply waits up to the socket timeout per read and buffers a reply of any size, so a
 * value of hundreds of MB (or a server that trickles bytes) would hold a lookup far past its
 * budget. REPLY_IO (error, timeout) and REPLY_OVERSIZED leave the context unusable (the caller
 * drops it). */
static reply_rc fetch_reply(redisContext *c, uint64_t deadline, uint64_t cap, redisReply **out) {
    *out = NULL;
    for (int done = 0; !done;) {
        const uint64_t now = now_ms();
        if (now >= deadline) return REPLY_IO;
        redisSetTimeout(c, tv_ms(deadline - now));
        if (redisBufferWrite(c, &done) != REDIS_OK) return REPLY_IO;
    }
    for (;;) {
        void *r = NULL;
        if (redisGetReplyFromReader(c, &r) != REDIS_OK) return REPLY_IO;
        if (r) {
            *out = r;
            return REPLY_OK;
        }
        /* no whole reply buffered: what is buffered belongs to this one reply */
        if (c->reader->len - c->reader->pos > cap) return REPLY_OVERSIZED;
        const uint64_t now = now_ms();
        if (now >= deadline) return REPLY_IO;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        const int pr = poll(&p, 1, (int)KVT_MIN(deadline - now, (uint64_t)INT_MAX));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return REPLY_IO;
        if (redisBufferRead(c) != REDIS_OK) return REPLY_IO; /* one read of what is there */
    }
}

/* One command with a bounded reply (fetch_reply). */
static reply_rc bounded_cmd(redisContext *c, uint64_t deadline, uint64_t cap, int argc, const char **argv, const size_t *lens,
                            redisReply **out) {
    *out = NULL;
    if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK) return REPLY_IO;
    return fetch_reply(c, deadline, cap, out);
}

/* Sends what hiredis has buffered on c, by deadline. */
static bool conn_send(redisContext *c, uint64_t deadline) {
    for (int done = 0; !done;) {
        const uint64_t now = now_ms();
        if (now >= deadline) return false;
        redisSetTimeout(c, tv_ms(deadline - now));
        if (redisBufferWrite(c, &done) != REDIS_OK) return false;
    }
    return true;
}

/* One read of what c's socket has (at most cap bytes into dst), waiting no later than deadline.
 * Returns the bytes read, or 0 on a timeout, an error or a closed connection. */
static size_t conn_read(redisContext *c, uint64_t deadline, uint8_t *dst, size_t cap) {
    for (;;) {
        const uint64_t now = now_ms();
        if (now >= deadline) return 0;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        const int pr = poll(&p, 1, (int)KVT_MIN(deadline - now, (uint64_t)INT_MAX));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return 0;
        const ssize_t n = read(c->fd, dst, cap);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        return n > 0 ? (size_t)n : 0;
    }
}

#define FETCH_IN_BYTES (64u << 10) /* the fetch connection's line buffer */
#define FETCH_LINE_MAX 4096u      /* no reply line (length, error, status) of ours is longer */

/* One reply of the fetch connection (fetch_value): STRING (a value: str/len in the tier's value
 * buffer), NIL, or an ERROR / STATUS / INTEGER line (str/len in the line buffer). Valid until the
 * next fetch_value. */
typedef struct fval {
    int type; /* REDIS_REPLY_* */
    const char *str;
    size_t len;
} fval;

/* Reads the next reply on the fetch connection itself instead of hiredis's reader, which would
 * copy a value three times (16 KB reads into its buffer, that buffer grown by reallocation, then
 * into a reply object): the "$<len>" line is parsed from a small line buffer, and the value is
 * read straight into the tier's value buffer (grown once, reused by every value), in reads as
 * large as the socket has. A value longer than cap is refused by its announced length, unread
 * (REPLY_OVERSIZED); nothing waits past deadline. REPLY_IO and REPLY_OVERSIZED leave the
 * connection unusable (the caller drops it). */
static reply_rc fetch_value(kvt_shared *sh, uint64_t deadline, uint64_t cap, fval *out) {
    rconn *rc = &sh->fetch;
    memset(out, 0, sizeof *out);
    if (!rc->in && !(rc->in = malloc(FETCH_IN_BYTES))) return REPLY_IO;
    const uint8_t *nl;
    for (;;) { /* a whole line */
        const size_t avail = rc->in_len - rc->in_pos;
        nl = avail >= 2 ? memmem(rc->in + rc->in_pos, avail, "\r\n", 2) : NULL;
        if (nl) break;
        if (avail > FETCH_LINE_MAX) return REPLY_IO;
        memmove(rc->in, rc->in + rc->in_pos, avail);
        rc->in_pos = 0;
        rc->in_len = avail;
        const size_t n = conn_read(rc->c, deadline, rc->in + rc->in_len, FETCH_IN_BYTES - rc->in_len);
        if (!n) return REPLY_IO;
        rc->in_len += n;
    }
    const char *line = (const char *)rc->in + rc->in_pos;
    const size_t ll = (size_t)((const char *)nl - line);
    rc->in_pos += ll + 2;
    if (ll == 0) return REPLY_IO;
    out->str = line + 1;
    out->len = ll - 1;
    switch (line[0]) {
    case '-': out->type = REDIS_REPLY_ERROR; return REPLY_OK;
    case '+': out->type = REDIS_REPLY_STATUS; return REPLY_OK;
    case ':': out->type = REDIS_REPLY_INTEGER; return REPLY_OK;
    case '$': break;
    default: return REPLY_IO; /* arrays and anything else: not a reply to GET / GETRANGE */
    }
    if (ll == 3 && !memcmp(line, "$-1", 3)) {
        out->type = REDIS_REPLY_NIL;
        out->str = NULL;
        out->len = 0;
        return REPLY_OK;
    }
    uint64_t len = 0;
    if (ll < 2 || ll > 21) return REPLY_IO;
    for (size_t i = 1; i < ll; i++) {
        if (line[i] < '0' || line[i] > '9') return REPLY_IO;
        len = len * 10 + (uint64_t)(line[i] - '0');
    }
    if (len > cap) return REPLY_OVERSIZED;
    const size_t need = (size_t)len + 2; /* the value and its "\r\n" */
    if (need > sh->vcap) {
        uint8_t *nb = realloc(sh->vbuf, need);
        if (!nb) return REPLY_IO;
        sh->vbuf = nb;
        sh->vcap = need;
    }
    size_t got = KVT_MIN(need, rc->in_len - rc->in_pos);
    memcpy(sh->vbuf, rc->in + rc->in_pos, got);
    rc->in_pos += got;
    while (got < need) {
        const size_t n = conn_read(rc->c, deadline, sh->vbuf + got, need - got);
        if (!n) return REPLY_IO;
        got += n;
    }
    if (sh->vbuf[len] != '\r' || sh->vbuf[len + 1] != '\n') return REPLY_IO;
    out->type = REDIS_REPLY_STRING;
    out->str = (const char *)sh->vbuf;
    out->len = (size_t)len;
    return REPLY_OK;
}

static void conn_drop(rconn *rc) {
    if (rc->c) redisFree(rc->c); /* closes hiredis's end of the TLS bridge too */
    rc->c = NULL;
    rc->in_pos = rc->in_len = 0;
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

/* One connection-setup command (AUTH, SELECT, PING) that must answer +OK/+PONG by deadline; on
 * anything else the reason is noted and the connection dropped. */
static bool setup_cmd(kvt_shared *sh, rconn *rc, uint64_t deadline, const char *what, int argc, const char **argv,
                      const size_t *lens) {
    redisReply *r = NULL;
    bounded_cmd(rc->c, deadline, 4096, argc, argv, lens, &r);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok) {
        char why[560];
        if (r) snprintf(why, sizeof why, "%s refused: %.*s", what, (int)KVT_MIN(r->len, (size_t)200), r->str ? r->str : "");
        else snprintf(why, sizeof why, "%s failed: %s%s", what, rc->c->errstr[0] ? rc->c->errstr : "timed out or connection lost",
                      sh->tls ? " (over TLS: a refused client certificate looks like this)" : "");
        conn_note_failure(sh, rc, why);
    }
    if (r) freeReplyObject(r);
    if (!ok) conn_drop(rc);
    return ok;
}

/* Connects (if needed) within budget_ms, setup commands included. False = unreachable (context
 * dropped). */
static bool conn_ensure(kvt_shared *sh, rconn *rc, uint64_t budget_ms) {
    const uint64_t deadline = now_ms() + budget_ms;
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
        if (!setup_cmd(sh, rc, deadline, "AUTH", argc, argv, lens)) return false;
    }
    if (sh->url.db) {
        char db[16];
        snprintf(db, sizeof db, "%u", sh->url.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        if (!setup_cmd(sh, rc, deadline, "SELECT", 2, argv, lens)) return false;
    }
    if (sh->tls && !sh->url.password[0] && !sh->url.db) {
        /* TLS 1.3 reports a refused client certificate only after the handshake: one PING makes
         * that a connect failure with its reason instead of a silent error on the first GET */
        const char *argv[1] = {"PING"};
        size_t lens[1] = {4};
        if (!setup_cmd(sh, rc, deadline, "PING", 1, argv, lens)) return false;
    }
    if (rc->last_err[0]) KVT_INFO("shared tier: connected to %s:%u again", sh->url.host, sh->url.port);
    rc->last_err[0] = 0;
    pthread_mutex_lock(&sh->mu);
    sh->st.last_error[0] = 0;
    pthread_mutex_unlock(&sh->mu);
    return true;
}


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
 * Only between round trips (never while pipelined replies are pending), and only while the
 * lookup's budget lasts (else it is left for a later lookup). False: the connection is unusable. */
static bool drop_bad_key(kvt_shared *sh, const char *key, uint64_t deadline) {
    if (!sh->fetch.c || sh->fetch.in_pos != sh->fetch.in_len) return false; /* bytes nobody asked for */
    if (now_ms() >= deadline) return true;
    const char *argv[2] = {"DEL", key};
    size_t lens[2] = {3, strlen(key)};
    redisReply *r = NULL;
    const reply_rc rc = bounded_cmd(sh->fetch.c, deadline, 4096, 2, argv, lens, &r);
    if (r) freeReplyObject(r);
    return rc == REPLY_OK;
}

/* A value longer than any record of this model (len 0: the reader refused it by its announced
 * length, unread): counted as oversized and as corrupt (no record is that long). A value seen
 * whole is deleted by the caller; one refused unread is remembered in fetch_bad_key and deleted
 * after the connection it arrived on was dropped (kvt_shared_extend). */
static void count_oversized(kvt_shared *sh, const char *key, uint64_t len, uint64_t max) {
    if (len) KVT_WARN("shared tier: value %s is %llu bytes, longer than any record of this model (%llu); deleting it", key,
                      (unsigned long long)len, (unsigned long long)max);
    else KVT_WARN("shared tier: value %s is longer than any record of this model (%llu bytes); refused before it was read, "
                  "deleting it", key, (unsigned long long)max);
    if (!len) snprintf(sh->fetch_bad_key, sizeof sh->fetch_bad_key, "%.*s", (int)(KVT_SHARED_KEY_MAX - 1), key);
    pthread_mutex_lock(&sh->mu);
    sh->st.oversized++;
    sh->st.corrupt++;
    pthread_mutex_unlock(&sh->mu);
}

/* Queues GETRANGE key 0 max: Redis answers at most max+1 bytes, so a longer value is recognized by
 * its length without Redis even building the long reply (a GET of a 64 MB value holds Redis for
 * hundreds of ms before the first byte, and every reply pipelined behind it); a missing key answers
 * "" (a miss). Where the ACL does not allow GETRANGE (NOPERM, see fetch_get_only), plain GET; the
 * bounded reader and the deadline still hold then. */
static bool append_get(kvt_shared *sh, const char *key, uint64_t max) {
    char end[24];
    snprintf(end, sizeof end, "%llu", (unsigned long long)max);
    const char *argv[4] = {sh->fetch_get_only ? "GET" : "GETRANGE", key, "0", end};
    size_t lens[4] = {strlen(argv[0]), strlen(key), 1, strlen(end)};
    return redisAppendCommandArgv(sh->fetch.c, sh->fetch_get_only ? 2 : 4, argv, lens) == REDIS_OK;
}

/* Counts one error reply (e.g. a wrong type under our key): a miss. */
static void count_error_reply(kvt_shared *sh) {
    pthread_mutex_lock(&sh->mu);
    sh->st.errors++;
    pthread_mutex_unlock(&sh->mu);
}
/* An error reply: NOPERM for GETRANGE switches this tier to GET (warned once); any error reply is
 * counted (a miss). */
static void note_error_reply(kvt_shared *sh, const fval *r) {
    if (!sh->fetch_get_only && r->str && r->len >= 6 && !strncmp(r->str, "NOPERM", 6)) {
        sh->fetch_get_only = true;
        KVT_WARN("shared tier: the Redis user may not run GETRANGE (%.*s); fetching with GET instead. Allow +getrange "
                 "(docs/shared-tier.md): with GET, an oversized value planted in Redis costs Redis time on every lookup",
                 (int)KVT_MIN(r->len, (size_t)120), r->str);
    }
    count_error_reply(sh);
}

/* Reads the reply to one append_get of key (sent already), refusing a value longer than max + 1
 * bytes unread (GETRANGE answers at most max + 1: only a server that ignores it sends more) and
 * at the deadline (fetch_value). False: the connection is unusable (an oversized reply is counted
 * and its key remembered for deletion). */
static bool read_value(kvt_shared *sh, const char *key, uint64_t max, uint64_t deadline, fval *out) {
    const reply_rc rc = fetch_value(sh, deadline, max + 1, out);
    if (rc == REPLY_OVERSIZED) count_oversized(sh, key, 0, max);
    return rc == REPLY_OK;
}

/* One value: append_get, send, read_value. */
static bool get_value(kvt_shared *sh, const char *key, uint64_t max, uint64_t deadline, fval *out) {
    return append_get(sh, key, max) && conn_send(sh->fetch.c, deadline) && read_value(sh, key, max, deadline, out);
}

static void count_corrupt(kvt_shared *sh, const char *key, const char *why) {
    KVT_WARN("shared tier: value %s failed verification (%s); deleting it", key, why);
    pthread_mutex_lock(&sh->mu);
    sh->st.corrupt++;
    pthread_mutex_unlock(&sh->mu);
}

/* Verifies one reply for (kind, expect, group, index): the decoded sealed block (caller owns it) or
 * NULL (miss, error reply, no pool memory, or a bad value: then *bad = delete it). */
static kvt_block *decode_reply(kvt_shared *sh, const fval *r, const char *key, uint32_t kind, uint64_t expect, uint32_t group,
                               uint32_t index, bool *bad) {
    *bad = false;
    if (r->type == REDIS_REPLY_NIL || (r->type == REDIS_REPLY_STRING && r->len == 0)) return NULL;
    if (r->type != REDIS_REPLY_STRING) {
        if (r->type == REDIS_REPLY_ERROR) note_error_reply(sh, r);
        else count_error_reply(sh);
        return NULL;
    }
    if (r->len > sh->max_block_rec) {
        count_oversized(sh, key, r->len, sh->max_block_rec);
        *bad = true;
        return NULL;
    }
    char why[160] = {0};
    kvt_block *b = NULL;
    kvt_status st = kvt_record_decode(&sh->fmt, (uint8_t *)r->str, r->len, kind, expect, group, index, &b, why, sizeof why);
    if (st == KVT_ERR_POOL_EXHAUSTED || st == KVT_ERR_NOMEM) return NULL;
    if (st != KVT_OK) {
        count_corrupt(sh, key, why);
        *bad = true;
        return NULL;
    }
    return b;
}

/* One unit to fetch: a full block (kind BLOCK, expect = its chain hash) or a frozen tail (kind TAIL,
 * expect = its parent chain hash) of one group at one block index. */
typedef struct unit_req {
    uint32_t kind, group, index;
    uint64_t expect;
} unit_req;

/* Pipelines the GETs of n units (each window of `pipeline` commands is sent, then its replies are
 * read and verified in order); out[i] = the verified block whose tokens equal the prompt's at its
 * position for as many tokens as it holds (tails: at least one; the caller compares further), or
 * NULL; bytes[i] = its value's length. Values that failed verification are deleted between round
 * trips. Returns false when the connection is unusable (what was fetched stays in out[]). */
static bool fetch_units(kvt_shared *sh, const unit_req *u, uint32_t n, const int32_t *prompt, uint32_t n_prompt,
                        uint64_t deadline, kvt_block **out, uint64_t *bytes) {
    const uint32_t P = sh->o.pipeline, bt = sh->bt;
    char keys[SHARED_MAX_PIPELINE][KVT_SHARED_KEY_MAX];
    bool bad[SHARED_MAX_PIPELINE];
    for (uint32_t i = 0; i < n; i++) out[i] = NULL, bytes[i] = 0;
    for (uint32_t w0 = 0; w0 < n; w0 += P) {
        const uint32_t w = KVT_MIN(P, n - w0);
        if (now_ms() >= deadline) return true; /* budget spent: a shorter prefix, not a failure */
        for (uint32_t j = 0; j < w; j++) {
            const unit_req *q = &u[w0 + j];
            kvt_shared_key(sh->fmt.compat, q->kind == KVT_RECORD_TAIL, q->group, q->expect, keys[j]);
            bad[j] = false;
            if (!append_get(sh, keys[j], sh->max_block_rec)) return false;
        }
        if (!conn_send(sh->fetch.c, deadline)) return false;
        for (uint32_t j = 0; j < w; j++) {
            const unit_req *q = &u[w0 + j];
            fval r;
            if (!read_value(sh, keys[j], sh->max_block_rec, deadline, &r)) return false;
            kvt_block *b = decode_reply(sh, &r, keys[j], q->kind, q->expect, q->group, q->index, &bad[j]);
            const uint64_t pos = (uint64_t)q->index * bt;
            if (b) { /* the chain hash covers the tokens; the prompt decides how many are usable */
                const uint32_t m = kvt_block_n_tokens(b);
                const int32_t *t = kvt_block_tokens(b);
                bool match = pos < n_prompt && t[0] == prompt[pos];
                for (uint32_t x = 0; match && q->kind == KVT_RECORD_BLOCK && x < m; x++)
                    match = pos + x < n_prompt && t[x] == prompt[pos + x];
                if (match) {
                    out[w0 + j] = b;
                    bytes[w0 + j] = r.len;
                } else {
                    kvt_block_release(b);
                }
            }
        }
        for (uint32_t j = 0; j < w; j++)
            if (bad[j] && !drop_bad_key(sh, keys[j], deadline)) return false;
    }
    return true;
}

/* What Redis holds along the request's chain, as the planner (plan.h) sees it: the sequence's own
 * blocks [0, i0), then the fetched full blocks [i0, k) (blk, per index n_groups entries, NULL =
 * missing) and the frozen tails at index k (tail, per group). */
typedef struct fetched {
    const kvt_shared *sh;
    const kvt_seq *seq;
    const int32_t *prompt;
    uint32_t G, i0, k;
    kvt_block **blk;                   /* (k - i0) * G */
    uint64_t *blk_bytes;
    kvt_block *tail[KVT_MAX_GROUPS];
    uint64_t tail_bytes[KVT_MAX_GROUPS];
    uint32_t tail_match[KVT_MAX_GROUPS]; /* tokens of the tail equal to the prompt's */
    bool cut_ok;                       /* the last unit may be longer than the cut (FULL groups only) */
} fetched;

static kvt_block *fetched_at(const fetched *f, uint32_t i, uint32_t g) {
    return i < f->i0 ? kvt_seq_block(f->seq, g, i) : f->blk[(size_t)(i - f->i0) * f->G + g];
}

static uint32_t fetched_held(void *ctx, uint32_t i) {
    const fetched *f = ctx;
    uint32_t m = 0;
    for (uint32_t g = 0; g < f->G; g++)
        if (fetched_at(f, i, g)) m |= 1u << g;
    return m;
}

/* The last unit of a plan: index j < k (a full block in every group) or j == k (the tails); its
 * first m tokens equal the prompt's. Where the sequence cannot be cut (window or recurrent layers)
 * only a unit of exactly m tokens. Returns the unit's first group entry (the planner's handle). */
static const void *fetched_rows(void *ctx, uint32_t j, uint32_t m) {
    const fetched *f = ctx;
    if (j < f->k) {
        if (j < f->i0) return NULL; /* ends inside what the sequence has already */
        for (uint32_t g = 0; g < f->G; g++)
            if (!fetched_at(f, j, g)) return NULL;
        if (m != f->sh->bt && !f->cut_ok) return NULL;
        return &f->blk[(size_t)(j - f->i0) * f->G];
    }
    if (j != f->k) return NULL;
    for (uint32_t g = 0; g < f->G; g++) {
        if (!f->tail[g] || f->tail_match[g] < m) return NULL;
        if (m != kvt_block_n_tokens(f->tail[g]) && !f->cut_ok) return NULL;
    }
    return &f->tail[0];
}

/* The recurrent state at a snapshot position: GET + verify into state. 1 = found, 0 = none
 * (missing or bad; a bad value is deleted), -1 = the connection is unusable. */
static int fetch_snapshot(kvt_shared *sh, uint64_t chain, uint32_t pos, uint64_t deadline, uint8_t *state, uint64_t *len) {
    char key[KVT_SHARED_KEY_MAX];
    kvt_shared_snapshot_key(sh->fmt.compat, chain, key);
    fval rv;
    if (!get_value(sh, key, sh->max_snap_rec, deadline, &rv)) return -1;
    const fval *r = &rv;
    int found = 0;
    bool drop = false;
    if (r->type == REDIS_REPLY_STRING && r->len > sh->max_snap_rec) {
        count_oversized(sh, key, r->len, sh->max_snap_rec);
        drop = true;
    } else if (r->type == REDIS_REPLY_STRING && r->len > 0) { /* "" = missing (GETRANGE) */
        char why[160] = {0};
        kvt_status st = kvt_record_snapshot_decode(&sh->fmt, (uint8_t *)r->str, r->len, chain, pos, state, why, sizeof why);
        if (st == KVT_OK) {
            found = 1;
            *len = r->len;
        } else if (st != KVT_ERR_NOMEM) {
            count_corrupt(sh, key, why);
            drop = true;
        }
    } else if (r->type == REDIS_REPLY_ERROR) {
        note_error_reply(sh, r);
    } else if (r->type != REDIS_REPLY_NIL && r->type != REDIS_REPLY_STRING) {
        count_error_reply(sh);
    }
    if (drop && !drop_bad_key(sh, key, deadline)) return -1;
    return found;
}

/* Builds the sequence of a plan: seq's blocks and the fetched ones below the last index (minus
 * WINDOW blocks outside the window of L), the last unit (cut to L where allowed), the state. */
static kvt_status build_seq(const fetched *f, const kvt_plan_geom *geom, const kvt_plan_prefix *pp, const uint8_t *state,
                            kvt_seq **out) {
    kvt_seq *ns = NULL;
    kvt_status st = kvt_seq_create(kvt_seq_pool(f->seq), kvt_seq_root(f->seq), &ns);
    for (uint32_t i = 0; i < pp->n_full && st == KVT_OK; i++) {
        kvt_block *bl[KVT_MAX_GROUPS] = {0};
        const uint32_t need = kvt_plan_need_mask(geom, pp->len, i, fetched_held((void *)f, i));
        for (uint32_t g = 0; g < f->G; g++)
            if ((need >> g) & 1u) bl[g] = fetched_at(f, i, g);
        st = kvt_seq_append_blocks(ns, bl);
    }
    if (st == KVT_OK) st = kvt_seq_append_blocks(ns, (kvt_block *const *)pp->last);
    if (st == KVT_OK && kvt_seq_len(ns) > pp->len) st = kvt_seq_trim(ns, pp->len);
    if (st == KVT_OK && state) {
        const kvt_kv_layout *l = f->sh->layout;
        for (uint32_t li = 0; li < kvt_kv_layout_n_layers(l); li++) {
            uint8_t *dst = kvt_seq_state(ns, li);
            if (dst) memcpy(dst, state + kvt_kv_layout_state_offset(l, li), kvt_kv_layout_layer(l, li)->state_bytes);
        }
    }
    if (st == KVT_OK && kvt_seq_len(ns) != pp->len) st = KVT_ERR_CORRUPT;
    if (st != KVT_OK && ns) {
        kvt_seq_free(ns);
        ns = NULL;
    }
    *out = ns;
    return st;
}

/* Fetches what Redis holds along the chain past seq's length, plans the longest usable prefix over
 * it with the tiers' one planner (kvt_plan_usable_prefix: the n-1 cap, the window rule, the
 * snapshot rule), and replaces *seqp by the planned sequence when it is longer. Returns io_ok. */
static bool extend_planned(kvt_shared *sh, kvt_seq **seqp, const kvt_chain *chain, uint64_t deadline, uint32_t *gained) {
    kvt_seq *seq = *seqp;
    const int32_t *prompt = kvt_chain_tokens(chain);
    const uint32_t bt = sh->bt, n = kvt_chain_len(chain), L0 = kvt_seq_len(seq), i0 = L0 / bt;
    const uint32_t G = KVT_MIN(kvt_kv_layout_n_groups(sh->layout), (uint32_t)KVT_MAX_GROUPS);
    kvt_plan_geom geom;
    kvt_plan_geom_init(&geom, sh->layout);
    uint32_t full_mask = 0, has_window = 0;
    for (uint32_t g = 0; g < G; g++) {
        if (geom.window[g]) has_window = 1;
        else full_mask |= 1u << g;
    }
    /* full blocks that start below n-1 and that the prompt holds whole */
    uint32_t nidx = 0;
    while ((i0 + nidx + 1) * bt <= n && (i0 + nidx) * bt + 1 < n) nidx++;
    fetched f = {.sh = sh, .seq = seq, .prompt = prompt, .G = G, .i0 = i0, .k = i0, .cut_ok = !has_window && !sh->recurrent};
    f.blk = calloc((size_t)nidx * G + 1, sizeof *f.blk);
    f.blk_bytes = calloc((size_t)nidx * G + 1, sizeof *f.blk_bytes);
    unit_req *reqs = calloc((size_t)(nidx + 1) * G, sizeof *reqs);
    const size_t sbytes = kvt_kv_layout_state_bytes(sh->layout);
    uint8_t *state = sh->recurrent ? malloc(sbytes) : NULL;
    bool io_ok = true;
    if (!f.blk || !f.blk_bytes || !reqs || (sh->recurrent && !state)) goto done; /* no memory is not Redis's fault */

    /* 1. full blocks, a window of indices at a time, until an index misses a FULL group */
    const uint32_t step = KVT_MAX(1u, sh->o.pipeline / G);
    for (uint32_t i = 0; i < nidx && io_ok && f.k == i0 + i;) {
        const uint32_t w = KVT_MIN(step, nidx - i);
        for (uint32_t j = 0; j < w; j++)
            for (uint32_t g = 0; g < G; g++)
                reqs[(size_t)j * G + g] = (unit_req){KVT_RECORD_BLOCK, g, i0 + i + j, kvt_chain_at(chain, i0 + i + j + 1)};
        io_ok = fetch_units(sh, reqs, w * G, prompt, n, deadline, f.blk + (size_t)i * G, f.blk_bytes + (size_t)i * G);
        for (uint32_t j = 0; j < w && f.k == i0 + i + j; j++) {
            const uint32_t h = fetched_held(&f, i0 + i + j);
            if ((h & full_mask) == full_mask && h) f.k++;
        }
        i += w;
        if (now_ms() >= deadline) break;
    }
    /* 2. the frozen tails at the first index without full blocks */
    if (io_ok && f.k * bt + 1 < n && now_ms() < deadline) {
        const uint64_t parent = kvt_chain_at(chain, f.k);
        for (uint32_t g = 0; g < G; g++) reqs[g] = (unit_req){KVT_RECORD_TAIL, g, f.k, parent};
        io_ok = fetch_units(sh, reqs, G, prompt, n, deadline, f.tail, f.tail_bytes);
        for (uint32_t g = 0; g < G; g++) {
            if (!f.tail[g]) continue;
            const int32_t *t = kvt_block_tokens(f.tail[g]);
            const uint32_t m = kvt_block_n_tokens(f.tail[g]), pos = f.k * bt;
            while (f.tail_match[g] < m && pos + f.tail_match[g] < n && t[f.tail_match[g]] == prompt[pos + f.tail_match[g]])
                f.tail_match[g]++;
        }
    }
    /* 3. plan; recurrent layouts: candidate snapshots at every fetched end, longest usable first,
     * each verified before it counts (a missing or bad one is struck and the plan redone) */
    kvt_plan_index ix = {.ctx = &f, .k = f.k, .match = f.k * bt, .held = fetched_held, .rows = fetched_rows};
    uint32_t tm = 0;
    for (uint32_t g = 0; g < G; g++) tm = KVT_MAX(tm, f.tail_match[g]);
    ix.match += tm;
    uint32_t spos[1 + SHARED_MAX_FETCH_SNAPS];
    const void *shandle[1 + SHARED_MAX_FETCH_SNAPS];
    uint32_t ns = 0;
    if (sh->recurrent) {
        if (f.tail[0] && f.tail_match[0] == kvt_block_n_tokens(f.tail[0])) spos[ns++] = f.k * bt + f.tail_match[0];
        for (uint32_t i = f.k; i > i0 && ns < 1 + SHARED_MAX_FETCH_SNAPS; i--) spos[ns++] = i * bt;
        for (uint32_t s = 0; s < ns; s++) shandle[s] = &spos[s];
        ix.snap_pos = spos;
        ix.snap = shandle;
    }
    kvt_plan_prefix pp;
    uint64_t snap_len = 0;
    for (;;) {
        ix.n_snaps = ns;
        kvt_plan_usable_prefix(&geom, &ix, n, &pp);
        if (pp.len <= L0 || !sh->recurrent) break;
        if (!io_ok || now_ms() >= deadline) { /* no verified snapshot: nothing is usable */
            pp.len = 0;
            break;
        }
        kvt_block *const *last = pp.last;
        const uint64_t sc = kvt_block_hash(last[0]); /* chain of the tokens [0, len): the last unit's */
        const int got = fetch_snapshot(sh, sc, pp.len, deadline, state, &snap_len);
        if (got > 0) break;
        if (got < 0) io_ok = false;
        spos[(const uint32_t *)pp.snap - spos] = 0; /* strike this candidate and plan again */
    }
    if (pp.len > L0) {
        kvt_seq *out = NULL;
        if (build_seq(&f, &geom, &pp, sh->recurrent ? state : NULL, &out) == KVT_OK) {
            /* count and remember what was used: the fetched units below the cut, and the snapshot */
            uint64_t bytes = snap_len, blocks = 0;
            pthread_mutex_lock(&sh->mu);
            for (uint32_t i = i0; i <= pp.n_full; i++)
                for (uint32_t g = 0; g < G; g++) {
                    kvt_block *b = kvt_seq_block(out, g, i);
                    if (!b) continue;
                    const bool is_tail = i == f.k;
                    if (b != (is_tail ? f.tail[g] : f.blk[(size_t)(i - i0) * G + g])) continue;
                    bytes += is_tail ? f.tail_bytes[g] : f.blk_bytes[(size_t)(i - i0) * G + g];
                    blocks++;
                    seen_add(sh, g, kvt_block_hash(b));
                }
            sh->st.fetched_blocks += blocks;
            sh->st.fetched_bytes += bytes;
            sh->st.fetched_tokens += pp.len - L0;
            if (sh->recurrent) {
                sh->st.fetched_snapshots++;
                seen_add(sh, SHARED_SNAP_GROUP, kvt_seq_block_chain(out, pp.n_full));
            }
            pthread_mutex_unlock(&sh->mu);
            *gained = pp.len - L0;
            kvt_seq_free(seq);
            *seqp = out;
        }
    }
done:
    for (size_t i = 0; f.blk && i < (size_t)nidx * G; i++)
        if (f.blk[i]) kvt_block_release(f.blk[i]);
    for (uint32_t g = 0; g < G; g++)
        if (f.tail[g]) kvt_block_release(f.tail[g]);
    free(f.blk);
    free(f.blk_bytes);
    free(reqs);
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
    sh->fetch_bad_key[0] = 0;
    uint32_t got = 0;
    if (io_ok) io_ok = extend_planned(sh, seqp, chain, deadline, &got);
    if (!io_ok) conn_drop(&sh->fetch);
    if (sh->fetch_bad_key[0]) {
        /* an oversized value was refused unread (its connection had to go): delete it on a fresh
         * connection, within what is left of the budget; then this was no connection failure */
        const uint64_t now = now_ms();
        if (now < deadline && conn_ensure(sh, &sh->fetch, deadline - now) && drop_bad_key(sh, sh->fetch_bad_key, deadline))
            io_ok = true;
        else conn_drop(&sh->fetch);
    }
    kvt_sigpipe_restore(&spg);
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
    for (uint32_t i = 0; i < nb && !sh->stop; i++)
        for (uint32_t g = 0; g < kvt_kv_layout_n_groups(l); g++) { /* a WINDOW block already dropped is NULL */
            kvt_block *b = kvt_seq_block(seq, g, i);
            if (!b || !kvt_block_sealed(b) || seen_has(sh, g, kvt_block_hash(b))) continue;
            if (enqueue_item(sh, b, NULL, kvt_kv_layout_block_bytes(l, g, i))) queued++;
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
    const char *compat = sh->fmt.compat;
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
            if (kvt_record_snapshot_encode(&sh->fmt, items[j]->snap, 0, &bufs[j], &blen[j]) != KVT_OK) bufs[j] = NULL;
            continue;
        }
        bool tail = kvt_block_n_tokens(b) < sh->bt;
        kvt_shared_key(compat, tail, kvt_block_group(b), tail ? kvt_block_parent(b) : kvt_block_hash(b), keys[j]);
        if (kvt_record_encode(&sh->fmt, b, 0, &bufs[j], &blen[j]) != KVT_OK) bufs[j] = NULL;
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

void kvt_shared_flush_wait(kvt_shared *sh, uint32_t timeout_ms, kvt_shared_flush_result *out) {
    memset(out, 0, sizeof *out);
    if (!sh) {
        out->empty = true;
        return;
    }
    const uint64_t t0 = now_ms(), deadline = t0 + timeout_ms;
    pthread_mutex_lock(&sh->mu);
    const uint64_t lost0 = sh->st.dropped + sh->st.oom_errors;
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
    out->empty = !sh->q_head && !sh->in_flight;
    out->pending_blocks = sh->q_blocks;
    out->pending_bytes = sh->q_bytes;
    out->lost = sh->st.dropped + sh->st.oom_errors - lost0;
    if (out->lost || !out->empty) {
        if (sh->st.last_error[0])
            snprintf(out->error, sizeof out->error, "%s", sh->st.last_error);
        else if (!out->empty)
            snprintf(out->error, sizeof out->error, "publishes still pending after %u ms", timeout_ms);
        else
            snprintf(out->error, sizeof out->error, "Redis refused or dropped %llu publishes", (unsigned long long)out->lost);
    }
    pthread_mutex_unlock(&sh->mu);
    out->elapsed_ms = (double)(now_ms() - t0);
}

bool kvt_shared_flush(kvt_shared *sh, uint32_t timeout_ms) {
    kvt_shared_flush_result r;
    kvt_shared_flush_wait(sh, timeout_ms, &r);
    return r.empty;
}

/* ------------------------------------------------------------------ lifecycle, stats */
void kvt_shared_opts_default(kvt_shared_opts *o) {
    memset(o, 0, sizeof *o);
    o->timeout_ms = 1000;
    o->queue_max_bytes = 256ull << 20;
    o->queue_max_blocks = 1024;
    o->pipeline = 16;
}

kvt_status kvt_shared_create(const kvt_shared_opts *o, kvt_ssd *ssd, kvt_shared **out, char *err, size_t errlen) {
    *out = NULL;
    kvt_record_fmt f = {.layout = o->layout, .pool = o->pool, .compat = o->compat_key};
    if (ssd) kvt_ssd_record_fmt(ssd, &f);
    const kvt_kv_layout *layout = f.layout;
    kvt_block_pool *pool = f.pool;
    const char *compat = f.compat;
    if (!layout || !pool || !compat || !compat[0])
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shared tier: no model identity (layout, pool, compat key)");
    kvt_shared_url u;
    kvt_status st = kvt_shared_url_parse(o->url, &u, err, errlen);
    if (st != KVT_OK) return st;
    const bool tls_flags = o->tls_ca_file || o->tls_cert_file || o->tls_key_file || o->tls_insecure;
    if (tls_flags && !u.tls)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "--shared-cache-tls-* options need a rediss:// URL (redis:// is plain text)");
    kvt_shared *sh = calloc(1, sizeof *sh);
    if (!sh) return KVT_ERR_NOMEM;
    sh->o = *o;
    sh->o.url = NULL; /* not kept: it may carry the password */
    if (!sh->o.timeout_ms) sh->o.timeout_ms = 1000;
    if (!sh->o.queue_max_bytes) sh->o.queue_max_bytes = 256ull << 20;
    if (!sh->o.queue_max_blocks) sh->o.queue_max_blocks = 1024;
    if (!sh->o.pipeline) sh->o.pipeline = 16;
    if (sh->o.pipeline > SHARED_MAX_PIPELINE) sh->o.pipeline = SHARED_MAX_PIPELINE;
    sh->o.tls_ca_file = sh->o.tls_cert_file = sh->o.tls_key_file = NULL; /* not kept: borrowed */
    sh->url = u;
    sh->o.layout = NULL;
    sh->o.pool = NULL;
    sh->o.compat_key = NULL;
    sh->compat = strdup(compat);
    if (!sh->compat) {
        free(sh);
        return KVT_ERR_NOMEM;
    }
    kvt_record_fmt_init(&sh->fmt, layout, pool, sh->compat);
    if (u.tls) {
        kvt_tls_opts to = {.ca_file = o->tls_ca_file, .cert_file = o->tls_cert_file, .key_file = o->tls_key_file,
                           .insecure = o->tls_insecure};
        st = kvt_tls_ctx_create(&to, &sh->tls, err, errlen);
        if (st != KVT_OK) {
            free(sh->compat);
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
    sh->max_block_rec = kvt_record_max_bytes(&sh->fmt, KVT_RECORD_BLOCK);
    sh->max_snap_rec = kvt_record_max_bytes(&sh->fmt, KVT_RECORD_SNAPSHOT);
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
    if (sh->q_head)
        KVT_WARN("shared tier: %llu queued blocks/snapshots (%.1f MB) were not published before shutdown",
                 (unsigned long long)sh->q_blocks, (double)sh->q_bytes / 1e6);
    while (sh->q_head) {
        pub_item *it = sh->q_head;
        sh->q_head = it->next;
        item_free(it);
    }
    conn_drop(&sh->fetch);
    conn_drop(&sh->pub);
    free(sh->fetch.in);
    free(sh->vbuf);
    pthread_cond_destroy(&sh->cv_work);
    pthread_cond_destroy(&sh->cv_idle);
    pthread_mutex_destroy(&sh->mu);
    free(sh->seen);
    kvt_tls_ctx_free(sh->tls);
    free(sh->compat);
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
