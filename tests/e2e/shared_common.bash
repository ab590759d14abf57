# shared_common.bash — sourced by the shared-tier e2e scripts (shared_tier*.sh): a temp dir and a
# trap that kills every process they started, fail/ok, random loopback ports, one redis-server
# (redis_common.bash) and kvtier servers by name. Set TMP_TAG before sourcing (names the temp dir); KEEP=1 keeps it.
# Every wait is bounded.
BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-${TMP_TAG:-shared}-XXXXXX")
PIDS=()
REDIS_PID=""
cleanup() {
  for p in "${PIDS[@]}" $REDIS_PID; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f (tail)"; tail -15 "$f"; }; done
  exit 1
}
ok() { echo "ok: $*"; }
[ -x "$KV" ] || fail "$KV not built"
# install-deps installs every one of these: an absence is a failure, not a skip
need_cmds() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null || fail "$c missing (scripts/install-deps installs it)"; done
}

. "$(dirname "${BASH_SOURCE[0]}")/redis_common.bash" # rport, RPORT, redis_start, ...

# srv_named NAME ARGS...: `kvtier serve --port P ARGS...` on a free random port, logging to
# $TMP/NAME.log; sets PORT_<NAME> and PID_<NAME>. The log is emptied before the start, so a
# restarted server's old "listening on" line is never taken for the new one's.
srv_named() {
  local name=$1 try port i pid
  shift
  for try in 1 2 3 4 5; do
    port=$(rport)
    : >"$TMP/$name.log"
    "$KV" serve --port "$port" "$@" >"$TMP/$name.log" 2>&1 &
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
