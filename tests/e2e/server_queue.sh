#!/usr/bin/env bash
# server_queue.sh — one queue (docs/server.md, "Threading"): the server hands every request straight
# to the engine's batching scheduler, so
#   - no thread exists per row: an idle server has as many threads with --parallel 16 as with 1;
#   - 8 requests on a --parallel 1 server (one generating, 7 waiting) add only their 8 connection
#     threads, and /stats reports one queue: requests.queued == batching.rows_queued == 7;
#   - clients that disconnect while queued leave the queue (their requests end cancelled, before
#     any lookup) and the server then holds nothing: queued, in flight and active rows all 0.
# Linux only (/proc/PID/task). Exit 77 when python3/curl are missing.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
[ -d /proc/self/task ] || { echo "skip: no /proc/PID/task"; exit 77; }

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type q8_0 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
COMMON=(--block-tokens 16 --ubatch 32 --threads 2 --ctx 2048)

threads() { ls "/proc/$SRV_PID/task" | wc -l; }
# the thread count once it has been the same for 1 s (start-up threads settle)
settled_threads() {
  local a b i
  a=$(threads)
  for i in $(seq 1 20); do
    sleep 0.5
    b=$(threads)
    [ "$a" = "$b" ] && { echo "$a"; return; }
    a=$b
  done
  echo "$a"
}

srv_start --parallel 1 "${COMMON[@]}"
T1=$(settled_threads)
srv_stop
srv_start --parallel 16 "${COMMON[@]}"
T16=$(settled_threads)
srv_stop
[ "$T1" = "$T16" ] || fail "idle threads: $T1 with --parallel 1 but $T16 with --parallel 16 (a thread per row?)"
ok "idle server: $T1 threads with --parallel 1 and with --parallel 16"

srv_start --parallel 1 "${COMMON[@]}"
T0=$(settled_threads)
cat >"$TMP/queue.py" <<'PY'
import json, socket, sys, time, http.client, os
port, pid, t0 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def stats():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/stats")
    j = json.loads(c.getresponse().read())
    c.close()
    return j
def send(i):
    # n = 16 long choices: the first request generates for a long while; streaming, never read
    b = {"prompt": f"request {i} about subject {i * 13}", "max_tokens": 1500, "temperature": 0, "stream": True,
         "n": 16 if i == 0 else 1}
    body = json.dumps(b).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s
socks = [send(0)]
time.sleep(0.3)  # the long one is admitted first
socks += [send(i) for i in range(1, 8)]
seen = None
t_end = time.time() + 30
while time.time() < t_end:
    j = stats()
    if j["requests"]["queued"] == 7:
        seen = j
        break
    time.sleep(0.05)
if seen is None:
    print("never saw 7 queued requests; last /stats requests:", json.dumps(j["requests"]), json.dumps(j["batching"]))
    sys.exit(1)
n_threads = len(os.listdir(f"/proc/{pid}/task"))
rq, bt = seen["requests"], seen["batching"]
print(f"queued={rq['queued']} in_flight={rq['in_flight']} rows_queued={bt['rows_queued']} "
      f"rows_active={bt['rows_active']} threads={n_threads} (idle {t0})")
bad = []
if bt["rows_queued"] != rq["queued"]: bad.append("rows_queued != requests.queued")
if bt["rows_active"] != 1 or rq["in_flight"] != 1: bad.append("not exactly one request generating")
# 8 connection threads (thread per connection) and at most the /stats one still closing
if n_threads > t0 + 9: bad.append(f"{n_threads - t0} threads more than idle for 8 requests")
for s in socks: s.close()  # every client goes away: the queued ones leave the queue
t_end = time.time() + 60
while time.time() < t_end:
    j = stats()
    rq, bt = j["requests"], j["batching"]
    if rq["queued"] == 0 and rq["in_flight"] == 0 and bt["rows_active"] == 0 and bt["rows_queued"] == 0: break
    time.sleep(0.1)
else:
    bad.append("requests still held 60 s after their clients left: " + json.dumps(rq))
if j["requests"]["cancelled"] < 8: bad.append(f"cancelled {j['requests']['cancelled']} < 8")
if bad:
    print("FAIL: " + "; ".join(bad))
    sys.exit(1)
PY
python3 "$TMP/queue.py" "$SRV_PORT" "$SRV_PID" "$T0" || fail "one queue (see above)"
ok "8 requests on --parallel 1: one queue, no thread per row; all left when their clients did"
# the server still serves and stops cleanly
expect 200 POST /v1/completions "$(jbody '{"prompt":"after","max_tokens":4,"temperature":0}')"
srv_stop
echo "PASS"
