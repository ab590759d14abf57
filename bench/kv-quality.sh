#!/usr/bin/env bash
# bench/kv-quality.sh — issue 14's codec table: kv8, kv4 (g32/g64), turbo k8v3/k4v4/k4v3/k4v2 vs f16 KV:
# bytes/token, top-1 agreement, mean and p99 KL over N teacher-forced tokens, and decode t/s at depth
# CTX (all codecs side by side, median of R rounds).
#   trained: the trained target (data/models/kjv-target-f16.gguf, f16 weights so that only the KV
#            codec varies) on the held-out KJV text: prompt = its first TP tokens, then TN steps each
#            fed the text's next token (TP + TN within the 512-token training context), plus
#            `kvtier perplexity` per codec over PPL_CHUNKS windows of 512 of the held-out text.
#            The decode timing at CTX=4096 runs past the model's 512-token training context: it
#            measures speed only.
#   peaked, flat: the smol-135m shape from gen-model (random weights), random-token prompts.
# Writes bench/results/kv-quality-KIND.{md,json}.
#   KINDS="trained peaked flat" N=128 TP=64 TN=440 PPL_CHUNKS=16 CTX=4096 R=3 DEC_N=16 THREADS=2 bench/kv-quality.sh
# SPEED_ONLY=1: only the decode timing (--kv-quality 1 -p 16: a token of scoring), on the peaked file;
# on a loaded machine use more, shorter rounds (R=9 DEC_N=8).
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
N=${N:-128} CTX=${CTX:-4096} R=${R:-3} DEC_N=${DEC_N:-16} THREADS=${THREADS:-2}
TP=${TP:-64} TN=${TN:-440} PPL_CHUNKS=${PPL_CHUNKS:-16}
CODECS=${CODECS:-8,4:g32,4:g64,turbo,turbo:k4v4,turbo:k4v3,turbo:k4v2}
mkdir -p models bench/results
KINDS=${KINDS:-trained peaked flat} QN=$N QP=1024
if [[ " $KINDS " == *" trained "* ]] && [ "${SPEED_ONLY:-0}" != 1 ]; then
    M=data/models/kjv-target-f16.gguf T=data/models/heldout.txt
    nice "$KVTIER" bench -m $M -t "$THREADS" --kv-quality "$TN" -p "$TP" --kv-quality-text $T --kv-quality-ctx "$CTX" \
        -r "$R" -n "$DEC_N" --kv-codecs "$CODECS" --json 2>/dev/null > bench/results/kv-quality-trained.json
    : > bench/results/kv-quality-trained-ppl.jsonl
    for c in off ${CODECS//,/ }; do
        mode=${c%%:g*}; grp=(); [[ $c == *:g* ]] && grp=(--kv-quant-group "${c##*:g}")
        nice "$KVTIER" perplexity -m $M -f $T --ctx 512 --chunks "$PPL_CHUNKS" -t "$THREADS" --kv-quant "$mode" "${grp[@]}" \
            --json 2>/dev/null | jq -c --arg c "$c" '. + {codec: $c}' >> bench/results/kv-quality-trained-ppl.jsonl
    done
    jq -s '.' bench/results/kv-quality-trained-ppl.jsonl > bench/results/kv-quality-trained-ppl.json
    rm -f bench/results/kv-quality-trained-ppl.jsonl
    jq -r --slurpfile p bench/results/kv-quality-trained-ppl.json '
        def ppl($c): ($p[0][] | select(.codec == $c) | .ppl * 10000 | round / 10000);
        "| scheme | ppl (held-out) | bytes/token | x f16 | top-1 | mean KL | p99 KL | decode t/s @\(.speed_ctx) | x f16 | CPU ms/token | x f16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        "| \(.reference) | \(ppl("off")) | \(.reference_bytes_per_token) | 1.000 | 100% | 0 | 0 | \(.reference_decode_tps) | 1.000 | \(.reference_decode_cpu_ms_per_token) | 1.000 |",
        (.results[] | if .error then "| \(.kv_quant) | skipped: \(.error) |" else
         "| \(.scheme) | \(ppl(.kv_quant)) | \(.bytes_per_token) | \(.bytes_ratio) | \(.rate*1000|round/10)% | \(.kl_mean) | \(.kl_p99) | \(.decode_tps) | \(.decode_ratio) | \(.decode_cpu_ms_per_token) | \(.cpu_ratio) |" end)' \
        bench/results/kv-quality-trained.json > bench/results/kv-quality-trained.md
    cat bench/results/kv-quality-trained.md
fi
KINDS=${KINDS//trained/}
[[ " $KINDS " == *" peaked "* ]] && [ ! -f models/smol-peaked.gguf ] && "$KVTIER" gen-model --shape smol-135m --peaked -o models/smol-peaked.gguf
[[ " $KINDS " == *" flat "* ]] && [ ! -f models/smol-flat.gguf ] && "$KVTIER" gen-model --shape smol-135m -o models/smol-flat.gguf
[ "${SPEED_ONLY:-0}" = 1 ] && KINDS=peaked QN=1 QP=16
[ -n "${KINDS// /}" ] || exit 0
SUF=""
[ "${SPEED_ONLY:-0}" = 1 ] && SUF=-speed
for kind in $KINDS; do
    nice "$KVTIER" bench -m models/smol-$kind.gguf -t "$THREADS" --kv-quality "$QN" -p "$QP" --kv-quality-ctx "$CTX" \
        -r "$R" -n "$DEC_N" --kv-codecs "$CODECS" --json 2>/dev/null > bench/results/kv-quality-$kind$SUF.json
    jq -r '"| scheme | bytes/token | x f16 | top-1 | mean KL | p99 KL | decode t/s @\(.speed_ctx) | x f16 | CPU ms/token | x f16 |",
           "|---|---|---|---|---|---|---|---|---|---|",
           "| \(.reference) | \(.reference_bytes_per_token) | 1.000 | 100% | 0 | 0 | \(.reference_decode_tps) | 1.000 | \(.reference_decode_cpu_ms_per_token) | 1.000 |",
           (.results[] | if .error then "| \(.kv_quant) | skipped: \(.error) |" else
            "| \(.scheme) | \(.bytes_per_token) | \(.bytes_ratio) | \(.rate*1000|round/10)% | \(.kl_mean) | \(.kl_p99) | \(.decode_tps) | \(.decode_ratio) | \(.decode_cpu_ms_per_token) | \(.cpu_ratio) |" end)' \
        bench/results/kv-quality-$kind$SUF.json > bench/results/kv-quality-$kind$SUF.md
    cat bench/results/kv-quality-$kind$SUF.md
done
