#!/usr/bin/env bash
# bench/ttft_ctx.sh — TTFT against prompt length for each place a prompt's KV can come from
# (docs/benchmarks.md, plot docs/img/bench-ttft-ctx.png). For every P in CTXS, with a fresh SSD
# directory and an empty private redis-server (random loopback port):
#   cold    process A (`kvtier bench --once`, SSD tier + shared tier on): nothing cached, the whole
#           prompt is prefilled; A flushes its blocks to its SSD directory and publishes them to Redis;
#   ram     `kvtier bench --cache -r 1`: the exact same prompt again in the same process (RAM tier);
#           its own cold TTFT is kept beside it (cold_cache_ms);
#   ssd     a new process on A's SSD directory (restart: restore from disk, after an attempt to drop
#           the page cache, recorded as page_cache_dropped);
#   shared  a new process with the shared tier only (nothing local: every block fetched from Redis).
# The prompt is the same seeded random prompt in every process (--prompt-seed = P, so lengths do not
# share a prefix). R rounds per length, each from an empty SSD directory and Redis; every point is
# the median of its rounds (the rounds are kept under "runs", each with the load average before
# each measurement, as are the load averages at start and end; date and git are taken at the end,
# seconds is the run's length). Writes $OUT_DIR/ttft-ctx.json.
# Env: KVTIER MODEL (default models/smol-q8_0.gguf, generated when missing) CTXS ("512 1024 2048
# 4096 7000") R (3) THREADS (2) NICE (10) SUFFIX (100, the --cache run's suffix) OUT_DIR WORK_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
CTXS=${CTXS:-512 1024 2048 4096 7000}
R=${R:-3}
THREADS=${THREADS:-2}
NICE=${NICE:-10}
SUFFIX=${SUFFIX:-100}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/kvtier-ttft-ctx.XXXXXX)}
mkdir -p "$OUT_DIR" "$WORK_DIR" "$(dirname "$MODEL")"
[ -f "$MODEL" ] || "$KVTIER" gen-model --arch llama --shape smol-135m --type q8_0 -o "$MODEL" >&2
RPORT=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK_DIR" --save '' --appendonly no --daemonize no \
    >"$WORK_DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$WORK_DIR"' EXIT
CLI=(redis-cli -p "$RPORT")
for _ in $(seq 1 100); do "${CLI[@]}" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
URL=redis://127.0.0.1:$RPORT
B=(nice -n "$NICE" "$KVTIER" bench -m "$MODEL" -t "$THREADS" --json)
SH=(--shared-cache "$URL" --shared-cache-timeout-ms 60000)
load() { cut -d' ' -f1 /proc/loadavg; }
drop_caches() { sync; if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo true; else echo false; fi; }
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg) T0=$(date +%s)
echo "ttft_ctx: model $MODEL, CTXS $CTXS, R $R, load before: $LOAD_START" >&2
: > "$WORK_DIR/runs.jsonl"
for P in $CTXS; do for round in $(seq 1 "$R"); do
    "${CLI[@]}" flushall >/dev/null
    D="$WORK_DIR/ssd-$P"
    l_cold=$(load)
    "${B[@]}" --once -p "$P" -n 1 --prompt-seed "$P" --ssd-cache "$D" "${SH[@]}" 2>/dev/null > "$WORK_DIR/cold.json"
    l_ram=$(load)
    "${B[@]}" --cache -p "$P" --suffix "$SUFFIX" -r 1 2>/dev/null > "$WORK_DIR/ram.json"
    dropped=$(drop_caches)
    l_ssd=$(load)
    "${B[@]}" --once -p "$P" -n 1 --prompt-seed "$P" --ssd-cache "$D" 2>/dev/null > "$WORK_DIR/ssd.json"
    l_sh=$(load)
    "${B[@]}" --once -p "$P" -n 1 --prompt-seed "$P" "${SH[@]}" 2>/dev/null > "$WORK_DIR/shared.json"
    jq -nc --argjson p "$P" --argjson round "$round" --slurpfile c "$WORK_DIR/cold.json" --slurpfile r "$WORK_DIR/ram.json" \
        --slurpfile s "$WORK_DIR/ssd.json" --slurpfile h "$WORK_DIR/shared.json" --argjson dropped "$dropped" \
        --argjson lc "$l_cold" --argjson lr "$l_ram" --argjson ls "$l_ssd" --argjson lh "$l_sh" '
      {n_prompt: $p, round: $round,
       cold_ms: $c[0].ttft_ms, cold_load: $lc,
       ram_ms: $r[0].ttft_repeat_ms, cold_cache_ms: $r[0].ttft_cold_ms, ram_suffix_ms: $r[0].ttft_prefix_suffix_ms, ram_load: $lr,
       ssd_ms: $s[0].ttft_ms, ssd_reused: $s[0].n_reused, ssd_from: $s[0].reused_from, ssd_restore_ms: $s[0].restore_ms,
       page_cache_dropped: $dropped, ssd_load: $ls,
       shared_ms: $h[0].ttft_ms, shared_reused: $h[0].n_reused, shared_from: $h[0].reused_from,
       shared_fetch_ms: $h[0].restore_ms, shared_fetched_bytes: $h[0].shared_fetched_bytes, shared_load: $lh}' \
        | tee -a "$WORK_DIR/runs.jsonl" >&2
    rm -rf "$D"
done; done
# a point whose restart did not reuse from the tier it names measures something else: fail loudly
jq -se 'all(.[]; .ssd_from == "ssd" and .shared_from == "shared" and .ssd_reused > 0 and .shared_reused > 0)' \
    "$WORK_DIR/runs.jsonl" >/dev/null || { echo "ttft_ctx: a restart did not reuse from its tier" >&2; exit 1; }
jq -s --arg model "$MODEL" --argjson threads "$THREADS" --arg ls "$LOAD_START" --arg le "$(cut -d' ' -f1-3 /proc/loadavg)" \
    --arg cpu "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" --argjson cores "$(nproc)" --arg date "$(date -u +%FT%TZ)" \
    --arg rev "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
    --argjson r "$R" --argjson secs $(( $(date +%s) - T0 )) '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  {date: $date, git: $rev, seconds: $secs, cpu: $cpu, cores: $cores, model: $model, threads: $threads, rounds: $r,
   loadavg_start: $ls, loadavg_end: $le,
   points: (group_by(.n_prompt) | map(. as $g | {n_prompt: $g[0].n_prompt} +
     (["cold_ms", "ram_ms", "ssd_ms", "shared_ms", "cold_cache_ms", "ssd_restore_ms", "shared_fetch_ms"]
      | map({key: ., value: (. as $k | $g | map(.[$k]) | median * 100 | round / 100)}) | from_entries) + {runs: $g}))}' \
    "$WORK_DIR/runs.jsonl" > "$OUT_DIR/ttft-ctx.json"
jq -c '{date, loadavg_start, loadavg_end}' "$OUT_DIR/ttft-ctx.json"
