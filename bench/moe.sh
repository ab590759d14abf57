#!/usr/bin/env bash
# bench/moe.sh — issue 12's closing benchmarks for the mixture-of-experts / latent-attention
# architectures, on gen-model files of realistic width (docs/models.md, docs/benchmarks.md):
#   1. KV bytes/token: deepseek2-lite's latent cache (the engine's layout) vs the expanded K/V the
#      same attention would cache (n_head x (key_length + value_length) x 2 bytes per layer);
#   2. pp512 / tg128 (kvtier bench, -r reps, medians) for qwen3moe-30b-a3b and deepseek2-lite
#      shapes at Q8_0 and Q4_K, 2 threads;
#   3. restart TTFT for a 7000-token prompt on deepseek2-lite Q8_0: a cold cached run fills the SSD
#      tier and flushes; new processes restore it from disk (SSD_RESTORES times); the SSD bytes
#      (the tier's own count) against the latent bytes of the blocks it holds;
#   4. MLA prefill attention per chunk, absorbed vs expanded (bench/mla_prefill.c, 1 thread);
#   5. deepseek2-lite Q8_0 prefill through the forward pass under --mla-prefill absorbed | expanded |
#      auto (bench/mla_modes.c: pp512, pp4096 in 512-token chunks, the last 512 and 64 tokens of a
#      4096 context; THREADS threads, REPS alternating repetitions).
# The realistic shapes keep 4 layers (LAYERS) of Qwen3-30B-A3B's 48 and DeepSeek-V2-Lite's 27 so
# that the files (1.2-2.9 GB) fit in memory; per-layer figures scale to the full depth.
# Writes $OUT_DIR/moe.json and $OUT_DIR/moe.md. Env: KVTIER, THREADS, LAYERS, REPS, SSD_P,
# SSD_RESTORES, MODELS_DIR, OUT_DIR. Run under `nice` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-4}
REPS=${REPS:-3}
SSD_P=${SSD_P:-7000}
SSD_RESTORES=${SSD_RESTORES:-3}
MODELS_DIR=${MODELS_DIR:-models}
OUT_DIR=${OUT_DIR:-bench/results}
WORK_DIR=$(mktemp -d /tmp/kvtier-moe-bench.XXXXXX)
trap 'rm -rf "$WORK_DIR"' EXIT
mkdir -p "$OUT_DIR" "$MODELS_DIR"
log() { echo "[moe.sh] $*" >&2; }

model() { # model SHAPE TYPE -> path (generated once; --peaked so the same files serve quality runs)
    local p="$MODELS_DIR/$1-$2-l$LAYERS-peaked.gguf"
    [ -f "$p" ] || "$KVTIER" gen-model --shape "$1" --type "$2" --layers "$LAYERS" --peaked -o "$p" >&2
    echo "$p"
}

# 1. bytes per token
DS=$(model deepseek2-lite q8_0)
latent_bpt=$("$KVTIER" bench -m "$DS" -t "$THREADS" --json --once -p 16 -n 1 2>/dev/null | jq -s '.[0].kv_bytes_per_token_layout // .[1].kv_bytes_per_token_layout')
# expanded: 16 heads x (192 + 128) values x 2 bytes, per layer
expanded_bpt=$(( LAYERS * 16 * (192 + 128) * 2 ))
log "bytes/token: latent $latent_bpt, expanded $expanded_bpt"

# 2. throughput
: > "$WORK_DIR/tp.jsonl"
for shape in qwen3moe-30b-a3b deepseek2-lite; do
    for type in q8_0 q4_k; do
        m=$(model "$shape" "$type")
        log "pp512/tg128 $shape $type"
        "$KVTIER" bench -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" --json 2>/dev/null |
            jq -c --arg s "$shape" --arg t "$type" '. + {shape: $s, type: $t}' >> "$WORK_DIR/tp.jsonl"
        tail -1 "$WORK_DIR/tp.jsonl" >&2
    done
done

# 3. restart TTFT on the SSD tier
D="$WORK_DIR/ssd"
log "cold $SSD_P-token prompt (fills the SSD tier)"
"$KVTIER" bench -m "$DS" -t "$THREADS" --json --once -p "$SSD_P" -n 1 --ssd-cache "$D" 2>/dev/null | jq -s -c 'add' > "$WORK_DIR/cold.json"
cat "$WORK_DIR/cold.json" >&2
: > "$WORK_DIR/warm.jsonl"
for i in $(seq 1 "$SSD_RESTORES"); do
    "$KVTIER" bench -m "$DS" -t "$THREADS" --json --once -p "$SSD_P" -n 1 --ssd-cache "$D" 2>/dev/null | jq -s -c 'add' >> "$WORK_DIR/warm.jsonl"
    tail -1 "$WORK_DIR/warm.jsonl" >&2
done
cache_du=$(du -sb "$D" | cut -f1)

# 4. MLA prefill microbenchmark
cc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/mla_prefill.c build/libkvtier.a -lxxhash -lm -o "$WORK_DIR/mla_prefill"
"$WORK_DIR/mla_prefill" "$REPS" > "$WORK_DIR/mla.md"

# 5. MLA prefill modes through the forward pass
cc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/mla_modes.c build/libkvtier.a -lxxhash -lm -o "$WORK_DIR/mla_modes"
"$WORK_DIR/mla_modes" "$DS" "$THREADS" "$REPS" 4096 512 64 >> "$WORK_DIR/mla.md"

jq -n --argjson latent "$latent_bpt" --argjson expanded "$expanded_bpt" --argjson layers "$LAYERS" \
    --slurpfile tp <(jq -s . "$WORK_DIR/tp.jsonl") --slurpfile cold "$WORK_DIR/cold.json" \
    --slurpfile warm <(jq -s . "$WORK_DIR/warm.jsonl") --argjson du "$cache_du" --rawfile mla "$WORK_DIR/mla.md" '
  ($warm[0] | map(.ttft_ms) | sort | .[(length / 2 | floor)]) as $wt |
  {layers: $layers, bytes_per_token: {latent: $latent, expanded: $expanded, ratio: ($latent / $expanded)},
   throughput: $tp[0], cold: $cold[0], restarts: $warm[0], restart_ttft_ms_median: $wt,
   restart_speedup: ($cold[0].ttft_ms / $wt), ssd_dir_bytes: $du,
   ssd_bytes_per_token: ($cold[0].ssd_bytes / $cold[0].n_prompt), mla_prefill: $mla}' > "$OUT_DIR/moe.json"
{
    echo "## MoE / MLA benchmarks ($LAYERS layers, $THREADS threads, median of $REPS)"
    echo
    jq -r '"KV bytes/token: latent \(.bytes_per_token.latent) vs expanded \(.bytes_per_token.expanded) (\(.bytes_per_token.ratio * 1000 | round / 1000)x)"' "$OUT_DIR/moe.json"
    echo
    echo "| shape | type | pp512 tok/s | tg128 tok/s |"
    echo "|---|---|---|---|"
    jq -r '.throughput[] | "| \(.shape) | \(.type) | \(.prefill_tps) | \(.decode_tps) |"' "$OUT_DIR/moe.json"
    echo
    jq -r '"Restart TTFT, \(.cold.n_prompt)-token prompt: cold \(.cold.ttft_ms) ms, restored from SSD \(.restart_ttft_ms_median) ms (median; \(.restart_speedup | round)x), reused \(.restarts[0].n_reused) tokens from \(.restarts[0].reused_from); SSD tier bytes \(.cold.ssd_bytes) = \(.ssd_bytes_per_token) per prompt token (latent layout \(.bytes_per_token.latent)); cache dir \(.ssd_dir_bytes) B"' "$OUT_DIR/moe.json"
    echo
    cat "$WORK_DIR/mla.md"
} > "$OUT_DIR/moe.md"
cat "$OUT_DIR/moe.md"
