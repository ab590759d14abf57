#!/usr/bin/env bash
# bench/constrained.sh — constrained decoding cost (docs/server.md "Structured output"): one
# `kvtier serve --parallel 1` gets CONS_R (5) rounds of, interleaved, an unconstrained chat request
# and the same request with response_format json_schema (a list of strings: the reply stays inside
# strings and arrays, the common structured-output case) and json_object, each CONS_N (128) new
# tokens, temperature 1, fixed seeds. Reports the median decode tok/s of each (the server's own
# per-request decode figure from its log) and the ratios. Env: KVTIER, MODEL, THREADS, CONS_R,
# CONS_N, OUT_DIR. Writes $OUT_DIR/constrained.json.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
THREADS=${THREADS:-2}
CONS_R=${CONS_R:-5}
CONS_N=${CONS_N:-128}
OUT_DIR=${OUT_DIR:-bench/results}
mkdir -p "$OUT_DIR"
[ -f "$MODEL" ] || "$KVTIER" gen-model --shape smol-135m --type q8_0 -o "$MODEL" >/dev/null
WORK=$(mktemp -d /tmp/kvtier-cons-bench.XXXXXX)
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=$((21000 + RANDOM % 9000))
"$KVTIER" serve -m "$MODEL" --port $PORT --parallel 1 -t "$THREADS" >"$WORK/log" 2>&1 &
SRV=$!
for i in $(seq 1 300); do grep -q "^listening on" "$WORK/log" && break; sleep 0.2; done
MSG='"messages":[{"role":"user","content":"List some words."}]'
SCHEMA='{"type":"object","properties":{"words":{"type":"array","items":{"type":"string"}}},"required":["words"]}'
req() { # req KIND SEED
  local extra=""
  case $1 in
    schema) extra=",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":$SCHEMA}}" ;;
    object) extra=",\"response_format\":{\"type\":\"json_object\"}" ;;
  esac
  curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/chat/completions" \
    -d "{$MSG,\"max_tokens\":$CONS_N,\"temperature\":1,\"seed\":$2$extra}"
  # the server's log line of this request: "... gen=N ... decode=X tok/s ..."
  tail -1 "$WORK/log" | sed -E 's/.* gen=([0-9]+) .* decode=([0-9.]+) tok\/s.*/\1 \2/' >>"$WORK/$1"
}
req none 0 # warm-up
: >"$WORK/none"
for r in $(seq 1 "$CONS_R"); do req none "$r"; req schema "$r"; req object "$r"; done
python3 - "$WORK" "$OUT_DIR/constrained.json" "$MODEL" "$CONS_N" "$(uptime)" <<'PY'
import json, statistics, sys
w = sys.argv[1]
def med(k):
    rows = [l.split() for l in open(f"{w}/{k}") if l.strip()]
    return statistics.median(float(r[1]) for r in rows), statistics.median(int(r[0]) for r in rows)
res = {k: med(k) for k in ("none", "schema", "object")}
out = {"model": sys.argv[3], "max_tokens": int(sys.argv[4]), "load": sys.argv[5].strip(),
       "decode_tps_median": {k: v[0] for k, v in res.items()}, "gen_tokens_median": {k: v[1] for k, v in res.items()},
       "ratio_schema": res["schema"][0] / res["none"][0], "ratio_object": res["object"][0] / res["none"][0]}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(out, indent=1))
PY
