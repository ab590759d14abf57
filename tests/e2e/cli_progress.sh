#!/usr/bin/env bash
# cli_progress.sh — the terminal progress line of run/chat/bench (src/cli/progress.c): shown on a
# terminal (a pty) for prefill and SSD restore, erased before the text, never with --json, never
# when stdout or stderr is not a terminal, and not for work shorter than the ~1 s threshold.
# KVTIER_PROGRESS_AFTER_MS=0 lowers the threshold so the tiny model's short prefill shows it.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
command -v python3 >/dev/null || { echo "SKIP: python3 not available"; exit 77; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-progress-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
PTY="python3 $(dirname "$0")/pty_run.py 60"
export TERM=xterm
M=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 --vocab data/vocab/ggml-vocab-gpt-2.gguf -o "$M" >/dev/null 2>&1 ||
  fail "gen-model"
P=$(python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog'] * 30))")
LINE='prefill [0-9]+/[0-9]+ tokens +[0-9]+ tok/s +ETA [0-9.]+s'
has_line() { grep -Eq "$1" "$2"; }
no_progress() { ! grep -q 'ETA' "$1" && ! grep -q $'\033\[K' "$1"; }

# run on a terminal: the line appears, advances, and is erased before the text
KVTIER_PROGRESS_AFTER_MS=0 $PTY - "$KV" run -m "$M" -p "$P" -n 2 --ubatch 16 -t 2 >"$TMP/run.tty" || fail "run on a pty"
has_line "$LINE" "$TMP/run.tty" || fail "no progress line on a terminal: $(head -c 400 "$TMP/run.tty" | cat -v)"
grep -Eq 'prefill 16/[0-9]+ tokens' "$TMP/run.tty" && grep -Eq 'prefill 2[0-9][0-9]/[0-9]+ tokens' "$TMP/run.tty" ||
  fail "progress does not advance chunk by chunk"
python3 - "$TMP/run.tty" <<'EOF' || fail "progress line not erased before the generated text"
import sys
b = open(sys.argv[1], "rb").read()
last = b.rfind(b"ETA")
assert last >= 0 and b"\r\x1b[K" in b[last:], b[last:last + 80]
assert b.find(b"[prompt ") > last
EOF
ok "run on a terminal: prefill progress line, advancing, erased before the text"

# never in --json, never when stdout or stderr is not a terminal
KVTIER_PROGRESS_AFTER_MS=0 $PTY - "$KV" run -m "$M" -p "$P" -n 2 --ubatch 16 -t 2 --json >"$TMP/json.tty" || fail "run --json"
no_progress "$TMP/json.tty" || fail "progress in --json output"
KVTIER_PROGRESS_AFTER_MS=0 "$KV" run -m "$M" -p "$P" -n 2 --ubatch 16 -t 2 >"$TMP/pipe.out" 2>"$TMP/pipe.err" || fail "run piped"
no_progress "$TMP/pipe.out" && no_progress "$TMP/pipe.err" || fail "progress when not on a terminal"
KVTIER_PROGRESS_AFTER_MS=0 $PTY - sh -c "'$KV' run -m '$M' -p '$P' -n 2 --ubatch 16 -t 2 2>'$TMP/stderr.file'" >"$TMP/half.tty" ||
  fail "run with stderr redirected"
no_progress "$TMP/half.tty" && no_progress "$TMP/stderr.file" || fail "progress with stderr not a terminal"
KVTIER_PROGRESS_AFTER_MS=0 $PTY - sh -c "'$KV' run -m '$M' -p '$P' -n 2 --ubatch 16 -t 2 | cat" >"$TMP/half2.tty" ||
  fail "run with stdout piped"
no_progress "$TMP/half2.tty" || fail "progress with stdout not a terminal"
# the default threshold (~1 s): the tiny model's millisecond prefill shows nothing
$PTY - "$KV" run -m "$M" -p "$P" -n 2 --ubatch 16 -t 2 >"$TMP/short.tty" || fail "run with the default threshold"
no_progress "$TMP/short.tty" || fail "progress shown for a prefill far shorter than a second"
ok "no progress line in --json, with stdout or stderr redirected, or for short work"

# SSD restore: the second process restores the prompt from disk and shows it
"$KV" run -m "$M" -p "$P" -n 2 -t 2 --block-tokens 16 --ssd-cache "$TMP/ssd" >/dev/null 2>&1 || fail "run (fill SSD)"
KVTIER_PROGRESS_AFTER_MS=0 $PTY - "$KV" run -m "$M" -p "$P" -n 2 -t 2 --block-tokens 16 --ssd-cache "$TMP/ssd" \
  >"$TMP/restore.tty" || fail "run (restore)"
grep -q 'reused [1-9][0-9]* (ssd)' "$TMP/restore.tty" || fail "second run did not restore from SSD: $(tail -c 300 "$TMP/restore.tty")"
grep -Eq 'restore [0-9]+/[0-9]+ tokens +[0-9]+ tok/s' "$TMP/restore.tty" || fail "no restore progress line"
ok "SSD restore shows its own progress line"

# chat and bench
printf '%s\n/quit\n' "$P" >"$TMP/chat.in"
KVTIER_PROGRESS_AFTER_MS=0 $PTY "$TMP/chat.in" "$KV" chat -m "$M" -n 2 --ubatch 16 -t 2 >"$TMP/chat.tty" || fail "chat on a pty"
has_line "$LINE" "$TMP/chat.tty" || fail "chat: no progress line: $(head -c 400 "$TMP/chat.tty" | cat -v)"
KVTIER_PROGRESS_AFTER_MS=0 $PTY - "$KV" bench -m "$M" -p 128 -n 2 -r 1 --ubatch 16 -t 2 >"$TMP/bench.tty" || fail "bench on a pty"
has_line "$LINE" "$TMP/bench.tty" || fail "bench: no progress line"
KVTIER_PROGRESS_AFTER_MS=0 $PTY - "$KV" bench -m "$M" -p 128 -n 2 -r 1 --ubatch 16 -t 2 --json >"$TMP/benchj.tty" ||
  fail "bench --json on a pty"
no_progress "$TMP/benchj.tty" || fail "bench --json shows progress"
ok "chat and bench show it on a terminal; bench --json does not"
