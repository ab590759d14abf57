# shared_common.bash — sourced by the shared-tier e2e scripts (shared_tier*.sh): a temp dir and a
# trap that kills every process they started, fail/ok, random loopback ports, one redis-server and
# kvtier servers by name. Set TMP_TAG before sourcing (names the temp dir); KEEP=1 keeps it.
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

rport() { echo $((20000 + (RANDOM * 32768 + RANDOM) % 20000)); }
RPORT=$(rport)
RDIR=$TMP/redis
mkdir -p "$RDIR"
rc() { redis-cli -p "$RPORT" "$@"; }
# redis_wait NAME: waits for the redis-server just started (REDIS_PID) to answer; 0 ready, 1 it
# exited because RPORT was taken (only the first start may then move to another port: later
# starts are restarts that servers already know the port of), fails otherwise.
redis_wait() {
  local i
  for i in $(seq 1 100); do
    rc ping 2>/dev/null | grep -q PONG && { RPORT_FIXED=1; return 0; }
    if ! kill -0 "$REDIS_PID" 2>/dev/null; then
      [ -z "${RPORT_FIXED:-}" ] && grep -q "Address already in use" "$TMP/redis.log" && return 1
      fail "$1 exited at start"
    fi
    sleep 0.1
  done
  fail "redis-server not ready in 10 s"
}
# redis_launch [redis-server args...]: execs a loopback redis-server on RPORT, no persistence
# (exec: started with &, the subshell becomes redis-server, so REDIS_PID is the server's and
# kill -STOP / -KILL reach it). A test may replace it, e.g. with a TLS-only server; REDIS_WHAT names it.
redis_launch() {
  exec redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$RDIR" --save '' --appendonly no \
    --protected-mode yes --daemonize no "$@"
}
REDIS_WHAT=redis-server
# redis_start [redis-server args...]: redis_launch in the background, ready (the first start picks
# another random port while the one drawn is taken)
redis_start() {
  local try
  for try in 1 2 3 4 5; do
    redis_launch "$@" >"$TMP/redis.log" 2>&1 &
    REDIS_PID=$!
    redis_wait "$REDIS_WHAT" && return 0
    RPORT=$(rport)
  done
  fail "no free port for redis-server"
}
redis_kill() { kill -KILL "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=""; }

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
