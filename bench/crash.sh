#!/usr/bin/env bash
# bench/crash.sh [N] [SEED] — the crash-at-random-points campaign (issue 10): N (default 200)
# kill -9 trials of a real server during write-behind, checkpointing, flush and demotion, each
# followed by restart, `kvtier cache verify`, output == uncached run, flushed prefixes reused.
# The CI version (tests/e2e/crash.sh) runs 20. Runs niced; prints one summary line.
set -eu
BUILD=${BUILD:-build}
N=${1:-200}
SEED=${2:-$RANDOM}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-crash-XXXXXX")
trap 'rm -rf "$T"' EXIT
"$BUILD/kvtier" gen-model --arch llama --shape tiny --type f16 -o "$T/m.gguf" >/dev/null
echo "seed $SEED, $N trials"
nice python3 "$(dirname "$0")/../tests/e2e/crash.py" "$BUILD/kvtier" "$T/m.gguf" "$T/work" "$N" "$SEED"
