/*
 * web.c — serves the embedded pages of web.h. Every answer carries the strict
 * Content-Security-Policy, nosniff and no-referrer; the files are revalidated on each load
 * (Cache-Control: no-cache + ETag, a 304 when unchanged) since their names are not versioned.
 */
#include <microhttpd.h>
#include <stdbool.h>
#include <string.h>

#include "web.h"

bool kvt_web_owns(const char *path) {
    return !strcmp(path, "/") || !strcmp(path, "/dashboard") || !strncmp(path, "/assets/", 8);
}

const kvt_web_asset *kvt_web_find(const char *path) {
    for (size_t i = 0; i < kvt_web_n_assets; i++)
        if (!strcmp(kvt_web_assets[i].path, path)) return &kvt_web_assets[i];
    return NULL;
}

bool kvt_web_etag_match(const char *inm, const char *etag) {
    if (!inm) return false;
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len == 1 && *p == '*') return true;
        if (len >= 2 && p[0] == 'W' && p[1] == '/') p += 2, len -= 2; /* weak comparison (RFC 9110 13.1.2) */
        if (len == n && !memcmp(p, etag, n)) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

static int queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r, const kvt_web_asset *a) {
    if (!r) return -1;
    MHD_add_response_header(r, "Content-Security-Policy", KVT_WEB_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    if (a) {
        MHD_add_response_header(r, "ETag", a->etag);
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        if (status == 200) MHD_add_response_header(r, "Content-Type", a->ctype);
    } else {
        MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
        if (status == 405) MHD_add_response_header(r, "Allow", "GET, HEAD");
    }
    int ok = MHD_queue_response(c, status, r) == MHD_YES;
    MHD_destroy_response(r);
    return ok ? (int)status : -1;
}

static int text(struct MHD_Connection *c, unsigned status, const char *msg) {
    return queue(c, status, MHD_create_response_from_buffer(strlen(msg), (void *)msg, MHD_RESPMEM_PERSISTENT), NULL);
}

int kvt_web_answer(struct MHD_Connection *c, const char *method, const char *path) {
    if (!kvt_web_owns(path)) return 0;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return text(c, 405, "method not allowed\n");
    const kvt_web_asset *a = kvt_web_find(path);
    if (!a) return text(c, 404, "not found\n");
    if (kvt_web_etag_match(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match"), a->etag))
        return queue(c, 304, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT), a);
    /* the data is static: libmicrohttpd sends it in place (HEAD: the headers only) */
    return queue(c, 200, MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT), a);
}
