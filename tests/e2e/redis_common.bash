# redis_common.bash — one loopback redis-server for an e2e script, sourced by shared_common.bash
# and namespaces.sh. Needs TMP (a temp dir the script removes) and fail; defines rport (a random
# loopback port), RPORT, RDIR and the helpers below. Every wait is bounded.
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
