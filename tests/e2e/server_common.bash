# server_common.bash — helpers sourced by the server_*.sh end-to-end tests (named .bash so the test
# runner, which runs tests/e2e/*.sh, does not pick it up). Every wait is bounded; the trap always kills the server.
#   srv_start ARGS...   start `kvtier serve -m $MODEL --port P ARGS` on a free random port
#                       (sets SRV_PID, SRV_PORT, SRV_URL; log in $TMP/server.N.log)
#   srv_stop [SIG]      send SIGTERM (or SIG), wait up to 60 s, fail unless the exit status is 0
#   http METHOD PATH [BODYFILE] [extra curl args...]  -> sets HTTP_CODE, body in $TMP/resp
#   jget EXPR           evaluate a Python expression over j = json.load($TMP/resp), print the result
[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-srv-XXXXXX")
SRV_PID=""
SRV_N=0
AUTH=()

srv_cleanup() {
  if [ -n "$SRV_PID" ] && kill -0 "$SRV_PID" 2>/dev/null; then kill -KILL "$SRV_PID" 2>/dev/null; fi
  jobs -p | xargs -r kill 2>/dev/null
  rm -rf "$TMP"
}
trap srv_cleanup EXIT

fail() {
  echo "FAIL: $*"
  [ -n "${SRV_LOG:-}" ] && [ -f "$SRV_LOG" ] && { echo "--- server log (tail)"; tail -25 "$SRV_LOG"; }
  [ -f "$TMP/resp" ] && { echo "--- last response"; head -c 2000 "$TMP/resp"; echo; }
  exit 1
}
ok() { echo "ok: $*"; }

# need TOOL...: exit 77 (skipped; scripts/run-tests fails it under CI=true) unless every tool is on PATH
need() {
  local t
  for t in "$@"; do command -v "$t" >/dev/null || { echo "skipped: missing dependency: $t (scripts/install-deps)"; exit 77; }; done
}
need_py() { need python3; }

srv_start() {
  local try
  for try in 1 2 3 4 5 6 7 8 9 10; do
    SRV_N=$((SRV_N + 1))
    SRV_PORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
    SRV_LOG=$TMP/server.$SRV_N.log
    "$KV" serve -m "$MODEL" --port "$SRV_PORT" "$@" >"$SRV_LOG" 2>&1 &
    SRV_PID=$!
    SRV_URL=http://127.0.0.1:$SRV_PORT
    local i
    for i in $(seq 1 300); do # up to 60 s for the model to load
      if ! kill -0 "$SRV_PID" 2>/dev/null; then break; fi
      if grep -q "^listening on" "$SRV_LOG" 2>/dev/null; then return 0; fi
      sleep 0.2
    done
    if kill -0 "$SRV_PID" 2>/dev/null; then fail "server did not become ready in 60 s"; fi
    wait "$SRV_PID" 2>/dev/null
    SRV_PID=""
    grep -q "cannot listen" "$SRV_LOG" 2>/dev/null || fail "server exited during start-up"
  done
  fail "no free port after 10 tries"
}

srv_stop() {
  local sig=${1:-TERM} i rc
  kill -"$sig" "$SRV_PID" 2>/dev/null || fail "server not running at stop"
  for i in $(seq 1 600); do
    kill -0 "$SRV_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$SRV_PID" 2>/dev/null && fail "server did not exit within 60 s of SIG$sig"
  wait "$SRV_PID"; rc=$?
  SRV_PID=""
  [ "$rc" -eq 0 ] || fail "server exited with status $rc after SIG$sig"
}

http() {
  local method=$1 path=$2 body=${3:-}
  shift 3 2>/dev/null || shift $#
  local args=(-s -o "$TMP/resp" -w '%{http_code}' --max-time 120 -X "$method" "${AUTH[@]}")
  if [ -n "$body" ]; then args+=(-H 'Content-Type: application/json' --data-binary "@$body"); fi
  HTTP_CODE=$(curl "${args[@]}" "$@" "$SRV_URL$path") || HTTP_CODE=000
}

# expect CODE METHOD PATH [BODYFILE]
expect() {
  local code=$1; shift
  http "$@"
  [ "$HTTP_CODE" = "$code" ] || fail "$1 $2: expected HTTP $code, got $HTTP_CODE"
}

jget() { python3 -c "import json,sys; j=json.load(open('$TMP/resp')); print($1)"; }
jbody() { printf '%s' "$1" >"$TMP/req.json"; echo "$TMP/req.json"; }
