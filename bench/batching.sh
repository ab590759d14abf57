#!/usr/bin/env bash
# bench/batching.sh — continuous batching (docs/batching.md), side by side in one run: for each
# --parallel value (BATCH_PAR, default "1 4 8") a fresh `kvtier serve` gets BATCH_CLIENTS (8)
# simultaneous streaming /v1/completions requests with distinct ~BATCH_P-token (200) prompts and
# BATCH_N (64) new tokens each, greedy (BATCH_TEMP: another temperature, e.g. 1, the server's
# default, to time the sampled draw). Reports aggregate generated tok/s (all tokens / wall time
# from the first request to the last [DONE], so the prompts' prefill is inside it), the decode-phase
# aggregate (tokens after each stream's first token / time from the earliest first token to the
# last [DONE]), median and max time to first token, and the server's
# /stats batching figures (tokens per step, max decode stall). With BATCH_LONG=1 also: TTFT of a
# 100-token request sent while a BATCH_LONG_P-token (7000) prefill runs, vs the same request alone.
# Writes $OUT_DIR/batching.json and prints a table.
# Also: aggregate tok/s of BATCH_STREAMS ("1 4 8") concurrent streams on one --parallel 8 server.
# Env: KVTIER, MODEL, THREADS, BATCH_PAR, BATCH_STREAMS, BATCH_CLIENTS, BATCH_P, BATCH_N, BATCH_TEMP, BATCH_LONG,
# BATCH_LONG_P, OUT_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
THREADS=${THREADS:-2}
BATCH_PAR=${BATCH_PAR:-"1 4 8"}
BATCH_CLIENTS=${BATCH_CLIENTS:-8}
BATCH_P=${BATCH_P:-200}
BATCH_N=${BATCH_N:-64}
export BATCH_TEMP=${BATCH_TEMP:-0}
BATCH_LONG=${BATCH_LONG:-0}
BATCH_LONG_P=${BATCH_LONG_P:-7000}
OUT_DIR=${OUT_DIR:-bench/results}
mkdir -p "$OUT_DIR"
[ -f "$MODEL" ] || "$KVTIER" gen-model --shape smol-135m --type q8_0 -o "$MODEL" >/dev/null
WORK=$(mktemp -d /tmp/kvtier-batch-bench.XXXXXX)
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$WORK"' EXIT

start() { # start PAR CTX: a server on a free port (sets PORT, SRV)
  for _ in 1 2 3 4 5; do
    PORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
    "$KVTIER" serve -m "$MODEL" --port "$PORT" --threads "$THREADS" --parallel "$1" --ctx "$2" >"$WORK/srv.$1.log" 2>&1 &
    SRV=$!
    for _ in $(seq 1 600); do
      grep -q '^listening on' "$WORK/srv.$1.log" 2>/dev/null && return 0
      kill -0 $SRV 2>/dev/null || break
      sleep 0.1
    done
    kill $SRV 2>/dev/null || true; wait $SRV 2>/dev/null || true; SRV=""
  done
  echo "server did not start" >&2; exit 1
}
stop() { kill $SRV; wait $SRV 2>/dev/null || true; SRV=""; }

cat >"$WORK/client.py" <<'PY'
import json, os, sys, threading, time, http.client, statistics, urllib.request
port, mode = int(sys.argv[1]), sys.argv[2]
def words(seed, n):  # ~n tokens of distinct text (GPT-2 vocabulary: "w1234" ~ 3 tokens)
    return " ".join(f"w{(seed * 7919 + k * 104729) % 9973}" for k in range(n // 3))
def stream(prompt, n, out, t_start):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    b = {"prompt": prompt, "max_tokens": n, "temperature": float(os.environ["BATCH_TEMP"]), "stream": True, "stream_options": {"include_usage": True}}
    c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, usage = None, None
    while True:
        line = r.readline()
        if not line: break
        line = line.strip()
        if not line.startswith(b"data: "): continue
        d = line[6:]
        if d == b"[DONE]": break
        j = json.loads(d)
        if j.get("usage"): usage = j["usage"]
        if ttft is None and any(ch.get("text") for ch in j.get("choices", [])): ttft = time.time() - t_start
    out.update(ttft=ttft, end=time.time() - t_start, usage=usage)
def decode_tps(outs):  # tokens after each stream's first / (last [DONE] - earliest first token)
    t1 = min(o["ttft"] for o in outs if o["ttft"] is not None)
    t2 = max(o["end"] for o in outs)
    n = sum(o["usage"]["completion_tokens"] - 1 for o in outs)
    return n / (t2 - t1) if t2 > t1 else 0.0
def stats():
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats"))["batching"]
if mode == "clients":
    nc, p, n = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    base = int(sys.argv[6]) if len(sys.argv) > 6 else 0  # distinct prompts per run on one server
    outs = [dict() for _ in range(nc)]
    t0 = time.time()
    ts = [threading.Thread(target=stream, args=(words(base + i + 1, p), n, outs[i], t0)) for i in range(nc)]
    for t in ts: t.start()
    for t in ts: t.join()
    wall = max(o["end"] for o in outs)
    gen = sum(o["usage"]["completion_tokens"] for o in outs)
    ttfts = [o["ttft"] for o in outs if o["ttft"] is not None]
    st = stats()
    print(json.dumps({"clients": nc, "prompt_tokens": [o["usage"]["prompt_tokens"] for o in outs], "generated": gen,
                      "wall_s": wall, "agg_tps": gen / wall, "decode_tps": decode_tps(outs), "ttft_median_s": statistics.median(ttfts),
                      "ttft_max_s": max(ttfts), "tokens_per_step_avg": st["tokens_per_step_avg"],
                      "max_decode_stall_ms": st["max_decode_stall_ms"], "max_decode_step_ms": st["max_decode_step_ms"]}))
else:  # long: a short request alone, then the same one while a long prefill runs
    lp = int(sys.argv[3])
    short = words(424242, 100)
    alone = {}
    stream(short, 1, alone, time.time())
    long_out, short_out = {}, {}
    t0 = time.time()
    lt = threading.Thread(target=stream, args=(words(777, lp), 1, long_out, t0))
    lt.start()
    time.sleep(1.0)  # the long prefill is under way
    t1 = time.time()
    stream(words(424243, 100), 1, short_out, t1)
    lt.join()
    print(json.dumps({"long_prompt_tokens": long_out["usage"]["prompt_tokens"], "short_alone_ttft_s": alone["ttft"],
                      "short_beside_long_ttft_s": short_out["ttft"], "long_ttft_s": long_out["ttft"],
                      "max_decode_stall_ms": stats()["max_decode_stall_ms"]}))
PY

echo "{" >"$OUT_DIR/batching.json"
first=1
for par in $BATCH_PAR; do
  start "$par" 2048
  res=$(python3 "$WORK/client.py" "$PORT" clients "$BATCH_CLIENTS" "$BATCH_P" "$BATCH_N")
  stop
  [ $first -eq 1 ] || echo "," >>"$OUT_DIR/batching.json"
  first=0
  printf '"parallel_%s": %s\n' "$par" "$res" >>"$OUT_DIR/batching.json"
  echo "parallel $par: $res" >&2
done
# aggregate tok/s of 1, 4 and 8 concurrent streams on one --parallel 8 server (BATCH_STREAMS)
start 8 2048
for nc in ${BATCH_STREAMS:-1 4 8}; do
  res=$(python3 "$WORK/client.py" "$PORT" clients "$nc" "$BATCH_P" "$BATCH_N" $((nc * 1000)))
  printf ',\n"streams_%s": %s\n' "$nc" "$res" >>"$OUT_DIR/batching.json"
  echo "streams $nc: $res" >&2
done
stop
if [ "$BATCH_LONG" = 1 ]; then
  start 4 8192
  res=$(python3 "$WORK/client.py" "$PORT" long "$BATCH_LONG_P")
  stop
  printf ',\n"long_prefill_parallel_4": %s\n' "$res" >>"$OUT_DIR/batching.json"
  echo "long: $res" >&2
fi
echo "}" >>"$OUT_DIR/batching.json"
python3 - "$OUT_DIR/batching.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{'parallel':>8} {'agg tok/s':>10} {'decode tok/s':>13} {'TTFT med s':>11} {'TTFT max s':>11} {'tok/step':>9} {'max stall ms':>13} {'max step ms':>12}")
for k, v in d.items():
    if not k.startswith("parallel_"): continue
    print(f"{k[9:]:>8} {v['agg_tps']:10.1f} {v['decode_tps']:13.1f} {v['ttft_median_s']:11.2f} {v['ttft_max_s']:11.2f} {v['tokens_per_step_avg']:9.1f} {v['max_decode_stall_ms']:13.1f} {v['max_decode_step_ms']:12.1f}")
for k, v in d.items():
    if k.startswith("streams_"):
        print(f"{k[8:]:>2} concurrent stream(s) on --parallel 8: {v['agg_tps']:.1f} tok/s aggregate (wall incl. prefill), "
              f"{v['decode_tps']:.1f} tok/s decode phase, TTFT median {v['ttft_median_s']:.2f} s")
if "long_prefill_parallel_4" in d:
    v = d["long_prefill_parallel_4"]
    print(f"100-token request: TTFT alone {v['short_alone_ttft_s']:.2f} s, beside a {v['long_prompt_tokens']}-token prefill {v['short_beside_long_ttft_s']:.2f} s")
PY
