#!/usr/bin/env bash
# bench/seam_compare.sh — two kvtier binaries side by side (e.g. main before a refactor vs after),
# interleaved round by round so machine load hits both alike; medians of R rounds:
#   prefill tok/s (-p P) and decode tok/s (-n N)          kvtier bench
#   RAM hit: TTFT of an exact repeat and of a shared prefix + SUFFIX new tokens (kvtier bench --cache)
#   SSD restore: TTFT of a new process that restores a SSD_P-token prompt from the SSD tier
#                (kvtier bench --once; the first --once of each binary fills its own directory)
#   bench/seam_compare.sh BEFORE_BIN AFTER_BIN [MODEL]
# Env: R (3), T threads (2), P (512), N (64), CACHE_P (2048), SUFFIX (100), SSD_P (4096).
# The model defaults to a gen-model smol-135m q8_0 in models/ (git-ignored). Prints a markdown table.
set -euo pipefail
B=$1; A=$2; M=${3:-models/smol-135m-q8_0.gguf}
R=${R:-3}; T=${T:-2}; P=${P:-512}; N=${N:-64}; CACHE_P=${CACHE_P:-2048}; SUFFIX=${SUFFIX:-100}; SSD_P=${SSD_P:-4096}
command -v jq >/dev/null || { echo "seam_compare: needs jq" >&2; exit 1; }
mkdir -p models
[ -f "$M" ] || "$A" gen-model --shape smol-135m --type q8_0 -o "$M" >/dev/null
W=$(mktemp -d /tmp/kvt-seam.XXXXXX)
trap 'rm -rf "$W"' EXIT
med() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'; }
# one BIN TAG: one round of every measurement, appended to $W/TAG.*
one() {
    local bin=$1 tag=$2
    "$bin" bench -m "$M" -t "$T" -p "$P" -n "$N" -r 1 --json 2>/dev/null |
        jq -r '"\(.prefill_tps) \(.decode_tps)"' >>"$W/$tag.tput"
    "$bin" bench -m "$M" -t "$T" -p "$CACHE_P" --suffix "$SUFFIX" --cache -r 1 --json 2>/dev/null |
        jq -r '"\(.ttft_cold_ms) \(.ttft_repeat_ms) \(.ttft_prefix_suffix_ms)"' >>"$W/$tag.cache"
    [ -d "$W/ssd-$tag" ] || "$bin" bench -m "$M" -t "$T" --once -p "$SSD_P" -n 1 --ssd-cache "$W/ssd-$tag" --json >/dev/null 2>&1
    "$bin" bench -m "$M" -t "$T" --once -p "$SSD_P" -n 1 --ssd-cache "$W/ssd-$tag" --json 2>/dev/null |
        jq -r '"\(.ttft_ms) \(.restore_ms) \(.reused_from)"' >>"$W/$tag.ssd"
}
for _ in $(seq 1 "$R"); do one "$B" before; one "$A" after; done
col() { cut -d' ' -f"$2" "$W/$1" | med; }
echo "| $(basename "$M"), $T threads, medians of $R | before | after |"
echo "|---|---|---|"
echo "| prefill tok/s (p$P) | $(col before.tput 1) | $(col after.tput 1) |"
echo "| decode tok/s (n$N) | $(col before.tput 2) | $(col after.tput 2) |"
echo "| RAM: cold TTFT ms (p$CACHE_P) | $(col before.cache 1) | $(col after.cache 1) |"
echo "| RAM: exact-repeat TTFT ms | $(col before.cache 2) | $(col after.cache 2) |"
echo "| RAM: shared prefix + $SUFFIX TTFT ms | $(col before.cache 3) | $(col after.cache 3) |"
echo "| SSD: restart TTFT ms (p$SSD_P) | $(col before.ssd 1) | $(col after.ssd 1) |"
echo "| SSD: restore ms | $(col before.ssd 2) | $(col after.ssd 2) |"
echo "reused_from (before, after): $(cut -d' ' -f3 "$W/before.ssd" | sort -u | tr '\n' ' ') / $(cut -d' ' -f3 "$W/after.ssd" | sort -u | tr '\n' ' ')"
echo "load: $(uptime)"
