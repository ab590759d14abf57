#!/usr/bin/env bash
# bench/shared.sh — shared-tier (Redis) benchmarks (docs/shared-tier.md, docs/benchmarks.md):
#   reuse:  a SHARED_P-token prompt computed on server A (cold prefill, its blocks published to
#           Redis), then sent to server B (own SSD dir, nothing local): B's TTFT vs A's cold TTFT,
#           and the bytes B fetched vs the prompt's KV size;
#   decode: A's decode tok/s with publishing on vs off: cold SHARED_DEC_P-token prefills whose
#           prompt-boundary blocks are queued for the publisher just before the decode of
#           SHARED_DEC_N tokens (Redis flushed before every run, so every "on" run really
#           publishes). SHARED_DEC_R rounds, interleaved ABBA (on,off / off,on / ...) so a drift in
#           machine load hits both sides alike; medians, min/max and the per-round on/off ratio
#           are reported, because on a shared machine the spread is the honest result.
# "Servers" are `kvtier bench --once` processes (one engine each, as in bench/ssd.sh), run under
# `nice -n $NICE`. A private redis-server runs on a random loopback port in WORK_DIR; with
# SHARED_TLS=1 it listens with TLS only (certificates made here with the openssl CLI) and kvtier
# uses rediss:// with CA verification. Writes $OUT_DIR/shared.json.
# Env: KVTIER MODEL THREADS NICE SHARED_PARTS ("reuse decode") SHARED_TLS SHARED_TIMEOUT_MS SHARED_P
#      SHARED_R SHARED_DEC_P SHARED_DEC_N SHARED_DEC_R OUT_DIR WORK_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
THREADS=${THREADS:-2}
NICE=${NICE:-10}
SHARED_PARTS=${SHARED_PARTS:-reuse decode}
SHARED_TLS=${SHARED_TLS:-0}
SHARED_P=${SHARED_P:-7000}
SHARED_R=${SHARED_R:-3}
SHARED_DEC_P=${SHARED_DEC_P:-1024}
SHARED_DEC_N=${SHARED_DEC_N:-128}
SHARED_DEC_R=${SHARED_DEC_R:-6}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/kvtier-shared-bench.XXXXXX)}
mkdir -p "$OUT_DIR" "$WORK_DIR"
RPORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
RARGS=(--bind 127.0.0.1 --dir "$WORK_DIR" --save '' --appendonly no --maxmemory-policy allkeys-lru --daemonize no)
CLI=(redis-cli -p "$RPORT")
URL=redis://127.0.0.1:$RPORT
TLSFLAGS=()
if [ "$SHARED_TLS" = 1 ]; then
    C=$WORK_DIR/certs
    mkdir -p "$C"
    (
        cd "$C"
        k() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@" >/dev/null 2>&1; }
        k -x509 -keyout ca.key -out ca.crt -days 2 -subj /CN=bench-ca
        k -keyout server.key -out server.csr -subj /CN=localhost
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext >/dev/null 2>&1
    )
    RARGS+=(--port 0 --tls-port "$RPORT" --tls-cert-file "$C/server.crt" --tls-key-file "$C/server.key"
            --tls-ca-cert-file "$C/ca.crt" --tls-auth-clients no)
    CLI=(redis-cli --tls --cacert "$C/ca.crt" -p "$RPORT")
    URL=rediss://127.0.0.1:$RPORT
    TLSFLAGS=(--shared-cache-tls-ca "$C/ca.crt")
else
    RARGS+=(--port "$RPORT")
fi
redis-server "${RARGS[@]}" >"$WORK_DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$WORK_DIR"' EXIT
for _ in $(seq 1 100); do "${CLI[@]}" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
"${CLI[@]}" ping 2>/dev/null | grep -q PONG || { echo "redis-server did not start" >&2; exit 1; }
SHARED_TIMEOUT_MS=${SHARED_TIMEOUT_MS:-5000} # budget large enough for the whole prefix on a loaded machine
B=(nice -n "$NICE" "$KVTIER" bench -m "$MODEL" -t "$THREADS" --json)
SH=(--shared-cache "$URL" "${TLSFLAGS[@]}")
echo "shared bench: model $MODEL, $URL, parts: $SHARED_PARTS, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

: > "$WORK_DIR/cold.json"
: > "$WORK_DIR/warm.jsonl"
redis_bytes=0
keys=0
if [[ " $SHARED_PARTS " == *" reuse "* ]]; then
    # A computes, B reuses (each B run has a fresh SSD dir, so only Redis can serve it)
    "${B[@]}" --once -p "$SHARED_P" -n 1 --ssd-cache "$WORK_DIR/a" "${SH[@]}" 2>/dev/null > "$WORK_DIR/cold.json"
    echo "  A cold: $(cat "$WORK_DIR/cold.json")" >&2
    redis_bytes=$("${CLI[@]}" info memory | tr -d '\r' | sed -n 's/^used_memory://p')
    keys=$("${CLI[@]}" dbsize | tr -d '\r')
    for i in $(seq 1 "$SHARED_R"); do
        "${B[@]}" --once -p "$SHARED_P" -n 1 --ssd-cache "$WORK_DIR/b$i" "${SH[@]}" --shared-cache-timeout-ms "$SHARED_TIMEOUT_MS" 2>/dev/null >> "$WORK_DIR/warm.jsonl"
        rm -rf "$WORK_DIR/b$i"
    done
    echo "  B: $(jq -c '{ttft_ms,n_reused,reused_from,restore_ms}' "$WORK_DIR/warm.jsonl" | tr '\n' ' ')" >&2
fi

: > "$WORK_DIR/dec.jsonl"
if [[ " $SHARED_PARTS " == *" decode "* ]]; then
    for round in $(seq 1 "$SHARED_DEC_R"); do
        order="on off"
        [ $((round % 2)) = 0 ] && order="off on"
        for pub in $order; do
            "${CLI[@]}" flushall >/dev/null
            args=(--once -p "$SHARED_DEC_P" -n "$SHARED_DEC_N" --ssd-cache "$WORK_DIR/d-$pub-$round")
            [ "$pub" = on ] && args+=("${SH[@]}")
            load=$(cut -d' ' -f1 /proc/loadavg)
            "${B[@]}" "${args[@]}" 2>/dev/null |
                jq -c --arg pub "$pub" --argjson round "$round" --argjson load "$load" \
                    '{round: $round, publish: $pub, decode_tps, prefill_ms, load: $load}' >> "$WORK_DIR/dec.jsonl"
            # what the "on" run left in Redis: proof that it published (blocks of the prompt)
            [ "$pub" = on ] && echo "    round $round on: $("${CLI[@]}" dbsize | tr -d '\r') keys in redis" >&2
            rm -rf "$WORK_DIR/d-$pub-$round"
        done
    done
    echo "  decode: $(tr '\n' ' ' < "$WORK_DIR/dec.jsonl")" >&2
fi

jq -n --slurpfile cold <(jq -s . "$WORK_DIR/cold.json") --slurpfile warm <(jq -s . "$WORK_DIR/warm.jsonl") \
    --slurpfile dec <(jq -s . "$WORK_DIR/dec.jsonl") --argjson redis_bytes "$redis_bytes" --argjson keys "$keys" \
    --arg url "${URL%%:*}" --arg model "$MODEL" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  ($cold[0][0]) as $c | ($warm[0]) as $w | ($dec[0]) as $d |
  ($w | map(.ttft_ms) | median) as $wt |
  ($d | map(select(.publish == "on") | .decode_tps)) as $on |
  ($d | map(select(.publish == "off") | .decode_tps)) as $off |
  ($d | group_by(.round) | map(select(length == 2)) |
     map((map(select(.publish == "on"))[0].decode_tps) / (map(select(.publish == "off"))[0].decode_tps))) as $ratios |
  {model: $model, scheme: $url,
   reuse: (if $c == null then null else
     {n_prompt: $c.n_prompt, cold_ttft_ms: $c.ttft_ms, shared_ttft_ms_median: $wt, speedup: ($c.ttft_ms / $wt),
      shared_runs: $w, redis_used_memory_bytes: $redis_bytes, redis_keys: $keys, prompt_kv_mb: ($w[0].restored_mb),
      fetched_bytes_median: ($w | map(.shared_fetched_bytes) | median)} end),
   decode: (if ($d | length) == 0 then null else
     {tps_publish_on_median: ($on | median), tps_publish_off_median: ($off | median),
      on_over_off_of_medians: (($on | median) / ($off | median)),
      on_min: ($on | min), on_max: ($on | max), off_min: ($off | min), off_max: ($off | max),
      per_round_on_over_off: $ratios, per_round_ratio_median: ($ratios | median),
      per_round_ratio_min: ($ratios | min), per_round_ratio_max: ($ratios | max),
      runs: $d} end)}' > "$OUT_DIR/shared.json"
cat "$OUT_DIR/shared.json"
