#!/usr/bin/env bash
# bench/memory_load.sh — RSS against --memory-budget over a long mixed load (issue 28, docs/tiers.md
# "Memory budget"). One server (MODEL, --memory-budget BUDGET, --ssd-cache, --parallel 2) under
# CLIENTS concurrent clients for DURATION seconds: each client loops over a mix of
#   - a distinct ~1,500-token completion (new KV that must be evicted, spilled, staged, written),
#   - a repeat of one of 8 long shared prefixes plus a new question (RAM/SSD reuse),
#   - a streamed chat of 3 turns that grows (the prompt-boundary reuse),
#   - every 20th request, POST /admin/cache/flush;
# while VmRSS/VmHWM of the server are sampled every 0.5 s. Writes OUT_DIR/memory_load.json: the
# budget and the stated margin, peak VmHWM, an RSS timeline (one point per 10 s), request counts by
# status and kind, /stats memory at the end. Exit 1 if the peak exceeds budget + margin or a request
# answers anything but 200 or a JSON 503.
#   MODEL (default: a generated smol-135m q8_0) BUDGET (default 700M) DURATION (1800, seconds) CLIENTS (3)
#   THREADS (2) OUT_DIR (bench/results) KVTIER (build/kvtier)
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
BUDGET=${BUDGET:-700M}
DURATION=${DURATION:-1800}
CLIENTS=${CLIENTS:-3}
THREADS=${THREADS:-2}
OUT_DIR=${OUT_DIR:-bench/results}
W=$(mktemp -d /tmp/kvtier-memload.XXXXXX)
mkdir -p "$OUT_DIR"
MODEL=${MODEL:-$W/smol.gguf}
[ -f "$MODEL" ] || KVT_VOCAB_DIR=${KVT_VOCAB_DIR:-$PWD/data/vocab} "$KVTIER" gen-model --shape smol-135m --type q8_0 -o "$MODEL" >/dev/null
PORT=$((30000 + RANDOM % 20000))
"$KVTIER" serve -m "$MODEL" --port "$PORT" -t "$THREADS" -c 4096 --parallel 2 --memory-budget "$BUDGET" \
  --ssd-cache "$W/ssd" >"$W/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 1 600); do grep -q "listening on" "$W/server.log" && break; sleep 0.1; done
grep -q "listening on" "$W/server.log" || { cat "$W/server.log"; exit 1; }
grep -o "memory budget.*" "$W/server.log" >&2
python3 - "http://127.0.0.1:$PORT" "$PID" "$DURATION" "$CLIENTS" "$BUDGET" "$OUT_DIR/memory_load.json" "$(git rev-parse --short HEAD)" <<'EOF'
import json, random, re, sys, threading, time, urllib.request, urllib.error
url, pid, dur, nclients, budget_s, out, rev = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
t0 = time.time()
stop = t0 + dur
lock = threading.Lock()
codes, bad, kinds = {}, [], {}
peak = {"hwm": 0, "rss": 0}
timeline = []
words = lambda rnd, n: " ".join("w%d" % rnd.randint(0, 99999) for _ in range(n))
prefixes = [words(random.Random(1000 + i), 1200) for i in range(8)]

def post(path, body, timeout=600):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else b"",
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()

def note(kind, st, body):
    with lock:
        codes[st] = codes.get(st, 0) + 1
        kinds[kind] = kinds.get(kind, 0) + 1
        if st != 200:
            try:
                ok = st == 503 and "error" in json.loads(body)
            except Exception:
                ok = False
            if not ok:
                bad.append("%s %d %r" % (kind, st, body[:200]))

def client(cid):
    rnd = random.Random(cid)
    n = 0
    while time.time() < stop:
        n += 1
        k = n % 3
        if n % 20 == 0:
            st, body = post("/admin/cache/flush", None)
            note("flush", st, body)
        elif k == 0:
            st, body = post("/v1/completions", {"prompt": "c%d n%d " % (cid, n) + words(rnd, 1000), "max_tokens": 8, "temperature": 0})
            note("distinct", st, body)
        elif k == 1:
            p = prefixes[rnd.randrange(len(prefixes))]
            st, body = post("/v1/completions", {"prompt": p + " question " + words(rnd, 20), "max_tokens": 8, "temperature": 0})
            note("shared_prefix", st, body)
        else:
            msgs = [{"role": "user", "content": words(rnd, 300)}]
            for turn in range(3):
                st, body = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "stream": True, "temperature": 0.7})
                note("chat_stream", st, body)
                if st != 200:
                    break
                text = "".join(json.loads(l[6:])["choices"][0]["delta"].get("content", "") or ""
                               for l in body.decode().splitlines() if l.startswith("data: {") and '"choices":[{' in l)
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": words(rnd, 100)}]

def sampler():
    last = 0
    while time.time() < stop + 5:
        try:
            vals = {}
            for line in open("/proc/%s/status" % pid):
                k, v = line.split(":", 1)
                if k in ("VmHWM", "VmRSS"):
                    vals[k] = int(v.split()[0]) * 1024
            peak["hwm"] = max(peak["hwm"], vals.get("VmHWM", 0))
            peak["rss"] = max(peak["rss"], vals.get("VmRSS", 0))
            if time.time() - last >= 10:
                last = time.time()
                timeline.append([round(last - t0), vals.get("VmRSS", 0)])
        except (OSError, ValueError):
            pass
        time.sleep(0.5)

ts = [threading.Thread(target=client, args=(i,)) for i in range(nclients)] + [threading.Thread(target=sampler)]
for t in ts: t.start()
for t in ts: t.join()
stats = json.loads(urllib.request.urlopen(url + "/stats", timeout=60).read())
m = stats.get("memory", {})
budget = m.get("budget_bytes", 0)
margin = max(budget // 10, 256 << 20)
res = {"rev": rev, "seconds": dur, "clients": nclients, "budget_arg": budget_s, "budget_bytes": budget,
       "margin_bytes": margin, "peak_hwm_bytes": peak["hwm"], "peak_rss_bytes": peak["rss"],
       "within": peak["hwm"] <= budget + margin, "codes": codes, "kinds": kinds, "bad": bad[:20],
       "memory": m, "ssd_shed": stats.get("ssd_cache", {}).get("shed"),
       "load": open("/proc/loadavg").read().split()[:3], "rss_timeline": timeline}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: res[k] for k in ("budget_bytes", "margin_bytes", "peak_hwm_bytes", "within", "codes", "kinds", "ssd_shed")}))
sys.exit(0 if res["within"] and not bad else 1)
EOF
