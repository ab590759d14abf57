#!/bin/sh
# bench/prefill_compare.sh — pp/tg throughput of two kvtier binaries side by side (e.g. main before
# vs this branch after), alternating runs so machine load hits both alike, medians of R runs.
#   bench/prefill_compare.sh BEFORE_BIN AFTER_BIN [R=3] [THREADS=2] [TYPES="q8_0 f16 q4_k"] [SHAPE=smol-135m]
# Models are generated with AFTER_BIN gen-model into models/ (git-ignored) if missing. Env: P (512),
# N (128). Output: one markdown row per type: pp median before/after, tg median before/after.
set -eu
B=$1; A=$2; R=${3:-3}; T=${4:-2}; TYPES=${5:-"q8_0 f16 q4_k"}; SHAPE=${6:-smol-135m}
P=${P:-512}; N=${N:-128}
export KVT_VOCAB_DIR=${KVT_VOCAB_DIR:-$(pwd)/data/vocab}
mkdir -p models
med() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'; }
one() { # bin model -> "pp tg"
    nice "$1" bench -m "$2" -p "$P" -n "$N" -r 1 -t "$T" 2>/dev/null |
        awk -F'|' -v p="pp$P" -v n="tg$N" '{gsub(/ /,"",$5); gsub(/ /,"",$6)} $5==p{pp=$6} $5==n{tg=$6} END{print pp, tg}'
}
echo "| $SHAPE | threads | pp$P before | pp$P after | tg$N before | tg$N after |"
echo "|---|---|---|---|---|---|"
for ty in $TYPES; do
    m=models/$SHAPE-$ty.gguf
    [ -f "$m" ] || "$A" gen-model --shape "$SHAPE" --type "$ty" -o "$m" >/dev/null
    : >/tmp/pc.$$.b; : >/tmp/pc.$$.a
    i=0
    while [ $i -lt "$R" ]; do
        one "$B" "$m" >>/tmp/pc.$$.b
        one "$A" "$m" >>/tmp/pc.$$.a
        i=$((i + 1))
    done
    echo "| $ty | $T | $(cut -d' ' -f1 /tmp/pc.$$.b | med) | $(cut -d' ' -f1 /tmp/pc.$$.a | med) |" \
         "$(cut -d' ' -f2 /tmp/pc.$$.b | med) | $(cut -d' ' -f2 /tmp/pc.$$.a | med) |"
    rm -f /tmp/pc.$$.b /tmp/pc.$$.a
done
