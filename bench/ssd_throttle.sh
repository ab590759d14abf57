#!/usr/bin/env bash
# bench/ssd_throttle.sh — first-token delay of a long cold prompt with the SSD tier writing through a
# throttled disk vs with persistence off (issue 10; goal: the same). One cold request of P tokens
# (`kvtier bench --once`, which flushes the tier after the request; the flush is reported apart)
# per configuration, configurations interleaved, R rounds:
#   off     no --ssd-cache (persistence off)
#   ssd     --ssd-cache, disk unthrottled
#   ssd@T   --ssd-cache with every SSD-tier write paced to T MB/s by the I/O layer
#           (env KVT_IO_THROTTLE_MBPS, src/cache/ssd_io.c), for each T in THROTTLES
# Default model: the `tiny` gen-model shape (2 layers, 2 KV heads x 16, 256 B of KV per token:
# a 60k prefill takes a minute or two on 2 loaded cores; 60k tokens are 15 MB of KV, so 1 MB/s is
# a disk ~15x slower than a prefill of that length produces KV, and 50 MB/s is the issue's case).
# Writes $OUT_DIR/ssd_throttle.json. Env: KVTIER, MODEL, THREADS, P, R, THROTTLES, OUT_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/tiny-byte.gguf}
THREADS=${THREADS:-2}
P=${P:-60000}
R=${R:-1}
THROTTLES=${THROTTLES:-"50 1"}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=$(mktemp -d /tmp/kvtier-throttle.XXXXXX)
trap 'rm -rf "$WORK_DIR"' EXIT
mkdir -p "$OUT_DIR"
[ -f "$MODEL" ] || { mkdir -p "$(dirname "$MODEL")"; "$KVTIER" gen-model --shape tiny --byte-vocab -o "$MODEL"; }
CTX=$(( (P + 1024) / 1024 * 1024 + 1024 ))
run() { # $1 label, $2 throttle MB/s or "", $3 ssd dir or ""
    local extra=() env=()
    [ -n "$3" ] && { rm -rf "$3"; extra=(--ssd-cache "$3"); }
    [ -n "$2" ] && env=(KVT_IO_THROTTLE_MBPS="$2")
    env "${env[@]}" "$KVTIER" bench -m "$MODEL" -t "$THREADS" -c "$CTX" --once -p "$P" -n 1 --json "${extra[@]}" \
        2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"config": sys.argv[1], "ttft_ms": d["ttft_ms"], "flush_ms": d["flush_ms"],
                  "durable": d["durable"], "ssd_bytes": d["ssd_bytes"], "ssd_dropped": d["ssd_dropped"]}))' "$1"
}
: > "$WORK_DIR/runs.jsonl"
for r in $(seq 1 "$R"); do
    run off "" "" | tee -a "$WORK_DIR/runs.jsonl" >&2
    run ssd "" "$WORK_DIR/c" | tee -a "$WORK_DIR/runs.jsonl" >&2
    for t in $THROTTLES; do run "ssd@$t" "$t" "$WORK_DIR/c" | tee -a "$WORK_DIR/runs.jsonl" >&2; done
done
python3 - "$WORK_DIR/runs.jsonl" "$P" "$MODEL" > "$OUT_DIR/ssd_throttle.json" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in runs: by.setdefault(r["config"], []).append(r)
out = {"bench": "ssd_throttle", "prompt_tokens": int(sys.argv[2]), "model": sys.argv[3], "configs": {}}
off = statistics.median(r["ttft_ms"] for r in by["off"])
for c, rs in by.items():
    t = statistics.median(r["ttft_ms"] for r in rs)
    out["configs"][c] = {"ttft_ms_median": round(t, 1), "ttft_vs_off": round(t / off, 3),
                         "flush_ms_median": round(statistics.median(r["flush_ms"] for r in rs), 1),
                         "durable": all(r["durable"] for r in rs), "runs": len(rs)}
print(json.dumps(out, indent=1))
PY
cat "$OUT_DIR/ssd_throttle.json"
