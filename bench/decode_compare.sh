#!/bin/bash
# bench/decode_compare.sh — decode tok/s and the fraction of measured memory bandwidth, side by side
# in one run: this tree's kvtier, a base kvtier (another build, e.g. of main) and optionally a peer
# engine's llama-bench, interleaved per (model, threads), ROUNDS rounds; then (DEPTH > 0) decode at
# depth DEPTH vs depth 0 on DEPTH_MODEL (the peer too: llama-bench -gp, which ik_llama.cpp has),
# and (BATCH_BASE/BATCH_NEW set) the batched step ratio.
#   BASE=/tmp/kv-base/build/kvtier PEER="PATH/TO/peers/run ik" MODELS="a.gguf b.gguf" \
#     bench/decode_compare.sh > out.txt
# PEER_NODE=DIR adds llama.cpp through the npm package node-llama-cpp installed in DIR
# (bench/peer_node_llama.mjs), for CPUs the prebuilt peers do not run on.
# Env: ROUNDS (2) N (32 decoded tokens) THREADS ("1 2") DEPTH (16384) DEPTH_MODEL DEPTH_N (64)
#      BATCH_BASE BATCH_NEW (bench/batch_step binaries) BATCH_MODEL.
# Decode of kvtier runs with KVT_REPACK=gemv (REPACK_NEW): only the single-row GEMV copy decode
# reads is made, not the prefill GEMM copies, so each load takes seconds instead of a minute on a
# busy 2-core machine; the base with REPACK_BASE (default 0: builds before the GEMV copy treat any
# other value as "repack everything"). The same build as its own base without the GEMV copy:
#   BASE="env KVT_GEMV_ILV=0 build/kvtier" REPACK_BASE=gemv MODELS=... bench/decode_compare.sh
# Every line
# printed is "RESULT engine model threads tps" (or DEPTH / MEMBW / BATCH lines) for the summary.
set -u
NEW=${NEW:-build/kvtier}
BASE=${BASE:-}
PEER=${PEER:-}
PEER_NODE=${PEER_NODE:-}
ROUNDS=${ROUNDS:-2}
N=${N:-32}
THREADS=${THREADS:-"1 2"}
PEER_THREADS=${PEER_THREADS:-$THREADS}
DEPTH=${DEPTH:-16384}
DEPTH_N=${DEPTH_N:-64}
REPACK_NEW=${REPACK_NEW:-gemv}
REPACK_BASE=${REPACK_BASE:-0}
echo "LOAD start $(uptime)"
for r in $(seq 1 "$ROUNDS"); do
  for m in $MODELS; do
    for t in $THREADS; do
      # alternate which kvtier build goes first (the first run after a model switch or the
      # bandwidth probe meets colder caches)
      order="new base peer node"; [ $(( (r + t) % 2 )) -eq 1 ] && order="base new node peer"
      for eng in $order; do
        case $eng in
          new) tps=$(KVT_REPACK=$REPACK_NEW $NEW bench -m "$m" -t "$t" -p 16 -n "$N" -r 1 --json --membw-mib 0 2>/dev/null | grep -o '"decode_tps":[0-9.]*' | cut -d: -f2) ;;
          base) [ -n "$BASE" ] || continue
                tps=$(KVT_REPACK=$REPACK_BASE $BASE bench -m "$m" -t "$t" -p 16 -n "$N" -r 1 --json 2>/dev/null | grep -o '"decode_tps":[0-9.]*' | cut -d: -f2) ;;
          peer) [ -n "$PEER" ] || continue
                case " $PEER_THREADS " in *" $t "*) ;; *) continue ;; esac
                tps=$($PEER llama-bench -m "$m" -t "$t" -p 0 -n "$N" -r 1 -o json 2>/dev/null | grep -o '"avg_ts": *[0-9.]*' | head -1 | grep -o '[0-9.]*$') ;;
          node) [ -n "$PEER_NODE" ] || continue
                tps=$(node bench/peer_node_llama.mjs "$PEER_NODE" "$m" "$t" "$N" 2>/dev/null | grep -o '"decode_tps":[0-9.]*' | cut -d: -f2) ;;
        esac
        echo "RESULT $eng $(basename "$m" .gguf) $t ${tps:-fail} round=$r"
      done
      echo "MEMBW $t $($NEW bench --membw -t "$t" -r 3 --membw-mib 512 --json 2>/dev/null | grep -o '"read_gbs":[0-9.]*' | cut -d: -f2) round=$r"
    done
  done
done
for m in $MODELS; do
  echo "BYTES $(basename "$m" .gguf) $(KVT_REPACK=$REPACK_NEW $NEW bench -m "$m" -t 1 -p 16 -n 2 -r 1 --json --membw-mib 16 2>/dev/null | grep -o '"decode_weight_bytes":[0-9]*,"decode_kv_bytes_per_token":[0-9]*')"
done
if [ "$DEPTH" -gt 0 ] && [ -n "${DEPTH_MODEL:-}" ]; then
  for r in $(seq 1 "$ROUNDS"); do
    for eng in new base peer; do
      if [ $eng = peer ]; then # ik_llama.cpp's llama-bench: -gp PP,TG times TG tokens after a PP prompt
        [ -n "$PEER" ] || continue
        d0=$($PEER llama-bench -m "$DEPTH_MODEL" -t 2 -p 0 -n "$DEPTH_N" -r 1 -o json 2>/dev/null | grep -o '"avg_ts": *[0-9.]*' | head -1 | grep -o '[0-9.]*$')
        dd=$($PEER llama-bench -m "$DEPTH_MODEL" -t 2 -p 0 -n 0 -gp "$DEPTH,$DEPTH_N" -r 1 -o json 2>/dev/null | grep -o '"avg_ts": *[0-9.]*' | head -1 | grep -o '[0-9.]*$')
        echo "DEPTH peer $(basename "$DEPTH_MODEL" .gguf) tg${DEPTH_N}@0=${d0:-fail} tg${DEPTH_N}@$DEPTH=${dd:-fail} round=$r"
        continue
      fi
      B=$NEW RP=$REPACK_NEW; [ $eng = base ] && B=$BASE RP=$REPACK_BASE
      [ -n "$B" ] || continue
      d0=$(KVT_REPACK=$RP $B bench -m "$DEPTH_MODEL" -t 2 -p 16 -n "$DEPTH_N" -r 1 --json 2>/dev/null | grep -o '"decode_tps":[0-9.]*' | cut -d: -f2)
      dd=$($B bench -m "$DEPTH_MODEL" -t 2 --decode-at "$DEPTH" -n "$DEPTH_N" -r 1 --prompt-cache 0 --json 2>/dev/null | grep -o '"decode_tps":[0-9.]*' | cut -d: -f2)
      echo "DEPTH $eng $(basename "$DEPTH_MODEL" .gguf) tg${DEPTH_N}@0=${d0:-fail} tg${DEPTH_N}@$DEPTH=${dd:-fail} round=$r"
    done
  done
fi
if [ -n "${BATCH_NEW:-}" ]; then
  for r in $(seq 1 "$ROUNDS"); do
    for eng in new base; do
      B=$BATCH_NEW; [ $eng = base ] && B=${BATCH_BASE:-}
      [ -n "$B" ] || continue
      echo "BATCH $eng round=$r"; $B "$BATCH_MODEL" 2 "1 8" 200 16 2>&1 | tail -3
    done
  done
fi
echo "LOAD end $(uptime)"
