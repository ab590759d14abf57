/* http_client.c — see http_client.h. */
#include "http_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Milliseconds left before the deadline (0 when passed). */
static int left_ms(double deadline) {
    double l = deadline - kvt_now_ms();
    return l > 0 ? (int)l + 1 : 0;
}

/* Waits until fd is ready for ev before the deadline. */
static bool wait_fd(int fd, short ev, double deadline) {
    for (;;) {
        int ms = left_ms(deadline);
        if (ms <= 0) return false;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, ms);
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

/* A non-blocking socket connected to one of host:port's addresses, or -1 (err filled). */
static int dial(const char *host, uint16_t port, double deadline, char *err, size_t errlen) {
    char ps[8];
    snprintf(ps, sizeof ps, "%u", (unsigned)port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gr = getaddrinfo(host, ps, &hints, &ai);
    if (gr != 0) {
        kvt_errf(err, errlen, KVT_ERR_IO, "cannot resolve %s: %s", host, gai_strerror(gr));
        return -1;
    }
    int fd = -1, last = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        int soerr = errno;
        if (soerr == EINPROGRESS && wait_fd(fd, POLLOUT, deadline)) {
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
            if (soerr == 0) break;
        } else if (soerr == EINPROGRESS) {
            soerr = ETIMEDOUT;
        }
        last = soerr;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) kvt_errf(err, errlen, KVT_ERR_IO, "cannot connect to %s:%u: %s", host, (unsigned)port, strerror(last));
    return fd;
}

static bool send_all(int fd, const char *p, size_t n, double deadline) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, deadline)) return false;
        } else {
            return false;
        }
    }
    return true;
}

kvt_status kvt_http_request(const char *host, uint16_t port, const char *method, const char *path, const char *api_key,
                            const char *body, uint32_t timeout_ms, int *status, char **body_out, char *err,
                            size_t errlen) {
    *status = 0;
    *body_out = NULL;
    const double deadline = kvt_now_ms() + timeout_ms;
    /* the request head; the key and host come from the command line and must not split headers */
    if (strpbrk(host, "\r\n") || (api_key && strpbrk(api_key, "\r\n")) || strpbrk(path, "\r\n "))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "host, path and API key must not contain spaces or line breaks");
    size_t blen = body ? strlen(body) : 0;
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s:%u\r\nConnection: close\r\nAccept: application/json\r\n"
                      "Content-Length: %zu\r\n%s%s%s%s\r\n",
                      method, path, host, (unsigned)port, blen, body ? "Content-Type: application/json\r\n" : "",
                      api_key ? "Authorization: Bearer " : "", api_key ? api_key : "", api_key ? "\r\n" : "");
    if (hn < 0 || (size_t)hn >= sizeof head) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "request header too long");
    int fd = dial(host, port, deadline, err, errlen);
    if (fd < 0) return KVT_ERR_IO;
    if (!send_all(fd, head, (size_t)hn, deadline) || (blen && !send_all(fd, body, blen, deadline))) {
        close(fd);
        return kvt_errf(err, errlen, KVT_ERR_IO, "cannot send the request to %s:%u: %s", host, (unsigned)port,
                        errno ? strerror(errno) : "timed out");
    }
    /* read until the server closes, at most KVT_HTTP_MAX_RESPONSE bytes, before the deadline */
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    kvt_status st = buf ? KVT_OK : KVT_ERR_NOMEM;
    while (st == KVT_OK) {
        if (len + 1 == cap) {
            if (cap >= KVT_HTTP_MAX_RESPONSE) {
                st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "response longer than %u bytes", KVT_HTTP_MAX_RESPONSE);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = KVT_ERR_NOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r > 0) {
            len += (size_t)r;
        } else if (r == 0) {
            break;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait_fd(fd, POLLIN, deadline))
                st = kvt_errf(err, errlen, KVT_ERR_IO, "no complete answer from %s:%u within %u ms", host, (unsigned)port,
                              timeout_ms);
        } else {
            st = kvt_errf(err, errlen, KVT_ERR_IO, "receive from %s:%u: %s", host, (unsigned)port, strerror(errno));
        }
    }
    close(fd);
    if (st != KVT_OK) {
        free(buf);
        return st == KVT_ERR_NOMEM ? kvt_errf(err, errlen, st, "out of memory") : st;
    }
    buf[len] = '\0';
    int code = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*[01] %3d", &code) != 1 || code < 100 || code > 599 || !sep) {
        free(buf);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s:%u did not answer with HTTP", host, (unsigned)port);
    }
    sep += 4;
    memmove(buf, sep, len - (size_t)(sep - buf) + 1);
    *status = code;
    *body_out = buf;
    return KVT_OK;
}
