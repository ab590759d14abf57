#!/usr/bin/env bash
# shared_tier_tls.sh — end-to-end test of the shared tier over TLS (rediss://, issue 17): one
# redis-server with TLS only (--port 0), client certificates required, ACL users (default off;
# kvtier's user limited to kvtier:* and the commands it sends), certificates made here with the
# openssl CLI. Two kvtier servers A and B: B reuses A's prefix over verified TLS (output identical
# to a cold run); a server given the wrong CA refuses the connection with a clear error and keeps
# serving from its own tiers; a hung TLS redis (SIGSTOP) costs a request at most its budget; the
# TLS redis killed mid-request, then restarted (breaker closes).
# Every wait is bounded; the trap kills every process this script started.
set -u
TMP_TAG=shtls
. "$(dirname "$0")/shared_common.bash"
need_cmds python3 curl openssl redis-server redis-cli

# ------------------------------------------------------------------ certificates (openssl CLI)
C=$TMP/certs
mkdir -p "$C"
(
  set -e
  cd "$C"
  k() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@" >/dev/null 2>&1; }
  k -x509 -keyout ca.key -out ca.crt -days 2 -subj /CN=kvtier-test-ca
  k -x509 -keyout wrongca.key -out wrongca.crt -days 2 -subj /CN=someone-else
  k -keyout server.key -out server.csr -subj /CN=localhost
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext >/dev/null 2>&1
  k -keyout client.key -out client.csr -subj /CN=kvtier
  openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 >/dev/null 2>&1
) || fail "openssl could not make certificates"

# TLS only: rc and redis_launch replace the plain ones of redis_common.bash
rc() { redis-cli --tls --cacert "$C/ca.crt" --cert "$C/client.crt" --key "$C/client.key" -p "$RPORT" --user admin --pass adminpw --no-auth-warning "$@"; }
redis_launch() {
  exec redis-server --port 0 --tls-port "$RPORT" --bind 127.0.0.1 --dir "$RDIR" --save '' --appendonly no --daemonize no \
    --tls-cert-file "$C/server.crt" --tls-key-file "$C/server.key" --tls-ca-cert-file "$C/ca.crt" --tls-auth-clients yes \
    --user default off --user admin on '>adminpw' '~*' '&*' '+@all' \
    --user kvt on '>kvt-pw' '~kvtier:*' +get +getrange +set +del +ping +auth +select
}
REDIS_WHAT="redis-server (built without TLS?)"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
TLSARGS=(--shared-cache-tls-ca "$C/ca.crt" --shared-cache-tls-cert "$C/client.crt" --shared-cache-tls-key "$C/client.key")

# srv NAME ARGS... -> sets PORT_<NAME>, PID_<NAME>
srv() {
  local name=$1
  shift
  srv_named "$name" -m "$MODEL" --block-tokens 16 --ssd-cache "$TMP/ssd-$name" "$@"
}
stop_srv() { local pid; eval "pid=\$PID_$1"; kill -TERM "$pid"; for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; kill -0 "$pid" 2>/dev/null && fail "$1 did not stop"
  ! grep -q "Sanitizer" "$TMP/$1.log" || fail "$1: sanitizer report"; }

PROMPT=$(python3 -c 'print(",".join(str(10 + (i * 37) % 240) for i in range(200)))')
NP=200
req() { # PORT OUTFILE [PROMPT_PREFIX]
  curl -s --max-time 60 -o "$2" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[${3:-}$PROMPT],\"max_tokens\":${MAXTOK:-8},\"temperature\":0}" "http://127.0.0.1:$1/v1/completions"
}
field() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }
stats() { curl -s --max-time 10 "http://127.0.0.1:$1/stats" >"$TMP/stats.json"; field "$TMP/stats.json" "$2"; }

redis_start
URL="rediss://kvt:kvt-pw@127.0.0.1:$RPORT" # the port the first start settled on
# ------------------------------------------------------------------ cold reference (no shared tier)
srv C
req "$PORT_C" "$TMP/cold.json" || fail "cold request"
COLD=$(field "$TMP/cold.json" "j['choices'][0]['text']")
MAXTOK=64 req "$PORT_C" "$TMP/cold64.json" 1, || fail "cold 64-token request"
COLD64=$(field "$TMP/cold64.json" "j['choices'][0]['text']")
stop_srv C
ok "cold reference"

# ------------------------------------------------------------------ A computes, B reuses over verified TLS
srv A --shared-cache "$URL" "${TLSARGS[@]}"
grep -q "over TLS (verified)" "$TMP/A.log" || fail "A did not report a verified TLS connection"
srv B --shared-cache "$URL" "${TLSARGS[@]}"
req "$PORT_A" "$TMP/a.json" || fail "A request"
[ "$(field "$TMP/a.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "A output differs from cold"
for i in $(seq 1 100); do
  [ "$(stats "$PORT_A" "j['shared_cache']['queue_blocks']")" = 0 ] && [ "$(stats "$PORT_A" "j['shared_cache']['published_blocks']")" -ge 12 ] && break
  sleep 0.1
done
PUB=$(stats "$PORT_A" "j['shared_cache']['published_blocks']")
[ "$PUB" -ge 12 ] || fail "A published only $PUB blocks over TLS"
KEYS=$(rc --scan --pattern 'kvtier:v1:*' | wc -l)
[ "$KEYS" -ge 12 ] || fail "only $KEYS keys in redis"
req "$PORT_B" "$TMP/b.json" || fail "B request"
[ "$(field "$TMP/b.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "B output differs from cold"
CT=$(field "$TMP/b.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$CT" -ge $((NP - 1)) ] || fail "B reused $CT tokens over TLS, want >= $((NP - 1))"
[ "$(stats "$PORT_B" "j['shared_cache']['errors']")" = 0 ] || fail "B counted errors"
[ "$(stats "$PORT_B" "j['shared_cache']['last_error']")" = "" ] || fail "B reports a connect error"
ok "B reused $CT/$NP tokens from A over rediss:// (ACL user, client cert, verified CA); output identical to cold"
stop_srv B

# ------------------------------------------------------------------ wrong CA: refused, clear error, serving continues
srv W --shared-cache "$URL" --shared-cache-tls-ca "$C/wrongca.crt" --shared-cache-tls-cert "$C/client.crt" --shared-cache-tls-key "$C/client.key" \
  --shared-cache-timeout-ms 300
grep -q "certificate verify failed" "$TMP/W.log" || fail "wrong CA: no clear 'certificate verify failed' error in the log"
req "$PORT_W" "$TMP/w.json" || fail "W request"
[ "$(field "$TMP/w.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "W output differs from cold"
[ "$(field "$TMP/w.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] || fail "W reused blocks through an unverified server"
[ "$(stats "$PORT_W" "j['shared_cache']['fetched_blocks']")" = 0 ] || fail "W fetched blocks"
[ "$(stats "$PORT_W" "'certificate verify failed' in j['shared_cache']['last_error']")" = True ] || fail "W: /stats last_error does not say why"
req "$PORT_W" "$TMP/w2.json" || fail "W second request"
[ "$(field "$TMP/w2.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" -ge $((NP - 1)) ] || fail "W's own RAM tier not used"
ok "wrong CA: connection refused ($(grep -m1 -o 'certificate verify failed[^;)]*' "$TMP/W.log")), served from own tiers"
stop_srv W
# no CA option: the system store does not know the test CA either -> refused, never unverified
srv V --shared-cache "$URL" --shared-cache-tls-cert "$C/client.crt" --shared-cache-tls-key "$C/client.key" --shared-cache-timeout-ms 300
grep -q "certificate verify failed" "$TMP/V.log" || fail "no CA given: the connection was not refused"
stop_srv V
# a CA file that does not exist: the server refuses to start
if "$KV" serve -m "$MODEL" --port "$(rport)" --ssd-cache "$TMP/ssd-X" --shared-cache "$URL" --shared-cache-tls-ca "$TMP/nope.crt" >"$TMP/X.log" 2>&1; then
  fail "started with a missing CA file"
fi
grep -q "nope.crt" "$TMP/X.log" || fail "missing CA file: no clear error"
ok "missing CA file refuses to start; no CA = system store, still verified"

# ------------------------------------------------------------------ hung TLS redis (SIGSTOP): bounded by the budget
srv S --shared-cache "$URL" "${TLSARGS[@]}" --shared-cache-timeout-ms 300
req "$PORT_S" "$TMP/s0.json" 7, || fail "S first request" # connected; its own prompt is not in redis
kill -STOP "$REDIS_PID"
T0=$(date +%s%N)
req "$PORT_S" "$TMP/s.json" || fail "S request with hung TLS redis"
T1=$(date +%s%N)
kill -CONT "$REDIS_PID"
[ "$(field "$TMP/s.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "S output differs with hung TLS redis"
[ $(( (T1 - T0) / 1000000 )) -lt 3000 ] || fail "request blocked $(( (T1 - T0) / 1000000 )) ms on a hung TLS redis (budget 300 ms)"
[ "$(stats "$PORT_S" "j['shared_cache']['errors'] >= 1")" = True ] || fail "TLS timeout not counted"
ok "hung TLS redis: request took $(( (T1 - T0) / 1000000 )) ms with a 300 ms budget, output correct"
stop_srv S

# ------------------------------------------------------------------ TLS redis killed while a fetch waits on it
# Deterministic "mid-request": the redis is stopped, so E's lookup is waiting inside the fetch (its
# budget is 3 s) when the redis is killed; the dead connection must end that wait at once (EOF
# through the bridge), not at the budget.
srv K --shared-cache "$URL" "${TLSARGS[@]}" --shared-cache-timeout-ms 3000
req "$PORT_K" "$TMP/k0.json" 8, || fail "K first request" # connected
kill -STOP "$REDIS_PID"
T0=$(date +%s%N)
req "$PORT_K" "$TMP/k.json" &
KREQ=$!
sleep 0.5
kill -KILL "$REDIS_PID"
wait "$KREQ" || fail "K request while redis was killed"
T1=$(date +%s%N)
wait "$REDIS_PID" 2>/dev/null; REDIS_PID=""
[ "$(field "$TMP/k.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "K output differs when redis was killed mid-fetch"
MS=$(( (T1 - T0) / 1000000 ))
[ "$MS" -lt 2500 ] || fail "K waited $MS ms: the killed connection was not noticed before the 3 s budget"
[ "$(stats "$PORT_K" "j['shared_cache']['errors'] >= 1")" = True ] || fail "K: error not counted"
ok "TLS redis killed mid-fetch: request done $MS ms after it started (killed at 500 ms, budget 3000 ms), output correct"
stop_srv K
redis_start

# ------------------------------------------------------------------ TLS redis killed during a request, then restarted
srv E --shared-cache "$URL" "${TLSARGS[@]}" --shared-cache-timeout-ms 300
( sleep 0.05; kill -KILL "$REDIS_PID" ) &
KILLER=$!
MAXTOK=64 req "$PORT_E" "$TMP/e.json" 1, || fail "E request while redis dies"
wait "$KILLER"
wait "$REDIS_PID" 2>/dev/null; REDIS_PID=""
[ "$(field "$TMP/e.json" "j['choices'][0]['text']")" = "$COLD64" ] || fail "E output differs from cold when redis died"
for i in 2 3 4 5; do
  T0=$(date +%s%N)
  req "$PORT_E" "$TMP/e2.json" "$i," || fail "E request with redis down"
  T1=$(date +%s%N)
  field "$TMP/e2.json" "j['choices'][0]['text']" >/dev/null || fail "E bad response with redis down"
done
[ "$(stats "$PORT_E" "j['shared_cache']['errors'] >= 1")" = True ] || fail "errors not counted with TLS redis down"
[ "$(stats "$PORT_E" "j['shared_cache']['breaker_opens'] >= 1")" = True ] || fail "breaker did not open"
ok "TLS redis killed mid-request: served correctly, breaker opened"
redis_start
sleep 2.2 # > breaker base back-off: the next request is the half-open probe
req "$PORT_E" "$TMP/e3.json" 9, || fail "E after restart"
for i in $(seq 1 50); do
  [ "$(stats "$PORT_E" "j['shared_cache']['fetch_breaker']")" = closed ] && break
  sleep 0.1
done
[ "$(stats "$PORT_E" "j['shared_cache']['fetch_breaker']")" = closed ] || fail "breaker did not close after the TLS redis restarted"
ok "TLS redis restarted: reconnected, breaker closed"
stop_srv E
stop_srv A
echo "shared_tier_tls: all ok"
