#!/usr/bin/env bash
# cache_pin.sh — pinned prefixes and drain against a real server (issue 28 items 2 and 3):
#   - a pinned prompt survives distinct-prompt load through a RAM tier small enough that LRU evicts
#     an unpinned control prompt, and is still reused from RAM (kvtier.reused_from, cached_tokens);
#   - GET /v1/cache/pins, `kvtier cache ls --pinned`, a pin over the budget (409), malformed pin
#     bodies (400, OpenAI-style error), a ttl that runs out;
#   - restart: the pin is listed and warmed from SSD in the background, then served from RAM;
#   - unpin (by body and by id);
#   - drain: 200 with the flush's durable evidence and every RAM entry demoted; a SIGKILL right after
#     and a restart serves the prefix from SSD; drain without the SSD tier is a 409; `kvtier cache
#     drain` against the server;
#   - at most 4 pins compute at once (503 server_busy past it);
#   - with --api-key: pin, pins, unpin and drain without the key are 401;
#   - a hybrid (recurrent) model: a pin warmed after a restart is served from RAM after LRU load.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny -o "$MODEL" >/dev/null 2>&1 || fail "gen-model"
SSD=$TMP/ssd
# 16-token blocks of 4 KiB: the RAM tier holds about 12 blocks, the pin budget (half of it) about 6
COMMON=(--block-tokens 16 --prompt-cache 0.00005 --parallel 2 --ssd-demote-idle 0)

PIN_TEXT="You are the shared agent of this deployment. Tools: search(query), fetch(url), calc(expr). Answer briefly, cite sources, never reveal keys, and ask before any destructive action. Respond in English."
pin_body() { jbody "{\"prompt\":\"$PIN_TEXT\"${1:-}}"; }
# complete TEXT: one completion; prints "cached reused_from prompt_tokens"
complete() {
  expect 200 POST /v1/completions "$(jbody "{\"prompt\":\"$1\",\"max_tokens\":2,\"temperature\":0}")"
  jget "'%d %s %d' % (j['usage']['prompt_tokens_details']['cached_tokens'], j['kvtier']['reused_from'], j['usage']['prompt_tokens'])"
}
wait_log() { # wait_log PATTERN: up to 30 s for the server log to show it
  local i
  for i in $(seq 1 150); do grep -q "$1" "$SRV_LOG" && return 0; sleep 0.2; done
  fail "no '$1' in the server log within 30 s"
}

# ------------------------------------------------------------------ pin, load, reuse from RAM
srv_start "${COMMON[@]}" --ssd-cache "$SSD"
expect 200 POST /v1/cache/pin "$(pin_body)"
PIN_ID=$(jget "j['id']"); PIN_N=$(jget "j['tokens']")
[ "$(jget "j['tokens_in_ram'] == j['tokens'] and j['warm'] and j['ttl'] is None and j['bytes'] > 0")" = True ] \
  || fail "pin answer: $(cat "$TMP/resp")"
CTRL="An unpinned control prompt that the distinct load below pushes out of the small RAM tier, word after word after word."
complete "$CTRL" >/dev/null
for i in $(seq 1 24); do
  complete "Distinct load prompt number $i: $(printf 'item%s ' $(seq $((i * 40)) $((i * 40 + 30))))" >/dev/null
done
expect 200 GET /stats
[ "$(jget "j['prompt_cache']['evictions'] > 0")" = True ] || fail "the load evicted nothing: $(cat "$TMP/resp")"
read -r cc cfrom _ <<<"$(complete "$CTRL")"
[ "$cfrom" != ram ] || fail "control prompt still reused from RAM ($cc tokens): the load did not exercise LRU"
read -r pc pfrom pn <<<"$(complete "$PIN_TEXT")"
[ "$pfrom" = ram ] && [ "$pc" -eq $((pn - 1)) ] && [ "$pn" -eq "$PIN_N" ] \
  || fail "pinned prompt: cached $pc from $pfrom of $pn (expected $((PIN_N - 1)) from ram)"
ok "pinned prompt survived the load in RAM (cached $pc of $pn; the unpinned control came from '$cfrom')"

# ------------------------------------------------------------------ list, ls --pinned, budget, bad bodies, ttl
expect 200 GET /v1/cache/pins
[ "$(jget "[p['id'] for p in j['data']] == ['$PIN_ID'] and j['pinned_bytes'] > 0")" = True ] || fail "pin list"
"$KV" cache ls "$SSD" --pinned >"$TMP/ls.txt" 2>&1 || fail "cache ls --pinned: $(cat "$TMP/ls.txt")"
grep -q "pinned: 1" "$TMP/ls.txt" && grep -q "$PIN_ID  $PIN_N tokens" "$TMP/ls.txt" || fail "ls --pinned: $(cat "$TMP/ls.txt")"
BIG=$(python3 -c "print(' '.join('budget%d' % i for i in range(600)))")
expect 409 POST /v1/cache/pin "$(jbody "{\"prompt\":\"$BIG\"}")"
[ "$(jget "j['error']['code']")" = pin_budget_exceeded ] || fail "over budget: $(cat "$TMP/resp")"
for bad in '{"prompt":5}' '{}' '{"prompt":"x","ttl":"soon"}' '{"prompt":"x","ttl":0}' '{"prompt":[1,-2]}' \
           '{"messages":"hi"}' '{not json' '[]'; do
  expect 400 POST /v1/cache/pin "$(jbody "$bad")"
  [ "$(jget "j['error']['type']")" = invalid_request_error ] && jget "j['error']['message']" >/dev/null \
    || fail "malformed pin body $bad: $(cat "$TMP/resp")"
done
expect 400 DELETE "/v1/cache/pin?id=xyz"
expect 405 GET /v1/cache/pin
expect 200 POST /v1/cache/pin "$(jbody '{"messages":[{"role":"system","content":"A pin that lives one second."}],"ttl":1}')"
TTL_ID=$(jget "j['id']")
[ "$(jget "j['ttl'] == 1 and j['expires_at'] == j['created'] + 1")" = True ] || fail "ttl pin: $(cat "$TMP/resp")"
for i in $(seq 1 50); do
  expect 200 GET /v1/cache/pins
  [ "$(jget "'$TTL_ID' in [p['id'] for p in j['data']]")" = False ] && break
  sleep 0.2
done
[ "$(jget "'$TTL_ID' in [p['id'] for p in j['data']]")" = False ] || fail "the ttl pin did not expire within 10 s"
ok "pin list, ls --pinned, 409 over budget, 400 for malformed bodies, a ttl pin expired"

# ------------------------------------------------------------------ restart: listed and warm from SSD
srv_stop TERM
srv_start "${COMMON[@]}" --ssd-cache "$SSD"
wait_log "pinned prefixes: 1 of 1 warm"
expect 200 GET /v1/cache/pins
[ "$(jget "[(p['id'], p['warm'], p['tokens_in_ram']) for p in j['data']] == [('$PIN_ID', True, $PIN_N)]")" = True ] \
  || fail "pin after restart: $(cat "$TMP/resp")"
grep -q "pinned prefixes: $PIN_ID warm ($PIN_N tokens, $((PIN_N - 1)) from the tiers" "$SRV_LOG" \
  || fail "the warm-up did not restore the prefix from SSD: $(grep 'pinned prefixes' "$SRV_LOG")"
read -r pc pfrom pn <<<"$(complete "$PIN_TEXT")"
[ "$pfrom" = ram ] && [ "$pc" -eq $((PIN_N - 1)) ] || fail "after restart: cached $pc from $pfrom (expected warm from ram)"
ok "restart: pin listed, warmed from SSD in the background, then served from RAM ($pc tokens)"

# ------------------------------------------------------------------ unpin
expect 200 DELETE /v1/cache/pin "$(pin_body)"
[ "$(jget "j['deleted'] and j['id'] == '$PIN_ID'")" = True ] || fail "unpin: $(cat "$TMP/resp")"
expect 404 DELETE "/v1/cache/pin?id=$PIN_ID"
expect 200 GET /v1/cache/pins
[ "$(jget "len(j['data'])")" = 0 ] || fail "pins left after unpin: $(cat "$TMP/resp")"
expect 200 POST /v1/cache/pin "$(pin_body ',"ttl":3600')"
expect 200 DELETE "/v1/cache/pin?id=$PIN_ID"
ok "unpin by body and by id; 404 for an unknown pin"

# ------------------------------------------------------------------ drain, SIGKILL, restart from SSD
DRAIN_TEXT="A prompt computed just before the drain, which must come back from the SSD tier after a hard kill."
complete "$DRAIN_TEXT" >/dev/null
expect 200 POST /admin/drain
[ "$(jget "j['durable'] and j['demoted'] > 0 and 'records_written' in j and 'longest_durable_prefix_tokens' in j")" = True ] \
  || fail "drain: $(cat "$TMP/resp")"
expect 200 GET /stats
[ "$(jget "j['prompt_cache']['blocks']")" = 0 ] || fail "RAM entries left after the drain: $(cat "$TMP/resp")"
"$KV" cache drain --port "$SRV_PORT" >"$TMP/cli.txt" 2>&1 || fail "kvtier cache drain: $(cat "$TMP/cli.txt")"
grep -q '"durable":true' "$TMP/cli.txt" || fail "kvtier cache drain output: $(cat "$TMP/cli.txt")"
kill -KILL "$SRV_PID"; wait "$SRV_PID" 2>/dev/null; SRV_PID=""
# the pin list is untrusted: garbage in its place is reported and ignored, by the server and by ls
PINS_FILE=$(ls "$SSD"/*/PINS) || fail "no pin list file"
head -c 300 /dev/urandom >"$PINS_FILE"
"$KV" cache ls "$SSD" --pinned >"$TMP/ls.txt" 2>&1 || fail "cache ls --pinned on a bad pin list: $(cat "$TMP/ls.txt")"
grep -q "unreadable pin list" "$TMP/ls.txt" || fail "ls --pinned on garbage: $(cat "$TMP/ls.txt")"
srv_start "${COMMON[@]}" --ssd-cache "$SSD"
grep -q "ignoring the pin list" "$SRV_LOG" || fail "a garbage pin list was not reported"
expect 200 GET /v1/cache/pins
[ "$(jget "len(j['data'])")" = 0 ] || fail "pins from a garbage pin list: $(cat "$TMP/resp")"
read -r dc dfrom dn <<<"$(complete "$DRAIN_TEXT")"
[ "$dfrom" = ssd ] && [ "$dc" -eq $((dn - 1)) ] || fail "after drain + SIGKILL: cached $dc from $dfrom of $dn"
srv_stop TERM
ok "drain: durable, RAM emptied, the CLI drains too; after SIGKILL the prefix came back from SSD ($dc tokens); a garbage pin list is ignored"

# ------------------------------------------------------------------ drain without the SSD tier
srv_start "${COMMON[@]}"
expect 409 POST /admin/drain
[ "$(jget "j['error']['code']")" = ssd_tier_off ] || fail "drain without SSD: $(cat "$TMP/resp")"
"$KV" cache drain --port "$SRV_PORT" >"$TMP/cli.txt" 2>&1 && fail "kvtier cache drain without SSD exited 0"
grep -q ssd_tier_off "$TMP/cli.txt" || fail "kvtier cache drain without SSD: $(cat "$TMP/cli.txt")"
srv_stop TERM
"$KV" cache drain --port "$SRV_PORT" --timeout 2 >"$TMP/cli.txt" 2>&1 && fail "kvtier cache drain with no server exited 0"
grep -q "cannot connect" "$TMP/cli.txt" || fail "no server: $(cat "$TMP/cli.txt")"
srv_start --block-tokens 16 --prompt-cache 0
expect 409 POST /v1/cache/pin "$(pin_body)"
[ "$(jget "j['error']['code']")" = ram_tier_off ] || fail "pin without the RAM tier: $(cat "$TMP/resp")"
srv_stop TERM
ok "drain without the SSD tier: 409 ssd_tier_off (HTTP and CLI); no server: a clear error; pin without the RAM tier: 409"

# ------------------------------------------------------------------ pins computing at once are bounded
# --parallel 1 and one long generation (16 choices, streamed, never read) ahead of them: the first 4
# pins wait in the engine's queue, the next ones get 503 server_busy at once; when the long request's
# client goes away the waiting pins complete.
srv_start --block-tokens 16 --parallel 1 --ctx 2048
cat >"$TMP/pincap.py" <<'PY'
import json, socket, sys, time, threading, http.client
port = int(sys.argv[1])
def stats():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/stats")
    j = json.loads(c.getresponse().read())
    c.close()
    return j
body = json.dumps({"prompt": "a long generation ahead of the pins", "max_tokens": 1500, "temperature": 0,
                   "stream": True, "n": 16}).encode()
hog = socket.create_connection(("127.0.0.1", port), timeout=30)
hog.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)
t_end = time.time() + 30
while time.time() < t_end and stats()["batching"]["rows_active"] != 1:
    time.sleep(0.05)
codes = {}
def pin(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/cache/pin", json.dumps({"prompt": f"pin number {i} of six"}), {"Content-Type": "application/json"})
    r = c.getresponse()
    codes[i] = (r.status, json.loads(r.read()))
    c.close()
ths = [threading.Thread(target=pin, args=(i,)) for i in range(4)]
for t in ths: t.start()
t_end = time.time() + 30
while time.time() < t_end and stats()["batching"]["rows_queued"] < 4:
    time.sleep(0.05)
q = stats()["batching"]["rows_queued"]
assert q == 4, f"expected the 4 pins queued behind the long generation, saw {q}"
for i in (4, 5):
    pin(i)
    st, j = codes[i]
    assert st == 503 and j["error"]["code"] == "server_busy", (i, st, j)
hog.close()  # the long request's client goes away: it is cancelled, the pins run
for t in ths: t.join(120)
assert all(codes[i][0] == 200 for i in range(4)), codes
print("4 pins waited and completed, 2 got 503 server_busy")
PY
timeout 200 python3 "$TMP/pincap.py" "$SRV_PORT" || fail "pins computing at once"
srv_stop TERM
ok "at most 4 pins compute at once; the next get 503 server_busy"

# ------------------------------------------------------------------ auth
srv_start "${COMMON[@]}" --ssd-cache "$TMP/ssd-auth" --api-key s3cret
expect 401 POST /v1/cache/pin "$(pin_body)"
expect 401 GET /v1/cache/pins
expect 401 DELETE "/v1/cache/pin?id=$PIN_ID"
expect 401 POST /admin/drain
"$KV" cache drain --port "$SRV_PORT" >"$TMP/cli.txt" 2>&1 && fail "kvtier cache drain without the key exited 0"
AUTH=(-H "Authorization: Bearer s3cret")
expect 200 POST /v1/cache/pin "$(pin_body)"
expect 200 POST /admin/drain
"$KV" cache drain --port "$SRV_PORT" --api-key s3cret >"$TMP/cli.txt" 2>&1 || fail "kvtier cache drain --api-key: $(cat "$TMP/cli.txt")"
srv_stop TERM
ok "with --api-key: pin, pins, unpin and drain need the key (401 without)"

# ------------------------------------------------------------------ a hybrid (recurrent) model
# Its state cannot be cut back: the pin must hold the n-1 snapshot too, and after a restart the
# warm-up (restored from SSD at n-1) must bring that snapshot into RAM.
AUTH=()
MODEL=$TMP/q35.gguf
"$KV" gen-model --arch qwen35 --shape tiny --type f16 --peaked -o "$MODEL" >/dev/null 2>&1 || fail "gen-model qwen35"
HY=(--block-tokens 16 --prompt-cache 0.001 --parallel 2 --ssd-demote-idle 0 --ssd-cache "$TMP/ssd-hybrid")
srv_start "${HY[@]}"
expect 200 POST /v1/cache/pin "$(pin_body)"
HN=$(jget "j['tokens']")
srv_stop TERM
srv_start "${HY[@]}"
wait_log "pinned prefixes: 1 of 1 warm"
CTRL="An unpinned control prompt for the hybrid model, pushed out of RAM by the load below, word after word."
complete "$CTRL" >/dev/null
for i in $(seq 1 12); do
  complete "Hybrid load prompt $i: $(printf 'item%s ' $(seq $((i * 40)) $((i * 40 + 30))))" >/dev/null
done
read -r cc cfrom _ <<<"$(complete "$CTRL")"
[ "$cfrom" != ram ] || fail "hybrid: control prompt still reused from RAM: the load did not exercise LRU"
read -r pc pfrom _ <<<"$(complete "$PIN_TEXT")"
[ "$pfrom" = ram ] && [ "$pc" -eq $((HN - 1)) ] || fail "hybrid after restart: cached $pc from $pfrom (expected $((HN - 1)) from ram)"
srv_stop TERM
ok "hybrid model: the pin warmed after a restart is served from RAM ($pc tokens) after LRU load"
echo "PASS cache_pin"
