#!/usr/bin/env bash
# e2e: kill -9 a real server at random points (write-behind, checkpointing, flush, demotion) and
# check after each restart: start-up succeeds, `kvtier cache verify` is clean, outputs equal an
# uncached run (checkpoint resumes included), prompts acknowledged by a 200 flush are reused.
# CRASH_TRIALS (default 20) trials; bench/crash.sh runs 200+. Driver: tests/e2e/crash.py.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3 (scripts/install-deps)"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-crash-XXXXXX")
trap 'rm -rf "$T"' EXIT
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$T/m.gguf" >/dev/null || { echo "FAIL: gen-model"; exit 1; }
python3 "$(dirname "$0")/crash.py" "$KV" "$T/m.gguf" "$T/work" "${CRASH_TRIALS:-20}" "${CRASH_SEED:-$RANDOM}"
