#!/usr/bin/env bash
# bench/shared.sh — shared-tier (Redis) benchmarks, side by side in one run (docs/shared-tier.md):
#   1. a SHARED_P-token prompt computed on server A (cold prefill, its blocks published to Redis),
#      then sent to server B (own SSD dir, nothing local): B's TTFT vs A's cold TTFT, and the bytes
#      B fetched vs the prompt's KV size;
#   2. A's decode tok/s with publishing on vs off (cold SHARED_DEC_P-token prefills whose
#      prompt-boundary blocks are published while decoding; Redis flushed before every "on" run).
# "Servers" are `kvtier bench --once` processes (one engine each, as in bench/ssd.sh). A private
# redis-server runs on a random loopback port in WORK_DIR. Writes $OUT_DIR/shared.json.
# Env: KVTIER, MODEL, THREADS, SHARED_TIMEOUT_MS, SHARED_P, SHARED_R, SHARED_DEC_P, SHARED_DEC_N, SHARED_DEC_R, OUT_DIR, WORK_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
THREADS=${THREADS:-2}
SHARED_P=${SHARED_P:-7000}
SHARED_R=${SHARED_R:-3}
SHARED_DEC_P=${SHARED_DEC_P:-1024}
SHARED_DEC_N=${SHARED_DEC_N:-128}
SHARED_DEC_R=${SHARED_DEC_R:-2}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/kvtier-shared-bench.XXXXXX)}
mkdir -p "$OUT_DIR" "$WORK_DIR"
RPORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK_DIR" --save '' --appendonly no \
    --maxmemory-policy allkeys-lru --daemonize no >"$WORK_DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$WORK_DIR"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
URL=redis://127.0.0.1:$RPORT
SHARED_TIMEOUT_MS=${SHARED_TIMEOUT_MS:-5000} # budget large enough for the whole prefix on a loaded machine
B=("$KVTIER" bench -m "$MODEL" -t "$THREADS" --json)

# 1. A computes, B reuses (each B run has a fresh SSD dir, so only Redis can serve it)
"${B[@]}" --once -p "$SHARED_P" -n 1 --ssd-cache "$WORK_DIR/a" --shared-cache "$URL" 2>/dev/null > "$WORK_DIR/cold.json"
echo "  A cold: $(cat "$WORK_DIR/cold.json")" >&2
redis_bytes=$(redis-cli -p "$RPORT" info memory | tr -d '\r' | sed -n 's/^used_memory://p')
keys=$(redis-cli -p "$RPORT" dbsize | tr -d '\r')
: > "$WORK_DIR/warm.jsonl"
for i in $(seq 1 "$SHARED_R"); do
    "${B[@]}" --once -p "$SHARED_P" -n 1 --ssd-cache "$WORK_DIR/b$i" --shared-cache "$URL" --shared-cache-timeout-ms "$SHARED_TIMEOUT_MS" 2>/dev/null >> "$WORK_DIR/warm.jsonl"
    rm -rf "$WORK_DIR/b$i"
done
echo "  B: $(jq -c '{ttft_ms,n_reused,reused_from,restore_ms}' "$WORK_DIR/warm.jsonl" | tr '\n' ' ')" >&2

# 2. decode with publishing on vs off (alternating processes)
: > "$WORK_DIR/dec.jsonl"
for round in $(seq 1 "$SHARED_DEC_R"); do
    for pub in on off; do
        redis-cli -p "$RPORT" flushall >/dev/null
        args=(--once -p "$SHARED_DEC_P" -n "$SHARED_DEC_N" --ssd-cache "$WORK_DIR/d-$pub-$round")
        [ "$pub" = on ] && args+=(--shared-cache "$URL")
        "${B[@]}" "${args[@]}" 2>/dev/null | jq -c --arg pub "$pub" '{publish: $pub, decode_tps, prefill_ms}' >> "$WORK_DIR/dec.jsonl"
        rm -rf "$WORK_DIR/d-$pub-$round"
    done
done
echo "  decode: $(tr '\n' ' ' < "$WORK_DIR/dec.jsonl")" >&2

jq -n --slurpfile cold "$WORK_DIR/cold.json" --slurpfile warm <(jq -s . "$WORK_DIR/warm.jsonl") \
    --slurpfile dec <(jq -s . "$WORK_DIR/dec.jsonl") --argjson redis_bytes "$redis_bytes" --argjson keys "$keys" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  ($cold[0]) as $c | ($warm[0]) as $w | ($dec[0]) as $d |
  ($w | map(.ttft_ms) | median) as $wt |
  {n_prompt: $c.n_prompt, cold_ttft_ms: $c.ttft_ms, shared_ttft_ms_median: $wt, speedup: ($c.ttft_ms / $wt),
   shared_runs: $w, redis_used_memory_bytes: $redis_bytes, redis_keys: $keys,
   prompt_kv_mb: ($w[0].restored_mb),
   fetched_bytes_median: ($w | map(.shared_fetched_bytes) | median),
   decode_tps_publish_on_median: ($d | map(select(.publish == "on") | .decode_tps) | median),
   decode_tps_publish_off_median: ($d | map(select(.publish == "off") | .decode_tps) | median),
   decode_runs: $d}' > "$OUT_DIR/shared.json"
cat "$OUT_DIR/shared.json"
