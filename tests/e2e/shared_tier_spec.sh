#!/usr/bin/env bash
# shared_tier_spec.sh — the draft's state in the shared tier (issue 29, docs/speculative.md "The
# draft's state in the tiers"): one redis-server, the trained pair (data/models), servers without an
# SSD tier so that only Redis can carry state between them.
#   - A (with the draft) answers a prompt; POST /admin/cache/flush?wait=shared waits for the target's
#     and the draft's publishes;
#   - B (a fresh server, the same draft) fetches both: the draft's state comes from the shared tier
#     (draft_state.reused_shared_tokens = the target's cached tokens, nothing recomputed), and the
#     answer equals A's;
#   - C (another draft file) reuses the target's blocks from Redis but none of the draft's: it
#     recomputes the draft and counts it.
set -u
TMP_TAG=shared-spec
. "$(dirname "$0")/shared_common.bash"
need_cmds python3 curl redis-server redis-cli
cd "$(dirname "$0")/../.."
MODEL=data/models/kjv-target-q8_0.gguf
DRAFT=data/models/kjv-draft-q8_0.gguf
OTHER=data/models/kjv-draft-f16.gguf

stop_srv() { local pid; eval "pid=\$PID_$1"; kill -TERM "$pid"; for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; kill -0 "$pid" 2>/dev/null && fail "$1 did not stop"; }
srv() { # srv NAME DRAFT
  srv_named "$1" -m "$MODEL" --draft-model "$2" --draft-max 4 --draft-p-min 0 --threads 2 --block-tokens 32 \
    --shared-cache "redis://127.0.0.1:$RPORT"
}
python3 -c 'import json; json.dump({"prompt": open("data/models/heldout.txt").read()[:1100], "max_tokens": 24, "temperature": 0}, open("'"$TMP"'/req.json", "w"))'
req() { curl -s --max-time 120 -o "$2" -X POST -H 'Content-Type: application/json' --data-binary @"$TMP/req.json" "http://127.0.0.1:$1/v1/completions"; }
field() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }
stats() { curl -s --max-time 10 "http://127.0.0.1:$1/stats" >"$TMP/stats.json"; field "$TMP/stats.json" "$2"; }
DS="j['speculative']['draft_state']"

redis_start --maxmemory 0
srv A "$DRAFT"
req "$PORT_A" "$TMP/a.json" || fail "request to A"
curl -s --max-time 30 -o "$TMP/flush.json" -X POST "http://127.0.0.1:$PORT_A/admin/cache/flush?wait=shared"
[ "$(field "$TMP/flush.json" "j['shared']['pending']")" = 0 ] || fail "publishes still pending after flush?wait=shared: $(cat "$TMP/flush.json")"
stop_srv A

srv B "$DRAFT"
req "$PORT_B" "$TMP/b.json" || fail "request to B"
[ "$(field "$TMP/a.json" "j['choices'][0]['text']")" = "$(field "$TMP/b.json" "j['choices'][0]['text']")" ] || fail "B's answer differs from A's"
cached=$(field "$TMP/b.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$cached" -gt 0 ] || fail "B reused nothing of the target from the shared tier"
[ "$(stats "$PORT_B" "$DS['reused_shared_tokens'] == $cached and $DS['recomputed_tokens'] == 0")" = True ] ||
  fail "B: the draft's state did not come from the shared tier ($cached target tokens): $(stats "$PORT_B" "$DS")"
stop_srv B
ok "the draft's state through the shared tier: $cached tokens fetched, no draft recompute, the same answer"

srv C "$OTHER"
req "$PORT_C" "$TMP/c.json" || fail "request to C"
[ "$(field "$TMP/c.json" "j['usage']['prompt_tokens_details']['cached_tokens']")" = "$cached" ] || fail "C lost the target's reuse"
[ "$(stats "$PORT_C" "$DS['reused_shared_tokens'] == 0 and $DS['recomputed_tokens'] == $cached")" = True ] ||
  fail "C (another draft) read the first draft's state or did not count the recompute: $(stats "$PORT_C" "$DS")"
stop_srv C
ok "another draft on the same Redis: target reused, draft recomputed and counted"
