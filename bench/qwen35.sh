#!/usr/bin/env bash
# bench/qwen35.sh — issue 11's closing benchmarks on a realistic small Qwen3.5 shape (gen-model
# qwen35-0.8b, random weights) at THREADS threads:
#   1. pp512 / tg128 of the hybrid model vs a dense model with the same layer shapes
#      (gen-model --arch qwen3 --shape qwen35-0.8b: every layer full attention), alternated, R reps;
#   2. the layout's KV bytes per block vs the recurrent-state snapshot bytes (engine info lines);
#   3. a TURNS-turn agent conversation through the engine with RAM + SSD tiers (kvtier bench
#      --turns): SYS-token system prompt, ANS answer tokens and TOOL new tool-result tokens a turn,
#      a flush/close/reopen (restart) after turn RESTART; TTFT per turn vs the cold TTFT of the same
#      prompt, measured for the first turn and for the last turn's prompt (--prompt-cache 0).
# Writes bench/results/qwen35-*.json|txt.  TYPE=q8_0 R=3 TURNS=10 SYS=3000 TOOL=500 ANS=32 RESTART=5
set -uo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
THREADS=${THREADS:-2} TYPE=${TYPE:-q8_0} R=${R:-3}
TURNS=${TURNS:-10} SYS=${SYS:-3000} TOOL=${TOOL:-500} ANS=${ANS:-32} RESTART=${RESTART:-5}
OUT=bench/results
mkdir -p models "$OUT"
H=models/qwen35-0.8b-$TYPE.gguf D=models/qwen3dense-qwen35-0.8b-$TYPE.gguf
[ -f "$H" ] || "$KVTIER" gen-model --shape qwen35-0.8b --type "$TYPE" -o "$H"
[ -f "$D" ] || "$KVTIER" gen-model --arch qwen3 --shape qwen35-0.8b --type "$TYPE" -o "$D"
: > "$OUT/qwen35-throughput.jsonl"
for r in $(seq "$R"); do
    for m in "$H" "$D"; do
        nice "$KVTIER" bench -m "$m" -t "$THREADS" -p 512 -n 128 -r 1 --json 2>>"$OUT/qwen35-info.txt" |
            jq -c --arg m "$m" '. + {file: $m}' >> "$OUT/qwen35-throughput.jsonl"
    done
done
jq -s -r 'group_by(.file)[] | "\(.[0].file): pp512 median \(map(.prefill_tps)|sort|.[length/2|floor]) t/s, tg128 median \(map(.decode_tps)|sort|.[length/2|floor]) t/s (\(length) runs)"' \
    "$OUT/qwen35-throughput.jsonl" | tee "$OUT/qwen35-throughput.txt"
grep -E "kv:|state|snapshot" "$OUT/qwen35-info.txt" | sort -u | head -20 > "$OUT/qwen35-layout.txt"
cat "$OUT/qwen35-layout.txt"
SSD=$(mktemp -d /tmp/qwen35-ssd.XXXXXX)
nice "$KVTIER" bench -m "$H" -t "$THREADS" --turns "$TURNS" --restart-after "$RESTART" -p "$SYS" -n "$ANS" \
    --suffix "$TOOL" --ssd-cache "$SSD" --json 2>>"$OUT/qwen35-info.txt" > "$OUT/qwen35-turns.json"
rm -rf "$SSD"
LAST=$(jq '.turns[-1].n_prompt' "$OUT/qwen35-turns.json")
nice "$KVTIER" bench -m "$H" -t "$THREADS" -p "$LAST" -n 1 -r 1 --prompt-cache 0 --json 2>/dev/null > "$OUT/qwen35-cold-last.json"
COLD_LAST=$(jq '.ttft_cold_ms // (1000 * .n_prompt / .prefill_tps)' "$OUT/qwen35-cold-last.json")
jq -r --argjson cl "$COLD_LAST" --argjson last "$LAST" '
  (.turns[0].ttft_ms / .turns[0].n_prompt) as $c1 |
  "| turn | prompt | reused | from | new tokens | TTFT ms | cold est. ms | speedup | bound prompt/new |",
  "|---|---|---|---|---|---|---|---|---|",
  (.turns | to_entries[] | .key as $k | .value as $t |
   (if $t.n_prompt == $last then $cl else $c1 * $t.n_prompt end) as $cold |
   "| \($k+1) | \($t.n_prompt) | \($t.n_reused) | \($t.from) | \($t.n_prompt - $t.n_reused) | \($t.ttft_ms) | \($cold|round) | \(($cold / $t.ttft_ms)*10|round/10)x | \(($t.n_prompt / ([$t.n_prompt - $t.n_reused,1]|max))*10|round/10)x |")' \
  "$OUT/qwen35-turns.json" | tee "$OUT/qwen35-turns.md"
echo "cold prefill of the last turn's $LAST-token prompt: $COLD_LAST ms (measured; other turns' cold = turn 1 ms/token x prompt)" | tee -a "$OUT/qwen35-turns.md"
