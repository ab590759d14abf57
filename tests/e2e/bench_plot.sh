#!/usr/bin/env bash
# e2e: bench/plot, the plots of docs/benchmarks.md. `bench/plot --check` draws every plot from the
# committed bench/results/*.json into a temporary directory and verifies each PNG (written,
# non-empty, 800x450, under 100 KB); a missing, corrupt or incomplete result file makes it fail and
# name the plot; two draws from the same results give the same bytes; every plot is shown on
# docs/benchmarks.md and committed under docs/img/, and the README's picture exists.
# Without Debian's python3-matplotlib (scripts/install-deps) it exits 77, a failure under CI=true.
set -u
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-plot-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok()   { echo "ok   $*"; }
bad()  { echo "FAIL $*"; fails=$((fails+1)); }
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  { echo "skipped: missing dependency: python3-matplotlib for /usr/bin/python3 (scripts/install-deps)"; exit 77; }
PLOTS="bench-ttft-ctx.png bench-throughput.png bench-kv-quality.png bench-batching.png bench-agent-turns.png"

# 1. the committed results draw every plot
if bench/plot --check > "$T/check.out" 2>&1 && grep -q '^bench/plot --check: 5 plots, 0 problems$' "$T/check.out"; then
  ok "--check on bench/results"
else
  bad "--check on bench/results: $(cat "$T/check.out")"
fi

# 2. a plain draw writes exactly the five PNGs into --out, and a second draw gives the same bytes
mkdir -p "$T/a" "$T/b"
bench/plot --out "$T/a" > /dev/null 2>&1 && bench/plot --out "$T/b" > /dev/null 2>&1 || bad "draw into --out failed"
[ "$(cd "$T/a" && ls | sort | tr '\n' ' ')" = "$(echo $PLOTS | tr ' ' '\n' | sort | tr '\n' ' ')" ] &&
  ok "--out holds the five PNGs" || bad "--out holds: $(ls "$T/a")"
same=1
for p in $PLOTS; do
  cmp -s "$T/a/$p" "$T/b/$p" || { bad "$p differs between two draws of the same results"; same=0; }
done
[ $same = 1 ] && ok "redraw is byte-identical"

# 3. bad result files: --check fails and names the plot and the file; the other plots still draw
mkres() { rm -rf "$T/r"; cp -r bench/results "$T/r"; }
expect_fail() { # WHAT PLOT-NAME: bench/plot --check on $T/r must fail, naming PLOT-NAME
  if bench/plot --check --results "$T/r" > "$T/bad.out" 2>&1; then
    bad "$1: --check passed"
  elif ! grep -q "^bench/plot: $2 skipped" "$T/bad.out"; then
    bad "$1: no 'skipped' line for $2: $(cat "$T/bad.out")"
  elif ! grep -q '^bench/plot --check: 5 plots, 2 problems$' "$T/bad.out"; then
    bad "$1: expected exactly that plot to be missing: $(cat "$T/bad.out")"
  else
    ok "$1"
  fi
}
mkres; rm "$T/r/ttft-ctx.json"; expect_fail "missing ttft-ctx.json" ttft_ctx
mkres; echo '{"points": [' > "$T/r/batching.json"; expect_fail "corrupt batching.json" batching
mkres; echo '{"date": "x"}' > "$T/r/ttft-ctx.json"; expect_fail "ttft-ctx.json without points" ttft_ctx
mkres; jq '.results |= map(del(.kl_mean))' bench/results/kv-quality-peaked.json > "$T/r/kv-quality-peaked.json"
expect_fail "kv-quality-peaked.json without kl_mean" kv_quality
mkres; echo '[]' > "$T/r/core-f16.json"; expect_fail "core-f16.json not an object" throughput
mkres; jq 'del(.streams_1, .streams_4, .streams_8)' bench/results/batching.json > "$T/r/batching.json"
expect_fail "batching.json without streams" batching
mkres; echo '{"turns": []}' > "$T/r/qwen35-turns.json"; expect_fail "qwen35-turns.json without turns" agent_turns

# 4. the page shows every plot and the PNGs are committed; the README's picture exists
for p in $PLOTS; do
  grep -q "](img/$p)" docs/benchmarks.md && [ -s "docs/img/$p" ] && ok "docs/benchmarks.md shows committed img/$p" ||
    bad "docs/benchmarks.md does not show img/$p, or docs/img/$p is missing"
done
img=$(grep -o '](docs/img/bench-[a-z-]*\.png)' README.md | head -1 | sed 's/^](//; s/)$//')
[ -n "$img" ] && [ -s "$img" ] && ok "README shows $img" || bad "README shows no committed bench plot"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all bench_plot checks passed"
