#!/usr/bin/env bash
# web.sh — the web pages (docs/web.md) of `kvtier serve --api-key`:
#  1. curl: the static server of src/server/web.c — content types, CSP and the other headers, HEAD,
#     ETag/If-None-Match 304, 404 for unknown assets and `..` paths, 405 for other methods; the
#     pages load without the key while the API still needs it; the "kvtier" object of responses
#     (plain and streamed) agrees with usage;
#  2. tests/e2e/web/browser.mjs in headless Debian chromium (puppeteer-core, axe-core from
#     tests/e2e/web/package-lock.json): chat turns, an edit, a regenerate, the badges against
#     /stats, the dashboard's charts, accessibility; screenshots into $BUILD/test-logs/.
# Without chromium, node or npm it exits 77 (skipped; a failure under CI=true).
set -u
. "$(dirname "$0")/server_common.bash"
WEB_DIR=$(cd "$(dirname "$0")/web" && pwd)
need curl python3
[ -x "$KV" ] || fail "$KV not built"
MODEL=data/models/kjv-target-q8_0.gguf
[ -f "$MODEL" ] || fail "$MODEL missing"
KEY=web-key
srv_start --api-key "$KEY" --ssd-cache "$TMP/ssd"

# ---- 1. the static server
hdr() { # METHOD PATH [curl args...] -> $TMP/h (headers), $TMP/resp (body), HTTP_CODE
  local m=$1 p=$2; shift 2
  rm -f "$TMP/resp"; : >"$TMP/resp"
  HTTP_CODE=$(curl -s --path-as-is -X "$m" -D "$TMP/h" -o "$TMP/resp" -w '%{http_code}' --max-time 30 "$@" "$SRV_URL$p") || HTTP_CODE=000
}
header() { grep -i "^$1:" "$TMP/h" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ //'; }
for pc in "/|text/html; charset=utf-8" "/dashboard|text/html; charset=utf-8" "/assets/chat.js|text/javascript; charset=utf-8" \
          "/assets/dashboard.js|text/javascript; charset=utf-8" "/assets/chat.css|text/css; charset=utf-8" \
          "/assets/dashboard.css|text/css; charset=utf-8"; do
  p=${pc%%|*} ct=${pc#*|}
  hdr GET "$p"
  [ "$HTTP_CODE" = 200 ] || fail "GET $p without the key: $HTTP_CODE"
  [ "$(header Content-Type)" = "$ct" ] || fail "GET $p: Content-Type '$(header Content-Type)', expected '$ct'"
  header Content-Security-Policy | grep -q "default-src 'none'; script-src 'self'" || fail "GET $p: no strict CSP"
  [ "$(header X-Content-Type-Options)" = nosniff ] || fail "GET $p: no nosniff"
  [ "$(header Cache-Control)" = no-cache ] || fail "GET $p: Cache-Control '$(header Cache-Control)'"
  [ -s "$TMP/resp" ] || fail "GET $p: empty body"
done
hdr GET /
grep -q 'src="/assets/chat.js"' "$TMP/resp" || fail "GET /: not the chat page"
grep -qi '<script>' "$TMP/resp" && fail "GET /: an inline script (the CSP forbids it)"
len=$(stat -c %s "$TMP/resp") etag=$(header ETag)
[[ $etag =~ ^\"[0-9a-f]{20}\"$ ]] || fail "GET /: ETag '$etag'"
ok "pages and assets load without the key, with their content types, CSP, nosniff, ETag"
# HEAD over a raw HTTP/1.0 socket (the server closes after it): headers, and not one body byte
python3 - "$SRV_PORT" >"$TMP/h" <<'PY' || fail "HEAD /: no answer"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"HEAD / HTTP/1.0\r\nHost: x\r\n\r\n")
data = b""
while True:
    b = s.recv(65536)
    if not b: break
    data += b
head, _, body = data.partition(b"\r\n\r\n")
sys.stdout.write(head.decode() + "\r\nx-body-bytes: %d\r\n" % len(body))
PY
head -1 "$TMP/h" | grep -q " 200 " || fail "HEAD /: $(head -1 "$TMP/h")"
[ "$(header x-body-bytes)" = 0 ] || fail "HEAD /: $(header x-body-bytes) body bytes"
[ "$(header Content-Length)" = "$len" ] || fail "HEAD /: Content-Length $(header Content-Length), GET sent $len"
[ "$(header ETag)" = "$etag" ] || fail "HEAD /: another ETag"
hdr GET / -H "If-None-Match: $etag"
[ "$HTTP_CODE" = 304 ] && [ ! -s "$TMP/resp" ] || fail "GET / If-None-Match: $HTTP_CODE"
hdr GET / -H "If-None-Match: \"x\", W/$etag"
[ "$HTTP_CODE" = 304 ] || fail "GET / If-None-Match list with a weak match: $HTTP_CODE"
hdr GET / -H 'If-None-Match: "0000"'
[ "$HTTP_CODE" = 200 ] || fail "GET / stale If-None-Match: $HTTP_CODE"
ok "HEAD sends the headers only; If-None-Match answers 304"
for p in /assets/nope.js /assets/ /assets/../assets/chat.js /assets/%2e%2e/assets/chat.js /assets/chat.js/ \
         /assets//chat.js /assets/../../etc/passwd /assets/index.html; do
  hdr GET "$p"
  [ "$HTTP_CODE" = 404 ] || fail "GET $p: $HTTP_CODE, expected 404"
  grep -q "root:" "$TMP/resp" && fail "GET $p: served a file"
done
ok "unknown assets and .. paths are 404"
for m in POST PUT DELETE; do
  hdr $m /
  [ "$HTTP_CODE" = 405 ] || fail "$m /: $HTTP_CODE"
  [ "$(header Allow)" = "GET, HEAD" ] || fail "$m /: Allow '$(header Allow)'"
done
ok "other methods are 405 with Allow: GET, HEAD"

# the API is unchanged: it needs the key, unknown paths are its JSON 404
expect 401 GET /v1/models
expect 401 GET /stats
expect 401 GET /admin/cache/prefixes
AUTH=(-H "Authorization: Bearer $KEY")
expect 200 GET /v1/models
for p in /nope /index.html /dashboard/ /assets; do # not web paths: the API's JSON 404
  expect 404 GET "$p"
  [ "$(jget "j['error']['code']")" = not_found ] || fail "$p: not the API's 404"
done
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":8}')"
jget "j['kvtier']['reused_from'] == 'none' and j['kvtier']['cached_tokens'] == j['usage']['prompt_tokens_details']['cached_tokens'] \
  and j['kvtier']['cached_tokens'] + j['kvtier']['computed_tokens'] == j['usage']['prompt_tokens'] and j['kvtier']['ttft_ms'] > 0 \
  and j['kvtier']['decode_tps'] > 0 and j['kvtier']['prefill_tps'] > 0" | grep -qx True || fail "kvtier object of a cold request"
curl -sN "${AUTH[@]}" -H 'Content-Type: application/json' --max-time 60 "$SRV_URL/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}' >"$TMP/sse"
grep '"usage"' "$TMP/sse" | sed 's/^data: //' >"$TMP/resp"
jget "j['kvtier']['reused_from'] == 'ram' and j['kvtier']['cached_tokens'] == j['usage']['prompt_tokens_details']['cached_tokens'] > 0 \
  and j['kvtier']['cached_tokens'] + j['kvtier']['computed_tokens'] == j['usage']['prompt_tokens']" | grep -qx True \
  || fail "kvtier object of the streamed usage chunk of a repeated request"
[ "$(grep -c '"kvtier":{' "$TMP/sse")" = 1 ] || fail "the kvtier object belongs to the usage chunk only"
ok "responses carry the kvtier object (tier, cached/computed tokens, timings), plain and streamed"

# the admin table's source: the longest cached prefixes, longest first, each with its first tokens
expect 200 POST /v1/completions "$(jbody '{"prompt":"And the earth was without form, and void; and darkness was upon the face of the deep.","max_tokens":4}')"
expect 200 GET "/admin/cache/prefixes"
jget "j['object'] == 'list' and j['total'] >= 2 and 2 <= len(j['data']) <= 20 \
  and all(a['tokens'] >= b['tokens'] for a, b in zip(j['data'], j['data'][1:])) \
  and all(p['tokens'] > 0 and p['bytes'] > 0 and p['units'] > 0 and p['idle_s'] >= 0 and len(p['root']) == 16 for p in j['data']) \
  and any('And the earth' in p['head'] for p in j['data'])" | grep -qx True || fail "/admin/cache/prefixes listing"
expect 200 GET "/admin/cache/prefixes?limit=1"
jget "len(j['data']) == 1 and j['total'] >= 2" | grep -qx True || fail "/admin/cache/prefixes?limit=1"
for l in 0 101 -1 abc 1x ''; do
  expect 400 GET "/admin/cache/prefixes?limit=$l"
  [ "$(jget "j['error']['param']")" = limit ] || fail "limit=$l: param"
done
expect 405 POST /admin/cache/prefixes "$(jbody "{}")"
ok "GET /admin/cache/prefixes: the longest cached prefixes (sorted, sized, previewed), limit checked, key required"

# ---- 2. the browser
need node npm chromium
if [ ! -f "$WEB_DIR/node_modules/puppeteer-core/package.json" ] || [ ! -f "$WEB_DIR/node_modules/axe-core/axe.min.js" ]; then
  (cd "$WEB_DIR" && timeout 300 npm ci --no-audit --no-fund --silent >/dev/null 2>"$TMP/npm.err") \
    || { echo "skipped: missing dependency: npm packages puppeteer-core, axe-core (npm ci failed; scripts/install-deps)"; tail -5 "$TMP/npm.err"; exit 77; }
fi
OUT=$BUILD/test-logs
mkdir -p "$OUT"
timeout 300 node "$WEB_DIR/browser.mjs" "$SRV_URL" "$KEY" "$(cd "$OUT" && pwd)" || fail "browser test"
srv_stop TERM
echo "PASS web"
