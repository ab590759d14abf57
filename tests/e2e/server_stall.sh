#!/usr/bin/env bash
# server_stall.sh — body-stall lockout (issue 31, item 3) over loopback: 32 connections from
# 127.0.0.1 send complete headers with Content-Length: 100000 and then trickle the body, reconnecting
# whenever the server closes them, while 20 legitimate requests (/health and small completions, each
# on a fresh connection) must all succeed (docs/server.md, Limits: the minimum body rate and the
# eviction of the most overdue unfinished connection). Two attack speeds:
#   - 1 byte per connection every 0.2 s: below --body-min-rate, closed ~2 s after its headers;
#   - 400 bytes every 0.2 s (2 KB/s, above the minimum rate): only eviction lets clients in.
# Bounded: each attack runs at most ~25 s, every socket has a timeout, the trap kills the server.
# Exit 77 when python3/curl are missing.
set -u
. "$(dirname "$0")/server_common.bash"
need python3 curl
[ -x "$KV" ] || fail "$KV not built"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 --vocab data/vocab/ggml-vocab-gpt-2.gguf -o "$MODEL" \
  >/dev/null 2>&1 || fail "gen-model failed"

cat >"$TMP/stall.py" <<'EOF'
import json, socket, sys, threading, time
port, chunk = int(sys.argv[1]), int(sys.argv[2])
N, LEGIT = 32, 20
HDR = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Content-Length: 100000\r\n\r\n")
stop = threading.Event()
st = {"opened": 0, "closed_by_server": 0, "max_held": 0}

def attacker():
    conns = []
    t_end = time.time() + 25  # hard bound
    while not stop.is_set() and time.time() < t_end:
        while len(conns) < N:  # the attacker simply reconnects
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                s.sendall(HDR)
                s.setblocking(False)
                conns.append(s)
                st["opened"] += 1
            except OSError:
                break
        st["max_held"] = max(st["max_held"], len(conns))
        for s in list(conns):
            gone = False
            try:
                s.send(b" " * chunk)  # JSON whitespace: a valid body prefix, never complete
                try:
                    gone = s.recv(4096) is not None  # b"" = closed; data = the server answered
                except BlockingIOError:
                    pass
            except OSError:
                gone = True
            if gone:
                conns.remove(s)
                s.close()
                st["closed_by_server"] += 1
        time.sleep(0.2)
    for s in conns:
        s.close()

def request(method, path, body=None):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=15)
    except OSError:
        return 0
    try:
        data = body.encode() if body else b""
        hdr = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        if body:
            hdr += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        s.sendall(hdr.encode() + b"\r\n" + data)
        resp = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            resp += c
        line = resp.split(b"\r\n", 1)[0].decode(errors="replace")
        return int(line.split()[1]) if line.startswith("HTTP/") else 0
    except OSError:
        return 0
    finally:
        s.close()

t = threading.Thread(target=attacker)
t.start()
time.sleep(1.0)  # all 32 hold a body by now
held_at_start = st["max_held"]
codes = []
comp = json.dumps({"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0})
for i in range(LEGIT):
    codes.append(request("GET", "/health") if i % 2 == 0 else request("POST", "/v1/completions", comp))
    time.sleep(0.25)
stop.set()
t.join()
print(json.dumps({"ok": sum(c == 200 for c in codes), "codes": codes, "held_at_start": held_at_start,
                  "attack_opened": st["opened"], "attack_closed_by_server": st["closed_by_server"]}))
EOF

check() { # RESULT_JSON: 20/20 legitimate requests answered 200, the attack really ran
  python3 - "$1" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
assert r["held_at_start"] == 32, r  # the attack held all 32 bodies open
assert r["ok"] == 20, r
EOF
}

# ------------------------------------------------------------------ 5 bytes/s per connection
srv_start
R=$(python3 "$TMP/stall.py" "$SRV_PORT" 1) || fail "stall helper failed"
echo "stall at 5 B/s: $R"
check "$R" || fail "the body stall (5 B/s) locked legitimate clients out: $R"
expect 200 GET /stats
[ "$(jget "j['connections']['timed_out'] >= 32")" = True ] ||
  fail "stalled bodies were not closed for their rate: $(jget "j['connections']")"
ok "body stall at 5 B/s x 32: 20/20 legitimate requests answered, stalled bodies closed below the minimum rate"
srv_stop

# ------------------------------------------------------------------ 2 KB/s per connection (above the minimum rate)
srv_start
R=$(python3 "$TMP/stall.py" "$SRV_PORT" 400) || fail "stall helper failed"
echo "stall at 2 KB/s: $R"
check "$R" || fail "the body stall (2 KB/s) locked legitimate clients out: $R"
expect 200 GET /stats
[ "$(jget "j['connections']['evicted'] >= 1")" = True ] || fail "no eviction counted: $(jget "j['connections']")"
ok "body stall at 2 KB/s x 32: 20/20 legitimate requests answered by evicting the most overdue body"
srv_stop
echo "all body-stall tests passed"
