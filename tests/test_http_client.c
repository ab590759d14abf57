/* test_http_client.c — the CLI's HTTP client (src/util/http_client.h) against a scripted loopback
 * peer: a normal answer, a body, the Authorization header, an answer that is not HTTP, one longer
 * than the cap, a peer that never answers (the deadline), nothing listening, and header injection. */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "util/http_client.h"

typedef struct peer {
    int lfd;
    uint16_t port;
    const char *answer; /* sent after the request head; NULL: hold the connection silently */
    size_t answer_len;
    size_t repeat;      /* the answer is sent this many times (a long response) */
    char req[4096];     /* what the client sent (head and body) */
    pthread_t th;
} peer;

static void *peer_main(void *arg) {
    peer *p = arg;
    int fd = accept(p->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    size_t got = 0;
    for (;;) { /* the head, then Content-Length bytes of body */
        ssize_t r = recv(fd, p->req + got, sizeof p->req - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
        p->req[got] = 0;
        char *end = strstr(p->req, "\r\n\r\n"), *cl = strstr(p->req, "Content-Length: ");
        if (end && cl && got >= (size_t)(end + 4 - p->req) + strtoul(cl + 16, NULL, 10)) break;
    }
    if (p->answer) {
        for (size_t i = 0; i < p->repeat; i++)
            if (send(fd, p->answer, p->answer_len, MSG_NOSIGNAL) < 0) break;
    } else {
        usleep(600 * 1000); /* past the client's deadline */
    }
    close(fd);
    return NULL;
}

static void peer_start(peer *p, const char *answer, size_t repeat) {
    memset(p, 0, sizeof *p);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(p->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(p->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(p->lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(p->lfd, (struct sockaddr *)&a, &sl);
    p->port = ntohs(a.sin_port);
    p->answer = answer;
    p->answer_len = answer ? strlen(answer) : 0;
    p->repeat = repeat;
    assert_int_equal(pthread_create(&p->th, NULL, peer_main, p), 0);
}

static void peer_join(peer *p) {
    pthread_join(p->th, NULL);
    close(p->lfd);
}

static void test_answers(void **state) {
    (void)state;
    peer p;
    int status = 0;
    char *body = NULL, err[256] = "";
    peer_start(&p, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"durable\":true}", 1);
    assert_int_equal(kvt_http_request("127.0.0.1", p.port, "POST", "/admin/drain", "k3y", "{\"a\":1}", 2000, &status, &body,
                                      err, sizeof err),
                     KVT_OK);
    peer_join(&p);
    assert_int_equal(status, 200);
    assert_string_equal(body, "{\"durable\":true}");
    free(body);
    assert_non_null(strstr(p.req, "POST /admin/drain HTTP/1.1\r\n"));
    assert_non_null(strstr(p.req, "Authorization: Bearer k3y\r\n"));
    assert_non_null(strstr(p.req, "Content-Length: 7\r\n"));
    assert_non_null(strstr(p.req, "\r\n\r\n{\"a\":1}"));
    /* an error status is an answer too; no key, no Authorization header */
    peer_start(&p, "HTTP/1.0 409 Conflict\r\n\r\n{}", 1);
    assert_int_equal(kvt_http_request("localhost", p.port, "POST", "/x", NULL, NULL, 2000, &status, &body, err, sizeof err),
                     KVT_OK);
    peer_join(&p);
    assert_int_equal(status, 409);
    assert_null(strstr(p.req, "Authorization"));
    free(body);
}

static void test_bad_peers(void **state) {
    (void)state;
    peer p;
    int status = 0;
    char *body = NULL, err[256] = "";
    peer_start(&p, "SSH-2.0-OpenSSH\r\n\r\n", 1); /* not HTTP */
    assert_int_equal(kvt_http_request("127.0.0.1", p.port, "GET", "/", NULL, NULL, 2000, &status, &body, err, sizeof err),
                     KVT_ERR_FORMAT);
    peer_join(&p);
    assert_null(body);
    /* longer than the cap: refused, not buffered without bound */
    static char chunk[65537];
    memset(chunk, 'x', sizeof chunk - 1);
    memcpy(chunk, "HTTP/1.1 200 OK\r\n\r\n", 19);
    peer_start(&p, chunk, 40); /* 2.5 MiB */
    assert_int_equal(kvt_http_request("127.0.0.1", p.port, "GET", "/", NULL, NULL, 5000, &status, &body, err, sizeof err),
                     KVT_ERR_FORMAT);
    peer_join(&p);
    assert_non_null(strstr(err, "longer than"));
    /* a silent peer that closes after 600 ms: the 200 ms deadline ends the wait first (an I/O error;
     * without the deadline the client would read the close and report a non-HTTP answer) */
    peer_start(&p, NULL, 0);
    assert_int_equal(kvt_http_request("127.0.0.1", p.port, "GET", "/", NULL, NULL, 200, &status, &body, err, sizeof err),
                     KVT_ERR_IO);
    assert_non_null(strstr(err, "within 200 ms"));
    peer_join(&p);
    /* nothing listening: a port bound but never listened on refuses */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &sl);
    const uint16_t port = ntohs(a.sin_port);
    assert_int_equal(kvt_http_request("127.0.0.1", port, "GET", "/", NULL, NULL, 1000, &status, &body, err, sizeof err),
                     KVT_ERR_IO);
    assert_non_null(strstr(err, "cannot connect"));
    close(s);
    /* header injection through the key or the path is refused before connecting */
    assert_int_equal(kvt_http_request("127.0.0.1", port, "GET", "/", "k\r\nX-Evil: 1", NULL, 1000, &status, &body, err,
                                      sizeof err),
                     KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_http_request("127.0.0.1", port, "GET", "/ HTTP/1.0", NULL, NULL, 1000, &status, &body, err, sizeof err),
                     KVT_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers),
        cmocka_unit_test(test_bad_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
