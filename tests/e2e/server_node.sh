#!/usr/bin/env bash
# server_node.sh — runs tests/e2e/node/*.mjs (the official `openai` npm client) against
# `kvtier serve`. Installs the package with npm into tests/e2e/node/node_modules (gitignored) the
# first time; without node/npm or the package it exits 77 (skipped; a failure under CI=true).
set -u
. "$(dirname "$0")/server_common.bash"
NODE_DIR=$(cd "$(dirname "$0")/node" && pwd)
need node npm
[ -x "$KV" ] || fail "$KV not built"
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  (cd "$NODE_DIR" && timeout 180 npm install --no-audit --no-fund --silent --no-package-lock >/dev/null 2>"$TMP/npm.err") \
    || { echo "skipped: missing dependency: npm package openai (npm install failed; scripts/install-deps)"; tail -5 "$TMP/npm.err"; exit 77; }
fi

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
srv_start --api-key node-key
for t in "$NODE_DIR"/*.mjs; do
  timeout 300 node "$t" "$SRV_URL/v1" node-key || fail "$(basename "$t")"
done
srv_stop TERM
echo "PASS server_node"
