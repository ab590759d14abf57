#!/usr/bin/env bash
# bench/ssd.sh — SSD-tier benchmarks, each side by side in one run (see docs/benchmarks.md):
#   1. cold prefill TTFT vs restart-and-reuse TTFT (process 1 fills --ssd-cache and flushes; new
#      processes send the same prompt and restore it from disk);
#   2. restore bandwidth vs the disk's sequential read bandwidth (dd of a same-size file, O_DIRECT
#      and buffered), with an attempt to drop the page cache first;
#   3. decode tok/s with write-behind on vs off (cold prefills of SSD_WB_DEPTH tokens, so the
#      prompt-boundary snapshot is being written while decoding);
#   4. bytes written over a K-turn conversation (du of the cache dir) vs the sum of the turns'
#      prompt KV (sum of prompt tokens x bytes/token).
# Writes $OUT_DIR/ssd.json. Env: KVTIER, MODEL, THREADS, SSD_P, SSD_RESTORES, SSD_WB_DEPTH,
# SSD_WB_N, SSD_WB_R, TURNS, TURN_P, TURN_N, TURN_SUFFIX, OUT_DIR, WORK_DIR.
set -euo pipefail
KVTIER=${KVTIER:-build/kvtier}
MODEL=${MODEL:-models/smol-q8_0.gguf}
THREADS=${THREADS:-2}
SSD_P=${SSD_P:-7000}
SSD_RESTORES=${SSD_RESTORES:-3}
SSD_WB_DEPTH=${SSD_WB_DEPTH:-1024}
SSD_WB_N=${SSD_WB_N:-32}
SSD_WB_R=${SSD_WB_R:-2}
TURNS=${TURNS:-10}
TURN_P=${TURN_P:-512}
TURN_N=${TURN_N:-32}
TURN_SUFFIX=${TURN_SUFFIX:-200}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/kvtier-ssd-bench.XXXXXX)}
mkdir -p "$OUT_DIR" "$WORK_DIR"
trap 'rm -rf "$WORK_DIR"' EXIT
B=("$KVTIER" bench -m "$MODEL" -t "$THREADS" --json)

drop_caches() { # prints true if the page cache could be dropped
    sync
    if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo true; else echo false; fi
}

# 1. cold vs restart-and-reuse
D1="$WORK_DIR/ttft"
"${B[@]}" --once -p "$SSD_P" -n 1 --ssd-cache "$D1" 2>/dev/null > "$WORK_DIR/cold.json"
echo "  cold: $(cat "$WORK_DIR/cold.json")" >&2
: > "$WORK_DIR/warm.jsonl"
dropped=false
for i in $(seq 1 "$SSD_RESTORES"); do
    dropped=$(drop_caches)
    "${B[@]}" --once -p "$SSD_P" -n 1 --ssd-cache "$D1" 2>/dev/null | jq -c --argjson dropped "$dropped" '. + {page_cache_dropped: $dropped}' >> "$WORK_DIR/warm.jsonl"
done
echo "  restarts: $(jq -c '{ttft_ms,n_reused,reused_from,restore_ms,restore_mb_s,page_cache_dropped}' "$WORK_DIR/warm.jsonl" | tr '\n' ' ')" >&2
cache_bytes=$(du -sb "$D1" | cut -f1)

# 2. disk sequential read of a same-size file
F="$WORK_DIR/ddfile"
mb=$(( (cache_bytes + 1048575) / 1048576 ))
dd if=/dev/urandom of="$F" bs=1M count="$mb" conv=fsync status=none
dd_rate() { # bytes/s from dd's summary line
    LC_ALL=C dd "$@" of=/dev/null bs=4M 2>&1 | awk '/copied/ { n=$1; for (i=1;i<=NF;i++) if ($i ~ /^s,?$/) t=$(i-1); print n / t }'
}
dd_dropped=$(drop_caches)
direct_bps=$(dd_rate if="$F" iflag=direct || echo 0)
dd if="$F" of=/dev/null bs=4M status=none # warm the page cache
buffered_bps=$(dd_rate if="$F")
rm -f "$F"

# 3. decode with write-behind on vs off (alternating processes)
: > "$WORK_DIR/wb.jsonl"
for round in 1 2; do
    for wb in on off; do
        D3="$WORK_DIR/wb-$wb-$round"
        "${B[@]}" --decode-at "$SSD_WB_DEPTH" -n "$SSD_WB_N" -r "$SSD_WB_R" --cold --ssd-cache "$D3" --ssd-writeback "$wb" 2>/dev/null |
            jq -c --arg wb "$wb" '{writeback: $wb, decode_tps, decode_tps_first, prefill_tps}' >> "$WORK_DIR/wb.jsonl"
        rm -rf "$D3"
    done
done
echo "  write-behind: $(tr '\n' ' ' < "$WORK_DIR/wb.jsonl")" >&2

# 4. K-turn conversation: bytes on disk vs the sum of the turns' prompt KV
D4="$WORK_DIR/turns"
"${B[@]}" --turns "$TURNS" -p "$TURN_P" -n "$TURN_N" --suffix "$TURN_SUFFIX" --ssd-cache "$D4" 2>/dev/null > "$WORK_DIR/turns.json"
turn_bytes=$(du -sb "$D4" | cut -f1)

jq -n --slurpfile cold "$WORK_DIR/cold.json" --slurpfile warm <(jq -s . "$WORK_DIR/warm.jsonl") \
    --slurpfile wb <(jq -s . "$WORK_DIR/wb.jsonl") --slurpfile turns "$WORK_DIR/turns.json" \
    --argjson cache_bytes "$cache_bytes" --argjson direct "$direct_bps" --argjson buffered "$buffered_bps" \
    --argjson dd_dropped "$dd_dropped" --argjson turn_bytes "$turn_bytes" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end;
  ($cold[0]) as $c | ($warm[0]) as $w | ($wb[0]) as $b | ($turns[0]) as $t |
  ($w | map(.ttft_ms) | median) as $wt |
  ($w | map(.restore_mb_s) | median) as $rbw |
  {
    n_prompt: $c.n_prompt,
    ttft_cold_ms: $c.ttft_ms, ttft_restart_ms: $wt, speedup: ($c.ttft_ms / $wt),
    restart_runs: $w, cold_run: $c,
    cache_dir_bytes: $cache_bytes,
    restore_mb_s: $rbw,
    disk_read_direct_mb_s: ($direct / 1e6), disk_read_buffered_mb_s: ($buffered / 1e6),
    restore_vs_direct: ($rbw / ($direct / 1e6)),
    page_cache_dropped: $dd_dropped,
    writeback_runs: $b,
    decode_tps_writeback_on: ($b | map(select(.writeback == "on") | .decode_tps) | median),
    decode_tps_writeback_off: ($b | map(select(.writeback == "off") | .decode_tps) | median),
    turns: $t, turns_disk_bytes: $turn_bytes,
    turns_disk_vs_sum_prompt_kv: ($turn_bytes / $t.sum_prompt_kv_bytes)
  }' > "$OUT_DIR/ssd.json"
jq -c '{ttft_cold_ms, ttft_restart_ms, speedup, restore_mb_s, disk_read_direct_mb_s, disk_read_buffered_mb_s, page_cache_dropped, decode_tps_writeback_on, decode_tps_writeback_off, turns_disk_bytes, turns_disk_vs_sum_prompt_kv}' "$OUT_DIR/ssd.json" >&2
