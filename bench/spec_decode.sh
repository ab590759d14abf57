#!/usr/bin/env bash
# bench/spec_decode.sh — speculative decoding on the trained pair (issue 29, docs/speculative.md
# "Figures"): `kvtier bench` decode tok/s without a draft and with it at --draft-max 4, 8, 16 and
# --draft-p-min P_MINS, on text (--prompt-text data/models/heldout.txt: repetition r's prompt is
# tokens [r*p, (r+1)*p) of it), greedy; all configurations interleaved, ROUNDS rounds, medians.
#   TARGET DRAFT THREADS (1) P (64) N (128) REPS (3) ROUNDS (3) P_MINS ("0.75 0") DRAFT_MAXES ("4 8 16")
#   KVTIER
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
TARGET=${TARGET:-data/models/kjv-target-q8_0.gguf}
DRAFT=${DRAFT:-data/models/kjv-draft-q8_0.gguf}
THREADS=${THREADS:-1}
P=${P:-64}
N=${N:-128}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-3}
P_MINS=${P_MINS:-0.75 0}
DRAFT_MAXES=${DRAFT_MAXES:-4 8 16}
W=$(mktemp -d /tmp/kvtier-spec-decode.XXXXXX)
trap 'rm -rf "$W"' EXIT
configs=("none")
for pm in $P_MINS; do for dm in $DRAFT_MAXES; do configs+=("$dm:$pm"); done; done
for r in $(seq 1 "$ROUNDS"); do
  for c in "${configs[@]}"; do
    args=()
    [ "$c" != none ] && args=(--draft-model "$DRAFT" --draft-max "${c%%:*}" --draft-p-min "${c##*:}")
    "$KVTIER" bench -m "$TARGET" -t "$THREADS" -p "$P" -n "$N" -r "$REPS" --membw-mib 0 --json \
      --prompt-text data/models/heldout.txt "${args[@]}" 2>/dev/null | tail -1 >>"$W/$c.jsonl"
  done
done
python3 - "$W" "${configs[@]}" <<'PY'
import json, statistics, sys
w, configs = sys.argv[1], sys.argv[2:]
base = None
print("| draft | --draft-max | --draft-p-min | decode tok/s (median) | vs no draft | accepted / proposed | draft time share |")
print("|---|---|---|---|---|---|---|")
for c in configs:
    rows = [json.loads(l) for l in open(f"{w}/{c}.jsonl")]
    tps = statistics.median(r["decode_tps"] for r in rows)
    if c == "none":
        base = tps
        print(f"| none | | | {tps:.1f} | 1.00x | | |")
        continue
    dm, pm = c.split(":")
    acc = sum(r["spec_accepted"] for r in rows) / len(rows)
    prop = sum(r["spec_proposed"] for r in rows) / len(rows)
    share = statistics.median(r["spec_draft_time_share"] for r in rows)
    print(f"| trained | {dm} | {pm} | {tps:.1f} | {tps / base:.2f}x | {acc:.0f} / {prop:.0f} ({100 * acc / max(prop, 1):.0f}%) | {100 * share:.0f}% |")
PY
