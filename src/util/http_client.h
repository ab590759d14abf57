/*
 * http_client.h — a minimal HTTP/1.1 client for the CLI's calls to a running `kvtier serve`
 * (`kvtier cache drain`): one request per connection ("Connection: close"), plain sockets, no TLS.
 * Every step is bounded: connecting, sending and reading share one deadline (timeout_ms), and the
 * response is read up to KVT_HTTP_MAX_RESPONSE bytes (a longer one is an error).
 *
 * Ownership: *body_out is malloc'd (NUL-terminated; the caller frees it). Thread-safe (no state).
 */
#ifndef KVT_HTTP_CLIENT_H
#define KVT_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define KVT_HTTP_MAX_RESPONSE (1u << 20)

/* Sends METHOD path to host:port with an optional JSON body (NULL: none) and, when api_key is
 * non-NULL, "Authorization: Bearer api_key". On KVT_OK: *status is the HTTP status and *body_out
 * the response body. Errors (message in err): KVT_ERR_IO (resolve, connect, send, receive, the
 * deadline passed), KVT_ERR_FORMAT (not an HTTP response, or longer than KVT_HTTP_MAX_RESPONSE). */
kvt_status kvt_http_request(const char *host, uint16_t port, const char *method, const char *path, const char *api_key,
                            const char *body, uint32_t timeout_ms, int *status, char **body_out, char *err,
                            size_t errlen);

#endif
