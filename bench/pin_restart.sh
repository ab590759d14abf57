#!/usr/bin/env bash
# bench/pin_restart.sh — what a pin buys right after a restart (issue 28, docs/server.md "Pinned
# prefixes"): one server (MODEL, --ssd-cache) computes two P-token prompts (token ids): A pinned
# (POST /v1/cache/pin), B as an ordinary completion; a drain makes both durable; the server is
# restarted, waits until GET /v1/cache/pins says A is warm (prefetched from the SSD tier into RAM),
# then asks A + Q new tokens and B + Q new tokens: the TTFT of each (A from RAM, B restored from the
# SSD tier), R rounds (a restart each; medians). Writes OUT_DIR/pin_restart.json.
#   MODEL (default: a generated smol-135m q8_0) P (7000) Q (16) R (3) THREADS (2) OUT_DIR KVTIER
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
P=${P:-7000}
Q=${Q:-16}
R=${R:-3}
THREADS=${THREADS:-2}
OUT_DIR=${OUT_DIR:-bench/results}
W=$(mktemp -d /tmp/kvtier-pin.XXXXXX)
mkdir -p "$OUT_DIR"
MODEL=${MODEL:-$W/smol.gguf}
[ -f "$MODEL" ] || KVT_VOCAB_DIR=${KVT_VOCAB_DIR:-$PWD/data/vocab} "$KVTIER" gen-model --shape smol-135m --type q8_0 -o "$MODEL" >/dev/null
PORT=$((30000 + RANDOM % 20000))
PID=
start() {
  "$KVTIER" serve -m "$MODEL" --port "$PORT" -t "$THREADS" -c $((P + Q + 64)) --ssd-cache "$W/ssd" >"$W/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do grep -q "listening on" "$W/server.log" && return 0; sleep 0.1; done
  cat "$W/server.log"; exit 1
}
stop() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; }
trap 'stop; rm -rf "$W"' EXIT
start
python3 - "http://127.0.0.1:$PORT" "$P" "$Q" "$W" <<'EOF'
import json, sys, urllib.request
url, p, q, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ids = lambda s, n: [10 + (i * 7919 + s * 104729) % 40000 for i in range(n)]
a, b = ids(1, p), ids(2, p)
json.dump({"a": a, "b": b}, open(w + "/prompts.json", "w"))
def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())
print("pin A:", {k: v for k, v in post("/v1/cache/pin", {"prompt": a}).items() if k in ("tokens", "bytes", "warm")}, file=sys.stderr)
r = post("/v1/completions", {"prompt": b, "max_tokens": 1, "temperature": 0})
print("B computed:", r["usage"]["prompt_tokens"], "tokens", file=sys.stderr)
print("drain:", post("/admin/drain", {}).get("durable"), file=sys.stderr)
EOF
stop
: > "$W/runs.jsonl"
for round in $(seq 1 "$R"); do
  start
  python3 - "http://127.0.0.1:$PORT" "$Q" "$W" "$round" >>"$W/runs.jsonl" <<'EOF'
import json, sys, time, urllib.request
url, q, w, rnd = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
pr = json.load(open(w + "/prompts.json"))
t0 = time.time()
while True:  # the pin is warmed in the background after the restart
    pins = json.loads(urllib.request.urlopen(url + "/v1/cache/pins", timeout=60).read())["data"]
    if pins and pins[0].get("warm"):
        break
    if time.time() - t0 > 600:
        sys.exit("the pin did not warm within 600 s")
    time.sleep(0.05)
warm_s = time.time() - t0
def ask(p, salt):
    body = {"prompt": p + [20 + (salt * 31 + k) % 1000 for k in range(q)], "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    r = json.loads(urllib.request.urlopen(req, timeout=3600).read())
    return {"ttft_ms": r["kvtier"]["ttft_ms"], "cached": r["kvtier"]["cached_tokens"], "from": r["kvtier"]["reused_from"]}
a = ask(pr["a"], rnd)
b = ask(pr["b"], rnd)
print(json.dumps({"round": rnd, "warm_after_s": round(warm_s, 2), "pinned": a, "unpinned": b,
                  "load": open("/proc/loadavg").read().split()[0]}))
EOF
  stop
  tail -1 "$W/runs.jsonl" >&2
done
python3 - "$W/runs.jsonl" "$P" "$Q" "$OUT_DIR/pin_restart.json" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda k: statistics.median(r[k]["ttft_ms"] for r in runs)
res = {"p": int(sys.argv[2]), "q": int(sys.argv[3]), "pinned_ttft_ms_median": med("pinned"),
       "unpinned_ttft_ms_median": med("unpinned"), "warm_after_s_median": statistics.median(r["warm_after_s"] for r in runs),
       "runs": runs}
res["unpinned_over_pinned"] = res["unpinned_ttft_ms_median"] / res["pinned_ttft_ms_median"]
json.dump(res, open(sys.argv[4], "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k != "runs"}))
EOF
