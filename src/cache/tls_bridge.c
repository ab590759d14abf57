/* tls_bridge.c — see tls_bridge.h.
 *
 * Structure
 * ---------
 * - open (caller's thread): getaddrinfo, non-blocking connect per address with poll until the
 *   deadline, SSL_connect driven by poll until the same deadline, then a socketpair and the pump
 *   thread. SIGPIPE is blocked around the handshake (a server dying mid-handshake must not kill
 *   the process; a pending SIGPIPE raised by us is consumed).
 * - pump (bridge thread, every signal blocked): one 16 KiB buffer per direction. Each turn tries
 *   every possible step without blocking (recv from the app end → SSL_write; SSL_read → send to
 *   the app end); only when no step made progress does it poll for exactly what the blocked
 *   steps wait for (app readable/writable, socket readable/writable as OpenSSL asked, the wake
 *   eventfd). Because SSL_read is retried whenever the down buffer is empty, data OpenSSL already
 *   buffered is never stranded behind a poll.
 *
 * Invariants
 *   (1) After open returns, only the pump thread touches ssl and the TCP socket.
 *   (2) The pump exits when the app end closes (hiredis freed the context), the server closes or
 *       errs, a TLS error occurs, or close() wakes it; on exit it shuts the app end down so a
 *       waiting hiredis read sees EOF at once instead of waiting for its timeout.
 *   (3) close() joins the pump (bounded: the pump blocks only in poll, which the eventfd wakes),
 *       then frees ssl and both descriptors it owns, exactly once.
 */
#include "tls_bridge.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TLS_BUF 16384

struct kvt_tls_ctx {
    SSL_CTX *ctx;
    bool insecure;
};

struct kvt_tls_bridge {
    SSL *ssl;
    int net_fd;  /* TCP socket to the server (non-blocking) */
    int app_fd;  /* the bridge's end of the socketpair (non-blocking) */
    int wake_fd; /* eventfd: close() wakes the pump */
    pthread_t thread;
    atomic_bool stop;
};

static void ssl_errstr(char *buf, size_t n) {
    unsigned long e = ERR_get_error();
    if (!e) snprintf(buf, n, "no OpenSSL error detail");
    else ERR_error_string_n(e, buf, n);
    ERR_clear_error();
}

kvt_status kvt_tls_ctx_create(const kvt_tls_opts *o, kvt_tls_ctx **out, char *err, size_t errlen) {
    *out = NULL;
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "TLS: cannot create an OpenSSL context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (o->insecure) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = o->ca_file ? SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            ssl_errstr(why, sizeof why);
            SSL_CTX_free(ctx);
            return kvt_errf(err, errlen, KVT_ERR_IO, "TLS: cannot load CA %s (%s)",
                            o->ca_file ? o->ca_file : "from the system store", why);
        }
    }
    if (o->key_file && !o->cert_file) {
        SSL_CTX_free(ctx);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "TLS: a client key needs a client certificate (--shared-cache-tls-cert)");
    }
    if (o->cert_file) {
        const char *key = o->key_file ? o->key_file : o->cert_file;
        if (SSL_CTX_use_certificate_chain_file(ctx, o->cert_file) != 1) {
            ssl_errstr(why, sizeof why);
            SSL_CTX_free(ctx);
            return kvt_errf(err, errlen, KVT_ERR_IO, "TLS: cannot load client certificate %s (%s)", o->cert_file, why);
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
            ssl_errstr(why, sizeof why);
            SSL_CTX_free(ctx);
            return kvt_errf(err, errlen, KVT_ERR_IO, "TLS: cannot use client key %s (%s)", key, why);
        }
    }
    kvt_tls_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        SSL_CTX_free(ctx);
        return KVT_ERR_NOMEM;
    }
    c->ctx = ctx;
    c->insecure = o->insecure;
    *out = c;
    return KVT_OK;
}

void kvt_tls_ctx_free(kvt_tls_ctx *c) {
    if (!c) return;
    SSL_CTX_free(c->ctx);
    free(c);
}

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* poll one fd for events until deadline; 1 ready, 0 timed out, -1 error. */
static int poll_until(int fd, short events, uint64_t deadline) {
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= deadline) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)KVT_MIN(deadline - now, (uint64_t)INT32_MAX));
        if (r > 0) return 1;
        if (r == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

/* Non-blocking TCP connect to the first address that answers before the deadline. -1 + err. */
static int tcp_connect(const char *host, uint16_t port, uint64_t deadline, char *err, size_t errlen) {
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0) {
        kvt_errf(err, errlen, KVT_ERR_IO, "cannot resolve %s: %s", host, gai_strerror(gr));
        return -1;
    }
    int fd = -1, last = ECONNREFUSED;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            last = errno;
            continue;
        }
        if (connect(s, a->ai_addr, a->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                last = errno;
                close(s);
                continue;
            }
            int pr = poll_until(s, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (pr <= 0 || getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr) {
                last = pr == 0 ? ETIMEDOUT : soerr ? soerr : errno;
                close(s);
                continue;
            }
        }
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd = s;
    }
    freeaddrinfo(res);
    if (fd < 0) kvt_errf(err, errlen, KVT_ERR_IO, "connect to %s:%u: %s", host, port, strerror(last));
    return fd;
}

void kvt_sigpipe_block(kvt_sigpipe_guard *g) {
    sigset_t s, pend;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigpending(&pend);
    g->was_pending = sigismember(&pend, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
}
void kvt_sigpipe_restore(kvt_sigpipe_guard *g) {
    sigset_t s, pend;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigpending(&pend);
    if (!g->was_pending && sigismember(&pend, SIGPIPE)) {
        const struct timespec zero = {0, 0};
        sigtimedwait(&s, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static bool is_ip_literal(const char *h) {
    unsigned char buf[16];
    return inet_pton(AF_INET, h, buf) == 1 || inet_pton(AF_INET6, h, buf) == 1;
}

static void *pump_main(void *arg);

kvt_status kvt_tls_bridge_open(kvt_tls_ctx *c, const char *host, uint16_t port, uint32_t timeout_ms,
                               kvt_tls_bridge **out, int *app_fd, char *err, size_t errlen) {
    *out = NULL;
    *app_fd = -1;
    const uint64_t deadline = mono_ms() + timeout_ms;
    int fd = tcp_connect(host, port, deadline, err, errlen);
    if (fd < 0) return KVT_ERR_IO;
    kvt_tls_bridge *b = calloc(1, sizeof *b);
    SSL *ssl = b ? SSL_new(c->ctx) : NULL;
    if (!ssl) {
        free(b);
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "TLS: out of memory");
    }
    SSL_set_fd(ssl, fd);
    const bool ip = is_ip_literal(host);
    if (!ip) SSL_set_tlsext_host_name(ssl, host); /* SNI is for DNS names only (RFC 6066) */
    if (!c->insecure) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
        X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, host) : X509_VERIFY_PARAM_set1_host(vp, host, 0);
        if (ok != 1) {
            SSL_free(ssl);
            free(b);
            close(fd);
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "TLS: cannot verify against host name '%s'", host);
        }
    }
    kvt_sigpipe_guard g;
    kvt_sigpipe_block(&g);
    kvt_status st = KVT_OK;
    for (;;) {
        ERR_clear_error();
        int r = SSL_connect(ssl);
        if (r == 1) break;
        int e = SSL_get_error(ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            int pr = poll_until(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            if (pr > 0) continue;
            st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS handshake with %s:%u %s", host, port, pr == 0 ? "timed out" : "failed (poll)");
            break;
        }
        long vr = SSL_get_verify_result(ssl);
        char why[256];
        ssl_errstr(why, sizeof why);
        if (vr != X509_V_OK)
            st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS: certificate of %s:%u not trusted: certificate verify failed: %s", host, port,
                          X509_verify_cert_error_string(vr));
        else
            st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS handshake with %s:%u failed: %s%s", host, port,
                          e == SSL_ERROR_SYSCALL ? "connection closed or reset; " : "", why);
        break;
    }
    kvt_sigpipe_restore(&g);
    int sp[2] = {-1, -1};
    if (st == KVT_OK && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
        st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS bridge: socketpair: %s", strerror(errno));
    b->wake_fd = -1;
    if (st == KVT_OK && (b->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS bridge: eventfd: %s", strerror(errno));
    if (st == KVT_OK) {
        int fl = fcntl(sp[1], F_GETFL);
        if (fl < 0 || fcntl(sp[1], F_SETFL, fl | O_NONBLOCK) != 0)
            st = kvt_errf(err, errlen, KVT_ERR_IO, "TLS bridge: fcntl: %s", strerror(errno));
    }
    if (st == KVT_OK) {
        b->ssl = ssl;
        b->net_fd = fd;
        b->app_fd = sp[1];
        atomic_init(&b->stop, false);
        /* the pump runs with every signal blocked: SIGPIPE from a dead server becomes EPIPE */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int pr = pthread_create(&b->thread, NULL, pump_main, b);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (pr != 0) st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "TLS bridge: cannot start its thread");
    }
    if (st != KVT_OK) {
        SSL_free(ssl);
        close(fd);
        if (sp[0] >= 0) close(sp[0]);
        if (sp[1] >= 0) close(sp[1]);
        if (b->wake_fd >= 0) close(b->wake_fd);
        free(b);
        return st;
    }
    *out = b;
    *app_fd = sp[0];
    return KVT_OK;
}

static void *pump_main(void *arg) {
    kvt_tls_bridge *b = arg;
    uint8_t *up = malloc(TLS_BUF), *dn = malloc(TLS_BUF); /* app -> server, server -> app */
    size_t up_len = 0, up_off = 0, dn_len = 0, dn_off = 0;
    while (up && dn && !atomic_load(&b->stop)) {
        bool progress = false, app_rd = false, app_wr = false, net_rd = false, net_wr = false, dead = false;
        /* app -> server */
        if (up_off == up_len) {
            up_off = up_len = 0;
            ssize_t r = recv(b->app_fd, up, TLS_BUF, 0);
            if (r > 0) {
                up_len = (size_t)r;
                progress = true;
            } else if (r == 0) dead = true; /* hiredis closed its end */
            else if (errno == EAGAIN || errno == EWOULDBLOCK) app_rd = true;
            else if (errno != EINTR) dead = true;
        }
        if (!dead && up_off < up_len) {
            ERR_clear_error();
            int w = SSL_write(b->ssl, up + up_off, (int)(up_len - up_off));
            if (w > 0) {
                up_off += (size_t)w;
                progress = true;
            } else {
                int e = SSL_get_error(b->ssl, w);
                if (e == SSL_ERROR_WANT_READ) net_rd = true;
                else if (e == SSL_ERROR_WANT_WRITE) net_wr = true;
                else dead = true;
            }
        }
        /* server -> app */
        if (!dead && dn_off == dn_len) {
            dn_off = dn_len = 0;
            ERR_clear_error();
            int r = SSL_read(b->ssl, dn, TLS_BUF);
            if (r > 0) {
                dn_len = (size_t)r;
                progress = true;
            } else {
                int e = SSL_get_error(b->ssl, r);
                if (e == SSL_ERROR_WANT_READ) net_rd = true;
                else if (e == SSL_ERROR_WANT_WRITE) net_wr = true;
                else dead = true; /* close_notify, reset, TLS alert */
            }
        }
        if (!dead && dn_off < dn_len) {
            ssize_t w = send(b->app_fd, dn + dn_off, dn_len - dn_off, MSG_NOSIGNAL);
            if (w > 0) {
                dn_off += (size_t)w;
                progress = true;
            } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) app_wr = true;
            else if (w < 0 && errno != EINTR) dead = true;
        }
        if (dead) break;
        if (progress) continue;
        struct pollfd p[3] = {
            {.fd = b->app_fd, .events = (short)((app_rd ? POLLIN : 0) | (app_wr ? POLLOUT : 0))},
            /* no interest in the socket: not polled at all, else its POLLHUP would spin this loop */
            {.fd = net_rd || net_wr ? b->net_fd : -1, .events = (short)((net_rd ? POLLIN : 0) | (net_wr ? POLLOUT : 0))},
            {.fd = b->wake_fd, .events = POLLIN},
        };
        int r = poll(p, 3, -1);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (p[2].revents) break;
        if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) break; /* the app end is gone */
        if (p[1].revents & POLLNVAL) break;
        /* POLLHUP/POLLERR on the socket: the next SSL_read reports it (and drains what came first) */
    }
    shutdown(b->app_fd, SHUT_RDWR); /* invariant (2): a waiting hiredis read sees EOF now */
    free(up);
    free(dn);
    return NULL;
}

void kvt_tls_bridge_close(kvt_tls_bridge *b) {
    if (!b) return;
    atomic_store(&b->stop, true);
    uint64_t one = 1;
    ssize_t w = write(b->wake_fd, &one, sizeof one);
    (void)w;
    pthread_join(b->thread, NULL); /* invariant (3) */
    SSL_free(b->ssl);
    close(b->net_fd);
    close(b->app_fd);
    close(b->wake_fd);
    free(b);
}
