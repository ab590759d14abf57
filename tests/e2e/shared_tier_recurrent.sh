#!/usr/bin/env bash
# shared_tier_recurrent.sh — the shared tier with a hybrid recurrent model (qwen35 gen-model):
# recurrent-state snapshots are published and fetched like blocks (verified, compat-keyed). Two
# kvtier servers and one redis-server: B reuses A's prefix up to A's last snapshot at or before
# n-1 (blocks + the snapshot), and a follow-up prompt reuses A's prompt-boundary snapshot (tail +
# snapshot); output identical to cold runs; a corrupted snapshot is refused (counted, deleted)
# and the prompt is computed, output still identical. Outputs are SAMPLED (temperature 1, fixed
# seed): a random-weight model's greedy output repeats one token whatever the state, so it could
# not tell a wrong recurrent state from the right one; sampling with a fixed seed turns every
# logit difference into different text (checked: zeroing the fetched state fails this test).
set -u
TMP_TAG=shrec
. "$(dirname "$0")/shared_common.bash"
need_cmds python3 curl redis-server redis-cli
redis_start

MODEL=$TMP/q35.gguf
"$KV" gen-model --arch qwen35 --shape tiny --type f16 --peaked -o "$MODEL" >/dev/null 2>&1 || fail "gen-model qwen35 failed"
srv() { # NAME ARGS...
  local name=$1
  shift
  srv_named "$name" -m "$MODEL" --block-tokens 16 --recurrent-snapshot-every 64 --ssd-cache "$TMP/ssd-$name" "$@"
}
stop_srv() { local pid; eval "pid=\$PID_$1"; kill -TERM "$pid"; for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; kill -0 "$pid" 2>/dev/null && fail "$1 did not stop"
  ! grep -q "Sanitizer" "$TMP/$1.log" || fail "$1: sanitizer report"; }
P1=$(python3 -c 'print(",".join(str(10 + (i * 37) % 240) for i in range(200)))')
P2="$P1,$(python3 -c 'print(",".join(str(7 + (i * 11) % 200) for i in range(24)))')"
req() { # PORT OUT PROMPT
  curl -s --max-time 120 -o "$2" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[$3],\"max_tokens\":24,\"temperature\":${TEMP:-1},\"seed\":42}" "http://127.0.0.1:$1/v1/completions"
}
field() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }
stats() { curl -s --max-time 10 "http://127.0.0.1:$1/stats" >"$TMP/stats.json"; field "$TMP/stats.json" "$2"; }
text() { field "$1" "j['choices'][0]['text']"; }
cached() { field "$1" "j['usage']['prompt_tokens_details']['cached_tokens']"; }

srv C
req "$PORT_C" "$TMP/c1.json" "$P1" || fail "cold 1"
stop_srv C; rm -rf "$TMP/ssd-C"; srv C
req "$PORT_C" "$TMP/c2.json" "$P2" || fail "cold 2"
stop_srv C
COLD1=$(text "$TMP/c1.json"); COLD2=$(text "$TMP/c2.json")
[ "$(cached "$TMP/c2.json")" = 0 ] || fail "cold 2 reused tokens"
ok "cold references"

srv A --shared-cache "redis://127.0.0.1:$RPORT"
grep -q "supports" "$TMP/A.log" && fail "A refused the recurrent model"
req "$PORT_A" "$TMP/a.json" "$P1" || fail "A request"
[ "$(text "$TMP/a.json")" = "$COLD1" ] || fail "A output differs from cold"
for i in $(seq 1 100); do
  [ "$(stats "$PORT_A" "j['shared_cache']['queue_blocks']")" = 0 ] && break
  sleep 0.1
done
SNAPS=$(rc --scan --pattern 'kvtier:v1:*:s:*' | wc -l)
[ "$SNAPS" -ge 4 ] || fail "A published $SNAPS snapshots, want >= 4 (64, 128, 192, prompt end)"
ok "A published $(rc --scan --pattern 'kvtier:v1:*:b:*' | wc -l) blocks, $(rc --scan --pattern 'kvtier:v1:*:t:*' | wc -l) tails, $SNAPS snapshots"

srv B --shared-cache "redis://127.0.0.1:$RPORT"
req "$PORT_B" "$TMP/b.json" "$P1" || fail "B request"
CT=$(cached "$TMP/b.json")
[ "$(text "$TMP/b.json")" = "$COLD1" ] || fail "B output differs from cold (reused $CT)"
[ "$CT" = 192 ] || fail "B reused $CT tokens, want 192 (A's snapshot at 192 <= n-1 = 199)"
[ "$(stats "$PORT_B" "j['shared_cache']['hits']")" -ge 1 ] || fail "B shared hits"
[ "$(stats "$PORT_B" "j['shared_cache']['fetched_snapshots']")" = 1 ] || fail "B fetched_snapshots"
[ "$(stats "$PORT_A" "j['shared_cache']['published_snapshots']")" -ge 4 ] || fail "A published_snapshots"
ok "B reused $CT/200 tokens (blocks + A's state snapshot at 192); output identical to cold"
stop_srv B

srv B2 --shared-cache "redis://127.0.0.1:$RPORT"
req "$PORT_B2" "$TMP/b2.json" "$P2" || fail "B2 request"
CT=$(cached "$TMP/b2.json")
[ "$(text "$TMP/b2.json")" = "$COLD2" ] || fail "B2 output differs from cold (reused $CT)"
[ "$CT" = 200 ] || fail "B2 reused $CT tokens, want 200 (A's tail + prompt-end snapshot)"
ok "B2 reused $CT/224 tokens (A's tail + prompt-boundary snapshot); output identical to cold"
stop_srv B2

# corrupt every snapshot: refused, deleted, the prefix falls back to a shorter one or none
for k in $(rc --scan --pattern 'kvtier:v1:*:s:*'); do rc SETRANGE "$k" 4200 "garbage-garbage" >/dev/null; done
srv D --shared-cache "redis://127.0.0.1:$RPORT"
req "$PORT_D" "$TMP/d.json" "$P1" || fail "D request"
[ "$(text "$TMP/d.json")" = "$COLD1" ] || fail "D output differs after snapshot corruption"
[ "$(cached "$TMP/d.json")" = 0 ] || fail "D reused $(cached "$TMP/d.json") tokens with every snapshot corrupt"
[ "$(stats "$PORT_D" "j['shared_cache']['corrupt']")" -ge 1 ] || fail "snapshot corruption not counted"
ok "corrupt snapshots refused and counted; output identical to cold"
stop_srv D
stop_srv A
echo "shared_tier_recurrent: all ok"
