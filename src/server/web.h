/*
 * web.h — the chat page (GET /) and the cache dashboard (GET /dashboard): static files bundled from
 * web/ (web/build.mjs) and embedded in the binary at build time (scripts/embed-web writes
 * $(BUILD)/gen/web_assets.c). The file set is fixed when the binary is built: a request names one
 * of the table's paths exactly or is not a web request, so no path reaches the file system and no
 * `..` can escape. The pages call the HTTP API (/v1/chat/completions, /stats) like any client; with
 * --api-key they load without the key (they hold no data) and send it on their API calls.
 *
 * Ownership: the asset table is static, read-only data that lives as long as the program.
 * kvt_web_answer is called on a connection thread; it keeps no state.
 */
#ifndef KVT_WEB_H
#define KVT_WEB_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvt_web_asset {
    const char *path;  /* "/", "/dashboard", "/assets/NAME" */
    const char *ctype; /* Content-Type */
    const char *etag;  /* quoted strong validator: a hash of the bytes */
    const unsigned char *data;
    size_t len;
} kvt_web_asset;

/* The embedded files (generated; $(BUILD)/gen/web_assets.c). */
extern const kvt_web_asset kvt_web_assets[];
extern const size_t kvt_web_n_assets;

/* The Content-Security-Policy every page is sent with: scripts, styles and fetches from this
 * origin only; no inline script, no frames, no forms posted elsewhere. */
#define KVT_WEB_CSP                                                                                                   \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "         \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* True for the paths the web module answers: "/", "/dashboard" and everything under "/assets/"
 * (an unknown asset is a 404 of this module, not of the API). */
bool kvt_web_owns(const char *path);
/* The asset served at path (exact match), or NULL. */
const kvt_web_asset *kvt_web_find(const char *path);
/* True when an If-None-Match header value (NULL: absent) matches etag: "*", or a comma-separated
 * list that holds it, weak ("W/") or strong. */
bool kvt_web_etag_match(const char *if_none_match, const char *etag);

struct MHD_Connection;
/* Answers a web request on connection c: 200 (GET) / 200 headers only (HEAD), 304 on a matching
 * If-None-Match, 404 for an unknown asset, 405 for another method. Returns 0 when !kvt_web_owns(path)
 * (nothing queued: the caller routes the request), the HTTP status queued, or -1 when
 * libmicrohttpd could not queue the response (the caller drops the connection). */
int kvt_web_answer(struct MHD_Connection *c, const char *method, const char *path);

#endif
