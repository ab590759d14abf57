#!/usr/bin/env bash
# cli.sh — end-to-end checks of the kvtier CLI on a tiny generated model: run (text, ids, --chat,
# --json, --repeat cache reuse), chat (piped multi-turn shows reuse), tokenize, bench, SSD tier
# restart through `run` + `kvtier cache ls|verify|inspect|prune`, and usage errors.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-cli-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3 (scripts/install-deps)"; exit 77; }
M=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$M" >/dev/null 2>&1 || fail "gen-model"

# run: text prompt, timings line
out=$("$KV" run -m "$M" -p "Hello world" -n 8 -t 2 2>/dev/null) || fail "run -p"
echo "$out" | grep -q "prefill .* tok/s, decode .* tok/s" || fail "run prints timings: $out"
ok "run -p prints continuation and timings"

# run --json with token ids; deterministic greedy
j1=$("$KV" run -m "$M" --tokens 300,301,302,303 -n 6 --json 2>/dev/null) || fail "run --tokens --json"
j2=$("$KV" run -m "$M" --tokens 300,301,302,303 -n 6 --json 2>/dev/null) || fail "run --tokens --json (2)"
python3 - "$j1" "$j2" <<'PY' || fail "run --json content"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["prompt_tokens"] == [300, 301, 302, 303], a
assert len(a["tokens"]) == 6 and a["tokens"] == b["tokens"], (a, b)
for k in ("ttft_ms", "prefill_tps", "decode_tps", "peak_kv_bytes"): assert k in a["timings"], k
assert isinstance(a["text"], str)
PY
ok "run --json (ids, text, timings), deterministic greedy"

# run --json holds valid UTF-8 even when sampled byte tokens end inside a character (U+FFFD)
for seed in 1 2 3 4 5 6; do
  "$KV" run -m "$M" -p "hello" -n 64 --temp 1 --seed $seed --json >"$TMP/u$seed.json" 2>/dev/null || fail "run --json seed $seed"
done
python3 - "$TMP"/u*.json <<'PY' || fail "run --json wrote invalid UTF-8"
import json, sys
partial = 0
for f in sys.argv[1:]:
    j = json.loads(open(f, "rb").read().decode("utf-8"))  # strict: raises on invalid UTF-8
    partial += "\ufffd" in j["text"]
assert partial > 0, "no run sampled a partial character: the check proves nothing"
PY
ok "run --json: valid UTF-8 (partial characters as U+FFFD)"

# clear errors for the user's own flags: no "--kv-quant-group 0" when no group was given, no "0 MB"
"$KV" run -m "$M" -p "hello there" --kv-quant 8 -n 2 2>"$TMP/e1" && fail "--kv-quant 8 on head_dim 16 accepted"
grep -q "needs head_dim divisible by 32" "$TMP/e1" && ! grep -q "group 0" "$TMP/e1" || fail "--kv-quant 8 message: $(cat "$TMP/e1")"
"$KV" run -m "$M" -p "hello there friends of mine" --kv-pool-gb 0.000001 -n 2 2>"$TMP/e2" && fail "a 1 kB pool accepted"
grep -q "needs [0-9.]* kB of KV but the pool holds 1.00 kB" "$TMP/e2" || fail "pool message: $(cat "$TMP/e2")"
ok "errors name what the user can change (--kv-quant on head_dim 16, a tiny pool in kB)"

# --repeat: second run reuses n-1 prompt tokens from the RAM tier
r=$("$KV" run -m "$M" -p "The quick brown fox jumps over the lazy dog again and again" -n 4 --repeat 2 --json 2>/dev/null) || fail "run --repeat"
python3 - "$r" <<'PY' || fail "run --repeat reuse"
import json, sys
runs = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
assert len(runs) == 2
assert runs[0]["n_reused"] == 0 and runs[1]["n_reused"] == runs[1]["n_prompt"] - 1, runs
assert runs[1]["reused_from"] == "ram" and runs[0]["tokens"] == runs[1]["tokens"]
PY
ok "run --repeat reuses n-1 tokens from RAM with identical output"

# --chat applies the template
"$KV" run -m "$M" --chat -p "Hi" -n 4 >/dev/null 2>&1 || fail "run --chat"
ok "run --chat"

# chat: two piped turns; the second reports reused tokens > 0
printf 'Hello there\nAnd a second question\n/quit\n' | "$KV" chat -m "$M" -n 8 --temp 0 >"$TMP/chat.out" 2>"$TMP/chat.err" || fail "chat exit"
n=$(grep -c '^\[prompt ' "$TMP/chat.err")
[ "$n" = 2 ] || fail "chat: expected 2 turn summaries, got $n: $(cat "$TMP/chat.err")"
second=$(grep '^\[prompt ' "$TMP/chat.err" | sed -n 2p)
reused=$(echo "$second" | sed -E 's/.*reused ([0-9]+).*/\1/')
[ "$reused" -gt 0 ] || fail "chat second turn reused nothing: $second"
ok "chat: second turn reused $reused tokens"

# tokenize
ids=$("$KV" tokenize -m "$M" --ids "Hello world" 2>/dev/null) || fail "tokenize"
[ -n "$ids" ] || fail "tokenize printed nothing"
ok "tokenize --ids: $ids"

# bench (tiny, fast)
b=$("$KV" bench -m "$M" -p 32 -n 8 -r 1 --json 2>/dev/null) || fail "bench"
echo "$b" | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); assert d["prefill_tps"]>0 and d["decode_tps"]>0' || fail "bench json: $b"
ok "bench --json"

# SSD tier through run: process 1 writes, process 2 restores from disk
C=$TMP/cache
P="A long prompt that should survive a restart of the process because the SSD tier keeps its blocks on disk for later reuse"
a=$("$KV" run -m "$M" -p "$P" -n 6 --block-tokens 16 --ssd-cache "$C" --json 2>/dev/null) || fail "run with ssd (1)"
b=$("$KV" run -m "$M" -p "$P" -n 6 --block-tokens 16 --ssd-cache "$C" --json 2>/dev/null) || fail "run with ssd (2)"
python3 - "$a" "$b" <<'PY' || fail "ssd restart reuse"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["n_reused"] == 0, a
assert b["reused_from"] == "ssd" and b["n_reused"] >= 16, b
assert a["tokens"] == b["tokens"]
PY
ok "run --ssd-cache: restart restores from SSD with identical output"

# --ssd-spill-queue-mb: a 1 MB queue cannot hold a 256-token prompt's blocks at once (smol-135m: 1.5 MB
# a 64-token block): records are dropped from the queue (counted), stay dirty and are written later;
# the flush still makes all durable
QM=$TMP/qm.gguf
"$KV" gen-model --shape smol-135m --type q4_k -o "$QM" >/dev/null 2>&1 || fail "gen-model (queue)"
for q in 1 256; do
  "$KV" bench -m "$QM" -t 2 --once -p 256 -n 1 --block-tokens 64 --ssd-cache "$TMP/q$q" --ssd-spill-queue-mb $q --json \
    >"$TMP/q$q.json" 2>/dev/null || fail "bench --once --ssd-spill-queue-mb $q"
done
python3 - "$TMP/q1.json" "$TMP/q256.json" <<'PY' || fail "--ssd-spill-queue-mb: $(cat "$TMP/q1.json" "$TMP/q256.json")"
import json, sys
small, big = (json.load(open(f)) for f in sys.argv[1:])
assert small["ssd_dropped"] > 0 and big["ssd_dropped"] == 0, (small, big)
assert small["durable"] and small["ssd_entries"] == big["ssd_entries"] > 0, (small, big)
PY
"$KV" run -m "$QM" -p x --ssd-spill-queue-mb 0 2>"$TMP/qerr" && fail "--ssd-spill-queue-mb 0 accepted"
grep -q "ssd-spill-queue-mb" "$TMP/qerr" || fail "--ssd-spill-queue-mb 0: $(cat "$TMP/qerr")"
ok "--ssd-spill-queue-mb bounds the write-behind queue; dropped records are retried, nothing lost"
"$KV" cache ls "$C" >"$TMP/ls" 2>&1 || fail "cache ls"
grep -q "model=" "$TMP/ls" || grep -qi "entries\|files" "$TMP/ls" || fail "cache ls output: $(cat "$TMP/ls")"
"$KV" cache verify "$C" >/dev/null 2>&1 || fail "cache verify on a good dir"
f=$(find "$C" -name '*.kvb' -o -name '*.blk' | head -1)
[ -n "$f" ] || f=$(find "$C" -type f ! -name '.*' | head -1)
"$KV" cache inspect "$f" >/dev/null 2>&1 || fail "cache inspect $f"
# flip a payload byte: verify must fail, and the next run must still be correct (falls back)
sz=$(stat -c %s "$f")
printf '\xff' | dd of="$f" bs=1 seek=$((sz - 10)) conv=notrunc 2>/dev/null
"$KV" cache verify "$C" >/dev/null 2>&1 && fail "cache verify accepted a corrupt file"
c=$("$KV" run -m "$M" -p "$P" -n 6 --block-tokens 16 --ssd-cache "$C" --json 2>/dev/null) || fail "run after corruption"
python3 - "$a" "$c" <<'PY' || fail "output after corruption"
import json, sys
a, c = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["tokens"] == c["tokens"], (a, c)
PY
"$KV" cache prune "$C" --max-gb 0 >/dev/null 2>&1 || fail "cache prune"
ok "cache ls/verify/inspect/prune; corrupt file detected and never reused"

# usage errors: exit 2 with a hint; runtime errors: exit 1 with one line
"$KV" run -m "$M" --bogus 2>"$TMP/e" && fail "unknown flag accepted"
[ $? -ne 2 ] && true
"$KV" run -m "$M" --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown flag exit code"
grep -q "unknown flag" "$TMP/e" || fail "unknown flag message"
"$KV" run -m "$M" -p x -n abc >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad value exit code"
"$KV" run -m "$TMP/missing.gguf" -p x >/dev/null 2>"$TMP/e"; [ $? -eq 1 ] || fail "missing model exit code"
[ "$(wc -l <"$TMP/e")" -le 2 ] || fail "missing model: expected a one-line error, got: $(cat "$TMP/e")"
"$KV" run -m "$M" --tokens 1,2,999999 >/dev/null 2>"$TMP/e"; [ $? -eq 1 ] || fail "out-of-vocab id exit code"
grep -q "outside the vocabulary" "$TMP/e" || fail "out-of-vocab message: $(cat "$TMP/e")"
"$KV" run -m "$M" -p x --mla-prefill fast >/dev/null 2>"$TMP/e"; [ $? -eq 2 ] || fail "bad --mla-prefill exit code"
grep -q "mla-prefill must be absorbed, expanded or auto (got 'fast')" "$TMP/e" || fail "bad --mla-prefill message: $(cat "$TMP/e")"
"$KV" run --help 2>&1 | grep -q -- "--mla-prefill MODE" || fail "--mla-prefill missing from run --help"
# on a model without latent attention the flag does nothing, and says so
"$KV" run -m "$M" -p x -n 1 --mla-prefill expanded >/dev/null 2>"$TMP/e" || fail "--mla-prefill on llama failed"
grep -q "mla-prefill expanded has no effect" "$TMP/e" || fail "no warning for --mla-prefill on llama: $(cat "$TMP/e")"
"$KV" nosuch >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command exit code"
for c in run chat bench inspect tokenize gen-model cache serve demo; do
  "$KV" $c --help >/dev/null 2>&1 || fail "$c --help"
done
ok "usage and runtime errors, --help on every subcommand"
echo "cli.sh: all ok"
