#!/usr/bin/env bash
# bench/crash.sh [N] [SEED] [ARCH] [SERVER_ARG...] — the crash-at-random-points campaign (issue 10):
# N (default 200) kill -9 trials of a real server during write-behind, checkpointing, flush and
# demotion, each followed by restart, `kvtier cache verify`, output == uncached run, flushed
# prefixes reused. ARCH (default llama) picks the tiny gen-model architecture (qwen35 is the
# hybrid recurrent one); SERVER_ARGs go to every server (e.g. --parallel 4: concurrent jobs and
# concurrent prefills at the crash). The CI version (tests/e2e/crash.sh) runs 20. Runs niced;
# prints one summary line.
set -eu
BUILD=${BUILD:-build}
N=${1:-200}
SEED=${2:-$RANDOM}
ARCH=${3:-llama}
shift $(( $# < 3 ? $# : 3 ))
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-crash-XXXXXX")
trap 'rm -rf "$T"' EXIT
"$BUILD/kvtier" gen-model --arch "$ARCH" --shape tiny --type f16 -o "$T/m.gguf" >/dev/null
echo "seed $SEED, $N trials, $ARCH, server args: ${*:-none}"
nice python3 "$(dirname "$0")/../tests/e2e/crash.py" "$BUILD/kvtier" "$T/m.gguf" "$T/work" "$N" "$SEED" "$@"
