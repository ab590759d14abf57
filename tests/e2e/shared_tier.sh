#!/usr/bin/env bash
# shared_tier.sh — end-to-end test of the shared block tier (issue 17): one redis-server (started
# here on a random loopback port, own temp dir) and two kvtier servers A and B (own ports, own SSD
# dirs). B reuses a prefix A computed (cached_tokens >= prompt-1, greedy output identical to a cold
# run); Redis killed mid-request (also deterministically: stopped, then killed while a fetch waits
# on it) and restarted; a value corrupted in Redis (SETRANGE); maxmemory
# reached (noeviction -> OOM on SET); a different model on the same Redis never reuses A's blocks.
# Issue 24: servers without --ssd-cache; a sliding-window model (gemma3); blocks reach Redis
# without a flush; POST /admin/cache/flush?wait=shared; shutdown drains the publisher; Redis
# stopped mid-publish (the flush reports it, nothing breaks).
# Every wait is bounded; the trap kills every process this script started.
set -u
TMP_TAG=shared
. "$(dirname "$0")/shared_common.bash"
need_cmds python3 curl redis-server redis-cli

MODEL=$TMP/m.gguf
MODEL2=$TMP/m2.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
"$KV" gen-model --arch llama --shape tiny --type f16 --seed 7 -o "$MODEL2" >/dev/null 2>&1 ||
  "$KV" gen-model --arch qwen2 --shape tiny --type f16 -o "$MODEL2" >/dev/null 2>&1 || fail "gen-model 2 failed"

# srv NAME MODEL ARGS... -> sets PORT_<NAME>
srv() {
  local name=$1 model=$2
  shift 2
  local ssd=(--ssd-cache "$TMP/ssd-$name")
  [ -n "${NOSSD:-}" ] && ssd=() # NOSSD=1: no SSD tier (the shared tier works without one)
  srv_named "$name" -m "$model" --block-tokens 16 "${ssd[@]}" --shared-cache "redis://127.0.0.1:$RPORT" "$@"
}
stop_srv() { local pid; eval "pid=\$PID_$1"; kill -TERM "$pid"; for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; kill -0 "$pid" 2>/dev/null && fail "$1 did not stop"; }

# a fixed prompt of token ids: 200 tokens = 12 full blocks of 16 + 8
PROMPT=$(python3 -c 'print(",".join(str(10 + (i * 37) % 240) for i in range(200)))')
NP=200
req() { # PORT OUTFILE [MAXTIME]
  curl -s --max-time "${3:-60}" -o "$2" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[$PROMPT],\"max_tokens\":${MAXTOK:-8},\"temperature\":0}" "http://127.0.0.1:$1/v1/completions"
}
field() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }
stats() { curl -s --max-time 10 "http://127.0.0.1:$1/stats" >"$TMP/stats.json"; field "$TMP/stats.json" "$2"; }
flush_pub() { # wait until a server's publish queue is empty and something was published
  local i
  for i in $(seq 1 100); do
    [ "$(stats "$1" "j['shared_cache']['queue_blocks']")" = 0 ] && return 0
    sleep 0.1
  done
  fail "publish queue did not drain in 10 s"
}

redis_start --maxmemory 0
# ------------------------------------------------------------------ cold references (fresh servers, empty redis)
srv C "$MODEL" --prompt-cache 1
MAXTOK=64 req "$PORT_C" "$TMP/cold64.json" || fail "cold 64-token request"
COLD64=$(field "$TMP/cold64.json" "j['choices'][0]['text']")
[ "$(field "$TMP/cold64.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] || fail "cold run reused tokens"
stop_srv C
rc FLUSHALL >/dev/null
rm -rf "$TMP/ssd-C"
srv C "$MODEL" --prompt-cache 1
req "$PORT_C" "$TMP/cold.json" || fail "cold request"
COLD=$(field "$TMP/cold.json" "j['choices'][0]['text']")
[ "$(field "$TMP/cold.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] || fail "cold run reused tokens"
stop_srv C
rc FLUSHALL >/dev/null
ok "cold reference"

# ------------------------------------------------------------------ A computes, B reuses
srv A "$MODEL"
srv B "$MODEL"
req "$PORT_A" "$TMP/a.json" || fail "A request"
[ "$(field "$TMP/a.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "A output differs from cold"
flush_pub "$PORT_A"
PUB=$(stats "$PORT_A" "j['shared_cache']['published_blocks']")
[ "$PUB" -ge 12 ] || fail "A published only $PUB blocks"
KEYS=$(rc --scan --pattern 'kvtier:v1:*' | wc -l)
[ "$KEYS" -ge 12 ] || fail "only $KEYS keys in redis"
req "$PORT_B" "$TMP/b.json" || fail "B request"
[ "$(field "$TMP/b.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "B output differs from cold"
CT=$(field "$TMP/b.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$CT" -ge $((NP - 1)) ] || fail "B reused $CT tokens, want >= $((NP - 1))"
[ "$(stats "$PORT_B" "j['shared_cache']['hits']")" -ge 1 ] || fail "B shared hits"
[ "$(stats "$PORT_B" "j['shared_cache']['fetched_bytes'] > 0")" = True ] || fail "B fetched bytes"
ok "B reused $CT/$NP tokens computed by A; output identical to a cold run"

# ------------------------------------------------------------------ corrupt value -> verified, deleted, recomputed
srv D "$MODEL"
K1=$(rc --scan --pattern 'kvtier:v1:*:b:*' | head -1)
for k in $(rc --scan --pattern 'kvtier:v1:*'); do rc SETRANGE "$k" 4200 "garbage-garbage" >/dev/null; done
req "$PORT_D" "$TMP/d.json" || fail "D request"
[ "$(field "$TMP/d.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "D output differs after corruption"
[ "$(stats "$PORT_D" "j['shared_cache']['corrupt']")" -ge 1 ] || fail "corruption not counted"
[ "$(field "$TMP/d.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] || fail "D reused corrupt blocks"
[ "$(rc EXISTS "$K1")" = 0 ] || [ "$(rc --scan --pattern 'kvtier:v1:*' | wc -l)" -ge 1 ] || fail "corrupt key handling"
ok "corrupt values detected, deleted, output correct"
stop_srv D

# ------------------------------------------------------------------ redis killed mid-request, then restarted
rc FLUSHALL >/dev/null
srv E "$MODEL" --shared-cache-timeout-ms 300
# fill redis again from a fresh server F (A remembers what it published and would not resend it)
srv F "$MODEL"
req "$PORT_F" "$TMP/f.json" || fail "F request"
flush_pub "$PORT_F"
# hung redis (SIGSTOP): the request waits at most the stated timeout, then computes
srv S "$MODEL" --shared-cache-timeout-ms 300
kill -STOP "$REDIS_PID"
T0=$(date +%s%N)
curl -s --max-time 20 -o "$TMP/s.json" -X POST -H 'Content-Type: application/json' \
  --data-binary "{\"prompt\":[$PROMPT],\"max_tokens\":8,\"temperature\":0}" "http://127.0.0.1:$PORT_S/v1/completions" || fail "S request with hung redis"
T1=$(date +%s%N)
kill -CONT "$REDIS_PID"
[ "$(field "$TMP/s.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "S output differs with hung redis"
[ $(( (T1 - T0) / 1000000 )) -lt 3000 ] || fail "request blocked $(( (T1 - T0) / 1000000 )) ms on a hung redis (timeout 300 ms)"
[ "$(stats "$PORT_S" "j['shared_cache']['errors'] >= 1")" = True ] || fail "timeout not counted"
ok "hung redis: request took $(( (T1 - T0) / 1000000 )) ms with a 300 ms shared-tier budget, output correct"
stop_srv S
# killed while a fetch waits on it (stopped first, so the lookup is inside the fetch, budget 3 s):
# the closed connection ends the wait at once, not at the budget
srv K "$MODEL" --shared-cache-timeout-ms 3000
curl -s --max-time 20 -o "$TMP/k0.json" -X POST -H 'Content-Type: application/json' \
  --data-binary "{\"prompt\":[8,$PROMPT],\"max_tokens\":2,\"temperature\":0}" "http://127.0.0.1:$PORT_K/v1/completions" || fail "K first request"
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
[ $(( (T1 - T0) / 1000000 )) -lt 2500 ] || fail "K waited $(( (T1 - T0) / 1000000 )) ms: the killed connection was not noticed before the 3 s budget"
ok "redis killed mid-fetch: request done $(( (T1 - T0) / 1000000 )) ms after it started (killed at 500 ms, budget 3000 ms)"
stop_srv K
redis_start
( sleep 0.05; kill -KILL "$REDIS_PID" ) &
T0=$(date +%s%N)
MAXTOK=64 req "$PORT_E" "$TMP/e.json" || fail "E request while redis dies"
T1=$(date +%s%N)
wait "$REDIS_PID" 2>/dev/null; REDIS_PID=""
[ "$(field "$TMP/e.json" "j['choices'][0]['text']")" = "$COLD64" ] || fail "E output differs from cold when redis died"
for i in 1 2 3 4; do # redis down: requests keep being served (breaker opens)
  curl -s --max-time 20 -o "$TMP/e2.json" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[$i,$PROMPT],\"max_tokens\":4,\"temperature\":0}" "http://127.0.0.1:$PORT_E/v1/completions" || fail "E request with redis down"
  field "$TMP/e2.json" "j['choices'][0]['text']" >/dev/null || fail "E bad response with redis down"
done
[ "$(stats "$PORT_E" "j['shared_cache']['errors'] >= 1")" = True ] || fail "errors not counted with redis down"
[ "$(stats "$PORT_E" "j['shared_cache']['breaker_opens'] >= 1")" = True ] || fail "breaker did not open"
ok "redis killed mid-request: served correctly, breaker opened ($(( (T1 - T0) / 1000000 )) ms request)"
redis_start
rc FLUSHALL >/dev/null
sleep 2.2 # > breaker base back-off (1 s): the next request is the half-open probe
curl -s --max-time 20 -o "$TMP/e3.json" -X POST -H 'Content-Type: application/json' \
  --data-binary "{\"prompt\":[5,$PROMPT],\"max_tokens\":4,\"temperature\":0}" "http://127.0.0.1:$PORT_E/v1/completions" || fail "E after restart"
for i in $(seq 1 50); do
  [ "$(stats "$PORT_E" "j['shared_cache']['fetch_breaker']")" = closed ] && break
  sleep 0.1
done
[ "$(stats "$PORT_E" "j['shared_cache']['fetch_breaker']")" = closed ] || fail "breaker did not close after restart"
ok "redis restarted: breaker closed again"
stop_srv E
stop_srv F

# ------------------------------------------------------------------ maxmemory reached (noeviction -> OOM)
redis_kill
redis_start --maxmemory-policy noeviction
USED=$(rc INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')
rc CONFIG SET maxmemory $((USED + 20000)) >/dev/null # room for about two 8 KiB blocks, then OOM
srv G "$MODEL"
req "$PORT_G" "$TMP/g.json" || fail "G request with full redis"
[ "$(field "$TMP/g.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "G output differs with full redis"
for i in $(seq 1 100); do
  [ "$(stats "$PORT_G" "j['shared_cache']['oom_errors'] >= 1")" = True ] && break
  sleep 0.1
done
[ "$(stats "$PORT_G" "j['shared_cache']['oom_errors'] >= 1")" = True ] || fail "OOM errors not counted"
req "$PORT_G" "$TMP/g2.json" || fail "G second request with full redis"
[ "$(field "$TMP/g2.json" "j['choices'][0]['text']")" = "$COLD" ] || fail "G second output differs"
ok "maxmemory reached: OOM counted, serving unaffected"
stop_srv G

# ------------------------------------------------------------------ another model on the same redis
redis_kill
redis_start
srv H "$MODEL"
req "$PORT_H" "$TMP/h.json" || fail "H request"
flush_pub "$PORT_H"
srv M "$MODEL2"
req "$PORT_M" "$TMP/m.json" || fail "M request"
[ "$(field "$TMP/m.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] || fail "model 2 reused model 1's blocks"
[ "$(stats "$PORT_M" "j['shared_cache']['fetched_blocks']")" = 0 ] || fail "model 2 fetched blocks of model 1"
ok "a different model never reuses another model's blocks"
stop_srv H
stop_srv M
stop_srv A
stop_srv B

# ------------------------------------------------------------------ issue 24: no SSD tier, window layers, prompt publishing
redis_kill
redis_start
nkeys() { rc --scan --pattern "kvtier:v1:*$1" | wc -l; }
text() { field "$1" "j['choices'][0]['text']"; }
cached() { field "$1" "j['usage']['prompt_tokens_details']['cached_tokens']"; }
wait_keys() { # PATTERN N SECONDS: the number of keys matching *PATTERN reaches N within SECONDS
  local i n=0
  for i in $(seq 1 $(($3 * 10))); do
    n=$(nkeys "$1")
    [ "$n" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "redis holds $n keys matching *$1 after $3 s, want >= $2"
}
reqp() { # PORT OUTFILE FIRST: the prompt after one leading token FIRST (a chain of its own)
  curl -s --max-time 60 -o "$2" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[$3,$PROMPT],\"max_tokens\":8,\"temperature\":0}" "http://127.0.0.1:$1/v1/completions"
}
flush() { # PORT OUTFILE [QUERY] -> HTTP status
  curl -s --max-time 90 -o "$2" -w '%{http_code}' -X POST "http://127.0.0.1:$1/admin/cache/flush${3:-}"
}
# no --ssd-cache: A2 computes, its blocks reach Redis without a flush (bounded poll), B2 reuses
NOSSD=1 srv A2 "$MODEL"
NOSSD=1 srv B2 "$MODEL"
req "$PORT_A2" "$TMP/a2.json" || fail "A2 request"
[ "$(text "$TMP/a2.json")" = "$COLD" ] || fail "A2 output differs from cold"
wait_keys ":b:*" 12 10
req "$PORT_B2" "$TMP/b2.json" || fail "B2 request"
[ "$(text "$TMP/b2.json")" = "$COLD" ] || fail "B2 output differs from cold"
CT=$(cached "$TMP/b2.json")
[ "$CT" -ge 192 ] || fail "B2 reused $CT tokens, want >= 192"
[ "$(stats "$PORT_B2" "j['shared_cache']['fetched_blocks'] >= 12")" = True ] || fail "B2 fetched too few blocks"
ok "no --ssd-cache: B2 reused $CT/$NP tokens computed by A2 (published without a flush); output identical to a cold run"
stop_srv A2
stop_srv B2

# sliding-window layers (gemma3): GC computes cold (nothing of this model in Redis), GB reuses
GEMMA=$TMP/g3.gguf
"$KV" gen-model --arch gemma3 --shape tiny --type f16 -o "$GEMMA" >/dev/null 2>&1 || fail "gen-model gemma3 failed"
srv GC "$GEMMA"
NOSSD=1 srv GB "$GEMMA"
req "$PORT_GC" "$TMP/gc.json" || fail "GC request"
[ "$(cached "$TMP/gc.json")" = 0 ] || fail "cold gemma3 run reused tokens"
COLDG=$(text "$TMP/gc.json")
[ "$(flush "$PORT_GC" "$TMP/gcf.json" "?wait=shared")" = 200 ] || fail "GC flush?wait=shared: $(cat "$TMP/gcf.json")"
[ "$(nkeys ":b:0:*")" -ge 2 ] && [ "$(nkeys ":b:1:*")" -ge 12 ] || fail "gemma3 keys: window group $(nkeys ":b:0:*"), full group $(nkeys ":b:1:*")"
req "$PORT_GB" "$TMP/gb.json" || fail "GB request"
[ "$(text "$TMP/gb.json")" = "$COLDG" ] || fail "GB output differs from cold (gemma3 over the shared tier)"
CT=$(cached "$TMP/gb.json")
[ "$CT" -ge 192 ] || fail "GB reused $CT tokens, want >= 192 ($(stats "$PORT_GB" "j['shared_cache']"))"
ok "gemma3 (window layers): GB reused $CT/$NP tokens from the shared tier; output identical to a cold run"
stop_srv GC
stop_srv GB

# flush?wait=shared answers when every block is in Redis
srv P "$MODEL"
N0=$(nkeys ":b:*")
reqp "$PORT_P" "$TMP/p.json" 5 || fail "P request"
CODE=$(flush "$PORT_P" "$TMP/pf.json" "?wait=shared")
N=$(nkeys ":b:*")
[ "$CODE" = 200 ] || fail "flush?wait=shared answered $CODE: $(cat "$TMP/pf.json")"
[ "$(field "$TMP/pf.json" "j['shared']['pending']")" = 0 ] || fail "flush?wait=shared left publishes pending: $(cat "$TMP/pf.json")"
[ "$(field "$TMP/pf.json" "j['shared']['lost']")" = 0 ] || fail "flush?wait=shared lost publishes: $(cat "$TMP/pf.json")"
[ "$N" -ge $((N0 + 12)) ] || fail "when flush?wait=shared answered redis held $N full blocks (before $N0), want all 12 of P's"
[ "$(flush "$PORT_P" "$TMP/pf2.json" "?wait=everything")" = 400 ] || fail "an unknown wait= was accepted"
ok "flush?wait=shared: 200, pending 0, every block in redis when it answered"

# shutdown publishes what is still queued: Redis stopped while Q's blocks are sent, resumed, Q
# stopped at once
srv Q "$MODEL" --shared-cache-timeout-ms 3000
kill -STOP "$REDIS_PID"
reqp "$PORT_Q" "$TMP/q.json" 6 || fail "Q request"
sleep 0.5
kill -CONT "$REDIS_PID"
stop_srv Q
N1=$(nkeys ":b:*")
[ "$N1" -ge $((N + 12)) ] || fail "after Q's shutdown redis holds $N1 full blocks (before $N), want all 12 of Q's"
ok "shutdown drained the publisher: all of Q's blocks in redis"

# Redis stopped mid-publish: the flush reports what is pending or lost with an error, the server
# keeps serving, and what reaches Redis later is reused correctly
srv R "$MODEL" --shared-cache-timeout-ms 300 --shutdown-timeout 2
kill -STOP "$REDIS_PID"
reqp "$PORT_R" "$TMP/r.json" 7 || fail "R request"
CODE=$(flush "$PORT_R" "$TMP/rf.json" "?wait=shared")
kill -CONT "$REDIS_PID"
[ "$CODE" = 503 ] || fail "flush?wait=shared with redis stopped answered $CODE: $(cat "$TMP/rf.json")"
[ "$(field "$TMP/rf.json" "j['shared']['pending'] + j['shared']['lost'] > 0")" = True ] || fail "flush reported nothing pending or lost: $(cat "$TMP/rf.json")"
[ -n "$(field "$TMP/rf.json" "j['shared']['error']")" ] || fail "flush reported no error: $(cat "$TMP/rf.json")"
reqp "$PORT_R" "$TMP/r2.json" 7 || fail "R second request"
[ "$(text "$TMP/r2.json")" = "$(text "$TMP/r.json")" ] || fail "R output changed"
srv V "$MODEL"
reqp "$PORT_V" "$TMP/v.json" 7 || fail "V request"
[ "$(text "$TMP/v.json")" = "$(text "$TMP/r.json")" ] || fail "V output differs from R's after the stalled publish"
[ "$(stats "$PORT_V" "j['shared_cache']['corrupt']")" = 0 ] || fail "V found corrupt values"
ok "redis stopped mid-publish: flush 503 ($(field "$TMP/rf.json" "j['shared']")), server alive, V output identical"
stop_srv R
stop_srv V
stop_srv P
echo "shared_tier: all ok"
