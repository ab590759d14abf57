#!/usr/bin/env bash
# hybrid_retry.sh — an identical retry of a hybrid recurrent model (qwen35: DeltaNet state, which
# cannot be cut back) reuses n-1 prompt tokens, in RAM (--repeat) and from SSD after a restart (a
# new process), with the output of a cold run (issue 28 item 5: the prefill takes a state snapshot
# at n-1). Prompts of 24 tokens (one block) and ~300 tokens (several blocks, beside the periodic
# snapshots). Outputs are SAMPLED (temperature 1, fixed seed): a random-weight model's greedy
# output hardly depends on the state, sampling turns every logit difference into other tokens.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-retry-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3 (scripts/install-deps)"; exit 77; }
[ -x "$KV" ] || fail "$KV not built"
M=$TMP/q35.gguf
"$KV" gen-model --arch qwen35 --shape tiny --type f16 --peaked -o "$M" >/dev/null 2>&1 || fail "gen-model qwen35"

SHORT="The quick brown fox jumps over the lazy dog and then it runs far away into the forest where nobody can find it again"
LONG=$(python3 -c "print(' '.join('word%d' % (i * 7 % 97) for i in range(150)))")
for name in SHORT LONG; do
  P=${!name}
  run() { "$KV" run -m "$M" -p "$P" -n 12 --temp 1 --seed 5 --json "$@" 2>/dev/null; }
  run --no-cache >"$TMP/cold.json" || fail "$name: cold run"
  run --repeat 2 >"$TMP/ram.json" || fail "$name: --repeat 2"
  run --ssd-cache "$TMP/ssd-$name" >"$TMP/ssd1.json" || fail "$name: ssd run 1"
  run --ssd-cache "$TMP/ssd-$name" >"$TMP/ssd2.json" || fail "$name: ssd run 2 (restart)"
  python3 - "$TMP" "$name" <<'PY' || fail "$name: retry reuse"
import json, sys
d, name = sys.argv[1], sys.argv[2]
load = lambda f: [json.loads(l) for l in open(f"{d}/{f}") if l.strip()]
cold, = load("cold.json")
ram = load("ram.json")
ssd1, = load("ssd1.json")
ssd2, = load("ssd2.json")
n = cold["n_prompt"]
assert n > 1 and ram[0]["n_reused"] == 0 and ssd1["n_reused"] == 0, (ram[0], ssd1)
assert ram[1]["n_reused"] == n - 1 and ram[1]["reused_from"] == "ram", ram[1]
assert ssd2["n_reused"] == n - 1 and ssd2["reused_from"] == "ssd", ssd2
for r in (ram[0], ram[1], ssd1, ssd2):
    assert r["tokens"] == cold["tokens"], (name, r["tokens"], cold["tokens"])
print(f"{name}: n={n}, retry reused {n - 1} from RAM and from SSD, output = cold")
PY
  ok "$name prompt: identical retry reuses n-1 (RAM and SSD after restart), output identical to cold"
done
