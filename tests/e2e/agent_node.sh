#!/usr/bin/env bash
# agent_node.sh — a 10-round agent tool loop through the official `openai` npm client
# (tests/e2e/node/agent_tool_loop.js) against `kvtier serve` with real chat templates (Qwen3 and
# Llama 3.1 from tests/fixtures/templates, served with --chat-template-file) on generated models:
# tool_choice "required" gives schema-valid arguments every round, the application answers with
# role "tool", cached_tokens grows with the conversation, the server restarts after round 5 and the
# next round reuses the prefix from the SSD tier, and streamed calls equal the non-streamed ones.
# Without node/npm or the package it exits 77 (skipped; a failure under CI=true).
set -u
. "$(dirname "$0")/server_common.bash"
NODE_DIR=$(cd "$(dirname "$0")/node" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
need node npm
[ -x "$KV" ] || fail "$KV not built"
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  (cd "$NODE_DIR" && timeout 180 npm install --no-audit --no-fund --silent --no-package-lock >/dev/null 2>"$TMP/npm.err") \
    || { echo "skipped: missing dependency: npm package openai (npm install failed; scripts/install-deps)"; tail -5 "$TMP/npm.err"; exit 77; }
fi

run_loop() { # run_loop ARCH TEMPLATE
  local arch=$1 tmpl=$ROOT/tests/fixtures/templates/$2
  MODEL=$TMP/$arch.gguf
  "$KV" gen-model --arch "$arch" --shape tiny --peaked -o "$MODEL" >/dev/null 2>&1 || fail "gen-model $arch"
  local state=$TMP/$arch.state.json ssd=$TMP/$arch.ssd
  srv_start --chat-template-file "$tmpl" --ssd-cache "$ssd" --ctx 4096
  timeout 600 node "$NODE_DIR/agent_tool_loop.js" "$SRV_URL/v1" "$state" 1 5 || fail "$2: rounds 1-5"
  expect 200 POST /admin/cache/flush
  [ "$(jget "j['durable']")" = True ] || fail "flush not durable: $(cat "$TMP/resp")"
  srv_stop TERM
  srv_start --chat-template-file "$tmpl" --ssd-cache "$ssd" --ctx 4096
  timeout 600 node "$NODE_DIR/agent_tool_loop.js" "$SRV_URL/v1" "$state" 6 10 || fail "$2: rounds 6-10 after the restart"
  expect 200 GET /stats
  [ "$(jget "j['ssd_cache']['restores'] > 0")" = True ] || fail "$2: no SSD restore after the restart: $(cat "$TMP/resp")"
  srv_stop TERM
  ok "$2: 10 rounds, restart after round 5 reused the prefix from SSD"
}

run_loop qwen3 Qwen-Qwen3-0.6B.jinja
run_loop llama meta-llama-Llama-3.1-8B-Instruct.jinja
echo "PASS agent_node"
