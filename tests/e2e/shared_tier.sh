#!/usr/bin/env bash
# shared_tier.sh — end-to-end test of the shared block tier (issue 17): one redis-server (started
# here on a random loopback port, own temp dir) and two kvtier servers A and B (own ports, own SSD
# dirs). B reuses a prefix A computed (cached_tokens >= prompt-1, greedy output identical to a cold
# run); Redis killed mid-request (also deterministically: stopped, then killed while a fetch waits
# on it) and restarted; a value corrupted in Redis (SETRANGE); maxmemory
# reached (noeviction -> OOM on SET); a different model on the same Redis never reuses A's blocks.
# Every wait is bounded; the trap kills every process this script started.
set -u
BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-shared-XXXXXX")
PIDS=()
REDIS_PID=""
cleanup() {
  for p in "${PIDS[@]}" $REDIS_PID; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f (tail)"; tail -15 "$f"; }; done
  exit 1
}
ok() { echo "ok: $*"; }
[ -x "$KV" ] || fail "$KV not built"
command -v python3 >/dev/null || fail "python3 missing"
command -v curl >/dev/null || fail "curl missing"
# install-deps installs redis-server: its absence is a failure, not a skip
command -v redis-server >/dev/null || fail "redis-server missing (scripts/install-deps installs it)"
command -v redis-cli >/dev/null || fail "redis-cli missing (package redis-tools)"

rport() { echo $((20000 + (RANDOM * 32768 + RANDOM) % 20000)); }
RPORT=$(rport)
RDIR=$TMP/redis
mkdir -p "$RDIR"
redis_start() { # extra redis-server args...
  redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$RDIR" --save '' --appendonly no \
    --protected-mode yes --daemonize no "$@" >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  local i
  for i in $(seq 1 100); do
    redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG && return 0
    kill -0 "$REDIS_PID" 2>/dev/null || fail "redis-server exited at start"
    sleep 0.1
  done
  fail "redis-server not ready in 10 s"
}
redis_kill() { kill -KILL "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=""; }
rc() { redis-cli -p "$RPORT" "$@"; }

MODEL=$TMP/m.gguf
MODEL2=$TMP/m2.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
"$KV" gen-model --arch llama --shape tiny --type f16 --seed 7 -o "$MODEL2" >/dev/null 2>&1 ||
  "$KV" gen-model --arch qwen2 --shape tiny --type f16 -o "$MODEL2" >/dev/null 2>&1 || fail "gen-model 2 failed"

# srv NAME MODEL ARGS... -> sets PORT_<NAME>
srv() {
  local name=$1 model=$2 try port i pid
  shift 2
  for try in 1 2 3 4 5; do
    port=$(rport)
    "$KV" serve -m "$model" --port "$port" --block-tokens 16 --ssd-cache "$TMP/ssd-$name" \
      --shared-cache "redis://127.0.0.1:$RPORT" "$@" >"$TMP/$name.log" 2>&1 &
    pid=$!
    for i in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      grep -q "^listening on" "$TMP/$name.log" && { PIDS+=("$pid"); eval "PORT_$name=$port PID_$name=$pid"; return 0; }
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && fail "server $name not ready in 60 s"
    grep -q "cannot listen" "$TMP/$name.log" || fail "server $name exited at start"
  done
  fail "no free port for $name"
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
echo "shared_tier: all ok"
