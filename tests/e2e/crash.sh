#!/usr/bin/env bash
# e2e: kill -9 a real server at random points (write-behind, checkpointing, flush, demotion) and
# check after each restart: start-up succeeds, `kvtier cache verify` is clean, outputs equal an
# uncached run (checkpoint resumes included), prompts acknowledged by a 200 flush are reused.
# CRASH_TRIALS (default 20) trials, then CRASH_DRAFT_TRIALS (default 5) with a draft model (speculative
# rounds at the crash); bench/crash.sh runs 200+. Driver: tests/e2e/crash.py.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3 (scripts/install-deps)"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-crash-XXXXXX")
trap 'rm -rf "$T"' EXIT
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$T/m.gguf" >/dev/null || { echo "FAIL: gen-model"; exit 1; }
python3 "$(dirname "$0")/crash.py" "$KV" "$T/m.gguf" "$T/work" "${CRASH_TRIALS:-20}" "${CRASH_SEED:-$RANDOM}" || exit 1
# speculative decoding (issue 29): a kill -9 during speculative rounds, with the draft's state in its
# own tiers and checkpoints saved at round ends; the draft is a copy of the target (proposals
# accepted and rejected by the sampled jobs' draws), the reference server runs with it too
cp "$T/m.gguf" "$T/draft.gguf"
python3 "$(dirname "$0")/crash.py" "$KV" "$T/m.gguf" "$T/work-draft" "${CRASH_DRAFT_TRIALS:-5}" "${CRASH_SEED:-$RANDOM}" \
  --draft-model "$T/draft.gguf" --draft-max 4 --draft-p-min 0
