#!/usr/bin/env bash
# bench/shared_fetch.sh — does the shared tier fetch at Redis's speed? (issue 24)
# Server A (`kvtier bench --once`, one engine) computes a P-token prompt and publishes its blocks to
# a private redis-server (random loopback port). Then, R rounds interleaved (load drifts hit both
# sides alike):
#   B    a fresh engine with --shared-cache and nothing local: its TTFT on the same prompt (the
#        shared fetch, verification, RAM puts, then the one remaining prompt token and the first
#        decode step), plus its restore_ms (the fetch alone) and the bytes it fetched;
#   GET  a plain pipelined GET of every key A published, from the same Redis with redis-cli --pipe
#        (C client: sends all commands, reads all replies), timed wall-clock.
# Reports medians and TTFT_B / GET. Env: KVTIER MODEL (default: a generated smol-135m f16, 22.5 KiB
# of KV per token) P (3000) R (3) THREADS (2) NICE (0) SSD (1: A and every B also get a fresh
# --ssd-cache dir, so B's time includes queueing its blocks for the SSD writer) OUT_DIR WORK_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
P=${P:-3000}
R=${R:-3}
THREADS=${THREADS:-2}
NICE=${NICE:-0}
SSD=${SSD:-0}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/kvtier-shared-fetch.XXXXXX)}
mkdir -p "$OUT_DIR" "$WORK_DIR"
MODEL=${MODEL:-$WORK_DIR/smol.gguf}
[ -f "$MODEL" ] || "$KVTIER" gen-model --shape smol-135m --type f16 -o "$MODEL" >/dev/null 2>&1
RPORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK_DIR" --save '' --appendonly no --daemonize no \
    >"$WORK_DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$WORK_DIR"' EXIT
CLI=(redis-cli -p "$RPORT")
for _ in $(seq 1 100); do "${CLI[@]}" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
URL=redis://127.0.0.1:$RPORT
B=(nice -n "$NICE" "$KVTIER" bench -m "$MODEL" -t "$THREADS" --json --once -p "$P" -n 1 --shared-cache "$URL"
   --shared-cache-timeout-ms 60000)
echo "shared_fetch: model $MODEL, P $P, R $R, SSD $SSD, load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
ssd() { [ "$SSD" = 1 ] && echo "--ssd-cache $WORK_DIR/ssd-$1"; return 0; }
# shellcheck disable=SC2046
"${B[@]}" $(ssd a) 2>/dev/null > "$WORK_DIR/a.json"
echo "  A cold: $(jq -c '{ttft_ms, n_prompt}' "$WORK_DIR/a.json")" >&2
# the GET loop's commands: every key A published, as RESP
"${CLI[@]}" --scan --pattern 'kvtier:v1:*' > "$WORK_DIR/keys"
python3 - "$WORK_DIR/keys" "$WORK_DIR/gets.resp" <<'PY'
import sys
keys = [k.strip() for k in open(sys.argv[1]) if k.strip()]
with open(sys.argv[2], "wb") as f:
    for k in keys:
        kb = k.encode()
        f.write(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(kb), kb))
PY
NKEYS=$(wc -l < "$WORK_DIR/keys")
BYTES=$(while read -r k; do "${CLI[@]}" strlen "$k"; done < "$WORK_DIR/keys" | awk '{s += $1} END {print s}')
echo "  redis: $NKEYS keys, $BYTES value bytes" >&2
: > "$WORK_DIR/runs.jsonl"
for round in $(seq 1 "$R"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2046
    "${B[@]}" $(ssd "b$round") 2>/dev/null | jq -c --argjson round "$round" --argjson load "$load" \
        '{round: $round, side: "B", ttft_ms, restore_ms, n_reused, reused_from, fetched: .shared_fetched_bytes, load: $load}' \
        >> "$WORK_DIR/runs.jsonl"
    t0=$(date +%s%N)
    nice -n "$NICE" "${CLI[@]}" --pipe < "$WORK_DIR/gets.resp" > "$WORK_DIR/pipe.out" 2>&1
    t1=$(date +%s%N)
    grep -q "replies: $NKEYS" "$WORK_DIR/pipe.out" || { cat "$WORK_DIR/pipe.out" >&2; exit 1; }
    jq -nc --argjson round "$round" --argjson ms "$(( (t1 - t0) / 1000 ))" --argjson load "$load" \
        '{round: $round, side: "GET", ms: ($ms / 1000), load: $load}' >> "$WORK_DIR/runs.jsonl"
    tail -2 "$WORK_DIR/runs.jsonl" | tr '\n' ' ' >&2; echo >&2
done
jq -s --argjson bytes "$BYTES" --argjson keys "$NKEYS" --slurpfile a "$WORK_DIR/a.json" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  (map(select(.side == "B") | .ttft_ms) | median) as $b |
  (map(select(.side == "B") | .restore_ms) | median) as $f |
  (map(select(.side == "GET") | .ms) | median) as $g |
  {n_prompt: $a[0].n_prompt, cold_ttft_ms: $a[0].ttft_ms, redis_keys: $keys, redis_value_bytes: $bytes,
   b_ttft_ms_median: $b, b_fetch_ms_median: $f, get_loop_ms_median: $g,
   ttft_over_get: ($b / $g), fetch_over_get: ($f / $g), b_mb_per_s: ($bytes / 1e6 / ($f / 1000)),
   get_mb_per_s: ($bytes / 1e6 / ($g / 1000)), runs: .}' "$WORK_DIR/runs.jsonl" > "$OUT_DIR/shared_fetch.json"
jq -c 'del(.runs)' "$OUT_DIR/shared_fetch.json"
