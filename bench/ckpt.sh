#!/usr/bin/env bash
# bench/ckpt.sh — issue 10's closing benchmarks, side by side in one run (smol-135m-like q8_0 model):
#   1. restart TTFT of a P-token prompt (default 7000) vs its cold TTFT (goal >= 100x), and the
#      flush latency right after the cold run (kvtier bench --once: one request, then flush);
#   2. decode tok/s with --generation-checkpoint 64 vs off (goal <= 2% apart), R alternating runs
#      of -n N tokens each in fresh cache directories, medians.
# usage: bench/ckpt.sh [P] [N] [R]   (env: BUILD, THREADS (2), MODEL). Runs niced; the machine may be
# shared, so read medians. Prints one JSON object per measurement and a summary.
set -eu
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
P=${1:-7000}
N=${2:-256}
R=${3:-3}
TH=${THREADS:-2}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-bench-ckpt-XXXXXX")
trap 'rm -rf "$T"' EXIT
MODEL=${MODEL:-$T/smol-q8_0.gguf}
[ -f "$MODEL" ] || "$KV" gen-model --arch llama --shape smol-135m --type q8_0 -o "$MODEL" >/dev/null
B() { nice "$KV" bench -m "$MODEL" -t "$TH" --json --once "$@" 2>/dev/null | tail -1; }
med() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
jf() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

echo "== restart TTFT, $P-token prompt"
cold=$(B -p "$P" -n 1 --ssd-cache "$T/ssd"); echo "cold:    $cold"
restarts=()
for i in 1 2 3; do
  r=$(B -p "$P" -n 1 --ssd-cache "$T/ssd"); echo "restart: $r"
  restarts+=("$(jf "$r" ttft_ms)")
done
c_ttft=$(jf "$cold" ttft_ms); r_ttft=$(med "${restarts[@]}")

echo "== decode tok/s, -n $N, --generation-checkpoint 64 vs off, $R alternating runs"
off=(); on=()
for i in $(seq 1 "$R"); do
  a=$(B -p 64 -n "$N" --ssd-cache "$T/d-off-$i" --prompt-seed "$i"); echo "off: $a"; off+=("$(jf "$a" decode_tps)")
  b=$(B -p 64 -n "$N" --ssd-cache "$T/d-on-$i" --prompt-seed "$i" --generation-checkpoint 64); echo "on:  $b"; on+=("$(jf "$b" decode_tps)")
done
m_off=$(med "${off[@]}"); m_on=$(med "${on[@]}")
# the load drifts: also the median of the per-pair ratios (each pair ran back to back)
pair=$(python3 -c 'import sys,statistics; n=len(sys.argv)//2; a=sys.argv[1:1+n]; b=sys.argv[1+n:]; print(statistics.median(float(y)/float(x) for x,y in zip(a,b)))' "${off[@]}" "${on[@]}")
python3 - "$c_ttft" "$r_ttft" "$m_off" "$m_on" "$cold" "$pair" <<'PY'
import json, sys
c, r, off, on = map(float, sys.argv[1:5])
cold = json.loads(sys.argv[5])
pair = float(sys.argv[6])
fl = {k: v for k, v in cold.items() if "flush" in k}
print("summary: cold TTFT %.0f ms, restart TTFT %.1f ms (median of 3) = %.0fx; flush after cold %s; "
      "decode %.2f tok/s off vs %.2f tok/s with --generation-checkpoint 64 (medians, %+.2f%%; median per-pair "
      "ratio %+.2f%%)" % (c, r, c / r if r else 0, json.dumps(fl), off, on, (on - off) / off * 100 if off else 0,
                          (pair - 1) * 100))
PY
