#!/usr/bin/env bash
# server_batching.sh — continuous batching end to end (docs/batching.md): 16 concurrent clients
# (distinct prompts, shared-prefix prompts, streaming and not, two disconnecting mid-stream) against
# `kvtier serve --parallel 4`; every completed answer equals the same request served alone by a
# `--parallel 1` server; a shared-prefix request sent while its donor still streams reports
# cached_tokens from the donor's sealed blocks; afterwards no row holds KV (pool bytes == RAM-tier
# bytes) and /stats, /metrics show the batching figures.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type q8_0 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
COMMON=(--block-tokens 16 --ubatch 32 --threads 2 --ctx 1024)

cat >"$TMP/clients.py" <<'PY'
import json, sys, threading, http.client, time
port, mode, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
SYS = "You are the shared system prompt of a team of agents. " * 6
def body(i):
    if i % 3 == 1:
        prompt = SYS + f"Agent {i} asks about topic number {i * 7}."
    else:
        prompt = f"Request {i}: a distinct prompt about subject {i * 13} and nothing else. " * (1 + i % 4)
    return {"prompt": prompt, "max_tokens": 12 + (i % 5) * 4, "temperature": 0, "stream": i % 2 == 0,
            "stream_options": {"include_usage": True} if i % 2 == 0 else None}
CANCEL = {6, 10}
def run(i, res):
    b = body(i)
    if b["stream_options"] is None: del b["stream_options"]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        res[i] = {"status": r.status, "body": r.read().decode()}
        return
    if not b["stream"]:
        j = json.loads(r.read())
        res[i] = {"status": 200, "text": j["choices"][0]["text"], "usage": j["usage"]}
        return
    text, usage, chunks = "", None, 0
    while True:
        line = r.readline()
        if not line: break
        line = line.strip()
        if not line.startswith(b"data: "): continue
        d = line[6:]
        if d == b"[DONE]": break
        j = json.loads(d)
        if j.get("usage"): usage = j["usage"]
        for ch in j.get("choices", []):
            text += ch.get("text") or ""
        chunks += 1
        if mode == "batch" and i in CANCEL and chunks >= 3:
            c.sock.close()  # client disconnects mid-stream
            res[i] = {"status": 200, "cancelled": True, "text": text}
            return
    res[i] = {"status": 200, "text": text, "usage": usage}
res = {}
if mode == "alone":
    for i in range(16): run(i, res)
else:
    ts = [threading.Thread(target=run, args=(i, res)) for i in range(16)]
    for t in ts: t.start()
    for t in ts: t.join()
json.dump(res, open(out, "w"))
PY

# ------------------------------------------------------------------ reference: each request alone
srv_start --parallel 1 --prompt-cache 0 "${COMMON[@]}"
python3 "$TMP/clients.py" "$SRV_PORT" alone "$TMP/alone.json" || fail "alone clients"
expect 200 GET /stats
[ "$(jget "j['batching']['parallel']")" = 1 ] || fail "--parallel 1 not reported"
srv_stop

# ------------------------------------------------------------------ 16 concurrent clients, 4 rows
srv_start --parallel 4 "${COMMON[@]}"
python3 "$TMP/clients.py" "$SRV_PORT" batch "$TMP/batch.json" || fail "batch clients"
python3 - "$TMP/alone.json" "$TMP/batch.json" <<'EOF' || fail "batched answers differ from the requests alone"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert len(a) == 16 and len(b) == 16, (len(a), len(b))
for k in a:
    assert a[k]["status"] == 200 and b[k]["status"] == 200, (k, a[k], b[k])
    if b[k].get("cancelled"):
        assert a[k]["text"].startswith(b[k]["text"]), (k, a[k]["text"], b[k]["text"])
    else:
        assert a[k]["text"] == b[k]["text"], (k, a[k]["text"], b[k]["text"])
        assert a[k]["usage"]["completion_tokens"] == b[k]["usage"]["completion_tokens"], k
print("16 answers identical (2 cancelled mid-stream are prefixes)")
EOF
ok "16 concurrent clients (distinct, shared-prefix, streaming or not, 2 disconnecting) == each alone"

# ------------------------------------------------------------------ shared prefix from an in-flight donor
LONG="$(printf 'System rule %s: agents cooperate and share their context. ' $(seq 1 30))"
python3 - "$SRV_PORT" "$LONG" <<'EOF' || fail "in-flight prefix sharing"
import json, sys, http.client
port, long = int(sys.argv[1]), sys.argv[2]
def req(prompt, n, stream):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    b = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream}
    c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    return c, c.getresponse()
dc, donor = req(long + " Donor task.", 600, True)
first = donor.readline()  # first SSE event: the donor's prefill is done
assert first.startswith(b"data: "), first
c2, r2 = req(long + " Second agent, another task.", 4, False)
j = json.loads(r2.read())
cached, prompt = j["usage"]["prompt_tokens_details"]["cached_tokens"], j["usage"]["prompt_tokens"]
rest = donor.read().decode()  # the donor was still streaming: it ends only now
assert "[DONE]" in rest, rest[-300:]
n_donor = rest.count('"text"')
assert n_donor > 4, n_donor  # the donor produced more after the second request was answered
assert cached >= prompt // 2, (cached, prompt)
print(f"second agent reused {cached} of {prompt} prompt tokens from the running donor")
EOF
ok "a shared-prefix request reuses the blocks of a donor still streaming"

# ------------------------------------------------------------------ nothing leaks; stats
for i in $(seq 1 100); do
  expect 200 GET /stats
  [ "$(jget "j['batching']['rows_active'] == 0 and j['requests']['in_flight'] == 0")" = True ] && break
  sleep 0.1
done
[ "$(jget "j['batching']['rows_active'], j['batching']['rows_queued']")" = "0 0" ] || fail "rows still active"
[ "$(jget "j['kv']['pool_used_bytes'] == j['prompt_cache']['bytes']")" = True ] || fail "pool holds more than the RAM tier: $(jget "j['kv'], j['prompt_cache']['bytes']")"
[ "$(jget "j['batching']['parallel'] == 4 and j['batching']['steps'] > 0 and j['batching']['tokens_per_step_avg'] > 1")" = True ] \
  || fail "batching stats: $(jget "j['batching']")"
[ "$(jget "j['batching']['max_decode_stall_ms'] >= 0 and j['batching']['decode_tokens_per_s_1m'] > 0")" = True ] || fail "batching rates"
expect 200 GET /metrics
grep -q '^kvtier_batch_rows_active 0$' "$TMP/resp" || fail "/metrics batch_rows_active"
grep -q '^# TYPE kvtier_batch_steps_total counter$' "$TMP/resp" || fail "/metrics batch_steps_total"
grep -q '^kvtier_batch_max_decode_stall_ms ' "$TMP/resp" || fail "/metrics stall"
ok "pool back to the RAM tier's bytes; /stats and /metrics report batching"
srv_stop
echo "server_batching: all ok"
