/*
 * tls_bridge.h — TLS for the shared tier's Redis connections without a TLS-capable hiredis.
 *
 * Debian bookworm's hiredis 0.14 has no SSL support, so kvtier carries TLS itself with OpenSSL: a
 * bridge owns one verified TLS connection to the server and one end of a socketpair; hiredis gets
 * the other end (redisConnectFd) and speaks plain RESP into it. A small per-connection thread pumps
 * bytes both ways (non-blocking, poll). hiredis's own socket timeouts (redisSetTimeout on its end)
 * therefore bound every command exactly as on a plain connection: a hung server makes hiredis time
 * out, the caller frees the context, and the bridge sees its end close and exits.
 *
 * Verification (kvt_tls_ctx): peer certificate chain against the CA file (or the system store when
 * none is given), host name (or IP address) of the URL checked against the certificate's
 * subjectAltName, SNI sent for DNS names, TLS >= 1.2. Unverified connections happen only when
 * `insecure` is set explicitly. Optional client certificate and key (mutual TLS).
 *
 * Ownership / lifetime: kvt_tls_ctx is immutable after create and may be shared by any number of
 * bridges (it must outlive them). A bridge owns its TCP socket, its SSL object, its end of the
 * socketpair and its thread; kvt_tls_bridge_open hands the caller the other end (*app_fd), which
 * the caller owns (give it to redisConnectFd; redisFree closes it). kvt_tls_bridge_close stops the
 * thread (bounded: it never blocks outside poll, and close wakes that poll) and frees everything;
 * call it after closing app_fd or before — both orders are safe.
 */
#ifndef KVT_TLS_BRIDGE_H
#define KVT_TLS_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>

#include "../util/common.h"

typedef struct kvt_tls_opts {
    const char *ca_file;   /* PEM CA bundle that signs the server certificate; NULL = system store */
    const char *cert_file; /* PEM client certificate (mutual TLS), or NULL */
    const char *key_file;  /* PEM private key of cert_file (NULL = inside cert_file) */
    bool insecure;         /* skip certificate and host name verification (explicit opt-in only) */
} kvt_tls_opts;

typedef struct kvt_tls_ctx kvt_tls_ctx;
/* Loads the CA / client certificate; KVT_ERR_IO with a clear message when a file cannot be read or
 * the key does not match the certificate. */
kvt_status kvt_tls_ctx_create(const kvt_tls_opts *o, kvt_tls_ctx **out, char *err, size_t errlen);
void kvt_tls_ctx_free(kvt_tls_ctx *c);

typedef struct kvt_tls_bridge kvt_tls_bridge;
/* Connects to host:port and completes a verified TLS handshake, all within timeout_ms; starts the
 * bridge thread. *app_fd = the caller's plain end. Errors: KVT_ERR_IO with the reason (connect
 * refused / timed out, "certificate verify failed: …", host name mismatch, handshake alert). */
kvt_status kvt_tls_bridge_open(kvt_tls_ctx *c, const char *host, uint16_t port, uint32_t timeout_ms,
                               kvt_tls_bridge **out, int *app_fd, char *err, size_t errlen);
void kvt_tls_bridge_close(kvt_tls_bridge *b); /* NULL is a no-op */

/* SIGPIPE guard for code that writes to sockets a peer may have closed (hiredis uses write(), the
 * bridge shuts its end down when the server dies): block blocks SIGPIPE in the calling thread;
 * restore consumes a SIGPIPE raised meanwhile (not one that was pending before) and restores the
 * mask. So a CLI process that does not ignore SIGPIPE (kvtier run/bench) is not killed by it. */
typedef struct kvt_sigpipe_guard {
    sigset_t old;
    bool was_pending;
} kvt_sigpipe_guard;
void kvt_sigpipe_block(kvt_sigpipe_guard *g);
void kvt_sigpipe_restore(kvt_sigpipe_guard *g);

#endif
