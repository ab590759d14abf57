#!/usr/bin/env bash
# shared_tier_oversize.sh — issue 31 item 5 with the real servers: 64 MB values planted (SETRANGE)
# at the block and tail keys of prompts another server published. Server B, with a 100 ms
# --shared-cache-timeout-ms, must answer every such request within (its time for a plain Redis
# miss) + budget + MARGIN_MS, with the output of a cold run, reusing the valid first block and
# refusing (counting, deleting) the huge values. One redis-server started here on a random loopback
# port (own temp dir); every wait is bounded; the trap kills every process this script started.
set -u
BUDGET_MS=100
MARGIN_MS=200 # scheduling on a loaded shared host; the unfixed fetch took seconds against a hostile server
TMP_TAG=oversize
. "$(dirname "$0")/shared_common.bash"
need_cmds python3 curl redis-server redis-cli
redis_start

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
srv() { # NAME ARGS...
  local name=$1
  shift
  srv_named "$name" -m "$MODEL" --block-tokens 16 --ssd-cache "$TMP/ssd-$name" --shared-cache "redis://127.0.0.1:$RPORT" "$@"
}
# prompt T SEED: 40 token ids, the first 16 shared by every prompt of the same T
prompt() { python3 -c "import sys; t,s=int(sys.argv[1]),int(sys.argv[2]); print(','.join(str(10 + ((i * 37 + (t if i < 16 else t * 1000 + s)) % 240)) for i in range(40)))" "$1" "$2"; }
req() { # PORT PROMPT OUT -> prints seconds
  curl -s --max-time 60 -o "$3" -w '%{time_total}' -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[$2],\"max_tokens\":4,\"temperature\":0}" "http://127.0.0.1:$1/v1/completions"
}
field() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }
stats() { curl -s --max-time 10 "http://127.0.0.1:$1/stats" >"$TMP/stats.json"; field "$TMP/stats.json" "$2"; }
drain() {
  for i in $(seq 1 100); do [ "$(stats "$1" "j['shared_cache']['queue_blocks']")" = 0 ] && return 0; sleep 0.1; done
  fail "publish queue did not drain"
}
ms() { python3 -c "print(int(float('$1') * 1000))"; }

srv A --prompt-cache 1
srv B --prompt-cache 1 --shared-cache-timeout-ms "$BUDGET_MS"
TRIALS=3
worst=0
worst_miss=0
for t in $(seq 1 $TRIALS); do
  # A publishes the first block (prompt t/0), then a second prompt with the same first block
  P0=$(prompt "$t" 0)
  P1=$(prompt "$t" 1)
  req "$PORT_A" "$P0" "$TMP/a0.json" >/dev/null || fail "A request"
  drain "$PORT_A"
  rc --scan --pattern 'kvtier:v1:*' | sort >"$TMP/keys0"
  req "$PORT_A" "$P1" "$TMP/a1.json" >/dev/null || fail "A request"
  drain "$PORT_A"
  rc --scan --pattern 'kvtier:v1:*' | sort >"$TMP/keys1"
  REF=$(field "$TMP/a1.json" "j['choices'][0]['text']")
  # P1's own keys (block 1 and its tail; block 0 is P0's) get 64 MB (a valid header, then zeros)
  NEW=$(comm -13 "$TMP/keys0" "$TMP/keys1")
  [ -n "$NEW" ] || fail "no new keys for the second prompt"
  for k in $NEW; do [ "$(rc SETRANGE "$k" 67108863 x)" = 67108864 ] || fail "SETRANGE $k"; done
  # B: a plain miss first (a prompt nobody published), then the planted one
  M=$(ms "$(req "$PORT_B" "$(prompt $((t + 100)) 9)" "$TMP/m.json")") || fail "B miss request"
  T=$(ms "$(req "$PORT_B" "$P1" "$TMP/b.json")") || fail "B request"
  [ "$(field "$TMP/b.json" "j['choices'][0]['text']")" = "$REF" ] || fail "trial $t: B output differs from A's"
  CT=$(field "$TMP/b.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
  echo "trial $t: miss ${M} ms, planted 64 MB ${T} ms, cached_tokens $CT"
  [ "$CT" -eq 16 ] || fail "trial $t: B reused $CT tokens, want the valid first block (16)"
  [ "$T" -le $((M + BUDGET_MS + MARGIN_MS)) ] || fail "trial $t: ${T} ms > miss ${M} + budget $BUDGET_MS + margin $MARGIN_MS"
  # the block-1 value B read was deleted (B then re-published a valid record under it; the tail
  # behind it was never asked for)
  fixed=0
  for k in $NEW; do [ "$(rc STRLEN "$k")" -lt 1000000 ] && fixed=$((fixed + 1)); done
  [ "$fixed" -ge 1 ] || fail "trial $t: the refused value is still in Redis"
  [ "$T" -gt "$worst" ] && worst=$T
  [ "$M" -gt "$worst_miss" ] && worst_miss=$M
  rc FLUSHALL >/dev/null
done
[ "$(stats "$PORT_B" "j['shared_cache']['corrupt']")" -ge "$TRIALS" ] || fail "oversized values not counted"
[ "$(stats "$PORT_B" "j['shared_cache']['fetch_breaker']")" = closed ] || fail "fetch breaker not closed"
ok "$TRIALS planted-64-MB requests: worst ${worst} ms (worst miss ${worst_miss} ms, budget $BUDGET_MS, margin $MARGIN_MS), valid block reused, output identical"
echo "PASS shared_tier_oversize"
